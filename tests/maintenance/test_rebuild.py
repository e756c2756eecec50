"""Rebuilding a session's index: a small log's index is built in memory and written whole (one
write, one fdatasync, one rename); a larger one is rebuilt in place, in batches. Both must give
the same rows, and a crash at any step must leave an index that is either the old one, the new
one, or none (the log is scanned again)."""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import support
from support import writer_env

import memstore
import memstore.maintenance
from memstore.session.index import readonly_uri
from memstore.session.tuning import TUNING

TABLES = {
    "events": "SELECT * FROM events ORDER BY seq",
    "turns": "SELECT * FROM turns ORDER BY number",
    "event_details": "SELECT * FROM event_details ORDER BY seq",
    "chunks": "SELECT seq, part, turn, ts, kind, start_line, end_line, text FROM chunks ORDER BY seq, part",
    "file_changes": "SELECT * FROM file_changes ORDER BY seq, path",
    "derived_state": "SELECT * FROM derived_state",
    "fts": "SELECT rowid FROM chunks_fts WHERE chunks_fts MATCH 'pytest OR edited OR reasoning' ORDER BY rowid",
}


def write_session(root: Path, sid: str = "s", turns: int = 6) -> Path:
    """A session with the events agents write: messages, reasoning, command output of several
    KB, a file change, a failed turn."""
    with memstore.open_session(root, sid, max_events=0) as log:
        log.append({"type": "thread.started", "thread_id": sid})
        for n in range(turns):
            log.append({"type": "turn.started"})
            log.append(
                {
                    "type": "item.completed",
                    "item": {"id": f"r{n}", "type": "reasoning", "text": f"reasoning about step {n} " * 8},
                }
            )
            log.append(
                {
                    "type": "item.completed",
                    "item": {
                        "id": f"c{n}",
                        "type": "command_execution",
                        "command": "pytest -q",
                        "status": "completed",
                        "exit_code": n % 2,
                        "aggregated_output": "".join(f"line {i} of pytest output\n" for i in range(200)),
                    },
                }
            )
            log.append(
                {
                    "type": "item.completed",
                    "item": {
                        "id": f"f{n}",
                        "type": "file_change",
                        "status": "completed",
                        "changes": [{"path": f"src/mod{n}.py", "kind": "update"}],
                    },
                }
            )
            log.append(
                {
                    "type": "item.completed",
                    "item": {"id": f"m{n}", "type": "agent_message", "text": f"edited src/mod{n}.py"},
                }
            )
            if n == 3:
                log.append({"type": "turn.failed", "message": "interrupted"})
            else:
                log.append({"type": "turn.completed", "usage": {"input_tokens": 100 + n, "output_tokens": 10}})
    return memstore.session_directory(root, sid)


def dump(directory: Path) -> dict:
    uri = readonly_uri(directory / "index" / "session.db")  # (creates no WAL side file)
    assert uri is not None
    conn = sqlite3.connect(uri, uri=True)
    try:
        rows = {name: conn.execute(sql).fetchall() for name, sql in TABLES.items()}
        manifest = conn.execute("SELECT * FROM manifest").fetchall()
        columns = [d[0] for d in conn.execute("SELECT * FROM manifest").description]
        rows["manifest"] = [{k: v for k, v in zip(columns, row) if k != "generation"} for row in manifest]
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    finally:
        conn.close()
    return rows


def test_a_small_log_is_rebuilt_in_memory_with_the_rows_of_an_in_place_rebuild(tmp_path, monkeypatch):
    directory = write_session(tmp_path)
    memstore.rebuild(tmp_path, "s")
    index = directory / "index" / "session.db"
    assert sorted(p.name for p in index.parent.iterdir()) == ["session.db"], "a temp file or WAL was left behind"
    assert index.read_bytes()[18:20] == b"\x02\x02", "the index written from memory is not in WAL mode"
    assert (index.stat().st_mode & 0o777) == 0o600
    in_memory = dump(directory)

    monkeypatch.setattr(TUNING, "memory_scan_bytes", 0)
    memstore.rebuild(tmp_path, "s")
    in_place = dump(directory)
    assert in_memory == in_place
    assert in_memory["chunks"] and in_memory["fts"] and in_memory["file_changes"] and in_memory["event_details"]
    assert in_memory["derived_state"] == [(1, in_memory["events"][-1][0])], "the rebuild did not derive every record"


def test_an_index_rebuilt_in_memory_is_usable_by_writers_and_readers(tmp_path):
    directory = write_session(tmp_path, turns=2)
    memstore.rebuild(tmp_path, "s")
    with memstore.open_session(tmp_path, "s") as log:
        log.append({"type": "turn.started"})
        log.append(
            {"type": "item.completed", "item": {"id": "late", "type": "agent_message", "text": "after the rebuild"}}
        )
        log.append({"type": "turn.completed", "usage": {}})
        assert log.turn_count == 3
    with memstore.read_session(tmp_path, "s") as reader:
        assert [t.number for t in reader.turns()] == [1, 2, 3]
    assert dump(directory)["events"][-1][0] == 16
    hits = memstore.search_memory(tmp_path, "rebuild")
    assert [h.session_id for h in hits] == ["s"]


