"""Retention: which sessions a store keeps, retention pins, and the abandoned-session sweep.

``apply_retention_preserving(root, policy, preserve_session_id)`` runs, under the store-wide
``retention`` lock:

1. **The abandoned sweep.** An ``active`` session that nobody holds open and whose last event is
   older than ``max_age_days`` is marked ``completed`` (its ``manifest.json`` is rewritten under
   the session's own liveness lock; ``updated_at`` is kept, so step 4 removes it in the same
   run). ``max_age_days == 0`` (no age limit) disables the sweep.
2. **Empty shells** are removed: no closed turn, not active, and nothing in the log but
   ``thread.started`` / ``thread.completed`` (any other event, such as an imported
   ``memory.envelope`` or ``trajectory.record``, is content), and no data in ``derived/`` that
   no log produced (imported legacy data, or a progress ledger).
3. **The count cap**: if more than ``max_sessions`` removable sessions remain, the oldest go.
4. **The age cap**: the remaining sessions whose last event is older than ``max_age_days`` go;
   ``max_age_days == 0`` means no age limit (nothing ages out).

Nothing is removed unless the caller asks: ``apply_retention(root, policy)`` is a dry run that
reports what a run would do, and ``apply=True`` removes (the CLI's ``--apply``).

Only real directories directly under ``<root>/sessions`` are considered: never a symlink, never
a path read from a manifest, never a session that is live (its ``session.lock`` is held),
pinned (``retention-pin.json`` exists, whatever it is) or preserved (the caller's current
session). "Removable" means completed and none of those.

**Imported sessions** (their ``thread.started`` names the agent log they were imported from:
Codex, Claude Code) are a user's history, and their sources may be gone (Claude Code deletes
transcripts after 30 days): by default retention neither removes them nor counts them against
the caps (``report.imported_kept`` says how many it kept). With
``RetentionPolicy(include_imported=True)`` they are judged like the rest, and each one removed
is **tombstoned** (``<root>/tombstones.jsonl``, see :mod:`memstore.tombstones`), durably and
before its removal is final, so that the next import of its source does not recreate it. When
that file is damaged, no imported session is removed (fail closed).

A session's age is measured from its last event time (the manifest's ``updated_at``, or the
log's when the manifest is missing, malformed or behind the log), parsed as a time; file mtimes
are never used, and a time that does not parse is never aged out (and sorts as the newest for
the count cap).

Removal goes through :func:`memstore.locks.remove_session_directory`, which takes the session's
liveness lock, so a writer that opens a session while retention runs keeps it. Just before each
removal the session is checked again (its manifest, log and pin must be exactly as when it was
judged); one that changed is left for the next run. Every removal is recorded as one fsynced
JSON line in ``<root>/gc-log.jsonl`` (0600), once the session is in the store's trash and
before it is deleted::

    {"session_id": ..., "directory": "sessions/<name>", "removed_at": ..., "reason":
     "empty_shell" | "count_cap" | "age_cap" | "legacy_imported", "bytes": ..., "updated_at": ...,
     "removal_id": ...}

A run killed between a removal's record and its end leaves the session in the trash; the next
run completes that removal when ``gc-log.jsonl`` holds its ``removal_id`` (once recorded, a
removal is final) and puts the session back when it does not (it was never recorded).

What differs from VT Code's ``retention.rs``: ages come from parsed event times, not string
comparison; a session whose only content is imported data is not an empty shell; sessions whose
manifest lags their log are judged by the log; removals are recorded; a pin that is not a
regular file still pins; a no-op removal is not counted; ``max_age_days=0`` is no age limit
(VT Code ages out every session with it: 0 meant "no sweep" for one step and "everything is
too old" for the next); and nothing is removed without ``apply=True``.
"""

from __future__ import annotations

import logging
import os
import stat
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Optional, Union

import orjson

from . import events as ev
from .changes import mark_changed, mark_session_changed
from .errors import (
    InvalidSessionId,
    MemstoreError,
    SessionNotFound,
    StoreIOError,
    UnsafePathError,
)
from .fsio import atomic_write, open_private_append, read_no_follow, write_all
from .layout import (
    DERIVED_DIR,
    EVENTS_FILE,
    GC_LOG_FILE,
    IMPORT_STATE_FILE,
    MANIFEST_FILE,
    MEMORY_FILE,
    PIN_FILE,
    PROGRESS_FILE,
    SESSIONS_DIR,
    TOMBSTONES_FILE,
    TRAJECTORY_FILE,
    TRASH_DIR,
    check_session_id,
    session_dir_name,
    session_directory,
    sessions_root,
)
from .locks import empty_trash, new_removal_id, remove_session_directory, store_lock
from .reader import read_session_dir
from .session.lock import LivenessLock, SessionGone, is_live
from .session.manifest import STATUS_ACTIVE, STATUS_COMPLETED, SessionSummary, summary_cache
from .tombstones import TombstoneFileError, TombstoneReason, Tombstones
from .views.memory_view import VIEW_MARKER

logger = logging.getLogger("memstore")

# The events an empty shell may hold: a session that started and ended without doing anything.
SHELL_EVENTS = frozenset({ev.THREAD_STARTED, ev.THREAD_COMPLETED})
_DAY = 86_400

