"""The secret corpus, embedded in realistic sessions (prompts, commands, outputs, diffs, nested
tool arguments, failed turns, and Codex and Claude Code logs brought in by a real import), is
findable through no surface of a store.

Invariants: with the default settings (the canonical log keeps its bytes) no secret of the corpus
is in a search result, in any text or blob column of any table of ``catalog.db`` (nor anywhere
in its bytes), in the session index, in the memory view, in the explorer's pages (HTML and
``.json``, served by a real Datasette, its own table pages included) or in the CLI's output; with
``[redact] at_write = true`` none is in any byte of any file under the store.
"""

from __future__ import annotations

import asyncio
import html
import json
import sqlite3
from pathlib import Path
from urllib.parse import quote

import orjson
import pytest
from click.testing import CliRunner
from redact_support import CORPUS, strings_in

import memstore
from memstore.cli import cli
from memstore.explorer import make_datasette
from memstore.explorer.urls import quote_id
from memstore.views.memory_view import write_session_memory_view

IMPORT_FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "import"
CLAUDE = IMPORT_FIXTURES / "claude" / "projects" / "-home-dev-web" / "2d984148-5555-4605-aac1-00000000e005.jsonl"
CLAUDE_PROMPT = "Show the user's initials in NavUser"
CODEX = next((IMPORT_FIXTURES / "codex" / "0.148").glob("*.jsonl"))
CODEX_PROMPT = "fix the flaky retry test"

SECRETS = sorted({s["value"] for entry in CORPUS for s in entry["secrets"]})
# Sessions written by an agent: the corpus's events, each entry a turn among ordinary ones.
CONTEXT_QUERIES = [
    "token",
    "password",
    "api key",
    "secret",
    "private key",
    "export",
    "aws credentials",
    "authorization bearer",
    "REDACTED",
    "staging key",
    "env",
    "webhook",
]
PROMPTS = [
    "The integration tests against staging fail since this morning; find out why and fix them.",
    "Refactor the retry helper so the backoff is configurable, and keep the public signature.",
    "Check the deployment manifests before we cut the release branch.",
]


def _needles(secret: str) -> list[str]:
    """What must not appear: the secret, and for a long one a distinctive piece of its middle
    (a redaction that kept half a key would leak that half)."""
    found = [secret]
    if len(secret) >= 40:
        middle = len(secret) // 2
        found.append(secret[middle - 12 : middle + 12])
    return found


def leaked(text: str) -> list[str]:
    """The corpus secrets (or their middles) ``text`` holds."""
    return [s[:24] for s in SECRETS if any(n in text for n in _needles(s))]


def leaked_bytes(data: bytes) -> list[str]:
    """The corpus secrets in raw bytes: as written, lower-cased (what a search index keeps), or
    as a JSON string would escape them (a private key's newlines)."""
    hits = []
    lowered = data.lower()
    for secret in SECRETS:
        forms = {n.encode() for n in _needles(secret)}
        forms |= {orjson.dumps(n)[1:-1] for n in _needles(secret)}
        if any(f in data or (len(f) >= 16 and f.lower() in lowered) for f in forms):
            hits.append(secret[:24])
    return hits


def _write_agent_sessions(root: Path) -> list[str]:
    """Three sessions holding every corpus entry, as an agent would log them."""
    ids = []
    per_session = (len(CORPUS) + 2) // 3
    for n in range(3):
        sid = f"agent-run-{n}"
        ids.append(sid)
        with memstore.open_session(root, sid) as log:
            log.append(
                {
                    "type": "thread.started",
                    "thread_id": sid,
                    "source": {"agent": "codex", "cwd": f"/home/dev/service-{n}"},
                }
            )
            for i, entry in enumerate(CORPUS[n * per_session : (n + 1) * per_session]):
                log.append({"type": "turn.started", "model": "gpt-5.5-codex"})
                log.append(
                    {
                        "type": "item.completed",
                        "item": {"id": f"p{i}", "type": "user_message", "text": PROMPTS[i % len(PROMPTS)]},
                    }
                )
                for event in entry["events"]:
                    log.append(event)
                if not any(e["type"].startswith("turn.") for e in entry["events"]):
                    log.append(
                        {
                            "type": "item.completed",
                            "item": {
                                "id": f"a{i}",
                                "type": "agent_message",
                                "text": "Done: the change is in place and the focused tests pass locally.",
                            },
                        }
                    )
                    log.append(
                        {
                            "type": "turn.completed",
                            "usage": {"input_tokens": 1800 + i, "cached_input_tokens": 900, "output_tokens": 240},
                        }
                    )
        write_session_memory_view(root, sid)
    return ids


