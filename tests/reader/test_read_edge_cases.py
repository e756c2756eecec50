"""Adversarial review of the read side: the reader, the index as read, the catalog refresh and
search_memory. Each test is a bug found by attacking one of their promises."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import orjson
import pytest

import memstore
from memstore.catalog import refresh_catalog
from memstore.session.index import readonly_uri

TURN_STARTED = {"type": "turn.started"}
TURN_COMPLETED = {"type": "turn.completed", "usage": {"input_tokens": 10, "output_tokens": 2}}


def message(text: str) -> dict:
    return {"type": "item.completed", "item": {"id": text, "type": "agent_message", "text": text}}


def write_turns(log, n: int, start: int = 0) -> None:
    for i in range(start, start + n):
        log.append(TURN_STARTED)
        log.append(message(f"widget turn {i + 1}"))
        log.append(TURN_COMPLETED)


def files(directory: Path) -> dict:
    """Every file under ``directory`` with its bytes and mtime."""
    out = {}
    for path in sorted(directory.rglob("*")):
        if path.is_file():
            st = path.stat()
            out[str(path.relative_to(directory))] = (path.read_bytes(), st.st_mtime_ns)
    return out


def catalog_rows(root: Path) -> dict:
    conn = sqlite3.connect(root / "catalog.db")
    try:
        return {
            "sessions": sorted(conn.execute("SELECT session_id, directory, turn_count, event_count FROM sessions")),
            "events": sorted(conn.execute("SELECT session_id, seq, type FROM events")),
            "chunks": sorted(conn.execute("SELECT chunk_id, session_id, source, text FROM chunks")),
        }
    finally:
        conn.close()


# --------------------------------------------------------------------------------------------
# The reader keeps the snapshot it opened on, and creates nothing, when a writer comes along


def _reader_at_rest(root: Path, sid: str = "s"):
    reader = memstore.read_session(root, sid)
    assert reader.index is not None and reader.index.immutable, "the index should be read at rest"
    return reader


def test_a_reader_opened_at_rest_keeps_its_snapshot_and_creates_nothing_when_a_writer_comes_and_goes(tmp_path):
    with memstore.open_session(tmp_path, "s") as log:
        write_turns(log, 3)
        log.append(TURN_STARTED)
        log.append(message("widget open"))
    directory = memstore.session_directory(tmp_path, "s")
    reader = _reader_at_rest(tmp_path)
    try:
        turns = reader.turns()
        assert [(t.number, t.status) for t in turns] == [
            (1, "completed"),
            (2, "completed"),
            (3, "completed"),
            (4, "open"),
        ]
        with memstore.open_session(tmp_path, "s") as log:
            log.append(TURN_COMPLETED)  # closes turn 4
            write_turns(log, 2, start=10)
        before = files(tmp_path)
        # Everything the reader says is still as of when it was opened.
        assert reader.turns() == turns
        assert reader.turn(4).status == "open"
        assert reader.turn(5) is None
        assert reader.position(reader.event_count + 1) is None
        assert reader.turn_count == 3 and reader.event_count == 11
        assert len(list(reader.underived_records())) == 11
        # And it created nothing (no -wal, no -shm) in the session.
        assert files(tmp_path) == before
        assert sorted(os.listdir(directory / "index")) == ["session.db"]
    finally:
        reader.close()
    assert sorted(os.listdir(directory / "index")) == ["session.db"]


@pytest.mark.parametrize("how", ["cap", "rebuild"])
def test_a_reader_opened_at_rest_survives_a_rewrite_of_the_session(tmp_path, how):
    """A cap rewrite or a rebuild while a reader is open: the reader still holds the old log, and
    answers from it, never from the new index's offsets into the new log."""
    with memstore.open_session(tmp_path, "s", max_events=0) as log:
        write_turns(log, 6)
    reader = _reader_at_rest(tmp_path)
    try:
        records = [(r.seq, r.event) for r in reader.iter_records()]
        turns = reader.turns()
        first_turn = reader.reconstruct_turn(1)
        if how == "cap":
            with memstore.open_session(tmp_path, "s", max_events=10) as log:
                write_turns(log, 1, start=6)  # evicts turns 1-4
        else:
            memstore.rebuild(tmp_path, "s", refresh=False)
        assert reader.turns() == turns
        assert reader.reconstruct_turn(1) == first_turn
        for seq, event in records:
            assert reader.record(seq).event == event
        assert [(r.seq, r.event) for r in reader.iter_records()] == records
        assert [r.seq for r in reader.underived_records()] == [seq for seq, _ in records]
    finally:
        reader.close()


