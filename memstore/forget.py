"""``forget``: remove a session for good, so that no later import brings it back.

:func:`forget_session` tombstones the session (``tombstones.jsonl``: its id and, for an imported
session, its source's path and fingerprint) and removes its directory through the store's trash,
recording the removal in ``gc-log.jsonl``, then drops it from the catalog. The tombstone is
written (and synced) once the directory is in the trash and before it is deleted, so a removal
is never without its tombstone; if the tombstone cannot be written the directory is put back.
An import skips every source whose session is tombstoned, and refuses to run at all while the
tombstone file is damaged (see :mod:`memstore.tombstones`): a forgotten session does not come
back by accident.

:func:`unforget_session` is the explicit undo: it removes the tombstone (the session's data is
gone; the next import of its source recreates it).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import orjson

from . import events as ev
from .errors import MemstoreError, SessionBusyError, SessionNotFound, StoreIOError
from .fsio import open_private_append, read_no_follow, write_all
from .layout import DERIVED_DIR, IMPORT_STATE_FILE, SESSIONS_DIR, events_path, gc_log_path, session_directory
from .locks import remove_session_directory
from .session.manifest import load_manifest
from .tombstones import Tombstone, TombstoneReason, Tombstones

logger = logging.getLogger(__name__)

_fdatasync = getattr(os, "fdatasync", os.fsync)


class NotForgotten(MemstoreError, LookupError):
    """``forget --undo`` of a session that has no tombstone."""


@dataclass(frozen=True)
class ForgetReport:
    """A forgotten session: its tombstone and the bytes its directory held."""

    tombstone: Tombstone
    bytes: int

    def to_dict(self) -> dict:
        return {
            "session_id": self.tombstone.session_id,
            "forgotten_at": self.tombstone.at,
            "bytes": self.bytes,
            "source_path": self.tombstone.source_path,
            "source_fingerprint": self.tombstone.source_fingerprint,
        }


def forget_session(root: os.PathLike | str, session_id: str, *, refresh: bool = True) -> ForgetReport:
    """Remove ``session_id`` with a tombstone (see the module docstring); with ``refresh``
    (the default) drop it from the catalog too. Raises :class:`SessionNotFound` when there is no
    such session, :class:`SessionBusyError` when a process (this one included) has it open, and
    :class:`~memstore.tombstones.TombstoneFileError` when ``tombstones.jsonl`` is damaged
    (nothing is removed: the tombstone could not be trusted to keep it removed)."""
    root = Path(root)
    directory = session_directory(root, session_id)
    if directory.is_symlink() or not events_path(directory).is_file():
        raise SessionNotFound(session_id, events_path(directory))
    tombstones = Tombstones(root)
    tombstones.all()  # fails closed on a damaged file before anything is touched
    manifest = load_manifest(directory)
    source = manifest.source if manifest is not None and isinstance(manifest.source, dict) else {}
    source_path = source.get("path") if isinstance(source.get("path"), str) else None
    fingerprint = _import_fingerprint(directory) if source_path is not None else None
    size = _tree_bytes(directory)
    recorded: list[Tombstone] = []

    def record() -> None:
        recorded.append(
            tombstones.record(
                session_id, TombstoneReason.FORGET, source_path=source_path, source_fingerprint=fingerprint
            )
        )
        _gc_record(root, session_id, directory, size)

    if not remove_session_directory(root, directory, on_moved=record):
        if os.path.lexists(directory):
            raise SessionBusyError(f"session {session_id!r} is open for writing; close it before forgetting it")
        raise SessionNotFound(session_id, events_path(directory))
    logger.info("forgot session %s (%d bytes)", session_id, size)
    if refresh:
        from .catalog import refresh_catalog

        refresh_catalog(root)
    return ForgetReport(recorded[0], size)


def unforget_session(root: os.PathLike | str, session_id: str) -> Tombstone:
    """Remove the tombstone of ``session_id`` (its next import recreates it); return it.
    Raises :class:`NotForgotten` when it has none, and
    :class:`~memstore.tombstones.TombstoneFileError` when the file is damaged."""
    undone = Tombstones(root).remove(session_id)
    if undone is None:
        raise NotForgotten(f"session {session_id!r} is not forgotten (no tombstone in {Tombstones(root).path})")
    logger.info("session %s is no longer forgotten (tombstone of %s removed)", session_id, undone.at)
    return undone


def _import_fingerprint(directory: Path) -> Optional[dict]:
    """The source as the import last saw it (size, consumed offset, sha256 of its head and
    tail), from the session's import cache; ``None`` when it has none."""
    try:
        raw = read_no_follow(directory / DERIVED_DIR / IMPORT_STATE_FILE)
        state = orjson.loads(raw) if raw is not None else None
    except (MemstoreError, orjson.JSONDecodeError):
        return None
    if not isinstance(state, dict):
        return None
    raw_source = state.get("source")
    source: dict = raw_source if isinstance(raw_source, dict) else {}
    found = {
        "size": source.get("size"),
        "offset": state.get("offset"),
        "head_sha256": state.get("head_sha256"),
        "tail_sha256": state.get("tail_sha256"),
    }
    return {k: v for k, v in found.items() if isinstance(v, (int, str)) and not isinstance(v, bool)} or None


def _tree_bytes(path: Path) -> int:
    total = 0
    for directory, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(directory, name)).st_size
            except OSError:
                continue
    return total


def _gc_record(root: Path, session_id: str, directory: Path, size: int) -> None:
    """Append the removal to ``gc-log.jsonl`` (as retention records its own), synced."""
    path = gc_log_path(root)
    line = orjson.dumps(
        {
            "session_id": session_id,
            "directory": f"{SESSIONS_DIR}/{directory.name}",
            "removed_at": ev.utc_now(),
            "reason": "forget",
            "bytes": size,
            "updated_at": None,
        },
        option=orjson.OPT_APPEND_NEWLINE,
    )
    fd, _created = open_private_append(path)
    try:
        write_all(fd, line, path)
        try:
            _fdatasync(fd)
        except OSError as exc:
            raise StoreIOError.from_os_error("fsync", path, exc) from exc
    finally:
        os.close(fd)


__all__ = ["ForgetReport", "NotForgotten", "forget_session", "unforget_session"]
