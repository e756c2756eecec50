"""Datasette plugin: memstore's explorer. Hooks only; everything lives in ``memstore.explorer``.

Loaded by ``memstore serve`` (or ``datasette <root>/catalog.db -m metadata.yml --plugins-dir plugins/``).
"""

from datasette import hookimpl

from memstore.explorer import app


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
    return app.refresh_wrapper(datasette)


@hookimpl
def menu_links(datasette, actor, request):
    return app.menu_links(datasette)
