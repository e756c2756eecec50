"""The MCP tools' machine filter: over a laptop's store holding a devbox's sessions (imported
with `memstore import`), search and recent_sessions, called through a real MCP client of a
`memstore mcp` subprocess, return exactly the sessions born in the machine named (by label or
store id), and say each session's machine."""

from __future__ import annotations

import pytest
from machines import DEVBOX_SESSIONS, LAPTOP_SESSIONS, TwoMachines, two_machines

import memstore
from memstore.views.memory_view import write_session_memory_view


@pytest.fixture(scope="module")
def machines(tmp_path_factory) -> TwoMachines:
    return two_machines(tmp_path_factory.mktemp("mcp-machines"))


@pytest.fixture(scope="module")
def store(machines: TwoMachines) -> TwoMachines:
    """What the ``mcp`` fixture serves (it reads ``store.root``): the laptop's store, each of
    its sessions with its memory view (the facts memory_facts lists)."""
    for sid in (*LAPTOP_SESSIONS, *DEVBOX_SESSIONS):
        with memstore.open_session(machines.root, sid) as log:  # a note: a fact of its memory view
            log.append({"type": "turn.started"})
            note = f"note that the widget builds of {sid} need the cache warmed first"
            log.append({"type": "item.completed", "item": {"id": "note", "type": "user_message", "text": note}})
            log.append({"type": "turn.completed", "usage": {"input_tokens": 900, "output_tokens": 40}})
        write_session_memory_view(machines.root, sid)
    memstore.refresh_catalog(machines.root)
    return machines


@pytest.mark.parametrize("which", ["laptop", "devbox"])
def test_search_and_recent_sessions_by_machine(mcp, machines, which):
    expected = set(LAPTOP_SESSIONS if which == "laptop" else DEVBOX_SESSIONS)
    store_id = machines.laptop_id if which == "laptop" else machines.devbox_id
    for machine in (which, store_id):
        found = mcp.ok("search", {"query": "widget", "machine": machine, "limit": 50})
        assert {r["session_id"] for r in found["results"]} == expected
        recent = mcp.ok("recent_sessions", {"machine": machine})
        assert {s["session_id"] for s in recent["sessions"]} == expected
        assert {(s["machine"]["store_id"], s["machine"]["label"]) for s in recent["sessions"]} == {(store_id, which)}
    # With the other filters: an agent (a set of sessions) and a cwd.
    mixed = mcp.ok("search", {"query": "widget", "machine": which, "agent": "codex", "limit": 50})
    assert {r["session_id"] for r in mixed["results"]} == expected


@pytest.mark.parametrize("which", ["laptop", "devbox"])
def test_memory_facts_by_machine(mcp, machines, which):
    expected = set(LAPTOP_SESSIONS if which == "laptop" else DEVBOX_SESSIONS)
    every = mcp.ok("memory_facts", {"limit": 200})["facts"]
    assert {f["session_id"] for f in every} == set(LAPTOP_SESSIONS) | set(DEVBOX_SESSIONS)
    facts = mcp.ok("memory_facts", {"machine": which, "limit": 200})["facts"]
    assert {f["session_id"] for f in facts} == expected


def test_an_unknown_machine_has_no_sessions(mcp):
    assert mcp.ok("search", {"query": "widget", "machine": "nowhere"})["results"] == []
    assert mcp.ok("recent_sessions", {"machine": "nowhere"})["sessions"] == []
    assert mcp.ok("memory_facts", {"machine": "nowhere"})["facts"] == []
    assert len(mcp.ok("recent_sessions", {})["sessions"]) == 4
