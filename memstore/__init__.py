"""memstore: a per-session event store for AI coding agents.

``events.jsonl`` is canonical and append-only; everything else (the per-session SQLite index,
the manifest, derived views, the catalog) is regenerable from it.

Start with :class:`Store`::

    store = memstore.Store("~/.memstore")
    with store.open("my-session") as log:
        log.append({"type": "turn.started"})

Importing memstore loads only what opening a session and appending need; every other name
(search, the catalog, importers, retention, packs, ...) is loaded on first use (PEP 562).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .errors import (
    CapEvictionError,
    EventNotFound,
    InvalidEvent,
    InvalidPack,
    InvalidProgress,
    InvalidSessionId,
    LogFailedError,
    MemstoreError,
    SessionBusyError,
    SessionClosedError,
    SessionNotFound,
    StoreIOError,
    StoreReadOnly,
    TurnNotFound,
    UnsafePathError,
)
from .events import SCHEMA_VERSION
from .layout import sanitize_session_id, session_dir_name, session_directory
from .session.index import Turn
from .session.lock import is_live
from .session.log import (
    DEFAULT_MAX_EVENTS,
    CapPlan,
    SessionLog,
    open_session,
    plan_cap_eviction,
    write_eviction_summary,
)
from .session.manifest import Manifest, SessionSummary, list_sessions
from .views import chunks as _chunks  # noqa: F401  (the built-in views register with every session index)

__version__ = "0.1.0"

# Lazily loaded names: attribute -> the module (relative to this package) that defines it.
_LAZY = {
    "Store": ".store",
    "read_session": ".reader",
    "SessionReader": ".reader",
    "rebuild": ".maintenance",
    "rebuild_each": ".maintenance",
    "check_store": ".maintenance",
    "DoctorReport": ".maintenance",
    "search_memory": ".search",
    "MemorySearchResult": ".search",
    "SearchPage": ".search",
    "search_catalog": ".search",
    "refresh_catalog": ".catalog",
    "RefreshReport": ".catalog",
    "import_logs": ".importers",
    "ImportReport": ".importers",
    "write_demo_store": ".demo",
    "DemoReport": ".demo",
    "FactRecord": ".views.memory_view",
    "write_session_memory_view": ".views.memory_view",
    "refresh_memory_view": ".views.memory_view",
    "session_memory_facts": ".views.memory_view",
    "memory_facts_of": ".views.memory_view",
    "query_facts": ".views.memory_view",
    "recent_sessions": ".views.memory_view",
    "MigrationReport": ".migration",
    "LegacyGcReport": ".migration",
    "migrate_legacy": ".migration",
    "gc_legacy": ".migration",
    "RetentionPolicy": ".retention",
    "RetentionReport": ".retention",
    "apply_retention": ".retention",
    "apply_retention_preserving": ".retention",
    "mark_abandoned_active_sessions": ".retention",
    "evict_zero_turn_completed_store": ".retention",
    "pin_session_retention": ".retention",
    "unpin_session_retention": ".retention",
    "session_retention_pinned": ".retention",
    "retention_pinned_session_ids": ".retention",
    "AuditPackEntry": ".pack",
    "PackVerification": ".pack",
    "SessionAuditPack": ".pack",
    "create_audit_pack": ".pack",
    "read_audit_pack": ".pack",
    "verify_audit_pack": ".pack",
    "write_audit_pack": ".pack",
    "Milestone": ".views.progress",
    "MilestoneStatus": ".views.progress",
    "ProgressLedger": ".views.progress",
    "load_progress": ".views.progress",
    "milestone_status_from_str": ".views.progress",
    "progress_path": ".views.progress",
    "save_progress": ".views.progress",
    "GoalClassifierVerdict": ".goals",
    "GoalEvent": ".goals",
    "GoalHistoryEntry": ".goals",
    "GoalOrchestration": ".goals",
    "GoalPauseReason": ".goals",
    "GoalPhase": ".goals",
    "GoalStatus": ".goals",
    "GoalTracker": ".goals",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'memstore' has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value  # loaded once
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


if TYPE_CHECKING:
    from .catalog import RefreshReport, refresh_catalog
    from .goals import (
        GoalClassifierVerdict,
        GoalEvent,
        GoalHistoryEntry,
        GoalOrchestration,
        GoalPauseReason,
        GoalPhase,
        GoalStatus,
        GoalTracker,
    )
    from .importers import ImportReport, import_logs
    from .maintenance import DoctorReport, check_store, rebuild, rebuild_each
    from .migration import LegacyGcReport, MigrationReport, gc_legacy, migrate_legacy
    from .pack import (
        AuditPackEntry,
        PackVerification,
        SessionAuditPack,
        create_audit_pack,
        read_audit_pack,
        verify_audit_pack,
        write_audit_pack,
    )
    from .reader import SessionReader, read_session
    from .retention import (
        RetentionPolicy,
        RetentionReport,
        apply_retention,
        apply_retention_preserving,
        evict_zero_turn_completed_store,
        mark_abandoned_active_sessions,
        pin_session_retention,
        retention_pinned_session_ids,
        session_retention_pinned,
        unpin_session_retention,
    )
    from .search import MemorySearchResult, SearchPage, search_catalog, search_memory
    from .store import Store
    from .views.memory_view import (
        FactRecord,
        memory_facts_of,
        query_facts,
        recent_sessions,
        refresh_memory_view,
        session_memory_facts,
        write_session_memory_view,
    )
    from .views.progress import (
        Milestone,
        MilestoneStatus,
        ProgressLedger,
        load_progress,
        milestone_status_from_str,
        progress_path,
        save_progress,
    )

__all__ = [
    # the object users hold
    "Store",
    # the event log
    "open_session",
    "SessionLog",
    "rebuild",
    "rebuild_each",
    "read_session",
    "SessionReader",
    # search and the catalog
    "search_memory",
    "search_catalog",
    "SearchPage",
    "MemorySearchResult",
    "refresh_catalog",
    "RefreshReport",
    "Turn",
    "Manifest",
    "SessionSummary",
    "list_sessions",
    "session_directory",
    "session_dir_name",
    "sanitize_session_id",
    "is_live",
    "plan_cap_eviction",
    "CapPlan",
    "write_eviction_summary",
    "DEFAULT_MAX_EVENTS",
    "SCHEMA_VERSION",
    # progress and goals
    "ProgressLedger",
    "Milestone",
    "MilestoneStatus",
    "milestone_status_from_str",
    "load_progress",
    "save_progress",
    "progress_path",
    "GoalTracker",
    "GoalStatus",
    "GoalPhase",
    "GoalEvent",
    "GoalPauseReason",
    "GoalClassifierVerdict",
    "GoalOrchestration",
    "GoalHistoryEntry",
    # checking a store
    "check_store",
    "DoctorReport",
    # importing other agents' logs
    "import_logs",
    "ImportReport",
    # audit packs
    "SessionAuditPack",
    "AuditPackEntry",
    "PackVerification",
    "create_audit_pack",
    "write_audit_pack",
    "read_audit_pack",
    "verify_audit_pack",
    # retention, legacy migration, memory views
    "RetentionPolicy",
    "RetentionReport",
    "apply_retention",
    "apply_retention_preserving",
    "mark_abandoned_active_sessions",
    "evict_zero_turn_completed_store",
    "pin_session_retention",
    "unpin_session_retention",
    "session_retention_pinned",
    "retention_pinned_session_ids",
    "MigrationReport",
    "LegacyGcReport",
    "migrate_legacy",
    "gc_legacy",
    "FactRecord",
    "write_session_memory_view",
    "refresh_memory_view",
    "session_memory_facts",
    "memory_facts_of",
    "query_facts",
    "recent_sessions",
    # errors
    "MemstoreError",
    "StoreIOError",
    "StoreReadOnly",
    "UnsafePathError",
    "InvalidEvent",
    "InvalidSessionId",
    "SessionNotFound",
    "EventNotFound",
    "TurnNotFound",
    "LogFailedError",
    "SessionClosedError",
    "SessionBusyError",
    "CapEvictionError",
    "InvalidPack",
    "InvalidProgress",
]
