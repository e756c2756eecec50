"""Charts as inline SVG, drawn on the server: no script, no network at run time.

Every piece of text that goes into the SVG (labels, tooltips, links) is escaped here, since the
result is marked safe for the templates.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Optional

from markupsafe import Markup, escape


@dataclass
class Bar:
    """One bar: stacked ``segments`` of ``(value, css class)``, a ``label`` under it (may be
    empty), a ``tooltip`` and an optional ``href``."""

    label: str
    segments: list[tuple[float, str]]
    tooltip: str = ""
    href: Optional[str] = None
    total: float = field(init=False)

    def __post_init__(self) -> None:
        self.total = sum(max(0.0, float(v)) for v, _ in self.segments)


def human(n: float) -> str:
    """``1234567`` → ``1.2M``: short numbers for axes and tooltips."""
    n = float(n)
    for limit, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= limit:
            value = n / limit
            return f"{value:.1f}{suffix}" if value < 100 else f"{value:.0f}{suffix}"
    return f"{n:.0f}"


def bar_chart(
    bars: Sequence[Bar],
    *,
    title: str,
    legend: Sequence[tuple[str, str]] = (),
    width: int = 720,
    height: int = 180,
    label_every: int = 1,
    y_unit: str,
    x_unit: str,
    tick: Callable[[float], str] = lambda v: human(v),
) -> Markup:
    """A bar chart of ``bars`` as an ``<svg>`` element (``legend``: ``(css class, text)``). Both
    axes are named with their unit: ``y_unit`` (what a bar measures, e.g. ``tokens``) up the
    value axis, ``x_unit`` (what a bar is, e.g. ``day (UTC)``) under the labels; ``tick``
    formats the value axis's ticks."""
    left, right, top, bottom = 58, 8, 10, 46
    plot_w, plot_h = width - left - right, height - top - bottom
    peak = max((b.total for b in bars), default=0.0) or 1.0
    slot = plot_w / max(len(bars), 1)
    bar_w = max(1.0, min(36.0, slot * 0.8))
    parts = [
        f'<svg class="ms-chart" role="img" viewBox="0 0 {width} {height}" width="100%" '
        f'preserveAspectRatio="xMinYMin meet" xmlns="http://www.w3.org/2000/svg">',
        f"<title>{escape(title)}</title>",
        f'<line class="axis" x1="{left}" y1="{top + plot_h}" x2="{width - right}" y2="{top + plot_h}"/>',
        f'<line class="axis" x1="{left}" y1="{top}" x2="{left}" y2="{top + plot_h}"/>',
        f'<text class="tick" x="{left - 4}" y="{top + 8}" text-anchor="end">{escape(tick(peak))}</text>',
        f'<text class="tick" x="{left - 4}" y="{top + plot_h}" text-anchor="end">{escape(tick(0))}</text>',
        f'<text class="unit" x="10" y="{top + plot_h / 2:.0f}" text-anchor="middle" '
        f'transform="rotate(-90 10 {top + plot_h / 2:.0f})">{escape(y_unit)}</text>',
        f'<text class="unit" x="{width - right}" y="{top + plot_h + 26}" text-anchor="end">{escape(x_unit)}</text>',
    ]
    for i, bar in enumerate(bars):
        x = left + i * slot + (slot - bar_w) / 2
        y: float = top + plot_h
        group = [f"<g><title>{escape(bar.tooltip or bar.label)}</title>"]
        for value, cls in bar.segments:
            h = plot_h * max(0.0, float(value)) / peak
            if h <= 0:
                continue
            y -= h
            group.append(f'<rect class="{escape(cls)}" x="{x:.1f}" y="{y:.1f}" width="{bar_w:.1f}" height="{h:.1f}"/>')
        if bar.total == 0:
            group.append(f'<rect class="empty" x="{x:.1f}" y="{top + plot_h - 1:.1f}" width="{bar_w:.1f}" height="1"/>')
        group.append("</g>")
        body = "".join(group)
        if bar.href:
            body = f'<a href="{escape(bar.href)}">{body}</a>'
        parts.append(body)
        if bar.label and i % max(1, label_every) == 0:
            parts.append(
                f'<text class="tick" x="{x + bar_w / 2:.1f}" y="{top + plot_h + 14}" '
                f'text-anchor="middle">{escape(bar.label)}</text>'
            )
    lx = left
    for cls, text in legend:
        parts.append(
            f'<rect class="{escape(cls)}" x="{lx}" y="{height - 12}" width="10" height="10"/>'
            f'<text class="tick" x="{lx + 14}" y="{height - 3}">{escape(text)}</text>'
        )
        lx += 24 + 7 * len(text)
    parts.append("</svg>")
    return Markup("".join(parts))


