"""``SessionLog``, ``open_session`` and ``rebuild_index``: the coordinator of one session's writing.

Its parts live beside it, one concern each: the state machine (``lifecycle.py``), the log file
and its buffer (``logfile.py``), recovery on open (``recovery.py``), the cap (``cap.py``), the
handle registry with its fork and exit hooks (``registry.py``), the index (``index.py``) and
the manifest (``manifest.py``).

Durability ordering at every write point: (1) one ``write()`` of whole lines, (2) ``fdatasync``
per the durability policy, (3) the index transaction, (4) the manifest's atomic replace. Each
later step only describes bytes an earlier step made durable, so after any crash the views are
at most behind the log, never ahead of it. (Bulk mode, ``durability="none"``, indexes written
but unsynced bytes; an open that finds the log shorter than its metadata checks which bytes
went missing before trusting either.)
"""

from __future__ import annotations

import errno
import logging
import os
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Iterator, Optional

import orjson

from ..layout import DERIVED_DIR, EVENTS_FILE, INDEX_DIR, INDEX_FILE, session_directory, sessions_root
from .. import events as ev
from . import registry
from .cap import (
    CapPlan,
    EvictionHook,
    HookRunning,
    cap_low_water,
    enforce_cap,
    plan_cap_eviction,
    write_eviction_summary,
)
from .deriver import Deriver, derive_all
from ..errors import LogFailedError, MemstoreError, SessionBusyError, SessionClosedError, StoreIOError, TurnNotFound
from ..events import Record
from ..fsio import ensure_private_dir, fsync_dir, temp_file_pid
from .index import IndexCorrupt, SavedState, SessionIndex, Turn, derived_tables, manifest_row
from .lifecycle import LogState
from .lock import LivenessLock, SessionGone
from .logfile import LogFile
from .manifest import Manifest
from .publisher import Batch, Publisher
from .recovery import recover

logger = logging.getLogger("memstore")

DEFAULT_MAX_EVENTS = 10_000
MAX_WRITE_BUFFER_BYTES = 65_536
BULK_INDEX_BYTES = 1 << 20
DURABILITY_POLICIES = ("turn", "event", "none")

_check_event = ev.check_event
_LIFECYCLE_KINDS = ev.LIFECYCLE_KINDS
_MAX_SEQ = ev.MAX_SEQ
_loads = orjson.loads
_utc_now = ev.utc_now
_encode_record = ev.encode_record
# SQLite connections a forked child inherited: closing them (even by garbage collection) could
# checkpoint the parent's database under it, so they are kept referenced and unused.
_inherited_connections: list = []


