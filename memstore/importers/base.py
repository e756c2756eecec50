"""What every source parser shares: turn bookkeeping, tool-call pairing, usage sums, timestamps
and the notes that become the report's problems.

A parser is a deterministic state machine over the complete lines of one source. All of its
state lives in one JSON-ready dict (``Parser.s``), so an import can stop after any line, save
that dict as carry-over, and a later import can resume from the same byte offset and produce
exactly the events a single pass over the whole source would have produced (the prefix
property the incremental import relies on).

Events are emitted as soon as a line proves them, with two deliberate holds:

- a turn's end marker is held while the source may still add items to that turn (Codex writes
  the calls of an aborted turn after ``turn_aborted``; a Claude interruption is followed by the
  turn's last lines), and it is emitted when a later line shows the turn is over;
- tool calls are held until their result arrives, and are emitted as one paired item.

``finalize`` is called only for a settled source (see the driver): it closes what is still
open and completes the thread.
"""

from __future__ import annotations

import base64
import re
from typing import Any, Optional

import orjson

from ..errors import InvalidEvent
from ..events import encode_record, normalize_ts

# A timestamp already in memstore's form (what both agents write) needs no datetime round trip.
_CANONICAL_TS = re.compile(r"\d{4}-(?:0[1-9]|1[0-2])-(?:0[1-9]|[12]\d|3[01])T(?:[01]\d|2[0-3]):[0-5]\d:[0-5]\d\.\d{3}Z")

# Codex and Claude both say "rejected by user" / "doesn't want to proceed" for a refused tool.
_DECLINED = re.compile(r"^(?:[\w ]{0,40} )?rejected by user\.?$")
CLAUDE_DECLINED_MARKERS = ("doesn't want to proceed with this tool use", "doesn't want to take this action")

THREAD_OUTCOME = "source_idle"
# The event a source record the importer does not understand is kept as (see Parser.keep).
UNRECOGNIZED = "import.unrecognized"
# At most this many records before the line that starts the thread are kept (then only counted).
_EARLY_LIMIT = 1000


def u64(value: Any) -> int:
    """A token counter from the source: an int >= 0, anything else counts as 0."""
    return value if type(value) is int and value >= 0 else 0


def is_declined_text(text: str) -> bool:
    """Whether a tool's whole output is Codex's refusal message."""
    text = text.strip()
    return len(text) < 80 and bool(_DECLINED.match(text))


