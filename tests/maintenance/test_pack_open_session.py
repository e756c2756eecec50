"""Audit packs of sessions that are open, idle, recently used or closed.

The invariant: a pack verifies for as long as the log, the manifest, the other files and what
the SQLite index holds are unchanged, whatever happens to the index's bytes meanwhile (its
-wal/-shm side files moving while the session idles and the deriver fills the search tables, the
checkpoint at close), and packing writes nothing into the session. Appending one event makes
verification fail, naming events.jsonl.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sqlite3
import subprocess
import sys
import textwrap

import orjson
import pytest
from click.testing import CliRunner
from support import wait_until_derived

import memstore
import memstore.session.deriver
from memstore import InvalidPack, create_audit_pack, read_audit_pack, verify_audit_pack, write_audit_pack
from memstore.cli import cli
from memstore.session.tuning import TUNING

SID = "run-20260812T093610Z"

# A realistic session: prompts, reasoning, commands with their output (one of many KB), tool
# calls and file changes, in VT Code's event shapes.
SENTENCES = [
    "The failing test in crates/core/src/config.rs expects the default timeout to be thirty seconds.",
    "I read the loader and it falls back to the environment variable only when the file is missing.",
    "Running cargo test for the config crate shows two failures, both about precedence of overrides.",
    "The fix is to apply the workspace file first and the user file second, then the environment.",
    "I updated the documentation comment so the precedence is described in the same order as the code.",
    "Clippy reports a needless clone in the merge helper; removing it keeps the borrow checker happy.",
    "The integration suite spawns the binary with a temporary home directory to isolate the settings.",
    "A snapshot test captures the rendered help text, so the new flag description must be updated too.",
]


def sentence(n: int, count: int) -> str:
    return " ".join(SENTENCES[(n + i) % len(SENTENCES)] for i in range(count))


def turn_events(n: int) -> list[dict]:
    """One turn of about 3 KB, with a command output of several KB every third turn."""
    output = "\n".join(f"test config::tests::case_{n}_{i} ... ok" for i in range(12 if n % 3 else 180))
    return [
        {"type": "turn.started"},
        {"type": "item.completed", "item": {"id": f"msg_{n}", "type": "user_message", "text": sentence(n, 2)}},
        {"type": "item.completed", "item": {"id": f"reason_{n}", "type": "reasoning", "text": sentence(n + 1, 3)}},
        {
            "type": "item.completed",
            "item": {
                "id": f"cmd_{n}",
                "type": "command_execution",
                "command": "cargo test -p config",
                "aggregated_output": output,
                "exit_code": 0,
                "status": "completed",
            },
        },
        {
            "type": "item.completed",
            "item": {
                "id": f"fc_{n}",
                "type": "file_change",
                "status": "completed",
                "changes": [{"path": "crates/core/src/config.rs", "kind": "update"}],
            },
        },
        {"type": "item.completed", "item": {"id": f"ans_{n}", "type": "agent_message", "text": sentence(n + 2, 2)}},
        {
            "type": "turn.completed",
            "usage": {
                "input_tokens": 1200 + n,
                "cached_input_tokens": 800,
                "cache_creation_tokens": 0,
                "output_tokens": 150,
            },
        },
    ]


def write_turns(log, turns: int) -> None:
    log.append({"type": "thread.started", "thread_id": SID})
    for n in range(1, turns + 1):
        for event in turn_events(n):
            log.append(event)
    log.flush()


def session_dir(root):
    return root / "sessions" / SID


def index_bytes(directory) -> dict:
    """The SHA-256 of the index file and of each of its side files that exists."""
    found = {}
    for name in ("session.db", "session.db-wal", "session.db-shm"):
        path = directory / "index" / name
        if path.exists():
            found[name] = hashlib.sha256(path.read_bytes()).hexdigest()
    return found


def change_index(db, *statements) -> None:
    """Run ``statements`` on the index behind memstore's back, and close (checkpointing the WAL)."""
    conn = sqlite3.connect(db, isolation_level=None)  # each statement commits
    try:
        for statement in statements:
            conn.execute(statement)
    finally:
        conn.close()


