"""Property tests of the event log (hypothesis).

For random event streams, random durability policies and random flush / complete / read /
close+reopen / drop points, the per-session index that append keeps up incrementally must equal
the index ``memstore.rebuild`` produces from ``events.jsonl`` alone, and reading the log must
return exactly the events that were appended. Random torn tails (a crash mid-write) must be cut
back to the last complete line, the cut bytes kept beside the log, and no later event welded onto
a torn line.

An independent model of the lifecycle rules (reference 5.2, [N] semantics) is checked too, so a
bug in the state machine that append and scan share cannot hide behind their agreement.
"""

from __future__ import annotations

import gc
import itertools
import os
import re
import shutil
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Optional

import hypothesis
import orjson
import pytest
import support
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import memstore
from memstore.events import encode_record

# Property tests: hundreds of generated histories each (about 3 minutes in all).
pytestmark = pytest.mark.slow

SESSION_ID = "prop-session"
LIFECYCLE = {"thread.started", "thread.completed", "turn.started", "turn.completed", "turn.failed"}

_scratch_counter = itertools.count()


# --------------------------------------------------------------------------------------------
# Helpers


def fresh_dir(base: Path, name: str) -> Path:
    """A new empty directory under ``base`` (hypothesis reruns a test function many times with
    the same fixtures, so every example needs its own store root)."""
    path = base / f"{name}-{next(_scratch_counter)}"
    path.mkdir(parents=True)
    return path


def session_dir(root: Path) -> Path:
    return memstore.session_directory(root, SESSION_ID)


def split_lines(data: bytes) -> list[bytes]:
    """The lines of a log, each with its ``\\n`` (only ``\\n`` ends a line; a torn last line has none)."""
    lines = data.split(b"\n")
    last = lines.pop()
    return [line + b"\n" for line in lines] + ([last] if last else [])


def log_bytes(root: Path) -> bytes:
    path = session_dir(root) / "events.jsonl"
    return path.read_bytes() if path.exists() else b""


def read_index(root: Path) -> dict:
    return support.read_index(session_dir(root))


def manifest_counters(manifest) -> dict:
    """The counters of a :class:`memstore.Manifest` or of a parsed manifest.json."""
    get = manifest.get if isinstance(manifest, dict) else lambda k: getattr(manifest, k)
    return {k: get(k) for k in support.MANIFEST_COUNTERS}


def rebuild_from_log_alone(root: Path, scratch_base: Path) -> dict:
    """Copy only ``events.jsonl`` (and the torn tails cut from it, which are kept beside it for
    good: their seqs are never given again) into a new store, run ``memstore.rebuild`` there, and
    return its index rows: what the index must be if the log is the only source of truth."""
    scratch = fresh_dir(scratch_base, "rebuild")
    target = session_dir(scratch)
    target.mkdir(parents=True)
    for path in [session_dir(root) / "events.jsonl", *session_dir(root).glob("events.jsonl.torn-*")]:
        shutil.copyfile(path, target / path.name)
    rebuilt_manifest = memstore.rebuild(scratch, SESSION_ID)
    rebuilt = read_index(scratch)
    assert manifest_counters(rebuilt_manifest) == rebuilt["manifest"], (
        "rebuild() returned a manifest unlike its index row"
    )
    shutil.rmtree(scratch)
    return rebuilt


def assert_same_index(incremental: dict, rebuilt: dict, context: str) -> None:
    """Table by table, so a failure says which view diverged."""
    assert incremental["manifest"] == rebuilt["manifest"], (
        f"{context}: manifest row differs from a rebuild\n  incremental: {incremental['manifest']}\n"
        f"  rebuilt:     {rebuilt['manifest']}"
    )
    assert incremental["turns"] == rebuilt["turns"], (
        f"{context}: turns table differs from a rebuild\n  incremental: {incremental['turns']}\n"
        f"  rebuilt:     {rebuilt['turns']}"
    )
    assert len(incremental["events"]) == len(rebuilt["events"]), (
        f"{context}: events table has {len(incremental['events'])} rows, a rebuild has {len(rebuilt['events'])}"
    )
    for mine, theirs in zip(incremental["events"], rebuilt["events"]):
        assert mine == theirs, (
            f"{context}: events row differs from a rebuild\n  incremental: {mine}\n  rebuilt:     {theirs}"
        )


