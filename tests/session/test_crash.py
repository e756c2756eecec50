"""Crash tests: a writer in a real subprocess is SIGKILLed at many random moments.

The writer appends turns to one session in a loop and prints a line to stdout only *after* the
append that made its events durable returned: that line is the acknowledgement. The parent kills
it at a random moment (mid-turn, mid-write, mid-index-commit, mid-manifest-publish, mid-open),
starts a new writer on the same session (which must recover whatever the kill left), and so on.
At the end it checks that no acknowledged event was lost, that sequence numbers never repeat, and
that the log, its index and a fresh rebuild all agree.
"""

from __future__ import annotations

import itertools
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import orjson
import pytest
import support
import vtcode_view

import memstore

# Crash loops: writers SIGKILLed at random moments, many times over.
pytestmark = pytest.mark.slow

SESSION_ID = "crash-session"

# The writer. argv: root, session id, durability, seed, max_events.
# With durability="turn" it prints "turn <seq> <seq> ..." (every seq of the turn) once the append
# of the turn's closing event returned; with "event", "ack <seq>" after every append.
WRITER = r"""
import random, sys
import memstore

root, sid, durability, seed, max_events = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
rng = random.Random(seed)
log = memstore.open_session(root, sid, max_events=max_events, durability=durability)
print("ready", flush=True)

def append(event):
    seq = log.append(event)
    if durability == "event":
        print("ack", seq, flush=True)
    return seq

append({"type": "thread.started", "thread_id": sid})
n = 0
while True:
    n += 1
    seqs = [append({"type": "turn.started"})]
    for i in range(rng.randint(0, 5)):
        # Mostly small events, sometimes kilobytes of output, rarely more than the 64 KiB buffer
        # (one big write() that a SIGKILL can cut short).
        size = rng.choice((0, 40, 40, 2000, 2000, 20000, 100000))
        seqs.append(append({"type": "item.completed", "item": {
            "id": f"cmd_{n}_{i}", "type": "command_execution", "command": "printf 'é\n漢'",
            "aggregated_output": ("ok é 漢 \n" * (size // 10 + 1))[:size], "exit_code": i % 3, "status": "completed"}}))
    if rng.random() < 0.2:
        seqs.append(append({"type": "turn.failed", "message": f"turn {n} failed\nbadly"}))
    else:
        seqs.append(append({"type": "turn.completed", "usage": {"input_tokens": n, "cached_input_tokens": 0,
                                                              "cache_creation_tokens": 0, "output_tokens": 7}}))
    if durability == "turn":
        print("turn", *seqs, flush=True)
"""


# --------------------------------------------------------------------------------------------
# Helpers


def session_dir(root: Path) -> Path:
    return memstore.session_directory(root, SESSION_ID)


def read_index(root: Path) -> dict:
    return support.read_index(session_dir(root))


def rebuild_elsewhere(root: Path, scratch: Path, with_manifest: bool) -> dict:
    """Copy ``events.jsonl`` and the torn tails kept beside it (the seqs they hold were handed out
    and are never given again) into a new store (with ``with_manifest`` also ``manifest.json`` and
    ``derived/``, which carry the turn ordinals past a cap rewrite), run ``memstore.rebuild``
    there, and return its index rows. The original session is left untouched."""
    source = session_dir(root)
    target = session_dir(scratch)
    target.mkdir(parents=True)
    shutil.copyfile(source / "events.jsonl", target / "events.jsonl")
    for torn in source.glob("events.jsonl.torn-*"):
        shutil.copyfile(torn, target / torn.name)
    if with_manifest:
        shutil.copyfile(source / "manifest.json", target / "manifest.json")
        shutil.copytree(source / "derived", target / "derived")
    memstore.rebuild(scratch, SESSION_ID)
    return read_index(scratch)


def closed_turns(events: list[dict]) -> tuple[int, bool]:
    """(closed turns, whether a turn is open) over a log's events, by the [N] rules: a close
    outside a turn changes nothing, a ``turn.started`` inside a turn closes it (interrupted)."""
    closed, in_turn = 0, False
    for event in events:
        kind = event["type"]
        if kind == "turn.started":
            closed += in_turn
            in_turn = True
        elif kind in ("turn.completed", "turn.failed") and in_turn:
            closed += 1
            in_turn = False
    return closed, in_turn


