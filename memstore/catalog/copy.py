"""Reading what the catalog lacks of one session, as rows, without writing anything.

A session is read through its reader (:mod:`memstore.reader`), which holds one snapshot of its
index and its log: the rows its index derived (events with their details, chunks, changed
files) are read from the reader's own read-only connection within that snapshot, and what the
index has not derived yet (lines a writer has not indexed, chunks its deriver has not made, or
a whole session without an index) is derived here from the records. Nothing is written: the
rows go to the catalog later, with other sessions', in one transaction (see :mod:`.write`).

A copy is *full* (the catalog's rows of the session are replaced) when the session is new, its
generation changed (a rebuild, a cap rewrite that evicted), its first retained turn moved, or
its log no longer starts with the bytes the catalog copied (VT Code's own cap rewrite, which no
generation tells); else it is *incremental*: only the records past the last one copied, and the
turns from the last one copied (it may have been open then).
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
from dataclasses import dataclass, field, replace
from typing import Any, Optional

from .. import events as ev
from ..errors import StoreIOError
from ..importers.stores import load_origin
from ..layout import DERIVED_DIR, EVENTS_FILE, MANIFEST_FILE, MEMORY_FILE, SESSIONS_DIR
from ..reader import SessionReader, read_session_dir
from ..redact import Redactor
from ..session.index import IndexChanged, Turn
from ..session.logfile import TAIL_BYTES
from ..session.manifest import Manifest, load_manifest
from ..views.chunks import event_chunks
from .cost import CostReader, thread_reported_total
from .scan import NOTHING, Examined, SessionKind
from .schema import normal_ts, str_or_none

logger = logging.getLogger("memstore.catalog")

ATTEMPTS = 3
"""A session whose index is rewritten under its reader is read again, at most this many times."""
TITLE_CHARS = 200

_MEMSTORE_TS = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z\Z").match


@dataclass(frozen=True)
class Previous:
    """What the catalog recorded of a session directory with its last copy (``catalog_state``)."""

    directory: str
    session_id: str
    generation: int
    seq: int
    last_turn: int
    stamp: Optional[str]
    sweep: Optional[str]
    log_bytes: Optional[int]
    tail: Optional[bytes]
    reported_total: Optional[float]
    title: Optional[str]
    title_from_user: bool
    retained_turn_base: int


STATE_COLUMNS = (
    "directory, session_id, generation, seq, last_turn, stamp, sweep, log_bytes, tail, reported_total, "
    "title, title_from_user, retained_turn_base"
)


class Rewritten(Exception):
    """The session's index changed generation while it was read: read it again."""


@dataclass
class SessionCopy:
    """The rows one session adds to the catalog (see the module docstring). ``chunks`` rows
    lack their catalog id (given when they are written), ``facts`` is ``None`` when the memory
    view's facts need no replacing."""

    name: str
    session_id: str
    kind: str  # "added", "updated" or "recopied"
    full: bool
    forget: list[str]  # session ids whose catalog rows go first (a full copy)
    turns_from: int
    events: list[tuple] = field(default_factory=list)
    chunks: list[tuple] = field(default_factory=list)
    file_changes: list[tuple] = field(default_factory=list)
    facts: Optional[list[tuple]] = None
    turns: list[tuple] = field(default_factory=list)
    session: tuple = ()
    state: tuple = ()
    text_bytes: int = 0


# Column orders of the rows a copy makes (the catalog's tables, see schema.py).
EVENT_COLUMNS = "session_id, seq, turn, ts, type, item_type, item_id, name, status, exit_code, offset, length"
CHUNK_COLUMNS = "chunk_id, session_id, seq, turn, part, source, kind, path, start_line, end_line, created_at, text"
FILE_CHANGE_COLUMNS = "session_id, seq, turn, path, kind"
SESSION_COLUMNS = (
    "session_id, directory, status, created_at, updated_at, turn_count, event_count, retained_turn_base, "
    "generation, agent, agent_version, cwd, git_branch, source_path, parent_session_id, title, log_bytes, "
    "origin_store_id, origin_label, origin_session_id, origin_root"
)
STATE_ROW_COLUMNS = STATE_COLUMNS


