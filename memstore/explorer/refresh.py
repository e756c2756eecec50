"""Keeping the catalog current while the explorer runs, without a route ever writing.

:class:`CatalogRefresher` keeps ``catalog.db`` current from a background thread: every
``interval`` seconds, and at once when a request pokes it (at most once every ``interval``
seconds), it takes up the store's change feed and, when the last sweep of the sessions is older
than ``interval``, sweeps them (see :mod:`memstore.catalog.live`). With nothing changed that
costs one ``scandir`` of ``changes/``; a change costs what changed. Requests never wait for it
(they read the catalog as it is); a session that appeared shows up on the page loaded a moment
later. The refresh writes ``catalog.db`` only (rows updated in place, a batch of sessions per
transaction, under the store's ``catalog`` lock), so the Datasette reading it is never handed a
replaced file.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:
    from ..catalog import LiveCatalog, RefreshReport

logger = logging.getLogger("memstore")

DEFAULT_INTERVAL = 3.0


class CatalogRefresher:
    """Keeps ``<root>/catalog.db`` current in the background (see the module docstring).
    ``refresh(root)`` is the function called instead, when given (a test's); by default the
    change feed is taken up, and the sessions swept at most every ``interval`` seconds."""

    def __init__(
        self,
        root: os.PathLike | str,
        interval: float = DEFAULT_INTERVAL,
        refresh: Optional[Callable[[Path], object]] = None,
    ):
        self.root = Path(root)
        self.interval = max(0.0, float(interval))
        self._refresh = refresh
        self._live: Optional[LiveCatalog] = None
        if refresh is None:
            from ..catalog import LiveCatalog

            self._live = LiveCatalog(self.root, sweep_interval=self.interval)
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
        if self._live is not None:
            self._live.close()

    def refresh_now(self) -> None:
        """One refresh in the caller's thread (errors are logged, never raised)."""
        self.last_refresh = time.monotonic()
        report: object
        try:
            if self._refresh is not None:
                report = self._refresh(self.root)
            else:
                report = self._keep_current()
        except Exception as exc:  # a refresh that fails is retried on the next round; the pages still serve
            self.last_error = str(exc)
            logger.warning("explorer: catalog refresh of %s failed: %s", self.root, exc)
            return
        self.refreshes += 1
        self.last_error = None
        from ..catalog import RefreshReport

        if not isinstance(report, RefreshReport):
            return
        if report.changed:
            logger.info(
                "explorer: catalog refreshed: %d added, %d updated, %d recopied, %d removed",
                len(report.added),
                len(report.updated),
                len(report.recopied),
                len(report.removed),
            )
        if report.errors:
            logger.warning(
                "explorer: %d session directories could not be copied (searches say so): %s",
                len(report.errors),
                "; ".join(f"{name}: {why}" for name, why in report.errors[:3]),
            )

    def _keep_current(self) -> Optional[RefreshReport]:
        from .. import changes
        from ..catalog import RefreshMode

        live = self._live
        assert live is not None
        if not live.writable:
            return None  # a store this process cannot write is served as its catalog is
        if not changes.pending(self.root) and not live.sweep_due():
            return None
        return live.refresh(RefreshMode.FEED)

    def _run(self) -> None:
        while not self._stopped.is_set():
            # A request wakes the thread at once; without any, it looks every interval.
            self._wanted.wait(self.interval if self.interval > 0 else None)
            if self._stopped.is_set():
                return
            wait = self.last_refresh + self.interval - time.monotonic()
            if wait > 0 and self._stopped.wait(wait):
                return
            self._wanted.clear()
            self.refresh_now()
