"""What the explorer shows people: filters and sorting in the URL and the .json, each turn's
prompt, search with a total, pages and filters, resume commands, "no match" exits that are not
failures, dollars that say where they come from, charts with units, and nothing odd on an empty
store. Hostile filter values stay text."""

from __future__ import annotations

import asyncio
import re
import sqlite3
from pathlib import Path
from urllib.parse import urlencode

import pytest
from explorer_support import write_session

import memstore
from memstore.catalog import refresh_catalog
from memstore.explorer import make_datasette
from memstore.explorer.commands import benign_exit
from memstore.explorer.render import display_item
from memstore.explorer.resume import resume_command


def fetch(ds, *paths):
    async def run():
        return [await ds.client.get(p) for p in paths]

    responses = asyncio.run(run())
    return responses if len(paths) > 1 else responses[0]


def write_dated_session(
    root: Path, sid: str, day: str, *, agent: str, model: str, cwd: str, turns: int = 2, text: str = "parser fix"
) -> None:
    """A session whose events carry times of ``day`` (as imported sessions do)."""
    with memstore.open_session(root, sid) as log:
        log.append(
            {"type": "thread.started", "thread_id": sid, "source": {"agent": agent, "cwd": cwd}}, ts=f"{day}T09:00:00Z"
        )
        for n in range(turns):
            ts = f"{day}T10:{n:02d}:00Z"
            log.append({"type": "turn.started"}, ts=ts)
            log.append(
                {
                    "type": "item.completed",
                    "item": {"id": f"u{n}", "type": "user_message", "text": f"Please look at the {text}, part {n}."},
                },
                ts=ts,
            )
            log.append(
                {
                    "type": "item.completed",
                    "item": {
                        "id": f"c{n}",
                        "type": "command_execution",
                        "command": "rg -n missing_symbol src",
                        "exit_code": 1,
                        "status": "failed",
                        "aggregated_output": "",
                    },
                },
                ts=ts,
            )
            log.append(
                {
                    "type": "item.completed",
                    "item": {"id": f"a{n}", "type": "agent_message", "text": f"Done with the {text} {n}."},
                },
                ts=ts,
            )
            log.append(
                {
                    "type": "turn.completed",
                    "model": model,
                    "usage": {"input_tokens": 10_000, "cached_input_tokens": 4_000, "output_tokens": 500},
                },
                ts=ts,
            )


BULK = 52  # more than a page of sessions


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("people") / "store"
    write_dated_session(
        root,
        "codex-0199aaaa-0000-7000-8000-000000000001",
        "2026-03-01",
        agent="codex",
        model="gpt-5",
        cwd="/work/alpha",
    )
    write_dated_session(
        root,
        "claude-5b0e7a4c-2f1d-4c8e-9b7a-000000000002",
        "2026-03-05",
        agent="claude",
        model="claude-sonnet-4-5",
        cwd="/work/alpha/sub",
    )
    write_dated_session(
        root, "vt-2026-03-09", "2026-03-09", agent="vtcode", model="no-such-model-xyz", cwd="/work/beta"
    )
    for n in range(BULK):
        write_dated_session(
            root,
            f"bulk-{n:02d}",
            f"2026-03-{10 + n % 10:02d}",
            agent="vtcode",
            model="gpt-5",
            cwd="/work/gamma",
            turns=1,
            text="parser fix with widgets",
        )
    refresh_catalog(root)
    return root


@pytest.fixture(scope="module")
def ds(store):
    return make_datasette(store)


def home(ds, **params) -> dict:
    response = fetch(ds, "/-/memstore.json?" + urlencode(params))
    assert response.status_code == 200, response.text[:300]
    return response.json()


def ids(payload) -> set:
    return {s["session_id"] for s in payload["sessions"]}


# --------------------------------------------------------------------------------------------
# Home: filters, sorting


