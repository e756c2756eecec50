"""Importing VT Code's legacy stores into sessions: ``<root>/history/*.memory.json`` (memory
envelopes) and ``<root>/logs/trajectory*.jsonl`` (trajectory logs), ``root`` being a workspace's
``.vtcode`` directory. And :func:`gc_legacy`, which removes what was imported.

Everything imported goes into a session's log first; the derived files are regenerated from it:

- an envelope becomes ``{"type": "memory.envelope", "envelope": {...}, "source": {"importer":
  "memstore.migrate", "file": "history/<name>", "sha256": <of the file>, "mtime": ...}}``, dated
  by the file's mtime; ``derived/memory.json`` is then regenerated (see ``memory_view.py``);
- each line of a trajectory log becomes ``{"type": "trajectory.record", "record": {...},
  "source": {"file": "logs/<name>", "generation": <hash>, "line": N}}`` (a line that is not a
  JSON object keeps its text as ``"raw"`` instead of ``"record"``), dated by the record's unix
  ``ts`` (else the file's mtime); ``derived/trajectory.jsonl`` is then regenerated: one line per
  record, in log order.

A session migration creates starts with a ``thread.started`` (``source``: the agent, the
importer, the file) and ends with a ``thread.completed`` (``outcome_code: "imported"``) dated
when the import finished, so it is ``completed`` with no turns, its imported events make it
content (not an empty shell) for retention, and its age counts from the migration. Records are
never dated before the log's last record (log order stays time order).

**Session ids.** ``history/<sid>.memory.json`` goes to session ``<sid>`` (VT Code kept the
``.memory``); ``history/<sid>_<turn>_<YYYYMMDDTHHMMSSZ>.memory.json`` files are compaction
artifacts of the same session (when the envelope's own ``session_id`` abbreviates to that
``<sid>``, as VT Code abbreviates long ids to 32 characters, that id is used). Every envelope of
a session is imported, oldest first by (mtime, name), so the newest is the session's envelope.
``logs/trajectory-<stamp>.jsonl`` goes to ``traj-<stamp>``; the live ``logs/trajectory.jsonl``
to ``traj-live``.

**Idempotent.** Each record says what it came from, so a second run appends nothing that is
already in a log: an envelope is known by its SHA-256; a trajectory line by its file's
*generation* (the SHA-256 of its first non-blank line, which does not change as a log grows or
when VT Code rotates ``trajectory.jsonl`` to ``trajectory-<stamp>.jsonl``) and its line number.
So the live log is imported incrementally (lines added since the last run; a partial last line
waits for the next), and once rotated, only its lines ``traj-live`` does not already hold go to
``traj-<stamp>``. Nothing is overwritten: a changed envelope file is a new envelope.

**Sources VT Code already migrated.** VT Code's own ``session-store migrate`` keeps its legacy
sources by default and puts each ``history/<name>.json`` into a session of its own: id the file's
stem (``session-bar.memory``), directory ``sessions/<sanitized stem>``, ``derived/memory.json`` a
byte copy of the file, a manifest with no turns and no events, no log. Such a file is recognised
by that id mapping and by content: the directory (never a symlink) is where VT Code's mapping
puts the file, and either its ``memory.json`` has the file's SHA-256 (VT Code copied these very
bytes) or its log holds an envelope with it. Then:

- the copy is the file as it is now: nothing is imported or written; reported as
  ``already_migrated`` (its facts are listed once, under VT Code's id);
- the file changed after VT Code copied it: the new version goes into VT Code's session, not
  into a second one. Its log (started by this import) first takes VT Code's copy, the only copy
  left of the version VT Code migrated (``source``: ``{"file": "sessions/<dir>/derived/memory.json",
  "sha256", "mtime": when VT Code says it was written, "migrated_by": "vtcode", "legacy_file"}``),
  then the new version, so the view is the newest and nothing is lost; reported as
  ``changed_since``. Only when VT Code's manifest names that file and its copy can be kept in a
  log (a JSON object); otherwise, or when memstore's own session already holds versions of the
  file (memstore migrated it before VT Code did), it goes where it would have gone anyway;
- memstore had imported the file before VT Code copied it: nothing is imported; VT Code's
  duplicate is reported as ``also_imported`` and left alone (it is VT Code's session).

The same holds for trajectory logs, whose VT Code session is ``traj-`` + the file's stem without
a leading ``trajectory-``: ``traj-<stamp>`` for a rotated log (memstore's name too) and
``traj-trajectory`` for the live one (memstore's: ``traj-live``). A copy in such a session (no
log, VT Code's manifest) that is the file as it is: not imported (``already_migrated``). VT
Code's copy of the live log holds its first lines: those are not imported again, neither from
the live log into ``traj-live`` nor from the rotated log it becomes (``changed_since`` when the
lines past the copy are imported). A rotated log that only grew since VT Code copied it is
imported into VT Code's session (the same directory); one that no longer holds every line of
VT Code's copy there is not imported over it (reported in ``skipped``).

:func:`gc_legacy` removes such a file only once a log holds it: VT Code's copy is a derived file.

**Safety.** Holds the store's ``migration`` lock. Sources are read without following symlinks
(a symlinked ``history``/``logs`` directory or file is reported, not read); a source that cannot
be read or parsed is listed in ``MigrationReport.skipped`` with the reason. Sources are removed
only with ``remove_legacy=True`` (through :func:`gc_legacy`).
"""

from __future__ import annotations

import errno
import hashlib
import logging
import math
import os
import re
import stat
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from enum import Enum
from pathlib import Path
from typing import Optional

import orjson

from . import events as ev
from .errors import (
    InvalidEvent,
    InvalidSessionId,
    SessionBusyError,
    SessionNotFound,
    StoreIOError,
    UnsafePathError,
)
from .events import Record
from .fsio import open_read_no_follow, read_no_follow
from .layout import (
    DERIVED_DIR,
    EVENTS_FILE,
    LEGACY_HISTORY_DIR,
    LEGACY_LOGS_DIR,
    LEGACY_TRAJECTORY_FILE,
    MANIFEST_FILE,
    MEMORY_FILE,
    SESSIONS_DIR,
    TRAJECTORY_FILE,
    check_session_id,
    sanitize_session_id,
    session_dir_name,
    session_directory,
    sessions_root,
)
from .locks import remove_session_directory, store_lock
from .reader import read_session
from .retention import GcLog
from .session.log import SessionLog, open_session
from .session.manifest import load_summary
from .views.memory_view import ENVELOPE_EVENT, not_after_now, not_before, refresh_memory_view
from .views.trajectory import TRAJECTORY_EVENT, write_trajectory_view

