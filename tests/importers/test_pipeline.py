"""The import pipeline (worker processes, the staging area, batches published with one sync):
what it writes is what a one-by-one import writes, and a crash never leaves a session half
there.

Invariants:
- an archive imported by worker processes, or in one process, leaves the store exactly as
  importing its sources one by one the classic way (records, manifests, indexes, import
  states, report);
- a SIGKILL at any moment of an archive import (workers running, a batch being published)
  leaves every session either absent or whole and consistent (it opens without a rescan, its
  views agree with its log, its import state claims no more than the log holds), no staging
  area in use, and the next import finishes the job with the same result as one uninterrupted
  import;
- a session tombstoned, or created by another writer, while its source was being staged is
  not published over: the tombstone wins, the other writer's session is imported into;
- a worker process that dies has its tasks run again by the parent;
- progress says sessions and bytes, up to the totals, with a rate and a time left.
"""

from __future__ import annotations

import io
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

import memstore
from memstore.importers import ImportProgress, ProgressLine
from memstore.importers import pipeline as pipeline_module
from memstore.importers.run import import_source
from memstore.importers.sources import discover
from memstore.importers.staging import STAGING_PREFIX
from memstore.session import recovery
from memstore.tombstones import TombstoneReason, Tombstones

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))

import archive  # noqa: E402
from importers_support import import_killed_at  # noqa: E402

OLD = 1_700_000_000.0


@pytest.fixture(scope="module")
def small_archive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """80 sessions of both agents in their real layouts (82 files, about 1.5 MB), settled."""
    dest = tmp_path_factory.mktemp("archive")
    archive.generate(dest, 80, seed=3, scale=0.05, jobs=1)
    return dest


def one_by_one(root: Path, source_dir: Path) -> None:
    """The reference: every source imported in order by the classic path (into the store, under
    each session's lock), without workers or staging."""
    files = discover([source_dir], root, lambda *_: None)
    tombstones = Tombstones(root)
    now = time.time()
    for source in files:
        import_source(root, source, "auto", 900.0, now, lambda _n: None, tombstones, tombstones.all())


def _rows(path: Path, sql: str) -> list:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


def session_dirs(root: Path) -> list[str]:
    base = root / "sessions"
    return sorted(n for n in os.listdir(base) if not n.startswith(".")) if base.is_dir() else []


def snapshot(root: Path, sid: str) -> dict:
    """What a session holds, every view but the generation (random at each rebuild)."""
    directory = root / "sessions" / sid
    with memstore.read_session(root, sid) as reader:
        records = [(r.seq, r.ts, r.event) for r in reader.iter_records()]
    manifest = json.loads((directory / "manifest.json").read_bytes())
    manifest.pop("generation")
    index = directory / "index" / "session.db"
    return {
        "records": records,
        "manifest": manifest,
        "state": json.loads((directory / "derived" / "import-state.json").read_bytes()),
        "turns": _rows(index, "SELECT * FROM turns ORDER BY number"),
        "events": _rows(index, "SELECT * FROM events ORDER BY seq"),
    }


def store_snapshot(root: Path) -> dict:
    return {sid: snapshot(root, sid) for sid in session_dirs(root)}


def test_an_archive_imported_by_workers_equals_a_one_by_one_import(small_archive, tmp_path):
    reference = tmp_path / "reference"
    one_by_one(reference, small_archive)
    parallel = tmp_path / "parallel"
    report = memstore.import_logs(parallel, small_archive, jobs=2)
    here = tmp_path / "here"
    memstore.import_logs(here, small_archive, jobs=1)
    expected = store_snapshot(reference)
    assert len(expected) == 82
    assert store_snapshot(parallel) == expected
    assert store_snapshot(here) == expected
    assert report.sessions_created == 82 and not report.problems and report.sources == 82
    assert sorted(report.sessions) == sorted(expected)
    assert not [n for n in os.listdir(parallel / "sessions") if n.startswith(STAGING_PREFIX)]
    # Published sessions come with their search chunks, and open without a rescan.
    sid = sorted(expected)[0]
    assert _rows(parallel / "sessions" / sid / "index" / "session.db", "SELECT count(*) FROM chunks")[0][0] > 0
    assert memstore.search_memory(parallel, "the")


