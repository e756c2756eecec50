"""The catalog's file is handled with care: never followed through a symlink, never opened as a
FIFO; a catalog of another format is set aside, not failed on for ever; a full disk is said to
be one (ENOSPC, not a bare "disk I/O error"); a session directory the user cannot enter is one
missing session, not an error for every search; and a store the user cannot write is searched
read-only, with no lock and no chmod. Permission tests run as ``nobody`` (see as_user.py)."""

from __future__ import annotations

import errno
import importlib
import json
import os
import sqlite3
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from as_user import cleanup, give, nobody, run_as_nobody, shared_dir
from catalog_support import content, from_scratch, one_session, turn

import memstore
from memstore.catalog import refresh_catalog

SIDES = ("", "-wal", "-shm", "-journal")
REPO = Path(__file__).resolve().parents[2]


def _files(directory: Path) -> dict:
    out = {}
    for path in sorted(directory.rglob("*")):
        st = os.lstat(path)
        out[str(path.relative_to(directory))] = (stat.S_IMODE(st.st_mode), st.st_mtime_ns, st.st_size)
    return out


# --------------------------------------------------------------------------------------------
# Symlinks and FIFOs at the catalog and its side files


@pytest.mark.parametrize("side", SIDES)
def test_a_symlink_at_the_catalog_or_a_side_file_is_refused_naming_it(tmp_path, side):
    """catalog.db that is a symlink was followed: memstore chmod'ed its target, switched it to
    WAL and rewrote another store's rows; a symlinked catalog.db-wal gave only "unable to open
    database file". Each is refused, naming the file, and the target is left as it was."""
    root = tmp_path / "store"
    one_session(root)
    other = tmp_path / "other"
    one_session(other, "o", "another store's text")
    refresh_catalog(other)
    refresh_catalog(root)
    target = other / "catalog.db" if side == "" else tmp_path / f"target{side}"
    if side:
        target.write_bytes(b"")
    target.chmod(0o644)
    before = (target.read_bytes(), stat.S_IMODE(target.stat().st_mode))
    link = Path(f"{root / 'catalog.db'}{side}")
    if side == "":
        link.unlink()
    link.symlink_to(target)
    for attempt in (lambda: refresh_catalog(root), lambda: memstore.Store(root).search("websocket")):
        with pytest.raises(memstore.UnsafePathError) as caught:
            attempt()
        assert caught.value.path == str(link) and "symlink" in str(caught.value)
    assert (target.read_bytes(), stat.S_IMODE(target.stat().st_mode)) == before
    memstore.Store(root).close()


@pytest.mark.parametrize("side", SIDES)
def test_a_fifo_at_the_catalog_or_a_side_file_is_refused_at_once(tmp_path, side):
    root = tmp_path / "store"
    one_session(root)
    refresh_catalog(root)
    fifo = Path(f"{root / 'catalog.db'}{side}")
    fifo.unlink(missing_ok=True)
    os.mkfifo(fifo)
    for attempt in (lambda: refresh_catalog(root), lambda: memstore.Store(root).search("websocket")):
        with pytest.raises(memstore.UnsafePathError) as caught:
            attempt()
        assert caught.value.path == str(fifo) and "FIFO" in str(caught.value)
    memstore.Store(root).close()


# --------------------------------------------------------------------------------------------
# A catalog of another format


def test_search_tables_of_another_format_are_set_aside_and_rebuilt(tmp_path):
    """Search tables of another format made every refresh and search fail for ever ("drop the
    search_* tables and rebuild") while ``doctor`` said the store was healthy. The catalog is
    set aside and built again, as an unreadable one is, and doctor reports it."""
    for sid in ("a", "b"):
        with memstore.open_session(tmp_path, sid) as log:
            turn(log, 1)
    refresh_catalog(tmp_path)
    conn = sqlite3.connect(tmp_path / "catalog.db")
    with conn:
        conn.execute("UPDATE search_meta SET value = '99' WHERE key = 'format'")
    conn.close()
    report = memstore.Store(tmp_path).doctor()
    assert any(p.check == "catalog" and "format 99" in p.detail for p in report.problems), report.problems
    assert {h.session_id for h in memstore.search_memory(tmp_path, "widget", 10)} == {"a", "b"}
    assert list(tmp_path.glob("catalog.db.unreadable-*"))
    assert content(tmp_path) == from_scratch(tmp_path, tmp_path)
    memstore.Store(tmp_path).close()
    conn = sqlite3.connect(tmp_path / "catalog.db")
    with conn:
        conn.execute("UPDATE search_meta SET value = '99' WHERE key = 'format'")
    conn.close()
    fixed = memstore.Store(tmp_path).doctor(fix=True)
    assert [p.fixed for p in fixed.problems if p.check == "catalog"] == [True]
    assert not [p for p in memstore.Store(tmp_path).doctor().problems if p.check == "catalog"]


