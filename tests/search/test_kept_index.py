"""The kept index: a process keeps one search cache per catalog file and reuses it across calls,
connections and threads, reading again only the segments that changed; and it stays correct
while other processes change the catalog (a change is seen at the next query)."""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import memstore
from memstore.bm25 import SearchIndex
from memstore.catalog import refresh_catalog
from memstore.layout import catalog_path
from memstore.search import index_cache, kept_index, search_catalog, search_memory

REPO = Path(__file__).resolve().parents[2]


def write_session(root: Path, session_id: str, texts: list[str]) -> None:
    with memstore.open_session(root, session_id) as log:
        log.append({"type": "turn.started"}, ts="2026-11-30T08:00:00.000Z")
        for i, text in enumerate(texts):
            log.append(
                {"type": "item.completed", "item": {"id": f"m{i}", "type": "agent_message", "text": text}},
                ts="2026-11-30T08:00:01.000Z",
            )
        log.append({"type": "turn.completed", "usage": {}}, ts="2026-11-30T08:00:02.000Z")


def store_with_sessions(root: Path, count: int = 3) -> None:
    """``count`` sessions, each refreshed into the catalog on its own (a segment each)."""
    for n in range(count):
        write_session(
            root,
            f"s{n}",
            [f"the widget number {n} is blue", f"cargo test run {n} failed", "unrelated words about the ocean"],
        )
        refresh_catalog(root)


def read_only(root: Path) -> sqlite3.Connection:
    return sqlite3.connect(f"{catalog_path(root).absolute().as_uri()}?mode=ro", uri=True, check_same_thread=False)


def segment_count(root: Path) -> int:
    conn = read_only(root)
    try:
        return conn.execute("SELECT count(*) FROM search_segments").fetchone()[0]
    finally:
        conn.close()


def test_a_second_search_memory_on_an_unchanged_store_reads_no_segment_again(tmp_path):
    store_with_sessions(tmp_path)
    first = search_memory(tmp_path, "widget blue", 10, recency=False)  # recency moves with the clock
    cache = index_cache(catalog_path(tmp_path))
    loaded = cache.segment_loads
    assert loaded == segment_count(tmp_path) > 1
    second = search_memory(tmp_path, "widget blue", 10, recency=False)
    other = search_memory(tmp_path, "cargo failed", 10)
    assert cache.segment_loads == loaded  # no segment's arrays were read again
    assert second == first and len(first) == 3 and other
    # Another connection (any path to the same file) shares it.
    conn = sqlite3.connect(tmp_path / "." / "catalog.db")
    assert kept_index(conn).cache is cache
    assert search_catalog(conn, "widget blue", limit=10, root=tmp_path, recency=False).results == first
    conn.close()
    assert cache.segment_loads == loaded


def test_the_kept_index_is_the_same_as_a_fresh_one(tmp_path):
    store_with_sessions(tmp_path, 4)
    conn = read_only(tmp_path)
    for query in ["widget", "blue ocean", "cargo test failed", "number 2", "nothing here"]:
        for recency in (True, False):
            kept = kept_index(conn).search(query, 20, recency=recency, now="2026-12-01T00:00:00Z")
            fresh = SearchIndex(conn).search(query, 20, recency=recency, now="2026-12-01T00:00:00Z")
            assert kept == fresh
    conn.close()


CHILD = """
import sys
sys.path.insert(0, sys.argv[1])
import memstore
from memstore.catalog import refresh_catalog
root, sid, action = sys.argv[2], sys.argv[3], sys.argv[4]
if action == "add":
    with memstore.open_session(root, sid) as log:
        log.append({"type": "turn.started"})
        log.append({"type": "item.completed", "item": {"id": "m", "type": "agent_message",
                                                       "text": "a zebra crossed the widget road"}})
        log.append({"type": "turn.completed", "usage": {}})
refresh_catalog(root)
"""


def run_child(root: Path, session_id: str, action: str) -> None:
    subprocess.run([sys.executable, "-c", CHILD, str(REPO), str(root), session_id, action], check=True, timeout=120)


def test_a_session_refreshed_by_another_process_is_seen_and_only_its_segment_is_read(tmp_path):
    store_with_sessions(tmp_path)
    conn = read_only(tmp_path)  # kept open across the other process's refresh, never refreshed here
    before = search_catalog(conn, "widget zebra", limit=10)
    assert before.total == 3 and all(r.session_id != "new" for r in before.results)
    cache = kept_index(conn).cache
    loaded = cache.segment_loads
    segments = segment_count(tmp_path)

    run_child(tmp_path, "new", "add")

    after = search_catalog(conn, "widget zebra", limit=10)
    assert after.total == 4
    assert after.results[0].session_id == "new" and after.results[0].snippet == "a zebra crossed the widget road"
    assert segment_count(tmp_path) == segments + 1
    assert cache.segment_loads == loaded + 1  # the new segment only
    # And it ranks as a fresh index over the changed catalog does.
    now = "2026-12-01T00:00:00Z"
    assert kept_index(conn).search("widget zebra", 10, now=now) == SearchIndex(conn).search("widget zebra", 10, now=now)
    conn.close()


def test_a_session_removed_by_another_process_leaves_the_kept_index_at_once(tmp_path):
    store_with_sessions(tmp_path)
    conn = read_only(tmp_path)
    assert {r.session_id for r in search_catalog(conn, "widget", limit=10).results} == {"s0", "s1", "s2"}
    shutil.rmtree(tmp_path / "sessions" / "s1")
    run_child(tmp_path, "s1", "refresh")
    page = search_catalog(conn, "widget", limit=10)
    assert {r.session_id for r in page.results} == {"s0", "s2"} and page.total == 2
    assert kept_index(conn).search("widget", 10, recency=False) == SearchIndex(conn).search("widget", 10, recency=False)
    conn.close()


def test_a_catalog_deleted_and_built_again_is_searched_as_it_now_is(tmp_path):
    store_with_sessions(tmp_path)
    assert len(search_memory(tmp_path, "widget", 10)) == 3
    cache = index_cache(catalog_path(tmp_path))
    for suffix in ("", "-wal", "-shm"):
        Path(f"{catalog_path(tmp_path)}{suffix}").unlink(missing_ok=True)
    shutil.rmtree(tmp_path / "sessions" / "s0")
    write_session(tmp_path, "s9", ["a widget of another store"])
    hits = search_memory(tmp_path, "widget", 10)  # refreshes: a new catalog file, new segments
    assert sorted(h.session_id for h in hits) == ["s1", "s2", "s9"]
    assert index_cache(catalog_path(tmp_path)) is cache


def test_threads_with_their_own_connections_share_one_cache(tmp_path):
    """The explorer's case: each of Datasette's threads has its own connection."""
    store_with_sessions(tmp_path, 4)
    expected = search_catalog(read_only(tmp_path), "widget blue cargo", limit=8, recency=False).results
    cache = index_cache(catalog_path(tmp_path))
    loaded = cache.segment_loads
    found: list = []
    errors: list = []

    def worker() -> None:
        try:
            conn = read_only(tmp_path)
            for _ in range(20):
                found.append(search_catalog(conn, "widget blue cargo", limit=8, recency=False).results)
            conn.close()
        except BaseException as exc:  # reported below, in the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    assert len(found) == 80 and all(results == expected for results in found)
    assert cache.segment_loads == loaded
