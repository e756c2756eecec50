"""Adversarial review of the explorer: each test is a bug found by attacking the pages, the
Datasette plugin or the metadata, kept so it stays fixed."""

from __future__ import annotations

import asyncio
import sqlite3

import pytest

import memstore
from memstore.catalog import refresh_catalog
from memstore.explorer import make_datasette


def fetch(ds, *paths):
    async def run():
        return {path: await ds.client.get(path) for path in paths}

    result = asyncio.run(run())
    return result if len(paths) > 1 else result[paths[0]]


def write_small_session(root, sid="s", turns=2, text="hello world"):
    with memstore.open_session(root, sid, durability="none") as log:
        for n in range(turns):
            log.append({"type": "turn.started"})
            log.append(
                {"type": "item.completed", "item": {"id": f"m{n}", "type": "agent_message", "text": f"{text} {n}"}}
            )
            log.append({"type": "turn.completed", "usage": {"input_tokens": 10, "output_tokens": 1}})


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    root = tmp_path_factory.mktemp("review-explorer")
    write_small_session(root)
    refresh_catalog(root)
    return root, make_datasette(root)


# --------------------------------------------------------------------------------------------
# Query parameters: "²".isdigit() is True but int("²") raises, so a number check with isdigit()
# turned ?page=² into a 500 with a traceback.


@pytest.mark.parametrize(
    "path",
    [
        "/-/memstore?page=%C2%B2",
        "/-/memstore.json?page=%C2%B2",
        "/-/memstore/sessions/s?page=%C2%B2",
        "/-/memstore/sessions/s.json?page=%E2%91%A0",
        "/-/memstore/sessions/s/turns/1?start=%C2%B2",
        "/-/memstore/search?q=hello&limit=%C2%B2",
        "/-/memstore/search.json?q=hello&limit=%C2%B9%C2%B2",
    ],
)
def test_non_ascii_digits_in_numbers_are_ignored_not_a_500(small, path):
    _root, ds = small
    response = fetch(ds, path)
    assert response.status_code == 200, (path, response.text[:300])
    assert "Traceback" not in response.text and "invalid literal" not in response.text


# --------------------------------------------------------------------------------------------
# Read-only: the search page called memstore.search_memory, which refreshes the catalog first,
# so a GET of /-/memstore/search wrote catalog.db (and waited for the store's catalog lock).


def test_the_search_page_does_not_write_the_catalog(tmp_path):
    write_small_session(tmp_path, "old", text="zebra crossing")
    refresh_catalog(tmp_path)
    ds = make_datasette(tmp_path)
    write_small_session(tmp_path, "new", text="zebra stripes")  # the catalog does not have it yet
    catalog = tmp_path / "catalog.db"

    def state():
        # (Opening a WAL database creates an empty -wal and a -shm; what counts is what they hold.)
        wal = tmp_path / "catalog.db-wal"
        files = (catalog.stat().st_size, catalog.stat().st_mtime_ns, wal.stat().st_size if wal.exists() else 0)
        conn = sqlite3.connect(f"file:{catalog}?mode=ro", uri=True)
        try:
            return files, conn.execute("SELECT group_concat(session_id) FROM sessions").fetchone()[0]
        finally:
            conn.close()

    before = state()
    html = fetch(ds, "/-/memstore/search?q=zebra")
    found = fetch(ds, "/-/memstore/search.json?q=zebra").json()
    assert html.status_code == 200 and "<mark>zebra</mark>" in html.text
    assert found["engine"] == "bm25" and {r["session_id"] for r in found["results"]} == {"old"}
    assert fetch(ds, "/-/memstore/search.json?q=zebra&session=old").json()["results"]
    assert fetch(ds, "/-/memstore/search.json?q=zebra&session=new").json()["results"] == []
    after = state()
    assert after == before, (before, after)
    # The search results name the log relative to the store, as the catalog does.
    assert found["results"][0]["path"] == "sessions/old/events.jsonl"


