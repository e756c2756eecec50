"""The write path's tunables: batch sizes and waits that trade speed against memory or latency.

They live in one settings object, :data:`TUNING`, read by the code at the moment it uses them
(never copied into a default argument or a module constant at import), so that a benchmark or a
test may change one for a while (``monkeypatch.setattr(TUNING, "scan_batch_events", 2)``) and
every session, open or opened later, follows. The sizes of the agent's write buffer are not
here: they are read once per append, on the hot path, and stay module constants of
``writer.py``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class Tuning:
    """Every field has the value the benchmarks chose; see where each is used for why."""

    # Events per rescan transaction (recovery.scan): a batch's rows and records stay a few MB
    # (peak RSS of a rescan: 51 MB at 250,000 events, 55 MB at 1,000,000, 39 MB of it the open
    # session), and the per-transaction cost vanishes (5,000 measured as fast as 20,000).
    scan_batch_events: int = 5_000
    # A rescan of a log up to this size builds the index in memory and writes it out whole (see
    # SessionIndex.in_memory): one write and one fdatasync instead of a WAL, its checkpoint and
    # their syncs, which for the small sessions most stores hold cost more than the scan itself.
    # Larger logs are indexed in place, in batches, so memory stays flat however long they are.
    memory_scan_bytes: int = 8 << 20
    # How long the agent must have been idle before the deriver derives search chunks.
    derive_idle_seconds: float = 0.2
    # The deriver's batch: at most this many records and (past the first record) bytes.
    derive_batch_events: int = 500
    derive_batch_bytes: int = 256 * 1024
    # manifest.json is replaced at most this often while turns end faster than that (the newest
    # version waits, and is written once due, or at once by a flush, close, read or cap rewrite):
    # each replacement is a new file and a rename, metadata the next fdatasync of the log has to
    # commit too. An agent's turns are seconds apart, and meet no delay.
    manifest_interval_seconds: float = 0.1
    # When this many event rows wait for the publisher, the writer waits for it: memory stays
    # bounded however fast a bulk import appends.
    max_pending_rows: int = 200_000


TUNING = Tuning()
