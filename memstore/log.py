"""``SessionLog``: appending to and reading a session's canonical ``events.jsonl``.

This module owns the one lifecycle state machine (:class:`LogState`), shared by append and scan;
buffered appends and their durability ordering; the scan that (re)builds the index; torn-tail
repair; turn reconstruction; and the cap rewrite.

Durability ordering at every write point: (1) one ``write()`` of whole lines, (2) ``fdatasync``
per the durability policy, (3) the index transaction, (4) the manifest's atomic replace. Each
later step only describes bytes an earlier step made durable, so after any crash the views are
at most behind the log, never ahead of it. (Bulk mode, ``durability="none"``, indexes written
but unsynced bytes; an open that finds the log shorter than its metadata checks which bytes
went missing before trusting either.)
"""

from __future__ import annotations

import atexit
import os
import queue
import threading
import uuid
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Iterable, Iterator, Optional, Sequence

import orjson

from . import events as ev
from .errors import (
    CapEvictionError,
    LogFailedError,
    MemstoreError,
    SessionBusyError,
    SessionClosedError,
    StoreIOError,
    TurnNotFound,
)
from .events import Record
from .fsio import (
    atomic_write,
    ensure_private_dir,
    fsync_dir,
    open_private_append,
    open_read_no_follow,
    read_no_follow,
    session_directory,
    sessions_root,
    temp_file_pid,
    write_all,
    write_new_file,
)
from .index import (
    INDEX_FILE,
    TURN_COMPLETED,
    TURN_ABORTED,
    TURN_FAILED,
    TURN_INTERRUPTED,
    TURN_OPEN,
    IndexCorrupt,
    SavedState,
    SessionIndex,
    Turn,
)
from .lock import LivenessLock
from .manifest import (
    STATUS_ACTIVE,
    STATUS_COMPLETED,
    CapRewriteMarker,
    Manifest,
    ManifestPublisher,
    clear_marker,
    load_manifest,
    load_marker,
    write_marker,
)

EVENTS_FILE = "events.jsonl"
INDEX_DIR = "index"
DERIVED_DIR = "derived"
DEFAULT_MAX_EVENTS = 10_000
MAX_WRITE_BUFFER_BYTES = 65_536
BULK_INDEX_BYTES = 1 << 20
DURABILITY_POLICIES = ("turn", "event", "none")
TAIL_BYTES = 256
SCAN_BATCH_EVENTS = 20_000
EVICTION_SUMMARY_FACTS = 5
EVICTION_FACT_CHARS = 180

EvictionHook = Callable[[Path, str, list], None]

_check_event = ev.check_event
_utc_now = ev.utc_now
_encode_record = ev.encode_record
_describe = ev.describe


# --------------------------------------------------------------------------------------------
# The lifecycle state machine


class LogState:
    """The session state that append and scan both advance, one event at a time.

    ``manifest`` carries the counters (``turn_count`` counts closed turns, ``event_count`` every
    accepted record, thread events included); ``open_turn`` is the turn in progress; ``dirty``
    collects the turns changed since the index last stored them.
    """

    __slots__ = ("manifest", "open_turn", "dirty")

    def __init__(self, manifest: Manifest, open_turn: Optional[Turn] = None):
        self.manifest = manifest
        self.open_turn = open_turn if manifest.in_turn else None
        self.dirty: dict[int, Turn] = {}

    def apply(self, kind: str, event: dict, start: int, end: int, seq: Optional[int], ts: Optional[str]) -> tuple[bool, Optional[int]]:
        """Advance the state by one accepted event occupying bytes ``[start, end)``.

        Returns ``(boundary, turn)``: whether the event ends a unit of work (a turn closed or the
        thread completed), and the number of the turn it belongs to (``None`` outside turns).

        Every event inside an open turn belongs to it, lifecycle or not, so a turn's byte range
        and its event count always describe the same lines. A ``turn.started`` while a turn is
        open closes that turn as ``interrupted`` (VT Code would number both turns the same).
        """
        m = self.manifest
        m.event_count += 1
        turn = self.open_turn
        if turn is not None and kind not in ev.LIFECYCLE_KINDS:
            # The common case on the append path: an item inside the open turn.
            self._extend(turn, end, seq)
            return False, turn.number
        if kind == ev.TURN_STARTED:
            if turn is not None:
                turn.status = TURN_INTERRUPTED
                self.dirty[turn.number] = turn
                m.turn_count = max(m.turn_count, turn.number)
            started = ts or _context_timestamp(event)
            turn = Turn(m.turn_count + 1, TURN_OPEN, start, end, 1, seq, seq, started)
            self.open_turn = turn
            self.dirty[turn.number] = turn
            m.status = STATUS_ACTIVE
            m.in_turn = True
            return False, turn.number
        if turn is None:
            if kind == ev.THREAD_STARTED:
                m.status = STATUS_ACTIVE
            elif kind == ev.THREAD_COMPLETED:
                m.status = STATUS_COMPLETED
                return True, None
            return kind in ev.TURN_ENDS, None
        self._extend(turn, end, seq)
        if kind in ev.TURN_ENDS:
            turn.status = _TURN_STATUS[kind]
            turn.ended_at = ts or event.get("completed_at")
            (turn.input_tokens, turn.cached_input_tokens, turn.cache_creation_tokens,
             turn.output_tokens) = ev.usage_of(event)
            if kind == ev.TURN_FAILED:
                turn.error = event.get("message")
            elif kind == ev.TURN_ABORTED:
                turn.error = event.get("reason")
            m.turn_count = max(m.turn_count, turn.number)
            m.in_turn = False
            self.open_turn = None
            return True, turn.number
        if kind == ev.THREAD_STARTED:
            m.status = STATUS_ACTIVE
        elif kind == ev.THREAD_COMPLETED:
            m.status = STATUS_COMPLETED
            return True, turn.number
        return False, turn.number

    def _extend(self, turn: Turn, end: int, seq: Optional[int]) -> None:
        turn.end_offset = end
        turn.event_count += 1
        if seq is not None:
            turn.last_seq = seq
            if turn.first_seq is None:
                turn.first_seq = seq
        self.dirty[turn.number] = turn