def test_filters_by_agent_model_status_directory_and_dates(ds):
    """Each filter restricts the sessions, shows in the .json, and combines with the others."""
    assert ids(home(ds, agent="claude")) == {"claude-5b0e7a4c-2f1d-4c8e-9b7a-000000000002"}
    assert ids(home(ds, model="no-such-model-xyz")) == {"vt-2026-03-09"}
    # A directory matches itself and what is under it, not a sibling with the same prefix.
    assert ids(home(ds, cwd="/work/alpha")) == {
        "codex-0199aaaa-0000-7000-8000-000000000001",
        "claude-5b0e7a4c-2f1d-4c8e-9b7a-000000000002",
    }
    assert ids(home(ds, cwd="/work/alp")) == set()
    assert ids(home(ds, since="2026-03-02", until="2026-03-09")) == {
        "claude-5b0e7a4c-2f1d-4c8e-9b7a-000000000002",
        "vt-2026-03-09",
    }
    assert ids(home(ds, until="2026-03-01")) == {"codex-0199aaaa-0000-7000-8000-000000000001"}
    both = home(ds, agent="vtcode", cwd="/work/beta", status="active")
    assert ids(both) == {"vt-2026-03-09"}
    assert {"agent": "vtcode", "cwd": "/work/beta", "status": "active"}.items() <= both["filters"].items()
    # Days that are no days are ignored, never an error.
    odd = home(ds, since="2026-13-45", until="yesterday")
    assert odd["filters"]["since"] == odd["filters"]["until"] == "" and odd["matching"] == BULK + 3
    everything = home(ds)
    assert {m["model"] for m in everything["models"]} == {"gpt-5", "claude-sonnet-4-5", "no-such-model-xyz"}
    assert {d["cwd"] for d in everything["directories"]} == {
        "/work/alpha",
        "/work/alpha/sub",
        "/work/beta",
        "/work/gamma",
    }


def test_filters_and_sort_travel_in_page_links(ds):
    """The next page, the sort links and the .json link keep the filters; sorting by a column
    twice flips its order."""
    first = home(ds, agent="vtcode", sort="turns", order="asc")
    assert first["matching"] == BULK + 1
    turns = [s["turn_count"] for s in first["sessions"]]
    assert turns == sorted(turns)
    assert "agent=vtcode" in first["next_url"] and "sort=turns" in first["next_url"] and "page=2" in first["next_url"]
    assert "agent=vtcode" in first["sort_urls"]["tokens"] and "page=" not in first["sort_urls"]["tokens"]
    assert "order=" not in first["sort_urls"]["turns"]  # the current column: the other way (desc)
    assert "order=asc" in home(ds, agent="vtcode", sort="turns")["sort_urls"]["turns"]
    second = fetch(ds, first["next_url"].replace("/-/memstore?", "/-/memstore.json?")).json()
    assert not ids(second) & ids(first) and second["page"] == 2
    html = fetch(ds, "/-/memstore?agent=vtcode").text
    assert re.search(r'<th class="num"><a href="/-/memstore\?agent=vtcode&amp;sort=turns"', html)


def test_hostile_filter_values_stay_text(ds):
    """Filter values go back into the page (inputs, the hidden q) escaped, and into SQL bound."""
    evil = '"><script>alert(1)</script>'
    page = fetch(
        ds,
        "/-/memstore?"
        + urlencode({"q": evil, "agent": evil, "cwd": evil, "model": evil, "since": evil, "sort": evil, "chart": evil}),
    )
    assert page.status_code == 200 and "<script>alert(1)" not in page.text
    search = fetch(
        ds, "/-/memstore/search?" + urlencode({"q": evil, "agent": evil, "session": evil, "since": evil, "page": "2"})
    )
    assert search.status_code == 200 and "<script>alert(1)" not in search.text
    data = fetch(ds, "/-/memstore.json?" + urlencode({"q": evil})).json()
    assert data["matching"] == 0


# --------------------------------------------------------------------------------------------
# Session page


def test_each_turn_shows_its_prompt_and_the_session_its_resume_command(ds):
    data = fetch(ds, "/-/memstore/sessions/codex-0199aaaa-0000-7000-8000-000000000001.json").json()
    assert [t["prompt"] for t in data["turns"]] == [
        "Please look at the parser fix, part 0.",
        "Please look at the parser fix, part 1.",
    ]
    assert data["resume_command"] == "cd /work/alpha && codex resume 0199aaaa-0000-7000-8000-000000000001"
    claude = fetch(ds, "/-/memstore/sessions/claude-5b0e7a4c-2f1d-4c8e-9b7a-000000000002.json").json()
    assert claude["resume_command"] == "cd /work/alpha/sub && claude --resume 5b0e7a4c-2f1d-4c8e-9b7a-000000000002"
    html = fetch(ds, "/-/memstore/sessions/vt-2026-03-09").text
    assert "vtcode --resume vt-2026-03-09" in html and 'data-copy="resume-command"' in html
    assert "Please look at the parser fix, part 1." in html


