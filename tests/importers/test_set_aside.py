"""Setting a session aside: a rename under the session's lock, of the very session judged.

Invariants: the set-aside session keeps every record and is listed under its own id; a session
another process holds is not set aside; a session replaced since it was judged (another import
set it aside and imported afresh) is not set aside again; a symlink in place of a session
directory is refused, never followed or renamed.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import memstore
from memstore.errors import SessionBusyError, StoreIOError
from memstore.importers.setaside import directory_identity, set_aside_session

FIXTURES = Path(__file__).parent.parent / "fixtures" / "import"
CODEX_040 = next((FIXTURES / "codex" / "0.40").glob("*.jsonl"))
SID = "codex-019982b8-2222-79e0-8b3b-00000000b002"
REPO = Path(__file__).parent.parent.parent


def records(root, sid):
    with memstore.read_session(root, sid) as reader:
        return [(r.seq, r.ts, r.event) for r in reader.iter_records()]


def test_a_set_aside_session_keeps_its_records_under_its_own_id(tmp_path):
    memstore.import_logs(tmp_path, CODEX_040)
    before = records(tmp_path, SID)
    judged = directory_identity(memstore.session_directory(tmp_path, SID))
    new = set_aside_session(tmp_path, SID, "a test", judged)
    assert new.startswith(f"{SID}.superseded-")
    assert records(tmp_path, new) == before
    assert [s.session_id for s in memstore.list_sessions(tmp_path)] == [new]
    assert not memstore.session_directory(tmp_path, SID).exists()


def test_a_session_replaced_since_it_was_judged_is_not_set_aside(tmp_path):
    memstore.import_logs(tmp_path, CODEX_040)
    judged = directory_identity(memstore.session_directory(tmp_path, SID))
    first = set_aside_session(tmp_path, SID, "the first import's", judged)
    memstore.import_logs(tmp_path, CODEX_040)  # imported afresh: a new directory under the id
    with pytest.raises(SessionBusyError):
        set_aside_session(tmp_path, SID, "a second, late import's", judged)
    assert sorted(s.session_id for s in memstore.list_sessions(tmp_path)) == sorted([SID, first])


def test_a_session_held_by_another_process_is_not_set_aside(tmp_path):
    memstore.import_logs(tmp_path, CODEX_040)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, memstore; log = memstore.open_session(sys.argv[1], "
            "sys.argv[2]); print('ready', flush=True); sys.stdin.read()",
            str(tmp_path),
            SID,
        ],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "ready"
        with pytest.raises(SessionBusyError):
            set_aside_session(tmp_path, SID, "busy")
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)
    assert [s.session_id for s in memstore.list_sessions(tmp_path)] == [SID]


def test_a_symlink_in_place_of_a_session_is_refused(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    memstore.import_logs(elsewhere, CODEX_040)
    (tmp_path / "store" / "sessions").mkdir(parents=True)
    (tmp_path / "store" / "sessions" / SID).symlink_to(memstore.session_directory(elsewhere, SID))
    with pytest.raises(StoreIOError):
        set_aside_session(tmp_path / "store", SID, "a symlink")
    assert (tmp_path / "store" / "sessions" / SID).is_symlink()
    assert records(elsewhere, SID)
