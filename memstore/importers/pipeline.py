"""Running an import over many sources: parsed and mapped in parallel worker processes, new
sessions written whole and published in batches with one file-system sync each.

The plan: every source is told first (its first lines name the session it imports into); the
sources naming one session form a group, imported in order by one task, so that sessions are
independent of each other and each one sees its sources in the order of a one-by-one import.
Tasks of a few groups go to worker processes (one per core, started fresh with ``spawn``), or
run in this process for a small import.

A worker imports each source with :func:`.run.import_source`: a session that exists is
imported into where it is (under its lock, as ever); a new one is written whole into the
import's staging area (see :mod:`.staging`). This process collects the staged sessions and
publishes them in batches: one ``syncfs`` makes a batch durable, then each session is renamed
into the store, then one directory sync makes the renames durable. Before a batch is published
the tombstones are read again: a session removed on purpose meanwhile is not published. A
session whose name was taken meanwhile (another writer created it) is not published either:
its source is imported again, into that session, the usual way.

A crash at any moment leaves each session published whole or absent (staged only), and the
next import, finding the absent ones' sources not imported, imports them. Outcomes come back in
any order and are handed to the caller in source order.
"""

from __future__ import annotations

import logging
import os
import pickle
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from ..tombstones import Tombstones
from .progress import ProgressMeter
from .run import Outcome, _skip_tombstoned, import_source
from .sources import SourceFile, open_source, sniff
from .staging import Staging
from .tasks import Settings, Task, run_task
from .worker import read_frame, write_frame

logger = logging.getLogger(__name__)

# A task holds at most this many sources and (past its first group) bytes: enough that its
# round trip costs nothing, few enough that the workers finish together.
TASK_FILES = 32
TASK_BYTES = 4 << 20
# A batch of staged sessions is published once it holds this many sessions or bytes, or once
# its oldest session waited this long (so that a long import shows its sessions as it goes).
BATCH_SESSIONS = 500
BATCH_BYTES = 256 << 20
BATCH_SECONDS = 10.0
# Below these, worker processes (each costs a few hundred ms to start) are not worth it.
PARALLEL_MIN_FILES = 64
PARALLEL_MIN_BYTES = 32 << 20
_WORKER_MAIN = "from memstore.importers.worker import main; main()"
# How long a worker whose input closed may take to end before it is killed.
_STOP_SECONDS = 60.0


def default_jobs(files: int, size: int) -> int:
    """The worker processes an import of ``files`` sources of ``size`` bytes in all uses: one
    per core, or none (this process) for a small import."""
    cores = os.cpu_count() or 1
    if cores < 2 or (files < PARALLEL_MIN_FILES and size < PARALLEL_MIN_BYTES):
        return 1
    return cores


def session_of(source: SourceFile) -> Optional[str]:
    """The session ``source`` names (from its first lines), ``None`` when it names none or
    cannot be read (the import then reports why)."""
    try:
        fd = open_source(source)
    except OSError:
        return None
    try:
        return sniff(fd, os.fstat(fd).st_size, source).session_id
    except OSError:
        return None
    finally:
        os.close(fd)


def plan(files: list[SourceFile], sizes: list[int]) -> tuple[list[Task], int]:
    """The tasks of a run, in source order, and the number of sessions the sources name."""
    groups: dict[Any, list[int]] = {}
    for index, source in enumerate(files):
        session = session_of(source)
        groups.setdefault(session if session is not None else ("file", index), []).append(index)
    tasks: list[Task] = []
    current = Task()
    named = 0
    for key, members in groups.items():  # in the order of each group's first source
        size = sum(sizes[i] for i in members)
        if current.files and (len(current.files) + len(members) > TASK_FILES or current.size + size > TASK_BYTES):
            tasks.append(current)
            current = Task()
        current.files.extend((i, files[i], sizes[i]) for i in members)
        if not isinstance(key, tuple):
            current.sessions += 1
            named += 1
    if current.files:
        tasks.append(current)
    return tasks, named


# --------------------------------------------------------------------------------------------
# Publishing the staged sessions


@dataclass
class _Staged:
    index: int
    source: SourceFile
    outcome: Outcome
    size: int


