"""``memstore mcp`` driven by the MCP SDK's own client over stdio, the server a real subprocess:
an agent searches, reads sessions and turns (paging long outputs), lists a repository's
sessions and facts, runs read-only SQL, is refused every write and every hostile argument with
a clear error, and never sees a secret."""

from __future__ import annotations

import hashlib
import json
import re
import sqlite3
import subprocess
import sys
from decimal import Decimal

import orjson
import pytest
from mcp_support import (
    LEDGER,
    LEDGER_CWD,
    LONG_OUTPUT,
    SECRETS,
    SECRETS_SESSION,
    STRADDLING_TOKEN,
    TILECACHE,
    TILECACHE_CORE,
    TILECACHE_CWD,
    TILECACHE_OLD,
    McpSession,
    StoreInfo,
)

import memstore
from memstore import redact
from memstore.pricing import CostSource, turn_cost
from memstore.views.memory_view import session_memory_facts

TOOL_NAMES = {"search", "get_session", "get_turn", "get_event", "recent_sessions", "memory_facts", "sql_query"}


def test_lists_seven_read_only_tools_with_bounded_schemas(mcp: McpSession):
    """Every tool is listed with a description, a closed JSON schema whose every integer has
    bounds and every string a maximum length, and read-only annotations."""
    tools = {tool.name: tool for tool in mcp.list_tools()}
    assert set(tools) == TOOL_NAMES
    for tool in tools.values():
        assert tool.description and len(tool.description) < 1_200, tool.name
        schema = tool.input_schema
        assert schema["type"] == "object" and schema["additionalProperties"] is False, tool.name
        for name, spec in schema["properties"].items():
            if spec["type"] == "integer":
                assert "minimum" in spec and "maximum" in spec, (tool.name, name)
            if spec["type"] == "string":
                assert "maxLength" in spec or "enum" in spec, (tool.name, name)
        assert tool.annotations.read_only_hint is True and tool.annotations.destructive_hint is False


def test_search_finds_where_it_happened_and_says_how_to_fetch_it(mcp: McpSession):
    """A hit names its session, turn and seq, shows a snippet with the words searched, and its
    ``fetch`` call works."""
    found = mcp.ok("search", {"query": "next cursor missing paginator", "limit": 5})
    assert found["count"] >= 1
    hit = found["results"][0]
    assert hit["session_id"] == LEDGER and hit["turn"] == 1 and hit["agent"] == "codex" and hit["cwd"] == LEDGER_CWD
    assert re.search(r"cursor|paginator", hit["snippet"], re.I)
    assert hit["fetch"] == f'get_turn(session_id="{LEDGER}", turn=1)'
    turn = mcp.ok("get_turn", {"session_id": hit["session_id"], "turn": hit["turn"]})
    assert hit["seq"] in [entry["seq"] for entry in turn["events"]]


def _all_hits(mcp: McpSession, query: str, **filters) -> list[tuple[str, int]]:
    found = mcp.ok("search", {"query": query, "limit": 50, **filters})
    return [(hit["session_id"], hit["seq"]) for hit in found["results"]]


def test_search_filters_by_repository_agent_and_dates(mcp: McpSession):
    """The cwd, agent, since and until filters give exactly the unfiltered hits of the sessions
    and times they allow, in the same order: a subdirectory counts as the repository, a
    directory that merely starts with the same name does not."""
    everything = mcp.ok("search", {"query": "cargo test eviction", "limit": 50})["results"]
    assert {h["session_id"] for h in everything} >= {TILECACHE, TILECACHE_CORE, TILECACHE_OLD}

    def expect(keep) -> list[tuple[str, int]]:
        return [(h["session_id"], h["seq"]) for h in everything if keep(h)]

    in_repo = _all_hits(mcp, "cargo test eviction", cwd=TILECACHE_CWD)
    assert in_repo == expect(lambda h: h["session_id"] in (TILECACHE, TILECACHE_CORE)) and in_repo
    assert _all_hits(mcp, "cargo test eviction", agent="codex") == expect(lambda h: h["agent"] == "codex")
    assert _all_hits(mcp, "cargo test eviction", since="2026-11-20") == expect(
        lambda h: h["created_at"] is not None and h["created_at"] >= "2026-11-20"
    )
    assert _all_hits(mcp, "cargo test eviction", until="2026-11-20") == expect(
        lambda h: h["created_at"] is not None and h["created_at"] < "2026-11-21"
    )
    assert _all_hits(mcp, "cargo test eviction", until="2026-11-20T13:31:00Z", cwd=TILECACHE_CWD + "/") == expect(
        lambda h: h["session_id"] in (TILECACHE, TILECACHE_CORE) and (h["created_at"] or "9") < "2026-11-20T13:31:00"
    )
    assert _all_hits(mcp, "cargo test eviction", agent="nobody") == []


