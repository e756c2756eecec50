"""The explorer's Datasette side: which store a Datasette shows, its routes and their views.

Each view parses its URL (ids percent-decoded, numbers checked), calls one function of
:mod:`memstore.explorer.data` and returns the dict as JSON (``.json``) or renders it with a
template that extends Datasette's ``base.html`` (Jinja autoescape on). Nothing here writes:
views only read the catalog (Datasette's read-only connections) and the sessions (through the
reader, which never locks or writes).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import sqlite3
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, TypeVar

from ..errors import EventNotFound, InvalidSessionId, MemstoreError, SessionNotFound, TurnNotFound, UnsafePathError
from ..layout import CATALOG_FILE, INDEX_FILE, catalog_path
from . import charts, costs, data, hosts
from .database import CatalogDatabase, adopt_catalog
from .guard import guard_connection as _guard
from .refresh import DEFAULT_INTERVAL, CatalogRefresher
from .urls import PREFIX, Urls, unquote_id

logger = logging.getLogger(__name__)

T = TypeVar("T")

TEMPLATES = Path(__file__).resolve().parent / "templates"
_NOT_FOUND = (SessionNotFound, InvalidSessionId, UnsafePathError, TurnNotFound, EventNotFound, UnicodeDecodeError)


@dataclass
class ExplorerState:
    """What a Datasette instance explores: the store ``root``, the ``database`` name of its
    catalog in Datasette, the background ``refresher`` (``memstore serve`` starts one; the
    plugin's startup starts one when ``auto_refresh`` and the store can be written, every
    ``refresh_interval`` seconds at most) and the ``allowed_hosts`` besides the local ones
    (see :mod:`.hosts`)."""

    root: Path
    database: str
    refresher: Optional[CatalogRefresher] = None
    auto_refresh: bool = True
    refresh_interval: float = DEFAULT_INTERVAL
    allowed_hosts: tuple[str, ...] = ()

    @property
    def catalog(self) -> Path:
        return catalog_path(self.root)


_states: weakref.WeakKeyDictionary[Any, Optional[ExplorerState]] = weakref.WeakKeyDictionary()


def configure(
    datasette,
    root,
    *,
    database: Optional[str] = None,
    refresher: Optional[CatalogRefresher] = None,
    auto_refresh: bool = False,
    refresh_interval: float = DEFAULT_INTERVAL,
    allowed_hosts: Iterable[str] = (),
) -> ExplorerState:
    """Tell the explorer which store ``datasette`` shows (by default: the store whose
    ``catalog.db`` Datasette has open). Nothing refreshes the catalog unless ``refresher`` is
    given or ``auto_refresh`` lets the plugin's startup start one."""
    if database is None:
        found = _find_catalog(datasette)
        database = found[0] if found else "catalog"
    state = ExplorerState(Path(root), database, refresher, auto_refresh, refresh_interval, tuple(allowed_hosts))
    _states[datasette] = state
    return state


def catalog_file(db) -> Optional[Path]:
    """The file of a Datasette database, when it is a memstore catalog (by its name)."""
    path = getattr(db, "file", None) or getattr(db, "path", None)
    if not path or getattr(db, "is_memory", False) or Path(path).name != CATALOG_FILE:
        return None
    return Path(path)


def _find_catalog(datasette) -> Optional[tuple[str, Path]]:
    for name, db in datasette.databases.items():
        path = catalog_file(db)
        if path is not None:
            return name, path
    return None


def state_of(datasette) -> Optional[ExplorerState]:
    """The store ``datasette`` shows, or ``None`` when it has no memstore catalog open. A
    Datasette the explorer was not configured for (plain ``datasette <root>/catalog.db``) takes
    its settings from the ``memstore`` plugin's configuration (``refresh_interval``,
    ``allow_hosts``)."""
    try:
        return _states[datasette]
    except KeyError:
        pass
    found = _find_catalog(datasette)
    state = None
    if found is not None:
        config = _plugin_config(datasette)
        interval = config.get("refresh_interval", DEFAULT_INTERVAL)
        interval = float(interval) if isinstance(interval, (int, float)) and not isinstance(interval, bool) else None
        hosts = config.get("allow_hosts") or ()
        hosts = (hosts,) if isinstance(hosts, str) else tuple(h for h in hosts if isinstance(h, str))
        if interval is None or interval < 0:
            logger.warning(
                "explorer: plugins.memstore.refresh_interval must be a number of seconds; using %s", DEFAULT_INTERVAL
            )
            interval = DEFAULT_INTERVAL
        state = ExplorerState(found[1].parent, found[0], None, interval > 0, interval, hosts)
    _states[datasette] = state
    return state


