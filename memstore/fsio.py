"""Filesystem primitives: private directories and files, atomic replace, no-follow reads.

Directories are created 0700 and files 0600; an existing one's mode is only ever tightened (a
group or other bit cleared, never a bit added). Nothing here follows a symlink or blocks on a
FIFO: a symlink, a FIFO or a device where a store file or directory should be is refused with
:class:`UnsafePathError` naming it. A write this process may not make (a read-only copy of a
store, a read-only mount) is a :class:`~memstore.errors.StoreReadOnly`.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import stat
import uuid
from pathlib import Path
from typing import Optional

from .errors import StoreIOError, UnsafePathError, write_error

DIR_MODE = 0o700
logger = logging.getLogger("memstore")

FILE_MODE = 0o600

_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
# Opening a FIFO blocks until the other end opens; with O_NONBLOCK the open returns and the
# regular-file check refuses it. It changes nothing for regular files.
_O_NONBLOCK = getattr(os, "O_NONBLOCK", 0)

# Temp files of atomic_write (".<name>.tmp-<pid>-<hex>") and of cap rewrites
# (".events.jsonl.cap-<pid>-<hex>"): transient, and removable once their writer is gone.
_TEMP_NAME = re.compile(r"^\.[^/]+\.(?:tmp|cap)-(\d+)-[0-9a-f]+$")


def temp_file_pid(name: str) -> Optional[int]:
    """The writer's pid if ``name`` is one of memstore's temp files, else ``None``."""
    match = _TEMP_NAME.match(name)
    return int(match.group(1)) if match else None


def ensure_private_dir(path: os.PathLike | str, *, sync: bool = True) -> Path:
    """Create ``path`` (and missing parents) as private directories and return it.

    Refuses when ``path`` itself is a symlink or not a directory. Existing ancestors are the
    caller's choice (a store root may live behind a symlink); memstore calls this once per level
    of the store, so every store-owned directory is checked as a target. Directories created
    here are 0700. An existing target is only ever tightened: group and other bits are cleared,
    no bit is added, and a directory this process cannot write (a read-only copy of a store)
    is not touched at all. With ``sync=False`` the caller takes charge of syncing the parent of
    what was created (to batch several creations in one directory).
    """
    path = Path(path)
    missing = []
    probe = path
    existing: Optional[os.stat_result] = None
    while True:
        try:
            st = os.lstat(probe)
        except FileNotFoundError:
            missing.append(probe)
            if probe.parent == probe:
                break
            probe = probe.parent
            continue
        except OSError as exc:
            raise StoreIOError.from_os_error("stat", probe, exc) from exc
        if probe == path:
            if stat.S_ISLNK(st.st_mode):
                raise UnsafePathError("create directory", probe, "is a symlink; refusing to follow it")
            if not stat.S_ISDIR(st.st_mode):
                raise UnsafePathError("create directory", probe, "exists and is not a directory")
            existing = st
        elif not os.path.isdir(probe):
            raise UnsafePathError("create directory", probe, "exists and is not a directory")
        break
    for directory in reversed(missing):
        try:
            os.mkdir(directory, DIR_MODE)
        except FileExistsError:
            if not stat.S_ISDIR(os.lstat(directory).st_mode):
                raise UnsafePathError("create directory", directory, "exists and is not a directory") from None
        except OSError as exc:
            raise write_error("create directory", directory, exc) from exc
    _make_private(path, existing)
    if sync:
        for directory in reversed(missing):
            # A new directory entry is durable only once its parent is synced.
            fsync_dir(directory.parent)
    return path


def _make_private(path: Path, existing: Optional[os.stat_result]) -> None:
    """Give a directory ``ensure_private_dir`` created mode 0700 (whatever the umask), and clear
    the group and other bits of one that ``existing`` says was there (never adding a bit, and
    never changing one this process cannot write)."""
    if existing is None:
        mode = DIR_MODE
    else:
        current = stat.S_IMODE(existing.st_mode)
        if not current & 0o077 or not os.access(path, os.W_OK, follow_symlinks=False):
            return
        mode = current & DIR_MODE
    try:
        os.chmod(path, mode)
    except OSError as exc:
        raise StoreIOError.from_os_error("chmod", path, exc) from exc


def fsync_dir(path: os.PathLike | str) -> None:
    """fsync a directory so that entries created or renamed in it survive a power cut."""
    try:
        fd = os.open(path, os.O_RDONLY | _O_CLOEXEC | getattr(os, "O_DIRECTORY", 0))
    except OSError as exc:
        raise StoreIOError.from_os_error("open directory", path, exc) from exc
    try:
        os.fsync(fd)
    except OSError as exc:
        # Some filesystems cannot fsync a directory; that is not a data-loss signal.
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
            raise StoreIOError.from_os_error("fsync directory", path, exc) from exc
    finally:
        os.close(fd)


def sync_file_system(path: os.PathLike | str) -> None:
    """Make every write to the file system holding ``path`` durable: one ``syncfs(2)`` (Linux),
    or a whole-system ``sync(2)`` where the C library has none. Raises :class:`StoreIOError` when
    it fails (a write the kernel could not complete). A batch of files written unsynced is made
    durable by this one call instead of one ``fsync`` each."""
    import ctypes  # (not on the append path, which never needs it)

    try:
        syncfs = ctypes.CDLL(None, use_errno=True).syncfs
    except (OSError, AttributeError):
        os.sync()
        return
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise StoreIOError.from_os_error("open directory", path, exc) from exc
    try:
        if syncfs(fd) != 0:
            err = ctypes.get_errno()
            raise StoreIOError("syncfs", path, os.strerror(err), err)
    finally:
        os.close(fd)


def open_error(op: str, path: os.PathLike | str, exc: OSError, *, writing: bool = False) -> StoreIOError:
    """The memstore error of a no-follow, non-blocking open of ``path`` that failed with ``exc``:
    :class:`UnsafePathError` when ``path`` is a symlink (``ELOOP`` under ``O_NOFOLLOW``) or a
    FIFO nobody reads (``ENXIO`` for a non-blocking write open); for an open ``writing``, a
    :class:`~memstore.errors.StoreReadOnly` when this process may not write there; else
    :class:`StoreIOError`."""
    if exc.errno == errno.ELOOP:
        return UnsafePathError(op, path, "refusing to follow a symlink")
    if exc.errno in (errno.ENXIO, errno.EISDIR):
        return UnsafePathError(op, path, "is not a regular file")
    if writing:
        return write_error(op, path, exc)
    return StoreIOError.from_os_error(op, path, exc)


def file_kind(mode: int) -> str:
    """What ``mode`` (an ``st_mode``) says the file is, for error messages: ``a regular
    file``, ``a directory``, ``a symlink``, ``a FIFO``, ``a socket``, ``a device``."""
    if stat.S_ISREG(mode):
        return "a regular file"
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISLNK(mode):
        return "a symlink"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a regular file"


def not_regular_detail(mode: int) -> str:
    """``is a FIFO, not a regular file`` and the like (see :func:`file_kind`)."""
    kind = file_kind(mode)
    return "is not a regular file" if kind == "not a regular file" else f"is {kind}, not a regular file"


def _require_regular(fd: int, path: os.PathLike | str, op: str) -> os.stat_result:
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise UnsafePathError(op, path, "is not a regular file")
    return st


def open_private_append(path: os.PathLike | str) -> tuple[int, bool]:
    """Open ``path`` for appending, creating it 0600 if missing; never follows a symlink.

    Returns ``(fd, created)``. A newly created file's directory entry is synced.
    """
    created = False
    flags = os.O_WRONLY | os.O_APPEND | _O_NOFOLLOW | _O_CLOEXEC | _O_NONBLOCK
    try:
        try:
            fd = os.open(path, flags)
        except FileNotFoundError:
            try:
                fd = os.open(path, flags | os.O_CREAT | os.O_EXCL, FILE_MODE)
                created = True
            except FileExistsError:
                fd = os.open(path, flags)
    except OSError as exc:
        raise open_error("open for append", path, exc, writing=True) from exc
    st = _require_regular(fd, path, "open for append")
    try:
        _tighten(fd, st)
    except OSError as exc:
        os.close(fd)
        raise StoreIOError.from_os_error("chmod", path, exc) from exc
    if created:
        fsync_dir(Path(path).parent)
    return fd, created


def open_private_rw(path: os.PathLike | str) -> int:
    """Open (creating 0600 if needed) ``path`` for read and write without following symlinks."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | _O_NOFOLLOW | _O_CLOEXEC | _O_NONBLOCK, FILE_MODE)
    except OSError as exc:
        raise open_error("open", path, exc, writing=True) from exc
    st = _require_regular(fd, path, "open")
    try:
        _tighten(fd, st)
    except OSError:
        pass
    return fd


