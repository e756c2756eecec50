"""The explorer is a real Datasette plugin: the package's entry point registers it, so a plain
`datasette <root>/catalog.db` (no -m, no --plugins-dir) serves the explorer's pages, the
catalog's metadata and canned queries, links from rows to the explorer, and refreshes the
catalog as `memstore serve` does."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from explorer_support import write_session

from memstore.catalog import refresh_catalog
from memstore.explorer import state_of
from memstore.explorer.database import CatalogDatabase

DATASETTE = shutil.which("datasette", path=str(Path(sys.executable).parent))


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("plugin") / "store"
    write_session(root, "alpha", turns=2, text="tidy the parser", agent="codex", cwd="/work/alpha")
    write_session(root, 'x"><script>alert(1)</script>', turns=1, text="hostile id")
    refresh_catalog(root)
    return root


def datasette(*args: str) -> subprocess.CompletedProcess:
    assert DATASETTE, "the datasette command is not installed beside this Python"
    return subprocess.run([DATASETTE, *args], capture_output=True, text=True, timeout=120)


def test_datasette_lists_the_plugin():
    """`datasette plugins` lists memstore with its hooks: the entry point registered it."""
    result = datasette("plugins")
    assert result.returncode == 0, result.stderr
    plugins = {p["name"]: p for p in json.loads(result.stdout)}
    assert "memstore" in plugins
    assert {"register_routes", "get_metadata", "render_cell", "startup", "asgi_wrapper", "prepare_connection"} <= set(
        plugins["memstore"]["hooks"]
    )


def test_plain_datasette_serves_the_explorer_and_its_metadata(store):
    """`datasette <catalog> --get ...` with nothing but the catalog: the explorer's pages, a
    canned query and the table metadata are all there."""
    catalog = str(store / "catalog.db")
    home = datasette(catalog, "--get", "/-/memstore.json")
    assert home.returncode == 0, home.stderr
    assert {s["session_id"] for s in json.loads(home.stdout)["sessions"]} >= {"alpha"}
    page = datasette(catalog, "--get", "/-/memstore/sessions/alpha")
    assert page.returncode == 0 and "Session alpha" in page.stdout
    canned = datasette(catalog, "--get", "/catalog/tokens_by_day.json?_shape=array")
    assert canned.returncode == 0, canned.stderr
    assert sum(r["input_tokens"] for r in json.loads(canned.stdout)) == 1000 + 1001 + 1000
    meta = json.loads(datasette(catalog, "--get", "/-/metadata.json").stdout)
    tables = meta["databases"]["catalog"]["tables"]
    assert tables["sessions"]["columns"]["title"] and tables["search_postings"]["hidden"]
    assert "tool_failure_rates" in meta["databases"]["catalog"]["queries"]


def test_rows_link_to_the_explorer_and_ids_stay_escaped(store):
    """Datasette's rows of sessions, turns and events link to their explorer pages; a session
    id that is markup stays text (escaped in the link's address and in its text)."""
    from datasette.app import Datasette

    from memstore.explorer.server import register_plugin

    register_plugin()
    ds = Datasette([str(store / "catalog.db")], metadata={"plugins": {"memstore": {"refresh_interval": 0}}})

    async def fetch(*paths):
        return [(await ds.client.get(p)).text for p in paths]

    sessions, turns, events, query = asyncio.run(
        fetch(
            "/catalog/sessions",
            "/catalog/turns?session_id=alpha",
            "/catalog/events?session_id=alpha",
            "/catalog/slowest_turns",
        )
    )
    assert 'href="/-/memstore/sessions/alpha"' in sessions
    assert 'href="/-/memstore/sessions/alpha/turns/2"' in turns
    assert 'href="/-/memstore/sessions/alpha/events/3"' in events
    assert 'href="/-/memstore/sessions/alpha/turns/1"' in query
    for page in (sessions, turns, events, query):
        assert "<script>alert(1)" not in page
    assert "%22%3E%3Cscript%3Ealert%281%29%3C%2Fscript%3E" in sessions


def test_plain_datasette_refreshes_the_catalog(tmp_path):
    """Datasette started on a writable store's catalog (no memstore serve) starts the refresher:
    a session written afterwards appears; the catalog Datasette reads is a CatalogDatabase."""
    from datasette.app import Datasette

    from memstore.explorer.server import register_plugin

    root = tmp_path / "store"
    write_session(root, "before")
    refresh_catalog(root)
    register_plugin()
    ds = Datasette([str(root / "catalog.db")], metadata={"plugins": {"memstore": {"refresh_interval": 0.1}}})

    async def run():
        first = (await ds.client.get("/-/memstore.json")).json()
        write_session(root, "after")
        deadline = time.monotonic() + 60
        while True:
            seen = {s["session_id"] for s in (await ds.client.get("/-/memstore.json")).json()["sessions"]}
            if "after" in seen or time.monotonic() > deadline:
                return first, seen
            await asyncio.sleep(0.2)

    try:
        first, seen = asyncio.run(run())
        assert {s["session_id"] for s in first["sessions"]} == {"before"}
        assert seen == {"before", "after"}
        assert isinstance(ds.databases["catalog"], CatalogDatabase)
    finally:
        state = state_of(ds)
        if state is not None and state.refresher is not None:
            state.refresher.stop()


def test_refresh_interval_zero_turns_the_refresher_off(store):
    from datasette.app import Datasette

    from memstore.explorer.server import register_plugin

    register_plugin()
    ds = Datasette([str(store / "catalog.db")], metadata={"plugins": {"memstore": {"refresh_interval": 0}}})
    assert asyncio.run(ds.client.get("/-/memstore.json")).status_code == 200
    assert state_of(ds).refresher is None
