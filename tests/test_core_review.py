"""Adversarial review of the write/recovery path and the trash: each test proves a bug that was
found (and then fixed)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import memstore
import support

TURN_STARTED = {"type": "turn.started"}
TURN_COMPLETED = {"type": "turn.completed", "usage": {}}


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
    child = subprocess.run([sys.executable, "-c", textwrap.dedent(f"""
        import os, signal
        from memstore.locks import remove_session_directory
        def on_moved():  # killed before the removal is recorded
            os.kill(os.getpid(), signal.SIGKILL)
        remove_session_directory({str(tmp_path)!r}, {str(directory)!r}, on_moved=on_moved)
    """)], timeout=60)
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


def test_a_rescan_interrupted_between_batches_without_manifest_json_never_reuses_the_old_indexs_seqs(tmp_path, monkeypatch, fault):
    """The index described seqs up to 10, the log lost its last four lines (a power cut) and
    manifest.json is gone: a rescan keeps next_seq at 11 from the old index. Interrupted after
    its first batch (the old index is discarded by then) and resumed, it must too: seqs 7-10
    were handed out once."""
    with memstore.open_session(tmp_path, "s") as log:
        for _ in range(5):
            log.append(TURN_STARTED)
            log.append(TURN_COMPLETED)
        directory = log.directory
    path = directory / "events.jsonl"
    path.write_bytes(b"".join(path.read_bytes().splitlines(keepends=True)[:6]))
    (directory / "manifest.json").unlink()

    support.interrupt_the_next_rescan_after_its_first_batch(monkeypatch, fault, path)
    try:
        memstore.open_session(tmp_path, "s")
    except memstore.StoreIOError:
        pass
    fault.disarm("recovery.batch")
    with memstore.open_session(tmp_path, "s") as log:
        assert log.append(TURN_STARTED) == 11, "a seq the old index had counted was handed out again"
