"""The archive benchmark (issue 16, Scale): memstore on a realistic agent-history archive, each
figure side by side with its floor in the same run.

    python bench/bench_archive.py                          # 1,000 sessions
    python bench/bench_archive.py --sessions 1000,10000    # two store sizes, to compare growth
    python bench/bench_archive.py --quick                  # a smoke run of a minute or two
    python bench/bench_archive.py --json out.json --workdir /var/tmp/bench-archive

The archive comes from ``bench/archive.py`` (Claude Code and Codex logs in their real layouts,
seeded); archives are kept in ``--workdir`` and reused. For each size:

- import until searchable: ``import_logs`` of the archive, ``refresh_catalog`` and one
  ``search_memory``, in a subprocess (its peak RSS from ``wait4``), against floor A, a bare
  loop that reads every line of the same files and ``orjson.loads`` it. Ratio = floor / memstore.
  The same on an archive of many tiny sessions gives the per-session cost; the two archives
  together give a fixed cost per session and a cost per MB (two equations, two unknowns);
- catalog from scratch: ``catalog.db`` deleted, ``refresh_catalog`` timed, against floor B:
  sqlite-utils ``insert_all`` of the catalog's chunk rows into an empty database plus
  ``enable_fts`` (FTS5). Ratio = floor / memstore;
- search: about 50 realistic 2-3 term queries; p50 and p95 (of each query's median) of
  ``search_memory`` against FTS5 ``ORDER BY bm25()`` (top 6, rows fetched) over floor B's table.
  Ratio = FTS5 / memstore. ``search_memory`` refreshes the catalog first, so the engine alone
  (``SearchIndex.search`` on the catalog) is shown too;
- a refresh that finds nothing changed, against a floor that only lists the sessions and
  ``stat``s the five files per session a refresh looks at: the full check
  (``refresh_catalog``), the change feed with a sweep, the feed alone, and what a search pays
  before it searches (``LiveCatalog.ensure_current``).

Sides alternate where a repetition is cheap, and medians are reported. An import that runs
past ``--import-timeout`` is stopped: the report then says how far it got and extrapolates the
total, labelled as such, and the stages that need the finished store are not run.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import orjson

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(ROOT))

import archive  # noqa: E402
import archive_vocab as V  # noqa: E402
from archive_text import TECHNICAL  # noqa: E402

import memstore  # noqa: E402

TINY_SCALE = 0.02
COLUMNS = (
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
# Subprocesses: each side whose memory matters runs alone in a child; wait4 gives its rusage.

CHILD_IMPORT = r"""
import json, os, sys, time
sys.path.insert(0, sys.argv[1])
import memstore
store, roots, query, progress_path, result_path = sys.argv[2], json.loads(sys.argv[3]), sys.argv[4], sys.argv[5], sys.argv[6]
import_only = len(sys.argv) > 7 and sys.argv[7] == "import-only"
t0 = time.perf_counter()
last = [0.0]
phase = {"phase": "import", "import_s": None}
def progress(done, total):
    now = time.perf_counter()
    if now - last[0] >= 5:
        last[0] = now
        with open(progress_path + ".tmp", "w") as fh:
            json.dump({**phase, "done": done, "total": total, "elapsed": now - t0}, fh)
        os.replace(progress_path + ".tmp", progress_path)
report = memstore.import_logs(store, roots, progress=progress)
t1 = time.perf_counter()
phase.update(phase="refresh", import_s=t1 - t0)
last[0] = 0.0
if import_only:
    t2 = t3 = t1
    hits, refreshed = [], None
else:
    refreshed = memstore.refresh_catalog(store, progress=progress)
    t2 = time.perf_counter()
    hits = memstore.search_memory(store, query)
    t3 = time.perf_counter()
with open(result_path, "w") as fh:
    json.dump({"import_s": t1 - t0, "refresh_s": t2 - t1, "search_s": t3 - t2, "hits": len(hits),
               "sources": report.sources, "sessions_created": report.sessions_created,
               "events": report.events_appended, "lines_skipped": report.lines_skipped,
               "problems": len(report.problems), "first_problems": [list(p) for p in report.problems[:10]],
               "catalog_added": len(refreshed.added) if refreshed else 0,
               "catalog_errors": refreshed.errors[:10] if refreshed else []}, fh)
"""

CHILD_CATALOG = r"""
import json, os, sys, time
sys.path.insert(0, sys.argv[1])
import memstore
store, result_path = sys.argv[2], sys.argv[3]
for suffix in ("", "-wal", "-shm"):
    try:
        os.unlink(os.path.join(store, "catalog.db" + suffix))
    except FileNotFoundError:
        pass
t0 = time.perf_counter()
report = memstore.refresh_catalog(store)
t1 = time.perf_counter()
with open(result_path, "w") as fh:
    json.dump({"seconds": t1 - t0, "added": len(report.added), "errors": report.errors[:10]}, fh)
"""

CHILD_FLOOR_B = r"""
import json, os, sqlite3, sys, time
sys.path.insert(0, sys.argv[1])
import sqlite_utils
catalog, target, result_path, columns = sys.argv[2], sys.argv[3], sys.argv[4], json.loads(sys.argv[5])
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