def model(events: list[dict], seqs: Optional[list[int]] = None) -> dict:
    """An independent model of the [N] lifecycle rules (reference 5.2) over the appended events,
    which got the given seqs (by default 1..n): closed turns are counted, a ``turn.started``
    inside an open turn closes it as interrupted, a close outside a turn changes nothing, every
    record counts."""
    turns: list[dict] = []
    open_turn = None
    closed = 0
    seqs = seqs if seqs is not None else list(range(1, len(events) + 1))
    for seq, event in zip(seqs, events):
        kind = event["type"]
        if kind == "turn.started":
            if open_turn is not None:
                open_turn["status"] = "interrupted"
                closed = max(closed, open_turn["number"])
            open_turn = {"number": closed + 1, "status": "open", "event_count": 1, "first_seq": seq, "last_seq": seq}
            turns.append(open_turn)
        elif open_turn is not None:
            open_turn["event_count"] += 1
            open_turn["last_seq"] = seq
            if kind in ("turn.completed", "turn.failed"):
                open_turn["status"] = "completed" if kind == "turn.completed" else "failed"
                closed = max(closed, open_turn["number"])
                open_turn = None
    return {
        "turn_count": closed,
        "event_count": len(events),
        "in_turn": open_turn is not None,
        "next_seq": seqs[-1] + 1 if seqs else 1,
        "turns": [(t["number"], t["status"], t["event_count"], t["first_seq"], t["last_seq"]) for t in turns],
    }


def rebuild_from_log_and_manifest(root: Path, scratch_base: Path) -> dict:
    """Like :func:`rebuild_from_log_alone`, but ``manifest.json`` and ``derived/`` are copied too
    (no index): after a cap rewrite the log alone cannot tell the ordinal of its first turn, the
    manifest's ``retained_turn_base`` does."""
    scratch = fresh_dir(scratch_base, "rebuild")
    source = session_dir(root)
    target = session_dir(scratch)
    target.mkdir(parents=True)
    shutil.copyfile(source / "events.jsonl", target / "events.jsonl")
    shutil.copyfile(source / "manifest.json", target / "manifest.json")
    shutil.copytree(source / "derived", target / "derived")
    memstore.rebuild(scratch, SESSION_ID)
    rebuilt = read_index(scratch)
    shutil.rmtree(scratch)
    return rebuilt


def wait_until_released(root: Path) -> None:
    """A handle dropped without close() is released by memstore's reaper thread, promptly but
    not synchronously: wait until the session is no longer live."""
    deadline = time.monotonic() + 10
    while memstore.is_live(session_dir(root)):
        assert time.monotonic() < deadline, "a dropped handle was never released"
        time.sleep(0.002)


def torn_seq_floor(root: Path) -> int:
    """One past the largest seq written in the torn tails kept beside the log (0 if none)."""
    seqs = [
        int(s)
        for p in session_dir(root).glob("events.jsonl.torn-*")
        for s in re.findall(rb'"seq":(\d+)', p.read_bytes())
    ]
    return max(seqs) + 1 if seqs else 0


