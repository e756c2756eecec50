"""The event log: the reference's log, manifest, index, permission and lock scenarios (section
4.1), its event_log unit scenarios (4.2), and memstore's own guarantees."""

from __future__ import annotations

import gc
import json
import os
import shutil
import sqlite3
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import orjson
import pytest

import memstore
from memstore import events as ev
from memstore.session.log import LogState, plan_cap_eviction
from memstore.session.manifest import Manifest

USAGE = {"input_tokens": 1200, "cached_input_tokens": 800, "cache_creation_tokens": 0, "output_tokens": 150}
THREAD_STARTED = {"type": "thread.started", "thread_id": "run-1"}
TURN_STARTED = {"type": "turn.started"}
TURN_COMPLETED = {"type": "turn.completed", "usage": USAGE}


def thread_completed(subtype="success", outcome="completed", num_turns=1):
    return {
        "type": "thread.completed",
        "thread_id": "run-1",
        "session_id": "run-1",
        "subtype": subtype,
        "outcome_code": outcome,
        "usage": USAGE,
        "total_cost_usd": 0.0123,
        "num_turns": num_turns,
    }


def sample_turn(log):
    """thread.started, turn.started, turn.completed, thread.completed (the reference's sample)."""
    for event in (THREAD_STARTED, TURN_STARTED, TURN_COMPLETED, thread_completed()):
        log.append(event)


def two_event_turn(log, text=None):
    log.append(TURN_STARTED)
    if text:
        log.append({"type": "item.completed", "item": {"id": "m", "type": "agent_message", "text": text}})
    log.append(TURN_COMPLETED)


def session_dir(root, sid="s"):
    return memstore.session_directory(root, sid)


def log_lines(root, sid="s"):
    data = (session_dir(root, sid) / "events.jsonl").read_bytes()
    return [line for line in data.split(b"\n") if line]


def db(root, sid="s"):
    return sqlite3.connect(session_dir(root, sid) / "index" / "session.db")


def types(events):
    return [e["type"] for e in events]


# --------------------------------------------------------------------------------------------
# Reference 4.1: the log, the manifest and the index


def test_append_and_reconstruct_roundtrip(tmp_path):
    with memstore.open_session(tmp_path, "s") as log:
        for _ in range(3):
            sample_turn(log)
        assert log.turn_count == 3
        assert log.reconstruct_turn(2) == [TURN_STARTED, TURN_COMPLETED]


def test_event_log_batches_appends_until_turn_boundary(tmp_path):
    log = memstore.open_session(tmp_path, "s")
    events_path = session_dir(tmp_path) / "events.jsonl"
    log.append(THREAD_STARTED)
    assert events_path.stat().st_size == 0
    log.append(TURN_STARTED)
    assert events_path.stat().st_size == 0
    log.append(TURN_COMPLETED)
    assert events_path.stat().st_size > 0
    assert len(log.reconstruct_turn(1)) == 2
    log.close()


def test_large_buffer_flush_persists_manifest_progress(tmp_path):
    log = memstore.open_session(tmp_path, "s")
    event = {"type": "thread.started", "thread_id": "x" * 40}
    for _ in range(1000):
        log.append(event)
    # Published from the background thread: the 64 KiB write point submitted it.
    log._writer.publisher.drain()
    manifest = json.loads((session_dir(tmp_path) / "manifest.json").read_text())
    assert 0 < manifest["event_count"] < 1000
    log.close()


def test_flushing_mid_turn_persists_buffered_metadata_for_reopen(tmp_path):
    log = memstore.open_session(tmp_path, "s")
    log.append(THREAD_STARTED)
    log.append(TURN_STARTED)
    log.flush()
    log.close()
    with memstore.open_session(tmp_path, "s") as log:
        assert log.event_count == 2
        assert log.turn_count == 0
        assert log.reconstruct_turn(1) == [TURN_STARTED]


def test_reopening_after_drop_scans_bytes_flushed_without_metadata(tmp_path):
    log = memstore.open_session(tmp_path, "s")
    log.append(THREAD_STARTED)
    del log
    gc.collect()
    assert not memstore.is_live(session_dir(tmp_path))
    assert len(log_lines(tmp_path)) == 1
    with memstore.open_session(tmp_path, "s") as log:
        assert log.event_count == 1


def test_reopening_mid_turn_preserves_state_for_completion(tmp_path):
    log = memstore.open_session(tmp_path, "s")
    log.append(TURN_STARTED)
    log.flush()
    log.close()
    assert json.loads((session_dir(tmp_path) / "manifest.json").read_text())["in_turn"] is True
    with memstore.open_session(tmp_path, "s") as log:
        log.append(TURN_COMPLETED)
        assert log.turn_count == 1
        assert len(log.reconstruct_turn(1)) == 2


def test_index_rebuilt_on_reopen(tmp_path):
    log = memstore.open_session(tmp_path, "s")
    sample_turn(log)
    log.complete()
    log.close()
    with memstore.open_session(tmp_path, "s") as log:
        assert log.turn_count == 1
        assert len(log.reconstruct_turn(1)) == 2
        assert log.manifest.status == "completed"


def test_manifest_shortcut_skips_scan_on_reopen(tmp_path, fault):
    with memstore.open_session(tmp_path, "s") as log:
        sample_turn(log)

    rescans = []
    fault.arm("recovery.rescan", lambda **context: rescans.append(context))
    with memstore.open_session(tmp_path, "s") as log:
        assert log.turn_count == 1
        assert log.manifest.status == "completed"
        assert len(log.reconstruct_turn(1)) == 2
    assert rescans == [], "a clean reopen must not rescan the log"
    memstore.rebuild(tmp_path, "s")
    assert len(rescans) == 1, "the patch must see a rescan when one happens"


def test_reopen_indexes_only_bytes_past_the_covered_offset(tmp_path, fault):
    with memstore.open_session(tmp_path, "s") as log:
        sample_turn(log)
    covered = db(tmp_path).execute("SELECT persisted_file_len FROM manifest").fetchone()[0]
    # Another writer (VT Code, say) appended one more turn without touching the index.
    with open(session_dir(tmp_path) / "events.jsonl", "ab") as fh:
        fh.write(b'{"schema_version":"0.18.0","event":{"type":"turn.started"}}\n')
        fh.write(b'{"schema_version":"0.18.0","event":{"type":"turn.completed","usage":{}}}\n')
    scanned_from = []
    fault.arm("recovery.scan", lambda start, **context: scanned_from.append(start))
    with memstore.open_session(tmp_path, "s") as log:
        assert scanned_from == [covered]
        assert log.turn_count == 2
        assert log.event_count == 6


def test_corrupt_manifest_falls_back_to_event_log_scan(tmp_path):
    with memstore.open_session(tmp_path, "s") as log:
        sample_turn(log)
    manifest_path = session_dir(tmp_path) / "manifest.json"
    manifest_path.write_text('{"broken"')
    with memstore.open_session(tmp_path, "s") as log:
        assert len(log.reconstruct_turn(1)) == 2
    assert json.loads(manifest_path.read_text())["turn_count"] == 1


def test_missing_or_corrupt_index_is_rebuilt(tmp_path):
    with memstore.open_session(tmp_path, "s") as log:
        sample_turn(log)
        sample_turn(log)
    index = session_dir(tmp_path) / "index" / "session.db"
    for side in index.parent.glob("session.db*"):
        side.unlink()
    index.write_bytes(b"this is not a database" * 100)
    with memstore.open_session(tmp_path, "s") as log:
        assert log.turn_count == 2
        assert [t.number for t in log.turns()] == [1, 2]
        assert log.reconstruct_turn(2) == [TURN_STARTED, TURN_COMPLETED]


def test_stale_turn_index_offsets_fall_back_to_event_log_scan(tmp_path):
    with memstore.open_session(tmp_path, "s") as log:
        sample_turn(log)
    with db(tmp_path) as conn:
        conn.execute("UPDATE turns SET end_offset = ?", (2**63 - 1,))
    with memstore.open_session(tmp_path, "s") as log:
        assert log.turn_count == 1
        assert log.reconstruct_turn(1) == [TURN_STARTED, TURN_COMPLETED]


@pytest.mark.parametrize("dropped_turn", [2, 1])
def test_current_manifest_rejects_a_stale_but_well_formed_turn_index(tmp_path, dropped_turn):
    with memstore.open_session(tmp_path, "s") as log:
        two_event_turn(log)
        two_event_turn(log)
    with db(tmp_path) as conn:
        conn.execute("DELETE FROM turns WHERE number = ?", (dropped_turn,))
    with memstore.open_session(tmp_path, "s") as log:
        assert log.turn_count == 2
        assert log.reconstruct_turn(1) == [TURN_STARTED, TURN_COMPLETED]
        assert log.reconstruct_turn(2) == [TURN_STARTED, TURN_COMPLETED]


