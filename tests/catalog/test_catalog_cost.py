"""Cost in the catalog (issue 19): every turn's dollars with where they come from (what the
agent reported, an estimate from the price table, or nothing for an unknown model: NULL, never
0), each session's total, and views of dollars per day and per model. The figures are
:mod:`memstore.pricing`'s, for the same turn ends."""

from __future__ import annotations

import sqlite3

import pytest

import memstore
from memstore import pricing
from memstore.catalog import refresh_catalog


def _session(root, sid, turns):
    """``turns``: (model, usage, extra fields of the turn end)."""
    with memstore.open_session(root, sid) as log:
        for i, (model, usage, extra) in enumerate(turns):
            log.append({"type": "turn.started"})
            log.append(
                {"type": "item.completed", "item": {"id": f"m{i}", "type": "agent_message", "text": f"step {i}"}}
            )
            log.append({"type": "turn.completed", "model": model, "usage": usage, **extra})
    with memstore.read_session(root, sid) as reader:
        return [reader.record(t.last_seq).event for t in reader.turns()]


def _rows(root, sql, *params):
    conn = sqlite3.connect(root / "catalog.db")
    try:
        return conn.execute(sql, params).fetchall()
    finally:
        conn.close()


def test_turns_carry_their_cost_and_where_it_comes_from(tmp_path):
    usage = {"input_tokens": 12_000, "cached_input_tokens": 4_000, "output_tokens": 900}
    ends = _session(
        tmp_path,
        "s",
        [
            ("gpt-5", usage, {}),
            ("claude-sonnet-4-5", usage, {"total_cost_usd": 0.25}),
            ("no-such-model-xyz", usage, {}),
            (None, usage, {}),
        ],
    )
    refresh_catalog(tmp_path)
    rows = _rows(tmp_path, "SELECT number, cost_usd, cost_source, price_version FROM turns ORDER BY number")
    expected = [pricing.turn_cost(end) for end in ends]
    assert [r[2] for r in rows] == ["estimated", "reported", "unpriced", "unpriced"]
    assert rows[0][1] == pytest.approx(float(expected[0].usd)) and rows[0][1] > 0
    assert rows[0][3] == expected[0].price_version and rows[0][3].startswith("genai-prices")
    assert rows[1][1:] == (0.25, "reported", None)
    assert rows[2][1:] == (None, "unpriced", None) and rows[3][1:] == (None, "unpriced", None)
    session = _rows(tmp_path, "SELECT cost_usd, cost_estimated, cost_unpriced_turns FROM sessions")[0]
    assert session[0] == pytest.approx(rows[0][1] + 0.25)
    assert session[1] == pytest.approx(rows[0][1]) and session[2] == 2


def test_a_session_of_unknown_models_costs_null_not_zero(tmp_path):
    _session(tmp_path, "u", [("no-such-model-xyz", {"input_tokens": 10, "output_tokens": 1}, {})])
    refresh_catalog(tmp_path)
    assert _rows(tmp_path, "SELECT cost_usd, cost_estimated, cost_unpriced_turns FROM sessions") == [(None, None, 1)]
    assert _rows(tmp_path, "SELECT model, turns, cost_usd, unpriced_turns FROM cost_by_model") == [
        ("no-such-model-xyz", 1, 0.0, 1)
    ]


def test_a_total_the_agent_reported_for_the_session_is_its_cost(tmp_path):
    usage = {"input_tokens": 1000, "output_tokens": 100}
    with memstore.open_session(tmp_path, "t") as log:
        log.append({"type": "turn.started"})
        log.append({"type": "turn.completed", "model": "gpt-5", "usage": usage})
        log.append(
            {
                "type": "thread.completed",
                "thread_id": "t",
                "session_id": "t",
                "subtype": "success",
                "outcome_code": "completed",
                "usage": usage,
                "num_turns": 1,
                "total_cost_usd": 1.5,
            }
        )
    refresh_catalog(tmp_path)
    assert _rows(tmp_path, "SELECT cost_usd, cost_estimated, cost_unpriced_turns FROM sessions") == [(1.5, 0.0, 0)]
    assert _rows(tmp_path, "SELECT cost_source FROM turns") == [("estimated",)]


def test_cost_views_sum_per_day_model_and_agent(tmp_path):
    usage = {"input_tokens": 50_000, "output_tokens": 2_000}
    _session(tmp_path, "a", [("gpt-5", usage, {}), ("gpt-5", usage, {"cost_usd": 0.5})])
    _session(tmp_path, "b", [("no-such-model-xyz", usage, {})])
    refresh_catalog(tmp_path)
    estimate = _rows(tmp_path, "SELECT cost_usd FROM turns WHERE cost_source = 'estimated'")[0][0]
    daily = _rows(
        tmp_path,
        "SELECT model, agent, turns, reported_usd, estimated_usd, unpriced_turns FROM cost_daily ORDER BY model",
    )
    assert [d[:3] for d in daily] == [("gpt-5", "memstore", 2), ("no-such-model-xyz", "memstore", 1)]
    assert daily[0][3:] == (0.5, pytest.approx(estimate), 0) and daily[1][3:] == (0.0, 0.0, 1)
    by_model = dict(
        (r[0], r[1:])
        for r in _rows(
            tmp_path, "SELECT model, cost_usd, reported_usd, estimated_usd, unpriced_turns FROM cost_by_model"
        )
    )
    assert by_model["gpt-5"] == (pytest.approx(0.5 + estimate), 0.5, pytest.approx(estimate), 0)


def test_a_grown_session_keeps_its_costs_and_adds_the_new(tmp_path):
    usage = {"input_tokens": 1000, "output_tokens": 10}
    _session(tmp_path, "g", [("gpt-5", usage, {})])
    store = memstore.Store(tmp_path, sweep_interval=3600)
    store.search("step")
    _session(tmp_path, "g", [("gpt-5", usage, {"total_cost_usd": 0.125})])
    store.search("step")
    rows = _rows(tmp_path, "SELECT number, cost_source FROM turns ORDER BY number")
    assert rows == [(1, "estimated"), (2, "reported")]
    total = _rows(tmp_path, "SELECT cost_usd FROM sessions")[0][0]
    assert total == pytest.approx(_rows(tmp_path, "SELECT sum(cost_usd) FROM turns")[0][0])
    store.close()


def test_a_catalog_without_cost_columns_is_built_again_with_them(tmp_path):
    """The catalog is regenerable: one of the previous layout (no cost columns) is set aside at
    its next open and built again, with them."""
    _session(tmp_path, "s", [("gpt-5", {"input_tokens": 1000, "output_tokens": 10}, {})])
    refresh_catalog(tmp_path)
    conn = sqlite3.connect(tmp_path / "catalog.db")
    with conn:
        conn.execute("DROP VIEW cost_daily")
        conn.execute("DROP VIEW cost_by_model")
        for column in ("cost_usd", "cost_source", "price_version"):
            conn.execute(f"ALTER TABLE turns DROP COLUMN {column}")
        conn.execute("UPDATE _sqlite_migrations SET name = 'tables_4' WHERE name = 'tables_5'")
    conn.close()
    hits = memstore.search_memory(tmp_path, "step")
    assert [h.session_id for h in hits] == ["s"]
    assert _rows(tmp_path, "SELECT cost_source FROM turns") == [("estimated",)]
    memstore.Store(tmp_path).close()
