"""Every store-level file and directory memstore keeps beside the sessions gets the treatment the
session files have: a symlink there (to something outside the store) or a FIFO is never
followed, never blocks, and never has its target modified. The operation that touches it either
fails with a memstore error naming the path or, where going on is the safer behaviour (a record
that only decides which warnings are new, a directory retention cannot use), goes on without it
and says so in a warning naming the path.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

import memstore
from memstore.identity import set_label, store_identity
from memstore.importers.drift import VersionStats, load_versions, save_versions
from memstore.locks import STORE_LOCKS, store_lock
from memstore.maintenance import check_store, session_ids
from memstore.redact import load_config
from memstore.retention import RetentionPolicy
from memstore.session.manifest import list_sessions
from memstore.tombstones import TombstoneFileError, TombstoneReason, Tombstones

FIXTURES = Path(__file__).parent.parent / "fixtures" / "import"
CODEX_040 = next((FIXTURES / "codex" / "0.40").glob("*.jsonl"))
SID_040 = "codex-019982b8-2222-79e0-8b3b-00000000b002"
OLD = 1_700_000_000.0
IMPORT_STATE = f"sessions/{SID_040}/derived/import-state.json"
USAGE = {"input_tokens": 1, "cached_input_tokens": 0, "cache_creation_tokens": 0, "output_tokens": 1}


def _store(tmp_path: Path) -> Path:
    """A store with an agent's session, an empty shell retention removes, and an imported
    session (with its import cache, derived/import-state.json)."""
    root = tmp_path / "store"
    with memstore.open_session(root, "s1") as log:
        log.append({"type": "turn.started"})
        log.append({"type": "turn.completed", "usage": USAGE})
    with memstore.open_session(root, "shell") as log:
        log.append({"type": "thread.started", "thread_id": "shell"}, ts="2025-01-01T00:00:00.000Z")
        log.append(
            {
                "type": "thread.completed",
                "thread_id": "shell",
                "session_id": "shell",
                "subtype": "success",
                "outcome_code": "exited",
                "num_turns": 0,
                "usage": USAGE,
            },
            ts="2025-01-01T00:00:01.000Z",
        )
    source = tmp_path / "src" / CODEX_040.name
    source.parent.mkdir()
    shutil.copyfile(CODEX_040, source)
    os.utime(source, (OLD, OLD))
    memstore.import_logs(root, source)
    return root


def _outside(tmp_path: Path, directory: bool) -> Path:
    """What a symlink in the store points at: a file, or a directory holding a session."""
    if not directory:
        target = tmp_path / "outside" / "precious.txt"
        target.parent.mkdir()
        target.write_bytes(b"precious, and not memstore's\n")
        return target
    elsewhere = tmp_path / "elsewhere"
    with memstore.open_session(elsewhere, "out") as log:
        log.append({"type": "turn.started"})
        log.append({"type": "turn.completed", "usage": USAGE})
    return elsewhere / "sessions"


def _snapshot(path: Path) -> dict:
    """Every entry under ``path`` (or ``path`` itself) with its kind, mode, size, mtime and bytes."""
    found = {}
    paths = [path] + (sorted(path.rglob("*")) if path.is_dir() else [])
    for p in paths:
        st = os.lstat(p)
        content = p.read_bytes() if p.is_file() and not p.is_symlink() else None
        found[str(p.relative_to(path.parent))] = (st.st_mode, st.st_size, st.st_mtime_ns, content)
    return found


def _entry(path: Path) -> tuple:
    st = os.lstat(path)
    return (st.st_mode, st.st_ino, os.readlink(path) if path.is_symlink() else None)


# -- what each name is, and the operations that touch it --------------------------------------


def _take_lock(name: str) -> Callable[[Path], None]:
    def take(root: Path) -> None:
        with store_lock(root, name, timeout=10):
            pass

    return take


def _take_every_lock(root: Path) -> None:
    for name in STORE_LOCKS:
        with pytest.raises(memstore.StoreIOError, match="locks"):
            _take_lock(name)(root)
    memstore.refresh_catalog(root)  # through the catalog's lock


def _retention(root: Path) -> None:
    """Retention would remove the empty shell: never without recording it in gc-log.jsonl
    through its trash."""
    try:
        report = memstore.apply_retention(root, RetentionPolicy(max_sessions=50, max_age_days=30), apply=True)
        assert report.count == 0
        assert any(s.directory == "shell" and ".trash" in s.reason for s in report.skipped)
    finally:
        assert (root / "sessions" / "shell" / "events.jsonl").is_file()


def _tombstones(root: Path) -> None:
    path = str(root / "tombstones.jsonl")
    with pytest.raises(TombstoneFileError) as caught:
        Tombstones(root).record("gone", TombstoneReason.FORGET)
    assert caught.value.path == path
    # Retention then removes no imported session (fail closed), and says so.
    report = memstore.apply_retention(root, RetentionPolicy(0, 0, include_imported=True), apply=True)
    assert memstore.session_directory(root, SID_040).is_dir()
    assert any(s.directory == "tombstones.jsonl" for s in report.skipped)
    Tombstones(root).all()


def _import_versions(root: Path) -> None:
    assert load_versions(root) == {}
    save_versions(root, {}, [VersionStats("codex", "0.40.0", records=3)])


def _store_identity(root: Path) -> None:
    with pytest.raises(memstore.StoreIOError, match="store.json"):
        set_label(root, "mine")
    store_identity(root)


def _import_state(root: Path) -> None:
    """doctor reads an imported session's import cache for its stats; retention reads it for the
    tombstone's fingerprint. Neither needs it: each goes on without it, and says so."""
    report = check_store(root)
    assert report.sessions == 3
    said: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            said.append(record.getMessage())

    handler = Collect(logging.WARNING)
    logging.getLogger("memstore").addHandler(handler)
    try:
        removed = memstore.apply_retention(root, RetentionPolicy(0, 0, include_imported=True), apply=True)
    finally:
        logging.getLogger("memstore").removeHandler(handler)
    assert SID_040 in {r.session_id for r in removed.removed}
    assert Tombstones(root).lookup(SID_040) is not None
    assert any(IMPORT_STATE in message for message in said), said


