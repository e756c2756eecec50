"""``derived/memory.json``: the session's memory, in the shape of VT Code's
``SessionMemoryEnvelope`` (schema_version 3), regenerated from the log; and its readers.

The log is the only source. An envelope an agent supplies (at compaction, say) is first appended
to the session's log as an event, then the view is regenerated from the log::

    {"type": "memory.envelope", "envelope": {...the envelope...}, "source": {...optional...}}

The envelope time of that record is when the envelope was produced (its ``generated_at`` if it
has one, else the time of the call; never earlier than the log's last event). ``source`` says
where an envelope that the agent did not write came from (``memstore migrate`` imports legacy
envelopes with ``{"importer", "file", "sha256", "mtime"}``; a ``derived/memory.json`` found without
memstore's marker, which VT Code's own migration writes, is adopted into the log the same way
before it is regenerated, so nothing it held is lost).

**How the view is derived** (:func:`build_memory_view`, a pure function of the records). The
latest ``memory.envelope`` record is the *prior*; the records after it are the *history* (the
envelope already stands for what came before it):

- ``grounded_facts``: the prior's facts, then the history's facts by VT Code's rules
  (:func:`dedup_latest_facts`): tool facts from successful tool outputs (``tool_output``,
  ``tool_call``, ``command_execution``, ``mcp_tool_call`` items), user facts from prompts
  (``user_message`` items, ``interjected`` text). Deduplicated by lower-cased, whitespace-normalized
  text (a re-seen fact moves to the end); the last 5, each at most 180 characters.
- ``touched_files``: the prior's, then every path of a ``file_change`` that did not fail;
  deduplicated, newest last.
- ``summary``: the prior's; else ``Compacted earlier conversation state. Recent preserved
  context: role: text | ...`` from the last 4 messages (user prompts, agent messages, tool
  outputs; 160 characters each); else a fixed sentence.
- ``objective``: the prior's; else the latest ``turn.started`` ``context.goal``; else the first
  user prompt (180 characters).
- ``constraints``, ``open_questions``, ``verification_todo``, ``delegation_notes`` (5 each),
  ``pending_intents`` (16), ``applied_intent_ids`` (64), ``task_summary``, ``spec_summary``,
  ``evaluation_summary``, ``verification_summary``, ``history_artifact_path``: the prior's,
  bounded as VT Code bounds them.
- ``generated_at``: the time of the latest record in the log (not the clock), so regenerating
  gives the same bytes.
- ``derived_from``: ``{"events_through_seq": N, "envelope_seq": M}``, memstore's marker: the
  last record and the prior envelope the view reflects. A ``memory.json`` without it was not
  produced from the log.

The file is pretty JSON (2-space indent), written atomically with mode 0600.

**Readers.** :func:`session_memory_facts`, :func:`query_facts` and :func:`memory_facts_of` accept
any JSON with ``grounded_facts[].fact`` (string facts; other items are skipped) and return ``[]``
for a missing or malformed file. Parsed files are cached, and every lookup checks the cache
against the file (inode, size, mtime), so an answer is never stale.
"""

from __future__ import annotations

import hashlib
import logging
import os
import stat
import threading
from collections import OrderedDict, deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NamedTuple, Optional

import orjson

from .. import events as ev
from ..errors import (
    InvalidEvent,
    InvalidSessionId,
    SessionNotFound,
    StoreIOError,
    UnsafePathError,
)
from ..events import Record
from ..fsio import atomic_write, read_no_follow
from ..layout import (
    DERIVED_DIR,
    MANIFEST_FILE,
    MEMORY_FILE,
    session_dir_name,
    session_directory,
    sessions_root,
)
from ..session.log import SessionLog, open_session
from ..session.manifest import SessionSummary, summary_cache
from ..store_redaction import store_redaction
from .registry import FileView, register_file_view

logger = logging.getLogger("memstore")

ENVELOPE_EVENT = "memory.envelope"
ENVELOPE_SCHEMA_VERSION = 3
VIEW_MARKER = "derived_from"