def check_session(
    root: Path,
    scratch_base: Path,
    appended: list[dict],
    log=None,
    context: str = "",
    capped: bool = False,
    seqs: Optional[list[int]] = None,
) -> dict:
    """Everything that must hold once all appended events were flushed (or the log closed):
    the index equals a rebuild from the log alone and the lifecycle model; manifest.json, the
    index's manifest row and the open handle agree; the log holds exactly the appended events
    (with ``capped``: a suffix of them, the cap rewrite having evicted the oldest turns), one
    complete line each, with their seqs; the events table describes exactly those lines."""
    data = log_bytes(root)
    incremental = read_index(root)
    if capped:
        rebuilt = rebuild_from_log_and_manifest(root, scratch_base)
    else:
        rebuilt = rebuild_from_log_alone(root, scratch_base)
    assert_same_index(incremental, rebuilt, context)

    seqs = seqs if seqs is not None else list(range(1, len(appended) + 1))
    expected = model(appended, seqs)
    # Seqs written in torn tails were handed out once and are never given again.
    expected["next_seq"] = max(expected["next_seq"], torn_seq_floor(root))
    m = incremental["manifest"]
    for key in ("turn_count", "in_turn", "next_seq"):
        assert m[key] == expected[key], (
            f"{context}: index says {key}={m[key]!r}, the lifecycle model says {expected[key]!r}"
        )
    assert m["persisted_file_len"] == len(data), (
        f"{context}: index covers {m['persisted_file_len']} bytes, log has {len(data)}"
    )
    lines = split_lines(data)
    first = len(appended) - len(lines)
    assert m["event_count"] == len(lines), (
        f"{context}: event_count is {m['event_count']}, the log has {len(lines)} lines"
    )
    if not capped:
        assert first == 0, f"{context}: log has {len(lines)} lines, {len(appended)} events were appended"
    kept_turns = [t for t in expected["turns"] if t[0] >= m["retained_turn_base"]]
    assert [(t[0], t[1], t[4], t[5], t[6]) for t in incremental["turns"]] == kept_turns, (
        f"{context}: turn rows (number, status, event_count, first_seq, last_seq) differ from the model"
    )
    if incremental["turns"]:
        assert incremental["turns"][0][0] == m["retained_turn_base"], f"{context}: first turn is not retained_turn_base"

    on_disk = orjson.loads((session_dir(root) / "manifest.json").read_bytes())
    assert manifest_counters(on_disk) == m, f"{context}: manifest.json {manifest_counters(on_disk)} != index row {m}"
    if log is not None:
        assert manifest_counters(log.manifest) == m, f"{context}: handle manifest {log.manifest} != index row {m}"
        assert (log.turn_count, log.event_count) == (m["turn_count"], m["event_count"])

    assert data == b"" or data.endswith(b"\n"), f"{context}: log does not end with a newline: {data[-40:]!r}"
    offset = 0
    for i, line, row in zip(itertools.count(first), lines, incremental["events"]):
        seq = seqs[i]
        envelope = orjson.loads(line)
        assert envelope["seq"] == seq and envelope["event"] == appended[i], (
            f"{context}: line of seq {seq} is {line!r}, expected {appended[i]!r}"
        )
        assert (row[0], row[1], row[2], row[5]) == (seq, offset, len(line), appended[i]["type"]), (
            f"{context}: events row {row} does not describe the line of seq {seq} at offset {offset}"
        )
        offset += len(line)
    return incremental


# --------------------------------------------------------------------------------------------
# Strategies

# Text with the characters that break naive line handling: newlines, CR, NUL, quotes,
# backslashes, U+2028, multi-byte and astral characters (no lone surrogates: not valid UTF-8).
TRICKY = st.sampled_from(["\n", "\r\n", "\r", "\x00", "\t", '"', "\\", "\u2028", "é", "漢", "🎉", "\x7f", "{", "}"])
text = st.lists(st.one_of(TRICKY, st.characters(blacklist_categories=("Cs",))), max_size=24).map("".join)
u64 = st.one_of(st.integers(0, 10_000), st.just(2**64 - 1))
usage = st.fixed_dictionaries(
    {},
    optional={
        f: st.one_of(st.none(), u64)
        for f in ("input_tokens", "cached_input_tokens", "cache_creation_tokens", "output_tokens")
    },
)
json_values = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(2**63), 2**63 - 1),
        st.floats(allow_nan=False, allow_infinity=False),
        text,
    ),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(text, inner, max_size=3)),
    max_leaves=6,
)
extra_keys = st.dictionaries(text.filter(lambda k: k != "type"), json_values, max_size=3)