_TURN_STATUS = {ev.TURN_COMPLETED: TURN_COMPLETED, ev.TURN_FAILED: TURN_FAILED, ev.TURN_ABORTED: TURN_ABORTED}


def _context_timestamp(event: dict) -> Optional[str]:
    context = event.get("context")
    if isinstance(context, dict) and isinstance(context.get("timestamp"), str):
        return context["timestamp"]
    return None


def _event_row(seq: Optional[int], offset: int, length: int, turn: Optional[int], ts: Optional[str], event: dict) -> tuple:
    return (seq, offset, length, turn, ts) + ev.describe(event)


# --------------------------------------------------------------------------------------------
# Cap planning (pure; the I/O is in _Session.enforce_cap)


@dataclass(frozen=True)
class CapPlan:
    """Which oldest whole turns a cap rewrite removes: the log is cut at ``truncate_offset``,
    ``evicted_events`` is the planned count (the rewrite recounts the prefix, which may also hold
    thread records), and ``first_kept_turn`` is the first surviving turn (``None``: none)."""

    truncate_offset: int
    evicted_events: int
    evicted_turns: int
    first_kept_turn: Optional[int]


def cap_low_water(max_events: int) -> int:
    """How far a cap rewrite evicts: 10% below the cap (rounded down to whole events).

    VT Code evicts just below the cap, so a session at its cap rewrites the whole log, and writes
    another eviction summary, on every turn. The headroom makes that once per ~10% of the cap.
    Below a cap of 10 there is no headroom, and eviction is exactly VT Code's.
    """
    return max_events - max_events // 10


def plan_cap_eviction(
    turns: Iterable[tuple[int, int, int, int]], event_count: int, max_events: int, open_turn: Optional[int] = None
) -> Optional[CapPlan]:
    """Plan a cap eviction over ``(number, start, end, event_count)`` turn spans, oldest first.

    Once ``event_count`` exceeds ``max_events``, whole turns are taken from the oldest until
    ``event_count - evicted <= cap_low_water(max_events)``; the open turn (number ``open_turn``)
    is never taken. ``None`` when under the cap, when ``max_events`` is 0 (no cap), or when
    nothing can be evicted. ``turns`` is consumed lazily, only as far as needed; nothing is
    mutated.
    """
    if max_events <= 0 or event_count <= max_events:
        return None
    target = cap_low_water(max_events)
    evicted = 0
    taken = 0
    truncate = None
    spans = iter(turns)
    first_kept = None
    for number, _start, end, count in spans:
        if number == open_turn or event_count - evicted <= target:
            first_kept = number
            break
        evicted += count
        taken += 1
        truncate = end
    if truncate is None:
        return None
    if first_kept is None:
        first_kept = next(spans, (None,))[0]
    return CapPlan(truncate, evicted, taken, first_kept)


def write_eviction_summary(session_dir: Path, session_id: str, events: list) -> Path:
    """The default cap-eviction hook: record what was evicted in
    ``derived/eviction-summary-<32 hex>.json``.

    The summary counts the evicted events by type and keeps up to five grounded facts (the
    agent's messages, whitespace-normalized, at most 180 characters each, newest last) as plain
    strings, as VT Code does.
    """
    facts: list[str] = []
    for event in events:
        text = ev.agent_message_text(event)
        if not text:
            continue
        fact = ev.truncate_for_fact(ev.normalize_whitespace(text), EVICTION_FACT_CHARS)
        if not fact:
            continue
        lowered = fact.lower()
        facts = [f for f in facts if f.lower() != lowered]
        facts.append(fact)
    summary = {
        "session_id": session_id,
        "evicted_event_count": len(events),
        "event_types": dict(sorted(Counter(e.get("type") for e in events).items())),
        "created_at": ev.utc_now(),
        "grounded_facts": facts[-EVICTION_SUMMARY_FACTS:],
    }
    derived = ensure_private_dir(Path(session_dir) / DERIVED_DIR)
    path = derived / f"eviction-summary-{uuid.uuid4().hex}.json"
    atomic_write(path, orjson.dumps(summary, option=orjson.OPT_INDENT_2))
    return path


# --------------------------------------------------------------------------------------------
# Legacy VT Code turn index (index/turns.json), read only to keep turn ordinals on a rescan


def _legacy_spans(session_dir: Path) -> list[tuple[int, int, int, int]]:
    try:
        data = orjson.loads(read_no_follow(session_dir / INDEX_DIR / "turns.json") or b"null")
    except (orjson.JSONDecodeError, MemstoreError):
        return []
    entries = data.get("entries") if isinstance(data, dict) else None
    spans = []
    for entry in entries if isinstance(entries, list) else []:
        try:
            span = (entry["turn_number"], entry["start_offset"], entry["end_offset"], entry["event_count"])
        except (KeyError, TypeError):
            return []
        if not all(type(v) is int for v in span):
            return []
        spans.append(span)
    return spans


def _spans_valid(spans: Sequence[tuple[int, int, int, int]], length: int) -> bool:
    previous_end = 0
    for _number, start, end, count in spans:
        if count <= 0 or start < previous_end or start > end or end > length:
            return False
        previous_end = end
    return True


