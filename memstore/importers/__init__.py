"""Importing other agents' session logs (Codex CLI, Claude Code) into memstore sessions.

``import_logs(root, path)`` finds the sources under ``path`` and imports each into its own
session (``codex-<thread id>``, ``claude-<sessionId>``, ``claude-<sessionId>-agent-<agentId>``),
in memstore's event vocabulary. Imports are incremental and idempotent: importing again
appends only what a source gained since. See ``docs/import.md`` for the mapping, the extension
vocabulary and the incremental design.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import NamedTuple, Optional, Union

from ..errors import MemstoreError
from ..layout import EVENTS_FILE, iter_session_dirs
from ..locks import store_lock
from ..tombstones import Tombstones
from .base import UNRECOGNIZED
from .drift import DRIFT_PREFIX, VersionStats, aggregate, load_versions, save_versions, warnings_for
from .pipeline import run_import
from .progress import ImportProgress, ProgressLine, ProgressMeter
from .setaside import finish_interrupted_set_asides
from .sources import discover, display_path
from .staging import sweep_abandoned
from .stores import Origin, StoreImport, is_store, session_origins

logger = logging.getLogger("memstore")

SOURCES = ("auto", "codex", "codex-exec", "claude")
KEPT_SUFFIX = f"; kept as {UNRECOGNIZED}"  # the end of the reason of every record kept but not understood
DEFAULT_SETTLE_SECONDS = 900.0

PathArg = Union[str, os.PathLike]


class SetAside(NamedTuple):
    """A session an import set aside (renamed, every event kept) to import its changed source
    afresh: ``session_id`` (now the new import), ``set_aside_as`` (the old one) and ``reason``."""

    session_id: str
    set_aside_as: str
    reason: str


class Tombstoned(NamedTuple):
    """A source not imported because its session was removed on purpose (``reason``:
    ``retention`` or ``forget``, at ``at``)."""

    path: str
    session_id: str
    reason: str
    at: str


class Renamed(NamedTuple):
    """A session of another store imported under another id (``imported_as``: its id qualified
    by its origin) because its own id names a different session here."""

    path: str
    session_id: str
    imported_as: str


class Problem(NamedTuple):
    """Something an import skipped or could not do: the source ``path``, the 1-based ``line``
    (``None`` when it is about the whole file) and the ``reason``."""

    path: str
    line: Optional[int]
    reason: str


@dataclass
class ImportReport:
    """What :func:`import_logs` did.

    ``sessions_created``/``sessions_updated``: sessions that received events (new, or grown);
    ``sessions_regenerated``: sources imported afresh after their old session was set aside
    (rewritten or truncated); ``sessions_unchanged``: sources with nothing new.
    ``events_appended`` counts events written; ``lines_kept_unrecognized`` the source records
    not understood, kept as ``import.unrecognized`` events; ``lines_skipped`` the records that
    made no event and were not kept (a result whose call never came, a response repeated from
    an earlier turn), by reason in ``lines_skipped_by_reason``; ``problems`` says what and where.
    ``agents`` gives per agent and agent version the sessions, turns, tokens and records
    understood or not of the sources looked at (see :mod:`memstore.importers.drift`), and
    ``warnings`` the format-drift warnings (each starting with ``warning: format drift:``).
    ``sessions`` names the sessions that received events (created, updated or regenerated).
    ``set_aside`` lists the sessions set aside (renamed, every event kept) because their source
    no longer matched them, ``tombstoned`` the sources skipped because their session was
    removed on purpose, and ``foreign_events_kept`` counts records others had appended to
    imported sessions (kept, the import going on after them). ``renamed`` lists the sessions
    of another store imported under an id qualified by their origin, because their own id names
    a different session here (see :mod:`memstore.importers.stores`).
    """

    sessions_created: int = 0
    sessions_updated: int = 0
    events_appended: int = 0
    lines_skipped: int = 0
    problems: list[Problem] = field(default_factory=list)
    sessions_regenerated: int = 0
    sessions_unchanged: int = 0
    sources: int = 0
    sessions: list[str] = field(default_factory=list)
    set_aside: list[SetAside] = field(default_factory=list)
    tombstoned: list[Tombstoned] = field(default_factory=list)
    foreign_events_kept: int = 0
    lines_kept_unrecognized: int = 0
    lines_skipped_by_reason: dict[str, int] = field(default_factory=dict)
    agents: list[VersionStats] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    renamed: list[Renamed] = field(default_factory=list)

    def to_dict(self) -> dict:
        """A JSON-ready dict (problems, set-aside and tombstoned sessions, agents as objects)."""
        data = asdict(self)
        data["problems"] = [p._asdict() for p in self.problems]
        data["set_aside"] = [s._asdict() for s in self.set_aside]
        data["tombstoned"] = [t._asdict() for t in self.tombstoned]
        data["renamed"] = [r._asdict() for r in self.renamed]
        data["agents"] = [a.to_dict() for a in self.agents]
        return data


def import_logs(
    root: PathArg,
    path: Union[PathArg, Iterable[PathArg]],
    source: str = "auto",
    *,
    settle_seconds: float = DEFAULT_SETTLE_SECONDS,
    progress: Optional[Callable[[int, int], None]] = None,
    jobs: Optional[int] = None,
) -> ImportReport:
    """Import the agent logs under ``path`` into the store at ``root``.

    ``path`` is a file or a directory (searched recursively for ``*.jsonl``, never following a
    symlink), or several of them. A directory that is another memstore store (a copy of another
    machine's or a teammate's ``<root>``) has its sessions merged in with their ids, each one
    recording the store it came from (see :mod:`memstore.importers.stores`). ``source`` is ``"codex"`` (rollouts), ``"codex-exec"``
    (``codex exec --json`` streams), ``"claude"`` (Claude Code transcripts) or ``"auto"``
    (each file tells what it is). A source unmodified for ``settle_seconds`` is taken as
    finished: its last turn is closed and its session completed. ``progress(done, total)``
    is called with byte counts as the import advances; if it also has a ``status`` method,
    that gets an :class:`ImportProgress` (sessions and bytes done, rate, time left; see
    :class:`ProgressLine`). ``jobs`` is the number of worker processes that parse the sources
    (default: one per core, none for a small import; 1 imports in this process).

    New sessions are written whole out of sight and published in batches, each made durable by
    one file-system sync before its sessions appear in the store: a crash at any moment leaves
    every session whole or absent, and the next import finishes the job (see
    :mod:`memstore.importers.pipeline`). Concurrent imports into one store take turns (the
    store's ``import`` lock).

    Bad input (unparsable lines, unknown line types, files that are no agent log) is counted in
    the report and skipped, never fatal. Sources are only read. No import removes an event a
    session holds: a session whose source no longer matches it is set aside (renamed) and the
    source imported afresh beside it; a session removed on purpose (tombstoned) is not
    recreated. A failure writing the store raises :class:`memstore.StoreIOError` (which names
    the path); a damaged ``tombstones.jsonl`` raises
    :class:`memstore.tombstones.TombstoneFileError` before anything is imported.
    """
    if source not in SOURCES:
        raise ValueError(f"source must be one of {SOURCES}, not {source!r}")
    paths = [path] if isinstance(path, (str, os.PathLike)) else list(path)
    root = Path(root).absolute()
    report = ImportReport()
    unknown_fields: dict[str, list] = {}

    def problem(where: str, line: Optional[int], reason: str) -> None:
        where = display_path(where)  # a file name that is not UTF-8 is reported printably
        report.problems.append(Problem(where, line, reason))
        logger.info("import: %s%s: %s", where, f":{line}" if line else "", reason)

    # Read before anything is touched: a damaged file stops the import (it fails closed).
    tombstones = Tombstones(root)
    tombstoned = tombstones.all()
    finish_interrupted_set_asides(root)
    stores = [Path(p) for p in paths if is_store(p)]
    files = discover([p for p in paths if not is_store(p)], root, problem)
    meter = ProgressMeter(progress)
    sizes = []
    for f in files:
        try:
            sizes.append((os.stat if f.follow else os.lstat)(f.path).st_size)
        except OSError:
            sizes.append(0)
    meter.reserve(*_store_sizes(stores))
    outcomes: list = []
    if files or stores:
        with store_lock(root, "import"):
            sweep_abandoned(root)
            if files:
                outcomes = run_import(
                    root, files, sizes, source, settle_seconds, time.time(), tombstones, tombstoned, meter, jobs
                )
            else:
                meter.begin(0, 0)
            for other in stores:
                _import_store(root, other, tombstones, meter, report, problem)
            meter.finish()
    named: set[str] = set()
    stats = []
    for source_file, outcome in zip(files, outcomes):
        if outcome is None:
            continue
        report.sources += 1
        report.sessions_created += outcome.created
        report.sessions_updated += outcome.updated
        report.sessions_regenerated += outcome.regenerated
        report.sessions_unchanged += outcome.unchanged
        if (
            outcome.session_id is not None
            and (outcome.created or outcome.updated or outcome.regenerated)
            and outcome.session_id not in named
        ):
            named.add(outcome.session_id)
            report.sessions.append(outcome.session_id)
        report.events_appended += outcome.appended
        report.foreign_events_kept += outcome.foreign_kept
        if outcome.stats is not None:
            stats.append(outcome.stats)
        if outcome.set_aside is not None:
            report.set_aside.append(SetAside(*outcome.set_aside))
        if outcome.tombstoned is not None:
            stone = outcome.tombstoned
            report.tombstoned.append(
                Tombstoned(display_path(source_file.path), stone.session_id, stone.reason.value, stone.at)
            )
        report.lines_skipped += outcome.skipped_lines
        for line, reason in outcome.problems:
            problem(source_file.path, line, reason)
        for reason, (line, count, skipped) in outcome.notes.items():
            if skipped:
                report.lines_skipped_by_reason[reason] = report.lines_skipped_by_reason.get(reason, 0) + count
            elif reason.endswith(KEPT_SUFFIX):
                report.lines_kept_unrecognized += count
            if reason.startswith("unknown field"):
                # New fields appear in every file of a newer agent version: one problem per field and run.
                entry = unknown_fields.get(reason)
                if entry is None:
                    unknown_fields[reason] = [source_file.path, line, count]
                else:
                    entry[2] += count
                continue
            problem(source_file.path, line, f"{reason} ({count} lines)" if count > 1 else reason)
    for reason, (where, line, count) in unknown_fields.items():
        problem(where, line, f"{reason} ({count} lines)" if count > 1 else reason)
    report.agents = aggregate(stats)
    if report.agents:
        seen = load_versions(root)
        report.warnings = warnings_for(report.agents, seen)
        save_versions(root, seen, report.agents)
        for warning in report.warnings:
            logger.info("import: %s", warning)
    return report


def _store_sizes(stores: list[Path]) -> tuple[int, int]:
    """The bytes of the logs and the number of sessions of the stores ``stores``."""
    total = sessions = 0
    for other in stores:
        for entry in iter_session_dirs(other, require_log=True):
            sessions += 1
            try:
                total += os.stat(os.path.join(entry.path, EVENTS_FILE), follow_symlinks=False).st_size
            except OSError:
                pass
    return total, sessions


def _import_store(
    root: Path,
    other: Path,
    tombstones: Tombstones,
    meter: ProgressMeter,
    report: ImportReport,
    problem: Callable[[str, Optional[int], str], None],
) -> None:
    """Import the sessions of the store ``other`` (see :mod:`.stores`) into ``report``."""

    def advance(n: int) -> None:
        meter.advance(n)
        meter.session_done()

    try:
        results = StoreImport(root, other, tombstones, advance).run()
    except MemstoreError as exc:
        problem(str(other), None, str(exc))
        return
    for result in results:
        report.sources += 1
        report.sessions_created += result.created
        report.sessions_updated += result.updated
        report.sessions_unchanged += result.unchanged
        report.events_appended += result.appended
        if result.session_id is not None and (result.created or result.updated):
            report.sessions.append(result.session_id)
            if result.qualified and result.source_session_id is not None:
                report.renamed.append(Renamed(display_path(result.source), result.source_session_id, result.session_id))
        if result.tombstoned is not None:
            stone = result.tombstoned
            report.tombstoned.append(
                Tombstoned(display_path(result.source), stone.session_id, stone.reason.value, stone.at)
            )
        for reason in result.problems:
            problem(result.source, None, reason)


__all__ = [
    "import_logs",
    "ImportReport",
    "ImportProgress",
    "ProgressLine",
    "Problem",
    "Renamed",
    "Origin",
    "session_origins",
    "SetAside",
    "Tombstoned",
    "VersionStats",
    "DRIFT_PREFIX",
    "SOURCES",
    "DEFAULT_SETTLE_SECONDS",
]