def test_search_pages_with_offset(mcp: McpSession):
    """Two pages of two hits are the first four hits; the first page says how to get the next."""
    first = mcp.ok("search", {"query": "cargo test", "limit": 2})
    assert first["next"] == 'search(query="cargo test", limit=2, offset=2)'
    second = mcp.ok("search", {"query": "cargo test", "limit": 2, "offset": 2})
    four = mcp.ok("search", {"query": "cargo test", "limit": 4})
    assert first["results"] + second["results"] == four["results"]


def test_get_session_gives_turns_with_prompts_tokens_and_cost(mcp: McpSession, store: StoreInfo):
    """Each turn's prompt, status, model and tokens are the ones written; its cost is what
    memstore.pricing makes of its end event (estimated, with the price version), and the total
    is the sum of the turns."""
    session = mcp.ok("get_session", {"session_id": LEDGER})
    assert (session["agent"], session["cwd"], session["git_branch"]) == ("codex", LEDGER_CWD, "feature/pagination")
    assert [t["turn"] for t in session["turns"]] == [1, 2] and session["next"] is None
    assert session["turns"][0]["prompt"].startswith("Add cursor pagination to the list endpoint")
    assert session["turns"][1]["prompt"] == "Go ahead and fix it, then run the whole suite."
    ends = store.turn_ends[LEDGER]
    for shown, end in zip(session["turns"], ends):
        expected = turn_cost(end, provider_hint="codex", provider="openai", when=shown["ended_at"])
        assert shown["status"] == "completed" and shown["model"] == "gpt-5-codex"
        assert shown["tokens"] == {
            "input": end["usage"]["input_tokens"],
            "cached_input": end["usage"]["cached_input_tokens"],
            "cache_creation": 0,
            "output": end["usage"]["output_tokens"],
        }
        assert shown["cost"]["source"] == "estimated" and shown["cost"]["usd"] == float(expected.usd) > 0
    total = session["cost"]
    assert total["source"] == "estimated" and total["complete"] and total["price_versions"]
    assert total["usd"] == pytest.approx(sum(t["cost"]["usd"] for t in session["turns"]))
    assert session["tokens"]["input"] == 113_000 and session["tokens"]["output"] == 3_900


def test_get_session_says_where_each_cost_comes_from(mcp: McpSession):
    """A cost the agent reported is reported, a failed turn is still priced, and a model no
    price table knows is unpriced (no dollar figure, never 0), which makes the total incomplete."""
    tilecache = mcp.ok("get_session", {"session_id": TILECACHE})
    failed, reported = tilecache["turns"]
    assert failed["status"] == "failed" and failed["error"] == "cargo test failed: 1 test failed"
    assert failed["cost"]["source"] == "estimated" and failed["cost"]["usd"] > 0
    assert reported["cost"]["source"] == "reported" and reported["cost"]["usd"] == 0.0412
    assert tilecache["cost"]["reported_usd"] == 0.0412 and tilecache["cost"]["complete"]
    core = mcp.ok("get_session", {"session_id": TILECACHE_CORE})
    assert core["turns"][0]["cost"]["source"] == "unpriced" and core["turns"][0]["cost"]["usd"] is None
    assert core["cost"]["complete"] is False and core["cost"]["unpriced_models"] == ["mystery-model-9"]


def test_get_session_pages_through_turns(mcp: McpSession):
    """from_turn and limit page through the turns; the page says where the next one starts."""
    first = mcp.ok("get_session", {"session_id": SECRETS_SESSION, "limit": 10})
    assert [t["turn"] for t in first["turns"]] == list(range(1, 11))
    assert first["next"] == f'get_session(session_id="{SECRETS_SESSION}", from_turn=11, limit=10)'
    second = mcp.ok("get_session", {"session_id": SECRETS_SESSION, "from_turn": 11, "limit": 10})
    assert [t["turn"] for t in second["turns"]] == list(range(11, 21))
    assert second["cost"] == first["cost"]  # totals are the session's, whatever the page


