"""``Store(root)``: the one object a memstore user holds.

A ``Store`` opens, reads, lists, searches, imports, rebuilds, keeps and packs the sessions under
one root, in the way sqlite-utils' ``Database(path)`` is the way into one database. It is cheap
to create (nothing touches the disk until a method needs it) and may keep warm state between
calls: the catalog connection and the search index of this process. The free functions of
:mod:`memstore` remain, each a thin wrapper over the same library code.

    >>> store = Store("/tmp/agents")
    >>> with store.open("run-42") as log:
    ...     log.append({"type": "turn.started"})
    >>> hits = store.search("cargo test failed")

Opening and appending load only the write path: search (numpy), the catalog, importers and the
store-wide maintenance modules are imported by the methods that use them, so an agent that
only appends never pays for them.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Optional, Union

from . import reader
from .errors import InvalidSessionId, MemstoreError, SessionNotFound, StoreIOError
from .layout import EVENTS_FILE, catalog_path, session_dir_name, session_directory, sessions_root
from .location import StoreLocation, locate_store
from .session.log import DEFAULT_MAX_EVENTS, SessionLog, open_session
from .session.manifest import Manifest, SessionSummary, list_sessions
from .views import memory_view
from .views import progress as ledger

if TYPE_CHECKING:
    from .catalog import CatalogProgress, LiveCatalog, RefreshReport
    from .forget import ForgetReport
    from .importers import ImportReport
    from .maintenance import DoctorReport
    from .migration import MigrationReport
    from .pack import PackVerification, SessionAuditPack
    from .retention import RetentionPolicy, RetentionReport
    from .scrub import ScrubReport
    from .search import SearchPage, SearchResults
    from .tombstones import Tombstone

Progress = Optional[Callable[[int, int], None]]
CatalogProgressCallback = Optional[Callable[["CatalogProgress"], None]]
PathArg = Union[str, "os.PathLike[str]"]

logger = logging.getLogger(__name__)


class Store:
    """The store rooted at ``root`` (a directory holding ``sessions/``; a VT Code workspace's
    ``.vtcode`` works too). ``~`` is expanded and the path made absolute once, so a later
    ``os.chdir`` cannot move the store under its user.

    With no ``root``, the default store (see :mod:`memstore.location`): ``MEMSTORE_ROOT``, else
    the nearest VT Code workspace's ``.vtcode/``, else the per-user store; ``location`` says
    which and why.

    Searching keeps warm state: a connection to the catalog per thread and the search index's
    cache, and the catalog is kept current at the cost of what changed (the change feed, and a
    sweep of the sessions at most every ``sweep_interval`` seconds, by default
    :data:`memstore.catalog.DEFAULT_SWEEP_SECONDS`). That state is the process's, shared by
    every ``Store`` of the same root and :func:`memstore.search_memory` (a ``Store`` given its
    own ``sweep_interval`` keeps its own). :meth:`close` releases it."""

    def __init__(self, root: Optional[PathArg] = None, *, sweep_interval: Optional[float] = None):
        self.location: StoreLocation = locate_store(root)
        self.path = self.location.path
        self._lock = threading.Lock()
        self._sweep_interval = sweep_interval
        self._live: Optional[LiveCatalog] = None

    def __repr__(self) -> str:
        return f"<Store {str(self.path)!r}>"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Store) and other.path == self.path

    def __hash__(self) -> int:
        return hash(self.path)

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Release what the store keeps warm: its connections to the catalog (in every thread;
        shared with :func:`memstore.search_memory` and the other ``Store`` objects of this root
        in this process, which reopen them when they need them)."""
        with self._lock:
            live, self._live = self._live, None
        if live is not None:
            live.close()
        elif self._sweep_interval is None:
            from .catalog.live import release_live_catalog

            release_live_catalog(self.path)

    def _catalog(self) -> LiveCatalog:
        with self._lock:
            if self._live is None:
                from .catalog import LiveCatalog, live_catalog

                if self._sweep_interval is None:
                    self._live = live_catalog(self.path)  # shared with search_memory in this process
                else:
                    self._live = LiveCatalog(self.path, sweep_interval=self._sweep_interval)
            return self._live

    # -- where things are --------------------------------------------------------------------

    @property
    def exists(self) -> bool:
        """Whether the root is a directory (a store with no session yet counts)."""
        return self.path.is_dir()

    @property
    def sessions_path(self) -> Path:
        return sessions_root(self.path)

    @property
    def catalog_path(self) -> Path:
        return catalog_path(self.path)

    def session_path(self, session_id: str) -> Path:
        """The directory of ``session_id`` (which need not exist)."""
        return session_directory(self.path, session_id)

    # -- one session ---------------------------------------------------------------------------

    def open(
        self,
        session_id: str,
        *,
        max_events: int = DEFAULT_MAX_EVENTS,
        durability: str = "turn",
        on_evict: Optional[Callable] = None,
    ) -> SessionLog:
        """Open (creating if needed) ``session_id`` for writing: see :func:`memstore.open_session`."""
        return open_session(self.path, session_id, max_events, durability, on_evict=on_evict)

    def read(self, session_id: str) -> reader.SessionReader:
        """A reader of ``session_id`` that never locks and never writes (see
        :func:`memstore.read_session`); :class:`SessionNotFound` when it is not there."""
        return reader.read_session(self.path, session_id)

    def read_redacted(self, session_id: str) -> reader.SessionReader:
        """:meth:`read`, with every event, record and turn error it returns redacted by the
        store's redactor (what a person or an agent is shown)."""
        return reader.read_session(self.path, session_id, redact=True)

    def __getitem__(self, session_id: str) -> Manifest:
        """The manifest of ``session_id`` as its log says it is now."""
        with self.read(session_id) as session:
            return session.manifest

    def __contains__(self, session_id: object) -> bool:
        if not isinstance(session_id, str):
            return False
        try:
            with self.read(session_id):
                return True
        except SessionNotFound:
            return False

    # -- many sessions -------------------------------------------------------------------------

    def session_ids(self) -> list[str]:
        """The ids of the sessions that hold a log, in directory-name order."""
        from .maintenance import session_ids

        return session_ids(self.path)

    def sessions(self, limit: Optional[int] = None) -> list[SessionSummary]:
        """Summaries of the sessions, most recently updated first, at most ``limit``.

        Every session is listed: one whose ``manifest.json`` is missing or damaged is read from
        its log (the manifest is a view of it, as ``show``, ``rebuild`` and the catalog treat
        it). A directory without ``events.jsonl``, a symlink, a dot-directory or a log that
        cannot be read is no session here. :class:`StoreIOError` when ``sessions/`` cannot be
        listed."""
        summaries = list_sessions(self.path)
        listed = set()
        for summary in summaries:
            try:
                listed.add(session_dir_name(summary.session_id))
            except InvalidSessionId:
                continue
        for entry in _session_entries(self.sessions_path):
            if entry.name in listed:
                continue
            try:
                with reader.read_session_dir(entry.path) as session:
                    m = session.manifest
            except MemstoreError as exc:
                logger.info("not listing %s: %s", entry.path, exc)
                continue
            summaries.append(SessionSummary(m.session_id, m.turn_count, m.event_count, m.status, m.updated_at))
        summaries.sort(key=lambda s: s.updated_at, reverse=True)
        return summaries[:limit] if limit is not None else summaries

    def __iter__(self) -> Iterator[str]:
        return iter(self.session_ids())

    def __len__(self) -> int:
        return len(self.session_ids())

    # -- search, facts and the catalog ---------------------------------------------------------

    def search(
        self,
        query: str,
        *,
        limit: int = 6,
        session: Optional[str] = None,
        since: Optional[str] = None,
        source: Optional[str] = None,
        recency: bool = True,
        min_score: float = 0.0,
        on_progress: CatalogProgressCallback = None,
        machine: Optional[str] = None,
    ) -> SearchResults:
        """BM25 search over every session (see :func:`memstore.search_memory`). The catalog is
        brought up to date first at the cost of what changed: on an unchanged store, one
        ``scandir`` of the change feed and no walk of the sessions (a sweep of them runs when the
        last is older than the sweep interval). ``on_progress`` is called with a
        :class:`memstore.catalog.CatalogProgress` while that copies sessions (a first search of a
        large store builds the whole catalog). The list returned has ``missing``: the sessions
        the search could not look at, and why. ``machine`` (a store id or label) keeps the
        sessions born in that store (this one, or one they were imported from)."""
        return self.search_page(
            query,
            limit=limit,
            session=session,
            since=since,
            source=source,
            recency=recency,
            min_score=min_score,
            on_progress=on_progress,
            machine=machine,
        ).results  # type: ignore[return-value]

    def search_page(
        self,
        query: str,
        *,
        limit: int = 6,
        offset: int = 0,
        session: Optional[str] = None,
        since: Optional[str] = None,
        source: Optional[str] = None,
        recency: bool = True,
        min_score: float = 0.0,
        on_progress: CatalogProgressCallback = None,
        machine: Optional[str] = None,
    ) -> SearchPage:
        """:meth:`search` as a page of the ranking (``offset`` to ``offset + limit``) with the
        total number of hits (see :func:`memstore.search_catalog`); ``results`` is a
        :class:`memstore.search.SearchResults`."""
        from .search import search_live

        return search_live(
            self._catalog(),
            query,
            limit=limit,
            offset=offset,
            session=session,
            since=since,
            source=source,
            recency=recency,
            min_score=min_score,
            on_progress=on_progress,
            machine=machine,
        )

    def refresh(
        self,
        *,
        full: bool = True,
        sweep: bool = True,
        progress: Progress = None,
        on_progress: CatalogProgressCallback = None,
    ) -> RefreshReport:
        """Bring the catalog up to date with the sessions (see :func:`memstore.refresh_catalog`):
        by default a full check of every session's files. ``full=False`` copies what the change
        feed names and what a sweep of the sessions finds changed; ``full=False, sweep=False``
        what the feed names, sweeping only when the last sweep is older than the sweep interval
        (what a search does first; with nothing changed, it looks at no session).
        ``progress(done, total)`` is called as sessions are looked at, ``on_progress`` (a
        :class:`memstore.catalog.CatalogProgress`) as they are copied."""
        from .catalog import RefreshMode

        mode = RefreshMode.FULL if full else RefreshMode.SWEEP if sweep else RefreshMode.FEED
        return self._catalog().refresh(mode, progress=progress, on_progress=on_progress)

    def facts(self, limit: Optional[int] = 100, *, session: Optional[str] = None) -> list[memory_view.FactRecord]:
        """The grounded facts of the memory views, newest sessions first (or one session's)."""
        if session is None:
            return memory_view.query_facts(self.path, limit)
        rows = memory_view.session_memory_facts(self.path, session)
        if limit is not None:
            rows = rows[:limit]
        return [memory_view.FactRecord(fact=row["fact"], session_id=session, source=row["source"]) for row in rows]

    def recent(self, n: int) -> list[SessionSummary]:
        """The ``n`` most recently updated sessions, newest first."""
        return memory_view.recent_sessions(self.path, n)

    def progress(self, session_id: str) -> Optional[ledger.ProgressLedger]:
        """The session's progress ledger, ``None`` when it has none."""
        return ledger.load_progress(self.path, session_id)

    # -- maintenance -----------------------------------------------------------------------------

    def rebuild(self, session_id: Optional[str] = None, *, jobs: int = 1, refresh: bool = True):
        """Regenerate views from the logs: one session's (returning its manifest) or, with no
        ``session_id``, every session's, returning a :class:`~memstore.maintenance.RebuildReport`
        (each session rebuilt, skipped with its reason, or failed with its error; iterating over
        it gives the manifests rebuilt). See :func:`memstore.rebuild`."""
        from .maintenance import rebuild

        return rebuild(self.path, session_id, refresh=refresh, jobs=jobs)

    def rebuild_each(self, ids: Iterable[str], *, jobs: int = 1):
        """Rebuild each of ``ids``, yielding ``(session_id, manifest or error)``."""
        from .maintenance import rebuild_each

        return rebuild_each(self.path, ids, jobs=jobs)

    def doctor(self, *, fix: bool = False, progress: Progress = None) -> DoctorReport:
        """Check (and with ``fix``, repair) every session and the catalog."""
        from .maintenance import check_store

        return check_store(self.path, fix=fix, progress=progress)

    def retention(
        self,
        policy: Optional[RetentionPolicy] = None,
        *,
        apply: bool = False,
        preserve: Optional[str] = None,
    ) -> RetentionReport:
        """What retention would remove under ``policy`` (a dry run), or, with ``apply=True``,
        remove it: a removal is always asked for explicitly. ``preserve`` is never touched."""
        from .retention import RetentionPolicy, apply_retention_preserving

        return apply_retention_preserving(self.path, policy or RetentionPolicy(), preserve, apply=apply)

    def pin(self, session_id: str, reason: str = "") -> Path:
        """Keep ``session_id`` from retention until :meth:`unpin`."""
        from .retention import pin_session_retention

        return pin_session_retention(self.session_path(session_id), reason)

    def unpin(self, session_id: str) -> bool:
        """Let retention consider ``session_id`` again; whether it was pinned."""
        from .retention import unpin_session_retention

        return unpin_session_retention(self.session_path(session_id))

    # -- in and out ------------------------------------------------------------------------------

    def import_logs(
        self,
        paths: Union[PathArg, Iterable[PathArg]],
        source: str = "auto",
        *,
        settle_seconds: Optional[float] = None,
        progress: Progress = None,
        jobs: Optional[int] = None,
    ) -> ImportReport:
        """Import Codex CLI and Claude Code logs, or another store's sessions (see
        :func:`memstore.import_logs`; ``settle_seconds`` ``None`` is its default, ``jobs`` the
        worker processes)."""
        from .importers import DEFAULT_SETTLE_SECONDS, import_logs

        settle = DEFAULT_SETTLE_SECONDS if settle_seconds is None else settle_seconds
        return import_logs(self.path, paths, source, settle_seconds=settle, progress=progress, jobs=jobs)

    def migrate(self, *, remove_legacy: bool = False) -> MigrationReport:
        """Import VT Code's legacy stores under the root (see :func:`memstore.migrate_legacy`)."""
        from .migration import migrate_legacy

        return migrate_legacy(self.path, remove_legacy)

    def pack(self, session_id: str, output: Optional[PathArg] = None) -> tuple[SessionAuditPack, Path]:
        """Write an audit pack of ``session_id``; returns ``(pack, path)``."""
        from .pack import write_audit_pack

        return write_audit_pack(self.path, session_id, output)

    def verify(self, session_id: str, pack_path: Optional[PathArg] = None) -> PackVerification:
        """Verify ``session_id`` against an audit pack (by default its own)."""
        from .pack import default_pack_path, read_audit_pack, verify_audit_pack

        path = pack_path if pack_path is not None else default_pack_path(self.path, session_id)
        return verify_audit_pack(self.path, session_id, read_audit_pack(path))

    # -- secrets and forgetting -------------------------------------------------------------------

    def scrub(self, session_id: Optional[str] = None) -> list[ScrubReport]:
        """Rewrite the log of ``session_id`` (with ``None``, of every session) with its secrets
        redacted, keeping seqs, turns and every other byte; crash-safe, recorded in
        ``gc-log.jsonl``, views rebuilt (see :mod:`memstore.scrub`)."""
        from .scrub import scrub_session, scrub_store

        if session_id is None:
            return scrub_store(self.path)
        return [scrub_session(self.path, session_id)]

    def forget(self, session_id: str) -> ForgetReport:
        """Remove ``session_id`` with a tombstone, so no later import brings it back (see
        :mod:`memstore.forget`)."""
        from .forget import forget_session

        return forget_session(self.path, session_id)

    def unforget(self, session_id: str) -> Tombstone:
        """Undo :meth:`forget`'s tombstone (the next import of its source recreates it)."""
        from .forget import unforget_session

        return unforget_session(self.path, session_id)


def _session_entries(base: Path) -> list[os.DirEntry]:
    """The directories of ``base`` that hold a log: real directories (no symlink), not dot-named.
    A missing ``base`` has none; one that cannot be listed raises :class:`StoreIOError`."""
    try:
        entries = list(os.scandir(base))
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise StoreIOError.from_os_error("list", base, exc) from exc
    return [
        entry
        for entry in entries
        if not entry.name.startswith(".")
        and entry.is_dir(follow_symlinks=False)
        and os.path.isfile(os.path.join(entry.path, EVENTS_FILE))
    ]
