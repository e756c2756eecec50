"""What a refresh tells its caller: what changed, what it could not copy, how far it got."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Optional


@dataclass
class RefreshReport:
    """What a refresh changed: sessions ``added``, ``updated`` (grew), ``recopied`` (rewritten),
    ``removed`` and left ``unchanged``, and the session directories it could not copy
    (``errors``: directory name and reason; they are tried again at the next sweep, and searches
    report them as missing until then). ``mode`` says which sessions it looked at (see
    :class:`memstore.catalog.RefreshMode`)."""

    added: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    recopied: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    unchanged: int = 0
    errors: list[tuple[str, str]] = field(default_factory=list)
    mode: Optional[str] = None  # which sessions it looked at: "feed", "sweep" or "full"
    unrecorded: bool = False  # the errors could not be recorded in the catalog (it could not be written)

    @property
    def changed(self) -> bool:
        return bool(self.added or self.updated or self.recopied or self.removed)


@dataclass(frozen=True)
class MissingSession:
    """A session directory a search could not look at: ``directory`` (its name under
    ``sessions/``), the session's id when known, and ``reason`` (what went wrong, naming the
    file). Its rows in the catalog, if any, are as an earlier refresh copied them."""

    directory: str
    session_id: Optional[str]
    reason: str

    def to_dict(self) -> dict:
        return asdict(self)


def recorded_missing(conn: sqlite3.Connection) -> list[MissingSession]:
    """The sessions the catalog behind ``conn`` records as not copied (``catalog_errors``), in
    directory order; ``[]`` for a catalog without that table (an older layout)."""
    try:
        rows = conn.execute("SELECT directory, session_id, reason FROM catalog_errors ORDER BY directory").fetchall()
    except sqlite3.OperationalError as exc:
        if "no such table" in str(exc):
            return []
        raise
    return [MissingSession(*row) for row in rows]


@dataclass(frozen=True)
class CatalogProgress:
    """How far a refresh is: sessions copied of those to copy, bytes of log read of those to
    read, and the time since it started. ``rate`` is bytes per second, ``eta`` the seconds left
    at that rate (``None`` until there is a rate)."""

    sessions_done: int
    sessions_total: int
    bytes_done: int
    bytes_total: int
    elapsed: float

    @property
    def rate(self) -> Optional[float]:
        return self.bytes_done / self.elapsed if self.elapsed > 0 and self.bytes_done else None

    @property
    def eta(self) -> Optional[float]:
        rate = self.rate
        if rate is None:
            return None
        return max(0.0, (self.bytes_total - self.bytes_done) / rate)

    def describe(self) -> str:
        """One line for people: ``120/500 sessions, 45/180 MB, 12.3 MB/s, about 11 s left``."""
        parts = [
            f"{self.sessions_done:,}/{self.sessions_total:,} sessions",
            f"{self.bytes_done / 1e6:,.0f}/{self.bytes_total / 1e6:,.0f} MB",
        ]
        if self.rate is not None:
            parts.append(f"{self.rate / 1e6:,.1f} MB/s")
        if self.eta is not None:
            parts.append(f"about {self.eta:,.0f} s left")
        return ", ".join(parts)


ProgressCallback = Optional[Callable[[int, int], None]]
"""``progress(done, total)``: sessions looked at of those to look at."""
CatalogProgressCallback = Optional[Callable[[CatalogProgress], None]]
"""``on_progress(CatalogProgress)``: sessions and bytes, with a rate and an ETA."""
