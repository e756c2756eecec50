"""Read-only SQL over a SQLite database (the catalog, above all) for callers that must not be
trusted: an agent through MCP, a person in the explorer.

:func:`run_query` runs one statement and guarantees:

- **Nothing is written.** The database is opened ``mode=ro`` with ``PRAGMA query_only=1``, and
  an authorizer allows only reading (``SELECT``, reads of columns, functions, recursive CTEs and
  a few introspection pragmas such as ``table_info``). ``INSERT``/``UPDATE``/``DELETE``, DDL,
  ``ATTACH``/``DETACH`` (``VACUUM INTO`` attaches), transactions and every other pragma are
  refused with a :class:`QueryError` that says what was refused. ``SQLITE_LIMIT_ATTACHED`` is 0
  besides.
- **Bounded time.** A progress handler stops the statement once ``max_seconds`` have passed.
  It runs between virtual-machine steps, so a single function call is not interrupted: values
  are capped at ``max_value_bytes`` (``SQLITE_LIMIT_LENGTH``), ``LIKE``/``GLOB`` patterns at
  ``max_like_pattern_bytes``, and ``printf``/``format``, whose ``%.*c`` repeats a character in
  one call for as long as asked (SQLite keeps looping after the length limit, then returns
  NULL), are checked before they run: output that could pass the length limit is an error.
- **Bounded result.** At most ``max_rows`` rows and ``max_result_bytes`` bytes of values come
  back; the result says when and why it was cut (``truncated``). A huge ``LIMIT`` in the SQL is
  harmless: rows past the bound are never fetched.
- **Bounded memory.** ``PRAGMA hard_heap_limit`` caps SQLite's heap at ``heap_limit_bytes``. That
  limit is process-wide (one SQLite library per process): it is only ever lowered, never
  raised, so a stricter limit someone else set stays.
- **Redaction that SQL cannot get around.** A :class:`ReadPolicy` names the free-text columns
  that may hold secrets. Each table holding one is shadowed, for this connection only, by a
  ``TEMP`` view of the same name that passes those columns through ``redact``, and the
  database's own views are recreated over them: ``WHERE text LIKE 'ghp_%'``, ``substr()`` or
  ``hex()`` see the redacted text, never the secret. Reading such a column any other way
  (``main.chunks``, a view of the database named with ``main.``) is refused, as is any read of
  a hidden table (search postings and the FTS index hold the raw words). A catalog chunk is
  redacted together with its neighbours (:func:`redact_chunk`): a secret that chunking cut in
  two is still found. Every text value of
  the result (and every column name) goes through ``redact`` too.

:func:`query_catalog` applies this to a store's ``catalog.db`` with the store's redactor, the
pricing SQL functions (``memstore_cost_usd`` ...) and :func:`catalog_policy`.
"""

from __future__ import annotations

import base64
import errno
import fnmatch
import json
import logging
import os
import re
import sqlite3
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Optional, Union

from .errors import MemstoreError, StoreIOError
from .redact import Redactor, marker
from .views.memory_view import FACT_CHARS

logger = logging.getLogger(__name__)

__all__ = (
    "CATALOG_HIDDEN_TABLES",
    "CATALOG_REDACTED_COLUMNS",
    "QueryError",
    "QueryErrorKind",
    "QueryLimits",
    "QueryResult",
    "ReadPolicy",
    "catalog_policy",
    "catalog_uri",
    "query_catalog",
    "redact_chunk",
    "redact_fact",
    "run_query",
)

Params = Union[Sequence[Any], Mapping[str, Any]]

# Tables of the catalog nobody reads through SQL: the BM25 postings and the FTS5 index hold the
# raw words of every chunk (a secret among them), and catalog_state the raw last bytes of each log.
CATALOG_HIDDEN_TABLES = ("search_*", "chunks_fts*", "catalog_state")
# The catalog's free-text columns: what the agent or the user wrote. Everything else is ids,
# counts, times, statuses, tool names and paths (redacted in the result, like every value).
CATALOG_REDACTED_COLUMNS: Mapping[str, tuple[str, ...]] = {
    "chunks": ("text",),
    "events": ("name",),
    "turns": ("error",),
    "sessions": ("title",),
}

_REDACT_FUNCTION = "memstore_redact"
_MAX_PARAMS = 100
_PROGRESS_STEPS = 1_000
# Pragmas that only describe the schema, allowed with a name as their argument.
_INTROSPECTION_PRAGMAS = frozenset(
    {
        "table_info",
        "table_xinfo",
        "table_list",
        "index_list",
        "index_info",
        "index_xinfo",
        "foreign_key_list",
        "function_list",
        "collation_list",
        "pragma_list",
        "module_list",
    }
)


