"""Times for people: the commands print a memstore timestamp (UTC) in the local time zone and
say how long ago it was, in the largest unit that fits; machine output keeps the timestamp."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta

import pytest
from click.testing import CliRunner

import memstore
from memstore.cli import _ago, _local, _when, cli

NOW = datetime(2026, 12, 2, 12, 0, 0, tzinfo=UTC)


def ts(delta: timedelta) -> str:
    return (NOW - delta).strftime("%Y-%m-%dT%H:%M:%S.000Z")


@pytest.fixture
def tokyo(monkeypatch):
    """Local time is Tokyo's (UTC+9, no daylight saving) for one test."""
    monkeypatch.setenv("TZ", "Asia/Tokyo")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


@pytest.mark.parametrize(
    ("delta", "expected"),
    [
        (timedelta(seconds=20), "just now"),
        (timedelta(minutes=1), "1 min ago"),
        (timedelta(minutes=59, seconds=59), "59 min ago"),
        (timedelta(hours=3, minutes=10), "3 h ago"),
        (timedelta(days=1, hours=2), "1 day ago"),
        (timedelta(days=45), "45 days ago"),
        (timedelta(days=75), "2 months ago"),
        (timedelta(days=800), "2 years ago"),
        (timedelta(minutes=-5), "in 5 min"),
    ],
)
def test_ago_names_the_largest_unit_that_fits(delta, expected):
    assert _ago(ts(delta), now=NOW) == expected


def test_local_time_and_what_is_not_a_timestamp(tokyo):
    """UTC becomes local time (Tokyo is 9 hours ahead, across midnight here); text that is
    not a timestamp is shown as it is, never dropped."""
    assert _local("2026-12-01T20:30:15.123Z") == "2026-12-02 05:30"
    assert _local("2026-12-01T20:30:15Z", seconds=True) == "2026-12-02 05:30:15"
    assert _when("2026-12-02T09:00:00.000Z", now=NOW) == "2026-12-02 18:00 (3 h ago)"
    assert _when("yesterday-ish", now=NOW) == "yesterday-ish" and _when(None) == "" and _ago("x") == ""


def test_sessions_and_show_print_local_times_and_json_keeps_utc(tmp_path, tokyo):
    """`sessions` and `show` print the local time and how long ago; --json keeps the UTC
    timestamps the log holds."""
    started = datetime.now(UTC) - timedelta(hours=5, minutes=7)
    stamp = started.strftime("%Y-%m-%dT%H:%M:%S.000Z")
    with memstore.open_session(tmp_path, "s") as log:
        log.append({"type": "turn.started"}, ts=stamp)
        log.append({"type": "turn.completed", "usage": {}}, ts=stamp)
    local = started.astimezone().strftime("%Y-%m-%d %H:%M")
    sessions = CliRunner().invoke(cli, ["sessions", "--root", str(tmp_path)])
    assert sessions.exit_code == 0, sessions.output
    assert f"{local} (5 h ago)" in sessions.stdout
    show = CliRunner().invoke(cli, ["show", "s", "--root", str(tmp_path)])
    assert f"updated {local} (5 h ago)" in show.stdout and local in show.stdout.splitlines()[-2]
    turn = CliRunner().invoke(cli, ["show", "s", "--turn", "1", "--root", str(tmp_path)])
    assert started.astimezone().strftime("%Y-%m-%d %H:%M:%S") in turn.stdout
    rows = json.loads(CliRunner().invoke(cli, ["sessions", "--root", str(tmp_path), "--json"]).stdout)
    assert rows[0]["updated_at"] == stamp
