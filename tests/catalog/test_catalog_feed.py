"""The change feed and the sweep: a refresh costs what changed. memstore's own writes reach the
next search through the feed, without a walk of the sessions; what other writers do is found
by the sweep, at most every sweep interval; a change made while a refresh reads a session is
never lost; and a refresh killed at any point leaves a catalog the next refresh completes to
exactly the one built from scratch."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from catalog_support import content, from_scratch, turn, vt_line, write_turns

import memstore
from memstore import changes
from memstore.catalog import refresh as catalog_refresh
from memstore.catalog import refresh_catalog
from memstore.layout import changes_dir

REPO = Path(__file__).resolve().parents[2]


def markers(root) -> list[str]:
    directory = changes_dir(root)
    return sorted(os.listdir(directory)) if directory.is_dir() else []


class StatCounter:
    """Counts the ``os.stat``/``os.lstat``/``os.scandir`` calls that look into ``sessions/``."""

    def __init__(self, monkeypatch, root):
        self.calls: list[str] = []
        sessions = os.path.join(os.fspath(root), "sessions")
        for name in ("stat", "lstat", "scandir"):
            real = getattr(os, name)

            def counting(path=".", *args, _real=real, _name=name, **kwargs):
                if isinstance(path, (str, os.PathLike)) and os.fspath(path).startswith(sessions):
                    self.calls.append(f"{_name} {os.fspath(path)}")
                return _real(path, *args, **kwargs)

            monkeypatch.setattr(os, name, counting)


def test_a_search_of_an_unchanged_store_looks_at_no_session(tmp_path, monkeypatch):
    """With nothing in the feed and no sweep due, a search reads the catalog and nothing else:
    not one stat of a session directory (before the feed, every search stat'ed five files of
    every session)."""
    for sid in ("a", "b", "c"):
        with memstore.open_session(tmp_path, sid) as log:
            turn(log, 1)
    store = memstore.Store(tmp_path, sweep_interval=3600)
    assert {h.session_id for h in store.search("widget", limit=20)} == {"a", "b", "c"}
    assert markers(tmp_path) == []
    counter = StatCounter(monkeypatch, tmp_path)
    for _ in range(3):
        assert len(store.search("widget", limit=20)) == 9
    assert counter.calls == []
    store.close()


def test_memstore_writes_reach_the_next_search_through_the_feed(tmp_path, monkeypatch):
    """A writer marks the session it published; the next search copies that session alone (no
    sweep), and takes the marker away once its rows are committed."""
    for sid in ("a", "b"):
        with memstore.open_session(tmp_path, sid) as log:
            turn(log, 1)
    store = memstore.Store(tmp_path, sweep_interval=3600)
    store.search("widget")
    with memstore.open_session(tmp_path, "a") as log:
        log.append({"type": "turn.started"})
        log.append({"type": "item.completed", "item": {"id": "z", "type": "agent_message", "text": "zebra crossing"}})
        log.append({"type": "turn.completed", "usage": {}})
    assert markers(tmp_path) == ["a"]
    counter = StatCounter(monkeypatch, tmp_path)
    assert [h.session_id for h in store.search("zebra")] == ["a"]
    assert not any("/sessions/b" in call for call in counter.calls), counter.calls
    assert markers(tmp_path) == []
    monkeypatch.undo()
    store.close()
    assert content(tmp_path) == from_scratch(tmp_path, tmp_path)


def test_other_writers_are_found_by_the_sweep_at_most_every_interval(tmp_path):
    """VT Code appending to its own log marks nothing: the sweep finds it, when the last sweep
    is older than the sweep interval, or when a full refresh is asked for."""
    with memstore.open_session(tmp_path, "mine") as log:
        turn(log, 1)
    vt = tmp_path / "sessions" / "vt"
    vt.mkdir()
    (vt / "events.jsonl").write_bytes(vt_line({"type": "turn.started"}))
    lazy = memstore.Store(tmp_path, sweep_interval=3600)
    eager = memstore.Store(tmp_path, sweep_interval=0)
    assert {h.session_id for h in lazy.search("widget", limit=50)} == {"mine"}
    with open(vt / "events.jsonl", "ab") as fh:
        fh.write(vt_line({"type": "item.completed", "item": {"id": "x", "type": "agent_message", "text": "quokka"}}))
    assert lazy.search("quokka") == []  # no marker, no sweep due: not seen yet
    assert [h.session_id for h in eager.search("quokka")] == ["vt"]  # its sweep is always due
    with open(vt / "events.jsonl", "ab") as fh:
        fh.write(vt_line({"type": "item.completed", "item": {"id": "y", "type": "agent_message", "text": "wombat"}}))
    assert lazy.search("wombat") == []
    report = lazy.refresh(full=False)  # asked for: the feed and a sweep
    assert report.mode == "sweep" and report.updated == ["vt"]
    assert [h.session_id for h in lazy.search("wombat")] == ["vt"]
    lazy.close()
    eager.close()


def test_a_sweep_another_process_ran_counts(tmp_path):
    """The time of the last sweep is in the catalog: a process whose own sweep is due does not
    sweep again when another swept within the interval (a CLI search after the explorer's)."""
    with memstore.open_session(tmp_path, "a") as log:
        turn(log, 1)
    refresh_catalog(tmp_path)  # a full check counts as a sweep
    store = memstore.Store(tmp_path, sweep_interval=60)
    calls = []
    real = catalog_refresh.sweep
    catalog_refresh.sweep = lambda *a, **k: calls.append(1) or real(*a, **k)
    try:
        store.search("widget")
    finally:
        catalog_refresh.sweep = real
    assert calls == []
    store.close()


def test_a_change_made_while_the_refresh_reads_the_session_is_not_lost(tmp_path, monkeypatch):
    """The marker is taken up (renamed) before the session is read: a writer that publishes
    after that makes a new marker, which the next refresh takes up, though the refresh that was
    reading recorded the session's stamp from before its read."""
    with memstore.open_session(tmp_path, "s") as log:
        turn(log, 1)
    store = memstore.Store(tmp_path, sweep_interval=3600)
    store.search("widget")
    with memstore.open_session(tmp_path, "s") as log:
        turn(log, 2)
    real = catalog_refresh.read_copy
    written = []

    def read_then_write(examined, previous, redactor):
        copy = real(examined, previous, redactor)
        if not written:
            written.append(1)
            with memstore.open_session(tmp_path, "s") as log:  # after the read, before the commit
                log.append({"type": "turn.started"})
                log.append({"type": "item.completed", "item": {"id": "q", "type": "agent_message", "text": "narwhal"}})
                log.append({"type": "turn.completed", "usage": {}})
        return copy

    monkeypatch.setattr(catalog_refresh, "read_copy", read_then_write)
    assert store.search("narwhal") == []  # this refresh read the session before the narwhal
    assert markers(tmp_path) == ["s"]  # the writer's new marker, not the one taken up
    assert [h.session_id for h in store.search("narwhal")] == ["s"]
    monkeypatch.undo()
    store.close()
    assert content(tmp_path) == from_scratch(tmp_path, tmp_path)


def test_markers_a_killed_refresh_took_up_are_taken_up_again(tmp_path):
    """``.processing-`` markers left by a refresh that died before its commit are the next
    refresh's work, whoever runs it."""
    with memstore.open_session(tmp_path, "a") as log:
        turn(log, 1)
    store = memstore.Store(tmp_path, sweep_interval=3600)
    store.search("widget")
    with memstore.open_session(tmp_path, "a") as log:
        log.append({"type": "turn.started"})
        log.append({"type": "item.completed", "item": {"id": "k", "type": "agent_message", "text": "kestrel"}})
        log.append({"type": "turn.completed", "usage": {}})
    assert changes.claim(tmp_path) == ["a"]  # as a refresh does before it reads; then it died
    assert markers(tmp_path) == [".processing-a"]
    assert changes.pending(tmp_path)
    assert [h.session_id for h in store.search("kestrel")] == ["a"]
    assert markers(tmp_path) == []
    store.close()


def test_retention_and_set_asides_mark_what_they_move_or_remove(tmp_path):
    """A removal or a rename is a change too: retention's removal and an import's set-aside mark
    the directories they touch, and the next search sees it without a sweep (the set-aside
    session under its new id, every event kept; the removed one gone)."""
    from memstore.importers.setaside import set_aside_session
    from memstore.retention import RetentionPolicy, apply_retention_preserving

    for sid in ("keep", "old", "moved"):
        with memstore.open_session(tmp_path, sid) as log:
            turn(log, 1)
            log.append(
                {
                    "type": "thread.completed",
                    "thread_id": sid,
                    "session_id": sid,
                    "subtype": "success",
                    "outcome_code": "completed",
                    "usage": {},
                    "num_turns": 1,
                }
            )
    store = memstore.Store(tmp_path, sweep_interval=3600)
    assert {h.session_id for h in store.search("widget", limit=50)} == {"keep", "old", "moved"}
    new_id = set_aside_session(tmp_path, "moved", "its source was rewritten")
    assert markers(tmp_path) == sorted(["moved", new_id])
    assert {h.session_id for h in store.search("widget", limit=50)} == {"keep", "old", new_id}
    assert markers(tmp_path) == []
    report = apply_retention_preserving(tmp_path, RetentionPolicy(max_sessions=0), "keep", apply=True)
    assert sorted(r.session_id for r in report.removed) == sorted(["old", new_id])
    assert markers(tmp_path) == sorted(["old", new_id])
    assert {h.session_id for h in store.search("widget", limit=50)} == {"keep"}
    store.close()


def test_a_marker_is_never_written_through_a_symlinked_feed(tmp_path):
    """``changes`` is created by memstore; one that is a symlink is not written through."""
    (tmp_path / "sessions").mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "changes").symlink_to(elsewhere)
    changes.mark_changed(tmp_path, "s")
    assert os.listdir(elsewhere) == []
    assert changes.claim(tmp_path) is None  # the refresh then looks at every session instead