REASON_EMPTY_SHELL = "empty_shell"
REASON_COUNT_CAP = "count_cap"
REASON_AGE_CAP = "age_cap"


@dataclass(frozen=True)
class RetentionPolicy:
    """How many removable sessions to keep and for how long (VT Code's defaults: 50, 30 days).

    ``max_sessions=0`` keeps no removable session. ``max_age_days=0`` means no age limit: no
    session is aged out and no idle active one is marked abandoned (to remove every completed
    session, use ``max_sessions=0``). Imported sessions (Codex, Claude Code logs) are kept and
    not counted unless ``include_imported`` (then each one removed is tombstoned so that no
    import recreates it).
    """

    max_sessions: int = 50
    max_age_days: int = 30
    include_imported: bool = False

    def __post_init__(self) -> None:
        for name in ("max_sessions", "max_age_days"):
            value = getattr(self, name)
            if type(value) is not int or value < 0:
                raise ValueError(f"{name} must be a non-negative int, not {value!r}")
        if type(self.include_imported) is not bool:
            raise ValueError(f"include_imported must be a bool, not {self.include_imported!r}")


@dataclass(frozen=True)
class RemovedSession:
    """A session retention removed (or, in a dry run, would remove)."""

    session_id: str
    directory: str  # the directory's name under <root>/sessions
    reason: str  # empty_shell, count_cap or age_cap
    bytes: int
    updated_at: Optional[str]


@dataclass(frozen=True)
class SkippedSession:
    """An entry of ``<root>/sessions`` retention left alone, and why."""

    directory: str
    reason: str


@dataclass
class RetentionReport:
    """What a retention run did: ``removed`` (what a dry run would remove), the sessions the
    abandoned sweep marked completed (or would mark), and what it skipped and why. Sessions kept
    simply because the policy keeps them are not listed."""

    dry_run: bool = False
    removed: list[RemovedSession] = field(default_factory=list)
    marked_abandoned: list[str] = field(default_factory=list)
    skipped: list[SkippedSession] = field(default_factory=list)
    imported_kept: int = 0  # imported sessions kept because the policy leaves them out

    @property
    def count(self) -> int:
        """The number of sessions removed (or that a dry run would remove)."""
        return len(self.removed)

    @property
    def bytes(self) -> int:
        return sum(r.bytes for r in self.removed)

    def skip(self, directory: str, reason: str) -> None:
        self.skipped.append(SkippedSession(directory, reason))

    def to_dict(self) -> dict:
        return {
            "dry_run": self.dry_run,
            "count": self.count,
            "bytes": self.bytes,
            "removed": [asdict(r) for r in self.removed],
            "marked_abandoned": list(self.marked_abandoned),
            "skipped": [asdict(s) for s in self.skipped],
            "imported_kept": self.imported_kept,
        }


# --------------------------------------------------------------------------------------------
# Public API


def apply_retention(
    root: os.PathLike | str,
    policy: RetentionPolicy = RetentionPolicy(),
    *,
    apply: Optional[bool] = None,
    dry_run: Optional[bool] = None,
) -> RetentionReport:
    """What ``policy`` would remove from the store at ``root`` (a dry run), or with
    ``apply=True`` mark, remove and record it (see the module docstring). Same as
    :func:`apply_retention_preserving` with no preserved session."""
    return apply_retention_preserving(root, policy, None, apply=apply, dry_run=dry_run)


def _removes(apply: Optional[bool] = None, dry_run: Optional[bool] = None) -> bool:
    """Whether a retention call removes: only when asked, with ``apply=True`` (or the older
    spelling ``dry_run=False``); with neither it is a dry run. :class:`ValueError` when the two
    are given and disagree, :class:`TypeError` when one is not a bool."""
    for name, value in (("apply", apply), ("dry_run", dry_run)):
        if value is not None and type(value) is not bool:
            raise TypeError(f"{name} must be a bool, not {value!r}")
    if apply is not None and dry_run is not None and apply == dry_run:
        raise ValueError(f"apply={apply} and dry_run={dry_run} contradict each other; give one of them")
    if apply is not None:
        return apply
    return dry_run is False