class QueryErrorKind(str, Enum):
    """Why a query did not run to the end."""

    REFUSED = "refused"  # it writes, attaches, or reads what the policy hides
    INVALID = "invalid"  # not one valid statement, bad parameters
    TIME_LIMIT = "time_limit"  # ran past max_seconds
    TOO_LARGE = "too_large"  # a value past max_value_bytes, a statement past max_sql_chars
    MEMORY = "memory"  # SQLite's heap limit was reached
    UNAVAILABLE = "unavailable"  # the database cannot be opened or read


class QueryError(MemstoreError, ValueError):
    """A query that was refused or stopped; ``kind`` says why, the message says what to change."""

    def __init__(self, kind: QueryErrorKind, message: str):
        self.kind = kind
        super().__init__(message)


@dataclass(frozen=True)
class QueryLimits:
    """The bounds of one query (see the module doc). Each must be positive."""

    max_rows: int = 100
    max_seconds: float = 5.0
    max_result_bytes: int = 512 * 1024
    max_value_bytes: int = 1 << 20
    max_sql_chars: int = 20_000
    max_like_pattern_bytes: int = 1_000
    heap_limit_bytes: Optional[int] = 512 << 20

    def __post_init__(self) -> None:
        for name in ("max_rows", "max_result_bytes", "max_value_bytes", "max_sql_chars", "max_like_pattern_bytes"):
            value = getattr(self, name)
            if type(value) is not int or value <= 0:
                raise ValueError(f"QueryLimits.{name} must be a positive int, not {value!r}")
        if not isinstance(self.max_seconds, (int, float)) or not 0 < self.max_seconds < 86_400:
            raise ValueError(f"QueryLimits.max_seconds must be a positive number of seconds, not {self.max_seconds!r}")
        if self.heap_limit_bytes is not None and (type(self.heap_limit_bytes) is not int or self.heap_limit_bytes <= 0):
            raise ValueError(
                f"QueryLimits.heap_limit_bytes must be a positive int or None, not {self.heap_limit_bytes!r}"
            )


@dataclass(frozen=True)
class ReadPolicy:
    """What a query may read: no table matching a ``hidden_tables`` pattern (``fnmatch``), and
    the ``redacted_columns`` (table -> columns) only through ``redact``, which also applies to
    every text value and column name of the result. Without ``redact`` nothing is redacted and
    ``redacted_columns`` is ignored.

    ``column_sql`` may give, for a redacted ``"table.column"``, the SQL expression that reads it
    instead of ``memstore_redact(_r."column")`` (``_r`` is the table's row; the expression may
    read the table again, e.g. a row's neighbours); ``functions(conn)`` registers the SQL
    functions those expressions call."""

    hidden_tables: tuple[str, ...] = ()
    redacted_columns: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    redact: Optional[Callable[[str], str]] = None
    column_sql: Mapping[str, str] = field(default_factory=dict)
    functions: Optional[Callable[[sqlite3.Connection], None]] = None

    def hides(self, table: Optional[str]) -> bool:
        return table is not None and any(fnmatch.fnmatchcase(table.lower(), p.lower()) for p in self.hidden_tables)