def test_a_session_outside_a_store_marks_nothing(tmp_path):
    changes.mark_session_changed(tmp_path / "loose" / "s")
    changes.mark_changed(tmp_path, "../escape")
    changes.mark_changed(tmp_path, ".hidden")
    assert not (tmp_path / "changes").exists()


def test_marked_names_new_and_taken_up_markers_without_taking_any(tmp_path):
    """``marked`` (what a process that cannot write the store reads) names the sessions of new
    and taken-up markers, ignores names no session directory has, and renames nothing."""
    (tmp_path / "sessions").mkdir()
    assert changes.marked(tmp_path) == set()  # no feed yet
    assert changes.ensure_feed(tmp_path)
    changes.mark_changed(tmp_path, "a")
    changes.mark_changed(tmp_path, "b")
    assert changes.claim(tmp_path) == ["a", "b"]
    changes.mark_changed(tmp_path, "c")
    (changes_dir(tmp_path) / ".tmp-junk").write_bytes(b"")
    before = markers(tmp_path)
    assert changes.marked(tmp_path) == {"a", "b", "c"}
    assert markers(tmp_path) == before
    changes.release(tmp_path, ["a", "b"])
    assert changes.marked(tmp_path) == {"c"}


# --------------------------------------------------------------------------------------------
# Writers and refreshes at the same time


