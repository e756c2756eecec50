"""The demonstration store: what ``memstore demo`` writes for the explorer to show.

:func:`write_demo_store` writes about thirty sessions that look like real coding-agent work,
through the public API only (``open_session`` / ``append`` with the events' own times,
``save_progress``, ``import_logs``): multi-turn tasks on four projects, shell commands with
real-looking output and exit codes, failing tests and then their fixes, file changes with
diffs, tool calls the user denied, a compaction, a failed and an aborted turn, token usage that
grows with the context, goals with milestones, and one Codex and one Claude Code session
imported from source files generated (in a temporary directory) from the formats' rules.

Everything is seeded: the same ``seed`` and ``sessions`` give the same logs, byte for byte. It
is idempotent and removes nothing: a session already written whole is left alone, a partial
one (an interrupted run: its events are the start of the demo's) is completed, and a session
of a demo name that holds anything else (someone's own session called ``demo``, or events
appended to a demo session) is left as it is, with a warning.

:func:`write_demo_session` still writes the classic three-turn session ``demo`` (one of the
store's sessions), and :func:`demo_events` yields its events.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import stat
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Optional

import orjson

from .session.log import SessionLog, open_session

logger = logging.getLogger("memstore")

DEFAULT_SESSIONS = 30
DEFAULT_SEED = 7
# Fixed, so the store is the same on every machine and its charts span the same days.
BASE_TIME = datetime(2026, 11, 2, 8, 30, tzinfo=UTC)
DAYS = 21

# --------------------------------------------------------------------------------------------
# The classic session ("demo"): three turns, a failing test, a fix, a green run.

_TEST_OUTPUT_FAIL = """running 12 tests
test parser::tests::parses_empty ... ok
test parser::tests::parses_nested ... ok
test store::tests::append_roundtrip ... FAILED

failures:

---- store::tests::append_roundtrip stdout ----
thread 'store::tests::append_roundtrip' panicked at src/store.rs:88:9:
assertion `left == right` failed
  left: 2
 right: 3

