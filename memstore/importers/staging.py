"""The staging area of an import: new sessions are written whole out of sight, made durable
for a whole batch at once, and published into the store by a rename.

A new session (its log, its index with the search chunks, its manifest and its import state)
is written into ``<root>/sessions/.import-<hex>/<session directory name>/`` with nothing synced
(see :class:`memstore.session.bulk.NewSession`). The store's listings skip names that start with
a dot, so no reader, catalog or retention ever sees a session there. :meth:`Staging.publish`
takes a batch of them:

1. one ``syncfs`` of the store's file system makes every byte of the batch durable (the logs,
   indexes, manifests, import states, and the directories holding them);
2. each session directory is renamed into ``<root>/sessions/``, never over anything (a session
   that appeared there meanwhile is left alone and the caller imports the source again into it);
3. one ``fsync`` of ``<root>/sessions`` makes the renames durable, and each published session
   is marked in the catalog's change feed (:mod:`memstore.changes`).

So a session is in the store either whole or not at all: a crash (SIGKILL, power cut) before
its rename leaves it only in the staging area, which the next import removes and redoes; its
import state, the resume point, is never published ahead of the bytes it describes.

Every process working in a staging area holds a shared ``flock`` on its ``.lock`` file; an area
nobody holds (its import was killed) is removed by :func:`sweep_abandoned`, which the next import
calls under the store's ``import`` lock.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import logging
import os
import shutil
import stat
import uuid
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from ..changes import mark_changed
from ..errors import StoreIOError
from ..fsio import DIR_MODE, FILE_MODE, ensure_private_dir, fsync_dir, sync_file_system
from ..layout import IMPORT_STAGING_PREFIX, sessions_root
from ..store_redaction import StoreRedaction, store_redaction

logger = logging.getLogger(__name__)

STAGING_PREFIX = IMPORT_STAGING_PREFIX
_LOCK_FILE = ".lock"
_RENAME_NOREPLACE = 1  # linux/fs.h
_AT_FDCWD = -100

_libc: Optional[ctypes.CDLL]
try:
    _libc = ctypes.CDLL(None, use_errno=True)
except OSError:  # pragma: no cover - no C library to load (not a POSIX system)
    _libc = None


def rename_noreplace(source: os.PathLike | str, target: os.PathLike | str) -> None:
    """Rename ``source`` to ``target``, failing with :class:`FileExistsError` when ``target``
    exists (even an empty directory, which a plain ``rename`` would replace). Atomic where the
    kernel offers ``renameat2(RENAME_NOREPLACE)``; elsewhere a check, then ``rename``."""
    renameat2 = getattr(_libc, "renameat2", None) if _libc is not None else None
    if renameat2 is not None:
        result = renameat2(_AT_FDCWD, os.fsencode(source), _AT_FDCWD, os.fsencode(target), _RENAME_NOREPLACE)
        if result == 0:
            return
        err = ctypes.get_errno()
        if err not in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
            raise OSError(err, os.strerror(err), os.fspath(target))
    if os.path.lexists(target):
        raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), os.fspath(target))
    os.rename(source, target)


@dataclass(frozen=True)
class Published:
    """What :meth:`Staging.publish` did with one staged session: ``published`` (it is in the
    store now) or not, because a directory of that name appeared in the store meanwhile."""

    staged: str
    published: bool


class StagingArea:
    """The part of a staging area one process writes into (``<staging>/<key>/``, made on first
    use), so that what a worker that died left is told apart from what the others staged."""

    def __init__(self, root: Path, path: Path, redaction: StoreRedaction):
        self.root = root
        self.path = path
        self.redaction = redaction  # the store's, read once per staging area

    def staged(self, name: str) -> Path:
        """Where the session directory ``name`` is written (the area is made if need be)."""
        try:
            os.mkdir(self.path, DIR_MODE)
        except FileExistsError:
            pass
        except OSError as exc:
            raise StoreIOError.from_os_error("create staging directory", self.path, exc) from exc
        return self.path / name

    def discard(self, name: str) -> None:
        """Remove the staged session ``name`` (what is left of it)."""
        _remove_tree(self.path / name)

    def clear(self, keep: Collection[str] = ()) -> None:
        """Remove everything staged here but the session directories named in ``keep``."""
        if not keep:
            _remove_tree(self.path)
            return
        try:
            names = os.listdir(self.path)
        except FileNotFoundError:
            return
        except OSError as exc:
            raise StoreIOError.from_os_error("list staging directory", self.path, exc) from exc
        for name in names:
            if name not in keep:
                _remove_tree(self.path / name)


class Staging:
    """One import's staging area (see the module docstring). :meth:`create` makes it and takes
    its lock; :meth:`join` takes the lock of an existing one (a worker process)."""

    def __init__(self, root: Path, path: Path, lock_fd: int, redaction: StoreRedaction):
        self.root = root
        self.path = path
        self._lock_fd: Optional[int] = lock_fd
        self.redaction = redaction  # what new sessions are written with

    @classmethod
    def create(cls, root: os.PathLike | str) -> Staging:
        root = Path(root)
        # Read first: a malformed config.toml refuses the import before anything is staged, as
        # the writer refuses to open a session.
        redaction = store_redaction(root)
        sessions = ensure_private_dir(sessions_root(root))
        path = sessions / f"{STAGING_PREFIX}{uuid.uuid4().hex}"
        try:
            os.mkdir(path, DIR_MODE)
        except OSError as exc:
            raise StoreIOError.from_os_error("create staging directory", path, exc) from exc
        return cls(root, path, _lock(path, fcntl.LOCK_SH), redaction)

    @classmethod
    def join(cls, root: os.PathLike | str, path: os.PathLike | str) -> Staging:
        redaction = store_redaction(root)
        return cls(Path(root), Path(path), _lock(Path(path), fcntl.LOCK_SH), redaction)

    def area(self, key: str) -> StagingArea:
        """The part of the area named ``key`` (one per process writing)."""
        return StagingArea(self.root, self.path / key, self.redaction)

    def publish(self, staged: list[str]) -> list[Published]:
        """Make the staged session directories ``staged`` (paths in this area) durable, then
        rename each into the store under its own name (see the module docstring). A session
        whose name is taken in the store stays staged (the caller discards it). Raises
        :class:`StoreIOError` when the sync or a rename fails (nothing unsynced is ever
        published)."""
        if not staged:
            return []
        sync_file_system(self.path)
        sessions = sessions_root(self.root)
        out = []
        moved = False
        for path in staged:
            target = sessions / os.path.basename(path)
            try:
                rename_noreplace(path, target)
            except FileExistsError:
                out.append(Published(path, False))
                continue
            except OSError as exc:
                if exc.errno in (errno.EEXIST, errno.ENOTEMPTY):
                    out.append(Published(path, False))
                    continue
                raise StoreIOError.from_os_error("publish session", target, exc) from exc
            moved = True
            out.append(Published(path, True))
        if moved:
            fsync_dir(sessions)
            # Tell the catalog (its change feed) once the sessions are durably in the store.
            for item in out:
                if item.published:
                    mark_changed(self.root, os.path.basename(item.staged))
        return out

    def discard(self, staged: str) -> None:
        """Remove the staged session directory ``staged`` (a path in this area)."""
        path = Path(staged)
        if self.path not in path.parents:
            raise ValueError(f"{staged} is not in the staging area {self.path}")
        _remove_tree(path)

    def close(self, *, remove: bool = True) -> None:
        """Release the lock; with ``remove``, delete the staging area and anything left in it."""
        fd, self._lock_fd = self._lock_fd, None
        if remove:
            _remove_tree(self.path)
        if fd is not None:
            os.close(fd)


def _lock(path: Path, mode: int) -> int:
    """Open ``<path>/.lock`` (created 0600) and take ``mode`` on it; return the descriptor."""
    lock_path = path / _LOCK_FILE
    flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(lock_path, flags, FILE_MODE)
    except OSError as exc:
        raise StoreIOError.from_os_error("open", lock_path, exc) from exc
    try:
        fcntl.flock(fd, mode)
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            raise
        if exc.errno in (errno.ENOLCK, errno.EINVAL, errno.ENOTSUP):
            logger.warning("cannot flock %s (%s): the staging area is not locked", lock_path, exc)
            return os.open(lock_path, flags, FILE_MODE)
        raise StoreIOError.from_os_error("lock", lock_path, exc) from exc
    return fd


def sweep_abandoned(root: os.PathLike | str) -> list[str]:
    """Remove the staging areas under ``<root>/sessions`` that no process holds (left by an
    import that was killed: what they hold was never published, and the next import writes it
    again). Returns the names removed. Call it under the store's ``import`` lock."""
    base = sessions_root(root)
    try:
        entries = [e for e in os.scandir(base) if e.name.startswith(STAGING_PREFIX)]
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise StoreIOError.from_os_error("list", base, exc) from exc
    removed = []
    for entry in entries:
        path = Path(entry.path)
        try:
            if not stat.S_ISDIR(os.lstat(path).st_mode):
                continue
        except OSError:
            continue
        try:
            fd = _lock(path, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            continue  # a process (a worker of an import that was killed, still finishing) holds it
        except StoreIOError as exc:
            logger.warning("could not examine the staging area %s: %s", path, exc)
            continue
        try:
            _remove_tree(path)
        finally:
            os.close(fd)
        logger.info("import: removed %s, the staging area of an import that did not finish", path)
        removed.append(entry.name)
    return removed


def _remove_tree(path: Path) -> None:
    def failed(_function, failed_path, exc_info) -> None:
        if not isinstance(exc_info[1], FileNotFoundError):
            logger.warning("could not remove %s: %s", failed_path, exc_info[1])

    shutil.rmtree(path, onerror=failed)


__all__ = [
    "Staging",
    "StagingArea",
    "Published",
    "STAGING_PREFIX",
    "rename_noreplace",
    "sweep_abandoned",
    "sync_file_system",
]