logger = logging.getLogger("memstore")

ENVELOPE_SUFFIX = ".memory.json"
LIVE_TRAJECTORY_SESSION = "traj-live"
IMPORTER = "memstore.migrate"
MAX_ENVELOPE_BYTES = 16 << 20
MAX_TRAJECTORY_BYTES = 512 << 20
_ARTIFACT = re.compile(r"(?P<sid>.+)_(?P<turn>\d{4,})_(?P<stamp>\d{8}T\d{6}Z)\.memory\.json\Z", re.S)
_ROTATED = re.compile(r"trajectory-(?P<stamp>.+)\.jsonl\Z", re.S)
_MAX_UNIX_TS = 253_402_300_799  # 9999-12-31T23:59:59Z


@dataclass(frozen=True)
class SkippedSource:
    """A legacy file (path relative to the root) that was not imported, or not removed, and why."""

    path: str
    reason: str


@dataclass
class LegacyGcReport:
    """What :func:`gc_legacy` removed (paths relative to the root) and kept, and why."""

    bytes_freed: int = 0
    removed: list[str] = field(default_factory=list)
    kept: list[SkippedSource] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"bytes_freed": self.bytes_freed, "removed": list(self.removed), "kept": [asdict(k) for k in self.kept]}


class VtcodeState(str, Enum):
    """What memstore found of a legacy file that VT Code's own migration had also migrated."""

    ALREADY_MIGRATED = "already_migrated"  # VT Code's copy is this very file: not imported
    CHANGED_SINCE = "changed_since"  # changed since VT Code copied it: imported into VT Code's session
    ALSO_IMPORTED = "also_imported"  # memstore had imported it before VT Code copied it: a duplicate


@dataclass(frozen=True)
class VtcodeMigration:
    """A legacy file (path relative to the root) that VT Code's own migration had put into
    ``session`` (the directory name under ``sessions/``), and what memstore made of it."""

    path: str
    session: str
    state: VtcodeState


@dataclass
class MigrationReport:
    """What :func:`migrate_legacy` did.

    ``memory_imported`` counts envelope files and ``trajectory_imported`` trajectory files from
    which something was appended in this run (``records_imported`` lines); ``bytes_migrated``
    is the source bytes they held; ``already_imported`` counts sources found fully imported by
    memstore; ``already_migrated`` counts sources VT Code's own migration holds unchanged (not
    imported again); ``migrated_by_vtcode`` lists every source VT Code had migrated and what
    was done with it; ``skipped`` lists sources that could not be imported, and why.
    ``legacy`` is the :func:`gc_legacy` report when ``remove_legacy`` was given.
    """

    sessions_created: int = 0
    sessions_updated: int = 0
    memory_imported: int = 0
    trajectory_imported: int = 0
    records_imported: int = 0
    bytes_migrated: int = 0
    already_imported: int = 0
    already_migrated: int = 0
    migrated_by_vtcode: list[VtcodeMigration] = field(default_factory=list)
    skipped: list[SkippedSource] = field(default_factory=list)
    legacy: Optional[LegacyGcReport] = None

    def skip(self, path: str, reason: str) -> None:
        logger.warning("migrate: not importing %s: %s", path, reason)
        self.skipped.append(SkippedSource(path, reason))

    def vtcode(self, path: str, session: str, state: VtcodeState) -> None:
        logger.info("migrate: %s was migrated by VT Code into session %r: %s", path, session, state.value)
        self.migrated_by_vtcode.append(VtcodeMigration(path, session, state))

    def to_dict(self) -> dict:
        data = asdict(self)
        data["migrated_by_vtcode"] = [
            {"path": m.path, "session": m.session, "state": m.state.value} for m in self.migrated_by_vtcode
        ]
        data["legacy"] = self.legacy.to_dict() if self.legacy is not None else None
        return data


# --------------------------------------------------------------------------------------------
# Reading legacy sources


@dataclass
class _Envelope:
    rel: str
    session_id: str
    data: dict
    sha256: str
    size: int
    mtime_ns: int
    ts: str
    st: os.stat_result  # of the file as read


@dataclass
class _Trajectory:
    rel: str
    session_id: str
    sha256: str  # of the file's bytes as read
    generation: Optional[str]
    lines: list[tuple[int, bytes]]  # (line number, bytes without the newline), blank lines left out
    last_line: int  # the number of the last complete line (blank ones included)
    ts: str  # the file's mtime
    st: os.stat_result  # of the file as read


def _listing(root: Path, name: str, skipped: list[SkippedSource]) -> list[os.DirEntry]:
    """The entries of ``<root>/<name>`` sorted by name; ``[]`` when it is missing, and reported
    when it is a symlink, not a directory, or cannot be listed."""
    base = root / name
    try:
        st = os.lstat(base)
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise StoreIOError.from_os_error("stat", base, exc) from exc
    if stat.S_ISLNK(st.st_mode):
        skipped.append(SkippedSource(name, "a symlink; legacy stores are not read through symlinks"))
        return []
    if not stat.S_ISDIR(st.st_mode):
        skipped.append(SkippedSource(name, "not a directory"))
        return []
    try:
        return sorted(os.scandir(base), key=lambda e: e.name)
    except OSError as exc:
        # A legacy directory is a source: one that cannot be listed is reported, not fatal.
        skipped.append(SkippedSource(name, f"cannot be listed: {exc.strerror or exc}"))
        return []


def _read_source(path: Path, limit: int) -> tuple[bytes, os.stat_result]:
    """The bytes of a legacy file, read without following a symlink; raises
    :class:`StoreIOError` (``UnsafePathError`` for a symlink or a non-regular file) or
    ``ValueError`` (too large, or gone)."""
    fd = open_read_no_follow(path)
    if fd is None:
        raise ValueError("disappeared while being read")
    try:
        st = os.fstat(fd)
        if st.st_size > limit:
            raise ValueError(f"{st.st_size} bytes, more than the {limit}-byte limit for this kind of file")
        chunks = []
        while True:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
        return b"".join(chunks), st
    except OSError as exc:
        raise StoreIOError.from_os_error("read", path, exc) from exc
    finally:
        os.close(fd)


