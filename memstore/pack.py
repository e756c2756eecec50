"""Audit packs: a SHA-256 inventory of every file of a session, and its verification.

A pack records the path (relative, ``/``-joined), size and SHA-256 of every regular file under
the session directory, plus the manifest's status and counts. Verifying it later reports files
whose content changed (``mismatches``), files that are gone (``missing``) and, for information
only, files added since (``unaccounted``).

Safety rules:

* symlinks are never followed, neither while packing nor while verifying (a symlink found where
  a packed file was is a mismatch);
* files are hashed in fixed-size chunks, so memory stays flat whatever the session's size;
* any file named ``audit-pack.json`` is excluded, so a pack stored in the session does not
  inventory itself;
* memstore's own transient temp files (``.<name>.tmp-<pid>-<hex>``) are left out; hidden files
  are inventoried like any other;
* names that could not be verified safely (backslashes, drive-like ``C:`` components, NUL, names
  that are not UTF-8) are not inventoried; ``verify`` lists such files as ``unaccounted``;
* before opening anything, ``verify`` validates every entry path of the pack and refuses the whole
  pack (``InvalidPack``) if one is empty, absolute, contains ``..`` or any of the above.
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Optional

import orjson

from .layout import DERIVED_DIR, MANIFEST_FILE, PACK_FILE, session_directory
from .errors import InvalidPack, StoreIOError, UnsafePathError
from .events import utc_now
from .fsio import atomic_write, ensure_private_dir, read_no_follow, temp_file_pid
from .session.manifest import load_summary

PACK_SCHEMA_VERSION = 1
CHUNK_SIZE = 1 << 20

_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_O_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_SHA256_RE = re.compile(r"[0-9a-f]{64}")
_DRIVE_RE = re.compile(r"[A-Za-z]:")


@dataclass(frozen=True)
class AuditPackEntry:
    """One inventoried file: its path relative to the session dir, size and SHA-256 (hex)."""

    path: str
    bytes: int
    sha256: str

    def to_dict(self) -> dict:
        return {"path": self.path, "bytes": self.bytes, "sha256": self.sha256}


@dataclass
class SessionAuditPack:
    """An audit pack (schema 1): the session's manifest summary and its file inventory."""

    session_id: str
    generated_at: str
    status: str
    turn_count: int
    event_count: int
    entries: list[AuditPackEntry] = field(default_factory=list)
    schema_version: int = PACK_SCHEMA_VERSION

    def to_dict(self) -> dict:
        return {
            "schema_version": self.schema_version,
            "session_id": self.session_id,
            "generated_at": self.generated_at,
            "status": self.status,
            "turn_count": self.turn_count,
            "event_count": self.event_count,
            "entries": [entry.to_dict() for entry in self.entries],
        }

    def to_json(self) -> bytes:
        """Pretty JSON (2-space indent), as written by ``write_audit_pack``."""
        return orjson.dumps(self.to_dict(), option=orjson.OPT_INDENT_2 | orjson.OPT_APPEND_NEWLINE)

    @classmethod
    def from_dict(cls, data: Any) -> "SessionAuditPack":
        """Parse a pack; raise ``InvalidPack`` for an unsupported ``schema_version`` or a
        malformed shape. Entry paths are checked by ``verify_audit_pack``."""
        if not isinstance(data, dict):
            raise InvalidPack("an audit pack must be a JSON object")
        version = data.get("schema_version")
        if version != PACK_SCHEMA_VERSION or isinstance(version, bool):
            raise InvalidPack(f"unsupported schema_version {_show(version)} (expected {PACK_SCHEMA_VERSION})")
        for key in ("session_id", "generated_at", "status"):
            if not isinstance(data.get(key), str):
                raise InvalidPack(f"audit pack key {key!r} must be a string")
        for key in ("turn_count", "event_count"):
            if not _is_count(data.get(key)):
                raise InvalidPack(f"audit pack key {key!r} must be a non-negative integer")
        raw_entries = data.get("entries")
        if not isinstance(raw_entries, list):
            raise InvalidPack("audit pack key 'entries' must be a list")
        entries = []
        for raw in raw_entries:
            if not isinstance(raw, dict):
                raise InvalidPack("an audit pack entry must be a JSON object")
            path, size, digest = raw.get("path"), raw.get("bytes"), raw.get("sha256")
            if not isinstance(path, str):
                raise InvalidPack("an audit pack entry's 'path' must be a string")
            if not _is_count(size):
                raise InvalidPack(f"entry {path!r}: 'bytes' must be a non-negative integer")
            if not isinstance(digest, str) or not _SHA256_RE.fullmatch(digest):
                raise InvalidPack(f"entry {path!r}: 'sha256' must be 64 lowercase hex characters")
            entries.append(AuditPackEntry(path, size, digest))
        return cls(
            session_id=data["session_id"],
            generated_at=data["generated_at"],
            status=data["status"],
            turn_count=data["turn_count"],
            event_count=data["event_count"],
            entries=entries,
            schema_version=version,
        )


