"""The Parquet export, queried with DuckDB: it reproduces the catalog's figures exactly, it is
incremental (a changed session's files only), a reader never sees a half-written file, and it
refuses destinations that hold something else."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from decimal import Decimal
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from export_support import manifest_of, parquet, query, secret_of

import memstore
from memstore.exporters import ExportError
from memstore.exporters.parquet import MANIFEST_NAME, TABLES, export_parquet
from memstore.identity import machine_id, store_identity

PICO = Decimal(10) ** 12

# The catalog's cost per day and model, in SQL: each turn priced by memstore_cost_usd (its
# model, its session's agent, its tokens, its end time), in pico-dollars. SQL sums floats,
# whose order of addition changes the last bits; each turn's figure is exact in pico-dollars,
# so both sides are summed as integers.
CATALOG_DAILY = """
    SELECT substr(coalesce(t.started_at, t.ended_at), 1, 10) AS day, coalesce(t.model, '') AS model,
           count(*) AS turns, sum(t.input_tokens), sum(t.cached_input_tokens), sum(t.cache_creation_tokens),
           sum(t.output_tokens),
           sum(CAST(round(memstore_cost_usd(t.model, s.agent, t.input_tokens, t.cached_input_tokens,
                                            t.cache_creation_tokens, t.output_tokens,
                                            coalesce(t.ended_at, t.started_at)) * 1e12) AS INTEGER)) AS cost,
           count(memstore_cost_usd(t.model, s.agent, t.input_tokens, t.cached_input_tokens,
                                   t.cache_creation_tokens, t.output_tokens, coalesce(t.ended_at, t.started_at)))
    FROM turns t JOIN sessions s USING (session_id)
    GROUP BY 1, 2 ORDER BY 1, 2
