"""The explorer's pages in a real Datasette (through datasette.client) over the demo store: every
page and its .json, what they show, and the read-only, escaping and traversal guarantees."""

from __future__ import annotations

import asyncio
import os
import sqlite3
from pathlib import Path

import orjson
import pytest

import memstore
from memstore.catalog import refresh_catalog
from memstore.demo import write_demo_store
from memstore.explorer import CatalogRefresher, Urls, make_datasette, quote_id, unquote_id
from memstore.explorer import data as explorer_data


def fetch(ds, *paths, method="get"):
    async def run():
        out = {}
        for path in paths:
            out[path] = await getattr(ds.client, method)(path)
        return out

    result = asyncio.run(run())
    return result if len(paths) > 1 else result[paths[0]]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("explorer") / "store"
    write_demo_store(root)
    refresh_catalog(root)
    return root


@pytest.fixture(scope="module")
def ds(store):
    return make_datasette(store)


def session_ids(store):
    conn = sqlite3.connect(store / "catalog.db")
    try:
        return [r[0] for r in conn.execute("SELECT session_id FROM sessions ORDER BY session_id")]
    finally:
        conn.close()


def tree(root: Path) -> dict:
    """Every file under the sessions directory with its size and mtime."""
    out = {}
    for dirpath, _dirs, files in os.walk(root / "sessions"):
        for name in files:
            st = os.stat(os.path.join(dirpath, name))
            out[os.path.join(dirpath, name)] = (st.st_size, st.st_mtime_ns)
    return out


# --------------------------------------------------------------------------------------------
# Every page and its JSON


def test_every_page_and_its_json_answers(ds, store):
    pages = [
        "/-/memstore",
        "/-/memstore/sessions/demo",
        "/-/memstore/sessions/demo/turns/1",
        "/-/memstore/sessions/demo/events/6",
        "/-/memstore/search?q=cargo+test",
    ]
    responses = fetch(ds, *pages, *[p.replace("?", ".json?") if "?" in p else p + ".json" for p in pages])
    for path, response in responses.items():
        assert response.status_code == 200, (path, response.text[:300])
        if ".json" in path:
            assert response.headers["content-type"].startswith("application/json")
            assert isinstance(response.json(), dict)
        else:
            assert "<html" in response.text and "memstore" in response.text


def test_home_lists_sessions_with_totals_chart_and_filters(ds, store):
    home = fetch(ds, "/-/memstore.json").json()
    conn = sqlite3.connect(store / "catalog.db")
    count, events, tokens = conn.execute(
        "SELECT count(*), sum(event_count), sum(input_tokens) FROM sessions"
    ).fetchone()
    assert home["totals"]["sessions"] == count == 30
    assert home["totals"]["events"] == events and home["totals"]["input_tokens"] == tokens
    assert len(home["sessions"]) == 30 and home["pages"] == 1
    updated = [s["updated_at"] for s in home["sessions"]]
    assert updated == sorted(updated, reverse=True)
    row = next(s for s in home["sessions"] if s["session_id"].startswith("codex-"))
    assert row["agent"] == "codex" and row["title"] == "Make clippy pass on tilecache." and row["turn_count"] == 1
    assert {a["agent"] for a in home["agents"]} == {"codex", "claude", "vtcode", "memstore"}
    assert sum(d["input_tokens"] for d in home["tokens_per_day"]) == tokens
    active = fetch(ds, "/-/memstore.json?status=active").json()
    assert active["matching"] == home["totals"]["active"] > 0
    assert all(s["status"] == "active" for s in active["sessions"])
    claude = fetch(ds, "/-/memstore.json?agent=claude").json()
    assert [s["agent"] for s in claude["sessions"]] == ["claude", "claude"]  # the session and its sub-agent
    found = fetch(ds, "/-/memstore.json?q=clippy").json()
    assert [s["session_id"] for s in found["sessions"]] == [row["session_id"]]
    by_tokens = fetch(ds, "/-/memstore.json?sort=tokens&order=asc").json()["sessions"]
    totals = [s["input_tokens"] + s["output_tokens"] for s in by_tokens]
    assert totals == sorted(totals)
    # Unknown sort keys and junk numbers fall back to defaults, never into SQL.
    odd = fetch(ds, "/-/memstore.json?sort=1;drop+table+sessions&order=sideways&page=-3").json()
    assert odd["filters"]["sort"] == "updated" and odd["page"] == 1
    html = fetch(ds, "/-/memstore").text
    assert '<svg class="ms-chart"' in html and "Tokens per day" in html
    assert 'href="/-/memstore/sessions/demo"' in html


