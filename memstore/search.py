"""BM25 ranking over the catalog's search chunks.

``catalog.db`` holds every session's search chunks in the ``chunks`` table (owned by the catalog).
This module keeps a ranking index beside it, in tables of its own (prefix ``search_``) in the same
database, so a catalog refresh writes chunk rows and their postings in one transaction and a reader
never sees one without the other.

Scoring is the reference's BM25 (``reference/vtcode-memory.md`` §5.5):

- tokens are the runs of characters for which ``str.isalnum()`` holds (``_`` separates), each
  lowercased after the split;
- per query token (a repeated query token counts again), with k1 = 1.2 and b = 0.75,
  ``idf = ln(1 + (N - df + 0.5) / (df + 0.5))`` and
  ``score += idf * tf * (k1 + 1) / (tf + k1 * (1 - b + b * len / max(avgdl, 1)))``;
- N, df and avgdl are over every live document of the index (all sessions). A ``where`` filter only
  restricts which documents come back, never the statistics, so scores stay comparable;
- a mild recency multiplier ``1 + 0.1 * 0.5 ** (age_days / 30)`` (1.0 when ``created_at`` is NULL,
  age clamped at 0, so it lies in [1.0, 1.1]) is applied before the ``min_score`` filter; pass
  ``recency=False`` for plain BM25;
- results are the documents with score > 0 and >= ``min_score``, by score descending, ties by
  ``chunk_id`` ascending (string order), so the order is deterministic.

Storage (why it looks like this): FTS5's own ``bm25()`` costs about a microsecond per matching row,
too slow to rank common terms over a million chunks, and a row per (term, document) is too slow to
write. So postings live in immutable *segments*, like an LSM tree:

``search_segments``
    one row per segment: document count, total token count, deletion counters, a random ``nonce``
    (caches key on ``(id, nonce)``, so a rolled-back or replaced segment is never mistaken for a
    cached one) and the byte widths of its posting arrays.
``search_segment_docs``
    per segment, three arrays as blobs, indexed by the document's *local* number in the segment:
    catalog ids (int64), token counts (uint32) and ``created_at`` as Unix seconds (float64, NaN when
    NULL).
``search_postings``
    a segment's postings in blocks of consecutive terms, keyed ``(segment, first_term)``: the
    block's terms, their offsets, and for each term the local numbers (ascending, uint16 or uint32)
    of the documents holding it with its frequencies (uint8/16/32). A row per term was the largest
    cost of indexing (most terms of agent text are rare: ids, numbers, paths, so a batch has about
    ten distinct terms per document); blocks of up to 64 terms and about 4,096 postings make about
    50 times fewer rows, and a frequent term gets a block of its own, so a query reads little it
    does not need. Segment first in the key: a new segment is an append at the end of the b-tree,
    a merge reads its inputs in term order, and a query seeks one block per segment and term.
``search_docs``
    catalog id -> (segment, local, length), so removing a session's documents costs what the
    session costs.
``search_deleted``
    tombstones ``(segment, local)``. Removed documents stay in their segment until a merge drops
    them; a query ignores their postings and counts only live postings in df, so statistics are
    exact at once.
``search_meta``
    the layout's format number.

``add`` writes a new segment per call (split every ``segment_docs`` documents), then runs tiered
merges: when ``MERGE_FACTOR`` segments share a size tier they are merged into one, and a segment
with a quarter of its documents removed is rewritten. Inside ``add`` and ``remove`` only merges of at
most ``auto_merge_docs`` documents run, so their cost is bounded by a constant, never by the corpus;
:meth:`SearchIndex.optimize` runs the larger ones at a quiet time. Queries do not slow down with the
number of segments once a term is cached, only its first load does (one block read per segment).

Queries: a query loads what it needs lazily and caches it in the process: the segments' document
arrays side by side in one "slot" space, and per query term its postings translated to slots. The
cache is checked against ``search_segments`` on every query (one small read), so a change made by
another connection or process is picked up at the next query. Scoring is vectorized numpy; for a
query of several terms without a ``where`` filter, MaxScore skips most of a common term's postings:
the documents holding the rarest terms are scored in full and the common terms are looked up in
them only, which is exact as soon as the k-th best of those beats what the common terms alone could
give any other document (else more terms are scored in full, up to all of them).

Use from a catalog refresh: open the transaction yourself, then ``add`` and ``remove`` join it
(they run inside a SAVEPOINT and never commit a transaction they did not open), so chunk rows and
postings commit together and a reader sees both or neither. Called outside a transaction, each of
them commits on its own (Python's sqlite3 opens a transaction only before INSERT/UPDATE/DELETE, so
say BEGIN explicitly)::

    index = SearchIndex(conn)          # once per connection; keep it, it holds the caches
    index.ensure_schema()
    conn.execute("BEGIN IMMEDIATE")
    old = [r[0] for r in conn.execute("SELECT id FROM chunks WHERE session_id = ?", (sid,))]
    index.remove(old)                  # a rewritten session (for a grown one, skip this)
    conn.execute("DELETE FROM chunks WHERE session_id = ?", (sid,))
    ...insert the new chunk rows...
    index.add(conn.execute("SELECT id, text, created_at FROM chunks WHERE session_id = ?", (sid,)))
    conn.commit()
    hits = index.search("cargo test failure", k=6, where="session_id = ?", params=(sid,))
"""

from __future__ import annotations

import errno
import itertools
import logging
import math
import os
import random
import re
import sqlite3
import struct
import sys
import threading
import time
from bisect import bisect_left, bisect_right
from collections import Counter, OrderedDict, defaultdict
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Optional, Sequence, Union

import numpy as np

from .errors import StoreIOError

__all__ = [
    "K1",
    "B",
    "RECENCY_WEIGHT",
    "RECENCY_HALF_LIFE_DAYS",
    "SearchIndex",
    "fts_match",
    "recency_multiplier",
    "tokenize",
]

logger = logging.getLogger("memstore")

K1 = 1.2
B = 0.75
RECENCY_WEIGHT = 0.1
"""The multiplier for a brand-new document is ``1 + RECENCY_WEIGHT``."""
RECENCY_HALF_LIFE_DAYS = 30.0
"""The recency bonus halves every this many days of age."""

MERGE_FACTOR = 8
"""Segments of one size tier are merged once this many of them exist."""
TIER_BASE_DOCS = 1024
"""Tier 0 holds segments of up to this many live documents; each tier up is MERGE_FACTOR times larger."""
DELETED_REWRITE_FRACTION = 0.25
"""A segment with at least this fraction of its documents removed is rewritten without them."""
FORMAT = 1
"""Version of the ``search_`` tables' layout, recorded in ``search_meta``."""
FILTER_PROBE_DOCS = 8192
"""With a ``where`` filter, candidates are checked against ``chunks`` a batch at a time; after this
many, the filter's whole set of ids is read instead (it is then selective)."""
PRUNE_MIN_CANDIDATES = 64
"""Without a filter, more than this many candidates per result are first cut to those that can
still reach the top k."""
MAXSCORE_MAX_TERMS = 16
"""Queries with more distinct terms than this are scored in full (MaxScore's tries cost more)."""

# ----------------------------------------------------------------------------------------------
# Tokens

