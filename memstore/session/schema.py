"""Schema migrations of memstore's SQLite files, and the empty session index new indexes copy.

A :class:`MigrationSet` is a named, ordered set of steps, each recorded in the table
``_sqlite_migrations`` once applied (sqlite-utils' ``Migrations`` bookkeeping, shared with it: a
database migrated by either is read the same way by both). A step is either :class:`DDL` (SQL
statements, applied with the plain ``sqlite3`` module) or a function of a
``sqlite_utils.Database`` (sqlite-utils is imported only when such a step is pending).

A new session index starts as a copy of an empty one with every migration applied (see
:func:`template_bytes`). When every step is DDL that copy is built in memory, in a millisecond,
without sqlite-utils. When some registered step is a function, it is built once with
sqlite-utils and kept in a cache file (``$MEMSTORE_CACHE_DIR``, else
``$XDG_CACHE_HOME/memstore``, else ``~/.cache/memstore``) named by a fingerprint of every step
(its set, name, SQL or code): an agent hook that opens a new session then loads neither
sqlite-utils nor what it imports (numpy among them), however short-lived its process.
"""

from __future__ import annotations

import datetime
import hashlib
import logging
import marshal
import os
import sqlite3
import stat
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Optional, Union

from ..errors import StoreIOError
from ..fsio import write_all

if TYPE_CHECKING:
    import sqlite_utils

logger = logging.getLogger(__name__)

MIGRATIONS_TABLE = "_sqlite_migrations"
# What sqlite-utils' Migrations.ensure_migrations_table creates, statement for statement.
_MIGRATIONS_DDL = (
    'CREATE TABLE "_sqlite_migrations" (\n'
    '   "id" INTEGER PRIMARY KEY,\n'
    '   "migration_set" TEXT,\n'
    '   "name" TEXT,\n'
    '   "applied_at" TEXT\n'
    ")",
    'CREATE UNIQUE INDEX "idx__sqlite_migrations_migration_set_name"\n'
    '    ON "_sqlite_migrations" ("migration_set", "name")',
)
_RECORD = 'INSERT INTO "_sqlite_migrations" ("migration_set", "name", "applied_at") VALUES (?, ?, ?)'


@dataclass(frozen=True)
class DDL:
    """A migration step written as SQL statements (one statement each), applied in one
    transaction together with the record of it."""

    statements: tuple[str, ...]


MigrationStep = Union[DDL, Callable[["sqlite_utils.Database"], None]]


@dataclass(frozen=True)
class MigrationSet:
    """A named set of schema migrations, applied in order, each recorded in
    ``_sqlite_migrations`` (see the module docstring). Opening an up-to-date database checks
    the record with one query."""

    name: str
    steps: tuple[tuple[str, MigrationStep], ...]

    def pending(self, conn: sqlite3.Connection, applied: Optional[set[tuple[str, str]]] = None) -> list[str]:
        """The names of the steps not yet applied to the database behind ``conn`` (or, given
        ``applied``, missing from those :func:`applied_migrations` read)."""
        if applied is None:
            applied = applied_migrations(conn, self.name)
        return [name for name, _step in self.steps if (self.name, name) not in applied]

    def apply(self, conn: sqlite3.Connection) -> None:
        """Apply the pending steps in order, each in its own transaction with its record (a
        failing step leaves it pending and raises). ``conn`` must be in autocommit mode
        (``isolation_level=None``), as memstore's connections are."""
        pending = set(self.pending(conn))
        if not pending:
            return
        _ensure_migrations_table(conn)
        for name, step in self.steps:
            if name not in pending:
                continue
            if isinstance(step, DDL):
                _apply_ddl(conn, self.name, name, step)
            else:
                _apply_with_sqlite_utils(conn, self.name, name, step)

    @property
    def plain(self) -> bool:
        """Whether every step is DDL (applying them needs no sqlite-utils)."""
        return all(isinstance(step, DDL) for _name, step in self.steps)


def applied_migrations(conn: sqlite3.Connection, migration_set: Optional[str] = None) -> set[tuple[str, str]]:
    """``(migration_set, name)`` of every migration applied to the database (of one set, if
    given), in one query."""
    sql = "SELECT migration_set, name FROM _sqlite_migrations"
    try:
        if migration_set is None:
            return set(conn.execute(sql).fetchall())
        return set(conn.execute(sql + " WHERE migration_set = ?", (migration_set,)).fetchall())
    except sqlite3.OperationalError as exc:
        if "no such table" not in str(exc):
            raise
        return set()


def _ensure_migrations_table(conn: sqlite3.Connection) -> None:
    columns = conn.execute(f'PRAGMA table_info("{MIGRATIONS_TABLE}")').fetchall()
    if not columns:

        def create() -> None:
            for sql in _MIGRATIONS_DDL:
                conn.execute(sql)

        _in_transaction(conn, create)
    elif not any(column[1] == "id" and column[5] for column in columns):
        # An older sqlite-utils' table (no "id" key): sqlite-utils converts it, as it would.
        import sqlite_utils
        from sqlite_utils.migrations import Migrations

        Migrations("memstore").ensure_migrations_table(sqlite_utils.Database(conn))


def _applied_now() -> str:
    # The format sqlite-utils records (str of an aware UTC datetime).
    return str(datetime.datetime.now(datetime.UTC))


def _apply_ddl(conn: sqlite3.Connection, migration_set: str, name: str, step: DDL) -> None:
    def run() -> None:
        for sql in step.statements:
            conn.execute(sql)
        conn.execute(_RECORD, (migration_set, name, _applied_now()))

    _in_transaction(conn, run)


