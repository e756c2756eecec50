"""The event log across processes and rescans (issue 2, found in a second review): the
stale-manifest base rule for VT Code lines, what a rescan keeps of the old metadata, and the
life of handles across a fork and a drop. Each docstring says what went wrong before the fix
and why it matters.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import orjson

import memstore

REPO = str(Path(__file__).resolve().parents[2])
SID = "s"


def session_dir(root, sid=SID) -> Path:
    return memstore.session_directory(root, sid)


def vt_line(event: dict) -> bytes:
    """A line as VT Code writes it: no ``seq``, no ``ts``."""
    return orjson.dumps({"schema_version": "0.18.0", "event": event}) + b"\n"


def run_python(code: str) -> subprocess.CompletedProcess:
    script = f"import sys\nsys.path.insert(0, {REPO!r})\n" + textwrap.dedent(code)
    return subprocess.run([sys.executable, "-c", script], check=False, capture_output=True, text=True, timeout=30)


def log_records(root, sid=SID) -> list[dict]:
    data = (session_dir(root, sid) / "events.jsonl").read_bytes()
    return [orjson.loads(line) for line in data.splitlines() if line.strip()]


# --------------------------------------------------------------------------------------------
# _scan_turn_base: the stale-manifest prefix rule


def test_a_lost_suffix_of_a_vt_code_log_is_not_taken_for_a_removed_prefix(tmp_path):
    """A log shorter than its stale metadata is taken for a *removed prefix* (rule 2) unless
    ``_prefix_removed`` proves otherwise, and it can only prove it through ``seq``: when the
    log's first record is a VT Code line (no ``seq``) it answers "cannot tell" and the rule
    fires. The commit that added ``_prefix_removed`` says a shorter log is only taken for a
    removed prefix "when the stale index agrees"; here it clearly disagrees (its row at offset
    0 is the log's first line, a ``thread.started``), yet the turns are renumbered, the very
    bug test_a_mid_turn_read_never_publishes_metadata_ahead_of_the_synced_log fixed for
    memstore's own lines.

    The state arises from documented behaviour: memstore continues a VT Code session in bulk
    mode (``durability="none"``), whose reads index and publish unsynced bytes; a power cut
    then takes the unsynced suffix. The VT Code turns 1-3 come back as 2-4: ``reconstruct_turn
    (1)`` raises TurnNotFound although turn 1 is the first turn in the log.
    """
    d = session_dir(tmp_path)
    d.mkdir(parents=True)
    head = vt_line({"type": "thread.started", "thread_id": "t"})
    turns = b"".join(
        vt_line({"type": "turn.started"})
        + vt_line({"type": "item.completed", "item": {"id": f"m{n}", "type": "agent_message", "text": text}})
        + vt_line({"type": "turn.completed", "usage": {"input_tokens": 1}})
        for n, text in enumerate(("first " * 60, "second", "third"))
    )
    (d / "events.jsonl").write_bytes(head + turns)
    synced = len(head + turns)

    log = memstore.open_session(tmp_path, SID, durability="none")
    assert [t.number for t in log.turns()] == [1, 2, 3]
    log.append({"type": "turn.started"})
    log.append(
        {
            "type": "item.completed",
            "item": {
                "id": "c",
                "type": "command_execution",
                "command": "make",
                "aggregated_output": "x" * 400,
                "status": "completed",
            },
        }
    )
    assert [t.number for t in log.turns()] == [1, 2, 3, 4]  # a bulk-mode read: indexed, published, not synced
    directory = log.directory
    del log  # the process dies: no close(); the reaper writes the bytes, nothing syncs them
    gc.collect()
    deadline = time.monotonic() + 10
    while memstore.is_live(directory):
        assert time.monotonic() < deadline
        time.sleep(0.005)

    os.truncate(d / "events.jsonl", synced)  # power cut: the unsynced suffix is gone

    with memstore.open_session(tmp_path, SID) as log:
        assert [t.number for t in log.turns()] == [1, 2, 3], "a lost suffix renumbered the turns"
        assert log.turn_count == 3
        assert log.reconstruct_turn(1)[1]["item"]["text"].startswith("first")


# --------------------------------------------------------------------------------------------
# _rescan: status and timestamps


def test_rebuild_keeps_a_completed_status_set_outside_the_log(tmp_path):
    """Retention marks an abandoned session ``completed`` in its manifest (reference 4.1
    mark_abandoned); the log still holds the older ``thread.started``/``turn.started``. A
    reopen keeps the published status, and ``rebuild``'s docstring promises to keep "a status
    set outside the log (retention marking a session completed ...)". But ``_rescan`` seeds
    the status from the stale manifest and then lets every ``thread.started``/``turn.started``
    it replays set it back to ``active``, although those records are older than the mark. So a
    rebuild (or any rescan: a corrupt index, a marker) resurrects the abandoned session as
    active, and the rebuilt index disagrees with what the fast path served.
    """
    with memstore.open_session(tmp_path, SID) as log:
        log.append({"type": "thread.started", "thread_id": "t"})
        log.append({"type": "turn.started"})
        log.append({"type": "turn.completed", "usage": {}})
    manifest_path = session_dir(tmp_path) / "manifest.json"
    manifest = json.loads(manifest_path.read_bytes())
    manifest["status"] = "completed"  # what retention's mark_abandoned publishes
    manifest_path.write_text(json.dumps(manifest))
    with memstore.open_session(tmp_path, SID) as log:
        assert log.manifest.status == "completed"  # the fast path keeps it

    assert memstore.rebuild(tmp_path, SID).status == "completed", "rebuild resurrected a completed session"


def test_a_rescan_takes_session_times_from_the_log_when_its_first_line_has_no_ts(tmp_path):
    """With no metadata left, ``_rescan`` takes ``created_at`` from the *first record* only;
    when that is a VT Code line (no ``ts``), as in a VT Code session memstore continued, it
    falls back to the current time, and ``updated_at`` starts there and "only moves forward",
    so no timestamp in the log can lower it. A rebuild from the log alone therefore says the
    session was created and last updated *now*, though every timestamp in the log is months
    old: ``memstore sessions`` sorts it as the newest, and age-based retention (which reads
    ``updated_at``) never evicts it.
    """
    d = session_dir(tmp_path)
    d.mkdir(parents=True)
    (d / "events.jsonl").write_bytes(
        vt_line({"type": "thread.started", "thread_id": "t"})
        + b'{"schema_version":"0.18.0","seq":1,"ts":"2026-01-01T00:00:00.000Z","event":{"type":"turn.started"}}\n'
        + b'{"schema_version":"0.18.0","seq":2,"ts":"2026-01-01T00:05:00.000Z","event":{"type":"turn.completed","usage":{}}}\n'
    )
    manifest = memstore.rebuild(tmp_path, SID)
    assert manifest.updated_at == "2026-01-01T00:05:00.000Z"
    assert manifest.created_at == "2026-01-01T00:00:00.000Z"


# --------------------------------------------------------------------------------------------
# Handles across fork(): the registry, the atexit flush and the reaper are inherited as is


def test_a_forked_child_exiting_does_not_write_the_parents_buffered_events(tmp_path):
    """``_registry`` (with each session's buffer, descriptors and state) is inherited by a
    ``fork()``ed child, and the child's ``atexit`` handler ``_flush_open_sessions_at_exit``
    flushes those sessions as its own. A child that never touches memstore (a pre-fork server
    worker, any ``os.fork()`` that returns through ``sys.exit``) thus writes the parent's
    buffered, not-yet-written events into the log, indexes them and publishes the manifest;
    the parent later writes them again. The log gets the same ``seq`` twice (a duplicated
    ``turn.started`` even turns one turn into an interrupted turn plus another), and the
    parent's index offsets no longer point at its lines.
    """
    result = run_python(f"""
        import os
        import memstore
        log = memstore.open_session({str(tmp_path)!r}, {SID!r})
        log.append({{"type": "turn.started"}})           # buffered: the turn is open
        pid = os.fork()
        if pid == 0:
            sys.exit(0)                                  # a child that never uses memstore
        os.waitpid(pid, 0)
        log.append({{"type": "turn.completed", "usage": {{}}}})
        log.close()
    """)
    assert result.returncode == 0, result.stderr
    seqs = [r["seq"] for r in log_records(tmp_path)]
    assert seqs == [1, 2], f"the child re-wrote the parent's buffered events: seqs {seqs}"


def test_a_forked_child_cannot_open_a_session_its_parent_holds(tmp_path):
    """The README promises that a second writing process is refused with SessionBusyError. A
    ``fork()``ed child's ``open_session`` finds the parent's ``_Session`` in the inherited
    ``_registry`` and shares it (descriptor, counters, the parent's flock) instead of trying
    the lock, so two processes append to one log from diverging copies of the state: both
    hand out the same ``seq`` numbers, which must never repeat.
    """
    result = run_python(f"""
        import os
        import memstore
        log = memstore.open_session({str(tmp_path)!r}, {SID!r})
        log.append({{"type": "turn.started"}})
        log.append({{"type": "turn.completed", "usage": {{}}}})
        pid = os.fork()
        if pid == 0:
            try:
                child = memstore.open_session({str(tmp_path)!r}, {SID!r})
            except memstore.SessionBusyError:
                os._exit(0)
            child.append({{"type": "turn.started"}})
            child.append({{"type": "turn.completed", "usage": {{}}}})
            child.close()
            os._exit(3)
        _, status = os.waitpid(pid, 0)
        log.append({{"type": "turn.started"}})
        log.append({{"type": "turn.completed", "usage": {{}}}})
        log.close()
        sys.exit(os.waitstatus_to_exitcode(status))
    """)
    seqs = [r["seq"] for r in log_records(tmp_path)]
    assert len(seqs) == len(set(seqs)), f"two processes handed out the same seqs: {seqs}"
    assert result.returncode == 0, (
        f"the forked child opened the parent's session (rc {result.returncode}) {result.stderr}"
    )


def test_a_handle_dropped_in_a_forked_child_is_released(tmp_path):
    """``_start_reaper`` starts the reaper only while ``_reaper is None``. After a ``fork()``
    the global still names the parent's thread, which does not exist in the child, so no
    handle the child drops without ``close()`` is ever released: its buffered bytes are never
    written and its liveness lock is held until the child exits (so retention and other
    processes see the session live, and ``open_session`` elsewhere gets SessionBusyError).
    """
    result = run_python(f"""
        import gc, os, time
        import memstore
        memstore.open_session({str(tmp_path)!r}, "parent").close()   # starts the reaper
        pid = os.fork()
        if pid == 0:
            log = memstore.open_session({str(tmp_path)!r}, "child")
            log.append({{"type": "thread.started", "thread_id": "t"}})
            directory = log.directory
            del log
            gc.collect()
            deadline = time.monotonic() + 2
            while memstore.is_live(directory) and time.monotonic() < deadline:
                time.sleep(0.01)
            released = not memstore.is_live(directory)
            written = os.path.getsize(directory / "events.jsonl") > 0
            os._exit(0 if released and written else 1)
        _, status = os.waitpid(pid, 0)
        sys.exit(os.waitstatus_to_exitcode(status))
    """)
    assert result.returncode == 0, f"the child's dropped handle was never released {result.stderr}"


# --------------------------------------------------------------------------------------------
# Dropped handles: asynchronous release


def test_a_dropped_handle_writes_its_buffered_bytes_at_the_drop(tmp_path):
    """The README says a handle dropped without ``close()`` "writes its buffered bytes only,
    like VT Code's Drop", and reference 4.1 (reopening_after_drop_scans_bytes_flushed_without_
    metadata) relies on the bytes being in the file once the drop happened. ``__del__`` now
    only queues the session for the reaper thread, so the write (and the release of the
    liveness lock) happens whenever that thread next gets the GIL. If the process ends first
    (``os._exit``, as every ``multiprocessing`` child does; a SIGKILL; a crash) the events are
    lost, where VT Code would have handed them to the kernel; meanwhile ``is_live`` still
    reports the dropped session live.
    """
    result = run_python(f"""
        import os
        import memstore
        log = memstore.open_session({str(tmp_path)!r}, {SID!r})
        log.append({{"type": "thread.started", "thread_id": "t"}})
        del log                                          # dropped without close()
        os._exit(0)
    """)
    assert result.returncode == 0, result.stderr
    assert [r["event"]["type"] for r in log_records(tmp_path)] == ["thread.started"], (
        "the dropped handle's event was lost"
    )
