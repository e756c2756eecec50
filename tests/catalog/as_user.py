"""Running a piece of a test as a user that is not root, in a forked child.

Permission bits do not stop root, and CI runs as root: a test of what happens when a directory
cannot be entered or a store cannot be written runs that part as ``nobody`` (``os.setuid`` in a
forked child, after the modules it needs are imported: the interpreter's own files may not be
readable by that user). When the test suite already runs as another user, the part runs in the
test's own process.
"""

from __future__ import annotations

import os
import pickle
import pwd
import shutil
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest


def nobody() -> tuple[int, int]:
    """The uid and gid a root test drops to (skips the test where there is none)."""
    try:
        entry = pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("no user 'nobody' to drop to: permission bits cannot be tested as root here")
    return entry.pw_uid, entry.pw_gid


def shared_dir() -> Path:
    """A fresh directory every user can reach (pytest's tmp_path is private to root): removed
    by the caller."""
    path = Path(tempfile.mkdtemp(prefix="memstore-as-user-", dir="/tmp"))
    path.chmod(0o755)
    return path


def give(path: Path, uid: int, gid: int) -> None:
    """chown ``path`` and everything under it."""
    os.chown(path, uid, gid, follow_symlinks=False)
    for folder, dirs, files in os.walk(path):
        for name in dirs + files:
            os.chown(os.path.join(folder, name), uid, gid, follow_symlinks=False)


def run_as_nobody(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` run as a user that is not root; its result (or its exception) returned (or
    raised) here. Needs ``fn`` and its result to pickle."""
    if os.geteuid() != 0:
        return fn(*args)
    uid, gid = nobody()
    _warm_imports()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        os.close(read)
        try:
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
            outcome: tuple[str, Any] = ("ok", fn(*args))
        except BaseException as exc:  # sent back to the test
            outcome = ("error", (exc, traceback.format_exc()))
        try:
            data = pickle.dumps(outcome)
        except Exception as exc:  # an unpicklable result or error
            data = pickle.dumps(("error", (RuntimeError(repr(exc)), traceback.format_exc())))
        with os.fdopen(write, "wb") as fh:
            fh.write(data)
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as fh:
        data = fh.read()
    os.waitpid(pid, 0)
    kind, value = pickle.loads(data)
    if kind == "error":
        exc, text = value
        raise AssertionError(f"as nobody: {text}") from exc
    return value


def _warm_imports() -> None:
    """Import (and load the data of) what the catalog and search may import lazily, while the
    process can still read the interpreter's files."""
    import filelock  # noqa: F401
    import numpy  # noqa: F401
    import sqlite_utils  # noqa: F401
    import sqlite_utils.migrations  # noqa: F401

    import memstore.catalog  # noqa: F401
    import memstore.catalog.live  # noqa: F401
    import memstore.cli  # noqa: F401
    import memstore.search  # noqa: F401
    import memstore.views.memory_view  # noqa: F401
    from memstore import pricing

    pricing.price_data()
    pricing.price_usage("gpt-5", (1, 0, 0, 1), when="2026-01-01T00:00:00Z")


def cleanup(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