def tree(directory) -> dict:
    return {p.relative_to(directory): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


@pytest.fixture
def resting_deriver(monkeypatch):
    """The deriver never starts on its own (the agent "never rests"): the test says when the
    search tables are filled, with :func:`derive_now`, so a pack is made while they lag behind
    the log, as when a user packs a session just used, without depending on timing."""
    monkeypatch.setattr(TUNING, "derive_idle_seconds", 3600)


def derive_now(log) -> None:
    """Do what the session's background deriver does once the agent is idle: fill the lazily
    derived tables for every record past the watermark, in the index's own transactions."""
    memstore.session.deriver.derive_all(log._writer)


def watermark_in(pack) -> int:
    return {t.name: t.through_seq for t in pack.databases[0].tables}["chunks"]


def test_a_pack_of_a_session_open_in_this_process_verifies_while_it_idles_and_after_close(tmp_path, resting_deriver):
    log = memstore.open_session(tmp_path, SID)
    write_turns(log, 6)
    last_seq = log.manifest.next_seq - 1
    pack, path = write_audit_pack(tmp_path, SID)
    packed_bytes = index_bytes(session_dir(tmp_path))
    assert [d.path for d in pack.databases] == ["index/session.db"]
    assert watermark_in(pack) == 0  # packed before the deriver ran
    assert not [e.path for e in pack.entries if e.path.startswith("index/session.db")]
    # While the session idles, the deriver writes the search tables: the index's bytes change.
    derive_now(log)
    wait_until_derived(session_dir(tmp_path), last_seq)
    assert index_bytes(session_dir(tmp_path)) != packed_bytes
    result = verify_audit_pack(tmp_path, SID, read_audit_pack(path))
    assert (result.verified, result.mismatches, result.missing, result.unaccounted) == (True, [], [], [])
    log.close()  # the checkpoint rewrites session.db and removes its side files
    assert set(index_bytes(session_dir(tmp_path))) == {"session.db"}
    result = verify_audit_pack(tmp_path, SID, read_audit_pack(path))
    assert (result.verified, result.mismatches, result.missing, result.unaccounted) == (True, [], [], [])
    # Opened and closed again, nothing appended: still the same session.
    memstore.open_session(tmp_path, SID).close()
    assert verify_audit_pack(tmp_path, SID, read_audit_pack(path)).verified
    with memstore.open_session(tmp_path, SID) as log:
        log.append({"type": "item.completed", "item": {"id": "late", "type": "agent_message", "text": sentence(3, 1)}})
    result = verify_audit_pack(tmp_path, SID, read_audit_pack(path))
    assert not result.verified
    assert "events.jsonl" in result.mismatches
    assert set(result.mismatches) <= {"events.jsonl", "manifest.json", "index/session.db"}


HOLDER = textwrap.dedent("""
    import os
    import sys
    import memstore
    from memstore.session.tuning import TUNING
    root, sid = sys.argv[1], sys.argv[2]
    sys.path[:0] = [sys.argv[3], os.path.dirname(sys.argv[3])]
    from test_pack_open_session import derive_now, write_turns
    TUNING.derive_idle_seconds = 3600  # derived when the test says so (see resting_deriver)
    log = memstore.open_session(root, sid)
    write_turns(log, 5)
    print(log.manifest.next_seq - 1, flush=True)
    for line in sys.stdin:
        command = line.strip()
        if command == "derive":
            derive_now(log)
        elif command == "append":
            log.append({"type": "item.completed", "item": {"id": "extra", "type": "agent_message", "text": "one more"}})
            log.flush()
        elif command == "close":
            log.close()
            print("closed", flush=True)
            break
        print("done", flush=True)
""")


def test_a_pack_of_a_session_held_by_another_process_verifies_until_an_event_is_appended(tmp_path):
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(tmp_path), SID, os.path.dirname(__file__)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        last_seq = int(holder.stdout.readline())
        assert memstore.is_live(session_dir(tmp_path))
        pack, path = write_audit_pack(tmp_path, SID)
        packed_bytes = index_bytes(session_dir(tmp_path))
        assert watermark_in(pack) == 0  # packed before the holder's deriver ran
        holder.stdin.write("derive\n")  # the holder idles: its deriver fills the search tables
        holder.stdin.flush()
        assert holder.stdout.readline().strip() == "done"
        wait_until_derived(session_dir(tmp_path), last_seq)
        assert index_bytes(session_dir(tmp_path)) != packed_bytes
        result = verify_audit_pack(tmp_path, SID, read_audit_pack(path))
        assert (result.verified, result.mismatches, result.missing, result.unaccounted) == (True, [], [], [])
        holder.stdin.write("close\n")
        holder.stdin.flush()
        assert holder.stdout.readline().strip() == "closed"
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)
    assert holder.returncode == 0
    result = verify_audit_pack(tmp_path, SID, read_audit_pack(path))
    assert (result.verified, result.mismatches, result.missing, result.unaccounted) == (True, [], [], [])
    with memstore.open_session(tmp_path, SID) as log:
        log.append({"type": "item.completed", "item": {"id": "late", "type": "agent_message", "text": sentence(1, 1)}})
    result = verify_audit_pack(tmp_path, SID, pack)
    assert not result.verified and "events.jsonl" in result.mismatches


