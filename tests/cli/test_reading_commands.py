"""The command line for reading: `show` prints a turn for a person (and JSON / JSON Lines for
machines), `sessions` lists title, agent, model, turns, tokens, cost and time, search hits say
how to open them (the explorer's URL and the `memstore show` command), and every command takes
-h, -v/-q and one spelling of a result limit."""

from __future__ import annotations

import json
import re

import pytest
from click.testing import CliRunner

import memstore
from memstore.cli import cli
from memstore.explorer.urls import Urls

SID = "run-42"
FAILING_OUTPUT = "".join(f"test case_{i} ... ok\n" for i in range(30)) + (
    "test store::append_roundtrip ... FAILED\n\ntest result: FAILED. 30 passed; 1 failed\n"
)
DIFF = "--- a/src/store.rs\n+++ b/src/store.rs\n@@ -1,2 +1,2 @@\n-    let n = 1;\n+    let n = 2;\n"


def run(*args, input=None):
    return CliRunner().invoke(cli, [str(a) for a in args], input=input)


@pytest.fixture
def store(tmp_path):
    """One session of a Claude model (priced by the table), with a prompt, a failing command, a
    file change and an answer in turn 1, and a turn of a model the table does not know."""
    with memstore.open_session(tmp_path, SID) as log:
        log.append(
            {"type": "thread.started", "thread_id": SID, "source": {"agent": "claude", "cwd": "/home/dev/src/store"}},
            ts="2026-11-03T10:00:00.000Z",
        )
        log.append({"type": "turn.started"}, ts="2026-11-03T10:00:01.000Z")
        log.append(
            {
                "type": "item.completed",
                "item": {"id": "u", "type": "user_message", "text": "Why does append_roundtrip fail?"},
            },
            ts="2026-11-03T10:00:01.500Z",
        )
        log.append(
            {
                "type": "item.completed",
                "item": {
                    "id": "c",
                    "type": "command_execution",
                    "command": "cargo test",
                    "aggregated_output": FAILING_OUTPUT,
                    "exit_code": 101,
                    "status": "failed",
                },
            },
            ts="2026-11-03T10:00:40.000Z",
        )
        log.append(
            {
                "type": "item.completed",
                "item": {
                    "id": "f",
                    "type": "file_change",
                    "status": "completed",
                    "changes": [{"path": "src/store.rs", "kind": "update"}],
                    "unified_diff": DIFF,
                    "additions": 1,
                    "deletions": 1,
                },
            },
            ts="2026-11-03T10:01:10.000Z",
        )
        log.append(
            {
                "type": "item.completed",
                "item": {"id": "a", "type": "agent_message", "text": "The counter was never incremented; fixed."},
            },
            ts="2026-11-03T10:01:20.000Z",
        )
        log.append(
            {
                "type": "turn.completed",
                "model": "claude-sonnet-4-5",
                "usage": {"input_tokens": 12000, "cached_input_tokens": 8000, "output_tokens": 900},
            },
            ts="2026-11-03T10:02:31.000Z",
        )
        log.append({"type": "turn.started"}, ts="2026-11-03T10:05:00.000Z")
        log.append(
            {
                "type": "turn.completed",
                "model": "no-such-model-anywhere",
                "usage": {"input_tokens": 100, "output_tokens": 10},
            },
            ts="2026-11-03T10:05:09.000Z",
        )
    return tmp_path


def expected_turn_cost() -> float:
    from memstore.pricing import price_usage

    cost = price_usage(
        "claude-sonnet-4-5", (12000, 8000, 0, 900), provider_hint="claude", when="2026-11-03T10:02:31.000Z"
    )
    return float(cost.usd)


