"""The OTLP/JSON export: it parses with the OTLP protobuf schema, follows the GenAI semantic
conventions, its token totals are the catalog's, its times are the source's, and what it
carries of tool arguments is redacted."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path

import pytest
from export_support import secret_of

import memstore
from memstore.exporters.otlp import MAX_LINE_BYTES, export_otlp

json_format = pytest.importorskip("google.protobuf.json_format", reason="protobuf is part of the test extra")
trace_service = pytest.importorskip(
    "opentelemetry.proto.collector.trace.v1.trace_service_pb2", reason="opentelemetry-proto is part of the test extra"
)

# The GenAI attributes this export uses, as the semantic conventions' registry names them
# (open-telemetry/semantic-conventions-genai, docs/registry/attributes/gen-ai.md), and the
# general attributes it uses (error.type, process.exit.code, service.*).
GENAI_ATTRIBUTES = {
    "gen_ai.operation.name", "gen_ai.provider.name", "gen_ai.agent.name", "gen_ai.agent.version",
    "gen_ai.conversation.id", "gen_ai.request.model", "gen_ai.response.model", "gen_ai.usage.input_tokens",
    "gen_ai.usage.output_tokens", "gen_ai.usage.cache_read.input_tokens", "gen_ai.usage.cache_creation.input_tokens",
    "gen_ai.tool.name", "gen_ai.tool.call.id", "gen_ai.tool.call.arguments",
}  # fmt: skip
OTHER_ATTRIBUTES = {"error.type", "process.exit.code"}
# Which span each operation is, and what the conventions require or recommend on it.
REQUIRED = {
    "invoke_agent": {"gen_ai.operation.name", "gen_ai.provider.name", "gen_ai.agent.name", "gen_ai.conversation.id"},
    "chat": {
        "gen_ai.operation.name",
        "gen_ai.provider.name",
        "gen_ai.usage.input_tokens",
        "gen_ai.usage.output_tokens",
    },
    "execute_tool": {"gen_ai.operation.name", "gen_ai.tool.name"},
}
KIND_INTERNAL, KIND_CLIENT = 1, 3


def _requests(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_bytes().splitlines()]


def _spans(requests: list[dict]) -> list[dict]:
    return [span for r in requests for rs in r["resourceSpans"] for ss in rs["scopeSpans"] for span in ss["spans"]]


def _attrs(span: dict) -> dict:
    out = {}
    for kv in span["attributes"]:
        ((kind, value),) = kv["value"].items()
        out[kv["key"]] = int(value) if kind == "intValue" else value
    return out


@pytest.fixture(scope="module")
def traces(demo_store: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("otlp") / "traces.jsonl"
    export_otlp(demo_store, path)
    return path


def test_every_line_parses_with_the_otlp_schema(traces: Path):
    """Each line is an ExportTraceServiceRequest that protobuf's JSON parser accepts (it
    rejects unknown fields and wrong types). OTLP/JSON writes trace and span ids as hex, not
    protobuf's base64: they are checked as hex of 16 and 8 bytes, then given to the parser."""
    parsed = 0
    for request in _requests(traces):
        for span in _spans([request]):
            for key, size in (("traceId", 16), ("spanId", 8), ("parentSpanId", 8)):
                if key in span:
                    raw = bytes.fromhex(span[key])
                    assert len(raw) == size and any(raw)
                    span[key] = base64.b64encode(raw).decode()
        message = json_format.Parse(json.dumps(request), trace_service.ExportTraceServiceRequest())
        for resource_spans in message.resource_spans:
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    assert span.start_time_unix_nano > 1_700_000_000 * 10**9
                    assert span.end_time_unix_nano >= span.start_time_unix_nano
                    parsed += 1
    assert parsed > 500


def test_token_totals_are_the_catalogs(traces: Path, catalog):
    """The chat spans' gen_ai.usage.* sum to the catalog's token totals, per model too."""
    totals: Counter = Counter()
    per_model: Counter = Counter()
    for span in _spans(_requests(traces)):
        a = _attrs(span)
        if a.get("gen_ai.operation.name") == "chat":
            for key in ("input_tokens", "output_tokens", "cache_read.input_tokens", "cache_creation.input_tokens"):
                totals[key] += a[f"gen_ai.usage.{key}"]
            per_model[a.get("gen_ai.request.model", "")] += a["gen_ai.usage.input_tokens"]
    expected = catalog.execute(
        "SELECT sum(input_tokens), sum(output_tokens), sum(cached_input_tokens), sum(cache_creation_tokens) FROM turns"
    ).fetchone()
    assert (totals["input_tokens"], totals["output_tokens"], totals["cache_read.input_tokens"],
            totals["cache_creation.input_tokens"]) == expected  # fmt: skip
    assert dict(per_model) == {
        model: tokens
        for model, tokens in catalog.execute(
            "SELECT coalesce(model, ''), sum(input_tokens) FROM turns "
            "WHERE model IS NOT NULL OR input_tokens + output_tokens + cached_input_tokens + cache_creation_tokens > 0 "
            "GROUP BY 1"
        )
    }


