"""Store-wide maintenance: rebuilding sessions' views from their logs (one, many, or all, in
worker processes), and ``doctor``.

Rebuild regenerates, from each session's ``events.jsonl``, its index, search chunks and manifest
(:func:`memstore.session.log.rebuild_index`), then every registered file view
(:mod:`memstore.views.registry`), then the session's rows in the catalog. A ``manifest.json``
that cannot be used (a symlink, a FIFO, a directory) is set aside beside it first
(``manifest.json.unusable-<time>``) and written anew: the manifest is a view of the log. A
legacy session (VT Code's migration: a manifest and imported data, no log; see
:mod:`memstore.layout`) has nothing a log could regenerate: its manifest is kept when it is
usable, and written anew otherwise; its data is left as it is.

Rebuilding every session (:func:`rebuild_all`) goes on past a session another process holds
open (``busy``), one removed since it was listed (``gone``), and one that fails (``failed``,
with its error), and reports each in a :class:`RebuildReport`.

``doctor``: is every session of a store healthy, and is the catalog current?

For each session directory: its log and index agree (the index covers the whole log, the
manifest says what the log holds), the log has no torn tail, its files and directories are
private (0600 / 0700); and the catalog lists exactly the sessions there are, each as it is now.
A legacy session is healthy when its manifest is usable. Checking reads only (through the
reader: no lock, no write). With ``fix=True`` what is wrong is repaired: permissions are
tightened (a bit is cleared, never added), sessions are rebuilt from their logs (a torn tail is
cut and kept beside the log, as on any open), and the catalog is refreshed. A session another
process has open is reported and left to its writer. One session that cannot be examined (a
directory this process may not enter) is one problem; the others are checked all the same.
"""

from __future__ import annotations

import errno
import logging
import mmap
import multiprocessing
import os
import sqlite3
import stat
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from enum import Enum
from pathlib import Path
from typing import Optional, Union

import orjson

from . import events as ev
from .catalog import layout_problem, refresh_catalog, set_aside_catalog
from .errors import MemstoreError, SessionBusyError, SessionNotFound, StoreIOError, UnsafePathError
from .fsio import atomic_write, file_kind, open_read_no_follow, read_no_follow
from .layout import (
    DERIVED_DIR,
    EVENTS_FILE,
    IMPORT_STATE_FILE,
    INDEX_DIR,
    INDEX_FILE,
    LEGACY_DATA_FILES,
    LOG_NOT_REGULAR,
    MANIFEST_FILE,
    MEMORY_FILE,
    NOT_UTF8_NAME,
    PROGRESS_FILE,
    SYMLINK_ENTRY,
    UNEXAMINABLE,
    catalog_path,
    is_legacy_session,
    iter_session_dirs,
    session_dir_name,
    session_directory,
    sessions_root,
)
from .locks import store_lock
from .reader import read_session_dir, session_id_of
from .session import registry
from .session.index import derived_tables, readonly_uri
from .session.lock import LivenessLock, SessionGone, is_live
from .session.log import SessionLog, rebuild_index
from .session.manifest import (
    STATUS_COMPLETED,
    Manifest,
    load_manifest,
    manifest_problem,
    set_aside_manifest,
    summary_cache,
)
from .views.registry import file_views

logger = logging.getLogger(__name__)

_PRIVATE_FILES = (
    EVENTS_FILE,
    MANIFEST_FILE,
    f"{INDEX_DIR}/{INDEX_FILE}",
    f"{DERIVED_DIR}/{PROGRESS_FILE}",
    f"{DERIVED_DIR}/{MEMORY_FILE}",
)
_PRIVATE_DIRS = ("", INDEX_DIR, DERIVED_DIR)


# --------------------------------------------------------------------------------------------
# Rebuild


class SkipReason(Enum):
    """Why a rebuild of every session left a session as it was (none of them is an error of
    the session's own: its log, if it has one, is as it was)."""

    BUSY = "busy"  # open in another process: its writer keeps its views current
    GONE = "gone"  # removed since the sessions were listed
    UNENTERABLE = "unenterable"  # a directory this process may not enter or list
    SYMLINK = "symlink"  # a symlink in sessions/: never followed
    BAD_NAME = "bad_name"  # a name that is not UTF-8: no session id names it


@dataclass(frozen=True)
class SessionIssue:
    """A session a rebuild of every session did not rebuild: its id (or directory name), what
    happened, and (for one skipped) why, as a :class:`SkipReason`."""

    session: str
    detail: str
    reason: Optional[SkipReason] = None

    def to_dict(self) -> dict:
        return {
            "session": self.session,
            "detail": self.detail,
            "reason": self.reason.value if self.reason is not None else None,
        }