def apply_retention_preserving(
    root: os.PathLike | str,
    policy: RetentionPolicy,
    preserve_session_id: Optional[str],
    *,
    apply: Optional[bool] = None,
    dry_run: Optional[bool] = None,
) -> RetentionReport:
    """Apply ``policy`` to the store at ``root``, never touching ``preserve_session_id`` (the
    caller's current session). Returns a :class:`RetentionReport` (``report.count`` sessions
    removed, or that a dry run would remove).

    A removal is always asked for: only with ``apply=True`` (or ``dry_run=False``) is anything
    marked, removed or recorded. Otherwise it is a dry run: nothing is written or removed (no
    lock is taken, no manifest marked), and the report says what a run would do now. A missing store or sessions directory gives an empty
    report. Raises :class:`InvalidSessionId` for a preserved id memstore refuses, and
    :class:`StoreIOError` (naming the path) when the sessions directory cannot be listed or
    ``gc-log.jsonl`` cannot be written; a problem with one session is logged, listed in
    ``report.skipped``, and the run goes on.
    """
    if not isinstance(policy, RetentionPolicy):
        raise TypeError(f"policy must be a RetentionPolicy, not {type(policy).__name__}")
    if preserve_session_id is not None:
        check_session_id(preserve_session_id)
    dry_run = not _removes(apply, dry_run)
    root = Path(root)
    report = RetentionReport(dry_run=dry_run)
    if not _sessions_dir_usable(root, report):
        return report
    if dry_run:
        candidates = _survey(root, policy.max_age_days, preserve_session_id, report, mark=False)
        candidates = _leave_imported(root, candidates, policy, report)
        for session, reason in _plan_removals(candidates, policy, report):
            report.removed.append(_removal_record(session, reason, _tree_bytes(session.path)))
        return report
    with store_lock(root, "retention"):
        _empty_trash(root)
        candidates = _survey(root, policy.max_age_days, preserve_session_id, report, mark=True)
        candidates = _leave_imported(root, candidates, policy, report)
        plan = _plan_removals(candidates, policy, report)
        if plan:
            tombstones = Tombstones(root)
            with GcLog(root) as gc_log:
                for session, reason in plan:
                    _remove(root, session, reason, report, gc_log, tombstones)
    for entry in report.skipped:
        logger.debug("retention skipped %s: %s", entry.directory, entry.reason)
    return report


def mark_abandoned_active_sessions(
    root: os.PathLike | str, max_age_days: int, preserve_session_id: Optional[str] = None
) -> int:
    """Mark ``completed`` every idle ``active`` session whose last event is older than
    ``max_age_days``; return how many were marked. ``0`` disables the sweep (returns 0).

    Skips live sessions (the session's liveness lock is taken, non-blocking, while its
    ``manifest.json`` is rewritten: atomic, 0600, ``updated_at`` unchanged), pinned ones, the
    preserved one, symlinks and anything that is not a session directory. Holds the store's
    ``retention`` lock.
    """
    if type(max_age_days) is not int or max_age_days < 0:
        raise ValueError(f"max_age_days must be a non-negative int, not {max_age_days!r}")
    if preserve_session_id is not None:
        check_session_id(preserve_session_id)
    if max_age_days == 0:
        return 0
    root = Path(root)
    report = RetentionReport()
    if not _sessions_dir_usable(root, report):
        return 0
    with store_lock(root, "retention"):
        _survey(root, max_age_days, preserve_session_id, report, mark=True, removable_only=False)
    return len(report.marked_abandoned)


def evict_zero_turn_completed_store(root: os.PathLike | str, session_id: str) -> bool:
    """Remove ``session_id`` if it is an empty shell (no closed turn, not active, nothing but
    ``thread.started``/``thread.completed`` in its log, no imported data) that is not live and
    not pinned; return whether it was removed. For the close path of a session that did nothing.

    Does not take the store's retention lock (a sweep may hold it for long): the removal takes
    the session's own lock, which is what keeps writers safe. The removal is recorded in
    ``gc-log.jsonl``. Raises :class:`InvalidSessionId` for an id memstore refuses.
    """
    root = Path(root)
    path = session_directory(root, session_id)
    report = RetentionReport()
    if not _sessions_dir_usable(root, report):
        return False
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise StoreIOError.from_os_error("stat", path, exc) from exc
    if not stat.S_ISDIR(st.st_mode):
        logger.info("not evicting %s: a symlink or not a directory", path)
        return False
    if _pin_state(os.fspath(path)) is not None or is_live(path):
        return False
    seen = _inspect(os.fspath(path))
    if isinstance(seen, str):
        logger.info("not evicting %s: %s", path, seen)
        return False
    if seen.summary.status == STATUS_ACTIVE or seen.summary.turn_count != 0 or not _is_empty_shell(seen.path):
        return False
    if _imported_source(seen) is not None:
        return False  # an import's session is the import's to keep (see the module docstring)
    with GcLog(root) as gc_log:
        return _remove(root, seen, REASON_EMPTY_SHELL, report, gc_log, None)


def pin_session_retention(session_dir: os.PathLike | str, reason: str) -> Path:
    """Pin a session: retention never removes or marks it while ``retention-pin.json`` exists.

    Writes ``{"pinned_at": <now>, "reason": reason}`` (keys sorted) atomically, 0600; pinning
    again replaces the reason. Returns the pin file's path. Raises :class:`SessionNotFound` if
    ``session_dir`` does not exist, and :class:`UnsafePathError` if it is a symlink or not a
    directory, or if ``retention-pin.json`` exists and is not a regular file.
    """
    if not isinstance(reason, str):
        raise TypeError(f"reason must be a str, not {type(reason).__name__}")
    directory = _real_session_dir(session_dir, "pin")
    pin = directory / PIN_FILE
    atomic_write(pin, orjson.dumps({"pinned_at": ev.utc_now(), "reason": reason}, option=orjson.OPT_SORT_KEYS))
    return pin


