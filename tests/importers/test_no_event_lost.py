"""No import removes an event a session holds.

The invariant, checked over every combination of what can happen between two imports (the
source unchanged, grown, grown after it settled, rewritten or truncated; the session extended
by an agent's own turn or not; the import cache kept or lost): every record the session held
before the second import (its seq, time and event) is still in the store afterwards, in the
session itself or in the session it was set aside as; the agent's note is still found by search;
nothing went to the trash or the gc-log. Where the source grew, the session is extended in place;
where it was rewritten or truncated (with its cache), the old session is set aside and the new
import equals a fresh import of the new source.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from pathlib import Path

import pytest

import memstore
from memstore.layout import IMPORT_STATE_FILE

FIXTURES = Path(__file__).parent.parent / "fixtures" / "import"
CODEX_0104 = next((FIXTURES / "codex" / "0.104").glob("*.jsonl"))
SID = "codex-019c5000-3333-7000-8000-00000000c003"
OLD = 1_700_000_000.0  # an mtime long past the settle period
REPO = Path(__file__).parent.parent.parent

AGENT = """
import sys, memstore
root, sid, word = sys.argv[1:4]
with memstore.open_session(root, sid) as log:
    log.append({"type": "turn.started"})
    log.append({"type": "item.completed", "item": {"id": "note-1", "type": "agent_message",
                "text": f"note to self: the flaky test comes from the shared tmp dir {word}"}})
    log.append({"type": "turn.completed", "usage": {"input_tokens": 10, "cached_input_tokens": 0,
                "cache_creation_tokens": 0, "output_tokens": 5}})
print("acknowledged", flush=True)
"""


def agent_appends_a_turn(root: Path, sid: str, word: str) -> None:
    """An agent, in its own process, appends a turn to the imported session; the events are
    acknowledged once the handle is closed (the turn end is synced)."""
    out = subprocess.run(
        [sys.executable, "-c", AGENT, str(root), sid, word], capture_output=True, text=True, cwd=REPO, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "acknowledged"


def records(root: Path, sid: str) -> list[tuple]:
    with memstore.read_session(root, sid) as reader:
        return [(r.seq, r.ts, r.event) for r in reader.iter_records()]


def sessions(root: Path) -> list[str]:
    return sorted(s.session_id for s in memstore.list_sessions(root))


def lines_of(data: bytes) -> list[bytes]:
    return data.split(b"\n")[:-1]


def source_versions() -> dict[str, bytes]:
    data = CODEX_0104.read_bytes()
    lines = lines_of(data)
    first = b"".join(line + b"\n" for line in lines[:34])  # the third task is still being written
    return {
        "first": first,
        "grown": data,
        "rewritten": first.replace(b"run the tests and fix what fails", b"run the linters, then the tests"),
        "truncated": b"".join(line + b"\n" for line in lines[:20]),
    }


CHANGES = ["unchanged", "grown", "grown_after_settling", "rewritten", "truncated"]


@pytest.mark.parametrize(
    "change,extended,cache",
    [
        (change, extended, cache)
        for change, extended, cache in itertools.product(CHANGES, [False, True], ["kept", "lost"])
    ],
)
def test_no_import_removes_an_event_the_session_held(tmp_path, change, extended, cache):
    versions = source_versions()
    root = tmp_path / "store"
    source = tmp_path / "src" / CODEX_0104.name
    source.parent.mkdir()
    source.write_bytes(versions["first"])
    settled = change == "grown_after_settling"
    if settled:
        os.utime(source, (OLD, OLD))
    memstore.import_logs(root, source)
    word = f"zebracorn{change.replace('_', '')}"
    if extended:
        agent_appends_a_turn(root, SID, word)
    if cache == "lost":
        (memstore.session_directory(root, SID) / "derived" / IMPORT_STATE_FILE).unlink()
    before = records(root, SID)

    new = {
        "unchanged": "first",
        "grown": "grown",
        "grown_after_settling": "grown",
        "rewritten": "rewritten",
        "truncated": "truncated",
    }[change]
    source.write_bytes(versions[new])
    if settled:
        os.utime(source, (OLD, OLD))
    report = memstore.import_logs(root, source)

    # The invariant: every record is still there, in the session or in the one it was set aside as.
    holders = [sid for sid in sessions(root) if records(root, sid)[: len(before)] == before]
    assert holders, "the records the session held before the import are gone"
    home = holders[0]
    if home != SID:
        assert records(root, home) == before  # a set-aside session is kept exactly as it was
        assert [(e.session_id, e.set_aside_as) for e in report.set_aside] == [(SID, home)]
    if extended:
        hits = memstore.search_memory(root, word)
        assert [hit.session_id for hit in hits] == [home]
    assert not (root / "gc-log.jsonl").exists()
    assert not (root / ".trash").exists() or not any((root / ".trash").iterdir())

    # What the import did, where the outcome is certain.
    if cache == "kept" or (change in ("unchanged", "grown") and not extended):
        expect_set_aside = change in ("rewritten", "truncated")
        assert bool(report.set_aside) == expect_set_aside, report
        if expect_set_aside:
            fresh = tmp_path / "fresh"
            memstore.import_logs(fresh, source)
            assert [(ts, e) for _, ts, e in records(root, SID)] == [(ts, e) for _, ts, e in records(fresh, SID)]
        elif change != "unchanged":
            assert report.events_appended > 0 and report.sessions_updated == 1
    # The session an import leaves is importable again without change.
    again = memstore.import_logs(root, source)
    assert (again.events_appended, again.set_aside) == (0, [])


def test_an_agents_turn_survives_importing_an_unchanged_source_again(tmp_path):
    """The reported case: import, an agent appends a turn, import again with the source
    unchanged. The session is not regenerated: its events, the agent's included, all stay."""
    root = tmp_path / "store"
    memstore.import_logs(root, CODEX_0104)
    agent_appends_a_turn(root, SID, "zebracornnote")
    before = records(root, SID)
    report = memstore.import_logs(root, CODEX_0104)
    assert (report.sessions_regenerated, report.set_aside, report.events_appended) == (0, [], 0)
    assert records(root, SID) == before
    assert not any("no longer matches" in p.reason for p in report.problems)
    assert [hit.session_id for hit in memstore.search_memory(root, "zebracornnote")] == [SID]


def test_an_agents_turn_is_kept_in_place_while_the_source_grows_around_it(tmp_path):
    """The agent's turn stays where it was appended; the import goes on after it, and what the
    source gained is appended once."""
    versions = source_versions()
    root = tmp_path / "store"
    source = tmp_path / "src" / CODEX_0104.name
    source.parent.mkdir()
    source.write_bytes(versions["first"])
    memstore.import_logs(root, source)
    agent_appends_a_turn(root, SID, "zebracornkept")
    before = records(root, SID)
    source.write_bytes(versions["grown"])
    report = memstore.import_logs(root, source)
    after = records(root, SID)
    assert after[: len(before)] == before
    assert report.foreign_events_kept == 3
    # The events appended after the agent's turn are exactly what a one-pass import adds to the
    # events of the first part.
    fresh_first, fresh_whole = tmp_path / "f1", tmp_path / "f2"
    source.write_bytes(versions["first"])
    memstore.import_logs(fresh_first, source)
    source.write_bytes(versions["grown"])
    memstore.import_logs(fresh_whole, source)
    gained = [(ts, e) for _, ts, e in records(fresh_whole, SID)][len(records(fresh_first, SID)) :]
    assert [(ts, e) for _, ts, e in after[len(before) :]] == gained
