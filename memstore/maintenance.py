"""Store-wide maintenance: rebuilding sessions' views from their logs (one, many, or all, in
worker processes), and ``doctor``.

Rebuild regenerates, from each session's ``events.jsonl``, its index, search chunks and manifest
(:func:`memstore.session.log.rebuild_index`), then every registered file view
(:mod:`memstore.views.registry`), then the session's rows in the catalog.

``doctor``: is every session of a store healthy, and is the catalog current?

For each session directory: its log and index agree (the index covers the whole log, the
manifest says what the log holds), the log has no torn tail, its files and directories are
private (0600 / 0700); and the catalog lists exactly the sessions there are, each as it is now.
Checking reads only (through the reader: no lock, no write). With ``fix=True`` what is wrong
is repaired: permissions are set, sessions are rebuilt from their logs (a torn tail is cut and
kept beside the log, as on any open), and the catalog is refreshed. A session another process
has open is reported and left to its writer.
"""

from __future__ import annotations

import logging
import mmap
import multiprocessing
import os
import sqlite3
import stat
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator, Optional, Union

import orjson

from .catalog import refresh_catalog, set_aside_catalog
from .errors import MemstoreError, StoreIOError
from .fsio import open_read_no_follow, read_no_follow
from .layout import iter_session_dirs, session_directory
from .layout import (
    DERIVED_DIR,
    EVENTS_FILE,
    IMPORT_STATE_FILE,
    INDEX_DIR,
    INDEX_FILE,
    MANIFEST_FILE,
    MEMORY_FILE,
    PROGRESS_FILE,
    catalog_path,
    session_dir_name,
    sessions_root,
)
from .locks import store_lock
from .session import registry
from .session.index import derived_tables
from .session.lock import is_live
from .session.log import SessionLog, rebuild_index
from .session.manifest import Manifest, load_manifest
from .views.registry import file_views
from .reader import read_session_dir, session_id_of

logger = logging.getLogger(__name__)

_PRIVATE_FILES = (EVENTS_FILE, MANIFEST_FILE, f"{INDEX_DIR}/{INDEX_FILE}", f"{DERIVED_DIR}/{PROGRESS_FILE}",
                  f"{DERIVED_DIR}/{MEMORY_FILE}")
_PRIVATE_DIRS = ("", INDEX_DIR, DERIVED_DIR)


# --------------------------------------------------------------------------------------------
# Rebuild


def rebuild(root: os.PathLike | str, session_id: Optional[str] = None, *, refresh: bool = True, jobs: int = 1):
    """Regenerate every view of the session ``session_id`` from its ``events.jsonl`` (its index,
    search chunks, manifest and file views, and its rows in the catalog); return its
    :class:`Manifest`. With no ``session_id``, do that for every session and return their
    manifests.

    See :func:`memstore.session.log.rebuild_index` for what a rebuild keeps from the old
    metadata. Works on a session this process has open (under its lock); refuses with
    :class:`SessionBusyError` one that another process has open. ``refresh=False`` leaves the
    catalog alone. ``jobs`` > 1 rebuilds every session in that many worker processes (see
    :func:`rebuild_each`).
    """
    if session_id is None:
        manifests = []
        for _sid, outcome in rebuild_each(root, session_ids(root), jobs=jobs):
            if isinstance(outcome, BaseException):
                raise outcome
            manifests.append(outcome)
        if refresh:
            refresh_catalog(root)
        return manifests
    manifest = _rebuild_session(root, session_id)
    if refresh:
        refresh_catalog(root)
    return manifest


def rebuild_file_views(log: SessionLog) -> None:
    """Regenerate the registered file views of the open session ``log``, each only where the
    session has one (its file exists, or the log mentions one of its event types: a byte search,
    no JSON decoding): a rebuild brings views back; it does not invent them."""
    views = file_views()
    needles = [f'"{kind}"' for view in views for kind in view.event_types]
    mentioned = dict(zip(needles, _log_mentions(log.events_path, tuple(needles))))
    for view in views:
        if any(mentioned[f'"{kind}"'] for kind in view.event_types) or \
                (log.directory / DERIVED_DIR / view.filename).exists():
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