def _why(exc: Exception) -> str:
    if isinstance(exc, StoreIOError):
        return f"cannot be read: {exc.detail or exc}"
    return f"cannot be read: {exc}"


def _mtime_ts(st: os.stat_result) -> str:
    return ev.format_ts(datetime.fromtimestamp(st.st_mtime, UTC))


def _vt_prefix(session_id: str) -> str:
    """How VT Code abbreviates a session id in compaction artifact names."""
    return "".join(c if (c.isascii() and c.isalnum()) or c in "_-" else "_" for c in session_id)[:32]


def envelope_session_id(name: str, envelope: dict) -> str:
    """The session a ``history/<name>`` envelope belongs to (see the module docstring)."""
    match = _ARTIFACT.match(name)
    if match is None:
        return name[: -len(ENVELOPE_SUFFIX)]
    sid = match["sid"]
    claimed = envelope.get("session_id")
    if isinstance(claimed, str) and claimed and claimed != sid and _vt_prefix(claimed) == sid:
        return claimed
    return sid


def _read_envelope(root: Path, entry: os.DirEntry, skipped: list[SkippedSource]) -> Optional[_Envelope]:
    rel = f"{LEGACY_HISTORY_DIR}/{entry.name}"
    try:
        raw, st = _read_source(Path(entry.path), MAX_ENVELOPE_BYTES)
    except (StoreIOError, ValueError) as exc:
        skipped.append(SkippedSource(rel, _why(exc)))
        return None
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        skipped.append(SkippedSource(rel, f"not valid JSON ({exc})"))
        return None
    if not isinstance(data, dict):
        skipped.append(SkippedSource(rel, "not a JSON object (a memory envelope is one)"))
        return None
    sid = envelope_session_id(entry.name, data)
    try:
        check_session_id(sid)
    except InvalidSessionId as exc:
        skipped.append(SkippedSource(rel, f"no usable session id in its name ({exc})"))
        return None
    return _Envelope(rel, sid, data, hashlib.sha256(raw).hexdigest(), len(raw), st.st_mtime_ns, _mtime_ts(st), st)


def _collect_envelopes(root: Path, skipped: list[SkippedSource]) -> dict[str, list[_Envelope]]:
    groups: dict[str, list[_Envelope]] = {}
    for entry in _listing(root, LEGACY_HISTORY_DIR, skipped):
        name = entry.name
        if not name.endswith(".json"):
            continue  # compaction history artifacts (*.jsonl), temp files: not envelopes
        rel = f"{LEGACY_HISTORY_DIR}/{name}"
        if not name.endswith(ENVELOPE_SUFFIX):
            skipped.append(SkippedSource(rel, "not a memory envelope (*.memory.json)"))
            continue
        envelope = _read_envelope(root, entry, skipped)
        if envelope is not None:
            groups.setdefault(envelope.session_id, []).append(envelope)
    for envelopes in groups.values():
        envelopes.sort(key=lambda e: (e.mtime_ns, e.rel))  # oldest first: the last is the newest
    return groups


def trajectory_session_id(name: str) -> Optional[str]:
    """The session a ``logs/<name>`` trajectory log goes to, or ``None`` if it is not one."""
    if name == LEGACY_TRAJECTORY_FILE:
        return LIVE_TRAJECTORY_SESSION
    match = _ROTATED.match(name)
    return f"traj-{match['stamp']}" if match else None


def _split_lines(data: bytes, *, complete_only: bool) -> tuple[list[tuple[int, bytes]], int]:
    """``([(number, line)], last_line)``: non-blank lines numbered from 1 (blank ones count), and
    the number of the last line considered. With ``complete_only`` (a log still being written)
    a last line without its newline is left for later."""
    parts = data.split(b"\n")
    tail = parts.pop()  # after the last newline: b"" when the file ends with one
    if tail and not complete_only:
        parts.append(tail)
    lines = []
    for number, line in enumerate(parts, start=1):
        line = line[:-1] if line.endswith(b"\r") else line
        if line.strip():
            lines.append((number, line))
    return lines, len(parts)


def _read_trajectory(entry: os.DirEntry, sid: str, skipped: list[SkippedSource]) -> Optional[_Trajectory]:
    rel = f"{LEGACY_LOGS_DIR}/{entry.name}"
    try:
        raw, st = _read_source(Path(entry.path), MAX_TRAJECTORY_BYTES)
    except (StoreIOError, ValueError) as exc:
        skipped.append(SkippedSource(rel, _why(exc)))
        return None
    lines, last = _split_lines(raw, complete_only=sid == LIVE_TRAJECTORY_SESSION)
    generation = hashlib.sha256(lines[0][1]).hexdigest()[:32] if lines else None
    return _Trajectory(rel, sid, hashlib.sha256(raw).hexdigest(), generation, lines, last, _mtime_ts(st), st)


def _collect_trajectories(root: Path, skipped: list[SkippedSource]) -> list[_Trajectory]:
    rotated: list[_Trajectory] = []
    live: list[_Trajectory] = []
    for entry in _listing(root, LEGACY_LOGS_DIR, skipped):
        name = entry.name
        if not name.endswith(".jsonl"):
            continue
        sid = trajectory_session_id(name)
        if sid is None:
            skipped.append(SkippedSource(f"{LEGACY_LOGS_DIR}/{name}", "not a trajectory log (trajectory*.jsonl)"))
            continue
        try:
            check_session_id(sid)
        except InvalidSessionId as exc:
            skipped.append(SkippedSource(f"{LEGACY_LOGS_DIR}/{name}", f"no usable session id in its name ({exc})"))
            continue
        trajectory = _read_trajectory(entry, sid, skipped)
        if trajectory is not None:
            (live if sid == LIVE_TRAJECTORY_SESSION else rotated).append(trajectory)
    return rotated + live


# --------------------------------------------------------------------------------------------
# What a session already holds