def test_spans_follow_the_genai_conventions(traces: Path):
    """Attribute names are the conventions' (or memstore.*), each operation's span has its
    name, kind and required attributes, and span names are '{operation} {name}'."""
    operations: Counter = Counter()
    for span in _spans(_requests(traces)):
        a = _attrs(span)
        for key in a:
            assert key in GENAI_ATTRIBUTES | OTHER_ATTRIBUTES or key.startswith("memstore."), key
        operation = a.get("gen_ai.operation.name")
        if operation is None:
            assert span["name"].startswith("session ") and "parentSpanId" not in span
            continue
        operations[operation] += 1
        assert REQUIRED[operation] <= set(a), (operation, sorted(a))
        assert span["kind"] == (KIND_CLIENT if operation == "chat" else KIND_INTERNAL)
        detail = {
            "invoke_agent": "gen_ai.agent.name",
            "chat": "gen_ai.request.model",
            "execute_tool": "gen_ai.tool.name",
        }
        assert span["name"] == f"{operation} {a.get(detail[operation], '')}".strip()
        if "error.type" in a:
            assert span["status"]["code"] == 2
    assert set(operations) == {"invoke_agent", "chat", "execute_tool"}


def test_one_trace_per_session_and_one_agent_span_per_turn(traces: Path, catalog):
    """Every session is one trace whose spans link to parents in it; each turn is one
    invoke_agent span; each tool execution of the catalog is one execute_tool span."""
    by_trace: dict[str, list[dict]] = defaultdict(list)
    for span in _spans(_requests(traces)):
        by_trace[span["traceId"]].append(span)
    sessions = dict(catalog.execute("SELECT session_id, turn_count - retained_turn_base + 1 FROM sessions"))
    assert len(by_trace) == len(sessions)
    tools = dict(catalog.execute(
        "SELECT session_id, count(*) FROM events WHERE type = 'item.completed' AND item_type IN "
        "('tool_invocation', 'tool_call', 'mcp_tool_call', 'command_execution', 'file_change', 'web_search') "
        "GROUP BY 1"
    ))  # fmt: skip
    for spans in by_trace.values():
        ids = {s["spanId"] for s in spans}
        assert len(ids) == len(spans)
        assert all(s.get("parentSpanId") in ids for s in spans if "parentSpanId" in s)
        roots = [s for s in spans if "parentSpanId" not in s]
        assert len(roots) == 1
        session_id = _attrs(roots[0])["gen_ai.conversation.id"]
        ops = Counter(_attrs(s).get("gen_ai.operation.name") for s in spans)
        assert ops["invoke_agent"] == sessions[session_id]
        assert ops["execute_tool"] == tools.get(session_id, 0)


