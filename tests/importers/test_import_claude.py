"""Claude Code transcripts: 2.0-style (no turn markers) and 2.1-style (turn_duration, a Task
sub-agent in its own file, compaction). Each test asserts the turns, the paired tool calls and
the exact token usage of its fixture (see tests/fixtures/import/make_fixtures.py)."""

from __future__ import annotations

import orjson
from test_import import (
    CLAUDE_20,
    CLAUDE_21,
    CLAUDE_SUB,
    copy_source,
    events,
    items,
    records,
    session_id_of,
    turns_of,
    usage_sum,
)

import memstore

SID_20 = "2d984148-5555-4605-aac1-00000000e005"
SID_21 = "7a1c0b2e-6666-4d1e-9c2a-00000000f006"
AGENT = "a1b2c3d"


def usage(i, c, cc, o):
    return {"input_tokens": i, "cached_input_tokens": c, "cache_creation_tokens": cc, "output_tokens": o}


def ends(evs):
    return [t[-1]["type"] for t in turns_of(evs)]


def test_claude_20_transcript(tmp_path):
    report = memstore.import_logs(tmp_path, CLAUDE_20, settle_seconds=0)
    sid = f"claude-{SID_20}"
    assert (report.sessions_created, report.lines_skipped, report.problems) == (1, 0, [])
    evs = events(tmp_path, sid)
    assert evs[0] == {
        "type": "thread.started",
        "thread_id": sid,
        "source": {
            "agent": "claude",
            "agent_version": "2.0.28",
            "cwd": "/home/dev/web",
            "git_branch": "feat/nav",
            "path": str(CLAUDE_20),
            "thread_id": SID_20,
        },
    }
    turns = turns_of(evs)
    # The caveat (isMeta), /clear and its stdout are no prompts; without markers a prompt ends the turn before.
    assert ends(evs) == ["turn.completed", "turn.aborted", "turn.completed"]
    assert [items(t)[0]["text"] for t in turns] == [
        "Show the user's initials in NavUser",
        "now run the full suite",
        "track the work and look up the issue",
    ]
    # One response is several lines sharing message.id, with growing output: counted once, at its largest.
    assert [t[-1]["usage"] for t in turns] == [
        usage(74551, 71992, 2541, 321),
        usage(19810, 19600, 200, 150),
        usage(61723, 60500, 1200, 328),
    ]
    assert usage_sum(evs) == usage(156084, 152092, 3941, 799)
    assert {t[-1]["model"] for t in turns} == {"claude-sonnet-4-5-20250929"}

    one = items(turns[0])
    # Each call is one item, paired with its result and emitted when the result arrives.
    assert [(i["id"], i["type"]) for i in one] == [
        ("5", "user_message"),
        ("6:0", "agent_message"),
        ("7:0", "tool_call"),
        ("9:0", "command_execution"),
        ("12:0", "agent_message"),
        ("11:0", "file_change"),
        ("14:0", "agent_message"),
    ]
    assert {k: one[2][k] for k in ("tool_name", "arguments", "output", "status")} == {
        "tool_name": "Glob",
        "arguments": {"pattern": "**/NavUser.tsx"},
        "output": "/home/dev/web/src/NavUser.tsx",
        "status": "completed",
    }
    assert one[3] == {
        "id": "9:0",
        "type": "command_execution",
        "command": "npm test -- NavUser",
        "aggregated_output": "PASS NavUser.test.tsx\nwarning: slow",
        "status": "completed",
    }
    assert (one[5]["changes"], one[5]["status"]) == (
        [{"path": "/home/dev/web/src/NavUser.tsx", "kind": "update"}],
        "completed",
    )

    two = turns[1]
    assert items(two)[0]["images"] == 1
    assert [i["type"] for i in items(two)] == ["user_message", "reasoning", "command_execution"]
    assert items(two)[2]["status"] == "declined"  # the user rejected it
    assert two[-1]["reason"] == "interrupted"

    three = items(turns[2])
    assert [i["type"] for i in three] == ["user_message", "todo_list", "mcp_tool_call", "web_search", "agent_message"]
    assert three[1]["items"] == [
        {"text": "Run the suite", "completed": True},
        {"text": "Fix flaky test", "completed": False},
    ]
    assert {k: three[2][k] for k in ("server", "tool", "arguments", "result", "status")} == {
        "server": "github",
        "tool": "get_issue",
        "arguments": {"number": 7},
        "result": '{"title":"Flaky test"}',
        "status": "completed",
    }
    assert three[3]["query"] == "jest flaky test retry"
    assert evs[-1]["type"] == "thread.completed" and evs[-1]["num_turns"] == 3