@dataclass
class RebuildReport:
    """What a rebuild of every session did, one entry per session: the manifests of those
    ``rebuilt`` (in directory-name order), those ``skipped`` (each with its
    :class:`SkipReason` and a detail naming the path) and those that ``failed`` (each with its
    error: a damaged log, a log that is a FIFO, an I/O error). ``catalog_error`` says why the
    catalog could not be refreshed after (``None``: it was, or was not asked to be). ``ok`` when
    nothing failed. As a sequence, a report is the manifests rebuilt."""

    root: str
    rebuilt: list[Manifest] = field(default_factory=list)
    skipped: list[SessionIssue] = field(default_factory=list)
    failed: list[SessionIssue] = field(default_factory=list)
    catalog_error: Optional[str] = None

    @property
    def ok(self) -> bool:
        return not self.failed and self.catalog_error is None

    def __iter__(self) -> Iterator[Manifest]:
        return iter(self.rebuilt)

    def __len__(self) -> int:
        return len(self.rebuilt)

    def __getitem__(self, index: int) -> Manifest:
        return self.rebuilt[index]

    def add(self, session_id: str, outcome: Union[Manifest, MemstoreError]) -> Optional[SessionIssue]:
        """File one session's outcome (as :func:`rebuild_each` yields it) where it belongs;
        return its entry when it was not rebuilt."""
        if isinstance(outcome, Manifest):
            self.rebuilt.append(outcome)
            return None
        reason = _skip_reason(outcome)
        issue = SessionIssue(session_id, str(outcome), reason)
        (self.failed if reason is None else self.skipped).append(issue)
        return issue

    def to_dict(self) -> dict:
        return {
            "root": self.root,
            "ok": self.ok,
            "rebuilt": [
                {
                    "session_id": m.session_id,
                    "event_count": m.event_count,
                    "turn_count": m.turn_count,
                    "status": m.status,
                }
                for m in self.rebuilt
            ],
            "skipped": [i.to_dict() for i in self.skipped],
            "failed": [i.to_dict() for i in self.failed],
            "catalog_error": self.catalog_error,
        }


def _skip_reason(error: MemstoreError) -> Optional[SkipReason]:
    """Why ``error`` (one session's rebuild) means the session was left as it was, or ``None``
    when it is a failure."""
    if isinstance(error, SessionBusyError):
        return SkipReason.BUSY
    if isinstance(error, SessionNotFound) or (isinstance(error, StoreIOError) and error.errno == errno.ENOENT):
        return SkipReason.GONE
    if isinstance(error, StoreIOError) and error.op == "rebuild" and error.errno in (errno.EACCES, errno.EPERM):
        return SkipReason.UNENTERABLE
    return None


def rebuild(root: os.PathLike | str, session_id: Optional[str] = None, *, refresh: bool = True, jobs: int = 1):
    """Regenerate every view of the session ``session_id`` from its ``events.jsonl`` (its index,
    search chunks, manifest and file views, and its rows in the catalog); return its
    :class:`Manifest`. With no ``session_id``, do that for every session and return a
    :class:`RebuildReport` (see :func:`rebuild_all`).

    See :func:`memstore.session.log.rebuild_index` for what a rebuild keeps from the old
    metadata. Works on a session this process has open (under its lock); refuses with
    :class:`SessionBusyError` one that another process has open. A session that is not there
    is a :class:`StoreIOError` saying ``no such session``; a symlinked session directory, or an
    ``events.jsonl`` that is a symlink or not a regular file, an :class:`UnsafePathError`
    saying which. ``refresh=False`` leaves the catalog alone. ``jobs`` > 1 rebuilds every
    session in that many worker processes (see :func:`rebuild_each`).
    """
    if session_id is None:
        return rebuild_all(root, refresh=refresh, jobs=jobs)
    manifest = _rebuild_session(root, session_id)
    if refresh:
        refresh_catalog(root)
    return manifest


def rebuild_all(root: os.PathLike | str, *, refresh: bool = True, jobs: int = 1) -> RebuildReport:
    """Rebuild every session under ``root`` (those with a log, and legacy sessions), as
    :func:`rebuild` does one, and report each (see :class:`RebuildReport`): one session that
    cannot be rebuilt never stops the others. Each session skipped or failed is logged (a
    warning; one removed meanwhile, info). The catalog is refreshed after (unless
    ``refresh=False``); a refresh that fails is said in ``report.catalog_error``. Raises only
    when ``<root>/sessions`` cannot be listed."""
    report = RebuildReport(str(root))
    ids = _listed_ids(root, report)  # what it leaves out is logged as it is listed
    for sid, outcome in rebuild_each(root, ids, jobs=jobs):
        issue = report.add(sid, outcome)
        if issue is None:
            continue
        if issue.reason is SkipReason.GONE:
            logger.info("rebuild: %s was removed while the store was rebuilt", sid)
        elif issue.reason is not None:
            logger.warning("rebuild: %s skipped (%s): %s", sid, issue.reason.value, issue.detail)
        else:
            logger.warning("rebuild: %s could not be rebuilt: %s", sid, issue.detail)
    if refresh:
        try:
            refresh_catalog(root)
        except (MemstoreError, OSError, sqlite3.Error) as exc:
            # The sessions' own views are rebuilt whatever the catalog does: say so, and why.
            report.catalog_error = f"{type(exc).__name__}: {exc}"
            logger.warning("rebuild: the catalog could not be refreshed: %s", report.catalog_error)
    return report