@dataclass
class _Imported:
    """What a session's log says was imported into it."""

    envelope_shas: set = field(default_factory=set)
    files: set = field(default_factory=set)  # the legacy files its envelopes came from
    lines: dict = field(default_factory=dict)  # trajectory generation -> highest line number
    first_lines: dict = field(default_factory=dict)  # trajectory generation -> lowest line number
    last_ts: Optional[str] = None
    records: int = 0
    memory: bool = False
    trajectory: bool = False
    migrated: bool = False  # migration started the session (its thread.started says so)
    completed: bool = False  # the log holds a thread.completed

    def add(self, record: Record) -> None:
        self.records += 1
        if record.ts is not None:
            self.last_ts = not_before(record.ts, self.last_ts)
        event = record.event
        kind = event.get("type")
        source = event.get("source")
        if kind == ev.THREAD_STARTED:
            if self.records == 1 and isinstance(source, dict) and source.get("importer") == IMPORTER:
                self.migrated = True
        elif kind == ev.THREAD_COMPLETED:
            self.completed = True
        elif kind == ENVELOPE_EVENT:
            self.memory = True
            if isinstance(source, dict):
                if isinstance(source.get("sha256"), str):
                    self.envelope_shas.add(source["sha256"])
                for key in ("file", "legacy_file"):
                    if isinstance(source.get(key), str):
                        self.files.add(source[key])
        elif kind == TRAJECTORY_EVENT:
            self.trajectory = True
            if isinstance(source, dict):
                generation, line = source.get("generation"), source.get("line")
                if isinstance(generation, str) and type(line) is int:
                    self.lines[generation] = max(self.lines.get(generation, 0), line)
                    self.first_lines[generation] = min(self.first_lines.get(generation, line), line)


def _unfinished(root: Path, session_id: str, held: _Imported) -> bool:
    """Whether a migration into this session was interrupted before it finished: a session
    migration started is not completed yet, or a view of what it imported is missing (the
    next run finishes it, as one uninterrupted run would have)."""
    if held.migrated and not held.completed:
        return True
    derived = session_directory(root, session_id) / DERIVED_DIR
    return (held.memory and not os.path.lexists(derived / MEMORY_FILE)) or (
        held.trajectory and not os.path.lexists(derived / TRAJECTORY_FILE)
    )


def _imported(records: Iterable[Record]) -> _Imported:
    found = _Imported()
    for record in records:
        found.add(record)
    return found


def _imported_read_only(root: Path, session_id: str) -> _Imported:
    """What session ``session_id`` holds, read without locking or writing (empty if it has no
    log). Raises :class:`StoreIOError` for a session that cannot be read (a symlink, say)."""
    try:
        with read_session(root, session_id) as reader:
            return _imported(reader.iter_records())
    except SessionNotFound:
        return _Imported()


# --------------------------------------------------------------------------------------------
# What VT Code's own migration made of a legacy envelope


@dataclass
class _VtcodeSession:
    """The session VT Code's ``migrate_legacy`` makes for ``history/<name>.json``: its id is
    the file's stem (``session-foo.memory`` for ``session-foo.memory.json``), its directory
    ``sessions/<sanitized stem>``, ``derived/memory.json`` a byte copy of the file, and a
    manifest with no turns and no events; no log. Read without following symlinks or writing."""

    name: str  # the directory name under sessions/
    copy_sha256: Optional[str]  # of derived/memory.json as it is now; None: none, or unreadable
    copy: Optional[dict]  # derived/memory.json parsed, when it is a JSON object
    copy_ts: str  # when the copied version was written: the manifest's created_at, else the copy's mtime
    held: _Imported  # what its log holds (nothing when it has none)
    vtcode_manifest: bool  # no log, and the manifest VT Code's migration writes for this file
    addressable: bool  # memstore opens it by the id that is its directory name

    @property
    def copy_rel(self) -> str:
        return f"{SESSIONS_DIR}/{self.name}/{DERIVED_DIR}/{MEMORY_FILE}"

    def adoptable_for(self, envelope: _Envelope) -> bool:
        """Whether a changed version of ``envelope``'s file belongs in this session: VT Code
        migrated that file here (its manifest says so and its copy can be kept in a log), or an
        earlier run of memstore already put a version of the file into this session's log."""
        if not self.addressable:
            return False
        if self.vtcode_manifest:
            return self.copy is not None
        return self.held.migrated and envelope.rel in self.held.files


def _vtcode_session(root: Path, envelope: _Envelope) -> Optional[_VtcodeSession]:
    """The session VT Code's own migration made for ``envelope``'s file, if there is one: a
    real directory (never a symlink) named by VT Code's id mapping. ``None`` otherwise."""
    stem = envelope.rel.split("/", 1)[1][: -len(".json")]
    name = sanitize_session_id(stem)
    directory = sessions_root(root) / name
    try:
        if not stat.S_ISDIR(os.lstat(directory).st_mode):
            return None
    except FileNotFoundError:
        return None
    except OSError as exc:
        logger.warning("migrate: cannot examine %s: %s", directory, exc)
        return None
    try:
        addressable = session_dir_name(name) == name
    except InvalidSessionId:
        addressable = False
    copy_sha, copy, copy_mtime = _read_vtcode_copy(directory / DERIVED_DIR / MEMORY_FILE)
    has_log = os.path.lexists(directory / EVENTS_FILE)
    held = _Imported()
    if has_log and addressable:
        try:
            held = _imported_read_only(root, name)
        except StoreIOError as exc:
            logger.warning("migrate: cannot read session %s: %s", name, exc)
            addressable = False
    try:
        summary = None if has_log else load_summary(directory)
    except StoreIOError as exc:  # a symlinked or unreadable manifest: not VT Code's
        logger.warning("migrate: cannot read the manifest of %s: %s", directory, exc)
        summary = None
    vtcode_manifest = (
        summary is not None
        and summary.session_id in (stem, name)
        and summary.turn_count == 0
        and summary.event_count == 0
    )
    copy_ts = (_manifest_created_at(directory) if vtcode_manifest else None) or copy_mtime or envelope.ts
    return _VtcodeSession(name, copy_sha, copy, copy_ts, held, vtcode_manifest, addressable)


def _read_vtcode_copy(path: Path) -> tuple[Optional[str], Optional[dict], Optional[str]]:
    """``(sha256, parsed object or None, mtime)`` of VT Code's ``derived/memory.json``;
    ``(None, None, None)`` when it is missing, not a regular file, too large or unreadable."""
    try:
        st = os.lstat(path)
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_ENVELOPE_BYTES:
            return None, None, None
        raw = read_no_follow(path)
    except FileNotFoundError:
        return None, None, None
    except (OSError, StoreIOError) as exc:
        logger.warning("migrate: cannot read %s: %s", path, exc)
        return None, None, None
    if raw is None:
        return None, None, None
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        data = None
    return hashlib.sha256(raw).hexdigest(), data if isinstance(data, dict) else None, _mtime_ts(st)


