"""What keeps a query in the explorer's Datasette from writing, from reading past the catalog, and
from hurting the other requests.

Every connection Datasette opens to a memstore catalog gets :func:`guard_connection`:

- **Read-only**: ``PRAGMA query_only``; no ``ATTACH``/``DETACH`` (a query could otherwise read a
  session index or any file on disk), no ``fts3_tokenizer()`` (it hands out and takes pointers
  into the process) or ``load_extension()``.
- **No store path**: ``PRAGMA database_list`` (and ``pragma_database_list``) names the absolute
  file, so the home directory of whoever runs the server; it is refused to queries from the
  outside. The explorer's own code, which needs it to find the search index's cache, runs
  inside :func:`trusted`.
- **Bounded values**: ``SQLITE_LIMIT_LENGTH`` caps every string or blob a query builds or reads at
  :data:`LIMITS` ``.max_value_bytes`` (the catalog's own values are a few KB; the search index's
  blobs are read by the explorer's code only, inside :func:`trusted`, with SQLite's default
  limit), ``LIKE``/``GLOB`` patterns and the statement's length are capped too.
- **printf/format checked first**: ``printf('%.*c', 900000000, 'x')`` is one function call, so no
  time limit can stop it (SQLite's progress handler runs between steps) and SQLite keeps writing
  past the length limit before it gives up. Both are replaced by a version that bounds the output
  from the format and the arguments (:mod:`memstore.sql`'s bound) and refuses at once what could
  pass ``max_value_bytes`` (SQLite's "string or blob too big").
- **Bounded memory**: ``PRAGMA hard_heap_limit`` caps SQLite's heap in this process (it is only
  ever lowered, never raised, as :mod:`memstore.sql` does).

Time per query is Datasette's ``sql_time_limit_ms``, enforced by a progress handler that also
counts steps, and the size of a result is bounded as rows are fetched: both by
:class:`memstore.explorer.database.CatalogDatabase`.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Optional

from ..sql import QueryLimits, _printf_bound

# The bounds of a query from the outside (Datasette's SQL editor, its table pages' _where=).
LIMITS = QueryLimits(
    max_rows=1_000,
    max_seconds=1.0,
    max_result_bytes=32 << 20,
    max_value_bytes=1 << 20,
    max_sql_chars=100_000,
    max_like_pattern_bytes=1_000,
    heap_limit_bytes=512 << 20,
)
# What the explorer's own queries may read: the search index's blobs (postings, segment arrays)
# run to megabytes on a large store.
TRUSTED_VALUE_BYTES = 1_000_000_000

_SQLITE_ATTACH = getattr(sqlite3, "SQLITE_ATTACH", 24)
_SQLITE_DETACH = getattr(sqlite3, "SQLITE_DETACH", 25)
_SQLITE_FUNCTION = getattr(sqlite3, "SQLITE_FUNCTION", 31)
_SQLITE_PRAGMA = getattr(sqlite3, "SQLITE_PRAGMA", 19)
_DENIED_FUNCTIONS = frozenset({"fts3_tokenizer", "load_extension"})
_PATH_PRAGMAS = frozenset({"database_list"})

_local = threading.local()


def is_trusted() -> bool:
    """Whether the current thread runs the explorer's own code (see :func:`trusted`)."""
    return bool(getattr(_local, "trusted", False))


@contextmanager
def trusted(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """Run the explorer's own queries on ``conn``: fixed SQL with bound parameters, allowed the
    store path (the search index's cache is keyed by it) and values as long as SQLite's
    default; the guards come back when the block ends, whatever happens in it."""
    before = getattr(_local, "trusted", False)
    _local.trusted = True
    conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, TRUSTED_VALUE_BYTES)
    try:
        yield conn
    finally:
        conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, LIMITS.max_value_bytes)
        _local.trusted = before


def _authorizer(
    action: int, arg1: Optional[str], arg2: Optional[str], dbname: Optional[str], source: Optional[str]
) -> int:
    if action in (_SQLITE_ATTACH, _SQLITE_DETACH):
        return sqlite3.SQLITE_DENY
    if action == _SQLITE_FUNCTION and isinstance(arg2, str) and arg2.lower() in _DENIED_FUNCTIONS:
        return sqlite3.SQLITE_DENY
    if action == _SQLITE_PRAGMA and isinstance(arg1, str) and arg1.lower() in _PATH_PRAGMAS and not is_trusted():
        return sqlite3.SQLITE_DENY
    return sqlite3.SQLITE_OK


def guard_connection(conn: sqlite3.Connection, limits: QueryLimits = LIMITS) -> None:
    """Apply the guards of the module doc to a connection to a memstore catalog."""
    conn.execute("PRAGMA query_only = 1")
    conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, limits.max_value_bytes)
    conn.setlimit(sqlite3.SQLITE_LIMIT_SQL_LENGTH, max(limits.max_sql_chars * 4, 1_000))
    conn.setlimit(sqlite3.SQLITE_LIMIT_LIKE_PATTERN_LENGTH, limits.max_like_pattern_bytes)
    conn.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)
    _guard_printf(conn, limits.max_value_bytes)
    if limits.heap_limit_bytes is not None:
        current = conn.execute("PRAGMA hard_heap_limit").fetchone()[0]
        if current == 0 or current > limits.heap_limit_bytes:
            conn.execute(f"PRAGMA hard_heap_limit = {int(limits.heap_limit_bytes)}")
    conn.set_authorizer(_authorizer)


def _guard_printf(conn: sqlite3.Connection, max_bytes: int) -> None:
    """``printf`` and ``format`` on ``conn`` bounded before they run: an output that could pass
    ``max_bytes`` raises ``OverflowError`` (which SQLite reports as "string or blob too big"),
    anything else is SQLite's own ``printf``, run in a private in-memory database with the same
    length limit."""
    private = sqlite3.connect(":memory:", check_same_thread=False)
    private.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, max_bytes)
    lock = threading.Lock()  # the private connection is this connection's, whichever thread runs it

    def guarded(*args: Any) -> Any:
        if not args:
            return None
        if _printf_bound(args) > max_bytes:
            raise OverflowError(f"printf()/format() output could pass {max_bytes} bytes")
        with lock:
            try:
                return private.execute(f"SELECT printf({', '.join('?' * len(args))})", args).fetchone()[0]
            except sqlite3.DataError as exc:
                raise OverflowError(str(exc)) from None

    conn.create_function("printf", -1, guarded)
    conn.create_function("format", -1, guarded)