def _listed_ids(root: os.PathLike | str, report: RebuildReport) -> list[str]:
    """The ids of the sessions to rebuild; entries of ``sessions/`` that may be sessions but
    cannot be rebuilt go to the report: a log that is not a regular file fails; a symlinked
    directory, one this process may not enter, and a name that is not UTF-8 are skipped."""
    base = sessions_root(root)

    def left_out(name: str, why: str) -> None:
        where = f"{base / name}: {why}"
        if why.startswith(UNEXAMINABLE):
            report.skipped.append(SessionIssue(name, where, SkipReason.UNENTERABLE))
        elif why == SYMLINK_ENTRY:
            report.skipped.append(SessionIssue(name, where, SkipReason.SYMLINK))
        elif why == NOT_UTF8_NAME:
            report.skipped.append(SessionIssue(name, where, SkipReason.BAD_NAME))
        elif why == LOG_NOT_REGULAR:
            report.failed.append(SessionIssue(name, f"{base / name / EVENTS_FILE} is not a regular file"))

    return session_ids(root, include_legacy=True, on_skip=left_out)


def rebuild_file_views(log: SessionLog) -> None:
    """Regenerate the registered file views of the open session ``log``, each only where the
    session has one (its file exists, or the log mentions one of its event types: a byte search,
    no JSON decoding): a rebuild brings views back; it does not invent them."""
    views = file_views()
    needles = [f'"{kind}"' for view in views for kind in view.event_types]
    mentioned = dict(zip(needles, _log_mentions(log.events_path, tuple(needles))))
    for view in views:
        if (
            any(mentioned[f'"{kind}"'] for kind in view.event_types)
            or (log.directory / DERIVED_DIR / view.filename).exists()
        ):
            view.rebuild(log)


def _log_mentions(path: Path, needles: tuple[str, ...]) -> list[bool]:
    """Whether each string occurs in the file (a byte search, no JSON decoding)."""
    fd = open_read_no_follow(path)
    if fd is None:
        return [False] * len(needles)
    try:
        if os.fstat(fd).st_size == 0:
            return [False] * len(needles)
        with mmap.mmap(fd, 0, access=mmap.ACCESS_READ) as data:
            return [data.find(n.encode()) >= 0 for n in needles]
    except OSError as exc:
        raise StoreIOError.from_os_error("read", path, exc) from exc
    finally:
        os.close(fd)


def session_ids(
    root: os.PathLike | str, *, include_legacy: bool = False, on_skip: Optional[Callable[[str, str], None]] = None
) -> list[str]:
    """The ids of the sessions under ``root`` that hold a log (and, with ``include_legacy``,
    the legacy sessions: see :mod:`memstore.layout`), in directory-name order. Entries that
    may be sessions but cannot be read (a symlink, never followed; a log that is not a regular
    file; a name that is not UTF-8; a directory this process may not enter) are left out, each
    logged as a warning naming it and said to ``on_skip(name, reason)`` when given."""

    def skipped(name: str, reason: str) -> None:
        if reason in (SYMLINK_ENTRY, NOT_UTF8_NAME, LOG_NOT_REGULAR) or reason.startswith(UNEXAMINABLE):
            path = os.path.join(sessions_root(root), name)
            logger.warning("%s is left out: %s", repr(path) if reason == NOT_UTF8_NAME else path, reason)
        if on_skip is not None:
            on_skip(name, reason)

    entries = iter_session_dirs(root, require_log=True, include_legacy=include_legacy, sort=True, on_skip=skipped)
    return [session_id_of(Path(e.path)) for e in entries]


# Sessions per task of a worker process: enough to make the round trip negligible, few enough
# that the workers finish together.
_REBUILD_CHUNK = 16
# The derived tables a fresh process registers (importing memstore): worker processes have
# these and no others.
_OWN_DERIVED_TABLES = {"event_details", "chunks", "file_changes"}


