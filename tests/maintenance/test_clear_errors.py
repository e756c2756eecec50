"""What cannot be rebuilt or checked is named for what it is: a symlinked session directory or a
FIFO log is not "no such session", a ``catalog.db`` that is a directory is not "does not exist",
and a symlinked store lock is a memstore error naming the lock, not a bare ``OSError``.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import memstore
from memstore.maintenance import check_store


def _session(root: Path, sid: str) -> Path:
    with memstore.open_session(root, sid) as log:
        log.append({"type": "turn.started"})
        log.append({"type": "item.completed", "item": {"type": "agent_message", "text": "Rotated the API keys."}})
        log.append({"type": "turn.completed", "usage": {"input_tokens": 40, "output_tokens": 12}})
        return log.directory


def test_rebuilding_a_symlinked_session_directory_says_it_is_a_symlink(tmp_path):
    root = tmp_path / "store"
    _session(root, "real")
    other = _session(tmp_path / "other", "theirs")
    (root / "sessions" / "linked").symlink_to(other, target_is_directory=True)
    with pytest.raises(memstore.UnsafePathError, match="symlink") as caught:
        memstore.rebuild(root, "linked")
    assert caught.value.path == str(root / "sessions" / "linked")


def test_rebuilding_a_session_whose_log_is_a_fifo_says_it_is_a_fifo(tmp_path):
    root = tmp_path / "store"
    directory = _session(root, "s")
    (directory / "events.jsonl").unlink()
    os.mkfifo(directory / "events.jsonl")
    with pytest.raises(memstore.UnsafePathError, match="FIFO") as caught:
        memstore.rebuild(root, "s")
    assert caught.value.path == str(directory / "events.jsonl")


def test_rebuilding_a_session_that_is_not_there_says_no_such_session(tmp_path):
    root = tmp_path / "store"
    _session(root, "s")
    with pytest.raises(memstore.StoreIOError, match="no such session"):
        memstore.rebuild(root, "never-was")


def test_doctor_says_a_catalog_that_is_a_directory_is_one(tmp_path):
    root = tmp_path / "store"
    _session(root, "s")
    (root / "catalog.db").mkdir()
    (problem,) = [p for p in check_store(root).problems if p.check == "catalog"]
    assert "is a directory" in problem.detail and "does not exist" not in problem.detail


def test_a_symlinked_store_lock_is_a_memstore_error_naming_the_lock(tmp_path):
    root = tmp_path / "store"
    _session(root, "s")
    target = tmp_path / "elsewhere.lock"
    target.write_bytes(b"")
    (root / "locks").mkdir(exist_ok=True)
    lock = root / "locks" / "catalog.lock"
    lock.unlink(missing_ok=True)
    lock.symlink_to(target)
    with pytest.raises(memstore.UnsafePathError, match="symlink") as caught:
        memstore.refresh_catalog(root)
    assert caught.value.path == str(lock)
    assert target.read_bytes() == b""
