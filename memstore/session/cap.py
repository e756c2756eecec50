"""The event cap: planning which oldest whole turns to evict (pure), the eviction summary, and
the cap rewrite itself (intent marker, atomic replacement of the log, index and manifest).

The rewrite's order: the summary hook runs first (if it fails, nothing is touched); then the
intent marker is written durably; the log is replaced atomically; the index and the manifest
follow; the marker is removed last. An open that finds the marker knows which rewrite to finish.

:class:`CapPolicy` is the cap of one open session: it owns the back-off after failed hooks, and
its rewrite works on what it is handed (the log file, the index, the lifecycle state, the
publisher) plus the few things it asks of the writer (:class:`CapWriter`).
"""

from __future__ import annotations

import logging
import os
import uuid
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Protocol

import orjson

from .. import events as ev
from .. import faults
from ..errors import CapEvictionError, MemstoreError, StoreIOError
from ..fsio import atomic_write, ensure_private_dir, fsync_dir, open_private_append, write_all
from ..layout import DERIVED_DIR, EVICTION_LOG, EVICTION_SUMMARY_PREFIX
from .index import SessionIndex
from .lifecycle import LogState
from .logfile import LogFile
from .manifest import CapRewriteMarker, clear_marker, new_generation, write_marker
from .publisher import Batch, Publisher

logger = logging.getLogger("memstore")

EVICTION_SUMMARY_FACTS = 5
EVICTION_FACT_CHARS = 180
EVICTION_SUMMARY_FILES = 10

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
    """The default cap-eviction hook: record what was evicted in
    ``derived/eviction-summary-<32 hex>.json``, and append the same summary to
    ``derived/eviction-summaries.jsonl``.

    The summary counts the evicted events by type and keeps up to five grounded facts (the
    agent's messages, whitespace-normalized, at most 180 characters each, newest last) as plain
    strings, as VT Code does. ``events`` is consumed once, as a stream: memory stays bounded
    however long the evicted prefix. Only the newest ten summary files are kept; the JSON Lines
    file keeps every summary, one line each.
    """
    facts: OrderedDict[str, str] = OrderedDict()  # lowercased fact -> fact, newest last
    types: Counter = Counter()
    count = 0
    for event in events:
        count += 1
        types[event.get("type")] += 1
        text = ev.agent_message_text(event)
        if not text:
            continue
        fact = ev.truncate_for_fact(ev.normalize_whitespace(text), EVICTION_FACT_CHARS)
        if not fact:
            continue
        key = fact.lower()
        facts.pop(key, None)
        facts[key] = fact
        if len(facts) > EVICTION_SUMMARY_FACTS:
            facts.popitem(last=False)
    summary = {
        "session_id": session_id,
        "evicted_event_count": count,
        "event_types": dict(sorted(types.items(), key=lambda item: str(item[0]))),
        "created_at": ev.utc_now(),
        "grounded_facts": list(facts.values()),
    }
    derived = ensure_private_dir(Path(session_dir) / DERIVED_DIR)
    path = derived / f"{EVICTION_SUMMARY_PREFIX}{uuid.uuid4().hex}.json"
    atomic_write(path, orjson.dumps(summary, option=orjson.OPT_INDENT_2))
    _append_line(derived / EVICTION_LOG, orjson.dumps(summary, option=orjson.OPT_APPEND_NEWLINE))
    _prune_summary_files(derived, keep=path)
    return path


def _append_line(path: Path, line: bytes) -> None:
    fd, _ = open_private_append(path)
    try:
        write_all(fd, line, path)
        os.fsync(fd)
    except OSError as exc:
        raise StoreIOError.from_os_error("fsync", path, exc) from exc
    finally:
        os.close(fd)


