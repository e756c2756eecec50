"""Where everything of a store lives: every path name of a store and of a session, spelled once,
session ids and their directory names, and the one enumeration of session directories.

```
<root>/
  sessions/<session directory>/
  sessions/.import-<hex>/<area>/<session directory>/   (an import's staging area, see importers.staging)
    events.jsonl  events.jsonl.torn-*  manifest.json  session.lock  retention-pin.json
    index/session.db  index/pending-cap-rewrite.json
    derived/memory.json  derived/progress.json  derived/trajectory.jsonl  derived/goal/
    derived/eviction-summaries.jsonl  derived/eviction-summary-*.json
    derived/import-state.json  derived/set-aside.json  derived/audit-pack.json
    derived/origin.json  derived/store-imports.json   (sessions imported from another store)
  catalog.db  gc-log.jsonl  store.json  tombstones.jsonl  import-versions.json  config.toml
  locks/<name>.lock  .trash/  changes/
```

A **legacy session** is a directory VT Code's own migration made: ``manifest.json`` and its
imported data (``derived/memory.json`` or ``derived/trajectory.jsonl``) but no
``events.jsonl``. It is a session (listed, checked, its manifest regenerable), with nothing a
log could regenerate.

Nothing here touches the disk except :func:`iter_session_dirs` and :func:`is_legacy_session`.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Optional

from .errors import InvalidSessionId, StoreIOError

logger = logging.getLogger(__name__)

# -- the store ------------------------------------------------------------------------------
SESSIONS_DIR = "sessions"
CATALOG_FILE = "catalog.db"
GC_LOG_FILE = "gc-log.jsonl"
STORE_IDENTITY_FILE = "store.json"  # the store's id and label (memstore.identity)
TOMBSTONES_FILE = "tombstones.jsonl"  # sessions removed on purpose, which an import must not recreate
IMPORT_VERSIONS_FILE = "import-versions.json"  # the agent versions imports have seen in this store
CONFIG_FILE = "config.toml"  # the store's settings (its [redact] table: memstore.redact)
LOCKS_DIR = "locks"
TRASH_DIR = ".trash"
IMPORT_STAGING_PREFIX = ".import-"  # sessions/.import-<hex>/: new sessions an import writes before publishing them
CHANGES_DIR = "changes"  # changes/<session directory>: a session changed since the catalog looked

# -- a session directory --------------------------------------------------------------------
EVENTS_FILE = "events.jsonl"
TORN_INFIX = ".torn-"  # events.jsonl.torn-<offset>-<time>: bytes a torn-tail repair cut
MANIFEST_FILE = "manifest.json"
UNUSABLE_INFIX = ".unusable-"  # manifest.json.unusable-<time>: what a rebuild found there instead of a file
LOCK_FILE = "session.lock"
PIN_FILE = "retention-pin.json"
INDEX_DIR = "index"
INDEX_FILE = "session.db"
CAP_MARKER_FILE = "pending-cap-rewrite.json"
DERIVED_DIR = "derived"
MEMORY_FILE = "memory.json"
PROGRESS_FILE = "progress.json"
TRAJECTORY_FILE = "trajectory.jsonl"
GOAL_DIR = "goal"
EVICTION_LOG = "eviction-summaries.jsonl"
EVICTION_SUMMARY_PREFIX = "eviction-summary-"
IMPORT_STATE_FILE = "import-state.json"
ORIGIN_FILE = "origin.json"  # the store (machine) a session imported from another store came from
STORE_IMPORTS_FILE = "store-imports.json"  # per source store: the log it was last imported from
SET_ASIDE_FILE = "set-aside.json"  # in a session an import set aside: what it was and why
PACK_FILE = "audit-pack.json"

# -- VT Code's legacy stores in a workspace's .vtcode/ (read by ``memstore migrate``) -------
LEGACY_HISTORY_DIR = "history"  # history/<sid>_<turn>_<stamp>.memory.json
LEGACY_LOGS_DIR = "logs"  # logs/trajectory.jsonl (live) and logs/trajectory-<stamp>.jsonl
LEGACY_TRAJECTORY_FILE = TRAJECTORY_FILE  # the live trajectory log has the view's name


# -- session ids ----------------------------------------------------------------------------

MAX_SESSION_ID_CHARS = 1024
# The longest id kept as its own directory name (NAME_MAX is 255 bytes; leave room for suffixes).
_PLAIN_NAME_MAX = 200
_PLAIN_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]*\Z")
_HASH_PREFIX_CHARS = 64


def check_session_id(session_id: str) -> str:
    """Return ``session_id`` if memstore accepts it, else raise :class:`InvalidSessionId`."""
    if not isinstance(session_id, str):
        raise InvalidSessionId(f"a session id must be a str, not {type(session_id).__name__}")
    if session_id in ("", ".", ".."):
        raise InvalidSessionId(f"{session_id!r} is not a session id")
    if "\0" in session_id:
        raise InvalidSessionId("a session id cannot contain NUL")
    try:
        session_id.encode("utf-8")
    except UnicodeEncodeError:
        # A lone surrogate (undecodable bytes from argv or a file name): it can be written
        # neither to the log nor to the index.
        raise InvalidSessionId(f"{session_id!r} is not valid Unicode (it holds a lone surrogate)") from None
    if len(session_id) > MAX_SESSION_ID_CHARS:
        raise InvalidSessionId(f"a session id is at most {MAX_SESSION_ID_CHARS} characters (got {len(session_id)})")
    return session_id


def session_dir_name(session_id: str) -> str:
    """The directory name of ``session_id``: one id, one directory.

    An id that VT Code's sanitizer leaves unchanged (ASCII letters, digits, ``-``, ``_`` and
    ``.``, not starting with a dot) and that is at most 200 characters is its own name, so VT
    Code stores open as they are. Any other id is named ``<sanitized prefix>~<hash>``: its first
    64 sanitized characters, for people, and 24 hex digits of its SHA-256, so that ``a/b``,
    ``a_b`` and ``a:b`` get three directories. ``~`` never appears in a plain name, so the two
    kinds cannot collide. Raises :class:`InvalidSessionId` for ``''``, ``.``, ``..``, ids with
    NUL or a lone surrogate, and ids over 1,024 characters.
    """
    check_session_id(session_id)
    if len(session_id) <= _PLAIN_NAME_MAX and _PLAIN_NAME.match(session_id):
        return session_id
    digest = hashlib.sha256(session_id.encode("utf-8")).hexdigest()[:24]
    return f"{sanitize_session_id(session_id)[:_HASH_PREFIX_CHARS]}~{digest}"


def sanitize_session_id(session_id: str) -> str:
    """VT Code's sanitizer (memstore names directories with :func:`session_dir_name`).

    ASCII letters, digits, ``-``, ``_`` and ``.`` are kept; every other character (a multi-byte
    one included) becomes one ``_``; leading dots are stripped; an empty result is ``session``.
    So ``../outside`` becomes ``_outside`` and ``..`` becomes ``session``.
    """
    if not isinstance(session_id, str):
        raise TypeError(f"session id must be a str, not {type(session_id).__name__}")
    mapped = "".join(ch if (ch.isascii() and (ch.isalnum() or ch in "-_.")) else "_" for ch in session_id)
    mapped = mapped.lstrip(".")
    return mapped or "session"


# -- paths of a store -----------------------------------------------------------------------


def sessions_root(root: os.PathLike | str) -> Path:
    """The directory that holds one directory per session."""
    return Path(root) / SESSIONS_DIR


def session_directory(root: os.PathLike | str, session_id: str) -> Path:
    """The directory of ``session_id`` under the store ``root`` (see :func:`session_dir_name`)."""
    return sessions_root(root) / session_dir_name(session_id)


def catalog_path(root: os.PathLike | str) -> Path:
    """The store's catalog database."""
    return Path(root) / CATALOG_FILE


