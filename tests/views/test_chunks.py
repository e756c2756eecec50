"""Search chunks: events split into bounded windows, derived off the agent's path, identical
whether derived incrementally, by a rebuild, or in memory by a reader."""

from __future__ import annotations

import sqlite3
import time

import hypothesis
import hypothesis.strategies as st
from support import TURN_COMPLETED, TURN_STARTED

import memstore
from memstore.session.tuning import TUNING
from memstore.views.chunks import WINDOW_CHARS, WINDOW_LINES, event_chunks, windows


def command(i: int, output: str) -> dict:
    return {
        "type": "item.completed",
        "item": {
            "id": f"c{i}",
            "type": "command_execution",
            "command": f"cargo test --package p{i}",
            "aggregated_output": output,
            "exit_code": 1,
            "status": "failed",
        },
    }


def message(text: str) -> dict:
    return {"type": "item.completed", "item": {"id": text[:8], "type": "agent_message", "text": text}}


@hypothesis.settings(max_examples=200, deadline=None)
@hypothesis.given(
    st.lists(
        st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\n"), max_size=3000),
        max_size=120,
    )
)
def test_windows_are_bounded_and_cover_every_line(lines):
    text = "\n".join(lines)
    parts = windows(text)
    for first, last, body in parts:
        assert len(body) <= WINDOW_CHARS
        assert body.count("\n") < WINDOW_LINES
        assert 1 <= first <= last <= len(lines) or not lines
        assert body.strip()
    # Every non-blank character of the text is in some window, in order.
    assert "".join("".join(b.split()) for _, _, b in parts) == "".join(text.split())


def test_event_chunks_name_their_kind_and_lines():
    output = "\n".join(f"line {n}" for n in range(1, 101))
    chunks = event_chunks(7, 2, "2026-11-30T08:30:29.123Z", command(1, output))
    assert [c.part for c in chunks] == [0, 1, 2]
    assert [(c.start_line, c.end_line) for c in chunks] == [(1, 40), (41, 80), (81, 101)]
    assert chunks[0].text.startswith("$ cargo test --package p1\nline 1")
    assert {(c.seq, c.turn, c.kind) for c in chunks} == {(7, 2, "command_execution")}
    assert event_chunks(1, None, None, TURN_STARTED) == []
    assert [c.kind for c in event_chunks(2, 1, None, {"type": "turn.failed", "message": "rate limited"})] == [
        "turn.failed"
    ]


def session_chunks(root, sid="s"):
    conn = sqlite3.connect(memstore.session_directory(root, sid) / "index" / "session.db")
    try:
        rows = conn.execute(
            "SELECT seq, part, turn, ts, kind, start_line, end_line, text FROM chunks ORDER BY seq, part"
        ).fetchall()
        watermark = conn.execute("SELECT seq FROM derived_state").fetchall()
        return rows, watermark
    finally:
        conn.close()


def wait_for_deriver(root, sid, seq, timeout=10):
    deadline = time.monotonic() + timeout
    while True:
        rows, watermark = session_chunks(root, sid)
        if watermark and watermark[0][0] >= seq:
            return rows
        assert time.monotonic() < deadline, f"the deriver did not catch up to seq {seq}: {watermark}"
        time.sleep(0.02)


def write(log, n_turns):
    for t in range(n_turns):
        log.append(TURN_STARTED)
        log.append(message(f"turn {t}: the widget is blue"))
        log.append(command(t, "\n".join(f"error[E0{t}{n}]: mismatched types" for n in range(60))))
        log.append(TURN_COMPLETED)


def test_the_deriver_catches_up_when_the_agent_is_idle_and_matches_a_rebuild(tmp_path, monkeypatch):
    monkeypatch.setattr(TUNING, "derive_idle_seconds", 0.01)
    log = memstore.open_session(tmp_path, "s")
    write(log, 5)
    rows = wait_for_deriver(tmp_path, "s", 20)
    assert len(rows) == 5 * (1 + 2)  # a message, and a 61-line command in two windows, per turn
    log.close()
    memstore.rebuild(tmp_path, "s")
    rebuilt, watermark = session_chunks(tmp_path, "s")
    assert rebuilt == rows and watermark == [(20,)]
    conn = sqlite3.connect(memstore.session_directory(tmp_path, "s") / "index" / "session.db")
    hits = conn.execute(
        "SELECT c.seq FROM chunks_fts JOIN chunks c ON c.id = chunks_fts.rowid "
        "WHERE chunks_fts MATCH 'widget' ORDER BY c.seq"
    ).fetchall()
    assert hits == [(2,), (6,), (10,), (14,), (18,)]


def test_appending_never_derives_and_readers_derive_what_lags(tmp_path, monkeypatch):
    monkeypatch.setattr(TUNING, "derive_idle_seconds", 3600)  # the agent never rests
    with memstore.open_session(tmp_path, "s") as log:
        write(log, 3)
    rows, watermark = session_chunks(tmp_path, "s")
    assert rows == [] and watermark == []
    from memstore.views.chunks import record_chunks

    with memstore.read_session(tmp_path, "s") as reader:
        in_memory = [tuple(c) for c in record_chunks(reader.underived_records())]
    memstore.rebuild(tmp_path, "s")
    rebuilt, _ = session_chunks(tmp_path, "s")
    assert in_memory == rebuilt


def test_cap_evictions_drop_their_chunks(tmp_path, monkeypatch):
    monkeypatch.setattr(TUNING, "derive_idle_seconds", 0.01)
    with memstore.open_session(tmp_path, "s", max_events=10) as log:
        write(log, 2)
        wait_for_deriver(tmp_path, "s", 8)
        write(log, 2)  # 16 > 10: the oldest turns go
        first = min(r.seq for r in log.iter_records())
        rows = wait_for_deriver(tmp_path, "s", 16)
    assert rows and min(r[0] for r in rows) >= first
    memstore.rebuild(tmp_path, "s")
    assert session_chunks(tmp_path, "s")[0] == rows


def test_a_foreign_line_nested_hundreds_of_levels_deep_is_chunked_by_its_words(tmp_path):
    """orjson reads 1,024 levels but writes only 255: the text of a deeper event (a foreign
    line) is its strings, made without recursion, not a repr() of brackets."""
    with memstore.open_session(tmp_path, "s") as log:
        log.append({"type": "turn.started"})
    depth = 480  # a dict and a list per level: 960 levels
    arguments = b'{"a":[' * depth + b'"needle"' + b"]}" * depth
    line = (
        b'{"schema_version":"0.18.0","event":{"type":"item.completed","item":{"id":"t","type":"tool_call","tool_name":"probe",'
        b'"arguments":' + arguments + b"}}}\n"
    )
    with open(tmp_path / "sessions" / "s" / "events.jsonl", "ab") as fh:
        fh.write(line)
    memstore.rebuild(tmp_path, "s")
    hits = memstore.search_memory(tmp_path, "needle")
    assert [(h.session_id, h.seq, h.snippet) for h in hits] == [("s", 2, "probe needle")]
