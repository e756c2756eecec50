"""The event contract: the line envelope, lifecycle kinds and their validation, and what each
event says (type, item, tool, status, usage, text).

This is the only module that decodes events. A line of ``events.jsonl`` is one compact JSON
object ending in ``\\n``::

    {"schema_version":"0.18.0","seq":17,"ts":"2026-11-30T08:30:29.123Z","event":{"type":...}}

``seq`` and ``ts`` are memstore's additions; lines written by VT Code carry neither and are
accepted. ``schema_version`` must be a string (any string: readers do not check it), as VT Code
requires: a line without one is not a record, for memstore as for VT Code, so the two count the
same events and number the same turns in one log (such a line stays in the log, skipped by every
view; see docs/vtcode.md). Unknown event types and unknown keys are kept and passed through
untouched.
"""

from __future__ import annotations

import math
import re
import time
from datetime import UTC, datetime
from typing import Any, NamedTuple, Optional

import orjson

from .errors import InvalidEvent

SCHEMA_VERSION = "0.18.0"

THREAD_STARTED = "thread.started"
THREAD_COMPLETED = "thread.completed"
TURN_STARTED = "turn.started"
TURN_COMPLETED = "turn.completed"
TURN_FAILED = "turn.failed"
# memstore's extension: the user (or the agent's runtime) stopped the turn; not a failure.
TURN_ABORTED = "turn.aborted"
TURN_ENDS = frozenset({TURN_COMPLETED, TURN_FAILED, TURN_ABORTED})
LIFECYCLE_KINDS = frozenset({THREAD_STARTED, THREAD_COMPLETED, TURN_STARTED, TURN_COMPLETED, TURN_FAILED, TURN_ABORTED})
USAGE_FIELDS = ("input_tokens", "cached_input_tokens", "cache_creation_tokens", "output_tokens")
_U64_MAX = 2**64 - 1
_I64_MAX = 2**63 - 1  # SQLite integers are signed 64-bit; counters saturate here
# The largest seq or turn number memstore accepts from a log or metadata: it stays exact as a
# JSON number everywhere (JavaScript, Datasette's pages) and leaves room to count on. A larger
# one is treated as absent, so a tampered line or manifest cannot exhaust the numbering.
MAX_SEQ = 2**53 - 1
# A seq floor that only metadata or cut bytes claim (a manifest's next_seq, a torn tail's seqs)
# is believed only this far: whatever they say, room is left to count on below MAX_SEQ.
SEQ_FLOOR_MAX = MAX_SEQ - 2**32

# --------------------------------------------------------------------------------------------
# Timestamps


_ts_cache: tuple = (None, "", None, "")


def utc_now() -> str:
    """The current UTC time as RFC 3339 with milliseconds and a ``Z``: ``2026-11-30T08:30:29.123Z``.

    One format everywhere, so timestamps also sort correctly as strings.
    """
    global _ts_cache
    ms = int(time.time() * 1000)
    # One tuple, so threads never pair a time with another's text. An append takes a few
    # microseconds: most of them fall in the millisecond of the one before.
    cached_ms, text, cached_second, prefix = _ts_cache
    if ms == cached_ms:
        return text
    second = ms // 1000
    if second != cached_second:
        prefix = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
    text = f"{prefix}.{ms % 1000:03d}Z"
    _ts_cache = (ms, text, second, prefix)
    return text


def format_ts(dt: datetime) -> str:
    """Format an aware (or UTC-naive) datetime in memstore's timestamp format."""
    if dt.tzinfo is not None:
        dt = dt.astimezone(UTC)
    return (
        f"{dt.year:04d}-{dt.month:02d}-{dt.day:02d}T{dt.hour:02d}:{dt.minute:02d}:{dt.second:02d}."
        f"{dt.microsecond // 1000:03d}Z"
    )


_MEMSTORE_TS = re.compile(r"\d{4}-(?:0[1-9]|1[0-2])-(?:0[1-9]|1\d|2[0-8])T(?:[01]\d|2[0-3]):[0-5]\d:[0-5]\d\.\d{3}Z\Z")


