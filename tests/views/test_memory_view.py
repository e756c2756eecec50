"""The memory view: derived/memory.json as a pure function of the log (envelopes recorded as
events first, facts by VT Code's extraction rules, reproducible byte for byte), and its readers
(session_memory_facts, query_facts, recent_sessions), which are never stale."""

from __future__ import annotations

import os
import shutil
import time

import orjson
import pytest

import memstore
from memstore.views import memory_view
from memstore.views.memory_view import Message, dedup_latest_facts, tool_fact, user_fact


def item(kind, **fields):
    return {"type": "item.completed", "item": {"id": fields.pop("id", kind), "type": kind, **fields}}


def session(root, sid, events, ts=None):
    with memstore.open_session(root, sid) as log:
        for event in events:
            log.append(event, ts=ts)
        return log.directory


def events(root, sid):
    with memstore.read_session(root, sid) as reader:
        return list(reader.iter_events())


def view_of(directory):
    return orjson.loads((directory / "derived" / "memory.json").read_bytes())


# --------------------------------------------------------------------------------------------
# Fact extraction (reference 6.2)


@pytest.mark.parametrize(
    "content, expected",
    [
        ('{"error": "boom", "summary": "x"}', None),
        ('{"success": false, "message": "nope"}', None),
        ('{"summary": "  Build   ok ", "message": "m"}', "Build ok"),
        ('{"message": null, "result": {"files": 3}}', '{"files":3}'),
        ('{"stdout": "hello\\nworld"}', "hello world"),
        ('{"path": "a.rs", "lines": 3}', '{"path":"a.rs","lines":3}'),
        ("[1, 2]", "[1,2]"),
        ("Command FAILED with code 1", None),
        ("permission Denied", None),
        ("request timeout", None),
        ("all  tests\tpassed", "all tests passed"),
        ("   ", None),
        ("x" * 200, "x" * 177 + "..."),
    ],
)
def test_tool_facts(content, expected):
    fact = tool_fact(content, "run")
    assert (fact["fact"] if fact else None) == expected
    if fact:
        assert fact["source"] == "tool:run"
    assert tool_fact("ok", None) == {"fact": "ok", "source": "tool:tool"}


@pytest.mark.parametrize(
    "content, expected",
    [
        ("My name is Ada", "My name is Ada"),
        ("please, can you  note that the API is v2", "the API is v2"),
        ("Please could you - i prefer tabs", "i prefer tabs"),
        ("could you, i prefer tabs", None),  # "could you," is not one of the polite openings
        ("VT Code, my timezone is UTC+2", "my timezone is UTC+2"),
        ("important: never push to main", "never push to main"),
        ("my pronouns are they/them", "my pronouns are they/them"),
        ("my preferred editor is helix", "my preferred editor is helix"),
        ("fix the build", None),
        ("please", None),
        ("note that ", None),
    ],
)
def test_user_facts(content, expected):
    fact = user_fact(content)
    assert (fact["fact"] if fact else None) == expected
    if fact:
        assert fact["source"] == "user_assertion"


def test_dedup_latest_facts_moves_a_reseen_fact_to_the_end_and_keeps_the_last_five():
    messages = [Message("tool", f"fact {n}", "t") for n in range(6)] + [
        Message("tool", "FACT  2", "t"),
        Message("assistant", "not a fact"),
        Message("user", "my name is Ada"),
    ]
    facts = [f["fact"] for f in dedup_latest_facts(messages)]
    assert facts == ["fact 3", "fact 4", "fact 5", "FACT 2", "my name is Ada"]
    assert [f["fact"] for f in dedup_latest_facts(messages, 2)] == ["FACT 2", "my name is Ada"]


# --------------------------------------------------------------------------------------------
# The view is the log's