def _in_transaction(conn: sqlite3.Connection, work: Callable[[], object]) -> None:
    conn.execute("BEGIN")
    try:
        work()
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def _apply_with_sqlite_utils(
    conn: sqlite3.Connection, migration_set: str, name: str, fn: Callable[[sqlite_utils.Database], None]
) -> None:
    import sqlite_utils
    from sqlite_utils.migrations import Migrations

    migrations = Migrations(migration_set)
    migrations(name=name)(fn)
    migrations.apply(sqlite_utils.Database(conn))


# --------------------------------------------------------------------------------------------
# The empty index


def build_database(sets: Sequence[MigrationSet], user_version: int) -> bytes:
    """The bytes of an empty database (rollback-journal format) with every step of ``sets``
    applied and ``PRAGMA user_version`` set."""
    conn = sqlite3.connect(":memory:", isolation_level=None)
    try:
        for migration_set in sets:
            migration_set.apply(conn)
        conn.execute(f"PRAGMA user_version={int(user_version)}")
        return bytes(conn.serialize())
    finally:
        conn.close()


def template_bytes(sets: Sequence[MigrationSet], user_version: int) -> bytes:
    """The empty database of :func:`build_database`, without sqlite-utils whenever possible:
    built in memory when every step is DDL, else read from the cache file a process built
    (checked before use), else built with sqlite-utils and cached for the next process."""
    if all(s.plain for s in sets):
        return build_database(sets, user_version)
    fingerprint = _fingerprint(sets, user_version)
    path = _cache_file(fingerprint) if fingerprint is not None else None
    if path is not None:
        data = _read_cached(path, sets, user_version)
        if data is not None:
            return data
    data = build_database(sets, user_version)
    if path is not None:
        _write_cached(path, data)
    return data


def cache_dir() -> Path:
    """Where memstore keeps files it can always rebuild (the index template)."""
    configured = os.environ.get("MEMSTORE_CACHE_DIR")
    if configured:
        return Path(configured)
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".cache"
    return base / "memstore"


def _cache_file(fingerprint: str) -> Optional[Path]:
    try:
        return cache_dir() / f"index-template-{fingerprint}.db"
    except RuntimeError as exc:  # no home directory to put it in
        logger.debug("no cache directory for the index template: %s", exc)
        return None


def _fingerprint(sets: Sequence[MigrationSet], user_version: int) -> Optional[str]:
    """A name for the template ``sets`` build: every set and step name, each step's SQL or code
    (with its defaults and closure), the user_version, SQLite's version and Python's (its code
    format). ``None`` when a step is not a plain function whose code says what it does."""
    digest = hashlib.sha256()
    digest.update(repr((user_version, sqlite3.sqlite_version, sys.version_info[:2])).encode())
    for migration_set in sets:
        for name, step in migration_set.steps:
            digest.update(repr((migration_set.name, name)).encode())
            if isinstance(step, DDL):
                digest.update(repr(step.statements).encode())
                continue
            code = getattr(step, "__code__", None)
            if code is None:
                return None
            try:
                cells = tuple(cell.cell_contents for cell in getattr(step, "__closure__", None) or ())
                defaults = (getattr(step, "__defaults__", None), getattr(step, "__kwdefaults__", None))
                digest.update(marshal.dumps(code))
                digest.update(repr((defaults, cells)).encode())
            except (ValueError, AttributeError) as exc:  # unmarshallable code, an empty cell
                logger.debug("not caching the index template: step %s of %s: %s", name, migration_set.name, exc)
                return None
    return digest.hexdigest()[:32]


def _read_cached(path: Path, sets: Sequence[MigrationSet], user_version: int) -> Optional[bytes]:
    """The cached template at ``path`` if it is this user's private regular file and a sound
    database holding exactly the expected migrations; ``None`` otherwise."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        return None
    except OSError as exc:
        logger.debug("cannot read the cached index template %s: %s", path, exc)
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022 or st.st_size > 64 << 20:
            logger.info("ignoring the cached index template %s: not a private file of this user", path)
            return None
        data = b""
        while len(data) < st.st_size:
            chunk = os.read(fd, st.st_size - len(data))
            if not chunk:
                break
            data += chunk
    except OSError as exc:
        logger.debug("cannot read the cached index template %s: %s", path, exc)
        return None
    finally:
        os.close(fd)
    if not _sound_template(data, sets, user_version):
        logger.info("ignoring the cached index template %s: not the expected empty index", path)
        return None
    return data


def _sound_template(data: bytes, sets: Sequence[MigrationSet], user_version: int) -> bool:
    expected = {(s.name, name) for s in sets for name, _step in s.steps}
    if not data.startswith(b"SQLite format 3\x00"):
        return False
    conn = sqlite3.connect(":memory:", isolation_level=None)
    try:
        conn.deserialize(data)
        if conn.execute("PRAGMA quick_check").fetchall() != [("ok",)]:
            return False
        if conn.execute("PRAGMA user_version").fetchone()[0] != user_version:
            return False
        return applied_migrations(conn) == expected
    except (sqlite3.Error, MemoryError, OverflowError):  # (what deserialize raises for odd sizes)
        return False
    finally:
        conn.close()


def _write_cached(path: Path, data: bytes) -> None:
    """Keep ``data`` at ``path`` for later processes (a cache: written atomically, not synced;
    a failure only costs the next process the build)."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        os.makedirs(path.parent, mode=0o700, exist_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0), 0o600)
        try:
            write_all(fd, data, tmp)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except (OSError, StoreIOError) as exc:
        logger.info("could not cache the index template in %s (each new session builds it again): %s", path, exc)
        try:
            os.unlink(tmp)
        except OSError:
            pass
