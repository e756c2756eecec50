"""Where the store is when nobody says: one default a person can rely on.

The store a command (or ``Store()`` with no argument) uses is, in order:

1. the root given explicitly (the CLI's ``--root``);
2. ``MEMSTORE_ROOT``, when it is set and not empty;
3. the nearest VT Code workspace store: a ``.vtcode/`` directory in the current directory or
   one of its parents, so that inside a project VT Code works on, memstore reads and writes the
   sessions VT Code keeps there. The home directory's own ``~/.vtcode`` is VT Code's per-user
   configuration, not a workspace: it counts only when it holds ``sessions/``;
4. else the per-user store, ``platformdirs.user_data_dir("memstore")`` (on Linux
   ``$XDG_DATA_HOME/memstore``, by default ``~/.local/share/memstore``), the same from every
   directory, as ``llm`` keeps one database per user.

:func:`locate_store` returns the path and the reason together (:class:`StoreLocation`), so
that every output that names the store can also say why it is that one. Nothing of that
creates or writes anything; paths are made absolute (``~`` expanded) once, when they are resolved.

Where a store's explorer runs is kept here too: ``memstore serve`` records its URL for the
store it serves (:func:`record_explorer`, a small file in the per-user runtime directory, not
in the store, which may be read-only), and :func:`running_explorer` gives that URL back only
while the server's process is alive and its port answers, so that links are never printed to
a server that has gone.
"""

from __future__ import annotations

import hashlib
import logging
import os
import socket
import warnings
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from enum import Enum
from pathlib import Path
from typing import Optional, Union

import orjson

from .errors import StoreIOError
from .fsio import atomic_write
from .layout import sessions_root

logger = logging.getLogger(__name__)

ENV_VAR = "MEMSTORE_ROOT"
VTCODE_DIR = ".vtcode"
APP_NAME = "memstore"


class RootReason(str, Enum):
    """Why a store is the one in use."""

    OPTION = "option"  # given explicitly (--root, Store(root))
    ENVIRONMENT = "environment"  # MEMSTORE_ROOT
    WORKSPACE = "workspace"  # the nearest VT Code workspace's .vtcode/
    USER = "user"  # the per-user data directory


@dataclass(frozen=True)
class StoreLocation:
    """A store's path (absolute) and why it was chosen."""

    path: Path
    reason: RootReason

    @property
    def explicit(self) -> bool:
        """Whether someone named this store (``--root`` or ``MEMSTORE_ROOT``), rather than it being
        found (a workspace) or the per-user default."""
        return self.reason in (RootReason.OPTION, RootReason.ENVIRONMENT)

    def describe(self) -> str:
        """Why this store, in a few words for people (``"MEMSTORE_ROOT is set"``...)."""
        if self.reason is RootReason.OPTION:
            return "given with --root"
        if self.reason is RootReason.ENVIRONMENT:
            return f"{ENV_VAR} is set"
        if self.reason is RootReason.WORKSPACE:
            return f"the VT Code workspace of {self.path.parent}"
        return "the per-user store"

    def to_dict(self) -> dict:
        return {
            "path": str(self.path),
            "reason": self.reason.value,
            "why": self.describe(),
            "exists": self.path.is_dir(),
        }


def user_store_path() -> Path:
    """The per-user store: ``platformdirs.user_data_dir("memstore")``, absolute."""
    import platformdirs

    return Path(platformdirs.user_data_dir(APP_NAME, appauthor=False)).expanduser().absolute()


def find_vtcode_workspace(start: Optional[Union[str, os.PathLike[str]]] = None) -> Optional[Path]:
    """The ``.vtcode/`` directory of the nearest VT Code workspace: in ``start`` (default: the
    current directory) or the closest of its parents; ``None`` when there is none. The home
    directory's ``~/.vtcode`` (VT Code's per-user configuration) counts only when it holds
    ``sessions/``. A directory that cannot be looked at is passed over."""
    here = Path(os.getcwd() if start is None else start).expanduser().absolute()
    home = _home()
    for directory in (here, *here.parents):
        candidate = directory / VTCODE_DIR
        try:
            if not candidate.is_dir():
                continue
            if home is not None and directory == home and not sessions_root(candidate).is_dir():
                continue
        except OSError:
            continue
        return candidate
    return None


def default_root(
    *, cwd: Optional[Union[str, os.PathLike[str]]] = None, environ: Optional[Mapping[str, str]] = None
) -> tuple[Path, RootReason]:
    """The store used when no root is given, and why: ``MEMSTORE_ROOT``, else the nearest VT
    Code workspace's ``.vtcode/`` (from ``cwd``, default the current directory), else the
    per-user store. ``environ`` defaults to ``os.environ``."""
    env = os.environ if environ is None else environ
    value = env.get(ENV_VAR)
    if value:
        return Path(value).expanduser().absolute(), RootReason.ENVIRONMENT
    workspace = find_vtcode_workspace(cwd)
    if workspace is not None:
        return workspace, RootReason.WORKSPACE
    return user_store_path(), RootReason.USER


