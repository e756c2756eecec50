"""The long reliability run: thousands of SIGKILLs, and the property tests at many more examples.

    python bench/soak.py                    # >= 2,000 SIGKILLs (about half an hour on 2 cores)
    python bench/soak.py --kills 200        # a shorter run
    python bench/soak.py --json out.json    # also write the figures as JSON

Each crash round is the scenario of ``tests/test_crash.py``: a writer in a real subprocess
appends turns (commands with up to 100 KB of output, failed turns) and is SIGKILLed at a random
moment (mid-write, mid-index-commit, mid-manifest-publish, mid-open, mid cap rewrite); the next
writer recovers the session and goes on. After every round of ``--kills-per-round`` kills the
checks run: no acknowledged event is lost, acknowledged seqs never repeat, the log holds only
whole JSON lines with strictly increasing seqs, and the index and manifest equal a rebuild.
The property tests of ``tests/test_log_properties.py`` then run with ``--examples`` examples
each (random streams, every durability policy, drops without close, torn tails, cap rewrites),
and the catalog's incremental-equals-scratch property with a tenth as many (at least 25).

The figures it prints go into RELIABILITY.md.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

import test_crash  # noqa: E402  (the crash scenario and its checks)

SCENARIOS = [
    # (name, durability, max_events, share of the kills)
    ("turn writer, no cap", "turn", 0, 0.4),
    ("event writer, no cap", "event", 0, 0.2),
    ("turn writer, cap 40 (rewrites every few turns)", "turn", 40, 0.25),
    ("bulk writer (durability none), cap 200", "none", 200, 0.15),
]


def crash_soak(kills: int, per_round: int, seed: int) -> list[dict]:
    random.seed(seed)
    results = []
    for name, durability, max_events, share in SCENARIOS:
        total = max(per_round, int(kills * share))
        rounds = (total + per_round - 1) // per_round
        done = failures = 0
        errors = []
        started = time.monotonic()
        for _ in range(rounds):
            work = Path(tempfile.mkdtemp(prefix="memstore-soak-"))
            try:
                if durability == "none":
                    # Bulk mode promises only what flush/close made durable: check that the
                    # log, the index and a rebuild agree after every kill (no acknowledgements).
                    bulk_round(work, max_events, per_round)
                else:
                    test_crash.crash_many_times(work, durability, per_round, max_events=max_events)
            except AssertionError as exc:
                failures += 1
                errors.append(str(exc)[:500])
            finally:
                shutil.rmtree(work, ignore_errors=True)
            done += per_round
        results.append(
            {
                "scenario": name,
                "kills": done,
                "rounds": rounds,
                "failed_rounds": failures,
                "seconds": round(time.monotonic() - started, 1),
                "errors": errors[:3],
            }
        )
        print(
            f"{name:<50} {done:>5} kills in {rounds:>4} rounds: "
            f"{'ok' if not failures else f'{failures} rounds FAILED'} ({results[-1]['seconds']} s)",
            flush=True,
        )
        for error in errors[:3]:
            print("   ", error)
    return results


BULK_WRITER = test_crash.WRITER.replace('if durability == "turn":', 'if durability in ("turn", "none"):')


def bulk_round(root: Path, max_events: int, kills: int) -> None:
    """Kill a bulk writer ``kills`` times; after each kill the reopened session's index must
    equal a rebuild of its log, which must hold only whole lines with increasing seqs."""
    import memstore

    rng = random.Random()
    store = root / "store"
    for i in range(kills):
        proc = subprocess.Popen(
            [
                sys.executable,
                "-c",
                BULK_WRITER,
                str(store),
                test_crash.SESSION_ID,
                "none",
                str(rng.randrange(2**32)),
                str(max_events),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=test_crash.writer_env(),
        )
        time.sleep(rng.uniform(0.05, 0.3))
        proc.kill()
        proc.wait()
        with memstore.open_session(store, test_crash.SESSION_ID, max_events=max_events) as log:
            seqs = [r.seq for r in log.iter_records()]
        assert all(a < b for a, b in zip(seqs, seqs[1:])), f"bulk kill {i}: seqs not increasing"
        data = (test_crash.session_dir(store) / "events.jsonl").read_bytes()
        assert data == b"" or data.endswith(b"\n"), f"bulk kill {i}: a torn line survived a reopen"
        incremental = test_crash.read_index(store)
        rebuilt = test_crash.rebuild_elsewhere(store, root / f"rebuilt-{i}", with_manifest=True)
        assert incremental["events"] == rebuilt["events"] and incremental["turns"] == rebuilt["turns"], (
            f"bulk kill {i}: the index differs from a rebuild"
        )


def property_soak(examples: int) -> dict:
    # The catalog's property builds whole stores per example: a tenth as many examples.
    catalog_examples = max(25, examples // 10)
    env = dict(
        os.environ, MEMSTORE_PROPERTY_EXAMPLES=str(examples), MEMSTORE_PROPERTY_EXAMPLES_CATALOG=str(catalog_examples)
    )
    started = time.monotonic()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "tests/test_log_properties.py",
            "tests/test_catalog.py::test_incremental_refreshes_equal_a_refresh_from_scratch",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
    )
    last = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else proc.stderr[-500:]
    print(
        f"{'property tests, ' + str(examples) + f' examples each (catalog {catalog_examples})':<50} {last} "
        f"({time.monotonic() - started:.0f} s)"
    )
    return {
        "examples_per_test": examples,
        "catalog_examples": catalog_examples,
        "result": last,
        "passed": proc.returncode == 0,
        "seconds": round(time.monotonic() - started, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kills", type=int, default=2_000, help="SIGKILLs in all (default 2,000)")
    parser.add_argument("--kills-per-round", type=int, default=20)
    parser.add_argument("--examples", type=int, default=1_000, help="examples per property test")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--json", default=None, help="write the figures to this file")
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else random.randrange(2**32)
    print(f"soak: {args.kills} SIGKILLs, seed {seed}")
    crashes = crash_soak(args.kills, args.kills_per_round, seed)
    properties = property_soak(args.examples) if args.examples else None
    summary = {
        "seed": seed,
        "crashes": crashes,
        "properties": properties,
        "ok": all(r["failed_rounds"] == 0 for r in crashes) and (properties is None or properties["passed"]),
    }
    print("all checks passed" if summary["ok"] else "FAILURES: see above")
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=2))
    sys.exit(0 if summary["ok"] else 1)


if __name__ == "__main__":
    main()