def test_home_paginates(store):
    conn = sqlite3.connect(store / "catalog.db")
    urls = Urls()
    first = explorer_data.home_data(conn, urls, per_page=7)
    assert first["pages"] == 5 and len(first["sessions"]) == 7 and first["previous_url"] is None
    assert first["next_url"] == "/-/memstore?page=2"
    seen = [s["session_id"] for s in first["sessions"]]
    for page in range(2, 6):
        data = explorer_data.home_data(conn, urls, page=page, per_page=7)
        seen += [s["session_id"] for s in data["sessions"]]
    assert sorted(seen) == sorted(set(seen)) and len(seen) == 30
    assert explorer_data.home_data(conn, urls, page=99, per_page=7)["page"] == 5


def test_session_page_shows_manifest_timeline_progress_and_links(ds, store):
    conn = sqlite3.connect(store / "catalog.db")
    sid, turns = conn.execute(
        "SELECT session_id, turn_count FROM sessions WHERE session_id LIKE 'vt-%' ORDER BY turn_count DESC LIMIT 1"
    ).fetchone()
    data = fetch(ds, f"/-/memstore/sessions/{sid}.json").json()
    assert data["manifest"]["session_id"] == sid and data["manifest"]["turn_count"] == turns
    assert [t["number"] for t in data["turns"]] == list(range(1, turns + 1))
    assert all(t["duration_ms"] is not None and t["duration_ms"] > 0 for t in data["turns"])
    assert data["summary"]["agent"] == "vtcode" and data["activity"]
    for name, url in data["links"].items():
        if url and name not in ("json", "search", "parent"):
            response = fetch(ds, url + "&_shape=array" if "?" in url else url)
            assert response.status_code == 200, (name, url)
    rows = fetch(ds, data["links"]["turns"].replace("/catalog/turns?", "/catalog/turns.json?") + "&_shape=array").json()
    assert [r["number"] for r in rows] == list(range(1, turns + 1))
    html = fetch(ds, f"/-/memstore/sessions/{sid}").text
    assert '<svg class="ms-chart"' in html and "Timeline" in html
    # A session with a goal shows its milestones.
    with_ledger = [s for s in session_ids(store) if (store / "sessions" / s / "derived" / "progress.json").exists()]
    assert with_ledger
    progress = fetch(ds, f"/-/memstore/sessions/{with_ledger[0]}.json").json()["progress"]
    assert progress["goal"] and len(progress["milestones"]) == 4 and 0 < progress["completion"] < 100
    assert "Reproduce the problem" in fetch(ds, f"/-/memstore/sessions/{with_ledger[0]}").text


def test_session_page_paginates_turns(tmp_path):
    with memstore.open_session(tmp_path, "long", durability="none") as log:
        for _ in range(250):
            log.append({"type": "turn.started"})
            log.append({"type": "turn.completed", "usage": {"input_tokens": 10, "output_tokens": 1}})
    refresh_catalog(tmp_path)
    ds = make_datasette(tmp_path)
    first = fetch(ds, "/-/memstore/sessions/long.json").json()
    assert [t["number"] for t in first["turns"]] == list(range(1, 101)) and first["pages"] == 3
    last = fetch(ds, first["next_url"].replace("long?", "long.json?")).json()
    assert [t["number"] for t in last["turns"]][0] == 101
    third = fetch(ds, "/-/memstore/sessions/long.json?page=3").json()
    assert [t["number"] for t in third["turns"]] == list(range(201, 251)) and third["next_url"] is None