def _plugin_config(datasette) -> dict:
    try:
        config = datasette.plugin_config("memstore")
    except Exception as exc:  # a metadata file Datasette cannot resolve ($env of nothing...)
        logger.warning("explorer: the memstore plugin configuration cannot be read: %s", exc)
        return {}
    return config if isinstance(config, dict) else {}


# --------------------------------------------------------------------------------------------
# Request helpers


def _int(value: Optional[str], default: Optional[int], lo: int = 1, hi: int = data.MAX_PAGE) -> Optional[int]:
    # ASCII digits only: str.isdigit() also accepts "²" and "①", which int() refuses.
    if value is None or not value.isascii() or not value.isdigit() or len(value) > 16:
        return default
    return min(max(lo, int(value)), hi)


def _count(value: Optional[str], default: int, lo: int = 1, hi: int = data.MAX_PAGE) -> int:
    found = _int(value, default, lo, hi)
    return default if found is None else found


def _number(digits: str) -> int:
    """A turn number or seq from the URL (ASCII digits, as the route matched them), as it is, so
    a 404 names what was asked; the data functions check the range. Past 100 digits (int() of
    thousands of digits is refused) it is simply too large."""
    return int(digits) if len(digits) <= 100 else 2**64


def _urls(datasette, state: ExplorerState) -> Urls:
    return Urls(datasette.setting("base_url") or "/", state.database)


async def _not_found(datasette, request, message: str, as_json: bool, status: int = 404):
    from datasette.utils.asgi import Response

    if as_json:
        return Response.json({"ok": False, "error": message, "status": status}, status=status)
    html = await datasette.render_template(
        ["memstore_error.html"], {"error": message, "status": status, "nav": _nav(datasette, request)}, request=request
    )
    return Response.html(html, status=status)


async def _unreadable(datasette, request, session_id: str, exc: MemstoreError, as_json: bool):
    """A session that is there but cannot be read: a 500 that names the session, never the
    file (the server's log has the whole error)."""
    logger.warning("explorer: %s: %s", request.path, exc)
    return await _not_found(
        datasette, request, f"session {session_id!r} could not be read (see the server's log)", as_json, status=500
    )


async def _respond(datasette, request, template: str, payload: dict, as_json: bool, **extra):
    from datasette.utils.asgi import Response

    if as_json:
        return Response.json(payload)
    html = await datasette.render_template(
        [template], {"data": payload, "nav": _nav(datasette, request), **extra}, request=request
    )
    return Response.html(html)


def _nav(datasette, request) -> dict:
    state = state_of(datasette)
    urls = _urls(datasette, state) if state else Urls()
    return {
        "home": urls.home(),
        "search": urls.search(),
        "sql": urls.query("").rstrip("/"),
        "q": request.args.get("q", "") if request.path.endswith("/search") else "",
        # The one search box keeps the search page's filters when a new query is typed.
        "kept": {
            k: request.args.get(k, "")[:1100]
            for k in ("session", "agent", "machine", "since", "until")
            if request.path.endswith("/search") and request.args.get(k)
        },
    }


def _state_or_none(datasette) -> Optional[ExplorerState]:
    state = state_of(datasette)
    if state is None or state.database not in datasette.databases:
        return None
    return state


async def _in_thread(fn, *args, **kwargs):
    return await asyncio.get_running_loop().run_in_executor(None, functools.partial(fn, *args, **kwargs))


async def catalog_call(datasette, state: ExplorerState, fn: Callable[[sqlite3.Connection], T]) -> T:
    """Run the explorer's own ``fn(conn)`` on a connection to the catalog (trusted: fixed SQL,
    see :mod:`.guard`)."""
    db = datasette.get_database(state.database)
    if isinstance(db, CatalogDatabase):
        return await db.execute_trusted(fn)
    return await db.execute_fn(fn)


# --------------------------------------------------------------------------------------------
# Views