class _Batches:
    """The staged sessions not published yet, published a batch at a time (see the module
    docstring). ``reimport(source)`` imports a source the usual way (no staging)."""

    def __init__(self, staging: Staging, tombstones: Tombstones, reimport: Callable[[SourceFile], Optional[Outcome]]):
        self.staging = staging
        self.tombstones = tombstones
        self.reimport = reimport
        self.waiting: list[_Staged] = []
        self.bytes = 0
        self.since = 0.0

    def add(self, index: int, source: SourceFile, outcome: Outcome, size: int) -> None:
        if not self.waiting:
            self.since = time.monotonic()
        self.waiting.append(_Staged(index, source, outcome, size))
        self.bytes += size

    def due(self) -> bool:
        return bool(self.waiting) and (
            len(self.waiting) >= BATCH_SESSIONS
            or self.bytes >= BATCH_BYTES
            or time.monotonic() - self.since >= BATCH_SECONDS
        )

    def publish(self) -> dict[int, Optional[Outcome]]:
        """Publish the waiting sessions; returns the outcomes that changed (by source index):
        a session tombstoned meanwhile, or whose name was taken, with its source's new outcome."""
        batch, self.waiting, self.bytes = self.waiting, [], 0
        if not batch:
            return {}
        changed: dict[int, Optional[Outcome]] = {}
        stones = self.tombstones.all()
        publish: list[_Staged] = []
        for item in batch:
            stone = stones.get(item.outcome.session_id or "")
            if stone is None:
                publish.append(item)
                continue
            # Removed on purpose after the run looked: not brought back.
            assert item.outcome.staged is not None
            self.staging.discard(item.outcome.staged)
            changed[item.index] = _tombstoned_outcome(item.outcome, stone)
        results = self.staging.publish([item.outcome.staged for item in publish if item.outcome.staged])
        for item, result in zip(publish, results):
            item.outcome.staged = None
            if not result.published:
                # Another writer made this session meanwhile: import into it the usual way.
                self.staging.discard(result.staged)
                logger.info(
                    "import: session %r appeared while its source was imported; importing into it",
                    item.outcome.session_id,
                )
                changed[item.index] = self.reimport(item.source)
        return changed


def _tombstoned_outcome(staged: Outcome, stone: Any) -> Outcome:
    out = Outcome()
    assert staged.session_id is not None
    _skip_tombstoned(out, staged.session_id, stone)
    return out


# --------------------------------------------------------------------------------------------
# The run


def run_import(
    root: Path,
    files: list[SourceFile],
    sizes: list[int],
    wanted: str,
    settle_seconds: float,
    now: float,
    tombstones: Tombstones,
    tombstoned: dict,
    meter: ProgressMeter,
    jobs: Optional[int] = None,
) -> list[Optional[Outcome]]:
    """Import ``files`` (of ``sizes`` bytes) into the store at ``root``; return each source's
    outcome, in source order (``None`` for a file that is not a source to import). The caller
    holds the store's ``import`` lock and calls ``meter.finish()`` once all is done. A failure
    writing the store raises once what was already staged is published."""
    tasks, sessions = plan(files, sizes)
    meter.begin(sum(sizes), sessions)
    if jobs is None:
        jobs = default_jobs(len(files), sum(sizes))
    settings = Settings(
        str(root), "", wanted, settle_seconds, now, tombstoned, logging.getLogger("memstore").getEffectiveLevel()
    )
    staging = Staging.create(root)
    settings.staging = str(staging.path)
    outcomes: list[Optional[Outcome]] = [None] * len(files)

    def reimport(source: SourceFile) -> Optional[Outcome]:
        return import_source(root, source, wanted, settle_seconds, now, lambda _n: None, tombstones, tombstoned)

    batches = _Batches(staging, tombstones, reimport)

    def collect(results: list[tuple[int, Optional[Outcome]]], task: Task) -> None:
        for index, outcome in results:
            outcomes[index] = outcome
            if outcome is not None and outcome.staged is not None:
                batches.add(index, files[index], outcome, sizes[index])
        meter.session_done(task.sessions)
        if batches.due():
            outcomes_changed(batches.publish())

    def outcomes_changed(changed: dict[int, Optional[Outcome]]) -> None:
        for index, outcome in changed.items():
            outcomes[index] = outcome

    here = staging.area("main")

    def run_here(task: Task) -> list[tuple[int, Optional[Outcome]]]:
        return run_task(task, settings, here, tombstones, meter.advance)

    try:
        if jobs <= 1 or len(tasks) < 2:
            for task in tasks:
                collect(run_here(task), task)
        else:
            _run_parallel(tasks, settings, staging, min(jobs, len(tasks)), meter, collect, run_here)
    finally:
        # What is staged and whole is published even when the run stops on an error.
        try:
            outcomes_changed(batches.publish())
        finally:
            staging.close()
    return outcomes


