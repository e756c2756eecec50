"""The explorer's metadata (memstore/explorer/metadata.yml, shipped by its plugin) describes
catalog.db: every table and column documented, facets on real columns, and its canned analytics
queries run in a real Datasette over the demo store; the project's own metadata.yml is an example
laid over it."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest
import yaml

from memstore.catalog import refresh_catalog
from memstore.demo import write_demo_store
from memstore.explorer import make_datasette

PROJECT = Path(__file__).resolve().parents[2]
METADATA = PROJECT / "memstore" / "explorer" / "metadata.yml"


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("metadata")
    write_demo_store(root)
    refresh_catalog(root)
    return root


def catalog_meta():
    return yaml.safe_load(METADATA.read_text())["databases"]["catalog"]


def test_metadata_documents_every_catalog_column(store):
    conn = sqlite3.connect(store / "catalog.db")
    tables = catalog_meta()["tables"]
    names = [
        r[0]
        for r in conn.execute(
            "SELECT name FROM sqlite_master WHERE type IN ('table', 'view') "
            "AND name NOT LIKE 'chunks_fts%' AND name NOT LIKE '\\_%' ESCAPE '\\' "
            "AND name NOT LIKE 'sqlite_%'"
        )
    ]
    for name in names:
        assert name in tables and tables[name].get("description"), name
        if "columns" in tables[name]:
            columns = {r[1] for r in conn.execute(f"PRAGMA table_info([{name}])")}
            assert columns == set(tables[name]["columns"]), (name, columns ^ set(tables[name]["columns"]))
        for facet in tables[name].get("facets", []):
            assert facet in {r[1] for r in conn.execute(f"PRAGMA table_info([{name}])")}, (name, facet)
    for name in ("sessions", "turns", "events", "file_changes", "chunks"):
        assert "columns" in tables[name]


def test_canned_queries_run_on_the_demo_store(store):
    meta = catalog_meta()
    queries = meta["queries"]
    assert len(queries) >= 8
    for name, query in queries.items():
        assert query.get("title") and query.get("description"), name
        assert not query.get("write"), name
    ds = make_datasette(store)

    async def fetch():
        out = {}
        for name in queries:
            response = await ds.client.get(f"/catalog/{name}.json?_shape=array")
            assert response.status_code == 200, (name, response.text[:300])
            out[name] = response.json()
            html = await ds.client.get(f"/catalog/{name}")
            assert html.status_code == 200 and queries[name]["title"] in html.text
        return out

    results = asyncio.run(fetch())
    conn = sqlite3.connect(store / "catalog.db")
    tokens = conn.execute("SELECT sum(input_tokens), sum(output_tokens) FROM turns").fetchone()
    assert sum(r["input_tokens"] for r in results["tokens_by_day"]) == tokens[0]
    assert sum(r["output_tokens"] for r in results["tokens_by_day"]) == tokens[1]
    by_session = results["tokens_by_session"]
    assert len(by_session) == 30 and by_session[0]["total_tokens"] >= by_session[-1]["total_tokens"]
    rates = {r["tool"]: r for r in results["tool_failure_rates"]}
    assert rates["read_file"]["failures"] == 0 and rates["run_pty_cmd"]["failure_pct"] == 100.0
    slow = [r["duration_ms"] for r in results["slowest_turns"]]
    assert slow == sorted(slow, reverse=True) and slow[0] > 60_000
    failing = {r["command"]: r for r in results["commands_failed_most"]}
    assert failing["cargo test"]["failures"] >= 2
    assert {"src/store.rs"} <= {r["path"] for r in results["files_changed_most"]}
    ending = {r["session_id"]: r for r in results["sessions_ending_in_error"]}
    assert ending and all(
        r["last_turn_status"] in ("failed", "aborted", "interrupted") or r["thread_outcome"] != "success"
        for r in ending.values()
    )
    assert any(r["thread_outcome"] == "error_during_execution" for r in ending.values())
    assert all(0 <= (r["cache_hit_pct"] or 0) <= 100 for r in results["cache_hit_rate"])
    assert sum(r["sessions"] for r in results["turns_per_session"]) == 30
    denied = results["denied_tool_calls"]
    assert {r["decision"] for r in denied} == {"deny", "declined"}


def test_catalog_page_lists_the_canned_queries(store):
    ds = make_datasette(store)
    html = asyncio.run(ds.client.get("/catalog")).text
    for query in catalog_meta()["queries"].values():
        assert query["title"] in html


def test_the_package_ships_the_metadata_and_registers_the_plugin():
    """A regular (non-editable) install works as a checkout does: the metadata and templates are
    package data, and the plugin is the package's ``datasette`` entry point."""
    import tomllib

    from memstore.explorer import app

    package = Path(app.__file__).parent
    assert app.METADATA_FILE == METADATA and METADATA.parent == package
    project = tomllib.loads((PROJECT / "pyproject.toml").read_text())
    patterns = project["tool"]["setuptools"]["package-data"]["memstore.explorer"]
    assert any(METADATA in package.glob(p) for p in patterns)
    assert any((package / "templates" / "memstore_home.html") in package.glob(p) for p in patterns)
    assert project["project"]["entry-points"]["datasette"] == {"memstore": "memstore.explorer.plugin"}


def test_the_example_metadata_and_plugin_extend_the_explorer(store):
    """The project's metadata.yml and plugins/ are examples of extending the explorer: passed to
    it, their canned query (which calls the example plugin's function) joins the shipped ones."""
    ds = make_datasette(store, metadata=PROJECT / "metadata.yml", plugins_dir=PROJECT / "plugins")

    async def fetch():
        return (
            await ds.client.get("/catalog/files_by_name.json?_shape=array"),
            await ds.client.get("/catalog/tokens_by_day.json?_shape=array"),
            await ds.client.get("/-/metadata.json"),
        )

    by_name, shipped, meta = asyncio.run(fetch())
    assert by_name.status_code == 200, by_name.text[:300]
    rows = by_name.json()
    assert rows and all("/" not in r["file"] for r in rows)
    assert {"store.rs"} <= {r["file"] for r in rows}
    assert shipped.status_code == 200 and shipped.json()
    assert meta.json()["title"].startswith("memstore (with the examples")
