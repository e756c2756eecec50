"""An imported session outlives its source.

Agents delete their own logs (Claude Code removes transcripts after 30 days by default); the
imported session is then the only copy. Invariant: once its source is gone, nothing drops the
session or flags it as broken: not a re-import (of the directory, or naming the missing file),
not a rebuild, not retention (default policy, however old; with ``include_imported``, only by
age, like any session, never for the missing source), not ``memstore doctor``; and a new file
naming the same session (``codex exec resume`` writes a new stream for the same thread) does
not replace it.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from click.testing import CliRunner

import memstore
from memstore.cli import cli
from memstore.retention import RetentionPolicy

FIXTURES = Path(__file__).parent.parent / "fixtures" / "import"
CLAUDE_21 = next((FIXTURES / "claude" / "projects" / "-home-dev-app").glob("*.jsonl"))
CODEX_EXEC = FIXTURES / "codex" / "exec" / "run-42.jsonl"
OLD = 1_700_000_000.0


def records(root, sid):
    with memstore.read_session(root, sid) as reader:
        return [(r.seq, r.ts, r.event) for r in reader.iter_records()]


def imported_then_deleted(tmp_path: Path) -> tuple[Path, Path, dict]:
    projects = tmp_path / "claude" / "projects"
    shutil.copytree(CLAUDE_21.parent, projects / CLAUDE_21.parent.name)
    for path in projects.rglob("*.jsonl"):
        os.utime(path, (OLD, OLD))
    root = tmp_path / "store"
    report = memstore.import_logs(root, projects)
    assert report.sessions_created == 2  # the transcript and its sub-agent
    before = {s.session_id: records(root, s.session_id) for s in memstore.list_sessions(root)}
    shutil.rmtree(projects / CLAUDE_21.parent.name)  # the agent cleaned up
    return root, projects, before


def test_reimporting_without_the_source_changes_nothing(tmp_path):
    root, projects, before = imported_then_deleted(tmp_path)
    report = memstore.import_logs(root, projects)
    assert (report.sources, report.events_appended, report.set_aside) == (0, 0, [])
    missing = projects / CLAUDE_21.parent.name / CLAUDE_21.name
    named = memstore.import_logs(root, missing)  # naming the gone file: reported, nothing touched
    assert [p.reason for p in named.problems] == ["cannot read: No such file or directory"]
    assert {sid: records(root, sid) for sid in before} == before


def test_rebuild_and_doctor_keep_and_pass_a_session_whose_source_is_gone(tmp_path):
    root, _, before = imported_then_deleted(tmp_path)
    memstore.rebuild(root)
    assert {sid: records(root, sid) for sid in before} == before
    report = memstore.check_store(root)
    assert report.ok and report.problems == [] and report.sessions == 2
    result = CliRunner().invoke(cli, ["doctor", "--root", str(root)])
    assert result.exit_code == 0, result.output


def test_retention_never_drops_a_session_because_its_source_is_gone(tmp_path):
    root, _, before = imported_then_deleted(tmp_path)
    report = memstore.apply_retention(root, RetentionPolicy(), apply=True)  # the sessions date from 2026-01: old
    assert report.removed == [] and report.imported_kept == 2
    # Included, they are judged by age like any session: a year's window keeps them.
    report = memstore.apply_retention(root, RetentionPolicy(max_age_days=3650, include_imported=True), apply=True)
    assert report.removed == []
    assert {sid: records(root, sid) for sid in before} == before


def test_a_new_stream_for_the_same_thread_does_not_replace_the_session_of_a_deleted_one(tmp_path):
    first = tmp_path / "src" / "first.jsonl"
    first.parent.mkdir()
    shutil.copyfile(CODEX_EXEC, first)
    root = tmp_path / "store"
    memstore.import_logs(root, first)
    sid = "codex-019a2d7a-4444-78b1-b7cc-00000000d004"
    before = records(root, sid)
    first.unlink()
    resumed = tmp_path / "src" / "resumed.jsonl"  # `codex exec resume`: a new stream, the same thread
    resumed.write_bytes(
        b'{"type":"thread.started","thread_id":"019a2d7a-4444-78b1-b7cc-00000000d004"}\n'
        b'{"type":"turn.started"}\n'
        b'{"type":"item.completed","item":{"id":"item_0","type":"agent_message","text":"resumed"}}\n'
        b'{"type":"turn.completed","usage":{"input_tokens":9000,"cached_input_tokens":0,'
        b'"output_tokens":80}}\n'
    )
    report = memstore.import_logs(root, resumed)
    holders = [
        s.session_id for s in memstore.list_sessions(root) if records(root, s.session_id)[: len(before)] == before
    ]
    assert holders, "the session of the deleted stream is gone"
    assert [(e.session_id, e.set_aside_as) for e in report.set_aside] == [(sid, holders[0])]
