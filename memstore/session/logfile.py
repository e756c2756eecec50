"""``events.jsonl`` as a file: its descriptors, the append buffer, positioned reads, torn-tail
repair, and the atomic replacement a cap rewrite makes.

:class:`LogFile` knows bytes and lines, not events: what a line means is decided in
``events.py``, and what the session does with it in ``writer.py``.
"""

from __future__ import annotations

import logging
import os
import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Optional

import orjson

from .. import events as ev
from .. import faults
from ..errors import StoreIOError
from ..events import Record
from ..fsio import open_private_append, open_read_no_follow, write_all, write_new_file
from ..layout import EVENTS_FILE, TORN_INFIX, torn_name

logger = logging.getLogger("memstore")

TAIL_BYTES = 256
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_READ_CHUNK = 1 << 20


class LogFile:
    """The canonical log of one session: an ``O_APPEND`` descriptor for writing, a separate one
    for positioned reads, and the buffer of whole lines not yet written.

    ``length`` is the size of the file on disk (the buffer not included) and ``tail`` its last
    bytes, which the index records to recognize the log on the next open.
    """

    def __init__(self, session_dir: Path):
        self.dir = session_dir
        self.path = session_dir / EVENTS_FILE
        self.fd = -1
        self.rfd = -1
        self.length = 0
        self.buffer = bytearray()
        self.tail = b""
        self.unsynced = False
        # Bytes written through this object, ever: unlike ``length`` it never moves back (a cap
        # rewrite shortens the file), so it tells whether a given append has been written.
        self.written = 0

    # -- descriptors -----------------------------------------------------------------------

    def open(self) -> bool:
        """Open the append and read descriptors; return whether the log was created (which
        synced the session directory)."""
        self.fd, created = open_private_append(self.path)
        rfd = open_read_no_follow(self.path)
        if rfd is None:
            raise StoreIOError("open", self.path, "disappeared while opening")
        self.rfd = rfd
        self.length = os.fstat(self.fd).st_size
        return created

    def open_readonly(self) -> None:
        """Open only the read descriptor (for a reader that never writes);
        :class:`FileNotFoundError` if there is no log."""
        rfd = open_read_no_follow(self.path)
        if rfd is None:
            raise FileNotFoundError(self.path)
        self.rfd = rfd
        self.length = os.fstat(rfd).st_size

    def detach(self) -> list[int]:
        """Give up the descriptors without closing them (the caller closes them, for instance
        off the agent's thread: closing the last descriptor of a replaced log frees its blocks)."""
        fds = [fd for fd in (self.fd, self.rfd) if fd >= 0]
        self.fd = self.rfd = -1
        return fds

    def close(self) -> None:
        for name in ("fd", "rfd"):
            fd = getattr(self, name)
            if fd >= 0:
                setattr(self, name, -1)
                try:
                    os.close(fd)
                except OSError as exc:
                    # After fdatasync a close error says nothing about the data.
                    logger.debug("closing %s: %s", self.path, exc)

    # -- reading ---------------------------------------------------------------------------

    def pread(self, offset: int, length: int) -> bytes:
        try:
            return os.pread(self.rfd, length, offset)
        except OSError as exc:
            raise StoreIOError.from_os_error("read", self.path, exc) from exc

    def reader(self) -> BinaryIO:
        """A new buffered reader on the log's current inode (with its own file offset)."""
        fd = open_read_no_follow(self.path)
        if fd is None:
            raise StoreIOError("read", self.path, "the log disappeared")
        return os.fdopen(fd, "rb", buffering=_READ_CHUNK)

    def find_newline(self, start: int) -> int:
        """Position of the first ``\\n`` at or after ``start`` (``-1`` if none)."""
        pos = start
        while pos < self.length:
            chunk = self.pread(pos, min(1 << 16, self.length - pos))
            found = chunk.find(b"\n")
            if found >= 0:
                return pos + found
            pos += len(chunk)
        return -1

    def rfind_newline(self, floor: int, end: int) -> int:
        """Position of the last ``\\n`` in ``[floor, end)``, or ``floor - 1`` if there is none."""
        pos = end
        while pos > floor:
            size = min(1 << 16, pos - floor)
            chunk = self.pread(pos - size, size)
            found = chunk.rfind(b"\n")
            if found >= 0:
                return pos - size + found
            pos -= size
        return floor - 1

    def lines(self, start: int, end: int) -> Iterator[tuple[bytes, int, int]]:
        """``(line, line_start, line_end)`` for every complete line in ``[start, end)``, the line
        without its ``\\n`` (``line_end`` is past it); a partial last line is not yielded. Reads
        with ``pread`` in large chunks, so several iterations can share the descriptor."""
        pos = start
        line_start = start
        carry: list[bytes] = []
        while pos < end:
            chunk = self.pread(pos, min(_READ_CHUNK, end - pos))
            if not chunk:
                return
            pos += len(chunk)
            pieces = chunk.split(b"\n")
            last = pieces.pop()  # the bytes after the chunk's last newline (maybe a partial line)
            if pieces and carry:
                carry.append(pieces[0])
                pieces[0] = b"".join(carry)
                carry = []
            for line in pieces:
                line_end = line_start + len(line) + 1
                yield line, line_start, line_end
                line_start = line_end
            if last:
                carry.append(last)

    def lines_matching(self, start: int, end: int, pattern: re.Pattern[bytes]) -> Iterator[bytes]:
        """Every complete line in ``[start, end)`` in which ``pattern`` (which must not match a
        ``\\n``) matches, without its ``\\n``, in log order. The search runs over whole chunks;
        only the lines it finds are cut out, so a scan for a rare pattern costs about a read."""
        pos = start
        carry = b""
        while pos < end:
            chunk = self.pread(pos, min(_READ_CHUNK, end - pos))
            if not chunk:
                return
            pos += len(chunk)
            data = carry + chunk if carry else chunk
            last = data.rfind(b"\n")
            if last < 0:
                carry = data
                continue
            line_end = -1
            for match in pattern.finditer(data, 0, last + 1):
                if match.start() < line_end:
                    continue  # in the line just yielded
                line_start = data.rfind(b"\n", 0, match.start()) + 1
                line_end = data.find(b"\n", match.start())
                yield data[line_start:line_end]
            carry = data[last + 1 :]

    def lines_matching_backward(self, start: int, end: int, pattern: re.Pattern[bytes]) -> Iterator[bytes]:
        """:meth:`lines_matching` newest first: every complete line in ``[start, end)`` (``start``
        a line's start) in which ``pattern`` (which must not match a ``\\n``) matches, without
        its ``\\n``, from the last to the first. Reads backwards from ``end`` in large chunks, so
        a caller that needs only the last few such lines reads little more than what holds them."""
        pos = end
        carry = b""  # the bytes after an earlier chunk's first newline: a line that starts before
        partial_tail = True  # until a newline is seen, the bytes read end a partial last line
        while pos > start:
            size = min(_READ_CHUNK, pos - start)
            chunk = self.pread(pos - size, size)
            if len(chunk) != size:
                raise StoreIOError("read", self.path, f"short read at offset {pos - size} (the log shrank)")
            pos -= size
            data = chunk + carry if carry else chunk
            if partial_tail:
                data = data[: data.rfind(b"\n") + 1]
                if not data:
                    continue
                partial_tail = False
            # Lines before ``edge`` may begin in the previous chunk: they wait for it.
            edge = data.find(b"\n") + 1 if pos > start else 0
            carry = data[:edge]
            yielded_from = len(data)
            for match in reversed(list(pattern.finditer(data, edge))):
                if match.start() >= yielded_from:
                    continue  # in the line just yielded
                yielded_from = data.rfind(b"\n", 0, match.start()) + 1
                yield data[yielded_from : data.find(b"\n", match.start())]

    def records(self, start: int, end: int) -> Iterator[Record]:
        """Decode the valid records in ``[start, end)``; lines that fail decoding are skipped."""
        pos = start
        leftover = b""
        while pos < end:
            chunk = self.pread(pos, min(_READ_CHUNK, end - pos))
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

    def first_record(self) -> Optional[tuple[int, int, Record]]:
        """``(offset, length, record)`` of the log's first valid record."""
        pos = 0
        while pos < self.length:
            end = self.find_newline(pos)
            if end < 0:
                return None
            record = ev.decode_line(self.pread(pos, end + 1 - pos))
            if record is not None:
                return pos, end + 1 - pos, record
            pos = end + 1
        return None

    def head(self) -> ev.LogHead:
        """What the log's first line says about evicted turns (see ``events.decode_log_head``)."""
        end = self.find_newline(0)
        if end < 0:
            return ev.LogHead(None, None)
        return ev.decode_log_head(self.pread(0, end + 1))

    def torn_files(self) -> list[Path]:
        """The torn tails cut from this log and kept beside it."""
        try:
            return sorted(p for p in self.dir.glob(f"{EVENTS_FILE}{TORN_INFIX}*") if not p.is_symlink() and p.is_file())
        except OSError as exc:
            logger.warning("could not list the torn tails of %s: %s", self.path, exc)
            return []

    def read_tail(self, end: int) -> bytes:
        """The ``TAIL_BYTES`` bytes that end at ``end``."""
        return self.pread(max(0, end - TAIL_BYTES), min(TAIL_BYTES, end))

    # -- torn tails ------------------------------------------------------------------------

    def repair_tail(self, floor: int) -> Optional[Path]:
        """Cut a torn tail (a partial last line, or trailing lines that are not JSON, such as a
        run of NUL bytes) back to the last complete line at or after ``floor``. The cut bytes are
        saved beside the log first, never discarded; returns where, or ``None`` if nothing was
        cut."""
        cut = self._last_good_end(floor)
        if cut >= self.length:
            return None
        torn = self.pread(cut, self.length - cut)
        keep = self.dir / torn_name(cut, ev.utc_now().replace(":", ""))
        kept = write_new_file(keep, torn)
        try:
            os.ftruncate(self.fd, cut)
            os.fsync(self.fd)
        except OSError as exc:
            raise StoreIOError.from_os_error("truncate torn tail of", self.path, exc) from exc
        logger.warning("cut a torn tail of %d bytes from %s (kept in %s)", len(torn), self.path, kept)
        self.length = cut
        return kept

    def _last_good_end(self, floor: int) -> int:
        end = self.length
        if end <= floor:
            return end
        cut = self.rfind_newline(floor, end) + 1
        while cut > floor:
            line_start = self.rfind_newline(floor, cut - 1) + 1
            line = self.pread(line_start, cut - line_start)
            if not line.strip() or _is_json(line):
                break
            cut = line_start
        return max(cut, floor)

    # -- writing ---------------------------------------------------------------------------

    def write_out(self, *, sync: bool) -> None:
        """Write the buffer with one ``write()`` of whole lines, then ``fdatasync`` if asked.

        On a failed write the file is truncated back to its previous length; either failure
        raises :class:`StoreIOError`, and the caller must fail the session closed (after a
        failed sync the kernel may have dropped the pages, and a retry could lie).
        """
        buffer = self.buffer
        if buffer:
            try:
                write_all(self.fd, buffer, self.path)
            except StoreIOError:
                try:
                    os.ftruncate(self.fd, self.length)
                except OSError as exc:
                    logger.warning(
                        "could not truncate %s back after a failed write (the next open cuts it): %s", self.path, exc
                    )
                raise
            self.length += len(buffer)
            self.written += len(buffer)
            self.tail = (self.tail + buffer[-TAIL_BYTES:])[-TAIL_BYTES:]
            del buffer[:]
            self.unsynced = True
        if sync and self.unsynced:
            try:
                os.fdatasync(self.fd)
            except OSError as exc:
                raise StoreIOError.from_os_error("fdatasync", self.path, exc) from exc
            self.unsynced = False

    def write_replacement(self, start: int, head: bytes) -> Replacement:
        """Write ``head`` followed by the log's bytes from ``start`` on to a new private temp file
        beside the log, not synced (the caller syncs it with its other files, then
        :meth:`install_replacement` or :meth:`discard_replacement`)."""
        tmp = self.dir / f".{EVENTS_FILE}.cap-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        try:
            # (Its name needs no directory sync: it is renamed, and that rename synced.)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_NOFOLLOW | _O_CLOEXEC, 0o600)
        except OSError as exc:
            raise StoreIOError.from_os_error("create", tmp, exc) from exc
        replacement = Replacement(tmp, fd)
        try:
            write_all(fd, head, tmp)
            faults.check("cap.copy", path=tmp)
            pos = start
            while pos < self.length:
                try:
                    chunk = os.pread(self.rfd, min(_READ_CHUNK, self.length - pos), pos)
                except OSError as exc:
                    raise StoreIOError.from_os_error("read", self.path, exc) from exc
                if not chunk:
                    raise StoreIOError("cap rewrite", self.path, "log shrank while copying")
                write_all(fd, chunk, tmp)
                faults.check("cap.copy", path=tmp)
                pos += len(chunk)
        except BaseException:
            self.discard_replacement(replacement)
            raise
        return replacement

    def install_replacement(self, replacement: Replacement) -> None:
        """Rename the synced replacement over the log (the caller syncs the directory and
        reopens the descriptors)."""
        replacement.close()
        try:
            os.replace(replacement.tmp, self.path)
        except OSError as exc:
            raise StoreIOError.from_os_error("cap rewrite", self.path, exc) from exc

    def discard_replacement(self, replacement: Replacement) -> None:
        """Remove a replacement that is not to be installed (logged if it cannot be)."""
        replacement.close()
        try:
            os.unlink(replacement.tmp)
        except FileNotFoundError:
            pass
        except OSError as exc:
            logger.warning("could not remove the cap rewrite's temp file %s: %s", replacement.tmp, exc)


