"""The demo store: a run killed at any append and then rerun gives the bytes of an uninterrupted
run, and a rerun keeps what someone appended to an imported demo session."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import memstore
from memstore.demo import IMPORTED_SESSIONS, write_demo_store

REPO = Path(__file__).resolve().parents[2]

# A demo run killed at its n-th append (os._exit: no cleanup runs, as with SIGKILL or a power cut).
_CRASH = textwrap.dedent("""
    import json, os, sys
    import memstore.session.log as L
    from memstore.demo import write_demo_store
    stop_at, count = int(sys.argv[2]), [0]
    append = L.SessionLog.append
    def crashing(self, *a, **k):
        count[0] += 1
        if count[0] == stop_at:
            os._exit(9)
        return append(self, *a, **k)
    L.SessionLog.append = crashing
    report = write_demo_store(sys.argv[1])
    print(json.dumps({"appends": count[0], **report.to_dict()}))
""")


def _demo_run(root: Path, stop_at: int = 0) -> subprocess.CompletedProcess:
    # TMPDIR: the temporary directories a killed run leaves behind stay in the test's.
    tmp = root.parent / "tmp"
    tmp.mkdir(exist_ok=True)
    env = dict(os.environ, PYTHONPATH=str(REPO), TMPDIR=str(tmp))
    return subprocess.run(
        [sys.executable, "-c", _CRASH, str(root), str(stop_at)], env=env, capture_output=True, text=True, timeout=120
    )


def _demo_bytes(root: Path) -> dict[str, bytes]:
    out = {}
    for path in sorted((root / "sessions").glob("*/events.jsonl")) + sorted(
        (root / "sessions").glob("*/derived/progress.json")
    ):
        # The imported sessions name the file they were imported from (a directory per store).
        out[str(path.relative_to(root))] = re.sub(rb"memstore-demo-sources-[0-9a-z_]+", b"<sources>", path.read_bytes())
    return out


@pytest.mark.slow
def test_a_demo_killed_while_importing_gives_the_bytes_of_an_uninterrupted_run_when_rerun(tmp_path):
    whole = _demo_run(tmp_path / "whole")
    assert whole.returncode == 0, whole.stderr
    appends = json.loads(whole.stdout)["appends"]
    want = _demo_bytes(tmp_path / "whole")
    # Killed in the imports, the last appends of the run: the sources are left behind, and
    # the directories of one or both imported sessions exist with only some of their events.
    for stop_at in range(appends - 24, appends + 1, 3):
        root = tmp_path / f"killed-at-{stop_at}"
        assert _demo_run(root, stop_at).returncode == 9
        rerun = _demo_run(root)
        assert rerun.returncode == 0, rerun.stderr
        report = json.loads(rerun.stdout)
        assert _demo_bytes(root) == want, f"killed at append {stop_at}"
        assert report["kept"] == [] and set(report["imported"]) <= set(IMPORTED_SESSIONS)
    # A second uninterrupted run imports nothing and changes nothing.
    again = json.loads(_demo_run(tmp_path / "whole").stdout)
    assert again["imported"] == [] and len(again["skipped"]) == 30 and _demo_bytes(tmp_path / "whole") == want


def test_events_appended_to_an_imported_demo_session_are_kept_when_the_other_is_reimported(tmp_path):
    write_demo_store(tmp_path)
    codex, claude, _subagent = IMPORTED_SESSIONS
    with memstore.open_session(tmp_path, codex) as log:
        log.append({"type": "note", "text": "mine"})
    grown = (tmp_path / "sessions" / codex / "events.jsonl").read_bytes()
    shutil.rmtree(tmp_path / "sessions" / claude)
    report = write_demo_store(tmp_path)
    # The re-import of the missing session does not re-import (remove) the one someone added to.
    assert (tmp_path / "sessions" / codex / "events.jsonl").read_bytes() == grown
    assert report.kept == [codex] and report.imported == [claude]
