"""``memstore doctor``: is every session of a store healthy, and is the catalog current?

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
import os
import sqlite3
import stat
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Optional

from .catalog import refresh_catalog
from .errors import MemstoreError, StoreIOError
from .layout import (
    DERIVED_DIR,
    EVENTS_FILE,
    INDEX_DIR,
    INDEX_FILE,
    MANIFEST_FILE,
    MEMORY_FILE,
    PROGRESS_FILE,
    catalog_path,
    session_dir_name,
    sessions_root,
)
from .session.lock import is_live
from .session.manifest import load_manifest
from .reader import read_session_dir

logger = logging.getLogger("memstore")

_PRIVATE_FILES = (EVENTS_FILE, MANIFEST_FILE, f"{INDEX_DIR}/{INDEX_FILE}", f"{DERIVED_DIR}/{PROGRESS_FILE}",
                  f"{DERIVED_DIR}/{MEMORY_FILE}")
_PRIVATE_DIRS = ("", INDEX_DIR, DERIVED_DIR)


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
    """Sessions looked at and the problems found (``ok``: none left unfixed)."""

    root: str
    sessions: int = 0
    problems: list[Problem] = field(default_factory=list)
    live: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(p.fixed for p in self.problems)

    def to_dict(self) -> dict:
        return {"root": self.root, "sessions": self.sessions, "ok": self.ok, "live": self.live,
                "problems": [asdict(p) for p in self.problems]}


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
    for done, entry in enumerate(entries, start=1):
        if progress is not None:
            progress(done, len(entries))
        _check_session(root, Path(entry.path), report, seen, fix)
    _check_catalog(root, report, seen, fix)
    return report


def _check_session(root: Path, directory: Path, report: DoctorReport, seen: dict, fix: bool) -> None:
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
    except MemstoreError as exc:
        problem("log", f"cannot be read: {exc}", fixable=False)
        return
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
        found.append(problem("index", "index/session.db is missing or unusable (reads fall back to the log)", session_id))
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
        from .session.log import rebuild

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
    from .catalog import set_aside_catalog
    from .locks import store_lock

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