def _manifest_created_at(directory: Path) -> Optional[str]:
    """The ``created_at`` of VT Code's manifest (the copied file's mtime, as VT Code wrote
    it), in memstore's format; ``None`` when it is missing or does not parse."""
    try:
        raw = read_no_follow(directory / MANIFEST_FILE)
        data = orjson.loads(raw) if raw is not None else None
    except (StoreIOError, orjson.JSONDecodeError):
        return None
    value = data.get("created_at") if isinstance(data, dict) else None
    return ev.normalize_ts(value) if isinstance(value, str) and ev.parse_ts(value) is not None else None


@dataclass
class _TrajectoryCopy:
    """VT Code's copy of a trajectory log ``logs/<stem>.jsonl``: ``derived/trajectory.jsonl`` of
    the session its migration made (id ``traj-`` + the stem without a leading ``trajectory-``,
    so ``traj-<stamp>`` for a rotated log and ``traj-trajectory`` for the live one), with
    VT Code's manifest and no log."""

    name: str  # the directory name under sessions/
    sha256: str
    generation: Optional[str]
    lines: list[tuple[int, bytes]]  # its complete non-blank lines, numbered as in the log
    last: int  # the number of its last complete line

    def is_prefix_of(self, trajectory: _Trajectory) -> bool:
        """Whether every complete line of the copy is the same line of ``trajectory`` (the log
        only grew since VT Code copied it)."""
        if self.last > trajectory.last_line:
            return False
        return [(n, line) for n, line in trajectory.lines if n <= self.last] == self.lines


def _vtcode_trajectory_copy(root: Path, name: str) -> Optional[_TrajectoryCopy]:
    """VT Code's copy of ``logs/<name>``, if its migration left one (see :class:`_TrajectoryCopy`)."""
    vtcode_id = "traj-" + name[: -len(".jsonl")].removeprefix("trajectory-")
    directory_name = sanitize_session_id(vtcode_id)
    directory = sessions_root(root) / directory_name
    path = directory / DERIVED_DIR / TRAJECTORY_FILE
    try:
        if not stat.S_ISDIR(os.lstat(directory).st_mode) or os.path.lexists(directory / EVENTS_FILE):
            return None
        summary = load_summary(directory)
        st = os.lstat(path)
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_TRAJECTORY_BYTES:
            return None
        raw = read_no_follow(path)
    except FileNotFoundError:
        return None
    except (OSError, StoreIOError) as exc:
        logger.warning("migrate: cannot read %s: %s", path, exc)
        return None
    if (
        raw is None
        or summary is None
        or summary.session_id not in (vtcode_id, directory_name)
        or summary.turn_count != 0
        or summary.event_count != 0
    ):
        return None
    lines, last = _split_lines(raw, complete_only=True)
    generation = hashlib.sha256(lines[0][1]).hexdigest()[:32] if lines else None
    return _TrajectoryCopy(directory_name, hashlib.sha256(raw).hexdigest(), generation, lines, last)


# --------------------------------------------------------------------------------------------
# Writing into sessions


def _unix_ts(record: dict) -> Optional[str]:
    value = record.get("ts")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if not math.isfinite(value) or not 0 <= value <= _MAX_UNIX_TS:
        return None
    return ev.format_ts(datetime.fromtimestamp(value, UTC))


def _trajectory_event(trajectory: _Trajectory, number: int, line: bytes) -> tuple[dict, Optional[str]]:
    source = {"file": trajectory.rel, "generation": trajectory.generation, "line": number}
    try:
        record = orjson.loads(line)
    except orjson.JSONDecodeError:
        record = None
    if isinstance(record, dict):
        return {"type": TRAJECTORY_EVENT, "record": record, "source": source}, _unix_ts(record)
    return {"type": TRAJECTORY_EVENT, "raw": line.decode("utf-8", "backslashreplace"), "source": source}, None


class _Writer:
    """Appends imported events to one session, dating each no earlier than the log's last."""

    def __init__(
        self, root: Path, session_id: str, first_file: str, report: MigrationReport, *, vtcode_session: bool = False
    ):
        # Only a directory this import made may be removed again (see finish).
        self.made_directory = not os.path.lexists(session_directory(root, session_id))
        # A session VT Code's migration made is not created by this import, even when this
        # import starts its log.
        self.vtcode_session = vtcode_session
        self.log: SessionLog = open_session(root, session_id, max_events=0, durability="none")
        self.root = root
        self.session_id = session_id
        self.report = report
        try:
            self.found = _imported(self.log.iter_records())
        except BaseException:
            self.log.close()
            raise
        self.created = self.found.records == 0  # an empty log: this import starts its thread
        self.first_file = first_file
        self.started = False
        self.appended = False
        # A session an interrupted migration left unfinished is finished now (see _unfinished).
        self.unfinished = not self.created and _unfinished(root, session_id, self.found)

    def append(self, event: dict, ts: Optional[str]) -> None:
        """Append ``event`` dated ``ts`` (never in the future, never before the log's last
        record); :class:`InvalidEvent` (nothing written) if it cannot be serialized (JSON nested
        deeper than orjson writes)."""
        ts = not_before(not_after_now(ts), self.found.last_ts)
        if self.created and not self.started:
            ev.encode_record(1, ts, event)  # refuse before the thread starts, not after
            self.log.append(
                {
                    "type": ev.THREAD_STARTED,
                    "thread_id": self.session_id,
                    "source": {"agent": "vtcode", "importer": IMPORTER, "file": self.first_file},
                },
                ts=ts,
            )
            self.started = True
        self.log.append(event, ts=ts)
        self.found.last_ts = ev.normalize_ts(ts)
        self.found.add(Record(None, None, event))
        self.appended = True

    def finish(self) -> None:
        """Close the thread of a created session, sync the log, then regenerate the derived
        views from it (the log is synced before any view describes it), and close. A session
        directory this import made but appended nothing to is removed again."""
        try:
            if self.appended or self.unfinished:
                if (self.created and self.appended) or (self.found.migrated and not self.found.completed):
                    # Dated when the import finished: the session's last event is its import, so
                    # retention counts a migrated session's age from the migration.
                    self.log.append(
                        {
                            "type": ev.THREAD_COMPLETED,
                            "thread_id": self.session_id,
                            "session_id": self.session_id,
                            "subtype": "success",
                            "outcome_code": "imported",
                            "usage": {},
                            "num_turns": 0,
                        },
                        ts=not_before(ev.utc_now(), self.found.last_ts),
                    )
                self.log.flush()
                if self.found.memory:
                    refresh_memory_view(self.log)
                if self.found.trajectory:
                    write_trajectory_view(self.log)
                if self.created and not self.vtcode_session:
                    self.report.sessions_created += 1
                else:
                    self.report.sessions_updated += 1
        finally:
            self.log.close()
        if self.made_directory and not self.appended:
            remove_session_directory(self.root, self.log.directory)

    def abort(self) -> None:
        """Close after a failure: what was appended stays (each record says where it came from,
        so the next run goes on from there); the views are regenerated by the next run."""
        try:
            self.log.close()
        except Exception as exc:  # the failure being raised is the one to report
            logger.warning("closing %s after a failed import: %s", self.log.directory, exc)