class _WorkerProcess:
    """One worker process (see :mod:`.worker`): ``send`` writes it a frame; a thread reads its
    frames into ``inbox`` as ``(worker, message)``, and ``(worker, None)`` once it ended."""

    def __init__(self, number: int, settings: Settings, inbox: queue.Queue[tuple[_WorkerProcess, Any]]):
        self.number = number
        self.area = f"w{number}"
        self.tasks: dict[int, Task] = {}  # sent and not answered yet
        self.finished: set[str] = set()  # the session directories its answered tasks staged
        self.process = subprocess.Popen(
            [sys.executable, "-c", _WORKER_MAIN],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            close_fds=True,
            env=_worker_environment(),
        )
        assert self.process.stdin is not None and self.process.stdout is not None
        self._stdin = self.process.stdin
        self._stdout = self.process.stdout
        self.alive = True
        self._reader = threading.Thread(target=self._read, args=(inbox,), name="memstore-import-worker", daemon=True)
        self._reader.start()
        self.send(settings)

    def send(self, message: Any) -> None:
        try:
            write_frame(self._stdin, message)
        except (BrokenPipeError, OSError):
            self.alive = False  # it died: its reader says so

    def _read(self, inbox: queue.Queue[tuple[_WorkerProcess, Any]]) -> None:
        try:
            while True:
                message = read_frame(self._stdout)
                if message is None:
                    break
                inbox.put((self, message))
        except (OSError, EOFError, pickle.UnpicklingError) as exc:
            logger.warning("import worker %d: its output could not be read (%s)", self.number, exc)
        finally:
            inbox.put((self, None))

    def stop(self, *, now: bool = False) -> None:
        """Close its input (it ends once its task is done) and wait for it; with ``now``, kill
        it first (the run failed: what it was writing is staged, or a session import the write
        path keeps whole, so stopping it anywhere loses nothing)."""
        try:
            self._stdin.close()
        except OSError:
            pass
        if now and self.process.poll() is None:
            self.process.kill()
        try:
            self.process.wait(timeout=_STOP_SECONDS)
        except subprocess.TimeoutExpired:
            logger.warning("import worker %d did not end; killing it", self.number)
            self.process.kill()
            self.process.wait()
        self._reader.join()
        self._stdout.close()


def _worker_environment() -> dict[str, str]:
    """The environment of a worker: this one, with the directory this very memstore package was
    imported from first on ``PYTHONPATH``, so that a worker runs the same code as its parent
    (whatever the parent's ``sys.path`` or working directory was)."""
    package_root = str(Path(__file__).resolve().parents[2])
    existing = os.environ.get("PYTHONPATH")
    return dict(os.environ, PYTHONPATH=package_root + (os.pathsep + existing if existing else ""))


def _run_parallel(
    tasks: list[Task],
    settings: Settings,
    staging: Staging,
    jobs: int,
    meter: ProgressMeter,
    collect: Callable[[list, Task], None],
    run_here: Callable[[Task], list],
) -> None:
    """Run ``tasks`` in ``jobs`` worker processes, the largest first, handing each result to
    ``collect`` as it comes. The tasks of a worker that dies are run here (what it staged for
    them is thrown away first). A task's error stops the run and is raised."""
    inbox: queue.Queue[tuple[_WorkerProcess, Any]] = queue.Queue()
    order = iter(sorted(enumerate(tasks), key=lambda item: item[1].size, reverse=True))
    workers = [_WorkerProcess(n, settings, inbox) for n in range(jobs)]
    failure: Optional[BaseException] = None
    orphaned: list[Task] = []

    def feed(worker: _WorkerProcess) -> None:
        # Two tasks in hand: the worker never waits for the next one.
        while failure is None and worker.alive and len(worker.tasks) < 2:
            item = next(order, None)
            if item is None:
                return
            number, task = item
            worker.tasks[number] = task
            worker.send((number, task, worker.area))

    try:
        for worker in workers:
            feed(worker)
        live = len(workers)
        while live:
            worker, message = inbox.get()
            if message is None:  # it ended: all is done, or it died
                live -= 1
                if worker.tasks and failure is None:
                    logger.warning(
                        "import worker %d ended with %d tasks undone (exit %s); running them here",
                        worker.number,
                        len(worker.tasks),
                        worker.process.poll(),
                    )
                    # What its answered tasks staged is collected (and published with a batch);
                    # only what the undone ones left goes.
                    staging.area(worker.area).clear(keep=worker.finished)
                    orphaned.extend(worker.tasks.values())
                worker.tasks.clear()
                worker.alive = False
                continue
            kind = message[0]
            if kind == "bytes":
                meter.advance(message[1])
            elif kind == "log":
                logging.getLogger(message[1].name).handle(message[1])
            elif kind == "done":
                task = worker.tasks.pop(message[1])
                worker.finished.update(
                    os.path.basename(outcome.staged) for _, outcome in message[2] if outcome and outcome.staged
                )
                if failure is None:
                    collect(message[2], task)
                feed(worker)
            elif kind == "error":
                worker.tasks.pop(message[1], None)
                failure = failure or message[2]
            if failure is not None or not worker.tasks:
                if not worker.tasks and worker.alive:
                    worker.alive = False
                    worker._stdin.close()  # done: it ends, and its reader says so
        if failure is not None:
            raise failure
        # The tasks of workers that died, and those never sent because every worker died.
        for task in orphaned + [task for _number, task in order]:
            collect(run_here(task), task)
    except BaseException:
        for worker in workers:
            worker.stop(now=True)
        raise
    else:
        for worker in workers:
            worker.stop()


__all__ = ["run_import", "plan", "default_jobs", "Task", "Settings"]
