"""The unit of an import's work: a :class:`Task` (sources to import in order) and the
:class:`Settings` every source of a run is imported with, and :func:`run_task`, which runs a
task in whatever process it is given to (a worker, or the one that plans the run)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from ..tombstones import Tombstones
from .run import Outcome, import_source
from .sources import SourceFile
from .staging import StagingArea


@dataclass
class Task:
    """Sources to import in order: ``(index in the run, source, size)``; ``sessions`` is how
    many sessions they name (for the progress)."""

    files: list[tuple[int, SourceFile, int]] = field(default_factory=list)
    sessions: int = 0

    @property
    def size(self) -> int:
        return sum(size for _index, _source, size in self.files)


@dataclass
class Settings:
    """What every source of a run is imported with (sent once to each worker)."""

    root: str
    staging: str
    wanted: str
    settle_seconds: float
    now: float
    tombstoned: dict
    log_level: int


def run_task(
    task: Task, settings: Settings, staging: StagingArea, tombstones: Tombstones, advance: Callable[[int], None]
) -> list[tuple[int, Optional[Outcome]]]:
    """Import the sources of ``task`` in order; ``advance(n)`` is told the bytes read, each
    source counting at most (and, once done, exactly) its size."""
    root = Path(settings.root)
    results = []
    for index, source, size in task.files:
        counted = [0]

        def progress(n: int, size: int = size, counted: list = counted) -> None:
            n = max(0, min(n, size - counted[0]))
            if n:
                counted[0] += n
                advance(n)

        outcome = import_source(
            root,
            source,
            settings.wanted,
            settings.settle_seconds,
            settings.now,
            progress,
            tombstones,
            settings.tombstoned,
            staging,
        )
        progress(size - counted[0])
        results.append((index, outcome))
    return results


__all__ = ["Task", "Settings", "run_task"]
