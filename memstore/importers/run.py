"""Importing one source into its session: incremental, idempotent, never merged into a session
it does not describe.

The parsers have the prefix property: the events made from the first N complete lines of a
source are a prefix of those made from the first M >= N lines. So an import appends the events
beyond those the session already holds, and the per-session cache
``<session>/derived/import-state.json`` only saves work:

- it records the source (path, size, mtime), the consumed byte offset (the end of the last
  complete line), a fingerprint of the consumed bytes (sha256 of the first 64 KiB and of the
  4 KiB before the offset), the events written, and the parser's whole state at the offset;
- an unchanged source (same size, mtime and fingerprint, nothing left to finalize) is skipped
  without parsing and without opening the session;
- a source that grew resumes at the offset with the saved parser state;
- without a usable cache the source is parsed from byte 0 and the first ``event_count`` events
  are checked against the log and skipped (the same result, by the prefix property);
- a source that was rewritten or truncated (fingerprint mismatch, smaller than the offset), or
  whose events no longer match the log, is imported afresh into a new generation of its session:
  the old session directory is discarded first (recorded in ``gc-log.jsonl``, reason
  ``import_regenerated``), unless it is pinned: a pinned session is never discarded (reported).

A settled source (unmodified for ``settle_seconds``) is finalized: its open turn is closed and
``thread.completed`` appended. If it grows again later (a resumed Codex session), the finalizing
events are no longer a prefix of what a single import would write, so it is re-imported into a
new generation as well.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import orjson

from ..layout import DERIVED_DIR, EVENTS_FILE, IMPORT_STATE_FILE, PIN_FILE, SESSIONS_DIR, session_directory
from ..errors import InvalidEvent, SessionBusyError, StoreIOError
from ..events import LIFECYCLE_KINDS
from ..changes import mark_changed
from ..fsio import atomic_write, read_no_follow
from ..locks import remove_session_directory
from ..session.log import SessionLog, open_session
from ..session.manifest import load_manifest
from ..retention import GcLog, _tree_bytes, session_retention_pinned
from .base import Parser
from .claude import ClaudeParser
from .codex import CodexExecParser, CodexRolloutParser
from .sources import (
    CHUNK,
    SourceFile,
    fingerprint,
    has_line_after,
    open_source,
    path_of_display,
    sniff,
)

logger = logging.getLogger("memstore")

STATE_VERSION = 1
# Bump when the same lines would produce different events: sessions imported by an older
# mapping are then re-imported into a new generation rather than extended inconsistently.
MAPPING_VERSION = 3  # 2: prompts after an aborted task, results before calls, exec turn verdicts;
# 3: a Claude Code turn interrupted before a compaction ends before it
# A line may be dated up to this far past the import's clock (another machine's clock, a time
# zone bug); a later time is taken as wrong (see Parser.ts_limit).
FUTURE_SLACK_SECONDS = 86_400
PARSERS: dict[str, type[Parser]] = {"codex": CodexRolloutParser, "codex-exec": CodexExecParser, "claude": ClaudeParser}


@dataclass
class Outcome:
    """What importing one source did (folded into the report by the caller)."""

    session_id: Optional[str] = None  # the session the source went to, when it made one
    created: bool = False
    updated: bool = False
    regenerated: bool = False
    unchanged: bool = False
    appended: int = 0
    skipped_lines: int = 0
    notes: dict = field(default_factory=dict)
    problems: list = field(default_factory=list)


class _Diverged(Exception):
    """The session's events are not a prefix of what the source produces."""


class SessionPinned(Exception):
    """The session to replace by a new generation is pinned: it is never discarded."""

    def __init__(self, session_id: str):
        super().__init__(f"session {session_id!r} is pinned ({PIN_FILE}): it is not replaced by a new generation; "
                         "unpin it to re-import its source")


REASON_REGENERATED = "import_regenerated"


