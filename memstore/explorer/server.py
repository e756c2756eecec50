"""``memstore serve``: the catalog of a store in Datasette 0.65, with the explorer plugin.

:func:`make_datasette` builds the Datasette (``catalog.db`` opened as a mutable database, since
it changes under it) with the explorer plugin (:mod:`memstore.explorer.plugin`, which the
package's ``datasette`` entry point registers; registered here when the package is used without
being installed), and the user's own metadata and plugins directory when given; :func:`serve`
refreshes the catalog, starts the background refresher and runs the server (uvicorn), bound to
127.0.0.1 unless told otherwise.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Optional

from ..catalog import refresh_catalog
from ..errors import StoreIOError
from ..layout import catalog_path, sessions_root
from .app import configure
from .refresh import DEFAULT_INTERVAL, CatalogRefresher

logger = logging.getLogger(__name__)

PLUGIN_NAME = "memstore"


def register_plugin() -> None:
    """Make sure Datasette has the explorer plugin: the entry point registers it in an installed
    package; a checkout used through ``PYTHONPATH`` registers it here, once."""
    from datasette.plugins import pm

    from . import plugin

    if pm.get_plugin(PLUGIN_NAME) is None and not pm.is_registered(plugin):
        pm.register(plugin, name=PLUGIN_NAME)


def load_metadata(path: os.PathLike | str) -> dict:
    """Parse a Datasette metadata file (YAML or JSON); :class:`StoreIOError` (one line, naming
    the file) when it cannot be read or is not a mapping."""
    import yaml

    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise StoreIOError.from_os_error("read metadata", path, exc) from exc
    except UnicodeDecodeError as exc:
        raise StoreIOError("read metadata", path, f"not UTF-8 text ({exc.reason} at byte {exc.start})") from exc
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        at = f" at line {where.line + 1}, column {where.column + 1}" if where is not None else ""
        raise StoreIOError("read metadata", path, f"not valid YAML{at}") from exc
    if not isinstance(data, dict):
        raise StoreIOError("read metadata", path, "not a metadata mapping (a YAML or JSON object)")
    return data


def make_datasette(
    root: os.PathLike | str,
    *,
    metadata: Optional[os.PathLike | str] = None,
    plugins_dir: Optional[os.PathLike | str] = None,
    refresher: Optional[CatalogRefresher] = None,
    settings: Optional[dict] = None,
    allowed_hosts: Iterable[str] = (),
):
    """A Datasette over ``<root>/catalog.db`` with the explorer (the catalog must exist: refresh
    it first). ``metadata``: the user's metadata file, laid over the explorer's own;
    ``plugins_dir``: the user's plugins; ``refresher``: what keeps the catalog current (none:
    the catalog is served as it is); ``allowed_hosts``: host names to answer besides the local
    ones (see :mod:`memstore.explorer.hosts`)."""
    from datasette.app import Datasette

    path = catalog_path(root)
    if not path.is_file():
        raise StoreIOError("serve", path, "no catalog; refresh it first (memstore serve does)")
    if plugins_dir is not None and not Path(plugins_dir).is_dir():
        raise StoreIOError("serve", plugins_dir, "no such plugins directory (--plugins-dir)")
    register_plugin()
    ds = Datasette(
        [str(path)],  # files=, not immutables=: the catalog is refreshed while Datasette reads it
        metadata=load_metadata(metadata) if metadata is not None else None,
        plugins_dir=str(plugins_dir) if plugins_dir is not None else None,
        settings=settings,
    )
    configure(ds, root, refresher=refresher, allowed_hosts=allowed_hosts)
    return ds


def check_port(host: str, port: int) -> None:
    """Raise ``OSError`` now if ``host:port`` cannot be bound (uvicorn would exit instead)."""
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))


def _run_server(app, host: str, port: int) -> None:
    """Run the ASGI app until interrupted (the seam tests replace)."""
    import uvicorn

    uvicorn.run(app, host=host, port=port, log_level="warning", lifespan="on")


def serve(
    root: os.PathLike | str,
    *,
    host: str = "127.0.0.1",
    port: int = 8001,
    metadata: Optional[os.PathLike | str] = None,
    plugins_dir: Optional[os.PathLike | str] = None,
    refresh_interval: float = DEFAULT_INTERVAL,
    progress: Optional[Callable[[int, int], None]] = None,
    announce: Optional[Callable[[str], None]] = None,
    allowed_hosts: Iterable[str] = (),
) -> None:
    """Refresh the catalog of ``root``, then serve it with the explorer until interrupted.

    ``refresh_interval`` seconds: how often at most the catalog is refreshed while requests come
    in (0 turns the background refresh off). ``allowed_hosts``: names besides the local ones
    that requests may name in their ``Host`` (the address the server is bound to is always
    one). ``announce(url)`` is called once the server is about to listen."""
    root = Path(root)
    if not sessions_root(root).is_dir() and not catalog_path(root).is_file():
        raise StoreIOError("serve", root, "no memstore store here (no sessions/); run `memstore demo` or pass --root")
    if metadata is not None:
        load_metadata(metadata)  # a bad file fails here, before the catalog is refreshed
    check_port(host, port)
    refresh_catalog(root, progress=progress)
    refresher = CatalogRefresher(root, refresh_interval) if refresh_interval > 0 else None
    ds = make_datasette(
        root, metadata=metadata, plugins_dir=plugins_dir, refresher=refresher, allowed_hosts=allowed_hosts
    )
    if refresher is not None:
        refresher.last_refresh = time.monotonic()  # just refreshed
        refresher.start()
    if announce is not None:
        shown = "localhost" if host in ("127.0.0.1", "::1") else f"[{host}]" if ":" in host else host
        announce(f"http://{shown}:{port}/-/memstore")
    try:
        _run_server(ds.app(), host, port)
    finally:
        if refresher is not None:
            refresher.stop()