def _tighten(fd: int, st: os.stat_result) -> None:
    """Clear the group and other bits of the open file ``fd`` (a new file is created 0600
    whatever the umask; an existing one never gains a bit)."""
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o077:
        os.fchmod(fd, mode & FILE_MODE)


def open_read_no_follow(path: os.PathLike | str) -> Optional[int]:
    """Open ``path`` read-only without following symlinks; ``None`` when it does not exist.

    A symlink or anything but a regular file (a FIFO, a socket, a device, a directory) raises
    :class:`UnsafePathError` naming ``path``; the open never blocks."""
    try:
        fd = os.open(path, os.O_RDONLY | _O_NOFOLLOW | _O_CLOEXEC | _O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise open_error("open", path, exc) from exc
    _require_regular(fd, path, "open")
    return fd


def read_no_follow(path: os.PathLike | str) -> Optional[bytes]:
    """Return the bytes of the regular file ``path``, or ``None`` when it does not exist.

    A symlink or a non-regular file is an error, not "absent".
    """
    fd = open_read_no_follow(path)
    if fd is None:
        return None
    try:
        with os.fdopen(fd, "rb", closefd=True) as fh:
            return fh.read()
    except OSError as exc:
        raise StoreIOError.from_os_error("read", path, exc) from exc


def write_all(fd: int, data: bytes | bytearray | memoryview, path: os.PathLike | str) -> None:
    """Write every byte of ``data`` to ``fd``, looping over short writes."""
    view = memoryview(data)
    while view:
        try:
            written = os.write(fd, view)
        except OSError as exc:
            raise StoreIOError.from_os_error("write", path, exc) from exc
        if written == 0:
            raise StoreIOError("write", path, "wrote 0 bytes")
        view = view[written:]


def atomic_write(path: os.PathLike | str, data: bytes, *, durable: bool = True) -> None:
    """Replace ``path`` with ``data`` atomically, as a private (0600) file.

    The bytes go to a unique temp file in the same directory, which is renamed over ``path``. The
    destination is never opened for writing, and a symlink at ``path`` is refused. With
    ``durable`` the temp file and the directory are fsynced, so the new content survives a power
    cut; without it, readers still see either the old or the new file, never a mix.
    """
    path = os.fspath(path)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise StoreIOError.from_os_error("stat", path, exc) from exc
    if st is not None:
        if stat.S_ISLNK(st.st_mode):
            raise UnsafePathError("replace", path, "is a symlink; refusing to follow it")
        if not stat.S_ISREG(st.st_mode):
            raise UnsafePathError("replace", path, "exists and is not a regular file")
    directory = os.path.dirname(path)
    tmp, _st = write_temp_beside(path, data, sync=durable, write_op="fsync")
    try:
        os.replace(tmp, path)
    except BaseException as exc:
        remove_temp(tmp)
        if isinstance(exc, OSError):
            raise StoreIOError.from_os_error("rename", path, exc) from exc
        raise
    if durable:
        fsync_dir(directory or ".")


# Python has no os.fdatasync on macOS.
_fdatasync = getattr(os, "fdatasync", os.fsync)


def write_temp_beside(
    path: os.PathLike | str, data: bytes | bytearray, *, sync: bool, create_op: str = "create", write_op: str = "write"
) -> tuple[str, os.stat_result]:
    """Write ``data`` to a new private (0600) temp file in ``path``'s directory, named so that
    the next open removes it if its writer dies (see :func:`temp_file_pid`), and ``fdatasync``
    it when ``sync``; return its path and stat. A failure removes it again."""
    directory, name = os.path.split(os.fspath(path))
    tmp = os.path.join(directory, f".{name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:12]}")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_NOFOLLOW | _O_CLOEXEC, FILE_MODE)
    except OSError as exc:
        raise write_error(create_op, tmp, exc) from exc
    try:
        try:
            write_all(fd, data, tmp)
            if sync:
                _fdatasync(fd)
            st = os.fstat(fd)
        except OSError as exc:
            raise StoreIOError.from_os_error(write_op, tmp, exc) from exc
        finally:
            os.close(fd)
    except BaseException:
        remove_temp(tmp)
        raise
    return tmp, st