def run_and_kill(root: Path, durability: str, max_events: int, rng: random.Random, label: str) -> list[tuple[int, ...]]:
    """Start a writer on the session, SIGKILL it at a random moment, and return what it
    acknowledged: one tuple of seqs per acknowledgement line it completed."""
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(root), SESSION_ID, durability, str(rng.randrange(2**32)), str(max_events)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=support.writer_env(),
    )
    lines: list[bytes] = []
    ready = threading.Event()

    def read_stdout() -> None:
        for line in proc.stdout:
            lines.append(line)
            if line == b"ready\n":
                ready.set()

    reader = threading.Thread(target=read_stdout, daemon=True)
    reader.start()
    try:
        if rng.random() < 0.2:
            # Sometimes kill during start-up: the import, or the open and its recovery.
            time.sleep(rng.uniform(0.0, 0.15))
        else:
            deadline = time.monotonic() + 60
            while not ready.wait(0.01):
                assert proc.poll() is None, f"{label}: writer exited before it was ready: {proc.stderr.read().decode()}"
                assert time.monotonic() < deadline, f"{label}: writer never became ready"
            time.sleep(rng.uniform(0.005, 0.08))
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    reader.join(timeout=60)
    stderr = proc.stderr.read().decode(errors="replace")
    proc.stdout.close()
    proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL, f"{label}: writer died on its own (exit {proc.returncode}):\n{stderr}"
    acks = []
    for line in lines:
        if not line.endswith(b"\n"):
            continue  # cut short by the kill: not an acknowledgement
        word, *seqs = line.split()
        if word in (b"turn", b"ack"):
            acks.append(tuple(int(s) for s in seqs))
    return acks


def crash_many_times(tmp_path: Path, durability: str, kills: int, max_events: int = 0) -> None:
    """The scenario and all its checks (see the module docstring)."""
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    root = tmp_path / "store"
    runs: list[list[tuple[int, ...]]] = []
    for i in range(kills):
        runs.append(run_and_kill(root, durability, max_events, rng, f"seed {seed}, run {i}"))
    what = f"seed {seed}, durability={durability}, max_events={max_events}, acks per run {[len(r) for r in runs]}"
    assert sum(len(r) for r in runs) > 0, f"{what}: no writer acknowledged anything; the test proved nothing"

    # Acknowledged seqs never repeat: every run's acknowledgements come after the previous ones.
    acked = [seq for run in runs for ack in run for seq in ack]
    assert all(a < b for a, b in zip(acked, acked[1:])), f"{what}: acknowledged seqs repeat or go back across restarts"

    log = memstore.open_session(root, SESSION_ID, max_events=max_events, durability=durability)
    try:
        records = list(log.iter_records())
        turns = log.turns()
        turn_count, event_count, manifest = log.turn_count, log.event_count, log.manifest
    finally:
        log.close()
    data = (session_dir(root) / "events.jsonl").read_bytes()

    # The log: whole lines only, each one a JSON envelope with a seq, seqs strictly increasing.
    assert data.endswith(b"\n"), f"{what}: the log does not end with a newline: {data[-80:]!r}"
    lines = data.split(b"\n")[:-1]
    for number, line in enumerate(lines, start=1):
        try:
            envelope = orjson.loads(line)
        except orjson.JSONDecodeError:
            raise AssertionError(f"{what}: line {number} is not JSON: {line[:120]!r}") from None
        assert isinstance(envelope.get("seq"), int), f"{what}: line {number} has no seq: {line[:120]!r}"
    assert len(records) == len(lines) == event_count, (
        f"{what}: {len(records)} records, {len(lines)} lines, event_count {event_count}"
    )
    seqs = [r.seq for r in records]
    assert all(a < b for a, b in zip(seqs, seqs[1:])), f"{what}: seqs in the log are not strictly increasing"

    # Nothing acknowledged is missing (with a cap, nothing newer than what the cap evicted).
    present = set(seqs)
    oldest_kept = seqs[0] if seqs else manifest.next_seq
    missing = [s for s in acked if s not in present and (max_events == 0 or s >= oldest_kept)]
    assert not missing, f"{what}: acknowledged seqs missing from the log: {missing[:20]}"
    if max_events == 0:
        assert oldest_kept == 1, f"{what}: the log lost its first events (starts at seq {oldest_kept})"

    # Each acknowledged turn is one closed turn of the index, with exactly its events.
    if durability == "turn":
        by_last_seq = {t.last_seq: t for t in turns}
        for ack in (a for run in runs for a in run):
            if ack[0] < oldest_kept:
                continue  # evicted by the cap
            turn = by_last_seq.get(ack[-1])
            assert turn is not None, f"{what}: no turn ends at acknowledged seq {ack[-1]}"
            assert (turn.first_seq, turn.event_count, turn.status in ("completed", "failed")) == (
                ack[0],
                len(ack),
                True,
            ), f"{what}: acknowledged turn {ack} is indexed as {turn}"

    # The counters, the index and a fresh rebuild agree with the log.
    closed, in_turn = closed_turns([r.event for r in records])
    assert turn_count == closed + manifest.retained_turn_base - 1, (
        f"{what}: turn_count {turn_count}, but the log holds {closed} closed turns after base {manifest.retained_turn_base}"
    )
    assert manifest.in_turn == in_turn, f"{what}: manifest in_turn {manifest.in_turn}, the log says {in_turn}"
    assert not seqs or manifest.next_seq > seqs[-1], f"{what}: next_seq {manifest.next_seq} would reuse seq {seqs[-1]}"
    incremental = read_index(root)
    # Without a cap the log alone must give the same index; past cap rewrites the rebuild also
    # reads the manifest, as an in-place rebuild does, for the ordinal of the first kept turn.
    rebuilt = rebuild_elsewhere(root, tmp_path / "rebuilt", with_manifest=max_events > 0)
    assert incremental["manifest"] == rebuilt["manifest"], (
        f"{what}: index manifest row {incremental['manifest']} != rebuild {rebuilt['manifest']}"
    )
    assert incremental["turns"] == rebuilt["turns"], f"{what}: the turns table differs from a rebuild"
    assert incremental["events"] == rebuilt["events"], f"{what}: the events table differs from a rebuild"
    assert [(row[0], row[1], row[2]) for row in incremental["events"]] == [
        (seq, offset, len(line) + 1)
        for seq, offset, line in zip(seqs, itertools.accumulate((len(text) + 1 for text in lines), initial=0), lines)
    ], f"{what}: events rows do not describe the log's lines"
    on_disk = orjson.loads((session_dir(root) / "manifest.json").read_bytes())
    assert {k: on_disk[k] for k in support.MANIFEST_COUNTERS} == incremental["manifest"], (
        f"{what}: manifest.json {on_disk} disagrees with the index {incremental['manifest']}"
    )
    shutil.rmtree(tmp_path)  # the logs run to tens of MB; kept only when a check failed


