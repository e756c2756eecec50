"""Generate a realistic archive of coding-agent history, deterministic from a seed.

    python bench/archive.py DEST --sessions 1000 [--seed N] [--scale F] [--jobs J]

writes, in the agents' real layouts,

- ``DEST/.claude/projects/<slug>/<sessionId>.jsonl``, with sub-agents in
  ``<sessionId>/subagents/agent-<id>.jsonl`` (2.1.2 on) or ``agent-<id>.jsonl`` beside the
  session (before), and compaction summarizers as ``agent-acompact-<hex>.jsonl``;
- ``DEST/.codex/sessions/YYYY/MM/DD/rollout-<local time>-<thread id>.jsonl`` in the three
  rollout styles (legacy, 0.40-like, 0.104-like), a few with a review sub-agent rollout;

and prints the totals. ``generate(dest, sessions, seed, scale)`` does the same from Python and
returns an :class:`ArchiveSummary`. Import it with ``bench/`` on ``sys.path``.

The archive spans July 2025 to November 2026: each session's date picks the agent versions and
models of its time (Claude Code 1.0 to 2.1, Codex legacy to 0.104 styles), a project (a few
projects get most sessions, as for a real developer), and a size. Main-file sizes are
log-normal around 110 KB (about 95% between 10 KB and 1 MB) with 0.8% of sessions between 10
and 100 MB; ``scale`` multiplies every size. Every file is dated (mtime) at its last line, so
an importer sees finished, settled sessions.

Text comes from ``archive_text``: a vocabulary of common English and technical words sampled by
Zipf rank, mixed with each project's identifiers, classes and paths, and tool outputs shaped
like the real ones (test runs, compiler errors, diffs, grep hits, file contents).
"""

from __future__ import annotations

import argparse
import calendar
import os
import random
import shutil
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))

from archive_claude import ClaudeSession  # noqa: E402
from archive_codex import CodexSession  # noqa: E402
from archive_text import Project, Texts, hash_seed, make_project  # noqa: E402
from archive_turns import ARCHIVE_END_MS, Agent, SessionSpec  # noqa: E402

GENERATOR_VERSION = 2
"""Bump when the same seed would produce different files (benchmarks cache archives by it)."""

START_MS = calendar.timegm((2025, 7, 1, 0, 0, 0)) * 1000
END_MS = ARCHIVE_END_MS
MEDIAN_BYTES = 110_000
SIGMA = 1.15
TAIL_SHARE = 0.008
TAIL_BYTES = (10_000_000, 100_000_000)
SPAN_MS_PER_BYTE = 60.0  # a generous bound of how long a session of a given size runs (about 30 KB and
# 30 minutes per turn): a session starts early enough to end before END_MS
CLAUDE_SHARE = 0.55


def _date_ms(year: int, month: int, day: int) -> int:
    return calendar.timegm((year, month, day, 0, 0, 0)) * 1000


# (until, versions, models): the agent versions and models in use before each date.
CLAUDE_ERAS = (
    (_date_ms(2025, 9, 29), ("1.0.98", "1.0.113", "1.0.120"), ("claude-sonnet-4-20250514", "claude-opus-4-1-20250805")),
    (
        _date_ms(2025, 11, 24),
        ("2.0.14", "2.0.28", "2.0.37"),
        ("claude-sonnet-4-5-20250929", "claude-haiku-4-5-20251001", "claude-opus-4-1-20250805"),
    ),
    (_date_ms(2026, 1, 12), ("2.0.55", "2.1.1"), ("claude-opus-4-5-20251101", "claude-sonnet-4-5-20250929")),
    (
        END_MS + 1,
        ("2.1.14", "2.1.29", "2.1.42"),
        ("claude-opus-4-5-20251101", "claude-sonnet-4-5-20250929", "claude-haiku-4-5-20251001"),
    ),
)
CODEX_ERAS = (
    (_date_ms(2025, 9, 9), ("0.20.0", "0.29.0"), ("gpt-5", "codex-mini-latest")),
    (_date_ms(2025, 12, 15), ("0.39.0", "0.40.0", "0.46.0"), ("gpt-5-codex", "gpt-5", "gpt-5.1-codex")),
    (END_MS + 1, ("0.98.0", "0.104.0", "0.107.0"), ("gpt-5.2-codex", "gpt-5.3-codex", "gpt-5.1-codex-mini")),
)


@dataclass
class ArchiveSummary:
    """What ``generate`` wrote."""

    dest: Path
    seed: int
    scale: float
    sessions: int = 0
    claude_sessions: int = 0
    codex_sessions: int = 0
    subagent_files: int = 0
    files: int = 0
    bytes: int = 0
    lines: int = 0
    largest_file: int = 0
    versions: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def roots(self) -> list[Path]:
        """The two folders an importer is pointed at."""
        return [self.dest / ".claude" / "projects", self.dest / ".codex" / "sessions"]

    def describe(self) -> str:
        versions = ", ".join(f"{k} x{v}" for k, v in sorted(self.versions.items()))
        return (
            f"{self.files:,} files, {self.bytes / 1e6:,.1f} MB, {self.lines:,} lines; sessions: "
            f"{self.sessions:,} ({self.claude_sessions:,} Claude Code, {self.codex_sessions:,} Codex) "
            f"plus {self.subagent_files:,} sub-agent files; largest file {self.largest_file / 1e6:,.1f} MB; "
            f"versions: {versions}; generated in {self.seconds:.1f}s"
        )


