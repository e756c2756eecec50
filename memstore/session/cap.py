"""The event cap: planning which oldest whole turns to evict (pure), the eviction summary, and
the cap rewrite itself (intent marker, atomic replacement of the log, index and manifest).

The rewrite's order: the summary hook runs first (if it fails, nothing is touched); then the
intent marker is written durably; the log is replaced atomically; the index and the manifest
follow; the marker is removed last. An open that finds the marker knows which rewrite to finish.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections import Counter, OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable, Iterator, Optional

import orjson

from .. import faults
from ..layout import DERIVED_DIR, EVICTION_LOG, EVICTION_SUMMARY_PREFIX
from .. import events as ev
from ..errors import CapEvictionError, MemstoreError, StoreIOError
from ..fsio import atomic_write, ensure_private_dir, fsync_dir, open_private_append, write_all
from .manifest import CapRewriteMarker, clear_marker, new_generation, write_marker

if TYPE_CHECKING:
    from .log import _Session

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
    facts: "OrderedDict[str, str]" = OrderedDict()  # lowercased fact -> fact, newest last
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
        entries = [e for e in os.scandir(derived)
                   if e.name.startswith(EVICTION_SUMMARY_PREFIX) and e.name.endswith(".json") and e.is_file(follow_symlinks=False)]
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


def enforce_cap(session: "_Session", max_events: int, on_evict: Optional[EvictionHook]) -> None:
    """Evict the oldest whole turns of ``session`` once it holds more than ``max_events``
    records. Called with the session's lock held, after an append."""
    state = session.state
    manifest = state.manifest
    if manifest.event_count < session.cap_retry_at:
        return  # the eviction hook failed at the last crossing: wait for the next one
    if not _views_caught_up(session):  # the turns handed to the publisher are in the index now
        return
    open_turn = state.open_turn.number if state.open_turn is not None else None
    plan = plan_cap_eviction(_turn_spans(session), manifest.event_count, max_events, open_turn)
    if plan is None:
        return
    session.write_out(sync=True)
    if session.pending or state.dirty or session.unpublished:
        session.publish()
    if not _views_caught_up(session):
        return
    log = session.log
    cut = plan.truncate_offset
    if cut > log.length:
        raise StoreIOError("cap rewrite", log.path, f"planned offset {cut} is past the end ({log.length})")
    evicted_count = session.index.count_events_before(cut)
    base = plan.first_kept_turn if plan.first_kept_turn is not None else manifest.turn_count + 1
    head, skip, grown = _retained_head(session, cut, base)
    hook = on_evict if on_evict is not None else write_eviction_summary
    # The hook runs under the session's lock, between two states of the log: what it would do
    # to the session from here (an append re-entering the cap) is refused until it returns.
    running = HookRunning(f"{log.path} is inside its cap rewrite: the eviction hook cannot use the session")
    session.failed = running
    try:
        hook(session.dir, manifest.session_id, _events(log.records(0, cut)))
    except Exception as exc:
        # Not again on every append: after the cap's headroom has filled again, a gap that
        # doubles with every failure in a row.
        session.cap_failures += 1
        gap = max(1, max_events - cap_low_water(max_events)) << min(session.cap_failures - 1, 20)
        session.cap_retry_at = manifest.event_count + gap
        logger.warning("eviction summary hook failed for %s; nothing evicted, retried at %d events: %s",
                       log.path, session.cap_retry_at, exc)
        raise CapEvictionError(
            f"eviction summary hook failed for {log.path}; the log was left intact: {exc}"
        ) from exc
    finally:
        if session.failed is running:
            session.failed = None
    delta = len(head) - skip
    new_len = log.length - cut + delta
    faults.check("cap.marker", path=session.dir)
    write_marker(session.dir, CapRewriteMarker(log.length, new_len, base))
    try:
        log.replace_from(cut + skip, head)
    except BaseException:
        clear_marker(session.dir)  # the log was not replaced: nothing to recover
        raise
    try:
        # The log is replaced from here on. Should anything fail now, the descriptors or the
        # index may still describe the old log: the session fails closed and a reopen, guided
        # by the marker, brings them together again.
        faults.check("cap.replaced", path=session.dir)
        fsync_dir(session.dir)
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
        session.index.evict(cut, base, manifest, log.tail, pivot=pivot, delta=delta, grown=grown)
    except BaseException as exc:
        session.failed = exc
        raise
    session.cap_failures = 0
    session.cap_retry_at = 0  # the back-off is over: the next crossing of the cap evicts
    # The marker goes last, once manifest.json describes the rewritten log. Should the manifest
    # fail, the next flush reports it (a view, not the append), and the marker stays: the next
    # open rescans if the log is still the rewritten one, and drops it otherwise.
    session.publish_manifest()
    if _views_caught_up(session):
        clear_marker(session.dir)


def _views_caught_up(session: "_Session") -> bool:
    """Wait for the publisher; whether the index and manifest.json now describe everything
    written (a rescan after a rewrite killed midway keeps what manifest.json says against the
    records it covered, so it must be as new as the rewrite). A failure there is not the
    append's (the event is in the log or the buffer; the next flush reports it): the cap waits
    until the views work again."""
    if session.publisher.failing:
        return False  # tried again at the next turn boundary, in the publisher's thread
    try:
        session.publisher.drain()
    except Exception as exc:  # noqa: BLE001 - kept by the publisher, raised by the next flush
        logger.warning("the cap of %s waits for its views, which failed: %s", session.log.path, exc)
        return False
    return True


def _events(records: Iterator[ev.Record]) -> Iterator[dict]:
    for record in records:
        yield record.event


def _turn_spans(session: "_Session") -> Iterator[tuple[int, int, int, int]]:
    """Turn spans oldest first, from the index overlaid with turns not yet committed to it."""
    dirty = session.state.dirty
    seen = set()
    for number, start, end, count in session.index.turn_spans():
        seen.add(number)
        turn = dirty.get(number)
        yield (number, turn.start_offset, turn.end_offset, turn.event_count) if turn else (number, start, end, count)
    for number in sorted(set(dirty) - seen):
        turn = dirty[number]
        yield (number, turn.start_offset, turn.end_offset, turn.event_count)


def _retained_head(session: "_Session", cut: int, base: int) -> tuple[bytes, int, bool]:
    """How the rewritten log starts, so that it says which turns it lost: ``(head, skip,
    grown)``. Normally its first line, tagged with ``retained_turn_base`` (``skip`` its old
    length, ``grown`` true); an anchor line if that line cannot be tagged (``skip`` 0).
    Nothing when nothing is left: VT Code's tests count the lines of such a log, and the next
    append tags its own line instead."""
    log = session.log
    if cut >= log.length:
        return b"", 0, False
    # The seq the index gave the first retained record: the rewritten log must say it, so that
    # a rebuild from the log alone gives the same seqs (its predecessors are gone).
    first_seq = session.index.first_seq_from(cut)
    end = log.find_newline(cut)
    if end >= 0 and first_seq is not None:
        line = log.pread(cut, end + 1 - cut)
        if ev.decode_line(line) is not None:
            head = session.log_head(base)
            head["retained_turn_base"] = base
            head["seq"] = first_seq
            tagged = ev.tag_head(line[:-1], head)
            if tagged is not None:
                return tagged + b"\n", len(line), True
    next_seq = first_seq if first_seq is not None else session.state.manifest.next_seq
    return ev.encode_anchor(base, next_seq, session.head_id), 0, False
