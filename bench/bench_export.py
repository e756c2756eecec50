"""The Parquet export of a 1,000-session store, against writing the same rows with pyarrow.

    python bench/bench_export.py [--sessions 1000] [--repeat 3] [--store DIR]

The store is memstore's demo store at 1,000 sessions (``write_demo_store``: multi-turn coding
sessions of three agents with commands and their output, diffs, tool calls, failures; about
60 events a session), written once (``--store`` keeps it between runs) and its catalog
refreshed before anything is timed.

Measured, alternating, median of the repetitions, each into an empty directory:

- ``memstore export``: :func:`export_parquet` whole (the no-op catalog refresh, the catalog
  read, pricing every turn, redacting every text, one file per session per partition
  written beside and renamed, the filesystem synced, the manifest);
- ``memstore, no sync``: the same with ``durable=False`` (what the sync costs);
- ``pyarrow, same files``: the same rows, already in memory as Arrow tables, written by
  ``pq.write_table`` to the same files (plain writes, no rename, no sync): what the layout
  alone costs;
- ``pyarrow, dataset``: the same rows written by ``pyarrow.dataset.write_dataset`` with the
  same Hive partitioning (one file per partition, not per session): the library's own way.

Throughput is MB/s of row data: the in-memory Arrow size of the exported rows (the same for
all three) over the wall time. Reported with the ratio of each baseline to the export, the
bytes each writes, and an incremental export after one session grew.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pyarrow as pa  # noqa: E402
import pyarrow.dataset as ds  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

import memstore  # noqa: E402
from memstore.exporters.parquet import TABLES, export_parquet  # noqa: E402


def make_store(root: Path, sessions: int) -> None:
    if not (root / "catalog.db").exists():
        print(f"writing a {sessions}-session demo store in {root} ...", flush=True)
        started = time.perf_counter()
        memstore.write_demo_store(root, sessions=sessions)
        print(f"  {time.perf_counter() - started:.0f} s", flush=True)
    memstore.Store(root).refresh()


def exported_rows(dest: Path) -> dict[str, list[tuple[str, pa.Table]]]:
    """Every file of an export, read back: ``{table: [(relative path, rows)]}``."""
    import json

    manifest = json.loads((dest / "_memstore_export.json").read_bytes())
    files: dict[str, list[tuple[str, pa.Table]]] = {table: [] for table in TABLES}
    for entry in manifest["sessions"].values():
        for f in entry["files"]:
            files[f["table"]].append((f["path"], pq.read_table(dest / f["path"])))
    return files


def write_same_files(files: dict[str, list[tuple[str, pa.Table]]], dest: Path) -> None:
    for parts in files.values():
        for rel, table in parts:
            path = dest / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            pq.write_table(table, path, compression="snappy")


def write_dataset(tables: dict[str, pa.Table], dest: Path) -> None:
    partitioning = ds.partitioning(pa.schema([("agent", pa.string()), ("day", pa.string())]), flavor="hive")
    for name, table in tables.items():
        ds.write_dataset(table, dest / name, format="parquet", partitioning=partitioning,
                         file_options=ds.ParquetFileFormat().make_write_options(compression="snappy"),
                         existing_data_behavior="overwrite_or_ignore")  # fmt: skip


def with_partitions(parts: list[tuple[str, pa.Table]]) -> pa.Table:
    """One table of all of ``parts``, with the partition keys of each part's path as columns."""
    pieces = []
    for rel, table in parts:
        agent, day = (p.split("=", 1)[1] for p in rel.split("/")[1:3])
        n = table.num_rows
        pieces.append(table.append_column("agent", pa.array([agent] * n)).append_column("day", pa.array([day] * n)))
    return pa.concat_tables(pieces)


def disk_bytes(dest: Path) -> int:
    return sum(p.stat().st_size for p in dest.rglob("*.parquet"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--store", type=Path, default=None, help="keep the store here between runs")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="bench-export-"))
    root = args.store or work / "store"
    try:
        make_store(root, args.sessions)
        export_parquet(root, work / "warm")  # imports, the price table, the OS caches
        files = exported_rows(work / "warm")
        tables = {name: with_partitions(parts) for name, parts in files.items()}
        row_bytes = sum(table.nbytes for parts in files.values() for _, table in parts)
        rows = sum(table.num_rows for table in tables.values())
        sizes: dict[str, int] = {}
        times: dict[str, list[float]] = {
            "memstore export": [],
            "memstore, no sync": [],
            "pyarrow, same files": [],
            "pyarrow, dataset": [],
        }
        for i in range(args.repeat):
            for name, run in (
                ("memstore export", lambda d: export_parquet(root, d)),
                ("memstore, no sync", lambda d: export_parquet(root, d, durable=False)),
                ("pyarrow, same files", lambda d: write_same_files(files, d)),
                ("pyarrow, dataset", lambda d: write_dataset(tables, d)),
            ):
                dest = work / f"run-{i}-{name.replace(' ', '').replace(',', '-')}"
                os.sync()  # what earlier runs left dirty is not this run's to flush
                started = time.perf_counter()
                run(dest)
                times[name].append(time.perf_counter() - started)
                sizes[name] = disk_bytes(dest)
                shutil.rmtree(dest)
        # Incremental: one session grows by a turn.
        dest = work / "incremental"
        export_parquet(root, dest)
        os.sync()
        store = memstore.Store(root)
        session = store.session_ids()[len(store.session_ids()) // 2]
        with store.open(session) as log:
            log.append({"type": "turn.started"})
            log.append({"type": "turn.completed", "usage": {"input_tokens": 1000, "output_tokens": 50}})
        store.refresh()  # the export's own refresh finds the session unchanged: only the export is timed
        started = time.perf_counter()
        report = export_parquet(root, dest)
        incremental = time.perf_counter() - started

        mb = row_bytes / 1e6
        print(f"{args.sessions:,} sessions, {rows:,} rows ({mb:.1f} MB of row data in Arrow), "
              f"{sum(len(p) for p in files.values()):,} files; {args.repeat} repetitions (median)")  # fmt: skip
        export_speed = mb / statistics.median(times["memstore export"])
        for name, values in times.items():
            median = statistics.median(values)
            speed = mb / median
            print(f"  {name:<22} {median:7.2f} s  {speed:6.2f} MB/s  ({sizes[name] / 1e6:6.1f} MB on disk)  "
                  f"export / this: {export_speed / speed:.2f}")  # fmt: skip
        print(f"  incremental export after one session grew: {incremental:.2f} s, "
              f"{len(report.written)} session written ({report.files_written} files), {report.unchanged} unchanged")  # fmt: skip
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