def _import_sources(tmp: Path) -> Path:
    """A Codex CLI rollout and a Claude Code transcript whose prompts paste secrets."""
    source = tmp / "agent-logs"
    claude_dir = source / "claude" / "projects" / "-home-dev-web"
    claude_dir.mkdir(parents=True)
    text = CLAUDE.read_text()
    assert CLAUDE_PROMPT in text
    (claude_dir / CLAUDE.name).write_text(
        text.replace(
            CLAUDE_PROMPT, f"{CLAUDE_PROMPT}; the staging key is {SECRETS[0]} and GITHUB_TOKEN={_token('github-token')}"
        )
    )
    codex_dir = source / "codex"
    codex_dir.mkdir(parents=True)
    text = CODEX.read_text()
    assert CODEX_PROMPT in text
    (codex_dir / CODEX.name).write_text(
        text.replace(CODEX_PROMPT, f"{CODEX_PROMPT}; it needs OPENAI_API_KEY={_token('openai-api-key')}")
    )
    return source


def _token(kind: str) -> str:
    return next(s["value"] for entry in CORPUS for s in entry["secrets"] if s["kind"] == kind)


def _build_store(root: Path, tmp: Path) -> tuple[list[str], memstore.ImportReport]:
    ids = _write_agent_sessions(root)
    report = memstore.import_logs(root, [_import_sources(tmp)], settle_seconds=0)
    assert report.sessions_created == 2, report
    memstore.rebuild(root)  # derives every index, rebuilds the file views, refreshes the catalog
    return ids + list(report.sessions), report


@pytest.fixture(scope="module")
def default_store(tmp_path_factory) -> tuple[Path, list[str]]:
    tmp = tmp_path_factory.mktemp("surfaces")
    root = tmp / "store"
    ids, _report = _build_store(root, tmp)
    return root, ids


def test_the_canonical_log_keeps_the_secrets_by_default(default_store):
    """The default leaves events.jsonl byte-exact: the secrets are there (so the test below is
    not vacuous), and only there."""
    root, ids = default_store
    logs = b"".join((memstore.session_directory(root, sid) / "events.jsonl").read_bytes() for sid in ids)
    assert set(leaked_bytes(logs)) == {s[:24] for s in SECRETS}


def test_search_finds_no_secret(default_store):
    """Searching for each secret (whole, and its distinctive middle) returns no result holding it."""
    root, _ids = default_store
    store = memstore.Store(root)
    for secret in SECRETS:
        for needle in _needles(secret):
            for result in store.search(needle, limit=20):
                assert leaked(json.dumps(result.to_dict())) == [], (secret[:24], result.chunk_id)
    # Search still works: the text around the secrets is found.
    assert store.search("staging integration tests")
    assert any("[REDACTED:" in r.snippet for r in store.search("REDACTED github token", limit=50))


