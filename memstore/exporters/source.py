"""What the exporters read: the catalog, in one consistent snapshot, with each turn priced and
each text redacted.

The catalog is refreshed first (through :meth:`memstore.Store.refresh`), then read in one read
transaction, so a refresh running meanwhile (Datasette's, say) cannot show an export half of a
session's update. Rows come from the catalog's tables and views exactly as SQL sees them: the
``tool_calls`` and ``commands`` views decide what failed, ``token_usage_daily``'s rule decides
a turn's day. The session logs are read only for what the catalog does not keep (a tool's
arguments, the cost an agent reported), one record at a time through :mod:`memstore.reader`.

Costs: each turn is priced by :func:`memstore.pricing.price_usage` with the arguments the SQL
function ``memstore_cost_usd`` takes, in the same order (the turn's model, the session's agent
as the provider hint, the four token counts, and the turn's end time, else its start), so a
turn's figure here is the one ``memstore_cost_usd(...)`` gives in SQL.
"""

from __future__ import annotations

import hashlib
import logging
import os
import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass, fields
from decimal import ROUND_HALF_EVEN, Decimal
from pathlib import Path
from typing import Any, Optional, Union

import orjson

from .. import __version__
from ..errors import EventNotFound, MemstoreError, SessionNotFound, StoreIOError
from ..identity import StoreIdentity, machine_id, store_identity
from ..layout import catalog_path, sessions_root
from ..pricing import Cost, CostSource, PricingInputError, price_usage
from ..redact import CONFIG_FILE, Redactor, redactor_for

logger = logging.getLogger(__name__)

PathArg = Union[str, "os.PathLike[str]"]

# Dollars are exported as exact decimals with this many places (a pico-dollar): every price of
# the price table times a whole number of tokens fits, so nothing is rounded in practice.
USD_SCALE = 12
_USD_QUANTUM = Decimal(1).scaleb(-USD_SCALE)

# The item types each kind of row is made of (as the catalog's views say).
TOOL_ITEM_TYPES = ("tool_invocation", "tool_call", "mcp_tool_call")


@dataclass(frozen=True)
class SessionRow:
    """One row of the catalog's ``sessions`` table."""

    session_id: str
    directory: str
    status: Optional[str]
    created_at: Optional[str]
    updated_at: Optional[str]
    turn_count: Optional[int]
    event_count: Optional[int]
    retained_turn_base: Optional[int]
    generation: Optional[int]
    agent: Optional[str]
    agent_version: Optional[str]
    cwd: Optional[str]
    git_branch: Optional[str]
    source_path: Optional[str]
    parent_session_id: Optional[str]
    title: Optional[str]
    model: Optional[str]
    turns_failed: Optional[int]
    input_tokens: Optional[int]
    cached_input_tokens: Optional[int]
    cache_creation_tokens: Optional[int]
    output_tokens: Optional[int]
    log_bytes: Optional[int]

    @property
    def version(self) -> str:
        """What changes whenever the session's exported rows can: a hash of its generation, the
        size of its log, its counts, its times and its status. Appending, a cap rewrite, a
        rebuild, an import into a new generation and retention's marking all change it."""
        key = (
            self.session_id,
            self.generation,
            self.log_bytes,
            self.event_count,
            self.turn_count,
            self.retained_turn_base,
            self.status,
            self.created_at,
            self.updated_at,
        )
        return hashlib.sha256(orjson.dumps(key)).hexdigest()[:16]

    @property
    def agent_name(self) -> str:
        return self.agent or "memstore"


SESSION_COLUMNS = tuple(f.name for f in fields(SessionRow))


@dataclass(frozen=True)
class TurnRow:
    """One row of the catalog's ``turns`` table, priced."""

    number: int
    status: Optional[str]
    started_at: Optional[str]
    ended_at: Optional[str]
    duration_ms: Optional[int]
    event_count: Optional[int]
    first_seq: Optional[int]
    last_seq: Optional[int]
    input_tokens: int
    cached_input_tokens: int
    cache_creation_tokens: int
    output_tokens: int
    error: Optional[str]
    model: Optional[str]
    cost: Cost

    @property
    def day(self) -> Optional[str]:
        """The turn's day as the catalog's ``token_usage_daily`` view counts it: the date of its
        start, else of its end."""
        return day_of(self.started_at or self.ended_at)

    @property
    def cost_usd(self) -> Optional[Decimal]:
        return exact_usd(self.cost.usd)


