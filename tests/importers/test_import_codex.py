"""Codex CLI sources: legacy rollouts without envelope, 0.40-style rollouts, task-event rollouts
(0.104-style) and ``codex exec --json`` streams. Each test asserts the turns, the paired tool
calls and the exact token usage of its fixture (see tests/fixtures/import/make_fixtures.py)."""

from __future__ import annotations

import time

from test_import import (
    CODEX_0104,
    CODEX_040,
    CODEX_EXEC,
    CODEX_LEGACY,
    OLD,
    copy_source,
    events,
    items,
    records,
    session_id_of,
    turns_of,
    usage_sum,
)

import memstore


def usage(i, c, o, r=None):
    u = {"input_tokens": i, "cached_input_tokens": c, "cache_creation_tokens": 0, "output_tokens": o}
    if r is not None:
        u["reasoning_output_tokens"] = r
    return u


def ends(evs):
    return [t[-1]["type"] for t in turns_of(evs)]


def test_legacy_rollout_without_envelope(tmp_path):
    report = memstore.import_logs(tmp_path, CODEX_LEGACY, settle_seconds=0)
    sid = "codex-0197f0aa-1111-7000-8000-00000000a001"
    assert (report.sessions_created, report.lines_skipped, report.problems) == (1, 0, [])
    evs = events(tmp_path, sid)
    assert evs[0] == {
        "type": "thread.started",
        "thread_id": sid,
        "source": {
            "agent": "codex",
            "git_branch": "main",
            "git_commit": "abc123",
            "path": str(CODEX_LEGACY),
            "thread_id": "0197f0aa-1111-7000-8000-00000000a001",
        },
    }
    turns = turns_of(evs)
    assert ends(evs) == ["turn.completed", "turn.completed"]
    # Injected instructions and environment context are not prompts; the header time stands for every line.
    assert [i["text"] for i in items(evs) if i["type"] == "user_message"] == ["list the files", "apply the fix"]
    assert {ts for _, ts in records(tmp_path, sid)} == {"2025-07-10T10:00:00.250Z"}
    first, second = items(turns[0]), items(turns[1])
    assert first[1] == {
        "id": "6",
        "type": "command_execution",
        "command": "ls -la",
        "aggregated_output": "Cargo.toml\nsrc\n",
        "status": "completed",
        "exit_code": 0,
    }
    assert [i["type"] for i in second] == ["user_message", "reasoning", "file_change", "agent_message"]
    assert second[2]["changes"] == [
        {"path": "src/lib.rs", "kind": "update"},
        {"path": "src/util.rs", "kind": "add"},
        {"path": "src/dead.rs", "kind": "delete"},
    ]
    assert second[2]["status"] == "completed"
    # Legacy files record no usage at all: every turn says zero.
    assert usage_sum(evs) == usage(0, 0, 0) and evs[-1]["type"] == "thread.completed"


def test_rollout_040_turns_are_user_messages_and_usage_is_the_advance_of_the_total(tmp_path):
    report = memstore.import_logs(tmp_path, CODEX_040, settle_seconds=0)
    sid = "codex-019982b8-2222-79e0-8b3b-00000000b002"
    assert (report.sessions_created, report.lines_skipped, report.problems) == (1, 0, [])
    rs = records(tmp_path, sid)
    evs = [e for e, _ in rs]
    source = evs[0]["source"]
    assert source == {
        "agent": "codex",
        "agent_version": "0.40.0",
        "cwd": "/home/dev/app",
        "git_branch": "feat/x",
        "git_commit": "d002f64",
        "originator": "codex_cli_rs",
        "path": str(CODEX_040),
        "thread_id": "019982b8-2222-79e0-8b3b-00000000b002",
    }
    turns = turns_of(evs)
    assert ends(evs) == ["turn.completed", "turn.aborted", "turn.completed"]
    assert [t[-1]["usage"] for t in turns] == [
        usage(9206, 8192, 175, 64),
        usage(6795, 6528, 89, 0),
        usage(3499, 3200, 36, 6),
    ]
    # The turns sum exactly to the last cumulative total, the repeated token_count counted once.
    assert usage_sum(evs) == usage(19500, 17920, 300)
    assert evs[-1]["usage"] == usage(19500, 17920, 300) and evs[-1]["num_turns"] == 3
    assert all(t[-1]["model"] == "gpt-5-codex" for t in turns)

    first = items(turns[0])
    assert [i["type"] for i in first] == [
        "user_message",
        "reasoning",
        "command_execution",
        "todo_list",
        "agent_message",
    ]
    assert first[0]["text"] == "why does the build fail?"  # the environment_context user_message kind is not a prompt
    assert first[2] == {
        "id": "10",
        "type": "command_execution",
        "command": "bash -lc 'cargo build'",
        "aggregated_output": "error[E0425]: cannot find value `x`\n",
        "status": "failed",
        "exit_code": 101,
    }
    assert first[3]["items"] == [
        {"text": "Find the missing value", "completed": True},
        {"text": "Fix it", "completed": False},
    ]
    assert sum(i["type"] == "agent_message" for i in items(evs)) == 2  # event_msg duplicates dropped

    # The aborted call is written after turn_aborted: it still lands in its turn, before the end.
    aborted = turns[1]
    assert [e["type"] for e in aborted] == ["turn.started", "item.completed", "item.completed", "turn.aborted"]
    patch = aborted[2]["item"]
    assert (patch["type"], patch["status"], patch["output"]) == ("file_change", "declined", "patch rejected by user")
    assert [c["path"] for c in patch["changes"]] == ["src/lib.rs", "src/util.rs", "src/dead.rs"]
    assert aborted[-1]["reason"] == "interrupted"
    # Each envelope keeps the source's time: the aborted turn ends with its last call's output.
    ts_of = {id(e): ts for e, ts in rs}
    assert ts_of[id(aborted[-1])] == "2025-09-25T21:12:43.101Z"
    assert rs[1][1] == "2025-09-25T21:12:14.126Z"


