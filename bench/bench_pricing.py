"""Pricing a million turns, against building the same usage tuples.

    python bench/bench_pricing.py [--turns 1000000] [--repeat 3] [--library-sample 20000]

The turns are what a store of Codex and Claude Code sessions holds, as the catalog reads them
(agent, model, turn end time, the four usage counters): 90 days of turns; Claude turns with
large cache reads and some cache writes, Codex turns whose cached input is part of their
input; six models of the two agents plus 2% of turns of a model the table does not know.

Measured, alternating, median of the repetitions:

- ``baseline``: building each turn's :class:`TokenUsage` from its four counters (what any
  consumer of the usage does, priced or not);
- ``price_usage``: pricing each turn (model matching and the day's prices come from the
  per-(model, day) cache; then the per-class arithmetic and the :class:`Cost`);
- ``genai-prices calc_price``: the library's own call per turn (no cache of ours), on a
  sample, for scale.

Reported: turns priced per second and the ratio of each side to the baseline.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from memstore import pricing  # noqa: E402
from memstore.pricing import TokenUsage  # noqa: E402

MODELS = [  # (agent, model, share of turns)
    ("claude", "claude-sonnet-4-5-20250929", 0.38),
    ("claude", "claude-opus-4-1-20250805", 0.07),
    ("claude", "claude-haiku-4-5-20251001", 0.08),
    ("codex", "gpt-5-codex", 0.20),
    ("codex", "gpt-5.1-codex-max", 0.15),
    ("codex", "gpt-5.3-codex", 0.10),
    ("vtcode", "qwen3-coder-local-q4", 0.02),
]


def make_turns(count: int, seed: int = 19) -> list[tuple[str, str, str, tuple[int, int, int, int]]]:
    """``count`` turns: (agent, model, end time in memstore's format, usage counters)."""
    rng = random.Random(seed)
    start = datetime(2026, 9, 1, tzinfo=UTC)
    agents = [(agent, model) for agent, model, _ in MODELS]
    weights = [share for _, _, share in MODELS]
    turns = []
    for _ in range(count):
        agent, model = rng.choices(agents, weights)[0]
        when = start + timedelta(seconds=rng.randrange(90 * 86400), milliseconds=rng.randrange(1000))
        ts = when.strftime("%Y-%m-%dT%H:%M:%S.") + f"{when.microsecond // 1000:03d}Z"
        requests = max(1, int(rng.lognormvariate(1.5, 0.9)))  # API calls in the turn
        context = int(rng.uniform(8_000, 150_000))
        prompt = requests * context
        if agent == "claude":
            written = int(prompt * rng.uniform(0.01, 0.12))
            cached = int((prompt - written) * rng.uniform(0.80, 0.99))
        else:
            written = 0
            cached = int(prompt * rng.uniform(0.5, 0.95)) // 256 * 256
        output = requests * int(rng.lognormvariate(5.5, 1.0))
        turns.append((agent, model, ts, (prompt, cached, written, output)))
    return turns


def run_baseline(turns) -> float:
    make = TokenUsage._make
    t0 = time.perf_counter()
    for _agent, _model, _ts, counts in turns:
        make(counts)
    return time.perf_counter() - t0


def run_pricing(turns) -> float:
    price = pricing.price_usage
    make = TokenUsage._make
    t0 = time.perf_counter()
    for agent, model, ts, counts in turns:
        price(model, make(counts), provider_hint=agent, when=ts)
    return time.perf_counter() - t0


def run_library(turns) -> float:
    from genai_prices import Usage, calc_price

    providers = {"claude": "anthropic", "codex": "openai"}
    t0 = time.perf_counter()
    for agent, model, ts, (prompt, cached, written, output) in turns:
        if agent not in providers:
            continue
        calc_price(
            Usage(input_tokens=prompt, cache_read_tokens=cached, cache_write_tokens=written, output_tokens=output),
            model,
            provider_id=providers[agent],
            genai_request_timestamp=datetime.fromisoformat(ts.replace("Z", "+00:00")),
        )
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--library-sample", type=int, default=20_000)
    args = parser.parse_args()

    turns = make_turns(args.turns)
    sample = turns[: args.library_sample]
    pricing.price_data()  # import genai-prices outside the timings (a one-off quarter second)
    baseline, priced, library = [], [], []
    for _ in range(args.repeat):
        pricing._rates_on_day.cache_clear()  # each repetition fills the cache again
        baseline.append(run_baseline(turns))
        priced.append(run_pricing(turns))
        library.append(run_library(sample))
    base, ours, lib = (statistics.median(x) for x in (baseline, priced, library))
    lib_per_turn = lib / sum(1 for agent, *_ in sample if agent in ("claude", "codex"))
    print(f"{args.turns:,} turns, {args.repeat} repetitions (median), price table {pricing.price_data().price_version}")
    print(f"  baseline (build TokenUsage)    {base:8.3f} s  {args.turns / base:12,.0f} turns/s   1.0x")
    print(
        f"  price_usage (cached lookups)   {ours:8.3f} s  {args.turns / ours:12,.0f} turns/s  "
        f"{ours / base:6.1f}x baseline"
    )
    print(
        f"  genai-prices calc_price/turn   {lib_per_turn * args.turns:8.3f} s* {1 / lib_per_turn:12,.0f} turns/s "
        f"{lib_per_turn * args.turns / base:6.1f}x baseline  (*from {len(sample):,} turns)"
    )
    print(
        f"  price_usage vs calc_price: {lib_per_turn * args.turns / ours:.1f}x faster; "
        f"cache: {pricing._rates_on_day.cache_info()}"
    )


if __name__ == "__main__":
    main()
