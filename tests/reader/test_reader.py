"""read_session: a reader that never locks and never writes, and sees everything flushed."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import support

import memstore
from memstore.session.lock import is_live

TURN_STARTED = {"type": "turn.started"}
TURN_COMPLETED = {"type": "turn.completed", "usage": {"input_tokens": 10, "output_tokens": 2}}


def message(text: str) -> dict:
    return {"type": "item.completed", "item": {"id": text, "type": "agent_message", "text": text}}


def vtcode_line(event: dict) -> bytes:
    import orjson

    return orjson.dumps({"schema_version": "0.18.0", "event": event}) + b"\n"


def snapshot(directory: Path) -> dict:
    """Every file under ``directory`` with its bytes and mtime, SQLite's shared-memory file
    excepted (WAL readers record their read marks in it by design)."""
    files = {}
    for path in sorted(directory.rglob("*")):
        if path.is_file() and not path.name.endswith("-shm"):
            st = path.stat()
            files[str(path.relative_to(directory))] = (path.read_bytes(), st.st_mtime_ns, st.st_mode)
    return files


def write_turns(log, n: int, start: int = 0) -> None:
    for i in range(start, start + n):
        log.append(TURN_STARTED)
        log.append(message(f"turn {i + 1}"))
        log.append(TURN_COMPLETED)


WRITER = textwrap.dedent("""
    import sys, memstore
    log = memstore.open_session(sys.argv[1], "live")
    log.append({"type": "thread.started", "thread_id": "live"})
    for i in range(3):
        log.append({"type": "turn.started"})
        log.append({"type": "item.completed", "item": {"id": str(i), "type": "agent_message", "text": f"turn {i + 1}"}})
        log.append({"type": "turn.completed", "usage": {"input_tokens": 1}})
    log.append({"type": "turn.started"})
    log.flush()
    print("ready", flush=True)
    sys.stdin.readline()
    log.close()