# --------------------------------------------------------------------------------------------
# Fast at scale: the session page read every turn from the first one it shows to the session's
# last (reader.turns(since=first)) and kept a page of them: a 100,000-turn session's first page
# built 100,000 Turn objects (0.6-0.8 s on the project's machine). It now reads one page.


def test_a_session_page_reads_one_page_of_turns_not_the_whole_session(tmp_path, monkeypatch):
    from memstore.explorer import Urls, data
    from memstore.session.index import SessionIndex

    with memstore.open_session(tmp_path, "long", durability="none") as log:
        for _ in range(1_000):
            log.append({"type": "turn.started"})
            log.append({"type": "turn.completed", "usage": {"input_tokens": 1}})
        log.append({"type": "turn.started"})  # an open turn, past what the index holds
    read = []
    turns, turn = SessionIndex.turns, SessionIndex.turn

    def counting_turns(self, since=0):
        rows = turns(self, since)
        read.append(len(rows))
        return rows

    def counting_turn(self, number):
        found = turn(self, number)
        read.append(found is not None)
        return found

    monkeypatch.setattr(SessionIndex, "turns", counting_turns)
    monkeypatch.setattr(SessionIndex, "turn", counting_turn)
    for page, numbers in ((1, range(1, 101)), (5, range(401, 501)), (11, range(1001, 1002))):
        read.clear()
        payload = data.session_data(None, tmp_path, "long", Urls(), page=page)
        assert [t["number"] for t in payload["turns"]] == list(numbers)
        assert payload["pages"] == 11 and payload["turns"][-1]["status"] in ("completed", "open")
        assert sum(read) <= 110, (page, sum(read))
    assert payload["turns"][-1]["status"] == "open"


# --------------------------------------------------------------------------------------------
# A 404 names what was asked: numbers of more than 16 digits were read as 0, so the page said
# "no event with seq 0" for /events/99999999999999999999.


def test_not_found_pages_name_the_number_asked_for(small):
    _root, ds = small
    big = "99999999999999999999"
    event = fetch(ds, f"/-/memstore/sessions/s/events/{big}.json")
    turn = fetch(ds, f"/-/memstore/sessions/s/turns/{big}.json")
    assert event.status_code == turn.status_code == 404
    assert big in event.json()["error"] and big in turn.json()["error"]
    assert " 0 " not in event.json()["error"] + " " and " 0 " not in turn.json()["error"] + " "
    assert fetch(ds, "/-/memstore/sessions/s/turns/" + "9" * 5000).status_code == 404
    assert fetch(ds, "/-/memstore/sessions/s/events/" + "9" * 5000 + ".json").status_code == 404
    assert fetch(ds, "/-/memstore/sessions/s/turns/0002.json").json()["number"] == 2


# --------------------------------------------------------------------------------------------
# A session that cannot be read (an unreadable log, an I/O error) gave Datasette's 500 page,
# whose message was the error's text: the absolute path of the file in the store.


def test_an_unreadable_session_is_an_error_page_without_filesystem_paths(tmp_path, monkeypatch):
    from memstore.errors import StoreIOError
    from memstore.session import logfile

    write_small_session(tmp_path)
    refresh_catalog(tmp_path)
    ds = make_datasette(tmp_path)

    def denied(self, *args, **kwargs):
        raise StoreIOError.from_os_error("open", self.path, PermissionError(13, "Permission denied"))

    monkeypatch.setattr(logfile.LogFile, "open_readonly", denied)
    for path in ("/-/memstore/sessions/s", "/-/memstore/sessions/s/turns/1", "/-/memstore/sessions/s/events/2"):
        html, as_json = fetch(ds, path, path + ".json").values()
        assert html.status_code == as_json.status_code == 500, path
        assert str(tmp_path) not in html.text and str(tmp_path) not in as_json.text
        assert "events.jsonl" not in html.text and "Traceback" not in html.text
        assert "could not be read" in html.text and "<h1>Cannot read</h1>" in html.text
        assert as_json.json()["error"] == "session 's' could not be read (see the server's log)"
    assert fetch(ds, "/-/memstore.json").status_code == 200