@dataclass
class ChildRun:
    """A finished (or stopped) child: its result JSON, wall time and peak RSS."""

    result: Optional[dict]
    wall: float
    max_rss_mb: float
    cpu: float
    stopped: bool
    progress: Optional[dict]

    @property
    def figures(self) -> dict:
        """The child's result; a child that finished always wrote one."""
        if self.result is None:
            raise RuntimeError("the child wrote no result")
        return self.result


def run_child(
    code: str, args: list[str], workdir: Path, name: str, timeout: Optional[float] = None, tree: Path = ROOT
) -> ChildRun:
    result_path = workdir / f"{name}.result.json"
    progress_path = workdir / f"{name}.progress.json"
    for p in (result_path, progress_path):
        p.unlink(missing_ok=True)
    argv = [sys.executable, "-c", code, str(tree)] + [
        a.replace("{progress}", str(progress_path)).replace("{result}", str(result_path)) for a in args
    ]
    log = open(workdir / f"{name}.log", "wb")
    started = time.perf_counter()
    child = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    stopped = False
    while True:
        pid, status, usage = os.wait4(child.pid, os.WNOHANG)
        if pid:
            break
        if timeout is not None and time.perf_counter() - started > timeout:
            os.kill(child.pid, signal.SIGKILL)
            pid, status, usage = os.wait4(child.pid, 0)
            stopped = True
            break
        time.sleep(0.05)
    wall = time.perf_counter() - started
    child.returncode = os.waitstatus_to_exitcode(status)  # reaped by wait4: tell Popen
    log.close()
    progress = json.loads(progress_path.read_text()) if progress_path.exists() else None
    if not stopped and child.returncode != 0:
        tail = (workdir / f"{name}.log").read_text(errors="replace")[-3000:]
        raise RuntimeError(f"{name} failed (exit {child.returncode}):\n{tail}")
    result = json.loads(result_path.read_text()) if result_path.exists() else None
    return ChildRun(result, wall, usage.ru_maxrss / 1024, usage.ru_utime + usage.ru_stime, stopped, progress)


# ----------------------------------------------------------------------------------------------
# Floors and helpers


def archive_files(roots: list[Path]) -> list[Path]:
    files: list[Path] = []
    for root in roots:
        for folder, _dirs, names in os.walk(root):
            files.extend(Path(folder) / n for n in names if n.endswith(".jsonl"))
    files.sort()
    return files


def bare_parse(files: list[Path]) -> tuple[float, float, int, int]:
    """Floor A: read every line of every file and orjson.loads it; (wall s, CPU s, bytes, lines)."""
    started, cpu = time.perf_counter(), time.process_time()
    size = lines = 0
    loads = orjson.loads
    for path in files:
        with open(path, "rb") as fh:
            for line in fh:
                loads(line)
                lines += 1
                size += len(line)
    return time.perf_counter() - started, time.process_time() - cpu, size, lines


def stat_floor(store: Path) -> float:
    """Floor of a refresh that finds nothing: list the sessions and stat the files a refresh
    compares (log, manifest, index, index WAL, memory view) in each."""
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
    """2-3 term queries as people type them: a common technical word with rarer words from the
    archive's vocabulary (identifier parts, error names, other technical terms)."""
    r = random.Random(seed)
    common = TECHNICAL[:120]
    rare = list(
        dict.fromkeys(
            list(V.ID_NOUNS)
            + list(V.ID_VERBS)
            + TECHNICAL[120:]
            + [
                "KeyError",
                "TypeError",
                "panicked",
                "unwrap",
                "ECONNREFUSED",
                "deadline",
                "nil",
                "hydration",
                "E0308",
                "TS2322",
                "flaky",
                "segfault",
                "OperationalError",
                "IntegrityError",
                "borrow",
            ]
        )
    )
    queries = []
    for _ in range(n):
        terms = [r.choice(common)] + r.sample(rare, r.randint(1, 2))
        r.shuffle(terms)
        queries.append(" ".join(terms))
    return queries


def fts_match(query: str) -> Optional[str]:
    """An FTS5 MATCH of the query's alphanumeric tokens, quoted, OR-ed (as memstore tokenizes)."""
    tokens = list(dict.fromkeys("".join(ch.lower() if ch.isalnum() else " " for ch in query).split()))
    return " OR ".join(f'"{t}"' for t in tokens) or None


def fts_search(conn: sqlite3.Connection, query: str, k: int = 6) -> list[tuple]:
    match = fts_match(query)
    if match is None:
        return []
    return conn.execute(
        "SELECT id, chunk_id, session_id, text FROM chunks WHERE rowid IN "
        "(SELECT rowid FROM chunks_fts WHERE chunks_fts MATCH ? ORDER BY bm25(chunks_fts) LIMIT ?)",
        (match, k),
    ).fetchall()


def p95(xs: list[float]) -> float:
    ordered = sorted(xs)
    return ordered[min(len(ordered) - 1, int(round(0.95 * (len(ordered) - 1))))]


