"""The MCP tests' store: realistic sessions of several agents, secrets among them, and a client session."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import memstore
from memstore.views.memory_view import write_session_memory_view

REPO = Path(__file__).resolve().parents[2]
CORPUS = [
    json.loads(line)
    for line in (REPO / "tests" / "fixtures" / "secrets" / "corpus.jsonl").read_text().splitlines()
    if line.strip()
]
# A token in a one-line env dump of 5,000 characters, cut in two by the search chunks' 2,000-
# character windows: neither piece alone is recognizable as a token.
STRADDLING_TOKEN = "ghp_R8mK2vQ9xLp4Tz7Wc1Nb6Hd3Fs5Gj0Ya2UeK"
SECRETS = sorted({s["value"] for entry in CORPUS for s in entry["secrets"]} | {STRADDLING_TOKEN})

LEDGER = "codex-7f3a91c2-ledger-pagination"
TILECACHE = "claude-91c2e4d0-tilecache-eviction"
TILECACHE_CORE = "claude-5d10b7aa-tilecache-core-clippy"
TILECACHE_OLD = "codex-aa0173f4-tilecache-old"
SECRETS_SESSION = "vt-20261122-0930-infra-secrets"
LEDGER_CWD = "/home/dev/src/ledger-api"
TILECACHE_CWD = "/home/dev/src/tilecache"


def usage(prompt: int, cached: int, output: int, writes: int = 0) -> dict:
    return {
        "input_tokens": prompt,
        "cached_input_tokens": cached,
        "cache_creation_tokens": writes,
        "output_tokens": output,
    }


_MODULES = [
    "ledger/models.py",
    "ledger/api/views.py",
    "ledger/api/serializers.py",
    "ledger/pagination.py",
    "ledger/db/queries.py",
    "tests/test_models.py",
    "tests/test_views.py",
]
_NAMES = [
    "list_paginates_with_cursor",
    "cursor_roundtrip",
    "empty_page_has_no_next",
    "page_size_is_capped",
    "legacy_offset_still_works",
    "ordering_is_stable",
    "deleted_rows_are_skipped",
    "cursor_is_opaque",
    "invalid_cursor_is_rejected",
    "totals_match_the_ledger",
]
_WORDS = [
    "account",
    "balance",
    "entry",
    "posting",
    "journal",
    "cursor",
    "offset",
    "created_at",
    "amount",
    "currency",
    "ledger",
    "queryset",
    "paginator",
    "response",
    "status_code",
    "payload",
    "fixture",
    "transaction",
]


def failing_pytest_log(lines: int = 420, seed: int = 11) -> str:
    """A long, varied pytest log (tens of KB): test ids, tracebacks, assertion diffs."""
    rng = random.Random(seed)
    out = [
        "============================= test session starts ==============================",
        "platform linux -- Python 3.12.7, pytest-8.3.3, pluggy-1.5.0",
        "rootdir: /home/dev/src/ledger-api",
        f"collected {lines // 6} items",
        "",
    ]
    for i in range(lines):
        name = rng.choice(_NAMES)
        module = rng.choice(_MODULES)
        kind = rng.random()
        if kind < 0.4:
            out.append(
                f"tests/test_models.py::test_{name}[page_size={rng.choice([10, 25, 50, 100])}] "
                f"{rng.choice(['PASSED', 'PASSED', 'FAILED'])}"
            )
        elif kind < 0.7:
            out.append(
                f'  File "/home/dev/src/ledger-api/{module}", line {rng.randint(12, 480)}, in '
                f"{rng.choice(_WORDS)}_{rng.choice(_WORDS)}"
            )
        elif kind < 0.9:
            a, b = rng.sample(_WORDS, 2)
            out.append(
                f"E       AssertionError: expected {a}={rng.randint(0, 999)} but the {b} had "
                f"{rng.randint(0, 999)} ({rng.choice(['next cursor missing', 'duplicate row', 'wrong order'])})"
            )
        else:
            out.append(
                f"    {rng.choice(_WORDS)} = {rng.choice(_WORDS)}.filter({rng.choice(_WORDS)}__gt=cursor)"
                f".order_by('{rng.choice(_WORDS)}')[:page_size]"
            )
        out.append(f"line {i} of the log: {' '.join(rng.sample(_WORDS, 5))}")
    out.append("=========================== short test summary info ============================")
    out.append("FAILED tests/test_models.py::test_list_paginates_with_cursor - AssertionError: next cursor missing")
    out.append(f"================== 1 failed, {lines // 6 - 1} passed in 3.41s ==================")
    return "\n".join(out)


LONG_OUTPUT = failing_pytest_log()


def env_dump_line(token: str, at: int = 1_990, length: int = 5_000) -> str:
    """``env`` of a CI job as one line of JSON, with ``token`` starting at character ``at``."""
    rng = random.Random(5)
    pairs = []
    while True:
        key = f"{rng.choice(['CI', 'RUNNER', 'BUILD', 'JOB', 'PIP', 'NODE'])}_{rng.choice(_WORDS).upper()}_{len(pairs)}"
        pair = f'"{key}":"{rng.choice(_WORDS)}-{rng.randint(1000, 99999)}"'
        head = "{" + ",".join(pairs + [pair]) + ',"GITHUB_TOKEN":"'
        if len(head) > at:
            break
        pairs.append(pair)
    head = "{" + ",".join(pairs) + ","
    room = at - len(head) - len('"RUNNER_TEMP":"') - len('","GITHUB_TOKEN":"')
    temp = ("/home/runner/work/ledger-api/" + "/".join(rng.choice(_WORDS) for _ in range(200)))[:room]
    head += '"RUNNER_TEMP":"' + temp + '","GITHUB_TOKEN":"'
    assert len(head) == at
    line = head + token + '"'
    while len(line) < length:
        line += f',"{rng.choice(_WORDS).upper()}_{len(line)}":"{rng.choice(_WORDS)}"'
    return line + "}"


def item(item_id: str, kind: str, **fields: Any) -> dict:
    return {"type": "item.completed", "item": {"id": item_id, "type": kind, **fields}}


def _write(root: Path, session_id: str, events: list[tuple[dict, str]]) -> None:
    with memstore.open_session(root, session_id) as log:
        for event, ts in events:
            log.append(event, ts=ts)


def _thread(session_id: str, agent: str, cwd: str, branch: str, **extra: Any) -> dict:
    return {
        "type": "thread.started",
        "thread_id": session_id,
        "source": {"agent": agent, "agent_version": "1.0.0", "cwd": cwd, "git_branch": branch, **extra},
    }


@dataclass
class StoreInfo:
    """The store and what was written to it, for the tests to compare with."""

    root: Path
    turn_ends: dict[str, list[dict]] = field(default_factory=dict)


def build_store(root: Path) -> StoreInfo:
    """Five sessions in three repositories (one a subdirectory, one a name-prefix of another),
    with long outputs, a failed turn, a reported cost, an unknown model, memory facts, and one
    session holding every secret of the corpus."""
    info = StoreInfo(root)
    ledger_ends = [
        {"type": "turn.completed", "usage": usage(52_000, 40_000, 1_800), "model": "gpt-5-codex"},
        {"type": "turn.completed", "usage": usage(61_000, 52_000, 2_100), "model": "gpt-5-codex"},
    ]
    _write(
        root,
        LEDGER,
        [
            (
                _thread(LEDGER, "codex", LEDGER_CWD, "feature/pagination", model_provider="openai"),
                "2026-11-10T10:00:00Z",
            ),
            ({"type": "turn.started"}, "2026-11-10T10:00:01Z"),
            (
                item(
                    "1",
                    "user_message",
                    text="Add cursor pagination to the list endpoint in ledger/models.py; keep the "
                    "old behaviour when no cursor is given.",
                ),
                "2026-11-10T10:00:02Z",
            ),
            (
                item("2", "reasoning", text="Run the model tests first to see what the pagination change breaks."),
                "2026-11-10T10:00:09Z",
            ),
            (
                item(
                    "3",
                    "command_execution",
                    command="pytest -q tests/test_models.py",
                    aggregated_output=LONG_OUTPUT,
                    exit_code=1,
                    status="failed",
                ),
                "2026-11-10T10:01:30Z",
            ),
            (
                item(
                    "4",
                    "agent_message",
                    text="test_list_paginates_with_cursor fails: the next cursor is missing when the page is full.",
                ),
                "2026-11-10T10:01:41Z",
            ),
            (ledger_ends[0], "2026-11-10T10:01:42Z"),
            ({"type": "turn.started"}, "2026-11-10T10:20:00Z"),
            (item("5", "user_message", text="Go ahead and fix it, then run the whole suite."), "2026-11-10T10:20:01Z"),
            (
                item("6", "file_change", changes=[{"path": "ledger/models.py", "kind": "update"}], status="completed"),
                "2026-11-10T10:21:10Z",
            ),
            (
                item(
                    "7",
                    "command_execution",
                    command="pytest -q",
                    aggregated_output="212 passed in 9.87s",
                    exit_code=0,
                    status="completed",
                ),
                "2026-11-10T10:22:00Z",
            ),
            (
                item(
                    "8", "agent_message", text="Fixed: the paginator now emits next_cursor on full pages. 212 passed."
                ),
                "2026-11-10T10:22:05Z",
            ),
            (ledger_ends[1], "2026-11-10T10:22:06Z"),
        ],
    )
    info.turn_ends[LEDGER] = ledger_ends
    tilecache_ends = [
        {
            "type": "turn.failed",
            "message": "cargo test failed: 1 test failed",
            "usage": usage(18_400, 9_000, 640, 2_000),
            "model": "claude-sonnet-4-5-20250929",
        },
        {
            "type": "turn.completed",
            "usage": usage(22_000, 18_000, 900, 1_000),
            "model": "claude-sonnet-4-5-20250929",
            "total_cost_usd": 0.0412,
        },
    ]
    _write(
        root,
        TILECACHE,
        [
            (_thread(TILECACHE, "claude", TILECACHE_CWD, "main"), "2026-11-20T13:30:00Z"),
            ({"type": "turn.started"}, "2026-11-20T13:30:01Z"),
            (
                item("1", "user_message", text="cargo test fails in eviction after the LRU change; find out why."),
                "2026-11-20T13:30:02Z",
            ),
            (
                item(
                    "2",
                    "command_execution",
                    command="cargo test",
                    exit_code=101,
                    status="failed",
                    aggregated_output="running 106 tests\ntest eviction::tests::evicts_least_recent ... FAILED\n"
                    "thread 'eviction::tests::evicts_least_recent' panicked at src/eviction.rs:88:9:\n"
                    "assertion `left == right` failed\n  left: 3\n right: 4\n"
                    "test result: FAILED. 105 passed; 1 failed",
                ),
                "2026-11-20T13:31:10Z",
            ),
            (tilecache_ends[0], "2026-11-20T13:31:12Z"),
            ({"type": "turn.started"}, "2026-11-20T13:40:00Z"),
            (
                item("3", "user_message", text="Note that the CI runner uses Rust 1.82, so no let-chains."),
                "2026-11-20T13:40:01Z",
            ),
            (
                item(
                    "4",
                    "agent_message",
                    text="The LRU list was rotated before the capacity check; evicts_least_recent "
                    "passes now and cargo test is green.",
                ),
                "2026-11-20T13:44:00Z",
            ),
            (tilecache_ends[1], "2026-11-20T13:44:01Z"),
        ],
    )
    info.turn_ends[TILECACHE] = tilecache_ends
    core_end = {"type": "turn.completed", "usage": usage(9_000, 0, 300), "model": "mystery-model-9"}
    _write(
        root,
        TILECACHE_CORE,
        [
            (_thread(TILECACHE_CORE, "claude", TILECACHE_CWD + "/crates/core", "main"), "2026-11-21T09:00:00Z"),
            ({"type": "turn.started"}, "2026-11-21T09:00:01Z"),
            (item("1", "user_message", text="Make cargo clippy pass on the core crate."), "2026-11-21T09:00:02Z"),
            (
                item(
                    "2",
                    "command_execution",
                    command="cargo clippy --all-targets -- -D warnings",
                    exit_code=0,
                    status="completed",
                    aggregated_output="Finished dev profile in 4.1s",
                ),
                "2026-11-21T09:02:00Z",
            ),
            (core_end, "2026-11-21T09:02:30Z"),
        ],
    )
    info.turn_ends[TILECACHE_CORE] = [core_end]
    old_end = {"type": "turn.completed", "usage": usage(4_000, 0, 200), "model": "gpt-5-codex"}
    _write(
        root,
        TILECACHE_OLD,
        [
            (_thread(TILECACHE_OLD, "codex", TILECACHE_CWD + "-old", "legacy"), "2026-11-05T08:00:00Z"),
            ({"type": "turn.started"}, "2026-11-05T08:00:01Z"),
            (
                item("1", "user_message", text="Why does cargo test hang on the old tilecache branch?"),
                "2026-11-05T08:00:02Z",
            ),
            (
                item("2", "agent_message", text="cargo test waits on a lock the eviction thread never releases."),
                "2026-11-05T08:03:00Z",
            ),
            (old_end, "2026-11-05T08:03:01Z"),
        ],
    )
    info.turn_ends[TILECACHE_OLD] = [old_end]
    events: list[tuple[dict, str]] = [
        (_thread(SECRETS_SESSION, "vtcode", "/home/dev/src/infra", "main"), "2026-11-22T09:30:00Z")
    ]
    for minute, entry in enumerate(CORPUS):
        ts = f"2026-11-22T{10 + minute // 60:02d}:{minute % 60:02d}:00Z"
        events.append(({"type": "turn.started"}, ts))
        lifecycle_end = None
        for event in entry["events"]:
            if event["type"] == "turn.failed":
                lifecycle_end = event
            else:
                events.append((event, ts))
        events.append(
            (lifecycle_end or {"type": "turn.completed", "usage": usage(3_000, 1_000, 200), "model": "gpt-5-codex"}, ts)
        )
    ts = "2026-11-22T11:00:00Z"
    events += [
        ({"type": "turn.started"}, ts),
        (
            item(
                "env",
                "command_execution",
                command="env | jq -c .",
                aggregated_output=env_dump_line(STRADDLING_TOKEN),
                exit_code=0,
                status="completed",
            ),
            ts,
        ),
        ({"type": "turn.completed", "usage": usage(3_000, 1_000, 200), "model": "gpt-5-codex"}, ts),
    ]
    _write(root, SECRETS_SESSION, events)
    for session_id in (TILECACHE, SECRETS_SESSION, LEDGER):
        write_session_memory_view(root, session_id)
    return info


class McpSession:
    """A live MCP client session over stdio with ``memstore mcp`` running as a subprocess;
    ``call(tool, arguments)`` returns ``(text, is_error)``."""

    def __init__(self, portal: Any, client: Any):
        self.portal = portal
        self.client = client

    def call(self, name: str, arguments: Any = None) -> tuple[str, bool]:
        result = self.portal.call(self.client.call_tool, name, arguments)
        assert len(result.content) == 1 and result.content[0].type == "text"
        return result.content[0].text, bool(result.is_error)

    def ok(self, name: str, arguments: Any = None) -> dict:
        text, is_error = self.call(name, arguments)
        assert not is_error, text
        return json.loads(text)

    def error(self, name: str, arguments: Any = None) -> str:
        text, is_error = self.call(name, arguments)
        assert is_error, text
        return text

    def list_tools(self) -> list:
        return self.portal.call(self.client.list_tools).tools