@dataclass
class QueryResult:
    """Rows of one query. ``truncated`` is ``None`` when every row came back, else ``"rows"`` or
    ``"bytes"``: the bound that cut it (more rows exist). Values are SQLite's: ``None``, ``int``,
    ``float``, ``str`` or ``bytes``."""

    columns: list[str]
    rows: list[list[Any]]
    truncated: Optional[str]
    elapsed_ms: float
    result_bytes: int

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: a blob becomes ``{"base64": ..., "bytes": n}``."""
        rows = [[_json_value(v) for v in row] for row in self.rows]
        return {
            "columns": self.columns,
            "rows": rows,
            "row_count": len(rows),
            "truncated": self.truncated,
            "elapsed_ms": round(self.elapsed_ms, 1),
        }


def _json_value(value: Any) -> Any:
    if isinstance(value, bytes):
        return {"base64": base64.b64encode(value).decode("ascii"), "bytes": len(value)}
    return value


# --------------------------------------------------------------------------------------------
# Running a query


def run_query(
    database: Union[str, os.PathLike[str]],
    sql: str,
    params: Params = (),
    *,
    limits: QueryLimits = QueryLimits(),
    policy: ReadPolicy = ReadPolicy(),
    functions: Optional[Callable[[sqlite3.Connection], None]] = None,
) -> QueryResult:
    """Run the one statement ``sql`` (with ``params``, positional or named) on ``database`` (a
    path, or a ``file:`` URI) read-only, within ``limits`` and ``policy``; see the module doc.
    ``functions(conn)`` may register SQL functions first. Raises :class:`QueryError`."""
    _check_sql(sql, limits)
    bound = _check_params(params)
    state = _State()
    conn = _connect(database)
    try:
        _prepare(conn, limits, policy, state, functions)
        started = time.monotonic()
        deadline = started + float(limits.max_seconds)
        conn.set_progress_handler(lambda: 1 if time.monotonic() > deadline else 0, _PROGRESS_STEPS)
        conn.set_authorizer(_authorizer(policy, state, _first_keyword(sql) in _READING_KEYWORDS))
        try:
            cursor = conn.execute(sql, bound)
            columns = [d[0] for d in cursor.description or ()]
            rows, size, truncated = _fetch(cursor, limits, policy)
        except sqlite3.Error as exc:
            raise _translate(exc, state, limits, policy, time.monotonic() > deadline) from None
        except MemoryError:
            raise QueryError(
                QueryErrorKind.MEMORY,
                f"the query needed more memory than the {_mib(limits.heap_limit_bytes)} "
                "SQLite may use: aggregate or filter more",
            ) from None
        elapsed = (time.monotonic() - started) * 1000
    finally:
        conn.close()
        for other in state.closing:
            other.close()
    if policy.redact is not None:
        columns = [policy.redact(c) for c in columns]
    return QueryResult(columns, rows, truncated, elapsed, size)


class _State:
    """What the callbacks saw: the first refusal (the authorizer can only say "not authorized")
    and the reason a guarded function raised."""

    def __init__(self) -> None:
        self.refusal: Optional[str] = None
        self.function_error: Optional[QueryError] = None
        self.closing: list[sqlite3.Connection] = []


def _check_sql(sql: Any, limits: QueryLimits) -> None:
    if not isinstance(sql, str):
        raise QueryError(QueryErrorKind.INVALID, f"the query must be a string, not {type(sql).__name__}")
    if not sql.strip():
        raise QueryError(QueryErrorKind.INVALID, "the query is empty")
    if len(sql) > limits.max_sql_chars:
        raise QueryError(
            QueryErrorKind.TOO_LARGE, f"the query is {len(sql)} characters long; the limit is {limits.max_sql_chars}"
        )
    if "\0" in sql:
        raise QueryError(QueryErrorKind.INVALID, "the query contains a NUL character")
    keyword = _first_keyword(sql)
    if keyword in _WRITING_KEYWORDS:
        raise QueryError(
            QueryErrorKind.REFUSED,
            f"refused: {keyword} is not allowed: only SELECT statements run here (the database is read-only)",
        )


# Statements refused by their first word, before SQLite sees them, so the error names the cause
# (a write to a table that the policy shadows with a view would otherwise be "cannot modify a
# view"). The authorizer refuses what gets past this (a write inside WITH ...).
_WRITING_KEYWORDS = frozenset(
    {
        "INSERT",
        "UPDATE",
        "DELETE",
        "REPLACE",
        "UPSERT",
        "CREATE",
        "DROP",
        "ALTER",
        "ATTACH",
        "DETACH",
        "VACUUM",
        "REINDEX",
        "ANALYZE",
        "BEGIN",
        "COMMIT",
        "END",
        "ROLLBACK",
        "SAVEPOINT",
        "RELEASE",
    }
)
_READING_KEYWORDS = frozenset({"SELECT", "WITH", "VALUES", "EXPLAIN"})
_LEADING = re.compile(r"(?:\s+|--[^\n]*(?:\n|\Z)|/\*.*?(?:\*/|\Z)|\()*", re.DOTALL)
_WORD = re.compile(r"[A-Za-z]+")


def _first_keyword(sql: str) -> str:
    """The statement's first word, upper-cased, past whitespace, comments and parentheses."""
    match = _WORD.match(sql, _LEADING.match(sql).end())  # type: ignore[union-attr]
    return match.group().upper() if match else ""


