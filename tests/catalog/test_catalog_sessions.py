"""The catalog and the sessions it reads: indexes that vanish, are half made or torn under it,
directories that stop being sessions, sessions VT Code rewrote, ids that look alike. Each test
is a bug that was found and fixed."""

from __future__ import annotations

import os
import shutil
import sqlite3
from pathlib import Path

import orjson
import pytest
from catalog_support import TURN_COMPLETED, TURN_STARTED, catalog_rows, content, from_scratch, message, write_turns

import memstore
from memstore.catalog import copy as catalog_copy
from memstore.catalog import refresh_catalog
from memstore.session.index import IndexChanged


def test_the_catalog_creates_nothing_when_an_index_vanishes_under_it(tmp_path, monkeypatch):
    """A rebuild deletes the index before it makes a new one: the refresh must read the session
    anyway (from its log), and never create an empty index in the session."""
    with memstore.open_session(tmp_path, "s") as log:
        write_turns(log, 2)
    index = memstore.session_directory(tmp_path, "s") / "index" / "session.db"
    opened = catalog_copy.read_session_dir

    def open_then_lose_the_index(directory):
        reader = opened(directory)
        index.unlink()  # a rebuild discarding it, between the reader's open and its reads
        return reader

    monkeypatch.setattr(catalog_copy, "read_session_dir", open_then_lose_the_index)
    report = refresh_catalog(tmp_path)
    assert report.added == ["s"] and not report.errors
    assert not index.exists(), "the refresh created an empty index in the session"
    assert catalog_rows(tmp_path)["sessions"] == [("s", "s", 2, 6)]


def test_memory_facts_of_a_hashed_id_do_not_collide_with_another_sessions_event_chunks(tmp_path):
    """Session ``x:5``'s first fact was chunk ``x:5:0``, which is also session ``x``'s event 5:
    the UNIQUE chunk_id refused it, and session ``x:5`` was never in the catalog. The reference
    names a fact ``<dir>:<index>`` (a directory name has no ``:``)."""
    with memstore.open_session(tmp_path, "x") as log:
        write_turns(log, 2)  # seq 5 is "widget turn 2"
    with memstore.open_session(tmp_path, "x:5") as log:
        write_turns(log, 1)
        directory = log.directory
    (directory / "derived" / "memory.json").write_bytes(
        orjson.dumps(
            {"session_id": "x:5", "grounded_facts": [{"fact": "the widget is blue", "source": "user_assertion"}]}
        )
    )
    report = refresh_catalog(tmp_path)
    assert not report.errors and sorted(report.added) == ["x", "x:5"]
    hits = memstore.search_memory(tmp_path, "widget", 20)
    assert {(h.session_id, h.chunk_id) for h in hits if h.source == "session"} == {("x:5", f"{directory.name}:0")}
    assert {h.chunk_id for h in hits if h.source == "event"} == {"x:2:0", "x:5:0", "x:5:2:0"}


@pytest.mark.parametrize("damage", ["unlink", "symlink", "directory", "after-stat"])
def test_a_directory_that_is_no_longer_a_session_is_forgotten(tmp_path, monkeypatch, damage):
    """A refresh from scratch does not list a directory without a regular events.jsonl; an
    incremental one kept its old rows for ever."""
    for sid in ("a", "b"):
        with memstore.open_session(tmp_path, sid) as log:
            write_turns(log, 1)
    refresh_catalog(tmp_path)
    events = memstore.session_directory(tmp_path, "b") / "events.jsonl"
    (events.parent / "manifest.json").touch()  # the session changed since
    if damage == "after-stat":
        opened = catalog_copy.read_session_dir

        def remove_then_open(directory):
            if Path(directory).name == "b":
                events.unlink()  # between the refresh's stat and its reading
            return opened(directory)

        monkeypatch.setattr(catalog_copy, "read_session_dir", remove_then_open)
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


