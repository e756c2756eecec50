"""Dollars for tokens, with provenance: what a turn, a session or any sum of them cost, and
where each figure comes from.

Every figure is a :class:`Cost` that says how it was obtained (:class:`CostSource`):

- ``REPORTED``: the agent itself recorded the cost (``total_cost_usd``, ``cost_usd`` or
  ``costUSD`` on the event, see :func:`reported_cost`). A reported cost always wins over an
  estimate of the same thing.
- ``ESTIMATED``: the tokens priced from the price table of the ``genai-prices`` package (a
  maintained table; no price here is typed in by hand), with uncached input, cached input
  (cache reads), cache writes and output each at their own rate. ``price_version`` names the
  package version and a fingerprint of its price data, ``price_date`` the day whose prices
  applied (prices change over time: the day of the turn, not today, decides).
- ``UNPRICED``: the model is not in the table, no model was recorded, or the usage cannot be
  priced; ``usd`` is ``None`` (never 0) and ``note`` says why.

Token convention. memstore's stored usage (:data:`memstore.events.USAGE_FIELDS`) is the same
for every agent: ``input_tokens`` is the whole prompt (uncached + cache reads + cache writes),
``cached_input_tokens`` the cache reads and ``cache_creation_tokens`` the cache writes, both
*parts* of ``input_tokens``. The importers normalise to it: Codex's own ``input_tokens``
already includes its cached tokens (and Codex has no cache writes); Claude Code's excludes
both cache counts, so the Claude importer adds them in. This module prices that convention,
which is also the one ``genai-prices`` uses, so cached tokens are counted once: the uncached
part is ``input - cached - cache writes``. :meth:`TokenUsage.from_anthropic` and
:meth:`TokenUsage.from_openai` convert raw API counts.

Offline. Prices come only from the data bundled with the installed ``genai-prices``: this
module builds its own snapshot of that data and never starts the package's optional updater
(``UpdatePrices``), so nothing is fetched at run time, and a price update started by another
library in the same process cannot change memstore's figures behind a ``price_version``
that no longer describes them.

Speed. The price table lookup (model matching, prices in force on a day) is cached per
(model, provider hint, day); pricing a turn is then a few ``Decimal`` multiplications.
"""

from __future__ import annotations

import hashlib
import logging
import math
import re
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from enum import Enum
from functools import lru_cache
from pathlib import Path
from typing import Any, NamedTuple, Optional, Union

from .errors import MemstoreError
from .events import THREAD_COMPLETED, TURN_ENDS, parse_ts, usage_of

logger = logging.getLogger(__name__)

__all__ = (
    "AGENT_PROVIDERS",
    "Cost",
    "CostParts",
    "CostSource",
    "CostSummary",
    "ModelRates",
    "PriceData",
    "PricingInputError",
    "PricingUnavailable",
    "TokenUsage",
    "model_rates",
    "price_data",
    "price_usage",
    "register_sql_functions",
    "reported_cost",
    "session_cost",
    "summarize",
    "turn_cost",
)


class PricingUnavailable(MemstoreError):
    """Cost estimates need the ``genai-prices`` package, and it is not installed."""


class PricingInputError(MemstoreError, ValueError):
    """A usage or a time given to the pricing functions is not one (negative counts, a string
    that is not a timestamp, ...)."""


class CostSource(str, Enum):
    """Where a dollar figure comes from."""

    REPORTED = "reported"  # the agent recorded it
    ESTIMATED = "estimated"  # tokens priced from the price table
    UNPRICED = "unpriced"  # no figure: unknown model, no model, unpriceable usage


# memstore's agent names (thread.started.source.agent) -> the price table's provider id.
# A hint, not a rule: a model the hinted provider does not list is looked up by its name.
AGENT_PROVIDERS: dict[str, Optional[str]] = {"codex": "openai", "claude": "anthropic", "vtcode": None}

