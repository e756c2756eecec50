"""Each session's liveness lock (``session.lock``) and the ``is_live`` probe.

A session is *live* while some process holds an exclusive ``flock`` on its ``session.lock``.
``flock`` locks belong to an open file description, so a second open of the same file conflicts
even inside one process; POSIX record locks (``lockf``) would not, which is why they are not used.
``session.lock`` stays on raw ``flock`` rather than filelock because ``is_live`` must probe
another process's lock without creating, replacing or removing the file. A filesystem without
``flock`` leaves the session unlocked rather than failing the open; a ``session.lock`` that is a
symlink or not a regular file fails it (running unprotected would let two writers in).
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import stat
import time
from typing import Optional

from .. import faults
from ..errors import StoreIOError
from ..fsio import open_private_rw
from ..layout import lock_path

logger = logging.getLogger(__name__)

_ATTEMPTS = 5


class SessionGone(Exception):
    """The session directory was removed (by retention, say) while its lock was being taken."""


class LivenessLock:
    """An exclusive, non-blocking ``flock`` on ``<session_dir>/session.lock``.

    ``held`` tells whether the lock was obtained; ``holder_elsewhere`` whether it failed because
    another open file description (another process, usually) holds it.
    """

    def __init__(self, session_dir: os.PathLike | str):
        self.path = lock_path(session_dir)
        self._fd: Optional[int] = None
        self.holder_elsewhere = False

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> bool:
        """Try to take the lock; return whether it is now held.

        Raises :class:`StoreIOError` (:class:`UnsafePathError` for a symlink or FIFO) when the
        lock file cannot be opened safely, and :class:`SessionGone` when the session directory
        was removed or replaced while the lock was taken. A filesystem that cannot ``flock``
        leaves the session unlocked (logged), as VT Code does.
        """
        if self._fd is not None:
            return True
        try:
            fd = open_private_rw(self.path)
        except StoreIOError as exc:
            if exc.errno == errno.ENOENT:  # the directory was removed under us
                raise SessionGone(str(self.path)) from exc
            raise
        for attempt in range(_ATTEMPTS):
            try:
                faults.check("lock.flock", path=self.path)
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                self.holder_elsewhere = exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN)
                if not self.holder_elsewhere:
                    os.close(fd)
                    logger.warning(
                        "cannot flock %s (%s): the session stays unlocked, so another process "
                        "opening it is not kept out, and retention cannot tell it is live",
                        self.path,
                        exc,
                    )
                    return False
                if attempt == _ATTEMPTS - 1:
                    os.close(fd)
                    return False
                # Another process's is_live() probe holds the lock for an instant: try again.
                time.sleep(0.01)
        # Retention removes a session by taking this lock and renaming its directory away: a
        # lock obtained on a file no longer at its path protects nothing.
        try:
            here = os.stat(self.path, follow_symlinks=False)
        except FileNotFoundError:
            here = None
        mine = os.fstat(fd)
        if here is None or (here.st_dev, here.st_ino) != (mine.st_dev, mine.st_ino):
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
            raise SessionGone(str(self.path))
        self.holder_elsewhere = False
        self._fd = fd
        return True

    def forget(self) -> None:
        """Close this process's descriptor without unlocking: after fork() the lock belongs to
        the parent, whose descriptor shares it."""
        fd, self._fd = self._fd, None
        if fd is not None:
            try:
                os.close(fd)
            except OSError as exc:
                logger.debug("closing an inherited lock descriptor: %s", exc)

    def release(self) -> None:
        """Release the lock if held. The file stays: deleting it would race another locker."""
        fd, self._fd = self._fd, None
        if fd is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_UN)
            finally:
                os.close(fd)


def is_live(session_dir: os.PathLike | str) -> bool:
    """Whether some process holds the session's liveness lock.

    A missing lock file means not live; a lock file that cannot be opened counts as live (the
    safe answer for retention). Otherwise an exclusive non-blocking ``flock`` is tried: if it would
    block the session is live; if it succeeds it is released at once and the session is not live.
    """
    path = lock_path(session_dir)
    try:
        fd = os.open(
            path, os.O_RDWR | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NONBLOCK", 0)
        )
    except FileNotFoundError:
        return False
    except OSError:
        return True
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return True
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        # EWOULDBLOCK is the usual answer; any other failure also reads as live, the safe side.
        return True
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)
