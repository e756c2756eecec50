"""Retention: the reference scenarios (vtcode-memory 4.1) with their assertions, memstore's fixes
(ages from parsed event times, imported content is not an empty shell, the gc-log), hostile
input, and races with live writers in other processes."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import textwrap
import time

import orjson
import pytest
from click.testing import CliRunner

import memstore
from memstore import retention
from memstore.cli import cli
from memstore.retention import RetentionPolicy

OLD = "2020-01-01T00:00:00Z"


def thread_started(sid):
    return {"type": "thread.started", "thread_id": sid}


def thread_completed(sid, num_turns=1, subtype="success", outcome="completed"):
    return {
        "type": "thread.completed",
        "thread_id": sid,
        "session_id": sid,
        "subtype": subtype,
        "outcome_code": outcome,
        "usage": {},
        "num_turns": num_turns,
    }


TURN = [{"type": "turn.started"}, {"type": "turn.completed", "usage": {"input_tokens": 1}}]


def sample_session(root, sid, *, ts=None, complete=True, turns=1):
    """The reference's "sample turn": thread.started, turn.started, turn.completed,
    thread.completed (success, num_turns 1); ``complete=False`` leaves it active."""
    with memstore.open_session(root, sid) as log:
        log.append(thread_started(sid), ts=ts)
        for _ in range(turns):
            for event in TURN:
                log.append(event, ts=ts)
        if complete:
            log.append(thread_completed(sid, turns), ts=ts)
        return log.directory


def empty_shell(root, sid, *, ts=None):
    """The reference's "empty shell": thread.started, thread.completed (cancelled, exit, 0 turns)."""
    with memstore.open_session(root, sid) as log:
        log.append(thread_started(sid), ts=ts)
        log.append(thread_completed(sid, 0, "cancelled", "exit"), ts=ts)
        return log.directory


def manifest_of(directory):
    return orjson.loads((directory / "manifest.json").read_bytes())


def rewrite_manifest(directory, **changes):
    data = manifest_of(directory)
    data.update(changes)
    (directory / "manifest.json").write_text(json.dumps(data))  # json: orjson refuses integers over 64 bits


def gc_log(root):
    path = root / "gc-log.jsonl"
    return [orjson.loads(line) for line in path.read_bytes().splitlines()] if path.exists() else []


# --------------------------------------------------------------------------------------------
# The reference scenarios


def test_retention_evicts_zero_turn_completed_stores_immediately(tmp_path):
    shell = empty_shell(tmp_path, "shell")
    worked = sample_session(tmp_path, "worked")
    report = memstore.apply_retention(tmp_path, RetentionPolicy(50, 30), apply=True)
    assert report.count == 1
    assert [(r.directory, r.reason) for r in report.removed] == [("shell", "empty_shell")]
    assert not shell.exists() and worked.is_dir()


def test_evict_zero_turn_completed_store_is_a_noop_for_real_sessions(tmp_path):
    worked = sample_session(tmp_path, "worked")
    assert memstore.evict_zero_turn_completed_store(tmp_path, "worked") is False
    assert worked.is_dir()
    shell = empty_shell(tmp_path, "shell")
    assert memstore.evict_zero_turn_completed_store(tmp_path, "shell") is True
    assert not shell.exists()
    assert [(e["directory"], e["reason"]) for e in gc_log(tmp_path)] == [("sessions/shell", "empty_shell")]
    assert memstore.evict_zero_turn_completed_store(tmp_path, "never-was") is False


def test_evict_zero_turn_completed_store_skips_live_and_pinned(tmp_path):
    log = memstore.open_session(tmp_path, "live")
    log.append(thread_started("live"))
    log.append(thread_completed("live", 0, "cancelled", "exit"))
    log.flush()
    assert memstore.evict_zero_turn_completed_store(tmp_path, "live") is False
    log.close()
    pinned = empty_shell(tmp_path, "pinned")
    memstore.pin_session_retention(pinned, "keep it")
    assert memstore.evict_zero_turn_completed_store(tmp_path, "pinned") is False
    assert pinned.is_dir() and (tmp_path / "sessions" / "live").is_dir()
    assert memstore.evict_zero_turn_completed_store(tmp_path, "live") is True


def test_retention_removes_oldest_sessions(tmp_path):
    for n in range(3):
        sample_session(tmp_path, f"old-{n}", ts=f"2020-01-0{n + 1}T00:00:00Z")
    for n in range(2):
        sample_session(tmp_path, f"new-{n}")
    report = memstore.apply_retention(tmp_path, RetentionPolicy(4, 30), apply=True)
    assert report.count == 3
    assert [(r.directory, r.reason) for r in report.removed] == [
        ("old-0", "count_cap"),
        ("old-1", "age_cap"),
        ("old-2", "age_cap"),
    ]
    assert sorted(p.name for p in (tmp_path / "sessions").iterdir()) == ["new-0", "new-1"]