def test_manifest_and_index_that_disagree_trigger_a_rescan(tmp_path):
    with memstore.open_session(tmp_path, "s") as log:
        two_event_turn(log)
        two_event_turn(log)
    path = session_dir(tmp_path) / "manifest.json"
    data = json.loads(path.read_text())
    data["turn_count"] = 7
    path.write_text(json.dumps(data))
    with memstore.open_session(tmp_path, "s") as log:
        assert log.turn_count == 2
    assert json.loads(path.read_text())["turn_count"] == 2


def _vtcode_line(event):
    return json.dumps({"schema_version": "0.11.0", "event": event}, separators=(",", ":")).encode() + b"\n"


def test_legacy_manifest_uses_valid_index_base_when_scanning(tmp_path):
    # A VT Code session whose log was cut to turn 3: an [S] manifest (no retained_turn_base, no
    # in_turn) and a rebased index/turns.json.
    d = session_dir(tmp_path)
    (d / "index").mkdir(parents=True)
    data = _vtcode_line(TURN_STARTED) + _vtcode_line(TURN_COMPLETED)
    (d / "events.jsonl").write_bytes(data)
    (d / "manifest.json").write_text(
        json.dumps(
            {
                "session_id": "s",
                "schema_version": 1,
                "created_at": "2026-09-01T10:00:00+00:00",
                "updated_at": "2026-09-01T10:00:00+00:00",
                "turn_count": 3,
                "event_count": 2,
                "status": "active",
            }
        )
    )
    (d / "index" / "turns.json").write_text(
        json.dumps(
            {
                "entries": [
                    {
                        "turn_number": 3,
                        "start_offset": 0,
                        "end_offset": len(data),
                        "event_count": 2,
                        "ts": "2026-09-01T10:00:00+00:00",
                    }
                ]
            }
        )
    )
    with memstore.open_session(tmp_path, "s") as log:
        assert log.turn_count == 3
        for missing in (1, 2):
            with pytest.raises(memstore.TurnNotFound):
                log.reconstruct_turn(missing)
        assert log.reconstruct_turn(3) == [TURN_STARTED, TURN_COMPLETED]
        assert log.manifest.created_at == "2026-09-01T10:00:00+00:00"


def test_vtcode_lines_without_seq_or_ts_are_accepted(tmp_path):
    d = session_dir(tmp_path)
    d.mkdir(parents=True)
    item = {
        "id": "tool_1",
        "type": "tool_invocation",
        "tool_name": "read_file",
        "arguments": {"path": "README.md"},
        "tool_call_id": "call_0",
        "status": "completed",
        "outcome": "success",
        "future_key": [1, 2],
    }
    lines = [
        THREAD_STARTED,
        TURN_STARTED,
        {"type": "item.completed", "item": item},
        {"type": "matrix.updated", "snapshot": {"x": 1}},
        TURN_COMPLETED,
    ]
    (d / "events.jsonl").write_bytes(b"".join(_vtcode_line(e) for e in lines))
    with memstore.open_session(tmp_path, "s") as log:
        assert list(log.iter_events()) == lines
        assert log.turn_count == 1
        seq = log.append(thread_completed())
        assert seq == 6  # VT Code lines carry no seq: they get 1-5 from their position
        records = list(log.iter_records())
        assert [r.seq for r in records] == [1, 2, 3, 4, 5, 6]  # every record has a seq
    memstore.rebuild(tmp_path, "s", refresh=False)  # derives event_details (else done when the agent rests)
    row = (
        db(tmp_path)
        .execute("SELECT name, status, turn FROM events JOIN event_details USING (seq) WHERE type = 'item.completed'")
        .fetchone()
    )
    assert row == ("read_file", "completed", 1)


def test_a_line_without_a_string_schema_version_is_skipped_as_vtcode_skips_it(tmp_path, caplog):
    """VT Code's envelope requires a string ``schema_version``; memstore's lines and VT Code's
    always carry one. A line without it (or with a number) is not a record for memstore either,
    so both count the same events and number the same turns: here VT Code sees two turns, and
    memstore must not make the unversioned turn.started a third. The line stays in the log (the
    scan warns about it), and a rebuild agrees with the open."""
    import vtcode_view

    d = session_dir(tmp_path)
    d.mkdir(parents=True)
    unversioned = json.dumps({"event": TURN_STARTED}).encode() + b"\n"
    numbered = (
        json.dumps(
            {
                "schema_version": 18,
                "event": {
                    "type": "item.completed",
                    "item": {"id": "x", "type": "agent_message", "text": "a number is not a version"},
                },
            }
        ).encode()
        + b"\n"
    )
    data = (
        _vtcode_line(TURN_STARTED)
        + _vtcode_line(TURN_COMPLETED)
        + unversioned
        + numbered
        + _vtcode_line(TURN_STARTED)
        + _vtcode_line(TURN_COMPLETED)
    )
    (d / "events.jsonl").write_bytes(data)
    vt = vtcode_view.open_view(d)
    assert (vt.numbers(), vt.turn_count, vt.event_count) == ([1, 2], 2, 4)
    with caplog.at_level("WARNING", logger="memstore"):
        with memstore.open_session(tmp_path, "s") as log:
            assert [t.number for t in log.turns()] == vt.numbers()
            assert (log.turn_count, log.event_count) == (vt.turn_count, vt.event_count)
            assert [r.seq for r in log.iter_records()] == [1, 2, 3, 4]
            assert log.reconstruct_turn(2) == [TURN_STARTED, TURN_COMPLETED]
    assert any("skipped 2 lines" in r.getMessage() for r in caplog.records)
    assert (d / "events.jsonl").read_bytes() == data  # kept, not cut
    assert memstore.rebuild(tmp_path, "s").event_count == 4
    assert not memstore.search_memory(tmp_path, "version")


def test_scan_fallback_when_manifest_missing(tmp_path):
    d = session_dir(tmp_path)
    d.mkdir(parents=True)
    (d / "events.jsonl").write_bytes(b"".join(_vtcode_line(e) for e in (TURN_STARTED, TURN_COMPLETED)))
    with memstore.open_session(tmp_path, "s") as log:
        assert log.turn_count == 1
        assert len(log.reconstruct_turn(1)) == 2


def test_scan_skips_malformed_lifecycle_payloads(tmp_path):
    d = session_dir(tmp_path)
    d.mkdir(parents=True)
    lines = [
        {"type": "thread.started", "thread_id": 123},
        {"type": "turn.started", "token_breakdown": "invalid"},
        {"type": "turn.completed", "usage": "invalid"},
        TURN_STARTED,
        TURN_COMPLETED,
    ]
    (d / "events.jsonl").write_bytes(b"".join(_vtcode_line(e) for e in lines) + b"not json\n")
    with memstore.open_session(tmp_path, "s") as log:
        assert log.event_count == 2
        assert log.turn_count == 1


def test_malformed_lifecycle_events_are_refused_on_append(tmp_path):
    with memstore.open_session(tmp_path, "s") as log:
        for bad in (
            {"type": "thread.started", "thread_id": 123},
            {"type": "turn.started", "token_breakdown": "invalid"},
            {"type": "turn.completed", "usage": "invalid"},
            {"type": "turn.completed"},
            {"type": "turn.failed"},
            {"type": "thread.completed", "thread_id": "t"},
        ):
            with pytest.raises(memstore.InvalidEvent):
                log.append(bad)
        assert log.event_count == 0
    assert log_lines(tmp_path) == []


@pytest.mark.parametrize(
    "bad",
    [
        "turn.started",
        ["type", "x"],
        {},
        {"type": 5},
        {"type": ""},
        {"type": "x", "payload": {1, 2}},
        {"type": "x", 1: "non-string key"},
        {"type": "x", "n": 2**70},
    ],
)
def test_invalid_events_raise_and_write_nothing(tmp_path, bad):
    with memstore.open_session(tmp_path, "s") as log:
        log.append(TURN_STARTED)
        with pytest.raises(memstore.InvalidEvent):
            log.append(bad)
        log.append(TURN_COMPLETED)
        assert log.event_count == 2
        assert log.reconstruct_turn(1) == [TURN_STARTED, TURN_COMPLETED]
    assert all(orjson.loads(line) for line in log_lines(tmp_path))