MAX_FACTS = 5
FACT_CHARS = 180
CONTEXT_MESSAGES = 4
CONTEXT_CHARS = 160
MAX_NOTES = 5
MAX_PENDING_INTENTS = 16
MAX_APPLIED_INTENT_IDS = 64
SUMMARY_PREFIX = "Compacted earlier conversation state. Recent preserved context: "
FALLBACK_SUMMARY = "No conversation summary is available for this session yet."
# generated_at of a log without a single timed record (VT Code writes no times): fixed, so the
# view stays a function of the log.
EPOCH = "1970-01-01T00:00:00.000Z"

_POLITE_PREFIXES = ("please, ", "please ", "can you ", "could you ", "would you ", "vt code, ", "vt code ")
_NOTE_MARKERS = ("note that ", "important:")
_ASSERTIONS = ("my name is ", "i prefer ", "my preferred ", "my pronouns are ", "my timezone is ")
_ERROR_WORDS = ("error", "failed", "denied", "timeout")
_TOOL_RESULT_KEYS = ("summary", "message", "result", "output", "stdout")
_NOTE_LISTS = ("constraints", "open_questions", "verification_todo", "delegation_notes")
_PRIOR_STRINGS = ("task_summary", "spec_summary", "evaluation_summary", "verification_summary")
_FAILED = frozenset({"failed", "declined", "in_progress", "cancelled"})


@dataclass(frozen=True)
class FactRecord:
    """One grounded fact of a session's memory view."""

    fact: str
    session_id: str
    source: Optional[str] = None


class Message(NamedTuple):
    """A message of the conversation as fact extraction sees it."""

    role: str  # "user", "assistant" or "tool"
    text: str
    tool: Optional[str] = None


# --------------------------------------------------------------------------------------------
# Fact extraction (VT Code's persistent_memory/fact_extraction.rs)


def tool_fact(content: str, tool_name: Optional[str] = None) -> Optional[dict]:
    """The fact a tool output states, or ``None``.

    JSON output: rejected when it has an ``error`` key or ``"success": false``; else the first
    non-null of ``summary``, ``message``, ``result``, ``output``, ``stdout`` (a string
    whitespace-normalized, anything else as compact JSON), else the whole compact JSON. Other
    text: rejected when it mentions error, failed, denied or timeout (any case); else the
    normalized text. Returns ``{"fact": <at most 180 characters>, "source": "tool:<name>"}``.
    """
    try:
        data = orjson.loads(content)
    except orjson.JSONDecodeError:
        data = _NOT_JSON
    if data is not _NOT_JSON:
        if isinstance(data, dict):
            if "error" in data or data.get("success") is False:
                return None
            for key in _TOOL_RESULT_KEYS:
                value = data.get(key)
                if value is not None:
                    text = ev.normalize_whitespace(value) if isinstance(value, str) else orjson.dumps(value).decode()
                    break
            else:
                text = orjson.dumps(data).decode()
        else:
            text = orjson.dumps(data).decode()
    else:
        lowered = content.lower()
        if any(word in lowered for word in _ERROR_WORDS):
            return None
        text = ev.normalize_whitespace(content)
    fact = ev.truncate_for_fact(text, FACT_CHARS)
    if not fact:
        return None
    return {"fact": fact, "source": f"tool:{tool_name or 'tool'}"}


_NOT_JSON = object()


def user_fact(content: str) -> Optional[dict]:
    """The fact a user prompt asserts, or ``None``.

    Polite openings (``please``, ``can you``, ``could you``, ``would you``, ``vt code``) are
    stripped, repeatedly, with any ``,:-`` and spaces after them. A text then starting with
    ``note that `` or ``important:`` is an authored note (the marker is dropped); otherwise only
    ``my name is``, ``i prefer``, ``my preferred``, ``my pronouns are`` and ``my timezone is``
    statements are facts. Returns ``{"fact": ..., "source": "user_assertion"}``.
    """
    text = ev.normalize_whitespace(content)
    stripped = True
    while stripped:
        stripped = False
        lowered = text.lower()
        for prefix in _POLITE_PREFIXES:
            if lowered.startswith(prefix):
                text = text[len(prefix) :].lstrip(",:- ")
                stripped = True
                break
    lowered = text.lower()
    for marker in _NOTE_MARKERS:
        if lowered.startswith(marker):
            text = text[len(marker) :]
            break
    else:
        if not lowered.startswith(_ASSERTIONS):
            return None
    fact = ev.truncate_for_fact(text, FACT_CHARS)
    if not fact:
        return None
    return {"fact": fact, "source": "user_assertion"}


