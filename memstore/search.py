"""Search over a store: BM25 over every session's chunks in ``catalog.db``, as results people read.

The ranking is the engine's (:mod:`memstore.bm25`): the reference's BM25 (k1 = 1.2, b = 0.75,
idf = ln(1 + (N - df + 0.5) / (df + 0.5)), statistics over every chunk of every session, filters
restricting the results and never the statistics) times a mild recency preference
(``1 + 0.1 * 0.5 ** (age_days / 30)``; ``recency=False`` for plain BM25); ties by ``chunk_id``.
This module turns its hits into :class:`MemorySearchResult` (where the chunk is, its snippet),
and owns what every caller shares: the query's terms, the FTS5 quoting of them, the snippet.

Two calls:

- :func:`search_memory` (public): search a store through the process's warm state of it, which
  every :class:`~memstore.Store` of that root shares (:meth:`memstore.Store.search` is the same
  call): the catalog is kept current at the cost of what changed (see
  :mod:`memstore.catalog.live` for how fresh that is), then searched;
- :func:`search_catalog`: search the catalog a connection reads, as it is (no refresh, no
  write; a read-only connection will do), a page of results with the total number of hits.

Both say when the answer is partial: the sessions the catalog could not copy (and, for
:func:`search_memory`, those it could not bring up to date) are listed in ``missing``
(:class:`SearchPage.missing`, and the ``missing`` attribute of the list :func:`search_memory`
returns), each with the reason.

Both use the process's kept index of the catalog (:func:`index_cache`): what a query loads (the
segments' document arrays, the postings of recent terms) is kept for the next, whatever
connection or thread it comes from, and checked against the catalog at every query, so a change
by another connection or process is seen at once and only what changed is read again.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, Union

from .bm25 import IndexCache, SearchIndex, database_path, tokenize
from .bm25.tokens import WORD
from .catalog.report import CatalogProgress, MissingSession, recorded_missing
from .errors import StoreIOError
from .events import format_ts, parse_ts

if TYPE_CHECKING:
    from .catalog.live import LiveCatalog

__all__ = [
    "MemorySearchResult",
    "MissingSession",
    "SearchPage",
    "SearchResults",
    "fts_match",
    "index_cache",
    "kept_index",
    "query_terms",
    "search_catalog",
    "search_live",
    "search_memory",
    "snippet",
]

logger = logging.getLogger(__name__)

SNIPPET_CHARS = 240
KEPT_CATALOGS = 4
"""A process keeps the indexes of at most this many catalogs (the least recently used goes)."""


@dataclass(frozen=True)
class MemorySearchResult:
    """One search hit. The reference's fields (``chunk_id``, ``path``, ``start_line``,
    ``end_line``, ``score``, ``snippet``, ``source``, ``created_at``) plus where it is:
    ``session_id``, ``turn`` and ``seq`` (``None`` for a memory fact).

    ``chunk_id`` is ``<session>:<seq>:<part>`` for an event's text and ``<directory>:<index>``
    for a memory fact (the session's directory name: the session id unless it is hashed);
    ``path`` is the file it comes from (``events.jsonl`` or ``memory.json``): absolute from
    :func:`search_memory`, relative to the store (as the catalog has it) from
    :func:`search_catalog` without ``root``;
    ``start_line``/``end_line`` the lines of the event's text the chunk holds (0 for a fact);
    ``source`` is ``event`` or ``session`` (a memory fact); ``created_at`` the event's time, in
    RFC 3339 (the reference used Unix seconds), or for a fact its memory view's numeric
    ``created_at``, else ``updated_at``, as the reference dates facts (``None`` when the view
    gives neither, as memstore's own views do, or for an event whose line has no time).
    """

    chunk_id: str
    path: str
    start_line: int
    end_line: int
    score: float
    snippet: str
    source: str
    created_at: Optional[str]
    session_id: str
    turn: Optional[int]
    seq: Optional[int]
    kind: Optional[str] = None

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class SearchPage:
    """A page of a ranking: ``results`` are its hits ``offset`` to ``offset + limit`` (fewer at
    its end), ``total`` how many hits the whole ranking has (every chunk the query matches,
    filters applied), so a caller can page through it. ``missing``: the sessions the search
    could not look at (as the catalog records them, and as the caller knows besides), each with
    why; the answer is ``partial`` when there is any."""

    results: list[MemorySearchResult]
    total: int
    offset: int
    limit: int
    missing: tuple[MissingSession, ...] = ()

    @property
    def partial(self) -> bool:
        return bool(self.missing)


class SearchResults(list):
    """What :func:`search_memory` returns: the results, a plain ``list`` of
    :class:`MemorySearchResult`, with ``missing`` (the sessions the search could not look at,
    each with why) and ``partial`` (whether there are any)."""

    def __init__(self, results: Sequence[MemorySearchResult] = (), missing: Sequence[MissingSession] = ()):
        super().__init__(results)
        self.missing: tuple[MissingSession, ...] = tuple(missing)

    @property
    def partial(self) -> bool:
        return bool(self.missing)


# --------------------------------------------------------------------------------------------
# Queries: terms, FTS5 quoting, snippets


def query_terms(query: str) -> list[str]:
    """The distinct tokens of ``query`` in the order they first appear: what the ranking matches
    (see :func:`memstore.bm25.tokenize`), what snippets look for and highlighting marks."""
    return list(dict.fromkeys(tokenize(query)))


def fts_match(query: str, max_terms: Optional[int] = None) -> Optional[str]:
    """A safe FTS5 ``MATCH`` expression for ``query``: its distinct tokens (the first
    ``max_terms`` of them, if given), each double-quoted (so no FTS5 operator or syntax
    survives), joined by ``OR``. ``None`` when the query has no tokens.

    Meant for snippets, highlighting and FTS5 fallbacks; ranking is :func:`search_catalog`.
    FTS5's tokenizer may split a quoted token differently (e.g. folding diacritics), which can
    only change which rows match, never raise.
    """
    tokens = query_terms(query)[:max_terms]
    if not tokens:
        return None
    # Tokens are alphanumeric runs, so they hold no double quote; doubling is belt and braces.
    return " OR ".join('"' + t.replace('"', '""') + '"' for t in tokens)


def snippet(text: str, tokens: Union[set[str], Sequence[str]], width: int = SNIPPET_CHARS) -> str:
    """About ``width`` characters of ``text`` around its first token that is one of ``tokens``
    (lowercase, as :func:`query_terms` gives them), whitespace-normalized, with ``…`` where text
    was cut. The start of the text when it holds none of them."""
    wanted = tokens if isinstance(tokens, (set, frozenset)) else set(tokens)
    best = None
    for match in WORD.finditer(text):
        if match.group().lower() in wanted:
            best = match.start()
            break
    if best is None or len(text) <= width:
        start = 0
    else:
        start = max(0, best - width // 3)
    piece = " ".join(text[start : start + width].split())
    return ("…" if start > 0 else "") + piece + ("…" if start + width < len(text) else "")


# --------------------------------------------------------------------------------------------
# The kept index


_kept: OrderedDict[str, IndexCache] = OrderedDict()
_kept_lock = threading.Lock()


def index_cache(database: Union[str, os.PathLike[str]]) -> IndexCache:
    """The process's kept :class:`IndexCache` for the database file ``database`` (one per file,
    whatever path names it), made on first use. At most ``KEPT_CATALOGS`` are kept."""
    key = os.path.realpath(database)
    with _kept_lock:
        cache = _kept.get(key)
        if cache is None:
            cache = _kept[key] = IndexCache()
            while len(_kept) > KEPT_CATALOGS:
                _kept.popitem(last=False)
        else:
            _kept.move_to_end(key)
        return cache


def kept_index(conn: sqlite3.Connection) -> SearchIndex:
    """A :class:`SearchIndex` over ``conn`` that uses the process's kept cache of its database
    (a fresh one for an in-memory database, which no other connection shares)."""
    path = database_path(conn)
    if path in (":memory:", "<sqlite>") or not os.path.isabs(path):
        return SearchIndex(conn)
    return SearchIndex(conn, cache=index_cache(path))


def _forget_kept() -> None:
    # A forked child must not share a parent's cache lock (another thread may have held it at
    # the fork) and gains nothing from its arrays: it starts its own.
    global _kept_lock
    _kept_lock = threading.Lock()
    _kept.clear()


os.register_at_fork(after_in_child=_forget_kept)


# --------------------------------------------------------------------------------------------
# Searching a catalog


def search_catalog(
    conn: sqlite3.Connection,
    query: str,
    *,
    limit: int = 6,
    offset: int = 0,
    session: Optional[str] = None,
    since: Optional[str] = None,
    source: Optional[str] = None,
    recency: bool = True,
    min_score: float = 0.0,
    root: Union[None, str, os.PathLike[str]] = None,
    machine: Optional[str] = None,
) -> SearchPage:
    """Search the catalog ``conn`` reads, as it is: no refresh and nothing written, so a
    read-only connection will do (the explorer's). Results ``offset`` to ``offset + limit`` of
    the ranking, with the total number of hits.

    ``session``, ``since`` (a date or an RFC 3339 time: chunks from then on), ``source``
    (``event`` or ``session``) and ``machine`` (a store id or label: sessions that store was
    the origin of, see :data:`MACHINE_FILTER`) restrict the results, never the statistics; ``min_score`` drops
    hits scoring less. ``path`` in each result is the catalog's, relative to the store, or
    absolute under ``root`` when it is given. A query without tokens gives an empty page.

    One read transaction (unless the caller has one open): the rows read are those ranked, and
    ``missing`` lists what the catalog records as left out (see :class:`SearchPage`).
    Raises :class:`StoreIOError` if SQLite fails, :class:`ValueError` for a ``since`` that is no
    time or a negative ``limit`` or ``offset``, :class:`TypeError` for one that is no int.
    """
    for name, value in (("limit", limit), ("offset", offset)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an int, not {type(value).__name__}")
        if value < 0:
            raise ValueError(f"{name} must not be negative, not {value}")
    terms = query_terms(query) if isinstance(query, str) else []
    if not terms:
        return SearchPage([], 0, offset, limit)
    where, params = _filters(source, session, since, machine)
    index = kept_index(conn)
    own = not conn.in_transaction
    try:
        if own:
            conn.execute("BEGIN")
        now = time.time()  # one clock for the page and its total
        hits = (
            index.search(
                query, offset + limit, min_score=min_score, recency=recency, where=where, params=params, now=now
            )[offset:]
            if limit
            else []
        )
        total = index.count_matches(query, min_score=min_score, recency=recency, where=where, params=params, now=now)
        results = _hydrate(conn, hits, set(terms), root)
        missing = tuple(recorded_missing(conn))
    except sqlite3.Error as exc:
        raise StoreIOError("search", index.path, str(exc)) from exc
    finally:
        if own and conn.in_transaction:
            try:
                conn.execute("COMMIT")
            except sqlite3.Error:
                logger.warning("search: ending a read transaction on %s failed", index.path, exc_info=True)
    return SearchPage(results, total, offset, limit, missing)


def search_memory(
    root: Union[str, os.PathLike[str]],
    query: str,
    max_results: int = 6,
    min_score: float = 0.0,
    *,
    source: Optional[str] = None,
    session_id: Optional[str] = None,
    since: Optional[str] = None,
    recency: bool = True,
    machine: Optional[str] = None,
) -> SearchResults:
    """BM25 search over every session under ``root`` (see the module docstring for the
    scoring), through this process's warm state of that store, which every
    :class:`~memstore.Store` of ``root`` shares (:func:`memstore.catalog.live_catalog`): the
    catalog is kept current between calls at the cost of what changed. ``source`` (``event``
    or ``session``), ``session_id``, ``since`` (a date or an RFC 3339 time: only chunks from
    then on) and ``machine`` (a store id or label: only sessions born in that store) restrict
    the results, not the statistics.

    Returns a list of :class:`MemorySearchResult` (a :class:`SearchResults`) whose ``missing``
    names the sessions the search could not look at, and why; ``partial`` says whether there
    are any. An empty or punctuation-only query gives ``[]``; no query is ever an error.
    """
    if isinstance(max_results, bool) or not isinstance(max_results, int):
        raise TypeError(f"max_results must be an int, not {type(max_results).__name__}")
    from .catalog.live import live_catalog

    page = search_live(
        live_catalog(root),
        query,
        limit=max_results,
        session=session_id,
        since=since,
        source=source,
        recency=recency,
        min_score=min_score,
        machine=machine,
    )
    return page.results  # type: ignore[return-value]


def search_live(
    live: LiveCatalog,
    query: str,
    *,
    limit: int = 6,
    offset: int = 0,
    session: Optional[str] = None,
    since: Optional[str] = None,
    source: Optional[str] = None,
    recency: bool = True,
    min_score: float = 0.0,
    on_progress: Optional[Callable[[CatalogProgress], None]] = None,
    machine: Optional[str] = None,
) -> SearchPage:
    """Bring the catalog ``live`` keeps up to date (at the cost of what changed, see
    :mod:`memstore.catalog.live`), then search it (:func:`search_catalog`): a page whose
    ``results`` are a :class:`SearchResults` and whose ``missing`` adds, to what the catalog
    records, what ``live`` knows besides (a store it cannot write, a refresh it could not run).
    ``on_progress`` is called while the catalog copies sessions (a first search of a large store
    builds the whole catalog). A query without tokens or a ``limit`` of 0 gives an empty page
    without looking at the store."""
    for name, value in (("limit", limit), ("offset", offset)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    if offset < 0:
        raise ValueError(f"offset must not be negative, not {offset}")
    if limit <= 0 or not isinstance(query, str) or not tokenize(query):
        return SearchPage(SearchResults(), 0, offset, max(0, limit))
    extra = live.ensure_current(on_progress=on_progress, index_for=kept_index)
    page = search_catalog(
        live.connection(),
        query,
        limit=limit,
        offset=offset,
        session=session,
        since=since,
        source=source,
        recency=recency,
        min_score=min_score,
        root=live.root,
        machine=machine,
    )
    missing = {m.directory: m for m in page.missing}
    for m in extra:
        missing.setdefault(m.directory, m)
    ordered = tuple(missing[name] for name in sorted(missing))
    return SearchPage(SearchResults(page.results, ordered), page.total, page.offset, page.limit, ordered)


_RESULT_COLUMNS = "id, chunk_id, path, start_line, end_line, source, created_at, session_id, turn, seq, kind, text"


def _hydrate(
    conn: sqlite3.Connection,
    hits: list[tuple[int, float]],
    tokens: set[str],
    root: Union[None, str, os.PathLike[str]],
) -> list[MemorySearchResult]:
    """The hits ``(id, score)`` as results, in their order, from their chunks rows (a hit whose
    row is gone is left out)."""
    if not hits:
        return []
    ids = "[" + ",".join(str(doc) for doc, _ in hits) + "]"
    rows = {
        row[0]: row
        for row in conn.execute(
            f"SELECT {_RESULT_COLUMNS} FROM chunks WHERE id IN (SELECT value FROM json_each(?))", (ids,)
        )
    }
    results = []
    for doc, score in hits:
        row = rows.get(doc)
        if row is None:
            continue
        file_path = row[2]
        if root is not None and not (row[2] and os.path.isabs(row[2])):
            file_path = str(Path(root) / (row[2] or ""))
        results.append(
            MemorySearchResult(
                chunk_id=row[1],
                path=file_path,
                start_line=row[3] or 0,
                end_line=row[4] or 0,
                score=score,
                snippet=snippet(row[11], tokens),
                source=row[5],
                created_at=row[6],
                session_id=row[7],
                turn=row[8],
                seq=row[9],
                kind=row[10],
            )
        )
    return results


MACHINE_FILTER = "session_id IN (SELECT session_id FROM sessions WHERE origin_store_id = ? OR origin_label = ?)"
"""The condition (over a table with a ``session_id``) that keeps the sessions whose origin is
one machine: a store id or a store label, given twice as parameters (see :func:`machine_params`).
A session born in this store has this store as its origin; one imported from another store,
the store it was first written in."""


def machine_params(machine: str) -> list[str]:
    """The parameters of :data:`MACHINE_FILTER` for ``machine`` (a store id or label)."""
    text = machine.strip()
    return [text, text]


def _filters(
    source: Optional[str], session_id: Optional[str], since: Optional[str], machine: Optional[str] = None
) -> tuple[Optional[str], list[Any]]:
    """The ``where`` condition over ``chunks`` (and its parameters) the filters make."""
    clauses, params = [], []
    if source is not None:
        clauses.append("source = ?")
        params.append(source)
    if session_id is not None:
        clauses.append("session_id = ?")
        params.append(session_id)
    if since is not None:
        clauses.append("created_at >= ?")
        params.append(_since(since))
    if machine is not None:
        clauses.append(MACHINE_FILTER)
        params += machine_params(machine)
    return " AND ".join(clauses) or None, params


def _since(value: str) -> str:
    """``since`` as a time comparable with chunk times: a date is its midnight UTC."""
    text = value.strip()
    if len(text) == 10:
        text += "T00:00:00Z"
    parsed = parse_ts(text)
    if parsed is None:
        raise ValueError(f"since must be a date (YYYY-MM-DD) or an RFC 3339 time, not {value!r}")
    try:
        return format_ts(parsed)
    except OverflowError:
        # Its UTC instant is before year 1 (every time is after it) or after 9999 (none is).
        return "" if parsed.year == 1 else "9999-12-31T23:59:59.999Z\uffff"