def rebuild_each(
    root: os.PathLike | str,
    ids: Iterable[str],
    *,
    jobs: int = 1,
) -> Iterator[tuple[str, Union[Manifest, MemstoreError]]]:
    """Rebuild the views of each session of ``ids`` (each distinct id once) as :func:`rebuild`
    does, not the catalog, yielding ``(session_id, manifest)`` in order as each is done, or
    ``(session_id, error)`` for one that failed with a :class:`MemstoreError` (the others are
    rebuilt all the same).

    With ``jobs`` > 1 the sessions are rebuilt in that many worker processes, started fresh
    (``spawn``) so that nothing of this process, its threads or its open sessions, is
    inherited; as with any use of ``spawn``, a script that asks for them must guard its top
    level with ``if __name__ == "__main__":``. Here instead are rebuilt: a session this
    process has open (under its lock), every session when derived tables other than
    memstore's own are registered (a fresh process would not have them), fewer sessions than
    would keep the workers busy (starting one costs a few hundred ms), and whatever a worker
    that died (killed, out of memory) left undone.
    """
    ids = list(dict.fromkeys(ids))
    if type(jobs) is not int or jobs < 1:
        raise ValueError(f"jobs must be a positive int, not {jobs!r}")
    if jobs > 1 and {t.name for t in derived_tables()} != _OWN_DERIVED_TABLES:
        logger.info("rebuilding in this process: worker processes would not have the derived tables registered here")
        jobs = 1
    if jobs == 1 or len(ids) < 2 * _REBUILD_CHUNK:
        for sid in ids:
            yield sid, _rebuild_outcome(root, sid)
        return
    root = Path(root).absolute()
    here = _open_here(root, ids)
    away = [sid for sid in ids if sid not in here]
    chunks = [away[i : i + _REBUILD_CHUNK] for i in range(0, len(away), _REBUILD_CHUNK)]
    with ProcessPoolExecutor(
        max_workers=min(jobs, len(chunks)), mp_context=multiprocessing.get_context("spawn")
    ) as pool:
        futures = {chunk[0]: pool.submit(_rebuild_chunk, str(root), chunk) for chunk in chunks}
        broken = False
        try:
            done: dict[str, Union[Manifest, MemstoreError]] = {}
            for sid in ids:
                if sid in futures and not broken:
                    try:
                        done.update(futures.pop(sid).result())
                    except BrokenProcessPool as exc:
                        logger.warning("a rebuild worker process died (%s): rebuilding the rest here", exc)
                        broken = True
                if sid in here or sid not in done:
                    yield sid, _rebuild_outcome(root, sid)
                else:
                    yield sid, done.pop(sid)
        finally:
            for future in futures.values():
                future.cancel()


def _open_here(root: Path, ids: list[str]) -> set[str]:
    """The ids of ``ids`` that name a session this process has open, and those that name none
    (they fail here, with their error)."""
    open_keys = registry.open_keys()
    here = set()
    for sid in ids:
        try:
            if os.path.realpath(session_directory(root, sid)) in open_keys:
                here.add(sid)
        except MemstoreError:
            here.add(sid)
    return here


def _rebuild_chunk(root: str, ids: list[str]) -> list[tuple[str, Union[Manifest, MemstoreError]]]:
    """A worker process's task: rebuild these sessions."""
    return [(sid, _rebuild_outcome(root, sid)) for sid in ids]


def _rebuild_outcome(root: os.PathLike | str, session_id: str) -> Union[Manifest, MemstoreError]:
    """One session's rebuild, its error in place of its manifest: nothing one session does
    stops the others (an OS or SQLite error memstore did not wrap is wrapped, naming the
    session directory)."""
    try:
        return _rebuild_session(root, session_id)
    except MemstoreError as exc:
        return exc
    except (OSError, sqlite3.Error) as exc:
        try:
            where: os.PathLike | str = session_directory(root, session_id)
        except MemstoreError:
            where = root
        return StoreIOError("rebuild", where, f"{type(exc).__name__}: {exc}", getattr(exc, "errno", None))


def _rebuild_session(root: os.PathLike | str, session_id: str) -> Manifest:
    directory = session_directory(root, session_id)
    if _rebuildable(directory):
        _set_aside_unusable_manifest(directory)
        log = rebuild_index(root, session_id)
        try:
            rebuild_file_views(log)
            return log.manifest
        finally:
            log.close()
    return _rebuild_legacy(directory, session_id)


def _rebuildable(directory: Path) -> bool:
    """Whether ``directory`` is a session with a log (``True``) or a legacy session
    (``False``); otherwise raise what is wrong, naming where: ``no such session`` (a
    :class:`StoreIOError` with ``errno`` ``ENOENT``), a symlink or a non-directory in the
    session's place or a log that is a symlink or not a regular file (:class:`UnsafePathError`),
    a directory that cannot be examined (:class:`StoreIOError`)."""
    try:
        st = os.lstat(directory)
    except FileNotFoundError:
        raise StoreIOError("rebuild", directory, "no such session (no such directory)", errno.ENOENT) from None
    except OSError as exc:
        raise StoreIOError("rebuild", directory, f"cannot be examined ({exc.strerror or exc})", exc.errno) from exc
    if stat.S_ISLNK(st.st_mode):
        raise UnsafePathError("rebuild", directory, "is a symlink, not a session directory; refusing to follow it")
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafePathError("rebuild", directory, f"is {file_kind(st.st_mode)}, not a session directory")
    log = directory / EVENTS_FILE
    try:
        st = os.lstat(log)
    except FileNotFoundError:
        if is_legacy_session(directory):
            return False
        raise StoreIOError("rebuild", directory, f"no such session (no {EVENTS_FILE})", errno.ENOENT) from None
    except OSError as exc:
        raise StoreIOError("rebuild", directory, f"cannot be examined ({exc.strerror or exc})", exc.errno) from exc
    if stat.S_ISLNK(st.st_mode):
        raise UnsafePathError("rebuild", log, "is a symlink; refusing to follow it (the session's log must be a file)")
    if not stat.S_ISREG(st.st_mode):
        raise UnsafePathError("rebuild", log, f"is {file_kind(st.st_mode)}, not a regular file")
    return True


