"""``manifest.json``: its shape and loading, the cap-rewrite intent marker, and a
validated cache of session summaries.

The manifest is a published view of the session's state (the per-session index holds the same
row). It is replaced atomically, so a reader sees the old or the new manifest, never a mix. It is
regenerable: a missing or malformed manifest is treated as absent and rewritten on the next open.
So is one that cannot be used at all (a symlink, which is never followed, a FIFO, a directory,
a file this process may not read): loading it gives ``None`` and a warning naming it, and the
session is read from its log; the session's next writer (or ``memstore rebuild``) sets such an
entry aside, beside it, and writes the manifest anew.
"""

from __future__ import annotations

import logging
import os
import stat
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Optional

import orjson

from ..errors import StoreIOError, UnsafePathError
from ..events import MAX_SEQ, utc_now
from ..fsio import atomic_write, file_kind, read_no_follow, remove_if_exists, remove_temp, write_temp_beside
from ..layout import MANIFEST_FILE, cap_marker_path, iter_session_dirs, unusable_name

logger = logging.getLogger(__name__)

STORE_SCHEMA_VERSION = 1
_I64_MAX = 2**63 - 1  # counters live in SQLite integers too
STATUS_ACTIVE = "active"
STATUS_COMPLETED = "completed"


@dataclass
class Manifest:
    """The state of a session as published in ``manifest.json``.

    The first seven keys are VT Code's; ``in_turn``, ``persisted_file_len`` and
    ``retained_turn_base`` are its [N] additions. The rest are memstore's: ``next_seq`` (the next
    envelope sequence number, which never repeats, even after a cap rewrite removed the old
    lines); ``generation``, which changes whenever the index is rebuilt or a cap rewrite evicts,
    so an incremental consumer (the catalog) can tell "grew" from "rewritten"; and ``source``,
    what the session's ``thread.started`` said about where it came from (the agent, its
    version, cwd, git branch, the imported file, a parent session), or ``None``.
    """

    session_id: str
    schema_version: int = STORE_SCHEMA_VERSION
    created_at: str = field(default_factory=utc_now)
    updated_at: str = field(default_factory=utc_now)
    turn_count: int = 0
    event_count: int = 0
    status: str = STATUS_ACTIVE
    in_turn: bool = False
    persisted_file_len: int = 0
    retained_turn_base: int = 1
    next_seq: int = 1
    generation: int = 0
    source: Optional[dict] = None

    def to_dict(self) -> dict:
        return asdict(self)

    def to_json(self) -> bytes:
        return orjson.dumps(self)  # orjson serializes the dataclass fields, in order

    @classmethod
    def from_dict(cls, data: Any) -> Optional[Manifest]:
        """Parse a manifest; ``None`` unless the five summary keys are present and well typed.

        Keys VT Code's older versions lack (``in_turn``, ``persisted_file_len``,
        ``retained_turn_base``) take their defaults; the manifest remembers which keys
        were present (see :meth:`has`), because the open path needs to know.
        """
        summary = SessionSummary.from_dict(data)
        if summary is None:
            return None
        values = {}
        for f in fields(cls):
            if f.name in data:
                values[f.name] = data[f.name]
        manifest = cls(**values)
        if not _ints_ok(manifest):
            return None
        manifest.__dict__["_present"] = frozenset(data)
        return manifest

    def has(self, key: str) -> bool:
        """Whether ``key`` was present in the parsed JSON (always true for a built manifest)."""
        present = self.__dict__.get("_present")
        return present is None or key in present


def new_generation() -> int:
    """A fresh generation number (random, positive, fits SQLite): tells every consumer that the
    views were rebuilt or the log rewritten, whatever they saw before."""
    # 62 random bits from the OS (what secrets.randbits reads, without importing it: an agent
    # hook pays for every module ``import memstore`` loads).
    return (int.from_bytes(os.urandom(8), "big") >> 2) + 1