def normalize_ts(value: Any) -> str:
    """``value`` (an RFC 3339 timestamp) in memstore's format; :class:`InvalidEvent` if it is not one."""
    if type(value) is str and _MEMSTORE_TS.match(value):
        return value  # already in memstore's format (what importers mostly pass): no round trip
    try:
        dt = parse_ts(value)
        if dt is not None:
            dt = dt.astimezone(UTC)
    except (OverflowError, ValueError):
        dt = None
    if dt is None:
        raise InvalidEvent(f"ts must be an RFC 3339 timestamp string, not {value!r}")
    return format_ts(dt)


def parse_ts(value: Any) -> Optional[datetime]:
    """Parse an RFC 3339 timestamp (``Z`` or an offset; 0-9 fractional digits) to an aware
    datetime; ``None`` when it is not one."""
    if not isinstance(value, str) or len(value) < 19:
        return None
    text = value.strip()
    if text.endswith(("Z", "z")):
        text = text[:-1] + "+00:00"
    if "." in text:
        head, _, rest = text.partition(".")
        digits = ""
        while rest and rest[0].isdigit():
            digits, rest = digits + rest[0], rest[1:]
        text = f"{head}.{(digits + '000000')[:6]}{rest}" if digits else head + rest
    try:
        dt = datetime.fromisoformat(text)
    except ValueError:
        return None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return dt


# --------------------------------------------------------------------------------------------
# Validation


def _is_u64(value: Any) -> bool:
    return type(value) is int and 0 <= value <= _U64_MAX


def _opt_str(event: dict, key: str) -> bool:
    value = event.get(key)
    return value is None or isinstance(value, str)


def valid_usage(usage: Any, *, required_fields: bool = False) -> bool:
    """Whether ``usage`` is a Usage object: each field a u64, or missing/null ([N] defaults 0)."""
    if not isinstance(usage, dict):
        return False
    for field in USAGE_FIELDS:
        value = usage.get(field)
        if value is None:
            if required_fields:
                return False
        elif not _is_u64(value):
            return False
    return True


def _valid_token_breakdown(value: Any) -> bool:
    if value is None:
        return True
    if not isinstance(value, dict):
        return False
    return all(v is None or _is_u64(v) for k, v in value.items() if k.endswith("_tokens"))


# What each lifecycle event requires: (field, rule, what the rule means). The table is the
# event contract's one statement of it: append, scan and the README use it.
_STR = (lambda v: isinstance(v, str), "a string")
_OPT_STR = (lambda v: v is None or isinstance(v, str), "a string or absent")
_USAGE = (
    valid_usage,
    "an object whose input_tokens, cached_input_tokens, cache_creation_tokens and "
    "output_tokens are non-negative integers or absent",
)
_OPT_USAGE = (lambda v: v is None or valid_usage(v), "absent or " + _USAGE[1])
_U64 = (_is_u64, "a non-negative integer")
LIFECYCLE_FIELDS: dict[str, tuple[tuple[str, tuple], ...]] = {
    THREAD_STARTED: (("thread_id", _STR),),
    THREAD_COMPLETED: (
        ("thread_id", _STR),
        ("session_id", _STR),
        ("subtype", _STR),
        ("outcome_code", _STR),
        ("usage", _USAGE),
        ("num_turns", _U64),
        ("result", _OPT_STR),
        ("stop_reason", _OPT_STR),
        ("completed_at", _OPT_STR),
        (
            "total_cost_usd",
            (lambda v: v is None or (type(v) in (int, float) and math.isfinite(v)), "a finite number or absent"),
        ),
    ),
    TURN_STARTED: (
        ("token_breakdown", (_valid_token_breakdown, "absent or an object of non-negative integer *_tokens")),
        ("context", (lambda v: v is None or isinstance(v, dict), "an object or absent")),
    ),
    TURN_COMPLETED: (
        ("usage", _USAGE),
        ("completed_at", _OPT_STR),
        (
            "in_progress_exec_sessions",
            (
                lambda v: v is None or (isinstance(v, list) and all(isinstance(s, str) for s in v)),
                "a list of strings or absent",
            ),
        ),
    ),
    TURN_FAILED: (("message", _STR), ("usage", _OPT_USAGE), ("completed_at", _OPT_STR)),
    TURN_ABORTED: (("reason", _OPT_STR), ("usage", _OPT_USAGE), ("completed_at", _OPT_STR)),
}


