"""Retention and imported sessions.

Invariants: by default retention never removes an imported session (nor counts it against the
caps), however old: it is a user's history and its source may be gone. With
``include_imported`` an old imported session is removed and tombstoned before its removal is
final, and no later import of the same source recreates it (the two no longer fight, cycle after
cycle); undoing the tombstone lets the import bring it back. A damaged tombstone file makes
retention keep every imported session (fail closed).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from click.testing import CliRunner

import memstore
from memstore.cli import cli
from memstore.retention import RetentionPolicy
from memstore.tombstones import Tombstones

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "import"
CODEX_040 = next((FIXTURES / "codex" / "0.40").glob("*.jsonl"))  # dated September 2025: older than any cap
CLAUDE_20 = next((FIXTURES / "claude" / "projects" / "-home-dev-web").glob("*.jsonl"))
SID_040 = "codex-019982b8-2222-79e0-8b3b-00000000b002"
OLD = 1_700_000_000.0


def imported_store(tmp_path: Path) -> tuple[Path, Path]:
    source = tmp_path / "src" / CODEX_040.name
    source.parent.mkdir()
    shutil.copyfile(CODEX_040, source)
    os.utime(source, (OLD, OLD))
    root = tmp_path / "store"
    memstore.import_logs(root, source)
    with memstore.open_session(root, "native-old") as log:  # an agent's own old session, for contrast
        log.append({"type": "thread.started", "thread_id": "native-old"}, ts="2025-01-01T00:00:00.000Z")
        log.append({"type": "turn.started"}, ts="2025-01-01T00:00:00.000Z")
        log.append(
            {
                "type": "turn.completed",
                "usage": {"input_tokens": 1, "cached_input_tokens": 0, "cache_creation_tokens": 0, "output_tokens": 1},
            },
            ts="2025-01-01T00:00:01.000Z",
        )
        log.append(
            {
                "type": "thread.completed",
                "thread_id": "native-old",
                "session_id": "native-old",
                "subtype": "success",
                "outcome_code": "exited",
                "num_turns": 1,
                "usage": {"input_tokens": 1, "cached_input_tokens": 0, "cache_creation_tokens": 0, "output_tokens": 1},
            },
            ts="2025-01-01T00:00:02.000Z",
        )
    return root, source


def ids(root: Path) -> set[str]:
    return {s.session_id for s in memstore.list_sessions(root)}


def test_the_default_policy_keeps_old_imported_sessions(tmp_path):
    root, _ = imported_store(tmp_path)
    report = memstore.apply_retention(root, RetentionPolicy(), apply=True)
    assert [r.session_id for r in report.removed] == ["native-old"]
    assert report.imported_kept == 1
    assert ids(root) == {SID_040}
    # Not counted against the count cap either.
    report = memstore.apply_retention(root, RetentionPolicy(max_sessions=0, max_age_days=0), apply=True)
    assert report.removed == [] and ids(root) == {SID_040}


def test_retention_and_import_no_longer_fight(tmp_path):
    root, source = imported_store(tmp_path)
    policy = RetentionPolicy(include_imported=True)
    for cycle in range(3):
        memstore.apply_retention(root, policy, apply=True)
        assert SID_040 not in ids(root), f"cycle {cycle}: still there"
        imported = memstore.import_logs(root, source)
        assert (imported.sessions_created, imported.events_appended) == (0, 0), f"cycle {cycle}: resurrected"
        assert [t.session_id for t in imported.tombstoned] == [SID_040]
    stone = Tombstones(root).lookup(SID_040)
    assert (stone.reason.value, stone.source_path) == ("retention", str(source))
    assert stone.source_fingerprint["size"] == source.stat().st_size
    # The removal is recorded in gc-log.jsonl too, once.
    assert (root / "gc-log.jsonl").read_text().count(f'"session_id":"{SID_040}"') == 1
    # Undone (what `memstore forget --undo` will do), the import brings the session back.
    Tombstones(root).remove(SID_040)
    assert memstore.import_logs(root, source).sessions_created == 1


def test_a_dry_run_tombstones_nothing(tmp_path):
    root, _ = imported_store(tmp_path)
    report = memstore.apply_retention(root, RetentionPolicy(include_imported=True), dry_run=True)
    assert {r.session_id for r in report.removed} == {SID_040, "native-old"}
    assert not (root / "tombstones.jsonl").exists() and ids(root) == {SID_040, "native-old"}


def test_a_damaged_tombstone_file_keeps_every_imported_session(tmp_path):
    root, _ = imported_store(tmp_path)
    (root / "tombstones.jsonl").write_bytes(b"{not json\n")
    report = memstore.apply_retention(root, RetentionPolicy(include_imported=True), apply=True)
    assert [r.session_id for r in report.removed] == ["native-old"]
    assert SID_040 in ids(root)
    assert any(s.directory == "tombstones.jsonl" for s in report.skipped)


def test_the_close_path_eviction_never_removes_an_imported_session(tmp_path):
    root = tmp_path / "store"
    titles_only = tmp_path / "src" / "5f0c4a1e-7777-4b1e-8d2a-0000000000b9.jsonl"
    titles_only.parent.mkdir()
    # A transcript whose one prompt was a slash command: an imported empty shell once settled.
    titles_only.write_text(
        '{"type":"user","sessionId":"5f0c4a1e-7777-4b1e-8d2a-0000000000b9","uuid":"u1","timestamp":'
        '"2025-03-01T10:00:00.000Z","message":{"role":"user","content":"<command-name>/clear</command-name>"}}\n'
    )
    os.utime(titles_only, (OLD, OLD))
    memstore.import_logs(root, titles_only)
    sid = "claude-5f0c4a1e-7777-4b1e-8d2a-0000000000b9"
    assert sid in ids(root)
    assert memstore.evict_zero_turn_completed_store(root, sid) is False
    assert memstore.apply_retention(root, RetentionPolicy(), apply=True).removed == []
    assert sid in ids(root)


def test_cli_retention_says_it_kept_imported_sessions_and_can_include_them(tmp_path):
    root, _ = imported_store(tmp_path)
    result = CliRunner().invoke(cli, ["retention", "--root", str(root)])
    assert result.exit_code == 0, result.output
    assert "kept 1 imported session (pass --include-imported to age them out)" in result.output
    result = CliRunner().invoke(cli, ["retention", "--root", str(root), "--include-imported", "--apply"])
    assert result.exit_code == 0, result.output
    assert SID_040 not in ids(root) and Tombstones(root).lookup(SID_040) is not None