def _ints_ok(m: Manifest) -> bool:
    for name in ("turn_count", "event_count", "persisted_file_len", "retained_turn_base", "next_seq", "generation"):
        value = getattr(m, name)
        if type(value) is not int or not 0 <= value <= _I64_MAX:
            return False
    if m.next_seq > MAX_SEQ + 1 or m.retained_turn_base > MAX_SEQ or m.turn_count > MAX_SEQ:
        return False  # implausible: distrusted, and the log decides
    return (
        isinstance(m.in_turn, bool)
        and isinstance(m.created_at, str)
        and m.retained_turn_base >= 1
        and (m.source is None or isinstance(m.source, dict))
    )


@dataclass(frozen=True)
class SessionSummary:
    """The five keys every consumer of a manifest relies on."""

    session_id: str
    turn_count: int
    event_count: int
    status: str
    updated_at: str

    @classmethod
    def from_dict(cls, data: Any) -> Optional[SessionSummary]:
        if not isinstance(data, dict):
            return None
        sid, tc, ec = data.get("session_id"), data.get("turn_count"), data.get("event_count")
        status, updated = data.get("status"), data.get("updated_at")
        if not (isinstance(sid, str) and isinstance(status, str) and isinstance(updated, str)):
            return None
        if type(tc) is not int or type(ec) is not int or tc < 0 or ec < 0:
            return None
        return cls(sid, tc, ec, status, updated)


def _load_json(path: Path) -> Any:
    """Parsed JSON of ``path``; ``None`` when absent or malformed. Symlinks raise."""
    data = read_no_follow(path)
    if data is None:
        return None
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return None


def _load_view_json(path: Path) -> Any:
    """Parsed JSON of the manifest at ``path``; ``None`` when it is absent, malformed, or cannot
    be used (a symlink, never followed; a FIFO, a directory; unreadable): the manifest is a view
    of the log, and a reader goes on from the log. What cannot be used is said in a warning
    naming the path (see :func:`manifest_problem`)."""
    try:
        return _load_json(path)
    except StoreIOError as exc:
        logger.warning("%s cannot be used (%s); the session is read from its log", path, manifest_problem(path) or exc)
        return None


def manifest_problem(path: os.PathLike | str) -> Optional[str]:
    """What is wrong with the entry at a manifest's ``path`` that keeps it from being read as a
    file, in words (``is a symlink``, ``is a FIFO, not a regular file``, ``cannot be examined
    (Permission denied)``); ``None`` for a regular file or no entry at all."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"cannot be examined ({exc.strerror or exc})"
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISLNK(mode):
        return "is a symlink (never followed)"
    return f"is {file_kind(mode)}, not a regular file"


def set_aside_manifest(path: os.PathLike | str, why: str) -> Path:
    """Move the entry at a manifest's ``path`` out of the way, beside it
    (``manifest.json.unusable-<time>``: nothing is followed, nothing deleted), so that the
    manifest can be written anew from the log; return where it went. ``why`` says what is
    wrong with it, for the warning that names both. The caller holds the session's lock."""
    path = Path(path)
    aside = path.with_name(unusable_name(path.name, time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())))
    if os.path.lexists(aside):
        aside = aside.with_name(f"{aside.name}-{os.getpid()}-{time.monotonic_ns()}")
    try:
        os.rename(path, aside)  # renames the entry itself: a symlink is not followed
    except OSError as exc:
        raise StoreIOError.from_os_error("set aside", path, exc) from exc
    summary_cache.invalidate(path)
    logger.warning("%s %s; kept as %s, and the manifest is written anew from the log", path, why, aside.name)
    return aside