def test_an_unreadable_progress_ledger_does_not_show_its_path(tmp_path):
    write_small_session(tmp_path)
    ledger = tmp_path / "sessions" / "s" / "derived" / "progress.json"
    ledger.parent.mkdir(exist_ok=True)
    ledger.write_text("{broken")
    refresh_catalog(tmp_path)
    ds = make_datasette(tmp_path)
    html, as_json = fetch(ds, "/-/memstore/sessions/s", "/-/memstore/sessions/s.json").values()
    assert html.status_code == as_json.status_code == 200
    assert as_json.json()["progress"] == {"error": "the progress ledger could not be read (see the server's log)"}
    assert str(tmp_path) not in html.text and "progress.json" not in html.text


# --------------------------------------------------------------------------------------------
# Huge outputs: the event page pretty-printed the whole envelope for every request even when
# the page shows its first million characters only, and the .json carried the event three
# times (line, envelope, pretty): a 50 MB command output made a 275 MB response and 1.3 GB of
# memory. Past MAX_LINE_SHOWN the formatted copy is left out.


def test_a_huge_event_is_not_pretty_printed_whole(tmp_path, monkeypatch):
    from memstore.explorer import data

    monkeypatch.setattr(data, "MAX_LINE_SHOWN", 20_000)
    with memstore.open_session(tmp_path, "big") as log:
        log.append({"type": "turn.started"})
        log.append(
            {
                "type": "item.completed",
                "item": {
                    "id": "c",
                    "type": "command_execution",
                    "command": "yes",
                    "aggregated_output": "y\n" * 100_000,
                    "exit_code": 0,
                },
            }
        )
        log.append({"type": "item.completed", "item": {"id": "m", "type": "agent_message", "text": "short"}})
        log.append({"type": "turn.completed", "usage": {}})
    refresh_catalog(tmp_path)
    ds = make_datasette(tmp_path)
    big, small = fetch(ds, "/-/memstore/sessions/big/events/2.json", "/-/memstore/sessions/big/events/3.json").values()
    assert big.status_code == small.status_code == 200
    payload = big.json()
    assert payload["line_truncated"] and payload["pretty"] is None
    assert payload["envelope"]["event"]["item"]["aggregated_output"] == "y\n" * 100_000  # the JSON has it whole
    assert len(big.content) < 2.8 * payload["length"]  # line and envelope (escaped), not a third copy
    assert small.json()["pretty"].startswith("{\n") and not small.json()["line_truncated"]
    html = fetch(ds, "/-/memstore/sessions/big/events/2").text
    assert "the first 20,000 characters" in html and "y\\ny\\n" in html and len(html) < 60_000


# --------------------------------------------------------------------------------------------
# The search page links to Datasette's FTS5 search of the chunks table with the query as it was
# typed; Datasette's escaping leaves a query of quotes empty, and FTS5 refuses it: a 400.


@pytest.mark.parametrize("q", ['"', '""', '" OR "', 'hello "world', 'NEAR(" * )', "-"])
def test_the_search_pages_link_to_the_chunks_table_always_works(small, q):
    from urllib.parse import quote

    _root, ds = small
    page = fetch(ds, "/-/memstore/search.json?q=" + quote(q))
    assert page.status_code == 200
    link = page.json()["links"]["chunks_table"]
    response = fetch(ds, link.replace("/catalog/chunks", "/catalog/chunks.json", 1))
    assert response.status_code == 200, (q, link, response.text[:200])


# --------------------------------------------------------------------------------------------
# Never a file read outside the store: the session page read the progress ledger through a
# symlinked derived/ directory (memory facts already refused one).


def test_a_symlinked_derived_directory_is_not_followed_for_the_progress_ledger(tmp_path):
    import shutil

    from memstore.views.progress import ProgressLedger, save_progress

    store, elsewhere = tmp_path / "store", tmp_path / "elsewhere"
    write_small_session(store)
    save_progress(elsewhere, "s", ProgressLedger.new("s", "a goal from outside the store"))
    derived = store / "sessions" / "s" / "derived"
    shutil.rmtree(derived)
    derived.symlink_to(elsewhere / "sessions" / "s" / "derived")
    refresh_catalog(store)
    ds = make_datasette(store)
    html, as_json = fetch(ds, "/-/memstore/sessions/s", "/-/memstore/sessions/s.json").values()
    assert html.status_code == as_json.status_code == 200
    assert as_json.json()["progress"] is None and as_json.json()["facts"] == []
    assert "from outside" not in html.text