def test_a_read_only_uri_never_creates_a_missing_index(tmp_path):
    """A rebuild deletes the index file before it makes a new one: a reader (or the catalog's
    ATTACH) opening it in that moment must fail, not create an empty database."""
    missing = tmp_path / "index" / "session.db"
    missing.parent.mkdir()
    with pytest.raises(sqlite3.Error):
        sqlite3.connect(readonly_uri(missing), uri=True).execute("SELECT 1").fetchall()
    assert os.listdir(missing.parent) == []


# --------------------------------------------------------------------------------------------
# Huge sessions: a reader's memory does not grow with the bytes it reads


def _vtcode_log(directory: Path, turns: int, output: str) -> int:
    directory.mkdir(parents=True)
    with open(directory / "events.jsonl", "wb") as fh:
        for t in range(turns):
            fh.write(orjson.dumps({"schema_version": "0.18.0", "event": TURN_STARTED}) + b"\n")
            for i in range(3):
                fh.write(
                    orjson.dumps(
                        {
                            "schema_version": "0.18.0",
                            "event": {
                                "type": "item.completed",
                                "item": {
                                    "id": f"{t}.{i}",
                                    "type": "command_execution",
                                    "command": "make",
                                    "aggregated_output": output,
                                },
                            },
                        }
                    )
                    + b"\n"
                )
            fh.write(orjson.dumps({"schema_version": "0.18.0", "event": TURN_COMPLETED}) + b"\n")
    return (directory / "events.jsonl").stat().st_size


def test_a_reader_of_a_log_without_an_index_does_not_hold_its_events(tmp_path):
    """A VT Code session (no index) was read into memory whole: every decoded event was kept
    for the catalog, more memory than the log's size."""
    import tracemalloc

    size = _vtcode_log(tmp_path / "sessions" / "vt", 500, "widget " * 1000)  # about 10 MB
    tracemalloc.start()
    try:
        with memstore.read_session(tmp_path, "vt") as reader:
            held, _ = tracemalloc.get_traced_memory()
            assert held < size / 10, f"the reader holds {held} bytes of a {size}-byte log"
            tracemalloc.reset_peak()
            count = 0
            for record in reader.underived_records():
                count += bool(record.event)
            _, peak = tracemalloc.get_traced_memory()
            assert count == 2500 and reader.record(2500).event == TURN_COMPLETED
            assert peak < size / 3, f"reading the records peaked at {peak} bytes of a {size}-byte log"
    finally:
        tracemalloc.stop()


def test_the_records_an_index_has_not_derived_are_read_a_bounded_batch_at_a_time(tmp_path, monkeypatch):
    import tracemalloc

    from memstore.session.tuning import TUNING

    monkeypatch.setattr(TUNING, "derive_idle_seconds", 3600)
    output = "widget " * 3000
    with memstore.open_session(tmp_path, "s", durability="none") as log:
        for i in range(300):
            log.append(TURN_STARTED)
            for j in range(3):
                log.append(
                    {
                        "type": "item.completed",
                        "item": {
                            "id": f"{i}.{j}",
                            "type": "command_execution",
                            "command": "make",
                            "aggregated_output": output,
                        },
                    }
                )
            log.append(TURN_COMPLETED)
    size = (memstore.session_directory(tmp_path, "s") / "events.jsonl").stat().st_size
    tracemalloc.start()
    try:
        with memstore.read_session(tmp_path, "s") as reader:
            assert reader.derived_seq == 0 and reader.indexed_seq == 1500
            tracemalloc.reset_peak()
            count = sum(1 for _record in reader.underived_records())
            _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert count == 1500
    assert peak < size / 3, f"reading the records peaked at {peak} bytes of a {size}-byte log"


# --------------------------------------------------------------------------------------------
# Sessions the catalog reads without an index (VT Code's)


def _vt(event: dict) -> bytes:
    return orjson.dumps({"schema_version": "0.18.0", "event": event}) + b"\n"


def _vt_turn(text: str) -> bytes:
    return _vt(TURN_STARTED) + _vt(message(text)) + _vt(TURN_COMPLETED)