def test_published_sessions_are_marked_in_the_catalogs_change_feed(small_archive, tmp_path):
    """A store whose catalog reads a change feed learns of every session a batch published, so
    the next search sees them without a sweep."""
    from memstore.changes import marked

    root = tmp_path / "store"
    root.mkdir()
    memstore.refresh_catalog(root)  # the catalog makes the feed
    memstore.import_logs(root, small_archive, jobs=1)
    assert marked(root) >= set(session_dirs(root))
    hits = memstore.search_memory(root, "the", 50)
    assert hits


def test_a_second_import_finds_everything_unchanged(small_archive, tmp_path):
    root = tmp_path / "store"
    memstore.import_logs(root, small_archive, jobs=2)
    before = store_snapshot(root)
    again = memstore.import_logs(root, small_archive, jobs=2)
    assert (again.sessions_unchanged, again.sessions_created, again.events_appended) == (82, 0, 0)
    assert store_snapshot(root) == before


def test_published_sessions_open_without_a_rescan(small_archive, tmp_path, monkeypatch):
    root = tmp_path / "store"
    memstore.import_logs(root, small_archive, jobs=1)
    rescans = []
    monkeypatch.setattr(recovery, "_rescan", lambda *a, **k: rescans.append(a))
    for sid in session_dirs(root)[:20]:
        manifest = json.loads((root / "sessions" / sid / "manifest.json").read_bytes())
        with memstore.open_session(root, sid) as log:
            assert (log.event_count, log.turn_count) == (manifest["event_count"], manifest["turn_count"])
    assert rescans == []


