"""`memstore append` creates a session only once it has a valid event to write: input that is
bad from its first line, or empty, leaves nothing behind (with or without --atomic), and an
existing session is never touched by such input."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

import memstore
from memstore.cli import cli


def append(root, session, text, *args):
    return CliRunner().invoke(cli, ["append", session, "--root", str(root), *args], input=text)


@pytest.mark.parametrize(
    "text, needle",
    [
        ("not json\n", "not JSON"),
        ('{"type": 5}\n{"type": "turn.started"}\n', "'type'"),
        ('{"type": "turn.failed", "usage": {}}\n', "message"),
        ("[1]\n", "JSON object"),
    ],
)
def test_a_first_line_that_is_bad_creates_nothing(tmp_path, text, needle):
    result = append(tmp_path, "new", text)
    assert result.exit_code == 2 and needle in result.stderr and "nothing appended" in result.stderr
    assert not (tmp_path / "sessions").exists()
    assert "new" not in memstore.Store(tmp_path)


def test_empty_input_creates_nothing_and_says_so(tmp_path):
    result = append(tmp_path, "new", "\n\n")
    assert result.exit_code == 0 and "no session 'new' was created" in result.stdout
    assert not (tmp_path / "sessions").exists()
    as_json = append(tmp_path, "new", "", "--json")
    assert json.loads(as_json.stdout) == {
        "session_id": "new",
        "appended": 0,
        "last_seq": None,
        "turn_count": 0,
        "event_count": 0,
    }


def test_an_existing_session_is_reported_and_left_as_it_is(tmp_path):
    with memstore.open_session(tmp_path, "s") as log:
        log.append({"type": "turn.started"})
    before = (tmp_path / "sessions" / "s" / "events.jsonl").read_bytes()
    empty = append(tmp_path, "s", "", "--json")
    assert json.loads(empty.stdout)["event_count"] == 1 and json.loads(empty.stdout)["appended"] == 0
    bad = append(tmp_path, "s", "{oops\n")
    assert bad.exit_code == 2 and "nothing appended" in bad.stderr
    assert (tmp_path / "sessions" / "s" / "events.jsonl").read_bytes() == before


def test_a_bad_line_after_good_ones_keeps_the_good_ones(tmp_path):
    """Without --atomic, what came before the bad line is appended (the session exists then)."""
    result = append(tmp_path, "s", '{"type": "turn.started"}\n{"type": 7}\n')
    assert result.exit_code == 2 and "1 event appended before it" in result.stderr
    with memstore.read_session(tmp_path, "s") as reader:
        assert [e["type"] for e in reader.iter_events()] == ["turn.started"]