def test_times_arguments_and_durations_come_from_the_log(tmp_path: Path):
    """A tool span starts at its item.started (or its tool_invocation, ending at the
    tool_output) and ends at its completion, at the log's times; its arguments are the
    call's, redacted; a failed command and a denied call are errors."""
    token = secret_of("github-token")
    root = tmp_path / "store"
    with memstore.Store(root).open("s") as log:
        events = [
            ({"type": "thread.started", "thread_id": "s", "source": {"agent": "codex"}}, "2026-11-05T10:00:00.000Z"),
            ({"type": "turn.started"}, "2026-11-05T10:00:01.000Z"),
            ({"type": "item.started", "item": {"id": "c1", "type": "command_execution", "command": "make test"}},
             "2026-11-05T10:00:02.500Z"),
            ({"type": "item.completed", "item": {"id": "c1", "type": "command_execution", "command": "make test",
                                                 "aggregated_output": "FAIL\n", "exit_code": 2, "status": "failed"}},
             "2026-11-05T10:00:09.250Z"),
            ({"type": "item.completed", "item": {"id": "t1", "type": "tool_invocation", "tool_name": "fetch",
                                                 "tool_call_id": "call_1",
                                                 "arguments": {"url": "https://api.example.com", "token": token}}},
             "2026-11-05T10:00:10.000Z"),
            ({"type": "item.completed", "item": {"id": "t1:out", "type": "tool_output", "call_id": "t1",
                                                 "output": "ok", "status": "completed"}},
             "2026-11-05T10:00:12.125Z"),
            ({"type": "item.completed", "item": {"id": "t2", "type": "tool_call", "tool_name": "Bash",
                                                 "arguments": {"command": "rm -rf build"}, "status": "declined"}},
             "2026-11-05T10:00:15.000Z"),
            ({"type": "turn.failed", "message": f"auth failed for {token}", "model": "gpt-5-codex",
              "usage": {"input_tokens": 1200, "cached_input_tokens": 800, "output_tokens": 90}},
             "2026-11-05T10:00:16.000Z"),
        ]  # fmt: skip
        for event, ts in events:
            log.append(event, ts=ts)
    out = tmp_path / "t.jsonl"
    export_otlp(root, out)
    assert token not in out.read_text()
    spans = {s["name"]: s for s in _spans(_requests(out))}

    def at(ts: str) -> str:
        from memstore.exporters.otlp import _nanos

        return str(_nanos(ts))

    command = spans["execute_tool command_execution"]
    assert (command["startTimeUnixNano"], command["endTimeUnixNano"]) == (at("2026-11-05T10:00:02.500Z"),
                                                                          at("2026-11-05T10:00:09.250Z"))  # fmt: skip
    a = _attrs(command)
    assert a["memstore.duration.source"] == "item.started" and a["process.exit.code"] == 2
    assert json.loads(a["gen_ai.tool.call.arguments"]) == {"command": "make test"}
    assert command["status"]["code"] == 2 and a["error.type"] == "failed"
    fetch = spans["execute_tool fetch"]
    assert (fetch["startTimeUnixNano"], fetch["endTimeUnixNano"]) == (at("2026-11-05T10:00:10.000Z"),
                                                                      at("2026-11-05T10:00:12.125Z"))  # fmt: skip
    a = _attrs(fetch)
    assert a["memstore.duration.source"] == "tool_output" and a["gen_ai.tool.call.id"] == "call_1"
    arguments = json.loads(a["gen_ai.tool.call.arguments"])
    assert arguments["url"] == "https://api.example.com" and arguments["token"].startswith("[REDACTED:")
    bash = spans["execute_tool Bash"]
    a = _attrs(bash)
    assert a["error.type"] == "declined" and a["memstore.duration.source"] == "previous_event"
    assert bash["startTimeUnixNano"] == at("2026-11-05T10:00:12.125Z")  # the event before it
    turn = spans["invoke_agent codex"]
    assert (turn["startTimeUnixNano"], turn["endTimeUnixNano"]) == (at("2026-11-05T10:00:01.000Z"),
                                                                    at("2026-11-05T10:00:16.000Z"))  # fmt: skip
    assert turn["status"]["code"] == 2 and token not in turn["status"]["message"]
    chat = _attrs(spans["chat gpt-5-codex"])
    assert (chat["gen_ai.provider.name"], chat["gen_ai.usage.input_tokens"], chat["gen_ai.usage.output_tokens"],
            chat["gen_ai.usage.cache_read.input_tokens"]) == ("openai", 1200, 90, 800)  # fmt: skip
    assert {s["parentSpanId"] for name, s in spans.items() if name.startswith("execute_tool")} == {turn["spanId"]}


def test_a_long_session_is_split_into_requests_under_the_line_limit(tmp_path: Path):
    """A session with more spans than one line holds is written as several requests of one
    trace, each line under the collector's limit; over-long arguments are cut and flagged."""
    root = tmp_path / "store"
    words = "parse the manifest then rebuild the index and compare offsets with the log".split()
    with memstore.Store(root).open("long") as log:
        log.append({"type": "thread.started", "thread_id": "long"}, ts="2026-11-06T08:00:00.000Z")
        log.append({"type": "turn.started"}, ts="2026-11-06T08:00:01.000Z")
        for i in range(600):
            body = " ".join(words[(i + j) % len(words)] for j in range(1500 if i % 50 == 0 else 200))
            log.append(
                {"type": "item.completed",
                 "item": {"id": f"w{i}", "type": "tool_call", "tool_name": "Write", "status": "completed",
                          "arguments": {"file_path": f"src/module_{i}.py", "content": body}, "output": "ok"}},
                ts=f"2026-11-06T{8 + (1 + i // 60) // 60:02d}:{(1 + i // 60) % 60:02d}:{i % 60:02d}.000Z",
            )  # fmt: skip
        log.append({"type": "turn.completed", "usage": {"input_tokens": 5, "output_tokens": 1}},
                   ts="2026-11-06T09:30:00.000Z")  # fmt: skip
    out = tmp_path / "t.jsonl"
    report = export_otlp(root, out)
    lines = out.read_bytes().splitlines(keepends=True)
    assert report.lines == len(lines) > 1
    assert all(len(line) <= MAX_LINE_BYTES for line in lines)
    spans = _spans([json.loads(line) for line in lines])
    assert len({s["traceId"] for s in spans}) == 1 and len(spans) == 600 + 3
    cut = [s for s in spans if _attrs(s).get("memstore.tool.call.arguments_truncated")]
    assert len(cut) == 12


def test_the_command_writes_to_standard_output(demo_store: Path, traces: Path):
    """`memstore export otlp -` prints the same requests as the file export."""
    result = subprocess.run(
        [sys.executable, "-m", "memstore", "export", "otlp", "-", "--root", str(demo_store)],
        capture_output=True,
        check=False,
        timeout=300,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == traces.read_bytes()
