"""Retention over a store of 10,000 sessions, against a bare directory walk that only reads each
session's manifest.

    python bench/bench_retention.py [--sessions 10000] [--repeat 5]

The store is built once per scenario from one real session written by memstore (its
events.jsonl, manifest.json, session.lock, and its index/session.db hard-linked, so 10,000
copies cost little disk), each copy with its own id and last-event time. Both sides run warm
(the page cache holds the store), alternating, median of the repetitions.

Scenarios:

- ``keep all``: every session is recent and the count cap is above the store's size, so
  retention only surveys: per session it checks the entry is a real directory, probes the pin
  file and the liveness lock (open + flock), reads and parses the manifest, and compares it
  with the log's size. This is the per-session cost the goal (<= 3x the walk) is about.
- ``remove 10%``: 1,000 of the sessions are past the age window and go: each removal renames
  the directory into the trash under its lock, deletes it, and appends an fsynced line to
  gc-log.jsonl. A fresh store per repetition.
- ``default policy``: 50 sessions / 30 days on 10,000 recent sessions: 9,950 go by the count
  cap (mostly removal cost). A fresh store per repetition.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import memstore  # noqa: E402
from memstore.events import format_ts  # noqa: E402


def template(root: Path) -> dict[str, bytes]:
    """One real session, written by memstore: the bytes of its files."""
    with memstore.open_session(root, "template") as log:
        log.append({"type": "thread.started", "thread_id": "template"})
        for n in range(3):
            log.append({"type": "turn.started"})
            log.append(
                {
                    "type": "item.completed",
                    "item": {
                        "id": f"c{n}",
                        "type": "command_execution",
                        "command": "cargo test",
                        "aggregated_output": "ok " * 50,
                        "exit_code": 0,
                        "status": "completed",
                    },
                }
            )
            log.append({"type": "turn.completed", "usage": {"input_tokens": 100, "output_tokens": 10}})
        log.append(
            {
                "type": "thread.completed",
                "thread_id": "template",
                "session_id": "template",
                "subtype": "success",
                "outcome_code": "completed",
                "usage": {},
                "num_turns": 3,
            }
        )
        directory = log.directory
    return {
        "events.jsonl": (directory / "events.jsonl").read_bytes(),
        "manifest.json": (directory / "manifest.json").read_bytes(),
        "index/session.db": (directory / "index" / "session.db").read_bytes(),
    }


def build_store(root: Path, files: dict[str, bytes], count: int, old: int) -> None:
    """``count`` sessions under ``root``; the first ``old`` of them last updated in 2020."""
    sessions = root / "sessions"
    sessions.mkdir(parents=True, mode=0o700)
    shared_db = root / "shared-session.db"
    shared_db.write_bytes(files["index/session.db"])
    manifest = orjson.loads(files["manifest.json"])
    now = time.time()
    for n in range(count):
        sid = f"sess-{n:06d}"
        directory = sessions / sid
        directory.mkdir(mode=0o700)
        (directory / "index").mkdir(mode=0o700)
        (directory / "derived").mkdir(mode=0o700)
        (directory / "events.jsonl").write_bytes(files["events.jsonl"])
        (directory / "session.lock").write_bytes(b"")
        os.link(shared_db, directory / "index" / "session.db")
        stamp = 1_577_836_800 + n if n < old else now - 3600 - n
        (directory / "manifest.json").write_bytes(
            orjson.dumps({**manifest, "session_id": sid, "updated_at": format_ts_epoch(stamp)})
        )


def format_ts_epoch(seconds: float) -> str:
    return format_ts(datetime.fromtimestamp(seconds, UTC))


def bare_walk(root: Path) -> int:
    """The baseline: list the sessions directory and read and parse each manifest."""
    seen = 0
    with os.scandir(root / "sessions") as entries:
        for entry in entries:
            with open(os.path.join(entry.path, "manifest.json"), "rb") as fh:
                orjson.loads(fh.read())
            seen += 1
    return seen


def scenario(
    name: str, files: dict, count: int, old: int, policy: memstore.RetentionPolicy, repeat: int, fresh: bool
) -> dict:
    base = Path(tempfile.mkdtemp(prefix="bench-retention-"))
    walks, runs, removed = [], [], []
    try:
        store = base / "store"
        build_store(store, files, count, old)
        for rep in range(repeat):
            if fresh and rep:
                shutil.rmtree(store)
                build_store(store, files, count, old)
            bare_walk(store)  # warm the cache for both sides
            start = time.perf_counter()
            bare_walk(store)
            walks.append(time.perf_counter() - start)
            start = time.perf_counter()
            report = memstore.apply_retention(store, policy, apply=True)
            runs.append(time.perf_counter() - start)
            removed.append(report.count)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    walk, run = statistics.median(walks), statistics.median(runs)
    result = {
        "scenario": name,
        "sessions": count,
        "removed": removed[0],
        "walk_s": walk,
        "retention_s": run,
        "walk_us_per_session": walk / count * 1e6,
        "retention_us_per_session": run / count * 1e6,
        "ratio": run / walk,
    }
    if removed[0]:
        result["us_per_removal"] = (run - walk) / removed[0] * 1e6  # beyond the walk's share
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    count = args.sessions
    with tempfile.TemporaryDirectory() as scratch:
        files = template(Path(scratch))
    results = [
        scenario("keep all", files, count, 0, memstore.RetentionPolicy(count * 2, 3650), args.repeat, fresh=False),
        scenario(
            "remove 10%", files, count, count // 10, memstore.RetentionPolicy(count * 2, 30), args.repeat, fresh=True
        ),
        scenario(
            "default policy", files, count, 0, memstore.RetentionPolicy(50, 30), max(1, args.repeat // 2), fresh=True
        ),
    ]
    print(
        f"{'scenario':<16} {'sessions':>8} {'removed':>8} {'walk µs/session':>16} {'retention µs/session':>21} "
        f"{'ratio':>7} {'µs/removal':>11}"
    )
    for r in results:
        per_removal = f"{r['us_per_removal']:.0f}" if "us_per_removal" in r else "-"
        print(
            f"{r['scenario']:<16} {r['sessions']:>8} {r['removed']:>8} {r['walk_us_per_session']:>16.1f} "
            f"{r['retention_us_per_session']:>21.1f} {r['ratio']:>6.2f}x {per_removal:>11}"
        )
    keep = results[0]
    print(
        f"\nretention over {count} sessions (nothing to remove): {keep['retention_s'] * 1000:.0f} ms, "
        f"walk {keep['walk_s'] * 1000:.0f} ms: ratio {keep['ratio']:.2f}x (goal <= 3x)"
    )


if __name__ == "__main__":
    main()
