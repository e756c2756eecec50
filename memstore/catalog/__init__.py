"""``<root>/catalog.db``: every session of the store in one database, for search and SQL.

It holds one row per session (its manifest, where it came from, its totals and cost), every
turn (with its cost), every event (the analytics columns), the files changed, and every search
chunk (ranked by memstore's BM25 engine, and in FTS5 for Datasette's ``?_search=``), plus
views for the questions people ask (tool calls and their outcome, failed commands, tokens and
dollars per day and per model). Datasette serves it; :mod:`memstore.search` ranks its chunks.

It is a regenerable view of the sessions: deleting ``catalog.db`` and refreshing gives the
same content. :func:`refresh_catalog` brings it up to date (see :mod:`.refresh` for which
sessions a refresh looks at, :mod:`.copy` for what it reads of each, :mod:`.write` for how it
writes them, a batch per transaction); :class:`LiveCatalog` is one process's warm view of it,
what :class:`memstore.Store` searches through.

- :mod:`.schema`: the file, its tables and views, opening it safely, SQLite's errors;
- :mod:`.scan`: session directories, their stamps, the sweep;
- :mod:`.copy`: one session's rows; :mod:`.cost`: their dollars;
- :mod:`.write`: a batch of sessions in one transaction;
- :mod:`.refresh`: a refresh; :mod:`.live`: the warm state a process keeps;
- :mod:`.report`: what a refresh reports (and a search, of the sessions it could not look at).
"""

from .live import LiveCatalog, catalog_writable, live_catalog
from .refresh import BATCH_BYTES, BATCH_SESSIONS, DEFAULT_SWEEP_SECONDS, RefreshMode, refresh_catalog, run_refresh
from .report import CatalogProgress, MissingSession, RefreshReport, recorded_missing
from .schema import (
    CATALOG_MIGRATIONS,
    layout_problem,
    open_catalog,
    open_catalog_readonly,
    set_aside_catalog,
    storage_error,
)

__all__ = [
    "BATCH_BYTES",
    "BATCH_SESSIONS",
    "CATALOG_MIGRATIONS",
    "DEFAULT_SWEEP_SECONDS",
    "CatalogProgress",
    "LiveCatalog",
    "MissingSession",
    "RefreshMode",
    "RefreshReport",
    "catalog_writable",
    "layout_problem",
    "live_catalog",
    "open_catalog",
    "open_catalog_readonly",
    "recorded_missing",
    "refresh_catalog",
    "run_refresh",
    "set_aside_catalog",
    "storage_error",
]
