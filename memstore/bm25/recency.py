"""The recency preference: a mild multiplier on a document's BM25 score by its age.

``1 + RECENCY_WEIGHT * 0.5 ** (age_days / RECENCY_HALF_LIFE_DAYS)``, so in [1.0, 1.1]: 1.0 when
the document has no time, and a time in the future counts as age 0.
"""

from __future__ import annotations

import logging
import math
import sys
import time
from datetime import UTC, datetime
from typing import Any, Union

import numpy as np

__all__ = [
    "RECENCY_WEIGHT",
    "RECENCY_HALF_LIFE_DAYS",
    "recency_multiplier",
    "epoch_seconds",
    "now_seconds",
    "recency_array",
]

logger = logging.getLogger(__name__)

RECENCY_WEIGHT = 0.1
"""The multiplier for a brand-new document is ``1 + RECENCY_WEIGHT``."""
RECENCY_HALF_LIFE_DAYS = 30.0
"""The recency bonus halves every this many days of age."""

_FROMISO_READS_Z = sys.version_info >= (3, 11)


def epoch_seconds(value: Any) -> float:
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
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


def now_seconds(now: Union[None, float, int, str, datetime]) -> float:
    """``now`` as Unix seconds (the current time when None); ValueError for what is no time."""
    if now is None:
        return time.time()
    if isinstance(now, datetime):
        if now.tzinfo is None:
            now = now.replace(tzinfo=UTC)
        return now.timestamp()
    seconds = epoch_seconds(now)
    if math.isnan(seconds):
        raise ValueError(f"now: not a time: {now!r}")
    return seconds


def recency_multiplier(created_at: Union[None, str, float], now: Union[None, float, str, datetime] = None) -> float:
    """The recency factor applied to a document's BM25 score:
    ``1 + RECENCY_WEIGHT * 0.5 ** (age_days / RECENCY_HALF_LIFE_DAYS)``, in [1.0, 1.1].

    ``created_at`` is RFC 3339 text or Unix seconds; NULL or unreadable gives 1.0, a time in the
    future counts as age 0. ``now`` defaults to the current time.
    """
    created = epoch_seconds(created_at)
    if math.isnan(created):
        return 1.0
    age_days = max(0.0, (now_seconds(now) - created) / 86400.0)
    return 1.0 + RECENCY_WEIGHT * 0.5 ** (age_days / RECENCY_HALF_LIFE_DAYS)


def recency_array(created: np.ndarray, now: float) -> np.ndarray:
    """:func:`recency_multiplier` of every element of ``created`` (Unix seconds, NaN = no time)."""
    age_days = np.maximum((now - created) / 86400.0, 0.0)
    factor = 1.0 + RECENCY_WEIGHT * np.exp2(-age_days / RECENCY_HALF_LIFE_DAYS)
    factor[np.isnan(created)] = 1.0
    return factor
