""":class:`SearchIndex`: BM25 ranking of a database's ``chunks`` table, kept in ``search_*``
tables of the same database (see :mod:`.segments` for the storage, :mod:`.merge` for the merges,
:mod:`.query` for scoring).

The engine knows of the ``chunks`` table only its ``id`` and ``chunk_id`` columns (and whatever a
caller's ``where`` filter names); which text is indexed, and when, is the caller's business.

Use from a refresh: open the transaction yourself, then ``add`` and ``remove`` join it (they run
inside a SAVEPOINT and never commit a transaction they did not open), so chunk rows and postings
commit together and a reader sees both or neither. Called outside a transaction, each of them
commits on its own (Python's sqlite3 opens a transaction only before INSERT/UPDATE/DELETE, so say
BEGIN explicitly)::

    index = SearchIndex(conn)
    index.ensure_schema()
    conn.execute("BEGIN IMMEDIATE")
    old = [r[0] for r in conn.execute("SELECT id FROM chunks WHERE session_id = ?", (sid,))]
    index.remove(old)                  # a rewritten session (for a grown one, skip this)
    conn.execute("DELETE FROM chunks WHERE session_id = ?", (sid,))
    ...insert the new chunk rows...
    index.add(conn.execute("SELECT id, text, created_at FROM chunks WHERE session_id = ?", (sid,)))
    conn.commit()
    hits = index.search("cargo test failure", k=6, where="session_id = ?", params=(sid,))

A query keeps what it loaded in the index's :class:`IndexCache`; pass one ``cache`` to every
index over the same database (a process's connections, its threads) to load it once.
"""

from __future__ import annotations

import itertools
import logging
import sqlite3
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any, Optional, Union

from ..errors import StoreIOError
from .merge import merge, merge_tiers
from .query import (
    IndexCache,
    Params,
    candidates,
    count_allowed,
    load_segment_docs,
    matching_slots,
    select,
    sync,
    weigh_terms,
)
from .recency import now_seconds
from .segments import (
    FORMAT,
    SCHEMA,
    TABLES,
    SegmentDocs,
    SegmentInfo,
    analyze,
    max_id,
    present,
    remove_docs,
    segments,
    write_segment,
)
from .tokens import tokenize

logger = logging.getLogger(__name__)