def test_an_envelope_is_recorded_in_the_log_first_and_rebuilt_byte_for_byte(tmp_path):
    directory = session(tmp_path, "s", [{"type": "thread.started", "thread_id": "s"}], ts="2026-01-01T00:00:00Z")
    envelope = {
        "session_id": "s",
        "schema_version": 3,
        "summary": "We did things.",
        "objective": "ship it",
        "grounded_facts": [{"fact": "tests pass", "source": "tool:cargo"}],
        "touched_files": ["a.rs"],
        "constraints": ["no  unsafe", "No unsafe", "keep API"],
        "generated_at": "2026-05-05T10:00:00+02:00",
    }
    path = memstore.write_session_memory_view(tmp_path, "s", envelope)
    assert path == directory / "derived" / "memory.json"
    with memstore.read_session(tmp_path, "s") as reader:
        last = list(reader.iter_records())[-1]
    assert last.event == {"type": "memory.envelope", "envelope": envelope}
    assert last.ts == "2026-05-05T08:00:00.000Z"  # when it was produced
    view = view_of(directory)
    assert view["summary"] == "We did things." and view["objective"] == "ship it"
    assert view["grounded_facts"] == [{"fact": "tests pass", "source": "tool:cargo"}]
    assert view["constraints"] == ["No unsafe", "keep API"]
    assert view["generated_at"] == "2026-05-05T08:00:00.000Z"
    assert view["derived_from"] == {"events_through_seq": 2, "envelope_seq": 2}
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    before = path.read_bytes()
    shutil.rmtree(directory / "derived")
    shutil.rmtree(directory / "index")
    (directory / "manifest.json").unlink()
    memstore.rebuild(tmp_path, "s")
    memstore.write_session_memory_view(tmp_path, "s")
    assert path.read_bytes() == before


def test_an_envelope_is_never_dated_in_the_future_or_before_the_log(tmp_path):
    session(tmp_path, "s", [{"type": "thread.started", "thread_id": "s"}], ts="2026-06-01T00:00:00Z")
    memstore.write_session_memory_view(tmp_path, "s", {"summary": "a", "generated_at": "9999-01-01T00:00:00Z"})
    memstore.write_session_memory_view(tmp_path, "s", {"summary": "b", "generated_at": "2020-01-01T00:00:00Z"})
    memstore.write_session_memory_view(tmp_path, "s", {"summary": "c", "generated_at": "not a time"})
    with memstore.read_session(tmp_path, "s") as reader:
        times = [r.ts for r in reader.iter_records()]
    assert times == sorted(times) and times[-1] < "2100" and times[1] > "2026-06-01"


def test_regenerating_is_stable_over_time(tmp_path):
    directory = session(tmp_path, "s", [item("user_message", text="my name is Ada")])
    memstore.write_session_memory_view(tmp_path, "s")
    first = (directory / "derived" / "memory.json").read_bytes()
    time.sleep(0.01)
    memstore.write_session_memory_view(tmp_path, "s")
    assert (directory / "derived" / "memory.json").read_bytes() == first