_WORD = re.compile(r"[^\W_]+")  # \w is str.isalnum() plus "_", so this is exactly the isalnum runs
_ASCII_ALNUM = frozenset("0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")
# For ASCII text, translate + split does the same as the regex at three times the speed: every
# non-alphanumeric character becomes a space and A-Z become a-z (ASCII lowercasing is per character,
# so lowercasing before the split changes nothing).
_ASCII_STR_TABLE = {
    i: (chr(i).lower() if chr(i) in _ASCII_ALNUM else " ") for i in range(128)
}
_ASCII_BYTES_TABLE = bytes(
    (ord(chr(i).lower()) if chr(i) in _ASCII_ALNUM else 0x20) for i in range(128)
) + bytes(range(128, 256))


def tokenize(text: str) -> list[str]:
    """The BM25 tokens of ``text``: its runs of Unicode letters and digits (``str.isalnum``; ``_``
    and everything else separates), each lowercased after the split.

    Lowercasing after the split matters outside ASCII: ``"İ".lower()`` is ``"i̇"`` (with a combining
    dot, which is not alphanumeric), and lowercasing first would cut the token there.
    """
    if not text:
        return []
    if text.isascii():  # O(1) in CPython
        return text.translate(_ASCII_STR_TABLE).split()
    return [t.lower() for t in _WORD.findall(text)]


def _token_keys(text: Optional[str]) -> list[bytes]:
    """:func:`tokenize` as UTF-8 bytes, the fast path of indexing (bytes.translate is the quickest
    way Python has to split ASCII text). Same tokens, byte for byte."""
    if not text:
        return []
    if text.isascii():
        return text.encode("ascii").translate(_ASCII_BYTES_TABLE).split()
    # A lowercased token never holds a surrogate (they are not alphanumeric), so this encodes.
    return [t.lower().encode("utf-8") for t in _WORD.findall(text)]


def fts_match(query: str) -> Optional[str]:
    """A safe FTS5 ``MATCH`` expression for ``query``: its distinct tokens, each double-quoted (so
    no FTS5 operator or syntax survives), joined by ``OR``. ``None`` when the query has no tokens.

    Meant for snippets and highlighting; ranking is :meth:`SearchIndex.search`. FTS5's tokenizer may
    split a quoted token differently (e.g. folding diacritics), which can only change which rows
    get a snippet, never raise.
    """
    tokens = list(dict.fromkeys(tokenize(query)))
    if not tokens:
        return None
    # Tokens are alphanumeric runs, so they hold no double quote; doubling is belt and braces.
    return " OR ".join('"' + t.replace('"', '""') + '"' for t in tokens)


# ----------------------------------------------------------------------------------------------
# Recency


def _epoch_seconds(value: Any) -> float:
    """Unix seconds of a ``created_at`` (RFC 3339 text, or a number of Unix seconds); NaN when it
    is NULL or unreadable."""
    if value is None:
        return math.nan
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if type(value) is str and _FROMISO_READS_Z:
        try:  # the common case, memstore's own format, without the slower path below
            moment = datetime.fromisoformat(value)
            if moment.tzinfo is not None:
                return moment.timestamp()
        except ValueError:
            pass
    text = str(value).strip()
    if text[-1:] in ("Z", "z"):  # fromisoformat before Python 3.11 does not read "Z"
        text = text[:-1] + "+00:00"
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        logger.debug("search: unreadable created_at %r treated as NULL", value)
        return math.nan
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return moment.timestamp()


_FROMISO_READS_Z = sys.version_info >= (3, 11)


def _now_seconds(now: Union[None, float, int, str, datetime]) -> float:
    if now is None:
        return time.time()
    if isinstance(now, datetime):
        if now.tzinfo is None:
            now = now.replace(tzinfo=timezone.utc)
        return now.timestamp()
    seconds = _epoch_seconds(now)
    if math.isnan(seconds):
        raise ValueError(f"now: not a time: {now!r}")
    return seconds


def recency_multiplier(
    created_at: Union[None, str, float], now: Union[None, float, str, datetime] = None
) -> float:
    """The recency factor applied to a document's BM25 score:
    ``1 + RECENCY_WEIGHT * 0.5 ** (age_days / RECENCY_HALF_LIFE_DAYS)``, in [1.0, 1.1].

    ``created_at`` is RFC 3339 text or Unix seconds; NULL or unreadable gives 1.0, a time in the
    future counts as age 0. ``now`` defaults to the current time.
    """
    created = _epoch_seconds(created_at)
    if math.isnan(created):
        return 1.0
    age_days = max(0.0, (_now_seconds(now) - created) / 86400.0)
    return 1.0 + RECENCY_WEIGHT * 0.5 ** (age_days / RECENCY_HALF_LIFE_DAYS)


def _recency_array(created: np.ndarray, now: float) -> np.ndarray:
    age_days = np.maximum((now - created) / 86400.0, 0.0)
    factor = 1.0 + RECENCY_WEIGHT * np.exp2(-age_days / RECENCY_HALF_LIFE_DAYS)
    factor[np.isnan(created)] = 1.0
    return factor


# ----------------------------------------------------------------------------------------------
# Storage

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS search_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    """CREATE TABLE IF NOT EXISTS search_segments (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        nonce INTEGER NOT NULL,
        ndocs INTEGER NOT NULL,
        total_len INTEGER NOT NULL,
        ndeleted INTEGER NOT NULL DEFAULT 0,
        deleted_len INTEGER NOT NULL DEFAULT 0,
        tomb_nonce INTEGER NOT NULL DEFAULT 0,
        doc_width INTEGER NOT NULL,
        tf_width INTEGER NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS search_segment_docs (
        segment INTEGER PRIMARY KEY,
        ids BLOB NOT NULL,
        lens BLOB NOT NULL,
        created BLOB NOT NULL
    )""",
    # Small columns first: a lookup tests last_term without reading the blobs' overflow pages.
    """CREATE TABLE IF NOT EXISTS search_postings (
        segment INTEGER NOT NULL,
        first_term TEXT NOT NULL,
        last_term TEXT NOT NULL,
        terms TEXT NOT NULL,
        offsets BLOB NOT NULL,
        docs BLOB NOT NULL,
        tfs BLOB NOT NULL,
        PRIMARY KEY (segment, first_term)
    ) WITHOUT ROWID""",
    """CREATE TABLE IF NOT EXISTS search_docs (
        id INTEGER PRIMARY KEY,
        segment INTEGER NOT NULL,
        local INTEGER NOT NULL,
        len INTEGER NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS search_deleted (
        segment INTEGER NOT NULL,
        local INTEGER NOT NULL,
        PRIMARY KEY (segment, local)
    ) WITHOUT ROWID""",
)
_TABLES = ("search_segments", "search_segment_docs", "search_postings", "search_docs", "search_deleted")

_UINT = {1: "<u1", 2: "<u2", 4: "<u4"}

BLOCK_TERMS = 64
"""A postings block holds at most this many terms ..."""
BLOCK_POSTINGS = 4096
"""... and about this many postings; a term with more than BLOCK_ALONE postings has a block of its own."""
BLOCK_ALONE = 1024
MERGE_PAGE_BLOCKS = 64
"""A merge reads each input this many blocks at a time (bounding its memory)."""

_TERM_SEPARATOR = "\n"  # never inside a token (tokens are alphanumeric runs, lowercased)


