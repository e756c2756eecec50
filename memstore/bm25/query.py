"""Queries: BM25 over the segments, with what a process keeps between queries.

Scoring is the reference's BM25 (``reference/vtcode-memory.md`` §5.5): per query token (a repeated
query token counts again), with k1 = 1.2 and b = 0.75,
``idf = ln(1 + (N - df + 0.5) / (df + 0.5))`` and
``score += idf * tf * (k1 + 1) / (tf + k1 * (1 - b + b * len / max(avgdl, 1)))``; N, df and avgdl
are over every live document of the index. A ``where`` filter only restricts which documents come
back, never the statistics, so scores stay comparable.

A query loads what it needs lazily and keeps it in an :class:`IndexCache`: the segments' document
arrays side by side in one "slot" space (a :class:`View`), and per query term its postings
translated to slots. The cache is checked against ``search_segments`` on every query (one small
read), so a change made by another connection or process is picked up at the next query. Scoring
is vectorized numpy; for a query of several terms without a ``where`` filter, MaxScore skips most
of a common term's postings: the documents holding the rarest terms are scored in full and the
common terms are looked up in them only, which is exact as soon as the k-th best of those beats
what the common terms alone could give any other document (else more terms are scored in full,
up to all of them).
"""

from __future__ import annotations

import logging
import math
import sqlite3
import struct
import threading
from bisect import bisect_left
from collections import Counter, OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Optional, Union

import numpy as np

from .recency import RECENCY_WEIGHT, recency_array
from .segments import (
    TERM_SEPARATOR,
    UINT,
    SegmentDocs,
    SegmentInfo,
    json_ids,
    read_segment_docs,
    segment_rows,
    tombstones,
)

logger = logging.getLogger(__name__)

K1 = 1.2
B = 0.75
FILTER_PROBE_DOCS = 8192
"""With a ``where`` filter, candidates are checked against ``chunks`` a batch at a time; after this
many, the filter's whole set of ids is read instead (it is then selective)."""
COUNT_PROBE_DOCS = 65536
"""Counting the matches of a filtered query checks up to this many matching documents against
``chunks`` by id; beyond, it reads the filter's set of ids instead."""
PRUNE_MIN_CANDIDATES = 64
"""Without a filter, more than this many candidates per result are first cut to those that can
still reach the top k."""
MAXSCORE_MAX_TERMS = 16
"""Queries with more distinct terms than this are scored in full (MaxScore's tries cost more)."""

Params = Union[Sequence[Any], Mapping[str, Any]]


@dataclass
class TermEntry:
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
        return int(self.slots.nbytes + self.tfs.nbytes)


@dataclass
class QueryTerm:
    entry: TermEntry
    weight: float  # repeat * idf * (k1 + 1)
    bound: float  # no document scores more than this for the term


class View:
    """What a query needs, in one "slot" space: the live segments' documents side by side."""

    def __init__(self) -> None:
        self.layout: tuple[tuple[int, int], ...] = ()
        self.rows: Optional[list[tuple]] = None  # the search_segments rows it reflects
        self.segments: dict[int, SegmentInfo] = {}
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
        self.terms: OrderedDict[str, TermEntry] = OrderedDict()
        self.term_bytes = 0


class IndexCache:
    """What queries keep between calls for one database: its view (the segments' documents side
    by side and the postings of recent terms, at most about ``cache_bytes`` of them) and the
    segments' document arrays, keyed by ``(segment, nonce)``.

    It holds nothing a query trusts without checking: every query compares it with the
    database's ``search_segments`` rows first and reloads what changed, so one cache may serve
    any connection to the same database, in any thread, while other connections and processes
    write it. ``lock`` serializes the queries that share it (they use its scratch arrays).
    ``segment_loads`` counts the segments whose arrays were read from the database, the cost a
    kept cache saves.
    """

    def __init__(self, cache_bytes: int = 256 << 20) -> None:
        self.cache_bytes = int(cache_bytes)
        self.lock = threading.RLock()
        self.view = View()
        self.segment_docs: dict[tuple[int, int], SegmentDocs] = {}
        self.segment_loads = 0


