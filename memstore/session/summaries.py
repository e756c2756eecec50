"""Eviction summaries: what a cap rewrite removed, recorded before the log is replaced.

Each summary is a JSON object (VT Code's shape: ``session_id``, ``evicted_event_count``,
``event_types``, ``created_at``, ``grounded_facts``; memstore adds ``"writer": "memstore"``),
appended as one line to ``derived/eviction-summaries.jsonl`` (every summary, for good) and
written as ``derived/eviction-summary-<32 hex>.json`` (the newest ten, as VT Code writes them).

Pruning the files never loses a summary: a file memstore wrote is removed only because its line
is in the JSON Lines file (written and synced before the file); a file another writer left (VT
Code, before memstore took the session over) is first carried into the JSON Lines file, as a
line with ``"carried_from": <its name>``, and removed only once that line is synced. A file that
is not a JSON object is left where it is.
"""

from __future__ import annotations

import logging
import os
import re
import uuid
from collections import Counter, OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import orjson

from .. import events as ev
from ..errors import StoreIOError
from ..fsio import ensure_private_dir, fsync_dir, open_private_append, read_no_follow, write_all
from ..layout import DERIVED_DIR, EVICTION_LOG, EVICTION_SUMMARY_PREFIX

logger = logging.getLogger("memstore")

_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)

EVICTION_SUMMARY_FACTS = 5
EVICTION_FACT_CHARS = 180
EVICTION_SUMMARY_FILES = 10
WRITER = "memstore"  # the "writer" of the summaries memstore writes
CARRIED_FROM = "carried_from"
# A line that may hold an agent message: one with the item type's name, or with a \u escape
# of a letter or "_" (which could spell it: JSON has no other escape for a letter).
MESSAGE_CANDIDATE = re.compile(rb"agent_message|\\u00[5-7]")


@dataclass
class EvictionSummary:
    """What one cap eviction removed, accumulated in one pass: the count of records by type and
    up to five grounded facts (the agent's messages, whitespace-normalized, at most 180
    characters each, deduplicated case-insensitively, the newest last), as VT Code keeps them."""

    session_id: str
    count: int = 0
    types: Counter = field(default_factory=Counter)
    _facts: OrderedDict[str, str] = field(default_factory=OrderedDict)

    def add_event(self, event: dict) -> None:
        """Count one evicted event and keep its fact, if it is an agent message."""
        self.count += 1
        self.types[event.get("type")] += 1
        self.add_fact_of(event)

    def add_fact_of(self, event: dict) -> None:
        fact = _fact_of(event)
        if fact is None:
            return
        key = fact.lower()
        facts = self._facts
        facts.pop(key, None)
        facts[key] = fact
        if len(facts) > EVICTION_SUMMARY_FACTS:
            facts.popitem(last=False)

    def add_facts_of_lines(self, lines: Iterable[bytes]) -> None:
        """Keep the facts of raw log lines, oldest first, that may hold an agent message (see
        :data:`MESSAGE_CANDIDATE`; counts come from elsewhere: the index). Each is decoded as
        any record is (``events.decode_line``): the facts are those :meth:`add_event` would keep
        from the same records."""
        for line in lines:
            record = ev.decode_line(line)
            if record is not None:
                self.add_fact_of(record.event)

    def take_latest_facts_of_lines(self, lines_newest_first: Iterable[bytes]) -> None:
        """Keep the facts :meth:`add_facts_of_lines` would keep from the same lines given in the
        opposite order, newest first, consuming only as many as it needs: the newest line of
        each distinct fact gives its text and its place, and once five distinct facts are found
        older lines cannot change them (a fact seen again only moves to the end). Replaces any
        facts kept before."""
        newest: OrderedDict[str, str] = OrderedDict()
        for line in lines_newest_first:
            record = ev.decode_line(line)
            if record is None:
                continue
            fact = _fact_of(record.event)
            if fact is None:
                continue
            key = fact.lower()
            if key in newest:
                continue
            newest[key] = fact
            if len(newest) == EVICTION_SUMMARY_FACTS:
                break
        self._facts = OrderedDict(reversed(newest.items()))

    def to_dict(self) -> dict:
        return {
            "session_id": self.session_id,
            "evicted_event_count": self.count,
            "event_types": dict(sorted(self.types.items(), key=lambda item: str(item[0]))),
            "created_at": ev.utc_now(),
            "grounded_facts": list(self._facts.values()),
            "writer": WRITER,
        }


def _fact_of(event: dict) -> Optional[str]:
    """The grounded fact an event gives (an agent message's text, whitespace-normalized and cut
    to ``EVICTION_FACT_CHARS``), or ``None``."""
    text = ev.agent_message_text(event)
    if not text:
        return None
    return ev.truncate_for_fact(ev.normalize_whitespace(text), EVICTION_FACT_CHARS) or None


