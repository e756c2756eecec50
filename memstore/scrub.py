"""``scrub``: rewrite a session's canonical log with its secrets redacted, for the user who finds
secrets in their store after the fact.

What a scrub guarantees:

- **Only secrets change.** Each line of ``events.jsonl`` that holds no secret keeps its exact
  bytes; a line that does is its envelope with the secrets replaced by markers
  (``[REDACTED:<kind>]``), encoded again: its ``seq``, ``ts`` and every other value are the
  same, so seqs and turn numbers do not move. A line that is not JSON (kept by memstore as it
  found it) is redacted as text; a torn tail without its newline stays one. The torn tails a
  repair kept beside the log (``events.jsonl.torn-*``) are scrubbed the same way.
- **Crash-safe, as the cap rewrite is.** Under the session's liveness lock (no writer in any
  process), the new log is written to a private temp file beside the old one, ``fdatasync``ed
  and renamed over it, and the directory synced: a crash leaves the old log or the new one,
  whole, never a mix (a dead scrub's temp file is removed by the next open). The session's
  index is discarded before the rename, so no index ever describes the scrubbed log with the
  old log's offsets; the next open (or the rebuild the scrub ends with) makes it again.
- **Recorded.** Each scrub that changed a log appends a line to ``<root>/gc-log.jsonl``
  (``"op": "scrub"``, the session, the secrets found by kind, the bytes before and after),
  written with one ``write()`` and synced before the scrub returns.
- **Views follow.** The session is rebuilt (index, search chunks, file views) and the catalog
  refreshed; its generation changes, so the catalog copies it again and an audit pack of the
  old log no longer verifies (``memstore verify`` shows the change).

A scrub is idempotent: scrubbing a scrubbed log changes nothing and records nothing.
"""

from __future__ import annotations

import logging
import os
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import orjson

from . import events as ev
from .errors import SessionBusyError, SessionNotFound, StoreIOError
from .fsio import fsync_dir, open_private_append, read_no_follow, remove_temp, write_all, write_temp_beside
from .layout import SESSIONS_DIR, events_path, gc_log_path, index_path, session_directory
from .redact import MARKER_PREFIX, Redactor, redactor_for
from .session.index import SessionIndex
from .session.lock import LivenessLock, SessionGone
from .session.logfile import LogFile

logger = logging.getLogger(__name__)

_fdatasync = getattr(os, "fdatasync", os.fsync)


@dataclass
class ScrubReport:
    """What a scrub of one session did: ``secrets`` found by kind, the lines rewritten, the log's
    bytes before and after, and the torn-tail files rewritten. ``changed`` is false when the
    log held no secret (then nothing was written)."""

    session_id: str
    secrets: dict[str, int] = field(default_factory=dict)
    lines_changed: int = 0
    bytes_before: int = 0
    bytes_after: int = 0
    torn_files_changed: int = 0

    @property
    def changed(self) -> bool:
        return bool(self.lines_changed or self.torn_files_changed)

    def to_dict(self) -> dict:
        return {
            "session_id": self.session_id,
            "changed": self.changed,
            "secrets": dict(self.secrets),
            "lines_changed": self.lines_changed,
            "bytes_before": self.bytes_before,
            "bytes_after": self.bytes_after,
            "torn_files_changed": self.torn_files_changed,
        }


def scrub_bytes(data: bytes, redactor: Redactor, found: Optional[Counter] = None) -> tuple[bytes, int]:
    """``data`` (the bytes of a log) with every secret redacted, line by line as the module
    docstring says, and how many lines changed; ``found`` counts the markers added, by kind."""
    out: list[bytes] = []
    changed = 0
    for line in data.splitlines(keepends=True):
        new = _scrub_line(line, redactor)
        if new is not line:
            changed += 1
            if found is not None:
                found.update(_marker_kinds(new))
                found.subtract(_marker_kinds(line))
        out.append(new)
    if found is not None:
        for kind in [k for k, n in found.items() if n <= 0]:
            del found[kind]
    return (b"".join(out) if changed else data), changed


def _scrub_line(line: bytes, redactor: Redactor) -> bytes:
    """One line, redacted (the same object when it holds no secret)."""
    body, newline = (line[:-1], b"\n") if line.endswith(b"\n") else (line, b"")
    try:
        envelope = orjson.loads(body)
    except orjson.JSONDecodeError:
        envelope = None
    if isinstance(envelope, dict) and "event" in envelope:
        # Only the event: the envelope's own keys (seq, ts, the session id a log head carries)
        # are the log's bookkeeping, which a rebuild reads back.
        event = redactor.redact_value(envelope["event"])
        if event is envelope["event"]:
            return line
        return orjson.dumps({**envelope, "event": event}) + newline
    if isinstance(envelope, (dict, list)):
        redacted = redactor.redact_value(envelope)
        if redacted is envelope:
            return line
        return orjson.dumps(redacted) + newline
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        text = body.decode("utf-8", errors="surrogateescape")
    new = redactor.redact_text(text)
    if new is text:
        return line
    return new.encode("utf-8", errors="surrogateescape") + newline


def _marker_kinds(line: bytes) -> Counter:
    counts: Counter = Counter()
    if MARKER_PREFIX.encode() not in line:
        return counts
    text = line.decode("utf-8", errors="replace")
    start = 0
    while (at := text.find(MARKER_PREFIX, start)) >= 0:
        end = text.find("]", at)
        if end < 0:
            break
        counts[text[at + len(MARKER_PREFIX) : end]] += 1
        start = end + 1
    return counts