def read_copy(examined: Examined, previous: Optional[Previous], redactor: Redactor) -> SessionCopy:
    """What the catalog lacks of the session ``examined`` describes, given what it recorded with
    its last copy (``previous``). Raises :class:`SessionNotFound` when it is gone,
    :class:`StoreIOError` (or another ``OSError``/``MemstoreError``) when it cannot be read."""
    if examined.kind is SessionKind.LEGACY:
        return _legacy_copy(examined, previous, redactor)
    for _attempt in range(ATTEMPTS):
        with read_session_dir(examined.path) as reader:
            try:
                return _log_copy(examined, previous, reader, redactor)
            except (Rewritten, IndexChanged):
                continue
    raise StoreIOError("refresh catalog", examined.path, "the session kept being rewritten while it was read")


def _log_copy(
    examined: Examined, previous: Optional[Previous], reader: SessionReader, redactor: Redactor
) -> SessionCopy:
    manifest = reader.manifest
    session_id = reader.session_id
    name = examined.name
    full = (
        previous is None
        or previous.session_id != session_id
        or previous.generation != manifest.generation
        or previous.seq > max(reader.indexed_seq, reader.tail_rows.last_seq)
        or previous.retained_turn_base != manifest.retained_turn_base
        or not _still_prefix(reader, previous.log_bytes, previous.tail, trusted=previous.generation != 0)
    )
    turns_from = 0 if full else previous.last_turn  # type: ignore[union-attr]
    after = 0 if full else previous.seq  # type: ignore[union-attr]
    forget = sorted({session_id} | ({previous.session_id} if previous is not None else set())) if full else []
    kind = "added" if previous is None else "recopied" if full else "updated"
    copy = SessionCopy(name, session_id, kind, full, forget, turns_from)
    rel_path = f"{SESSIONS_DIR}/{name}/{EVENTS_FILE}"
    thread_end: Optional[bytes] = None

    # What the index derived, within the reader's snapshot.
    copied = after
    if reader.index is not None:
        index = reader.index
        derived = min(reader.derived_seq, reader.indexed_seq)
        if derived > after:
            bounds = (after, derived)
            copy.events = [
                (*row[:7], _redacted(redactor, row[7]), *row[8:])
                for row in index._read(
                    "SELECT ?, e.seq, e.turn, e.ts, e.type, d.item_type, d.item_id, d.name, d.status, d.exit_code, "
                    "e.offset, e.length FROM events e LEFT JOIN event_details d ON d.seq = e.seq "
                    "WHERE e.seq > ? AND e.seq <= ? ORDER BY e.seq",
                    (session_id, *bounds),
                )
            ]
            rows = index._read(
                "SELECT seq, turn, part, kind, start_line, end_line, ts, text FROM chunks "
                "WHERE seq > ? AND seq <= ? ORDER BY seq, part",
                bounds,
            )
            copy.chunks = [
                (
                    f"{session_id}:{seq}:{part}",
                    session_id,
                    seq,
                    turn,
                    part,
                    "event",
                    kind,
                    rel_path,
                    start,
                    end,
                    _chunk_time(ts),
                    _redacted(redactor, text),
                )
                for seq, turn, part, kind, start, end, ts, text in rows
            ]
            copy.file_changes = [
                (sid, seq, turn, _redacted(redactor, path), kind)
                for sid, seq, turn, path, kind in index._read(
                    "SELECT ?, seq, turn, path, kind FROM file_changes WHERE seq > ? AND seq <= ? ORDER BY rowid",
                    (session_id, *bounds),
                )
            ]
            ends = [row for row in copy.events if row[4] == ev.THREAD_COMPLETED]
            if ends:
                thread_end = reader.log.pread(ends[-1][10], ends[-1][11])
            copied = derived
    # What it has not: derived here from the records.
    last = copied
    for record in reader.records_from(copied):
        # Redacted whole before it is chunked: a secret spanning two windows is still found.
        event = redactor.redact_value(record.event)
        seq, turn, ts = record.seq, record.turn, record.ts
        described = ev.describe(event)
        copy.events.append((session_id, seq, turn, ts, *described, record.offset, record.length))
        if described[0] == ev.THREAD_COMPLETED:
            thread_end = reader.log.pread(record.offset, record.length)
        for chunk in event_chunks(seq, turn, ts, event):
            copy.chunks.append(
                (
                    f"{session_id}:{seq}:{chunk.part}",
                    session_id,
                    seq,
                    turn,
                    chunk.part,
                    "event",
                    chunk.kind,
                    rel_path,
                    chunk.start_line,
                    chunk.end_line,
                    _chunk_time(ts),
                    chunk.text,
                )
            )
        for file_path, change in ev.changed_files(event):
            copy.file_changes.append((session_id, seq, turn, file_path, change))
        last = seq
    last = max(last, copied)
    if reader.index is not None and reader.index.changed() and reader.index.immutable:
        raise Rewritten()  # a writer touched an index read without locks: what was read may be torn

    copy.facts = _facts(examined, session_id, name, redactor)
    copy.text_bytes = sum(len(row[11]) for row in copy.chunks) + sum(len(row[11]) for row in copy.facts)

    # Turns, priced, from the first that may have changed.
    turns = reader.turns(since=turns_from)
    prices = CostReader(lambda seq: _line(reader, seq), manifest.source, manifest.updated_at or manifest.created_at)
    copy.turns = [
        (
            session_id,
            *_redacted_turn(t, redactor).as_row(),
            _duration_ms(t.started_at, t.ended_at),
            *prices.turn(t).as_row(),
        )
        for t in turns
    ]
    last_turn = max([turns_from] + [t.number for t in turns])

    reported = (
        thread_reported_total(thread_end)
        if thread_end is not None
        else (None if full or previous is None else previous.reported_total)
    )
    title, from_user = _title(copy.chunks, None if full or previous is None else previous)
    copy.session = _session_row(
        session_id, name, manifest, examined.path, redactor, agent="memstore", title=title, log_bytes=reader.end
    )
    copy.state = (
        name,
        session_id,
        manifest.generation,
        last,
        last_turn,
        examined.stamp,
        examined.sweep,
        reader.end,
        _log_tail(reader, reader.end),
        reported,
        title,
        int(from_user),
        manifest.retained_turn_base,
    )
    return copy


