"""The store's identity: a store id that never changes, and a label people read.

``<root>/store.json`` holds ``{"store_id": <UUID>, "label": <text>, "created_at": <time>}``.
The id is made once, the first time anything asks for it, and then names the store for good:
exports put it on every row, so rows from several stores can be told apart wherever they end
up. The label defaults to the machine's hostname and can be changed with :func:`set_label`;
the id cannot. :func:`machine_id` names the machine an export runs on (a store copied to
another machine keeps its id; the machine id says where it is now).

Creation is atomic and agreed on: the file is written whole under a temporary name and linked
into place with ``link(2)``, which fails when the name exists. Concurrent first callers each
try; exactly one link succeeds, and every caller then reads the file that won, so they all
return the same id. No reader ever sees a partly written file. (On a filesystem without hard
links the file is created with ``O_EXCL`` and written in place; a reader that finds it still
empty waits for its writer.)
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import socket
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Union

import orjson

from .errors import MemstoreError, StoreIOError
from .events import utc_now
from .fsio import FILE_MODE, atomic_write, fsync_dir, read_no_follow, remove_temp, write_all, write_temp_beside
from .layout import store_identity_path

logger = logging.getLogger(__name__)

PathArg = Union[str, "os.PathLike[str]"]

MAX_LABEL_CHARS = 200
DEFAULT_LABEL = "unnamed-store"  # when the machine has no hostname to offer
# How long a reader waits for the writer of a file created in place (no hard links) to fill it.
_FILL_WAIT_SECONDS = 5.0


class InvalidLabel(MemstoreError, ValueError):
    """A store label must be non-empty text of at most 200 characters without control characters."""


@dataclass(frozen=True)
class StoreIdentity:
    """Who a store is: ``store_id`` (a UUID, as text, fixed at creation), ``label`` (for people;
    the hostname by default) and ``created_at`` (when the identity was made)."""

    store_id: str
    label: str
    created_at: str

    def to_dict(self) -> dict[str, str]:
        return {"store_id": self.store_id, "label": self.label, "created_at": self.created_at}


def store_identity(root: PathArg) -> StoreIdentity:
    """The identity of the store at ``root``, created on first use (see the module doc).

    Raises :class:`StoreIOError` when ``root`` is not a directory, when the identity cannot be
    written (a read-only store that has none yet) or read, or when ``store.json`` is not a
    store identity (it names the file; removing it gives the store a new id).
    """
    root = Path(root)
    path = store_identity_path(root)
    found = _read(path)
    if found is not None:
        return found
    if not root.is_dir():
        raise StoreIOError("create store identity", root, "no such store directory")
    _create(path, StoreIdentity(str(uuid.uuid4()), default_label(), utc_now()))
    found = _read(path)
    if found is None:  # removed between our creation and our read: someone reset it; try again
        return store_identity(root)
    return found


def set_label(root: PathArg, label: str) -> StoreIdentity:
    """Give the store at ``root`` a new label (its id stays); return the new identity.
    :class:`InvalidLabel` for a label that is empty, too long or holds control characters."""
    label = check_label(label)
    current = store_identity(root)
    updated = StoreIdentity(current.store_id, label, current.created_at)
    atomic_write(store_identity_path(root), _encode(updated))
    return updated


def check_label(label: object) -> str:
    """``label`` stripped, if it is one (see :class:`InvalidLabel`)."""
    if not isinstance(label, str):
        raise InvalidLabel(f"a store label must be text, not {type(label).__name__}")
    text = label.strip()
    if not text:
        raise InvalidLabel("a store label cannot be empty")
    if len(text) > MAX_LABEL_CHARS:
        raise InvalidLabel(f"a store label is at most {MAX_LABEL_CHARS} characters (got {len(text)})")
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in text):
        raise InvalidLabel("a store label cannot contain control characters")
    return text


def default_label() -> str:
    """The label a new store gets: this machine's hostname (when it is a valid label)."""
    try:
        return check_label(socket.gethostname())
    except (InvalidLabel, OSError):
        return DEFAULT_LABEL


# Where the OS keeps the machine's id (systemd, then D-Bus).
MACHINE_ID_FILES = ("/etc/machine-id", "/var/lib/dbus/machine-id")


def machine_id() -> str | None:
    """An id of this machine for memstore: a hash of the OS's machine id
    (``/etc/machine-id``) keyed with memstore's name, as systemd recommends for an application
    (the raw id is not to be shown), so the same machine always gives the same value and no
    other tool's id can be derived from it. ``None`` where the OS keeps no machine id (macOS,
    some containers)."""
    for name in MACHINE_ID_FILES:
        try:
            raw = Path(name).read_text(encoding="ascii").strip().lower()
        except (OSError, UnicodeDecodeError):
            continue
        if len(raw) == 32 and all(ch in "0123456789abcdef" for ch in raw):
            return hashlib.sha256(b"memstore-machine-id:" + raw.encode()).hexdigest()[:32]
    return None


# --------------------------------------------------------------------------------------------


def _encode(identity: StoreIdentity) -> bytes:
    return orjson.dumps(identity.to_dict(), option=orjson.OPT_INDENT_2 | orjson.OPT_APPEND_NEWLINE)


def _create(path: Path, identity: StoreIdentity) -> None:
    """Put ``identity`` at ``path`` unless something is already there (then leave that)."""
    data = _encode(identity)
    tmp, _st = write_temp_beside(path, data, sync=True, create_op="create store identity")
    try:
        try:
            os.link(tmp, path, follow_symlinks=False)
        except FileExistsError:
            return
        except OSError as exc:
            if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK, errno.ENOSYS):
                raise StoreIOError.from_os_error("create store identity", path, exc) from exc
            _create_in_place(path, data)
            return
    finally:
        remove_temp(tmp)
    fsync_dir(path.parent)


def _create_in_place(path: Path, data: bytes) -> None:
    """The same, on a filesystem without hard links: ``O_EXCL`` create, then write."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags, FILE_MODE)
    except FileExistsError:
        return
    except OSError as exc:
        raise StoreIOError.from_os_error("create store identity", path, exc) from exc
    try:
        write_all(fd, data, path)
        os.fsync(fd)
    except OSError as exc:
        raise StoreIOError.from_os_error("fsync", path, exc) from exc
    finally:
        os.close(fd)
    fsync_dir(path.parent)


def _read(path: Path) -> StoreIdentity | None:
    """The identity in ``path``; ``None`` when there is no such file."""
    deadline = time.monotonic() + _FILL_WAIT_SECONDS
    while True:
        data = read_no_follow(path)
        if data is None:
            return None
        if data.strip() or time.monotonic() >= deadline:
            break
        time.sleep(0.01)  # created in place by another process that has not written it yet
    try:
        value = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise StoreIOError(
            "read store identity", path, f"not JSON ({exc}); remove it to give the store a new id"
        ) from None
    if not isinstance(value, dict):
        raise StoreIOError("read store identity", path, "not a JSON object; remove it to give the store a new id")
    store_id, label, created_at = value.get("store_id"), value.get("label"), value.get("created_at")
    try:
        parsed = uuid.UUID(store_id) if isinstance(store_id, str) else None
    except ValueError:
        parsed = None
    if parsed is None:
        raise StoreIOError(
            "read store identity",
            path,
            f"store_id {store_id!r} is not a UUID; remove the file to give the store a new id",
        )
    try:
        label = check_label(label)
    except InvalidLabel as exc:
        logger.warning("%s: %s; using %r", path, exc, default_label())
        label = default_label()
    return StoreIdentity(str(parsed), label, created_at if isinstance(created_at, str) else "")