def gc_log_path(root: os.PathLike | str) -> Path:
    """The store's record of every removal."""
    return Path(root) / GC_LOG_FILE


def store_identity_path(root: os.PathLike | str) -> Path:
    """The store's identity: its id and label (see :mod:`memstore.identity`)."""
    return Path(root) / STORE_IDENTITY_FILE


def config_path(root: os.PathLike | str) -> Path:
    """The store's settings file (see :func:`memstore.redact.load_config`)."""
    return Path(root) / CONFIG_FILE


def tombstones_path(root: os.PathLike | str) -> Path:
    """The store's record of the sessions removed on purpose (see :mod:`memstore.tombstones`)."""
    return Path(root) / TOMBSTONES_FILE


def import_versions_path(root: os.PathLike | str) -> Path:
    """The store's record of the agent versions its imports have seen."""
    return Path(root) / IMPORT_VERSIONS_FILE


def locks_dir(root: os.PathLike | str) -> Path:
    """The directory of the store-wide lock files."""
    return Path(root) / LOCKS_DIR


def trash_dir(root: os.PathLike | str) -> Path:
    """Where sessions being removed wait for their deletion."""
    return Path(root) / TRASH_DIR


def changes_dir(root: os.PathLike | str) -> Path:
    """The store's change feed: one empty marker per session directory changed since the
    catalog last looked (see :mod:`memstore.changes`)."""
    return Path(root) / CHANGES_DIR


