"""The catalog copies sessions in bulk: a batch of sessions per transaction, their chunks in one
statement, whatever the batch boundaries the same rows; a session whose rows are refused is
left out alone; and a long copy says how far it is (sessions, bytes, rate, time left)."""

from __future__ import annotations

import random

import pytest
from catalog_support import content, from_scratch, turn
from click.testing import CliRunner

import memstore
from memstore.catalog import copy as catalog_copy
from memstore.catalog import refresh as catalog_refresh
from memstore.catalog import refresh_catalog
from memstore.cli import cli
from memstore.session.tuning import TUNING


def _store(root, sessions: int, seed: int = 3) -> None:
    rng = random.Random(seed)
    for i in range(sessions):
        with memstore.open_session(root, f"s{i:02d}") as log:
            for _ in range(rng.randint(1, 4)):
                turn(log, rng.randrange(100), fail=rng.random() < 0.2)


def _traced(monkeypatch) -> list[str]:
    """Every statement the catalog's connection runs (their first word, upper case)."""
    statements: list[str] = []
    real = catalog_refresh.open_catalog

    def open_traced(root):
        conn = real(root)
        conn.set_trace_callback(lambda sql: statements.append(sql.split(None, 1)[0].upper() if sql.strip() else ""))
        return conn

    monkeypatch.setattr(catalog_refresh, "open_catalog", open_traced)
    return statements


def test_a_build_from_scratch_is_one_transaction_per_batch(tmp_path, monkeypatch):
    """Twenty sessions nothing derived yet (their chunks are made from the log): one batch, so
    one transaction for their rows and one more for the refresh's bookkeeping, instead of one
    per session and a round trip per chunk."""
    monkeypatch.setattr(TUNING, "derive_idle_seconds", 3600)
    _store(tmp_path, 20)
    statements = _traced(monkeypatch)
    report = refresh_catalog(tmp_path)
    assert len(report.added) == 20
    assert statements.count("COMMIT") == 2, statements.count("COMMIT")


def test_batch_boundaries_change_nothing(tmp_path, monkeypatch):
    _store(tmp_path, 17)
    monkeypatch.setattr(catalog_refresh, "BATCH_SESSIONS", 3)
    monkeypatch.setattr(catalog_refresh, "BATCH_BYTES", 4096)
    statements = _traced(monkeypatch)
    refresh_catalog(tmp_path)
    assert statements.count("COMMIT") >= 7  # 17 sessions, 3 a batch: 6 batches, and the bookkeeping
    monkeypatch.undo()
    assert content(tmp_path) == from_scratch(tmp_path, tmp_path)


def test_a_session_whose_rows_are_refused_is_left_out_alone(tmp_path, monkeypatch):
    """One session's rows that SQLite refuses (here a chunk without text) fail the batch's one
    statement; the batch is written again a session at a time, and only that session is left
    out (reported, and searched for again at the next sweep)."""
    _store(tmp_path, 6)
    real = catalog_refresh.read_copy

    def one_bad(examined, previous, redactor):
        copy = real(examined, previous, redactor)
        if examined.name == "s03":
            copy.chunks.append(copy.chunks[0][:11] + (None,))
        return copy

    monkeypatch.setattr(catalog_refresh, "read_copy", one_bad)
    report = refresh_catalog(tmp_path)
    assert sorted(report.added) == ["s00", "s01", "s02", "s04", "s05"]
    assert [name for name, _why in report.errors] == ["s03"] and "refused" in report.errors[0][1]
    hits = memstore.search_memory(tmp_path, "widget", 50)
    assert "s03" not in {h.session_id for h in hits} and [m.directory for m in hits.missing] == ["s03"]
    monkeypatch.undo()
    assert memstore.Store(tmp_path).refresh(full=False).added == ["s03"]
    memstore.Store(tmp_path).close()
    assert content(tmp_path) == from_scratch(tmp_path, tmp_path)


def test_progress_says_sessions_bytes_rate_and_time_left(tmp_path):
    _store(tmp_path, 9)
    seen = []
    refresh_catalog(tmp_path, on_progress=seen.append)
    assert [p.sessions_done for p in seen] == list(range(1, 10))
    assert all(p.sessions_total == 9 for p in seen)
    assert [p.bytes_done for p in seen] == sorted(p.bytes_done for p in seen)
    last = seen[-1]
    assert last.bytes_done == last.bytes_total > 0
    assert last.rate is not None and last.eta == 0
    assert "9/9 sessions" in last.describe() and "MB/s" in last.describe()


def test_the_first_search_of_a_store_shows_progress_on_stderr(tmp_path, monkeypatch):
    """The CLI's first search of a store builds the catalog: after a second it says so, with
    its progress, instead of running in silence."""
    import memstore.cli as cli_module

    _store(tmp_path, 5)
    monkeypatch.setattr(cli_module, "PROGRESS_DELAY", 0.0)
    runner = CliRunner(mix_stderr=False) if "mix_stderr" in CliRunner.__init__.__code__.co_varnames else CliRunner()
    result = runner.invoke(cli, ["search", "widget", "--root", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "building the catalog" in result.stderr
    again = runner.invoke(cli, ["search", "widget", "--root", str(tmp_path), "--json"])
    assert "building the catalog" not in again.stderr
    memstore.Store(tmp_path).close()


@pytest.mark.parametrize("derived", [False, True])
def test_sessions_with_and_without_derived_chunks_copy_the_same_rows(tmp_path, monkeypatch, derived):
    """Chunks come from the session index as far as its deriver went, and are made from the log
    for the rest: either way, the same rows."""
    monkeypatch.setattr(TUNING, "derive_idle_seconds", 3600)
    _store(tmp_path, 4)
    if derived:
        for i in range(4):
            memstore.rebuild(tmp_path, f"s{i:02d}", refresh=False)  # a rebuild derives every record
        with memstore.read_session(tmp_path, "s00") as reader:
            assert reader.derived_seq == reader.indexed_seq > 0
    else:
        with memstore.read_session(tmp_path, "s00") as reader:
            assert reader.derived_seq == 0
    reads = []
    real = catalog_copy._log_copy
    monkeypatch.setattr(catalog_copy, "_log_copy", lambda *a: reads.append(a[2].derived_seq) or real(*a))
    refresh_catalog(tmp_path)
    assert all((seq > 0) == derived for seq in reads)
    monkeypatch.undo()
    assert content(tmp_path) == from_scratch(tmp_path, tmp_path)
