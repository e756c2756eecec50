"""Importing one source into its session: incremental, idempotent, and never at the cost of an
event the session already holds.

The parsers have the prefix property: the events made from the first N complete lines of a
source are a prefix of those made from the first M >= N lines. So an import appends the events
beyond those the session already holds. The per-session file ``derived/import-state.json`` is
a cache of where the import stands (losing it costs a re-parse, never an event):

- the source (path, size, mtime), the consumed byte offset (the end of the last complete line),
  a fingerprint of the consumed bytes (sha256 of their first 64 KiB and of the 4 KiB before the
  offset), taken from the very reads the parser was fed; the parser's whole state there;
- the **ledger**: the log's ``next_seq`` once the import wrote (records from that seq on were
  appended by someone else: an agent's note, say) and the seq ranges of such records found so
  far (``foreign``). They are kept where they are, never compared with the source, and the
  import goes on appending after them.

What an import does with a source (``Plan``):

- unchanged (same size, mtime and fingerprint, nothing appended to the session since, nothing
  to finalize): skipped without parsing and without opening the session;
- grown (or unchanged but the session was extended by someone else): resumed at the offset with
  the saved state; records appended since are first compared with what the import produces
  (an import that crashed before saving its cache wrote them) and the rest kept as foreign;
- grown after it had settled and been finalized (a resumed Codex session): resumed the same way,
  the session reopened after its ``thread.completed``;
- no usable cache: parsed from byte 0 and compared with the log; the records the ledger (or, with
  no ledger, the log's tail beyond what the source produces) shows others appended are kept;
- rewritten or truncated (fingerprint mismatch, smaller than the offset, changed while it was
  read, or its events no longer match the log): the session is **set aside** (renamed, never
  deleted; see :mod:`.setaside`) and the source imported afresh beside it.

No path here removes a session directory or rewrites a log: an import only appends, or renames
a whole session aside. A pinned session is never set aside (reported); a tombstoned session
(see :mod:`memstore.tombstones`) is never written or recreated (reported).
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Optional

import orjson

from ..changes import mark_changed
from ..errors import InvalidEvent, SessionBusyError, StoreIOError
from ..events import LIFECYCLE_KINDS, Record
from ..fsio import atomic_write, read_no_follow
from ..layout import DERIVED_DIR, EVENTS_FILE, IMPORT_STATE_FILE, session_dir_name, session_directory
from ..locks import remove_session_directory
from ..session.bulk import NewSession
from ..session.log import SessionLog, open_session
from ..session.manifest import load_manifest
from ..tombstones import Tombstone, Tombstones
from .base import Parser
from .claude import ClaudeParser
from .codex import CodexExecParser, CodexRolloutParser
from .drift import SourceStats, source_stats
from .setaside import CannotSetAside, SessionPinned, directory_identity, set_aside_session
from .sources import (
    CHUNK,
    ConsumedBytes,
    SourceFile,
    has_line_after,
    open_source,
    path_of_display,
    read_at,
    sample,
    sniff,
    still_holds,
)
from .staging import StagingArea

logger = logging.getLogger(__name__)

STATE_VERSION = 2  # 2: the ledger (next_seq, foreign), changed_while_read
# Bump when the same lines would produce different events: sessions imported by an older
# mapping are then compared with the new mapping's events and, where they differ, set aside
# and imported afresh (never extended inconsistently).
MAPPING_VERSION = 4  # 2: prompts after an aborted task, results before calls, exec turn verdicts;
# 3: a Claude Code turn interrupted before a compaction ends before it; 4: records not understood are
# kept (import.unrecognized), Codex item_completed records
# A line may be dated up to this far past the import's clock (another machine's clock, a time
# zone bug); a later time is taken as wrong (see Parser.ts_limit).
FUTURE_SLACK_SECONDS = 86_400
PARSERS: dict[str, type[Parser]] = {"codex": CodexRolloutParser, "codex-exec": CodexExecParser, "claude": ClaudeParser}

REASON_REWRITTEN = "its source was rewritten or truncated"
REASON_CHANGED_WHILE_READ = "its source changed while it was being imported"
REASON_NO_LONGER_MATCHES = "its events no longer match what its source produces"


class Plan(Enum):
    """What an import does with a session (see the module docstring)."""

    FRESH = "fresh"
    VERIFY = "verify"
    RESUME = "resume"
    REOPEN = "reopen"
    DIVERGED = "diverged"


@dataclass
class Outcome:
    """What importing one source did (folded into the report by the caller)."""

    session_id: Optional[str] = None  # the session the source went to, when it made one
    created: bool = False
    updated: bool = False
    regenerated: bool = False  # the old session was set aside and the source imported afresh
    unchanged: bool = False
    appended: int = 0
    skipped_lines: int = 0
    notes: dict = field(default_factory=dict)
    problems: list = field(default_factory=list)
    set_aside: Optional[tuple[str, str, str]] = None  # (session id, the id it was set aside as, why)
    tombstoned: Optional[Tombstone] = None  # the tombstone that kept the source out
    foreign_kept: int = 0  # records others appended to the session, found (and kept) by this import
    stats: Optional[SourceStats] = None  # what the session holds, for the per-version report
    # A new session written whole into the staging area (its directory there), to be
    # published by the caller (see :mod:`.staging`); ``None`` when the import wrote into the store.
    staged: Optional[str] = None


class _Diverged(Exception):
    """The session's imported events are not a prefix of what the source produces."""


