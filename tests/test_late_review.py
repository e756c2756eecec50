"""Regression tests from the late review of the demo store, the file-change chunks, the import
report and the Claude Code interruption fix: each failed before its fix."""

from __future__ import annotations

import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import orjson

import memstore
from memstore.demo import IMPORTED_SESSIONS, write_demo_store

REPO = Path(__file__).resolve().parent.parent

# A demo run killed at its n-th append (os._exit: no cleanup runs, as with SIGKILL or a power cut).
_CRASH = textwrap.dedent("""
    import json, os, sys
    import memstore.session.log as L
    from memstore.demo import write_demo_store
    stop_at, count = int(sys.argv[2]), [0]
    append = L.SessionLog.append
    def crashing(self, *a, **k):
        count[0] += 1
        if count[0] == stop_at:
            os._exit(9)
        return append(self, *a, **k)
    L.SessionLog.append = crashing
    report = write_demo_store(sys.argv[1])
    print(json.dumps({"appends": count[0], **report.to_dict()}))
""")


def _demo_run(root: Path, stop_at: int = 0) -> subprocess.CompletedProcess:
    # TMPDIR: the temporary directories a killed run leaves behind stay in the test's.
    tmp = root.parent / "tmp"
    tmp.mkdir(exist_ok=True)
    env = dict(os.environ, PYTHONPATH=str(REPO), TMPDIR=str(tmp))
    return subprocess.run([sys.executable, "-c", _CRASH, str(root), str(stop_at)], env=env, capture_output=True,
                          text=True, timeout=120)


def _demo_bytes(root: Path) -> dict[str, bytes]:
    out = {}
    for path in sorted((root / "sessions").glob("*/events.jsonl")) + sorted(
            (root / "sessions").glob("*/derived/progress.json")):
        # The imported sessions name the file they were imported from (a directory per store).
        out[str(path.relative_to(root))] = re.sub(rb"memstore-demo-sources-[0-9a-z_]+", b"<sources>", path.read_bytes())
    return out


def test_a_demo_killed_while_importing_gives_the_bytes_of_an_uninterrupted_run_when_rerun(tmp_path):
    whole = _demo_run(tmp_path / "whole")
    assert whole.returncode == 0, whole.stderr
    appends = json.loads(whole.stdout)["appends"]
    want = _demo_bytes(tmp_path / "whole")
    # Killed in the imports, the last appends of the run: the sources are left behind, and
    # the directories of one or both imported sessions exist with only some of their events.
    for stop_at in range(appends - 24, appends + 1, 3):
        root = tmp_path / f"killed-at-{stop_at}"
        assert _demo_run(root, stop_at).returncode == 9
        rerun = _demo_run(root)
        assert rerun.returncode == 0, rerun.stderr
        report = json.loads(rerun.stdout)
        assert _demo_bytes(root) == want, f"killed at append {stop_at}"
        assert report["kept"] == [] and set(report["imported"]) <= set(IMPORTED_SESSIONS)
    # A second uninterrupted run imports nothing and changes nothing.
    again = json.loads(_demo_run(tmp_path / "whole").stdout)
    assert again["imported"] == [] and len(again["skipped"]) == 30 and _demo_bytes(tmp_path / "whole") == want


def test_events_appended_to_an_imported_demo_session_are_kept_when_the_other_is_reimported(tmp_path):
    write_demo_store(tmp_path)
    codex, claude, _subagent = IMPORTED_SESSIONS
    with memstore.open_session(tmp_path, codex) as log:
        log.append({"type": "note", "text": "mine"})
    grown = (tmp_path / "sessions" / codex / "events.jsonl").read_bytes()
    shutil.rmtree(tmp_path / "sessions" / claude)
    report = write_demo_store(tmp_path)
    # The re-import of the missing session does not re-import (remove) the one someone added to.
    assert (tmp_path / "sessions" / codex / "events.jsonl").read_bytes() == grown
    assert report.kept == [codex] and report.imported == [claude]