def test_rollout_040_still_being_written_keeps_its_last_turn_open(tmp_path):
    source = copy_source(CODEX_040, tmp_path / "src")
    memstore.import_logs(tmp_path / "store", source)
    evs = events(tmp_path / "store", session_id_of(source))
    assert ends(evs) == ["turn.completed", "turn.aborted", "item.completed"]  # the third turn has no end yet
    with memstore.open_session(tmp_path / "store", session_id_of(source), max_events=0) as log:
        assert [t.status for t in log.turns()] == ["completed", "aborted", "open"]
        assert log.manifest.status == "active"


def test_rollout_with_task_events(tmp_path):
    report = memstore.import_logs(tmp_path, CODEX_0104, settle_seconds=0)
    sid = "codex-019c5000-3333-7000-8000-00000000c003"
    assert report.sessions_created == 1 and (report.lines_skipped, report.lines_kept_unrecognized) == (0, 2)
    assert sorted((p.line, p.reason) for p in report.problems) == [
        (45, "unparsable line (not JSON); kept as import.unrecognized"),
        (46, "unknown event_msg type future_event_kind; kept as import.unrecognized"),
        (48, "unknown field 'trace_id' in Codex rollout lines ignored"),
    ]
    evs = events(tmp_path, sid)
    assert evs[0]["source"] == {
        "agent": "codex",
        "agent_version": "0.104.0",
        "cwd": "/home/dev/app",
        "git_branch": "main",
        "git_commit": "fe12ab",
        "originator": "codex_cli_rs",
        "path": str(CODEX_0104),
        "thread_id": "019c5000-3333-7000-8000-00000000c003",
        "model_provider": "openai",
        "session_source": "cli",
    }
    turns = turns_of(evs)
    assert ends(evs) == ["turn.completed", "turn.completed", "turn.aborted", "turn.failed"]
    assert [t[0].get("turn_id") for t in turns] == ["t1", "t2", "t3", "t4"]
    assert [t[-1]["usage"] for t in turns] == [
        usage(17000, 14000, 700, 300),
        usage(19000, 15000, 700, 200),
        usage(7000, 6000, 200, 30),
        usage(2000, 2000, 50, 0),
    ]
    assert usage_sum(evs) == usage(45000, 37000, 1650)
    assert {t[-1]["model"] for t in turns} == {"gpt-5.3-codex"}

    one = items(turns[0])
    assert [i["type"] for i in one] == [
        "user_message",
        "reasoning",
        "command_execution",
        "agent_message",
        "file_change",
        "mcp_tool_call",
        "agent_message",
    ]
    assert one[2] == {
        "id": "8",
        "type": "command_execution",
        "command": "cargo test",
        "aggregated_output": "test parse ... FAILED\n",
        "status": "failed",
        "exit_code": 101,
        "tool_name": "exec_command",
    }
    assert [i.get("phase") for i in one if i["type"] == "agent_message"] == ["commentary", "final_answer"]
    assert (one[4]["status"], len(one[4]["changes"]), one[4]["patch"].startswith("*** Begin Patch")) == (
        "completed",
        3,
        True,
    )
    assert {k: one[5][k] for k in ("server", "tool", "arguments", "status")} == {
        "server": "github",
        "tool": "get_issue",
        "arguments": {"owner": "acme", "repo": "app", "number": 7},
        "status": "completed",
    }

    two = turns[1]
    kinds = [(e["type"], e.get("item", {}).get("type")) for e in two]
    assert kinds == [
        ("turn.started", None),
        ("item.completed", "user_message"),
        ("item.completed", "command_execution"),
        ("item.completed", "user_message"),
        ("item.completed", "tool_call"),
        ("item.completed", "web_search"),
        ("thread.compact_boundary", None),
        ("item.completed", "agent_message"),
        ("turn.completed", None),
    ]
    prompts = [e["item"] for e in two if e.get("item", {}).get("type") == "user_message"]
    assert prompts == [
        {"id": "22", "type": "user_message", "text": "start the dev server", "images": 1},
        {"id": "26", "type": "user_message", "text": "also check /health"},
    ]  # queued into the running turn
    running = two[2]["item"]
    assert (running["status"], "exit_code" in running, running["aggregated_output"]) == (
        "in_progress",
        False,
        "ready on :3000\n",
    )
    assert (two[4]["item"]["tool_name"], two[4]["item"]["arguments"]["session_id"]) == ("write_stdin", 7)
    assert two[5]["item"]["query"] == "express health check route"
    assert two[6] == {"type": "thread.compact_boundary", "thread_id": sid, "trigger": "unknown", "pre_tokens": 30000}

    three = items(turns[2])
    assert (three[1]["tool_name"], three[1]["images"]) == ("view_image", 1)
    assert (three[2]["command"], three[2]["status"]) == ("rm -rf build", "declined")  # written after turn_aborted
    four = turns[3]
    assert items(four)[-1] == {"id": "51", "type": "error", "message": "stream disconnected before completion"}
    assert four[-1]["message"] == "stream disconnected before completion"

    # Every call is paired with its output and emitted once, under the call's line number.
    calls = [i for i in items(evs) if i["type"] in ("command_execution", "file_change", "mcp_tool_call", "tool_call")]
    assert [i["id"] for i in calls] == ["8", "13", "15", "23", "25", "38", "42"]
    assert not any(i.get("result_missing") for i in calls)
    assert evs[-1]["subtype"] == "error_during_execution" and evs[-1]["num_turns"] == 4


