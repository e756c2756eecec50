"""Explorer pages at scale, through datasette.client, side by side with Datasette's own table page.

    python bench/bench_explorer.py [--sessions 10000] [--events 100000] [--root DIR]

Builds (once, kept under --root) a store with one session of --events events and --sessions small
sessions, refreshes the catalog, then times, median of 7 alternating runs:

- the session page of the big session vs Datasette's table page of the catalog's turns filtered to it;
- the home page over every session vs Datasette's table page of the sessions table;
- a turn page of the big session and its event page, for reference.

Goal: each explorer page within 2x of Datasette's table page over the same catalog table.

Last run (2-core machine, 2026-12-01; median ms, explorer vs Datasette):
session page 54.5 vs 110.2 (0.49x), home 18.0 vs 106.9 (0.17x), turn 5.8 vs 40.1 (0.14x),
event 4.5 vs 13.6 (0.33x). A store whose session indexes are in an older format is read from
its logs until rebuilt (``memstore doctor --fix``): about a second per page for 100,000 events.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import memstore  # noqa: E402
from memstore.catalog import refresh_catalog  # noqa: E402
from memstore.explorer import make_datasette  # noqa: E402

OUTPUT = "test result: ok. 12 passed; 0 failed\n" * 8


def build(root: Path, sessions: int, events: int) -> None:
    if (root / "catalog.db").exists():
        with memstore.read_session(root, "big") as reader:
            current = reader.index is not None
        if current:
            return
        # Built by an older memstore: its indexes would be read from the logs (as a user's
        # are until `memstore doctor --fix`), which is not what this benchmark measures.
        print(f"  {root} was written by an older memstore: writing it again", file=sys.stderr)
        shutil.rmtree(root)
    started = time.perf_counter()
    with memstore.open_session(root, "big", max_events=0, durability="none") as log:
        log.append({"type": "thread.started", "thread_id": "big"}, ts="2026-11-01T00:00:00.000Z")
        written, turn = 1, 0
        while written < events:
            turn += 1
            day = 1 + (turn // 400) % 28
            ts = f"2026-11-{day:02d}T{(turn // 17) % 24:02d}:{turn % 60:02d}:00.000Z"
            log.append({"type": "turn.started"}, ts=ts)
            for i in range(8):
                log.append(
                    {
                        "type": "item.completed",
                        "item": {
                            "id": f"c{turn}.{i}",
                            "type": "command_execution",
                            "command": f"cargo test -p crate{i}",
                            "aggregated_output": OUTPUT,
                            "exit_code": i % 5 == 0,
                            "status": "completed",
                        },
                    },
                    ts=ts,
                )
            log.append(
                {
                    "type": "turn.completed",
                    "usage": {"input_tokens": 1000 + turn, "cached_input_tokens": 800, "output_tokens": 50},
                },
                ts=ts,
            )
            written += 10
    for n in range(sessions):
        ts = f"2026-10-{1 + n % 28:02d}T{n % 24:02d}:00:00.000Z"
        with memstore.open_session(root, f"s{n:05d}", durability="none") as log:
            log.append({"type": "thread.started", "thread_id": f"s{n:05d}"}, ts=ts)
            log.append({"type": "turn.started"}, ts=ts)
            log.append(
                {
                    "type": "item.completed",
                    "item": {"id": "u", "type": "user_message", "text": f"task number {n}: fix the build"},
                },
                ts=ts,
            )
            log.append({"type": "turn.completed", "usage": {"input_tokens": 100 + n, "output_tokens": 10}}, ts=ts)
        if n % 1000 == 999:
            print(f"  {n + 1} sessions written ({time.perf_counter() - started:.0f} s)", file=sys.stderr)
    print(f"  store written in {time.perf_counter() - started:.0f} s; refreshing the catalog", file=sys.stderr)
    started = time.perf_counter()
    refresh_catalog(root)
    print(f"  catalog refreshed in {time.perf_counter() - started:.0f} s", file=sys.stderr)


async def timed(ds, path: str) -> float:
    started = time.perf_counter()
    response = await ds.client.get(path)
    elapsed = time.perf_counter() - started
    assert response.status_code == 200, (path, response.status_code, response.text[:300])
    return elapsed


async def compare(ds, pairs, repeats: int = 7) -> list[tuple[str, str, float, float]]:
    out = []
    for ours, theirs in pairs:
        await timed(ds, ours)  # warm caches on both sides
        await timed(ds, theirs)
        a, b = [], []
        for _ in range(repeats):
            a.append(await timed(ds, ours))
            b.append(await timed(ds, theirs))
        out.append((ours, theirs, statistics.median(a), statistics.median(b)))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=10_000)
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--root", type=Path, default=Path(tempfile.gettempdir()) / "memstore-bench-explorer")
    args = parser.parse_args()
    root = args.root / f"s{args.sessions}-e{args.events}"
    build(root, args.sessions, args.events)
    ds = make_datasette(root)
    pairs = [
        ("/-/memstore/sessions/big", "/catalog/turns?session_id=big"),
        ("/-/memstore", "/catalog/sessions"),
        ("/-/memstore/sessions/big/turns/5000", "/catalog/events?session_id=big&turn=5000"),
        ("/-/memstore/sessions/big/events/50000", "/catalog/events?session_id=big&seq=50000"),
    ]
    results = asyncio.run(compare(ds, pairs))
    print(f"store: {args.sessions:,} sessions + one of {args.events:,} events ({root})")
    print(f"{'explorer page':<42} {'ms':>8}   {'Datasette table page':<42} {'ms':>8}  ratio")
    for ours, theirs, a, b in results:
        print(f"{ours:<42} {a * 1000:8.1f}   {theirs:<42} {b * 1000:8.1f}  {a / b:5.2f}x")
    print("goal: the session and home pages <= 2x (and well under a second)")


if __name__ == "__main__":
    main()