def _vt_manifest(directory: Path, turns: int, events: int, base: int, length: int) -> None:
    (directory / "manifest.json").write_bytes(
        orjson.dumps(
            {
                "session_id": "vt",
                "schema_version": 1,
                "created_at": "2026-11-30T08:00:00Z",
                "updated_at": "2026-11-30T09:00:00Z",
                "turn_count": turns,
                "event_count": events,
                "status": "active",
                "in_turn": False,
                "persisted_file_len": length,
                "retained_turn_base": base,
            }
        )
    )


# --------------------------------------------------------------------------------------------
# search_memory's filters


@pytest.mark.parametrize(
    ("since", "found"), [("0001-01-01T00:30:00+01:00", True), ("9999-12-31T23:30:00-01:00", False)]
)
def test_since_at_the_ends_of_time_is_not_an_error(tmp_path, since, found):
    """Valid RFC 3339 times whose UTC instant falls before year 1 or after 9999 raised
    OverflowError (not even the documented ValueError)."""
    with memstore.open_session(tmp_path, "s") as log:
        write_turns(log, 1)
    hits = memstore.search_memory(tmp_path, "widget", since=since)
    assert [h.chunk_id for h in hits] == (["s:2:0"] if found else [])


def test_since_compares_times_not_strings(tmp_path):
    """Lines memstore did not write may carry a ts in another RFC 3339 form (an offset, no
    milliseconds): chunk times were compared with ``since`` as strings, so 10:00+02:00 (08:00Z)
    passed since=08:30Z."""
    directory = tmp_path / "sessions" / "s"
    directory.mkdir(parents=True)
    times = {
        "early": "2026-05-01T10:00:00+02:00",
        "later": "2026-05-01T08:45:00Z",
        "odd": "not a time",
        "late": "2026-05-01T09:15:00.5-00:30",
    }
    (directory / "events.jsonl").write_bytes(
        b"".join(
            orjson.dumps({"schema_version": "0.18.0", "seq": seq, "ts": ts, "event": message(f"widget {name}")}) + b"\n"
            for seq, (name, ts) in enumerate(times.items(), start=1)
        )
    )
    hits = memstore.search_memory(tmp_path, "widget", 10, since="2026-05-01T08:30:00Z")
    assert sorted((h.snippet, h.created_at) for h in hits) == [
        ("widget late", "2026-05-01T09:45:00.500Z"),
        ("widget later", "2026-05-01T08:45:00.000Z"),
    ]
    # The same when the chunks are copied from a session index (a rebuild derives them all).
    memstore.rebuild(tmp_path, "s")
    hits = memstore.search_memory(tmp_path, "widget", 10, since="2026-05-01T08:30:00Z")
    assert sorted(h.snippet for h in hits) == ["widget late", "widget later"]


@pytest.mark.parametrize("side", ["-wal", "-shm"])
def test_a_reader_creates_no_side_file_when_only_one_is_there(tmp_path, side):
    """A writer closing deletes -shm before -wal, and one opening creates them one after the
    other; a killed writer or a copy can leave one alone. The read-only open SQLite does then
    creates the other."""
    with memstore.open_session(tmp_path, "s") as log:
        write_turns(log, 2)
        log.append(TURN_STARTED)
    index = memstore.session_directory(tmp_path, "s") / "index" / "session.db"
    Path(f"{index}{side}").touch()
    before = files(tmp_path)
    with memstore.read_session(tmp_path, "s") as reader:
        assert (reader.turn_count, reader.event_count) == (2, 7)
        assert [t.status for t in reader.turns()] == ["completed", "completed", "open"]
        assert reader.record(5).event == message("widget turn 2")
    assert files(tmp_path) == before
    refresh_catalog(tmp_path)
    assert files(tmp_path / "sessions") == {
        k[len("sessions/") :]: v for k, v in before.items() if k.startswith("sessions/")
    }
    assert catalog_rows(tmp_path)["sessions"] == [("s", "s", 2, 7)]


