"""A real full disk: a small tmpfs filled up by appends. Every error names its path, nothing
acknowledged is lost, and once space is freed the session reopens with a valid log.

Mounting needs root (CI runs as root); elsewhere these tests are skipped with the reason.
"""

from __future__ import annotations

import os
import subprocess
import uuid

import orjson
import pytest

import memstore


@pytest.fixture
def small_disk(tmp_path):
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    result = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=384k", "tmpfs", str(mount_point)], capture_output=True, text=True
    )
    if result.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {result.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


def fill(log, acknowledged):
    """Append 5-event turns of ~1 KiB events until something fails; return the error."""
    turn = 0
    while True:
        turn += 1
        try:
            log.append({"type": "turn.started"})
            for i in range(3):
                log.append(
                    {
                        "type": "item.completed",
                        "item": {
                            "id": f"{turn}-{i}",
                            "type": "command_execution",
                            "command": "make",
                            "aggregated_output": uuid.uuid4().hex * 32,
                            "exit_code": 0,
                            "status": "completed",
                        },
                    }
                )
            seq = log.append({"type": "turn.completed", "usage": {"input_tokens": turn}})
        except memstore.MemstoreError as exc:
            return exc
        acknowledged.append(seq)
        assert turn < 10_000, "the disk never filled"


def test_full_disk_fails_with_the_path_and_loses_nothing_acknowledged(small_disk):
    filler = small_disk / "filler"
    filler.write_bytes(b"\0" * 96 * 1024)
    acknowledged: list[int] = []
    log = memstore.open_session(small_disk, "s", max_events=0)
    error = fill(log, acknowledged)
    assert isinstance(error, memstore.StoreIOError), repr(error)
    assert error.path.startswith(str(small_disk)), error.path
    assert str(small_disk) in str(error)
    assert acknowledged, "the disk filled before a single turn was acknowledged"
    # Whatever failed first (the index usually: SQLite needs room for its WAL), appends go on
    # failing loudly until the log write itself hits ENOSPC and the handle fails closed.
    errors = [error]
    while not log.failed and len(errors) < 500:
        errors.append(fill(log, acknowledged))
    assert log.failed, [str(e) for e in errors[-3:]]
    assert errors[-1].op == "write" and errors[-1].path.endswith("events.jsonl"), str(errors[-1])
    assert all(str(small_disk) in str(e) for e in errors)
    with pytest.raises(memstore.LogFailedError):
        log.append({"type": "turn.started"})
    try:
        log.close()
    except memstore.MemstoreError as exc:  # the disk is still full: reported, not swallowed
        assert str(small_disk) in str(exc)

    filler.unlink()
    with memstore.open_session(small_disk, "s", max_events=0) as log:
        seqs = [r.seq for r in log.iter_records()]
        assert set(acknowledged) <= set(seqs)
        assert seqs == sorted(seqs) and len(seqs) == len(set(seqs))
        assert log.turn_count >= len(acknowledged)
        log.append({"type": "turn.started"})
        log.append({"type": "turn.completed", "usage": {}})
    data = (small_disk / "sessions" / "s" / "events.jsonl").read_bytes()
    assert data.endswith(b"\n")
    assert all(orjson.loads(line) for line in data.splitlines())
    # A rebuild regenerates every view of the session, search chunks included, which may need
    # more room than this tiny disk has left: it either works or says so, naming the path, and
    # the log stays whole either way.
    try:
        assert memstore.rebuild(small_disk, "s", refresh=False).event_count == len(data.splitlines())
    except memstore.StoreIOError as exc:
        assert "No space left" in str(exc) and str(small_disk) in str(exc)
    assert (small_disk / "sessions" / "s" / "events.jsonl").read_bytes() == data
    # The views are regenerable: dropping them frees the room they took, and the log decides.
    import shutil

    shutil.rmtree(small_disk / "sessions" / "s" / "index")
    shutil.rmtree(small_disk / "sessions" / "s" / "derived")
    with memstore.open_session(small_disk, "s", max_events=0) as log:
        assert log.event_count == len(data.splitlines())


def test_no_space_for_a_new_session_is_a_clear_error(small_disk):
    filler = small_disk / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
    try:
        while os.write(fd, b"\0" * 4096):
            pass
    except OSError:
        pass  # ENOSPC: the disk is full
    finally:
        os.close(fd)
    with pytest.raises(memstore.StoreIOError) as info:
        with memstore.open_session(small_disk, "s") as log:
            log.append({"type": "turn.started"})
            log.append({"type": "turn.completed", "usage": {}})
    assert str(small_disk) in str(info.value)
