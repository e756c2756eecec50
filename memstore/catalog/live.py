"""One process's warm view of a store's catalog: what :class:`memstore.Store` searches through.

A :class:`LiveCatalog` keeps, between calls, a connection to ``catalog.db`` per thread, and
when the store was last swept. Bringing the catalog up to date before a search then costs
what changed, not what there is: with nothing changed it is one ``scandir`` of ``changes/`` (and
one ``stat`` of ``catalog.db``, to notice a catalog replaced under it), no lock, no
transaction; a sweep of the sessions runs only when the last one (by any process: its time is
in the catalog) is older than ``sweep_interval`` seconds.

How fresh a search is: it sees every change memstore's own writers published before it began
(a write point's rows reach the session's index, and the feed, a moment after the write, from
the session's background thread: ``flush()`` and ``close()`` wait for it), and every other change to the store (VT Code
appending to its own log, files copied in) within ``sweep_interval`` seconds.

A store this process cannot write (a read-only copy, a read-only mount, another user's files)
is searched as its catalog last saw it, without taking a lock or changing a permission; the
sessions that changed since are reported as missing, as are those a refresh could not copy.
"""

from __future__ import annotations

import errno
import logging
import os
import sqlite3
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Optional

from .. import changes
from ..bm25 import SearchIndex
from ..errors import StoreIOError, StoreReadOnly, UnsafePathError
from ..layout import catalog_path, locks_dir
from .refresh import DEFAULT_SWEEP_SECONDS, RefreshMode, load_state, read_meta, run_refresh
from .report import CatalogProgressCallback, MissingSession, ProgressCallback, RefreshReport, recorded_missing
from .scan import sweep
from .schema import SIDE_SUFFIXES, open_catalog, open_catalog_readonly

logger = logging.getLogger("memstore.catalog")

LOCK_WAIT_SECONDS = 2.0
"""How long a search waits for another process's refresh before it searches the catalog as it
is (and reports what that refresh has yet to copy as missing)."""
_UNWRITABLE = (errno.EROFS, errno.EACCES, errno.EPERM)

_live: weakref.WeakSet[LiveCatalog] = weakref.WeakSet()


def catalog_writable(root: os.PathLike | str) -> bool:
    """Whether this process may write the catalog of ``root``: the root directory, and the
    catalog, its side files and ``locks/`` where they exist, are writable by it (and not on a
    read-only file system). Decided from permissions alone, changing nothing."""
    root = os.fspath(root)
    effective = os.access in os.supports_effective_ids
    try:
        if os.statvfs(root).f_flag & os.ST_RDONLY:
            return False
    except OSError:
        return False
    if not os.access(root, os.W_OK | os.X_OK, effective_ids=effective):
        return False
    path = os.fspath(catalog_path(root))
    for candidate in (path, *(f"{path}{s}" for s in SIDE_SUFFIXES), os.fspath(locks_dir(root))):
        if os.path.lexists(candidate) and not os.access(candidate, os.W_OK, effective_ids=effective):
            return False
    return True


class _Held:
    """One thread's catalog connection, closed when the thread's state goes (the thread ended,
    or the connection was replaced): a process whose threads come and go does not pile up open
    files. :meth:`LiveCatalog.close` closes those still held, from any thread."""

    __slots__ = ("conn", "__weakref__")

    def __init__(self, conn: sqlite3.Connection):
        self.conn: Optional[sqlite3.Connection] = conn

    def close(self) -> None:
        conn, self.conn = self.conn, None
        if conn is None:
            return
        try:
            conn.close()
        except sqlite3.Error as exc:
            logger.debug("closing a catalog connection: %s", exc)

    def __del__(self) -> None:
        self.close()


class _Thread(threading.local):
    conn: Optional[sqlite3.Connection] = None
    held: Optional[_Held] = None
    identity: Optional[tuple[int, int, int, int]] = None
    writable: bool = False