# --------------------------------------------------------------------------------------------
# Tests


def test_sigkilled_turn_writer_loses_no_acknowledged_turn(tmp_path):
    """durability="turn": across 20 SIGKILLs at random moments and restarts, every turn whose
    closing append returned is in the log and indexed as one closed turn with exactly its events;
    seqs are strictly increasing and never reused; the index equals a fresh rebuild; turn_count
    is the number of closed turns in the log; the log is whole lines of JSON ending in a newline."""
    crash_many_times(tmp_path, "turn", kills=20)


def test_sigkilled_event_writer_loses_no_acknowledged_event(tmp_path):
    """durability="event": the same across 15 SIGKILLs, with every append acknowledged as soon as
    it returned."""
    crash_many_times(tmp_path, "event", kills=15)


def test_sigkilled_writer_during_cap_rewrites(tmp_path):
    """durability="turn" with max_events=30, so the writer is often killed inside a cap rewrite
    (summary hook, intent marker, log replace, index eviction): every acknowledged event newer
    than the cap's cut survives, seqs never repeat, and index, counters and rebuild agree."""
    crash_many_times(tmp_path, "turn", kills=15, max_events=30)


# Dies like a SIGKILL at one precise moment of a cap rewrite (argv[3]: the fault point): its
# eviction summary is written; at cap.marker the intent marker is not, at cap.synced it is, synced
# with the summary and the log's copy; the log's replacement has not happened yet.
KILLED_INSIDE_CAP_REWRITE = r"""
import os, signal, sys
import memstore
from memstore import faults
faults.arm(sys.argv[3], lambda **context: os.kill(os.getpid(), signal.SIGKILL))
log = memstore.open_session(sys.argv[1], sys.argv[2], max_events=4)
for n in range(3):
    log.append({"type": "turn.started"})
    log.append({"type": "turn.completed", "usage": {}})
"""