class _TombstonedMeanwhile(Exception):
    """The session was tombstoned between the import's first look and its lock."""


# --------------------------------------------------------------------------------------------
# The ledger: which records of the log the import wrote


@dataclass
class Ledger:
    """What the cache says about the log, readable even from a cache of another version:
    ``next_seq`` (the log's next seq when the import last wrote; ``None`` when unknown),
    ``foreign`` (seq ranges others appended), ``known_count`` (a version-1 cache: the import
    wrote the first ``known_count`` records)."""

    next_seq: Optional[int] = None
    foreign: list = field(default_factory=list)
    known_count: Optional[int] = None


def merge_ranges(ranges: list) -> list:
    """Sorted, merged ``[first, last]`` seq ranges (adjacent ones joined)."""
    out: list[list[int]] = []
    for first, last in sorted((int(a), int(b)) for a, b in ranges):
        if out and first <= out[-1][1] + 1:
            out[-1][1] = max(out[-1][1], last)
        else:
            out.append([first, last])
    return out


def _in_ranges(seq: int, ranges: list) -> bool:
    return any(first <= seq <= last for first, last in ranges)


def _read_state(directory: Path) -> Optional[dict]:
    try:
        data = read_no_follow(directory / DERIVED_DIR / IMPORT_STATE_FILE)
    except StoreIOError:
        return None
    if data is None:
        return None
    try:
        state = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    return state if isinstance(state, dict) else None


def load_state(directory: Path) -> Optional[dict]:
    """The import cache of a session; ``None`` when missing, malformed or of another version or
    mapping (it is regenerable; see :func:`load_ledger` for what survives of it)."""
    state = _read_state(directory)
    if state is None or state.get("version") != STATE_VERSION or state.get("mapping") != MAPPING_VERSION:
        return None
    try:
        ok = (
            isinstance(state["source"]["path"], str)
            and type(state["offset"]) is int
            and type(state["lines"]) is int
            and type(state["events"]) is int
            and isinstance(state["carry"], dict)
            and type(state["head_len"]) is int
            and type(state["next_seq"]) is int
            and isinstance(state["foreign"], list)
            and all(isinstance(r, list) and len(r) == 2 and all(type(x) is int for x in r) for r in state["foreign"])
        )
    except (KeyError, TypeError):
        ok = False
    return state if ok else None


def load_ledger(directory: Path) -> Optional[Ledger]:
    """The ledger of a cache of any version (``None`` when there is none to trust)."""
    state = _read_state(directory)
    if state is None:
        return None
    if state.get("version") == 1:
        count = state.get("events")
        return Ledger(known_count=count) if type(count) is int and count >= 0 else None
    next_seq, foreign = state.get("next_seq"), state.get("foreign")
    if type(next_seq) is not int or not isinstance(foreign, list):
        return None
    if not all(isinstance(r, list) and len(r) == 2 and all(type(x) is int for x in r) for r in foreign):
        return None
    return Ledger(next_seq=next_seq, foreign=merge_ranges(foreign))


def _manifest_next_seq(directory: Path) -> Optional[int]:
    try:
        manifest = load_manifest(directory)
    except StoreIOError:
        return None
    return manifest.next_seq if manifest is not None else None


# --------------------------------------------------------------------------------------------
# Comparing the import's events with the log


