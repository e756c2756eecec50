"""Benchmark of the redaction engine over realistic agent text, side by side with baselines in
the same run, reported as ratios; and, when detect-secrets is installed, the same text through
its plugins, for the comparison in docs/redaction.md ("Why this detector").

    python bench/bench_redact.py            # about 8 MB of events, 5 repetitions
    python bench/bench_redact.py --quick    # about 2 MB, 3 repetitions

The text is real, read from this machine: prose (the METADATA of installed packages and this
repository's docs), code (this repository's and the standard library's sources), diffs and
command output (this repository's git history), JSON (package data files). It is cut into
memstore events of realistic sizes (most 300-1,000 bytes, some command outputs of many KB):
agent messages, command executions, file changes with diffs, tool calls with JSON arguments.
A second copy gets one secret event of the test corpus about every 50 KB.

Measured per pass over every event:
- ``encode``: ``str.encode`` of each event's text (the cheapest pass that touches every byte);
- ``orjson``: ``orjson.dumps`` of each event (what writing a log line costs);
- ``one regex``: a single trivial regex search (``AKIA[0-9A-Z]{16}``) over each text;
- ``contains``/``redact_text``: the redactor over each event's text;
- ``redact_value``: the redactor over each event as a JSON value.
Timings alternate between the sides; each figure is the median of the repetitions, in this
process's CPU time (steadier than wall time on a shared machine).

    python bench/bench_redact.py --store [--sessions N] [--scale F] [--reps R]

measures what redaction costs a store instead: ``import_logs`` of a generated archive of Codex
CLI and Claude Code logs (``bench/archive.py``: realistic sizes, text and tool output, no secret
planted) into a fresh store, then the catalog build (``refresh_catalog``), for three stores side
by side: redaction off (``[redact] enabled = false``, the baseline), the default (index-time:
every search chunk, event detail, memory view and catalog row redacted), and ``at_write = true``
(each event redacted before it is logged, too). Ratios are to the baseline (goal for import:
at most 1.5x). Each repetition imports into fresh stores, alternating the three sides; figures
are medians of wall time and of this process's CPU time (every thread: the deriver included).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import random
import re
import statistics
import subprocess
import sys
import sysconfig
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from memstore import events as ev  # noqa: E402
from memstore.redact import Redactor  # noqa: E402

CORPUS = ROOT / "tests" / "fixtures" / "secrets" / "corpus.jsonl"


def _read(paths: list[str], limit: int) -> str:
    out, size = [], 0
    for path in paths:
        try:
            text = Path(path).read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        out.append(text)
        size += len(text)
        if size >= limit:
            break
    return "\n".join(out)


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def _pieces(
    text: str, rng: random.Random, small: tuple[int, int], large: tuple[int, int], large_share: float
) -> list[str]:
    out, i = [], 0
    while i < len(text):
        lo, hi = large if rng.random() < large_share else small
        n = rng.randint(lo, hi)
        out.append(text[i : i + n])
        i += n
    return [p for p in out if p.strip()]


def agent_events(target_bytes: int, seed: int = 7) -> list[dict]:
    """Events cut from real text on this machine, shuffled, about ``target_bytes`` of text."""
    rng = random.Random(seed)
    stdlib = sysconfig.get_paths()["stdlib"]
    site = sysconfig.get_paths()["purelib"]
    per_kind = target_bytes // 4 + 1
    # detect-secrets' own docs are full of example secrets, and present only when it is installed.
    prose = _read(
        sorted(p for p in glob.glob(f"{site}/*.dist-info/METADATA") if "detect_secrets" not in p)
        + [str(ROOT / "README.md"), str(ROOT / "RELIABILITY.md")],
        per_kind,
    )
    code = _read(
        sorted(glob.glob(str(ROOT / "memstore" / "**" / "*.py"), recursive=True)) + sorted(glob.glob(f"{stdlib}/*.py")),
        per_kind,
    )
    # The redaction work itself (its corpus, tests and docs) is full of fake secrets: left out.
    history = _git(
        "log",
        "-p",
        "--stat",
        "-n",
        "400",
        "--",
        ".",
        ":(exclude)tests/fixtures/secrets",
        ":(exclude)tests/redact",
        ":(exclude)memstore/redact.py",
        ":(exclude)bench/bench_redact.py",
        ":(exclude)docs/redaction.md",
    )[:per_kind]
    data = _read(
        sorted(p for p in glob.glob(f"{site}/**/*.json", recursive=True) if os.path.getsize(p) < 200_000), per_kind
    )
    made: list[dict] = []
    for i, piece in enumerate(_pieces(prose, rng, (300, 1000), (2000, 6000), 0.05)):
        made.append({"type": "item.completed", "item": {"id": f"m{i}", "type": "agent_message", "text": piece}})
    for i, piece in enumerate(_pieces(code, rng, (300, 1000), (4000, 20000), 0.15)):
        made.append(
            {
                "type": "item.completed",
                "item": {
                    "id": f"c{i}",
                    "type": "command_execution",
                    "command": f"sed -n '{i},{i + 80}p' src/module_{i % 17}.py",
                    "aggregated_output": piece,
                    "status": "completed",
                    "exit_code": 0,
                },
            }
        )
    for i, piece in enumerate(_pieces(history, rng, (300, 1000), (3000, 12000), 0.2)):
        made.append(
            {
                "type": "item.completed",
                "item": {
                    "id": f"d{i}",
                    "type": "file_change",
                    "status": "completed",
                    "changes": [{"path": f"src/module_{i % 17}.py", "kind": "update"}],
                    "unified_diff": piece,
                },
            }
        )
    for i, piece in enumerate(_pieces(data, rng, (300, 1000), (2000, 8000), 0.1)):
        made.append(
            {
                "type": "item.completed",
                "item": {
                    "id": f"t{i}",
                    "type": "tool_call",
                    "tool_name": "Read",
                    "arguments": {"file_path": f"/home/dev/app/data/{i}.json", "limit": 200},
                    "output": piece,
                    "status": "completed",
                },
            }
        )
    rng.shuffle(made)
    return made


def with_secrets(events: list[dict], every_bytes: int = 50_000, seed: int = 11) -> tuple[list[dict], int]:
    """``events`` with one corpus event inserted about every ``every_bytes`` of text."""
    rng = random.Random(seed)
    corpus = [e for line in CORPUS.read_text().splitlines() for e in json.loads(line)["events"]]
    out, since, inserted = [], 0, 0
    for event in events:
        out.append(event)
        since += len(_text(event))
        if since >= every_bytes:
            out.append(rng.choice(corpus))
            since, inserted = 0, inserted + 1
    return out, inserted


def _text(event: dict) -> str:
    found = ev.event_text(event)
    return found[1] if found else ""


def _cpu(fn: Callable[[], Any]) -> float:
    start = time.process_time()
    fn()
    return time.process_time() - start


def measure(sides: dict[str, Callable[[], Any]], reps: int) -> dict[str, float]:
    """Median CPU seconds of each side, the sides alternating within each repetition."""
    times: dict[str, list[float]] = {name: [] for name in sides}
    for _ in range(reps):
        for name, fn in sides.items():
            times[name].append(_cpu(fn))
    return {name: statistics.median(values) for name, values in times.items()}


def run_engine(label: str, events: list[dict], reps: int) -> None:
    texts = [_text(e) for e in events]
    total = sum(len(t.encode()) for t in texts) / 1e6
    lines = [orjson.dumps(e).decode() for e in events]
    line_mb = sum(len(line) for line in lines) / 1e6
    redactor = Redactor()
    one = re.compile(r"AKIA[0-9A-Z]{16}")
    sides: dict[str, Callable[[], Any]] = {
        "encode": lambda: [t.encode() for t in texts],
        "orjson": lambda: [orjson.dumps(e) for e in events],
        "one regex": lambda: [one.search(t) for t in texts],
        "contains_secret": lambda: [redactor.contains_secret(t) for t in texts],
        "redact_text": lambda: [redactor.redact_text(t) for t in texts],
        "redact_text (JSON lines)": lambda: [redactor.redact_text(line) for line in lines],
        "redact_value": lambda: [redactor.redact_value(e) for e in events],
    }
    result = measure(sides, reps)
    found = sum(len(redactor.findings(t)) for t in texts)
    print(
        f"\n## {label}: {len(events)} events, {total:.2f} MB of text ({line_mb:.2f} MB as JSON lines), {found} findings"
    )
    print(f"{'pass':28} {'CPU s':>8} {'MB/s':>9} {'vs encode':>10} {'vs orjson':>10} {'vs one regex':>12}")
    for name, seconds in result.items():
        mb = line_mb if name in ("orjson", "redact_text (JSON lines)", "redact_value") else total
        print(
            f"{name:28} {seconds:8.3f} {mb / seconds:9.1f} {seconds / result['encode']:9.1f}x "
            f"{seconds / result['orjson']:9.2f}x {seconds / result['one regex']:11.2f}x"
        )


def _corpus_coverage(scan: Callable[[str], list[str]]) -> tuple[int, int, int, dict[str, int]]:
    """How many corpus secrets replacing every value ``scan`` reports removes whole, removes
    in part, and misses (by kind)."""
    removed = partial = missed = 0
    kinds_missed: dict[str, int] = {}
    for line in CORPUS.read_text().splitlines():
        entry = json.loads(line)
        text = "\n".join(_text(e) for e in entry["events"])
        reported = sorted({r for r in scan(text) if r}, key=len, reverse=True)
        scrubbed = text
        for r in reported:
            scrubbed = scrubbed.replace(r, "*")
        for secret in entry["secrets"]:
            value = secret["value"]
            if value not in text:
                continue
            if value not in scrubbed:
                removed += 1
            elif scrubbed != text and any(r in value for r in reported):
                partial += 1
            else:
                missed += 1
                kinds_missed[secret["kind"]] = kinds_missed.get(secret["kind"], 0) + 1
    return removed, partial, missed, dict(sorted(kinds_missed.items()))


def run_detect_secrets(clean: list[dict], budget_bytes: int) -> None:
    """detect-secrets 1.5 over the same text (its ad-hoc ``scan_line``, with and without its
    entropy plugins): speed, reports on text without secrets, and what replacing its reported
    values leaves of the corpus secrets. memstore.redact on the same lines beside it."""
    code = "import detect_secrets.core.scan, detect_secrets.settings"
    if subprocess.run([sys.executable, "-c", code], capture_output=True).returncode != 0:
        print("\n## detect-secrets: not installed (pip install detect-secrets==1.5.0 to compare)")
        return
    timed = "import time; t = time.perf_counter(); {}; print(time.perf_counter() - t)"
    with_import = float(
        subprocess.run([sys.executable, "-c", timed.format(code)], check=True, capture_output=True, text=True).stdout
    )
    ours_import = float(
        subprocess.run(
            [sys.executable, "-c", "import memstore; " + timed.format("import memstore.redact as r; r._scanner()")],
            check=True,
            capture_output=True,
            text=True,
            cwd=ROOT,
        ).stdout
    )
    from detect_secrets.core.plugins.util import get_mapping_from_secret_type_to_class
    from detect_secrets.core.scan import scan_line
    from detect_secrets.settings import transient_settings

    text = "\n".join(_text(e) for e in clean)[:budget_bytes]
    lines = text.splitlines()
    size = len(text.encode()) / 1e6
    mapping: dict[str, type] = get_mapping_from_secret_type_to_class()
    names = [plugin.__name__ for plugin in mapping.values()]
    print(f"\n## detect-secrets 1.5 and memstore.redact, line by line over {size:.2f} MB of the text without secrets")
    print(
        f"import: detect-secrets {with_import:.2f} s (it imports requests), "
        f"memstore.redact with its regex compiled {ours_import:.3f} s"
    )
    print(f"{'detector':44} {'MB/s':>8} {'reports':>8}   corpus secrets: removed / partly / missed (missed kinds)")
    for label, plugins in (
        ("detect-secrets, all plugins", names),
        ("detect-secrets, no entropy plugins", [n for n in names if "HighEntropy" not in n]),
    ):
        with transient_settings({"plugins_used": [{"name": n} for n in plugins]}):
            start = time.process_time()
            reports = sum(1 for line in lines for _ in scan_line(line))
            seconds = time.process_time() - start
            coverage = _corpus_coverage(
                lambda t: [s.secret_value or "" for ln in t.splitlines() for s in scan_line(ln)]
            )
        print(
            f"{label:44} {size / seconds:8.3f} {reports:8d}   {coverage[0]} / {coverage[1]} / {coverage[2]} {coverage[3]}"
        )
    redactor = Redactor()
    start = time.process_time()
    reports = sum(len(redactor.findings(line)) for line in lines)
    seconds = time.process_time() - start
    coverage = _corpus_coverage(lambda t: [t[f.start : f.end] for f in redactor.findings(t)])
    print(
        f"{'memstore.redact':44} {size / seconds:8.3f} {reports:8d}   {coverage[0]} / {coverage[1]} / {coverage[2]} {coverage[3]}"
    )


STORE_SIDES = {
    "off": "[redact]\nenabled = false\n",
    "default": None,
    "at_write": "[redact]\nat_write = true\n",
}


def _store_pass(archive: Path, root: Path, config: Any) -> tuple[float, float, float, float]:
    """Import ``archive`` into a new store at ``root`` and build its catalog: ``(import wall,
    import CPU, catalog wall, catalog CPU)`` in seconds."""
    import memstore

    root.mkdir(parents=True)
    if config is not None:
        (root / "config.toml").write_text(config)
    wall, cpu = time.perf_counter(), time.process_time()
    report = memstore.import_logs(
        root, [archive / ".claude" / "projects", archive / ".codex" / "sessions"], settle_seconds=0
    )
    import_wall, import_cpu = time.perf_counter() - wall, time.process_time() - cpu
    if report.problems and not report.sessions:
        raise SystemExit(f"the import failed: {report.problems[:3]}")
    wall, cpu = time.perf_counter(), time.process_time()
    memstore.refresh_catalog(root)
    return import_wall, import_cpu, time.perf_counter() - wall, time.process_time() - cpu


def run_store(sessions: int, scale: float, reps: int) -> None:
    """The store benchmark (see the module docstring)."""
    import shutil
    import tempfile

    sys.path.insert(0, str(ROOT / "bench"))
    from archive import generate

    work = Path(tempfile.mkdtemp(prefix="bench-redact-store-"))
    try:
        summary = generate(work / "archive", sessions, seed=5, scale=scale)
        print(
            f"archive: {summary.sessions} sessions, {summary.files} files, {summary.bytes / 1e6:.1f} MB, "
            f"{summary.lines} lines; {reps} repetitions, fresh stores, sides alternating"
        )
        figures: dict[str, list[tuple[float, float, float, float]]] = {side: [] for side in STORE_SIDES}
        for rep in range(reps):
            order = list(STORE_SIDES) if rep % 2 == 0 else list(reversed(STORE_SIDES))
            for side in order:
                root = work / f"store-{rep}-{side}"
                figures[side].append(_store_pass(work / "archive", root, STORE_SIDES[side]))
                shutil.rmtree(root)
        medians = {side: [statistics.median(f[i] for f in runs) for i in range(4)] for side, runs in figures.items()}
        base = medians["off"]
        print(
            f"{'store':10} {'import wall':>12} {'import CPU':>11} {'catalog wall':>13} {'catalog CPU':>12}"
            f"   ratios to off (import wall / CPU, catalog wall / CPU)"
        )
        for side, m in medians.items():
            ratios = " / ".join(f"{m[i] / base[i]:.2f}x" for i in range(4))
            print(f"{side:10} {m[0]:11.2f}s {m[1]:10.2f}s {m[2]:12.2f}s {m[3]:11.2f}s   {ratios}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="about 2 MB and 3 repetitions")
    parser.add_argument("--store", action="store_true", help="import and catalog build with and without redaction")
    parser.add_argument("--sessions", type=int, default=120, help="archive sessions (--store)")
    parser.add_argument("--scale", type=float, default=0.5, help="archive size factor (--store)")
    parser.add_argument("--reps", type=int, default=3, help="repetitions (--store)")
    args = parser.parse_args()
    if args.store:
        run_store(args.sessions, args.scale, args.reps)
        return
    size, reps = (2_000_000, 3) if args.quick else (8_000_000, 5)
    events = agent_events(size)
    run_engine("realistic agent text, no secret", events, reps)
    mixed, inserted = with_secrets(events)
    run_engine(f"the same with {inserted} secret events (about one per 50 KB)", mixed, reps)
    run_detect_secrets(events, 200_000 if args.quick else 500_000)


if __name__ == "__main__":
    main()
