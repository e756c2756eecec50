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
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from .. import faults
from ..changes import mark_session_changed
from ..errors import StoreIOError
from ..fsio import fsync_dir
from . import registry
from .index import EvictSpec
from .indexslot import IndexSlot
from .manifest import CapRewriteMarker, StagedFile, clear_marker, publish_manifest, summary_cache
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
    # A cap rewrite to apply to the index before the rows (which describe the rewritten log).
    evict: Optional[EvictSpec] = None
    # Commit the index with a synced WAL, and write manifest.json durably (a cap rewrite's index,
    # recovery's manifest when it finishes a rewrite).
    durable: bool = False
    # The cap rewrite's marker, removed once the index is durable (manifest.json already is).
    clear_marker: Optional[CapRewriteMarker] = None
    # Work that follows the batch off the writer's thread and needs nothing of the index (a cap
    # rewrite's summary file and pruning, closing the replaced log): run once, whether or not
    # the index transaction worked, each failure logged.
    after: list[Callable[[], None]] = field(default_factory=list)

    def merge(self, newer: Batch) -> None:
        if newer.evict is not None:
            if self.evict is not None or self.rows or self.manifest_row is not None:
                # A rewrite's offsets are of the log before it: nothing written since may come first.
                raise AssertionError("a cap rewrite's batch merged after other rows")
            self.evict = newer.evict
        self.durable = self.durable or newer.durable
        if newer.clear_marker is not None:
            self.clear_marker = newer.clear_marker
        self.after.extend(newer.after)
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
        # The newest manifest not written yet because the last one was written less than
        # TUNING.manifest_interval_seconds ago (at ``_manifest_at``, time.monotonic()): the
        # thread writes it once due, and drain() at once.
        self._deferred: Optional[bytes] = None
        self._manifest_at = 0.0
        # Called (in the committing thread) after each commit of event rows: the deriver's wake.
        self.on_commit: Optional[Callable[[], None]] = None

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
            while (
                self._pending is not None
                and len(self._pending.rows) >= TUNING.max_pending_rows
                and not self._held
                and self._thread.is_alive()
            ):
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
            logger.warning(
                "updating the views of %s failed (the log is intact; retried at the next flush): %s",
                self.manifest_path.parent,
                exc,
            )
            with self._cond:
                self._pending, self._held, self._error = batch, True, exc

    def _deferred_wait(self) -> Optional[float]:
        """Seconds until the deferred manifest is due (``None``: there is none). Under ``_cond``."""
        if self._deferred is None:
            return None
        return self._manifest_at + TUNING.manifest_interval_seconds - time.monotonic()

    def _run(self) -> None:
        registry.mark_background_thread()
        while True:
            with self._cond:
                while (self._pending is None or self._held) and not self._stopping:
                    wait = self._deferred_wait()
                    if wait is not None and wait <= 0:
                        break
                    self._cond.wait(wait)
                if self._pending is None or self._held:
                    if self._stopping or self._deferred is None:
                        return
                    batch, self._deferred = Batch(manifest_json=self._deferred), None  # it is due
                else:
                    batch, self._pending = self._pending, None
                self._busy = True
            try:
                self._publish(batch)
            except BaseException as exc:  # reported by drain(); the batch is kept and retried
                logger.warning(
                    "updating the views of %s failed (the log is intact; retried at the next flush): %s",
                    self.manifest_path.parent,
                    exc,
                )
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
        try:
            self._commit_and_publish(batch)
        finally:
            after, batch.after = batch.after, []
            for action in after:
                try:
                    action()
                except Exception as exc:  # noqa: BLE001 - none of it is the index's or the log's
                    logger.warning("after updating the views of %s: %s", self.manifest_path.parent, exc)

    def _commit_and_publish(self, batch: Batch) -> None:
        if batch.manifest_row is not None:
            slot = self.slot
            with slot.lock:
                if slot.index is None:
                    raise AssertionError(f"{self.manifest_path.parent}: a batch to commit with no index open")
                slot.index.commit_rows(
                    batch.rows,
                    list(batch.turns.values()),
                    batch.manifest_row,
                    batch.tail,
                    lines=batch.lines,
                    evict=batch.evict,
                    durable=batch.durable,
                )
            # Committed: should the manifest fail now, only it is tried again.
            had_rows = bool(batch.rows) or batch.evict is not None
            batch.rows, batch.lines, batch.turns, batch.manifest_row, batch.evict = [], None, {}, None, None
            if had_rows:
                mark_session_changed(self.manifest_path.parent)  # the rows a search copies are in
            if had_rows and self.on_commit is not None:
                self.on_commit()
        now = time.monotonic()
        if (
            batch.manifest_json is not None
            and batch.manifest_json != self.published
            and not batch.durable
            and threading.current_thread() is self._thread
            and now - self._manifest_at < TUNING.manifest_interval_seconds
        ):
            with self._cond:
                self._deferred = batch.manifest_json  # the newest wins; written once due
        elif batch.manifest_json is not None and batch.manifest_json != self.published:
            faults.check("manifest.publish", path=self.manifest_path, data=batch.manifest_json)
            publish_manifest(self.manifest_path, batch.manifest_json, durable=batch.durable)
            self.published = batch.manifest_json
            mark_session_changed(self.manifest_path.parent)  # after it is in place: see memstore.changes
            with self._cond:
                self._manifest_at = now
                self._deferred = None  # older than what was just written
        elif batch.durable and batch.manifest_json is not None:
            # Already in place (published from the writer's thread): only its sync is left.
            faults.check("manifest.sync", path=self.manifest_path)
            sync_in_place(self.manifest_path)
        if batch.clear_marker is not None:
            # The index and manifest.json describing the rewritten log are durable: the marker
            # has nothing left to say (reference: it stays until both are).
            faults.check("cap.unmark", path=self.manifest_path.parent)
            clear_marker(self.manifest_path.parent, only=batch.clear_marker)
            batch.clear_marker = None

    def install_manifest(self, staged: StagedFile, manifest_json: bytes) -> None:
        """Rename a synced temp file holding ``manifest_json`` over manifest.json (a cap
        rewrite's, from the writer's thread while this publisher is idle; the caller syncs the
        directory)."""
        with self._cond:
            self._deferred = None  # older than the rewrite's (drained before it, normally)
        staged.install()
        summary_cache.invalidate(self.manifest_path)
        self.published = manifest_json
        mark_session_changed(self.manifest_path.parent)

    def publish_manifest_now(self, manifest_json: bytes, *, durable: bool = False) -> None:
        """Publish ``manifest_json`` from the calling thread once every batch before it is
        committed, and wait until it is written; raise if that fails."""
        self.drain()
        self.publish_here(Batch(manifest_json=manifest_json, durable=durable))
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
                if self._deferred is not None:
                    batch = batch or Batch()
                    if batch.manifest_json is None:
                        batch.manifest_json = self._deferred
                    self._deferred = None
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
            deferred, self._deferred = self._deferred, None
            if deferred is None:
                return
            self._busy = True
        # The manifest the thread held back (see TUNING.manifest_interval_seconds): written now.
        try:
            self._publish(Batch(manifest_json=deferred))
        except BaseException as exc:
            with self._cond:
                if self._pending is None:
                    self._pending = Batch(manifest_json=deferred)
                self._held, self._error = True, exc
            raise
        finally:
            with self._cond:
                self._busy = False
                self._cond.notify_all()

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
        self._deferred = None


def sync_in_place(path: Path) -> None:
    """Make a file that is already in place durable: its data, then its directory entry."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise StoreIOError.from_os_error("open", path, exc) from exc
    try:
        os.fdatasync(fd)
    except OSError as exc:
        raise StoreIOError.from_os_error("fdatasync", path, exc) from exc
    finally:
        os.close(fd)
    fsync_dir(path.parent)