def test_claude_21_transcript_with_a_sub_agent_and_compaction(tmp_path):
    report = memstore.import_logs(tmp_path, CLAUDE_21.parent, settle_seconds=0)
    sid, child = f"claude-{SID_21}", f"claude-{SID_21}-agent-{AGENT}"
    assert sorted(s.session_id for s in memstore.list_sessions(tmp_path)) == sorted([sid, child])
    assert (report.lines_skipped, report.lines_kept_unrecognized) == (0, 2)
    assert sorted((p.line, p.reason) for p in report.problems) == [
        (21, "unknown field 'newField' in Claude transcript lines ignored"),
        (26, "unknown transcript line type future-record; kept as import.unrecognized"),
        (30, "unparsable line (not JSON); kept as import.unrecognized"),
    ]
    rs = records(tmp_path, sid)
    evs = [e for e, _ in rs]
    assert evs[0]["source"] == {
        "agent": "claude",
        "agent_version": "2.1.14",
        "cwd": "/home/dev/app",
        "git_branch": "main",
        "path": str(CLAUDE_21),
        "thread_id": SID_21,
    }
    turns = turns_of(evs)
    assert ends(evs) == ["turn.completed", "turn.completed", "turn.aborted", "turn.failed"]
    # The agent_progress copies of the sub-agent's messages are not the parent's usage.
    assert [t[-1]["usage"] for t in turns] == [
        usage(32807, 31000, 1800, 165),
        usage(10110, 8000, 2100, 170),
        usage(5154, 5100, 50, 20),
        usage(0, 0, 0, 0),
    ]
    assert [t[-1].get("model") for t in turns] == ["claude-sonnet-4-5-20250929"] * 3 + [None]  # <synthetic> is no model

    task = items(turns[0])[2]
    assert {k: task[k] for k in ("tool_name", "status", "output", "child_session_id")} == {
        "tool_name": "Task",
        "status": "completed",
        "output": "Parser tests live in tests/parse.rs.",
        "child_session_id": child,
    }

    # Compaction: a boundary between the turns; its summary and the /compact markup start no turn.
    boundary = evs.index(
        {"type": "thread.compact_boundary", "thread_id": sid, "trigger": "manual", "pre_tokens": 32807}
    )
    assert evs[boundary - 1] is turns[0][-1] and evs[boundary + 1] is turns[1][0]
    assert [items(t)[0]["text"] for t in turns] == [
        "where is the parser tested?",
        "write a test for trailing commas",
        "run cargo test",
        "try again",
    ]

    two = items(turns[1])
    assert [i["type"] for i in two] == [
        "user_message",
        "reasoning",
        "file_change",
        "agent_message",
    ]  # "\n\n" text skipped
    assert two[2]["changes"] == [{"path": "/home/dev/app/tests/comma.rs", "kind": "add"}]
    three, four = turns[2], turns[3]
    assert (items(three)[1]["status"], three[-1]["reason"]) == ("declined", "interrupted")
    assert items(four)[1] == {"id": "28", "type": "error", "message": 'API Error: 529 {"type":"overloaded_error"}'}
    assert four[-1]["message"] == 'API Error: 529 {"type":"overloaded_error"}'
    # turn_duration closes each turn at its own time.
    assert [ts for e, ts in rs if e["type"] in ("turn.completed", "turn.aborted", "turn.failed")] == [
        "2026-01-20T08:00:22.200Z",
        "2026-01-20T08:10:36.100Z",
        "2026-01-20T08:11:05.200Z",
        "2026-01-20T08:12:05.100Z",
    ]

    kid = events(tmp_path, child)
    assert kid[0]["source"] == {
        "agent": "claude",
        "agent_version": "2.1.14",
        "cwd": "/home/dev/app",
        "git_branch": "main",
        "path": str(CLAUDE_SUB),
        "thread_id": SID_21,
        "agent_id": AGENT,
        "parent_session_id": sid,
    }
    assert ends(kid) == ["turn.completed"]
    assert [i["type"] for i in items(kid)] == ["user_message", "tool_call", "agent_message"]
    assert turns_of(kid)[0][-1]["usage"] == usage(8305, 4000, 4300, 110)
    assert turns_of(kid)[0][-1]["model"] == "claude-haiku-4-5"


def test_claude_21_turns_close_on_their_markers_while_the_session_is_active(tmp_path):
    source = copy_source(CLAUDE_21, tmp_path / "src")
    memstore.import_logs(tmp_path / "store", source)
    with memstore.open_session(tmp_path / "store", session_id_of(source), max_events=0) as log:
        assert [t.status for t in log.turns()] == ["completed", "completed", "aborted", "failed"]
        assert log.manifest.status == "active"


