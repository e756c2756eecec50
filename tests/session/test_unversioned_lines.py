"""A line without a string ``schema_version`` is skipped for indexing only (VT Code skips it):
it is never cut as a torn tail, and a cap rewrite copies it byte for byte where it lies in the
kept part of the log, including as the kept part's first line; only evicting the turn around it
takes it away, as it takes every line of that turn."""

from __future__ import annotations

import json

import memstore

UNVERSIONED = b'{"event":{"type":"item.completed","item":{"type":"agent_message","text":"no version"}}}\n'
NUMBERED = b'{"schema_version":18,"event":{"type":"turn.started"}}\n'


def _line(event: dict) -> bytes:
    return json.dumps({"schema_version": "0.18.0", "event": event}, separators=(",", ":")).encode() + b"\n"


STARTED = _line({"type": "turn.started"})
COMPLETED = _line({"type": "turn.completed", "usage": {}})


def test_an_unversioned_last_line_is_not_cut_as_a_torn_tail(tmp_path):
    """An open that repairs torn tails keeps a whole JSON line at the end, versioned or not."""
    directory = memstore.session_directory(tmp_path, "s")
    directory.mkdir(parents=True)
    data = STARTED + COMPLETED + UNVERSIONED + NUMBERED
    (directory / "events.jsonl").write_bytes(data)
    with memstore.open_session(tmp_path, "s") as log:
        assert (log.event_count, log.turn_count) == (2, 1)
        log.append({"type": "turn.started"})
    on_disk = (directory / "events.jsonl").read_bytes()
    assert on_disk.startswith(data) and not list(directory.glob("events.jsonl.torn-*"))


def test_a_cap_rewrite_keeps_unversioned_lines_of_the_kept_part_byte_for_byte(tmp_path):
    """The cut falls right after an evicted turn: the unversioned line that follows it becomes
    the rewritten log's first line (memstore puts its anchor line before it instead of tagging
    it) and, like those inside kept turns, is copied unchanged."""
    directory = memstore.session_directory(tmp_path, "s")
    directory.mkdir(parents=True)
    evicted = STARTED + UNVERSIONED + COMPLETED
    kept = UNVERSIONED + STARTED + NUMBERED + COMPLETED + STARTED + UNVERSIONED + COMPLETED
    (directory / "events.jsonl").write_bytes(evicted + kept)
    with memstore.open_session(tmp_path, "s", max_events=5) as log:
        assert log.event_count == 6  # the three turns' versioned lines
        log.append({"type": "turn.started"})  # 7 > 5: the cap evicts turn 1
        assert log.manifest.retained_turn_base == 2
        assert [t.number for t in log.turns()] == [2, 3, 4]
    on_disk = (directory / "events.jsonl").read_bytes()
    first, rest = on_disk.split(b"\n", 1)
    assert json.loads(first).get("retained_turn_base") == 2 and "event" not in json.loads(first)  # the anchor
    assert rest.startswith(kept)
    assert rest.count(UNVERSIONED) == 2 and rest.count(NUMBERED) == 1
