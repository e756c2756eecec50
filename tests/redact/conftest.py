"""The secret corpus (tests/fixtures/secrets/, written by its make_corpus.py) as fixtures."""

from __future__ import annotations

import pytest
from redact_support import CORPUS, NEAR_MISSES


@pytest.fixture(params=CORPUS, ids=[e["id"] for e in CORPUS])
def corpus_entry(request) -> dict:
    return request.param


@pytest.fixture(params=NEAR_MISSES, ids=[e["id"] for e in NEAR_MISSES])
def near_miss(request) -> dict:
    return request.param
