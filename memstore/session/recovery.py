"""Opening a session's views against its log: trust the index for the prefix it covers and
index the rest, or rescan the whole log when the metadata cannot be trusted.

The index records the log length it covers and the last bytes it saw there. An open that finds
those bytes in the log indexes only what follows; otherwise (index missing, corrupt, inconsistent
with itself or with the manifest, describing another log, or a cap rewrite interrupted) it
rebuilds the index from the log. Turn ordinals survive a rescan: the first retained turn's
number comes from the rewrite marker, the log's own head, or the stale metadata (reference
section 5.3, step 6).

Recovery works on what it is handed: the log file, the index slot (whose index it reopens,
discards or rebuilds), the session directory and id, and the publisher that publishes the
manifest once the index describes the log. The state it builds is handed to the writer as soon
as it exists (``use_state``), so the writer's view is the state being scanned into.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Optional

import orjson

from .. import events as ev
from .. import faults
from ..errors import MemstoreError, StoreIOError
from ..fsio import atomic_write, read_no_follow
from ..layout import INDEX_DIR, MANIFEST_FILE
from .index import BatchRecord, SavedState, SessionIndex, derived_tables, tail_digest
from .indexslot import IndexSlot
from .lifecycle import LogState
from .logfile import TAIL_BYTES, LogFile, torn_seq_floor
from .manifest import (
    STATUS_ACTIVE,
    CapRewriteMarker,
    Manifest,
    clear_marker,
    load_manifest,
    load_marker,
    new_generation,
)
from .publisher import Publisher
from .tuning import TUNING

logger = logging.getLogger("memstore")


def recover(
    log: LogFile,
    slot: IndexSlot,
    publisher: Publisher,
    session_dir: Path,
    session_id: str,
    *,
    force_rescan: bool,
    use_state: Callable[[LogState], None],
    redact_event: Optional[Callable[[dict], dict]] = None,
) -> None:
    """Bring the state, index and manifest of the session ``session_id`` in ``session_dir`` in
    line with its ``log`` (called on open, with the log's descriptors open and the session's
    lock held; ``force_rescan`` rebuilds the index from the log whatever it says). The index is
    left open in ``slot``; ``use_state`` receives the state the log is scanned into as soon as it
    exists; the manifest is published last, then a cap rewrite's marker is removed. A rebuild
    that derives the lazy tables as it scans gives them each event through ``redact_event``."""
    marker = load_marker(session_dir)
    on_disk = load_manifest(session_dir)
    if on_disk is None and log.length and (session_dir / MANIFEST_FILE).exists():
        logger.warning("%s: manifest.json is malformed or its counters are implausible; the log decides", session_dir)
    had_index = slot.path.exists()
    # A rebuild of a small log reads the old index only for what it knew, and builds the new
    # one in memory: opening the old one for writing would cost its WAL and a checkpoint.
    small = log.length <= TUNING.memory_scan_bytes
    saved = slot.open(readonly=force_rescan and small)
    marker_applies = marker is not None and marker.matches(log.length)
    # Why the index cannot be trusted as it is (None: it can), said when it is rebuilt.
    upgraded = False
    why: Optional[str]
    if force_rescan:
        why = "asked for"
    elif saved is None:
        upgraded = slot.index is not None and slot.index.needs_rebuild
        why = "its index is of an older memstore's layout" if upgraded else "no usable index"
    elif marker_applies:
        why = "a cap rewrite was interrupted"
    elif not covers_prefix(log, saved):
        why = "the index describes another log, or more of it than there is"
    elif not _index(slot).is_consistent(saved.manifest):
        why = "the index is inconsistent with itself"
    else:
        why = None
    fast = why is None
    adopted = False
    if (
        fast
        and on_disk is not None
        and saved is not None
        and on_disk.persisted_file_len == saved.manifest.persisted_file_len
    ):
        mine, theirs = saved.manifest, on_disk
        if (mine.turn_count, mine.event_count, mine.in_turn, mine.retained_turn_base) != (
            theirs.turn_count,
            theirs.event_count,
            theirs.in_turn,
            theirs.retained_turn_base,
        ):
            fast = False
            why = "manifest.json and the index disagree on the counts"
        elif (mine.status, mine.created_at, mine.updated_at) != (theirs.status, theirs.created_at, theirs.updated_at):
            # Retention may have marked the session completed; keep what it published.
            mine.status, mine.created_at, mine.updated_at = theirs.status, theirs.created_at, theirs.updated_at
            adopted = True
    if fast and saved is not None:
        state = LogState(saved.manifest, saved.open_turn)
        use_state(state)
        start = saved.manifest.persisted_file_len
        log.tail = log.read_tail(start)
        kept = log.repair_tail(start)
        if log.length > start or kept is not None:
            _catch_up(log, _index(slot), state, start, on_disk)
        elif adopted:  # the index says what manifest.json says (a scan would have committed it)
            _index(slot).commit((), (), saved.manifest, log.tail)
    else:
        faults.check("recovery.rescan", path=log.path, why=why)
        if log.length and not force_rescan:
            # A session VT Code wrote, opened here for the first time, has no index, and an
            # upgrade of memstore outdates every index: no news.
            routine = upgraded or (saved is None and not had_index)
            level = logging.INFO if routine else logging.WARNING
            logger.log(level, "rebuilding the index of %s from its log: %s", log.path, why)
        base = scan_turn_base(log, slot.index, session_dir, marker if marker_applies else None, on_disk, saved)
        if saved is not None and on_disk is None:
            # The old index may go before the new one is whole (a rescan in place discards it
            # before its first batch; one in memory, when the old one has side files, just
            # before its rename), and a crash then leaves manifest.json as the only old
            # metadata (see _catch_up): the index's next_seq and status must survive there,
            # or the next scan hands out again seqs the old index had counted past a lost
            # suffix of the log.
            atomic_write(
                session_dir / MANIFEST_FILE, replace(saved.manifest, session_id=session_id).to_json(), durable=False
            )
        # The rescan writes a new index file: deleting the old rows would only cost time and
        # disk space (what the old index knew is in ``saved``).
        if small:
            # Built in memory and written whole at the end: the old index stays as it was
            # until then, so an interrupted rescan starts again from what it knew.
            slot.build_in_memory()
        elif saved is not None:
            slot.open(fresh=True)
        log.repair_tail(0)
        # A rebuild derives the lazy tables (search chunks) as it goes: it does that anyway,
        # and from the records at hand it costs no second read of the log.
        state = _rescan_state(log, session_id, base, on_disk, saved)
        use_state(state)
        _rescan(log, _index(slot), state, on_disk, saved, derive_lazy=force_rescan and small, redact_event=redact_event)
        if small:
            slot.persist()
    if marker is None:
        publisher.publish_manifest_now(state.manifest.to_json())
        return
    # A cap rewrite's marker (finished here, or stale) goes only once the index and
    # manifest.json that describe the log are durable (VT Code reads the marker until then).
    with slot.lock:
        _index(slot).make_durable()
    publisher.publish_manifest_now(state.manifest.to_json(), durable=True)
    faults.check("cap.unmark", path=session_dir)
    clear_marker(session_dir)


def _index(slot: IndexSlot) -> SessionIndex:
    """The index open in ``slot`` (recovery opened it)."""
    if slot.index is None:
        raise AssertionError(f"{slot.path}: recovery found no index open")
    return slot.index


def _catch_up(log: LogFile, index: SessionIndex, state: LogState, start: int, on_disk: Optional[Manifest]) -> None:
    """Index the log past ``start``, what the index covers, as a rescan would have.

    That includes resuming a rescan interrupted between its batches: its floors (the seqs of
    torn tails, the old metadata's ``next_seq`` and the status it kept against the records it
    covered) are applied only when it ends, and ``manifest.json``, published only then, is
    still the old metadata (it covers more than the index does)."""
    # The torn tails kept beside the log (one cut just now, or by the interrupted rescan) hold
    # seqs handed out but never acknowledged: never reuse them.
    seq_floor = torn_seq_floor(*log.torn_files())
    status_floor = 0
    manifest = state.manifest
    if on_disk is not None and on_disk.persisted_file_len > start:
        seq_floor = max(seq_floor, _believed_floor(on_disk.next_seq))  # whatever the offsets
        # Its offsets count this log only if no cap rewrite came between (a rewrite always
        # moves the first turn's number): one from before the rewrite, whose manifest the
        # publisher had not written yet, knows an older status than the index.
        if on_disk.retained_turn_base == manifest.retained_turn_base:
            manifest.status = on_disk.status
            status_floor = on_disk.persisted_file_len
    scan(log, index, state, start, reset=False, status_floor=status_floor, seq_floor=seq_floor)


def _believed_floor(next_seq: int) -> int:
    """A next_seq that metadata claims, as a floor: ignored if it leaves no room to count on."""
    return next_seq if next_seq <= ev.SEQ_FLOOR_MAX else 0


def covers_prefix(log: LogFile, saved: SavedState) -> bool:
    """Whether the saved state describes a prefix of ``log`` as it is on disk: the log's bytes
    before ``persisted_file_len`` end a line and have the tail digest the index recorded (an
    index written before digests holds those bytes themselves, and is recognised too)."""
    covered = saved.manifest.persisted_file_len
    if covered > log.length:
        return False
    if covered == 0:
        return saved.tail == b""
    tail = log.read_tail(covered)
    if len(tail) != min(TAIL_BYTES, covered) or not tail.endswith(b"\n"):
        return False
    return saved.tail == tail_digest(tail) or saved.tail == tail


def scan_turn_base(
    log: LogFile,
    index: Optional[SessionIndex],
    session_dir: Path,
    marker: Optional[CapRewriteMarker],
    on_disk: Optional[Manifest],
    saved: Optional[SavedState],
) -> int:
    """The ordinal of the first turn ``log`` holds, for a rescan (reference 5.3 step 6, with
    memstore's log head first: a log memstore rewrote says its base itself), from the rewrite
    ``marker``, the log's head, or the stale metadata (``on_disk``, and ``saved`` as read from
    ``index``; VT Code's ``index/turns.json`` in ``session_dir`` when there is no index). One
    that leaves no room to count turns on (they are SQLite integers) is not believed: the log
    starts at 1."""
    base = _scan_turn_base(log, index, session_dir, marker, on_disk, saved)
    if base > ev.SEQ_FLOOR_MAX:
        logger.warning("%s: ignoring an implausible first turn number %d", log.path, base)
        return 1
    return base


def _scan_turn_base(
    log: LogFile,
    index: Optional[SessionIndex],
    session_dir: Path,
    marker: Optional[CapRewriteMarker],
    on_disk: Optional[Manifest],
    saved: Optional[SavedState],
) -> int:
    if marker is not None:
        return max(1, marker.retained_turn_base)
    head = log.head()
    if head.retained_turn_base is not None:
        return head.retained_turn_base
    # The index's manifest row matches its spans; manifest.json may lag (published later).
    stale = saved.manifest if saved is not None else on_disk
    stale_spans = index.turn_spans() if saved is not None and index is not None else legacy_spans(session_dir)
    if (
        stale is not None
        and stale.persisted_file_len > log.length
        and _prefix_removed(log, index, saved, stale.persisted_file_len - log.length) is not False
    ):
        removed = stale.persisted_file_len - log.length
        if spans_valid(stale_spans, stale.persisted_file_len):
            for number, start, _end, _count in stale_spans:
                if start >= removed:
                    return max(1, number)
        if log.length == 0:
            return stale.turn_count + 1
    # Metadata is believed only where it is plausible: a base past the turns it counts is not,
    # nor any base but 1 for a log memstore wrote (its cap rewrites tag the log's head, checked
    # above). A tampered manifest cannot renumber the turns: the log decides.
    first = log.first_record()
    written_by_memstore = first is not None and first[2].seq is not None
    for believed in (
        on_disk if on_disk is not None and on_disk.has("retained_turn_base") else None,
        saved.manifest if saved is not None else None,
    ):
        if believed is None:
            continue
        base = believed.retained_turn_base
        if base <= believed.turn_count + 1 and (base == 1 or not written_by_memstore):
            return base
        logger.warning("%s: ignoring an implausible retained_turn_base %d in the metadata", log.path, base)
    if stale_spans and spans_valid(stale_spans, log.length):
        return max(1, stale_spans[0][0])
    return 1


def _prefix_removed(
    log: LogFile, index: Optional[SessionIndex], saved: Optional[SavedState], removed: int
) -> Optional[bool]:
    """When the log is shorter than the stale metadata says, was a prefix removed (a cap
    rewrite that crashed before its index caught up) or a suffix lost (a power cut took bytes
    the metadata already described)? Answered by finding the log's first record in the stale
    index: by its seq, or for a VT Code line by its length and type at the two candidate
    offsets. ``None`` when that cannot tell."""
    if saved is None or index is None:
        return None
    first = log.first_record()
    if first is None:
        return None
    here, length, record = first
    offsets = index.offsets_of(record.seq, (here, here + removed), length, record.event["type"])
    if offsets == {here}:
        return False
    if offsets == {here + removed}:
        return True
    return None


def _rescan_state(
    log: LogFile, session_id: str, base: int, on_disk: Optional[Manifest], saved: Optional[SavedState]
) -> LogState:
    """The state a rescan of the whole log starts from: what the log cannot say, kept from the
    old metadata; the first turn numbered ``base``."""
    known = [m for m in (on_disk, saved.manifest if saved else None) if m is not None]
    # Times the old metadata holds stop at the present, as the records' times do (see
    # LogState.apply_record): one in the future would keep the session out of retention's reach.
    now = ev.utc_now()
    manifest = Manifest(
        # The id this session was opened by (it names this directory, and no other id does):
        # an old manifest's may name another session.
        session_id=session_id,
        # From the log alone these start empty: the scan takes them from the records' times.
        created_at=min(known[0].created_at, now) if known else "",
        updated_at=min(known[0].updated_at, now) if known else "",
        turn_count=base - 1,
        retained_turn_base=base,
        status=known[0].status if known else STATUS_ACTIVE,
        # Where the session came from, said by its thread.started (which a cap rewrite may have
        # evicted); a thread.started still in the log says it again.
        source=known[0].source if known else None,
        # Seqs are assigned from the log alone (see LogState.apply_record): from the head's
        # anchor, if a cap rewrite left one, else from 1.
        next_seq=log.head().next_seq or 1,
        generation=new_generation(),
    )
    return LogState(manifest)


def _rescan(
    log: LogFile,
    index: SessionIndex,
    state: LogState,
    on_disk: Optional[Manifest],
    saved: Optional[SavedState],
    *,
    derive_lazy: bool = False,
    redact_event: Optional[Callable[[dict], dict]] = None,
) -> None:
    """Index the whole log into ``index``, from ``state`` (see :func:`_rescan_state`)."""
    known = [m for m in (on_disk, saved.manifest if saved else None) if m is not None]
    log.tail = b""
    # A status the log no longer shows (set by retention, or by a thread.completed the cap
    # evicted) stands against the records the old metadata already covered; only newer
    # records may change it.
    status_floor = known[0].persisted_file_len if known else 0
    # Seqs handed out for bytes a torn-tail repair cut (kept beside the log), and any the old
    # metadata counted past the log (a log the cap emptied keeps none), are never reused.
    seq_floor = max([torn_seq_floor(*log.torn_files())] + [_believed_floor(m.next_seq) for m in known])
    scan(
        log,
        index,
        state,
        0,
        reset=True,
        status_floor=status_floor,
        seq_floor=seq_floor,
        derive_lazy=derive_lazy,
        redact_event=redact_event,
    )


def scan(
    log: LogFile,
    index: SessionIndex,
    state: LogState,
    start: int,
    *,
    reset: bool,
    status_floor: int = 0,
    seq_floor: int = 0,
    derive_lazy: bool = False,
    redact_event: Optional[Callable[[dict], dict]] = None,
) -> None:
    """Index ``log`` from byte ``start`` to the end of the file into ``index``, advancing
    ``state``, committing in batches (of ``TUNING.scan_batch_events``) so an interrupted scan
    resumes where it stopped. ``next_seq`` ends at least at ``seq_floor``. With ``derive_lazy``
    the lazy derived tables get each batch too (each event through ``redact_event``, if given)."""
    faults.check("recovery.scan", path=log.path, start=start)
    batch_events = TUNING.scan_batch_events
    rows: list[tuple] = []
    derive = bool(derived_tables(lazy=False)) or derive_lazy
    records: list[BatchRecord] = []
    offset = start
    skipped = first_skipped = 0
    # Locals: this loop runs once per event of a log that may hold millions.
    decode, apply, add = ev.decode_line, state.apply_record, rows.append
    for line, line_start, offset in log.lines(start, log.length):
        record = decode(line)
        if record is None:
            if not skipped:
                first_skipped = line_start
            skipped += 1
            continue
        seq, row = apply(record, line_start, offset, line_start < status_floor)
        add(row)
        if derive:
            event = record.event if redact_event is None else redact_event(record.event)
            records.append(BatchRecord(seq, row[3], record.ts, line_start, offset - line_start, event))
        if len(rows) >= batch_events:
            _commit_scan(log, index, state, rows, offset, reset, records, derive_lazy)
            rows, records, reset = [], [], False
            add = rows.append
    state.manifest.next_seq = max(state.manifest.next_seq, seq_floor)
    _commit_scan(log, index, state, rows, offset, reset, records, derive_lazy)
    if skipped:
        # Kept in the log (nothing is cut from its middle), left out of every view.
        logger.warning(
            "%s: skipped %d line%s that %s not a valid event (the first at byte %d)",
            log.path,
            skipped,
            "" if skipped == 1 else "s",
            "is" if skipped == 1 else "are",
            first_skipped,
        )


def _commit_scan(
    log: LogFile,
    index: SessionIndex,
    state: LogState,
    rows: list,
    offset: int,
    reset: bool,
    records: list,
    derive_lazy: bool,
) -> None:
    manifest = state.manifest
    if not manifest.created_at:  # no record with a time yet (VT Code lines have none)
        manifest.created_at = ev.utc_now()
    if not manifest.updated_at:
        manifest.updated_at = manifest.created_at
    manifest.persisted_file_len = offset
    log.tail = log.read_tail(offset)
    try:
        faults.check("recovery.batch", path=log.path, offset=offset)
        index.commit(
            rows, state.dirty.values(), manifest, log.tail, reset=reset, records=records, derive_lazy=derive_lazy
        )
    except StoreIOError as exc:
        first = rows[0][1] if rows else offset
        raise StoreIOError(
            exc.op, exc.path, f"{exc.detail} (while indexing bytes {first}-{offset} of {log.path})", exc.errno
        ) from exc
    state.dirty.clear()


# --------------------------------------------------------------------------------------------
# VT Code's turn index (index/turns.json), read only to keep turn ordinals on a rescan


def legacy_spans(session_dir: Path) -> list[tuple[int, int, int, int]]:
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


def spans_valid(spans: Sequence[tuple[int, int, int, int]], length: int) -> bool:
    previous_end = 0
    for _number, start, end, count in spans:
        if count <= 0 or start < previous_end or start > end or end > length:
            return False
        previous_end = end
    return True