def test_a_call_without_output_is_emitted_when_its_turn_ends(tmp_path):
    data = CODEX_0104.read_bytes().replace(b'"call_id":"call_c3","output"', b'"call_id":"call_zz","output"')
    source = copy_source(CODEX_0104, tmp_path / "src", data)
    report = memstore.import_logs(tmp_path / "store", source)
    mcp = [i for i in items(events(tmp_path / "store", session_id_of(source))) if i["type"] == "mcp_tool_call"]
    assert (mcp[0]["status"], mcp[0]["result_missing"], mcp[0]["result"]) == ("failed", True, "")
    assert any(p.line == 16 and "without a pending call" in p.reason for p in report.problems)


def test_exec_json_stream(tmp_path):
    source = copy_source(CODEX_EXEC, tmp_path / "src", mtime=OLD)
    report = memstore.import_logs(tmp_path / "store", source)
    sid = "codex-019a2d7a-4444-78b1-b7cc-00000000d004"
    assert (report.sessions_created, report.lines_skipped, report.problems) == (1, 0, [])
    rs = records(tmp_path / "store", sid)
    evs = [e for e, _ in rs]
    assert evs[0]["source"] == {
        "agent": "codex",
        "originator": "codex_exec",
        "path": str(source),
        "thread_id": "019a2d7a-4444-78b1-b7cc-00000000d004",
    }
    turns = turns_of(evs)
    assert ends(evs) == ["turn.completed", "turn.completed", "turn.failed"]
    # Its usage is cumulative for the thread: each turn gets the difference.
    assert [t[-1]["usage"] for t in turns] == [usage(2946, 0, 7), usage(4054, 2048, 53), usage(0, 0, 0)]
    assert usage_sum(evs) == usage(7000, 2048, 60)
    assert turns[2][-1]["message"] == "model overloaded"
    assert items(turns[2]) == [{"id": "14", "type": "error", "message": "stream error: retrying"}]
    # Item ids are line numbers (Codex's item_N counts per process); early field names are mapped.
    assert [(i["id"], i["type"]) for i in items(evs)] == [
        ("3", "reasoning"),
        ("4", "command_execution"),
        ("5", "agent_message"),
        ("9", "file_change"),
        ("10", "todo_list"),
        ("11", "agent_message"),
        ("14", "error"),
    ]
    assert items(turns[1])[-1] == {"id": "11", "type": "agent_message", "text": "Updated README."}
    # The stream has no times: every event carries the stream file's modification time.
    assert {ts for _, ts in rs} == {rs[0][1]}
    assert rs[0][1].startswith(time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(OLD)))


def test_a_task_left_without_its_end_is_cut_short(tmp_path):
    data = CODEX_0104.read_bytes()
    cut = data.index(b'"type":"task_complete","turn_id":"t2"')
    source = copy_source(CODEX_0104, tmp_path / "src", data[: data.rindex(b"\n", 0, cut) + 1], OLD)
    memstore.import_logs(tmp_path / "store", source)
    evs = events(tmp_path / "store", session_id_of(source))
    assert ends(evs) == ["turn.completed", "turn.aborted"]
    assert turns_of(evs)[1][-1]["reason"] == "unfinished"
    assert evs[-1]["type"] == "thread.completed" and evs[-1]["subtype"] == "cancelled"
    # A new task_started after a task without its end closes it the same way.
    lines = data.split(b"\n")
    del lines[33]  # task_complete of t2
    source = copy_source(CODEX_0104, tmp_path / "src2", b"\n".join(lines))
    memstore.import_logs(tmp_path / "store2", source)
    assert [t[-1].get("reason") for t in turns_of(events(tmp_path / "store2", session_id_of(source)))][:3] == [
        None,
        "unfinished",
        "interrupted",
    ]