def _stable_order(keys: np.ndarray, bound: int) -> np.ndarray:
    """``np.argsort(keys, kind="stable")`` for non-negative integer keys below ``bound``, done as
    16-bit radix passes (NumPy radix-sorts 16-bit keys in linear time; wider keys get timsort,
    several times slower here)."""
    if bound <= 1 << 16:
        return np.argsort(keys.astype(np.uint16), kind="stable")
    if bound <= 1 << 32:
        order = np.argsort((keys & 0xFFFF).astype(np.uint16), kind="stable")
        return order[np.argsort((keys[order] >> 16).astype(np.uint16), kind="stable")]
    return np.argsort(keys, kind="stable")


def _doc_width(ndocs: int) -> int:
    return 2 if ndocs <= 1 << 16 else 4


def _tf_width(max_tf: int) -> int:
    return 1 if max_tf < 1 << 8 else (2 if max_tf < 1 << 16 else 4)


def _nonce() -> int:
    return random.getrandbits(62) + 1


def _json_ids(ids: Iterable[int]) -> str:
    return "[" + ",".join(map(str, ids)) + "]"


@dataclass(frozen=True)
class _SegmentInfo:
    """A row of ``search_segments``."""

    id: int
    nonce: int
    ndocs: int
    total_len: int
    ndeleted: int
    deleted_len: int
    tomb_nonce: int
    doc_width: int
    tf_width: int

    @property
    def live(self) -> int:
        return self.ndocs - self.ndeleted


_SEGMENT_COLUMNS = "id, nonce, ndocs, total_len, ndeleted, deleted_len, tomb_nonce, doc_width, tf_width"


@dataclass
class _SegmentDocs:
    """A segment's document arrays, indexed by local number (immutable once written)."""

    ids: np.ndarray  # int64 catalog ids
    lens: np.ndarray  # float64 token counts
    created: np.ndarray  # float64 Unix seconds, NaN = NULL


@dataclass
class _Postings:
    """Postings of a run of terms, in the numbering of the segment being written."""

    terms: Union[list[str], list[bytes]]  # sorted, distinct; bytes are UTF-8 (decoded per block)
    counts: np.ndarray  # postings per term, > 0
    docs: np.ndarray  # local numbers, grouped by term, ascending within a term
    tfs: np.ndarray


@dataclass
class _BlockRun:
    """Consecutive postings blocks of one segment, decoded (a merge input)."""

    terms: list[str]
    counts: np.ndarray
    docs: np.ndarray  # local numbers, int64
    tfs: np.ndarray  # uint32

    @classmethod
    def empty(cls) -> "_BlockRun":
        return cls([], np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.uint32))

    @classmethod
    def decode(cls, rows: list[tuple[str, str, bytes, bytes, bytes]], seg: _SegmentInfo) -> "_BlockRun":
        if not rows:
            return cls.empty()
        terms: list[str] = []
        for row in rows:
            terms.extend(row[1].split(_TERM_SEPARATOR))
        counts = np.concatenate([np.diff(np.frombuffer(row[2], "<u4")) for row in rows]).astype(np.int64)
        docs = np.frombuffer(b"".join(row[3] for row in rows), _UINT[seg.doc_width]).astype(np.int64)
        tfs = np.frombuffer(b"".join(row[4] for row in rows), _UINT[seg.tf_width]).astype(np.uint32)
        return cls(terms, counts, docs, tfs)

    def split(self, bound: Optional[str]) -> tuple["_BlockRun", "_BlockRun"]:
        """(terms <= bound, the rest); everything when bound is None."""
        if bound is None:
            return self, _BlockRun.empty()
        cut = bisect_right(self.terms, bound)
        at = int(self.counts[:cut].sum())
        return (
            _BlockRun(self.terms[:cut], self.counts[:cut], self.docs[:at], self.tfs[:at]),
            _BlockRun(self.terms[cut:], self.counts[cut:], self.docs[at:], self.tfs[at:]),
        )


@dataclass
class _TermEntry:
    """A term's postings over a view's slots (ascending), cached; and its live subset for one
    version of the view's tombstones."""

    slots: np.ndarray  # int32
    tfs: np.ndarray  # float32
    tfmax: float
    version: int = -1
    df: int = 0
    live_slots: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))
    live_tfs: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))

    @property
    def nbytes(self) -> int:
        return self.slots.nbytes + self.tfs.nbytes


@dataclass
class _QueryTerm:
    entry: _TermEntry
    weight: float  # repeat * idf * (k1 + 1)
    bound: float  # no document scores more than this for the term


class _View:
    """What a query needs, in one "slot" space: the live segments' documents side by side."""

    def __init__(self) -> None:
        self.layout: tuple[tuple[int, int], ...] = ()
        self.rows: Optional[list[tuple]] = None  # the search_segments rows it reflects
        self.segments: dict[int, _SegmentInfo] = {}
        self.offsets: dict[int, int] = {}
        self.ids = np.zeros(0, np.int64)
        self.lens = np.zeros(0, np.float64)
        self.created = np.zeros(0, np.float64)
        self.alive = np.zeros(0, np.bool_)
        self.scratch = np.zeros(0, np.float64)  # score accumulator, kept all-zero between queries
        self.mark = np.zeros(0, np.bool_)  # candidate marks, kept all-False between queries
        self.alive_version = 0  # bumped whenever ``alive`` changes
        self.n_live = 0
        self.avgdl = 1.0
        self.terms: OrderedDict[str, _TermEntry] = OrderedDict()
        self.term_bytes = 0


