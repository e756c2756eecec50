"""The BM25 engine (memstore.bm25): it tokenizes as the reference does, ranks as the reference's
BM25 formula does (scores, ties by chunk_id, recency), filters restrict results and never the
statistics, hostile queries are inert, and SQLite errors name the database. Every test uses a real
SQLite file holding the catalog's ``chunks`` table, created with the catalog's DDL."""

from __future__ import annotations

import logging
import random
import sqlite3
import string
import sys

import pytest
from bm25_reference import (
    NOW,
    WORDS,
    assert_same_ranking,
    build,
    random_rows,
    reference_scores,
    reference_search,
    reference_tokens,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from memstore.bm25 import SearchIndex, recency_multiplier, tokenize
from memstore.bm25.tokens import WORD, token_keys
from memstore.errors import StoreIOError
from memstore.search import fts_match

# ----------------------------------------------------------------------------------------------
# Tokens


def test_tokenize_splits_on_non_alphanumerics_and_lowercases_each_token():
    assert tokenize("Hello, World! foo_bar-baz 42x") == ["hello", "world", "foo", "bar", "baz", "42x"]
    assert tokenize("") == []
    assert tokenize("--- ... ___") == []
    assert tokenize("Über naïve ÆSIR 東京 x²") == ["über", "naïve", "æsir", "東京", "x²"]
    # Lowercased after the split: İ lowercases to i + a combining dot, which stays in the token.
    assert tokenize("İstanbul") == ["i̇stanbul"]
    assert tokenize("a\x00b") == ["a", "b"]


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_tokenize_is_the_reference_tokenizer(text):
    assert tokenize(text) == reference_tokens(text)
    assert token_keys(text) == [t.encode("utf-8") for t in reference_tokens(text)]


@settings(max_examples=100, deadline=None)
@given(st.text(alphabet=string.printable))
def test_ascii_fast_path_is_the_reference_tokenizer(text):
    assert tokenize(text) == reference_tokens(text)
    assert token_keys(text) == [t.encode("ascii") for t in reference_tokens(text)]


def test_word_regex_is_exactly_isalnum():
    everything = "".join(chr(c) for c in range(sys.maxunicode + 1) if not 0xD800 <= c < 0xE000)
    assert set("".join(WORD.findall(everything))) == {ch for ch in everything if ch.isalnum()}


def test_fts_match_quotes_tokens():
    assert fts_match('foo "bar" NEAR(x* -y') == '"foo" OR "bar" OR "near" OR "x" OR "y"'
    assert fts_match("a a A") == '"a"'
    assert fts_match("") is None
    assert fts_match('()*"-') is None


# ----------------------------------------------------------------------------------------------
# The reference's query tests


def test_blue_finds_the_right_doc(tmp_path):
    conn, index = build(tmp_path, ["the sky is red", "the ocean is blue", "green grass"])
    hits = index.search("blue")
    assert [h[0] for h in hits] == [2]
    assert hits[0][1] > 0


def test_multiple_matches(tmp_path):
    conn, index = build(tmp_path, ["cargo build", "nothing here", "cargo test", "cargo cargo run"])
    assert sorted(h[0] for h in index.search("cargo")) == [1, 3, 4]


def test_min_score_filters(tmp_path):
    conn, index = build(tmp_path, ["rust cargo", "rust", "python pip", "cargo"])
    everything = index.search("rust cargo", recency=False)
    assert len(everything) == 3
    top = everything[0][1]
    assert index.search("rust cargo", recency=False, min_score=top) == everything[:1]
    assert index.search("rust cargo", recency=False, min_score=top * 1.0001) == []
    assert index.search("rust cargo", recency=False, min_score=-5) == everything


def test_empty_query_gives_nothing(tmp_path):
    conn, index = build(tmp_path, ["something", "else"])
    for query in ["", "   ", "!!!", "_", "-- ** ()", "\x00"]:
        assert index.search(query) == []


def test_results_sorted_descending(tmp_path):
    rng = random.Random(1)
    conn, index = build(tmp_path, random_rows(rng, 300))
    for query in ["rust", "cargo test error", "blue whale ocean", "fn impl trait"]:
        hits = index.search(query, k=50)
        assert hits
        scores = [s for _, s in hits]
        assert scores == sorted(scores, reverse=True)


def test_rust_cargo_ranks_the_doc_with_both_terms_first(tmp_path):
    conn, index = build(tmp_path, ["rust is fast", "cargo builds crates", "rust cargo build", "python"])
    hits = index.search("rust cargo", recency=False)
    assert hits[0][0] == 3
    assert hits[0][1] > hits[1][1]  # strictly higher


def test_equal_scores_ordered_by_chunk_id(tmp_path):
    # Five identical documents whose ids run against their chunk_ids' string order.
    chunk_ids = ["s:9:0", "s:10:0", "s:100:0", "s:1:0", "s:2:0"]
    rows = [{"id": 10 - i, "chunk_id": c, "text": "same words here"} for i, c in enumerate(chunk_ids)]
    rows.append({"id": 20, "chunk_id": "s:0:0", "text": "other words"})
    conn, index = build(tmp_path, rows)
    hits = index.search("same", k=10, recency=False)
    by_id = {r["id"]: r["chunk_id"] for r in rows}
    assert [by_id[i] for i, _ in hits] == sorted(chunk_ids)
    assert len({s for _, s in hits}) == 1
    # The cut at k falls inside the tie: the k smallest chunk_ids win, every time.
    for _ in range(3):
        assert [by_id[i] for i, _ in index.search("same", k=2, recency=False)] == sorted(chunk_ids)[:2]


def test_scores_are_the_reference_formula(tmp_path):
    rng = random.Random(2)
    rows = random_rows(rng, 400)
    conn, index = build(tmp_path, rows)
    docs = {r["id"]: r["text"] for r in rows}
    chunk_ids = {r["id"]: r["chunk_id"] for r in rows}
    for query in ["rust", "rust rust cargo", "blue whale", "über İstanbul", "x_y", "v1", "zzz nothing", "fn fn fn"]:
        expected = reference_search(docs, chunk_ids, query, 25)
        assert_same_ranking(index.search(query, k=25, recency=False), expected)


def test_duplicate_query_tokens_count_again(tmp_path):
    texts = ["rust", "cargo", "rust cargo", "other"]
    conn, index = build(tmp_path, texts)
    once = dict(index.search("rust cargo", recency=False))
    twice = dict(index.search("rust rust cargo", recency=False))
    assert twice[1] == pytest.approx(2 * once[1])
    assert twice[2] == pytest.approx(once[2])
    expected = reference_scores(dict(enumerate(texts, 1)), "rust rust cargo")
    assert twice == pytest.approx({i: s for i, s in expected.items() if s > 0})


def test_huge_term_frequency(tmp_path):
    texts = ["word " * 70000 + "tail", "word tail", "unrelated"]
    conn, index = build(tmp_path, texts)
    docs = dict(enumerate(texts, 1))
    expected = reference_search(docs, {i: f"s1:{i}:0" for i in docs}, "word tail", 5)
    assert_same_ranking(index.search("word tail", recency=False), expected)


# ----------------------------------------------------------------------------------------------
# Recency


def test_recency_multiplier_values():
    assert recency_multiplier(None, NOW) == 1.0
    assert recency_multiplier("garbage", NOW) == 1.0
    assert recency_multiplier("2026-11-30T12:00:00.000Z", NOW) == pytest.approx(1.1)
    assert recency_multiplier("2026-10-31T12:00:00Z", NOW) == pytest.approx(1.05)
    assert recency_multiplier("2026-10-01T12:00:00+00:00", NOW) == pytest.approx(1.025)
    assert recency_multiplier("2030-01-01T00:00:00Z", NOW) == pytest.approx(1.1)  # future: age 0
    assert recency_multiplier(NOW.timestamp() - 30 * 86400, NOW) == pytest.approx(1.05)
    assert 1.0 < recency_multiplier("2025-11-30T12:00:00Z", NOW) < 1.0001
    assert recency_multiplier("2000-01-01T00:00:00Z", NOW) == 1.0  # the bonus vanishes with age


def test_recency_breaks_equal_bm25_toward_newer(tmp_path):
    rows = [
        {"id": 1, "chunk_id": "a", "text": "deploy docker", "created_at": "2026-01-01T00:00:00.000Z"},
        {"id": 2, "chunk_id": "b", "text": "deploy docker", "created_at": "2026-11-29T00:00:00.000Z"},
        {"id": 3, "chunk_id": "c", "text": "deploy docker", "created_at": None},
    ]
    conn, index = build(tmp_path, rows)
    assert [i for i, _ in index.search("deploy", now=NOW)] == [2, 1, 3]
    plain = index.search("deploy", recency=False)
    assert [i for i, _ in plain] == [1, 2, 3]  # ties by chunk_id
    with_recency = dict(index.search("deploy", now=NOW))
    assert with_recency[3] == plain[0][1]  # NULL created_at: factor 1.0
    assert with_recency[2] == pytest.approx(plain[0][1] * recency_multiplier("2026-11-29T00:00:00.000Z", NOW))


def test_recency_scores_match_reference(tmp_path):
    rng = random.Random(3)
    rows = random_rows(rng, 500)
    conn, index = build(tmp_path, rows)
    docs = {r["id"]: r["text"] for r in rows}
    chunk_ids = {r["id"]: r["chunk_id"] for r in rows}
    created = {r["id"]: r["created_at"] for r in rows}
    for query in ["rust", "cargo error", "blue sky whale", "some none"]:
        for k in (1, 6, 40):
            expected = reference_search(docs, chunk_ids, query, k, created=created, now=NOW)
            assert_same_ranking(index.search(query, k=k, now=NOW), expected)


def test_min_score_applies_after_recency(tmp_path):
    rows = [{"id": 1, "text": "blue", "created_at": "2026-11-30T12:00:00Z"}, {"id": 2, "text": "red"}]
    conn, index = build(tmp_path, rows)
    plain = index.search("blue", recency=False)[0][1]
    boosted = index.search("blue", now=NOW)[0][1]
    assert boosted == pytest.approx(plain * 1.1)
    assert index.search("blue", now=NOW, min_score=plain * 1.05) == [(1, boosted)]
    assert index.search("blue", recency=False, min_score=plain * 1.05) == []


# ----------------------------------------------------------------------------------------------
# Filters


def test_where_restricts_results_not_statistics(tmp_path):
    rng = random.Random(4)
    rows = random_rows(rng, 400, sessions=4)
    conn, index = build(tmp_path, rows)
    docs = {r["id"]: r["text"] for r in rows}
    chunk_ids = {r["id"]: r["chunk_id"] for r in rows}
    allowed = {r["id"] for r in rows if r["session_id"] == "s2"}
    for query in ["rust cargo", "blue", "err ok"]:
        got = index.search(query, k=10, recency=False, where="session_id = ?", params=("s2",))
        assert_same_ranking(got, reference_search(docs, chunk_ids, query, 10, allowed=allowed))
        named = index.search(query, k=10, recency=False, where="session_id = :sid", params={"sid": "s2"})
        assert named == got


def test_where_on_source_and_created_at(tmp_path):
    rows = [
        {"id": 1, "text": "fact about rust", "source": "session", "created_at": "2026-11-01T00:00:00Z"},
        {"id": 2, "text": "rust event", "source": "event", "created_at": "2026-11-20T00:00:00Z"},
        {"id": 3, "text": "rust event old", "source": "event", "created_at": "2025-01-01T00:00:00Z"},
        {"id": 4, "text": "rust event undated", "source": "event", "created_at": None},
    ]
    conn, index = build(tmp_path, rows)
    assert [i for i, _ in index.search("rust", where="source = ?", params=("session",))] == [1]
    recent = index.search("rust", where="created_at >= ?", params=("2026-06-01",))
    assert sorted(i for i, _ in recent) == [1, 2]
    assert index.search("rust", where="session_id = ?", params=("nobody",)) == []


def test_selective_filter_over_many_candidates(tmp_path, monkeypatch):
    import memstore.bm25.query as query

    monkeypatch.setattr(query, "FILTER_PROBE_DOCS", 64)
    rows = [{"id": i, "session_id": "big", "text": "common word " + "pad " * (i % 7)} for i in range(1, 3001)]
    rows += [{"id": 5000 + i, "session_id": "small", "text": "common " + "pad " * i} for i in range(5)]
    conn, index = build(tmp_path, rows)
    hits = index.search("common", k=3, recency=False, where="session_id = ?", params=("small",))
    assert [i for i, _ in hits] == [5000, 5001, 5002]
    assert len(index.search("common", k=10, where="session_id = 'small'")) == 5


def test_candidates_without_chunk_rows_are_skipped(tmp_path, caplog):
    conn, index = build(tmp_path, ["blue one", "blue two", "blue three"])
    conn.execute("DELETE FROM chunks WHERE id = 1")
    conn.commit()
    with caplog.at_level(logging.WARNING, logger="memstore"):
        hits = index.search("blue", k=3)
    assert sorted(i for i, _ in hits) == [2, 3]
    assert "no chunks row" in caplog.text


def test_pruning_many_candidates_keeps_exact_answer(tmp_path):
    # Far more matching documents than PRUNE_MIN_CANDIDATES * k, with recency on.
    rng = random.Random(5)
    rows = random_rows(rng, 2500)
    conn, index = build(tmp_path, rows)
    docs = {r["id"]: r["text"] for r in rows}
    chunk_ids = {r["id"]: r["chunk_id"] for r in rows}
    created = {r["id"]: r["created_at"] for r in rows}
    for query in ["rust", "rust cargo build"]:
        expected = reference_search(docs, chunk_ids, query, 3, created=created, now=NOW)
        assert_same_ranking(index.search(query, k=3, now=NOW), expected)


def test_k_zero_or_negative(tmp_path):
    conn, index = build(tmp_path, ["blue"])
    assert index.search("blue", k=0) == []
    assert index.search("blue", k=-3) == []


# ----------------------------------------------------------------------------------------------
# Hostile queries and errors

HOSTILE = [
    '"',
    '""',
    "'",
    "'; DROP TABLE chunks; --",
    "a OR b AND NOT c",
    "NEAR(a b, 3)",
    "NEAR",
    "*",
    "a*",
    "-a",
    "(",
    ")",
    "(((a",
    "a))",
    "^a",
    "col:a",
    "text:blue",
    "a + b",
    "{a b}",
    "[a]",
    "\x00",
    "a\x00b",
    "\\",
    "%",
    "_",
    "?",
    ":1",
    "$x",
    "@y",
    "🙂",
    "\ud800",
    "İ",
    "A" * 10_000,
    "blue " * 2_000,
    "blue-green",
    " ".join(random.Random(0).choice(["OR", "AND", "NOT", "NEAR", '"', "(", ")", "*", "blue"]) for _ in range(3000)),
]


def test_hostile_queries_never_raise(tmp_path):
    conn, index = build(tmp_path, ["the blue sky", "a b c", "near and or not", "drop table chunks"])
    for query in HOSTILE:
        hits = index.search(query)
        assert isinstance(hits, list)
        assert len(index.search(query, where="session_id = ?", params=("s1",))) == len(hits)
    assert index.search("blue-green")[0][0] == 1
    assert conn.execute("SELECT count(*) FROM chunks").fetchone()[0] == 4


def test_query_with_thousands_of_distinct_tokens(tmp_path):
    rows = random_rows(random.Random(6), 200)
    conn, index = build(tmp_path, rows)
    query = " ".join(f"w{i}" for i in range(2000)) + " rust blue " + " ".join(WORDS)
    docs = {r["id"]: r["text"] for r in rows}
    chunk_ids = {r["id"]: r["chunk_id"] for r in rows}
    assert_same_ranking(index.search(query, k=10, recency=False), reference_search(docs, chunk_ids, query, 10))
    assert index.search("", where="") == []
    assert index.search("rust", where="  ", now=NOW) == index.search("rust", now=NOW)


def test_fts_match_is_safe_in_fts5(tmp_path):
    conn, index = build(tmp_path, ["the blue sky", "near and or not"])
    conn.execute("CREATE VIRTUAL TABLE chunks_fts USING fts5(text, content=chunks, content_rowid=id)")
    conn.execute("INSERT INTO chunks_fts(chunks_fts) VALUES ('rebuild')")
    for query in HOSTILE + ["blue", "NEAR and"]:
        match = fts_match(query)
        if match is None:
            assert tokenize(query) == []
            continue
        conn.execute(
            "SELECT rowid, snippet(chunks_fts, 0, '[', ']', '…', 8) FROM chunks_fts WHERE chunks_fts MATCH ?", (match,)
        ).fetchall()
    assert conn.execute("SELECT rowid FROM chunks_fts WHERE chunks_fts MATCH ?", (fts_match("NEAR"),)).fetchall() == [
        (2,)
    ]


def test_sqlite_errors_name_the_database(tmp_path):
    conn, index = build(tmp_path, ["blue"])
    with pytest.raises(StoreIOError) as err:
        index.search("blue", where="no_such_column = 1")
    assert str(tmp_path / "catalog.db") in str(err.value)

    bare = sqlite3.connect(tmp_path / "empty.db")
    with pytest.raises(StoreIOError) as err:
        SearchIndex(bare).search("blue")
    assert str(tmp_path / "empty.db") in str(err.value)


def test_newer_index_format_is_refused(tmp_path):
    conn, index = build(tmp_path, ["blue"])
    conn.execute("UPDATE search_meta SET value = '99' WHERE key = 'format'")
    conn.commit()
    with pytest.raises(StoreIOError, match="format 99"):
        SearchIndex(conn).ensure_schema()