def _fact_key(fact: str) -> str:
    return ev.normalize_whitespace(fact).lower()


class _LatestFacts:
    """Facts deduplicated by normalized lower-cased text, a re-seen fact moving to the end,
    keeping the last ``limit`` (trimming as it goes gives the same result: a trimmed fact seen
    again goes to the end, where it would have moved anyway)."""

    def __init__(self, limit: int):
        self.limit = limit
        self.facts: OrderedDict[str, dict] = OrderedDict()

    def add(self, fact: Optional[dict]) -> None:
        if fact is None:
            return
        key = _fact_key(fact["fact"])
        self.facts.pop(key, None)
        self.facts[key] = fact
        while len(self.facts) > self.limit:
            self.facts.popitem(last=False)

    def values(self) -> list[dict]:
        return list(self.facts.values())


def message_fact(message: Message) -> Optional[dict]:
    """A tool fact for a tool message, a user fact for a user message, else ``None``."""
    if message.role == "tool":
        return tool_fact(message.text, message.tool)
    if message.role == "user":
        return user_fact(message.text)
    return None


def dedup_latest_facts(messages: Iterable[Message], limit: int = MAX_FACTS) -> list[dict]:
    """The facts of ``messages`` in order, deduplicated (a re-seen fact moves to the end), the
    last ``limit``."""
    latest = _LatestFacts(limit)
    for message in messages:
        latest.add(message_fact(message))
    return latest.values()


# --------------------------------------------------------------------------------------------
# Building the view from the log


def _str(value: Any) -> Optional[str]:
    return value if isinstance(value, str) else None


def _item_failed(item: dict) -> bool:
    status = item.get("status")
    if isinstance(status, str) and status in _FAILED:
        return True
    code = item.get("exit_code")
    if type(code) is int and code != 0:
        return True
    return item.get("is_error") is True or item.get("error") not in (None, "", False)


