"""The store-wide locks of its critical sections (catalog refresh, retention, migration, import),
and the removal of a session directory through the store's trash.

The store-wide locks are filelock ``FileLock``s on ``<root>/locks/<name>.lock``. Neither the
directory nor a lock file is ever followed through a symlink, and a lock file that is not a
regular file (a FIFO, a directory) is refused: each is a :class:`UnsafePathError` naming the
path. A store this process cannot write (a read-only copy, a read-only mount) cannot be locked:
:class:`StoreReadOnly` says so, and nothing in it is created or chmodded. Reading a store takes
no store-wide lock.
"""

from __future__ import annotations

import logging
import os
import shutil
import stat
import uuid
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Optional

from filelock import FileLock, Timeout

from . import faults
from .errors import StoreIOError, UnsafePathError, write_error
from .fsio import ensure_private_dir
from .layout import locks_dir, sessions_root, trash_dir
from .session.lock import LivenessLock, SessionGone, is_live

logger = logging.getLogger(__name__)

# A trash entry keeps this suffix until its removal is recorded (``on_moved`` returned): one a
# crash left with it was never recorded, and is put back rather than deleted.
PENDING_SUFFIX = ".pending"
# A pending entry that cannot be put back (a newer session took its name) is renamed with this
# suffix, said once, and kept: deleting it would be a removal nobody recorded, and putting it
# back again on every emptying would fail (and log) on every retention run for ever.
UNRECORDED_SUFFIX = ".unrecorded"
STORE_LOCKS = ("catalog", "retention", "migration", "import")


class StoreLock:
    """One store-wide lock (see :func:`store_lock`): a context manager, with ``acquire`` and
    ``release`` like a filelock ``FileLock`` (which does the locking)."""

    def __init__(self, root: Path, name: str, timeout: float):
        self.root = root
        self.name = name
        self.path = locks_dir(root) / f"{name}.lock"
        self.timeout = timeout
        self._lock: Optional[FileLock] = None

    def __repr__(self) -> str:
        return f"<StoreLock {self.name} {str(self.path)!r}>"

    @property
    def is_locked(self) -> bool:
        return self._lock is not None and self._lock.is_locked

    def acquire(self, timeout: Optional[float] = None) -> StoreLock:
        """Take the lock, waiting ``timeout`` seconds (default: the lock's own; -1 for ever).

        Raises ``filelock.Timeout`` when the wait runs out, :class:`StoreReadOnly` when the
        store cannot be written, and :class:`UnsafePathError` when ``locks/`` or the lock file
        is a symlink or not what it must be; any other failure is a :class:`StoreIOError`
        naming the path."""
        _private_locks_dir(locks_dir(self.root))
        _check_lock_file(self.path)
        if self._lock is None:
            self._lock = FileLock(self.path, timeout=self.timeout, mode=0o600)
        try:
            self._lock.acquire(timeout=self.timeout if timeout is None else timeout)
        except Timeout:
            raise
        except OSError as exc:
            raise _lock_error("lock", self.path, exc) from exc
        try:
            # Checked again under the lock: a FIFO put in place between the check above and
            # filelock's open (a symlink there fails that open) is refused all the same.
            _check_lock_file(self.path)
        except BaseException:
            self._lock.release()
            raise
        return self

    def release(self) -> None:
        if self._lock is not None:
            self._lock.release()

    def __enter__(self) -> StoreLock:
        return self.acquire()

    def __exit__(
        self, exc_type: Optional[type[BaseException]], exc: Optional[BaseException], tb: Optional[TracebackType]
    ) -> None:
        self.release()


def store_lock(root: os.PathLike | str, name: str, timeout: float = -1) -> StoreLock:
    """The store-wide lock ``name`` (one of ``catalog``, ``retention``, ``migration``,
    ``import``) on ``<root>/locks/<name>.lock``, to use as a context manager. ``timeout`` in
    seconds (-1: wait for ever); a wait that runs out raises ``filelock.Timeout``. Nothing
    touches the disk until the lock is taken (see :meth:`StoreLock.acquire` for its errors)."""
    if name not in STORE_LOCKS:
        raise ValueError(f"unknown store lock {name!r} (one of {', '.join(STORE_LOCKS)})")
    return StoreLock(Path(root), name, timeout)