def test_fts_rows_added_in_one_statement_stay_consistent_through_evictions(tmp_path, monkeypatch):
    """The chunks reach their FTS5 table from a staging table in one statement: the external
    content index must still match the table, also after cap rewrites deleted some."""
    monkeypatch.setattr(TUNING, "derive_idle_seconds", 0.01)
    directory = write_session(tmp_path, turns=3)
    with memstore.open_session(tmp_path, "s", max_events=12) as log:
        for n in range(4):
            log.append({"type": "turn.started"})
            log.append(
                {
                    "type": "item.completed",
                    "item": {"id": f"x{n}", "type": "agent_message", "text": f"pytest again {n}"},
                }
            )
            log.append({"type": "turn.completed", "usage": {}})
            support.wait_until_derived(directory, log.manifest.next_seq - 1)
        assert log.manifest.retained_turn_base > 1, "no cap rewrite happened: nothing was tested"
    conn = sqlite3.connect(directory / "index" / "session.db")
    try:
        conn.execute("INSERT INTO chunks_fts(chunks_fts) VALUES ('integrity-check')")
        matched = conn.execute("SELECT count(*) FROM chunks_fts WHERE chunks_fts MATCH 'pytest'").fetchone()[0]
        expected = conn.execute("SELECT count(*) FROM chunks WHERE text LIKE '%pytest%'").fetchone()[0]
    finally:
        conn.close()
    assert matched == expected > 0


# Dies like a SIGKILL between writing the new index (synced, beside the old one) and renaming it
# into place.
KILLED_BEFORE_THE_RENAME = r"""
import os, signal, sys
import memstore, memstore.session.index
real_rename = os.rename
def rename(src, dst):
    if ".session.db.tmp-" in str(src):
        os.kill(os.getpid(), signal.SIGKILL)
    real_rename(src, dst)
memstore.session.index.os.rename = rename
memstore.rebuild(sys.argv[1], sys.argv[2])
"""


def test_a_rebuild_killed_before_its_rename_leaves_the_old_index_and_its_temp_file_goes(tmp_path):
    directory = write_session(tmp_path, turns=2)
    before = dump(directory)
    proc = subprocess.run(
        [sys.executable, "-c", KILLED_BEFORE_THE_RENAME, str(tmp_path), "s"],
        capture_output=True,
        timeout=60,
        env=writer_env(),
    )
    assert proc.returncode == -signal.SIGKILL, f"the rebuild was not killed at its rename: {proc.stderr.decode()}"
    index_dir = directory / "index"
    assert [p.name for p in index_dir.glob(".session.db.tmp-*")], "the kill left no temp index: nothing was tested"
    assert dump(directory) == before, "the old index changed before the new one was in place"
    with memstore.open_session(tmp_path, "s") as log:
        assert log.turn_count == 2
    assert not list(index_dir.glob(".session.db.tmp-*")), "the dead rebuild's temp index was not removed"


