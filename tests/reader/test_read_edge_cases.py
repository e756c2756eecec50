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
        assert [(t.number, t.status) for t in turns] == [(1, "completed"), (2, "completed"), (3, "completed"),
                                                          (4, "open")]
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


def test_the_catalog_creates_nothing_when_an_index_vanishes_under_it(tmp_path, monkeypatch):
    import memstore.catalog as catalog

    with memstore.open_session(tmp_path, "s") as log:
        write_turns(log, 2)
    index = memstore.session_directory(tmp_path, "s") / "index" / "session.db"
    opened = catalog.read_session_dir

    def open_then_lose_the_index(directory):
        reader = opened(directory)
        index.unlink()  # a rebuild discarding it, between the reader's open and the ATTACH
        return reader

    monkeypatch.setattr(catalog, "read_session_dir", open_then_lose_the_index)
    report = refresh_catalog(tmp_path)
    assert report.added == ["s"] and not report.errors
    assert not index.exists(), "the refresh created an empty index in the session"
    assert catalog_rows(tmp_path)["sessions"] == [("s", "s", 2, 6)]


# --------------------------------------------------------------------------------------------
# The catalog


def test_memory_facts_of_a_hashed_id_do_not_collide_with_another_sessions_event_chunks(tmp_path):
    """Session ``x:5``'s first fact was chunk ``x:5:0``, which is also session ``x``'s event 5:
    the UNIQUE chunk_id refused it, and session ``x:5`` was never in the catalog. The reference
    names a fact ``<dir>:<index>`` (a directory name has no ``:``)."""
    with memstore.open_session(tmp_path, "x") as log:
        write_turns(log, 2)  # seq 5 is "widget turn 2"
    with memstore.open_session(tmp_path, "x:5") as log:
        write_turns(log, 1)
        directory = log.directory
    (directory / "derived" / "memory.json").write_bytes(orjson.dumps(
        {"session_id": "x:5", "grounded_facts": [{"fact": "the widget is blue", "source": "user_assertion"}]}))
    report = refresh_catalog(tmp_path)
    assert not report.errors and sorted(report.added) == ["x", "x:5"]
    hits = memstore.search_memory(tmp_path, "widget", 20)
    assert {(h.session_id, h.chunk_id) for h in hits if h.source == "session"} == {("x:5", f"{directory.name}:0")}
    assert {h.chunk_id for h in hits if h.source == "event"} == {"x:2:0", "x:5:0", "x:5:2:0"}


@pytest.mark.parametrize("damage", ["unlink", "symlink", "directory", "after-stat"])
def test_a_directory_that_is_no_longer_a_session_is_forgotten(tmp_path, monkeypatch, damage):
    """A refresh from scratch does not list a directory without a regular events.jsonl; an
    incremental one kept its old rows for ever."""
    from memstore import catalog

    for sid in ("a", "b"):
        with memstore.open_session(tmp_path, sid) as log:
            write_turns(log, 1)
    refresh_catalog(tmp_path)
    events = memstore.session_directory(tmp_path, "b") / "events.jsonl"
    (events.parent / "manifest.json").touch()  # the session changed since
    if damage == "after-stat":
        opened = catalog.read_session_dir

        def remove_then_open(directory):
            if directory.name == "b":
                events.unlink()  # between the refresh's stat and its reading
            return opened(directory)

        monkeypatch.setattr(catalog, "read_session_dir", remove_then_open)
    elif damage == "unlink":
        events.unlink()
    elif damage == "symlink":
        target = tmp_path / "elsewhere.jsonl"
        events.rename(target)
        events.symlink_to(target)
    else:
        events.unlink()
        events.mkdir()
    report = refresh_catalog(tmp_path)
    assert report.removed == ["b"]
    assert [row[0] for row in catalog_rows(tmp_path)["sessions"]] == ["a"]
    assert all(row[0] == "a" for row in catalog_rows(tmp_path)["events"])
    assert {h.session_id for h in memstore.search_memory(tmp_path, "widget", 20)} == {"a"}


def test_a_catalog_with_the_old_fact_ids_renames_them_at_its_next_refresh(tmp_path):
    with memstore.open_session(tmp_path, "x:5") as log:
        write_turns(log, 1)
        directory = log.directory
    (directory / "derived" / "memory.json").write_bytes(orjson.dumps(
        {"session_id": "x:5", "grounded_facts": [{"fact": "the widget is blue", "source": "user_assertion"}]}))
    refresh_catalog(tmp_path)
    conn = sqlite3.connect(tmp_path / "catalog.db")
    with conn:  # as the catalog of the previous version named it, and forget the migration
        conn.execute("UPDATE chunks SET chunk_id = 'x:5:0' WHERE source = 'session'")
        conn.execute("DELETE FROM _sqlite_migrations WHERE name = 'fact_ids_by_directory'")
    conn.close()
    report = refresh_catalog(tmp_path)
    assert report.updated == ["x:5"] and not report.errors
    assert [h.chunk_id for h in memstore.search_memory(tmp_path, "blue")] == [f"{directory.name}:0"]


