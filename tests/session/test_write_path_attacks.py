"""Adversarial review of the write path: each test proves a bug that was found (and then fixed)
in the agent's path, the publisher, the deriver, recovery or the cap."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import support
from support import TURN_COMPLETED, TURN_STARTED

import memstore
from memstore.session.tuning import TUNING


def session_dir(root, sid="s"):
    return memstore.session_directory(root, sid)


def log_records(root, sid="s"):
    return [json.loads(line) for line in (session_dir(root, sid) / "events.jsonl").read_bytes().splitlines()]


def rebuilt_index(root, sid="s"):
    """The index rows a rebuild from the log alone gives."""
    memstore.rebuild(root, sid, refresh=False)
    return support.read_index(session_dir(root, sid))


# --------------------------------------------------------------------------------------------
# Recovery


def test_a_rescan_interrupted_between_its_batches_still_never_reuses_a_torn_seq(tmp_path, monkeypatch, fault):
    """A rescan commits in batches so that an interrupted one resumes where it stopped; the
    resumed scan must still honour the seqs the rescan had to skip (those of a torn tail it cut,
    and those the old metadata counted): a seq handed out once is never handed out again."""
    with memstore.open_session(tmp_path, "s") as log:
        for _ in range(3):
            log.append(TURN_STARTED)
            log.append(TURN_COMPLETED)
    path = session_dir(tmp_path) / "events.jsonl"
    with open(path, "ab") as f:  # a writer killed mid-write of seq 7
        f.write(b'{"schema_version":"0.18.0","seq":7,"ts":"2026-01-01T00:00:00.000Z","event":{"type":"turn.st')
    (session_dir(tmp_path) / "index" / "session.db").unlink()  # the next open rescans

    support.interrupt_the_next_rescan_after_its_first_batch(monkeypatch, fault, path)
    with pytest.raises(memstore.StoreIOError, match="killed"):
        memstore.open_session(tmp_path, "s")
    fault.disarm("recovery.batch")

    with memstore.open_session(tmp_path, "s") as log:
        seq = log.append(TURN_STARTED)
    assert seq == 8, "seq 7 was written (the torn tail kept beside the log holds it)"


def test_a_resumed_rescan_keeps_a_status_set_outside_the_log(tmp_path, monkeypatch, fault):
    """Retention marked the session completed in manifest.json; a rescan keeps that status
    against the records the old metadata covered. Interrupted and resumed, it must too."""
    with memstore.open_session(tmp_path, "s") as log:
        for _ in range(3):
            log.append(TURN_STARTED)
            log.append(TURN_COMPLETED)
    manifest_path = session_dir(tmp_path) / "manifest.json"
    manifest = json.loads(manifest_path.read_bytes())
    manifest["status"] = "completed"  # what retention's abandoned sweep writes
    manifest_path.write_text(json.dumps(manifest))
    (session_dir(tmp_path) / "index" / "session.db").unlink()

    support.interrupt_the_next_rescan_after_its_first_batch(monkeypatch, fault, manifest_path)
    with pytest.raises(memstore.StoreIOError, match="killed"):
        memstore.open_session(tmp_path, "s")
    fault.disarm("recovery.batch")

    with memstore.open_session(tmp_path, "s") as log:
        assert log.manifest.status == "completed"


# --------------------------------------------------------------------------------------------
# complete()


def test_complete_publishes_its_updated_at_to_the_index_too(tmp_path):
    """complete() bumps updated_at and flushes: the index row (what read_session, the catalog
    and the next open read) must say the same as manifest.json."""
    with memstore.open_session(tmp_path, "s") as log:
        log.append(TURN_STARTED, ts="2026-01-01T00:00:00.000Z")
        log.append(TURN_COMPLETED, ts="2026-01-01T00:00:01.000Z")
        log.complete()
        bumped = log.manifest.updated_at
        assert bumped > "2026-01-01T00:00:01.000Z"
    on_disk = json.loads((session_dir(tmp_path) / "manifest.json").read_bytes())
    assert on_disk["updated_at"] == bumped
    with memstore.read_session(tmp_path, "s") as reader:
        assert reader.manifest.updated_at == bumped


def test_complete_never_moves_updated_at_backwards(tmp_path):
    """An import may append events from a clock slightly ahead of this one; updated_at only
    moves forward, so complete() must not set it back. A time past the present is clamped to
    it (test_log.py: a time in the future does not date the session in the future), so the bound is "now" at the append."""
    with memstore.open_session(tmp_path, "s") as log:
        log.append(TURN_STARTED, ts="2099-01-01T00:00:00.000Z")
        log.append(TURN_COMPLETED, ts="2099-01-01T00:00:01.000Z")
        before = log.manifest.updated_at
        assert before < "2099"
        log.complete()
        assert log.manifest.updated_at >= before
        # complete() stamps its own time when the log's newest time is older
        assert log.manifest.updated_at < "2099"


# --------------------------------------------------------------------------------------------
# Handles dropped without close()


def run_script(script: str, *args, timeout: float = 30) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(
            [sys.executable, "-c", textwrap.dedent(script), *map(str, args)],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the script hung (killed after {timeout} s); stderr: {exc.stderr!r}")


def test_a_handle_collected_in_the_publishers_thread_does_not_deadlock_it(tmp_path):
    """The cyclic garbage collector runs in whichever thread allocates, the publisher's
    included. When it collects the session's last handle there, releasing the handle must not
    make the publisher wait for itself (the last release stops the publisher, which waits for
    the batch the publisher is committing)."""
    result = run_script(
        """
        import gc, os, sys, threading
        import memstore
        from memstore import faults

        gc.disable()
        dropped, collected = threading.Event(), threading.Event()

        def collect_in_the_publisher(**context):
            if threading.current_thread().name == "memstore-publisher":
                dropped.wait(5)
                gc.collect()  # what an allocation there may trigger
                collected.set()

        faults.arm("index.commit", collect_in_the_publisher)  # then the commit goes on
        agent = [memstore.open_session(sys.argv[1], "s")]
        agent.append(agent)  # an agent's object graph holding the handle in a reference cycle
        agent[0].append({"type": "turn.started"})
        agent[0].append({"type": "turn.completed", "usage": {}})
        del agent  # dropped without close(), while the publisher commits the turn
        dropped.set()
        if not collected.wait(5):
            print("the publisher is stuck", flush=True)
            os._exit(3)
        with memstore.open_session(sys.argv[1], "s") as log:  # after the release
            print("reopened", log.turn_count)
    """,
        tmp_path,
        timeout=20,
    )
    assert result.returncode == 0 and "reopened 1" in result.stdout, result.stderr


# --------------------------------------------------------------------------------------------
# The cap and a failing index


def test_an_index_failure_does_not_fail_appends_past_the_cap(tmp_path, fault):
    """A failed index transaction is reported by the next flush and never fails an append, the
    cap's included: before, every append past the cap raised the index's error, saying
    ``durable=False`` of an event that was in the buffer all the same, so a caller that retried
    it wrote it twice."""
    log = memstore.open_session(tmp_path, "s", max_events=4)
    log.append(TURN_STARTED)
    log.append(TURN_COMPLETED)

    def full_disk(path):
        raise memstore.StoreIOError("update index", path, "database or disk is full")

    fault.arm("index.commit", full_disk)
    log.append(TURN_STARTED)
    log.append(TURN_COMPLETED)
    seqs = []
    for event in (TURN_STARTED, {"type": "item.completed", "item": {"type": "agent_message", "text": "hi"}}):
        try:
            seqs.append(log.append(event))
        except memstore.MemstoreError as exc:
            # (A caller is told to append again an event whose error says it is not durable.)
            pytest.fail(
                f"an append past the cap failed on the index's error, durable={exc.durable}, "
                f"but its event is in the buffer, to be written: {exc}"
            )
    with pytest.raises(memstore.StoreIOError, match="disk is full"):
        log.flush()
    fault.disarm("index.commit")
    log.append(TURN_COMPLETED)  # the cap runs again, now that the index works
    log.close()
    assert seqs == [5, 6]
    assert [r["seq"] for r in log_records(tmp_path) if "event" in r] == [5, 6, 7]
    live = support.read_index(session_dir(tmp_path))
    assert rebuilt_index(tmp_path) == live


# --------------------------------------------------------------------------------------------
# Incremental index == rebuild


def _turn_models(root, sid="s"):
    import sqlite3

    conn = sqlite3.connect(f"file:{session_dir(root, sid) / 'index' / 'session.db'}?mode=ro", uri=True)
    try:
        return conn.execute("SELECT number, model, error FROM turns ORDER BY number").fetchall()
    finally:
        conn.close()


def test_the_turn_state_machine_reads_what_was_written_not_the_callers_objects(tmp_path):
    """An agent may pass enum members (``str`` enums, or plain ones whose value is a string):
    they are written as their value, and a rebuild reads that value back. The append path must
    index the same turn rows (the model was lost before)."""
    import enum

    class Model(str, enum.Enum):
        GPT = "gpt-5"

    class Plain(enum.Enum):
        CLAUDE = "claude-4"

    with memstore.open_session(tmp_path, "s") as log:
        log.append({"type": "turn.started", "model": Model.GPT})
        log.append({"type": "turn.completed", "usage": {}})
        log.append({"type": "turn.started", "model": Plain.CLAUDE})
        log.append({"type": "turn.completed", "usage": {}, "model": Plain.CLAUDE})
    live = _turn_models(tmp_path)
    memstore.rebuild(tmp_path, "s", refresh=False)
    assert live == _turn_models(tmp_path) == [(1, "gpt-5", None), (2, "claude-4", None)]


# --------------------------------------------------------------------------------------------
# Torn tails


def test_a_seq_inside_a_torn_events_payload_is_not_taken_for_its_envelopes(tmp_path):
    """The seqs a torn tail held are never given again; only the envelopes' seqs count, not a
    "seq" key of the event itself (a tool's output, say), or the session's numbering jumps."""
    with memstore.open_session(tmp_path, "s") as log:
        log.append(TURN_STARTED)
        log.append(TURN_COMPLETED)
    with open(session_dir(tmp_path) / "events.jsonl", "ab") as f:  # killed mid-write of seq 3
        f.write(
            b'{"schema_version":"0.18.0","seq":3,"ts":"2026-01-01T00:00:00.000Z","event":{"type":"item.completed",'
            b'"item":{"type":"tool_output","output":{"seq":1700000000000000,"rows":[1,2'
        )
    with memstore.open_session(tmp_path, "s") as log:
        assert log.append(TURN_STARTED) == 4
    assert rebuilt_index(tmp_path)["manifest"]["next_seq"] == 5


def test_a_manifest_failure_after_a_cap_rewrite_does_not_fail_the_append(tmp_path, fault):
    """manifest.json is a view like the index: the cap rewrite itself writes the manifest of the
    rewritten log (synced with it), and failing to publish a later one is reported by the next
    flush, not raised by the append."""
    log = memstore.open_session(tmp_path, "s", max_events=4)
    for _ in range(2):
        log.append(TURN_STARTED)
        log.append(TURN_COMPLETED)
    log.flush()

    def full_disk_after_the_rewrite(path, data):
        if json.loads(data)["retained_turn_base"] > 1:
            raise memstore.StoreIOError("write", path, "no space left on device")

    fault.arm("manifest.publish", full_disk_after_the_rewrite)
    log.append(TURN_STARTED)  # the fifth event: the cap evicts the first turn
    assert [r["seq"] for r in log_records(tmp_path)] == [3, 4, 5]
    assert json.loads((session_dir(tmp_path) / "manifest.json").read_bytes())["retained_turn_base"] == 2
    log.append(TURN_COMPLETED)  # a boundary: its manifest fails, in the publisher's thread
    with pytest.raises(memstore.StoreIOError, match="no space"):
        log.flush()
    fault.disarm("manifest.publish")
    log.close()
    assert [r["seq"] for r in log_records(tmp_path)] == [3, 4, 5, 6]
    on_disk = json.loads((session_dir(tmp_path) / "manifest.json").read_bytes())
    live = support.read_index(session_dir(tmp_path))
    assert {k: on_disk[k] for k in support.MANIFEST_COUNTERS} == live["manifest"]
    with memstore.open_session(tmp_path, "s") as log:
        assert (log.turn_count, log.event_count) == (3, 4)
    assert not (session_dir(tmp_path) / "index" / "pending-cap-rewrite.json").exists()
    assert rebuilt_index(tmp_path) == live


def test_a_cap_rewrite_that_fails_before_the_log_is_replaced_leaves_everything_as_it_was(tmp_path, fault):
    """A rewrite that fails after it copied the log, wrote the summary and manifest.json's next
    version (here: no space for its marker) raises from the append that crossed the cap (the
    event is durable) and takes everything back: the log, manifest.json and the summaries are as
    they were, no temp file or marker is left, the session goes on, and the next crossing of the
    cap evicts."""
    directory = session_dir(tmp_path)
    log = memstore.open_session(tmp_path, "s", max_events=4)
    for _ in range(2):
        log.append(TURN_STARTED)
        log.append({"type": "item.completed", "item": {"id": "m", "type": "agent_message", "text": "kept"}})
    log.flush()
    log_before = (directory / "events.jsonl").read_bytes()

    def no_space(path):
        raise memstore.StoreIOError("write", path, "no space left on device")

    fault.arm("cap.marker", no_space)
    with pytest.raises(memstore.StoreIOError, match="no space") as info:
        log.append(TURN_COMPLETED)  # the fifth event
    fault.disarm("cap.marker")
    assert info.value.durable is True and info.value.seq == 5
    assert (directory / "events.jsonl").read_bytes() == log_before + log_lines_of(info.value.seq, directory)
    manifest = json.loads((directory / "manifest.json").read_bytes())  # (the boundary's, not the cap's)
    assert (manifest["retained_turn_base"], manifest["persisted_file_len"]) == (
        1,
        len(log_before) + len(log_lines_of(5, directory)),
    )
    assert not (directory / "index" / "pending-cap-rewrite.json").exists()
    derived = directory / "derived"
    assert not list(derived.glob("eviction-summary-*")) and not (derived / "eviction-summaries.jsonl").read_bytes()
    leftovers = [
        p.name
        for d in (directory, directory / "index", derived)
        for p in d.iterdir()
        if ".tmp-" in p.name or ".cap-" in p.name
    ]
    assert leftovers == []
    assert not log.failed
    log.append(TURN_STARTED)  # crosses the cap again: evicts this time
    log.close()
    with memstore.open_session(tmp_path, "s") as log:
        assert [(t.number, t.status) for t in log.turns()] == [(2, "completed"), (3, "open")]
    assert len((derived / "eviction-summaries.jsonl").read_bytes().splitlines()) == 1


def log_lines_of(seq: int, directory) -> bytes:
    """The line of the record ``seq`` as the log holds it."""
    for line in (directory / "events.jsonl").read_bytes().splitlines(keepends=True):
        if json.loads(line).get("seq") == seq:
            return line
    raise AssertionError(f"seq {seq} is not in the log")


# --------------------------------------------------------------------------------------------
# Hostile metadata


def test_a_hostile_manifest_cannot_make_a_session_claim_another_sessions_id(tmp_path):
    """A rescan keeps what the old manifest says that the log cannot (created_at, a status set
    outside the log), but not an id that names another session's directory: manifest.json,
    ``memstore sessions`` and the eviction summaries would list two sessions "victim"."""
    with memstore.open_session(tmp_path, "victim") as log:
        log.append(TURN_STARTED)
    with memstore.open_session(tmp_path, "s") as log:
        log.append(TURN_STARTED)
    manifest_path = session_dir(tmp_path) / "manifest.json"
    manifest = json.loads(manifest_path.read_bytes())
    manifest["session_id"] = "victim"
    manifest_path.write_text(json.dumps(manifest))
    (session_dir(tmp_path) / "index" / "session.db").unlink()  # the next open rescans
    with memstore.open_session(tmp_path, "s") as log:
        assert log.manifest.session_id == "s"
    assert json.loads(manifest_path.read_bytes())["session_id"] == "s"
    assert sorted(s.session_id for s in memstore.list_sessions(tmp_path)) == ["s", "victim"]


# --------------------------------------------------------------------------------------------
# fork()


def test_an_inherited_handle_refuses_in_a_forked_child_even_if_a_thread_held_its_lock(tmp_path):
    """A forked child gets the parent's locks in the state they were in, and the threads that
    held them do not exist there. A handle inherited while some thread of the parent held the
    session's lock (the deriver does, whenever the agent is idle; the publisher holds the index
    lock and the summary cache's) must refuse in the child, not hang it for ever."""
    result = run_script(
        """
        import os, signal, sys, threading
        import memstore
        from memstore.session.manifest import summary_cache

        root = sys.argv[1]
        log = memstore.open_session(root, "s")
        log.append({"type": "turn.started"})
        log.append({"type": "turn.completed", "usage": {}})
        held, release = threading.Event(), threading.Event()

        def busy_thread():
            with log._writer.lock, log._writer.slot.lock, summary_cache._lock:
                held.set()
                release.wait()

        thread = threading.Thread(target=busy_thread)
        thread.start()
        held.wait()
        pid = os.fork()
        if pid == 0:
            signal.alarm(5)  # a hang ends the child with SIGALRM
            try:
                log.append({"type": "turn.started"})
            except memstore.MemstoreError as exc:
                print("refused:", type(exc).__name__, flush=True)
            try:
                log.flush()
            except memstore.MemstoreError as exc:
                print("refused:", type(exc).__name__, flush=True)
            print("manifest:", log.manifest.event_count, flush=True)
            print("sessions:", [s.session_id for s in memstore.list_sessions(root)], flush=True)
            log.close()
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        release.set()
        thread.join()
        log.close()
        print("child status", status, flush=True)
    """,
        tmp_path,
        timeout=30,
    )
    assert result.returncode == 0, result.stderr
    assert "child status 0" in result.stdout, result.stdout
    assert result.stdout.count("refused: ") == 2, result.stdout
    assert "manifest: 2" in result.stdout and "sessions: ['s']" in result.stdout, result.stdout


def test_an_error_after_a_cap_rewrite_says_the_event_is_durable(tmp_path, fault):
    """``durable`` must say whether the event reached the log. After a cap rewrite the log is
    shorter than where the event was appended: an error raised after the rewrite (here the sync
    of the directory the log was renamed in fails; the index's own update no longer fails the
    append, it is retried) said ``durable=False`` of an event written, synced and kept, and a
    caller that appended it again (on a reopened handle: this one failed closed) logged it twice."""
    log = memstore.open_session(tmp_path, "s", max_events=4)
    for _ in range(2):
        log.append(TURN_STARTED)
        log.append(TURN_COMPLETED)

    def failing_directory_sync(path):
        raise memstore.StoreIOError("fsync directory", path, "input/output error")

    fault.arm("cap.replaced", failing_directory_sync)
    with pytest.raises(memstore.StoreIOError) as info:
        log.append(TURN_STARTED)  # the fifth event: the cap rewrites the log
    fault.disarm("cap.replaced")
    assert info.value.seq == 5
    assert [r["seq"] for r in log_records(tmp_path)] == [3, 4, 5]
    assert info.value.durable is True
    assert log.failed
    log.close()
    with memstore.open_session(tmp_path, "s", max_events=4) as log:
        assert [(t.number, t.status) for t in log.turns()] == [(2, "completed"), (3, "open")]


# --------------------------------------------------------------------------------------------
# close()


def test_a_close_interrupted_while_it_waits_for_the_deriver_still_releases_the_session(tmp_path, fault):
    """Ctrl-C (KeyboardInterrupt) can land while close() joins the session's deriver thread.
    The close must still close the files and release the liveness lock: it had already taken
    the session out of the registry, so the next open in this process found its own lock
    held and raised SessionBusyError for as long as the process lived."""
    log = memstore.open_session(tmp_path, "s")
    log.append(TURN_STARTED)
    log.append(TURN_COMPLETED)  # starts the deriver

    def interrupted(path):
        raise KeyboardInterrupt

    fault.arm("deriver.stopped", interrupted)
    with pytest.raises(KeyboardInterrupt):
        log.close()
    fault.disarm("deriver.stopped")
    assert not memstore.is_live(session_dir(tmp_path))
    with memstore.open_session(tmp_path, "s") as log:
        assert log.turn_count == 1


def test_catching_up_after_a_cap_rewrite_does_not_take_a_stale_manifests_status(tmp_path, fault):
    """The catch-up of a resumed rescan takes manifest.json's status for the records it
    covered; a manifest.json from before a cap rewrite counts offsets of the old log and its
    status is older than the index's. (The cap's manifest follows from the publisher's thread:
    a writer killed meanwhile leaves such a manifest.json behind.)"""
    log = memstore.open_session(tmp_path, "s", max_events=6)
    log.append(TURN_STARTED)
    log.append({"type": "item.completed", "item": {"type": "agent_message", "text": "x" * 2000}})
    log.append(TURN_COMPLETED)
    log.append(TURN_STARTED)
    log.append(TURN_COMPLETED)
    log.append(
        {
            "type": "thread.completed",
            "thread_id": "t",
            "session_id": "s",
            "subtype": "success",
            "outcome_code": "ok",
            "usage": {},
            "num_turns": 2,
        }
    )
    log.flush()
    assert json.loads((session_dir(tmp_path) / "manifest.json").read_bytes())["status"] == "completed"

    def full_disk(**context):
        raise memstore.StoreIOError("write", "manifest.json", "no space left on device")

    fault.arm("manifest.publish", full_disk)
    log.append(TURN_STARTED)  # the session is active again, and the cap evicts turn 1
    fault.arm("index.commit", full_disk)
    log.append(TURN_COMPLETED)
    with pytest.raises(memstore.StoreIOError):
        log.close()  # (as a writer killed here: the index is behind the log)
    fault.disarm_all()
    with memstore.open_session(tmp_path, "s") as log:
        assert (log.turn_count, log.manifest.status) == (3, "active")


def test_a_cap_rewrite_waits_until_manifest_json_describes_the_log_it_rewrites(tmp_path):
    """A rescan guided by the rewrite marker keeps manifest.json's status for the records it
    covered: that manifest must describe the log as the rewrite found it. This review's first
    change to the cap waited only for the index transactions, so with manifest.json failing
    the rewrite went ahead, and a writer killed during it came back with a status the session
    had left. (The cap now waits, without failing the append, until the views are current.)"""
    result = run_script(
        """
        import os, sys
        import memstore
        from memstore import faults

        log = memstore.open_session(sys.argv[1], "s", max_events=6)
        log.append({"type": "turn.started"})
        log.append({"type": "item.completed", "item": {"type": "agent_message", "text": "x" * 2000}})
        log.append({"type": "turn.completed", "usage": {}})
        log.append({"type": "turn.started"})
        log.append({"type": "turn.completed", "usage": {}})
        log.append({"type": "thread.completed", "thread_id": "t", "session_id": "s", "subtype": "success",
                    "outcome_code": "ok", "usage": {}, "num_turns": 2})
        log.flush()

        def full_disk(path, **context):
            raise memstore.StoreIOError("write", path, "no space left on device")

        def killed(**context):
            os._exit(0)  # SIGKILL between the log's replacement and the index's eviction

        faults.arm("manifest.publish", full_disk)
        faults.arm("index.evict", killed)
        log.append({"type": "turn.started"})  # active again, and over the cap
        os._exit(0)
    """,
        tmp_path,
        timeout=30,
    )
    assert result.returncode == 0, result.stderr
    with memstore.open_session(tmp_path, "s") as log:
        assert (log.turn_count, log.manifest.status, log.manifest.in_turn) == (2, "active", True)


def test_a_manifest_next_seq_at_the_limit_cannot_hand_out_a_seq_the_log_cannot_keep(tmp_path):
    """Seqs above MAX_SEQ are not trusted when read back (a rescan renumbers them). A manifest
    whose next_seq is MAX_SEQ + 1 was trusted as a floor, so the next append was acknowledged
    with a seq that the next open gave another number."""
    import shutil

    with memstore.open_session(tmp_path, "s") as log:
        log.append(TURN_STARTED)
        log.append(TURN_COMPLETED)
    manifest_path = session_dir(tmp_path) / "manifest.json"
    manifest = json.loads(manifest_path.read_bytes())
    manifest["next_seq"] = memstore.events.MAX_SEQ + 1
    manifest_path.write_text(json.dumps(manifest))
    shutil.rmtree(session_dir(tmp_path) / "index")
    with memstore.open_session(tmp_path, "s") as log:
        seq = log.append(TURN_STARTED)
    with memstore.open_session(tmp_path, "s") as log:
        assert [r.seq for r in log.iter_records()] == [1, 2, seq]


def test_a_log_claiming_the_last_seq_refuses_appends_rather_than_hand_out_an_unreadable_one(tmp_path):
    directory = tmp_path / "sessions" / "s"
    directory.mkdir(parents=True)
    last = memstore.events.MAX_SEQ
    (directory / "events.jsonl").write_bytes(
        b'{"schema_version":"0.18.0","seq":%d,"event":{"type":"turn.started"}}\n' % last
    )
    with memstore.open_session(tmp_path, "s") as log:
        with pytest.raises(memstore.MemstoreError, match="no sequence number is left"):
            log.append(TURN_COMPLETED)
        assert [r.seq for r in log.iter_records()] == [last]
    assert len(log_records(tmp_path)) == 1


def test_an_eviction_hook_that_appends_to_its_session_cannot_recurse_or_corrupt_it(tmp_path):
    """The eviction hook runs inside the cap rewrite, under the session's lock. One that logs
    into the session (a natural thing to write) re-entered the cap from its own append, again
    and again: hundreds of copies of its event landed in the log until the recursion limit, and
    the failures' back-off disabled the cap for a million events. An append there is refused
    (the rewrite is between two states of the log); the agent's events are all kept, once."""
    holder = {}

    def hook(session_dir, session_id, events):
        holder["log"].append({"type": "note", "text": f"evicted {sum(1 for _ in events)} events"})

    log = memstore.open_session(tmp_path, "s", max_events=6, on_evict=hook)
    holder["log"] = log
    appended = 0
    for _ in range(5):
        for event in (TURN_STARTED, TURN_COMPLETED):
            try:
                log.append(event)
            except memstore.CapEvictionError as exc:
                assert exc.durable
            appended += 1
    log.close()
    records = log_records(tmp_path)
    assert len(records) == appended == log.event_count, "the hook's appends were logged"
    assert [r["event"]["type"] for r in records].count("note") == 0
    live = support.read_index(session_dir(tmp_path))
    assert rebuilt_index(tmp_path) == live


def test_a_status_retention_published_is_committed_to_the_index_by_the_next_open(tmp_path):
    """An open adopts the status (and times) that retention wrote into manifest.json; the
    index row must say the same afterwards, or manifest.json and the index disagree after the
    close (readers then depend on manifest.json's counters matching to see the status)."""
    with memstore.open_session(tmp_path, "s") as log:
        log.append(TURN_STARTED)
        log.append(TURN_COMPLETED)
    manifest_path = session_dir(tmp_path) / "manifest.json"
    manifest = json.loads(manifest_path.read_bytes())
    manifest["status"] = "completed"  # what retention's abandoned sweep writes
    manifest_path.write_text(json.dumps(manifest))
    with memstore.open_session(tmp_path, "s") as log:
        assert log.manifest.status == "completed"
    on_disk = json.loads(manifest_path.read_bytes())
    assert {k: on_disk[k] for k in support.MANIFEST_COUNTERS} == support.read_index(session_dir(tmp_path))["manifest"]


@pytest.mark.parametrize("metadata", ["turns.json", "marker"])
def test_an_absurd_turn_number_in_legacy_metadata_does_not_brick_the_session(tmp_path, metadata):
    """VT Code's index/turns.json and the cap's rewrite marker can give a rescan the number of
    the first turn. Believed however large, 2**63 - 1 made the next turn's number overflow
    SQLite's integers: the index failed, and every later open with it."""
    directory = tmp_path / "sessions" / "s"
    (directory / "index").mkdir(parents=True)
    lines = (
        b'{"schema_version":"0.11.0","event":{"type":"turn.started"}}\n'
        b'{"schema_version":"0.11.0","event":{"type":"turn.completed","usage":{}}}\n'
    )
    (directory / "events.jsonl").write_bytes(lines)
    huge = 2**63 - 1
    if metadata == "turns.json":
        entry = {"turn_number": huge, "start_offset": 0, "end_offset": len(lines), "event_count": 2, "ts": 0}
        (directory / "index" / "turns.json").write_text(json.dumps({"entries": [entry]}))
    else:
        marker = {"previous_file_len": len(lines) + 100, "new_file_len": len(lines), "retained_turn_base": huge}
        (directory / "index" / "pending-cap-rewrite.json").write_text(json.dumps(marker))
    with memstore.open_session(tmp_path, "s") as log:
        log.append(TURN_STARTED)
        log.append(TURN_COMPLETED)
    with memstore.open_session(tmp_path, "s") as log:
        assert [t.number for t in log.turns()] == [1, 2]


# --------------------------------------------------------------------------------------------
# The deriver


def test_the_deriver_comes_back_when_it_found_the_session_busy(tmp_path, monkeypatch):
    """The deriver gives way when the session's lock is taken (the agent is at work), but it
    must come back once the agent is idle again: it gave up until the next append, so after the
    agent's last turn (and one read of the session at the wrong moment) the search chunks
    waited for ever."""
    import time

    monkeypatch.setattr(TUNING, "derive_idle_seconds", 0.05)
    log = memstore.open_session(tmp_path, "s")
    with log._writer.lock:  # the agent reads the session as its turn ends (a read takes the lock)
        log.append(TURN_STARTED)
        log.append({"type": "item.completed", "item": {"type": "agent_message", "text": "hello"}})
        log.append(TURN_COMPLETED)
        time.sleep(0.3)  # meanwhile the deriver, woken by the turn, finds the lock taken
    # The agent is idle from here on.
    support.wait_until_derived(session_dir(tmp_path), 3, timeout=5)
    log.close()


def test_after_a_failing_eviction_hook_recovers_the_cap_is_the_cap_again(tmp_path):
    """A failing hook puts the next try off by a growing gap, counted in events. Once the hook
    works again and a rewrite succeeds, the next crossing of the cap must evict: the put-off
    count was kept, so the session was held to a cap that much higher for good."""
    failures = [RuntimeError("summary store unavailable")] * 3

    def flaky_hook(session_dir, session_id, events):
        for _ in events:
            pass
        if failures:
            raise failures.pop()

    log = memstore.open_session(tmp_path, "s", max_events=20, on_evict=flaky_hook)
    peaks = []
    for i in range(400):
        try:
            log.append(TURN_STARTED if i % 2 == 0 else TURN_COMPLETED)
        except memstore.CapEvictionError:
            pass
        peaks.append(log.event_count)
    log.close()
    assert not failures
    recovered = max(i for i, count in enumerate(peaks) if count > 21)  # the last time over the cap
    assert recovered < 100, (
        f"the session went on past its cap until event {recovered}: {peaks[recovered - 5 : recovered + 1]}"
    )


# --------------------------------------------------------------------------------------------
# What recovery handles and goes on with is logged


def test_a_malformed_line_in_the_middle_is_skipped_with_a_warning_naming_it(tmp_path, caplog):
    with memstore.open_session(tmp_path, "s") as log:
        log.append(TURN_STARTED)
    events = session_dir(tmp_path) / "events.jsonl"
    bad_at = events.stat().st_size
    with open(events, "ab") as fh:
        fh.write(b'{"not": "an envelope"}\n')
    expected = [f"{events}: skipped 1 line that is not a valid event (the first at byte {bad_at})"]
    with caplog.at_level("WARNING", logger="memstore"):
        with memstore.open_session(tmp_path, "s") as log:  # the open that catches up sees it
            log.append(TURN_COMPLETED)
        assert [r.getMessage() for r in caplog.records if "not a valid event" in r.getMessage()] == expected
        caplog.clear()
        memstore.rebuild(tmp_path, "s", refresh=False)  # and so does every rebuild
        assert [r.getMessage() for r in caplog.records if "not a valid event" in r.getMessage()] == expected
    with memstore.read_session(tmp_path, "s") as reader:
        assert reader.event_count == 2  # kept in the log, left out of the views


def test_an_index_that_cannot_be_trusted_is_rebuilt_with_the_reason(tmp_path, caplog):
    with memstore.open_session(tmp_path, "s") as log:
        log.append(TURN_STARTED)
        log.append(TURN_COMPLETED)
    # Another log under the same index: the index's tail bytes are not in it.
    events = session_dir(tmp_path) / "events.jsonl"
    events.write_bytes(events.read_bytes().replace(b"turn.completed", b"turn.completeD"))
    with caplog.at_level("INFO", logger="memstore"):
        with memstore.open_session(tmp_path, "s") as log:
            assert log.event_count == 2
    messages = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert (
        f"rebuilding the index of {events} from its log: the index describes another log, or more of it than there is"
        in messages
    )


def test_a_manifest_with_implausible_counters_is_distrusted_with_a_warning(tmp_path, caplog):
    with memstore.open_session(tmp_path, "s") as log:
        log.append(TURN_STARTED)
    path = session_dir(tmp_path) / "manifest.json"
    manifest = json.loads(path.read_bytes())
    manifest["next_seq"] = 2**62
    path.write_text(json.dumps(manifest))
    with caplog.at_level("WARNING", logger="memstore"):
        with memstore.open_session(tmp_path, "s") as log:
            assert log.append(TURN_COMPLETED) == 2
    assert any("manifest.json is malformed or its counters are implausible" in r.getMessage() for r in caplog.records)
    assert json.loads(path.read_bytes())["next_seq"] == 3


def test_an_index_of_an_older_layout_is_rebuilt_without_a_warning(tmp_path, caplog):
    """An upgrade of memstore that adds a derived table outdates every index: routine, said at
    info level, not a warning per session."""
    import sqlite3

    with memstore.open_session(tmp_path, "s") as log:
        log.append(TURN_STARTED)
        log.append(TURN_COMPLETED)
    db = sqlite3.connect(session_dir(tmp_path) / "index" / "session.db")
    db.execute("DROP TABLE file_changes")
    db.execute("DELETE FROM _sqlite_migrations WHERE migration_set = 'memstore.file_changes'")
    db.commit()
    db.close()
    with caplog.at_level("INFO", logger="memstore"):
        with memstore.open_session(tmp_path, "s") as log:
            assert log.event_count == 2
    rebuilt = [r for r in caplog.records if "rebuilding the index" in r.getMessage()]
    assert [(r.levelname, r.getMessage().rsplit(": ", 1)[1]) for r in rebuilt] == [
        ("INFO", "its index is of an older memstore's layout")
    ]


def test_a_rebuild_keeps_the_source_of_a_session_whose_thread_started_the_cap_evicted(tmp_path):
    source = {"agent": "codex", "version": "0.63.0", "cwd": "/work/app"}
    with memstore.open_session(tmp_path, "s", max_events=10) as log:
        log.append({"type": "thread.started", "thread_id": "t", "source": source})
        for _ in range(10):
            log.append(TURN_STARTED)
            log.append(TURN_COMPLETED)
        first = next(iter(log.iter_records())).event["type"]
    assert first != "thread.started"  # evicted
    assert memstore.rebuild(tmp_path, "s", refresh=False).source == source
    with memstore.read_session(tmp_path, "s") as reader:
        assert reader.manifest.source == source
