"""The BM25 engine's index over time: incremental adds and removes equal a build from scratch,
merges and tombstones, persistence, transactions and other connections."""

from __future__ import annotations

import random
import sqlite3

import pytest
from bm25_reference import NOW, assert_same_ranking, build, insert_chunks, open_catalog, random_rows, reference_search

import memstore.bm25.merge as merge
import memstore.bm25.segments as segments
from memstore.bm25 import SearchIndex

QUERIES = [
    "rust",
    "cargo test",
    "blue whale ocean",
    "über",
    "i̇stanbul x y",
    "some none ok err",
    "v1 2 3",
    "fn fn impl",
    "sqlite index query commit",
    "nothing matches zzz",
]


def results(index: SearchIndex, **options) -> dict[tuple[str, int], list[tuple[int, float]]]:
    return {(q, k): index.search(q, k=k, now=NOW, **options) for q in QUERIES for k in (1, 6, 30)}


def segment_count(conn: sqlite3.Connection) -> int:
    return conn.execute("SELECT count(*) FROM search_segments").fetchone()[0]


@pytest.mark.parametrize("seed", [11, 12, 13])
def test_incremental_equals_from_scratch(tmp_path, seed):
    """A random sequence of adds (session-sized, some re-adding ids) and removes, with merges
    forced small, ranks exactly like one build of the final documents."""
    rng = random.Random(seed)
    conn = open_catalog(tmp_path / "inc.db")
    index = SearchIndex(conn, segment_docs=40, auto_merge_docs=300)
    index.ensure_schema()
    live: dict[int, dict] = {}
    next_id = 1
    for step in range(60):
        action = rng.random()
        if action < 0.6 or not live:
            rows = random_rows(rng, rng.randint(1, 90), start_id=next_id)
            next_id += len(rows)
            if live and rng.random() < 0.3:  # re-add some ids with new text: a rewritten session
                for row, old in zip(rows, rng.sample(sorted(live), min(5, len(live)))):
                    row["id"] = old
                    conn.execute("DELETE FROM chunks WHERE id = ?", (old,))
            insert_chunks(conn, rows)
            index.add((r["id"], r["text"], r["created_at"]) for r in rows)
            live.update({r["id"]: r for r in rows})
        else:
            gone = rng.sample(sorted(live), rng.randint(1, max(1, len(live) // 3)))
            gone.append(10**9)  # unknown ids are ignored
            conn.execute(f"DELETE FROM chunks WHERE id IN ({','.join(map(str, gone))})")
            index.remove(gone)
            for i in gone:
                live.pop(i, None)
        if rng.random() < 0.3:
            conn.commit()
        if step % 15 == 14:
            # Checked along the way too, with caches built and then invalidated by the changes.
            conn.commit()
            fresh_conn, fresh = build(tmp_path, list(live.values()), name=f"scratch-{step}.db")
            assert results(index) == results(fresh)
            fresh_conn.close()
    conn.commit()
    fresh_conn, fresh = build(tmp_path, list(live.values()), name="scratch.db")
    incremental = results(index)
    assert incremental == results(fresh)  # bit for bit: same statistics, same arithmetic
    assert index.count() == len(live)
    assert results(SearchIndex(sqlite3.connect(tmp_path / "inc.db"))) == incremental  # persisted
    index.optimize()
    assert results(index) == incremental
    index.optimize(full=True)
    assert segment_count(conn) == 1
    assert conn.execute("SELECT count(*) FROM search_deleted").fetchone()[0] == 0
    assert results(index) == incremental
    docs = {r["id"]: r["text"] for r in live.values()}
    chunk_ids = {r["id"]: r["chunk_id"] for r in live.values()}
    created = {r["id"]: r["created_at"] for r in live.values()}
    for q in QUERIES:
        assert_same_ranking(
            index.search(q, k=30, now=NOW), reference_search(docs, chunk_ids, q, 30, created=created, now=NOW)
        )


def test_incremental_with_tiny_blocks_and_pages(tmp_path, monkeypatch):
    """The same with blocks of a few terms and merges reading two blocks at a time, so lookups
    cross block boundaries and merges cross pages."""
    monkeypatch.setattr(segments, "BLOCK_TERMS", 3)
    monkeypatch.setattr(segments, "BLOCK_POSTINGS", 8)
    monkeypatch.setattr(segments, "BLOCK_ALONE", 4)
    monkeypatch.setattr(merge, "MERGE_PAGE_BLOCKS", 2)
    test_incremental_equals_from_scratch(tmp_path, 14)
    conn = sqlite3.connect(tmp_path / "inc.db")
    blocks = conn.execute("SELECT terms FROM search_postings").fetchall()
    assert len(blocks) > 50 and all(len(b[0].split("\n")) <= 3 for b in blocks)


def test_remove_leaves_results_and_statistics(tmp_path):
    rng = random.Random(21)
    rows = random_rows(rng, 300)
    conn, index = build(tmp_path, rows)
    before = index.search("rust cargo", k=300, recency=False)
    gone = [i for i, _ in before[:10]] + [r["id"] for r in rows[:50]]
    index.remove(gone)
    conn.commit()
    kept = [r for r in rows if r["id"] not in set(gone)]
    fresh_conn, fresh = build(tmp_path, kept, name="kept.db")
    after = index.search("rust cargo", k=300, recency=False)
    assert not set(gone) & {i for i, _ in after}
    assert after == fresh.search("rust cargo", k=300, recency=False)  # N, df and avgdl moved too
    assert index.count() == len(kept)


def test_removing_everything(tmp_path):
    conn, index = build(tmp_path, ["blue", "blue sky"])
    index.remove([1, 2])
    assert index.search("blue") == []
    assert index.count() == 0
    index.add([(3, "blue again", None)])
    assert [i for i, _ in index.search("blue")] == []  # no chunks row for 3
    insert_chunks(conn, [{"id": 3, "text": "blue again"}])
    assert [i for i, _ in index.search("blue")] == [3]


def test_readding_an_id_replaces_it(tmp_path):
    conn, index = build(tmp_path, ["blue sky", "red sky"])
    index.add([(1, "green grass", None)])
    assert index.count() == 2
    assert index.search("blue") == []
    assert [i for i, _ in index.search("green")] == [1]
    # Within one call the last occurrence wins.
    index.add([(2, "first", None), (2, "second", None)])
    assert index.search("first") == [] and [i for i, _ in index.search("second")] == [2]


def test_small_segments_merge_in_tiers(tmp_path):
    conn = open_catalog(tmp_path / "tiers.db")
    index = SearchIndex(conn)
    index.ensure_schema()
    rng = random.Random(31)
    next_id = 1
    for _ in range(70):  # 70 sessions of 20 chunks
        rows = random_rows(rng, 20, start_id=next_id)
        next_id += 20
        insert_chunks(conn, rows)
        index.add((r["id"], r["text"], r["created_at"]) for r in rows)
        assert segment_count(conn) < 2 * merge.MERGE_FACTOR
    conn.commit()
    assert index.count() == 1400


def test_mostly_removed_segment_is_rewritten(tmp_path):
    rows = random_rows(random.Random(41), 200)
    conn, index = build(tmp_path, rows)
    index.remove([r["id"] for r in rows[:40]])
    assert conn.execute("SELECT ndeleted FROM search_segments").fetchall() == [(40,)]
    index.remove([r["id"] for r in rows[40:60]])  # 30% removed: rewritten without them
    assert conn.execute("SELECT ndocs, ndeleted FROM search_segments").fetchall() == [(140, 0)]
    assert conn.execute("SELECT count(*) FROM search_docs").fetchone()[0] == 140
    assert conn.execute("SELECT count(*) FROM search_deleted").fetchone()[0] == 0


def test_merges_above_the_budget_wait_for_optimize(tmp_path):
    conn = open_catalog(tmp_path / "budget.db")
    index = SearchIndex(conn, auto_merge_docs=50)
    index.ensure_schema()
    rng = random.Random(51)
    for s in range(10):
        rows = random_rows(rng, 30, start_id=1 + 30 * s)
        insert_chunks(conn, rows)
        index.add((r["id"], r["text"], r["created_at"]) for r in rows)
    assert segment_count(conn) == 10
    before = results(index)
    index.optimize()
    assert segment_count(conn) == 1
    assert results(index) == before


def test_add_joins_the_callers_transaction(tmp_path):
    conn, index = build(tmp_path, ["blue sky"])
    reader = sqlite3.connect(tmp_path / "catalog.db")
    other = SearchIndex(reader)
    assert [i for i, _ in other.search("blue")] == [1]

    conn.execute("BEGIN")
    insert_chunks(conn, [{"id": 2, "text": "blue whale"}])
    index.add([(2, "blue whale", None)])
    assert sorted(i for i, _ in index.search("blue")) == [1, 2]  # the writer sees its own work
    assert [i for i, _ in other.search("blue")] == [1]  # a reader sees nothing of it yet
    conn.rollback()
    assert [i for i, _ in index.search("blue")] == [1]
    assert index.count() == 1

    conn.execute("BEGIN")
    insert_chunks(conn, [{"id": 2, "text": "blue whale"}])
    index.add([(2, "blue whale", None)])
    conn.commit()
    assert sorted(i for i, _ in other.search("blue")) == [1, 2]  # the reader's caches catch up


def test_refresh_as_the_module_docstring_shows(tmp_path):
    """A rewritten session, the documented way: one transaction, the new rows fed from a cursor
    over chunks on the same connection (read while the postings are written)."""
    rows = random_rows(random.Random(91), 120, sessions=2)
    conn, index = build(tmp_path, rows, segment_docs=16)
    reader = SearchIndex(sqlite3.connect(tmp_path / "catalog.db"))
    before = results(reader)
    conn.execute("BEGIN IMMEDIATE")
    old = [r[0] for r in conn.execute("SELECT id FROM chunks WHERE session_id = ?", ("s1",))]
    index.remove(old)
    conn.execute("DELETE FROM chunks WHERE session_id = ?", ("s1",))
    new = random_rows(random.Random(92), 70, start_id=500, sessions=1)
    for row in new:
        row["session_id"] = "s1"
    insert_chunks(conn, new)
    index.add(conn.execute("SELECT id, text, created_at FROM chunks WHERE session_id = ?", ("s1",)))
    assert results(reader) == before  # nothing visible before the commit
    conn.commit()
    final = [r for r in rows if r["session_id"] != "s1"] + new
    fresh_conn, fresh = build(tmp_path, final, name="final.db")
    assert results(reader) == results(fresh)


def test_writes_outside_a_transaction_commit_on_their_own(tmp_path):
    conn = sqlite3.connect(tmp_path / "auto.db", isolation_level=None)
    conn.execute(search_ddl())
    insert_chunks(conn, [{"id": 1, "text": "blue"}])
    index = SearchIndex(conn)
    index.ensure_schema()
    index.add([(1, "blue", None)])
    assert not conn.in_transaction
    assert [i for i, _ in SearchIndex(sqlite3.connect(tmp_path / "auto.db")).search("blue")] == [1]


def search_ddl() -> str:
    from bm25_reference import CHUNKS_DDL

    return CHUNKS_DDL


def test_a_failed_add_leaves_nothing(tmp_path):
    conn, index = build(tmp_path, ["blue"])

    def docs():
        yield (2, "blue two", None)
        raise RuntimeError("source broke")

    with pytest.raises(RuntimeError):
        index.add(docs())
    conn.commit()
    assert index.count() == 1
    assert conn.execute("SELECT count(*) FROM search_docs").fetchone()[0] == 1


def test_sqlite_utils_database_is_accepted(tmp_path):
    sqlite_utils = pytest.importorskip("sqlite_utils")
    conn, _ = build(tmp_path, ["blue sky", "red"])
    conn.close()
    db = sqlite_utils.Database(tmp_path / "catalog.db")
    assert [i for i, _ in SearchIndex(db).search("blue")] == [1]


def test_rebuild_from_chunks(tmp_path):
    rows = random_rows(random.Random(61), 150)
    conn, index = build(tmp_path, rows)
    before = results(index)
    conn.execute("DELETE FROM search_postings")  # damage the index
    conn.commit()
    assert index.rebuild() == 150
    conn.commit()
    assert results(index) == before
    assert index.rebuild(where="session_id = ?", params=("s1",)) == sum(r["session_id"] == "s1" for r in rows)


def test_caches_follow_another_connection(tmp_path):
    rows = random_rows(random.Random(71), 100)
    conn, writer = build(tmp_path, rows)
    reader = SearchIndex(sqlite3.connect(tmp_path / "catalog.db"))
    first = results(reader)
    more = random_rows(random.Random(72), 60, start_id=1000)
    insert_chunks(conn, more)
    writer.add((r["id"], r["text"], r["created_at"]) for r in more)
    writer.remove([r["id"] for r in rows[:30]])
    conn.commit()
    assert results(reader) == results(writer)
    assert results(reader) != first
    # A rewrite to one segment (new ids, new nonces) is picked up as well.
    writer.optimize(full=True)
    conn.commit()
    assert results(reader) == results(writer)


def test_small_term_cache_still_answers(tmp_path):
    rows = random_rows(random.Random(81), 300)
    conn, index = build(tmp_path, rows)
    tiny = SearchIndex(sqlite3.connect(tmp_path / "catalog.db"), cache_bytes=1)
    assert results(tiny) == results(index)
    assert len(tiny.cache.view.terms) == 1
