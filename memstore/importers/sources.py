"""Finding the source files under the paths a user named, telling what each one is, and reading
its complete lines.

Only what the user named is read: directories are walked without following symlinks (a
symlink inside the tree is reported and left alone), files are opened with ``O_NOFOLLOW`` and
``O_NONBLOCK`` (a FIFO or device is refused, never waited on), and the store itself is never
walked. Sources are opened read-only; where the kernel allows it, without updating their
access time.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import orjson

CHUNK = 1 << 20
HEAD_FINGERPRINT = 64 * 1024
TAIL_FINGERPRINT = 4 * 1024
SNIFF_BYTES = 16 << 20  # how far to look for the line that names the session
SNIFF_LINES = 256

_O_READ = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NONBLOCK", 0)
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_NOATIME = getattr(os, "O_NOATIME", 0)

CODEX_TYPES = frozenset({"session_meta", "response_item", "event_msg", "turn_context", "compacted"})
EXEC_TYPES = frozenset(
    {
        "thread.started",
        "turn.started",
        "turn.completed",
        "turn.failed",
        "item.started",
        "item.updated",
        "item.completed",
        "session.created",
    }
)
CLAUDE_TYPES = frozenset(
    {
        "user",
        "assistant",
        "system",
        "summary",
        "file-history-snapshot",
        "queue-operation",
        "progress",
        "custom-title",
        "last-prompt",
        "attachment",
    }
)
_AGENT_FILE = re.compile(r"^agent-(.+)\.jsonl$")
_UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")


def display_path(path: str) -> str:
    """``path`` as text JSON can hold: a file name's bytes that are not UTF-8 (which Python
    carries as lone surrogates) written as ``\\xNN``. Unchanged for every UTF-8 name."""
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        return path.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    return path


_ESCAPED_BYTE = re.compile(r"\\x([89a-f][0-9a-f])")  # only bytes >= 0x80 are not UTF-8 on their own


def path_of_display(text: str) -> str:
    """The file name :func:`display_path` shows as ``text`` (its ``\\xNN`` back as bytes)."""
    if "\\x" not in text:
        return text
    return _ESCAPED_BYTE.sub(lambda m: chr(0xDC00 + int(m.group(1), 16)), text)


@dataclass
class SourceFile:
    """A file to import: ``path`` absolute as named or walked (never resolved through a
    symlink below what was named); ``explicit`` when the user named the file itself. ``name``
    is ``path`` as stored and reported (see :func:`display_path`)."""

    path: str
    explicit: bool
    follow: bool = False  # the user named a symlink: opening it may follow that one link

    @property
    def name(self) -> str:
        return display_path(self.path)


@dataclass
class Sniff:
    """What a source is: ``kind`` ("codex", "codex-exec", "claude" or ``None``), the memstore
    session id it imports into, and the parser context; ``reason`` when either is missing."""

    kind: Optional[str] = None
    session_id: Optional[str] = None
    context: dict = field(default_factory=dict)
    reason: Optional[str] = None
    complete_lines: int = 0


def discover(paths: list, store_root: Path, problem: Callable[[str, Optional[int], str], None]) -> list[SourceFile]:
    """The ``*.jsonl`` files under ``paths`` (a file named directly is taken whatever its name),
    sorted by path within each named path."""
    found: list[SourceFile] = []
    try:
        store = os.stat(store_root)
        store_key = (store.st_dev, store.st_ino)
    except OSError:
        store_key = None
    store_real = os.path.realpath(store_root)
    for raw in paths:
        top = os.path.abspath(os.path.expanduser(os.fspath(raw)))
        try:
            st = os.stat(top)
        except OSError as exc:
            problem(top, None, f"cannot read: {exc.strerror or exc}")
            continue
        real = os.path.realpath(top)
        if real == store_real or real.startswith(store_real + os.sep):
            problem(top, None, "is inside the memstore store being imported into; not imported")
            continue
        if stat.S_ISREG(st.st_mode):
            found.append(SourceFile(top, True, follow=os.path.islink(top)))
        elif stat.S_ISDIR(st.st_mode):
            found.extend(_walk(top, store_key, problem))
        else:
            problem(top, None, "not a regular file or directory")
    return found


def _walk(top: str, store_key: Optional[tuple], problem) -> list[SourceFile]:
    files: list[SourceFile] = []
    stack = [top]
    while stack:
        directory = stack.pop()
        try:
            with os.scandir(directory) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError as exc:
            problem(directory, None, f"cannot list: {exc.strerror or exc}")
            continue
        subdirs = []
        plain = {e.name for e in entries}
        for entry in entries:
            try:
                if entry.is_symlink():
                    # Not even stat()ed through: where it points is outside what was named.
                    problem(entry.path, None, "symlink not followed (only what was named is read)")
                    continue
                if entry.is_dir(follow_symlinks=False):
                    st = entry.stat(follow_symlinks=False)
                    if store_key is not None and (st.st_dev, st.st_ino) == store_key:
                        continue  # the store itself: never import memstore's own logs
                    subdirs.append(entry.path)
                elif entry.is_file(follow_symlinks=False):
                    if entry.name.endswith(".jsonl"):
                        files.append(SourceFile(entry.path, False))
                    elif entry.name.endswith(".jsonl.zst") and entry.name[:-4] not in plain:
                        problem(
                            entry.path,
                            None,
                            "compressed rollout (.jsonl.zst) not imported: no zstd decoder "
                            "is installed; decompress it (zstd -d) next to it to import it",
                        )
            except OSError as exc:
                problem(entry.path, None, f"cannot read: {exc.strerror or exc}")
        stack.extend(reversed(subdirs))
    files.sort(key=lambda f: f.path)
    return files


def open_source(source: SourceFile) -> int:
    """A read-only descriptor on a regular source file (``OSError`` otherwise)."""
    flags = _O_READ | (0 if source.follow else _O_NOFOLLOW)
    try:
        fd = os.open(source.path, flags | _O_NOATIME)
    except PermissionError:
        fd = os.open(source.path, flags)  # O_NOATIME needs ownership of the file
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(0, "not a regular file")
    except BaseException:
        os.close(fd)
        raise
    return fd


def iter_lines(fd: int, start: int, limit: int) -> Iterator[tuple[bytes, int]]:
    """Each complete line (without its newline) of ``[start, limit)`` with the offset just past
    its newline. A last line without a newline is not yielded: it may still be being written."""
    offset = start
    pos = start
    pieces: list[bytes] = []
    while pos < limit:
        data = os.pread(fd, min(CHUNK, limit - pos), pos)
        if not data:
            break
        pos += len(data)
        newline = data.find(b"\n")
        if newline < 0:
            pieces.append(data)
            continue
        if pieces:
            pieces.append(data[:newline])
            line = b"".join(pieces)
            pieces = []
            offset += len(line) + 1
            yield line, offset
            data = data[newline + 1 :]
        lines = data.split(b"\n")
        tail = lines.pop()
        for line in lines:
            offset += len(line) + 1
            yield line, offset
        if tail:
            pieces.append(tail)


def read_at(fd: int, size: int, offset: int) -> bytes:
    """The one read of the bytes an import parses (``os.pread``): every byte the parser is fed,
    and every byte the consumed-bytes fingerprint describes, comes from these reads."""
    return os.pread(fd, size, offset)


def sample(fd: int, offset: int) -> tuple[bytes, bytes]:
    """The bytes the fingerprint of ``[0, offset)`` covers, as the file holds them now: its
    first 64 KiB and its last 4 KiB."""
    head = os.pread(fd, min(HEAD_FINGERPRINT, offset), 0)
    tail_start = max(0, offset - TAIL_FINGERPRINT)
    tail = os.pread(fd, offset - tail_start, tail_start)
    return head, tail


def fingerprint(fd: int, offset: int) -> tuple[int, str, str]:
    """(head length, sha256 of the first 64 KiB of ``[0, offset)``, sha256 of its last 4 KiB)
    as the file holds them now: enough to tell a source that grew from one that was rewritten.
    (What an import saves is :class:`ConsumedBytes`' fingerprint, of what it parsed.)"""
    head, tail = sample(fd, offset)
    return len(head), hashlib.sha256(head).hexdigest(), hashlib.sha256(tail).hexdigest()


class ConsumedBytes:
    """The fingerprint of the bytes an import consumed, built from the very reads the parser
    was fed, never from a later read of the file: a source rewritten while it is read is then
    described as it was parsed, so the next import sees that the file differs.

    It starts from the already consumed prefix ``[0, offset)`` (its head and tail samples, as
    verified against the saved fingerprint), and ``consume`` is given each further consumed
    byte, in order. ``run_checksum`` is the CRC-32 of the bytes consumed by this run alone (with
    their length, what :func:`still_holds` compares: a change check, not a defence against
    forgery, and cheap enough to run over every byte an import reads).
    """

    __slots__ = ("head", "tail", "offset", "start", "run_checksum")

    def __init__(self, offset: int = 0, head: bytes = b"", tail: bytes = b""):
        self.offset = self.start = offset
        self.head = head
        self.tail = tail
        self.run_checksum = 0

    def consume(self, data: bytes) -> None:
        if not data:
            return
        if len(self.head) < HEAD_FINGERPRINT:
            self.head += data[: HEAD_FINGERPRINT - len(self.head)]
        if len(data) >= TAIL_FINGERPRINT:
            self.tail = data[-TAIL_FINGERPRINT:]
        else:
            self.tail = (self.tail + data)[-TAIL_FINGERPRINT:]
        self.run_checksum = zlib.crc32(data, self.run_checksum)
        self.offset += len(data)

    def fingerprint(self) -> tuple[int, str, str]:
        """(head length, head sha256, tail sha256) of ``[0, offset)`` as consumed."""
        return len(self.head), hashlib.sha256(self.head).hexdigest(), hashlib.sha256(self.tail).hexdigest()


def still_holds(fd: int, consumed: ConsumedBytes) -> bool:
    """Whether the file still holds, at ``[consumed.start, consumed.offset)``, the bytes this
    run consumed (read again and hashed): false when the source was rewritten while it was
    being imported."""
    checksum = 0
    pos = consumed.start
    while pos < consumed.offset:
        data = os.pread(fd, min(CHUNK, consumed.offset - pos), pos)
        if not data:
            return False
        checksum = zlib.crc32(data, checksum)
        pos += len(data)
    return checksum == consumed.run_checksum


def _head_lines(fd: int, limit: int) -> Iterator[bytes]:
    """The complete lines of ``[0, limit)``, read in a window that starts at 64 KiB and grows
    only while a line does not fit: telling a source costs one small read, whatever its size."""
    offset, window = 0, HEAD_FINGERPRINT
    while offset < limit:
        end = min(limit, offset + window)
        last = None
        for line, stop in iter_lines(fd, offset, end):
            last = stop
            yield line
        if last is not None:
            offset = last
        elif end >= limit:
            return
        else:
            window *= 4


def has_line_after(fd: int, offset: int, limit: int) -> bool:
    """Whether ``[offset, limit)`` holds a complete line."""
    for _ in iter_lines(fd, offset, limit):
        return True
    return False


def sniff(fd: int, size: int, source: SourceFile) -> Sniff:
    """Tell what a source is from its first lines, and which session it imports into.

    Codex rollouts are named ``codex-<session_meta.id>`` (the legacy header's ``id``); an
    ``exec --json`` stream ``codex-<thread.started.thread_id>``; a Claude transcript
    ``claude-<sessionId>``; a Claude sub-agent file ``claude-<sessionId>-agent-<agentId>``.
    """
    result = Sniff()
    name = os.path.basename(source.path)
    agent_match = _AGENT_FILE.match(display_path(name))
    for line in _head_lines(fd, min(size, SNIFF_BYTES)):
        result.complete_lines += 1
        if result.complete_lines > SNIFF_LINES and result.kind is None:
            break
        try:
            obj = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        if type(obj) is not dict:
            continue
        kind = obj.get("type")
        if result.kind in (None, "codex") and "payload" in obj and kind in CODEX_TYPES:
            result.kind = "codex"
            payload = obj["payload"]
            if kind == "session_meta" and isinstance(payload, dict) and _id(payload.get("id")):
                result.session_id = f"codex-{payload['id']}"
                return result
        elif (
            result.kind is None
            and "type" not in obj
            and "payload" not in obj
            and _id(obj.get("id"))
            and "timestamp" in obj
            and (name.startswith("rollout-") or "git" in obj or "instructions" in obj)
        ):
            result.kind = "codex"  # a legacy rollout's bare header line
            result.session_id = f"codex-{obj['id']}"
            return result
        elif result.kind in (None, "codex-exec") and kind in EXEC_TYPES:
            result.kind = "codex-exec"
            thread = (
                obj.get("thread_id")
                if kind == "thread.started"
                else obj.get("session_id")
                if kind == "session.created"
                else None
            )
            if _id(thread):
                result.session_id = f"codex-{thread}"
                return result
        elif result.kind in (None, "claude") and (kind in CLAUDE_TYPES or "sessionId" in obj) and "payload" not in obj:
            result.kind = "claude"
            session = obj.get("sessionId")
            if _id(session):
                agent = (
                    agent_match.group(1)
                    if agent_match
                    else obj.get("agentId")
                    if obj.get("isSidechain") is True and _id(obj.get("agentId"))
                    else None
                )
                # Claude names each file after its session (a sub-agent's folder after its parent's):
                # the name wins over lines that may have been copied from another session.
                named = _named_session(source.path, agent is not None)
                if named:
                    session = named
                result.context = {"claude_session": session}
                if agent:
                    result.context["agent_id"] = agent
                    result.session_id = f"claude-{session}-agent-{agent}"
                else:
                    result.session_id = f"claude-{session}"
                return result
    if result.kind == "claude" and agent_match:
        # A sub-agent file whose lines do not name the session: <sessionId>/subagents/agent-<id>.jsonl
        parts = Path(source.path).parts
        if len(parts) >= 3 and parts[-2] == "subagents" and _id(display_path(parts[-3])):
            session = display_path(parts[-3])
            result.context = {"claude_session": session, "agent_id": agent_match.group(1)}
            result.session_id = f"claude-{session}-agent-{agent_match.group(1)}"
            return result
    if result.kind is None:
        result.reason = "unrecognized" if result.complete_lines else "empty"
    else:
        result.reason = "no session id"
    return result


def _named_session(path: str, subagent: bool) -> Optional[str]:
    """The session id a Claude transcript's place gives: ``<sessionId>.jsonl``, or
    ``<sessionId>/subagents/agent-<id>.jsonl`` for a sub-agent; ``None`` when not a UUID."""
    parts = Path(path).parts
    if subagent:
        name = parts[-3] if len(parts) >= 3 and parts[-2] == "subagents" else ""
    else:
        name = parts[-1][:-6] if parts[-1].endswith(".jsonl") else ""
    return name if _UUID.fullmatch(name) else None


def _id(value) -> bool:
    return isinstance(value, str) and 0 < len(value) <= 200 and value.strip() == value
