"""search_memory at the edges; each test is a bug that was found and fixed."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

import memstore
from memstore.bm25 import recency_multiplier


def _fact_session(root, sid, view: dict):
    with memstore.open_session(root, sid) as log:
        log.append({"type": "thread.started", "thread_id": sid})
    path = memstore.session_directory(root, sid) / "derived" / "memory.json"
    path.write_text(json.dumps(view))


def test_a_memory_fact_has_the_time_its_memory_view_gives(tmp_path):
    """Reference 5.5: a fact's created_at is memory.json's numeric created_at, else its numeric
    updated_at, else null, and the recency multiplier is taken from it. Facts came back with
    no time at all: no recency, and left out by any ``since``."""
    created = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC).timestamp()
    updated = datetime(2026, 4, 1, 8, 30, 0, tzinfo=UTC).timestamp()
    _fact_session(
        tmp_path,
        "a",
        {
            "created_at": created,
            "updated_at": updated,
            "grounded_facts": [{"fact": "the whale is blue", "source": "user_assertion"}],
        },
    )
    _fact_session(
        tmp_path,
        "b",
        {
            "updated_at": updated,
            "created_at": "yesterday",
            "grounded_facts": [{"fact": "a whale sang", "source": "user_assertion"}],
        },
    )
    _fact_session(
        tmp_path,
        "c",
        {
            "created_at": True,
            "generated_at": "2026-04-01T00:00:00Z",
            "grounded_facts": [{"fact": "no whale time", "source": "user_assertion"}],
        },
    )
    hits = {h.chunk_id: h for h in memstore.search_memory(tmp_path, "whale", 10, source="session")}
    assert hits["a:0"].created_at == "2026-03-01T12:00:00.000Z"
    assert hits["b:0"].created_at == "2026-04-01T08:30:00.000Z"
    assert hits["c:0"].created_at is None
    plain = {
        h.chunk_id: h.score for h in memstore.search_memory(tmp_path, "whale", 10, source="session", recency=False)
    }
    now = datetime.now(UTC)
    assert abs(hits["a:0"].score - plain["a:0"] * recency_multiplier(created, now)) < 1e-6
    assert abs(hits["c:0"].score - plain["c:0"]) < 1e-12
    # since restricts facts by that time too.
    assert {
        h.chunk_id for h in memstore.search_memory(tmp_path, "whale", 10, source="session", since="2026-03-15")
    } == {"b:0"}


def test_a_max_results_that_is_not_an_int_is_a_clear_error(tmp_path):
    (tmp_path / "sessions").mkdir()
    for bad in (3.5, "6", True, None):
        with pytest.raises(TypeError, match="max_results must be an int"):
            memstore.search_memory(tmp_path, "websocket", bad)