# --------------------------------------------------------------------------------------------
# A full disk


@pytest.fixture
def small_disk(tmp_path):
    mount = tmp_path / "disk"
    mount.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mount)], capture_output=True)
    if mounted.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        memstore.Store(mount).close()
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def _fill(mount: Path, slack: int = 0) -> Path:
    filler = mount / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError:
        pass
    finally:
        os.close(fd)
    if slack:
        os.truncate(filler, os.path.getsize(filler) - slack)
    return filler


def _grow(mount: Path) -> None:
    for i in range(3):
        with memstore.open_session(mount, f"s{i}") as log:
            log.append({"type": "turn.started"})
            log.append(
                {
                    "type": "item.completed",
                    "item": {"id": f"n{i}", "type": "agent_message", "text": " ".join(f"word{n}" for n in range(3000))},
                }
            )
            log.append({"type": "turn.completed", "usage": {}})


def test_a_full_disk_under_an_existing_catalog_is_enospc_and_search_says_what_it_misses(small_disk):
    """Opening the catalog on a full disk failed with SQLite's "disk I/O error" and errno None,
    and every search with it. Now the refresh raises ENOSPC naming catalog.db, and a search
    answers from the catalog as it was, listing the sessions it could not bring in."""
    for i in range(3):
        one_session(small_disk, f"s{i}", "websocket " * 2000)
    refresh_catalog(small_disk)
    _grow(small_disk)
    filler = _fill(small_disk)
    with pytest.raises(memstore.StoreIOError) as caught:
        refresh_catalog(small_disk)
    assert caught.value.errno == errno.ENOSPC and caught.value.path == str(small_disk / "catalog.db")
    hits = memstore.search_memory(small_disk, "websocket")
    assert hits and hits.partial
    assert [m.directory for m in hits.missing] == ["s0", "s1", "s2"]
    assert all("no space left on device" in m.reason for m in hits.missing)
    memstore.Store(small_disk).close()
    filler.unlink()
    hits = memstore.search_memory(small_disk, "word2999")
    assert {h.session_id for h in hits} == {"s0", "s1", "s2"} and not hits.partial


def test_a_full_disk_with_no_catalog_yet_is_enospc_and_leaves_no_catalog(small_disk):
    one_session(small_disk, "s0", "websocket " * 2000)
    _fill(small_disk)
    for attempt in (lambda: refresh_catalog(small_disk), lambda: memstore.search_memory(small_disk, "websocket")):
        with pytest.raises(memstore.StoreIOError) as caught:
            attempt()
        assert caught.value.errno == errno.ENOSPC, caught.value
    assert not (small_disk / "catalog.db").exists()


_FSIZE_CHILD = r"""
import json, resource, signal, sys
sys.path.insert(0, sys.argv[1])
import memstore
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead
limit = int(sys.argv[3])
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
hits = memstore.search_memory(sys.argv[2], "websocket")
print(json.dumps({"hits": len(hits), "missing": [m.to_dict() for m in hits.missing]}))
"""