class _Writer:
    """Appends a parser's events to the session, first checking and skipping the ones the
    session already holds."""

    def __init__(self, root: Path, session_id: str, log: Optional[SessionLog], skip: int, handles: list):
        self.root = root
        self.session_id = session_id
        self.log = log
        self.handles = handles
        self.skip = skip
        self.existing = log.iter_records() if (log is not None and skip) else None
        self.appended = 0
        self.problems: list[tuple[Optional[int], str]] = []

    def deliver(self, events: list) -> None:
        if self.skip or self.log is None:
            events = self._skip_or_open(events)
            if not events:
                return
        append = self.log.append
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

    def _skip_or_open(self, events: list) -> list:
        """Check and drop the events the session already holds; open a new session lazily."""
        index = 0
        while self.skip and index < len(events):
            event, ts = events[index]
            record = next(self.existing, None)
            if record is None or record.ts != ts or (record.event != event and record.event != _stand_in(event)):
                raise _Diverged()
            self.skip -= 1
            index += 1
            if not self.skip:
                self.existing.close()
        events = events[index:]
        if events and self.log is None:
            self.log = open_session(self.root, self.session_id, max_events=0, durability="none")
            self.handles.append(self.log)
            if self.log.event_count:
                raise SessionBusyError(f"session {self.session_id!r} was written by another import meanwhile")
        return events

    def close_reader(self) -> None:
        if self.existing is not None:
            self.existing.close()


def _stand_in(event: dict) -> dict:
    item = event.get("item") if isinstance(event.get("item"), dict) else {}
    return {"type": "item.completed", "item": {"id": str(item.get("id", "")), "type": "error",
                                               "message": "memstore could not store this imported event"}}


def load_state(directory: Path) -> Optional[dict]:
    """The import cache of a session; ``None`` when missing or malformed (it is regenerable)."""
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
    if not isinstance(state, dict) or state.get("version") != STATE_VERSION or state.get("mapping") != MAPPING_VERSION:
        return None
    try:
        ok = (isinstance(state["source"]["path"], str) and type(state["offset"]) is int and type(state["lines"]) is int
              and type(state["events"]) is int and isinstance(state["carry"], dict) and type(state["head_len"]) is int)
    except (KeyError, TypeError):
        ok = False
    return state if ok else None


def _manifest_events(directory: Path) -> Optional[int]:
    try:
        manifest = load_manifest(directory)
    except StoreIOError:
        return None
    return manifest.event_count if manifest is not None else None


def discard_session(root: Path, session_id: str) -> None:
    """Remove a session no process has open (``SessionBusyError`` if one does; ``SessionPinned``
    if it is pinned), to import its source afresh into a new generation. The removal goes
    through the store's (``memstore.locks.remove_session_directory``) and is recorded in
    ``gc-log.jsonl`` before the directory is deleted."""
    directory = session_directory(root, session_id)
    # A pinned session is never removed (retention's rule holds for every removal). The gc-log
    # is opened first so that a store where the removal cannot be recorded removes nothing.
    if session_retention_pinned(directory):
        raise SessionPinned(session_id)
    if not os.path.lexists(directory):
        return
    with GcLog(root) as gc_log:
        size = _tree_bytes(directory)
        try:
            manifest = load_manifest(directory)
        except StoreIOError:
            manifest = None

        def record() -> None:
            gc_log.record(session_id=session_id, directory=f"{SESSIONS_DIR}/{directory.name}", reason=REASON_REGENERATED,
                          size=size, updated_at=manifest.updated_at if manifest is not None else None)

        # Asked again under the session's lock, where no one can pin it unseen any more.
        if not remove_session_directory(root, directory, lambda: not session_retention_pinned(directory),
                                        on_moved=record):
            if not os.path.lexists(directory):
                return
            if session_retention_pinned(directory):
                raise SessionPinned(session_id)
            raise SessionBusyError(f"session {session_id!r} is open in another process; it cannot be replaced now")
        mark_changed(root, directory.name)


def import_source(root: Path, source: SourceFile, wanted: str, settle_seconds: float, now: float,
                  progress: Callable[[int], None]) -> Optional[Outcome]:
    """Import one source file; ``None`` when it is not a source of the ``wanted`` kind (or no
    session can be named yet). Problems with the file go into the outcome; errors writing the
    store raise."""
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
        _import(root, source, fd, st, found, settled, out, progress, _mtime_ts_of(now + FUTURE_SLACK_SECONDS))
        return out
    finally:
        os.close(fd)