def session_ids(root: os.PathLike | str) -> list[str]:
    """The ids of the sessions under ``root`` that hold a log, in directory-name order."""

    def skipped(name: str, reason: str) -> None:
        if "UTF-8" in reason:
            logger.warning("%r under %s is %s", name, root, reason)

    return [session_id_of(Path(e.path)) for e in iter_session_dirs(root, require_log=True, sort=True,
                                                                     on_skip=skipped)]


# Sessions per task of a worker process: enough to make the round trip negligible, few enough
# that the workers finish together.
_REBUILD_CHUNK = 16
# The derived tables a fresh process registers (importing memstore): worker processes have
# these and no others.
_OWN_DERIVED_TABLES = {"event_details", "chunks", "file_changes"}


def rebuild_each(root: os.PathLike | str, ids: Iterable[str], *, jobs: int = 1,
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
    chunks = [away[i:i + _REBUILD_CHUNK] for i in range(0, len(away), _REBUILD_CHUNK)]
    with ProcessPoolExecutor(max_workers=min(jobs, len(chunks)),
                             mp_context=multiprocessing.get_context("spawn")) as pool:
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
    try:
        return _rebuild_session(root, session_id)
    except MemstoreError as exc:
        return exc


def _rebuild_session(root: os.PathLike | str, session_id: str) -> Manifest:
    log = rebuild_index(root, session_id)
    try:
        rebuild_file_views(log)
        return log.manifest
    finally:
        log.close()


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
    ``ok`` does not depend on them, and a session whose source is gone is never flagged."""

    root: str
    sessions: int = 0
    problems: list[Problem] = field(default_factory=list)
    live: list[str] = field(default_factory=list)
    imports: list = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(p.fixed for p in self.problems)

    def to_dict(self) -> dict:
        return {"root": self.root, "sessions": self.sessions, "ok": self.ok, "live": self.live,
                "problems": [asdict(p) for p in self.problems], "imports": [i.to_dict() for i in self.imports],
                "warnings": list(self.warnings)}


def check_store(root: os.PathLike | str, *, fix: bool = False,
                progress: Optional[Callable[[int, int], None]] = None) -> DoctorReport:
    """Check every session under ``root`` and the catalog; with ``fix``, repair what is wrong."""
    root = Path(root)
    if not root.is_dir():
        raise StoreIOError("check store", root, "no such store directory")
    report = DoctorReport(str(root))
    base = sessions_root(root)
    try:
        entries = sorted((e for e in os.scandir(base) if not e.name.startswith(".")), key=lambda e: e.name)
    except FileNotFoundError:
        entries = []
    except OSError as exc:
        raise StoreIOError.from_os_error("list", base, exc) from exc
    seen: dict[str, tuple[str, object]] = {}  # directory name -> (session id, manifest as read)
    imported: list = []  # the imported sessions' stats
    for done, entry in enumerate(entries, start=1):
        if progress is not None:
            progress(done, len(entries))
        _check_session(root, Path(entry.path), report, seen, fix, imported)
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
    try:
        raw = read_no_follow(directory / DERIVED_DIR / IMPORT_STATE_FILE)
        state = orjson.loads(raw) if raw is not None else None
        if isinstance(state, dict) and isinstance(state.get("carry"), dict):
            carry = state["carry"]
    except (MemstoreError, orjson.JSONDecodeError):
        pass
    raw_stats = carry.get("stats")
    stats: dict = raw_stats if isinstance(raw_stats, dict) else {}
    records = stats.get("records")
    unrecognized = stats.get("unrecognized")
    expects_usage = not (agent == "codex" and (carry.get("legacy") is True or version is None))
    tokens = [sum(getattr(t, name) for t in turns) for name in
              ("input_tokens", "cached_input_tokens", "cache_creation_tokens", "output_tokens")]
    return SourceStats(session_id, agent, version, len(turns), tokens[0], tokens[1], tokens[2], tokens[3],
                       records if type(records) is int else None,
                       dict(unrecognized) if isinstance(unrecognized, dict) else {}, expects_usage)


def _check_session(root: Path, directory: Path, report: DoctorReport, seen: dict, fix: bool,
                   imported: Optional[list] = None) -> None:
    name = directory.name

    def problem(check: str, detail: str, session: Optional[str] = None, fixable: bool = True) -> Problem:
        found = Problem(str(directory), session, check, detail, fixable)
        report.problems.append(found)
        return found

    st = os.lstat(directory)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        problem("log", "not a session directory (a symlink or a file)", fixable=False)
        return
    if not (directory / EVENTS_FILE).is_file():
        problem("log", "no events.jsonl: not a session", fixable=False)
        return
    report.sessions += 1
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
    perms = [problem("permissions", detail, session_id) for detail in _permission_problems(directory)]
    if fix and perms:
        _fix_permissions(directory)
        for p in perms:
            p.fixed = True
    seen[name] = (session_id, manifest)
    if live:
        report.live.append(session_id)
    found: list[Problem] = []
    if torn > 0:
        found.append(problem("torn_tail", f"{torn} bytes after the last complete line of events.jsonl", session_id))
    if not index_ok:
        found.append(problem("index", f"{INDEX_DIR}/{INDEX_FILE} is missing or unusable (reads fall back to the log)", session_id))
    elif behind and not live:
        found.append(problem("index", f"the index is behind the log by {behind} events", session_id))
    on_disk = load_manifest(directory)
    if on_disk is None:
        found.append(problem("manifest", "manifest.json is missing or unreadable", session_id))
    elif not live and (on_disk.event_count, on_disk.turn_count) != (manifest.event_count, manifest.turn_count):
        found.append(problem("manifest", f"manifest.json says {on_disk.event_count} events and {on_disk.turn_count} "
                                         f"turns; the log holds {manifest.event_count} and {manifest.turn_count}",
                             session_id))
    if not found or not fix:
        return
    if live:
        for p in found:
            p.detail += " (the session is open in another process: its writer repairs it)"
        return
    try:
        if session_dir_name(session_id) != name:
            raise StoreIOError("rebuild", directory, f"session id {session_id!r} does not name this directory")
        manifest = rebuild(root, session_id)
        seen[name] = (session_id, manifest)
    except (MemstoreError, ValueError) as exc:
        logger.warning("doctor: could not rebuild %s: %s", directory, exc)
        for p in found:
            p.detail += f" (rebuild failed: {exc})"
        return
    for p in found:
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
    for rel in _PRIVATE_DIRS:
        path = directory / rel if rel else directory
        if path.is_dir() and not path.is_symlink():
            os.chmod(path, 0o700)
    for rel in _PRIVATE_FILES:
        path = directory / rel
        if path.is_file() and not path.is_symlink():
            os.chmod(path, 0o600)


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
    if not path.is_file():
        if seen:
            problem("catalog.db does not exist")
    else:
        try:
            conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
            try:
                rows = {r[0]: r[1:] for r in conn.execute(
                    "SELECT directory, session_id, event_count, turn_count, generation FROM sessions")}
            finally:
                conn.close()
        except sqlite3.Error as exc:
            problem(f"catalog.db cannot be read: {exc}")
            # Only a file that is not (or no longer) a database is set aside by --fix, never one
            # that is merely busy.
            unreadable = getattr(exc, "sqlite_errorname", "") in ("SQLITE_NOTADB", "SQLITE_CORRUPT") or (
                "not a database" in str(exc) or "malformed" in str(exc))
    if path.is_file() and not found:
        for name, (session_id, manifest) in seen.items():
            row = rows.get(name)
            if row is None:
                problem("the catalog does not list this session", session_id)
            elif row[1:] != (manifest.event_count, manifest.turn_count, manifest.generation):
                problem(f"the catalog has {row[1]} events, {row[2]} turns (generation {row[3]}); the session has "
                        f"{manifest.event_count}, {manifest.turn_count} (generation {manifest.generation})", session_id)
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