def test_facts_files_objective_and_summary_come_from_the_log(tmp_path):
    events = [
        {"type": "thread.started", "thread_id": "s"},
        {"type": "turn.started"},
        item("user_message", text="Please fix the widget; my name is Ada"),
        item("user_message", text="my name is Ada"),
        item("tool_invocation", id="call-1", tool_name="read_file", status="completed"),
        item(
            "tool_output",
            id="call-1:out",
            call_id="call-1",
            output='{"summary": "widget.rs has 3 bugs"}',
            status="completed",
        ),
        item(
            "command_execution",
            command="cargo test",
            aggregated_output="error: 2 failed",
            exit_code=101,
            status="failed",
        ),
        item(
            "command_execution",
            command="cargo build",
            aggregated_output="Finished dev profile",
            exit_code=0,
            status="completed",
        ),
        item("mcp_tool_call", tool_name="docs.search", result="widgets are blue by default", status="completed"),
        item("tool_call", tool_name="Grep", output="3 matches", status="completed"),
        item("tool_call", tool_name="Grep", output="should not count", status="completed", is_error=True),
        item(
            "file_change",
            changes=[{"path": "src/widget.rs", "kind": "update"}, {"path": "src/lib.rs", "kind": "update"}],
            status="completed",
        ),
        item("file_change", changes=[{"path": "src/broken.rs", "kind": "add"}], status="failed"),
        item("file_change", changes=[{"path": "src/widget.rs", "kind": "update"}], status="completed"),
        item("agent_message", text="Fixed the widget."),
        {
            "type": "interjected",
            "source": "direct",
            "image_count": 0,
            "redirect_kind": "interjection",
            "text": "note that CI is slow",
        },
        {"type": "turn.completed", "usage": {}},
    ]
    directory = session(tmp_path, "s", events)
    memstore.write_session_memory_view(tmp_path, "s")
    view = view_of(directory)
    # "my name is Ada" (seen twice) and the first prompt's facts are older than the last five.
    assert view["grounded_facts"] == [
        {"fact": "widget.rs has 3 bugs", "source": "tool:read_file"},
        {"fact": "Finished dev profile", "source": "tool:command"},
        {"fact": "widgets are blue by default", "source": "tool:docs.search"},
        {"fact": "3 matches", "source": "tool:Grep"},
        {"fact": "CI is slow", "source": "user_assertion"},
    ]
    assert view["touched_files"] == ["src/lib.rs", "src/widget.rs"]
    assert view["objective"] == "Please fix the widget; my name is Ada"
    assert view["summary"].startswith(memory_view.SUMMARY_PREFIX)
    assert view["summary"].endswith("assistant: Fixed the widget. | user: note that CI is slow")
    assert view["session_id"] == "s" and view["schema_version"] == 3
    assert list(view) == [
        "session_id",
        "schema_version",
        "summary",
        "objective",
        "task_summary",
        "spec_summary",
        "evaluation_summary",
        "verification_summary",
        "constraints",
        "grounded_facts",
        "touched_files",
        "open_questions",
        "verification_todo",
        "delegation_notes",
        "pending_intents",
        "applied_intent_ids",
        "history_artifact_path",
        "generated_at",
        "derived_from",
    ]


def test_events_after_the_latest_envelope_merge_into_it(tmp_path):
    directory = session(tmp_path, "s", [item("user_message", text="my name is Bob")])
    prior = {
        "summary": "Earlier work.",
        "grounded_facts": [{"fact": f"old {n}", "source": "tool:x"} for n in range(4)] + ["a plain string is ignored"],
        "touched_files": ["a.rs"],
        "objective": "the goal",
        "pending_intents": [{"id": "i1", "text": "do x"}, {"id": 2, "text": "bad"}],
        "applied_intent_ids": ["a", "b", "a"],
    }
    memstore.write_session_memory_view(tmp_path, "s", prior)
    with memstore.open_session(tmp_path, "s") as log:
        log.append(item("user_message", text="i prefer spaces"))
        log.append(item("tool_call", tool_name="Read", output="old 1", status="completed"))
        log.append(
            item(
                "file_change",
                changes=[{"path": "b.rs", "kind": "add"}, {"path": "a.rs", "kind": "update"}],
                status="completed",
            )
        )
    memstore.write_session_memory_view(tmp_path, "s")
    view = view_of(directory)
    # "my name is Bob" came before the envelope, which stands for it (and did not keep it).
    assert [f["fact"] for f in view["grounded_facts"]] == ["old 0", "old 2", "old 3", "i prefer spaces", "old 1"]
    assert view["touched_files"] == ["b.rs", "a.rs"]
    assert view["summary"] == "Earlier work." and view["objective"] == "the goal"
    assert view["pending_intents"] == [{"id": "i1", "text": "do x"}]
    assert view["applied_intent_ids"] == ["b", "a"]
    assert view["derived_from"] == {"events_through_seq": 5, "envelope_seq": 2}


def test_an_empty_session_has_a_fallback_summary_and_no_clock_time(tmp_path):
    directory = tmp_path / "sessions" / "vt"
    directory.mkdir(parents=True)
    (directory / "events.jsonl").write_bytes(
        b'{"schema_version":"0.11.0","event":{"type":"thread.started","thread_id":"vt"}}\n'
    )
    memstore.write_session_memory_view(tmp_path, "vt")
    view = view_of(directory)
    assert view["summary"] == memory_view.FALLBACK_SUMMARY and view["grounded_facts"] == []
    assert view["generated_at"] == memory_view.EPOCH  # VT Code lines carry no time


