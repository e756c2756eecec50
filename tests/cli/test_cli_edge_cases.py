"""Adversarial review of the command line: each test is a bug found by attacking the commands,
kept so it stays fixed."""

from __future__ import annotations

import json
import os

import pytest
from click.testing import CliRunner

import memstore
from memstore.cli import cli


def run(*args, input=None, env=None):
    return CliRunner().invoke(cli, [str(a) for a in args], input=input, env=env)


def one_line_error(result, code: int, *needles: str) -> str:
    """The command failed with ``code``, printed one line on stderr (no traceback, nothing on
    stdout) that holds every needle; returns that line."""
    assert result.exit_code == code, (result.exit_code, result.output, result.exception)
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in result.output, result.stderr
    assert result.stdout == "", result.stdout
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


def json_error(result, code: int, *needles: str) -> dict:
    """The command failed with ``code`` and printed ``{"error": ...}`` on stderr."""
    assert result.exit_code == code, (result.exit_code, result.output, result.exception)
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert result.stdout == "", result.stdout
    data = json.loads(result.stderr)
    assert data["exit_code"] == code
    for needle in needles:
        assert needle in data["error"], (needle, data)
    return data


def write_session(root, sid="s", turns=1):
    with memstore.open_session(root, sid) as log:
        for _ in range(turns):
            log.append({"type": "turn.started"})
            log.append({"type": "turn.completed", "usage": {}})


def files_under(path) -> list[str]:
    return sorted(os.path.relpath(os.path.join(d, n), path) for d, dirs, names in os.walk(path) for n in dirs + names)


# --------------------------------------------------------------------------------------------
# show --turn with a number past SQLite's integers was an OverflowError traceback (exit 1).


def test_show_a_turn_number_too_large_for_sqlite_is_a_turn_not_found(tmp_path):
    write_session(tmp_path)
    huge = "99999999999999999999"
    one_line_error(run("show", "s", "--turn", huge, "--root", tmp_path), 1, f"turn {huge} not found")
    json_error(run("show", "s", "--turn", huge, "--root", tmp_path, "--json"), 1, huge)
    one_line_error(run("show", "s", "--turn", "9" * 5000, "--root", tmp_path), 1, "not found")


# --------------------------------------------------------------------------------------------
# Usage mistakes: click printed four lines (usage, hint, blank, error), and ignored --json when
# the mistake was in parsing (an unknown option, a bad value: --json was never processed).


@pytest.mark.parametrize(
    "args, needle",
    [
        (["show", "s", "--turn", "0"], "--turn"),
        (["show", "s", "--turn", "abc"], "--turn"),
        (["rebuild", "s", "--all"], "not both"),
        (["rebuild"], "--all"),
        (["sessions", "--bogus"], "--bogus"),
        (["search"], "QUERY"),
        (["nonsense-command"], "nonsense-command"),
        (["demo", "--sessions", "2"], "--sessions"),
    ],
)
def test_usage_mistakes_are_one_line_and_honour_json(tmp_path, args, needle):
    line = one_line_error(run(*args, "--root", tmp_path), 2, needle)
    assert line.startswith("Error: ") and "--help" in line
    json_error(run(*args, "--root", tmp_path, "--json"), 2, needle)
    if args[0] != "nonsense-command":  # --json first, before the mistake
        json_error(run(args[0], "--json", *args[1:], "--root", tmp_path), 2, needle)


def test_a_mistake_in_the_groups_own_options_is_one_line_too(tmp_path):
    one_line_error(run("--bogus", "sessions"), 2, "--bogus", "--help")
    json_error(run("--json", "sessions", "--root", tmp_path), 2, "--json")
    bare = run()
    assert "Commands:" in bare.output and "Error" not in bare.output


# --------------------------------------------------------------------------------------------
# pack of a missing session created <root>/sessions/<id>/derived/ (and the root itself) before
# finding out there was no session; `pin` then took that empty directory for a session.


