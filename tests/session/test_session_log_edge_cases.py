"""Edge cases of the event log found in review (issue 2): power cuts after reads, failures
inside cap rewrites and rebuilds, rebuilds from the log alone, manifest publish retries, index
read errors, hostile counters, relative roots, handles collected inside locks. Each docstring
says what went wrong before the fix, why it matters and what the test does.
"""

from __future__ import annotations

import enum
import gc
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import time
from collections import OrderedDict
from pathlib import Path

import pytest
import support

import memstore
from memstore.session.tuning import TUNING

TURN_STARTED = {"type": "turn.started"}
TURN_COMPLETED = {"type": "turn.completed", "usage": {"input_tokens": 1200, "output_tokens": 150}}
NOTE = {"type": "note", "text": "hello"}


def session_dir(root, sid="s") -> Path:
    return memstore.session_directory(root, sid)


def wait_until_not_live(directory, timeout=10.0) -> None:
    """A handle dropped without close() is released by memstore's reaper thread."""
    deadline = time.monotonic() + timeout
    while memstore.is_live(directory):
        assert time.monotonic() < deadline, f"{directory} still live"
        time.sleep(0.005)


def index_rows(root, sid="s") -> dict:
    conn = sqlite3.connect(session_dir(root, sid) / "index" / "session.db")
    try:
        return {
            "turns": conn.execute("SELECT * FROM turns ORDER BY number").fetchall(),
            "events": conn.execute(
                "SELECT seq, offset, length, turn, ts, type, item_type, item_id, name, status, exit_code "
                "FROM events LEFT JOIN event_details USING (seq) ORDER BY seq"
            ).fetchall(),
        }
    finally:
        conn.close()


def drop_index_and_manifest(root, sid="s") -> None:
    d = session_dir(root, sid)
    for path in (d / "index").glob("session.db*"):
        path.unlink()
    (d / "manifest.json").unlink()


# --------------------------------------------------------------------------------------------
# Durability ordering


def test_a_mid_turn_read_never_publishes_metadata_ahead_of_the_synced_log(tmp_path, monkeypatch):
    """Reads (``turns()``, ``reconstruct_turn``, ``iter_events``) call ``flush(sync=False)``:
    they write the buffered bytes *without* fdatasync, then commit the index and publish the
    manifest describing them. That breaks the documented order ("every later step describes
    bytes an earlier step made durable ... the views can only be behind the log"); the README
    also says the default policy syncs "at every write point", and reads are write points
    (VT Code's persist_meta syncs on reads too).

    After a power cut that drops the unsynced log pages while the manifest/WAL pages reached
    disk, the manifest's ``persisted_file_len`` is past the end of the log. The rescan then
    mistakes the shorter log for an interrupted cap rewrite (scan_turn_base rule 2) and
    renumbers every surviving turn: turns 1-3 come back as 2-4 and ``turn_count`` is 4.

    The test records the log length at each real fdatasync/fsync of events.jsonl, makes a
    mid-turn read, then simulates the power cut by cutting the log back to the last synced
    length (the index and manifest are left as written) and reopens.
    """
    d = session_dir(tmp_path)
    synced = {"len": 0}
    real_fdatasync, real_fsync = os.fdatasync, os.fsync

    def track(real):
        def wrapper(fd):
            real(fd)
            try:
                st, log_st = os.fstat(fd), os.stat(d / "events.jsonl")
            except OSError:
                return
            if (st.st_dev, st.st_ino) == (log_st.st_dev, log_st.st_ino):
                synced["len"] = st.st_size

        return wrapper

    monkeypatch.setattr(os, "fdatasync", track(real_fdatasync))
    monkeypatch.setattr(os, "fsync", track(real_fsync))

    log = memstore.open_session(tmp_path, "s")
    for _ in range(3):
        log.append(TURN_STARTED)
        log.append(NOTE)
        log.append(TURN_COMPLETED)  # acknowledged: written and synced
    log.append(TURN_STARTED)  # buffered, not acknowledged
    log.turns()  # a read in the middle of turn 4
    del log
    gc.collect()
    wait_until_not_live(d)
    monkeypatch.undo()

    # Power cut: whatever was not synced is gone from the log.
    os.truncate(d / "events.jsonl", synced["len"])
    with memstore.open_session(tmp_path, "s") as log:
        # Turn 4 may survive as the open turn if the read synced it; turns 1-3 keep their numbers.
        assert [t.number for t in log.turns()][:3] == [1, 2, 3]
        assert log.turn_count == 3


