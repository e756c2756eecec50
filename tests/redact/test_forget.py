"""``memstore forget``: a session removed for good.

Invariants: a forgotten session is gone from the disk, the catalog and search, with a tombstone
(its id, and for an imported one its source's path and fingerprint) and a gc-log line; importing
its source again (Codex CLI and Claude Code, through the real importer and the CLI) does not bring
it back; after ``forget --undo`` the next import does; a damaged tombstone file makes the import
refuse with an error naming the file (and forget refuse before removing anything); a session open
for writing, or one that is not there, is refused with nothing changed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

import memstore
from memstore.cli import cli
from memstore.errors import SessionBusyError, SessionNotFound
from memstore.forget import NotForgotten, forget_session, unforget_session
from memstore.tombstones import TombstoneFileError, Tombstones

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "import"
CODEX = next((FIXTURES / "codex" / "0.148").glob("*.jsonl"))
CODEX_SID = "codex-019f2222-8888-7000-8000-00000000c148"
CLAUDE = FIXTURES / "claude" / "projects" / "-home-dev-web" / "2d984148-5555-4605-aac1-00000000e005.jsonl"
CLAUDE_SID = "claude-2d984148-5555-4605-aac1-00000000e005"


def run(root: Path, *args: str):
    return CliRunner().invoke(cli, [args[0], "--root", str(root), *args[1:]])


@pytest.mark.parametrize(("source", "sid", "word"), [(CODEX, CODEX_SID, "retry"), (CLAUDE, CLAUDE_SID, "NavUser")])
def test_a_forgotten_import_stays_forgotten_until_undone(tmp_path, source, sid, word):
    root = tmp_path / "store"
    first = memstore.import_logs(root, source, settle_seconds=0)
    assert first.sessions == [sid]
    memstore.refresh_catalog(root)
    assert any(r.session_id == sid for r in memstore.search_memory(root, word))

    result = run(root, "forget", sid, "--json")
    assert result.exit_code == 0, result.output
    forgotten = json.loads(result.output)
    assert forgotten["forgotten"] and forgotten["source_path"] == str(source)
    assert forgotten["source_fingerprint"]["size"] == source.stat().st_size
    assert not memstore.session_directory(root, sid).exists()
    assert not any(r.session_id == sid for r in memstore.search_memory(root, word))
    stone = Tombstones(root).lookup(sid)
    assert stone is not None and stone.reason.value == "forget" and stone.source_path == str(source)
    gc = [json.loads(line) for line in (root / "gc-log.jsonl").read_text().splitlines()]
    assert [(g["session_id"], g["reason"]) for g in gc] == [(sid, "forget")]

    again = run(root, "import", str(source), "--json")
    assert again.exit_code == 0, again.output
    report = json.loads(again.output)
    assert report["sessions_created"] == 0 and report["events_appended"] == 0
    assert [t["session_id"] for t in report["tombstoned"]] == [sid]
    assert not memstore.session_directory(root, sid).exists()

    undo = run(root, "forget", "--undo", sid)
    assert undo.exit_code == 0 and "no longer forgotten" in undo.output
    assert Tombstones(root).lookup(sid) is None
    assert memstore.import_logs(root, source, settle_seconds=0).sessions_created == 1


def test_a_damaged_tombstone_file_stops_imports_and_forgets(tmp_path):
    root = tmp_path / "store"
    memstore.import_logs(root, CODEX, settle_seconds=0)
    forget_session(root, CODEX_SID)
    with open(root / "tombstones.jsonl", "ab") as fh:
        fh.write(b'{"op": "add", "session_id": 7}\n')  # a complete line that is no tombstone
    result = run(root, "import", str(CODEX))
    assert result.exit_code != 0
    assert str(root / "tombstones.jsonl") in result.output and "damaged" in result.output
    with pytest.raises(TombstoneFileError):
        memstore.import_logs(root, CODEX, settle_seconds=0)
    assert not memstore.session_directory(root, CODEX_SID).exists()  # refused, not resurrected

    with memstore.open_session(root, "local"):
        pass
    with pytest.raises(TombstoneFileError):
        forget_session(root, "local")
    assert memstore.session_directory(root, "local").exists()


def test_refusals_change_nothing(tmp_path):
    root = tmp_path / "store"
    with memstore.open_session(root, "live") as log:
        log.append({"type": "turn.started"})
        with pytest.raises(SessionBusyError):
            forget_session(root, "live")
        assert memstore.session_directory(root, "live").exists()
    with pytest.raises(SessionNotFound):
        forget_session(root, "nope")
    with pytest.raises(NotForgotten):
        unforget_session(root, "live")
    assert not (root / "tombstones.jsonl").exists() and not (root / "gc-log.jsonl").exists()
    assert run(root, "forget", "nope").exit_code == 1
    # A session an agent wrote (no import source) is forgotten with a tombstone of its id.
    report = memstore.Store(root).forget("live")
    assert report.tombstone.source_path is None and "live" not in memstore.Store(root)