def _seq(record: Record) -> int:
    """A record's seq (iter_records gives every record one)."""
    return record.seq if record.seq is not None else 0


def _same(record: Record, event: dict, ts: str) -> bool:
    return record.ts == ts and (record.event == event or record.event == _stand_in(event))


class _Check:
    """The session's records an import's events are compared with before anything is appended.

    Records in ``foreign`` ranges are skipped (others appended them). A record with a seq below
    ``known_until`` was written by the import: it must equal the next event, else the session
    diverged from its source. From ``known_until`` on nobody knows: a record that equals the next
    event was written by an import that crashed before saving its cache (such imports resume
    from the same state, so their records are the events to come, in order); one that does not
    was appended by someone else (foreign), before or between them. With ``known_until=None``
    (no ledger) every record must match while the source produces events, and the records left
    when it produces no more are foreign (the log's tail).
    """

    def __init__(self, log: SessionLog, *, start_seq: int, known_until: Optional[int], foreign: list):
        self.records: Iterator[Record] = log.iter_records()
        # A store that redacts at write time logged each event redacted: compare it so.
        redaction = log.redaction
        self.redact = redaction.redact_event if redaction is not None and redaction.at_write else None
        self.start_seq = start_seq
        self.known_until = known_until
        self.foreign = foreign
        self.new_foreign: list[list[int]] = []
        self.matched = 0
        self.done = False
        self._peeked: Optional[Record] = None

    def _peek(self) -> Optional[Record]:
        while self._peeked is None:
            record = next(self.records, None)
            if record is None:
                self._close()
                return None
            seq = _seq(record)
            if seq < self.start_seq or _in_ranges(seq, self.foreign):
                continue
            self._peeked = record
        return self._peeked

    def _known(self, seq: int) -> bool:
        return self.known_until is None or seq < self.known_until

    def take(self, event: dict, ts: str) -> bool:
        """Whether ``(event, ts)`` is already in the log (then it is not appended)."""
        while not self.done:
            record = self._peek()
            if record is None:
                return False
            if _same(record, event, ts) or (self.redact is not None and _same(record, self.redact(event), ts)):
                self._peeked = None
                self.matched += 1
                return True
            if self._known(_seq(record)):
                self._close()
                raise _Diverged()
            self._foreign(_seq(record))
        return False

    def finish(self) -> None:
        """The source produces no more events: what is left of the log is foreign (or, for
        records the import wrote, a divergence)."""
        while not self.done:
            record = self._peek()
            if record is None:
                return
            if self.known_until is not None and _seq(record) < self.known_until:
                self._close()
                raise _Diverged()
            self._foreign(_seq(record))

    def _foreign(self, seq: int) -> None:
        """The record ``seq`` was appended by someone else: kept, recorded, passed over."""
        self.new_foreign.append([seq, seq])
        self._peeked = None

    def _close(self) -> None:
        self.done = True
        self._peeked = None
        close = getattr(self.records, "close", None)
        if close is not None:
            close()


class _Writer:
    """Appends a parser's events to the session, after the ones the log already holds."""

    def __init__(
        self,
        root: Path,
        session_id: str,
        log: Optional[SessionLog],
        check: Optional[_Check],
        handles: list,
        tombstones: Tombstones,
    ):
        self.root = root
        self.session_id = session_id
        self.log = log
        self.handles = handles
        self.check = check
        self.tombstones = tombstones
        self.appended = 0
        self.problems: list[tuple[Optional[int], str]] = []
        # Where events go: the session's append, once there is a session to append to.
        self._append: Optional[Callable[..., int]] = log.append if log is not None else None

    def deliver(self, events: list) -> None:
        check = self.check
        if check is not None and not check.done:
            events = [(event, ts) for event, ts in events if not check.take(event, ts)]
            if not events:
                return
        append = self._append
        if append is None:
            append = self._open_new()
        for event, ts in events:
            try:
                append(event, ts=ts)
            except InvalidEvent as exc:
                if event.get("type") in LIFECYCLE_KINDS:
                    raise
                # Keep the event count aligned with what the parser produced (the prefix property).
                self.problems.append((None, f"an imported event could not be stored ({exc}); an error item stands in"))
                append(_stand_in(event), ts=ts)
        self.appended += len(events)

    def _open_new(self) -> Callable[..., int]:
        log = open_session(self.root, self.session_id, max_events=0, durability="none")
        self.handles.append(log)
        self.log = log
        self._append = log.append
        if log.event_count:
            raise SessionBusyError(f"session {self.session_id!r} was written by another process meanwhile")
        # Under the session's lock now: a tombstone written since the import looked cannot be
        # followed by a removal any more, and one written before it means the session must
        # not come back.
        if self.tombstones.lookup(self.session_id) is not None:
            raise _TombstonedMeanwhile()
        return log.append

    def finish(self) -> None:
        if self.check is not None:
            self.check.finish()

    def close_check(self) -> None:
        if self.check is not None and not self.check.done:
            self.check._close()


