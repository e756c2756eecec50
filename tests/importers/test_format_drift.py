"""Format drift is seen, never silent.

Invariants: every record of a source is either understood or kept (an ``import.unrecognized``
event carrying its raw line, byte for byte, and its line number), and counted; the import's
report, its CLI output (and --json) and ``memstore doctor`` give per agent and agent version the
sessions, turns, tokens, records understood and kept without being understood (by type), and
the sessions with no turn or no token; a version never seen before, a jump in records not
understood, and sessions that produced no turn or no token from sources with records are
warnings the user sees (stderr lines starting with "warning: format drift:").
"""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path

import orjson
from click.testing import CliRunner

import memstore
from memstore.cli import cli
from memstore.importers.drift import DRIFT_PREFIX, version_known

FIXTURES = Path(__file__).parent.parent / "fixtures" / "import"
CODEX_0104 = next((FIXTURES / "codex" / "0.104").glob("*.jsonl"))
CODEX_0148 = next((FIXTURES / "codex" / "0.148").glob("*.jsonl"))
CLAUDE_21 = next((FIXTURES / "claude" / "projects" / "-home-dev-app").glob("*.jsonl"))


def events(root, sid):
    with memstore.read_session(root, sid) as reader:
        return list(reader.iter_events())


def by_version(report) -> dict:
    return {(a.agent, a.version): a for a in report.agents}


def write(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


# ---------------------------------------------------------------------------------------------
# Nothing is dropped


def test_every_record_not_understood_is_kept_with_its_raw_line(tmp_path):
    lines = CLAUDE_21.read_bytes().split(b"\n")
    lines.insert(3, b"\x00\xff binary junk")
    lines.insert(5, '{"type":"assistant-v9","sessionId":"x","text":"caf\u00e9"}'.encode())
    lines.insert(8, b'{"type":"system","subtype":"brand_new_notice","timestamp":"2026-01-20T08:00:03.500Z"}')
    source = write(tmp_path / "src" / CLAUDE_21.name, b"\n".join(lines))
    report = memstore.import_logs(tmp_path / "store", source)
    sid = report.sessions[0]
    kept = [e for e in events(tmp_path / "store", sid) if e["type"] == "import.unrecognized"]
    raw = {e["line"]: (base64.b64decode(e["raw_base64"]) if "raw_base64" in e else e["raw"].encode()) for e in kept}
    for number, line in raw.items():
        assert line == lines[number - 1], f"line {number} is not kept as it was"
    assert {e["line"]: e["record_type"] for e in kept} == {
        4: "(not JSON)",
        6: "assistant-v9",
        9: "system:brand_new_notice",
        29: "future-record",
        33: "(not JSON)",
    }
    # Every non-blank line is counted, understood or kept.
    [stats] = report.agents
    assert stats.records == sum(1 for line in lines if line) == stats.records_understood + stats.records_not_understood
    assert stats.not_understood_by_type == {
        "(not JSON)": 2,
        "assistant-v9": 1,
        "system:brand_new_notice": 1,
        "future-record": 1,
    }
    assert report.lines_kept_unrecognized == 5 and report.lines_skipped == 0


def test_an_unknown_assistant_block_is_kept_not_dropped(tmp_path):
    line = {
        "type": "assistant",
        "sessionId": "5f0c4a1e-7777-4b1e-8d2a-0000000000c1",
        "uuid": "a1",
        "timestamp": "2026-03-01T10:00:01.000Z",
        "message": {
            "id": "msg_1",
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Looking."},
                {"type": "server_tool_use_v2", "id": "x1", "input": {"q": 1}},
            ],
            "usage": {"input_tokens": 3, "output_tokens": 4},
        },
    }
    prompt = {
        "type": "user",
        "sessionId": line["sessionId"],
        "uuid": "u1",
        "timestamp": "2026-03-01T10:00:00.000Z",
        "message": {"role": "user", "content": "search for it"},
    }
    source = write(
        tmp_path / "src" / f"{line['sessionId']}.jsonl", orjson.dumps(prompt) + b"\n" + orjson.dumps(line) + b"\n"
    )
    report = memstore.import_logs(tmp_path / "store", source)
    [kept] = [e for e in events(tmp_path / "store", report.sessions[0]) if e["type"] == "import.unrecognized"]
    assert (kept["line"], kept["record_type"]) == (2, "assistant block server_tool_use_v2")
    assert orjson.loads(kept["raw"]) == {"type": "server_tool_use_v2", "id": "x1", "input": {"q": 1}}


