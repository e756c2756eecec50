"""Catching up the lazy derived tables (the search chunks) off the agent's path.

Chunking an event and indexing its text in FTS5 costs several times what writing it does, so a
writer never does it while appending. Each open session has a deriver thread that waits until
the agent has been idle for a moment (agents spend most of their time waiting for a model),
then derives the records past the index's ``derived_state`` watermark in small batches, each
its own index transaction. It gives way as soon as the agent writes again, and stops at close;
whatever is left is caught up by the next writer, and meanwhile readers derive the missing rows
in memory. ``rebuild`` derives everything before it returns.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Optional, Protocol

from .. import faults
from ..store_redaction import StoreRedaction
from . import registry
from .index import BatchRecord, derived_tables
from .indexslot import IndexSlot
from .logfile import LogFile
from .tuning import TUNING

logger = logging.getLogger("memstore")


class DeriveSource(Protocol):
    """What the deriver uses of the session it derives for (the session's writer is one)."""

    @property
    def lock(self) -> threading.RLock:
        """The session's lock, taken without waiting (a busy lock means the agent is at work:
        the deriver gives way) while the deriver reads the index and the log and while it
        commits a batch, so no rewrite of the log happens meanwhile."""

    @property
    def slot(self) -> IndexSlot:
        """The index, and the lock of its connection."""

    @property
    def log(self) -> LogFile:
        """The log, read with positioned reads only."""

    @property
    def active(self) -> float:
        """``time.monotonic()`` when the agent last wrote."""

    @property
    def redaction(self) -> Optional[StoreRedaction]:
        """The store's redaction: every event is redacted before a derived table sees it
        (``None``: derived as written)."""

    def live_generation(self) -> Optional[int]:
        """The generation of the log and index (it changes when a cap rewrite or a rebuild
        replaces them); ``None`` when the session failed or its index is closed."""


# What derive_batch returns when it did nothing but is not caught up: the session's lock was
# taken (the agent is at work), or the log was rewritten meanwhile (the next call starts from
# the new state).
INTERRUPTED = -1


def derive_batch(
    source: DeriveSource,
    *,
    stop: Optional[threading.Event] = None,
    max_events: Optional[int] = None,
    max_bytes: Optional[int] = None,
) -> int:
    """Derive the next batch of records (at most ``max_events`` and, past the first, ``max_bytes``;
    by default the :data:`TUNING` batch); return how many (0 when caught up, ``INTERRUPTED`` when
    it had to give way)."""
    if max_events is None:
        max_events = TUNING.derive_batch_events
    if max_bytes is None:
        max_bytes = TUNING.derive_batch_bytes
    lock = source.lock
    if not _acquire(lock, stop):
        return INTERRUPTED
    try:
        generation = source.live_generation()
        index = source.slot.index
        if generation is None or index is None:
            return 0
        with source.slot.lock:
            if index.committed_generation() != generation:
                # A cap rewrite replaced the log and the publisher has not yet applied it to
                # the index: its offsets are of the old log.
                return INTERRUPTED
            watermark = index.derived_watermark()
            rows = index.underived(watermark, max_events)
        if not rows:
            return 0
        taken: list[tuple[int, int, int, Optional[int], Optional[str]]] = []
        size = 0
        for row in rows:
            if taken and size + row[2] > max_bytes:
                break
            taken.append(row)
            size += row[2]
        start = taken[0][1]
        data = source.log.pread(start, taken[-1][1] + taken[-1][2] - start)
    finally:
        lock.release()
    records = []
    redaction = source.redaction
    for seq, offset, length, turn, ts in taken:
        record = BatchRecord(seq, turn, ts, offset, length, line=data[offset - start : offset - start + length])
        _ = record.event  # decode (and redact) here, outside the session's lock
        if redaction is not None:
            record = BatchRecord(seq, turn, ts, offset, length, event=redaction.redact_event(record.event))
        records.append(record)
    lock = source.lock
    if not _acquire(lock, stop):
        return INTERRUPTED
    try:
        now = source.live_generation()
        index = source.slot.index
        if now is None or index is None:
            return 0
        if now != generation:
            return INTERRUPTED  # rewritten or rebuilt meanwhile
        with source.slot.lock:
            if index.derived_watermark() != watermark:
                return INTERRUPTED
            index.commit_derived(records, taken[-1][0])
    finally:
        lock.release()
    return len(records)


def derive_all(source: DeriveSource) -> int:
    """Derive every record the lazy derived tables lack (``rebuild`` calls this)."""
    total = 0
    while True:
        done = derive_batch(source, max_events=5_000, max_bytes=4 << 20)
        if done == INTERRUPTED:
            continue  # a writer rewrote the log meanwhile: from the new state
        if not done:
            return total
        total += done


def _acquire(lock: threading.RLock, stop: Optional[threading.Event]) -> bool:
    """Take the session's lock. The background deriver never waits for it: a busy lock means
    the agent is writing (or closing), and then it gives way."""
    if stop is None:
        lock.acquire()
        return True
    if stop.is_set() or not lock.acquire(blocking=False):
        return False
    if stop.is_set():
        lock.release()
        return False
    return True


class Deriver:
    """The background thread of one open session that keeps its lazy derived tables current."""

    def __init__(self, source: DeriveSource):
        self.source = source
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._starting = threading.Lock()  # the writer's thread and the publisher's may both start it
        self.error: Optional[BaseException] = None

    @staticmethod
    def needed() -> bool:
        return bool(derived_tables(lazy=True))

    def start(self) -> None:
        """Start the thread (if it is not running) and let it look for work."""
        with self._starting:
            if self._thread is None and not self._stop.is_set():
                self._thread = threading.Thread(target=self._run, name="memstore-deriver", daemon=True)
                self._thread.start()
        self._wake.set()

    def wake(self) -> None:
        """New records were committed to the index (the publisher calls this after each commit
        of rows: woken earlier, the deriver could look before they are there, find nothing to
        do and sleep until the next batch). The thread starts with the first."""
        self.start()

    def stop(self) -> None:
        """Stop after the current batch (which is either committed or not started)."""
        self._stop.set()
        self._wake.set()
        with self._starting:  # a start() in progress (the publisher's wake) has started its thread
            thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join()
        faults.check("deriver.stopped", path=self.source.log.dir)

    def forget(self) -> None:
        """In a forked child: the thread does not exist there."""
        self._thread = None
        self._starting = threading.Lock()
        self._stop.set()

    def _run(self) -> None:
        registry.mark_background_thread()
        source = self.source
        while not self._stop.is_set():
            self._wake.wait()
            self._wake.clear()
            while not self._stop.is_set():
                idle = TUNING.derive_idle_seconds
                quiet = time.monotonic() - source.active
                if quiet < idle:
                    self._stop.wait(idle - quiet)
                    continue
                try:
                    done = derive_batch(source, stop=self._stop)
                    if done == INTERRUPTED:
                        # The agent is at work (or rewrote the log): look again once it is idle,
                        # not only at its next append, which may be long in coming.
                        self._stop.wait(idle)
                        continue
                    if not done:
                        break
                except Exception as exc:  # noqa: BLE001 - reported, then the deriver rests
                    # The events are safe in the log and the index; only search lags. Readers
                    # derive what is missing, and the next open tries again.
                    self.error = exc
                    logger.warning(
                        "deriving search chunks for %s failed (readers derive them in memory): %s", source.log.dir, exc
                    )
                    return
