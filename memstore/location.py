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
that every output that names the store can also say why it is that one. Nothing here creates
or writes anything; paths are made absolute (``~`` expanded) once, when they are resolved.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Optional, Union

from .layout import sessions_root

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
