"""The secret corpus and its near misses, and the strings of a JSON value."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

CORPUS_DIR = Path(__file__).resolve().parent.parent / "fixtures" / "secrets"


def _load(name: str) -> list[dict]:
    with open(CORPUS_DIR / name, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


CORPUS = _load("corpus.jsonl")
NEAR_MISSES = _load("near_misses.jsonl")


def strings_in(value: Any) -> list[str]:
    """Every string in a JSON value (dict keys included: a secret must not hide there either)."""
    found, stack = [], [value]
    while stack:
        value = stack.pop()
        if isinstance(value, str):
            found.append(value)
        elif isinstance(value, dict):
            found.extend(k for k in value if isinstance(k, str))
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
    return found