def test_pack_and_verify_of_a_missing_session_create_nothing(tmp_path):
    write_session(tmp_path, "real")
    before = files_under(tmp_path)
    for args in (
        ["pack", "gone"],
        ["pack", "gone", "--output", tmp_path / "p.json"],
        ["verify", "gone"],
        ["verify", "gone", tmp_path / "p.json"],
        ["pack", "gone", "--json"],
        ["verify", "gone", "--json"],
    ):
        result = run(*args, "--root", tmp_path)
        if "--json" in args:
            json_error(result, 2, "no session 'gone'")
        else:
            one_line_error(result, 2, "no session 'gone'", str(tmp_path / "sessions" / "gone"))
        assert files_under(tmp_path) == before, args
    one_line_error(run("pin", "gone", "--root", tmp_path), 2, "no session 'gone'")
    nowhere = tmp_path / "nowhere"
    one_line_error(run("pack", "gone", "--root", nowhere), 2, "no store at")
    assert not nowhere.exists()
    # The real session still packs and verifies.
    assert run("pack", "real", "--root", tmp_path).exit_code == 0
    assert run("verify", "real", "--root", tmp_path).exit_code == 0


# --------------------------------------------------------------------------------------------
# A session id that is not valid UTF-8 (bytes the terminal could not decode reach Python as lone
# surrogates) made append create the session directory and then die in SQLite with a
# UnicodeEncodeError traceback.


@pytest.mark.parametrize("command", ["append", "show", "pack", "verify", "rebuild", "progress", "pin"])
def test_a_session_id_that_is_not_utf8_is_one_line_and_creates_nothing(tmp_path, command):
    write_session(tmp_path, "real")
    before = files_under(tmp_path)
    bad = "caf\udce9"  # b"caf\xe9" decoded with surrogateescape, as Python decodes argv
    result = run(command, bad, "--root", tmp_path, input='{"type": "turn.started"}\n')
    one_line_error(result, 2, "UTF-8")
    assert files_under(tmp_path) == before
    json_error(run(command, bad, "--root", tmp_path, "--json", input=""), 2, "UTF-8")


# --------------------------------------------------------------------------------------------
# append --atomic did not exist: a bad line in the middle of the input left the lines before it
# appended. With --atomic every line is parsed and checked against the event contract first,
# and nothing is written (not even the session directory) unless all of them pass.

GOOD = [
    '{"type": "turn.started"}',
    '{"event": {"type": "item.completed", "item": {"id": "m", "type": "agent_message"}}}',
    '{"type": "turn.completed", "usage": {"input_tokens": 3}}',
]


@pytest.mark.parametrize(
    "bad, needles",
    [
        ('{"type": "turn.failed", "usage": {}}', ("line 3", "message")),
        ('{"type": "turn.completed", "usage": {"input_tokens": -1}}', ("line 3", "usage")),
        ('{"type": 7}', ("line 3", "'type'")),
        ("[1, 2]", ("line 3", "JSON object")),
        ('{"type": "turn.started"', ("line 3", "not JSON")),
        ('{"type": "x", "n": 1e999}', ("line 3", "infinity")),
    ],
)
def test_append_atomic_checks_every_line_before_writing_anything(tmp_path, bad, needles):
    lines = "\n".join(GOOD[:2] + [bad] + GOOD[2:]) + "\n"
    line = one_line_error(run("append", "new", "--atomic", "--root", tmp_path, input=lines), 2, *needles)
    assert "nothing appended" in line
    assert not (tmp_path / "sessions").exists()
    write_session(tmp_path, "old")
    before = (tmp_path / "sessions" / "old" / "events.jsonl").read_bytes()
    json_error(run("append", "old", "--atomic", "--json", "--root", tmp_path, input=lines), 2, *needles)
    assert (tmp_path / "sessions" / "old" / "events.jsonl").read_bytes() == before
    # Without --atomic the lines before the bad one are kept, and the error says how many.
    result = run("append", "old", "--root", tmp_path, input=lines)
    one_line_error(result, 2, *needles, "2 events appended before it")


def test_append_atomic_appends_everything_when_every_line_passes(tmp_path):
    result = run("append", "new", "--atomic", "--root", tmp_path, "--json", input="\n".join(GOOD) + "\n\n")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["appended"] == 3 and data["turn_count"] == 1 and data["last_seq"] == 3
    with memstore.read_session(tmp_path, "new") as reader:
        assert [e["type"] for e in reader.iter_events()] == ["turn.started", "item.completed", "turn.completed"]


# --------------------------------------------------------------------------------------------
# Counts are pluralized: show said "1 events", doctor "1 sessions checked: 1 problems".