def test_envelope_seq_and_ts(tmp_path):
    with memstore.open_session(tmp_path, "s") as log:
        assert log.append(TURN_STARTED) == 1
        assert log.append({"type": "custom.kind", "extra": {"nested": True}}) == 2
    with memstore.open_session(tmp_path, "s") as log:
        assert log.append(TURN_COMPLETED) == 3
    envelopes = [orjson.loads(line) for line in log_lines(tmp_path)]
    assert [e["seq"] for e in envelopes] == [1, 2, 3]
    assert all(e["schema_version"] == ev.SCHEMA_VERSION for e in envelopes)
    assert envelopes[1]["event"] == {"type": "custom.kind", "extra": {"nested": True}}
    for e in envelopes:
        assert e["ts"].endswith("Z") and ev.parse_ts(e["ts"]) is not None
    assert list(envelopes[0]) == ["schema_version", "seq", "ts", "event"]


def test_seq_never_repeats_after_a_full_cap_rewrite_and_index_loss(tmp_path):
    with memstore.open_session(tmp_path, "s", max_events=2) as log:
        for _ in range(3):
            two_event_turn(log)
        last = log.append(TURN_STARTED)
    index = session_dir(tmp_path) / "index"
    for path in index.glob("session.db*"):
        path.unlink()
    (session_dir(tmp_path) / "manifest.json").unlink()
    with memstore.open_session(tmp_path, "s", max_events=2) as log:
        assert log.append(TURN_COMPLETED) == last + 1


def test_encoded_envelope_matches_compact_json(tmp_path):
    event = {
        "type": "item.completed",
        "item": {"id": "x", "type": "agent_message", "text": "naïve “quotes” \u0001 tab\t line\n / \\ 日本"},
    }
    line = ev.encode_record(7, "2026-11-30T08:30:29.123Z", event)
    expected = (
        json.dumps(
            {"schema_version": ev.SCHEMA_VERSION, "seq": 7, "ts": "2026-11-30T08:30:29.123Z", "event": event},
            separators=(",", ":"),
            ensure_ascii=False,
        ).encode()
        + b"\n"
    )
    assert line == expected


def test_turns_record_status_usage_and_interruptions(tmp_path):
    with memstore.open_session(tmp_path, "s") as log:
        log.append(TURN_STARTED)
        log.append(
            {
                "type": "item.completed",
                "item": {
                    "id": "c",
                    "type": "command_execution",
                    "command": "cargo test",
                    "aggregated_output": "boom",
                    "exit_code": 101,
                    "status": "failed",
                },
            }
        )
        log.append({"type": "turn.failed", "message": "tests failed", "usage": {"input_tokens": 5}})
        log.append(TURN_STARTED)
        log.append(TURN_STARTED)  # the previous turn never closed
        log.append(TURN_COMPLETED)
        log.append(TURN_STARTED)
        turns = log.turns()
    assert [(t.number, t.status, t.event_count) for t in turns] == [
        (1, "failed", 3),
        (2, "interrupted", 1),
        (3, "completed", 2),
        (4, "open", 1),
    ]
    assert turns[0].error == "tests failed" and turns[0].input_tokens == 5
    assert turns[2].input_tokens == 1200 and turns[2].output_tokens == 150
    assert turns[0].first_seq == 1 and turns[0].last_seq == 3
    memstore.rebuild(tmp_path, "s", refresh=False)  # derives event_details (else done when the agent rests)
    row = (
        db(tmp_path)
        .execute(
            "SELECT name, exit_code, status, item_type FROM events JOIN event_details USING (seq) "
            "WHERE type = 'item.completed'"
        )
        .fetchone()
    )
    assert row == ("cargo test", 101, "failed", "command_execution")


def test_unknown_turn_raises_turn_not_found(tmp_path):
    with memstore.open_session(tmp_path, "s") as log:
        sample_turn(log)
        with pytest.raises(memstore.TurnNotFound) as info:
            log.reconstruct_turn(9)
    assert info.value.turn == 9 and "9" in str(info.value)
    with memstore.open_session(tmp_path, "s") as log:
        for number in (0, -1, 2**63, 2**64):  # past SQLite's integers: still just not there
            with pytest.raises(memstore.TurnNotFound):
                log.reconstruct_turn(number)


# --------------------------------------------------------------------------------------------
# Cap rewrites


def test_cap_rewrite_keeps_event_log_appendable_and_reopenable(tmp_path):
    with memstore.open_session(tmp_path, "s", max_events=2) as log:
        two_event_turn(log)
        two_event_turn(log)
        assert len(log_lines(tmp_path)) == 2
        assert list((session_dir(tmp_path) / "derived").glob("eviction-summary-*.json"))
        assert log.reconstruct_turn(2) == [TURN_STARTED, TURN_COMPLETED]
        with pytest.raises(memstore.TurnNotFound):
            log.reconstruct_turn(1)
    with memstore.open_session(tmp_path, "s", max_events=2) as log:
        assert log.event_count == 2
        assert log.turn_count == 2
        two_event_turn(log)
        assert log.reconstruct_turn(3) == [TURN_STARTED, TURN_COMPLETED]
    assert not (session_dir(tmp_path) / "index" / "pending-cap-rewrite.json").exists()


def test_cap_eviction_summary_contains_bounded_grounded_facts(tmp_path):
    fact = "The canonical event recorded a grounded implementation fact."
    with memstore.open_session(tmp_path, "s", max_events=3) as log:
        two_event_turn(log, text=fact)
        log.append(TURN_STARTED)
    (summary_path,) = (session_dir(tmp_path) / "derived").glob("eviction-summary-*.json")
    assert len(summary_path.name) == len("eviction-summary-") + 32 + len(".json")
    summary = json.loads(summary_path.read_text())
    assert summary["grounded_facts"] == [fact]
    assert summary["evicted_event_count"] == 3
    assert summary["event_types"] == {"item.completed": 1, "turn.completed": 1, "turn.started": 1}
    assert summary["session_id"] == "s"
    assert stat.S_IMODE(summary_path.stat().st_mode) == 0o600


def test_eviction_summary_facts_are_bounded(tmp_path):
    with memstore.open_session(tmp_path, "s", max_events=8) as log:
        log.append(TURN_STARTED)
        for i in range(7):
            log.append(
                {
                    "type": "item.completed",
                    "item": {"id": str(i), "type": "agent_message", "text": f"fact {i}  " + "x" * 300},
                }
            )
        log.append(TURN_COMPLETED)
        log.append(TURN_STARTED)
    (summary_path,) = (session_dir(tmp_path) / "derived").glob("eviction-summary-*.json")
    facts = json.loads(summary_path.read_text())["grounded_facts"]
    assert len(facts) == 5
    assert facts[0].startswith("fact 2 x") and facts[-1].startswith("fact 6 x")
    assert all(len(f) == 180 and f.endswith("...") for f in facts)


def _vtcode_summary(n: int) -> dict:
    return {
        "session_id": "s",
        "evicted_event_count": 2 + n,
        "event_types": {"turn.completed": 1, "turn.started": 1},
        "created_at": f"2026-09-01T10:{n:02d}:00+00:00",
        "grounded_facts": [f"VT Code fact number {n}"],
    }


def test_eviction_summaries_vtcode_wrote_survive_memstore_cap_rewrites(tmp_path):
    """A session VT Code had already capped holds its summary files (15 here). memstore keeps
    only the newest ten files, but nothing a previous writer left is removed before its content
    is a line of eviction-summaries.jsonl (tagged with the file it came from); memstore's own
    files are removed only because their line was written first. A file that is not a summary
    (not a JSON object) is never removed. Every summary appears exactly once, however many
    rewrites follow."""
    d = session_dir(tmp_path)
    (d / "derived").mkdir(parents=True)
    vtcode = {}
    for n in range(15):
        path = d / "derived" / f"eviction-summary-{n:032x}.json"
        path.write_text(json.dumps(_vtcode_summary(n), indent=2))
        os.utime(path, (1_700_000_000 + n, 1_700_000_000 + n))  # older than anything memstore writes
        vtcode[path.name] = _vtcode_summary(n)
    broken = d / "derived" / f"eviction-summary-{99:032x}.json"
    broken.write_text("{ not json")
    os.utime(broken, (1_600_000_000, 1_600_000_000))
    with memstore.open_session(tmp_path, "s", max_events=6) as log:
        for n in range(30):
            two_event_turn(log, text=f"memstore fact {n}")
    names = sorted(p.name for p in (d / "derived").glob("eviction-summary-*.json"))
    lines = [json.loads(line) for line in (d / "derived" / "eviction-summaries.jsonl").read_bytes().splitlines()]
    carried = {
        line["carried_from"]: {k: v for k, v in line.items() if k != "carried_from"}
        for line in lines
        if "carried_from" in line
    }
    own = [line for line in lines if "carried_from" not in line]
    assert broken.name in names  # not a summary: left where it is
    assert len(names) == 11
    # Every VT Code summary is still a file, or (exactly once) a carried line with its content.
    for name, content in vtcode.items():
        on_disk = json.loads((d / "derived" / name).read_text()) if name in names else None
        assert (on_disk == content) != (carried.get(name) == content), name
    assert len(carried) == len([line for line in lines if "carried_from" in line])
    assert {line["writer"] for line in own} == {"memstore"} and len(own) >= 10
    # memstore's files kept are its newest; each has its line.
    for name in names:
        content = json.loads((d / "derived" / name).read_text()) if name != broken.name else None
        if content is not None and content.get("writer") == "memstore":
            assert content in own


