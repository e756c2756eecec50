"""A cap rewrite hands the rows not yet in the index (a bulk writer's last megabyte, a live
writer's open turn) to the index with the rewrite itself, moved to the rewritten log's offsets:
afterwards the index must say exactly what a rebuild from the log says."""

from __future__ import annotations

import sqlite3

import pytest

import memstore
from memstore.session import writer as writer_module


def _index_rows(root, session_id: str) -> tuple[list, list]:
    path = memstore.session_directory(root, session_id) / "index" / "session.db"
    db = sqlite3.connect(path)
    try:
        events = db.execute("SELECT * FROM events ORDER BY seq").fetchall()
        turns = db.execute("SELECT * FROM turns ORDER BY number").fetchall()
    finally:
        db.close()
    return events, turns


def _append_turns(log, first: int, count: int) -> None:
    for number in range(first, first + count):
        log.append({"type": "turn.started"})
        for part in range(number % 4 + 1):
            text = f"turn {number} part {part}: checked the parser and fixed the span of token {number * 7}"
            log.append({"type": "item.completed", "item": {"type": "agent_message", "text": text}})
        log.append({"type": "turn.completed", "usage": {"input_tokens": number, "output_tokens": 1}})


@pytest.mark.parametrize("durability", ["none", "turn"])
def test_rows_pending_at_a_cap_rewrite_reach_the_index_at_the_rewritten_offsets(tmp_path, monkeypatch, durability):
    """With rows handed to the index only every few KB (bulk) or at turn ends (live), cap
    rewrites find rows not yet in the index; the index left after them matches a rebuild row
    for row, every indexed offset starts its record, and the open turn reconstructs."""
    monkeypatch.setattr(writer_module, "BULK_INDEX_BYTES", 4_000)
    log = memstore.open_session(tmp_path, "s", max_events=60, durability=durability)
    _append_turns(log, 1, 70)
    log.append({"type": "turn.started"})
    log.append({"type": "item.completed", "item": {"type": "agent_message", "text": "still working"}})
    open_turn = log.turns()[-1].number  # (turn_count counts completed turns)
    assert log.reconstruct_turn(open_turn)[-1]["item"]["text"] == "still working"
    log.close()
    summaries = memstore.session_directory(tmp_path, "s") / "derived" / "eviction-summaries.jsonl"
    assert len(summaries.read_bytes().splitlines()) >= 5  # several rewrites happened
    before = _index_rows(tmp_path, "s")
    data = (memstore.session_directory(tmp_path, "s") / "events.jsonl").read_bytes()
    events, _turns = before
    assert events and all(data[row[1] : row[1] + row[2]].endswith(b"\n") for row in events)
    assert all(row[1] == 0 or data[row[1] - 1 : row[1]] == b"\n" for row in events)
    memstore.rebuild(tmp_path, "s", refresh=False)
    assert _index_rows(tmp_path, "s") == before


def test_the_replaced_logs_are_closed_after_each_rewrite(tmp_path):
    """The publisher closes each replaced log once the rewrite's index commit is done (off the
    agent's path): after many rewrites and a flush, no descriptor of this process points at a
    replaced (deleted) ``events.jsonl``, so their blocks are freed."""
    import os

    log = memstore.open_session(tmp_path, "s", max_events=20)
    _append_turns(log, 1, 60)
    log.flush()
    summaries = memstore.session_directory(tmp_path, "s") / "derived" / "eviction-summaries.jsonl"
    assert len(summaries.read_bytes().splitlines()) >= 10
    fd_dir = f"/proc/{os.getpid()}/fd"
    targets = []
    for name in os.listdir(fd_dir):
        try:
            targets.append(os.readlink(os.path.join(fd_dir, name)))
        except OSError:
            continue  # closed meanwhile
    assert not [t for t in targets if "events.jsonl" in t and t.endswith("(deleted)")], targets
    assert len([t for t in targets if t.endswith("/sessions/s/events.jsonl")]) == 2  # the live log's two
    log.close()