# --------------------------------------------------------------------------------------------
# Cap rewrites


def test_a_failure_after_the_cap_rewrite_replaced_the_log_does_not_lose_later_events(tmp_path, fault):
    """``enforce_cap`` treats any exception from ``_replace_log_from`` as "the log was not
    replaced": it clears the pending marker and leaves the handle usable. But the directory
    fsync (and the reopen of the descriptors) run *after* ``os.replace``. When that fsync fails,
    the log has been replaced, the marker is gone, the index/state still describe the old log,
    and the shared descriptors still point at the old, now unlinked inode.

    Another handle of the same session (here one without a cap, so nothing re-runs the rewrite)
    then appends a whole turn: it is "acknowledged" (written and fdatasynced into the unlinked
    inode) and silently lost. After reopen the turns are also renumbered.

    Expected: after a failure past ``os.replace`` the session fails closed and keeps the marker
    (later appends raise ``LogFailedError``, reopen recovers); an append that returned must be
    in the log after reopen.
    """
    capped = memstore.open_session(tmp_path, "s", max_events=4)
    other = memstore.open_session(tmp_path, "s", max_events=0)
    for _ in range(2):
        capped.append(TURN_STARTED)
        capped.append(TURN_COMPLETED)

    failed = []

    def failing_fsync_dir(path):
        failed.append(path)
        raise memstore.StoreIOError("fsync directory", path, "Input/output error")

    fault.arm("cap.replaced", failing_fsync_dir)  # the directory sync right after the log's replacement
    with pytest.raises(memstore.StoreIOError):
        capped.append(TURN_STARTED)  # the fifth event: the cap rewrite replaces the log, then fails
    fault.disarm("cap.replaced")
    assert failed, "the failing directory sync never ran"

    marker = {"type": "note", "text": "acknowledged after the failed rewrite"}
    try:
        other.append(marker)
        other.append(TURN_COMPLETED)  # a turn boundary: durable once this returns
        acknowledged = True
    except memstore.LogFailedError:
        acknowledged = False  # failing closed is an acceptable answer
    for handle in (other, capped):
        try:
            handle.close()
        except memstore.MemstoreError:
            pass
    with memstore.open_session(tmp_path, "s", max_events=0) as log:
        events = list(log.iter_events())
    if acknowledged:
        assert marker in events, "an append that returned was lost"


def test_rebuild_after_a_full_cap_eviction_keeps_turn_ordinals(tmp_path):
    """When a cap rewrite evicts every turn (the log becomes empty), the eviction summary
    records ``first_retained_seq: null``. ``_scan_turn_base`` only trusts a summary whose
    ``first_retained_seq`` equals the seq of the log's first record; once later events are
    appended that first seq is a number, so the summary never matches again and a rebuild of the
    index and manifest renumbers the turns from 1 (turn 2 becomes turn 1, ``turn_count`` drops
    from 2 to 1). The README promises "turn ordinals survive a rebuild after a cap rewrite".

    Fix idea: record the seq the next record will get (``next_seq``) as the first retained seq
    of an emptied log, or accept a null-first summary when its ``next_seq`` <= the log's first
    seq.
    """
    with memstore.open_session(tmp_path, "s", max_events=3) as log:
        log.append(TURN_STARTED)
        log.append(NOTE)
        log.append(NOTE)
        log.append(TURN_COMPLETED)  # 4 > 3: turn 1 is evicted, the log is empty
        assert log.event_count == 0
        log.append(TURN_STARTED)
        log.append(TURN_COMPLETED)
        assert [t.number for t in log.turns()] == [2]
    drop_index_and_manifest(tmp_path)
    manifest = memstore.rebuild(tmp_path, "s")
    assert (manifest.turn_count, manifest.retained_turn_base) == (2, 2)
    with memstore.open_session(tmp_path, "s", max_events=0) as log:
        assert [t.number for t in log.turns()] == [2]


