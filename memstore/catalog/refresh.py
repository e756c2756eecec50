"""Bringing the catalog up to date: which sessions to look at, and copying them in batches.

A refresh costs the number of sessions that changed, not the number there are. Which ones
changed, it learns from three sources (see :class:`RefreshMode`):

- the change feed (:mod:`memstore.changes`): every session memstore's own writers, importers,
  rebuilds and retention touched since the last refresh. Its markers are taken up (renamed)
  before the sessions are read and removed once their rows are committed, so a change made
  meanwhile is never lost;
- the sweep: one ``scandir`` of ``sessions/`` and a ``stat`` of each log and memory view,
  compared with the stamps the catalog recorded. It finds what writers memstore does not control
  do (VT Code appending to its own log) and anything the feed missed (a marker a crash lost);
  it runs when asked, and otherwise at most every ``sweep_interval`` seconds;
- a full check: every file stamp of every session, as the catalog always did. What
  :func:`refresh_catalog` does.

The sessions to copy are read (:mod:`.copy`) and written (:mod:`.write`) a batch at a time: one
transaction per batch of up to ``BATCH_SESSIONS`` sessions or ``BATCH_BYTES`` of log. A
session that cannot be read (unreadable, removed, not a session any more) is left out and
reported; a catalog that cannot be written stops the refresh, and every session it had yet to
copy is reported with that reason (naming ``catalog.db``, with its ``errno``). What is left out
is recorded in ``catalog_errors`` (searches report it as missing) and tried again at the next
sweep.
"""

from __future__ import annotations

import enum
import errno as errno_module
import logging
import os
import sqlite3
import stat
import time
from pathlib import Path
from typing import Optional

import orjson

from .. import changes
from ..bm25 import SearchIndex
from ..errors import MemstoreError, SessionNotFound, StoreIOError
from ..identity import store_identity
from ..layout import SESSIONS_DIR, catalog_path
from ..locks import store_lock
from ..redact import Redactor, redactor_for
from .copy import STATE_COLUMNS, Previous, SessionCopy, read_copy
from .report import CatalogProgress, CatalogProgressCallback, ProgressCallback, RefreshReport
from .scan import Examined, examine, session_directories, sweep, sweep_stamp
from .schema import open_catalog
from .write import CatalogWriter

logger = logging.getLogger("memstore.catalog")

BATCH_SESSIONS = 512
"""A batch holds at most this many sessions ..."""
BATCH_BYTES = 16 << 20
"""... and about this many bytes of log to read (one session larger than that alone)."""
DEFAULT_SWEEP_SECONDS = 2.0
"""How old the last sweep may be before a refresh in :attr:`RefreshMode.FEED` sweeps again."""
OPTIMIZE_AFTER_DOCS = 50_000
"""A refresh that indexed at least this many chunks merges the search index's segments."""


class RefreshMode(enum.Enum):
    """Which sessions a refresh looks at (see the module docstring)."""

    FEED = "feed"  # the change feed, and the sweep when it is due
    SWEEP = "sweep"  # the change feed and the sweep, now
    FULL = "full"  # every file stamp of every session


def refresh_catalog(
    root: os.PathLike | str,
    *,
    progress: ProgressCallback = None,
    on_progress: CatalogProgressCallback = None,
    full: bool = True,
) -> RefreshReport:
    """Bring ``<root>/catalog.db`` up to date with the sessions under ``root``; return what
    changed. By default a full check (every file stamp of every session); ``full=False`` looks
    only at what the change feed and a sweep name (see the module docstring).
    ``progress(done, total)`` is called as sessions are looked at, ``on_progress`` with a
    :class:`CatalogProgress` (sessions and bytes, rate, ETA) as they are copied.

    Raises :class:`StoreIOError` when the store or its catalog cannot be opened (naming the
    file, with its ``errno``) and :class:`UnsafePathError` for a catalog file that is a symlink
    or not a regular file."""
    root = Path(root)
    if not root.is_dir():
        raise StoreIOError("refresh catalog", root, "no such store directory", errno_module.ENOENT)
    with store_lock(root, "catalog"):
        conn = open_catalog(root)
        try:
            return run_refresh(
                conn, root, RefreshMode.FULL if full else RefreshMode.SWEEP, progress=progress, on_progress=on_progress
            )
        finally:
            conn.close()