def publish_manifest(path: os.PathLike | str, data: bytes, *, durable: bool) -> None:
    """Replace the manifest at ``path`` with ``data`` (atomically, see
    :func:`memstore.fsio.atomic_write`). An entry there that cannot be a manifest (a symlink,
    a FIFO, a directory) is set aside first (see :func:`set_aside_manifest`): the manifest is
    a view of the log, and a writer is never refused for it. The caller holds the session's
    lock."""
    try:
        atomic_write(path, data, durable=durable)
    except UnsafePathError:
        problem = manifest_problem(path)
        if problem is None or problem.startswith("cannot be examined"):
            raise
        set_aside_manifest(path, problem)
        atomic_write(path, data, durable=durable)
    summary_cache.invalidate(path)


def load_manifest(session_dir: os.PathLike | str) -> Optional[Manifest]:
    """The session's manifest, or ``None`` when it is missing, malformed or cannot be used (see
    :func:`_load_view_json`)."""
    return Manifest.from_dict(_load_view_json(Path(session_dir) / MANIFEST_FILE))


def load_summary(session_dir: os.PathLike | str) -> Optional[SessionSummary]:
    """The session's :class:`SessionSummary`, or ``None`` when the manifest is missing,
    malformed or cannot be used."""
    return SessionSummary.from_dict(_load_view_json(Path(session_dir) / MANIFEST_FILE))


# --------------------------------------------------------------------------------------------
# The pending cap-rewrite marker (index/pending-cap-rewrite.json)


@dataclass(frozen=True)
class CapRewriteMarker:
    """Intent record of a cap rewrite: the log is being cut from ``previous_file_len`` bytes to
    ``new_file_len``, and the first surviving turn is ``retained_turn_base``."""

    previous_file_len: int
    new_file_len: int
    retained_turn_base: int

    def matches(self, file_len: int) -> bool:
        """True when the log on disk is the rewritten one (the rename happened)."""
        return self.new_file_len == file_len < self.previous_file_len


def marker_path(session_dir: os.PathLike | str) -> Path:
    return cap_marker_path(session_dir)


@dataclass
class StagedFile:
    """A file written but not yet synced, its descriptor open for the caller's sync; ``tmp`` is
    the temp file it still is, if it was not renamed into place yet."""

    path: Path
    fd: int
    tmp: Optional[Path] = None

    def close(self) -> None:
        fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)

    def install(self) -> None:
        """Rename the temp file into place (the caller syncs the directory)."""
        self.close()
        if self.tmp is None:
            return
        try:
            os.replace(self.tmp, self.path)
        except OSError as exc:
            raise StoreIOError.from_os_error("rename", self.path, exc) from exc
        self.tmp = None

    def discard(self) -> None:
        """Remove the temp file of a file not to be installed."""
        self.close()
        if self.tmp is not None:
            remove_temp(self.tmp)
            self.tmp = None


