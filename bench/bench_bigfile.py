"""Importing one huge session file (issue 16, huge single files): peak memory and speed against
the same import of a small file and against a bare parse, all in one run.

    python bench/bench_bigfile.py                 # ~1 GB Claude Code transcript and Codex rollout
    python bench/bench_bigfile.py --mb 200        # smaller
    python bench/bench_bigfile.py --workdir /var/tmp/bench-bigfile

The files come from ``bench/archive.py``'s session writers (realistic text, tool outputs and
both agents' real line formats), one session per agent of about ``--mb`` MB and one of about
``--small-mb`` MB; they are kept in ``--workdir`` and reused. Each side runs alone in a fresh
child process that reports its own peak RSS with ``resource.getrusage`` (``RUSAGE_SELF``, and
``RUSAGE_CHILDREN`` for any worker it started):

- ``import_logs`` of the file into an empty store (``jobs=1``: one file is one task);
- floor: a bare loop reading the same file line by line and ``orjson.loads``-ing each line;
- the RSS of a child that only imports memstore (what every side pays before reading a byte).

Memory is flat when the big file's peak RSS is about the small file's; speed holds when its
MB/s is about the small file's. The ratio against the floor is floor time / import time.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(BENCH))

CHILD_IMPORT = r"""
import json, resource, sys, time
sys.path.insert(0, sys.argv[1])
import memstore
started, cpu = time.perf_counter(), time.process_time()
report = memstore.import_logs(sys.argv[2], sys.argv[3], jobs=1)
wall = time.perf_counter() - started
me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({"wall": wall, "cpu": me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime,
                  "rss_mb": max(me.ru_maxrss, kids.ru_maxrss) / 1024, "events": report.events_appended,
                  "created": report.sessions_created, "problems": [list(p) for p in report.problems[:5]]}))
"""

CHILD_FLOOR = r"""
import json, resource, sys, time
import orjson
started = time.perf_counter()
lines = 0
with open(sys.argv[2], "rb") as fh:
    for line in fh:
        if line.strip():
            orjson.loads(line)
            lines += 1
