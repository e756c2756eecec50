"""The catalog as Datasette sees it: a :class:`datasette.database.Database` that follows the file
when it is replaced, does not tell its absolute path, and bounds the size of a result.

- **Follows the file.** ``catalog.db`` is a regenerable view: ``memstore doctor --fix``, a person
  or the catalog's own recovery may delete it or set it aside, and the next refresh builds a new
  one. Connections opened on the old file would keep reading it (an open file outlives its
  name), so no new session would ever show. Before each use, a connection is checked against the
  file's identity (device and inode) taken when it was opened; a connection to a file that is
  no longer the catalog is closed and a new one opened, once the new file has its tables (the
  refresh that builds it creates them first). Until then (no catalog at all, or one without its
  tables yet), the open connection keeps serving what it read.
- **Does not tell its path.** ``path`` (what ``/-/databases.json`` shows) is the file's name,
  ``catalog.db``, which is also its path relative to the store; the absolute path is ``file``.
  With :mod:`.guard` refusing ``PRAGMA database_list`` to queries from outside, no page names
  the directory the store lives in (a home directory, a user name).
- **Bounded results.** A query's rows are fetched until they hold :data:`.guard.LIMITS`
  ``.max_result_bytes`` of values; a page of results past that is cut there (``truncated``), and
  a query that is not paged is an error that says so.
- **Bounded work.** A query stops at Datasette's time limit or at the count of steps that time
  allows, whichever comes first (:func:`bounded_steps`).

The explorer's own code runs through :meth:`CatalogDatabase.execute_trusted` (see
:func:`.guard.trusted`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Optional, TypeVar

from datasette.database import Database, QueryInterrupted, Results

from ..layout import CATALOG_FILE
from .guard import LIMITS, trusted

logger = logging.getLogger(__name__)

T = TypeVar("T")
Identity = tuple[int, int]


class ResultTooLarge(sqlite3.DataError):
    """A query whose rows hold more bytes than a page may."""


def file_identity(path: Path) -> Optional[Identity]:
    """``(device, inode)`` of the file at ``path``, ``None`` when there is none."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