# -- paths of a session ---------------------------------------------------------------------


def events_path(session_dir: os.PathLike | str) -> Path:
    return Path(session_dir) / EVENTS_FILE


def manifest_path(session_dir: os.PathLike | str) -> Path:
    return Path(session_dir) / MANIFEST_FILE


def lock_path(session_dir: os.PathLike | str) -> Path:
    return Path(session_dir) / LOCK_FILE


def pin_path(session_dir: os.PathLike | str) -> Path:
    return Path(session_dir) / PIN_FILE


def index_dir(session_dir: os.PathLike | str) -> Path:
    return Path(session_dir) / INDEX_DIR


def index_path(session_dir: os.PathLike | str) -> Path:
    return Path(session_dir) / INDEX_DIR / INDEX_FILE


def cap_marker_path(session_dir: os.PathLike | str) -> Path:
    return Path(session_dir) / INDEX_DIR / CAP_MARKER_FILE


def derived_dir(session_dir: os.PathLike | str) -> Path:
    return Path(session_dir) / DERIVED_DIR


def derived_path(session_dir: os.PathLike | str, name: str) -> Path:
    """The file ``name`` of the session's ``derived/`` directory."""
    return Path(session_dir) / DERIVED_DIR / name


def torn_name(offset: int, stamp: str) -> str:
    """The name a torn tail cut at ``offset`` is kept under, beside the log."""
    return f"{EVENTS_FILE}{TORN_INFIX}{offset}-{stamp}"


def is_torn_name(name: str) -> bool:
    return name.startswith(EVENTS_FILE + TORN_INFIX)


def unusable_name(name: str, stamp: str) -> str:
    """The name an entry that cannot be used as the file ``name`` (a symlink, a FIFO, a
    directory where ``manifest.json`` should be) is kept under, beside it, once set aside."""
    return f"{name}{UNUSABLE_INFIX}{stamp}"


# The data of a legacy session: what VT Code's migration copied into derived/ (no log holds it).
LEGACY_DATA_FILES = (MEMORY_FILE, TRAJECTORY_FILE)


