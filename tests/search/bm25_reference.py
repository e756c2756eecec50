"""Helpers of the search tests: a catalog's ``chunks`` table in a real SQLite file, an index over
it, and BM25 exactly as the reference writes it (the oracle the engine is checked against)."""

from __future__ import annotations

import math
import random
import sqlite3
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Optional

import pytest

from memstore.bm25 import K1, B, SearchIndex, recency_multiplier

CHUNKS_DDL = """
CREATE TABLE chunks (
  id INTEGER PRIMARY KEY,
  chunk_id TEXT NOT NULL UNIQUE,
  session_id TEXT NOT NULL,
  seq INTEGER, turn INTEGER, part INTEGER,
  source TEXT NOT NULL,
  kind TEXT,
  path TEXT, start_line INTEGER, end_line INTEGER,
  created_at TEXT,
  text TEXT NOT NULL
)
"""
NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
WORDS = (
    "rust cargo build test error warning file src main lib mod fn struct impl trait pub use let mut self "
    "return match some none ok err vec string option result python pip venv import def class sqlite index "
    "query commit branch merge rebase diff patch apply blue green red sky whale ocean deploy docker image"
).split()


# ----------------------------------------------------------------------------------------------
# Helpers


def open_catalog(path: Path) -> sqlite3.Connection:
    """A catalog database with the chunks table (WAL, as the catalog runs it)."""
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA journal_mode=WAL")
    if conn.execute("SELECT count(*) FROM sqlite_master WHERE name = 'chunks'").fetchone()[0] == 0:
        conn.execute(CHUNKS_DDL)
        conn.commit()
    return conn


def insert_chunks(conn: sqlite3.Connection, rows: list[dict]) -> None:
    """Insert chunk rows: each a dict with id, text and optionally chunk_id, session_id, source,
    created_at."""
    conn.executemany(
        "INSERT INTO chunks (id, chunk_id, session_id, source, kind, created_at, text)"
        " VALUES (:id, :chunk_id, :session_id, :source, :kind, :created_at, :text)",
        [
            {
                "chunk_id": r.get("chunk_id", f"{r.get('session_id', 's1')}:{r['id']}:0"),
                "session_id": r.get("session_id", "s1"),
                "source": r.get("source", "event"),
                "kind": r.get("kind", "agent_message"),
                "created_at": r.get("created_at"),
                **r,
            }
            for r in rows
        ],
    )


def build(tmp_path: Path, texts_or_rows, name: str = "catalog.db", **options) -> tuple[sqlite3.Connection, SearchIndex]:
    """A catalog holding the given chunks (texts, or row dicts) and a SearchIndex over them."""
    rows = [r if isinstance(r, dict) else {"id": i, "text": r} for i, r in enumerate(texts_or_rows, 1)]
    conn = open_catalog(tmp_path / name)
    insert_chunks(conn, rows)
    index = SearchIndex(conn, **options)
    index.ensure_schema()
    index.add((r["id"], r["text"], r.get("created_at")) for r in rows)
    conn.commit()
    return conn, index


def reference_tokens(text: str) -> list[str]:
    """The reference tokenizer, character by character: split on non-alphanumerics, lowercase."""
    tokens, current = [], []
    for ch in text:
        if ch.isalnum():
            current.append(ch)
        elif current:
            tokens.append("".join(current).lower())
            current = []
    if current:
        tokens.append("".join(current).lower())
    return tokens


def reference_scores(docs: dict[int, str], query: str) -> dict[int, float]:
    """BM25 exactly as the reference writes it, over every document of ``docs`` (id -> text)."""
    tokens = {i: reference_tokens(t) for i, t in docs.items()}
    n = len(tokens)
    avgdl = sum(map(len, tokens.values())) / n
    df = Counter(t for toks in tokens.values() for t in set(toks))
    scores = {}
    for i, toks in tokens.items():
        tf = Counter(toks)
        score = 0.0
        for q in reference_tokens(query):  # duplicates count again
            if tf[q]:
                idf = math.log((n - df[q] + 0.5) / (df[q] + 0.5) + 1)
                score += idf * tf[q] * (K1 + 1) / (tf[q] + K1 * (1 - B + B * len(toks) / max(avgdl, 1)))
        scores[i] = score
    return scores


def reference_search(
    docs: dict[int, str],
    chunk_ids: dict[int, str],
    query: str,
    k: int,
    *,
    min_score: float = 0.0,
    created: Optional[dict[int, Optional[str]]] = None,
    now: Optional[datetime] = None,
    allowed: Optional[set[int]] = None,
) -> list[tuple[int, float]]:
    """The reference's search_memory over docs: filter, recency (if ``created``), sort, truncate."""
    scores = reference_scores(docs, query)
    if created is not None:
        scores = {i: s * recency_multiplier(created.get(i), now) for i, s in scores.items()}
    hits = [(i, s) for i, s in scores.items() if s > 0 and s >= min_score and (allowed is None or i in allowed)]
    hits.sort(key=lambda h: (-h[1], chunk_ids[h[0]]))
    return hits[:k]


def assert_same_ranking(got: list[tuple[int, float]], expected: list[tuple[int, float]], rel: float = 1e-9) -> None:
    """Same documents in the same order with the same scores (to ``rel``). Scores that agree to
    ``rel`` count as tied: their order must then be the chunk_id order both sides applied."""
    assert len(got) == len(expected), (got, expected)
    for (_, gs), (_, es) in zip(got, expected):
        assert gs == pytest.approx(es, rel=rel), (got, expected)
    if [g[0] for g in got] != [e[0] for e in expected]:
        # Allowed only where the scores are equal to within rounding.
        for (gi, gs), (ei, es) in zip(got, expected):
            if gi != ei:
                assert gs == pytest.approx(es, rel=rel) and any(
                    e[0] == gi and e[1] == pytest.approx(gs, rel=rel) for e in expected
                ), (got, expected)


def random_rows(rng: random.Random, n: int, start_id: int = 1, sessions: int = 4) -> list[dict]:
    """Chunks of Zipf-distributed words (a few empty), with sessions and timestamps."""
    weights = [1 / (r + 1) ** 1.1 for r in range(len(WORDS))]
    rows = []
    for i in range(start_id, start_id + n):
        length = 0 if rng.random() < 0.02 else rng.randint(1, 40)
        words = rng.choices(WORDS, weights, k=length)
        if rng.random() < 0.3:
            words.append(rng.choice(["Über", "naïve", "İstanbul", "x_y", "v1.2.3", "e2e", "ÆSIR"]))
        created = (
            None
            if rng.random() < 0.2
            else (NOW - timedelta(days=rng.uniform(0, 200))).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
        )
        session = f"s{rng.randrange(sessions)}"
        rows.append(
            {
                "id": i,
                "chunk_id": f"{session}:{i}:{rng.randrange(3)}",
                "session_id": session,
                "text": " ".join(words),
                "created_at": created,
            }
        )
    return rows