class _StagedWriter(_Writer):
    """A :class:`_Writer` of a new session written whole into the staging area (see
    :class:`memstore.session.bulk.NewSession`): nothing is compared, locked or synced here; the
    caller publishes the session once a batch of them is durable."""

    def __init__(self, staging: StagingArea, session_id: str, tombstones: Tombstones):
        super().__init__(staging.root, session_id, None, None, [], tombstones)
        self.staging = staging
        self.name = session_dir_name(session_id)
        self.new: Optional[NewSession] = None

    def _open_new(self) -> Callable[..., int]:
        self.new = NewSession(self.staging.staged(self.name), self.session_id, redaction=self.staging.redaction)
        self._append = self.new.append
        return self.new.append

    def abandon(self) -> None:
        """Remove what was staged (an import that failed, or wrote no event)."""
        new, self.new, self._append = self.new, None, None
        if new is not None:
            new.abandon()
            self.staging.discard(self.name)


def _stand_in(event: dict) -> dict:
    raw = event.get("item")
    item: dict = raw if isinstance(raw, dict) else {}
    return {
        "type": "item.completed",
        "item": {
            "id": str(item.get("id", "")),
            "type": "error",
            "message": "memstore could not store this imported event",
        },
    }


# --------------------------------------------------------------------------------------------
# Importing one source


def import_source(
    root: Path,
    source: SourceFile,
    wanted: str,
    settle_seconds: float,
    now: float,
    progress: Callable[[int], None],
    tombstones: Optional[Tombstones] = None,
    tombstoned: Optional[dict] = None,
    staging: Optional[StagingArea] = None,
) -> Optional[Outcome]:
    """Import one source file; ``None`` when it is not a source of the ``wanted`` kind (or no
    session can be named yet). Problems with the file go into the outcome; errors writing the
    store raise. ``tombstoned`` is the store's tombstones as the run found them (by session id);
    a source whose session is among them is skipped.

    With ``staging``, a source whose session does not exist yet is written whole into that
    staging area (``outcome.staged`` names it there) for the caller to publish (see
    :mod:`.staging`); the caller checks the tombstones again before it does."""
    tombstones = tombstones if tombstones is not None else Tombstones(root)
    if tombstoned is None:
        tombstoned = tombstones.all()
    out = Outcome()
    try:
        fd = open_source(source)
    except OSError as exc:
        out.problems.append((None, f"cannot read: {exc.strerror or exc}"))
        return out
    try:
        st = os.fstat(fd)
        found = sniff(fd, st.st_size, source)
        settled = now - st.st_mtime >= settle_seconds
        if found.kind is None or found.session_id is None:
            if found.reason == "unrecognized" or (found.reason == "empty" and st.st_size and settled):
                if wanted == "auto" or source.explicit:
                    out.problems.append((None, "not a Codex or Claude Code log (no line of a known format)"))
                    return out
            elif found.kind in ("codex", "codex-exec") and (wanted == "auto" or wanted == found.kind):
                what = "session_meta" if found.kind == "codex" else "thread.started"
                out.problems.append((None, f"no {what} line in the first lines: the session cannot be named"))
                return out
            else:
                # An empty file, a line still being written, or a transcript of titles only.
                logger.debug("import: %s: nothing to import yet (%s)", source.path, found.reason)
            return None
        if wanted != "auto" and found.kind != wanted:
            if source.explicit:
                out.problems.append((None, f"is a {found.kind} log, not {wanted}"))
                return out
            return None
        stone = tombstoned.get(found.session_id)
        if stone is not None:
            _skip_tombstoned(out, found.session_id, stone)
            progress(st.st_size)
            return out
        _import(
            root,
            source,
            fd,
            st,
            found,
            settled,
            out,
            progress,
            _mtime_ts_of(now + FUTURE_SLACK_SECONDS),
            tombstones,
            staging,
        )
        return out
    finally:
        os.close(fd)