def ensure_archive(workdir: Path, sessions: int, seed: int, scale: float) -> archive.ArchiveSummary:
    """The archive for these parameters, generated once and kept in the workdir."""
    dest = workdir / f"archive-{sessions}-s{seed}-x{scale:g}-v{archive.GENERATOR_VERSION}"
    marker = dest / "summary.json"
    if marker.exists():
        data = json.loads(marker.read_text())
        data["dest"] = dest
        return archive.ArchiveSummary(**data)
    print(f"  generating {sessions:,} sessions (scale {scale:g}) into {dest} ...", flush=True)
    summary = archive.generate(dest, sessions, seed, scale, overwrite=True)
    data = {k: v for k, v in vars(summary).items() if k != "dest"}
    marker.write_text(json.dumps(data))
    return summary


def drop_store(store: Path) -> None:
    shutil.rmtree(store, ignore_errors=True)


def fmt_s(seconds: float) -> str:
    if seconds < 0.01:
        return f"{seconds * 1000:9.3f} ms"
    return f"{seconds * 1000:9.1f} ms" if seconds < 1 else f"{seconds:9.2f} s "


def row(label: str, ours: str, floor: str, ratio: str) -> None:
    print(f"  {label:46s} {ours:>22s} {floor:>24s}   {ratio}", flush=True)


# ----------------------------------------------------------------------------------------------
# One store size


def import_side(
    summary: archive.ArchiveSummary,
    store: Path,
    workdir: Path,
    name: str,
    query: str,
    timeout: Optional[float],
    tree: Path = ROOT,
    import_only: bool = False,
) -> ChildRun:
    drop_store(store)
    roots = json.dumps([str(r) for r in summary.roots])
    extra = ["import-only"] if import_only else []
    run = run_child(
        CHILD_IMPORT, [str(store), roots, query, "{progress}", "{result}"] + extra, workdir, name, timeout, tree
    )
    if run.result is not None and (run.result["problems"] or run.result["lines_skipped"]):
        # The figures still measure the import; the archive generator is what needs fixing.
        print(
            f"  WARNING: the import reported {run.result['problems']} problems and skipped "
            f"{run.result['lines_skipped']} lines; the first: {run.result['first_problems'][:3]}",
            flush=True,
        )
    return run