def test_concurrent_writers_while_searches_refresh_lose_nothing(tmp_path):
    """Writers append turns to several sessions while another thread searches (each search
    taking up the feed) as fast as it can; once the writers are done, one more search with no
    sweep (the feed alone) gives exactly the catalog built from scratch."""
    sids = [f"w{i}" for i in range(4)]
    for sid in sids:
        with memstore.open_session(tmp_path, sid) as log:
            write_turns(log, 1)
    store = memstore.Store(tmp_path, sweep_interval=3600)
    store.search("widget")
    stop = threading.Event()
    errors: list[BaseException] = []

    def search_all_the_time():
        while not stop.is_set():
            try:
                store.search("widget", limit=3)
            except BaseException as exc:  # reported by the test
                errors.append(exc)
                return

    def write(sid: str):
        try:
            for n in range(12):
                with memstore.open_session(tmp_path, sid) as log:
                    write_turns(log, 1, start=n + 1)
        except BaseException as exc:
            errors.append(exc)

    searcher = threading.Thread(target=search_all_the_time)
    searcher.start()
    writers = [threading.Thread(target=write, args=(sid,)) for sid in sids]
    for w in writers:
        w.start()
    for w in writers:
        w.join()
    stop.set()
    searcher.join()
    assert errors == []
    hits = store.search("widget", limit=5)
    assert not hits.missing
    store.close()
    assert content(tmp_path) == from_scratch(tmp_path, tmp_path)