def test_get_turn_cuts_a_long_output_and_get_event_pages_through_it(mcp: McpSession):
    """A command output longer than max_chars is cut with the get_event call that returns the
    rest; following ``next`` from there gives back the whole output, exactly."""
    turn = mcp.ok("get_turn", {"session_id": LEDGER, "turn": 1, "max_chars": 500})
    assert turn["status"] == "completed" and turn["event_count"] == 6 and turn["next"] is None
    command = next(e for e in turn["events"] if e["event"].get("item", {}).get("type") == "command_execution")
    shown = command["event"]["item"]["aggregated_output"]
    assert shown.startswith(LONG_OUTPUT[:500]) and len(LONG_OUTPUT) > 20_000
    call = re.search(r"get_event\((.*)\)\]$", shown).group(1)
    assert call == f'session_id="{LEDGER}", seq={command["seq"]}, field="/item/aggregated_output", offset=500'
    text, offset, pages = LONG_OUTPUT[:500], 500, 0
    while offset is not None:
        page = mcp.ok(
            "get_event",
            {
                "session_id": LEDGER,
                "seq": command["seq"],
                "field": "/item/aggregated_output",
                "offset": offset,
                "max_chars": 8_000,
            },
        )
        assert page["total_chars"] == len(LONG_OUTPUT) and page["offset"] == offset
        text += page["text"]
        pages += 1
        offset = offset + len(page["text"]) if page["next"] else None
    assert text == LONG_OUTPUT and pages == -(-(len(LONG_OUTPUT) - 500) // 8_000)


def test_get_turn_pages_through_events(mcp: McpSession):
    """offset and limit page through a turn's events, in log order, without gaps."""
    whole = mcp.ok("get_turn", {"session_id": LEDGER, "turn": 2})
    first = mcp.ok("get_turn", {"session_id": LEDGER, "turn": 2, "limit": 2})
    assert first["next"] == f'get_turn(session_id="{LEDGER}", turn=2, offset=2, limit=2, max_chars=1500)'
    rest = mcp.ok("get_turn", {"session_id": LEDGER, "turn": 2, "offset": 2, "limit": 10})
    assert first["events"] + rest["events"] == whole["events"]
    assert [e["event"]["type"] for e in whole["events"]][0] == "turn.started"


def test_recent_sessions_of_a_repository(mcp: McpSession):
    """Sessions in the directory or below it, newest first; not a directory that merely shares
    its name's prefix; ``since`` and ``agent`` narrow it."""
    listed = mcp.ok("recent_sessions", {"cwd": TILECACHE_CWD})
    assert [s["session_id"] for s in listed["sessions"]] == [TILECACHE_CORE, TILECACHE]
    assert listed["sessions"][1]["title"].startswith("cargo test fails in eviction")
    assert listed["sessions"][0]["fetch"] == f'get_session(session_id="{TILECACHE_CORE}")'
    everyone = mcp.ok("recent_sessions", {})
    assert [s["session_id"] for s in everyone["sessions"]][:2] == [SECRETS_SESSION, TILECACHE_CORE]
    assert len(everyone["sessions"]) == 5
    assert [s["session_id"] for s in mcp.ok("recent_sessions", {"agent": "codex"})["sessions"]] == [
        LEDGER,
        TILECACHE_OLD,
    ]
    assert [
        s["session_id"] for s in mcp.ok("recent_sessions", {"since": "2026-11-21", "cwd": TILECACHE_CWD})["sessions"]
    ] == [TILECACHE_CORE]
    page = mcp.ok("recent_sessions", {"limit": 2, "offset": 2})
    assert [s["session_id"] for s in page["sessions"]] == [s["session_id"] for s in everyone["sessions"][2:4]]


def test_memory_facts_are_the_memory_views(mcp: McpSession, store: StoreInfo):
    """A session's facts are its memory view's, in order; filters by repository work."""
    facts = mcp.ok("memory_facts", {"session_id": TILECACHE})
    expected = session_memory_facts(store.root, TILECACHE)
    assert [(f["fact"], f["source"]) for f in facts["facts"]] == [(f["fact"], f["source"]) for f in expected]
    assert any("Rust 1.82" in f["fact"] for f in facts["facts"])
    in_repo = mcp.ok("memory_facts", {"cwd": TILECACHE_CWD})["facts"]
    assert in_repo and {f["session_id"] for f in in_repo} == {TILECACHE}


def _catalog_digest(store: StoreInfo) -> tuple[str, int]:
    conn = sqlite3.connect(f"file:{store.root / 'catalog.db'}?mode=ro", uri=True)
    try:
        dump = "\n".join(conn.iterdump())
        sessions = conn.execute("SELECT count(*) FROM sessions").fetchone()[0]
    finally:
        conn.close()
    return hashlib.sha256(dump.encode()).hexdigest(), sessions


def test_sql_answers_read_only_queries_within_bounds(mcp: McpSession, store: StoreInfo):
    """A SELECT answers as SQLite does; a huge LIMIT is cut at max_rows and says so; every
    write, ATTACH and pragma that sets something is refused with a clear error and changes
    nothing; a max_rows past the bound is refused."""
    by_agent = mcp.ok("sql_query", {"sql": "SELECT agent, count(*) AS n FROM sessions GROUP BY agent ORDER BY agent"})
    assert by_agent["columns"] == ["agent", "n"]
    assert by_agent["rows"] == [["claude", 2], ["codex", 2], ["vtcode", 1]] and by_agent["truncated"] is None
    failed = mcp.ok(
        "sql_query",
        {"sql": "SELECT session_id, command FROM commands WHERE failed AND session_id = ?", "params": [TILECACHE]},
    )
    assert failed["rows"] == [[TILECACHE, "cargo test"]]
    clamped = mcp.ok(
        "sql_query", {"sql": "SELECT seq FROM events ORDER BY session_id, seq LIMIT 1000000000", "max_rows": 5}
    )
    assert clamped["row_count"] == 5 and clamped["truncated"] == "rows" and "LIMIT/OFFSET" in clamped["note"]
    before = _catalog_digest(store)
    for sql, words in [
        ("DELETE FROM sessions", "DELETE is not allowed"),
        ("UPDATE turns SET status = 'completed'", "UPDATE is not allowed"),
        ("WITH x AS (SELECT 1) INSERT INTO file_changes (session_id) SELECT * FROM x", "would write"),
        ("DROP TABLE events", "DROP is not allowed"),
        (f"ATTACH DATABASE '{store.root / 'other.db'}' AS other", "ATTACH"),
        (f"VACUUM INTO '{store.root / 'copy.db'}'", "VACUUM is not allowed"),
        ("PRAGMA query_only = 0", "PRAGMA query_only is not allowed"),
        ("SELECT 1; DELETE FROM sessions", "only one statement"),
        ("SELECT text FROM main.chunks", "readable only as redacted"),
        ("SELECT * FROM search_postings", "not readable through SQL"),
    ]:
        message = mcp.error("sql_query", {"sql": sql})
        assert words in message, (sql, message)
    assert _catalog_digest(store)[1] == before[1] == 5
    assert not (store.root / "other.db").exists() and not (store.root / "copy.db").exists()
    assert "max_rows must be from 1 to 1000" in mcp.error("sql_query", {"sql": "SELECT 1", "max_rows": 10**12})


def test_sql_stops_a_runaway_query_quickly(mcp: McpSession):
    """printf('%.*c', 900000000, 'x') is refused before it runs (SQLite would loop for seconds
    and return NULL), with an error that says why."""
    message = mcp.error("sql_query", {"sql": "SELECT printf('%.*c', 900000000, 'x')"})
    assert "printf()/format() could produce about 900000" in message and "limit" in message


@pytest.mark.parametrize(
    "tool, arguments, words",
    [
        ("get_session", {"session_id": "../../../etc/passwd"}, "looks like a path"),
        ("get_turn", {"session_id": "/etc/passwd", "turn": 1}, "looks like a path"),
        ("get_session", {"session_id": "..\\..\\boot.ini"}, "looks like a path"),
        ("get_session", {"session_id": ".."}, "invalid session id"),
        ("get_session", {"session_id": "x" * 1025}, "at most 1024"),
        ("get_session", {"session_id": "no-such-session"}, "no session 'no-such-session'"),
        ("get_session", {}, "session_id is required"),
        ("get_turn", {"session_id": LEDGER, "turn": 99}, "has no turn 99; it holds turns 1 to 2"),
        ("get_turn", {"session_id": LEDGER, "turn": "1"}, "turn must be an integer"),
        ("get_turn", {"session_id": LEDGER, "turn": 1, "limit": 10**9}, "limit must be from 1 to 200"),
        ("get_turn", {"session_id": LEDGER, "turn": 1, "offset": -1}, "offset must be from 0"),
        ("get_turn", {"session_id": LEDGER, "turn": True}, "turn must be an integer"),
        ("get_event", {"session_id": LEDGER, "seq": 10**6}, "has no event with seq 1000000"),
        ("get_event", {"session_id": LEDGER, "seq": 4, "field": "/item/nothing"}, "is not in this event"),
        ("get_event", {"session_id": LEDGER, "seq": 4, "field": "item"}, "JSON Pointer"),
        ("search", {"query": "cargo", "limit": 100_000}, "limit must be from 1 to 50"),
        ("search", {"query": "cargo", "since": "last tuesday"}, "since must be a date"),
        ("search", {"query": "cargo", "until": "2026-13-45"}, "until must be a date"),
        ("search", {"query": "cargo", "cwd": "src/tilecache"}, "cwd must be an absolute path"),
        ("search", {"query": "!!! ???"}, "no words to look for"),
        ("search", {"query": "cargo", "source": "everything"}, "source must be one of event, session"),
        ("search", {"query": "cargo", "sql": "DROP TABLE x"}, "unknown argument 'sql'"),
        ("search", {"query": "q" * 1001}, "at most 1000"),
        ("recent_sessions", {"limit": 0}, "limit must be from 1 to 100"),
        ("sql_query", {"sql": "SELECT ?", "params": [{"a": 1}]}, "must be a string, a number"),
        ("drop_everything", {}, "unknown tool 'drop_everything'"),
    ],
)
def test_hostile_arguments_get_a_clear_error(mcp: McpSession, tool, arguments, words):
    """Each bad argument is a tool error naming what is wrong; the server keeps serving."""
    message = mcp.error(tool, arguments)
    assert words in message, message
    assert mcp.ok("get_session", {"session_id": TILECACHE_OLD})["turn_count"] == 1


def _strings(value) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for item in value.values() for s in _strings(item)]
    if isinstance(value, list):
        return [s for item in value for s in _strings(item)]
    return []


