"""The cap's default eviction summary finds its grounded facts by reading the evicted prefix
backwards from the cut, only until it has the newest five distinct ones: it must keep exactly
the facts a forward pass over every evicted event keeps, whatever the chunk boundaries."""

from __future__ import annotations

import json
import random
import re

import pytest

import memstore
from memstore.session import logfile
from memstore.session.logfile import LogFile
from memstore.session.summaries import MESSAGE_CANDIDATE, EvictionSummary

WORDS = "build test cargo fix the error in module parser lexer token span crate warning unused".split()


def _line(event: dict, rng: random.Random) -> bytes:
    if rng.random() < 0.05:
        return b'{"schema_version":"0.18.0","event":{"broken\n'  # not a record
    return json.dumps({"schema_version": "0.18.0", "event": event}, ensure_ascii=rng.random() < 0.3).encode() + b"\n"


def _events(rng: random.Random, n: int) -> list[dict]:
    events = []
    for _ in range(n):
        kind = rng.random()
        text = " ".join(rng.choices(WORDS, k=rng.randint(1, 60)))
        if rng.random() < 0.2:
            text = text.upper()  # the same fact in another case
        if kind < 0.4:
            events.append({"type": "item.completed", "item": {"id": "m", "type": "agent_message", "text": text}})
        elif kind < 0.6:
            events.append(
                {"type": "item.completed", "item": {"type": "tool_output", "output": "agent_message " + text}}
            )
        else:
            events.append({"type": "item.completed", "item": {"type": "reasoning", "text": "é " + text}})
    return events


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("chunk", [7, 64, 1 << 20])
def test_backward_lines_are_the_forward_lines_reversed(tmp_path, monkeypatch, seed, chunk):
    """``lines_matching_backward`` yields what ``lines_matching`` yields, in reverse order, with
    chunks smaller than a line and larger than the file, and a partial last line left out."""
    rng = random.Random(seed)
    data = b"".join(_line(e, rng) for e in _events(rng, 80)) + b'{"partial'
    (tmp_path / "events.jsonl").write_bytes(data)
    monkeypatch.setattr(logfile, "_READ_CHUNK", chunk)
    log = LogFile(tmp_path)
    log.open_readonly()
    try:
        pattern = re.compile(rb"agent_message|\\u00[5-7]")
        cut = data.rfind(b"\n", 0, len(data) // 2) + 1
        for start, end in ((0, len(data)), (0, cut), (cut, len(data))):
            forward = list(log.lines_matching(start, end, pattern))
            assert list(log.lines_matching_backward(start, end, pattern)) == forward[::-1]
            assert forward  # the test exercises something
    finally:
        log.close()


@pytest.mark.parametrize("seed", range(8))
def test_latest_facts_from_newest_first_lines_equal_a_forward_pass(tmp_path, seed):
    """Facts taken newest first from candidate lines equal the facts of a forward pass over
    every event (deduplicated case-insensitively, the newest text and place of each, five)."""
    rng = random.Random(seed)
    events = _events(rng, 120)
    lines = [_line(e, rng) for e in events]
    forward = EvictionSummary("s")
    for line in lines:
        forward.add_facts_of_lines([line.rstrip(b"\n")])
    backward = EvictionSummary("s")
    candidates = [line.rstrip(b"\n") for line in lines if MESSAGE_CANDIDATE.search(line)]
    backward.take_latest_facts_of_lines(reversed(candidates))
    assert backward.to_dict()["grounded_facts"] == forward.to_dict()["grounded_facts"]
    assert len(forward.to_dict()["grounded_facts"]) == 5


def test_the_cap_summary_keeps_the_newest_five_facts_of_many(tmp_path, monkeypatch):
    """A cap rewrite evicting many turns of agent messages (read in chunks smaller than a turn)
    writes the summary a hook given every evicted event would write."""
    monkeypatch.setattr(logfile, "_READ_CHUNK", 300)
    captured: list[list[dict]] = []
    for sid, hook in (("default", None), ("hooked", lambda d, s, events: captured.append(list(events)))):
        rng = random.Random(5)  # the same events in both sessions
        with memstore.open_session(tmp_path, sid, max_events=100, on_evict=hook) as log:
            for turn in range(40):
                log.append({"type": "turn.started"})
                for _ in range(3):
                    text = f"turn {turn % 13} " + " ".join(rng.choices(WORDS, k=8))
                    log.append({"type": "item.completed", "item": {"type": "agent_message", "text": text}})
                log.append({"type": "turn.completed", "usage": {}})
    expected = EvictionSummary("default")
    for event in captured[0]:
        expected.add_event(event)
    path = memstore.session_directory(tmp_path, "default") / "derived" / "eviction-summaries.jsonl"
    written = json.loads(path.read_bytes().splitlines()[0])
    want = expected.to_dict()
    assert written["grounded_facts"] == want["grounded_facts"] and len(want["grounded_facts"]) == 5
    assert written["event_types"] == want["event_types"]
    assert written["evicted_event_count"] == want["evicted_event_count"]


def test_an_evicted_secret_is_redacted_in_the_eviction_summary(tmp_path):
    """The eviction summary is a derived view: a secret quoted by an evicted agent message is
    replaced by its marker in ``derived/`` as in the index, and the fact is kept around it."""
    token = "ghp_" + "R8mK2vQ9xLp4Tz7Wc1Nb6Hd3Fs5Gj0Ya2UeK"
    with memstore.open_session(tmp_path, "s", max_events=3) as log:
        log.append({"type": "turn.started"})
        log.append(
            {
                "type": "item.completed",
                "item": {"id": "m", "type": "agent_message", "text": f"Exported GITHUB_TOKEN={token} for the CI job."},
            }
        )
        log.append({"type": "turn.completed", "usage": {}})
        log.append({"type": "turn.started"})
    derived = tmp_path / "sessions" / "s" / "derived"
    files = sorted(derived.glob("eviction-summar*"))
    assert files, "the cap wrote no summary"
    for path in files:
        text = path.read_text()
        assert token not in text
        assert "[REDACTED:" in text and "for the CI job." in text