test result: FAILED. 11 passed; 1 failed; 0 ignored; 0 measured
"""

_TEST_OUTPUT_OK = (
    "running 12 tests\n"
    + "".join(f"test suite::case_{i:02d} ... ok\n" for i in range(12))
    + "\ntest result: ok. 12 passed; 0 failed; 0 ignored; 0 measured\n"
)

_DIFF = """--- a/src/store.rs
+++ b/src/store.rs
@@ -84,7 +84,7 @@ impl Store {
     pub fn append(&mut self, event: Event) -> Result<u64> {
-        self.buffer.push(event);
+        self.buffer.push(event.clone());
+        self.count += 1;
         Ok(self.count)
     }
"""


CLASSIC_MODEL = "claude-sonnet-4-5"  # a model the price table knows: every turn has a cost


def _usage(inp: int, cached: int, out: int, creation: int = 0) -> dict:
    return {"input_tokens": inp, "cached_input_tokens": cached, "cache_creation_tokens": creation, "output_tokens": out}


def demo_events(thread_id: str = "demo-run") -> Iterator[dict]:
    """The events of a three-turn agent run: a failing test run, a fix, a green run."""
    yield {"type": "thread.started", "thread_id": thread_id}
    # Turn 1: look around, run the tests, they fail.
    yield {"type": "turn.started"}
    yield {
        "type": "item.completed",
        "item": {
            "id": "r1",
            "type": "reasoning",
            "stage": "analysis",
            "text": "The user reports append_roundtrip fails. Run the suite first.",
        },
    }
    yield {
        "type": "item.completed",
        "item": {
            "id": "t1",
            "type": "tool_invocation",
            "tool_name": "read_file",
            "arguments": {"path": "src/store.rs"},
            "tool_call_id": "call_1",
            "status": "completed",
            "outcome": "success",
        },
    }
    yield {
        "type": "item.completed",
        "item": {
            "id": "t1:output",
            "type": "tool_output",
            "call_id": "t1",
            "tool_call_id": "call_1",
            "output": "pub struct Store { ... }",
            "exit_code": 0,
            "status": "completed",
        },
    }
    yield {
        "type": "item.completed",
        "item": {
            "id": "c1",
            "type": "command_execution",
            "command": "cargo test",
            "aggregated_output": _TEST_OUTPUT_FAIL,
            "exit_code": 101,
            "status": "failed",
        },
    }
    yield {
        "type": "turn.failed",
        "message": "cargo test failed: 1 test failed",
        "usage": _usage(5400, 0, 420),
        "model": CLASSIC_MODEL,
    }
    # Turn 2: fix the bug.
    yield {"type": "turn.started"}
    yield {
        "type": "item.completed",
        "item": {"id": "p2", "type": "plan", "text": "1. Count appended events\n2. Re-run cargo test"},
    }
    yield {
        "type": "item.completed",
        "item": {
            "id": "f2",
            "type": "file_change",
            "changes": [{"path": "src/store.rs", "kind": "update"}],
            "status": "completed",
            "unified_diff": _DIFF,
            "additions": 2,
            "deletions": 1,
        },
    }
    yield {
        "type": "item.completed",
        "item": {
            "id": "m2",
            "type": "agent_message",
            "text": "The append path never incremented the counter; fixed in src/store.rs.",
        },
    }
    yield {"type": "turn.completed", "usage": _usage(7100, 5200, 380), "model": CLASSIC_MODEL}
    # Turn 3: verify.
    yield {"type": "turn.started"}
    yield {
        "type": "item.completed",
        "item": {
            "id": "c3",
            "type": "command_execution",
            "command": "cargo test",
            "aggregated_output": _TEST_OUTPUT_OK,
            "exit_code": 0,
            "status": "completed",
        },
    }
    yield {
        "type": "item.completed",
        "item": {"id": "m3", "type": "agent_message", "text": "All 12 tests pass. The fix is in src/store.rs."},
    }
    yield {"type": "turn.completed", "usage": _usage(7900, 7000, 150), "model": CLASSIC_MODEL}
    yield {
        "type": "thread.completed",
        "thread_id": thread_id,
        "session_id": thread_id,
        "subtype": "success",
        "outcome_code": "completed",
        "result": "Fixed append_roundtrip.",
        "usage": _usage(20400, 12200, 950),
        "total_cost_usd": 0.0412,
        "num_turns": 3,
    }


def write_demo_session(root: os.PathLike | str, session_id: str = "demo") -> SessionLog:
    """Append the classic three-turn run to ``session_id`` under ``root`` and return the (open) log."""
    log = open_session(root, session_id)
    try:
        for event in demo_events(session_id):
            log.append(event)
    except BaseException:
        log.close()
        raise
    return log


# --------------------------------------------------------------------------------------------
# Projects and the work done on them


@dataclass(frozen=True)
class _Project:
    name: str
    cwd: str
    branch: str
    test: str
    build: str
    files: tuple[str, ...]
    model: str


_PROJECTS = (
    _Project(
        "tilecache",
        "/home/dev/src/tilecache",
        "main",
        "cargo test",
        "cargo build --release",
        ("src/cache.rs", "src/eviction.rs", "src/lib.rs", "tests/eviction.rs", "Cargo.toml"),
        "gpt-5-codex",
    ),
    _Project(
        "ledger-api",
        "/home/dev/src/ledger-api",
        "feat/refunds",
        "pytest -q",
        "python -m build",
        ("ledger/api.py", "ledger/models.py", "ledger/refunds.py", "tests/test_refunds.py", "pyproject.toml"),
        "claude-sonnet-4-5",
    ),
    _Project(
        "dashboard-web",
        "/home/dev/src/dashboard-web",
        "main",
        "npm test -- --run",
        "npm run build",
        (
            "src/components/UsageChart.tsx",
            "src/api/client.ts",
            "src/pages/Billing.tsx",
            "src/components/UsageChart.test.tsx",
            "package.json",
        ),
        "gpt-5",
    ),
    _Project(
        "queue-svc",
        "/home/dev/src/queue-svc",
        "fix/retry-backoff",
        "go test ./...",
        "go build ./cmd/queue",
        (
            "internal/queue/worker.go",
            "internal/queue/backoff.go",
            "internal/queue/worker_test.go",
            "cmd/queue/main.go",
            "go.mod",
        ),
        "claude-opus-4-1",
    ),
)

# (task kind, prompt template); {file} is one of the project's source files.
_TASKS = (
    ("fix", "The test for {stem} started failing after yesterday's merge. Find out why and fix it."),
    ("fix", "CI is red on {branch}: {test} fails. Please fix it without skipping tests."),
    ("feature", "Add a retry limit to {stem}, configurable, default 5, with tests."),
    ("feature", "Add pagination to the list endpoint in {file}; keep the old behaviour when no page is given."),
    ("refactor", "Split {file} into smaller functions; no behaviour change, the tests must stay green."),
    ("investigate", "Why does `{test}` take four minutes locally? Profile it and tell me what to change."),
    ("docs", "Write the missing docstrings in {file} and update the README section about it."),
    ("upgrade", "Upgrade the dependencies in {manifest} and fix whatever breaks."),
)


def _stem(path: str) -> str:
    return path.rsplit("/", 1)[-1].split(".", 1)[0]


def _test_output(project: _Project, ok: bool, rng: random.Random, failing: str) -> tuple[str, int]:
    """Output and exit code of a test run, in the project's tool's own format."""
    passed = rng.randint(18, 140)
    if project.test.startswith("cargo"):
        if ok:
            return (
                f"   Compiling {project.name} v0.4.2 ({project.cwd})\n    Finished `test` profile [unoptimized + "
                f"debuginfo] target(s) in 6.{rng.randint(10, 99)}s\n     Running unittests src/lib.rs\n\n"
                f"running {passed} tests\n"
                + "".join(f"test {_stem(f)}::tests::case_{i} ... ok\n" for i, f in enumerate(project.files[:3]))
                + f"\ntest result: ok. {passed} passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; "
                f"finished in 0.{rng.randint(10, 99)}s\n",
                0,
            )
        return (
            f"running {passed} tests\ntest {failing}::tests::evicts_least_recent ... FAILED\n\nfailures:\n\n"
            f"---- {failing}::tests::evicts_least_recent stdout ----\nthread '{failing}::tests::evicts_least_recent' "
            f"panicked at src/{failing}.rs:{rng.randint(40, 300)}:9:\nassertion `left == right` failed\n"
            f"  left: Some(3)\n right: None\n\ntest result: FAILED. {passed - 1} passed; 1 failed; 0 ignored\n\n"
            "error: test failed, to rerun pass `--lib`\n",
            101,
        )
    if project.test.startswith("pytest"):
        if ok:
            return (
                "." * min(passed, 70) + f"  [100%]\n{passed} passed in {rng.randint(1, 9)}.{rng.randint(10, 99)}s\n",
                0,
            )
        return (
            "." * 20
            + "F"
            + "." * 9
            + f"  [ 41%]\n=================================== FAILURES ===================================\n"
            f"___________________________ test_{failing}_partial ___________________________\n\n"
            f"    def test_{failing}_partial(client):\n        resp = client.post('/refunds', json={{'amount': 250}})\n"
            f">       assert resp.status_code == 201\nE       assert 422 == 201\n\ntests/test_{failing}.py:"
            f"{rng.randint(20, 90)}: AssertionError\n=========================== short test summary info "
            f"============================\nFAILED tests/test_{failing}.py::test_{failing}_partial - assert 422 == 201\n"
            f"1 failed, {passed - 1} passed in 3.{rng.randint(10, 99)}s\n",
            1,
        )
    if project.test.startswith("npm"):
        if ok:
            return (
                f"\n RUN  v2.1.4 {project.cwd}\n\n ✓ src/components/UsageChart.test.tsx (6 tests) 41ms\n"
                f" ✓ src/api/client.test.ts (9 tests) 18ms\n\n Test Files  {passed // 10} passed\n"
                f"      Tests  {passed} passed ({passed})\n   Duration  1.{rng.randint(10, 99)}s\n",
                0,
            )
        return (
            f"\n RUN  v2.1.4 {project.cwd}\n\n ❯ src/components/{failing}.test.tsx (6 tests | 1 failed) 52ms\n"
            f"   × {failing} > renders an empty state when there is no usage\n"
            "     → expected 'No data' to be 'No usage yet'\n\n Test Files  1 failed | 3 passed (4)\n"
            f"      Tests  1 failed | {passed - 1} passed ({passed})\n",
            1,
        )
    if ok:
        return (
            "".join(
                f"ok  \tqueue-svc/{d}\t0.{rng.randint(100, 999)}s\n"
                for d in ("internal/queue", "internal/store", "cmd/queue")
            ),
            0,
        )
    return (
        f"--- FAIL: Test{failing.title()}Backoff (0.{rng.randint(10, 99)}s)\n    {failing}_test.go:{rng.randint(20, 99)}: "
        "backoff after 3 retries = 800ms, want 400ms\nFAIL\nFAIL\tqueue-svc/internal/queue\t0.412s\n"
        "ok  \tqueue-svc/internal/store\t0.233s\nFAIL\n",
        1,
    )


# Per language (by file extension): a line a fix replaces, the lines it becomes, a regression
# test, and how a comment starts; so every diff reads like a change to a file of its kind.
_CODE = {
    "rs": {
        "comment": "//",
        "fixes": [
            (
                "        self.entries.remove(&key);",
                [
                    "        if let Some(entry) = self.entries.remove(&key) {",
                    "            self.bytes -= entry.len();",
                    "        }",
                ],
            ),
            ("        if retries > 3 {", ["        if retries > self.max_retries {"]),
            ("        Ok(self.count)", ["        self.count += 1;", "        Ok(self.count)"]),
        ],
        "context": ["    pub fn evict(&mut self, key: &Key) -> Result<()> {", "    }"],
        "test": [
            "#[test]",
            "fn evicts_least_recent_first() {",
            "    let mut cache = Cache::with_capacity(2);",
            '    cache.put(1, "a");',
            '    cache.put(2, "b");',
            '    cache.put(3, "c");',
            "    assert_eq!(cache.get(&1), None);",
            "}",
        ],
    },
    "py": {
        "comment": "#",
        "fixes": [
            ("        total = sum(items)", ["        total = sum(i.amount for i in items if not i.refunded)"]),
            (
                "    if amount > order.total:",
                [
                    "    if amount > order.total - order.refunded:",
                    "        raise RefundTooLarge(amount, order.remaining)",
                ],
            ),
            (
                "    return Page(rows)",
                [
                    '    page = params.get("page", 1)',
                    "    return Page(rows[(page - 1) * size : page * size], page=page)",
                ],
            ),
        ],
        "context": ["    def refund(self, order: Order, amount: Decimal) -> Refund:", "        return refund"],
        "test": [
            "def test_partial_refund_keeps_the_rest(client, order):",
            '    resp = client.post("/refunds", json={"order": order.id, "amount": 250})',
            "    assert resp.status_code == 201",
            "    assert order.remaining == 750",
        ],
    },
    "tsx": {
        "comment": "//",
        "fixes": [
            ("      return <Empty>No data</Empty>;", ["      return <Empty>No usage yet</Empty>;"]),
            ("  const page = 1;", ["  const page = params.page ?? 1;"]),
            (
                "  const rows = data.rows;",
                [
                    "  const rows = data?.rows ?? [];",
                    "  if (rows.length === 0) {",
                    "    return <Empty>No usage yet</Empty>;",
                    "  }",
                ],
            ),
        ],
        "context": ["export function UsageChart({ data }: UsageChartProps) {", "}"],
        "test": [
            'it("renders an empty state when there is no usage", () => {',
            "  render(<UsageChart data={{ rows: [] }} />);",
            '  expect(screen.getByText("No usage yet")).toBeInTheDocument();',
            "});",
        ],
    },
    "go": {
        "comment": "//",
        "fixes": [
            (
                "\tdelay := base * time.Duration(attempt)",
                ["\tdelay := base << uint(attempt-1)", "\tif delay > maxDelay {", "\t\tdelay = maxDelay", "\t}"],
            ),
            ("\tif retries > 3 {", ["\tif retries > w.maxRetries {"]),
            ("\treturn nil", ['\treturn fmt.Errorf("worker %d: %w", w.id, err)']),
        ],
        "context": ["func (w *Worker) backoff(attempt int) time.Duration {", "}"],
        "test": [
            "func TestBackoffDoubles(t *testing.T) {",
            "\tw := NewWorker(Config{Base: 100 * time.Millisecond})",
            "\tif got := w.backoff(3); got != 400*time.Millisecond {",
            '\t\tt.Fatalf("backoff(3) = %v, want 400ms", got)',
            "\t}",
            "}",
        ],
    },
}
_CODE["ts"] = _CODE["tsx"]


def _language(path: str) -> dict:
    return _CODE.get(path.rsplit(".", 1)[-1], _CODE["rs"])


def _diff(path: str, rng: random.Random) -> tuple[str, int, int]:
    """A unified diff of a fix to ``path``, in the file's own language; with its line counts."""
    code = _language(path)
    old, new = rng.choice(code["fixes"])
    first, last = code["context"]
    line = rng.randint(12, 240)
    text = (
        f"--- a/{path}\n+++ b/{path}\n@@ -{line},3 +{line},{2 + len(new)} @@\n {first}\n-{old}\n"
        + "".join(f"+{added}\n" for added in new)
        + f" {last}\n"
    )
    return text, len(new), 1


def _test_diff(path: str) -> tuple[str, int]:
    """A diff adding a regression test to the test file ``path``, in its language."""
    lines = [""] + _language(path)["test"]
    start = 40
    return (
        f"--- a/{path}\n+++ b/{path}\n@@ -{start},0 +{start + 1},{len(lines)} @@\n"
        + "".join(f"+{line}\n" for line in lines),
        len(lines),
    )


def _file_excerpt(path: str) -> str:
    """What ``read_file`` returns for ``path``: numbered lines of code in its language."""
    code = _language(path)
    first, last = code["context"]
    old, _new = code["fixes"][0]
    return "".join(
        f"{n:4d}  {text}\n" for n, text in enumerate([f"{code['comment']} {path}", "", first, old, last], start=1)
    )


class _Writer:
    """Builds one session's events with their times (the log keeps the source's time)."""

    def __init__(self, session_id: str, start: datetime, rng: random.Random):
        self.session_id = session_id
        self.now = start
        self.rng = rng
        self.events: list[tuple[dict, str]] = []
        self.items = 0

    def tick(self, lo: float = 1.0, hi: float = 20.0) -> str:
        self.now += timedelta(seconds=self.rng.uniform(lo, hi))
        return self.now.strftime("%Y-%m-%dT%H:%M:%S.") + f"{self.now.microsecond // 1000:03d}Z"

    def add(self, event: dict, lo: float = 1.0, hi: float = 20.0) -> None:
        self.events.append((event, self.tick(lo, hi)))

    def item(self, kind: str, lo: float = 1.0, hi: float = 20.0, **fields) -> str:
        self.items += 1
        item_id = f"item_{self.items}"
        self.add({"type": "item.completed", "item": {"id": item_id, "type": kind, **fields}}, lo, hi)
        return item_id


def _turn_usage(
    context: int, cached_before: int, requests: int, rng: random.Random, *, caches_writes: bool
) -> tuple[dict, int]:
    """The usage of a turn of ``requests`` model calls starting from a prompt of ``context``
    tokens (``cached_before`` of them in the provider's cache), and the prompt after it.

    Each call re-sends the whole prompt: its prefix from the previous call is read from the cache,
    the rest is new (Anthropic's models write most of it to the cache, OpenAI's have no cache
    writes); the answer and the tool's output join the prompt for the next call. So a turn's
    input is several times its prompt, mostly cached, as real agent turns are."""
    prompt, previous = context, cached_before
    inp = cached = written = out = 0
    for _ in range(requests):
        read = min(previous, prompt)
        inp += prompt
        cached += read
        if caches_writes:
            written += (prompt - read) * 9 // 10
        answer = rng.randint(60, 700)
        out += answer
        previous = prompt
        prompt += answer + rng.randint(200, 2_500)
    return _usage(inp, cached, out, written), prompt


def _envelope(
    session_id: str, prompt: str, project: _Project, target: str, rng: random.Random, touched: list[str], ts: str
) -> dict:
    """A VT Code memory envelope (schema 3), as the agent writes one at a compaction or at the
    end of its work: what it knows, so that it can go on after the history is gone."""
    facts = [
        {"fact": f"`{project.test}` is the test command of {project.name}", "source": "tool:run_pty_cmd"},
        {"fact": f"{project.name} builds with `{project.build}`", "source": "tool:run_pty_cmd"},
        {"fact": f"The code under change is in {target}", "source": "tool:read_file"},
        {
            "fact": rng.choice(
                [
                    f"{project.name} must stay compatible with the previous release",
                    "The user prefers small commits with the tests in the same commit",
                    f"Work happens on the {project.branch} branch; never push --force",
                ]
            ),
            "source": "user_assertion",
        },
    ]
    return {
        "session_id": session_id,
        "schema_version": 3,
        "summary": f"Working on {project.name}: {prompt} The failing case is understood; the fix is in "
        f"{target} and `{project.test}` is the check.",
        "objective": prompt,
        "constraints": ["Keep the public API unchanged", f"`{project.test}` must pass before stopping"],
        "grounded_facts": facts,
        "touched_files": touched,
        "open_questions": [
            rng.choice(
                [
                    "Should the old behaviour stay behind a flag?",
                    "Is the changelog updated by the release script or by hand?",
                ]
            )
        ],
        "verification_todo": [f"Run `{project.test}` on a clean checkout", f"Run `{project.build}`"],
        "generated_at": ts,
    }


def _generated_session(index: int, rng: random.Random) -> tuple[str, list[tuple[dict, str]], Optional[dict], str]:
    """One generated session: its id, its events with times, its progress ledger (or ``None``) and
    its first day; which features it shows depends on ``index`` so that every one appears."""
    project = _PROJECTS[index % len(_PROJECTS)]
    kind, template = _TASKS[(index * 3 + rng.randint(0, 1)) % len(_TASKS)]
    target = rng.choice(project.files[:4])
    day = (index * DAYS) // 30
    start = BASE_TIME + timedelta(days=day, hours=rng.randint(0, 9), minutes=rng.randint(0, 59))
    session_id = f"vt-{start:%Y%m%d-%H%M}-{project.name}-{kind}"
    prompt = template.format(
        stem=_stem(target), file=target, branch=project.branch, test=project.test, manifest=project.files[-1]
    )
    anthropic = project.model.startswith("claude")
    w = _Writer(session_id, start, rng)
    w.add(
        {
            "type": "thread.started",
            "thread_id": session_id,
            "source": {"agent": "vtcode", "agent_version": "0.43.2", "cwd": project.cwd, "git_branch": project.branch},
        },
        0,
        0,
    )
    context = rng.randint(9_000, 16_000)  # the prompt grows with every turn: usage grows too
    cached = 0
    turns = rng.randint(3, 7) if index % 9 else 9
    failing = _stem(target)
    aborted_at = 2 if index % 7 == 3 else None
    failed_at = turns if index % 10 == 5 else (2 if index % 10 == 8 else None)
    compact_at = 4 if turns >= 6 and index % 3 == 0 else None
    denied_at = 1 if index % 4 == 1 else None
    tracked = index % 3 != 1  # a progress ledger (and the goal it tracks) in two sessions of three
    touched: list[str] = []
    for number in range(1, turns + 1):
        w.add(
            {"type": "turn.started", "context": {"goal": prompt}}
            if tracked and number == 1
            else {"type": "turn.started"},
            20,
            600,
        )
        first_item = w.items
        if compact_at == number:
            # The context grew too big: the agent compacts it as the turn starts (usage drops),
            # and keeps what it knows in a memory envelope.
            before = context
            context = rng.randint(7_000, 9_000)
            cached = 0
            w.add(
                {
                    "type": "thread.compact_boundary",
                    "thread_id": session_id,
                    "trigger": "auto",
                    "mode": "provider",
                    "original_message_count": 40 + number * 6,
                    "compacted_message_count": 6,
                    "pre_tokens": before,
                },
                2,
                6,
            )
            w.add(
                {
                    "type": "memory.envelope",
                    "envelope": _envelope(session_id, prompt, project, target, rng, touched, w.tick(0, 0)),
                },
                0.1,
                1,
            )
        if number == 1:
            w.item("user_message", 0.5, 2, text=prompt)
        else:
            w.item(
                "user_message",
                0.5,
                2,
                text=rng.choice(
                    [
                        "Go on.",
                        "Looks right, continue with the tests.",
                        "Also handle the empty case, please.",
                        "Run the whole suite before you stop.",
                        "Keep the public API unchanged.",
                        f"Note that {project.name} must stay compatible with the previous release.",
                        "Can you explain why that fixes it?",
                    ]
                ),
            )
        w.item(
            "reasoning",
            2,
            12,
            stage="analysis",
            text=rng.choice(
                [
                    f"Start from {target}: read it, then run `{project.test}` to see the failure for myself.",
                    f"The failure mentions {failing}; the recent change to {target} is the likely cause.",
                    "Check what the tests expect before changing the implementation.",
                    "Keep the change small and re-run the suite afterwards.",
                ]
            ),
        )
        call = w.item(
            "tool_invocation",
            1,
            4,
            tool_name="read_file",
            arguments={"path": target, "max_lines": 200},
            tool_call_id=f"call_{w.items}",
            status="completed",
            outcome="success",
        )
        w.item(
            "tool_output",
            0.2,
            1,
            call_id=call,
            tool_call_id=f"call_{w.items - 1}",
            output=_file_excerpt(target),
            exit_code=0,
            status="completed",
        )
        if denied_at == number:
            w.add({"type": "permission.requested", "tool_name": "run_pty_cmd"}, 1, 3)
            w.add(
                {
                    "type": "permission.resolved",
                    "tool_name": "run_pty_cmd",
                    "decision": "deny",
                    "wait_ms": rng.randint(2000, 9000),
                },
                2,
                9,
            )
            w.item(
                "tool_invocation",
                0.1,
                1,
                tool_name="run_pty_cmd",
                arguments={"command": "git push --force origin HEAD"},
                tool_call_id=f"call_{w.items}",
                status="failed",
                outcome="permission_rejected",
            )
            w.item(
                "agent_message",
                2,
                8,
                text=f"Understood, I won't push. The change stays local on {project.branch} for you to review.",
            )
        if aborted_at == number:
            w.item(
                "command_execution",
                5,
                40,
                command=project.build,
                aggregated_output="   Compiling ...\n",
                status="in_progress",
            )
            usage, context = _turn_usage(context, cached, 2, rng, caches_writes=anthropic)
            w.add({"type": "turn.aborted", "reason": "interrupted", "usage": usage, "model": project.model}, 1, 5)
            cached = 0  # nothing was answered: the next call starts cold
            continue
        red = number == 1 or (number == 2 and rng.random() < 0.5)
        output, code = _test_output(project, ok=not red, rng=rng, failing=failing)
        w.item(
            "command_execution",
            5,
            90,
            command=project.test,
            aggregated_output=output,
            exit_code=code,
            status="completed" if code == 0 else "failed",
        )
        if red:
            w.item(
                "agent_message",
                2,
                15,
                text=f"`{project.test}` fails in {failing}: the test expects the new "
                "behaviour but the implementation still takes the old path. "
                f"I'll fix {target}.",
            )
            diff, additions, deletions = _diff(target, rng)
            w.item(
                "file_change",
                10,
                60,
                changes=[{"path": target, "kind": "update"}],
                status="completed",
                unified_diff=diff,
                additions=additions,
                deletions=deletions,
            )
            touched.append(target)
            if rng.random() < 0.4:
                new_test = project.files[3]
                test_diff, added = _test_diff(new_test)
                w.item(
                    "file_change",
                    5,
                    30,
                    changes=[{"path": new_test, "kind": "update"}],
                    status="completed",
                    unified_diff=test_diff,
                    additions=added,
                    deletions=0,
                )
                touched.append(new_test)
            output, code = _test_output(project, ok=True, rng=rng, failing=failing)
            w.item(
                "command_execution",
                5,
                90,
                command=project.test,
                aggregated_output=output,
                exit_code=code,
                status="completed",
            )
        elif rng.random() < 0.5:
            w.item(
                "command_execution",
                1,
                5,
                command="git status --short",
                aggregated_output=f" M {target}\n?? notes/{project.name}-todo.md\n",
                exit_code=0,
                status="completed",
            )
        if rng.random() < 0.3:
            w.item(
                "command_execution",
                2,
                10,
                command=f"rg -n 'TODO|FIXME' {target.rsplit('/', 1)[0]}",
                aggregated_output="",
                exit_code=1,
                status="failed",
            )
        w.item(
            "agent_message",
            3,
            20,
            text=rng.choice(
                [
                    f"Done: {target} now handles the case, and `{project.test}` passes.",
                    f"The suite is green. The root cause was in {target}; I added a regression test.",
                    "I made the change and verified it. Want me to open a pull request?",
                    f"Finished. Summary: one fix in {target}, tests pass, no API change.",
                ]
            ),
        )
        # One model call per step the agent took (each tool call, change and answer).
        requests = max(1, w.items - first_item - 1)
        usage, context = _turn_usage(context + rng.randint(50, 400), cached, requests, rng, caches_writes=anthropic)
        if failed_at == number:
            w.add(
                {
                    "type": "turn.failed",
                    "message": rng.choice(
                        [
                            "model provider error: 529 Overloaded (retried 3 times)",
                            "context window exceeded: 272,412 tokens requested, 272,000 allowed",
                        ]
                    ),
                    "usage": usage,
                    "model": project.model,
                },
                1,
                4,
            )
        else:
            w.add({"type": "turn.completed", "usage": usage, "model": project.model}, 1, 4)
        cached = context  # the next call re-reads this prompt from the provider's cache
    active = index % 11 == 10 or index == 0  # a few sessions are still going
    if index % 4 == 2:  # the agent leaves what it learnt for the next session
        w.add(
            {
                "type": "memory.envelope",
                "envelope": _envelope(session_id, prompt, project, target, rng, touched, w.tick(0, 0)),
            },
            1,
            3,
        )
    if not active:
        subtype = "error_during_execution" if failed_at == turns else "success"
        totals = [0, 0, 0, 0]
        for event, _ts in w.events:
            if event["type"] in ("turn.completed", "turn.failed", "turn.aborted"):
                for i, key in enumerate(
                    ("input_tokens", "cached_input_tokens", "cache_creation_tokens", "output_tokens")
                ):
                    totals[i] += event["usage"][key]
        # No total_cost_usd: VT Code records none for these models, so the explorer prices the
        # turns from the price table (the classic session shows a cost an agent reported).
        w.add(
            {
                "type": "thread.completed",
                "thread_id": session_id,
                "session_id": session_id,
                "subtype": subtype,
                "outcome_code": "completed" if subtype == "success" else "error",
                "result": "Task finished." if subtype == "success" else "The last turn failed.",
                "usage": _usage(totals[0], totals[1], totals[3], totals[2]),
                "num_turns": turns,
            },
            1,
            3,
        )
    ledger = None
    if tracked:
        progressed = 3 if not active and failed_at is None else rng.randint(1, 2)
        ledger = {
            "goal": prompt,
            "milestones": [
                ("m1", f"Reproduce the problem with `{project.test}`", "done"),
                ("m2", f"Fix {target}", "done" if progressed >= 2 else "in_progress"),
                ("m3", "Add a regression test", "done" if progressed >= 3 else "pending"),
                ("m4", "Update the changelog", "pending"),
            ],
            "known_issues": [f"{project.build} warns about an unused import in {project.files[2]}"],
            "updated_at": w.events[-1][1],
        }
    return session_id, w.events, ledger, f"{start:%Y-%m-%d}"


# --------------------------------------------------------------------------------------------
# Imported sessions: small Codex and Claude Code source files, written from the formats' rules.

_CODEX_ID = "019c7d10-5a1e-7c3b-9a5e-0000000d3e70"
_CLAUDE_ID = "5b0e7a4c-2f1d-4c8e-9b7a-0000000d3e70"
_CLAUDE_AGENT = "a7c41e9"  # the sub-agent the Claude session starts with its Task tool
IMPORTED_SESSIONS = (f"codex-{_CODEX_ID}", f"claude-{_CLAUDE_ID}", f"claude-{_CLAUDE_ID}-agent-{_CLAUDE_AGENT}")


def _codex_rollout(start: datetime) -> list[dict]:
    def t(seconds: float) -> str:
        at = start + timedelta(seconds=seconds)
        return at.strftime("%Y-%m-%dT%H:%M:%S.") + f"{at.microsecond // 1000:03d}Z"

    def line(seconds, kind, payload):
        return {"timestamp": t(seconds), "type": kind, "payload": payload}

    def tokens(seconds, inp, cached, out):
        usage = {
            "input_tokens": inp,
            "cached_input_tokens": cached,
            "output_tokens": out,
            "reasoning_output_tokens": out // 3,
            "total_tokens": inp + out,
        }
        return line(
            seconds,
            "event_msg",
            {
                "type": "token_count",
                "info": {"total_token_usage": usage, "last_token_usage": usage, "model_context_window": 272000},
                "rate_limits": {"primary": {"used_percent": 3.0, "window_minutes": 300, "resets_at": 1795000000}},
            },
        )

    cwd = "/home/dev/src/tilecache"
    exec_args = json.dumps({"cmd": "cargo clippy --all-targets -- -D warnings", "workdir": cwd})
    clippy = (
        "Chunk ID: 3f2a\nWall time: 14.2 seconds\nProcess exited with code 1\nOutput:\n"
        "error: this `if` has identical blocks\n  --> src/eviction.rs:118:9\n"
        "error: could not compile `tilecache` (lib) due to 1 previous error\n"
    )
    patch = (
        "*** Begin Patch\n*** Update File: src/eviction.rs\n@@\n-        if stale { self.drop(k) } else { self.drop(k) }\n"
        "+        if stale { self.drop(k) }\n*** End Patch"
    )
    return [
        line(
            0,
            "session_meta",
            {
                "id": _CODEX_ID,
                "timestamp": t(0),
                "cwd": cwd,
                "originator": "codex_cli_rs",
                "cli_version": "0.104.0",
                "source": "cli",
                "model_provider": "openai",
                "git": {"commit_hash": "9f1c2e7", "branch": "main"},
            },
        ),
        line(
            1,
            "turn_context",
            {
                "turn_id": "t1",
                "cwd": cwd,
                "approval_policy": "on-request",
                "sandbox_policy": {"type": "workspace-write"},
                "model": "gpt-5-codex",
                "summary": "auto",
            },
        ),
        line(1, "event_msg", {"type": "task_started", "turn_id": "t1", "model_context_window": 272000}),
        line(
            1,
            "event_msg",
            {
                "type": "user_message",
                "message": "Make clippy pass on tilecache.",
                "images": [],
                "local_images": [],
                "text_elements": [],
            },
        ),
        line(
            6,
            "response_item",
            {
                "type": "reasoning",
                "summary": [{"type": "summary_text", "text": "Run clippy and read what it reports."}],
                "encrypted_content": "gAAAA",
            },
        ),
        line(
            7,
            "response_item",
            {"type": "function_call", "name": "exec_command", "arguments": exec_args, "call_id": "call_a1"},
        ),
        line(22, "response_item", {"type": "function_call_output", "call_id": "call_a1", "output": clippy}),
        line(
            30,
            "response_item",
            {
                "type": "custom_tool_call",
                "name": "apply_patch",
                "input": patch,
                "call_id": "call_a2",
                "status": "completed",
            },
        ),
        line(
            31,
            "response_item",
            {
                "type": "custom_tool_call_output",
                "call_id": "call_a2",
                "output": "Success. Updated the following files:\nM src/eviction.rs\n",
            },
        ),
        line(
            33,
            "response_item",
            {"type": "function_call", "name": "exec_command", "arguments": exec_args, "call_id": "call_a3"},
        ),
        line(
            47,
            "response_item",
            {
                "type": "function_call_output",
                "call_id": "call_a3",
                "output": "Chunk ID: 3f2b\nWall time: 13.8 seconds\nProcess exited with code 0\n"
                "Output:\n    Finished `dev` profile in 13.7s\n",
            },
        ),
        line(
            50,
            "response_item",
            {
                "type": "message",
                "role": "assistant",
                "phase": "final_answer",
                "content": [
                    {
                        "type": "output_text",
                        "text": "Clippy passes now: the duplicated branch in src/eviction.rs is gone.",
                    }
                ],
            },
        ),
        tokens(50, 48210, 31000, 1830),
        line(50, "event_msg", {"type": "task_complete", "turn_id": "t1", "last_agent_message": "Clippy passes now."}),
    ]


def _claude_transcript(start: datetime) -> list[dict]:
    def t(seconds: float) -> str:
        at = start + timedelta(seconds=seconds)
        return at.strftime("%Y-%m-%dT%H:%M:%S.") + f"{at.microsecond // 1000:03d}Z"

    base = {
        "isSidechain": False,
        "userType": "external",
        "cwd": "/home/dev/src/dashboard-web",
        "sessionId": _CLAUDE_ID,
        "version": "2.0.28",
        "gitBranch": "main",
    }
    usage = {
        "input_tokens": 12,
        "cache_creation_input_tokens": 2100,
        "cache_read_input_tokens": 18400,
        "output_tokens": 240,
        "service_tier": "standard",
    }

    def user(uuid, parent, seconds, content, **extra):
        return {
            **base,
            "parentUuid": parent,
            "type": "user",
            "message": {"role": "user", "content": content},
            "uuid": uuid,
            "timestamp": t(seconds),
            **extra,
        }

    def assistant(uuid, parent, seconds, msg_id, block, out=240):
        return {
            **base,
            "parentUuid": parent,
            "type": "assistant",
            "requestId": f"req_{msg_id}",
            "message": {
                "model": "claude-sonnet-4-5-20250929",
                "id": msg_id,
                "type": "message",
                "role": "assistant",
                "content": [block],
                "stop_reason": None,
                "stop_sequence": None,
                "usage": {**usage, "output_tokens": out},
            },
            "uuid": uuid,
            "timestamp": t(seconds),
        }

    found = (
        "The empty state is rendered in src/components/UsageChart.tsx (line 42: `<Empty>No data</Empty>`); "
        "its snapshot is src/components/__snapshots__/UsageChart.test.tsx.snap."
    )
    return [
        user("u1", None, 0, "The usage chart shows 'No data' for new accounts; it should say 'No usage yet'."),
        assistant(
            "a0",
            "u1",
            3,
            "msg_0",
            {
                "type": "tool_use",
                "id": "toolu_0",
                "name": "Task",
                "input": {
                    "description": "Find the empty state",
                    "subagent_type": "Explore",
                    "prompt": "Find where the usage chart renders its empty state, and any snapshot of it.",
                },
            },
            out=90,
        ),
        user(
            "u0",
            "a0",
            30,
            [{"type": "tool_result", "tool_use_id": "toolu_0", "content": [{"type": "text", "text": found}]}],
            toolUseResult={
                "status": "completed",
                "agentId": _CLAUDE_AGENT,
                "prompt": "Find where the usage chart renders its empty state, and any snapshot of it.",
                "content": [{"type": "text", "text": found}],
                "totalDurationMs": 26000,
                "totalTokens": 9630,
                "totalToolUseCount": 2,
            },
        ),
        assistant("a1", "u0", 34, "msg_1", {"type": "text", "text": "I'll look at the chart component first."}),
        assistant(
            "a2",
            "a1",
            35,
            "msg_1",
            {"type": "tool_use", "id": "toolu_1", "name": "Grep", "input": {"pattern": "No data", "path": "src"}},
        ),
        user(
            "u2",
            "a2",
            38,
            [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_1",
                    "content": "src/components/UsageChart.tsx:42:      return <Empty>No data</Empty>;",
                }
            ],
        ),
        assistant(
            "a3",
            "u2",
            43,
            "msg_2",
            {
                "type": "tool_use",
                "id": "toolu_2",
                "name": "Edit",
                "input": {
                    "file_path": "/home/dev/src/dashboard-web/src/components/UsageChart.tsx",
                    "old_string": "<Empty>No data</Empty>",
                    "new_string": "<Empty>No usage yet</Empty>",
                },
            },
            out=310,
        ),
        user(
            "u3",
            "a3",
            44,
            [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_2",
                    "content": "The file src/components/UsageChart.tsx has been updated.",
                }
            ],
        ),
        assistant(
            "a4",
            "u3",
            47,
            "msg_3",
            {"type": "tool_use", "id": "toolu_3", "name": "Bash", "input": {"command": "npm test -- --run UsageChart"}},
        ),
        user(
            "u4",
            "a4",
            48,
            [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_3",
                    "is_error": True,
                    "content": "The user doesn't want to proceed with this tool use. The tool use was "
                    "rejected (eg. if it was a file edit, the new_string was NOT written to "
                    "the file). STOP what you are doing and wait for the user to tell you how "
                    "to proceed.",
                }
            ],
        ),
        user("u5", "u4", 72, "Don't run the tests, I'll do it. Just update the snapshot too."),
        assistant(
            "a5",
            "u5",
            78,
            "msg_4",
            {
                "type": "tool_use",
                "id": "toolu_4",
                "name": "Edit",
                "input": {
                    "file_path": "/home/dev/src/dashboard-web/src/components/__snapshots__/UsageChart.test.tsx.snap",
                    "old_string": "No data",
                    "new_string": "No usage yet",
                },
            },
        ),
        user(
            "u6",
            "a5",
            79,
            [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_4",
                    "content": "The file src/components/__snapshots__/UsageChart.test.tsx.snap has been updated.",
                }
            ],
        ),
        assistant(
            "a6", "u6", 82, "msg_5", {"type": "text", "text": "Updated the empty-state text and its snapshot."}, out=120
        ),
    ]