def _check_params(params: Any) -> Params:
    if isinstance(params, Mapping):
        values: Iterable[Any] = params.values()
        if not all(isinstance(k, str) for k in params):
            raise QueryError(QueryErrorKind.INVALID, "named parameters need string names")
    elif isinstance(params, (list, tuple)):
        values = params
    else:
        raise QueryError(QueryErrorKind.INVALID, f"parameters must be a list or an object, not {type(params).__name__}")
    values = list(values)
    if len(values) > _MAX_PARAMS:
        raise QueryError(QueryErrorKind.INVALID, f"at most {_MAX_PARAMS} parameters (got {len(values)})")
    for value in values:
        if value is not None and type(value) not in (str, int, float, bool):
            raise QueryError(
                QueryErrorKind.INVALID,
                f"a parameter must be a string, a number, a boolean or null, not {type(value).__name__}",
            )
        if type(value) is int and not -(2**63) <= value < 2**63:
            raise QueryError(QueryErrorKind.INVALID, f"the integer parameter {value} does not fit SQLite's 64 bits")
    return params


def _connect(database: Union[str, os.PathLike[str]]) -> sqlite3.Connection:
    text = os.fspath(database)
    uri = text if text.startswith("file:") else f"{Path(text).absolute().as_uri()}?mode=ro"
    if "mode=ro" not in uri:
        raise QueryError(QueryErrorKind.INVALID, f"{text}: a database URI must say mode=ro")
    try:
        conn = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=True)
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()  # opening is lazy: fail here
    except sqlite3.Error as exc:
        raise QueryError(QueryErrorKind.UNAVAILABLE, f"cannot open {text} read-only: {exc}") from None
    return conn


def _prepare(
    conn: sqlite3.Connection,
    limits: QueryLimits,
    policy: ReadPolicy,
    state: _State,
    functions: Optional[Callable[[sqlite3.Connection], None]],
) -> None:
    """Limits, functions and the redacting TEMP views, before the authorizer is set (the views
    are this connection's own: creating them writes nothing to the database)."""
    conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, limits.max_value_bytes)
    conn.setlimit(sqlite3.SQLITE_LIMIT_SQL_LENGTH, max(limits.max_sql_chars * 4, 1_000))
    conn.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)
    conn.setlimit(sqlite3.SQLITE_LIMIT_LIKE_PATTERN_LENGTH, limits.max_like_pattern_bytes)
    if functions is not None:
        functions(conn)
    _guard_printf(conn, limits.max_value_bytes, state)
    try:
        if policy.redact is not None:
            redact = policy.redact
            conn.create_function(
                _REDACT_FUNCTION, 1, lambda v: redact(v) if isinstance(v, str) else v, deterministic=True
            )
            if policy.functions is not None:
                policy.functions(conn)
            _shadow_redacted_tables(conn, policy)
        conn.execute("PRAGMA query_only = 1")
        if limits.heap_limit_bytes is not None:
            current = conn.execute("PRAGMA hard_heap_limit").fetchone()[0]
            if current == 0 or current > limits.heap_limit_bytes:
                conn.execute(f"PRAGMA hard_heap_limit = {int(limits.heap_limit_bytes)}")
        conn.execute("BEGIN")  # one snapshot for the whole statement
    except sqlite3.Error as exc:
        raise QueryError(QueryErrorKind.UNAVAILABLE, f"cannot prepare the database for reading: {exc}") from None


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _shadow_redacted_tables(conn: sqlite3.Connection, policy: ReadPolicy) -> None:
    """A TEMP view per table with redacted columns, of the same name (TEMP names are looked up
    first), and the database's views again as TEMP views, so that they read the redacted ones."""
    tables = {row[0] for row in conn.execute("SELECT name FROM main.sqlite_master WHERE type = 'table'")}
    for table, redacted in policy.redacted_columns.items():
        if table not in tables:
            continue
        columns = [row[1] for row in conn.execute(f"PRAGMA main.table_info({_quote(table)})")]
        select = ", ".join(
            f"{policy.column_sql.get(f'{table}.{c}', f'{_REDACT_FUNCTION}(_r.{_quote(c)})')} AS {_quote(c)}"
            if c in redacted
            else f"_r.{_quote(c)}"
            for c in columns
        )
        conn.execute(f"CREATE TEMP VIEW {_quote(table)} AS SELECT {select} FROM main.{_quote(table)} AS _r")
    for name, sql in conn.execute("SELECT name, sql FROM main.sqlite_master WHERE type = 'view'").fetchall():
        match = re.match(r"CREATE\s+VIEW\s+", sql or "", re.IGNORECASE)
        if match is None:
            continue
        try:
            conn.execute("CREATE TEMP VIEW " + sql[match.end() :])
        except sqlite3.Error as exc:  # a view this policy cannot shadow: reading it is refused instead
            logger.info("sql: view %s is not shadowed (%s); reading it through main is refused", name, exc)


