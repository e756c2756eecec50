"""``read_session``: read-only access to a session that never locks and never writes.

A reader takes no lock, and creates, renames, truncates and writes nothing (the index is
opened read-only), so the catalog, Datasette and the CLI's read commands can read a session
while an agent writes it, and can read a read-only copy of a store. It sees every event
flushed before it was opened: the index covers a prefix of the log, and the complete lines
past that prefix (a writer that crashed before indexing them, or VT Code appending on its own)
are parsed in memory with the same state machine the writer uses (only their positions are
kept: their events are read back when asked). A torn tail is ignored, not cut. When the index
is missing, damaged or describes another log, the whole log is read.

A reader answers as of when it was opened, whatever writers do meanwhile: it keeps the log it
opened (a cap rewrite replaces the file, not its bytes), queries the index within its snapshot,
and if the index is rebuilt or rewritten under it (see ``index.IndexChanged``) reads its log
instead.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import stat
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC
from pathlib import Path
from typing import Optional

from . import events as ev
from .errors import EventNotFound, SessionNotFound, StoreIOError, TurnNotFound, UnsafePathError
from .events import Record
from .layout import EVENTS_FILE, INDEX_DIR, INDEX_FILE, session_dir_name, session_directory
from .redact import Redactor, redactor_for
from .session.index import BatchRecord, IndexChanged, SavedState, SessionIndex, Turn
from .session.lifecycle import LogState, event_row
from .session.logfile import LogFile
from .session.manifest import STATUS_ACTIVE, Manifest, load_manifest, load_marker
from .session.recovery import covers_prefix, scan_turn_base

logger = logging.getLogger("memstore")

_SNAPSHOT_ATTEMPTS = 3
# Records are read back from the log in batches of about this many bytes (a line longer than
# that alone), so a reader's memory does not grow with the session.
_READ_BATCH_BYTES = 1 << 20


def read_session(root: os.PathLike | str, session_id: str, *, redact: bool = False) -> SessionReader:
    """Open the session ``session_id`` under ``root`` for reading (a context manager).

    With ``redact`` every event, record, turn error and the manifest's source it returns has its
    secrets replaced by markers (the store's redactor, see :mod:`memstore.redact`): what a command
    shows a person.
    Without it (the default) the log's own values, as written.

    Raises :class:`SessionNotFound` if there is no such session, :class:`InvalidSessionId` for an
    id memstore refuses, :class:`StoreIOError` if the session cannot be read, and
    :class:`~memstore.redact.RedactConfigError` for a malformed ``config.toml`` (with ``redact``).
    """
    redactor = redactor_for(root) if redact else None
    reader = SessionReader(session_directory(root, session_id), session_id)
    reader.redactor = redactor
    return reader


def read_session_dir(session_dir: os.PathLike | str) -> SessionReader:
    """Open a session by its directory (the session id is taken from its metadata)."""
    return SessionReader(Path(session_dir), None)


def session_id_of(directory: Path) -> str:
    """The id of the session in ``directory``: the one its metadata or its log names, provided
    it maps to this directory (see ``session_dir_name``); else the directory's name."""
    manifest = load_manifest(directory)
    log = LogFile(directory)
    head = None
    try:
        log.open_readonly()
        head = log.head().session_id
    except (FileNotFoundError, StoreIOError):
        pass
    finally:
        log.close()
    return _matching_id(directory.name, [manifest.session_id if manifest else None, head])


def _matching_id(name: str, candidates: list) -> str:
    for candidate in candidates + [name]:
        if candidate is None:
            continue
        try:
            if session_dir_name(candidate) == name:
                return candidate
        except ValueError:
            continue
    return name


class SessionReader:
    """A read-only view of one session, as of when it was opened.

    ``manifest``, ``turn_count`` and ``event_count`` describe the session; ``turns()``,
    ``reconstruct_turn(n)``, ``iter_records()``, ``iter_events()`` and ``record(seq)`` read it.
    Close it (or use it as a context manager) to release its file and database handles.
    """

    def __init__(self, directory: Path, session_id: Optional[str]):
        self.directory = directory
        try:
            st = os.lstat(directory)
        except FileNotFoundError:
            raise SessionNotFound(session_id or directory.name, directory / EVENTS_FILE) from None
        except OSError as exc:
            raise StoreIOError.from_os_error("stat", directory, exc) from exc
        if stat.S_ISLNK(st.st_mode):
            raise UnsafePathError("read session", directory, "is a symlink; refusing to follow it")
        if not stat.S_ISDIR(st.st_mode):
            raise SessionNotFound(session_id or directory.name, directory / EVENTS_FILE)
        self.dir = directory
        self.log = LogFile(directory)
        # What events and turn errors pass through on their way out (None: returned as logged).
        self.redactor: Optional[Redactor] = None
        self.index: Optional[SessionIndex] = None
        self.index_path = directory / INDEX_DIR / INDEX_FILE
        # The records past what the index covers, parsed in memory: their seqs and positions
        # only (a session without an index is all tail; its events are read back when asked).
        self.tail_rows = _Tail(self.log)
        self._tail_turns: dict[int, Turn] = {}
        self.indexed_len = 0  # bytes of the log the index (as read) covers
        self.derived_seq = 0  # the lazy derived tables (search chunks) hold every record up to here
        self.indexed_seq = 0  # the largest seq in the index (as read); larger ones are in tail_rows
        # What the index held when it was read: a writer may add turns and rows to it while this
        # reader is open (it is then reread the usual way), and those are not this reader's.
        self._index_last_turn = 0
        self._index_open_turn: Optional[Turn] = None
        try:
            self._open(session_id)
        except BaseException:
            self.close()
            raise

    # -- opening ---------------------------------------------------------------------------

    def _open(self, session_id: Optional[str]) -> None:
        on_disk = load_manifest(self.dir)
        for attempt in range(_SNAPSHOT_ATTEMPTS):
            saved, seqs = self._snapshot()
            try:
                self.log.open_readonly()
            except FileNotFoundError:
                raise SessionNotFound(session_id or self.dir.name, self.log.path) from None
            self.end = self._complete_end()
            if (
                saved is not None
                and self.index is not None
                and covers_prefix(self.log, saved)
                and self.index.is_consistent(saved.manifest)
                and not self.index.changed()
            ):
                break
            if attempt < _SNAPSHOT_ATTEMPTS - 1 and saved is not None:
                # A writer may have rewritten the log between the two reads: look again.
                self._release_snapshot()
                self.log.close()
                continue
            saved = None
            break
        self.session_id = self._session_id(session_id, on_disk, saved)
        if saved is not None:
            manifest = saved.manifest
            if (
                on_disk is not None
                and on_disk.persisted_file_len == manifest.persisted_file_len
                and (on_disk.turn_count, on_disk.event_count) == (manifest.turn_count, manifest.event_count)
            ):
                # Retention may have marked the session completed; the writer keeps that too.
                manifest.status = on_disk.status
            self._index_last_turn = manifest.turn_count + (1 if manifest.in_turn else 0)
            self._index_open_turn = replace(saved.open_turn) if saved.open_turn is not None else None
            state = LogState(manifest, saved.open_turn)
            self.indexed_len = manifest.persisted_file_len
            self.indexed_seq, self.derived_seq = seqs
            self._catch_up(state, self.indexed_len, status_floor=0)
        else:
            self._release_snapshot()
            marker = load_marker(self.dir)
            base = scan_turn_base(
                self.log,
                self.index,
                self.dir,
                marker if marker is not None and marker.matches(self.log.length) else None,
                on_disk,
                None,
            )
            manifest = Manifest(
                session_id=self.session_id,
                created_at=on_disk.created_at if on_disk else "",
                updated_at=on_disk.updated_at if on_disk else "",
                turn_count=base - 1,
                retained_turn_base=base,
                status=on_disk.status if on_disk else STATUS_ACTIVE,
                next_seq=self.log.head().next_seq or 1,
                source=on_disk.source if on_disk else None,
            )
            state = LogState(manifest)
            self._catch_up(state, 0, status_floor=on_disk.persisted_file_len if on_disk else 0)
            if not manifest.created_at:
                # No record says when (VT Code writes no times) and no manifest does: the log's
                # modification time, the same for every reader (the clock would not be).
                manifest.created_at = manifest.updated_at = self._log_time()
        state.manifest.persisted_file_len = self.end
        self.state = state

    def _snapshot(self) -> tuple[Optional[SavedState], tuple[int, int]]:
        """Open the index read-only and start one read transaction: every later query sees the
        same snapshot (or, on an index read ``immutable`` that a writer touches later, is
        bounded by it). Returns what the index says, ``None`` when there is no usable index, and
        its largest seq and derived watermark, read in the same snapshot."""
        try:
            self.index = SessionIndex.open_readonly(self.index_path)
        except StoreIOError as exc:
            logger.warning("reading %s from its log: %s", self.dir, exc)
            self.index = None
        if self.index is None:
            return None, (0, 0)
        try:
            conn = self.index.conn
            conn.execute("BEGIN")
            saved = self.index.load()
            if saved is None:
                return None, (0, 0)
            # Straight from the connection: these are checked with the rest by index.changed().
            max_seq = conn.execute("SELECT coalesce(max(seq), 0) FROM events").fetchone()[0]
            row = conn.execute("SELECT seq FROM derived_state WHERE id = 1").fetchone()
            return saved, (max_seq, row[0] if row else 0)
        except (sqlite3.Error, StoreIOError, Exception) as exc:  # any index trouble: read the log instead
            logger.info("reading %s from its log (index unusable: %s)", self.dir, exc)
            self._release_snapshot()
            return None, (0, 0)

    def _read_log_instead(self, why: IndexChanged) -> None:
        """The index was rebuilt or rewritten after this reader read it: its offsets may describe
        another log than the one this reader holds (a cap rewrite replaces the file). Answer
        from that log alone, as a reader of a session without an index does; what the reader
        said of the session (its manifest, counts) stays as it was."""
        logger.info("reading %s from its log from now on: %s", self.dir, why)
        self._release_snapshot()
        reported = self.state.manifest
        state = LogState(
            Manifest(
                session_id=reported.session_id,
                created_at=reported.created_at,
                updated_at=reported.updated_at,
                turn_count=reported.retained_turn_base - 1,
                retained_turn_base=reported.retained_turn_base,
                status=reported.status,
                next_seq=self.log.head().next_seq or 1,
            )
        )
        self.tail_rows = _Tail(self.log)
        self.indexed_len = self.indexed_seq = self.derived_seq = 0
        self._index_last_turn, self._index_open_turn = 0, None
        self._catch_up(state, 0, status_floor=self.end)

    def _release_snapshot(self) -> None:
        if self.index is not None:
            try:
                self.index.conn.rollback()
            except sqlite3.Error:
                pass
            self.index.close()
            self.index = None

    def _log_time(self) -> str:
        from datetime import datetime

        try:
            mtime = os.fstat(self.log.rfd).st_mtime
        except OSError as exc:
            raise StoreIOError.from_os_error("stat", self.log.path, exc) from exc
        return ev.format_ts(datetime.fromtimestamp(mtime, UTC))

    def _complete_end(self) -> int:
        """The end of the last complete line: a torn tail is ignored, not cut."""
        return self.log.rfind_newline(0, self.log.length) + 1

    def _session_id(self, given: Optional[str], on_disk: Optional[Manifest], saved: Optional[SavedState]) -> str:
        if given is not None:
            return given
        known = [m.session_id for m in (saved.manifest if saved else None, on_disk) if m is not None]
        return _matching_id(self.dir.name, known + [self.log.head().session_id])

    def _catch_up(self, state: LogState, start: int, *, status_floor: int) -> None:
        """Apply the complete lines in ``[start, end)`` to ``state`` in memory."""
        tail = self.tail_rows
        for line, line_start, line_end in self.log.lines(start, self.end):
            record = ev.decode_line(line)
            if record is None:
                continue
            seq, row = state.apply_record(record, line_start, line_end, keep_status=line_start < status_floor)
            tail.append(seq, line_start, line_end - line_start, row[3])
        self._tail_turns = dict(state.dirty)
        state.dirty.clear()

    # -- what it says ----------------------------------------------------------------------

    @property
    def manifest(self) -> Manifest:
        """The session's manifest as of this reader (``persisted_file_len``: bytes read); with
        redaction, its ``source`` (working directory, branch, title) redacted too."""
        manifest = replace(self.state.manifest)
        if self.redactor is not None and manifest.source:
            manifest.source = self.redactor.redact_value(manifest.source)
        return manifest

    @property
    def turn_count(self) -> int:
        return self.state.manifest.turn_count

    @property
    def event_count(self) -> int:
        return self.state.manifest.event_count

    def turns(self, since: int = 0) -> list[Turn]:
        """Every turn the log holds (numbered ``since`` or later), oldest first (an open turn
        last, status ``open``)."""
        turns = {}
        if self.index is not None:
            try:
                rows = self.index.turns(since)
            except IndexChanged as exc:
                self._read_log_instead(exc)
                return self.turns(since)
            turns = {t.number: t for t in rows if t.number <= self._index_last_turn}
            if self._index_open_turn is not None and self._index_open_turn.number >= since:
                turns[self._index_open_turn.number] = replace(self._index_open_turn)
        turns.update((number, replace(turn)) for number, turn in self._tail_turns.items() if number >= since)
        return [self._redacted_turn(turns[n]) for n in sorted(turns)]

    def turn(self, number: int) -> Optional[Turn]:
        if number in self._tail_turns:
            return self._redacted_turn(replace(self._tail_turns[number]))
        if self.index is None or type(number) is not int or not 0 < number <= self._index_last_turn:
            return None
        if self._index_open_turn is not None and number == self._index_open_turn.number:
            return self._redacted_turn(replace(self._index_open_turn))
        try:
            found = self.index.turn(number)
        except IndexChanged as exc:
            self._read_log_instead(exc)
            return self.turn(number)
        return self._redacted_turn(found) if found is not None else None

    def _redacted_turn(self, turn: Turn) -> Turn:
        if self.redactor is not None and turn.error:
            turn.error = self.redactor.redact_text(turn.error)
        return turn

    def reconstruct_turn(self, number: int) -> list[dict]:
        """The events of turn ``number`` in log order; :class:`TurnNotFound` if the log does not
        hold it."""
        return [r.event for r in self.turn_records(number)]

    def turn_records(self, number: int) -> list[Record]:
        """The records (with their seqs) of turn ``number``."""
        turn = self.turn(number)
        if turn is None:
            raise TurnNotFound(self.session_id, number)
        return list(self._records(turn.start_offset, min(turn.end_offset, self.end), turn.first_seq or 1))

    def iter_records(self) -> Iterator[Record]:
        """Every valid record in log order, each with its seq."""
        return self._records(0, self.end, self.log.head().next_seq or 1)

    def iter_events(self) -> Iterator[dict]:
        for record in self.iter_records():
            yield record.event

    def position(self, seq: int) -> Optional[tuple[int, int, Optional[int]]]:
        """``(offset, length, turn)`` of the record with ``seq`` in the log, or ``None``."""
        found = self.tail_rows.position(seq) if type(seq) is int else None
        if found is None and self.index is not None and type(seq) is int and 0 < seq <= self.indexed_seq:
            try:
                found = self.index.event_position(seq)
            except IndexChanged as exc:
                self._read_log_instead(exc)
                return self.position(seq)
        return found

    def record(self, seq: int) -> Record:
        """The record with ``seq``; :class:`EventNotFound` if the session does not hold it."""
        line = self.record_line(seq)
        record = ev.decode_line(line)
        if record is None:
            raise EventNotFound(self.session_id, seq)
        if self.redactor is not None:
            return record._replace(seq=seq, event=self.redactor.redact_value(record.event))
        return record._replace(seq=seq)

    def record_line(self, seq: int) -> bytes:
        """The exact line of the record with ``seq`` in ``events.jsonl`` (newline included)."""
        found = self.position(seq) if type(seq) is int else None
        if found is None:
            raise EventNotFound(self.session_id, seq)
        offset, length, _turn = found
        return self.log.pread(offset, length)

    def underived_records(self) -> Iterator[BatchRecord]:
        """The records the index's lazy derived tables (the search chunks) do not hold yet, in
        log order: those the index has past its watermark, then those past the index. Read
        from the log a bounded batch at a time."""
        return self.records_from(self.derived_seq)

    def records_from(self, after: int) -> Iterator[BatchRecord]:
        """The records with a seq past ``after``, in log order, as :meth:`underived_records`
        gives them (those the index has, then those past it)."""
        while self.index is not None:
            try:
                rows = self.index.underived(after, 2_000, self.indexed_seq)
            except IndexChanged as exc:
                self._read_log_instead(exc)  # its tail holds every record, from the log
                break
            if not rows:
                break
            for batch in _byte_batches(rows, lambda row: (row[1], row[2])):
                start = batch[0][1]
                data = self.log.pread(start, batch[-1][1] + batch[-1][2] - start)
                for seq, offset, length, turn, ts in batch:
                    yield BatchRecord(
                        seq, turn, ts, offset, length, line=data[offset - start : offset - start + length]
                    )
                del data
            after = rows[-1][0]
        yield from self.tail_rows.records(after)

    def _records(self, start: int, end: int, next_seq: int) -> Iterator[Record]:
        redact = self.redactor.redact_value if self.redactor is not None else None
        for line, _line_start, _line_end in self.log.lines(start, end):
            record = ev.decode_line(line)
            if record is not None:
                seq = ev.assign_seq(record.seq, next_seq)
                next_seq = seq + 1
                if redact is not None:
                    record = record._replace(event=redact(record.event))
                yield record if seq == record.seq else record._replace(seq=seq)

    # -- closing ---------------------------------------------------------------------------

    def close(self) -> None:
        self._release_snapshot()
        self.log.close()

    def __enter__(self) -> SessionReader:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<SessionReader {getattr(self, 'session_id', self.directory.name)!r}>"


class _Tail:
    """The records a reader parsed past its index, in compact columns: seq, offset, length and
    turn (0: none) of each, in log order. ``len()`` counts them; ``tail[i]`` is the ``i``-th
    one's index row (read back from the log)."""

    def __init__(self, log: LogFile):
        self.log = log
        self.seqs = array("q")
        self.offsets = array("q")
        self.lengths = array("q")
        self.turns = array("q")

    def append(self, seq: int, offset: int, length: int, turn: Optional[int]) -> None:
        self.seqs.append(seq)
        self.offsets.append(offset)
        self.lengths.append(length)
        self.turns.append(turn or 0)

    def __len__(self) -> int:
        return len(self.seqs)

    def __getitem__(self, i: int) -> tuple:
        seq, offset, length, turn = self.seqs[i], self.offsets[i], self.lengths[i], self.turns[i] or None
        record = ev.decode_line(self.log.pread(offset, length))
        return event_row(
            seq, offset, length, turn, record.ts if record else None, record.event if record else {"type": ""}
        )

    @property
    def last_seq(self) -> int:
        return self.seqs[-1] if self.seqs else 0

    def position(self, seq: int) -> Optional[tuple[int, int, Optional[int]]]:
        i = bisect_left(self.seqs, seq)
        if i == len(self.seqs) or self.seqs[i] != seq:
            return None
        return self.offsets[i], self.lengths[i], self.turns[i] or None

    def records(self, after: int) -> Iterator[BatchRecord]:
        """The records with a seq past ``after``, decoded from the log a batch at a time."""
        first = bisect_right(self.seqs, after)
        for batch in _byte_batches(range(first, len(self.seqs)), lambda i: (self.offsets[i], self.lengths[i])):
            start = self.offsets[batch[0]]
            data = self.log.pread(start, self.offsets[batch[-1]] + self.lengths[batch[-1]] - start)
            for i in batch:
                offset, length = self.offsets[i], self.lengths[i]
                record = ev.decode_line(data[offset - start : offset - start + length])
                if record is None:  # the log changed under the reader (it cannot, short of an edit)
                    raise StoreIOError("read", self.log.path, f"no record at byte {offset} any more")
                yield BatchRecord(self.seqs[i], self.turns[i] or None, record.ts, offset, length, record.event)
            del data


def _byte_batches(items, span) -> Iterator[list]:
    """``items`` (in log order) in runs whose bytes, ``span(item) -> (offset, length)``, add up to
    about ``_READ_BATCH_BYTES`` at most (a longer record alone)."""
    batch: list = []
    first = 0
    for item in items:
        offset, length = span(item)
        if batch and offset + length - first > _READ_BATCH_BYTES:
            yield batch
            batch = []
        if not batch:
            first = offset
        batch.append(item)
    if batch:
        yield batch