def test_turn_page_renders_events_for_reading(ds, store):
    turn = fetch(ds, "/-/memstore/sessions/demo/turns/1.json").json()
    assert turn["turn"]["status"] == "failed" and turn["turn"]["error"] == "cargo test failed: 1 test failed"
    kinds = [e["display"]["kind"] for e in turn["events"]]
    assert kinds == ["lifecycle", "message", "tool", "tool_output", "command", "error"]
    command = turn["events"][4]["display"]
    assert command["command"] == "cargo test" and command["exit_code"] == 101 and command["tone"] == "error"
    assert "append_roundtrip" in command["output"]["text"]
    html = fetch(ds, "/-/memstore/sessions/demo/turns/1").text
    assert "$ cargo test" in html and "exit 101" in html and 'id="e6"' in html
    assert 'href="/-/memstore/sessions/demo/events/6"' in html
    fix = fetch(ds, "/-/memstore/sessions/demo/turns/2").text
    assert 'class="dl diff-add">+        self.count += 1;' in fix
    assert fetch(ds, "/-/memstore/sessions/demo/turns/9").status_code == 404
    assert fetch(ds, "/-/memstore/sessions/demo/turns/0.json").status_code == 404


def test_turn_pages_show_the_demo_scenarios(ds, store):
    """Compaction, denied tools, aborted and failed turns, imported sessions: each renders."""
    conn = sqlite3.connect(store / "catalog.db")

    def first(sql):
        row = conn.execute(sql).fetchone()
        assert row is not None, sql
        return row

    sid, number = first("SELECT session_id, turn FROM events WHERE type = 'thread.compact_boundary'")
    html = fetch(ds, f"/-/memstore/sessions/{quote_id(sid)}/turns/{number}").text
    assert "Context compacted" in html and "tokens before" in html
    sid, number = first("SELECT session_id, number FROM turns WHERE status = 'aborted' LIMIT 1")
    assert "Turn aborted" in fetch(ds, f"/-/memstore/sessions/{quote_id(sid)}/turns/{number}").text
    sid, number = first("SELECT session_id, turn FROM events WHERE type = 'permission.resolved' AND status = 'deny'")
    html = fetch(ds, f"/-/memstore/sessions/{quote_id(sid)}/turns/{number}").text
    assert "Permission deny: run_pty_cmd" in html and "git push --force" in html
    sid, number = first("SELECT session_id, turn FROM events WHERE status = 'declined'")
    assert sid.startswith("claude-") and "declined" in fetch(ds, f"/-/memstore/sessions/{sid}/turns/{number}").text
    sid = first("SELECT session_id FROM sessions WHERE agent = 'codex'")[0]
    html = fetch(ds, f"/-/memstore/sessions/{sid}/turns/1").text
    assert "cargo clippy" in html and "src/eviction.rs" in html
    assert first("SELECT count(*) FROM turns WHERE status = 'failed'")[0] >= 3


def test_turn_page_paginates_a_big_turn(tmp_path):
    with memstore.open_session(tmp_path, "big", durability="none") as log:
        log.append({"type": "turn.started"})
        for i in range(449):
            log.append(
                {"type": "item.completed", "item": {"id": f"m{i}", "type": "agent_message", "text": f"step {i}"}}
            )
        log.append({"type": "turn.completed", "usage": {}})
    refresh_catalog(tmp_path)
    ds = make_datasette(tmp_path)
    page = fetch(ds, "/-/memstore/sessions/big/turns/1.json").json()
    assert [e["seq"] for e in page["events"]] == list(range(1, 201)) and page["first_page"]
    assert page["next_url"] == "/-/memstore/sessions/big/turns/1?start=201"
    page = fetch(ds, "/-/memstore/sessions/big/turns/1.json?start=401").json()
    assert [e["seq"] for e in page["events"]] == list(range(401, 452)) and page["next_url"] is None
    assert page["events"][-1]["type"] == "turn.completed"
    assert fetch(ds, "/-/memstore/sessions/big/turns/1.json?start=99999").status_code == 404