def _claude_subagent(start: datetime) -> list[dict]:
    """The sub-agent the Claude session's ``Task`` started: its own transcript (a sidechain),
    which Claude Code keeps in ``<session>/subagents/agent-<id>.jsonl``."""

    def t(seconds: float) -> str:
        at = start + timedelta(seconds=seconds)
        return at.strftime("%Y-%m-%dT%H:%M:%S.") + f"{at.microsecond // 1000:03d}Z"

    base = {
        "isSidechain": True,
        "userType": "external",
        "cwd": "/home/dev/src/dashboard-web",
        "sessionId": _CLAUDE_ID,
        "version": "2.0.28",
        "gitBranch": "main",
        "agentId": _CLAUDE_AGENT,
    }

    def line(uuid, parent, seconds, kind, message, **extra):
        return {
            **base,
            "parentUuid": parent,
            "type": kind,
            "message": message,
            "uuid": uuid,
            "timestamp": t(seconds),
            **extra,
        }

    def answer(msg_id, block, inp, read, written, out):
        return {
            "model": "claude-haiku-4-5-20251001",
            "id": msg_id,
            "type": "message",
            "role": "assistant",
            "content": [block],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {
                "input_tokens": inp,
                "cache_creation_input_tokens": written,
                "cache_read_input_tokens": read,
                "output_tokens": out,
                "service_tier": "standard",
            },
        }

    return [
        line(
            "s1",
            None,
            4,
            "user",
            {"role": "user", "content": "Find where the usage chart renders its empty state, and any snapshot of it."},
        ),
        line(
            "s2",
            "s1",
            7,
            "assistant",
            answer(
                "msg_s1",
                {"type": "tool_use", "id": "toolu_s1", "name": "Grep", "input": {"pattern": "No data", "path": "src"}},
                4,
                0,
                4100,
                60,
            ),
            requestId="req_s1",
        ),
        line(
            "s3",
            "s2",
            8,
            "user",
            {
                "role": "user",
                "content": [
                    {
                        "tool_use_id": "toolu_s1",
                        "type": "tool_result",
                        "content": "src/components/UsageChart.tsx:42:      "
                        "return <Empty>No data</Empty>;\n"
                        "src/components/__snapshots__/"
                        "UsageChart.test.tsx.snap:7:  No data",
                    }
                ],
            },
        ),
        line(
            "s4",
            "s3",
            26,
            "assistant",
            answer(
                "msg_s2",
                {
                    "type": "text",
                    "text": "The empty state is rendered in "
                    "src/components/UsageChart.tsx (line 42); its snapshot is "
                    "src/components/__snapshots__/UsageChart.test.tsx.snap.",
                },
                3,
                4100,
                260,
                180,
            ),
            requestId="req_s2",
        ),
    ]