def _set_aside_unusable_manifest(directory: Path) -> Optional[Path]:
    """Move a ``manifest.json`` that cannot be read as a file (a symlink, a FIFO, a directory)
    out of the way, beside it, so that the rebuild writes the manifest anew; return where it
    went (see :func:`memstore.session.manifest.set_aside_manifest`). A session another process
    has open is left to the rebuild, which refuses it."""
    path = directory / MANIFEST_FILE
    problem = manifest_problem(path)
    if problem is None or problem.startswith("cannot be examined") or is_live(directory):
        return None
    return set_aside_manifest(path, problem)


def _rebuild_legacy(directory: Path, session_id: str) -> Manifest:
    """A legacy session's rebuild: its manifest when usable and its own (left as it is), else a
    new one made as VT Code's migration makes it (completed, no turn, no event, its times those
    of its data), the old entry set aside. Its data is left as it is: no log holds it."""
    manifest = load_manifest(directory)
    if manifest is not None and _names(manifest.session_id, directory):
        return manifest
    lock = LivenessLock(directory)
    try:
        if not lock.acquire():
            raise SessionBusyError(f"session {session_id!r} is open in another process ({lock.path} is locked)")
    except SessionGone:
        raise StoreIOError(
            "rebuild", directory, "no such session (removed while it was rebuilt)", errno.ENOENT
        ) from None
    try:
        path = directory / MANIFEST_FILE
        problem = manifest_problem(path)
        if problem is not None:
            set_aside_manifest(path, problem)
        elif os.path.lexists(path):  # malformed, or another session's: VT Code's data, kept
            set_aside_manifest(path, "is not a manifest of this session")
        stamp = _legacy_data_time(directory)
        manifest = Manifest(session_id=session_id, created_at=stamp, updated_at=stamp, status=STATUS_COMPLETED)
        atomic_write(path, manifest.to_json())
        summary_cache.invalidate(path)
        logger.info("rebuild: wrote the manifest of the legacy session %s anew", directory)
        return manifest
    finally:
        lock.release()


def _names(session_id: str, directory: Path) -> bool:
    try:
        return session_dir_name(session_id) == directory.name
    except (MemstoreError, TypeError):
        return False


def _legacy_data_time(directory: Path) -> str:
    """When a legacy session's data was last written (its newest data file's mtime), as memstore
    writes times: what VT Code's migration takes for a migrated session's times."""
    newest = 0.0
    for name in LEGACY_DATA_FILES:
        try:
            newest = max(newest, os.lstat(directory / DERIVED_DIR / name).st_mtime)
        except OSError:
            continue
    return ev.format_ts(datetime.fromtimestamp(newest, UTC))


# --------------------------------------------------------------------------------------------
# Doctor


@dataclass
class Problem:
    """One thing wrong: where (``session``, ``directory``), which ``check`` failed (``log``,
    ``index``, ``manifest``, ``torn_tail``, ``permissions``, ``catalog``), what it is, and
    whether ``--fix`` can repair it (``fixable``) and did (``fixed``)."""

    directory: str
    session: Optional[str]
    check: str
    detail: str
    fixable: bool = True
    fixed: bool = False


@dataclass
class DoctorReport:
    """Sessions looked at and the problems found (``ok``: none left unfixed).

    ``imports`` describes the imported sessions per agent and agent version (sessions, turns,
    tokens, records understood and kept without being understood, sessions with no turn or no
    token; see :mod:`memstore.importers.drift`) and ``warnings`` says what looks like format
    drift (lines starting with ``warning: format drift:``, also logged). Neither is a problem:
    ``ok`` does not depend on them, and a session whose source is gone is never flagged.
    ``legacy`` names the legacy sessions found healthy, or made so by ``fix`` (VT Code's
    migration made them: a manifest and imported data, no log)."""

    root: str
    sessions: int = 0
    problems: list[Problem] = field(default_factory=list)
    live: list[str] = field(default_factory=list)
    imports: list = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    legacy: list[str] = field(default_factory=list)  # the healthy legacy sessions (VT Code's migration)

    @property
    def ok(self) -> bool:
        return all(p.fixed for p in self.problems)

    def to_dict(self) -> dict:
        return {
            "root": self.root,
            "sessions": self.sessions,
            "ok": self.ok,
            "live": self.live,
            "problems": [asdict(p) for p in self.problems],
            "imports": [i.to_dict() for i in self.imports],
            "warnings": list(self.warnings),
            "legacy": list(self.legacy),
        }