def load_state(conn: sqlite3.Connection, names: Optional[set[str]] = None) -> dict[str, Previous]:
    """What the catalog recorded of each session directory it copied (of ``names`` only, when
    given)."""
    if names is None:
        rows = conn.execute(f"SELECT {STATE_COLUMNS} FROM catalog_state").fetchall()
    elif not names:
        return {}
    else:
        rows = conn.execute(
            f"SELECT {STATE_COLUMNS} FROM catalog_state WHERE directory IN (SELECT value FROM json_each(?))",
            (orjson.dumps(sorted(names)).decode(),),
        ).fetchall()
    return {
        row[0]: Previous(
            directory=row[0],
            session_id=row[1],
            generation=row[2],
            seq=row[3],
            last_turn=row[4],
            stamp=row[5],
            sweep=row[6],
            log_bytes=row[7],
            tail=row[8],
            reported_total=row[9],
            title=row[10],
            title_from_user=bool(row[11]),
            retained_turn_base=row[12] if row[12] is not None else 1,
        )
        for row in rows
    }


def read_meta(conn: sqlite3.Connection, key: str) -> Optional[str]:
    row = conn.execute("SELECT value FROM catalog_meta WHERE key = ?", (key,)).fetchone()
    return None if row is None else row[0]


def sweep_due(conn: sqlite3.Connection, interval: float, now: Optional[float] = None) -> bool:
    """Whether the catalog's last sweep (by any process) is older than ``interval`` seconds."""
    last = read_meta(conn, "last_sweep")
    try:
        return last is None or (now if now is not None else time.time()) - float(last) >= interval
    except ValueError:
        return True


def run_refresh(
    conn: sqlite3.Connection,
    root: Path,
    mode: RefreshMode,
    *,
    sweep_interval: float = DEFAULT_SWEEP_SECONDS,
    progress: ProgressCallback = None,
    on_progress: CatalogProgressCallback = None,
    search: Optional[SearchIndex] = None,
) -> RefreshReport:
    """One refresh of the catalog behind ``conn`` (opened with :func:`open_catalog`; the caller
    holds the store's ``catalog`` lock). See the module docstring."""
    return _Refresh(conn, root, search or SearchIndex(conn), progress, on_progress).run(mode, sweep_interval)