def _view(view):
    """What every explorer view does first: answer GET and HEAD only (nothing here acts on a
    request body), and 404 in a Datasette without the memstore catalog; the view is then called
    with the explorer's state, its URLs and whether ``.json`` was asked for."""

    @functools.wraps(view)
    async def wrapped(datasette, request):
        if request.method not in ("GET", "HEAD"):
            from datasette.utils.asgi import Response

            return Response.text(
                "Method not allowed: the explorer is read-only", status=405, headers={"Allow": "GET, HEAD"}
            )
        as_json = bool(request.url_vars.get("fmt"))
        state = _state_or_none(datasette)
        if state is None:
            return await _not_found(datasette, request, "This Datasette has no memstore catalog.db open", as_json)
        try:
            return await view(datasette, request, state, _urls(datasette, state), as_json)
        except sqlite3.OperationalError as exc:
            if state.catalog.exists() and "no such table" not in str(exc):
                raise
            # Deleted, and not built again yet: the refresher (poked by this request) builds it.
            return await _not_found(
                datasette,
                request,
                "The catalog is being built again: reload this page in a few seconds",
                as_json,
                status=503,
            )

    # Datasette calls a route with the arguments its signature names: the wrapper's, not the
    # view's (which functools.wraps would otherwise point it to).
    del wrapped.__wrapped__
    return wrapped


async def _session_page(datasette, request, as_json: bool, template: str, load, extra=lambda payload: {}):
    """A page of one session (the session, a turn, an event): ``load(session_id)`` makes its
    payload; what is not there is a 404, a session that cannot be read says so."""
    try:
        session_id = unquote_id(request.url_vars["sid"])
        payload = await load(session_id)
    except _NOT_FOUND as exc:
        return await _not_found(datasette, request, _message(exc), as_json)
    except MemstoreError as exc:
        return await _unreadable(datasette, request, session_id, exc, as_json)
    return await _respond(datasette, request, template, payload, as_json, **extra(payload))


@_view
async def home_view(datasette, request, state, urls, as_json):
    args = request.args
    filters = data.HomeFilters(
        status=_text(args.get("status"), 100),
        agent=_text(args.get("agent"), 100),
        model=_text(args.get("model"), 200),
        cwd=_text(args.get("cwd"), 4096),
        since=data.day_param(args.get("since")),
        until=data.day_param(args.get("until")),
        q=_text(args.get("q"), 500),
        machine=_text(args.get("machine"), 200),
    )
    page, sort, order = _count(args.get("page"), 1), args.get("sort", "updated"), args.get("order", "desc")
    chart = args.get("chart", "tokens")
    payload = await catalog_call(
        datasette,
        state,
        lambda conn: data.home_data(conn, urls, page=page, sort=sort, order=order, filters=filters, chart=chart),
    )
    drawn = None
    if payload["tokens_per_day"]:
        drawn = (
            charts.cost_per_day_chart(payload["tokens_per_day"], payload["cost"])
            if payload["chart"] == "cost"
            else charts.tokens_per_day_chart(payload["tokens_per_day"])
        )
    return await _respond(datasette, request, "memstore_home.html", payload, as_json, chart=drawn)


def _text(value: Optional[str], most: int) -> str:
    """A text parameter as a filter takes it: at most ``most`` characters, no NUL."""
    return (value or "")[:most].replace("\0", "")


@_view
async def session_view(datasette, request, state, urls, as_json):
    async def load(session_id):
        page = _count(request.args.get("page"), 1)
        return await catalog_call(
            datasette, state, lambda conn: data.session_data(conn, state.root, session_id, urls, page=page)
        )

    return await _session_page(
        datasette,
        request,
        as_json,
        "memstore_session.html",
        load,
        lambda payload: {"chart": charts.turns_chart(payload["turns"]) if payload["turns"] else None},
    )


@_view
async def turn_view(datasette, request, state, urls, as_json):
    async def load(session_id):
        number = _number(request.url_vars["n"])
        start = _int(request.args.get("start"), None, 1, 2**53)
        return await _in_thread(data.turn_data, state.root, session_id, number, urls, start=start)

    return await _session_page(datasette, request, as_json, "memstore_turn.html", load)


@_view
async def event_view(datasette, request, state, urls, as_json):
    async def load(session_id):
        seq = _number(request.url_vars["seq"])
        return await _in_thread(data.event_data, state.root, session_id, seq, urls)

    return await _session_page(
        datasette, request, as_json, "memstore_event.html", load, lambda payload: {"shown": data.MAX_LINE_SHOWN}
    )