def check_store(
    root: os.PathLike | str, *, fix: bool = False, progress: Optional[Callable[[int, int], None]] = None
) -> DoctorReport:
    """Check every session under ``root`` and the catalog; with ``fix``, repair what is wrong.
    A session that cannot be checked is one problem, and the others are checked all the same;
    ``sessions/`` that is a symlink (never followed) or not a directory is a problem too."""
    root = Path(root)
    if not root.is_dir():
        raise StoreIOError("check store", root, "no such store directory")
    report = DoctorReport(str(root))
    entries: list[tuple[str, Optional[str]]] = []  # (name, why it is not a session directory)
    base = sessions_root(root)
    try:
        st: Optional[os.stat_result] = os.lstat(base)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise StoreIOError.from_os_error("stat", base, exc) from exc
    if st is not None and not stat.S_ISDIR(st.st_mode):
        what = "a symlink (never followed)" if stat.S_ISLNK(st.st_mode) else f"{file_kind(st.st_mode)}, not a directory"
        report.problems.append(
            Problem(str(base), None, "store", f"{base} is {what}: no session can be checked", fixable=False)
        )
    elif st is not None:
        for entry in iter_session_dirs(root, sort=True, on_skip=lambda name, why: entries.append((name, why))):
            entries.append((entry.name, None))
    entries = [(name, why) for name, why in entries if not name.startswith(".")]
    seen: dict[str, tuple[str, object]] = {}  # directory name -> (session id, manifest as read)
    imported: list = []  # the imported sessions' stats
    for done, (name, why) in enumerate(entries, start=1):
        if progress is not None:
            progress(done, len(entries))
        directory = base / name
        if why is not None:
            report.problems.append(
                Problem(str(directory), None, "log", f"not a session directory: {why}", fixable=False)
            )
            continue
        try:
            _check_session(root, directory, report, seen, fix, imported)
        except (MemstoreError, OSError, sqlite3.Error) as exc:
            logger.warning("doctor: %s could not be checked: %s", directory, exc)
            known = seen.get(name)
            report.problems.append(
                Problem(str(directory), known[0] if known else None, "log", f"cannot be checked: {exc}", fixable=False)
            )
    _check_catalog(root, report, seen, fix)
    _report_imports(report, imported)
    return report


def _report_imports(report: DoctorReport, imported: list) -> None:
    """Per agent version stats of the imported sessions, and the drift warnings they call for."""
    from .importers.drift import aggregate, warnings_for

    report.imports = aggregate(imported)
    report.warnings = warnings_for(report.imports, {}, new_versions=False)
    for warning in report.warnings:
        logger.warning("doctor: %s", warning)


def _import_stats(directory: Path, session_id: str, manifest: Manifest, turns: list):
    """The import stats of an imported session (``None`` for a session an agent wrote): agent
    and version from its manifest's source, turns and tokens from its index, records read and
    kept without being understood from its import cache (unknown without one). Its source is
    not looked at: a session whose source is gone is like any other."""
    from .importers.drift import SourceStats

    source = manifest.source
    if not isinstance(source, dict) or not isinstance(source.get("path"), str):
        return None
    agent = "codex-exec" if source.get("originator") == "codex_exec" else str(source.get("agent") or "unknown")
    version = source.get("agent_version") if isinstance(source.get("agent_version"), str) else None
    carry: dict = {}
    path = directory / DERIVED_DIR / IMPORT_STATE_FILE
    try:
        raw = read_no_follow(path)
        state = orjson.loads(raw) if raw is not None else None
        if isinstance(state, dict) and isinstance(state.get("carry"), dict):
            carry = state["carry"]
    except MemstoreError as exc:
        logger.warning("doctor: %s cannot be used (%s); its import stats are left unknown", path, exc)
    except orjson.JSONDecodeError:
        logger.info("doctor: %s is not JSON; its import stats are left unknown", path)
    raw_stats = carry.get("stats")
    stats: dict = raw_stats if isinstance(raw_stats, dict) else {}
    records = stats.get("records")
    unrecognized = stats.get("unrecognized")
    expects_usage = not (agent == "codex" and (carry.get("legacy") is True or version is None))
    tokens = [
        sum(getattr(t, name) for t in turns)
        for name in ("input_tokens", "cached_input_tokens", "cache_creation_tokens", "output_tokens")
    ]
    return SourceStats(
        session_id,
        agent,
        version,
        len(turns),
        tokens[0],
        tokens[1],
        tokens[2],
        tokens[3],
        records if type(records) is int else None,
        dict(unrecognized) if isinstance(unrecognized, dict) else {},
        expects_usage,
    )