def test_the_default_summary_equals_the_summary_of_the_evicted_events(tmp_path):
    """The cap's default summary takes its counts from the index and its facts from the raw lines
    of the evicted prefix: it must say exactly what ``write_eviction_summary`` says of the evicted
    events themselves, given as a hook: here with an agent message whose type is spelled with
    JSON escapes, messages repeated in other case, a tool output that mentions agent_message, an
    escaped control character, and lines that are not records (no schema_version, broken JSON)."""
    from memstore.session.summaries import EvictionSummary

    def line(event, version="0.18.0"):
        envelope = {"event": event} if version is None else {"schema_version": version, "event": event}
        return json.dumps(envelope, ensure_ascii=False).encode() + b"\n"

    def message(text):
        return {"type": "item.completed", "item": {"id": "m", "type": "agent_message", "text": text}}

    turn1 = [
        line(TURN_STARTED),
        line(message("Fixed   the build")),
        b'{"schema_version":"0.18.0","event":{"type":"item.completed","item":{"id":"e","type":'
        b'"\\u0061gent_message","text":"spelled with escapes \\u001b[0m"}}}\n',
        line({"type": "item.completed", "item": {"id": "t", "type": "tool_output", "output": "agent_message"}}),
        line(message("not a record"), version=None),
        b'{"schema_version": "0.18.0", "event": {"broken\n',
        line(message("FIXED THE BUILD")),
        line(TURN_COMPLETED),
    ]
    turn2 = (
        [line(TURN_STARTED)] + [line(message(f"fact {n} " + "word " * n)) for n in range(2)] + [line(TURN_COMPLETED)]
    )
    turn3 = [line(TURN_STARTED), line(message("kept")), line(TURN_COMPLETED)]
    data = b"".join(turn1 + turn2 + turn3)
    captured: list[list[dict]] = []
    for sid, hook in (("default", None), ("hooked", lambda d, s, events: captured.append(list(events)))):
        directory = session_dir(tmp_path, sid)
        directory.mkdir(parents=True)
        (directory / "events.jsonl").write_bytes(data)
        with memstore.open_session(tmp_path, sid, max_events=7, on_evict=hook) as log:
            log.append(TURN_STARTED)  # 13 records + 1: the cap evicts turns 1 (6 records) and 2 (4)
            assert log.manifest.retained_turn_base == 3
    (evicted,) = captured
    expected = EvictionSummary("default")
    for event in evicted:
        expected.add_event(event)
    lines = (session_dir(tmp_path, "default") / "derived" / "eviction-summaries.jsonl").read_bytes().splitlines()
    (written,) = [json.loads(line) for line in lines]
    want = expected.to_dict()
    for summary in (written, want):
        del summary["created_at"]
    assert written == want
    assert written["grounded_facts"] == ["spelled with escapes \u001b[0m", "FIXED THE BUILD", "fact 0", "fact 1 word"]
    assert written["evicted_event_count"] == 10


def test_an_interrupted_carry_of_an_old_summary_is_not_carried_twice(tmp_path, monkeypatch):
    """Carrying a file another writer left appends and syncs its line, then removes the file: a
    crash in between leaves both, and the next prune must remove the file without a second line."""
    from memstore.session import summaries

    derived = tmp_path / "derived"
    derived.mkdir()
    for n in range(12):
        path = derived / f"eviction-summary-{n:032x}.json"
        path.write_text(json.dumps(_vtcode_summary(n)))
        os.utime(path, (1_700_000_000 + n, 1_700_000_000 + n))
    real_unlink = os.unlink

    def crash_before_removal(path, *args, **kwargs):
        raise KeyboardInterrupt  # the process dies after the carry's sync, before any removal

    monkeypatch.setattr(summaries.os, "unlink", crash_before_removal)
    with pytest.raises(KeyboardInterrupt):
        summaries.prune_summary_files(derived)
    monkeypatch.setattr(summaries.os, "unlink", real_unlink)
    summaries.prune_summary_files(derived)
    lines = [json.loads(line) for line in (derived / "eviction-summaries.jsonl").read_bytes().splitlines()]
    assert sorted(line["carried_from"] for line in lines) == [f"eviction-summary-{n:032x}.json" for n in (0, 1)]
    assert len(list(derived.glob("eviction-summary-*.json"))) == 10


def test_cap_eviction_counts_session_records_removed_with_oldest_turn(tmp_path):
    with memstore.open_session(tmp_path, "s", max_events=2) as log:
        log.append(THREAD_STARTED)
        two_event_turn(log)
        two_event_turn(log)
        assert log.event_count == 2
        assert len(log_lines(tmp_path)) == 2
        with pytest.raises(memstore.TurnNotFound):
            log.reconstruct_turn(1)
        assert len(log.reconstruct_turn(2)) == 2


def test_cap_never_evicts_the_open_turn(tmp_path):
    with memstore.open_session(tmp_path, "s", max_events=3) as log:
        log.append(TURN_STARTED)
        for i in range(5):
            log.append({"type": "item.completed", "item": {"id": str(i), "type": "agent_message", "text": "x"}})
        assert log.event_count == 6
        log.append(TURN_COMPLETED)
        log.append(TURN_STARTED)
        # turn 1 (7 events) went; the open turn 2 stays even though the cap is 3
        assert log.event_count == 1
        assert [t.number for t in log.turns()] == [2]


def test_failed_eviction_summary_keeps_canonical_events(tmp_path):
    def failing_hook(session_dir, session_id, events):
        raise RuntimeError("summary store unavailable")

    log = memstore.open_session(tmp_path, "s", max_events=3, on_evict=failing_hook)
    two_event_turn(log)
    log.append(TURN_STARTED)
    with pytest.raises(memstore.CapEvictionError) as info:
        log.append(TURN_COMPLETED)
    assert "summary store unavailable" in str(info.value)
    assert len(log_lines(tmp_path)) == 4
    assert log.event_count == 4
    assert log.reconstruct_turn(1) == [TURN_STARTED, TURN_COMPLETED]
    log.close()


def _three_turns_then(tmp_path, mutate):
    with memstore.open_session(tmp_path, "s") as log:
        for _ in range(3):
            two_event_turn(log)
    path = session_dir(tmp_path) / "events.jsonl"
    mutate(path, path.read_bytes())


def test_scan_after_cap_rewrite_crash_preserves_retained_turn_ordinals(tmp_path):
    def cut_turn_one(path, data):
        first_turn = len(_first_lines(data, 2))
        path.write_bytes(data[first_turn:])

    _three_turns_then(tmp_path, cut_turn_one)
    with memstore.open_session(tmp_path, "s") as log:
        assert log.turn_count == 3
        with pytest.raises(memstore.TurnNotFound):
            log.reconstruct_turn(1)
        assert len(log.reconstruct_turn(2)) == 2
        assert len(log.reconstruct_turn(3)) == 2


def test_scan_after_full_cap_rewrite_crash_preserves_next_turn_ordinal(tmp_path):
    with memstore.open_session(tmp_path, "s") as log:
        two_event_turn(log)
    (session_dir(tmp_path) / "events.jsonl").write_bytes(b"")
    with memstore.open_session(tmp_path, "s") as log:
        assert log.turn_count == 1
        two_event_turn(log)
        assert [t.number for t in log.turns()] == [2]


def _first_lines(data: bytes, n: int) -> bytes:
    return b"".join(line + b"\n" for line in data.split(b"\n")[:n])


