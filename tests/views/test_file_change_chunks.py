"""File-change chunks: an event nested as deep as the log reads still gives its chunk."""

from __future__ import annotations

import sqlite3

import orjson

import memstore


def test_a_file_change_with_deeply_nested_arguments_does_not_fail_the_rebuild(tmp_path):
    with memstore.open_session(tmp_path, "s") as log:
        log.append({"type": "turn.started"})
    # A line another writer appended: nested deeper than memstore writes, as deep as the log reads.
    path = tmp_path / "sessions" / "s" / "events.jsonl"
    last = orjson.loads(path.read_bytes().splitlines()[-1])
    nested: object = "needle_deep"
    for _ in range(900):
        nested = [nested]
    event = {
        "type": "item.completed",
        "item": {
            "id": "f",
            "type": "file_change",
            "changes": [{"path": "src/a.py", "kind": "update"}],
            "arguments": {"file_path": "src/a.py", "old_string": "needle_old", "edits": nested},
        },
    }
    line = '{"schema_version":%s,"seq":%d,"ts":"%s","event":%s}\n' % (
        orjson.dumps(last["schema_version"]).decode(),
        last["seq"] + 1,
        last["ts"],
        '{"type":"item.completed","item":{"id":"f","type":"file_change","changes":[{"path":"src/a.py","kind":"update"}],'
        '"arguments":{"file_path":"src/a.py","old_string":"needle_old","edits":'
        + "[" * 900
        + '"needle_deep"'
        + "]" * 900
        + "}}}",
    )
    assert orjson.loads(line)["event"] == event
    with open(path, "a") as f:
        f.write(line)
    memstore.rebuild(tmp_path, "s")
    db = sqlite3.connect(tmp_path / "sessions" / "s" / "index" / "session.db")
    text = db.execute("SELECT text FROM chunks WHERE seq = ?", (last["seq"] + 1,)).fetchone()[0]
    assert text == "update src/a.py\nneedle_old\nneedle_deep"
