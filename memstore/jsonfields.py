"""Validated readers of JSON object fields, for the wire formats memstore parses strictly (the
progress ledger, goal orchestrations): a wrong type or a missing required key raises
:class:`InvalidProgress` naming the key."""

from __future__ import annotations

import copy
from typing import Any

from .errors import InvalidProgress

_MISSING = object()


def req(data: dict, key: str, kind: type, default: Any = _MISSING, nullable: bool = False) -> Any:
    value = data.get(key, _MISSING)
    if value is _MISSING:
        if default is _MISSING:
            raise InvalidProgress(f"missing key {key!r}")
        return copy.copy(default)
    if value is None and nullable:
        return None
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise InvalidProgress(f"key {key!r} must be {kind.__name__}{' or null' if nullable else ''}")
    return value


def int_field(data: dict, key: str, lo: int, hi: int, default: Any = _MISSING, nullable: bool = False) -> Any:
    value = req(data, key, int, default, nullable)
    if value is not None and not lo <= value <= hi:
        raise InvalidProgress(f"key {key!r} is out of range [{lo}, {hi}]")
    return value


def str_list(data: dict, key: str) -> list:
    value = req(data, key, list, [], nullable=True)
    if value is None:
        return []
    if not all(isinstance(item, str) for item in value):
        raise InvalidProgress(f"key {key!r} must be a list of strings")
    return list(value)