def test_event_page_is_the_exact_line_read_at_its_offset(ds, store):
    data = fetch(ds, "/-/memstore/sessions/demo/events/6.json").json()
    raw = (store / "sessions" / "demo" / "events.jsonl").read_bytes()
    assert raw[data["offset"] : data["offset"] + data["length"]].decode() == data["line"]
    assert data["line"].endswith("\n") and orjson.loads(data["line"])["seq"] == 6
    assert data["turn"] == 1 and data["envelope"]["event"]["item"]["command"] == "cargo test"
    assert data["turn_url"] == "/-/memstore/sessions/demo/turns/1#e6"
    html = fetch(ds, "/-/memstore/sessions/demo/events/6").text
    assert "&#34;command&#34;:&#34;cargo test&#34;" in html or "&quot;command&quot;:&quot;cargo test&quot;" in html
    assert fetch(ds, "/-/memstore/sessions/demo/events/999.json").status_code == 404
    assert fetch(ds, "/-/memstore/sessions/demo/events/0").status_code == 404
    assert fetch(ds, "/-/memstore/sessions/demo/events/99999999999999999999").status_code == 404


def test_search_page_links_results_to_turns_and_events(ds, store):
    data = fetch(ds, "/-/memstore/search.json?q=append_roundtrip").json()
    assert data["results"] and data["engine"] in ("bm25", "fts5")
    top = data["results"][0]
    assert top["session_id"] == "demo" and top["turn_url"].startswith("/-/memstore/sessions/demo/turns/")
    assert top["event_url"] == f"/-/memstore/sessions/demo/events/{top['seq']}"
    assert any(p["hit"] for p in top["snippet_parts"])
    for url in (top["turn_url"].split("#")[0], top["event_url"], top["session_url"]):
        assert fetch(ds, url).status_code == 200
    html = fetch(ds, "/-/memstore/search?q=append_roundtrip").text
    assert "<mark>append</mark>_<mark>roundtrip</mark>" in html
    only = fetch(ds, "/-/memstore/search.json?q=cargo&session=demo").json()
    assert only["results"] and {r["session_id"] for r in only["results"]} == {"demo"}
    assert fetch(ds, "/-/memstore/search.json?q=").json()["results"] == []
    hostile = fetch(ds, "/-/memstore/search.json?q=%22NEAR(+OR+*+%29+AND").json()
    assert isinstance(hostile["results"], list)


# --------------------------------------------------------------------------------------------
# Guarantees: escaping, traversal, read-only


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile")
    sid = 'x"><script>alert(1)</script>'
    with memstore.open_session(root, sid) as log:
        log.append({"type": "thread.started", "thread_id": sid, "source": {"agent": "<img src=x onerror=alert(2)>"}})
        log.append({"type": "turn.started"})
        log.append(
            {
                "type": "item.completed",
                "item": {"id": "u", "type": "user_message", "text": "<script>alert('prompt')</script> please"},
            }
        )
        log.append(
            {
                "type": "item.completed",
                "item": {
                    "id": "c",
                    "type": "command_execution",
                    "command": "echo '<b>bold</b>'",
                    "aggregated_output": "</pre><script>alert(3)</script>",
                    "exit_code": 0,
                    "status": "completed",
                },
            }
        )
        log.append({"type": "turn.completed", "usage": {}, "model": "<svg onload=alert(4)>"})
    outside = root.parent / "secret.txt"
    outside.write_text("TOP SECRET\n")
    refresh_catalog(root)
    return root, sid


def test_event_text_is_escaped_everywhere(hostile):
    root, sid = hostile
    ds = make_datasette(root)
    q = quote_id(sid)
    pages = [
        "/-/memstore",
        f"/-/memstore/sessions/{q}",
        f"/-/memstore/sessions/{q}/turns/1",
        f"/-/memstore/sessions/{q}/events/3",
        f"/-/memstore/sessions/{q}/events/4",
        "/-/memstore/search?q=script+alert",
    ]
    for path, response in fetch(ds, *pages).items():
        assert response.status_code == 200, path
        body = response.text
        assert "<script>alert" not in body and "<img src=x" not in body and "<svg onload" not in body, path
        assert "<b>bold</b>" not in body
    assert "&lt;script&gt;alert(&#39;prompt&#39;)&lt;/script&gt;" in fetch(ds, f"/-/memstore/sessions/{q}/turns/1").text
    assert fetch(ds, f"/-/memstore/sessions/{q}.json").json()["session_id"] == sid


