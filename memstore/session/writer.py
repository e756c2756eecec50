"""The writer state of one open session: :class:`SessionWriter`, which every handle of the
session in this process shares.

It owns the session's lock, its lifecycle state and the buffer's bookkeeping, and it hands each
part only what that part needs: the log file (``logfile.py``) holds the bytes; the index slot
(``indexslot.py``) the index connection and its lock; the publisher (``publisher.py``) commits
rows and publishes the manifest from the slot; the deriver (``deriver.py``) reads a narrow view
of it (:class:`~memstore.session.deriver.DeriveSource`); the cap policy (``cap.py``) owns its
back-off and asks the writer for the few things it needs (:class:`~memstore.session.cap.CapWriter`);
recovery (``recovery.py``) gets the log file, the slot, the publisher and the directory.

Durability ordering at every write point: (1) one ``write()`` of whole lines, (2) ``fdatasync``
per the durability policy, (3) the index transaction, (4) the manifest's atomic replace. Each
later step only describes bytes an earlier step made durable, so after any crash the views are
at most behind the log, never ahead of it. (Bulk mode, ``durability="none"``, indexes written
but unsynced bytes; an open that finds the log shorter than its metadata checks which bytes
went missing before trusting either.)
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import BinaryIO, Optional

import orjson

from .. import events as ev
from ..errors import LogFailedError, MemstoreError, SessionBusyError, StoreIOError, TurnNotFound
from ..fsio import ensure_private_dir, fsync_dir, temp_file_pid
from ..layout import DERIVED_DIR, INDEX_DIR, INDEX_FILE, MANIFEST_FILE
from ..store_redaction import StoreRedaction
from . import registry
from .cap import CapPolicy, EvictionHook, HookRunning, log_head
from .deriver import Deriver
from .index import EvictSpec, SessionIndex, Turn, derived_tables, manifest_row
from .indexslot import IndexSlot
from .lifecycle import LogState
from .lock import LivenessLock
from .logfile import LogFile
from .manifest import CapRewriteMarker, Manifest
from .publisher import Batch, Publisher
from .recovery import recover

logger = logging.getLogger("memstore")

# The write buffer is written once it holds this much (and the views told once this much is
# unpublished); bulk mode hands rows to the index once this much is unindexed. Read on every
# append, so module constants rather than tunables.
MAX_WRITE_BUFFER_BYTES = 65_536
BULK_INDEX_BYTES = 1 << 20

_check_event = ev.check_event
_LIFECYCLE_KINDS = ev.LIFECYCLE_KINDS
_MAX_SEQ = ev.MAX_SEQ
_loads = orjson.loads
_utc_now = ev.utc_now
_encode_record = ev.encode_record
# SQLite connections a forked child inherited: closing them (even by garbage collection) could
# checkpoint the parent's database under it, so they are kept referenced and unused.
_inherited_connections: list[Optional[SessionIndex]] = []


class SessionWriter:
    """The state every handle of one session in this process shares: one log file, one
    lifecycle state, one index slot, one publisher, one cap policy and one liveness lock.

    Its state changes only under ``lock`` (``open_session``, the handles and the deriver take
    it; a forked child's inherited copy is abandoned without it); the index connection is used
    under ``slot.lock`` wherever the publisher's or the deriver's thread may be using it too.
    """

    def __init__(self, session_id: str, directory: Path, key: str, redaction: Optional[StoreRedaction] = None):
        self.session_id = session_id
        # The store's redaction: the deriver redacts events before deriving from them, and with
        # ``at_write`` append redacts each event before it is encoded.
        self.redaction = redaction
        self._redact_on_write = redaction.redact_event if redaction is not None and redaction.at_write else None
        self.dir = directory
        self.key = key  # the directory's real path: the registry's key
        self.log = LogFile(directory)
        self.slot = IndexSlot(directory / INDEX_DIR / INDEX_FILE)
        self.lock = threading.RLock()
        self.handles = 0
        self.ready = False
        self.inherited = False
        self.state: LogState  # set by recovery, on open
        # Rows describing bytes written (or buffered) that the publisher has not been handed yet.
        self.pending: list[tuple] = []
        # The lines of the pending rows, kept only when eager derived tables need the events.
        self.pending_lines: Optional[list[bytes]] = [] if derived_tables(lazy=False) else None
        self.unpublished = 0
        self.failed: Optional[BaseException] = None
        # When the agent last wrote: the deriver waits for a quiet moment.
        self.active = 0.0
        # The log's first line names the session when the directory name cannot (a hashed id).
        self.head_id = session_id if directory.name != session_id else None
        self.liveness = LivenessLock(directory)
        self.publisher = Publisher(self.slot, directory / MANIFEST_FILE)
        self.cap = CapPolicy(self.log, self.publisher, directory, self.head_id, self)
        self.deriver: Optional[Deriver] = Deriver(self) if Deriver.needed() else None
        if self.deriver is not None:
            self.publisher.on_commit = self.deriver.wake

    @property
    def events_path(self) -> Path:
        return self.log.path

    @property
    def index_path(self) -> Path:
        return self.slot.path

    # -- open ------------------------------------------------------------------------------

    def open(self, *, force_rescan: bool = False) -> None:
        # The lock first: only under it is the directory safe from retention's removal.
        if not self.liveness.acquire() and self.liveness.holder_elsewhere:
            raise SessionBusyError(
                f"session {self.session_id!r} is open in another process ({self.liveness.path} is locked); "
                "memstore allows one writing process per session"
            )
        try:
            new_subdirs = not (self.dir / INDEX_DIR).is_dir() or not (self.dir / DERIVED_DIR).is_dir()
            ensure_private_dir(self.dir / INDEX_DIR, sync=False)
            ensure_private_dir(self.dir / DERIVED_DIR, sync=False)
            self._remove_dead_temp_files()
            if not self.log.open() and new_subdirs:
                fsync_dir(self.dir)  # creating events.jsonl would have synced it
            self.recover(force_rescan=force_rescan)
            # (A rebuild derives everything itself, in its own thread.)
            if self.deriver is not None and not force_rescan and self._derived_lags():
                self.deriver.start()  # an index left behind by an earlier run
        except BaseException:
            try:
                self.publisher.stop()
            except Exception as exc:
                logger.debug("stopping the manifest publisher of a failed open: %s", exc)
            self._close_files()
            self.liveness.release()
            raise

    def recover(self, *, force_rescan: bool) -> None:
        """Bring the state, index and manifest in line with the log (see ``recovery.py``)."""
        recover(
            self.log,
            self.slot,
            self.publisher,
            self.dir,
            self.session_id,
            force_rescan=force_rescan,
            use_state=self._use_state,
            redact_event=self.redaction.redact_event if self.redaction is not None else None,
        )

    def _use_state(self, state: LogState) -> None:
        self.state = state
        if self.redaction is not None:
            state.redact_error = self.redaction.redact_event

    def _derived_lags(self) -> bool:
        with self.slot.lock:
            index = self._index()
            return index.derived_watermark() < index.max_seq()

    def _index(self) -> SessionIndex:
        """The open index (the session is open, so there is one)."""
        index = self.slot.index
        if index is None:
            raise AssertionError(f"{self.dir}: the session's index is not open")
        return index

    def fully_derived(self) -> bool:
        """Whether every lazy derived table was filled as the index was written (a rebuild of a
        small log derives as it scans)."""
        return self._index().fully_derived

    def _remove_dead_temp_files(self) -> None:
        """Remove temp files that writers killed mid-write left behind (a cap rewrite's copy of the
        log, an atomic write's temp file). Only those whose writer process is gone."""
        for directory in (self.dir, self.dir / INDEX_DIR, self.dir / DERIVED_DIR):
            try:
                names = os.listdir(directory)
            except OSError as exc:
                logger.warning("could not list %s to remove dead temp files: %s", directory, exc)
                continue
            for name in names:
                pid = temp_file_pid(name)
                if pid is None or _pid_alive(pid):
                    continue
                try:
                    os.unlink(directory / name)
                except OSError as exc:
                    # Not ours to fail on; it is tried again on the next open.
                    logger.warning("could not remove dead temp file %s: %s", directory / name, exc)

    def _close_files(self) -> None:
        self.log.close()
        self.slot.close()

    # -- failing closed --------------------------------------------------------------------

    def check_usable(self) -> None:
        if self.failed is not None:
            if isinstance(self.failed, HookRunning):
                raise HookRunning(str(self.failed))
            raise LogFailedError(
                f"an earlier operation on {self.events_path} failed ({self.failed}); close every handle "
                "of this session and open it again (the log on disk is valid)"
            ) from self.failed

    def fail(self, exc: BaseException) -> None:
        """Fail the session closed: every later use raises :class:`LogFailedError` until every
        handle is closed and the session opened again (the log on disk is valid)."""
        self.failed = exc

    @contextmanager
    def refusing(self, reason: BaseException) -> Iterator[None]:
        """Refuse every use of the session with ``reason`` while the block runs (unless it failed
        meanwhile, the session is usable again after it)."""
        self.failed = reason
        try:
            yield
        finally:
            if self.failed is reason:
                self.failed = None

    # -- writing ---------------------------------------------------------------------------

    def append(
        self, event: dict, durability: str, max_events: int, on_evict: Optional[EvictionHook], ts: Optional[str] = None
    ) -> int:
        # The agent's hot path: kept flat on purpose (locals, few helper calls per event).
        kind = _check_event(event)
        if self._redact_on_write is not None:
            event = self._redact_on_write(event)
        if ts is not None:
            ts = ev.normalize_ts(ts)
        with self.lock:
            if self.failed is not None:
                self.check_usable()
            state = self.state
            manifest = state.manifest
            seq = manifest.next_seq
            if seq > _MAX_SEQ:  # only a log edited to claim the last seqs gets here
                raise MemstoreError(
                    f"{self.events_path}: no sequence number is left (its records claim the last "
                    f"ones, up to {_MAX_SEQ}); nothing was written"
                )
            if ts is None:
                ts = state.now = _utc_now()
            log = self.log
            buffer = log.buffer
            start = log.length + len(buffer)
            if start == 0 and (self.head_id is not None or manifest.retained_turn_base > 1):
                line = _encode_record(seq, ts, event, log_head(self.head_id, manifest.retained_turn_base))
            else:
                line = _encode_record(seq, ts, event)
            if kind in _LIFECYCLE_KINDS:
                # The state machine reads what was written, as a rescan will, not the caller's
                # objects (an enum member is written as its value; a rescan sees a str).
                event = _loads(line)["event"]
            size = len(line)
            written_at = log.written + len(buffer) + size  # written once log.written gets here
            buffer += line
            manifest.next_seq = seq + 1
            session_ts = ts
            if ts > state.now:
                # The envelope keeps the caller's time; the session's times stop at the present
                # (see LogState.apply_record, which a rescan applies the same way).
                state.now = _utc_now()
                session_ts = min(ts, state.now)
            if seq == 1:
                # A session starts with its first record (an import's is in the past).
                manifest.created_at = manifest.updated_at = session_ts
            elif session_ts > manifest.updated_at:
                manifest.updated_at = session_ts  # only forward: an import may append older times
            boundary, turn = state.apply(kind, event, start, start + size, seq, ts)
            self.pending.append((seq, start, size, turn, ts, kind))
            if self.pending_lines is not None:
                self.pending_lines.append(line)
            self.unpublished += size
            try:
                if durability == "event":
                    self.write_out(sync=True)
                if boundary:
                    self.write_out(sync=durability != "none")
                    if durability != "none":
                        self.publish()
                if len(buffer) >= MAX_WRITE_BUFFER_BYTES:
                    self.write_out(sync=durability != "none")
                if durability != "none":
                    if self.unpublished >= MAX_WRITE_BUFFER_BYTES:
                        self.write_out(sync=True)
                        self.publish()
                elif self.unpublished >= BULK_INDEX_BYTES:
                    # Bulk mode indexes in larger batches, in this thread (a CPU-bound writer
                    # gains nothing from handing them over), and leaves the manifest to
                    # flush/close.
                    self.write_out(sync=False)
                    self.publish(manifest=False, inline=True)
                if max_events > 0 and manifest.event_count > max_events:
                    self.cap.enforce(state, self._index(), max_events, on_evict, sync=durability != "none")
            except MemstoreError as exc:
                # Say whether the event is in the log already: a caller that retries an event
                # that is would write it twice.
                exc.seq = seq
                exc.durable = self.log.written >= written_at
                raise
        return seq

    def write_out(self, *, sync: bool) -> None:
        """Write the buffer, then ``fdatasync`` if asked; any failure fails the session closed."""
        self.active = time.monotonic()
        try:
            self.log.write_out(sync=sync)
        except StoreIOError as exc:
            self.failed = exc
            raise

    def publish(self, *, manifest: bool = True, inline: bool = False) -> None:
        """Hand the rows describing everything written to the publisher, which commits them
        to the index and then (with ``manifest``) publishes the manifest, off this thread
        (in this one with ``inline``). If the index transaction fails, nothing is forgotten:
        it is tried again with the next."""
        if self.log.buffer:
            raise AssertionError("publish() before write_out()")
        state = self.state
        m = state.manifest
        m.persisted_file_len = self.log.length
        batch = Batch(
            self.pending,
            self.pending_lines,
            {t.number: t.as_row() for t in state.dirty.values()},
            manifest_row(m),
            self.log.tail,
            m.to_json() if manifest else None,
        )
        if inline:
            self.publisher.publish_here(batch)
        else:
            self.publisher.submit(batch)
        state.dirty.clear()
        self.pending = []
        if self.pending_lines is not None:
            self.pending_lines = []
        self.unpublished = 0

    def settle(self, *, sync: bool = True) -> None:
        """Write the buffer (and sync it, with ``sync``), and hand the publisher every row not
        handed yet (what a cap rewrite needs before it plans on the index)."""
        self.write_out(sync=sync)
        if self.pending or self.state.dirty or self.unpublished:
            self.publish()

    def rows_pending_from(self, offset: int) -> bool:
        """Whether a row not handed to the publisher yet describes a record at or before
        ``offset`` (the rows are in log order: the first is the oldest)."""
        return bool(self.pending) and self.pending[0][1] <= offset

    def publish_rewrite(
        self,
        shift: Callable[[int], int],
        evict: EvictSpec,
        marker: CapRewriteMarker,
        after: list[Callable[[], None]],
    ) -> None:
        """After a cap rewrite replaced the log: move every offset not yet in the index (rows and
        turns not handed over, the open turn) by ``shift`` to the rewritten log's, and hand them
        to the publisher with the rewrite itself, which the index applies first, in the same
        transaction, with a synced WAL; the marker is removed once that is durable, and then
        ``after`` runs (see ``Batch.after``)."""
        state = self.state
        moved = []
        for turn in state.dirty.values():
            turn.start_offset, turn.end_offset = shift(turn.start_offset), shift(turn.end_offset)
            moved.append(turn)
        open_turn = state.open_turn
        if open_turn is not None and not any(turn is open_turn for turn in moved):
            open_turn.start_offset, open_turn.end_offset = shift(open_turn.start_offset), shift(open_turn.end_offset)
        self.pending = [(seq, shift(start), size, turn, ts, kind) for seq, start, size, turn, ts, kind in self.pending]
        m = state.manifest
        m.persisted_file_len = self.log.length
        self.publisher.submit(
            Batch(
                self.pending,
                self.pending_lines,
                {t.number: t.as_row() for t in state.dirty.values()},
                manifest_row(m),
                self.log.tail,
                None,  # manifest.json is in place already (the rewrite installed it)
                evict=evict,
                durable=True,
                clear_marker=marker,
                after=after,
            )
        )
        state.dirty.clear()
        self.pending = []
        if self.pending_lines is not None:
            self.pending_lines = []
        self.unpublished = 0

    def publish_manifest(self, *, wait: bool = False) -> None:
        """Publish the manifest (the index already holds its row): from the publisher's thread,
        or, with ``wait``, from this one once the publisher is idle."""
        manifest_json = self.state.manifest.to_json()
        if wait:
            self.publisher.publish_manifest_now(manifest_json)
        else:
            self.publisher.submit(Batch(manifest_json=manifest_json))

    def flush(self, *, sync: bool = True, index: bool = False) -> None:
        """Write, sync (unless ``sync`` is false) and index everything, publish the manifest,
        and wait until the publisher is done. With ``index`` the manifest row is committed to
        the index even if no record changed it (``complete()`` changed the state itself)."""
        with self.lock:
            self.check_usable()
            self.write_out(sync=sync)
            if index or self.pending or self.state.dirty or self.unpublished:
                self.publish()
                self.publisher.drain()
            else:
                self.publish_manifest(wait=True)

    def complete(self) -> None:
        """Bump ``updated_at`` (only forward: an import may have logged later times) and flush,
        committing the manifest row to the index too."""
        with self.lock:
            self.check_usable()
            manifest = self.state.manifest
            now = ev.utc_now()
            if now > manifest.updated_at:
                manifest.updated_at = now
            self.flush(index=True)

    # -- reading ---------------------------------------------------------------------------

    def manifest_snapshot(self) -> Manifest:
        with self.lock:
            return replace(self.state.manifest)

    def live_generation(self) -> Optional[int]:
        """The generation of the log and its views; ``None`` once the session failed or its
        index is closed (the deriver's question, asked with the lock held)."""
        if self.failed is not None or self.slot.index is None:
            return None
        return self.state.manifest.generation

    def turns(self, sync: bool) -> list[Turn]:
        with self.lock:
            self.flush(sync=sync)
            return self._index().turns()

    def reconstruct_turn(self, number: int, sync: bool) -> list[dict]:
        with self.lock:
            self.flush(sync=sync)
            turn = self._index().turn(number)
            if turn is None:
                raise TurnNotFound(self.state.manifest.session_id, number)
            return [r.event for r in self.log.records(turn.start_offset, turn.end_offset)]

    def snapshot_for_read(self, sync: bool) -> tuple[BinaryIO, int, int]:
        """Flush and return ``(reader, length, first_seq)`` for a reader that works unlocked (it
        stays on this inode even if a cap rewrite replaces the log meanwhile); ``first_seq`` is
        where seq assignment starts (the head's anchor, else 1)."""
        with self.lock:
            self.flush(sync=sync)
            return self.log.reader(), self.log.length, self.log.head().next_seq or 1

    # -- close -----------------------------------------------------------------------------

    def forget_after_fork(self) -> None:
        """In a forked child: make this inherited session unusable without touching the
        parent's files, lock or threads."""
        self.failed = SessionBusyError(
            f"session {self.session_id!r} was opened by the parent of this forked process; open it again here"
        )
        self.inherited = True
        # The threads that may have held these locks at the fork do not exist here.
        self.lock = threading.RLock()
        inherited_index = self.slot.forget_after_fork()
        self.log.close()
        self.liveness.forget()
        self.publisher.forget()
        if self.deriver is not None:
            self.deriver.forget()
        _inherited_connections.append(inherited_index)

    def flush_at_exit(self) -> None:
        with self.lock:
            try:
                if self.failed is None and self.log.fd >= 0:
                    self.flush()
            finally:
                self.publisher.stop()

    def release(self, *, flush_metadata: bool) -> None:
        """Drop one handle. The last one closes the files and releases the liveness lock."""
        if self.inherited:
            return  # a forked child's copy: forget_after_fork already let go of everything
        with self.lock:
            error: Optional[BaseException] = None
            if self.failed is None:
                try:
                    if flush_metadata:
                        self.flush()
                    else:
                        self.write_out(sync=False)
                except BaseException as exc:  # still release the handle, then report
                    error = exc
            if registry.drop_handle(self):
                # Out of the registry and marked closing: an open of this session waits until
                # the files and the liveness lock are released, without holding up other sessions.
                # Each step runs whatever interrupts the one before (Ctrl-C while a join
                # waits): the session is out of the registry, so nothing else would release
                # its files and lock.
                try:
                    self.ready = False
                    try:
                        if self.deriver is not None:
                            self.deriver.stop()
                    finally:
                        try:
                            self.publisher.stop()
                        except BaseException as exc:
                            error = error or exc
                        finally:
                            try:
                                self._close_files()
                            finally:
                                self.liveness.release()
                finally:
                    registry.closed(self)
            if error is not None:
                raise error


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # exists, owned by someone else
    return True