def _era(
    eras: Sequence[tuple[int, tuple[str, ...], tuple[str, ...]]], ms: int
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    for until, versions, models in eras:
        if ms < until:
            return versions, models
    return eras[-1][1], eras[-1][2]


def plan_sessions(sessions: int, seed: int, scale: float) -> list[SessionSpec]:
    """The archive's sessions: agent, version, model, start time, project and size of each."""
    if sessions < 1:
        raise ValueError("sessions must be at least 1")
    if not scale > 0:
        raise ValueError("scale must be > 0")
    r = random.Random(hash_seed(seed, "plan"))
    n_projects = max(3, min(150, round(1.2 * sessions**0.5)))
    project_weights = [1.0 / (k + 1) for k in range(n_projects)]
    specs = []
    for index in range(sessions):
        # Use grows over the period: later dates are more likely.
        start = START_MS + int((END_MS - START_MS - 86_400_000) * r.random() ** 0.7)
        agent = Agent.CLAUDE if r.random() < CLAUDE_SHARE else Agent.CODEX
        if r.random() < TAIL_SHARE:
            size = TAIL_BYTES[0] * (TAIL_BYTES[1] / TAIL_BYTES[0]) ** r.random()
        else:
            size = min(8_000_000.0, r.lognormvariate(0.0, SIGMA) * MEDIAN_BYTES)
        target = max(1, int(size * scale))
        start = max(START_MS, min(start, END_MS - 86_400_000 - int(target * SPAN_MS_PER_BYTE)))
        versions, models = _era(CLAUDE_ERAS if agent is Agent.CLAUDE else CODEX_ERAS, start)
        specs.append(
            SessionSpec(
                index=index,
                seed=hash_seed(seed, "session", index),
                agent=agent,
                version=r.choice(versions),
                model=r.choice(models),
                start_ms=start,
                project=r.choices(range(n_projects), project_weights)[0],
                target_bytes=target,
            )
        )
    return specs


_PROJECTS: dict[tuple[int, int], Project] = {}


def _project(seed: int, index: int) -> Project:
    key = (seed, index)
    project = _PROJECTS.get(key)
    if project is None:
        project = _PROJECTS[key] = make_project(seed, index)
    return project


def _write_batch(dest: str, seed: int, specs: list[SessionSpec]) -> list[tuple[str, str, list[tuple[int, int]]]]:
    """Write some sessions; return (agent, version, [(size, lines) of each file]) per session."""
    claude_root = Path(dest) / ".claude" / "projects"
    codex_root = Path(dest) / ".codex" / "sessions"
    out = []
    for spec in specs:
        project = _project(seed, spec.project)
        texts = Texts(project, spec.seed)
        if spec.agent is Agent.CLAUDE:
            written = ClaudeSession(spec, project, texts, claude_root).write()
        else:
            written = CodexSession(spec, project, texts, codex_root).write()
        out.append((spec.agent.value, spec.version, [(w.size, w.lines) for w in written]))
    return out


def generate(
    dest: os.PathLike | str,
    sessions: int,
    seed: int = 0,
    scale: float = 1.0,
    *,
    jobs: Optional[int] = None,
    overwrite: bool = False,
) -> ArchiveSummary:
    """Write an archive of ``sessions`` sessions under ``dest`` (see the module docstring).

    The same ``sessions``, ``seed`` and ``scale`` give byte-identical files and mtimes, whatever
    ``jobs`` (worker processes; default: one per core). ``dest/.claude/projects`` and
    ``dest/.codex/sessions`` must not hold files yet, unless ``overwrite`` (they are emptied).
    """
    started = time.perf_counter()
    dest = Path(dest).absolute()
    summary = ArchiveSummary(dest=dest, seed=seed, scale=scale)
    for root in summary.roots:
        if root.exists() and any(root.iterdir()):
            if not overwrite:
                raise FileExistsError(f"{root} is not empty: generate into an empty place, or pass overwrite")
            shutil.rmtree(root)
        root.mkdir(parents=True, exist_ok=True)
    specs = plan_sessions(sessions, seed, scale)
    # Batches of sessions of one project keep each worker's project cache small.
    specs_by_project = sorted(specs, key=lambda s: (s.project, s.index))
    batch = 25
    batches = [specs_by_project[i : i + batch] for i in range(0, len(specs_by_project), batch)]
    jobs = jobs or os.cpu_count() or 1
    if jobs == 1 or len(batches) == 1:
        results = [_write_batch(str(dest), seed, b) for b in batches]
    else:
        with ProcessPoolExecutor(jobs) as pool:
            results = list(pool.map(_write_batch, [str(dest)] * len(batches), [seed] * len(batches), batches))
    for result in results:
        for agent, version, files in result:
            summary.sessions += 1
            if agent == Agent.CLAUDE.value:
                summary.claude_sessions += 1
            else:
                summary.codex_sessions += 1
            key = f"{agent} {version}"
            summary.versions[key] = summary.versions.get(key, 0) + 1
            summary.subagent_files += len(files) - 1
            summary.files += len(files)
            for size, lines in files:
                summary.bytes += size
                summary.lines += lines
                summary.largest_file = max(summary.largest_file, size)
    summary.seconds = time.perf_counter() - started
    return summary


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dest", type=Path, help="where .claude/projects and .codex/sessions are written")
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--scale", type=float, default=1.0, help="multiplies every session's size")
    parser.add_argument("--jobs", type=int, default=None, help="worker processes (default: one per core)")
    parser.add_argument("--force", action="store_true", help="empty the two archive folders first")
    args = parser.parse_args(argv)
    try:
        summary = generate(args.dest, args.sessions, args.seed, args.scale, jobs=args.jobs, overwrite=args.force)
    except (FileExistsError, ValueError) as exc:
        print(f"archive: {exc}", file=sys.stderr)
        return 2
    print(f"archive {summary.dest} (seed {summary.seed}, scale {summary.scale:g}):")
    print(f"  {summary.describe()}")
    for root in summary.roots:
        print(f"  {root}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