# --------------------------------------------------------------------------------------------
# Huge sessions: a reader's memory does not grow with the bytes it reads


def _vtcode_log(directory: Path, turns: int, output: str) -> int:
    directory.mkdir(parents=True)
    with open(directory / "events.jsonl", "wb") as fh:
        for t in range(turns):
            fh.write(orjson.dumps({"schema_version": "0.18.0", "event": TURN_STARTED}) + b"\n")
            for i in range(3):
                fh.write(orjson.dumps({"schema_version": "0.18.0", "event": {"type": "item.completed", "item": {
                    "id": f"{t}.{i}", "type": "command_execution", "command": "make",
                    "aggregated_output": output}}}) + b"\n")
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
                log.append({"type": "item.completed", "item": {"id": f"{i}.{j}", "type": "command_execution",
                                                               "command": "make", "aggregated_output": output}})
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
    (directory / "manifest.json").write_bytes(orjson.dumps({
        "session_id": "vt", "schema_version": 1, "created_at": "2026-11-30T08:00:00Z",
        "updated_at": "2026-11-30T09:00:00Z", "turn_count": turns, "event_count": events, "status": "active",
        "in_turn": False, "persisted_file_len": length, "retained_turn_base": base}))


def _catalog_from_scratch(root: Path, tmp_path: Path) -> dict:
    import shutil

    copy = tmp_path / "scratch"
    shutil.rmtree(copy, ignore_errors=True)
    copy.mkdir()
    shutil.copytree(root / "sessions", copy / "sessions", symlinks=True)
    refresh_catalog(copy)
    return catalog_rows(copy)


def test_a_session_vtcode_rewrote_is_recopied_not_grown(tmp_path):
    """A session without a memstore index has no generation: when VT Code's cap rewrite replaced
    its log and it then grew past the rows the catalog had, the refresh took it for grown and
    kept the evicted events' rows beside the new ones."""
    root = tmp_path / "store"
    directory = root / "sessions" / "vt"
    directory.mkdir(parents=True)
    log = b"".join(_vt_turn(f"widget old {i}") for i in range(4))
    (directory / "events.jsonl").write_bytes(log)
    _vt_manifest(directory, 4, 12, 1, len(log))
    assert refresh_catalog(root).added == ["vt"]
    # VT Code evicts turns 1-2 (the log is replaced by its last two turns), then appends three.
    kept = b"".join(_vt_turn(f"widget old {i}") for i in (2, 3))
    log = kept + b"".join(_vt_turn(f"widget new {i}") for i in range(3))
    (directory / "events.jsonl.tmp").write_bytes(log)
    os.replace(directory / "events.jsonl.tmp", directory / "events.jsonl")
    _vt_manifest(directory, 7, 15, 3, len(log))
    refresh_catalog(root)
    assert catalog_rows(root) == _catalog_from_scratch(root, tmp_path)
    assert not any("old 0" in row[3] or "old 1" in row[3] for row in catalog_rows(root)["chunks"])


# --------------------------------------------------------------------------------------------
# The catalog and a session index it cannot use


def _derived_session(root: Path) -> Path:
    with memstore.open_session(root, "s") as log:
        write_turns(log, 3)
    memstore.rebuild(root, "s", refresh=False)  # derives every record: the watermark is at 9
    with memstore.read_session(root, "s") as reader:
        assert reader.derived_seq == reader.indexed_seq == 9
    return memstore.session_directory(root, "s") / "index" / "session.db"


def test_the_catalog_copies_every_record_when_it_cannot_attach_the_index(tmp_path, monkeypatch):
    """Without the ATTACH the records came from the reader's underived ones only: those the
    index had derived were never copied (and, the seq recorded, never would be)."""
    from memstore import catalog

    _derived_session(tmp_path)
    monkeypatch.setattr(catalog, "_attach", lambda conn, path: None)
    assert refresh_catalog(tmp_path).added == ["s"]
    rows = catalog_rows(tmp_path)
    assert [row[1] for row in rows["events"]] == list(range(1, 10))
    assert [row[0] for row in rows["chunks"]] == ["s:2:0", "s:5:0", "s:8:0"]
    monkeypatch.undo()
    assert rows == _catalog_from_scratch(tmp_path, tmp_path)


def test_a_refresh_that_finds_a_half_made_index_reads_the_session_again(tmp_path, monkeypatch):
    """A rebuild discards the index and creates the new file empty before it writes the
    template: an ATTACH in that moment found no tables, and the refresh failed the session."""
    from memstore import catalog

    index = _derived_session(tmp_path)
    opened = catalog.read_session_dir
    calls = []

    def open_then_empty_the_index(directory):
        reader = opened(directory)
        if not calls:
            index.unlink()
            index.touch()  # the new file, before its first byte
        calls.append(directory)
        return reader

    monkeypatch.setattr(catalog, "read_session_dir", open_then_empty_the_index)
    report = refresh_catalog(tmp_path)
    assert report.added == ["s"] and not report.errors
    assert [row[1] for row in catalog_rows(tmp_path)["events"]] == list(range(1, 10))


