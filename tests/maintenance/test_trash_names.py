"""The trash: a removal killed before it was recorded, whose name a newer session took, is kept
once and said once."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from support import TURN_COMPLETED, TURN_STARTED

import memstore


def test_a_crash_left_removal_whose_name_was_taken_again_is_kept_once_not_retried_forever(tmp_path, caplog):
    """A remover killed before its gc-log line leaves ``<name>-<id>.pending`` in the trash, and
    the next emptying puts it back. When a newer session took the name meanwhile (an importer's
    ids are deterministic: a re-import recreates it), it cannot go back: it must be kept (never
    deleted unrecorded) and said once, not tried again with a warning and an error on every
    retention run for ever."""
    with memstore.open_session(tmp_path, "s") as log:
        log.append(TURN_STARTED)
        log.append(TURN_COMPLETED)
        directory = log.directory
    old = (directory / "events.jsonl").read_bytes()
    child = subprocess.run(
        [
            sys.executable,
            "-c",
            textwrap.dedent(f"""
        import os, signal
        from memstore.locks import remove_session_directory
        def on_moved():  # killed before the removal is recorded
            os.kill(os.getpid(), signal.SIGKILL)
        remove_session_directory({str(tmp_path)!r}, {str(directory)!r}, on_moved=on_moved)
    """),
        ],
        timeout=60,
    )
    assert child.returncode == -9
    with memstore.open_session(tmp_path, "s") as log:  # the id is used again
        log.append(TURN_STARTED)

    noisy_runs = 0
    for _ in range(3):
        caplog.clear()
        with caplog.at_level("WARNING", logger="memstore"):
            memstore.apply_retention(tmp_path, memstore.RetentionPolicy(50, 30), apply=True)
        noisy_runs += any("trash" in r.getMessage() for r in caplog.records)
    assert noisy_runs == 1, f"{noisy_runs} of 3 retention runs logged about the same trash entry"
    kept = [p for p in (tmp_path / ".trash").iterdir()]
    assert len(kept) == 1 and (kept[0] / "events.jsonl").read_bytes() == old, "the unrecorded session was lost"
    assert not (tmp_path / "gc-log.jsonl").exists()
    with memstore.open_session(tmp_path, "s") as log:
        assert log.event_count == 1, "the newer session was disturbed"