def locate_store(
    root: Optional[Union[str, os.PathLike[str]]] = None,
    *,
    cwd: Optional[Union[str, os.PathLike[str]]] = None,
    environ: Optional[Mapping[str, str]] = None,
) -> StoreLocation:
    """The store ``root`` names (absolute, ``~`` expanded), or with ``root`` ``None`` the
    default one (see :func:`default_root`), with the reason."""
    if root is not None:
        return StoreLocation(Path(root).expanduser().absolute(), RootReason.OPTION)
    path, reason = default_root(cwd=cwd, environ=environ)
    return StoreLocation(path, reason)


def _home() -> Optional[Path]:
    try:
        return Path.home().absolute()
    except (RuntimeError, KeyError):  # no HOME and no passwd entry
        return None


# --- where a store's explorer is served ---

EXPLORER_RECORD_PREFIX = "explorer-"
CONNECT_TIMEOUT = 0.3  # seconds: a local server answers at once; a gone one refuses at once


@dataclass(frozen=True)
class ExplorerRecord:
    """A running ``memstore serve``: the store it serves, its base URL (``http://host:port/``),
    where to reach it from this machine, and its process."""

    root: str
    base_url: str
    host: str
    port: int
    pid: int


def explorer_record_path(root: Union[str, os.PathLike[str]]) -> Path:
    """The file that records the explorer serving ``root``: in the per-user runtime directory
    (``$XDG_RUNTIME_DIR/memstore`` on Linux), named by a hash of the store's absolute path."""
    import platformdirs

    key = hashlib.sha256(os.fsencode(Path(root).expanduser().absolute())).hexdigest()[:24]
    with warnings.catch_warnings():  # no XDG_RUNTIME_DIR: platformdirs falls back, and warns so
        warnings.simplefilter("ignore")
        runtime = platformdirs.user_runtime_dir(APP_NAME, appauthor=False)
    return Path(runtime) / f"{EXPLORER_RECORD_PREFIX}{key}.json"


def record_explorer(record: ExplorerRecord) -> Optional[Path]:
    """Record that ``record.root`` is served at ``record.base_url`` (replacing any earlier
    record of that store). A record that cannot be written is logged and skipped: the server
    works without it, only links to it are not offered. Returns the record's path, or None."""
    try:
        path = explorer_record_path(record.root)
    except OSError as exc:  # platformdirs refuses an unsafe shared runtime directory
        logger.warning("links to this explorer will not be offered: no runtime directory: %s", exc)
        return None
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        atomic_write(path, orjson.dumps(asdict(record)), durable=False)
    except (OSError, StoreIOError) as exc:
        logger.warning("links to this explorer will not be offered: cannot record it in %s: %s", path, exc)
        return None
    return path


def forget_explorer(root: Union[str, os.PathLike[str]], pid: int) -> None:
    """Remove the record of ``root``'s explorer if it is process ``pid``'s (a later server of
    the same store keeps its own). A record that cannot be removed is logged: it is ignored
    anyway once ``pid`` is gone."""
    try:
        path = explorer_record_path(root)
    except OSError:
        return  # (no runtime directory: nothing was recorded)
    record = _read_record(path)
    if record is None or record.pid != pid:
        return
    try:
        path.unlink()
    except FileNotFoundError:
        pass
    except OSError as exc:
        logger.warning("cannot remove the explorer record %s: %s", path, exc)


def running_explorer(root: Union[str, os.PathLike[str]]) -> Optional[ExplorerRecord]:
    """The explorer serving ``root`` now: its record, when its process is alive and its port
    accepts a connection; None otherwise (never served, stopped, or killed)."""
    try:
        record = _read_record(explorer_record_path(root))
    except OSError as exc:
        logger.debug("no runtime directory, so no explorer record: %s", exc)
        return None
    if record is None or not _process_alive(record.pid):
        return None
    host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(record.host, record.host)
    try:
        with socket.create_connection((host, record.port), timeout=CONNECT_TIMEOUT):
            return record
    except OSError:
        return None


def _read_record(path: Path) -> Optional[ExplorerRecord]:
    try:
        data = orjson.loads(path.read_bytes())
        return ExplorerRecord(
            root=str(data["root"]),
            base_url=str(data["base_url"]),
            host=str(data["host"]),
            port=int(data["port"]),
            pid=int(data["pid"]),
        )
    except FileNotFoundError:
        return None
    except (OSError, orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        logger.debug("ignoring the explorer record %s: %s", path, exc)
        return None


def _process_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, someone else's
        return True
    except OSError:
        return False
    return True