def test_records_before_the_first_line_of_the_session_are_kept_after_it(tmp_path):
    data = b'{"note":"a tool wrote this"}\n' + CODEX_0148.read_bytes()
    source = write(tmp_path / "src" / CODEX_0148.name, data)
    report = memstore.import_logs(tmp_path / "store", source)
    evs = events(tmp_path / "store", report.sessions[0])
    assert evs[0]["type"] == "thread.started"
    assert (evs[1]["type"], evs[1]["line"], evs[1]["raw"]) == ("import.unrecognized", 1, '{"note":"a tool wrote this"}')


# ---------------------------------------------------------------------------------------------
# The report, per agent and version


def test_the_report_gives_each_agent_version_its_sessions_turns_tokens_and_records(tmp_path):
    report = memstore.import_logs(tmp_path, FIXTURES, settle_seconds=0)
    found = by_version(report)
    assert sorted(found) == [
        ("claude", "2.0.28"),
        ("claude", "2.1.14"),
        ("codex", "(none)"),
        ("codex", "0.104.0"),
        ("codex", "0.147.0"),
        ("codex", "0.148.0"),
        ("codex", "0.40.0"),
        ("codex-exec", "(none)"),
    ]
    c104 = found[("codex", "0.104.0")]
    assert (c104.sessions, c104.turns, c104.input_tokens, c104.cached_input_tokens, c104.output_tokens) == (
        1,
        4,
        45000,
        37000,
        1650,
    )
    assert (c104.records, c104.records_understood, c104.records_not_understood) == (52, 50, 2)
    assert c104.not_understood_by_type == {"(not JSON)": 1, "event_msg:future_event_kind": 1}
    claude = found[("claude", "2.1.14")]
    assert (claude.sessions, claude.turns, claude.input_tokens, claude.output_tokens) == (2, 5, 56376, 465)
    legacy = found[("codex", "(none)")]  # no usage in legacy files: no zero-token warning either
    assert (legacy.turns, legacy.input_tokens, legacy.zero_token_sessions) == (2, 0, [])
    data = report.to_dict()
    assert {(a["agent"], a["version"]) for a in data["agents"]} == set(found)
    json.dumps(data)  # JSON-ready


def test_a_version_never_seen_is_a_warning_once(tmp_path):
    assert version_known("codex", "0.104.3") and version_known("claude", "2.1.40") and version_known("codex", None)
    assert not version_known("codex", "0.160.0") and not version_known("claude", "3.0.1")
    newer = write(tmp_path / "src" / CODEX_0148.name, CODEX_0148.read_bytes().replace(b'"0.148.0"', b'"0.160.2"'))
    first = memstore.import_logs(tmp_path / "store", newer)
    new = [w for w in first.warnings if "not written for" in w]
    assert new == [
        f"{DRIFT_PREFIX} codex 0.160.2 is a version the importer was not written for and this store has not "
        "seen before (1 session); records it does not understand are kept as import.unrecognized and "
        "counted here"
    ]
    recorded = json.loads((tmp_path / "store" / "import-versions.json").read_text())
    assert recorded["codex"]["0.160.2"]["records"] == 24
    # Seen now: the next import (the source grew by a line) does not warn about it again.
    write(
        newer,
        newer.read_bytes() + b'{"timestamp":"2026-08-22T09:02:00.000Z","type":"event_msg","payload":'
        b'{"type":"turn_started","turn_id":"a3"}}\n',
    )
    again = memstore.import_logs(tmp_path / "store", newer)
    assert again.sessions_updated == 1 and not any("not written for" in w for w in again.warnings)


def _with_unknown_events(share_of: int) -> bytes:
    """The 0.104 rollout with every ``share_of``-th line replaced by an event type no importer knows."""
    out = []
    for number, line in enumerate(CODEX_0104.read_bytes().split(b"\n")[:-1], start=1):
        if number > 1 and number % share_of == 0 and b'"task_' not in line and b"token_count" not in line:
            line = b'{"timestamp":"2026-02-12T09:00:01.500Z","type":"event_msg","payload":{"type":"turn_item_v2"}}'
        out.append(line)
    return b"\n".join(out) + b"\n"


def test_a_jump_in_records_not_understood_is_a_warning(tmp_path):
    root = tmp_path / "store"
    lines = CODEX_0104.read_bytes().split(b"\n")[:-1]
    clean = b"".join(line + b"\n" for number, line in enumerate(lines, start=1) if number not in (45, 46))
    first = memstore.import_logs(root, write(tmp_path / "a" / CODEX_0104.name, clean))
    assert first.lines_kept_unrecognized == 0 and first.warnings == []
    drifted = _with_unknown_events(3).replace(b"019c5000-3333", b"019c5000-4444")
    report = memstore.import_logs(root, write(tmp_path / "b" / CODEX_0104.name.replace("3333", "4444"), drifted))
    [jump] = [w for w in report.warnings if "records not understood" in w]
    assert jump.startswith(f"{DRIFT_PREFIX} codex 0.104.0: ") and "event_msg:turn_item_v2" in jump
    assert jump.endswith(", up from 0.0%")


