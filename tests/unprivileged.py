"""Running part of a test as an unprivileged user, so that permission bits bite when the suite
runs as root (CI does): :func:`run_unprivileged` calls a function in a forked child that has
dropped to ``nobody``, and :func:`unprivileged_dir` makes a directory that user can reach.

The child is forked, not started afresh: the interpreter may live where ``nobody`` cannot read
(``/root/.pyenv``), so whatever the function needs must be imported before the call (pass the
module names as ``preload``). Run as any other user, the function is simply called: the bits
bite already.
"""

from __future__ import annotations

import importlib
import os
import pickle
import pwd
import select
import shutil
import signal
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

UNPRIVILEGED_USER = "nobody"


def _ids() -> tuple[int, int]:
    try:
        entry = pwd.getpwnam(UNPRIVILEGED_USER)
    except KeyError:
        pytest.skip(f"no {UNPRIVILEGED_USER!r} user to drop to: permission bits cannot be tested as root here")
    return entry.pw_uid, entry.pw_gid


def is_root() -> bool:
    return os.geteuid() == 0


@contextmanager
def unprivileged_dir() -> Iterator[Path]:
    """A fresh directory owned by the unprivileged user (when running as root) under the
    system's temp directory (pytest's own are private to root), removed afterwards."""
    path = Path(tempfile.mkdtemp(prefix="memstore-unpriv-"))
    try:
        if is_root():
            uid, gid = _ids()
            os.chown(path, uid, gid)
        yield path
    finally:
        for dirpath, dirnames, _files in os.walk(path):
            for name in dirnames:
                full = os.path.join(dirpath, name)
                if not os.path.islink(full):
                    os.chmod(full, 0o700)  # a test may leave directories nobody can enter
        os.chmod(path, 0o700)
        shutil.rmtree(path, ignore_errors=True)


def chown_tree(path: Path) -> None:
    """Give ``path`` and everything under it to the unprivileged user (as root; else no-op)."""
    if not is_root():
        return
    uid, gid = _ids()
    os.lchown(path, uid, gid)
    for dirpath, dirnames, filenames in os.walk(path):
        for name in dirnames + filenames:
            os.lchown(os.path.join(dirpath, name), uid, gid)


def run_unprivileged(
    function: Callable[..., Any], *args: Any, preload: Sequence[str] = (), timeout: float = 120
) -> Any:
    """``function(*args)`` run as the unprivileged user; its return value, or whatever it
    raised, raised again here (a child that cannot send it back fails the test with its
    traceback). ``preload`` names modules to import before forking."""
    for name in preload:
        importlib.import_module(name)
    if not is_root():
        return function(*args)
    uid, gid = _ids()
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        status = 0
        try:
            os.close(read_end)
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
            try:
                outcome: tuple = ("returned", function(*args))
            except BaseException as exc:  # sent back whole, raised again in the test
                outcome = ("raised", exc, traceback.format_exc())
            try:
                data = pickle.dumps(outcome)
            except Exception as exc:
                data = pickle.dumps(("broken", f"cannot send back {outcome!r}: {exc}"))
            view = memoryview(data)
            while view:
                view = view[os.write(write_end, view) :]
        except BaseException:
            status = 70
            traceback.print_exc()
        finally:
            os._exit(status)
    os.close(write_end)
    chunks = []
    deadline = time.monotonic() + timeout
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                os.kill(pid, signal.SIGKILL)
                pytest.fail(f"the unprivileged child did not finish in {timeout} s")
            ready, _, _ = select.select([read_end], [], [], left)
            if not ready:
                continue
            chunk = os.read(read_end, 1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(read_end)
        _, status = os.waitpid(pid, 0)
    if not chunks:
        pytest.fail(f"the unprivileged child sent nothing back (wait status {status})")
    outcome = pickle.loads(b"".join(chunks))
    if outcome[0] == "returned":
        return outcome[1]
    if outcome[0] == "raised":
        exc = outcome[1]
        exc.add_note(f"raised as {UNPRIVILEGED_USER}:\n{outcome[2]}")
        raise exc
    pytest.fail(outcome[1])
