"""``turn.aborted`` on the write path (docs/durability.md): it is a turn boundary like
``turn.completed`` (the buffer is written and synced there, so the aborted turn is acknowledged
when the append returns), it closes the turn as ``aborted``, and a closed aborted turn is
evictable by the cap as any closed turn is."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import memstore

ABORTED = {"type": "turn.aborted", "reason": "interrupted", "usage": {"input_tokens": 3, "output_tokens": 1}}
MESSAGE = {"type": "item.completed", "item": {"type": "agent_message", "text": "reading the parser"}}


def _events_on_disk(root: Path) -> list[str]:
    path = memstore.session_directory(root, "s") / "events.jsonl"
    return [json.loads(line)["event"]["type"] for line in path.read_bytes().splitlines()]


def test_turn_aborted_is_a_write_point(tmp_path):
    """With the default policy, the append of ``turn.aborted`` writes the turn's buffered events
    to ``events.jsonl`` before it returns; an event inside an open turn stays buffered."""
    log = memstore.open_session(tmp_path, "s")
    log.append({"type": "turn.started"})
    log.append(MESSAGE)
    assert _events_on_disk(tmp_path) == []  # buffered until a write point
    log.append(ABORTED)
    assert _events_on_disk(tmp_path) == ["turn.started", "item.completed", "turn.aborted"]
    log.close()


KILLED_AFTER_ABORT = """
import os, signal, sys
import memstore
log = memstore.open_session(sys.argv[1], "s")
log.append({"type": "turn.started"})
log.append({"type": "item.completed", "item": {"type": "agent_message", "text": "reading the parser"}})
log.append({"type": "turn.aborted", "reason": "interrupted"})
print("acknowledged", flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.slow
def test_an_acknowledged_aborted_turn_survives_a_sigkill(tmp_path):
    """A writer SIGKILLed right after its ``turn.aborted`` append returned (no flush, no close):
    the reopened session holds the turn, closed as aborted, with its reason."""
    env = {**os.environ, "PYTHONPATH": str(Path(memstore.__file__).resolve().parent.parent)}
    proc = subprocess.run(
        [sys.executable, "-c", KILLED_AFTER_ABORT, str(tmp_path)], capture_output=True, timeout=60, env=env
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-2000:]
    assert proc.stdout.decode().split() == ["acknowledged"]
    with memstore.open_session(tmp_path, "s") as log:
        (turn,) = log.turns()
        assert (turn.number, turn.status, turn.error, turn.event_count) == (1, "aborted", "interrupted", 3)


def test_the_cap_evicts_an_aborted_turn_as_a_closed_one(tmp_path):
    """An aborted turn is closed: the cap may evict it (the open turn it never evicts), and the
    eviction summary counts its ``turn.aborted``; turn numbers after it are unchanged."""
    with memstore.open_session(tmp_path, "s", max_events=6) as log:
        log.append({"type": "turn.started"})
        log.append(MESSAGE)
        log.append(ABORTED)
        for _ in range(2):
            log.append({"type": "turn.started"})
            log.append({"type": "turn.completed", "usage": {}})
        log.append({"type": "turn.started"})  # 8 records: the cap evicts turn 1 (3) and keeps 5
        assert [(t.number, t.status) for t in log.turns()] == [(2, "completed"), (3, "completed"), (4, "open")]
    path = memstore.session_directory(tmp_path, "s") / "derived" / "eviction-summaries.jsonl"
    (summary,) = [json.loads(line) for line in path.read_bytes().splitlines()]
    assert summary["event_types"] == {"item.completed": 1, "turn.aborted": 1, "turn.started": 1}
    assert summary["grounded_facts"] == ["reading the parser"]
