"""Start-up cost: what an agent hook pays per call.

    python bench/bench_startup.py [--runs 15]

- ``import memstore`` against ``import sqlite3, orjson, click``, each timed inside a fresh
  interpreter around the import statement (goal: at most 2.5x);
- ``memstore append SESSION`` of one event, as a hook runs it (a whole process, wall time), on a
  session that exists and on a new session each time (its index made from the cached empty
  index; the first run of a schema builds that cache, before the timed runs), against
  ``sqlite-utils --help`` and a bare ``python -c pass`` (goal: about as fast as sqlite-utils).

Runs alternate between the sides; medians are reported, with the ratio memstore / baseline.

memstore's bytecode is compiled first, as ``pip install`` compiles it: the baselines are
installed packages with their bytecode, and in an environment with ``PYTHONDONTWRITEBYTECODE``
set a checkout would otherwise be compiled from source on every run (most of the time measured).
"""

from __future__ import annotations

import argparse
import compileall
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def _import_ms(statement: str) -> float:
    code = f"import time; t = time.perf_counter(); {statement}; print((time.perf_counter() - t) * 1000)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=ENV)
    return float(out.stdout)


def _wall_ms(argv: list[str], stdin: bytes = b"") -> float:
    started = time.perf_counter()
    subprocess.run(argv, input=stdin, capture_output=True, check=True, env=ENV)
    return (time.perf_counter() - started) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()

    compileall.compile_dir(str(ROOT / "memstore"), quiet=1)
    imports: dict[str, list[float]] = {"memstore": [], "baseline": []}
    for _ in range(args.runs):
        imports["memstore"].append(_import_ms("import memstore"))
        imports["baseline"].append(_import_ms("import sqlite3, orjson, click"))
    m, b = statistics.median(imports["memstore"]), statistics.median(imports["baseline"])
    print(f"import memstore             {m:7.1f} ms")
    print(f"import sqlite3, orjson, click {b:5.1f} ms")
    print(f"  ratio {m / b:.2f}x  (goal <= 2.5x)")
    print(f"  load average: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")

    sqlite_utils = shutil.which("sqlite-utils") or str(Path(sys.executable).with_name("sqlite-utils"))
    store = tempfile.mkdtemp(prefix="memstore-startup-")
    try:
        event = b'{"type": "item.completed", "item": {"type": "agent_message", "text": "ran the tests"}}\n'
        append = [sys.executable, "-m", "memstore", "append", "hook-session", "--root", store]
        subprocess.run(append, input=event, capture_output=True, check=True, env=ENV)  # the session exists
        walls: dict[str, list[float]] = {"append": [], "new": [], "sqlite-utils": [], "python": []}
        for run in range(args.runs):
            walls["append"].append(_wall_ms(append, event))
            new = [sys.executable, "-m", "memstore", "append", f"new-session-{run}", "--root", store]
            walls["new"].append(_wall_ms(new, event))
            walls["sqlite-utils"].append(_wall_ms([sqlite_utils, "--help"]))
            walls["python"].append(_wall_ms([sys.executable, "-c", "pass"]))
        a, n, s, p = (statistics.median(walls[k]) for k in ("append", "new", "sqlite-utils", "python"))
        print(f"memstore append (1 event)   {a:7.1f} ms   ratio to sqlite-utils {a / s:.2f}x, to python {a / p:.2f}x")
        print(f"  to a new session          {n:7.1f} ms   ratio to sqlite-utils {n / s:.2f}x, to python {n / p:.2f}x")
        print(f"sqlite-utils --help         {s:7.1f} ms")
        print(f"python -c pass              {p:7.1f} ms")
        print(f"  load average: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    finally:
        shutil.rmtree(store, ignore_errors=True)


if __name__ == "__main__":
    main()