def is_legacy_session(directory: os.PathLike | str) -> bool:
    """Whether ``directory`` is a legacy session (see the module docstring): no
    ``events.jsonl`` entry at all, a ``manifest.json`` entry (whatever state it is in: a
    rebuild regenerates it), and a regular ``derived/memory.json`` or
    ``derived/trajectory.jsonl``. Never follows a symlink; an entry that cannot be examined
    makes it not one."""
    path = os.fspath(directory)
    try:
        if os.path.lexists(os.path.join(path, EVENTS_FILE)):
            return False
        os.lstat(os.path.join(path, MANIFEST_FILE))
    except OSError:
        return False
    for name in LEGACY_DATA_FILES:
        try:
            if stat.S_ISREG(os.lstat(os.path.join(path, DERIVED_DIR, name)).st_mode):
                return True
        except OSError:
            continue
    return False


# -- the one enumeration --------------------------------------------------------------------

# What iter_session_dirs says to on_skip of some entries it leaves out (the others are said in
# words); UNEXAMINABLE starts the reason, followed by the OS's words in parentheses.
SYMLINK_ENTRY = "a symlink; never followed"
NOT_UTF8_NAME = "not a session directory (its name is not UTF-8)"
LOG_NOT_REGULAR = f"not a session ({EVENTS_FILE} is not a regular file)"
UNEXAMINABLE = "cannot be examined"


def iter_session_dirs(
    root: os.PathLike | str,
    *,
    require_log: bool = False,
    include_legacy: bool = False,
    sort: bool = False,
    on_skip: Optional[Callable[[str, str], None]] = None,
) -> Iterator[os.DirEntry]:
    """The session directories under ``<root>/sessions``, as ``os.DirEntry`` objects.

    Always left out, each said to ``on_skip(name, reason)`` when given: names starting with a
    dot (memstore's own temporaries), symlinks (never followed), anything that is not a
    directory, and names that are not UTF-8 (no session id names such a directory). With
    ``require_log``, directories whose ``events.jsonl`` is not a regular file are left out too
    (except, with ``include_legacy``, legacy sessions: see :func:`is_legacy_session`), and so
    are directories whose contents cannot be examined (this process may not enter them: the
    reason starts with :data:`UNEXAMINABLE`); such a directory is never left out silently: with
    no ``on_skip`` it is logged as a warning. ``sort`` yields them in name order. A missing
    ``sessions/`` is an empty store; one that is a symlink (never followed) or not a directory
    is an empty store too, with a warning naming it; any other failure to list it raises
    :class:`StoreIOError`.
    """
    base = sessions_root(root)
    try:
        if not stat.S_ISDIR(os.lstat(base).st_mode):
            logger.warning("%s is a symlink or not a directory; it is not followed", base)
            return
        with os.scandir(base) as it:
            entries = list(it)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise StoreIOError.from_os_error("list", base, exc) from exc
    if sort:
        entries.sort(key=lambda e: e.name)
    for entry in entries:
        reason = _not_a_session(entry, require_log, include_legacy)
        if reason is None:
            yield entry
        elif on_skip is not None:
            on_skip(entry.name, reason)
        elif reason.startswith(UNEXAMINABLE):
            logger.warning("session directory %s left out: it %s", entry.path, reason)


def _not_a_session(entry: os.DirEntry, require_log: bool, include_legacy: bool) -> Optional[str]:
    name = entry.name
    if name.startswith("."):
        return "not a session directory (its name starts with a dot)"
    try:
        if entry.is_symlink():
            return SYMLINK_ENTRY
        if not entry.is_dir(follow_symlinks=False):
            return "not a directory"
    except OSError as exc:
        return f"{UNEXAMINABLE} ({exc.strerror or exc})"
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return NOT_UTF8_NAME
    if require_log:
        try:
            st = os.stat(os.path.join(entry.path, EVENTS_FILE), follow_symlinks=False)
        except (FileNotFoundError, NotADirectoryError):
            if include_legacy and is_legacy_session(entry.path):
                return None
            return f"not a session (no {EVENTS_FILE})"
        except OSError as exc:
            return f"{UNEXAMINABLE} ({exc.strerror or exc})"
        if not stat.S_ISREG(st.st_mode):
            return LOG_NOT_REGULAR
    return None
