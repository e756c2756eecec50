"""A retention run killed (SIGKILL, in a real subprocess) in the middle of a removal loses
nothing and records nothing twice: the next run completes a removal that was recorded in
``gc-log.jsonl`` before the kill, and puts back a session whose removal was not yet recorded,
with every event it held.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import orjson
import pytest

import memstore
from memstore.retention import RetentionPolicy

OLD = "2025-01-01T00:00:00.000Z"
USAGE = {"input_tokens": 120, "cached_input_tokens": 0, "cache_creation_tokens": 0, "output_tokens": 48}
AGE_OUT = RetentionPolicy(max_sessions=50, max_age_days=30)
KEEP_ALL = RetentionPolicy(max_sessions=50, max_age_days=0)  # 0: no age limit

_KILLED_RUN = textwrap.dedent(
    """
    import os, signal, sys
    from memstore import faults
    import memstore
    from memstore.retention import RetentionPolicy

    faults.arm(sys.argv[2], lambda **_: os.kill(os.getpid(), signal.SIGKILL))
    memstore.apply_retention(sys.argv[1], RetentionPolicy(max_sessions=50, max_age_days=30), apply=True)
    print("retention finished without reaching the fault point")
    """
)


def _store(root: Path) -> bytes:
    """A store with an old session retention ages out, and a current one it keeps; the old
    session's log bytes."""
    with memstore.open_session(root, "old") as log:
        log.append({"type": "turn.started"}, ts=OLD)
        log.append(
            {"type": "item.completed", "item": {"type": "agent_message", "text": "Refactored the cache layer."}},
            ts=OLD,
        )
        log.append({"type": "turn.completed", "usage": USAGE}, ts=OLD)
    with memstore.open_session(root, "current") as log:
        log.append({"type": "turn.started"})
        log.append({"type": "turn.completed", "usage": USAGE})
    return (root / "sessions" / "old" / "events.jsonl").read_bytes()


def _gc_lines(root: Path) -> list[dict]:
    path = root / "gc-log.jsonl"
    return [orjson.loads(line) for line in path.read_bytes().splitlines()] if path.exists() else []


def _kill_retention_at(root: Path, point: str) -> None:
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(
            filter(None, [str(Path(memstore.__file__).parent.parent), os.environ.get("PYTHONPATH")])
        ),
    )
    done = subprocess.run(
        [sys.executable, "-c", _KILLED_RUN, str(root), point], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == -9, (done.returncode, done.stdout, done.stderr)
    (pending,) = list((root / ".trash").iterdir())
    assert pending.name.startswith("old-") and pending.name.endswith(".pending")


@pytest.mark.slow
def test_a_run_killed_after_recording_a_removal_is_completed_by_the_next_run_once(tmp_path, caplog):
    """Killed once the gc-log line is written and before the trash entry is final: the next run
    (whatever its policy) finishes that removal, and the gc-log holds it exactly once."""
    root = tmp_path / "store"
    _store(root)
    _kill_retention_at(root, "trash.recorded")
    assert [line["directory"] for line in _gc_lines(root)] == ["sessions/old"]
    caplog.set_level(logging.WARNING)

    report = memstore.apply_retention(root, KEEP_ALL, apply=True)

    assert report.count == 0
    assert [line["directory"] for line in _gc_lines(root)] == ["sessions/old"]
    assert not (root / "sessions" / "old").exists()
    assert list((root / ".trash").iterdir()) == []
    assert not any("never recorded" in r.getMessage() for r in caplog.records)
    assert any("completing it" in r.getMessage() for r in caplog.records)
    assert memstore.Store(root).session_ids() == ["current"]


@pytest.mark.slow
def test_a_run_killed_before_recording_a_removal_puts_the_session_back_whole(tmp_path):
    """Killed with the session in the trash and its removal not recorded: the next run puts it
    back, byte for byte, and readable; nothing was recorded, so nothing is recorded twice."""
    root = tmp_path / "store"
    before = _store(root)
    _kill_retention_at(root, "trash.moved")
    assert _gc_lines(root) == []

    memstore.apply_retention(root, KEEP_ALL, apply=True)

    assert (root / "sessions" / "old" / "events.jsonl").read_bytes() == before
    assert list((root / ".trash").iterdir()) == []
    assert _gc_lines(root) == []
    with memstore.read_session(root, "old") as reader:
        assert reader.manifest.turn_count == 1
    # And a run that ages it out records it once.
    assert memstore.apply_retention(root, AGE_OUT, apply=True).count == 1
    assert [line["directory"] for line in _gc_lines(root)] == ["sessions/old"]
