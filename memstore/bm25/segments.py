"""The index's storage: immutable segments of postings in SQLite tables (prefix ``search_``).

A refresh writes chunk rows and their postings in one transaction, so a reader never sees one
without the other. Postings live in immutable *segments*, like an LSM tree, because a row per
(term, document) is too slow to write:

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

Every function here takes the connection and runs inside the caller's transaction; none commits.
"""

from __future__ import annotations

import itertools
import random
import sqlite3
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Optional, Union

import numpy as np

from .recency import epoch_seconds
from .tokens import token_keys

FORMAT = 1
"""Version of the ``search_`` tables' layout, recorded in ``search_meta``."""

SCHEMA = (
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
TABLES = ("search_segments", "search_segment_docs", "search_postings", "search_docs", "search_deleted")

UINT = {1: "<u1", 2: "<u2", 4: "<u4"}

BLOCK_TERMS = 64
"""A postings block holds at most this many terms ..."""
BLOCK_POSTINGS = 4096
"""... and about this many postings; a term with more than BLOCK_ALONE postings has a block of its own."""
BLOCK_ALONE = 1024

TERM_SEPARATOR = "\n"  # never inside a token (tokens are alphanumeric runs, lowercased)


def stable_order(keys: np.ndarray, bound: int) -> np.ndarray:
    """``np.argsort(keys, kind="stable")`` for non-negative integer keys below ``bound``, done as
    16-bit radix passes (NumPy radix-sorts 16-bit keys in linear time; wider keys get timsort,
    several times slower here)."""
    if bound <= 1 << 16:
        return np.argsort(keys.astype(np.uint16), kind="stable")
    if bound <= 1 << 32:
        order = np.argsort((keys & 0xFFFF).astype(np.uint16), kind="stable")
        return order[np.argsort((keys[order] >> 16).astype(np.uint16), kind="stable")]
    return np.argsort(keys, kind="stable")


def doc_width(ndocs: int) -> int:
    return 2 if ndocs <= 1 << 16 else 4


def tf_width(max_tf: int) -> int:
    return 1 if max_tf < 1 << 8 else (2 if max_tf < 1 << 16 else 4)


def new_nonce() -> int:
    return random.getrandbits(62) + 1


def json_ids(ids: Iterable[int]) -> str:
    """Integer ids as a JSON array, for ``json_each`` (one bound parameter for any number)."""
    return "[" + ",".join(map(str, ids)) + "]"


@dataclass(frozen=True)
class SegmentInfo:
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


SEGMENT_COLUMNS = "id, nonce, ndocs, total_len, ndeleted, deleted_len, tomb_nonce, doc_width, tf_width"


@dataclass
class SegmentDocs:
    """A segment's document arrays, indexed by local number (immutable once written)."""

    ids: np.ndarray  # int64 catalog ids
    lens: np.ndarray  # float64 token counts
    created: np.ndarray  # float64 Unix seconds, NaN = NULL


@dataclass
class Postings:
    """Postings of a run of terms, in the numbering of the segment being written."""

    terms: Union[list[str], list[bytes]]  # sorted, distinct; bytes are UTF-8 (decoded per block)
    counts: np.ndarray  # postings per term, > 0
    docs: np.ndarray  # local numbers, grouped by term, ascending within a term
    tfs: np.ndarray


# ----------------------------------------------------------------------------------------------
# Reads


def segment_rows(conn: sqlite3.Connection) -> list[tuple]:
    """The rows of ``search_segments`` in id order (what caches compare to see a change)."""
    return conn.execute(f"SELECT {SEGMENT_COLUMNS} FROM search_segments ORDER BY id").fetchall()


def segments(conn: sqlite3.Connection) -> list[SegmentInfo]:
    return [SegmentInfo(*r) for r in segment_rows(conn)]


def read_segment_docs(conn: sqlite3.Connection, seg: SegmentInfo) -> SegmentDocs:
    """A segment's document arrays, read from the database (checked against its row)."""
    row = conn.execute("SELECT ids, lens, created FROM search_segment_docs WHERE segment = ?", (seg.id,)).fetchone()
    if row is None:
        raise sqlite3.DatabaseError(f"search index: segment {seg.id} has no document arrays")
    docs = SegmentDocs(
        ids=np.frombuffer(row[0], "<i8").astype(np.int64),
        lens=np.frombuffer(row[1], "<u4").astype(np.float64),
        created=np.frombuffer(row[2], "<f8").astype(np.float64),
    )
    if len(docs.ids) != seg.ndocs or len(docs.lens) != seg.ndocs or len(docs.created) != seg.ndocs:
        raise sqlite3.DatabaseError(f"search index: segment {seg.id} document arrays do not match its count")
    return docs


def tombstones(conn: sqlite3.Connection, seg: int) -> np.ndarray:
    """The local numbers of a segment's removed documents."""
    cur = conn.execute("SELECT local FROM search_deleted WHERE segment = ?", (seg,))
    return np.fromiter((r[0] for r in cur), np.int64)


def max_id(conn: sqlite3.Connection) -> int:
    row = conn.execute("SELECT max(id) FROM search_docs").fetchone()
    return -(1 << 63) if row[0] is None else row[0]


def present(conn: sqlite3.Connection, ids: Iterable[int]) -> list[int]:
    """Which of ``ids`` are indexed."""
    cur = conn.execute("SELECT id FROM search_docs WHERE id IN (SELECT value FROM json_each(?))", (json_ids(ids),))
    return [r[0] for r in cur]


# ----------------------------------------------------------------------------------------------
# Writes


def remove_docs(conn: sqlite3.Connection, ids: Sequence[int]) -> None:
    """Tombstone the documents ``ids`` (those not indexed are ignored) and count them in their
    segments' rows, with a new ``tomb_nonce`` so caches see the change."""
    found: list[tuple[int, int, int, int]] = []
    for start in range(0, len(ids), 32768):
        part = json_ids(ids[start : start + 32768])
        found += conn.execute(
            "SELECT id, segment, local, len FROM search_docs WHERE id IN (SELECT value FROM json_each(?))",
            (part,),
        ).fetchall()
        conn.execute("DELETE FROM search_docs WHERE id IN (SELECT value FROM json_each(?))", (part,))
    if not found:
        return
    conn.executemany(
        "INSERT INTO search_deleted (segment, local) VALUES (?, ?)", ((seg, local) for _, seg, local, _ in found)
    )
    per_segment: dict[int, list[int]] = {}
    for _, seg, _, length in found:
        count_len = per_segment.setdefault(seg, [0, 0])
        count_len[0] += 1
        count_len[1] += length
    conn.executemany(
        "UPDATE search_segments SET ndeleted = ndeleted + ?, deleted_len = deleted_len + ?, tomb_nonce = ?"
        " WHERE id = ?",
        ((n, length, new_nonce(), seg) for seg, (n, length) in per_segment.items()),
    )


def analyze(batch: dict[int, tuple[Optional[str], Any]]) -> tuple[SegmentDocs, Postings]:
    """Tokenize a batch ``{id: (text, created_at)}`` into a segment's documents and postings."""
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
        tokens = token_keys(text)
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
            when = seen_times[created_at] = epoch_seconds(created_at)
        created[j] = when
    docs = SegmentDocs(
        ids=np.fromiter(batch.keys(), np.int64, n), lens=np.fromiter(lens, np.float64, n), created=created
    )
    keys = sorted(vocab)  # bytewise order of UTF-8 = code point order = SQLite's BINARY order
    rank_of_id = np.empty(len(keys), np.int64)
    rank_of_id[np.fromiter(map(term_id, keys), np.int64, len(keys))] = np.arange(len(keys))
    rank = rank_of_id[np.fromiter(tids, np.int64, len(tids))]
    # Pairs were produced document by document, so a stable sort by term keeps each term's
    # documents ascending.
    order = stable_order(rank, len(keys))
    local = np.repeat(np.arange(n, dtype=np.int64), np.fromiter(uniques, np.int64, n))
    return docs, Postings(
        terms=keys,
        counts=np.bincount(rank, minlength=len(keys)),
        docs=local[order],
        tfs=np.fromiter(tfs, np.uint32, len(tfs))[order],
    )


def new_segment(conn: sqlite3.Connection, docs: SegmentDocs, width_of_tf: int) -> int:
    """Write a segment's row, its document arrays and its documents' ``search_docs`` rows;
    return its id (its postings are written after, by :func:`write_postings`)."""
    ndocs = len(docs.ids)
    cur = conn.execute(
        "INSERT INTO search_segments (nonce, ndocs, total_len, doc_width, tf_width) VALUES (?, ?, ?, ?, ?)",
        (new_nonce(), ndocs, int(docs.lens.sum()), doc_width(ndocs), width_of_tf),
    )
    seg = cur.lastrowid
    assert seg is not None
    conn.execute(
        "INSERT INTO search_segment_docs (segment, ids, lens, created) VALUES (?, ?, ?, ?)",
        (
            seg,
            docs.ids.astype("<i8").tobytes(),
            docs.lens.astype("<u4").tobytes(),
            docs.created.astype("<f8").tobytes(),
        ),
    )
    conn.executemany(
        "INSERT OR REPLACE INTO search_docs (id, segment, local, len) VALUES (?, ?, ?, ?)",
        zip(docs.ids.tolist(), itertools.repeat(seg), range(ndocs), docs.lens.astype(np.int64).tolist()),
    )
    return seg


def write_postings(conn: sqlite3.Connection, seg: int, width_of_doc: int, width_of_tf: int, postings: Postings) -> None:
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
    doc_bytes = postings.docs.astype(UINT[width_of_doc]).tobytes()
    tf_bytes = postings.tfs.astype(UINT[width_of_tf]).tobytes()
    offsets = np.concatenate(([0], ends)).astype(np.int64)
    terms = postings.terms
    if terms and isinstance(terms[0], bytes):
        byte_terms: list[bytes] = terms

        # Decoding a block's joined terms once is cheaper than decoding every term.
        def joined(a: int, b: int) -> str:
            return b"\n".join(byte_terms[a:b]).decode("utf-8")
    else:
        text_terms: list[str] = terms  # type: ignore[assignment]

        def joined(a: int, b: int) -> str:
            return TERM_SEPARATOR.join(text_terms[a:b])

    def rows() -> Iterator[tuple[int, str, str, str, bytes, bytes, bytes]]:
        for a, b in zip(bounds, bounds[1:]):
            lo, hi = int(offsets[a]), int(offsets[b])
            block = joined(a, b)
            first, _, _ = block.partition(TERM_SEPARATOR)
            yield (
                seg,
                first,
                block[block.rfind(TERM_SEPARATOR) + 1 :],
                block,
                (offsets[a : b + 1] - lo).astype("<u4").tobytes(),
                doc_bytes[lo * width_of_doc : hi * width_of_doc],
                tf_bytes[lo * width_of_tf : hi * width_of_tf],
            )

    conn.executemany(
        "INSERT INTO search_postings (segment, first_term, last_term, terms, offsets, docs, tfs)"
        " VALUES (?, ?, ?, ?, ?, ?, ?)",
        rows(),
    )


def write_segment(conn: sqlite3.Connection, analyzed: tuple[SegmentDocs, Postings]) -> None:
    """Write an analyzed batch as a new segment."""
    docs, postings = analyzed
    width_of_tf = tf_width(int(postings.tfs.max()) if len(postings.tfs) else 0)
    seg = new_segment(conn, docs, width_of_tf)
    write_postings(conn, seg, doc_width(len(docs.ids)), width_of_tf, postings)


def delete_segment(conn: sqlite3.Connection, seg: int) -> None:
    """Remove a segment with its postings, arrays and tombstones."""
    conn.execute("DELETE FROM search_postings WHERE segment = ?", (seg,))
    conn.execute("DELETE FROM search_deleted WHERE segment = ?", (seg,))
    conn.execute("DELETE FROM search_segment_docs WHERE segment = ?", (seg,))
    conn.execute("DELETE FROM search_segments WHERE id = ?", (seg,))