def test_show_turn_is_for_a_person(store):
    """The prompt, each command with its exit code and the tail of its output, the file
    change, the answer, then tokens and the cost priced from the table."""
    result = run("show", SID, "--turn", 1, "--root", store)
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "turn 1: completed" in out and "2m 30s" in out
    assert "prompt:\n  Why does append_roundtrip fail?" in out
    assert "$ cargo test  [exit 101]" in out
    assert "test result: FAILED. 30 passed; 1 failed" in out and "test case_0 ... ok" not in out  # the tail only
    assert "lines above" in out
    assert "changed src/store.rs (update, +1 -1)" in out
    assert "answer:\n  The counter was never incremented; fixed." in out
    assert "12,000 in (8,000 cached), 900 out" in out
    assert f"${expected_turn_cost():.3f} (estimated, claude-sonnet-4-5)" in out
    assert out.index("prompt:") < out.index("$ cargo test") < out.index("changed src/") < out.index("answer:")
    more = run("show", SID, "--turn", 1, "--tail", 40, "--root", store).stdout
    assert "test case_0 ... ok" in more
    none = run("show", SID, "--turn", 1, "--tail", 0, "--root", store).stdout
    assert "| " not in none and "$ cargo test" in none


def test_show_turn_says_why_a_cost_is_missing(store):
    """A turn of a model the price table does not know has no figure, and says why (never $0)."""
    out = run("show", SID, "--turn", 2, "--root", store).stdout
    assert "cost - (model 'no-such-model-anywhere' is not in the price table)" in out and "$0" not in out


def test_show_keeps_machine_output_and_exit_codes(store):
    """--jsonl is the turn's events as JSON Lines (what `show --turn` printed before), --json
    the same as one array; a missing turn is exit 1, a missing session exit 2."""
    with memstore.read_session(store, SID) as reader:
        events = reader.reconstruct_turn(1)
        every = list(reader.iter_events())
    lines = run("show", SID, "--turn", 1, "--jsonl", "--root", store).stdout.splitlines()
    assert [json.loads(line) for line in lines] == events
    assert json.loads(run("show", SID, "--turn", 1, "--json", "--root", store).stdout) == events
    whole = run("show", SID, "--jsonl", "--root", store).stdout.splitlines()
    assert [json.loads(line) for line in whole] == every
    assert run("show", SID, "--turn", 3, "--root", store).exit_code == 1
    assert run("show", SID, "--turn", 3, "--jsonl", "--root", store).exit_code == 1
    assert run("show", "nope", "--root", store).exit_code == 2


def test_show_session_lists_turns_with_cost(store):
    result = run("show", SID, "--root", store)
    assert result.exit_code == 0
    assert "agent claude" in result.stdout and "cwd /home/dev/src/store" in result.stdout
    assert f"cost ${expected_turn_cost():.3f}+ (estimated)" in result.stdout  # + : turn 2 is unpriced
    assert "claude-sonnet-4-5" in result.stdout and f"memstore show {SID} --turn N" in result.stdout
    data = json.loads(run("show", SID, "--json", "--root", store).stdout)
    assert data["manifest"]["turn_count"] == 2 and len(data["turns"]) == 2
    assert data["cost"]["priced"] == 1 and data["cost"]["unpriced"] == 1
    assert data["cost"]["usd"] == pytest.approx(expected_turn_cost())


@pytest.fixture
def local_tz(monkeypatch):
    """The local time zone is India's (UTC+05:30, no daylight saving) for one test."""
    import time

    monkeypatch.setenv("TZ", "Asia/Kolkata")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def test_sessions_shows_title_agent_model_turns_tokens_cost_and_time(store, local_tz):
    """Columns aligned; the update time in the local time zone and how long ago; cost in
    dollars ("+" when some turn is unpriced, "-" when none is priced)."""
    with memstore.open_session(store, "quiet") as log:  # no model, no tokens: no cost, no title
        log.append({"type": "turn.started"}, ts="2026-11-01T09:00:00.000Z")
        log.append({"type": "turn.completed", "usage": {}}, ts="2026-11-01T09:00:05.000Z")
    result = run("sessions", "--root", store)
    assert result.exit_code == 0, result.output
    header, first, second = result.stdout.splitlines()
    assert header.split() == ["session", "title", "agent", "model", "turns", "tokens", "cost", "updated"]
    assert first.startswith(SID) and "Why does append_roundtrip fail?" in first and "claude" in first
    assert "no-such-model-anywhere" in first  # the model of the last turn
    assert "2026-11-03 15:35 (" in first and "13.0k" in first and f"${expected_turn_cost():.3f}+" in first
    assert re.search(r"2026-11-03 15:35 \(\d+ (days|months|years) ago\)$", first)
    assert second.startswith("quiet") and re.search(r"\s-  2026-11-01 14:30 \(", second)
    assert header.index("updated") == first.index("2026-11-03") == second.index("2026-11-01")  # aligned
    assert header.index("turns") + len("turns") == first.index(" 2 ") + 2  # numbers right-aligned
    rows = json.loads(run("sessions", "--root", store, "--json").stdout)
    assert [r["session_id"] for r in rows] == [SID, "quiet"]
    assert rows[0]["title"] == "Why does append_roundtrip fail?" and rows[0]["agent"] == "claude"
    assert rows[0]["turn_count"] == 2 and rows[0]["input_tokens"] == 12100 and rows[0]["output_tokens"] == 910
    assert rows[0]["cost_usd"] == pytest.approx(expected_turn_cost()) and rows[0]["cost_unpriced_turns"] == 1
    assert [r["session_id"] for r in json.loads(run("sessions", "-n", 1, "--root", store, "--json").stdout)] == [SID]


