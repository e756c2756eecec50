"""The explorer's machine filter: with a devbox's store imported into a laptop's, the home page
and the search page, as HTML and as .json, list exactly one machine's sessions when asked for
it (by store id or label, in the URL), offer every machine to choose from, and keep the filter
in their links."""

from __future__ import annotations

import asyncio
import sqlite3
from urllib.parse import quote

import pytest
from machines import DEVBOX_SESSIONS, LAPTOP_SESSIONS, TwoMachines, two_machines

from memstore.explorer import data, make_datasette


@pytest.fixture(scope="module")
def machines(tmp_path_factory) -> TwoMachines:
    return two_machines(tmp_path_factory.mktemp("explorer-machines"))


@pytest.fixture(scope="module")
def ds(machines):
    return make_datasette(machines.root)


def fetch(ds, path):
    async def run():
        return await ds.client.get(path)

    response = asyncio.run(run())
    assert response.status_code == 200, (path, response.text[:500])
    return response


def _expected(machines: TwoMachines, which: str) -> set[str]:
    return set(LAPTOP_SESSIONS if which == "laptop" else DEVBOX_SESSIONS)


@pytest.mark.parametrize("which", ["laptop", "devbox"])
def test_home_lists_exactly_one_machines_sessions(ds, machines, which):
    store_id = machines.laptop_id if which == "laptop" else machines.devbox_id
    for machine in (which, store_id):
        home = fetch(ds, f"/-/memstore.json?machine={quote(machine)}").json()
        assert {s["session_id"] for s in home["sessions"]} == _expected(machines, which)
        assert home["matching"] == len(_expected(machines, which))
        assert home["filters"]["machine"] == machine and home["filtered"]
        assert {s["origin_label"] for s in home["sessions"]} == {which}
        assert f"machine={quote(machine)}" in home["links"]["json"]
    page = fetch(ds, f"/-/memstore?machine={which}").text
    for sid in _expected(machines, which):
        assert sid in page
    for sid in (set(LAPTOP_SESSIONS) | set(DEVBOX_SESSIONS)) - _expected(machines, which):
        assert f">{sid}<" not in page
    assert f'<option value="{store_id}" selected>{which} (2)</option>' in page


def test_home_offers_every_machine(ds, machines):
    home = fetch(ds, "/-/memstore.json").json()
    assert {(m["store_id"], m["label"], m["sessions"]) for m in home["machines"]} == {
        (machines.laptop_id, "laptop", 2),
        (machines.devbox_id, "devbox", 2),
    }
    assert len(home["sessions"]) == 4


@pytest.mark.parametrize("which", ["laptop", "devbox"])
def test_search_returns_exactly_one_machines_hits(ds, machines, which):
    """The ranking with the filter as search_catalog takes it, and with a last day besides (the
    explorer's own condition over chunks): both keep to one machine's sessions."""
    store_id = machines.laptop_id if which == "laptop" else machines.devbox_id
    for extra in ("", "&until=9999-12-31"):
        for machine in (which, store_id):
            found = fetch(ds, f"/-/memstore/search.json?q=widget&limit=50&machine={quote(machine)}{extra}").json()
            assert {r["session_id"] for r in found["results"]} == _expected(machines, which), (machine, extra)
            assert found["total"] == len(found["results"])
            assert found["filters"]["machine"] == machine
            assert f"machine={quote(machine)}" in found["links"]["json"]
    html = fetch(ds, f"/-/memstore/search?q=widget&machine={which}").text
    assert f"born in {which}" in html
    assert f'<option value="{store_id}" selected>{which} (2)</option>' in html
    unknown = fetch(ds, "/-/memstore/search.json?q=widget&machine=nowhere").json()
    assert unknown["results"] == [] and unknown["total"] == 0


@pytest.mark.parametrize("sid", ["fix-parser", "deploy-ci"])
def test_a_session_page_names_its_machine_and_links_to_its_sessions(ds, machines, sid):
    which = "laptop" if sid in LAPTOP_SESSIONS else "devbox"
    store_id = machines.laptop_id if which == "laptop" else machines.devbox_id
    data = fetch(ds, f"/-/memstore/sessions/{sid}.json").json()
    assert (data["summary"]["origin_store_id"], data["summary"]["origin_label"]) == (store_id, which)
    link = data["links"]["machine"]
    assert f"machine={store_id}" in link
    listed = fetch(ds, link.replace("/-/memstore?", "/-/memstore.json?")).json()
    assert {s["session_id"] for s in listed["sessions"]} == _expected(machines, which)
    page = fetch(ds, f"/-/memstore/sessions/{sid}").text
    assert f">{which}</a>" in page


def test_the_fts5_fallback_keeps_to_the_filters_too(machines):
    """When the BM25 index cannot be read the explorer ranks with FTS5: the machine (and the
    other filters) restrict that ranking the same way."""
    conn = sqlite3.connect(machines.root / "catalog.db")
    try:
        every = data.fts_search(conn, "widget", 50)
        assert {r["session_id"] for r in every} == set(LAPTOP_SESSIONS) | set(DEVBOX_SESSIONS)
        for which in ("laptop", "devbox"):
            rows = data.fts_search(conn, "widget", 50, data.SearchFilters(machine=which))
            assert {r["session_id"] for r in rows} == _expected(machines, which)
        both = data.SearchFilters(machine="devbox", agent="codex", session="tune-index", until="9999-12-31")
        assert {r["session_id"] for r in data.fts_search(conn, "widget", 50, both)} == {"tune-index"}
        assert data.fts_search(conn, "widget", 50, data.SearchFilters(machine="devbox", session="add-cache")) == []
    finally:
        conn.close()


def test_home_shows_and_sorts_by_machine_when_there_are_several(ds, machines):
    page = fetch(ds, "/-/memstore").text
    assert '<td class="machine">devbox</td>' in page and '<td class="machine">laptop</td>' in page
    ordered = fetch(ds, "/-/memstore.json?sort=machine&order=asc").json()["sessions"]
    assert [s["origin_label"] for s in ordered] == ["devbox", "devbox", "laptop", "laptop"]
