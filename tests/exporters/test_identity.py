"""The store's identity: one id per store, made once, agreed on by concurrent creators, kept
when the label changes; damaged or unsafe identity files are reported, never replaced."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from memstore.errors import StoreIOError
from memstore.identity import MACHINE_ID_FILES, InvalidLabel, machine_id, set_label, store_identity
from memstore.layout import store_identity_path


def test_identity_is_made_once_and_kept(tmp_path: Path):
    """The first call makes store.json (a UUID, the hostname as label, private); later calls
    return the same identity."""
    first = store_identity(tmp_path)
    assert uuid.UUID(first.store_id)
    assert first.label == socket.gethostname()
    path = store_identity_path(tmp_path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert json.loads(path.read_bytes())["store_id"] == first.store_id
    assert store_identity(tmp_path) == first
    assert store_identity(tmp_path / ".") == first


def test_concurrent_creators_agree_on_one_id(tmp_path: Path):
    """Processes that ask for a new store's identity at the same moment all get the one id
    that ended up in store.json."""
    go = tmp_path / "go"
    code = (
        "import os, sys, time\n"
        "from memstore.identity import store_identity\n"
        "while not os.path.exists(sys.argv[2]): time.sleep(0.001)\n"
        "print(store_identity(sys.argv[1]).store_id)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(tmp_path), str(go)], stdout=subprocess.PIPE, text=True, env=env
        )
        for _ in range(8)
    ]
    time.sleep(0.5)  # let them all reach the wait
    go.touch()
    ids = {proc.communicate(timeout=60)[0].strip() for proc in procs}
    assert all(proc.returncode == 0 for proc in procs)
    assert ids == {store_identity(tmp_path).store_id}
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temp file left


def test_set_label_keeps_the_id(tmp_path: Path):
    """A new label replaces the old one; the id and creation time stay."""
    before = store_identity(tmp_path)
    after = set_label(tmp_path, "  ci-runner-7  ")
    assert (after.store_id, after.created_at, after.label) == (before.store_id, before.created_at, "ci-runner-7")
    assert store_identity(tmp_path) == after


@pytest.mark.parametrize("label", ["", "   ", "a\nb", "tab\there", "x" * 201, 42])
def test_invalid_labels_are_refused(tmp_path: Path, label):
    """Empty, multi-line, control-character, over-long and non-text labels are refused and
    nothing changes."""
    before = store_identity(tmp_path)
    with pytest.raises(InvalidLabel):
        set_label(tmp_path, label)
    assert store_identity(tmp_path) == before


def test_damaged_identity_is_reported_not_replaced(tmp_path: Path):
    """A store.json that is not an identity raises an error naming the file, and is left as
    it is (replacing it would silently give the store a new id)."""
    path = store_identity_path(tmp_path)
    for content in (b"{not json", b"[]", json.dumps({"store_id": "not-a-uuid", "label": "x"}).encode()):
        path.write_bytes(content)
        with pytest.raises(StoreIOError) as info:
            store_identity(tmp_path)
        assert str(path) in str(info.value)
        assert path.read_bytes() == content


def test_symlinked_identity_is_refused(tmp_path: Path):
    """A symlink in place of store.json is never followed."""
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text(json.dumps({"store_id": str(uuid.uuid4()), "label": "x", "created_at": ""}))
    store_identity_path(tmp_path).symlink_to(elsewhere)
    with pytest.raises(StoreIOError, match="symlink"):
        store_identity(tmp_path)


def test_missing_store_is_an_error(tmp_path: Path):
    """No identity is made for a store directory that does not exist."""
    with pytest.raises(StoreIOError):
        store_identity(tmp_path / "absent")
    assert not (tmp_path / "absent").exists()


def test_machine_id_is_stable_and_not_the_raw_id():
    """The machine id is the same on every call, 32 hex digits, and not the OS's own id
    (which systemd asks applications not to show); None only where the OS keeps none."""
    raw = next((Path(p).read_text().strip() for p in MACHINE_ID_FILES if Path(p).is_file()), None)
    found = machine_id()
    if raw is None:
        assert found is None
        return
    assert found == machine_id() and len(found) == 32 and int(found, 16) >= 0
    assert found != raw.lower()