def test_rebuild_from_the_log_alone_after_a_cap_rewrite_keeps_ordinals_and_seqs(tmp_path):
    """DESIGN's first rule: "Delete index/, derived/, manifest.json ... run memstore rebuild,
    and every query ... comes back the same. Anything the views need ... must therefore be in
    the log". After a cap rewrite the retained turn base used to live only in derived/ and the
    manifest, so a rebuild after deleting them renumbered the turns from 1. The rewrite now
    tags the log's first line with ``retained_turn_base``; seqs are in the lines themselves.

    (A log the cap emptied carries nothing until its next append, which tags its own line: with
    an empty log *and* every piece of metadata deleted, numbering restarts.)
    """
    with memstore.open_session(tmp_path, "s", max_events=3) as log:
        for _ in range(3):
            log.append(TURN_STARTED)
            log.append(TURN_COMPLETED)
        log.append(TURN_STARTED)
        assert [t.number for t in log.turns()] == [3, 4]
    shutil.rmtree(session_dir(tmp_path) / "derived")
    drop_index_and_manifest(tmp_path)
    memstore.rebuild(tmp_path, "s")
    with memstore.open_session(tmp_path, "s", max_events=0) as log:
        assert [t.number for t in log.turns()] == [3, 4]
        assert log.append(TURN_COMPLETED) == 8
        log.append(TURN_STARTED)
        assert [t.number for t in log.turns()] == [3, 4, 5]


def test_a_failed_rebuild_of_an_open_session_leaves_its_handles_consistent(tmp_path, monkeypatch, fault):
    """``rebuild`` of a session this process has open runs ``_recover(force_rescan=True)`` on
    the shared state: ``_rescan`` replaces ``state`` with a fresh one and scans, committing every
    ``SCAN_BATCH_EVENTS`` events. If a later batch fails (a full disk), ``_open`` only drops the
    rebuild's handle; the other handles keep the half-scanned state. Here, with 4 turns in the
    log, the open handle afterwards says ``turn_count`` 2 / ``event_count`` 4, numbers the next
    turn 3 although it is the fifth, and ``reconstruct_turn(3)`` returns the wrong events, while
    ``failed`` stays false and appends go on.

    Expected: after a failed rebuild the shared state is either the one from before (restore it)
    or failed closed (``LogFailedError``); never silently wrong.
    """
    log = memstore.open_session(tmp_path, "s")
    for _ in range(4):
        log.append(TURN_STARTED)
        log.append(TURN_COMPLETED)
    monkeypatch.setattr(TUNING, "scan_batch_events", 2)
    calls = []

    def full_disk_on_second_batch(path, offset):
        calls.append(1)
        if len(calls) == 2:
            raise memstore.StoreIOError("update index", path, "database or disk is full")

    fault.arm("recovery.batch", full_disk_on_second_batch)
    with pytest.raises(memstore.StoreIOError):
        memstore.rebuild(tmp_path, "s")
    fault.disarm("recovery.batch")
    monkeypatch.undo()
    assert len(calls) == 2, "the armed fault must fail the rebuild's second batch"

    try:
        log.append(TURN_STARTED)
        log.append({"type": "note", "text": "turn five"})
        log.append(TURN_COMPLETED)
    except memstore.LogFailedError:
        log.close()
        return  # failing closed is a correct answer
    try:
        assert (log.turn_count, log.event_count) == (5, 11)
        assert log.reconstruct_turn(5)[1] == {"type": "note", "text": "turn five"}
    finally:
        log.close()


