"""Events into search chunks (the text of every text-bearing event, split into bounded windows)
and into the files they changed.

The events reach this module redacted (the session's writer and the catalog pass each through
the store's redactor before deriving from it), so no chunk holds a secret; a private key that a
window would cut in two is found in the whole event first.

Each chunk is one window of one event's text: its ``seq``, a ``part`` number within the event,
its turn and time, the kind of text (``agent_message``, ``command_execution``, ...), and the
line range of the window within the event's text. Most events are a single chunk; long command
outputs and diffs become several. The chunks live in each session's index (table ``chunks``,
with the FTS5 table ``chunks_fts`` over their text) as a derived table, so the index keeps them
current in its own transactions, and a rebuild gives the same rows as the appends did. The
catalog copies them from there.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, NamedTuple, Optional

from .. import events as ev
from ..session.index import BatchRecord, DerivedTable, MigrationSet, register_derived_table

if TYPE_CHECKING:
    import sqlite_utils

WINDOW_LINES = 40
WINDOW_CHARS = 2_000
# Text past this many characters of one event is not indexed for search (the event itself is
# whole in the log): a runaway output of megabytes would otherwise flood every search.
EVENT_CHARS = 512 * 1024

CHUNK_COLUMNS = ("seq", "part", "turn", "ts", "kind", "start_line", "end_line", "text")


class Chunk(NamedTuple):
    seq: int
    part: int
    turn: Optional[int]
    ts: Optional[str]
    kind: str
    start_line: int
    end_line: int
    text: str


def windows(text: str) -> list[tuple[int, int, str]]:
    """Split ``text`` into windows of at most ``WINDOW_LINES`` lines and ``WINDOW_CHARS``
    characters: ``(start_line, end_line, text)``, lines counted from 1. A line longer than a
    window is cut into pieces that share its line number."""
    if len(text) <= WINDOW_CHARS and text.count("\n") < WINDOW_LINES:
        return [(1, text.count("\n") + 1, text)] if text.strip() else []
    text = text[:EVENT_CHARS]
    out: list[tuple[int, int, str]] = []
    current: list[str] = []
    size = 0
    start = 1

    def flush(end: int) -> None:
        nonlocal current, size
        if current:
            body = "\n".join(current)
            if body.strip():
                out.append((start, end, body))
        current, size = [], 0

    for number, line in enumerate(text.split("\n"), start=1):
        if current and (len(current) >= WINDOW_LINES or size + len(line) + 1 > WINDOW_CHARS):
            flush(number - 1)
        if not current:
            start = number
        while len(line) > WINDOW_CHARS:
            flush(number - 1)
            if line[:WINDOW_CHARS].strip():
                out.append((number, number, line[:WINDOW_CHARS]))
            line = line[WINDOW_CHARS:]
            start = number
        current.append(line)
        size += len(line) + 1
    flush(number)
    return out


def event_chunks(seq: int, turn: Optional[int], ts: Optional[str], event: dict) -> list[Chunk]:
    """The chunks of one event (none for an event without text)."""
    found = ev.event_text(event)
    if found is None:
        return []
    kind, text = found
    return [
        Chunk(seq, part, turn, ts, kind, first, last, body) for part, (first, last, body) in enumerate(windows(text))
    ]


def record_chunks(records: Iterable[BatchRecord]) -> Iterator[Chunk]:
    for record in records:
        yield from event_chunks(record.seq, record.turn, record.ts, record.event)


# --------------------------------------------------------------------------------------------
# The derived table in the session index


def _create_chunks(db: sqlite_utils.Database) -> None:
    db.table("chunks").create(
        {
            "id": int,
            "seq": int,
            "part": int,
            "turn": int,
            "ts": str,
            "kind": str,
            "start_line": int,
            "end_line": int,
            "text": str,
        },
        pk="id",
        not_null={"seq", "part", "kind", "text"},
    )
    db.table("chunks").create_index(["seq", "part"], index_name="chunks_seq_part", unique=True)
    db.table("chunks").enable_fts(["text"], fts_version="FTS5", create_triggers=True, tokenize="unicode61")


_INSERT = f"INSERT INTO chunks ({', '.join(CHUNK_COLUMNS)}) VALUES ({', '.join('?' * len(CHUNK_COLUMNS))})"


# The rows of a batch go to a temp table first and reach ``chunks`` in one statement. SQLite
# opens a statement savepoint for every row an executemany inserts, and FTS5 writes its pending
# terms out as a new segment at each one: row by row, every chunk became a segment that the
# automerge then rewrote (about five times the work of the whole batch as one segment).
_STAGE = "chunks_stage"
_CREATE_STAGE = (
    f"CREATE TEMP TABLE IF NOT EXISTS {_STAGE} AS SELECT {', '.join(CHUNK_COLUMNS)} FROM main.chunks WHERE 0"
)
_STAGE_INSERT = f"INSERT INTO temp.{_STAGE} VALUES ({', '.join('?' * len(CHUNK_COLUMNS))})"
_FROM_STAGE = f"INSERT INTO main.chunks ({', '.join(CHUNK_COLUMNS)}) SELECT * FROM temp.{_STAGE}"


def _on_batch(conn: sqlite3.Connection, records: Sequence[BatchRecord]) -> None:
    conn.execute(_CREATE_STAGE)
    conn.executemany(_STAGE_INSERT, record_chunks(records))
    conn.execute(_FROM_STAGE)
    conn.execute(f"DELETE FROM temp.{_STAGE}")


def _on_evict(conn: sqlite3.Connection, first_kept_seq: Optional[int]) -> None:
    if first_kept_seq is None:
        conn.execute("DELETE FROM chunks")
    else:
        conn.execute("DELETE FROM chunks WHERE seq < ?", (first_kept_seq,))


def _on_reset(conn: sqlite3.Connection) -> None:
    conn.execute("DELETE FROM chunks")


def _create_file_changes(db: sqlite_utils.Database) -> None:
    db.table("file_changes").create(
        {"seq": int, "turn": int, "path": str, "kind": str}, not_null={"seq", "path", "kind"}
    )
    db.table("file_changes").create_index(["seq"], index_name="file_changes_seq")


def file_change_rows(records: Iterable[BatchRecord]) -> Iterator[tuple]:
    """``(seq, turn, path, kind)`` for every file the records changed."""
    for record in records:
        for path, kind in ev.changed_files(record.event):
            yield (record.seq, record.turn, path, kind)


FILE_CHANGES = DerivedTable(
    "file_changes",
    MigrationSet("memstore.file_changes", (("file_changes", _create_file_changes),)),
    lambda conn, records: conn.executemany("INSERT INTO file_changes VALUES (?, ?, ?, ?)", file_change_rows(records)),
    lambda conn, first_kept_seq: conn.execute(
        "DELETE FROM file_changes" + ("" if first_kept_seq is None else " WHERE seq < ?"),
        () if first_kept_seq is None else (first_kept_seq,),
    ),
    lambda conn: conn.execute("DELETE FROM file_changes"),
    lazy=True,
)


def _redacted_chunks(db: sqlite_utils.Database) -> None:
    # Chunks are derived from redacted events from here on. An index that had rows before this
    # step is rebuilt from its log on its next open for writing (a new file: nothing of the old
    # rows, nor of their FTS5 segments, is kept), and read from its log until then.
    db.execute("DELETE FROM chunks")


CHUNKS = DerivedTable(
    "chunks",
    MigrationSet("memstore.views.chunks", (("chunks_with_fts", _create_chunks), ("redacted", _redacted_chunks))),
    _on_batch,
    _on_evict,
    _on_reset,
    lazy=True,
)
register_derived_table(CHUNKS)
register_derived_table(FILE_CHANGES)
