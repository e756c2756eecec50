"""The explorer's pages as data: plain functions from a query to a dict.

Each page is one function returning a JSON-ready dict; the HTML page renders that dict and the
``.json`` variant returns it as it is. Lists, totals and charts come from ``catalog.db`` (a
``sqlite3`` connection, read-only); a session's manifest, turns and events come from the
session itself through :func:`memstore.read_session` (exact bytes, never the catalog's copy).

Nothing a page returns holds a secret: what comes from a session (events, the line of an event,
turn errors, prompts, memory facts, the progress ledger) passes through the store's redactor
(:func:`memstore.redact.redactor_for`), events whole before they are rendered; what comes from
the catalog was redacted when it was copied there, and search pages pass through it again.

Every value from a URL arrives here already parsed (ints are ints); ids are checked with
:func:`memstore.fsio.session_dir_name` by the reader before any path is built from them, and
SQL takes them only as bound parameters (sort keys map through a fixed table).
"""

from __future__ import annotations

import logging
import math
import os
import re
import sqlite3
import time
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import date, timedelta
from pathlib import Path
from typing import Any, Optional

import orjson

from .. import events as ev
from ..catalog.report import MissingSession, recorded_missing
from ..errors import EventNotFound, InvalidProgress, MemstoreError, TurnNotFound
from ..layout import derived_dir, session_directory
from ..reader import read_session
from ..redact import Redactor, redactor_for
from ..search import (
    MACHINE_FILTER,
    MemorySearchResult,
    fts_match,
    kept_index,
    machine_params,
    query_terms,
    search_catalog,
    search_memory,
    snippet,
)
from ..views.memory_view import memory_facts_of
from ..views.progress import load_progress
from . import costs
from .commands import benign_exit
from .render import FAILED_STATUSES, display_event
from .resume import resume_command
from .urls import Urls

logger = logging.getLogger("memstore")

SESSIONS_PER_PAGE = 50
TURNS_PER_PAGE = 100
EVENTS_PER_PAGE = 200
PAGE_BYTES = 2 << 20  # of log lines on one turn page
MAX_LINE_SHOWN = 1 << 20  # characters of one event's line shown in HTML (the .json has it whole)
CHART_DAYS = 30
MAX_PAGE = 1_000_000

# Sort keys people can ask for, and the SQL each one means (never user text in SQL).
SORTS = {
    "updated": "updated_at",
    "created": "created_at",
    "turns": "turn_count",
    "events": "event_count",
    "tokens": "(input_tokens + output_tokens)",
    "failed": "turns_failed",
    "status": "status",
    "agent": "agent",
    "machine": "origin_label",
    "session": "session_id",
}
STATUSES = ("active", "completed")

_SESSION_COLUMNS = (
    "session_id",
    "status",
    "created_at",
    "updated_at",
    "turn_count",
    "event_count",
    "agent",
    "agent_version",
    "cwd",
    "git_branch",
    "title",
    "model",
    "turns_failed",
    "input_tokens",
    "cached_input_tokens",
    "cache_creation_tokens",
    "output_tokens",
    "log_bytes",
    "parent_session_id",
    "source_path",
    "retained_turn_base",
    "generation",
    "origin_store_id",
    "origin_label",
)

# The machines (stores) sessions were born in, for the filters: a store id is what a filter
# names best (two stores may share a label, a hostname), its label what people read.
_MACHINES = (
    "SELECT origin_store_id AS store_id, origin_label AS label, count(*) AS sessions FROM sessions "
    "WHERE origin_store_id IS NOT NULL OR origin_label IS NOT NULL "
    "GROUP BY origin_store_id, origin_label ORDER BY origin_label, origin_store_id"
)


def _rows(conn: sqlite3.Connection, sql: str, params: tuple = ()) -> list[dict]:
    cursor = conn.execute(sql, params)
    names = [d[0] for d in cursor.description]
    return [dict(zip(names, row)) for row in cursor.fetchall()]


@contextmanager
def _snapshot(conn: sqlite3.Connection):
    """One read transaction around a page's queries, so a catalog refresh committing between
    two of them cannot make the page disagree with itself (a count, its rows, the totals)."""
    own = not conn.in_transaction
    if own:
        conn.execute("BEGIN")
    try:
        yield
    finally:
        if own and conn.in_transaction:
            conn.execute("COMMIT")


def _like(text: str) -> str:
    return "%" + re.sub(r"([\\%_])", r"\\\1", text) + "%"


def _cache_rate(cached: Optional[int], total: Optional[int]) -> Optional[float]:
    return round(cached / total, 4) if cached is not None and total else None


# --------------------------------------------------------------------------------------------
# Home


