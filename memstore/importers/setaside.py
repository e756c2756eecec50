"""Setting an imported session aside, so that its source can be imported afresh beside it.

When a source no longer describes what was imported from it (it was rewritten or truncated,
not grown), the old session is not deleted: its directory is renamed, inside
``<root>/sessions``, to ``<session id>.superseded-<UTC time>``, a session of its own that keeps
every event (imported or appended by an agent), stays searchable and is listed like any other.
``derived/set-aside.json`` in it says what it was, when and why. The source is then imported
into a new session under the original id.

The rename happens under the session's liveness lock, the one every writer takes and that
retention's removal takes: a process that has the session open keeps it (the set-aside is
refused as busy), and one that opens it at that moment finds it gone and starts the new one.
"""

from __future__ import annotations

import logging
import os
import stat
import time
import uuid
from pathlib import Path
from typing import Optional

import orjson

from .. import events as ev
from ..changes import mark_changed
from ..errors import MemstoreError, SessionBusyError, StoreIOError
from ..fsio import atomic_write, fsync_dir
from ..layout import DERIVED_DIR, SET_ASIDE_FILE, session_dir_name, session_directory, sessions_root
from ..retention import session_retention_pinned
from ..session.lock import LivenessLock, SessionGone
from ..session.log import rebuild_index
from ..session.manifest import load_manifest

logger = logging.getLogger(__name__)

SUPERSEDED_INFIX = ".superseded-"


class SessionPinned(Exception):
    """The session to set aside is pinned: a pinned session stays where it is."""

    def __init__(self, session_id: str):
        super().__init__(
            f"session {session_id!r} is pinned: it is not set aside to import its changed source again; "
            "unpin it to re-import its source"
        )


class CannotSetAside(Exception):
    """The session's id cannot be renamed (its directory name is a hash of it): it is kept
    as it is and its source is not imported again."""


def superseded_id(session_id: str, now: float) -> str:
    """The id a set-aside session takes: ``<id>.superseded-<YYYYmmddTHHMMSSZ>-<6 hex>``."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now))
    return f"{session_id}{SUPERSEDED_INFIX}{stamp}-{uuid.uuid4().hex[:6]}"


def is_superseded(session_id: str) -> bool:
    """Whether ``session_id`` names a session an import set aside."""
    return SUPERSEDED_INFIX in session_id


def directory_identity(directory: Path) -> Optional[tuple[int, int]]:
    """``(st_dev, st_ino)`` of a real session directory (``None``: missing, a symlink, a file)."""
    try:
        st = os.lstat(directory)
    except OSError:
        return None
    return (st.st_dev, st.st_ino) if stat.S_ISDIR(st.st_mode) else None


def set_aside_session(root: Path, session_id: str, reason: str, expected: Optional[tuple[int, int]] = None) -> str:
    """Rename the session ``session_id`` to a new id (see the module docstring) and return
    that id. ``expected`` is the :func:`directory_identity` of the session the caller judged:
    if another directory took its place meanwhile (another import set it aside and imported
    afresh), nothing is done. Raises :class:`SessionPinned` for a pinned session,
    :class:`CannotSetAside` for one whose directory name is not its id,
    :class:`SessionBusyError` when another process has it open or it changed meanwhile, and
    :class:`StoreIOError` when the rename fails or it is not a real directory (nothing is
    changed then)."""
    directory = session_directory(root, session_id)
    if directory_identity(directory) is None:
        raise StoreIOError("set aside", directory, "is not a session directory (missing, a symlink or a file)")
    if session_retention_pinned(directory):
        raise SessionPinned(session_id)
    new_id = superseded_id(session_id, time.time())
    if directory.name != session_id or session_dir_name(new_id) != new_id:
        raise CannotSetAside(
            f"session {session_id!r} has a hashed directory name and cannot be renamed; it is "
            "kept as it is and its changed source is not imported again"
        )
    target = sessions_root(root) / new_id
    lock = LivenessLock(directory)
    try:
        if not lock.acquire():
            raise SessionBusyError(f"session {session_id!r} is open in another process; it cannot be set aside now")
    except SessionGone:
        raise SessionBusyError(f"session {session_id!r} was removed while it was being set aside") from None
    try:
        if expected is not None and directory_identity(directory) != expected:
            raise SessionBusyError(f"session {session_id!r} was replaced while it was being set aside")
        if session_retention_pinned(directory):  # asked again where nobody can pin it unseen
            raise SessionPinned(session_id)
        if os.path.lexists(target):  # (a rename over an empty directory would succeed)
            raise StoreIOError("set aside", target, "already exists")
        try:
            os.rename(directory, target)
        except OSError as exc:
            raise StoreIOError.from_os_error("set aside", directory, exc) from exc
        fsync_dir(sessions_root(root))
        mark_changed(root, directory.name)  # the catalog's next refresh sees both names at once
        mark_changed(root, target.name)
        note = {"set_aside_from": session_id, "set_aside_at": ev.utc_now(), "reason": reason}
        try:
            atomic_write(target / DERIVED_DIR / SET_ASIDE_FILE, orjson.dumps(note))
        except StoreIOError as exc:  # the name says it already; the note only adds the why
            logger.warning("could not write %s: %s", target / DERIVED_DIR / SET_ASIDE_FILE, exc)
    finally:
        lock.release()
    logger.warning("import: session %r set aside as %r (%s)", session_id, new_id, reason)
    try:
        # Its index and manifest still name the old id: regenerate them under the new one.
        rebuild_index(root, new_id).close()
    except MemstoreError as exc:
        logger.warning(
            "could not rebuild the index of the set-aside session %r: %s (its log is intact; "
            "`memstore rebuild` does it later)",
            new_id,
            exc,
        )
    return new_id


def finish_interrupted_set_asides(root: Path) -> list[str]:
    """Finish what a set-aside cut short (the process killed between the rename and the
    relabelling): every ``*.superseded-*`` session whose manifest still names another id (or
    has none) gets its index and manifest regenerated under its own id, and its note. Returns
    the ids finished. Sessions another process has open are left for the next time."""
    finished: list[str] = []
    base = sessions_root(root)
    try:
        names = [e.name for e in os.scandir(base) if SUPERSEDED_INFIX in e.name and e.is_dir(follow_symlinks=False)]
    except FileNotFoundError:
        return finished
    except OSError as exc:
        raise StoreIOError.from_os_error("list", base, exc) from exc
    for name in names:
        directory = base / name
        try:
            manifest = load_manifest(directory)
        except StoreIOError:
            manifest = None
        if manifest is not None and manifest.session_id == name:
            continue
        note = directory / DERIVED_DIR / SET_ASIDE_FILE
        try:
            rebuild_index(root, name).close()
            if not note.exists():
                origin = name.partition(SUPERSEDED_INFIX)[0]
                atomic_write(
                    note,
                    orjson.dumps(
                        {
                            "set_aside_from": origin,
                            "set_aside_at": None,
                            "reason": "unknown: the import setting it aside was interrupted",
                        }
                    ),
                )
        except MemstoreError as exc:
            logger.info("could not finish setting aside %s yet: %s", name, exc)
            continue
        logger.warning("import: finished setting aside %r (the import doing it was interrupted)", name)
        finished.append(name)
    return finished


__all__ = [
    "set_aside_session",
    "finish_interrupted_set_asides",
    "directory_identity",
    "superseded_id",
    "is_superseded",
    "SessionPinned",
    "CannotSetAside",
    "SUPERSEDED_INFIX",
]
