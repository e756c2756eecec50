"""``memstore scrub``: a log rewritten with its secrets redacted.

Invariants: only lines holding a secret change, and in them only the secrets (seq, ts and every
other value equal; seqs and turn numbers unchanged); no secret is left in the log, the index, the
catalog or search; the scrub is recorded once in gc-log.jsonl and a second scrub changes nothing;
a session open for writing is refused, untouched; a scrub killed (SIGKILL, a real process) at any
moment leaves the old log or the whole new one, which opens as a consistent session, and scrubbing
again finishes the job.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner
from redact_support import CORPUS

import memstore
from memstore.cli import cli
from memstore.errors import SessionBusyError
from memstore.reader import read_session_dir
from memstore.redact import Redactor
from memstore.scrub import scrub_bytes, scrub_session

REPO = Path(__file__).resolve().parents[2]
SECRETS = sorted({s["value"] for entry in CORPUS for s in entry["secrets"]})
FILLER = (
    "Ran the focused tests; 14 passed, 2 skipped (network). The retry helper now reads "
    "its backoff from settings.RETRY_BACKOFF and logs each attempt at debug level."
)


def write_corpus_session(root: Path, sid: str = "s", repeat: int = 1) -> Path:
    with memstore.open_session(root, sid, durability="none") as log:
        log.append({"type": "thread.started", "thread_id": sid})
        for r in range(repeat):
            for i, entry in enumerate(CORPUS):
                log.append({"type": "turn.started"})
                log.append(
                    {
                        "type": "item.completed",
                        "item": {
                            "id": f"u{r}-{i}",
                            "type": "user_message",
                            "text": f"step {r}.{i}: check the staging config",
                        },
                    }
                )
                for event in entry["events"]:
                    log.append(event)
                log.append(
                    {"type": "item.completed", "item": {"id": f"m{r}-{i}", "type": "agent_message", "text": FILLER}}
                )
                if not any(e["type"].startswith("turn.") for e in entry["events"]):
                    log.append({"type": "turn.completed", "usage": {"input_tokens": 900 + i, "output_tokens": 80}})
    return memstore.session_directory(root, sid) / "events.jsonl"


def turn_shape(root: Path, sid: str = "s") -> list[tuple]:
    with memstore.read_session(root, sid) as reader:
        return [(t.number, t.status, t.first_seq, t.last_seq, t.event_count) for t in reader.turns()]


def test_scrub_changes_only_the_secrets(tmp_path):
    root = tmp_path / "store"
    log_path = write_corpus_session(root)
    memstore.refresh_catalog(root)
    before = log_path.read_bytes()
    shape = turn_shape(root)
    generation = memstore.Store(root)["s"].generation

    report = memstore.Store(root).scrub("s")[0]

    after = log_path.read_bytes()
    assert report.changed and report.lines_changed == len(CORPUS)
    assert sum(report.secrets.values()) >= len(CORPUS)
    assert not [s for s in SECRETS if s.encode() in after or orjson.dumps(s)[1:-1] in after]
    old_lines, new_lines = before.splitlines(keepends=True), after.splitlines(keepends=True)
    assert len(old_lines) == len(new_lines)
    redactor = Redactor()
    changed = 0
    for old, new in zip(old_lines, new_lines):
        if old == new:
            assert not redactor.contains_secret(json.dumps(json.loads(old)))
            continue
        changed += 1
        old_env, new_env = orjson.loads(old), orjson.loads(new)
        assert new_env == redactor.redact_value(old_env)
        assert (new_env["seq"], new_env["ts"]) == (old_env["seq"], old_env["ts"])
        assert "[REDACTED:" in new.decode()
    assert changed == report.lines_changed
    assert turn_shape(root) == shape
    assert memstore.Store(root)["s"].generation != generation  # the views were rebuilt
    gc = [json.loads(line) for line in (root / "gc-log.jsonl").read_text().splitlines()]
    assert [(g["op"], g["session_id"], g["lines_changed"]) for g in gc] == [("scrub", "s", len(CORPUS))]
    assert gc[0]["bytes_before"] == len(before) and gc[0]["bytes_after"] == len(after)
    for secret in SECRETS[:10]:
        assert all(secret not in r.snippet for r in memstore.Store(root).search(secret))

    again = scrub_session(root, "s")
    assert not again.changed and log_path.read_bytes() == after
    assert len((root / "gc-log.jsonl").read_text().splitlines()) == 1


def test_an_audit_pack_of_the_old_log_shows_the_scrub(tmp_path):
    """A pack written before the scrub no longer verifies: the log is a mismatch."""
    root = tmp_path / "store"
    write_corpus_session(root)
    store = memstore.Store(root)
    _pack, path = store.pack("s", tmp_path / "before.json")
    assert store.verify("s", path).verified
    store.scrub("s")
    after = store.verify("s", path)
    assert not after.verified and "events.jsonl" in after.mismatches


def test_a_session_open_for_writing_is_refused_untouched(tmp_path):
    root = tmp_path / "store"
    log_path = write_corpus_session(root)
    before = log_path.read_bytes()
    with memstore.open_session(root, "s"):
        with pytest.raises(SessionBusyError):
            scrub_session(root, "s")
    assert log_path.read_bytes() == before
    assert not (root / "gc-log.jsonl").exists()


def test_the_cli_scrubs_one_session_or_all(tmp_path):
    root = tmp_path / "store"
    write_corpus_session(root, "a")
    write_corpus_session(root, "b")
    runner = CliRunner()
    one = runner.invoke(cli, ["scrub", "a", "--root", str(root), "--json"])
    assert one.exit_code == 0, one.output
    assert [r["session_id"] for r in json.loads(one.output) if r["changed"]] == ["a"]
    both = runner.invoke(cli, ["scrub", "--all", "--root", str(root)])
    assert both.exit_code == 0, both.output
    assert "scrubbed 1 session of 2" in both.output
    neither = runner.invoke(cli, ["scrub", "--root", str(root)])
    assert neither.exit_code == 2 and "SESSION or --all" in neither.output


_KILL_AT = """
import os, signal, sys
from memstore import faults
from memstore.scrub import scrub_session
faults.arm(sys.argv[2], lambda **kw: os.kill(os.getpid(), signal.SIGKILL))
scrub_session(sys.argv[1], "s")
"""

_SCRUB = "import sys; from memstore.scrub import scrub_session; scrub_session(sys.argv[1], 's')"


def _child(code: str, *args: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen(
        [sys.executable, "-c", code, *args], env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )


def _check_after_kill(root: Path, log_path: Path, original: bytes, scrubbed: bytes, shape: list) -> None:
    now = log_path.read_bytes()
    assert now in (original, scrubbed), "the log is neither the old one nor the whole new one"
    with memstore.open_session(root, "s") as log:  # removes the dead scrub's temp file
        assert log.event_count == len(original.splitlines())
    assert not [p.name for p in log_path.parent.iterdir() if ".tmp-" in p.name]
    assert turn_shape(root) == shape
    scrub_session(root, "s")
    assert log_path.read_bytes() == scrubbed
    assert turn_shape(root) == shape


@pytest.mark.slow
@pytest.mark.parametrize("point", ["scrub.written", "scrub.replaced"])
def test_a_scrub_killed_at_each_step_leaves_a_whole_log(tmp_path, point):
    root = tmp_path / "store"
    log_path = write_corpus_session(root)
    original = log_path.read_bytes()
    scrubbed, _changed = scrub_bytes(original, Redactor())
    shape = turn_shape(root)
    child = _child(_KILL_AT, str(root), point)
    _out, err = child.communicate(timeout=120)
    assert child.returncode == -signal.SIGKILL, err.decode()
    assert log_path.read_bytes() == (original if point == "scrub.written" else scrubbed)
    _check_after_kill(root, log_path, original, scrubbed, shape)


@pytest.mark.slow
def test_a_scrub_killed_at_random_moments_leaves_a_whole_log(tmp_path):
    root = tmp_path / "store"
    log_path = write_corpus_session(root, repeat=12)
    original = log_path.read_bytes()
    scrubbed, _changed = scrub_bytes(original, Redactor())
    shape = turn_shape(root)
    rng = random.Random(20261202)
    killed = 0
    for _ in range(6):
        log_path.write_bytes(original)
        memstore.rebuild(root, "s", refresh=False)
        child = _child(_SCRUB, str(root))
        time.sleep(rng.uniform(0.05, 1.5))
        child.send_signal(signal.SIGKILL)
        child.communicate(timeout=120)
        killed += child.returncode == -signal.SIGKILL
        _check_after_kill(root, log_path, original, scrubbed, shape)
    assert killed >= 3  # most kills landed while the scrub ran (before or after its rename)


def test_scrub_keeps_the_envelope_and_the_log_knows_its_session(tmp_path):
    """Scrub redacts events, never the envelope: a session whose id looks like a secret still
    reads back under that id once its manifest.json is gone."""
    sid = "proj:token=ghp_" + "aB3dE5fG7hJ9kL2mN4pQ6rS8tU0vW1xY3zA5"
    with memstore.open_session(tmp_path, sid) as log:
        log.append({"type": "turn.started"})
        log.append(
            {
                "type": "item.completed",
                "item": {"id": "m", "type": "agent_message", "text": "export API_TOKEN=" + "Zx9" * 12},
            }
        )
        directory = log.directory
    scrub_session(tmp_path, sid)
    (directory / "manifest.json").unlink()
    shutil.rmtree(directory / "index")  # the views lost: only the log tells the id
    with read_session_dir(directory) as reader:
        assert reader.session_id == sid
        assert "[REDACTED:" in orjson.dumps(list(reader.iter_events())).decode()