def test_a_memory_json_memstore_did_not_write_is_adopted_into_the_log_not_lost(tmp_path):
    directory = session(tmp_path, "s", [{"type": "thread.started", "thread_id": "s"}])
    foreign = {
        "summary": "from VT Code's migration",
        "grounded_facts": [{"fact": "keep me", "source": "tool:x"}],
        "touched_files": [],
    }
    (directory / "derived" / "memory.json").write_bytes(orjson.dumps(foreign))
    memstore.write_session_memory_view(tmp_path, "s")
    envelopes = [e for e in events(tmp_path, "s") if e["type"] == "memory.envelope"]
    assert len(envelopes) == 1 and envelopes[0]["envelope"] == foreign
    assert envelopes[0]["source"]["file"] == "derived/memory.json"
    assert memstore.session_memory_facts(tmp_path, "s") == [{"fact": "keep me", "source": "tool:x"}]
    memstore.write_session_memory_view(tmp_path, "s")  # now it is memstore's: not adopted again
    assert [e["type"] for e in events(tmp_path, "s")].count("memory.envelope") == 1


def test_write_session_memory_view_refuses_what_it_cannot_do(tmp_path):
    with pytest.raises(memstore.SessionNotFound):
        memstore.write_session_memory_view(tmp_path, "missing")
    assert not (tmp_path / "sessions").exists()
    session(tmp_path, "s", [{"type": "thread.started", "thread_id": "s"}])
    with pytest.raises(memstore.InvalidEvent):
        memstore.write_session_memory_view(tmp_path, "s", ["not", "an", "object"])
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "sessions" / "link").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(memstore.UnsafePathError):
        memstore.write_session_memory_view(tmp_path, "link")
    assert os.listdir(tmp_path / "elsewhere") == []


def test_the_agent_holding_the_session_can_write_its_view(tmp_path):
    log = memstore.open_session(tmp_path, "s")
    log.append({"type": "turn.started"})
    memstore.write_session_memory_view(
        tmp_path, "s", {"summary": "mid-turn", "grounded_facts": [], "touched_files": []}
    )
    log.append({"type": "turn.completed", "usage": {}})
    assert log.turn_count == 1 and log.event_count == 3
    log.close()
    assert view_of(log.directory)["summary"] == "mid-turn"


# --------------------------------------------------------------------------------------------
# Readers


def write_view(root, sid, data, updated_at=None):
    directory = root / "sessions" / sid
    (directory / "derived").mkdir(parents=True, exist_ok=True)
    (directory / "derived" / "memory.json").write_bytes(data if isinstance(data, bytes) else orjson.dumps(data))
    if updated_at is not None:
        (directory / "manifest.json").write_bytes(
            orjson.dumps(
                {"session_id": sid, "turn_count": 1, "event_count": 2, "status": "completed", "updated_at": updated_at}
            )
        )
    return directory


def test_readers_accept_any_json_with_grounded_facts_and_tolerate_the_rest(tmp_path):
    write_view(
        tmp_path,
        "a",
        {"grounded_facts": [{"fact": "one"}, "plain string", {"fact": 2}, {"fact": "two", "source": "s"}]},
    )
    write_view(tmp_path, "broken", b'{"grounded_facts": [')
    write_view(tmp_path, "list", b"[]")
    assert memstore.session_memory_facts(tmp_path, "a") == [
        {"fact": "one", "source": None},
        {"fact": "two", "source": "s"},
    ]
    assert memstore.memory_facts_of(tmp_path / "sessions" / "a") == [
        {"fact": "one", "source": None, "index": 0},
        {"fact": "two", "source": "s", "index": 3},
    ]
    for sid in ("broken", "list", "missing"):
        assert memstore.session_memory_facts(tmp_path, sid) == []
    assert [f.fact for f in memstore.query_facts(tmp_path, None)] == ["one", "two"]