def scrub_session(
    root: os.PathLike | str, session_id: str, *, rebuild: bool = True, redactor: Optional[Redactor] = None
) -> ScrubReport:
    """Scrub the log of ``session_id`` (see the module docstring); with ``rebuild`` (the
    default) rebuild its views and refresh the catalog after a change. Raises
    :class:`SessionNotFound` when there is no such session, :class:`SessionBusyError` when a
    process (this one included) has it open, and :class:`StoreIOError` when the log cannot be
    read or replaced (then the old log is left as it was)."""
    root = Path(root)
    redactor = redactor if redactor is not None else redactor_for(root)
    directory = session_directory(root, session_id)
    log_path = events_path(directory)
    if directory.is_symlink() or not log_path.is_file() or log_path.is_symlink():
        raise SessionNotFound(session_id, log_path)
    report = ScrubReport(session_id)
    lock = LivenessLock(directory)
    try:
        held = lock.acquire()
    except SessionGone:
        raise SessionNotFound(session_id, log_path) from None
    if not held:
        raise SessionBusyError(f"session {session_id!r} is open for writing; close it before scrubbing it")
    try:
        found: Counter = Counter()
        data = read_no_follow(log_path)
        if data is None:
            raise SessionNotFound(session_id, log_path)
        report.bytes_before = report.bytes_after = len(data)
        scrubbed, report.lines_changed = scrub_bytes(data, redactor, found)
        torn = []
        for path in LogFile(directory).torn_files():
            old = read_no_follow(path)
            if old is None:
                continue
            new, lines = scrub_bytes(old, redactor, found)
            if lines:
                torn.append((path, new))
        if report.lines_changed:
            report.bytes_after = len(scrubbed)
            # No index may describe the new log with the old one's offsets: it goes first (a
            # crash here leaves the old log and no index, which the next open rebuilds).
            SessionIndex.discard(index_path(directory))
            _replace(log_path, scrubbed, "scrub.replaced")
        for path, new in torn:
            _replace(path, new, None)
        report.torn_files_changed = len(torn)
        report.secrets = dict(sorted(found.items()))
        if report.changed:
            fsync_dir(directory)
            _record(root, directory, report)
    finally:
        lock.release()
    if report.changed:
        logger.info("scrubbed %s: %s", session_id, ", ".join(f"{n} {k}" for k, n in report.secrets.items()) or "-")
        if rebuild:
            from .maintenance import rebuild as rebuild_views

            rebuild_views(root, session_id)
    return report


def scrub_store(root: os.PathLike | str, session_ids: Optional[Iterable[str]] = None) -> list[ScrubReport]:
    """Scrub every session of the store (or those of ``session_ids``), then rebuild the ones
    that changed and refresh the catalog once. Stops at the first session that cannot be
    scrubbed (a busy one, say), after rebuilding those already scrubbed."""
    from .catalog import refresh_catalog
    from .maintenance import rebuild as rebuild_views
    from .maintenance import session_ids as all_session_ids

    root = Path(root)
    redactor = redactor_for(root)
    reports: list[ScrubReport] = []
    try:
        for session_id in list(session_ids) if session_ids is not None else all_session_ids(root):
            reports.append(scrub_session(root, session_id, rebuild=False, redactor=redactor))
    finally:
        changed = [r.session_id for r in reports if r.changed]
        for session_id in changed:
            rebuild_views(root, session_id, refresh=False)
        if changed:
            refresh_catalog(root)
    return reports


def _replace(path: Path, data: bytes, fault: Optional[str]) -> None:
    """Put ``data`` in place of the file ``path``: a synced private temp file renamed over it."""
    from . import faults

    tmp, _st = write_temp_beside(path, data, sync=True, create_op="create scrub copy", write_op="write scrub copy")
    try:
        faults.check("scrub.written", path=tmp)
        os.rename(tmp, path)
    except OSError as exc:
        remove_temp(tmp)
        raise StoreIOError.from_os_error("rename", path, exc) from exc
    except BaseException:
        remove_temp(tmp)
        raise
    if fault is not None:
        faults.check(fault, path=path)


def _record(root: Path, directory: Path, report: ScrubReport) -> None:
    """Append the scrub to ``gc-log.jsonl``, synced."""
    path = gc_log_path(root)
    line = orjson.dumps(
        {
            "op": "scrub",
            "session_id": report.session_id,
            "directory": f"{SESSIONS_DIR}/{directory.name}",
            "at": ev.utc_now(),
            "secrets": report.secrets,
            "lines_changed": report.lines_changed,
            "bytes_before": report.bytes_before,
            "bytes_after": report.bytes_after,
            "torn_files_changed": report.torn_files_changed,
        },
        option=orjson.OPT_APPEND_NEWLINE,
    )
    fd, _created = open_private_append(path)
    try:
        write_all(fd, line, path)
        try:
            _fdatasync(fd)
        except OSError as exc:
            raise StoreIOError.from_os_error("fsync", path, exc) from exc
    finally:
        os.close(fd)


__all__ = ["ScrubReport", "scrub_bytes", "scrub_session", "scrub_store"]
