"""Benchmarks of the BM25 engine (memstore.search), each measured side by side with a baseline in
one run.

    python bench/bench_search.py              # 100,000 and 1,000,000 chunks (about half an hour)
    python bench/bench_search.py --quick      # 20,000 chunks, a smoke run of seconds
    python bench/bench_search.py --sizes 100000 --workdir /tmp/x

The corpora are generated (seeded) and kept in ``--workdir`` between runs: words drawn from a
Zipf-like vocabulary of 300,000 words, with paths, line numbers and hex ids mixed in, in chunks of
mostly 300-1,000 bytes and some of several KB. Queries have 2-3 terms mixing a common word with
rarer ones. Printed, per corpus size:

- search p50 and p95 (of each query's median over the repetitions) for memstore, FTS5's own
  ``ORDER BY bm25()`` over the same chunks (same OR-of-tokens query, top 6) and bm25s (numpy
  backend, same tokens); ratio = baseline / memstore (goals: >= 20 against FTS5 at 1M, > 1
  against bm25s). Recency is on for memstore, which only makes it slower;
- indexing: ``SearchIndex.add`` (tokenize + postings + writes, committed) against sqlite-utils
  ``insert_all`` + ``enable_fts`` (FTS5) of the same chunks; ratio = FTS5 time / memstore time
  (goal >= 1). Shown with and without the chunk-row inserts on memstore's side;
- the first search in a fresh process (a subprocess: connect, build the caches, answer one query)
  against re-tokenizing the corpus (read every chunk's text and tokenize it); ratio = first search
  / re-tokenize (goal <= 0.05);
- adding one session (500 chunks) and removing it again, on each corpus: times should not grow
  with the corpus; then 64 sessions added one after another, merges included (mean and max).

The repetitions alternate between the sides and report medians, because this machine is shared
and noisy.

Last full run (2 cores, shared; ratios are baseline / memstore except first search):

    100,000 chunks: search p50 vs FTS5 10.3x, p95 32.1x; vs bm25s p50 5.2x, p95 4.4x;
      indexing 1.56x (1.11x counting the chunk inserts; the previous full run gave 1.04x and 0.78x);
      first search 0.018x of re-tokenizing; add a session 27 ms, remove it 4.7 ms
    1,000,000 chunks: search p50 vs FTS5 29.6x (2.0 ms vs 59 ms), p95 51.0x; vs bm25s p50 17.6x,
      p95 7.9x; indexing 1.76x (1.35x counting the chunk inserts); first search 0.012x of
      re-tokenizing (82 ms vs 6.9 s); add a session 27 ms, remove it 4.6 ms; 64 sessions in a row
      mean 48 ms, max 427 ms (a tier merge)
    add-session time 1,000,000 / 100,000: 0.99x
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from memstore.search import SearchIndex, fts_match, tokenize  # noqa: E402

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
GENERATOR_VERSION = 1
VOCAB_SIZE = 300_000
KINDS = ("agent_message", "reasoning", "command_execution", "tool_output", "file_change", "error")


# ----------------------------------------------------------------------------------------------
# Corpus


def make_vocab(rng: np.random.Generator) -> list[str]:
    """VOCAB_SIZE distinct lowercase words, short ones first (Zipf rank 1 is the shortest)."""
    letters = np.frombuffer(b"etaoinshrdlcumwfgypbvkjxqz", np.uint8)
    seen: set[str] = set()
    words: list[str] = []
    while len(words) < VOCAB_SIZE:
        length = int(min(14, 2 + rng.geometric(0.25)))
        word = bytes(letters[np.minimum(rng.geometric(0.15, length) - 1, 25)]).decode()
        if word not in seen:
            seen.add(word)
            words.append(word)
    words.sort(key=len)
    return words


def zipf_cdf(n: int, s: float = 1.07) -> np.ndarray:
    weights = 1.0 / np.arange(1, n + 1) ** s
    return np.cumsum(weights) / weights.sum()


def generate(n_chunks: int, seed: int = 20261130):
    """Yield chunk rows (dicts with the chunks columns), deterministic for a seed."""
    rng = np.random.default_rng(seed)
    vocab = np.array(make_vocab(rng), dtype=object)
    cdf = zipf_cdf(len(vocab))
    block = 5000
    chunk_no = 0
    session = 0
    seq = 0
    base = 1_780_000_000.0  # 2026-05-28
    while chunk_no < n_chunks:
        count = min(block, n_chunks - chunk_no)
        # Bytes per chunk: lognormal around 600 (most 300-1,000), a tail of multi-KB outputs.
        sizes = np.clip(rng.lognormal(6.4, 0.45, count), 40, 4000).astype(int)
        big = rng.random(count) < 0.06
        sizes[big] = rng.integers(2000, 9000, int(big.sum()))
        n_words = np.maximum(sizes // 7, 1)
        word_idx = np.searchsorted(cdf, rng.random(int(n_words.sum())))
        words = vocab[np.minimum(word_idx, len(vocab) - 1)]
        extras = rng.random(len(words))
        starts = np.concatenate(([0], np.cumsum(n_words)))
        for j in range(count):
            a, b = starts[j], starts[j + 1]
            parts = list(words[a:b])
            e = extras[a:b]
            # Code-ish noise: paths, line numbers, hex ids, punctuation.
            for p in np.flatnonzero(e < 0.04):
                parts[p] = f"src/{parts[p]}.rs:{int(e[p] * 25000)}"
            for p in np.flatnonzero((e >= 0.04) & (e < 0.05)):
                parts[p] = f"{int(e[p] * 1e15):x}"
            for p in np.flatnonzero((e >= 0.05) & (e < 0.08)):
                parts[p] = parts[p].capitalize() + "."
            if chunk_no % 400 == 0:
                session += 1
                seq = 0
            seq += 1
            created = base + chunk_no * 15.0
            yield {
                "id": chunk_no + 1,
                "chunk_id": f"s{session:06d}:{seq}:0",
                "session_id": f"s{session:06d}",
                "seq": seq,
                "turn": seq // 10,
                "part": 0,
                "source": "event",
                "kind": KINDS[chunk_no % len(KINDS)],
                "created_at": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(created)) + ".000Z",
                "text": " ".join(parts),
            }
            chunk_no += 1


def corpus_db(workdir: Path, n_chunks: int) -> Path:
    """A SQLite file holding the generated chunks (made once, kept in workdir)."""
    path = workdir / f"corpus-{n_chunks}-v{GENERATOR_VERSION}.db"
    if path.exists():
        return path
    print(f"  generating {n_chunks:,} chunks into {path} ...", flush=True)
    started = time.perf_counter()
    tmp = path.with_suffix(".tmp")
    tmp.unlink(missing_ok=True)
    conn = sqlite3.connect(tmp)
    conn.execute(CHUNKS_DDL)
    columns = ("id", "chunk_id", "session_id", "seq", "turn", "part", "source", "kind", "created_at", "text")
    conn.executemany(
        f"INSERT INTO chunks ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})",
        (tuple(row[c] for c in columns) for row in generate(n_chunks)),
    )
    conn.commit()
    conn.close()
    tmp.rename(path)
    print(f"  generated in {time.perf_counter() - started:.0f}s", flush=True)
    return path


def load_rows(path: Path) -> list[dict]:
    conn = sqlite3.connect(path)
    conn.row_factory = sqlite3.Row
    rows = [dict(r) for r in conn.execute("SELECT * FROM chunks ORDER BY id")]
    conn.close()
    return rows


def make_queries(n: int, seed: int = 7) -> list[str]:
    """2-3 term queries: one common word (Zipf rank 5-300) and rarer ones (rank 300-60,000)."""
    rng = np.random.default_rng(seed)
    vocab = make_vocab(np.random.default_rng(20261130))
    queries = []
    for _ in range(n):
        terms = [vocab[int(rng.integers(5, 300))]]
        for _ in range(int(rng.integers(1, 3))):
            terms.append(vocab[int(np.exp(rng.uniform(np.log(300), np.log(60_000))))])
        rng.shuffle(terms)
        queries.append(" ".join(terms))
    return queries


# ----------------------------------------------------------------------------------------------
# Helpers


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def p95(xs: list[float]) -> float:
    return float(np.percentile(xs, 95))


def drop_caches_hint() -> None:
    gc.collect()


def fmt_ms(seconds: float) -> str:
    return f"{seconds * 1000:8.2f} ms"


def line(label: str, ours: float, theirs: float, ratio: float, note: str) -> None:
    print(f"  {label:44s} memstore {fmt_ms(ours)}   {note:>18s} {fmt_ms(theirs)}   ratio {ratio:8.2f}")


# ----------------------------------------------------------------------------------------------
# Sides


def build_memstore(path: Path, rows: list[dict]) -> tuple[float, float]:
    """Insert the chunk rows (timed separately), then index them. Returns (insert s, index s)."""
    import sqlite_utils

    path.unlink(missing_ok=True)
    db = sqlite_utils.Database(path)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute(CHUNKS_DDL)
    started = time.perf_counter()
    db["chunks"].insert_all(rows, batch_size=1000)
    inserted = time.perf_counter()
    index = SearchIndex(db)
    index.ensure_schema()
    index.add((r["id"], r["text"], r["created_at"]) for r in rows)
    db.conn.commit()
    done = time.perf_counter()
    db.conn.close()
    return inserted - started, done - inserted


def build_fts(path: Path, rows: list[dict]) -> float:
    import sqlite_utils

    path.unlink(missing_ok=True)
    db = sqlite_utils.Database(path)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute(CHUNKS_DDL)
    started = time.perf_counter()
    db["chunks"].insert_all(rows, batch_size=1000)
    db["chunks"].enable_fts(["text"], fts_version="FTS5")
    db.conn.commit()
    done = time.perf_counter()
    db.conn.close()
    return done - started


def build_bm25s(rows: list[dict]):
    import bm25s

    vocab: dict[str, int] = {}
    ids = [[vocab.setdefault(t, len(vocab)) for t in tokenize(r["text"])] for r in rows]
    retriever = bm25s.BM25(method="lucene", k1=1.2, b=0.75, backend="numpy")
    retriever.index(bm25s.tokenization.Tokenized(ids=ids, vocab=vocab), show_progress=False)
    return retriever


def fts_query(conn: sqlite3.Connection, query: str, k: int = 6) -> list[int]:
    match = fts_match(query)
    if match is None:
        return []
    return [r[0] for r in conn.execute(
        "SELECT rowid FROM chunks_fts WHERE chunks_fts MATCH ? ORDER BY bm25(chunks_fts) LIMIT ?", (match, k)
    )]


def bm25s_query(retriever, query: str, k: int = 6):
    tokens = [t for t in tokenize(query) if t in retriever.vocab_dict]
    if not tokens:
        return []
    docs, _scores = retriever.retrieve([tokens], k=k, show_progress=False, n_threads=0)
    return docs


FIRST_SEARCH_CHILD = r"""
import sys, time, json, sqlite3
sys.path.insert(0, sys.argv[1])
from memstore.search import SearchIndex
t0 = time.perf_counter()
conn = sqlite3.connect(sys.argv[2])
index = SearchIndex(conn)
hits = index.search(sys.argv[3])
t1 = time.perf_counter()
again = index.search(sys.argv[3])
t2 = time.perf_counter()
print(json.dumps({"first": t1 - t0, "second": t2 - t1, "hits": len(hits)}))
"""


def first_search(path: Path, query: str) -> dict:
    started = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-c", FIRST_SEARCH_CHILD, str(ROOT), str(path), query],
        check=True, capture_output=True, text=True,
    ).stdout
    result = json.loads(out)
    result["process"] = time.perf_counter() - started
    return result


def retokenize(path: Path) -> float:
    started = time.perf_counter()
    conn = sqlite3.connect(path)
    for (text,) in conn.execute("SELECT text FROM chunks"):
        tokenize(text)
    conn.close()
    return time.perf_counter() - started


# ----------------------------------------------------------------------------------------------
# Runs


def run_size(n: int, workdir: Path, reps: int, n_queries: int, with_bm25s: bool, n_sustained: int) -> dict:
    print(f"\n== {n:,} chunks", flush=True)
    source = corpus_db(workdir, n)
    rows = load_rows(source)
    mb = sum(len(r["text"].encode()) for r in rows) / 1e6
    print(f"  {len(rows):,} chunks, {mb:,.0f} MB of text", flush=True)
    ours_path = workdir / f"memstore-{n}.db"
    fts_path = workdir / f"fts5-{n}.db"
    figures: dict = {"n": n}

    # Indexing, alternating sides; each repetition starts from an empty file.
    index_reps = 1 if n >= 500_000 else 2
    insert_times, index_times, fts_times = [], [], []
    for rep in range(index_reps):
        order = [0, 1] if rep % 2 == 0 else [1, 0]
        for side in order:
            drop_caches_hint()
            if side == 0:
                ins, idx = build_memstore(ours_path, rows)
                insert_times.append(ins)
                index_times.append(idx)
            else:
                fts_times.append(build_fts(fts_path, rows))
    ours_idx, ours_ins, fts_t = median(index_times), median(insert_times), median(fts_times)
    line("indexing (add)  vs insert_all+enable_fts", ours_idx, fts_t, fts_t / ours_idx, "FTS5")
    line("indexing (insert_all+add) vs same", ours_ins + ours_idx, fts_t, fts_t / (ours_ins + ours_idx), "FTS5")
    print(f"  {'':44s} memstore add {mb / ours_idx:.1f} MB/s, FTS5 {mb / fts_t:.1f} MB/s", flush=True)
    figures.update(index_s=ours_idx, insert_s=ours_ins, fts_index_s=fts_t)

    retriever = None
    if with_bm25s:
        started = time.perf_counter()
        retriever = build_bm25s(rows)
        figures["bm25s_index_s"] = time.perf_counter() - started
        print(f"  (bm25s indexed in {figures['bm25s_index_s']:.1f}s)", flush=True)
    del rows
    gc.collect()

    # Search.
    queries = make_queries(n_queries)
    ours_conn = sqlite3.connect(ours_path)
    index = SearchIndex(ours_conn)
    fts_conn = sqlite3.connect(fts_path)
    for q in queries[:5]:  # warm both sides' caches alike
        index.search(q)
        fts_query(fts_conn, q)
    times: dict[str, list[list[float]]] = {"ours": [[] for _ in queries], "fts": [[] for _ in queries],
                                           "bm25s": [[] for _ in queries]}
    sides = ["ours", "fts"] + (["bm25s"] if retriever is not None else [])
    for rep in range(reps):
        for qi, q in enumerate(queries):
            rotation = sides[rep % len(sides):] + sides[:rep % len(sides)]
            for side in rotation:
                started = time.perf_counter()
                if side == "ours":
                    index.search(q)
                elif side == "fts":
                    fts_query(fts_conn, q)
                else:
                    bm25s_query(retriever, q)
                times[side][qi].append(time.perf_counter() - started)
    per_query = {side: [median(ts) for ts in times[side]] for side in sides}
    for side in sides[1:]:
        label = "FTS5 bm25()" if side == "fts" else "bm25s numpy"
        o50, t50 = median(per_query["ours"]), median(per_query[side])
        o95, t95 = p95(per_query["ours"]), p95(per_query[side])
        line(f"search p50 vs {label}", o50, t50, t50 / o50, label)
        line(f"search p95 vs {label}", o95, t95, t95 / o95, label)
        figures[f"{side}_p50_ratio"] = t50 / o50
        figures[f"{side}_p95_ratio"] = t95 / o95
    figures["ours_p50_ms"] = median(per_query["ours"]) * 1000
    figures["ours_p95_ms"] = p95(per_query["ours"]) * 1000
    fts_conn.close()

    # First search in a fresh process vs re-tokenizing.
    ours_conn.close()
    firsts = []
    retoks = []
    for rep in range(5):  # each with another query, alternating with the re-tokenizing runs
        firsts.append(first_search(ours_path, queries[rep]))
        if rep < 2:
            retoks.append(retokenize(ours_path))
    first = median([f["first"] for f in firsts])
    retok = median(retoks)
    line("first search (fresh process) vs re-tokenize", first, retok, first / retok, "re-tokenize")
    print(f"  {'':44s} (each first search: {', '.join(format(f['first'] * 1000, '.1f') for f in firsts)} ms;"
          f" whole subprocess incl. interpreter and imports: "
          f"{median([f['process'] for f in firsts]):.2f}s; its second search {median([f['second'] for f in firsts]) * 1000:.2f} ms)")
    figures.update(first_s=first, retokenize_s=retok, first_ratio=first / retok)

    # One session added and removed.
    conn = sqlite3.connect(ours_path)
    index = SearchIndex(conn)
    session_rows = [r for r in generate(500, seed=99)]
    next_id = conn.execute("SELECT max(id) FROM chunks").fetchone()[0] + 1
    add_times, remove_times = [], []
    for rep in range(7):
        docs = [(next_id + i, r["text"], r["created_at"]) for i, r in enumerate(session_rows)]
        next_id += len(docs)
        started = time.perf_counter()
        index.add(docs)
        conn.commit()
        added = time.perf_counter()
        index.remove([d[0] for d in docs])
        conn.commit()
        removed = time.perf_counter()
        add_times.append(added - started)
        remove_times.append(removed - added)
    figures.update(add_session_s=median(add_times), remove_session_s=median(remove_times),
                   add_session_max_s=max(add_times))
    print(f"  add one session (500 chunks): median {fmt_ms(median(add_times))}, max {fmt_ms(max(add_times))};"
          f" remove it: median {fmt_ms(median(remove_times))}", flush=True)

    # Sessions added one after another: the tiered merges run along the way (within the
    # auto-merge budget), so this shows their amortized and worst-case cost.
    sustained = []
    added_ids: list[int] = []
    for rep in range(n_sustained):
        docs = [(next_id + i, r["text"], r["created_at"]) for i, r in enumerate(session_rows)]
        next_id += len(docs)
        added_ids += [d[0] for d in docs]
        started = time.perf_counter()
        index.add(docs)
        conn.commit()
        sustained.append(time.perf_counter() - started)
    index.remove(added_ids)
    conn.commit()
    conn.close()
    figures.update(sustained_mean_s=statistics.mean(sustained), sustained_max_s=max(sustained))
    print(f"  {n_sustained} sessions added one after another: mean {fmt_ms(statistics.mean(sustained))},"
          f" median {fmt_ms(median(sustained))}, max {fmt_ms(max(sustained))} (merges included)", flush=True)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="20,000 chunks, few repetitions")
    parser.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")], default=None)
    parser.add_argument("--workdir", type=Path, default=Path(os.environ.get("TMPDIR", "/tmp")) / "memstore-bench-search")
    parser.add_argument("--reps", type=int, default=None)
    parser.add_argument("--queries", type=int, default=None)
    parser.add_argument("--no-bm25s", action="store_true")
    args = parser.parse_args()
    sizes = args.sizes or ([20_000] if args.quick else [100_000, 1_000_000])
    reps = args.reps or (3 if args.quick else 5)
    n_queries = args.queries or (30 if args.quick else 100)
    args.workdir.mkdir(parents=True, exist_ok=True)
    print(f"memstore search benchmark: sizes {sizes}, {n_queries} queries x {reps} repetitions, workdir {args.workdir}")
    n_sustained = 8 if args.quick else 64
    results = [run_size(n, args.workdir, reps, n_queries, not args.no_bm25s, n_sustained) for n in sizes]
    print("\n== summary (ratios; goals in brackets)")
    for r in results:
        print(f"  {r['n']:>9,} chunks: search p50 vs FTS5 {r['fts_p50_ratio']:.1f}x [>= 20 at 1M], p95 {r['fts_p95_ratio']:.1f}x;"
              + (f" vs bm25s p50 {r['bm25s_p50_ratio']:.1f}x, p95 {r['bm25s_p95_ratio']:.1f}x [> 1];" if 'bm25s_p50_ratio' in r else "")
              + f" indexing {r['fts_index_s'] / r['index_s']:.2f}x [>= 1]"
              f" ({r['fts_index_s'] / (r['index_s'] + r['insert_s']):.2f}x counting the chunk inserts);"
              f" first search {r['first_ratio']:.4f}x of re-tokenizing [<= 0.05];"
              f" add a session {r['add_session_s'] * 1000:.1f} ms, remove it {r['remove_session_s'] * 1000:.1f} ms,"
              f" sustained adds mean {r['sustained_mean_s'] * 1000:.1f} ms / max {r['sustained_max_s'] * 1000:.0f} ms")
    if len(results) > 1:
        a, b = results[0], results[-1]
        print(f"  add-session time {b['n']:,} / {a['n']:,}: {b['add_session_s'] / a['add_session_s']:.2f}x [about 1]")


if __name__ == "__main__":
    main()
