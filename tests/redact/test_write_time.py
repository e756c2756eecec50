"""Redaction at write time (``[redact] at_write``), the reader's ``redact`` option, and the
upgrade of indexes and catalogs derived before index-time redaction.

Invariants: with ``at_write`` an appended event reaches the log redacted (the caller's dict is
not changed), a failed turn's message too; by default the log keeps the event as given while the
index's chunks and turn errors are redacted; ``read_session(..., redact=True)`` returns redacted
events and turn errors, and the default returns events as logged; a malformed ``config.toml`` makes
an open refuse, naming the file, before anything is created; an index whose chunks were derived
before redaction is rebuilt on its next open, and a catalog of the earlier layout is recreated,
so neither keeps a secret.
"""

from __future__ import annotations

import sqlite3

import pytest

import memstore
from memstore.redact import RedactConfigError

KEY = "ghp_R8kq2LmV7xTz4NcWb9YdHs3PfJa6Ue1Go5Qi"
EVENT = {
    "type": "item.completed",
    "item": {
        "id": "c1",
        "type": "command_execution",
        "command": f"git push https://x:{KEY}@github.com/o/r",
        "aggregated_output": "Everything up-to-date\n",
        "exit_code": 0,
        "status": "completed",
    },
}


def write(root, sid="s"):
    with memstore.open_session(root, sid) as log:
        log.append({"type": "turn.started"})
        event = {"type": "item.completed", "item": dict(EVENT["item"])}
        log.append(event)
        assert KEY in event["item"]["command"]  # the caller's event is never changed
        log.append({"type": "turn.failed", "message": f"push rejected for token {KEY}"})
    return memstore.session_directory(root, sid)


def index_texts(directory) -> str:
    conn = sqlite3.connect(directory / "index" / "session.db")
    try:
        chunks = [r[0] for r in conn.execute("SELECT text FROM chunks")]
        errors = [r[0] or "" for r in conn.execute("SELECT error FROM turns")]
        names = [r[0] or "" for r in conn.execute("SELECT name FROM event_details")]
    finally:
        conn.close()
    return "\n".join(chunks + errors + names)


def test_at_write_logs_redacted_events(tmp_path):
    root = tmp_path / "store"
    root.mkdir()
    (root / "config.toml").write_text("[redact]\nat_write = true\n")
    directory = write(root)
    log = (directory / "events.jsonl").read_text()
    assert KEY not in log and log.count("[REDACTED:github-token]") == 2
    memstore.rebuild(root, "s")
    assert KEY not in index_texts(directory) and "[REDACTED:" in index_texts(directory)


def test_by_default_the_log_keeps_the_secret_and_the_index_does_not(tmp_path):
    root = tmp_path / "store"
    directory = write(root)
    assert (directory / "events.jsonl").read_text().count(KEY) == 2
    memstore.rebuild(root, "s")
    text = index_texts(directory)
    assert KEY not in text and "[REDACTED:github-token]" in text

    with memstore.read_session(root, "s") as reader:
        assert KEY in reader.reconstruct_turn(1)[1]["item"]["command"]
        assert KEY not in reader.turns()[0].error  # turns come from the index, which holds none
    with memstore.Store(root).read_redacted("s") as reader:
        assert "[REDACTED:github-token]" in reader.reconstruct_turn(1)[1]["item"]["command"]
        assert KEY not in reader.turns()[0].error and KEY not in str(list(reader.iter_events()))
        assert KEY not in str(reader.record(2).event)


@pytest.mark.parametrize(
    "config",
    ['[redact]\nat_write = "yes"\n', "[redact]\nat_write = true\nenabled = false\n", "[redact]\nat_wirte = true\n"],
)
def test_a_malformed_config_refuses_the_open_naming_the_file(tmp_path, config):
    root = tmp_path / "store"
    root.mkdir()
    (root / "config.toml").write_text(config)
    with pytest.raises(RedactConfigError) as caught:
        memstore.open_session(root, "s")
    assert str(root / "config.toml") in str(caught.value)
    assert not (root / "sessions").exists()


def test_an_index_derived_before_redaction_is_rebuilt(tmp_path):
    root = tmp_path / "store"
    directory = write(root)
    memstore.rebuild(root, "s", refresh=False)
    conn = sqlite3.connect(directory / "index" / "session.db")
    conn.execute("DELETE FROM _sqlite_migrations WHERE migration_set = 'memstore.views.chunks' AND name = 'redacted'")
    conn.execute("UPDATE chunks SET text = ? WHERE seq = 2", (EVENT["item"]["command"],))
    conn.commit()
    conn.close()
    assert KEY in index_texts(directory)
    with memstore.open_session(root, "s"):
        pass
    memstore.rebuild(root, "s", refresh=False)  # (derives what the open left to the deriver)
    assert KEY not in index_texts(directory)


def test_a_catalog_of_the_earlier_layout_is_recreated(tmp_path):
    root = tmp_path / "store"
    write(root)
    memstore.refresh_catalog(root)
    conn = sqlite3.connect(root / "catalog.db")
    conn.execute("UPDATE _sqlite_migrations SET name = 'tables_4' WHERE name = 'tables_5'")
    conn.execute("UPDATE chunks SET text = ? WHERE seq = 2", (EVENT["item"]["command"],))
    conn.commit()
    conn.close()
    memstore.refresh_catalog(root)
    conn = sqlite3.connect(root / "catalog.db")
    try:
        texts = "\n".join(r[0] for r in conn.execute("SELECT text FROM chunks"))
    finally:
        conn.close()
    assert KEY not in texts and "[REDACTED:github-token]" in texts
    assert KEY.encode() not in (root / "catalog.db").read_bytes()


def test_at_write_keeps_the_progress_ledger_free_of_secrets(tmp_path):
    """The progress ledger is written from the caller's values, not the log: with at_write its
    text is redacted too; by default it is kept as given."""
    from memstore.views.progress import ProgressLedger, load_progress, save_progress

    for at_write in (True, False):
        root = tmp_path / f"store-{at_write}"
        root.mkdir()
        if at_write:
            (root / "config.toml").write_text("[redact]\nat_write = true\n")
        write(root)
        ledger = ProgressLedger.new("s", "ship the release")
        ledger.handoff_summary = f"pushed with GITHUB_TOKEN={KEY}"
        path = save_progress(root, "s", ledger)
        assert (KEY.encode() in path.read_bytes()) is not at_write
        loaded = load_progress(root, "s")
        assert loaded is not None and loaded.goal == "ship the release"
