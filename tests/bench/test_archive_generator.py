"""The benchmark archive generator (bench/archive.py): what it writes is a valid agent history
that memstore imports without a single problem, and the same seed always writes the same bytes."""

from __future__ import annotations

import collections
import os
import re
import sys
from pathlib import Path

import orjson
import pytest

import memstore

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import archive  # noqa: E402

SESSIONS = 20
SCALE = 0.5


def _files(summary: archive.ArchiveSummary) -> dict[str, tuple[bytes, int]]:
    """Every file of an archive by its path below dest: (content, mtime in ns)."""
    found = {}
    for root in summary.roots:
        for path in root.rglob("*.jsonl"):
            found[str(path.relative_to(summary.dest))] = (path.read_bytes(), path.stat().st_mtime_ns)
    return found


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> archive.ArchiveSummary:
    return archive.generate(tmp_path_factory.mktemp("archive"), SESSIONS, seed=3, scale=SCALE, jobs=1)


def test_archive_uses_the_agents_layouts(generated: archive.ArchiveSummary) -> None:
    """Claude Code sessions sit in projects/<slug>/<uuid>.jsonl (sub-agents below or beside them),
    Codex rollouts in sessions/YYYY/MM/DD/rollout-<time>-<uuid>.jsonl; the summary counts what is there."""
    files = _files(generated)
    assert len(files) == generated.files
    assert sum(len(content) for content, _ in files.values()) == generated.bytes
    assert generated.sessions == SESSIONS == generated.claude_sessions + generated.codex_sessions
    assert generated.claude_sessions > 0 and generated.codex_sessions > 0
    uuid = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
    claude_main = re.compile(rf"\.claude/projects/-[^/]+/{uuid}\.jsonl$")
    claude_agent = re.compile(rf"\.claude/projects/-[^/]+/(?:{uuid}/subagents/)?agent-[0-9a-z-]+\.jsonl$")
    codex = re.compile(
        rf"\.codex/sessions/\d{{4}}/\d{{2}}/\d{{2}}/rollout-\d{{4}}-\d{{2}}-\d{{2}}T\d{{2}}-\d{{2}}-\d{{2}}-{uuid}\.jsonl$"
    )
    kinds: collections.Counter = collections.Counter()
    for name in files:
        kind = (
            "claude"
            if claude_main.search(name)
            else "agent"
            if claude_agent.search(name)
            else "codex"
            if codex.search(name)
            else "other"
        )
        kinds[kind] += 1
    assert kinds["other"] == 0, [
        n for n in files if not (claude_main.search(n) or claude_agent.search(n) or codex.search(n))
    ]
    assert kinds["claude"] == generated.claude_sessions
    assert kinds["claude"] + kinds["agent"] + kinds["codex"] == generated.files


def test_no_line_is_dated_after_the_archive_end(generated: archive.ArchiveSummary) -> None:
    """Every file's mtime (its last line's time) is before the archive's fixed end, so an import
    run any day after it sees no line dated in its future."""
    for name, (_content, mtime_ns) in _files(generated).items():
        assert mtime_ns <= archive.END_MS * 1_000_000, name


def test_every_file_imports_cleanly(generated: archive.ArchiveSummary, tmp_path: Path) -> None:
    """The current importer reads every generated file without a problem or a skipped line, each
    file becomes one session, and every session is finished (the files are dated in the past)."""
    report = memstore.import_logs(tmp_path / "store", generated.roots)
    assert report.problems == []
    assert report.lines_skipped == 0
    assert report.sources == report.sessions_created == generated.files
    sessions = memstore.list_sessions(tmp_path / "store")
    assert len(sessions) == generated.files
    assert all(s.status == "completed" for s in sessions), collections.Counter(s.status for s in sessions)
    agents = collections.Counter(s.session_id.split("-", 1)[0] for s in sessions)
    assert agents["claude"] >= generated.claude_sessions and agents["codex"] >= generated.codex_sessions
    memstore.refresh_catalog(tmp_path / "store")
    assert memstore.search_memory(tmp_path / "store", "error test")


def test_text_is_varied(generated: archive.ArchiveSummary) -> None:
    """The text has a realistic vocabulary: thousands of distinct words, none dominating."""
    words: collections.Counter = collections.Counter()
    for content, _ in _files(generated).values():
        for line in content.splitlines()[:200]:
            words.update(w.lower() for w in re.findall(rb"[A-Za-z][a-z]{2,}", line))
    top, top_count = words.most_common(1)[0]
    assert len(words) > 3000
    assert top_count / sum(words.values()) < 0.08, top


def test_generation_is_deterministic(generated: archive.ArchiveSummary, tmp_path: Path) -> None:
    """The same seed and sizes give the same files, bytes and mtimes, with or without worker
    processes; another seed gives another archive."""
    again = archive.generate(tmp_path / "again", SESSIONS, seed=3, scale=SCALE, jobs=2)
    assert _files(again) == _files(generated)
    other = archive.generate(tmp_path / "other", SESSIONS, seed=4, scale=SCALE, jobs=1)
    assert set(_files(other)) != set(_files(generated))


def test_refuses_to_mix_into_an_existing_archive(generated: archive.ArchiveSummary) -> None:
    """Generating into folders that already hold files is an error, not a silent merge."""
    with pytest.raises(FileExistsError):
        archive.generate(generated.dest, 2, seed=3, scale=SCALE, jobs=1)


def test_scale_multiplies_the_sizes(tmp_path: Path) -> None:
    """A smaller scale gives smaller sessions of the same plan (the tiny-session archives of
    the benchmark rely on it)."""
    small = archive.generate(tmp_path / "small", 10, seed=5, scale=0.02, jobs=1)
    large = archive.generate(tmp_path / "large", 10, seed=5, scale=0.5, jobs=1)
    assert small.sessions == large.sessions == 10
    assert small.bytes * 5 < large.bytes
    for content, _ in _files(small).values():
        assert all(isinstance(orjson.loads(line), dict) for line in content.splitlines())
    assert os.path.isdir(small.roots[0]) and os.path.isdir(small.roots[1])