@pytest.mark.parametrize(
    "path",
    [
        "/-/memstore/sessions/..%2F..%2Fsecret.txt",
        "/-/memstore/sessions/..%2Fsecret.txt/turns/1",
        "/-/memstore/sessions/%2E%2E/events/1",
        "/-/memstore/sessions/..",
        "/-/memstore/sessions/../turns/1",
        "/-/memstore/sessions/./events/1",
        "/-/memstore/sessions/%2E",
        "/-/memstore/sessions/%00/turns/1",
        "/-/memstore/sessions/%FF%FE/turns/1",
        "/-/memstore/sessions/" + "a" * 2000,
        "/-/memstore/sessions/nope.json",
        "/-/memstore/sessions/%2Fetc%2Fpasswd/events/1",
    ],
)
def test_ids_are_validated_and_traversal_is_a_404(hostile, path):
    root, _sid = hostile
    ds = make_datasette(root)
    # Sent as the raw path, past any client-side normalization of dot segments.
    status, body = raw_get(ds, path)
    assert status == 404, path
    assert b"TOP SECRET" not in body and b"root:" not in body


def raw_get(ds, raw_path: str) -> tuple[int, bytes]:
    """GET ``raw_path`` exactly as given (an HTTP client would resolve ``..`` segments)."""
    app = ds.app()
    sent = []

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)

    from urllib.parse import unquote_to_bytes

    scope = {
        "type": "http",
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "root_path": "",
        "path": unquote_to_bytes(raw_path).decode("utf-8", "replace"),
        "raw_path": raw_path.encode("ascii"),
        "query_string": b"",
        "headers": [(b"host", b"localhost")],
        "client": ("127.0.0.1", 1),
        "server": ("localhost", 80),
    }
    asyncio.run(app(scope, receive, send))
    start = next(m for m in sent if m["type"] == "http.response.start")
    return start["status"], b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")


def test_a_symlinked_session_directory_is_not_followed(hostile, tmp_path):
    root, _sid = hostile
    other = tmp_path / "elsewhere"
    with memstore.open_session(other, "real") as log:
        log.append({"type": "turn.started"})
        log.append({"type": "turn.completed", "usage": {}})
    link = root / "sessions" / "linked"
    link.symlink_to(other / "sessions" / "real")
    try:
        ds = make_datasette(root)
        for path in (
            "/-/memstore/sessions/linked",
            "/-/memstore/sessions/linked/turns/1",
            "/-/memstore/sessions/linked/events/1",
        ):
            assert fetch(ds, path).status_code == 404, path
    finally:
        link.unlink()


def test_ids_round_trip_through_urls():
    for sid in ("plain-id", "a/b c", "x.json", "é:ü?#&%", "..x"):
        assert unquote_id(quote_id(sid)) == sid
        assert "/" not in quote_id(sid) and not quote_id(sid).endswith(".json")


def test_odd_session_ids_have_working_pages(tmp_path):
    ids = ["a/b c", "report.json", "ümlaut?#"]
    for sid in ids:
        with memstore.open_session(tmp_path, sid) as log:
            log.append({"type": "turn.started"})
            log.append({"type": "turn.completed", "usage": {}})
    refresh_catalog(tmp_path)
    ds = make_datasette(tmp_path)
    home = fetch(ds, "/-/memstore.json").json()
    for row in home["sessions"]:
        page = fetch(ds, row["url"] + ".json" if not row["url"].endswith("%2Ejson") else row["url"] + ".json")
        assert page.status_code == 200 and page.json()["session_id"] == row["session_id"]
        assert fetch(ds, row["url"]).status_code == 200
    assert {r["session_id"] for r in home["sessions"]} == set(ids)


