"""Legacy sessions (VT Code's own migration: ``manifest.json`` and ``derived/memory.json`` or
``derived/trajectory.jsonl``, no ``events.jsonl``) are sessions to rebuild and doctor, found
through ``iter_session_dirs(..., include_legacy=True)``: a usable manifest is kept as it is, an
unusable one is set aside and written anew, and their data (which no log holds) is never
touched. A directory with neither a log nor legacy data is still no session.
"""

from __future__ import annotations

import os
from pathlib import Path

import orjson

import memstore
from memstore.layout import is_legacy_session, iter_session_dirs
from memstore.maintenance import check_store, session_ids

ENVELOPE = orjson.dumps(
    {
        "schema_version": 3,
        "session_id": "session-foo",
        "created_at": 1767225600,
        "grounded_facts": [{"fact": "the widget is blue", "source": "user"}],
    },
    option=orjson.OPT_INDENT_2,
)
VTCODE_MANIFEST = {
    "session_id": "session-foo",
    "schema_version": 1,
    "created_at": "2026-01-01T00:00:00Z",
    "updated_at": "2026-01-01T00:00:00Z",
    "turn_count": 0,
    "event_count": 0,
    "status": "completed",
}


def _legacy(root: Path, name: str = "session-foo") -> Path:
    directory = root / "sessions" / name
    (directory / "derived").mkdir(parents=True)
    (directory / "derived" / "memory.json").write_bytes(ENVELOPE)
    (directory / "manifest.json").write_bytes(orjson.dumps(dict(VTCODE_MANIFEST, session_id=name)))
    for path in (directory, directory / "derived"):
        path.chmod(0o700)  # as VT Code makes them: private
    for path in (directory / "derived" / "memory.json", directory / "manifest.json"):
        path.chmod(0o600)
    return directory


def _with_log(root: Path, sid: str = "live") -> None:
    with memstore.open_session(root, sid) as log:
        log.append({"type": "turn.started"})
        log.append({"type": "turn.completed", "usage": {"input_tokens": 3, "output_tokens": 1}})


def test_legacy_sessions_are_listed_only_when_asked_for(tmp_path):
    root = tmp_path / "store"
    _with_log(root)
    legacy = _legacy(root)
    (root / "sessions" / "empty-dir").mkdir()
    skipped: list[tuple[str, str]] = []
    names = [
        e.name
        for e in iter_session_dirs(
            root, require_log=True, include_legacy=True, sort=True, on_skip=lambda n, why: skipped.append((n, why))
        )
    ]
    assert names == ["live", "session-foo"]
    assert skipped == [("empty-dir", "not a session (no events.jsonl)")]
    assert [e.name for e in iter_session_dirs(root, require_log=True, sort=True)] == ["live"]
    assert is_legacy_session(legacy) and not is_legacy_session(root / "sessions" / "live")
    assert session_ids(root) == ["live"]
    assert session_ids(root, include_legacy=True) == ["live", "session-foo"]


def test_rebuild_keeps_a_legacy_session_and_its_data_as_they_are(tmp_path):
    root = tmp_path / "store"
    _with_log(root)
    legacy = _legacy(root)
    before = {p: p.read_bytes() for p in legacy.rglob("*") if p.is_file()}
    report = memstore.rebuild(root)
    assert report.ok and [m.session_id for m in report] == ["live", "session-foo"]
    assert {p: p.read_bytes() for p in legacy.rglob("*") if p.is_file() and p.name != "session.lock"} == before
    doctor = check_store(root)
    assert doctor.ok, doctor.problems
    assert doctor.legacy == ["session-foo"] and doctor.sessions == 2


def test_a_legacy_session_with_an_unusable_manifest_gets_one_written_anew(tmp_path):
    root = tmp_path / "store"
    legacy = _legacy(root)
    (legacy / "manifest.json").unlink()
    os.mkfifo(legacy / "manifest.json")
    doctor = check_store(root)
    assert [(p.check, p.session, p.fixable) for p in doctor.problems] == [("manifest", "session-foo", True)]
    assert "FIFO" in doctor.problems[0].detail
    report = memstore.rebuild(root)
    assert report.ok and [m.session_id for m in report] == ["session-foo"]
    manifest = orjson.loads((legacy / "manifest.json").read_bytes())
    assert (manifest["session_id"], manifest["status"], manifest["turn_count"]) == ("session-foo", "completed", 0)
    assert (legacy / "derived" / "memory.json").read_bytes() == ENVELOPE
    assert [p.name.startswith("manifest.json.unusable-") for p in legacy.iterdir() if "unusable" in p.name] == [True]
    assert check_store(root).ok


def test_doctor_fix_repairs_a_legacy_manifest_that_names_another_session(tmp_path):
    root = tmp_path / "store"
    legacy = _legacy(root)
    (legacy / "manifest.json").write_bytes(orjson.dumps(dict(VTCODE_MANIFEST, session_id="someone-else")))
    memstore.refresh_catalog(root)
    found = check_store(root, fix=True)
    assert [(p.check, p.fixed) for p in found.problems] == [("manifest", True)]
    assert orjson.loads((legacy / "manifest.json").read_bytes())["session_id"] == "session-foo"
    assert (legacy / "derived" / "memory.json").read_bytes() == ENVELOPE
    assert check_store(root).ok


def test_memstore_rebuild_all_on_the_command_line_includes_legacy_sessions(tmp_path):
    from click.testing import CliRunner

    from memstore.cli import cli

    root = tmp_path / "store"
    _with_log(root)
    legacy = _legacy(root)
    done = CliRunner().invoke(cli, ["rebuild", "--all", "--json", "--root", str(root)], catch_exceptions=False)
    assert done.exit_code == 0, done.output
    assert [r["session_id"] for r in orjson.loads(done.stdout)] == ["live", "session-foo"]
    assert (legacy / "derived" / "memory.json").read_bytes() == ENVELOPE