@dataclass(frozen=True)
class HomeFilters:
    """What the list of sessions is restricted to (empty: no restriction): ``status``, ``agent``,
    ``model`` (the model of the session's latest turn), ``cwd`` (the working directory, or any
    directory under it), ``since``/``until`` (days, ``YYYY-MM-DD``: sessions active on any day
    between them, both included), ``q`` (text in the id or the first prompt) and ``machine``
    (a store id or label: the sessions born in that store, here or imported from it)."""

    status: str = ""
    agent: str = ""
    model: str = ""
    cwd: str = ""
    since: str = ""
    until: str = ""
    q: str = ""
    machine: str = ""

    def where(self) -> tuple[str, list[Any]]:
        clauses: list[str] = []
        params: list[Any] = []
        for column in ("status", "agent", "model"):
            value = getattr(self, column)
            if value:
                clauses.append(f"{column} = ?")
                params.append(value)
        if self.cwd:
            clauses.append("(cwd = ? OR cwd LIKE ? ESCAPE '\\')")
            params += [self.cwd, re.sub(r"([\\%_])", r"\\\1", self.cwd.rstrip("/")) + "/%"]
        if self.since:
            clauses.append("updated_at >= ?")
            params.append(self.since)
        if self.until:
            clauses.append("created_at < ?")
            params.append(next_day(self.until))
        if self.q:
            clauses.append("(session_id LIKE ? ESCAPE '\\' OR title LIKE ? ESCAPE '\\')")
            params += [_like(self.q), _like(self.q)]
        if self.machine:
            clauses.append("(origin_store_id = ? OR origin_label = ?)")
            params += machine_params(self.machine)
        return (f"WHERE {' AND '.join(clauses)}" if clauses else ""), params

    def params(self) -> dict[str, str]:
        return {k: v for k, v in asdict(self).items() if v}


def day_param(text: Optional[str]) -> str:
    """A ``YYYY-MM-DD`` day from a URL, or ``""`` when it is none."""
    if not isinstance(text, str) or len(text.strip()) != 10:
        return ""
    try:
        return date.fromisoformat(text.strip()).isoformat()
    except ValueError:
        return ""


def next_day(day: str) -> str:
    """The day after ``day`` (a valid ``YYYY-MM-DD``), as text that sorts after every time of ``day``."""
    try:
        return (date.fromisoformat(day) + timedelta(days=1)).isoformat()
    except (ValueError, OverflowError):
        return "9999-12-31T23:59:59.999Z\uffff"


def home_data(
    conn: sqlite3.Connection,
    urls: Urls,
    *,
    page: int = 1,
    sort: str = "updated",
    order: str = "desc",
    filters: HomeFilters = HomeFilters(),
    per_page: int = SESSIONS_PER_PAGE,
    chart: str = "tokens",
) -> dict:
    """The home page: one page of sessions (sorted and filtered), the store's totals and cost,
    what there is to filter by (statuses, agents, models, directories, with their counts), a
    link per sortable column, and usage per day for the chart (``chart``: ``tokens`` or
    ``cost``)."""
    sort = sort if sort in SORTS else "updated"
    order = "asc" if order == "asc" else "desc"
    chart = chart if chart in CHARTS else "tokens"
    with _snapshot(conn):
        return _home_page(conn, urls, filters, page, sort, order, per_page, chart)


CHARTS = ("tokens", "cost")
MAX_DIRECTORIES = 200


