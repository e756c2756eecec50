"""The demo store: realistic, seeded, idempotent, written through the public API."""

from __future__ import annotations

import json
import sqlite3

from click.testing import CliRunner

import memstore
from memstore.catalog import refresh_catalog
from memstore.cli import cli
from memstore.demo import IMPORTED_SESSIONS, demo_plan, write_demo_store


def logs(root):
    return {p.parent.name: p.read_bytes() for p in (root / "sessions").glob("*/events.jsonl")}


def test_demo_store_is_seeded_and_idempotent(tmp_path):
    first = write_demo_store(tmp_path / "a")
    assert first.sessions == 30 and len(first.written) == 28 and len(first.imported) == 2 and not first.skipped
    write_demo_store(tmp_path / "b")
    a, b = logs(tmp_path / "a"), logs(tmp_path / "b")
    imported = set(IMPORTED_SESSIONS)
    # Every generated session is the same bytes; imported ones record their (temporary) source path.
    assert {k: v for k, v in a.items() if k not in imported} == {k: v for k, v in b.items() if k not in imported}
    again = write_demo_store(tmp_path / "a")
    assert not again.written and not again.imported and len(again.skipped) == 30
    assert logs(tmp_path / "a") == a
    other = write_demo_store(tmp_path / "c", sessions=12, seed=3)
    assert other.sessions == 12


def test_a_partial_demo_session_is_completed_to_the_same_bytes(tmp_path):
    write_demo_store(tmp_path / "whole")
    session_id, events, _ledger = demo_plan()[3]
    half = len(events) // 2
    with memstore.open_session(tmp_path, session_id, durability="none") as log:  # an interrupted run
        for event, ts in events[:half]:
            log.append(event, ts=ts)
    report = write_demo_store(tmp_path)
    assert session_id in report.written and report.events > len(events) - half
    assert (tmp_path / "sessions" / session_id / "events.jsonl").read_bytes() == (
        tmp_path / "whole" / "sessions" / session_id / "events.jsonl").read_bytes()


def test_the_demo_never_removes_or_rewrites_what_someone_added(tmp_path, caplog):
    """A session of a demo name holding other events (events appended to a demo session, or
    someone's own session called ``demo`` in a real store) is left as it is, with a warning;
    a ledger someone moved on is not reset."""
    with memstore.open_session(tmp_path, "demo") as log:  # someone's own session called demo
        log.append({"type": "turn.started"})
        log.append({"type": "item.completed", "item": {"id": "m", "type": "agent_message", "text": "mine"}})
        log.append({"type": "turn.completed", "usage": {}})
    mine = (tmp_path / "sessions" / "demo" / "events.jsonl").read_bytes()
    write_demo_store(tmp_path)
    assert (tmp_path / "sessions" / "demo" / "events.jsonl").read_bytes() == mine
    victim = sorted(p for p in (tmp_path / "sessions").iterdir() if p.name.startswith("vt-"))[0]
    with memstore.open_session(tmp_path, victim.name) as log:  # appended to a demo session
        log.append({"type": "note"})
    grown = (victim / "events.jsonl").read_bytes()
    with_ledger = next(p.parent.parent for p in (tmp_path / "sessions").glob("*/derived/progress.json"))
    ledger = memstore.load_progress(tmp_path, with_ledger.name)
    ledger.add_known_issue("found by a person after the demo")
    memstore.save_progress(tmp_path, with_ledger.name, ledger)
    moved_on = (with_ledger / "derived" / "progress.json").read_bytes()
    caplog.clear()
    with caplog.at_level("WARNING", logger="memstore"):
        report = write_demo_store(tmp_path)
    assert sorted(report.kept) == sorted(["demo", victim.name]) and not report.written
    assert (tmp_path / "sessions" / "demo" / "events.jsonl").read_bytes() == mine
    assert (victim / "events.jsonl").read_bytes() == grown
    assert (with_ledger / "derived" / "progress.json").read_bytes() == moved_on
    assert not (tmp_path / ".trash").exists() or not any((tmp_path / ".trash").iterdir())
    assert sum("left as it is" in r.getMessage() for r in caplog.records) == 2


