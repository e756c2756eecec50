"""Redaction of what an import writes through the pipeline's staging area (new sessions written
whole, and sessions of another store).

Invariants: with ``[redact] at_write`` no secret of a source reaches the log or the index of a
staged session, which holds exactly what the one-by-one import through the writer holds; by
default the log keeps the source's text and the index (search chunks) holds no secret; another
store's session merged into a store that redacts at write is recognised as the same session
(not imported a second time under a qualified id).
"""

from __future__ import annotations

import sqlite3
import sys
import time
from pathlib import Path

import memstore
from memstore.importers.run import import_source
from memstore.importers.sources import discover
from memstore.tombstones import Tombstones

sys.path.insert(0, str(Path(__file__).parent))

from generate import CODEX_SID, codex_rollout  # noqa: E402

KEY = "ghp_R8kq2LmV7xTz4NcWb9YdHs3PfJa6Ue1Go5Qi"
AT_WRITE = "[redact]\nat_write = true\n"


def rollout_with_a_secret(tmp_path: Path) -> Path:
    data, _ = codex_rollout(12, seed=9)
    assert b"cargo test" in data
    source = tmp_path / "src" / "rollout-2026-02-12T09-00-00-019c7777-5555-7000-8000-00000000e777.jsonl"
    source.parent.mkdir()
    source.write_bytes(data.replace(b"cargo test", f"cargo test --token {KEY}".encode()))
    return source


def store(path: Path, config: str = "") -> Path:
    path.mkdir()
    if config:
        (path / "config.toml").write_text(config)
    return path


def log_and_index(root: Path, sid: str) -> tuple[str, str]:
    directory = memstore.session_directory(root, sid)
    conn = sqlite3.connect(directory / "index" / "session.db")
    try:
        chunks = "\n".join(r[0] for r in conn.execute("SELECT text FROM chunks"))
    finally:
        conn.close()
    return (directory / "events.jsonl").read_text(), chunks


def records(root: Path, sid: str) -> list:
    with memstore.read_session(root, sid) as reader:
        return [(r.seq, r.ts, r.event) for r in reader.iter_records()]


def test_a_staged_session_is_redacted_at_write_as_the_writer_redacts(tmp_path):
    source = rollout_with_a_secret(tmp_path)
    staged = store(tmp_path / "staged", AT_WRITE)
    report = memstore.import_logs(staged, source, jobs=1)
    assert report.sessions_created == 1 and not report.problems
    log, chunks = log_and_index(staged, CODEX_SID)
    assert KEY not in log and "[REDACTED:github-token]" in log
    assert KEY not in chunks and "[REDACTED:" in chunks

    # The one-by-one import through the writer: the same records.
    classic = store(tmp_path / "classic", AT_WRITE)
    tombstones = Tombstones(classic)
    for found in discover([source], classic, lambda *_: None):
        import_source(classic, found, "auto", 900.0, time.time(), lambda _n: None, tombstones, tombstones.all())
    assert records(staged, CODEX_SID) == records(classic, CODEX_SID)
    again = memstore.import_logs(staged, source, jobs=1)
    assert (again.sessions_unchanged, again.events_appended) == (1, 0)


def test_by_default_a_staged_log_keeps_the_text_and_its_index_no_secret(tmp_path):
    source = rollout_with_a_secret(tmp_path)
    root = store(tmp_path / "store")
    memstore.import_logs(root, source, jobs=1)
    log, chunks = log_and_index(root, CODEX_SID)
    assert KEY in log
    assert KEY not in chunks and "[REDACTED:github-token]" in chunks


def test_another_stores_session_merges_into_a_store_that_redacts_at_write(tmp_path):
    source = rollout_with_a_secret(tmp_path)
    teammate = store(tmp_path / "teammate")
    memstore.import_logs(teammate, source)  # the teammate's store keeps the secret in its log
    mine = store(tmp_path / "mine", AT_WRITE)
    first = memstore.import_logs(mine, teammate)
    assert first.sessions_created == 1
    log, chunks = log_and_index(mine, CODEX_SID)
    assert KEY not in log and KEY not in chunks
    again = memstore.import_logs(mine, teammate)
    assert (again.sessions_created, again.renamed, again.problems) == (0, [], [])
    # Changed copy (the stamp no longer matches): compared record by record, still the same.
    (teammate / "sessions" / CODEX_SID / "events.jsonl").touch()
    third = memstore.import_logs(mine, teammate)
    assert (third.sessions_created, third.sessions_unchanged, third.renamed) == (0, 1, [])
