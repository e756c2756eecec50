"""``Store(root)``: the one object users hold opens, reads, lists, searches, rebuilds, keeps and
packs the sessions of one root, through the same library code as the free functions."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import memstore
from memstore import Store


def _write_turn(store: Store, session_id: str, text: str) -> None:
    with store.open(session_id) as log:
        log.append({"type": "turn.started"})
        log.append({"type": "item.completed", "item": {"type": "agent_message", "text": text}})
        log.append(
            {"type": "turn.completed", "usage": {"input_tokens": 10, "cached_input_tokens": 0, "output_tokens": 5}}
        )


def test_store_path_is_absolute_and_user_expanded(tmp_path, monkeypatch):
    """The root is resolved once: a later chdir cannot move the store under its user."""
    monkeypatch.chdir(tmp_path)
    store = Store("relative")
    assert store.path == tmp_path / "relative"
    monkeypatch.setenv("HOME", str(tmp_path))
    assert Store("~/x").path == tmp_path / "x"
    assert not store.exists  # creating a Store touches nothing on disk


def test_store_open_read_list_and_search(tmp_path):
    """What one handle writes, the store reads, lists and finds."""
    store = Store(tmp_path)
    _write_turn(store, "alpha", "the cargo build failed on the parser")
    _write_turn(store, "beta", "deployed the staging cluster")
    assert sorted(store) == ["alpha", "beta"] and len(store) == 2
    assert "alpha" in store and "gamma" not in store and 42 not in store
    assert store["alpha"].turn_count == 1
    with store.read("beta") as reader:
        assert [t.number for t in reader.turns()] == [1]
    assert {s.session_id for s in store.sessions()} == {"alpha", "beta"}
    hits = store.search("cargo parser")
    assert hits and hits[0].session_id == "alpha"
    assert store.search("cargo", session="beta") == []


def test_store_matches_the_free_functions(tmp_path):
    """Store methods and the free functions are the same code: same answers."""
    store = Store(tmp_path)
    _write_turn(store, "s1", "refactored the tokenizer module")
    assert [r.chunk_id for r in store.search("tokenizer")] == [
        r.chunk_id for r in memstore.search_memory(tmp_path, "tokenizer")
    ]
    assert store.rebuild("s1").event_count == memstore.rebuild(tmp_path, "s1").event_count
    assert [m.session_id for m in store.rebuild()] == ["s1"]


def test_store_retention_is_a_dry_run_unless_applied(tmp_path):
    """A removal is always asked for explicitly: the default only reports."""
    store = Store(tmp_path)
    for n in range(3):
        with store.open(f"s{n}") as log:
            log.append({"type": "thread.started", "thread_id": f"s{n}"})
            log.append({"type": "turn.started"})
            log.append({"type": "turn.completed", "usage": {"input_tokens": 1}})
            log.append(
                {
                    "type": "thread.completed",
                    "thread_id": f"s{n}",
                    "session_id": f"s{n}",
                    "subtype": "success",
                    "outcome_code": "completed",
                    "usage": {},
                    "num_turns": 1,
                }
            )
    policy = memstore.RetentionPolicy(max_sessions=1, max_age_days=0)
    report = store.retention(policy)
    assert report.dry_run and report.count >= 1
    assert len(store) == 3
    applied = store.retention(policy, apply=True)
    assert not applied.dry_run and len(store) == 3 - applied.count


def test_store_pin_unpin_and_pack_verify(tmp_path):
    """Pins keep a session; a pack of an untouched session verifies."""
    store = Store(tmp_path)
    _write_turn(store, "kept", "a note worth keeping")
    store.pin("kept", "audit")
    assert memstore.session_retention_pinned(store.session_path("kept"))
    assert store.unpin("kept") is True and store.unpin("kept") is False
    _pack, path = store.pack("kept", tmp_path / "pack.json")
    assert store.verify("kept", path).verified


def test_opening_and_appending_through_a_store_stays_light(tmp_path):
    """An agent that only appends never loads search, the catalog or the importers."""
    code = (
        "import sys, memstore\n"
        f"store = memstore.Store({str(tmp_path)!r})\n"
        "with store.open('s') as log:\n"
        "    log.append({'type': 'turn.started'})\n"
        "heavy = [m for m in ('memstore.search', 'memstore.catalog', 'memstore.importers', 'memstore.retention')\n"
        "         if m in sys.modules]\n"
        "print(','.join(heavy))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert out.stdout.strip() == ""


def test_unknown_attribute_of_the_package_is_an_attribute_error():
    """The lazy names are a closed list: a typo is an AttributeError, not an import."""
    with pytest.raises(AttributeError):
        memstore.no_such_name  # noqa: B018
    assert "Store" in dir(memstore) and "search_memory" in dir(memstore)


def test_store_facts_of_one_session_name_the_fact_and_the_session(tmp_path):
    """A session's facts come back as FactRecords with each field in its place."""
    store = Store(tmp_path)
    _write_turn(store, "facts", "setup done")
    memstore.write_session_memory_view(
        tmp_path,
        "facts",
        {
            "schema_version": 3,
            "session_id": "facts",
            "generated_at": "2026-11-30T08:30:29.123Z",
            "grounded_facts": [{"fact": "the build uses cargo nextest", "source": "tool:exec"}],
        },
    )
    (record,) = store.facts(session="facts")
    assert (record.fact, record.session_id) == ("the build uses cargo nextest", "facts")


def test_a_written_session_is_read_found_and_catalogued(store, written_session, catalog):
    """One closed session is the same turn everywhere: the reader, a search, and the catalog."""
    with store.read(written_session) as reader:
        (turn,) = reader.turns()
        assert turn.status == "completed" and reader.event_count == 6
    best, *rest = store.search("nested bracket overflows", limit=5)
    assert (best.session_id, best.turn, best.kind) == (written_session, 1, "agent_message")
    assert all(hit.score < best.score for hit in rest)
    rows = catalog.execute("SELECT session_id, turn_count FROM sessions").fetchall()
    assert rows == [(written_session, 1)]