def test_show_limit_lists_the_last_turns(store):
    """`show -n N` lists the last N turns and says how many earlier ones it left out; the
    session's cost is still the whole session's."""
    whole = run("show", SID, "--root", store).stdout
    last = run("show", SID, "-n", 1, "--root", store)
    assert last.exit_code == 0, last.output
    rows = [line.split()[0] for line in last.stdout.splitlines() if re.match(r"^\s+\d+  ", line)]
    assert rows == ["2"] and "(1 earlier turn not listed" in last.stdout
    assert whole.splitlines()[1] == last.stdout.splitlines()[1]  # agent, cwd and the session's cost
    data = json.loads(run("show", SID, "--limit", 1, "--json", "--root", store).stdout)
    assert [t["number"] for t in data["turns"]] == [2] and data["cost"]["priced"] == 1


def test_sessions_lists_what_the_library_lists(store):
    """The command lists Store.sessions (sessions whose manifest is gone included)."""
    (store / "sessions" / SID / "manifest.json").unlink()
    listed = [s.session_id for s in memstore.Store(store).sessions()]
    rows = json.loads(run("sessions", "--root", store, "--json").stdout)
    assert [r["session_id"] for r in rows] == listed == [SID]


def test_search_hits_say_how_to_open_them(store, local_tz):
    """Each hit says where and when it is (local time, how long ago) and the `memstore show`
    command that opens its turn in the same store; with no explorer known, no URL (null in
    --json) and a hint on stderr; with a base URL configured (option or environment), the
    explorer URL of its turn at its event, built by the explorer's own Urls."""
    result = run("search", "append_roundtrip", "--root", store)
    assert result.exit_code == 0, result.output
    with memstore.read_session(store, SID) as reader:
        seq = next(r.seq for r in reader.iter_records() if r.event.get("item", {}).get("id") == "c")
    assert f"memstore show {SID} --turn 1 --root {store}" in result.stdout
    assert f"{SID} turn 1 event {seq}" in result.stdout and "2026-11-03 15:30 (" in result.stdout
    assert "http" not in result.stdout and "memstore serve" in result.stderr
    hits = json.loads(run("search", "append_roundtrip", "--root", store, "--json").stdout)
    assert hits and all(h["url"] is None for h in hits)
    assert all(h["show"].startswith(f"memstore show {SID} --turn ") for h in hits)
    url = Urls("http://box:9000/x/").turn(SID, 1, anchor=seq)
    assert url == f"http://box:9000/x/-/memstore/sessions/{SID}/turns/1#e{seq}"
    configured = run("search", "append_roundtrip", "--root", store, "--explorer-url", "http://box:9000/x/")
    assert url in configured.stdout and "memstore serve" not in configured.stderr
    other = json.loads(
        CliRunner()
        .invoke(
            cli,
            ["search", "append_roundtrip", "--root", str(store), "--json"],
            env={"MEMSTORE_EXPLORER_URL": "http://box:9000/x/"},
        )
        .stdout
    )
    assert {h["url"] for h in other if h["seq"] == seq} == {url}


