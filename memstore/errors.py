"""The exception hierarchy of memstore.

Every error that comes from the filesystem is a :class:`StoreIOError` and names the path it was
about, so an operator reading a traceback knows which file to look at.
"""

from __future__ import annotations

import errno as _errno
import os
from typing import Optional


class MemstoreError(Exception):
    """Base class of every error memstore raises on purpose.

    An error raised by ``append`` after its event was handed a sequence number carries it as
    ``seq``, and ``durable`` says whether the event's bytes reached ``events.jsonl`` (its
    ``write()`` completed) before the failure: if so, do not append it again. It does not say
    the bytes were synced: after a failed ``fdatasync`` (``op == "fdatasync"``) they may or may
    not survive a power cut, and a reopened session shows whether they did.
    """

    seq: Optional[int] = None
    durable: bool = False

    def __reduce__(self):
        # An error crosses a process boundary (rebuild's worker processes) whole, whatever
        # arguments its class's __init__ takes: its message and attributes, __init__ not rerun.
        return (_unpickle_error, (type(self), self.args, self.__dict__))


def _unpickle_error(cls: type, args: tuple, state: dict) -> MemstoreError:
    error = cls.__new__(cls, *args)
    error.args = args
    error.__dict__.update(state)
    return error


class StoreIOError(MemstoreError):
    """An I/O operation on a store file failed.

    ``path`` is the file or directory involved, ``op`` a short verb ("write", "fsync", ...), and
    ``errno`` the OS error number when there was one. The original exception is chained.
    """

    def __init__(self, op: str, path: os.PathLike | str, detail: str = "", errno: Optional[int] = None):
        self.op = op
        self.path = os.fspath(path)
        self.errno = errno
        self.detail = detail
        message = f"{op} {self.path}"
        if detail:
            message += f": {detail}"
        super().__init__(message)

    @classmethod
    def from_os_error(cls, op: str, path: os.PathLike | str, exc: OSError) -> StoreIOError:
        detail = exc.strerror or str(exc)
        if exc.errno == _errno.ELOOP:
            detail = "refusing to follow a symlink"
        return cls(op, path, detail, exc.errno)


class UnsafePathError(StoreIOError):
    """A path is a symlink, or not the kind of file it must be, and memstore refuses to use it."""

    def __init__(self, op: str, path: os.PathLike | str, detail: str):
        super().__init__(op, path, detail, _errno.ELOOP if "symlink" in detail else None)


class StoreReadOnly(StoreIOError):
    """The store cannot be written by this process: its permissions (a read-only copy, another
    user's files) or a read-only mount. ``path`` names what could not be created, opened for
    writing or locked; ``errno`` is ``EACCES``, ``EPERM`` or ``EROFS``. Nothing was written, and
    memstore changed no permission to get past it. Reading and searching such a store work:
    they take no lock and write nothing."""


# The errors that say "this process may not write here".
READ_ONLY_ERRNOS = frozenset({_errno.EACCES, _errno.EPERM, _errno.EROFS})


def write_error(op: str, path: os.PathLike | str, exc: OSError) -> StoreIOError:
    """The memstore error of a failure to create, write or lock ``path``: :class:`StoreReadOnly`
    when ``exc`` says this process may not write there, :class:`UnsafePathError` when it is a
    symlink (``ELOOP`` under ``O_NOFOLLOW``), else :class:`StoreIOError`."""
    if exc.errno in READ_ONLY_ERRNOS:
        return StoreReadOnly(op, path, f"the store cannot be written here ({exc.strerror or exc})", exc.errno)
    if exc.errno == _errno.ELOOP:
        return UnsafePathError(op, path, "is a symlink; refusing to follow it")
    return StoreIOError.from_os_error(op, path, exc)


class InvalidEvent(MemstoreError, ValueError):
    """An event given to ``append`` is not a JSON object with a string ``type``, is a malformed
    lifecycle event, or cannot be serialized. Nothing was written."""


class InvalidSessionId(MemstoreError, ValueError):
    """A session id memstore refuses: empty, ``.`` or ``..``, containing NUL, or absurdly long.
    Nothing was created."""


class SessionNotFound(MemstoreError, LookupError):
    """There is no such session (no directory, or no ``events.jsonl`` in it)."""

    def __init__(self, session_id: str, path: os.PathLike | str):
        self.session_id = session_id
        self.path = os.fspath(path)
        super().__init__(f"no session {session_id!r} (no {self.path})")


class EventNotFound(MemstoreError, LookupError):
    """``record(seq)`` was asked for a sequence number the session does not (or no longer) hold."""

    def __init__(self, session_id: str, seq: int):
        self.session_id = session_id
        self.seq = seq
        super().__init__(f"no event with seq {seq} in session {session_id!r}")


class TurnNotFound(MemstoreError, LookupError):
    """``reconstruct_turn`` was asked for a turn the session does not (or no longer) hold."""

    def __init__(self, session_id: str, turn: int):
        self.session_id = session_id
        self.turn = turn
        super().__init__(f"turn {turn} not found in session {session_id!r}")


class LogFailedError(MemstoreError):
    """A previous write or fsync on this session failed; the handle refuses further appends,
    flushes and reads (close still releases it).

    After a failed fsync the kernel may have dropped the data while a retry would report success,
    so the only honest state is closed. Reopen the session to continue: the log on disk is valid.
    """


class SessionClosedError(MemstoreError):
    """The handle was closed."""


class SessionBusyError(MemstoreError):
    """Another process holds the session's liveness lock, and the operation needs it idle."""


class CapEvictionError(MemstoreError):
    """The cap-eviction summary hook failed; the canonical log was left untouched."""


class InvalidPack(MemstoreError, ValueError):
    """An audit pack is malformed, has an unsupported schema, or names an unsafe path."""


class InvalidProgress(MemstoreError, ValueError):
    """A progress ledger or goal snapshot does not have the expected JSON shape."""