@pytest.mark.parametrize(
    "sid,agent,cwd,expected",
    [
        ("codex-abc", "codex", None, "codex resume abc"),
        (
            "claude-5b0e7a4c-2f1d-4c8e-9b7a-000000000002",
            "claude",
            "/p q",
            "cd '/p q' && claude --resume 5b0e7a4c-2f1d-4c8e-9b7a-000000000002",
        ),
        ("claude-5b0e7a4c-2f1d-4c8e-9b7a-000000000002-agent-a1", "claude", None, None),  # a sub-agent's transcript
        ("s; rm -rf ~", "vtcode", None, "vtcode --resume 's; rm -rf ~'"),
        ("demo", "memstore", "/x", None),
        ("codex-", "codex", None, None),
    ],
)
def test_resume_commands(sid, agent, cwd, expected):
    assert resume_command(sid, agent, cwd) == expected


# --------------------------------------------------------------------------------------------
# Exit codes that answer


@pytest.mark.parametrize(
    "command,code,meaning",
    [
        ("rg -n foo src", 1, "no match"),
        (["bash", "-lc", "cd src && grep -R needle ."], 1, "no match"),
        ("git diff --exit-code", 1, "differences"),
        ("git grep -n foo", 1, "no match"),
        ("test -f build/out", 1, "false"),
        ("rg foo | head -5", 1, None),  # the line's status is head's
        ("rg foo", 2, None),  # rg's error
        ("cargo test", 1, None),
        ("git diff", 1, None),
        ("grep 'a|b' file; make", 1, None),
    ],
)
def test_which_exit_codes_are_answers(command, code, meaning):
    assert benign_exit(command, code) == meaning


def test_rg_finding_nothing_is_not_a_failure(ds):
    """The turn page shows `exit 1 · no match` in a neutral badge, and the session's activity
    counts it apart from the failures."""
    view = display_item({"type": "command_execution", "command": "rg -n x", "exit_code": 1, "status": "failed"})
    assert view["tone"] == "" and view["exit_meaning"] == "no match" and view["status"] == "completed"
    failing = display_item({"type": "command_execution", "command": "cargo test", "exit_code": 101})
    assert failing["tone"] == "error" and failing["exit_meaning"] is None
    html = fetch(ds, "/-/memstore/sessions/vt-2026-03-09/turns/1").text
    assert "exit 1 · no match" in html and 'class="badge error">exit 1' not in html
    activity = {a["item_type"]: a for a in fetch(ds, "/-/memstore/sessions/vt-2026-03-09.json").json()["activity"]}
    assert activity["command_execution"]["failed"] == 0 and activity["command_execution"]["answered"] == 2


# --------------------------------------------------------------------------------------------
# Search


