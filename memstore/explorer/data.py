"""The explorer's pages as data: plain functions from a query to a dict.

Each page is one function returning a JSON-ready dict; the HTML page renders that dict and the
``.json`` variant returns it as it is. Lists, totals and charts come from ``catalog.db`` (a
``sqlite3`` connection, read-only); a session's manifest, turns and events come from the
session itself through :func:`memstore.read_session` (exact bytes, never the catalog's copy).

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
from contextlib import contextmanager
from datetime import date, timedelta
from pathlib import Path
from typing import Any, Callable, Optional

import orjson

from .. import events as ev
from ..errors import EventNotFound, InvalidProgress, MemstoreError, TurnNotFound
from ..layout import derived_dir, session_directory
from ..reader import read_session
from ..search import MemorySearchResult, fts_match, query_terms, search_catalog, search_memory, snippet
from ..views.memory_view import memory_facts_of
from ..views.progress import load_progress
from .render import display_event
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
    "session": "session_id",
}
STATUSES = ("active", "completed")

_SESSION_COLUMNS = ("session_id", "status", "created_at", "updated_at", "turn_count", "event_count", "agent",
                    "agent_version", "cwd", "git_branch", "title", "model", "turns_failed", "input_tokens",
                    "cached_input_tokens", "cache_creation_tokens", "output_tokens", "log_bytes",
                    "parent_session_id", "source_path", "retained_turn_base", "generation")


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


def home_data(conn: sqlite3.Connection, urls: Urls, *, page: int = 1, sort: str = "updated", order: str = "desc",
              status: str = "", agent: str = "", q: str = "", per_page: int = SESSIONS_PER_PAGE) -> dict:
    """The home page: one page of sessions (sorted and filtered), the store's totals, the
    statuses and agents to filter by, and token usage per day for the chart."""
    sort = sort if sort in SORTS else "updated"
    order = "asc" if order == "asc" else "desc"
    where, params = [], []
    if status:
        where.append("status = ?")
        params.append(status)
    if agent:
        where.append("agent = ?")
        params.append(agent)
    if q:
        where.append("(session_id LIKE ? ESCAPE '\\' OR title LIKE ? ESCAPE '\\')")
        params += [_like(q), _like(q)]
    clause = f"WHERE {' AND '.join(where)}" if where else ""
    with _snapshot(conn):
        return _home_page(conn, urls, clause, params, page, sort, order, per_page,
                          {"status": status, "agent": agent, "q": q, "sort": sort, "order": order})


def _home_page(conn: sqlite3.Connection, urls: Urls, clause: str, params: list, page: int, sort: str, order: str,
               per_page: int, filters: dict) -> dict:
    matching = conn.execute(f"SELECT count(*) FROM sessions {clause}", params).fetchone()[0]
    pages = max(1, math.ceil(matching / per_page))
    page = min(max(1, page), pages)
    sessions = _rows(conn, f"SELECT {', '.join(_SESSION_COLUMNS)} FROM sessions {clause} "
                           f"ORDER BY {SORTS[sort]} {order}, session_id {order} LIMIT ? OFFSET ?",
                     (*params, per_page, (page - 1) * per_page))
    for row in sessions:
        row["url"] = urls.session(row["session_id"])
        row["cache_hit_rate"] = _cache_rate(row["cached_input_tokens"], row["input_tokens"])
    totals = _rows(conn, "SELECT count(*) AS sessions, coalesce(sum(turn_count), 0) AS turns, "
                         "coalesce(sum(event_count), 0) AS events, coalesce(sum(turns_failed), 0) AS turns_failed, "
                         "coalesce(sum(input_tokens), 0) AS input_tokens, "
                         "coalesce(sum(cached_input_tokens), 0) AS cached_input_tokens, "
                         "coalesce(sum(cache_creation_tokens), 0) AS cache_creation_tokens, "
                         "coalesce(sum(output_tokens), 0) AS output_tokens, "
                         "coalesce(sum(status = 'active'), 0) AS active FROM sessions")[0]
    totals["cache_hit_rate"] = _cache_rate(totals["cached_input_tokens"], totals["input_tokens"])

    def page_url(n: int) -> str:
        return urls.home(page=n if n > 1 else None, **{k: v for k, v in filters.items()
                                                       if v and (k, v) not in (("sort", "updated"), ("order", "desc"))})

    return {
        "sessions": sessions,
        "page": page, "pages": pages, "per_page": per_page, "matching": matching,
        "next_url": page_url(page + 1) if page < pages else None,
        "previous_url": page_url(page - 1) if page > 1 else None,
        "filters": filters,
        "sorts": list(SORTS),
        "totals": totals,
        "statuses": _rows(conn, "SELECT status, count(*) AS sessions FROM sessions GROUP BY status ORDER BY status"),
        "agents": _rows(conn, "SELECT agent, count(*) AS sessions FROM sessions GROUP BY agent ORDER BY agent"),
        "tokens_per_day": tokens_per_day(conn),
        "links": {"sessions_table": urls.table("sessions"), "turns_table": urls.table("turns"),
                  "search": urls.search(), "json": urls.home(".json")},
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
    found = {row["day"]: row for row in _rows(
        conn, "SELECT substr(started_at, 1, 10) AS day, count(*) AS turns, sum(input_tokens) AS input_tokens, "
              "sum(cached_input_tokens) AS cached_input_tokens, sum(output_tokens) AS output_tokens "
              "FROM turns WHERE started_at >= ? GROUP BY day", (start.isoformat(),))}
    out = []
    for i in range(days):
        day = (start + timedelta(days=i)).isoformat()
        row = found.get(day) or {"day": day, "turns": 0, "input_tokens": 0, "cached_input_tokens": 0, "output_tokens": 0}
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


def session_data(conn: Optional[sqlite3.Connection], root: os.PathLike | str, session_id: str, urls: Urls, *,
                 page: int = 1, per_page: int = TURNS_PER_PAGE) -> dict:
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
    turn_rows = []
    for t in turns:
        turn_rows.append({"number": t.number, "status": t.status, "started_at": t.started_at, "ended_at": t.ended_at,
                          "duration_ms": _duration_ms(t.started_at, t.ended_at), "event_count": t.event_count,
                          "input_tokens": t.input_tokens, "cached_input_tokens": t.cached_input_tokens,
                          "cache_creation_tokens": t.cache_creation_tokens, "output_tokens": t.output_tokens,
                          "error": t.error, "model": t.model, "first_seq": t.first_seq,
                          "url": urls.turn(session_id, t.number)})
    summary = None
    activity: list[dict] = []
    files: list[dict] = []
    if conn is not None:
        with _snapshot(conn):
            summary, activity, files = _session_catalog(conn, session_id, urls)
    filt = {"session_id": session_id}
    source = manifest.source if isinstance(manifest.source, dict) else {}
    parent = source.get("parent_session_id")
    return {
        "session_id": session_id,
        "manifest": manifest.to_dict(),
        "summary": summary,
        "in_catalog": summary is not None,
        "turns": turn_rows,
        "turn_range": [base, last],
        "page": page, "pages": pages, "per_page": per_page,
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
        },
    }


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
        activity = _rows(conn, "SELECT item_type, count(*) AS count, sum(coalesce(exit_code, 0) != 0 OR status IN "
                               "('failed', 'error', 'declined', 'permission_rejected', 'permission_cancelled', "
                               "'hook_denied', 'invalid_tool', 'cancelled')) AS failed FROM events "
                               "WHERE session_id = ? AND type = 'item.completed' GROUP BY item_type "
                               "ORDER BY count DESC", (session_id,))
        files = _rows(conn, "SELECT path, count(*) AS changes, group_concat(DISTINCT kind) AS kinds, "
                            "max(turn) AS last_turn FROM file_changes WHERE session_id = ? GROUP BY path "
                            "ORDER BY changes DESC, path LIMIT 25", (session_id,))
        for row in files:
            row["url"] = urls.turn(session_id, row["last_turn"]) if row["last_turn"] is not None else None
    return summary, activity, files


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


def turn_data(root: os.PathLike | str, session_id: str, number: int, urls: Urls, *, start: Optional[int] = None,
              per_page: int = EVENTS_PER_PAGE) -> dict:
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
        records, more, size = [], None, 0
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
    events = []
    for seq, record in records:
        events.append({"seq": seq, "ts": record.ts, "type": record.event.get("type"), "url": urls.event(session_id, seq),
                       "display": display_event(record.event), "event": record.event})
    base = manifest.retained_turn_base or 1
    last = manifest.turn_count + (1 if manifest.in_turn else 0)
    return {
        "session_id": session_id,
        "number": number,
        "turn": {"status": turn.status, "started_at": turn.started_at, "ended_at": turn.ended_at,
                 "duration_ms": _duration_ms(turn.started_at, turn.ended_at), "event_count": turn.event_count,
                 "input_tokens": turn.input_tokens, "cached_input_tokens": turn.cached_input_tokens,
                 "cache_creation_tokens": turn.cache_creation_tokens, "output_tokens": turn.output_tokens,
                 "error": turn.error, "model": turn.model, "first_seq": turn.first_seq, "last_seq": turn.last_seq},
        "events": events,
        "first_page": start is None or start == turn.first_seq,
        "next_url": urls.turn(session_id, number, start=more) if more is not None else None,
        "first_url": urls.turn(session_id, number),
        "previous_turn_url": urls.turn(session_id, number - 1) if number > base else None,
        "next_turn_url": urls.turn(session_id, number + 1) if number < last else None,
        "session_url": urls.session(session_id),
        "links": {"json": urls.turn(session_id, number, ".json", start=start),
                  "events_table": urls.table("events", session_id=session_id, turn=number, _sort="seq")},
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
    text = line.decode("utf-8", errors="replace")
    try:
        envelope = orjson.loads(line)
    except orjson.JSONDecodeError:
        envelope = None
    record = ev.decode_line(line)
    event = record.event if record is not None else None
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
        "pretty": (None if len(text) > MAX_LINE_SHOWN else
                   orjson.dumps(envelope, option=orjson.OPT_INDENT_2).decode() if envelope is not None else text),
        "line_truncated": len(text) > MAX_LINE_SHOWN,
        "display": display_event(event) if event is not None else None,
        "type": event.get("type") if event is not None else None,
        "turn_url": anchor,
        "session_url": urls.session(session_id),
        "previous_url": urls.event(session_id, seq - 1) if neighbours.get(-1) else None,
        "next_url": urls.event(session_id, seq + 1) if neighbours.get(1) else None,
        "links": {"json": urls.event(session_id, seq, ".json")},
    }


# --------------------------------------------------------------------------------------------
# Search

SEARCH_LIMIT = 20
MAX_SEARCH_LIMIT = 100
MAX_QUERY_CHARS = 500
MAX_HIGHLIGHT_TERMS = 32
"""Terms a page highlights (and its FTS5 fallback looks for): enough for any query people type."""


def search_data(root: os.PathLike | str, query: str, urls: Urls, *, limit: int = SEARCH_LIMIT,
                session_id: str = "", conn: Optional[sqlite3.Connection] = None,
                fallback: Optional[Callable[..., list[dict]]] = None) -> dict:
    """BM25 search over every session, each result with its highlighted snippet and links to its
    session, turn and event.

    With ``conn`` (a connection to the catalog, read-only: the explorer's) the catalog is
    searched as it is (:func:`memstore.search.search_catalog`), and nothing is written; without
    it ``memstore.search_memory`` runs, which refreshes the catalog first. ``fallback(query,
    limit, session_id)`` is used when the BM25 search fails (a catalog without its index, say).
    ``total`` is the number of hits of the BM25 ranking (``None`` without ``conn`` or with the
    fallback)."""
    query = query.strip()[:MAX_QUERY_CHARS]
    limit = min(max(1, limit), MAX_SEARCH_LIMIT)
    results: list[dict] = []
    total: Optional[int] = None
    engine = None
    if query:
        try:
            if conn is not None:
                page = search_catalog(conn, query, limit=limit, session=session_id or None)
                results, total = [_result(r) for r in page.results], page.total
            else:
                results = [_result(r) for r in search_memory(root, query, max_results=limit,
                                                             session_id=session_id or None)]
            engine = "bm25"
        except (MemstoreError, sqlite3.Error) as exc:
            logger.warning("explorer: BM25 search failed (%s); falling back to FTS5", exc)
        if engine is None and fallback is not None:
            engine = "fts5"
            results = fallback(query, limit, session_id)
    terms = query_terms(query)[:MAX_HIGHLIGHT_TERMS]
    words = " ".join(terms)  # what Datasette's FTS5 search can take (a query of quotes alone is an FTS5 error)
    for r in results:
        sid, turn, seq = r.get("session_id"), r.get("turn"), r.get("seq")
        r["snippet_parts"] = highlight_parts(r.get("snippet") or "", terms)
        r["session_url"] = urls.session(sid) if sid else None
        r["turn_url"] = urls.turn(sid, turn, anchor=seq) if sid and isinstance(turn, int) else None
        r["event_url"] = urls.event(sid, seq) if sid and isinstance(seq, int) else None
    return {"q": query, "session": session_id, "limit": limit, "engine": engine, "results": results, "total": total,
            "links": {"json": urls.search(".json", q=query or None, session=session_id or None),
                      "chunks_table": urls.table("chunks", _search=words or None)}}


_RESULT_KEYS = ("chunk_id", "path", "start_line", "end_line", "score", "snippet", "source", "created_at",
                "session_id", "turn", "seq")


def _result(result: MemorySearchResult) -> dict:
    """A search result as the page shows it (its ``path`` as the result has it)."""
    return {k: getattr(result, k) for k in _RESULT_KEYS}


def highlight_parts(text: str, terms: list[str]) -> list[dict]:
    """``text`` cut into ``[{text, hit}]`` parts, ``hit`` where a query term matches (whole
    words, case-insensitive). The template escapes each part and marks the hits."""
    if not terms or not text:
        return [{"text": text, "hit": False}] if text else []
    pattern = re.compile(r"(?<![^\W_])(" + "|".join(re.escape(t) for t in sorted(terms, key=len, reverse=True))
                         + r")(?![^\W_])", re.IGNORECASE)
    parts, pos = [], 0
    for match in pattern.finditer(text):
        if match.start() > pos:
            parts.append({"text": text[pos:match.start()], "hit": False})
        parts.append({"text": match.group(0), "hit": True})
        pos = match.end()
    if pos < len(text):
        parts.append({"text": text[pos:], "hit": False})
    return parts


def fts_search(conn: sqlite3.Connection, query: str, limit: int, session_id: str = "") -> list[dict]:
    """Search the catalog's FTS5 index of chunks (the fallback when the BM25 index cannot be read): the
    query's words, each quoted, any of them; ranked by FTS5's bm25."""
    match = fts_match(query, MAX_HIGHLIGHT_TERMS)
    if match is None:
        return []
    where = "AND c.session_id = ?" if session_id else ""
    params: tuple[Any, ...] = (match, session_id, limit) if session_id else (match, limit)
    rows = _rows(conn, "SELECT c.chunk_id, c.path, c.start_line, c.end_line, -bm25(chunks_fts) AS score, c.text, "
                       "c.source, c.created_at, c.session_id, c.turn, c.seq FROM chunks_fts "
                       "JOIN chunks c ON c.id = chunks_fts.rowid WHERE chunks_fts MATCH ? "
                       f"{where} ORDER BY bm25(chunks_fts), c.id LIMIT ?", params)
    terms = query_terms(query)
    for row in rows:
        row["snippet"] = snippet(row.pop("text") or "", terms)
        row["score"] = round(row["score"], 4)
    return rows