def _write_jsonl(path: Path, lines: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(line, separators=(",", ":")) + "\n" for line in lines))


def _sources_directory(root: Path) -> Path:
    """Where the generated sources are written for the import (removed after it): the same
    place for every run on ``root``, so that an import a crash interrupted is resumed from the
    same source, which the importer completes by appending the rest (from a fresh temporary
    directory it was "already imported from" the crashed run's leftover one, and never
    completed). Outside the store, which the importer refuses to read from; in the temporary
    directory, private to this user (someone else's directory of that name is not used)."""
    digest = hashlib.sha256(os.fsencode(os.path.realpath(root))).hexdigest()[:16]
    path = Path(tempfile.gettempdir()) / f"memstore-demo-sources-{digest}"
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        st = os.lstat(path)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
            return Path(tempfile.mkdtemp(prefix="memstore-demo-sources-"))
    return path


def _write_sources(base: Path) -> list[Path]:
    start = BASE_TIME + timedelta(days=DAYS - 4, hours=3)
    codex = base / "codex" / "2026" / "11" / "19" / f"rollout-{start:%Y-%m-%dT%H-%M-%S}-{_CODEX_ID}.jsonl"
    claude = base / "claude" / "projects" / "-home-dev-src-dashboard-web" / f"{_CLAUDE_ID}.jsonl"
    subagent = claude.parent / _CLAUDE_ID / "subagents" / f"agent-{_CLAUDE_AGENT}.jsonl"
    _write_jsonl(codex, _codex_rollout(start))
    _write_jsonl(claude, _claude_transcript(start + timedelta(days=1, hours=2)))
    _write_jsonl(subagent, _claude_subagent(start + timedelta(days=1, hours=2)))
    return [codex, claude, subagent]  # in the order of IMPORTED_SESSIONS


