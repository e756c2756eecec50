"""Two machines' stores, one imported into the other with `memstore import`: what the tests of
the machine filters (catalog, search, explorer, CLI, MCP) look at."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import memstore
from memstore.identity import set_label, store_identity

PROJECT = Path(__file__).resolve().parent.parent

# Each session's words: "widget" in every one (so one query finds them all), and its own.
LAPTOP_SESSIONS = {
    "fix-parser": "the widget parser dropped trailing commas; fixed the tokenizer and added a regression test",
    "add-cache": "cached the widget lookups in an LRU keyed by tenant; invalidation on every write",
}
DEVBOX_SESSIONS = {
    "deploy-ci": "the widget deploy pipeline failed on the staging runner; pinned the docker image digest",
    "tune-index": "rebuilt the widget index with a smaller page size; the nightly query went from 9 s to 2 s",
}


@dataclass(frozen=True)
class TwoMachines:
    """``root``: the laptop's store, holding its own sessions and the devbox's (imported);
    ``devbox``: the devbox's store as it was copied over; the ids and labels of both;
    ``refresh``: what the refresh after the import did (the change feed named the imported
    sessions)."""

    root: Path
    devbox: Path
    laptop_id: str
    devbox_id: str
    refresh: memstore.RefreshReport
    laptop_label: str = "laptop"
    devbox_label: str = "devbox"


def write_session(root: Path, sid: str, text: str, *, cwd: str) -> None:
    """A session of two turns about ``text``, with token usage and a command."""
    with memstore.open_session(root, sid) as log:
        log.append({"type": "thread.started", "thread_id": sid, "source": {"agent": "codex", "cwd": cwd}})
        for n in range(2):
            log.append({"type": "turn.started"})
            log.append({"type": "item.completed", "item": {"id": f"u{n}", "type": "user_message", "text": text}})
            log.append(
                {
                    "type": "item.completed",
                    "item": {
                        "id": f"c{n}",
                        "type": "command_execution",
                        "command": "cargo test --workspace",
                        "aggregated_output": f"test result: ok. {12 + n} passed; 0 failed ({sid})",
                        "exit_code": 0,
                        "status": "completed",
                    },
                }
            )
            log.append({"type": "item.completed", "item": {"id": f"a{n}", "type": "agent_message", "text": text}})
            log.append(
                {
                    "type": "turn.completed",
                    "model": "gpt-5",
                    "usage": {"input_tokens": 2400 + n, "cached_input_tokens": 800, "output_tokens": 180},
                }
            )


def cli_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(PROJECT), os.environ.get("PYTHONPATH")]))}


def two_machines(base: Path) -> TwoMachines:
    """The laptop's store with two sessions of its own, the devbox's with two, and the devbox's
    imported into the laptop's by a real `memstore import` process, then the catalog refreshed
    as a search does: from the change feed the import marked (and a sweep, when one is due)."""
    laptop, devbox = base / "laptop", base / "devbox"
    laptop.mkdir(parents=True)
    devbox.mkdir(parents=True)
    set_label(laptop, "laptop")
    set_label(devbox, "devbox")
    for sid, text in LAPTOP_SESSIONS.items():
        write_session(laptop, sid, text, cwd="/home/ana/src/widgets")
    for sid, text in DEVBOX_SESSIONS.items():
        write_session(devbox, sid, text, cwd="/srv/ci/widgets")
    memstore.refresh_catalog(laptop)  # a catalog built before the import: the import must reach it
    subprocess.run(
        [sys.executable, "-m", "memstore", "import", str(devbox), "--root", str(laptop)],
        check=True,
        capture_output=True,
        env=cli_env(),
        timeout=300,
    )
    with memstore.Store(laptop) as store:
        report = store.refresh(full=False, sweep=False)
    return TwoMachines(laptop, devbox, store_identity(laptop).store_id, store_identity(devbox).store_id, report)
