"""`memstore serve` (options, defaults, mistakes) and `memstore doctor` (checks and --fix)."""

from __future__ import annotations

import asyncio
import json
import os
import socket

import pytest
from click.testing import CliRunner

import memstore
import memstore.locks
from memstore.catalog import refresh_catalog
from memstore.cli import cli
from memstore.demo import write_demo_store
from memstore.explorer import server


@pytest.fixture
def served(monkeypatch):
    """Replace the server loop: record what would be served instead of serving it."""
    calls = []

    def fake_run(app, host, port):
        calls.append({"app": app, "host": host, "port": port})

    monkeypatch.setattr(server, "_run_server", fake_run)
    return calls


def small_store(root, sessions=("one", "two")):
    for sid in sessions:
        with memstore.open_session(root, sid) as log:
            log.append({"type": "turn.started"})
            log.append({"type": "item.completed", "item": {"id": "m", "type": "agent_message", "text": f"hi {sid}"}})
            log.append({"type": "turn.completed", "usage": {"input_tokens": 5, "output_tokens": 1}})
    return root


def test_serve_defaults_refresh_the_catalog_and_bind_localhost(tmp_path, served, monkeypatch):
    checked = []
    # The default port is asked for, never bound: a real `memstore serve` may be running on it.
    monkeypatch.setattr(server, "check_port", lambda host, port: checked.append((host, port)))
    small_store(tmp_path)
    result = CliRunner().invoke(cli, ["serve", "--root", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert served[0]["host"] == "127.0.0.1" and served[0]["port"] == 8001 and checked == [("127.0.0.1", 8001)]
    assert "http://localhost:8001/-/memstore" in result.output
    assert (tmp_path / "catalog.db").is_file()
    app = served[0]["app"]

    async def get(path):
        import httpx

        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://localhost") as client:
            return await client.get(path)

    home = asyncio.run(get("/-/memstore.json"))
    assert home.status_code == 200 and {s["session_id"] for s in home.json()["sessions"]} == {"one", "two"}
    canned = asyncio.run(get("/catalog/tokens_by_day.json?_shape=array"))
    assert canned.status_code == 200  # metadata.yml is loaded


def test_serve_options_and_environment(tmp_path, served, monkeypatch):
    small_store(tmp_path)
    result = CliRunner().invoke(
        cli,
        ["serve", "--host", "0.0.0.0", "--port", "0", "--refresh-interval", "0"],
        env={"MEMSTORE_ROOT": str(tmp_path)},
    )
    assert result.exit_code == 0, result.output
    assert served[-1]["host"] == "0.0.0.0" and served[-1]["port"] > 0  # port 0: a free port, announced
    assert f"http://0.0.0.0:{served[-1]['port']}/-/memstore" in result.output
    metadata = tmp_path / "meta.yml"
    metadata.write_text("title: custom title\n")
    result = CliRunner().invoke(cli, ["serve", "--root", str(tmp_path), "--port", "0", "--metadata", str(metadata)])
    assert result.exit_code == 0, result.output
    assert "--plugins-dir" in CliRunner().invoke(cli, ["serve", "--help"]).output
    assert "Examples" in CliRunner().invoke(cli, ["serve", "--help"]).output


def test_serve_mistakes_get_one_clear_line(tmp_path, served):
    missing = CliRunner().invoke(cli, ["serve", "--root", str(tmp_path / "nothing")])
    assert missing.exit_code == 2 and "memstore demo" in missing.output
    assert len(missing.output.strip().splitlines()) == 1
    small_store(tmp_path)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        busy = CliRunner().invoke(cli, ["serve", "--root", str(tmp_path), "--port", str(port)])
    assert busy.exit_code == 2 and f"cannot serve on 127.0.0.1:{port}" in busy.output
    bad = CliRunner().invoke(cli, ["serve", "--root", str(tmp_path), "--port", "99999"])
    assert bad.exit_code == 2 and "--port" in bad.output
    assert not served


def test_doctor_on_a_healthy_store(tmp_path):
    write_demo_store(tmp_path)
    refresh_catalog(tmp_path)
    result = CliRunner().invoke(cli, ["doctor", "--root", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "30 sessions checked: ok" in result.output
    data = json.loads(CliRunner().invoke(cli, ["doctor", "--root", str(tmp_path), "--json"]).output)
    assert data["ok"] and data["sessions"] == 30 and data["problems"] == []


def test_doctor_finds_what_is_wrong_and_fix_repairs_it(tmp_path):
    small_store(tmp_path, ("torn", "loose", "noindex", "stale", "gone"))
    refresh_catalog(tmp_path)
    sessions = tmp_path / "sessions"
    with open(sessions / "torn" / "events.jsonl", "ab") as f:
        f.write(b'{"schema_version":"0.18.0","seq":9,"ev')
    os.chmod(sessions / "loose" / "events.jsonl", 0o644)
    os.chmod(sessions / "loose", 0o755)
    for path in (sessions / "noindex" / "index").glob("session.db*"):
        path.unlink()
    with memstore.open_session(tmp_path, "stale") as log:  # grew after the catalog's refresh
        log.append({"type": "turn.started"})
        log.append({"type": "turn.completed", "usage": {}})
    memstore.locks.remove_session_directory(tmp_path, sessions / "gone")
    result = CliRunner().invoke(cli, ["doctor", "--root", str(tmp_path), "--json"])
    assert result.exit_code == 1, result.output
    problems = {(p["session"], p["check"]) for p in json.loads(result.output)["problems"]}
    assert ("torn", "torn_tail") in problems
    assert ("loose", "permissions") in problems
    assert ("noindex", "index") in problems
    assert ("stale", "catalog") in problems
    assert ("gone", "catalog") in problems
    text = CliRunner().invoke(cli, ["doctor", "--root", str(tmp_path)])
    assert "torn: torn_tail:" in text.output and "[run with --fix]" in text.output
    fixed = CliRunner().invoke(cli, ["doctor", "--root", str(tmp_path), "--fix"])
    assert fixed.exit_code == 0, fixed.output
    assert "[fixed]" in fixed.output
    again = CliRunner().invoke(cli, ["doctor", "--root", str(tmp_path), "--json"])
    assert again.exit_code == 0 and json.loads(again.output)["problems"] == [], again.output
    assert list(sessions.glob("torn/events.jsonl.torn-*"))  # the cut bytes are kept
    assert oct(os.stat(sessions / "loose" / "events.jsonl").st_mode & 0o777) == "0o600"


def test_doctor_leaves_a_live_session_to_its_writer(tmp_path):
    small_store(tmp_path, ("busy",))
    refresh_catalog(tmp_path)
    log = memstore.open_session(tmp_path, "busy")
    try:
        log.append({"type": "turn.started"})
        log.flush()
        result = CliRunner().invoke(cli, ["doctor", "--root", str(tmp_path), "--json", "--fix"])
        data = json.loads(result.output)
        assert data["live"] == ["busy"]
        assert all(p["check"] == "catalog" for p in data["problems"])
    finally:
        log.close()


def test_doctor_mistakes(tmp_path):
    result = CliRunner().invoke(cli, ["doctor", "--root", str(tmp_path / "nope")])
    assert result.exit_code == 2 and "no such store directory" in result.output
    assert "Examples" in CliRunner().invoke(cli, ["doctor", "--help"]).output