def test_a_sub_agent_file_named_only_by_its_place(tmp_path):
    # A sub-agent whose lines do not carry the session id: <session>/subagents/agent-<id>.jsonl names it.
    data = CLAUDE_SUB.read_bytes().replace(f'"sessionId":"{SID_21}",'.encode(), b"")
    source = copy_source(CLAUDE_SUB, tmp_path / "src", data)
    memstore.import_logs(tmp_path / "store", source)
    assert [s.session_id for s in memstore.list_sessions(tmp_path / "store")] == [f"claude-{SID_21}-agent-{AGENT}"]
    assert (
        events(tmp_path / "store", f"claude-{SID_21}-agent-{AGENT}")[0]["source"]["parent_session_id"]
        == f"claude-{SID_21}"
    )


def test_a_response_repeated_from_an_earlier_turn_counts_once(tmp_path):
    lines = CLAUDE_20.read_bytes().split(b"\n")
    replayed = lines[13]  # msg_D, the first turn's last answer, written again in the third turn
    assert b'"msg_D"' in replayed
    lines.insert(21, replayed)
    source = copy_source(CLAUDE_20, tmp_path / "src", b"\n".join(lines))
    report = memstore.import_logs(tmp_path / "store", source, settle_seconds=0)
    evs = events(tmp_path / "store", session_id_of(source))
    assert [t[-1]["usage"]["output_tokens"] for t in turns_of(evs)] == [321, 150, 328]
    assert sum(i.get("text") == "Done: NavUser shows the initials." for i in items(evs)) == 1
    assert report.lines_skipped == 1


def test_a_transcript_is_named_after_its_file_not_after_copied_lines(tmp_path):
    # A file that begins with history copied from another session still names its own session.
    other = "99999999-0000-4000-8000-000000000000"
    data = CLAUDE_20.read_bytes().replace(SID_20.encode(), other.encode(), 8)
    source = copy_source(CLAUDE_20, tmp_path / "src", data)
    memstore.import_logs(tmp_path / "store", source)
    assert [s.session_id for s in memstore.list_sessions(tmp_path / "store")] == [f"claude-{SID_20}"]
    assert events(tmp_path / "store", f"claude-{SID_20}")[0]["source"]["thread_id"] == SID_20


def test_an_interrupted_turn_ends_when_it_was_interrupted_not_at_a_later_compaction(tmp_path):
    sid = "9c1d2e3f-7777-4a1b-8c2d-00000000a009"

    def line(n, kind, ts, **fields):
        return {
            "parentUuid": None,
            "isSidechain": False,
            "userType": "external",
            "cwd": "/w",
            "sessionId": sid,
            "version": "2.1.3",
            "type": kind,
            "uuid": f"u{n}",
            "timestamp": ts,
            **fields,
        }

    source = tmp_path / "src" / f"{sid}.jsonl"
    source.parent.mkdir()
    source.write_bytes(
        b"".join(
            orjson.dumps(o) + b"\n"
            for o in (
                line(1, "user", "2026-11-01T10:00:00.000Z", message={"role": "user", "content": "refactor the parser"}),
                line(
                    2,
                    "assistant",
                    "2026-11-01T10:00:03.000Z",
                    message={
                        "id": "m1",
                        "role": "assistant",
                        "model": "claude-opus-4-5",
                        "content": [{"type": "text", "text": "Looking."}],
                        "usage": {"input_tokens": 10, "output_tokens": 5},
                    },
                ),
                line(
                    3,
                    "user",
                    "2026-11-01T10:00:05.000Z",
                    message={"role": "user", "content": [{"type": "text", "text": "[Request interrupted by user]"}]},
                ),
                line(
                    4,
                    "system",
                    "2026-11-01T10:01:25.000Z",
                    subtype="compact_boundary",
                    content="Conversation compacted",
                    compactMetadata={"trigger": "manual", "preTokens": 15},
                ),
                line(
                    5, "user", "2026-11-01T10:02:00.000Z", message={"role": "user", "content": "now just fix the test"}
                ),
            )
        )
    )
    memstore.import_logs(tmp_path / "store", source, settle_seconds=0)
    with memstore.read_session(tmp_path / "store", f"claude-{sid}") as reader:
        first = reader.turns()[0]
        assert (first.status, first.started_at, first.ended_at) == (
            "aborted",
            "2026-11-01T10:00:00.000Z",
            "2026-11-01T10:00:05.000Z",
        )
        kinds = [r.event["type"] for r in reader.iter_records()]
    # The compaction lies between the two turns, in neither.
    assert kinds.index("thread.compact_boundary") == kinds.index("turn.aborted") + 1
    assert kinds[kinds.index("thread.compact_boundary") + 1] == "turn.started"