def test_retention_pinned_session_ids_lists_only_real_pinned_dirs(tmp_path):
    assert memstore.retention_pinned_session_ids(tmp_path / "missing") == []
    pinned = sample_session(tmp_path, "sess-pinned")
    sample_session(tmp_path, "sess-plain")
    memstore.pin_session_retention(pinned, "audit")
    (tmp_path / "sessions" / "sess-link").symlink_to(pinned)
    assert memstore.retention_pinned_session_ids(tmp_path) == ["sess-pinned"]
    assert memstore.session_retention_pinned(pinned)
    pin = orjson.loads((pinned / "retention-pin.json").read_bytes())
    assert list(pin) == ["pinned_at", "reason"] and pin["reason"] == "audit"
    assert stat.S_IMODE((pinned / "retention-pin.json").stat().st_mode) == 0o600


def test_retention_evicts_old_sessions_even_when_under_count_cap(tmp_path):
    sample_session(tmp_path, "a")
    sample_session(tmp_path, "b")
    old = sample_session(tmp_path, "old", ts=OLD)
    report = memstore.apply_retention(tmp_path, RetentionPolicy(10, 30), apply=True)
    assert report.count == 1 and report.removed[0].reason == "age_cap" and not old.exists()


def test_retention_preserves_active_sessions(tmp_path):
    directory = sample_session(tmp_path, "active", ts=OLD, complete=False)
    assert manifest_of(directory)["status"] == "active"
    report = memstore.apply_retention(tmp_path, RetentionPolicy(0, 0), apply=True)
    assert report.count == 0 and directory.is_dir()
    assert ("active", "active") in [(s.directory, s.reason) for s in report.skipped]


def test_retention_preserves_recent_active_sessions_under_age_window(tmp_path):
    directory = sample_session(tmp_path, "active", complete=False)
    assert memstore.apply_retention(tmp_path, RetentionPolicy(50, 30), apply=True).count == 0
    assert directory.is_dir() and manifest_of(directory)["status"] == "active"


def test_mark_abandoned_skips_preserved_session(tmp_path):
    preserved = sample_session(tmp_path, "preserved-session", ts=OLD, complete=False)
    other = sample_session(tmp_path, "other-session", ts=OLD, complete=False)
    assert memstore.mark_abandoned_active_sessions(tmp_path, 30, "preserved-session") == 1
    assert manifest_of(preserved)["status"] == "active"
    marked = manifest_of(other)
    assert marked["status"] == "completed"
    assert marked["updated_at"] == "2020-01-01T00:00:00.000Z"  # kept, so the age cap removes it at once
    assert stat.S_IMODE((other / "manifest.json").stat().st_mode) == 0o600
    assert memstore.mark_abandoned_active_sessions(tmp_path, 0) == 0  # 0 disables the sweep


def test_mark_abandoned_skips_symlink_session_entries(tmp_path):
    outside = sample_session(tmp_path / "elsewhere", "outside", ts=OLD, complete=False)
    before = (outside / "manifest.json").read_bytes()
    (tmp_path / "sessions").mkdir()
    (tmp_path / "sessions" / "linked").symlink_to(outside)
    assert memstore.mark_abandoned_active_sessions(tmp_path, 30) == 0
    assert (outside / "manifest.json").read_bytes() == before


def test_retention_evicts_abandoned_active_sessions_past_age_window(tmp_path):
    log = memstore.open_session(tmp_path, "abandoned")
    log.append(thread_started("abandoned"), ts=OLD)
    log.append({"type": "turn.started"}, ts=OLD)
    log.flush()
    directory = log.directory
    del log  # dropped, not closed: the agent went away mid-turn
    deadline = time.monotonic() + 10
    while memstore.is_live(directory) and time.monotonic() < deadline:
        time.sleep(0.01)
    report = memstore.apply_retention(tmp_path, RetentionPolicy(50, 30), apply=True)
    assert report.count >= 1 and report.marked_abandoned == ["abandoned"]
    assert report.removed[0].reason == "age_cap" and not directory.exists()


def test_retention_preserves_explicit_current_session(tmp_path):
    current = sample_session(tmp_path, "current-session", ts=OLD)
    other = sample_session(tmp_path, "other", ts=OLD)
    report = memstore.apply_retention_preserving(tmp_path, RetentionPolicy(0, 0), "current-session", apply=True)
    assert report.count == 1 and current.is_dir() and not other.exists()
    with pytest.raises(memstore.InvalidSessionId):
        memstore.apply_retention_preserving(tmp_path, RetentionPolicy(), "", apply=True)


