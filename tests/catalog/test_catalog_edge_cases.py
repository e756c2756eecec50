"""The catalog at the edges: sessions rewritten in ways no generation tells, damaged catalogs,
and what a refresh must still get right there. Each test is a bug that was found and fixed."""

from __future__ import annotations

import os

from catalog_support import content, from_scratch, one_session, vt_code_session

import memstore
from memstore.catalog import refresh_catalog

# VT Code writes its log lines without seqs or times, so a session of similar turns is a log of
# identical lines.
VT_TURN = (
    b'{"schema_version":"0.18.0","event":{"type":"turn.started"}}\n'
    b'{"schema_version":"0.18.0","event":{"type":"item.completed","item":{"id":"x","type":"agent_message",'
    b'"text":"ok widget"}}}\n'
    b'{"schema_version":"0.18.0","event":{"type":"turn.completed","usage":{"input_tokens":1,"output_tokens":1}}}\n'
)


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


def test_a_catalog_sqlite_cannot_read_is_set_aside_and_rebuilt_by_a_refresh(tmp_path):
    """catalog.db is a view of the sessions: one that is not a database (damaged, overwritten,
    cut short) made every refresh, and so every search, fail until someone ran ``memstore
    doctor --fix``. A search (of a process that had no connection to it) now sets it aside
    (kept beside it, for a look) and builds it again."""
    one_session(tmp_path)
    refresh_catalog(tmp_path)
    good = (tmp_path / "catalog.db").read_bytes()
    for damaged in (b"this is not a database" * 100, good[:50]):
        for suffix in ("-wal", "-shm"):
            (tmp_path / f"catalog.db{suffix}").unlink(missing_ok=True)
        (tmp_path / "catalog.db").write_bytes(damaged)
        with memstore.Store(tmp_path) as store:
            assert [hit.session_id for hit in store.search("websocket")] == ["s"]
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
            one_session(mount, f"s{i}", "websocket " * 2000)
        refresh_catalog(mount)
        for i in range(3):
            one_session(mount, f"s{i}", " ".join(f"word{n}" for n in range(3000)))
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