@pytest.mark.parametrize("index_state", ["missing", "invalid"])
def test_pending_cap_rewrite_recovers(tmp_path, index_state):
    with memstore.open_session(tmp_path, "s") as log:
        for _ in range(3):
            two_event_turn(log)
    d = session_dir(tmp_path)
    data = (d / "events.jsonl").read_bytes()
    rest = data[len(_first_lines(data, 2)) :]
    (d / "events.jsonl").write_bytes(rest)
    marker = d / "index" / "pending-cap-rewrite.json"
    marker.write_text(json.dumps({"previous_file_len": len(data), "new_file_len": len(rest), "retained_turn_base": 2}))
    for path in (d / "index").glob("session.db*"):
        path.unlink()
    if index_state == "invalid":
        (d / "index" / "session.db").write_bytes(b"\x00garbage" * 64)
    with memstore.open_session(tmp_path, "s") as log:
        assert [t.number for t in log.turns()] == [2, 3]
        assert log.turn_count == 3
    assert not marker.exists()


def test_stale_marker_is_removed_without_rescan(tmp_path):
    with memstore.open_session(tmp_path, "s") as log:
        two_event_turn(log)
    d = session_dir(tmp_path)
    size = (d / "events.jsonl").stat().st_size
    marker = d / "index" / "pending-cap-rewrite.json"
    # The crash came before the log was replaced: the marker does not match the file.
    marker.write_text(json.dumps({"previous_file_len": size, "new_file_len": 10, "retained_turn_base": 2}))
    with memstore.open_session(tmp_path, "s") as log:
        assert [t.number for t in log.turns()] == [1]
    assert not marker.exists()


# --------------------------------------------------------------------------------------------
# Handles, locks, permissions


def test_multiple_open_handles_share_turn_state_and_file_lock(tmp_path):
    a = memstore.open_session(tmp_path, "s")
    b = memstore.open_session(tmp_path, "s")
    two_event_turn(a)
    two_event_turn(b)
    assert a.turn_count == b.turn_count == 2
    assert a.reconstruct_turn(1) == b.reconstruct_turn(2) == [TURN_STARTED, TURN_COMPLETED]
    a.close()
    assert memstore.is_live(session_dir(tmp_path))  # b still holds the lock
    b.close()
    assert not memstore.is_live(session_dir(tmp_path))


def test_threads_appending_concurrently_keep_the_log_consistent(tmp_path):
    log = memstore.open_session(tmp_path, "s", max_events=0)

    def worker(n):
        for i in range(50):
            log.append({"type": "note", "worker": n, "i": i})

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    log.close()
    records = [orjson.loads(line) for line in log_lines(tmp_path)]
    assert [r["seq"] for r in records] == list(range(1, 201))
    for n in range(4):
        assert [r["event"]["i"] for r in records if r["event"]["worker"] == n] == list(range(50))


def test_liveness_probe_held_lock_reports_live_consistently(tmp_path):
    log = memstore.open_session(tmp_path, "s")
    d = session_dir(tmp_path)
    assert all(memstore.is_live(d) for _ in range(200))
    log.complete()
    assert memstore.is_live(d)
    del log
    gc.collect()
    assert not memstore.is_live(d)


def test_is_live_without_lock_file(tmp_path):
    assert not memstore.is_live(tmp_path / "nowhere")


CHILD_HOLDS_SESSION = """
import sys, time
sys.path.insert(0, {repo!r})
import memstore
log = memstore.open_session({root!r}, "s")
print("ready", flush=True)
sys.stdin.readline()
log.close()
"""


def test_another_process_holding_the_session(tmp_path):
    repo = str(Path(memstore.__file__).resolve().parent.parent)
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD_HOLDS_SESSION.format(repo=repo, root=str(tmp_path))],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout.readline().strip() == "ready"
        assert memstore.is_live(session_dir(tmp_path))
        with pytest.raises(memstore.SessionBusyError, match="session.lock"):
            memstore.open_session(tmp_path, "s")
        with pytest.raises(memstore.SessionBusyError):
            memstore.rebuild(tmp_path, "s")
    finally:
        child.communicate("\n", timeout=30)
    assert child.returncode == 0
    assert not memstore.is_live(session_dir(tmp_path))
    with memstore.open_session(tmp_path, "s") as log:
        log.append(TURN_STARTED)


def test_session_artifacts_use_private_permissions(tmp_path):
    with memstore.open_session(tmp_path, "s", max_events=2) as log:
        two_event_turn(log)
        two_event_turn(log)
    d = session_dir(tmp_path)
    for directory in (tmp_path / "sessions", d, d / "derived", d / "index"):
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700, directory
    files = [d / "events.jsonl", d / "manifest.json", d / "session.lock", d / "index" / "session.db"]
    files += list((d / "derived").glob("*.json"))
    for path in files:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path


def test_existing_directories_are_made_private(tmp_path):
    d = session_dir(tmp_path)
    d.mkdir(parents=True, mode=0o755)
    os.chmod(d, 0o755)
    with memstore.open_session(tmp_path, "s"):
        pass
    assert stat.S_IMODE(d.stat().st_mode) == 0o700


# --------------------------------------------------------------------------------------------
# Hostile ids and symlinks


@pytest.mark.parametrize(
    "sid, sanitized, prefix",
    [
        ("../outside", "_outside", "_outside~"),
        ("a/b\\c", "a_b_c", "a_b_c~"),
        ("...hidden", "hidden", "hidden~"),
        ("séance", "s_ance", "s_ance~"),
        ("ok-id_1.2", "ok-id_1.2", None),
    ],
)
def test_session_ids_map_to_directories_inside_the_store(tmp_path, sid, sanitized, prefix):
    assert memstore.sanitize_session_id(sid) == sanitized  # VT Code's sanitizer, unchanged
    with memstore.open_session(tmp_path, sid) as log:
        log.append(TURN_STARTED)
        assert log.directory.parent == tmp_path / "sessions"
        if prefix is None:
            assert log.directory.name == sid  # an id VT Code leaves unchanged keeps its directory
        else:
            assert log.directory.name.startswith(prefix) and len(log.directory.name) == len(prefix) + 24
        assert log.manifest.session_id == sid
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sessions"]


def test_symlinked_events_file_is_refused(tmp_path):
    outside = tmp_path / "outside.jsonl"
    outside.write_bytes(b"")
    d = session_dir(tmp_path)
    d.mkdir(parents=True)
    (d / "events.jsonl").symlink_to(outside)
    with pytest.raises(memstore.StoreIOError) as info:
        memstore.open_session(tmp_path, "s")
    assert "events.jsonl" in str(info.value) and "symlink" in str(info.value)
    assert outside.read_bytes() == b""


def test_symlinked_session_directory_is_refused(tmp_path):
    target = tmp_path / "elsewhere"
    target.mkdir()
    (tmp_path / "sessions").mkdir()
    (tmp_path / "sessions" / "s").symlink_to(target)
    with pytest.raises(memstore.UnsafePathError) as info:
        memstore.open_session(tmp_path, "s")
    assert str(tmp_path / "sessions" / "s") in str(info.value)
    assert list(target.iterdir()) == []


def test_symlinked_manifest_is_set_aside_and_written_anew_never_followed(tmp_path):
    """The manifest is a view of the log: a symlink in its place is neither followed nor a
    reason to refuse the session; it is kept beside it and the manifest is written anew."""
    with memstore.open_session(tmp_path, "s") as log:
        two_event_turn(log)
    d = session_dir(tmp_path)
    secret = tmp_path / "secret.json"
    secret.write_text("{}")
    (d / "manifest.json").unlink()
    (d / "manifest.json").symlink_to(secret)
    with memstore.open_session(tmp_path, "s") as log:
        assert log.event_count == 2
    assert not (d / "manifest.json").is_symlink()
    assert json.loads((d / "manifest.json").read_text())["event_count"] == 2
    (aside,) = [p for p in d.iterdir() if p.name.startswith("manifest.json.unusable-")]
    assert aside.is_symlink()
    assert secret.read_text() == "{}"


