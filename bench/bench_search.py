"""Search benchmarks: memstore's search through the calls people make, against SQLite FTS5's
``bm25()`` over the same texts, side by side in one run.

    python bench/bench_search.py                  # 100,000 and 1,000,000 chunks
    python bench/bench_search.py --quick          # 20,000 chunks, a smoke run
    python bench/bench_search.py --sizes 300000 --workdir DIR
    python bench/bench_search.py --engine         # also the engine's own figures (see below)

**The store.** A real memstore store, written with ``open_session``/``append`` as an agent writes
its log (durability ``"none"``, as an import does), then its catalog refreshed. A session is
10-60 turns about a few source files; a turn is a user prompt, reasoning, 2-4 tool calls with
their results (file reads, grep hits), now and then a command with kilobytes of output (test
runs, tracebacks, git logs) or a diff, and an answer. Events are mostly 300-1,000 bytes, some of
many KB (split into chunks of at most 2,000 characters, as the catalog does). The text is made
from real text: prose words drawn with their real frequencies from the docstrings and comments
of Python's standard library, code quoted from its source files, identifiers with their real
frequencies in that code, plus the long tail agent logs have (paths, line numbers, durations,
hex ids, commit hashes, temporary directories). A session's files' identifiers recur in its
prose, as they do in real work. Stores are built once per size and kept in ``--workdir``.

**Queries** are 2-3 words as people type them: a common word (prose rank 20-400) with rarer
prose words (rank 400-12,000) and, half the time, an identifier of the code (rank 50-20,000).

**Measured**, each query's median over the repetitions (the sides alternate, because this
machine is shared and noisy), then p50 and p95 over the queries; ratios are baseline / memstore
(above 1: memstore is faster). Both sides make the same results: the hits' rows read from
``chunks`` and a snippet made with the library's snippet function.

1. *kept index*: ``search_catalog(conn, q, limit=6)`` on an open catalog connection, against
   FTS5 on the same connection: the query's tokens quoted and OR-ed, ``ORDER BY bm25() LIMIT 6``
   on the catalog's ``chunks_fts``.
2. *search_memory*: ``search_memory(root, q)``, the public call, which refreshes the catalog
   (three ``stat`` calls per session), opens a connection and searches with the process's kept
   index, against the same freshness through FTS5: ``refresh_catalog(root)``, a connection, the
   FTS5 query of 1. The refresh alone is shown too.
3. *no kept index*, for reference: ``SearchIndex(conn).search`` with a new index object per
   query (what ``search_memory`` did before the index was kept: every segment's arrays read
   again), against the kept index of 1.

``--engine`` adds the engine's figures on the same chunk texts: indexing (``SearchIndex.add``
against sqlite-utils ``insert_all`` + ``enable_fts``), the first search in a fresh process
against re-tokenizing the corpus, bm25s (numpy backend) as a second ranking baseline, and adding
and removing a session of 500 chunks.

Last run (2 cores, shared; the stores took 6 + 12 minutes to write and refresh at 1,000,000
chunks, 1 + 1 at 100,000; ratios FTS5 time / memstore time):

    100,209 chunks, 271 sessions, 55 MB of text:
      1. search_catalog p50 1.05 ms vs FTS5 7.58 ms: 7.2x; p95 1.99 vs 29.9 ms: 15.0x
      2. search_memory p50 18.1 ms vs refresh+FTS5 26.4 ms: 1.46x; p95 1.99x (refresh alone 12.0 ms)
      3. kept index p50 0.88 ms vs a new one per query 4.03 ms (4.6x); p95 1.65 vs 49.1 ms
    1,000,327 chunks, 2,738 sessions, 551 MB of text (97% of memstore's top 6 in FTS5's top 6):
      1. search_catalog p50 3.73 ms vs FTS5 105.5 ms: 28.3x; p95 15.0 vs 365.2 ms: 24.3x
      2. search_memory p50 262 ms vs refresh+FTS5 406 ms: 1.55x; p95 370 vs 795 ms: 2.15x
         (refresh alone 153 ms: the refresh's stat of every session dominates)
      3. kept index p50 7.2 ms vs a new one per query 165 ms (22.9x); p95 22 vs 1,481 ms
"""

from __future__ import annotations

