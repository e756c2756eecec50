import orjson
from click.testing import CliRunner
from support import write_session_files

import memstore
from memstore import Milestone, MilestoneStatus, ProgressLedger, save_progress
from memstore.cli import cli

EVENTS = b'{"schema_version":"0.18.0","event":{"type":"turn.started"}}\n'


def make_session(root, session_id="s1"):
    return write_session_files(root, session_id, events=EVENTS)


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


# --------------------------------------------------------------------------------------------
# progress


def test_progress_prints_the_markdown(tmp_path):
    ledger = ProgressLedger.new("s1", "ship it")
    ledger.set_milestones([Milestone("1", "design", MilestoneStatus.DONE), Milestone("2", "build")])
    save_progress(tmp_path, "s1", ledger)
    result = run("progress", "s1", "--root", tmp_path)
    assert result.exit_code == 0, result.output
    assert result.output == ledger.to_markdown()
    assert "**Completion:** 50%" in result.output


def test_progress_json_prints_the_ledger(tmp_path):
    ledger = ProgressLedger.new("s1", "ship it")
    ledger.note_stall()
    save_progress(tmp_path, "s1", ledger)
    result = run("progress", "s1", "--root", tmp_path, "--json")
    assert result.exit_code == 0, result.output
    data = orjson.loads(result.output)
    assert data == orjson.loads(ledger.to_json())
    assert '"confidence": 0.9' in result.output


def test_progress_reads_root_from_environment(tmp_path, monkeypatch):
    save_progress(tmp_path, "s1", ProgressLedger.new("s1", "env goal"))
    monkeypatch.setenv("MEMSTORE_ROOT", str(tmp_path))
    result = CliRunner().invoke(cli, ["progress", "s1"])
    assert result.exit_code == 0 and "**Goal:** env goal" in result.output


def test_progress_without_a_ledger_exits_1_with_a_message(tmp_path):
    with memstore.open_session(tmp_path, "nothing") as log:
        log.append({"type": "turn.started"})
    result = run("progress", "nothing", "--root", tmp_path)
    assert result.exit_code == 1
    assert "no progress ledger for session 'nothing'" in result.output
    assert "progress.json" in result.output


def test_progress_of_a_missing_session_exits_2_as_every_command_does(tmp_path):
    (tmp_path / "sessions").mkdir()
    result = run("progress", "nosuch", "--root", tmp_path)
    assert result.exit_code == 2 and "no session 'nosuch'" in result.output


def test_progress_with_a_broken_ledger_exits_2(tmp_path):
    path = tmp_path / "sessions" / "s1" / "derived" / "progress.json"
    path.parent.mkdir(parents=True)
    path.write_bytes(b"{broken")
    result = run("progress", "s1", "--root", tmp_path)
    assert result.exit_code == 2
    assert str(path) in result.output


# --------------------------------------------------------------------------------------------
# pack and verify


def test_pack_then_verify_exits_0(tmp_path):
    session_dir = make_session(tmp_path)
    result = run("pack", "s1", "--root", tmp_path)
    assert result.exit_code == 0, result.output
    assert str(session_dir / "derived" / "audit-pack.json") in result.output
    assert "2 files" in result.output
    result = run("verify", "s1", "--root", tmp_path)
    assert result.exit_code == 0, result.output
    assert result.output.strip() == "verified: 2 files match"


def test_pack_json_and_custom_output(tmp_path):
    make_session(tmp_path)
    out = tmp_path / "s1-pack.json"
    result = run("pack", "s1", "--root", tmp_path, "--output", out, "--json")
    assert result.exit_code == 0, result.output
    data = orjson.loads(result.output)
    assert data["path"] == str(out)
    assert [e["path"] for e in data["pack"]["entries"]] == ["events.jsonl", "manifest.json"]
    assert orjson.loads(out.read_bytes()) == data["pack"]
    result = run("verify", "s1", out, "--root", tmp_path, "--json")
    assert result.exit_code == 0
    assert orjson.loads(result.output) == {"verified": True, "mismatches": [], "missing": [], "unaccounted": []}


def test_verify_exits_1_when_tampered(tmp_path):
    session_dir = make_session(tmp_path)
    run("pack", "s1", "--root", tmp_path)
    (session_dir / "events.jsonl").write_bytes(EVENTS.replace(b"started", b"STARTED"))
    (session_dir / "manifest.json").unlink()
    (session_dir / "extra.txt").write_bytes(b"x")
    result = run("verify", "s1", "--root", tmp_path)
    assert result.exit_code == 1
    assert "mismatch: events.jsonl" in result.output
    assert "missing: manifest.json" in result.output
    assert "unaccounted (informational): extra.txt" in result.output
    assert "NOT verified: 1 mismatched, 1 missing" in result.output
    result = run("verify", "s1", "--root", tmp_path, "--json")
    assert result.exit_code == 1
    assert orjson.loads(result.output) == {
        "verified": False,
        "mismatches": ["events.jsonl"],
        "missing": ["manifest.json"],
        "unaccounted": ["extra.txt"],
    }


def test_verify_unaccounted_files_still_exit_0(tmp_path):
    session_dir = make_session(tmp_path)
    run("pack", "s1", "--root", tmp_path)
    (session_dir / "derived" / "new.json").write_bytes(b"{}")
    result = run("verify", "s1", "--root", tmp_path)
    assert result.exit_code == 0
    assert "unaccounted (informational): derived/new.json" in result.output


def test_verify_invalid_pack_exits_2(tmp_path):
    make_session(tmp_path)
    result = run("pack", "s1", "--root", tmp_path)
    path = tmp_path / "sessions" / "s1" / "derived" / "audit-pack.json"
    data = orjson.loads(path.read_bytes())
    data["entries"].append({"path": "../outside.json", "bytes": 0, "sha256": "0" * 64})
    path.write_bytes(orjson.dumps(data))
    result = run("verify", "s1", "--root", tmp_path)
    assert result.exit_code == 2
    assert "../outside.json" in result.output
    data["schema_version"] = 99
    path.write_bytes(orjson.dumps(data))
    result = run("verify", "s1", "--root", tmp_path)
    assert result.exit_code == 2
    assert "unsupported schema_version 99" in result.output


def test_verify_missing_pack_or_session_exits_2(tmp_path):
    make_session(tmp_path)
    result = run("verify", "s1", "--root", tmp_path)
    assert result.exit_code == 2
    assert "audit-pack.json" in result.output
    run("pack", "s1", "--root", tmp_path)
    pack = tmp_path / "sessions" / "s1" / "derived" / "audit-pack.json"
    result = run("verify", "gone", pack, "--root", tmp_path)
    assert result.exit_code == 2
    assert str(tmp_path / "sessions" / "gone") in result.output


def test_pack_missing_session_exits_2_naming_the_path(tmp_path):
    result = run("pack", "gone", "--root", tmp_path)
    assert result.exit_code == 2
    assert str(tmp_path / "sessions" / "gone") in result.output


def test_verify_usage_error_exits_2(tmp_path):
    result = run("verify", "--root", tmp_path)
    assert result.exit_code == 2


def test_verify_warns_when_the_pack_belongs_to_another_session(tmp_path):
    for sid in ("s1", "s2"):
        make_session(tmp_path, sid)
    pack_path = tmp_path / "s1-pack.json"
    CliRunner().invoke(cli, ["pack", "s1", "--root", str(tmp_path), "--output", str(pack_path)])
    result = CliRunner().invoke(cli, ["verify", "s2", str(pack_path), "--root", str(tmp_path)])
    assert "is a pack of session 's1', not 's2'" in result.stderr