class _ViewBuilder:
    """Folds records, in log order, into what the view needs; one pass, bounded memory."""

    def __init__(self) -> None:
        self.prior: Optional[dict] = None
        self.prior_seq: Optional[int] = None
        self.prior_ts: Optional[str] = None
        self.history_facts = _LatestFacts(MAX_FACTS)
        self.history_files: OrderedDict[str, None] = OrderedDict()
        self.recent: deque = deque(maxlen=CONTEXT_MESSAGES)
        self.tool_names: dict[str, str] = {}
        self.goal: Optional[str] = None
        self.first_prompt: Optional[str] = None
        self.last_seq = 0
        self.latest_ts: Optional[str] = None
        self._latest_dt: Optional[datetime] = None
        self.envelope_shas: set[str] = set()

    def add(self, record: Record) -> None:
        if record.seq is not None:
            self.last_seq = max(self.last_seq, record.seq)
        if record.ts is not None:
            parsed = ev.parse_ts(record.ts)
            if parsed is not None and (self._latest_dt is None or parsed > self._latest_dt):
                self._latest_dt, self.latest_ts = parsed, record.ts
        event = record.event
        kind = event.get("type")
        if kind == ENVELOPE_EVENT:
            envelope = event.get("envelope")
            source = event.get("source")
            if isinstance(source, dict) and isinstance(source.get("sha256"), str):
                self.envelope_shas.add(source["sha256"])
            if isinstance(envelope, dict):
                # The newest envelope stands for everything before it.
                self.prior, self.prior_seq, self.prior_ts = envelope, record.seq, record.ts
                self.history_facts = _LatestFacts(MAX_FACTS)
                self.history_files = OrderedDict()
            return
        if kind == ev.TURN_STARTED:
            context = event.get("context")
            if isinstance(context, dict) and isinstance(context.get("goal"), str) and context["goal"].strip():
                self.goal = context["goal"]
            return
        if kind == "interjected":
            text = _str(event.get("text"))
            if text:
                self._message(Message("user", text))
            return
        if kind != "item.completed":
            return
        item = event.get("item")
        if not isinstance(item, dict):
            return
        item_type = item.get("type")
        if item_type == "tool_invocation":
            if isinstance(item.get("id"), str) and isinstance(item.get("tool_name"), str):
                self.tool_names[item["id"]] = item["tool_name"]
        elif item_type == "user_message":
            text = _str(item.get("text"))
            if text:
                self._message(Message("user", text))
        elif item_type == "agent_message":
            text = _str(item.get("text"))
            if text:
                self.recent.append(Message("assistant", text))
        elif item_type == "tool_output":
            text = _str(item.get("output"))
            call = item.get("call_id")
            name = self.tool_names.get(call) if isinstance(call, str) else None
            self._tool(item, text, name)
        elif item_type == "tool_call":
            self._tool(item, _str(item.get("output")), _str(item.get("tool_name")))
        elif item_type == "command_execution":
            self._tool(item, _str(item.get("aggregated_output")), _str(item.get("tool_name")) or "command")
        elif item_type == "mcp_tool_call":
            self._tool(item, _str(item.get("result")), _str(item.get("tool_name")))
        elif item_type == "file_change":
            if item.get("status") == "failed":
                return
            changes = item.get("changes")
            for change in changes if isinstance(changes, list) else ():
                path = change.get("path") if isinstance(change, dict) else None
                if isinstance(path, str) and path:
                    self.history_files.pop(path, None)
                    self.history_files[path] = None

    def _message(self, message: Message) -> None:
        if message.role == "user" and self.first_prompt is None and message.text.strip():
            self.first_prompt = message.text
        if message.text.strip():
            self.recent.append(message)
        self.history_facts.add(message_fact(message))

    def _tool(self, item: dict, text: Optional[str], name: Optional[str]) -> None:
        if not text or _item_failed(item):
            return
        self._message(Message("tool", text, name))

    def view(self, session_id: str) -> dict:
        prior = self.prior or {}
        facts = _LatestFacts(MAX_FACTS)
        for fact in _prior_facts(prior.get("grounded_facts")):
            facts.add(fact)
        for fact in self.history_facts.values():
            facts.add(fact)
        touched: OrderedDict[str, None] = OrderedDict()
        for path in [p for p in _list(prior.get("touched_files")) if isinstance(p, str)] + list(self.history_files):
            touched.pop(path, None)
            touched[path] = None
        summary = _str(prior.get("summary"))
        if not summary or not summary.strip():
            context = [
                f"{m.role}: {ev.truncate_for_fact(ev.normalize_whitespace(m.text), CONTEXT_CHARS)}" for m in self.recent
            ]
            summary = SUMMARY_PREFIX + " | ".join(context) if context else FALLBACK_SUMMARY
        objective = _str(prior.get("objective")) or self.goal
        if not objective and self.first_prompt:
            objective = ev.truncate_for_fact(ev.normalize_whitespace(self.first_prompt), FACT_CHARS)
        view: dict = {
            "session_id": session_id,
            "schema_version": ENVELOPE_SCHEMA_VERSION,
            "summary": summary,
            "objective": objective or None,
        }
        for key in _PRIOR_STRINGS:
            view[key] = _str(prior.get(key))
        view["constraints"] = _notes(prior.get("constraints"))
        view["grounded_facts"] = facts.values()
        view["touched_files"] = list(touched)
        for key in _NOTE_LISTS[1:]:
            view[key] = _notes(prior.get(key))
        view["pending_intents"] = [
            {"id": i["id"], "text": i["text"]}
            for i in _list(prior.get("pending_intents"))
            if isinstance(i, dict) and isinstance(i.get("id"), str) and isinstance(i.get("text"), str)
        ][-MAX_PENDING_INTENTS:]
        applied: OrderedDict[str, None] = OrderedDict()
        for value in _list(prior.get("applied_intent_ids")):
            if isinstance(value, str):
                applied.pop(value, None)
                applied[value] = None
        view["applied_intent_ids"] = list(applied)[-MAX_APPLIED_INTENT_IDS:]
        view["history_artifact_path"] = _str(prior.get("history_artifact_path"))
        view["generated_at"] = self.latest_ts or _str(prior.get("generated_at")) or EPOCH
        view[VIEW_MARKER] = {"events_through_seq": self.last_seq, "envelope_seq": self.prior_seq}
        return view