def _skip_tombstoned(out: Outcome, session_id: str, stone: Tombstone) -> None:
    out.tombstoned = stone
    out.problems.append(
        (
            None,
            f"session {session_id!r} was removed on purpose ({stone.reason.value}, {stone.at}) "
            "and is tombstoned: not imported again",
        )
    )


def _import(
    root: Path,
    source: SourceFile,
    fd: int,
    st: os.stat_result,
    found,
    settled: bool,
    out: Outcome,
    progress: Callable[[int], None],
    ts_limit: str,
    tombstones: Tombstones,
    staging: Optional[StagingArea] = None,
) -> None:
    session_id = found.session_id
    directory = session_directory(root, session_id)
    state = load_state(directory)
    if (
        state is not None
        and state["importer"] == found.kind
        and (state["finalized"] or not settled)
        and not state.get("changed_while_read")
        and _same_source(state, source.name, st)
        and _prefix_sample(fd, state) is not None
        and _manifest_next_seq(directory) == state["next_seq"]
    ):
        out.unchanged = True
        out.stats = _stats(session_id, found.kind, state["carry"])
        progress(st.st_size)
        return
    if staging is not None and directory.name == session_id and not os.path.lexists(directory):
        _import_staged(staging, source, fd, st, found, settled, out, progress, ts_limit, tombstones)
        return
    log = None
    if (directory / EVENTS_FILE).exists() or directory.is_symlink():
        try:
            log = open_session(root, session_id, max_events=0, durability="none")
        except SessionBusyError:
            out.problems.append(
                (None, f"session {session_id!r} is open in another process; skipped, import again later")
            )
            return
        stone = tombstones.lookup(session_id)  # again, under the session's lock
        if stone is not None:
            created = log.event_count == 0
            log.close()
            if created:  # removed (and tombstoned) between the look and the open: not recreated
                _remove_own_empty(root, directory)
            _skip_tombstoned(out, session_id, stone)
            return
    handles: list[SessionLog] = [log] if log is not None else []
    try:
        _import_locked(root, source, fd, st, found, settled, out, progress, log, handles, ts_limit, tombstones)
    except SessionBusyError as exc:
        out.problems.append((None, f"{exc}; skipped, import again later"))
    except _TombstonedMeanwhile:
        stone = tombstones.lookup(session_id)
        for handle in handles:
            empty = handle.event_count == 0
            handle.close()
            if empty:
                _remove_own_empty(root, directory)
        handles.clear()
        out.appended = 0
        out.created = out.updated = out.regenerated = False
        out.session_id = None
        if stone is not None:
            _skip_tombstoned(out, session_id, stone)
    finally:
        for handle in handles:
            handle.close()


def _import_staged(
    staging: StagingArea,
    source: SourceFile,
    fd: int,
    st: os.stat_result,
    found,
    settled: bool,
    out: Outcome,
    progress: Callable[[int], None],
    ts_limit: str,
    tombstones: Tombstones,
) -> None:
    """Import a source whose session does not exist yet into the staging area: the session's
    log, views and import state are written there whole, unsynced (``out.staged`` names it);
    the caller publishes it. What it writes is what a fresh import into the store writes."""
    session_id = found.session_id
    parser = PARSERS[found.kind](
        session_id, source.name, context=dict(found.context, default_ts=min(_mtime_ts(st), ts_limit))
    )
    parser.ts_limit = ts_limit
    writer = _StagedWriter(staging, session_id, tombstones)
    consumed = ConsumedBytes()
    try:
        offset, lineno = _run(parser, writer, fd, 0, 0, st.st_size, settled, progress, consumed)
        out.appended = writer.appended
        out.skipped_lines = parser.skipped
        out.notes = parser.notes
        out.problems.extend(writer.problems)
        new = writer.new
        if new is None:
            return  # the source produced no events (nothing but titles, say): no session
        manifest = new.finish()
        intact = still_holds(fd, consumed)
        if not intact:
            out.problems.append(
                (
                    None,
                    "the source changed while it was being imported; the next import sets this "
                    "session aside and imports the source afresh",
                )
            )
        _save_state(
            new.directory,
            found.kind,
            session_id,
            source,
            st,
            offset,
            lineno,
            consumed,
            writer.appended,
            manifest.next_seq,
            [],
            parser.s,
            changed_while_read=not intact,
        )
    except BaseException:
        writer.abandon()
        raise
    out.session_id = session_id
    out.created = writer.appended > 0
    out.stats = _stats(session_id, found.kind, parser.s)
    out.staged = str(new.directory)