def test_a_file_size_limit_is_a_partial_answer_not_zero_hits_in_silence(tmp_path):
    """Under RLIMIT_FSIZE every session failed to copy and search returned 0 hits, no error.
    The answer now says every session is missing, and why (the file size limit, EFBIG)."""
    for i in range(4):
        one_session(tmp_path, f"s{i}", " ".join(f"websocket{n}" for n in range(20000)) + " websocket")
    result = subprocess.run(
        [sys.executable, "-c", _FSIZE_CHILD, str(REPO), str(tmp_path), str(256 << 10)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    import json

    answer = json.loads(result.stdout.strip().splitlines()[-1])
    assert answer["hits"] == 0
    assert [m["directory"] for m in answer["missing"]] == ["s0", "s1", "s2", "s3"]
    assert all("file size limit" in m["reason"] for m in answer["missing"]), answer["missing"]


# --------------------------------------------------------------------------------------------
# What the user cannot enter, or cannot write


def _search_json(root: str, query: str) -> dict:
    hits = memstore.search_memory(root, query, 20)
    return {"hits": sorted({h.session_id for h in hits}), "missing": [m.to_dict() for m in hits.missing]}


def _cli_search_and_refresh(root: str, query: str) -> dict:
    from click.testing import CliRunner

    from memstore.cli import cli
    from memstore.errors import StoreIOError

    result = CliRunner().invoke(cli, ["search", query, "--root", root, "--json"])
    try:
        memstore.Store(root).refresh(full=False, sweep=False)
        refused = None
    except StoreIOError as exc:
        refused = exc.errno
    hits = json.loads(result.stdout) if result.exit_code == 0 else None
    return {"exit": result.exit_code, "hits": sorted({h["session_id"] for h in hits or ()}), "refused": refused}


def _refresh_errors(root: str) -> list:
    return memstore.refresh_catalog(root).errors


def test_a_session_directory_the_user_cannot_enter_is_one_missing_session(tmp_path):
    """A directory made under sudo (here: mode 000) made every search and refresh raise a raw
    PermissionError. It is one missing session now; every other session is searched."""
    uid, gid = nobody() if os.geteuid() == 0 else (os.getuid(), os.getgid())
    base = shared_dir()
    try:
        root = base / "store"
        for sid in ("a", "b", "locked"):
            with memstore.open_session(root, sid) as log:
                turn(log, 1)
        give(root, uid, gid)
        (root / "sessions" / "locked").chmod(0)
        answer = run_as_nobody(_search_json, str(root), "widget")
        assert answer["hits"] == ["a", "b"]
        assert [m["directory"] for m in answer["missing"]] == ["locked"]
        assert "Permission denied" in answer["missing"][0]["reason"]
        errors = run_as_nobody(_refresh_errors, str(root))
        assert [name for name, _why in errors] == ["locked"]
    finally:
        (base / "store" / "sessions" / "locked").chmod(0o700)
        cleanup(base)


def test_a_read_only_copy_of_a_store_is_searched_without_a_lock_or_a_chmod(tmp_path):
    """A copy of a store its user cannot write (permissions, not a read-only mount) was not
    searchable: filelock could not create its lock, and memstore chmod'ed locks/ back. Search
    now reads the catalog as it is: no lock, no file created, no mode changed."""
    uid, gid = nobody() if os.geteuid() == 0 else (os.getuid(), os.getgid())
    base = shared_dir()
    try:
        root = base / "store"
        for sid in ("a", "b"):
            with memstore.open_session(root, sid) as log:
                turn(log, 1)
        refresh_catalog(root)
        give(root, uid, gid)
        for folder, dirs, files in os.walk(root):
            for name in files:
                os.chmod(os.path.join(folder, name), 0o400)
            for name in dirs:
                os.chmod(os.path.join(folder, name), 0o500)
        root.chmod(0o500)
        before = _files(root)
        answer = run_as_nobody(_search_json, str(root), "widget")
        assert answer == {"hits": ["a", "b"], "missing": []}
        assert _files(root) == before
        # The CLI too; a refresh asked for is refused with EACCES, before any lock is taken.
        # (Imported here: the child, once it is nobody, may not read the interpreter's files.)
        for module in ("click.testing", "memstore.cli", "memstore.explorer.urls"):
            importlib.import_module(module)

        cli = run_as_nobody(_cli_search_and_refresh, str(root), "widget")
        assert cli == {"exit": 0, "hits": ["a", "b"], "refused": errno.EACCES}
        assert _files(root) == before
    finally:
        for folder, _dirs, _names in os.walk(base):
            os.chmod(folder, 0o755)
        cleanup(base)
