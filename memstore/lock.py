"""The liveness lock (``session.lock``) and the ``is_live`` probe.

A session is *live* while some process holds an exclusive ``flock`` on its ``session.lock``.
``flock`` locks belong to an open file description, so a second open of the same file conflicts
even inside one process; POSIX record locks (``lockf``) would not, which is why they are not used.
Taking the lock is best effort: a filesystem without ``flock`` leaves the session unlocked rather
than failing the open.
"""

from __future__ import annotations

import errno
import fcntl
import os
import time
from pathlib import Path
from typing import Optional

from .fsio import open_private_rw

LOCK_FILE = "session.lock"
_ATTEMPTS = 5


class LivenessLock:
    """An exclusive, non-blocking ``flock`` on ``<session_dir>/session.lock``.

    ``held`` tells whether the lock was obtained; ``holder_elsewhere`` whether it failed because
    another open file description (another process, usually) holds it.
    """

    def __init__(self, session_dir: os.PathLike | str):
        self.path = Path(session_dir) / LOCK_FILE
        self._fd: Optional[int] = None
        self.holder_elsewhere = False

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> bool:
        """Try to take the lock; return whether it is now held. Never raises."""
        if self._fd is not None:
            return True
        try:
            fd = open_private_rw(self.path)
        except Exception:
            return False
        for attempt in range(_ATTEMPTS):
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                self.holder_elsewhere = exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN)
                if not self.holder_elsewhere or attempt == _ATTEMPTS - 1:
                    os.close(fd)
                    return False
                # Another process's is_live() probe holds the lock for an instant: try again.
                time.sleep(0.01)
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
            except OSError:
                pass

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
    path = Path(session_dir) / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDWR | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        return False
    except OSError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        # EWOULDBLOCK is the usual answer; any other failure also reads as live, the safe side.
        return True
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)