def _remove_own_empty(root: Path, directory: Path) -> None:
    """Remove a session directory this import created by opening it, and nothing else: it is
    removed only if its log is still empty once no one holds it."""

    def still_empty() -> bool:
        try:
            return os.path.getsize(directory / EVENTS_FILE) == 0
        except FileNotFoundError:
            return True
        except OSError:
            return False

    try:
        if remove_session_directory(root, directory, still_empty):
            mark_changed(root, directory.name)
    except StoreIOError as exc:
        logger.warning("could not remove the empty session %s an import created: %s", directory, exc)


def _same_source(state: dict, path: str, st: os.stat_result) -> bool:
    src = state["source"]
    return src.get("path") == path and src.get("size") == st.st_size and src.get("mtime_ns") == st.st_mtime_ns


def _prefix_sample(fd: int, state: dict) -> Optional[ConsumedBytes]:
    """The consumed prefix as the file holds it now, if it is still what the state describes
    (its fingerprint matches): the start of this run's :class:`ConsumedBytes`; else ``None``."""
    try:
        head, tail = sample(fd, state["offset"])
    except OSError:
        return None
    if (
        len(head) != state["head_len"]
        or hashlib.sha256(head).hexdigest() != state.get("head_sha256")
        or hashlib.sha256(tail).hexdigest() != state.get("tail_sha256")
    ):
        return None
    return ConsumedBytes(state["offset"], head, tail)


def _plan(
    log: Optional[SessionLog], state: Optional[dict], fd: int, st: os.stat_result, kind: str
) -> tuple[Plan, Optional[ConsumedBytes]]:
    """What to do with the session (see :class:`Plan`), and the consumed prefix to resume from."""
    if log is None or not log.event_count:
        return Plan.FRESH, None
    if state is None or state["importer"] != kind:
        return Plan.VERIFY, None
    if state.get("changed_while_read") or state["offset"] > st.st_size:
        return Plan.DIVERGED, None
    consumed = _prefix_sample(fd, state)
    if consumed is None:
        return Plan.DIVERGED, None
    if state["finalized"] and has_line_after(fd, state["offset"], st.st_size):
        return Plan.REOPEN, consumed
    return Plan.RESUME, consumed


