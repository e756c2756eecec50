"""manifest.json is replaced at most every ``TUNING.manifest_interval_seconds`` while turns end
faster than that (each replacement is a new file and a rename the log's next fdatasync commits
too): the newest version held back is written once due, without any further append, and at
once by ``flush()``/``close()``; what it says is always the newest state by then."""

from __future__ import annotations

import json
import time

import memstore
from memstore.session.tuning import TUNING


def _manifest(root) -> dict:
    return json.loads((memstore.session_directory(root, "s") / "manifest.json").read_bytes())


def _turn(log, n: int) -> None:
    log.append({"type": "turn.started"})
    log.append({"type": "item.completed", "item": {"type": "agent_message", "text": f"turn {n}"}})
    log.append({"type": "turn.completed", "usage": {}})


def test_turns_faster_than_the_interval_replace_the_manifest_less_often(tmp_path, fault, monkeypatch):
    monkeypatch.setattr(TUNING, "manifest_interval_seconds", 0.5)
    written: list[bytes] = []
    fault.arm("manifest.publish", lambda path, data: written.append(data))
    log = memstore.open_session(tmp_path, "s")
    for n in range(1, 41):
        _turn(log, n)
    log.flush()  # the one held back is written at once
    assert _manifest(tmp_path)["turn_count"] == 40
    assert 1 <= len(written) < 40, len(written)
    log.close()


def test_a_held_back_manifest_is_written_once_due_without_another_append(tmp_path, monkeypatch):
    monkeypatch.setattr(TUNING, "manifest_interval_seconds", 0.3)
    log = memstore.open_session(tmp_path, "s")
    for n in range(1, 6):
        _turn(log, n)
    deadline = time.monotonic() + 10
    while _manifest(tmp_path)["turn_count"] != 5 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _manifest(tmp_path)["turn_count"] == 5
    log.close()
