"""memstore.pricing: dollars for tokens, with provenance.

The expected figures are never typed in here: they come from genai-prices itself (its per-token
prices, its ``calc_price``, its own extraction of raw Anthropic and OpenAI usage), so a test
fails if memstore prices a token class at the wrong rate, counts cached tokens twice, or
drifts from the table. Every test runs with the network closed (see ``no_network``).
"""

from __future__ import annotations

import hashlib
import json
import random
import socket
import sqlite3
import subprocess
import sys
import textwrap
import threading
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import genai_prices
import pytest
from genai_prices import Usage, calc_price, data_snapshot, extract_usage
from genai_prices import data as gp_data

import memstore
from memstore import pricing
from memstore.events import TURN_ENDS, decode_line
from memstore.pricing import Cost, CostSource, PricingInputError, TokenUsage

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "import"
CLAUDE_20 = next((FIXTURES / "claude" / "projects" / "-home-dev-web").glob("*.jsonl"))
CODEX_0104 = next((FIXTURES / "codex" / "0.104").glob("*.jsonl"))
DAY = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
MTOK = Decimal(1_000_000)


class NetworkUsed(AssertionError):
    pass


@pytest.fixture(autouse=True)
def no_network(monkeypatch):
    """Every connection attempt (and name lookup) fails the test: pricing works offline."""
    attempts: list[object] = []

    def refuse(*args, **kwargs):
        attempts.append(args)
        raise NetworkUsed(f"network used: {args!r}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    yield attempts
    assert attempts == []


def library_price(model: str, provider: str, usage: TokenUsage, when: datetime = DAY):
    """genai-prices' own figure for ``usage`` (memstore's convention is its convention)."""
    return calc_price(
        Usage(
            input_tokens=usage.input_tokens,
            cache_read_tokens=usage.cached_input_tokens,
            cache_write_tokens=usage.cache_creation_tokens,
            output_tokens=usage.output_tokens,
        ),
        model,
        provider_id=provider,
        genai_request_timestamp=when,
    )


# ---------------------------------------------------------------------------------------------
# Each token class at its own rate


@pytest.mark.parametrize(
    "model,agent,provider",
    [
        ("gpt-5-codex", "codex", "openai"),
        ("gpt-5.1-codex-max", "codex", "openai"),
        ("o4-mini", "codex", "openai"),
        ("claude-sonnet-4-5-20250929", "claude", "anthropic"),
        ("claude-opus-4-1", "claude", "anthropic"),
        ("claude-haiku-4-5", "claude", "anthropic"),
    ],
)
def test_each_token_class_is_priced_at_the_tables_own_rate(model, agent, provider):
    """Uncached input, cache reads, cache writes and output are each charged the table's
    per-token price for that class (the input price where the table has none), and the parts
    add up to the library's own total."""
    usage = TokenUsage(
        input_tokens=150_000, cached_input_tokens=120_000, cache_creation_tokens=9_000, output_tokens=4_321
    )
    cost = pricing.price_usage(model, usage, provider_hint=agent, when=DAY)
    table = library_price(model, provider, usage)
    prices = table.model_price
    assert cost.source is CostSource.ESTIMATED
    assert (cost.model, cost.model_matched, cost.provider) == (model, table.model.id, provider)
    input_rate = prices.input_mtok.base if hasattr(prices.input_mtok, "base") else prices.input_mtok

    def rate(value):
        if value is None:
            return input_rate
        return value.base if hasattr(value, "base") else value

    assert cost.parts.input == Decimal(150_000 - 120_000 - 9_000) * input_rate / MTOK
    assert cost.parts.cached_input == Decimal(120_000) * rate(prices.cache_read_mtok) / MTOK
    assert cost.parts.cache_write == Decimal(9_000) * rate(prices.cache_write_mtok) / MTOK
    assert cost.parts.output == Decimal(4_321) * rate(prices.output_mtok) / MTOK
    assert cost.usd == cost.parts.total() == table.total_price
    assert cost.parts.cached_input < Decimal(120_000) * input_rate / MTOK  # the cache discount is applied


def test_every_model_of_every_provider_agrees_with_the_library():
    """Across the whole table (every provider, every model, several days, random usages):
    memstore's figure is exactly genai-prices' ``calc_price`` of one request, or unpriced when
    the table lacks a price for a token class the usage has (where the library would say $0)."""
    rng = random.Random(19)
    days = [datetime(2025, 3, 1, tzinfo=UTC), DAY, datetime(2027, 2, 1, 13, 30, tzinfo=UTC)]
    compared = unpriced = 0
    for provider in gp_data.providers:
        for model in provider.models:
            rates = pricing.model_rates(model.id, provider=provider.id, when=DAY)
            if rates is None or rates.model_matched != model.id:
                continue  # an earlier entry of the provider claims this id
            for when in days:
                prompt = rng.choice([0, rng.randrange(1, 5_000), rng.randrange(1, 400_000)])
                cached = rng.randrange(0, prompt + 1)
                usage = TokenUsage(prompt, cached, rng.randrange(0, prompt - cached + 1), rng.randrange(0, 40_000))
                cost = pricing.price_usage(model.id, usage, provider=provider.id, when=when, single_request=True)
                expected = model.calc_price(
                    Usage(
                        input_tokens=usage[0],
                        cache_read_tokens=usage[1],
                        cache_write_tokens=usage[2],
                        output_tokens=usage[3],
                    ),
                    provider,
                    genai_request_timestamp=when,
                ).total_price
                if cost.usd is None:
                    unpriced += 1
                    assert "has no" in cost.note
                    continue
                assert cost.usd == expected, (provider.id, model.id, usage, when)
                compared += 1
    assert compared > 5_000 and unpriced < compared


# ---------------------------------------------------------------------------------------------
# Conventions: cached tokens count once


def test_codex_cached_input_is_part_of_input_and_counts_once():
    """OpenAI/Codex ``input_tokens`` includes the cached ones: priced from raw Responses-API
    usage, memstore's figure equals the library's extraction of the same response."""
    raw = {
        "model": "gpt-5-codex",
        "usage": {
            "input_tokens": 52_000,
            "input_tokens_details": {"cached_tokens": 48_000},
            "output_tokens": 1_900,
            "output_tokens_details": {"reasoning_tokens": 700},
        },
    }
    usage = TokenUsage.from_openai(52_000, 48_000, 1_900)
    cost = pricing.price_usage("gpt-5-codex", usage, provider_hint="codex", when=DAY)
    expected = extract_usage(raw, provider_id="openai", api_flavor="responses").calc_price(genai_request_timestamp=DAY)
    assert cost.usd == expected.total_price
    assert cost.parts.input == Decimal(4_000) * expected.model_price.input_mtok / MTOK


def test_claude_cache_counts_are_added_to_input_and_count_once():
    """Anthropic/Claude ``input_tokens`` excludes cache reads and writes: memstore adds them to
    make the whole prompt, and the figure equals the library's extraction of the raw response."""
    raw = {
        "model": "claude-sonnet-4-5-20250929",
        "usage": {
            "input_tokens": 3,
            "cache_read_input_tokens": 11_515,
            "cache_creation_input_tokens": 13_835,
            "output_tokens": 512,
        },
    }
    usage = TokenUsage.from_anthropic(3, 11_515, 13_835, 512)
    assert usage == TokenUsage(3 + 11_515 + 13_835, 11_515, 13_835, 512)
    cost = pricing.price_usage("claude-sonnet-4-5-20250929", usage, provider_hint="claude", when=DAY)
    expected = extract_usage(raw, provider_id="anthropic").calc_price(genai_request_timestamp=DAY)
    assert cost.usd == expected.total_price
    assert cost.parts.input == Decimal(3) * expected.model_price.input_mtok.base / MTOK


def _events(root: Path) -> list[tuple[dict, str]]:
    found = []
    for log in sorted(root.rglob("events.jsonl")):
        for line in log.read_bytes().splitlines():
            record = decode_line(line)
            if record is not None:
                found.append((record.event, record.ts))
    return found


def test_an_imported_claude_transcript_costs_what_its_raw_responses_cost(tmp_path):
    """End to end on a real Claude Code transcript: the imported turns, priced by memstore, cost
    exactly what the library makes of the transcript's own API responses (each ``message.id``
    once, at its largest usage). Counting cached tokens twice, or not at all, would differ."""
    memstore.import_logs(tmp_path, CLAUDE_20, settle_seconds=0)
    turn_ends = [(event, ts) for event, ts in _events(tmp_path) if event["type"] in TURN_ENDS]
    assert len(turn_ends) == 3
    costs = [pricing.turn_cost(event, provider_hint="claude", when=ts) for event, ts in turn_ends]
    assert {c.source for c in costs} == {CostSource.ESTIMATED}

    responses: dict[str, tuple[str, str, list[int]]] = {}
    for line in CLAUDE_20.read_bytes().splitlines():
        obj = json.loads(line)
        message = obj.get("message") if obj.get("type") == "assistant" else None
        if not isinstance(message, dict) or not isinstance(message.get("usage"), dict):
            continue
        u = message["usage"]
        counts = [
            u.get(k, 0)
            for k in ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens", "output_tokens")
        ]
        old = responses.get(message["id"])
        responses[message["id"]] = (
            message["model"],
            obj["timestamp"],
            counts if old is None else [max(a, b) for a, b in zip(old[2], counts)],
        )
    expected = Decimal(0)
    for model, ts, (i, cr, cc, o) in responses.values():
        raw = {
            "model": model,
            "usage": {
                "input_tokens": i,
                "cache_read_input_tokens": cr,
                "cache_creation_input_tokens": cc,
                "output_tokens": o,
            },
        }
        when = datetime.fromisoformat(ts.replace("Z", "+00:00"))
        expected += extract_usage(raw, provider_id="anthropic").calc_price(genai_request_timestamp=when).total_price
    assert pricing.summarize(costs).usd == expected > 0


def test_an_imported_codex_rollout_costs_what_its_final_token_total_costs(tmp_path):
    """End to end on a real Codex rollout: its turns' priced usage sums to the library's price
    of the rollout's last cumulative ``total_token_usage`` (one model throughout)."""
    memstore.import_logs(tmp_path, CODEX_0104, settle_seconds=0)
    records = _events(tmp_path)
    turn_ends = [(event, ts) for event, ts in records if event["type"] in TURN_ENDS]
    assert {event.get("model") for event, _ in turn_ends} == {"gpt-5.3-codex"}
    costs = [pricing.turn_cost(event, provider_hint="codex", when=ts) for event, ts in turn_ends]
    total = None
    for line in CODEX_0104.read_bytes().splitlines():
        try:
            payload = json.loads(line).get("payload") or {}
        except ValueError:
            continue  # the fixture's torn last line
        if payload.get("type") == "token_count" and payload.get("info"):
            total = payload["info"]["total_token_usage"]
    raw = {
        "model": "gpt-5.3-codex",
        "usage": {
            "input_tokens": total["input_tokens"],
            "input_tokens_details": {"cached_tokens": total["cached_input_tokens"]},
            "output_tokens": total["output_tokens"],
        },
    }
    when = datetime.fromisoformat(turn_ends[-1][1].replace("Z", "+00:00"))
    assert {c.price_date for c in costs} == {when.date().isoformat()}  # every turn of the rollout is on one day
    expected = extract_usage(raw, provider_id="openai", api_flavor="responses").calc_price(genai_request_timestamp=when)
    assert pricing.summarize(costs).usd == expected.total_price > 0


def test_usage_whose_cache_parts_exceed_the_prompt_is_unpriced_not_guessed():
    """A usage written in Anthropic's raw convention by mistake (cache counts not included in
    input) cannot be memstore's: it is unpriced, with the reason, rather than priced wrong."""
    cost = pricing.price_usage("claude-sonnet-4-5", TokenUsage(3, 11_515, 13_835, 512), provider_hint="claude")
    assert (cost.usd, cost.source) == (None, CostSource.UNPRICED)
    assert "inconsistent" in cost.note


# ---------------------------------------------------------------------------------------------
# Unknown models, hints


@pytest.mark.parametrize("usage", [TokenUsage(0, 0, 0, 0), TokenUsage(10_000, 2_000, 0, 500)])
def test_an_unknown_model_is_unpriced_never_zero(usage, caplog):
    cost = pricing.price_usage("claude-fable-9-turbo-unreleased", usage, provider_hint="claude", when=DAY)
    assert cost.usd is None and cost.source is CostSource.UNPRICED and cost.parts is None
    assert "not in the price table" in cost.note
    assert cost.price_version == pricing.price_data().price_version


def test_no_model_is_unpriced():
    for model in (None, ""):
        cost = pricing.price_usage(model, TokenUsage(100, 0, 0, 10))
        assert (cost.usd, cost.source, cost.note) == (None, CostSource.UNPRICED, "no model was recorded")


def test_zero_tokens_of_a_known_model_cost_zero_estimated():
    cost = pricing.price_usage("gpt-5-codex", TokenUsage(), provider_hint="codex", when=DAY)
    assert (cost.usd, cost.source) == (0, CostSource.ESTIMATED)


def test_agent_hints_find_models_that_need_them_and_soft_hints_fall_back_to_the_name():
    """``codex-mini-latest`` is only found under OpenAI (the codex hint); an agent may run
    another vendor's model, and an unknown hint is ignored; a strict provider the table does
    not know (a local server) prices nothing."""
    usage = TokenUsage(1_000, 0, 0, 100)
    assert pricing.price_usage("codex-mini-latest", usage, when=DAY).usd is None
    assert (
        pricing.price_usage("codex-mini-latest", usage, provider_hint="codex", when=DAY).model_matched == "codex-mini"
    )
    assert pricing.price_usage("claude-opus-4-1", usage, provider_hint="codex", when=DAY).provider == "anthropic"
    assert pricing.price_usage("gpt-5", usage, provider_hint="vtcode", when=DAY).provider == "openai"
    assert pricing.price_usage("gpt-5", usage, provider_hint="some-new-agent", when=DAY).provider == "openai"
    local = pricing.price_usage("gpt-oss-20b", usage, provider="ollama", when=DAY)
    assert local.usd is None and "provider 'ollama'" in local.note
    via_azure = pricing.price_usage("gpt-5", usage, provider="azure", when=DAY)
    assert (
        via_azure.source is CostSource.ESTIMATED and via_azure.usd == library_price("gpt-5", "azure", usage).total_price
    )


def test_the_models_coding_agents_name_are_matched():
    """The model names Codex and Claude Code record are found in the table."""
    for model, agent in [
        ("gpt-5-codex", "codex"),
        ("gpt-5.1-codex-max", "codex"),
        ("gpt-5.3-codex", "codex"),
        ("o4-mini", "codex"),
        ("claude-sonnet-4-5-20250929", "claude"),
        ("claude-opus-4-1", "claude"),
        ("claude-haiku-4-5", "claude"),
    ]:
        assert pricing.model_rates(model, provider_hint=agent, when=DAY) is not None, model


# ---------------------------------------------------------------------------------------------
# Time and tiers


def _a_model_whose_price_changed():
    """A model of the table with a dated price change, and a day before and after it."""
    from genai_prices import types

    for provider in gp_data.providers:
        if provider.id not in ("openai", "anthropic"):
            continue
        for model in provider.models:
            if isinstance(model.prices, list) and len(model.prices) > 1:
                for conditional in model.prices[1:]:
                    if isinstance(conditional.constraint, types.StartDateConstraint):
                        start = conditional.constraint.start_date
                        before = datetime(start.year, start.month, start.day, tzinfo=UTC) - timedelta(days=1)
                        return provider.id, model.id, before, before + timedelta(days=2)
    raise AssertionError("the table has no dated price change")


def test_the_prices_in_force_on_the_usages_day_apply():
    provider, model, before, after = _a_model_whose_price_changed()
    usage = TokenUsage(1_000_000, 0, 0, 1_000_000)
    old = pricing.price_usage(model, usage, provider=provider, when=before, single_request=True)
    new = pricing.price_usage(
        model, usage, provider=provider, when=after.strftime("%Y-%m-%dT%H:%M:%S.000Z"), single_request=True
    )
    assert old.usd == library_price(model, provider, usage, before).total_price
    assert new.usd == library_price(model, provider, usage, after).total_price
    assert old.usd != new.usd and (old.price_date, new.price_date) == (
        before.date().isoformat(),
        after.date().isoformat(),
    )


def test_a_timestamp_with_an_offset_is_priced_on_its_utc_day():
    late = pricing.price_usage("gpt-5", TokenUsage(10, 0, 0, 1), when="2026-11-30T23:30:00-05:00")
    assert late.price_date == "2026-12-01"


def test_long_context_tiers_apply_per_request_only():
    """A turn's usage sums requests: above a tier's threshold it is priced at base rates (and
    says so); as one request it takes the library's tier price."""
    usage = TokenUsage(300_000, 0, 0, 1_000)
    turn = pricing.price_usage("claude-sonnet-4-5", usage, provider_hint="claude", when=DAY)
    one = pricing.price_usage("claude-sonnet-4-5", usage, provider_hint="claude", when=DAY, single_request=True)
    table = library_price("claude-sonnet-4-5", "anthropic", usage)
    assert one.usd == table.total_price
    assert turn.usd == (300_000 * table.model_price.input_mtok.base + 1_000 * table.model_price.output_mtok.base) / MTOK
    assert turn.usd < one.usd and "base rates" in turn.note and one.note is None


# ---------------------------------------------------------------------------------------------
# Reported costs


def test_a_reported_cost_wins_over_the_estimate():
    event = {
        "type": "turn.completed",
        "model": "gpt-5-codex",
        "cost_usd": 0.0123,
        "usage": {"input_tokens": 1_000, "cached_input_tokens": 0, "output_tokens": 100},
    }
    cost = pricing.turn_cost(event, provider_hint="codex")
    assert (cost.usd, cost.source, cost.price_version) == (Decimal("0.0123"), CostSource.REPORTED, None)
    del event["cost_usd"]
    assert pricing.turn_cost(event, provider_hint="codex").source is CostSource.ESTIMATED


@pytest.mark.parametrize("key", pricing.REPORTED_COST_KEYS)
def test_every_reported_cost_field_is_read(key):
    cost = pricing.reported_cost({"type": "thread.completed", key: 2})
    assert (cost.usd, cost.source) == (Decimal(2), CostSource.REPORTED) and key in cost.note


@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf"), "0.5", True, [1]])
def test_a_reported_cost_that_is_not_a_cost_is_ignored_and_logged(bad, caplog):
    assert pricing.reported_cost({"type": "turn.completed", "cost_usd": bad}) is None
    assert "ignored a reported cost" in caplog.text
    estimated = pricing.turn_cost(
        {"type": "turn.completed", "cost_usd": bad, "model": "gpt-5", "usage": {"input_tokens": 10, "output_tokens": 1}}
    )
    assert estimated.source is CostSource.ESTIMATED


def test_a_sessions_reported_total_replaces_the_sum_of_its_turns():
    turns = [pricing.price_usage("gpt-5", TokenUsage(1_000, 0, 0, 10), when=DAY) for _ in range(3)]
    thread = {
        "type": "thread.completed",
        "thread_id": "t",
        "session_id": "t",
        "subtype": "success",
        "outcome_code": "completed",
        "usage": {},
        "num_turns": 3,
        "total_cost_usd": 0.5,
    }
    summary = pricing.session_cost(turns, thread)
    assert (summary.usd, summary.source, summary.priced) == (Decimal("0.5"), CostSource.REPORTED, 1)
    without = pricing.session_cost(turns, {**thread, "total_cost_usd": None})
    assert without.usd == sum(t.usd for t in turns) and without.source is CostSource.ESTIMATED


def test_a_sum_keeps_what_it_lacks():
    known = pricing.price_usage("gpt-5", TokenUsage(1_000, 0, 0, 10), when=DAY)
    unknown = pricing.price_usage("mystery-model-x", TokenUsage(1_000, 0, 0, 10), when=DAY)
    reported = Cost(Decimal("0.25"), CostSource.REPORTED)
    partial = pricing.summarize([known, unknown, reported])
    assert (partial.usd, partial.source, partial.complete) == (known.usd + Decimal("0.25"), CostSource.ESTIMATED, False)
    assert (partial.unpriced_models, partial.price_versions) == (("mystery-model-x",), (known.price_version,))
    nothing = pricing.summarize([unknown, unknown])
    assert (nothing.usd, nothing.source) == (None, CostSource.UNPRICED)
    assert pricing.summarize([reported]).source is CostSource.REPORTED


# ---------------------------------------------------------------------------------------------
# Provenance, offline


def test_the_price_version_names_the_package_and_its_data():
    digest = hashlib.sha256(Path(gp_data.__file__).read_bytes()).hexdigest()
    cost = pricing.price_usage("gpt-5", TokenUsage(10, 0, 0, 1), when=DAY)
    assert cost.price_version == f"genai-prices {genai_prices.__version__} (data {digest[:12]})"
    assert cost.to_dict()["price_version"] == cost.price_version and cost.to_dict()["source"] == "estimated"


def test_prices_stay_the_bundled_ones_whatever_another_library_loads():
    """A price update started by another library (which replaces genai-prices' process-wide
    snapshot) does not change memstore's figures, so their price_version stays true."""
    usage = TokenUsage(50_000, 10_000, 0, 2_000)
    before = pricing.price_usage("o4-mini", usage, when=DAY)
    cheap = [p for p in gp_data.providers if p.id != "openai"]  # a "downloaded" table without OpenAI
    data_snapshot.set_custom_snapshot(data_snapshot.DataSnapshot(providers=cheap, from_auto_update=True))
    try:
        pricing._rates_on_day.cache_clear()
        assert pricing.price_usage("o4-mini", usage, when=DAY) == before
    finally:
        data_snapshot.set_custom_snapshot(None)


def test_nothing_is_fetched_and_no_updater_runs():
    """In a fresh interpreter whose sockets refuse to connect, importing and pricing works, no
    connection is attempted and genai-prices' background updater never starts."""
    script = textwrap.dedent("""
        import socket, threading
        attempts = []
        def refuse(*args, **kwargs):
            attempts.append(args)
            raise OSError("network is closed in this test")
        socket.socket.connect = refuse
        socket.socket.connect_ex = refuse
        socket.create_connection = refuse
        socket.getaddrinfo = refuse
        from memstore import pricing
        for model, agent in [("gpt-5-codex", "codex"), ("claude-opus-4-1", "claude"), ("nobody-knows-me", None)]:
            pricing.price_usage(model, (1000, 100, 0, 50), provider_hint=agent)
        import genai_prices.update_prices as up
        assert up._shared_updater.thread is None and up._shared_updater.ref_count == 0
        assert not [t for t in threading.enumerate() if t.name.startswith("genai_prices")]
        assert attempts == [], attempts
        print("offline ok")
    """)
    result = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "offline ok"


def test_without_genai_prices_estimates_fail_clearly_and_reported_costs_still_work():
    script = textwrap.dedent("""
        import sys
        sys.modules["genai_prices"] = None  # as if not installed
        from memstore import pricing
        assert pricing.reported_cost({"total_cost_usd": 1.5}).usd == 1.5
        try:
            pricing.price_usage("gpt-5", (10, 0, 0, 1))
        except pricing.PricingUnavailable as exc:
            print(exc)
    """)
    result = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 0, result.stderr
    assert "pip install genai-prices" in result.stdout


def test_lookups_are_cached_per_model_and_day():
    pricing._rates_on_day.cache_clear()
    for n in range(100):
        pricing.price_usage(
            "gpt-5-codex",
            TokenUsage(n * 10, n, 0, n),
            provider_hint="codex",
            when=f"2026-11-30T08:{n % 60:02d}:00.000Z",
        )
    info = pricing._rates_on_day.cache_info()
    assert (info.misses, info.hits) == (1, 99)


# ---------------------------------------------------------------------------------------------
# Bad input, SQL


@pytest.mark.parametrize("usage", [(1, 2, 3), (-1, 0, 0, 0), (1.5, 0, 0, 0), "1000", None])
def test_a_usage_that_is_not_one_is_refused_clearly(usage):
    with pytest.raises(PricingInputError):
        pricing.price_usage("gpt-5", usage)


def test_a_usage_object_counts_missing_or_malformed_fields_as_zero_like_the_index():
    cost = pricing.price_usage(
        "gpt-5", {"input_tokens": 1_000, "cached_input_tokens": None, "output_tokens": -5}, when=DAY
    )
    assert cost.usd == pricing.price_usage("gpt-5", TokenUsage(1_000, 0, 0, 0), when=DAY).usd


def test_a_time_that_is_not_one_is_refused_clearly():
    with pytest.raises(PricingInputError, match="RFC 3339"):
        pricing.price_usage("gpt-5", TokenUsage(1, 0, 0, 1), when="yesterday")


def test_turn_cost_refuses_events_that_are_not_turn_ends():
    with pytest.raises(PricingInputError):
        pricing.turn_cost({"type": "item.completed"})


def test_sql_functions_price_rows_and_leave_unknown_models_null(tmp_path):
    """In a real SQLite database: dollars per model with SUM over the function, NULL (not 0)
    for an unknown model, and the reported column winning through COALESCE."""
    conn = sqlite3.connect(tmp_path / "catalog.db")
    pricing.register_sql_functions(conn)
    conn.execute(
        "CREATE TABLE turns (agent TEXT, model TEXT, ended_at TEXT, input_tokens INT, cached_input_tokens INT,"
        " cache_creation_tokens INT, output_tokens INT, reported_usd REAL)"
    )
    rows = [
        ("codex", "gpt-5-codex", "2026-11-30T08:00:00.000Z", 50_000, 40_000, 0, 1_000, None),
        ("codex", "gpt-5-codex", "2026-11-30T09:00:00.000Z", 20_000, 5_000, 0, 500, None),
        ("claude", "claude-opus-4-1", "2026-11-30T10:00:00.000Z", 30_000, 20_000, 5_000, 800, None),
        ("claude", "claude-opus-4-1", "2026-11-30T11:00:00.000Z", 30_000, 20_000, 5_000, 800, 0.75),
        ("vtcode", "local-llama", "2026-11-30T12:00:00.000Z", 9_000, 0, 0, 100, None),
    ]
    conn.executemany("INSERT INTO turns VALUES (?,?,?,?,?,?,?,?)", rows)
    args = "model, agent, input_tokens, cached_input_tokens, cache_creation_tokens, output_tokens, ended_at"
    got = dict(
        conn.execute(
            f"SELECT model, SUM(COALESCE(reported_usd, memstore_cost_usd({args}))) FROM turns GROUP BY model"
        ).fetchall()
    )
    expected = {}
    for agent, model, ts, *counts, reported in rows:
        cost = (
            float(reported)
            if reported is not None
            else pricing.price_usage(model, TokenUsage(*counts), provider_hint=agent, when=ts).usd
        )
        expected[model] = None if cost is None else (expected.get(model) or 0) + float(cost)
    assert got["gpt-5-codex"] == pytest.approx(expected["gpt-5-codex"], rel=1e-12)
    assert got["claude-opus-4-1"] == pytest.approx(expected["claude-opus-4-1"], rel=1e-12)
    assert got["local-llama"] is None
    assert conn.execute(f"SELECT memstore_cost_source({args}) FROM turns WHERE agent = 'vtcode'").fetchone() == (
        "unpriced",
    )
    assert conn.execute("SELECT memstore_price_version()").fetchone()[0] == pricing.price_data().price_version
    conn.close()


def test_concurrent_pricing_gives_the_same_figures():
    """Threads pricing at once (the explorer serves requests in threads) share the caches safely."""
    pricing._rates_on_day.cache_clear()
    usages = [TokenUsage(1_000 * n, 100 * n, 10 * n, 50 * n) for n in range(1, 200)]
    expected = [pricing.price_usage("claude-opus-4-1", u, provider_hint="claude", when=DAY).usd for u in usages]
    pricing._rates_on_day.cache_clear()
    results: list[list] = []

    def work():
        results.append(
            [pricing.price_usage("claude-opus-4-1", u, provider_hint="claude", when=DAY).usd for u in usages]
        )

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [expected] * 4


@pytest.mark.parametrize("when", ["2026-13-01T00:00:00.000Z", "2026-02-30T10:00:00.000Z", "2026-11-30"])
def test_an_impossible_date_is_refused_clearly(when):
    with pytest.raises(PricingInputError):
        pricing.price_usage("gpt-5", TokenUsage(1, 0, 0, 1), when=when)
