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
import sqlite3
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional


from ..layout import CATALOG_FILE
from ..errors import (EventNotFound, InvalidSessionId, MemstoreError, SessionNotFound, TurnNotFound,
                      UnsafePathError)
from . import charts, data
from .refresh import CatalogRefresher
from .urls import PREFIX, Urls, unquote_id

logger = logging.getLogger("memstore")

TEMPLATES = Path(__file__).resolve().parent / "templates"
_NOT_FOUND = (SessionNotFound, InvalidSessionId, UnsafePathError, TurnNotFound, EventNotFound, UnicodeDecodeError)


@dataclass
class ExplorerState:
    """What a Datasette instance explores: the store ``root``, the ``database`` name of its
    catalog in Datasette, and the background ``refresher`` (``memstore serve`` starts one)."""

    root: Path
    database: str
    refresher: Optional[CatalogRefresher] = None


_states: "weakref.WeakKeyDictionary[Any, Optional[ExplorerState]]" = weakref.WeakKeyDictionary()


def configure(datasette, root, *, database: Optional[str] = None,
              refresher: Optional[CatalogRefresher] = None) -> ExplorerState:
    """Tell the explorer which store ``datasette`` shows (by default: the store whose
    ``catalog.db`` Datasette has open)."""
    if database is None:
        found = _find_catalog(datasette)
        database = found[0] if found else "catalog"
    state = ExplorerState(Path(root), database, refresher)
    _states[datasette] = state
    return state


def _find_catalog(datasette) -> Optional[tuple[str, Path]]:
    for name, db in datasette.databases.items():
        path = getattr(db, "path", None)
        if path and Path(path).name == CATALOG_FILE:
            return name, Path(path)
    return None


def state_of(datasette) -> Optional[ExplorerState]:
    """The store ``datasette`` shows, or ``None`` when it has no memstore catalog open."""
    try:
        return _states[datasette]
    except KeyError:
        pass
    found = _find_catalog(datasette)
    state = ExplorerState(found[1].parent, found[0]) if found else None
    _states[datasette] = state
    return state


# --------------------------------------------------------------------------------------------
# Request helpers


def _int(value: Optional[str], default: Optional[int], lo: int = 1, hi: int = data.MAX_PAGE) -> Optional[int]:
    # ASCII digits only: str.isdigit() also accepts "²" and "①", which int() refuses.
    if value is None or not value.isascii() or not value.isdigit() or len(value) > 16:
        return default
    return min(max(lo, int(value)), hi)


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
    html = await datasette.render_template(["memstore_error.html"], {"error": message, "status": status,
                                                                     "nav": _nav(datasette, request)},
                                           request=request)
    return Response.html(html, status=status)


async def _unreadable(datasette, request, session_id: str, exc: MemstoreError, as_json: bool):
    """A session that is there but cannot be read: a 500 that names the session, never the
    file (the server's log has the whole error)."""
    logger.warning("explorer: %s: %s", request.path, exc)
    return await _not_found(datasette, request, f"session {session_id!r} could not be read (see the server's log)",
                            as_json, status=500)


async def _respond(datasette, request, template: str, payload: dict, as_json: bool, **extra):
    from datasette.utils.asgi import Response

    if as_json:
        return Response.json(payload)
    html = await datasette.render_template([template], {"data": payload, "nav": _nav(datasette, request), **extra},
                                           request=request)
    return Response.html(html)


def _nav(datasette, request) -> dict:
    state = state_of(datasette)
    urls = _urls(datasette, state) if state else Urls()
    return {"home": urls.home(), "search": urls.search(), "sql": urls.query("").rstrip("/"),
            "q": request.args.get("q", "") if request.path.endswith("/search") else ""}


def _state_or_none(datasette) -> Optional[ExplorerState]:
    state = state_of(datasette)
    if state is None or state.database not in datasette.databases:
        return None
    return state


async def _in_thread(fn, *args, **kwargs):
    return await asyncio.get_running_loop().run_in_executor(None, functools.partial(fn, *args, **kwargs))


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

            return Response.text("Method not allowed: the explorer is read-only", status=405,
                                 headers={"Allow": "GET, HEAD"})
        as_json = bool(request.url_vars.get("fmt"))
        state = _state_or_none(datasette)
        if state is None:
            return await _not_found(datasette, request, "This Datasette has no memstore catalog.db open", as_json)
        return await view(datasette, request, state, _urls(datasette, state), as_json)

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
    params = dict(page=_int(args.get("page"), 1), sort=args.get("sort", "updated"), order=args.get("order", "desc"),
                  status=args.get("status", "")[:100], agent=args.get("agent", "")[:100], q=args.get("q", "")[:500])
    payload = await datasette.get_database(state.database).execute_fn(
        lambda conn: data.home_data(conn, urls, **params))
    return await _respond(datasette, request, "memstore_home.html", payload, as_json,
                          chart=charts.tokens_per_day_chart(payload["tokens_per_day"]) if payload["tokens_per_day"]
                          else None)


