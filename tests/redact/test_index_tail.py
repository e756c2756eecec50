"""The session index recognises the log's last bytes by their digest: a secret in a session's
final event is not in ``session.db`` (nor its WAL), and an index of the older format, which kept
those bytes themselves, is still recognised and not rebuilt."""

from __future__ import annotations

import sqlite3

import memstore
from memstore.session.logfile import TAIL_BYTES

TOKEN = "ghp_" + "Q7mK2vR9xLp4Tz8Wc1Nb6Hd3Fs5Gj0Ya2UeZ"


def _index_bytes(directory) -> bytes:
    return b"".join(p.read_bytes() for p in sorted((directory / "index").glob("session.db*")))


def test_a_secret_in_the_last_event_is_not_in_the_index(tmp_path):
    with memstore.open_session(tmp_path, "s") as log:
        log.append({"type": "turn.started"})
        log.append(
            {
                "type": "item.completed",
                "item": {"id": "c", "type": "command_execution", "command": f"export GH_TOKEN={TOKEN}", "exit_code": 0},
            }
        )
        directory = log.directory
    events = (directory / "events.jsonl").read_bytes()
    assert TOKEN.encode() in events[-TAIL_BYTES:]  # the log keeps it: the user's record
    assert TOKEN.encode() not in _index_bytes(directory)
    with memstore.open_session(tmp_path, "s") as log:  # and the index is recognised on reopen
        assert log.event_count == 2


def test_an_index_holding_the_raw_tail_is_still_recognised(tmp_path, fault):
    with memstore.open_session(tmp_path, "s") as log:
        log.append({"type": "turn.started"})
        log.append({"type": "turn.completed", "usage": {}})
        directory = log.directory
    events = (directory / "events.jsonl").read_bytes()
    db = sqlite3.connect(directory / "index" / "session.db")
    with db:
        db.execute("UPDATE manifest SET tail = ?", (events[-TAIL_BYTES:],))
    db.close()
    rescans = []
    fault.arm("recovery.rescan", lambda **context: rescans.append(context))
    with memstore.read_session(tmp_path, "s") as reader:
        assert reader.event_count == 2
    with memstore.open_session(tmp_path, "s") as log:
        log.append({"type": "turn.started"})
    assert rescans == [], "the index of the older format was not recognised"
    db = sqlite3.connect(directory / "index" / "session.db")
    (tail,) = db.execute("SELECT tail FROM manifest").fetchone()
    db.close()
    assert len(tail) == 32  # rewritten as a digest by the next commit