class Parser:
    """Base of the source parsers. Subclasses implement ``feed``, ``turn_usage`` and
    ``flush_call`` and may extend ``initial_state``.

    ``out`` collects ``(event, ts)`` pairs for the driver; ``notes`` collects what was skipped,
    kept without being understood or ignored, keyed by reason, as ``[first line, count,
    skipped]``; ``skipped`` counts the lines that made no event and were not kept (a result
    whose call never came, a response repeated from an earlier turn, ...).

    A record the parser does not understand (not JSON, an unknown line, event or item type) is
    never dropped: :meth:`keep` makes it an ``import.unrecognized`` event carrying the raw line
    and its number, and counts it by type in ``s["stats"]``, with the records read, so that a
    report can say how much of a source was understood.
    """

    importer = ""
    agent = ""

    def __init__(self, session_id: str, path: str, context: Optional[dict] = None, state: Optional[dict] = None):
        self.session_id = session_id
        self.path = path
        self.out: list[tuple[dict, str]] = []
        self.notes: dict[str, list] = {}
        self.skipped = 0
        if state is None:
            state = self.initial_state()
            state["context"] = dict(context or {})
        self.s = state
        self._raw_ts: Optional[str] = None
        self._line = b""  # the raw line being parsed (what keep() keeps)
        # The latest time a line may carry (memstore form; set by the driver from its clock): a
        # later one is a wrong clock, and would date the session past the present for ever.
        self.ts_limit: Optional[str] = None
        self.after_load()

    # -- state ---------------------------------------------------------------------------

    def initial_state(self) -> dict:
        return {
            "started": False,  # thread.started emitted
            "ts": None,  # last good timestamp (memstore form)
            "turn": None,  # the open turn (see new_turn)
            "calls": {},  # unpaired tool calls, by call id, in arrival order
            "results": {},  # results written before their call, by call id (held for it)
            "turns": 0,  # turns closed
            "usage": [0, 0, 0, 0],  # the four usage counters summed over closed turns
            "last_end": None,  # type of the last turn end emitted
            "turn_cut": False,  # the open turn is being closed because a new one started
            "model": None,  # the model the source last named
            "finalized": False,
            "stats": {"records": 0, "unrecognized": {}},  # records read; records kept but not understood, by type
            "early": [],  # records kept before thread.started (emitted right after it)
            "version": None,  # the agent version the source names (thread.started's agent_version)
        }

    def after_load(self) -> None:
        """Rebuild derived, unsaved helpers after the state was created or restored."""

    def new_turn(self, ts: str, explicit: bool) -> dict:
        # explicit: the source has its own end marker for this turn, so a turn that is
        # superseded without one was cut short ("unfinished") rather than simply over.
        return {"ts": ts, "explicit": explicit, "abort": None, "error": None, "model": None}

    # -- notes and timestamps ------------------------------------------------------------

    def parse(self, line: bytes, lineno: int) -> Optional[dict]:
        """The JSON object a source line holds, or ``None`` when it is not one (then the line is
        kept, see :meth:`keep`); a blank line is passed over without a word."""
        self._line = line
        try:
            obj = orjson.loads(line)
        except orjson.JSONDecodeError:
            if line.strip():
                self.keep(lineno, "(not JSON)", "unparsable line (not JSON)")
            return None
        if type(obj) is not dict:
            self.keep(lineno, "(not a JSON object)", "line is not a JSON object")
            return None
        return obj

    def keep(self, lineno: Optional[int], record_type: str, reason: str, raw: Any = None) -> None:
        """Keep a source record the importer does not understand: an ``import.unrecognized``
        event ``{line, record_type, reason, raw}`` (``raw``: the line being parsed, or the
        given part of it, as text; ``raw_base64`` for bytes that are not UTF-8), counted by
        ``record_type`` and reported under ``reason``. Before the thread has started the
        event waits, and follows ``thread.started``."""
        by_type = self.s["stats"]["unrecognized"]
        by_type[record_type] = by_type.get(record_type, 0) + 1
        self.note(lineno, f"{reason}; kept as {UNRECOGNIZED}", skipped=False)
        event: dict = {"type": UNRECOGNIZED, "line": lineno, "record_type": record_type, "reason": reason}
        if raw is None:
            raw = self._line
        if isinstance(raw, (bytes, bytearray)):
            try:
                event["raw"] = bytes(raw).decode("utf-8")
            except UnicodeDecodeError:
                event["raw_base64"] = base64.b64encode(raw).decode("ascii")
        else:
            event["raw"] = orjson.dumps(raw).decode("utf-8")
        if not self.s["started"]:
            early = self.s["early"]
            if len(early) < _EARLY_LIMIT:
                early.append(event)
            else:
                self.note(lineno, "too many records before the session's first line; the rest are only counted")
            return
        self.emit(event, self.s["ts"] or self.s["context"].get("default_ts") or "1970-01-01T00:00:00.000Z")

    def note(self, lineno: Optional[int], reason: str, *, skipped: bool = True) -> None:
        """Record something the import could not use; ``skipped`` counts the line as skipped."""
        if skipped:
            self.skipped += 1
        entry = self.notes.get(reason)
        if entry is None:
            self.notes[reason] = [lineno, 1, skipped]
        else:
            entry[1] += 1

    def line_ts(self, value: Any, lineno: int) -> str:
        """The event time of a line: its timestamp in memstore's form, else the last good one
        (a line without a usable time still keeps the source's order). A time past
        ``ts_limit`` is not usable: a wrong clock must not date the session past the present."""
        if value == self._raw_ts and value is not None:
            # Several lines often share one write time: validate each distinct string once.
            self.s["ts"] = value
            return value
        limit = self.ts_limit
        if type(value) is str and _CANONICAL_TS.fullmatch(value):
            if limit is None or value <= limit:  # the canonical form orders as text
                self._raw_ts = value
                self.s["ts"] = value
                return value
            self.note(lineno, f"timestamp {value!r} is in the future; the previous one is used", skipped=False)
        elif value is not None:
            try:
                ts = normalize_ts(value)
            except InvalidEvent:
                self.note(
                    lineno, f"timestamp {str(value)[:40]!r} is not RFC 3339; the previous one is used", skipped=False
                )
            else:
                if limit is None or ts <= limit:
                    self.s["ts"] = ts
                    return ts
                self.note(
                    lineno, f"timestamp {str(value)[:40]!r} is in the future; the previous one is used", skipped=False
                )
        if self.s["ts"] is None:
            self.s["ts"] = self.s["context"].get("default_ts") or "1970-01-01T00:00:00.000Z"
        return self.s["ts"]

    # -- emitting ------------------------------------------------------------------------

    def emit(self, event: dict, ts: str) -> None:
        self.out.append((event, ts))

    def start_thread(self, ts: str, source: dict) -> None:
        """Emit ``thread.started`` with the source metadata (keys with no value left out)."""
        self.s["started"] = True
        source = {k: v for k, v in source.items() if v not in (None, "", {}, [])}
        event = {"type": "thread.started", "thread_id": self.session_id, "source": source}
        try:
            encode_record(1, ts, event)
        except InvalidEvent:
            # Metadata the log cannot hold (JSON nested too deep) must not make the session
            # unstorable: what cannot be written is left out, and reported.
            dropped = []
            for key, value in list(source.items()):
                try:
                    encode_record(
                        1, ts, {"type": "thread.started", "thread_id": self.session_id, "source": {key: value}}
                    )
                except InvalidEvent:
                    dropped.append(key)
                    del source[key]
            self.note(
                None, f"thread metadata that cannot be stored as JSON left out ({', '.join(dropped)})", skipped=False
            )
        version = source.get("agent_version")
        self.s["version"] = version if isinstance(version, str) else None
        self.emit(event, ts)
        for early in self.s["early"]:
            self.emit(early, ts)
        self.s["early"] = []

    def begin_turn(self, ts: str, *, explicit: bool, extra: Optional[dict] = None) -> None:
        """Open a turn, first closing the one still open (a new turn proves it over)."""
        if self.s["turn"] is not None:
            self.supersede_turn()
        event = {"type": "turn.started"}
        if extra:
            event.update(extra)
        self.emit(event, ts)
        self.s["turn"] = self.new_turn(ts, explicit)

    def item(self, item: dict, ts: str) -> None:
        """Emit a completed item, opening a turn when none is (activity without a prompt,
        such as the answer to a slash command, still belongs to a turn of its own)."""
        turn = self.s["turn"]
        if turn is None:
            self.begin_turn(ts, explicit=False)
        elif turn.get("adoptable"):
            turn["adoptable"] = False  # the turn has more than its prompt: it is not a task's prompt
        self.out.append(({"type": "item.completed", "item": item}, ts))

    def close_turn(self, ts: str) -> None:
        """Emit the open turn's end: ``turn.aborted`` if it was interrupted (or cut short),
        ``turn.failed`` if its last word was an error, else ``turn.completed``; each with the
        turn's usage and model. Calls still without a result are emitted first."""
        turn = self.s["turn"]
        for call_id in list(self.s["calls"]):
            self.flush_call(self.s["calls"].pop(call_id), ts)
        self.drop_results()
        usage = self.turn_usage(turn)
        abort = turn["abort"]
        if abort is None and turn["explicit"] and self.s["turn_cut"]:
            abort = "unfinished"
        if abort is not None:
            event = {"type": "turn.aborted", "reason": abort, "usage": usage}
        elif turn["error"] is not None:
            event = {"type": "turn.failed", "message": turn["error"], "usage": usage}
        else:
            event = {"type": "turn.completed", "usage": usage}
        model = turn["model"] or self.s.get("model")
        if model:
            event["model"] = model
        self.emit(event, ts)
        total = self.s["usage"]
        for i, key in enumerate(("input_tokens", "cached_input_tokens", "cache_creation_tokens", "output_tokens")):
            total[i] += usage[key]
        self.s["turns"] += 1
        self.s["last_end"] = event["type"]
        self.s["turn"] = None
        self.s["turn_cut"] = False

    def supersede_turn(self) -> None:
        """A new turn starts while one is open: an explicit turn without its end marker was
        cut short; an implicit one (ended by the next prompt) is simply over."""
        turn = self.s["turn"]
        if turn is not None:
            self.s["turn_cut"] = True
            self.close_turn(turn["ts"])

    # -- subclass hooks ------------------------------------------------------------------

    def feed(self, line: bytes, lineno: int) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def feed_lines(self, lines: list, lineno: int) -> int:
        """Feed ``lines``, the first numbered ``lineno + 1``; return the last line number."""
        feed = self.feed
        for line in lines:
            lineno += 1
            feed(line, lineno)
        return lineno

    def turn_usage(self, turn: dict) -> dict:  # pragma: no cover - abstract
        raise NotImplementedError

    def flush_call(self, call: dict, ts: str) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def hold_result(self, call_id: Any, result: dict) -> bool:
        """Hold a result that came before its call (paired when the call comes, in its turn);
        return whether it was held. A second result for one id is not held."""
        results = self.s.setdefault("results", {})
        if not isinstance(call_id, str) or call_id in results:
            return False
        results[call_id] = result
        return True

    def take_result(self, call_id: Any) -> Optional[dict]:
        """The held result of the call ``call_id``, if one came before it."""
        results = self.s.get("results")
        return results.pop(call_id, None) if results and isinstance(call_id, str) else None

    def drop_results(self) -> None:
        """The turn is over: results still waiting for their call never get it (reported)."""
        results = self.s.get("results")
        if results:
            for result in results.values():
                self.orphan_result(result)
            results.clear()

    def orphan_result(self, result: dict) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def extra_usage(self) -> Optional[dict]:
        """Usage the source recorded outside every turn (added to ``thread.completed``)."""
        return None

    # -- the end -------------------------------------------------------------------------

    def reopen(self) -> None:
        """The finalized source grew again (a resumed session): go on from where it was
        finalized. The session's ``thread.completed`` stays where it is; what the source adds
        follows it (new turns reopen the session), and a later settling completes it again."""
        self.s["finalized"] = False

    def finalize(self) -> None:
        """The source is settled: close the open turn and complete the thread.

        ``thread.completed`` says ``outcome_code: "source_idle"``: the importer cannot know
        that the agent will never resume the session, only that its log stopped changing.
        A source that grows after this is re-imported into a new generation (see the driver).
        """
        if self.s["finalized"]:
            return
        self.s["finalized"] = True
        if not self.s["started"]:
            return
        ts = self.s["ts"] or "1970-01-01T00:00:00.000Z"
        if self.s["turn"] is not None:
            ts = self.s["turn"]["ts"]
            self.supersede_turn()  # a turn the source ends itself, left without its end, was cut short
        elif self.s["calls"]:
            for call_id in list(self.s["calls"]):
                self.flush_call(self.s["calls"].pop(call_id), ts)
        self.drop_results()
        keys = ("input_tokens", "cached_input_tokens", "cache_creation_tokens", "output_tokens")
        totals = list(self.s["usage"])
        extra = self.extra_usage()
        if extra:
            totals = [t + extra.get(key, 0) for t, key in zip(totals, keys)]
        usage = usage_dict(*totals)
        subtype = {"turn.aborted": "cancelled", "turn.failed": "error_during_execution"}.get(
            self.s["last_end"], "success"
        )
        self.emit(
            {
                "type": "thread.completed",
                "thread_id": self.session_id,
                "session_id": self.session_id,
                "subtype": subtype,
                "outcome_code": THREAD_OUTCOME,
                "usage": usage,
                "num_turns": self.s["turns"],
            },
            ts,
        )


