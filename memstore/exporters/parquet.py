"""``memstore export parquet DEST``: the catalog's facts as Hive-partitioned Parquet.

Layout (``docs/export.md`` has every column with its type and unit)::

    DEST/_memstore_export.json                                  the manifest, written last
    DEST/<table>/agent=<agent>/day=<YYYY-MM-DD>/s-<session directory>.<key>.parquet

Tables: ``sessions``, ``turns`` (token usage and cost per turn), ``events``, ``tool_calls``,
``commands``, ``file_changes``. Every row carries ``store_id``, ``store_label`` and
``session_id``; ``agent`` and ``day`` are the partition keys (in the path, not in the files, as
Spark, Trino/Athena and DuckDB expect). A row without a day goes to
``day=__HIVE_DEFAULT_PARTITION__``, which engines read as NULL.

One file per session per partition, named by the session's directory and a key of its version
and the export's settings. So an export after one session changed writes that session's files
only, under new names; the files of every other session are not touched. Each file appears
whole (see :mod:`memstore.exporters.destination`). The manifest, which lists every file of the
export with its row count, is replaced last and atomically; only then are the files it no
longer names removed. A reader that follows the manifest therefore always reads one complete
export; an export killed at any point leaves the previous manifest and all its files intact,
and the next export removes what the killed one left behind.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any, Optional, Union
from urllib.parse import quote

import orjson

from .. import __version__
from ..events import utc_now
from ..fsio import temp_file_pid
from ..layout import sessions_root
from ..pricing import price_data, reported_cost
from . import ExportError, MissingExtra
from .destination import LOCK_NAME, Destination, LocalDestination, open_destination
from .source import CatalogSnapshot, SessionRow, TurnRow, day_of, exact_usd, read_events

logger = logging.getLogger(__name__)

PathArg = Union[str, "os.PathLike[str]"]
Progress = Optional[Callable[[int, int], None]]

SCHEMA_VERSION = 1
MANIFEST_NAME = "_memstore_export.json"
MANIFEST_FORMAT = "memstore-parquet-export"
NULL_PARTITION = "__HIVE_DEFAULT_PARTITION__"
_FILE_NAME = re.compile(r"s-(?P<directory>[^/]+)\.(?P<key>[0-9a-f]{12})\.parquet\Z")


@dataclass(frozen=True)
class Column:
    """One column of an exported table: its name, its type (``string``, ``int64``, ``bool``,
    ``timestamp``: microseconds, UTC; ``usd``: decimal(38, 12) dollars; ``date``), its unit and
    what it holds."""

    name: str
    type: str
    unit: str
    doc: str


_COMMON = (
    Column("store_id", "string", "", "the exporting store's id (a UUID, `memstore.identity`)"),
    Column("store_label", "string", "", "the store's label (by default the hostname of its machine)"),
    Column("machine_id", "string", "", "the exporting machine (a hash of its OS machine id; NULL where there is none)"),
    Column("session_id", "string", "", "the session"),
)
_TOKENS = (
    Column("input_tokens", "int64", "tokens", "the whole prompt: uncached + cache reads + cache writes"),
    Column(
        "cached_input_tokens", "int64", "tokens", "prompt tokens read from the provider's cache (part of input_tokens)"
    ),
    Column("cache_creation_tokens", "int64", "tokens", "prompt tokens written to the cache (part of input_tokens)"),
    Column("output_tokens", "int64", "tokens", "generated tokens (reasoning included)"),
)
_EVENT_PLACE = (
    Column("seq", "int64", "", "the event's sequence number in its session's log"),
    Column("turn", "int64", "", "the turn it belongs to (NULL before the first turn)"),
    Column("ts", "timestamp", "µs, UTC", "when the event happened (the source's time)"),
)

TABLES: dict[str, tuple[Column, ...]] = {
    "sessions": _COMMON
    + (
        Column("directory", "string", "", "the session's directory name under sessions/"),
        Column("status", "string", "", "active, completed, ... (the manifest's)"),
        Column("created_at", "timestamp", "µs, UTC", "when the session started"),
        Column("updated_at", "timestamp", "µs, UTC", "when it last changed"),
        Column(
            "title",
            "string",
            "",
            "its first prompt (or message), whitespace collapsed, at most 200 characters; redacted",
        ),
        Column("model", "string", "", "the model of its last turn that names one"),
        Column("agent_version", "string", "", "the agent's version"),
        Column("cwd", "string", "", "where the agent ran; redacted"),
        Column("git_branch", "string", "", "the git branch it ran on; redacted"),
        Column("source_path", "string", "", "the log it was imported from; redacted"),
        Column("parent_session_id", "string", "", "the session that started it (sub-agents, forks)"),
        Column("turn_count", "int64", "turns", "its turns (evicted ones included)"),
        Column("turns_failed", "int64", "turns", "turns that ended in turn.failed"),
        Column("event_count", "int64", "events", "its events"),
        Column("retained_turn_base", "int64", "", "the number of its first turn still in the log"),
        Column("generation", "int64", "", "the generation of its index (a rebuild or cap rewrite moves it)"),
        Column("log_bytes", "int64", "bytes", "the size of its events.jsonl"),
        *_TOKENS,
        Column("cost_usd", "usd", "USD", "the sum of its turns' cost_usd (NULL when no turn is priced)"),
        Column(
            "unpriced_turns",
            "int64",
            "turns",
            "turns with no cost_usd (unknown model, no model): cost_usd is then a lower bound",
        ),
        Column(
            "reported_cost_usd",
            "usd",
            "USD",
            "the session's cost as its agent reported it (thread.completed), if it did",
        ),
    ),
    "turns": _COMMON
    + (
        Column("turn", "int64", "", "the turn's number"),
        Column("status", "string", "", "completed, failed, aborted, interrupted or open"),
        Column("started_at", "timestamp", "µs, UTC", "turn.started's time"),
        Column("ended_at", "timestamp", "µs, UTC", "the time of its end (NULL while open)"),
        Column("duration_ms", "int64", "ms", "ended_at - started_at"),
        Column("event_count", "int64", "events", "its events"),
        Column("first_seq", "int64", "", "the seq of its first event"),
        Column("last_seq", "int64", "", "the seq of its last event"),
        Column("model", "string", "", "the model that answered (from its end event)"),
        *_TOKENS,
        Column("error", "string", "", "turn.failed's message; redacted"),
        Column("cost_usd", "usd", "USD", "the estimate `memstore_cost_usd` gives (NULL: unpriced)"),
        Column("cost_source", "string", "", "estimated or unpriced"),
        Column("cost_note", "string", "", "why it is unpriced, or a caveat of the estimate"),
        Column("price_version", "string", "", "the price table the estimate comes from"),
        Column("price_date", "date", "", "the day whose prices applied"),
        Column("model_matched", "string", "", "the price table's model the turn's model matched"),
        Column("provider", "string", "", "the price table's provider of that model"),
    ),
    "events": _COMMON
    + _EVENT_PLACE
    + (
        Column("type", "string", "", "the event type (item.completed, turn.started, ...)"),
        Column("item_type", "string", "", "the item's type, for item events"),
        Column("item_id", "string", "", "the item's id"),
        Column("name", "string", "", "the tool, or the command, it names; redacted"),
        Column("status", "string", "", "the item's status (or outcome)"),
        Column("exit_code", "int64", "", "a command's exit code"),
        Column("log_offset", "int64", "bytes", "where its line starts in events.jsonl"),
        Column("log_length", "int64", "bytes", "the length of its line"),
        Column(
            "text",
            "string",
            "",
            "its text as the catalog holds it (at most 512 KiB); redacted; NULL unless exported with --include-text",
        ),
    ),
    "tool_calls": _COMMON
    + _EVENT_PLACE
    + (
        Column("item_type", "string", "", "tool_invocation, tool_call or mcp_tool_call"),
        Column("tool", "string", "", "the tool's name"),
        Column("outcome", "string", "", "its status"),
        Column("failed", "bool", "", "whether that status is a failure (the catalog's tool_calls view)"),
    ),
    "commands": _COMMON
    + _EVENT_PLACE
    + (
        Column("command", "string", "", "the command line; redacted"),
        Column("exit_code", "int64", "", "its exit code"),
        Column("status", "string", "", "its status"),
        Column("failed", "bool", "", "a non-zero exit code or status failed (the catalog's commands view)"),
    ),
    "file_changes": _COMMON
    + _EVENT_PLACE
    + (
        Column("path", "string", "", "the file; redacted"),
        Column("kind", "string", "", "add, delete or update"),
    ),
}
PARTITION_KEYS = ("agent", "day")


@dataclass
class FileEntry:
    """One file of an export."""

    path: str
    table: str
    rows: int
    bytes: int

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "table": self.table, "rows": self.rows, "bytes": self.bytes}


@dataclass
class SessionEntry:
    """One session of an export: the version exported and its files."""

    session_id: str
    generation: Optional[int]
    version: str
    files: list[FileEntry]

    def to_dict(self) -> dict[str, Any]:
        return {
            "session_id": self.session_id,
            "generation": self.generation,
            "version": self.version,
            "files": [f.to_dict() for f in self.files],
        }

    @classmethod
    def from_dict(cls, value: Any) -> SessionEntry:
        return cls(
            value["session_id"],
            value.get("generation"),
            value["version"],
            [FileEntry(f["path"], f["table"], int(f["rows"]), int(f["bytes"])) for f in value["files"]],
        )


@dataclass
class ParquetExportReport:
    """What an export did: sessions ``written`` (new or changed), ``unchanged`` (kept as they
    were) and ``removed`` (no longer in the store); files written and removed, the bytes
    written, the rows each table holds now, and the sessions the catalog refresh could not read
    (exported as the catalog last saw them)."""

    destination: str
    store_id: str
    written: list[str] = field(default_factory=list)
    unchanged: int = 0
    removed: list[str] = field(default_factory=list)
    files_written: int = 0
    files_removed: int = 0
    bytes_written: int = 0
    rows: dict[str, int] = field(default_factory=dict)
    refresh_errors: list[tuple[str, str]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "destination": self.destination,
            "store_id": self.store_id,
            "written": self.written,
            "unchanged": self.unchanged,
            "removed": self.removed,
            "files_written": self.files_written,
            "files_removed": self.files_removed,
            "bytes_written": self.bytes_written,
            "rows": self.rows,
            "refresh_errors": [list(e) for e in self.refresh_errors],
        }


def require_pyarrow() -> Any:
    """The ``pyarrow`` module, or :class:`~memstore.exporters.MissingExtra` saying which extra
    to install."""
    try:
        import pyarrow
        import pyarrow.parquet  # noqa: F401
    except ImportError:
        raise MissingExtra(
            "Parquet export needs pyarrow: install memstore[export] (pip install 'memstore[export]')"
        ) from None
    return pyarrow


@functools.cache
def arrow_schema(table: str) -> Any:
    """The Arrow schema of ``table`` (its columns, without the partition keys)."""
    pa = require_pyarrow()
    columns = TABLES[table]
    return pa.schema(
        [pa.field(c.name, _arrow_type(pa, c.type)) for c in columns],
        metadata={"memstore.table": table, "memstore.schema_version": str(SCHEMA_VERSION)},
    )


def _arrow_type(pa: Any, kind: str) -> Any:
    return {
        "string": pa.string(),
        "int64": pa.int64(),
        "bool": pa.bool_(),
        "timestamp": pa.timestamp("us", tz="UTC"),
        "usd": pa.decimal128(38, 12),
        "date": pa.date32(),
    }[kind]


# --------------------------------------------------------------------------------------------
# The export


def export_parquet(
    root: PathArg,
    dest: PathArg,
    *,
    include_text: bool = False,
    full: bool = False,
    durable: bool = True,
    progress: Progress = None,
) -> ParquetExportReport:
    """Export the store at ``root`` to ``dest`` (a directory, or an fsspec URL) as Parquet and
    return what was done (see the module doc).

    ``include_text``: the ``events`` table carries each event's text. ``full``: write every
    session again, changed or not. ``durable``: flush the files to disk before the manifest
    names them (local destinations). An export with other settings, another price table or other
    redaction rules than the previous one writes every session again by itself.

    Raises :class:`~memstore.exporters.MissingExtra` without pyarrow,
    :class:`~memstore.exporters.ExportError` when ``dest`` holds something other than this
    store's export or another export to it is running, and
    :class:`~memstore.errors.StoreIOError` when reading the store or writing fails.
    """
    pa = require_pyarrow()
    destination = open_destination(dest, durable=durable)
    _refuse_inside_store(Path(root), destination)
    _previous_manifest(destination, set(destination.files()))  # refused before a lock file is made in it
    try:
        lock = destination.lock()
        lock.__enter__()
    except Exception as exc:
        from filelock import Timeout

        if isinstance(exc, Timeout):
            raise ExportError(f"another export to {destination.url} is running") from None
        raise
    try:
        return _export(pa, Path(root), destination, include_text=include_text, full=full, progress=progress)
    finally:
        lock.__exit__(None, None, None)


def _refuse_inside_store(root: Path, destination: Destination) -> None:
    if isinstance(destination, LocalDestination):
        store = root.expanduser().absolute()
        target = destination.root
        if target == store or target.is_relative_to(sessions_root(store)):
            raise ExportError(f"{target}: the destination cannot be the store itself or inside its sessions")


def _export(
    pa: Any, root: Path, destination: Destination, *, include_text: bool, full: bool, progress: Progress
) -> ParquetExportReport:
    existing = set(destination.files())
    previous = _previous_manifest(destination, existing)
    with CatalogSnapshot(root) as catalog:
        identity = catalog.identity
        if previous is not None and previous.get("store_id") != identity.store_id:
            raise ExportError(
                f"{destination.url} holds the export of another store ({previous.get('store_id')}); "
                "export this one to another destination"
            )
        settings = {
            "schema_version": SCHEMA_VERSION,
            "include_text": include_text,
            "price_version": price_data().price_version,
            "redaction": catalog.redaction.fingerprint,
            "store_id": identity.store_id,
            "store_label": identity.label,
            "machine_id": catalog.machine_id,
        }
        fingerprint = hashlib.sha256(orjson.dumps(settings, option=orjson.OPT_SORT_KEYS)).hexdigest()[:16]
        reuse = previous is not None and not full and previous.get("fingerprint") == fingerprint
        old_sessions: dict[str, SessionEntry] = {}
        if previous is not None:
            old_sessions = {name: SessionEntry.from_dict(value) for name, value in previous["sessions"].items()}
        report = ParquetExportReport(destination.url, identity.store_id, refresh_errors=catalog.refresh_errors)
        entries: dict[str, SessionEntry] = {}
        sessions = catalog.sessions()
        for done, session in enumerate(sessions, start=1):
            old = old_sessions.get(session.directory) if reuse else None
            if (
                old is not None
                and old.version == session.version
                and old.session_id == session.session_id
                and all(f.path in existing for f in old.files)
            ):
                entries[session.directory] = old
                report.unchanged += 1
            else:
                entry = _write_session(pa, catalog, destination, session, fingerprint, include_text)
                entries[session.directory] = entry
                report.written.append(session.session_id)
                report.files_written += len(entry.files)
                report.bytes_written += sum(f.bytes for f in entry.files)
            if progress is not None:
                progress(done, len(sessions))
        destination.sync()
        manifest = _manifest(identity.store_id, identity.label, fingerprint, settings, entries)
        destination.write(
            MANIFEST_NAME, orjson.dumps(manifest, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS), sync_now=True
        )
        destination.sync()
    report.removed = sorted(e.session_id for name, e in old_sessions.items() if name not in entries)
    report.rows = manifest["tables"]
    report.files_removed = _remove_unlisted(destination, existing, old_sessions, entries)
    return report


def _previous_manifest(destination: Destination, existing: set[str]) -> Optional[dict]:
    """The manifest of the export already at the destination; ``None`` for a new one. A
    destination that holds anything but a memstore export is refused."""
    data = destination.read(MANIFEST_NAME) if MANIFEST_NAME in existing else None
    if data is None:
        foreign = [rel for rel in existing if not _ours(rel)]
        if foreign:
            raise ExportError(
                f"{destination.url} is not empty and holds no memstore export (it has "
                f"{foreign[0]}); export to a new or empty directory"
            )
        return None
    try:
        manifest = orjson.loads(data)
        if manifest.get("format") != MANIFEST_FORMAT or not isinstance(manifest.get("sessions"), dict):
            raise ValueError("not a memstore export manifest")
        for value in manifest["sessions"].values():
            SessionEntry.from_dict(value)
    except (orjson.JSONDecodeError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ExportError(
            f"{destination.url}/{MANIFEST_NAME} is damaged ({exc}); remove the destination's contents and export again"
        ) from None
    if manifest.get("schema_version") != SCHEMA_VERSION:
        logger.info(
            "export: %s holds schema version %s; everything is written again as version %s",
            destination.url,
            manifest.get("schema_version"),
            SCHEMA_VERSION,
        )
    return manifest


def _ours(rel: str) -> bool:
    """Whether ``rel`` is a file an export writes (its files, the lock, the manifest's and the
    files' temporary names)."""
    parts = rel.split("/")
    if len(parts) == 1:
        return rel in (LOCK_NAME, MANIFEST_NAME) or (
            rel.startswith(f".{MANIFEST_NAME}.") and temp_file_pid(rel) is not None
        )
    return len(parts) == 4 and parts[0] in TABLES and parts[1].startswith("agent=") and parts[2].startswith("day=")


def _manifest(store_id: str, label: str, fingerprint: str, settings: dict, entries: dict[str, SessionEntry]) -> dict:
    tables = {name: 0 for name in TABLES}
    for entry in entries.values():
        for f in entry.files:
            tables[f.table] += f.rows
    return {
        "format": MANIFEST_FORMAT,
        "schema_version": SCHEMA_VERSION,
        "memstore_version": __version__,
        "exported_at": utc_now(),
        "store_id": store_id,
        "store_label": label,
        "fingerprint": fingerprint,
        "settings": settings,
        "partition_keys": list(PARTITION_KEYS),
        "tables": tables,
        "sessions": {name: entries[name].to_dict() for name in sorted(entries)},
    }


def _remove_unlisted(
    destination: Destination, existing: set[str], old: dict[str, SessionEntry], entries: dict[str, SessionEntry]
) -> int:
    """Remove what the new manifest does not name: the files of the previous export that were
    replaced, those of sessions gone from the store, and what an interrupted export left (its
    files, its temporary files). Only files this exporter writes are considered."""
    keep = {f.path for entry in entries.values() for f in entry.files}
    candidates = {f.path for entry in old.values() for f in entry.files}
    for rel in existing:
        parts = rel.split("/")
        if len(parts) == 4 and parts[0] in TABLES and _FILE_NAME.match(parts[3]):
            candidates.add(rel)
        elif destination.is_stale_temp(rel):
            candidates.add(rel)
    removed = 0
    emptied: set[str] = set()
    for rel in sorted(candidates - keep):
        try:
            if destination.remove(rel):
                removed += 1
                if "/" in rel:
                    emptied.add(rel.rsplit("/", 1)[0])
        except OSError as exc:  # a file we cannot remove is left for the next export
            logger.warning("export: could not remove %s: %s", rel, exc)
    destination.prune_dirs(emptied)
    return removed


# --------------------------------------------------------------------------------------------
# One session


def _write_session(
    pa: Any,
    catalog: CatalogSnapshot,
    destination: Destination,
    session: SessionRow,
    fingerprint: str,
    include_text: bool,
) -> SessionEntry:
    """Write every file of ``session`` and return its manifest entry."""
    key = hashlib.sha256(f"{session.version}:{fingerprint}".encode()).hexdigest()[:12]
    agent = _partition_value(session.agent_name)
    name = f"s-{session.directory}.{key}.parquet"
    files: list[FileEntry] = []
    for table, groups in _session_rows(catalog, session, include_text).items():
        for day, rows in sorted(groups.items(), key=lambda item: item[0] or ""):
            rel = f"{table}/agent={agent}/day={_partition_value(day)}/{name}"
            data = _parquet_bytes(pa, table, rows, catalog, session)
            destination.write(rel, data)
            files.append(FileEntry(rel, table, len(rows), len(data)))
    return SessionEntry(session.session_id, session.generation, session.version, files)


def _partition_value(value: Optional[str]) -> str:
    """A partition directory's value, escaped as Hive escapes it (engines unescape it)."""
    return quote(value, safe="") if value else NULL_PARTITION


def _session_rows(catalog: CatalogSnapshot, session: SessionRow, include_text: bool) -> dict[str, dict]:
    """The rows of every table for ``session``, grouped by day: ``{table: {day: [row]}}``,
    each row its table's columns after the common ones, in order."""
    red = catalog.redaction
    turns = catalog.turns(session)
    events = catalog.events(session)
    out: dict[str, dict[Optional[str], list[tuple]]] = {table: {} for table in TABLES}

    def add(table: str, day: Optional[str], row: tuple) -> None:
        out[table].setdefault(day, []).append(row)

    for t in turns:
        cost = t.cost
        add(
            "turns",
            t.day,
            (
                t.number,
                t.status,
                t.started_at,
                t.ended_at,
                t.duration_ms,
                t.event_count,
                t.first_seq,
                t.last_seq,
                t.model,
                t.input_tokens,
                t.cached_input_tokens,
                t.cache_creation_tokens,
                t.output_tokens,
                red.text(t.error),
                t.cost_usd,
                cost.source.value,
                cost.note,
                cost.price_version,
                cost.price_date,
                cost.model_matched,
                cost.provider,
            ),
        )
    texts = catalog.event_texts(session) if include_text else {}
    for seq, turn, ts, kind, item_type, item_id, name, status, exit_code, offset, length in events:
        add(
            "events",
            day_of(ts),
            (
                seq,
                turn,
                ts,
                kind,
                item_type,
                item_id,
                red.text(name),
                status,
                exit_code,
                offset,
                length,
                red.text(texts.get(seq)),
            ),
        )
    for seq, turn, ts, item_type, tool, outcome, failed in catalog.tool_calls(session):
        add("tool_calls", day_of(ts), (seq, turn, ts, item_type, tool, outcome, _bool(failed)))
    for seq, turn, ts, command, exit_code, status, failed in catalog.commands(session):
        add("commands", day_of(ts), (seq, turn, ts, red.text(command), exit_code, status, _bool(failed)))
    for seq, turn, ts, path, kind in catalog.file_changes(session):
        add("file_changes", day_of(ts), (seq, turn, ts, red.text(path), kind))
    add("sessions", day_of(session.created_at), _session_row(catalog, session, turns, events))
    return {table: groups for table, groups in out.items() if groups}


def _session_row(catalog: CatalogSnapshot, session: SessionRow, turns: list[TurnRow], events: list[tuple]) -> tuple:
    red = catalog.redaction
    priced = [t.cost_usd for t in turns if t.cost_usd is not None]
    cost = sum(priced, Decimal(0)) if priced else None
    completed = [row for row in events if row[3] == "thread.completed"]
    reported: Optional[Decimal] = None
    if completed:
        seq = completed[-1][0]
        event = read_events(catalog.root, session, {seq: ("thread.completed", None)}).get(seq)
        found = reported_cost(event) if event is not None else None
        reported = exact_usd(found.usd) if found is not None else None
    s = session
    return (
        s.directory,
        s.status,
        s.created_at,
        s.updated_at,
        red.text(s.title),
        s.model,
        s.agent_version,
        red.text(s.cwd),
        red.text(s.git_branch),
        red.text(s.source_path),
        s.parent_session_id,
        s.turn_count,
        s.turns_failed,
        s.event_count,
        s.retained_turn_base,
        s.generation,
        s.log_bytes,
        s.input_tokens,
        s.cached_input_tokens,
        s.cache_creation_tokens,
        s.output_tokens,
        cost,
        len(turns) - len(priced),
        reported,
    )


def _bool(value: Any) -> Optional[bool]:
    return None if value is None else bool(value)


def _parquet_bytes(pa: Any, table: str, rows: list[tuple], catalog: CatalogSnapshot, session: SessionRow) -> bytes:
    """``rows`` of ``table`` (with the common columns prepended) as the bytes of a Parquet file."""
    import pyarrow.parquet as pq

    schema = arrow_schema(table)
    columns = TABLES[table]
    n = len(rows)
    values: list[Iterable[Any]] = [
        [catalog.identity.store_id] * n,
        [catalog.identity.label] * n,
        [catalog.machine_id] * n,
        [session.session_id] * n,
    ]
    values.extend(zip(*rows))
    arrays = [
        _array(pa, column, field.type, list(column_values))
        for column, field, column_values in zip(columns, schema, values)
    ]
    sink = pa.BufferOutputStream()
    pq.write_table(pa.Table.from_arrays(arrays, schema=schema), sink, compression="snappy")
    return sink.getvalue().to_pybytes()


def _array(pa: Any, column: Column, kind: Any, values: list[Any]) -> Any:
    if column.type == "timestamp":
        try:
            return pa.array(values, pa.string()).cast(kind)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            from ..events import parse_ts

            return pa.array([parse_ts(v) for v in values], kind)
    if column.type == "date":
        from datetime import date

        return pa.array(
            [date.fromisoformat(v) if isinstance(v, str) and day_of(v) == v else None for v in values], kind
        )
    return pa.array(values, kind)