@pytest.mark.parametrize("point", ["cap.marker", "cap.synced"])
def test_cap_rewrite_killed_after_its_summary_does_not_renumber_turns_on_rebuild(tmp_path, point):
    """A writer killed inside its first cap rewrite, after the eviction summary was written (and,
    at cap.synced, the marker too) but before the log was cut: nothing was evicted, the log still
    holds turns 1 and 2 and the open turn 3. Rebuilding without index and manifest (the design's
    "delete index/ and manifest.json, run rebuild") must number them 1, 2, 3 as the recovered
    session does, not take the retained turn base of a marker or summary of a rewrite that never
    happened; VT Code's view agrees."""
    root = tmp_path / "store"
    proc = subprocess.run(
        [sys.executable, "-c", KILLED_INSIDE_CAP_REWRITE, str(root), SESSION_ID, point],
        capture_output=True,
        timeout=60,
        env=support.writer_env(),
    )
    assert proc.returncode == -signal.SIGKILL, f"writer was not killed inside the cap rewrite: {proc.stderr.decode()}"
    sdir = session_dir(root)
    assert (sdir / "derived" / "eviction-summaries.jsonl").read_bytes(), "the summary was not written before the kill"
    assert (sdir / "index" / "pending-cap-rewrite.json").exists() == (point == "cap.synced")
    assert vtcode_view.open_view(sdir).numbers() == [1, 2, 3]

    with memstore.open_session(root, SESSION_ID, max_events=0) as log:
        recovered = [(t.number, t.status, t.first_seq) for t in log.turns()]
        counters = (log.turn_count, log.manifest.next_seq, log.manifest.retained_turn_base)
    assert recovered == [(1, "completed", 1), (2, "completed", 3), (3, "open", 5)], recovered
    assert counters == (2, 6, 1), counters

    shutil.rmtree(sdir / "index")
    (sdir / "manifest.json").unlink()
    rebuilt = memstore.rebuild(root, SESSION_ID)
    with memstore.open_session(root, SESSION_ID, max_events=0) as log:
        after = [(t.number, t.status, t.first_seq) for t in log.turns()]
    assert after == recovered, (
        f"rebuild renumbered the turns from the stale eviction summary: {after} (turn_count {rebuilt.turn_count}, "
        f"retained_turn_base {rebuilt.retained_turn_base}); the log holds {recovered}"
    )


# Dies like a SIGKILL in the middle of a cap rewrite, while it copies the kept part of the log
# into the temporary file that is to replace events.jsonl.
KILLED_WHILE_COPYING_THE_LOG = r"""
import os, signal, sys
import memstore
from memstore import faults
faults.arm("cap.copy", lambda **context: os.kill(os.getpid(), signal.SIGKILL))
log = memstore.open_session(sys.argv[1], sys.argv[2], max_events=4)
for n in range(3):
    log.append({"type": "turn.started"})
    log.append({"type": "item.completed", "item": {"id": str(n), "type": "agent_message", "text": "x" * 10000}})
    log.append({"type": "turn.completed", "usage": {}})
"""


def test_reopen_after_a_cap_rewrite_killed_mid_copy_leaves_no_copy_of_the_log_behind(tmp_path):
    """A writer killed while copying the log for a cap rewrite leaves a temporary
    ``.events.jsonl.cap-*`` file, which can be as big as the log itself. The next open holds the
    session lock, so no writer can still own it: the log must be intact and the copy gone,
    or every crash during a rewrite leaks another copy of the log."""
    root = tmp_path / "store"
    proc = subprocess.run(
        [sys.executable, "-c", KILLED_WHILE_COPYING_THE_LOG, str(root), SESSION_ID],
        capture_output=True,
        timeout=60,
        env=support.writer_env(),
    )
    assert proc.returncode == -signal.SIGKILL, f"writer was not killed inside the cap rewrite: {proc.stderr.decode()}"
    sdir = session_dir(root)
    assert list(sdir.glob(".events.jsonl.cap-*")), "the kill did not leave the temporary copy this test is about"

    with memstore.open_session(root, SESSION_ID, max_events=4) as log:
        assert [e["type"] for e in log.iter_events()][:3] == ["turn.started", "item.completed", "turn.completed"]
        assert log.turn_count == 1
    leftovers = sorted(p.name for p in sdir.glob(".events.jsonl.cap-*"))
    assert not leftovers, f"temporary log copies of dead writers were left behind: {leftovers}"


# --------------------------------------------------------------------------------------------
# The cap rewrite's marker: VT Code's view at every step, and the order of the syncs

