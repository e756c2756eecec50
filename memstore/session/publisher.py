"""Publishing what was written to the views, off the agent's path: the index transaction, then
the manifest, from a background thread.

At every write point the agent's thread writes the log (and syncs it, per the durability
policy) and hands the rows that describe the new bytes to the session's publisher. The
publisher commits them to the index in one transaction and then replaces ``manifest.json``, so
the order log -> index -> manifest holds, while the agent goes on. Batches that pile up while
a transaction runs are merged into the next one (the newest turn rows and manifest win).

``flush()`` and ``close()`` wait for it (``drain``); a failed transaction is kept and tried
again with the next batch, and its error is raised by the next ``drain``: nothing described is
forgotten, and the log, already durable, never depends on it.
"""

from __future__ import annotations

import logging
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from .. import faults
from . import registry
from .indexslot import IndexSlot
from .manifest import publish_manifest
from .tuning import TUNING

logger = logging.getLogger("memstore")


@dataclass
class Batch:
    """Rows describing written bytes, and the state to record with them."""

    rows: list[tuple] = field(default_factory=list)
    lines: Optional[list[bytes]] = None  # the rows' lines, for eager derived tables
    turns: dict[int, tuple] = field(default_factory=dict)  # turn number -> turn row (the newest wins)
    manifest_row: Optional[tuple] = None
    tail: bytes = b""
    manifest_json: Optional[bytes] = None  # None: do not publish manifest.json with this batch

    def merge(self, newer: Batch) -> None:
        self.rows.extend(newer.rows)
        if newer.lines is not None:
            self.lines = (self.lines or []) + newer.lines
        self.turns.update(newer.turns)
        if newer.manifest_row is not None:
            self.manifest_row, self.tail = newer.manifest_row, newer.tail
        if newer.manifest_json is not None:
            self.manifest_json = newer.manifest_json


class Publisher:
    """The background thread of one open session that commits its batches to the index in
    ``slot`` (under the slot's lock) and publishes its manifest at ``manifest_path`` (see the
    module docstring)."""

    def __init__(self, slot: IndexSlot, manifest_path: Path):
        self.slot = slot
        self.manifest_path = manifest_path
        self._cond = threading.Condition()
        self._pending: Optional[Batch] = None
        # The pending batch failed: it waits for the next submit or drain to be tried again
        # (so a full disk is not retried in a busy loop).
        self._held = False
        self._busy = False
        self._error: Optional[BaseException] = None  # the last failure, until a publish works
        self._thread: Optional[threading.Thread] = None
        self._stopping = False
        self.published: Optional[bytes] = None  # the manifest last written

    def submit(self, batch: Batch) -> None:
        """Hand a batch over (merged into any not yet committed, and trying a failed one
        again); returns at once, unless the publisher is far behind."""
        with self._cond:
            if self._pending is None:
                self._pending = batch
            else:
                self._pending.merge(batch)
            self._held = False
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="memstore-publisher", daemon=True)
                self._thread.start()
            self._cond.notify_all()
            while (self._pending is not None and len(self._pending.rows) >= TUNING.max_pending_rows
                   and not self._held and self._thread.is_alive()):
                self._cond.wait()

    def publish_here(self, batch: Batch) -> None:
        """Publish ``batch`` in the calling thread, after whatever is pending (a failure is
        kept and reported as by :meth:`submit`)."""
        with self._cond:
            idle = self._pending is None and not self._busy and not self._held
        if not idle:
            self.submit(batch)
            return
        try:
            self._publish(batch)
        except BaseException as exc:
            logger.warning("updating the views of %s failed (the log is intact; retried at the next flush): %s",
                           self.manifest_path.parent, exc)
            with self._cond:
                self._pending, self._held, self._error = batch, True, exc

    def _run(self) -> None:
        registry.mark_background_thread()
        while True:
            with self._cond:
                while (self._pending is None or self._held) and not self._stopping:
                    self._cond.wait()
                if self._pending is None or self._held:
                    return
                batch, self._pending = self._pending, None
                self._busy = True
            try:
                self._publish(batch)
            except BaseException as exc:  # reported by drain(); the batch is kept and retried
                logger.warning("updating the views of %s failed (the log is intact; retried at the next flush): %s",
                               self.manifest_path.parent, exc)
                with self._cond:
                    if self._pending is not None:
                        batch.merge(self._pending)
                    self._pending = batch
                    self._held = True
                    self._error = exc
            else:
                with self._cond:
                    self._error = None
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def _publish(self, batch: Batch) -> None:
        if batch.manifest_row is not None:
            slot = self.slot
            with slot.lock:
                if slot.index is None:
                    raise AssertionError(f"{self.manifest_path.parent}: a batch to commit with no index open")
                slot.index.commit_rows(batch.rows, list(batch.turns.values()), batch.manifest_row, batch.tail,
                                       lines=batch.lines)
            # Committed: should the manifest fail now, only it is tried again.
            batch.rows, batch.lines, batch.turns, batch.manifest_row = [], None, {}, None
        if batch.manifest_json is not None and batch.manifest_json != self.published:
            faults.check("manifest.publish", path=self.manifest_path, data=batch.manifest_json)
            publish_manifest(self.manifest_path, batch.manifest_json, durable=False)
            self.published = batch.manifest_json

    def publish_manifest_now(self, manifest_json: bytes) -> None:
        """Publish ``manifest_json`` from the calling thread once every batch before it is
        committed, and wait until it is written; raise if that fails."""
        self.drain()
        self.publish_here(Batch(manifest_json=manifest_json))
        self.drain()  # raises if publishing failed

    @property
    def failing(self) -> bool:
        """Whether a failed batch waits to be tried again (at the next submit or drain)."""
        with self._cond:
            return self._held

    def drain(self) -> None:
        """Wait until every submitted batch is committed and published (trying a failed one
        again first); raise the error if it fails again."""
        with self._cond:
            self._held = False
            self._cond.notify_all()
            thread = self._thread
            if sys.is_finalizing() or thread is None or not thread.is_alive():
                batch, self._pending = self._pending, None
                if batch is not None:
                    # No thread to hand it to (the interpreter is shutting down): publish here.
                    try:
                        self._publish(batch)
                    except BaseException:
                        self._pending, self._held = batch, True
                        raise
                self._error = None
                return
            while (self._pending is not None or self._busy) and not self._held:
                self._cond.wait()
            if self._held:
                assert self._error is not None
                raise self._error

    def stop(self) -> None:
        """Drain, then end the thread."""
        faults.check("publisher.stop", path=self.manifest_path)
        try:
            self.drain()
        finally:
            with self._cond:
                self._stopping = True
                self._cond.notify_all()
            thread, self._thread = self._thread, None
            if thread is not None and not sys.is_finalizing() and thread is not threading.current_thread():
                thread.join()
            self._stopping = False

    def forget(self) -> None:
        """In a forked child: the thread does not exist there (nor do the locks it held)."""
        self._cond = threading.Condition()
        self._thread = None
        self._pending = None
        self._busy = False
