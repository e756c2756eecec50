"""The one turn-lifecycle state machine, shared by append, rescan and the read-only reader.

Every accepted record advances :class:`LogState` by one step: ``turn.started`` opens a turn,
``turn.completed`` / ``turn.failed`` / ``turn.aborted`` close it, ``thread.completed`` completes
the session, and every other event inside an open turn belongs to that turn.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Optional

from .. import events as ev
from ..events import Record
from .index import TURN_ABORTED, TURN_COMPLETED, TURN_FAILED, TURN_INTERRUPTED, TURN_OPEN, Turn
from .manifest import STATUS_ACTIVE, STATUS_COMPLETED, Manifest

_TURN_STATUS = {ev.TURN_COMPLETED: TURN_COMPLETED, ev.TURN_FAILED: TURN_FAILED, ev.TURN_ABORTED: TURN_ABORTED}


class LogState:
    """The session state that append and scan both advance, one event at a time.

    ``manifest`` carries the counters (``turn_count`` counts closed turns, ``event_count`` every
    accepted record, thread events included); ``open_turn`` is the turn in progress; ``dirty``
    collects the turns changed since the index last stored them.
    """

    __slots__ = ("manifest", "open_turn", "dirty", "now", "redact_error")

    def __init__(self, manifest: Manifest, open_turn: Optional[Turn] = None):
        self.manifest = manifest
        self.open_turn = open_turn if manifest.in_turn else None
        self.dirty: dict[int, Turn] = {}
        self.now = ev.utc_now()  # refreshed only when a record claims a later time
        # What a failed or aborted turn's message goes through before it is kept (the store's
        # redaction, set by the writer): the index must not hold a secret such a message quotes.
        self.redact_error: Optional[Callable[[Any], Any]] = None

    def apply(
        self, kind: str, event: dict, start: int, end: int, seq: Optional[int], ts: Optional[str]
    ) -> tuple[bool, Optional[int]]:
        """Advance the state by one accepted event occupying bytes ``[start, end)``.

        Returns ``(boundary, turn)``: whether the event ends a unit of work (a turn closed or the
        thread completed), and the number of the turn it belongs to (``None`` outside turns).

        Every event inside an open turn belongs to it, lifecycle or not, so a turn's byte range
        and its event count always describe the same lines. A ``turn.started`` while a turn is
        open closes that turn as ``interrupted`` (VT Code would number both turns the same).
        """
        m = self.manifest
        m.event_count += 1
        turn = self.open_turn
        if turn is not None and kind not in ev.LIFECYCLE_KINDS:
            # The common case, once per event of every append and scan: an item inside the
            # open turn (what _extend does, inlined).
            turn.end_offset = end
            turn.event_count += 1
            if seq is not None:
                turn.last_seq = seq
                if turn.first_seq is None:
                    turn.first_seq = seq
            number = turn.number
            self.dirty[number] = turn
            return False, number
        if kind == ev.TURN_STARTED:
            if turn is not None:
                turn.status = TURN_INTERRUPTED
                self.dirty[turn.number] = turn
                m.turn_count = max(m.turn_count, turn.number)
            started = ts or _context_timestamp(event)
            turn = Turn(m.turn_count + 1, TURN_OPEN, start, end, 1, seq, seq, started)
            model = event.get("model")
            if type(model) is str:
                turn.model = model
            self.open_turn = turn
            self.dirty[turn.number] = turn
            m.status = STATUS_ACTIVE
            m.in_turn = True
            return False, turn.number
        if turn is None:
            if kind == ev.THREAD_STARTED:
                m.status = STATUS_ACTIVE
                _take_source(m, event)
            elif kind == ev.THREAD_COMPLETED:
                m.status = STATUS_COMPLETED
                return True, None
            return kind in ev.TURN_ENDS, None
        self._extend(turn, end, seq)
        if kind in ev.TURN_ENDS:
            turn.status = _TURN_STATUS[kind]
            turn.ended_at = ts or event.get("completed_at")
            (turn.input_tokens, turn.cached_input_tokens, turn.cache_creation_tokens, turn.output_tokens) = ev.usage_of(
                event
            )
            if kind == ev.TURN_FAILED:
                turn.error = event.get("message")
            elif kind == ev.TURN_ABORTED:
                turn.error = event.get("reason")
            if turn.error is not None and self.redact_error is not None:
                turn.error = self.redact_error(turn.error)
            model = event.get("model")
            if type(model) is str:
                turn.model = model
            m.turn_count = max(m.turn_count, turn.number)
            m.in_turn = False
            self.open_turn = None
            return True, turn.number
        if kind == ev.THREAD_STARTED:
            m.status = STATUS_ACTIVE
            _take_source(m, event)
        elif kind == ev.THREAD_COMPLETED:
            m.status = STATUS_COMPLETED
            return True, turn.number
        return False, turn.number

    def _extend(self, turn: Turn, end: int, seq: Optional[int]) -> None:
        turn.end_offset = end
        turn.event_count += 1
        if seq is not None:
            turn.last_seq = seq
            if turn.first_seq is None:
                turn.first_seq = seq
        self.dirty[turn.number] = turn

    def apply_record(self, record: Record, start: int, end: int, keep_status: bool = False) -> tuple[int, tuple]:
        """Advance the state by one record read back from the log; return ``(seq, row)``: the
        record's sequence number and its index row.

        Every record gets a seq, and the same one on every rescan: the envelope's when it is
        past the previous record's, else the previous one's plus one (lines VT Code wrote have
        none). So seqs are unique and increasing in log order, and a rebuild from the log alone
        reproduces them (a cap rewrite leaves the first retained seq in the log's head).

        With ``keep_status`` the session's status is left as it was: a status the log no longer
        shows (set by retention, or by a ``thread.completed`` the cap evicted) stands against
        the records the old metadata already covered.
        """
        seq, ts, event = record
        manifest = self.manifest
        status = manifest.status
        if seq is None or seq < manifest.next_seq:  # ev.assign_seq, inlined: once per event
            seq = manifest.next_seq
        manifest.next_seq = seq + 1
        _boundary, turn = self.apply(event["type"], event, start, end, seq, ts)
        if keep_status:
            manifest.status = status
        row = (seq, start, end - start, turn, ts, str(event["type"]))  # event_row, inlined
        if ts is not None:
            if ts > self.now:
                # A time in the future (a wrong clock, a hand-written line) would keep the
                # session "recent" for good, out of retention's reach: the present stands in.
                self.now = ev.utc_now()
                ts = min(ts, self.now)
            if not manifest.created_at:
                manifest.created_at = ts
            if ts > manifest.updated_at:
                manifest.updated_at = ts  # only forward: complete() may have bumped it past the log
        return seq, row


_SOURCE_KEYS_MAX = 32


def _take_source(manifest: Manifest, event: dict) -> None:
    """Keep what a ``thread.started`` says about the session's origin (an importer's ``source``
    object: agent, version, cwd, git branch, the imported file, a parent session)."""
    source = event.get("source")
    if isinstance(source, dict) and source:
        manifest.source = {str(k): v for k, v in list(source.items())[:_SOURCE_KEYS_MAX]}


def _context_timestamp(event: dict) -> Optional[str]:
    context = event.get("context")
    if isinstance(context, dict) and isinstance(context.get("timestamp"), str):
        return context["timestamp"]
    return None


def event_row(
    seq: Optional[int], offset: int, length: int, turn: Optional[int], ts: Optional[str], event: dict
) -> tuple:
    """The ``events`` index row of one record (what it says goes to ``event_details``, later)."""
    return (seq, offset, length, turn, ts, str(event["type"]))
