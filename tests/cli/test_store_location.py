"""Where the store is when nobody says (memstore.location): --root, then MEMSTORE_ROOT, then the
nearest VT Code workspace's .vtcode/, else one per-user store, the same from every directory;
`memstore path` names it and says why, and the commands use it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

import memstore
from memstore.cli import cli
from memstore.location import RootReason, default_root, find_vtcode_workspace, locate_store, user_store_path


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    """A home directory and XDG data directory of their own, as a fresh user account has."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_DATA_HOME", str(home / ".local" / "share"))
    monkeypatch.delenv("MEMSTORE_ROOT", raising=False)
    return home


def memstore_path(cwd: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """`memstore path` run as a person runs it: its own process, in ``cwd``."""
    return subprocess.run(
        [sys.executable, "-m", "memstore", "path", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
        check=False,
    )


def test_path_names_the_same_per_user_store_from_any_directory(home, tmp_path):
    """Outside any VT Code workspace, every directory gets the one per-user store
    ($XDG_DATA_HOME/memstore), and the reason says it is the per-user default."""
    elsewhere = tmp_path / "projects" / "a" / "deep"
    elsewhere.mkdir(parents=True)
    expected = str(home / ".local" / "share" / "memstore")
    seen = set()
    for cwd in (home, tmp_path, elsewhere, Path("/")):
        result = memstore_path(cwd)
        assert result.returncode == 0, result.stderr
        seen.add(result.stdout.strip())
        assert "per-user" in result.stderr
    assert seen == {expected}
    data = json.loads(memstore_path(elsewhere, "--json").stdout)
    assert data == {"path": expected, "reason": "user", "why": data["why"], "exists": False}


def test_path_inside_a_vtcode_workspace_names_its_vtcode_directory(home, tmp_path):
    """In a VT Code workspace, or any directory below it, the store is the workspace's
    .vtcode/ (the nearest one when workspaces nest)."""
    project = tmp_path / "src" / "app"
    (project / ".vtcode").mkdir(parents=True)
    (project / "lib" / "pkg").mkdir(parents=True)
    inner = project / "lib" / ".vtcode"
    for cwd in (project, project / "lib" / "pkg"):
        result = memstore_path(cwd)
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == str(project / ".vtcode")
        assert f"VT Code workspace of {project}" in result.stderr
    inner.mkdir()
    assert memstore_path(project / "lib" / "pkg").stdout.strip() == str(inner)
    assert json.loads(memstore_path(project, "--json").stdout)["reason"] == "workspace"


def test_explicit_choices_win_in_order(home, tmp_path):
    """--root beats MEMSTORE_ROOT, which beats a workspace; an empty MEMSTORE_ROOT is unset."""
    project = tmp_path / "proj"
    (project / ".vtcode").mkdir(parents=True)
    env_store = tmp_path / "from-env"
    by_env = memstore_path(project, env={"MEMSTORE_ROOT": str(env_store)})
    assert by_env.stdout.strip() == str(env_store) and "MEMSTORE_ROOT is set" in by_env.stderr
    by_option = memstore_path(project, "--root", str(tmp_path / "opt"), env={"MEMSTORE_ROOT": str(env_store)})
    assert by_option.stdout.strip() == str(tmp_path / "opt") and "--root" in by_option.stderr
    empty = memstore_path(project, env={"MEMSTORE_ROOT": ""})
    assert empty.stdout.strip() == str(project / ".vtcode")
    relative = memstore_path(project, "--root", "here")
    assert relative.stdout.strip() == str(project / "here")  # made absolute where it was given


def test_the_homes_own_vtcode_is_a_workspace_only_when_it_holds_sessions(home, tmp_path):
    """~/.vtcode is VT Code's per-user configuration: below home it is not taken for a
    workspace store, unless it holds sessions (VT Code was run in the home directory)."""
    (home / ".vtcode").mkdir()
    below = home / "code" / "thing"
    below.mkdir(parents=True)
    assert find_vtcode_workspace(below) is None
    assert default_root(cwd=below, environ={}) == (user_store_path(), RootReason.USER)
    (home / ".vtcode" / "sessions").mkdir()
    assert find_vtcode_workspace(below) == home / ".vtcode"
    assert default_root(cwd=below, environ={})[1] is RootReason.WORKSPACE


def test_a_vtcode_file_is_no_workspace(home, tmp_path):
    """Only a directory named .vtcode marks a workspace."""
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / ".vtcode").write_text("not a directory")
    assert find_vtcode_workspace(tmp_path / "p") is None


def test_store_with_no_argument_uses_the_default(home, tmp_path, monkeypatch):
    """Store() resolves the same default as the command line, and says why."""
    monkeypatch.chdir(tmp_path)
    store = memstore.Store()
    assert store.path == home / ".local" / "share" / "memstore" and store.location.reason is RootReason.USER
    (tmp_path / ".vtcode").mkdir()
    assert memstore.Store().path == tmp_path / ".vtcode"
    monkeypatch.setenv("MEMSTORE_ROOT", str(tmp_path / "env"))
    assert memstore.Store().location == locate_store(None)
    assert memstore.Store().path == tmp_path / "env"
    assert memstore.Store("~/x").path == home / "x"  # explicit, ~ expanded


def test_the_readme_quick_start_writes_and_serves_the_per_user_store(home, tmp_path, monkeypatch):
    """`memstore demo && memstore serve` with no --root: both use the per-user store, from
    whatever directory; demo's next step names no --root, and serve says which store."""
    from memstore.explorer import server

    served = []
    monkeypatch.setattr(server, "_run_server", lambda app, host, port: served.append((host, port)))
    monkeypatch.setattr(server, "check_port", lambda host, port: None)  # port 8001 is never bound here
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    demo = runner.invoke(cli, ["demo", "--sessions", "4"])
    assert demo.exit_code == 0, demo.output
    store = home / ".local" / "share" / "memstore"
    assert (store / "sessions" / "demo" / "events.jsonl").is_file()
    assert f"demo store in {store} (the per-user store" in demo.stdout
    assert "next: memstore serve   (then open http://127.0.0.1:8001/-/memstore)" in demo.stdout
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    serve = runner.invoke(cli, ["serve"])
    assert serve.exit_code == 0, serve.output
    assert served == [("127.0.0.1", 8001)] and f"store {store}" in serve.stderr
    assert (store / "catalog.db").is_file()


def test_a_missing_default_store_says_which_store_and_why(home, tmp_path, monkeypatch):
    """A command reading a store that is not there names the store it looked for and why."""
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli, ["sessions"])
    assert result.exit_code == 2
    assert f"no store at {home / '.local' / 'share' / 'memstore'} (the per-user store" in result.stderr
    assert "memstore demo" in result.stderr


def test_import_and_retention_say_which_store(home, tmp_path, monkeypatch):
    """What import wrote into, and what retention looked at, is named with the reason, so
    that two directories using two stores cannot go unnoticed."""
    monkeypatch.chdir(tmp_path)
    store = home / ".local" / "share" / "memstore"
    logs = tmp_path / "logs"
    logs.mkdir()
    result = CliRunner().invoke(cli, ["import", str(logs)])
    assert result.exit_code == 0, result.output
    assert f"into {store} (the per-user store)" in result.stdout
    (tmp_path / "proj" / ".vtcode" / "sessions").mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "proj")
    retention = CliRunner().invoke(cli, ["retention"])
    assert retention.exit_code == 0, retention.output
    assert f"from {tmp_path / 'proj' / '.vtcode'} (the VT Code workspace of {tmp_path / 'proj'})" in retention.stdout
