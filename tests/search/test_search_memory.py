"""search_memory over a store: sees everything flushed, never errors on a query, filters, and
gives the same results on a catalog kept up to date as on one rebuilt from scratch."""

from __future__ import annotations

import shutil

import pytest
import support
from click.testing import CliRunner

import memstore
from memstore.cli import cli
from memstore.session.tuning import TUNING


def turn(log, text, output="ok"):
    log.append({"type": "turn.started"})
    log.append({"type": "item.completed", "item": {"id": "m", "type": "agent_message", "text": text}})
    log.append(
        {
            "type": "item.completed",
            "item": {
                "id": "c",
                "type": "command_execution",
                "command": "cargo test",
                "aggregated_output": output,
                "exit_code": 0,
                "status": "completed",
            },
        }
    )
    log.append({"type": "turn.completed", "usage": {}})


def test_search_sees_what_was_flushed_before_it_even_if_nothing_derived_it(tmp_path, monkeypatch):
    monkeypatch.setattr(TUNING, "derive_idle_seconds", 3600)
    log = memstore.open_session(tmp_path, "live")
    turn(log, "the widget is blue")
    assert [r.chunk_id for r in memstore.search_memory(tmp_path, "widget")] == ["live:2:0"]
    log.append({"type": "item.completed", "item": {"id": "x", "type": "agent_message", "text": "a second widget"}})
    log.flush()  # the agent is still writing the session
    hits = memstore.search_memory(tmp_path, "widget")
    assert sorted(r.chunk_id for r in hits) == ["live:2:0", "live:5:0"]
    assert {(r.session_id, r.turn, r.seq) for r in hits} == {("live", 1, 2), ("live", None, 5)}
    log.close()


@pytest.mark.parametrize(
    "query",
    [
        '"',
        "-",
        "NEAR(a b",
        "a*",
        "((",
        ")",
        "",
        "   ",
        "!!!",
        "\x00",
        "x" * 10_000,
        "OR AND NOT",
        "'; DROP TABLE chunks; --",
        "col:val",
        "^start",
    ],
)
def test_no_query_is_an_error(tmp_path, query):
    with memstore.open_session(tmp_path, "s") as log:
        turn(log, "NEAR and OR are words here; so is start")
    results = memstore.search_memory(tmp_path, query)
    assert isinstance(results, list)


def test_filters_restrict_results_not_scores(tmp_path):
    with memstore.open_session(tmp_path, "a") as log:
        turn(log, "cargo build failed with a borrow error")
    with memstore.open_session(tmp_path, "b") as log:
        turn(log, "cargo test passed")
    everything = {r.chunk_id: r.score for r in memstore.search_memory(tmp_path, "cargo borrow", 10, recency=False)}
    only_a = memstore.search_memory(tmp_path, "cargo borrow", 10, session_id="a", recency=False)
    assert only_a and all(r.session_id == "a" for r in only_a)
    assert all(everything[r.chunk_id] == pytest.approx(r.score) for r in only_a)
    assert memstore.search_memory(tmp_path, "cargo", since="2999-01-01") == []
    assert memstore.search_memory(tmp_path, "cargo", source="session") == []
    with pytest.raises(ValueError):
        memstore.search_memory(tmp_path, "cargo", since="last tuesday")


def test_results_are_the_same_after_a_rebuild_from_scratch(tmp_path):
    root = tmp_path / "store"
    for i in range(5):
        with memstore.open_session(root, f"s{i}", max_events=9) as log:
            for t in range(4):
                turn(
                    log,
                    f"session {i} turn {t}: widget {t * i} failed",
                    output="error[E0308]: mismatched types " * (t + 1),
                )
    queries = ["widget failed", "mismatched types", "session 3", "E0308"]
    incremental = {
        q: [(r.chunk_id, round(r.score, 9)) for r in memstore.search_memory(root, q, 20, recency=False)]
        for q in queries
    }
    scratch = tmp_path / "scratch"
    shutil.copytree(root / "sessions", scratch / "sessions")
    rebuilt = {
        q: [(r.chunk_id, round(r.score, 9)) for r in memstore.search_memory(scratch, q, 20, recency=False)]
        for q in queries
    }
    assert incremental == rebuilt
    assert all(incremental.values())


def test_imported_sessions_are_searched_like_native_ones(tmp_path):
    source = tmp_path / "exec.jsonl"
    source.write_text(
        '{"type":"thread.started","thread_id":"0199a213-81c0-7800-8aa1-bbab2a035a53"}\n'
        '{"type":"turn.started"}\n'
        '{"type":"item.completed","item":{"id":"item_0","type":"agent_message","text":"Refactored the flux capacitor"}}\n'
        '{"type":"turn.completed","usage":{"input_tokens":10,"cached_input_tokens":0,"output_tokens":3}}\n'
    )
    report = memstore.import_logs(tmp_path / "store", source, source="codex-exec")
    assert report.sessions_created == 1
    (hit,) = memstore.search_memory(tmp_path / "store", "flux capacitor")
    assert hit.session_id == "codex-0199a213-81c0-7800-8aa1-bbab2a035a53" and hit.kind == "agent_message"


