"""Importing another memstore store (a copy of another machine's or a teammate's ``<root>``).

Invariants:
- a session absent here arrives with its id, every record with its own seq, time and event,
  and an origin naming the store (id, label, root) and its id there;
- the same session reaching the store again (grown on the other machine) gains only its new
  records; one this store holds more of is left alone;
- a different session that shares an id is imported under the id qualified by its origin, and
  neither session loses or mixes a record;
- a rerun over the same copy changes nothing (and reads no log of a merged session);
- sessions removed on purpose here are not brought back; a store never imports itself;
- a capped session keeps its seqs and its first retained turn; a session passed on through a
  second store keeps its first origin;
- a SIGKILL during a store import leaves every session whole or absent, and a rerun completes.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sys
from pathlib import Path

import pytest

import memstore
from memstore.events import Record
from memstore.identity import set_label, store_identity
from memstore.importers import session_origins
from memstore.importers.staging import STAGING_PREFIX
from memstore.importers.stores import Relation, compare, is_store, qualified_id
from memstore.layout import session_dir_name
from memstore.reader import read_session_dir
from memstore.tombstones import TombstoneReason, Tombstones

sys.path.insert(0, str(Path(__file__).parent))

from generate import text  # noqa: E402
from importers_support import import_killed_at  # noqa: E402

USAGE = {"input_tokens": 120, "cached_input_tokens": 40, "cache_creation_tokens": 0, "output_tokens": 30}


def write_turns(root: Path, sid: str, turns: int, seed: int, *, max_events: int = 0) -> None:
    """Append ``turns`` turns of varied text to session ``sid`` of the store at ``root``."""
    rng = random.Random(seed)
    with memstore.open_session(root, sid, max_events=max_events) as log:
        if log.event_count == 0:
            log.append({"type": "thread.started", "thread_id": sid})
        for n in range(turns):
            log.append({"type": "turn.started"})
            log.append(
                {
                    "type": "item.completed",
                    "item": {"id": f"m{seed}-{n}", "type": "agent_message", "text": text(rng, rng.randint(20, 120))},
                }
            )
            log.append(
                {
                    "type": "item.completed",
                    "item": {
                        "id": f"c{seed}-{n}",
                        "type": "command_execution",
                        "command": f"cargo test {text(rng, 2)}",
                        "aggregated_output": text(rng, rng.randint(50, 400)),
                        "exit_code": 0,
                        "status": "completed",
                    },
                }
            )
            log.append({"type": "turn.completed", "usage": USAGE})


def records(root: Path, sid: str) -> list[tuple]:
    with memstore.read_session(root, sid) as reader:
        return [(r.seq, r.ts, r.event) for r in reader.iter_records()]


def sessions(root: Path) -> list[str]:
    return sorted(n for n in os.listdir(root / "sessions") if not n.startswith("."))


def whole_store(root: Path) -> dict:
    """Every session's records, by session id."""
    found = {}
    for name in sessions(root):
        with read_session_dir(root / "sessions" / name) as reader:
            found[reader.session_id] = [(r.seq, r.ts, r.event) for r in reader.iter_records()]
    return found


@pytest.fixture
def teammate(tmp_path: Path) -> Path:
    """Another machine's store: three sessions of its own."""
    root = tmp_path / "teammate"
    root.mkdir()
    set_label(root, "devbox")
    for i, sid in enumerate(["alpha", "shared", "clash"]):
        write_turns(root, sid, 3 + i, seed=10 + i)
    return root


def test_a_store_is_told_from_an_agents_directory(teammate, tmp_path):
    codex = tmp_path / ".codex"
    (codex / "sessions" / "2026" / "11").mkdir(parents=True)
    assert is_store(teammate) and not is_store(codex) and not is_store(tmp_path / "nowhere")