def _list(value: Any) -> list:
    return value if isinstance(value, list) else []


def _prior_facts(value: Any) -> list[dict]:
    facts = []
    for item in _list(value):
        if isinstance(item, dict) and isinstance(item.get("fact"), str):
            fact = ev.truncate_for_fact(item["fact"], FACT_CHARS)
            if fact:
                source = item.get("source")
                facts.append({"fact": fact, "source": source if isinstance(source, str) else "memory"})
    return facts


def _notes(value: Any) -> list[str]:
    """Whitespace-normalized strings, deduplicated without regard to case (the newest kept),
    the last 5."""
    notes: OrderedDict[str, str] = OrderedDict()
    for item in _list(value):
        if isinstance(item, str):
            text = ev.normalize_whitespace(item)
            if text:
                notes.pop(text.lower(), None)
                notes[text.lower()] = text
    return list(notes.values())[-MAX_NOTES:]


def build_memory_view(session_id: str, records: Iterable[Record]) -> dict:
    """The memory view of a session whose log holds ``records`` (in log order); see the module
    docstring for the rules. A pure function: the same records give the same view."""
    builder = _ViewBuilder()
    for record in records:
        builder.add(record)
    return builder.view(session_id)


def render_memory_view(view: dict) -> bytes:
    """The bytes of ``derived/memory.json`` for ``view`` (pretty JSON, trailing newline)."""
    return orjson.dumps(view, option=orjson.OPT_INDENT_2 | orjson.OPT_APPEND_NEWLINE)


# --------------------------------------------------------------------------------------------
# Writing


def write_session_memory_view(root: os.PathLike | str, session_id: str, envelope: Optional[dict] = None) -> Path:
    """Regenerate the session's ``derived/memory.json`` from its log; with ``envelope``, first
    append it to the log as a ``memory.envelope`` event. Returns the file's path.

    A writer: it opens the session with :func:`open_session` (in the process that already has it
    open, it shares that handle; another process holding it raises :class:`SessionBusyError`).
    Raises :class:`SessionNotFound` when the session does not exist (nothing is created),
    :class:`InvalidEvent` when ``envelope`` is not a JSON object, and :class:`StoreIOError`
    (naming the path) when the log or the view cannot be written.
    """
    if envelope is not None and not isinstance(envelope, dict):
        raise InvalidEvent(f"a memory envelope must be a JSON object (dict), not {type(envelope).__name__}")
    directory = session_directory(root, session_id)
    try:
        st = os.lstat(directory)
    except FileNotFoundError:
        raise SessionNotFound(session_id, directory) from None
    except OSError as exc:
        raise StoreIOError.from_os_error("stat", directory, exc) from exc
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafePathError("write memory view", directory, "is a symlink or not a directory")
    with open_session(root, session_id, max_events=0) as log:
        path = refresh_memory_view(log, envelope=envelope)
    assert path is not None  # (None only with only_if_any)
    return path


def refresh_memory_view(
    log: SessionLog, *, envelope: Optional[dict] = None, only_if_any: bool = False
) -> Optional[Path]:
    """Regenerate ``derived/memory.json`` of the open session ``log``; with ``envelope``, append
    it as a ``memory.envelope`` event first. A ``memory.json`` that memstore did not produce is
    adopted into the log before it is replaced. Returns the path. With ``only_if_any``
    (``rebuild``), a session that never had a memory view (no file, no envelope in its log)
    gets none: a rebuild brings views back, it does not invent them."""
    path = log.directory / DERIVED_DIR / MEMORY_FILE
    if only_if_any and envelope is None and not path.exists() and not _has_envelope(log):
        return None
    if envelope is not None:  # refused (InvalidEvent) before anything is appended
        ev.encode_record(1, ev.utc_now(), {"type": ENVELOPE_EVENT, "envelope": envelope})
    builder = _ViewBuilder()
    for record in _redacted_records(log):
        builder.add(record)
    floor = builder.latest_ts
    appended = False
    foreign = _foreign_view(path, builder.envelope_shas)
    if foreign is not None:
        data, sha, mtime = foreign
        source = {
            "importer": "memstore.views.memory_view",
            "file": f"{DERIVED_DIR}/{MEMORY_FILE}",
            "sha256": sha,
            "mtime": mtime,
        }
        floor = _append_envelope(log, data, not_before(not_after_now(mtime), floor), source)
        appended = True
    if envelope is not None:
        produced = envelope.get("generated_at")
        produced = ev.normalize_ts(produced) if ev.parse_ts(produced) is not None else None
        _append_envelope(log, envelope, not_before(not_after_now(produced), floor), None)
        appended = True
    if appended:
        log.flush()
        builder = _ViewBuilder()
        for record in _redacted_records(log):
            builder.add(record)
    atomic_write(path, render_memory_view(builder.view(log.session_id)))
    _facts_cache.invalidate(path)
    return path