def test_a_torn_read_of_an_index_read_immutable_reads_the_session_again(tmp_path, monkeypatch):
    """An index at rest is attached immutable (no locks): a writer checkpointing into it
    meanwhile can make a query fail as well as return torn rows. Either way the session is
    read again, not skipped."""
    from memstore import catalog

    index = _derived_session(tmp_path)
    copy = catalog._copy_records
    calls = []

    def torn_once(conn, reader, *args):
        if not calls:
            calls.append(1)
            os.utime(index, ns=(1, 1))  # a writer touched the file...
            raise sqlite3.DatabaseError("database disk image is malformed")  # ...mid-query
        return copy(conn, reader, *args)

    monkeypatch.setattr(catalog, "_copy_records", torn_once)
    report = refresh_catalog(tmp_path)
    assert report.added == ["s"] and not report.errors
    assert [row[1] for row in catalog_rows(tmp_path)["events"]] == list(range(1, 10))


# --------------------------------------------------------------------------------------------
# search_memory's filters


@pytest.mark.parametrize(("since", "found"), [("0001-01-01T00:30:00+01:00", True), ("9999-12-31T23:30:00-01:00", False)])
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
    times = {"early": "2026-05-01T10:00:00+02:00", "later": "2026-05-01T08:45:00Z", "odd": "not a time",
             "late": "2026-05-01T09:15:00.5-00:30"}
    (directory / "events.jsonl").write_bytes(b"".join(
        orjson.dumps({"schema_version": "0.18.0", "seq": seq, "ts": ts, "event": message(f"widget {name}")}) + b"\n"
        for seq, (name, ts) in enumerate(times.items(), start=1)))
    hits = memstore.search_memory(tmp_path, "widget", 10, since="2026-05-01T08:30:00Z")
    assert sorted((h.snippet, h.created_at) for h in hits) == [
        ("widget late", "2026-05-01T09:45:00.500Z"), ("widget later", "2026-05-01T08:45:00.000Z")]
    # The same when the chunks are copied from a session index (a rebuild derives them all).
    memstore.rebuild(tmp_path, "s")
    hits = memstore.search_memory(tmp_path, "widget", 10, since="2026-05-01T08:30:00Z")
    assert sorted(h.snippet for h in hits) == ["widget late", "widget later"]


def test_a_catalog_with_chunk_times_as_the_log_wrote_them_normalizes_them(tmp_path):
    with memstore.open_session(tmp_path, "s") as log:
        write_turns(log, 1)
    memstore.search_memory(tmp_path, "widget")
    conn = sqlite3.connect(tmp_path / "catalog.db")
    with conn:  # as an older catalog copied them, and forget the migration
        conn.execute("UPDATE chunks SET created_at = '2026-05-01T10:00:00+02:00'")
        conn.execute("DELETE FROM _sqlite_migrations WHERE name = 'normal_chunk_times'")
    conn.close()
    assert [h.created_at for h in memstore.search_memory(tmp_path, "widget")] == ["2026-05-01T08:00:00.000Z"]


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
    assert files(tmp_path / "sessions") == {k[len("sessions/"):]: v for k, v in before.items()
                                            if k.startswith("sessions/")}
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
        assert (reader.manifest.created_at, reader.manifest.updated_at) == first == (
            "2023-11-14T22:13:20.000Z", "2023-11-14T22:13:20.000Z")
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
    assert sorted((h.chunk_id, h.snippet) for h in hits) == sorted((f"s:{3 * i + 2}:0", f"widget old {i}")
                                                                   for i in range(4))


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


def test_a_catalog_of_the_previous_layout_recopies_only_the_sessions_it_cannot_trust(tmp_path):
    """A catalog from before the log tails were kept: sessions with an index have a
    generation that tells a rewrite, and are not recopied for the upgrade; those read from
    their log alone (generation 0) might have been rewritten unnoticed, and are."""
    with memstore.open_session(tmp_path, "mine") as log:
        write_turns(log, 1)
    directory = tmp_path / "sessions" / "vt"
    directory.mkdir()
    (directory / "events.jsonl").write_bytes(_vt_turn("widget"))
    refresh_catalog(tmp_path)
    conn = sqlite3.connect(tmp_path / "catalog.db")
    with conn:
        conn.execute("UPDATE catalog_state SET log_bytes = NULL, tail = NULL, stamp = ''")
    conn.close()
    report = refresh_catalog(tmp_path)
    assert report.recopied == ["vt"] and report.updated == ["mine"]