def _open_writer(
    root: Path,
    session_id: str,
    first_file: str,
    report: MigrationReport,
    sources: list[str],
    *,
    vtcode_session: bool = False,
) -> Optional[_Writer]:
    try:
        return _Writer(root, session_id, first_file, report, vtcode_session=vtcode_session)
    except SessionBusyError:
        for rel in sources:
            report.skip(rel, f"session {session_id!r} is open in another process; run migrate again later")
    except StoreIOError as exc:
        # A session directory (or its lock) that is a symlink or not what it must be: that
        # session is skipped. Any other I/O error is the store failing, and reaches the caller.
        if not (isinstance(exc, UnsafePathError) or exc.errno == errno.ELOOP):
            raise
        for rel in sources:
            report.skip(rel, f"session {session_id!r} cannot be opened ({exc})")
    return None


def _import_envelopes(root: Path, session_id: str, envelopes: list[_Envelope], report: MigrationReport) -> None:
    sources = [e.rel for e in envelopes]
    try:
        held = _imported_read_only(root, session_id)
    except StoreIOError as exc:
        for rel in sources:
            report.skip(rel, f"session {session_id!r} cannot be read ({exc})")
        return
    pending: list[_Envelope] = []
    # VT Code's sessions to import into: (the session, changed files, files an interrupted run
    # already put there and that session still needs finishing for).
    into_vtcode: dict[str, tuple[_VtcodeSession, list[_Envelope], list[str]]] = {}
    for envelope in envelopes:
        vtcode = _vtcode_session(root, envelope)
        if envelope.sha256 in held.envelope_shas:
            report.already_imported += 1
            if vtcode is not None and vtcode.copy_sha256 == envelope.sha256:
                report.vtcode(envelope.rel, vtcode.name, VtcodeState.ALSO_IMPORTED)
        elif vtcode is not None and envelope.sha256 in vtcode.held.envelope_shas:
            report.already_imported += 1  # an earlier run put it into VT Code's session
            if vtcode.addressable and _unfinished(root, vtcode.name, vtcode.held):
                into_vtcode.setdefault(vtcode.name, (vtcode, [], []))[2].append(envelope.rel)
        elif vtcode is not None and vtcode.copy_sha256 == envelope.sha256:
            report.already_migrated += 1
            report.vtcode(envelope.rel, vtcode.name, VtcodeState.ALREADY_MIGRATED)
        elif vtcode is not None and envelope.rel not in held.files and vtcode.adoptable_for(envelope):
            into_vtcode.setdefault(vtcode.name, (vtcode, [], []))[1].append(envelope)
        else:
            pending.append(envelope)
    for vtcode, changed, unfinished in into_vtcode.values():
        _import_into_vtcode_session(root, vtcode, changed, unfinished, report)
    if not pending and not _unfinished(root, session_id, held):
        return  # nothing new: the session is not even opened for writing
    writer = _open_writer(
        root, session_id, (pending or envelopes)[0].rel, report, [e.rel for e in pending or envelopes]
    )
    if writer is None:
        return
    try:
        for envelope in pending:
            _append_envelope(writer, envelope, report)
    except BaseException:
        writer.abort()
        raise
    writer.finish()


def _append_envelope(writer: _Writer, envelope: _Envelope, report: MigrationReport) -> bool:
    """Append one legacy envelope (unless the log holds it already); whether it was appended."""
    if envelope.sha256 in writer.found.envelope_shas:  # imported since we looked
        report.already_imported += 1
        return False
    try:
        writer.append(
            {
                "type": ENVELOPE_EVENT,
                "envelope": envelope.data,
                "source": {"importer": IMPORTER, "file": envelope.rel, "sha256": envelope.sha256, "mtime": envelope.ts},
            },
            envelope.ts,
        )
    except InvalidEvent as exc:
        report.skip(envelope.rel, f"cannot be stored as an event ({exc})")
        return False
    report.memory_imported += 1
    report.bytes_migrated += envelope.size
    return True


def _import_into_vtcode_session(
    root: Path, vtcode: _VtcodeSession, envelopes: list[_Envelope], unfinished: list[str], report: MigrationReport
) -> None:
    """Import files changed since VT Code migrated them into the session VT Code made for them,
    and finish what an interrupted run left there (``unfinished``: the files it had imported). A log this import starts there begins
    with VT Code's copy (the only copy left of the version VT Code migrated), dated when VT
    Code says that version was written; the changed versions follow, so the regenerated view
    is the newest."""
    sources = [e.rel for e in envelopes] + unfinished
    writer = _open_writer(root, vtcode.name, sources[0], report, sources, vtcode_session=True)
    if writer is None:
        return
    try:
        if (
            envelopes
            and vtcode.copy is not None
            and vtcode.copy_sha256 not in writer.found.envelope_shas
            and not writer.found.migrated
        ):
            writer.append(
                {
                    "type": ENVELOPE_EVENT,
                    "envelope": vtcode.copy,
                    "source": {
                        "importer": IMPORTER,
                        "file": vtcode.copy_rel,
                        "sha256": vtcode.copy_sha256,
                        "mtime": vtcode.copy_ts,
                        "migrated_by": "vtcode",
                        "legacy_file": sources[0],
                    },
                },
                vtcode.copy_ts,
            )
        for envelope in envelopes:
            if _append_envelope(writer, envelope, report):
                report.vtcode(envelope.rel, vtcode.name, VtcodeState.CHANGED_SINCE)
    except BaseException:
        writer.abort()
        raise
    writer.finish()