def _private_locks_dir(directory: Path) -> None:
    """Create ``locks/`` (0700) if missing: :class:`StoreReadOnly` where the store cannot be
    written, :class:`UnsafePathError` for a symlink or a non-directory there (see
    :func:`memstore.fsio.ensure_private_dir`, which never adds a permission bit)."""
    ensure_private_dir(directory)


def _check_lock_file(path: Path) -> None:
    """Refuse a lock file that is a symlink or not a regular file (a missing one is created by
    the lock)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise _lock_error("stat", path, exc) from exc
    if stat.S_ISLNK(st.st_mode):
        raise UnsafePathError("lock", path, "is a symlink; refusing to follow it")
    if not stat.S_ISREG(st.st_mode):
        raise UnsafePathError("lock", path, "is not a regular file")


def _lock_error(op: str, path: Path, exc: OSError) -> StoreIOError:
    return write_error(op, path, exc)


def new_removal_id() -> str:
    """A fresh id for one removal (see :func:`remove_session_directory`'s ``removal_id``)."""
    return uuid.uuid4().hex[:12]


def remove_session_directory(
    root: os.PathLike | str,
    session_dir: os.PathLike | str,
    still_removable: Optional[Callable[[], bool]] = None,
    on_moved: Optional[Callable[[], None]] = None,
    removal_id: Optional[str] = None,
) -> bool:
    """Remove a session directory that no process has open; return whether it was removed.

    Takes the session's liveness lock first, so a writer that opens the session at that moment
    either finds it live (``SessionBusyError``) or finds it gone and starts a new one; never
    writes into a directory being deleted. Under the lock the directory is renamed into
    ``<root>/.trash/`` (atomic), then deleted. ``still_removable()``, when given, is asked
    again under the lock (a caller's last look, with no writer able to change the session); if
    it says no, nothing is removed. ``on_moved()``, when given, runs once the directory is in
    the trash and before it is deleted (a caller records the removal there, so a crash can
    never delete what was not recorded); if it raises, the directory is put back where it was
    when that is still free, and the error propagates. Until ``on_moved()`` returned the trash
    entry is named ``*.pending`` (and its lock is held): :func:`empty_trash` leaves such an entry
    to a remover still at work, and puts back one a crash left, since its removal was never
    recorded. ``removal_id`` (default: a fresh :func:`new_removal_id`) names the trash entry
    (``<name>-<removal_id>``): a caller that records it with the removal lets
    :func:`empty_trash` tell a removal a crash interrupted after its record (to be completed)
    from one interrupted before (to be undone). Refuses symlinks and anything that is not a
    direct child of ``<root>/sessions``.
    """
    removal_id = new_removal_id() if removal_id is None else removal_id
    if not (removal_id.isascii() and removal_id.isalnum()):
        raise ValueError(f"a removal id is ASCII letters and digits, not {removal_id!r}")
    root = Path(root)
    session_dir = Path(session_dir)
    sessions = sessions_root(root)
    if session_dir.parent != sessions:
        raise UnsafePathError("remove session", session_dir, f"is not a direct child of {sessions}")
    try:
        st = os.lstat(session_dir)
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise StoreIOError.from_os_error("stat", session_dir, exc) from exc
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafePathError("remove session", session_dir, "is a symlink or not a directory")
    lock = LivenessLock(session_dir)
    try:
        if not lock.acquire():
            return False
    except SessionGone:
        return False
    try:
        if still_removable is not None and not still_removable():
            lock.release()
            return False
        trash = ensure_private_dir(trash_dir(root))
    except BaseException:
        lock.release()
        raise
    target = trash / f"{session_dir.name}-{removal_id}"
    pending = target.with_name(target.name + PENDING_SUFFIX)
    try:
        try:
            os.rename(session_dir, pending)
        except OSError as exc:
            raise StoreIOError.from_os_error("move to trash", session_dir, exc) from exc
        try:
            faults.check("trash.moved", path=pending)
            if on_moved is not None:
                on_moved()
            # Recorded: from now on a crash leaves an entry the next emptying completes.
            faults.check("trash.recorded", path=pending)
            try:
                os.rename(pending, target)
            except OSError as exc:
                raise StoreIOError.from_os_error("rename", pending, exc) from exc
        except BaseException:
            _put_back(pending, session_dir)
            raise
    finally:
        lock.release()
    _delete_tree(target)
    return True


def _put_back(target: Path, session_dir: Path) -> None:
    """Undo a move to the trash (the removal could not be recorded). If a new session took the
    name meanwhile, the old one stays in the trash, pending: the next emptying keeps it aside
    (see :data:`UNRECORDED_SUFFIX`)."""
    try:
        if os.path.lexists(session_dir):
            raise FileExistsError(session_dir)
        os.rename(target, session_dir)
    except OSError as exc:
        logger.error("could not put %s back as %s (%s); it stays in the trash", target, session_dir, exc)


def empty_trash(root: os.PathLike | str, recorded: Optional[Callable[[str], bool]] = None) -> None:
    """Delete what a removal interrupted by a crash left in ``<root>/.trash/`` (only a real
    directory: a ``.trash`` symlink would point the deletion outside the store).

    A ``*.pending`` entry whose lock is held belongs to a remover still at work, and is left
    alone. One a crash left is judged by ``recorded(removal_id)`` (the id its name ends with,
    see :func:`remove_session_directory`): a removal that was recorded is completed (deleted,
    as it would have been: recording it twice or putting it back would both be wrong); one that
    was not (or with no ``recorded`` to ask) is undone: put back into ``<root>/sessions`` (or,
    if a newer session took its name, kept in the trash as ``*.unrecorded``, which no emptying
    touches)."""
    trash = trash_dir(root)
    try:
        if not stat.S_ISDIR(os.lstat(trash).st_mode):
            logger.warning("%s is a symlink or not a directory; not emptying it", trash)
            return
        entries = list(os.scandir(trash))
    except FileNotFoundError:
        return
    except OSError as exc:
        logger.warning("could not list %s: %s", trash, exc)
        return
    for entry in entries:
        if entry.name.endswith(UNRECORDED_SUFFIX):
            continue  # said when it was set aside; for a human to look at, never deleted here
        if entry.name.endswith(PENDING_SUFFIX):
            if not is_live(entry.path):
                stem = entry.name[: -len(PENDING_SUFFIX)]
                name, _, removal_id = stem.rpartition("-")
                home = sessions_root(root) / name
                if recorded is not None and recorded(removal_id):
                    logger.warning("%s is a recorded removal a crash interrupted; completing it", entry.path)
                    _delete_tree(Path(entry.path))
                elif os.path.lexists(home):
                    _set_aside(Path(entry.path), trash / (stem + UNRECORDED_SUFFIX), home)
                else:
                    logger.warning("%s is a removal that was never recorded; putting it back", entry.path)
                    _put_back(Path(entry.path), home)
            continue
        _delete_tree(Path(entry.path))


def _set_aside(entry: Path, kept: Path, home: Path) -> None:
    """Keep a removal nobody recorded whose name a newer session took, once and for good."""
    try:
        os.rename(entry, kept)
    except OSError as exc:
        logger.error("could not set %s aside as %s (%s)", entry, kept, exc)
        return
    logger.error("%s is a removal that was never recorded, and %s is a newer session: kept as %s", entry, home, kept)


def _delete_tree(path: Path) -> None:
    def report(function, failed, exc_info):
        logger.warning("could not delete %s (%s); it stays in the trash", failed, exc_info[1])

    if path.is_symlink() or not path.is_dir():
        try:
            os.unlink(path)
        except OSError as exc:
            logger.warning("could not delete %s: %s", path, exc)
        return
    shutil.rmtree(path, onerror=report)