def measure_size(sessions: int, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    fig: dict[str, Any] = {"sessions": sessions, "load_at_start": os.getloadavg()}
    print(f"\n== {sessions:,} sessions (load average {', '.join(f'{x:.1f}' for x in os.getloadavg())})", flush=True)
    main = ensure_archive(workdir, sessions, args.seed, args.scale)
    tiny = ensure_archive(workdir, args.tiny, args.seed + 1, TINY_SCALE)
    print(f"  archive: {main.describe()}")
    print(f"  tiny archive: {tiny.describe()}", flush=True)
    fig["archive"] = {k: v for k, v in vars(main).items() if k != "dest"}
    fig["tiny_archive"] = {k: v for k, v in vars(tiny).items() if k != "dest"}
    files, tiny_files = archive_files(main.roots), archive_files(tiny.roots)
    store, tiny_store = workdir / f"store-{sessions}", workdir / f"store-tiny-{args.tiny}"
    queries = make_queries(args.queries, args.seed)
    reps = args.reps or (1 if main.bytes > 2e9 else 2)
    bare_parse(files)  # the first read warms the page cache, for both sides alike

    print("  importing (until searchable) ...", flush=True)
    floor_times, floor_cpus, runs = [], [], []
    for rep in range(reps):
        order = ("floor", "memstore") if rep % 2 == 0 else ("memstore", "floor")
        for side in order:
            gc.collect()
            if side == "floor":
                seconds, cpu, size, lines = bare_parse(files)
                floor_times.append(seconds)
                floor_cpus.append(cpu)
            else:
                run = import_side(main, store, workdir, f"import-{sessions}-{rep}", queries[0], args.import_timeout)
                runs.append(run)
                if run.stopped:
                    break
        if runs and runs[-1].stopped:
            break
    floor_a = statistics.median(floor_times)
    mb = size / 1e6
    fig.update(floor_a_s=floor_a, floor_a_cpu_s=statistics.median(floor_cpus), archive_mb=mb, archive_lines=lines)
    last = runs[-1]
    if last.stopped:
        report_stopped(last, args.import_timeout, mb, floor_a, fig, store)
        if fig.get("stopped_phase") != "refresh":
            return fig
        # Every session is imported: finish the catalog (untimed; a refresh goes on where the
        # stopped one left off) so that search and the no-op refresh can still be measured.
        print("  completing the catalog (untimed) for the search stages ...", flush=True)
        started = time.perf_counter()
        memstore.refresh_catalog(store)
        fig["catalog_completion_untimed_s"] = time.perf_counter() - started
        with sqlite3.connect(f"file:{store / 'catalog.db'}?mode=ro", uri=True) as conn:
            fig["memstore_sessions"] = conn.execute("SELECT count(*) FROM sessions").fetchone()[0]
            fig["events"] = conn.execute("SELECT count(*) FROM events").fetchone()[0]
        measure_catalog_search_refresh(sessions, args, workdir, store, queries, 1, fig, rebuild=False)
        return fig
    total = statistics.median(r.wall for r in runs)
    parts = {k: statistics.median(r.figures[k] for r in runs) for k in ("import_s", "refresh_s", "search_s")}
    rss = max(r.max_rss_mb for r in runs)
    fig.update(
        import_total_s=total,
        import_cpu_s=statistics.median(r.cpu for r in runs),
        peak_rss_mb=rss,
        **{f"import_{k}": v for k, v in parts.items()},
        memstore_sessions=last.figures["sessions_created"],
        events=last.figures["events"],
    )

    print("  importing the tiny archive ...", flush=True)
    tiny_floor, tiny_runs = [], []
    for rep in range(max(2, reps)):
        tiny_floor.append(bare_parse(tiny_files)[0])
        tiny_runs.append(import_side(tiny, tiny_store, workdir, f"import-tiny-{rep}", queries[0], None))
    tiny_total = statistics.median(r.wall for r in tiny_runs)
    tiny_cpu = statistics.median(r.cpu for r in tiny_runs)
    tiny_sessions = tiny_runs[-1].figures["sessions_created"]
    tiny_mb = tiny.bytes / 1e6
    fixed, per_mb = decompose(fig["memstore_sessions"], mb, total, tiny_sessions, tiny_mb, tiny_total)
    fixed_cpu, per_mb_cpu = decompose(
        fig["memstore_sessions"], mb, fig["import_cpu_s"], tiny_sessions, tiny_mb, tiny_cpu
    )
    fig.update(
        tiny_total_s=tiny_total,
        tiny_cpu_s=tiny_cpu,
        tiny_floor_s=statistics.median(tiny_floor),
        tiny_sessions=tiny_sessions,
        tiny_mb=tiny_mb,
        tiny_peak_rss_mb=max(r.max_rss_mb for r in tiny_runs),
        fixed_s_per_session=fixed,
        s_per_mb=per_mb,
        fixed_cpu_s_per_session=fixed_cpu,
        cpu_s_per_mb=per_mb_cpu,
    )
    drop_store(tiny_store)
    if args.baseline_tree is not None:
        measure_baseline_tree(main, tiny, args, workdir, queries[0], fig)
    measure_catalog_search_refresh(sessions, args, workdir, store, queries, reps, fig, rebuild=True)
    return fig


def measure_baseline_tree(
    main: archive.ArchiveSummary,
    tiny: archive.ArchiveSummary,
    args: argparse.Namespace,
    workdir: Path,
    query: str,
    fig: dict[str, Any],
) -> None:
    """``import_logs`` alone (no catalog) of both archives by this tree and by the memstore of
    ``--baseline-tree`` (another checkout: the code before a change), alternating."""
    print(f"  import_logs alone: this tree vs {args.baseline_tree} ...", flush=True)
    store = workdir / "store-import-only"
    runs: dict[str, list[ChildRun]] = {"this": [], "baseline": [], "this_tiny": [], "baseline_tiny": []}
    for rep in range(max(1, args.reps or 1)):
        order = ("this", "baseline") if rep % 2 == 0 else ("baseline", "this")
        for side in order:
            tree = ROOT if side == "this" else args.baseline_tree
            runs[side].append(
                import_side(
                    main,
                    store,
                    workdir,
                    f"import-only-{side}-{rep}",
                    query,
                    args.import_timeout,
                    tree,
                    import_only=True,
                )
            )
            runs[f"{side}_tiny"].append(
                import_side(tiny, store, workdir, f"import-only-{side}-tiny-{rep}", query, None, tree, import_only=True)
            )
    drop_store(store)
    for key, group in runs.items():
        fig[f"import_only_{key}_s"] = statistics.median(r.figures["import_s"] for r in group)
        fig[f"import_only_{key}_cpu_s"] = statistics.median(r.cpu for r in group)
        fig[f"import_only_{key}_rss_mb"] = max(r.max_rss_mb for r in group)
    fig["import_only_sessions"] = runs["this"][-1].figures["sessions_created"]
    fig["import_only_tiny_sessions"] = runs["this_tiny"][-1].figures["sessions_created"]
    fig["baseline_tree"] = str(args.baseline_tree)


def measure_catalog_search_refresh(
    sessions: int,
    args: argparse.Namespace,
    workdir: Path,
    store: Path,
    queries: list[str],
    reps: int,
    fig: dict[str, Any],
    rebuild: bool,
) -> None:
    print("  catalog from scratch vs floor B ...", flush=True)
    fts_db = workdir / f"floor-b-{sessions}.db"
    floor_b, rebuilds = [], []
    rebuild_reps = 0 if not rebuild else reps if args.rebuild_reps is None else args.rebuild_reps
    for rep in range(max(1, rebuild_reps)):
        order = ("floor", "memstore") if rep % 2 == 0 else ("memstore", "floor")
        for side in order:
            if side == "floor":
                run = run_child(
                    CHILD_FLOOR_B,
                    [str(store / "catalog.db"), str(fts_db), "{result}", json.dumps(COLUMNS)],
                    workdir,
                    f"floor-b-{sessions}-{rep}",
                )
                floor_b.append(run)
            elif rebuild_reps:
                rebuilds.append(
                    run_child(CHILD_CATALOG, [str(store), "{result}"], workdir, f"catalog-{sessions}-{rep}")
                )
    fig.update(
        floor_b_s=statistics.median(r.figures["seconds"] for r in floor_b),
        floor_b_rss_mb=max(r.max_rss_mb for r in floor_b),
        chunks=floor_b[-1].figures["rows"],
        chunk_text_mb=floor_b[-1].figures["text_bytes"] / 1e6,
    )
    if rebuilds:
        fig.update(
            catalog_build_s=statistics.median(r.figures["seconds"] for r in rebuilds),
            catalog_build_rss_mb=max(r.max_rss_mb for r in rebuilds),
            catalog_build_from="rebuild",
        )
    elif "import_refresh_s" in fig:  # the import run's refresh built the catalog from scratch: it measured it
        fig.update(
            catalog_build_s=fig["import_refresh_s"],
            catalog_build_rss_mb=fig["peak_rss_mb"],
            catalog_build_from="the first refresh after the import",
        )

    print("  search ...", flush=True)
    fig.update(search_figures(store, fts_db, queries, args.search_reps))

    print("  refresh with nothing changed ...", flush=True)
    fig.update(noop_figures(store))
    fig["load_at_end"] = os.getloadavg()
    print_size(fig)
    print(f"  (load average at the end: {', '.join(f'{x:.1f}' for x in os.getloadavg())}; 2 cores)")
    if not args.keep:
        drop_store(store)
        fts_db.unlink(missing_ok=True)


def noop_figures(store: Path, reps: int = 5) -> dict[str, Any]:
    """A refresh of an unchanged store, three ways, each beside the list+stat floor in the same
    loop: the full check (``refresh_catalog``: every file stamp of every session), the feed and
    a sweep now (``Store.refresh(full=False)``), the feed alone (``Store.refresh(full=False,
    sweep=False)``, the sweep not due), and what a search pays first when nothing changed
    (``LiveCatalog.ensure_current``, its warm connection open)."""
    from memstore.catalog import LiveCatalog, RefreshMode

    times: dict[str, list[float]] = {"full": [], "sweep": [], "feed": [], "search": [], "floor": []}
    live = LiveCatalog(store, sweep_interval=3600.0)  # the sweep is never due in the feed/search rows
    try:
        live.refresh(RefreshMode.SWEEP)
        live.connection()
        for _ in range(reps):
            for mode, key in ((RefreshMode.FULL, "full"), (RefreshMode.SWEEP, "sweep"), (RefreshMode.FEED, "feed")):
                started = time.perf_counter()
                report = memstore.refresh_catalog(store) if mode is RefreshMode.FULL else live.refresh(mode)
                times[key].append(time.perf_counter() - started)
                if report.changed:
                    raise RuntimeError(f"an unchanged store's {key} refresh changed something: {report}")
            started = time.perf_counter()
            missing = live.ensure_current()
            times["search"].append(time.perf_counter() - started)
            if missing:
                raise RuntimeError(f"an unchanged store's catalog misses sessions: {missing[:3]}")
            times["floor"].append(stat_floor(store))
    finally:
        live.close()
    out = {f"noop_{key}_s": statistics.median(values) for key, values in times.items()}
    out["noop_refresh_s"] = out["noop_full_s"]
    return out


def decompose(n1: int, mb1: float, t1: float, n2: int, mb2: float, t2: float) -> tuple[float, float]:
    """(fixed cost per session, cost per MB) solving t = fixed * n + per_mb * mb for two archives
    (a derived figure: it assumes the cost is linear in both, which the two runs cannot check)."""
    det = n1 * mb2 - n2 * mb1
    if not det:
        return float("nan"), float("nan")
    return (t1 * mb2 - t2 * mb1) / det, (n1 * t2 - n2 * t1) / det


def search_figures(store: Path, fts_db: Path, queries: list[str], reps: int) -> dict[str, Any]:
    engine: Optional[Callable[[str], Any]] = None
    catalog_conn = sqlite3.connect(f"file:{store / 'catalog.db'}?mode=ro", uri=True)
    try:
        from memstore.search import SearchIndex  # the engine alone (its place may move)

        index = SearchIndex(catalog_conn)
        engine = index.search
    except ImportError as exc:
        print(f"  (engine-only figure not measured: {exc})")
    fts = sqlite3.connect(f"file:{fts_db}?mode=ro", uri=True)
    sides: dict[str, Callable[[str], Any]] = {
        "memstore": lambda q: memstore.search_memory(store, q),
        "fts5": lambda q: fts_search(fts, q),
    }
    if engine is not None:
        sides["engine"] = engine
    for q in queries[:5]:  # warm every side's caches alike
        for fn in sides.values():
            fn(q)
    times: dict[str, list[list[float]]] = {side: [[] for _ in queries] for side in sides}
    names = list(sides)
    for rep in range(reps):
        for qi, q in enumerate(queries):
            rotation = names[rep % len(names) :] + names[: rep % len(names)]
            for side in rotation:
                started = time.perf_counter()
                sides[side](q)
                times[side][qi].append(time.perf_counter() - started)
    fts.close()
    catalog_conn.close()
    out: dict[str, Any] = {"queries": len(queries)}
    for side in names:
        per_query = [statistics.median(ts) for ts in times[side]]
        out[f"{side}_p50_s"] = statistics.median(per_query)
        out[f"{side}_p95_s"] = p95(per_query)
    return out


def report_stopped(run: ChildRun, timeout: float, mb: float, floor_a: float, fig: dict, store: Path) -> None:
    """Say how far a stopped import got, and extrapolate (linearly, labelled) what is left."""
    progress = run.progress or {}
    done, total = progress.get("done", 0), progress.get("total", 0)
    fraction = done / total if total else 0.0
    imported = sum(1 for _ in os.scandir(store / "sessions")) if (store / "sessions").is_dir() else 0
    fig.update(
        import_stopped_after_s=run.wall,
        stopped_phase=progress.get("phase"),
        phase_fraction=fraction,
        sessions_imported=imported,
        peak_rss_mb=run.max_rss_mb,
        import_cpu_s=run.cpu,
    )
    print(
        f"\n  IMPORT STOPPED after {run.wall:,.0f} s (limit {timeout:,.0f} s); peak RSS {run.max_rss_mb:,.0f} MB, "
        f"CPU {run.cpu:,.0f} s; {imported:,} session directories in the store"
    )
    if progress.get("phase") == "refresh":
        import_s = progress["import_s"]
        spent = progress["elapsed"] - import_s
        estimate = spent / fraction if fraction else float("nan")
        fig.update(
            import_import_s=import_s, refresh_extrapolated_s=estimate, import_total_extrapolated_s=import_s + estimate
        )
        print(
            f"  import_logs finished (measured): {import_s:,.0f} s ({mb / import_s:.1f} MB/s); floor A / import_logs "
            f"{floor_a / import_s:.3f}x"
        )
        print(
            f"  refresh_catalog (the catalog from scratch) had looked at {done:,} of {total:,} sessions "
            f"({fraction:.0%}) after {spent:,.0f} s"
        )
        print(
            f"  EXTRAPOLATED (linear in sessions, not measured): refresh {estimate:,.0f} s, import until searchable "
            f"{import_s + estimate:,.0f} s, ratio floor A / that {floor_a / (import_s + estimate):.4f}x"
        )
        # The refresh takes the sessions in name order; their logs' bytes weigh the work better.
        names = sorted(e.name for e in os.scandir(store / "sessions") if e.is_dir() and not e.name.startswith("."))
        sizes = [
            (store / "sessions" / n / "events.jsonl").stat().st_size
            if (store / "sessions" / n / "events.jsonl").exists()
            else 0
            for n in names
        ]
        weight = sum(sizes[:done]) / sum(sizes) if sum(sizes) else 0.0
        if weight:
            by_bytes = spent / weight
            fig.update(refresh_extrapolated_by_bytes_s=by_bytes, refresh_bytes_fraction=weight)
            print(
                f"  EXTRAPOLATED (linear in the logs' bytes: {weight:.0%} done, not measured): refresh {by_bytes:,.0f} s, "
                f"import until searchable {import_s + by_bytes:,.0f} s, ratio floor A / that "
                f"{floor_a / (import_s + by_bytes):.4f}x"
            )
    elif fraction:
        estimate = progress["elapsed"] / fraction
        fig.update(import_extrapolated_s=estimate)
        print(
            f"  import_logs had read {done / 1e6:,.0f} of {total / 1e6:,.0f} MB ({fraction:.0%}) after "
            f"{progress['elapsed']:,.0f} s"
        )
        print(
            f"  EXTRAPOLATED (linear in bytes, not measured): import_logs alone {estimate:,.0f} s, "
            f"ratio floor A / that {floor_a / estimate:.4f}x; the catalog refresh after it not reached"
        )
    else:
        print("  no progress was recorded: nothing to extrapolate from")
    print(f"  floor A (bare orjson parse): {floor_a:.1f} s ({mb / floor_a:,.0f} MB/s)")


def print_size(f: dict[str, Any]) -> None:
    n = f["memstore_sessions"]
    print(
        f"\n  -- {f['sessions']:,} sessions: {f['archive_mb']:,.0f} MB, {f['archive_lines']:,} lines, "
        f"{n:,} memstore sessions, {f['events']:,} events, {f['chunks']:,} chunks "
        f"({f['chunk_text_mb']:,.0f} MB of text)"
    )
    print(f"  {'':46s} {'memstore':>22s} {'floor':>24s}   ratio (floor / memstore)")
    if "import_total_s" in f:
        print_import(f, n)
    else:
        print("  import until searchable: stopped, see above (figures below are on the completed store)")
    if "catalog_build_s" in f:
        row(
            "catalog from scratch vs insert_all+FTS5 (B)",
            fmt_s(f["catalog_build_s"]),
            fmt_s(f["floor_b_s"]) + " B",
            f"{f['floor_b_s'] / f['catalog_build_s']:.3f}x",
        )
        if f.get("catalog_build_from") != "rebuild":
            print(
                f"  {'':4s}(memstore's figure: {f.get('catalog_build_from')}, which built the catalog from scratch;"
                " its RSS is the import child's)"
            )
        row("  peak RSS", f"{f['catalog_build_rss_mb']:9,.0f} MB", f"{f['floor_b_rss_mb']:9,.0f} MB", "")
    elif "refresh_extrapolated_s" in f:
        row(
            "catalog from scratch (EXTRAPOLATED) vs (B)",
            fmt_s(f["refresh_extrapolated_s"]),
            fmt_s(f["floor_b_s"]) + " B",
            f"{f['floor_b_s'] / f['refresh_extrapolated_s']:.3f}x (extrapolated)",
        )
    for p in ("p50", "p95"):
        row(
            f"search_memory {p} vs FTS5 bm25() (ratio FTS5/ours)",
            fmt_s(f[f"memstore_{p}_s"]),
            fmt_s(f[f"fts5_{p}_s"]) + " F",
            f"{f[f'fts5_{p}_s'] / f[f'memstore_{p}_s']:.2f}x",
        )
    if "engine_p50_s" in f:
        for p in ("p50", "p95"):
            row(
                f"  engine alone {p} (SearchIndex.search)",
                fmt_s(f[f"engine_{p}_s"]),
                fmt_s(f[f"fts5_{p}_s"]) + " F",
                f"{f[f'fts5_{p}_s'] / f[f'engine_{p}_s']:.2f}x",
            )
    if "import_only_this_s" in f:
        print(f"  import_logs alone (no catalog), this tree vs the baseline tree {f['baseline_tree']}:")
        for label, suffix, n in (
            ("archive", "", f["import_only_sessions"]),
            ("tiny archive", "_tiny", f["import_only_tiny_sessions"]),
        ):
            this, base = f[f"import_only_this{suffix}_s"], f[f"import_only_baseline{suffix}_s"]
            this_cpu, base_cpu = f[f"import_only_this{suffix}_cpu_s"], f[f"import_only_baseline{suffix}_cpu_s"]
            row(f"  {label}: wall (baseline / this)", fmt_s(this), fmt_s(base) + " baseline", f"{base / this:.2f}x")
            row(
                f"  {label}: CPU incl. workers",
                fmt_s(this_cpu),
                fmt_s(base_cpu) + " baseline",
                f"{base_cpu / this_cpu:.2f}x",
            )
            row(f"  {label}: per session (wall)", fmt_s(this / n), fmt_s(base / n) + " baseline", "")
            row(
                f"  {label}: peak RSS",
                f"{f[f'import_only_this{suffix}_rss_mb']:9,.0f} MB",
                f"{f[f'import_only_baseline{suffix}_rss_mb']:9,.0f} MB",
                "",
            )
        if "floor_a_s" in f:
            row(
                "  archive: floor A / import_logs (this; baseline)",
                f"{f['floor_a_s'] / f['import_only_this_s']:.3f}x",
                f"{f['floor_a_s'] / f['import_only_baseline_s']:.3f}x",
                "",
            )
    row(
        "refresh, nothing changed vs list+stat",
        fmt_s(f["noop_refresh_s"]),
        fmt_s(f["noop_floor_s"]),
        f"{f['noop_floor_s'] / f['noop_refresh_s']:.3f}x",
    )
    for key, label in (
        ("sweep", "  feed + sweep now (Store.refresh(full=False))"),
        ("feed", "  feed alone (full=False, sweep=False)"),
        ("search", "  before a search (LiveCatalog.ensure_current)"),
    ):
        if f"noop_{key}_s" in f:
            row(
                label,
                fmt_s(f[f"noop_{key}_s"]),
                fmt_s(f["noop_floor_s"]),
                f"{f['noop_floor_s'] / f[f'noop_{key}_s']:.3f}x",
            )


def print_import(f: dict[str, Any], n: int) -> None:
    row(
        "import until searchable vs bare parse (A)",
        fmt_s(f["import_total_s"]),
        fmt_s(f["floor_a_s"]) + " A",
        f"{f['floor_a_s'] / f['import_total_s']:.3f}x",
    )
    row(
        "  CPU time (child rusage / process_time)",
        fmt_s(f["import_cpu_s"]),
        fmt_s(f["floor_a_cpu_s"]) + " A",
        f"{f['floor_a_cpu_s'] / f['import_cpu_s']:.3f}x",
    )
    row(
        "  throughput",
        f"{f['archive_mb'] / f['import_total_s']:9.1f} MB/s",
        f"{f['archive_mb'] / f['floor_a_s']:9.1f} MB/s",
        "",
    )
    row(
        "  of which import_logs / refresh / 1 search",
        fmt_s(f["import_import_s"]),
        fmt_s(f["import_refresh_s"]),
        f"search {f['import_search_s'] * 1000:.0f} ms",
    )
    row("  peak RSS (import child)", f"{f['peak_rss_mb']:9,.0f} MB", "", "")
    row("  per session (whole archive)", fmt_s(f["import_total_s"] / n), fmt_s(f["floor_a_s"] / n), "")
    row(
        f"tiny sessions ({f['tiny_sessions']:,}, {f['tiny_mb']:.1f} MB): per session",
        fmt_s(f["tiny_total_s"] / f["tiny_sessions"]),
        fmt_s(f["tiny_floor_s"] / f["tiny_sessions"]) + " A",
        f"{f['tiny_floor_s'] / f['tiny_total_s']:.3f}x",
    )
    row("  CPU per session", fmt_s(f["tiny_cpu_s"] / f["tiny_sessions"]), "", "")
    row(
        "  derived: fixed cost per session (wall; CPU)",
        fmt_s(f["fixed_s_per_session"]),
        fmt_s(f["fixed_cpu_s_per_session"]) + " C",
        "",
    )
    row("  derived: cost per MB (wall; CPU)", fmt_s(f["s_per_mb"]), fmt_s(f["cpu_s_per_mb"]) + " C", "")
    row(
        "  derived: fixed costs' share (wall; CPU)",
        f"{f['fixed_s_per_session'] * n / f['import_total_s']:9.0%}",
        f"{f['fixed_cpu_s_per_session'] * n / f['import_cpu_s']:9.0%} C",
        "",
    )


def print_growth(results: list[dict[str, Any]]) -> None:
    done = [r for r in results if "memstore_p50_s" in r]
    if len(done) < 2:
        return
    a, b = done[0], done[-1]
    print(
        f"\n== growth from {a['sessions']:,} to {b['sessions']:,} sessions (ratio larger / smaller; "
        f"{b['archive_mb'] / a['archive_mb']:.1f}x the bytes, {b['chunks'] / a['chunks']:.1f}x the chunks)"
    )
    # (label, figure, its extrapolated stand-in when a stopped run could not measure it, divisor)
    pairs = (
        ("import_logs time per MB", "import_import_s", None, "archive_mb"),
        ("import until searchable per MB", "import_total_s", "import_total_extrapolated_s", "archive_mb"),
        ("import until searchable per session", "import_total_s", "import_total_extrapolated_s", "memstore_sessions"),
        ("catalog from scratch per chunk", "catalog_build_s", "refresh_extrapolated_s", "chunks"),
        ("search_memory p50", "memstore_p50_s", None, None),
        ("search_memory p95", "memstore_p95_s", None, None),
        ("FTS5 bm25() p50", "fts5_p50_s", None, None),
        ("refresh with nothing changed (full check)", "noop_refresh_s", None, None),
        ("refresh with nothing changed (feed alone)", "noop_feed_s", None, None),
        ("before a search, nothing changed", "noop_search_s", None, None),
        ("peak RSS of the import child", "peak_rss_mb", None, None),
    )
    for label, key, stand_in, per in pairs:
        values: list[float] = []
        extrapolated = False
        for f in (a, b):
            value = f.get(key)
            if value is None and stand_in is not None and f.get(stand_in) is not None:
                value, extrapolated = f[stand_in], True
            if value is None:
                break
            values.append(value / f[per] if per is not None else value)
        if len(values) < 2:
            print(f"  {label:40s} not measured at both sizes")
        else:
            print(
                f"  {label:40s} {values[1] / values[0]:8.2f}x"
                + ("  (EXTRAPOLATED figure involved)" if extrapolated else "")
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", default=None, help="comma-separated archive sizes (default 1000)")
    parser.add_argument("--quick", action="store_true", help="a small archive and few repetitions")
    parser.add_argument("--json", type=Path, default=None, help="write every figure to this file")
    parser.add_argument(
        "--workdir", type=Path, default=Path(os.environ.get("TMPDIR", "/tmp")) / "memstore-bench-archive"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--scale", type=float, default=1.0, help="session size scale of the main archive")
    parser.add_argument("--tiny", type=int, default=None, help="sessions of the tiny-session archive (default 1000)")
    parser.add_argument("--queries", type=int, default=None)
    parser.add_argument(
        "--reps", type=int, default=None, help="import and catalog repetitions (default 2, 1 above 2 GB)"
    )
    parser.add_argument("--search-reps", type=int, default=3)
    parser.add_argument("--import-timeout", type=float, default=2400.0, help="seconds before an import is stopped")
    parser.add_argument(
        "--rebuild-reps",
        type=int,
        default=None,
        help="catalog-from-scratch repetitions (default: as --reps); 0 takes the import run's first "
        "refresh, which built the catalog from scratch",
    )
    parser.add_argument(
        "--previous",
        type=Path,
        default=None,
        help="a --json file of an earlier run: its sizes join the growth comparison",
    )
    parser.add_argument("--keep", action="store_true", help="keep the stores in the workdir")
    parser.add_argument(
        "--baseline-tree",
        type=Path,
        default=None,
        help="another checkout of memstore (the code before a change): import_logs alone of both "
        "archives is also measured with it, alternating with this tree",
    )
    args = parser.parse_args()
    sizes = [int(s) for s in args.sessions.split(",")] if args.sessions else ([100] if args.quick else [1000])
    if args.quick:
        args.scale = min(args.scale, 0.3)
    args.tiny = args.tiny or (100 if args.quick else 1000)
    args.queries = args.queries or (20 if args.quick else 50)
    args.workdir.mkdir(parents=True, exist_ok=True)
    print(
        f"memstore archive benchmark: sizes {sizes}, seed {args.seed}, scale {args.scale:g}, "
        f"{args.queries} queries x {args.search_reps}, workdir {args.workdir}"
    )
    print(f"  machine: {os.cpu_count()} cores; python {sys.version.split()[0]}; sqlite {sqlite3.sqlite_version}")
    results: list[dict[str, Any]] = []
    for n in sizes:
        results.append(measure_size(n, args, args.workdir))
        if args.json:  # after each size: a long run that stops later keeps what it measured
            args.json.write_text(
                json.dumps(
                    {"args": {k: str(v) for k, v in vars(args).items()}, "results": results}, indent=2, default=str
                )
            )
    earlier = json.loads(args.previous.read_text())["results"] if args.previous else []
    if earlier:
        print(f"\n(sizes {', '.join(str(r['sessions']) for r in earlier)} from the earlier run {args.previous})")
    print_growth(sorted(earlier + results, key=lambda r: r["sessions"]))
    if args.json:
        print(f"\nfigures written to {args.json}")


if __name__ == "__main__":
    main()