def test_counts_of_one_are_singular(tmp_path):
    with memstore.open_session(tmp_path, "s") as log:
        log.append({"type": "turn.started"})
    show = run("show", "s", "--root", tmp_path)
    assert show.exit_code == 0 and "0 turns (and 1 open), 1 event," in show.stdout, show.stdout
    doctor = run("doctor", "--root", tmp_path)  # no catalog yet: one problem
    assert doctor.exit_code == 1 and "1 session checked: 1 problem" in doctor.stdout, doctor.stdout
    assert "1 problems" not in doctor.stdout and "1 sessions" not in doctor.stdout
    packed = run("pack", "s", "--root", tmp_path)
    assert packed.exit_code == 0 and " 1 files" not in packed.stdout
    verified = run("verify", "s", "--root", tmp_path)
    assert verified.exit_code == 0 and "verified:" in verified.stdout and " 1 files" not in verified.stdout


# --------------------------------------------------------------------------------------------
# --json is honoured by every command: pin, unpin and serve had no --json at all.


def test_every_command_takes_json():
    missing = [
        name
        for name, command in cli.commands.items()
        if "--json" not in {opt for p in command.params for opt in p.opts}
    ]
    assert missing == []
    for name, command in cli.commands.items():  # and --root, whose help says MEMSTORE_ROOT is the default
        roots = [p for p in command.params if "--root" in p.opts]
        assert len(roots) == 1 and "MEMSTORE_ROOT" in (roots[0].help or ""), name


def test_pin_and_unpin_json(tmp_path):
    write_session(tmp_path, "s")
    pinned = run("pin", "s", "--reason", "keep", "--root", tmp_path, "--json")
    assert pinned.exit_code == 0, pinned.output
    assert json.loads(pinned.stdout) == {
        "session_id": "s",
        "pinned": True,
        "path": str(tmp_path / "sessions" / "s" / "retention-pin.json"),
    }
    assert json.loads(run("unpin", "s", "--root", tmp_path, "--json").stdout) == {"session_id": "s", "was_pinned": True}
    assert json.loads(run("unpin", "s", "--root", tmp_path, "--json").stdout) == {
        "session_id": "s",
        "was_pinned": False,
    }
    json_error(run("pin", "gone", "--root", tmp_path, "--json"), 2, "no session 'gone'")


def test_serve_json_announces_as_json_and_shows_no_progress(tmp_path, monkeypatch):
    from memstore.explorer import server

    calls = []
    monkeypatch.setattr(server, "_run_server", lambda app, host, port: calls.append((host, port)))
    write_session(tmp_path, "s")
    result = run("serve", "--root", tmp_path, "--port", "0", "--json")
    assert result.exit_code == 0, result.output
    announced = json.loads(result.stdout)
    port = announced["port"]  # port 0: a free port, chosen before serving, so the URL is the real one
    assert port > 0 and announced == {
        "url": f"http://localhost:{port}/-/memstore",
        "root": str(tmp_path),
        "host": "127.0.0.1",
        "port": port,
    }
    assert result.stderr == "" and calls == [("127.0.0.1", port)]
    json_error(run("serve", "--root", tmp_path / "nothing", "--json"), 2, "memstore demo")


# --------------------------------------------------------------------------------------------
# Progress bars only on long work, never with --json: demo drew its bar for a run of a fraction
# of a second, and import drew its bar on a long import even with --json.


def test_progress_bars_only_on_long_work_and_never_with_json(tmp_path, monkeypatch):
    import memstore.cli as cli_module
    import memstore.importers as importers

    quick = run("demo", "--sessions", "4", "--root", tmp_path / "a")
    assert quick.exit_code == 0 and quick.stderr == "", quick.stderr
    monkeypatch.setattr(cli_module, "PROGRESS_DELAY", 0.0)  # any work counts as long now
    slow = run("demo", "--sessions", "4", "--root", tmp_path / "b")
    assert slow.exit_code == 0 and "writing the demo store" in slow.stderr
    as_json = run("demo", "--sessions", "4", "--root", tmp_path / "c", "--json")
    assert as_json.exit_code == 0 and as_json.stderr == "" and json.loads(as_json.stdout)["sessions"] == 4

    def big_import(root, paths, source, progress):
        if progress is not None:  # with --json the CLI passes none
            progress(0, 64 << 20)
            progress(64 << 20, 64 << 20)
        return importers.ImportReport()

    monkeypatch.setattr(importers, "import_logs", big_import)
    shown = run("import", tmp_path / "a", "--root", tmp_path / "d")
    assert shown.exit_code == 0 and "importing" in shown.stderr
    hidden = run("import", tmp_path / "a", "--root", tmp_path / "d", "--json")
    assert hidden.exit_code == 0 and hidden.stderr == "" and json.loads(hidden.stdout)["events_appended"] == 0