def _authorizer(policy: ReadPolicy, state: _State, reading: bool) -> Callable[..., int]:
    """The authorizer of one statement; ``reading``: it starts with SELECT, WITH, VALUES or
    EXPLAIN."""
    redacted = (
        {t.lower(): {c.lower() for c in cols} for t, cols in policy.redacted_columns.items()}
        if policy.redact is not None
        else {}
    )

    def refuse(reason: str) -> int:
        if state.refusal is None:
            state.refusal = reason
        return sqlite3.SQLITE_DENY

    def authorize(
        action: int, arg1: Optional[str], arg2: Optional[str], database: Optional[str], source: Optional[str]
    ) -> int:
        if action in (sqlite3.SQLITE_SELECT, sqlite3.SQLITE_FUNCTION, sqlite3.SQLITE_RECURSIVE):
            return sqlite3.SQLITE_OK
        if action == sqlite3.SQLITE_READ:
            if policy.hides(arg1):
                return refuse(
                    f"table {arg1} is not readable through SQL (it holds raw text the redaction cannot cover)"
                )
            columns = redacted.get((arg1 or "").lower())
            if (
                columns
                and (arg2 or "").lower() in columns
                and database == "main"
                and (source or "").lower() != (arg1 or "").lower()
            ):
                return refuse(
                    f"{arg1}.{arg2} is free text, readable only as redacted: name the table {arg1} "
                    f"(and the views) without 'main.'"
                )
            return sqlite3.SQLITE_OK
        if action == sqlite3.SQLITE_PRAGMA:
            if (arg1 or "").lower() in _INTROSPECTION_PRAGMAS:
                return sqlite3.SQLITE_OK
            return refuse(
                f"PRAGMA {arg1} is not allowed (read-only queries; allowed pragmas: "
                f"{', '.join(sorted(_INTROSPECTION_PRAGMAS))})"
            )
        if action in (sqlite3.SQLITE_ATTACH, sqlite3.SQLITE_DETACH):
            return refuse("ATTACH and DETACH are not allowed (VACUUM INTO attaches too): only this database is read")
        if action == sqlite3.SQLITE_UPDATE and reading and arg1 == "sqlite_master" and database == "main":
            # SQLite asks this while it sets up a pragma function (SELECT ... FROM pragma_table_info(..)),
            # which writes nothing; mode=ro and query_only refuse any real write in any case.
            return sqlite3.SQLITE_OK
        if action in (sqlite3.SQLITE_INSERT, sqlite3.SQLITE_UPDATE, sqlite3.SQLITE_DELETE):
            return refuse("the query would write: only SELECT statements run here (the database is read-only)")
        if action in (sqlite3.SQLITE_TRANSACTION, sqlite3.SQLITE_SAVEPOINT):
            return refuse("transaction statements are not allowed: each query runs alone, read-only")
        return refuse(f"{_action_name(action)} is not allowed: only SELECT statements run here (read-only)")

    return authorize


def _action_name(action: int) -> str:
    for name in dir(sqlite3):
        if (
            name.startswith("SQLITE_")
            and getattr(sqlite3, name) == action
            and name not in ("SQLITE_OK", "SQLITE_DENY", "SQLITE_IGNORE")
        ):
            return name[len("SQLITE_") :].replace("_", " ")
    return f"action {action}"


def _fetch(
    cursor: sqlite3.Cursor, limits: QueryLimits, policy: ReadPolicy
) -> tuple[list[list[Any]], int, Optional[str]]:
    rows: list[list[Any]] = []
    size = 0
    redact = policy.redact
    while True:
        batch = cursor.fetchmany(min(256, limits.max_rows + 1 - len(rows)))
        if not batch:
            return rows, size, None
        for raw in batch:
            if len(rows) == limits.max_rows:
                return rows, size, "rows"
            row = [redact(v) if redact is not None and isinstance(v, str) else v for v in raw]
            row_size = sum(_value_size(v) for v in row)
            if size + row_size > limits.max_result_bytes:
                return rows, size, "bytes"
            rows.append(row)
            size += row_size


def _value_size(value: Any) -> int:
    if isinstance(value, str):
        return len(value.encode("utf-8", "surrogatepass"))
    if isinstance(value, bytes):
        return len(value)
    return 8


