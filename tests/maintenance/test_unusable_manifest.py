"""A session's ``manifest.json`` is a view of its log: one that is a FIFO, a symlink or a
directory is never followed and never blocks anything; it is set aside (kept beside it for a
human to look at) and written anew from the log, by the session's next writer, by ``rebuild``
and by ``doctor --fix``. What a symlink pointed at is never read or written.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest

import memstore
from memstore.maintenance import check_store
from memstore.session.manifest import list_sessions

USAGE = {"input_tokens": 500, "cached_input_tokens": 100, "cache_creation_tokens": 0, "output_tokens": 60}
PRECIOUS = b'{"session_id": "not-memstore", "owner": "someone else"}\n'


def _session(root: Path, sid: str) -> Path:
    with memstore.open_session(root, sid) as log:
        for n in range(2):
            log.append({"type": "turn.started"})
            log.append(
                {
                    "type": "item.completed",
                    "item": {"type": "agent_message", "text": f"Step {n}: reran the flaky integration suite."},
                }
            )
            log.append({"type": "turn.completed", "usage": USAGE})
        return log.directory


def _spoil(directory: Path, kind: str, tmp_path: Path) -> Path:
    """Put a ``kind`` where the manifest is; return what a symlink points at (or the entry)."""
    manifest = directory / "manifest.json"
    manifest.unlink()
    if kind == "fifo":
        os.mkfifo(manifest)
        return manifest
    if kind == "directory":
        manifest.mkdir()
        return manifest
    target = tmp_path / "precious.json"
    target.write_bytes(PRECIOUS)
    manifest.symlink_to(target)
    return target


def _bounded(operation: Callable[[], object], seconds: float = 60) -> object:
    box: dict = {}

    def run() -> None:
        try:
            box["value"] = operation()
        except BaseException as exc:
            box["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), "blocked on the manifest"
    if "error" in box:
        raise box["error"]
    return box.get("value")


def _regenerated(directory: Path, tmp_path: Path, kind: str) -> None:
    manifest = directory / "manifest.json"
    assert manifest.is_file() and not manifest.is_symlink()
    data = orjson.loads(manifest.read_bytes())
    assert (data["session_id"], data["turn_count"], data["event_count"]) == ("s", 2, 6)
    kept = [p.name for p in directory.iterdir() if p.name.startswith("manifest.json.unusable-")]
    assert len(kept) == 1
    if kind == "symlink":
        assert (directory / kept[0]).is_symlink()
        assert (tmp_path / "precious.json").read_bytes() == PRECIOUS


@pytest.mark.parametrize("kind", ["fifo", "symlink", "directory"])
def test_rebuild_sets_an_unusable_manifest_aside_and_writes_it_from_the_log(tmp_path, kind):
    root = tmp_path / "store"
    directory = _session(root, "s")
    _spoil(directory, kind, tmp_path)
    report = _bounded(lambda: memstore.rebuild(root))
    assert [m.session_id for m in report] == ["s"] and report.ok
    _regenerated(directory, tmp_path, kind)


@pytest.mark.parametrize("kind", ["fifo", "symlink"])
def test_the_next_writer_rewrites_an_unusable_manifest_instead_of_refusing_the_session(tmp_path, kind):
    root = tmp_path / "store"
    directory = _session(root, "s")
    _spoil(directory, kind, tmp_path)

    # Reading and listing never block on it nor follow it; the log answers.
    def turn_count() -> int:
        with memstore.read_session(root, "s") as reader:
            return reader.manifest.turn_count

    assert _bounded(turn_count) == 2
    assert _bounded(lambda: list_sessions(root)) == []

    def append() -> None:
        with memstore.open_session(root, "s") as log:
            log.append({"type": "note", "text": "a third look at the suite"})

    _bounded(append)
    data = orjson.loads((directory / "manifest.json").read_bytes())
    assert data["event_count"] == 7
    assert [s.session_id for s in list_sessions(root)] == ["s"]
    if kind == "symlink":
        assert (tmp_path / "precious.json").read_bytes() == PRECIOUS


@pytest.mark.parametrize("kind", ["fifo", "symlink"])
def test_doctor_reports_an_unusable_manifest_and_fix_rebuilds_it(tmp_path, kind):
    root = tmp_path / "store"
    directory = _session(root, "s")
    memstore.refresh_catalog(root)
    _spoil(directory, kind, tmp_path)
    report = _bounded(lambda: check_store(root))
    assert [(p.check, p.session) for p in report.problems] == [("manifest", "s")]
    assert "FIFO" in report.problems[0].detail if kind == "fifo" else "symlink" in report.problems[0].detail
    fixed = _bounded(lambda: check_store(root, fix=True))
    assert all(p.fixed for p in fixed.problems)
    _regenerated(directory, tmp_path, kind)
    assert check_store(root).ok