def lifecycle_problem(event: dict) -> Optional[str]:
    """What is wrong with a lifecycle event (``None`` if nothing, or if it is not one): the first
    field that does not match the event contract, and what it must be."""
    kind = event.get("type")
    rules = LIFECYCLE_FIELDS.get(kind) if type(kind) is str else None
    if rules is None:
        return None
    for name, (ok, meaning) in rules:
        value = event.get(name)
        if not ok(value):
            shown = "absent" if name not in event else repr(value)
            if len(shown) > 60:
                shown = shown[:57] + "..."
            return f"{event['type']}: {name} must be {meaning} (got {shown})"
    return None


def valid_lifecycle(event: dict) -> bool:
    """Full-shape validation of a lifecycle event, so a malformed one cannot open or close a turn.

    Non-lifecycle events are always valid here (they only need a string ``type``).
    """
    return lifecycle_problem(event) is None


def check_event(event: Any) -> str:
    """Validate an event given to ``append``; return its type or raise :class:`InvalidEvent`."""
    if not isinstance(event, dict):
        raise InvalidEvent(f"an event must be a JSON object (dict), not {type(event).__name__}")
    kind = event.get("type")
    if not isinstance(kind, str) or not kind:
        raise InvalidEvent("an event needs a non-empty string 'type'")
    if kind in LIFECYCLE_KINDS:
        problem = lifecycle_problem(event)
        if problem is not None:
            raise InvalidEvent(f"malformed event: {problem}")
    return kind if type(kind) is str else str.__str__(kind)  # a str enum indexes as its text


def non_finite_field(value: Any, path: str = "") -> Optional[str]:
    """The path of the first NaN or infinite float in ``value`` (``None`` if there is none).
    JSON has no such numbers: serialized, they would silently become ``null``."""
    if type(value) is float:
        return None if math.isfinite(value) else (path or "(the value)")
    if isinstance(value, dict):
        for key, item in value.items():
            found = non_finite_field(item, f"{path}.{key}" if path else str(key))
            if found is not None:
                return found
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            found = non_finite_field(item, f"{path}[{i}]")
            if found is not None:
                return found
    elif isinstance(value, float) and not math.isfinite(value):  # a float subclass
        return path or "(the value)"
    return None


# --------------------------------------------------------------------------------------------
# The envelope


_new_tuple = tuple.__new__


class Record(NamedTuple):
    """One decoded line: the envelope's ``seq`` and ``ts`` (``None`` in VT Code lines) and the
    inner event."""

    seq: Optional[int]
    ts: Optional[str]
    event: dict


def encode_record(seq: int, ts: str, event: dict, head: Optional[dict] = None) -> bytes:
    """Serialize one envelope line (with its trailing newline); :class:`InvalidEvent` if the event
    cannot be represented as JSON. ``head`` holds the log-head keys of a log's first line (see
    :func:`decode_log_head`), written before the envelope's own keys."""
    try:
        if head:
            line = orjson.dumps(
                {**head, "schema_version": SCHEMA_VERSION, "seq": seq, "ts": ts, "event": event},
                option=orjson.OPT_APPEND_NEWLINE,
            )
        else:
            line = orjson.dumps(
                {"schema_version": SCHEMA_VERSION, "seq": seq, "ts": ts, "event": event},
                option=orjson.OPT_APPEND_NEWLINE,
            )
    except (TypeError, orjson.JSONEncodeError) as exc:
        raise InvalidEvent(f"event cannot be serialized as JSON: {exc}") from None
    # orjson writes NaN and infinities as null: only a line with a null can hide one.
    if b"null" in line:
        field = non_finite_field(event)
        if field is not None:
            raise InvalidEvent(f"event field {field} is not a finite number (JSON has no NaN or infinity)")
    return line


# --------------------------------------------------------------------------------------------
# The log head: what the log itself says about the session and about what was evicted
#
# The log alone must be enough to rebuild every view. So its first line may carry extra
# envelope keys before the usual ones: ``"session_id"`` (the original id, when the directory
# name is a hash of it), ``"retained_turn_base"`` (the number of its first turn, once a cap
# rewrite evicted older ones) and ``"seq"`` (added to a retained line that had none, so its seq
# survives the loss of its predecessors). A log whose first retained line cannot be tagged, or
# that the cap emptied, starts with an anchor line without an event: {"schema_version",
# "retained_turn_base", "next_seq"}. Readers that do not know these keys ignore them (VT Code
# skips the anchor, as it skips any line without an event).

