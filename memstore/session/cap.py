"""The event cap: planning which oldest whole turns to evict (pure), and the cap rewrite itself:
the eviction summary, the intent marker, the atomic replacement of the log, then its views.

The rewrite's order, each step after the previous one is durable:

1. the summary: a custom ``on_evict`` hook runs first, on the evicted events, before anything
   is touched (if it fails, nothing is); the default summary is made from the index (counts by
   type) and the evicted prefix's raw lines read backwards from the cut, only until the newest
   five distinct agent messages are found (only lines that may hold one are decoded);
2. the kept part of the log is copied to a temp file; the default summary's line (in
   ``eviction-summaries.jsonl``, which keeps every summary), the intent marker and
   manifest.json's next version are written; all are synced together (their writeback started
   at once, so the syncs overlap rather than queue);
3. the copy replaces the log and the directory is synced; manifest.json's next version is
   renamed in and the directory synced again: from here manifest.json describes the rewritten
   log, durably, before anything is appended to it (and never describes a log not on disk);
4. off the agent's thread, the publisher applies the eviction to the index (with the rows not
   yet in it, moved to the rewritten log's offsets) in a transaction that syncs the WAL, and
   only then removes the marker (the reference: it stays until the index and the manifest are
   durable); after that it syncs the name of the summary's ``eviction-summary-<32 hex>.json``
   (the file where VT Code writes it; the line already keeps the summary), prunes the old files
   and closes the replaced log.

A writer killed at any step leaves a directory that memstore's open finishes from the log alone
(its first line says which turns it lost) and that VT Code numbers right: from the marker while
the log is the rewritten one, from manifest.json once the log grew.

:class:`CapPolicy` is the cap of one open session: it owns the back-off after failed hooks, and
its rewrite works on what it is handed (the log file, the index, the lifecycle state, the
publisher) plus the few things it asks of the writer (:class:`CapWriter`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Optional, Protocol

from .. import events as ev
from .. import faults
from ..errors import CapEvictionError, MemstoreError, StoreIOError
from ..fsio import fsync_dir
from ..layout import INDEX_DIR
from ..store_redaction import StoreRedaction
from .index import EvictSpec, SessionIndex
from .lifecycle import LogState
from .logfile import LogFile, Replacement, close_fds
from .manifest import CapRewriteMarker, StagedFile, clear_marker, new_generation, stage_file, stage_marker
from .publisher import Publisher
from .summaries import (
    EVICTION_FACT_CHARS,
    EVICTION_SUMMARY_FACTS,
    EVICTION_SUMMARY_FILES,
    MESSAGE_CANDIDATE,
    EvictionSummary,
    PendingSummary,
    commit_summary,
    settle_summary_file,
    stage_summary,
    sync_fds,
    undo_summary,
    write_summary,
)

logger = logging.getLogger("memstore")

__all__ = [
    "EVICTION_FACT_CHARS",
    "EVICTION_SUMMARY_FACTS",
    "EVICTION_SUMMARY_FILES",
    "CapPlan",
    "CapPolicy",
    "CapWriter",
    "EvictionHook",
    "HookRunning",
    "cap_low_water",
    "log_head",
    "plan_cap_eviction",
    "write_eviction_summary",
]

EvictionHook = Callable[[Path, str, Iterable[dict]], object]


class HookRunning(MemstoreError):
    """The session was used from inside its own eviction hook."""


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


def write_eviction_summary(session_dir: Path, session_id: str, events: Iterable[dict]) -> Path:
    """The default cap-eviction hook, as a function: record what ``events`` (the evicted ones)
    were in ``derived/eviction-summaries.jsonl`` and ``derived/eviction-summary-<32 hex>.json``
    (see ``summaries.py``), durably, and prune the older files. Returns the file written.

    ``events`` is consumed once, as a stream: memory stays bounded however long the evicted
    prefix. (The cap does the same without re-reading the prefix as events when no custom hook
    is given, or when this function is given as the hook.)
    """
    summary = EvictionSummary(session_id)
    for event in events:
        summary.add_event(event)
    return write_summary(Path(session_dir), summary.to_dict())


# --------------------------------------------------------------------------------------------
# The rewrite


def log_head(head_id: Optional[str], retained_turn_base: int) -> dict:
    """The head keys of a log's first line (see ``events.decode_log_head``): the session id when
    the directory name cannot say it (``head_id``: a hashed id), and the first retained turn's
    number once a cap rewrite evicted turns."""
    head: dict = {}
    if head_id is not None:
        head["session_id"] = head_id
    if retained_turn_base > 1:
        head["retained_turn_base"] = retained_turn_base
    return head


class CapWriter(Protocol):
    """What a cap rewrite asks of the writer whose lock it runs under."""

    #: The store's redaction, which the eviction summary passes through (``None``: none).
    redaction: Optional[StoreRedaction]

    def write_out(self, *, sync: bool) -> None:
        """Write the buffer (and sync it, with ``sync``); a failure fails the session closed and
        is raised."""

    def settle(self, *, sync: bool = True) -> None:
        """Write the buffer (and sync it, with ``sync``), and hand every row describing what was
        written to the publisher; a failure fails the session closed and is raised."""

    def rows_pending_from(self, offset: int) -> bool:
        """Whether a row not yet handed to the publisher describes a record at or before
        ``offset`` (rows are handed over in log order)."""

    def publish_rewrite(
        self,
        shift: Callable[[int], int],
        evict: EvictSpec,
        marker: CapRewriteMarker,
        after: list[Callable[[], None]],
    ) -> None:
        """Hand the publisher the rewrite (``evict``, then the marker's removal once the index is
        durable, then ``after``) with every row and turn not handed over yet, their offsets moved
        by ``shift`` to the rewritten log's; the open turn's offsets move too."""

    def fail(self, exc: BaseException) -> None:
        """Fail the session closed with ``exc``: the log and its views may disagree until a
        reopen brings them together."""

    def refusing(self, reason: BaseException) -> AbstractContextManager[None]:
        """Refuse every use of the session with ``reason`` while the block runs (what the
        eviction hook would do to the session from inside the rewrite)."""


class CapPolicy:
    """The cap of one open session, whose log is ``log`` (in ``session_dir``, named in its head
    by ``head_id``) and whose views are published by ``publisher``.

    After an eviction hook failed, the cap is tried again only once ``retry_at`` events are
    logged: after the cap's headroom has filled again, a gap that doubles with every failure in
    a row (``failures``). A rewrite that succeeds ends the back-off.
    """

    def __init__(
        self, log: LogFile, publisher: Publisher, session_dir: Path, head_id: Optional[str], writer: CapWriter
    ):
        self.log = log
        self.publisher = publisher
        self.session_dir = session_dir
        self.head_id = head_id
        self.writer = writer
        self.retry_at = 0
        self.failures = 0

    def _hook_failed(self, event_count: int, max_events: int) -> int:
        """Count a failed hook; return the event count from which the cap is tried again."""
        self.failures += 1
        gap = max(1, max_events - cap_low_water(max_events)) << min(self.failures - 1, 20)
        self.retry_at = event_count + gap
        return self.retry_at

    def _rewrote(self) -> None:
        self.failures = 0
        self.retry_at = 0  # the back-off is over: the next crossing of the cap evicts

    def enforce(
        self,
        state: LogState,
        index: SessionIndex,
        max_events: int,
        on_evict: Optional[EvictionHook],
        *,
        sync: bool = True,
    ) -> None:
        """Evict the oldest whole turns once the session, in ``state`` and indexed in ``index``,
        holds more than ``max_events`` records. Called with the session's lock held, after an
        append; ``sync`` is false in bulk mode (its buffer need not be synced before the
        rewrite: the rewritten log is)."""
        manifest = state.manifest
        if manifest.event_count < self.retry_at:
            return  # the eviction hook failed at the last crossing: wait for the next one
        if not self._views_caught_up():  # the turns handed to the publisher are in the index now
            return
        open_turn = state.open_turn.number if state.open_turn is not None else None
        plan = plan_cap_eviction(_turn_spans(index, state), manifest.event_count, max_events, open_turn)
        if plan is None:
            return
        if self.writer.rows_pending_from(plan.truncate_offset):
            # Rows of records the rewrite evicts (or of its first kept one) are not in the index
            # yet: it reads them there, so they are committed first.
            self.writer.settle(sync=sync)
            if not self._views_caught_up():
                return
        else:
            # The rows not handed over yet describe only kept records: they go to the index with
            # the rewrite, in its transaction, moved to the rewritten log's offsets.
            self.writer.write_out(sync=sync)
        log = self.log
        cut = plan.truncate_offset
        if cut > log.length:
            raise StoreIOError("cap rewrite", log.path, f"planned offset {cut} is past the end ({log.length})")
        evicted_types = index.types_before(cut)
        evicted_count = sum(evicted_types.values())
        base = plan.first_kept_turn if plan.first_kept_turn is not None else manifest.turn_count + 1
        head, skip, grown = self._retained_head(index, state, cut, base)
        summary: Optional[EvictionSummary] = None
        if on_evict is None or on_evict is write_eviction_summary:
            # The default summary: counts from the index, facts from the prefix's raw lines.
            summary = EvictionSummary(manifest.session_id, evicted_count)
            summary.types.update(evicted_types)
            summary.take_latest_facts_of_lines(log.lines_matching_backward(0, cut, MESSAGE_CANDIDATE))
        else:
            self._run_hook(on_evict, manifest.session_id, cut, manifest.event_count, max_events)
        delta = len(head) - skip
        new_len = log.length - cut + delta
        marker = CapRewriteMarker(log.length, new_len, base)
        # manifest.json as it is once the log is replaced: written and synced with the log's copy,
        # renamed in just after it, made durable by the same directory sync.
        after = replace(
            manifest,
            event_count=manifest.event_count - evicted_count,
            retained_turn_base=base,
            generation=new_generation(),
            persisted_file_len=new_len,
        )
        manifest_json = after.to_json()
        staged_manifest, summary_path = self._replace_log(
            cut + skip,
            head,
            marker,
            self._summary_record(summary),
            manifest_json,
            max_events,
            manifest.event_count,
        )
        try:
            # The log is replaced from here on. Should anything fail now, the descriptors may
            # still describe the old log: the session fails closed and a reopen, guided by the
            # log's head (and, for VT Code, the marker), brings them together again.
            faults.check("cap.replaced", path=self.session_dir)
            fsync_dir(self.session_dir)
            # Only now manifest.json: on disk it never describes a log that is not there.
            try:
                self.publisher.install_manifest(staged_manifest, manifest_json)
            except BaseException:
                staged_manifest.discard()
                raise
            fsync_dir(self.session_dir)
            replaced_fds = log.detach()
            try:
                log.open()
            except BaseException:
                close_fds(replaced_fds, log.path)
                raise
            manifest.event_count = after.event_count
            manifest.retained_turn_base = after.retained_turn_base
            manifest.generation = after.generation
            manifest.persisted_file_len = after.persisted_file_len
            log.tail = log.read_tail(new_len)
        except BaseException as exc:
            self.writer.fail(exc)
            raise
        self._rewrote()
        # Offsets move back by ``cut``; those past the head's first line move by ``delta``.
        pivot = cut + 1 if grown else cut

        def shift(offset: int) -> int:
            return offset - cut + (delta if offset >= pivot else 0)

        # Off this thread: the index, with a synced WAL, then the marker's removal (the marker
        # stays until the index is durable; manifest.json already is); then what the agent need
        # not wait for: the summary's file (its line is durable) and closing the replaced log.
        follow_up: list[Callable[[], None]] = [partial(close_fds, replaced_fds, log.path)]
        if summary_path is not None:
            follow_up.insert(0, partial(settle_summary_file, summary_path))
        self.writer.publish_rewrite(
            shift, EvictSpec(cut, base, pivot, delta, grown, manifest.next_seq), marker, follow_up
        )

    def _run_hook(self, hook: EvictionHook, session_id: str, cut: int, event_count: int, max_events: int) -> None:
        log = self.log
        # The hook runs under the session's lock, between two states of the log: what it would do
        # to the session from here (an append re-entering the cap) is refused until it returns.
        running = HookRunning(f"{log.path} is inside its cap rewrite: the eviction hook cannot use the session")
        with self.writer.refusing(running):
            try:
                hook(self.session_dir, session_id, _events(log.records(0, cut)))
            except Exception as exc:
                self._summary_failed(exc, event_count, max_events)

    def _summary_record(self, summary: Optional[EvictionSummary]) -> Optional[dict]:
        """The summary as it is written: a derived view, so its grounded facts pass through the
        store's redaction like the index's chunks (a secret an evicted message quoted is not
        kept in ``derived/`` after its line left the log)."""
        if summary is None:
            return None
        record = summary.to_dict()
        redaction = self.writer.redaction
        return redaction.redact_event(record) if redaction is not None else record

    def _summary_failed(self, exc: Exception, event_count: int, max_events: int) -> None:
        retry_at = self._hook_failed(event_count, max_events)
        logger.warning(
            "eviction summary failed for %s; nothing evicted, retried at %d events: %s", self.log.path, retry_at, exc
        )
        raise CapEvictionError(f"eviction summary failed for {self.log.path}; the log was left intact: {exc}") from exc

    def _replace_log(
        self,
        start: int,
        head: bytes,
        marker: CapRewriteMarker,
        summary: Optional[dict],
        manifest_json: bytes,
        max_events: int,
        event_count: int,
    ) -> tuple[StagedFile, Optional[Path]]:
        """Steps 2 and 3 of the rewrite (see the module docstring) up to the rename of the log;
        returns manifest.json's synced temp file, for the caller to rename in, and the summary's
        file (synced, renamed in; its directory is synced later). On any failure
        before the log's rename everything written is taken back and the log is as it was."""
        log = self.log
        replacement: Optional[Replacement] = None
        pending: Optional[PendingSummary] = None
        staged: Optional[StagedFile] = None
        marked = False
        try:
            replacement = log.write_replacement(start, head)
            staged = stage_file(self.publisher.manifest_path, manifest_json)
            if summary is not None:
                try:
                    pending = stage_summary(self.session_dir, summary)
                except StoreIOError as exc:
                    self._summary_failed(exc, event_count, max_events)
            faults.check("cap.marker", path=self.session_dir)
            marker_file = stage_marker(self.session_dir, marker)
            marked = True
            files = [(replacement.fd, replacement.tmp), (marker_file.fd, marker_file.path), (staged.fd, staged.path)]
            try:
                files.extend(pending.unsynced_fds() if pending is not None else ())
                sync_fds(files)
            finally:
                marker_file.close()
                staged.close()
                if pending is not None:
                    pending.close()
            fsync_dir(self.session_dir / INDEX_DIR)  # the marker's name (committed by the syncs)
            faults.check("cap.synced", path=self.session_dir)
            if pending is not None:
                commit_summary(pending)
            log.install_replacement(replacement)
        except BaseException:
            if replacement is not None:
                log.discard_replacement(replacement)
            if staged is not None:
                staged.discard()
            if pending is not None:
                undo_summary(pending)
            if marked:
                clear_marker(self.session_dir)  # the log was not replaced: nothing to recover
            raise
        return staged, pending.path if pending is not None else None

    def _views_caught_up(self) -> bool:
        """Wait for the publisher; whether the index and manifest.json now describe everything
        written (a rescan after a rewrite killed midway keeps what manifest.json says against the
        records it covered, so it must be as new as the rewrite). A failure there is not the
        append's (the event is in the log or the buffer; the next flush reports it): the cap waits
        until the views work again."""
        publisher = self.publisher
        if publisher.failing:
            return False  # tried again at the next turn boundary, in the publisher's thread
        try:
            publisher.drain()
        except Exception as exc:  # noqa: BLE001 - kept by the publisher, raised by the next flush
            logger.warning("the cap of %s waits for its views, which failed: %s", self.log.path, exc)
            return False
        return True

    def _retained_head(self, index: SessionIndex, state: LogState, cut: int, base: int) -> tuple[bytes, int, bool]:
        """How the rewritten log starts, so that it says which turns it lost: ``(head, skip,
        grown)``. Normally its first line, tagged with ``retained_turn_base`` (``skip`` its old
        length, ``grown`` true); an anchor line if that line cannot be tagged (``skip`` 0).
        Nothing when nothing is left: VT Code's tests count the lines of such a log, and the next
        append tags its own line instead."""
        log = self.log
        if cut >= log.length:
            return b"", 0, False
        # The seq the index gave the first retained record: the rewritten log must say it, so that
        # a rebuild from the log alone gives the same seqs (its predecessors are gone).
        first_seq = index.first_seq_from(cut)
        end = log.find_newline(cut)
        if end >= 0 and first_seq is not None:
            line = log.pread(cut, end + 1 - cut)
            if ev.decode_line(line) is not None:
                head = log_head(self.head_id, base)
                head["retained_turn_base"] = base
                head["seq"] = first_seq
                tagged = ev.tag_head(line[:-1], head)
                if tagged is not None:
                    return tagged + b"\n", len(line), True
        next_seq = first_seq if first_seq is not None else state.manifest.next_seq
        return ev.encode_anchor(base, next_seq, self.head_id), 0, False


def _events(records: Iterator[ev.Record]) -> Iterator[dict]:
    for record in records:
        yield record.event


def _turn_spans(index: SessionIndex, state: LogState) -> Iterator[tuple[int, int, int, int]]:
    """Turn spans oldest first, from the index overlaid with turns not yet committed to it."""
    dirty = state.dirty
    seen = set()
    for number, start, end, count in index.turn_spans():
        seen.add(number)
        turn = dirty.get(number)
        yield (number, turn.start_offset, turn.end_offset, turn.event_count) if turn else (number, start, end, count)
    for number in sorted(set(dirty) - seen):
        turn = dirty[number]
        yield (number, turn.start_offset, turn.end_offset, turn.event_count)