def test_a_catalog_of_an_older_layout_is_set_aside_and_built_again(tmp_path):
    """A catalog an older memstore wrote (another layout, other migrations) is not patched up
    in place: it is kept beside, and the new one equals a catalog built from scratch."""
    with memstore.open_session(tmp_path, "s") as log:
        write_turns(log, 2)
    refresh_catalog(tmp_path)
    conn = sqlite3.connect(tmp_path / "catalog.db")
    with conn:  # the layout of the previous memstore, by name
        conn.execute("UPDATE _sqlite_migrations SET name = 'tables_4' WHERE name = 'tables_5'")
        conn.execute("UPDATE chunks SET text = 'stale'")
    conn.close()
    # (the two hits differ by recency alone, which two writes in one millisecond do not order)
    assert sorted(h.chunk_id for h in memstore.search_memory(tmp_path, "widget")) == ["s:2:0", "s:5:0"]
    assert list(tmp_path.glob("catalog.db.unreadable-*"))
    assert content(tmp_path) == from_scratch(tmp_path, tmp_path)


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


def _catalog_from_scratch(root: Path, tmp_path: Path) -> dict:
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


def test_the_catalog_copies_every_record_when_it_cannot_use_the_index(tmp_path):
    """An index the reader cannot use (here: not a database) leaves every record to the log:
    all of them are copied, the same rows as from the index."""
    index = _derived_session(tmp_path)
    expected = _catalog_from_scratch(tmp_path, tmp_path)
    index.write_bytes(b"not a database" * 100)
    assert refresh_catalog(tmp_path).added == ["s"]
    rows = catalog_rows(tmp_path)
    assert [row[1] for row in rows["events"]] == list(range(1, 10))
    assert [row[0] for row in rows["chunks"]] == ["s:2:0", "s:5:0", "s:8:0"]
    assert rows == expected


def test_a_refresh_that_finds_a_half_made_index_reads_the_session_again(tmp_path, monkeypatch):
    """A rebuild discards the index and creates the new file empty before it writes the
    template: a read in that moment found no tables, and the refresh failed the session."""
    index = _derived_session(tmp_path)
    opened = catalog_copy.read_session_dir
    calls = []

    def open_then_empty_the_index(directory):
        reader = opened(directory)
        if not calls:
            index.unlink()
            index.touch()  # the new file, before its first byte
        calls.append(directory)
        return reader

    monkeypatch.setattr(catalog_copy, "read_session_dir", open_then_empty_the_index)
    report = refresh_catalog(tmp_path)
    assert report.added == ["s"] and not report.errors
    assert [row[1] for row in catalog_rows(tmp_path)["events"]] == list(range(1, 10))


def test_an_index_rewritten_while_it_is_read_reads_the_session_again(tmp_path, monkeypatch):
    """An index rebuilt or rewritten by a writer while the refresh reads it (what the reader
    calls ``IndexChanged``) describes another log: the session is read again, not skipped."""
    _derived_session(tmp_path)
    read = catalog_copy._log_copy
    calls = []

    def rewritten_once(*args):
        if not calls:
            calls.append(1)
            raise IndexChanged("read index", "session.db", "it was rebuilt or rewritten while it was read")
        return read(*args)

    monkeypatch.setattr(catalog_copy, "_log_copy", rewritten_once)
    report = refresh_catalog(tmp_path)
    assert report.added == ["s"] and not report.errors
    assert [row[1] for row in catalog_rows(tmp_path)["events"]] == list(range(1, 10))


def test_a_session_always_rewritten_while_it_is_read_is_reported_not_copied_half(tmp_path, monkeypatch):
    """A session whose index keeps changing under every read is left out with a reason (and
    reported by searches as missing), never copied from a mix of two generations."""
    _derived_session(tmp_path)

    def always_rewritten(*args):
        raise IndexChanged("read index", "session.db", "it was rebuilt or rewritten while it was read")

    monkeypatch.setattr(catalog_copy, "_log_copy", always_rewritten)
    report = refresh_catalog(tmp_path)
    assert not report.added and [name for name, _ in report.errors] == ["s"]
    assert "kept being rewritten" in report.errors[0][1]
    assert catalog_rows(tmp_path)["sessions"] == []
    missing = memstore.search_memory(tmp_path, "widget").missing
    assert [m.directory for m in missing] == ["s"]
