"""Rescans: a rescan interrupted between batches never hands out a seq the old index had counted."""

from __future__ import annotations

import support
from support import TURN_COMPLETED, TURN_STARTED

import memstore


def test_a_rescan_interrupted_between_batches_without_manifest_json_never_reuses_the_old_indexs_seqs(
    tmp_path, monkeypatch, fault
):
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