# --------------------------------------------------------------------------------------------
# The manifest publisher


def test_a_failed_manifest_publish_is_retried_by_the_next_flush(tmp_path, fault):
    """``_publish_manifest`` records ``self.published = data`` when it *submits* the manifest
    to the background publisher, before it is written. If that write fails (a full disk), the
    error surfaces once from ``drain()``; afterwards ``flush()`` and ``close()`` see "nothing
    changed", never resubmit, and return success while manifest.json stays stale for good
    (``memstore sessions`` keeps showing the old counts until some later change).

    Fix: remember what was actually published (in the publisher, after the write succeeded) or
    reset ``published`` when the publisher reports an error.
    """
    broken = {"on": False, "failed": 0}

    def maybe_failing(path, data):
        if broken["on"]:
            broken["failed"] += 1
            raise memstore.StoreIOError("create", path, "No space left on device")

    fault.arm("manifest.publish", maybe_failing)
    log = memstore.open_session(tmp_path, "s")
    log.append(TURN_STARTED)
    log.append(TURN_COMPLETED)
    log.flush()
    broken["on"] = True
    log.append(TURN_STARTED)
    log.append(TURN_COMPLETED)
    with pytest.raises(memstore.StoreIOError, match="manifest.json"):
        log.flush()
    assert broken["failed"], "the failing write never ran"
    broken["on"] = False  # the disk has room again
    log.flush()
    log.close()
    data = json.loads((session_dir(tmp_path) / "manifest.json").read_text())
    assert (data["event_count"], data["turn_count"]) == (4, 2)


# --------------------------------------------------------------------------------------------
# The index against a rebuild


class ItemType(str, enum.Enum):
    COMMAND = "command_execution"


def test_index_rows_of_dict_subclasses_and_str_enums_equal_a_rebuild(tmp_path, monkeypatch):
    """``events.describe`` uses exact type checks (``type(item) is dict``, ``type(x) is str``).
    On append it describes the caller's objects; on a rebuild it describes the decoded JSON.
    ``check_event`` accepts dict subclasses and orjson serializes them and str enums as plain
    JSON, so an item given as an ``OrderedDict`` (or whose fields are ``str`` enums) is indexed
    with NULL item_type/item_id/name/status/exit_code on append but with the real values after
    ``memstore.rebuild``: the incremental index disagrees with a rebuild, and "which commands
    ran" queries miss these events until a rebuild.

    Fix: use ``isinstance`` checks and store plain ``str(...)``/``int(...)`` values (or describe
    the event as it will decode).
    """
    monkeypatch.setattr(TUNING, "derive_idle_seconds", 0.01)
    with memstore.open_session(tmp_path, "s") as log:
        log.append(TURN_STARTED)
        log.append(
            {
                "type": "item.completed",
                "item": OrderedDict(
                    id="c1", type="command_execution", command="cargo test", exit_code=101, status="failed"
                ),
            }
        )
        log.append(
            {
                "type": "item.completed",
                "item": {
                    "id": "c2",
                    "type": ItemType.COMMAND,
                    "command": "cargo build",
                    "exit_code": 0,
                    "status": "completed",
                },
            }
        )
        log.append(TURN_COMPLETED)
        support.wait_until_derived(session_dir(tmp_path), 4)
    incremental = index_rows(tmp_path)
    assert incremental["events"][1][6:] == ("command_execution", "c1", "cargo test", "failed", 101)
    memstore.rebuild(tmp_path, "s")
    rebuilt = index_rows(tmp_path)
    assert incremental["events"] == rebuilt["events"]
    assert incremental["turns"] == rebuilt["turns"]