# A writer killed with its index open: the index has WAL side files, the WAL holding frames.
KILLED_WITH_ITS_INDEX_OPEN = r"""
import os, signal, sys
import memstore
log = memstore.open_session(sys.argv[1], sys.argv[2], max_events=0)
for n in range(3):
    log.append({"type": "turn.started"})
    log.append({"type": "item.completed", "item": {"id": str(n), "type": "agent_message", "text": "late words"}})
    log.append({"type": "turn.completed", "usage": {}})
log.flush()
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_rebuild_never_lets_a_dead_writers_wal_into_the_new_index(tmp_path, monkeypatch):
    directory = write_session(tmp_path, turns=2)
    proc = subprocess.run(
        [sys.executable, "-c", KILLED_WITH_ITS_INDEX_OPEN, str(tmp_path), "s"],
        capture_output=True,
        timeout=60,
        env=writer_env(),
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()
    wal = directory / "index" / "session.db-wal"
    assert wal.exists() and wal.stat().st_size > 0, "the killed writer left no WAL: nothing was tested"
    memstore.rebuild(tmp_path, "s")
    assert not wal.exists()
    rebuilt = dump(directory)
    assert rebuilt["manifest"][0]["turn_count"] == 5
    assert [row[0] for row in rebuilt["events"]] == list(range(1, len(rebuilt["events"]) + 1))
    # The same rows as a rebuild in place, which starts from an empty file.
    monkeypatch.setattr(TUNING, "memory_scan_bytes", 0)
    memstore.rebuild(tmp_path, "s")
    assert dump(directory) == rebuilt


def small_store(root: Path, n: int) -> list[str]:
    ids = [f"run-{i:03d}" for i in range(n)]
    for sid in ids:
        with memstore.open_session(root, sid, max_events=0) as log:
            log.append({"type": "turn.started"})
            log.append(
                {"type": "item.completed", "item": {"id": "m", "type": "agent_message", "text": f"hello from {sid}"}}
            )
            log.append({"type": "turn.completed", "usage": {"input_tokens": len(sid)}})
    return ids


def test_worker_processes_rebuild_every_session_as_this_process_does(tmp_path, monkeypatch):
    import memstore.session.log

    ids = small_store(tmp_path, 40)  # more than two tasks of sessions: the workers are used
    held = memstore.open_session(tmp_path, ids[5])  # rebuilt here, under its lock
    rebuilt_here = []
    real = memstore.maintenance._rebuild_session
    monkeypatch.setattr(
        memstore.maintenance, "_rebuild_session", lambda root, sid: rebuilt_here.append(sid) or real(root, sid)
    )
    try:
        held.append({"type": "turn.started"})
        manifests = memstore.rebuild(tmp_path, jobs=2)
        assert rebuilt_here == [ids[5]], "the workers did not rebuild the others (or this process did)"
        assert [m.session_id for m in manifests] == ids
        assert manifests[5].in_turn and manifests[5].event_count == 4
        in_workers = {sid: dump(memstore.session_directory(tmp_path, sid)) for sid in ids}
    finally:
        held.close()
    memstore.rebuild(tmp_path, jobs=1)
    here = {sid: dump(memstore.session_directory(tmp_path, sid)) for sid in ids}
    assert in_workers == here
    assert [h.session_id for h in memstore.search_memory(tmp_path, "hello run-007")][:1] == ["run-007"]


# Holds a session open (its lock taken) until its stdin closes.
HOLDER = r"""
import sys
import memstore
log = memstore.open_session(sys.argv[1], sys.argv[2])
print("open", flush=True)
sys.stdin.read()
"""


def test_a_session_failing_in_a_worker_is_reported_with_its_error_and_the_rest_rebuilt(tmp_path):
    from click.testing import CliRunner

    from memstore.cli import cli

    ids = small_store(tmp_path, 40)
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(tmp_path), ids[17]],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=writer_env(),
    )
    try:
        assert holder.stdout.readline() == b"open\n"
        result = CliRunner().invoke(cli, ["rebuild", "--all", "--jobs", "2", "--json", "--root", str(tmp_path)])
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
    assert result.exit_code == 1, result.output + result.stderr
    import json

    rows = json.loads(result.stdout)
    assert [r["session_id"] for r in rows] == ids
    failed = [r for r in rows if "error" in r]
    assert [r["session_id"] for r in failed] == [ids[17]]
    assert "open in another process" in failed[0]["error"]
    assert all(r["event_count"] == 3 for r in rows if "error" not in r)


# A writer killed with its index open after handing out seqs 1-10.
KILLED_AFTER_TEN_SEQS = r"""
import os, signal, sys
import memstore
log = memstore.open_session(sys.argv[1], "s", max_events=0)
for n in range(5):
    log.append({"type": "turn.started"})
    log.append({"type": "turn.completed", "usage": {}})