def test_demo_sessions_look_like_real_agent_work(tmp_path):
    write_demo_store(tmp_path)
    refresh_catalog(tmp_path)
    conn = sqlite3.connect(tmp_path / "catalog.db")

    def one(sql):
        return conn.execute(sql).fetchone()[0]

    assert one("SELECT count(*) FROM sessions") == 30
    assert one("SELECT count(DISTINCT agent) FROM sessions") == 4  # memstore (classic), vtcode, codex, claude
    assert one("SELECT min(turn_count) FROM sessions WHERE agent = 'vtcode'") >= 3
    assert one("SELECT count(*) FROM commands WHERE failed") >= 10
    assert one("SELECT count(*) FROM commands WHERE NOT failed") >= 20
    assert one("SELECT count(*) FROM file_changes") >= 20
    assert one("SELECT count(*) FROM events WHERE type = 'permission.resolved' AND status = 'deny'") >= 3
    assert one("SELECT count(*) FROM events WHERE status = 'declined'") >= 1
    assert one("SELECT count(*) FROM events WHERE type = 'thread.compact_boundary'") >= 1
    assert one("SELECT count(*) FROM turns WHERE status = 'failed'") >= 3
    assert one("SELECT count(*) FROM turns WHERE status = 'aborted'") >= 1
    assert one("SELECT count(*) FROM sessions WHERE status = 'active'") >= 2
    assert one("SELECT count(DISTINCT substr(started_at, 1, 10)) FROM turns") >= 15
    # A failing test run is followed by a fix and a green run in the same turn.
    assert one("""SELECT count(*) FROM commands c WHERE c.failed AND c.command IN ('cargo test', 'pytest -q')
                  AND EXISTS (SELECT 1 FROM commands d WHERE d.session_id = c.session_id AND d.turn = c.turn
                              AND d.seq > c.seq AND d.command = c.command AND NOT d.failed)""") >= 3
    # Usage grows with the context within a session (until a compaction).
    sid = one("SELECT session_id FROM sessions WHERE agent = 'vtcode' AND session_id NOT IN "
              "(SELECT session_id FROM events WHERE type = 'thread.compact_boundary') ORDER BY turn_count DESC LIMIT 1")
    inputs = [r[0] for r in conn.execute("SELECT input_tokens FROM turns WHERE session_id = ? ORDER BY number", (sid,))]
    assert inputs == sorted(inputs) and inputs[-1] > inputs[0]
    ledgers = [p for p in (tmp_path / "sessions").glob("*/derived/progress.json")]
    assert len(ledgers) >= 4
    ledger = memstore.load_progress(tmp_path, ledgers[0].parent.parent.name)
    assert ledger.goal and len(ledger.milestones) == 4 and 0 < ledger.completion_ratio() < 1
    for sid in IMPORTED_SESSIONS:
        with memstore.read_session(tmp_path, sid) as reader:
            assert reader.manifest.source["agent"] in ("codex", "claude") and reader.turn_count >= 1
    # The classic three-turn session is still there, as it always was.
    with memstore.read_session(tmp_path, "demo") as reader:
        assert [t.status for t in reader.turns()] == ["failed", "completed", "completed"]
        assert reader.event_count == 17


def test_demo_command(tmp_path):
    result = CliRunner().invoke(cli, ["demo", "--root", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "30 sessions written" in result.output and f"memstore serve --root {tmp_path}" in result.output
    again = CliRunner().invoke(cli, ["demo", "--root", str(tmp_path), "--json"])
    data = json.loads(again.output)
    assert again.exit_code == 0 and data["written"] == [] and len(data["skipped"]) == 30
    bad = CliRunner().invoke(cli, ["demo", "--root", str(tmp_path), "--sessions", "1"])
    assert bad.exit_code == 2 and "--sessions" in bad.output
    assert "Examples" in CliRunner().invoke(cli, ["demo", "--help"]).output