# --------------------------------------------------------------------------------------------
# The shared per-process session state

_registry: dict[str, "_Session"] = {}
_registry_lock = threading.Lock()
# Sessions of handles dropped without close(); SimpleQueue.put is safe to call from __del__.
_dropped: "queue.SimpleQueue[_Session]" = queue.SimpleQueue()
_reaper: Optional[threading.Thread] = None
_inherited_connections: list = []


def _release_now_if_safe(session: "_Session") -> bool:
    """Release a dropped handle's session at once if no lock it needs is held by anyone (this
    thread included); return whether it did."""
    lock = session.lock
    owned = getattr(lock, "_is_owned", None)
    if owned is None or owned() or not lock.acquire(blocking=False):
        return False
    try:
        if not _registry_lock.acquire(blocking=False):
            return False
        _registry_lock.release()
        try:
            session.release(flush_metadata=False)
        except Exception:
            pass  # nobody holds the dropped handle to report to; reopening repairs from the log
        return True
    finally:
        lock.release()


def _reap_dropped_handles() -> None:
    while True:
        session = _dropped.get()
        try:
            session.release(flush_metadata=False)
        except Exception:
            pass  # nobody holds the dropped handle to report to; reopening repairs from the log


def _start_reaper() -> None:
    global _reaper
    if _reaper is None:
        _reaper = threading.Thread(target=_reap_dropped_handles, name="memstore-reaper", daemon=True)
        _reaper.start()


def _drain_dropped_handles() -> None:
    while True:
        try:
            session = _dropped.get_nowait()
        except queue.Empty:
            return
        try:
            session.release(flush_metadata=False)
        except Exception:
            pass


def _forget_sessions_in_forked_child() -> None:
    """After fork(), the child must not act on the parent's sessions: their buffers, state and
    liveness lock belong to the parent. The child drops them (closing only its copies of the
    descriptors; unlocking would release the parent's lock) and starts with a fresh registry,
    so its own opens take the lock like any other process's."""
    global _registry, _registry_lock, _dropped, _reaper
    inherited = list(_registry.values())
    _registry = {}
    _registry_lock = threading.Lock()
    _dropped = queue.SimpleQueue()
    _reaper = None
    for session in inherited:
        session.forget_after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_sessions_in_forked_child)


@atexit.register
def _flush_open_sessions_at_exit() -> None:
    """Sessions still open at interpreter exit are flushed (written, synced, indexed) while the
    publisher threads still run; a crash, not a normal exit, is what loses buffered events."""
    _drain_dropped_handles()
    with _registry_lock:
        sessions = list(_registry.values())
    for session in sessions:
        with session.lock:
            try:
                if session.failed is None and session.fd >= 0:
                    session.flush()
                session.publisher.stop()
            except Exception:
                pass  # nobody is left to report to; the next open repairs from the log


