"""Adversarial review of the modules that remove whole sessions or fill them from legacy stores
(retention, legacy migration, memory views): each test is a bug found by attacking one of their
promises, kept as a regression test."""

from __future__ import annotations

import pytest
from test_migration import ROUTE, WIDGET, events_of, jsonl, legacy_store

import memstore
from memstore import migration


def _interrupt_at_thread_completed(monkeypatch):
    """Make the first migration stop (disk full) when it completes a session it created."""
    append = migration.SessionLog.append

    def failing(self, event, ts=None):
        if event.get("type") == "thread.completed":
            raise memstore.StoreIOError("write", self.events_path, "No space left on device")
        return append(self, event, ts=ts)

    monkeypatch.setattr(migration.SessionLog, "append", failing)
    return lambda: monkeypatch.setattr(migration.SessionLog, "append", append)


def test_migrating_again_after_an_interrupted_migration_finishes_its_sessions(tmp_path, monkeypatch):
    # The import got every record into the log, then failed before the session's end and its
    # view. Migration is idempotent: running it again must give what one uninterrupted run
    # gives; it found the records imported and did nothing, leaving the session active and
    # its facts out of query_facts for good.
    records = [{**ROUTE, "turn": n, "ts": 1767225600 + n} for n in range(1, 4)]
    legacy_store(
        tmp_path / "once", envelopes={"s.memory.json": WIDGET}, trajectories={"trajectory-a.jsonl": jsonl(*records)}
    )
    memstore.migrate_legacy(tmp_path / "once")
    legacy_store(
        tmp_path / "vt", envelopes={"s.memory.json": WIDGET}, trajectories={"trajectory-a.jsonl": jsonl(*records)}
    )
    restore = _interrupt_at_thread_completed(monkeypatch)
    with pytest.raises(memstore.StoreIOError):
        memstore.migrate_legacy(tmp_path / "vt")
    restore()
    report = memstore.migrate_legacy(tmp_path / "vt")
    assert report.skipped == []
    for root in (tmp_path / "once", tmp_path / "vt"):
        assert {(s.session_id, s.status) for s in memstore.list_sessions(root)} == {
            ("s", "completed"),
            ("traj-a", "completed"),
        }
        assert [e["type"] for e in events_of(root, "s")] == ["thread.started", "memory.envelope", "thread.completed"]
        assert memstore.session_memory_facts(root, "s") == WIDGET["grounded_facts"]
        assert (root / "sessions" / "traj-a" / "derived" / "trajectory.jsonl").exists()
    # And then it is done: a third run changes nothing.
    before = (tmp_path / "vt" / "sessions" / "s" / "events.jsonl").read_bytes()
    third = memstore.migrate_legacy(tmp_path / "vt")
    assert (third.sessions_created, third.sessions_updated, third.records_imported) == (0, 0, 0)
    assert (tmp_path / "vt" / "sessions" / "s" / "events.jsonl").read_bytes() == before


def test_a_trajectory_migration_interrupted_midway_ends_completed_on_the_next_run(tmp_path, monkeypatch):
    records = [{**ROUTE, "turn": n, "ts": 1767225600 + n} for n in range(1, 6)]
    legacy_store(tmp_path, trajectories={"trajectory-a.jsonl": jsonl(*records)})
    append = migration.SessionLog.append
    seen = []

    def failing(self, event, ts=None):
        seen.append(event)
        if len(seen) == 4:  # thread.started and two records are in; the third fails
            raise memstore.StoreIOError("write", self.events_path, "No space left on device")
        return append(self, event, ts=ts)

    monkeypatch.setattr(migration.SessionLog, "append", failing)
    with pytest.raises(memstore.StoreIOError):
        memstore.migrate_legacy(tmp_path)
    monkeypatch.setattr(migration.SessionLog, "append", append)
    assert memstore.migrate_legacy(tmp_path).records_imported == 3
    assert [e["type"] for e in events_of(tmp_path, "traj-a")] == (
        ["thread.started"] + ["trajectory.record"] * 5 + ["thread.completed"]
    )
    assert memstore.list_sessions(tmp_path)[0].status == "completed"


def test_an_unlistable_legacy_directory_is_reported_and_the_rest_is_migrated(tmp_path, monkeypatch):
    # history/ that cannot be listed (another user's, mode 0700) is a source that cannot be read:
    # reported in `skipped`, like an unreadable file. It aborted the whole migration instead
    # (StoreIOError, the store's own failure), logs/ included.
    legacy_store(tmp_path, envelopes={"s.memory.json": WIDGET}, trajectories={"trajectory-a.jsonl": jsonl(ROUTE)})
    scandir = migration.os.scandir

    def refusing(path):
        if str(path) == str(tmp_path / "history"):
            raise PermissionError(13, "Permission denied", str(path))
        return scandir(path)

    monkeypatch.setattr(migration.os, "scandir", refusing)
    report = memstore.migrate_legacy(tmp_path, remove_legacy=True)
    assert [(s.path, s.reason) for s in report.skipped] == [("history", "cannot be listed: Permission denied")]
    assert report.trajectory_imported == 1 and report.memory_imported == 0
    assert ("history", "cannot be listed: Permission denied") in [(k.path, k.reason) for k in report.legacy.kept]
    assert (tmp_path / "history" / "s.memory.json").exists()


# ---------------------------------------------------------------------------------------------
# Memory views


def test_query_facts_does_not_read_through_a_symlinked_derived_directory(tmp_path):
    # memory_facts_of and session_memory_facts refuse a derived/ that is a symlink (it points
    # out of the store); query_facts read the file it points to.
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "memory.json").write_bytes(b'{"grounded_facts": [{"fact": "not this session\'s", "source": "x"}]}')
    with memstore.open_session(tmp_path / "store", "s") as log:
        log.append({"type": "thread.started", "thread_id": "s"})
    directory = memstore.session_directory(tmp_path / "store", "s")
    (directory / "derived").rmdir()
    (directory / "derived").symlink_to(outside)
    assert memstore.session_memory_facts(tmp_path / "store", "s") == []
    assert memstore.query_facts(tmp_path / "store") == []


# ---------------------------------------------------------------------------------------------
# Retention: empty shells


def test_a_session_holding_a_progress_ledger_is_not_an_empty_shell(tmp_path):
    # derived/progress.json is the session's progress ledger (goal, milestones, handoff from
    # the previous session): state no log holds, like migrated data. A session that saved one
    # but closed no turn (a handoff not yet worked on) lost it as an "empty shell".
    def shell(sid):
        with memstore.open_session(tmp_path, sid) as log:
            log.append({"type": "thread.started", "thread_id": sid})
            log.append(
                {
                    "type": "thread.completed",
                    "thread_id": sid,
                    "session_id": sid,
                    "subtype": "success",
                    "outcome_code": "exit",
                    "usage": {},
                    "num_turns": 0,
                }
            )

    shell("handoff")
    ledger = memstore.ProgressLedger.new("handoff", "ship the importer")
    ledger.previous_session_id, ledger.handoff_summary = "earlier", "tests pass; docs left"
    memstore.save_progress(tmp_path, "handoff", ledger)
    shell("empty")
    assert memstore.evict_zero_turn_completed_store(tmp_path, "handoff") is False
    report = memstore.apply_retention(tmp_path, apply=True)
    assert [(r.session_id, r.reason) for r in report.removed] == [("empty", "empty_shell")]
    assert memstore.load_progress(tmp_path, "handoff").handoff_summary == "tests pass; docs left"
