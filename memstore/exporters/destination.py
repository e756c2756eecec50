"""Where an export goes: a local directory, or an object-store URL through fsspec.

A destination writes files so that a reader never sees one half-written:

- **Local** (a path, or a ``file://`` URL): the bytes go to a hidden temporary file beside the
  target (``.<name>.tmp-<pid>-<hex>``: the ``*.parquet`` globs of query engines skip it, and
  Spark and Hive skip names starting with a dot), which is then renamed over the target in
  one step. With ``durable``, :meth:`sync` makes what was written durable before the manifest
  is written (each file and directory synced when they are few; else one ``syncfs(2)`` of the
  filesystem, as a sync per file costs tens of milliseconds each), and a write with
  ``sync_now`` (the manifest's) is synced itself, so what a manifest names survives a power
  cut. Directories are created private (0700) and files
  0600, as everything memstore writes (a directory that exists keeps its mode); no symlink
  inside the destination is followed.
- **fsspec** (``s3://``, ``gs://``, ``az://``, ``memory://``, ...): each file is one ``PUT``
  of its whole content, which object stores make visible at once, whole. There is no lock:
  two exports to one bucket prefix at the same time are the caller's to prevent.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
from collections.abc import Iterator
from contextlib import AbstractContextManager
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO, Optional, Protocol, Union

from ..errors import StoreIOError, UnsafePathError
from ..fsio import (
    FILE_MODE,
    fsync_dir,
    read_no_follow,
    remove_if_exists,
    remove_temp,
    sync_file_system,
    temp_file_pid,
    write_temp_beside,
)
from . import MissingExtra

logger = logging.getLogger(__name__)

LOCK_NAME = ".memstore-export.lock"
# Up to this many files written since the last sync are synced one by one; more, and the whole
# filesystem is (one syncfs, whose cost does not grow with the number of files).
SYNC_EACH_MAX = 64
_fdatasync = getattr(os, "fdatasync", os.fsync)  # macOS has no fdatasync


class Destination(Protocol):
    """What the exporters need of a place to write (paths are relative, ``/``-separated)."""

    url: str

    def read(self, rel: str) -> Optional[bytes]:
        """The bytes of ``rel``, ``None`` when it does not exist."""

    def write(self, rel: str, data: bytes, *, sync_now: bool = False) -> None:
        """Put ``data`` at ``rel``; readers see the old file (or none) or the new one, whole.
        ``sync_now``: durable when this returns (else from the next :meth:`sync`)."""

    def open_write(self, rel: str) -> AbstractContextManager[BinaryIO]:
        """A binary file whose content appears at ``rel`` whole when the block ends without
        error (and is durable then, on a durable destination)."""

    def remove(self, rel: str) -> bool:
        """Remove ``rel``; whether there was something to remove."""

    def files(self) -> list[str]:
        """Every file under the destination (hidden ones too), relative."""

    def prune_dirs(self, rels: set[str]) -> None:
        """Remove the directories ``rels`` (and their emptied parents) where they are empty."""

    def lock(self) -> AbstractContextManager[Any]:
        """Exclusive use of the destination for one export."""

    def sync(self) -> None:
        """Make every file written so far durable (before a manifest names them)."""

    def is_stale_temp(self, rel: str) -> bool:
        """Whether ``rel`` is a temporary file an export that is no more left behind."""


def open_destination(dest: Union[str, os.PathLike[str]], *, durable: bool = True) -> Destination:
    """The destination ``dest`` names: a URL with a scheme other than ``file`` goes through
    fsspec (:class:`~memstore.exporters.MissingExtra` when fsspec, or the filesystem's own
    package, is not installed); anything else is a local directory."""
    text = os.fspath(dest)
    if "://" in text:
        scheme = text.split("://", 1)[0].lower()
        if scheme == "file":
            return LocalDestination(Path(text[len("file://") :]), durable=durable)
        return FsspecDestination(text)
    return LocalDestination(Path(text), durable=durable)


def _relative_parts(rel: str) -> tuple[str, ...]:
    path = PurePosixPath(rel)
    if path.is_absolute() or not path.parts or any(p in ("", ".", "..") for p in path.parts):
        raise ValueError(f"not a relative destination path: {rel!r}")
    return path.parts


class LocalDestination:
    """A directory of the local filesystem (see the module doc)."""

    def __init__(self, root: Path, *, durable: bool = True):
        self.root = root.expanduser().absolute()
        self.url = str(self.root)
        self.durable = durable
        self._unsynced: list[Path] = []  # files and new directories written since the last sync
        self._dirs: set[Path] = set()  # directories known to be there (this export made or checked them)

    def _path(self, rel: str) -> Path:
        return self.root.joinpath(*_relative_parts(rel))

    def _parent(self, path: Path) -> Path:
        parent = path.parent
        if parent in self._dirs:
            return parent
        if parent != self.root and (parent.is_symlink() or not parent.is_dir()):
            # New directories are synced by the next sync(), with the files.
            self._unsynced.extend(_make_dirs(parent, inside=self.root))
        self._dirs.add(parent)
        return parent

    def read(self, rel: str) -> Optional[bytes]:
        return read_no_follow(self._path(rel))

    def write(self, rel: str, data: bytes, *, sync_now: bool = False) -> None:
        path = self._path(rel)
        parent = self._parent(path)
        tmp, _st = write_temp_beside(path, data, sync=self.durable and sync_now)
        self._replace(tmp, path)
        if self.durable and sync_now:
            fsync_dir(parent)
        else:
            self._unsynced.append(path)

    @contextlib.contextmanager
    def open_write(self, rel: str) -> Iterator[BinaryIO]:
        path = self._path(rel)
        parent = self._parent(path)
        tmp, _st = write_temp_beside(path, b"", sync=False)
        try:
            fd = os.open(tmp, os.O_WRONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
            with os.fdopen(fd, "wb") as fh:
                yield fh
                fh.flush()
                if self.durable:
                    _fdatasync(fh.fileno())
        except BaseException:
            remove_temp(tmp)
            raise
        self._replace(tmp, path)
        if self.durable:
            fsync_dir(parent)

    def _replace(self, tmp: str, path: Path) -> None:
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            st = None
        except OSError as exc:
            remove_temp(tmp)
            raise StoreIOError.from_os_error("stat", path, exc) from exc
        if st is not None and not stat.S_ISREG(st.st_mode):
            remove_temp(tmp)
            raise UnsafePathError("replace", path, "exists and is not a regular file")
        try:
            os.replace(tmp, path)
        except OSError as exc:
            remove_temp(tmp)
            raise StoreIOError.from_os_error("rename", path, exc) from exc

    def remove(self, rel: str) -> bool:
        return remove_if_exists(self._path(rel))

    def files(self) -> list[str]:
        found: list[str] = []
        if not self.root.is_dir():
            return found
        for directory, dirs, names in os.walk(self.root, followlinks=False):
            base = Path(directory).relative_to(self.root)
            for name in names:
                found.append((base / name).as_posix())
            dirs.sort()
        return sorted(found)

    def prune_dirs(self, rels: set[str]) -> None:
        self._dirs.clear()
        for rel in sorted(rels, key=lambda r: -r.count("/")):
            current = self._path(rel)
            while current != self.root:
                try:
                    os.rmdir(current)
                except OSError:
                    break  # not empty (or already gone): its parents are not empty either
                current = current.parent

    def lock(self) -> AbstractContextManager[Any]:
        from filelock import FileLock

        self._unsynced.extend(_make_dirs(self.root))
        return FileLock(self.root / LOCK_NAME, timeout=0, mode=FILE_MODE)

    def sync(self) -> None:
        if self.durable and self._unsynced:
            if len(self._unsynced) > SYNC_EACH_MAX:
                sync_file_system(self.root)
            else:
                for path in self._unsynced:
                    if path.is_dir():
                        fsync_dir(path)
                    else:
                        _sync_file(path)
                for directory in sorted({path.parent for path in self._unsynced}):
                    fsync_dir(directory)
        self._unsynced = []

    def is_stale_temp(self, rel: str) -> bool:
        pid = temp_file_pid(PurePosixPath(rel).name)
        return pid is not None and pid != os.getpid() and not _pid_alive(pid)


class FsspecDestination:
    """A directory (prefix) of an fsspec filesystem (see the module doc)."""

    def __init__(self, url: str):
        try:
            import fsspec
        except ImportError:
            raise MissingExtra(
                f"exporting to {url} needs fsspec: pip install fsspec (and the filesystem's package, "
                "such as s3fs or gcsfs)"
            ) from None
        try:
            self.fs, path = fsspec.core.url_to_fs(url)
        except ImportError as exc:
            raise MissingExtra(f"exporting to {url} needs the package of its filesystem: {exc}") from None
        except (ValueError, OSError) as exc:
            raise StoreIOError("open destination", url, str(exc)) from exc
        self.root = str(path).rstrip("/")
        self.url = url

    def _full(self, rel: str) -> str:
        return f"{self.root}/{'/'.join(_relative_parts(rel))}"

    def _fail(self, op: str, rel: str, exc: Exception) -> StoreIOError:
        return StoreIOError(op, f"{self.url.rstrip('/')}/{rel}", str(exc))

    def read(self, rel: str) -> Optional[bytes]:
        try:
            return self.fs.cat_file(self._full(rel))
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise self._fail("read", rel, exc) from exc

    def write(self, rel: str, data: bytes, *, sync_now: bool = False) -> None:
        full = self._full(rel)
        try:
            self.fs.makedirs(full.rsplit("/", 1)[0], exist_ok=True)
            self.fs.pipe_file(full, data)
        except OSError as exc:
            raise self._fail("write", rel, exc) from exc

    @contextlib.contextmanager
    def open_write(self, rel: str) -> Iterator[BinaryIO]:
        full = self._full(rel)
        try:
            self.fs.makedirs(full.rsplit("/", 1)[0], exist_ok=True)
            with self.fs.open(full, "wb") as fh:
                yield fh
        except OSError as exc:
            raise self._fail("write", rel, exc) from exc

    def remove(self, rel: str) -> bool:
        try:
            self.fs.rm_file(self._full(rel))
            return True
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise self._fail("remove", rel, exc) from exc

    def files(self) -> list[str]:
        try:
            if not self.fs.exists(self.root):
                return []
            found = self.fs.find(self.root)
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise StoreIOError("list", self.url, str(exc)) from exc
        prefix = self.root + "/"
        return sorted(str(path)[len(prefix) :] for path in found if str(path).startswith(prefix))

    def prune_dirs(self, rels: set[str]) -> None:
        """Object stores have no directories to prune (a prefix without objects is gone)."""

    def lock(self) -> AbstractContextManager[Any]:
        return contextlib.nullcontext()

    def sync(self) -> None:
        """Each ``PUT`` is durable once it returns."""

    def is_stale_temp(self, rel: str) -> bool:
        return False  # nothing is written under a temporary name


def _make_dirs(path: Path, *, inside: Optional[Path] = None) -> list[Path]:
    """Create ``path`` and its missing parents as private (0700) directories. Directories that
    exist keep their mode (a destination someone prepared stays as they made it). A file
    where a directory should be is refused, and so is a symlink below ``inside`` (the
    destination itself may be a symlink: it is what was named). Returns the directories made."""
    missing: list[Path] = []
    probe = path
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
        if stat.S_ISLNK(st.st_mode) and inside is not None and probe != inside and probe.is_relative_to(inside):
            raise UnsafePathError("create directory", probe, "is a symlink; refusing to follow it")
        if not probe.is_dir():
            raise UnsafePathError("create directory", probe, "exists and is not a directory")
        break
    for directory in reversed(missing):
        try:
            os.mkdir(directory, 0o700)
        except FileExistsError:
            if directory.is_symlink() or not directory.is_dir():
                raise UnsafePathError("create directory", directory, "exists and is not a directory") from None
        except OSError as exc:
            raise StoreIOError.from_os_error("create directory", directory, exc) from exc
    return missing


def _sync_file(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise StoreIOError.from_os_error("open", path, exc) from exc
    try:
        os.fsync(fd)
    except OSError as exc:
        raise StoreIOError.from_os_error("fsync", path, exc) from exc
    finally:
        os.close(fd)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
