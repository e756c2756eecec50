"""memstore's explorer as a Datasette plugin, registered by the ``datasette`` entry point
``memstore`` (``pip install memstore`` is all it takes): ``datasette <root>/catalog.db`` then
serves the explorer's pages (``/-/memstore``), the catalog's metadata and canned queries, links
from the catalog's rows to those pages, the guards of :mod:`.guard` and :mod:`.hosts`, and a
background refresh of the catalog. ``memstore serve`` runs the same plugin.

Hooks only: everything they call lives in :mod:`memstore.explorer.app`.
"""

from __future__ import annotations

from datasette import hookimpl

from memstore.explorer import app


@hookimpl
def startup(datasette):
    return app.startup(datasette)


@hookimpl
def register_routes(datasette):
    return app.routes()


@hookimpl
def prepare_jinja2_environment(env, datasette):
    app.add_templates(env)


@hookimpl
def prepare_connection(conn, database, datasette):
    app.guard_connection(conn, database, datasette)


@hookimpl
def asgi_wrapper(datasette):
    return app.asgi_wrapper(datasette)


@hookimpl
def get_metadata(datasette, key, database, table):
    return app.metadata(datasette)


@hookimpl
def render_cell(row, value, column, table, database, datasette):
    return app.render_cell(row, value, column, table, database, datasette)


@hookimpl
def menu_links(datasette, actor, request):
    return app.menu_links(datasette)
