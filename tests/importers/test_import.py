"""Importing agent logs: incremental and idempotent imports, the prefix property, bad input,
rewritten sources, the report and the command line. Format-specific mappings are tested in
test_import_codex.py and test_import_claude.py, on the fixtures in tests/fixtures/import."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner

import memstore
from memstore.cli import cli
from memstore.importers.run import PARSERS
from memstore.importers.sources import SourceFile, open_source, sniff
from memstore.layout import IMPORT_STATE_FILE as STATE_FILE

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "import"
CODEX_LEGACY = next((FIXTURES / "codex" / "legacy").glob("*.jsonl"))
CODEX_040 = next((FIXTURES / "codex" / "0.40").glob("*.jsonl"))
CODEX_0104 = next((FIXTURES / "codex" / "0.104").glob("*.jsonl"))
CODEX_EXEC = FIXTURES / "codex" / "exec" / "run-42.jsonl"
CLAUDE_20 = next((FIXTURES / "claude" / "projects" / "-home-dev-web").glob("*.jsonl"))
CLAUDE_21 = next((FIXTURES / "claude" / "projects" / "-home-dev-app").glob("*.jsonl"))
CLAUDE_SUB = next((FIXTURES / "claude" / "projects" / "-home-dev-app").glob("*/subagents/agent-*.jsonl"))
SOURCES = [CODEX_LEGACY, CODEX_040, CODEX_0104, CODEX_EXEC, CLAUDE_20, CLAUDE_21, CLAUDE_SUB]
OLD = time.time() - 10 * 86400  # an mtime long past the settle period


def records(root, session_id: str) -> list[tuple[dict, str]]:
    """The (event, ts) pairs of a session, in log order."""
    with memstore.open_session(root, session_id, max_events=0) as log:
        return [(r.event, r.ts) for r in log.iter_records()]


def events(root, session_id: str) -> list[dict]:
    return [event for event, _ in records(root, session_id)]


def all_records(root) -> dict[str, list]:
    return {s.session_id: records(root, s.session_id) for s in memstore.list_sessions(root)}


def session_id_of(path: Path) -> str:
    source = SourceFile(str(path), True)
    fd = open_source(source)
    try:
        return sniff(fd, os.fstat(fd).st_size, source).session_id
    finally:
        os.close(fd)


def items(evs: list[dict]) -> list[dict]:
    return [e["item"] for e in evs if e["type"] == "item.completed"]


def turns_of(evs: list[dict]) -> list[list[dict]]:
    """The events of each turn, turn.started to its end marker included."""
    turns, current = [], None
    for event in evs:
        if event["type"] == "turn.started":
            assert current is None, "a turn started before the previous one ended"
            current = [event]
        elif current is not None:
            current.append(event)
            if event["type"] in ("turn.completed", "turn.failed", "turn.aborted"):
                turns.append(current)
                current = None
    if current is not None:
        turns.append(current)
    return turns


def usage_sum(evs: list[dict]) -> dict:
    total = dict.fromkeys(("input_tokens", "cached_input_tokens", "cache_creation_tokens", "output_tokens"), 0)
    for event in evs:
        if event["type"] in ("turn.completed", "turn.failed", "turn.aborted"):
            for key in total:
                total[key] += event["usage"][key]
    return total


def copy_source(source: Path, directory: Path, data: bytes | None = None, mtime: float | None = None) -> Path:
    """``source`` copied under ``directory`` with the same relative layout (sub-agents keep
    their <session>/subagents/ parent), optionally with other bytes and mtime."""
    target = directory / source.relative_to(FIXTURES)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(source.read_bytes() if data is None else data)
    if mtime is not None:
        os.utime(target, (mtime, mtime))
    return target


# ---------------------------------------------------------------------------------------------
# The prefix property, on the parsers themselves


def _parse(cls, session_id, path, lines, state=None, start=0, settle=False):
    parser = cls(session_id, path, context={"default_ts": "2026-01-01T00:00:00.000Z"}, state=state)
    out = []
    for number, line in enumerate(lines[start:], start=start + 1):
        parser.feed(line, number)
        out.extend(parser.out)
        parser.out.clear()
    if settle:
        parser.finalize()
        out.extend(parser.out)
        parser.out.clear()
    return out, parser


@pytest.mark.parametrize(
    "source", SOURCES, ids=lambda p: p.parent.name if p.parent.name != "-home-dev-app" else p.name[:8]
)
def test_events_of_every_prefix_are_a_prefix_and_a_saved_state_resumes_exactly(source):
    fd = open_source(SourceFile(str(source), True))
    try:
        found = sniff(fd, os.fstat(fd).st_size, SourceFile(str(source), True))
    finally:
        os.close(fd)
    cls = PARSERS[found.kind]
    lines = source.read_bytes().split(b"\n")[:-1]
    whole, _ = _parse(cls, found.session_id, str(source), lines)
    settled, _ = _parse(cls, found.session_id, str(source), lines, settle=True)
    assert settled[: len(whole)] == whole
    for cut in range(len(lines) + 1):
        head, parser = _parse(cls, found.session_id, str(source), lines[:cut])
        assert whole[: len(head)] == head, f"events of the first {cut} lines are not a prefix"
        # The carry-over goes through JSON, as it does on disk.
        state = orjson.loads(orjson.dumps(parser.s))
        tail, _ = _parse(cls, found.session_id, str(source), lines, state=state, start=cut)
        assert head + tail == whole, f"resuming after line {cut} differs from one pass"
        tail, _ = _parse(
            cls,
            found.session_id,
            str(source),
            lines,
            state=orjson.loads(orjson.dumps(parser.s)),
            start=cut,
            settle=True,
        )
        assert head + tail == settled


# ---------------------------------------------------------------------------------------------
# Incremental and idempotent imports


@pytest.mark.parametrize("settled", [False, True], ids=["active", "settled"])
@pytest.mark.parametrize(
    "source", SOURCES, ids=lambda p: p.parent.name if p.parent.name != "-home-dev-app" else p.name[:8]
)
def test_half_a_source_with_a_torn_line_then_the_whole_equals_one_import(tmp_path, source, settled):
    data = source.read_bytes()
    half = len(data) // 2
    assert data[half - 1 : half] != b"\n"  # the cut tears a line
    mtime = OLD if settled else None
    growing = copy_source(source, tmp_path / "a", data[:half], mtime)
    first = memstore.import_logs(tmp_path / "store-a", growing)
    assert first.sessions_created == 1 and first.lines_skipped == 0
    sid = session_id_of(growing)
    state = json.loads((memstore.session_directory(tmp_path / "store-a", sid) / "derived" / STATE_FILE).read_text())
    assert state["offset"] == data.rindex(b"\n", 0, half) + 1  # the torn line is left for later

    before = records(tmp_path / "store-a", sid)
    copy_source(source, tmp_path / "a", data, mtime)
    second = memstore.import_logs(tmp_path / "store-a", growing)
    assert second.events_appended > 0
    assert (second.sessions_updated, second.sessions_regenerated, second.set_aside) == (1, 0, [])

    whole = copy_source(source, tmp_path / "b", data, mtime)
    memstore.import_logs(tmp_path / "store-b", whole)
    got, want = records(tmp_path / "store-a", sid), records(tmp_path / "store-b", sid)
    if source == CODEX_EXEC:  # the stream has no times: its events carry the file's mtime
        got, want, before = [e for e, _ in got], [e for e, _ in want], [e for e, _ in before]
    if not settled:
        assert _normalize(got, tmp_path) == _normalize(want, tmp_path)
    else:
        # Finalized when it settled, then grown (a resumed session): the session is reopened
        # after its thread.completed, nothing it held is lost, and no token is counted twice.
        assert got[: len(before)] == before
        assert events(tmp_path / "store-a", sid)[-1]["type"] == "thread.completed"
        turns_of(events(tmp_path / "store-a", sid))  # well formed
        assert usage_sum(events(tmp_path / "store-a", sid)) == usage_sum(events(tmp_path / "store-b", sid))


def _normalize(rows, tmp_path):
    """The two stores import copies under a/ and b/: compare with the source path unified."""
    text = orjson.dumps(rows).decode()
    return text.replace(str(tmp_path / "a"), "<src>").replace(str(tmp_path / "b"), "<src>")


def test_importing_twice_imports_nothing_twice(tmp_path):
    first = memstore.import_logs(tmp_path, FIXTURES)
    assert first.sessions_created == 9 and first.events_appended > 0
    logs = {p: p.read_bytes() for p in (tmp_path / "sessions").glob("*/events.jsonl")}
    again = memstore.import_logs(tmp_path, FIXTURES)
    assert (again.sessions_created, again.sessions_updated, again.events_appended, again.lines_skipped) == (0, 0, 0, 0)
    assert again.sessions_unchanged == 9
    assert {p: p.read_bytes() for p in (tmp_path / "sessions").glob("*/events.jsonl")} == logs
    # Without the cache, the sources are parsed again, checked against the logs, and add nothing.
    for state in (tmp_path / "sessions").glob(f"*/derived/{STATE_FILE}"):
        state.unlink()
    third = memstore.import_logs(tmp_path, FIXTURES)
    assert (third.sessions_created, third.events_appended, third.sessions_unchanged) == (0, 0, 9)
    assert {p: p.read_bytes() for p in (tmp_path / "sessions").glob("*/events.jsonl")} == logs


def test_without_the_cache_a_grown_source_appends_only_its_new_events(tmp_path):
    data = CODEX_0104.read_bytes()
    cut = data.index(b"\n", len(data) // 3) + 1
    source = copy_source(CODEX_0104, tmp_path / "src", data[:cut])
    memstore.import_logs(tmp_path / "store", source)
    sid = session_id_of(source)
    (memstore.session_directory(tmp_path / "store", sid) / "derived" / STATE_FILE).unlink()
    before = len(records(tmp_path / "store", sid))
    copy_source(CODEX_0104, tmp_path / "src", data)
    report = memstore.import_logs(tmp_path / "store", source)
    assert report.sessions_updated == 1 and report.sessions_regenerated == 0
    memstore.import_logs(tmp_path / "fresh", source)
    assert records(tmp_path / "store", sid) == records(tmp_path / "fresh", sid)
    assert report.events_appended == len(records(tmp_path / "fresh", sid)) - before


def test_an_unchanged_source_becomes_finalized_once_it_settles(tmp_path):
    source = copy_source(CODEX_040, tmp_path / "src")
    sid = session_id_of(source)
    memstore.import_logs(tmp_path / "store", source)
    evs = events(tmp_path / "store", sid)
    assert [t[-1]["type"] for t in turns_of(evs)] == ["turn.completed", "turn.aborted", "item.completed"]
    assert memstore.list_sessions(tmp_path / "store")[0].status == "active"
    os.utime(source, (OLD, OLD))
    report = memstore.import_logs(tmp_path / "store", source)
    assert (report.sessions_updated, report.events_appended) == (1, 2)  # the last turn's end, thread.completed
    evs = events(tmp_path / "store", sid)
    assert [e["type"] for e in evs[-2:]] == ["turn.completed", "thread.completed"]
    assert memstore.list_sessions(tmp_path / "store")[0].status == "completed"
    again = memstore.import_logs(tmp_path / "store", source)
    assert (again.sessions_unchanged, again.events_appended) == (1, 0)


def test_a_settled_source_that_grows_again_reopens_its_session(tmp_path):
    """A resumed session is a grown source: its session goes on after its thread.completed
    (nothing is set aside or re-imported), and completes again once the source settles."""
    data = CODEX_040.read_bytes()
    cut = data.index(b'"user_message","message":"never mind')
    cut = data.rindex(b"\n", 0, cut) + 1  # up to the third prompt
    source = copy_source(CODEX_040, tmp_path / "src", data[:cut], OLD)
    sid = session_id_of(source)
    memstore.import_logs(tmp_path / "store", source)
    before = records(tmp_path / "store", sid)
    assert before[-1][0]["type"] == "thread.completed"
    copy_source(CODEX_040, tmp_path / "src", data, OLD)  # the session was resumed
    report = memstore.import_logs(tmp_path / "store", source)
    assert (report.sessions_regenerated, report.sessions_created, report.sessions_updated, report.set_aside) == (
        0,
        0,
        1,
        [],
    )
    after = records(tmp_path / "store", sid)
    assert after[: len(before)] == before
    assert [e["type"] for e, _ in after].count("thread.completed") == 2
    assert memstore.list_sessions(tmp_path / "store")[0].status == "completed"
    memstore.import_logs(tmp_path / "fresh", source)
    assert usage_sum([e for e, _ in after]) == usage_sum(events(tmp_path / "fresh", sid))


@pytest.mark.parametrize("change", ["rewritten", "truncated"])
def test_a_rewritten_or_truncated_source_is_reimported_into_a_new_generation(tmp_path, change):
    data = CLAUDE_20.read_bytes()
    source = copy_source(CLAUDE_20, tmp_path / "src")
    sid = session_id_of(source)
    memstore.import_logs(tmp_path / "store", source)
    if change == "rewritten":
        new = data.replace(b"Show the user's initials in NavUser", b"Show the full name in NavUser")
        assert len(new) != len(data)
    else:
        new = data[: data.index(b'"now run the full suite"')]
        new = new[: new.rindex(b"\n") + 1]
    before = records(tmp_path / "store", sid)
    copy_source(CLAUDE_20, tmp_path / "src", new)
    report = memstore.import_logs(tmp_path / "store", source)
    assert report.sessions_regenerated == 1
    memstore.import_logs(tmp_path / "fresh", source)
    assert records(tmp_path / "store", sid) == records(tmp_path / "fresh", sid)
    # The old session is set aside, whole, beside the new import.
    [entry] = report.set_aside
    assert entry.session_id == sid and entry.set_aside_as.startswith(f"{sid}.superseded-")
    assert records(tmp_path / "store", entry.set_aside_as) == before


def test_a_note_appended_by_hand_is_kept_even_without_the_import_cache(tmp_path):
    source = copy_source(CODEX_EXEC, tmp_path / "src")
    sid = session_id_of(source)
    memstore.import_logs(tmp_path / "store", source)
    # Someone appended to the session by hand, and the import cache is gone.
    with memstore.open_session(tmp_path / "store", sid) as log:
        log.append({"type": "note", "text": "by hand"})
    (memstore.session_directory(tmp_path / "store", sid) / "derived" / STATE_FILE).unlink()
    before = records(tmp_path / "store", sid)
    report = memstore.import_logs(tmp_path / "store", source)
    assert (report.sessions_regenerated, report.set_aside, report.foreign_events_kept) == (0, [], 1)
    assert records(tmp_path / "store", sid) == before
    assert events(tmp_path / "store", sid)[-1] == {"type": "note", "text": "by hand"}


def test_a_session_that_no_longer_matches_its_source_is_set_aside_not_lost(tmp_path):
    source = copy_source(CODEX_EXEC, tmp_path / "src")
    sid = session_id_of(source)
    memstore.import_logs(tmp_path / "store", source)
    (memstore.session_directory(tmp_path / "store", sid) / "derived" / STATE_FILE).unlink()
    before = records(tmp_path / "store", sid)
    data = CODEX_EXEC.read_bytes()
    copy_source(CODEX_EXEC, tmp_path / "src", data.replace(b"One file: README.md.", b"Two files."))
    report = memstore.import_logs(tmp_path / "store", source)
    assert report.sessions_regenerated == 1
    [entry] = report.set_aside
    assert "no longer match" in entry.reason
    assert records(tmp_path / "store", entry.set_aside_as) == before


def test_two_sources_naming_one_session_are_not_merged(tmp_path):
    first = copy_source(CODEX_EXEC, tmp_path / "one")
    second = copy_source(CODEX_EXEC, tmp_path / "two")
    memstore.import_logs(tmp_path / "store", first)
    sid = session_id_of(first)
    before = records(tmp_path / "store", sid)
    report = memstore.import_logs(tmp_path / "store", second)
    assert report.events_appended == 0
    assert [p.reason for p in report.problems if p.path == str(second)] == [
        f"session {sid!r} is already imported from {first}; this source names the same session and was not merged into it"
    ]
    assert records(tmp_path / "store", sid) == before


def test_a_session_written_by_an_agent_is_left_alone(tmp_path):
    source = copy_source(CODEX_EXEC, tmp_path / "src")
    sid = session_id_of(source)
    with memstore.open_session(tmp_path / "store", sid) as log:
        log.append({"type": "thread.started", "thread_id": sid})
    report = memstore.import_logs(tmp_path / "store", source)
    assert report.events_appended == 0
    assert "was not imported from an agent log" in report.problems[0].reason
    assert len(records(tmp_path / "store", sid)) == 1


def test_a_session_open_in_another_process_is_skipped_and_reported(tmp_path):
    source = copy_source(CODEX_EXEC, tmp_path / "src")
    sid = session_id_of(source)
    memstore.import_logs(tmp_path / "store", source)
    copy_source(CODEX_EXEC, tmp_path / "src", CODEX_EXEC.read_bytes() + b'{"type":"turn.started"}\n')
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            (
                "import sys, memstore; log = memstore.open_session(sys.argv[1], sys.argv[2]); "
                "print('ready', flush=True); sys.stdin.read()"
            ),
            str(tmp_path / "store"),
            sid,
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    try:
        assert holder.stdout.readline().strip() == "ready"
        report = memstore.import_logs(tmp_path / "store", source)
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
    assert report.events_appended == 0
    assert "open in another process" in report.problems[0].reason
    assert memstore.import_logs(tmp_path / "store", source).events_appended == 1


# ---------------------------------------------------------------------------------------------
# Bad input, what is read, what is written


def test_garbage_and_empty_files_create_no_session(tmp_path):
    report = memstore.import_logs(tmp_path, FIXTURES / "garbage")
    assert (report.sessions_created, report.events_appended) == (0, 0)
    assert not (tmp_path / "sessions").exists() or not any((tmp_path / "sessions").iterdir())
    assert sorted((Path(p.path).name, p.line) for p in report.problems) == [
        ("binary.jsonl", None),
        ("noise.jsonl", None),
    ]
    assert all("not a Codex or Claude Code log" in p.reason for p in report.problems)


def test_a_file_with_only_a_partial_first_line_waits(tmp_path):
    source = copy_source(CODEX_0104, tmp_path / "src", CODEX_0104.read_bytes()[:200])
    report = memstore.import_logs(tmp_path / "store", source)
    assert (report.sessions_created, report.problems) == (0, [])
    os.utime(source, (OLD, OLD))  # still no newline, long after: that is garbage
    report = memstore.import_logs(tmp_path / "store", source)
    assert report.sessions_created == 0 and "not a Codex or Claude Code log" in report.problems[0].reason


def test_bad_lines_are_counted_and_skipped(tmp_path):
    data = CLAUDE_21.read_bytes()
    lines = data.split(b"\n")
    lines.insert(5, b"\x00\xff binary junk")
    lines.insert(7, b'["an", "array"]')
    source = copy_source(CLAUDE_21, tmp_path / "src", b"\n".join(lines))
    report = memstore.import_logs(tmp_path / "store", source)
    assert report.sessions_created == 1
    # The two above, the unknown line type and the trailing non-JSON line: none understood, all kept.
    assert (report.lines_skipped, report.lines_kept_unrecognized) == (0, 4)
    reasons = {(p.line, p.reason) for p in report.problems}
    assert (6, "unparsable line (not JSON); kept as import.unrecognized") not in reasons  # several alike: once, counted
    assert any(r.startswith("unparsable line (not JSON); kept as import.unrecognized (2 lines)") for _, r in reasons)
    assert (8, "line is not a JSON object; kept as import.unrecognized") in reasons
    kept = [e for e in events(tmp_path / "store", session_id_of(source)) if e["type"] == "import.unrecognized"]
    assert [(e["line"], e["record_type"]) for e in kept] == [
        (6, "(not JSON)"),
        (8, "(not a JSON object)"),
        (28, "future-record"),
        (32, "(not JSON)"),
    ]
    assert "raw_base64" in kept[0] and kept[1]["raw"] == '["an", "array"]'
    assert base64.b64decode(kept[0]["raw_base64"]) == b"\x00\xff binary junk"


def test_unknown_fields_are_reported_once_per_import(tmp_path):
    copy_source(CLAUDE_21, tmp_path / "x")
    # A second transcript (another session, so another file name) with the same new field.
    other = tmp_path / "y" / CLAUDE_21.name.replace("7a1c0b2e-6666", "7a1c0b2e-7777")
    other.parent.mkdir()
    other.write_bytes(CLAUDE_21.read_bytes().replace(b"7a1c0b2e-6666", b"7a1c0b2e-7777"))
    report = memstore.import_logs(tmp_path / "store", [tmp_path / "x", tmp_path / "y"])
    unknown = [p for p in report.problems if "newField" in p.reason]
    assert len(unknown) == 1 and unknown[0].reason.endswith("(2 lines)")


def test_only_what_was_named_is_read_and_symlinks_are_not_followed(tmp_path):
    outside = copy_source(CODEX_EXEC, tmp_path / "outside")
    named = tmp_path / "named"
    copy_source(CODEX_040, named)
    (named / "link.jsonl").symlink_to(outside)
    (named / "linkdir").symlink_to(outside.parent, target_is_directory=True)
    report = memstore.import_logs(tmp_path / "store", named)
    assert [s.session_id for s in memstore.list_sessions(tmp_path / "store")] == [session_id_of(CODEX_040)]
    assert sorted(Path(p.path).name for p in report.problems) == ["link.jsonl", "linkdir"]
    assert all("symlink not followed" in p.reason for p in report.problems)
    # A symlink the user names is what they named.
    report = memstore.import_logs(tmp_path / "store", named / "link.jsonl")
    assert report.sessions_created == 1


def test_the_store_itself_is_never_imported(tmp_path):
    copy_source(CODEX_EXEC, tmp_path)
    first = memstore.import_logs(tmp_path / "store", tmp_path)  # the store lies inside the named tree
    again = memstore.import_logs(tmp_path / "store", tmp_path)
    assert (first.sources, first.sessions_created, again.sources, again.sessions_unchanged) == (1, 1, 1, 1)
    assert first.problems == again.problems == []


def test_naming_the_store_itself_imports_nothing(tmp_path):
    memstore.import_logs(tmp_path, CODEX_EXEC)
    report = memstore.import_logs(tmp_path, tmp_path / "sessions")
    assert report.sources == 0 and report.events_appended == 0
    assert [p.reason for p in report.problems] == ["is inside the memstore store being imported into; not imported"]


def test_a_json_log_that_only_looks_like_a_legacy_header_is_not_a_rollout(tmp_path):
    other = tmp_path / "metrics.jsonl"
    other.write_text('{"id": "a1", "timestamp": "2026-01-01T00:00:00Z", "value": 3}\n')
    report = memstore.import_logs(tmp_path / "store", other)
    assert report.sessions_created == 0 and "not a Codex or Claude Code log" in report.problems[0].reason


def test_sources_are_only_read(tmp_path):
    def snapshot():
        return {
            p: (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns, p.stat().st_mode)
            for p in FIXTURES.rglob("*")
            if p.is_file()
        }

    before = snapshot()
    memstore.import_logs(tmp_path, FIXTURES, settle_seconds=0)
    assert snapshot() == before
    assert sorted(p.name for p in FIXTURES.rglob("*") if p.is_file() and p.suffix not in (".jsonl", ".py")) == []


def test_choosing_a_source_kind(tmp_path):
    report = memstore.import_logs(tmp_path, FIXTURES, "claude")
    assert sorted(s.session_id.split("-")[0] for s in memstore.list_sessions(tmp_path)) == ["claude"] * 3
    assert report.problems == [p for p in report.problems if "claude" in p.path or "unknown" in p.reason]
    report = memstore.import_logs(tmp_path / "other", CODEX_EXEC, "codex")
    assert report.sessions_created == 0 and report.problems[0].reason == "is a codex-exec log, not codex"
    with pytest.raises(ValueError):
        memstore.import_logs(tmp_path, FIXTURES, "gemini")


def test_imported_sessions_are_well_formed_sessions(tmp_path):
    memstore.import_logs(tmp_path, FIXTURES, settle_seconds=0)
    for summary in memstore.list_sessions(tmp_path):
        with memstore.open_session(tmp_path, summary.session_id, max_events=0) as log:
            live = [(t.number, t.status, t.event_count, t.input_tokens, t.output_tokens) for t in log.turns()]
            evs = list(log.iter_events())
        # The index rebuilt from the log alone agrees with what the imports indexed.
        memstore.rebuild(tmp_path, summary.session_id)
        with memstore.open_session(tmp_path, summary.session_id, max_events=0) as log:
            assert [(t.number, t.status, t.event_count, t.input_tokens, t.output_tokens) for t in log.turns()] == live
        assert summary.status == "completed" and all(t[1] != "interrupted" for t in live)
        assert evs[0]["type"] == "thread.started" and evs[0]["source"]["path"].startswith(str(FIXTURES))
        ids = [i["id"] for i in items(evs)]
        assert len(ids) == len(set(ids)), "item ids repeat"


def test_progress_is_reported_in_bytes_up_to_the_total(tmp_path):
    calls = []
    memstore.import_logs(tmp_path, FIXTURES, progress=lambda done, total: calls.append((done, total)))
    total = sum(p.stat().st_size for p in FIXTURES.rglob("*.jsonl"))
    assert calls[-1] == (total, total)
    assert [d for d, _ in calls] == sorted(d for d, _ in calls)


# ---------------------------------------------------------------------------------------------
# The command line


def test_cli_imports_paths_and_reports(tmp_path):
    runner = CliRunner()
    result = runner.invoke(cli, ["import", str(FIXTURES / "codex"), str(CLAUDE_20), "--root", str(tmp_path), "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["sessions_created"] == 7 and report["lines_skipped"] == 0 and report["lines_kept_unrecognized"] == 4
    assert {"path", "line", "reason"} == set(report["problems"][0])
    result = runner.invoke(cli, ["import", str(FIXTURES / "codex"), "--root", str(tmp_path)])
    assert result.exit_code == 0
    assert "0 sessions created, 0 updated, 0 regenerated, 6 unchanged" in result.stdout
    assert result.stderr == ""  # unchanged sources are not parsed again: their problems, their drift are not repeated
    result = runner.invoke(cli, ["import", str(CODEX_0104), "--root", str(tmp_path / "other")])
    assert result.exit_code == 0 and "1 session created" in result.stdout
    assert f"{CODEX_0104}:46: unknown event_msg type future_event_kind; kept as import.unrecognized" in result.stderr


def test_cli_without_paths_imports_the_agents_default_directories(tmp_path, monkeypatch):
    home = tmp_path / "home"
    copy_source(CODEX_0104, home / ".codex" / "sessions")
    copy_source(CLAUDE_20, home / ".claude")  # lands under .claude/claude/projects: not the default place
    (home / ".claude" / "projects").mkdir(parents=True)
    shutil.copy(CLAUDE_20, home / ".claude" / "projects" / CLAUDE_20.name)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("CODEX_HOME", raising=False)
    monkeypatch.delenv("CLAUDE_CONFIG_DIR", raising=False)
    result = CliRunner().invoke(cli, ["import", "--root", str(tmp_path / "store"), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["sessions_created"] == 2
    monkeypatch.setenv("HOME", str(tmp_path / "nobody"))
    result = CliRunner().invoke(cli, ["import", "--root", str(tmp_path / "store")])
    assert result.exit_code == 0 and "nothing to import" in result.stderr


def test_cli_rejects_a_missing_path_and_shows_a_progress_bar_on_long_imports(tmp_path, monkeypatch):
    """A missing path is a usage error; an import that runs past the delay shows sessions, MB,
    rate and time left on stderr, a quick one shows nothing."""
    result = CliRunner().invoke(cli, ["import", str(tmp_path / "missing"), "--root", str(tmp_path)])
    assert result.exit_code == 2
    import memstore.cli as cli_module
    import memstore.importers as importers

    def fake_import(root, paths, source, progress):
        progress.status(importers.ImportProgress(0, 40, 0, 64 << 20, 0.0, 0.0, None))
        progress(64 << 20, 64 << 20)
        progress.status(importers.ImportProgress(40, 40, 64 << 20, 64 << 20, 2.0, 32e6, 0.0))
        return importers.ImportReport()

    monkeypatch.setattr(importers, "import_logs", fake_import)
    result = CliRunner().invoke(cli, ["import", str(FIXTURES), "--root", str(tmp_path)])
    assert result.exit_code == 0 and "importing" not in result.stderr  # done within the delay
    monkeypatch.setattr(cli_module, "PROGRESS_DELAY", 0.0)
    result = CliRunner().invoke(cli, ["import", str(FIXTURES), "--root", str(tmp_path)])
    assert result.exit_code == 0
    assert "importing  0/40 sessions  0.0/67.1 MB  0.0 MB/s  ETA --" in result.stderr
    assert "importing  40/40 sessions  67.1/67.1 MB  32.0 MB/s  ETA 0:00" in result.stderr


def test_the_content_of_imported_edits_is_searchable(tmp_path):
    """What an agent changed is what people search for: a Codex patch's lines and a Claude Code
    edit's new text are in the file change's chunk, not only the paths."""
    memstore.import_logs(tmp_path, CODEX_0104)
    memstore.import_logs(tmp_path, CLAUDE_20)
    patch_hits = memstore.search_memory(tmp_path, "util pub fn", 20)
    assert any(h.session_id.startswith("codex-") and "pub fn x()" in h.snippet for h in patch_hits)
    edit_hits = memstore.search_memory(tmp_path, "initials", 20)
    assert any(h.session_id.startswith("claude-") and "initials" in h.snippet for h in edit_hits)


def test_the_report_names_the_sessions_that_received_events(tmp_path):
    first = memstore.import_logs(tmp_path, [CODEX_0104, CLAUDE_20])
    assert sorted(first.sessions) == sorted(p.name for p in (tmp_path / "sessions").iterdir())
    assert len(first.sessions) == 2 and first.to_dict()["sessions"] == first.sessions
    assert memstore.import_logs(tmp_path, [CODEX_0104, CLAUDE_20]).sessions == []  # nothing new
    result = CliRunner().invoke(cli, ["import", str(CODEX_0104), "--root", str(tmp_path / "other")])
    assert result.exit_code == 0 and "sessions: codex-" in result.output


def test_import_json_with_nothing_to_import_prints_an_empty_report(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("CODEX_HOME", raising=False)
    monkeypatch.delenv("CLAUDE_CONFIG_DIR", raising=False)
    result = CliRunner().invoke(cli, ["import", "--root", str(tmp_path / "store"), "--json"])
    assert result.exit_code == 0
    assert json.loads(result.stdout) == memstore.ImportReport().to_dict()