_U64_MAX = 2**64 - 1


def clamp(value: int) -> int:
    """A counter within u64 (sums of hostile source values could leave it)."""
    return 0 if value < 0 else _U64_MAX if value > _U64_MAX else value


def usage_dict(input_tokens: int, cached: int, creation: int, output: int) -> dict:
    """memstore's Usage object: all four counters, each within u64."""
    return {
        "input_tokens": clamp(input_tokens),
        "cached_input_tokens": clamp(cached),
        "cache_creation_tokens": clamp(creation),
        "output_tokens": clamp(output),
    }


def parse_patch(patch: str) -> list[dict]:
    """The files a Codex patch (``*** Begin Patch`` format) touches: ``[{path, kind}]`` with
    kind add/update/delete; ``*** Move to:`` adds ``move_path`` to the update it follows."""
    changes: list[dict] = []
    for raw in patch.splitlines():
        line = raw.strip()
        if line.startswith("*** Add File: "):
            changes.append({"path": line[14:].strip(), "kind": "add"})
        elif line.startswith("*** Update File: "):
            changes.append({"path": line[17:].strip(), "kind": "update"})
        elif line.startswith("*** Delete File: "):
            changes.append({"path": line[17:].strip(), "kind": "delete"})
        elif line.startswith("*** Move to: ") and changes:
            changes[-1]["move_path"] = line[13:].strip()
    return changes
