"""Named fault points: the one seam through which a test (or a soak run) makes the write path fail,
die or be watched at one precise step, instead of patching private functions.

The code names each step that matters with a call such as ``faults.check("index.commit",
path=...)``, placed where a real fault would strike (a full disk in an index transaction, a
kill between the log's replacement and the directory sync). Nothing is armed in normal
operation, and then a check costs one call and the test of an empty dict; no check sits on the
per-event path.

A test arms a point with an *action*, a callable that receives the point's context as keyword
arguments. The action may raise (the step fails as the fault would make it fail), end the
process (a kill at that moment), or record what it saw and return (the step then runs as
usual). Only the points listed in :data:`POINTS` can be armed, so a misspelt name fails the
test that arms it instead of silently testing nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

Action = Callable[..., Any]

# Every point checked somewhere, with the context its action receives.
POINTS: dict[str, str] = {
    "index.commit": "a transaction of event, turn and manifest rows is about to begin (path: the index)",
    "index.evict": "a cap rewrite's index transaction is about to begin (path: the index)",
    "manifest.publish": "manifest.json is about to be replaced (path, data: the bytes to write)",
    "publisher.stop": "a session's publisher is asked to stop, before it drains (path: its manifest.json)",
    "deriver.stopped": "a session's deriver thread has stopped (path: the session directory)",
    "recovery.rescan": "an open is about to rebuild the index from the whole log (path: the log, why)",
    "recovery.scan": "a scan of the log is about to index it from byte start on (path: the log, start)",
    "recovery.batch": "a scan is about to commit one batch to the index (path: the log, offset: where it ends)",
    "cap.marker": "a cap rewrite is about to write its intent marker (path: the session directory)",
    "cap.copy": "a cap rewrite has written part of the log's copy (path: the temp file)",
    "cap.synced": "a cap rewrite's copy of the log, summary and marker are synced; the copy is about to "
    "replace the log (path: the session directory)",
    "cap.replaced": "a cap rewrite replaced the log and is about to sync its directory (path: the directory)",
    "index.sync": "an index transaction that syncs the WAL (a cap rewrite's) is about to begin (path: the index)",
    "manifest.sync": "manifest.json, already in place, is about to be synced (path)",
    "cap.unmark": "a cap rewrite's index and manifest.json are durable; its marker is about to be removed "
    "(path: the session directory)",
    "lock.flock": "an open is about to flock the session's lock file (path: session.lock); raise OSError "
    "(ENOLCK, EOPNOTSUPP) to play a filesystem without flock",
    "trash.moved": "a session is in the trash, its removal not yet recorded (path: the .pending entry)",
    "trash.recorded": "a removal was recorded; its trash entry is about to lose .pending (path: the entry)",
    "registry.create": "a session's writer was created, under the registry's lock (key: its real path)",
    "scrub.written": "a scrub wrote and synced its copy of a file, not yet renamed over it (path: the temp file)",
    "scrub.replaced": "a scrub renamed its copy over the log, before syncing the directory (path: the log)",
}

_armed: dict[str, Action] = {}


def check(point: str, **context: Any) -> None:
    """Run the action armed at ``point``, if any, with ``context``; whatever it raises is raised
    here, at the step the point names."""
    if _armed:
        action = _armed.get(point)
        if action is not None:
            action(**context)


def arm(point: str, action: Action) -> None:
    """Make every later check of ``point`` call ``action`` (replacing any armed before)."""
    if point not in POINTS:
        raise ValueError(f"no fault point named {point!r} (known: {', '.join(sorted(POINTS))})")
    _armed[point] = action


def disarm(point: str) -> None:
    """Let ``point`` pass again (nothing happens if it was not armed)."""
    _armed.pop(point, None)


def disarm_all() -> None:
    _armed.clear()


@contextmanager
def armed(point: str, action: Action) -> Iterator[None]:
    """``point`` armed with ``action`` for the duration of the block."""
    arm(point, action)
    try:
        yield
    finally:
        disarm(point)
