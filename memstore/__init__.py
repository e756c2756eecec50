"""memstore: a per-session event store for AI coding agents.

``events.jsonl`` is canonical and append-only; everything else (the per-session SQLite index,
the manifest, derived views, the catalog) is regenerable from it.
"""

from .errors import (
    CapEvictionError,
    EventNotFound,
    InvalidEvent,
    InvalidSessionId,
    InvalidPack,
    InvalidProgress,
    LogFailedError,
    MemstoreError,
    SessionBusyError,
    SessionClosedError,
    SessionNotFound,
    StoreIOError,
    TurnNotFound,
    UnsafePathError,
)
from .views import chunks as _chunks  # noqa: F401  (registers the search chunks with every session index)
from .demo import DemoReport, write_demo_store
from .events import SCHEMA_VERSION
from .layout import sanitize_session_id, session_dir_name, session_directory
from .importers import ImportReport, import_logs
from .session.index import Turn
from .session.lock import is_live
from .session.log import (
    DEFAULT_MAX_EVENTS,
    CapPlan,
    SessionLog,
    open_session,
    plan_cap_eviction,
    rebuild,
    rebuild_each,
    write_eviction_summary,
)
from .session.manifest import Manifest, SessionSummary, list_sessions
from .views.memory_view import (
    FactRecord,
    memory_facts_of,
    query_facts,
    recent_sessions,
    refresh_memory_view,
    session_memory_facts,
    write_session_memory_view,
)
from .migration import LegacyGcReport, MigrationReport, gc_legacy, migrate_legacy
from .reader import SessionReader, read_session
from .catalog import RefreshReport, refresh_catalog
from .search import MemorySearchResult, search_memory
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
from .pack import (
    AuditPackEntry,
    PackVerification,
    SessionAuditPack,
    create_audit_pack,
    read_audit_pack,
    verify_audit_pack,
    write_audit_pack,
)
from .views.progress import (
    GoalClassifierVerdict,
    GoalEvent,
    GoalHistoryEntry,
    GoalOrchestration,
    GoalPauseReason,
    GoalPhase,
    GoalStatus,
    GoalTracker,
    Milestone,
    MilestoneStatus,
    ProgressLedger,
    load_progress,
    milestone_status_from_str,
    progress_path,
    save_progress,
)

__version__ = "0.1.0"


def __getattr__(name: str):
    # The explorer's names load on first use: importing memstore stays light.
    if name in ("check_store", "DoctorReport"):
        from .explorer import doctor

        return getattr(doctor, name)
    raise AttributeError(f"module 'memstore' has no attribute {name!r}")

__all__ = [
    # the event log
    "open_session", "SessionLog", "rebuild", "rebuild_each", "read_session", "SessionReader",
    # search and the catalog
    "search_memory", "MemorySearchResult", "refresh_catalog", "RefreshReport", "Turn", "Manifest", "SessionSummary", "list_sessions",
    "session_directory", "session_dir_name", "sanitize_session_id", "is_live", "plan_cap_eviction", "CapPlan",
    "write_eviction_summary", "DEFAULT_MAX_EVENTS", "SCHEMA_VERSION",
    # progress and goals
    "ProgressLedger", "Milestone", "MilestoneStatus", "milestone_status_from_str", "load_progress",
    "save_progress", "progress_path", "GoalTracker", "GoalStatus", "GoalPhase", "GoalEvent",
    "GoalPauseReason", "GoalClassifierVerdict", "GoalOrchestration", "GoalHistoryEntry",
    # the demonstration store, and checking a store (memstore.explorer holds the Datasette side)
    "write_demo_store", "DemoReport", "check_store", "DoctorReport",
    # importing other agents' logs
    "import_logs", "ImportReport",
    # audit packs
    "SessionAuditPack", "AuditPackEntry", "PackVerification", "create_audit_pack", "write_audit_pack",
    "read_audit_pack", "verify_audit_pack",
    # retention, legacy migration, memory views
    "RetentionPolicy", "RetentionReport", "apply_retention", "apply_retention_preserving",
    "mark_abandoned_active_sessions", "evict_zero_turn_completed_store", "pin_session_retention",
    "unpin_session_retention", "session_retention_pinned", "retention_pinned_session_ids",
    "MigrationReport", "LegacyGcReport", "migrate_legacy", "gc_legacy",
    "FactRecord", "write_session_memory_view", "refresh_memory_view", "session_memory_facts", "memory_facts_of",
    "query_facts", "recent_sessions",
    # errors
    "MemstoreError", "StoreIOError", "UnsafePathError", "InvalidEvent", "InvalidSessionId", "SessionNotFound",
    "EventNotFound", "TurnNotFound", "LogFailedError",
    "SessionClosedError", "SessionBusyError", "CapEvictionError", "InvalidPack", "InvalidProgress",
]
