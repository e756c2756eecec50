"""Trying to make an import lose an acknowledged event, with real processes and real files.

Invariants under attack:
- an import killed (SIGKILL) at any moment, then run again, leaves the session exactly as one
  uninterrupted import would (no event lost, none twice), an agent's appended turn included;
- a source rewritten over and over while imports run: every record any import wrote, and the
  agent's turn, stays in the store (in the session or a set-aside one), and once the source
  stops changing the session equals a fresh import of it;
- retention (include_imported) racing imports of the same source: once the session is
  tombstoned it is never recreated, and nothing is left half-done;
- an import racing an agent that holds the session open: the agent's events are kept.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from generate import CODEX_SID, codex_rollout

import memstore
from memstore.retention import RetentionPolicy
from memstore.tombstones import Tombstones

REPO = Path(__file__).parent.parent.parent
NAME = "rollout-2026-02-12T09-00-00-019c7777-5555-7000-8000-00000000e777.jsonl"
OLD = 1_700_000_000.0

IMPORT = "import sys, memstore; memstore.import_logs(sys.argv[1], sys.argv[2], settle_seconds=float(sys.argv[3]))"
AGENT = """
import sys, memstore
with memstore.open_session(sys.argv[1], sys.argv[2]) as log:
    log.append({"type": "turn.started"})
    log.append({"type": "item.completed", "item": {"id": "n1", "type": "agent_message", "text": sys.argv[3]}})
    log.append({"type": "turn.completed", "usage": {"input_tokens": 1, "cached_input_tokens": 0,
                "cache_creation_tokens": 0, "output_tokens": 1}})