def _redacted_records(log: SessionLog) -> Iterator[Record]:
    """``log``'s records with each event redacted by the store's redactor: the view (facts,
    summary, objective, touched files) never holds a secret, whatever the log holds."""
    redaction = log.redaction if log.redaction is not None else store_redaction(log.directory.parent.parent)
    redact = redaction.redact_event
    for record in log.iter_records():
        event = redact(record.event)
        yield record if event is record.event else record._replace(event=event)


def _has_envelope(log: SessionLog) -> bool:
    marker = f'"type":"{ENVELOPE_EVENT}"'.encode()
    try:
        with open(log.events_path, "rb") as fh:
            return any(marker in line for line in fh)
    except OSError as exc:
        raise StoreIOError.from_os_error("read", log.events_path, exc) from exc


def not_after_now(ts: Optional[str]) -> str:
    """``ts``, or now when it is missing or in the future: a wrong clock or a hostile time
    must not date a log past the present (every later record would follow it, and retention
    would never age the session out)."""
    now = ev.utc_now()
    if ts is None:
        return now
    parsed, present = ev.parse_ts(ts), ev.parse_ts(now)
    return ts if parsed is not None and present is not None and parsed <= present else now


def not_before(ts: str, floor: Optional[str]) -> str:
    """``ts``, or ``floor`` when that is later: a record appended to a log is never dated
    before the log's last record (log order stays time order)."""
    if floor is None:
        return ts
    mine, theirs = ev.parse_ts(ts), ev.parse_ts(floor)
    if mine is None or (theirs is not None and theirs > mine):
        return floor
    return ts


def _append_envelope(log: SessionLog, envelope: dict, ts: str, source: Optional[dict]) -> str:
    event: dict = {"type": ENVELOPE_EVENT, "envelope": envelope}
    if source is not None:
        event["source"] = source
    log.append(event, ts=ts)
    return ev.normalize_ts(ts)


def _foreign_view(path: Path, adopted: set[str]) -> Optional[tuple[dict, str, str]]:
    """A ``memory.json`` memstore did not produce and the log does not hold yet:
    ``(envelope, sha256, mtime)``; else ``None``."""
    try:
        raw = read_no_follow(path)
    except StoreIOError as exc:
        raise StoreIOError("read memory view", path, f"cannot be read before it is regenerated: {exc.detail}") from exc
    if raw is None:
        return None
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        logger.warning("replacing %s: it is not JSON (nothing in it could be kept)", path)
        return None
    if not isinstance(data, dict) or VIEW_MARKER in data:
        return None
    sha = hashlib.sha256(raw).hexdigest()
    if sha in adopted:
        return None
    mtime = ev.format_ts(_mtime(path))
    return data, sha, mtime


def _mtime(path: Path) -> datetime:
    return datetime.fromtimestamp(os.lstat(path).st_mtime, UTC)


# --------------------------------------------------------------------------------------------
# Reading


