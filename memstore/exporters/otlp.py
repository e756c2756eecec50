"""``memstore export otlp DEST``: every session as an OpenTelemetry trace, in OTLP/JSON.

The output is JSON Lines: each line is one ``ExportTraceServiceRequest`` (what the collector's
``otlpjsonfile`` receiver and its ``file`` exporter read and write), holding spans of one
session. A session is one trace, following the GenAI semantic conventions:

- a root span ``session {agent}`` for the session;
- per turn, an ``invoke_agent {agent}`` span (``gen_ai.operation.name = invoke_agent``);
- under it, a ``chat {model}`` span (``chat``, kind CLIENT) carrying the turn's token usage
  (``gen_ai.usage.*``) and model. The logs record usage per turn, not per model request, so
  a turn has one such span with its summed usage: summing ``gen_ai.usage.*`` over the
  ``chat`` spans gives the catalog's totals;
- under it too, an ``execute_tool {tool}`` span per tool execution (tool calls, commands,
  file changes, web searches) with the tool's name, its arguments, its status and its
  duration.

Times are the source's. A tool span starts at the item's ``item.started`` event when the log
has one, at its call (``tool_invocation``, ended by its ``tool_output``), at a duration the item
reports, or else at the event before it (an upper bound: the logs the importers read do not
record when a call started); ``memstore.duration.source`` says which. Arguments, error
messages and titles pass through the store's redactor. Trace and span ids are derived from the
store id, the session and the turn or event, so exporting the same store again gives the same
ids. ``docs/export.md`` lists every attribute.

Lines stay under about 1 MB (the collector's file reader cuts longer ones): a session with
more spans is written as several requests, with the same resource.
"""

from __future__ import annotations

import hashlib
import logging
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import PurePosixPath
from typing import Any, BinaryIO, Optional, Union

import orjson

from .. import __version__
from ..events import parse_ts, value_text
from ..pricing import AGENT_PROVIDERS
from .source import CatalogSnapshot, SessionRow, TurnRow, read_events

logger = logging.getLogger(__name__)

PathArg = Union[str, "os.PathLike[str]"]
Progress = Optional[Callable[[int, int], None]]

SCOPE_NAME = "memstore.exporters.otlp"
# A line of the output stays under this many bytes (the collector reads lines of up to 1 MiB).
MAX_LINE_BYTES = 900_000
# Attribute values (arguments, messages) longer than this many characters are cut.
MAX_ATTRIBUTE_CHARS = 8_192

SPAN_KIND_INTERNAL = 1
SPAN_KIND_CLIENT = 3
STATUS_ERROR = 2

# The items that are tool executions, and the statuses that are failures (the catalog's
# tool_calls view's list; commands fail as its commands view says).
TOOL_ITEM_TYPES = ("tool_invocation", "tool_call", "mcp_tool_call", "command_execution", "file_change", "web_search")
FAILED_STATUSES = frozenset(
    {
        "failed",
        "error",
        "declined",
        "permission_rejected",
        "permission_cancelled",
        "hook_denied",
        "invalid_tool",
        "cancelled",
    }
)
# The price table's provider ids as the semantic conventions name them (others pass as they are).
_PROVIDERS = {
    "google": "gcp.gemini",
    "mistral": "mistral_ai",
    "x-ai": "x_ai",
    "xai": "x_ai",
    "aws": "aws.bedrock",
    "azure": "azure.ai.openai",
    "moonshotai": "moonshot_ai",
}

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass
class OtlpExportReport:
    """What an OTLP export wrote: sessions (traces), spans, lines (requests) and bytes, and the
    token totals of its ``chat`` spans."""

    destination: str
    sessions: int = 0
    spans: int = 0
    lines: int = 0
    bytes: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    refresh_errors: list[tuple[str, str]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "destination": self.destination,
            "sessions": self.sessions,
            "spans": self.spans,
            "lines": self.lines,
            "bytes": self.bytes,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "refresh_errors": [list(e) for e in self.refresh_errors],
        }