class CatalogDatabase(Database):
    """A memstore catalog in Datasette (see the module doc). ``file`` is the catalog's path."""

    def __init__(self, ds: Any, file: os.PathLike | str, *, is_mutable: bool = True):
        self.file = Path(file).absolute()
        super().__init__(ds, path=str(self.file), is_mutable=is_mutable)
        self._local = threading.local()
        self.reopened = 0

    # Datasette reads ``path`` for /-/databases.json and to name the database; it is only ever
    # set by Database.__init__, to the file given above.
    @property
    def path(self) -> str:
        return CATALOG_FILE

    @path.setter
    def path(self, value: str) -> None:
        self.file = Path(value).absolute()

    def suggest_name(self) -> str:
        return self.file.stem

    def connect(self, write: bool = False) -> sqlite3.Connection:
        if self.is_memory:
            return super().connect(write)
        if self.is_mutable:
            query = "?mode=ro" + ("&nolock=1" if self.ds.nolock else "")
        else:
            query = "?immutable=1"
        if write:
            query = ""
        conn = sqlite3.connect(self.file.as_uri() + query, uri=True, check_same_thread=False)
        self._all_file_connections.append(conn)
        return conn

    @property
    def size(self) -> int:
        try:
            return self.file.stat().st_size
        except OSError:
            return 0

    @property
    def mtime_ns(self) -> Optional[int]:
        try:
            return self.file.stat().st_mtime_ns
        except OSError:
            return None

    @property
    def hash(self) -> None:
        return None

    async def attached_databases(self) -> list:
        return []  # the guard refuses ATTACH: nothing is ever attached

    # ----------------------------------------------------------------------------------------
    # Connections

    def _connection(self) -> sqlite3.Connection:
        """This thread's connection to the catalog as it is now (see the module doc)."""
        held: Optional[sqlite3.Connection] = getattr(self._local, "conn", None)
        now = file_identity(self.file)
        if held is not None and (now is None or now == getattr(self._local, "identity", None)):
            return held
        # The identity is taken before connecting: a file replaced in between is seen at the next
        # call (one needless reopen), never taken for the file this connection reads.
        conn = self.connect()
        try:
            self.ds._prepare_connection(conn, self.name)
            if held is not None and not _has_tables(conn):
                self._forget(conn)  # a new catalog still being created: keep reading the old one
                return held
        except BaseException:
            self._forget(conn)
            raise
        if held is not None:
            logger.info("explorer: %s was replaced; reading the new file", self.file)
            self.reopened += 1
            self._forget(held)
        self._local.identity = now
        self._local.conn = conn
        return conn

    def _forget(self, conn: sqlite3.Connection) -> None:
        if getattr(self._local, "conn", None) is conn:
            self._local.conn = None
        try:
            self._all_file_connections.remove(conn)
        except ValueError:
            pass
        try:
            conn.close()
        except sqlite3.Error as exc:  # closing what is gone: nothing to keep
            logger.debug("explorer: closing a connection failed: %s", exc)

    async def _run(self, fn: Callable[[sqlite3.Connection], T], own: bool) -> T:
        def call() -> T:
            conn = self._connection()
            if not own:
                return fn(conn)
            with trusted(conn):
                return fn(conn)

        if self.ds.executor is None:
            return call()
        return await asyncio.get_running_loop().run_in_executor(self.ds.executor, call)

    async def execute_fn(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        return await self._run(fn, own=False)

    async def execute_trusted(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run the explorer's own ``fn(conn)`` (fixed SQL only: see :func:`.guard.trusted`)."""
        return await self._run(fn, own=True)

    async def execute(
        self,
        sql: str,
        params: Any = None,
        truncate: bool = False,
        custom_time_limit: Optional[int] = None,
        page_size: Optional[int] = None,
        log_sql_errors: bool = True,
    ) -> Results:
        """Datasette's ``execute``, with the rows fetched within :data:`.guard.LIMITS`
        ``.max_result_bytes`` (see the module doc)."""
        page_size = page_size or self.ds.page_size

        def run(conn: sqlite3.Connection) -> Results:
            limit_ms = self.ds.sql_time_limit_ms
            if custom_time_limit and custom_time_limit < limit_ms:
                limit_ms = custom_time_limit
            with bounded_steps(conn, limit_ms):
                try:
                    cursor = conn.cursor()
                    cursor.execute(sql, params if params is not None else {})
                    most = self.ds.max_returned_rows
                    if most == page_size:
                        most += 1
                    wanted = most + 1 if most and truncate else None
                    rows, cut = _fetch(cursor, wanted, LIMITS.max_result_bytes)
                    truncated = False
                    if wanted is not None and len(rows) > most:
                        rows, truncated = rows[:most], True
                    if cut:
                        if not truncate:
                            raise ResultTooLarge(
                                f"the result holds more than {LIMITS.max_result_bytes >> 20} MiB: "
                                "select fewer or shorter values"
                            )
                        truncated = True
                except (sqlite3.OperationalError, sqlite3.DatabaseError) as exc:
                    if exc.args == ("interrupted",):
                        raise QueryInterrupted(exc, sql, params) from exc
                    if log_sql_errors:
                        logger.warning("explorer: query failed: %s", exc)
                    raise
            return Results(rows, truncated, cursor.description)

        return await self.execute_fn(run)


# Between two checks of the progress handler: about 0.1 ms of work (Datasette checks as often).
STEPS_PER_CHECK = 1_000
# A query's work is bounded by its count of virtual-machine steps too, whatever the clock says
# (a loaded machine, a Datasette configured with a long time limit): at most this many a second
# of its time limit, several times what SQLite runs in a second here.
MAX_STEPS_PER_SECOND = 200_000_000


@contextmanager
def bounded_steps(conn: sqlite3.Connection, limit_ms: float) -> Iterator[None]:
    """Stop the statement run on ``conn`` inside the block once ``limit_ms`` have passed or it
    has run the steps that time allows (:data:`MAX_STEPS_PER_SECOND`): a progress handler that
    watches the clock and counts. SQLite reports the stop as "interrupted" (Datasette's "query
    took too long")."""
    deadline = time.perf_counter() + limit_ms / 1000
    checks_left = max(1, int(MAX_STEPS_PER_SECOND * max(limit_ms, 1) / 1000 / STEPS_PER_CHECK))
    calls = 0

    def handler() -> int:
        nonlocal calls
        calls += 1
        return 1 if calls > checks_left or time.perf_counter() >= deadline else 0

    conn.set_progress_handler(handler, STEPS_PER_CHECK)
    try:
        yield
    finally:
        conn.set_progress_handler(None, STEPS_PER_CHECK)


# What a catalog has once open_catalog is done with it: its tables, then the search index's.
_READY_TABLES = ("sessions", "search_meta")


def _has_tables(conn: sqlite3.Connection) -> bool:
    try:
        found = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    except sqlite3.Error:
        return False
    return all(name in found for name in _READY_TABLES)


def _fetch(cursor: sqlite3.Cursor, wanted: Optional[int], max_bytes: int) -> tuple[list, bool]:
    """Up to ``wanted`` rows (all when ``None``) while they hold at most ``max_bytes``; whether
    the byte bound cut the result."""
    rows: list = []
    size = 0
    while wanted is None or len(rows) < wanted:
        batch = cursor.fetchmany(64 if wanted is None else min(64, wanted - len(rows)))
        if not batch:
            break
        for row in batch:
            size += sum(len(v) if isinstance(v, (str, bytes)) else 8 for v in row)
            if size > max_bytes:
                return rows, True
            rows.append(row)
    return rows, False


def adopt_catalog(datasette: Any, name: str) -> Optional[CatalogDatabase]:
    """Replace the database ``name`` of ``datasette`` (a memstore catalog Datasette opened as a
    plain file) by a :class:`CatalogDatabase` of the same name, route and place; the one it
    already is is returned as it is. ``None`` for a database that is not a file."""
    db = datasette.databases.get(name)
    if isinstance(db, CatalogDatabase):
        return db
    if db is None or db.is_memory or not db.path:
        return None
    adopted = CatalogDatabase(datasette, db.path, is_mutable=db.is_mutable)
    adopted.name, adopted.route = db.name, db.route
    # Datasette reads ``databases`` without a lock: a new dict, swapped in whole, as it does.
    datasette.databases = type(datasette.databases)(
        (key, adopted if key == name else value) for key, value in datasette.databases.items()
    )
    db.close()
    return adopted
