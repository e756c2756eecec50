"""A source rewritten in place while an import reads it is never spliced for good.

The import's fingerprint describes the bytes it parsed (taken from the very reads the parser
was fed), and the bytes it consumed are read again once it is done: a source that changed
meanwhile is reported, and the next import sets the spliced session aside and imports the
source afresh. The rewrite happens for real, on the file, between two of the import's reads
(the read seam is where it is triggered, so the moment is exact).
"""

from __future__ import annotations

import hashlib
import os

import pytest
from generate import CODEX_SID, codex_rollout

import memstore
from memstore.importers import run
from memstore.importers.sources import fingerprint


def records(root, sid):
    with memstore.read_session(root, sid) as reader:
        return [(r.ts, r.event) for r in reader.iter_records()]


def rewrite_after(monkeypatch, path, new_bytes: bytes, after_offset: int) -> list:
    """Make the import's reads rewrite ``path`` in place (same inode, same size) once a read
    has gone past ``after_offset``; return the list the rewrite is recorded in."""
    real = run.read_at
    done: list = []

    def read_then_rewrite(fd, size, offset):
        data = real(fd, size, offset)
        if not done and offset + len(data) > after_offset:
            with open(path, "r+b") as fh:  # in place: what an editor or an agent rewriting its log does
                fh.write(new_bytes)
                fh.truncate()
            done.append(offset + len(data))
        return data

    monkeypatch.setattr(run, "read_at", read_then_rewrite)
    monkeypatch.setattr(run, "CHUNK", 16 * 1024)  # several reads for a source of a few hundred KB
    return done


@pytest.mark.parametrize("where", ["head", "middle"])
def test_a_source_rewritten_between_two_reads_is_set_aside_and_imported_afresh_next_time(tmp_path, monkeypatch, where):
    original, _ = codex_rollout(60, seed=3)
    assert len(original) > 200_000
    # The rewrite changes one line, in the first 64 KiB (which the fingerprint samples) or far
    # past them (which only the consumed bytes' own hash covers), keeping the size.
    marker = original.index(b'"task 1:' if where == "head" else b'"task 40:')
    assert (marker < 64 * 1024) == (where == "head")
    rewritten = original[:marker] + b'"TASK' + original[marker + 5 :]
    assert len(rewritten) == len(original) and rewritten != original
    source = tmp_path / "src" / "rollout-2026-02-12T09-00-00-019c7777-5555-7000-8000-00000000e777.jsonl"
    source.parent.mkdir()
    source.write_bytes(original)

    done = rewrite_after(monkeypatch, source, rewritten, after_offset=marker + 20_000)
    first = memstore.import_logs(tmp_path / "store", source)
    assert done, "the seam never rewrote the file"
    assert any("changed while it was being imported" in p.reason for p in first.problems)
    spliced = records(tmp_path / "store", CODEX_SID)
    monkeypatch.undo()

    second = memstore.import_logs(tmp_path / "store", source)
    [entry] = second.set_aside
    assert entry.session_id == CODEX_SID and "changed while it was being imported" in entry.reason
    assert records(tmp_path / "store", entry.set_aside_as) == spliced  # kept, whole
    memstore.import_logs(tmp_path / "fresh", source)
    assert records(tmp_path / "store", CODEX_SID) == records(tmp_path / "fresh", CODEX_SID)
    third = memstore.import_logs(tmp_path / "store", source)
    assert (third.sessions_unchanged, third.events_appended, third.set_aside) == (1, 0, [])


def test_the_saved_fingerprint_is_of_the_bytes_parsed_not_of_the_file_after(tmp_path, monkeypatch):
    """The cache's fingerprint is the one of what was parsed: after a rewrite during the
    import it differs from the file's current one."""
    original, _ = codex_rollout(30, seed=5)
    marker = original.index(b'"task 2:')
    rewritten = original[:marker] + b'"TASK' + original[marker + 5 :]
    source = tmp_path / "src" / "rollout-2026-02-12T09-00-00-019c7777-5555-7000-8000-00000000e777.jsonl"
    source.parent.mkdir()
    source.write_bytes(original)
    rewrite_after(monkeypatch, source, rewritten, after_offset=marker + 20_000)
    memstore.import_logs(tmp_path / "store", source)
    state = run.load_state(memstore.session_directory(tmp_path / "store", CODEX_SID))
    fd = os.open(source, os.O_RDONLY)
    try:
        now = fingerprint(fd, state["offset"])
    finally:
        os.close(fd)
    assert state["head_sha256"] == hashlib.sha256(original[: 64 * 1024]).hexdigest()
    assert now[1] != state["head_sha256"]