class _Session:
    """The state every handle of one session in this process shares: one log file, one
    lifecycle state, one index connection and one liveness lock."""

    def __init__(self, root: Path, session_id: str, directory: Path, key: str):
        self.root = root
        self.session_id = session_id
        self.dir = directory
        self.key = key
        self.log = LogFile(directory)
        self.events_path = self.log.path
        self.index_path = directory / INDEX_DIR / INDEX_FILE
        self.lock = threading.RLock()
        self.handles = 0
        self.pending: list[tuple] = []
        # The lines of the pending rows, kept only when eager derived tables need the events.
        self.pending_lines: Optional[list[bytes]] = [] if derived_tables(lazy=False) else None
        self.unpublished = 0
        self.failed: Optional[BaseException] = None
        self.liveness = LivenessLock(directory)
        self.index: Optional[SessionIndex] = None
        self.state: LogState
        # Guards the index connection: the publisher's thread commits through it too.
        self.index_lock = threading.Lock()
        self.publisher = Publisher(self)
        self.ready = False
        self.inherited = False
        # When the agent last wrote: the deriver waits for a quiet moment.
        self.active = 0.0
        # After an eviction hook failed, the cap is tried again only from this event count on.
        self.cap_retry_at = 0
        self.cap_failures = 0
        self.deriver: Optional[Deriver] = Deriver(self) if Deriver.needed() else None
        # The log's first line names the session when the directory name cannot (a hashed id).
        self.head_id = session_id if directory.name != session_id else None

    def log_head(self, retained_turn_base: int) -> dict:
        """The head keys of the log's first line (see ``events.decode_log_head``)."""
        head: dict = {}
        if self.head_id is not None:
            head["session_id"] = self.head_id
        if retained_turn_base > 1:
            head["retained_turn_base"] = retained_turn_base
        return head

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
            recover(self, force_rescan)
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

    def _derived_lags(self) -> bool:
        with self.index_lock:
            return self.index.derived_watermark() < self.index.max_seq()

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
        if self.index is not None:
            self.index.close()
            self.index = None

    def open_index(self, *, fresh: bool = False, readonly: bool = False) -> Optional[SavedState]:
        """(Re)open the index; return what it says about the log, or ``None`` when it is empty,
        was corrupt (then it is discarded and recreated) or ``fresh`` was asked for (then it is
        discarded first). ``readonly`` opens it only to read what it knew (it is about to be
        replaced): then the index may be ``None`` too."""
        if self.index is not None:
            self.index.close()
            self.index = None
        if readonly:
            self.index = SessionIndex.open_readonly(self.index_path)
            if self.index is not None:
                try:
                    return self.index.load()
                except IndexCorrupt as exc:
                    logger.warning("not reading a corrupt index (it is rebuilt from the log): %s", exc)
                    return None
            if not os.path.lexists(self.index_path):
                return None
            # Not readable without writing (a WAL without its -shm, left by a crashed writer,
            # must be played back first; or not this memstore's format): the usual open.
        if fresh:
            SessionIndex.discard(self.index_path)
        try:
            self.index = SessionIndex.open(self.index_path)
            return self.index.load()
        except IndexCorrupt as exc:
            logger.warning("discarding a corrupt index (it is rebuilt from the log): %s", exc)
            if self.index is not None:
                self.index.close()
            SessionIndex.discard(self.index_path)
            self.index = SessionIndex.open(self.index_path)
            return None

    # -- writing ---------------------------------------------------------------------------

    def check_usable(self) -> None:
        if self.failed is not None:
            if isinstance(self.failed, HookRunning):
                raise HookRunning(str(self.failed))
            raise LogFailedError(
                f"an earlier operation on {self.events_path} failed ({self.failed}); close every handle "
                "of this session and open it again (the log on disk is valid)"
            ) from self.failed

    def append(self, event: dict, durability: str, max_events: int, on_evict: Optional[EvictionHook],
               ts: Optional[str] = None) -> int:
        # The agent's hot path: kept flat on purpose (locals, few helper calls per event).
        kind = _check_event(event)
        if ts is not None:
            ts = ev.normalize_ts(ts)
        with self.lock:
            if self.failed is not None:
                self.check_usable()
            state = self.state
            manifest = state.manifest
            seq = manifest.next_seq
            if seq > _MAX_SEQ:  # only a log edited to claim the last seqs gets here
                raise MemstoreError(f"{self.events_path}: no sequence number is left (its records claim the last "
                                    f"ones, up to {_MAX_SEQ}); nothing was written")
            if ts is None:
                ts = state.now = _utc_now()
            log = self.log
            buffer = log.buffer
            start = log.length + len(buffer)
            if start == 0 and (self.head_id is not None or manifest.retained_turn_base > 1):
                line = _encode_record(seq, ts, event, self.log_head(manifest.retained_turn_base))
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
                    enforce_cap(self, max_events, on_evict)
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
        batch = Batch(self.pending, self.pending_lines, {t.number: t.as_row() for t in state.dirty.values()},
                      manifest_row(m), self.log.tail, m.to_json() if manifest else None)
        if inline:
            self.publisher.publish_here(batch)
        else:
            self.publisher.submit(batch)
        state.dirty.clear()
        self.pending = []
        if self.pending_lines is not None:
            self.pending_lines = []
        self.unpublished = 0
        if self.deriver is not None:
            self.deriver.wake()

    def publish_manifest(self, *, wait: bool = False) -> None:
        """Publish the manifest (the index already holds its row): from the publisher's thread,
        or, with ``wait``, from this one once the publisher is idle."""
        batch = Batch(manifest_json=self.state.manifest.to_json())
        if wait:
            self.publisher.drain()
            self.publisher.publish_here(batch)
            self.publisher.drain()  # raises if publishing failed
        else:
            self.publisher.submit(batch)

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

    # -- reading ---------------------------------------------------------------------------

    def reconstruct_turn(self, number: int, sync: bool) -> list[dict]:
        with self.lock:
            self.flush(sync=sync)
            turn = self.index.turn(number)
            if turn is None:
                raise TurnNotFound(self.state.manifest.session_id, number)
            return [r.event for r in self.log.records(turn.start_offset, turn.end_offset)]

    def snapshot_for_read(self, sync: bool):
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
        self.index_lock = threading.Lock()
        self.log.close()
        self.liveness.forget()
        self.publisher.forget()
        if self.deriver is not None:
            self.deriver.forget()
        _inherited_connections.append(self.index)
        self.index = None

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


