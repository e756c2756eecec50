"""Legacy migration: the reference scenario, the quirks fixed (ids without ``.memory``, idempotent,
nothing overwritten, sources kept unless asked, unreadable sources reported), the live
trajectory log and its rotation, gc_legacy, and that every view comes back from the log."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import textwrap
from datetime import UTC, datetime

import orjson
import pytest
from click.testing import CliRunner

import memstore
import memstore.layout
import memstore.migration
from memstore.cli import cli
from memstore.views.trajectory import write_trajectory_view

WIDGET = {
    "session_id": "session-foo",
    "schema_version": 3,
    "summary": "Painted the widget.",
    "objective": "paint the widget",
    "grounded_facts": [{"fact": "the widget is blue", "source": "tool:read_file"}],
    "touched_files": ["src/widget.rs"],
    "generated_at": "2026-01-01T00:00:00+00:00",
}
ROUTE = {"kind": "route", "turn": 1, "selected_model": "m", "class": "simple", "input_preview": "hi", "ts": 1767225600}
TOOL = {
    "kind": "tool",
    "turn": 1,
    "name": "read_file",
    "args": {"path": "a"},
    "ok": True,
    "agent_name": "main",
    "is_subagent": False,
    "ts": 1767225601,
}


def jsonl(*records) -> bytes:
    return b"".join(orjson.dumps(r) + b"\n" for r in records)


def legacy_store(root, *, envelopes=None, trajectories=None):
    (root / "history").mkdir(parents=True, exist_ok=True)
    (root / "logs").mkdir(parents=True, exist_ok=True)
    for name, data in (envelopes or {}).items():
        (root / "history" / name).write_bytes(
            data if isinstance(data, bytes) else orjson.dumps(data, option=orjson.OPT_INDENT_2)
        )
    for name, data in (trajectories or {}).items():
        (root / "logs" / name).write_bytes(data)
    return root


def events_of(root, sid):
    with memstore.read_session(root, sid) as reader:
        return list(reader.iter_events())


def snapshot(root):
    return {
        p.relative_to(root): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file() and "locks" not in p.parts
    }


def test_migrate_legacy_imports_history_and_trajectory(tmp_path):
    legacy_store(
        tmp_path,
        envelopes={"session-foo.memory.json": WIDGET},
        trajectories={"trajectory-20260101T000000Z.jsonl": jsonl(ROUTE, TOOL)},
    )
    report = memstore.migrate_legacy(tmp_path, remove_legacy=False)
    assert (report.sessions_created, report.memory_imported, report.trajectory_imported) == (2, 1, 1)
    assert report.records_imported == 2 and report.skipped == []
    assert [f.fact for f in memstore.query_facts(tmp_path, 10)] == ["the widget is blue"]
    assert (tmp_path / "history" / "session-foo.memory.json").exists()
    assert (tmp_path / "logs" / "trajectory-20260101T000000Z.jsonl").exists()
    assert sorted(s.session_id for s in memstore.recent_sessions(tmp_path, 10)) == [
        "session-foo",
        "traj-20260101T000000Z",
    ]
    # The session id drops ".memory"; the envelope is in the log, then in the view.
    assert [e["type"] for e in events_of(tmp_path, "session-foo")] == [
        "thread.started",
        "memory.envelope",
        "thread.completed",
    ]
    view = orjson.loads((tmp_path / "sessions" / "session-foo" / "derived" / "memory.json").read_bytes())
    assert view["summary"] == "Painted the widget." and view["touched_files"] == ["src/widget.rs"]
    records = [e["record"] for e in events_of(tmp_path, "traj-20260101T000000Z") if e["type"] == "trajectory.record"]
    assert records == [ROUTE, TOOL]
    with memstore.read_session(tmp_path, "traj-20260101T000000Z") as reader:
        times = [r.ts for r in reader.iter_records() if r.event["type"] == "trajectory.record"]
    assert times == ["2026-01-01T00:00:00.000Z", "2026-01-01T00:00:01.000Z"]  # from the records' unix ts
    assert (tmp_path / "sessions" / "traj-20260101T000000Z" / "derived" / "trajectory.jsonl").read_bytes() == jsonl(
        ROUTE, TOOL
    )


def test_a_second_run_imports_nothing_and_writes_nothing(tmp_path):
    legacy_store(
        tmp_path,
        envelopes={"session-foo.memory.json": WIDGET},
        trajectories={"trajectory-20260101T000000Z.jsonl": jsonl(ROUTE, TOOL), "trajectory.jsonl": jsonl(ROUTE)},
    )
    first = memstore.migrate_legacy(tmp_path)
    assert first.sessions_created == 3
    before = snapshot(tmp_path)
    second = memstore.migrate_legacy(tmp_path)
    assert (
        second.sessions_created,
        second.sessions_updated,
        second.memory_imported,
        second.trajectory_imported,
        second.records_imported,
        second.bytes_migrated,
    ) == (0, 0, 0, 0, 0, 0)
    assert second.already_imported == 3 and second.skipped == []
    assert snapshot(tmp_path) == before


def test_migrated_sessions_are_content_and_survive_retention(tmp_path):
    legacy_store(
        tmp_path,
        envelopes={"session-foo.memory.json": WIDGET},
        trajectories={"trajectory-20200101T000000Z.jsonl": jsonl({**ROUTE, "ts": 1577836800})},
    )
    memstore.migrate_legacy(tmp_path)
    report = memstore.apply_retention(tmp_path, memstore.RetentionPolicy(50, 30), apply=True)
    assert report.count == 0  # not empty shells; dated by the import, so not aged out at once either
    summaries = {s.session_id: s for s in memstore.recent_sessions(tmp_path, 10)}
    assert {s.status for s in summaries.values()} == {"completed"} and {s.turn_count for s in summaries.values()} == {0}


def test_compaction_artifacts_belong_to_their_session_and_the_newest_envelope_wins(tmp_path):
    older = {**WIDGET, "grounded_facts": [{"fact": "the widget was red", "source": "tool:x"}]}
    newest = {**WIDGET, "grounded_facts": [{"fact": "the widget is green", "source": "tool:x"}]}
    long_id = "a-very-long-session-identifier-from-vtcode-0123456789"
    legacy_store(
        tmp_path,
        envelopes={
            "session-foo.memory.json": older,
            "session-foo_0003_20260102T000000Z.memory.json": newest,
            f"{long_id[:32]}_0001_20260102T000000Z.memory.json": {**WIDGET, "session_id": long_id},
        },
    )
    os.utime(tmp_path / "history" / "session-foo.memory.json", (1_700_000_000, 1_700_000_000))
    os.utime(tmp_path / "history" / "session-foo_0003_20260102T000000Z.memory.json", (1_700_000_100, 1_700_000_100))
    report = memstore.migrate_legacy(tmp_path)
    assert report.memory_imported == 3 and report.sessions_created == 2
    envelopes = [e["envelope"] for e in events_of(tmp_path, "session-foo") if e["type"] == "memory.envelope"]
    assert envelopes == [older, newest]  # every envelope is in the log, oldest first
    assert memstore.session_memory_facts(tmp_path, "session-foo") == [
        {"fact": "the widget is green", "source": "tool:x"}
    ]
    assert memstore.session_memory_facts(tmp_path, long_id) == WIDGET["grounded_facts"]  # the envelope's own id


def test_a_changed_envelope_is_a_new_envelope_and_nothing_is_overwritten(tmp_path):
    legacy_store(tmp_path, envelopes={"session-foo.memory.json": WIDGET})
    memstore.migrate_legacy(tmp_path)
    log_before = (tmp_path / "sessions" / "session-foo" / "events.jsonl").read_bytes()
    changed = {**WIDGET, "grounded_facts": [{"fact": "the widget is now green", "source": "user_assertion"}]}
    legacy_store(tmp_path, envelopes={"session-foo.memory.json": changed})
    report = memstore.migrate_legacy(tmp_path)
    assert (report.memory_imported, report.sessions_updated, report.sessions_created) == (1, 1, 0)
    log_after = (tmp_path / "sessions" / "session-foo" / "events.jsonl").read_bytes()
    assert log_after.startswith(log_before)  # appended, never rewritten
    assert [f.fact for f in memstore.query_facts(tmp_path, 10)] == ["the widget is now green"]


def test_envelopes_go_into_an_existing_session_without_moving_it_back_in_time(tmp_path):
    with memstore.open_session(tmp_path, "session-foo") as log:
        log.append({"type": "thread.started", "thread_id": "session-foo"})
        log.append({"type": "item.completed", "item": {"id": "u", "type": "user_message", "text": "my name is Ada"}})
        updated = log.manifest.updated_at
    legacy_store(tmp_path, envelopes={"session-foo.memory.json": WIDGET})
    os.utime(tmp_path / "history" / "session-foo.memory.json", (1_600_000_000, 1_600_000_000))  # 2020
    report = memstore.migrate_legacy(tmp_path)
    assert (report.sessions_created, report.sessions_updated) == (0, 1)
    with memstore.read_session(tmp_path, "session-foo") as reader:
        records = list(reader.iter_records())
        assert reader.manifest.updated_at >= updated
    envelope = records[-1]
    assert envelope.event["type"] == "memory.envelope" and envelope.ts >= updated
    assert envelope.event["source"]["mtime"].startswith("2020-09-13")  # the file's time is kept


def test_the_live_trajectory_log_is_imported_incrementally_and_rotation_adds_no_duplicates(tmp_path):
    first = [{**ROUTE, "turn": n, "ts": 1767225600 + n} for n in range(1, 4)]
    legacy_store(tmp_path, trajectories={"trajectory.jsonl": jsonl(*first) + b'{"kind":"rou'})  # a partial line
    report = memstore.migrate_legacy(tmp_path)
    assert report.records_imported == 3

    def imported(sid):
        return [e["record"]["turn"] for e in events_of(tmp_path, sid) if e["type"] == "trajectory.record"]

    assert imported("traj-live") == [1, 2, 3]
    later = [{**ROUTE, "turn": n, "ts": 1767225600 + n} for n in range(4, 6)]
    (tmp_path / "logs" / "trajectory.jsonl").write_bytes(jsonl(*first, *later))
    assert memstore.migrate_legacy(tmp_path).records_imported == 2
    assert imported("traj-live") == [1, 2, 3, 4, 5]
    # VT Code starts again: the live log (grown once more) is rotated, and a new one begins.
    rotated = [{**ROUTE, "turn": 6, "ts": 1767225606}]
    os.rename(tmp_path / "logs" / "trajectory.jsonl", tmp_path / "logs" / "trajectory-20260102T000000Z.jsonl")
    with open(tmp_path / "logs" / "trajectory-20260102T000000Z.jsonl", "ab") as fh:
        fh.write(jsonl(*rotated))
    fresh = [{**ROUTE, "turn": 1, "input_preview": "new run", "ts": 1767312000}]
    (tmp_path / "logs" / "trajectory.jsonl").write_bytes(jsonl(*fresh))
    report = memstore.migrate_legacy(tmp_path)
    assert (report.records_imported, report.sessions_created, report.sessions_updated) == (2, 1, 1)
    assert imported("traj-20260102T000000Z") == [6]  # only what traj-live did not hold
    assert imported("traj-live") == [1, 2, 3, 4, 5, 1]
    assert memstore.migrate_legacy(tmp_path).records_imported == 0


def test_lines_that_are_not_json_objects_are_kept_as_text(tmp_path):
    data = jsonl(ROUTE) + b"not json at all\n\n[1, 2]\n" + b'{"kind":"tool","ts":"yesterday"}\n'
    legacy_store(tmp_path, trajectories={"trajectory-x.jsonl": data})
    report = memstore.migrate_legacy(tmp_path)
    assert report.records_imported == 4 and report.skipped == []
    events = [e for e in events_of(tmp_path, "traj-x") if e["type"] == "trajectory.record"]
    assert [e.get("raw") for e in events] == [None, "not json at all", "[1, 2]", None]
    assert [e["source"]["line"] for e in events] == [1, 2, 4, 5]
    view = (tmp_path / "sessions" / "traj-x" / "derived" / "trajectory.jsonl").read_bytes()
    assert view == jsonl(ROUTE) + b"not json at all\n[1, 2]\n" + b'{"kind":"tool","ts":"yesterday"}\n'


def test_every_derived_file_comes_back_byte_for_byte_from_the_log(tmp_path):
    legacy_store(
        tmp_path,
        envelopes={"session-foo.memory.json": WIDGET},
        trajectories={"trajectory-20260101T000000Z.jsonl": jsonl(ROUTE, TOOL)},
    )
    memstore.migrate_legacy(tmp_path)
    for sid, name in (("session-foo", "memory.json"), ("traj-20260101T000000Z", "trajectory.jsonl")):
        directory = tmp_path / "sessions" / sid
        before = (directory / "derived" / name).read_bytes()
        shutil.rmtree(directory / "derived")
        shutil.rmtree(directory / "index")
        (directory / "manifest.json").unlink()
        memstore.rebuild(tmp_path, sid)
        with memstore.open_session(tmp_path, sid) as log:
            if name == "memory.json":
                memstore.refresh_memory_view(log)
            else:
                write_trajectory_view(log)
        assert (directory / "derived" / name).read_bytes() == before


def test_unreadable_sources_are_reported_not_silently_skipped(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.memory.json").write_bytes(orjson.dumps(WIDGET))
    root = legacy_store(
        tmp_path / "vtcode",
        envelopes={
            "broken.memory.json": b'{"summary": ',
            "list.memory.json": b"[1, 2]",
            "notes.json": b"{}",
            "good.memory.json": WIDGET,
        },
        trajectories={"other.jsonl": b"{}\n"},
    )
    (root / "history" / "link.memory.json").symlink_to(outside / "secret.memory.json")
    (root / "history" / "dir.memory.json").mkdir()
    os.mkfifo(root / "history" / "fifo.memory.json")
    (root / "logs" / "trajectory-link.jsonl").symlink_to(outside / "secret.memory.json")
    (root / "history" / "s_0001_20260101T000000Z.jsonl").write_bytes(b"{}\n")  # a compaction artifact
    report = memstore.migrate_legacy(root)
    reasons = {s.path: s.reason for s in report.skipped}
    assert report.memory_imported == 1 and report.sessions_created == 1
    assert set(reasons) == {
        "history/broken.memory.json",
        "history/list.memory.json",
        "history/notes.json",
        "history/link.memory.json",
        "history/dir.memory.json",
        "history/fifo.memory.json",
        "logs/trajectory-link.jsonl",
        "logs/other.jsonl",
    }
    assert reasons["history/broken.memory.json"].startswith("not valid JSON")
    assert reasons["history/list.memory.json"] == "not a JSON object (a memory envelope is one)"
    assert reasons["history/link.memory.json"] == "cannot be read: refusing to follow a symlink"
    assert reasons["history/dir.memory.json"] == "cannot be read: is not a regular file"
    assert reasons["history/fifo.memory.json"] == "cannot be read: is not a regular file"
    assert sorted(os.listdir(root / "sessions")) == ["good"]
    # The CLI says so and exits 1.
    result = CliRunner().invoke(cli, ["migrate", "--root", str(root)])
    assert result.exit_code == 1
    assert "not imported: history/link.memory.json: cannot be read: refusing to follow a symlink" in result.output


def test_symlinked_legacy_directories_are_not_read(tmp_path):
    elsewhere = legacy_store(
        tmp_path / "elsewhere", envelopes={"x.memory.json": WIDGET}, trajectories={"trajectory-1.jsonl": jsonl(ROUTE)}
    )
    root = tmp_path / "vtcode"
    root.mkdir()
    (root / "history").symlink_to(elsewhere / "history")
    (root / "logs").symlink_to(elsewhere / "logs")
    report = memstore.migrate_legacy(root, remove_legacy=True)
    assert report.sessions_created == 0
    assert {s.path for s in report.skipped} == {"history", "logs"}
    assert (elsewhere / "history" / "x.memory.json").exists() and (elsewhere / "logs" / "trajectory-1.jsonl").exists()


def test_sources_are_removed_only_when_asked_and_only_once_imported(tmp_path):
    root = legacy_store(
        tmp_path,
        envelopes={"session-foo.memory.json": WIDGET, "bad.memory.json": b"{"},
        trajectories={"trajectory-20260101T000000Z.jsonl": jsonl(ROUTE, TOOL), "trajectory.jsonl": jsonl(ROUTE)},
    )
    (root / "history" / "session-foo_0001_20260101T000000Z.jsonl").write_bytes(b'{"_type":"metadata"}\n')
    (root / "checkpoints").mkdir()
    (root / "checkpoints" / "turn_1.json").write_bytes(b"{}")
    memstore.migrate_legacy(root)
    assert len(list((root / "history").iterdir())) == 3 and len(list((root / "logs").iterdir())) == 2
    # A rotated log that grew after the import is not removed until imported again.
    legacy = memstore.gc_legacy(root)
    assert sorted(legacy.removed) == ["history/session-foo.memory.json", "logs/trajectory-20260101T000000Z.jsonl"]
    assert legacy.bytes_freed > 0
    assert {k.path: k.reason for k in legacy.kept} == {
        "history/bad.memory.json": "not valid JSON (unexpected end of data: line 1 column 2 (char 1))",
        "history/session-foo_0001_20260101T000000Z.jsonl": "not a memory envelope; migrate does not import it",
        "logs/trajectory.jsonl": "the live trajectory log: VT Code may still be writing it",
    }
    assert (root / "checkpoints" / "turn_1.json").exists()
    entries = [orjson.loads(line) for line in (root / "gc-log.jsonl").read_bytes().splitlines()]
    assert sorted((e["directory"], e["reason"]) for e in entries) == [
        ("history/session-foo.memory.json", "legacy_imported"),
        ("logs/trajectory-20260101T000000Z.jsonl", "legacy_imported"),
    ]
    # The imported data is still all there.
    assert [f.fact for f in memstore.query_facts(root, 10)] == ["the widget is blue"]


def test_remove_legacy_keeps_what_was_not_fully_imported(tmp_path):
    root = legacy_store(tmp_path, trajectories={"trajectory-a.jsonl": jsonl(ROUTE)})
    memstore.migrate_legacy(root)
    with open(root / "logs" / "trajectory-a.jsonl", "ab") as fh:  # grew after the import
        fh.write(jsonl(TOOL))
    legacy_store(root, envelopes={"new.memory.json": WIDGET})
    report = memstore.gc_legacy(root)
    assert report.removed == []
    assert {k.path for k in report.kept} == {"logs/trajectory-a.jsonl", "history/new.memory.json"}
    report = memstore.migrate_legacy(root, remove_legacy=True)
    assert report.records_imported == 1 and sorted(report.legacy.removed) == [
        "history/new.memory.json",
        "logs/trajectory-a.jsonl",
    ]
    assert not (root / "history").exists() and not (root / "logs").exists()


def test_a_session_open_in_another_process_is_reported_and_left_alone(tmp_path):
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent("""
        import sys, memstore
        log = memstore.open_session(sys.argv[1], "session-foo")
        log.append({"type": "thread.started", "thread_id": "session-foo"})
        log.flush()
        print("open", flush=True)
        sys.stdin.readline()
        log.close()
    """),
            str(tmp_path),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "open"
        legacy_store(tmp_path, envelopes={"session-foo.memory.json": WIDGET})
        report = memstore.migrate_legacy(tmp_path)
        assert report.memory_imported == 0
        assert [s.path for s in report.skipped] == ["history/session-foo.memory.json"]
        assert "open in another process" in report.skipped[0].reason
    finally:
        holder.stdin.write("\n")
        holder.stdin.close()
        holder.wait(timeout=30)
    assert memstore.migrate_legacy(tmp_path).memory_imported == 1  # and later it goes in


def test_concurrent_migrations_import_everything_once(tmp_path):
    legacy_store(
        tmp_path,
        envelopes={f"s{n}.memory.json": {**WIDGET, "session_id": f"s{n}"} for n in range(4)},
        trajectories={"trajectory-a.jsonl": jsonl(ROUTE, TOOL)},
    )
    script = (
        "import sys, memstore; r = memstore.migrate_legacy(sys.argv[1]); print(r.memory_imported, r.records_imported)"
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", script, str(tmp_path)], stdout=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    outputs = sorted(p.communicate(timeout=60)[0].split() for p in procs)
    assert all(p.returncode == 0 for p in procs)
    assert outputs == [["0", "0"], ["4", "2"]]
    for n in range(4):
        assert [e["type"] for e in events_of(tmp_path, f"s{n}")].count("memory.envelope") == 1


def test_a_missing_root_creates_nothing(tmp_path):
    report = memstore.migrate_legacy(tmp_path / "missing")
    assert report == memstore.MigrationReport() and not (tmp_path / "missing").exists()
    assert memstore.gc_legacy(tmp_path / "missing").removed == []
    result = CliRunner().invoke(cli, ["migrate", "--root", str(tmp_path / "missing")])
    assert result.exit_code == 2 and "no directory" in result.output


def test_cli_migrate_reports_and_removes_legacy(tmp_path):
    legacy_store(
        tmp_path,
        envelopes={"session-foo.memory.json": WIDGET},
        trajectories={"trajectory-20260101T000000Z.jsonl": jsonl(ROUTE, TOOL)},
    )
    runner = CliRunner()
    result = runner.invoke(cli, ["migrate", "--root", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "imported 1 memory envelope and 1 trajectory log (2 records" in result.output
    assert "2 sessions created" in result.output
    result = runner.invoke(cli, ["migrate", "--root", str(tmp_path), "--remove-legacy", "--json"])
    assert result.exit_code == 0
    data = orjson.loads(result.output)
    assert data["already_imported"] == 2 and len(data["legacy"]["removed"]) == 2
    result = runner.invoke(cli, ["facts", "--root", str(tmp_path)])
    assert result.output.strip() == "session-foo: [tool:read_file] the widget is blue"


@pytest.mark.parametrize(
    "name, expected",
    [
        ("session-foo.memory.json", "session-foo"),
        ("a.b.memory.json", "a.b"),
        ("run_0012_20260101T101010Z.memory.json", "run"),
        ("x_1_20260101T101010Z.memory.json", "x_1_20260101T101010Z"),
    ],
)
def test_envelope_session_ids(name, expected):
    assert memstore.migration.envelope_session_id(name, {}) == expected


@pytest.mark.parametrize(
    "name, expected",
    [
        ("trajectory.jsonl", "traj-live"),
        ("trajectory-20260101T000000Z.jsonl", "traj-20260101T000000Z"),
        ("other.jsonl", None),
    ],
)
def test_trajectory_session_ids(name, expected):
    assert memstore.migration.trajectory_session_id(name) == expected


def test_hostile_trajectory_lines_are_kept_without_breaking_the_log(tmp_path):
    deep = b"[" * 300 + b"]" * 300
    nested = b'{"kind":"tool","args":' + b'{"a":' * 300 + b"1" + b"}" * 300 + b"}"
    future = orjson.dumps({**ROUTE, "ts": 4_102_444_800})  # 2100
    legacy_store(
        tmp_path,
        trajectories={
            "trajectory-h.jsonl": b"\xff\xfe not utf-8\n"
            + deep
            + b"\n"
            + nested
            + b"\n"
            + future
            + b"\n"
            + jsonl({**ROUTE, "ts": True}, {**ROUTE, "ts": float("1e30")})
        },
    )
    legacy_store(tmp_path, envelopes={"deep.memory.json": b'{"summary":' + b'{"a":' * 300 + b"1" + b"}" * 300 + b"}"})
    report = memstore.migrate_legacy(tmp_path)
    assert report.records_imported == 6
    assert [s.path for s in report.skipped] == ["history/deep.memory.json"]
    assert report.skipped[0].reason.startswith("cannot be stored as an event")
    with memstore.read_session(tmp_path, "traj-h") as reader:
        records = [r for r in reader.iter_records() if r.event["type"] == "trajectory.record"]
    assert records[0].event["raw"] == "\\xff\\xfe not utf-8"
    assert "raw" in records[1].event and "raw" in records[2].event  # nested deeper than orjson writes
    now = memstore.events.utc_now()
    assert all(r.ts <= now for r in records)  # a record from 2100 is not dated in the future
    assert [r.ts for r in records] == sorted(r.ts for r in records)
    assert memstore.migrate_legacy(tmp_path).records_imported == 0


def test_a_failed_import_reports_the_error_and_the_next_run_goes_on_without_duplicates(tmp_path, monkeypatch):
    records = [{**ROUTE, "turn": n, "ts": 1767225600 + n} for n in range(1, 6)]
    legacy_store(tmp_path, trajectories={"trajectory-a.jsonl": jsonl(*records)})
    append = memstore.migration._Writer.append
    calls = []

    def failing(self, event, ts):
        calls.append(event)
        if len(calls) == 3:
            raise memstore.StoreIOError("write", self.log.events_path, "No space left on device")
        return append(self, event, ts)

    monkeypatch.setattr(memstore.migration._Writer, "append", failing)
    with pytest.raises(memstore.StoreIOError, match="No space left"):
        memstore.migrate_legacy(tmp_path)
    monkeypatch.setattr(memstore.migration._Writer, "append", append)
    report = memstore.migrate_legacy(tmp_path)
    assert report.records_imported == 3 and report.sessions_updated == 1
    turns = [e["record"]["turn"] for e in events_of(tmp_path, "traj-a") if e["type"] == "trajectory.record"]
    assert turns == [1, 2, 3, 4, 5]


def test_a_directory_migration_did_not_make_is_never_removed_by_it(tmp_path):
    existing = tmp_path / "sessions" / "deep"
    (existing / "derived").mkdir(parents=True)
    (existing / "derived" / "memory.json").write_bytes(b'{"grounded_facts":[{"fact":"kept"}]}')
    legacy_store(tmp_path, envelopes={"deep.memory.json": b'{"summary":' + b'{"a":' * 300 + b"1" + b"}" * 300 + b"}"})
    report = memstore.migrate_legacy(tmp_path)
    assert report.memory_imported == 0 and len(report.skipped) == 1
    assert (existing / "derived" / "memory.json").read_bytes() == b'{"grounded_facts":[{"fact":"kept"}]}'


# --------------------------------------------------------------------------------------------
# Sources VT Code's own `session-store migrate` already migrated (it keeps its legacy sources by
# default, so `memstore migrate` finds both). The fixtures write exactly what the reference
# (§9.1, §9.3) says VT Code writes: for history/<stem>.json the session `<stem>` (the file name
# minus its last extension, `.memory` kept) in the directory sessions/<sanitized stem> (0700),
# derived/ (0700), derived/memory.json a byte copy of the source, and a compact manifest.json of
# SessionManifest.new(<stem>) with created_at = updated_at = the source's mtime (chrono RFC 3339),
# completed, no turns, no events, and no events.jsonl at all.


def chrono_rfc3339(mtime_ns: int) -> str:
    """A time as chrono's to_rfc3339 prints it: +00:00, and 0 or 9 fractional digits here."""
    seconds, nanos = divmod(mtime_ns, 1_000_000_000)
    base = datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S")
    return f"{base}.{nanos:09d}+00:00" if nanos else f"{base}+00:00"