def _import_locked(
    root: Path,
    source: SourceFile,
    fd: int,
    st: os.stat_result,
    found,
    settled: bool,
    out: Outcome,
    progress: Callable[[int], None],
    log: Optional[SessionLog],
    handles: list,
    ts_limit: str,
    tombstones: Tombstones,
) -> None:
    """Import with the session open (or absent); every handle opened is added to ``handles``
    for the caller to close."""
    session_id = found.session_id
    cls = PARSERS[found.kind]
    directory = session_directory(root, session_id)
    count = log.event_count if log is not None else 0
    context = dict(found.context, default_ts=min(_mtime_ts(st), ts_limit))  # a file touched into the future
    state = None
    if count:
        records = log.iter_records()  # type: ignore[union-attr]
        first = next(records, None)
        getattr(records, "close", lambda: None)()
        origin = (
            first.event.get("source") if first is not None and first.event.get("type") == "thread.started" else None
        )
        other = origin.get("path") if isinstance(origin, dict) else None
        if not isinstance(other, str):
            out.problems.append(
                (None, (f"session {session_id!r} exists and was not imported from an agent log; left alone"))
            )
            return
        if other != source.name and (os.path.exists(other) or os.path.exists(path_of_display(other))):
            out.problems.append(
                (
                    None,
                    (
                        f"session {session_id!r} is already imported from {other}; this source "
                        "names the same session and was not merged into it"
                    ),
                )
            )
            return
        state = load_state(directory)
        if first is not None and first.ts is not None:
            # The time a line without one takes (an exec stream's, say: the file's mtime at the
            # first import) is the one that import gave: its thread.started's time (the default
            # is only ever used up to the first event).
            context["default_ts"] = first.ts
    plan, consumed = _plan(log, state, fd, st, found.kind)
    judged = directory_identity(directory)  # the session judged, under its lock
    reason = REASON_CHANGED_WHILE_READ if state is not None and state.get("changed_while_read") else REASON_REWRITTEN
    ledger = Ledger()
    for _attempt in range(2):
        if plan is Plan.DIVERGED:
            if log is not None:
                handles.remove(log)
                log.close()
                log = None
            try:
                new_id = set_aside_session(root, session_id, reason, judged)
            except (SessionPinned, CannotSetAside) as exc:
                out.problems.append((None, str(exc)))
                return
            out.set_aside = (session_id, new_id, reason)
            out.regenerated = True
            out.problems.append(
                (
                    None,
                    f"session {session_id!r} set aside as {new_id!r} ({reason}; all its events "
                    "are kept there); its source is imported afresh",
                )
            )
            plan, state, consumed, context = (
                Plan.FRESH,
                None,
                None,
                dict(found.context, default_ts=min(_mtime_ts(st), ts_limit)),
            )
            count = 0
        check = None
        if plan in (Plan.RESUME, Plan.REOPEN):
            assert state is not None and consumed is not None and log is not None
            parser = cls(session_id, source.name, state=state["carry"])
            if plan is Plan.REOPEN:
                parser.reopen()
            start, lineno = state["offset"], state["lines"]
            ledger = Ledger(next_seq=state["next_seq"], foreign=merge_ranges(state["foreign"]))
            if log.manifest.next_seq > state["next_seq"]:
                check = _Check(log, start_seq=state["next_seq"], known_until=state["next_seq"], foreign=ledger.foreign)
        else:
            parser = cls(session_id, source.name, context=context)
            start, lineno, consumed = 0, 0, ConsumedBytes()
            if plan is Plan.VERIFY:
                assert log is not None
                ledger = load_ledger(directory) or Ledger()
                check = _Check(log, start_seq=0, known_until=_known_until(log, ledger), foreign=ledger.foreign)
        parser.ts_limit = ts_limit
        writer = _Writer(root, session_id, log, check, handles, tombstones)
        try:
            offset, lineno = _run(parser, writer, fd, start, lineno, st.st_size, settled, progress, consumed)
            writer.finish()
        except _Diverged:
            writer.close_check()
            reason = REASON_NO_LONGER_MATCHES
            plan = Plan.DIVERGED
            log = writer.log
            continue
        log = writer.log
        break
    else:  # pragma: no cover - a fresh import cannot diverge
        raise RuntimeError("import did not converge")
    out.appended = writer.appended
    out.skipped_lines = parser.skipped
    out.notes = parser.notes
    out.problems.extend(writer.problems)
    if log is None:
        return  # the source produced no events (nothing but titles, say): no session
    out.session_id = session_id
    out.stats = _stats(session_id, found.kind, parser.s)
    foreign = ledger.foreign
    if check is not None and check.new_foreign:
        out.foreign_kept = sum(last - first + 1 for first, last in check.new_foreign)
        foreign = merge_ranges(foreign + check.new_foreign)
        logger.info(
            "import: session %r holds %d records appended by another writer; they are kept and the import "
            "goes on after them",
            session_id,
            out.foreign_kept,
        )
    if not out.regenerated:
        if count:
            out.updated = writer.appended > 0
            out.unchanged = writer.appended == 0
        else:
            out.created = writer.appended > 0
    log.flush()
    intact = still_holds(fd, consumed)
    if not intact:
        out.problems.append(
            (
                None,
                "the source changed while it was being imported; the next import sets this "
                "session aside and imports the source afresh",
            )
        )
    events = (
        (state["events"] if plan in (Plan.RESUME, Plan.REOPEN) and state is not None else 0)
        + (check.matched if check is not None else 0)
        + writer.appended
    )
    _save_state(
        directory,
        found.kind,
        session_id,
        source,
        st,
        offset,
        lineno,
        consumed,
        events,
        log.manifest.next_seq,
        foreign,
        parser.s,
        changed_while_read=not intact,
    )


def _stats(session_id: str, kind: str, state: dict) -> SourceStats:
    # Legacy Codex rollouts record no token usage: zero tokens is no sign of drift there.
    expects_usage = not (kind == "codex" and state.get("legacy") is not False)
    return source_stats(session_id, kind, state, expects_usage)  # per importer: an exec stream is its own format


def _known_until(log: SessionLog, ledger: Ledger) -> Optional[int]:
    """Where the records the import is known to have written end (see :class:`_Check`)."""
    if ledger.next_seq is not None:
        return ledger.next_seq
    if ledger.known_count is None:
        return None
    # A version-1 cache: the import wrote the first `known_count` records, and others after them.
    if ledger.known_count == 0:
        return 0
    for number, record in enumerate(log.iter_records(), start=1):
        if number == ledger.known_count:
            return _seq(record) + 1
    return None