def test_retention_ignores_manifest_session_id_for_deletion_path(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("keep")
    root = tmp_path / "store"
    directory = sample_session(root, "real", ts=OLD)
    rewrite_manifest(directory, session_id="../outside")
    report = memstore.apply_retention(root, RetentionPolicy(50, 30), apply=True)
    assert report.count == 1 and not directory.exists()
    assert (outside / "keep.txt").read_text() == "keep"
    # A hostile id is not believed in the report or the gc-log either.
    assert report.removed[0].session_id == "real" and gc_log(root)[0]["session_id"] == "real"


def test_retention_skips_symlink_session_entries(tmp_path):
    target = sample_session(tmp_path, "target", ts=OLD)
    link = tmp_path / "sessions" / "link"
    link.symlink_to(target)
    report = memstore.apply_retention(tmp_path, RetentionPolicy(50, 30), apply=True)
    assert [r.directory for r in report.removed] == ["target"] and not target.exists()
    assert link.is_symlink()  # left as it is: not followed, not deleted
    assert ("link", "a symlink; retention never follows or removes one") in [
        (s.directory, s.reason) for s in report.skipped
    ]


def test_retention_skips_symlink_sessions_root(tmp_path):
    real_root = tmp_path / "real"
    directory = sample_session(real_root, "s", ts=OLD)
    root = tmp_path / "store"
    root.mkdir()
    (root / "sessions").symlink_to(real_root / "sessions")
    report = memstore.apply_retention(root, RetentionPolicy(0, 0), apply=True)
    assert report.count == 0 and directory.is_dir()
    assert report.skipped[0].directory == "sessions" and "symlink" in report.skipped[0].reason
    assert memstore.mark_abandoned_active_sessions(root, 30) == 0
    assert memstore.evict_zero_turn_completed_store(root, "s") is False


def test_retention_skips_pinned_sessions_and_evicts_when_unpinned(tmp_path):
    directory = sample_session(tmp_path, "old", ts=OLD)
    memstore.pin_session_retention(directory, "keep")
    report = memstore.apply_retention(tmp_path, RetentionPolicy(1, 365), apply=True)
    assert report.count == 0 and report.skipped[0].reason == "pinned: keep"
    assert memstore.unpin_session_retention(directory) is True
    assert memstore.unpin_session_retention(directory) is False
    report = memstore.apply_retention(tmp_path, RetentionPolicy(1, 365), apply=True)
    assert report.count == 1 and report.removed[0].reason == "age_cap" and not directory.exists()


def test_retention_never_marks_a_live_open_session_abandoned(tmp_path):
    log = memstore.open_session(tmp_path, "live")
    log.append(thread_started("live"), ts=OLD)
    log.flush()
    assert memstore.mark_abandoned_active_sessions(tmp_path, 30) == 0
    log.close()
    assert memstore.mark_abandoned_active_sessions(tmp_path, 30) == 1
    assert manifest_of(log.directory)["status"] == "completed"


def test_retention_eviction_skips_live_sessions_even_when_completed(tmp_path):
    log = memstore.open_session(tmp_path, "live")
    for event in [thread_started("live"), *TURN, thread_completed("live")]:
        log.append(event, ts=OLD)
    log.flush()
    report = memstore.apply_retention(tmp_path, RetentionPolicy(1, 30), apply=True)
    assert report.count == 0 and report.skipped[0].reason.startswith("live")
    log.close()
    assert memstore.apply_retention(tmp_path, RetentionPolicy(1, 30), apply=True).count == 1


# --------------------------------------------------------------------------------------------
# memstore's fixes


def test_age_comes_from_the_last_event_time_never_from_file_mtimes(tmp_path):
    old = sample_session(tmp_path, "old-by-events", ts=OLD)
    recent = sample_session(tmp_path, "recent-by-events")
    long_ago = time.time() - 5 * 365 * 86400
    for directory in (recent,):
        for path in [directory, *directory.rglob("*")]:
            os.utime(path, (long_ago, long_ago), follow_symlinks=False)
    report = memstore.apply_retention(tmp_path, RetentionPolicy(50, 30), apply=True)
    assert [r.directory for r in report.removed] == ["old-by-events"]
    assert not old.exists() and recent.is_dir()


def test_the_count_cap_sorts_by_parsed_time_not_by_string(tmp_path):
    early = sample_session(tmp_path, "a-early")
    late = sample_session(tmp_path, "b-late")
    # As strings "…T10:00:00+05:00" sorts after "…T06:00:00Z"; as times it is an hour earlier.
    rewrite_manifest(early, updated_at="2030-01-01T10:00:00+05:00")
    rewrite_manifest(late, updated_at="2030-01-01T06:00:00Z")
    report = memstore.apply_retention(tmp_path, RetentionPolicy(1, 30), dry_run=True)
    assert [(r.directory, r.reason) for r in report.removed] == [("a-early", "count_cap")]


def test_an_unparseable_time_is_never_aged_out_and_sorts_newest(tmp_path):
    odd = sample_session(tmp_path, "odd", ts=OLD)
    rewrite_manifest(odd, updated_at="last tuesday")
    old = sample_session(tmp_path, "old", ts=OLD)
    report = memstore.apply_retention(tmp_path, RetentionPolicy(1, 30), apply=True)
    assert [(r.directory, r.reason) for r in report.removed] == [("old", "count_cap")]
    assert (
        not old.exists()
        and odd.is_dir()
        and memstore.apply_retention(tmp_path, RetentionPolicy(50, 0), apply=True).count == 0
    )


def test_a_log_ahead_of_its_manifest_is_judged_by_the_log(tmp_path):
    directory = sample_session(tmp_path, "crashed", ts=OLD, complete=False)
    manifest_before = (directory / "manifest.json").read_bytes()
    # A writer appended (and was killed) after the manifest was last published.
    line = (
        orjson.dumps(
            {"schema_version": "0.18.0", "seq": 99, "ts": memstore.events.utc_now(), "event": {"type": "note"}}
        )
        + b"\n"
    )
    with open(directory / "events.jsonl", "ab") as fh:
        fh.write(line)
    report = memstore.apply_retention(tmp_path, RetentionPolicy(50, 30), apply=True)
    assert report.count == 0 and report.marked_abandoned == [] and directory.is_dir()
    assert (directory / "manifest.json").read_bytes() == manifest_before


def test_imported_content_is_not_an_empty_shell(tmp_path):
    with memstore.open_session(tmp_path, "imported") as log:
        log.append(thread_started("imported"))
        log.append({"type": "memory.envelope", "envelope": {"summary": "s", "grounded_facts": [], "touched_files": []}})
        log.append(thread_completed("imported", 0))
    # A VT Code store its own migration wrote: a manifest and derived/memory.json, no log.
    vtcode = tmp_path / "sessions" / "session-foo.memory"
    (vtcode / "derived").mkdir(parents=True)
    (vtcode / "manifest.json").write_bytes(
        orjson.dumps(
            {
                "session_id": "session-foo.memory",
                "schema_version": 1,
                "created_at": OLD,
                "updated_at": memstore.events.utc_now(),
                "turn_count": 0,
                "event_count": 0,
                "status": "completed",
            }
        )
    )
    (vtcode / "derived" / "memory.json").write_bytes(
        b'{"summary":"x","grounded_facts":[{"fact":"f"}],"touched_files":[]}'
    )
    bare = tmp_path / "sessions" / "bare"
    bare.mkdir()
    (bare / "manifest.json").write_bytes((vtcode / "manifest.json").read_bytes())
    # A true shell whose memory view memstore regenerated from its (empty) log is still a shell.
    shell = empty_shell(tmp_path, "shell")
    memstore.write_session_memory_view(tmp_path, "shell")
    report = memstore.apply_retention(tmp_path, RetentionPolicy(50, 30), apply=True)
    assert sorted((r.directory, r.reason) for r in report.removed) == [
        ("bare", "empty_shell"),
        ("shell", "empty_shell"),
    ]
    assert vtcode.is_dir() and (tmp_path / "sessions" / "imported").is_dir() and not shell.exists()


def test_every_removal_is_recorded_in_the_gc_log(tmp_path):
    empty_shell(tmp_path, "shell")
    sample_session(tmp_path, "old", ts=OLD)
    for n in range(3):
        sample_session(tmp_path, f"keep-{n}")
    report = memstore.apply_retention(tmp_path, RetentionPolicy(2, 30), apply=True)
    entries = gc_log(tmp_path)
    assert [(e["directory"], e["reason"]) for e in entries] == [
        ("sessions/shell", "empty_shell"),
        ("sessions/old", "count_cap"),
        ("sessions/keep-0", "count_cap"),
    ]
    assert len(entries) == report.count == 3
    for entry, removed in zip(entries, report.removed, strict=True):
        assert list(entry) == ["session_id", "directory", "removed_at", "reason", "bytes", "updated_at", "removal_id"]
        assert entry["bytes"] == removed.bytes > 0 and entry["updated_at"] == removed.updated_at
        assert memstore.events.parse_ts(entry["removed_at"]) is not None
    assert stat.S_IMODE((tmp_path / "gc-log.jsonl").stat().st_mode) == 0o600
    assert not any((tmp_path / ".trash").iterdir())


def test_a_gc_log_that_cannot_be_written_removes_nothing(tmp_path):
    directory = sample_session(tmp_path, "old", ts=OLD)
    (tmp_path / "elsewhere.jsonl").write_bytes(b"")
    (tmp_path / "gc-log.jsonl").symlink_to(tmp_path / "elsewhere.jsonl")
    with pytest.raises(memstore.StoreIOError, match="gc-log.jsonl"):
        memstore.apply_retention(tmp_path, RetentionPolicy(50, 30), apply=True)
    assert directory.is_dir() and (tmp_path / "elsewhere.jsonl").read_bytes() == b""


def test_a_dry_run_changes_nothing(tmp_path):
    shell = empty_shell(tmp_path, "shell")
    abandoned = sample_session(tmp_path, "abandoned", ts=OLD, complete=False)
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    report = memstore.apply_retention(tmp_path, RetentionPolicy(50, 30), dry_run=True)
    assert report.dry_run and report.marked_abandoned == ["abandoned"]
    assert sorted((r.directory, r.reason) for r in report.removed) == [
        ("abandoned", "age_cap"),
        ("shell", "empty_shell"),
    ]
    after = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    assert after == before and shell.is_dir() and abandoned.is_dir()
    assert not (tmp_path / "gc-log.jsonl").exists() and not (tmp_path / "locks").exists()


def test_a_marked_session_stays_completed_across_reopen_and_rebuild(tmp_path):
    directory = sample_session(tmp_path, "idle", ts=OLD, complete=False)
    assert memstore.mark_abandoned_active_sessions(tmp_path, 30) == 1
    with memstore.open_session(tmp_path, "idle") as log:
        assert log.manifest.status == "completed"
    assert memstore.rebuild(tmp_path, "idle").status == "completed"
    assert manifest_of(directory)["status"] == "completed"


def test_removed_sessions_are_gone_from_listings_and_the_trash_is_empty(tmp_path):
    sample_session(tmp_path, "old", ts=OLD)
    sample_session(tmp_path, "new")
    assert [s.session_id for s in memstore.list_sessions(tmp_path)] == ["new", "old"]
    memstore.apply_retention(tmp_path, RetentionPolicy(50, 30), apply=True)
    assert [s.session_id for s in memstore.list_sessions(tmp_path)] == ["new"]
    assert [s.session_id for s in memstore.recent_sessions(tmp_path, 10)] == ["new"]
    assert sorted(os.listdir(tmp_path / "sessions")) == ["new"] and not any((tmp_path / ".trash").iterdir())


def test_retention_policy_validates_its_fields():
    assert RetentionPolicy() == RetentionPolicy(50, 30)
    for bad in ({"max_sessions": -1}, {"max_age_days": -1}, {"max_sessions": 1.5}, {"max_age_days": True}):
        with pytest.raises(ValueError):
            RetentionPolicy(**bad)


# --------------------------------------------------------------------------------------------
# Bad input: a clear answer, no crash, nothing outside the root touched


@pytest.mark.parametrize(
    "changes, expected",
    [
        ({"turn_count": "3"}, "manifest"),
        ({"status": 5}, "manifest"),
        ({"updated_at": None}, "manifest"),
        ({"turn_count": 10**30}, "manifest"),
        ({"event_count": -1}, "manifest"),
    ],
)
def test_hostile_manifests_without_a_log_are_skipped_with_a_reason(tmp_path, changes, expected):
    directory = tmp_path / "sessions" / "hostile"
    directory.mkdir(parents=True)
    data = {
        "session_id": "../../outside",
        "schema_version": 1,
        "created_at": OLD,
        "updated_at": OLD,
        "turn_count": 0,
        "event_count": 0,
        "status": "completed",
        **changes,
    }
    (directory / "manifest.json").write_text(json.dumps(data))  # json: orjson refuses 10**30
    report = memstore.apply_retention(tmp_path, RetentionPolicy(0, 0), apply=True)
    assert report.count == 0 and directory.is_dir()
    assert expected in report.skipped[0].reason


def test_a_hostile_manifest_with_a_log_is_judged_by_the_log(tmp_path):
    directory = sample_session(tmp_path, "s")
    (directory / "manifest.json").write_bytes(b'{"session_id": "../x", "turn_count": 1e400, "status": [], ')
    report = memstore.apply_retention(tmp_path, RetentionPolicy(50, 30), apply=True)
    assert report.count == 0 and directory.is_dir() and report.skipped == []
    huge = sample_session(tmp_path, "huge", ts=OLD)
    rewrite_manifest(huge, turn_count=2**80, updated_at="9999-12-31T23:59:59Z", persisted_file_len=2**70)
    report = memstore.apply_retention(tmp_path, RetentionPolicy(50, 30), apply=True)
    assert [r.directory for r in report.removed] == ["huge"]  # the log says 2020


def test_odd_entries_in_the_sessions_directory_are_reported_not_touched(tmp_path):
    sessions = tmp_path / "sessions"
    sessions.mkdir()
    (sessions / "a-file").write_text("x")
    (sessions / ".hidden").mkdir()
    (sessions / "no-manifest").mkdir()
    (sessions / "manifest-link").mkdir()
    (tmp_path / "secret.json").write_bytes(b"{}")
    (sessions / "manifest-link" / "manifest.json").symlink_to(tmp_path / "secret.json")
    (sessions / "events-link").mkdir()
    (sessions / "events-link" / "events.jsonl").symlink_to(tmp_path / "secret.json")
    os.mkfifo(sessions / "fifo")
    report = memstore.apply_retention(tmp_path, RetentionPolicy(0, 0), apply=True)
    reasons = {s.directory: s.reason for s in report.skipped}
    assert report.count == 0
    assert reasons == {
        ".hidden": "not a session directory (its name starts with a dot)",
        "a-file": "not a directory",
        "events-link": "events.jsonl is a symlink or not a regular file",
        "fifo": "not a directory",
        "manifest-link": "manifest.json cannot be read (refusing to follow a symlink)",
        "no-manifest": "not a session: no manifest.json and no events.jsonl",
    }
    assert sorted(os.listdir(sessions)) == sorted(reasons) and (tmp_path / "secret.json").read_bytes() == b"{}"


def test_a_pin_file_that_is_a_directory_still_pins(tmp_path):
    directory = sample_session(tmp_path, "s", ts=OLD)
    (directory / "retention-pin.json").mkdir()
    report = memstore.apply_retention(tmp_path, RetentionPolicy(0, 0), apply=True)
    assert report.count == 0 and "is a directory" in report.skipped[0].reason
    assert memstore.session_retention_pinned(directory)
    with pytest.raises(memstore.UnsafePathError, match="retention-pin.json"):
        memstore.unpin_session_retention(directory)
    with pytest.raises(memstore.UnsafePathError, match="retention-pin.json"):
        memstore.pin_session_retention(directory, "again")
    assert (directory / "retention-pin.json").is_dir()


def test_pins_refuse_symlinked_or_missing_session_directories(tmp_path):
    target = sample_session(tmp_path, "target")
    link = tmp_path / "sessions" / "link"
    link.symlink_to(target)
    with pytest.raises(memstore.UnsafePathError):
        memstore.pin_session_retention(link, "x")
    with pytest.raises(memstore.UnsafePathError):
        memstore.unpin_session_retention(link)
    with pytest.raises(memstore.SessionNotFound):
        memstore.pin_session_retention(tmp_path / "sessions" / "missing", "x")
    assert not (target / "retention-pin.json").exists()


def test_a_missing_store_is_an_empty_answer_and_creates_nothing(tmp_path):
    root = tmp_path / "nothing"
    assert memstore.apply_retention(root, apply=True).count == 0
    assert memstore.mark_abandoned_active_sessions(root, 30) == 0
    assert memstore.evict_zero_turn_completed_store(root, "s") is False
    assert not root.exists()


def test_a_trash_symlink_is_not_emptied_through(tmp_path):
    outside = tmp_path / "outside"
    (outside / "precious").mkdir(parents=True)
    (outside / "precious" / "data.txt").write_text("keep")
    root = tmp_path / "store"
    directory = sample_session(root, "old", ts=OLD)
    (root / ".trash").symlink_to(outside)
    report = memstore.apply_retention(root, RetentionPolicy(50, 30), apply=True)
    assert report.count == 0 and directory.is_dir()
    assert (
        report.skipped[0].reason.startswith("could not be removed")
        and ".trash: is a symlink" in report.skipped[0].reason
    )
    assert (outside / "precious" / "data.txt").read_text() == "keep"


def test_marking_refuses_a_session_directory_swapped_for_a_symlink(tmp_path):
    outside = sample_session(tmp_path / "elsewhere", "s", ts=OLD, complete=False)
    before = (outside / "manifest.json").read_bytes()
    root = tmp_path / "store"
    sample_session(root, "s", ts=OLD, complete=False)
    seen = retention._inspect(str(root / "sessions" / "s"))
    shutil.rmtree(root / "sessions" / "s")
    (root / "sessions" / "s").symlink_to(outside)  # swapped after the survey looked
    assert (
        retention._mark_abandoned(str(root / "sessions" / "s"), seen, int(time.time())) == "no longer a real directory"
    )
    assert (outside / "manifest.json").read_bytes() == before


# --------------------------------------------------------------------------------------------
# Races with writers


WRITER = textwrap.dedent("""
    import os, sys, time
    import memstore
    root, sid, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
    done = 0
    while done < rounds:
        try:
            log = memstore.open_session(root, sid)
        except memstore.SessionBusyError:
            continue  # retention holds the lock for an instant while removing: open again
        with log:
            log.append({"type": "thread.started", "thread_id": sid}, ts="2020-01-01T00:00:00Z")
            for _ in range(3):
                log.append({"type": "turn.started"}, ts="2020-01-01T00:00:00Z")
                log.append({"type": "turn.completed", "usage": {}}, ts="2020-01-01T00:00:00Z")
                # While this process holds the session, its directory and log must be there.
                path = os.path.join(str(log.directory), "events.jsonl")
                if not os.path.exists(path) or os.path.getsize(path) == 0:
                    print("LOST", done, flush=True)
                    sys.exit(3)
            log.append({"type": "thread.completed", "thread_id": sid, "session_id": sid, "subtype": "success",
                        "outcome_code": "completed", "usage": {}, "num_turns": 3}, ts="2020-01-01T00:00:00Z")
        done += 1
        time.sleep(0.002 * (done % 5))  # closed for a moment: retention may remove it now
    print("OK", flush=True)
""")


@pytest.mark.parametrize("policy", [RetentionPolicy(0, 0), RetentionPolicy(0, 30)], ids=["no-sweep", "sweep"])
def test_retention_racing_a_live_writer_never_removes_the_live_session(tmp_path, policy):
    """A writer in another process opens, fills (aged 2020), and closes the same session over and
    over, while this process applies the harshest policy in a loop (with the abandoned sweep, the
    open session is an old active one: it must not be marked either). The writer checks, while it
    holds the session, that its directory is still there; closed rounds are fair game."""
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(tmp_path), "raced", "40"], stdout=subprocess.PIPE, text=True, cwd=os.getcwd()
    )
    removed = runs = 0
    try:
        while writer.poll() is None:
            report = memstore.apply_retention(tmp_path, policy, apply=True)
            removed += report.count
            runs += 1
        out = writer.stdout.read()
    finally:
        writer.kill()
        writer.wait()
    assert writer.returncode == 0 and out.strip() == "OK", out
    assert runs > 10 and removed > 0
    assert removed == len(gc_log(tmp_path))