# --------------------------------------------------------------------------------------------
# A root that is not there: `sessions` said so, but retention reported "would remove 0
# sessions", facts "no facts" and progress "no progress ledger", all as if the store were empty.


@pytest.mark.parametrize(
    "args",
    [
        ["retention"],
        ["retention", "--apply"],
        ["facts"],
        ["facts", "--session", "s"],
        ["progress", "s"],
        ["show", "s"],
        ["pack", "s"],
        ["verify", "s"],
        ["pin", "s"],
        ["unpin", "s"],
        ["sessions"],
        ["search", "x"],
        ["rebuild", "--all"],
    ],
)
def test_a_root_that_is_not_there_is_an_error_and_stays_absent(tmp_path, args):
    nowhere = tmp_path / "nowhere"
    one_line_error(run(*args, "--root", nowhere), 2, f"no store at {nowhere}")
    json_error(run(*args, "--root", nowhere, "--json"), 2, "no store at")
    assert not nowhere.exists()


# --------------------------------------------------------------------------------------------
# A missing session is an error that creates nothing: rebuild of sessions that all failed still
# refreshed the catalog (creating catalog.db and locks/), and facts --session answered "no facts".


def test_rebuild_and_facts_of_a_missing_session_create_nothing(tmp_path):
    (tmp_path / "store").mkdir()
    store = tmp_path / "store"
    one_line_error(run("rebuild", "gone", "--root", store), 2, "gone")
    assert files_under(store) == []
    json_error(run("facts", "--session", "gone", "--root", store, "--json"), 2, "no session 'gone'")
    one_line_error(run("facts", "--session", "gone", "--root", store), 2, "no session 'gone'")
    assert files_under(store) == []
    write_session(store, "real")
    mixed = run("rebuild", "real", "gone", "--root", store)
    assert mixed.exit_code == 1 and "real: 2 events, 1 turn" in mixed.stdout and "gone" in mixed.stderr
    assert (store / "catalog.db").exists()  # the one that rebuilt is in the catalog
    facts = run("facts", "--session", "real", "--root", store)
    assert facts.exit_code == 0 and facts.stdout == "no facts\n"


# --------------------------------------------------------------------------------------------
# serve --host with an IPv6 address announced http://:::8001/-/memstore, not a URL.


def test_serve_announces_a_working_url_for_ipv6_hosts(tmp_path, monkeypatch):
    from memstore.explorer import server

    monkeypatch.setattr(server, "_run_server", lambda app, host, port: None)
    monkeypatch.setattr(server, "check_port", lambda host, port: None)
    write_session(tmp_path, "s")
    for host, url in (
        ("::", "http://[::]:8001/-/memstore"),
        ("fe80::1", "http://[fe80::1]:8001/-/memstore"),
        ("::1", "http://localhost:8001/-/memstore"),
        ("0.0.0.0", "http://0.0.0.0:8001/-/memstore"),
    ):
        result = run("serve", "--root", tmp_path, "--host", host, "--json")
        assert result.exit_code == 0, result.output
        assert json.loads(result.stdout)["url"] == url


def test_search_in_a_missing_session_says_so(tmp_path):
    write_session(tmp_path, "real")
    one_line_error(run("search", "x", "--session", "gone", "--root", tmp_path), 2, "no session 'gone'")
    json_error(run("search", "x", "--session", "gone", "--root", tmp_path, "--json"), 2, "no session 'gone'")
    found = run("search", "x", "--session", "real", "--root", tmp_path)
    assert found.exit_code == 0 and found.stdout == "no results\n"


# --------------------------------------------------------------------------------------------
# `sessions` left out every session whose manifest.json was missing or damaged, though the
# manifest is a regenerable view: show, rebuild and the explorer all find such a session.