@_view
async def session_view(datasette, request, state, urls, as_json):
    async def load(session_id):
        page = _int(request.args.get("page"), 1)
        return await datasette.get_database(state.database).execute_fn(
            lambda conn: data.session_data(conn, state.root, session_id, urls, page=page))

    return await _session_page(datasette, request, as_json, "memstore_session.html", load, lambda payload: {
        "chart": charts.turns_chart(payload["turns"]) if payload["turns"] else None})


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

    return await _session_page(datasette, request, as_json, "memstore_event.html", load,
                               lambda payload: {"shown": data.MAX_LINE_SHOWN})


@_view
async def search_view(datasette, request, state, urls, as_json):
    args = request.args
    query = args.get("q", "")
    session_id = args.get("session", "")[:1100]
    limit = _int(args.get("limit"), data.SEARCH_LIMIT, 1, data.MAX_SEARCH_LIMIT)

    def run(conn: sqlite3.Connection) -> dict:
        return data.search_data(state.root, query, urls, limit=limit, session_id=session_id, conn=conn,
                                fallback=lambda q, n, sid: data.fts_search(conn, q, n, sid))

    payload = await datasette.get_database(state.database).execute_fn(run)
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


_SQLITE_ATTACH = getattr(sqlite3, "SQLITE_ATTACH", 24)
_SQLITE_DETACH = getattr(sqlite3, "SQLITE_DETACH", 25)
_SQLITE_FUNCTION = getattr(sqlite3, "SQLITE_FUNCTION", 31)
# fts3_tokenizer(name) returns a pointer into the process; fts3_tokenizer(name, pointer)
# registers a tokenizer at any address. Nothing here needs either.
_DENIED_FUNCTIONS = frozenset({"fts3_tokenizer", "load_extension"})


def _authorizer(action, arg1, arg2, dbname, source):
    # The connections are read-only already (mode=ro, query_only); this also keeps a query from
    # attaching another file (a session index, or anything else on disk) to read it.
    if action in (_SQLITE_ATTACH, _SQLITE_DETACH):
        return sqlite3.SQLITE_DENY
    if action == _SQLITE_FUNCTION and isinstance(arg2, str) and arg2.lower() in _DENIED_FUNCTIONS:
        return sqlite3.SQLITE_DENY
    return sqlite3.SQLITE_OK


def guard_connection(conn: sqlite3.Connection, database: str, datasette) -> None:
    """Make Datasette's connections to a memstore catalog strictly read-only: ``query_only``,
    no ``ATTACH``, and no function that reaches past the database (``fts3_tokenizer``)."""
    db = datasette.databases.get(database)
    path = getattr(db, "path", None)
    if not path or Path(path).name != CATALOG_FILE:
        return
    conn.execute("PRAGMA query_only = 1")
    conn.set_authorizer(_authorizer)


def refresh_wrapper(datasette):
    """An ASGI wrapper that pokes the store's refresher on every request (it never waits), and
    answers 404 to paths starting ``//`` or ``/\\``: Datasette 0.65 redirects ``/\\evil.com/`` to
    ``/\\evil.com``, which browsers follow to ``//evil.com``, another site."""

    def wrap(app):
        async def wrapped(scope, receive, send):
            if scope.get("type") == "http":
                if scope.get("path", "")[1:2] in ("/", "\\"):
                    await send({"type": "http.response.start", "status": 404,
                                "headers": [(b"content-type", b"text/plain; charset=utf-8")]})
                    await send({"type": "http.response.body", "body": b"Not found"})
                    return
                state = _states.get(datasette)
                if state is not None and state.refresher is not None:
                    state.refresher.poke()
            await app(scope, receive, send)

        return wrapped

    return wrap


def menu_links(datasette) -> list[dict]:
    state = state_of(datasette)
    if state is None:
        return []
    urls = _urls(datasette, state)
    return [{"href": urls.home(), "label": "memstore sessions"}, {"href": urls.search(), "label": "memstore search"}]