class SearchIndex:
    """BM25 ranking of the ``chunks`` table of a database, persisted in ``search_*`` tables of the
    same database.

    ``db`` is a :class:`sqlite3.Connection` or a :class:`sqlite_utils.Database`. Its methods are
    serialized by its cache's lock. ``cache`` is what queries keep between calls (see
    :class:`IndexCache`); by default the index has one of its own, of at most about
    ``cache_bytes`` of term postings, plus 34 bytes per indexed document once it has searched.
    ``segment_docs`` caps the documents of a segment written by one ``add`` (memory while
    indexing); ``auto_merge_docs`` caps the merges ``add`` and ``remove`` run: theirs is bounded
    by a constant, never by the corpus, and :meth:`optimize` runs the larger ones.

    Writes (:meth:`add`, :meth:`remove`, :meth:`optimize`, :meth:`rebuild`) run inside a SAVEPOINT:
    within the caller's transaction they become part of it (commit or roll back with it); outside
    one they commit on their own. Either way they are atomic.
    """

    def __init__(
        self,
        db: Any,
        *,
        cache_bytes: int = 256 << 20,
        segment_docs: int = 32768,
        auto_merge_docs: int = 65536,
        cache: Optional[IndexCache] = None,
    ) -> None:
        self.conn: sqlite3.Connection = getattr(db, "conn", db)
        self.cache = cache if cache is not None else IndexCache(cache_bytes)
        self.segment_docs = max(1, int(segment_docs))
        self.auto_merge_docs = int(auto_merge_docs)
        self.path = database_path(self.conn)

    @property
    def cache_bytes(self) -> int:
        return self.cache.cache_bytes

    # -- plumbing -------------------------------------------------------------------------------

    def _error(self, op: str, exc: sqlite3.Error) -> StoreIOError:
        return StoreIOError(op, self.path, f"{type(exc).__name__}: {exc}")

    @contextmanager
    def _writing(self, op: str) -> Iterator[None]:
        """Run a write atomically: a SAVEPOINT nests in the caller's transaction, or makes one."""
        with self.cache.lock:
            try:
                self.conn.execute("SAVEPOINT memstore_search")
            except sqlite3.Error as exc:
                raise self._error(op, exc) from exc
            try:
                yield
            except BaseException as exc:
                # SQLite may already have rolled back the whole transaction, savepoint included
                # (a full disk does): then there is nothing left to undo.
                if self.conn.in_transaction:
                    try:
                        self.conn.execute("ROLLBACK TO memstore_search")
                        self.conn.execute("RELEASE memstore_search")
                    except sqlite3.Error:
                        logger.warning("search: rollback of a failed %s on %s failed", op, self.path, exc_info=True)
                if isinstance(exc, sqlite3.Error):
                    raise self._error(op, exc) from exc
                raise
            try:
                self.conn.execute("RELEASE memstore_search")
            except sqlite3.Error as exc:
                raise self._error(op, exc) from exc

    @contextmanager
    def _reading(self, op: str) -> Iterator[None]:
        """One read transaction around a query, so it sees one state of the index and chunks."""
        with self.cache.lock:
            own = not self.conn.in_transaction
            try:
                if own:
                    self.conn.execute("BEGIN")
                yield
            except sqlite3.Error as exc:
                raise self._error(op, exc) from exc
            finally:
                if own and self.conn.in_transaction:
                    try:
                        self.conn.execute("COMMIT")
                    except sqlite3.Error:
                        logger.warning("search: ending a read transaction on %s failed", self.path, exc_info=True)

    def _load(self, seg: SegmentInfo) -> SegmentDocs:
        return load_segment_docs(self.conn, self.cache, seg)

    # -- schema ---------------------------------------------------------------------------------

    def ensure_schema(self) -> None:
        """Create the ``search_*`` tables if missing (idempotent; does not commit a caller's
        transaction). Raises :class:`StoreIOError` if they hold a layout this version cannot read
        (the index is regenerable: drop the tables and :meth:`rebuild`)."""
        with self._writing("create search index"):
            for statement in SCHEMA:
                self.conn.execute(statement)
            row = self.conn.execute("SELECT value FROM search_meta WHERE key = 'format'").fetchone()
            if row is None:
                self.conn.execute("INSERT INTO search_meta (key, value) VALUES ('format', ?)", (str(FORMAT),))
            elif row[0] != str(FORMAT):
                raise StoreIOError(
                    "open search index",
                    self.path,
                    f"format {row[0]} is not {FORMAT}; drop the search_* tables and rebuild",
                )

    # -- writes ---------------------------------------------------------------------------------

    def add(self, docs: Iterable[tuple[int, str, Optional[str]]]) -> None:
        """Index documents given as ``(id, text, created_at)``: ``id`` is the ``chunks`` rowid,
        ``created_at`` RFC 3339 text (or Unix seconds) or None.

        Costs time proportional to the documents given (plus merges bounded by
        ``auto_merge_docs``), not to the corpus. An id already indexed is replaced; within one call
        the last occurrence wins. Atomic; see the class docstring for transactions.
        """
        with self._writing("index"):
            iterator = iter(docs)
            while True:
                batch: dict[int, tuple[Optional[str], Any]] = {}
                for doc_id, text, created_at in itertools.islice(iterator, self.segment_docs):
                    batch[int(doc_id)] = (text, created_at)
                if not batch:
                    break
                found = present(self.conn, batch.keys()) if min(batch) <= max_id(self.conn) else []
                if found:
                    logger.debug("search: replacing %d already indexed documents", len(found))
                    remove_docs(self.conn, found)
                write_segment(self.conn, analyze(batch))
            merge_tiers(self.conn, self._load, self.auto_merge_docs)

    def remove(self, ids: Iterable[int]) -> None:
        """Remove documents by id (ids not indexed are ignored). They leave the results and the
        statistics at once; their postings are dropped by a later merge. Costs time proportional
        to the documents removed (plus bounded merges). Atomic."""
        wanted = sorted({int(i) for i in ids})
        if not wanted:
            return
        with self._writing("remove from search index"):
            remove_docs(self.conn, wanted)
            merge_tiers(self.conn, self._load, self.auto_merge_docs)

    def optimize(self, *, full: bool = False) -> None:
        """Run the merges ``add`` and ``remove`` leave for later because they exceed
        ``auto_merge_docs`` (cost proportional to the segments merged). ``full=True`` merges
        everything into one segment without tombstones. Atomic; call it at a quiet time."""
        with self._writing("optimize search index"):
            if full:
                segs = segments(self.conn)
                if len(segs) > 1 or any(s.ndeleted for s in segs):
                    merge(self.conn, self._load, segs)
            else:
                merge_tiers(self.conn, self._load, None)

    def rebuild(self, where: Optional[str] = None, params: Sequence[Any] = ()) -> int:
        """Drop the index and index every row of ``chunks`` again (or those matching ``where``).
        Returns the number of documents indexed. Atomic."""
        with self._writing("rebuild search index"):
            for table in TABLES:
                self.conn.execute(f"DELETE FROM {table}")
            sql = "SELECT id, text, created_at FROM chunks" + (f" WHERE ({where})" if where else "")
            count = 0

            def rows() -> Iterator[tuple[int, str, Optional[str]]]:
                nonlocal count
                # Reading chunks while writing the search_ tables on the same connection is fine:
                # the statement's table is not the one written.
                for row in self.conn.execute(sql, params):
                    count += 1
                    yield row

            self.add(rows())
            return count

    # -- queries --------------------------------------------------------------------------------

    def count(self) -> int:
        """The number of live documents in the index (the N of BM25)."""
        with self._reading("read search index"):
            row = self.conn.execute("SELECT COALESCE(SUM(ndocs - ndeleted), 0) FROM search_segments").fetchone()
            return int(row[0])

    def search(
        self,
        query: str,
        k: int = 6,
        *,
        min_score: float = 0.0,
        recency: bool = True,
        where: Optional[str] = None,
        params: Params = (),
        now: Union[None, float, str, datetime] = None,
    ) -> list[tuple[int, float]]:
        """The ``k`` best documents for ``query`` as ``(id, score)``, best first.

        ``query`` is any text: only its tokens count (see :func:`tokenize`), so operators, quotes
        and punctuation are inert; no tokens gives ``[]``. ``where`` is an SQL condition over the
        ``chunks`` table (e.g. ``"session_id = ?"`` with ``params=(sid,)``; positional or named
        parameters) restricting which documents may come back, never the statistics. ``recency``
        applies :func:`recency_multiplier` (``now`` fixes the clock, for tests). Scores > 0 and >=
        ``min_score`` are kept; ties are ordered by ``chunk_id``. Documents whose ``chunks`` row is
        missing are skipped (with a warning).

        Raises :class:`StoreIOError` (naming the database) if SQLite fails, including on an invalid
        ``where`` or when :meth:`ensure_schema` never ran on the database.
        """
        if k <= 0:
            return []
        counts = Counter(tokenize(query)) if isinstance(query, str) else Counter()
        if not counts:
            return []
        now_s = now_seconds(now) if recency else 0.0
        where = where if where and where.strip() else None
        with self._reading("search"):
            view = sync(self.conn, self.cache)
            if view.n_live == 0:
                return []
            terms = weigh_terms(self.conn, self.cache, view, counts)
            if not terms:
                return []
            prune = where is None  # a filter may reject the best candidates: weigh everything
            while True:
                slots, scores, pruned = candidates(view, terms, k, recency, now_s, prune)
                keep = (scores > 0.0) & (scores >= min_score)
                if not keep.all():
                    slots, scores = slots[keep], scores[keep]
                results = select(self.conn, view, slots, scores, k, where, params, self.path)
                if len(results) == k or not pruned:
                    return results
                # Some of the best documents had no chunks row: look further down.
                prune = False

    def count_matches(
        self,
        query: str,
        *,
        min_score: float = 0.0,
        recency: bool = True,
        where: Optional[str] = None,
        params: Params = (),
        now: Union[None, float, str, datetime] = None,
    ) -> int:
        """How many documents :meth:`search` would return for ``query`` with no limit on ``k``
        (same arguments). Costs time proportional to the postings of the query's terms; with a
        ``where`` filter, also to the matching documents (or, past ``COUNT_PROBE_DOCS`` of them,
        to the rows the filter allows). Without one, a document indexed without its chunks row
        counts (:meth:`search` skips it, with a warning).
        """
        counts = Counter(tokenize(query)) if isinstance(query, str) else Counter()
        if not counts:
            return 0
        now_s = now_seconds(now) if recency else 0.0
        where = where if where and where.strip() else None
        with self._reading("count search matches"):
            view = sync(self.conn, self.cache)
            if view.n_live == 0:
                return 0
            terms = weigh_terms(self.conn, self.cache, view, counts)
            if not terms:
                return 0
            slots = matching_slots(view, terms, recency, now_s, min_score)
            if where is None:
                return len(slots)
            return count_allowed(self.conn, view.ids[slots], where, params)


def database_path(conn: sqlite3.Connection) -> str:
    """The file of the connection's main database (``:memory:`` for none, ``<sqlite>`` when
    SQLite will not say)."""
    try:
        for _seq, name, file in conn.execute("PRAGMA database_list"):
            if name == "main":
                return file or ":memory:"
    except sqlite3.Error:
        pass
    return "<sqlite>"