def unpin_session_retention(session_dir: os.PathLike | str) -> bool:
    """Remove a session's pin; return whether there was one. A ``retention-pin.json`` that is a
    directory is left alone and raises :class:`UnsafePathError` (it still pins the session)."""
    directory = _real_session_dir(session_dir, "unpin")
    pin = directory / PIN_FILE
    try:
        st = os.lstat(pin)
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise StoreIOError.from_os_error("stat", pin, exc) from exc
    if stat.S_ISDIR(st.st_mode):
        raise UnsafePathError("unpin", pin, "is a directory, not a pin file; remove it by hand to unpin")
    try:
        os.unlink(pin)  # a symlink is unlinked itself, never its target
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise StoreIOError.from_os_error("remove", pin, exc) from exc
    return True


def session_retention_pinned(session_dir: os.PathLike | str) -> bool:
    """Whether the session is pinned (``retention-pin.json`` exists, whatever kind of file)."""
    return _pin_state(os.fspath(session_dir)) is not None


def retention_pinned_session_ids(root: os.PathLike | str) -> list[str]:
    """The directory names of the pinned sessions under ``root``, sorted; symlinked entries are
    ignored, and a missing store gives ``[]``."""
    base = sessions_root(root)
    try:
        if not stat.S_ISDIR(os.lstat(base).st_mode):
            return []
        entries = list(os.scandir(base))
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise StoreIOError.from_os_error("list", base, exc) from exc
    return sorted(e.name for e in entries if e.is_dir(follow_symlinks=False) and _pin_state(e.path) is not None)


# --------------------------------------------------------------------------------------------
# gc-log.jsonl


_fdatasync = getattr(os, "fdatasync", os.fsync)  # the appended bytes and the new size, not the mtime


class GcLog:
    """``<root>/gc-log.jsonl``: opened (0600, never through a symlink) before the first removal,
    so a store where removals cannot be recorded removes nothing; each line is written with one
    ``write()`` (``O_APPEND``: lines from concurrent processes never interleave) and fsynced."""

    def __init__(self, root: os.PathLike | str):
        self.path = Path(root) / GC_LOG_FILE
        self.fd: Optional[int] = None

    def __enter__(self) -> GcLog:
        self.fd, _created = open_private_append(self.path)
        return self

    def record(
        self,
        *,
        session_id: Optional[str],
        directory: str,
        reason: str,
        size: int,
        updated_at: Optional[str],
        removal_id: Optional[str] = None,
    ) -> str:
        """Append one removal; return its ``removed_at``."""
        removed_at = ev.utc_now()
        line = orjson.dumps(
            {
                "session_id": session_id,
                "directory": directory,
                "removed_at": removed_at,
                "reason": reason,
                "bytes": size,
                "updated_at": updated_at,
                "removal_id": removal_id,
            },
            option=orjson.OPT_APPEND_NEWLINE,
        )
        fd = self.fd
        if fd is None:
            raise ValueError("GcLog.record outside its with block")
        write_all(fd, line, self.path)
        try:
            _fdatasync(fd)
        except OSError as exc:
            raise StoreIOError.from_os_error("fsync", self.path, exc) from exc
        return removed_at

    def __exit__(self, *exc_info) -> None:
        fd, self.fd = self.fd, None
        if fd is not None:
            os.close(fd)


# --------------------------------------------------------------------------------------------
# Looking at sessions


@dataclass
class _Seen:
    """One session as retention judged it."""

    name: str
    path: str  # strings, not Paths, on the survey's path: it runs for every session
    summary: SessionSummary
    updated: Optional[int]  # the last event time in whole seconds since the epoch; None: unparseable
    stamp: tuple  # what must not change between judging and removing (see _stamp)
    manifest: Optional[dict]  # the manifest to rewrite when marking it abandoned (None: none usable)
    live: Optional[bool] = None  # probed only when it matters (see _live)


def _sessions_dir_usable(root: Path, report: RetentionReport) -> bool:
    """Whether ``<root>/sessions`` is a real directory to work in (a symlink is never followed)."""
    base = sessions_root(root)
    try:
        st = os.lstat(base)
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise StoreIOError.from_os_error("stat", base, exc) from exc
    if stat.S_ISLNK(st.st_mode):
        report.skip("sessions", f"{base} is a symlink; retention does not follow it")
        logger.warning("retention: %s is a symlink; nothing done", base)
        return False
    if not stat.S_ISDIR(st.st_mode):
        report.skip("sessions", f"{base} is not a directory")
        return False
    return True