@dataclass
class PackVerification:
    """The result of ``verify_audit_pack``.

    ``verified`` is true when nothing is in ``mismatches`` or ``missing``; ``unaccounted`` (files
    present now but not in the pack) is informational and does not affect it.
    """

    verified: bool
    mismatches: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    unaccounted: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {
            "verified": self.verified,
            "mismatches": list(self.mismatches),
            "missing": list(self.missing),
            "unaccounted": list(self.unaccounted),
        }


def _show(value: Any) -> str:
    return str(value) if isinstance(value, (int, str)) and not isinstance(value, bool) else repr(value)


def _is_count(value: Any) -> bool:
    return type(value) is int and value >= 0


# --------------------------------------------------------------------------------------------
# Paths


def _component_problem(component: str) -> Optional[str]:
    if component == "":
        return "has an empty component"
    if component in (".", ".."):
        return f"has a {component!r} component"
    if "\\" in component:
        return "contains a backslash"
    if "\x00" in component:
        return "contains a NUL character"
    if _DRIVE_RE.match(component):
        return "has a drive-letter component"
    try:
        component.encode("utf-8")
    except UnicodeEncodeError:
        return "is not valid UTF-8"
    return None


def _path_problem(path: Any) -> Optional[str]:
    """Why ``path`` is not a safe entry path, or ``None`` when it is."""
    if not isinstance(path, str) or path == "":
        return "is empty"
    if path.startswith("/"):
        return "is absolute"
    for component in path.split("/"):
        problem = _component_problem(component)
        if problem:
            return problem
    return None


def _display(relpath: str) -> str:
    """``relpath`` as printable text, even when the name is not valid UTF-8."""
    return os.fsencode(relpath).decode("utf-8", "backslashreplace")


# --------------------------------------------------------------------------------------------
# Walking and hashing


def _session_dir(root: os.PathLike | str, session_id: str) -> Path:
    """The session directory, which must exist as a real directory (never a symlink)."""
    path = session_directory(root, session_id)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise StoreIOError("open session directory", path, "No such file or directory", errno.ENOENT) from None
    except OSError as exc:
        raise StoreIOError.from_os_error("open session directory", path, exc) from exc
    if stat.S_ISLNK(st.st_mode):
        raise UnsafePathError("open session directory", path, "is a symlink; refusing to follow it")
    if not stat.S_ISDIR(st.st_mode):
        raise StoreIOError("open session directory", path, "is not a directory", errno.ENOTDIR)
    return path


def _walk_files(session_dir: Path, exclude: frozenset = frozenset()) -> Iterator[str]:
    """Relative ``/``-joined paths of every regular file under ``session_dir`` (symlinks and
    special files skipped, directories entered without following symlinks; ``audit-pack.json``,
    memstore's own transient temp files and the ``exclude`` paths left out), in name order."""
    stack = [""]
    while stack:
        prefix = stack.pop()
        directory = session_dir / prefix if prefix else session_dir
        try:
            with os.scandir(directory) as it:
                items = sorted(it, key=lambda e: e.name)
        except FileNotFoundError:
            continue  # removed while walking
        except OSError as exc:
            raise StoreIOError.from_os_error("list directory", directory, exc) from exc
        subdirs = []
        for entry in items:
            rel = f"{prefix}/{entry.name}" if prefix else entry.name
            try:
                if entry.is_symlink():
                    continue
                if entry.is_dir(follow_symlinks=False):
                    subdirs.append(rel)
                elif (
                    entry.is_file(follow_symlinks=False)
                    and entry.name != PACK_FILE
                    and temp_file_pid(entry.name) is None
                    and rel not in exclude
                ):
                    yield rel
            except OSError as exc:
                raise StoreIOError.from_os_error("stat", directory / entry.name, exc) from exc
        stack.extend(reversed(subdirs))