def _session_row(
    session_id: str,
    name: str,
    manifest: Manifest,
    directory: str,
    redactor: Redactor,
    *,
    agent: str,
    title: Optional[str],
    log_bytes: int,
) -> tuple:
    """The ``sessions`` row of a session: its manifest's counters, its source redacted (a
    working directory or branch may quote a secret; ``agent`` when the source names none), and
    its origin."""
    source = redactor.redact_value(manifest.source or {})
    return (
        session_id,
        name,
        manifest.status,
        manifest.created_at,
        manifest.updated_at,
        manifest.turn_count,
        manifest.event_count,
        manifest.retained_turn_base,
        manifest.generation,
        str_or_none(source.get("agent")) or agent,
        str_or_none(source.get("agent_version")),
        str_or_none(source.get("cwd")),
        str_or_none(source.get("git_branch")),
        str_or_none(source.get("path")),
        str_or_none(source.get("parent_session_id")),
        title,
        log_bytes,
        *_origin_columns(directory, redactor),
    )


def _legacy_copy(examined: Examined, previous: Optional[Previous], redactor: Redactor) -> SessionCopy:
    """A session VT Code's migration made (a manifest and a memory view, no log): its row from
    its manifest, its facts from its memory view, nothing else. Always copied whole (it is a
    few facts)."""
    directory = examined.path
    manifest = load_manifest(directory)
    if manifest is None:
        raise StoreIOError(
            "read session", os.path.join(directory, MANIFEST_FILE), "its manifest is missing or malformed"
        )
    name = examined.name
    session_id = session_id_of_legacy(manifest.session_id, name)
    kind = "added" if previous is None else "recopied"
    forget = sorted({session_id} | ({previous.session_id} if previous is not None else set()))
    copy = SessionCopy(name, session_id, kind, True, forget, 0)
    copy.facts = _facts(examined, session_id, name, redactor)
    copy.text_bytes = sum(len(row[11]) for row in copy.facts)
    copy.session = _session_row(
        session_id, name, manifest, directory, redactor, agent="vtcode", title=None, log_bytes=0
    )
    copy.state = (
        name,
        session_id,
        manifest.generation,
        0,
        0,
        examined.stamp,
        examined.sweep,
        0,
        b"",
        None,
        None,
        0,
        manifest.retained_turn_base,
    )
    return copy


def _origin_columns(directory: str, redactor: Redactor) -> tuple[Optional[str], ...]:
    """The session's origin as the catalog records it (``origin_store_id, origin_label,
    origin_session_id, origin_root``): what its ``origin.json`` says for a session imported
    from another store, all ``None`` for one born here (the catalog fills in this store's own
    id and label, which may change, when it writes the batch)."""
    origin = load_origin(directory)
    if origin is None:
        return (None, None, None, None)
    return (
        origin.store_id,
        _redacted(redactor, origin.label),
        _redacted(redactor, origin.session_id),
        _redacted(redactor, origin.root),
    )