import argparse
import ast
import gc
import json
import multiprocessing
import os
import re
import sqlite3
import statistics
import subprocess
import sys
import sysconfig
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import memstore  # noqa: E402
from memstore.bm25 import SearchIndex, tokenize  # noqa: E402
from memstore.catalog import refresh_catalog  # noqa: E402
from memstore.layout import catalog_path  # noqa: E402
from memstore.search import fts_match, search_catalog, search_memory, snippet  # noqa: E402

CORPUS_VERSION = 2
LIMIT = 6
BASE_TIME = 1_780_000_000  # 2026-05-28, the first session's start


# ----------------------------------------------------------------------------------------------
# Vocabulary: real words, identifiers and code, from Python's standard library


def stdlib_files() -> tuple[Path, list[Path]]:
    """The standard library's own modules (not its tests, not site-packages), sorted."""
    base = Path(sysconfig.get_paths()["stdlib"])
    # Not tests, and not the modules that are data tables (codecs' character maps, Unicode names).
    skip = {"site-packages", "test", "tests", "idlelib", "__pycache__", "encodings", "pydoc_data"}
    return base, sorted(f for f in base.rglob("*.py") if not skip & set(f.relative_to(base).parts))


_PROSE_WORD = re.compile(r"[A-Za-z]+(?:'[a-z]+)?")
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{2,}")