# --------------------------------------------------------------------------------------------
# metadata.yml: the index page's description linked to /-/memstore absolutely, which misses
# Datasette's base_url (every other explorer link honours it).


def raw_get(ds, raw_path: str) -> tuple[int, str]:
    """GET ``raw_path`` through the ASGI app as a proxy would pass it (prefix included)."""
    sent = []

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)

    scope = {
        "type": "http",
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "root_path": "",
        "path": raw_path,
        "raw_path": raw_path.encode("ascii"),
        "query_string": b"",
        "headers": [(b"host", b"localhost")],
        "client": ("127.0.0.1", 1),
        "server": ("localhost", 80),
    }
    asyncio.run(ds.app()(scope, receive, send))
    start = next(m for m in sent if m["type"] == "http.response.start")
    return start["status"], b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body").decode()


def test_every_explorer_link_honours_base_url(small):
    import re
    from urllib.parse import urljoin

    root, _ds = small
    ds = make_datasette(root, settings={"base_url": "/prefix/"})
    for page in ("/prefix/", "/prefix/-/memstore", "/prefix/-/memstore/sessions/s", "/prefix/-/memstore/search?q=x"):
        status, body = raw_get(ds, page.split("?")[0])
        assert status == 200, page
        for link in re.findall(r'(?:href|action)="([^"#]+)"', body):
            if "memstore" in link:
                assert urljoin("http://localhost" + page, link).startswith("http://localhost/prefix/"), (page, link)


# --------------------------------------------------------------------------------------------
# Concurrent refresh while browsing: the home page's queries (the count, the page of rows, the
# totals) ran outside any transaction, so a refresh committing between two of them gave a page
# whose count, rows and totals disagree. They now read one snapshot.


def test_the_home_page_reads_one_snapshot_while_the_catalog_changes(tmp_path):
    from memstore.explorer import Urls, data

    for sid in ("a", "b"):
        write_small_session(tmp_path, sid)
    refresh_catalog(tmp_path)
    catalog = tmp_path / "catalog.db"
    writer = sqlite3.connect(catalog)

    class RefreshedMidway:
        """A read connection to the catalog; a 'refresh' commits right after its first query."""

        def __init__(self):
            self.conn = sqlite3.connect(f"file:{catalog}?mode=ro", uri=True)
            self.queries = 0

        def execute(self, sql, params=()):
            cursor = self.conn.execute(sql, params)
            self.queries += sql.lstrip().upper().startswith("SELECT")
            if self.queries == 1 and not getattr(self, "refreshed", False):
                self.refreshed = True
                writer.execute(
                    "INSERT INTO sessions (session_id, directory, status, turn_count, event_count, "
                    "input_tokens, output_tokens) VALUES ('c', 'c', 'active', 1, 3, 10, 1)"
                )
                writer.commit()
            return cursor

        def __getattr__(self, name):
            return getattr(self.conn, name)

    conn = RefreshedMidway()
    payload = data.home_data(conn, Urls())
    assert conn.queries > 3
    assert payload["matching"] == len(payload["sessions"]) == payload["totals"]["sessions"] == 2
    assert not conn.conn.in_transaction  # the snapshot is released
    writer.close()


# --------------------------------------------------------------------------------------------
# Datasette's SQL: fts3_tokenizer() is allowed in a SELECT. One argument returns a pointer into
# the server's memory; two arguments register a tokenizer at any address (SQLite's documented
# hazard, which is why it is off by default in newer builds). The guard refuses the function.


