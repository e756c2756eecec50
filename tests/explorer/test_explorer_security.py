"""The explorer's server against a hostile page and hostile SQL, over real HTTP: a foreign Host
(DNS rebinding) is refused, a query cannot stall the others or grow without bound, no page names
the store's absolute path, and a catalog replaced under the server is followed."""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import threading
import time
import urllib.parse
from pathlib import Path

import pytest
from explorer_support import write_session

from memstore.catalog import refresh_catalog
from memstore.explorer import guard, hosts, make_datasette

PRINTF = "select printf('%.*c', 900000000, 'x') as big"


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("secure") / "home-of-alice" / "store"
    for n in range(3):
        write_session(root, f"s{n}", turns=2, text=f"session {n} fixes the parser")
    refresh_catalog(root)
    return root


def sql_path(sql: str) -> str:
    return "/catalog.json?" + urllib.parse.urlencode({"sql": sql, "_shape": "array"})


# --------------------------------------------------------------------------------------------
# Host (DNS rebinding)


def test_a_foreign_host_is_refused_and_local_names_are_answered(store, serve_store):
    """A page of another origin that resolves its name to 127.0.0.1 sends its own name as Host:
    every path (the explorer's and Datasette's own) refuses it with a 403 that says what to do;
    the localhost names and the bound address are answered."""
    served = serve_store(store)
    for path in (
        "/-/memstore.json",
        "/-/memstore/sessions/s1.json",
        "/catalog.json?sql=select+1",
        "/catalog/sessions.json",
        "/",
    ):
        status, body = served.request(path, host=f"evil.example:{served.port}")
        assert status == 403, (path, status)
        assert "evil.example" in body and "--allow-host" in body and "s1" not in body
    for host in (f"localhost:{served.port}", f"127.0.0.1:{served.port}", "localhost", f"app.localhost:{served.port}"):
        status, body = served.request("/-/memstore.json", host=host)
        assert status == 200, host
        assert {s["session_id"] for s in json.loads(body)["sessions"]} == {"s0", "s1", "s2"}
    # Malformed or tricky Host values are refused too.
    for host in (
        "127.0.0.1@evil.example",
        "evil.example\\.localhost",
        "localhost.evil.example",
        "[::1",
        "127.0.0.1:80:80",
    ):
        assert served.request("/-/memstore.json", host=host)[0] == 403, host


def test_allow_host_adds_a_name(store, serve_store):
    """`--allow-host NAME` answers requests for that name (as behind a proxy or on a LAN name)."""
    served = serve_store(store, "--allow-host", "agents.example.org", "--refresh-interval", "0")
    assert served.request("/-/memstore.json", host=f"agents.example.org:{served.port}")[0] == 200
    assert served.request("/-/memstore.json", host="AGENTS.example.org.")[0] == 200
    assert served.request("/-/memstore.json", host="evil.example")[0] == 403


@pytest.mark.parametrize(
    "header,extra,server,ok",
    [
        ("localhost:8001", (), None, True),
        ("[::1]:8001", (), None, True),
        ("127.0.0.2", (), None, True),
        ("evil.example", (), None, False),
        ("192.168.1.5:8001", (), "192.168.1.5", True),  # bound to 0.0.0.0, reached by the interface's address
        ("192.168.1.6:8001", (), "192.168.1.5", False),
        ("evil.example", ("*",), None, True),
        ("Agents.Example.org:80", ("agents.example.org",), None, True),
        ("localhost:abc", (), None, False),
        ("", (), None, False),
        (None, (), None, True),  # HTTP/1.0 without Host names no other site
    ],
)
def test_host_rules(header, extra, server, ok):
    assert hosts.allowed(header, extra, server) is ok


