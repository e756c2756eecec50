"""The explorer: memstore's pages in Datasette (sessions, turns, events, search, charts).

The Datasette plugin (:mod:`.plugin`, registered by the package's ``datasette`` entry point)
only wires hooks to this package. Pages are plain functions in :mod:`.data` (query → dict), rendered by the templates in
``templates/`` or returned as JSON; charts are inline SVG from :mod:`.charts`.

URLs (each also answers ``.json``): ``/-/memstore`` (sessions), ``/-/memstore/sessions/<id>``,
``/-/memstore/sessions/<id>/turns/<n>``, ``/-/memstore/sessions/<id>/events/<seq>``,
``/-/memstore/search?q=...``.
"""

from .app import ExplorerState, configure, routes, state_of
from .data import event_data, home_data, search_data, session_data, turn_data
from .refresh import CatalogRefresher
from .server import make_datasette, serve
from .urls import Urls, quote_id, unquote_id

__all__ = [
    "ExplorerState",
    "configure",
    "routes",
    "state_of",
    "home_data",
    "session_data",
    "turn_data",
    "event_data",
    "search_data",
    "CatalogRefresher",
    "make_datasette",
    "serve",
    "Urls",
    "quote_id",
    "unquote_id",
]