class _Refresh:
    def __init__(
        self,
        conn: sqlite3.Connection,
        root: Path,
        search: SearchIndex,
        progress: ProgressCallback,
        on_progress: CatalogProgressCallback,
    ):
        self.conn = conn
        self.root = root
        self.sessions = os.path.join(os.fspath(root), SESSIONS_DIR)
        self.path = os.fspath(catalog_path(root))
        self.writer = CatalogWriter(conn, search, self.path)
        self.search = search
        self.progress = progress
        self.on_progress = on_progress
        self.report = RefreshReport()
        self.errors: dict[str, tuple[Optional[str], str, Optional[int], Optional[str]]] = {}
        self.cleared: set[str] = set()
        self.indexed = 0
        self.aborted = False
        self._redactor: Optional[Redactor] = None
        self._identity_read = False

    @property
    def redactor(self) -> Redactor:
        """The store's redactor (its ``config.toml``), read once per refresh when the first session
        is copied: every text reaches the catalog through it. A malformed ``config.toml`` raises
        there, before any session is copied."""
        if self._redactor is None:
            self._redactor = redactor_for(self.root)
        return self._redactor

    def own_origin(self) -> Optional[tuple[str, str]]:
        """This store's id and label (what a session born here records as its origin), read
        once per refresh and given to the writer; ``None``, logged, when the store has no
        identity it can read or create (those sessions' origin stays empty until one can)."""
        if not self._identity_read:
            self._identity_read = True
            try:
                identity = store_identity(self.root)
            except StoreIOError as exc:
                logger.warning("catalog: the store's own origin is left empty: %s", exc)
            else:
                self.writer.own_origin = (identity.store_id, identity.label)
        return self.writer.own_origin

    # -- which sessions -----------------------------------------------------------------------

    def run(self, mode: RefreshMode, sweep_interval: float) -> RefreshReport:
        conn = self.conn
        now = time.time()
        if read_meta(conn, "built") is None:
            mode = RefreshMode.FULL  # a new catalog (or one whose first build never finished)
        changes.ensure_feed(self.root)  # before any look at the sessions (see changes.ensure_feed)
        claimed = changes.claim(self.root)
        if claimed is None and mode is RefreshMode.FEED:
            mode = RefreshMode.SWEEP  # a feed this process cannot take up: look at the sessions
        if mode is RefreshMode.FEED and sweep_due(conn, sweep_interval, now):
            mode = RefreshMode.SWEEP
        recorded_errors = {row[0]: row[1] for row in conn.execute("SELECT directory, sweep FROM catalog_errors")}
        candidates = set(claimed or ())
        if mode is RefreshMode.FEED:
            # What the feed names, and nothing else: the cost is what changed.
            state = load_state(conn, candidates)
        else:
            state = load_state(conn)
            if mode is RefreshMode.SWEEP:
                found = sweep(self.root, {name: p.sweep for name, p in state.items() if p.sweep}, recorded_errors)
                candidates |= found.changed | (set(state) - found.present) | (set(recorded_errors) - found.present)
            else:
                candidates |= set(session_directories(self.root)) | set(state) | set(recorded_errors)
        self.report.mode = mode.value
        self._refresh(sorted(candidates), state, set(recorded_errors))
        if mode is not RefreshMode.FEED and not self.aborted:
            self._update_own_origin()
        self._record(mode, now, set(recorded_errors))
        if claimed:
            changes.release(self.root, claimed)
        if self.indexed >= OPTIMIZE_AFTER_DOCS:
            self._optimize()
        return self.report

    def _refresh(self, names: list[str], state: dict[str, Previous], errored: set[str]) -> None:
        to_copy: list[tuple[Examined, Optional[Previous]]] = []
        forget: list[tuple[str, str]] = []
        total = len(names)
        for done, name in enumerate(names, start=1):
            if self.progress is not None:
                self.progress(done, total)
            previous = state.get(name)
            try:
                examined = self._examine(name)
            except OSError as exc:
                self._error(
                    name,
                    previous.session_id if previous else None,
                    StoreIOError.from_os_error("read session", os.path.join(self.sessions, name), exc),
                )
                continue
            if examined is None:
                # Gone, or no session (any more): as a catalog built from scratch would say.
                if previous is not None:
                    forget.append((name, previous.session_id))
                elif name in errored:
                    self.cleared.add(name)
                continue
            if previous is not None and previous.stamp == examined.stamp:
                self.report.unchanged += 1
                if name in errored:
                    self.cleared.add(name)
                continue
            to_copy.append((examined, previous))
        if forget:
            try:
                self.writer.write([], forget)
            except StoreIOError as exc:
                self._abort(
                    exc,
                    [(name, sid) for name, sid in forget] + [(e.name, p.session_id if p else None) for e, p in to_copy],
                )
                return
            self.report.removed += [session_id for _name, session_id in forget]
            self.cleared.update(name for name, _sid in forget)
        self._copy(to_copy)

    def _examine(self, name: str) -> Optional[Examined]:
        try:
            name.encode("utf-8")
        except UnicodeEncodeError:
            return None  # no session id names such a directory
        directory = os.path.join(self.sessions, name)
        try:
            st = os.lstat(directory)
        except FileNotFoundError:
            return None
        if not stat.S_ISDIR(st.st_mode):
            return None  # a symlink is never followed; a file is no session
        return examine(name, directory)

    # -- copying -------------------------------------------------------------------------------

    def _copy(self, to_copy: list[tuple[Examined, Optional[Previous]]]) -> None:
        todo = [(examined, previous, _bytes_to_read(examined, previous)) for examined, previous in to_copy]
        if not todo:
            return
        redactor = self.redactor  # a malformed config.toml raises here, before any copy
        self.own_origin()
        bytes_total = sum(size for _e, _p, size in todo)
        sessions_done = bytes_done = 0
        started = time.monotonic()
        start = 0
        while start < len(todo):
            end, size = start, 0
            while (
                end < len(todo)
                and end - start < BATCH_SESSIONS
                and (end == start or size + todo[end][2] <= BATCH_BYTES)
            ):
                size += todo[end][2]
                end += 1
            batch = todo[start:end]
            copies: list[SessionCopy] = []
            gone: list[tuple[str, str]] = []
            for examined, previous, nbytes in batch:
                try:
                    copies.append(read_copy(examined, previous, redactor))
                except SessionNotFound:
                    if previous is not None:
                        gone.append((examined.name, previous.session_id))
                    else:
                        self.cleared.add(examined.name)
                except (MemstoreError, OSError, sqlite3.Error) as exc:
                    error = (
                        exc
                        if isinstance(exc, StoreIOError)
                        else StoreIOError(
                            "read session",
                            examined.path,
                            f"{type(exc).__name__}: {exc}",
                            getattr(exc, "errno", None) if isinstance(exc, OSError) else None,
                        )
                    )
                    self._error(examined.name, previous.session_id if previous else None, error)
                sessions_done += 1
                bytes_done += nbytes
                if self.on_progress is not None:
                    self.on_progress(
                        CatalogProgress(sessions_done, len(todo), bytes_done, bytes_total, time.monotonic() - started)
                    )
            try:
                result = self.writer.write(copies, gone)
            except StoreIOError as exc:
                self._abort(exc, [(e.name, p.session_id if p else None) for e, p, _n in todo[start:]])
                return
            for copy in result.written:
                getattr(self.report, copy.kind).append(copy.session_id)
                self.cleared.add(copy.name)
                self.indexed += len(copy.chunks) + len(copy.facts or ())
            for name, session_id in gone:
                self.report.removed.append(session_id)
                self.cleared.add(name)
            for name, reason in result.errors.items():
                refused: Optional[str] = next((c.session_id for c in copies if c.name == name), None)
                self._error(name, refused, StoreIOError("write", self.path, reason))
            start = end

    def _abort(self, exc: StoreIOError, left: list[tuple[str, Optional[str]]]) -> None:
        """The catalog cannot be written: nothing more can be copied now. Every session left is
        reported with the catalog's error."""
        logger.warning("catalog: %s; %d session directories not copied", exc, len(left))
        self.aborted = True
        for name, session_id in left:
            if name not in self.errors:
                self._error(name, session_id, exc, quiet=True)

    def _error(self, name: str, session_id: Optional[str], exc: StoreIOError, *, quiet: bool = False) -> None:
        if not quiet:
            logger.warning("catalog: leaving session directory %s out this time: %s", name, exc)
        sweep_of: Optional[str] = None
        try:
            sweep_of = sweep_stamp(os.path.join(self.sessions, name))
        except OSError:
            pass
        self.errors[name] = (session_id, str(exc), exc.errno, sweep_of)
        self.report.errors.append((name, str(exc)))

    def _update_own_origin(self) -> None:
        """Bring the origin of the sessions born here in line with the store's identity (its
        label may have been changed since they were copied): at every sweep, as a label change
        is in no session's files."""
        self.own_origin()
        try:
            self.writer.update_own_origin()
        except StoreIOError as exc:
            logger.warning("catalog: could not update the origin of this store's sessions: %s", exc)

    # -- what the refresh leaves -------------------------------------------------------------

    def _record(self, mode: RefreshMode, started: float, recorded: set[str]) -> None:
        """Record the sessions left out (and those no longer), and when the store was last
        swept, in one small transaction (none when there is nothing to record). A catalog that
        cannot take even that is logged: the report still says what was left out, and the next
        sweep tries them again."""
        conn = self.conn
        if mode is RefreshMode.FEED and not self.errors and not (self.cleared & recorded):
            return
        try:
            conn.execute("BEGIN IMMEDIATE")
            cleared = self.cleared - set(self.errors)
            if cleared:
                conn.executemany("DELETE FROM catalog_errors WHERE directory = ?", ((n,) for n in cleared))
            now = _utc_now()
            conn.executemany(
                "INSERT OR REPLACE INTO catalog_errors (directory, session_id, reason, errno, sweep, at) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (
                    (name, sid, reason, number, sweep_of, now)
                    for name, (sid, reason, number, sweep_of) in self.errors.items()
                ),
            )
            if mode is not RefreshMode.FEED:
                conn.execute(
                    "INSERT OR REPLACE INTO catalog_meta (key, value) VALUES ('last_sweep', ?)", (repr(started),)
                )
            if mode is RefreshMode.FULL and not self.aborted:
                conn.execute("INSERT OR REPLACE INTO catalog_meta (key, value) VALUES ('built', ?)", (now,))
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            if conn.in_transaction:
                try:
                    conn.execute("ROLLBACK")
                except sqlite3.Error:
                    pass
            logger.warning("catalog: could not record what this refresh left out in %s: %s", self.path, exc)
            self.report.unrecorded = True

    def _optimize(self) -> None:
        try:
            self.search.optimize()
        except (StoreIOError, sqlite3.Error) as exc:
            logger.warning("catalog: merging the search index's segments failed (searches still work): %s", exc)


def _bytes_to_read(examined: Examined, previous: Optional[Previous]) -> int:
    if previous is not None and previous.log_bytes is not None and previous.log_bytes <= examined.log_bytes:
        return examined.log_bytes - previous.log_bytes
    return examined.log_bytes


def _utc_now() -> str:
    from ..events import utc_now

    return utc_now()