def test_an_event_appended_while_the_session_is_held_elsewhere_fails_verification(tmp_path):
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(tmp_path), SID, os.path.dirname(__file__)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        holder.stdout.readline()
        pack = create_audit_pack(tmp_path, SID)
        holder.stdin.write("append\n")
        holder.stdin.flush()
        assert holder.stdout.readline().strip() == "done"
        result = verify_audit_pack(tmp_path, SID, pack)
        assert not result.verified
        assert result.mismatches == ["events.jsonl", "index/session.db", "manifest.json"]
        assert "table 'events' holds" in result.details["index/session.db"]
    finally:
        holder.stdin.write("close\n")
        holder.stdin.close()
        holder.wait(timeout=60)


def test_packing_writes_nothing_into_the_session(tmp_path):
    """A closed session is read immutable: no -wal or -shm appears, no byte changes."""
    with memstore.open_session(tmp_path, SID) as log:
        write_turns(log, 3)
    before = tree(session_dir(tmp_path))
    pack = create_audit_pack(tmp_path, SID)
    assert verify_audit_pack(tmp_path, SID, pack).verified
    assert tree(session_dir(tmp_path)) == before


def test_a_wal_left_without_its_shm_is_read_from_a_private_copy(tmp_path):
    """A writer killed before it closed leaves session.db-wal (with rows session.db lacks);
    without its -shm a read-only open would create one and an immutable one would ignore the
    WAL: the pack reads a copy, and the session is left as it was."""
    code = (
        "import os, sys, memstore\n"
        "sys.path[:0] = [sys.argv[3], os.path.dirname(sys.argv[3])]\n"
        "from test_pack_open_session import write_turns\n"
        "log = memstore.open_session(sys.argv[1], sys.argv[2])\n"
        "write_turns(log, 4)\n"
        "os._exit(0)\n"
    )
    subprocess.run([sys.executable, "-c", code, str(tmp_path), SID, os.path.dirname(__file__)], check=True, timeout=60)
    (session_dir(tmp_path) / "index" / "session.db-shm").unlink()
    assert (session_dir(tmp_path) / "index" / "session.db-wal").stat().st_size > 0
    before = tree(session_dir(tmp_path))
    pack = create_audit_pack(tmp_path, SID)
    assert tree(session_dir(tmp_path)) == before
    [database] = pack.databases
    assert {t.name: t.rows for t in database.tables}["events"] == 1 + 4 * 7  # the WAL's rows are there
    assert verify_audit_pack(tmp_path, SID, pack).verified
    assert tree(session_dir(tmp_path)) == before


# --------------------------------------------------------------------------------------------
# What the index holds is covered: changing it fails verification, whatever the log says


@pytest.fixture
def closed_session(tmp_path, resting_deriver):
    """A closed session of three turns whose search tables are derived; its index's path."""
    with memstore.open_session(tmp_path, SID) as log:
        write_turns(log, 3)
        derive_now(log)
    return session_dir(tmp_path) / "index" / "session.db"


def test_a_changed_row_of_the_index_fails_verification_naming_the_table(tmp_path, closed_session):
    db = closed_session
    pack = create_audit_pack(tmp_path, SID)
    change_index(db, "UPDATE turns SET output_tokens = output_tokens + 1 WHERE number = 2")
    result = verify_audit_pack(tmp_path, SID, pack)
    assert (result.verified, result.mismatches) == (False, ["index/session.db"])
    assert result.details == {"index/session.db": "the rows of table 'turns' changed"}


def test_a_changed_search_chunk_fails_verification(tmp_path, closed_session):
    """The lazily derived tables are covered up to the watermark at packing time."""
    db = closed_session
    pack = create_audit_pack(tmp_path, SID)
    [database] = pack.databases
    assert {t.name: t.through_seq for t in database.tables}["chunks"] == 1 + 3 * 7
    change_index(db, "UPDATE chunks SET text = 'nothing to see here' WHERE seq = 3")
    result = verify_audit_pack(tmp_path, SID, pack)
    assert result.mismatches == ["index/session.db"]
    assert result.details["index/session.db"] == "the rows of table 'chunks' changed"