def _open_beneath(session_dir: Path, relpath: str) -> int:
    """Open ``relpath`` under ``session_dir`` read-only, refusing a symlink at every component.

    Raises ``OSError`` (``ENOENT``, ``ENOTDIR``, ``ELOOP``, ...) for the caller to classify.
    """
    parts = relpath.split("/")
    dir_flags = os.O_RDONLY | _O_DIRECTORY | _O_NOFOLLOW | _O_CLOEXEC
    fd = os.open(session_dir, dir_flags)
    try:
        for part in parts[:-1]:
            try:
                next_fd = os.open(part, dir_flags, dir_fd=fd)
            except NotADirectoryError:
                # Linux reports a symlinked directory as ENOTDIR under O_DIRECTORY; tell it apart
                # from a plain file so the caller can call it a mismatch, not a missing file.
                if stat.S_ISLNK(os.lstat(part, dir_fd=fd).st_mode):
                    raise OSError(errno.ELOOP, "is a symlink", part) from None
                raise
            os.close(fd)
            fd = next_fd
        # O_NONBLOCK: a FIFO planted where a file was must not hang the open.
        return os.open(parts[-1], os.O_RDONLY | os.O_NONBLOCK | _O_NOFOLLOW | _O_CLOEXEC, dir_fd=fd)
    finally:
        os.close(fd)


def _digest_fd(fd: int, path: Path) -> tuple[int, str]:
    """Size and SHA-256 of the open file, read in ``CHUNK_SIZE`` chunks into one buffer."""
    digest = hashlib.sha256()
    buffer = bytearray(CHUNK_SIZE)
    view = memoryview(buffer)
    total = 0
    try:
        with open(fd, "rb", buffering=0, closefd=False) as fh:
            while True:
                n = fh.readinto(buffer)
                if not n:
                    break
                digest.update(view[:n])
                total += n
    except OSError as exc:
        raise StoreIOError.from_os_error("read", path, exc) from exc
    return total, digest.hexdigest()


def _is_regular(fd: int) -> bool:
    return stat.S_ISREG(os.fstat(fd).st_mode)


# --------------------------------------------------------------------------------------------
# Public API


def create_audit_pack(
    root: os.PathLike | str, session_id: str, *, exclude: Iterable[str] = ()
) -> SessionAuditPack:
    """Inventory the session: size and SHA-256 of every regular file, sorted by path.

    Left out: files named ``audit-pack.json``, memstore's transient temp files, and the
    session-relative paths in ``exclude`` (``write_audit_pack`` excludes its own output).

    Status and counts are copied from ``manifest.json``. A missing session directory, or a
    missing or malformed manifest, raises ``StoreIOError`` naming the path. A file that vanishes
    between listing and hashing is left out.
    """
    session_dir = _session_dir(root, session_id)
    summary = load_summary(session_dir)
    if summary is None:
        manifest = session_dir / MANIFEST_FILE
        detail = "is not a valid session manifest" if os.path.lexists(manifest) else "No such file or directory"
        raise StoreIOError("read manifest", manifest, detail)
    entries = []
    for rel in _walk_files(session_dir, frozenset(exclude)):
        if _path_problem(rel):
            continue
        try:
            fd = _open_beneath(session_dir, rel)
        except (FileNotFoundError, NotADirectoryError):
            continue
        except OSError as exc:
            if exc.errno == errno.ELOOP:  # replaced by a symlink since the listing
                continue
            raise StoreIOError.from_os_error("open", session_dir / rel, exc) from exc
        try:
            if not _is_regular(fd):
                continue
            size, digest = _digest_fd(fd, session_dir / rel)
        finally:
            os.close(fd)
        entries.append(AuditPackEntry(rel, size, digest))
    entries.sort(key=lambda e: e.path)
    return SessionAuditPack(
        session_id=summary.session_id,
        generated_at=utc_now(),
        status=summary.status,
        turn_count=summary.turn_count,
        event_count=summary.event_count,
        entries=entries,
    )