@dataclass
class PendingSummary:
    """A summary written but not yet durable (see :func:`stage_summary`): its line appended to
    the JSON Lines file (which was ``log_length`` bytes long before), its file a temp file
    beside its final name, both still open for the caller's syncs (:meth:`unsynced_fds`).
    :func:`commit_summary` puts the file in place once both are synced; :func:`undo_summary`
    takes both back."""

    log_path: Path
    log_length: int
    tmp: Path
    path: Path
    log_fd: int = -1
    tmp_fd: int = -1
    committed: bool = False  # the file was renamed into place

    def unsynced_fds(self) -> list[tuple[int, Path]]:
        return [(self.log_fd, self.log_path), (self.tmp_fd, self.tmp)]

    def close(self) -> None:
        for name in ("log_fd", "tmp_fd"):
            fd = getattr(self, name)
            if fd >= 0:
                setattr(self, name, -1)
                os.close(fd)


def stage_summary(session_dir: Path, summary: dict) -> PendingSummary:
    """Append ``summary`` to ``eviction-summaries.jsonl`` and write its file as a temp file,
    neither synced: the caller syncs them (with its other files), closes them, then calls
    :func:`commit_summary` (or :func:`undo_summary`)."""
    derived = ensure_private_dir(Path(session_dir) / DERIVED_DIR)
    log_path = derived / EVICTION_LOG
    path = derived / f"{EVICTION_SUMMARY_PREFIX}{uuid.uuid4().hex}.json"
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:12]}")
    log_fd, _created = open_private_append(log_path)
    pending = PendingSummary(log_path, -1, tmp, path, log_fd=log_fd)
    try:
        pending.log_length = os.fstat(log_fd).st_size
        write_all(log_fd, orjson.dumps(summary, option=orjson.OPT_APPEND_NEWLINE), log_path)
        try:
            pending.tmp_fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_NOFOLLOW | _O_CLOEXEC, 0o600)
        except OSError as exc:
            raise StoreIOError.from_os_error("create", tmp, exc) from exc
        write_all(pending.tmp_fd, orjson.dumps(summary, option=orjson.OPT_INDENT_2), tmp)
    except BaseException:
        undo_summary(pending)
        raise
    return pending


def commit_summary(pending: PendingSummary) -> None:
    """Rename the synced summary file into place (the caller syncs its directory)."""
    pending.close()
    try:
        os.replace(pending.tmp, pending.path)
    except OSError as exc:
        raise StoreIOError.from_os_error("rename", pending.path, exc) from exc
    pending.committed = True


def undo_summary(pending: PendingSummary) -> None:
    """Take back a staged summary whose eviction did not happen (best effort, logged)."""
    pending.close()
    _remove(pending.path if pending.committed else pending.tmp)
    if pending.log_length >= 0:
        _truncate_path(pending.log_path, pending.log_length)


def settle_summary_file(path: Path) -> None:
    """Make the name of a summary file renamed in unsynced (a cap rewrite's) durable, then prune
    the older files. A failure is logged: the summary's line, synced before the file's rename,
    keeps it whatever becomes of the file's name."""
    try:
        fsync_dir(path.parent)
    except StoreIOError as exc:
        logger.warning("could not sync the directory of eviction summary %s (its line keeps it): %s", path, exc)
        return
    prune_summary_files(path.parent, keep=path)


def write_summary(session_dir: Path, summary: dict) -> Path:
    """Write ``summary`` durably (its line, then its file), then prune the old files; return the
    file's path."""
    pending = stage_summary(session_dir, summary)
    try:
        sync_fds(pending.unsynced_fds())
        commit_summary(pending)
        fsync_dir(pending.path.parent)
    except BaseException:
        undo_summary(pending)
        raise
    prune_summary_files(pending.path.parent, keep=pending.path)
    return pending.path


def sync_fds(fds: Iterable[tuple[int, Path]]) -> None:
    """``fdatasync`` every descriptor of ``fds`` (each with its path, for errors), after starting
    the writeback of all of them (``posix_fadvise``, a hint where there is one): the disk gets
    them as one batch and the later syncs find little left to do, instead of each sync waiting
    for its own round trip (measured on ext4: 4 small files 25 ms one after another, 8 ms so)."""
    fds = list(fds)
    advise = getattr(os, "posix_fadvise", None)
    if advise is not None and len(fds) > 1:
        for fd, _path in fds:
            try:
                # Linux starts writing back the dirty pages (pages not yet clean stay cached).
                advise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            except OSError as exc:  # a hint only: the syncs below are what count
                logger.debug("posix_fadvise: %s", exc)
                break
    for fd, path in fds:
        try:
            os.fdatasync(fd)
        except OSError as exc:
            raise StoreIOError.from_os_error("fdatasync", path, exc) from exc


