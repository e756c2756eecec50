"""Retention says what it does: ``max_age_days=0`` is one thing (no age limit) in the library and
the command line, and a removal is always asked for (``apply=True`` / ``--apply``); without it
both are the same dry run."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

import memstore
from memstore.cli import cli
from memstore.retention import RetentionPolicy

OLD = "2020-01-01T00:00:00Z"


def old_session(root, sid, *, complete=True):
    """A session whose every event is from 2020; ``complete=False`` leaves it active (idle)."""
    with memstore.open_session(root, sid) as log:
        log.append({"type": "thread.started", "thread_id": sid}, ts=OLD)
        log.append({"type": "turn.started"}, ts=OLD)
        log.append({"type": "turn.completed", "usage": {"input_tokens": 3}}, ts=OLD)
        if complete:
            log.append(
                {
                    "type": "thread.completed",
                    "thread_id": sid,
                    "session_id": sid,
                    "subtype": "success",
                    "outcome_code": "completed",
                    "usage": {},
                    "num_turns": 1,
                },
                ts=OLD,
            )
    return root / "sessions" / sid


def status_of(directory) -> str:
    return json.loads((directory / "manifest.json").read_text())["status"]


def test_max_age_days_zero_is_no_age_limit(tmp_path):
    """With 0, no session is aged out and no idle active one is marked abandoned, however old;
    the count cap still applies."""
    done = [old_session(tmp_path, f"done-{i}") for i in range(3)]
    idle = old_session(tmp_path, "idle", complete=False)
    report = memstore.apply_retention(tmp_path, RetentionPolicy(50, 0), apply=True)
    assert report.count == 0 and report.marked_abandoned == []
    assert all(d.is_dir() for d in done) and status_of(idle) == "active"
    capped = memstore.apply_retention(tmp_path, RetentionPolicy(1, 0), apply=True)
    assert sorted(r.reason for r in capped.removed) == ["count_cap", "count_cap"]
    assert sum(d.is_dir() for d in done) == 1 and status_of(idle) == "active"
    # Any other age limit ages them out, marking the idle one first.
    aged = memstore.apply_retention(tmp_path, RetentionPolicy(50, 30), apply=True)
    assert aged.marked_abandoned == ["idle"] and {r.reason for r in aged.removed} == {"age_cap"}
    assert not idle.exists()


def test_the_library_removes_nothing_unless_asked(tmp_path):
    """apply_retention(root, policy) is a dry run: it reports, and changes nothing."""
    victim = old_session(tmp_path, "old")
    before = (victim / "events.jsonl").read_bytes()
    for call in (
        lambda: memstore.apply_retention(tmp_path, RetentionPolicy(50, 30)),
        lambda: memstore.apply_retention_preserving(tmp_path, RetentionPolicy(50, 30), None),
        lambda: memstore.apply_retention(tmp_path, RetentionPolicy(50, 30), dry_run=True),
        lambda: memstore.apply_retention(tmp_path, RetentionPolicy(50, 30), apply=False),
        lambda: memstore.Store(tmp_path).retention(RetentionPolicy(50, 30)),
    ):
        report = call()
        assert report.dry_run and [r.session_id for r in report.removed] == ["old"]
        assert (victim / "events.jsonl").read_bytes() == before and not (tmp_path / "gc-log.jsonl").exists()
    assert memstore.apply_retention(tmp_path, RetentionPolicy(50, 30), dry_run=False).count == 1  # the old spelling
    assert not victim.exists()


def test_apply_and_dry_run_must_agree(tmp_path):
    old_session(tmp_path, "old")
    with pytest.raises(ValueError, match="contradict"):
        memstore.apply_retention(tmp_path, RetentionPolicy(), apply=True, dry_run=True)
    with pytest.raises(TypeError):
        memstore.apply_retention(tmp_path, RetentionPolicy(), apply=1)
    assert memstore.apply_retention(tmp_path, RetentionPolicy(), apply=True, dry_run=False).count == 1


def test_the_command_line_and_the_library_agree(tmp_path):
    """`memstore retention` without --apply is the library's dry run (same sessions listed);
    --max-age-days 0 removes nothing by age there either, and the help says what 0 means."""
    for i in range(2):
        old_session(tmp_path, f"old-{i}")
    runner = CliRunner()
    shown = json.loads(runner.invoke(cli, ["retention", "--root", str(tmp_path), "--json"]).stdout)
    library = memstore.apply_retention(tmp_path, RetentionPolicy()).to_dict()
    assert shown == library and shown["dry_run"] and len(shown["removed"]) == 2
    zero = runner.invoke(cli, ["retention", "--max-age-days", "0", "--apply", "--root", str(tmp_path), "--json"])
    assert zero.exit_code == 0 and json.loads(zero.stdout)["removed"] == []
    assert sorted(p.name for p in (tmp_path / "sessions").iterdir()) == ["old-0", "old-1"]
    help_text = " ".join(runner.invoke(cli, ["retention", "-h"]).stdout.split())
    assert "0: no age limit" in help_text and "default: a dry run" in help_text


def test_the_docs_say_what_the_code_does():
    """docs/retention.md and docs/python-api.md give 0 and the dry-run default the meaning the
    code has (they once said 0 ages out everything and the free function removes by default)."""
    from pathlib import Path

    docs = Path(__file__).resolve().parents[2] / "docs"
    retention = " ".join((docs / "retention.md").read_text().split())
    api = " ".join((docs / "python-api.md").read_text().split())
    assert "means **no age limit**, in the command and in the library alike" in retention
    assert "only `--apply` removes" in retention and "are dry runs unless given `apply=True`" in retention
    assert "ages out everything" not in retention and "removes unless `dry_run=True`" not in api
    assert "`max_age_days=0` is no age limit" in api
