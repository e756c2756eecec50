"""Writing a new session whole, with nothing synced: the bulk importer's path.

:class:`NewSession` writes a session that does not exist yet into a directory no other process
knows about (an import's staging directory): the log first, appended as
:meth:`SessionLog.append <memstore.session.log.SessionLog.append>` would (the same checks and
the same lines), then, in :meth:`NewSession.finish`, its index (search chunks included) and
``manifest.json`` exactly as a rebuild makes them from that log, so that the first open of the
session trusts them as they are.

Nothing here is synced, and no lock is taken: the caller owns the directory. It makes the bytes
durable (one ``syncfs`` for a whole batch of such sessions) before it publishes the directory
into the store by a rename, so a power cut leaves each session absent or whole. A small log's
index is built in memory and written with one ``write``; a large one's is built in place, in
batches (memory stays flat however long the log is), with SQLite's syncs off.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from typing import Optional

from .. import events as ev
from ..errors import MemstoreError, StoreIOError
from ..fsio import DIR_MODE, FILE_MODE, atomic_write, write_all
from ..layout import DERIVED_DIR, EVENTS_FILE, INDEX_DIR, INDEX_FILE, MANIFEST_FILE
from ..store_redaction import StoreRedaction
from .cap import log_head
from .index import _WAL_FORMAT, SessionIndex
from .logfile import LogFile
from .manifest import Manifest
from .recovery import _rescan_state, scan
from .tuning import TUNING

_O_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
# The log is written once this much is buffered: few large writes, and memory stays flat.
_WRITE_BYTES = 1 << 20


class NewSession:
    """A new session ``session_id`` written into ``directory``, which must not exist (it is
    created, with ``index/`` and ``derived/``). ``append`` as on a :class:`SessionLog`, then
    ``finish`` once (or ``abandon``). ``directory``'s name is the session's directory name; when
    it is not the id itself (a hashed name), the log's first line names the session, as the
    writer's does. ``retained_turn_base`` above 1 writes a session whose first turns were
    evicted (a copy of a capped session): the first line says so, as a cap rewrite's does.
    ``redaction`` is the store's (see :func:`memstore.store_redaction.store_redaction`): with
    ``at_write`` each event is redacted before it is encoded, and the views never see a secret,
    as with the writer."""

    def __init__(
        self,
        directory: os.PathLike | str,
        session_id: str,
        *,
        retained_turn_base: int = 1,
        redaction: Optional[StoreRedaction] = None,
    ):
        self.directory = Path(directory)
        self.session_id = session_id
        self.redaction = redaction
        self._redact_on_write = redaction.redact_event if redaction is not None and redaction.at_write else None
        self.next_seq = 1
        self.length = 0
        self._buffer = bytearray()
        head_id = session_id if self.directory.name != session_id else None
        self._head: Optional[dict] = log_head(head_id, retained_turn_base) or None
        try:
            os.mkdir(self.directory, DIR_MODE)
            os.mkdir(self.directory / INDEX_DIR, DIR_MODE)
            os.mkdir(self.directory / DERIVED_DIR, DIR_MODE)
        except OSError as exc:
            raise StoreIOError.from_os_error("create session directory", self.directory, exc) from exc
        self.events_path = self.directory / EVENTS_FILE
        try:
            self._fd: Optional[int] = os.open(self.events_path, _O_NEW, FILE_MODE)
        except OSError as exc:
            raise StoreIOError.from_os_error("create", self.events_path, exc) from exc

    @property
    def event_count(self) -> int:
        return self.next_seq - 1

    def append(self, event: dict, *, ts: str, seq: Optional[int] = None) -> int:
        """Append one event at time ``ts``; return its seq: the next one, or ``seq`` when given
        (a copy keeping another log's numbers; it must be past every seq written, and the line
        carries it, so every rescan gives it again). Raises :class:`InvalidEvent` (nothing
        written) for what ``SessionLog.append`` refuses."""
        if self._fd is None:
            raise MemstoreError(f"session {self.session_id!r}: append after finish or abandon")
        ev.check_event(event)
        if self._redact_on_write is not None:
            event = self._redact_on_write(event)
        ts = ev.normalize_ts(ts)
        if seq is None:
            seq = self.next_seq
        elif seq < self.next_seq:
            raise MemstoreError(f"session {self.session_id!r}: seq {seq} is not past {self.next_seq - 1}")
        if seq > ev.MAX_SEQ:
            raise MemstoreError(f"{self.events_path}: no sequence number is left; nothing was written")
        head, self._head = self._head, None
        try:
            line = ev.encode_record(seq, ts, event, head)
        except BaseException:
            self._head = head
            raise
        self._buffer += line
        self.next_seq = seq + 1
        if len(self._buffer) >= _WRITE_BYTES:
            self._write_out()
        return seq

    def _write_out(self) -> None:
        if self._buffer and self._fd is not None:
            write_all(self._fd, self._buffer, self.events_path)
            self.length += len(self._buffer)
            del self._buffer[:]

    def finish(self) -> Manifest:
        """Write the rest of the log, then its index and ``manifest.json`` (nothing synced), and
        return the manifest. The views are those a rebuild of the log would make."""
        self._write_out()
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)
        return build_views(self.directory, self.session_id, self.redaction)

    def abandon(self) -> None:
        """Stop without finishing (the caller removes the directory)."""
        fd, self._fd = self._fd, None
        self._buffer.clear()
        if fd is not None:
            os.close(fd)


def build_views(directory: Path, session_id: str, redaction: Optional[StoreRedaction] = None) -> Manifest:
    """Build the index and ``manifest.json`` of the session in ``directory`` from its log, as a
    rebuild does, in a directory that has neither yet and that only the caller uses; nothing is
    synced. Every event goes through ``redaction`` before a derived table (search chunks, a
    turn's error) sees it, as in the writer. Returns the manifest."""
    redact = redaction.redact_event if redaction is not None else None
    log = LogFile(directory)
    log.open_readonly()
    index_path = directory / INDEX_DIR / INDEX_FILE
    small = log.length <= TUNING.memory_scan_bytes
    try:
        index = SessionIndex.in_memory(index_path) if small else SessionIndex.open(index_path)
        try:
            if not small:
                # Published only after the caller's sync of the whole batch: SQLite's own
                # syncs would buy nothing.
                index.conn.execute("PRAGMA synchronous=OFF")
            state = _rescan_state(log, session_id, log.head().retained_turn_base or 1, None, None)
            state.redact_error = redact
            scan(log, index, state, 0, reset=True, derive_lazy=True, redact_event=redact)
            if small:
                _write_index(index, index_path)
        finally:
            index.close()
    finally:
        log.close()
    manifest = state.manifest
    atomic_write(directory / MANIFEST_FILE, manifest.to_json(), durable=False)
    return manifest


def _write_index(index: SessionIndex, path: Path) -> None:
    """Write an index built in memory to the new file ``path`` (marked WAL, as every index on
    disk is), unsynced."""
    try:
        data = bytearray(index.conn.serialize())
    except sqlite3.Error as exc:
        raise StoreIOError("build index", path, f"serializing it: {exc}") from exc
    data[18:20] = _WAL_FORMAT
    try:
        fd = os.open(path, _O_NEW, FILE_MODE)
    except OSError as exc:
        raise StoreIOError.from_os_error("create index", path, exc) from exc
    try:
        write_all(fd, data, path)
    finally:
        os.close(fd)


__all__ = ["NewSession", "build_views"]