def _prune_summary_files(derived: Path, keep: Path) -> None:
    """Keep the newest ``EVICTION_SUMMARY_FILES`` summary files (every summary is also a line of
    ``eviction-summaries.jsonl``), so a long-capped session does not grow ``derived/`` without
    bound."""
    try:
        entries = [
            e
            for e in os.scandir(derived)
            if e.name.startswith(EVICTION_SUMMARY_PREFIX)
            and e.name.endswith(".json")
            and e.is_file(follow_symlinks=False)
        ]
    except OSError as exc:
        logger.warning("could not list %s to prune old eviction summaries: %s", derived, exc)
        return
    entries.sort(key=lambda e: (e.stat(follow_symlinks=False).st_mtime_ns, e.name))
    for entry in entries[:-EVICTION_SUMMARY_FILES]:
        if entry.path == str(keep):
            continue
        try:
            os.unlink(entry.path)
        except OSError as exc:
            logger.warning("could not remove old eviction summary %s: %s", entry.path, exc)


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

    def settle(self) -> None:
        """Write and sync the buffer, and hand every row describing what was written to the
        publisher; a failure fails the session closed and is raised."""

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

    def enforce(self, state: LogState, index: SessionIndex, max_events: int, on_evict: Optional[EvictionHook]) -> None:
        """Evict the oldest whole turns once the session, in ``state`` and indexed in ``index``,
        holds more than ``max_events`` records. Called with the session's lock held, after an
        append."""
        manifest = state.manifest
        if manifest.event_count < self.retry_at:
            return  # the eviction hook failed at the last crossing: wait for the next one
        if not self._views_caught_up():  # the turns handed to the publisher are in the index now
            return
        open_turn = state.open_turn.number if state.open_turn is not None else None
        plan = plan_cap_eviction(_turn_spans(index, state), manifest.event_count, max_events, open_turn)
        if plan is None:
            return
        self.writer.settle()
        if not self._views_caught_up():
            return
        log = self.log
        cut = plan.truncate_offset
        if cut > log.length:
            raise StoreIOError("cap rewrite", log.path, f"planned offset {cut} is past the end ({log.length})")
        evicted_count = index.count_events_before(cut)
        base = plan.first_kept_turn if plan.first_kept_turn is not None else manifest.turn_count + 1
        head, skip, grown = self._retained_head(index, state, cut, base)
        hook = on_evict if on_evict is not None else write_eviction_summary
        # The hook runs under the session's lock, between two states of the log: what it would do
        # to the session from here (an append re-entering the cap) is refused until it returns.
        running = HookRunning(f"{log.path} is inside its cap rewrite: the eviction hook cannot use the session")
        with self.writer.refusing(running):
            try:
                hook(self.session_dir, manifest.session_id, _events(log.records(0, cut)))
            except Exception as exc:
                retry_at = self._hook_failed(manifest.event_count, max_events)
                logger.warning(
                    "eviction summary hook failed for %s; nothing evicted, retried at %d events: %s",
                    log.path,
                    retry_at,
                    exc,
                )
                raise CapEvictionError(
                    f"eviction summary hook failed for {log.path}; the log was left intact: {exc}"
                ) from exc
        delta = len(head) - skip
        new_len = log.length - cut + delta
        faults.check("cap.marker", path=self.session_dir)
        write_marker(self.session_dir, CapRewriteMarker(log.length, new_len, base))
        try:
            log.replace_from(cut + skip, head)
        except BaseException:
            clear_marker(self.session_dir)  # the log was not replaced: nothing to recover
            raise
        try:
            # The log is replaced from here on. Should anything fail now, the descriptors or the
            # index may still describe the old log: the session fails closed and a reopen, guided
            # by the marker, brings them together again.
            faults.check("cap.replaced", path=self.session_dir)
            fsync_dir(self.session_dir)
            log.close()
            log.open()
            manifest.event_count -= evicted_count
            manifest.retained_turn_base = base
            manifest.generation = new_generation()
            manifest.persisted_file_len = new_len
            # Offsets move back by ``cut``; those past the head's first line move by ``delta``.
            pivot = cut + 1 if grown else cut
            turn = state.open_turn
            if turn is not None:
                turn.start_offset += -cut + (delta if turn.start_offset >= pivot else 0)
                turn.end_offset += -cut + (delta if turn.end_offset >= pivot else 0)
            log.tail = log.read_tail(new_len)
            index.evict(cut, base, manifest, log.tail, pivot=pivot, delta=delta, grown=grown)
        except BaseException as exc:
            self.writer.fail(exc)
            raise
        self._rewrote()
        # The marker goes last, once manifest.json describes the rewritten log. Should the manifest
        # fail, the next flush reports it (a view, not the append), and the marker stays: the next
        # open rescans if the log is still the rewritten one, and drops it otherwise.
        self.publisher.submit(Batch(manifest_json=manifest.to_json()))
        if self._views_caught_up():
            clear_marker(self.session_dir)

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
