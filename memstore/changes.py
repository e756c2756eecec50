"""The store's change feed: which session directories changed since the catalog last looked.

memstore's own writers record what they change in ``<root>/changes/``: one empty marker file
per changed session directory, named as the directory. A writer creates it after it committed
a batch of the session's rows to its index and after it put a manifest in place (what a refresh
reads is there by then); retention and importers create it after they removed, renamed or
rewrote a session. Creating a marker is
one ``open(O_CREAT)`` and one ``close``, never synced: it is a hint, and a marker lost to a
crash is found by the catalog's sweep (see :mod:`memstore.catalog`), as every change a writer
memstore does not control (VT Code appending to its own log) is.

The catalog consumes the feed under its store lock: it renames each marker to
``.processing-<name>`` *before* it reads that session (:func:`claim`), and removes the renamed
marker only once what it copied is committed (:func:`release`). A change made after the rename
makes a new marker, so it is never lost; a refresh killed before its commit leaves the renamed
markers, which the next refresh takes up again.

Nothing here raises for a marker that cannot be written (a read-only store, a full disk): the
writer's own work has succeeded, and the sweep finds the change.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
from collections.abc import Iterable
from typing import Optional

from .layout import CHANGES_DIR, SESSIONS_DIR

logger = logging.getLogger(__name__)

__all__ = [
    "PROCESSING_PREFIX",
    "claim",
    "ensure_feed",
    "mark_changed",
    "mark_session_changed",
    "marked",
    "pending",
    "release",
]

PROCESSING_PREFIX = ".processing-"
"""A marker the catalog has taken up: ``.processing-<session directory name>``."""

_DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
_MARK_FLAGS = (
    os.O_WRONLY | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NONBLOCK", 0)
)


def _valid_name(name: str) -> bool:
    # A session directory's name: never empty, never a dot name, never a path.
    return bool(name) and not name.startswith(".") and "/" not in name and "\0" not in name


def mark_changed(root: os.PathLike[str] | str, name: str) -> None:
    """Record that the session directory ``<root>/sessions/<name>`` changed (was written,
    rewritten or removed). Cheap (two ``open`` and two ``close`` calls) and never raises: a
    marker that cannot be written is logged at debug level and left to the catalog's sweep.
    Nothing is recorded in a store without a feed: the catalog makes ``changes/`` (see
    :func:`ensure_feed`) before its first look at the sessions, so a store that has no catalog
    gets no marker, and its first refresh looks at every session anyway. A ``changes`` that is
    a symlink or not a directory is never written through."""
    if not _valid_name(name):
        logger.debug("change feed: %r is not a session directory name; nothing recorded", name)
        return
    directory = os.path.join(os.fspath(root), CHANGES_DIR)
    try:
        dir_fd = os.open(directory, _DIR_FLAGS)
    except FileNotFoundError:
        return  # no catalog has looked at this store yet: nothing to tell
    except OSError as exc:
        logger.debug("change feed: cannot open %s (%s); the catalog's sweep will find %s", directory, exc, name)
        return
    try:
        os.close(os.open(name, _MARK_FLAGS, 0o600, dir_fd=dir_fd))
    except OSError as exc:
        logger.debug("change feed: cannot mark %s in %s: %s", name, directory, exc)
    finally:
        os.close(dir_fd)


def ensure_feed(root: os.PathLike[str] | str) -> bool:
    """Make ``<root>/changes/`` (0700) if it is missing; whether the store has a feed to read.
    The catalog calls it, under its lock, before it looks at the sessions: a writer that
    publishes after that marks what it changed, and one that published before changed what the
    catalog is about to look at."""
    directory = os.path.join(os.fspath(root), CHANGES_DIR)
    try:
        os.mkdir(directory, 0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        logger.debug("change feed: cannot create %s: %s", directory, exc)
        return False
    try:
        return stat.S_ISDIR(os.lstat(directory).st_mode)
    except OSError:
        return False


def mark_session_changed(session_dir: os.PathLike[str] | str) -> None:
    """:func:`mark_changed` for a session given by its directory: only a directory of a store
    (``<root>/sessions/<name>``) has a feed to tell; any other is left alone."""
    path = os.path.normpath(os.fspath(session_dir))
    parent, name = os.path.split(path)
    root, sessions = os.path.split(parent)
    if sessions == SESSIONS_DIR:
        mark_changed(root, name)


def pending(root: os.PathLike[str] | str) -> bool:
    """Whether the feed holds any marker (new, or taken up by a refresh that did not finish):
    one ``scandir`` of ``changes/``, nothing read. A feed that cannot be listed counts as
    having some (the caller then looks at the store)."""
    try:
        with os.scandir(os.path.join(os.fspath(root), CHANGES_DIR)) as it:
            for _entry in it:
                return True
    except FileNotFoundError:
        return False
    except OSError as exc:
        logger.debug("change feed: cannot list it: %s", exc)
        return True
    return False


def marked(root: os.PathLike[str] | str) -> set[str]:
    """The session directory names the feed holds a marker for (new or taken up), read without
    taking any up: what a process that cannot write the store knows has changed. A feed that
    cannot be listed names none."""
    try:
        with os.scandir(os.path.join(os.fspath(root), CHANGES_DIR)) as it:
            entries = [entry.name for entry in it]
    except OSError:
        return set()
    names = set()
    for entry in entries:
        name = entry[len(PROCESSING_PREFIX) :] if entry.startswith(PROCESSING_PREFIX) else entry
        if _valid_name(name):
            names.add(name)
    return names


def claim(root: os.PathLike[str] | str) -> Optional[list[str]]:
    """Take up every marker: rename each new one to ``.processing-<name>`` and return the session
    directory names (with those a refresh took up before and never released), sorted. The
    caller holds the store's ``catalog`` lock, reads those sessions *after* this call, and
    :func:`release`\\ s them once it committed. ``None`` when the feed cannot be read or its
    markers cannot be renamed (a store this process cannot write): the caller must then look
    at every session."""
    directory = os.path.join(os.fspath(root), CHANGES_DIR)
    try:
        st = os.lstat(directory)
    except FileNotFoundError:
        return []
    except OSError as exc:
        logger.warning("change feed: cannot examine %s: %s", directory, exc)
        return None
    if not stat.S_ISDIR(st.st_mode):
        logger.warning("change feed: %s is a symlink or not a directory; not read", directory)
        return None
    names: set[str] = set()
    try:
        with os.scandir(directory) as it:
            entries = [entry.name for entry in it]
    except OSError as exc:
        logger.warning("change feed: cannot list %s: %s", directory, exc)
        return None
    for entry in entries:
        if entry.startswith(PROCESSING_PREFIX):
            name = entry[len(PROCESSING_PREFIX) :]
            if _valid_name(name):
                names.add(name)
            continue
        if not _valid_name(entry):
            continue  # not a marker memstore writes (a temp file, say): left alone
        try:
            os.rename(os.path.join(directory, entry), os.path.join(directory, PROCESSING_PREFIX + entry))
        except FileNotFoundError:
            continue  # another refresh took it (it holds the lock: cannot happen) or it was cleared
        except OSError as exc:
            if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
                logger.info("change feed: cannot take up markers in %s (%s)", directory, exc)
                return None
            raise
        names.add(entry)
    return sorted(names)


def release(root: os.PathLike[str] | str, names: Iterable[str]) -> None:
    """Remove the taken-up markers of ``names`` (their changes are committed). A marker that
    is already gone is fine; one that cannot be removed is logged and taken up again next
    time (which costs a look at that session, nothing more)."""
    directory = os.path.join(os.fspath(root), CHANGES_DIR)
    for name in names:
        try:
            os.unlink(os.path.join(directory, PROCESSING_PREFIX + name))
        except FileNotFoundError:
            pass
        except OSError as exc:
            logger.warning("change feed: cannot remove the marker of %s: %s", name, exc)