# --------------------------------------------------------------------------------------------
# A refresh killed at any point


_REFRESH_CHILD = """
import sys
sys.path.insert(0, sys.argv[1])
import memstore
memstore.Store(sys.argv[2], sweep_interval=float(sys.argv[3])).search("widget")
print("done", flush=True)
"""


def _build_store(root: Path, sessions: int, turns: int) -> None:
    rng = random.Random(7)
    for i in range(sessions):
        with memstore.open_session(root, f"s{i:03d}") as log:
            for _ in range(turns):
                turn(log, rng.randrange(1000), fail=rng.random() < 0.1)


def _refresh_in_child(root: Path, sweep: float, kill_after: float) -> bool:
    child = subprocess.Popen(
        [sys.executable, "-c", _REFRESH_CHILD, str(REPO), str(root), str(sweep)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        child.wait(timeout=kill_after)
        return True
    except subprocess.TimeoutExpired:
        child.send_signal(signal.SIGKILL)
        child.wait()
        return False


@pytest.mark.slow
def test_a_refresh_killed_at_random_points_is_completed_by_the_next(tmp_path, monkeypatch):
    """kill -9 of a refresh (a first build, then feed refreshes of a store being written) at
    random moments: the next refresh always leaves the catalog built from scratch would be."""
    monkeypatch.setattr(catalog_refresh, "BATCH_SESSIONS", 4)
    root = tmp_path / "store"
    _build_store(root, 24, 6)
    started = time.monotonic()
    assert _refresh_in_child(root, 3600, 600)
    whole = time.monotonic() - started
    rng = random.Random(11)
    scratch = from_scratch(root, tmp_path)
    for attempt in range(6):
        (root / "catalog.db").unlink()
        for side in ("-wal", "-shm"):
            Path(f"{root / 'catalog.db'}{side}").unlink(missing_ok=True)
        killed = not _refresh_in_child(root, 3600, rng.uniform(0.2, whole))
        memstore.Store(root, sweep_interval=3600).search("widget")
        assert content(root) == scratch, f"attempt {attempt} (killed: {killed})"
    # Feed refreshes killed while sessions are written: markers taken up, batches half done.
    for attempt in range(4):
        for i in rng.sample(range(24), 6):
            with memstore.open_session(root, f"s{i:03d}") as log:
                turn(log, rng.randrange(1000))
        killed = not _refresh_in_child(root, 3600, rng.uniform(0.05, 1.0))
        store = memstore.Store(root, sweep_interval=3600)
        store.search("widget")
        store.close()
        assert content(root) == from_scratch(root, tmp_path), f"feed attempt {attempt} (killed: {killed})"