def test_sessions_lists_a_session_whose_manifest_is_gone(tmp_path):
    write_session(tmp_path, "kept", turns=1)
    write_session(tmp_path, "bare", turns=2)
    (tmp_path / "sessions" / "bare" / "manifest.json").unlink()
    write_session(tmp_path, "garbled", turns=3)
    (tmp_path / "sessions" / "garbled" / "manifest.json").write_text("{not json")
    (tmp_path / "sessions" / "empty-dir").mkdir()  # no log: not a session
    rows = json.loads(run("sessions", "--root", tmp_path, "--json").stdout)
    assert {r["session_id"]: r["turn_count"] for r in rows} == {"kept": 1, "bare": 2, "garbled": 3}
    text = run("sessions", "--root", tmp_path).stdout
    assert "bare" in text and "garbled" in text and "empty-dir" not in text
    assert len(json.loads(run("sessions", "--root", tmp_path, "--json", "--limit", "2").stdout)) == 2


# --------------------------------------------------------------------------------------------
# Unreadable input: append read its source line by line outside any error handling, so a read
# that failed (EIO, a file on a failing disk; /proc/self/mem shows it) was an OSError traceback.


@pytest.mark.parametrize("atomic", [False, True])
def test_append_from_a_source_that_cannot_be_read_is_one_line(tmp_path, atomic):
    args = ["append", "s", "/proc/self/mem", "--root", tmp_path] + (["--atomic"] if atomic else [])
    if not os.path.exists("/proc/self/mem"):
        pytest.skip("no /proc/self/mem here")
    one_line_error(run(*args), 2, "/proc/self/mem", "Input/output error")
    json_error(run(*args, "--json"), 2, "/proc/self/mem")
    if atomic:
        assert not (tmp_path / "sessions").exists()


def test_an_os_error_the_library_did_not_wrap_is_one_line(tmp_path, monkeypatch):
    import memstore.store as store

    def failing(root, limit=None):
        raise PermissionError(13, "Permission denied", str(tmp_path / "sessions"))

    monkeypatch.setattr(store, "list_sessions", failing)
    one_line_error(run("sessions", "--root", tmp_path), 2, "Permission denied", str(tmp_path / "sessions"))
    json_error(run("sessions", "--root", tmp_path, "--json"), 2, "Permission denied")


# --------------------------------------------------------------------------------------------
# serve --metadata with a file that is not a metadata mapping (bad YAML, a list, binary) was a
# yaml / ValueError / UnicodeDecodeError traceback.


@pytest.mark.parametrize("content", [b"a: [\n", b"- 1\n", b"\xff\xfe\x00", b""])
def test_serve_with_a_bad_metadata_file_is_one_line(tmp_path, monkeypatch, content):
    from memstore.explorer import server

    monkeypatch.setattr(server, "_run_server", lambda app, host, port: None)
    write_session(tmp_path, "s")
    bad = tmp_path / "bad.yml"
    bad.write_bytes(content)
    one_line_error(run("serve", "--root", tmp_path, "--port", "0", "--metadata", bad), 2, str(bad), "metadata")
    json_error(run("serve", "--root", tmp_path, "--port", "0", "--metadata", bad, "--json"), 2, "metadata")


# --------------------------------------------------------------------------------------------
# doctor --fix left a catalog.db that SQLite cannot read as it was ("[not fixed]", exit 1),
# though the catalog is a regenerable view: it is now set aside and rebuilt.


def test_doctor_fix_rebuilds_a_catalog_sqlite_cannot_read(tmp_path):
    import sqlite3

    write_session(tmp_path, "s")
    (tmp_path / "catalog.db").write_bytes(b"this is not a database" * 100)
    checked = run("doctor", "--root", tmp_path)
    assert checked.exit_code == 1 and "cannot be read" in checked.stdout
    fixed = run("doctor", "--fix", "--root", tmp_path)
    assert fixed.exit_code == 0, fixed.output
    assert "[fixed]" in fixed.stdout
    conn = sqlite3.connect(tmp_path / "catalog.db")
    assert [r[0] for r in conn.execute("SELECT session_id FROM sessions")] == ["s"]
    conn.close()
    kept = list(tmp_path.glob("catalog.db.unreadable-*"))
    assert len(kept) == 1 and kept[0].read_bytes().startswith(b"this is not a database")
    assert run("doctor", "--root", tmp_path).exit_code == 0