"""


def export_daily(dest: Path) -> list[tuple]:
    rows = query(f"""
        SELECT CAST(day AS VARCHAR), coalesce(model, ''), count(*), sum(input_tokens), sum(cached_input_tokens),
               sum(cache_creation_tokens), sum(output_tokens), sum(cost_usd), count(cost_usd)
        FROM {parquet(dest, "turns")} GROUP BY ALL ORDER BY 1, 2""")
    return [(*row[:7], None if row[7] is None else int(row[7] * PICO), row[8]) for row in rows]


def test_cost_per_day_and_model_matches_the_catalog(demo_export: Path, catalog):
    """DuckDB over the export gives, for every day and model, the catalog's turn count, token
    sums and cost exactly (the catalog's cost is memstore_cost_usd in SQL)."""
    expected = catalog.execute(CATALOG_DAILY).fetchall()
    assert len(expected) > 20 and sum(row[7] or 0 for row in expected) > 0
    assert export_daily(demo_export) == expected
    # The catalog's own token_usage_daily view, too.
    view = catalog.execute(
        "SELECT day, model, turns, input_tokens, cached_input_tokens, cache_creation_tokens, output_tokens "
        "FROM token_usage_daily ORDER BY day, model"
    ).fetchall()
    assert [row[:7] for row in export_daily(demo_export)] == view


def test_failures_per_tool_match_the_catalog(demo_export: Path, catalog):
    """Calls and failures per tool (the tool_calls view) and per command (the commands view)
    are the catalog's."""
    tools = catalog.execute("SELECT tool, count(*), sum(failed) FROM tool_calls GROUP BY tool ORDER BY tool").fetchall()
    assert any(row[2] for row in tools), "the demo has failed tool calls"
    assert (
        query(
            f"SELECT tool, count(*), sum(failed::INT) FROM {parquet(demo_export, 'tool_calls')} GROUP BY 1 ORDER BY 1"
        )
        == tools
    )
    commands = catalog.execute(
        "SELECT command, count(*), sum(failed), sum(exit_code) FROM commands GROUP BY command ORDER BY command"
    ).fetchall()
    assert any(row[2] for row in commands)
    assert (
        query(
            f"SELECT command, count(*), sum(failed::INT), sum(exit_code) FROM {parquet(demo_export, 'commands')} "
            "GROUP BY 1 ORDER BY 1"
        )
        == commands
    )


def test_every_table_holds_the_catalogs_rows_with_the_store_id(demo_store: Path, demo_export: Path, catalog):
    """Each table has as many rows as the catalog's (per session), every row names the store
    and its label, the partitions are the session's agent and the row's day, and the manifest
    counts the same rows."""
    identity = store_identity(demo_store)
    counts = {
        "sessions": "SELECT session_id, 1 FROM sessions",
        "turns": "SELECT session_id, count(*) FROM turns GROUP BY 1",
        "events": "SELECT session_id, count(*) FROM events GROUP BY 1",
        "tool_calls": "SELECT session_id, count(*) FROM tool_calls GROUP BY 1",
        "commands": "SELECT session_id, count(*) FROM commands GROUP BY 1",
        "file_changes": "SELECT session_id, count(*) FROM file_changes GROUP BY 1",
    }
    manifest = manifest_of(demo_export)
    agents = dict(catalog.execute("SELECT session_id, agent FROM sessions"))
    for table, sql in counts.items():
        expected = sorted(catalog.execute(sql).fetchall())
        source = parquet(demo_export, table)
        assert query(f"SELECT session_id, count(*) FROM {source} GROUP BY 1 ORDER BY 1") == expected, table
        assert query(f"SELECT DISTINCT store_id, store_label, machine_id FROM {source}") == [
            (identity.store_id, identity.label, machine_id())
        ]
        pairs = query(f"SELECT DISTINCT session_id, agent FROM {source}")
        assert pairs and all(agents[sid] == agent for sid, agent in pairs), table
        assert manifest["tables"][table] == sum(n for _sid, n in expected)
    # The day partition is the row's own day (events: their time's date).
    mismatched = query(
        f"SELECT count(*) FROM {parquet(demo_export, 'events')} WHERE day IS DISTINCT FROM CAST(ts AS DATE)"
    )
    assert mismatched == [(0,)]
    assert {agent for (agent,) in query(f"SELECT DISTINCT agent FROM {parquet(demo_export, 'sessions')}")} == set(
        agents.values()
    )


def test_each_file_has_its_documented_schema(demo_export: Path):
    """Every file's columns and types are those of its table's schema (the partition keys are
    in the path, not in the file, as engines expect)."""
    from memstore.exporters.parquet import arrow_schema

    manifest = manifest_of(demo_export)
    seen = set()
    for entry in manifest["sessions"].values():
        for f in entry["files"]:
            schema = pq.read_schema(demo_export / f["path"])
            assert schema.remove_metadata() == arrow_schema(f["table"]).remove_metadata(), f["path"]
            assert pq.read_metadata(demo_export / f["path"]).num_rows == f["rows"]
            seen.add(f["table"])
    assert seen == set(TABLES)


def test_an_unchanged_store_exports_nothing_again(store_copy: Path, tmp_path: Path):
    """A second export of an unchanged store writes no file and keeps every file as it was."""
    dest = tmp_path / "lake"
    first = export_parquet(store_copy, dest)
    stamps = _stamps(dest)
    again = export_parquet(store_copy, dest)
    assert (again.written, again.files_written, again.files_removed) == ([], 0, 0)
    assert again.unchanged == len(first.written)
    assert _stamps(dest) == stamps


def test_appending_to_one_session_rewrites_only_its_files(store_copy: Path, tmp_path: Path, capsys):
    """After an append to one session, the next export writes that session's files only (new
    names, a new day partition for the new turn), leaves every other file untouched (same
    inode, same mtime), removes the session's old files, and the totals still match."""
    dest = tmp_path / "lake"
    export_parquet(store_copy, dest)
    before = _stamps(dest)
    old_files = {f["path"] for f in manifest_of(dest)["sessions"]["demo"]["files"]}
    with memstore.Store(store_copy).open("demo") as log:
        log.append({"type": "turn.started"}, ts="2026-11-30T09:00:00.000Z")
        log.append(
            {
                "type": "item.completed",
                "item": {"id": "c9", "type": "command_execution", "command": "cargo clippy", "exit_code": 1,
                         "aggregated_output": "warning: unused variable `count`\n", "status": "failed"},
            },
            ts="2026-11-30T09:00:05.000Z",
        )  # fmt: skip
        log.append(
            {"type": "turn.completed", "model": "gpt-5-codex",
             "usage": {"input_tokens": 9100, "cached_input_tokens": 7000, "output_tokens": 640}},
            ts="2026-11-30T09:00:09.000Z",
        )  # fmt: skip
    report = export_parquet(store_copy, dest)
    assert report.written == ["demo"]
    after = _stamps(dest)
    new_files = {f["path"] for f in manifest_of(dest)["sessions"]["demo"]["files"]}
    assert not (new_files & old_files)
    assert set(after) - set(before) == new_files
    assert set(before) - set(after) == old_files  # the old files are gone, nothing else is
    assert {p: s for p, s in before.items() if p not in old_files} == {
        p: s for p, s in after.items() if p not in new_files
    }
    assert any("/day=2026-11-30/" in p for p in new_files)
    catalog = _catalog(store_copy)
    assert export_daily(dest) == catalog.execute(CATALOG_DAILY).fetchall()
    assert query(f"SELECT count(*) FROM {parquet(dest, 'commands')} WHERE command = 'cargo clippy' AND failed") == [
        (1,)
    ]


def test_a_removed_session_leaves_the_export(store_copy: Path, tmp_path: Path):
    """A session gone from the store is gone from the next export, files and manifest entry."""
    import shutil

    dest = tmp_path / "lake"
    export_parquet(store_copy, dest)
    gone = manifest_of(dest)["sessions"]["demo"]["files"]
    shutil.rmtree(store_copy / "sessions" / "demo")
    report = export_parquet(store_copy, dest)
    assert report.removed == ["demo"] and report.files_removed == len(gone)
    assert "demo" not in manifest_of(dest)["sessions"]
    assert not any((dest / f["path"]).exists() for f in gone)
    assert query(f"SELECT count(*) FROM {parquet(dest, 'events')} WHERE session_id = 'demo'") == [(0,)]


def test_other_settings_rewrite_everything(store_copy: Path, tmp_path: Path):
    """An export with other settings (here: with text) writes every session again, and the
    previous files are removed; --full rewrites every session too."""
    dest = tmp_path / "lake"
    first = export_parquet(store_copy, dest)
    with_text = export_parquet(store_copy, dest, include_text=True)
    assert sorted(with_text.written) == sorted(first.written)
    assert with_text.files_removed == first.files_written
    full = export_parquet(store_copy, dest, include_text=True, full=True)
    assert sorted(full.written) == sorted(first.written)
    listed = {f["path"] for e in manifest_of(dest)["sessions"].values() for f in e["files"]}
    on_disk = {p.relative_to(dest).as_posix() for p in dest.rglob("*.parquet")}
    assert listed == on_disk


def test_text_is_only_exported_on_request_and_always_redacted(store_copy: Path, tmp_path: Path):
    """Without --include-text the events carry no text; with it they carry the catalog's text.
    Secrets in prompts, commands and tool output are redacted either way."""
    token = secret_of("github-token")
    with memstore.Store(store_copy).open("leaky") as log:
        log.append({"type": "thread.started", "thread_id": "leaky"}, ts="2026-11-29T10:00:00.000Z")
        log.append({"type": "turn.started"}, ts="2026-11-29T10:00:01.000Z")
        log.append(
            {
                "type": "item.completed",
                "item": {"id": "u1", "type": "user_message", "text": f"push with {token} please"},
            },
            ts="2026-11-29T10:00:02.000Z",
        )
        log.append(
            {
                "type": "item.completed",
                "item": {"id": "c1", "type": "command_execution", "command": f"GITHUB_TOKEN={token} git push",
                         "aggregated_output": "done\n", "exit_code": 0, "status": "completed"},
            },
            ts="2026-11-29T10:00:03.000Z",
        )  # fmt: skip
        log.append({"type": "turn.completed", "usage": {"input_tokens": 10, "output_tokens": 5}},
                   ts="2026-11-29T10:00:04.000Z")  # fmt: skip
    plain, texts = tmp_path / "plain", tmp_path / "texts"
    export_parquet(store_copy, plain)
    export_parquet(store_copy, texts, include_text=True)
    assert query(f"SELECT count(text) FROM {parquet(plain, 'events')}") == [(0,)]
    rows = query(f"SELECT text FROM {parquet(texts, 'events')} WHERE session_id = 'leaky' AND text IS NOT NULL")
    assert len(rows) == 2 and all("[REDACTED:" in text for (text,) in rows)
    for dest in (plain, texts):
        for path in dest.rglob("*.parquet"):
            assert token.encode() not in path.read_bytes(), path
        (command,) = query(f"SELECT command FROM {parquet(dest, 'commands')} WHERE session_id = 'leaky'")[0]
        assert command.endswith(" git push") and "[REDACTED:" in command
        (title,) = query(f"SELECT title FROM {parquet(dest, 'sessions')} WHERE session_id = 'leaky'")[0]
        assert token not in title and "[REDACTED:" in title
    # The text of an event is the catalog's search text of it.
    catalog = _catalog(store_copy)
    demo_text = dict(catalog.execute("SELECT seq, text FROM chunks WHERE session_id = 'demo' AND part = 0"))
    exported = dict(query(f"SELECT seq, text FROM {parquet(texts, 'events')} WHERE session_id = 'demo'"))
    assert {seq: exported[seq] for seq in demo_text} == demo_text


def test_destinations_holding_something_else_are_refused(store_copy: Path, tmp_path: Path):
    """A non-empty directory that holds no export, and the export of another store, are not
    written to (nothing in them changes)."""
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    with pytest.raises(ExportError, match="not empty"):
        export_parquet(store_copy, foreign)
    assert sorted(p.name for p in foreign.iterdir()) == ["notes.txt"]
    other = tmp_path / "other-store"
    memstore.write_demo_store(other, sessions=3)
    dest = tmp_path / "lake"
    export_parquet(other, dest)
    stamps = _stamps(dest)
    with pytest.raises(ExportError, match="another store"):
        export_parquet(store_copy, dest)
    assert _stamps(dest) == stamps
    with pytest.raises(ExportError, match="store itself"):
        export_parquet(store_copy, store_copy)


def test_an_fsspec_destination(store_copy: Path):
    """An fsspec URL (the in-memory filesystem) receives the same export, incrementally."""
    fsspec = pytest.importorskip("fsspec", reason="fsspec is not installed: URL destinations cannot be tested")
    url = "memory://exports/lake"
    first = export_parquet(store_copy, url)
    fs = fsspec.filesystem("memory")
    manifest = __import__("json").loads(fs.cat_file("/exports/lake/" + MANIFEST_NAME))
    for entry in manifest["sessions"].values():
        for f in entry["files"]:
            with fs.open("/exports/lake/" + f["path"], "rb") as fh:
                assert pq.read_table(fh).num_rows == f["rows"]
    assert manifest["tables"] == first.rows
    again = export_parquet(store_copy, url)
    assert (again.written, again.files_written) == ([], 0)
    fs.rm("/exports", recursive=True)


def test_without_pyarrow_the_command_says_which_extra_to_install(store_copy: Path, tmp_path: Path):
    """`memstore export parquet` without pyarrow exits 2 naming memstore[export], writing nothing."""
    code = "import sys; sys.modules['pyarrow'] = None; from memstore.cli import cli; cli()"
    dest = tmp_path / "lake"
    result = subprocess.run(
        [sys.executable, "-c", code, "export", "parquet", str(dest), "--root", str(store_copy)],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert result.returncode == 2
    assert "install memstore[export]" in result.stderr
    assert not dest.exists()


@pytest.mark.slow
def test_a_killed_export_leaves_the_previous_one_whole(tmp_path: Path):
    """kill -9 in the middle of an export that rewrites every session (new settings: with
    text): the previous manifest and every file it names are intact and readable, no visible
    file is half-written, and the next export completes and removes what the killed one left."""
    root = tmp_path / "store"
    memstore.write_demo_store(root, sessions=80)
    dest = tmp_path / "lake"
    export_parquet(root, dest)
    old_manifest = (dest / MANIFEST_NAME).read_bytes()
    old_files = {f["path"]: f["rows"] for e in manifest_of(dest)["sessions"].values() for f in e["files"]}
    proc = subprocess.Popen(
        [sys.executable, "-m", "memstore", "export", "parquet", str(dest), "--include-text", "--root", str(root)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            written = [p for p in dest.rglob("*.parquet") if p.relative_to(dest).as_posix() not in old_files]
            if len(written) >= 20:
                break
            time.sleep(0.002)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL, "the export finished before it could be killed"
    assert (dest / MANIFEST_NAME).read_bytes() == old_manifest
    for rel, rows in old_files.items():
        assert pq.read_metadata(dest / rel).num_rows == rows, rel
    visible = [p for p in dest.rglob("*.parquet") if not p.name.startswith(".")]
    assert len(visible) >= len(old_files) + 20  # the killed export's own files are there, whole
    for path in visible:
        pq.read_table(path)
    report = export_parquet(root, dest, include_text=True)
    assert len(report.written) == len(memstore.Store(root).session_ids())
    listed = {f["path"] for e in manifest_of(dest)["sessions"].values() for f in e["files"]}
    assert {p.relative_to(dest).as_posix() for p in dest.rglob("*.parquet")} == listed
    assert not list(dest.rglob(".*.tmp-*"))


def test_schema_is_documented():
    """docs/export.md has a row for every column of every table, with its type."""
    page = (Path(__file__).resolve().parents[2] / "docs" / "export.md").read_text(encoding="utf-8")
    for table, columns in TABLES.items():
        section = page.split(f"### `{table}`", 1)
        assert len(section) == 2, f"no section for {table}"
        body = section[1].split("\n### ", 1)[0]
        for column in columns:
            assert re.search(rf"^\| `{column.name}` \| {re.escape(_doc_type(column.type))} \|", body, re.M), (
                table,
                column.name,
            )


def _doc_type(kind: str) -> str:
    return {"usd": "decimal(38,12)", "timestamp": "timestamp (µs, UTC)"}.get(kind, kind)


def _stamps(dest: Path) -> dict[str, tuple[int, int]]:
    return {p.relative_to(dest).as_posix(): (p.stat().st_ino, p.stat().st_mtime_ns) for p in dest.rglob("*.parquet")}


def _catalog(root: Path):
    import sqlite3

    from memstore.pricing import register_sql_functions

    conn = sqlite3.connect(f"file:{root / 'catalog.db'}?mode=ro", uri=True)
    register_sql_functions(conn)
    return conn


def test_the_command_takes_root_and_json_before_or_after_the_export(store_copy: Path, tmp_path: Path):
    """`memstore export [--root R] [--json] parquet DEST [--root R] [--json]`: the export's own
    options win, the group's apply otherwise; --json prints the report."""
    import json

    from click.testing import CliRunner

    from memstore.cli import cli

    runner = CliRunner()
    before = runner.invoke(cli, ["export", "--root", str(store_copy), "--json", "parquet", str(tmp_path / "a")])
    assert before.exit_code == 0, before.output
    assert json.loads(before.stdout)["rows"]["sessions"] == 30
    after = runner.invoke(
        cli, ["export", "--root", str(tmp_path / "absent"), "parquet", str(tmp_path / "b"), "--root", str(store_copy)]
    )
    assert after.exit_code == 0, after.output
    assert "30 sessions written" in after.stdout
    missing = runner.invoke(cli, ["export", "--json", "parquet", str(tmp_path / "c"), "--root", str(tmp_path / "no")])
    assert missing.exit_code == 2 and json.loads(missing.stderr)["error"].startswith("no store at")