def _home_page(
    conn: sqlite3.Connection,
    urls: Urls,
    filters: HomeFilters,
    page: int,
    sort: str,
    order: str,
    per_page: int,
    chart: str,
) -> dict:
    clause, params = filters.where()
    matching = conn.execute(f"SELECT count(*) FROM sessions {clause}", params).fetchone()[0]
    pages = max(1, math.ceil(matching / per_page))
    page = min(max(1, page), pages)
    sessions = _rows(
        conn,
        f"SELECT {', '.join(_SESSION_COLUMNS)} FROM sessions {clause} "
        f"ORDER BY {SORTS[sort]} {order}, session_id {order} LIMIT ? OFFSET ?",
        (*params, per_page, (page - 1) * per_page),
    )
    for row in sessions:
        row["url"] = urls.session(row["session_id"])
        row["cache_hit_rate"] = _cache_rate(row["cached_input_tokens"], row["input_tokens"])
    totals = _rows(
        conn,
        "SELECT count(*) AS sessions, coalesce(sum(turn_count), 0) AS turns, "
        "coalesce(sum(event_count), 0) AS events, coalesce(sum(turns_failed), 0) AS turns_failed, "
        "CAST(total(input_tokens) AS INTEGER) AS input_tokens, "
        "CAST(total(cached_input_tokens) AS INTEGER) AS cached_input_tokens, "
        "CAST(total(cache_creation_tokens) AS INTEGER) AS cache_creation_tokens, "
        "CAST(total(output_tokens) AS INTEGER) AS output_tokens, "
        "coalesce(sum(status = 'active'), 0) AS active FROM sessions",
    )[0]
    totals["cache_hit_rate"] = _cache_rate(totals["cached_input_tokens"], totals["input_tokens"])
    kept = filters.params()

    def url(**changes: Any) -> str:
        state: dict[str, Any] = {**kept, "sort": sort, "order": order, "chart": chart, "page": page, **changes}
        defaults = {"sort": "updated", "order": "desc", "chart": "tokens", "page": 1}
        return urls.home(**{k: v for k, v in state.items() if v and defaults.get(k) != v})

    def sort_url(key: str) -> str:
        flipped = "asc" if (sort == key and order == "desc") else "desc"
        return url(
            sort=key,
            order=flipped if sort == key else ("asc" if key in ("session", "agent", "machine", "status") else "desc"),
            page=1,
        )

    cost = costs.cost_overview(conn)
    per_day = tokens_per_day(conn)
    directories = _rows(
        conn,
        "SELECT cwd, count(*) AS sessions FROM sessions WHERE cwd IS NOT NULL AND cwd != '' GROUP BY cwd "
        "ORDER BY sessions DESC, cwd LIMIT ?",
        (MAX_DIRECTORIES,),
    )
    for row in per_day:
        row["usd"] = cost.get("by_day", {}).get(row["day"], 0.0) if cost.get("available") else None
    return {
        "sessions": sessions,
        "page": page,
        "pages": pages,
        "per_page": per_page,
        "matching": matching,
        "next_url": url(page=page + 1) if page < pages else None,
        "previous_url": url(page=page - 1) if page > 1 else None,
        "filters": {**asdict(filters), "sort": sort, "order": order},
        "filtered": bool(kept),
        "sorts": list(SORTS),
        "sort_urls": {key: sort_url(key) for key in SORTS},
        "chart": chart,
        "chart_urls": {name: url(chart=name) for name in CHARTS},
        "clear_url": urls.home(),
        "totals": totals,
        "cost": cost,
        "statuses": _rows(conn, "SELECT status, count(*) AS sessions FROM sessions GROUP BY status ORDER BY status"),
        "agents": _rows(conn, "SELECT agent, count(*) AS sessions FROM sessions GROUP BY agent ORDER BY agent"),
        "machines": _rows(conn, _MACHINES),
        "models": _rows(
            conn,
            "SELECT model, count(*) AS sessions FROM sessions WHERE model IS NOT NULL GROUP BY model ORDER BY model",
        ),
        "directories": directories,
        "directory_names": [d["cwd"] for d in directories],
        "tokens_per_day": per_day,
        "links": {
            "sessions_table": urls.table("sessions"),
            "turns_table": urls.table("turns"),
            "search": urls.search(),
            "json": urls.home(
                ".json",
                **kept,
                sort=None if sort == "updated" else sort,
                order=None if order == "desc" else order,
                page=page if page > 1 else None,
            ),
        },
    }


def tokens_per_day(conn: sqlite3.Connection, days: int = CHART_DAYS) -> list[dict]:
    """Token usage per day over the ``days`` days that end with the newest turn (days without
    turns included, as zeros), by the day each turn started."""
    oldest, newest = conn.execute("SELECT min(started_at), max(started_at) FROM turns").fetchone()
    end = _day(newest)
    if end is None:
        return []
    # A young store's chart starts at its first day rather than with weeks of nothing.
    start = max(end - timedelta(days=days - 1), _day(oldest) or end)
    days = (end - start).days + 1
    found = {
        row["day"]: row
        for row in _rows(
            conn,
            "SELECT substr(started_at, 1, 10) AS day, count(*) AS turns, sum(input_tokens) AS input_tokens, "
            "sum(cached_input_tokens) AS cached_input_tokens, sum(output_tokens) AS output_tokens "
            "FROM turns WHERE started_at >= ? GROUP BY day",
            (start.isoformat(),),
        )
    }
    out = []
    for i in range(days):
        day = (start + timedelta(days=i)).isoformat()
        row = found.get(day) or {
            "day": day,
            "turns": 0,
            "input_tokens": 0,
            "cached_input_tokens": 0,
            "output_tokens": 0,
        }
        out.append(row)
    return out


def _day(ts: Optional[str]) -> Optional[date]:
    try:
        return date.fromisoformat(ts[:10]) if isinstance(ts, str) else None
    except ValueError:
        return None


# --------------------------------------------------------------------------------------------
# Session


def _duration_ms(started: Optional[str], ended: Optional[str]) -> Optional[int]:
    a, b = ev.parse_ts(started), ev.parse_ts(ended)
    if a is None or b is None:
        return None
    return max(0, int((b - a).total_seconds() * 1000))