# --------------------------------------------------------------------------------------------
# The public handle


class SessionLog:
    """A handle on one session's event log. Create it with :func:`open_session`.

    Handles of the same session in one process share one state: counts, buffer, index and lock.
    ``append`` buffers; the buffer is written at turn boundaries (``turn.completed``,
    ``turn.failed``, ``turn.aborted``, ``thread.completed``), when it reaches 64 KiB, on reads,
    ``flush``, ``complete`` and ``close``. An event is acknowledged (durable, with
    ``durability="turn"``) once the append that closes its turn, or a ``flush``, has returned.
    """

    def __init__(self, shared: _Session, max_events: int, durability: str, on_evict: Optional[EvictionHook]):
        self._s = shared
        self.max_events = max_events
        self.durability = durability
        self.on_evict = on_evict
        self._closed = False

    @property
    def _sync_reads(self) -> bool:
        # A read writes the buffer and indexes it; the index must never describe unsynced bytes
        # (after a power cut it would be ahead of the log), so reads sync unless bulk mode.
        return self.durability != "none"

    def _live(self) -> _Session:
        if self._closed:
            raise SessionClosedError(f"session {self.session_id!r} handle is closed")
        return self._s

    @property
    def session_id(self) -> str:
        return self._s.session_id

    @property
    def directory(self) -> Path:
        """The session directory."""
        return self._s.dir

    @property
    def events_path(self) -> Path:
        return self._s.events_path

    @property
    def index_path(self) -> Path:
        return self._s.index_path

    def append(self, event: dict, *, ts: Optional[str] = None) -> int:
        """Append one event (the inner ``{"type": ...}`` object); return its sequence number.

        ``ts`` is the envelope's time (an RFC 3339 timestamp, stored in memstore's format); by
        default the current time. Importers pass the source's time.

        Raises :class:`InvalidEvent` (nothing written) for an event that is not a JSON object with
        a string ``type``, a malformed lifecycle event, or one that cannot be serialized;
        :class:`LogFailedError` after an earlier write or sync failure.
        """
        if self._closed:
            self._live()
        return self._s.append(event, self.durability, self.max_events, self.on_evict, ts)

    def flush(self) -> None:
        """Write, sync and index everything appended so far, and publish the manifest."""
        self._live().flush()

    def complete(self) -> None:
        """Bump ``updated_at`` and flush. Does not change the status: only a logged
        ``thread.completed`` does."""
        s = self._live()
        with s.lock:
            s.check_usable()
            manifest = s.state.manifest
            now = ev.utc_now()
            if now > manifest.updated_at:  # only forward: an import may have logged later times
                manifest.updated_at = now
            s.flush(index=True)

    def close(self) -> None:
        """Flush and release this handle; the last handle closes the files and the lock."""
        if self._closed:
            return
        self._closed = True
        self._s.release(flush_metadata=True)

    def __enter__(self) -> "SessionLog":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def __del__(self) -> None:
        # Dropped without close(): write buffered bytes only, like VT Code's Drop. The garbage
        # collector may run this inside a critical section of this very thread, where taking
        # the locks would deadlock or re-enter half-done work: then the reaper thread does it.
        if getattr(self, "_closed", True):
            return
        self._closed = True
        registry.release_dropped(self._s)

    @property
    def turn_count(self) -> int:
        """Closed turns, counting evicted ones (turn numbers are monotonic)."""
        return self._s.state.manifest.turn_count

    @property
    def event_count(self) -> int:
        """Records in the log, thread events included."""
        return self._s.state.manifest.event_count

    @property
    def manifest(self) -> Manifest:
        """A snapshot of the session's manifest."""
        with self._s.lock:
            return replace(self._s.state.manifest)

    @property
    def failed(self) -> bool:
        """Whether the handle has failed closed."""
        return self._s.failed is not None

    def turns(self) -> list[Turn]:
        """Every turn the log holds, oldest first (the open turn last, status ``open``)."""
        s = self._live()
        with s.lock:
            s.flush(sync=self._sync_reads)
            return s.index.turns()

    def reconstruct_turn(self, number: int) -> list[dict]:
        """The events of turn ``number`` in log order; :class:`TurnNotFound` if the log does not
        hold it (never logged, or evicted by the cap)."""
        return self._live().reconstruct_turn(number, self._sync_reads)

    def iter_records(self) -> Iterator[Record]:
        """Every valid record (``seq``, ``ts``, ``event``) in log order, as of this call. Every
        record has its seq, lines VT Code wrote included (see ``events.assign_seq``)."""
        s = self._live()
        reader, length, next_seq = s.snapshot_for_read(self._sync_reads)
        try:
            with reader:
                pos = 0
                for line in reader:
                    pos += len(line)
                    if pos > length:
                        break
                    record = ev.decode_line(line)
                    if record is not None:
                        seq = ev.assign_seq(record.seq, next_seq)
                        next_seq = seq + 1
                        yield record if seq == record.seq else record._replace(seq=seq)
        except OSError as exc:
            raise StoreIOError.from_os_error("read", s.events_path, exc) from exc

    def iter_events(self) -> Iterator[dict]:
        """Every valid event (the inner objects) in log order."""
        for record in self.iter_records():
            yield record.event

    def __repr__(self) -> str:
        return f"<SessionLog {self.session_id!r} turns={self.turn_count} events={self.event_count}>"