@pytest.mark.parametrize("name", ["index/session.db", "index/session.db-wal", "derived/memory.json"])
def test_a_session_with_a_symlinked_view_is_still_searched(tmp_path, name):
    """The reader refuses to follow a symlinked index (or WAL, or memory view) and reads the
    log instead; the catalog took the session for no session at all, silently."""
    with memstore.open_session(tmp_path, "s") as log:
        write_turns(log, 1)
    path = memstore.session_directory(tmp_path, "s") / name
    if path.exists():
        path.unlink()
    (tmp_path / "elsewhere").write_bytes(b"{}")
    path.symlink_to(tmp_path / "elsewhere")
    report = refresh_catalog(tmp_path)
    assert report.added == ["s"] and not report.errors
    assert [h.chunk_id for h in memstore.search_memory(tmp_path, "widget")] == ["s:2:0"]
    assert (tmp_path / "elsewhere").read_bytes() == b"{}"


def test_a_session_without_times_reads_the_same_every_time(tmp_path):
    """A VT Code log (no ts) without its manifest: every reader made its times up from the
    clock, so the catalog's row changed with each copy and differed from a refresh from
    scratch. The log's modification time is the session's time instead."""
    import time

    directory = tmp_path / "store" / "sessions" / "vt"
    directory.mkdir(parents=True)
    (directory / "events.jsonl").write_bytes(_vt_turn("widget"))
    os.utime(directory / "events.jsonl", (1_700_000_000, 1_700_000_000))
    with memstore.read_session(tmp_path / "store", "vt") as reader:
        first = (reader.manifest.created_at, reader.manifest.updated_at)
    time.sleep(0.01)
    with memstore.read_session(tmp_path / "store", "vt") as reader:
        assert (
            (reader.manifest.created_at, reader.manifest.updated_at)
            == first
            == ("2023-11-14T22:13:20.000Z", "2023-11-14T22:13:20.000Z")
        )
    refresh_catalog(tmp_path / "store")
    conn = sqlite3.connect(tmp_path / "store" / "catalog.db")
    assert conn.execute("SELECT created_at, updated_at FROM sessions").fetchall() == [first]
    conn.close()


def test_search_results_are_the_rows_it_ranked_even_if_a_refresh_runs_meanwhile(tmp_path, monkeypatch):
    """search_memory ranked, then read the hits' rows in another transaction: a refresh in
    between (another process's search, say) that recopied a session could give their ids to
    other chunks, and the results paired one chunk's score with another's text."""
    from memstore.search import SearchIndex

    with memstore.open_session(tmp_path, "s", max_events=0) as log:
        for i in range(4):
            log.append(TURN_STARTED)
            log.append(message(f"widget old {i}"))
            log.append(TURN_COMPLETED)
    memstore.search_memory(tmp_path, "widget")
    ranked = SearchIndex.search

    def search_then_refresh(self, *args, **kwargs):
        hits = ranked(self, *args, **kwargs)
        with memstore.open_session(tmp_path, "s", max_events=6) as log:  # evicts turns 1-3
            log.append(TURN_STARTED)
            log.append(message("fresh text"))
            log.append(TURN_COMPLETED)
        refresh_catalog(tmp_path)  # recopies the session: its old chunks' ids are free again
        return hits

    monkeypatch.setattr(SearchIndex, "search", search_then_refresh)
    hits = memstore.search_memory(tmp_path, "widget", 10)
    assert all("widget" in h.snippet for h in hits)
    assert sorted((h.chunk_id, h.snippet) for h in hits) == sorted(
        (f"s:{3 * i + 2}:0", f"widget old {i}") for i in range(4)
    )


def test_a_reader_reopened_while_a_writer_works_keeps_to_that_generation(tmp_path):
    """After a writer's arrival made the reader reopen its index the usual read-only way, a
    cap rewrite by that writer went unnoticed: the reopened connection read each query afresh,
    and paired the new index's offsets with the old log."""
    with memstore.open_session(tmp_path, "s", max_events=0) as log:
        write_turns(log, 6)
    reader = _reader_at_rest(tmp_path)
    try:
        records = [(r.seq, r.event) for r in reader.iter_records()]
        turns = reader.turns()
        log = memstore.open_session(tmp_path, "s", max_events=0)
        try:
            write_turns(log, 1, start=6)
            log.flush()
            assert reader.turns() == turns  # reopened, same generation
            assert not reader.index.immutable
            log.max_events = 10
            write_turns(log, 1, start=7)  # a cap rewrite: turns 1-5 evicted, offsets moved
            log.flush()
            assert reader.turns() == turns
            for seq, event in records:
                assert reader.record(seq).event == event
            assert [r.seq for r in reader.underived_records()] == [seq for seq, _ in records]
        finally:
            log.close()
    finally:
        reader.close()