def session_data(
    conn: Optional[sqlite3.Connection],
    root: os.PathLike | str,
    session_id: str,
    urls: Urls,
    *,
    page: int = 1,
    per_page: int = TURNS_PER_PAGE,
) -> dict:
    """A session: its manifest and one page of its turns (from the session itself), its totals,
    what it changed and ran (from the catalog, when it has the session yet), its progress
    ledger and memory facts, and links into Datasette's tables filtered to it.

    Raises :class:`SessionNotFound` / :class:`InvalidSessionId` for a session that is not there.
    """
    with read_session(root, session_id) as reader:
        manifest = reader.manifest
        base = manifest.retained_turn_base or 1
        last = manifest.turn_count + (1 if manifest.in_turn else 0)
        count = max(0, last - base + 1)
        pages = max(1, math.ceil(count / per_page))
        page = min(max(1, page), pages)
        first = base + (page - 1) * per_page
        # One lookup per turn shown: reader.turns(since=first) would read every later turn too.
        turns = [t for t in map(reader.turn, range(first, min(first + per_page, last + 1))) if t is not None]
        directory = reader.directory
    turn_rows: list[dict[str, Any]] = []
    for t in turns:
        turn_rows.append(
            {
                "number": t.number,
                "status": t.status,
                "started_at": t.started_at,
                "ended_at": t.ended_at,
                "duration_ms": _duration_ms(t.started_at, t.ended_at),
                "event_count": t.event_count,
                "input_tokens": t.input_tokens,
                "cached_input_tokens": t.cached_input_tokens,
                "cache_creation_tokens": t.cache_creation_tokens,
                "output_tokens": t.output_tokens,
                "error": t.error,
                "model": t.model,
                "first_seq": t.first_seq,
                "url": urls.turn(session_id, t.number),
            }
        )
    summary = None
    activity: list[dict] = []
    files: list[dict] = []
    cost: Optional[dict] = None
    if conn is not None:
        with _snapshot(conn):
            summary, activity, files = _session_catalog(conn, session_id, urls)
            if turn_rows:
                prompts = turn_prompts(conn, session_id, turn_rows[0]["number"], turn_rows[-1]["number"])
                for row in turn_rows:
                    row["prompt"] = prompts.get(row["number"])
            if summary is not None:
                cost = costs.cost_overview(conn, session_id=session_id)
    filt = {"session_id": session_id}
    source = manifest.source if isinstance(manifest.source, dict) else {}
    redactor = redactor_for(root)
    parent = source.get("parent_session_id")
    agent = source.get("agent") if isinstance(source.get("agent"), str) else None
    cwd = source.get("cwd") if isinstance(source.get("cwd"), str) else None
    return redactor.redact_value(
        {
            "session_id": session_id,
            "manifest": manifest.to_dict(),
            "summary": summary,
            "in_catalog": summary is not None,
            "resume_command": resume_command(session_id, agent, cwd),
            "cost": cost,
            "turns": turn_rows,
            "turn_range": [base, last],
            "page": page,
            "pages": pages,
            "per_page": per_page,
            "next_url": urls.session(session_id, page=page + 1) if page < pages else None,
            "previous_url": urls.session(session_id, page=page - 1 if page > 2 else None) if page > 1 else None,
            "activity": activity,
            "files_changed": files,
            "progress": progress_of(root, session_id),
            "facts": memory_facts(directory),
            "links": {
                "json": urls.session(session_id, ".json"),
                "search": urls.search(session=session_id),
                "turns": urls.table("turns", **filt, _sort="number"),
                "events": urls.table("events", **filt, _sort="seq"),
                "commands": urls.table("commands", **filt),
                "tool_calls": urls.table("tool_calls", **filt),
                "file_changes": urls.table("file_changes", **filt),
                "chunks": urls.table("chunks", **filt),
                "parent": urls.session(parent) if isinstance(parent, str) and parent else None,
                "machine": _machine_url(urls, summary),
            },
        }
    )


def _machine_url(urls: Urls, summary: Optional[dict]) -> Optional[str]:
    """The home page filtered to the machine (store) the session was born in, or ``None`` when
    the catalog does not say which."""
    if summary is None:
        return None
    machine = summary.get("origin_store_id") or summary.get("origin_label")
    return urls.home(machine=machine) if machine else None


def _session_catalog(conn: sqlite3.Connection, session_id: str, urls: Urls) -> tuple[Optional[dict], list, list]:
    """The session's row in the catalog with its activity and changed files (``None, [], []``
    when the catalog does not have it yet)."""
    summary = None
    activity: list[dict] = []
    files: list[dict] = []
    found = _rows(conn, f"SELECT {', '.join(_SESSION_COLUMNS)} FROM sessions WHERE session_id = ?", (session_id,))
    if found:
        summary = found[0]
        summary["cache_hit_rate"] = _cache_rate(summary["cached_input_tokens"], summary["input_tokens"])
        activity = _activity(conn, session_id)
        files = _rows(
            conn,
            "SELECT path, count(*) AS changes, group_concat(DISTINCT kind) AS kinds, "
            "max(turn) AS last_turn FROM file_changes WHERE session_id = ? GROUP BY path "
            "ORDER BY changes DESC, path LIMIT 25",
            (session_id,),
        )
        for row in files:
            row["url"] = urls.turn(session_id, row["last_turn"]) if row["last_turn"] is not None else None
    return summary, activity, files