def _mib(n: Optional[int]) -> str:
    return "unbounded memory" if n is None else f"{n / (1 << 20):g} MiB"


def _translate(exc: sqlite3.Error, state: _State, limits: QueryLimits, policy: ReadPolicy, late: bool) -> QueryError:
    message = str(exc)
    if state.function_error is not None:
        return state.function_error
    if state.refusal is not None and ("not authorized" in message or "prohibited" in message):
        return QueryError(QueryErrorKind.REFUSED, f"refused: {state.refusal}")
    if message == "not authorized":  # SQLite's own refusal: load_extension() is disabled, say
        return QueryError(QueryErrorKind.REFUSED, "refused: SQLite does not allow this here (not authorized)")
    constructor = re.match(r"vtable constructor failed: (\S+)", message)
    if constructor is not None and policy.hides(constructor.group(1)):
        return QueryError(
            QueryErrorKind.REFUSED,
            f"refused: table {constructor.group(1)} is not readable through SQL "
            "(it holds raw text the redaction cannot cover)",
        )
    if re.match(r"cannot modify \S+ because it is a view", message):
        return QueryError(
            QueryErrorKind.REFUSED,
            "refused: the query would write: only SELECT statements run here (the database is read-only)",
        )
    if isinstance(exc, sqlite3.OperationalError) and message == "interrupted" and late:
        return QueryError(
            QueryErrorKind.TIME_LIMIT,
            f"the query ran longer than {limits.max_seconds:g} s and was "
            "stopped: add a WHERE clause, a LIMIT, or aggregate",
        )
    if "string or blob too big" in message:
        return QueryError(
            QueryErrorKind.TOO_LARGE,
            f"a value of the query would exceed {limits.max_value_bytes} bytes (string or blob too big)",
        )
    if "LIKE or GLOB pattern too complex" in message:
        return QueryError(
            QueryErrorKind.TOO_LARGE, f"a LIKE or GLOB pattern is longer than {limits.max_like_pattern_bytes} bytes"
        )
    if isinstance(exc, sqlite3.ProgrammingError) and "one statement" in message:
        return QueryError(QueryErrorKind.INVALID, "only one statement per query (remove what follows the first ';')")
    if "attempt to write a readonly database" in message or "readonly" in message:
        return QueryError(QueryErrorKind.REFUSED, f"refused: the query would write ({message})")
    if isinstance(exc, (sqlite3.ProgrammingError, sqlite3.InterfaceError)):
        return QueryError(QueryErrorKind.INVALID, f"invalid query or parameters: {message}")
    if isinstance(exc, sqlite3.DatabaseError) and getattr(exc, "sqlite_errorcode", None) in (
        getattr(sqlite3, "SQLITE_CORRUPT", 11),
        getattr(sqlite3, "SQLITE_NOTADB", 26),
        getattr(sqlite3, "SQLITE_IOERR", 10),
        getattr(sqlite3, "SQLITE_CANTOPEN", 14),
    ):
        return QueryError(QueryErrorKind.UNAVAILABLE, f"the database cannot be read: {message}")
    if getattr(exc, "sqlite_errorcode", None) == getattr(sqlite3, "SQLITE_NOMEM", 7):
        return QueryError(
            QueryErrorKind.MEMORY,
            f"the query needed more memory than the {_mib(limits.heap_limit_bytes)} "
            "SQLite may use: aggregate or filter more",
        )
    return QueryError(QueryErrorKind.INVALID, f"invalid query: {message}")


# --------------------------------------------------------------------------------------------
# printf / format


# One conversion of SQLite's printf: flags, width, precision, length modifiers, type.
_SPEC = re.compile(r"%([-+ 0#!,]*)(\*|\d+)?(?:\.(\*|\d*))?(l{0,2})(.?)", re.DOTALL)
_NO_ARGUMENT = frozenset("%n")