def test_no_secret_in_any_table_of_the_catalog_or_its_bytes(default_store):
    """Every text and blob column of every table of catalog.db (FTS5 and BM25 tables included),
    and the raw bytes of the file and its WAL, hold no secret."""
    root, _ids = default_store
    conn = sqlite3.connect(root / "catalog.db")
    try:
        tables = [row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        assert {"chunks", "events", "turns", "sessions", "file_changes"} <= set(tables)
        scanned = 0
        for table in tables:
            for row in conn.execute(f'SELECT * FROM "{table}"'):
                for value in row:
                    if isinstance(value, str):
                        scanned += 1
                        assert leaked(value) == [], (table, value[:200])
                    elif isinstance(value, bytes):
                        assert leaked_bytes(value) == [], table
        assert scanned > 1000
        assert conn.execute("SELECT count(*) FROM chunks WHERE text LIKE '%[REDACTED:%'").fetchone()[0] >= len(CORPUS)
    finally:
        conn.close()
    for path in root.glob("catalog.db*"):
        assert leaked_bytes(path.read_bytes()) == [], path.name


def test_no_secret_in_session_indexes_or_memory_views(default_store):
    """The per-session indexes (chunks, details, turn errors) and memory views are derived from
    redacted events."""
    root, ids = default_store
    for sid in ids:
        directory = memstore.session_directory(root, sid)
        for path in [*(directory / "index").glob("session.db*"), *(directory / "derived").glob("*")]:
            assert leaked_bytes(path.read_bytes()) == [], (sid, path.name)


def _explorer_paths(root: Path, ids: list[str]) -> list[str]:
    paths = ["/-/memstore", "/-/memstore.json"]
    for sid in ids:
        q = quote_id(sid)
        paths += [f"/-/memstore/sessions/{q}", f"/-/memstore/sessions/{q}.json"]
        with memstore.read_session(root, sid) as reader:
            turns = [t.number for t in reader.turns()]
            seqs = [r.seq for r in reader.iter_records()]
        for n in turns:
            paths += [f"/-/memstore/sessions/{q}/turns/{n}", f"/-/memstore/sessions/{q}/turns/{n}.json"]
        for seq in seqs:
            paths += [f"/-/memstore/sessions/{q}/events/{seq}", f"/-/memstore/sessions/{q}/events/{seq}.json"]
    # Words found around the secrets: their results are the chunks that held them.
    for words in CONTEXT_QUERIES:
        paths += [f"/-/memstore/search?q={quote(words)}", f"/-/memstore/search.json?q={quote(words)}&limit=100"]
    for table in ("chunks", "events", "turns", "sessions", "file_changes", "commands", "errors", "tool_calls"):
        paths += [f"/catalog/{table}.json?_shape=array&_size=max", f"/catalog/{table}?_size=max"]
    return paths


def test_the_explorer_shows_no_secret(default_store):
    """Every page of the explorer (each session, turn and event, HTML and .json, searches for
    each secret) and Datasette's own table pages, through a real Datasette."""
    root, ids = default_store
    ds = make_datasette(root)
    paths = _explorer_paths(root, ids)

    async def fetch_all():
        return [(p, await ds.client.get(p)) for p in paths]

    shown = 0
    for path, response in asyncio.run(fetch_all()):
        assert response.status_code == 200, (path, response.status_code)
        text = "\n".join(strings_in(json.loads(response.text))) if ".json" in path else html.unescape(response.text)
        assert leaked(text) == [], path
        shown += "[REDACTED:" in text
    assert shown > len(CORPUS)  # the markers are shown where the secrets were


def test_explorer_search_for_a_secret_returns_no_secret(default_store):
    """Searching the explorer for each secret (whole, and its middle): no result, and no
    session it lists, holds one (the page echoes the query the user typed; that is theirs)."""
    root, _ids = default_store
    ds = make_datasette(root)
    paths = [f"/-/memstore/search.json?q={quote(n)}&limit=100" for s in SECRETS for n in _needles(s)]

    async def fetch_all():
        return [(p, await ds.client.get(p)) for p in paths]

    hits = 0
    for path, response in asyncio.run(fetch_all()):
        assert response.status_code == 200, path
        payload = response.json()
        hits += len(payload["results"])
        assert leaked("\n".join(strings_in([payload["results"], payload["sessions"]]))) == [], path
    assert hits > 0


def test_the_cli_prints_no_secret(default_store):
    """show (manifest, every turn, text and JSON), search, sessions and facts."""
    root, ids = default_store
    runner = CliRunner()
    outputs = []

    def run(*args: str) -> str:
        result = runner.invoke(cli, [args[0], "--root", str(root), *args[1:]], catch_exceptions=False)
        assert result.exit_code == 0, (args, result.output)
        outputs.append(result.output)
        return result.output

    run("sessions")
    run("sessions", "--json")
    run("facts")
    run("facts", "--json")
    for sid in ids:
        run("show", sid)
        run("show", sid, "--json")
        run("facts", "--session", sid, "--json")
        with memstore.read_session(root, sid) as reader:
            turns = [t.number for t in reader.turns()]
        for n in turns:
            run("show", sid, "--turn", str(n))
            run("show", sid, "--turn", str(n), "--json")
    for secret in SECRETS:
        for needle in _needles(secret):
            run("search", "--json", "--", needle)
            run("search", "--", needle)
    for output in outputs:
        assert leaked(output) == []
        assert leaked("\n".join(strings_in(_json_or_none(output)))) == []
    assert any("[REDACTED:" in o for o in outputs)


def _json_or_none(text: str):
    try:
        return json.loads(text)
    except ValueError:
        return None


def test_write_time_redaction_keeps_every_secret_off_the_disk(tmp_path):
    """With [redact] at_write = true, appends and imports log redacted events: after writing,
    importing (twice: the second finds nothing new), rebuilding, refreshing the catalog and
    serving pages, no file under the store holds a secret in any byte."""
    root = tmp_path / "store"
    root.mkdir()
    (root / "config.toml").write_text("[redact]\nat_write = true\n")
    ids, report = _build_store(root, tmp_path)
    again = memstore.import_logs(root, [tmp_path / "agent-logs"], settle_seconds=0)
    assert again.events_appended == 0 and not again.problems, again
    ds = make_datasette(root)

    async def fetch_all():
        return [await ds.client.get(p) for p in _explorer_paths(root, ids)[:40]]

    assert all(r.status_code == 200 for r in asyncio.run(fetch_all()))
    files = [p for p in root.rglob("*") if p.is_file() and not p.is_symlink()]
    assert len(files) > 20
    for path in files:
        assert leaked_bytes(path.read_bytes()) == [], path.relative_to(root)
    # What was redacted is marked, not dropped.
    log = (memstore.session_directory(root, ids[0]) / "events.jsonl").read_text()
    assert "[REDACTED:" in log
