"""memstore's BM25 engine: ranking of a database's ``chunks`` table, in tables of its own.

- :mod:`.tokens`: the tokenizer (lowercased runs of Unicode letters and digits);
- :mod:`.recency`: the mild preference for recent documents;
- :mod:`.segments`: the storage (immutable segments of block-compressed postings);
- :mod:`.merge`: tiered merges of segments;
- :mod:`.query`: scoring (numpy, MaxScore) and what queries keep between calls (:class:`IndexCache`);
- :mod:`.index`: :class:`SearchIndex`, the engine's interface.

It knows nothing of sessions or stores: :mod:`memstore.search` is the store-level search.
"""

from .index import SearchIndex, database_path
from .query import K1, B, IndexCache
from .recency import RECENCY_HALF_LIFE_DAYS, RECENCY_WEIGHT, recency_multiplier
from .tokens import tokenize

__all__ = [
    "B",
    "K1",
    "RECENCY_HALF_LIFE_DAYS",
    "RECENCY_WEIGHT",
    "IndexCache",
    "SearchIndex",
    "database_path",
    "recency_multiplier",
    "tokenize",
]