def session_id_of_legacy(claimed: str, name: str) -> str:
    """The id of a session without a log: the one its manifest names when that id maps to this
    directory, else the directory's name (as :func:`memstore.reader.session_id_of` decides for
    a session with a log)."""
    from ..layout import session_dir_name

    try:
        if session_dir_name(claimed) == name:
            return claimed
    except ValueError:
        pass
    return name


def _facts(examined: Examined, session_id: str, name: str, redactor: Redactor) -> list[tuple]:
    """The memory view's grounded facts as chunk rows (``source = 'session'``, chunk id
    ``<directory>:<index>``, as the reference names them: a directory name has no ``:``, so no
    fact can take the id of an event's chunk, ``<session>:<seq>:<part>``), dated with the
    view's own time (what recency and ``since`` weigh them by)."""
    if _memory_missing(examined.sweep):
        return []
    from ..views.memory_view import memory_facts_of, memory_view_time

    facts = memory_facts_of(examined.path)
    if not facts:
        return []
    created_at = memory_view_time(examined.path)
    path = f"{SESSIONS_DIR}/{name}/{DERIVED_DIR}/{MEMORY_FILE}"
    return [
        (
            f"{name}:{fact['index']}",
            session_id,
            None,
            None,
            None,
            "session",
            fact.get("source") or "fact",
            path,
            0,
            0,
            created_at,
            redactor.redact_text(fact["fact"]),
        )
        for fact in facts
    ]


def _memory_missing(sweep: str) -> bool:
    parts = sweep.split("|")
    return len(parts) > 1 and parts[1] == NOTHING


def _title(chunks: list[tuple], previous: Optional[Previous]) -> tuple[Optional[str], bool]:
    """The session's title: its first prompt (part 0 of its first ``user_message`` chunk), else
    its first agent message; an incremental copy keeps the title it had unless it came from an
    agent message and a prompt arrived since."""
    if previous is not None and previous.title_from_user:
        return previous.title, True
    first_agent = None
    for row in chunks:
        if row[4] != 0:
            continue
        if row[6] == "user_message":
            return " ".join(row[11].split())[:TITLE_CHARS], True
        if row[6] == "agent_message" and first_agent is None:
            first_agent = row[11]
    if previous is not None and previous.title is not None:
        return previous.title, False
    return (" ".join(first_agent.split())[:TITLE_CHARS] if first_agent is not None else None), False


def _chunk_time(ts: Any) -> Optional[str]:
    # Chunk times are compared with ``since`` as strings: each in memstore's own format (a line
    # another tool wrote may say the time another way), or NULL when it is no time.
    if ts is None or (isinstance(ts, str) and _MEMSTORE_TS(ts)):
        return ts
    return normal_ts(ts)


def _line(reader: SessionReader, seq: int) -> Optional[bytes]:
    try:
        return reader.record_line(seq)
    except (ev.InvalidEvent, LookupError, StoreIOError):
        return None


def _log_tail(reader: SessionReader, length: int) -> bytes:
    """The sha256 of the log's last bytes up to ``length``: what tells the log is still the one
    copied, without keeping its bytes (which may hold a secret) in the catalog."""
    return hashlib.sha256(reader.log.pread(max(0, length - TAIL_BYTES), min(TAIL_BYTES, length))).digest()


def _redacted(redactor: Redactor, value: Any) -> Any:
    """A text value redacted (what comes from a session index was redacted when it was derived,
    by the rules of that time and config: again, by the store's); anything else as it is."""
    return redactor.redact_text(value) if isinstance(value, str) else value


def _redacted_turn(turn: Turn, redactor: Redactor) -> Turn:
    """``turn`` with its error message redacted (a failed command's message may quote a key)."""
    if not turn.error:
        return turn
    error = redactor.redact_text(turn.error)
    return turn if error is turn.error else replace(turn, error=error)


def _still_prefix(reader: SessionReader, length: Optional[int], tail: Optional[bytes], *, trusted: bool) -> bool:
    """Whether the log the catalog copied (``length`` bytes ending in the bytes ``tail`` digests) is still the
    start of the one the reader holds: if not, it was rewritten (the generation cannot say so
    for a session without an index). Unknown: ``trusted``, which a session copied with a
    generation is."""
    if length is None or tail is None:
        return trusted
    return length <= reader.end and _log_tail(reader, length) == tail


def _duration_ms(started: Optional[str], ended: Optional[str]) -> Optional[int]:
    a, b = ev.parse_ts(started), ev.parse_ts(ended)
    if a is None or b is None:
        return None
    return max(0, int((b - a).total_seconds() * 1000))
