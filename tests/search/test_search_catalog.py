"""search_catalog: the search of a catalog as it is (no refresh, nothing written). It ranks and
hydrates exactly as search_memory does, pages through one ranking (pages put together are the
ranking; ``total`` is the number of hits, filters applied), and the explorer's search page is
its results."""

from __future__ import annotations

import random
import sqlite3
from pathlib import Path

import pytest
from bm25_reference import build, random_rows

import memstore
from memstore.catalog import refresh_catalog
from memstore.explorer.data import search_data
from memstore.explorer.urls import Urls
from memstore.layout import catalog_path
from memstore.search import SearchPage, fts_match, query_terms, search_catalog, search_memory, snippet

WORDS = "cargo test widget blue ocean borrow error rust build failed passed deploy".split()


def write_store(root: Path, sessions: int = 4, turns: int = 6, seed: int = 5) -> None:
    rng = random.Random(seed)
    for n in range(sessions):
        with memstore.open_session(root, f"s{n}") as log:
            for t in range(turns):
                ts = f"2026-11-{10 + t:02d}T08:00:00.000Z"
                log.append({"type": "turn.started"}, ts=ts)
                log.append(
                    {
                        "type": "item.completed",
                        "item": {
                            "id": f"m{t}",
                            "type": "agent_message",
                            "text": " ".join(rng.choices(WORDS, k=rng.randint(3, 12))),
                        },
                    },
                    ts=ts,
                )
                log.append(
                    {
                        "type": "item.completed",
                        "item": {
                            "id": f"c{t}",
                            "type": "command_execution",
                            "command": "cargo test",
                            "aggregated_output": " ".join(rng.choices(WORDS, k=30)),
                            "exit_code": 1,
                            "status": "failed",
                        },
                    },
                    ts=ts,
                )
                log.append({"type": "turn.completed", "usage": {}}, ts=ts)
    refresh_catalog(root)


def read_only(root: Path) -> sqlite3.Connection:
    return sqlite3.connect(f"{catalog_path(root).absolute().as_uri()}?mode=ro", uri=True)


def test_search_catalog_gives_what_search_memory_gives(tmp_path):
    write_store(tmp_path)
    conn = read_only(tmp_path)
    for query in ["widget", "cargo borrow", "blue ocean deploy", "nothing"]:
        expected = search_memory(tmp_path, query, 10, recency=False)
        page = search_catalog(conn, query, limit=10, recency=False, root=tmp_path)
        assert page.results == expected
        relative = search_catalog(conn, query, limit=10, recency=False)
        assert [r.path for r in relative.results] == [f"sessions/{r.session_id}/events.jsonl" for r in expected]
        filtered = search_catalog(conn, query, limit=10, recency=False, session="s1", root=tmp_path)
        assert filtered.results == search_memory(tmp_path, query, 10, session_id="s1", recency=False)
    conn.close()


def test_pages_put_together_are_the_ranking_and_total_counts_every_hit(tmp_path):
    write_store(tmp_path)
    conn = read_only(tmp_path)
    now_independent = dict(recency=False)
    for query, filters in [
        ("widget", {}),
        ("cargo failed", {}),
        ("blue", {"session": "s2"}),
        ("error", {"since": "2026-11-13"}),
        ("rust", {"source": "event"}),
        ("deploy", {"source": "session"}),
    ]:
        whole = search_catalog(conn, query, limit=1000, **filters, **now_independent)
        assert whole.total == len(whole.results)
        pages = [search_catalog(conn, query, limit=7, offset=o, **filters, **now_independent) for o in range(0, 60, 7)]
        assert [r for p in pages for r in p.results] == whole.results[:63]
        assert all(p.total == whole.total for p in pages)
        assert all(isinstance(p, SearchPage) and p.limit == 7 for p in pages)
    assert search_catalog(conn, "widget", limit=0).results == []
    assert search_catalog(conn, "widget", limit=0).total == search_catalog(conn, "widget", limit=1000).total > 0
    conn.close()


def test_total_is_the_number_of_hits_with_filters_and_min_score(tmp_path):
    """The engine's count_matches against its own unlimited search, on random chunks."""
    rows = random_rows(random.Random(8), 600)
    conn, index = build(tmp_path, rows)
    now = "2026-11-30T12:00:00Z"
    for query in ["rust", "cargo test error", "blue whale", "über x_y", "zzz"]:
        for where, params in [(None, ()), ("session_id = ?", ("s1",)), ("created_at >= ?", ("2026-09-01",))]:
            for min_score in (0.0, 2.0, 4.0):
                every = index.search(query, 100_000, min_score=min_score, where=where, params=params, now=now)
                assert index.count_matches(query, min_score=min_score, where=where, params=params, now=now) == len(
                    every
                )