def test_plain_datasette_takes_allowed_hosts_from_plugin_configuration(store):
    """`datasette catalog.db -m meta.yml` with `plugins: memstore: allow_hosts: [...]`."""
    from datasette.app import Datasette

    from memstore.explorer.server import register_plugin

    register_plugin()
    ds = Datasette(
        [str(store / "catalog.db")],
        metadata={"plugins": {"memstore": {"allow_hosts": ["lan-box"], "refresh_interval": 0}}},
    )

    async def run():
        return [
            (await ds.client.get("/-/memstore.json", headers={"host": h})).status_code
            for h in ("lan-box:8001", "evil.example", "localhost")
        ]

    assert asyncio.run(run()) == [200, 403, 200]


# --------------------------------------------------------------------------------------------
# Bounded queries


def test_one_printf_cannot_stall_the_server(store, serve_store):
    """`printf('%.*c', 900000000, 'x')` is one function call that no time limit interrupts (it
    ran 50 s and took 900 MB): three at once are refused at once with SQLite's "too big", and a
    home page requested meanwhile is answered."""
    served = serve_store(store, "--refresh-interval", "0")
    results: dict = {}

    def get(key, path):
        started = time.monotonic()
        try:
            results[key] = (*served.request(path, timeout=40), time.monotonic() - started)
        except OSError as exc:
            results[key] = (None, repr(exc), time.monotonic() - started)

    threads = [threading.Thread(target=get, args=(n, sql_path(PRINTF))) for n in range(3)]
    threads.append(threading.Thread(target=get, args=("home", "/-/memstore.json")))
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for n in range(3):
        status, body, seconds = results[n]
        assert status == 400 and "too big" in body, (status, body[:300])
        assert seconds < 20, seconds  # generous: the query itself is refused before it runs
    status, body, seconds = results["home"]
    assert status == 200 and len(json.loads(body)["sessions"]) == 3


def test_guarded_connection_refuses_what_would_grow_or_leak(store):
    """The guards on one connection: values past the bound, printf/format's width and precision,
    ATTACH, and the store path (PRAGMA database_list in either form) outside trusted code."""
    conn = sqlite3.connect(f"file:{store / 'catalog.db'}?mode=ro", uri=True, check_same_thread=False)
    guard.guard_connection(conn)
    assert conn.execute("select printf('%5.2f|%s', 3.14159, 'ok')").fetchone()[0] == " 3.14|ok"
    assert conn.execute("select format('%d rows', 3)").fetchone()[0] == "3 rows"
    for sql in (
        PRINTF,
        "select printf('%*d', 900000000, 1)",
        "select format('%.*c', 2000000, 'x')",
        "select hex(zeroblob(2000000))",
        "select length(replace(hex(zeroblob(400000)), '0', 'aa'))",
    ):
        started = time.monotonic()
        with pytest.raises(sqlite3.DataError, match="too big"):
            conn.execute(sql).fetchall()
        assert time.monotonic() - started < 10, sql
    for sql in (
        "PRAGMA database_list",
        "select * from pragma_database_list",
        "select file from pragma_database_list()",
        f"attach '{store / 'catalog.db'}' as other",
        "select fts3_tokenizer('simple')",
        "insert into sessions (session_id) values ('x')",
    ):
        with pytest.raises(sqlite3.DatabaseError):
            conn.execute(sql).fetchall()
    with guard.trusted(conn):
        files = [row[2] for row in conn.execute("PRAGMA database_list")]
        assert str(store / "catalog.db") in files
        assert len(conn.execute("select hex(zeroblob(2000000))").fetchone()[0]) == 4_000_000
    with pytest.raises(sqlite3.DatabaseError):
        conn.execute("PRAGMA database_list").fetchall()
    conn.close()


def test_a_result_is_cut_at_its_byte_bound(store):
    """Rows of large values stop at the result bound (truncated), instead of 1,000 rows of 1 MB."""
    ds = make_datasette(store)
    sql = (
        "with recursive n(i) as (select 1 union all select i + 1 from n limit 900) "
        "select i, hex(zeroblob(500000)) as blob from n"
    )

    async def run():
        return await ds.client.get("/catalog.json?" + urllib.parse.urlencode({"sql": sql}))

    response = asyncio.run(run())
    assert response.status_code == 200, response.text[:300]
    data = response.json()
    assert data["truncated"] is True
    assert 0 < len(data["rows"]) <= guard.LIMITS.max_result_bytes // 1_000_000 + 1


