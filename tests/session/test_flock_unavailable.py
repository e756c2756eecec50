"""A filesystem that refuses ``flock`` (NFS without a lock daemon: ENOLCK; some FUSE mounts:
EOPNOTSUPP): as VT Code does, the open proceeds unlocked and says so in a warning that names the
lock file, the error and what is lost; appends work and reach the log. Here ``fcntl.flock``
itself is replaced (the fault no real test filesystem produces on demand), so the whole call
path is the real one."""

from __future__ import annotations

import errno
import fcntl
import os

import pytest

import memstore
from memstore.session import lock as lock_module


@pytest.mark.parametrize("error", [errno.ENOLCK, errno.EOPNOTSUPP])
def test_open_on_a_filesystem_without_flock_warns_and_works_unlocked(tmp_path, monkeypatch, caplog, error):
    real_flock = fcntl.flock

    def refusing_flock(fd, operation):
        if operation & fcntl.LOCK_EX:
            raise OSError(error, os.strerror(error))
        return real_flock(fd, operation)

    monkeypatch.setattr(lock_module.fcntl, "flock", refusing_flock)
    with caplog.at_level("WARNING", logger="memstore"):
        log = memstore.open_session(tmp_path, "s")
    (warning,) = [r.getMessage() for r in caplog.records if "cannot flock" in r.getMessage()]
    assert "session.lock" in warning and os.strerror(error) in warning and "unlocked" in warning
    assert "another process" in warning
    log.append({"type": "turn.started"})
    log.append({"type": "turn.completed", "usage": {}})
    log.close()
    monkeypatch.undo()
    with memstore.open_session(tmp_path, "s") as log:
        assert [(t.number, t.status) for t in log.turns()] == [(1, "completed")]