def test_an_index_that_is_not_a_database_any_more_is_a_mismatch(tmp_path, closed_session):
    db = closed_session
    pack = create_audit_pack(tmp_path, SID)
    db.write_bytes(b"not a database at all, just bytes" * 200)
    result = verify_audit_pack(tmp_path, SID, pack)
    assert result.mismatches == ["index/session.db"]
    assert result.details["index/session.db"].startswith("not a readable SQLite database")


def test_an_index_replaced_by_a_symlink_to_an_identical_copy_is_a_mismatch(tmp_path, closed_session):
    db = closed_session
    pack = create_audit_pack(tmp_path, SID)
    copy = tmp_path / "copy.db"
    shutil.copyfile(db, copy)
    db.unlink()
    db.symlink_to(copy)
    result = verify_audit_pack(tmp_path, SID, pack)
    assert result.mismatches == ["index/session.db"] and result.details["index/session.db"] == "is a symlink"
    assert not create_audit_pack(tmp_path, SID).databases  # never followed while packing either


def test_a_removed_index_is_missing(tmp_path, closed_session):
    db = closed_session
    pack = create_audit_pack(tmp_path, SID)
    db.unlink()
    result = verify_audit_pack(tmp_path, SID, pack)
    assert (result.verified, result.missing, result.mismatches) == (False, ["index/session.db"], [])


def test_the_same_log_with_a_different_tail_fails_even_if_the_index_is_untouched(tmp_path, closed_session):
    """Same size, other bytes: the log is covered byte for byte."""
    pack = create_audit_pack(tmp_path, SID)
    log_path = session_dir(tmp_path) / "events.jsonl"
    data = log_path.read_bytes()
    log_path.write_bytes(data[:-20] + data[-20:].replace(b"0", b"1"))
    assert verify_audit_pack(tmp_path, SID, pack).mismatches == ["events.jsonl"]


def test_an_index_that_cannot_be_read_as_sqlite_is_packed_by_its_bytes(tmp_path, closed_session):
    db = closed_session
    db.write_bytes(b"garbage, not SQLite" * 100)
    pack = create_audit_pack(tmp_path, SID)
    assert pack.databases == []
    assert "index/session.db" in [e.path for e in pack.entries]
    assert verify_audit_pack(tmp_path, SID, pack).verified


# --------------------------------------------------------------------------------------------
# The format: compatible with VT Code's and with packs made before


def test_the_pack_json_keeps_vtcode_shape_and_adds_databases_last(tmp_path, closed_session):
    _, path = write_audit_pack(tmp_path, SID)
    data = orjson.loads(path.read_bytes())
    assert list(data) == [
        "schema_version",
        "session_id",
        "generated_at",
        "status",
        "turn_count",
        "event_count",
        "entries",
        "databases",
    ]
    assert data["schema_version"] == 1
    [database] = data["databases"]
    assert list(database) == ["path", "digest", "sha256", "tables"]
    assert database["digest"] == "sqlite-rows-v1"
    names = [t["name"] for t in database["tables"]]
    assert names[0] == "sqlite_schema" and names[1:] == sorted(names[1:])
    assert {"events", "turns", "manifest", "chunks", "event_details", "file_changes"} <= set(names)
    assert not {"derived_state", "chunks_fts", "chunks_fts_data", "sqlite_stat1"} & set(names)
    assert read_audit_pack(path).databases[0].tables[0].name == "sqlite_schema"