def _survey(
    root: Path,
    max_age_days: int,
    preserve: Optional[str],
    report: RetentionReport,
    *,
    mark: bool,
    removable_only: bool = True,
) -> list[_Seen]:
    """Look at every entry of ``<root>/sessions`` (sorted by name); run the abandoned sweep
    (``mark``: for real, else only in the report); return the completed sessions that are not
    pinned or preserved. Whether they are live is probed later, only for those it matters for
    (see :func:`_plan_removals`): a removal takes the session's lock anyway."""
    base = sessions_root(root)
    try:
        entries = sorted(os.scandir(base), key=lambda e: e.name)
    except OSError as exc:
        raise StoreIOError.from_os_error("list", base, exc) from exc
    preserved = session_dir_name(preserve) if preserve is not None else None
    cutoff = int(time.time()) - max_age_days * _DAY
    removable = []
    for entry in entries:
        name = entry.name
        if name.startswith("."):
            report.skip(name, "not a session directory (its name starts with a dot)")
            continue
        if entry.is_symlink():
            report.skip(name, "a symlink; retention never follows or removes one")
            continue
        if not entry.is_dir(follow_symlinks=False):
            report.skip(name, "not a directory")
            continue
        if name == preserved:
            report.skip(name, "preserved (the caller's current session)")
            continue
        path = entry.path
        pinned = _pin_state(path)
        if pinned is not None:
            report.skip(name, pinned)
            continue
        seen = _inspect(path)
        if isinstance(seen, str):
            report.skip(name, seen)
            logger.info("retention skipped %s: %s", path, seen)
            continue
        if seen.summary.status == STATUS_ACTIVE:
            if max_age_days == 0 or seen.updated is None or seen.updated >= cutoff:
                if removable_only:
                    report.skip(name, "active")
                continue
            if mark:
                problem = _mark_abandoned(path, seen, cutoff)
            else:
                problem = "live: a process holds its session.lock" if is_live(path) else None
            if problem is not None:
                report.skip(name, problem)
                continue
            report.marked_abandoned.append(name)
            seen.summary = replace(seen.summary, status=STATUS_COMPLETED)
            seen.live = False  # just checked (under its lock, when marking)
        removable.append(seen)
    return removable


_READ_FLAGS = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)


def _read_regular(path: str) -> tuple[Optional[bytes], Optional[tuple]]:
    """``(bytes, stamp)`` of the regular file ``path``, never through a symlink; ``(None, None)``
    when it does not exist. Like ``fsio.read_no_follow``, with the one ``fstat`` serving both
    the regular-file check and the stamp (the survey does this for every session)."""
    try:
        fd = os.open(path, _READ_FLAGS)
    except FileNotFoundError:
        return None, None
    except OSError as exc:
        raise StoreIOError.from_os_error("open", path, exc) from exc
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafePathError("open", path, "is not a regular file")
        data = os.read(fd, st.st_size + 1)
        if len(data) > st.st_size:  # it grew since the fstat: read the rest
            chunks = [data]
            while chunk := os.read(fd, 1 << 16):
                chunks.append(chunk)
            data = b"".join(chunks)
    except OSError as exc:
        raise StoreIOError.from_os_error("read", path, exc) from exc
    finally:
        os.close(fd)
    return data, (st.st_mode, st.st_ino, st.st_size, st.st_mtime_ns)


def _inspect(path: str) -> Union[_Seen, str]:
    """What the session says about itself, or why it cannot be judged (a string). The caller
    has checked that it is not pinned.

    The manifest is used when it describes the whole log (``persisted_file_len`` equals the log's
    size) or there is no log (a VT Code store migrated without one); otherwise (missing,
    malformed, hostile, or behind its log after a crash) the log decides, read through the
    read-only reader.
    """
    try:
        raw, manifest_stamp = _read_regular(f"{path}/{MANIFEST_FILE}")
    except StoreIOError as exc:
        return f"manifest.json cannot be read ({exc.detail or exc})"
    data = None
    if raw is not None:
        try:
            data = orjson.loads(raw)
        except orjson.JSONDecodeError:
            data = None
    summary = SessionSummary.from_dict(data)
    log_stamp = _file_stamp(f"{path}/{EVENTS_FILE}")
    if log_stamp is not None and log_stamp[0] == "error":
        return f"events.jsonl cannot be examined ({os.strerror(log_stamp[1])})"
    if log_stamp is not None and not stat.S_ISREG(log_stamp[0]):
        return "events.jsonl is a symlink or not a regular file"
    covered = data.get("persisted_file_len") if isinstance(data, dict) else None
    if summary is not None and (log_stamp is None or (type(covered) is int and covered == log_stamp[2])):
        manifest = data
    elif log_stamp is not None:
        try:
            with read_session_dir(path) as reader:
                m = reader.manifest
        except (MemstoreError, OSError, ValueError) as exc:
            return f"its manifest is unusable and its log cannot be read ({exc})"
        summary = SessionSummary(m.session_id, m.turn_count, m.event_count, m.status, m.updated_at)
        manifest = m.to_dict()
    elif raw is None:
        return "not a session: no manifest.json and no events.jsonl"
    else:
        return "manifest.json is malformed (not a session summary) and there is no events.jsonl"
    return _Seen(
        path.rpartition("/")[2],
        path,
        summary,
        _epoch_seconds(summary.updated_at),
        (manifest_stamp, log_stamp, None),
        manifest,
    )


def _epoch_seconds(value: str) -> Optional[int]:
    try:
        parsed = ev.parse_ts(value)
        return int(parsed.timestamp()) if parsed is not None else None
    except (OverflowError, ValueError, OSError):
        return None


def _file_stamp(path: str) -> Optional[tuple]:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return ("error", exc.errno)
    return (st.st_mode, st.st_ino, st.st_size, st.st_mtime_ns)