# A writer that turns the cap over once and dies (SIGKILL) at one fault point of the rewrite
# (argv[3]). Turns hold two events, the cap is 6, so the seventh append (the 4th turn's start)
# evicts turn 1; with argv[4] == "grow", the writer runs in bulk mode (no synced write waits for
# the rewrite's views) and goes on appending turns, so the log grows past the rewrite while the
# publisher's thread is held at the point, and the kill comes from there. It prints "ack <turn>"
# after each turn's closing append returned.
KILLED_AT_A_REWRITE_STEP = r"""
import os, signal, sys, threading, time
import memstore
from memstore import faults
root, sid, point, grow = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "grow"
hit = threading.Event()
def die(**context):
    if grow and threading.current_thread() is not threading.main_thread():
        hit.set()
        time.sleep(0.5)  # the writer appends meanwhile
    os.kill(os.getpid(), signal.SIGKILL)
faults.arm(point, die)
log = memstore.open_session(root, sid, max_events=6, durability="none" if grow else "turn")
for n in range(1, 40):
    log.append({"type": "turn.started"})
    log.append({"type": "item.completed", "item": {"id": str(n), "type": "agent_message", "text": f"turn {n}"}})
    log.append({"type": "turn.completed", "usage": {}})
    print("ack", n, flush=True)
    if n >= 3 and not grow:
        time.sleep(0.05)
time.sleep(5)
"""

REWRITE_STEPS = ["cap.copy", "cap.marker", "cap.synced", "cap.replaced", "index.evict", "index.sync", "cap.unmark"]


@pytest.mark.parametrize("grow", ["", "grow"])
@pytest.mark.parametrize("point", REWRITE_STEPS)
def test_a_writer_killed_at_any_step_of_a_cap_rewrite_leaves_turns_vtcode_numbers_right(tmp_path, point, grow):
    """SIGKILL at each step of a cap rewrite (before and after the log's replacement, in the
    writer's thread and in the publisher's, with and without appends after the rewrite): VT
    Code, opening the directory as it was left, numbers the turns the log holds as memstore does
    (it relies on the marker while the log is the rewritten one, on manifest.json once the log
    grew), and memstore reopens with every acknowledged turn, numbered as before the kill."""
    if grow and point.startswith("cap.") and point not in ("cap.unmark",):
        pytest.skip("a step of the writer's own thread: nothing is appended after it")
    root = tmp_path / "store"
    proc = subprocess.run(
        [sys.executable, "-c", KILLED_AT_A_REWRITE_STEP, str(root), SESSION_ID, point, grow],
        capture_output=True,
        timeout=120,
        env=support.writer_env(),
    )
    assert proc.returncode == -signal.SIGKILL, f"not killed at {point}: {proc.stderr.decode()[-2000:]}"
    acked = [int(line.split()[1]) for line in proc.stdout.decode().splitlines() if line.startswith("ack")]
    sdir = session_dir(root)
    vt = vtcode_view.open_view(sdir)
    with memstore.open_session(root, SESSION_ID, max_events=0) as log:
        turns = log.turns()
        mine = [t.number for t in turns]
        texts = {t.number: log.reconstruct_turn(t.number)[1]["item"]["text"] for t in turns if t.event_count > 1}
    assert vt.numbers() == mine, f"VT Code numbers {vt.numbers()}, memstore {mine} (killed at {point})"
    assert all(text == f"turn {number}" for number, text in texts.items()), texts
    assert acked and mine[-1] >= acked[-1] and set(range(mine[0], acked[-1] + 1)) <= set(mine)
    if grow:
        # The rewrite came with turn 3's start; its message and end were written after it.
        assert (3, "completed") in [(t.number, t.status) for t in turns], f"the log did not grow: {turns}"
    assert not (sdir / "index" / "pending-cap-rewrite.json").exists()  # the reopen finished the rewrite


def test_a_cap_rewrite_reaches_its_steps_in_order_and_removes_the_marker_last(tmp_path, fault):
    """The rewrite's named steps, in the order they are reached (the writer's thread and then the
    publisher's): summary and marker staged, all synced (with the log's copy and manifest.json's
    next version), the log replaced, the index committed with a synced WAL, and only then the
    marker removed; the marker exists from its staging to its removal. (The syscalls
    themselves: the strace test below.)"""
    marker = memstore.session_directory(tmp_path, "s") / "index" / "pending-cap-rewrite.json"
    seen: list[tuple[str, bool]] = []
    for point in ("cap.marker", "cap.synced", "cap.replaced", "index.sync", "manifest.sync", "cap.unmark"):
        fault.arm(point, lambda point=point, **context: seen.append((point, marker.exists())))
    log = memstore.open_session(tmp_path, "s", max_events=6)
    for _ in range(4):
        log.append(TURN_STARTED_EVENT)
        log.append(TURN_COMPLETED_EVENT)
    log.flush()
    assert seen == [
        ("cap.marker", False),
        ("cap.synced", True),
        ("cap.replaced", True),
        ("index.sync", True),
        ("cap.unmark", True),
    ], seen
    assert not marker.exists()
    log.close()


