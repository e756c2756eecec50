"""An example of extending memstore's explorer with a Datasette plugin of your own.

The explorer itself is a plugin that ``pip install memstore`` registers; this one adds to it.
It gives the catalog's SQL a ``basename(path)`` function, which the example canned query in
``metadata.yml`` beside this directory uses, and a menu link. Serve with both:

    memstore serve --metadata metadata.yml --plugins-dir plugins/
    datasette <root>/catalog.db -m metadata.yml --plugins-dir plugins/

Any Datasette hook works the same way: https://docs.datasette.io/en/0.65.x/plugin_hooks.html
"""

import posixpath

from datasette import hookimpl


def basename(path):
    """The last part of a path as an agent wrote it (``src/store.rs`` -> ``store.rs``)."""
    return posixpath.basename(path.replace("\\", "/").rstrip("/")) if isinstance(path, str) else path


@hookimpl
def prepare_connection(conn):
    conn.create_function("basename", 1, basename, deterministic=True)


@hookimpl
def menu_links(datasette):
    return [{"href": datasette.urls.path("/catalog/files_by_name"), "label": "Files changed, by name"}]
