"""Rebuilding every session (``memstore.rebuild(root)``, ``Store.rebuild()``) never stops at one
session: it returns a report with one entry per session, each rebuilt, skipped with its reason
(open in another process, removed meanwhile, a symlink, a directory this process may not enter)
or failed with its error (a log that is a FIFO), and every other session is rebuilt and
searchable.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from unprivileged import chown_tree, run_unprivileged, unprivileged_dir

import memstore
from memstore.maintenance import RebuildReport, SkipReason, rebuild_each

USAGE = {"input_tokens": 700, "cached_input_tokens": 200, "cache_creation_tokens": 0, "output_tokens": 90}
TEXTS = {
    "alpha": "Pinned the sqlite version because the WAL checkpoint behaviour changed upstream.",
    "beta": "The migration script now batches updates in groups of five hundred rows.",
    "busy": "Investigating why the websocket reconnect storms after a laptop resumes.",
}
PRELOAD = (
    "memstore.maintenance",
    "memstore.catalog",
    "memstore.search",
    "memstore.reader",
    "memstore.bm25",
    "memstore.views.registry",
    "memstore.session.writer",
    "sqlite_utils",
    "numpy",
    "filelock",
)

_HOLDER = textwrap.dedent(
    """
    import sys
    import memstore
    with memstore.open_session(sys.argv[1], "busy") as log:
        log.append({"type": "turn.started"})
        print("open", flush=True)
        sys.stdin.readline()
    """
)


def _session(root: Path, sid: str, text: str) -> None:
    with memstore.open_session(root, sid) as log:
        log.append({"type": "turn.started"})
        log.append({"type": "item.completed", "item": {"type": "agent_message", "text": text}})
        log.append({"type": "turn.completed", "usage": USAGE})


def _hold_open(root: Path) -> subprocess.Popen:
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(
            filter(None, [str(Path(memstore.__file__).parent.parent), os.environ.get("PYTHONPATH")])
        ),
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(root)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
    )
    assert holder.stdout is not None and holder.stdout.readline() == "open\n"
    return holder


def test_rebuild_of_every_session_reports_each_and_stops_at_none(tmp_path, caplog):
    root = tmp_path / "store"
    for sid, text in TEXTS.items():
        _session(root, sid, text)
    sessions = root / "sessions"
    fifo_log = sessions / "fifo-log"
    fifo_log.mkdir()
    os.mkfifo(fifo_log / "events.jsonl")
    elsewhere = tmp_path / "elsewhere"
    _session(elsewhere, "outside", "A session of another store, which no rebuild here may touch.")
    (sessions / "linked").symlink_to(elsewhere / "sessions" / "outside", target_is_directory=True)
    outside_before = sorted(p.name for p in (elsewhere / "sessions" / "outside").rglob("*"))
    holder = _hold_open(root)
    caplog.set_level(logging.WARNING)
    try:
        report = memstore.Store(root).rebuild()
    finally:
        assert holder.stdin is not None
        holder.stdin.write("\n")
        holder.stdin.flush()
        holder.wait(30)

    assert isinstance(report, RebuildReport)
    assert [m.session_id for m in report] == ["alpha", "beta"]
    skipped = {i.session: i.reason for i in report.skipped}
    assert skipped == {"busy": SkipReason.BUSY, "linked": SkipReason.SYMLINK}
    assert [i.session for i in report.failed] == ["fifo-log"]
    assert str(fifo_log / "events.jsonl") in report.failed[0].detail
    assert not report.ok
    messages = " ".join(r.getMessage() for r in caplog.records)
    assert "busy" in messages and str(fifo_log) in messages and "linked" in messages
    assert report.to_dict()["failed"][0]["session"] == "fifo-log"
    # The others are rebuilt and in the catalog; nothing outside the store was touched.
    assert {h.session_id for h in memstore.search_memory(root, "migration batches rows")} == {"beta"}
    assert sorted(p.name for p in (elsewhere / "sessions" / "outside").rglob("*")) == outside_before


def test_a_session_removed_after_it_was_listed_is_skipped_as_gone(tmp_path):
    root = tmp_path / "store"
    _session(root, "alpha", TEXTS["alpha"])
    report = RebuildReport(str(root))
    for sid, outcome in rebuild_each(root, ["alpha", "removed-meanwhile"]):
        report.add(sid, outcome)
    assert [m.session_id for m in report.rebuilt] == ["alpha"]
    assert [(i.session, i.reason) for i in report.skipped] == [("removed-meanwhile", SkipReason.GONE)]
    assert report.ok


def _rebuild_as_user(root: str) -> dict:
    """Rebuild every session, and list and check them, collecting the warnings logged."""
    from memstore.maintenance import check_store, session_ids

    seen: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.getMessage())

    handler = Collect(logging.WARNING)
    logging.getLogger("memstore").addHandler(handler)
    try:
        report = memstore.rebuild(root)
        ids = session_ids(root)
        doctor = check_store(root)
    finally:
        logging.getLogger("memstore").removeHandler(handler)
    return {
        "report": report.to_dict(),
        "ids": ids,
        "warnings": seen,
        "doctor": [(p.session, p.directory, p.detail) for p in doctor.problems],
        "checked": doctor.sessions,
    }


def test_a_session_directory_this_user_cannot_enter_is_skipped_and_logged_everywhere():
    """A directory made 000 (as if created once under sudo): rebuild skips it as unenterable,
    ``session_ids`` leaves it out, doctor reports it as one unfixable problem, each logging a
    warning naming it; every other session is rebuilt and checked."""
    with unprivileged_dir() as base:
        root = base / "store"
        _session(root, "alpha", TEXTS["alpha"])
        _session(root, "beta", TEXTS["beta"])
        locked = root / "sessions" / "locked"
        _session(root, "locked", "A session created by another user, under sudo.")
        chown_tree(base)
        os.chmod(locked, 0)
        try:
            seen = run_unprivileged(_rebuild_as_user, str(root), preload=PRELOAD)
        finally:
            os.chmod(locked, 0o700)
    report = seen["report"]
    assert [m["session_id"] for m in report["rebuilt"]] == ["alpha", "beta"]
    assert [(i["session"], i["reason"]) for i in report["skipped"]] == [("locked", "unenterable")]
    assert report["failed"] == []
    assert seen["ids"] == ["alpha", "beta"]
    assert seen["checked"] == 3
    assert [(session, directory) for session, directory, _ in seen["doctor"]] == [(None, str(locked))]
    assert "cannot be examined" in seen["doctor"][0][2]
    assert sum(str(locked) in w for w in seen["warnings"]) >= 2  # listing (rebuild, session_ids) and doctor