# --------------------------------------------------------------------------------------------
# Errors


def test_index_read_errors_are_memstore_errors_that_name_the_index(tmp_path):
    """The issue: "Every I/O error reaches the caller as a memstore exception that names the
    path". Index *writes* go through ``SessionIndex._transaction`` and become ``StoreIOError``,
    but the read paths (``SessionIndex.turn``/``turns``/``turn_spans`` and the query in
    ``_Session._turn_spans`` used by the cap) call ``conn.execute`` bare. Any SQLite error on
    them (an I/O error, corruption found at read time, a damaged schema) escapes as a raw
    ``sqlite3.OperationalError``/``DatabaseError`` that does not say which file is broken.

    Here the index's ``turns`` table is damaged (dropped) under an open session; either the
    read works (say, after rebuilding the index from the log) or it raises a ``StoreIOError``
    naming ``index/session.db``.
    """
    log = memstore.open_session(tmp_path, "s")
    log.append(TURN_STARTED)
    log.append(TURN_COMPLETED)
    conn = sqlite3.connect(session_dir(tmp_path) / "index" / "session.db")
    conn.execute("DROP TABLE turns")
    conn.commit()
    conn.close()
    try:
        for read in (lambda: log.reconstruct_turn(1), log.turns):
            try:
                read()
            except memstore.StoreIOError as exc:
                assert "session.db" in str(exc)
    finally:
        try:
            log.close()
        except memstore.MemstoreError:
            pass


def test_a_manifest_with_an_out_of_range_counter_does_not_brick_the_session(tmp_path):
    """``Manifest.from_dict`` accepts any non-negative int, so a manifest.json whose counter is
    a valid u64 above SQLite's signed 64-bit range (here ``next_seq = 2**63``; VT Code's fields
    are u64) is taken as well formed. The rescan copies it into the new state, the index
    commit then fails with "Python int too large to convert to SQLite INTEGER", and the session
    can no longer be opened *or rebuilt* until someone deletes manifest.json by hand. The issue
    and reference say a malformed manifest is treated as absent and rebuilt from the log.

    Fix: reject (treat as malformed) counters above 2**63 - 1 in ``_ints_ok``.
    """
    with memstore.open_session(tmp_path, "s") as log:
        log.append(TURN_STARTED)
        log.append(TURN_COMPLETED)
    d = session_dir(tmp_path)
    for path in (d / "index").glob("session.db*"):
        path.unlink()
    data = json.loads((d / "manifest.json").read_text())
    data["next_seq"] = 2**63
    (d / "manifest.json").write_text(json.dumps(data))
    manifest = memstore.rebuild(tmp_path, "s")
    assert manifest.turn_count == 1
    with memstore.open_session(tmp_path, "s") as log:
        log.append(TURN_STARTED)
        assert log.event_count == 3


# --------------------------------------------------------------------------------------------
# Directory entries


def test_a_new_store_root_is_synced_into_its_parent(tmp_path, monkeypatch):
    """The issue: "a newly created file's directory entry is synced too". ``_open`` creates a
    missing store root with plain ``os.makedirs`` and never syncs the parents of the
    directories it made; ``ensure_private_dir(sessions_root(root))`` only syncs ``root``
    itself (the parent of ``sessions/``). The first acknowledged turn of a new store (``memstore
    demo --root /tmp/memstore-demo``, an agent's first run) can therefore vanish with the whole
    root directory after a power cut, although events.jsonl, the session dir and sessions/ were
    synced.

    The test records every directory fsync'd (by the OS call itself) while opening a session
    under a root that does not exist yet (two levels): the parent of each directory created
    must be among them.
    """
    import stat

    synced: set[tuple[int, int]] = set()
    real_fsync = os.fsync

    def recording(fd):
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            synced.add((st.st_dev, st.st_ino))
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", recording)
    root = tmp_path / "new" / "store"
    with memstore.open_session(root, "s") as log:
        log.append(TURN_STARTED)
        log.append(TURN_COMPLETED)
    monkeypatch.undo()
    for created in (tmp_path / "new", root):
        parent = os.stat(created.parent)
        assert (parent.st_dev, parent.st_ino) in synced, f"the entry of {created} in {created.parent} was never synced"