def _guard_printf(conn: sqlite3.Connection, max_bytes: int, state: _State) -> None:
    """Replace ``printf`` and ``format`` on ``conn`` by a version that first bounds the output
    from the format and the arguments, raises a clear error when it could pass ``max_bytes``,
    and otherwise runs SQLite's own ``printf`` (in a private in-memory database, with the same
    length limit)."""
    private = sqlite3.connect(":memory:", check_same_thread=False)
    private.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, max_bytes)
    state.closing.append(private)

    def guarded(*args: Any) -> Any:
        if not args:
            return None
        bound = _printf_bound(args)
        if bound > max_bytes:
            state.function_error = QueryError(
                QueryErrorKind.TOO_LARGE,
                f"printf()/format() could produce about {bound} bytes (its width or precision), over the limit of "
                f"{max_bytes} bytes per value",
            )
            raise ValueError(str(state.function_error))
        placeholders = ", ".join("?" * len(args))
        try:
            result = private.execute(f"SELECT printf({placeholders})", args).fetchone()[0]
        except sqlite3.Error as exc:
            state.function_error = QueryError(QueryErrorKind.TOO_LARGE, f"printf()/format() failed: {exc}")
            raise
        if result is None and isinstance(args[0], str):
            state.function_error = QueryError(
                QueryErrorKind.TOO_LARGE, f"printf()/format() output passed the limit of {max_bytes} bytes per value"
            )
            raise ValueError(str(state.function_error))
        return result

    conn.create_function("printf", -1, guarded)
    conn.create_function("format", -1, guarded)


def _printf_bound(args: Sequence[Any]) -> int:
    """An upper bound on the bytes ``printf(*args)`` writes: the format's text, plus for each
    conversion its width, its precision and twice its argument's text (``%q`` doubles quotes),
    plus a margin for signs, separators and exponents."""
    fmt = args[0]
    if not isinstance(fmt, str):
        return len(str(fmt)) if fmt is not None else 0
    rest = list(args[1:])
    total = 0
    pos = 0

    def take() -> Any:
        return rest.pop(0) if rest else None

    def number(text: Optional[str]) -> int:
        if text == "*":
            value = take()
            try:
                return abs(int(value)) if value is not None else 0
            except (TypeError, ValueError, OverflowError):
                return 0
        return int(text) if text else 0

    for match in _SPEC.finditer(fmt):
        total += match.start() - pos
        pos = match.end()
        width = number(match.group(2))
        precision = number(match.group(3)) if match.group(3) is not None else 0
        kind = match.group(5)
        argument = None if kind in _NO_ARGUMENT or not kind else take()
        text = len(str(argument).encode("utf-8", "surrogatepass")) if argument is not None else 0
        total += width + precision + 2 * text + 64
    return total + len(fmt) - pos


# --------------------------------------------------------------------------------------------
# The catalog


def catalog_policy(redactor: Redactor) -> ReadPolicy:
    """The policy for a store's catalog: the search index and FTS tables hidden, the free-text
    columns (:data:`CATALOG_REDACTED_COLUMNS`) redacted; a chunk's text with its neighbours of
    the same event (see :func:`redact_chunk`)."""

    def functions(conn: sqlite3.Connection) -> None:
        def chunk(source: Any, part: Any, start_line: Any, end_line: Any, text: Any, neighbours: Any) -> Any:
            if not isinstance(text, str):
                return text
            others = [tuple(row) for row in json.loads(neighbours)] if isinstance(neighbours, str) else []
            return redact_chunk(
                redactor, text, source=source, part=part, start_line=start_line, end_line=end_line, neighbours=others
            )

        conn.create_function("memstore_redact_chunk", 6, chunk, deterministic=True)

    return ReadPolicy(
        CATALOG_HIDDEN_TABLES,
        dict(CATALOG_REDACTED_COLUMNS),
        redactor.redact_text,
        {"chunks.text": _CHUNK_TEXT_SQL},
        functions,
    )


# The neighbours of a chunk that has any (a part before it, or a part 1 after part 0): one
# index lookup on (session_id, seq); most chunks are an event's only part and cost one probe.
_CHUNK_TEXT_SQL = (
    "memstore_redact_chunk(_r.source, _r.part, _r.start_line, _r.end_line, _r.text, "
    "CASE WHEN _r.part > 0 OR EXISTS (SELECT 1 FROM main.chunks n WHERE n.session_id = _r.session_id "
    "AND n.seq = _r.seq AND n.part = _r.part + 1) THEN (SELECT json_group_array(json_array(n.part, n.start_line, "
    "n.end_line, n.text)) FROM main.chunks n WHERE n.session_id = _r.session_id AND n.seq = _r.seq "
    "AND n.part IN (_r.part - 1, _r.part + 1)) END)"
)


