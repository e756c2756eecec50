"""Edge cases of progress ledgers and audit packs found in review (issue 3): FIFOs in place of
files, hidden files, packs written inside the session, and which file an error names. Each
docstring cites the reference rule (``../shared/reference/vtcode-memory.md``) or the issue
requirement it checks."""

import contextlib
import os
import signal

import orjson
import pytest
from click.testing import CliRunner
from support import write_session_files

from memstore import (
    StoreIOError,
    create_audit_pack,
    load_progress,
    progress_path,
    read_audit_pack,
    verify_audit_pack,
    write_audit_pack,
)
from memstore.cli import cli


def make_session(root, session_id="s1"):
    return write_session_files(root, session_id)


class StillBlocked(Exception):
    """Not an OSError, so the code under test cannot turn it into a StoreIOError."""


@contextlib.contextmanager
def deadline(seconds):
    """Turn a hang into a test failure: SIGALRM interrupts a blocking open() on a FIFO."""

    def expire(signum, frame):
        raise StillBlocked(f"still blocked after {seconds}s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _fifo_ledger(root):
    path = progress_path(root, "s1")
    path.parent.mkdir(parents=True)
    os.mkfifo(path)
    return path, lambda: load_progress(root, "s1")


def _fifo_pack(root):
    make_session(root)
    path = root / "pack.json"
    os.mkfifo(path)
    return path, lambda: read_audit_pack(path)


def _fifo_manifest(root):
    session_dir = make_session(root)
    path = session_dir / "manifest.json"
    path.unlink()
    os.mkfifo(path)
    return path, lambda: create_audit_pack(root, "s1")


@pytest.mark.parametrize("setup", [_fifo_ledger, _fifo_pack, _fifo_manifest], ids=["ledger", "pack", "manifest"])
def test_a_fifo_in_place_of_a_file_is_refused_not_waited_on(tmp_path, setup):
    """Reference 1, "read no-follow": open with O_NOFOLLOW and *require a regular file*; 2.2
    "load_progress ... IO or parse errors are raised"; 5.6 read_audit_pack / create_audit_pack
    (manifest must parse, otherwise Io). A FIFO planted at derived/progress.json, at the PACK
    argument of ``memstore verify`` or at manifest.json must be refused with an error naming it;
    today ``fsio.open_read_no_follow`` opens it without O_NONBLOCK and blocks forever (``memstore
    progress`` / ``verify`` / ``pack`` hang)."""
    path, call = setup(tmp_path)
    with deadline(2):
        with pytest.raises(StoreIOError) as info:
            call()
    assert info.value.path == str(path)


def test_hidden_files_are_inventoried_and_their_tampering_detected(tmp_path):
    """Reference 5.6 create_audit_pack: "Walk every *regular file* under the session dir ...
    Symlinks and directories are skipped, as are files named audit-pack.json" (the complete
    exclusion list); issue 3: "SHA-256 and size of every regular file of the session directory
    ... excluding any audit-pack.json". Verification's "every component must be normal" is Rust's
    Component::Normal, which ``.DS_Store`` is. Today hidden names are silently left out of the
    pack, so a hidden file changed after packing still verifies (exit 0)."""
    session_dir = make_session(tmp_path)
    (session_dir / ".DS_Store").write_bytes(b"original")
    (session_dir / "derived" / ".notes").write_bytes(b"original")
    pack = create_audit_pack(tmp_path, "s1")
    assert {".DS_Store", "derived/.notes"} <= {e.path for e in pack.entries}
    (session_dir / "derived" / ".notes").write_bytes(b"tampered")
    result = verify_audit_pack(tmp_path, "s1", pack)
    assert not result.verified
    assert result.mismatches == ["derived/.notes"]


def test_a_pack_written_inside_the_session_verifies_right_after_it_is_rewritten(tmp_path):
    """Reference conventions / 4.2 pack.rs: "the pack excludes itself"; issue 3: "an exit code
    that scripts can trust". With ``--output`` inside the session under another name than
    audit-pack.json, the second ``memstore pack`` inventories the previous copy of the very file
    it then replaces, so the fresh pack immediately fails ``memstore verify`` (exit 1)."""
    session_dir = make_session(tmp_path)
    out = session_dir / "derived" / "pack-2026-11-30.json"
    write_audit_pack(tmp_path, "s1", out)
    pack, _ = write_audit_pack(tmp_path, "s1", out)  # e.g. a nightly job re-packing
    result = verify_audit_pack(tmp_path, "s1", read_audit_pack(out))
    assert result.verified, result
    assert "derived/pack-2026-11-30.json" not in [e.path for e in pack.entries]


def test_verify_error_for_an_unsafe_entry_names_the_pack_file(tmp_path):
    """Review brief / conventions ("Errors carry context"): an error must name the file it is
    about. ``memstore verify s1`` on a pack with an unsafe entry says only "entry path
    '../outside.json' has a '..' component", never which pack file (here the default
    derived/audit-pack.json, which the user did not type) holds it; read_audit_pack's errors
    (schema_version, bad JSON) do name it."""
    make_session(tmp_path)
    _, path = write_audit_pack(tmp_path, "s1")
    data = orjson.loads(path.read_bytes())
    data["entries"].append({"path": "../outside.json", "bytes": 0, "sha256": "0" * 64})
    path.write_bytes(orjson.dumps(data))
    result = CliRunner().invoke(cli, ["verify", "s1", "--root", str(tmp_path)])
    assert result.exit_code == 2
    assert str(path) in result.output


def test_a_pack_of_a_missing_session_creates_nothing(tmp_path):
    """A pack of a session that is not there is an error naming the path, and leaves no
    ``sessions/<id>/derived/`` behind (which retention and pin would take for a session)."""
    root = tmp_path / "store"
    with pytest.raises(StoreIOError) as info:
        write_audit_pack(root, "nosuch")
    assert "nosuch" in str(info.value)
    assert not root.exists()


def test_loading_a_ledger_through_a_symlinked_derived_directory_is_refused(tmp_path):
    """``derived/`` as a symlink would read a ledger from outside the store: refused, naming it."""
    session_dir = make_session(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "progress.json").write_bytes(b"{}")
    derived = progress_path(tmp_path, "s1").parent
    if derived.exists():
        import shutil

        shutil.rmtree(derived)
    derived.symlink_to(outside, target_is_directory=True)
    with pytest.raises(StoreIOError) as info:
        load_progress(tmp_path, "s1")
    assert str(derived) in str(info.value) and "symlink" in str(info.value)
    assert session_dir.exists()