def test_the_search_command(tmp_path):
    with memstore.open_session(tmp_path, "s") as log:
        turn(log, "the widget is blue")
    runner = CliRunner()
    result = runner.invoke(cli, ["search", "widget", "--root", str(tmp_path)])
    assert result.exit_code == 0 and "s turn 1 event 2" in result.output and "the widget is blue" in result.output
    result = runner.invoke(cli, ["search", "widget", "--root", str(tmp_path), "--json"])
    assert result.exit_code == 0 and '"chunk_id": "s:2:0"' in result.output
    result = runner.invoke(cli, ["search", "widget", "--root", str(tmp_path / "nope")])
    assert result.exit_code == 2 and "no store at" in result.output


def fact_session(root, sid, facts):
    with memstore.open_session(root, sid) as log:
        log.append({"type": "thread.started", "thread_id": sid})
    memstore.write_session_memory_view(
        root,
        sid,
        {
            "summary": f"session {sid}",
            "grounded_facts": [{"fact": f, "source": "user_assertion"} for f in facts],
            "touched_files": [],
        },
    )


def test_reference_query_tests_over_memory_facts(tmp_path):
    """reference 4.2 query.rs: "blue" finds s1:0; multiple matches; min_score; an empty query;
    descending scores; BM25 with deterministic ties ranks "rust cargo" s1:0 first."""
    fact_session(tmp_path, "s1", ["rust cargo the widget is blue", "cargo build"])
    fact_session(tmp_path, "s2", ["the sky is blue today", "python pip"])
    facts = memstore.search_memory(tmp_path, "blue", source="session")
    assert facts[0].chunk_id in ("s1:0", "s2:0") and {f.chunk_id for f in facts} == {"s1:0", "s2:0"}
    assert all(f.source == "session" and f.path.endswith("memory.json") and f.seq is None for f in facts)
    scores = [f.score for f in memstore.search_memory(tmp_path, "cargo blue", 10, source="session")]
    assert scores == sorted(scores, reverse=True)
    top = memstore.search_memory(tmp_path, "rust cargo", source="session", recency=False)
    assert top[0].chunk_id == "s1:0" and top[0].score > top[1].score
    assert memstore.search_memory(tmp_path, "", source="session") == []
    assert memstore.search_memory(tmp_path, "blue", source="session", min_score=1e9) == []
    # A new view replaces the old facts in the search.
    fact_session(tmp_path, "s2", ["nothing colourful"])
    assert {f.chunk_id for f in memstore.search_memory(tmp_path, "blue", source="session")} == {"s1:0"}


def test_a_store_on_a_read_only_filesystem_is_searched_as_its_catalog_last_saw_it(tmp_path, caplog):
    """It says so: the sessions the catalog has not copied are missing from the answer, with why."""
    with support.tmpfs(tmp_path / "ro") as mount:
        with memstore.open_session(mount, "s") as log:
            turn(log, "the flaky websocket reconnect test")
        assert [r.session_id for r in memstore.search_memory(mount, "websocket")] == ["s"]
        with memstore.open_session(mount, "later") as log:  # never reaches the catalog
            turn(log, "websocket again")
        memstore.Store(mount).close()  # the process's warm connection: a mount is busy while a file is open
        support.remount_read_only(mount)
        with caplog.at_level("WARNING", logger="memstore"):
            hits = memstore.search_memory(mount, "websocket")
        assert [r.session_id for r in hits] == ["s"]
        assert hits.partial and [m.directory for m in hits.missing] == ["later"]
        assert "read-only" in hits.missing[0].reason.lower()
        assert any("searching" in r.getMessage() and "without refreshing it" in r.getMessage() for r in caplog.records)
        result = CliRunner().invoke(cli, ["search", "websocket", "--root", str(mount), "--json"])
        assert result.exit_code == 0, result.output
        memstore.Store(mount).close()


def test_a_store_without_a_catalog_that_cannot_be_written_is_a_clear_error(tmp_path):
    with support.tmpfs(tmp_path / "ro") as mount:
        with memstore.open_session(mount, "s") as log:
            turn(log, "websocket")
        memstore.Store(mount).close()
        support.remount_read_only(mount)
        with pytest.raises(memstore.StoreIOError) as caught:
            memstore.search_memory(mount, "websocket")
        assert str(mount) in str(caught.value)