def test_new_sessions_arrive_whole_with_their_origin(teammate, tmp_path):
    mine = tmp_path / "mine"
    report = memstore.import_logs(mine, teammate)
    assert (report.sessions_created, report.sources, report.problems) == (3, 3, [])
    assert sessions(mine) == ["alpha", "clash", "shared"]
    assert whole_store(mine) == whole_store(teammate)
    identity = store_identity(teammate)
    origins = session_origins(mine)
    assert set(origins) == {"alpha", "clash", "shared"}
    for sid, origin in origins.items():
        assert (origin.store_id, origin.label, origin.root, origin.session_id) == (
            identity.store_id,
            "devbox",
            str(teammate.absolute()),
            sid,
        )
    # Searchable like any session, and nothing was written into the other store.
    assert memstore.search_memory(mine, "cargo test")
    assert not (teammate / "sessions" / "alpha" / "derived" / "origin.json").exists()


def test_the_store_object_imports_another_store(teammate, tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    report = memstore.Store(mine).import_logs(teammate, jobs=1)
    assert report.sessions_created == 3 and whole_store(mine) == whole_store(teammate)


def test_overlapping_stores_merge_with_every_event_once(teammate, tmp_path):
    mine = tmp_path / "mine"
    memstore.import_logs(mine, teammate)  # the teammate's sessions as they were
    write_turns(teammate, "shared", 2, seed=30)  # it grew over there
    write_turns(mine, "local", 2, seed=40)  # and this machine has its own
    # A session of the same id made here independently: another session.
    other = tmp_path / "other"
    other.mkdir()
    store_identity(other)
    write_turns(other, "clash", 2, seed=50)
    memstore.import_logs(mine, other)
    mine_clash = records(mine, "clash")  # the first arrival, from the teammate
    other_clash = records(other, "clash")
    before_local = records(mine, "local")

    report = memstore.import_logs(mine, teammate)
    assert (report.sessions_updated, report.sessions_unchanged, report.sessions_created) == (1, 2, 0)
    assert report.events_appended == 2 * 4
    assert records(mine, "shared") == records(teammate, "shared")
    assert records(mine, "local") == before_local
    assert records(mine, "clash") == mine_clash

    # The other store's "clash" collided with the teammate's: it came in qualified.
    origin_key = store_identity(other).store_id.replace("-", "")[:12]
    qualified = f"clash-from-{origin_key}"
    assert sessions(mine) == sorted(["alpha", "clash", session_dir_name(qualified), "local", "shared"])
    assert records(mine, qualified) == other_clash
    assert session_origins(mine)[session_dir_name(qualified)].store_id == store_identity(other).store_id


def test_a_collision_is_reported_and_a_rerun_changes_nothing(teammate, tmp_path):
    mine = tmp_path / "mine"
    write_turns(mine, "clash", 1, seed=99)
    first = memstore.import_logs(mine, teammate)
    assert first.sessions_created == 3
    qualified = qualified_id("clash", session_origins(mine)["alpha"])
    assert [(r.session_id, r.imported_as) for r in first.renamed] == [("clash", qualified)]
    assert records(mine, qualified) == records(teammate, "clash")
    assert session_origins(mine)[session_dir_name(qualified)].session_id == "clash"
    before = whole_store(mine)
    again = memstore.import_logs(mine, teammate)
    assert (again.sessions_created, again.sessions_updated, again.sessions_unchanged) == (0, 0, 3)
    assert again.events_appended == 0 and again.problems == [] and again.renamed == []
    assert whole_store(mine) == before


def test_a_session_this_store_holds_more_of_is_left_alone(teammate, tmp_path):
    mine = tmp_path / "mine"
    memstore.import_logs(mine, teammate)
    write_turns(mine, "alpha", 2, seed=60)  # continued here after the copy
    grown = records(mine, "alpha")
    report = memstore.import_logs(mine, teammate)
    assert report.sessions_unchanged == 3 and report.events_appended == 0
    assert records(mine, "alpha") == grown


def test_sessions_removed_on_purpose_are_not_brought_back(teammate, tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    Tombstones(mine).record("alpha", TombstoneReason.FORGET)
    report = memstore.import_logs(mine, teammate)
    assert "alpha" not in sessions(mine)
    assert [t.session_id for t in report.tombstoned] == ["alpha"]


def test_a_store_never_imports_itself(teammate):
    before = whole_store(teammate)
    report = memstore.import_logs(teammate, teammate)
    assert report.sessions_created == 0 and any("is this store" in p.reason for p in report.problems)
    assert whole_store(teammate) == before


def test_a_capped_session_keeps_its_seqs_and_first_turn(tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    write_turns(other, "capped", 12, seed=7, max_events=20)
    theirs = records(other, "capped")
    assert theirs[0][0] > 1  # turns were evicted: the log starts past seq 1
    mine = tmp_path / "mine"
    memstore.import_logs(mine, other)
    assert records(mine, "capped") == theirs
    with memstore.read_session(other, "capped") as a, memstore.read_session(mine, "capped") as b:
        assert [t.number for t in a.turns()] == [t.number for t in b.turns()]
        assert (a.manifest.retained_turn_base, a.manifest.next_seq) == (
            b.manifest.retained_turn_base,
            b.manifest.next_seq,
        )


def test_a_session_passed_on_keeps_its_first_origin(teammate, tmp_path):
    middle, last = tmp_path / "middle", tmp_path / "last"
    memstore.import_logs(middle, teammate)
    memstore.import_logs(last, middle)
    origin = session_origins(last)["alpha"]
    assert origin.store_id == store_identity(teammate).store_id and origin.label == "devbox"
    assert origin.via is not None and origin.via["store_id"] == store_identity(middle).store_id


def test_a_vtcode_workspace_is_a_store_to_import(tmp_path):
    """VT Code's ``.vtcode/`` is a store root whose lines carry no seq and no time: its events
    arrive in order with the seqs a reader gives them, and a rerun changes nothing."""
    directory = tmp_path / "workspace" / ".vtcode" / "sessions" / "vt-1"
    directory.mkdir(parents=True)
    events = [
        {"type": "thread.started", "thread_id": "vt-1"},
        {"type": "turn.started"},
        {"type": "item.completed", "item": {"id": "a", "type": "agent_message", "text": "the parser is fixed"}},
        {"type": "turn.completed", "usage": USAGE},
    ]
    lines = [json.dumps({"schema_version": "0.18.0", "event": e}).encode() + b"\n" for e in events]
    (directory / "events.jsonl").write_bytes(b"".join(lines))
    vtcode = tmp_path / "workspace" / ".vtcode"
    assert is_store(vtcode)
    mine = tmp_path / "mine"
    assert memstore.import_logs(mine, vtcode).sessions_created == 1
    assert [(seq, event) for seq, _ts, event in records(mine, "vt-1")] == list(enumerate(events, start=1))
    again = memstore.import_logs(mine, vtcode)
    assert (again.sessions_unchanged, again.events_appended) == (1, 0)
    assert not (directory / "index").exists()  # the workspace was only read


def test_how_two_logs_stand_to_each_other():
    def log(*pairs: tuple[int, str]) -> list[Record]:
        return [Record(seq, "2026-01-01T00:00:00.000Z", {"type": "x", "n": n}) for seq, n in pairs]

    a = log((1, "a"), (2, "b"), (3, "c"))
    assert compare(iter(a[:2]), iter(a)) == (Relation.BEHIND, 2)
    assert compare(iter(a), iter(a[:2])) == (Relation.NOTHING_NEW, 2)
    assert compare(iter(a[1:]), iter(a)) == (Relation.NOTHING_NEW, 3)  # ours evicted seq 1
    assert compare(iter(a), iter(log((1, "a"), (2, "z")))) == (Relation.OTHER, 0)
    assert compare(iter(a), iter(log((7, "q")))) == (Relation.OTHER, 0)
    assert compare(iter([]), iter(a)) == (Relation.BEHIND, 0)


@pytest.mark.slow
@pytest.mark.parametrize(("where", "nth"), [("sync_file_system", 2), ("rename_noreplace", 8)])
def test_a_store_import_killed_part_way_loses_nothing(tmp_path, where, nth):
    other = tmp_path / "other"
    other.mkdir()
    for i in range(17):
        write_turns(other, f"s{i:02d}", 2, seed=i)
    mine = tmp_path / "mine"
    assert import_killed_at(mine, other, where, nth, batch=5) == -signal.SIGKILL
    published = sessions(mine)
    assert 0 < len(published) < 17
    for sid in published:  # whole, never half
        assert records(mine, sid) == records(other, sid)
    report = memstore.import_logs(mine, other)
    assert (report.sessions_unchanged, report.sessions_created) == (len(published), 17 - len(published))
    assert whole_store(mine) == whole_store(other)
    assert not [n for n in os.listdir(mine / "sessions") if n.startswith(STAGING_PREFIX)]
    assert json.loads((mine / "sessions" / "s00" / "derived" / "origin.json").read_bytes())["session_id"] == "s00"


TOKEN = "ghp_" + "aB3dE5fG7hJ9kL2mN4pQ6rS8tU0vW1xY3zA5"


def _a_store(root: Path, label: str) -> Path:
    root.mkdir()
    set_label(root, label)
    return root


def test_a_session_forgotten_here_stays_forgotten_when_a_teammate_sends_it_back(tmp_path):
    """A session of this store that a teammate imported (under a qualified id, beside their own
    session of that id) and that is forgotten here does not come back from their store."""
    mine, theirs = _a_store(tmp_path / "mine", "laptop"), _a_store(tmp_path / "theirs", "devbox")
    write_turns(mine, "s", 2, seed=1)
    write_turns(theirs, "s", 2, seed=2)
    memstore.import_logs(theirs, mine)
    assert len(sessions(theirs)) == 2  # their own s, and mine qualified
    forgotten = records(mine, "s")
    memstore.Store(mine).forget("s")
    report = memstore.import_logs(mine, theirs)
    assert forgotten not in whole_store(mine).values()
    # Their own s shares the forgotten id: kept out too (a tombstone fails closed), and said so.
    assert report.sessions_created == 0 and len(report.tombstoned) == 2


def test_syncing_two_stores_both_ways_never_copies_a_store_its_own_session(tmp_path):
    """Import A into C, continue the session on both sides, then import each into the other:
    neither store gains a copy of its own session under a qualified id."""
    a, c = _a_store(tmp_path / "a", "laptop"), _a_store(tmp_path / "c", "devbox")
    write_turns(a, "s", 2, seed=3)
    memstore.import_logs(c, a)
    write_turns(a, "s", 1, seed=4)
    write_turns(c, "s", 1, seed=5)
    memstore.import_logs(c, a)
    memstore.import_logs(a, c)
    origins = session_origins(a)
    own = store_identity(a).store_id
    assert [name for name, origin in origins.items() if origin.store_id == own] == []
    assert "s" in sessions(a)


def test_a_scrubbed_session_gains_new_turns_from_its_origin_and_no_secret_back(tmp_path):
    """A session scrubbed here after a store import is still the origin's session: the next
    import appends only the new turn, and the scrubbed secret does not come back in a copy."""
    origin, mine = _a_store(tmp_path / "origin", "laptop"), _a_store(tmp_path / "mine", "devbox")
    with memstore.open_session(origin, "s") as log:
        log.append({"type": "turn.started"})
        log.append(
            {
                "type": "item.completed",
                "item": {"id": "c", "type": "command_execution", "command": f"export GITHUB_TOKEN={TOKEN}"},
            }
        )
        log.append({"type": "turn.completed", "usage": USAGE})
    memstore.import_logs(mine, origin)
    memstore.Store(mine).scrub("s")
    write_turns(origin, "s", 1, seed=6)
    report = memstore.import_logs(mine, origin)
    assert sessions(mine) == ["s"] and report.sessions_updated == 1
    assert len(records(mine, "s")) == len(records(origin, "s"))
    assert not any(TOKEN.encode() in p.read_bytes() for p in (mine / "sessions").rglob("events.jsonl"))