# --------------------------------------------------------------------------------------------
# The store's path


def test_no_page_names_the_store_path(store):
    """/-/databases.json names the catalog by its name only, and SQL cannot read the path: a
    remote reader learns nothing of the directory the store lives in (here `home-of-alice`)."""
    ds = make_datasette(store)

    async def run():
        out = {}
        for path in (
            "/-/databases.json",
            "/-/databases",
            "/catalog.json",
            "/-/memstore.json",
            "/.json",
            sql_path("select * from pragma_database_list"),
            sql_path("PRAGMA database_list"),
            "/catalog/sessions.json?_where=" + urllib.parse.quote("1 in (select 1 from pragma_database_list)"),
        ):
            out[path] = await ds.client.get(path)
        return out

    responses = asyncio.run(run())
    for path, response in responses.items():
        assert "home-of-alice" not in response.text, path
    databases = responses["/-/databases.json"].json()
    catalog = next(d for d in databases if d["name"] == "catalog")
    assert catalog["path"] == "catalog.db"
    assert responses[sql_path("select * from pragma_database_list")].status_code == 400
    # The explorer's own pages still work (search reads the index through the path).
    assert responses["/-/memstore.json"].status_code == 200


# --------------------------------------------------------------------------------------------
# A catalog replaced while serving


def test_a_deleted_or_set_aside_catalog_is_followed(tmp_path, serve_store):
    """The refresher builds a new catalog.db when the old one is deleted or set aside; the server
    reads the new file (new sessions appear) without a restart."""
    root = tmp_path / "store"
    write_session(root, "first")
    served = serve_store(root, "--refresh-interval", "0.2")

    def sessions() -> set:
        status, body = served.request("/-/memstore.json")
        assert status in (200, 503), body[:300]
        return {s["session_id"] for s in json.loads(body).get("sessions", [])} if status == 200 else set()

    def wait_for(expected: set) -> set:
        deadline = time.monotonic() + 60
        seen = sessions()
        while seen != expected and time.monotonic() < deadline:
            time.sleep(0.3)
            seen = sessions()
        return seen

    assert wait_for({"first"}) == {"first"}
    for suffix in ("", "-wal", "-shm"):
        try:
            os.unlink(f"{root / 'catalog.db'}{suffix}")
        except FileNotFoundError:
            pass
    write_session(root, "second")
    assert wait_for({"first", "second"}) == {"first", "second"}
    # Set aside (as the catalog's own recovery does with a file SQLite cannot read).
    os.replace(root / "catalog.db", root / "catalog.db.aside")
    write_session(root, "third")
    assert wait_for({"first", "second", "third"}) == {"first", "second", "third"}
    status, body = served.request("/-/memstore/search.json?q=prompt")
    assert status == 200 and json.loads(body)["total"] >= 3


def test_a_query_stops_at_its_time_or_its_count_of_steps(store, monkeypatch):
    """The progress handler watches the clock and counts steps: with a long time limit (a
    Datasette configured so) the count still stops an endless query."""
    from memstore.explorer import database

    endless = "with recursive n(i) as (select 1 union all select i + 1 from n) select count(*) from n"
    monkeypatch.setattr(database, "MAX_STEPS_PER_SECOND", 20_000)
    ds = make_datasette(store, settings={"sql_time_limit_ms": 120_000})
    started = time.monotonic()
    response = asyncio.run(ds.client.get(sql_path(endless)))
    assert response.status_code == 400 and "too long" in response.text
    assert time.monotonic() - started < 60
    conn = sqlite3.connect(":memory:")
    started = time.monotonic()
    with database.bounded_steps(conn, 200), pytest.raises(sqlite3.OperationalError, match="interrupted"):
        conn.execute(endless).fetchone()
    assert time.monotonic() - started < 30