def test_pages_write_nothing_and_sql_stays_read_only(ds, store):
    before = tree(store)
    catalog_before = (store / "catalog.db").stat().st_mtime_ns
    ids = session_ids(store)[:5]
    fetch(
        ds,
        "/-/memstore",
        "/-/memstore/search?q=test",
        *[f"/-/memstore/sessions/{quote_id(s)}" for s in ids],
        *[f"/-/memstore/sessions/{quote_id(s)}/turns/1" for s in ids],
        *[f"/-/memstore/sessions/{quote_id(s)}/events/2" for s in ids],
    )
    assert tree(store) == before
    assert (store / "catalog.db").stat().st_mtime_ns == catalog_before
    for sql in (
        "attach database 'x.db' as x",
        "insert into sessions (session_id) values ('x')",
        "pragma journal_mode=delete",
        "delete from sessions",
        "select * from pragma_database_list; drop table x",
    ):
        response = fetch(ds, "/catalog.json?sql=" + sql.replace(" ", "+"))
        assert response.status_code in (400, 403) or response.json().get("ok") is False, sql
    assert fetch(ds, "/catalog.json?sql=select+count(*)+from+sessions&_shape=array").status_code == 200
    # Even past Datasette's SQL checks, the connection refuses to attach or write.
    conn = sqlite3.connect(f"file:{store / 'catalog.db'}?mode=ro", uri=True)
    from memstore.explorer.app import guard_connection

    guard_connection(conn, "catalog", ds)
    with pytest.raises(sqlite3.DatabaseError):
        conn.execute(f"ATTACH DATABASE '{store / 'catalog.db'}' AS again")
    with pytest.raises(sqlite3.OperationalError):
        conn.execute("CREATE TEMP TABLE t (x)")
    for method in ("post", "put", "delete"):
        assert fetch(ds, "/-/memstore/sessions/demo", method=method).status_code in (403, 404, 405)


def test_empty_store_and_no_catalog(tmp_path):
    refresh_catalog(tmp_path)
    ds = make_datasette(tmp_path)
    home = fetch(ds, "/-/memstore.json").json()
    assert home["totals"]["sessions"] == 0 and home["sessions"] == [] and home["tokens_per_day"] == []
    assert "No sessions in this store yet" in fetch(ds, "/-/memstore").text
    assert fetch(ds, "/-/memstore/search?q=anything").status_code == 200
    from datasette.app import Datasette

    other = tmp_path / "other.db"
    sqlite3.connect(other).execute("CREATE TABLE t (x)").connection.close()
    plain = Datasette([str(other)])
    assert fetch(plain, "/-/memstore").status_code == 404
    assert fetch(plain, "/other/t.json").status_code == 200


def test_background_refresh_shows_new_sessions(tmp_path):
    with memstore.open_session(tmp_path, "first") as log:
        log.append({"type": "turn.started"})
    refresh_catalog(tmp_path)
    refresher = CatalogRefresher(tmp_path, interval=0.05)
    ds = make_datasette(tmp_path, refresher=refresher)
    refresher.start()
    try:
        with memstore.open_session(tmp_path, "second") as log:
            log.append({"type": "turn.started"})
        fetch(ds, "/-/memstore")  # a request pokes the refresher; it does not wait for it
        for _ in range(200):
            ids = {s["session_id"] for s in fetch(ds, "/-/memstore.json").json()["sessions"]}
            if "second" in ids:
                break
            asyncio.run(asyncio.sleep(0.05))
        assert ids == {"first", "second"}
    finally:
        refresher.stop()
    assert refresher.refreshes >= 1 and refresher.last_error is None


def test_charts_are_inline_svg_with_escaped_text():
    from memstore.explorer.charts import Bar, bar_chart

    svg = str(
        bar_chart(
            [Bar("<x>", [(5, "ok")], tooltip="</title><script>", href='/a"b')],
            title="t&t",
            y_unit="<tokens>",
            x_unit="day & night",
        )
    )
    assert svg.startswith("<svg") and "<script>" not in svg and "&lt;x&gt;" in svg and "t&amp;t" in svg
    assert "&lt;tokens&gt;" in svg and "day &amp; night" in svg
    assert 'href="/a&#34;b"' in svg
    assert "http://www.w3.org/2000/svg" in svg and "https://" not in svg