HOLDER = textwrap.dedent("""
    import sys, memstore
    log = memstore.open_session(sys.argv[1], "s")
    print("open", flush=True)
    sys.stdin.readline()
    log.close()
""")


@pytest.mark.parametrize("moment", ["after_planning", "just_before_removal"])
def test_a_session_opened_between_the_check_and_the_removal_is_kept(tmp_path, monkeypatch, moment):
    """The sweep judges the session removable; then a writer in another process opens it. After
    planning, the open itself changes what the session was judged by; just before the removal,
    ``remove_session_directory`` finds the session's lock held. Either way it stays."""
    directory = sample_session(tmp_path, "s", ts=OLD)
    holder = {}

    def open_elsewhere():
        holder["p"] = subprocess.Popen(
            [sys.executable, "-c", HOLDER, str(tmp_path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert holder["p"].stdout.readline().strip() == "open"

    if moment == "after_planning":
        plan = retention._plan_removals

        def patched(*args, **kwargs):
            found = plan(*args, **kwargs)
            open_elsewhere()
            return found

        monkeypatch.setattr(retention, "_plan_removals", patched)
        expected = {
            "changed while retention ran; left for the next run",
            "live: opened by a writer while retention ran",
        }
    else:
        remove = retention.remove_session_directory

        def patched(*args, **kwargs):
            open_elsewhere()
            return remove(*args, **kwargs)

        monkeypatch.setattr(retention, "remove_session_directory", patched)
        expected = {"live: opened by a writer while retention ran"}
    try:
        report = memstore.apply_retention(tmp_path, RetentionPolicy(0, 0), apply=True)
    finally:
        holder["p"].stdin.write("\n")
        holder["p"].stdin.close()
        holder["p"].wait(timeout=30)
    assert report.count == 0 and directory.is_dir() and (directory / "events.jsonl").stat().st_size > 0
    assert [s.directory for s in report.skipped] == ["s"] and report.skipped[0].reason in expected
    assert gc_log(tmp_path) == []


def test_a_session_that_changed_since_it_was_judged_is_left_for_the_next_run(tmp_path, monkeypatch):
    directory = empty_shell(tmp_path, "shell")
    plan = retention._plan_removals

    def plan_then_write(*args, **kwargs):
        found = plan(*args, **kwargs)
        with memstore.open_session(tmp_path, "shell") as log:  # the shell got work meanwhile
            log.append({"type": "turn.started"})
            log.append({"type": "turn.completed", "usage": {}})
        return found

    monkeypatch.setattr(retention, "_plan_removals", plan_then_write)
    report = memstore.apply_retention(tmp_path, RetentionPolicy(50, 30), apply=True)
    assert report.count == 0 and directory.is_dir()
    assert report.skipped == [retention.SkippedSession("shell", "changed while retention ran; left for the next run")]


# --------------------------------------------------------------------------------------------
# The command line


def test_cli_retention_is_a_dry_run_unless_applied(tmp_path):
    directory = sample_session(tmp_path, "old", ts=OLD)
    runner = CliRunner()
    result = runner.invoke(cli, ["retention", "--root", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "would remove 1 session" in result.output and "old" in result.output and "--apply" in result.output
    assert directory.is_dir()
    result = runner.invoke(cli, ["retention", "--root", str(tmp_path), "--apply", "--json"])
    assert result.exit_code == 0
    data = orjson.loads(result.output)
    assert data["count"] == 1 and data["removed"][0]["reason"] == "age_cap" and not directory.exists()


def test_cli_retention_preserve_and_mistakes(tmp_path):
    sample_session(tmp_path, "keep", ts=OLD)
    sample_session(tmp_path, "drop", ts=OLD)
    runner = CliRunner()
    result = runner.invoke(
        cli,
        [
            "retention",
            "--root",
            str(tmp_path),
            "--preserve",
            "keep",
            "--max-sessions",
            "0",
            "--max-age-days",
            "0",
            "--apply",
        ],
    )
    assert result.exit_code == 0 and "removed 1 session" in result.output
    assert os.listdir(tmp_path / "sessions") == ["keep"]
    assert runner.invoke(cli, ["retention", "--root", str(tmp_path), "--max-sessions", "-1"]).exit_code == 2
    result = runner.invoke(cli, ["retention", "--root", str(tmp_path), "--preserve", ".."])
    assert result.exit_code == 2 and "not a session id" in result.output


def test_cli_pin_and_unpin(tmp_path):
    directory = sample_session(tmp_path, "s", ts=OLD)
    runner = CliRunner()
    result = runner.invoke(cli, ["pin", "s", "--reason", "audit", "--root", str(tmp_path)])
    assert result.exit_code == 0 and "pinned 's'" in result.output
    assert orjson.loads((directory / "retention-pin.json").read_bytes())["reason"] == "audit"
    result = runner.invoke(cli, ["retention", "--root", str(tmp_path), "--apply"])
    assert "removed 0 sessions" in result.output and "pinned: audit" in result.output
    assert runner.invoke(cli, ["unpin", "s", "--root", str(tmp_path)]).output.strip() == "unpinned 's'"
    assert runner.invoke(cli, ["unpin", "s", "--root", str(tmp_path)]).output.strip() == "'s' was not pinned"
    result = runner.invoke(cli, ["pin", "missing", "--root", str(tmp_path)])
    assert result.exit_code == 2 and "no session 'missing'" in result.output


def test_a_removal_interrupted_by_a_crash_is_already_recorded(tmp_path, monkeypatch):
    """The gc-log line is written while the session sits in the trash, before its deletion: a
    crash in the deletion (simulated: the deletion raises) leaves the record, and the next run
    empties the trash."""
    shell = empty_shell(tmp_path, "shell")

    class Crash(BaseException):
        pass

    def crash(path):
        raise Crash()

    monkeypatch.setattr(memstore.locks, "_delete_tree", crash)
    with pytest.raises(Crash):
        memstore.apply_retention(tmp_path, RetentionPolicy(50, 30), apply=True)
    assert [(r["session_id"], r["reason"]) for r in gc_log(tmp_path)] == [("shell", "empty_shell")]
    assert not shell.exists() and list((tmp_path / ".trash").iterdir())
    monkeypatch.undo()
    memstore.apply_retention(tmp_path, RetentionPolicy(50, 30), apply=True)
    assert not list((tmp_path / ".trash").iterdir())
    assert len(gc_log(tmp_path)) == 1