def test_a_pack_made_before_lists_the_index_by_bytes_and_still_verifies_so(tmp_path, closed_session):
    """An older pack (no databases; the index and its side files among the entries) is checked
    as it was made: byte for byte."""
    db = closed_session
    pack = create_audit_pack(tmp_path, SID)
    data = pack.to_dict()
    del data["databases"]
    data["entries"].append(
        {"path": "index/session.db", "bytes": db.stat().st_size, "sha256": hashlib.sha256(db.read_bytes()).hexdigest()}
    )
    data["entries"].sort(key=lambda e: e["path"])
    old = tmp_path / "old-pack.json"
    old.write_bytes(orjson.dumps(data))
    loaded = read_audit_pack(old)
    assert loaded.databases == []
    assert verify_audit_pack(tmp_path, SID, loaded).verified
    # Same rows, other bytes (the schema cookie moved): the old pack sees a mismatch.
    change_index(db, "CREATE TABLE scratch (x)", "DROP TABLE scratch")
    assert verify_audit_pack(tmp_path, SID, loaded).mismatches == ["index/session.db"]
    assert verify_audit_pack(tmp_path, SID, pack).verified  # a new pack does not


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda d: d["databases"][0].update(digest="sqlite-pages-v9"), "unsupported digest"),
        (lambda d: d["databases"][0].update(path="../outside.db"), "database path '../outside.db'"),
        (lambda d: d["databases"][0].update(path="events.jsonl"), "listed twice"),
        (lambda d: d["databases"][0]["tables"][0].update(rows=-1), "'rows' must be"),
        (lambda d: d["databases"][0]["tables"][1].update(through_seq="7"), "'through_seq' must be"),
        (lambda d: d.update(databases={}), "'databases' must be a list"),
    ],
)
def test_malformed_database_entries_are_invalid_packs(tmp_path, closed_session, change, message):
    data = create_audit_pack(tmp_path, SID).to_dict()
    change(data)
    path = tmp_path / "pack.json"
    path.write_bytes(orjson.dumps(data))
    with pytest.raises(InvalidPack, match=message):
        verify_audit_pack(tmp_path, SID, read_audit_pack(path))


def test_cli_pack_and_verify_an_open_session(tmp_path, resting_deriver):
    log = memstore.open_session(tmp_path, SID)
    try:
        write_turns(log, 4)
        runner = CliRunner()
        assert runner.invoke(cli, ["pack", SID, "--root", str(tmp_path)]).exit_code == 0
        derive_now(log)
        result = runner.invoke(cli, ["verify", SID, "--root", str(tmp_path), "--json"])
        assert result.exit_code == 0, result.output
        assert orjson.loads(result.output) == {"verified": True, "mismatches": [], "missing": [], "unaccounted": []}
    finally:
        log.close()
    assert CliRunner().invoke(cli, ["verify", SID, "--root", str(tmp_path)]).exit_code == 0


def test_rewriting_the_index_without_changing_its_rows_still_verifies(tmp_path, closed_session):
    """VACUUM renumbers pages (and rowids of tables without a primary key) and a forced
    checkpoint moves bytes between the WAL and the file: the rows are the same."""
    db = closed_session
    pack = create_audit_pack(tmp_path, SID)
    before = hashlib.sha256(db.read_bytes()).hexdigest()
    change_index(db, "VACUUM", "PRAGMA wal_checkpoint(TRUNCATE)")
    assert hashlib.sha256(db.read_bytes()).hexdigest() != before
    result = verify_audit_pack(tmp_path, SID, pack)
    assert (result.verified, result.mismatches, result.unaccounted) == (True, [], [])


def test_readers_and_the_catalog_leave_a_pack_verified(tmp_path, closed_session):
    """Reading the session (read_session, search, the catalog refresh) writes nothing a pack
    covers."""
    pack = create_audit_pack(tmp_path, SID)
    with memstore.read_session(tmp_path, SID) as reader:
        assert reader.event_count == 1 + 3 * 7
    memstore.search_memory(tmp_path, "precedence of overrides")
    result = verify_audit_pack(tmp_path, SID, pack)
    assert (result.verified, result.mismatches, result.missing) == (True, [], [])


def test_a_pack_of_a_session_without_an_index_is_vtcodes_format(tmp_path):
    """VT Code's own session (index/turns.json, no SQLite): no databases key, entries only."""
    directory = tmp_path / "sessions" / SID
    (directory / "index").mkdir(parents=True)
    (directory / "events.jsonl").write_bytes(b'{"schema_version":"0.18.0","event":{"type":"turn.started"}}\n')
    (directory / "index" / "turns.json").write_bytes(b'{"entries":[]}')
    (directory / "manifest.json").write_bytes(
        orjson.dumps(
            {
                "session_id": SID,
                "schema_version": 1,
                "created_at": "2026-09-01T10:00:00+00:00",
                "updated_at": "2026-09-01T10:00:00+00:00",
                "turn_count": 0,
                "event_count": 1,
                "status": "active",
                "in_turn": True,
                "persisted_file_len": 60,
                "retained_turn_base": 1,
            }
        )
    )
    _, path = write_audit_pack(tmp_path, SID)
    data = orjson.loads(path.read_bytes())
    assert "databases" not in data
    assert [e["path"] for e in data["entries"]] == ["events.jsonl", "index/turns.json", "manifest.json"]
    assert verify_audit_pack(tmp_path, SID, read_audit_pack(path)).verified
