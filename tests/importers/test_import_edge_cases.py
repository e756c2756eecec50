"""Adversarial review of the importers: each test is a bug found by attacking a promise of
docs/import.md (turn boundaries, paired tool calls, settled sources, regeneration), kept as a
regression test. Sources are written line by line here, from the format rules."""

from __future__ import annotations

import json
import os
from pathlib import Path

import orjson
from test_import import OLD, events, items, records, turns_of

import memstore

CODEX_ID = "0199aaaa-0000-7000-8000-0000000000a1"
CODEX_SID = f"codex-{CODEX_ID}"
CLAUDE_ID = "5f0c4a1e-7777-4b1e-8d2a-0000000000b2"
CLAUDE_SID = f"claude-{CLAUDE_ID}"


def at(second: int) -> str:
    return f"2026-02-01T10:{second // 60:02d}:{second % 60:02d}.000Z"


def env(second: int, kind: str, payload: dict) -> dict:
    return {"timestamp": at(second), "type": kind, "payload": payload}


def meta() -> dict:
    return env(
        0,
        "session_meta",
        {"id": CODEX_ID, "timestamp": at(0), "cwd": "/w", "originator": "codex_cli_rs", "cli_version": "0.104.0"},
    )


def jsonl(lines: list) -> bytes:
    return b"".join(orjson.dumps(line) + b"\n" for line in lines)


def write(path: Path, data: bytes, mtime: float | None = OLD) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    if mtime is not None:
        os.utime(path, (mtime, mtime))
    return path


def rollout(tmp_path: Path, lines: list, mtime: float | None = OLD) -> Path:
    return write(tmp_path / "src" / f"rollout-2026-02-01T10-00-00-{CODEX_ID}.jsonl", jsonl(lines), mtime)


def ends(evs):
    return [t[-1]["type"] for t in turns_of(evs)]


# ---------------------------------------------------------------------------------------------
# Codex turn boundaries


def test_codex_a_prompt_after_an_aborted_task_opens_the_next_turn_not_the_aborted_one(tmp_path):
    # The importer accepts a prompt written before its task_started (the turn it opens is
    # adopted by the task). After turn_aborted no task is running any more: the next prompt
    # belongs to the next task, not to the aborted turn, whose late calls are still its own.
    source = rollout(
        tmp_path,
        [
            meta(),
            env(1, "event_msg", {"type": "task_started", "turn_id": "t1"}),
            env(1, "event_msg", {"type": "user_message", "message": "first"}),
            env(
                2,
                "response_item",
                {
                    "type": "function_call",
                    "name": "shell",
                    "call_id": "c1",
                    "arguments": json.dumps({"command": ["ls"]}),
                },
            ),
            env(3, "event_msg", {"type": "turn_aborted", "reason": "interrupted"}),
            env(3, "response_item", {"type": "function_call_output", "call_id": "c1", "output": "aborted by user"}),
            env(5, "event_msg", {"type": "user_message", "message": "second prompt"}),
            env(5, "event_msg", {"type": "task_started", "turn_id": "t2"}),
            env(
                6,
                "response_item",
                {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "ok"}]},
            ),
            env(7, "event_msg", {"type": "task_complete", "turn_id": "t2"}),
        ],
    )
    report = memstore.import_logs(tmp_path / "store", source)
    assert report.problems == []
    rs = records(tmp_path / "store", CODEX_SID)
    turns = turns_of([e for e, _ in rs])
    assert ends([e for e, _ in rs]) == ["turn.aborted", "turn.completed"]
    assert [i["type"] for i in items(turns[0])] == ["user_message", "command_execution"]
    assert [i.get("text") for i in items(turns[1])] == ["second prompt", "ok"]
    # The aborted turn ends at its own last line, not at the next prompt's time.
    ts_of = {id(e): ts for e, ts in rs}
    assert ts_of[id(turns[0][-1])] == at(3)


# ---------------------------------------------------------------------------------------------
# Settled sources


