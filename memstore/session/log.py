"""``SessionLog``, ``open_session`` and ``rebuild_index``: the public handle on one session's log.

Every handle of a session in this process shares one :class:`~memstore.session.writer.SessionWriter`
(found in the registry, ``registry.py``), which owns the writer state and hands its parts (the
log file, the index slot, the publisher, the deriver, the cap policy, recovery) what each needs.
A handle adds only what is its own: its cap (``max_events``), its eviction hook and its
durability policy. See ``writer.py`` for the durability ordering at every write point.
"""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Optional

from .. import events as ev
from ..errors import SessionBusyError, SessionClosedError, StoreIOError
from ..events import Record
from ..fsio import ensure_private_dir, fsync_dir
from ..layout import EVENTS_FILE, session_directory, sessions_root
from ..store_redaction import StoreRedaction, store_redaction
from . import registry
from .cap import CapPlan, EvictionHook, cap_low_water, plan_cap_eviction, write_eviction_summary
from .deriver import derive_all
from .index import Turn
from .lifecycle import LogState
from .lock import SessionGone
from .manifest import Manifest
from .writer import SessionWriter

logger = logging.getLogger("memstore")

DEFAULT_MAX_EVENTS = 10_000
DURABILITY_POLICIES = ("turn", "event", "none")


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

    def __init__(self, writer: SessionWriter, max_events: int, durability: str, on_evict: Optional[EvictionHook]):
        self._writer = writer
        self.max_events = max_events
        self.durability = durability
        self.on_evict = on_evict
        self._closed = False

    @property
    def _sync_reads(self) -> bool:
        # A read writes the buffer and indexes it; the index must never describe unsynced bytes
        # (after a power cut it would be ahead of the log), so reads sync unless bulk mode.
        return self.durability != "none"

    def _live(self) -> SessionWriter:
        if self._closed:
            raise SessionClosedError(f"session {self.session_id!r} handle is closed")
        return self._writer

    @property
    def session_id(self) -> str:
        return self._writer.session_id

    @property
    def directory(self) -> Path:
        """The session directory."""
        return self._writer.dir

    @property
    def events_path(self) -> Path:
        return self._writer.events_path

    @property
    def index_path(self) -> Path:
        return self._writer.index_path

    @property
    def redaction(self) -> Optional[StoreRedaction]:
        """The store's redaction (what derived views redact with; see ``store_redaction``)."""
        return self._writer.redaction

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
        return self._writer.append(event, self.durability, self.max_events, self.on_evict, ts)

    def flush(self) -> None:
        """Write, sync and index everything appended so far, and publish the manifest."""
        self._live().flush()

    def complete(self) -> None:
        """Bump ``updated_at`` and flush. Does not change the status: only a logged
        ``thread.completed`` does."""
        self._live().complete()

    def close(self) -> None:
        """Flush and release this handle; the last handle closes the files and the lock."""
        if self._closed:
            return
        self._closed = True
        self._writer.release(flush_metadata=True)

    def __enter__(self) -> SessionLog:
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
        registry.release_dropped(self._writer)

    @property
    def turn_count(self) -> int:
        """Closed turns, counting evicted ones (turn numbers are monotonic)."""
        return self._writer.state.manifest.turn_count

    @property
    def event_count(self) -> int:
        """Records in the log, thread events included."""
        return self._writer.state.manifest.event_count

    @property
    def manifest(self) -> Manifest:
        """A snapshot of the session's manifest."""
        return self._writer.manifest_snapshot()

    @property
    def failed(self) -> bool:
        """Whether the handle has failed closed."""
        return self._writer.failed is not None

    def turns(self) -> list[Turn]:
        """Every turn the log holds, oldest first (the open turn last, status ``open``)."""
        return self._live().turns(self._sync_reads)

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


def _open(
    root: os.PathLike | str,
    session_id: str,
    max_events: int,
    durability: str,
    on_evict: Optional[EvictionHook],
    *,
    force_rescan: bool,
) -> SessionLog:
    if durability not in DURABILITY_POLICIES:
        raise ValueError(f"durability must be one of {DURABILITY_POLICIES}, not {durability!r}")
    if type(max_events) is not int or max_events < 0:
        raise ValueError("max_events must be a non-negative int (0 disables the cap)")
    # Absolute, so that a later os.chdir() cannot redirect an open handle to another store.
    root = Path(root).absolute()
    directory = session_directory(root, session_id)  # refuses a bad id before creating anything
    redaction = store_redaction(root)  # a malformed config.toml refuses before anything is created
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
        shared, fresh = registry.acquire(key, lambda: SessionWriter(session_id, directory, key, redaction))
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
                    shared.recover(force_rescan=True)
                except BaseException as exc:
                    # A half-done rescan leaves the shared state describing part of the log.
                    shared.fail(exc)
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
        if not log._writer.fully_derived():  # (a small log's rescan derived as it went)
            derive_all(log._writer)
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