def _import_trajectory(
    root: Path, trajectory: _Trajectory, live: _Imported, live_copy: Optional[_TrajectoryCopy], report: MigrationReport
) -> None:
    """Import the lines of ``trajectory`` that no session holds yet.

    VT Code's copies count (see the module docstring): a rotated log whose own session VT Code
    made (same name as memstore's) is not imported when the copy is the file as it is, and not
    imported over a copy holding lines the file lost; the lines of VT Code's copy of the live
    log (``live_copy``) are not imported again from the live log or the rotated log it became."""
    own = _vtcode_trajectory_copy(root, trajectory.rel.split("/", 1)[1])
    into_vtcode = own is not None and own.name == trajectory.session_id
    if own is not None and into_vtcode:
        if own.sha256 == trajectory.sha256:
            report.already_migrated += 1
            report.vtcode(trajectory.rel, own.name, VtcodeState.ALREADY_MIGRATED)
            return
        if not own.is_prefix_of(trajectory):
            report.skip(
                trajectory.rel,
                f"VT Code's copy in session {own.name!r} holds lines this file no longer "
                "holds (it was rewritten since VT Code migrated it); not imported over it",
            )
            return
    if trajectory.generation is None:
        report.already_imported += 1  # nothing in it
        return
    try:
        held = _imported_read_only(root, trajectory.session_id)
    except StoreIOError as exc:
        report.skip(trajectory.rel, f"session {trajectory.session_id!r} cannot be read ({exc})")
        return
    done = held.lines.get(trajectory.generation, 0)
    if trajectory.session_id != LIVE_TRAJECTORY_SESSION:
        # A rotated log begins with what traj-live may already hold of it (same generation).
        done = max(done, live.lines.get(trajectory.generation, 0))
    copied = 0  # lines 1..copied are in VT Code's copy of the live log, and in no log
    if live_copy is not None and live_copy.generation == trajectory.generation and live_copy.is_prefix_of(trajectory):
        copied = live_copy.last if live_copy.last > done else 0
    if not any(number > max(done, copied) for number, _line in trajectory.lines):
        if copied and live_copy is not None:
            report.already_migrated += 1
            report.vtcode(trajectory.rel, live_copy.name, VtcodeState.ALREADY_MIGRATED)
        else:
            report.already_imported += 1
            if live_copy is not None and live_copy.sha256 == trajectory.sha256:
                report.vtcode(trajectory.rel, live_copy.name, VtcodeState.ALSO_IMPORTED)
        if not _unfinished(root, trajectory.session_id, held):
            return
    done = max(done, copied)
    writer = _open_writer(
        root, trajectory.session_id, trajectory.rel, report, [trajectory.rel], vtcode_session=into_vtcode
    )
    if writer is None:
        return
    imported = 0
    try:
        done = max(done, writer.found.lines.get(trajectory.generation, 0))
        for number, line in trajectory.lines:
            if number <= done:
                continue
            event, ts = _trajectory_event(trajectory, number, line)
            try:
                writer.append(event, ts or trajectory.ts)
            except InvalidEvent:
                # JSON nested deeper than orjson writes: its text is kept instead.
                event = {
                    "type": TRAJECTORY_EVENT,
                    "raw": line.decode("utf-8", "backslashreplace"),
                    "source": event["source"],
                }
                writer.append(event, ts or trajectory.ts)
            imported += 1
            report.bytes_migrated += len(line) + 1
        writer.found.lines[trajectory.generation] = max(done, trajectory.lines[-1][0])
    except BaseException:
        writer.abort()
        raise
    writer.finish()
    if imported:
        report.trajectory_imported += 1
        report.records_imported += imported
        if trajectory.session_id == LIVE_TRAJECTORY_SESSION:
            live.lines[trajectory.generation] = writer.found.lines[trajectory.generation]
        if own is not None and into_vtcode:
            report.vtcode(trajectory.rel, own.name, VtcodeState.CHANGED_SINCE)
        elif copied and live_copy is not None:
            report.vtcode(trajectory.rel, live_copy.name, VtcodeState.CHANGED_SINCE)


# --------------------------------------------------------------------------------------------
# Public API


def migrate_legacy(root: os.PathLike | str, remove_legacy: bool = False) -> MigrationReport:
    """Import the legacy stores of the VT Code directory ``root`` into sessions (see the module
    docstring); with ``remove_legacy``, then remove the imported sources (:func:`gc_legacy`).

    Running it again imports only what is new. A source that cannot be read or parsed, or whose
    session is open in another process, is listed in ``report.skipped`` with the reason; an
    error writing the store raises :class:`StoreIOError` naming the path. A ``root`` that does
    not exist gives an empty report (nothing is created).
    """
    root = Path(root)
    report = MigrationReport()
    if not root.is_dir():
        return report
    with store_lock(root, "migration"):
        groups = _collect_envelopes(root, report.skipped)
        trajectories = _collect_trajectories(root, report.skipped)
        for skipped in report.skipped:
            logger.warning("migrate: not importing %s: %s", skipped.path, skipped.reason)
        for session_id in sorted(groups):
            _import_envelopes(root, session_id, groups[session_id], report)
        live = _Imported()
        live_copy = None
        if trajectories:
            try:
                live = _imported_read_only(root, LIVE_TRAJECTORY_SESSION)
            except StoreIOError as exc:
                logger.warning("migrate: cannot read %s: %s", LIVE_TRAJECTORY_SESSION, exc)
            live_copy = _vtcode_trajectory_copy(root, LEGACY_TRAJECTORY_FILE)
        for trajectory in trajectories:
            _import_trajectory(root, trajectory, live, live_copy, report)
        if remove_legacy:
            report.legacy = _gc_legacy(root)
    return report