def test_the_last_line_of_a_settled_source_is_imported_even_without_its_newline(tmp_path):
    # A partial last line waits while the agent may still be writing it; once the source has
    # settled nobody is writing it any more: a complete line (only its newline missing) is the
    # source's last line, not one to wait for (a turn left open would be cut short).
    lines = [
        meta(),
        env(1, "event_msg", {"type": "task_started", "turn_id": "t1"}),
        env(1, "event_msg", {"type": "user_message", "message": "first"}),
        env(
            6,
            "response_item",
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "ok"}]},
        ),
        env(7, "event_msg", {"type": "task_complete", "turn_id": "t1"}),
    ]
    data = jsonl(lines)[:-1]  # no newline after task_complete
    source = write(tmp_path / "src" / f"rollout-{CODEX_ID}.jsonl", data, mtime=None)
    memstore.import_logs(tmp_path / "store", source)
    assert ends(events(tmp_path / "store", CODEX_SID)) == ["item.completed"]  # still being written: it waits
    os.utime(source, (OLD, OLD))
    memstore.import_logs(tmp_path / "store", source)
    evs = events(tmp_path / "store", CODEX_SID)
    assert ends(evs) == ["turn.completed"]
    assert evs[-1]["type"] == "thread.completed" and evs[-1]["subtype"] == "success"
    # Importing it again (settled, unchanged) adds nothing; in one go it is the same.
    again = memstore.import_logs(tmp_path / "store", source)
    assert (again.events_appended, again.sessions_unchanged) == (0, 1)
    memstore.import_logs(tmp_path / "fresh", source)
    assert records(tmp_path / "store", CODEX_SID) == records(tmp_path / "fresh", CODEX_SID)

    # Resumed later (the newline, then more lines): the session goes on after its completion.
    before = records(tmp_path / "store", CODEX_SID)
    write(
        source,
        data
        + b"\n"
        + jsonl(
            [
                env(20, "event_msg", {"type": "task_started", "turn_id": "t2"}),
                env(21, "event_msg", {"type": "task_complete", "turn_id": "t2"}),
            ]
        ),
    )
    report = memstore.import_logs(tmp_path / "store", source)
    assert (report.sessions_regenerated, report.sessions_updated) == (0, 1)
    assert records(tmp_path / "store", CODEX_SID)[: len(before)] == before
    assert ends(events(tmp_path / "store", CODEX_SID)) == ["turn.completed", "turn.completed"]


# ---------------------------------------------------------------------------------------------
# Tool calls paired with their results


def test_codex_an_output_written_before_its_call_is_paired_with_it(tmp_path):
    source = rollout(
        tmp_path,
        [
            meta(),
            env(1, "event_msg", {"type": "task_started", "turn_id": "t1"}),
            env(1, "event_msg", {"type": "user_message", "message": "say hello"}),
            env(
                3,
                "response_item",
                {
                    "type": "function_call_output",
                    "call_id": "c1",
                    "output": "Exit code: 0\nWall time: 0.1 seconds\nOutput:\nhello\n",
                },
            ),
            env(
                3,
                "response_item",
                {
                    "type": "function_call",
                    "name": "exec_command",
                    "call_id": "c1",
                    "arguments": json.dumps({"cmd": "echo hello"}),
                },
            ),
            env(4, "response_item", {"type": "function_call_output", "call_id": "nobody", "output": "stray"}),
            env(7, "event_msg", {"type": "task_complete", "turn_id": "t1"}),
        ],
    )
    report = memstore.import_logs(tmp_path / "store", source)
    command = [i for i in items(events(tmp_path / "store", CODEX_SID)) if i["type"] == "command_execution"]
    assert command == [
        {
            "id": "5",
            "type": "command_execution",
            "command": "echo hello",
            "aggregated_output": "hello\n",
            "status": "completed",
            "exit_code": 0,
            "tool_name": "exec_command",
        }
    ]
    # An output whose call never comes is still reported, once, where it is.
    assert [(p.line, p.reason) for p in report.problems] == [
        (6, "function_call_output without a pending call (its call was not imported or already closed)")
    ]
    assert report.lines_skipped == 1


def claude_line(kind: str, second: int, uuid: str, message: dict, **extra) -> dict:
    return {
        "type": kind,
        "sessionId": CLAUDE_ID,
        "uuid": uuid,
        "parentUuid": None,
        "isSidechain": False,
        "userType": "external",
        "cwd": "/w",
        "version": "2.1.3",
        "gitBranch": "main",
        "timestamp": at(second),
        "message": message,
        **extra,
    }