"""


def records(root, sid):
    with memstore.read_session(root, sid) as reader:
        return [(r.ts, r.event) for r in reader.iter_records()]


def all_records(root) -> list:
    out = []
    for summary in memstore.list_sessions(root):
        out.extend(records(root, summary.session_id))
    return out


def run(*args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", *args], cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )


@pytest.mark.parametrize("settled", [False, True], ids=["active", "settled"])
def test_an_import_killed_at_any_moment_converges_to_one_import(tmp_path, settled):
    data, _ = codex_rollout(500, seed=11)
    source = tmp_path / "src" / NAME
    source.parent.mkdir()
    cut = data.index(b"\n", len(data) // 3) + 1
    source.write_bytes(data[:cut])
    if settled:
        os.utime(source, (OLD, OLD))
    root = tmp_path / "store"
    memstore.import_logs(root, source)
    note = subprocess.run([sys.executable, "-c", AGENT, str(root), CODEX_SID, "zebracornkill"], cwd=REPO, timeout=120)
    assert note.returncode == 0
    before = records(root, CODEX_SID)
    source.write_bytes(data)  # the source grew; imports of it get killed
    if settled:
        os.utime(source, (OLD, OLD))
    rng = random.Random(5)
    log = memstore.session_directory(root, CODEX_SID) / "events.jsonl"
    killed_mid_append = 0
    for _round in range(4):
        size = log.stat().st_size
        child = run(IMPORT, str(root), str(source), "900")
        # Killed once it has appended some events (a crash mid-import), a moment later.
        while child.poll() is None and log.stat().st_size == size:
            time.sleep(0.005)
        time.sleep(rng.uniform(0, 0.05))
        killed_mid_append += child.poll() is None
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=60)
    assert killed_mid_append, "no round killed an import in the middle"
    report = memstore.import_logs(root, source)
    after = records(root, CODEX_SID)
    assert after[: len(before)] == before  # the agent's turn and what was imported before
    assert report.set_aside == []
    fresh_first, fresh_whole = tmp_path / "f1", tmp_path / "f2"
    source.write_bytes(data[:cut])
    if settled:
        os.utime(source, (OLD, OLD))
    memstore.import_logs(fresh_first, source)
    source.write_bytes(data)
    if settled:
        os.utime(source, (OLD, OLD))
    memstore.import_logs(fresh_whole, source)
    if settled:
        # Reopened after its thread.completed: what follows is what the growth adds, once.
        assert (
            sum(e["type"] == "turn.completed" for _, e in after)
            == sum(e["type"] == "turn.completed" for _, e in records(fresh_whole, CODEX_SID)) + 1
        )  # + the agent's turn
    else:
        gained = records(fresh_whole, CODEX_SID)[len(records(fresh_first, CODEX_SID)) :]
        assert after[len(before) :] == gained  # each event once, none lost
    assert not (root / "gc-log.jsonl").exists()


def test_a_source_rewritten_over_and_over_while_imports_run_loses_nothing(tmp_path):
    versions = [codex_rollout(120, seed=seed)[0] for seed in (21, 22, 23)]
    source = tmp_path / "src" / NAME
    source.parent.mkdir()
    source.write_bytes(versions[0])
    root = tmp_path / "store"
    memstore.import_logs(root, source)
    note = subprocess.run(
        [sys.executable, "-c", AGENT, str(root), CODEX_SID, "zebracornrewrite"], cwd=REPO, timeout=120
    )
    assert note.returncode == 0
    held = set(map(repr, records(root, CODEX_SID)))
    writer = run(
        "import sys, time\n"
        "paths = sys.argv[2:]\n"
        "for k in range(60):\n"
        "    data = open(paths[k % len(paths)], 'rb').read()\n"
        "    with open(sys.argv[1], 'r+b') as fh:\n"  # in place: the same file, rewritten
        "        fh.write(data); fh.truncate()\n"
        "    time.sleep(0.02)\n",
        str(source),
        *[str(_keep(tmp_path, k, v)) for k, v in enumerate(versions)],
    )
    try:
        while writer.poll() is None:
            memstore.import_logs(root, source)
            held |= set(map(repr, all_records(root)))
    finally:
        writer.wait(timeout=120)
    assert writer.returncode == 0, writer.stderr.read()
    for _ in range(3):  # the source no longer changes: imports converge
        memstore.import_logs(root, source)
    everything = set(map(repr, all_records(root)))
    assert held <= everything, "an import removed records another import (or the agent) had written"
    fresh = tmp_path / "fresh"
    memstore.import_logs(fresh, source)
    assert records(root, CODEX_SID) == records(fresh, CODEX_SID)
    assert [h.session_id for h in memstore.search_memory(root, "zebracornrewrite")]


def _keep(tmp_path: Path, k: int, data: bytes) -> Path:
    path = tmp_path / f"version-{k}.jsonl"
    path.write_bytes(data)
    return path


def test_retention_racing_imports_never_lets_a_tombstoned_session_back(tmp_path):
    data, _ = codex_rollout(80, seed=31)
    source = tmp_path / "src" / NAME
    source.parent.mkdir()
    source.write_bytes(data)
    os.utime(source, (OLD, OLD))  # settled and dated 2026-02: older than any cap
    root = tmp_path / "store"
    memstore.import_logs(root, source)
    retention = run(
        "import sys, time, memstore\n"
        "from memstore.retention import RetentionPolicy\n"
        "for _ in range(40):\n"
        "    memstore.apply_retention(sys.argv[1], RetentionPolicy(0, 0, include_imported=True), apply=True)\n"
        "    time.sleep(0.005)\n",
        str(root),
    )
    importer = run(
        "import sys, memstore\nfor _ in range(40):\n    memstore.import_logs(sys.argv[1], sys.argv[2])\n",
        str(root),
        str(source),
    )
    assert retention.wait(timeout=300) == 0, retention.stderr.read()
    assert importer.wait(timeout=300) == 0, importer.stderr.read()
    stone = Tombstones(root).lookup(CODEX_SID)
    assert stone is not None
    # Whatever the interleaving, once tombstoned the session stays out, and the next imports
    # say so; nothing is left in the trash, pending or not.
    memstore.apply_retention(root, RetentionPolicy(0, 0, include_imported=True), apply=True)
    for _ in range(2):
        report = memstore.import_logs(root, source)
        assert report.sessions_created == 0 and [t.session_id for t in report.tombstoned] == [CODEX_SID]
    assert CODEX_SID not in {s.session_id for s in memstore.list_sessions(root)}
    assert not (root / ".trash").exists() or not any((root / ".trash").iterdir())


def test_an_import_while_the_agent_holds_the_session_keeps_the_agents_events(tmp_path):
    data, _ = codex_rollout(40, seed=41)
    source = tmp_path / "src" / NAME
    source.parent.mkdir()
    cut = data.index(b"\n", len(data) // 2) + 1
    source.write_bytes(data[:cut])
    root = tmp_path / "store"
    memstore.import_logs(root, source)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, memstore\n"
            "log = memstore.open_session(sys.argv[1], sys.argv[2])\n"
            "log.append({'type': 'turn.started'})\n"
            "log.append({'type': 'item.completed', 'item': {'id': 'h1', 'type': 'agent_message', 'text': 'held'}})\n"
            "log.flush()\n"
            "print('ready', flush=True)\n"
            "sys.stdin.read()\n"
            "log.append({'type': 'turn.completed', 'usage': {'input_tokens': 1, 'cached_input_tokens': 0,"
            " 'cache_creation_tokens': 0, 'output_tokens': 1}})\n"
            "log.close()\n",
            str(root),
            CODEX_SID,
        ],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "ready"
        source.write_bytes(data[:cut].replace(b'"task 0:', b'"TASK 0:'))  # rewritten: it would be set aside
        busy = memstore.import_logs(root, source)
        assert busy.set_aside == [] and any("open in another process" in p.reason for p in busy.problems)
    finally:
        holder.stdin.close()
        assert holder.wait(timeout=60) == 0
    before = records(root, CODEX_SID)
    report = memstore.import_logs(root, source)
    [entry] = report.set_aside
    assert records(root, entry.set_aside_as) == before
    assert [e["item"]["text"] for _, e in before if e.get("item", {}).get("id") == "h1"] == ["held"]


KILLED_AT = """
import importlib, os, signal, memstore
holder = importlib.import_module({module!r})
*path, name = {attribute!r}.split(".")
for part in path:
    holder = getattr(holder, part)

