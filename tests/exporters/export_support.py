"""Helpers of the exporter tests (pytest puts this directory on sys.path)."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb

SECRETS = Path(__file__).resolve().parent.parent / "fixtures" / "secrets" / "corpus.jsonl"


def parquet(dest: Path, table: str) -> str:
    """DuckDB's table expression for one exported table (partitions read from the paths)."""
    return f"read_parquet('{dest}/{table}/**/*.parquet', hive_partitioning = true)"


def query(sql: str) -> list[tuple]:
    con = duckdb.connect()
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


def secret_of(kind: str) -> str:
    """A fake, format-valid secret of ``kind`` from the redaction tests' corpus."""
    with open(SECRETS, encoding="utf-8") as f:
        for line in f:
            for secret in json.loads(line)["secrets"]:
                if secret["kind"] == kind:
                    return secret["value"]
    raise LookupError(kind)


def manifest_of(dest: Path) -> dict:
    return json.loads((dest / "_memstore_export.json").read_bytes())