def remove_temp(tmp: os.PathLike | str) -> None:
    """Remove a temp file a failed write leaves behind (logged if it cannot be)."""
    try:
        os.unlink(tmp)
    except FileNotFoundError:
        pass
    except OSError as exc:
        logger.warning("could not remove the temp file %s: %s", tmp, exc)


def remove_if_exists(path: os.PathLike | str) -> bool:
    """Unlink ``path`` (never following a symlink); return whether something was removed."""
    try:
        os.unlink(path)
        return True
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise StoreIOError.from_os_error("remove", path, exc) from exc


def write_new_file(path: os.PathLike | str, data: bytes) -> Path:
    """Durably write ``data`` to a new private file at ``path``, never replacing anything: if the
    name is taken, ``-1``, ``-2``, ... is appended. Returns the path written."""
    base = os.fspath(path)
    for attempt in range(10_000):
        candidate = base if attempt == 0 else f"{base}-{attempt}"
        try:
            fd = os.open(candidate, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_NOFOLLOW | _O_CLOEXEC, FILE_MODE)
        except FileExistsError:
            continue
        except OSError as exc:
            raise write_error("create", candidate, exc) from exc
        try:
            write_all(fd, data, candidate)
            os.fsync(fd)
        except OSError as exc:
            raise StoreIOError.from_os_error("fsync", candidate, exc) from exc
        finally:
            os.close(fd)
        fsync_dir(os.path.dirname(candidate) or ".")
        return Path(candidate)
    raise StoreIOError("create", base, "no free name")