def vtcode_migrate(root, rel):
    """Do what VT Code's migrate_legacy does to one legacy file ``rel`` (``history/<name>`` or
    ``logs/<name>``); return the session directory it writes."""
    source = root / rel
    kind, name = rel.split("/")
    stem = name.rsplit(".", 1)[0]
    if kind == "history":
        session_id, view = stem, "memory.json"
    else:
        session_id, view = "traj-" + stem.removeprefix("trajectory-"), "trajectory.jsonl"
    directory = root / "sessions" / memstore.layout.sanitize_session_id(session_id)
    for path in (root / "sessions", directory, directory / "derived"):
        path.mkdir(mode=0o700, exist_ok=True)
        os.chmod(path, 0o700)
    (directory / "derived" / view).write_bytes(source.read_bytes())
    os.chmod(directory / "derived" / view, 0o600)
    stamp = chrono_rfc3339(source.stat().st_mtime_ns)
    manifest = {
        "session_id": session_id,
        "schema_version": 1,
        "created_at": stamp,
        "updated_at": stamp,
        "turn_count": 0,
        "event_count": 0,
        "status": "completed",
        "in_turn": False,
        "persisted_file_len": 0,
        "retained_turn_base": 1,
    }
    (directory / "manifest.json").write_bytes(orjson.dumps(manifest))
    os.chmod(directory / "manifest.json", 0o600)
    return directory