def _import(root: Path, source: SourceFile, fd: int, st: os.stat_result, found, settled: bool, out: Outcome,
            progress: Callable[[int], None], ts_limit: str) -> None:
    session_id = found.session_id
    directory = session_directory(root, session_id)
    state = load_state(directory)
    if state is not None and state["importer"] == found.kind and (state["finalized"] or not settled) \
            and _same_source(state, source.name, st) and _prefix_intact(fd, state) \
            and _manifest_events(directory) == state["events"]:
        out.unchanged = True
        progress(st.st_size)
        return
    log = None
    if (directory / EVENTS_FILE).exists() or directory.is_symlink():
        try:
            log = open_session(root, session_id, max_events=0, durability="none")
        except SessionBusyError:
            out.problems.append((None, f"session {session_id!r} is open in another process; skipped, import again later"))
            return
    handles: list[SessionLog] = [log] if log is not None else []
    try:
        _import_locked(root, source, fd, st, found, settled, out, progress, log, handles, ts_limit)
    except SessionBusyError as exc:
        out.problems.append((None, f"{exc}; skipped, import again later"))
    finally:
        for handle in handles:
            handle.close()


def _same_source(state: dict, path: str, st: os.stat_result) -> bool:
    src = state["source"]
    return src.get("path") == path and src.get("size") == st.st_size and src.get("mtime_ns") == st.st_mtime_ns


def _prefix_intact(fd: int, state: dict) -> bool:
    """Whether the consumed bytes are still the ones the state describes."""
    try:
        head_len, head, tail = fingerprint(fd, state["offset"])
    except OSError:
        return False
    return head_len == state["head_len"] and head == state.get("head_sha256") and tail == state.get("tail_sha256")


def _import_locked(root: Path, source: SourceFile, fd: int, st: os.stat_result, found, settled: bool, out: Outcome,
                   progress: Callable[[int], None], log: Optional[SessionLog], handles: list, ts_limit: str) -> None:
    """Import with the session open (or absent); every handle opened is added to ``handles``
    for the caller to close."""
    session_id = found.session_id
    cls = PARSERS[found.kind]
    directory = session_directory(root, session_id)
    count = log.event_count if log is not None else 0
    context = dict(found.context, default_ts=min(_mtime_ts(st), ts_limit))  # a file touched into the future
    plan = "fresh"
    state = None
    if count:
        records = log.iter_records()
        first = next(records, None)
        records.close()
        origin = first.event.get("source") if first is not None and first.event.get("type") == "thread.started" else None
        other = origin.get("path") if isinstance(origin, dict) else None
        if not isinstance(other, str):
            out.problems.append((None, (f"session {session_id!r} exists and was not imported from an agent log; "
                                        "left alone")))
            return
        if other != source.name and (os.path.exists(other) or os.path.exists(path_of_display(other))):
            out.problems.append((None, (f"session {session_id!r} is already imported from {other}; this source "
                                        "names the same session and was not merged into it")))
            return
        state = load_state(directory)
        if state is not None and state["importer"] != found.kind:
            state = None
        if state is None or state["events"] != count:
            plan = "verify" if state is None or _prefix_intact(fd, state) and state["offset"] <= st.st_size else "regenerate"
            if plan == "verify" and first.ts is not None:
                # The time a line without one takes (an exec stream's, say: the file's mtime at
                # the first import) is the one that import gave: its thread.started's time (the
                # default is only ever used up to the first event).
                context["default_ts"] = first.ts
        elif state["offset"] > st.st_size or not _prefix_intact(fd, state):
            plan = "regenerate"  # rewritten or truncated
        elif state["finalized"]:
            plan = "regenerate" if has_line_after(fd, state["offset"], st.st_size) else "unchanged"
        else:
            plan = "resume"
    if plan == "unchanged":
        out.unchanged = True
        _save_state(directory, found.kind, session_id, source, st, state["offset"], state["lines"], fd,
                    log.event_count, state["carry"])
        progress(st.st_size)
        return
    for _attempt in range(2):
        if plan == "regenerate":
            if log is not None:
                log.close()
                log = None
            try:
                discard_session(root, session_id)
            except SessionPinned as exc:
                out.problems.append((None, str(exc)))
                return
            out.regenerated = True
            plan = "fresh"
        if plan == "resume":
            parser = cls(session_id, source.name, state=state["carry"])
            start, lineno, skip = state["offset"], state["lines"], 0
        else:
            parser = cls(session_id, source.name, context=context)
            start, lineno, skip = 0, 0, (count if plan == "verify" else 0)
        parser.ts_limit = ts_limit
        writer = _Writer(root, session_id, log, skip, handles)
        try:
            offset, lineno = _run(parser, writer, fd, start, lineno, st.st_size, settled, progress)
            if writer.skip:
                raise _Diverged()
        except _Diverged:
            writer.close_reader()
            out.problems.append((None, (f"session {session_id!r} no longer matches its source; re-imported "
                                        "into a new generation")))
            plan = "regenerate"
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
    if out.regenerated:
        pass  # counted as regenerated, neither created nor updated
    elif count:
        out.updated = writer.appended > 0
        out.unchanged = writer.appended == 0
    else:
        out.created = writer.appended > 0
    log.flush()
    _save_state(directory, found.kind, session_id, source, st, offset, lineno, fd, log.event_count, parser.s)