class LiveCatalog:
    """The warm state of one store's catalog in this process (see the module docstring).
    Thread-safe: each thread has its own connection; refreshes in this process take turns."""

    def __init__(
        self,
        root: os.PathLike | str,
        *,
        sweep_interval: float = DEFAULT_SWEEP_SECONDS,
        lock_wait: float = LOCK_WAIT_SECONDS,
    ):
        self.root = Path(root)
        self.path = catalog_path(self.root)
        self.sweep_interval = max(0.0, float(sweep_interval))
        self.lock_wait = lock_wait
        self._thread = _Thread()
        self._connections: weakref.WeakSet[_Held] = weakref.WeakSet()  # every thread's, to close them
        self._conn_lock = threading.Lock()  # guards _connections
        self._mutex = threading.Lock()  # one refresh at a time in this process
        self._swept_at = float("-inf")  # monotonic time of the last sweep this process knows of
        self._writable: Optional[bool] = None
        self._writable_at = float("-inf")
        self._stale: list[MissingSession] = []  # sessions a search cannot see, when it cannot refresh
        self._stale_at = float("-inf")
        self._unrecorded: dict[str, MissingSession] = {}  # left out by a refresh that could not record it
        self._warned = False
        _live.add(self)

    # -- connections -------------------------------------------------------------------------

    @property
    def writable(self) -> bool:
        """Whether this process may write the catalog (see :func:`catalog_writable`), looked at
        again at most every ``sweep_interval`` seconds (a store remounted, its permissions
        changed)."""
        now = time.monotonic()
        if self._writable is None or now - self._writable_at >= max(self.sweep_interval, 1.0):
            self._writable = catalog_writable(self.root)
            self._writable_at = now
        return self._writable

    def connection(self) -> sqlite3.Connection:
        """This thread's connection to the catalog as it is now (reopened when the file was
        replaced or removed since: a rebuild, a set-aside, a user's ``rm``). Opening a new
        catalog of a writable store takes the store's ``catalog`` lock."""
        local = self._thread
        identity = _identity(self.path)
        if local.conn is not None and identity is not None and identity == local.identity:
            return local.conn
        self._drop_connection()
        if self.writable:
            from ..locks import store_lock

            with store_lock(self.root, "catalog"):
                conn = open_catalog(self.root)
            local.writable = True
        else:
            conn = open_catalog_readonly(self.root)
            local.writable = False
        local.conn, local.identity = conn, _identity(self.path)
        self._keep(conn)
        return conn

    def _keep(self, conn: sqlite3.Connection) -> None:
        """Hold ``conn`` as this thread's (``local.conn``): closed with the thread's state."""
        held = _Held(conn)
        self._thread.held = held
        with self._conn_lock:
            self._connections.add(held)

    def _drop_connection(self) -> None:
        local = self._thread
        held = local.held
        if held is not None:
            with self._conn_lock:
                self._connections.discard(held)
            held.close()
        elif local.conn is not None:
            local.conn.close()
        local.conn, local.held, local.identity = None, None, None

    def close(self) -> None:
        """Close every connection this object opened (in any thread)."""
        with self._conn_lock:
            held, self._connections = list(self._connections), weakref.WeakSet()
        for one in held:
            one.close()
        self._thread = _Thread()

    def _forget_after_fork(self) -> None:
        # The parent's connections must not be used (nor closed) in a forked child.
        for held in list(self._connections):
            held.conn = None  # never closed here: it is the parent's
        self._thread = _Thread()
        self._connections = weakref.WeakSet()
        self._conn_lock = threading.Lock()
        self._mutex = threading.Lock()

    # -- keeping it current ------------------------------------------------------------------

    def ensure_current(
        self,
        *,
        on_progress: CatalogProgressCallback = None,
        index_for: Optional[Callable[[sqlite3.Connection], SearchIndex]] = None,
    ) -> list[MissingSession]:
        """Bring the catalog up to date for a search if anything changed (see the module
        docstring); return the sessions the search cannot see besides those the catalog records
        as left out (a store that cannot be written, a refresh another process holds, a refresh
        that could not record what it left out). ``index_for(conn)`` gives the search index a
        refresh writes through (the searches' kept one, so what it loads is not loaded twice).
        Raises :class:`StoreIOError` when there is no catalog to read at all."""
        if not self.writable:
            return self._search_as_is("the store cannot be written by this process")
        local = self._thread
        identity = _identity(self.path)
        fresh = local.conn is not None and identity is not None and identity == local.identity
        if fresh and not changes.pending(self.root) and not self._sweep_due(local.conn):
            return list(self._unrecorded.values())
        try:
            self.refresh(
                RefreshMode.FEED,
                on_progress=on_progress,
                wait=self.lock_wait if identity else None,
                index_for=index_for,
            )
        except _Busy:
            return self._search_as_is("another process is refreshing the catalog", stale_ok=True)
        except StoreIOError as exc:
            if isinstance(exc, UnsafePathError) or identity is None:
                raise
            if exc.errno in _UNWRITABLE:
                self._writable = False
            return self._search_as_is(f"the catalog could not be refreshed: {exc}", error=exc)
        return list(self._unrecorded.values())

    def refresh(
        self,
        mode: RefreshMode = RefreshMode.FULL,
        *,
        progress: ProgressCallback = None,
        on_progress: CatalogProgressCallback = None,
        wait: Optional[float] = None,
        index_for: Optional[Callable[[sqlite3.Connection], SearchIndex]] = None,
    ) -> RefreshReport:
        """Refresh the catalog (see :class:`RefreshMode`) under the store's ``catalog`` lock,
        waiting for it at most ``wait`` seconds (``None``: as long as it takes). A store this
        process cannot write is refused with :class:`StoreReadOnly` (``EROFS`` or ``EACCES``)
        before anything is touched."""
        from filelock import Timeout

        from ..locks import store_lock

        if not self.root.is_dir():
            raise StoreIOError("refresh catalog", self.root, "no such store directory", errno.ENOENT)
        if not self.writable:
            # Refused before any lock is taken: taking one would create or chmod files in a
            # store this process must leave as it is.
            raise StoreReadOnly(
                "refresh catalog",
                self.root,
                "the store cannot be written by this process",
                _unwritable_errno(self.root),
            )
        with self._mutex if wait is None else _acquired(self._mutex, wait):
            lock = store_lock(self.root, "catalog", timeout=-1 if wait is None else wait)
            try:
                lock.acquire()
            except Timeout:
                raise _Busy() from None
            try:
                conn = self._write_connection()
                started = time.monotonic()
                report = run_refresh(
                    conn,
                    self.root,
                    mode,
                    sweep_interval=self.sweep_interval,
                    progress=progress,
                    on_progress=on_progress,
                    search=index_for(conn) if index_for is not None else None,
                )
                self._thread.identity = _identity(self.path)  # its own checkpoints are no news
            finally:
                lock.release()
        if report.mode in (RefreshMode.SWEEP.value, RefreshMode.FULL.value):
            self._swept_at = started
        self._note_unrecorded(report)
        return report

    def _write_connection(self) -> sqlite3.Connection:
        # Under the store's catalog lock: open (or create, migrate, set aside) the catalog.
        local = self._thread
        identity = _identity(self.path)
        if local.conn is None or not local.writable or identity is None or identity != local.identity:
            self._drop_connection()
            conn = open_catalog(self.root)
            local.conn, local.identity, local.writable = conn, _identity(self.path), True
            self._keep(conn)
            return conn
        return local.conn

    def sweep_due(self) -> bool:
        """Whether the last sweep of the store (by this process or, as the catalog records,
        another) is older than ``sweep_interval``."""
        return self._sweep_due(self._thread.conn)

    def _sweep_due(self, conn: Optional[sqlite3.Connection]) -> bool:
        now = time.monotonic()
        if now - self._swept_at < self.sweep_interval:
            return False
        if conn is None:
            return True
        try:
            last = read_meta(conn, "last_sweep")
            age = time.time() - float(last) if last is not None else None
        except (sqlite3.Error, ValueError):
            return True
        if age is not None and 0 <= age < self.sweep_interval:
            self._swept_at = now - age
            return False
        return True

    def _note_unrecorded(self, report: RefreshReport) -> None:
        """Keep what a refresh left out but could not record in the catalog (a full disk), so
        this process's searches still report it; until a sweep (which tries every session
        left out again) could record what it left out."""
        if report.unrecorded:
            self._unrecorded.update((name, MissingSession(name, None, reason)) for name, reason in report.errors)
        elif report.mode != RefreshMode.FEED.value:
            self._unrecorded = {}

    # -- a catalog that cannot be refreshed ----------------------------------------------------

    def _search_as_is(
        self, why: str, *, stale_ok: bool = False, error: Optional[StoreIOError] = None
    ) -> list[MissingSession]:
        """The catalog as it is, with the sessions that changed since it was last refreshed
        (worked out at most every ``sweep_interval`` seconds). When it cannot be read either,
        ``error`` (what kept it from being refreshed) is raised, else what reading it raised."""
        local = self._thread
        identity = _identity(self.path)
        if local.conn is None or identity is None or identity != local.identity:
            self._drop_connection()
            try:
                conn = open_catalog_readonly(self.root)
            except StoreIOError as exc:
                if exc.errno != errno.ENOSPC:
                    raise error or exc from exc
                # A disk too full for SQLite's shared memory file: the file alone, as of its
                # last checkpoint.
                try:
                    conn = open_catalog_readonly(self.root, immutable=True)
                except StoreIOError:
                    raise error or exc from exc
                why = f"{why}; read as of its last checkpoint"
            local.conn, local.identity, local.writable = conn, identity, False
            self._keep(conn)
        if not self._warned:
            logger.warning("searching %s as it is, without refreshing it: %s", self.path, why)
            self._warned = True
        now = time.monotonic()
        if now - self._stale_at >= self.sweep_interval or stale_ok:
            self._stale = self._changed_since(local.conn, why)
            self._stale_at = now
        return list(self._stale)

    def _changed_since(self, conn: sqlite3.Connection, why: str) -> list[MissingSession]:
        try:
            conn.execute("BEGIN")
            try:
                state = load_state(conn)
            finally:
                conn.execute("COMMIT")
        except sqlite3.Error as exc:
            logger.warning("catalog %s: cannot read what it copied: %s", self.path, exc)
            return []
        try:
            found = sweep(self.root, {name: p.sweep for name, p in state.items() if p.sweep})
        except StoreIOError as exc:
            logger.warning("cannot list the sessions of %s: %s", self.root, exc)
            return []
        names = found.changed | (set(state) - found.present)
        marked = changes.marked(self.root)
        names |= marked & found.present
        out = []
        for name in sorted(names):
            previous = state.get(name)
            if name not in found.present:
                reason = f"removed since the catalog was last refreshed ({why})"
            elif previous is None:
                reason = f"not in the catalog yet ({why})"
            else:
                reason = f"changed since the catalog copied it ({why})"
            out.append(MissingSession(name, previous.session_id if previous else None, reason))
        return out

    def missing(self, conn: sqlite3.Connection) -> list[MissingSession]:
        """What the catalog records as left out, with what this process knows besides."""
        found = {m.directory: m for m in recorded_missing(conn)}
        for extra in list(self._unrecorded.values()):
            found.setdefault(extra.directory, extra)
        return [found[name] for name in sorted(found)]