class SearchIndex:
    """BM25 ranking of the ``chunks`` table of a catalog database, persisted in ``search_*`` tables
    of the same database.

    ``db`` is a :class:`sqlite3.Connection` or a :class:`sqlite_utils.Database`. One instance per
    connection; its methods are serialized by a lock, and it keeps in-process caches (at most about
    ``cache_bytes`` of term postings, plus 34 bytes per indexed document once it has searched).
    ``segment_docs`` caps the documents of a segment written by one ``add`` (memory while
    indexing); ``auto_merge_docs`` caps the merges ``add`` and ``remove`` run (see the module
    docstring).

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
    ) -> None:
        self.conn: sqlite3.Connection = getattr(db, "conn", db)
        self.cache_bytes = int(cache_bytes)
        self.segment_docs = max(1, int(segment_docs))
        self.auto_merge_docs = int(auto_merge_docs)
        self._lock = threading.RLock()
        self._view = _View()
        self._segment_docs_cache: dict[tuple[int, int], _SegmentDocs] = {}
        self.path = self._database_path()

    # -- plumbing -------------------------------------------------------------------------------

    def _database_path(self) -> str:
        try:
            for _seq, name, file in self.conn.execute("PRAGMA database_list"):
                if name == "main":
                    return file or ":memory:"
        except sqlite3.Error:
            pass
        return "<sqlite>"

    def _error(self, op: str, exc: sqlite3.Error) -> StoreIOError:
        return StoreIOError(op, self.path, f"{type(exc).__name__}: {exc}")

    @contextmanager
    def _writing(self, op: str) -> Iterator[None]:
        """Run a write atomically: a SAVEPOINT nests in the caller's transaction, or makes one."""
        with self._lock:
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
        with self._lock:
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

    # -- schema ---------------------------------------------------------------------------------

    def ensure_schema(self) -> None:
        """Create the ``search_*`` tables if missing (idempotent; does not commit a caller's
        transaction). Raises :class:`StoreIOError` if they hold a layout this version cannot read
        (the index is regenerable: drop the tables and :meth:`rebuild`)."""
        with self._writing("create search index"):
            for statement in _SCHEMA:
                self.conn.execute(statement)
            row = self.conn.execute("SELECT value FROM search_meta WHERE key = 'format'").fetchone()
            if row is None:
                self.conn.execute("INSERT INTO search_meta (key, value) VALUES ('format', ?)", (str(FORMAT),))
            elif row[0] != str(FORMAT):
                raise StoreIOError(
                    "open search index", self.path,
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
                present = self._present(batch.keys()) if min(batch) <= self._max_id() else []
                if present:
                    logger.debug("search: replacing %d already indexed documents", len(present))
                    self._remove(present)
                self._write_segment(self._analyze(batch))
            self._merge_tiers(self.auto_merge_docs)

    def remove(self, ids: Iterable[int]) -> None:
        """Remove documents by id (ids not indexed are ignored). They leave the results and the
        statistics at once; their postings are dropped by a later merge. Costs time proportional
        to the documents removed (plus bounded merges). Atomic."""
        wanted = sorted({int(i) for i in ids})
        if not wanted:
            return
        with self._writing("remove from search index"):
            self._remove(wanted)
            self._merge_tiers(self.auto_merge_docs)

    def optimize(self, *, full: bool = False) -> None:
        """Run the merges ``add`` and ``remove`` leave for later because they exceed
        ``auto_merge_docs`` (cost proportional to the segments merged). ``full=True`` merges
        everything into one segment without tombstones. Atomic; call it at a quiet time."""
        with self._writing("optimize search index"):
            if full:
                segments = self._segments()
                if len(segments) > 1 or any(s.ndeleted for s in segments):
                    self._merge(segments)
            else:
                self._merge_tiers(None)

    def rebuild(self, where: Optional[str] = None, params: Sequence[Any] = ()) -> int:
        """Drop the index and index every row of ``chunks`` again (or those matching ``where``).
        Returns the number of documents indexed. Atomic."""
        with self._writing("rebuild search index"):
            for table in _TABLES:
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

    def _max_id(self) -> int:
        row = self.conn.execute("SELECT max(id) FROM search_docs").fetchone()
        return -(1 << 63) if row[0] is None else row[0]

    def _present(self, ids: Iterable[int]) -> list[int]:
        cur = self.conn.execute(
            "SELECT id FROM search_docs WHERE id IN (SELECT value FROM json_each(?))", (_json_ids(ids),)
        )
        return [r[0] for r in cur]

    def _remove(self, ids: Sequence[int]) -> None:
        found: list[tuple[int, int, int, int]] = []
        for start in range(0, len(ids), 32768):
            part = _json_ids(ids[start:start + 32768])
            found += self.conn.execute(
                "SELECT id, segment, local, len FROM search_docs WHERE id IN (SELECT value FROM json_each(?))",
                (part,),
            ).fetchall()
            self.conn.execute("DELETE FROM search_docs WHERE id IN (SELECT value FROM json_each(?))", (part,))
        if not found:
            return
        self.conn.executemany(
            "INSERT INTO search_deleted (segment, local) VALUES (?, ?)", ((seg, local) for _, seg, local, _ in found)
        )
        per_segment: dict[int, list[int]] = {}
        for _, seg, _, length in found:
            count_len = per_segment.setdefault(seg, [0, 0])
            count_len[0] += 1
            count_len[1] += length
        self.conn.executemany(
            "UPDATE search_segments SET ndeleted = ndeleted + ?, deleted_len = deleted_len + ?, tomb_nonce = ?"
            " WHERE id = ?",
            ((n, length, _nonce(), seg) for seg, (n, length) in per_segment.items()),
        )

    def _analyze(self, batch: dict[int, tuple[Optional[str], Any]]) -> tuple[_SegmentDocs, _Postings]:
        """Tokenize a batch into a segment's documents and postings."""
        n = len(batch)
        values = list(batch.values())
        vocab: defaultdict[bytes, int] = defaultdict(itertools.count().__next__)
        term_id = vocab.__getitem__
        tids: list[int] = []
        tfs: list[int] = []
        uniques: list[int] = []
        lens: list[int] = []
        # Document by document, so each document's token objects are freed before the next one
        # (holding a whole batch's tokens measured twice as slow: allocator pressure).
        for text, _ in values:
            tokens = _token_keys(text)
            counts = Counter(tokens)
            tids += map(term_id, counts)
            tfs += counts.values()
            uniques.append(len(counts))
            lens.append(len(tokens))
        seen_times: dict[Any, float] = {}
        created = np.empty(n, np.float64)
        for j, (_, created_at) in enumerate(values):
            when = seen_times.get(created_at)
            if when is None:
                when = seen_times[created_at] = _epoch_seconds(created_at)
            created[j] = when
        docs = _SegmentDocs(
            ids=np.fromiter(batch.keys(), np.int64, n), lens=np.fromiter(lens, np.float64, n), created=created
        )
        keys = sorted(vocab)  # bytewise order of UTF-8 = code point order = SQLite's BINARY order
        rank_of_id = np.empty(len(keys), np.int64)
        rank_of_id[np.fromiter(map(term_id, keys), np.int64, len(keys))] = np.arange(len(keys))
        rank = rank_of_id[np.fromiter(tids, np.int64, len(tids))]
        # Pairs were produced document by document, so a stable sort by term keeps each term's
        # documents ascending.
        order = _stable_order(rank, len(keys))
        local = np.repeat(np.arange(n, dtype=np.int64), np.fromiter(uniques, np.int64, n))
        return docs, _Postings(
            terms=keys,
            counts=np.bincount(rank, minlength=len(keys)),
            docs=local[order],
            tfs=np.fromiter(tfs, np.uint32, len(tfs))[order],
        )

    def _new_segment(self, docs: _SegmentDocs, tf_width: int) -> int:
        ndocs = len(docs.ids)
        cur = self.conn.execute(
            "INSERT INTO search_segments (nonce, ndocs, total_len, doc_width, tf_width) VALUES (?, ?, ?, ?, ?)",
            (_nonce(), ndocs, int(docs.lens.sum()), _doc_width(ndocs), tf_width),
        )
        seg = cur.lastrowid
        self.conn.execute(
            "INSERT INTO search_segment_docs (segment, ids, lens, created) VALUES (?, ?, ?, ?)",
            (
                seg,
                docs.ids.astype("<i8").tobytes(),
                docs.lens.astype("<u4").tobytes(),
                docs.created.astype("<f8").tobytes(),
            ),
        )
        self.conn.executemany(
            "INSERT OR REPLACE INTO search_docs (id, segment, local, len) VALUES (?, ?, ?, ?)",
            zip(docs.ids.tolist(), itertools.repeat(seg), range(ndocs), docs.lens.astype(np.int64).tolist()),
        )
        return seg

    def _write_postings(self, seg: int, doc_width: int, tf_width: int, postings: _Postings) -> None:
        """Write postings (terms ascending, all after the segment's existing ones) as blocks."""
        n_terms = len(postings.terms)
        if not n_terms:
            return
        ends = np.cumsum(postings.counts)
        starts = ends - postings.counts
        # Block boundaries: every BLOCK_TERMS terms, whenever the running posting count crosses a
        # multiple of BLOCK_POSTINGS, and around any term with more than BLOCK_ALONE postings.
        cut = np.zeros(n_terms + 1, np.bool_)
        cut[0] = cut[n_terms] = True
        cut[:n_terms:BLOCK_TERMS] = True
        bucket = starts // BLOCK_POSTINGS
        cut[1:n_terms][bucket[1:] != bucket[:-1]] = True
        alone = np.flatnonzero(postings.counts > BLOCK_ALONE)
        cut[alone] = True
        cut[alone + 1] = True
        bounds = np.flatnonzero(cut).tolist()
        doc_bytes = postings.docs.astype(_UINT[doc_width]).tobytes()
        tf_bytes = postings.tfs.astype(_UINT[tf_width]).tobytes()
        offsets = np.concatenate(([0], ends)).astype(np.int64)
        terms = postings.terms
        if terms and isinstance(terms[0], bytes):
            # Decoding a block's joined terms once is cheaper than decoding every term.
            def joined(a: int, b: int) -> str:
                return b"\n".join(terms[a:b]).decode("utf-8")
        else:
            def joined(a: int, b: int) -> str:
                return _TERM_SEPARATOR.join(terms[a:b])

        def rows() -> Iterator[tuple[int, str, str, str, bytes, bytes, bytes]]:
            for a, b in zip(bounds, bounds[1:]):
                lo, hi = int(offsets[a]), int(offsets[b])
                block = joined(a, b)
                first, _, _ = block.partition(_TERM_SEPARATOR)
                yield (
                    seg, first, block[block.rfind(_TERM_SEPARATOR) + 1:], block,
                    (offsets[a:b + 1] - lo).astype("<u4").tobytes(),
                    doc_bytes[lo * doc_width:hi * doc_width],
                    tf_bytes[lo * tf_width:hi * tf_width],
                )

        self.conn.executemany(
            "INSERT INTO search_postings (segment, first_term, last_term, terms, offsets, docs, tfs)"
            " VALUES (?, ?, ?, ?, ?, ?, ?)",
            rows(),
        )

    def _write_segment(self, analyzed: tuple[_SegmentDocs, _Postings]) -> None:
        docs, postings = analyzed
        tf_width = _tf_width(int(postings.tfs.max()) if len(postings.tfs) else 0)
        seg = self._new_segment(docs, tf_width)
        self._write_postings(seg, _doc_width(len(docs.ids)), tf_width, postings)

    # -- merges ---------------------------------------------------------------------------------

    def _segments(self) -> list[_SegmentInfo]:
        return [_SegmentInfo(*r) for r in self.conn.execute(f"SELECT {_SEGMENT_COLUMNS} FROM search_segments ORDER BY id")]

    @staticmethod
    def _tier(live: int) -> int:
        tier, size = 0, TIER_BASE_DOCS
        while live > size:
            tier += 1
            size *= MERGE_FACTOR
        return tier

    def _plan_merge(self, segments: list[_SegmentInfo], budget: Optional[int]) -> Optional[list[_SegmentInfo]]:
        """The next merge to run, or None. ``budget`` caps the live documents a merge may read."""
        def fits(group: list[_SegmentInfo]) -> bool:
            return budget is None or sum(s.ndocs for s in group) <= budget

        for s in segments:
            if s.ndeleted and (s.live == 0 or s.ndeleted >= DELETED_REWRITE_FRACTION * s.ndocs) and fits([s]):
                return [s]
        tiers: dict[int, list[_SegmentInfo]] = {}
        for s in segments:
            tiers.setdefault(self._tier(s.live), []).append(s)
        for tier in sorted(tiers):
            group = tiers[tier]
            if len(group) < MERGE_FACTOR:
                continue
            chosen: list[_SegmentInfo] = []
            for s in sorted(group, key=lambda s: (s.live, s.id)):
                if not fits(chosen + [s]):
                    break
                chosen.append(s)
            if len(chosen) >= MERGE_FACTOR:
                return chosen
        return None

    def _merge_tiers(self, budget: Optional[int]) -> None:
        while True:
            plan = self._plan_merge(self._segments(), budget)
            if plan is None:
                return
            self._merge(plan)

    def _load_segment_docs(self, seg: _SegmentInfo) -> _SegmentDocs:
        key = (seg.id, seg.nonce)
        cached = self._segment_docs_cache.get(key)
        if cached is not None:
            return cached
        row = self.conn.execute(
            "SELECT ids, lens, created FROM search_segment_docs WHERE segment = ?", (seg.id,)
        ).fetchone()
        if row is None:
            raise sqlite3.DatabaseError(f"search index: segment {seg.id} has no document arrays")
        docs = _SegmentDocs(
            ids=np.frombuffer(row[0], "<i8").astype(np.int64),
            lens=np.frombuffer(row[1], "<u4").astype(np.float64),
            created=np.frombuffer(row[2], "<f8").astype(np.float64),
        )
        if len(docs.ids) != seg.ndocs or len(docs.lens) != seg.ndocs or len(docs.created) != seg.ndocs:
            raise sqlite3.DatabaseError(f"search index: segment {seg.id} document arrays do not match its count")
        return docs

    def _tombstones(self, seg: int) -> np.ndarray:
        cur = self.conn.execute("SELECT local FROM search_deleted WHERE segment = ?", (seg,))
        return np.fromiter((r[0] for r in cur), np.int64)

    def _merge(self, inputs: list[_SegmentInfo]) -> None:
        """Replace ``inputs`` by one segment of their live documents (none if all are removed)."""
        inputs = sorted(inputs, key=lambda s: s.id)
        started = time.perf_counter()
        remaps: list[np.ndarray] = []
        parts: list[_SegmentDocs] = []
        offset = 0
        for seg in inputs:
            docs = self._load_segment_docs(seg)
            alive = np.ones(seg.ndocs, np.bool_)
            alive[self._tombstones(seg.id)] = False
            live = int(alive.sum())
            remap = np.full(seg.ndocs, -1, np.int64)
            remap[alive] = np.arange(offset, offset + live)
            offset += live
            remaps.append(remap)
            parts.append(_SegmentDocs(docs.ids[alive], docs.lens[alive], docs.created[alive]))

        new_seg = None
        if offset:
            merged = _SegmentDocs(
                ids=np.concatenate([p.ids for p in parts]),
                lens=np.concatenate([p.lens for p in parts]),
                created=np.concatenate([p.created for p in parts]),
            )
            doc_width = _doc_width(offset)
            tf_width = max(s.tf_width for s in inputs)
            new_seg = self._new_segment(merged, tf_width)
            for chunk in self._merged_postings(inputs, remaps, MERGE_PAGE_BLOCKS):
                self._write_postings(new_seg, doc_width, tf_width, chunk)

        for seg in inputs:
            self.conn.execute("DELETE FROM search_postings WHERE segment = ?", (seg.id,))
            self.conn.execute("DELETE FROM search_deleted WHERE segment = ?", (seg.id,))
            self.conn.execute("DELETE FROM search_segment_docs WHERE segment = ?", (seg.id,))
            self.conn.execute("DELETE FROM search_segments WHERE id = ?", (seg.id,))
        logger.debug(
            "search: merged segments %s (%d live documents) into %s in %.3fs",
            [s.id for s in inputs], offset, new_seg, time.perf_counter() - started,
        )

    def _merged_postings(
        self, inputs: list[_SegmentInfo], remaps: list[np.ndarray], page_blocks: int
    ) -> Iterator[_Postings]:
        """The inputs' postings in the merged segment's numbering, term range by term range.

        Each input is read in term order, ``page_blocks`` blocks at a time (keyset pagination, so
        no cursor is open while blocks are written); a chunk covers the terms up to the smallest
        last term among the inputs that have more to read, so every term is complete in exactly
        one chunk.
        """
        pending = [_BlockRun.empty() for _ in inputs]
        after = ["" for _ in inputs]  # every term is non-empty, so "" precedes all
        exhausted = [False for _ in inputs]
        while True:
            for i, seg in enumerate(inputs):
                if not pending[i].terms and not exhausted[i]:
                    page = self.conn.execute(
                        "SELECT first_term, terms, offsets, docs, tfs FROM search_postings"
                        " WHERE segment = ? AND first_term > ? ORDER BY first_term LIMIT ?",
                        (seg.id, after[i], page_blocks),
                    ).fetchall()
                    exhausted[i] = len(page) < page_blocks
                    if page:
                        after[i] = page[-1][0]
                    pending[i] = _BlockRun.decode(page, seg)
            if not any(run.terms for run in pending):
                return
            open_ends = [run.terms[-1] for run, done in zip(pending, exhausted) if run.terms and not done]
            bound = min(open_ends) if open_ends else None
            taken = []
            for i, run in enumerate(pending):
                head, pending[i] = run.split(bound)
                taken.append(head)
            yield self._combine(remaps, taken)

    @staticmethod
    def _combine(remaps: list[np.ndarray], runs: list["_BlockRun"]) -> _Postings:
        union = sorted(set().union(*(run.terms for run in runs)))
        rank = {term: r for r, term in enumerate(union)}
        ranks, docs, tfs = [], [], []
        for remap, run in zip(remaps, runs):
            if not run.terms:
                continue
            ranks.append(np.repeat(np.fromiter(map(rank.__getitem__, run.terms), np.int64, len(run.terms)), run.counts))
            docs.append(remap[run.docs])
            tfs.append(run.tfs)
        all_ranks = np.concatenate(ranks)
        all_docs = np.concatenate(docs)
        all_tfs = np.concatenate(tfs)
        keep = all_docs >= 0
        if not keep.all():
            all_ranks, all_docs, all_tfs = all_ranks[keep], all_docs[keep], all_tfs[keep]
        # Inputs are in segment order and the merged numbering follows that order, so a stable
        # sort by term leaves each term's documents ascending.
        order = _stable_order(all_ranks, len(union))
        counts = np.bincount(all_ranks, minlength=len(union))
        present = np.flatnonzero(counts)
        return _Postings(
            terms=[union[r] for r in present.tolist()],
            counts=counts[present],
            docs=all_docs[order],
            tfs=all_tfs[order],
        )

    # -- queries --------------------------------------------------------------------------------

    def count(self) -> int:
        """The number of live documents in the index (the N of BM25)."""
        with self._reading("read search index"):
            row = self.conn.execute("SELECT COALESCE(SUM(ndocs - ndeleted), 0) FROM search_segments").fetchone()
            return int(row[0])

    def _sync(self) -> _View:
        """Bring the cached view up to date with ``search_segments`` (inside a read transaction)."""
        rows = self.conn.execute(f"SELECT {_SEGMENT_COLUMNS} FROM search_segments ORDER BY id").fetchall()
        view = self._view
        if rows == view.rows:
            return view  # nothing changed (the usual case): skip the bookkeeping below
        segments = [_SegmentInfo(*r) for r in rows]
        layout = tuple((s.id, s.nonce) for s in segments)
        if layout != view.layout:
            view = _View()
            view.layout = layout
            docs = []
            offset = 0
            for s in segments:
                d = self._load_segment_docs(s)
                docs.append(d)
                view.offsets[s.id] = offset
                offset += s.ndocs
            if docs:
                view.ids = np.concatenate([d.ids for d in docs])
                view.lens = np.concatenate([d.lens for d in docs])
                view.created = np.concatenate([d.created for d in docs])
            # Keep each segment's arrays as views into the new ones: no second copy, and the next
            # layout (one segment more, or a merge) reuses them instead of reading them again.
            self._segment_docs_cache = {}
            for key, s in zip(layout, segments):
                at = view.offsets[s.id]
                self._segment_docs_cache[key] = _SegmentDocs(
                    view.ids[at:at + s.ndocs], view.lens[at:at + s.ndocs], view.created[at:at + s.ndocs]
                )
            view.alive = np.ones(offset, np.bool_)
            view.scratch = np.zeros(offset, np.float64)
            view.mark = np.zeros(offset, np.bool_)
            self._view = view
        for s in segments:
            old = view.segments.get(s.id)
            if old is None or old.tomb_nonce != s.tomb_nonce:
                start = view.offsets[s.id]
                view.alive[start:start + s.ndocs] = True
                if s.ndeleted:
                    view.alive[start + self._tombstones(s.id)] = False
                view.alive_version += 1
            view.segments[s.id] = s
        view.n_live = sum(s.live for s in segments)
        total = sum(s.total_len - s.deleted_len for s in segments)
        view.avgdl = max(total / view.n_live, 1.0) if view.n_live else 1.0
        view.rows = rows
        return view

    def _term(self, view: _View, term: str) -> Optional[_TermEntry]:
        """A term's postings over the view's slots, from the cache or the database."""
        entry = view.terms.get(term)
        if entry is not None:
            view.terms.move_to_end(term)
            return entry
        slots, tfs = [], []
        # Per segment, the one block whose range can hold the term. CROSS JOIN keeps SQLite from
        # scanning the postings table instead of seeking it per segment.
        for seg, block_terms, offsets, docs, freqs in self.conn.execute(
            "SELECT p.segment, p.terms, p.offsets, p.docs, p.tfs"
            " FROM search_segments AS s CROSS JOIN search_postings AS p"
            " ON p.segment = s.id AND p.first_term = ("
            "   SELECT max(first_term) FROM search_postings WHERE segment = s.id AND first_term <= ?1)"
            " WHERE p.last_term >= ?1",
            (term,),
        ):
            names = block_terms.split(_TERM_SEPARATOR)
            i = bisect_left(names, term)
            if i == len(names) or names[i] != term:
                continue
            lo, hi = struct.unpack_from("<II", offsets, 4 * i)
            info = view.segments[seg]
            local = np.frombuffer(docs, _UINT[info.doc_width], hi - lo, lo * info.doc_width)
            slots.append(local.astype(np.int32) + np.int32(view.offsets[seg]))
            tfs.append(np.frombuffer(freqs, _UINT[info.tf_width], hi - lo, lo * info.tf_width))
        if not slots:
            return None
        all_tfs = np.concatenate(tfs).astype(np.float32)  # exact: no chunk holds 2**24 tokens
        entry = _TermEntry(np.concatenate(slots), all_tfs, float(all_tfs.max()))
        view.terms[term] = entry
        view.term_bytes += entry.nbytes
        while view.term_bytes > self.cache_bytes and len(view.terms) > 1:
            _, old = view.terms.popitem(last=False)
            view.term_bytes -= old.nbytes
        return entry

    def _query_terms(self, view: _View, counts: Counter) -> list[_QueryTerm]:
        """The query's terms present in the index (query order), with idf and score bounds."""
        out = []
        for term, repeat in counts.items():
            entry = self._term(view, term)
            if entry is None:
                continue
            if entry.version != view.alive_version:
                live = view.alive[entry.slots]
                entry.df = int(np.count_nonzero(live))
                if entry.df == len(entry.slots):
                    entry.live_slots, entry.live_tfs = entry.slots, entry.tfs
                else:
                    entry.live_slots, entry.live_tfs = entry.slots[live], entry.tfs[live]
                entry.version = view.alive_version
            if entry.df == 0:
                continue
            df = entry.df
            weight = repeat * math.log(1.0 + (view.n_live - df + 0.5) / (df + 0.5)) * (K1 + 1.0)
            # tf / (tf + k1 (1 - b + b len / avgdl)) grows with tf and shrinks with len, so it is at
            # most tfmax / (tfmax + k1 (1 - b)): a bound on the term's score in any document.
            bound = weight * entry.tfmax / (entry.tfmax + K1 * (1.0 - B))
            out.append(_QueryTerm(entry, weight, bound))
        return out

    @staticmethod
    def _weights(view: _View, qt: _QueryTerm, slots: np.ndarray, tfs: np.ndarray) -> np.ndarray:
        """The term's BM25 score in the documents at ``slots`` (with those tfs)."""
        tf = tfs.astype(np.float64)
        return tf * qt.weight / (tf + (K1 * (1.0 - B) + (K1 * B / view.avgdl) * view.lens[slots]))

    def _accumulate(self, view: _View, terms: list[_QueryTerm], essential: list[bool]) -> tuple[np.ndarray, np.ndarray]:
        """BM25 of the documents holding an essential term: (slots, scores), slots distinct.

        Each document's score is summed over the query's terms in query order, whichever way a
        term is looked up, so the same document gets the same bits on every path (ties stay ties).
        """
        if len(terms) == 1:
            qt = terms[0]
            return qt.entry.live_slots, self._weights(view, qt, qt.entry.live_slots, qt.entry.live_tfs)
        if sum(essential) == 1:
            return self._accumulate_one(view, terms, essential.index(True))
        mark = view.mark
        parts = []
        try:
            for qt, needed in zip(terms, essential):
                if needed:
                    slots = qt.entry.live_slots
                    parts.append(slots[~mark[slots]])
                    mark[slots] = True
            candidates = np.concatenate(parts)
        finally:
            for part in parts:
                mark[part] = False
        acc = view.scratch
        try:
            for qt, needed in zip(terms, essential):
                slots, tfs = qt.entry.live_slots, qt.entry.live_tfs
                if not needed:
                    # Only the candidates' postings of this term.
                    if len(candidates) * 16 < len(slots):
                        at = np.searchsorted(slots, candidates)
                        found = at < len(slots)
                        found[found] = slots[at[found]] == candidates[found]
                        slots, tfs = candidates[found], tfs[at[found]]
                    else:
                        mark[candidates] = True
                        try:
                            hit = mark[slots]
                        finally:
                            mark[candidates] = False
                        slots, tfs = slots[hit], tfs[hit]
                acc[slots] += self._weights(view, qt, slots, tfs)  # slots are distinct within a term
            totals = acc[candidates]
        finally:
            acc[candidates] = 0.0
        return candidates, totals

    def _accumulate_one(self, view: _View, terms: list[_QueryTerm], chosen: int) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`_accumulate` with one essential term: its postings are the candidates, so the
        sums live in an array aligned with them (same additions in the same order, so the same
        bits), and the other terms are found by binary search."""
        candidates = terms[chosen].entry.live_slots
        totals = np.zeros(len(candidates), np.float64)
        for i, qt in enumerate(terms):
            if i == chosen:
                totals += self._weights(view, qt, candidates, qt.entry.live_tfs)
                continue
            slots, tfs = qt.entry.live_slots, qt.entry.live_tfs
            at = np.searchsorted(slots, candidates)
            found = at < len(slots)
            found[found] = slots[at[found]] == candidates[found]
            totals[found] += self._weights(view, qt, candidates[found], tfs[at[found]])
        return candidates, totals

    def _candidates(
        self, view: _View, terms: list[_QueryTerm], k: int, recency: bool, now: float, prune: bool
    ) -> tuple[np.ndarray, np.ndarray, bool]:
        """Scored candidates (slots, final scores with recency) holding every document that can be
        in the top k, and whether documents were left out to get there (``prune``: allowed to)."""
        slack = (1.0 + RECENCY_WEIGHT) * (1.0 + 1e-9) if recency else 1.0 + 1e-9
        if prune and 1 < len(terms) <= MAXSCORE_MAX_TERMS:
            # MaxScore: score the documents holding the terms with the highest bounds (the rare
            # ones) and look the others up in them only. A document holding none of those scores
            # at most the sum of the other terms' bounds; once the k-th best candidate beats that,
            # nothing was missed. A common term then costs a lookup per candidate, not per posting.
            order = sorted(range(len(terms)), key=lambda i: -terms[i].bound)
            for split in range(1, len(terms)):
                chosen = order[:split]
                rest = sum(terms[i].bound for i in order[split:]) * slack
                if sum(terms[i].entry.df for i in chosen) < k or rest >= sum(terms[i].bound for i in chosen) * slack:
                    # Too few candidates, or the left-out terms weigh as much as the chosen ones:
                    # the check below would most likely fail, so don't pay for the try.
                    continue
                essential = [False] * len(terms)
                for i in chosen:
                    essential[i] = True
                slots, totals = self._accumulate(view, terms, essential)
                scores = totals * _recency_array(view.created[slots], now) if recency else totals
                if len(scores) >= k and np.partition(scores, len(scores) - k)[len(scores) - k] > rest:
                    return slots, scores, True
        slots, totals = self._accumulate(view, terms, [True] * len(terms))
        pruned = False
        if prune and len(slots) > PRUNE_MIN_CANDIDATES * k:
            # Only documents whose BM25 times the largest recency factor reaches the k-th best BM25
            # can make the top k: no need to weigh the others.
            kth = np.partition(totals, len(totals) - k)[len(totals) - k]
            keep = totals * slack >= kth
            if not keep.all():
                pruned = True
                slots, totals = slots[keep], totals[keep]
        scores = totals * _recency_array(view.created[slots], now) if recency else totals
        return slots, scores, pruned

    def search(
        self,
        query: str,
        k: int = 6,
        *,
        min_score: float = 0.0,
        recency: bool = True,
        where: Optional[str] = None,
        params: Union[Sequence[Any], Mapping[str, Any]] = (),
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
        now_s = _now_seconds(now) if recency else 0.0
        where = where if where and where.strip() else None
        with self._reading("search"):
            view = self._sync()
            if view.n_live == 0:
                return []
            terms = self._query_terms(view, counts)
            if not terms:
                return []
            prune = where is None  # a filter may reject the best candidates: weigh everything
            while True:
                slots, scores, pruned = self._candidates(view, terms, k, recency, now_s, prune)
                keep = (scores > 0.0) & (scores >= min_score)
                if not keep.all():
                    slots, scores = slots[keep], scores[keep]
                results = self._select(view, slots, scores, k, where, params)
                if len(results) == k or not pruned:
                    return results
                # Some of the best documents had no chunks row: look further down.
                prune = False

    def _select(
        self,
        view: _View,
        slots: np.ndarray,
        scores: np.ndarray,
        k: int,
        where: Optional[str],
        params: Union[Sequence[Any], Mapping[str, Any]],
    ) -> list[tuple[int, float]]:
        """Walk the candidates by descending score, in growing batches, keeping those whose chunks
        row exists (and matches ``where``), until k are kept and no remaining candidate can tie."""
        accepted: list[tuple[float, str, int]] = []
        remaining = np.arange(len(slots))
        batch_size = k + 1  # usually enough: every candidate has its row and nothing ties at the cut
        checked = 0
        restricted = False
        while len(remaining):
            if len(remaining) > batch_size:
                part = np.argpartition(-scores[remaining], batch_size - 1)
                batch, remaining = remaining[part[:batch_size]], remaining[part[batch_size:]]
            else:
                batch, remaining = remaining, remaining[:0]
            batch = batch[np.argsort(-scores[batch], kind="stable")]
            ids = view.ids[slots[batch]]
            found = self._chunk_ids(ids.tolist(), where, params)
            for doc_id, score in zip(ids.tolist(), scores[batch].tolist()):
                chunk_id = found.get(doc_id)
                if chunk_id is not None:
                    accepted.append((score, chunk_id, doc_id))
            if len(found) < len(ids) and where is None:
                logger.warning(
                    "search: %d indexed documents have no chunks row in %s", len(ids) - len(found), self.path
                )
            checked += len(batch)
            if len(accepted) >= k:
                kth = sorted((a[0] for a in accepted), reverse=True)[k - 1]
                # Everything left scores at most the batch's lowest.
                if not len(remaining) or scores[batch[-1]] < kth:
                    break
            if where is not None and not restricted and min(checked, len(remaining)) >= FILTER_PROBE_DOCS:
                # A selective filter: cheaper to read the few rows it allows than to test the
                # candidates a batch at a time.
                allowed = self._allowed_ids(where, params)
                remaining = remaining[np.isin(view.ids[slots[remaining]], allowed)]
                restricted = True
            batch_size *= 8
        accepted.sort(key=lambda a: (-a[0], a[1]))
        return [(doc_id, score) for score, _, doc_id in accepted[:k]]

    def _chunk_ids(
        self, ids: list[int], where: Optional[str], params: Union[Sequence[Any], Mapping[str, Any]]
    ) -> dict[int, str]:
        sql = "SELECT id, chunk_id FROM chunks WHERE "
        if where:
            sql += f"({where}) AND "
        if isinstance(params, Mapping):
            sql += "id IN (SELECT value FROM json_each(:memstore_search_ids))"
            bound: Any = {**params, "memstore_search_ids": _json_ids(ids)}
        else:
            sql += "id IN (SELECT value FROM json_each(?))"
            bound = (*params, _json_ids(ids))
        return dict(self.conn.execute(sql, bound).fetchall())

    def _allowed_ids(self, where: str, params: Union[Sequence[Any], Mapping[str, Any]]) -> np.ndarray:
        cur = self.conn.execute(f"SELECT id FROM chunks WHERE ({where})", params)
        return np.fromiter((r[0] for r in cur), np.int64)


# --------------------------------------------------------------------------------------------
# search_memory: the public search over a store


@dataclass(frozen=True)
class MemorySearchResult:
    """One search hit. The reference's fields (``chunk_id``, ``path``, ``start_line``,
    ``end_line``, ``score``, ``snippet``, ``source``, ``created_at``) plus where it is:
    ``session_id``, ``turn`` and ``seq`` (``None`` for a memory fact).

    ``chunk_id`` is ``<session>:<seq>:<part>`` for an event's text and ``<directory>:<index>``
    for a memory fact (the session's directory name: the session id unless it is hashed); ``path`` is the file it comes from (``events.jsonl`` or ``memory.json``);
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


SNIPPET_CHARS = 240


def search_memory(
    root: Union[str, "os.PathLike[str]"],
    query: str,
    max_results: int = 6,
    min_score: float = 0.0,
    *,
    source: Optional[str] = None,
    session_id: Optional[str] = None,
    since: Optional[str] = None,
    recency: bool = True,
) -> list[MemorySearchResult]:
    """BM25 search over every session under ``root`` (see the module docstring for the
    scoring). The catalog is refreshed first, so the search sees every event flushed before it
    was called. ``source`` (``event`` or ``session``), ``session_id`` and ``since`` (a date or an
    RFC 3339 time: only chunks from then on) restrict the results, not the statistics.
    An empty or punctuation-only query gives ``[]``; no query is ever an error.
    """
    from .catalog import refresh_catalog
    from .layout import catalog_path
    from .session.index import readonly_uri

    if isinstance(max_results, bool) or not isinstance(max_results, int):
        raise TypeError(f"max_results must be an int, not {type(max_results).__name__}")
    if max_results <= 0 or not tokenize(query or ""):
        return []
    path = catalog_path(root)
    uri: Optional[str] = f"{Path(path).absolute().as_uri()}?mode=ro"
    try:
        refresh_catalog(root)
    except StoreIOError as exc:
        # A store that cannot be written (a read-only mount, another user's files) is searched
        # as its catalog last saw it: stale, but an answer.
        if exc.errno not in (errno.EROFS, errno.EACCES, errno.EPERM) or not Path(path).is_file():
            raise
        uri = readonly_uri(path)
        if uri is None:
            raise
        logger.warning("searching %s as it is, without refreshing it: %s", path, exc)
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
    conn = sqlite3.connect(uri, uri=True, isolation_level=None)
    try:
        # One read transaction: the rows read are those ranked, whatever a refresh does meanwhile
        # (a recopied session's chunk ids are free for other chunks).
        conn.execute("BEGIN")
        hits = SearchIndex(conn).search(query, max_results, min_score=min_score, recency=recency,
                                        where=" AND ".join(clauses) or None, params=params)
        rows = {row[0]: row for row in conn.execute(
            "SELECT id, chunk_id, path, start_line, end_line, source, created_at, session_id, turn, seq, kind, text "
            "FROM chunks WHERE id IN (SELECT value FROM json_each(?))", (_json_ids(doc for doc, _ in hits),))}
        conn.execute("COMMIT")
    except sqlite3.Error as exc:
        raise StoreIOError("search", path, str(exc)) from exc
    finally:
        conn.close()
    tokens = set(tokenize(query))
    results = []
    for doc, score in hits:
        row = rows.get(doc)
        if row is None:
            continue
        file_path = row[2] if row[2] and os.path.isabs(row[2]) else str(Path(root) / (row[2] or ""))
        results.append(MemorySearchResult(
            chunk_id=row[1], path=file_path, start_line=row[3] or 0, end_line=row[4] or 0, score=score,
            snippet=snippet(row[11], tokens), source=row[5], created_at=row[6], session_id=row[7],
            turn=row[8], seq=row[9], kind=row[10]))
    return results


def snippet(text: str, tokens: set[str], width: int = SNIPPET_CHARS) -> str:
    """A window of ``text`` around its first query token, whitespace-normalized."""
    best = None
    for match in _WORD.finditer(text):
        if match.group().lower() in tokens:
            best = match.start()
            break
    if best is None or len(text) <= width:
        start = 0
    else:
        start = max(0, best - width // 3)
    piece = " ".join(text[start:start + width].split())
    return ("…" if start > 0 else "") + piece + ("…" if start + width < len(text) else "")


def _since(value: str) -> str:
    """``since`` as a time comparable with chunk times: a date is its midnight UTC."""
    from .events import format_ts, parse_ts

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
