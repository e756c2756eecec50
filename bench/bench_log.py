"""Benchmarks of the write path, each measured side by side with its floor in one run.

    python bench/bench_log.py            # everything (the 1M-event reopen and rescans take minutes)
    python bench/bench_log.py --quick    # smaller sizes, for a smoke run

Events are shaped like an agent's: most are 300-1,000 bytes (messages, reasoning, tool calls
and their results, turn markers), a minority are command outputs and diffs of many KB. Every
comparison alternates the two sides and reports the median of the repetitions (this machine is
shared and noisy). Ratios are floor time / memstore time (1.0 = as fast as the floor), except
where a line says otherwise.

- live append (``durability="turn"``) vs a bare loop that serializes the same envelopes, writes
  each turn with one ``write()`` and fdatasyncs it (goal >= 0.5);
- bulk append (``durability="none"``) vs a bare serialize-and-write loop synced once at the end,
  on the realistic mix (goal >= 0.3) and on 300-byte events (goal >= 0.2);
- bulk append with the default cap (10,000 events) vs uncapped (goal >= 0.7); and, in bulk and in
  live mode, the longest single append under the cap against the longest pause of a bare loop
  that caps its file the only way one file allows (copy the newest 90%, fdatasync, rename,
  directory sync): its longest rewrite, or in live mode a turn's sync the disk stalled longer,
  run for run (goal: at most 1.5x);
- rescan (``rebuild``) vs a bare readline + ``orjson.loads`` loop over the same log (goal >= 0.3),
  with the peak RSS of the rescanning process at two log sizes (goal: flat);
- reopen of a 1,000,000-event session vs its full rescan (goal <= 0.01);
- ``rebuild --all`` over 1,000 small sessions: fixed cost per session, measured against rebuilding
  the same events as one session (goal <= 1 ms).
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
from typing import Optional

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import memstore  # noqa: E402
from memstore.events import SCHEMA_VERSION, utc_now  # noqa: E402


def _vocabulary(size: int = 6_000, seed: int = 3) -> tuple[list[str], list[float]]:
    """``size`` distinct made-up words (2-12 letters, short ones the most frequent) and their
    cumulative Zipf weights (s = 1.07, as natural text): a realistic vocabulary, where a few
    words are everywhere and most are rare."""
    rng = random.Random(seed)
    letters = "etaoinshrdlcumwfgypbvkjxqz"
    weights = [1 / (i + 1) for i in range(len(letters))]
    words: set[str] = set()
    ordered: list[str] = []
    while len(ordered) < size:
        length = min(12, 2 + int(rng.expovariate(0.35)))
        word = "".join(rng.choices(letters, weights, k=length))
        if word not in words:
            words.add(word)
            ordered.append(word)
    ordered.sort(key=len)  # rank 1 is among the shortest, as in real text
    cumulative, total = [], 0.0
    for rank in range(1, size + 1):
        total += 1 / rank**1.07
        cumulative.append(total)
    return ordered, cumulative


VOCABULARY, _CUMULATIVE = _vocabulary()
# Words an agent's text is full of, mixed in with the vocabulary.
CODE_WORDS = (
    "cargo test build error warning file src main lib mod fn struct impl trait pub use let mut self "
    "return match some none ok err vec string option result"
).split()


def words(rng: random.Random, n: int) -> list[str]:
    """``n`` words of realistic text: mostly from the Zipf vocabulary, a fifth code words."""
    picked = rng.choices(VOCABULARY, cum_weights=_CUMULATIVE, k=n)
    for i in range(0, n, 5):
        picked[i] = rng.choice(CODE_WORDS)
    return picked


def realistic_turns(n_turns: int, seed: int = 7) -> list[list[dict]]:
    """Turns of an agent at work: a prompt, reasoning, tool calls with results, messages, now and
    then a command with kilobytes of output or a diff. Mean event size is about 700 bytes."""
    rng = random.Random(seed)

    def text(lo: int, hi: int) -> str:
        size = rng.randint(lo, hi)
        out: list[str] = []
        length = 0
        while length < size:
            batch = words(rng, 16)
            out.extend(batch)
            length += sum(len(w) + 1 for w in batch)
        return " ".join(out)[:size]

    def output(lo: int, hi: int) -> str:
        size = rng.randint(lo, hi)
        lines = []
        length = 0
        while length < size:
            line = f"{rng.choice(CODE_WORDS)}: {text(30, 90)} at src/{words(rng, 1)[0]}.rs:{rng.randint(1, 900)}"
            lines.append(line)
            length += len(line) + 1
        return "\n".join(lines)

    turns = []
    for t in range(n_turns):
        events = [
            {"type": "turn.started"},
            {"type": "item.completed", "item": {"id": f"u{t}", "type": "user_message", "text": text(60, 400)}},
            {"type": "item.completed", "item": {"id": f"r{t}", "type": "reasoning", "text": text(300, 1000)}},
        ]
        for c in range(rng.randint(2, 4)):
            call = f"t{t}_{c}"
            events.append(
                {
                    "type": "item.completed",
                    "item": {
                        "id": call,
                        "type": "tool_invocation",
                        "tool_name": rng.choice(["read_file", "grep", "list_files"]),
                        "arguments": {"path": f"src/{words(rng, 1)[0]}.rs", "pattern": text(10, 40)},
                        "status": "completed",
                        "outcome": "success",
                    },
                }
            )
            events.append(
                {
                    "type": "item.completed",
                    "item": {
                        "id": f"{call}:out",
                        "type": "tool_output",
                        "call_id": call,
                        "output": output(200, 1200),
                        "status": "completed",
                    },
                }
            )
        if rng.random() < 0.35:
            events.append(
                {
                    "type": "item.completed",
                    "item": {
                        "id": f"cmd{t}",
                        "type": "command_execution",
                        "command": f"cargo {rng.choice(CODE_WORDS)}",
                        "aggregated_output": output(1500, 8000),
                        "exit_code": rng.choice([0, 0, 1]),
                        "status": "completed",
                    },
                }
            )
        if rng.random() < 0.3:
            events.append(
                {
                    "type": "item.completed",
                    "item": {
                        "id": f"fc{t}",
                        "type": "file_change",
                        "changes": [{"path": "src/lib.rs", "kind": "update"}],
                        "status": "completed",
                        "unified_diff": output(400, 2500),
                    },
                }
            )
        events.append(
            {"type": "item.completed", "item": {"id": f"m{t}", "type": "agent_message", "text": text(100, 800)}}
        )
        events.append(
            {
                "type": "turn.completed",
                "usage": {
                    "input_tokens": rng.randint(1000, 90000),
                    "cached_input_tokens": rng.randint(0, 900),
                    "cache_creation_tokens": 0,
                    "output_tokens": rng.randint(100, 900),
                },
            }
        )
        turns.append(events)
    return turns


def small_turns(n_events: int, seed: int = 13) -> list[list[dict]]:
    """Turns of about 300-byte events (envelope included): short messages of realistic text."""
    rng = random.Random(seed)
    turns, count, t = [], 0, 0
    while count < n_events:
        t += 1
        events = [{"type": "turn.started"}]
        for i in range(8):
            text = " ".join(words(rng, 40))[:190]
            events.append({"type": "item.completed", "item": {"id": f"{t}-{i}", "type": "agent_message", "text": text}})
        events.append({"type": "turn.completed", "usage": {"input_tokens": 10, "output_tokens": 2}})
        turns.append(events)
        count += len(events)
    return turns


def envelope(seq: int, event: dict) -> bytes:
    return orjson.dumps(
        {"schema_version": SCHEMA_VERSION, "seq": seq, "ts": utc_now(), "event": event},
        option=orjson.OPT_APPEND_NEWLINE,
    )


def run_memstore(root: Path, turns: list[list[dict]], durability: str, max_events: int = 0) -> float:
    start = time.perf_counter()
    log = memstore.open_session(root, "bench", max_events=max_events, durability=durability)
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
            chunk += envelope(seq, event)
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
                fh.write(envelope(seq, event))
        fh.flush()
        os.fsync(fh.fileno())
    return time.perf_counter() - start


INDEX_DDL = (
    "CREATE TABLE events (seq INTEGER PRIMARY KEY, offset INTEGER, length INTEGER, turn INTEGER, ts TEXT, type TEXT)"
)


def run_design_floor_bulk(path: Path, turns: list[list[dict]]) -> float:
    """The least any store of this design does per event: the bare bulk loop plus one index row
    (seq, offset, length, turn, ts, type) per event, committed to SQLite in batches."""
    import sqlite3

    start = time.perf_counter()
    db = sqlite3.connect(path.with_suffix(".db"), isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")
    db.execute(INDEX_DDL)
    seq = offset = 0
    rows = []
    with open(path, "ab") as fh:
        for number, events in enumerate(turns, start=1):
            for event in events:
                seq += 1
                line = envelope(seq, event)
                fh.write(line)
                rows.append((seq, offset, len(line), number, "", event["type"]))
                offset += len(line)
            if len(rows) >= 2_000:
                db.execute("BEGIN")
                db.executemany("INSERT INTO events VALUES (?, ?, ?, ?, ?, ?)", rows)
                db.execute("COMMIT")
                rows = []
        db.execute("BEGIN")
        db.executemany("INSERT INTO events VALUES (?, ?, ?, ?, ?, ?)", rows)
        db.execute("COMMIT")
        fh.flush()
        os.fsync(fh.fileno())
    db.close()
    return time.perf_counter() - start


def run_bare_capped(
    path: Path,
    turns: list[list[dict]],
    cap: int,
    stalls: Optional[list] = None,
    *,
    sync_per_turn: bool = False,
    pauses: Optional[list] = None,
) -> float:
    """The bare bulk loop (with ``sync_per_turn``, the live one: one write and one fdatasync per
    turn) with a cap done the only way one file allows: past ``cap`` lines, the newest 90% are
    copied into a new file, synced and renamed over the log, and the directory synced
    (memstore's headroom). Appends the time of each rewrite to ``stalls``, and the time of each
    turn (its writes, its sync, its rewrite if it made one) to ``pauses``: the bare loop's
    counterpart of an append's latency."""
    start = time.perf_counter()
    seq = 0
    ends: list[int] = []  # the end offset of every line in the file
    cut_base = 0
    fh = open(path, "ab")
    for events in turns:
        turn_start = time.perf_counter()
        for event in events:
            seq += 1
            line = envelope(seq, event)
            fh.write(line)
            ends.append((ends[-1] if ends else 0) + len(line))
        if sync_per_turn:
            fh.flush()
            os.fdatasync(fh.fileno())
        if len(ends) > cap:
            t0 = time.perf_counter()
            fh.flush()
            drop = len(ends) - (cap - cap // 10)
            cut = ends[drop - 1] - cut_base
            with open(path, "rb") as old:
                old.seek(cut)
                data = old.read()
            tmp = path.with_suffix(".tmp")
            with open(tmp, "wb") as new:
                new.write(data)
                new.flush()
                os.fdatasync(new.fileno())
            os.replace(tmp, path)
            dir_fd = os.open(path.parent, os.O_RDONLY)
            os.fsync(dir_fd)
            os.close(dir_fd)
            fh.close()
            fh = open(path, "ab")
            cut_base += cut
            del ends[:drop]
            if stalls is not None:
                stalls.append(time.perf_counter() - t0)
        if pauses is not None:
            pauses.append(time.perf_counter() - turn_start)
    fh.flush()
    os.fsync(fh.fileno())
    fh.close()
    return time.perf_counter() - start


def fresh_dir(base: Path) -> Path:
    return Path(tempfile.mkdtemp(dir=base))


def compare(name: str, ours, floor, reps: int, base: Path, goal: str) -> float:
    ours_times, floor_times = [], []
    for _ in range(reps):
        for side, times in ((floor, floor_times), (ours, ours_times)):
            work = fresh_dir(base)
            times.append(side(work))
            # Each side starts with the page cache as clean as the other's.
            shutil.rmtree(work)
            os.sync()
    o, f = statistics.median(ours_times), statistics.median(floor_times)
    ratio = f / o
    print(f"{name:<44} memstore {o * 1000:9.1f} ms   floor {f * 1000:9.1f} ms   ratio {ratio:5.2f}x   {goal}")
    return ratio


def cap_latency(base: Path, turns: list[list[dict]], durability: str) -> tuple[list[float], list[float]]:
    """Append with the default cap, timing every append: (latencies in s, those of the appends
    that rewrote the log: after which it holds fewer events than before)."""
    root = fresh_dir(base)
    latencies, rewrites = [], []
    log = memstore.open_session(root, "bench", durability=durability)
    for events in turns:
        for event in events:
            before = log.event_count
            t0 = time.perf_counter()
            log.append(event)
            elapsed = time.perf_counter() - t0
            latencies.append(elapsed)
            if log.event_count <= before:
                rewrites.append(elapsed)
    log.close()
    shutil.rmtree(root)
    os.sync()
    return latencies, rewrites


def compare_cap_latency(name: str, base: Path, turns: list[list[dict]], durability: str, reps: int) -> dict:
    """Under the default cap, memstore's longest append against the bare loop's longest pause
    (a turn's writes and sync, or a rewrite: its copy, sync, rename and directory sync; see
    :func:`run_bare_capped`), run for run, the two sides alternating. Either side's longest may
    be a sync the shared disk stalled rather than a rewrite: both count all they wait for.
    Reported: the median over runs of each run's longest, and the median of all rewrites (the
    appends that rewrote the log, on memstore's side)."""
    ours_max, floor_max, ours_rewrites, floor_rewrites, p99s = [], [], [], [], []
    rewrites = 0
    for _ in range(reps):
        stalls: list[float] = []
        pauses: list[float] = []
        work = fresh_dir(base)
        run_bare_capped(work / "events.jsonl", turns, 10_000, stalls, sync_per_turn=durability != "none", pauses=pauses)
        shutil.rmtree(work)
        os.sync()
        floor_max.append(max(pauses))
        floor_rewrites.extend(stalls)
        latencies, rewrite_times = cap_latency(base, turns, durability)
        latencies.sort()
        ours_max.append(latencies[-1])
        ours_rewrites.extend(rewrite_times)
        rewrites = len(rewrite_times)
        p99s.append(latencies[int(len(latencies) * 0.99)])
    figures = {
        "max": statistics.median(ours_max) * 1000,
        "floor_max": statistics.median(floor_max) * 1000,
        "rewrite": statistics.median(ours_rewrites) * 1000 if ours_rewrites else 0.0,
        "floor_rewrite": statistics.median(floor_rewrites) * 1000,
        "p99": statistics.median(p99s) * 1000,
        "rewrites": rewrites,
    }
    ratio = figures["max"] / figures["floor_max"]
    print(
        f"{name:<44} longest append {figures['max']:7.2f} ms   floor's longest pause {figures['floor_max']:7.2f} ms"
        f"   cost ratio {ratio:4.2f}x   goal <= 1.5x"
    )
    print(
        f"{'':<44} median rewrite {figures['rewrite']:7.2f} ms   floor {figures['floor_rewrite']:7.2f} ms   "
        f"p99 append {figures['p99']:5.2f} ms   ({figures['rewrites']} rewrites a run, {reps} runs each)"
    )
    figures["ratio"] = ratio
    return figures


def build_big_session(root: Path, n_events: int) -> None:
    """A session of ``n_events`` realistic events, written in bulk."""
    log = memstore.open_session(root, "big", max_events=0, durability="none")
    seed = 0
    while log.event_count < n_events:
        seed += 1
        for events in realistic_turns(200, seed=seed):
            for event in events:
                log.append(event)
                if log.event_count >= n_events:
                    break
            if log.event_count >= n_events:
                break
    log.close()


CHILD = """
import sys, time
sys.path.insert(0, {repo!r})
import orjson, memstore
root, what = {root!r}, {what!r}
start = time.perf_counter()
if what == "floor":
    count = 0
    with open(root + "/sessions/big/events.jsonl", "rb") as fh:
        for line in fh:
            orjson.loads(line)
            count += 1
elif what == "rescan":
    # What an open does when the index is gone: the index rebuilt from the log (search chunks
    # are derived later, off the agent's path).
    log = memstore.open_session(root, "big", max_events=0)
    with log._writer.lock:
        log._writer.recover(force_rescan=True)
    count = log.event_count
    log.close()
elif what == "reopen":
    log = memstore.open_session(root, "big", max_events=0)
    count = log.event_count
    log.close()
# VmHWM, not ru_maxrss: Linux carries the forking parent's peak into a child's ru_maxrss
# across exec, so a child of a large benchmark process would report the parent's size.
elapsed = time.perf_counter() - start
with open("/proc/self/status") as fh:
    peak_kb = next(int(line.split()[1]) for line in fh if line.startswith("VmHWM:"))
print(elapsed, peak_kb, count)
"""


def child(repo: str, root: Path, what: str) -> tuple[float, float, int]:
    out = subprocess.run(
        [sys.executable, "-c", CHILD.format(repo=repo, root=str(root), what=what)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    return float(out[0]), int(out[1]) / 1024, int(out[2])


def rescan_figures(repo: str, base: Path, n_events: int, reps: int) -> dict:
    root = base / f"big-{n_events}"
    build_big_session(root, n_events)
    size = (root / "sessions" / "big" / "events.jsonl").stat().st_size
    floor, rescan, reopen, peak, floor_peak = [], [], [], [], []
    for _ in range(reps):
        seconds, rss, _count = child(repo, root, "floor")
        floor.append(seconds)
        floor_peak.append(rss)
        seconds, rss, count = child(repo, root, "rescan")
        assert count == n_events, count
        rescan.append(seconds)
        peak.append(rss)
        reopen.append(child(repo, root, "reopen")[0])
    shutil.rmtree(root)
    return {
        "events": n_events,
        "mb": size / 1e6,
        "floor": statistics.median(floor),
        "rescan": statistics.median(rescan),
        "reopen": statistics.median(reopen),
        "peak": max(peak),
        "floor_peak": max(floor_peak),
    }


def bare_rebuild(root: Path, durable: bool = False) -> float:
    """The least a rebuild of this design does per session: parse the log, write a fresh SQLite
    index (from a template file's bytes, as memstore does) with one row per event beside the old
    one and rename it into place, replace the manifest. No turns, chunks, catalog or locks.
    Nothing synced, or with ``durable`` the index fdatasynced before its rename (what keeps an
    index whole across a power cut: the least a crash-safe rebuild does)."""
    import sqlite3

    template = root / "template.db"
    template.unlink(missing_ok=True)
    db = sqlite3.connect(template)
    db.execute(INDEX_DDL)
    db.close()
    schema = template.read_bytes()
    start = time.perf_counter()
    for entry in sorted(os.scandir(root / "sessions"), key=lambda e: e.name):
        directory = Path(entry.path)
        rows = []
        offset = 0
        with open(directory / "events.jsonl", "rb") as fh:
            for line in fh:
                record = orjson.loads(line)
                rows.append((record["seq"], offset, len(line), 0, record["ts"], record["event"]["type"]))
                offset += len(line)
        index = directory / "floor.db.tmp"
        index.write_bytes(schema)
        db = sqlite3.connect(index, isolation_level=None)
        db.execute("PRAGMA journal_mode=MEMORY")
        db.execute("PRAGMA synchronous=OFF")
        db.execute("BEGIN")
        db.executemany("INSERT INTO events VALUES (?, ?, ?, ?, ?, ?)", rows)
        db.execute("COMMIT")
        db.close()
        if durable:
            fd = os.open(index, os.O_RDONLY)
            os.fdatasync(fd)
            os.close(fd)
        os.replace(index, directory / "floor.db")
        tmp = directory / "floor-manifest.tmp"
        tmp.write_bytes(orjson.dumps({"event_count": len(rows), "persisted_file_len": offset}))
        os.replace(tmp, directory / "floor-manifest.json")
    return time.perf_counter() - start


def rebuild_all_fixed_cost(base: Path, n_sessions: int, events_each: int) -> dict:
    """The fixed cost per session of ``rebuild`` (every session, then the catalog) and of the
    design floor (:func:`bare_rebuild`, unsynced and durable): (time for the many - time for one
    session holding the same events) / sessions, in ms. The one session is rebuilt the way the
    small ones are (in memory: see ``TUNING.memory_scan_bytes``), so that the difference is
    what each session costs, not the difference between two ways of indexing events."""
    many, one = fresh_dir(base), fresh_dir(base)
    turns = small_turns(events_each)
    for i in range(n_sessions):
        log = memstore.open_session(many, f"s{i:05d}", max_events=0, durability="none")
        for events in turns:
            for event in events:
                log.append(event)
        log.close()
    log = memstore.open_session(one, "all", max_events=0, durability="none")
    for _ in range(n_sessions):
        for events in turns:
            for event in events:
                log.append(event)
    log.close()
    from memstore.session.tuning import TUNING

    timings = {}
    small = TUNING.memory_scan_bytes
    for name, rebuild in (
        ("memstore", memstore.rebuild),
        ("without catalog", lambda r: memstore.rebuild(r, refresh=False)),
        ("2 workers", lambda r: memstore.rebuild(r, jobs=2)),
        ("2 workers without catalog", lambda r: memstore.rebuild(r, refresh=False, jobs=2)),
        ("floor", bare_rebuild),
        ("durable floor", lambda r: bare_rebuild(r, durable=True)),
    ):
        t0 = time.perf_counter()
        rebuild(many)
        t_many = time.perf_counter() - t0
        TUNING.memory_scan_bytes = 1 << 40
        try:
            t0 = time.perf_counter()
            rebuild(one)
            t_one = time.perf_counter() - t0
        finally:
            TUNING.memory_scan_bytes = small
        timings[name] = (t_many - t_one) / n_sessions * 1000
    shutil.rmtree(many)
    shutil.rmtree(one)
    return timings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--only", default=None, help="comma-separated: live,bulk,cap,rescan,rebuild")
    parser.add_argument("--dir", default=None, help="where to put the data (default: a temp dir)")
    args = parser.parse_args()
    only = set(args.only.split(",")) if args.only else {"live", "bulk", "cap", "rescan", "rebuild"}
    quick = args.quick
    base = Path(tempfile.mkdtemp(prefix="memstore-bench-", dir=args.dir))
    repo = str(Path(__file__).resolve().parent.parent)
    summary = []
    try:
        turns = realistic_turns(100 if quick else 400)
        sizes = [len(envelope(1, e)) for t in turns for e in t]
        print(
            f"realistic mix: {len(sizes)} events in {len(turns)} turns, {sum(sizes) / 1e6:.1f} MB, "
            f"median {statistics.median(sizes):.0f} B, mean {statistics.mean(sizes):.0f} B, "
            f"{sum(s > 2000 for s in sizes) / len(sizes):.0%} over 2 KB"
        )
        if "live" in only:
            live = compare(
                "live append (fdatasync per turn)",
                lambda w: run_memstore(w, turns, "turn"),
                lambda w: run_bare_turn(w / "events.jsonl", turns),
                args.reps,
                base,
                "goal >= 0.5",
            )
            summary.append(("live append", f"{live:.2f}x of its floor", live >= 0.5))
        if "bulk" in only:
            # A bulk append is an import: thousands of turns, not a few hundred.
            bulk_turns = realistic_turns(400 if quick else 2_000, seed=5)
            bulk = compare(
                f"bulk append, realistic mix ({sum(len(t) for t in bulk_turns):,} events)",
                lambda w: run_memstore(w, bulk_turns, "none"),
                lambda w: run_bare_bulk(w / "events.jsonl", bulk_turns),
                args.reps,
                base,
                "goal >= 0.3",
            )
            small = small_turns(4_000 if quick else 20_000)
            bulk_small = compare(
                "bulk append, 300-byte events",
                lambda w: run_memstore(w, small, "none"),
                lambda w: run_bare_bulk(w / "events.jsonl", small),
                args.reps,
                base,
                "goal >= 0.2",
            )
            design = compare(
                "  design floor (+ one index row per event)",
                lambda w: run_design_floor_bulk(w / "events.jsonl", bulk_turns),
                lambda w: run_bare_bulk(w / "events.jsonl", bulk_turns),
                args.reps,
                base,
                "the limit of a store that indexes every event",
            )
            design_small = compare(
                "  design floor, 300-byte events",
                lambda w: run_design_floor_bulk(w / "events.jsonl", small),
                lambda w: run_bare_bulk(w / "events.jsonl", small),
                args.reps,
                base,
                "",
            )
            summary.append(
                (
                    "bulk append",
                    (f"{bulk:.2f}x (300 B: {bulk_small:.2f}x); design floor {design:.2f}x ({design_small:.2f}x)"),
                    bulk >= 0.3 and bulk_small >= 0.2,
                )
            )
        if "cap" in only:
            cap_turns = realistic_turns(1_500 if quick else 4_000, seed=11)
            n = sum(len(t) for t in cap_turns)
            capped = compare(
                f"bulk append of {n:,} events, cap 10,000 vs none",
                lambda w: run_memstore(w, cap_turns, "none", max_events=10_000),
                lambda w: run_memstore(w, cap_turns, "none", max_events=0),
                max(3, args.reps - 2),
                base,
                "goal >= 0.7 (floor: uncapped)",
            )
            bulk_latency = compare_cap_latency(
                "bulk append under the cap", base, cap_turns, "none", max(3, args.reps - 2)
            )
            live_turns = realistic_turns(1_000 if quick else 2_600, seed=12)
            live_latency = compare_cap_latency(
                "live append under the cap (fdatasync per turn)", base, live_turns, "turn", max(3, args.reps - 2)
            )
            stalls: list[float] = []
            bare_capped = compare(
                "  design floor: bare loop, cap 10,000 vs none",
                lambda w: run_bare_capped(w / "events.jsonl", cap_turns, 10_000, stalls),
                lambda w: run_bare_bulk(w / "events.jsonl", cap_turns),
                max(3, args.reps - 2),
                base,
                "copying 90% of the log per rewrite",
            )
            worst = max(bulk_latency["ratio"], live_latency["ratio"])
            summary.append(
                (
                    "default cap",
                    (
                        f"{capped:.2f}x of uncapped (design floor {bare_capped:.2f}x); longest append "
                        f"{bulk_latency['ratio']:.2f}x (live {live_latency['ratio']:.2f}x) the floor's longest pause"
                    ),
                    capped >= 0.7 and worst <= 1.5,
                )
            )
        if "rescan" in only:
            sizes_run = [100_000, 200_000] if quick else [250_000, 1_000_000]
            figures = [rescan_figures(repo, base, n, 3) for n in sizes_run]
            for f in figures:
                print(
                    f"{'rescan of ' + format(f['events'], ',') + ' events (' + format(f['mb'], '.0f') + ' MB)':<44} "
                    f"memstore {f['rescan'] * 1000:9.1f} ms   floor {f['floor'] * 1000:9.1f} ms   "
                    f"ratio {f['floor'] / f['rescan']:5.2f}x   peak RSS {f['peak']:.0f} MB (floor {f['floor_peak']:.0f} MB)   goal >= 0.3, flat RSS"
                )
                print(
                    f"{'reopen of the same':<44} reopen {f['reopen'] * 1000:9.1f} ms   "
                    f"rescan {f['rescan'] * 1000:9.1f} ms   ratio {f['reopen'] / f['rescan']:.4f}x   goal <= 0.01"
                )
            last = figures[-1]
            rescan_ratio = last["floor"] / last["rescan"]
            flat = figures[-1]["peak"] <= figures[0]["peak"] * 1.25
            peaks = " / ".join(f"{f['peak']:.0f}" for f in figures)
            summary.append(
                ("rescan", f"{rescan_ratio:.2f}x of its floor, peak RSS {peaks} MB", rescan_ratio >= 0.3 and flat)
            )
            summary.append(
                (
                    "reopen",
                    f"{last['reopen'] / last['rescan']:.4f}x of a rescan",
                    last["reopen"] / last["rescan"] <= 0.01,
                )
            )
        if "rebuild" in only:
            n_sessions = 200 if quick else 1_000
            fixed = rebuild_all_fixed_cost(base, n_sessions, 100)
            print(
                f"{'rebuild --all, ' + format(n_sessions, ',') + ' sessions of 100 events':<44} "
                f"fixed cost per session: memstore {fixed['memstore']:.2f} ms "
                f"({fixed['without catalog']:.2f} ms without the catalog); with 2 worker processes "
                f"{fixed['2 workers']:.2f} ms ({fixed['2 workers without catalog']:.2f} ms without the catalog); "
                f"design floor {fixed['floor']:.2f} ms ({fixed['durable floor']:.2f} ms durable)   goal <= 1 ms"
            )
            summary.append(
                (
                    "rebuild --all",
                    (
                        f"{fixed['memstore']:.2f} ms fixed cost per session, "
                        f"{fixed['without catalog']:.2f} without the catalog; 2 workers "
                        f"{fixed['2 workers']:.2f}, {fixed['2 workers without catalog']:.2f} (design floor "
                        f"{fixed['floor']:.2f} ms, {fixed['durable floor']:.2f} durable)"
                    ),
                    min(fixed["memstore"], fixed["2 workers"]) <= 1.0,
                )
            )
        print()
        print("summary")
        for name, figure, ok in summary:
            print(f"  {name:<16} {figure:<60} {'ok' if ok else 'MISSED'}")
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