def extract_vocabulary(workdir: Path) -> dict:
    """Prose words (docstrings and comments) and identifiers (code) with their counts, and the
    files with their lines; computed once and kept in ``workdir``."""
    version = f"{sys.version_info.major}.{sys.version_info.minor}.{sys.version_info.micro}"
    path = workdir / f"vocabulary-v{CORPUS_VERSION}-py{version}.json"
    if path.exists():
        return json.loads(path.read_text())
    base, files = stdlib_files()
    prose: Counter = Counter()
    # Python's own documentation (the strings of pydoc's topics): English prose of the domain.
    topics = base / "pydoc_data" / "topics.py"
    if topics.exists():
        for node in ast.walk(ast.parse(topics.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                prose.update(w.lower() for w in _PROSE_WORD.findall(node.value))
    identifiers: Counter = Counter()
    kept = []
    for file in files:
        try:
            text = file.read_text(encoding="utf-8")
            tree = ast.parse(text)
        except (UnicodeDecodeError, SyntaxError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node, clean=False)
                if doc:
                    prose.update(w.lower() for w in _PROSE_WORD.findall(doc))
        lines = text.splitlines()
        for line in lines:
            stripped = line.strip()
            if stripped.startswith("#"):
                prose.update(w.lower() for w in _PROSE_WORD.findall(stripped))
            elif stripped:
                identifiers.update(_IDENTIFIER.findall(stripped))
        if len(lines) >= 40:
            kept.append(str(file.relative_to(base)))
    data = {
        "prose": [[w, c] for w, c in prose.most_common()],
        "identifiers": [[w, c] for w, c in identifiers.most_common() if c >= 2],
        "files": kept,
        "stdlib": str(base),
    }
    path.write_text(json.dumps(data))
    return data


class Vocabulary:
    """Samplers over the extracted vocabulary (real frequencies)."""

    def __init__(self, data: dict) -> None:
        self.prose = np.array([w for w, _ in data["prose"]], dtype=object)
        counts = np.array([c for _, c in data["prose"]], np.float64)
        self.prose_cdf = np.cumsum(counts) / counts.sum()
        self.identifiers = np.array([w for w, _ in data["identifiers"]], dtype=object)
        counts = np.array([c for _, c in data["identifiers"]], np.float64)
        self.ident_cdf = np.cumsum(counts) / counts.sum()
        self.files = data["files"]
        self.stdlib = Path(data["stdlib"])


# ----------------------------------------------------------------------------------------------
# Sessions


COMMON_COMMANDS = (
    "python -m pytest -q",
    "python -m pytest -x {path}",
    "git log --oneline -n 20",
    "git diff --stat",
    "python -m mypy {path}",
    "ruff check {path}",
    "make test",
)
TOOLS = ("read_file", "grep", "list_files", "read_file", "grep")


class SessionText:
    """The text of one session: deterministic for (seed, session number)."""

    def __init__(self, vocab: Vocabulary, seed: int, number: int) -> None:
        self.v = vocab
        self.rng = np.random.default_rng([seed, number])
        picks = self.rng.choice(len(vocab.files), size=int(self.rng.integers(2, 7)), replace=False)
        self.paths = [vocab.files[int(i)] for i in picks]
        self.lines = {p: (vocab.stdlib / p).read_text(encoding="utf-8").splitlines() for p in self.paths}
        own: Counter = Counter()
        for lines in self.lines.values():
            for line in lines:
                own.update(_IDENTIFIER.findall(line))
        self.own = np.array([w for w, _ in own.most_common(400)], dtype=object) if own else vocab.identifiers[:400]
        self._words = np.zeros(0, dtype=object)
        self._at = 0

    def words(self, n: int) -> list:
        """``n`` prose words: real frequencies, with the session's identifiers (8%), other code
        identifiers (3%) and numbers (2%) mixed in."""
        if self._at + n > len(self._words):
            size = max(4096, n)
            words = self.v.prose[
                np.minimum(np.searchsorted(self.v.prose_cdf, self.rng.random(size)), len(self.v.prose) - 1)
            ]
            mix = self.rng.random(size)
            own = mix < 0.08
            words[own] = self.own[np.minimum(self.rng.zipf(1.3, int(own.sum())) - 1, len(self.own) - 1)]
            other = (mix >= 0.08) & (mix < 0.11)
            words[other] = self.identifier(int(other.sum()))
            numbers = (mix >= 0.11) & (mix < 0.13)
            words[numbers] = [str(x) for x in self.rng.integers(0, 5000, int(numbers.sum()))]
            self._words, self._at = words, 0
        out = list(self._words[self._at : self._at + n])
        self._at += n
        return out

    def identifier(self, n: int) -> np.ndarray:
        at = np.searchsorted(self.v.ident_cdf, self.rng.random(n))
        return self.v.identifiers[np.minimum(at, len(self.v.identifiers) - 1)]

    def prose(self, lo: int, hi: int) -> str:
        """Sentences of 5-24 words, about ``lo``-``hi`` characters."""
        size = int(self.rng.integers(lo, hi))
        sentences, length = [], 0
        while length < size:
            words = self.words(int(self.rng.integers(5, 25)))
            if self.rng.random() < 0.3:
                at = int(self.rng.integers(1, len(words)))
                words[at - 1] = words[at - 1] + ","
            if self.rng.random() < 0.25:
                at = int(self.rng.integers(0, len(words)))
                words[at] = f"`{words[at]}`"
            sentence = " ".join(words)
            sentence = sentence[:1].upper() + sentence[1:] + "."
            sentences.append(sentence)
            length += len(sentence) + 1
        return " ".join(sentences)

    def path(self) -> str:
        return self.paths[int(self.rng.integers(0, len(self.paths)))]

    def window(self, path: str, lo: int, hi: int) -> tuple[int, list[str]]:
        lines = self.lines[path]
        count = min(len(lines), int(self.rng.integers(lo, hi)))
        start = int(self.rng.integers(0, len(lines) - count + 1))
        return start + 1, lines[start : start + count]

    def file_read(self) -> tuple[str, str]:
        path = self.path()
        first, lines = self.window(path, 8, 40)
        return path, "\n".join(f"{first + i:6d}\t{line}" for i, line in enumerate(lines))

    def grep(self, pattern: str) -> str:
        out = []
        for _ in range(int(self.rng.integers(3, 16))):
            path = self.path()
            first, lines = self.window(path, 1, 2)
            out.append(f"Lib/{path}:{first}:{lines[0] if lines else ''}")
        return "\n".join(out)

    def hex(self, digits: int) -> str:
        return "".join("0123456789abcdef"[int(d)] for d in self.rng.integers(0, 16, digits))

    def command(self) -> tuple[str, str]:
        """A command and its output, 1,500-8,000 characters."""
        template = COMMON_COMMANDS[int(self.rng.integers(0, len(COMMON_COMMANDS)))]
        command = template.format(path=f"Lib/{self.path()}")
        size = int(self.rng.integers(1500, 8000))
        out: list[str] = []
        length = 0
        while length < size:
            roll = self.rng.random()
            if template.startswith("git log"):
                line = f"{self.hex(7)} {self.prose(20, 70).rstrip('.')}"
            elif roll < 0.45:
                name = self.own[int(self.rng.integers(0, len(self.own)))]
                status = "PASSED" if self.rng.random() < 0.85 else "FAILED"
                line = f"tests/test_{Path(self.path()).stem}.py::test_{name} {status} [{int(self.rng.integers(0, 100)):3d}%]"
            elif roll < 0.75:
                path = self.path()
                first, lines = self.window(path, 1, 3)
                where = self.own[int(self.rng.integers(0, len(self.own)))]
                line = f'  File "/home/dev/project/Lib/{path}", line {first}, in {where}\n' + "\n".join(
                    "    " + code.strip() for code in lines
                )
            elif roll < 0.85:
                a, b = self.rng.integers(0, 10_000, 2)
                line = f"E       AssertionError: assert {a} == {b}"
            elif roll < 0.93:
                line = (
                    f"{self.prose(30, 90)} /tmp/pytest-of-dev/pytest-{int(self.rng.integers(0, 999))}/"
                    f"{self.words(1)[0]}0 took {self.rng.random() * 9:.2f}s"
                )
            else:
                line = (
                    f"===== {int(self.rng.integers(0, 9))} failed, {int(self.rng.integers(10, 900))} passed in "
                    f"{self.rng.random() * 60:.2f}s ({self.hex(12)}) ====="
                )
            out.append(line)
            length += len(line) + 1
        return command, "\n".join(out)

    def diff(self) -> tuple[str, str]:
        """A unified diff of 400-2,500 characters over real lines, some changed."""
        path = self.path()
        first, lines = self.window(path, 10, 60)
        body = [f"--- a/Lib/{path}", f"+++ b/Lib/{path}", f"@@ -{first},{len(lines)} +{first},{len(lines)} @@"]
        length = 0
        for line in lines:
            if self.rng.random() < 0.15:
                body.append("-" + line)
                names = _IDENTIFIER.findall(line)
                new = line.replace(names[0], self.identifier(1)[0], 1) if names else line + "  # " + self.prose(10, 40)
                body.append("+" + new)
            else:
                body.append(" " + line)
            length += len(line)
            if length > 2500:
                break
        return path, "\n".join(body)


def session_events(text: SessionText, number: int) -> list[tuple[dict, str]]:
    """A session's events with their times."""
    rng = text.rng
    moment = BASE_TIME + number * 3600.0
    events: list[tuple[dict, str]] = []

    def add(event: dict) -> None:
        nonlocal moment
        moment += float(rng.integers(2, 40))
        events.append((event, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(moment)) + ".000Z"))

    add({"type": "thread.started", "thread_id": f"s{number:06d}"})
    for turn in range(int(rng.integers(10, 61))):
        add({"type": "turn.started"})
        add({"type": "item.completed", "item": {"id": f"u{turn}", "type": "user_message", "text": text.prose(60, 400)}})
        add({"type": "item.completed", "item": {"id": f"r{turn}", "type": "reasoning", "text": text.prose(300, 1000)}})
        for _ in range(int(rng.integers(2, 5))):
            tool = TOOLS[int(rng.integers(0, len(TOOLS)))]
            call_id = f"call_{text.hex(24)}"
            if tool == "grep":
                pattern = str(text.own[int(rng.integers(0, len(text.own)))])
                arguments: dict = {"pattern": pattern, "path": "Lib/"}
                output = text.grep(pattern)
            elif tool == "list_files":
                arguments = {"path": f"Lib/{Path(text.path()).parent}"}
                output = (
                    "\n".join(f"Lib/{p}" for p in text.paths)
                    + "\n"
                    + "\n".join(f"Lib/{text.v.files[int(i)]}" for i in rng.integers(0, len(text.v.files), 12))
                )
            else:
                path, output = text.file_read()
                arguments = {"path": f"Lib/{path}"}
            add(
                {
                    "type": "item.completed",
                    "item": {
                        "id": call_id,
                        "type": "tool_invocation",
                        "tool_name": tool,
                        "arguments": arguments,
                        "status": "completed",
                    },
                }
            )
            add(
                {
                    "type": "item.completed",
                    "item": {
                        "id": f"{call_id}:out",
                        "type": "tool_output",
                        "call_id": call_id,
                        "output": output,
                        "status": "completed",
                    },
                }
            )
        if rng.random() < 0.35:
            command, output = text.command()
            add(
                {
                    "type": "item.completed",
                    "item": {
                        "id": f"cmd{turn}",
                        "type": "command_execution",
                        "command": command,
                        "aggregated_output": output,
                        "exit_code": int(rng.random() < 0.3),
                        "status": "completed",
                    },
                }
            )
        if rng.random() < 0.3:
            path, diff = text.diff()
            add(
                {
                    "type": "item.completed",
                    "item": {
                        "id": f"fc{turn}",
                        "type": "file_change",
                        "status": "completed",
                        "changes": [{"path": f"Lib/{path}", "kind": "update"}],
                        "unified_diff": diff,
                    },
                }
            )
        add(
            {
                "type": "item.completed",
                "item": {"id": f"m{turn}", "type": "agent_message", "text": text.prose(100, 800)},
            }
        )
        add(
            {
                "type": "turn.completed",
                "usage": {
                    "input_tokens": int(rng.integers(1000, 90000)),
                    "cached_input_tokens": int(rng.integers(0, 900)),
                    "output_tokens": int(rng.integers(100, 900)),
                },
            }
        )
    return events


def write_sessions(args: tuple[str, str, int, int, int, int]) -> tuple[int, int]:
    """Worker: write sessions ``worker``, ``worker + jobs``, ... until they hold ``target``
    chunks. Returns (sessions, chunks) written."""
    from memstore.views.chunks import event_chunks

    root, workdir, worker, jobs, target, seed = args
    vocab = Vocabulary(extract_vocabulary(Path(workdir)))
    chunks = sessions = 0
    number = worker
    while chunks < target:
        text = SessionText(vocab, seed, number)
        with memstore.open_session(root, f"s{number:06d}", max_events=0, durability="none") as log:
            for seq, (event, ts) in enumerate(session_events(text, number), start=1):
                log.append(event, ts=ts)
                chunks += len(event_chunks(seq, None, ts, event))
        sessions += 1
        number += jobs
    return sessions, chunks


def store_for(workdir: Path, n_chunks: int, jobs: int, seed: int = 20261130) -> Path:
    """A store of about ``n_chunks`` chunks with its catalog refreshed (built once, kept)."""
    root = workdir / f"store-{n_chunks}-v{CORPUS_VERSION}"
    done = root / "BUILT"
    if done.exists():
        return root
    if root.exists():
        import shutil

        shutil.rmtree(root)
    extract_vocabulary(workdir)
    print(f"  writing a store of about {n_chunks:,} chunks into {root} ({jobs} processes) ...", flush=True)
    started = time.perf_counter()
    tasks = [(str(root), str(workdir), w, jobs, -(-n_chunks // jobs), seed) for w in range(jobs)]
    if jobs == 1:
        written = [write_sessions(tasks[0])]
    else:
        with multiprocessing.get_context("spawn").Pool(jobs) as pool:
            written = pool.map(write_sessions, tasks)
    sessions = sum(s for s, _ in written)
    print(
        f"  {sessions:,} sessions written in {time.perf_counter() - started:.0f}s; refreshing the catalog ...",
        flush=True,
    )
    started = time.perf_counter()
    refresh_catalog(root)
    print(f"  catalog refreshed in {time.perf_counter() - started:.0f}s", flush=True)
    done.write_text(json.dumps({"sessions": sessions}))
    return root


def make_queries(vocab: Vocabulary, n: int, seed: int = 7) -> list[str]:
    """2-3 words: a common prose word, rarer prose words, half the time a code identifier."""
    rng = np.random.default_rng(seed)
    queries = []
    while len(queries) < n:
        terms = [vocab.prose[int(rng.integers(20, 400))]]
        for _ in range(int(rng.integers(1, 3))):
            if rng.random() < 0.5:
                terms.append(vocab.identifiers[int(np.exp(rng.uniform(np.log(50), np.log(20_000))))])
            else:
                terms.append(
                    vocab.prose[int(np.exp(rng.uniform(np.log(400), np.log(min(12_000, len(vocab.prose) - 1)))))]
                )
        rng.shuffle(terms)
        queries.append(" ".join(terms))
    return queries


# ----------------------------------------------------------------------------------------------
# The FTS5 side: ranked by FTS5, hydrated like memstore's results


FTS_SQL = (
    "SELECT c.chunk_id, c.path, c.start_line, c.end_line, -f.score, c.source, c.created_at, c.session_id,"
    " c.turn, c.seq, c.kind, c.text"
    " FROM (SELECT rowid, bm25(chunks_fts) AS score FROM chunks_fts WHERE chunks_fts MATCH ?"
    "       ORDER BY bm25(chunks_fts) LIMIT ?) AS f"
    " JOIN chunks AS c ON c.id = f.rowid ORDER BY f.score"
)


def fts_search(conn: sqlite3.Connection, query: str, limit: int = LIMIT) -> list[tuple]:
    match = fts_match(query)
    if match is None:
        return []
    words = set(tokenize(query))
    return [(*row[:11], snippet(row[11], words)) for row in conn.execute(FTS_SQL, (match, limit))]


def fts_search_memory(root: Path, query: str) -> list[tuple]:
    """What ``search_memory`` does, with FTS5 ranking: refresh, connect, search."""
    refresh_catalog(root)
    conn = sqlite3.connect(f"{catalog_path(root).absolute().as_uri()}?mode=ro", uri=True)
    try:
        return fts_search(conn, query)
    finally:
        conn.close()


# ----------------------------------------------------------------------------------------------
# Timing


def p95(xs: list[float]) -> float:
    return float(np.percentile(xs, 95))


def fmt_ms(seconds: float) -> str:
    return f"{seconds * 1000:9.2f} ms"


def compare(
    label: str,
    queries: list[str],
    ours: Callable[[str], object],
    theirs: Callable[[str], object],
    reps: int,
    names: tuple[str, str] = ("memstore", "FTS5"),
) -> dict:
    """Time both sides on every query ``reps`` times, alternating which goes first; print and
    return p50/p95 of the per-query medians and their ratios (theirs / ours)."""
    for q in queries[:3]:  # warm both sides alike
        ours(q)
        theirs(q)
    times: dict[int, list[list[float]]] = {0: [[] for _ in queries], 1: [[] for _ in queries]}
    for rep in range(reps):
        for qi, q in enumerate(queries):
            for side in (0, 1) if (rep + qi) % 2 == 0 else (1, 0):
                fn = ours if side == 0 else theirs
                started = time.perf_counter()
                fn(q)
                times[side][qi].append(time.perf_counter() - started)
    per_query = {side: [statistics.median(ts) for ts in times[side]] for side in (0, 1)}
    o50, t50 = statistics.median(per_query[0]), statistics.median(per_query[1])
    o95, t95 = p95(per_query[0]), p95(per_query[1])
    print(f"  {label:38s} p50 {names[0]} {fmt_ms(o50)}  {names[1]} {fmt_ms(t50)}  ratio {t50 / o50:7.2f}", flush=True)
    print(f"  {'':38s} p95 {names[0]} {fmt_ms(o95)}  {names[1]} {fmt_ms(t95)}  ratio {t95 / o95:7.2f}", flush=True)
    return {
        "ours_p50": o50,
        "ours_p95": o95,
        "theirs_p50": t50,
        "theirs_p95": t95,
        "p50_ratio": t50 / o50,
        "p95_ratio": t95 / o95,
    }


# ----------------------------------------------------------------------------------------------
# Runs


def check_same_hits(conn: sqlite3.Connection, queries: list[str]) -> float:
    """The share of memstore's top results that FTS5 ranks in its top results too (both BM25 over
    the same texts; FTS5's tokenizer and recency differ, so not all)."""
    shared = total = 0
    for q in queries:
        ours = {r.chunk_id for r in search_catalog(conn, q, limit=LIMIT, recency=False).results}
        theirs = {row[0] for row in fts_search(conn, q)}
        shared += len(ours & theirs)
        total += len(ours)
    return shared / total if total else 1.0


def run_size(n: int, workdir: Path, reps: int, n_queries: int, jobs: int, engine: bool) -> dict:
    print(f"\n== about {n:,} chunks", flush=True)
    root = store_for(workdir, n, jobs)
    vocab = Vocabulary(extract_vocabulary(workdir))
    path = catalog_path(root)
    conn = sqlite3.connect(f"{path.absolute().as_uri()}?mode=ro", uri=True)
    chunks, sessions, mb = conn.execute(
        "SELECT count(*), count(DISTINCT session_id), total(length(CAST(text AS BLOB))) / 1e6 FROM chunks"
    ).fetchone()
    lengths = [r[0] for r in conn.execute("SELECT length(text) FROM chunks")]
    print(
        f"  {chunks:,} chunks in {sessions:,} sessions, {mb:,.0f} MB of text; chunk length p50"
        f" {statistics.median(lengths):.0f}, p95 {p95(lengths):.0f} characters",
        flush=True,
    )
    queries = make_queries(vocab, n_queries)
    print(f"  queries like: {' | '.join(queries[:4])}", flush=True)
    figures: dict = {"n": chunks, "sessions": sessions}
    # This machine's disk reads about 40 MB/s: read the catalog once, so that both sides find its
    # pages in the OS cache and the figures measure search, not which side touched a page first.
    started = time.perf_counter()
    for name in (path, Path(f"{path}-wal")):
        if name.exists():
            with open(name, "rb") as f:
                while f.read(1 << 24):
                    pass
    print(f"  (catalog file read into the OS cache in {time.perf_counter() - started:.1f}s)", flush=True)
    print(
        f"  memstore's top {LIMIT} also in FTS5's top {LIMIT} (recency off): {check_same_hits(conn, queries):.0%}",
        flush=True,
    )

    figures["kept"] = compare(
        "1. search_catalog vs FTS5",
        queries,
        lambda q: search_catalog(conn, q, limit=LIMIT),
        lambda q: fts_search(conn, q),
        reps,
    )
    figures["memory"] = compare(
        "2. search_memory vs refresh+FTS5",
        queries,
        lambda q: search_memory(root, q),
        lambda q: fts_search_memory(root, q),
        reps,
    )
    refresh = []
    for _ in range(max(5, reps)):
        started = time.perf_counter()
        refresh_catalog(root)
        refresh.append(time.perf_counter() - started)
    figures["refresh_s"] = statistics.median(refresh)
    print(f"  {'':38s} (of which refresh_catalog alone: median {fmt_ms(figures['refresh_s'])})", flush=True)
    cold_queries = queries[: max(10, n_queries // 5)]
    figures["cold"] = compare(
        "3. kept index vs a new one per query",
        cold_queries,
        lambda q: search_catalog(conn, q, limit=LIMIT),
        lambda q: SearchIndex(conn).search(q, LIMIT),
        max(2, reps // 2),
        ("kept", "new"),
    )
    conn.close()
    if engine:
        figures["engine"] = run_engine(root, workdir, n, reps, queries)
    return figures


# ----------------------------------------------------------------------------------------------
# Engine figures (--engine): the same chunk texts outside the store


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
_ROW_COLUMNS = (
    "id",
    "chunk_id",
    "session_id",
    "seq",
    "turn",
    "part",
    "source",
    "kind",
    "path",
    "start_line",
    "end_line",
    "created_at",
    "text",
)


def load_rows(root: Path) -> list[dict]:
    conn = sqlite3.connect(f"{catalog_path(root).absolute().as_uri()}?mode=ro", uri=True)
    conn.row_factory = sqlite3.Row
    rows = [dict(r) for r in conn.execute(f"SELECT {', '.join(_ROW_COLUMNS)} FROM chunks ORDER BY id")]
    conn.close()
    return rows


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


def bm25s_query(retriever, query: str, k: int = LIMIT):
    tokens = [t for t in tokenize(query) if t in retriever.vocab_dict]
    if not tokens:
        return []
    docs, _scores = retriever.retrieve([tokens], k=k, show_progress=False, n_threads=0)
    return docs


FIRST_SEARCH_CHILD = r"""
import sys, time, json, sqlite3
sys.path.insert(0, sys.argv[1])
from memstore.bm25 import SearchIndex
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
    out = subprocess.run(
        [sys.executable, "-c", FIRST_SEARCH_CHILD, str(ROOT), str(path), query],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return json.loads(out)


def retokenize(path: Path) -> float:
    started = time.perf_counter()
    conn = sqlite3.connect(path)
    for (text,) in conn.execute("SELECT text FROM chunks"):
        tokenize(text)
    conn.close()
    return time.perf_counter() - started


def run_engine(root: Path, workdir: Path, n: int, reps: int, queries: list[str]) -> dict:
    print("  -- engine, on the same chunk texts", flush=True)
    rows = load_rows(root)
    mb = sum(len(r["text"].encode()) for r in rows) / 1e6
    ours_path, fts_path = workdir / f"engine-memstore-{n}.db", workdir / f"engine-fts5-{n}.db"
    figures: dict = {}
    gc.collect()
    ins, idx = build_memstore(ours_path, rows)
    gc.collect()
    fts_t = build_fts(fts_path, rows)
    print(
        f"  indexing: SearchIndex.add {idx:.1f}s ({mb / idx:.1f} MB/s), with the row inserts {ins + idx:.1f}s;"
        f" insert_all+enable_fts {fts_t:.1f}s; ratio {fts_t / idx:.2f} ({fts_t / (ins + idx):.2f} with inserts)",
        flush=True,
    )
    figures.update(index_s=idx, insert_s=ins, fts_index_s=fts_t)
    retriever = build_bm25s(rows)
    session_rows = rows[:500]
    del rows
    gc.collect()
    conn = sqlite3.connect(ours_path)
    index = SearchIndex(conn)
    figures["bm25s"] = compare(
        "search vs bm25s (numpy)",
        queries,
        lambda q: index.search(q, LIMIT),
        lambda q, retriever=retriever: bm25s_query(retriever, q),
        reps,
        ("memstore", "bm25s"),
    )
    del retriever
    conn.close()
    firsts = [first_search(ours_path, q)["first"] for q in queries[:5]]
    retok = min(retokenize(ours_path) for _ in range(2))
    first = statistics.median(firsts)
    print(
        f"  first search in a fresh process {fmt_ms(first)} vs re-tokenizing {fmt_ms(retok)}: {first / retok:.4f}x",
        flush=True,
    )
    figures.update(first_s=first, retokenize_s=retok)
    conn = sqlite3.connect(ours_path)
    index = SearchIndex(conn)
    next_id = conn.execute("SELECT max(id) FROM chunks").fetchone()[0] + 1
    add_times, remove_times = [], []
    for _ in range(7):
        docs = [(next_id + i, r["text"], r["created_at"]) for i, r in enumerate(session_rows)]
        next_id += len(docs)
        started = time.perf_counter()
        index.add(docs)
        conn.commit()
        added = time.perf_counter()
        index.remove([d[0] for d in docs])
        conn.commit()
        remove_times.append(time.perf_counter() - added)
        add_times.append(added - started)
    conn.close()
    figures.update(add_session_s=statistics.median(add_times), remove_session_s=statistics.median(remove_times))
    print(
        f"  add a session of 500 chunks {fmt_ms(figures['add_session_s'])}, remove it"
        f" {fmt_ms(figures['remove_session_s'])} (medians of 7)",
        flush=True,
    )
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="20,000 chunks, few repetitions")
    parser.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")], default=None)
    parser.add_argument(
        "--workdir", type=Path, default=Path(os.environ.get("TMPDIR", "/tmp")) / "memstore-bench-search"
    )
    parser.add_argument("--reps", type=int, default=None)
    parser.add_argument("--queries", type=int, default=None)
    parser.add_argument("--jobs", type=int, default=2, help="processes writing the store (built once)")
    parser.add_argument("--build-only", action="store_true", help="build the stores and stop")
    parser.add_argument("--engine", action="store_true", help="also the engine's figures")
    args = parser.parse_args()
    sizes = args.sizes or ([20_000] if args.quick else [100_000, 1_000_000])
    reps = args.reps or (3 if args.quick else 5)
    n_queries = args.queries or (30 if args.quick else 100)
    args.workdir.mkdir(parents=True, exist_ok=True)
    if args.build_only:
        for n in sizes:
            store_for(args.workdir, n, args.jobs)
        return
    print(
        f"memstore search benchmark: sizes {sizes}, {n_queries} queries x {reps} repetitions, workdir {args.workdir}",
        flush=True,
    )
    results = [run_size(n, args.workdir, reps, n_queries, args.jobs, args.engine) for n in sizes]
    print("\n== summary (ratios: FTS5 time / memstore time; above 1, memstore is faster)")
    for r in results:
        k, m, c = r["kept"], r["memory"], r["cold"]
        print(
            f"  {r['n']:>9,} chunks, {r['sessions']:,} sessions:"
            f" search_catalog p50 {k['p50_ratio']:.1f}x ({k['ours_p50'] * 1000:.2f} vs {k['theirs_p50'] * 1000:.2f} ms),"
            f" p95 {k['p95_ratio']:.1f}x;"
            f" search_memory p50 {m['p50_ratio']:.2f}x ({m['ours_p50'] * 1000:.1f} vs {m['theirs_p50'] * 1000:.1f} ms),"
            f" p95 {m['p95_ratio']:.2f}x, refresh alone {r['refresh_s'] * 1000:.1f} ms;"
            f" a new index per query is {c['p50_ratio']:.1f}x slower at p50"
        )


if __name__ == "__main__":
    main()
