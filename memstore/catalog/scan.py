"""Looking at session directories without reading them: which ones there are, what kind of
session each is, and the file stamps that say whether one changed since the catalog copied it.

Two stamps per session, both strings of ``type:inode:size:mtime_ns`` per file (``-`` for a
missing one; the type, not the permission bits: a ``chmod`` changes no content), taken with
``os.stat`` on plain strings (no pathlib: a sweep stats every session):

- the *sweep* stamp: the log and the memory view (and, for a session without a log, its
  manifest). Cheap enough to take for every session every few seconds, it sees what any
  writer does, memstore's or not: VT Code appending to its own log, rewriting it, replacing
  its memory view;
- the full *stamp*: the sweep stamp plus the manifest, the index and its WAL: every file a copy
  reads. A session whose full stamp equals the one recorded with its copy is unchanged.
"""

from __future__ import annotations

import enum
import logging
import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Optional

from ..layout import (
    DERIVED_DIR,
    EVENTS_FILE,
    INDEX_DIR,
    INDEX_FILE,
    MANIFEST_FILE,
    MEMORY_FILE,
    TRAJECTORY_FILE,
    is_legacy_session,
    iter_session_dirs,
)

logger = logging.getLogger("memstore.catalog")

_MEMORY = os.path.join(DERIVED_DIR, MEMORY_FILE)
_TRAJECTORY = os.path.join(DERIVED_DIR, TRAJECTORY_FILE)
_INDEX = os.path.join(INDEX_DIR, INDEX_FILE)
_INDEX_WAL = _INDEX + "-wal"
NOTHING = "-"  # the stamp of a missing file
EMPTY_SWEEP = "-|-|-|-"  # no log, memory view, manifest or trajectory: no session (yet)


class SessionKind(enum.Enum):
    """What makes a directory a session: its log, or (VT Code's migration) a manifest and a
    memory view without a log."""

    LOG = "log"
    LEGACY = "legacy"


@dataclass(frozen=True)
class Examined:
    """A session directory as its files' stamps describe it."""

    name: str
    path: str
    kind: SessionKind
    stamp: str
    sweep: str
    log_bytes: int


def file_stamp(path: str) -> str:
    """``type:inode:size:mtime_ns`` of ``path`` (not followed), ``-`` when it does not exist.
    Any other failure (a directory that cannot be entered) raises its ``OSError``."""
    try:
        st = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return NOTHING
    except NotADirectoryError:
        return NOTHING
    return f"{stat.S_IFMT(st.st_mode):o}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}"


def sweep_stamp(directory: str) -> str:
    """The sweep stamp of the session directory ``directory`` (see the module docstring)."""
    log = file_stamp(os.path.join(directory, EVENTS_FILE))
    memory = file_stamp(os.path.join(directory, _MEMORY))
    if log != NOTHING:
        return f"{log}|{memory}"
    return _legacy_stamp(directory, memory, file_stamp(os.path.join(directory, MANIFEST_FILE)))


def _legacy_stamp(directory: str, memory: str, manifest: str) -> str:
    # Without a log: the files that make a legacy session one (see layout.is_legacy_session).
    return f"{NOTHING}|{memory}|{manifest}|{file_stamp(os.path.join(directory, _TRAJECTORY))}"


def examine(name: str, directory: str) -> Optional[Examined]:
    """What kind of session ``directory`` is, with its stamps; ``None`` when it is none: no log
    that is a regular file and not a legacy session (:func:`memstore.layout.is_legacy_session`;
    a log that exists but is not a regular file makes no session either). Raises ``OSError``
    when it cannot be examined."""
    log_path = os.path.join(directory, EVENTS_FILE)
    try:
        st = os.stat(log_path, follow_symlinks=False)
    except FileNotFoundError:
        st = None
    except NotADirectoryError:
        return None
    memory = file_stamp(os.path.join(directory, _MEMORY))
    manifest = file_stamp(os.path.join(directory, MANIFEST_FILE))
    if st is None:
        if not is_legacy_session(directory):
            return None
        sweep = _legacy_stamp(directory, memory, manifest)
        return Examined(name, directory, SessionKind.LEGACY, sweep, sweep, 0)
    if not stat.S_ISREG(st.st_mode):
        return None
    log = f"{stat.S_IFMT(st.st_mode):o}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}"
    sweep = f"{log}|{memory}"
    index = file_stamp(os.path.join(directory, _INDEX))
    wal = file_stamp(os.path.join(directory, _INDEX_WAL))
    return Examined(name, directory, SessionKind.LOG, f"{sweep}|{manifest}|{index}|{wal}", sweep, st.st_size)


def session_directories(root: os.PathLike[str] | str) -> dict[str, str]:
    """Every directory under ``<root>/sessions`` that may hold a session, name -> path (see
    :func:`memstore.layout.iter_session_dirs` for what is left out, and why)."""
    return {entry.name: entry.path for entry in iter_session_dirs(root, on_skip=_skipped)}


def _skipped(name: str, reason: str) -> None:
    if not name.startswith("."):
        logger.debug("catalog: %r under sessions/ is left out: %s", name, reason)


@dataclass
class Sweep:
    """What a sweep found: every directory there is (``present``), those whose sweep stamp is
    not the one recorded (``changed``: new, grown, rewritten, or not examinable)."""

    present: set[str]
    changed: set[str]


def sweep(root: os.PathLike[str] | str, recorded: dict[str, str], always: Iterable[str] = ()) -> Sweep:
    """One ``scandir`` of ``sessions/`` and a few ``stat``\\ s per directory: the directories
    whose sweep stamp differs from ``recorded`` (name -> stamp), plus those in ``always`` that
    are present (sessions a refresh could not copy: tried again at every sweep)."""
    directories = session_directories(root)
    changed: set[str] = set()
    retry = set(always)
    for name, path in directories.items():
        try:
            stamp = sweep_stamp(path)
        except OSError:
            changed.add(name)  # examined (and reported) by the refresh
            continue
        previous = recorded.get(name)
        if previous != stamp and (previous is not None or stamp != EMPTY_SWEEP) or name in retry:
            changed.add(name)
    return Sweep(set(directories), changed)
