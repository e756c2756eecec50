"""``memstore mcp``: a read-only MCP server over stdio, so an agent can ask its own memory.

Seven tools, each named for what it answers and described in a few lines an agent reads once:
``search`` (BM25 with session, agent, working-directory and date filters), ``get_session``
(turns with prompt, status, tokens and cost), ``get_turn`` (a turn's events, long values cut
with the call that pages through them), ``get_event`` (one event, or one long value of it, a
page at a time), ``recent_sessions`` (by repository or working directory), ``memory_facts``
and ``sql_query`` (one read-only statement over the catalog, see :mod:`memstore.sql`).

What it guarantees:

- **Read-only.** Nothing it offers writes a session. It refreshes the catalog (a regenerable
  view) when the store can be written, and reads it as it is when not.
- **Redacted.** Every result, and every error message, passes through the store's redactor
  (:func:`memstore.redact.redactor_for`); long values are redacted whole before they are cut,
  so a secret cannot straddle a page boundary; SQL reads free text only redacted.
- **Bounded.** Every limit has a maximum in the tool's JSON schema and is checked again here;
  results are compact JSON text that says how to fetch more (``next``, ``fetch``).
- **Clear errors.** Bad arguments (unknown names, wrong types, limits out of range, ids that
  look like paths, dates that are not dates) and missing sessions or turns come back as tool
  errors (``isError``) with one sentence saying what to change; the server keeps running.

The tool logic is plain synchronous Python (:class:`MemoryTools`), importable without the MCP
SDK; only :func:`build_server` and :func:`serve` import it (``pip install 'memstore[mcp]'``).
"""

from __future__ import annotations

import json
import logging
import os
import re
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, Union

import orjson

from . import events as ev
from .errors import EventNotFound, InvalidSessionId, MemstoreError, SessionNotFound, TurnNotFound
from .layout import check_session_id
from .redact import Redactor, redactor_for
from .sql import QueryError, QueryLimits, catalog_uri, query_catalog, redact_chunk, redact_fact
from .store import Store

if TYPE_CHECKING:
    from .pricing import Cost
    from .reader import SessionReader
    from .session.index import Turn

logger = logging.getLogger(__name__)

__all__ = ("MCPUnavailable", "MemoryTools", "TOOLS", "ToolError", "build_server", "serve")

SERVER_NAME = "memstore"
INSTRUCTIONS = (
    "memstore holds the logs of past coding-agent sessions (Codex, Claude Code, VT Code, memstore's own). "
    "Use search to find where something was done or said, recent_sessions to see what happened in a "
    "repository, get_session and get_turn to read a session, memory_facts for what sessions remembered, "
    "and sql_query for counts, tokens and costs. Everything is read-only and secrets are redacted."
)

SNIPPET_CHARS = 240
PROMPT_CHARS = 300
LIST_ITEMS = 100
TURN_OUTPUT_CHARS = 60_000
PER_SESSION_SEARCH = 16
MAX_OVERFETCH = 2_000
_MAX_INT = 2**53  # what every JSON client can represent exactly
_WORDS = re.compile(r"[^\W_]+")
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}\Z")


class ToolError(MemstoreError, ValueError):
    """A tool call that cannot be answered as asked; the message says what to change."""


class MCPUnavailable(MemstoreError):
    """The MCP SDK is not installed."""


# --------------------------------------------------------------------------------------------
# The tools: names, descriptions, schemas


def _string(description: str, max_length: int, **extra: Any) -> dict[str, Any]:
    return {"type": "string", "description": description, "maxLength": max_length, **extra}


def _integer(description: str, minimum: int, maximum: int, default: Optional[int] = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"type": "integer", "description": description, "minimum": minimum, "maximum": maximum}
    if default is not None:
        spec["default"] = default
    return spec


_SESSION_ID = _string("A session id, as search or recent_sessions return it.", 1024, minLength=1)
_AGENT = _string("Only sessions of this agent: codex, claude, vtcode or memstore.", 64, minLength=1)
_MACHINE = _string(
    "Only sessions born in this store (machine): its store id or label, as sql_query's sessions.origin_label "
    "shows them (imported sessions keep the store they came from).",
    200,
    minLength=1,
)
_CWD = _string(
    "Only sessions that ran in this working directory or repository, or below it (an absolute path).", 4096, minLength=1
)
_SINCE = _string("Only from this date (YYYY-MM-DD, UTC) or RFC 3339 time on.", 64, minLength=1)
_UNTIL = _string("Only before this RFC 3339 time; a date (YYYY-MM-DD) includes that whole day.", 64, minLength=1)