def _contains_secret(text: str) -> list[str]:
    """The corpus secrets ``text`` shows: whole, JSON-escaped, or a long piece of their middle."""
    leaked = []
    for secret in SECRETS:
        escaped = orjson.dumps(secret).decode()[1:-1]
        middle = secret[len(secret) // 2 - 8 : len(secret) // 2 + 8] if len(secret) >= 24 else None
        if secret in text or escaped in text or (middle is not None and middle in text):
            leaked.append(secret)
    return leaked


def test_no_tool_output_contains_a_secret(mcp: McpSession, store: StoreInfo):
    """A session holding every secret of the corpus (prompts, commands, outputs, tool calls,
    file changes, memory facts) is read through every tool, searched for the secrets' own
    words, queried with SQL that takes text apart: no output shows any secret, and the
    redaction markers show where they were."""
    outputs: list[str] = []

    def take(name: str, arguments: dict) -> dict:
        text, is_error = mcp.call(name, arguments)
        assert not is_error, text
        answer = json.loads(text)
        if name == "search":  # the caller's own words, echoed back, are not a leak
            del answer["query"], answer["next"]
        outputs.append(json.dumps(answer, ensure_ascii=False))
        return answer

    session = take("get_session", {"session_id": SECRETS_SESSION, "limit": 200})
    for turn in session["turns"]:
        shown = take("get_turn", {"session_id": SECRETS_SESSION, "turn": turn["turn"], "max_chars": 100})
        for entry in shown["events"]:
            take("get_event", {"session_id": SECRETS_SESSION, "seq": entry["seq"]})
            take("get_event", {"session_id": SECRETS_SESSION, "seq": entry["seq"], "max_chars": 100})
        for seq, field, offset in re.findall(r'seq=(\d+), field="([^"]+)", offset=(\d+)', "\n".join(_strings(shown))):
            take(
                "get_event",
                {
                    "session_id": SECRETS_SESSION,
                    "seq": int(seq),
                    "field": field,
                    "offset": int(offset),
                    "max_chars": 100,
                },
            )
    words = {w for secret in SECRETS for w in re.findall(r"[A-Za-z0-9]{4,}", secret)}
    for query in sorted(words)[:80] + ["password token key secret api", "export AWS", "Authorization Bearer"]:
        take("search", {"query": query, "limit": 50, "session_id": SECRETS_SESSION})
    take("memory_facts", {"session_id": SECRETS_SESSION})
    take("recent_sessions", {})
    for sql in [
        "SELECT text FROM chunks WHERE session_id = ?",
        "SELECT substr(text, 1, 60), substr(text, 61, 60), hex(text) FROM chunks WHERE session_id = ?",
        "SELECT command FROM commands WHERE session_id = ?",
        "SELECT name, count(*) FROM events WHERE session_id = ? GROUP BY name",
        "SELECT title FROM sessions WHERE session_id = ?",
    ]:
        take("sql_query", {"sql": sql, "params": [SECRETS_SESSION], "max_rows": 1000})
    for secret in SECRETS[:10]:
        probe = take("sql_query", {"sql": "SELECT count(*) FROM chunks WHERE instr(text, ?) > 0", "params": [secret]})
        assert probe["rows"] == [[0]]  # SQL cannot even test for a secret
    everything = "\n".join(outputs)
    assert _contains_secret(everything) == []
    assert everything.count("[REDACTED:") > 100


def test_a_secret_cut_in_two_by_search_chunks_is_still_redacted(mcp: McpSession):
    """A token that the search chunks' 2,000-character windows would cut in two (in a one-line
    env dump) shows in no search snippet and no SQL row, not even in part: the event is redacted
    before it is cut (and each chunk again with its neighbours). The second piece alone would not
    be recognizable as a token."""
    head, tail = STRADDLING_TOKEN[:10], STRADDLING_TOKEN[10:]
    rows = mcp.ok(
        "sql_query",
        {
            "sql": "SELECT part, text FROM chunks WHERE session_id = ?1 AND seq = (SELECT seq FROM commands "
            "WHERE session_id = ?1 AND command = 'env | jq -c .') ORDER BY part",
            "params": [SECRETS_SESSION],
        },
    )["rows"]
    assert [part for part, _ in rows] == [0, 1, 2, 3]  # the command, then the line in three pieces
    # The event is redacted whole before it is cut into windows: a window may cut the marker,
    # never the token.
    assert (rows[1][1] + rows[2][1]).count('"GITHUB_TOKEN":"[REDACTED:github-token]","') == 1
    found = mcp.ok("search", {"query": "GITHUB_TOKEN RUNNER_TEMP", "session_id": SECRETS_SESSION, "limit": 50})
    texts = json.dumps([rows, found["results"]])
    assert head not in texts and tail[:12] not in texts and tail[-12:] not in texts
    assert not redact.contains_secret(tail)  # the piece alone would have passed


def test_the_catalog_is_left_as_a_refresh_makes_it(mcp: McpSession, store: StoreInfo):
    """The server wrote nothing but the catalog's own refresh: a second refresh finds nothing
    to change."""
    mcp.ok("search", {"query": "cargo"})
    report = memstore.Store(store.root).refresh()
    assert not report.changed and not report.errors


def test_without_the_sdk_the_command_exits_2_and_says_what_to_install(store: StoreInfo):
    """``memstore mcp`` where the mcp package cannot be imported: exit 2, one line naming the
    extra to install, nothing on stdout."""
    code = (
        "import sys; sys.modules['mcp'] = None; sys.argv = ['memstore', 'mcp', '--root', sys.argv[1]]; "
        "from memstore.cli import cli; cli()"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(store.root)], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 2 and done.stdout == ""
    assert "install memstore[mcp]" in done.stderr


def test_a_missing_store_exits_2(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "memstore", "mcp", "--root", str(tmp_path / "nowhere")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2 and "no store at" in done.stderr


def test_cost_figures_are_decimal_exact_in_json(mcp: McpSession, store: StoreInfo):
    """A turn's usd is the pricing module's Decimal as a JSON number, not a rounded float."""
    turn = mcp.ok("get_session", {"session_id": LEDGER})["turns"][0]
    end = store.turn_ends[LEDGER][0]
    expected = turn_cost(end, provider_hint="codex", provider="openai", when=turn["ended_at"])
    assert expected.source is CostSource.ESTIMATED
    assert Decimal(str(turn["cost"]["usd"])) == expected.usd