def tokens_per_day_chart(days: Sequence[dict]) -> Markup:
    """Token usage per day (uncached input, cached input, output), from the home page's
    ``tokens_per_day`` rows."""
    bars = []
    for row in days:
        inp, cached, out = (
            row.get("input_tokens") or 0,
            row.get("cached_input_tokens") or 0,
            row.get("output_tokens") or 0,
        )
        bars.append(
            Bar(
                row["day"][5:],
                [(max(0, inp - cached), "input"), (cached, "cached"), (out, "output")],
                f"{row['day']}: {inp:,} input ({cached:,} cached), {out:,} output, {row.get('turns', 0)} turns",
            )
        )
    return bar_chart(
        bars,
        title="Tokens per day",
        label_every=max(1, len(bars) // 10),
        legend=(("input", "input (uncached)"), ("cached", "input (cached)"), ("output", "output")),
        y_unit="tokens",
        x_unit="day (UTC, MM-DD)",
    )


def cost_per_day_chart(days: Sequence[dict], cost: dict) -> Markup:
    """Estimated cost per day in USD (the ``usd`` of the home page's ``tokens_per_day`` rows),
    the price table named in the title and the legend."""
    bars = []
    for row in days:
        value = row.get("usd") or 0.0
        tip = f"{row['day']}: {dollars(value)} estimated, {row.get('turns', 0)} turns"
        bars.append(Bar(row["day"][5:], [(value, "cost")], tip))
    version = cost.get("price_version") or "no price table"
    return bar_chart(
        bars,
        title=f"Estimated cost per day (USD, {version})",
        label_every=max(1, len(bars) // 10),
        legend=(("cost", f"estimated from tokens ({version})"),),
        y_unit="USD (estimated)",
        x_unit="day (UTC, MM-DD)",
        tick=dollars,
    )


def dollars(value: float) -> str:
    """``12.3`` → ``$12.30``; amounts below a cent keep four decimals."""
    if value and abs(value) < 0.01:
        return f"${value:.4f}"
    return f"${value:,.2f}"


def turns_chart(turns: Sequence[dict]) -> Markup:
    """A session's timeline: one bar per turn (its tokens), coloured by outcome, linking to it."""
    bars = []
    for t in turns:
        status = t.get("status") or "open"
        cls = {"completed": "ok", "failed": "failed", "aborted": "aborted", "interrupted": "aborted"}.get(
            status, "open"
        )
        duration = t.get("duration_ms")
        seconds = f", {duration / 1000:.0f} s" if isinstance(duration, int) else ""
        bars.append(
            Bar(
                str(t["number"]),
                [((t.get("input_tokens") or 0) + (t.get("output_tokens") or 0), cls)],
                f"turn {t['number']}: {status}{seconds}, {t.get('input_tokens') or 0:,} input, "
                f"{t.get('output_tokens') or 0:,} output tokens",
                href=t.get("url"),
            )
        )
    return bar_chart(
        bars,
        title="Tokens per turn",
        height=160,
        label_every=max(1, len(bars) // 20),
        legend=(("ok", "completed"), ("failed", "failed"), ("aborted", "aborted"), ("open", "open")),
        y_unit="tokens",
        x_unit="turn",
    )