HEAD_KEYS = ("session_id", "retained_turn_base", "seq")


class LogHead(NamedTuple):
    retained_turn_base: Optional[int]
    next_seq: Optional[int]
    session_id: Optional[str] = None


def decode_log_head(line: bytes) -> LogHead:
    """What the first line of a log says about the session, evicted turns and sequence numbers."""
    try:
        data = orjson.loads(line)
    except orjson.JSONDecodeError:
        return LogHead(None, None)
    if type(data) is not dict:
        return LogHead(None, None)
    base, next_seq, session_id = data.get("retained_turn_base"), data.get("next_seq"), data.get("session_id")
    return LogHead(
        base if type(base) is int and 1 <= base <= MAX_SEQ else None,
        next_seq if "event" not in data and type(next_seq) is int and 1 <= next_seq <= MAX_SEQ else None,
        session_id if type(session_id) is str and session_id else None,
    )


def encode_anchor(retained_turn_base: int, next_seq: int, session_id: Optional[str] = None) -> bytes:
    """The line a cap rewrite leaves first when it evicted everything, or when the first
    retained line cannot be tagged."""
    head = {"session_id": session_id} if session_id else {}
    return orjson.dumps(
        {**head, "schema_version": SCHEMA_VERSION, "retained_turn_base": retained_turn_base, "next_seq": next_seq},
        option=orjson.OPT_APPEND_NEWLINE,
    )


def tag_head(line: bytes, head: dict) -> Optional[bytes]:
    """``line`` (one valid envelope, without its newline) with the ``head`` keys first; the
    event's bytes are not touched. A ``seq`` in ``head`` is only added to a line that has none.
    ``None`` unless the result decodes to the same record (with that seq) and head (the caller
    then writes an anchor line instead)."""
    if not line.startswith(b"{"):
        return None
    try:
        envelope = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None
    if type(envelope) is not dict:
        return None
    head = dict(head)
    seq = head.pop("seq", None)
    if seq is not None:
        if "seq" in envelope:
            if envelope["seq"] != seq:
                return None
        else:
            head["seq"] = seq
    if any(key in envelope for key in head):
        return None
    prefix = orjson.dumps(head)[:-1] if head else b"{"
    tagged = prefix + (b"," if head else b"") + line[1:]
    before, after = decode_line(line), decode_line(tagged)
    if before is None or after is None or after.event != before.event or after.ts != before.ts:
        return None
    if seq is not None and after.seq != seq:
        return None
    found = decode_log_head(tagged)
    if found.retained_turn_base != head.get("retained_turn_base") or found.session_id != head.get("session_id"):
        return None
    return tagged


def assign_seq(envelope_seq: Optional[int], next_seq: int) -> int:
    """The seq of a record: its envelope's when it is at least ``next_seq`` (one past the
    previous record's), else ``next_seq``. Lines VT Code wrote have none, and a log edited by
    hand may repeat or reorder them; assigned this way seqs are unique and increasing in log
    order, and a rescan of the same log gives the same ones."""
    return envelope_seq if envelope_seq is not None and envelope_seq >= next_seq else next_seq


def decode_line(line: bytes | str) -> Optional[Record]:
    """Decode one log line into a :class:`Record`, or ``None`` when it is not a valid envelope.

    Valid means: a JSON object with a string ``schema_version`` and an ``event`` object whose
    ``type`` is a string, and, for a lifecycle event, the full shape of that event: what VT Code
    accepts.
    """
    try:
        envelope = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None
    if type(envelope) is not dict or type(envelope.get("schema_version")) is not str:
        return None
    event = envelope.get("event")
    if type(event) is not dict:
        return None
    kind = event.get("type")
    if type(kind) is not str:
        return None
    if kind in LIFECYCLE_KINDS and not valid_lifecycle(event):
        return None
    seq = envelope.get("seq")
    ts = envelope.get("ts")
    seq = seq if type(seq) is int and 0 < seq <= MAX_SEQ else None
    # tuple.__new__ directly: Record(...) goes through the namedtuple's Python-level __new__,
    # a measurable share of a rescan's per-line cost.
    return _new_tuple(Record, (seq, ts if type(ts) is str else None, event))