def load_segment_docs(conn: sqlite3.Connection, cache: IndexCache, seg: SegmentInfo) -> SegmentDocs:
    """A segment's document arrays, from the cache or the database (counted in
    ``cache.segment_loads``)."""
    cached = cache.segment_docs.get((seg.id, seg.nonce))
    if cached is not None:
        return cached
    cache.segment_loads += 1
    return read_segment_docs(conn, seg)


def sync(conn: sqlite3.Connection, cache: IndexCache) -> View:
    """Bring the cached view up to date with ``search_segments`` (inside a read transaction)."""
    rows = segment_rows(conn)
    view = cache.view
    if rows == view.rows:
        return view  # nothing changed (the usual case): skip the bookkeeping below
    segs = [SegmentInfo(*r) for r in rows]
    layout = tuple((s.id, s.nonce) for s in segs)
    if layout != view.layout:
        view = View()
        view.layout = layout
        docs = []
        offset = 0
        for s in segs:
            docs.append(load_segment_docs(conn, cache, s))
            view.offsets[s.id] = offset
            offset += s.ndocs
        if docs:
            view.ids = np.concatenate([d.ids for d in docs])
            view.lens = np.concatenate([d.lens for d in docs])
            view.created = np.concatenate([d.created for d in docs])
        # Keep each segment's arrays as views into the new ones: no second copy, and the next
        # layout (one segment more, or a merge) reuses them instead of reading them again.
        cache.segment_docs = {}
        for key, s in zip(layout, segs):
            at = view.offsets[s.id]
            cache.segment_docs[key] = SegmentDocs(
                view.ids[at : at + s.ndocs], view.lens[at : at + s.ndocs], view.created[at : at + s.ndocs]
            )
        view.alive = np.ones(offset, np.bool_)
        view.scratch = np.zeros(offset, np.float64)
        view.mark = np.zeros(offset, np.bool_)
        cache.view = view
    for s in segs:
        old = view.segments.get(s.id)
        if old is None or old.tomb_nonce != s.tomb_nonce:
            start = view.offsets[s.id]
            view.alive[start : start + s.ndocs] = True
            if s.ndeleted:
                view.alive[start + tombstones(conn, s.id)] = False
            view.alive_version += 1
        view.segments[s.id] = s
    view.n_live = sum(s.live for s in segs)
    total = sum(s.total_len - s.deleted_len for s in segs)
    view.avgdl = max(total / view.n_live, 1.0) if view.n_live else 1.0
    view.rows = rows
    return view


def term_entry(conn: sqlite3.Connection, cache: IndexCache, view: View, term: str) -> Optional[TermEntry]:
    """A term's postings over the view's slots, from the cache or the database."""
    entry = view.terms.get(term)
    if entry is not None:
        view.terms.move_to_end(term)
        return entry
    slots, tfs = [], []
    # Per segment, the one block whose range can hold the term. CROSS JOIN keeps SQLite from
    # scanning the postings table instead of seeking it per segment.
    for seg, block_terms, offsets, docs, freqs in conn.execute(
        "SELECT p.segment, p.terms, p.offsets, p.docs, p.tfs"
        " FROM search_segments AS s CROSS JOIN search_postings AS p"
        " ON p.segment = s.id AND p.first_term = ("
        "   SELECT max(first_term) FROM search_postings WHERE segment = s.id AND first_term <= ?1)"
        " WHERE p.last_term >= ?1",
        (term,),
    ):
        names = block_terms.split(TERM_SEPARATOR)
        i = bisect_left(names, term)
        if i == len(names) or names[i] != term:
            continue
        lo, hi = struct.unpack_from("<II", offsets, 4 * i)
        info = view.segments[seg]
        local = np.frombuffer(docs, UINT[info.doc_width], hi - lo, lo * info.doc_width)
        slots.append(local.astype(np.int32) + np.int32(view.offsets[seg]))
        tfs.append(np.frombuffer(freqs, UINT[info.tf_width], hi - lo, lo * info.tf_width))
    if not slots:
        return None
    all_tfs = np.concatenate(tfs).astype(np.float32)  # exact: no chunk holds 2**24 tokens
    entry = TermEntry(np.concatenate(slots), all_tfs, float(all_tfs.max()))
    view.terms[term] = entry
    view.term_bytes += entry.nbytes
    while view.term_bytes > cache.cache_bytes and len(view.terms) > 1:
        _, old = view.terms.popitem(last=False)
        view.term_bytes -= old.nbytes
    return entry


