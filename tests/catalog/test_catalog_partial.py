"""A search that could not look at every session says so: which sessions are missing and why,
in what :func:`memstore.search_memory` returns (still a list), in :class:`SearchPage`, in
``memstore search`` (a warning line; with --json, a JSON warning on stderr) and on the
explorer's search page. Before, the sessions a refresh could not copy were left out of every
answer in silence."""

from __future__ import annotations

import asyncio

import orjson
import pytest
from catalog_support import turn
from click.testing import CliRunner

import memstore
from memstore.catalog import copy as catalog_copy
from memstore.cli import cli
from memstore.search import SearchPage, SearchResults, search_catalog
from memstore.session.index import IndexChanged


@pytest.fixture
def store_with_a_broken_session(tmp_path, monkeypatch):
    """Three sessions, one of which (``broken``) is rewritten under every read of it (what a
    writer rebuilding it in a loop does): the refresh cannot copy it."""
    for sid in ("a", "b", "broken"):
        with memstore.open_session(tmp_path, sid) as log:
            turn(log, 1)
    real = catalog_copy._log_copy

    def rewritten_if_broken(examined, previous, reader, redactor):
        if examined.name == "broken":
            raise IndexChanged("read index", examined.path, "it was rebuilt or rewritten while it was read")
        return real(examined, previous, reader, redactor)

    monkeypatch.setattr(catalog_copy, "_log_copy", rewritten_if_broken)
    yield tmp_path
    memstore.Store(tmp_path).close()


def test_search_memory_returns_a_list_that_names_what_it_missed(store_with_a_broken_session):
    root = store_with_a_broken_session
    hits = memstore.search_memory(root, "widget", 20)
    assert isinstance(hits, list) and isinstance(hits, SearchResults)
    assert {h.session_id for h in hits} == {"a", "b"}
    assert hits.partial and [(m.directory, m.session_id) for m in hits.missing] == [("broken", None)]
    assert "kept being rewritten" in hits.missing[0].reason
    # The same from a Store, and a page of search_catalog over the catalog as it is.
    page = memstore.Store(root).search_page("widget", limit=5)
    assert page.partial and [m.directory for m in page.missing] == ["broken"]
    import sqlite3

    conn = sqlite3.connect(f"file:{root / 'catalog.db'}?mode=ro", uri=True)
    try:
        assert [m.directory for m in search_catalog(conn, "widget").missing] == ["broken"]
    finally:
        conn.close()
    # What is missing is the store's: the statistics every score is made of span every session.
    only_a = memstore.search_memory(root, "widget", 20, session_id="a")
    assert {h.session_id for h in only_a} == {"a"} and [m.directory for m in only_a.missing] == ["broken"]


def test_a_session_copied_at_last_leaves_the_missing_list(store_with_a_broken_session, monkeypatch):
    root = store_with_a_broken_session
    assert memstore.search_memory(root, "widget").partial
    monkeypatch.undo()  # the writer stopped rewriting it
    report = memstore.Store(root).refresh(full=False)  # the sweep tries the missing again
    assert report.added == ["broken"] and not report.errors
    hits = memstore.search_memory(root, "widget", 20)
    assert not hits.partial and {h.session_id for h in hits} == {"a", "b", "broken"}


def test_the_search_command_warns_that_the_answer_is_partial(store_with_a_broken_session):
    root = store_with_a_broken_session
    runner = CliRunner(mix_stderr=False) if "mix_stderr" in CliRunner.__init__.__code__.co_varnames else CliRunner()
    result = runner.invoke(cli, ["search", "widget", "--root", str(root)])
    assert result.exit_code == 0, result.output
    assert "warning: partial results: 1 session not searched: broken (" in result.stderr
    assert "widget" in result.stdout
    as_json = runner.invoke(cli, ["search", "widget", "--root", str(root), "--json"])
    assert as_json.exit_code == 0
    assert isinstance(orjson.loads(as_json.stdout), list)  # stdout is the results, as before
    warning = orjson.loads(as_json.stderr.strip().splitlines()[-1])
    assert warning["warning"] == "partial results" and [m["directory"] for m in warning["missing"]] == ["broken"]


def test_the_explorer_search_page_shows_a_notice(store_with_a_broken_session):
    from memstore.explorer import make_datasette

    root = store_with_a_broken_session
    memstore.Store(root).refresh(full=False)  # as serve's refresher does: what it left out is recorded
    ds = make_datasette(root)

    async def get(path):
        return await ds.client.get(path)

    page = asyncio.run(get("/-/memstore/search?q=widget"))
    assert page.status_code == 200
    assert "Partial results: 1 session could not be searched: broken" in page.text
    data = asyncio.run(get("/-/memstore/search.json?q=widget")).json()
    assert [m["directory"] for m in data["missing"]] == ["broken"]
    assert str(root) not in data["missing"][0]["reason"]  # no place on the server's disk


def test_search_page_without_missing_is_not_partial():
    assert not SearchPage([], 0, 0, 6).partial and not SearchResults().partial
