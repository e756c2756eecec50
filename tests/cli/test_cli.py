"""The click commands over the log: demo, append, rebuild, sessions, show."""

from __future__ import annotations

import json
import subprocess
import sys

from click.testing import CliRunner

import memstore
from memstore.cli import cli


def run(*args, input=None):
    return CliRunner().invoke(cli, list(args), input=input, catch_exceptions=False)


def test_demo_writes_a_session_and_shows_it(tmp_path):
    result = run("demo", "--root", str(tmp_path))
    assert result.exit_code == 0, result.output
    assert "30 sessions written" in result.output and "memstore serve" in result.output
    with memstore.open_session(tmp_path, "demo") as log:
        assert [t.status for t in log.turns()] == ["failed", "completed", "completed"]


def test_append_from_stdin_accepts_events_and_envelopes(tmp_path):
    lines = "\n".join(
        [
            json.dumps({"type": "turn.started"}),
            "",
            json.dumps({"schema_version": "0.11.0", "event": {"type": "turn.completed", "usage": {}}}),
        ]
    )
    result = run("append", "s", "--root", str(tmp_path), "--json", input=lines)
    assert result.exit_code == 0, result.output
    assert json.loads(result.output) == {
        "session_id": "s",
        "appended": 2,
        "last_seq": 2,
        "turn_count": 1,
        "event_count": 2,
    }


def test_append_stops_at_the_first_invalid_line_and_keeps_the_rest(tmp_path):
    lines = '{"type": "turn.started"}\n{"type": 5}\n{"type": "note"}\n'
    result = CliRunner().invoke(cli, ["append", "s", "--root", str(tmp_path)], input=lines)
    assert result.exit_code == 2
    assert "line 2" in result.output and "1 event appended" in result.output
    with memstore.open_session(tmp_path, "s") as log:
        assert list(log.iter_events()) == [{"type": "turn.started"}]
    result = CliRunner().invoke(cli, ["append", "s", "--root", str(tmp_path)], input="not json\n")
    assert result.exit_code == 2 and "line 1: not JSON" in result.output


def test_append_from_a_file(tmp_path):
    source = tmp_path / "events.jsonl"
    source.write_text('{"type": "turn.started"}\n{"type": "turn.completed", "usage": {}}\n')
    result = run("append", "s", str(source), "--root", str(tmp_path / "store"), "--durability", "none")
    assert result.exit_code == 0
    assert "appended 2 events" in result.output


def test_sessions_lists_newest_first(tmp_path):
    assert "no sessions" in run("sessions", "--root", str(tmp_path)).output
    for sid in ("older", "newer"):
        with memstore.open_session(tmp_path, sid) as log:
            log.append({"type": "turn.started"})
    result = run("sessions", "--root", str(tmp_path), "--json")
    assert [s["session_id"] for s in json.loads(result.output)] == ["newer", "older"]
    assert "older" in run("sessions", "--root", str(tmp_path)).output


def test_show_turns_and_one_turn(tmp_path):
    run("demo", "--root", str(tmp_path))
    result = run("show", "demo", "--root", str(tmp_path), "--json")
    data = json.loads(result.output)
    assert data["manifest"]["turn_count"] == 3
    assert [t["status"] for t in data["turns"]] == ["failed", "completed", "completed"]
    result = run("show", "demo", "--root", str(tmp_path), "--turn", "3", "--jsonl")
    events = [json.loads(line) for line in result.output.splitlines()]
    assert events[0] == {"type": "turn.started"} and events[-1]["type"] == "turn.completed"
    missing = CliRunner().invoke(cli, ["show", "demo", "--root", str(tmp_path), "--turn", "9"])
    assert missing.exit_code == 1 and "turn 9 not found" in missing.output
    nosession = CliRunner().invoke(cli, ["show", "nope", "--root", str(tmp_path)])
    assert nosession.exit_code == 2 and "no session 'nope'" in nosession.output


def test_rebuild_all_and_errors(tmp_path):
    run("demo", "--root", str(tmp_path))
    index = tmp_path / "sessions" / "demo" / "index"
    for path in index.glob("session.db*"):
        path.unlink()
    result = run("rebuild", "--all", "--root", str(tmp_path))
    assert result.exit_code == 0 and "rebuilt 30 sessions" in result.output  # the demo store
    assert (index / "session.db").exists()
    assert CliRunner().invoke(cli, ["rebuild", "--root", str(tmp_path)]).exit_code == 2
    result = CliRunner().invoke(cli, ["rebuild", "nope", "--root", str(tmp_path), "--json"])
    assert result.exit_code == 2 and "no such session" in json.loads(result.output)[0]["error"]


def test_root_from_environment(tmp_path):
    result = CliRunner().invoke(cli, ["demo"], env={"MEMSTORE_ROOT": str(tmp_path)})
    assert result.exit_code == 0
    assert (tmp_path / "sessions" / "demo" / "events.jsonl").is_file()


def test_python_dash_m_runs_the_cli(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "memstore", "sessions", "--root", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0 and "no sessions" in out.stdout


def test_every_command_has_examples_in_its_help():
    for name in sorted(cli.commands):
        result = CliRunner().invoke(cli, [name, "--help"])
        assert result.exit_code == 0, (name, result.output)
        assert "Example" in result.output and f"memstore {name}" in result.output, name


def test_sessions_shows_whole_ids_that_show_accepts(tmp_path):
    long_id = "claude-5b0e7a4c-2f1d-4c8e-9b7a-0123456789ab-agent-a1b2c3"
    with memstore.open_session(tmp_path, long_id) as log:
        log.append({"type": "turn.started"})
    listed = CliRunner().invoke(cli, ["sessions", "--root", str(tmp_path)])
    assert listed.exit_code == 0 and long_id in listed.output
    shown = CliRunner().invoke(cli, ["show", long_id, "--root", str(tmp_path)])
    assert shown.exit_code == 0, shown.output