# ---------------------------------------------------------------------------------------------
# Claude Code: an interrupted turn, then a compaction

_CLAUDE_SID = "9c1d2e3f-7777-4a1b-8c2d-00000000a00b"


def _claude_line(n, kind, ts, **fields):
    return {"parentUuid": None, "isSidechain": False, "userType": "external", "cwd": "/w", "sessionId": _CLAUDE_SID,
            "version": "2.1.3", "type": kind, "uuid": f"u{n}", "timestamp": ts, **fields}


def _assistant(n, ts, mid, block):
    return _claude_line(n, "assistant", ts, message={"id": mid, "role": "assistant", "model": "claude-opus-4-5",
                                                     "content": [block], "usage": {"input_tokens": 10, "output_tokens": 5}})


# An interruption, then the turn's last lines (the cut-short answer, a tool's result), a /compact.
_INTERRUPTED_THEN_MORE = [
    _claude_line(1, "user", "2026-11-01T10:00:00.000Z", message={"role": "user", "content": "refactor the parser"}),
    _assistant(2, "2026-11-01T10:00:03.000Z", "m1", {"type": "tool_use", "id": "t1", "name": "Bash", "input": {"command": "ls"}}),
    _claude_line(3, "user", "2026-11-01T10:00:05.000Z",
                 message={"role": "user", "content": [{"type": "text", "text": "[Request interrupted by user]"}]}),
    _assistant(4, "2026-11-01T10:00:09.000Z", "m2", {"type": "text", "text": "Stopping here."}),
    _claude_line(5, "user", "2026-11-01T10:00:10.000Z", message={"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "t1", "content": "a.py b.py"}]}),
    _claude_line(6, "user", "2026-11-01T10:00:40.000Z", message={"role": "user", "content": (
        "<command-name>/compact</command-name>\n<command-message>compact</command-message>")}),
    _claude_line(7, "system", "2026-11-01T10:01:25.000Z", subtype="compact_boundary", content="Conversation compacted",
                 compactMetadata={"trigger": "manual", "preTokens": 15}),
    _claude_line(8, "user", "2026-11-01T10:02:00.000Z", message={"role": "user", "content": "now just fix the test"}),
]


def _write_lines(path: Path, lines: list) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(orjson.dumps(o) + b"\n" for o in lines))
    return path


def _claude_records(root: Path) -> list:
    with memstore.read_session(root, f"claude-{_CLAUDE_SID}") as reader:
        return [(r.event, r.ts) for r in reader.iter_records()]


def test_an_interrupted_turn_closed_by_a_compaction_ends_after_its_last_items(tmp_path):
    source = _write_lines(tmp_path / "src" / f"{_CLAUDE_SID}.jsonl", _INTERRUPTED_THEN_MORE)
    memstore.import_logs(tmp_path / "store", source, settle_seconds=0)
    records = _claude_records(tmp_path / "store")
    end = next(i for i, (e, _) in enumerate(records) if e["type"] == "turn.aborted")
    assert records[end + 1][0]["type"] == "thread.compact_boundary"
    # Its items after the interruption are in it and before its end (it was dated 10:00:05,
    # before its own answer and result); the /compact command's line is not.
    assert [ts for _, ts in records[:end + 1]] == sorted(ts for _, ts in records[:end + 1])
    assert records[end][1] == "2026-11-01T10:00:10.000Z"
    with memstore.read_session(tmp_path / "store", f"claude-{_CLAUDE_SID}") as reader:
        assert reader.turns()[0].ended_at == "2026-11-01T10:00:10.000Z"
    # An import that stopped after each line and resumed (its state saved between) gives the same.
    for cut in range(1, len(_INTERRUPTED_THEN_MORE)):
        store = tmp_path / f"cut-{cut}"
        growing = _write_lines(tmp_path / f"src-{cut}" / f"{_CLAUDE_SID}.jsonl", _INTERRUPTED_THEN_MORE[:cut])
        memstore.import_logs(store, growing, settle_seconds=3600)
        _write_lines(growing, _INTERRUPTED_THEN_MORE)
        memstore.import_logs(store, growing, settle_seconds=0)
        got = orjson.dumps(_claude_records(store)).replace(str(growing).encode(), b"<src>")
        assert got == orjson.dumps(records).replace(str(source).encode(), b"<src>"), f"resumed after line {cut}"


def test_an_import_saved_by_the_previous_mapping_is_not_resumed_with_it(tmp_path):
    """Claude Code's interrupted turn before a compaction is mapped differently since the
    previous release (whose saved parser state has no ``interrupted_at``): resuming that state
    extended the session with the old mapping, unlike a fresh import of the same source."""
    from memstore.layout import IMPORT_STATE_FILE as STATE_FILE

    lines = _INTERRUPTED_THEN_MORE
    fresh = _write_lines(tmp_path / "fresh" / f"{_CLAUDE_SID}.jsonl", lines)
    memstore.import_logs(tmp_path / "fresh-store", fresh, settle_seconds=0)
    want = orjson.dumps(_claude_records(tmp_path / "fresh-store")).replace(str(fresh).encode(), b"<src>")

    store = tmp_path / "store"
    source = _write_lines(tmp_path / "src" / f"{_CLAUDE_SID}.jsonl", lines[:5])
    memstore.import_logs(store, source, settle_seconds=3600)
    state_path = memstore.session_directory(store, f"claude-{_CLAUDE_SID}") / "derived" / STATE_FILE
    state = orjson.loads(state_path.read_bytes())
    # As the previous release saved it.
    state["mapping"] = 2
    del state["carry"]["turn"]["interrupted_at"]
    state_path.write_bytes(orjson.dumps(state))
    _write_lines(source, lines)
    memstore.import_logs(store, source, settle_seconds=0)
    assert orjson.dumps(_claude_records(store)).replace(str(source).encode(), b"<src>") == want


# ---------------------------------------------------------------------------------------------
# File-change chunks


def test_a_file_change_with_deeply_nested_arguments_does_not_fail_the_rebuild(tmp_path):
    with memstore.open_session(tmp_path, "s") as log:
        log.append({"type": "turn.started"})
    # A line another writer appended: nested deeper than memstore writes, as deep as the log reads.
    path = tmp_path / "sessions" / "s" / "events.jsonl"
    last = orjson.loads(path.read_bytes().splitlines()[-1])
    nested: object = "needle_deep"
    for _ in range(900):
        nested = [nested]
    event = {"type": "item.completed", "item": {"id": "f", "type": "file_change", "changes": [
        {"path": "src/a.py", "kind": "update"}], "arguments": {"file_path": "src/a.py", "old_string": "needle_old",
                                                                "edits": nested}}}
    line = '{"schema_version":%s,"seq":%d,"ts":"%s","event":%s}\n' % (
        orjson.dumps(last["schema_version"]).decode(), last["seq"] + 1, last["ts"],
        '{"type":"item.completed","item":{"id":"f","type":"file_change","changes":[{"path":"src/a.py","kind":"update"}],'
        '"arguments":{"file_path":"src/a.py","old_string":"needle_old","edits":' + "[" * 900 + '"needle_deep"'
        + "]" * 900 + "}}}")
    assert orjson.loads(line)["event"] == event
    with open(path, "a") as f:
        f.write(line)
    memstore.rebuild(tmp_path, "s")
    db = sqlite3.connect(tmp_path / "sessions" / "s" / "index" / "session.db")
    text = db.execute("SELECT text FROM chunks WHERE seq = ?", (last["seq"] + 1,)).fetchone()[0]
    assert text == "update src/a.py\nneedle_old\nneedle_deep"