class _Session:
    """The state every handle of one session in this process shares: one append descriptor,
    one buffer, one lifecycle state, one index connection and one liveness lock."""

    def __init__(self, root: Path, session_id: str, directory: Path, key: str):
        self.root = root
        self.session_id = session_id
        self.dir = directory
        self.key = key
        self.events_path = directory / EVENTS_FILE
        self.index_path = directory / INDEX_DIR / INDEX_FILE
        self.lock = threading.RLock()
        self.handles = 0
        self.fd = -1
        self.rfd = -1
        self.file_len = 0
        self.buffer = bytearray()
        self.pending: list[tuple] = []
        self.unpublished = 0
        self.tail = b""
        self.failed: Optional[BaseException] = None
        self.liveness = LivenessLock(directory)
        self.index: Optional[SessionIndex] = None
        self.state: LogState
        self.published: Optional[bytes] = None
        self.publisher = ManifestPublisher(directory)
        self.unsynced = False
        self.ready = False
        self.inherited = False
        self._status_floor = 0

    # -- open ------------------------------------------------------------------------------

    def open(self, *, force_rescan: bool = False) -> None:
        new_subdirs = not (self.dir / INDEX_DIR).is_dir() or not (self.dir / DERIVED_DIR).is_dir()
        ensure_private_dir(self.dir / INDEX_DIR, sync=False)
        ensure_private_dir(self.dir / DERIVED_DIR, sync=False)
        if not self.liveness.acquire() and self.liveness.holder_elsewhere:
            raise SessionBusyError(
                f"session {self.session_id!r} is open in another process ({self.liveness.path} is locked); "
                "memstore allows one writing process per session"
            )
        try:
            self._remove_dead_temp_files()
            if not self._open_files() and new_subdirs:
                fsync_dir(self.dir)  # creating events.jsonl would have synced it
            self._recover(force_rescan)
        except BaseException:
            try:
                self.publisher.stop()
            except Exception:
                pass  # the open failed already; that error is the one to report
            self._close_files()
            self.liveness.release()
            raise

    def _remove_dead_temp_files(self) -> None:
        """Remove temp files that writers killed mid-write left behind (a cap rewrite's copy of the
        log, an atomic write's temp file). Only those whose writer process is gone."""
        for directory in (self.dir, self.dir / INDEX_DIR, self.dir / DERIVED_DIR):
            try:
                names = os.listdir(directory)
            except OSError:
                continue
            for name in names:
                pid = temp_file_pid(name)
                if pid is None or _pid_alive(pid):
                    continue
                try:
                    os.unlink(directory / name)
                except OSError:
                    pass  # not ours to fail on; it will be tried again on the next open

    def _open_files(self) -> bool:
        """Open the append and read descriptors; return whether the log was created (which
        synced the session directory)."""
        self.fd, created = open_private_append(self.events_path)
        rfd = open_read_no_follow(self.events_path)
        if rfd is None:
            raise StoreIOError("open", self.events_path, "disappeared while opening")
        self.rfd = rfd
        self.file_len = os.fstat(self.fd).st_size
        return created

    def _close_descriptors(self) -> None:
        for name in ("fd", "rfd"):
            fd = getattr(self, name)
            if fd >= 0:
                setattr(self, name, -1)
                try:
                    os.close(fd)
                except OSError:
                    pass  # after fdatasync a close error says nothing about the data

    def _close_files(self) -> None:
        self._close_descriptors()
        if self.index is not None:
            self.index.close()
            self.index = None

    def _open_index(self) -> Optional[SavedState]:
        if self.index is not None:
            self.index.close()
            self.index = None
        try:
            self.index = SessionIndex.open(self.index_path)
            return self.index.load()
        except IndexCorrupt:
            if self.index is not None:
                self.index.close()
            SessionIndex.discard(self.index_path)
            self.index = SessionIndex.open(self.index_path)
            return None

    def _recover(self, force_rescan: bool) -> None:
        marker = load_marker(self.dir)
        on_disk = load_manifest(self.dir)
        saved = self._open_index()
        marker_applies = marker is not None and marker.matches(self.file_len)
        fast = (
            not force_rescan
            and saved is not None
            and not marker_applies
            and self._covers_prefix(saved)
            and self.index.is_consistent(saved.manifest)
        )
        if fast and on_disk is not None and on_disk.persisted_file_len == saved.manifest.persisted_file_len:
            mine, theirs = saved.manifest, on_disk
            if (mine.turn_count, mine.event_count, mine.in_turn, mine.retained_turn_base) != (
                theirs.turn_count, theirs.event_count, theirs.in_turn, theirs.retained_turn_base
            ):
                fast = False
            else:
                # Retention may have marked the session completed; keep what it published.
                mine.status, mine.created_at, mine.updated_at = theirs.status, theirs.created_at, theirs.updated_at
        if fast:
            self.state = LogState(saved.manifest, saved.open_turn)
            self.tail = saved.tail
            start = saved.manifest.persisted_file_len
            self._repair_tail(start)
            if self.file_len > start:
                self._scan(start, reset=False)
        else:
            base = self._scan_turn_base(marker if marker_applies else None, on_disk, saved)
            self._repair_tail(0)
            self._rescan(base, on_disk, saved)
        self._publish_manifest(force=on_disk is None or on_disk != self.state.manifest, wait=True)
        if marker is not None:
            clear_marker(self.dir)

    def _covers_prefix(self, saved: SavedState) -> bool:
        """Whether the saved state describes a prefix of the log on disk (same tail bytes)."""
        covered = saved.manifest.persisted_file_len
        if covered > self.file_len:
            return False
        if covered == 0:
            return saved.tail == b""
        if len(saved.tail) != min(TAIL_BYTES, covered) or not saved.tail.endswith(b"\n"):
            return False
        return self._pread(covered - len(saved.tail), len(saved.tail)) == saved.tail

    def _scan_turn_base(self, marker: Optional[CapRewriteMarker], on_disk: Optional[Manifest], saved: Optional[SavedState]) -> int:
        """The ordinal of the first turn the log holds, for a rescan (reference 5.3 step 6, with
        memstore's log head first: a log memstore rewrote says its base itself)."""
        if marker is not None:
            return max(1, marker.retained_turn_base)
        head = self._log_head()
        if head.retained_turn_base is not None:
            return head.retained_turn_base
        # The index's manifest row matches its spans; manifest.json may lag (published later).
        stale = saved.manifest if saved is not None else on_disk
        stale_spans = self.index.turn_spans() if saved is not None else _legacy_spans(self.dir)
        if (
            stale is not None
            and stale.persisted_file_len > self.file_len
            and self._prefix_removed(saved, stale.persisted_file_len - self.file_len) is not False
        ):
            removed = stale.persisted_file_len - self.file_len
            if _spans_valid(stale_spans, stale.persisted_file_len):
                for number, start, _end, _count in stale_spans:
                    if start >= removed:
                        return max(1, number)
            if self.file_len == 0:
                return stale.turn_count + 1
        if on_disk is not None and on_disk.has("retained_turn_base"):
            return on_disk.retained_turn_base
        if saved is not None:
            return saved.manifest.retained_turn_base
        if stale_spans and _spans_valid(stale_spans, self.file_len):
            return max(1, stale_spans[0][0])
        return 1

    def _log_head(self) -> ev.LogHead:
        """What the log's first line says about evicted turns (see ``events.decode_log_head``)."""
        end = self._find_newline(0)
        if end < 0:
            return ev.LogHead(None, None)
        return ev.decode_log_head(self._pread(0, end + 1))

    def _find_newline(self, start: int) -> int:
        """Position of the first ``\\n`` at or after ``start`` (``-1`` if none)."""
        pos = start
        while pos < self.file_len:
            chunk = self._pread(pos, min(1 << 16, self.file_len - pos))
            found = chunk.find(b"\n")
            if found >= 0:
                return pos + found
            pos += len(chunk)
        return -1

    def _prefix_removed(self, saved: Optional[SavedState], removed: int) -> Optional[bool]:
        """When the log is shorter than the stale metadata says, was a prefix removed (a cap
        rewrite that crashed before its index caught up) or a suffix lost (a power cut took
        bytes the metadata already described)? Answered by finding the log's first record in
        the stale index: by its seq, or for a VT Code line by its length and type at the two
        candidate offsets. ``None`` when that cannot tell."""
        if saved is None:
            return None
        first = self._first_record()
        if first is None:
            return None
        here, length, record = first
        try:
            if record.seq is not None:
                rows = self.index.conn.execute("SELECT offset FROM events WHERE seq = ?", (record.seq,)).fetchall()
                offsets = {row[0] for row in rows} if len(rows) == 1 else set()
            else:
                rows = self.index.conn.execute(
                    "SELECT offset FROM events WHERE offset IN (?, ?) AND length = ? AND type = ?",
                    (here, here + removed, length, record.event["type"]),
                ).fetchall()
                offsets = {row[0] for row in rows}
        except Exception:
            return None
        if offsets == {here}:
            return False
        if offsets == {here + removed}:
            return True
        return None

    def _first_record(self) -> Optional[tuple[int, int, Record]]:
        """``(offset, length, record)`` of the log's first valid record."""
        pos = 0
        while pos < self.file_len:
            end = self._find_newline(pos)
            if end < 0:
                return None
            record = ev.decode_line(self._pread(pos, end + 1 - pos))
            if record is not None:
                return pos, end + 1 - pos, record
            pos = end + 1
        return None

    def _rescan(self, base: int, on_disk: Optional[Manifest], saved: Optional[SavedState]) -> None:
        known = [m for m in (on_disk, saved.manifest if saved else None) if m is not None]
        head_seq = self._log_head().next_seq or 1
        manifest = Manifest(
            session_id=known[0].session_id if known else self.session_id,
            # From the log alone these start empty: the scan takes them from the records' times.
            created_at=known[0].created_at if known else "",
            updated_at=known[0].updated_at if known else "",
            turn_count=base - 1,
            retained_turn_base=base,
            status=known[0].status if known else STATUS_ACTIVE,
            next_seq=max([m.next_seq for m in known] + [head_seq]),
        )
        self.state = LogState(manifest)
        self.tail = b""
        # A status the log no longer shows (set by retention, or by a thread.completed the cap
        # evicted) stands against the records the old metadata already covered; only newer
        # records may change it.
        self._status_floor = known[0].persisted_file_len if known else 0
        try:
            self._scan(0, reset=True)
        finally:
            self._status_floor = 0

    # -- scanning --------------------------------------------------------------------------

    def _reader(self):
        """A new buffered reader on the log's current inode (its own file offset)."""
        fd = open_read_no_follow(self.events_path)
        if fd is None:
            raise StoreIOError("read", self.events_path, "the log disappeared")
        return os.fdopen(fd, "rb", buffering=1 << 20)

    def _pread(self, offset: int, length: int) -> bytes:
        try:
            return os.pread(self.rfd, length, offset)
        except OSError as exc:
            raise StoreIOError.from_os_error("read", self.events_path, exc) from exc

    def _scan(self, start: int, *, reset: bool) -> None:
        """Index the log from byte ``start`` to the end of the file, committing in batches so an
        interrupted scan resumes where it stopped."""
        state = self.state
        manifest = state.manifest
        rows: list[tuple] = []
        offset = start
        end = self.file_len
        with self._reader() as reader:
            try:
                reader.seek(start)
                for line in reader:
                    line_start = offset
                    offset += len(line)
                    if offset > end or line[-1:] != b"\n":
                        offset = line_start
                        break
                    record = ev.decode_line(line)
                    if record is None:
                        continue
                    self._apply_record(record, line_start, offset, rows)
                    if len(rows) >= SCAN_BATCH_EVENTS:
                        self._commit_scan(rows, offset, reset)
                        rows, reset = [], False
            except OSError as exc:
                raise StoreIOError.from_os_error("read", self.events_path, exc) from exc
        self._commit_scan(rows, offset, reset)
        manifest.persisted_file_len = offset

    def _apply_record(self, record: Record, start: int, end: int, rows: list) -> None:
        event = record.event
        manifest = self.state.manifest
        status = manifest.status
        _boundary, turn = self.state.apply(event["type"], event, start, end, record.seq, record.ts)
        if start < self._status_floor:
            manifest.status = status
        if record.seq is not None and record.seq >= manifest.next_seq:
            manifest.next_seq = record.seq + 1
        if record.ts is not None:
            if not manifest.created_at:
                manifest.created_at = record.ts
            if record.ts > manifest.updated_at:
                manifest.updated_at = record.ts  # only forward: complete() may have bumped it past the log
        rows.append(_event_row(record.seq, start, end - start, turn, record.ts, event))

    def _commit_scan(self, rows: list, offset: int, reset: bool) -> None:
        manifest = self.state.manifest
        if not manifest.created_at:  # no record with a time yet (VT Code lines have none)
            manifest.created_at = ev.utc_now()
        if not manifest.updated_at:
            manifest.updated_at = manifest.created_at
        manifest.persisted_file_len = offset
        self.tail = self._pread(max(0, offset - TAIL_BYTES), min(TAIL_BYTES, offset))
        self.index.commit(rows, self.state.dirty.values(), manifest, self.tail, reset=reset)
        self.state.dirty.clear()

    def _repair_tail(self, floor: int) -> None:
        """Cut a torn tail (a partial last line, or trailing lines that are not JSON, such as a
        run of NUL bytes) back to the last complete line at or after ``floor``. The cut bytes are
        saved beside the log first, never discarded."""
        cut = self._last_good_end(floor)
        if cut >= self.file_len:
            return
        torn = self._pread(cut, self.file_len - cut)
        keep = self.dir / f"{EVENTS_FILE}.torn-{cut}-{ev.utc_now().replace(':', '')}"
        write_new_file(keep, torn)
        try:
            os.ftruncate(self.fd, cut)
            os.fsync(self.fd)
        except OSError as exc:
            raise StoreIOError.from_os_error("truncate torn tail of", self.events_path, exc) from exc
        self.file_len = cut

    def _last_good_end(self, floor: int) -> int:
        end = self.file_len
        if end <= floor:
            return end
        cut = self._rfind_newline(floor, end) + 1
        while cut > floor:
            line_start = self._rfind_newline(floor, cut - 1) + 1
            line = self._pread(line_start, cut - line_start)
            if not line.strip() or _is_json(line):
                break
            cut = line_start
        return max(cut, floor)

    def _rfind_newline(self, floor: int, end: int) -> int:
        """Position of the last ``\\n`` in ``[floor, end)``, or ``floor - 1`` if there is none."""
        pos = end
        while pos > floor:
            size = min(1 << 16, pos - floor)
            chunk = self._pread(pos - size, size)
            found = chunk.rfind(b"\n")
            if found >= 0:
                return pos - size + found
            pos -= size
        return floor - 1

    # -- writing ---------------------------------------------------------------------------

    def check_usable(self) -> None:
        if self.failed is not None:
            raise LogFailedError(
                f"an earlier operation on {self.events_path} failed ({self.failed}); close every handle "
                "of this session and open it again (the log on disk is valid)"
            ) from self.failed

    def append(self, event: dict, durability: str, max_events: int, on_evict: Optional[EvictionHook], ts: Optional[str] = None) -> int:
        # The agent's hot path: kept flat on purpose (locals, no helper calls per event).
        kind = _check_event(event)
        if ts is not None:
            ts = ev.normalize_ts(ts)
        with self.lock:
            if self.failed is not None:
                self.check_usable()
            state = self.state
            manifest = state.manifest
            seq = manifest.next_seq
            if ts is None:
                ts = _utc_now()
            buffer = self.buffer
            start = self.file_len + len(buffer)
            if start == 0 and manifest.retained_turn_base > 1:
                line = _encode_record(seq, ts, event, manifest.retained_turn_base)
            else:
                line = _encode_record(seq, ts, event)
            size = len(line)
            buffer += line
            manifest.next_seq = seq + 1
            manifest.updated_at = ts
            boundary, turn = state.apply(kind, event, start, start + size, seq, ts)
            self.pending.append((seq, start, size, turn, ts) + _describe(event))
            self.unpublished += size
            if durability == "event":
                self.write_out(sync=True)
            if boundary:
                self.write_out(sync=durability != "none")
                if durability != "none":
                    self.publish()
            if len(self.buffer) >= MAX_WRITE_BUFFER_BYTES:
                self.write_out(sync=durability != "none")
            if durability != "none":
                if self.unpublished >= MAX_WRITE_BUFFER_BYTES:
                    self.write_out(sync=True)
                    self.publish()
            elif self.unpublished >= BULK_INDEX_BYTES:
                # Bulk mode indexes in larger batches and leaves the manifest to flush/close.
                self.write_out(sync=False)
                self.publish(manifest=False)
            if max_events > 0 and manifest.event_count > max_events:
                self.enforce_cap(max_events, on_evict)
        return seq

    def write_out(self, *, sync: bool) -> None:
        """Write the buffer with one ``write()`` of whole lines, then ``fdatasync`` if asked.

        On a failed write the file is truncated back to its previous length and the session
        fails closed; on a failed sync it fails closed (the kernel may have dropped the pages).
        """
        buffer = self.buffer
        if buffer:
            try:
                write_all(self.fd, buffer, self.events_path)
            except StoreIOError as exc:
                self.failed = exc
                try:
                    os.ftruncate(self.fd, self.file_len)
                except OSError:
                    pass  # the next open cuts the torn tail; the log stays readable
                raise
            self.file_len += len(buffer)
            self.tail = (self.tail + buffer[-TAIL_BYTES:])[-TAIL_BYTES:]
            del buffer[:]
            self.unsynced = True
        if sync and self.unsynced:
            try:
                os.fdatasync(self.fd)
            except OSError as exc:
                error = StoreIOError.from_os_error("fdatasync", self.events_path, exc)
                self.failed = error
                raise error from exc
            self.unsynced = False

    def publish(self, *, manifest: bool = True) -> None:
        """Commit the index rows for everything written, then (with ``manifest``) publish the
        manifest. If the index transaction fails, nothing is forgotten: the next publish
        retries the same rows and turns."""
        if self.buffer:
            raise AssertionError("publish() before write_out()")
        state = self.state
        state.manifest.persisted_file_len = self.file_len
        self.index.commit(self.pending, state.dirty.values(), state.manifest, self.tail)
        state.dirty.clear()
        self.pending = []
        self.unpublished = 0
        if manifest:
            self._publish_manifest()

    def _publish_manifest(self, *, force: bool = False, wait: bool = False) -> None:
        """Publish the manifest if it changed: from the background publisher on the append
        path, synchronously (``wait``) on flush, open and close."""
        data = self.state.manifest.to_json()
        if force or data != self.published:
            self.publisher.submit(data)
            self.published = data
        if wait:
            try:
                self.publisher.drain()
            except BaseException:
                self.published = None  # not on disk: the next flush publishes it again
                raise

    def flush(self, *, sync: bool = True) -> None:
        with self.lock:
            self.check_usable()
            self.write_out(sync=sync)
            if self.pending or self.state.dirty or self.unpublished:
                self.publish(manifest=False)
            self._publish_manifest(wait=True)

    # -- cap rewrite -----------------------------------------------------------------------

    def enforce_cap(self, max_events: int, on_evict: Optional[EvictionHook]) -> None:
        manifest = self.state.manifest
        open_turn = self.state.open_turn.number if self.state.open_turn is not None else None
        plan = plan_cap_eviction(self._turn_spans(), manifest.event_count, max_events, open_turn)
        if plan is None:
            return
        self.flush()
        cut = plan.truncate_offset
        if cut > self.file_len:
            raise StoreIOError("cap rewrite", self.events_path, f"planned offset {cut} is past the end ({self.file_len})")
        evicted = [r.event for r in self._records(0, cut)]
        base = plan.first_kept_turn if plan.first_kept_turn is not None else manifest.turn_count + 1
        head, skip, grown = self._retained_head(cut, base)
        hook = on_evict if on_evict is not None else write_eviction_summary
        try:
            hook(self.dir, manifest.session_id, evicted)
        except Exception as exc:
            raise CapEvictionError(
                f"eviction summary hook failed for {self.events_path}; the log was left intact: {exc}"
            ) from exc
        delta = len(head) - skip
        new_len = self.file_len - cut + delta
        write_marker(self.dir, CapRewriteMarker(self.file_len, new_len, base))
        try:
            self._copy_log_from(cut + skip, head)
        except BaseException:
            clear_marker(self.dir)  # the log was not replaced: nothing to recover
            raise
        try:
            # The log is replaced from here on. Should anything fail now, the descriptors or
            # the index may still describe the old log: the session fails closed and a reopen,
            # guided by the marker, brings them together again.
            fsync_dir(self.dir)
            self._close_descriptors()
            self._open_files()
            manifest.event_count -= len(evicted)
            manifest.retained_turn_base = base
            manifest.persisted_file_len = new_len
            # Offsets move back by ``cut``; those past the head's first line move by ``delta``.
            pivot = cut + 1 if grown else cut
            turn = self.state.open_turn
            if turn is not None:
                turn.start_offset += -cut + (delta if turn.start_offset >= pivot else 0)
                turn.end_offset += -cut + (delta if turn.end_offset >= pivot else 0)
            self.tail = self._pread(max(0, new_len - TAIL_BYTES), min(TAIL_BYTES, new_len))
            self.index.evict(cut, base, manifest, self.tail, pivot=pivot, delta=delta, grown=grown)
        except BaseException as exc:
            self.failed = exc
            raise
        self._publish_manifest(wait=True)
        clear_marker(self.dir)

    def _turn_spans(self) -> Iterator[tuple[int, int, int, int]]:
        """Turn spans oldest first, from the index overlaid with turns not yet committed to it."""
        dirty = self.state.dirty
        seen = set()
        for number, start, end, count in self.index.turn_spans():
            seen.add(number)
            turn = dirty.get(number)
            yield (number, turn.start_offset, turn.end_offset, turn.event_count) if turn else (number, start, end, count)
        for number in sorted(set(dirty) - seen):
            turn = dirty[number]
            yield (number, turn.start_offset, turn.end_offset, turn.event_count)

    def _retained_head(self, cut: int, base: int) -> tuple[bytes, int, bool]:
        """How the rewritten log starts, so that it says which turns it lost: ``(head, skip,
        grown)``. Normally its first line, tagged with ``retained_turn_base`` (``skip`` its old
        length, ``grown`` true); an anchor line if that line cannot be tagged (``skip`` 0).
        Nothing when nothing is left: VT Code's tests count the lines of such a log, and the
        next append tags its own line instead."""
        if cut >= self.file_len:
            return b"", 0, False
        end = self._find_newline(cut)
        if end >= 0:
            line = self._pread(cut, end + 1 - cut)
            if ev.decode_line(line) is not None:
                tagged = ev.tag_retained_base(line[:-1], base)
                if tagged is not None:
                    return tagged + b"\n", len(line), True
        return ev.encode_anchor(base, self.state.manifest.next_seq), 0, False

    def _copy_log_from(self, start: int, head: bytes) -> None:
        """Atomically replace the log by ``head`` and its bytes from ``start`` on (copy to a
        temp file, fsync, rename). The caller syncs the directory and reopens the descriptors."""
        tmp = self.dir / f".{EVENTS_FILE}.cap-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        fd, _ = open_private_append(tmp)
        try:
            try:
                write_all(fd, head, tmp)
                pos = start
                while pos < self.file_len:
                    chunk = os.pread(self.rfd, min(1 << 20, self.file_len - pos), pos)
                    if not chunk:
                        raise StoreIOError("cap rewrite", self.events_path, "log shrank while copying")
                    write_all(fd, chunk, tmp)
                    pos += len(chunk)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, self.events_path)
        except BaseException as exc:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            if isinstance(exc, OSError):
                raise StoreIOError.from_os_error("cap rewrite", self.events_path, exc) from exc
            raise

    # -- reading ---------------------------------------------------------------------------

    def _records(self, start: int, end: int) -> Iterator[Record]:
        """Decode the valid records in ``[start, end)``; lines that fail decoding are skipped."""
        pos = start
        leftover = b""
        while pos < end:
            chunk = self._pread(pos, min(1 << 20, end - pos))
            if not chunk:
                break
            pos += len(chunk)
            lines = (leftover + chunk).split(b"\n")
            leftover = lines.pop()
            for line in lines:
                record = ev.decode_line(line)
                if record is not None:
                    yield record
        if leftover:
            record = ev.decode_line(leftover)
            if record is not None:
                yield record

    def reconstruct_turn(self, number: int, sync: bool) -> list[dict]:
        with self.lock:
            self.flush(sync=sync)
            turn = self.index.turn(number)
            if turn is None:
                raise TurnNotFound(self.state.manifest.session_id, number)
            return [r.event for r in self._records(turn.start_offset, turn.end_offset)]

    def snapshot_for_read(self, sync: bool):
        """Flush and return ``(reader, length)`` for a reader that works unlocked: the reader
        stays on this inode even if a cap rewrite replaces the log meanwhile."""
        with self.lock:
            self.flush(sync=sync)
            return self._reader(), self.file_len

    # -- close -----------------------------------------------------------------------------

    def forget_after_fork(self) -> None:
        """In a forked child: make this inherited session unusable without touching the
        parent's files, lock or threads."""
        self.failed = SessionBusyError(
            f"session {self.session_id!r} was opened by the parent of this forked process; open it again here"
        )
        self.inherited = True
        self._close_descriptors()
        self.liveness.forget()
        # The SQLite connection is the parent's: closing it here (even by garbage collection)
        # could checkpoint the parent's database under it. Keep it referenced, unused.
        _inherited_connections.append(self.index)
        self.index = None

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
            # Under the registry lock, so that no open can pick up this session while it closes,
            # nor find the liveness lock still held by the closing descriptor.
            with _registry_lock:
                self.handles -= 1
                if self.handles <= 0:
                    if _registry.get(self.key) is self:
                        del _registry[self.key]
                    self.ready = False
                    try:
                        self.publisher.stop()
                    except BaseException as exc:
                        error = error or exc
                    self._close_files()
                    self.liveness.release()
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