def test_a_handle_opened_with_a_relative_root_survives_a_chdir(tmp_path, monkeypatch):
    """``_open`` keeps ``root`` as given, so with a relative root (``open_session(".vtcode",
    sid)`` is the natural call from a workspace) every path the session uses later is relative
    to whatever the current directory is *then*: the manifest publisher, ``iter_events``'s
    reader, the pending marker, eviction summaries, torn-tail files and the cap rewrite's temp
    file and ``os.replace`` over ``events.jsonl``. After the process changes directory, the
    handle fails (``StoreIOError: create .store/sessions/s/.manifest.json.tmp-...``), and if the
    new directory happens to hold a store with the same relative layout, memstore writes into
    (or, on a cap rewrite, replaces the log of) that other session.

    Fix: make the root absolute once in ``_open``/``rebuild`` (``Path(root).absolute()``).
    """
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    monkeypatch.chdir(tmp_path / "a")
    log = memstore.open_session(".store", "s")
    log.append(TURN_STARTED)
    log.append(TURN_COMPLETED)
    monkeypatch.chdir(tmp_path / "b")
    try:
        log.append(TURN_STARTED)
        log.append(TURN_COMPLETED)
        assert len(list(log.iter_events())) == 4
    finally:
        try:
            log.close()
        except memstore.MemstoreError:
            pass
    manifest = json.loads((tmp_path / "a" / ".store" / "sessions" / "s" / "manifest.json").read_text())
    assert manifest["event_count"] == 4
    assert not (tmp_path / "b" / ".store").exists()


# --------------------------------------------------------------------------------------------
# Handles


CHILD_GC_INSIDE_REGISTRY_LOCK = """
import gc, sys
sys.path.insert(0, {repo!r})
import memstore
from memstore import faults
root = {root!r}
dropped = memstore.open_session(root, "a")
dropped.self_ref = dropped  # a handle in a reference cycle: only the cyclic collector frees it
del dropped

def collect(**context):
    gc.collect()  # the collector may run at any allocation; the writer is built under the registry's lock

faults.arm("registry.create", collect)
memstore.open_session(root, "b").close()
print("ok")
"""


def test_a_handle_collected_while_the_registry_lock_is_held_does_not_deadlock(tmp_path):
    """``SessionLog.__del__`` calls ``_Session.release``, which takes the module's
    non-reentrant ``_registry_lock``. Python runs ``__del__`` of cyclic garbage whenever the
    cyclic collector happens to run, i.e. at an arbitrary allocation in an arbitrary thread,
    including inside ``with _registry_lock:`` in ``_open`` (which builds a ``_Session``) or in
    ``release`` (which stops the publisher thread and closes files under it). A dropped,
    unclosed handle that sits in a reference cycle (a traceback, a callback, an object holding
    it that refers back) then deadlocks that thread forever, and with it every later
    ``open_session``/``close`` in the process.

    The child process drops such a handle and forces the collection at the point inside the
    lock where an automatic one can happen; it must finish instead of hanging.

    Fix: never take locks in ``__del__`` (e.g. hand the release to a finalizer queue processed
    outside the lock, or try the lock non-blocking and defer).
    """
    repo = str(Path(memstore.__file__).resolve().parent.parent)
    script = CHILD_GC_INSIDE_REGISTRY_LOCK.format(repo=repo, root=str(tmp_path))
    try:
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=5)
    except subprocess.TimeoutExpired:
        pytest.fail("deadlock: the collected handle's __del__ waited for _registry_lock held by its own thread")
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