def _run(
    parser: Parser,
    writer: _Writer,
    fd: int,
    start: int,
    lineno: int,
    limit: int,
    settled: bool,
    progress: Callable[[int], None],
    consumed: ConsumedBytes,
) -> tuple[int, int]:
    """Feed the complete lines of ``[start, limit)`` to the parser, delivering its events after
    each chunk read; finalize a settled source. Every byte consumed (up to the returned offset)
    also goes to ``consumed``, from the same reads. Returns the consumed offset and line count.

    (The hot loop of an import: lines are split per chunk rather than yielded one by one.)
    """
    offset = pos = start
    pieces: list[bytes] = []
    feed = parser.feed
    feed_lines = parser.feed_lines
    out = parser.out
    stats = parser.s["stats"]
    progress(start)
    while pos < limit:
        data = read_at(fd, min(CHUNK, limit - pos), pos)
        if not data:
            break
        pos += len(data)
        newline = data.find(b"\n")
        if newline < 0:
            pieces.append(data)  # a line longer than a chunk
            continue
        if pieces:
            pieces.append(data[: newline + 1])
            line = b"".join(pieces)
            consumed.consume(line)
            lineno += 1
            stats["records"] += len(line) > 1
            feed(line[:-1], lineno)
            pieces = []
            data = data[newline + 1 :]
        cut = data.rfind(b"\n") + 1
        if cut:
            body = data[:cut] if cut < len(data) else data
            consumed.consume(body)
            lines = body.split(b"\n")
            lines.pop()
            stats["records"] += len(lines) - lines.count(b"")
            lineno = feed_lines(lines, lineno)
        tail = data[cut:]
        if tail:
            pieces.append(tail)
        if out:
            writer.deliver(out)
            out.clear()
        progress(pos - len(tail) - offset)
        offset = pos - len(tail)
    if settled:
        # (Only a line that can be an object is joined: a torn or binary tail may be huge.)
        last = (
            b"".join(pieces) if pieces and pieces[0].lstrip()[:1] == b"{" and pieces[-1].rstrip()[-1:] == b"}" else b""
        )
        if last and _complete(last):
            # A complete last line without its newline: nobody is writing a settled source any
            # more, so it is the source's last line (a torn one still waits, as it did).
            consumed.consume(last)
            lineno += 1
            stats["records"] += 1
            feed(last, lineno)
            progress(pos - offset)
            offset = pos
        parser.finalize()
        if out:
            writer.deliver(out)
            out.clear()
    return offset, lineno


def _complete(line: bytes) -> bool:
    """Whether ``line`` is a whole JSON value (a torn line never is: a line is an object)."""
    try:
        orjson.loads(line)
    except orjson.JSONDecodeError:
        return False
    return True


def _save_state(
    directory: Path,
    kind: str,
    session_id: str,
    source: SourceFile,
    st: os.stat_result,
    offset: int,
    lines: int,
    consumed: ConsumedBytes,
    events: int,
    next_seq: int,
    foreign: list,
    carry: dict,
    *,
    changed_while_read: bool,
) -> None:
    # Not synced: a cache that is lost or stale only costs a re-parse (what it says is checked).
    assert consumed.offset == offset, (consumed.offset, offset)
    head_len, head, tail = consumed.fingerprint()
    state = {
        "version": STATE_VERSION,
        "mapping": MAPPING_VERSION,
        "importer": kind,
        "session_id": session_id,
        "source": {"path": source.name, "size": st.st_size, "mtime_ns": st.st_mtime_ns},
        "offset": offset,
        "lines": lines,
        "head_len": head_len,
        "head_sha256": head,
        "tail_sha256": tail,
        "events": events,
        "next_seq": next_seq,
        "foreign": foreign,
        "changed_while_read": changed_while_read,
        "finalized": bool(carry.get("finalized")),
        "carry": carry,
    }
    atomic_write(directory / DERIVED_DIR / IMPORT_STATE_FILE, orjson.dumps(state), durable=False)


def _mtime_ts(st: os.stat_result) -> str:
    return _mtime_ts_of(st.st_mtime)


def _mtime_ts_of(when: float) -> str:
    seconds = int(when)
    millis = int((when - seconds) * 1000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{millis:03d}Z"
