"""The catalog at many sessions (issue 16): what a refresh and a search cost when the store has
1,000 or 10,000 sessions, each figure beside its floor in the same run.

    python bench/bench_catalog.py                       # 1,000 and 10,000 sessions
    python bench/bench_catalog.py --sizes 2000 --quick  # a smoke run
    python bench/bench_catalog.py --workdir DIR --json out.json

**The store.** Sessions written the way an agent writes them (``open_session`` + ``append``,
durability ``"none"`` as an import does), in worker processes, one per core: 2-5 turns about a
code base, each a prompt, reasoning, a test run or a log with its output, and an answer, with
token usage and a model. The text comes from ``bench/archive_text.py`` (a realistic vocabulary
drawn with Zipf frequencies, code of the project's language, real-looking test and log output;
never a repeated token). Stores are built once per size and kept in ``--workdir``.

**Measured**, for each size (medians; the sides alternate where a repetition is cheap):

- *catalog from scratch*: ``refresh_catalog`` of the store with no ``catalog.db``, in a child
  process (its peak RSS from ``wait4``), against floor B: sqlite-utils ``insert_all`` of the
  same chunk rows into an empty database plus ``enable_fts`` (FTS5). Ratio floor / memstore,
  and the cost per session;
- *a refresh that finds nothing changed*: the full check (``refresh_catalog``: every file
  stamp of every session), the change feed with a sweep (``Store.refresh(full=False)``), the
  feed alone, and what a search pays before it ranks (``LiveCatalog.ensure_current``), against
  a floor that lists ``sessions/`` and ``stat``s the files a full check compares;
- *one session written by memstore*: a turn appended to one session, then what the next
  search pays to bring the catalog up to date (the feed names that session alone), against
  the full check that finds it;
- *search*: 2-3 term queries through ``Store.search`` (warm: the process's catalog connection
  and kept index), against FTS5 ``ORDER BY bm25()`` over floor B's table (top 6, rows read).
  Ratio FTS5 / memstore.

The growth from the smallest to the largest size closes the report: a refresh that found
nothing should not grow with the number of sessions, and a search should grow no more than
FTS5's over the same texts.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sqlite3
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(ROOT))

import archive_text as T  # noqa: E402
import archive_vocab as V  # noqa: E402
from bench_archive import CHILD_CATALOG  # noqa: E402

import memstore  # noqa: E402

STORE_VERSION = 2  # bump when the sessions written (or their index layout) change
MODELS = ("gpt-5", "gpt-5-codex", "claude-sonnet-4-5", "claude-opus-4-1", "o4-mini")
CHUNK_COLUMNS = (
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


# ----------------------------------------------------------------------------------------------
# The store


def session_events(number: int, seed: int) -> list[tuple[dict, str]]:
    """One session's events with their times (a few turns of realistic work on one project)."""
    r = random.Random(T.hash_seed(seed, "session", number))
    project = T.make_project(seed, number % 97)
    text = T.Texts(project, T.hash_seed(seed, "text", number))
    moment = 1_760_000_000.0 + number * 3_600.0
    model = r.choice(MODELS)
    out: list[tuple[dict, str]] = []

    def add(event: dict) -> None:
        nonlocal moment
        moment += r.uniform(2, 40)
        out.append((event, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(moment)) + f".{r.randrange(1000):03d}Z"))

    add({"type": "thread.started", "thread_id": f"bench-{number:06d}"})
    for turn in range(r.randint(2, 5)):
        add({"type": "turn.started", "model": model})
        add({"type": "item.completed", "item": {"id": f"u{turn}", "type": "user_message", "text": text.prompt()}})
        add({"type": "item.completed", "item": {"id": f"r{turn}", "type": "reasoning", "text": text.reasoning()}})
        if r.random() < 0.6:
            command, output, code = text.test_run(fail=r.random() < 0.3)
        else:
            command, output, code = f"tail -n 80 logs/{project.package}.log", text.log_lines(r.randint(5, 60)), 0
        add(
            {
                "type": "item.completed",
                "item": {
                    "id": f"c{turn}",
                    "type": "command_execution",
                    "command": command,
                    "aggregated_output": output,
                    "exit_code": code,
                    "status": "completed" if code == 0 else "failed",
                },
            }
        )
        add({"type": "item.completed", "item": {"id": f"m{turn}", "type": "agent_message", "text": text.answer()}})
        add(
            {
                "type": "turn.completed",
                "usage": {
                    "input_tokens": r.randint(2_000, 90_000),
                    "cached_input_tokens": r.randint(0, 1_500),
                    "output_tokens": r.randint(100, 2_000),
                },
            }
        )
    return out