def export_otlp(
    root: PathArg, dest: Union[PathArg, BinaryIO], *, durable: bool = True, progress: Progress = None
) -> OtlpExportReport:
    """Write every session of the store at ``root`` as OTLP/JSON traces to ``dest``: a file path
    (or an fsspec URL), replaced whole when the export is done, or ``-`` (standard output), or
    an open binary file. Returns what was written (see the module doc)."""
    if not isinstance(dest, (str, os.PathLike)):
        return _export(root, dest, getattr(dest, "name", "<stream>"), progress)
    text = os.fspath(dest)
    if text == "-":
        return _export(root, sys.stdout.buffer, "-", progress)
    from .destination import open_destination

    parent, name = _split(text)
    destination = open_destination(parent, durable=durable)
    with destination.open_write(name) as out:
        report = _export(root, out, text, progress)
    return report


def _split(text: str) -> tuple[str, str]:
    """A file path or URL as (its directory, its name)."""
    if "://" in text and not text.lower().startswith("file://"):
        head, _, name = text.rstrip("/").rpartition("/")
        if not name or head.endswith(":/"):
            raise ValueError(f"{text}: name a file, not a bucket")
        return head, name
    path = PurePosixPath(text[len("file://") :] if text.lower().startswith("file://") else text)
    if not path.name:
        raise ValueError(f"{text}: name a file")
    return str(path.parent), path.name


def _export(root: PathArg, out: BinaryIO, where: str, progress: Progress) -> OtlpExportReport:
    report = OtlpExportReport(where)
    with CatalogSnapshot(root) as catalog:
        report.refresh_errors = catalog.refresh_errors
        sessions = catalog.sessions()
        for done, session in enumerate(sessions, start=1):
            trace = SessionTrace(catalog, session)
            for line in trace.lines():
                out.write(line)
                report.lines += 1
                report.bytes += len(line)
            report.sessions += 1
            report.spans += trace.span_count
            report.input_tokens += trace.input_tokens
            report.output_tokens += trace.output_tokens
            if progress is not None:
                progress(done, len(sessions))
    return report


# --------------------------------------------------------------------------------------------
# One session


