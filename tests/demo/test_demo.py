"""The demo store: realistic, seeded, idempotent, written through the public API."""

from __future__ import annotations

import json
import sqlite3

import pytest
from click.testing import CliRunner

import memstore
from memstore.catalog import refresh_catalog
from memstore.cli import cli
from memstore.demo import IMPORTED_SESSIONS, demo_plan, write_demo_store


def logs(root):
    return {p.parent.name: p.read_bytes() for p in (root / "sessions").glob("*/events.jsonl")}


def test_demo_store_is_seeded_and_idempotent(tmp_path):
    first = write_demo_store(tmp_path / "a")
    assert first.sessions == 30 and len(first.written) == 27 and len(first.imported) == 3 and not first.skipped
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
        tmp_path / "whole" / "sessions" / session_id / "events.jsonl"
    ).read_bytes()


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
    assert (
        one("""SELECT count(*) FROM commands c WHERE c.failed AND c.command IN ('cargo test', 'pytest -q')
                  AND EXISTS (SELECT 1 FROM commands d WHERE d.session_id = c.session_id AND d.turn = c.turn
                              AND d.seq > c.seq AND d.command = c.command AND NOT d.failed)""")
        >= 3
    )
    # Usage is that of real agent turns: the prompt grows over a session (until a compaction),
    # each turn makes several calls that re-read it, mostly from the provider's cache.
    sid = one(
        "SELECT session_id FROM sessions WHERE agent = 'vtcode' AND session_id NOT IN "
        "(SELECT session_id FROM events WHERE type = 'thread.compact_boundary') ORDER BY turn_count DESC LIMIT 1"
    )
    rows = conn.execute(
        "SELECT input_tokens, cached_input_tokens, output_tokens FROM turns WHERE session_id = ? "
        "AND status = 'completed' ORDER BY number",
        (sid,),
    ).fetchall()
    assert rows[-1][0] > rows[0][0] and all(out < inp / 5 for inp, _c, out in rows)
    assert all(cached > inp / 2 for inp, cached, _o in rows[1:])  # after the first turn, mostly cached
    ledgers = [p for p in (tmp_path / "sessions").glob("*/derived/progress.json")]
    assert len(ledgers) >= 15
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
    assert "next: memstore serve --root" in result.output and "http://127.0.0.1:8001/-/memstore" in result.output
    again = CliRunner().invoke(cli, ["demo", "--root", str(tmp_path), "--json"])
    data = json.loads(again.output)
    assert again.exit_code == 0 and data["written"] == [] and len(data["skipped"]) == 30
    bad = CliRunner().invoke(cli, ["demo", "--root", str(tmp_path), "--sessions", "3"])
    assert bad.exit_code == 2 and "--sessions" in bad.output
    assert "Examples" in CliRunner().invoke(cli, ["demo", "--help"]).output


# --------------------------------------------------------------------------------------------
# Every feature of the store is in the demo


@pytest.fixture(scope="module")
def demo_store(tmp_path_factory):
    root = tmp_path_factory.mktemp("demo") / "store"
    write_demo_store(root)
    refresh_catalog(root)
    return root


