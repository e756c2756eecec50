"""Tiered merges of segments, so their number stays logarithmic in the corpus.

When ``MERGE_FACTOR`` segments share a size tier they are merged into one, and a segment with a
quarter of its documents removed is rewritten without them. A merge streams its inputs' postings
in term order, a page of blocks at a time, so its memory is bounded by the page, not the corpus.
Every function runs inside the caller's transaction.
"""

from __future__ import annotations

import logging
import sqlite3
import time
from bisect import bisect_right
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Optional

import numpy as np

from .segments import (
    TERM_SEPARATOR,
    UINT,
    Postings,
    SegmentDocs,
    SegmentInfo,
    delete_segment,
    doc_width,
    new_segment,
    segments,
    stable_order,
    tombstones,
    write_postings,
)

logger = logging.getLogger(__name__)

MERGE_FACTOR = 8
"""Segments of one size tier are merged once this many of them exist."""
TIER_BASE_DOCS = 1024
"""Tier 0 holds segments of up to this many live documents; each tier up is MERGE_FACTOR times larger."""
DELETED_REWRITE_FRACTION = 0.25
"""A segment with at least this fraction of its documents removed is rewritten without them."""
MERGE_PAGE_BLOCKS = 64
"""A merge reads each input this many blocks at a time (bounding its memory)."""

SegmentLoader = Callable[[SegmentInfo], SegmentDocs]


@dataclass
class BlockRun:
    """Consecutive postings blocks of one segment, decoded (a merge input)."""

    terms: list[str]
    counts: np.ndarray
    docs: np.ndarray  # local numbers, int64
    tfs: np.ndarray  # uint32

    @classmethod
    def empty(cls) -> BlockRun:
        return cls([], np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.uint32))

    @classmethod
    def decode(cls, rows: list[tuple[str, str, bytes, bytes, bytes]], seg: SegmentInfo) -> BlockRun:
        if not rows:
            return cls.empty()
        terms: list[str] = []
        for row in rows:
            terms.extend(row[1].split(TERM_SEPARATOR))
        counts = np.concatenate([np.diff(np.frombuffer(row[2], "<u4")) for row in rows]).astype(np.int64)
        docs = np.frombuffer(b"".join(row[3] for row in rows), UINT[seg.doc_width]).astype(np.int64)
        tfs = np.frombuffer(b"".join(row[4] for row in rows), UINT[seg.tf_width]).astype(np.uint32)
        return cls(terms, counts, docs, tfs)

    def split(self, bound: Optional[str]) -> tuple[BlockRun, BlockRun]:
        """(terms <= bound, the rest); everything when bound is None."""
        if bound is None:
            return self, BlockRun.empty()
        cut = bisect_right(self.terms, bound)
        at = int(self.counts[:cut].sum())
        return (
            BlockRun(self.terms[:cut], self.counts[:cut], self.docs[:at], self.tfs[:at]),
            BlockRun(self.terms[cut:], self.counts[cut:], self.docs[at:], self.tfs[at:]),
        )


def tier(live: int) -> int:
    """The size tier of a segment of ``live`` documents."""
    level, size = 0, TIER_BASE_DOCS
    while live > size:
        level += 1
        size *= MERGE_FACTOR
    return level


def plan_merge(segs: list[SegmentInfo], budget: Optional[int]) -> Optional[list[SegmentInfo]]:
    """The next merge to run, or None. ``budget`` caps the documents a merge may read."""

    def fits(group: list[SegmentInfo]) -> bool:
        return budget is None or sum(s.ndocs for s in group) <= budget

    for s in segs:
        if s.ndeleted and (s.live == 0 or s.ndeleted >= DELETED_REWRITE_FRACTION * s.ndocs) and fits([s]):
            return [s]
    tiers: dict[int, list[SegmentInfo]] = {}
    for s in segs:
        tiers.setdefault(tier(s.live), []).append(s)
    for level in sorted(tiers):
        group = tiers[level]
        if len(group) < MERGE_FACTOR:
            continue
        chosen: list[SegmentInfo] = []
        for s in sorted(group, key=lambda s: (s.live, s.id)):
            if not fits(chosen + [s]):
                break
            chosen.append(s)
        if len(chosen) >= MERGE_FACTOR:
            return chosen
    return None