""")


def test_a_reader_never_locks_nor_writes_while_another_process_writes(tmp_path):
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(tmp_path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert writer.stdout.readline().strip() == "ready"
        directory = memstore.session_directory(tmp_path, "live")
        assert is_live(directory)
        before = snapshot(tmp_path)
        with memstore.read_session(tmp_path, "live") as reader:
            assert reader.turn_count == 3 and reader.event_count == 11
            assert [(t.number, t.status) for t in reader.turns()] == [
                (1, "completed"),
                (2, "completed"),
                (3, "completed"),
                (4, "open"),
            ]
            assert reader.reconstruct_turn(2)[1]["item"]["text"] == "turn 2"
            assert reader.record(1).event == {"type": "thread.started", "thread_id": "live"}
            assert [r.seq for r in reader.iter_records()] == list(range(1, 12))
        assert snapshot(tmp_path) == before, "the reader changed, created or removed a file"
        assert is_live(directory), "the writer lost its lock"
        # The writer is undisturbed: it can go on and close.
        writer.stdin.write("\n")
        writer.stdin.flush()
        assert writer.wait(timeout=30) == 0
    finally:
        writer.kill()


def test_a_reader_sees_lines_past_its_index_without_touching_anything(tmp_path):
    with memstore.open_session(tmp_path, "s") as log:
        write_turns(log, 2)
    directory = memstore.session_directory(tmp_path, "s")
    # VT Code (or a writer that crashed before indexing) appended a turn and a torn line.
    with open(directory / "events.jsonl", "ab") as fh:
        fh.write(vtcode_line(TURN_STARTED) + vtcode_line(message("ahead")) + vtcode_line(TURN_COMPLETED))
        fh.write(b'{"schema_version":"0.18.0","seq":99,"ev')
    before = snapshot(tmp_path)
    with memstore.read_session(tmp_path, "s") as reader:
        assert reader.turn_count == 3 and reader.event_count == 9
        assert reader.reconstruct_turn(3) == [TURN_STARTED, message("ahead"), TURN_COMPLETED]
        assert reader.turns()[-1].input_tokens == 10
        assert reader.record(8).event == message("ahead")
        assert reader.record_line(8) == vtcode_line(message("ahead"))
        with pytest.raises(memstore.EventNotFound):
            reader.record(10)  # the torn line is ignored, not read
    assert snapshot(tmp_path) == before  # the torn tail is not cut by a reader
    with memstore.open_session(tmp_path, "s") as log:  # the writer catches up the same way
        assert (log.turn_count, log.event_count) == (3, 9)


def test_a_reader_of_a_session_without_an_index_reads_the_log(tmp_path):
    directory = tmp_path / "sessions" / "vt"
    directory.mkdir(parents=True)
    (directory / "events.jsonl").write_bytes(
        b"".join(
            vtcode_line(e)
            for e in ({"type": "thread.started", "thread_id": "vt"}, TURN_STARTED, message("hello"), TURN_COMPLETED)
        )
    )
    before = snapshot(tmp_path)
    with memstore.read_session(tmp_path, "vt") as reader:
        assert (reader.turn_count, reader.event_count) == (1, 4)
        assert [r.seq for r in reader.iter_records()] == [1, 2, 3, 4]
        assert reader.record(3).event == message("hello")
        assert reader.manifest.status == "active"
    assert snapshot(tmp_path) == before
    assert not (directory / "index").exists()


def test_read_only_copy_of_a_store(tmp_path):
    """A store on a read-only filesystem (a tmpfs remounted read-only) reads fine."""
    with support.tmpfs(tmp_path / "ro") as mount:
        with memstore.open_session(mount, "s") as log:
            write_turns(log, 2)
            log.append(TURN_STARTED)
        support.remount_read_only(mount)
        with memstore.read_session(mount, "s") as reader:
            assert (reader.turn_count, reader.event_count) == (2, 7)
            assert reader.reconstruct_turn(1)[1] == message("turn 1")


def test_missing_sessions_and_bad_ids(tmp_path):
    with pytest.raises(memstore.SessionNotFound):
        memstore.read_session(tmp_path, "nope")
    (tmp_path / "sessions" / "empty").mkdir(parents=True)
    with pytest.raises(memstore.SessionNotFound):
        memstore.read_session(tmp_path, "empty")
    with pytest.raises(memstore.InvalidSessionId):
        memstore.read_session(tmp_path, "..")
    assert sorted(p.name for p in (tmp_path / "sessions").iterdir()) == ["empty"]


def test_a_symlinked_session_is_refused(tmp_path):
    with memstore.open_session(tmp_path / "real", "s") as log:
        write_turns(log, 1)
    (tmp_path / "sessions").mkdir()
    (tmp_path / "sessions" / "s").symlink_to(memstore.session_directory(tmp_path / "real", "s"))
    with pytest.raises(memstore.StoreIOError, match="symlink"):
        memstore.read_session(tmp_path, "s")


def test_a_reader_works_on_an_index_of_the_first_format(tmp_path):
    """An index memstore 0.1 wrote (user_version 1, no migrations table) is not read: the
    reader reads the log, and the next writer rebuilds the index."""
    import sqlite3

    with memstore.open_session(tmp_path, "s") as log:
        write_turns(log, 2)
    index = memstore.session_directory(tmp_path, "s") / "index" / "session.db"
    index.unlink()
    conn = sqlite3.connect(index)
    conn.executescript("""
        CREATE TABLE manifest (id INTEGER PRIMARY KEY, session_id TEXT, turn_count INTEGER);
        CREATE TABLE turns (number INTEGER PRIMARY KEY, status TEXT);
        CREATE TABLE events (id INTEGER PRIMARY KEY, seq INTEGER);
        INSERT INTO manifest VALUES (1, 's', 99);
        PRAGMA user_version = 1;
    """)
    conn.close()
    with memstore.read_session(tmp_path, "s") as reader:
        assert reader.turn_count == 2
    with memstore.open_session(tmp_path, "s") as log:
        assert log.turn_count == 2 and [t.number for t in log.turns()] == [1, 2]
    conn = sqlite3.connect(index)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == 2
    assert ("memstore.session.index", "log_tables_3") in conn.execute(
        "SELECT migration_set, name FROM _sqlite_migrations"
    ).fetchall()
    conn.close()


def test_seqs_of_vtcode_lines_survive_cap_rewrites_and_rebuilds(tmp_path):
    directory = tmp_path / "sessions" / "vt"
    directory.mkdir(parents=True)
    lines = []
    for i in range(4):
        lines += [TURN_STARTED, message(f"vt {i}"), TURN_COMPLETED]
    (directory / "events.jsonl").write_bytes(b"".join(vtcode_line(e) for e in lines))
    with memstore.read_session(tmp_path, "vt") as reader:
        before = {r.seq: r.event for r in reader.iter_records()}
    assert sorted(before) == list(range(1, 13))
    with memstore.open_session(tmp_path, "vt", max_events=10) as log:
        log.append(TURN_STARTED)  # 13 > 10: turns 1 and 2 are evicted
        assert log.manifest.retained_turn_base == 3
        after = {r.seq: r.event for r in log.iter_records()}
    assert after == {**{s: e for s, e in before.items() if s >= 7}, 13: TURN_STARTED}
    # The first retained line (written by VT Code, without a seq) now says its seq.
    first = (directory / "events.jsonl").read_bytes().split(b"\n", 1)[0]
    assert first.startswith(b'{"retained_turn_base":3,"seq":7,')
    # Delete every view: the log alone gives the same seqs and turn numbers.
    shutil.rmtree(directory / "index")
    os.unlink(directory / "manifest.json")
    with memstore.read_session(tmp_path, "vt") as reader:
        assert {r.seq: r.event for r in reader.iter_records()} == after
        assert [t.number for t in reader.turns()] == [3, 4, 5]
    memstore.rebuild(tmp_path, "vt")
    with memstore.read_session(tmp_path, "vt") as reader:
        assert {r.seq: r.event for r in reader.iter_records()} == after
        assert reader.position(8) is not None and reader.record(8).event == message("vt 2")


def test_hashed_ids_are_recorded_in_the_log(tmp_path):
    with memstore.open_session(tmp_path, "team/agent:7") as log:
        write_turns(log, 1)
        directory = log.directory
    shutil.rmtree(directory / "index")
    os.unlink(directory / "manifest.json")
    from memstore.reader import read_session_dir

    with read_session_dir(directory) as reader:
        assert reader.session_id == "team/agent:7"
        assert reader.manifest.session_id == "team/agent:7"