# The event keys an agent records its own cost under, in the order they are believed: VT Code's
# and Claude Code's stream-json ``total_cost_usd``, the ATIF-style ``cost_usd``, and the
# ``costUSD`` of Claude Code transcripts.
REPORTED_COST_KEYS = ("total_cost_usd", "cost_usd", "costUSD")

_PER_TOKEN = Decimal(1_000_000)  # table prices are per million tokens
_PER_REQUEST = Decimal(1_000)  # requests_kcount: per thousand requests
_ZERO = Decimal(0)


# --------------------------------------------------------------------------------------------
# Usage


class TokenUsage(NamedTuple):
    """Token counts in memstore's convention: ``input_tokens`` is the whole prompt and
    ``cached_input_tokens`` (cache reads) and ``cache_creation_tokens`` (cache writes) are parts
    of it."""

    input_tokens: int = 0
    cached_input_tokens: int = 0
    cache_creation_tokens: int = 0
    output_tokens: int = 0

    @classmethod
    def from_event(cls, event: dict[str, Any]) -> TokenUsage:
        """The usage of a turn or thread event (0 where missing or malformed, as the index reads it)."""
        return cls._make(usage_of(event))

    @classmethod
    def from_anthropic(
        cls,
        input_tokens: int,
        cache_read_input_tokens: int = 0,
        cache_creation_input_tokens: int = 0,
        output_tokens: int = 0,
    ) -> TokenUsage:
        """From an Anthropic API (Claude Code) ``usage``, whose ``input_tokens`` excludes cache
        reads and writes: they are added to make the whole prompt."""
        return as_token_usage(
            (
                input_tokens + cache_read_input_tokens + cache_creation_input_tokens,
                cache_read_input_tokens,
                cache_creation_input_tokens,
                output_tokens,
            )
        )

    @classmethod
    def from_openai(cls, input_tokens: int, cached_input_tokens: int = 0, output_tokens: int = 0) -> TokenUsage:
        """From an OpenAI (Codex) ``usage``, whose ``input_tokens`` already includes the cached
        ones; OpenAI bills no cache writes."""
        return as_token_usage((input_tokens, cached_input_tokens, 0, output_tokens))

    @property
    def uncached_input_tokens(self) -> int:
        """The prompt tokens neither read from nor written to a cache (0 if the parts exceed the whole)."""
        return max(self.input_tokens - self.cached_input_tokens - self.cache_creation_tokens, 0)


UsageLike = Union[TokenUsage, Mapping[str, Any], "tuple[int, int, int, int]", "list[int]"]


def as_token_usage(usage: UsageLike) -> TokenUsage:
    """``usage`` as a :class:`TokenUsage`: a TokenUsage, a memstore usage object (a mapping:
    fields missing, null or not a non-negative integer count 0, as everywhere in memstore), or a
    sequence of the four counts (which must be non-negative integers)."""
    if type(usage) is TokenUsage:
        return usage
    if isinstance(usage, Mapping):
        return TokenUsage._make(usage_of({"usage": usage}))
    if isinstance(usage, (tuple, list)) and len(usage) == 4:
        for value in usage:
            if type(value) is not int or value < 0:
                raise PricingInputError(f"token counts must be non-negative integers, not {value!r}")
        return TokenUsage._make(usage)
    raise PricingInputError(
        f"usage must be a TokenUsage, a usage object or four token counts, not {type(usage).__name__}"
    )


# --------------------------------------------------------------------------------------------
# Figures


class CostParts(NamedTuple):
    """What each token class cost, in USD: uncached input, cached input (cache reads), cache
    writes, output, and per-request fees (only for a single request: see :func:`price_usage`).
    Each part is priced at the rate the table applies to it: a model without a cache-read or
    cache-write price is charged its input price for those tokens. The parts sum to the total."""

    input: Decimal
    cached_input: Decimal
    cache_write: Decimal
    output: Decimal
    requests: Decimal = _ZERO

    def total(self) -> Decimal:
        return self.input + self.cached_input + self.cache_write + self.output + self.requests


