"""A session's source (working directory, git branch) is shown and catalogued redacted: a path
or branch that quotes a secret does not reach the catalog, the CLI or the explorer."""

from __future__ import annotations

import asyncio
import sqlite3

from click.testing import CliRunner

import memstore
from memstore.cli import cli
from memstore.explorer import make_datasette

TOKEN = "ghp_" + "Q7mK2vR9xLp4Tz8Wc1Nb6Hd3Fs5Gj0Ya2UeZ"
KEY = "AKIA" + "Q3EGRTWVJ5MZK7XB"


def test_a_secret_in_the_working_directory_or_branch_is_redacted_everywhere_shown(tmp_path):
    with memstore.open_session(tmp_path, "s") as log:
        log.append(
            {
                "type": "thread.started",
                "thread_id": "s",
                "source": {"agent": "codex", "cwd": f"/home/dev/{TOKEN}/proj", "git_branch": f"fix/{KEY}"},
            }
        )
        log.append({"type": "turn.started"})
        log.append({"type": "turn.completed", "usage": {}})
    memstore.refresh_catalog(tmp_path)
    conn = sqlite3.connect(tmp_path / "catalog.db")
    (cwd, branch) = conn.execute("SELECT cwd, git_branch FROM sessions").fetchone()
    conn.close()
    assert TOKEN not in cwd and "[REDACTED:" in cwd and cwd.endswith("/proj")
    assert KEY not in branch
    for args in (["show", "s"], ["show", "s", "--json"]):
        result = CliRunner().invoke(cli, [*args, "--root", str(tmp_path)])
        assert result.exit_code == 0, result.output
        assert TOKEN not in result.output and KEY not in result.output
    ds = make_datasette(tmp_path)

    async def pages() -> list[str]:
        return [
            (await ds.client.get(path)).text for path in ("/-/memstore", "/-/memstore.json", "/catalog/sessions.json")
        ]

    for text in asyncio.run(pages()):
        assert TOKEN not in text and KEY not in text
