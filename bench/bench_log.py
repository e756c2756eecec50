"""Benchmarks of the event log, each measured side by side with a bare baseline in one run.

    python bench/bench_log.py                 # all of it (the 1M-event reopen takes a few minutes)
    python bench/bench_log.py --quick         # smaller sizes, for a smoke run

Prints one line per comparison with both timings and their ratio, then a summary:

- live append, ``durability="turn"`` (fdatasync per turn, 10 events a turn with kilobytes of
  command output) against a bare loop that serializes the same envelopes, writes each turn with
  one ``write()`` and fdatasyncs it. Ratio = bare time / memstore time (goal >= 0.4).
- bulk append, ``durability="none"``, against a bare serialize-and-write loop into a buffered
  file, flushed and synced once at the end like memstore's close. Ratio as above (goal >= 0.3).
- reopen of a 1,000,000-event session against a full rescan (``rebuild``) of it. Ratio =
  reopen time / rescan time (goal <= 0.01).
- peak RSS of the process doing that rescan (goal <= 150 MB), measured in a child process.

Timings alternate between the two sides and report the median of the repetitions, because this
machine is shared and noisy.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import memstore  # noqa: E402
from memstore.events import SCHEMA_VERSION, utc_now  # noqa: E402


def make_turns(n_turns: int, seed: int = 7) -> list[list[dict]]:
    """Realistic turns of 10 events: a plan, reasoning, three commands with 1-6 KB of output, a
    tool call and its output, a file change with a diff, a message, and the usage."""
    rng = random.Random(seed)
    words = ("cargo test build error warning file src main lib mod fn struct impl trait pub use "
             "let mut self return match some none ok err vec string option result").split()

    def text(n_words: int) -> str:
        return " ".join(rng.choice(words) for _ in range(n_words))

    def output(n_bytes: int) -> str:
        lines = []
        size = 0
        while size < n_bytes:
            line = f"{rng.choice(words)}: {text(8)} at src/{rng.choice(words)}.rs:{rng.randint(1, 900)}"
            lines.append(line)
            size += len(line) + 1
        return "\n".join(lines)

    turns = []
    for t in range(n_turns):
        events = [
            {"type": "turn.started"},
            {"type": "item.completed", "item": {"id": f"r{t}", "type": "reasoning", "text": text(60)}},
        ]
        for c in range(3):
            events.append({"type": "item.completed", "item": {
                "id": f"cmd{t}_{c}", "type": "command_execution", "command": f"cargo {rng.choice(words)}",
                "aggregated_output": output(rng.randint(1000, 6000)), "exit_code": rng.choice([0, 0, 0, 1]),
                "status": "completed"}})
        events.append({"type": "item.completed", "item": {
            "id": f"tool{t}", "type": "tool_invocation", "tool_name": "read_file",
            "arguments": {"path": f"src/{rng.choice(words)}.rs"}, "status": "completed", "outcome": "success"}})
        events.append({"type": "item.completed", "item": {
            "id": f"tool{t}:output", "type": "tool_output", "call_id": f"tool{t}",
            "output": output(rng.randint(500, 3000)), "status": "completed"}})
        events.append({"type": "item.completed", "item": {
            "id": f"fc{t}", "type": "file_change", "changes": [{"path": "src/lib.rs", "kind": "update"}],
            "status": "completed", "unified_diff": output(800)}})
        events.append({"type": "item.completed", "item": {"id": f"m{t}", "type": "agent_message", "text": text(40)}})
        events.append({"type": "turn.completed", "usage": {
            "input_tokens": rng.randint(1000, 9000), "cached_input_tokens": 500,
            "cache_creation_tokens": 0, "output_tokens": rng.randint(100, 900)}})
        turns.append(events)
    return turns


def run_memstore(root: Path, turns: list[list[dict]], durability: str) -> float:
    start = time.perf_counter()
    log = memstore.open_session(root, "bench", max_events=0, durability=durability)
    for events in turns:
        for event in events:
            log.append(event)
    log.close()
    return time.perf_counter() - start


def run_bare_turn(path: Path, turns: list[list[dict]]) -> float:
    """Serialize each envelope, one write() per turn, fdatasync per turn."""
    start = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    seq = 0
    for events in turns:
        chunk = bytearray()
        for event in events:
            seq += 1
            chunk += orjson.dumps({"schema_version": SCHEMA_VERSION, "seq": seq, "ts": utc_now(), "event": event},
                                  option=orjson.OPT_APPEND_NEWLINE)
        os.write(fd, chunk)
        os.fdatasync(fd)
    os.close(fd)
    return time.perf_counter() - start


def run_bare_bulk(path: Path, turns: list[list[dict]]) -> float:
    """Serialize and write each envelope into a buffered file; one sync at the end."""
    start = time.perf_counter()
    seq = 0
    with open(path, "ab") as fh:
        for events in turns:
            for event in events:
                seq += 1
                fh.write(orjson.dumps({"schema_version": SCHEMA_VERSION, "seq": seq, "ts": utc_now(), "event": event},
                                      option=orjson.OPT_APPEND_NEWLINE))
        fh.flush()
        os.fsync(fh.fileno())
    return time.perf_counter() - start


def compare(name: str, ours, bare, reps: int, base: Path) -> float:
    ours_times, bare_times = [], []
    for _ in range(reps):
        for side, times in ((bare, bare_times), (ours, ours_times)):
            work = fresh_dir(base)
            times.append(side(work))
            # Each side starts with the page cache as clean as the other's.
            shutil.rmtree(work)
            os.sync()
    o, b = statistics.median(ours_times), statistics.median(bare_times)
    ratio = b / o
    print(f"{name:<34} memstore {o * 1000:9.1f} ms   bare {b * 1000:9.1f} ms   ratio {ratio:5.2f}x of the floor")
    return ratio


def fresh_dir(base: Path) -> Path:
    path = Path(tempfile.mkdtemp(dir=base))
    return path


def build_big_session(root: Path, n_events: int) -> None:
    """A session of ``n_events`` events in 10-event turns, with smaller outputs (~300 B/event on
    average) so the file stays a few hundred MB."""
    rng = random.Random(3)
    log = memstore.open_session(root, "big", max_events=0, durability="none")
    t = 0
    while log.event_count < n_events:
        t += 1
        log.append({"type": "turn.started"})
        for i in range(8):
            log.append({"type": "item.completed", "item": {
                "id": f"c{t}_{i}", "type": "command_execution", "command": "cargo check",
                "aggregated_output": "warning: unused variable " * rng.randint(2, 20), "exit_code": 0,
                "status": "completed"}})
        log.append({"type": "turn.completed", "usage": {"input_tokens": 100, "cached_input_tokens": 0,
                                                        "cache_creation_tokens": 0, "output_tokens": 10}})
    log.close()


RESCAN_CHILD = """
import resource, sys, time
sys.path.insert(0, {repo!r})
import memstore
start = time.perf_counter()
memstore.rebuild({root!r}, "big")
elapsed = time.perf_counter() - start
print(elapsed, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""

REOPEN_CHILD = """
import sys, time
sys.path.insert(0, {repo!r})
import memstore
start = time.perf_counter()
log = memstore.open_session({root!r}, "big", max_events=0)
count = log.event_count
log.close()
print(time.perf_counter() - start, count)
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    parser.add_argument("--turns", type=int, default=None, help="turns per append run")
    parser.add_argument("--big-events", type=int, default=None, help="events in the reopen/rescan session")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--dir", default=None, help="where to put the data (default: a temp dir)")
    args = parser.parse_args()
    n_turns = args.turns or (100 if args.quick else 400)
    n_big = args.big_events or (100_000 if args.quick else 1_000_000)
    base = Path(tempfile.mkdtemp(prefix="memstore-bench-", dir=args.dir))
    repo = str(Path(__file__).resolve().parent.parent)
    try:
        turns = make_turns(n_turns)
        payload = sum(len(orjson.dumps(e)) for t in turns for e in t)
        print(f"append workload: {n_turns} turns x 10 events, {payload / 1e6:.1f} MB of events")
        live = compare(
            "live append (fdatasync per turn)",
            lambda work: run_memstore(work, turns, "turn"),
            lambda work: run_bare_turn(work / "events.jsonl", turns),
            args.reps,
            base,
        )
        bulk = compare(
            "bulk append (durability=none)",
            lambda work: run_memstore(work, turns, "none"),
            lambda work: run_bare_bulk(work / "events.jsonl", turns),
            args.reps,
            base,
        )

        big_root = base / "big"
        t0 = time.perf_counter()
        build_big_session(big_root, n_big)
        size = (big_root / "sessions" / "big" / "events.jsonl").stat().st_size
        print(f"built a {n_big:,}-event session ({size / 1e6:.0f} MB) in {time.perf_counter() - t0:.1f} s")
        reopen_times, rescan_times, peaks = [], [], []
        for _ in range(3):
            out = subprocess.run([sys.executable, "-c", RESCAN_CHILD.format(repo=repo, root=str(big_root))],
                                 check=True, capture_output=True, text=True).stdout.split()
            rescan_times.append(float(out[0]))
            peaks.append(int(out[1]) / 1024)
            out = subprocess.run([sys.executable, "-c", REOPEN_CHILD.format(repo=repo, root=str(big_root))],
                                 check=True, capture_output=True, text=True).stdout.split()
            reopen_times.append(float(out[0]))
            assert int(out[1]) >= n_big, out
        reopen, rescan = statistics.median(reopen_times), statistics.median(rescan_times)
        reopen_ratio = reopen / rescan
        peak = max(peaks)
        print(f"{'reopen vs full rescan':<34} reopen {reopen * 1000:9.1f} ms   rescan {rescan * 1000:9.1f} ms   "
              f"ratio {reopen_ratio:.4f}x")
        print(f"{'peak RSS of the rescan process':<34} {peak:.0f} MB")
        print()
        print("summary")
        print(f"  live append   {live:5.2f}x of the bare fdatasync loop   (goal >= 0.4)  {'ok' if live >= 0.4 else 'MISSED'}")
        print(f"  bulk append   {bulk:5.2f}x of the bare write loop       (goal >= 0.3)  {'ok' if bulk >= 0.3 else 'MISSED'}")
        print(f"  reopen        {reopen_ratio:.4f}x of a full rescan        (goal <= 0.01) {'ok' if reopen_ratio <= 0.01 else 'MISSED'}")
        print(f"  rescan peak   {peak:.0f} MB                             (goal <= 150)  {'ok' if peak <= 150 else 'MISSED'}")
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