def redact_chunk(
    redactor: Redactor,
    text: str,
    *,
    source: Optional[str] = None,
    part: Optional[int] = None,
    start_line: Optional[int] = None,
    end_line: Optional[int] = None,
    neighbours: Sequence[tuple[int, int, int, str]] = (),
) -> str:
    """A catalog chunk's ``text``, redacted, so that no part of a secret survives.

    A long event is split into chunks of 40 lines or 2,000 characters, a long line even in
    mid-line, so a secret may straddle two chunks and each piece alone may not be recognizable:
    the chunk is redacted joined with its ``neighbours`` (``(part, start_line, end_line,
    text)`` of the parts just before and after it), and a secret that reaches into it from
    either side is replaced too. A memory fact (``source == "session"``) cut by the memory view
    (177 characters and ``...``) may end in the start of a secret: its last word is dropped."""
    if source == "session":
        return redact_fact(redactor, text)
    if part is None or not neighbours:
        return redactor.redact_text(text)
    rows = sorted(
        [row for row in neighbours if row[0] != part] + [(part, start_line, end_line, text)], key=lambda row: row[0]
    )
    joined, start, end, last_line = "", 0, 0, None
    for number, first_line, line, piece in rows:
        if joined:
            joined += "" if first_line == last_line else "\n"  # a line cut in pieces, or the next line
        if number == part:
            start, end = len(joined), len(joined) + len(piece)
        joined += piece
        last_line = line
    return _redact_span(redactor, joined, start, end)


def _redact_span(redactor: Redactor, text: str, start: int, end: int) -> str:
    """``text[start:end]`` with every secret of ``text`` that overlaps it replaced by its marker
    (a secret reaching in from outside the span included)."""
    out, position = [], start
    for found in redactor.findings(text):
        if found.end <= start or found.start >= end:
            continue
        out.append(text[position : max(found.start, start)])
        out.append(marker(found.kind))
        position = min(found.end, end)
    out.append(text[position:end])
    return "".join(out)


_CUT_WORD = re.compile(r"\S*\.\.\.\Z")


def redact_fact(redactor: Redactor, fact: str) -> str:
    """A memory fact, redacted; the last word of a fact the memory view cut is dropped (unless
    it is a redaction marker), since it may be the start of a secret no rule recognizes."""
    text = redactor.redact_text(fact)
    if len(fact) >= FACT_CHARS and text.endswith("..."):
        match = _CUT_WORD.search(text)
        if match is not None and not text[: match.end() - 3].endswith("]"):
            text = text[: match.start()].rstrip() + " ..."
    return text


def catalog_uri(root: Union[str, os.PathLike[str]], *, refresh: bool = True) -> str:
    """A read-only URI of ``<root>/catalog.db``, refreshed first (``refresh``) when the store can
    be written; a store that cannot be (a read-only mount, another user's files) is read as its
    catalog last saw it. :class:`QueryError` (``unavailable``) when there is no catalog to read."""
    from .layout import catalog_path
    from .session.index import readonly_uri

    path = catalog_path(root)
    if refresh:
        from .catalog import refresh_catalog

        try:
            refresh_catalog(root)
            return f"{Path(path).absolute().as_uri()}?mode=ro"
        except StoreIOError as exc:
            if exc.errno not in (errno.EROFS, errno.EACCES, errno.EPERM):
                raise
            logger.warning("reading %s as it is, without refreshing it: %s", path, exc)
    if not Path(path).is_file():
        raise QueryError(
            QueryErrorKind.UNAVAILABLE,
            f"no catalog at {path}: run `memstore search` or the explorer "
            "once with write access to the store to build it",
        )
    uri = readonly_uri(path)
    if uri is None:
        raise QueryError(
            QueryErrorKind.UNAVAILABLE, f"{path} is being written (only one of its WAL files exists): try again"
        )
    return uri


def query_catalog(
    root: Union[str, os.PathLike[str]],
    sql: str,
    params: Params = (),
    *,
    limits: QueryLimits = QueryLimits(),
    redactor: Optional[Redactor] = None,
    refresh: bool = True,
) -> QueryResult:
    """:func:`run_query` on the store's catalog (see :func:`catalog_uri`), with
    :func:`catalog_policy` and the pricing functions (``memstore_cost_usd`` ...). ``redactor``
    defaults to the store's own (its ``config.toml``)."""
    from .pricing import price_data, register_sql_functions
    from .redact import redactor_for

    if redactor is None:
        redactor = redactor_for(root)
    if isinstance(sql, str) and "memstore_" in sql.lower():
        price_data()  # the price table loads once per process, outside the query's time limit
    uri = catalog_uri(root, refresh=refresh)
    return run_query(uri, sql, params, limits=limits, policy=catalog_policy(redactor), functions=register_sql_functions)
