"""The BM25 engine against an independent implementation, bm25s (method "lucene", k1 1.2, b 0.75),
fed the same tokens, with recency off, on thousands of generated chunks and many queries.

bm25s's Lucene variant leaves out the constant factor (k1 + 1) of the term-frequency part, so its
scores are ours divided by 2.2. Its idf is the reference's ln(1 + (N - df + 0.5)/(df + 0.5))."""

from __future__ import annotations

import random

import numpy as np
import pytest
from bm25_reference import build

from memstore.bm25 import K1, tokenize

# Rankings compared with bm25s over generated corpora.
pytestmark = pytest.mark.slow

bm25s = pytest.importorskip("bm25s")

VOCAB_SIZE = 3000


def corpus(rng: random.Random, n: int) -> list[dict]:
    """Chunks of Zipf-distributed words from a vocabulary of VOCAB_SIZE, 1-300 tokens each (a few
    empty, a few duplicates of others so that exact ties exist), over 12 sessions."""
    vocab = [f"w{i}" for i in range(VOCAB_SIZE)]
    weights = [1 / (r + 1) ** 1.05 for r in range(VOCAB_SIZE)]
    rows = []
    for i in range(1, n + 1):
        if rng.random() < 0.03 and rows:
            text = rng.choice(rows)["text"]
        elif rng.random() < 0.01:
            text = "--"
        else:
            text = " ".join(rng.choices(vocab, weights, k=int(rng.lognormvariate(3.5, 0.8)) % 300 + 1))
            if rng.random() < 0.2:
                text = text.upper().replace(" ", "_")  # still the same tokens, lowercased
        session = f"s{rng.randrange(12)}"
        rows.append(
            {"id": i, "chunk_id": f"{session}:{rng.randrange(10**6)}:{i % 3}", "session_id": session, "text": text}
        )
    return rows


def queries(rng: random.Random, n: int) -> list[str]:
    """1-4 terms mixing frequent and rare words, sometimes repeated, sometimes unknown."""
    out = []
    for _ in range(n):
        terms = []
        for _ in range(rng.randint(1, 4)):
            rank = int(np.exp(rng.uniform(0, np.log(VOCAB_SIZE))))
            terms.append(f"w{rank}")
        if rng.random() < 0.15:
            terms.append(terms[0])  # a repeated token counts again on both sides
        if rng.random() < 0.1:
            terms.append("unknownword")
        out.append(" ".join(terms))
    return out


@pytest.mark.parametrize("seed", [1, 2])
def test_same_top_k_and_scores_as_bm25s(tmp_path, seed):
    rng = random.Random(seed)
    rows = corpus(rng, 4000)
    conn, index = build(tmp_path, rows)

    vocab: dict[str, int] = {}
    token_ids = [[vocab.setdefault(t, len(vocab)) for t in tokenize(r["text"])] for r in rows]
    retriever = bm25s.BM25(method="lucene", k1=1.2, b=0.75, dtype="float64")
    retriever.index(bm25s.tokenization.Tokenized(ids=token_ids, vocab=vocab), show_progress=False)
    chunk_ids = np.array([r["chunk_id"] for r in rows])
    ids = np.array([r["id"] for r in rows])

    compared = 0
    for query in queries(rng, 150):
        tokens = [t for t in tokenize(query) if t in vocab]
        for k in (1, 6, 20):
            ours = index.search(query, k=k, recency=False)
            if not tokens:
                assert ours == []
                continue
            theirs = retriever.get_scores(tokens) * (K1 + 1)
            # bm25s's own top k, ordered by score then chunk_id (exact ties are common here, and
            # bm25s leaves their order unspecified).
            matched = np.flatnonzero(theirs > 0)
            order = sorted(matched.tolist(), key=lambda j: (-round(float(theirs[j]), 9), chunk_ids[j]))[:k]
            assert [i for i, _ in ours] == ids[order].tolist(), query
            for (_, score), j in zip(ours, order):
                assert score == pytest.approx(float(theirs[j]), rel=1e-6)
            # And bm25s's retrieve agrees on the scores of its top k.
            docs, scores = retriever.retrieve([tokens], k=min(k, len(matched)), show_progress=False)
            assert sorted(scores[0] * (K1 + 1), reverse=True) == pytest.approx(
                [s for _, s in ours][: len(matched)], rel=1e-6
            )
            compared += 1
    assert compared > 300