def _sessions(root: Path) -> None:
    """``sessions/`` itself: listed by rebuild --all, doctor, sessions, retention."""
    assert session_ids(root) == []
    assert list_sessions(root) == []
    assert list(memstore.rebuild(root)) == []
    assert memstore.apply_retention(root, RetentionPolicy(0, 0), apply=True).count == 0
    report = check_store(root, fix=True)
    assert report.sessions == 0 and not report.ok


CASES: dict[str, tuple[bool, Callable[[Path], None]]] = {
    # name: (a directory?, the operation)
    "locks": (True, _take_every_lock),
    **{f"locks/{name}.lock": (False, _take_lock(name)) for name in STORE_LOCKS},
    "gc-log.jsonl": (False, lambda root: memstore.apply_retention(root, RetentionPolicy(0, 0), apply=True)),
    ".trash": (True, _retention),
    "tombstones.jsonl": (False, _tombstones),
    "import-versions.json": (False, _import_versions),
    "store.json": (False, _store_identity),
    "config.toml": (False, load_config),
    IMPORT_STATE: (False, _import_state),
    "sessions": (True, _sessions),
}


def _bounded(operation: Callable[[], object], fifo: Path | None, seconds: float = 120) -> dict:
    """Run ``operation`` in a thread; fail if it is still running after ``seconds`` (blocked on
    the FIFO: it is then opened from here to let the thread go)."""
    box: dict = {}

    def run() -> None:
        try:
            box["value"] = operation()
        except BaseException as exc:  # judged by the test
            box["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        if fifo is not None:
            fd = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)
            thread.join(10)
            os.close(fd)
        pytest.fail(f"the operation blocked (on {fifo})")
    return box


@pytest.mark.parametrize("kind", ["symlink", "fifo"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_a_symlink_or_fifo_at_a_store_level_name_is_refused_or_skipped_never_followed(tmp_path, caplog, name, kind):
    is_dir, operation = CASES[name]
    root = _store(tmp_path)
    path = root / name
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif os.path.lexists(path):
        path.unlink()
    path.parent.mkdir(parents=True, exist_ok=True)
    target = _outside(tmp_path, is_dir)
    if kind == "symlink":
        path.symlink_to(target, target_is_directory=is_dir)
    else:
        os.mkfifo(path, 0o600)
    before, entry = _snapshot(target), _entry(path)
    caplog.set_level(logging.WARNING)

    box = _bounded(lambda: operation(root), path if kind == "fifo" else None)

    error = box.get("error")
    if error is not None:
        assert isinstance(error, memstore.MemstoreError), repr(error)
        assert str(path) in str(error), str(error)
    else:
        warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        assert any(str(path) in w for w in warnings), warnings
    assert _snapshot(target) == before  # never followed: what it points at is as it was
    if name == IMPORT_STATE:
        # Retention removed its session (as it was asked to): the entry went with it, unfollowed.
        assert not os.path.lexists(path)
    else:
        assert _entry(path) == entry  # the entry itself is left for a human to look at