def _stamp(path: str) -> tuple:
    """What retention judges a session by: its manifest, its log and its pin (identity, size and
    mtime of each). Not the directory's mtime: creating session.lock or a temp file in it
    changes nothing retention decides on."""
    return (
        _file_stamp(os.path.join(path, MANIFEST_FILE)),
        _file_stamp(os.path.join(path, EVENTS_FILE)),
        _file_stamp(os.path.join(path, PIN_FILE)),
    )


def _pin_state(path: str) -> Optional[str]:
    """``None`` if the session is not pinned, else why it counts as pinned."""
    pin = f"{path}/{PIN_FILE}"
    try:
        st = os.lstat(pin)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"its pin file cannot be examined ({exc.strerror}); treated as pinned"
    if stat.S_ISDIR(st.st_mode):
        return f"{PIN_FILE} is a directory, not a pin file; treated as pinned"
    if not stat.S_ISREG(st.st_mode):
        return f"{PIN_FILE} is a symlink or special file; treated as pinned"
    try:
        data = orjson.loads(read_no_follow(pin) or b"null")
        reason = data.get("reason") if isinstance(data, dict) else None
    except (orjson.JSONDecodeError, MemstoreError):
        reason = None
    return f"pinned: {reason}" if isinstance(reason, str) and reason else "pinned"


def _is_empty_shell(path: str) -> bool:
    """Whether a zero-turn, non-active session holds nothing worth keeping: its log holds only
    ``thread.started``/``thread.completed``, and ``derived/`` has no data that no log produced
    (VT Code's migration wrote ``memory.json`` or ``trajectory.jsonl`` without any log; a
    progress ledger, ``progress.json``, is only ever there). When in doubt (a file that cannot
    be read), it is not a shell."""
    derived = os.path.join(path, DERIVED_DIR)
    # A trajectory VT Code's migration wrote, or the session's progress ledger (goal,
    # milestones, handoff): data that no log holds.
    for name in (TRAJECTORY_FILE, PROGRESS_FILE):
        try:
            data = os.lstat(os.path.join(derived, name))
            if not stat.S_ISREG(data.st_mode) or data.st_size > 0:
                return False
        except FileNotFoundError:
            pass
        except OSError:
            return False
    try:
        raw = read_no_follow(os.path.join(derived, MEMORY_FILE))
    except StoreIOError:
        return False
    if raw is not None:
        try:
            view = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return False
        # memstore's view carries VIEW_MARKER; a memory.json without it was not produced from a
        # log (VT Code's own migration copies legacy envelopes there): it is data.
        if not (isinstance(view, dict) and VIEW_MARKER in view):
            return False
    if not os.path.lexists(os.path.join(path, EVENTS_FILE)):
        return True
    try:
        with read_session_dir(path) as reader:
            for event in reader.iter_events():
                if event.get("type") not in SHELL_EVENTS:
                    return False
    except (MemstoreError, OSError, ValueError) as exc:
        logger.info("keeping %s: its log cannot be read to tell whether it is empty (%s)", path, exc)
        return False
    return True