def stage_file(path: os.PathLike | str, data: bytes) -> StagedFile:
    """Write ``data`` to a private temp file beside ``path``, not synced, its descriptor open
    (for the caller's sync), to be renamed over ``path`` by :meth:`StagedFile.install`."""
    path = Path(path)
    tmp, _st = write_temp_beside(path, data, sync=False, write_op="write")
    try:
        fd = os.open(tmp, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        remove_temp(tmp)
        raise StoreIOError.from_os_error("open", tmp, exc) from exc
    return StagedFile(path, fd, Path(tmp))


def stage_marker(session_dir: os.PathLike | str, marker: CapRewriteMarker) -> StagedFile:
    """Put the intent record of a cap rewrite in place, not yet synced (written to a temp file
    and renamed over any stale one: a reader sees a whole marker or none). The caller syncs it
    and the index directory before it replaces the log; until then a crash leaves a marker
    that does not match the log, which every open ignores and removes."""
    staged = stage_file(marker_path(session_dir), orjson.dumps(asdict(marker)))
    fd, staged.fd = staged.fd, -1
    try:
        staged.install()
    except BaseException:
        os.close(fd)
        staged.discard()
        raise
    staged.fd = fd
    return staged


def load_marker(session_dir: os.PathLike | str) -> Optional[CapRewriteMarker]:
    """The pending marker, or ``None`` if absent or malformed."""
    data = _load_json(marker_path(session_dir))
    if not isinstance(data, dict):
        return None
    try:
        values = [data["previous_file_len"], data["new_file_len"], data["retained_turn_base"]]
    except KeyError:
        return None
    if not all(type(v) is int and v >= 0 for v in values):
        return None
    return CapRewriteMarker(*values)


def clear_marker(session_dir: os.PathLike | str, only: Optional[CapRewriteMarker] = None) -> bool:
    """Remove the pending marker (with ``only``, only if it is that one); return whether one
    was removed. Not synced: a removal a crash undoes leaves a marker that no longer matches the
    log (it grew) or that finishes a rewrite already finished, both harmless."""
    if only is not None and load_marker(session_dir) != only:
        return False
    return remove_if_exists(marker_path(session_dir))


# --------------------------------------------------------------------------------------------
# The summary cache


class SummaryCache:
    """An LRU of parsed manifests keyed by path, each entry checked against the file's
    ``(mtime_ns, size, inode)`` on every lookup, so a replaced manifest is never served stale."""

    def __init__(self, capacity: int = 200):
        self.capacity = capacity
        self._entries: OrderedDict[str, tuple[tuple, Optional[SessionSummary]]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, path: os.PathLike | str) -> Optional[SessionSummary]:
        """The summary in the manifest at ``path`` (``None`` if missing, malformed or not a
        regular file). Raises :class:`StoreIOError` only when the entry cannot be examined."""
        key = os.fspath(path)
        try:
            st = os.stat(key, follow_symlinks=False)
        except FileNotFoundError:
            self.invalidate(key)
            return None
        except OSError as exc:
            raise StoreIOError.from_os_error("stat", key, exc) from exc
        if not stat.S_ISREG(st.st_mode):
            self.invalidate(key)
            logger.warning("%s %s; the session is read from its log", key, manifest_problem(key))
            return None
        stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
        with self._lock:
            hit = self._entries.get(key)
            if hit is not None and hit[0] == stamp:
                self._entries.move_to_end(key)
                return hit[1]
        summary = SessionSummary.from_dict(_load_view_json(Path(key)))
        with self._lock:
            self._entries[key] = (stamp, summary)
            self._entries.move_to_end(key)
            while len(self._entries) > self.capacity:
                self._entries.popitem(last=False)
        return summary

    def invalidate(self, path: os.PathLike | str) -> None:
        with self._lock:
            self._entries.pop(os.fspath(path), None)

    def __len__(self) -> int:
        return len(self._entries)

    def reset_after_fork(self) -> None:
        """In a forked child: the thread that may have held the lock does not exist there."""
        self._lock = threading.Lock()


summary_cache = SummaryCache()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=summary_cache.reset_after_fork)


def list_sessions(
    root: os.PathLike | str, limit: Optional[int] = None, *, on_skip: Optional[Callable[[str, str], None]] = None
) -> list[SessionSummary]:
    """Summaries of the sessions under ``root``, most recently updated first.

    The directories are those of :func:`memstore.layout.iter_session_dirs` (no symlink is
    followed, ``sessions/`` itself included); sessions whose manifest is missing, malformed or
    cannot be used are left out (read them from their logs: the manifest is a view). A session
    that cannot be examined at all (a directory this process may not enter) is left out too,
    with a warning, and said to ``on_skip(name, reason)`` when given; the others are listed.
    Manifests are read through the validated cache.
    """
    summaries = []
    for entry in iter_session_dirs(root):
        path = os.path.join(entry.path, MANIFEST_FILE)
        try:
            summary = summary_cache.get(path)
        except StoreIOError as exc:
            logger.warning("session %s left out of the list: %s", entry.path, exc)
            if on_skip is not None:
                on_skip(entry.name, str(exc))
            continue
        if summary is not None:
            summaries.append(summary)
    summaries.sort(key=lambda s: s.updated_at, reverse=True)
    return summaries[:limit] if limit is not None else summaries