def test_search_hit_lines_are_aligned(store):
    """Score, place, kind and time are columns: each starts at the same offset on every hit."""
    lines = run("search", "append_roundtrip test", "--root", store).stdout.splitlines()
    heads = [line for line in lines if re.match(r"^\s*\d+\.\d{3}  ", line)]
    assert len(heads) >= 2
    assert len({line.index(SID) for line in heads}) == 1
    assert len({re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d", line).start() for line in heads}) == 1


def _start_serve(store):
    """A real `memstore serve --port 0` on ``store``, in its own process; returns it and the URL
    it announced once that URL answers."""
    import os
    import subprocess
    import sys
    import time
    import urllib.request
    from pathlib import Path

    env = {**os.environ, "PYTHONPATH": str(Path(memstore.__file__).resolve().parent.parent)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "memstore", "serve", "--root", str(store), "--port", "0", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        text=True,
    )
    text = ""
    while not text.rstrip().endswith("}"):
        line = proc.stdout.readline()
        assert line, proc.stderr.read()
        text += line
    url = json.loads(text)["url"]
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(url + ".json", timeout=2):
                return proc, url
        except OSError:
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
            time.sleep(0.2)


@pytest.mark.slow  # a real Datasette server in its own process
def test_search_links_to_the_explorer_serving_the_store_while_it_runs(store):
    """While a real `memstore serve` (on a free port) serves the store, hits link to it, at the
    port it announced; once it is stopped with Ctrl-C, its record is gone and hits carry no
    link to it (a server killed without a chance to clean up: test_explorer_record.py)."""
    import signal
    import urllib.request

    from memstore.location import explorer_record_path

    proc, announced = _start_serve(store)
    try:
        assert ":0/" not in announced  # port 0 is resolved to the port actually served
        hits = json.loads(run("search", "append_roundtrip", "--root", store, "--json").stdout)
        base = announced[: -len("-/memstore")]
        assert hits and all(h["url"].startswith(base + "-/memstore/sessions/") for h in hits)
        with urllib.request.urlopen(hits[0]["url"].split("#")[0], timeout=10) as page:
            assert page.status == 200 and "append_roundtrip" in page.read().decode()
        other_store = store / "elsewhere"
        with memstore.open_session(other_store, "x") as log:
            log.append({"type": "item.completed", "item": {"id": "m", "type": "agent_message", "text": "roundtrip"}})
        assert all(
            h["url"] is None for h in json.loads(run("search", "roundtrip", "--root", other_store, "--json").stdout)
        )
        assert explorer_record_path(store).is_file()
        proc.send_signal(signal.SIGINT)  # Ctrl-C
        assert proc.wait(timeout=60) == 0
        assert not explorer_record_path(store).exists()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        proc.stdout.close()
        proc.stderr.close()
    after = json.loads(run("search", "append_roundtrip", "--root", store, "--json").stdout)
    assert after and all(h["url"] is None for h in after)


def test_serve_records_itself_while_it_serves_and_forgets_after(store, monkeypatch):
    """`memstore serve` records its URL for its store while it serves and removes the record
    when it stops; port 0 becomes a free port, announced and recorded."""
    from memstore.explorer import server
    from memstore.location import explorer_record_path

    seen = []

    def run_server(app, host, port):
        seen.append((port, json.loads(explorer_record_path(store).read_bytes())))

    monkeypatch.setattr(server, "_run_server", run_server)
    result = run("serve", "--root", store, "--port", 0, "--json")
    assert result.exit_code == 0, result.output
    ((port, record),) = seen
    assert port > 0 and json.loads(result.stdout)["port"] == port
    assert record["base_url"] == f"http://localhost:{port}/" and record["root"] == str(store)
    assert not explorer_record_path(store).exists()
    seen.clear()
    assert run("serve", "--root", store, "--port", 0, "--host", "0.0.0.0").exit_code == 0
    ((port, record),) = seen
    assert record["base_url"] == f"http://localhost:{port}/" and record["host"] == "0.0.0.0"


def test_search_command_quotes_ids_the_shell_would_split(tmp_path):
    sid = "my session; rm -rf"
    with memstore.open_session(tmp_path, sid) as log:
        log.append({"type": "turn.started"})
        log.append({"type": "item.completed", "item": {"id": "m", "type": "agent_message", "text": "zanzibar"}})
        log.append({"type": "turn.completed", "usage": {}})
    (hit,) = json.loads(
        run("search", "zanzibar", "--root", tmp_path, "--json", "--explorer-url", "http://127.0.0.1:8001/").stdout
    )
    assert hit["show"].startswith("memstore show 'my session; rm -rf' --turn 1")
    assert "/sessions/my%20session%3B%20rm%20-rf/turns/1#e" in hit["url"]


def test_one_name_for_a_result_limit(store):
    """-n / --limit everywhere; search's old --max-results still works, hidden from the help."""
    for command in ("sessions", "search", "facts", "show"):
        params = {opt for p in cli.commands[command].params if not getattr(p, "hidden", False) for opt in p.opts}
        assert {"-n", "--limit"} <= params, command
    assert "--max-results" not in run("search", "-h").stdout
    for spelling in ("-n", "--limit", "--max-results"):
        hits = json.loads(run("search", "test", spelling, 1, "--root", store, "--json").stdout)
        assert len(hits) == 1, spelling


def every_command(group=cli, path=()):
    for name, command in group.commands.items():
        yield (*path, name), command
        if hasattr(command, "commands"):
            yield from every_command(command, (*path, name))


@pytest.mark.parametrize("path", [p for p, _ in every_command()], ids=" ".join)
def test_every_command_takes_h_and_verbosity(path):
    result = run(*path, "-h")
    assert result.exit_code == 0 and "Usage:" in result.stdout, result.output
    assert "-v, --verbose" in result.stdout and "-q, --quiet" in result.stdout


def test_warnings_are_logged_with_a_prefix_and_verbosity_sets_the_level(store, tmp_path):
    """What the library logs reaches stderr as `memstore: <level>: ...`; -q hides warnings,
    -v shows info; the logger is as it was after the command."""
    import logging

    from memstore.pack import write_audit_pack

    other = tmp_path / "other-pack.json"
    with memstore.open_session(store, "other") as log:
        log.append({"type": "turn.started"})
    write_audit_pack(store, "other", other)
    level = logging.getLogger("memstore").level
    warned = run("verify", SID, other, "--root", store)
    assert f"memstore: warning: {other} is a pack of session 'other', not '{SID}'" in warned.stderr
    assert warned.exit_code == 1
    quiet = run("verify", SID, other, "--root", store, "-q")
    assert "warning" not in quiet.stderr and quiet.exit_code == 1
    assert run("-q", "verify", SID, other, "--root", store).stderr.count("warning") == 0
    assert logging.getLogger("memstore").level == level and not any(
        type(h).__name__ == "_StderrHandler" for h in logging.getLogger("memstore").handlers
    )


def test_show_aligns_the_turns_and_lists_none_for_a_session_without_turns(store, tmp_path):
    """The turns table is aligned columns (numbers right-aligned, with thousands separators);
    a session with no turn yet shows its header and no rows, without failing."""
    lines = run("show", SID, "--root", store).stdout.splitlines()
    header = next(line for line in lines if line.startswith("turn "))
    rows = lines[lines.index(header) + 1 : lines.index(header) + 3]
    assert all(len(row) >= header.index("model") for row in rows)
    assert "12,000" in rows[0] and rows[0].index("12,000") + len("12,000") == header.index("input") + len("input")
    assert rows[0].index("claude-sonnet-4-5") == rows[1].index("no-such-model-anywhere") == header.index("model")
    empty_root = tmp_path / "empty"
    with memstore.open_session(empty_root, "fresh") as log:
        log.append({"type": "thread.started", "thread_id": "fresh"})
    result = run("show", "fresh", "--root", empty_root)
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[-1].split() == [
        "turn",
        "status",
        "events",
        "input",
        "cached",
        "output",
        "cost",
        "model",
        "started",
    ]