# --------------------------------------------------------------------------------------------
# Pruning


_warned: set[str] = set()


def prune_summary_files(derived: Path, keep: Optional[Path] = None) -> None:
    """Keep the newest ``EVICTION_SUMMARY_FILES`` summary files (by time, then name), without
    losing a summary (see the module docstring). Failures are logged: the files stay."""
    try:
        entries = [
            e
            for e in os.scandir(derived)
            if e.name.startswith(EVICTION_SUMMARY_PREFIX)
            and e.name.endswith(".json")
            and e.is_file(follow_symlinks=False)
        ]
        entries.sort(key=lambda e: (e.stat(follow_symlinks=False).st_mtime_ns, e.name))
    except OSError as exc:
        logger.warning("could not list %s to prune old eviction summaries: %s", derived, exc)
        return
    old = [e for e in entries[:-EVICTION_SUMMARY_FILES] if keep is None or e.path != str(keep)]
    if not old:
        return
    removable: list[str] = []
    carried: list[tuple[str, dict]] = []
    for entry in old:
        content = _summary_of(Path(entry.path))
        if content is None:
            continue
        if content.get("writer") == WRITER:
            removable.append(entry.path)  # its line went to the JSON Lines file before it
        else:
            carried.append((entry.path, content))
    if carried:
        try:
            _carry(derived / EVICTION_LOG, carried)
        except StoreIOError as exc:
            logger.warning(
                "could not carry %d eviction summaries into %s (the files stay): %s",
                len(carried),
                derived / EVICTION_LOG,
                exc,
            )
        else:
            removable.extend(path for path, _content in carried)
    for path in removable:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            logger.warning("could not remove old eviction summary %s: %s", path, exc)


def _summary_of(path: Path) -> Optional[dict]:
    """The summary a file holds, or ``None`` (logged once) when it is not a JSON object."""
    try:
        data = read_no_follow(path)
        content: Any = orjson.loads(data) if data is not None else None
    except (StoreIOError, orjson.JSONDecodeError) as exc:
        content = None
        reason: object = exc
    else:
        reason = "not a JSON object"
    if isinstance(content, dict):
        return content
    if str(path) not in _warned:
        _warned.add(str(path))
        logger.warning("keeping eviction summary %s, which cannot be carried into %s: %s", path, EVICTION_LOG, reason)
    return None


def _carry(log_path: Path, carried: list[tuple[str, dict]]) -> None:
    """Append each summary another writer left, tagged with its file name, and sync; a summary
    already carried (a crash between the sync and the removal) is not carried twice."""
    already = _carried_names(log_path)
    lines = b"".join(
        orjson.dumps({**content, CARRIED_FROM: os.path.basename(path)}, option=orjson.OPT_APPEND_NEWLINE)
        for path, content in carried
        if os.path.basename(path) not in already
    )
    if not lines:
        return
    fd, _created = open_private_append(log_path)
    try:
        length = os.fstat(fd).st_size
        try:
            write_all(fd, lines, log_path)
            os.fdatasync(fd)
        except (StoreIOError, OSError) as exc:
            _truncate(fd, length, log_path)
            if isinstance(exc, OSError):
                raise StoreIOError.from_os_error("fdatasync", log_path, exc) from exc
            raise
    finally:
        os.close(fd)


_TAIL_BYTES = 1 << 20


def _carried_names(log_path: Path) -> set[str]:
    """The files carried by the last lines of the JSON Lines file (a carry interrupted before
    its files were removed wrote its lines at the end, and is retried at the very next prune)."""
    try:
        with open(log_path, "rb") as fh:
            size = fh.seek(0, os.SEEK_END)
            fh.seek(max(0, size - _TAIL_BYTES))
            tail = fh.read()
    except FileNotFoundError:
        return set()
    except OSError as exc:
        raise StoreIOError.from_os_error("read", log_path, exc) from exc
    names = set()
    for line in tail.split(b"\n"):
        if CARRIED_FROM.encode() in line:
            try:
                name = orjson.loads(line).get(CARRIED_FROM)
            except (orjson.JSONDecodeError, AttributeError):
                continue
            if isinstance(name, str):
                names.add(name)
    return names


def _truncate(fd: int, length: int, path: Path) -> None:
    try:
        os.ftruncate(fd, length)
    except OSError as exc:
        logger.warning("could not take back a partial line of %s: %s", path, exc)


def _truncate_path(path: Path, length: int) -> None:
    try:
        fd = os.open(path, os.O_WRONLY | _O_NOFOLLOW | _O_CLOEXEC)
    except OSError as exc:
        logger.warning("could not take back the last line of %s: %s", path, exc)
        return
    try:
        _truncate(fd, length, path)
    finally:
        os.close(fd)


def _remove(path: Path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        logger.warning("could not remove %s: %s", path, exc)