wall = time.perf_counter() - started
me = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"wall": wall, "cpu": me.ru_utime + me.ru_stime, "rss_mb": me.ru_maxrss / 1024, "lines": lines}))
"""

CHILD_IDLE = r"""
import json, resource, sys
sys.path.insert(0, sys.argv[1])
import memstore, memstore.importers, memstore.importers.pipeline
print(json.dumps({"rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def generate(workdir: Path, agent: str, mb: float, seed: int) -> Path:
    """One session file of about ``mb`` MB of ``agent`` (``claude`` or ``codex``), made once."""
    marker = workdir / f"{agent}-{mb:g}MB-s{seed}.path"
    if marker.exists() and Path(marker.read_text()).exists():
        return Path(marker.read_text())
    dest = workdir / f"{agent}-{mb:g}MB-s{seed}"
    shutil.rmtree(dest, ignore_errors=True)
    code = r"""
import sys
sys.path.insert(0, sys.argv[1])
from pathlib import Path
from archive import _project
from archive_claude import ClaudeSession
from archive_codex import CodexSession
from archive_text import Texts, hash_seed
from archive_turns import Agent, SessionSpec
agent, target, seed, dest = Agent(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), Path(sys.argv[5])
version, model = ("2.1.42", "claude-sonnet-4-5") if agent is Agent.CLAUDE else ("0.104.0", "gpt-5-codex")
spec = SessionSpec(index=0, seed=hash_seed(seed, "big", agent.value), agent=agent, version=version, model=model,
                   start_ms=1_760_000_000_000, project=0, target_bytes=target)
project = _project(seed, 0)
texts = Texts(project, spec.seed)
if agent is Agent.CLAUDE:
    written = ClaudeSession(spec, project, texts, dest / ".claude" / "projects").write()
else:
    written = CodexSession(spec, project, texts, dest / ".codex" / "sessions").write()
main = max(written, key=lambda w: w.size)
print(main.path)
"""
    out = subprocess.run(
        [sys.executable, "-c", code, str(BENCH), agent, str(int(mb * 1e6)), str(seed), str(dest)],
        check=True,
        capture_output=True,
        text=True,
    )
    path = Path(out.stdout.strip().splitlines()[-1])
    marker.write_text(str(path))
    return path


def child(code: str, *args: str) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-c", code, str(ROOT), *args], check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def measure(path: Path, workdir: Path, reps: int) -> dict[str, Any]:
    """Import and floor, alternating, ``reps`` times each: medians of time, max of RSS."""
    imports, floors = [], []
    for rep in range(reps):
        for side in ("floor", "import") if rep % 2 == 0 else ("import", "floor"):
            if side == "floor":
                floors.append(child(CHILD_FLOOR, str(path)))
                continue
            store = workdir / "store"
            shutil.rmtree(store, ignore_errors=True)
            result = child(CHILD_IMPORT, str(store), str(path))
            shutil.rmtree(store, ignore_errors=True)
            if result["created"] != 1 or result["problems"]:
                raise RuntimeError(f"the import of {path} went wrong: {result}")
            imports.append(result)

    def median(rows: list[dict], key: str) -> float:
        values = sorted(r[key] for r in rows)
        return values[len(values) // 2]

    mb = path.stat().st_size / 1e6
    return {
        "file": str(path),
        "mb": mb,
        "events": imports[-1]["events"],
        "import_s": median(imports, "wall"),
        "import_cpu_s": median(imports, "cpu"),
        "import_rss_mb": max(r["rss_mb"] for r in imports),
        "floor_s": median(floors, "wall"),
        "floor_cpu_s": median(floors, "cpu"),
        "floor_rss_mb": max(r["rss_mb"] for r in floors),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=float, default=1000.0, help="size of the big files (MB)")
    parser.add_argument("--small-mb", type=float, default=10.0, help="size of the small files (MB)")
    parser.add_argument("--agents", default="claude,codex")
    parser.add_argument("--reps", type=int, default=1, help="repetitions of each side on the big files")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/memstore-bench-bigfile"))
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    idle = child(CHILD_IDLE)["rss_mb"]
    print(
        f"memstore big-file benchmark: {args.mb:g} MB against {args.small_mb:g} MB; a child that only imports "
        f"memstore peaks at {idle:.0f} MB RSS"
    )
    results = []
    for agent in args.agents.split(","):
        print(f"  {agent}: generating ...", flush=True)
        small = generate(args.workdir, agent, args.small_mb, args.seed)
        big = generate(args.workdir, agent, args.mb, args.seed)
        print(f"  {agent}: measuring ...", flush=True)
        s = measure(small, args.workdir, max(3, args.reps))
        b = measure(big, args.workdir, args.reps)
        results.append({"agent": agent, "small": s, "big": b, "idle_rss_mb": idle})
        print(
            f"\n  -- {agent}: {b['mb']:,.0f} MB file ({b['events']:,} events) vs {s['mb']:,.1f} MB file "
            f"({s['events']:,} events)"
        )
        print(f"  {'':34s} {'big':>12s} {'small':>12s}   big / small")
        print(
            f"  {'peak RSS of the import':34s} {b['import_rss_mb']:9,.0f} MB {s['import_rss_mb']:9,.0f} MB   "
            f"{b['import_rss_mb'] / s['import_rss_mb']:.2f}x  (file {b['mb'] / s['mb']:,.0f}x)"
        )
        print(
            f"  {'  above the idle child':34s} {b['import_rss_mb'] - idle:9,.0f} MB "
            f"{s['import_rss_mb'] - idle:9,.0f} MB"
        )
        print(f"  {'peak RSS of the bare parse':34s} {b['floor_rss_mb']:9,.0f} MB {s['floor_rss_mb']:9,.0f} MB")
        for label, key in (("import MB/s", "import_s"), ("bare parse MB/s (floor)", "floor_s")):
            print(
                f"  {label:34s} {b['mb'] / b[key]:12,.1f} {s['mb'] / s[key]:12,.1f}   "
                f"{(b['mb'] / b[key]) / (s['mb'] / s[key]):.2f}x"
            )
        print(
            f"  {'ratio floor / import (wall)':34s} {b['floor_s'] / b['import_s']:11.3f}x "
            f"{s['floor_s'] / s['import_s']:11.3f}x"
        )
        print(
            f"  {'ratio floor / import (CPU)':34s} {b['floor_cpu_s'] / b['import_cpu_s']:11.3f}x "
            f"{s['floor_cpu_s'] / s['import_cpu_s']:11.3f}x"
        )
        print(f"  {'import time':34s} {b['import_s']:10,.1f} s {s['import_s']:10,.2f} s")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
        print(f"\nfigures written to {args.json}")


if __name__ == "__main__":
    main()