def cli_json(*args):
    result = CliRunner().invoke(cli, [*map(str, args), "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_the_demo_has_memory_facts(demo_store):
    """Memory envelopes in the logs (at compactions, at the end of work) give derived/memory.json
    views with grounded facts, which `memstore facts` lists."""
    views = sorted((demo_store / "sessions").glob("*/derived/memory.json"))
    assert len(views) >= 8
    for path in views:
        view = json.loads(path.read_text())
        assert view["derived_from"]["envelope_seq"] is not None and len(view["grounded_facts"]) >= 3
        assert view["objective"] and view["touched_files"] is not None
    with memstore.read_session(demo_store, views[0].parent.parent.name) as reader:
        assert any(e["type"] == "memory.envelope" for e in reader.iter_events())
    facts = cli_json("facts", "--root", demo_store, "-n", 200)
    assert len(facts) >= 30 and len({f["session_id"] for f in facts}) >= 8
    assert {f["source"] for f in facts} >= {"user_assertion", "tool:read_file"}


def test_the_demo_has_ledgers_and_goals_in_most_sessions(demo_store):
    """Progress ledgers (goal and milestones) in most sessions, the classic one included, and the
    first turn of those sessions names the goal."""
    sessions = cli_json("sessions", "--root", demo_store)
    with_ledger = [s["session_id"] for s in sessions if memstore.load_progress(demo_store, s["session_id"])]
    assert len(with_ledger) >= len(sessions) // 2 and "demo" in with_ledger
    result = CliRunner().invoke(cli, ["progress", "demo", "--root", str(demo_store)])
    assert result.exit_code == 0 and "**Goal:**" in result.stdout and "[x] m1" in result.stdout
    ratios = {memstore.load_progress(demo_store, sid).completion_ratio() for sid in with_ledger}
    assert len(ratios) >= 2  # some done further than others
    goals = 0
    for sid in with_ledger:
        with memstore.read_session(demo_store, sid) as reader:
            first = next(e for e in reader.iter_events() if e["type"] == "turn.started")
        goals += isinstance(first.get("context"), dict) and bool(first["context"].get("goal"))
    assert goals >= len(with_ledger) - 1


def test_every_demo_session_has_a_cost(demo_store):
    """Every turn of every session is of a model the price table knows: each session has a cost
    and none is a lower bound; the classic session's is the one its agent reported."""
    sessions = cli_json("sessions", "--root", demo_store)
    assert len(sessions) == 30
    for s in sessions:
        assert s["cost_usd"] and s["cost_usd"] > 0 and s["cost_unpriced_turns"] == 0, s
    assert sum(s["cost_usd"] for s in sessions) > 5  # dollars, as real agent work costs
    classic = cli_json("show", "demo", "--root", demo_store)
    assert classic["cost"]["source"] == "reported" and classic["cost"]["usd"] == pytest.approx(0.0412)


def test_the_demo_has_a_sub_agent(demo_store):
    """The Claude session starts a sub-agent (its Task tool), imported as its own session that
    names its parent; the parent's tool call names the child."""
    parent, child = IMPORTED_SESSIONS[1], IMPORTED_SESSIONS[2]
    with memstore.read_session(demo_store, child) as reader:
        assert reader.manifest.source["parent_session_id"] == parent and reader.turn_count == 1
    with memstore.read_session(demo_store, parent) as reader:
        calls = [
            e["item"]
            for e in reader.iter_events()
            if e["type"] == "item.completed" and e["item"].get("child_session_id")
        ]
    assert [c["child_session_id"] for c in calls] == [child]


LANGUAGE_MISMATCH = {  # what a line of another language looks like
    "py": ("fn ", "func ", "const ", "=> ", "};", "<Empty>", "&mut"),
    "rs": ("def ", "func ", "const ", "??", "<Empty>", ":= "),
    "go": ("def ", "fn ", "const ", "??", "<Empty>", "&mut", "self."),
    "tsx": ("def ", "fn ", "func ", ":= ", "&mut", "self."),
}
LANGUAGE_MISMATCH["ts"] = LANGUAGE_MISMATCH["tsx"]


def test_demo_diffs_are_in_the_language_of_their_file(demo_store):
    """A diff to a .py file holds Python, to a .tsx file TypeScript, and so on."""
    conn = sqlite3.connect(demo_store / "catalog.db")
    checked = set()
    for sid, seq in conn.execute("SELECT session_id, seq FROM events WHERE item_type = 'file_change'"):
        with memstore.read_session(demo_store, sid) as reader:
            item = reader.record(seq).event["item"]
        diff = item.get("unified_diff")
        if not diff:
            continue
        path = item["changes"][0]["path"]
        ext = path.rsplit(".", 1)[-1]
        added = [line[1:] for line in diff.splitlines() if line.startswith("+") and not line.startswith("+++")]
        for line in added:
            assert not any(token in line for token in LANGUAGE_MISMATCH[ext]), (path, line)
        checked.add(ext)
    assert checked >= {"py", "rs", "go", "tsx"}