def weigh_terms(conn: sqlite3.Connection, cache: IndexCache, view: View, counts: Counter) -> list[QueryTerm]:
    """The query's terms present in the index (query order), with idf and score bounds."""
    out = []
    for term, repeat in counts.items():
        entry = term_entry(conn, cache, view, term)
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
        out.append(QueryTerm(entry, weight, bound))
    return out


def weights(view: View, qt: QueryTerm, slots: np.ndarray, tfs: np.ndarray) -> np.ndarray:
    """The term's BM25 score in the documents at ``slots`` (with those tfs)."""
    tf = tfs.astype(np.float64)
    return tf * qt.weight / (tf + (K1 * (1.0 - B) + (K1 * B / view.avgdl) * view.lens[slots]))


def union(view: View, terms: list[QueryTerm], essential: list[bool]) -> np.ndarray:
    """The distinct slots holding an essential term (in no particular order)."""
    mark = view.mark
    parts = []
    try:
        for qt, needed in zip(terms, essential):
            if needed:
                slots = qt.entry.live_slots
                parts.append(slots[~mark[slots]])
                mark[slots] = True
        return np.concatenate(parts) if parts else np.zeros(0, np.int32)
    finally:
        for part in parts:
            mark[part] = False


def accumulate(view: View, terms: list[QueryTerm], essential: list[bool]) -> tuple[np.ndarray, np.ndarray]:
    """BM25 of the documents holding an essential term: (slots, scores), slots distinct.

    Each document's score is summed over the query's terms in query order, whichever way a
    term is looked up, so the same document gets the same bits on every path (ties stay ties).
    """
    if len(terms) == 1:
        qt = terms[0]
        return qt.entry.live_slots, weights(view, qt, qt.entry.live_slots, qt.entry.live_tfs)
    if sum(essential) == 1:
        return accumulate_one(view, terms, essential.index(True))
    candidates = union(view, terms, essential)
    mark = view.mark
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
            acc[slots] += weights(view, qt, slots, tfs)  # slots are distinct within a term
        totals = acc[candidates]
    finally:
        acc[candidates] = 0.0
    return candidates, totals


def accumulate_one(view: View, terms: list[QueryTerm], chosen: int) -> tuple[np.ndarray, np.ndarray]:
    """:func:`accumulate` with one essential term: its postings are the candidates, so the
    sums live in an array aligned with them (same additions in the same order, so the same
    bits), and the other terms are found by binary search."""
    candidates = terms[chosen].entry.live_slots
    totals = np.zeros(len(candidates), np.float64)
    for i, qt in enumerate(terms):
        if i == chosen:
            totals += weights(view, qt, candidates, qt.entry.live_tfs)
            continue
        slots, tfs = qt.entry.live_slots, qt.entry.live_tfs
        at = np.searchsorted(slots, candidates)
        found = at < len(slots)
        found[found] = slots[at[found]] == candidates[found]
        totals[found] += weights(view, qt, candidates[found], tfs[at[found]])
    return candidates, totals


