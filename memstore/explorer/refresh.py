"""Keeping the catalog current while the explorer runs, without a route ever writing.

:class:`CatalogRefresher` runs :func:`memstore.catalog.refresh_catalog` on a background thread,
when a request came in and at most once every ``interval`` seconds. Requests never wait for it
(they read the catalog as it is); a session that appeared shows up on the page loaded a few
seconds later. The refresh writes ``catalog.db`` only (rows updated in place, one transaction
per session, under the store's ``catalog`` lock), so the Datasette reading it is never handed a
replaced file.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Optional

logger = logging.getLogger("memstore")

DEFAULT_INTERVAL = 3.0


class CatalogRefresher:
    """Refreshes ``<root>/catalog.db`` in the background when :meth:`poke`\\ d, at most every
    ``interval`` seconds. ``refresh`` is the function called (``refresh_catalog`` by default)."""

    def __init__(self, root: os.PathLike | str, interval: float = DEFAULT_INTERVAL,
                 refresh: Optional[Callable[[Path], object]] = None):
        from ..catalog import refresh_catalog

        self.root = Path(root)
        self.interval = max(0.0, float(interval))
        self._refresh = refresh or refresh_catalog
        self._wanted = threading.Event()
        self._stopped = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self.last_refresh = 0.0  # monotonic time the last refresh started
        self.refreshes = 0
        self.last_error: Optional[str] = None

    def start(self) -> CatalogRefresher:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="memstore-catalog-refresh", daemon=True)
            self._thread.start()
        return self

    def poke(self) -> None:
        """Ask for a refresh (cheap: sets a flag; the thread decides when)."""
        self._wanted.set()

    def stop(self, timeout: float = 5.0) -> None:
        self._stopped.set()
        self._wanted.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def refresh_now(self) -> None:
        """One refresh in the caller's thread (errors are logged, never raised)."""
        self.last_refresh = time.monotonic()
        try:
            report = self._refresh(self.root)
        except Exception as exc:  # a refresh that fails is retried on the next poke; the pages still serve
            self.last_error = str(exc)
            logger.warning("explorer: catalog refresh of %s failed: %s", self.root, exc)
            return
        self.refreshes += 1
        self.last_error = None
        if getattr(report, "changed", False):
            logger.info("explorer: catalog refreshed: %d added, %d updated, %d recopied, %d removed",
                        len(report.added), len(report.updated), len(report.recopied), len(report.removed))

    def _run(self) -> None:
        while not self._stopped.is_set():
            self._wanted.wait()
            if self._stopped.is_set():
                return
            wait = self.last_refresh + self.interval - time.monotonic()
            if wait > 0 and self._stopped.wait(wait):
                return
            self._wanted.clear()
            self.refresh_now()