def _run(parser: Parser, writer: _Writer, fd: int, start: int, lineno: int, limit: int, settled: bool,
         progress: Callable[[int], None]) -> tuple[int, int]:
    """Feed the complete lines of ``[start, limit)`` to the parser, delivering its events after
    each chunk read; finalize a settled source. Returns the consumed offset and line count.

    (The hot loop of an import: lines are split per chunk rather than yielded one by one.)
    """
    offset = pos = start
    pieces: list[bytes] = []
    feed = parser.feed
    feed_lines = parser.feed_lines
    out = parser.out
    progress(start)
    while pos < limit:
        data = os.pread(fd, min(CHUNK, limit - pos), pos)
        if not data:
            break
        pos += len(data)
        newline = data.find(b"\n")
        if newline < 0:
            pieces.append(data)  # a line longer than a chunk
            continue
        if pieces:
            pieces.append(data[:newline])
            lineno += 1
            feed(b"".join(pieces), lineno)
            pieces = []
            data = data[newline + 1:]
        lines = data.split(b"\n")
        tail = lines.pop()
        lineno = feed_lines(lines, lineno)
        if tail:
            pieces.append(tail)
        if out:
            writer.deliver(out)
            out.clear()
        progress(pos - len(tail) - offset)
        offset = pos - len(tail)
    if settled:
        # (Only a line that can be an object is joined: a torn or binary tail may be huge.)
        last = b"".join(pieces) if pieces and pieces[0].lstrip()[:1] == b"{" and pieces[-1].rstrip()[-1:] == b"}" \
            else b""
        if last and _complete(last):
            # A complete last line without its newline: nobody is writing a settled source any
            # more, so it is the source's last line (a torn one still waits, as it did).
            lineno += 1
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


def _save_state(directory: Path, kind: str, session_id: str, source: SourceFile, st: os.stat_result, offset: int,
                lines: int, fd: int, events: int, carry: dict) -> None:
    # Not synced: a cache that is lost or stale only costs a re-parse (its counts are checked).
    head_len, head, tail = fingerprint(fd, offset)
    state = {
        "version": STATE_VERSION, "mapping": MAPPING_VERSION, "importer": kind, "session_id": session_id,
        "source": {"path": source.name, "size": st.st_size, "mtime_ns": st.st_mtime_ns},
        "offset": offset, "lines": lines, "head_len": head_len, "head_sha256": head, "tail_sha256": tail,
        "events": events, "finalized": bool(carry.get("finalized")), "carry": carry,
    }
    atomic_write(directory / DERIVED_DIR / IMPORT_STATE_FILE, orjson.dumps(state), durable=False)


def _mtime_ts(st: os.stat_result) -> str:
    return _mtime_ts_of(st.st_mtime)


def _mtime_ts_of(when: float) -> str:
    seconds = int(when)
    millis = int((when - seconds) * 1000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{millis:03d}Z"