def test_store_root_behind_a_symlink_is_allowed(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    with memstore.open_session(tmp_path / "link", "s") as log:
        two_event_turn(log)
    assert (real / "sessions" / "s" / "events.jsonl").is_file()


# --------------------------------------------------------------------------------------------
# Torn tails


@pytest.mark.parametrize(
    "tail",
    [
        b'{"schema_version":"0.18.0","seq":9,"ts":"2026',  # a partial line
        b"\x00" * 4096,  # a run of NUL bytes (delayed allocation after a crash)
        b'{"schema_version":"0.18.0","se\x00\x00\x00\n\x00\x00',  # garbage lines, then NULs
        b"\xff\xfe garbage \n",  # a complete line that is not JSON
    ],
)
def test_torn_tail_is_cut_kept_and_never_welded(tmp_path, tail):
    with memstore.open_session(tmp_path, "s") as log:
        two_event_turn(log)
    d = session_dir(tmp_path)
    good = (d / "events.jsonl").read_bytes()
    with open(d / "events.jsonl", "ab") as fh:
        fh.write(tail)
    with memstore.open_session(tmp_path, "s") as log:
        assert (d / "events.jsonl").read_bytes() == good
        two_event_turn(log)
        assert log.turn_count == 2
    (kept,) = d.glob("events.jsonl.torn-*")
    assert kept.read_bytes() == tail
    assert kept.name.startswith(f"events.jsonl.torn-{len(good)}-")
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600
    assert all(orjson.loads(line) for line in log_lines(tmp_path))


def test_malformed_line_in_the_middle_is_skipped_not_cut(tmp_path):
    with memstore.open_session(tmp_path, "s") as log:
        two_event_turn(log)
    d = session_dir(tmp_path)
    with open(d / "events.jsonl", "ab") as fh:
        fh.write(b"this line is not json\n")
        fh.write(_vtcode_line(TURN_STARTED) + _vtcode_line(TURN_COMPLETED))
    size = (d / "events.jsonl").stat().st_size
    with memstore.open_session(tmp_path, "s") as log:
        assert log.turn_count == 2
        assert log.event_count == 4
    assert (d / "events.jsonl").stat().st_size == size
    assert not list(d.glob("events.jsonl.torn-*"))


# --------------------------------------------------------------------------------------------
# Durability policies and failures


def test_durability_event_writes_every_append(tmp_path):
    with memstore.open_session(tmp_path, "s", durability="event") as log:
        path = session_dir(tmp_path) / "events.jsonl"
        log.append(TURN_STARTED)
        first = path.stat().st_size
        assert first > 0
        log.append({"type": "note"})
        assert path.stat().st_size > first


def test_durability_none_still_writes_at_boundaries_and_indexes_on_read(tmp_path):
    with memstore.open_session(tmp_path, "s", durability="none") as log:
        path = session_dir(tmp_path) / "events.jsonl"
        log.append(TURN_STARTED)
        assert path.stat().st_size == 0
        log.append(TURN_COMPLETED)
        assert path.stat().st_size > 0
        assert [t.number for t in log.turns()] == [1]


def test_invalid_durability_and_cap_are_rejected(tmp_path):
    with pytest.raises(ValueError):
        memstore.open_session(tmp_path, "s", durability="sometimes")
    with pytest.raises(ValueError):
        memstore.open_session(tmp_path, "s", max_events=-1)


def test_failed_fsync_fails_the_handle_closed(tmp_path, monkeypatch):
    log = memstore.open_session(tmp_path, "s")
    two_event_turn(log)

    def broken_fdatasync(fd):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fdatasync", broken_fdatasync)
    log.append(TURN_STARTED)
    with pytest.raises(memstore.StoreIOError) as info:
        log.append(TURN_COMPLETED)
    assert "events.jsonl" in str(info.value) and "fdatasync" in str(info.value)
    monkeypatch.undo()
    assert log.failed
    with pytest.raises(memstore.LogFailedError):
        log.append(TURN_STARTED)
    with pytest.raises(memstore.LogFailedError):
        log.flush()
    log.close()
    with memstore.open_session(tmp_path, "s") as log:
        # The log is valid: every line parses; the first turn is intact.
        assert log.reconstruct_turn(1) == [TURN_STARTED, TURN_COMPLETED]
        assert not log.failed


CHILD_FILE_SIZE_LIMIT = """
import resource, signal, sys
sys.path.insert(0, {repo!r})
import memstore
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
log = memstore.open_session({root!r}, "s")
log.append({{"type": "turn.started"}})
log.append({{"type": "turn.completed", "usage": {{}}}})
size = log.events_path.stat().st_size
# The file may grow by 100 bytes more: the next turn's write is cut short (EFBIG).
resource.setrlimit(resource.RLIMIT_FSIZE, (size + 100, size + 100))
log.append({{"type": "turn.started"}})
log.append({{"type": "item.completed", "item": {{"id": "o", "type": "agent_message", "text": "x" * 500}}}})
try:
    log.append({{"type": "turn.completed", "usage": {{}}}})
except memstore.StoreIOError as exc:
    print("write-error", exc.path, exc.op)
try:
    log.append({{"type": "turn.started"}})
except memstore.LogFailedError:
    print("failed-closed")
print("size", log.events_path.stat().st_size, size)
"""


def test_short_write_on_a_full_file_truncates_back_and_fails_closed(tmp_path):
    repo = str(Path(memstore.__file__).resolve().parent.parent)
    out = subprocess.run(
        [sys.executable, "-c", CHILD_FILE_SIZE_LIMIT.format(repo=repo, root=str(tmp_path))],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("write-error ") and lines[0].endswith("events.jsonl write")
    assert lines[1] == "failed-closed"
    size_now, size_before = map(int, lines[2].split()[1:])
    assert size_now == size_before  # the partial write was cut back
    with memstore.open_session(tmp_path, "s") as log:
        assert log.turn_count == 1 and log.event_count == 2
        assert not list(session_dir(tmp_path).glob("events.jsonl.torn-*"))


def test_closed_handle_refuses_use(tmp_path):
    log = memstore.open_session(tmp_path, "s")
    log.close()
    log.close()  # idempotent
    with pytest.raises(memstore.SessionClosedError):
        log.append(TURN_STARTED)


# --------------------------------------------------------------------------------------------
# Rebuild


def test_rebuild_regenerates_index_and_manifest_from_the_log(tmp_path):
    with memstore.open_session(tmp_path, "s") as log:
        sample_turn(log)
        two_event_turn(log)
    d = session_dir(tmp_path)
    before = db(tmp_path).execute("SELECT * FROM turns ORDER BY number").fetchall()
    for path in (d / "index").glob("session.db*"):
        path.unlink()
    (d / "manifest.json").unlink()
    manifest = memstore.rebuild(tmp_path, "s")
    assert (manifest.turn_count, manifest.event_count, manifest.status) == (2, 6, "active")
    assert db(tmp_path).execute("SELECT * FROM turns ORDER BY number").fetchall() == before
    assert json.loads((d / "manifest.json").read_text())["event_count"] == 6


def test_rebuild_of_a_session_open_in_this_process(tmp_path):
    with memstore.open_session(tmp_path, "s") as log:
        two_event_turn(log)
        log.append(TURN_STARTED)
        manifest = memstore.rebuild(tmp_path, "s")
        assert manifest.event_count == 3 and manifest.in_turn
        log.append(TURN_COMPLETED)
        assert log.turn_count == 2


def test_rebuild_of_a_missing_session_names_the_path(tmp_path):
    with pytest.raises(memstore.StoreIOError) as info:
        memstore.rebuild(tmp_path, "nope")
    assert str(tmp_path / "sessions" / "nope") in str(info.value)


# --------------------------------------------------------------------------------------------
# Reference 4.2: the state machine and cap planning


def _state():
    return LogState(Manifest(session_id="s"))


def test_lifecycle_kinds():
    for kind in ("thread.started", "thread.completed", "turn.started", "turn.completed", "turn.failed"):
        assert kind in ev.LIFECYCLE_KINDS
    assert "tool.called" not in ev.LIFECYCLE_KINDS
    assert "turn.blocked" not in ev.LIFECYCLE_KINDS


def test_turn_started_pushes_entry_and_forces_active():
    state = _state()
    state.apply("thread.completed", thread_completed(), 0, 10, 1, None)
    assert state.manifest.status == "completed"
    boundary, turn = state.apply("turn.started", TURN_STARTED, 10, 20, 2, None)
    assert (boundary, turn) == (False, 1)
    t = state.open_turn
    assert (t.number, t.start_offset, t.end_offset, t.event_count) == (1, 10, 20, 1)
    assert state.manifest.status == "active" and state.manifest.in_turn
    state.apply("item.completed", {"type": "item.completed"}, 20, 35, 3, None)
    assert (t.end_offset, t.event_count) == (35, 2)


@pytest.mark.parametrize("closing", [TURN_COMPLETED, {"type": "turn.failed", "message": "x"}])
def test_turn_close_is_a_boundary_and_keeps_status_active(closing):
    state = _state()
    state.apply("turn.started", TURN_STARTED, 0, 10, 1, None)
    assert state.apply(closing["type"], closing, 10, 20, 2, None) == (True, 1)
    assert state.manifest.status == "active"
    assert state.manifest.turn_count == 1 and not state.manifest.in_turn
    assert state.apply("thread.completed", thread_completed(), 20, 30, 3, None) == (True, None)
    assert state.manifest.status == "completed"


def test_turn_completed_without_start_is_a_boundary_and_a_noop():
    state = _state()
    assert state.apply("turn.completed", TURN_COMPLETED, 0, 10, 1, None) == (True, None)
    assert state.manifest.turn_count == 0 and state.dirty == {}
    assert state.manifest.event_count == 1


def test_ordinals_run_one_to_three():
    state = _state()
    pos = 0
    for _ in range(3):
        state.apply("turn.started", TURN_STARTED, pos, pos + 10, None, None)
        state.apply("turn.completed", TURN_COMPLETED, pos + 10, pos + 20, None, None)
        pos += 20
    assert sorted(state.dirty) == [1, 2, 3]
    assert state.manifest.turn_count == 3


def _spans(n_turns, per_turn, size=10):
    spans = []
    pos = 0
    for number in range(1, n_turns + 1):
        spans.append((number, pos, pos + per_turn * size, per_turn))
        pos += per_turn * size
    return spans


def test_cap_planning():
    assert plan_cap_eviction(_spans(5, 2), 10, 10) is None
    assert plan_cap_eviction(_spans(5, 2), 10, 0) is None
    plan = plan_cap_eviction(_spans(5, 2), 10, 6)
    assert (plan.truncate_offset, plan.evicted_events, plan.evicted_turns, plan.first_kept_turn) == (40, 4, 2, 3)
    plan = plan_cap_eviction(_spans(3, 5), 15, 3)
    assert (plan.evicted_events, plan.evicted_turns, plan.first_kept_turn) == (15, 3, None)
    # The open turn is never evicted.
    plan = plan_cap_eviction(_spans(3, 5), 15, 3, open_turn=3)
    assert (plan.evicted_events, plan.first_kept_turn) == (10, 3)
    assert plan_cap_eviction(_spans(1, 5), 5, 3, open_turn=1) is None


def test_parse_ts_accepts_reference_formats():
    for text in (
        "2026-09-01T10:00:00Z",
        "2026-09-01T10:00:00+00:00",
        "2026-09-01T10:00:00.123456789+00:00",
        "2026-11-30T08:30:29.123Z",
    ):
        assert ev.parse_ts(text) is not None, text
    assert ev.parse_ts("yesterday") is None
    assert ev.parse_ts(None) is None


def test_index_missing_event_rows_is_rebuilt(tmp_path):
    with memstore.open_session(tmp_path, "s") as log:
        sample_turn(log)
        two_event_turn(log)
    with db(tmp_path) as conn:
        conn.execute("DELETE FROM events WHERE seq = 3")  # an interior row
    with memstore.open_session(tmp_path, "s") as log:
        assert log.event_count == 6
    assert db(tmp_path).execute("SELECT count(*) FROM events").fetchone()[0] == 6


def test_index_of_a_replaced_log_is_rebuilt(tmp_path):
    with memstore.open_session(tmp_path, "s") as log:
        two_event_turn(log)
    path = session_dir(tmp_path) / "events.jsonl"
    # Same length, different bytes: the index describes another log.
    data = path.read_bytes().replace(b'"turn.completed"', b'"turn.xompleted"')
    path.write_bytes(data)
    with memstore.open_session(tmp_path, "s") as log:
        assert log.turn_count == 0 and log.manifest.in_turn
        assert [t.status for t in log.turns()] == ["open"]


def test_concurrent_opens_and_closes_from_threads(tmp_path):
    errors = []

    def worker(n):
        try:
            for i in range(20):
                with memstore.open_session(tmp_path, "s") as log:
                    log.append({"type": "note", "worker": n, "i": i})
        except Exception as exc:  # collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    with memstore.open_session(tmp_path, "s") as log:
        assert log.event_count == 80
    assert not memstore.is_live(session_dir(tmp_path))


def test_rebuild_from_the_log_alone_keeps_ordinals_after_a_cap_rewrite(tmp_path):
    with memstore.open_session(tmp_path, "s", max_events=4) as log:
        for _ in range(4):
            two_event_turn(log)
        assert [t.number for t in log.turns()] == [3, 4]
    d = session_dir(tmp_path)
    for path in (d / "index").glob("session.db*"):
        path.unlink()
    (d / "manifest.json").unlink()
    manifest = memstore.rebuild(tmp_path, "s")
    assert (manifest.retained_turn_base, manifest.turn_count, manifest.next_seq) == (3, 4, 9)
    with memstore.open_session(tmp_path, "s", max_events=0) as log:
        assert [t.number for t in log.turns()] == [3, 4]
        assert log.append(TURN_STARTED) == 9


def test_a_session_at_its_cap_does_not_rewrite_the_log_every_turn(tmp_path):
    from memstore.session.log import cap_low_water

    assert [cap_low_water(n) for n in (1, 2, 9, 10, 100, 10_000)] == [1, 2, 9, 9, 90, 9_000]
    counts = []
    with memstore.open_session(tmp_path, "s", max_events=100) as log:
        for _ in range(60):
            log.append(TURN_STARTED)
            for i in range(8):
                log.append({"type": "note", "i": i})
            log.append(TURN_COMPLETED)
            counts.append(log.event_count)
        assert [t.number for t in log.turns()][-1] == 60
    assert max(counts) <= 100
    rewrites = len((session_dir(tmp_path) / "derived" / "eviction-summaries.jsonl").read_bytes().splitlines())
    # Only the newest summary files are kept; every summary is a line of the JSON Lines file.
    assert len(list((session_dir(tmp_path) / "derived").glob("eviction-summary-*.json"))) == 10
    # 50 turns past the cap: VT Code would rewrite 50 times, memstore every ~2 turns of headroom.
    assert 20 <= rewrites <= 26, rewrites


def test_a_failed_index_transaction_is_retried_without_losing_turns(tmp_path, fault):
    log = memstore.open_session(tmp_path, "s")
    log.append(TURN_STARTED)
    log.flush()
    calls = []

    def failing_once(path):
        calls.append(1)
        if len(calls) == 1:
            raise memstore.StoreIOError("update index", path, "database or disk is full")

    fault.arm("index.commit", failing_once)
    log.append(TURN_COMPLETED)  # logged and synced; the index (off the agent's path) misses it
    with pytest.raises(memstore.StoreIOError, match="disk is full"):
        log.flush()  # which the next flush reports
    assert calls and not log.failed  # the log is fine: appends go on
    two_event_turn(log)
    assert [(t.number, t.status) for t in log.turns()] == [(1, "completed"), (2, "completed")]
    log.close()
    before = db(tmp_path).execute("SELECT * FROM turns ORDER BY number").fetchall()
    memstore.rebuild(tmp_path, "s")
    assert db(tmp_path).execute("SELECT * FROM turns ORDER BY number").fetchall() == before


def test_bulk_mode_publishes_the_manifest_on_flush_not_per_batch(tmp_path):
    log = memstore.open_session(tmp_path, "s", durability="none", max_events=0)
    path = session_dir(tmp_path) / "manifest.json"
    for _ in range(300):
        log.append(TURN_STARTED)
        log.append({"type": "note", "text": "x" * 4000})
        log.append(TURN_COMPLETED)
    log._writer.publisher.drain()
    assert json.loads(path.read_text())["event_count"] == 0  # indexed in batches, not published
    assert db(tmp_path).execute("SELECT event_count FROM manifest").fetchone()[0] > 0
    log.flush()
    assert json.loads(path.read_text())["event_count"] == 900
    log.close()


def test_an_index_failure_after_the_cap_rewrite_is_retried_and_the_marker_waits_for_it(tmp_path, fault):
    """The cap rewrite's index update runs off the agent's thread, after the log was replaced:
    its failure does not fail the append (the event is in the rewritten log) but the next flush
    reports it, and the rewrite's marker stays until the index and manifest.json describing the
    rewritten log are durable. Once the index works again nothing is lost; a writer that closes
    while it still fails leaves the marker, and the next open finishes the rewrite."""

    def broken_evict(path):
        raise memstore.StoreIOError("update index", path, "I/O error")

    marker = session_dir(tmp_path) / "index" / "pending-cap-rewrite.json"
    for closes_while_failing in (False, True):
        sid = f"s{int(closes_while_failing)}"
        log = memstore.open_session(tmp_path, sid, max_events=4)
        two_event_turn(log)
        two_event_turn(log)
        fault.arm("index.evict", broken_evict)
        log.append(TURN_STARTED)  # the fifth event: turn 1 is evicted from the log, the index fails
        assert not log.failed
        marker = session_dir(tmp_path, sid) / "index" / "pending-cap-rewrite.json"
        with pytest.raises(memstore.StoreIOError, match="I/O error"):
            log.flush()
        assert marker.exists()
        if closes_while_failing:
            with pytest.raises(memstore.StoreIOError, match="I/O error"):
                log.close()
            fault.disarm("index.evict")
        else:
            fault.disarm("index.evict")
            log.flush()
            assert not marker.exists()
            assert [(t.number, t.status) for t in log.turns()] == [(2, "completed"), (3, "open")]
            log.close()
        with memstore.open_session(tmp_path, sid, max_events=4) as log:
            assert [(t.number, t.status) for t in log.turns()] == [(2, "completed"), (3, "open")]
            assert log.event_count == 3 and log.turn_count == 2
        assert not marker.exists()
        assert rebuilt_turns(tmp_path, sid) == [(2, "completed"), (3, "open")]


def rebuilt_turns(root, sid):
    """The turns of the session after a rebuild from its log."""
    memstore.rebuild(root, sid, refresh=False)
    with memstore.open_session(root, sid, max_events=0) as log:
        return [(t.number, t.status) for t in log.turns()]


def test_cap_rewrite_tags_the_first_retained_line_and_keeps_its_event_bytes(tmp_path):
    with memstore.open_session(tmp_path, "s", max_events=6, durability="none") as log:
        for _ in range(3):
            two_event_turn(log)
        original = log_lines(tmp_path)
        assert len(original) == 6
        log.append(TURN_STARTED)  # 7 events > 6: turn 1 goes
        lines = log_lines(tmp_path)
        assert json.loads(lines[0])["retained_turn_base"] == 2
        assert lines[0] == b'{"retained_turn_base":2,' + original[2][1:]
        assert lines[1:4] == original[3:] and len(lines) == 5
        for _ in range(3):
            two_event_turn(log)  # more rewrites: the tag moves, never doubles
        first = log_lines(tmp_path)[0]
        assert first.count(b"retained_turn_base") == 1
        assert json.loads(first)["retained_turn_base"] == log.turns()[0].number
        assert [e["type"] for e in log.iter_events()][:2] == ["turn.started", "turn.completed"]
    before = db(tmp_path).execute("SELECT * FROM events ORDER BY seq").fetchall()
    memstore.rebuild(tmp_path, "s")
    after = db(tmp_path).execute("SELECT * FROM events ORDER BY seq").fetchall()
    assert [row[1:] for row in after] == [row[1:] for row in before]


def test_the_first_append_to_an_emptied_log_carries_the_turn_base(tmp_path):
    with memstore.open_session(tmp_path, "s", max_events=2) as log:
        two_event_turn(log)
        log.append(TURN_STARTED)  # 3 > 2: turn 1 goes; the log keeps only this line
        assert json.loads(log_lines(tmp_path)[0])["retained_turn_base"] == 2
    with memstore.open_session(tmp_path, "s", max_events=2) as log:
        log.append(TURN_COMPLETED)
        log.append(TURN_STARTED)  # turn 2 goes; the log is empty until the next write
        log.flush()
    lines = log_lines(tmp_path)
    assert json.loads(lines[0])["retained_turn_base"] == 3


def test_rebuild_from_the_log_alone_takes_its_times_from_the_log(tmp_path):
    with memstore.open_session(tmp_path, "s") as log:
        two_event_turn(log)
        two_event_turn(log)
    envelopes = [orjson.loads(line) for line in log_lines(tmp_path)]
    d = session_dir(tmp_path)
    for path in (d / "index").glob("session.db*"):
        path.unlink()
    (d / "manifest.json").unlink()
    manifest = memstore.rebuild(tmp_path, "s")
    assert (manifest.created_at, manifest.updated_at) == (envelopes[0]["ts"], envelopes[-1]["ts"])


def test_rebuild_never_moves_updated_at_backwards(tmp_path):
    with memstore.open_session(tmp_path, "s") as log:
        two_event_turn(log)
        time.sleep(0.01)
        log.complete()
        completed_at = log.manifest.updated_at
    assert memstore.rebuild(tmp_path, "s").updated_at == completed_at


def test_a_time_in_the_future_does_not_date_the_session_in_the_future(tmp_path):
    """A caller's wrong clock (or a hand-written line) would keep the session "recent" for good,
    out of retention's reach: its envelope keeps the time, the session's times stop at the
    present, on append and on rebuild alike."""
    with memstore.open_session(tmp_path, "s") as log:
        log.append({"type": "thread.started", "thread_id": "s"}, ts="2999-01-01T00:00:00Z")
        log.append({"type": "turn.started"}, ts="2020-01-01T00:00:00Z")
        log.append({"type": "turn.completed", "usage": {}}, ts="2020-01-01T00:00:01Z")
        now = memstore.events.utc_now()
        assert log.manifest.created_at <= now and log.manifest.updated_at <= now
        assert next(log.iter_records()).ts == "2999-01-01T00:00:00.000Z"
    for manifest in (memstore.rebuild(tmp_path, "s"), memstore.list_sessions(tmp_path)[0]):
        assert manifest.updated_at <= memstore.events.utc_now()
    (tmp_path / "sessions" / "s" / "manifest.json").unlink()
    shutil.rmtree(tmp_path / "sessions" / "s" / "index")
    assert memstore.rebuild(tmp_path, "s").created_at <= memstore.events.utc_now()


def test_append_takes_the_source_time_in_memstores_format(tmp_path):
    with memstore.open_session(tmp_path, "imported") as log:
        log.append({"type": "turn.started"}, ts="2025-09-25T15:12:14.5+02:00")
        log.append({"type": "turn.completed", "usage": {}}, ts="0999-01-02T03:04:05Z")
        with pytest.raises(memstore.InvalidEvent, match="RFC 3339"):
            log.append({"type": "x"}, ts="yesterday")
        with pytest.raises(memstore.InvalidEvent):
            log.append({"type": "x"}, ts="0001-01-01T00:00:00+01:00")  # before year 1 in UTC
    records = list(memstore.open_session(tmp_path, "imported").iter_records())
    assert [r.ts for r in records] == ["2025-09-25T13:12:14.500Z", "0999-01-02T03:04:05.000Z"]


def test_turn_aborted_closes_the_turn_as_aborted(tmp_path):
    with memstore.open_session(tmp_path, "s") as log:
        log.append({"type": "turn.started"})
        log.append({"type": "item.completed", "item": {"id": "m", "type": "agent_message", "text": "working"}})
        log.append({"type": "turn.aborted", "reason": "interrupted", "usage": {"input_tokens": 5, "output_tokens": 1}})
        with pytest.raises(memstore.InvalidEvent):
            log.append({"type": "turn.aborted", "reason": 3})
        turns = log.turns()
    assert log.turn_count == 1
    assert [(t.status, t.error, t.event_count, t.input_tokens) for t in turns] == [("aborted", "interrupted", 3, 5)]
    assert memstore.rebuild(tmp_path, "s").turn_count == 1


def test_turn_aborted_is_numbered_differently_by_vtcode_as_documented(tmp_path):
    """docs/vtcode.md: VT Code does not know ``turn.aborted``; the aborted turn stays open for it,
    so the next turn gets the same number and later ones are one lower. memstore numbers them
    1, 2, 3; VT Code's open of the same directory numbers them 1, 1, 2."""
    import vtcode_view

    with memstore.open_session(tmp_path, "s") as log:
        for closing in ({"type": "turn.aborted", "reason": "interrupted"}, TURN_COMPLETED, TURN_COMPLETED):
            log.append(TURN_STARTED)
            log.append(closing)
        assert [t.number for t in log.turns()] == [1, 2, 3]
    assert vtcode_view.open_view(session_dir(tmp_path)).numbers() == [1, 1, 2]


def test_a_rebuild_brings_a_future_updated_at_from_older_metadata_back_to_the_present(tmp_path):
    """A session dated in the future before that was refused (by an older memstore, or VT Code's
    manifest) keeps that date in manifest.json and the index. A rebuild takes what the log
    cannot record from the old metadata, but a time in the future must stop at the present, or
    the session stays out of retention's reach for good."""
    with memstore.open_session(tmp_path, "s") as log:
        log.append({"type": "thread.started", "thread_id": "s"}, ts="2999-01-01T00:00:00Z")
        log.append({"type": "turn.started"})
        log.append({"type": "turn.completed", "usage": {}})
        directory = log.directory
    manifest = json.loads((directory / "manifest.json").read_bytes())
    manifest["created_at"] = manifest["updated_at"] = "2999-01-01T00:00:00.000Z"
    (directory / "manifest.json").write_text(json.dumps(manifest))
    rebuilt = memstore.rebuild(tmp_path, "s")
    now = memstore.events.utc_now()
    assert rebuilt.created_at <= now and rebuilt.updated_at <= now
    assert memstore.list_sessions(tmp_path)[0].updated_at <= now