class SessionTrace:
    """The spans of one session, built from the catalog (and the tool events of its log)."""

    def __init__(self, catalog: CatalogSnapshot, session: SessionRow):
        self.catalog = catalog
        self.session = session
        self.red = catalog.redaction
        self.trace_key = f"{catalog.identity.store_id}:{session.session_id}"
        self.trace_id = _digest(f"trace:{self.trace_key}", 16)
        self.spans: list[dict] = []
        self.input_tokens = self.output_tokens = 0
        self._build()

    @property
    def span_count(self) -> int:
        return len(self.spans)

    def _span_id(self, what: str) -> str:
        return _digest(f"span:{self.trace_key}:{what}", 8)

    # -- building ------------------------------------------------------------------------------

    def _build(self) -> None:
        session = self.session
        turns = self.catalog.turns(session)
        events = self.catalog.events(session)
        event_times = [_nanos(row[2]) for row in events]
        known = [t for t in event_times if t is not None]
        start = _first(_nanos(session.created_at), min(known, default=None), 0)
        end = max(_first(_nanos(session.updated_at), start), max(known, default=start))
        for t in turns:
            end = max(end, _first(_nanos(t.ended_at), 0))
        root_id = self._span_id("session")
        agent = session.agent_name
        provider = _provider(None, agent)
        attributes = [
            _attr("gen_ai.conversation.id", session.session_id),
            _attr("gen_ai.agent.name", agent),
            _attr("gen_ai.agent.version", session.agent_version),
            _attr("gen_ai.provider.name", provider),
            _attr("memstore.session.directory", session.directory),
            _attr("memstore.session.status", session.status),
            _attr("memstore.session.title", self._text(session.title)),
            _attr("memstore.session.turn_count", session.turn_count),
            _attr("memstore.session.parent_id", session.parent_session_id),
        ]
        self.spans.append(
            _span(self.trace_id, root_id, None, f"session {agent}", SPAN_KIND_INTERNAL, start, end, attributes)
        )
        turn_spans: dict[int, tuple[str, int, int]] = {}
        for t in turns:
            turn_spans[t.number] = self._turn(t, root_id, events, start)
        self._tools(events, turn_spans, root_id, start)

    def _turn(self, t: TurnRow, parent: str, events: list[tuple], session_start: int) -> tuple[str, int, int]:
        """Add the spans of turn ``t``; return its span id, start and end."""
        session = self.session
        agent = session.agent_name
        own = [n for n in (_nanos(row[2]) for row in events if row[1] == t.number) if n is not None]
        start = _first(_nanos(t.started_at), min(own, default=None), session_start)
        end = max(start, _first(_nanos(t.ended_at), max(own, default=None), start))
        span_id = self._span_id(f"turn:{t.number}")
        provider = _provider(t.cost.provider, agent)
        attributes = [
            _attr("gen_ai.operation.name", "invoke_agent"),
            _attr("gen_ai.provider.name", provider),
            _attr("gen_ai.agent.name", agent),
            _attr("gen_ai.agent.version", session.agent_version),
            _attr("gen_ai.conversation.id", session.session_id),
            _attr("gen_ai.request.model", t.model),
            _attr("memstore.turn.number", t.number),
            _attr("memstore.turn.status", t.status),
        ]
        status = None
        if t.status == "failed":
            attributes.append(_attr("error.type", "turn_failed"))
            status = {"code": STATUS_ERROR, "message": self._text(t.error) or "turn failed"}
        self.spans.append(
            _span(
                self.trace_id,
                span_id,
                parent,
                f"invoke_agent {agent}",
                SPAN_KIND_INTERNAL,
                start,
                end,
                attributes,
                status,
            )
        )
        usage = (t.input_tokens, t.cached_input_tokens, t.cache_creation_tokens, t.output_tokens)
        if t.model or any(usage):
            self.input_tokens += t.input_tokens
            self.output_tokens += t.output_tokens
            chat = [
                _attr("gen_ai.operation.name", "chat"),
                _attr("gen_ai.provider.name", provider),
                _attr("gen_ai.request.model", t.model),
                _attr("gen_ai.response.model", t.model),
                _attr("gen_ai.conversation.id", session.session_id),
                _attr("gen_ai.usage.input_tokens", t.input_tokens),
                _attr("gen_ai.usage.output_tokens", t.output_tokens),
                _attr("gen_ai.usage.cache_read.input_tokens", t.cached_input_tokens),
                _attr("gen_ai.usage.cache_creation.input_tokens", t.cache_creation_tokens),
                _attr("memstore.usage.scope", "turn"),
                _attr("memstore.turn.number", t.number),
                _attr("memstore.cost.usd", float(t.cost.usd) if t.cost.usd is not None else None),
                _attr("memstore.cost.source", t.cost.source.value),
            ]
            name = f"chat {t.model}" if t.model else "chat"
            self.spans.append(
                _span(
                    self.trace_id,
                    self._span_id(f"chat:{t.number}"),
                    span_id,
                    name,
                    SPAN_KIND_CLIENT,
                    start,
                    end,
                    chat,
                    status,
                )
            )
        return span_id, start, end

    def _tools(
        self, events: list[tuple], turns: dict[int, tuple[str, int, int]], root_id: str, session_start: int
    ) -> None:
        """Add an ``execute_tool`` span per tool execution among ``events``."""
        wanted = {
            row[0]: (row[3], row[5])
            for row in events
            if row[3] == "item.completed" and row[4] in (*TOOL_ITEM_TYPES, "tool_output")
        }
        if not wanted:
            return
        records = read_events(self.catalog.root, self.session, wanted)
        started: dict[str, int] = {}
        for row in events:
            when = _nanos(row[2])
            if row[3] == "item.started" and row[5] is not None and when is not None:
                started.setdefault(row[5], when)
        outputs: dict[str, tuple[int, dict]] = {}
        for row in events:
            event = records.get(row[0])
            if row[4] == "tool_output" and event is not None:
                item = event.get("item") or {}
                when = _nanos(row[2])
                for key in (item.get("call_id"), item.get("tool_call_id")):
                    if isinstance(key, str) and when is not None:
                        outputs.setdefault(key, (when, item))
        previous: Optional[int] = None
        previous_turn: Any = object()
        for row in events:
            seq, turn, ts = row[0], row[1], row[2]
            when = _nanos(ts)
            if turn != previous_turn:
                previous_turn = turn
                previous = turns[turn][1] if turn in turns else None
            if row[3] == "item.completed" and row[4] in TOOL_ITEM_TYPES:
                parent, turn_start, turn_end = turns.get(turn, (root_id, session_start, session_start))
                self._tool(row, records.get(seq), parent, when, previous, started, outputs, turn_start)
            if when is not None:
                previous = when

    def _tool(
        self,
        row: tuple,
        event: Optional[dict],
        parent: str,
        when: Optional[int],
        previous: Optional[int],
        started: dict[str, int],
        outputs: dict[str, tuple[int, dict]],
        turn_start: int,
    ) -> None:
        seq, _turn, _ts, _kind, item_type, item_id, name, status, exit_code = row[:9]
        item = event.get("item") if event is not None else None
        item = item if isinstance(item, dict) else {}
        end = when if when is not None else _first(previous, turn_start)
        source = "previous_event"
        start = _first(previous, turn_start, end)
        reported = item.get("duration_ms")
        paired = None
        if item_type == "tool_invocation":
            for key in (item_id, item.get("tool_call_id")):
                if isinstance(key, str) and key in outputs:
                    paired = outputs[key]
                    break
        if item_id is not None and item_id in started:
            start, source = started[item_id], "item.started"
        elif paired is not None:
            start, end, source = end, max(end, paired[0]), "tool_output"
        elif isinstance(reported, (int, float)) and not isinstance(reported, bool) and 0 <= reported < 10**12:
            start, source = end - int(reported * 1_000_000), "reported"
        start = min(start, end)
        tool = self._tool_name(item_type, item, name)
        call_id = item.get("tool_call_id") or item.get("call_id") or item_id
        arguments = self._arguments(item_type, item)
        attributes = [
            _attr("gen_ai.operation.name", "execute_tool"),
            _attr("gen_ai.tool.name", tool),
            _attr("gen_ai.tool.call.id", call_id if isinstance(call_id, str) else None),
            _attr("gen_ai.conversation.id", self.session.session_id),
            _attr("memstore.item.type", item_type),
            _attr("memstore.tool.status", status),
            _attr("memstore.event.seq", seq),
            _attr("memstore.duration.source", source),
        ]
        if arguments is not None:
            text, cut = _cut(arguments)
            attributes.append(_attr("gen_ai.tool.call.arguments", text))
            if cut:
                attributes.append(_attr("memstore.tool.call.arguments_truncated", True))
        if item_type == "command_execution" and isinstance(exit_code, int):
            attributes.append(_attr("process.exit.code", exit_code))
        failed = status in FAILED_STATUSES or (item_type == "command_execution" and (exit_code or 0) != 0)
        span_status = None
        if failed:
            error = status if status in FAILED_STATUSES else "nonzero_exit_code"
            attributes.append(_attr("error.type", error))
            span_status = {"code": STATUS_ERROR, "message": error}
        self.spans.append(
            _span(
                self.trace_id,
                self._span_id(f"event:{seq}"),
                parent,
                f"execute_tool {tool}",
                SPAN_KIND_INTERNAL,
                start,
                end,
                attributes,
                span_status,
            )
        )

    @staticmethod
    def _tool_name(item_type: str, item: dict, name: Optional[str]) -> str:
        tool = item.get("tool_name")
        if isinstance(tool, str) and tool:
            return tool
        if item_type == "mcp_tool_call":
            parts = [p for p in (item.get("server"), item.get("tool")) if isinstance(p, str) and p]
            if parts:
                return ".".join(parts)
        if item_type in ("tool_invocation", "tool_call") and name:
            return name
        return item_type  # command_execution, file_change, web_search: the item names the tool

    def _arguments(self, item_type: str, item: dict) -> Optional[str]:
        """The call's arguments as JSON text, redacted (``None`` when the log has none)."""
        if item_type == "command_execution":
            value: Any = {"command": item.get("command")} if item.get("command") is not None else None
        elif item_type == "web_search":
            value = {"query": item.get("query")} if item.get("query") is not None else None
        elif item_type == "file_change" and "arguments" not in item:
            value = {"changes": item.get("changes")} if item.get("changes") is not None else None
        else:
            value = item.get("arguments")
        if value is None:
            return None
        value = self.red.value(value)
        return value if isinstance(value, str) else value_text(value)

    def _text(self, text: Optional[str]) -> Optional[str]:
        if not text:
            return text
        return _cut(self.red.text(text) or "")[0]

    # -- output --------------------------------------------------------------------------------

    def _envelope(self) -> tuple[bytes, bytes]:
        session = self.session
        resource = [
            _attr("service.name", session.agent_name),
            _attr("service.version", session.agent_version),
            _attr("memstore.store.id", self.catalog.identity.store_id),
            _attr("memstore.store.label", self.catalog.identity.label),
            _attr("memstore.machine.id", self.catalog.machine_id),
        ]
        prefix = (
            b'{"resourceSpans":[{"resource":'
            + orjson.dumps({"attributes": [a for a in resource if a is not None]})
            + b',"scopeSpans":[{"scope":'
            + orjson.dumps({"name": SCOPE_NAME, "version": __version__})
            + b',"spans":['
        )
        return prefix, b"]}]}]}\n"

    def lines(self) -> list[bytes]:
        """The session's requests, each one JSON line of at most :data:`MAX_LINE_BYTES` bytes
        (a span alone is always smaller: its long values are cut)."""
        prefix, suffix = self._envelope()
        lines: list[bytes] = []
        batch: list[bytes] = []
        size = len(prefix) + len(suffix)
        for span in self.spans:
            data = orjson.dumps(span)
            if batch and size + len(data) + 1 > MAX_LINE_BYTES:
                lines.append(prefix + b",".join(batch) + suffix)
                batch, size = [], len(prefix) + len(suffix)
            batch.append(data)
            size += len(data) + 1
        if batch:
            lines.append(prefix + b",".join(batch) + suffix)
        return lines