def test_query_facts_order_is_newest_session_first_then_file_order(tmp_path):
    write_view(tmp_path, "b-old", {"grounded_facts": [{"fact": "b1"}, {"fact": "b2"}]}, "2026-01-01T00:00:00Z")
    write_view(tmp_path, "a-new", {"grounded_facts": [{"fact": "a1"}]}, "2026-01-01T05:00:00+04:00")  # 01:00Z
    write_view(tmp_path, "c-none", {"grounded_facts": [{"fact": "c1"}]})
    write_view(tmp_path, "d-tie", {"grounded_facts": [{"fact": "d1"}]}, "2026-01-01T00:00:00.000Z")
    facts = memstore.query_facts(tmp_path, 10)
    assert [(f.session_id, f.fact) for f in facts] == [
        ("a-new", "a1"),
        ("b-old", "b1"),
        ("b-old", "b2"),
        ("d-tie", "d1"),
        ("c-none", "c1"),
    ]
    assert [f.fact for f in memstore.query_facts(tmp_path, 2)] == ["a1", "b1"]
    assert memstore.query_facts(tmp_path, 0) == []


def test_readers_are_never_stale(tmp_path):
    directory = write_view(tmp_path, "s", {"grounded_facts": [{"fact": "aaaa"}]}, "2026-01-01T00:00:00Z")
    assert [f.fact for f in memstore.query_facts(tmp_path, 10)] == ["aaaa"]
    # Same size, same second: replaced in place by another writer (a new inode when atomic).
    path = directory / "derived" / "memory.json"
    stat_before = path.stat()
    tmp = path.with_name("tmp")
    tmp.write_bytes(orjson.dumps({"grounded_facts": [{"fact": "bbbb"}]}))
    os.utime(tmp, ns=(stat_before.st_atime_ns, stat_before.st_mtime_ns))
    os.replace(tmp, path)
    assert [f.fact for f in memstore.query_facts(tmp_path, 10)] == ["bbbb"]
    assert memstore.session_memory_facts(tmp_path, "s") == [{"fact": "bbbb", "source": None}]
    path.unlink()
    assert memstore.query_facts(tmp_path, 10) == []


def test_recent_sessions_newest_first_by_parsed_time_and_never_stale(tmp_path):
    for sid, ts in (("a", "2026-01-01T00:00:00Z"), ("b", "2026-01-01T03:00:00+05:00"), ("c", "2026-01-02T00:00:00Z")):
        session(tmp_path, sid, [{"type": "thread.started", "thread_id": sid}], ts=ts)
    (tmp_path / "sessions" / "junk").mkdir()
    assert [s.session_id for s in memstore.recent_sessions(tmp_path, 10)] == ["c", "a", "b"]
    assert [s.session_id for s in memstore.recent_sessions(tmp_path, 1)] == ["c"]
    assert memstore.recent_sessions(tmp_path, 0) == []
    with memstore.open_session(tmp_path, "b") as log:
        log.append({"type": "turn.started"}, ts="2026-02-01T00:00:00Z")
    assert [s.session_id for s in memstore.recent_sessions(tmp_path, 10)] == ["b", "c", "a"]
    assert memstore.recent_sessions(tmp_path, 10)[0].event_count == 2
    with pytest.raises(ValueError):
        memstore.recent_sessions(tmp_path, -1)
    assert memstore.recent_sessions(tmp_path / "missing", 5) == []


def test_an_envelope_that_cannot_be_stored_appends_nothing(tmp_path):
    directory = session(tmp_path, "s", [{"type": "thread.started", "thread_id": "s"}])
    (directory / "derived" / "memory.json").write_bytes(b'{"grounded_facts": [{"fact": "foreign"}]}')
    before = (directory / "events.jsonl").read_bytes()
    with pytest.raises(memstore.InvalidEvent):
        memstore.write_session_memory_view(tmp_path, "s", {"summary": {1, 2}})  # a set is not JSON
    assert (directory / "events.jsonl").read_bytes() == before
