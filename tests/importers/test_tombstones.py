"""tombstones.jsonl: sessions removed on purpose stay removed.

Invariants: a tombstone recorded is found by every later reader (another process included); an
undo makes the session importable again; a torn last line (an append a crash cut) is ignored and
cut off by the next append; any other damage fails closed: every reader raises an error that
names the file, and an import refuses to run at all rather than recreate a removed session.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner

import memstore
from memstore.cli import cli
from memstore.tombstones import TombstoneFileError, TombstoneReason, Tombstones

FIXTURES = Path(__file__).parent.parent / "fixtures" / "import"
CODEX_040 = next((FIXTURES / "codex" / "0.40").glob("*.jsonl"))
SID_040 = "codex-019982b8-2222-79e0-8b3b-00000000b002"
REPO = Path(__file__).parent.parent.parent


def test_record_lookup_and_undo(tmp_path):
    stones = Tombstones(tmp_path)
    assert stones.all() == {} and stones.lookup("a") is None
    first = stones.record("a", TombstoneReason.RETENTION, source_path="/src/a.jsonl", source_fingerprint={"size": 9})
    stones.record("b", TombstoneReason.FORGET)
    assert stones.lookup("a") == first
    assert (first.reason, first.source_path, first.source_fingerprint) == (
        TombstoneReason.RETENTION,
        "/src/a.jsonl",
        {"size": 9},
    )
    assert sorted(stones.all()) == ["a", "b"]
    assert stones.remove("a") == first
    assert stones.lookup("a") is None and stones.remove("a") is None
    assert sorted(Tombstones(tmp_path).all()) == ["b"]
    assert os.stat(tmp_path / "tombstones.jsonl").st_mode & 0o777 == 0o600
    # A session tombstoned again after an undo is tombstoned.
    stones.record("a", TombstoneReason.FORGET)
    assert stones.lookup("a").reason is TombstoneReason.FORGET


def test_a_tombstone_is_durable_across_processes(tmp_path):
    code = (
        "import sys; from memstore.tombstones import Tombstones, TombstoneReason; "
        "Tombstones(sys.argv[1]).record('gone', TombstoneReason.FORGET, source_path='/x.jsonl')"
    )
    subprocess.run([sys.executable, "-c", code, str(tmp_path)], check=True, cwd=REPO, timeout=60)
    assert Tombstones(tmp_path).lookup("gone").source_path == "/x.jsonl"


def test_a_torn_last_line_is_ignored_and_cut_by_the_next_append(tmp_path):
    stones = Tombstones(tmp_path)
    stones.record("a", TombstoneReason.RETENTION)
    with open(tmp_path / "tombstones.jsonl", "ab") as fh:
        fh.write(b'{"op":"add","session_id":"torn","rea')  # a crash in the middle of an append
    assert sorted(stones.all()) == ["a"]
    stones.record("b", TombstoneReason.RETENTION)
    assert sorted(stones.all()) == ["a", "b"]
    lines = (tmp_path / "tombstones.jsonl").read_bytes().split(b"\n")
    assert lines[-1] == b"" and all(orjson.loads(line)["op"] == "add" for line in lines[:-1])


@pytest.mark.parametrize(
    "damage",
    [
        b'{"op":"add","session_id":"a","reason":"retention","at":"x"}\nnot json at all\n',
        b'{"op":"add","session_id":"a","reason":"because","at":"x"}\n',
        b"[1, 2, 3]\n",
        b'{"op":"delete","session_id":"a","at":"x"}\n',
    ],
)
def test_damage_fails_closed_naming_the_file(tmp_path, damage):
    (tmp_path / "tombstones.jsonl").write_bytes(damage)
    with pytest.raises(TombstoneFileError) as caught:
        Tombstones(tmp_path).all()
    assert str(tmp_path / "tombstones.jsonl") in str(caught.value)


def test_a_tombstone_file_that_is_not_a_file_fails_closed(tmp_path):
    (tmp_path / "tombstones.jsonl").mkdir()
    with pytest.raises(TombstoneFileError):
        Tombstones(tmp_path).all()
    (tmp_path / "tombstones.jsonl").rmdir()
    (tmp_path / "elsewhere.jsonl").write_bytes(b"")
    (tmp_path / "tombstones.jsonl").symlink_to(tmp_path / "elsewhere.jsonl")
    with pytest.raises(TombstoneFileError):
        Tombstones(tmp_path).all()
    with pytest.raises(TombstoneFileError):
        Tombstones(tmp_path).record("a", TombstoneReason.FORGET)


def test_an_import_skips_a_tombstoned_session_and_says_so(tmp_path):
    root = tmp_path / "store"
    root.mkdir()
    Tombstones(root).record(SID_040, TombstoneReason.FORGET, source_path=str(CODEX_040))
    report = memstore.import_logs(root, CODEX_040)
    assert (report.sessions_created, report.events_appended) == (0, 0)
    assert [(t.session_id, t.reason) for t in report.tombstoned] == [(SID_040, "forget")]
    assert not memstore.session_directory(root, SID_040).exists()
    # Undone, the next import brings it in.
    Tombstones(root).remove(SID_040)
    assert memstore.import_logs(root, CODEX_040).sessions_created == 1


def test_a_damaged_tombstone_file_stops_the_import_before_anything_is_written(tmp_path):
    root = tmp_path / "store"
    root.mkdir()
    (root / "tombstones.jsonl").write_bytes(b"garbage\n")
    with pytest.raises(TombstoneFileError):
        memstore.import_logs(root, CODEX_040)
    assert not (root / "sessions").exists()
    result = CliRunner().invoke(cli, ["import", str(CODEX_040), "--root", str(root)])
    assert result.exit_code == 2
    assert str(root / "tombstones.jsonl") in result.output
    assert not (root / "sessions").exists()