@dataclass
class Replacement:
    """A copy of the log a cap rewrite made (see :meth:`LogFile.write_replacement`), its
    descriptor open until it is installed or discarded."""

    tmp: Path
    fd: int

    def close(self) -> None:
        fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)


_SEQ = re.compile(rb'"seq":(\d{1,19})')


def torn_seq_floor(*paths: Path) -> int:
    """One past the largest ``seq`` written in the given torn-tail files (0 if none): those
    seqs were handed out, even if never acknowledged, and are not given again."""
    floor = 0
    for path in paths:
        try:
            data = path.read_bytes()
        except OSError as exc:
            logger.warning("could not read torn bytes %s for their seqs: %s", path, exc)
            continue
        for line in data.split(b"\n"):
            # Only the envelope's seq: its keys come before the event (memstore writes them so),
            # and the event may hold "seq" keys of its own.
            match = _SEQ.search(line.split(b'"event":', 1)[0])
            if match is not None and int(match.group(1)) < ev.SEQ_FLOOR_MAX:
                floor = max(floor, int(match.group(1)) + 1)
    return floor


def _is_json(line: bytes) -> bool:
    try:
        orjson.loads(line)
        return True
    except orjson.JSONDecodeError:
        return False


def close_fds(fds: list[int], path: Path) -> None:
    """Close descriptors :meth:`LogFile.detach` gave up (errors logged: after ``fdatasync`` a
    close error says nothing about the data)."""
    for fd in fds:
        try:
            os.close(fd)
        except OSError as exc:
            logger.debug("closing a replaced descriptor of %s: %s", path, exc)