def test_sql_cannot_call_fts3_tokenizer(small):
    _root, ds = small
    for sql in (
        "select+fts3_tokenizer('simple')",
        "select+fts3_tokenizer('x',+x'4141414141414141')",
        "select+hex(fts3_tokenizer('porter'))",
    ):
        response = fetch(ds, "/catalog.json?sql=" + sql)
        assert response.status_code in (400, 403) and response.json()["ok"] is False, (sql, response.text[:200])
    assert (
        fetch(ds, "/catalog.json?sql=select+count(*)+from+chunks_fts+where+chunks_fts+match+'hello'").status_code == 200
    )


# --------------------------------------------------------------------------------------------
# metadata.yml lost its `session` database when the catalog's was written: the README's
# `datasette <root>/sessions/demo/index/session.db -m metadata.yml` ("documents every column and
# has canned queries (failed turns, failed commands, tool usage, token usage)") showed neither.


def test_metadata_still_documents_a_sessions_index_and_its_canned_queries(tmp_path):
    from pathlib import Path

    import yaml
    from datasette.app import Datasette

    from memstore.demo import write_demo_session

    write_demo_session(tmp_path).close()
    memstore.rebuild(tmp_path, "demo")  # event_details is derived lazily; a rebuild derives it all
    db = tmp_path / "sessions" / "demo" / "index" / "session.db"
    metadata = yaml.safe_load(
        (Path(__file__).resolve().parents[2] / "memstore" / "explorer" / "metadata.yml").read_text()
    )
    session = metadata["databases"]["session"]
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    names = [
        r[0]
        for r in conn.execute(
            "SELECT name FROM sqlite_master WHERE type IN ('table', 'view') AND name "
            "NOT LIKE 'chunks_fts%' AND name NOT LIKE 'sqlite_%'"
        )
    ]
    for name in names:
        table = session["tables"].get(name)
        assert table is not None and table.get("description"), name
        if not table.get("hidden"):
            columns = {r[1] for r in conn.execute(f"PRAGMA table_info([{name}])")}
            assert set(table.get("columns", {})) == columns, (name, columns ^ set(table.get("columns", {})))
            for facet in table.get("facets", []):
                assert facet in columns, (name, facet)
    conn.close()
    # The explorer plugin ships this metadata: a plain `datasette .../index/session.db` has it.
    from memstore.explorer.server import register_plugin

    register_plugin()
    ds = Datasette([str(db)])

    async def run(paths):
        return [await ds.client.get(p) for p in paths]

    queries = ["failed_turns", "failed_commands", "tool_usage", "token_usage"]
    assert set(queries) <= set(session["queries"])
    responses = asyncio.run(run([f"/session/{q}.json?_shape=array" for q in session["queries"]]))
    results = dict(zip(session["queries"], responses))
    for name, response in results.items():
        assert response.status_code == 200, (name, response.text[:300])
    assert [r["number"] for r in results["failed_turns"].json()] == [1]
    assert [r["command"] for r in results["failed_commands"].json()] == ["cargo test"]
    assert len(results["token_usage"].json()) == 3 and results["tool_usage"].json()


@pytest.mark.parametrize("path", ["/\\evil.com/", "//evil.com/", "/\\\\evil.com/x/"])
def test_no_redirect_leads_to_another_site(small, path):
    """Datasette 0.65 answers ``/\\evil.com/`` with ``Location: /\\evil.com``, which a browser
    follows to ``//evil.com``. The request goes through the ASGI app as a server hands it over
    (raw path; an HTTP client would escape the backslash)."""
    _, ds = small
    messages = []

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        messages.append(message)

    scope = {
        "type": "http",
        "method": "GET",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "headers": [(b"host", b"localhost")],
        "http_version": "1.1",
        "scheme": "http",
        "server": ("127.0.0.1", 8001),
        "client": ("127.0.0.1", 5000),
        "root_path": "",
    }
    asyncio.run(ds.app()(scope, receive, send))
    start = messages[0]
    location = dict(start.get("headers", [])).get(b"location", b"")
    assert start["status"] == 404, (start["status"], location)
    assert not location


def test_ordinary_trailing_slashes_still_redirect(small):
    _, ds = small
    response = fetch(ds, "/catalog/")
    assert response.status_code == 302 and response.headers["location"] == "/catalog"
