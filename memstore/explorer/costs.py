"""Dollars on the explorer's pages: what the store's turns cost, in total, per model and per day,
each figure saying where it comes from.

The catalog's turns are summed per (model, agent, day) in SQL and each sum is priced with
:func:`memstore.pricing.price_usage` at that day's prices (the agent is the provider hint), so a
page prices a few hundred groups, not every turn. A sum is what the tokens cost; pricing each
turn apart gives the same figure (turns are priced at base rates, linearly).

Every figure carries its provenance: ``estimated`` (tokens priced, with the ``price_version`` of
the table) or ``unpriced`` (the model is unknown or unrecorded: no dollar figure, never $0; the
turns and models left out are counted and named, so a total with any is a lower bound). Costs
an agent reported itself are not in the catalog yet: every figure here is an estimate.
"""

from __future__ import annotations

import logging
import sqlite3
from collections import defaultdict
from decimal import Decimal
from typing import Any, Optional

from ..errors import MemstoreError
from ..pricing import CostSource, price_data, price_usage

logger = logging.getLogger(__name__)

_GROUPS = (
    "SELECT coalesce(t.model, '') AS model, s.agent AS agent, substr(coalesce(t.started_at, t.ended_at), 1, 10) AS day, "
    "count(*) AS turns, CAST(total(t.input_tokens) AS INTEGER) AS input_tokens, "
    "CAST(total(t.cached_input_tokens) AS INTEGER) AS cached_input_tokens, "
    "CAST(total(t.cache_creation_tokens) AS INTEGER) AS cache_creation_tokens, "
    "CAST(total(t.output_tokens) AS INTEGER) AS output_tokens "
    "FROM turns t LEFT JOIN sessions s ON s.session_id = t.session_id {where} GROUP BY 1, 2, 3"
)
_TOKEN_KEYS = ("input_tokens", "cached_input_tokens", "cache_creation_tokens", "output_tokens")


def cost_overview(conn: sqlite3.Connection, *, session_id: Optional[str] = None) -> dict[str, Any]:
    """The cost of every turn of the catalog (or of one session's): ``total`` (``usd``, the
    turns priced and unpriced, the models left unpriced), ``by_model`` and ``by_day`` (the day
    each turn started), with the ``price_version`` and the ``source`` of the figures.
    ``available`` is False (and the figures absent) when no price table is installed."""
    try:
        version = price_data().price_version
    except MemstoreError as exc:
        logger.warning("explorer: no cost figures: %s", exc)
        return {"available": False, "reason": str(exc), "source": CostSource.UNPRICED.value}
    where, params = ("WHERE t.session_id = ?", (session_id,)) if session_id is not None else ("", ())
    cursor = conn.execute(_GROUPS.format(where=where), params)
    names = [d[0] for d in cursor.description]
    models: dict[str, dict[str, Any]] = {}
    days: dict[str, Decimal] = defaultdict(Decimal)
    total = Decimal(0)
    priced_turns = unpriced_turns = 0
    unpriced_models: set[str] = set()
    for raw in cursor.fetchall():
        group = dict(zip(names, raw))
        usage = tuple(max(0, int(group[k] or 0)) for k in _TOKEN_KEYS)
        model = group["model"] or None
        entry = models.setdefault(
            group["model"],
            {"model": group["model"], "turns": 0, "usd": None, "notes": set(), **{k: 0 for k in _TOKEN_KEYS}},
        )
        entry["turns"] += group["turns"]
        for key, value in zip(_TOKEN_KEYS, usage):
            entry[key] += value
        if not any(usage):
            continue  # turns that used nothing (open, or stopped at once) cost nothing to anyone
        try:
            cost = price_usage(model, usage, provider_hint=group["agent"], when=_day(group["day"]))  # type: ignore[arg-type]
        except MemstoreError as exc:
            logger.warning("explorer: tokens of %r left unpriced: %s", model, exc)
            cost = None
        if cost is None or cost.usd is None:
            unpriced_turns += group["turns"]
            unpriced_models.add(group["model"] or "(no model)")
            entry["unpriced_turns"] = entry.get("unpriced_turns", 0) + group["turns"]
            if cost is not None and cost.note:
                entry["notes"].add(cost.note)
            continue
        priced_turns += group["turns"]
        total += cost.usd
        entry["usd"] = (entry["usd"] or Decimal(0)) + cost.usd
        if group["day"]:
            days[group["day"]] += cost.usd
    by_model = []
    for entry in models.values():
        entry["notes"] = sorted(entry["notes"])
        unpriced = entry.get("unpriced_turns", 0)
        entry["unpriced_turns"] = unpriced
        entry["source"] = CostSource.UNPRICED.value if entry["usd"] is None else CostSource.ESTIMATED.value
        entry["complete"] = unpriced == 0
        entry["usd"] = None if entry["usd"] is None else float(entry["usd"])
        by_model.append(entry)
    by_model.sort(key=lambda e: (e["usd"] is None, -(e["usd"] or 0), e["model"]))
    return {
        "available": True,
        "source": CostSource.ESTIMATED.value if priced_turns else CostSource.UNPRICED.value,
        "price_version": version,
        "total": {
            "usd": float(total) if priced_turns else None,
            "priced_turns": priced_turns,
            "unpriced_turns": unpriced_turns,
            "unpriced_models": sorted(unpriced_models),
            "complete": unpriced_turns == 0,
        },
        "by_model": by_model,
        "by_day": {day: float(usd) for day, usd in sorted(days.items())},
    }


def _day(day: Any) -> Optional[str]:
    """The start of ``day`` as a time pricing takes (``None``: today's prices)."""
    return f"{day}T00:00:00Z" if isinstance(day, str) and len(day) == 10 else None


def usd(value: Any) -> str:
    """Dollars for a page: ``$12.34``, ``$0.0042`` below a cent, ``—`` for no figure."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return "—"
    if value == 0:
        return "$0.00"
    if abs(value) < 0.01:
        return f"${value:.4f}"
    return f"${value:,.2f}"