def test_sessions_with_no_turn_or_no_token_are_warnings(tmp_path):
    meta = CODEX_0148.read_bytes().split(b"\n")[0]
    # A future version whose turns and usage the importer cannot read: everything after the
    # header is one record type it does not know.
    drift = [meta.replace(b"0.148.0", b"0.148.9")] + [
        orjson.dumps(
            {
                "timestamp": f"2026-08-22T09:00:0{k}.000Z",
                "type": "event_msg",
                "payload": {"type": "turn_record", "n": k},
            }
        )
        for k in range(1, 6)
    ]
    no_turn = write(
        tmp_path / "src" / "rollout-2026-08-22T11-00-00-019f2222-8888-7000-8000-00000000c148.jsonl",
        b"\n".join(drift) + b"\n",
    )
    # Turns, but their usage moved to a record type the importer does not know.
    lines = CODEX_0104.read_bytes().replace(b'"type":"token_count"', b'"type":"token_usage_v2"')
    lines = lines.replace(b"019c5000-3333", b"019c5000-5555")
    no_tokens = write(tmp_path / "src" / CODEX_0104.name.replace("3333", "5555"), lines)
    report = memstore.import_logs(tmp_path / "store", [no_turn, no_tokens], settle_seconds=0)
    found = by_version(report)
    assert found[("codex", "0.148.9")].zero_turn_sessions == ["codex-019f2222-8888-7000-8000-00000000c148"]
    assert found[("codex", "0.104.0")].zero_token_sessions == ["codex-019c5000-5555-7000-8000-00000000c003"]
    assert any(w.startswith(f"{DRIFT_PREFIX} codex 0.148.9: 1 session produced no turn") for w in report.warnings)
    assert any(w.startswith(f"{DRIFT_PREFIX} codex 0.104.0: 1 session counted no token") for w in report.warnings)


# ---------------------------------------------------------------------------------------------
# Seen by the user: the CLI and doctor


def test_the_cli_prints_drift_warnings_on_stderr_and_each_version_on_stdout(tmp_path):
    newer = write(tmp_path / "src" / CODEX_0148.name, CODEX_0148.read_bytes().replace(b'"0.148.0"', b'"0.170.0"'))
    runner = CliRunner()
    result = runner.invoke(cli, ["import", str(newer), "--root", str(tmp_path / "store")])
    assert result.exit_code == 0, result.output
    assert any(line.startswith(f"{DRIFT_PREFIX} codex 0.170.0 is a version") for line in result.stderr.splitlines())
    assert (
        "codex 0.170.0: 1 session, 2 turns, 20500 input (17000 cached) and 800 output tokens; 24 records, "
        "23 understood, 1 kept not understood (event_msg:item_completed:CollabAgentToolCall 1)" in result.stdout
    )
    other = write(tmp_path / "src2" / CODEX_0148.name, CODEX_0148.read_bytes().replace(b'"0.148.0"', b'"0.171.0"'))
    result = runner.invoke(cli, ["import", str(other), "--root", str(tmp_path / "store2"), "--json"])
    assert result.exit_code == 0
    data = json.loads(result.stdout)
    assert data["warnings"] and all(w.startswith(DRIFT_PREFIX) for w in data["warnings"])
    assert any(line.startswith(f"{DRIFT_PREFIX} codex 0.171.0") for line in result.stderr.splitlines())
    assert data["agents"][0]["records_not_understood"] == 1


def test_doctor_reports_imports_per_version_and_their_drift(tmp_path):
    root = tmp_path / "store"
    newer = write(tmp_path / "src" / CODEX_0148.name, CODEX_0148.read_bytes().replace(b'"0.148.0"', b'"0.170.0"'))
    memstore.import_logs(root, [newer, CLAUDE_21.parent], settle_seconds=0)
    os.remove(newer)  # a source gone changes nothing here
    report = memstore.check_store(root, fix=True)
    assert report.ok
    found = {(a.agent, a.version): a for a in report.imports}
    assert (found[("codex", "0.170.0")].turns, found[("codex", "0.170.0")].output_tokens) == (2, 800)
    assert found[("claude", "2.1.14")].not_understood_by_type == {"(not JSON)": 1, "future-record": 1}
    assert any(
        w.startswith(f"{DRIFT_PREFIX} codex 0.170.0 is a version the importer was not written for")
        for w in report.warnings
    )
    data = report.to_dict()
    assert data["warnings"] == report.warnings and len(data["imports"]) == 2
    result = CliRunner().invoke(cli, ["doctor", "--root", str(root), "--json"])
    assert result.exit_code == 0 and json.loads(result.stdout)["imports"]
