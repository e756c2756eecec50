"""The store's tombstones: sessions that were removed on purpose and must not come back.

An import recreates any session whose source it finds. When retention ages out an imported
session, or a user forgets one, the next import would resurrect it, and the two would fight
for ever. A tombstone stops that: ``<root>/tombstones.jsonl`` lists the sessions removed on
purpose, and an import skips (and reports) a source whose session is tombstoned.

The file is an append-only JSON-lines log, 0600, never followed through a symlink:

    {"op": "add", "session_id": ..., "reason": "retention" | "forget", "at": ...,
     "source": {"path": ..., "fingerprint": {...}} | null}
    {"op": "remove", "session_id": ..., "at": ...}          (an undo: the session may come back)

The last line about a session decides. What this module guarantees:

- **Crash-safe.** Each line is written with one ``write()`` under an exclusive ``flock`` on
  the file and ``fdatasync``ed before :meth:`Tombstones.record` returns; callers record the
  tombstone *before* the removal is final, so a removal is never without its tombstone.
- **A torn last line is ignored**: a line without its newline is the one being written (or one
  a crash cut), so the removal it announced had not happened (the removal waits for the sync).
  The next append cuts it off first.
- **Fails closed.** Any other damage (a complete line that is not a tombstone, an unreadable
  file, a symlink or directory in its place) raises :class:`TombstoneFileError`, which names
  the file: an import refuses to run rather than resurrect what was removed.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import stat
from dataclasses import dataclass
from enum import Enum
from typing import Optional

import orjson

from . import events as ev
from .errors import StoreIOError
from .fsio import fsync_dir, write_all
from .layout import tombstones_path

logger = logging.getLogger(__name__)

_fdatasync = getattr(os, "fdatasync", os.fsync)
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_O_NONBLOCK = getattr(os, "O_NONBLOCK", 0)


class TombstoneReason(str, Enum):
    """Why a session was removed on purpose."""

    RETENTION = "retention"
    FORGET = "forget"


class TombstoneFileError(StoreIOError):
    """``tombstones.jsonl`` is damaged or unreadable: nothing that depends on it may go on
    (an import would resurrect removed sessions)."""


@dataclass(frozen=True)
class Tombstone:
    """One session removed on purpose: its id, why, when (UTC, memstore's form), and the
    import source it came from (``source_path`` and a fingerprint of it), when it had one."""

    session_id: str
    reason: TombstoneReason
    at: str
    source_path: Optional[str] = None
    source_fingerprint: Optional[dict] = None

    def to_dict(self) -> dict:
        return {
            "session_id": self.session_id,
            "reason": self.reason.value,
            "at": self.at,
            "source_path": self.source_path,
            "source_fingerprint": self.source_fingerprint,
        }


class Tombstones:
    """The tombstones of the store at ``root``: :meth:`record`, :meth:`lookup`,
    :meth:`remove` (an undo) and :meth:`all`. Every read goes to the file (it is small and
    other processes append to it); a missing file is a store without tombstones."""

    def __init__(self, root: os.PathLike | str):
        self.path = tombstones_path(root)

    # -- reading ---------------------------------------------------------------------------

    def all(self) -> dict[str, Tombstone]:
        """Every session tombstoned now, by id. Raises :class:`TombstoneFileError`."""
        data = self._read()
        current: dict[str, Tombstone] = {}
        if not data:
            return current
        lines = data.split(b"\n")
        torn = lines.pop()  # b"" when the file ends with its newline
        if torn:
            logger.warning(
                "%s: ignoring a last line without its newline (%d bytes): an append that never completed",
                self.path,
                len(torn),
            )
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            session_id, entry = self._parse(line, number)
            if entry is not None:
                current[session_id] = entry
            else:
                current.pop(session_id, None)
        return current

    def lookup(self, session_id: str) -> Optional[Tombstone]:
        """The tombstone of ``session_id``, or ``None``. Raises :class:`TombstoneFileError`."""
        return self.all().get(session_id)

    def _read(self) -> bytes:
        try:
            fd = os.open(self.path, os.O_RDONLY | _O_NOFOLLOW | _O_CLOEXEC | _O_NONBLOCK)
        except FileNotFoundError:
            return b""
        except OSError as exc:
            raise TombstoneFileError(
                "read",
                self.path,
                f"cannot be opened ({_why(exc)}); refusing to go on without knowing which sessions were removed",
                exc.errno,
            ) from exc
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise TombstoneFileError("read", self.path, "is not a regular file")
            chunks = []
            while chunk := os.read(fd, 1 << 16):
                chunks.append(chunk)
            return b"".join(chunks)
        except OSError as exc:
            raise TombstoneFileError("read", self.path, f"cannot be read ({exc.strerror or exc})", exc.errno) from exc
        finally:
            os.close(fd)

    def _parse(self, line: bytes, number: int) -> tuple[str, Optional[Tombstone]]:
        """``(session id, tombstone)`` of one line; ``None`` as the tombstone for an undo."""
        try:
            obj = orjson.loads(line)
        except orjson.JSONDecodeError:
            raise self._damaged(number, "not JSON") from None
        if (
            not isinstance(obj, dict)
            or obj.get("op") not in ("add", "remove")
            or not isinstance(obj.get("session_id"), str)
            or not isinstance(obj.get("at"), str)
        ):
            raise self._damaged(number, "not a tombstone entry")
        if obj["op"] == "remove":
            return obj["session_id"], None
        try:
            reason = TombstoneReason(obj.get("reason"))
        except ValueError:
            raise self._damaged(number, f"unknown reason {obj.get('reason')!r}") from None
        source = obj.get("source")
        path = source.get("path") if isinstance(source, dict) else None
        fingerprint = source.get("fingerprint") if isinstance(source, dict) else None
        return obj["session_id"], Tombstone(
            obj["session_id"],
            reason,
            obj["at"],
            path if isinstance(path, str) else None,
            fingerprint if isinstance(fingerprint, dict) else None,
        )

    def _damaged(self, number: int, what: str) -> TombstoneFileError:
        return TombstoneFileError(
            "read",
            self.path,
            f"line {number} is damaged ({what}); refusing to go on without "
            "knowing which sessions were removed: repair or move the file by hand",
        )

    # -- writing ---------------------------------------------------------------------------

    def record(
        self,
        session_id: str,
        reason: TombstoneReason,
        *,
        source_path: Optional[str] = None,
        source_fingerprint: Optional[dict] = None,
    ) -> Tombstone:
        """Tombstone ``session_id`` (durable when this returns). Call it before the removal is
        final: a crash after it leaves a tombstone for a session that may still exist (an
        import then skips it, and says so), never a removal without its tombstone."""
        tombstone = Tombstone(session_id, TombstoneReason(reason), ev.utc_now(), source_path, source_fingerprint)
        source = (
            None
            if source_path is None and source_fingerprint is None
            else {"path": source_path, "fingerprint": source_fingerprint}
        )
        self._append(
            {
                "op": "add",
                "session_id": session_id,
                "reason": tombstone.reason.value,
                "at": tombstone.at,
                "source": source,
            }
        )
        return tombstone

    def remove(self, session_id: str) -> Optional[Tombstone]:
        """Undo the tombstone of ``session_id`` (an import may recreate the session again);
        return the tombstone undone, or ``None`` when there was none (nothing is written)."""
        current = self.lookup(session_id)
        if current is None:
            return None
        self._append({"op": "remove", "session_id": session_id, "at": ev.utc_now()})
        return current

    def _append(self, entry: dict) -> None:
        line = orjson.dumps(entry, option=orjson.OPT_APPEND_NEWLINE)
        fd, created = self._open_for_append()
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
            except OSError as exc:
                if exc.errno not in (errno.ENOLCK, errno.EINVAL, errno.ENOTSUP):
                    raise TombstoneFileError("lock", self.path, exc.strerror or str(exc), exc.errno) from exc
                logger.warning("cannot flock %s (%s): appending without the lock", self.path, exc)
            self._cut_torn_tail(fd)
            write_all(fd, line, self.path)
            try:
                _fdatasync(fd)
            except OSError as exc:
                raise TombstoneFileError("fsync", self.path, exc.strerror or str(exc), exc.errno) from exc
        finally:
            os.close(fd)  # releases the flock
        if created:
            fsync_dir(self.path.parent)

    def _open_for_append(self) -> tuple[int, bool]:
        flags = os.O_RDWR | os.O_APPEND | _O_NOFOLLOW | _O_CLOEXEC | _O_NONBLOCK
        created = False
        try:
            try:
                fd = os.open(self.path, flags)
            except FileNotFoundError:
                try:
                    fd = os.open(self.path, flags | os.O_CREAT | os.O_EXCL, 0o600)
                    created = True
                except FileExistsError:
                    fd = os.open(self.path, flags)
        except OSError as exc:
            raise TombstoneFileError("open", self.path, _why(exc), exc.errno) from exc
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise TombstoneFileError("open", self.path, "is not a regular file")
        return fd, created

    def _cut_torn_tail(self, fd: int) -> None:
        """Remove a last line left without its newline (see the module docstring), so the new
        line starts a line of its own. Runs under the file's lock."""
        size = os.fstat(fd).st_size
        if size == 0 or os.pread(fd, 1, size - 1) == b"\n":
            return
        start = max(0, size - (1 << 16))
        while True:
            window = os.pread(fd, size - start, start)
            cut = window.rfind(b"\n")
            if cut >= 0:
                keep = start + cut + 1
                break
            if start == 0:
                keep = 0
                break
            start = max(0, start - (1 << 16))
        logger.warning(
            "%s: cutting %d bytes of a last line without its newline (an append that never completed)",
            self.path,
            size - keep,
        )
        try:
            os.ftruncate(fd, keep)
        except OSError as exc:
            raise TombstoneFileError("truncate", self.path, exc.strerror or str(exc), exc.errno) from exc


def _why(exc: OSError) -> str:
    """Why a no-follow, non-blocking open failed, in words that say what is in the way."""
    if exc.errno == errno.ELOOP:
        return "it is a symlink; refusing to follow it"
    if exc.errno in (errno.ENXIO, errno.EISDIR):
        return "it is not a regular file"
    return exc.strerror or str(exc)


__all__ = ["Tombstone", "TombstoneReason", "Tombstones", "TombstoneFileError"]
