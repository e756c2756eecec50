"""The catalog at the edges: sessions rewritten in ways no generation tells, damaged catalogs,
and what a refresh must still get right there. Each test is a bug that was found and fixed."""

from __future__ import annotations

import json
import os

import memstore
from memstore.catalog import refresh_catalog
from test_catalog import content, from_scratch

# VT Code writes its log lines without seqs or times, so a session of similar turns is a log of
# identical lines.
VT_TURN = (
    b'{"schema_version":"0.18.0","event":{"type":"turn.started"}}\n'
    b'{"schema_version":"0.18.0","event":{"type":"item.completed","item":{"id":"x","type":"agent_message",'
    b'"text":"ok widget"}}}\n'
    b'{"schema_version":"0.18.0","event":{"type":"turn.completed","usage":{"input_tokens":1,"output_tokens":1}}}\n'
)


def vt_code_session(root, sid, log: bytes, *, turn_count: int, event_count: int, retained_turn_base: int):
    """A session as VT Code itself leaves one: events.jsonl (replaced atomically, as its cap
    rewrite does) and manifest.json, no memstore index."""
    directory = root / "sessions" / sid
    directory.mkdir(parents=True, exist_ok=True)
    staged = directory / "events.jsonl.tmp"
    staged.write_bytes(log)
    os.replace(staged, directory / "events.jsonl")
    (directory / "manifest.json").write_text(json.dumps({
        "session_id": sid, "created_at": "2026-01-01T00:00:00Z", "updated_at": "2026-01-01T00:00:00Z",
        "status": "active", "turn_count": turn_count, "event_count": event_count, "in_turn": False,
        "retained_turn_base": retained_turn_base, "persisted_file_len": len(log)}))
    return directory


def test_a_vt_code_cap_rewrite_of_a_repetitive_log_is_recopied(tmp_path):
    """VT Code's cap rewrite gives no generation; the catalog tells it by the bytes that ended
    what it copied. In a log of identical turns the log that grew again past that length after
    the rewrite ends there in the same bytes, yet turns 1 and 2 are gone: the first retained
    turn (3, in the manifest) says so, and the session must be copied again, not grown."""
    root = tmp_path / "store"
    vt_code_session(root, "v", VT_TURN * 6, turn_count=6, event_count=18, retained_turn_base=1)
    assert refresh_catalog(root).added == ["v"]
    # Turns 1 and 2 evicted, then three more turns appended.
    vt_code_session(root, "v", VT_TURN * 7, turn_count=9, event_count=21, retained_turn_base=3)
    report = refresh_catalog(root)
    assert report.recopied == ["v"] and not report.errors
    data = content(root)
    assert [t[1] for t in data["turns"]] == list(range(3, 10))
    assert data == from_scratch(root, tmp_path)


def _one_session(root, sid="s", text="the flaky websocket test"):
    with memstore.open_session(root, sid) as log:
        log.append({"type": "turn.started"})
        log.append({"type": "item.completed", "item": {"id": "m", "type": "agent_message", "text": text}})
        log.append({"type": "turn.completed", "usage": {}})


def test_a_catalog_sqlite_cannot_read_is_set_aside_and_rebuilt_by_a_refresh(tmp_path):
    """catalog.db is a view of the sessions: one that is not a database (damaged, overwritten,
    cut short) made every refresh, and so every search_memory, fail until someone ran
    ``memstore doctor --fix``. A refresh now sets it aside (kept beside it, for a look) and
    builds it again."""
    _one_session(tmp_path)
    refresh_catalog(tmp_path)
    good = (tmp_path / "catalog.db").read_bytes()
    for damaged in (b"this is not a database" * 100, good[:50]):
        for suffix in ("-wal", "-shm"):
            (tmp_path / f"catalog.db{suffix}").unlink(missing_ok=True)
        (tmp_path / "catalog.db").write_bytes(damaged)
        assert [hit.session_id for hit in memstore.search_memory(tmp_path, "websocket")] == ["s"]
        kept = sorted(tmp_path.glob("catalog.db.unreadable-*"))
        assert kept and kept[-1].read_bytes() == damaged
        for k in kept:
            k.unlink()
    assert content(tmp_path) == from_scratch(tmp_path, tmp_path)


def test_a_full_disk_under_the_catalog_is_reported_naming_catalog_db(tmp_path):
    """A refresh on a full disk put every session in ``errors`` with SQLite's bare "database or
    disk is full" (and logged "skipping session directory ...": the sessions were fine). The
    error names the file that could not be written; once there is room the refresh catches up."""
    import subprocess

    import pytest

    mount = tmp_path / "disk"
    mount.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mount)], capture_output=True)
    if mounted.returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        for i in range(3):
            _one_session(mount, f"s{i}", "websocket " * 2000)
        refresh_catalog(mount)
        for i in range(3):
            _one_session(mount, f"s{i}", " ".join(f"word{n}" for n in range(3000)))
        filler = mount / "filler"
        fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            while True:
                os.write(fd, b"\0" * 4096)
        except OSError:
            pass
        finally:
            os.close(fd)
        os.truncate(filler, os.path.getsize(filler) - 64 * 1024)
        report = refresh_catalog(mount)
        assert report.errors and all(str(mount / "catalog.db") in reason for _name, reason in report.errors)
        filler.unlink()
        report = refresh_catalog(mount)
        assert not report.errors
        assert content(mount) == from_scratch(mount, tmp_path)
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)