# --------------------------------------------------------------------------------------------
# What an event says


def describe(event: dict) -> tuple:
    """The columns the index keeps for ``event``, as a plain tuple ``(type, item_type, item_id,
    name, status, exit_code)``: its type, its item's type and id, the tool or command it names,
    a status and an exit code.

    Values are the plain ``str``/``int`` the JSON decodes to, so an event described at append
    time (where the caller may pass dict subclasses or str enums) indexes exactly like the same
    event read back from the log. On the append path for every event, hence written for speed.
    """
    kind = str(event["type"])
    item = event.get("item")
    if isinstance(item, dict):
        get = item.get
        item_type = get("type")
        if item_type == "command_execution":
            name = get("command")
        elif item_type == "harness":
            name = get("event")
        else:
            name = get("tool_name")
        status = get("status")
        if not isinstance(status, str):
            status = get("outcome")
        item_id = get("id")
        code = get("exit_code")
        return (
            kind,
            _str_or_none(item_type),
            _str_or_none(item_id),
            _str_or_none(name),
            _str_or_none(status),
            int(code) if isinstance(code, int) and not isinstance(code, bool) and -(2**63) <= code < 2**63 else None,
        )
    if kind == THREAD_COMPLETED:
        return (kind, None, None, None, _str_or_none(event.get("subtype")), None)
    if kind.startswith("permission."):
        return (kind, None, None, _str_or_none(event.get("tool_name")), _str_or_none(event.get("decision")), None)
    return (kind, None, None, None, None, None)


def _str_or_none(value: Any) -> Optional[str]:
    if type(value) is str:
        return value
    return str.__str__(value) if isinstance(value, str) else None


def usage_of(event: dict) -> tuple[int, int, int, int]:
    """The four Usage counters of a turn or thread event (0 where missing or null), saturated at
    the largest SQLite integer."""
    usage = event.get("usage")
    if not isinstance(usage, dict):
        return (0, 0, 0, 0)
    counters = [_saturated(usage.get(f)) for f in USAGE_FIELDS]
    return counters[0], counters[1], counters[2], counters[3]


def _saturated(value: Any) -> int:
    """A u64 counter as a SQLite integer (saturated at its largest); 0 for anything else."""
    return min(value, _I64_MAX) if _is_u64(value) else 0


def agent_message_text(event: dict) -> Optional[str]:
    """The text of an ``item.completed`` agent message, else ``None``."""
    if event.get("type") != "item.completed":
        return None
    item = event.get("item")
    if isinstance(item, dict) and item.get("type") == "agent_message":
        return _str_or_none(item.get("text"))
    return None


def event_text(event: dict) -> Optional[tuple[str, str]]:
    """What a person would search an event for: ``(kind, text)``, or ``None`` for events that
    carry no text of their own (lifecycle markers, permission requests, usage).

    ``kind`` is the item type for ``item.completed`` events (``agent_message``, ``reasoning``,
    ``plan``, ``command_execution``, ``tool_invocation``, ``tool_output``, ``tool_call``,
    ``file_change``, ``mcp_tool_call``, ``web_search``, ``todo_list``, ``error``,
    ``user_message``, ...), else the event type (``turn.failed``, ``error``, ``interjected``).
    Only completed items count: ``item.started``/``item.updated`` describe the same item in
    progress.
    """
    kind = event.get("type")
    if kind == "item.completed":
        item = event.get("item")
        if not isinstance(item, dict):
            return None
        item_type = _str_or_none(item.get("type")) or "item"
        text = _item_text(item_type, item)
        return (item_type, text) if text else None
    if kind in (TURN_FAILED, "error"):
        text = value_text(event.get("message"))
    elif kind == TURN_ABORTED:
        text = value_text(event.get("reason"))
    elif kind == "interjected":
        text = value_text(event.get("text"))
    else:
        return None
    return (kind, text) if text else None