thread_started = st.builds(lambda t: {"type": "thread.started", "thread_id": t}, text)
turn_started = st.one_of(
    st.just({"type": "turn.started"}),
    st.builds(lambda n: {"type": "turn.started", "token_breakdown": {"system_prompt_tokens": n}}, u64),
)
agent_message = st.builds(
    lambda i, t: {"type": "item.completed", "item": {"id": i, "type": "agent_message", "text": t}}, text, text
)
command = st.builds(
    lambda i, c, out, code, status: {
        "type": "item.completed",
        "item": {
            "id": i,
            "type": "command_execution",
            "command": c,
            "aggregated_output": out,
            **({} if code is None else {"exit_code": code}),
            "status": status,
        },
    },
    text,
    text,
    st.one_of(text, st.text(min_size=200, max_size=3000)),
    st.one_of(st.none(), st.integers(-255, 255)),
    st.sampled_from(["completed", "failed", "in_progress"]),
)
turn_completed = st.builds(lambda u: {"type": "turn.completed", "usage": u}, usage)
turn_failed = st.builds(
    lambda msg, u: {"type": "turn.failed", "message": msg, **({} if u is None else {"usage": u})},
    text,
    st.one_of(st.none(), usage),
)
thread_completed = st.builds(
    lambda tid, sid, sub, code, u, n: {
        "type": "thread.completed",
        "thread_id": tid,
        "session_id": sid,
        "subtype": sub,
        "outcome_code": code,
        "usage": u,
        "num_turns": n,
    },
    text,
    text,
    st.sampled_from(["success", "error_max_turns", "cancelled", "whatever"]),
    text,
    usage,
    st.integers(0, 1000),
)
unknown = st.builds(
    lambda kind, extra: {**extra, "type": kind},
    st.from_regex(r"\A[a-z_]{1,8}(\.[a-z_]{1,8})?\Z").filter(lambda k: k not in LIFECYCLE),
    extra_keys,
)
permission = st.builds(lambda name: {"type": "permission.requested", "tool_name": name}, text)
events = st.one_of(
    turn_started,
    agent_message,
    command,
    turn_completed,
    turn_failed,
    thread_started,
    thread_completed,
    unknown,
    permission,
)
durabilities = st.sampled_from(["turn", "event", "none"])
# A well-formed turn (so that closed turns, and cap rewrites, are common): turn.started, a few
# items or unknown events, and a turn.completed or turn.failed.
whole_turn = st.builds(
    lambda start, body, end: [start, *body, end],
    turn_started,
    st.lists(st.one_of(agent_message, command, unknown, permission), max_size=4),
    st.one_of(turn_completed, turn_failed),
)

# One step of a scenario. Appends dominate; the other steps are the points where the index must
# have caught up (flush, complete, read, close+reopen) or where only bytes are written (drop).
steps = st.one_of(
    st.tuples(st.just("append"), events),
    st.tuples(st.just("append"), events),
    st.tuples(st.just("turn"), whole_turn),
    st.tuples(st.sampled_from(["flush", "complete", "read", "reopen", "drop"]), durabilities),
)
scenarios = st.lists(steps, max_size=30)

partial_line = st.builds(
    lambda event, seq, cut: encode_record(seq, "2026-11-30T08:30:29.123Z", event)[: max(1, cut)],
    events,
    st.integers(1, 10_000),
    st.integers(1, 60),
).map(lambda line: line[:-1] if line.endswith(b"\n") else line)
torn_tails = st.one_of(
    partial_line,  # crash mid-line
    st.integers(1, 4096).map(lambda n: b"\x00" * n),  # NUL run (no data written)
    st.tuples(st.integers(1, 64), st.integers(0, 64)).map(lambda t: b"\x00" * t[0] + b"\n" + b"\x00" * t[1]),
    st.binary(min_size=1, max_size=300).map(lambda b: b.replace(b"\n", b"")).filter(bool),  # random bytes
    st.tuples(partial_line, st.integers(1, 512)).map(lambda t: t[0] + b"\x00" * t[1]),  # partial + NULs
    st.tuples(partial_line, partial_line).map(lambda t: t[0] + b"\n" + t[1]),  # a torn line, then another
)