def _activity(conn: sqlite3.Connection, session_id: str) -> list[dict]:
    """The session's completed items per kind: how many, how many failed, and how many were
    commands answering "no match" (``rg``/``grep`` exiting 1 and the like: not failures)."""
    kinds: dict[str, dict] = {}
    for item_type, name, exit_code, status, count in conn.execute(
        "SELECT item_type, name, exit_code, status, count(*) FROM events "
        "WHERE session_id = ? AND type = 'item.completed' GROUP BY item_type, name, exit_code, status",
        (session_id,),
    ):
        entry = kinds.setdefault(item_type, {"item_type": item_type, "count": 0, "failed": 0, "answered": 0})
        entry["count"] += count
        if benign_exit(name, exit_code) is not None:
            entry["answered"] += count
        elif (exit_code is not None and exit_code != 0) or status in FAILED_STATUSES:
            entry["failed"] += count
    return sorted(kinds.values(), key=lambda e: (-e["count"], str(e["item_type"])))


PROMPT_CHARS = 300


def turn_prompts(conn: sqlite3.Connection, session_id: str, first: int, last: int) -> dict[int, str]:
    """The prompt of each turn from ``first`` to ``last``: the start of its first user message
    (as the catalog holds it), cut at :data:`PROMPT_CHARS` characters."""
    prompts: dict[int, str] = {}
    for turn, text in conn.execute(
        "SELECT turn, substr(text, 1, ?) FROM chunks WHERE session_id = ? AND kind = 'user_message' AND part = 0 "
        "AND turn BETWEEN ? AND ? ORDER BY turn, seq",
        (PROMPT_CHARS + 1, session_id, first, last),
    ):
        if turn not in prompts and isinstance(text, str):
            text = " ".join(text.split())
            prompts[turn] = text if len(text) <= PROMPT_CHARS else text[: PROMPT_CHARS - 1] + "…"
    return prompts


def progress_of(root: os.PathLike | str, session_id: str) -> Optional[dict]:
    """The session's progress ledger for display (``None`` when it has none; ``{"error": ...}``
    when it cannot be read)."""
    if derived_dir(session_directory(root, session_id)).is_symlink():
        return None  # never read through a symlink out of the store (as memory facts do)
    try:
        ledger = load_progress(root, session_id)
    except (InvalidProgress, MemstoreError) as exc:
        # The log has what is wrong and where; the page only says that it is (no paths).
        logger.warning("explorer: progress ledger of %r unreadable: %s", session_id, exc)
        return {"error": "the progress ledger could not be read (see the server's log)"}
    if ledger is None:
        return None
    data = ledger.to_dict()
    data["completion"] = round(ledger.completion_ratio() * 100)
    data["stalled"] = ledger.is_stalled()
    return data


def memory_facts(directory: Path) -> list[dict]:
    """The grounded facts of the session's memory view (``derived/memory.json``), ``[]`` when it
    has none or it cannot be read (logged)."""
    try:
        return [dict(f) for f in memory_facts_of(directory)]
    except (MemstoreError, OSError) as exc:
        logger.warning("explorer: memory facts of %s unreadable: %s", directory, exc)
        return []


# --------------------------------------------------------------------------------------------
# Turn and event


def turn_data(
    root: os.PathLike | str,
    session_id: str,
    number: int,
    urls: Urls,
    *,
    start: Optional[int] = None,
    per_page: int = EVENTS_PER_PAGE,
) -> dict:
    """Turn ``number`` of a session, its events read from the log and rendered for reading, a
    page of ``per_page`` events at a time (``start``: the seq the page starts at).

    Raises :class:`TurnNotFound` when the session has no such turn.
    """
    with read_session(root, session_id) as reader:
        turn = reader.turn(number) if 0 < number <= ev.MAX_SEQ else None
        if turn is None:
            raise TurnNotFound(session_id, number)
        manifest = reader.manifest
        offset, next_seq = turn.start_offset, turn.first_seq or 1
        if start is not None and start != next_seq:
            found = reader.position(start) if 0 < start <= ev.MAX_SEQ else None
            if found is None or found[2] != number:
                raise EventNotFound(session_id, start)
            offset, next_seq = found[0], start
        end = min(turn.end_offset, reader.end)
        records: list[tuple[int, Any]] = []
        more: Optional[int] = None
        size = 0
        for line, _line_start, _line_end in reader.log.lines(offset, end):
            record = ev.decode_line(line)
            if record is None:
                continue
            seq = ev.assign_seq(record.seq, next_seq)
            next_seq = seq + 1
            # A page ends at per_page events, or sooner once it holds PAGE_BYTES of log (huge outputs).
            if len(records) == per_page or size >= PAGE_BYTES:
                more = seq
                break
            records.append((seq, record))
            size += len(line)
    redactor = redactor_for(root)
    events = []
    for seq, record in records:
        event = redactor.redact_value(record.event)  # whole, before it is rendered or cut
        events.append(
            {
                "seq": seq,
                "ts": record.ts,
                "type": event.get("type"),
                "url": urls.event(session_id, seq),
                "display": display_event(event),
                "event": event,
            }
        )
    base = manifest.retained_turn_base or 1
    last = manifest.turn_count + (1 if manifest.in_turn else 0)
    return {
        "session_id": session_id,
        "number": number,
        "turn": {
            "status": turn.status,
            "started_at": turn.started_at,
            "ended_at": turn.ended_at,
            "duration_ms": _duration_ms(turn.started_at, turn.ended_at),
            "event_count": turn.event_count,
            "input_tokens": turn.input_tokens,
            "cached_input_tokens": turn.cached_input_tokens,
            "cache_creation_tokens": turn.cache_creation_tokens,
            "output_tokens": turn.output_tokens,
            "error": redactor.redact_text(turn.error) if turn.error else turn.error,
            "model": turn.model,
            "first_seq": turn.first_seq,
            "last_seq": turn.last_seq,
        },
        "events": events,
        "first_page": start is None or start == turn.first_seq,
        "next_url": urls.turn(session_id, number, start=more) if more is not None else None,
        "first_url": urls.turn(session_id, number),
        "previous_turn_url": urls.turn(session_id, number - 1) if number > base else None,
        "next_turn_url": urls.turn(session_id, number + 1) if number < last else None,
        "session_url": urls.session(session_id),
        "links": {
            "json": urls.turn(session_id, number, ".json", start=start),
            "events_table": urls.table("events", session_id=session_id, turn=number, _sort="seq"),
        },
    }