class _FactsCache:
    """Parsed ``memory.json`` files keyed by path, checked against the file's ``(inode, size,
    mtime_ns)`` on every lookup (memstore replaces the file atomically: a new inode)."""

    def __init__(self, capacity: int = 512):
        self.capacity = capacity
        self._entries: OrderedDict[str, tuple[tuple, tuple[Optional[str], list[dict]]]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, path: Path) -> tuple[Optional[str], list[dict]]:
        key = os.fspath(path)
        try:
            st = os.lstat(key)
        except FileNotFoundError:
            self.invalidate(key)
            return None, []
        except OSError as exc:
            logger.info("cannot examine %s: %s", key, exc)
            return None, []
        if not stat.S_ISREG(st.st_mode):
            return None, []
        stamp = (st.st_ino, st.st_size, st.st_mtime_ns)
        with self._lock:
            hit = self._entries.get(key)
            if hit is not None and hit[0] == stamp:
                self._entries.move_to_end(key)
                return hit[1]
        value = _parse_facts(path)
        with self._lock:
            self._entries[key] = (stamp, value)
            self._entries.move_to_end(key)
            while len(self._entries) > self.capacity:
                self._entries.popitem(last=False)
        return value

    def invalidate(self, path: os.PathLike | str) -> None:
        with self._lock:
            self._entries.pop(os.fspath(path), None)


_facts_cache = _FactsCache()


def _parse_facts(path: Path) -> tuple[Optional[str], list[dict]]:
    """``(session_id in the file, [{fact, source, index}])``; nothing for a missing, unreadable
    or malformed file."""
    try:
        raw = read_no_follow(path)
        data = orjson.loads(raw) if raw is not None else None
    except (StoreIOError, orjson.JSONDecodeError) as exc:
        logger.info("no facts from %s: %s", path, exc)
        return None, []
    if not isinstance(data, dict):
        return None, []
    facts = []
    for index, item in enumerate(_list(data.get("grounded_facts"))):
        if isinstance(item, dict) and isinstance(item.get("fact"), str):
            source = item.get("source")
            facts.append({"fact": item["fact"], "source": source if isinstance(source, str) else None, "index": index})
    return _str(data.get("session_id")), facts


def memory_facts_of(session_dir: os.PathLike | str) -> list[dict]:
    """The grounded facts in ``<session_dir>/derived/memory.json``: ``[{"fact", "source",
    "index"}]`` in file order, ``index`` being the fact's position in the file's
    ``grounded_facts`` array (search chunk ids are ``<session directory>:<index>``). ``[]`` when the file
    is missing or malformed, or the session directory is a symlink."""
    directory = Path(session_dir)
    if directory.is_symlink() or (directory / DERIVED_DIR).is_symlink():
        return []
    return [dict(f) for f in _facts_cache.get(directory / DERIVED_DIR / MEMORY_FILE)[1]]


def memory_view_time(session_dir: os.PathLike | str) -> Optional[str]:
    """When ``<session_dir>/derived/memory.json`` says it was made, in memstore's format: its
    numeric ``created_at`` (Unix seconds), else its numeric ``updated_at``, else ``None`` (the
    reference's search dates a view's facts so; memstore's own views carry neither, only
    ``generated_at``). ``None`` too for a missing, malformed or symlinked file."""
    directory = Path(session_dir)
    path = directory / DERIVED_DIR / MEMORY_FILE
    if directory.is_symlink() or (directory / DERIVED_DIR).is_symlink():
        return None
    try:
        raw = read_no_follow(path)
        data = orjson.loads(raw) if raw is not None else None
    except (StoreIOError, orjson.JSONDecodeError):
        return None
    if not isinstance(data, dict):
        return None
    for key in ("created_at", "updated_at"):
        value = data.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            try:
                return ev.format_ts(datetime.fromtimestamp(value, UTC))
            except (OverflowError, OSError, ValueError):
                return None  # no time a datetime can hold: as good as none
    return None


def session_memory_facts(root: os.PathLike | str, session_id: str) -> list[dict]:
    """The grounded facts of one session's memory view, ``[{"fact", "source"}]`` in file order;
    ``[]`` when it has none, or no readable view. Each fact is redacted (a view an older
    memstore wrote, or VT Code did, may quote a secret). Raises :class:`InvalidSessionId` for an
    id memstore refuses."""
    redact = store_redaction(root).redactor().redact_text
    return [
        {"fact": redact(f["fact"]), "source": f["source"]} for f in memory_facts_of(session_directory(root, session_id))
    ]