# --------------------------------------------------------------------------------------------
# Running a scenario


class Runner:
    """Plays a scenario against one session, checking the invariants at every point where the
    index must have caught up with the log."""

    def __init__(self, root: Path, scratch: Path, durability: str, max_events: Optional[int] = None):
        self.root = root
        self.scratch = scratch
        self.capped = max_events is not None  # else the default cap, far above these streams
        self.max_events = max_events if self.capped else memstore.DEFAULT_MAX_EVENTS
        self.appended: list[dict] = []
        self.log = self.open(durability)

    def open(self, durability: str):
        return memstore.open_session(self.root, SESSION_ID, max_events=self.max_events, durability=durability)

    def expected_log(self) -> list[dict]:
        """The events the log must hold now: all appended, or with a cap the newest
        ``event_count`` of them."""
        if not self.capped:
            return self.appended
        return self.appended[len(self.appended) - self.log.event_count :]

    def step(self, op: str, arg) -> None:
        context = f"after step {op} (#{len(self.appended)} events appended)"
        if op in ("append", "turn"):
            for event in [arg] if op == "append" else arg:
                seq = self.log.append(event)
                self.appended.append(event)
                assert seq == len(self.appended), f"append returned seq {seq}, expected {len(self.appended)}"
            return
        if op == "flush":
            self.log.flush()
        elif op == "complete":
            self.log.complete()
        elif op == "read":
            turns = self.log.turns()
            base = self.log.manifest.retained_turn_base
            assert [t.number for t in turns] == [t[0] for t in model(self.appended)["turns"] if t[0] >= base], context
            for t in turns:
                got = self.log.reconstruct_turn(t.number)
                assert got == self.appended[t.first_seq - 1 : t.last_seq], (
                    f"{context}: turn {t.number} reconstructs wrong"
                )
            assert list(self.log.iter_events()) == self.expected_log(), f"{context}: iter_events differs"
            # A read writes the buffer out (unsynced) and indexes it; it need not publish
            # manifest.json, so the full check waits for the next flush or close.
            return
        elif op == "reopen":
            self.log.close()
            self.log = None
            self.check(context + " / closed")
            self.log = self.open(arg)
        elif op == "drop":
            # Dropped without close(): buffered bytes are written, the metadata is not.
            self.log = None
            gc.collect()
            wait_until_released(self.root)
            self.log = self.open(arg)
        self.check(context)

    def check(self, context: str) -> None:
        check_session(self.root, self.scratch, self.appended, self.log, context, capped=self.capped)
        if self.log is not None:
            assert list(self.log.iter_events()) == self.expected_log(), (
                f"{context}: iter_events differs from the appended events"
            )

    def close(self, *, drop: bool = False) -> None:
        """Close the handle, or with ``drop`` let it go without close() (bytes only)."""
        if self.log is not None:
            log, self.log = self.log, None
            if drop:
                del log
                gc.collect()
                wait_until_released(self.root)
            else:
                log.close()


