"""The process-wide registry of open sessions, and what happens to them at fork, at exit, and
when a handle is dropped without ``close()``.

All handles of one session in a process share one ``SessionWriter`` (one descriptor, buffer,
state, index connection and liveness lock), found here by the session directory's real path. The
registry's own lock is only ever held for dictionary bookkeeping, never across I/O: closing one
session does not delay opening another. An open of a session that is still closing waits for
that close to finish, so it never finds the liveness lock held by the closing descriptor.
"""

from __future__ import annotations

import atexit
import logging
import os
import queue
import threading
from collections.abc import Callable
from typing import Optional, Protocol, TypeVar, cast

from .. import faults

logger = logging.getLogger("memstore")


class Shared(Protocol):
    """What the registry needs of a session (``writer.SessionWriter``)."""

    key: str
    handles: int
    lock: threading.RLock

    def release(self, *, flush_metadata: bool) -> None: ...
    def forget_after_fork(self) -> None: ...
    def flush_at_exit(self) -> None: ...


_sessions: dict[str, Shared] = {}
_closing: dict[str, threading.Event] = {}
_lock = threading.Lock()
# Sessions of handles dropped without close(); SimpleQueue.put is safe to call from __del__.
_dropped: queue.SimpleQueue[Shared] = queue.SimpleQueue()
_reaper: Optional[threading.Thread] = None

S = TypeVar("S", bound=Shared)


def acquire(key: str, create: Callable[[], S]) -> tuple[S, bool]:
    """Count one more handle on the session ``key``, creating it with ``create()`` when no handle
    is open; returns ``(session, created)``. Waits while the session is still closing."""
    _start_reaper()
    while True:
        with _lock:
            closing = _closing.get(key)
            if closing is None:
                found = _sessions.get(key)
                if found is None:
                    session = create()
                    faults.check("registry.create", key=key)
                    _sessions[key] = session
                else:
                    session = cast(S, found)
                session.handles += 1
                return session, found is None
        closing.wait()


def give_back(session: Shared) -> None:
    """Undo one :func:`acquire` whose open did not complete (no files are held by it)."""
    with _lock:
        session.handles -= 1
        if session.handles <= 0 and _sessions.get(session.key) is session:
            del _sessions[session.key]


def forget(session: Shared) -> None:
    """Remove a session whose first open failed, so the next open starts afresh."""
    with _lock:
        if _sessions.get(session.key) is session:
            del _sessions[session.key]


def drop_handle(session: Shared) -> bool:
    """Count one handle less; return whether it was the last. Then the session is out of the
    registry and marked closing until :func:`closed` is called."""
    with _lock:
        session.handles -= 1
        if session.handles > 0:
            return False
        if _sessions.get(session.key) is session:
            del _sessions[session.key]
        _closing[session.key] = threading.Event()
        return True


def closed(session: Shared) -> None:
    """The last handle's files and lock are released: opens of this session may proceed."""
    with _lock:
        event = _closing.pop(session.key, None)
    if event is not None:
        event.set()


def open_keys() -> set[str]:
    """The keys (real paths of session directories) of the sessions open, or closing, in this
    process."""
    with _lock:
        return set(_sessions) | set(_closing)


def is_busy() -> bool:
    """Whether some thread holds the registry's lock (a dropped handle is then released later)."""
    if not _lock.acquire(blocking=False):
        return True
    _lock.release()
    return False


_thread_role = threading.local()


def mark_background_thread() -> None:
    """Called by memstore's own threads (a session's publisher and deriver): a handle the
    garbage collector drops in one of them is released by the reaper, never there (releasing
    the last handle stops the session's threads and waits for them: for this one, too)."""
    _thread_role.background = True


def release_dropped(session: Shared) -> None:
    """Release the session of a handle dropped without ``close()``: at once if no lock it needs
    is held by anyone (this thread included; the garbage collector may run inside a critical
    section) and this is not one of memstore's own threads, else from the reaper thread
    shortly after."""
    if getattr(_thread_role, "background", False):
        _dropped.put(session)
        return
    lock = session.lock
    owned = getattr(lock, "_is_owned", None)
    if owned is not None and not owned() and lock.acquire(blocking=False):
        try:
            if not is_busy():
                _release_quietly(session)
                return
        finally:
            lock.release()
    _dropped.put(session)


def _release_quietly(session: Shared) -> None:
    try:
        session.release(flush_metadata=False)
    except Exception as exc:
        # Nobody holds the dropped handle to report to; reopening repairs from the log.
        logger.warning("releasing a dropped handle of session %s failed: %s", session.key, exc)


def _reap_dropped_handles() -> None:
    while True:
        _release_quietly(_dropped.get())


def _start_reaper() -> None:
    global _reaper
    if _reaper is None:
        _reaper = threading.Thread(target=_reap_dropped_handles, name="memstore-reaper", daemon=True)
        _reaper.start()


def _drain_dropped_handles() -> None:
    while True:
        try:
            session = _dropped.get_nowait()
        except queue.Empty:
            return
        _release_quietly(session)


def _forget_sessions_in_forked_child() -> None:
    """After fork(), the child must not act on the parent's sessions: their buffers, state and
    liveness lock belong to the parent. The child drops them (closing only its copies of the
    descriptors; unlocking would release the parent's lock) and starts with a fresh registry,
    so its own opens take the lock like any other process's."""
    global _sessions, _closing, _lock, _dropped, _reaper
    inherited = list(_sessions.values())
    _sessions = {}
    _closing = {}
    _lock = threading.Lock()
    _dropped = queue.SimpleQueue()
    _reaper = None
    for session in inherited:
        session.forget_after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_sessions_in_forked_child)


@atexit.register
def _flush_open_sessions_at_exit() -> None:
    """Sessions still open at interpreter exit are flushed (written, synced, indexed) while the
    publisher threads still run; a crash, not a normal exit, is what loses buffered events."""
    _drain_dropped_handles()
    with _lock:
        sessions = list(_sessions.values())
    for session in sessions:
        try:
            session.flush_at_exit()
        except Exception as exc:
            # Nobody is left to report to; the next open repairs from the log.
            logger.warning("flushing session %s at exit failed: %s", session.key, exc)