def open_session(
    root: os.PathLike | str,
    session_id: str,
    max_events: int = DEFAULT_MAX_EVENTS,
    durability: str = "turn",
    *,
    on_evict: Optional[EvictionHook] = None,
) -> SessionLog:
    """Open (creating if needed) the session ``session_id`` under the store ``root``.

    ``max_events`` caps the log (0: no cap): past it, the oldest whole turns are evicted by a
    cap rewrite, after ``on_evict(session_dir, session_id, evicted_events)`` (by default
    :func:`write_eviction_summary`; ``evicted_events`` is an iterable to consume once) has
    recorded them; if the hook raises, nothing is evicted. ``durability`` is ``"turn"``
    (fdatasync at each turn boundary), ``"event"`` (every append) or ``"none"`` (only
    ``flush``/``close`` sync; for bulk imports).

    Raises :class:`SessionBusyError` if another process has the session open.
    """
    return _open(root, session_id, max_events, durability, on_evict, force_rescan=False)


def _open(root, session_id, max_events, durability, on_evict, *, force_rescan: bool) -> SessionLog:
    if durability not in DURABILITY_POLICIES:
        raise ValueError(f"durability must be one of {DURABILITY_POLICIES}, not {durability!r}")
    if type(max_events) is not int or max_events < 0:
        raise ValueError("max_events must be a non-negative int (0 disables the cap)")
    # Absolute, so that a later os.chdir() cannot redirect an open handle to another store.
    root = Path(root).absolute()
    directory = session_directory(root, session_id)  # refuses a bad id before creating anything
    _create_root(root)
    ensure_private_dir(sessions_root(root))
    key = os.path.realpath(directory)
    gone = 0
    while True:
        try:
            ensure_private_dir(directory)
        except StoreIOError as exc:
            if exc.errno != errno.ENOENT or gone >= 3:
                raise
            gone += 1  # removed by retention between two steps of its creation: again
            continue
        shared, fresh = registry.acquire(key, lambda: _Session(root, session_id, directory, key))
        if fresh:
            with shared.lock:
                try:
                    shared.open(force_rescan=force_rescan)
                except SessionGone:
                    # Retention removed the session while we took its lock: start a new one.
                    registry.forget(shared)
                    gone += 1
                    if gone < 3:
                        continue
                    raise SessionBusyError(f"session {session_id!r} keeps being removed while it is opened") from None
                except BaseException:
                    registry.forget(shared)
                    raise
                shared.ready = True
            return SessionLog(shared, max_events, durability, on_evict)
        try:
            shared.lock.acquire()
        except BaseException:  # interrupted while waiting: give the handle count back
            registry.give_back(shared)
            raise
        try:
            if not shared.ready:
                registry.give_back(shared)
                continue  # its first open failed while we waited; try afresh
            if force_rescan:
                try:
                    shared.flush()
                except BaseException:
                    shared.release(flush_metadata=False)
                    raise
                try:
                    recover(shared, force_rescan=True)
                except BaseException as exc:
                    # A half-done rescan leaves the shared state describing part of the log.
                    shared.failed = exc
                    shared.release(flush_metadata=False)
                    raise
        finally:
            shared.lock.release()
        return SessionLog(shared, max_events, durability, on_evict)