def _import_sources(root: Path) -> tuple[dict, list[str], list[str]]:
    """Import the generated Codex and Claude sources into the sessions that lack them or hold
    only their start (an interrupted run). Returns the import report as a dict (empty when
    nothing was imported), and the sessions already whole and those kept (holding other events)."""
    import shutil

    from .importers import import_logs

    whole: list[str] = []
    kept: list[str] = []
    base = _sources_directory(root)
    sources = _write_sources(base)
    try:
        # What a complete import gives, from a scratch store: a session that holds it is whole,
        # one that holds its start is completed, and one that holds anything else is kept (the
        # importer would re-import it into a new generation, removing what was added to it).
        with tempfile.TemporaryDirectory(prefix="memstore-demo-") as scratch:
            import_logs(scratch, sources, settle_seconds=0)
            want = {sid: _records_there(Path(scratch), sid) for sid in IMPORTED_SESSIONS}
        todo = []
        for sid, source in zip(IMPORTED_SESSIONS, sources):
            there = _records_there(root, sid)
            if there is not None:
                there, expected = _source_as_name(there), _source_as_name(want[sid] or [])
                if there == expected:
                    whole.append(sid)
                    continue
                if there != expected[: len(there)]:
                    logger.warning("demo: session %s holds events that are not the demo's; left as it is", sid)
                    kept.append(sid)
                    continue
            todo.append(source)
        # settle_seconds=0: the sources are complete, so the sessions end (thread.completed).
        report = import_logs(root, todo, settle_seconds=0) if todo else None
    finally:
        shutil.rmtree(base, ignore_errors=True)
    if report is None:
        return {}, whole, kept
    for problem in report.problems:
        logger.warning("demo import: %s:%s: %s", problem.path, problem.line, problem.reason)
    return report.to_dict(), whole, kept