def merge_tiers(conn: sqlite3.Connection, load: SegmentLoader, budget: Optional[int]) -> None:
    """Run merges until none is due (only those within ``budget`` documents; None: all)."""
    while True:
        plan = plan_merge(segments(conn), budget)
        if plan is None:
            return
        merge(conn, load, plan)


def merge(conn: sqlite3.Connection, load: SegmentLoader, inputs: list[SegmentInfo]) -> None:
    """Replace ``inputs`` by one segment of their live documents (none if all are removed)."""
    inputs = sorted(inputs, key=lambda s: s.id)
    started = time.perf_counter()
    remaps: list[np.ndarray] = []
    parts: list[SegmentDocs] = []
    offset = 0
    for seg in inputs:
        docs = load(seg)
        alive = np.ones(seg.ndocs, np.bool_)
        alive[tombstones(conn, seg.id)] = False
        live = int(alive.sum())
        remap = np.full(seg.ndocs, -1, np.int64)
        remap[alive] = np.arange(offset, offset + live)
        offset += live
        remaps.append(remap)
        parts.append(SegmentDocs(docs.ids[alive], docs.lens[alive], docs.created[alive]))

    new_seg = None
    if offset:
        merged = SegmentDocs(
            ids=np.concatenate([p.ids for p in parts]),
            lens=np.concatenate([p.lens for p in parts]),
            created=np.concatenate([p.created for p in parts]),
        )
        width_of_doc = doc_width(offset)
        width_of_tf = max(s.tf_width for s in inputs)
        new_seg = new_segment(conn, merged, width_of_tf)
        for chunk in merged_postings(conn, inputs, remaps, MERGE_PAGE_BLOCKS):
            write_postings(conn, new_seg, width_of_doc, width_of_tf, chunk)

    for seg in inputs:
        delete_segment(conn, seg.id)
    logger.debug(
        "search: merged segments %s (%d live documents) into %s in %.3fs",
        [s.id for s in inputs],
        offset,
        new_seg,
        time.perf_counter() - started,
    )


def merged_postings(
    conn: sqlite3.Connection, inputs: list[SegmentInfo], remaps: list[np.ndarray], page_blocks: int
) -> Iterator[Postings]:
    """The inputs' postings in the merged segment's numbering, term range by term range.

    Each input is read in term order, ``page_blocks`` blocks at a time (keyset pagination, so
    no cursor is open while blocks are written); a chunk covers the terms up to the smallest
    last term among the inputs that have more to read, so every term is complete in exactly
    one chunk.
    """
    pending = [BlockRun.empty() for _ in inputs]
    after = ["" for _ in inputs]  # every term is non-empty, so "" precedes all
    exhausted = [False for _ in inputs]
    while True:
        for i, seg in enumerate(inputs):
            if not pending[i].terms and not exhausted[i]:
                page = conn.execute(
                    "SELECT first_term, terms, offsets, docs, tfs FROM search_postings"
                    " WHERE segment = ? AND first_term > ? ORDER BY first_term LIMIT ?",
                    (seg.id, after[i], page_blocks),
                ).fetchall()
                exhausted[i] = len(page) < page_blocks
                if page:
                    after[i] = page[-1][0]
                pending[i] = BlockRun.decode(page, seg)
        if not any(run.terms for run in pending):
            return
        open_ends = [run.terms[-1] for run, done in zip(pending, exhausted) if run.terms and not done]
        bound = min(open_ends) if open_ends else None
        taken = []
        for i, run in enumerate(pending):
            head, pending[i] = run.split(bound)
            taken.append(head)
        yield combine(remaps, taken)


def combine(remaps: list[np.ndarray], runs: list[BlockRun]) -> Postings:
    """Postings of several inputs' runs over the same terms, in the merged numbering."""
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
    order = stable_order(all_ranks, len(union))
    counts = np.bincount(all_ranks, minlength=len(union))
    present = np.flatnonzero(counts)
    return Postings(
        terms=[union[r] for r in present.tolist()],
        counts=counts[present],
        docs=all_docs[order],
        tfs=all_tfs[order],
    )