def _is_json(line: bytes) -> bool:
    try:
        orjson.loads(line)
        return True
    except orjson.JSONDecodeError:
        return False


# --------------------------------------------------------------------------------------------
# The public handle


class SessionLog:
    """A handle on one session's event log. Create it with :func:`open_session`.

    Handles of the same session in one process share one state: counts, buffer, index and lock.
    ``append`` buffers; the buffer is written at turn boundaries (``turn.completed``,
    ``turn.failed``, ``thread.completed``), when it reaches 64 KiB, on reads, ``flush``,
    ``complete`` and ``close``. An event is acknowledged (durable, with ``durability="turn"``)
    once the append that closes its turn, or a ``flush``, has returned.
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
            s.state.manifest.updated_at = ev.utc_now()
            s.flush()

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
        session = self._s
        if _release_now_if_safe(session):
            return
        _dropped.put(session)

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
        """Every valid record (``seq``, ``ts``, ``event``) in log order, as of this call."""
        s = self._live()
        reader, length = s.snapshot_for_read(self._sync_reads)
        try:
            with reader:
                pos = 0
                for line in reader:
                    pos += len(line)
                    if pos > length:
                        break
                    record = ev.decode_line(line)
                    if record is not None:
                        yield record
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
    :func:`write_eviction_summary`) has recorded them; if the hook raises, nothing is evicted.
    ``durability`` is ``"turn"`` (fdatasync at each turn boundary), ``"event"`` (every append)
    or ``"none"`` (only ``flush``/``close`` sync; for bulk imports).

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
    _create_root(root)
    _start_reaper()
    ensure_private_dir(sessions_root(root))
    directory = ensure_private_dir(session_directory(root, session_id))
    key = os.path.realpath(directory)
    while True:
        with _registry_lock:
            shared = _registry.get(key)
            fresh = shared is None
            if fresh:
                shared = _Session(root, session_id, directory, key)
                _registry[key] = shared
            shared.handles += 1
        if fresh:
            with shared.lock:
                try:
                    shared.open(force_rescan=force_rescan)
                except BaseException:
                    with _registry_lock:
                        _registry.pop(key, None)
                    raise
                shared.ready = True
            return SessionLog(shared, max_events, durability, on_evict)
        try:
            shared.lock.acquire()
        except BaseException:  # interrupted while waiting: give the handle count back
            with _registry_lock:
                shared.handles -= 1
            raise
        with _released(shared.lock):
            if not shared.ready:
                continue  # its first open failed while we waited; try afresh
            elif force_rescan:
                try:
                    shared.flush()
                except BaseException:
                    shared.release(flush_metadata=False)
                    raise
                try:
                    shared._recover(force_rescan=True)
                except BaseException as exc:
                    # A half-done rescan leaves the shared state describing part of the log.
                    shared.failed = exc
                    shared.release(flush_metadata=False)
                    raise
        return SessionLog(shared, max_events, durability, on_evict)


@contextmanager
def _released(lock) -> Iterator[None]:
    """Release an already acquired ``lock`` when the block ends."""
    try:
        yield
    finally:
        lock.release()


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


def rebuild(root: os.PathLike | str, session_id: str) -> Manifest:
    """Regenerate the session's index and manifest by rescanning ``events.jsonl``.

    The log decides everything it records. What it cannot record is kept from the old metadata
    when present: ``created_at``, a status set outside the log (retention marking a session
    completed, or a ``thread.completed`` the cap evicted), and, for logs VT Code rewrote, the
    first retained turn's number. A torn tail is cut (and kept) as on any open. Works on a
    session this process has open (under its lock); refuses with :class:`SessionBusyError` one
    that another process has open.
    """
    directory = session_directory(root, session_id)
    if directory.is_symlink() or not (directory / EVENTS_FILE).is_file():
        raise StoreIOError("rebuild", directory, "no such session (no events.jsonl)")
    log = _open(root, session_id, 0, "turn", None, force_rescan=True)
    try:
        return log.manifest
    finally:
        log.close()


__all__ = [
    "DEFAULT_MAX_EVENTS",
    "CapPlan",
    "LogState",
    "SessionLog",
    "open_session",
    "plan_cap_eviction",
    "rebuild",
    "write_eviction_summary",
    "cap_low_water",
]