def candidates(
    view: View, terms: list[QueryTerm], k: int, recency: bool, now: float, prune: bool
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
            slots, totals = accumulate(view, terms, essential)
            scores = totals * recency_array(view.created[slots], now) if recency else totals
            if len(scores) >= k and np.partition(scores, len(scores) - k)[len(scores) - k] > rest:
                return slots, scores, True
    slots, totals = accumulate(view, terms, [True] * len(terms))
    pruned = False
    if prune and len(slots) > PRUNE_MIN_CANDIDATES * k:
        # Only documents whose BM25 times the largest recency factor reaches the k-th best BM25
        # can make the top k: no need to weigh the others.
        kth = np.partition(totals, len(totals) - k)[len(totals) - k]
        keep = totals * slack >= kth
        if not keep.all():
            pruned = True
            slots, totals = slots[keep], totals[keep]
    scores = totals * recency_array(view.created[slots], now) if recency else totals
    return slots, scores, pruned


def matching_slots(view: View, terms: list[QueryTerm], recency: bool, now: float, min_score: float) -> np.ndarray:
    """Every document a query without ``k`` would return: score > 0 and >= ``min_score``."""
    essential = [True] * len(terms)
    if min_score <= 0.0:
        # Every document holding a query term scores above 0 (idf and tf are positive).
        return union(view, terms, essential)
    slots, totals = accumulate(view, terms, essential)
    scores = totals * recency_array(view.created[slots], now) if recency else totals
    return slots[(scores > 0.0) & (scores >= min_score)]


def _bound(where: Optional[str], params: Params, ids_json: str) -> tuple[str, Any]:
    """``SELECT ... FROM chunks WHERE`` clause for ``where`` and the ids of a JSON array."""
    sql = f"({where}) AND " if where else ""
    if isinstance(params, Mapping):
        return sql + "id IN (SELECT value FROM json_each(:memstore_search_ids))", {
            **params,
            "memstore_search_ids": ids_json,
        }
    return sql + "id IN (SELECT value FROM json_each(?))", (*params, ids_json)


def chunk_ids(conn: sqlite3.Connection, ids: list[int], where: Optional[str], params: Params) -> dict[int, str]:
    """``{id: chunk_id}`` of the ``ids`` whose chunks row exists and matches ``where``."""
    clause, bound = _bound(where, params, json_ids(ids))
    return dict(conn.execute("SELECT id, chunk_id FROM chunks WHERE " + clause, bound).fetchall())


def allowed_ids(conn: sqlite3.Connection, where: str, params: Params) -> np.ndarray:
    """Every id of ``chunks`` matching ``where``."""
    cur = conn.execute(f"SELECT id FROM chunks WHERE ({where})", params)
    return np.fromiter((r[0] for r in cur), np.int64)


def count_allowed(conn: sqlite3.Connection, ids: np.ndarray, where: str, params: Params) -> int:
    """How many of ``ids`` (distinct) have a chunks row matching ``where``."""
    if len(ids) <= COUNT_PROBE_DOCS:
        clause, bound = _bound(where, params, json_ids(ids.tolist()))
        return int(conn.execute("SELECT count(*) FROM chunks WHERE " + clause, bound).fetchone()[0])
    return int(np.count_nonzero(np.isin(ids, allowed_ids(conn, where, params))))


def select(
    conn: sqlite3.Connection,
    view: View,
    slots: np.ndarray,
    scores: np.ndarray,
    k: int,
    where: Optional[str],
    params: Params,
    path: str,
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
        found = chunk_ids(conn, ids.tolist(), where, params)
        for doc_id, score in zip(ids.tolist(), scores[batch].tolist()):
            chunk_id = found.get(doc_id)
            if chunk_id is not None:
                accepted.append((score, chunk_id, doc_id))
        if len(found) < len(ids) and where is None:
            logger.warning("search: %d indexed documents have no chunks row in %s", len(ids) - len(found), path)
        checked += len(batch)
        if len(accepted) >= k:
            kth = sorted((a[0] for a in accepted), reverse=True)[k - 1]
            # Everything left scores at most the batch's lowest.
            if not len(remaining) or scores[batch[-1]] < kth:
                break
        if where is not None and not restricted and min(checked, len(remaining)) >= FILTER_PROBE_DOCS:
            # A selective filter: cheaper to read the few rows it allows than to test the
            # candidates a batch at a time.
            allowed = allowed_ids(conn, where, params)
            remaining = remaining[np.isin(view.ids[slots[remaining]], allowed)]
            restricted = True
        batch_size *= 8
    accepted.sort(key=lambda a: (-a[0], a[1]))
    return [(doc_id, score) for score, _, doc_id in accepted[:k]]
