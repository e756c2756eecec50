"""Golden fixtures, one per agent version: the token totals are exact.

Each expected figure is computed by hand from the fixture (tests/fixtures/import/make_fixtures.py
writes them; the comments there and here show the arithmetic). Codex totals are cumulative: a
turn's usage is the advance of ``total_token_usage`` since the previous turn ended (repeated
counts add nothing), so the turns sum to the last total. Claude responses count once, at their
largest usage; input = input + cache reads + cache writes. Also, for the versions that fold
per-turn events into ``item_completed`` records (Codex 0.147, 0.148), each thing is imported once
however many twins the file holds.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import memstore

FIXTURES = Path(__file__).parent.parent / "fixtures" / "import"


def fixture(*parts: str) -> Path:
    return next((FIXTURES.joinpath(*parts)).glob("*.jsonl"))


def usage(i: int, c: int, cc: int, o: int) -> tuple:
    return (i, c, cc, o)


# (fixture, per-turn usage (input, cached, cache creation, output), total)
GOLDEN = {
    # Legacy rollouts record no usage at all.
    "codex legacy": (fixture("codex", "legacy"), [usage(0, 0, 0, 0)] * 2, usage(0, 0, 0, 0)),
    # Totals 9206/8192/175 at the end of turn 1; 16001/14720/264 when turn 2 was aborted
    # (-> 6795/6528/89); 19500/17920/300 at the end (-> 3499/3200/36).
    "codex 0.40": (
        fixture("codex", "0.40"),
        [usage(9206, 8192, 0, 175), usage(6795, 6528, 0, 89), usage(3499, 3200, 0, 36)],
        usage(19500, 17920, 0, 300),
    ),
    # Totals 17000/14000/700, 36000/29000/1400, 43000/35000/1600, 45000/37000/1650 at each turn's end.
    "codex 0.104": (
        fixture("codex", "0.104"),
        [usage(17000, 14000, 0, 700), usage(19000, 15000, 0, 700), usage(7000, 6000, 0, 200), usage(2000, 2000, 0, 50)],
        usage(45000, 37000, 0, 1650),
    ),
    # Totals 15000/12000/900 (turn 1), 21000/16000/1100 (turn 2 -> 6000/4000/200).
    "codex 0.147": (
        fixture("codex", "0.147"),
        [usage(15000, 12000, 0, 900), usage(6000, 4000, 0, 200)],
        usage(21000, 16000, 0, 1100),
    ),
    # Totals 12000/10000/500 (written twice: counted once), then 20500/17000/800 (-> 8500/7000/300).
    "codex 0.148": (
        fixture("codex", "0.148"),
        [usage(12000, 10000, 0, 500), usage(8500, 7000, 0, 300)],
        usage(20500, 17000, 0, 800),
    ),
    # turn.completed usage is cumulative: 2946/0/7, then 7000/2048/60 (-> 4054/2048/53); the failed turn 0.
    "codex exec": (
        FIXTURES / "codex" / "exec" / "run-42.jsonl",
        [usage(2946, 0, 0, 7), usage(4054, 2048, 0, 53), usage(0, 0, 0, 0)],
        usage(7000, 2048, 0, 60),
    ),
    # Turn 1: msg_A 3+690+17055 (out 27, its largest), msg_B 6+151+17745 (24), msg_C 5+1400+17896 (180),
    # msg_D 4+300+19296 (90): input 74551, reads 71992, writes 2541, output 321. Turn 2: msg_E
    # 10+200+19600 (150). Turn 3: msg_F 8+0+20000 (40), msg_G 12+500+20000 (88), msg_H 3+700+20500 (200).
    "claude 2.0": (
        fixture("claude", "projects", "-home-dev-web"),
        [usage(74551, 71992, 2541, 321), usage(19810, 19600, 200, 150), usage(61723, 60500, 1200, 328)],
        usage(156084, 152092, 3941, 799),
    ),
    # Turn 1: msg_M1 5+1000+15000 (45), msg_M2 2+800+16000 (120) (the sub-agent's copies excluded);
    # turn 2: msg_M3 9+2000+3000 (140), msg_M4 1+100+5000 (30); turn 3: msg_M5 4+50+5100 (20);
    # turn 4 (an API error): 0.
    "claude 2.1": (
        fixture("claude", "projects", "-home-dev-app"),
        [usage(32807, 31000, 1800, 165), usage(10110, 8000, 2100, 170), usage(5154, 5100, 50, 20), usage(0, 0, 0, 0)],
        usage(48071, 44100, 3950, 355),
    ),
    # The sub-agent: msg_S1 3+0+4000 (30), msg_S2 2+4000+300 (80).
    "claude 2.1 sub-agent": (
        next((FIXTURES / "claude" / "projects" / "-home-dev-app").glob("*/subagents/*.jsonl")),
        [usage(8305, 4000, 4300, 110)],
        usage(8305, 4000, 4300, 110),
    ),
}


def turn_usages(root, sid) -> list[tuple]:
    out = []
    with memstore.read_session(root, sid) as reader:
        for event in reader.iter_events():
            if event["type"] in ("turn.completed", "turn.failed", "turn.aborted"):
                u = event["usage"]
                out.append(
                    (u["input_tokens"], u["cached_input_tokens"], u["cache_creation_tokens"], u["output_tokens"])
                )
    return out


@pytest.mark.parametrize("version", sorted(GOLDEN))
def test_token_totals_are_exact(tmp_path, version):
    source, turns, total = GOLDEN[version]
    report = memstore.import_logs(tmp_path, source, settle_seconds=0)
    [sid] = [s for s in report.sessions if (s.endswith("-agent-a1b2c3d")) == version.endswith("sub-agent")]
    assert turn_usages(tmp_path, sid) == turns
    assert tuple(map(sum, zip(*turns))) == total
    [stats] = report.agents  # and the per-version report says the same
    assert (
        stats.sessions,
        stats.input_tokens,
        stats.cached_input_tokens,
        stats.cache_creation_tokens,
        stats.output_tokens,
    ) == (1, *total)
    # The session's own summary (thread.completed once settled) agrees.
    with memstore.read_session(tmp_path, sid) as reader:
        done = [e for e in reader.iter_events() if e["type"] == "thread.completed"]
    u = done[-1]["usage"]
    assert (u["input_tokens"], u["cached_input_tokens"], u["cache_creation_tokens"], u["output_tokens"]) == total


def items_of(root, sid) -> list[tuple]:
    with memstore.read_session(root, sid) as reader:
        return [(e["item"]["type"], e["item"]["id"]) for e in reader.iter_events() if e["type"] == "item.completed"]


def test_codex_0147_imports_each_thing_once_though_written_two_or_three_times(tmp_path):
    report = memstore.import_logs(tmp_path, fixture("codex", "0.147"), settle_seconds=0)
    sid = report.sessions[0]
    # Line 5 (response_item), 6 (user_message) and 7 (UserMessage item) are one prompt; the
    # reasoning (8, 9), the command (10, 11, 12), the patch (14, 15, 16), the answer (17, 18)
    # are each one item. The user's own command (26) and the search (27) have no twin.
    assert items_of(tmp_path, sid) == [
        ("user_message", "6"),
        ("reasoning", "8"),
        ("command_execution", "10"),
        ("file_change", "14"),
        ("agent_message", "17"),
        ("plan", "19"),
        ("user_message", "25"),
        ("command_execution", "26"),
        ("web_search", "27"),
        ("agent_message", "28"),
    ]
    with memstore.read_session(tmp_path, sid) as reader:
        evs = list(reader.iter_events())
    shell = [e["item"] for e in evs if e.get("item", {}).get("id") == "26"][0]
    assert (shell["command"], shell["status"], shell["exit_code"]) == ("cargo test", "failed", 101)
    [kept] = [e for e in evs if e["type"] == "import.unrecognized"]
    assert (kept["line"], kept["record_type"]) == (21, "event_msg:item_completed:SubAgentActivity")


def test_codex_0148_prompts_without_events_are_imported_once(tmp_path):
    report = memstore.import_logs(tmp_path, fixture("codex", "0.148"), settle_seconds=0)
    sid = report.sessions[0]
    # Turn 1's prompt is only a response_item user message (line 5); turn 2's is an item (16)
    # whose response_item twin (17) follows it; the answer of turn 1 is only an item (12).
    assert items_of(tmp_path, sid) == [
        ("user_message", "5"),
        ("reasoning", "6"),
        ("command_execution", "8"),
        ("agent_message", "12"),
        ("user_message", "16"),
        ("file_change", "18"),
        ("mcp_tool_call", "21"),
    ]
    with memstore.read_session(tmp_path, sid) as reader:
        evs = list(reader.iter_events())
    prompts = [e["item"]["text"] for e in evs if e.get("item", {}).get("type") == "user_message"]
    assert prompts == ["fix the flaky retry test", "and bump the version"]
    mcp = [e["item"] for e in evs if e.get("item", {}).get("type") == "mcp_tool_call"][0]
    assert (mcp["server"], mcp["tool"], mcp["status"]) == ("github", "create_release", "completed")