# --------------------------------------------------------------------------------------------
# OTLP/JSON pieces


def _digest(text: str, size: int) -> str:
    """``size`` bytes of the SHA-256 of ``text``, as hex (never all zeros: OTLP reads those as
    no id)."""
    raw = bytearray(hashlib.sha256(text.encode()).digest()[:size])
    if not any(raw):
        raw[-1] = 1
    return raw.hex()


def _nanos(ts: Optional[str]) -> Optional[int]:
    """A timestamp as Unix nanoseconds (exact: integer arithmetic), ``None`` if it is none."""
    dt = parse_ts(ts)
    if dt is None:
        return None
    delta = dt - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000_000 + delta.microseconds * 1_000


def _first(*values: Optional[int]) -> int:
    for value in values:
        if value is not None:
            return value
    return 0


def _provider(price_provider: Optional[str], agent: str) -> str:
    """``gen_ai.provider.name``: the price table's provider of the model, else the agent's
    usual provider, else ``unknown``."""
    provider = price_provider or AGENT_PROVIDERS.get(agent)
    if not provider:
        return "unknown"
    return _PROVIDERS.get(provider, provider)


def _cut(text: str) -> tuple[str, bool]:
    if len(text) <= MAX_ATTRIBUTE_CHARS:
        return text, False
    return text[:MAX_ATTRIBUTE_CHARS] + f"…[{len(text) - MAX_ATTRIBUTE_CHARS} more characters]", True


def _attr(key: str, value: Any) -> Optional[dict]:
    """An OTLP ``KeyValue`` (``None`` for a missing value, left out by :func:`_span`)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return {"key": key, "value": {"boolValue": value}}
    if isinstance(value, int):
        return {"key": key, "value": {"intValue": str(value)}}  # int64 is a string in JSON
    if isinstance(value, float):
        return {"key": key, "value": {"doubleValue": value}}
    return {"key": key, "value": {"stringValue": str(value)}}


def _span(
    trace_id: str,
    span_id: str,
    parent: Optional[str],
    name: str,
    kind: int,
    start: int,
    end: int,
    attributes: list[Optional[dict]],
    status: Optional[dict] = None,
) -> dict:
    span: dict[str, Any] = {"traceId": trace_id, "spanId": span_id}
    if parent is not None:
        span["parentSpanId"] = parent
    span.update(
        {
            "name": name,
            "kind": kind,
            "startTimeUnixNano": str(start),
            "endTimeUnixNano": str(max(start, end)),
            "attributes": [a for a in attributes if a is not None],
        }
    )
    if status is not None:
        span["status"] = status
    return span
