"""The write path under attack: hostile values in events, logs and metadata; errors that say
whether the event is already in the log; a failing eviction hook; the registry under I/O."""

from __future__ import annotations

import json
import os
import shutil
import threading
import time

import pytest
from support import TURN_COMPLETED, TURN_STARTED

import memstore


def log_lines(root, sid="s"):
    return (memstore.session_directory(root, sid) / "events.jsonl").read_bytes().splitlines()


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_numbers_are_refused_and_nothing_is_written(tmp_path, value):
    with memstore.open_session(tmp_path, "s") as log:
        log.append(TURN_STARTED)
        with pytest.raises(memstore.InvalidEvent, match=r"item\.arguments\.weights\[1\]"):
            log.append({"type": "item.completed", "item": {"arguments": {"weights": [1.0, value]}}})
        with pytest.raises(memstore.InvalidEvent, match="total_cost_usd"):
            log.append(
                {
                    "type": "thread.completed",
                    "thread_id": "t",
                    "session_id": "s",
                    "subtype": "success",
                    "outcome_code": "ok",
                    "usage": {},
                    "num_turns": 1,
                    "total_cost_usd": value,
                }
            )
        log.append({"type": "note", "nothing": None, "zero": 0.0})  # null and finite floats are fine
    assert [json.loads(line)["event"]["type"] for line in log_lines(tmp_path)] == ["turn.started", "note"]


def test_malformed_lifecycle_events_name_the_field(tmp_path):
    with memstore.open_session(tmp_path, "s") as log:
        with pytest.raises(memstore.InvalidEvent, match="turn.completed: usage must be an object"):
            log.append({"type": "turn.completed", "usage": "invalid"})
        with pytest.raises(memstore.InvalidEvent, match="thread.started: thread_id must be a string .got 123"):
            log.append({"type": "thread.started", "thread_id": 123})
        with pytest.raises(memstore.InvalidEvent, match="turn.failed: message must be a string .got absent"):
            log.append({"type": "turn.failed"})


def test_a_huge_seq_in_the_log_does_not_brick_the_session(tmp_path):
    directory = tmp_path / "sessions" / "s"
    directory.mkdir(parents=True)
    (directory / "events.jsonl").write_bytes(
        b'{"schema_version":"0.18.0","seq":9223372036854775807,"event":{"type":"turn.started"}}\n'
        b'{"schema_version":"0.18.0","seq":99999999999999999999,"event":{"type":"turn.completed","usage":{}}}\n'
    )
    with memstore.open_session(tmp_path, "s") as log:
        assert log.turn_count == 1
        assert [r.seq for r in log.iter_records()] == [1, 2]
        assert log.append(TURN_STARTED) == 3
    assert memstore.rebuild(tmp_path, "s").next_seq == 4
    shutil.rmtree(directory / "index")
    os.unlink(directory / "manifest.json")
    assert memstore.rebuild(tmp_path, "s").event_count == 3


def test_huge_counters_in_the_manifest_are_distrusted(tmp_path):
    with memstore.open_session(tmp_path, "s") as log:
        log.append(TURN_STARTED)
        log.append(TURN_COMPLETED)
    directory = memstore.session_directory(tmp_path, "s")
    manifest = json.loads((directory / "manifest.json").read_text())
    manifest.update(next_seq=2**63 - 2, retained_turn_base=2**62)
    (directory / "manifest.json").write_text(json.dumps(manifest))
    shutil.rmtree(directory / "index")
    with memstore.open_session(tmp_path, "s") as log:
        assert [t.number for t in log.turns()] == [1]  # the log decides
        assert log.append(TURN_STARTED) == 3
    assert memstore.rebuild(tmp_path, "s").turn_count == 1


def test_a_plausible_but_false_retained_turn_base_does_not_renumber_a_memstore_log(tmp_path):
    with memstore.open_session(tmp_path, "s") as log:
        for _ in range(3):
            log.append(TURN_STARTED)
            log.append(TURN_COMPLETED)
    directory = memstore.session_directory(tmp_path, "s")
    manifest = json.loads((directory / "manifest.json").read_text())
    manifest.update(retained_turn_base=3, turn_count=5)
    (directory / "manifest.json").write_text(json.dumps(manifest))
    shutil.rmtree(directory / "index")
    with memstore.open_session(tmp_path, "s") as log:
        assert [t.number for t in log.turns()] == [1, 2, 3]


def test_an_index_failure_never_fails_an_append_and_is_reported_by_flush(tmp_path, fault):
    """The index is updated off the agent's path: a full disk there does not fail the append
    (the event is in the log), it is reported by the next flush, and retried until it works."""
    log = memstore.open_session(tmp_path, "s")
    log.append(TURN_STARTED)
    failures = []

    def full_disk(path):
        failures.append(1)
        raise memstore.StoreIOError("update index", path, "database or disk is full")

    fault.arm("index.commit", full_disk)
    assert log.append(TURN_COMPLETED) == 2
    assert json.loads(log_lines(tmp_path)[-1])["seq"] == 2  # the event is in the log
    with pytest.raises(memstore.StoreIOError, match="disk is full"):
        log.flush()
    assert failures
    fault.disarm("index.commit")
    log.flush()  # retried: nothing was forgotten
    assert [(t.number, t.status) for t in log.turns()] == [(1, "completed")]
    log.close()


def test_an_error_after_the_event_reached_the_log_says_so(tmp_path):
    def failing_hook(session_dir, session_id, events):
        raise RuntimeError("summary store unavailable")

    log = memstore.open_session(tmp_path, "s", max_events=2, on_evict=failing_hook)
    log.append(TURN_STARTED)
    log.append(TURN_COMPLETED)
    with pytest.raises(memstore.CapEvictionError) as info:
        log.append(TURN_STARTED)  # the third event: over the cap, and the hook fails
    assert info.value.seq == 3 and info.value.durable is True
    assert json.loads(log_lines(tmp_path)[-1])["seq"] == 3  # so the caller must not append it again
    with pytest.raises(memstore.InvalidEvent) as info:
        log.append({"type": "turn.completed", "usage": "bad"})
    assert info.value.seq is None and info.value.durable is False
    log.close()


def test_a_failing_eviction_hook_is_not_retried_on_every_append(tmp_path):
    calls = []

    def failing_hook(session_dir, session_id, events):
        calls.append(sum(1 for _ in events))
        raise RuntimeError("summary store unavailable")

    log = memstore.open_session(tmp_path, "s", max_events=20, on_evict=failing_hook)
    errors = []
    for i in range(40):
        try:
            log.append(TURN_STARTED if i % 2 == 0 else TURN_COMPLETED)
        except memstore.CapEvictionError as exc:
            errors.append(exc)
    # At 21 events, then after the headroom (2 events) had filled again, then 4, 8 more...
    assert len(calls) == 4, calls
    assert errors and all(e.durable and e.seq is not None for e in errors)
    assert log.event_count == 40  # nothing evicted, nothing lost
    log.close()


def test_closing_one_session_does_not_hold_up_opening_another(tmp_path, fault):
    slow = threading.Event()

    def slow_stop(path):
        if "slow" in str(path):
            slow.set()
            time.sleep(0.8)

    fault.arm("publisher.stop", slow_stop)
    closing = memstore.open_session(tmp_path, "slow")
    closing.append(TURN_STARTED)
    thread = threading.Thread(target=closing.close)
    thread.start()
    assert slow.wait(5)
    started = time.monotonic()
    with memstore.open_session(tmp_path, "other") as log:
        log.append(TURN_STARTED)
    assert time.monotonic() - started < 0.5, "opening another session waited for the close"
    thread.join()