def test_claude_a_result_written_before_its_call_is_paired_with_it(tmp_path):
    lines = [
        claude_line("user", 1, "u1", {"role": "user", "content": "list the files"}),
        claude_line(
            "user",
            2,
            "u2",
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "a.py\nb.py"}]},
            toolUseResult={"stdout": "a.py\nb.py", "stderr": "", "interrupted": False, "isImage": False},
        ),
        claude_line(
            "assistant",
            2,
            "a1",
            {
                "id": "msg_1",
                "role": "assistant",
                "model": "claude-x",
                "content": [{"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"command": "ls"}}],
                "usage": {"input_tokens": 5, "output_tokens": 7},
            },
            requestId="req_1",
        ),
        {
            "type": "system",
            "subtype": "turn_duration",
            "durationMs": 2000,
            "sessionId": CLAUDE_ID,
            "uuid": "s1",
            "timestamp": at(3),
        },
    ]
    source = write(tmp_path / "src" / "-w" / f"{CLAUDE_ID}.jsonl", jsonl(lines))
    report = memstore.import_logs(tmp_path / "store", source)
    assert report.problems == []
    evs = events(tmp_path / "store", CLAUDE_SID)
    assert [i for i in items(evs) if i["type"] == "command_execution"] == [
        {
            "id": "3:0",
            "type": "command_execution",
            "command": "ls",
            "aggregated_output": "a.py\nb.py",
            "status": "completed",
        }
    ]
    assert ends(evs) == ["turn.completed"]


# ---------------------------------------------------------------------------------------------
# A source that no longer matches its session: the session is set aside, never removed


def _two_tasks(upto: int, first_prompt: str = "prompt 0") -> list:
    lines = [meta()]
    for k in range(upto):
        lines += [
            env(10 * k + 1, "event_msg", {"type": "task_started", "turn_id": f"t{k}"}),
            env(
                10 * k + 1, "event_msg", {"type": "user_message", "message": first_prompt if k == 0 else f"prompt {k}"}
            ),
            env(10 * k + 2, "event_msg", {"type": "task_complete", "turn_id": f"t{k}"}),
        ]
    return lines


def test_a_pinned_session_is_never_set_aside_to_import_its_rewritten_source(tmp_path):
    source = rollout(tmp_path, _two_tasks(1))
    memstore.import_logs(tmp_path / "store", source)
    directory = memstore.session_directory(tmp_path / "store", CODEX_SID)
    memstore.pin_session_retention(directory, "evidence")
    before = records(tmp_path / "store", CODEX_SID)
    rollout(tmp_path, _two_tasks(2, first_prompt="a rewritten prompt"))  # rewritten, not grown
    report = memstore.import_logs(tmp_path / "store", source)
    assert report.sessions_regenerated == 0 and report.events_appended == 0 and report.set_aside == []
    assert [p.reason for p in report.problems] == [
        f"session {CODEX_SID!r} is pinned: it is not set aside to import its changed source again; "
        "unpin it to re-import its source"
    ]
    assert memstore.session_retention_pinned(directory)
    assert records(tmp_path / "store", CODEX_SID) == before
    memstore.unpin_session_retention(directory)
    assert memstore.import_logs(tmp_path / "store", source).sessions_regenerated == 1


def test_setting_a_session_aside_removes_nothing_and_says_so(tmp_path):
    source = rollout(tmp_path, _two_tasks(1))
    memstore.import_logs(tmp_path / "store", source)
    before = records(tmp_path / "store", CODEX_SID)
    rollout(tmp_path, _two_tasks(2, first_prompt="a rewritten prompt"))
    report = memstore.import_logs(tmp_path / "store", source)
    [entry] = report.set_aside
    assert not (tmp_path / "store" / "gc-log.jsonl").exists()  # nothing was removed
    assert records(tmp_path / "store", entry.set_aside_as) == before
    note = json.loads(
        (memstore.session_directory(tmp_path / "store", entry.set_aside_as) / "derived" / "set-aside.json").read_text()
    )
    assert (note["set_aside_from"], note["reason"]) == (CODEX_SID, "its source was rewritten or truncated")
    listed = {s.session_id for s in memstore.list_sessions(tmp_path / "store")}
    assert listed == {CODEX_SID, entry.set_aside_as}


# ---------------------------------------------------------------------------------------------
# Bad input is never fatal


def test_a_file_name_that_is_not_utf8_is_imported_and_reported_printably(tmp_path):
    # Linux file names are bytes: an undecodable one reaches Python with surrogates, which JSON
    # cannot hold. It crashed the whole import (InvalidEvent writing thread.started).
    thread = "0199ffff-0000-7000-8000-0000000000f1"
    directory = tmp_path / "src"
    directory.mkdir()
    name = os.fsencode(directory) + b"/run-\xff.jsonl"
    with open(name, "wb") as fh:
        fh.write(
            jsonl(
                [
                    {"type": "thread.started", "thread_id": thread},
                    {"type": "turn.started"},
                    {"type": "turn.completed", "usage": {"input_tokens": 3, "output_tokens": 1}},
                ]
            )
        )
    os.symlink(directory / "nowhere", os.fsencode(directory) + b"/link-\xfe.jsonl")
    report = memstore.import_logs(tmp_path / "store", directory)
    assert report.sessions_created == 1
    shown = f"{directory}/run-\\xff.jsonl"
    evs = events(tmp_path / "store", f"codex-{thread}")
    assert evs[0]["source"]["path"] == shown
    assert [e["type"] for e in evs] == ["thread.started", "turn.started", "turn.completed"]
    assert [(p.path, p.reason) for p in report.problems] == [
        (f"{directory}/link-\\xfe.jsonl", "symlink not followed (only what was named is read)")
    ]
    orjson.dumps(report.to_dict())  # what `memstore import --json` prints
    again = memstore.import_logs(tmp_path / "store", directory)
    assert (again.sessions_unchanged, again.events_appended) == (1, 0)


def test_session_metadata_too_deep_for_json_is_left_out_not_fatal(tmp_path):
    # session_meta.source is copied into thread.started; JSON nested deeper than the log can
    # write made that lifecycle event unstorable, and the import raised InvalidEvent.
    deep: dict = {}
    cursor = deep
    for _ in range(300):
        cursor["x"] = {}
        cursor = cursor["x"]
    header = meta()
    header["payload"]["source"] = {"subagent": deep}
    data = b"".join(
        json.dumps(line).encode() + b"\n"
        for line in [
            header,
            env(1, "event_msg", {"type": "task_started", "turn_id": "t1"}),
            env(2, "event_msg", {"type": "task_complete", "turn_id": "t1"}),
        ]
    )
    source = write(tmp_path / "src" / f"rollout-{CODEX_ID}.jsonl", data)
    report = memstore.import_logs(tmp_path / "store", source)
    assert report.sessions_created == 1
    evs = events(tmp_path / "store", CODEX_SID)
    assert "session_source" not in evs[0]["source"] and evs[0]["source"]["cwd"] == "/w"
    assert ends(evs) == ["turn.completed"]
    assert [p.reason for p in report.problems] == [
        "thread metadata that cannot be stored as JSON left out (session_source)"
    ]


# ---------------------------------------------------------------------------------------------
# Incremental imports without the cache


def test_an_exec_stream_that_grew_without_its_import_cache_is_extended_not_regenerated(tmp_path):
    # A stream has no times: its events carry the file's mtime at the first import. Without the
    # cache, the events parsed again were dated by the current mtime, never matched the log,
    # and the session was reported as no longer matching its source and regenerated.
    thread = "0199eeee-1111-7000-8000-0000000000e1"
    lines = [
        {"type": "thread.started", "thread_id": thread},
        {"type": "turn.started"},
        {"type": "turn.completed", "usage": {"input_tokens": 3, "output_tokens": 1}},
    ]
    source = write(tmp_path / "src" / "run.jsonl", jsonl(lines), mtime=None)
    memstore.import_logs(tmp_path / "store", source)
    sid = f"codex-{thread}"
    before = records(tmp_path / "store", sid)
    (memstore.session_directory(tmp_path / "store", sid) / "derived" / "import-state.json").unlink()
    os.utime(source, (OLD, OLD))  # the first import's mtime is not the file's any more
    write(
        source,
        jsonl(
            lines
            + [{"type": "turn.started"}, {"type": "turn.completed", "usage": {"input_tokens": 8, "output_tokens": 2}}]
        ),
        mtime=None,
    )
    report = memstore.import_logs(tmp_path / "store", source)
    assert (report.sessions_updated, report.sessions_regenerated, report.events_appended) == (1, 0, 2)
    assert report.problems == []
    after = records(tmp_path / "store", sid)
    assert after[: len(before)] == before and {ts for _, ts in after} == {before[0][1]}


def test_an_exec_turn_that_completed_after_an_error_notice_is_completed(tmp_path):
    # `codex exec --json` writes `error` events for notices it recovers from (stream retries)
    # and ends the turn with its own verdict: turn.completed, or turn.failed. The importer
    # turned every turn with an error notice into turn.failed, against the stream.
    thread = "0199eeee-1111-7000-8000-0000000000e2"
    source = write(
        tmp_path / "src" / "run.jsonl",
        jsonl(
            [
                {"type": "thread.started", "thread_id": thread},
                {"type": "turn.started"},
                {"type": "error", "message": "Reconnecting... 1/5"},
                {"type": "item.completed", "item": {"id": "item_0", "type": "agent_message", "text": "done"}},
                {"type": "turn.completed", "usage": {"input_tokens": 30, "cached_input_tokens": 0, "output_tokens": 4}},
                {"type": "turn.started"},
                {"type": "error", "message": "stream error: retrying"},
                {"type": "turn.failed", "error": {"message": "model overloaded"}},
            ]
        ),
    )
    memstore.import_logs(tmp_path / "store", source)
    evs = events(tmp_path / "store", f"codex-{thread}")
    turns = turns_of(evs)
    assert ends(evs) == ["turn.completed", "turn.failed"]
    assert [i["type"] for i in items(turns[0])] == ["error", "agent_message"]  # the notice is kept
    assert turns[1][-1]["message"] == "model overloaded"
    assert evs[-1]["subtype"] == "error_during_execution"


def test_a_line_dated_in_the_future_does_not_date_the_session_past_the_present(tmp_path):
    # A session's age is its last event time: one source line with a wrong clock (year 2999)
    # made an imported session newer than everything, for ever (retention never ages it out).
    # Migration and memory views refuse such times; the importer used them.
    source = rollout(
        tmp_path,
        [
            meta(),
            env(1, "event_msg", {"type": "task_started", "turn_id": "t1"}),
            {**env(1, "event_msg", {"type": "user_message", "message": "hi"}), "timestamp": "2999-01-01T00:00:00.000Z"},
            env(2, "event_msg", {"type": "task_complete", "turn_id": "t1"}),
        ],
    )
    report = memstore.import_logs(tmp_path / "store", source)
    assert [(p.line, p.reason) for p in report.problems] == [
        (3, "timestamp '2999-01-01T00:00:00.000Z' is in the future; the previous one is used")
    ]
    assert {ts for _, ts in records(tmp_path / "store", CODEX_SID)} == {at(0), at(1), at(2)}
    assert memstore.list_sessions(tmp_path / "store")[0].updated_at == at(2)
    policy = memstore.RetentionPolicy(50, 30, include_imported=True)  # (imported sessions are kept by default)
    assert memstore.apply_retention(tmp_path / "store", policy, apply=True).count == 1


def test_an_exec_stream_with_a_future_mtime_is_not_dated_in_the_future(tmp_path):
    # A stream's events take the file's mtime: a file touched into the future dated them there.
    import time

    thread = "0199eeee-1111-7000-8000-0000000000e3"
    future = 32503680000  # 3000-01-01
    source = write(
        tmp_path / "src" / "run.jsonl",
        jsonl([{"type": "thread.started", "thread_id": thread}, {"type": "turn.started"}]),
        mtime=future,
    )
    memstore.import_logs(tmp_path / "store", source)
    stamps = {ts for _, ts in records(tmp_path / "store", f"codex-{thread}")}
    assert len(stamps) == 1 and stamps.pop() <= time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(time.time() + 2 * 86400))