@_view
async def search_view(datasette, request, state, urls, as_json):
    args = request.args
    query = args.get("q", "")
    filters = data.SearchFilters(
        session=_text(args.get("session"), 1100),
        agent=_text(args.get("agent"), 100),
        since=data.day_param(args.get("since")),
        until=data.day_param(args.get("until")),
        machine=_text(args.get("machine"), 200),
    )
    limit = _count(args.get("limit"), data.SEARCH_LIMIT, 1, data.MAX_SEARCH_LIMIT)
    page = _count(args.get("page"), 1)

    def run(conn: sqlite3.Connection) -> dict:
        return data.search_data(
            state.root,
            query,
            urls,
            limit=limit,
            page=page,
            filters=filters,
            conn=conn,
            fallback=lambda q, n, filters: data.fts_search(conn, q, n, filters),
        )

    payload = await catalog_call(datasette, state, run)
    return await _respond(datasette, request, "memstore_search.html", payload, as_json)


def _message(exc: BaseException) -> str:
    # Say what was not found, never where the store looked for it (no filesystem paths).
    if isinstance(exc, SessionNotFound):
        return f"no session {exc.session_id!r}"
    if isinstance(exc, (TurnNotFound, EventNotFound)):
        return str(exc)
    return "no such session"


def routes() -> list[tuple[str, Any]]:
    """The explorer's routes for Datasette's ``register_routes`` hook (matched against the raw,
    still percent-encoded path)."""
    base = "^/" + PREFIX.replace("/", r"/").replace("-", r"\-")
    sid = r"(?P<sid>[^/]+?)"
    fmt = r"(?P<fmt>\.json)?$"
    return [
        (base + fmt, home_view),
        (base + r"/sessions/" + sid + fmt, session_view),
        (base + r"/sessions/" + sid + r"/turns/(?P<n>[0-9]+)" + fmt, turn_view),
        (base + r"/sessions/" + sid + r"/events/(?P<seq>[0-9]+)" + fmt, event_view),
        (base + r"/search" + fmt, search_view),
    ]


# --------------------------------------------------------------------------------------------
# Other hooks


def add_templates(env) -> None:
    """Let Datasette's Jinja environment find the explorer's templates (after the user's own)."""
    from jinja2 import ChoiceLoader, FileSystemLoader

    if getattr(env, "_memstore_templates", False):
        return
    env.loader = ChoiceLoader([env.loader, FileSystemLoader(str(TEMPLATES))])
    env.filters.setdefault("ms_human", charts.human)
    env.filters.setdefault("ms_duration", _duration)
    env.filters.setdefault("ms_usd", costs.usd)
    env._memstore_templates = True


def _duration(ms: Optional[int]) -> str:
    if not isinstance(ms, int):
        return ""
    seconds = ms / 1000
    if seconds < 60:
        return f"{seconds:.1f} s" if seconds < 10 else f"{seconds:.0f} s"
    minutes, seconds = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {seconds:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


def guard_connection(conn: sqlite3.Connection, database: str, datasette) -> None:
    """Guard Datasette's connections to a memstore catalog (see :mod:`.guard`): read-only, no
    ``ATTACH``, no store path, bounded values, ``printf`` checked, SQLite's heap capped."""
    if catalog_file(datasette.databases.get(database)) is not None:
        _guard(conn)


def _answer(status: int, text: str):
    body = text.encode("utf-8")

    async def send_to(send) -> None:
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", b"text/plain; charset=utf-8"),
                    (b"content-length", str(len(body)).encode()),
                    (b"x-content-type-options", b"nosniff"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})

    return send_to


def _header(scope, name: bytes) -> Optional[str]:
    for key, value in scope.get("headers") or ():
        if key.lower() == name:
            return value.decode("latin-1")
    return None


def asgi_wrapper(datasette):
    """The explorer's ASGI wrapper, around the whole Datasette when it shows a memstore catalog:

    - a request naming a host the server was not started for is refused (403, see :mod:`.hosts`);
    - paths starting ``//`` or ``/\\`` are a 404: Datasette 0.65 redirects ``/\\evil.com/`` to
      ``/\\evil.com``, which browsers follow to ``//evil.com``, another site;
    - every other request pokes the store's refresher (which never makes it wait)."""

    def wrap(app):
        async def wrapped(scope, receive, send):
            state = state_of(datasette) if scope.get("type") in ("http", "websocket") else None
            if state is not None:
                host = _header(scope, b"host")
                server = scope.get("server")
                if not hosts.allowed(host, state.allowed_hosts, server[0] if server else None):
                    name = hosts.host_of(host or "") or "?"
                    logger.warning(
                        "explorer: refused a request for host %r (allowed: local names%s)",
                        host,
                        "".join(f", {h}" for h in state.allowed_hosts),
                    )
                    await _answer(
                        403,
                        f"This memstore explorer does not answer requests for the host {name!r}: "
                        f"it serves localhost. If you reach it by that name, start it with "
                        f"`memstore serve --allow-host {name}` (or list the name under "
                        f"plugins: memstore: allow_hosts in Datasette's metadata).\n",
                    )(send)
                    return
                if scope.get("path", "")[1:2] in ("/", "\\"):
                    await _answer(404, "Not found")(send)
                    return
                if state.refresher is not None:
                    state.refresher.poke()
            await app(scope, receive, send)

        return wrapped

    return wrap