def _source_as_name(records: list) -> list:
    """The records with the imported source's path as its file name only: a session an earlier
    version imported from a temporary directory is still the demo's."""
    if records and records[0][0].get("type") == "thread.started":
        event, ts = records[0]
        source = event.get("source")
        if isinstance(source, dict) and isinstance(source.get("path"), str):
            records = [({**event, "source": {**source, "path": os.path.basename(source["path"])}}, ts), *records[1:]]
    return records


# --------------------------------------------------------------------------------------------
# The store


@dataclass
class DemoReport:
    """What :func:`write_demo_store` did: sessions ``written`` (or completed), ``skipped``
    (already whole), ``kept`` (a session of a demo name holding something else, left as it is),
    the ``imported`` sessions, and the events written."""

    root: str
    written: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    imported: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)
    events: int = 0

    @property
    def sessions(self) -> int:
        return len(self.written) + len(self.skipped) + len(self.imported)

    def to_dict(self) -> dict:
        return {
            "root": self.root,
            "written": self.written,
            "skipped": self.skipped,
            "imported": self.imported,
            "kept": self.kept,
            "events": self.events,
            "sessions": self.sessions,
        }


def demo_plan(
    sessions: int = DEFAULT_SESSIONS, seed: int = DEFAULT_SEED
) -> list[tuple[str, list[tuple[dict, Optional[str]]], Optional[dict]]]:
    """The sessions the demo store holds besides the imported ones: ``(id, [(event, ts)], ledger)``.

    The first is the classic ``demo`` session; the others are generated from ``seed``."""
    plan: list = []
    classic_start = BASE_TIME + timedelta(days=DAYS - 1, hours=6)
    classic = []
    for i, event in enumerate(demo_events("demo")):
        at = classic_start + timedelta(seconds=i * 7)
        classic.append((event, at.strftime("%Y-%m-%dT%H:%M:%S.000Z")))
    plan.append(
        (
            "demo",
            classic,
            {
                "goal": "Make store::tests::append_roundtrip pass without skipping tests",
                "milestones": [
                    ("m1", "Reproduce the problem with `cargo test`", "done"),
                    ("m2", "Count appended events in Store::append", "done"),
                    ("m3", "Run the whole suite green", "done"),
                    ("m4", "Add a changelog entry", "pending"),
                ],
                "known_issues": ["`cargo clippy` still warns about a needless clone in src/store.rs"],
                "updated_at": classic[-1][1],
            },
        )
    )
    rng = random.Random(seed)
    for index in range(max(0, sessions - 1 - len(IMPORTED_SESSIONS))):
        session_id, events, ledger, _day = _generated_session(index, random.Random(rng.getrandbits(64)))
        plan.append((session_id, events, ledger))
    return plan


