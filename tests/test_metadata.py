"""metadata.yml describes the per-session index, and its canned queries run in a real Datasette."""

from __future__ import annotations

import asyncio
from pathlib import Path

import yaml
from datasette.app import Datasette

from memstore.demo import write_demo_session

METADATA = Path(__file__).resolve().parent.parent / "metadata.yml"


def test_metadata_documents_every_index_column(tmp_path):
    with write_demo_session(tmp_path) as log:
        index_path = log.index_path
    import sqlite3

    conn = sqlite3.connect(index_path)
    tables = yaml.safe_load(METADATA.read_text())["databases"]["session"]["tables"]
    for table in ("manifest", "turns", "events"):
        columns = [row[1] for row in conn.execute(f"PRAGMA table_info({table})")]
        documented = set(tables[table]["columns"])
        assert set(columns) - {"id"} <= documented, (table, set(columns) - documented)


def test_canned_queries_run_in_datasette(tmp_path):
    with write_demo_session(tmp_path) as log:
        index_path = log.index_path
    metadata = yaml.safe_load(METADATA.read_text())

    async def fetch():
        ds = Datasette([str(index_path)], metadata=metadata)
        results = {}
        for name in metadata["databases"]["session"]["queries"]:
            response = await ds.client.get(f"/session/{name}.json?_shape=array")
            assert response.status_code == 200, (name, response.text)
            results[name] = response.json()
        return results

    results = asyncio.run(fetch())
    assert [r["number"] for r in results["failed_turns"]] == [1]
    assert results["failed_turns"][0]["error"] == "cargo test failed: 1 test failed"
    assert [(r["command"], r["exit_code"]) for r in results["failed_commands"]] == [("cargo test", 101)]
    by_name = {r["name"]: r for r in results["tool_usage"]}
    assert by_name["cargo test"]["uses"] == 2 and by_name["cargo test"]["failures"] == 1
    assert [r["cache_hit_pct"] for r in results["token_usage"]] == [0.0, 73.2, 88.6]