async def startup(datasette) -> None:
    """The plugin's startup: the catalog becomes a :class:`CatalogDatabase` (it follows the file
    and hides its path), and a refresher starts when the explorer may refresh it and the store
    can be written (plain ``datasette <root>/catalog.db`` refreshes as ``memstore serve`` does)."""
    state = state_of(datasette)
    if state is None:
        return
    adopt_catalog(datasette, state.database)
    if state.refresher is None and state.auto_refresh and state.refresh_interval > 0 and _writable(state.root):
        state.refresher = CatalogRefresher(state.root, state.refresh_interval).start()
        logger.info("explorer: refreshing %s every %ss at most", state.catalog, state.refresh_interval)


def _writable(root: Path) -> bool:
    from ..layout import sessions_root

    return sessions_root(root).is_dir() and os.access(root, os.W_OK) and os.access(catalog_path(root), os.W_OK)


def menu_links(datasette) -> list[dict]:
    state = state_of(datasette)
    if state is None:
        return []
    urls = _urls(datasette, state)
    return [{"href": urls.home(), "label": "memstore sessions"}, {"href": urls.search(), "label": "memstore search"}]


# --------------------------------------------------------------------------------------------
# Metadata and cells

METADATA_FILE = Path(__file__).resolve().parent / "metadata.yml"


@functools.lru_cache(maxsize=1)
def _packaged_metadata() -> dict:
    import yaml

    loaded = yaml.safe_load(METADATA_FILE.read_text(encoding="utf-8"))
    return loaded if isinstance(loaded, dict) else {}


def metadata(datasette) -> dict:
    """The explorer's metadata for ``datasette`` (the ``get_metadata`` hook): the catalog's tables
    and columns described, its facets and canned queries, under the name Datasette gives the
    catalog; a session's ``index/session.db`` (a database named ``session``) described too.
    Nothing for a Datasette without either. Metadata the user passes (``-m``) is laid over it."""
    shipped = _packaged_metadata()
    databases = shipped.get("databases") or {}
    out: dict = {}
    found = _find_catalog(datasette)
    if found is not None and "catalog" in databases:
        out = {k: v for k, v in shipped.items() if k != "databases"}
        out["databases"] = {found[0]: databases["catalog"]}
    session_db = datasette.databases.get("session")
    path = getattr(session_db, "path", None)
    if path and Path(path).name == INDEX_FILE and "session" in databases:
        out.setdefault("databases", {})["session"] = databases["session"]
    return out


def _row_value(row, key: str):
    try:
        return row[key]
    except (IndexError, KeyError, TypeError):
        return None


def render_cell(row, value, column: str, table: Optional[str], database: str, datasette):
    """Links from Datasette's rows of the catalog to the explorer's pages (``render_cell``): a
    ``session_id`` to its session, a turn number (``turns.number``, or ``turn``/``last_turn``
    beside a ``session_id``) to its turn, an event's ``seq`` to its event; in the sessions
    table, whose id column is Datasette's own row link, the title (else the directory) links to
    the session. ``None`` (Datasette's own rendering) for anything else."""
    from markupsafe import Markup, escape

    state = state_of(datasette)
    if state is None or database != state.database or value is None:
        return None
    urls = _urls(datasette, state)
    session = _row_value(row, "session_id")

    def link(href: str, text) -> Markup:
        return Markup(f'<a href="{escape(href)}" title="Open in the memstore explorer">{escape(str(text))}</a>')

    if table == "sessions" and column in ("title", "directory") and isinstance(session, str):
        if column == "title" or not _row_value(row, "title"):
            return link(urls.session(session), value)
        return None
    if column in ("session_id", "parent_session_id") and isinstance(value, str) and table != "chunks_fts":
        return link(urls.session(value), value)
    if not isinstance(session, str) or not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        return None
    if (column == "number" and table in ("turns", None)) or column in ("turn", "last_turn"):
        return link(urls.turn(session, value), value)
    if column == "seq" and table != "chunks_fts":
        return link(urls.event(session, value), value)
    return None