_TURN_FIELDS = tuple(f.name for f in fields(TurnRow) if f.name != "cost")
_TURN_SELECT = (
    "SELECT number, status, started_at, ended_at, duration_ms, event_count, first_seq, last_seq, "
    "input_tokens, cached_input_tokens, cache_creation_tokens, output_tokens, error, model "
    "FROM turns WHERE session_id = ? ORDER BY number"
)


def day_of(ts: Optional[str]) -> Optional[str]:
    """``YYYY-MM-DD`` of a memstore timestamp (its first ten characters, as the catalog's
    views take them), ``None`` when there is none or it does not start with a date."""
    if not ts or len(ts) < 10:
        return None
    day = ts[:10]
    if not (day[:4].isdigit() and day[4] == "-" and day[5:7].isdigit() and day[7] == "-" and day[8:].isdigit()):
        return None
    return day


def exact_usd(usd: Optional[Decimal]) -> Optional[Decimal]:
    """``usd`` with :data:`USD_SCALE` decimal places (``None`` stays ``None``)."""
    return None if usd is None else usd.quantize(_USD_QUANTUM, rounding=ROUND_HALF_EVEN)


def price_turn(model: Any, agent: Any, counts: Iterable[Any], when: Any) -> Cost:
    """What a turn cost, exactly as ``memstore_cost_usd(model, agent, input, cached,
    cache_writes, output, when)`` prices it in SQL (see the module doc): counts that are not
    non-negative integers count 0, a missing time prices at today's prices, and a time that
    is not one leaves the turn unpriced (logged)."""
    a, b, c, d = (v if type(v) is int and v >= 0 else 0 for v in counts)
    name = model if isinstance(model, str) else None
    try:
        return price_usage(
            name,
            (a, b, c, d),
            provider_hint=agent if isinstance(agent, str) else None,
            when=when if isinstance(when, str) and when else None,
        )
    except PricingInputError as exc:
        logger.warning("cost of a turn of %r left unpriced: %s", model, exc)
        return Cost(None, CostSource.UNPRICED, model=name, note=str(exc))


class Redaction:
    """The store's redactor, with a fingerprint of its rules (an export made under other rules
    is written again whole)."""

    def __init__(self, root: PathArg):
        self.redactor: Redactor = redactor_for(root)
        try:
            config = (Path(root) / CONFIG_FILE).read_bytes()
        except FileNotFoundError:
            config = b""
        except OSError as exc:
            raise StoreIOError.from_os_error("read", Path(root) / CONFIG_FILE, exc) from exc
        self.fingerprint = hashlib.sha256(__version__.encode() + b"\0" + config).hexdigest()[:16]

    def text(self, value: Optional[str]) -> Optional[str]:
        return self.redactor.redact_text(value) if isinstance(value, str) and value else value

    def value(self, value: Any) -> Any:
        return self.redactor.redact_value(value)