def _unwritable_errno(root: Path) -> int:
    try:
        if os.statvfs(root).f_flag & os.ST_RDONLY:
            return errno.EROFS
    except OSError:
        pass
    return errno.EACCES


class _Busy(Exception):
    """Another process holds the store's catalog lock for longer than a search waits."""


class _acquired:
    """A lock taken with a timeout, as a context manager (``_Busy`` if it is not free in time)."""

    def __init__(self, lock: threading.Lock, timeout: float):
        self.lock, self.timeout = lock, timeout

    def __enter__(self) -> None:
        if not self.lock.acquire(timeout=max(0.0, self.timeout)):
            raise _Busy()

    def __exit__(self, *exc_info: object) -> None:
        self.lock.release()


def _identity(path: Path) -> Optional[tuple[int, int, int, int]]:
    """What tells the catalog file a connection has open from another: its inode (a file
    replaced, set aside, removed), its size and ctime (a file overwritten in place; in WAL mode
    memstore's own commits change only the WAL, and a checkpoint costs a reconnect)."""
    try:
        st = os.stat(path, follow_symlinks=False)
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_size, st.st_ctime_ns


KEPT_STORES = 4
"""A process keeps the warm state of at most this many stores (the least recently used is closed)."""
_kept: OrderedDict[str, LiveCatalog] = OrderedDict()
_kept_lock = threading.Lock()


def live_catalog(root: os.PathLike | str) -> LiveCatalog:
    """The process's :class:`LiveCatalog` of the store at ``root`` (one per directory, whatever
    path names it), made on first use: what :func:`memstore.search_memory` and every
    :class:`memstore.Store` of that root share. At most ``KEPT_STORES`` are kept."""
    key = os.path.realpath(root)
    with _kept_lock:
        live = _kept.get(key)
        if live is not None:
            _kept.move_to_end(key)
            return live
        live = _kept[key] = LiveCatalog(Path(root).expanduser().absolute())
        dropped = []
        while len(_kept) > KEPT_STORES:
            dropped.append(_kept.popitem(last=False)[1])
    for old in dropped:
        old.close()
    return live


def release_live_catalog(root: os.PathLike | str) -> None:
    """Close the connections of the process's :class:`LiveCatalog` of ``root``, if it has one
    (it reopens them when next used)."""
    with _kept_lock:
        live = _kept.get(os.path.realpath(root))
    if live is not None:
        live.close()


def _forget_after_fork() -> None:
    global _kept_lock
    _kept_lock = threading.Lock()
    _kept.clear()
    for live in list(_live):
        live._forget_after_fork()


os.register_at_fork(after_in_child=_forget_after_fork)