def event_data(root: os.PathLike | str, session_id: str, seq: int, urls: Urls) -> dict:
    """One event: the exact line of ``events.jsonl`` that holds it (read at its offset), the
    envelope parsed, and how the turn page shows it. :class:`EventNotFound` if there is none."""
    if not 0 < seq <= ev.MAX_SEQ:
        raise EventNotFound(session_id, seq)
    with read_session(root, session_id) as reader:
        position = reader.position(seq)
        if position is None:
            raise EventNotFound(session_id, seq)
        line = reader.record_line(seq)
        neighbours = {d: reader.position(seq + d) is not None for d in (-1, 1) if 0 < seq + d <= ev.MAX_SEQ}
    offset, length, turn = position
    redactor = redactor_for(root)
    text, envelope, event = _redacted_line(redactor, line)
    anchor = urls.turn(session_id, turn, anchor=seq) if turn is not None else None
    return {
        "session_id": session_id,
        "seq": seq,
        "turn": turn,
        "offset": offset,
        "length": length,
        "line": text,
        "envelope": envelope,
        # Formatted for reading only when the page shows the line whole (the JSON has the envelope).
        "pretty": (
            None
            if len(text) > MAX_LINE_SHOWN
            else orjson.dumps(envelope, option=orjson.OPT_INDENT_2).decode()
            if envelope is not None
            else text
        ),
        "line_truncated": len(text) > MAX_LINE_SHOWN,
        "display": display_event(event) if event is not None else None,
        "type": event.get("type") if event is not None else None,
        "turn_url": anchor,
        "session_url": urls.session(session_id),
        "previous_url": urls.event(session_id, seq - 1) if neighbours.get(-1) else None,
        "next_url": urls.event(session_id, seq + 1) if neighbours.get(1) else None,
        "links": {"json": urls.event(session_id, seq, ".json")},
    }


def _redacted_line(redactor: Redactor, line: bytes) -> tuple[str, Any, Optional[dict]]:
    """``(text, envelope, event)`` of one log line, redacted: the line's exact text when it
    holds no secret, else the redacted envelope encoded again (a secret inside a JSON string,
    escapes and all, is found in the parsed value, not in the raw text)."""
    text = line.decode("utf-8", errors="replace")
    try:
        envelope = orjson.loads(line)
    except orjson.JSONDecodeError:
        return redactor.redact_text(text), None, None
    redacted = redactor.redact_value(envelope)
    if redacted is not envelope:
        text = orjson.dumps(redacted).decode() + ("\n" if text.endswith("\n") else "")
    record = ev.decode_line(line)
    event = redactor.redact_value(record.event) if record is not None else None
    return text, redacted, event


# --------------------------------------------------------------------------------------------
# Search

SEARCH_LIMIT = 20
MAX_SEARCH_LIMIT = 100
MAX_QUERY_CHARS = 500
MAX_HIGHLIGHT_TERMS = 32
"""Terms a page highlights (and its FTS5 fallback looks for): enough for any query people type."""
MATCHING_SESSIONS = 10


@dataclass(frozen=True)
class SearchFilters:
    """What a search is restricted to (empty: no restriction): one ``session``, the sessions of
    one ``agent``, chunks from day ``since`` to day ``until`` (``YYYY-MM-DD``, both included),
    the sessions born in one ``machine`` (a store id or label). They restrict the results, never
    the ranking's statistics."""

    session: str = ""
    agent: str = ""
    since: str = ""
    until: str = ""
    machine: str = ""

    def where(self) -> tuple[Optional[str], list[Any]]:
        """The condition over ``chunks`` (and its parameters) these filters make."""
        clauses: list[str] = []
        params: list[Any] = []
        if self.session:
            clauses.append("session_id = ?")
            params.append(self.session)
        if self.agent:
            clauses.append("session_id IN (SELECT session_id FROM sessions WHERE agent = ?)")
            params.append(self.agent)
        if self.since:
            clauses.append("created_at >= ?")
            params.append(self.since)
        if self.until:
            clauses.append("created_at < ?")
            params.append(next_day(self.until))
        if self.machine:
            clauses.append(MACHINE_FILTER)
            params += machine_params(self.machine)
        return (" AND ".join(clauses) or None), params

    def params(self) -> dict[str, str]:
        return {k: v for k, v in asdict(self).items() if v}


