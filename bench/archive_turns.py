"""What happens in a turn, independent of the agent that logs it: the prompt, the model's steps
(reasoning, a progress note, tool calls with their results) and how the turn ends.

``plan_turn`` draws a turn from a session's ``Texts``; the Claude and Codex writers render the
same plan in their own line formats (a file read is Claude's ``Read`` tool and a ``sed -n`` run
by Codex, an edit is Claude's ``Edit`` and a Codex ``apply_patch``, and so on).
"""

from __future__ import annotations

import enum
import random
from dataclasses import dataclass, field
from typing import Optional, Union

import archive_vocab as V
from archive_text import Edit, Texts


@dataclass
class Shell:
    command: str
    output: str
    exit_code: int
    seconds: float


@dataclass
class Read:
    path: str
    start: int
    lines: list[str]
    total: int


@dataclass
class Grep:
    pattern: str
    matches: list[str]
    files: list[str]


@dataclass
class Glob:
    pattern: str
    files: list[str]


@dataclass
class Change:
    edit: Edit


@dataclass
class Write:
    path: str
    lines: list[str]


@dataclass
class Plan:
    items: list[tuple[str, str]]


@dataclass
class Web:
    query: str
    results: list[tuple[str, str]]
    summary: str


@dataclass
class Mcp:
    server: str
    tool: str
    arguments: dict
    result: str
    is_error: bool


@dataclass
class Task:
    """A sub-agent run: its own turn, logged in its own file."""

    description: str
    agent_type: str
    turn: Turn


Action = Union[Shell, Read, Grep, Glob, Change, Write, Plan, Web, Mcp, Task]


@dataclass
class Step:
    """One model response: optional reasoning and note, then the tool calls it made."""

    reasoning: Optional[str]
    message: Optional[str]
    actions: list[Action]


class Agent(enum.Enum):
    CLAUDE = "claude"
    CODEX = "codex"


@dataclass
class SessionSpec:
    """One session of the archive: who logged it, when, in which project, and how big its
    main file is meant to grow (the writer stops starting turns once it is reached)."""

    index: int
    seed: int
    agent: Agent
    version: str
    model: str
    start_ms: int
    project: int
    target_bytes: int


ARCHIVE_END_MS = 1_794_700_800_000
"""2026-11-15T00:00:00Z: no line of the archive is dated later (an importer would take a line
dated in its future for a wrong clock)."""


def turn_gap(r: random.Random, clock: int) -> int:
    """Milliseconds between the end of a turn and the next prompt: mostly seconds to minutes,
    sometimes a day (the session was resumed); only seconds once the archive's end is near."""
    if clock > ARCHIVE_END_MS - 86_400_000:
        return r.randint(1000, 10_000)
    if r.random() < 0.02:
        return r.randint(3_600_000, 30 * 3_600_000)
    return r.randint(20_000, 900_000)


def version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in version.split("."))


class Outcome(enum.Enum):
    COMPLETED = "completed"
    INTERRUPTED = "interrupted"  # the user stopped the turn
    DECLINED = "declined"  # the user refused the last tool call, then stopped the turn
    FAILED = "failed"  # the model API failed (Claude) / the stream broke (Codex)


@dataclass
class Turn:
    prompt: str
    steps: list[Step]
    answer: Optional[str]
    outcome: Outcome
    queued: Optional[str] = None  # a prompt typed while the turn ran
    meta: dict = field(default_factory=dict)


# How often each kind of action is drawn (the order of the branches in _action).
WEIGHTS = (0.26, 0.22, 0.12, 0.04, 0.15, 0.03, 0.05, 0.02, 0.03, 0.025, 0.04)
# A turn of a small session keeps to the actions whose results are small.
LIGHT_WEIGHTS = (0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.3, 0.0, 0.0, 0.0, 0.7)
LIGHT_BUDGET = 30_000