def default_pack_path(root: os.PathLike | str, session_id: str) -> Path:
    """Where packs go by default: ``<session_dir>/derived/audit-pack.json``."""
    return session_directory(root, session_id) / DERIVED_DIR / PACK_FILE


def write_audit_pack(
    root: os.PathLike | str, session_id: str, output: Optional[os.PathLike | str] = None
) -> tuple[SessionAuditPack, Path]:
    """Create a pack and write it (pretty JSON, atomically, mode 0600) to ``output`` or to
    ``derived/audit-pack.json``; return ``(pack, path)``. ``output``'s directory must exist."""
    if output is None:
        path = default_pack_path(root, session_id)
    else:
        path = Path(output)
        if not path.parent.is_dir():
            raise StoreIOError("write audit pack", path.parent, "directory does not exist", errno.ENOENT)
    # A pack written inside the session must not inventory its own previous version.
    session_dir = os.path.realpath(session_directory(root, session_id))
    target = os.path.join(os.path.realpath(path.parent), path.name)
    inside = os.path.commonpath([session_dir, target]) == session_dir
    exclude = [Path(os.path.relpath(target, session_dir)).as_posix()] if inside else []
    # Made before anything is created: a session that is not there gets no derived/ directory.
    pack = create_audit_pack(root, session_id, exclude=exclude)
    if output is None:
        ensure_private_dir(path.parent)
    atomic_write(path, pack.to_json())
    return pack, path


def read_audit_pack(path: os.PathLike | str) -> SessionAuditPack:
    """Read a pack file. A missing or unreadable file (or a symlink, which is not followed)
    raises ``StoreIOError``; bad JSON, an unsupported ``schema_version`` or a malformed shape
    raises ``InvalidPack``."""
    data = read_no_follow(path)
    if data is None:
        raise StoreIOError("read audit pack", path, "No such file or directory", errno.ENOENT)
    try:
        parsed = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise InvalidPack(f"{os.fspath(path)}: not valid JSON: {exc}") from exc
    try:
        return SessionAuditPack.from_dict(parsed)
    except InvalidPack as exc:
        raise InvalidPack(f"{os.fspath(path)}: {exc}") from exc


def verify_audit_pack(root: os.PathLike | str, session_id: str, pack: SessionAuditPack) -> PackVerification:
    """Check the session against ``pack``.

    Every entry path is validated first; one unsafe path (empty, absolute, ``.`` or ``..``,
    backslash, drive letter) or a duplicate raises ``InvalidPack`` before any file is opened.
    Then each entry is opened without following symlinks: absent → ``missing``; a different size
    or digest, a symlink or a non-regular file → ``mismatches``; other I/O errors raise
    ``StoreIOError``. Files present but not in the pack are ``unaccounted`` (sorted).
    """
    if pack.schema_version != PACK_SCHEMA_VERSION:
        raise InvalidPack(f"unsupported schema_version {_show(pack.schema_version)} (expected {PACK_SCHEMA_VERSION})")
    seen = set()
    for entry in pack.entries:
        problem = _path_problem(entry.path)
        if problem:
            raise InvalidPack(f"entry path {entry.path!r} {problem}")
        if entry.path in seen:
            raise InvalidPack(f"entry path {entry.path!r} is listed twice")
        seen.add(entry.path)
    session_dir = _session_dir(root, session_id)
    mismatches, missing = [], []
    for entry in pack.entries:
        target = session_dir / entry.path
        try:
            fd = _open_beneath(session_dir, entry.path)
        except (FileNotFoundError, NotADirectoryError):
            missing.append(entry.path)
            continue
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                mismatches.append(entry.path)
                continue
            raise StoreIOError.from_os_error("open", target, exc) from exc
        try:
            st = os.fstat(fd)
            # A size change is a mismatch without reading a byte.
            if not stat.S_ISREG(st.st_mode) or st.st_size != entry.bytes:
                mismatches.append(entry.path)
                continue
            size, digest = _digest_fd(fd, target)
        finally:
            os.close(fd)
        if size != entry.bytes or digest != entry.sha256:
            mismatches.append(entry.path)
    unaccounted = sorted(_display(rel) for rel in _walk_files(session_dir) if rel not in seen)
    return PackVerification(
        verified=not mismatches and not missing,
        mismatches=sorted(mismatches),
        missing=sorted(missing),
        unaccounted=unaccounted,
    )