def die(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGKILL)

setattr(holder, name, die)
{call}
"""


def killed_at(module: str, attribute: str, call: str) -> int:
    """Run ``call`` in a process that is SIGKILLed the moment it reaches ``module.attribute``."""
    code = KILLED_AT.format(module=module, attribute=attribute, call=call)
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, timeout=120, capture_output=True).returncode


def test_an_import_killed_while_setting_a_session_aside_loses_nothing(tmp_path):
    data, _ = codex_rollout(30, seed=51)
    source = tmp_path / "src" / NAME
    source.parent.mkdir()
    source.write_bytes(data)
    root = tmp_path / "store"
    memstore.import_logs(root, source)
    before = records(root, CODEX_SID)
    source.write_bytes(data.replace(b'"task 0:', b'"TASK 0:'))  # rewritten: its session is set aside
    # Killed after the rename, before the set-aside session was relabelled.
    code = killed_at(
        "memstore.importers.setaside", "rebuild_index", f"memstore.import_logs({str(root)!r}, {str(source)!r})"
    )
    assert code == -signal.SIGKILL
    report = memstore.import_logs(root, source)
    sessions = sorted(s.session_id for s in memstore.list_sessions(root))
    [aside] = [sid for sid in sessions if ".superseded-" in sid]
    assert sessions == sorted([CODEX_SID, aside])  # listed once each, under its own id
    assert records(root, aside) == before
    assert report.sessions_created == 1
    fresh = tmp_path / "fresh"
    memstore.import_logs(fresh, source)
    assert records(root, CODEX_SID) == records(fresh, CODEX_SID)


def test_retention_killed_after_the_tombstone_never_loses_the_session_nor_lets_it_double(tmp_path):
    data, _ = codex_rollout(20, seed=61)
    source = tmp_path / "src" / NAME
    source.parent.mkdir()
    source.write_bytes(data)
    os.utime(source, (OLD, OLD))
    root = tmp_path / "store"
    memstore.import_logs(root, source)
    before = records(root, CODEX_SID)
    # The tombstone is written (and synced), then the process dies before the gc-log line: the
    # removal never became final.
    code = killed_at(
        "memstore.retention",
        "GcLog.record",
        f"memstore.apply_retention({str(root)!r}, memstore.RetentionPolicy(0, 0, include_imported=True), apply=True)",
    )
    assert code == -signal.SIGKILL
    assert Tombstones(root).lookup(CODEX_SID) is not None
    # The next retention run puts the unrecorded removal back (the session is whole again) ...
    memstore.mark_abandoned_active_sessions(root, 30)  # (any retention run empties the trash first)
    memstore.apply_retention(root, RetentionPolicy(50, 3650), apply=True)
    assert records(root, CODEX_SID) == before
    # ... and imports, seeing the tombstone, leave it alone rather than import it a second time.
    report = memstore.import_logs(root, source)
    assert report.events_appended == 0 and [t.session_id for t in report.tombstoned] == [CODEX_SID]
    assert records(root, CODEX_SID) == before


def test_two_processes_importing_one_growing_source_write_each_event_once(tmp_path):
    data, _ = codex_rollout(150, seed=71)
    source = tmp_path / "src" / NAME
    source.parent.mkdir()
    lines = data.split(b"\n")[:-1]
    source.write_bytes(b"")
    root = tmp_path / "store"
    loop = (
        "import sys, memstore, time\n"
        "for _ in range(25):\n"
        "    memstore.import_logs(sys.argv[1], sys.argv[2])\n"
        "    time.sleep(0.01)\n"
    )
    importers = [run(loop, str(root), str(source)) for _ in range(2)]
    step = max(1, len(lines) // 20)
    for k in range(0, len(lines), step):  # the agent writes its rollout while both import it
        with open(source, "ab") as fh:
            fh.write(b"".join(line + b"\n" for line in lines[k : k + step]))
        time.sleep(0.02)
    for child in importers:
        assert child.wait(timeout=300) == 0, child.stderr.read()
    memstore.import_logs(root, source)
    fresh = tmp_path / "fresh"
    memstore.import_logs(fresh, source)
    assert records(root, CODEX_SID) == records(fresh, CODEX_SID)
    assert [s.session_id for s in memstore.list_sessions(root)] == [CODEX_SID]