def write_demo_store(
    root: os.PathLike | str,
    sessions: int = DEFAULT_SESSIONS,
    seed: int = DEFAULT_SEED,
    *,
    progress: Optional[Callable[[int, int], None]] = None,
) -> DemoReport:
    """Write the demonstration store under ``root`` (about ``sessions`` sessions) and return what
    was done. Idempotent; ``progress(done, total)`` is called after each session."""
    from .layout import DERIVED_DIR, MEMORY_FILE, SESSIONS_DIR
    from .views.memory_view import ENVELOPE_EVENT, refresh_memory_view, write_session_memory_view
    from .views.progress import Milestone, ProgressLedger, milestone_status_from_str, progress_path, save_progress

    root = Path(root)
    report = DemoReport(str(root))
    plan = demo_plan(sessions, seed)
    total = len(plan) + 1
    for done, (session_id, events, ledger) in enumerate(plan, start=1):
        there = _records_there(root, session_id)
        remembers = any(event.get("type") == ENVELOPE_EVENT for event, _ts in events)
        if there == _as_read_back(events):
            report.skipped.append(session_id)
            if progress_path(root, session_id).exists():
                ledger = None  # written with the session; someone may have moved it on since
            if remembers and not (root / SESSIONS_DIR / session_id / DERIVED_DIR / MEMORY_FILE).exists():
                write_session_memory_view(root, session_id)  # a view, regenerated from the log
        elif there is not None and there != _as_read_back(events[: len(there)]):
            logger.warning("demo: session %s holds events that are not the demo's; left as it is", session_id)
            report.kept.append(session_id)
            ledger = None
        else:
            # Absent, or the start of the demo's (an interrupted run): write the rest.
            # Bulk durability: one sync at close instead of one per turn (nothing here is live).
            done_already = len(there or ())
            with open_session(root, session_id, max_events=0, durability="none") as log:
                for event, ts in events[done_already:]:
                    log.append(event, ts=ts)
                if remembers:  # derived/memory.json, from the log's memory envelopes and history
                    refresh_memory_view(log)
            report.written.append(session_id)
            report.events += len(events) - done_already
        if ledger is not None:
            progress_ledger = ProgressLedger.new(session_id, ledger["goal"])
            progress_ledger.set_milestones(
                [
                    Milestone(id=m, description=d, status=milestone_status_from_str(s))
                    for m, d, s in ledger["milestones"]
                ]
            )
            for issue in ledger["known_issues"]:
                progress_ledger.add_known_issue(issue)
            progress_ledger.confidence = 0.85
            progress_ledger.updated_at = ledger["updated_at"]
            save_progress(root, session_id, progress_ledger)
        if progress is not None:
            progress(done, total)
    imported, whole, kept = _import_sources(root)
    report.skipped.extend(whole)
    report.kept.extend(kept)
    report.imported.extend(sid for sid in IMPORTED_SESSIONS if sid in imported.get("sessions", ()))
    report.events += imported.get("events_appended", 0)
    if progress is not None:
        progress(total, total)
    return report


def _records_there(root: Path, session_id: str) -> Optional[list[tuple[dict, Optional[str]]]]:
    """The ``(event, ts)`` of every record of the session, or ``None`` when there is none."""
    from .errors import SessionNotFound
    from .reader import read_session

    try:
        with read_session(root, session_id) as reader:
            return [(record.event, record.ts) for record in reader.iter_records()]
    except SessionNotFound:
        return None


def _as_read_back(events: list[tuple[dict, Optional[str]]]) -> list[tuple[dict, Optional[str]]]:
    """The plan's events as the log gives them back (JSON: tuples become lists)."""
    return [(orjson.loads(orjson.dumps(event)), ts) for event, ts in events]