def _check_session(
    root: Path, directory: Path, report: DoctorReport, seen: dict, fix: bool, imported: Optional[list] = None
) -> None:
    name = directory.name

    def problem(check: str, detail: str, session: Optional[str] = None, fixable: bool = True) -> Problem:
        found = Problem(str(directory), session, check, detail, fixable)
        report.problems.append(found)
        return found

    try:
        st = os.lstat(directory / EVENTS_FILE)
    except FileNotFoundError:
        if is_legacy_session(directory):
            _check_legacy(root, directory, report, seen, fix, problem)
        else:
            problem("log", f"no {EVENTS_FILE} (and no legacy data): not a session", fixable=False)
        return
    except OSError as exc:
        report.sessions += 1
        logger.warning("doctor: %s cannot be examined (%s); it is left unchecked", directory, exc.strerror or exc)
        problem("log", f"the session directory cannot be examined ({exc.strerror or exc})", fixable=False)
        return
    report.sessions += 1
    if not stat.S_ISREG(st.st_mode):
        what = (
            "a symlink (never followed)" if stat.S_ISLNK(st.st_mode) else f"{file_kind(st.st_mode)}, not a regular file"
        )
        problem("log", f"{EVENTS_FILE} is {what}: the session cannot be read", fixable=False)
        return
    live = is_live(directory)
    try:
        with read_session_dir(directory) as reader:
            session_id = reader.session_id
            manifest = reader.manifest
            torn = reader.log.length - reader.end
            index_ok = reader.index is not None
            behind = len(reader.tail_rows)
            stats = _import_stats(directory, session_id, manifest, reader.turns()) if imported is not None else None
    except MemstoreError as exc:
        problem("log", f"cannot be read: {exc}", fixable=False)
        return
    if stats is not None and imported is not None:
        imported.append(stats)
    _check_permissions(directory, session_id, fix, problem)
    seen[name] = (session_id, manifest)
    if live:
        report.live.append(session_id)
    found: list[Problem] = []
    if torn > 0:
        found.append(problem("torn_tail", f"{torn} bytes after the last complete line of events.jsonl", session_id))
    if not index_ok:
        found.append(
            problem(
                "index", f"{INDEX_DIR}/{INDEX_FILE} is missing or unusable (reads fall back to the log)", session_id
            )
        )
    elif behind and not live:
        found.append(problem("index", f"the index is behind the log by {behind} events", session_id))
    unusable = manifest_problem(directory / MANIFEST_FILE)
    on_disk = load_manifest(directory) if unusable is None else None
    if unusable is not None:
        found.append(problem("manifest", f"{MANIFEST_FILE} {unusable}", session_id))
    elif on_disk is None:
        found.append(problem("manifest", "manifest.json is missing or unreadable", session_id))
    elif not live and (on_disk.event_count, on_disk.turn_count) != (manifest.event_count, manifest.turn_count):
        found.append(
            problem(
                "manifest",
                f"manifest.json says {on_disk.event_count} events and {on_disk.turn_count} "
                f"turns; the log holds {manifest.event_count} and {manifest.turn_count}",
                session_id,
            )
        )
    if not found or not fix:
        return
    if live:
        for p in found:
            p.detail += " (the session is open in another process: its writer repairs it)"
        return
    _repair(root, directory, session_id, seen, found)


def _check_legacy(
    root: Path, directory: Path, report: DoctorReport, seen: dict, fix: bool, problem: Callable[..., Problem]
) -> None:
    """A legacy session is healthy when its manifest is usable and its own (and its files are
    private); a manifest that is not is rebuilt by ``--fix`` (see :func:`rebuild`)."""
    name = directory.name
    report.sessions += 1
    path = directory / MANIFEST_FILE
    unusable = manifest_problem(path)
    manifest = load_manifest(directory) if unusable is None else None
    session_id = manifest.session_id if manifest is not None and _names(manifest.session_id, directory) else name
    _check_permissions(directory, session_id, fix, problem)
    if manifest is not None and session_id == manifest.session_id:
        seen[name] = (session_id, manifest)
        report.legacy.append(session_id)
        return
    if unusable is not None:
        detail = f"legacy session (no log): {MANIFEST_FILE} {unusable}"
    elif manifest is None:
        detail = f"legacy session (no log): {MANIFEST_FILE} is not a session manifest"
    else:
        detail = f"legacy session (no log): {MANIFEST_FILE} names another session ({manifest.session_id!r})"
    found = [problem("manifest", detail, session_id)]
    if fix:
        _repair(root, directory, session_id, seen, found)
        if all(p.fixed for p in found):
            report.legacy.append(session_id)


def _repair(root: Path, directory: Path, session_id: str, seen: dict, found: list[Problem]) -> None:
    """Rebuild one session for ``doctor --fix``; mark ``found`` fixed when it worked."""
    try:
        if session_dir_name(session_id) != directory.name:
            raise StoreIOError("rebuild", directory, f"session id {session_id!r} does not name this directory")
        manifest = rebuild(root, session_id, refresh=False)
        seen[directory.name] = (session_id, manifest)
    except (MemstoreError, ValueError) as exc:
        logger.warning("doctor: could not rebuild %s: %s", directory, exc)
        for p in found:
            p.detail += f" (rebuild failed: {exc})"
        return
    for p in found:
        p.fixed = True


def _check_permissions(directory: Path, session_id: str, fix: bool, problem: Callable[..., Problem]) -> None:
    perms = [problem("permissions", detail, session_id) for detail in _permission_problems(directory)]
    if fix and perms:
        if not os.access(directory, os.W_OK):
            # A read-only copy of a store: its permissions are its owner's choice, left as they are.
            for p in perms:
                p.detail += " (not fixed: the session directory is read-only here)"
            return
        try:
            _fix_permissions(directory)
        except OSError as exc:
            logger.warning("doctor: could not make %s private: %s", directory, exc)
            for p in perms:
                p.detail += f" (not fixed: {exc.strerror or exc})"
            return
        for p in perms:
            p.fixed = True