class CatalogSnapshot:
    """The catalog of the store at ``root``, refreshed, then read in one read transaction.
    Close it (or use it as a context manager)."""

    def __init__(self, root: PathArg, *, refresh: bool = True):
        from ..store import Store

        self.root = Path(root).expanduser().absolute()
        if not self.root.is_dir():
            raise StoreIOError("export", self.root, "no such store directory")
        self.refresh_errors: list[tuple[str, str]] = []
        if refresh:
            report = Store(self.root).refresh()
            self.refresh_errors = list(report.errors)
            for name, reason in report.errors:
                logger.warning("export: session directory %s is exported as the catalog last saw it: %s", name, reason)
        path = catalog_path(self.root)
        if not path.is_file():
            raise StoreIOError("export", path, "the store has no catalog (refresh it first)")
        try:
            self.conn = sqlite3.connect(
                f"{path.as_uri()}?mode=ro", uri=True, isolation_level=None, check_same_thread=False
            )
            self.conn.execute("PRAGMA busy_timeout=10000")
            self.conn.execute("BEGIN")
            self._sessions = [
                SessionRow(*row)
                for row in self.conn.execute(f"SELECT {', '.join(SESSION_COLUMNS)} FROM sessions ORDER BY directory")
            ]
        except sqlite3.Error as exc:
            self.close()
            raise StoreIOError("read catalog", path, str(exc)) from exc
        self.identity: StoreIdentity = store_identity(self.root)
        self.machine_id = machine_id()
        self.redaction = Redaction(self.root)

    def __enter__(self) -> CatalogSnapshot:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        conn = getattr(self, "conn", None)
        if conn is not None:
            try:
                conn.rollback()
            except sqlite3.Error:
                pass
            conn.close()
            self.conn = None  # type: ignore[assignment]

    def _query(self, sql: str, params: tuple = ()) -> list[tuple]:
        try:
            return self.conn.execute(sql, params).fetchall()
        except sqlite3.Error as exc:
            raise StoreIOError("read catalog", catalog_path(self.root), str(exc)) from exc

    # -- what a session holds --------------------------------------------------------------

    def sessions(self) -> list[SessionRow]:
        """Every session of the catalog, in directory-name order."""
        return list(self._sessions)

    def turns(self, session: SessionRow) -> list[TurnRow]:
        """The session's turns in order, each priced (see :func:`price_turn`)."""
        return [
            TurnRow(
                **dict(zip(_TURN_FIELDS, row)),
                cost=price_turn(row[13], session.agent_name, row[8:12], row[3] or row[2]),
            )
            for row in self._query(_TURN_SELECT, (session.session_id,))
        ]

    def events(self, session: SessionRow) -> list[tuple]:
        """``(seq, turn, ts, type, item_type, item_id, name, status, exit_code, offset, length)``
        of every event, in log order."""
        return self._query(
            "SELECT seq, turn, ts, type, item_type, item_id, name, status, exit_code, offset, length "
            "FROM events WHERE session_id = ? ORDER BY seq",
            (session.session_id,),
        )

    def tool_calls(self, session: SessionRow) -> list[tuple]:
        """``(seq, turn, ts, item_type, tool, outcome, failed)`` from the ``tool_calls`` view."""
        return self._query(
            "SELECT seq, turn, ts, item_type, tool, outcome, failed FROM tool_calls WHERE session_id = ? ORDER BY seq",
            (session.session_id,),
        )

    def commands(self, session: SessionRow) -> list[tuple]:
        """``(seq, turn, ts, command, exit_code, status, failed)`` from the ``commands`` view."""
        return self._query(
            "SELECT seq, turn, ts, command, exit_code, status, failed FROM commands WHERE session_id = ? ORDER BY seq",
            (session.session_id,),
        )

    def file_changes(self, session: SessionRow) -> list[tuple]:
        """``(seq, turn, ts, path, kind)`` of every changed file (the time is its event's)."""
        return self._query(
            "SELECT f.seq, f.turn, e.ts, f.path, f.kind FROM file_changes f "
            "LEFT JOIN events e ON e.session_id = f.session_id AND e.seq = f.seq "
            "WHERE f.session_id = ? ORDER BY f.seq, f.rowid",
            (session.session_id,),
        )

    def event_texts(self, session: SessionRow) -> dict[int, str]:
        """The text the catalog holds of each event that has one (its search chunks, joined in
        order: a window that continues a cut line is joined without a line break)."""
        texts: dict[int, list[str]] = {}
        last_line: dict[int, int] = {}
        for seq, start_line, end_line, text in self._query(
            "SELECT seq, start_line, end_line, text FROM chunks WHERE session_id = ? AND source = 'event' "
            "ORDER BY seq, part",
            (session.session_id,),
        ):
            parts = texts.setdefault(seq, [])
            if parts:
                parts.append("" if start_line == last_line.get(seq) else "\n")
            parts.append(text)
            last_line[seq] = end_line
        return {seq: "".join(parts) for seq, parts in texts.items()}


def read_events(root: Path, session: SessionRow, wanted: dict[int, tuple[str, Optional[str]]]) -> dict[int, dict]:
    """The events of ``session`` with the seqs of ``wanted`` (seq -> the type and item id the
    catalog says it has), read from its log through a :mod:`memstore.reader`. An event that is
    no longer there, or is not what the catalog said (the log was rewritten since the refresh),
    is left out and logged."""
    from ..reader import read_session_dir

    found: dict[int, dict] = {}
    if not wanted:
        return found
    try:
        with read_session_dir(sessions_root(root) / session.directory) as reader:
            for seq, (kind, item_id) in sorted(wanted.items()):
                try:
                    event = reader.record(seq).event
                except EventNotFound:
                    logger.warning("export: event %d of session %s is no longer in its log", seq, session.session_id)
                    continue
                item = event.get("item")
                got_id = item.get("id") if isinstance(item, dict) else None
                if event.get("type") != kind or (item_id is not None and got_id != item_id):
                    logger.warning(
                        "export: event %d of session %s changed since the catalog read it; left out",
                        seq,
                        session.session_id,
                    )
                    continue
                found[seq] = event
    except SessionNotFound:
        logger.warning("export: session %s is gone from the store; its log cannot be read", session.session_id)
    except MemstoreError as exc:
        logger.warning("export: cannot read the log of session %s: %s", session.session_id, exc)
    return found