log.flush()
os.kill(os.getpid(), signal.SIGKILL)
"""


def lost_suffix_without_manifest(root: Path) -> Path:
    """A session whose old index (with a dead writer's side files) counted seqs 1-10, whose log
    lost its last 3 records and whose manifest.json is gone, as a power cut can leave it."""
    proc = subprocess.run(
        [sys.executable, "-c", KILLED_AFTER_TEN_SEQS, str(root)], capture_output=True, timeout=60, env=writer_env()
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()
    directory = memstore.session_directory(root, "s")
    lines = (directory / "events.jsonl").read_bytes().splitlines(keepends=True)
    (directory / "events.jsonl").write_bytes(b"".join(lines[:7]))
    (directory / "manifest.json").unlink()
    return directory


def test_a_rebuild_killed_between_removing_the_old_index_and_its_rename_hands_out_no_seq_again(tmp_path):
    directory = lost_suffix_without_manifest(tmp_path)
    assert (directory / "index" / "session.db-wal").exists()
    proc = subprocess.run(
        [sys.executable, "-c", KILLED_BEFORE_THE_RENAME, str(tmp_path), "s"],
        capture_output=True,
        timeout=60,
        env=writer_env(),
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()
    assert not (directory / "index" / "session.db").exists(), "the old index was not removed: nothing was tested"
    with memstore.open_session(tmp_path, "s", max_events=0) as log:
        assert log.append({"type": "turn.started"}) == 11


def test_an_old_index_with_a_wal_but_no_shm_still_tells_the_rebuild_its_seqs(tmp_path):
    directory = lost_suffix_without_manifest(tmp_path)
    (directory / "index" / "session.db-shm").unlink()
    memstore.rebuild(tmp_path, "s")
    with memstore.open_session(tmp_path, "s", max_events=0) as log:
        assert log.append({"type": "turn.started"}) == 11


def test_a_hot_rollback_journal_beside_the_old_index_never_reaches_the_new_one(tmp_path):
    with memstore.open_session(tmp_path, "s", max_events=0) as log:
        for n in range(300):
            log.append(
                {"type": "item.completed", "item": {"id": str(n), "type": "agent_message", "text": f"word{n} " * 40}}
            )
    db = memstore.session_directory(tmp_path, "s") / "index" / "session.db"
    conn = sqlite3.connect(db)
    conn.execute("PRAGMA journal_mode=DELETE")
    conn.close()
    killed_mid_transaction = (
        "import sqlite3, os, signal\n"
        f"c = sqlite3.connect({str(db)!r}, isolation_level=None)\n"
        "c.execute('PRAGMA cache_size=1'); c.execute('BEGIN'); c.execute('DELETE FROM chunks')\n"
        "c.execute('UPDATE events SET ts = NULL')\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    subprocess.run([sys.executable, "-c", killed_mid_transaction], check=False, timeout=60)
    assert (db.parent / "session.db-journal").exists(), "no hot journal was left: nothing was tested"
    memstore.rebuild(tmp_path, "s")
    assert sorted(p.name for p in db.parent.iterdir()) == ["session.db"]
    rows = dump(db.parent.parent)
    assert len(rows["events"]) == 300 and all(row[4] is not None for row in rows["events"])


def test_a_failing_lazy_derived_table_does_not_fail_a_rebuild(tmp_path, caplog):
    from memstore.session.index import DerivedTable, MigrationSet, register_derived_table, unregister_derived_table

    with memstore.open_session(tmp_path, "s", max_events=0) as log:
        log.append({"type": "turn.started"})
        log.append({"type": "turn.completed", "usage": {}})
    register_derived_table(
        DerivedTable(
            "broken",
            MigrationSet("test.broken", (("broken", lambda db: db["broken"].create({"seq": int})),)),
            lambda conn, records: conn.execute("INSERT INTO no_such_table VALUES (1)"),
            lambda conn, first_kept_seq: None,
            lambda conn: None,
            lazy=True,
        )
    )
    try:
        manifest = memstore.rebuild(tmp_path, "s")
    finally:
        unregister_derived_table("broken")
    assert manifest.turn_count == 1
    assert "no_such_table" in caplog.text
    assert dump(memstore.session_directory(tmp_path, "s"))["events"], "the index was not rebuilt"


def test_worker_rebuilds_report_bad_and_repeated_ids_one_by_one(tmp_path):
    ids = small_store(tmp_path, 40)
    outcomes = list(memstore.rebuild_each(tmp_path, [ids[0], "..", *ids, ids[3]], jobs=2))
    assert [sid for sid, _ in outcomes] == [ids[0], "..", *ids[1:]]
    errors = [sid for sid, outcome in outcomes if isinstance(outcome, memstore.MemstoreError)]
    assert errors == [".."]


def test_derived_tables_registered_here_keep_the_rebuild_in_this_process(tmp_path, monkeypatch):
    import memstore.session.log
    from memstore.session.index import DerivedTable, MigrationSet, register_derived_table, unregister_derived_table

    ids = small_store(tmp_path, 40)
    register_derived_table(
        DerivedTable(
            "kinds",
            MigrationSet("test.kinds", (("kinds", lambda db: db["kinds"].create({"seq": int, "type": str})),)),
            lambda conn, records: conn.executemany(
                "INSERT INTO kinds VALUES (?, ?)", [(r.seq, r.event["type"]) for r in records]
            ),
            lambda conn, first_kept_seq: None,
            lambda conn: conn.execute("DELETE FROM kinds"),
            lazy=True,
        )
    )
    rebuilt_here = []
    real = memstore.maintenance._rebuild_session
    monkeypatch.setattr(
        memstore.maintenance, "_rebuild_session", lambda root, sid: rebuilt_here.append(sid) or real(root, sid)
    )
    try:
        memstore.rebuild(tmp_path, jobs=2)
    finally:
        unregister_derived_table("kinds")
    assert rebuilt_here == ids
    conn = sqlite3.connect(
        readonly_uri(memstore.session_directory(tmp_path, ids[0]) / "index" / "session.db"), uri=True
    )
    try:
        assert conn.execute("SELECT type FROM kinds ORDER BY seq").fetchall() == [
            ("turn.started",),
            ("item.completed",),
            ("turn.completed",),
        ]
    finally:
        conn.close()