def test_a_grown_source_is_resumed_into_its_published_session(tmp_path):
    sys.path.insert(0, str(Path(__file__).parent))
    from generate import CODEX_SID, codex_rollout

    data, _ = codex_rollout(60, seed=5)
    source = tmp_path / "src" / "rollout-2026-02-12T09-00-00-019c7777-5555-7000-8000-00000000e777.jsonl"
    source.parent.mkdir()
    cut = data.index(b"\n", len(data) // 2) + 1
    source.write_bytes(data[:cut])
    root = tmp_path / "store"
    first = memstore.import_logs(root, source)
    source.write_bytes(data)
    grown = memstore.import_logs(root, source)
    whole = tmp_path / "whole"
    memstore.import_logs(whole, source)
    assert (first.sessions_created, grown.sessions_updated) == (1, 1)
    assert snapshot(root, CODEX_SID)["records"] == snapshot(whole, CODEX_SID)["records"]


# --------------------------------------------------------------------------------------------
# Crashes

IMPORT = """
import sys, memstore
from memstore.importers import pipeline
pipeline.BATCH_SESSIONS = int(sys.argv[3])
def progress(done, total):
    sys.stdout.write(f"{done} {total}\\n")
    sys.stdout.flush()
memstore.import_logs(sys.argv[1], sys.argv[2], jobs=int(sys.argv[4]), progress=progress)
"""


def assert_whole_or_absent(root: Path, expected: dict, source_dir: Path) -> None:
    """Every session in the store is the whole session an uninterrupted import makes, and
    consistent: it opens without a rescan, the doctor finds nothing wrong, and its import state
    claims no more than its log and source hold."""
    sizes = {str(p): p.stat().st_size for p in source_dir.rglob("*.jsonl")}
    for sid in session_dirs(root):
        got = snapshot(root, sid)
        assert got == expected[sid], f"session {sid} is not whole"
        state = got["state"]
        assert state["next_seq"] <= got["manifest"]["next_seq"]
        assert state["events"] <= got["manifest"]["event_count"]
        assert state["offset"] <= sizes[state["source"]["path"]]
    if (root / "sessions").is_dir():
        # An import builds no catalog: that the doctor offers to make one is no inconsistency.
        problems = [p for p in memstore.Store(root).doctor().problems if p.check != "catalog" and not p.fixed]
        assert problems == []


def kill_part_way(root: Path, source_dir: Path, batch: int, jobs: int, fraction: float) -> bool:
    """Run an import in a child process and SIGKILL it once it has read ``fraction`` of the bytes
    it has to read; ``True`` if it was killed before it finished."""
    child = subprocess.Popen(
        [sys.executable, "-c", IMPORT, str(root), str(source_dir), str(batch), str(jobs)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert child.stdout is not None
    killed = False
    for line in child.stdout:
        done, total = map(int, line.split())
        if done >= fraction * total:
            killed = child.poll() is None
            child.send_signal(signal.SIGKILL)
            break
    child.stdout.close()
    child.wait(timeout=60)
    return killed and child.returncode == -signal.SIGKILL


@pytest.mark.slow
@pytest.mark.parametrize("jobs", [1, 2])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_an_archive_import_killed_at_any_moment_leaves_sessions_whole_or_absent(small_archive, tmp_path, seed, jobs):
    reference = tmp_path / "reference"
    memstore.import_logs(reference, small_archive, jobs=1)
    expected = store_snapshot(reference)
    root = tmp_path / "store"
    rng = random.Random(seed)
    killed = 0
    for _round in range(3):
        killed += kill_part_way(root, small_archive, rng.randint(3, 20), jobs, rng.uniform(0.1, 0.9))
        time.sleep(0.2)  # orphaned workers see their input close and stop
        assert_whole_or_absent(root, expected, small_archive)
    assert killed, "no round killed an import before it finished"
    report = memstore.import_logs(root, small_archive)
    assert store_snapshot(root) == expected
    assert report.sessions_created + report.sessions_unchanged == len(expected)
    assert not report.problems
    assert not [n for n in os.listdir(root / "sessions") if n.startswith(STAGING_PREFIX)]


@pytest.mark.slow
@pytest.mark.parametrize(("where", "nth"), [("sync_file_system", 2), ("rename_noreplace", 15), ("fsync_dir", 2)])
def test_an_import_killed_while_publishing_a_batch_loses_nothing(small_archive, tmp_path, where, nth):
    """Killed before a batch's sync, between two of its renames, or before the directory sync
    that makes them durable."""
    reference = tmp_path / "reference"
    memstore.import_logs(reference, small_archive, jobs=1)
    expected = store_snapshot(reference)
    root = tmp_path / "store"
    assert import_killed_at(root, small_archive, where, nth, batch=10) == -signal.SIGKILL
    published = session_dirs(root)
    assert 0 < len(published) < len(expected)
    assert_whole_or_absent(root, expected, small_archive)
    assert [n for n in os.listdir(root / "sessions") if n.startswith(STAGING_PREFIX)], "the staging area was left"
    report = memstore.import_logs(root, small_archive)
    assert store_snapshot(root) == expected
    assert (report.sessions_unchanged, report.sessions_created) == (len(published), len(expected) - len(published))
    assert not [n for n in os.listdir(root / "sessions") if n.startswith(STAGING_PREFIX)]


def test_a_staging_area_still_in_use_is_not_swept(small_archive, tmp_path):
    from memstore.importers.staging import Staging, sweep_abandoned

    root = tmp_path / "store"
    held = Staging.create(root)
    (held.area("main").staged("x")).mkdir()
    abandoned = Staging.create(root)
    abandoned.area("main").staged("y").mkdir()
    abandoned.close(remove=False)  # its process died: the lock is free
    assert sweep_abandoned(root) == [abandoned.path.name]
    assert held.path.is_dir() and not abandoned.path.exists()
    held.close()
    assert not held.path.exists()


# --------------------------------------------------------------------------------------------
# Others writing meanwhile


def test_a_session_tombstoned_while_its_source_was_staged_is_not_published(small_archive, tmp_path):
    root = tmp_path / "store"
    reference = tmp_path / "reference"
    memstore.import_logs(reference, small_archive, jobs=1)
    victim = session_dirs(reference)[7]
    recorded = []

    def progress(done: int, total: int) -> None:
        if not recorded:  # the first call: the run has looked at the tombstones already
            recorded.append(Tombstones(root).record(victim, TombstoneReason.FORGET))

    report = memstore.import_logs(root, small_archive, jobs=1, progress=progress)
    assert recorded and victim not in session_dirs(root)
    assert [t.session_id for t in report.tombstoned] == [victim]
    assert report.sessions_created == len(session_dirs(reference)) - 1
    assert victim not in report.sessions


def test_a_session_another_writer_created_meanwhile_is_imported_into_not_replaced(small_archive, tmp_path):
    root = tmp_path / "store"
    reference = tmp_path / "reference"
    memstore.import_logs(reference, small_archive, jobs=1)
    sids = session_dirs(reference)
    agent_made, imported_meanwhile = sids[3], sids[11]
    done = []

    def progress(_done: int, _total: int) -> None:
        if done:
            return
        done.append(True)
        # An agent opens one session on its own; another process imports the source of another.
        with memstore.open_session(root, agent_made) as log:
            log.append({"type": "turn.started"})
            log.append({"type": "item.completed", "item": {"id": "n1", "type": "agent_message", "text": "mine"}})
            log.append(
                {
                    "type": "turn.completed",
                    "usage": {
                        "input_tokens": 1,
                        "cached_input_tokens": 0,
                        "cache_creation_tokens": 0,
                        "output_tokens": 1,
                    },
                }
            )
        source = Path(snapshot(reference, imported_meanwhile)["state"]["source"]["path"])
        one_by_one(root, source)

    report = memstore.import_logs(root, small_archive, jobs=1, progress=progress)
    assert done
    with memstore.read_session(root, agent_made) as reader:
        assert [r.event["type"] for r in reader.iter_records()] == ["turn.started", "item.completed", "turn.completed"]
    assert any(p.reason.startswith(f"session {agent_made!r} exists and was not imported") for p in report.problems)
    assert snapshot(root, imported_meanwhile) == snapshot(reference, imported_meanwhile)
    assert set(session_dirs(root)) == set(sids)


def _workers_of(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid and b"memstore.importers.worker" in cmdline:
            found.append(int(entry))
    return found


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc to find the worker processes")
def test_the_tasks_of_a_worker_that_died_are_run_again(small_archive, tmp_path):
    reference = tmp_path / "reference"
    memstore.import_logs(reference, small_archive, jobs=1)
    root = tmp_path / "store"
    killed = []

    def progress(done: int, total: int) -> None:
        if not killed:
            workers = _workers_of(os.getpid())
            if workers:
                os.kill(workers[0], signal.SIGKILL)
                killed.append(workers[0])

    report = memstore.import_logs(root, small_archive, jobs=2, progress=progress)
    assert killed
    assert store_snapshot(root) == store_snapshot(reference)
    assert report.sessions_created == 82 and not report.problems


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc to find the worker processes")
def test_a_worker_killed_after_finishing_tasks_loses_none_of_them(small_archive, tmp_path, monkeypatch):
    """A worker killed past half the import, with answered tasks whose sessions are collected
    but not yet published: those stay staged and are published; only its undone tasks run
    again here. The import completes as one run with no worker would."""
    monkeypatch.setattr(pipeline_module, "TASK_FILES", 4)  # many tasks, so a worker has answered some
    reference = tmp_path / "reference"
    memstore.import_logs(reference, small_archive, jobs=1)
    root = tmp_path / "store"
    killed = []

    def progress(done: int, total: int) -> None:
        if not killed and total and done > total // 2:
            workers = _workers_of(os.getpid())
            if workers:
                os.kill(workers[0], signal.SIGKILL)
                killed.append(workers[0])

    report = memstore.import_logs(root, small_archive, jobs=2, progress=progress)
    assert killed
    assert store_snapshot(root) == store_snapshot(reference)
    assert report.sessions_created == 82 and not report.problems


def test_an_import_whose_workers_cannot_start_imports_everything_here(small_archive, tmp_path, monkeypatch):
    """Workers that end at once (an interpreter that cannot start them) leave no source out: their
    tasks, and every task never sent, run in the importing process."""
    reference = tmp_path / "reference"
    memstore.import_logs(reference, small_archive, jobs=1)
    monkeypatch.setattr(pipeline_module, "_WORKER_MAIN", "raise SystemExit(3)")
    monkeypatch.setattr(pipeline_module, "TASK_FILES", 4)  # many more tasks than workers
    root = tmp_path / "store"
    report = memstore.import_logs(root, small_archive, jobs=2)
    assert report.sessions_created == 82 and not report.problems
    assert store_snapshot(root) == store_snapshot(reference)


def test_workers_import_the_same_memstore_as_their_parent(small_archive, tmp_path):
    """A parent that found memstore through its own ``sys.path`` (not the working directory nor
    an installed copy) starts workers that import that same code."""
    script = (
        "import sys; sys.path.insert(0, sys.argv[1]); import memstore; "
        "r = memstore.import_logs(sys.argv[2], sys.argv[3], jobs=2); print(r.sessions_created, len(r.problems))"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [sys.executable, "-c", script, str(REPO), str(tmp_path / "store"), str(small_archive)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.stdout.split() == ["82", "0"], done.stderr
    assert "ended with" not in done.stderr  # no worker died


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc to find the worker processes")
def test_a_run_that_fails_stops_its_workers_and_a_rerun_completes(small_archive, tmp_path, monkeypatch):
    """A batch that cannot be published (a disk error, injected: no real disk fails on demand)
    stops the run with that error, its workers are stopped at once, and nothing half-made is
    left: the next import finishes the job."""
    from memstore.errors import StoreIOError
    from memstore.importers import staging

    reference = tmp_path / "reference"
    memstore.import_logs(reference, small_archive, jobs=1)
    root = tmp_path / "store"
    real = staging.Staging.publish

    def failing(self, staged):
        if staged:
            raise StoreIOError("syncfs", self.path, "Input/output error", 5)
        return real(self, staged)

    monkeypatch.setattr(pipeline_module, "BATCH_SESSIONS", 5)
    monkeypatch.setattr(staging.Staging, "publish", failing)
    with pytest.raises(StoreIOError):
        memstore.import_logs(root, small_archive, jobs=2)
    assert _workers_of(os.getpid()) == []
    assert not [n for n in os.listdir(root / "sessions") if n.startswith(STAGING_PREFIX)]
    monkeypatch.setattr(staging.Staging, "publish", real)
    report = memstore.import_logs(root, small_archive, jobs=2)
    assert store_snapshot(root) == store_snapshot(reference)
    assert not report.problems


# --------------------------------------------------------------------------------------------
# Progress


class _Status:
    def __init__(self) -> None:
        self.calls: list[tuple[int, int]] = []
        self.states: list[ImportProgress] = []

    def __call__(self, done: int, total: int) -> None:
        self.calls.append((done, total))

    def status(self, progress: ImportProgress) -> None:
        self.states.append(progress)


def test_progress_says_sessions_and_bytes_with_a_rate_and_a_time_left(small_archive, tmp_path):
    watcher = _Status()
    memstore.import_logs(tmp_path / "store", small_archive, jobs=2, progress=watcher)
    total = sum(p.stat().st_size for p in small_archive.rglob("*.jsonl"))
    assert watcher.calls[-1] == (total, total)
    assert [d for d, _ in watcher.calls] == sorted(d for d, _ in watcher.calls)
    last = watcher.states[-1]
    assert (last.sessions_done, last.sessions_total, last.bytes_done, last.bytes_total) == (82, 82, total, total)
    assert last.eta == 0.0 and last.rate > 0
    middle = [s for s in watcher.states if 0 < s.bytes_done < total]
    assert middle and all(s.eta is not None and s.eta > 0 for s in middle)
    assert [s.sessions_done for s in watcher.states] == sorted(s.sessions_done for s in watcher.states)


def test_the_progress_line_draws_sessions_bytes_rate_and_eta():
    clock = [0.0]
    stream = io.StringIO()
    line = ProgressLine(stream=stream, clock=lambda: clock[0])
    line.status(ImportProgress(0, 1000, 0, 684_400_000, 0.0, 0.0, None))
    clock[0] = 40.0
    line.status(ImportProgress(412, 1000, 280_100_000, 684_400_000, 12.0, 23_400_000.0, 17.3))
    line.close()
    lines = stream.getvalue().splitlines()
    assert lines[0] == "importing  0/1,000 sessions  0.0/684.4 MB  0.0 MB/s  ETA --"
    assert lines[1] == "importing  412/1,000 sessions  280.1/684.4 MB  23.4 MB/s  ETA 0:17"
    assert len(lines) == 2  # the last state was drawn already