def test_counting_past_the_probe_limit_reads_the_filter_instead(tmp_path, monkeypatch):
    import memstore.bm25.query as query

    rows = random_rows(random.Random(9), 400)
    conn, index = build(tmp_path, rows)
    expected = len(index.search("rust", 100_000, where="session_id = ?", params=("s2",)))
    monkeypatch.setattr(query, "COUNT_PROBE_DOCS", 3)
    assert index.count_matches("rust", where="session_id = ?", params=("s2",)) == expected
    assert index.count_matches("rust", where="session_id = :s", params={"s": "s2"}) == expected


def test_nothing_is_refreshed_and_nothing_written(tmp_path):
    write_store(tmp_path, sessions=1)
    with memstore.open_session(tmp_path, "late") as log:
        log.append({"type": "item.completed", "item": {"id": "z", "type": "agent_message", "text": "zebra"}})
    before = catalog_path(tmp_path).stat()
    conn = read_only(tmp_path)
    assert search_catalog(conn, "zebra").total == 0  # not in the catalog until it is refreshed
    assert not conn.in_transaction
    after = catalog_path(tmp_path).stat()
    assert (after.st_mtime_ns, after.st_size) == (before.st_mtime_ns, before.st_size)
    refresh_catalog(tmp_path)
    assert [r.session_id for r in search_catalog(conn, "zebra").results] == ["late"]
    conn.close()


def test_a_caller_s_transaction_is_joined_not_ended(tmp_path):
    write_store(tmp_path, sessions=1)
    conn = read_only(tmp_path)
    conn.execute("BEGIN")
    assert search_catalog(conn, "widget").results
    assert conn.in_transaction
    conn.execute("COMMIT")
    conn.close()


def test_queries_without_tokens_and_bad_arguments(tmp_path):
    write_store(tmp_path, sessions=1)
    conn = read_only(tmp_path)
    for query in ["", "  ", "!!!", '"', "\x00"]:
        assert search_catalog(conn, query) == SearchPage([], 0, 0, 6)
    for bad in (1.5, "6", True, None):
        with pytest.raises(TypeError):
            search_catalog(conn, "widget", limit=bad)  # type: ignore[arg-type]
        with pytest.raises(TypeError):
            search_catalog(conn, "widget", offset=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        search_catalog(conn, "widget", offset=-1)
    with pytest.raises(ValueError):
        search_catalog(conn, "widget", since="yesterday")
    conn.close()


def test_query_terms_fts_quoting_and_snippets_are_one_definition():
    assert query_terms("Cargo cargo TEST_fail İstanbul") == ["cargo", "test", "fail", "i̇stanbul"]
    assert fts_match("Cargo cargo TEST_fail") == '"cargo" OR "test" OR "fail"'
    assert fts_match("a b c d", max_terms=2) == '"a" OR "b"'
    assert fts_match("*** ()") is None
    text = "x " * 200 + "the Widget broke " + "y " * 200
    cut = snippet(text, query_terms("widget"))
    assert "the Widget broke" in cut and cut.startswith("…") and cut.endswith("…")
    assert snippet("short widget text", {"widget"}) == "short widget text"
    assert snippet("a\n\n b   c", {"zzz"}) == "a b c"


def test_the_explorer_search_page_is_search_catalog_s_results(tmp_path):
    write_store(tmp_path)
    conn = read_only(tmp_path)
    page = search_catalog(conn, "cargo borrow", limit=5)
    data = search_data(tmp_path, "cargo borrow", Urls(), limit=5, conn=conn)
    assert data["engine"] == "bm25" and data["total"] == page.total
    assert [
        {k: r[k] for k in ("chunk_id", "path", "score", "snippet", "session_id", "turn", "seq")}
        for r in data["results"]
    ] == [
        {
            "chunk_id": r.chunk_id,
            "path": r.path,
            "score": pytest.approx(r.score, rel=1e-6),
            "snippet": r.snippet,
            "session_id": r.session_id,
            "turn": r.turn,
            "seq": r.seq,
        }
        for r in page.results
    ]
    conn.close()