def _schema(properties: dict[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": list(required), "additionalProperties": False}


@dataclass(frozen=True)
class Tool:
    """One tool: what ``tools/list`` shows, and the :class:`MemoryTools` method that answers it."""

    name: str
    title: str
    description: str
    input_schema: dict[str, Any]
    method: str


TOOLS: dict[str, Tool] = {
    tool.name: tool
    for tool in (
        Tool(
            "search",
            "Search past agent sessions",
            "BM25 full-text search over every past agent session in this store: prompts, answers, reasoning, "
            "commands and their output, file changes, tool calls, memory facts. Filter by session_id, agent, cwd "
            "(a repository or working directory, and below), machine, since/until dates, or source. Each hit gives "
            "session_id, turn, seq, a snippet and `fetch`, the call that shows it in context. Page with offset.",
            _schema(
                {
                    "query": _string(
                        "Words to look for (any text; operators and quotes are ignored).", 1000, minLength=1
                    ),
                    "session_id": _SESSION_ID,
                    "agent": _AGENT,
                    "cwd": _CWD,
                    "machine": _MACHINE,
                    "since": _SINCE,
                    "until": _UNTIL,
                    "source": {
                        "type": "string",
                        "enum": ["event", "session"],
                        "description": "event: what happened in sessions; session: memory facts only.",
                    },
                    "limit": _integer("Hits to return.", 1, 50, 10),
                    "offset": _integer("Hits to skip (for the next page).", 0, 500, 0),
                },
                ("query",),
            ),
            "search",
        ),
        Tool(
            "get_session",
            "Read a session",
            "One session: agent, working directory, git branch, status, times, and its turns, each with its "
            "prompt, status, model, tokens and cost (reported by the agent, or estimated from a price table named "
            "by price_version, or unpriced for an unknown model), plus session totals. Pages through turns with "
            "from_turn; get_turn shows one turn's events.",
            _schema(
                {
                    "session_id": _SESSION_ID,
                    "from_turn": _integer("First turn number to list (default: the first the log holds).", 1, _MAX_INT),
                    "limit": _integer("Turns to list.", 1, 200, 50),
                },
                ("session_id",),
            ),
            "get_session",
        ),
        Tool(
            "get_turn",
            "Read one turn's events",
            "The events of one turn in log order (prompt, reasoning, commands with their output, file changes, "
            "tool calls, answer), each as {seq, ts, event}. A string longer than max_chars is cut, and the cut "
            "says which get_event call returns the rest. Page through events with offset.",
            _schema(
                {
                    "session_id": _SESSION_ID,
                    "turn": _integer("Turn number (from get_session or a search hit).", 1, _MAX_INT),
                    "offset": _integer("Events of the turn to skip (for the next page).", 0, 1_000_000, 0),
                    "limit": _integer("Events to return.", 1, 200, 50),
                    "max_chars": _integer("Longest string shown whole; longer ones are cut.", 100, 20_000, 1_500),
                },
                ("session_id", "turn"),
            ),
            "get_turn",
        ),
        Tool(
            "get_event",
            "Read one event, or page through a long value",
            "One event by seq. With field (a JSON Pointer into the event, as the cuts of get_turn name it, e.g. "
            "/item/aggregated_output) it returns that one value a page at a time: offset and max_chars count "
            "characters of a string (items of a list).",
            _schema(
                {
                    "session_id": _SESSION_ID,
                    "seq": _integer("The event's sequence number (from search or get_turn).", 1, _MAX_INT),
                    "field": _string("JSON Pointer of the value to page through, e.g. /item/aggregated_output.", 1000),
                    "offset": _integer("Characters (or list items) of the value to skip.", 0, 2**40, 0),
                    "max_chars": _integer("Characters to return (items: max_chars / 100).", 100, 50_000, 8_000),
                },
                ("session_id", "seq"),
            ),
            "get_event",
        ),
        Tool(
            "recent_sessions",
            "Recent sessions of a repository",
            "Sessions, most recently updated first, with agent, working directory, branch, status, turn count, "
            "first prompt (title), model, tokens and the machine (store) it was born in. Filter by cwd (a "
            "repository or working directory, and below), agent, machine, or since, to see what was done before "
            "in this repository. Page with offset.",
            _schema(
                {
                    "cwd": _CWD,
                    "agent": _AGENT,
                    "machine": _MACHINE,
                    "since": _SINCE,
                    "limit": _integer("Sessions to return.", 1, 100, 20),
                    "offset": _integer("Sessions to skip (for the next page).", 0, 100_000, 0),
                }
            ),
            "recent_sessions",
        ),
        Tool(
            "memory_facts",
            "Facts the sessions remembered",
            "Grounded facts from the sessions' memory views (short statements taken from prompts and from "
            "successful tool output), newest sessions first. Filter by session_id, cwd, agent or machine. Page "
            "with offset.",
            _schema(
                {
                    "session_id": _SESSION_ID,
                    "cwd": _CWD,
                    "agent": _AGENT,
                    "machine": _MACHINE,
                    "limit": _integer("Facts to return.", 1, 200, 50),
                    "offset": _integer("Facts to skip (for the next page).", 0, 100_000, 0),
                }
            ),
            "memory_facts",
        ),
        Tool(
            "sql_query",
            "Read-only SQL over the catalog",
            "One SQLite SELECT over the catalog, for counts, tokens, costs, failures and durations. Tables: "
            "sessions(session_id, agent, cwd, git_branch, status, created_at, updated_at, turn_count, event_count, "
            "title, model, turns_failed, input_tokens, cached_input_tokens, cache_creation_tokens, output_tokens, "
            "origin_store_id, origin_label), "
            "turns(session_id, number, status, started_at, ended_at, duration_ms, model, error, the same *_tokens), "
            "events(session_id, seq, turn, ts, type, item_type, name, status, exit_code), file_changes(session_id, "
            "seq, turn, path, kind), chunks(session_id, seq, turn, kind, source, created_at, text). Views: "
            "tool_calls, commands, errors, token_usage_daily, token_usage_by_model. "
            "memstore_cost_usd(model, agent, input, cached, cache_writes, output, ts) prices tokens. Free text comes "
            "back redacted. Writes, ATTACH and PRAGMA are refused; 5 s, max_rows rows and 512 KiB at most.",
            _schema(
                {
                    "sql": _string(
                        "One SELECT (or WITH ... SELECT) statement; ? placeholders for params.", 20_000, minLength=1
                    ),
                    "params": {
                        "type": "array",
                        "description": "Values for the ? placeholders.",
                        "items": {"type": ["string", "number", "boolean", "null"]},
                        "maxItems": 100,
                    },
                    "max_rows": _integer("Rows to return at most; the result says when there were more.", 1, 1000, 100),
                },
                ("sql",),
            ),
            "sql_query",
        ),
    )
}


# --------------------------------------------------------------------------------------------
# Arguments


def validate_arguments(tool: Tool, arguments: Any) -> dict[str, Any]:
    """``arguments`` checked against ``tool``'s schema, with defaults filled in (``None`` for an
    optional argument without one); :class:`ToolError` naming the argument otherwise."""
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        raise ToolError(f"{tool.name}: arguments must be a JSON object, not {type(arguments).__name__}")
    properties: dict[str, Any] = tool.input_schema["properties"]
    unknown = sorted(str(k) for k in arguments if k not in properties)
    if unknown:
        raise ToolError(
            f"{tool.name}: unknown argument {', '.join(map(repr, unknown))}; it takes {', '.join(properties)}"
        )
    checked: dict[str, Any] = {}
    for name, spec in properties.items():
        value = arguments.get(name)
        if value is None:
            if name in tool.input_schema["required"]:
                raise ToolError(f"{tool.name}: {name} is required ({spec['description']})")
            checked[name] = spec.get("default")
            continue
        checked[name] = _check_value(tool.name, name, spec, value)
    return checked


def _check_value(tool: str, name: str, spec: dict[str, Any], value: Any) -> Any:
    kind = spec["type"]
    if kind == "integer":
        if type(value) is float and value.is_integer() and abs(value) <= _MAX_INT:
            value = int(value)
        if type(value) is not int:
            raise ToolError(f"{tool}: {name} must be an integer, not {_shown(value)}")
        if not spec["minimum"] <= value <= spec["maximum"]:
            raise ToolError(f"{tool}: {name} must be from {spec['minimum']} to {spec['maximum']} (got {_shown(value)})")
        return value
    if kind == "string":
        if not isinstance(value, str):
            raise ToolError(f"{tool}: {name} must be a string, not {type(value).__name__}")
        if "enum" in spec and value not in spec["enum"]:
            raise ToolError(f"{tool}: {name} must be one of {', '.join(spec['enum'])} (got {_shown(value)})")
        if len(value) > spec.get("maxLength", len(value)):
            raise ToolError(f"{tool}: {name} is {len(value)} characters long; at most {spec['maxLength']}")
        if len(value) < spec.get("minLength", 0) or (spec.get("minLength") and not value.strip()):
            raise ToolError(f"{tool}: {name} must not be empty")
        if "\0" in value:
            raise ToolError(f"{tool}: {name} contains a NUL character")
        return value
    if kind == "array":
        if not isinstance(value, list):
            raise ToolError(f"{tool}: {name} must be an array, not {type(value).__name__}")
        if len(value) > spec["maxItems"]:
            raise ToolError(f"{tool}: {name} has {len(value)} items; at most {spec['maxItems']}")
        for item in value:
            if item is not None and type(item) not in (str, int, float, bool):
                raise ToolError(f"{tool}: every item of {name} must be a string, a number, a boolean or null")
        return value
    raise AssertionError(f"schema type {kind!r} of {tool}.{name} is not checked")  # a bug in TOOLS, not input


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _time_arg(name: str, value: Optional[str], *, end_of_day: bool = False) -> Optional[str]:
    """A ``since``/``until`` argument in memstore's timestamp format (which sorts as text)."""
    if value is None:
        return None
    from datetime import timedelta

    text = value.strip()
    parsed = ev.parse_ts(text + "T00:00:00Z" if _DATE.match(text) else text)
    if parsed is None:
        raise ToolError(
            f"{name} must be a date (YYYY-MM-DD) or an RFC 3339 time such as 2026-11-20T14:00:00Z, not {_shown(value)}"
        )
    if end_of_day and _DATE.match(text):
        parsed += timedelta(days=1)
    try:
        return ev.format_ts(parsed)
    except (OverflowError, ValueError):
        raise ToolError(f"{name} {_shown(value)} is out of range") from None


def _cwd_arg(value: Optional[str]) -> Optional[str]:
    if value is None:
        return None
    path = os.path.expanduser(value.strip())
    if not os.path.isabs(path):
        raise ToolError(f"cwd must be an absolute path (a working directory or repository), not {_shown(value)}")
    return os.path.normpath(path)


def _call(name: str, **arguments: Any) -> str:
    """How an agent asks for more: ``get_turn(session_id="x", turn=3)``."""
    shown = ", ".join(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in arguments.items() if v is not None)
    return f"{name}({shown})"


def _dumps(value: Any) -> str:
    try:
        return orjson.dumps(value).decode()
    except (orjson.JSONEncodeError, TypeError):  # an integer past 64 bits, say
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)


# --------------------------------------------------------------------------------------------
# Answers


class MemoryTools:
    """The answers of the tools over the store at ``root``, as plain Python: ``call(name,
    arguments)`` returns ``(text, is_error)``. Safe to use from several threads (each call opens
    its own readers and connections)."""

    def __init__(self, root: Union[str, os.PathLike[str]]):
        self.store = Store(root)
        self.root = self.store.path
        self.redactor: Redactor = redactor_for(self.root)

    # -- dispatch ------------------------------------------------------------------------------

    def call(self, name: str, arguments: Any) -> tuple[str, bool]:
        """Answer tool ``name``; the text is redacted JSON, or one redacted sentence when
        ``is_error``."""
        tool = TOOLS.get(name) if isinstance(name, str) else None
        if tool is None:
            return f"unknown tool {_shown(name)}; the tools are {', '.join(TOOLS)}", True
        try:
            args = validate_arguments(tool, arguments)
            result = getattr(self, tool.method)(**args)
            return _dumps(self.redactor.redact_value(result)), False
        except (ToolError, QueryError) as exc:
            return self.redactor.redact_text(str(exc)), True
        except SessionNotFound as exc:
            return self.redactor.redact_text(
                f"no session {exc.session_id!r} in this store; find ids with recent_sessions or search"
            ), True
        except MemstoreError as exc:
            logger.warning("mcp: %s failed: %s", name, exc)
            return self.redactor.redact_text(f"{name} failed: {exc}"), True
        except Exception as exc:  # a bug: say so, keep serving
            logger.exception("mcp: %s raised", name)
            return self.redactor.redact_text(f"{name} failed unexpectedly: {type(exc).__name__}: {exc}"), True

    # -- helpers -------------------------------------------------------------------------------

    @contextmanager
    def _catalog(self, uri: Optional[str] = None) -> Iterator[sqlite3.Connection]:
        """The catalog open read-only: at ``uri`` (from :func:`catalog_uri`, when this answer
        already refreshed it), else refreshed first when the store can be written."""
        conn = sqlite3.connect(uri or catalog_uri(self.root), uri=True, isolation_level=None)
        try:
            conn.execute("BEGIN")  # one snapshot per answer
            yield conn
        except sqlite3.Error as exc:
            raise ToolError(f"the catalog could not be read: {exc}") from exc
        finally:
            conn.close()

    def _session_id(self, value: str) -> str:
        """``value`` as a session id: one memstore accepts, and not a path (an id with a path
        separator or a leading dot is taken only if the catalog knows it: memstore maps every
        id to a directory of its own, so such an id cannot escape the store, but it is almost
        always a mistake)."""
        try:
            check_session_id(value)
        except InvalidSessionId as exc:
            raise ToolError(f"invalid session id: {exc}") from None
        if "/" in value or "\\" in value or value.startswith(".") or any(ord(c) < 32 for c in value):
            known = False
            try:
                with self._catalog() as conn:
                    known = conn.execute("SELECT 1 FROM sessions WHERE session_id = ?", (value,)).fetchone() is not None
            except (QueryError, ToolError):
                pass
            if not known:
                raise ToolError(
                    f"{_shown(value)} looks like a path, not a session id (no session has it); "
                    "take ids from search or recent_sessions"
                )
        return value

    def _session_filter(
        self, agent: Optional[str], cwd: Optional[str], machine: Optional[str] = None
    ) -> tuple[str, list[Any]]:
        """An SQL condition on ``sessions`` (alias ``s``) for the agent, cwd and machine filters
        (a machine is a store id or label: the store the session was born in)."""
        clauses: list[str] = ["1"]
        params: list[Any] = []
        if agent is not None:
            clauses.append("s.agent = ?")
            params.append(agent.strip())
        if machine is not None:
            clauses.append("(s.origin_store_id = ? OR s.origin_label = ?)")
            params += [machine.strip(), machine.strip()]
        if cwd is not None:
            prefix = cwd if cwd.endswith("/") else cwd + "/"
            clauses.append("(s.cwd = ? OR substr(s.cwd, 1, ?) = ?)")
            params.extend([cwd, len(prefix), prefix])
        return " AND ".join(clauses), params

    # -- search --------------------------------------------------------------------------------

    def search(
        self,
        query: str,
        session_id: Optional[str],
        agent: Optional[str],
        cwd: Optional[str],
        machine: Optional[str],
        since: Optional[str],
        until: Optional[str],
        source: Optional[str],
        limit: int,
        offset: int,
    ) -> dict:
        if session_id is not None:
            session_id = self._session_id(session_id)
        since_ts = _time_arg("since", since)
        until_ts = _time_arg("until", until, end_of_day=True)
        cwd = _cwd_arg(cwd)
        tokens = {t.lower() for t in _WORDS.findall(query)}
        if not tokens:
            raise ToolError("search: query has no words to look for (letters or digits)")
        want = offset + limit + 1  # one more, to know whether there is a next page
        uri = catalog_uri(self.root)  # refreshed once for this answer (the search refreshes it too)
        allowed: Optional[set[str]] = None
        if agent is not None or cwd is not None:
            where, params = self._session_filter(agent, cwd)
            with self._catalog(uri) as conn:
                allowed = {row[0] for row in conn.execute(f"SELECT s.session_id FROM sessions s WHERE {where}", params)}
            if session_id is not None:
                allowed &= {session_id}
        hits, complete = self._hits(query, want, session_id, since_ts, until_ts, source, allowed, machine)
        page = hits[offset : offset + limit]
        texts, sessions = self._hit_context(page, uri)
        results = []
        for hit in page:
            text = texts.get(hit.chunk_id)  # redacted; None if a refresh replaced the chunk meanwhile
            snippet = _snippet(text, tokens) if text is not None else None
            agent_name, session_cwd = sessions.get(hit.session_id, (None, None))
            if hit.seq is None:
                fetch = _call("memory_facts", session_id=hit.session_id)
            elif hit.turn is not None:
                fetch = _call("get_turn", session_id=hit.session_id, turn=hit.turn)
            else:
                fetch = _call("get_event", session_id=hit.session_id, seq=hit.seq)
            results.append(
                {
                    "session_id": hit.session_id,
                    "turn": hit.turn,
                    "seq": hit.seq,
                    "kind": hit.kind or hit.source,
                    "created_at": hit.created_at,
                    "score": round(hit.score, 4),
                    "agent": agent_name,
                    "cwd": session_cwd,
                    "snippet": snippet,
                    "fetch": fetch,
                }
            )
        more = len(hits) > offset + limit
        answer: dict[str, Any] = {
            "query": query,
            "offset": offset,
            "count": len(results),
            "results": results,
            "next": _call(
                "search",
                query=query,
                session_id=session_id,
                agent=agent,
                cwd=cwd,
                machine=machine,
                since=since,
                until=until,
                source=source,
                limit=limit,
                offset=offset + limit,
            )
            if more
            else None,
        }
        if not complete:
            answer["note"] = (
                f"the filters were applied to the best {MAX_OVERFETCH} matches of the whole store; more "
                "matches may exist: add words to the query or filter by session_id"
            )
        return answer

    def _hits(
        self,
        query: str,
        want: int,
        session_id: Optional[str],
        since: Optional[str],
        until: Optional[str],
        source: Optional[str],
        allowed: Optional[set[str]],
        machine: Optional[str] = None,
    ) -> tuple[list, bool]:
        """The best ``want`` hits that pass every filter, best first, and whether they are
        certainly the best (``False`` when over-fetching stopped at :data:`MAX_OVERFETCH`).

        The library's search filters by one session, ``since``, ``source`` and ``machine``; agent, cwd (a set
        of sessions) and ``until`` are applied here: with a few sessions, one search per session
        (scores are comparable: the statistics are the whole store's), else by filtering a
        growing number of the best hits of the whole store."""
        from .search import search_memory

        def search(n: int, sid: Optional[str]) -> list:
            return search_memory(self.root, query, n, source=source, session_id=sid, since=since, machine=machine)

        def keep(hit: Any) -> bool:
            if allowed is not None and hit.session_id not in allowed:
                return False
            return until is None or (hit.created_at is not None and hit.created_at < until)

        if allowed is not None and not allowed:
            return [], True
        if allowed is None and until is None:
            return search(want, session_id), True
        if allowed is not None and until is None and len(allowed) <= PER_SESSION_SEARCH:
            merged = [hit for sid in sorted(allowed) for hit in search(want, sid)]
            merged.sort(key=lambda h: (-h.score, h.chunk_id))
            return merged[:want], True
        n = max(want * 4, 50)
        while True:
            hits = search(min(n, MAX_OVERFETCH), session_id)
            kept = [hit for hit in hits if keep(hit)]
            if len(kept) >= want or len(hits) < min(n, MAX_OVERFETCH):
                return kept[:want], True
            if n >= MAX_OVERFETCH:
                return kept, False
            n *= 4

    def _hit_context(
        self, hits: list, uri: str
    ) -> tuple[dict[str, str], dict[str, tuple[Optional[str], Optional[str]]]]:
        """The whole text of each hit's chunk, redacted (the snippet is cut from it, so the
        window cannot cut a secret in half and hide it from the redactor), and each session's
        agent and cwd."""
        if not hits:
            return {}, {}
        with self._catalog(uri) as conn:
            texts = {}
            for hit in hits:
                text = self._redacted_chunk(conn, hit.chunk_id)
                if text is not None:
                    texts[hit.chunk_id] = text
            session_ids = json.dumps(sorted({h.session_id for h in hits}))
            sessions = {
                row[0]: (row[1], row[2])
                for row in conn.execute(
                    "SELECT session_id, agent, cwd FROM sessions WHERE session_id IN (SELECT value FROM json_each(?))",
                    (session_ids,),
                )
            }
        return texts, sessions

    def _redacted_chunk(self, conn: sqlite3.Connection, chunk_id: str) -> Optional[str]:
        """A chunk's text redacted with its neighbours of the same event (see
        :func:`memstore.sql.redact_chunk`), or ``None`` if a refresh replaced it meanwhile."""
        row = conn.execute(
            "SELECT session_id, seq, part, start_line, end_line, source, text FROM chunks WHERE chunk_id = ?",
            (chunk_id,),
        ).fetchone()
        if row is None:
            return None
        session_id, seq, part, start_line, end_line, source, text = row
        neighbours = []
        if seq is not None and part is not None:
            neighbours = conn.execute(
                "SELECT part, start_line, end_line, text FROM chunks WHERE session_id = ? AND seq = ? "
                "AND part IN (?, ?)",
                (session_id, seq, part - 1, part + 1),
            ).fetchall()
        return redact_chunk(
            self.redactor,
            text,
            source=source,
            part=part,
            start_line=start_line,
            end_line=end_line,
            neighbours=neighbours,
        )

    # -- sessions ------------------------------------------------------------------------------

    def get_session(self, session_id: str, from_turn: Optional[int], limit: int) -> dict:
        from .pricing import session_cost, summarize

        session_id = self._session_id(session_id)
        with self.store.read(session_id) as reader:
            manifest = reader.manifest
            source = manifest.source if isinstance(manifest.source, dict) else {}
            turns = reader.turns()
            costs = [self._turn_cost(reader, turn, source) for turn in turns]
            closing = self._thread_completed(reader, manifest.next_seq - 1)
        first = from_turn if from_turn is not None else (turns[0].number if turns else manifest.retained_turn_base)
        index = next((i for i, t in enumerate(turns) if t.number >= first), len(turns))
        page = list(zip(turns, costs))[index : index + limit]
        prompts = self._prompts(session_id, [t.number for t, _ in page])
        totals = {
            key: sum(getattr(t, f"{key}_tokens") for t in turns)
            for key in ("input", "cached_input", "cache_creation", "output")
        }
        summary = session_cost(costs, closing) if costs or closing else summarize([])
        rest = turns[index + limit :]
        return {
            "session_id": manifest.session_id,
            "agent": _text(source.get("agent")) or "memstore",
            "agent_version": _text(source.get("agent_version")),
            "cwd": _text(source.get("cwd")),
            "git_branch": _text(source.get("git_branch")),
            "parent_session_id": _text(source.get("parent_session_id")),
            "status": manifest.status,
            "created_at": manifest.created_at,
            "updated_at": manifest.updated_at,
            "turn_count": manifest.turn_count,
            "open_turn": manifest.in_turn,
            "event_count": manifest.event_count,
            "first_turn": turns[0].number if turns else None,
            "tokens": totals,
            "cost": summary.to_dict(),
            "turns": [self._turn_summary(t, cost, prompts.get(t.number)) for t, cost in page],
            "next": _call("get_session", session_id=session_id, from_turn=rest[0].number, limit=limit)
            if rest
            else None,
            "turn_detail": _call("get_turn", session_id=session_id, turn=page[0][0].number) if page else None,
        }

    def _turn_cost(self, reader: SessionReader, turn: Turn, source: dict) -> Cost:
        """The turn's cost: the agent's figure or an estimate from its end event (``usage`` and
        ``model``), else (no end yet) its indexed tokens of its model, priced at its time."""
        from .pricing import TokenUsage, price_usage, turn_cost

        hint = _text(source.get("agent"))
        provider = _text(source.get("model_provider"))
        when = turn.ended_at or turn.started_at
        end = None
        if turn.last_seq is not None and turn.status not in ("open", "interrupted"):
            try:
                end = reader.record(turn.last_seq).event
            except EventNotFound:
                end = None
        if end is not None and end.get("type") in ev.TURN_ENDS:
            if not isinstance(end.get("model"), str) and turn.model:
                end = {**end, "model": turn.model}
            return turn_cost(end, provider_hint=hint, provider=provider, when=when)
        usage = TokenUsage(turn.input_tokens, turn.cached_input_tokens, turn.cache_creation_tokens, turn.output_tokens)
        return price_usage(turn.model, usage, provider_hint=hint, provider=provider, when=when)

    @staticmethod
    def _thread_completed(reader: SessionReader, seq: int) -> Optional[dict]:
        if seq < 1:
            return None
        try:
            event = reader.record(seq).event
        except EventNotFound:
            return None
        return event if event.get("type") == ev.THREAD_COMPLETED else None

    def _prompts(self, session_id: str, numbers: list[int]) -> dict[int, str]:
        """The first prompt of each turn in ``numbers``, from the catalog's chunks (or, when the
        catalog cannot be read, from the turns' events)."""
        if not numbers:
            return {}
        prompts: dict[int, str] = {}
        try:
            with self._catalog() as conn:
                for turn, text in conn.execute(
                    "SELECT turn, text FROM chunks WHERE session_id = ? AND kind = 'user_message' AND part = 0 "
                    "AND turn BETWEEN ? AND ? ORDER BY seq",
                    (session_id, min(numbers), max(numbers)),
                ):
                    prompts.setdefault(turn, text)
            return prompts
        except QueryError as exc:
            logger.info("mcp: prompts of %s from its log (%s)", session_id, exc)
        with self.store.read(session_id) as reader:
            for number in numbers:
                for event in reader.reconstruct_turn(number):
                    found = ev.event_text(event)
                    if found is not None and found[0] == "user_message":
                        prompts[number] = found[1]
                        break
        return prompts

    def _turn_summary(self, turn: Turn, cost: Cost, prompt: Optional[str]) -> dict:
        priced: dict[str, Any] = {"usd": None if cost.usd is None else float(cost.usd), "source": cost.source.value}
        if cost.note:
            priced["note"] = cost.note
        return {
            "turn": turn.number,
            "status": turn.status,
            "started_at": turn.started_at,
            "ended_at": turn.ended_at,
            "model": turn.model,
            "prompt": _clip(self.redactor.redact_text(prompt), PROMPT_CHARS) if prompt else None,
            "events": turn.event_count,
            "tokens": {
                "input": turn.input_tokens,
                "cached_input": turn.cached_input_tokens,
                "cache_creation": turn.cache_creation_tokens,
                "output": turn.output_tokens,
            },
            "cost": priced,
            "error": _clip(self.redactor.redact_text(turn.error), PROMPT_CHARS) if turn.error else None,
        }

    # -- turns and events ----------------------------------------------------------------------

    def get_turn(self, session_id: str, turn: int, offset: int, limit: int, max_chars: int) -> dict:
        session_id = self._session_id(session_id)
        with self.store.read(session_id) as reader:
            info = reader.turn(turn)
            try:
                records = reader.turn_records(turn)
            except TurnNotFound:
                numbers = [t.number for t in reader.turns()]
                held = f"it holds turns {numbers[0]} to {numbers[-1]}" if numbers else "it holds no turn"
                raise ToolError(f"session {session_id!r} has no turn {turn}; {held}") from None
        shown: list[dict] = []
        used = 0
        for record in records[offset : offset + limit]:
            entry = {
                "seq": record.seq,
                "ts": record.ts,
                "event": _cut(self.redactor.redact_value(record.event), max_chars, _event_hint(session_id, record.seq)),
            }
            size = len(_dumps(entry))
            if shown and used + size > TURN_OUTPUT_CHARS:
                break
            shown.append(entry)
            used += size
        end = offset + len(shown)
        return {
            "session_id": session_id,
            "turn": turn,
            "status": info.status if info else None,
            "started_at": info.started_at if info else None,
            "ended_at": info.ended_at if info else None,
            "model": info.model if info else None,
            "event_count": len(records),
            "offset": offset,
            "events": shown,
            "next": _call("get_turn", session_id=session_id, turn=turn, offset=end, limit=limit, max_chars=max_chars)
            if end < len(records)
            else None,
        }

    def get_event(self, session_id: str, seq: int, field: Optional[str], offset: int, max_chars: int) -> dict:
        session_id = self._session_id(session_id)
        with self.store.read(session_id) as reader:
            try:
                record = reader.record(seq)
                position = reader.position(seq)
            except EventNotFound:
                raise ToolError(
                    f"session {session_id!r} has no event with seq {seq} (it may have been evicted)"
                ) from None
        event = self.redactor.redact_value(record.event)  # whole, before any cut
        answer: dict[str, Any] = {
            "session_id": session_id,
            "seq": seq,
            "ts": record.ts,
            "turn": position[2] if position else None,
        }
        if field is None:
            answer["event"] = _cut(event, max_chars, _event_hint(session_id, seq))
            return answer
        value = _resolve(event, field)
        answer["field"] = field
        if isinstance(value, str):
            piece = value[offset : offset + max_chars]
            end = offset + len(piece)
            answer.update(
                {
                    "offset": offset,
                    "total_chars": len(value),
                    "text": piece,
                    "next": _call(
                        "get_event", session_id=session_id, seq=seq, field=field, offset=end, max_chars=max_chars
                    )
                    if end < len(value)
                    else None,
                }
            )
        elif isinstance(value, list):
            count = max(1, max_chars // 100)
            items = value[offset : offset + count]
            end = offset + len(items)
            answer.update(
                {
                    "offset": offset,
                    "total_items": len(value),
                    "items": [
                        _cut(item, max_chars, _event_hint(session_id, seq, f"{field}/{offset + i}"))
                        for i, item in enumerate(items)
                    ],
                    "next": _call(
                        "get_event", session_id=session_id, seq=seq, field=field, offset=end, max_chars=max_chars
                    )
                    if end < len(value)
                    else None,
                }
            )
        else:
            answer["value"] = _cut(value, max_chars, _event_hint(session_id, seq, field))
        return answer

    # -- catalog listings ----------------------------------------------------------------------

    def recent_sessions(
        self,
        cwd: Optional[str],
        agent: Optional[str],
        machine: Optional[str],
        since: Optional[str],
        limit: int,
        offset: int,
    ) -> dict:
        cwd = _cwd_arg(cwd)
        since_ts = _time_arg("since", since)
        where, params = self._session_filter(agent, cwd, machine)
        if since_ts is not None:
            where += " AND s.updated_at >= ?"
            params.append(since_ts)
        with self._catalog() as conn:
            rows = conn.execute(
                "SELECT s.session_id, s.agent, s.cwd, s.git_branch, s.status, s.created_at, s.updated_at, s.turn_count, "
                "s.turns_failed, s.title, s.model, s.input_tokens, s.output_tokens, s.origin_store_id, "
                f"s.origin_label FROM sessions s WHERE {where} ORDER BY s.updated_at DESC, s.session_id LIMIT ? OFFSET ?",
                (*params, limit + 1, offset),
            ).fetchall()
        sessions = [
            {
                "session_id": r[0],
                "agent": r[1],
                "cwd": r[2],
                "git_branch": r[3],
                "status": r[4],
                "created_at": r[5],
                "updated_at": r[6],
                "turn_count": r[7],
                "turns_failed": r[8],
                "title": r[9],
                "model": r[10],
                "tokens": {"input": r[11] or 0, "output": r[12] or 0},
                "machine": {"store_id": r[13], "label": r[14]},
                "fetch": _call("get_session", session_id=r[0]),
            }
            for r in rows[:limit]
        ]
        return {
            "count": len(sessions),
            "offset": offset,
            "sessions": sessions,
            "next": _call(
                "recent_sessions",
                cwd=cwd,
                agent=agent,
                machine=machine,
                since=since,
                limit=limit,
                offset=offset + limit,
            )
            if len(rows) > limit
            else None,
        }

    def memory_facts(
        self,
        session_id: Optional[str],
        cwd: Optional[str],
        agent: Optional[str],
        machine: Optional[str],
        limit: int,
        offset: int,
    ) -> dict:
        if session_id is not None:
            session_id = self._session_id(session_id)
        cwd = _cwd_arg(cwd)
        where, params = self._session_filter(agent, cwd, machine)
        if session_id is not None:
            where += " AND s.session_id = ?"
            params.append(session_id)
        with self._catalog() as conn:
            rows = conn.execute(
                "SELECT c.session_id, c.text, c.kind, c.created_at FROM chunks c JOIN sessions s "
                f"ON s.session_id = c.session_id WHERE c.source = 'session' AND {where} "
                "ORDER BY s.updated_at DESC, c.session_id, c.id LIMIT ? OFFSET ?",
                (*params, limit + 1, offset),
            ).fetchall()
        facts = [
            {"session_id": r[0], "fact": redact_fact(self.redactor, r[1]), "source": r[2], "created_at": r[3]}
            for r in rows[:limit]
        ]
        return {
            "count": len(facts),
            "offset": offset,
            "facts": facts,
            "next": _call(
                "memory_facts",
                session_id=session_id,
                cwd=cwd,
                agent=agent,
                machine=machine,
                limit=limit,
                offset=offset + limit,
            )
            if len(rows) > limit
            else None,
        }

    def sql_query(self, sql: str, params: Optional[list], max_rows: int) -> dict:
        result = query_catalog(
            self.root, sql, params or [], limits=QueryLimits(max_rows=max_rows), redactor=self.redactor
        )
        answer = result.to_dict()
        if result.truncated == "rows":
            answer["note"] = f"only the first {max_rows} rows: page with LIMIT/OFFSET, or aggregate"
        elif result.truncated == "bytes":
            answer["note"] = f"cut after {len(result.rows)} rows at 512 KiB: select fewer or shorter columns"
        return answer


# --------------------------------------------------------------------------------------------
# Cutting long values


def _text(value: Any) -> Optional[str]:
    return value if isinstance(value, str) else None


def _clip(text: str, width: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def _snippet(text: str, tokens: set[str], width: int = SNIPPET_CHARS) -> str:
    """A window of ``text`` around its first query word, whitespace-normalized."""
    start = 0
    if len(text) > width:
        for match in _WORDS.finditer(text):
            if match.group().lower() in tokens:
                start = max(0, match.start() - width // 3)
                break
    piece = " ".join(text[start : start + width].split())
    return ("…" if start > 0 else "") + piece + ("…" if start + width < len(text) else "")


def _event_hint(session_id: str, seq: Optional[int], prefix: str = "") -> Callable[[str, int], str]:
    """What a cut value of event ``seq`` says to call for the rest: ``prefix`` is the JSON
    Pointer of the value that was cut into, when it is not the event itself."""

    def hint(pointer: str, at: int) -> str:
        return _call("get_event", session_id=session_id, seq=seq, field=prefix + pointer, offset=at)

    return hint


def _pointer_part(key: Any) -> str:
    return str(key).replace("~", "~0").replace("/", "~1")


def _cut(value: Any, max_chars: int, hint: Callable[[str, int], str], pointer: str = "") -> Any:
    """``value`` with every string longer than ``max_chars`` cut, and every list longer than
    :data:`LIST_ITEMS` shortened, each cut saying which call returns the rest (``hint(pointer,
    offset)``, ``pointer`` a JSON Pointer into the event)."""
    if isinstance(value, str):
        if len(value) <= max_chars:
            return value
        return f"{value[:max_chars]}… [{len(value) - max_chars} more characters: {hint(pointer, max_chars)}]"
    if isinstance(value, dict):
        return {key: _cut(item, max_chars, hint, f"{pointer}/{_pointer_part(key)}") for key, item in value.items()}
    if isinstance(value, list):
        items = [_cut(item, max_chars, hint, f"{pointer}/{i}") for i, item in enumerate(value[:LIST_ITEMS])]
        if len(value) > LIST_ITEMS:
            items.append(f"… [{len(value) - LIST_ITEMS} more items: {hint(pointer, LIST_ITEMS)}]")
        return items
    return value


def _resolve(event: Any, pointer: str) -> Any:
    """The value at JSON Pointer ``pointer`` (RFC 6901) in ``event``; :class:`ToolError` if none."""
    if pointer in ("", "/"):
        return event
    if not pointer.startswith("/"):
        raise ToolError(
            f"field must be a JSON Pointer starting with '/', such as /item/aggregated_output (got {_shown(pointer)})"
        )
    value = event
    for raw in pointer[1:].split("/"):
        part = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(value, dict) and part in value:
            value = value[part]
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            where = (
                f"keys there: {', '.join(map(str, list(value)[:20]))}"
                if isinstance(value, dict)
                else f"a list of {len(value)} items there"
                if isinstance(value, list)
                else "no value under it"
            )
            raise ToolError(f"field {_shown(pointer)} is not in this event ({_shown(part)} not found; {where})")
    return value


# --------------------------------------------------------------------------------------------
# The MCP server


def build_server(root: Union[str, os.PathLike[str]]) -> Any:
    """The MCP server (the SDK's low-level ``Server``) answering :data:`TOOLS` over the store at
    ``root``. Tool calls run in worker threads, so the protocol keeps flowing while one works."""
    import anyio
    from mcp import types
    from mcp.server.lowlevel import Server

    tools = MemoryTools(root)
    listed = [
        types.Tool(
            name=tool.name,
            title=tool.title,
            description=tool.description,
            input_schema=tool.input_schema,
            annotations=types.ToolAnnotations(
                title=tool.title,
                read_only_hint=True,
                destructive_hint=False,
                idempotent_hint=True,
                open_world_hint=False,
            ),
        )
        for tool in TOOLS.values()
    ]

    async def list_tools(_ctx: Any, _params: Any) -> Any:
        return types.ListToolsResult(tools=listed)

    async def call_tool(_ctx: Any, params: Any) -> Any:
        text, is_error = await anyio.to_thread.run_sync(tools.call, params.name, params.arguments)
        return types.CallToolResult(content=[types.TextContent(type="text", text=text)], is_error=is_error)

    return Server(
        SERVER_NAME,
        version=_version("memstore"),
        instructions=INSTRUCTIONS,
        on_list_tools=list_tools,
        on_call_tool=call_tool,
    )


def _version(package: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return "0"


def serve(root: Union[str, os.PathLike[str]]) -> None:
    """Serve the store at ``root`` over stdio until the client closes the connection.
    :class:`MCPUnavailable` when the MCP SDK is not installed. Logs go to stderr: stdout is the
    protocol's."""
    try:
        import anyio
        from mcp.server.stdio import stdio_server
    except ImportError as exc:
        raise MCPUnavailable(
            f"memstore mcp needs the MCP SDK, which is not installed ({exc}): "
            "install memstore[mcp] (pip install 'memstore[mcp]')"
        ) from None
    if not Path(root).is_dir():
        raise MemstoreError(f"no store at {root} (no such directory)")
    logging.basicConfig(level=logging.WARNING, format="memstore mcp: %(levelname)s %(name)s: %(message)s")
    server = build_server(root)

    async def run() -> None:
        async with stdio_server() as (read_stream, write_stream):
            await server.run(read_stream, write_stream, server.create_initialization_options())

    anyio.run(run)