def _action(t: Texts, allow_task: bool, failing: list[bool], light: bool = False) -> Action:
    r = t.r
    weights = list(LIGHT_WEIGHTS if light else WEIGHTS)
    if not allow_task:
        weights[9] = 0.0
    kind = r.choices(range(len(weights)), weights)[0]
    if kind == 0:
        path = t.path()
        start, lines, total = t.read_range(path)
        return Read(path, start, lines, total)
    if kind == 1:
        if r.random() < 0.45:
            # The first test run of a turn fails more often than the later ones.
            fail = r.random() < (0.45 if failing[0] else 0.12)
            failing[0] = False
            command, output, code = t.test_run(fail)
        else:
            command, output, code = t.shell()
        return Shell(command, output, code, round(r.uniform(0.05, 60.0), 3))
    if kind == 2:
        pattern, matches, files = t.grep()
        return Grep(pattern, matches, files)
    if kind == 3:
        ext = V.EXTENSIONS[t.p.language]
        files = [p for p in t.p.all_paths if p.endswith(ext)][: r.randint(3, 60)]
        return Glob(f"**/*{ext}", files)
    if kind == 4:
        return Change(t.edit(t.path()))
    if kind == 5:
        path, lines = t.new_file()
        return Write(path, lines)
    if kind == 6:
        return Plan(t.plan())
    if kind == 7:
        query = " ".join(t.words(r.randint(3, 7))).replace("`", "")
        results = [
            (
                t.title(),
                f"https://{r.choice(('docs.rs', 'stackoverflow.com', 'github.com', 'developer.mozilla.org', 'docs.python.org'))}/"
                f"{r.choice(V.ID_NOUNS)}/{r.choice(V.ID_VERBS)}-{r.choice(V.ID_NOUNS)}",
            )
            for _ in range(r.randint(3, 10))
        ]
        return Web(query, results, t.paragraphs(r.randint(40, 250)))
    if kind == 8:
        server, tool = r.choice(V.MCP_TOOLS)
        args = (
            {"owner": t.p.package, "repo": t.p.name, "number": r.randint(1, 4000)}
            if server in ("github", "linear")
            else {"query": " ".join(t.words(r.randint(2, 8))).replace("`", "")}
        )
        result = (
            "{"
            + ", ".join(f'"{v}": "{t.prose(r.randint(3, 30))}"' for v in r.sample(t.p.variables, r.randint(2, 8)))
            + "}"
        )
        return Mcp(server, tool, args, result, r.random() < 0.05)
    if kind == 9:
        sub = plan_turn(t, allow_task=False, size=r.randint(2, 10), allow_failure=False)
        sub.prompt = t.prose(r.randint(20, 120))
        return Task(" ".join(t.words(r.randint(2, 5))).replace("`", ""), r.choice(V.SUBAGENT_TYPES), sub)
    if r.random() < 0.5:
        command, output, code = t.git_status()
    else:
        command, output, code = t.listing()
    return Shell(command, output, code, round(r.uniform(0.01, 2.0), 3))


def plan_turn(
    t: Texts, *, allow_task: bool, size: Optional[int] = None, allow_failure: bool = True, budget: Optional[int] = None
) -> Turn:
    """A turn of ``size`` steps (drawn when not given: mostly a few, sometimes dozens). With a
    ``budget`` (bytes the session may still grow), the turn has about one step per 8 KB of it,
    and under ``LIGHT_BUDGET`` only actions with small results."""
    r = t.r
    n_steps = size if size is not None else min(60, 1 + int(r.expovariate(1 / 5)))
    light = budget is not None and budget < LIGHT_BUDGET
    if budget is not None and size is None:
        n_steps = max(1, min(n_steps, budget // 8000))
    failing = [True]
    steps = []
    for _ in range(n_steps):
        reasoning = t.reasoning(long=r.random() < 0.1 and not light) if r.random() < 0.55 else None
        message = t.commentary() if r.random() < 0.25 else None
        count = 1 if r.random() < 0.8 or light else r.randint(2, 4)
        steps.append(Step(reasoning, message, [_action(t, allow_task, failing, light) for _ in range(count)]))
    roll = r.random() if allow_failure else 1.0
    outcome = (
        Outcome.INTERRUPTED
        if roll < 0.04
        else Outcome.DECLINED
        if roll < 0.07
        else Outcome.FAILED
        if roll < 0.085
        else Outcome.COMPLETED
    )
    answer = t.answer() if outcome is Outcome.COMPLETED else None
    queued = t.prompt() if r.random() < 0.04 and outcome is Outcome.COMPLETED else None
    return Turn(t.prompt(), steps, answer, outcome, queued)