def _permission_problems(directory: Path) -> list[str]:
    out = []
    for rel in _PRIVATE_DIRS:
        path = directory / rel if rel else directory
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            continue
        if stat.S_ISDIR(st.st_mode) and st.st_mode & 0o077:
            out.append(f"{rel or '.'}/ is mode {stat.S_IMODE(st.st_mode):04o}, not private (0700)")
    for rel in _PRIVATE_FILES:
        try:
            st = os.lstat(directory / rel)
        except FileNotFoundError:
            continue
        if stat.S_ISREG(st.st_mode) and st.st_mode & 0o077:
            out.append(f"{rel} is mode {stat.S_IMODE(st.st_mode):04o}, not private (0600)")
    return out


def _fix_permissions(directory: Path) -> None:
    """Clear the group and other bits of the session's directories and files: a bit is never
    added (a file the owner made read-only stays so), nothing is followed."""
    for rel in _PRIVATE_DIRS + _PRIVATE_FILES:
        path = directory / rel if rel else directory
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            continue
        if (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)) and st.st_mode & 0o077:
            os.chmod(path, stat.S_IMODE(st.st_mode) & 0o700)


def _set_aside(root: Path, path: Path) -> None:
    """Move a catalog SQLite cannot read out of the way (kept beside it, as torn tails are), so
    the refresh that follows builds a new one: the catalog is a view of the sessions."""
    with store_lock(root, "catalog"):
        aside = set_aside_catalog(path)
    logger.warning("doctor: %s could not be read; kept as %s, and a new catalog is built", path, aside)


def _check_catalog(root: Path, report: DoctorReport, seen: dict, fix: bool) -> None:
    path = catalog_path(root)
    found: list[Problem] = []

    def problem(detail: str, session: Optional[str] = None) -> None:
        p = Problem(str(path), session, "catalog", detail)
        report.problems.append(p)
        found.append(p)

    rows: dict[str, tuple] = {}
    unreadable = False
    try:
        mode: Optional[int] = os.lstat(path).st_mode
    except FileNotFoundError:
        mode = None
    except OSError as exc:
        problem(f"catalog.db cannot be examined ({exc.strerror or exc})")
        return
    if mode is not None and not stat.S_ISREG(mode):
        what = "a symlink (never followed)" if stat.S_ISLNK(mode) else f"{file_kind(mode)}, not a database file"
        problem(f"catalog.db is {what}")
        unreadable = True
    elif mode is None:
        if seen:
            problem("catalog.db does not exist")
    else:
        try:
            # Opened as it is: no side file created, no lock taken (a read-only store is checked too).
            uri = readonly_uri(path) or f"{path.absolute().as_uri()}?mode=ro"
            conn = sqlite3.connect(uri, uri=True)
            try:
                rows = {
                    r[0]: r[1:]
                    for r in conn.execute(
                        "SELECT directory, session_id, event_count, turn_count, generation FROM sessions"
                    )
                }
                layout = layout_problem(conn)
            finally:
                conn.close()
            if layout is not None:  # as good as unreadable: set aside and built again
                problem(f"catalog.db cannot be used: {layout}")
                unreadable = True
        except sqlite3.Error as exc:
            problem(f"catalog.db cannot be read: {exc}")
            # Only a file that is not (or no longer) a database is set aside by --fix, never one
            # that is merely busy.
            unreadable = getattr(exc, "sqlite_errorname", "") in ("SQLITE_NOTADB", "SQLITE_CORRUPT") or (
                "not a database" in str(exc) or "malformed" in str(exc)
            )
    if mode is not None and stat.S_ISREG(mode) and not found:
        for name, (session_id, manifest) in seen.items():
            row = rows.get(name)
            if row is None:
                if session_id in report.legacy:
                    continue  # no log to copy: a catalog may list a legacy session or not
                problem("the catalog does not list this session", session_id)
            elif row[1:] != (manifest.event_count, manifest.turn_count, manifest.generation):
                problem(
                    f"the catalog has {row[1]} events, {row[2]} turns (generation {row[3]}); the session has "
                    f"{manifest.event_count}, {manifest.turn_count} (generation {manifest.generation})",
                    session_id,
                )
        for name in sorted(set(rows) - set(seen)):
            problem(f"the catalog lists {rows[name][0]!r}, which is no longer in the store", rows[name][0])
    if fix and found:
        try:
            if unreadable:
                _set_aside(root, path)
            refreshed = refresh_catalog(root)
        except MemstoreError as exc:
            logger.warning("doctor: catalog refresh failed: %s", exc)
            return
        failed = {name for name, _reason in refreshed.errors}
        for p in found:
            p.fixed = not any(seen_name in failed for seen_name, (sid, _m) in seen.items() if sid == p.session)