def search_data(
    root: os.PathLike | str,
    query: str,
    urls: Urls,
    *,
    limit: int = SEARCH_LIMIT,
    page: int = 1,
    filters: SearchFilters = SearchFilters(),
    conn: Optional[sqlite3.Connection] = None,
    fallback: Optional[Callable[..., list[dict]]] = None,
) -> dict:
    """BM25 search over every session: page ``page`` of ``limit`` results, each with its
    highlighted snippet and links to its session, turn and event, the ``total`` number of hits
    and the pages' links; the sessions whose id or first prompt holds the query (the one search
    box finds sessions too); the agents to filter by.

    With ``conn`` (a connection to the catalog, read-only: the explorer's) the catalog is
    searched as it is, and nothing is written: the ranking of :func:`memstore.search.search_catalog`
    (the process's kept index, recency preferred) with the filters as its condition. Without it
    ``memstore.search_memory`` runs (first page, session filter only), which refreshes the
    catalog first. ``fallback(query, limit, filters)`` is used when the BM25 search fails (a
    catalog without its index, say); ``total`` is then ``None``."""
    query = query.strip()[:MAX_QUERY_CHARS]
    limit = min(max(1, limit), MAX_SEARCH_LIMIT)
    page = min(max(1, page), MAX_PAGE)
    results: list[dict] = []
    total: Optional[int] = None
    engine = None
    sessions: list[dict] = []
    agents: list[dict] = []
    machines: list[dict] = []
    missing: list[dict] = []
    if conn is not None:
        agents = _rows(conn, "SELECT agent, count(*) AS sessions FROM sessions GROUP BY agent ORDER BY agent")
        machines = _rows(conn, _MACHINES)
    if query:
        try:
            if conn is not None:
                results, total = ranked_page(conn, query, limit, (page - 1) * limit, filters)
                missing = _missing(recorded_missing(conn), root)
            else:
                found = search_memory(
                    root,
                    query,
                    max_results=limit,
                    session_id=filters.session or None,
                    machine=filters.machine or None,
                )
                results, missing = [_result(r) for r in found], _missing(found.missing, root)
            engine = "bm25"
        except (MemstoreError, sqlite3.Error) as exc:
            logger.warning("explorer: BM25 search failed (%s); falling back to FTS5", exc)
        if engine is None and fallback is not None:
            engine = "fts5"
            results = fallback(query, limit, filters)
        if conn is not None and page == 1:
            sessions = _rows(
                conn,
                "SELECT session_id, title, agent, updated_at FROM sessions WHERE session_id LIKE ? ESCAPE '\\' "
                "OR title LIKE ? ESCAPE '\\' ORDER BY updated_at DESC LIMIT ?",
                (_like(query), _like(query), MATCHING_SESSIONS),
            )
            for row in sessions:
                row["url"] = urls.session(row["session_id"])
    terms = query_terms(query)[:MAX_HIGHLIGHT_TERMS]
    words = " ".join(terms)  # what Datasette's FTS5 search can take (a query of quotes alone is an FTS5 error)
    for r in results:
        sid, turn, seq = r.get("session_id"), r.get("turn"), r.get("seq")
        r["snippet_parts"] = highlight_parts(r.get("snippet") or "", terms)
        r["session_url"] = urls.session(sid) if sid else None
        r["turn_url"] = urls.turn(sid, turn, anchor=seq) if sid and isinstance(turn, int) else None
        r["event_url"] = urls.event(sid, seq) if sid and isinstance(seq, int) else None
    pages = max(1, math.ceil(total / limit)) if total else 1
    kept: dict[str, Any] = {"q": query or None, **filters.params(), "limit": limit if limit != SEARCH_LIMIT else None}

    def page_url(n: int) -> str:
        return urls.search(**kept, page=n if n > 1 else None)

    return redactor_for(root).redact_value(
        {
            "q": query,
            "session": filters.session,
            "filters": asdict(filters),
            "limit": limit,
            "page": page,
            "pages": pages,
            "first": (page - 1) * limit + 1 if results else 0,
            "last": (page - 1) * limit + len(results),
            "engine": engine,
            "results": results,
            "total": total,
            "missing": missing,
            "sessions": sessions,
            "agents": agents,
            "machines": machines,
            "next_url": page_url(page + 1) if total is not None and page < pages else None,
            "previous_url": page_url(page - 1) if page > 1 else None,
            "links": {
                "json": urls.search(".json", **kept, page=page if page > 1 else None),
                "chunks_table": urls.table("chunks", _search=words or None),
            },
        }
    )