def changed_files(event: dict) -> list[tuple[str, str]]:
    """``(path, kind)`` of every file a completed ``file_change`` item changed (``kind``: add,
    delete, update, or whatever the event says)."""
    if event.get("type") != "item.completed":
        return []
    item = event.get("item")
    if not isinstance(item, dict) or item.get("type") != "file_change" or not isinstance(item.get("changes"), list):
        return []
    return [
        (change["path"], _str_or_none(change.get("kind")) or "update")
        for change in item["changes"]
        if isinstance(change, dict) and type(change.get("path")) is str
    ]


def value_text(value: Any, *, pretty: bool = False) -> str:
    """A value as text: strings as they are, anything else as JSON (compact, or indented with
    ``pretty``; '' for null)."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    option = orjson.OPT_NON_STR_KEYS | (orjson.OPT_INDENT_2 if pretty else 0)
    try:
        return orjson.dumps(value, option=option).decode()
    except (TypeError, orjson.JSONEncodeError):
        # Nested deeper than JSON output allows (a foreign log's line may nest a thousand
        # levels, which repr() cannot print either): its strings are its text.
        return "\n".join(_strings(value))


_PATH_KEYS = frozenset({"file_path", "notebook_path", "path"})


def _strings(value: Any) -> list[str]:
    """The strings inside a tool's arguments, in order, without the paths (said already).
    Iterative: a foreign log's line may nest a thousand levels deep."""
    found, stack = [], [value]
    while stack:
        value = stack.pop()
        if isinstance(value, str):
            found.append(value)
        elif isinstance(value, dict):
            stack.extend(reversed([v for k, v in value.items() if k not in _PATH_KEYS]))
        elif isinstance(value, list):
            stack.extend(reversed(value))
    return found


def _join(*parts: Any) -> str:
    return "\n".join(t for t in (value_text(p) for p in parts) if t)


def _item_text(item_type: str, item: dict) -> str:
    get = item.get
    if item_type in ("agent_message", "reasoning", "plan", "user_message"):
        return value_text(get("text"))
    if item_type == "command_execution":
        command = value_text(get("command"))
        return _join(f"$ {command}" if command else "", get("aggregated_output"))
    if item_type == "tool_invocation":
        return _join(get("tool_name"), get("arguments"))
    if item_type == "tool_output":
        return value_text(get("output"))
    if item_type == "tool_call":
        return _join(get("tool_name"), get("arguments"), get("output"))
    if item_type == "mcp_tool_call":
        return _join(
            get("tool_name") or ".".join(value_text(get(k)) for k in ("server", "tool") if get(k)),
            get("arguments"),
            get("result"),
            get("error"),
        )
    if item_type == "file_change":
        changes = get("changes")
        paths = (
            [f"{c.get('kind', '')} {c.get('path', '')}".strip() for c in changes if isinstance(c, dict)]
            if isinstance(changes, list)
            else []
        )
        # The change itself, as each agent records it: VT Code's unified diff, a Codex patch,
        # a Claude Code edit's old and new text (what someone searching for the code types).
        return _join("\n".join(paths), get("unified_diff"), get("patch"), *_strings(get("arguments")), get("output"))
    if item_type == "web_search":
        return _join(get("query"), get("results"))
    if item_type == "todo_list":
        items = get("items")
        if isinstance(items, list):
            return "\n".join(
                f"[{'x' if isinstance(i, dict) and i.get('completed') else ' '}] {value_text(i.get('text') if isinstance(i, dict) else i)}"
                for i in items
            )
        return ""
    if item_type == "decision":
        return _join(get("summary"), get("rationale"), get("alternatives"))
    if item_type == "harness":
        return _join(get("event"), get("message"), get("command"), get("path"))
    if item_type == "error":
        return value_text(get("message"))
    # An item type memstore does not know: its text fields, if it has any.
    return _join(*(get(k) for k in ("text", "message", "output", "command", "query")))


def normalize_whitespace(text: str) -> str:
    """Collapse every run of whitespace to one space and trim the ends."""
    return " ".join(text.split())


def truncate_for_fact(text: str, limit: int = 180) -> str:
    """Trim ``text``; if longer than ``limit`` characters keep ``limit - 3`` and append ``...``."""
    text = text.strip()
    if len(text) <= limit:
        return text
    return text[: max(limit - 3, 0)] + "..."
