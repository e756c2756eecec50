"""memstore: a per-session event store for AI coding agents.

``events.jsonl`` is canonical and append-only; everything else (the per-session SQLite index,
the manifest, derived views, the catalog) is regenerable from it.
"""

from .errors import (
    CapEvictionError,
    InvalidEvent,
    InvalidPack,
    LogFailedError,
    MemstoreError,
    SessionBusyError,
    SessionClosedError,
    StoreIOError,
    TurnNotFound,
    UnsafePathError,
)
from .events import SCHEMA_VERSION
from .fsio import sanitize_session_id, session_directory
from .lock import is_live
from .manifest import Manifest, SessionSummary

# --- progress and audit packs ---

__version__ = "0.1.0"
