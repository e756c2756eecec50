"""The cross-session catalog: incremental refreshes equal a refresh from scratch, rewritten
sessions are recopied, removed ones forgotten, and readers never see half a session."""

from __future__ import annotations

import os
import shutil
import sqlite3
import threading

import hypothesis
import hypothesis.strategies as st
from catalog_support import content, from_scratch, turn

import memstore
from memstore.catalog import refresh_catalog
from memstore.session.tuning import TUNING

ops = st.lists(
    st.tuples(
        st.sampled_from(["turn", "fail", "open", "refresh", "rebuild", "cap", "remove", "idle"]), st.integers(0, 2)
    ),
    min_size=1,
    max_size=14,
)


@hypothesis.settings(max_examples=int(os.environ.get("MEMSTORE_PROPERTY_EXAMPLES_CATALOG", "25")), deadline=None)
@hypothesis.given(ops=ops)
def test_incremental_refreshes_equal_a_refresh_from_scratch(tmp_path_factory, ops):
    tmp_path = tmp_path_factory.mktemp("catalog")
    root = tmp_path / "store"
    (root / "sessions").mkdir(parents=True)
    counter = 0
    for op, which in ops:
        sid = f"s{which}"
        counter += 1
        if op in ("turn", "fail", "cap"):
            with memstore.open_session(root, sid, max_events=12 if op == "cap" else 0) as log:
                turn(log, counter, fail=op == "fail")
        elif op == "open":
            with memstore.open_session(root, sid) as log:
                log.append({"type": "turn.started"})
                log.append({"type": "item.completed", "item": {"id": "m", "type": "agent_message", "text": "widget?"}})
        elif op == "refresh":
            refresh_catalog(root)
        elif op == "rebuild" and memstore.session_directory(root, sid).exists():
            memstore.rebuild(root, sid)
        elif op == "remove":
            shutil.rmtree(memstore.session_directory(root, sid), ignore_errors=True)
    refresh_catalog(root)
    assert content(root) == from_scratch(root, tmp_path)
    # A second refresh with nothing new changes nothing.
    report = refresh_catalog(root)
    assert not report.changed and not report.errors


def test_refresh_report_and_what_it_copies(tmp_path):
    with memstore.open_session(tmp_path, "a") as log:
        turn(log, 1)
        turn(log, 2, fail=True)
    report = refresh_catalog(tmp_path)
    assert report.added == ["a"] and not report.errors
    data = content(tmp_path)
    (session,) = data["sessions"]
    assert session[:8] == ("a", "a", "active", session[3], session[4], 2, 10, 1)
    assert session[8:12] == ("memstore", "fix widget 1", "gpt-5", 1)
    assert [t[:3] for t in data["turns"]] == [("a", 1, "completed"), ("a", 2, "failed")]
    assert len(data["fts"]) == 2 + 2 * 2  # two prompts, two 51-line command outputs in two windows each
    assert {(f[3], f[4]) for f in data["file_changes"]} == {("src/f1.rs", "update"), ("src/f2.rs", "update")}
    assert refresh_catalog(tmp_path).unchanged == 1
    memstore.rebuild(tmp_path, "a", refresh=False)  # a new generation: recopied
    assert refresh_catalog(tmp_path).recopied == ["a"]
    memstore.rebuild(tmp_path, "a")  # which a rebuild does itself
    assert refresh_catalog(tmp_path).unchanged == 1
    assert content(tmp_path) == data
    shutil.rmtree(memstore.session_directory(tmp_path, "a"))
    assert refresh_catalog(tmp_path).removed == ["a"]
    assert content(tmp_path)["sessions"] == []


def test_the_catalog_sees_lines_a_writer_has_not_indexed(tmp_path, monkeypatch):
    monkeypatch.setattr(TUNING, "derive_idle_seconds", 3600)
    with memstore.open_session(tmp_path, "a") as log:
        turn(log, 1)
    # VT Code appended a turn without touching the index.
    with open(memstore.session_directory(tmp_path, "a") / "events.jsonl", "ab") as fh:
        fh.write(b'{"schema_version":"0.18.0","event":{"type":"turn.started"}}\n')
        fh.write(
            b'{"schema_version":"0.18.0","event":{"type":"item.completed","item":{"id":"x","type":"agent_message","text":"a widget appears"}}}\n'
        )
    refresh_catalog(tmp_path)
    data = content(tmp_path)
    assert [t[1:3] for t in data["turns"]] == [(1, "completed"), (2, "open")]
    assert ("a:7:0",) in data["fts"]
    assert data == from_scratch(tmp_path, tmp_path)


def test_a_reader_querying_during_refreshes_never_sees_half_a_session(tmp_path):
    for i in range(4):
        with memstore.open_session(tmp_path, f"s{i}") as log:
            for t in range(5):
                turn(log, t)
    refresh_catalog(tmp_path)
    stop = threading.Event()
    problems = []

    def query():
        conn = sqlite3.connect(f"file:{tmp_path / 'catalog.db'}?mode=ro", uri=True)
        while not stop.is_set():
            try:
                conn.execute("BEGIN")
                for sid, events in conn.execute("SELECT session_id, event_count FROM sessions"):
                    copied = conn.execute("SELECT count(*) FROM events WHERE session_id = ?", (sid,)).fetchone()[0]
                    if copied != events:
                        problems.append((sid, events, copied))
                conn.execute("COMMIT")
            except sqlite3.Error as exc:
                problems.append(str(exc))
        conn.close()

    thread = threading.Thread(target=query)
    thread.start()
    try:
        for round_no in range(6):
            for i in range(4):
                with memstore.open_session(tmp_path, f"s{i}") as log:
                    turn(log, round_no + 10)
                if round_no % 3 == 0:
                    memstore.rebuild(tmp_path, f"s{i}")
            refresh_catalog(tmp_path)
    finally:
        stop.set()
        thread.join()
    assert problems == []


def test_a_session_directory_whose_name_is_not_utf8_does_not_break_the_catalog(tmp_path):
    """A stray directory under sessions/ named with bytes that are not UTF-8 (no memstore id
    gives one) is left out; refresh and search go on for every other session."""
    with memstore.open_session(tmp_path, "ok") as log:
        log.append({"type": "turn.started"})
        log.append({"type": "item.completed", "item": {"id": "m", "type": "agent_message", "text": "hello world"}})
        log.append({"type": "turn.completed", "usage": {}})
        events = (log.directory / "events.jsonl").read_bytes()
    stray = os.path.join(os.fsencode(tmp_path / "sessions"), b"bad\xff")
    os.mkdir(stray)
    with open(os.path.join(stray, b"events.jsonl"), "wb") as f:
        f.write(events)
    memstore.refresh_catalog(tmp_path)
    assert [hit.session_id for hit in memstore.search_memory(tmp_path, "hello")] == ["ok"]
    assert [m.session_id for m in memstore.rebuild(tmp_path)] == ["ok"]
