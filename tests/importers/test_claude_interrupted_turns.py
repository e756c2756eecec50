"""Claude Code interruptions: a turn interrupted by the user and closed by a compaction ends after
its last items, and a resumed import gives what a fresh import gives."""

from __future__ import annotations

from pathlib import Path

import orjson

import memstore

_CLAUDE_SID = "9c1d2e3f-7777-4a1b-8c2d-00000000a00b"


def _claude_line(n, kind, ts, **fields):
    return {
        "parentUuid": None,
        "isSidechain": False,
        "userType": "external",
        "cwd": "/w",
        "sessionId": _CLAUDE_SID,
        "version": "2.1.3",
        "type": kind,
        "uuid": f"u{n}",
        "timestamp": ts,
        **fields,
    }


def _assistant(n, ts, mid, block):
    return _claude_line(
        n,
        "assistant",
        ts,
        message={
            "id": mid,
            "role": "assistant",
            "model": "claude-opus-4-5",
            "content": [block],
            "usage": {"input_tokens": 10, "output_tokens": 5},
        },
    )


# An interruption, then the turn's last lines (the cut-short answer, a tool's result), a /compact.
_INTERRUPTED_THEN_MORE = [
    _claude_line(1, "user", "2026-11-01T10:00:00.000Z", message={"role": "user", "content": "refactor the parser"}),
    _assistant(
        2,
        "2026-11-01T10:00:03.000Z",
        "m1",
        {"type": "tool_use", "id": "t1", "name": "Bash", "input": {"command": "ls"}},
    ),
    _claude_line(
        3,
        "user",
        "2026-11-01T10:00:05.000Z",
        message={"role": "user", "content": [{"type": "text", "text": "[Request interrupted by user]"}]},
    ),
    _assistant(4, "2026-11-01T10:00:09.000Z", "m2", {"type": "text", "text": "Stopping here."}),
    _claude_line(
        5,
        "user",
        "2026-11-01T10:00:10.000Z",
        message={"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "a.py b.py"}]},
    ),
    _claude_line(
        6,
        "user",
        "2026-11-01T10:00:40.000Z",
        message={
            "role": "user",
            "content": ("<command-name>/compact</command-name>\n<command-message>compact</command-message>"),
        },
    ),
    _claude_line(
        7,
        "system",
        "2026-11-01T10:01:25.000Z",
        subtype="compact_boundary",
        content="Conversation compacted",
        compactMetadata={"trigger": "manual", "preTokens": 15},
    ),
    _claude_line(8, "user", "2026-11-01T10:02:00.000Z", message={"role": "user", "content": "now just fix the test"}),
]


def _write_lines(path: Path, lines: list) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(orjson.dumps(o) + b"\n" for o in lines))
    return path


def _claude_records(root: Path) -> list:
    with memstore.read_session(root, f"claude-{_CLAUDE_SID}") as reader:
        return [(r.event, r.ts) for r in reader.iter_records()]


def test_an_interrupted_turn_closed_by_a_compaction_ends_after_its_last_items(tmp_path):
    source = _write_lines(tmp_path / "src" / f"{_CLAUDE_SID}.jsonl", _INTERRUPTED_THEN_MORE)
    memstore.import_logs(tmp_path / "store", source, settle_seconds=0)
    records = _claude_records(tmp_path / "store")
    end = next(i for i, (e, _) in enumerate(records) if e["type"] == "turn.aborted")
    assert records[end + 1][0]["type"] == "thread.compact_boundary"
    # Its items after the interruption are in it and before its end (it was dated 10:00:05,
    # before its own answer and result); the /compact command's line is not.
    assert [ts for _, ts in records[: end + 1]] == sorted(ts for _, ts in records[: end + 1])
    assert records[end][1] == "2026-11-01T10:00:10.000Z"
    with memstore.read_session(tmp_path / "store", f"claude-{_CLAUDE_SID}") as reader:
        assert reader.turns()[0].ended_at == "2026-11-01T10:00:10.000Z"
    # An import that stopped after each line and resumed (its state saved between) gives the same.
    for cut in range(1, len(_INTERRUPTED_THEN_MORE)):
        store = tmp_path / f"cut-{cut}"
        growing = _write_lines(tmp_path / f"src-{cut}" / f"{_CLAUDE_SID}.jsonl", _INTERRUPTED_THEN_MORE[:cut])
        memstore.import_logs(store, growing, settle_seconds=3600)
        _write_lines(growing, _INTERRUPTED_THEN_MORE)
        memstore.import_logs(store, growing, settle_seconds=0)
        got = orjson.dumps(_claude_records(store)).replace(str(growing).encode(), b"<src>")
        assert got == orjson.dumps(records).replace(str(source).encode(), b"<src>"), f"resumed after line {cut}"


def test_an_import_saved_by_the_previous_mapping_is_not_resumed_with_it(tmp_path):
    """Claude Code's interrupted turn before a compaction is mapped differently since the
    previous release (whose saved parser state has no ``interrupted_at``): resuming that state
    extended the session with the old mapping, unlike a fresh import of the same source."""
    from memstore.layout import IMPORT_STATE_FILE as STATE_FILE

    lines = _INTERRUPTED_THEN_MORE
    fresh = _write_lines(tmp_path / "fresh" / f"{_CLAUDE_SID}.jsonl", lines)
    memstore.import_logs(tmp_path / "fresh-store", fresh, settle_seconds=0)
    want = orjson.dumps(_claude_records(tmp_path / "fresh-store")).replace(str(fresh).encode(), b"<src>")

    store = tmp_path / "store"
    source = _write_lines(tmp_path / "src" / f"{_CLAUDE_SID}.jsonl", lines[:5])
    memstore.import_logs(store, source, settle_seconds=3600)
    state_path = memstore.session_directory(store, f"claude-{_CLAUDE_SID}") / "derived" / STATE_FILE
    state = orjson.loads(state_path.read_bytes())
    # As the previous release saved it.
    state["mapping"] = 2
    del state["carry"]["turn"]["interrupted_at"]
    state_path.write_bytes(orjson.dumps(state))
    _write_lines(source, lines)
    memstore.import_logs(store, source, settle_seconds=0)
    assert orjson.dumps(_claude_records(store)).replace(str(source).encode(), b"<src>") == want