def _create_root(root: Path) -> None:
    """Create a missing store root (a user-chosen path: it may sit behind symlinks), syncing the
    parent of each directory created so the new store survives a power cut."""
    missing = []
    probe = root
    while not os.path.lexists(probe) and probe.parent != probe:
        missing.append(probe)
        probe = probe.parent
    for directory in reversed(missing):
        try:
            os.mkdir(directory, 0o755 if directory != root else 0o700)
        except FileExistsError:
            continue
        except OSError as exc:
            raise StoreIOError.from_os_error("create directory", directory, exc) from exc
        fsync_dir(directory.parent)
    if not root.is_dir():
        raise StoreIOError("open store", root, "is not a directory")


def rebuild_index(root: os.PathLike | str, session_id: str) -> SessionLog:
    """Open the session ``session_id`` with its index, search chunks and manifest regenerated
    from its ``events.jsonl``, and return the open handle (the caller closes it, after
    regenerating the file views it wants).

    The log decides everything it records. What it cannot record is kept from the old metadata
    when present: ``created_at``, a status set outside the log (retention marking a session
    completed, or a ``thread.completed`` the cap evicted), and, for logs VT Code rewrote, the
    first retained turn's number. A torn tail is cut (and kept) as on any open. Works on a
    session this process has open (under its lock); refuses with :class:`SessionBusyError` one
    that another process has open, and with :class:`StoreIOError` a directory that holds no
    log.
    """
    directory = session_directory(root, session_id)
    if directory.is_symlink() or not (directory / EVENTS_FILE).is_file():
        raise StoreIOError("rebuild", directory, "no such session (no events.jsonl)")
    log = _open(root, session_id, 0, "turn", None, force_rescan=True)
    try:
        if not log._s.index.fully_derived:  # (a small log's rescan derived as it went)
            derive_all(log._s)
    except StoreIOError as exc:
        # The index itself is rebuilt; only the search chunks lag, and readers derive
        # them in memory until a writer catches up.
        logger.warning("rebuild of %s: the search chunks could not be derived: %s", log.directory, exc)
    except BaseException:
        log.close()
        raise
    return log


__all__ = [
    "DEFAULT_MAX_EVENTS",
    "CapPlan",
    "LogState",
    "SessionLog",
    "open_session",
    "plan_cap_eviction",
    "rebuild_index",
    "write_eviction_summary",
    "cap_low_water",
]