def _session_dirs(root: os.PathLike | str) -> list[os.DirEntry]:
    base = sessions_root(root)
    try:
        if not stat.S_ISDIR(os.lstat(base).st_mode):
            return []  # a symlinked sessions directory is not followed
        entries = list(os.scandir(base))
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise StoreIOError.from_os_error("list", base, exc) from exc
    return [e for e in entries if e.is_dir(follow_symlinks=False) and not e.name.startswith(".")]


def _summary(entry: os.DirEntry) -> Optional[SessionSummary]:
    try:
        return summary_cache.get(os.path.join(entry.path, MANIFEST_FILE))
    except StoreIOError as exc:  # a symlinked or unreadable manifest: not listed
        logger.info("skipping %s: %s", entry.path, exc)
        return None


def _newest_first(pairs: list[tuple[os.DirEntry, Optional[SessionSummary]]]) -> list:
    """Sessions by last event time, newest first (parsed, not compared as strings); those whose
    time does not parse (or that have no manifest) after them; ties by directory name."""

    def key(pair):
        entry, summary = pair
        parsed = ev.parse_ts(summary.updated_at) if summary is not None else None
        if parsed is None:
            return (1, 0.0, entry.name)
        try:
            return (0, -parsed.timestamp(), entry.name)
        except (OverflowError, ValueError, OSError):
            return (1, 0.0, entry.name)

    return sorted(pairs, key=key)


def recent_sessions(root: os.PathLike | str, n: int) -> list[SessionSummary]:
    """The ``n`` most recently updated sessions, newest first (by parsed ``updated_at``; ties by
    directory name). Sessions without a valid manifest are left out; the status is not
    filtered. Manifests are read through the validated cache, so a rewritten manifest is never
    served stale."""
    if type(n) is not int or n < 0:
        raise ValueError(f"n must be a non-negative int, not {n!r}")
    if n == 0:
        return []
    pairs = [(entry, _summary(entry)) for entry in _session_dirs(root)]
    return [summary for _entry, summary in _newest_first([p for p in pairs if p[1] is not None])][:n]


def query_facts(root: os.PathLike | str, limit: Optional[int] = 100) -> list[FactRecord]:
    """Grounded facts across the store's memory views, at most ``limit`` (``None``: all).

    Order (deterministic): sessions newest first by their manifest's ``updated_at`` (sessions
    without a usable manifest last), ties by directory name; within a session, the facts in the
    file's order (oldest first, as the envelope keeps them). ``session_id`` is the id the
    view or manifest names when it maps to the directory, else the directory name. Each fact
    is redacted, as :func:`session_memory_facts` says.
    """
    if limit is not None and (type(limit) is not int or limit < 0):
        raise ValueError(f"limit must be a non-negative int or None, not {limit!r}")
    records: list[FactRecord] = []
    if limit == 0:
        return records
    redact = store_redaction(root).redactor().redact_text
    pairs = [(entry, _summary(entry)) for entry in _session_dirs(root)]
    for entry, summary in _newest_first(pairs):
        derived = os.path.join(entry.path, DERIVED_DIR)
        if os.path.islink(derived):
            continue  # as memory_facts_of: a symlinked derived/ points out of the session
        file_id, facts = _facts_cache.get(Path(derived) / MEMORY_FILE)
        if not facts:
            continue
        session_id = _id_for(entry.name, file_id, summary.session_id if summary else None)
        for fact in facts:
            records.append(FactRecord(redact(fact["fact"]), session_id, fact["source"]))
            if limit is not None and len(records) >= limit:
                return records
    return records


def _id_for(name: str, *claims: Optional[str]) -> str:
    for claim in claims:
        if isinstance(claim, str):
            try:
                if session_dir_name(claim) == name:
                    return claim
            except InvalidSessionId:
                continue
    return name


__all__ = [
    "FactRecord",
    "Message",
    "build_memory_view",
    "render_memory_view",
    "write_session_memory_view",
    "refresh_memory_view",
    "session_memory_facts",
    "memory_facts_of",
    "query_facts",
    "recent_sessions",
    "tool_fact",
    "user_fact",
    "dedup_latest_facts",
    "ENVELOPE_EVENT",
    "VIEW_MARKER",
]


register_file_view(FileView("memory", MEMORY_FILE, (ENVELOPE_EVENT,), refresh_memory_view))