def tree(directory):
    """Every file under ``directory`` with its bytes (to show that nothing was written there)."""
    return {p.relative_to(directory): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


BAR = {
    **WIDGET,
    "session_id": "session-bar",
    "summary": "Opened the bar.",
    "grounded_facts": [
        {"fact": "the bar opens at noon", "source": "tool:read_file"},
        {"fact": "my name is Ada", "source": "user_assertion"},
    ],
}
BAR_LATER = {
    **BAR,
    "summary": "Closed the bar.",
    "grounded_facts": [
        {"fact": "the bar opens at noon", "source": "tool:read_file"},
        {"fact": "the bar closes at nine", "source": "tool:grep"},
    ],
}


def test_a_source_vtcode_already_migrated_is_recognised_and_not_imported_again(tmp_path):
    """VT Code migrated history/session-bar.memory.json into session-bar.memory and kept the
    source: memstore imports nothing, writes nothing, says so, and every fact is listed once."""
    legacy_store(tmp_path, envelopes={"session-bar.memory.json": BAR})
    vt_dir = vtcode_migrate(tmp_path, "history/session-bar.memory.json")
    vt_before = tree(vt_dir)
    report = memstore.migrate_legacy(tmp_path)
    assert (report.sessions_created, report.sessions_updated, report.memory_imported, report.bytes_migrated) == (
        0,
        0,
        0,
        0,
    )
    assert report.already_migrated == 1 and report.already_imported == 0 and report.skipped == []
    assert [(m.path, m.session, m.state) for m in report.migrated_by_vtcode] == [
        ("history/session-bar.memory.json", "session-bar.memory", "already_migrated")
    ]
    assert sorted(os.listdir(tmp_path / "sessions")) == ["session-bar.memory"]
    assert tree(vt_dir) == vt_before
    assert [(f.fact, f.session_id) for f in memstore.query_facts(tmp_path, 10)] == [
        ("the bar opens at noon", "session-bar.memory"),
        ("my name is Ada", "session-bar.memory"),
    ]
    before = snapshot(tmp_path)
    again = memstore.migrate_legacy(tmp_path)
    assert again.already_migrated == 1 and again.memory_imported == 0 and snapshot(tmp_path) == before
    data = again.to_dict()
    assert data["already_migrated"] == 1
    assert data["migrated_by_vtcode"] == [
        {"path": "history/session-bar.memory.json", "session": "session-bar.memory", "state": "already_migrated"}
    ]
    orjson.dumps(data)  # what --json prints


def test_every_file_vtcode_migrated_is_recognised_by_its_own_id_mapping(tmp_path):
    """VT Code makes one session per file, named by the file's stem (sanitized): compaction
    artifacts and names with characters its sanitizer replaces are recognised as well."""
    artifact = "session-foo_0003_20260102T000000Z.memory.json"
    legacy_store(
        tmp_path,
        envelopes={
            "session-foo.memory.json": WIDGET,
            artifact: {**WIDGET, "summary": "later"},
            "my bar.memory.json": {**BAR, "session_id": "my bar"},
        },
    )
    for name in ("session-foo.memory.json", artifact, "my bar.memory.json"):
        vtcode_migrate(tmp_path, f"history/{name}")
    report = memstore.migrate_legacy(tmp_path)
    assert report.memory_imported == 0 and report.already_migrated == 3
    assert sorted((m.path, m.session) for m in report.migrated_by_vtcode) == sorted(
        [
            ("history/my bar.memory.json", "my_bar.memory"),
            (f"history/{artifact}", artifact[: -len(".json")]),
            ("history/session-foo.memory.json", "session-foo.memory"),
        ]
    )
    assert sorted(os.listdir(tmp_path / "sessions")) == sorted(
        ["my_bar.memory", artifact[: -len(".json")], "session-foo.memory"]
    )
    facts = [f.fact for f in memstore.query_facts(tmp_path, 20)]
    assert sorted(facts) == sorted(
        ["the widget is blue", "the widget is blue", "the bar opens at noon", "my name is Ada"]
    )


def test_only_the_files_vtcode_migrated_are_skipped(tmp_path):
    """A file VT Code had not migrated (written after its migration) is imported as usual."""
    legacy_store(tmp_path, envelopes={"session-bar.memory.json": BAR})
    vtcode_migrate(tmp_path, "history/session-bar.memory.json")
    legacy_store(tmp_path, envelopes={"other.memory.json": {**WIDGET, "session_id": "other"}})
    report = memstore.migrate_legacy(tmp_path)
    assert (report.memory_imported, report.sessions_created, report.already_migrated) == (1, 1, 1)
    assert sorted(os.listdir(tmp_path / "sessions")) == ["other", "session-bar.memory"]


def test_a_source_changed_after_vtcode_migrated_it_goes_into_vtcodes_session(tmp_path):
    """The source was rewritten after VT Code copied it: the new version is imported into the
    session VT Code made for that file, after VT Code's copy (now the only copy of the old
    version) is adopted into that session's log; no second session, each fact listed once,
    nothing lost, and the next run imports nothing."""
    legacy_store(tmp_path, envelopes={"session-bar.memory.json": BAR})
    source = tmp_path / "history" / "session-bar.memory.json"
    os.utime(source, (1_767_225_600, 1_767_225_600))  # 2026-01-01
    vt_dir = vtcode_migrate(tmp_path, "history/session-bar.memory.json")
    old_copy = (vt_dir / "derived" / "memory.json").read_bytes()
    legacy_store(tmp_path, envelopes={"session-bar.memory.json": BAR_LATER})
    os.utime(source, (1_767_312_000, 1_767_312_000))  # 2026-01-02
    report = memstore.migrate_legacy(tmp_path)
    assert (report.memory_imported, report.sessions_created, report.sessions_updated) == (1, 0, 1)
    assert report.already_migrated == 0 and report.skipped == []
    assert [(m.path, m.session, m.state) for m in report.migrated_by_vtcode] == [
        ("history/session-bar.memory.json", "session-bar.memory", "changed_since")
    ]
    assert sorted(os.listdir(tmp_path / "sessions")) == ["session-bar.memory"]
    with memstore.read_session(tmp_path, "session-bar.memory") as reader:
        records = list(reader.iter_records())
    assert [r.event["type"] for r in records] == [
        "thread.started",
        "memory.envelope",
        "memory.envelope",
        "thread.completed",
    ]
    adopted, imported = records[1].event, records[2].event
    assert adopted["envelope"] == BAR and imported["envelope"] == BAR_LATER
    assert adopted["source"]["sha256"] == hashlib.sha256(old_copy).hexdigest()
    assert adopted["source"]["file"] == "sessions/session-bar.memory/derived/memory.json"
    assert adopted["source"]["legacy_file"] == "history/session-bar.memory.json"
    assert imported["source"]["sha256"] == hashlib.sha256(source.read_bytes()).hexdigest()
    assert records[1].ts.startswith("2026-01-01") and records[2].ts.startswith("2026-01-02")
    assert [(f.fact, f.session_id) for f in memstore.query_facts(tmp_path, 10)] == [
        ("the bar opens at noon", "session-bar.memory"),
        ("the bar closes at nine", "session-bar.memory"),
    ]
    before = snapshot(tmp_path)
    again = memstore.migrate_legacy(tmp_path)
    assert (again.memory_imported, again.already_imported) == (1 - 1, 1) and snapshot(tmp_path) == before
    # Both versions are in a log now: the source may go.
    assert memstore.gc_legacy(tmp_path).removed == ["history/session-bar.memory.json"]


def test_a_source_only_vtcode_migrated_is_not_removed_by_gc_legacy(tmp_path):
    """VT Code's copy is a derived file without a log (and VT Code's own retention deletes such
    sessions as empty shells): the source stays, so it can still be imported later."""
    legacy_store(tmp_path, envelopes={"session-bar.memory.json": BAR})
    vtcode_migrate(tmp_path, "history/session-bar.memory.json")
    report = memstore.migrate_legacy(tmp_path, remove_legacy=True)
    assert report.legacy.removed == []
    [kept] = report.legacy.kept
    assert kept.path == "history/session-bar.memory.json"
    assert "migrated by VT Code into session 'session-bar.memory'" in kept.reason
    assert (tmp_path / "history" / "session-bar.memory.json").exists()


def test_migrating_again_after_vtcode_migrated_in_between(tmp_path):
    """memstore migrates, then VT Code migrates the same sources, then memstore again: nothing
    is imported twice, VT Code's duplicate is reported (not removed), and a later change of
    the source goes on into memstore's session, where its earlier versions are."""
    legacy_store(tmp_path, envelopes={"session-bar.memory.json": BAR})
    assert memstore.migrate_legacy(tmp_path).memory_imported == 1
    vt_dir = vtcode_migrate(tmp_path, "history/session-bar.memory.json")
    vt_before = tree(vt_dir)
    before = snapshot(tmp_path)
    report = memstore.migrate_legacy(tmp_path)
    assert (report.memory_imported, report.already_imported, report.already_migrated) == (0, 1, 0)
    assert [(m.path, m.session, m.state) for m in report.migrated_by_vtcode] == [
        ("history/session-bar.memory.json", "session-bar.memory", "also_imported")
    ]
    assert snapshot(tmp_path) == before
    legacy_store(tmp_path, envelopes={"session-bar.memory.json": BAR_LATER})
    report = memstore.migrate_legacy(tmp_path)
    assert (report.memory_imported, report.sessions_updated) == (1, 1)
    envelopes = [e["envelope"] for e in events_of(tmp_path, "session-bar") if e["type"] == "memory.envelope"]
    assert envelopes == [BAR, BAR_LATER]
    assert tree(vt_dir) == vt_before


def test_a_vtcode_session_that_is_a_symlink_is_not_followed(tmp_path):
    """A symlink where VT Code's session would be is neither read nor written: the source is
    imported into memstore's own session as if VT Code had not migrated it."""
    legacy_store(tmp_path, envelopes={"session-bar.memory.json": BAR})
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    real = vtcode_migrate(tmp_path, "history/session-bar.memory.json")
    real.rename(elsewhere / "session-bar.memory")
    (tmp_path / "sessions" / "session-bar.memory").symlink_to(elsewhere / "session-bar.memory")
    report = memstore.migrate_legacy(tmp_path)
    assert (report.memory_imported, report.already_migrated, report.migrated_by_vtcode) == (1, 0, [])
    assert sorted(os.listdir(elsewhere / "session-bar.memory")) == ["derived", "manifest.json"]


def test_a_changed_source_whose_vtcode_copy_cannot_be_adopted_leaves_that_copy_alone(tmp_path):
    """VT Code's copy is not a JSON object any more (damaged): it cannot be kept in a log, so
    VT Code's session is not touched and the new version goes into memstore's own session."""
    legacy_store(tmp_path, envelopes={"session-bar.memory.json": BAR})
    vt_dir = vtcode_migrate(tmp_path, "history/session-bar.memory.json")
    (vt_dir / "derived" / "memory.json").write_bytes(b'{"summary": "trunc')
    vt_before = tree(vt_dir)
    legacy_store(tmp_path, envelopes={"session-bar.memory.json": BAR_LATER})
    report = memstore.migrate_legacy(tmp_path)
    assert (report.memory_imported, report.sessions_created) == (1, 1)
    assert report.migrated_by_vtcode == []
    assert tree(vt_dir) == vt_before
    assert [e["envelope"] for e in events_of(tmp_path, "session-bar") if e["type"] == "memory.envelope"] == [BAR_LATER]


def test_cli_migrate_says_what_vtcode_already_migrated(tmp_path):
    legacy_store(tmp_path, envelopes={"session-bar.memory.json": BAR})
    vtcode_migrate(tmp_path, "history/session-bar.memory.json")
    result = CliRunner().invoke(cli, ["migrate", "--root", str(tmp_path), "--json"])
    assert result.exit_code == 0, result.output
    data = orjson.loads(result.output)
    assert data["already_migrated"] == 1 and data["memory_imported"] == 0
    assert data["migrated_by_vtcode"][0]["session"] == "session-bar.memory"


def test_an_import_into_vtcodes_session_interrupted_before_it_finished_is_finished_next_time(tmp_path, monkeypatch):
    """A failure after the changed version went into VT Code's session (before the thread was
    closed and the view regenerated): the next run finishes that session, appending nothing
    twice."""
    legacy_store(tmp_path, envelopes={"session-bar.memory.json": BAR})
    vt_dir = vtcode_migrate(tmp_path, "history/session-bar.memory.json")
    legacy_store(tmp_path, envelopes={"session-bar.memory.json": BAR_LATER})
    finish = memstore.migration._Writer.finish

    def crash(self):
        self.log.close()
        raise memstore.StoreIOError("write", self.log.events_path, "No space left on device")

    monkeypatch.setattr(memstore.migration._Writer, "finish", crash)
    with pytest.raises(memstore.StoreIOError):
        memstore.migrate_legacy(tmp_path)
    monkeypatch.setattr(memstore.migration._Writer, "finish", finish)
    assert orjson.loads((vt_dir / "derived" / "memory.json").read_bytes()) == BAR  # not regenerated yet
    report = memstore.migrate_legacy(tmp_path)
    assert (report.memory_imported, report.already_imported, report.sessions_updated) == (0, 1, 1)
    types = [e["type"] for e in events_of(tmp_path, "session-bar.memory")]
    assert types == ["thread.started", "memory.envelope", "memory.envelope", "thread.completed"]
    assert [f.fact for f in memstore.query_facts(tmp_path, 10)] == ["the bar opens at noon", "the bar closes at nine"]
    before = snapshot(tmp_path)
    assert memstore.migrate_legacy(tmp_path).sessions_updated == 0 and snapshot(tmp_path) == before


def test_vtcode_migrating_again_after_memstore_went_into_its_session(tmp_path):
    """VT Code's migrate overwrites its session's manifest and memory.json (it is not
    idempotent): memstore's log there is kept and read, nothing is imported twice, and a
    version only VT Code's new copy holds is recognised as already migrated."""
    legacy_store(tmp_path, envelopes={"session-bar.memory.json": BAR})
    vt_dir = vtcode_migrate(tmp_path, "history/session-bar.memory.json")
    legacy_store(tmp_path, envelopes={"session-bar.memory.json": BAR_LATER})
    memstore.migrate_legacy(tmp_path)
    log_before = (vt_dir / "events.jsonl").read_bytes()
    vtcode_migrate(tmp_path, "history/session-bar.memory.json")  # VT Code again: same file
    report = memstore.migrate_legacy(tmp_path)
    assert (report.memory_imported, report.already_imported, report.already_migrated) == (0, 1, 0)
    third = {**BAR_LATER, "summary": "Reopened the bar."}
    legacy_store(tmp_path, envelopes={"session-bar.memory.json": third})
    vtcode_migrate(tmp_path, "history/session-bar.memory.json")  # and again, after another change
    report = memstore.migrate_legacy(tmp_path)
    assert (report.memory_imported, report.already_migrated) == (0, 1)
    assert (vt_dir / "events.jsonl").read_bytes() == log_before
    assert sorted(os.listdir(tmp_path / "sessions")) == ["session-bar.memory"]


def test_a_vtcode_session_that_holds_another_files_copy_is_not_taken_for_this_ones(tmp_path):
    """VT Code's sanitizer maps `a b.memory.json` and `a_b.memory.json` to one directory; its
    manifest names the file it copied last. The other file is not a changed version of that
    one: it goes into memstore's own session, and VT Code's session is not touched."""
    legacy_store(
        tmp_path,
        envelopes={"a_b.memory.json": {**BAR, "session_id": "a_b"}, "a b.memory.json": {**WIDGET, "session_id": "a b"}},
    )
    vtcode_migrate(tmp_path, "history/a_b.memory.json")
    vt_dir = vtcode_migrate(tmp_path, "history/a b.memory.json")  # overwrites the same directory
    vt_before = tree(vt_dir)
    report = memstore.migrate_legacy(tmp_path)
    assert [(m.path, m.state) for m in report.migrated_by_vtcode] == [("history/a b.memory.json", "already_migrated")]
    assert (report.memory_imported, report.sessions_created) == (1, 1)
    assert tree(vt_dir) == vt_before
    assert [e["envelope"] for e in events_of(tmp_path, "a_b") if e["type"] == "memory.envelope"] == [
        {**BAR, "session_id": "a_b"}
    ]


def test_a_symlinked_copy_in_vtcodes_session_is_not_taken_for_vtcodes_copy(tmp_path):
    """derived/memory.json must be a regular file: a symlink to the source itself (same bytes)
    is not followed, so the source is imported as if VT Code had not migrated it."""
    legacy_store(tmp_path, envelopes={"session-bar.memory.json": BAR})
    vt_dir = vtcode_migrate(tmp_path, "history/session-bar.memory.json")
    (vt_dir / "derived" / "memory.json").unlink()
    (vt_dir / "derived" / "memory.json").symlink_to(tmp_path / "history" / "session-bar.memory.json")
    report = memstore.migrate_legacy(tmp_path)
    assert (report.memory_imported, report.already_migrated) == (1, 0)
    assert (vt_dir / "derived" / "memory.json").is_symlink()


# Trajectory logs VT Code migrated: logs/<stem>.jsonl goes to its session traj-<stem without a
# leading "trajectory-">, so a rotated log's session has memstore's name (traj-<stamp>) and the
# live log's is traj-trajectory (memstore's: traj-live).


def test_trajectory_logs_vtcode_already_migrated_are_not_imported_again(tmp_path):
    legacy_store(
        tmp_path,
        trajectories={
            "trajectory-20260101T000000Z.jsonl": jsonl(ROUTE, TOOL),
            "trajectory.jsonl": jsonl({**ROUTE, "turn": 7}),
        },
    )
    rotated = vtcode_migrate(tmp_path, "logs/trajectory-20260101T000000Z.jsonl")
    live = vtcode_migrate(tmp_path, "logs/trajectory.jsonl")
    before = snapshot(tmp_path)
    report = memstore.migrate_legacy(tmp_path)
    assert (report.records_imported, report.sessions_created, report.sessions_updated) == (0, 0, 0)
    assert report.already_migrated == 2
    assert sorted((m.path, m.session, m.state) for m in report.migrated_by_vtcode) == [
        ("logs/trajectory-20260101T000000Z.jsonl", "traj-20260101T000000Z", "already_migrated"),
        ("logs/trajectory.jsonl", "traj-trajectory", "already_migrated"),
    ]
    assert snapshot(tmp_path) == before  # nothing written: no traj-live beside traj-trajectory
    assert sorted(os.listdir(tmp_path / "sessions")) == sorted([rotated.name, live.name])
    kept = {k.path: k.reason for k in memstore.gc_legacy(tmp_path).kept}
    assert (
        "which holds it only as derived/trajectory.jsonl, in no log" in kept["logs/trajectory-20260101T000000Z.jsonl"]
    )


def test_the_live_log_grown_since_vtcode_migrated_it_imports_only_the_lines_past_vtcodes_copy(tmp_path):
    """VT Code's copy of the live log holds its first lines: traj-live gets the later ones, and
    once the log is rotated, its session gets none of the lines either copy holds."""
    first = [{**ROUTE, "turn": n, "ts": 1767225600 + n} for n in range(1, 4)]
    legacy_store(tmp_path, trajectories={"trajectory.jsonl": jsonl(*first)})
    live_copy = vtcode_migrate(tmp_path, "logs/trajectory.jsonl")
    live_before = tree(live_copy)
    later = [{**ROUTE, "turn": n, "ts": 1767225600 + n} for n in range(4, 6)]
    (tmp_path / "logs" / "trajectory.jsonl").write_bytes(jsonl(*first, *later))
    report = memstore.migrate_legacy(tmp_path)
    assert (report.records_imported, report.sessions_created) == (2, 1)
    assert [(m.path, m.session, m.state) for m in report.migrated_by_vtcode] == [
        ("logs/trajectory.jsonl", "traj-trajectory", "changed_since")
    ]
    turns = [e["record"]["turn"] for e in events_of(tmp_path, "traj-live") if e["type"] == "trajectory.record"]
    assert turns == [4, 5]
    assert tree(live_copy) == live_before
    # VT Code rotates the log after one more line, and starts a new one.
    os.rename(tmp_path / "logs" / "trajectory.jsonl", tmp_path / "logs" / "trajectory-20260102T000000Z.jsonl")
    with open(tmp_path / "logs" / "trajectory-20260102T000000Z.jsonl", "ab") as fh:
        fh.write(jsonl({**ROUTE, "turn": 6, "ts": 1767225606}))
    report = memstore.migrate_legacy(tmp_path)
    assert report.records_imported == 1
    turns = [
        e["record"]["turn"] for e in events_of(tmp_path, "traj-20260102T000000Z") if e["type"] == "trajectory.record"
    ]
    assert turns == [6]
    # Lines 1-3 of the rotated log are in VT Code's copy only, which has no log: it is kept.
    kept = {k.path: k.reason for k in memstore.gc_legacy(tmp_path).kept}
    assert (
        "lines 1-3 are held only by VT Code's copy in session 'traj-trajectory'"
        in kept["logs/trajectory-20260102T000000Z.jsonl"]
    )
    assert memstore.migrate_legacy(tmp_path).records_imported == 0


def test_a_rotated_log_grown_since_vtcode_copied_it_goes_whole_into_vtcodes_session(tmp_path):
    """Its session is VT Code's (same name): every line goes into its log, VT Code's lines
    included, so the regenerated view holds all of them."""
    legacy_store(tmp_path, trajectories={"trajectory-a.jsonl": jsonl(ROUTE)})
    vt_dir = vtcode_migrate(tmp_path, "logs/trajectory-a.jsonl")
    with open(tmp_path / "logs" / "trajectory-a.jsonl", "ab") as fh:
        fh.write(jsonl(TOOL))
    report = memstore.migrate_legacy(tmp_path)
    assert (report.records_imported, report.sessions_created, report.sessions_updated) == (2, 0, 1)
    assert [(m.session, m.state) for m in report.migrated_by_vtcode] == [("traj-a", "changed_since")]
    assert (vt_dir / "derived" / "trajectory.jsonl").read_bytes() == jsonl(ROUTE, TOOL)
    assert memstore.migrate_legacy(tmp_path).records_imported == 0


def test_a_rotated_log_that_no_longer_holds_vtcodes_lines_is_not_imported_over_them(tmp_path):
    """VT Code's copy holds lines the file lost (it was rewritten): importing would replace
    that copy with a view without them, so the file is reported, and nothing is written."""
    legacy_store(tmp_path, trajectories={"trajectory-a.jsonl": jsonl(ROUTE, TOOL)})
    vt_dir = vtcode_migrate(tmp_path, "logs/trajectory-a.jsonl")
    before = tree(vt_dir)
    (tmp_path / "logs" / "trajectory-a.jsonl").write_bytes(jsonl({**ROUTE, "input_preview": "another run"}))
    report = memstore.migrate_legacy(tmp_path)
    assert report.records_imported == 0
    [skipped] = report.skipped
    assert skipped.path == "logs/trajectory-a.jsonl"
    assert "VT Code's copy in session 'traj-a' holds lines" in skipped.reason
    assert tree(vt_dir) == before