class Cost(NamedTuple):
    """One dollar figure and its provenance (immutable; a named tuple, as a store's worth of
    turns makes a million of them).

    ``usd`` is ``None`` exactly when ``source`` is ``UNPRICED``. ``model`` is the name as
    recorded, ``model_matched`` and ``provider`` the price table's entry it was matched to,
    ``price_version`` the table (estimates only), ``price_date`` the UTC day whose prices
    applied, ``parts`` the per-class breakdown (estimates only), ``note`` a reason or a caveat.
    """

    usd: Optional[Decimal]
    source: CostSource
    price_version: Optional[str] = None
    model: Optional[str] = None
    model_matched: Optional[str] = None
    provider: Optional[str] = None
    parts: Optional[CostParts] = None
    price_date: Optional[str] = None
    note: Optional[str] = None

    @property
    def priced(self) -> bool:
        return self.usd is not None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready form: dollars as numbers (``null`` when unpriced), the source as its name."""
        parts = self.parts
        return {
            "usd": None if self.usd is None else float(self.usd),
            "source": self.source.value,
            "price_version": self.price_version,
            "model": self.model,
            "model_matched": self.model_matched,
            "provider": self.provider,
            "price_date": self.price_date,
            "parts": None
            if parts is None
            else {
                "input": float(parts.input),
                "cached_input": float(parts.cached_input),
                "cache_write": float(parts.cache_write),
                "output": float(parts.output),
                "requests": float(parts.requests),
            },
            "note": self.note,
        }


def _unpriced(
    model: Optional[str], note: str, price_version: Optional[str] = None, price_date: Optional[str] = None
) -> Cost:
    return Cost(None, CostSource.UNPRICED, price_version, model, None, None, None, price_date, note)


# --------------------------------------------------------------------------------------------
# The price table


@dataclass(frozen=True)
class PriceData:
    """The price table in use: the package, its version, and a fingerprint of its bundled data."""

    package: str
    version: str
    data_sha256: str

    @property
    def price_version(self) -> str:
        """What every estimate names: ``genai-prices 0.2.3 (data 5f4d8e175a91)``."""
        return _price_version(self.package, self.version, self.data_sha256)


@lru_cache(maxsize=8)
def _price_version(package: str, version: str, data_sha256: str) -> str:
    return f"{package} {version} (data {data_sha256[:12]})"


class _Library(NamedTuple):
    snapshot: Any
    types: Any
    data: PriceData


_library_lock = threading.Lock()
_library_loaded: Optional[_Library] = None


def _library() -> _Library:
    """genai-prices, imported on first use (it takes a quarter of a second), with a snapshot of
    its bundled data that only memstore uses."""
    global _library_loaded
    loaded = _library_loaded
    if loaded is not None:
        return loaded
    with _library_lock:
        if _library_loaded is None:
            try:
                import genai_prices
                from genai_prices import data as gp_data
                from genai_prices import data_snapshot, types
            except ImportError as exc:
                raise PricingUnavailable(
                    f"cost estimates need the genai-prices package (pip install genai-prices): {exc}"
                ) from None
            # Our own snapshot of the bundled data, never the process-wide one that an
            # UpdatePrices started elsewhere would replace with downloaded prices.
            snapshot = data_snapshot.DataSnapshot(providers=gp_data.providers, from_auto_update=False)
            digest = hashlib.sha256(Path(gp_data.__file__).read_bytes()).hexdigest()
            _library_loaded = _Library(snapshot, types, PriceData("genai-prices", genai_prices.__version__, digest))
        return _library_loaded


def price_data() -> PriceData:
    """Which price table estimates come from (:class:`PricingUnavailable` if none is installed)."""
    return _library().data


Rate = tuple[Decimal, tuple[tuple[int, Decimal], ...]]  # per-token base price, (tier start, per-token price)


@dataclass(frozen=True)
class ModelRates:
    """The prices of one model on one day, per token (``None``: the table has no such price;
    cached input and cache writes are then charged at the input price).

    ``tiered``: some price depends on the request's prompt size (long-context tiers).
    ``time_of_day``: the prices depend on the hour (off-peak discounts), not only the day.
    """

    model_matched: str
    provider: str
    price_date: str
    input: Optional[Rate]
    cached_input: Optional[Rate]
    cache_write: Optional[Rate]
    output: Optional[Rate]
    request_fee: Optional[Decimal]  # per request
    tiered: bool
    time_of_day: bool
    first_tier_start: Optional[int] = field(init=False)  # the smallest prompt size a tier starts above
    base: tuple[Decimal, Decimal, Decimal, Decimal] = field(init=False)  # prices(0, single_request=False)

    def __post_init__(self) -> None:
        rates = (self.input, self.cached_input, self.cache_write, self.output)
        starts = [rate[1][0][0] for rate in rates if rate is not None and rate[1]]
        object.__setattr__(self, "first_tier_start", min(starts) if starts else None)
        object.__setattr__(self, "base", self.prices(0, single_request=False))

    def prices(self, prompt_tokens: int, *, single_request: bool) -> tuple[Decimal, Decimal, Decimal, Decimal]:
        """The per-token price of (uncached input, cached input, cache writes, output) for a usage
        whose prompt is ``prompt_tokens``: base rates, or for one request the tier its prompt
        reaches. Cache reads and writes without a price of their own take the input price; a
        class the table has no price for is 0 here (:func:`price_usage` leaves usage of it
        unpriced rather than use that 0)."""

        def pick(rate: Optional[Rate]) -> Optional[Decimal]:
            if rate is None:
                return None
            base, tiers = rate
            if single_request:
                for start, price in reversed(tiers):
                    if prompt_tokens > start:
                        return price
            return base

        input_price = pick(self.input) or _ZERO
        cached, written, output = pick(self.cached_input), pick(self.cache_write), pick(self.output)
        return (
            input_price,
            input_price if cached is None else cached,
            input_price if written is None else written,
            _ZERO if output is None else output,
        )

    def per_million(self, rate: Optional[Rate]) -> Optional[Decimal]:
        """A base per-token rate as the usual price per million tokens."""
        return None if rate is None else rate[0] * _PER_TOKEN


_TOKEN_KEYS = {"input_mtok", "cache_read_mtok", "cache_write_mtok", "output_mtok"}


def _rate(value: Any, tiered_type: Any) -> Optional[Rate]:
    if value is None:
        return None
    if isinstance(value, tiered_type):
        return (value.base / _PER_TOKEN, tuple((tier.start, tier.price / _PER_TOKEN) for tier in value.tiers))
    return (Decimal(value) / _PER_TOKEN, ())


def _has_time_of_day(info: Any, types: Any) -> bool:
    prices = info.prices
    return isinstance(prices, list) and any(
        isinstance(conditional.constraint, types.TimeOfDateConstraint) for conditional in prices
    )


def _find(model: str, hint: Optional[str], provider: Optional[str]) -> Union[tuple[Any, Any], str]:
    """The table's (provider, model) entry for ``model``, or why there is none.

    ``provider`` (the provider that served the request) is strict: only its prices (with the
    table's own fallbacks, e.g. Azure to OpenAI) apply, and a provider the table does not know
    prices nothing, since another provider's prices would be a made-up figure (a model run
    locally costs nothing). ``hint`` is soft: its provider is asked first, then the model is
    looked up by its name alone (an agent may run another vendor's models).
    """
    snapshot = _library().snapshot
    if provider is not None:
        if not _knows_provider(provider):
            return f"provider {provider!r} is not in the price table"
        try:
            return snapshot.find_provider_model(model, None, provider, None)
        except LookupError:
            return f"model {model!r} is not in the price table for provider {provider!r}"
    if hint is not None and _knows_provider(hint):
        try:
            return snapshot.find_provider_model(model, None, hint, None)
        except LookupError:
            pass
    try:
        return snapshot.find_provider_model(model, None, None, None)
    except LookupError:
        return f"model {model!r} is not in the price table"


@lru_cache(maxsize=256)
def _knows_provider(provider_id: str) -> bool:
    try:
        _library().snapshot.find_provider(None, provider_id, None)
    except LookupError:
        return False
    return True


def _rates_at(model: str, hint: Optional[str], provider: Optional[str], at: datetime) -> Union[ModelRates, str]:
    found = _find(model, hint, provider)
    if isinstance(found, str):
        return found
    entry, info = found
    types = _library().types
    price = info.get_prices(at)
    tiered_type = types.TieredPrices
    values = {key: value for key, value in vars(price).items() if value is not None and not key.startswith("_")}
    fee = values.get("requests_kcount")
    return ModelRates(
        model_matched=info.id,
        provider=entry.id,
        price_date=at.date().isoformat(),
        input=_rate(values.get("input_mtok"), tiered_type),
        cached_input=_rate(values.get("cache_read_mtok"), tiered_type),
        cache_write=_rate(values.get("cache_write_mtok"), tiered_type),
        output=_rate(values.get("output_mtok"), tiered_type),
        request_fee=None if fee is None or isinstance(fee, tiered_type) else Decimal(fee) / _PER_REQUEST,
        tiered=any(isinstance(values.get(key), tiered_type) for key in _TOKEN_KEYS),
        time_of_day=_has_time_of_day(info, types),
    )


@lru_cache(maxsize=16384)
def _rates_on_day(model: str, hint: Optional[str], provider: Optional[str], day: str) -> Union[ModelRates, str]:
    """The rates in force on a UTC day (at its start; :func:`_rates_at_time` for the few models
    whose prices change within a day)."""
    return _rates_at(model, hint, provider, datetime.fromisoformat(day).replace(tzinfo=UTC))


@lru_cache(maxsize=16384)
def _rates_at_time(model: str, hint: Optional[str], provider: Optional[str], minute: str) -> Union[ModelRates, str]:
    return _rates_at(model, hint, provider, datetime.fromisoformat(minute).replace(tzinfo=UTC))


_MEMSTORE_DAY = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?Z\Z")


def _moment(when: Union[datetime, str, None]) -> tuple[str, str]:
    """The UTC day and minute of ``when`` (default now), as ISO text (cache keys)."""
    if when is None:
        now = datetime.now(UTC)
        return now.date().isoformat(), now.strftime("%Y-%m-%dT%H:%M")
    if type(when) is str and _MEMSTORE_DAY.match(when) and _is_date(when[:10]):
        return when[:10], when[:16]
    if isinstance(when, str):
        dt = parse_ts(when)
        if dt is None:
            raise PricingInputError(f"when must be an RFC 3339 timestamp, not {when!r}")
    elif isinstance(when, datetime):
        dt = when if when.tzinfo is not None else when.replace(tzinfo=UTC)
    else:
        raise PricingInputError(f"when must be a datetime or a timestamp string, not {type(when).__name__}")
    dt = dt.astimezone(UTC)
    return dt.date().isoformat(), dt.strftime("%Y-%m-%dT%H:%M")


@lru_cache(maxsize=4096)
def _is_date(text: str) -> bool:
    try:
        datetime.strptime(text, "%Y-%m-%d")
    except ValueError:
        return False
    return True


@lru_cache(maxsize=256)
def _hint(provider_hint: Optional[str]) -> Optional[str]:
    """A provider id from a hint that is one or a memstore agent name (``None`` for an agent of
    no one provider, or for an empty hint)."""
    if not provider_hint:
        return None
    key = provider_hint.strip().lower()
    return AGENT_PROVIDERS[key] if key in AGENT_PROVIDERS else key or None


@lru_cache(maxsize=256)
def _provider(provider: Optional[str]) -> Optional[str]:
    return provider.strip().lower() or None if provider else None


def model_rates(
    model: Optional[str],
    *,
    provider_hint: Optional[str] = None,
    provider: Optional[str] = None,
    when: Union[datetime, str, None] = None,
) -> Optional[ModelRates]:
    """The prices ``model`` is charged at on ``when`` (default: now), or ``None`` when the table
    does not know it (``provider_hint`` and ``provider`` as in :func:`price_usage`)."""
    if not model:
        return None
    found = _lookup(model, _hint(provider_hint), _provider(provider), *_moment(when))
    return found if isinstance(found, ModelRates) else None


def _lookup(model: str, hint: Optional[str], provider: Optional[str], day: str, minute: str) -> Union[ModelRates, str]:
    rates = _rates_on_day(model, hint, provider, day)
    if isinstance(rates, ModelRates) and rates.time_of_day:
        rates = _rates_at_time(model, hint, provider, minute)
    return rates


# --------------------------------------------------------------------------------------------
# Pricing


_warned: set[tuple[str, str]] = set()


def _warn_once(model: str, note: str) -> None:
    """Log an unpriced model once per process and reason: a store of a million turns of an
    unknown model is one problem, not a million."""
    key = (model, note)
    if key not in _warned:
        _warned.add(key)
        logger.warning("cost of %r is unpriced: %s", model, note)


def price_usage(
    model: Optional[str],
    usage: UsageLike,
    *,
    provider_hint: Optional[str] = None,
    provider: Optional[str] = None,
    when: Union[datetime, str, None] = None,
    single_request: bool = False,
) -> Cost:
    """What ``usage`` (memstore's convention, see the module doc) of ``model`` cost: an
    ``ESTIMATED`` :class:`Cost` from the price table, or ``UNPRICED`` (``usd`` None) when the
    model is unknown, missing, or the usage cannot be priced. Never a made-up $0: zero tokens
    of a known model cost 0, zero tokens of an unknown one are unpriced.

    ``provider_hint``: a memstore agent name (``codex``, ``claude``, ``vtcode``: see
    :data:`AGENT_PROVIDERS`) or a provider id, asked first; a model it does not list is looked
    up by its name (an agent may run another vendor's model). ``provider``: the provider that
    served the usage, when the source says (Codex's ``model_provider``: ``openai``, ``azure``,
    ``openrouter``, ``ollama``...): only its prices apply, and a provider the table does not
    know leaves the usage unpriced. ``when``: the time of the usage (a memstore timestamp, any
    RFC 3339 string, or a datetime, naive ones taken as UTC; default now): the prices in force
    then apply.

    ``single_request``: the usage is one API request. Long-context price tiers apply per
    request, by that request's prompt size; a turn's usage sums many requests whose sizes are
    not recorded, so by default it is priced at the base rates (noted when its total would
    have crossed a tier), and per-request fees, which need the number of requests, are left out
    (noted). With ``single_request=True`` the tier is chosen from ``input_tokens`` and one
    request's fee is added, exactly as ``genai-prices`` prices one request.
    """
    tokens = as_token_usage(usage)
    if not model or not isinstance(model, str):
        return _unpriced(model if isinstance(model, str) else None, "no model was recorded")
    lib = _library()
    version = lib.data.price_version
    day, minute = _moment(when)
    rates = _lookup(model, _hint(provider_hint), _provider(provider), day, minute)
    if isinstance(rates, str):
        _warn_once(model, rates)
        return _unpriced(model, rates, version, day)
    prompt, cached, written, output = tokens
    uncached = prompt - cached - written
    if uncached < 0:
        _warn_once(model, "inconsistent usage")
        return _unpriced(
            model,
            f"usage is inconsistent: cached input ({cached}) and cache writes ({written}) "
            f"exceed the whole prompt ({prompt}); memstore's input_tokens includes both",
            version,
            day,
        )
    if rates.input is None and prompt:
        missing = f"the price table has no input price for {rates.model_matched}"
        _warn_once(model, missing)
        return _unpriced(model, missing, version, day)
    if rates.output is None and output:
        missing = f"the price table has no output price for {rates.model_matched}"
        _warn_once(model, missing)
        return _unpriced(model, missing, version, day)
    in_price, cached_price, write_price, out_price = (
        rates.prices(prompt, single_request=True) if single_request else rates.base
    )
    fee = rates.request_fee if single_request and rates.request_fee is not None else _ZERO
    parts = CostParts(uncached * in_price, cached * cached_price, written * write_price, output * out_price, fee)
    note: Optional[str] = None
    if not single_request:
        first_tier = rates.first_tier_start
        if first_tier is not None and prompt > first_tier:
            note = "priced at base rates: long-context tiers apply per request, and this usage may sum several"
        if rates.request_fee is not None:
            fees = "per-request fees left out: the number of requests is not recorded"
            note = fees if note is None else f"{note}; {fees}"
    return Cost(
        parts.input + parts.cached_input + parts.cache_write + parts.output + fee,
        CostSource.ESTIMATED,
        version,
        model,
        rates.model_matched,
        rates.provider,
        parts,
        rates.price_date,
        note,
    )


# --------------------------------------------------------------------------------------------
# Costs the agent recorded


def reported_cost(event: Mapping[str, Any]) -> Optional[Cost]:
    """The cost the agent itself recorded on ``event`` (``REPORTED``), or ``None`` if it
    recorded none. Read from the first of ``total_cost_usd`` (VT Code's ``thread.completed``,
    Claude Code's stream-json ``result``), ``cost_usd`` and ``costUSD`` (Claude Code
    transcripts) that is present. A value that is not a finite non-negative number is logged
    and ignored (the caller falls back to an estimate). The figure covers what the event
    covers: a ``thread.completed`` total is the whole session's.
    """
    for key in REPORTED_COST_KEYS:
        if key not in event:
            continue
        value = event[key]
        if value is None:
            continue
        if type(value) not in (int, float) or not math.isfinite(value) or value < 0:
            logger.warning("ignored a reported cost that is not a non-negative number: %s=%r", key, value)
            continue
        model = event.get("model")
        return Cost(
            Decimal(repr(value)) if type(value) is float else Decimal(value),
            CostSource.REPORTED,
            None,
            model if isinstance(model, str) else None,
            note=f"recorded by the agent as {key}",
        )
    return None


def turn_cost(
    event: Mapping[str, Any],
    *,
    provider_hint: Optional[str] = None,
    provider: Optional[str] = None,
    when: Union[datetime, str, None] = None,
) -> Cost:
    """The cost of a turn end (``turn.completed``/``failed``/``aborted``): the agent's own
    figure when it recorded one, else its ``usage`` of its ``model`` priced (time: ``when``,
    else the event's ``completed_at``, else now). :class:`PricingInputError` for other events."""
    if event.get("type") not in TURN_ENDS:
        raise PricingInputError(f"turn_cost prices turn ends, not {event.get('type')!r} events")
    reported = reported_cost(event)
    if reported is not None:
        return reported
    if when is None:
        completed = event.get("completed_at")
        when = completed if isinstance(completed, str) and parse_ts(completed) is not None else None
    model = event.get("model")
    return price_usage(
        model if isinstance(model, str) else None,
        TokenUsage._make(usage_of(dict(event))),
        provider_hint=provider_hint,
        provider=provider,
        when=when,
    )


# --------------------------------------------------------------------------------------------
# Sums


@dataclass(frozen=True)
class CostSummary:
    """A sum of costs (a session's, a day's, a model's...) that keeps its provenance.

    ``usd`` sums the priced figures (``None`` when none is priced); ``unpriced`` counts the
    figures it lacks, so a total with ``complete`` False is a lower bound. ``source`` is
    ``REPORTED`` when every priced figure was reported, ``ESTIMATED`` when any was estimated,
    ``UNPRICED`` when none is priced.
    """

    usd: Optional[Decimal]
    source: CostSource
    reported_usd: Decimal
    estimated_usd: Decimal
    priced: int
    unpriced: int
    price_versions: tuple[str, ...]
    unpriced_models: tuple[str, ...]

    @property
    def complete(self) -> bool:
        return self.unpriced == 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "usd": None if self.usd is None else float(self.usd),
            "source": self.source.value,
            "reported_usd": float(self.reported_usd),
            "estimated_usd": float(self.estimated_usd),
            "priced": self.priced,
            "unpriced": self.unpriced,
            "complete": self.complete,
            "price_versions": list(self.price_versions),
            "unpriced_models": list(self.unpriced_models),
        }


def summarize(costs: Iterable[Cost]) -> CostSummary:
    """The sum of ``costs``, with where its parts came from (see :class:`CostSummary`)."""
    reported = estimated = _ZERO
    reported_count = estimated_count = unpriced = 0
    versions: set[str] = set()
    models: set[str] = set()
    for cost in costs:
        if cost.usd is None:
            unpriced += 1
            models.add(cost.model or "(no model)")
        elif cost.source is CostSource.REPORTED:
            reported += cost.usd
            reported_count += 1
        else:
            estimated += cost.usd
            estimated_count += 1
            if cost.price_version:
                versions.add(cost.price_version)
    priced = reported_count + estimated_count
    source = CostSource.UNPRICED if not priced else CostSource.ESTIMATED if estimated_count else CostSource.REPORTED
    return CostSummary(
        reported + estimated if priced else None,
        source,
        reported,
        estimated,
        priced,
        unpriced,
        tuple(sorted(versions)),
        tuple(sorted(models)),
    )


def session_cost(turn_costs: Iterable[Cost], thread_completed: Optional[Mapping[str, Any]] = None) -> CostSummary:
    """A session's cost: the total its agent reported on ``thread.completed`` when there is
    one (it covers every turn, so the turns are not added to it), else the sum of its turns."""
    if thread_completed is not None and thread_completed.get("type") == THREAD_COMPLETED:
        reported = reported_cost(thread_completed)
        if reported is not None:
            return summarize([reported])
    return summarize(turn_costs)


# --------------------------------------------------------------------------------------------
# SQL


def _sql_cost(model: Any, hint: Any, prompt: Any, cached: Any, written: Any, output: Any, ts: Any) -> Optional[Cost]:
    counts = tuple(v if type(v) is int and v >= 0 else 0 for v in (prompt, cached, written, output))
    try:
        return price_usage(
            model if isinstance(model, str) else None,
            counts,  # type: ignore[arg-type]
            provider_hint=hint if isinstance(hint, str) else None,
            when=ts if isinstance(ts, str) and ts else None,
        )
    except PricingInputError as exc:
        logger.warning("SQL cost of %r left unpriced: %s", model, exc)
        return None


def register_sql_functions(conn: Any) -> None:
    """Give a ``sqlite3`` connection the functions that put dollars into SQL:

    - ``memstore_cost_usd(model, agent, input, cached, cache_writes, output, ts)``: the
      estimate in USD (``agent`` is the provider hint, ``ts`` the time; a NULL ``ts`` prices at
      today's prices), ``NULL`` when unpriced, never 0 for an unknown model;
    - ``memstore_cost_source(...)`` (same arguments): ``'estimated'`` or ``'unpriced'``;
    - ``memstore_price_version()``: the price table estimates come from.

    Token counts that are NULL or not non-negative integers count 0, as in the index. A cost
    the agent reported lives in its own column and wins: ``COALESCE(reported, memstore_cost_usd(...))``.
    Not declared deterministic: with a NULL ``ts`` the result depends on the day.
    """

    def usd(*args: Any) -> Optional[float]:
        cost = _sql_cost(*args)
        return None if cost is None or cost.usd is None else float(cost.usd)

    def source(*args: Any) -> str:
        cost = _sql_cost(*args)
        return CostSource.UNPRICED.value if cost is None else cost.source.value

    conn.create_function("memstore_cost_usd", 7, usd)
    conn.create_function("memstore_cost_source", 7, source)
    conn.create_function("memstore_price_version", 0, lambda: price_data().price_version)