def gc_legacy(root: os.PathLike | str) -> LegacyGcReport:
    """Remove the legacy sources migration has imported; return what was removed and kept.

    Unlike VT Code, which deletes ``history/`` and ``logs/`` wholesale, only files whose content
    a session's log holds are removed (a file only VT Code's migration holds, in a
    ``derived/memory.json`` without a log, is kept) (each recorded in ``gc-log.jsonl``, reason
    ``legacy_imported``): an envelope whose SHA-256 was imported, a rotated trajectory log whose
    every line was. Kept, and listed with the reason: compaction history artifacts (never
    imported), the live ``trajectory.jsonl`` (VT Code may be writing it), files not imported
    (yet), unreadable ones and symlinks. ``history/`` and ``logs/`` go when nothing is left in
    them; ``checkpoints/`` is never touched. Holds the store's ``migration`` lock.
    """
    root = Path(root)
    if not root.is_dir():
        return LegacyGcReport()
    with store_lock(root, "migration"):
        return _gc_legacy(root)


def _gc_legacy(root: Path) -> LegacyGcReport:
    report = LegacyGcReport()
    held: dict[str, _Imported] = {}

    def session(session_id: str) -> _Imported:
        if session_id not in held:
            try:
                held[session_id] = _imported_read_only(root, session_id)
            except StoreIOError as exc:
                logger.warning("gc_legacy: cannot read session %s: %s", session_id, exc)
                held[session_id] = _Imported()
        return held[session_id]

    removable: list[tuple[str, Path, os.stat_result, str]] = []  # (rel, path, as read, session)
    kept = report.kept
    for entry in _listing(root, LEGACY_HISTORY_DIR, kept):
        rel = f"{LEGACY_HISTORY_DIR}/{entry.name}"
        if not entry.name.endswith(ENVELOPE_SUFFIX):
            kept.append(SkippedSource(rel, "not a memory envelope; migrate does not import it"))
            continue
        problems: list[SkippedSource] = []
        envelope = _read_envelope(root, entry, problems)
        if envelope is None:
            kept.extend(problems)
            continue
        holder = envelope.session_id
        if envelope.sha256 not in session(holder).envelope_shas:
            vtcode = _vtcode_session(root, envelope)
            if vtcode is not None and envelope.sha256 in vtcode.held.envelope_shas:
                holder = vtcode.name
            elif vtcode is not None and vtcode.copy_sha256 == envelope.sha256:
                kept.append(
                    SkippedSource(
                        rel,
                        f"migrated by VT Code into session {vtcode.name!r}, which holds it only "
                        "as derived/memory.json, in no log",
                    )
                )
                continue
            else:
                kept.append(SkippedSource(rel, f"not imported into session {envelope.session_id!r} (run migrate)"))
                continue
        removable.append((rel, Path(entry.path), envelope.st, holder))
    for entry in _listing(root, LEGACY_LOGS_DIR, kept):
        rel = f"{LEGACY_LOGS_DIR}/{entry.name}"
        sid = trajectory_session_id(entry.name) if entry.name.endswith(".jsonl") else None
        if sid is None:
            kept.append(SkippedSource(rel, "not a trajectory log; migrate does not import it"))
            continue
        if sid == LIVE_TRAJECTORY_SESSION:
            kept.append(SkippedSource(rel, "the live trajectory log: VT Code may still be writing it"))
            continue
        problems = []
        trajectory = _read_trajectory(entry, sid, problems)
        if trajectory is None:
            kept.extend(problems)
            continue
        if trajectory.generation is not None:
            generation = trajectory.generation
            spans = [
                (held.first_lines[generation], held.lines[generation])
                for held in (session(sid), session(LIVE_TRAJECTORY_SESSION))
                if generation in held.lines
            ]
            missing = [n for n, _line in trajectory.lines if not any(first <= n <= last for first, last in spans)]
            if missing:
                kept.append(SkippedSource(rel, _why_kept(root, trajectory, missing, sid)))
                continue
        removable.append((rel, Path(entry.path), trajectory.st, sid))
    if removable:
        with GcLog(root) as gc_log:
            for rel, path, before, sid in removable:
                if not _unchanged(path, before):
                    kept.append(SkippedSource(rel, "changed while gc_legacy looked at it"))
                    continue
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    continue
                except OSError as exc:
                    raise StoreIOError.from_os_error("remove", path, exc) from exc
                gc_log.record(
                    session_id=sid, directory=rel, reason="legacy_imported", size=before.st_size, updated_at=None
                )
                report.removed.append(rel)
                report.bytes_freed += before.st_size
    for name in (LEGACY_HISTORY_DIR, LEGACY_LOGS_DIR):
        try:
            os.rmdir(root / name)  # only when empty; never follows a symlink
        except OSError:
            pass
    return report


def _why_kept(root: Path, trajectory: _Trajectory, missing: list[int], session_id: str) -> str:
    """Why gc_legacy keeps a rotated trajectory log whose lines ``missing`` no log holds."""
    own = _vtcode_trajectory_copy(root, trajectory.rel.split("/", 1)[1])
    if own is not None and own.name == session_id and own.sha256 == trajectory.sha256:
        return (
            f"migrated by VT Code into session {own.name!r}, which holds it only as derived/trajectory.jsonl, in no log"
        )
    live_copy = _vtcode_trajectory_copy(root, LEGACY_TRAJECTORY_FILE)
    if (
        live_copy is not None
        and live_copy.generation == trajectory.generation
        and live_copy.is_prefix_of(trajectory)
        and max(missing) <= live_copy.last
    ):
        return (
            f"lines {min(missing)}-{max(missing)} are held only by VT Code's copy in session {live_copy.name!r}, "
            "in no log"
        )
    return f"not (fully) imported into session {session_id!r} (run migrate)"


def _unchanged(path: Path, before: os.stat_result) -> bool:
    """Whether ``path`` is still the regular file that was read (an atomic rewrite by VT Code in
    between would be another inode, and is not deleted)."""
    try:
        now = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISREG(now.st_mode) and (now.st_dev, now.st_ino, now.st_size, now.st_mtime_ns) == (
        before.st_dev,
        before.st_ino,
        before.st_size,
        before.st_mtime_ns,
    )


__all__ = [
    "MigrationReport",
    "VtcodeMigration",
    "VtcodeState",
    "LegacyGcReport",
    "SkippedSource",
    "migrate_legacy",
    "gc_legacy",
    "envelope_session_id",
    "trajectory_session_id",
]