def write_range(args: tuple[str, int, int, int]) -> int:
    """Write sessions ``start`` to ``stop`` into the store; return the events written."""
    store, start, stop, seed = args
    written = 0
    for number in range(start, stop):
        with memstore.open_session(store, f"bench-{number:06d}", durability="none") as log:
            for event, ts in session_events(number, seed):
                log.append(event, ts=ts)
                written += 1
    return written


def store_for(workdir: Path, sessions: int, seed: int, jobs: int) -> Path:
    """The store of ``sessions`` sessions, written once and kept."""
    store = workdir / f"store-{sessions}-s{seed}-v{STORE_VERSION}"
    marker = store / "bench-complete.json"
    if marker.exists():
        return store
    shutil.rmtree(store, ignore_errors=True)
    store.mkdir(parents=True)
    print(f"  writing {sessions:,} sessions into {store} ({jobs} processes) ...", flush=True)
    started = time.perf_counter()
    step = max(1, sessions // (jobs * 8))
    ranges = [(str(store), a, min(a + step, sessions), seed) for a in range(0, sessions, step)]
    with ProcessPoolExecutor(jobs) as pool:
        events = sum(pool.map(write_range, ranges))
    seconds = time.perf_counter() - started
    marker.write_text(json.dumps({"sessions": sessions, "events": events, "seconds": seconds}))
    print(f"  {events:,} events written in {seconds:.0f} s", flush=True)
    return store


# ----------------------------------------------------------------------------------------------
# Children (their peak RSS from wait4)

# The catalog built from scratch in a child process: bench_archive's child, the same script.
CHILD_BUILD = CHILD_CATALOG

CHILD_FLOOR_B = r"""
import json, os, sqlite3, sys, time
sys.path.insert(0, sys.argv[1])
import sqlite_utils
catalog, target, columns, result_path = sys.argv[2], sys.argv[3], json.loads(sys.argv[4]), sys.argv[5]
conn = sqlite3.connect(f"file:{catalog}?mode=ro", uri=True)
rows = conn.execute(f"SELECT {', '.join(columns)} FROM chunks ORDER BY id").fetchall()
conn.close()
for suffix in ("", "-wal", "-shm"):
    try:
        os.unlink(target + suffix)
    except FileNotFoundError:
        pass
t0 = time.perf_counter()
db = sqlite_utils.Database(target)
db.execute("PRAGMA journal_mode=WAL")
db["chunks"].insert_all((dict(zip(columns, row)) for row in rows), pk="id", batch_size=1000)
db["chunks"].enable_fts(["text"], fts_version="FTS5")
db.conn.commit()
t1 = time.perf_counter()
db.conn.close()
with open(result_path, "w") as fh:
    json.dump({"seconds": t1 - t0, "rows": len(rows), "text_bytes": sum(len(r[-1].encode()) for r in rows)}, fh)
"""


def run_child(code: str, args: list[str], result: Path) -> tuple[dict, float]:
    """Run a child to its end; its result JSON and its peak RSS in MB."""
    result.unlink(missing_ok=True)
    log_path = result.with_suffix(".log")
    with open(log_path, "wb") as log:
        child = subprocess.Popen(
            [sys.executable, "-c", code, str(ROOT), *args, str(result)], stdout=log, stderr=subprocess.STDOUT
        )
        _pid, status, usage = os.wait4(child.pid, 0)
    child.returncode = os.waitstatus_to_exitcode(status)  # reaped by wait4: tell Popen
    if child.returncode != 0:
        output = log_path.read_text(errors="replace")
        raise RuntimeError(f"child failed (exit {child.returncode}):\n{output[-3000:]}")
    return json.loads(result.read_text()), usage.ru_maxrss / 1024


# ----------------------------------------------------------------------------------------------
# Floors


def stat_floor(store: Path) -> float:
    """List the sessions and stat the files a full check compares (log, manifest, index, index
    WAL, memory view) in each."""
    started = time.perf_counter()
    names = ("events.jsonl", "manifest.json", "index/session.db", "index/session.db-wal", "derived/memory.json")
    with os.scandir(store / "sessions") as it:
        for entry in it:
            if entry.is_dir(follow_symlinks=False):
                for name in names:
                    try:
                        os.stat(os.path.join(entry.path, name), follow_symlinks=False)
                    except FileNotFoundError:
                        pass
    return time.perf_counter() - started


def make_queries(n: int, seed: int) -> list[str]:
    """2-3 term queries as people type them: a common technical word with rarer ones."""
    r = random.Random(seed)
    common = T.TECHNICAL[:120]
    rare = list(
        dict.fromkeys(
            list(V.ID_NOUNS)
            + list(V.ID_VERBS)
            + T.TECHNICAL[120:]
            + ["KeyError", "TypeError", "panicked", "unwrap", "deadline", "flaky", "assert"]
        )
    )
    queries = []
    for _ in range(n):
        terms = [r.choice(common)] + r.sample(rare, r.randint(1, 2))
        r.shuffle(terms)
        queries.append(" ".join(terms))
    return queries


def fts_search(conn: sqlite3.Connection, query: str, k: int = 6) -> list[tuple]:
    tokens = list(dict.fromkeys("".join(ch.lower() if ch.isalnum() else " " for ch in query).split()))
    if not tokens:
        return []
    match = " OR ".join(f'"{t}"' for t in tokens)
    return conn.execute(
        "SELECT id, chunk_id, session_id, text FROM chunks WHERE rowid IN "
        "(SELECT rowid FROM chunks_fts WHERE chunks_fts MATCH ? ORDER BY bm25(chunks_fts) LIMIT ?)",
        (match, k),
    ).fetchall()


def p95(xs: list[float]) -> float:
    ordered = sorted(xs)
    return ordered[min(len(ordered) - 1, int(round(0.95 * (len(ordered) - 1))))]


# ----------------------------------------------------------------------------------------------
# One size


def measure(sessions: int, args: argparse.Namespace) -> dict[str, Any]:
    from memstore.catalog import LiveCatalog, RefreshMode

    print(f"\n== {sessions:,} sessions (load average {', '.join(f'{x:.1f}' for x in os.getloadavg())})", flush=True)
    workdir: Path = args.workdir
    store = store_for(workdir, sessions, args.seed, args.jobs)
    fig: dict[str, Any] = {"sessions": sessions}
    fts_db = workdir / f"floor-b-{sessions}.db"

    print("  catalog from scratch vs floor B ...", flush=True)
    builds, floors = [], []
    for rep in range(args.reps):
        for side in ("memstore", "floor") if rep % 2 == 0 else ("floor", "memstore"):
            if side == "memstore":
                builds.append(run_child(CHILD_BUILD, [str(store)], workdir / "build.result.json"))
                if builds[-1][0]["errors"]:
                    raise RuntimeError(f"the build left sessions out: {builds[-1][0]['errors']}")
            elif (store / "catalog.db").exists():
                floors.append(
                    run_child(
                        CHILD_FLOOR_B,
                        [str(store / "catalog.db"), str(fts_db), json.dumps(CHUNK_COLUMNS)],
                        workdir / "floor.result.json",
                    )
                )
    if len(floors) < len(builds):  # the first rep's floor ran before any catalog existed
        floors.append(
            run_child(
                CHILD_FLOOR_B,
                [str(store / "catalog.db"), str(fts_db), json.dumps(CHUNK_COLUMNS)],
                workdir / "floor.result.json",
            )
        )
    fig.update(
        build_s=statistics.median(b[0]["seconds"] for b in builds),
        build_rss_mb=max(b[1] for b in builds),
        floor_b_s=statistics.median(f[0]["seconds"] for f in floors),
        floor_b_rss_mb=max(f[1] for f in floors),
        chunks=floors[-1][0]["rows"],
        text_mb=floors[-1][0]["text_bytes"] / 1e6,
    )

    print("  refresh with nothing changed ...", flush=True)
    times: dict[str, list[float]] = {k: [] for k in ("full", "sweep", "feed", "search", "floor")}
    live = LiveCatalog(store, sweep_interval=3600.0)  # no sweep falls due in the feed and search rows
    try:
        live.refresh(RefreshMode.SWEEP)
        live.connection()
        for _ in range(args.noop_reps):
            for key, mode in (("full", RefreshMode.FULL), ("sweep", RefreshMode.SWEEP), ("feed", RefreshMode.FEED)):
                started = time.perf_counter()
                report = memstore.refresh_catalog(store) if mode is RefreshMode.FULL else live.refresh(mode)
                times[key].append(time.perf_counter() - started)
                if report.changed:
                    raise RuntimeError(f"an unchanged store's {key} refresh changed something: {report}")
            started = time.perf_counter()
            missing = live.ensure_current()
            times["search"].append(time.perf_counter() - started)
            if missing:
                raise RuntimeError(f"an unchanged store misses sessions: {missing[:3]}")
            times["floor"].append(stat_floor(store))

        print("  one session written by memstore ...", flush=True)
        one, full_one, recopied = [], [], 0
        r = random.Random(args.seed)
        for rep in range(args.noop_reps):
            for side in ("feed", "full") if rep % 2 == 0 else ("full", "feed"):
                number = r.randrange(sessions)
                with memstore.open_session(store, f"bench-{number:06d}", durability="none") as log:
                    log.append({"type": "turn.started"})
                    log.append(
                        {
                            "type": "item.completed",
                            "item": {
                                "id": f"x{rep}",
                                "type": "agent_message",
                                "text": f"follow-up {rep}: the deadline holds",
                            },
                        }
                    )
                    log.append({"type": "turn.completed", "usage": {"input_tokens": 10, "output_tokens": 5}})
                started = time.perf_counter()
                if side == "feed":
                    live.ensure_current()
                    one.append(time.perf_counter() - started)
                else:
                    report = memstore.refresh_catalog(store)
                    full_one.append(time.perf_counter() - started)
                    if len(report.updated) + len(report.recopied) != 1:
                        raise RuntimeError(f"the full check did not find the one session written: {report}")
                    recopied += len(report.recopied)  # copied whole, not grown: said in the report
    finally:
        live.close()
    fig.update({f"noop_{k}_s": statistics.median(v) for k, v in times.items()})
    fig.update(one_feed_s=statistics.median(one), one_full_s=statistics.median(full_one), one_full_recopied=recopied)

    print("  search ...", flush=True)
    fig.update(search_figures(store, fts_db, make_queries(args.queries, args.seed), args.search_reps))
    fts_db.unlink(missing_ok=True)
    for suffix in ("-wal", "-shm"):
        Path(f"{fts_db}{suffix}").unlink(missing_ok=True)
    print_size(fig)
    return fig


def search_figures(store: Path, fts_db: Path, queries: list[str], reps: int) -> dict[str, Any]:
    fts = sqlite3.connect(f"file:{fts_db}?mode=ro", uri=True)
    warm = memstore.Store(store)
    sides: dict[str, Callable[[str], Any]] = {
        "memstore": lambda q: warm.search(q),
        "fts5": lambda q: fts_search(fts, q),
    }
    try:
        for q in queries[:5]:  # every side's caches warmed alike
            for fn in sides.values():
                fn(q)
        times: dict[str, list[list[float]]] = {side: [[] for _ in queries] for side in sides}
        names = list(sides)
        for rep in range(reps):
            for qi, q in enumerate(queries):
                for side in names[rep % 2 :] + names[: rep % 2]:
                    started = time.perf_counter()
                    sides[side](q)
                    times[side][qi].append(time.perf_counter() - started)
    finally:
        warm.close()
        fts.close()
    out: dict[str, Any] = {"queries": len(queries)}
    for side in sides:
        per_query = [statistics.median(ts) for ts in times[side]]
        out[f"{side}_p50_s"] = statistics.median(per_query)
        out[f"{side}_p95_s"] = p95(per_query)
    return out


# ----------------------------------------------------------------------------------------------
# Report


def fmt(seconds: float) -> str:
    if seconds < 0.01:
        return f"{seconds * 1000:9.3f} ms"
    return f"{seconds * 1000:9.1f} ms" if seconds < 1 else f"{seconds:9.2f} s "


def row(label: str, ours: str, floor: str, ratio: str) -> None:
    print(f"  {label:50s} {ours:>14s} {floor:>16s}   {ratio}", flush=True)


def print_size(f: dict[str, Any]) -> None:
    n = f["sessions"]
    print(f"\n  -- {n:,} sessions, {f['chunks']:,} chunks ({f['text_mb']:,.0f} MB of text)")
    print(f"  {'':50s} {'memstore':>14s} {'floor':>16s}   ratio (floor / memstore)")
    row(
        "catalog from scratch vs insert_all+FTS5 (B)",
        fmt(f["build_s"]),
        fmt(f["floor_b_s"]) + " B",
        f"{f['floor_b_s'] / f['build_s']:.3f}x",
    )
    row("  per session", fmt(f["build_s"] / n), fmt(f["floor_b_s"] / n), "")
    row("  peak RSS", f"{f['build_rss_mb']:8,.0f} MB", f"{f['floor_b_rss_mb']:8,.0f} MB", "")
    for key, label in (
        ("full", "refresh, nothing changed: full check"),
        ("sweep", "  feed + sweep now"),
        ("feed", "  feed alone"),
        ("search", "  before a search (ensure_current)"),
    ):
        row(
            label + " vs list+stat",
            fmt(f[f"noop_{key}_s"]),
            fmt(f["noop_floor_s"]),
            f"{f['noop_floor_s'] / f[f'noop_{key}_s']:.3f}x",
        )
    row(
        "one session written: search's refresh vs full check",
        fmt(f["one_feed_s"]),
        fmt(f["one_full_s"]),
        f"{f['one_full_s'] / f['one_feed_s']:.1f}x",
    )
    if f.get("one_full_recopied"):
        print(f"  {'':4s}(the full check copied {f['one_full_recopied']} of those sessions whole, not grown)")
    for p in ("p50", "p95"):
        row(
            f"Store.search {p} vs FTS5 bm25() (ratio FTS5/ours)",
            fmt(f[f"memstore_{p}_s"]),
            fmt(f[f"fts5_{p}_s"]) + " F",
            f"{f[f'fts5_{p}_s'] / f[f'memstore_{p}_s']:.2f}x",
        )


def print_growth(results: list[dict[str, Any]]) -> None:
    if len(results) < 2:
        return
    a, b = results[0], results[-1]
    print(
        f"\n== growth from {a['sessions']:,} to {b['sessions']:,} sessions (larger / smaller; "
        f"{b['chunks'] / a['chunks']:.1f}x the chunks)"
    )
    for label, key, per in (
        ("catalog from scratch per session", "build_s", "sessions"),
        ("refresh, nothing changed: full check", "noop_full_s", None),
        ("refresh, nothing changed: feed alone", "noop_feed_s", None),
        ("before a search, nothing changed", "noop_search_s", None),
        ("one session written: search's refresh", "one_feed_s", None),
        ("Store.search p50", "memstore_p50_s", None),
        ("FTS5 bm25() p50", "fts5_p50_s", None),
    ):
        x = a[key] / (a[per] if per else 1)
        y = b[key] / (b[per] if per else 1)
        print(f"  {label:44s} {y / x:8.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default=None, help="comma-separated store sizes (default 1000,10000)")
    parser.add_argument("--quick", action="store_true", help="200 sessions, few repetitions")
    parser.add_argument(
        "--workdir", type=Path, default=Path(os.environ.get("TMPDIR", "/tmp")) / "memstore-bench-catalog"
    )
    parser.add_argument("--json", type=Path, default=None, help="write every figure to this file")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="processes writing the stores")
    parser.add_argument("--reps", type=int, default=2, help="catalog builds (and floor B runs)")
    parser.add_argument("--noop-reps", type=int, default=7)
    parser.add_argument("--queries", type=int, default=40)
    parser.add_argument("--search-reps", type=int, default=3)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")] if args.sizes else ([200] if args.quick else [1000, 10000])
    if args.quick:
        args.reps, args.noop_reps, args.queries, args.search_reps = 1, 3, 10, 2
    args.workdir.mkdir(parents=True, exist_ok=True)
    print(f"memstore catalog benchmark: sizes {sizes}, seed {args.seed}, workdir {args.workdir}")
    print(f"  machine: {os.cpu_count()} cores; python {sys.version.split()[0]}; sqlite {sqlite3.sqlite_version}")
    results: list[dict[str, Any]] = []
    for n in sizes:
        results.append(measure(n, args))
        if args.json:
            args.json.write_text(json.dumps(results, indent=1))
    print_growth(results)
    print(f"\n(load average at the end: {', '.join(f'{x:.1f}' for x in os.getloadavg())}; shared machine)")


if __name__ == "__main__":
    main()