SETTINGS = settings(
    max_examples=int(os.environ.get("MEMSTORE_PROPERTY_EXAMPLES", "60")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


# --------------------------------------------------------------------------------------------
# Tests


@SETTINGS
@given(durability=durabilities, scenario=scenarios)
def test_incremental_index_equals_rebuild(tmp_path, durability, scenario):
    """For a random stream, policy and flush/complete/read/reopen/drop points: at every point the
    index must have caught up, its turns and events rows and manifest counters equal a rebuild
    from the log alone (and the lifecycle model), and ``iter_events`` returns exactly the
    appended events in order. After the final close, an in-place ``memstore.rebuild`` changes
    nothing either."""
    root = fresh_dir(tmp_path, "store")
    runner = Runner(root, tmp_path, durability)
    try:
        for op, arg in scenario:
            runner.step(op, arg)
    finally:
        runner.close()
    incremental = check_session(root, tmp_path, runner.appended, None, "after the final close")

    memstore.rebuild(root, SESSION_ID)
    assert_same_index(incremental, read_index(root), "in-place rebuild after close")
    with memstore.open_session(root, SESSION_ID) as log:
        assert list(log.iter_events()) == runner.appended, "iter_events after reopen differs from the appended events"
        assert [r.seq for r in log.iter_records()] == list(range(1, len(runner.appended) + 1))


@SETTINGS
@given(durability=durabilities, max_events=st.integers(1, 12), scenario=scenarios)
def test_incremental_index_equals_rebuild_under_cap_rewrites(tmp_path, durability, max_events, scenario):
    """The same with a small ``max_events``, so cap rewrites evict the oldest whole turns along
    the way: the log stays a suffix of the appended events (seqs intact), turn ordinals stay
    monotonic (the kept turn rows are the model's newest ones), and the index equals a rebuild
    from the log and the manifest (no index)."""
    root = fresh_dir(tmp_path, "store")
    runner = Runner(root, tmp_path, durability, max_events=max_events)
    try:
        for op, arg in scenario:
            runner.step(op, arg)
    finally:
        runner.close()
    incremental = check_session(root, tmp_path, runner.appended, None, "after the final close", capped=True)
    summaries = session_dir(root) / "derived" / "eviction-summaries.jsonl"
    evictions = len(summaries.read_bytes().splitlines()) if summaries.exists() else 0
    hypothesis.event(f"cap rewrites: {'0' if not evictions else '1-3' if evictions <= 3 else '4+'}")
    memstore.rebuild(root, SESSION_ID)
    in_place = read_index(root)
    assert_same_index(incremental, in_place, "in-place rebuild after close")


@SETTINGS
@given(
    durability=durabilities,
    before=scenarios,
    dropped=st.booleans(),
    tails=st.lists(torn_tails, min_size=1, max_size=2),
    after=st.lists(events, min_size=1, max_size=6),
)
def test_torn_tail_is_cut_kept_and_never_welded(tmp_path, durability, before, dropped, tails, after):
    """A session closed (or dropped without close: its last lines written but not indexed)
    whose log then gets a torn tail (a partial JSON line, a NUL run, random bytes, a partial line
    followed by NULs): reopening keeps every event the close wrote, cuts the log back to its last
    complete line, keeps exactly the cut bytes in a new ``events.jsonl.torn-*`` file, leaves the
    log ending in a newline, and the index equals a rebuild. Events appended afterwards start on
    a clean line: every line parses as JSON."""
    root = fresh_dir(tmp_path, "store")
    runner = Runner(root, tmp_path, durability)
    try:
        for op, arg in before:
            runner.step(op, arg)
    finally:
        runner.close(drop=dropped)
    sdir = session_dir(root)
    events_path = sdir / "events.jsonl"

    for round_no, garbage in enumerate(tails):
        acknowledged = log_bytes(root)
        torn_before = {p.name: p.read_bytes() for p in sdir.glob("events.jsonl.torn-*")}
        with open(events_path, "ab") as fh:
            fh.write(garbage)
        context = f"torn tail #{round_no} {garbage[:60]!r}"

        log = memstore.open_session(root, SESSION_ID, durability=durability)
        try:
            repaired = log_bytes(root)
            assert repaired == acknowledged, (
                f"{context}: reopen should cut the log back to the {len(acknowledged)} acknowledged bytes, "
                f"it has {len(repaired)}; tail {repaired[-80:]!r}"
            )
            torn_after = {p.name: p.read_bytes() for p in sdir.glob("events.jsonl.torn-*")}
            assert {k: v for k, v in torn_after.items() if k in torn_before} == torn_before, (
                f"{context}: an earlier torn file was changed or removed"
            )
            new = {k: v for k, v in torn_after.items() if k not in torn_before}
            assert list(new.values()) == [garbage], (
                f"{context}: expected one new torn file holding exactly the {len(garbage)} cut bytes, found {new!r}"
            )
            assert os.stat(sdir / next(iter(new))).st_mode & 0o777 == 0o600, f"{context}: torn file is not private"
            assert list(log.iter_events()) == runner.appended, f"{context}: acknowledged events missing after repair"
            check_session(root, tmp_path, runner.appended, log, context)
        finally:
            log.close()

    with memstore.open_session(root, SESSION_ID, durability=durability) as log:
        seqs = list(range(1, len(runner.appended) + 1))
        for event in after:
            seqs.append(log.append(event))
            runner.appended.append(event)
    assert seqs == sorted(set(seqs)), f"seqs repeat or go backwards: {seqs}"
    assert seqs[-len(after)] >= torn_seq_floor(root), "an append reused a seq written in a torn tail"
    data = log_bytes(root)
    for number, line in enumerate(split_lines(data), start=1):
        try:
            orjson.loads(line)
        except orjson.JSONDecodeError:
            pytest.fail(f"line {number} of the log is not JSON (welded onto a torn line?): {line[:120]!r}")
    check_session(root, tmp_path, runner.appended, None, "after appending past a repaired tail", seqs=seqs)


def test_torn_files_of_two_repairs_at_the_same_offset_and_millisecond_are_both_kept(tmp_path, monkeypatch):
    """Two torn tails cut at the same offset (no append in between) within one millisecond must
    not overwrite each other: the cut bytes are never thrown away. The clock is frozen to make
    the same-millisecond case deterministic."""
    root = fresh_dir(tmp_path, "store")
    with memstore.open_session(root, SESSION_ID) as log:
        log.append({"type": "turn.started"})
        log.append({"type": "turn.completed", "usage": {}})
    events_path = session_dir(root) / "events.jsonl"
    monkeypatch.setattr(memstore.events, "utc_now", lambda: "2026-11-30T08:30:29.123Z")
    for garbage in (b'{"schema_version":"0.18.0","se', b"\x00" * 16):
        with open(events_path, "ab") as fh:
            fh.write(garbage)
        memstore.open_session(root, SESSION_ID).close()
    kept = sorted(p.read_bytes() for p in session_dir(root).glob("events.jsonl.torn-*"))
    assert kept == sorted([b'{"schema_version":"0.18.0","se', b"\x00" * 16]), (
        f"the torn bytes of one of the two repairs were lost: torn files hold {kept!r}"
    )


def test_rebuild_without_manifest_after_cap_rewrites_keeps_turn_ordinals_whatever_the_clock(tmp_path, monkeypatch):
    """Eviction summaries record the retained turn base so that a rebuild without manifest and
    index keeps the turn ordinals after cap rewrites. Which summary is the newest must not hang
    on ``created_at``: several rewrites fall in one millisecond on a fast disk, and the wall clock
    can step back. Here it steps back 1 ms per reading, so the rebuild deterministically picks
    the wrong summary if it goes by timestamp."""
    ticks = itertools.count()
    start = datetime(2026, 11, 30, 8, 30, 29, tzinfo=UTC)
    monkeypatch.setattr(
        memstore.events, "utc_now", lambda: memstore.events.format_ts(start - timedelta(milliseconds=next(ticks)))
    )
    root = fresh_dir(tmp_path, "store")
    with memstore.open_session(root, SESSION_ID, max_events=4) as log:
        for _ in range(8):
            log.append({"type": "turn.started"})
            log.append({"type": "turn.completed", "usage": {}})
        kept = [(t.number, t.first_seq) for t in log.turns()]
    assert kept == [(7, 13), (8, 15)], kept
    sdir = session_dir(root)
    shutil.rmtree(sdir / "index")
    (sdir / "manifest.json").unlink()
    memstore.rebuild(root, SESSION_ID)
    with memstore.open_session(root, SESSION_ID, max_events=0) as log:
        rebuilt = [(t.number, t.first_seq) for t in log.turns()]
    assert rebuilt == kept, f"rebuild numbered the kept turns {rebuilt}, they were {kept}"


def test_turn_interrupted_after_a_flush_is_indexed_as_interrupted(tmp_path):
    """A ``turn.started`` while a turn is open closes that turn as interrupted. When the open
    turn's row was already committed (a flush, a 64 KiB write, a cap rewrite, a reopen), the
    index must still learn the new status, as a rebuild does."""
    root = fresh_dir(tmp_path, "store")
    with memstore.open_session(root, SESSION_ID) as log:
        log.append({"type": "turn.started"})
        log.flush()
        log.append({"type": "turn.started"})
        log.flush()
        incremental = [(t.number, t.status) for t in log.turns()]
    memstore.rebuild(root, SESSION_ID)
    with memstore.open_session(root, SESSION_ID) as log:
        rebuilt = [(t.number, t.status) for t in log.turns()]
    assert rebuilt == [(1, "interrupted"), (2, "open")], rebuilt
    assert incremental == rebuilt, f"incremental index says {incremental}, a rebuild says {rebuilt}"


def test_u64_usage_counters_are_accepted_and_indexed(tmp_path):
    """Usage counters are u64 in the event contract (2**64 - 1 passes validation), but SQLite
    integers are signed 64-bit. Such an event must not break the index: the append returns, the
    turn is indexed as completed, and the session reopens and rebuilds (today the index commit
    raises OverflowError after the line was written, and every later open of the session
    raises it too)."""
    root = fresh_dir(tmp_path, "store")
    big = {"input_tokens": 2**64 - 1, "cached_input_tokens": 2**63, "cache_creation_tokens": 0, "output_tokens": 1}
    with memstore.open_session(root, SESSION_ID) as log:
        log.append({"type": "turn.started"})
        log.append({"type": "turn.completed", "usage": big})
        assert [(t.number, t.status, t.event_count) for t in log.turns()] == [(1, "completed", 2)]
    with memstore.open_session(root, SESSION_ID) as log:
        assert (log.turn_count, log.event_count) == (1, 2)
        assert list(log.iter_events())[1]["usage"] == big, "the log must keep the exact counters"
    memstore.rebuild(root, SESSION_ID)


def test_rebuild_keeps_completed_status_after_the_cap_evicted_thread_completed(tmp_path):
    """A thread.completed logged inside a turn marks the session completed; when the cap evicts
    that turn, the log no longer holds the event. Reopening keeps ``completed`` (the manifest
    says so), and a rebuild, which keeps the manifest's ``retained_turn_base`` and ``next_seq``,
    must not silently flip the session back to ``active`` (retention treats the two differently)."""
    root = fresh_dir(tmp_path, "store")
    thread_completed = {
        "type": "thread.completed",
        "thread_id": "t",
        "session_id": "s",
        "subtype": "success",
        "outcome_code": "completed",
        "usage": {},
        "num_turns": 1,
    }
    with memstore.open_session(root, SESSION_ID, max_events=1) as log:
        log.append({"type": "turn.started"})
        log.append(thread_completed)
        log.append({"type": "turn.completed", "usage": {}})
        assert (log.event_count, log.manifest.status) == (0, "completed"), log.manifest
    with memstore.open_session(root, SESSION_ID) as log:
        assert log.manifest.status == "completed", "reopen lost the completed status"
    rebuilt = memstore.rebuild(root, SESSION_ID)
    assert rebuilt.status == "completed", f"rebuild turned the completed session into {rebuilt.status!r}"