def _real_dir_identity(path: str) -> Optional[tuple]:
    """``(st_dev, st_ino)`` of ``path`` if it is a real directory (not a symlink), else ``None``."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino) if stat.S_ISDIR(st.st_mode) else None


def _mark_abandoned(path: str, seen: _Seen, cutoff: int) -> Optional[str]:
    """Rewrite the session's manifest with status ``completed`` under its liveness lock; return
    ``None`` on success, else why it was not marked."""
    # Taking the lock creates session.lock, and marking writes manifest.json, through this path:
    # it must still be the real directory listed, not a symlink swapped in since (checked again
    # just before the write; the paths in between cannot be pinned without *at() calls).
    identity = _real_dir_identity(path)
    if identity is None:
        return "no longer a real directory"
    lock = LivenessLock(path)
    try:
        if not lock.acquire():
            return (
                "live: a process holds its session.lock"
                if lock.holder_elsewhere
                else "its session.lock cannot be locked; not marked"
            )
    except SessionGone:
        return "removed while retention looked at it"
    except StoreIOError as exc:
        return f"its session.lock is unusable ({exc})"
    try:
        # Judge again under the lock: what is rewritten must be what was judged.
        again = _inspect(path)
        if isinstance(again, str):
            return again
        if again.summary.status != STATUS_ACTIVE or again.updated is None or again.updated >= cutoff:
            return "changed while retention looked at it"
        if again.manifest is None:
            return "its manifest is unusable"
        manifest = dict(again.manifest)
        manifest["status"] = STATUS_COMPLETED
        target = os.path.join(path, MANIFEST_FILE)
        if _real_dir_identity(path) != identity:
            return "replaced while retention looked at it"
        try:
            atomic_write(target, orjson.dumps(manifest))
        except StoreIOError as exc:
            logger.warning("could not mark %s abandoned: %s", path, exc)
            return f"could not be marked completed ({exc})"
        summary_cache.invalidate(target)
        mark_session_changed(path)
        seen.manifest = manifest
        seen.stamp = _stamp(path)
        return None
    finally:
        lock.release()


# --------------------------------------------------------------------------------------------
# Deciding and removing


def _live(seen: _Seen, report: RetentionReport) -> bool:
    """Whether a process holds the session (probed once); a live one is reported as skipped."""
    if seen.live is None:
        seen.live = is_live(seen.path)
        if seen.live:
            report.skip(seen.name, "live: a process holds its session.lock")
    return seen.live


def _imported_source(seen: _Seen) -> Optional[dict]:
    """The ``source`` of an imported session (what its ``thread.started`` says it was imported
    from), or ``None`` for a session an agent wrote. The manifest says it; a manifest written
    before it carried ``source`` leaves it to the log's first record. When in doubt (a log that
    cannot be read), the session counts as imported: kept."""
    manifest = seen.manifest
    if isinstance(manifest, dict) and "source" in manifest:
        source = manifest.get("source")
        return source if isinstance(source, dict) and isinstance(source.get("path"), str) else None
    if not os.path.lexists(os.path.join(seen.path, EVENTS_FILE)):
        return None  # no log: nothing was imported into it
    try:
        with read_session_dir(seen.path) as reader:
            first = next(iter(reader.iter_records()), None)
    except (MemstoreError, OSError, ValueError) as exc:
        logger.info("retention: cannot tell whether %s was imported (%s); kept as if it were", seen.path, exc)
        return {"path": None}
    if first is None or first.event.get("type") != ev.THREAD_STARTED:
        return None
    source = first.event.get("source")
    return source if isinstance(source, dict) and isinstance(source.get("path"), str) else None


def _leave_imported(
    root: Path, candidates: list[_Seen], policy: RetentionPolicy, report: RetentionReport
) -> list[_Seen]:
    """The candidates retention may judge under ``policy``: imported sessions are left out
    (counted in ``report.imported_kept``) unless the policy includes them, and, when it does,
    while ``tombstones.jsonl`` is damaged (a removal that cannot be tombstoned would be undone
    by the next import)."""
    if policy.include_imported:
        try:
            Tombstones(root).all()
            return candidates
        except TombstoneFileError as exc:
            logger.warning("retention keeps every imported session: %s", exc)
            report.skip(TOMBSTONES_FILE, f"damaged, so no imported session is removed ({exc})")
    kept = []
    for seen in candidates:
        if _imported_source(seen) is not None:
            report.imported_kept += 1
        else:
            kept.append(seen)
    return kept


def _plan_removals(
    candidates: list[_Seen], policy: RetentionPolicy, report: RetentionReport
) -> list[tuple[_Seen, str]]:
    """The removals, in order: empty shells, then the count cap's oldest, then the aged.

    Live sessions are neither removed nor counted against the cap (as in VT Code); liveness is
    probed for the sessions a phase would remove and, when the count cap applies, for all that
    count against it, so a sweep that removes nothing probes nothing.
    """
    plan: list[tuple[_Seen, str]] = []
    rest = []
    for seen in candidates:
        if seen.summary.turn_count == 0 and _is_empty_shell(seen.path):
            if not _live(seen, report):
                plan.append((seen, REASON_EMPTY_SHELL))
        else:
            rest.append(seen)
    if len(rest) > policy.max_sessions:
        rest = [seen for seen in rest if not _live(seen, report)]
    if len(rest) > policy.max_sessions:
        # Oldest first by parsed time; an unparseable time sorts as the newest (kept longest).
        rest.sort(key=lambda s: (s.updated is None, s.updated or 0, s.name))
        excess = len(rest) - policy.max_sessions
        plan.extend((seen, REASON_COUNT_CAP) for seen in rest[:excess])
        rest = rest[excess:]
    if policy.max_age_days:  # 0: no age limit
        cutoff = int(time.time()) - policy.max_age_days * _DAY
        plan.extend(
            (seen, REASON_AGE_CAP)
            for seen in rest
            if seen.updated is not None and seen.updated < cutoff and not _live(seen, report)
        )
    return plan


def _display_id(seen: _Seen) -> str:
    """The session's id for reports: the manifest's, only when it names this very directory
    (a hostile manifest cannot make a report or gc-log line claim another session)."""
    claimed = seen.summary.session_id
    try:
        if session_dir_name(claimed) == seen.name:
            return claimed
    except (InvalidSessionId, TypeError):
        pass
    return seen.name


def _removal_record(seen: _Seen, reason: str, size: int) -> RemovedSession:
    return RemovedSession(_display_id(seen), seen.name, reason, size, seen.summary.updated_at)


def _remove(
    root: Path, seen: _Seen, reason: str, report: RetentionReport, gc_log: GcLog, tombstones: Optional[Tombstones]
) -> bool:
    if _stamp(seen.path) != seen.stamp:
        report.skip(seen.name, "changed while retention ran; left for the next run")
        return False
    size = _tree_bytes(seen.path)
    record = _removal_record(seen, reason, size)
    imported = _imported_source(seen) if tombstones is not None else None
    fingerprint = _import_fingerprint(seen.path) if imported is not None else None
    removal_id = new_removal_id()

    def log_removal() -> None:
        # Recorded once the session is in the trash and before it is deleted: a crash between
        # the two leaves a record and a trash entry, never a removal nobody recorded. An
        # imported session is tombstoned first, so no import brings it back (if recording
        # fails, the session is put back).
        if imported is not None and tombstones is not None:
            path = imported.get("path")
            tombstones.record(
                record.session_id,
                TombstoneReason.RETENTION,
                source_path=path if isinstance(path, str) else None,
                source_fingerprint=fingerprint,
            )
        gc_log.record(
            session_id=record.session_id,
            directory=f"{SESSIONS_DIR}/{seen.name}",
            reason=reason,
            size=size,
            updated_at=record.updated_at,
            removal_id=removal_id,
        )

    try:
        # The stamp again under the session's lock, where no writer can change it any more.
        removed = remove_session_directory(
            root, Path(seen.path), lambda: _stamp(seen.path) == seen.stamp, on_moved=log_removal, removal_id=removal_id
        )
    except StoreIOError as exc:
        logger.warning("retention could not remove %s: %s", seen.path, exc)
        report.skip(seen.name, f"could not be removed ({exc})")
        return False
    if not removed:
        gone = not os.path.lexists(seen.path)
        report.skip(
            seen.name, "already removed by another process" if gone else "live: opened by a writer while retention ran"
        )
        return False
    report.removed.append(record)
    mark_changed(root, seen.name)
    logger.info("retention removed %s (%s, %d bytes)", seen.path, reason, size)
    return True


def _import_fingerprint(path: str) -> Optional[dict]:
    """What the import cache says of the source as last imported (size, consumed offset and
    the sha256 of its head and tail), for the tombstone; ``None`` when it cannot be read."""
    try:
        raw = read_no_follow(os.path.join(path, DERIVED_DIR, IMPORT_STATE_FILE))
        state = orjson.loads(raw) if raw is not None else None
    except MemstoreError as exc:  # a symlink or FIFO there: never followed, never waited on
        logger.warning("%s; the tombstone goes without the source's fingerprint", exc)
        return None
    except orjson.JSONDecodeError:
        return None
    if not isinstance(state, dict):
        return None
    source = state["source"] if isinstance(state.get("source"), dict) else {}
    found = {
        "size": source.get("size"),
        "offset": state.get("offset"),
        "head_sha256": state.get("head_sha256"),
        "tail_sha256": state.get("tail_sha256"),
    }
    return {k: v for k, v in found.items() if isinstance(v, (int, str)) and not isinstance(v, bool)} or None


def _empty_trash(root: Path) -> None:
    """Delete what a removal interrupted by a crash left in ``<root>/.trash`` (only a real
    directory: a ``.trash`` symlink would point the deletion outside the store)."""
    trash = root / TRASH_DIR
    try:
        st = os.lstat(trash)
    except FileNotFoundError:
        return
    except OSError as exc:
        logger.warning("cannot examine %s: %s", trash, exc)
        return
    if not stat.S_ISDIR(st.st_mode):
        logger.warning("%s is a symlink or not a directory; not emptying it", trash)
        return
    empty_trash(root, _recorded_removals(root))


def _recorded_removals(root: Path) -> Callable[[str], bool]:
    """Whether ``gc-log.jsonl`` records the removal of that ``removal_id`` (read once, when first
    asked). A gc-log that cannot be read records nothing: an interrupted removal is then put
    back, which loses nothing."""
    found: Optional[set[str]] = None

    def recorded(removal_id: str) -> bool:
        nonlocal found
        if found is None:
            found = set()
            path = root / GC_LOG_FILE
            try:
                data = read_no_follow(path) or b""
            except StoreIOError as exc:
                logger.warning("cannot read %s (%s): interrupted removals are put back", path, exc)
                data = b""
            for line in data.splitlines():
                try:
                    entry = orjson.loads(line)
                except orjson.JSONDecodeError:
                    continue
                if isinstance(entry, dict) and isinstance(entry.get("removal_id"), str):
                    found.add(entry["removal_id"])
        return removal_id in found

    return recorded


def _tree_bytes(path: os.PathLike | str) -> int:
    """The bytes of the regular files under ``path`` (symlinks are neither followed nor counted)."""
    total = 0
    stack = [os.fspath(path)]
    while stack:
        try:
            iterator = os.scandir(stack.pop())
        except OSError:
            continue
        with iterator:
            for entry in iterator:
                try:
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(entry.path)
                    elif entry.is_file(follow_symlinks=False):
                        total += entry.stat(follow_symlinks=False).st_size
                except OSError:
                    continue
    return total


def _real_session_dir(session_dir: os.PathLike | str, op: str) -> Path:
    directory = Path(session_dir)
    try:
        st = os.lstat(directory)
    except FileNotFoundError:
        raise SessionNotFound(directory.name, directory) from None
    except OSError as exc:
        raise StoreIOError.from_os_error("stat", directory, exc) from exc
    if stat.S_ISLNK(st.st_mode):
        raise UnsafePathError(op, directory, "is a symlink; refusing to follow it")
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafePathError(op, directory, "is not a session directory")
    return directory


__all__ = [
    "RetentionPolicy",
    "RetentionReport",
    "RemovedSession",
    "SkippedSession",
    "apply_retention",
    "apply_retention_preserving",
    "mark_abandoned_active_sessions",
    "evict_zero_turn_completed_store",
    "pin_session_retention",
    "unpin_session_retention",
    "session_retention_pinned",
    "retention_pinned_session_ids",
    "GcLog",
]