TURN_STARTED_EVENT = {"type": "turn.started"}
TURN_COMPLETED_EVENT = {"type": "turn.completed", "usage": {}}


def test_a_cap_rewrite_makes_each_step_durable_before_the_next(tmp_path):
    """The syscalls of a cap rewrite, as strace sees them: the log's copy, the summary's line, the
    marker and manifest.json's next version are synced before the copy replaces the log; the
    directory is synced; only then is manifest.json renamed in, and the directory synced again;
    the index's WAL is synced after that; the marker is removed last of all."""
    strace = shutil.which("strace")
    if strace is None:
        pytest.skip("strace is not installed")
    root = tmp_path / "store"
    script = (
        "import sys, memstore\n"
        "log = memstore.open_session(sys.argv[1], 's', max_events=6)\n"
        "for n in range(4):\n"
        "    log.append({'type': 'turn.started'})\n"
        "    log.append({'type': 'turn.completed', 'usage': {}})\n"
        "log.close()\n"
    )
    trace = tmp_path / "trace"
    proc = subprocess.run(
        [
            strace,
            "-f",
            "-y",
            "-qq",
            "-e",
            "trace=fsync,fdatasync,rename,renameat,renameat2,unlink,unlinkat,openat",
            "-o",
            str(trace),
            sys.executable,
            "-c",
            script,
            str(root),
        ],
        capture_output=True,
        timeout=120,
        env=support.writer_env(),
    )
    if proc.returncode != 0 and b"ptrace" in proc.stderr:
        pytest.skip(f"strace cannot trace here: {proc.stderr.decode()[:200]}")
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    # "PID call(args) = result": calls in the order they began (a call another thread interrupts
    # is printed "<unfinished ...>" and resumed later; every order checked is within one thread).
    calls = [
        line.split(None, 1)[1]
        for line in trace.read_text().splitlines()
        if " " in line and not line.split(None, 1)[1].startswith("<...")
    ]

    def first(predicate, after: int = 0) -> int:
        for i in range(after, len(calls)):
            if predicate(calls[i]):
                return i
        raise AssertionError(f"no such call after #{after}:\n" + "\n".join(calls[after : after + 60]))

    def synced(name: str, exact: bool = False):
        def match(call: str) -> bool:
            if not call.startswith(("fsync(", "fdatasync(")):
                return False
            path = call.split("<", 1)[1].split(">", 1)[0]
            return path.endswith(name) if exact else name in path

        return match

    def renamed(source: str, target: str):
        def match(call: str) -> bool:
            names = re.findall(r'"([^"]*)"', call)
            return call.startswith("rename") and len(names) >= 2 and source in names[-2] and names[-1].endswith(target)

        return match

    directory = str(memstore.session_directory(root, "s"))
    replaced = first(renamed(".events.jsonl.cap-", "/events.jsonl"))
    copied = max(i for i in range(replaced) if calls[i].startswith("openat") and ".events.jsonl.cap-" in calls[i])
    marker_named = first(renamed("pending-cap-rewrite.json.tmp-", "/pending-cap-rewrite.json"), copied)
    for name in (".events.jsonl.cap-", "pending-cap-rewrite.json", "eviction-summaries.jsonl", ".manifest.json.tmp-"):
        assert copied < first(synced(name), copied) < replaced, name
    assert marker_named < first(synced("/index", exact=True), marker_named) < replaced
    log_dir_synced = first(synced(directory, exact=True), replaced)
    manifest_named = first(renamed(".manifest.json.tmp-", "/manifest.json"), replaced)
    assert log_dir_synced < manifest_named, "manifest.json was renamed in before the log's rename was durable"
    dir_synced = first(synced(directory, exact=True), manifest_named)
    wal = first(synced("session.db-wal"), dir_synced)
    unmarked = first(lambda c: c.startswith("unlink") and "pending-cap-rewrite.json" in c, replaced)
    assert dir_synced < wal < unmarked, "the marker went before the index's WAL was synced"
