"""What each turn of a session cost, as the catalog records it (see :mod:`memstore.pricing`).

A turn's cost comes from its end event: the figure the agent reported on it when there is one
(``REPORTED``), else its usage of its model priced from the price table (``ESTIMATED``), else
nothing (``UNPRICED``: an unknown or unrecorded model, never a made-up 0). The time that picks
the prices is the turn's end (or start); a turn without either (VT Code writes no times) is
priced as of the session's ``updated_at``, so the same log is always priced the same.

A session's total is the one its agent reported on ``thread.completed`` when it did (it covers
every turn), else the sum of its priced turns, with the dollars that are estimates and the
number of turns without a price beside it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Optional

import orjson

from .. import pricing
from ..events import TURN_ENDS
from ..session.index import TURN_ABORTED, TURN_COMPLETED, TURN_FAILED, Turn

logger = logging.getLogger("memstore.catalog")

_CLOSED = frozenset({TURN_COMPLETED, TURN_FAILED, TURN_ABORTED})
# Reported costs are looked for only on end events whose bytes name one of these keys.
_COST_MARKERS = tuple(key.encode() for key in pricing.REPORTED_COST_KEYS)


@dataclass(frozen=True)
class TurnCost:
    """A turn's ``cost_usd`` (``None`` when unpriced), ``cost_source`` and ``price_version``
    (of estimates only)."""

    usd: Optional[float]
    source: str
    price_version: Optional[str]

    def as_row(self) -> tuple[Optional[float], str, Optional[str]]:
        return self.usd, self.source, self.price_version


_UNPRICED = TurnCost(None, pricing.CostSource.UNPRICED.value, None)


class CostReader:
    """Prices the turns of one session. ``line_of(seq)`` gives the log line of a record (the
    turn end's, to find a cost the agent reported); ``source`` is the session's manifest source
    (its agent names the provider to look up first, and Codex's ``model_provider`` the one that
    served it); ``fallback_time`` prices turns that record no time."""

    def __init__(self, line_of: Callable[[int], Optional[bytes]], source: Optional[dict], fallback_time: Optional[str]):
        self._line_of = line_of
        source = source or {}
        agent = source.get("agent")
        provider = source.get("model_provider")
        self._hint = agent if isinstance(agent, str) else None
        self._provider = provider if isinstance(provider, str) else None
        self._fallback_time = fallback_time

    def turn(self, turn: Turn) -> TurnCost:
        if turn.status in _CLOSED and turn.last_seq is not None:
            reported = self._reported(turn.last_seq)
            if reported is not None:
                return reported
        usage = (turn.input_tokens, turn.cached_input_tokens, turn.cache_creation_tokens, turn.output_tokens)
        when = turn.ended_at or turn.started_at or self._fallback_time
        try:
            cost = pricing.price_usage(turn.model, usage, provider_hint=self._hint, provider=self._provider, when=when)
        except (pricing.PricingInputError, pricing.PricingUnavailable) as exc:
            logger.warning("catalog: turn %s left unpriced: %s", turn.number, exc)
            return _UNPRICED
        if cost.usd is None:
            return _UNPRICED
        return TurnCost(float(cost.usd), cost.source.value, cost.price_version)

    def _reported(self, seq: int) -> Optional[TurnCost]:
        line = self._line_of(seq)
        if not line or not any(marker in line for marker in _COST_MARKERS):
            return None
        event = _event_of(line)
        if event is None or event.get("type") not in TURN_ENDS:
            return None
        cost = pricing.reported_cost(event)
        if cost is None or cost.usd is None:
            return None
        return TurnCost(float(cost.usd), cost.source.value, None)


def thread_reported_total(line: Optional[bytes]) -> Optional[float]:
    """The whole-session cost a ``thread.completed`` line's agent reported, or ``None``."""
    if not line or not any(marker in line for marker in _COST_MARKERS):
        return None
    event = _event_of(line)
    if event is None:
        return None
    cost = pricing.reported_cost(event)
    return None if cost is None or cost.usd is None else float(cost.usd)


def _event_of(line: bytes) -> Optional[dict[str, Any]]:
    try:
        record = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None
    event = record.get("event") if isinstance(record, dict) else None
    return event if isinstance(event, dict) else None