def test_search_has_a_total_pages_and_filters(ds):
    """Pages of 5 cover the ranking once each; the total is the ranking's; filters by agent,
    session and days restrict the hits; a query also lists sessions whose id matches."""
    first = fetch(ds, "/-/memstore/search.json?q=widgets&limit=5").json()
    total = first["total"]
    assert total >= 30 and first["pages"] == -(-total // 5) and len(first["results"]) == 5
    seen = [r["chunk_id"] for r in first["results"]]
    url = first["next_url"]
    while url:
        page = fetch(ds, url.replace("/search?", "/search.json?")).json()
        assert page["total"] == total
        seen += [r["chunk_id"] for r in page["results"]]
        url = page["next_url"]
    assert len(seen) == len(set(seen)) == total
    codex = fetch(ds, "/-/memstore/search.json?q=parser&agent=codex").json()
    assert codex["total"] > 0 and {r["session_id"] for r in codex["results"]} == {
        "codex-0199aaaa-0000-7000-8000-000000000001"
    }
    dated = fetch(ds, "/-/memstore/search.json?q=parser&since=2026-03-05&until=2026-03-09&limit=100").json()
    assert {r["session_id"] for r in dated["results"]} == {
        "claude-5b0e7a4c-2f1d-4c8e-9b7a-000000000002",
        "vt-2026-03-09",
    }
    one = fetch(ds, "/-/memstore/search.json?q=parser&session=vt-2026-03-09&limit=100").json()
    assert one["total"] == len(one["results"]) > 0 and {r["session_id"] for r in one["results"]} == {"vt-2026-03-09"}
    by_id = fetch(ds, "/-/memstore/search.json?q=vt-2026").json()
    assert [s["session_id"] for s in by_id["sessions"]] == ["vt-2026-03-09"]
    html = fetch(ds, "/-/memstore/search?q=widgets&limit=5&agent=vtcode").text
    assert 'rel="next"' in html and "agent=vtcode" in html and "of vtcode sessions" in html
    assert 'name="agent" value="vtcode"' in html  # the one search box keeps the filters


# --------------------------------------------------------------------------------------------
# Cost


def test_costs_are_estimated_with_their_price_table_and_unknown_models_unpriced(ds, store):
    data = home(ds)
    cost = data["cost"]
    assert cost["available"] and cost["source"] == "estimated" and cost["price_version"].startswith("genai-prices")
    by_model = {row["model"]: row for row in cost["by_model"]}
    assert by_model["no-such-model-xyz"]["usd"] is None and by_model["no-such-model-xyz"]["source"] == "unpriced"
    assert by_model["gpt-5"]["usd"] > 0 and by_model["claude-sonnet-4-5"]["usd"] > 0
    assert cost["total"]["unpriced_models"] == ["no-such-model-xyz"] and cost["total"]["complete"] is False
    assert cost["total"]["unpriced_turns"] == 2
    assert cost["total"]["usd"] == pytest.approx(sum(r["usd"] for r in cost["by_model"] if r["usd"] is not None))
    assert sum(cost["by_day"].values()) == pytest.approx(cost["total"]["usd"])
    # Per day, as the chart draws it: its unit and the price table named.
    html = fetch(ds, "/-/memstore?chart=cost").text
    assert "USD (estimated)" in html and cost["price_version"] in html and "estimated cost, at least" in html
    unpriced = fetch(ds, "/-/memstore/sessions/vt-2026-03-09.json").json()["cost"]
    assert unpriced["total"]["usd"] is None and unpriced["total"]["unpriced_turns"] == 2
    assert "$0.00" not in fetch(ds, "/-/memstore/sessions/vt-2026-03-09").text


def test_every_chart_axis_has_its_unit(ds):
    home_html = fetch(ds, "/-/memstore").text
    assert re.search(r'<text class="unit"[^>]*>tokens</text>', home_html)
    assert "day (UTC, MM-DD)" in home_html
    session_html = fetch(ds, "/-/memstore/sessions/vt-2026-03-09").text
    assert re.search(r'<text class="unit"[^>]*>tokens</text>', session_html)
    assert re.search(r'<text class="unit"[^>]*>turn</text>', session_html)


# --------------------------------------------------------------------------------------------
# Empty store


def test_an_empty_store_says_nothing_odd(tmp_path):
    root = tmp_path / "store"
    (root / "sessions").mkdir(parents=True)
    refresh_catalog(root)
    html = fetch(make_datasette(root), "/-/memstore").text
    assert "No sessions in this store yet" in html
    assert "( cached)" not in html and "cached)" not in html and "$" not in html.split("<body")[1].split("<script")[0]


def test_prompts_come_from_the_catalog_first_user_message(store):
    from memstore.explorer.data import turn_prompts

    conn = sqlite3.connect(store / "catalog.db")
    prompts = turn_prompts(conn, "vt-2026-03-09", 1, 2)
    assert prompts == {1: "Please look at the parser fix, part 0.", 2: "Please look at the parser fix, part 1."}
    conn.close()


def test_a_turn_without_usage_is_not_counted_unpriced(tmp_path):
    root = tmp_path / "store"
    write_session(root, "s", turns=1, model="gpt-5")
    with memstore.open_session(root, "s") as log:
        log.append({"type": "turn.started"})
        log.append({"type": "turn.aborted", "reason": "stopped"})
    refresh_catalog(root)
    cost = home(make_datasette(root))["cost"]
    assert cost["total"]["unpriced_turns"] == 0 and cost["total"]["complete"] and cost["total"]["usd"] > 0


def test_both_ways_of_ranking_agree(store):
    """Filters search_catalog takes go through it; an agent or a last day through the kept index
    with a condition: with a condition that restricts nothing, pages and totals are the same."""
    from memstore.explorer.data import SearchFilters, ranked_page

    conn = sqlite3.connect(f"file:{store / 'catalog.db'}?mode=ro", uri=True)
    try:
        for offset in (0, 5, 40):
            plain = ranked_page(conn, "parser widgets", 5, offset, SearchFilters(since="2026-03-02"))
            filtered = ranked_page(
                conn, "parser widgets", 5, offset, SearchFilters(since="2026-03-02", until="2099-12-31")
            )
            assert plain[1] == filtered[1] > 0
            assert [r["chunk_id"] for r in plain[0]] == [r["chunk_id"] for r in filtered[0]]
            assert [r["snippet"] for r in plain[0]] == [r["snippet"] for r in filtered[0]]
            assert [r["score"] for r in plain[0]] == pytest.approx([r["score"] for r in filtered[0]])
    finally:
        conn.close()
