"""The store's locks: session.lock that cannot be redirected, store-wide filelock locks, and
removing a session without ever racing a writer."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import textwrap
import threading
import time

import filelock
import pytest
from support import TURN_COMPLETED, TURN_STARTED

import memstore
from memstore.locks import remove_session_directory, store_lock
from memstore.session.lock import is_live


@pytest.mark.parametrize("kind", ["symlink", "fifo", "directory"])
def test_a_session_lock_that_is_not_a_regular_file_refuses_the_open(tmp_path, kind):
    directory = memstore.session_directory(tmp_path, "s")
    directory.mkdir(parents=True)
    lock = directory / "session.lock"
    if kind == "symlink":
        (tmp_path / "elsewhere").write_bytes(b"")
        lock.symlink_to(tmp_path / "elsewhere")
    elif kind == "fifo":
        os.mkfifo(lock)
    else:
        lock.mkdir()
    with pytest.raises(memstore.StoreIOError, match="session.lock"):
        memstore.open_session(tmp_path, "s")
    assert is_live(directory)  # an unusable lock file reads as live: retention keeps away


@pytest.mark.parametrize("error", [errno.ENOLCK, errno.EOPNOTSUPP])
def test_a_filesystem_without_flock_leaves_the_session_open_but_unlocked(tmp_path, fault, caplog, error):
    """VT Code's rule, kept: when the lock file cannot be flocked at all (an NFS mount without a
    lock daemon answers ENOLCK, some FUSE filesystems EOPNOTSUPP), the open proceeds unlocked and
    says so (a warning naming the lock file); the session works as usual, and is not live."""

    def no_flock(path):
        raise OSError(error, os.strerror(error), str(path))

    fault.arm("lock.flock", no_flock)
    with caplog.at_level("WARNING", logger="memstore.session.lock"):
        log = memstore.open_session(tmp_path, "s")
    warnings = [r.getMessage() for r in caplog.records if "session.lock" in r.getMessage()]
    assert warnings and "unlocked" in warnings[0], warnings
    assert not log._writer.liveness.held
    log.append(TURN_STARTED)
    log.append(TURN_COMPLETED)
    assert not is_live(log.directory)
    log.close()
    fault.disarm("lock.flock")
    with memstore.open_session(tmp_path, "s") as log:
        assert [(t.number, t.status) for t in log.turns()] == [(1, "completed")]
        assert log._writer.liveness.held and is_live(log.directory)


def test_store_locks_exclude_each_other_across_processes(tmp_path):
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent("""
        import sys, memstore.locks
        with memstore.locks.store_lock(sys.argv[1], "retention"):
            print("held", flush=True)
            sys.stdin.readline()
    """),
            str(tmp_path),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(filelock.Timeout):
            with store_lock(tmp_path, "retention", timeout=0.2):
                pass
        with store_lock(tmp_path, "catalog", timeout=0.2):  # other sections are independent
            pass
        holder.stdin.write("\n")
        holder.stdin.flush()
        assert holder.wait(timeout=30) == 0
        with store_lock(tmp_path, "retention", timeout=5):
            pass
    finally:
        holder.kill()
    assert oct((tmp_path / "locks").stat().st_mode & 0o777) == "0o700"
    with pytest.raises(ValueError):
        store_lock(tmp_path, "../etc")


def test_a_live_session_is_never_removed(tmp_path):
    log = memstore.open_session(tmp_path, "s")
    log.append(TURN_STARTED)
    directory = log.directory
    assert remove_session_directory(tmp_path, directory) is False
    assert directory.is_dir()
    log.close()
    assert remove_session_directory(tmp_path, directory) is True
    assert not directory.exists()
    assert not list((tmp_path / ".trash").iterdir())


def test_removal_refuses_what_is_not_a_session_directory(tmp_path):
    (tmp_path / "sessions").mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    (tmp_path / "sessions" / "link").symlink_to(outside)
    with pytest.raises(memstore.UnsafePathError):
        remove_session_directory(tmp_path, tmp_path / "sessions" / "link")
    with pytest.raises(memstore.UnsafePathError):
        remove_session_directory(tmp_path, outside)
    assert outside.is_dir()


def test_an_open_racing_a_removal_either_keeps_the_session_or_starts_a_new_one(tmp_path):
    """Many rounds of a removal racing an open in another thread. While the writer holds its
    handle, what it appended is in the session directory: the removal happened before the open
    (the writer started a new session: one event), or it found the session live and left it
    (the old session plus the note: three events), or the open found the session busy."""
    for round_no in range(40):
        sid = f"race-{round_no}"
        with memstore.open_session(tmp_path, sid) as log:
            log.append(TURN_STARTED)
            log.append(TURN_COMPLETED)
            directory = log.directory
        written, checked = threading.Event(), threading.Event()
        results = {}

        def writer(sid=sid, round_no=round_no, written=written, checked=checked, results=results):
            try:
                with memstore.open_session(tmp_path, sid) as log:
                    log.append({"type": "note", "round": round_no})
                    log.flush()
                    written.set()
                    checked.wait(10)
            except memstore.SessionBusyError:
                results["busy"] = True
                written.set()

        thread = threading.Thread(target=writer)
        thread.start()
        removed = remove_session_directory(tmp_path, directory)
        assert written.wait(10)
        try:
            if results.get("busy"):
                assert removed
                continue
            with memstore.read_session(tmp_path, sid) as reader:
                events = list(reader.iter_events())
                count = reader.event_count
            assert events[-1] == {"type": "note", "round": round_no}
            assert (count, removed) in ((1, True), (3, False)), (count, removed)
        finally:
            checked.set()
            thread.join()
    assert not any((tmp_path / ".trash").iterdir())


def test_a_removal_is_recorded_before_the_session_is_deleted(tmp_path):
    """``on_moved`` runs with the session in the trash and not yet deleted, so a record written
    there can never be missing for a deletion a crash interrupted."""
    with memstore.open_session(tmp_path, "s") as log:
        log.append(TURN_STARTED)
        directory = log.directory
    seen = []

    def on_moved():
        (entry,) = list((tmp_path / ".trash").iterdir())
        seen.append((directory.exists(), (entry / "events.jsonl").is_file()))

    assert remove_session_directory(tmp_path, directory, on_moved=on_moved) is True
    assert seen == [(False, True)]
    assert not directory.exists() and not list((tmp_path / ".trash").iterdir())


def test_a_removal_that_cannot_be_recorded_puts_the_session_back(tmp_path):
    with memstore.open_session(tmp_path, "s") as log:
        log.append(TURN_STARTED)
        directory = log.directory
    before = (directory / "events.jsonl").read_bytes()

    def on_moved():
        raise memstore.StoreIOError("write", tmp_path / "gc-log.jsonl", "No space left on device")

    with pytest.raises(memstore.StoreIOError, match="gc-log"):
        remove_session_directory(tmp_path, directory, on_moved=on_moved)
    assert (directory / "events.jsonl").read_bytes() == before
    assert not list((tmp_path / ".trash").iterdir())
    with memstore.open_session(tmp_path, "s") as log:
        assert log.event_count == 1


def _session_with_a_turn(root, sid="s"):
    with memstore.open_session(root, sid) as log:
        log.append(TURN_STARTED)
        log.append(TURN_COMPLETED)
        return log.directory


def test_a_removal_killed_before_it_was_recorded_is_put_back_not_deleted(tmp_path):
    """A remover SIGKILLed with the session in the trash and no gc-log line written: the next
    trash emptying (retention's) must not delete what was never recorded, it puts it back."""
    directory = _session_with_a_turn(tmp_path)
    before = (directory / "events.jsonl").read_bytes()
    child = subprocess.run(
        [
            sys.executable,
            "-c",
            textwrap.dedent(f"""
        import os, signal
        from memstore.locks import remove_session_directory
        def on_moved():  # killed before the removal is recorded
            os.kill(os.getpid(), signal.SIGKILL)
        remove_session_directory({str(tmp_path)!r}, {str(directory)!r}, on_moved=on_moved)
    """),
        ],
        timeout=60,
    )
    assert child.returncode == -9
    assert not directory.exists() and list((tmp_path / ".trash").iterdir())
    report = memstore.apply_retention(tmp_path, memstore.RetentionPolicy(50, 30), apply=True)
    assert report.count == 0 and not (tmp_path / "gc-log.jsonl").exists()
    assert (directory / "events.jsonl").read_bytes() == before
    with memstore.open_session(tmp_path, "s") as log:
        assert log.event_count == 2


def test_a_removal_being_recorded_is_not_deleted_by_another_process_emptying_the_trash(tmp_path):
    """While one process records a removal (the session in the trash, its lock held), retention
    in another process empties the trash: the entry must stay for the remover, whose failing
    record then puts the session back."""
    directory = _session_with_a_turn(tmp_path)
    before = (directory / "events.jsonl").read_bytes()
    moved, go = tmp_path / "moved", tmp_path / "go"
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(f"""
        import pathlib, time
        import memstore
        from memstore.locks import remove_session_directory
        def on_moved():
            pathlib.Path({str(moved)!r}).touch()
            while not pathlib.Path({str(go)!r}).exists():
                time.sleep(0.01)
            raise memstore.StoreIOError("write", "gc-log.jsonl", "No space left on device")
        try:
            remove_session_directory({str(tmp_path)!r}, {str(directory)!r}, on_moved=on_moved)
        except memstore.StoreIOError:
            raise SystemExit(3)
    """),
        ]
    )
    try:
        deadline = time.monotonic() + 30
        while not moved.exists():
            assert child.poll() is None and time.monotonic() < deadline
            time.sleep(0.01)
        memstore.apply_retention(tmp_path, memstore.RetentionPolicy(50, 30), apply=True)
    finally:
        go.touch()
        assert child.wait(timeout=60) == 3
    assert (directory / "events.jsonl").read_bytes() == before
    assert not list((tmp_path / ".trash").iterdir())