def ranked_page(
    conn: sqlite3.Connection, query: str, limit: int, offset: int, filters: SearchFilters
) -> tuple[list[dict], int]:
    """Results ``offset`` to ``offset + limit`` of the BM25 ranking of ``query`` over the
    catalog ``conn`` reads, with the filters, and the total number of hits; one read transaction
    (unless the caller has one open), so the rows read are those ranked. Raises
    :class:`StoreIOError` if SQLite fails.

    The filters :func:`memstore.search.search_catalog` takes (a session, a first day, a machine)
    go through it; an agent or a last day, which it does not take, are the same ranking of the same kept
    index with the filters as its condition over ``chunks``."""
    if not filters.agent and not filters.until:
        page = search_catalog(
            conn,
            query,
            limit=limit,
            offset=offset,
            session=filters.session or None,
            since=filters.since or None,
            machine=filters.machine or None,
        )
        return [_result(r) for r in page.results], page.total
    where, params = filters.where()
    terms = set(query_terms(query))
    index = kept_index(conn)
    own = not conn.in_transaction
    if own:
        conn.execute("BEGIN")
    try:
        now = time.time()  # one clock for the page and its total
        hits = index.search(query, offset + limit, where=where, params=params, now=now)[offset:]
        total = index.count_matches(query, where=where, params=params, now=now)
        rows = {
            row["id"]: row
            for row in _rows(
                conn,
                f"SELECT id, {', '.join(_RESULT_KEYS[:4])}, source, created_at, session_id, turn, seq, kind, text "
                "FROM chunks WHERE id IN (SELECT value FROM json_each(?))",
                ("[" + ",".join(str(doc) for doc, _ in hits) + "]",),
            )
        }
    finally:
        if own and conn.in_transaction:
            conn.execute("COMMIT")
    results = []
    for doc, score in hits:
        row = rows.get(doc)
        if row is None:
            continue
        text = row.pop("text") or ""
        row.pop("id")
        row.update(
            score=score, snippet=snippet(text, terms), start_line=row["start_line"] or 0, end_line=row["end_line"] or 0
        )
        results.append(row)
    return results, total


_RESULT_KEYS = (
    "chunk_id",
    "path",
    "start_line",
    "end_line",
    "score",
    "snippet",
    "source",
    "created_at",
    "session_id",
    "turn",
    "seq",
    "kind",
)


def _missing(missing: Sequence[MissingSession], root: os.PathLike | str) -> list[dict]:
    """The sessions a search could not look at, as the page shows them: paths in the reasons
    relative to the store (a page names no place on the server's disk)."""
    prefix = os.path.join(os.path.abspath(os.fspath(root)), "")
    return [
        {"directory": m.directory, "session_id": m.session_id, "reason": m.reason.replace(prefix, "")} for m in missing
    ]


def _result(result: MemorySearchResult) -> dict:
    """A search result as the page shows it (its ``path`` as the result has it)."""
    return {k: getattr(result, k) for k in _RESULT_KEYS}


def highlight_parts(text: str, terms: list[str]) -> list[dict]:
    """``text`` cut into ``[{text, hit}]`` parts, ``hit`` where a query term matches (whole
    words, case-insensitive). The template escapes each part and marks the hits."""
    if not terms or not text:
        return [{"text": text, "hit": False}] if text else []
    pattern = re.compile(
        r"(?<![^\W_])(" + "|".join(re.escape(t) for t in sorted(terms, key=len, reverse=True)) + r")(?![^\W_])",
        re.IGNORECASE,
    )
    parts, pos = [], 0
    for match in pattern.finditer(text):
        if match.start() > pos:
            parts.append({"text": text[pos : match.start()], "hit": False})
        parts.append({"text": match.group(0), "hit": True})
        pos = match.end()
    if pos < len(text):
        parts.append({"text": text[pos:], "hit": False})
    return parts


def fts_search(
    conn: sqlite3.Connection, query: str, limit: int, filters: SearchFilters = SearchFilters()
) -> list[dict]:
    """Search the catalog's FTS5 index of chunks (the fallback when the BM25 index cannot be read): the
    query's words, each quoted, any of them; ranked by FTS5's bm25; restricted by ``filters`` as
    the BM25 search is (a session, an agent, a machine, days)."""
    match = fts_match(query, MAX_HIGHLIGHT_TERMS)
    if match is None:
        return []
    condition, values = filters.where()
    where = f"AND ({condition})" if condition else ""
    params: tuple[Any, ...] = (match, *values, limit)
    rows = _rows(
        conn,
        "SELECT c.chunk_id, c.path, c.start_line, c.end_line, -bm25(chunks_fts) AS score, c.text, "
        "c.source, c.created_at, c.session_id, c.turn, c.seq FROM chunks_fts "
        "JOIN chunks c ON c.id = chunks_fts.rowid WHERE chunks_fts MATCH ? "
        f"{where} ORDER BY bm25(chunks_fts), c.id LIMIT ?",
        params,
    )
    terms = query_terms(query)
    for row in rows:
        row["snippet"] = snippet(row.pop("text") or "", terms)
        row["score"] = round(row["score"], 4)
    return rows
