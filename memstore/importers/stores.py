"""Importing another memstore store: the sessions of a copy of another machine's (or a
teammate's) ``<root>``, merged into this store with their ids, their sequence numbers and their
times, each one remembering where it came from.

For each session of the other store (its log is only read, through a
:class:`~memstore.reader.SessionReader`; the other store is never written):

- absent here: it is written whole (every record with its own seq and time) into this import's
  staging area with an ``origin.json`` naming the store it came from, and published with its
  batch after one file-system sync (see :mod:`.staging`): whole or absent after a crash;
- present here and the same session (wherever both logs hold a seq, they hold the same record:
  a session copied to two machines, or that reached the other store from this one): only the
  records past this store's last one are appended (under the session's lock, synced when it
  closes); a session this store holds more of is left alone;
- present here and another session that happens to share the id (some seq holds different
  records): it is imported under the id qualified by its origin, ``<id>-from-<origin key>``
  (the origin's store id, first 12 hex digits), with the same rules, so a rerun finds it there. So
  nothing of either session is lost or mixed;
- tombstoned here (removed on purpose): not imported.

``origin.json`` (in the session's ``derived/``) holds the origin store's id and label (the
label defaults to that machine's hostname), the root it was imported from and the session's
id there; :func:`session_origins` reads them for the whole store, so sessions can be told
apart by machine. A session that already came from a third store keeps that first origin (its
``via`` says which store passed it on). ``store-imports.json`` remembers, per origin, the log
each session was last merged from, so a rerun over an unchanged copy reads no log at all:
imports are idempotent.
"""

from __future__ import annotations

import hashlib
import logging
import os
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Optional

import orjson

from ..errors import InvalidEvent, MemstoreError, SessionBusyError, SessionNotFound, StoreIOError
from ..events import Record, utc_now
from ..fsio import atomic_write, read_no_follow
from ..identity import store_identity
from ..layout import (
    CATALOG_FILE,
    DERIVED_DIR,
    EVENTS_FILE,
    ORIGIN_FILE,
    SESSIONS_DIR,
    STORE_IDENTITY_FILE,
    STORE_IMPORTS_FILE,
    iter_session_dirs,
    session_dir_name,
    session_directory,
    store_identity_path,
)
from ..reader import SessionReader, read_session, read_session_dir
from ..session.bulk import NewSession
from ..session.log import open_session
from ..session.manifest import load_manifest
from ..tombstones import Tombstone, Tombstones
from .staging import Staging

logger = logging.getLogger(__name__)

# A batch of new sessions is published once it holds this many sessions or bytes of logs.
BATCH_SESSIONS = 500
BATCH_BYTES = 256 << 20
ORIGIN_KEY_CHARS = 12


def is_store(path: os.PathLike | str) -> bool:
    """Whether ``path`` is the root of a memstore store: a directory with ``sessions/`` and a
    ``store.json``, a ``catalog.db`` or at least one session directory holding a log (an agent's
    own directory with a ``sessions/`` of dated folders, such as ``~/.codex``, is none)."""
    root = Path(path)
    if not (root.is_dir() and (root / SESSIONS_DIR).is_dir()):
        return False
    if (root / STORE_IDENTITY_FILE).is_file() or (root / CATALOG_FILE).is_file():
        return True
    try:
        return next(iter_session_dirs(root, require_log=True), None) is not None
    except StoreIOError:
        return False


@dataclass(frozen=True)
class Origin:
    """Where a session imported from another store came from: that store's id (``None`` when
    it had none), its label (the hostname of its machine, unless renamed), the root it was
    imported from, and the session's id there. ``via`` names the store that passed the session
    on, when that store had it from yet another one (the origin is then the first store)."""

    store_id: Optional[str]
    label: Optional[str]
    root: str
    session_id: str
    imported_at: str
    via: Optional[dict] = None

    @property
    def key(self) -> str:
        """What qualifies an id that collides: the store id's first hex digits, or (a store
        without an id) a hash of the root it was imported from."""
        if self.store_id:
            return self.store_id.replace("-", "")[:ORIGIN_KEY_CHARS]
        return "p" + hashlib.sha256(self.root.encode("utf-8", "surrogateescape")).hexdigest()[: ORIGIN_KEY_CHARS - 1]

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "store_id": self.store_id,
            "label": self.label,
            "root": self.root,
            "session_id": self.session_id,
            "imported_at": self.imported_at,
        }
        if self.via is not None:
            data["via"] = self.via
        return data

    @classmethod
    def from_dict(cls, data: Any) -> Optional[Origin]:
        """The origin ``data`` describes, ``None`` when it is not one."""
        if not isinstance(data, dict):
            return None
        store_id, label, root = data.get("store_id"), data.get("label"), data.get("root")
        session_id, imported_at, via = data.get("session_id"), data.get("imported_at"), data.get("via")
        if not (isinstance(root, str) and isinstance(session_id, str) and isinstance(imported_at, str)):
            return None
        return cls(
            store_id if isinstance(store_id, str) else None,
            label if isinstance(label, str) else None,
            root,
            session_id,
            imported_at,
            via if isinstance(via, dict) else None,
        )


def load_origin(directory: os.PathLike | str) -> Optional[Origin]:
    """The origin recorded in the session directory ``directory``; ``None`` for a session that
    was not imported from another store (or whose record is unreadable, which is logged)."""
    path = Path(directory) / DERIVED_DIR / ORIGIN_FILE
    data = read_no_follow(path)
    if data is None:
        return None
    try:
        origin = Origin.from_dict(orjson.loads(data))
    except orjson.JSONDecodeError:
        origin = None
    if origin is None:
        logger.warning("%s is not an origin record; ignored", path)
    return origin


def session_origins(root: os.PathLike | str) -> dict[str, Origin]:
    """The origin of every session of the store at ``root`` that came from another store, by
    session directory name (filter by ``Origin.store_id`` or ``label`` to pick a machine's)."""
    found = {}
    for entry in iter_session_dirs(root, require_log=True, sort=True):
        origin = load_origin(entry.path)
        if origin is not None:
            found[entry.name] = origin
    return found


def qualified_id(session_id: str, origin: Origin) -> str:
    """The id a session of ``origin`` is imported under when its own id names another session
    here."""
    return f"{session_id}-from-{origin.key}"


def source_identity(root: Path) -> tuple[Optional[str], Optional[str]]:
    """The other store's id and label, read without creating anything there (``None`` each when
    it has no ``store.json``, or one that is not an identity, which is logged)."""
    path = store_identity_path(root)
    data = read_no_follow(path)
    if data is None:
        return None, None
    try:
        value = orjson.loads(data)
        store_id = str(uuid.UUID(value["store_id"]))
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError):
        logger.warning("%s is not a store identity; its sessions are told apart by the path instead", path)
        return None, None
    label = value.get("label")
    return store_id, label if isinstance(label, str) else None


# --------------------------------------------------------------------------------------------
# One session


class Relation(Enum):
    """How a session here stands to the other store's session of the same id."""

    NOTHING_NEW = "nothing_new"  # every record the other holds is here already
    BEHIND = "behind"  # the same session, and the other holds records past the last one here
    OTHER = "other"  # another session: some seq holds different records


def _same(ours: Record, theirs: Record, redact: Optional[Callable[[Any], Any]]) -> bool:
    if not (ours.ts == theirs.ts or ours.ts is None or theirs.ts is None):
        return False
    return ours.event == theirs.event or (redact is not None and ours.event == redact(theirs.event))


def compare(
    ours: Iterator[Record], theirs: Iterator[Record], redact: Optional[Callable[[Any], Any]] = None
) -> tuple[Relation, int]:
    """How the log ``ours`` stands to ``theirs`` (both in seq order), and the last seq both hold
    (0 when they hold none in common).

    They are the same session when, from the first seq both hold on, they hold the same records
    seq by seq until one of them ends (records only one of them holds before that are turns a
    cap evicted from the other). Logs with no seq in common are taken as different sessions,
    unless ours is empty. ``redact`` is this store's redaction, if any: a record of theirs
    matches ours redacted, as this store would have written it at write time or scrubbed it."""
    o, t = next(ours, None), next(theirs, None)
    if o is None:
        return (Relation.BEHIND if t is not None else Relation.NOTHING_NEW), 0
    # Skip what only one of them holds at the head (evicted from the other).
    while o is not None and t is not None and o.seq != t.seq:
        if (o.seq or 0) < (t.seq or 0):
            o = next(ours, None)
        else:
            t = next(theirs, None)
    if o is None or t is None:
        return Relation.OTHER, 0
    last = 0
    while o is not None and t is not None:
        if o.seq != t.seq or not _same(o, t, redact):
            return Relation.OTHER, 0
        last = o.seq or last
        o, t = next(ours, None), next(theirs, None)
    if o is not None:
        return Relation.NOTHING_NEW, last
    return (Relation.BEHIND if t is not None else Relation.NOTHING_NEW), last


@dataclass
class SessionResult:
    """What the import did with one session of the other store (``session_id``: its id here)."""

    source: str  # the other store's session directory
    session_id: Optional[str] = None
    source_session_id: Optional[str] = None  # its id in the other store
    created: bool = False
    updated: bool = False
    unchanged: bool = False
    appended: int = 0
    qualified: bool = False
    tombstoned: Optional[Tombstone] = None
    problems: list[str] = field(default_factory=list)
    staged: Optional[str] = None  # a new session in the staging area, to be published
    bytes: int = 0


# --------------------------------------------------------------------------------------------
# The run


@dataclass
class StoreImport:
    """Importing one other store into the store at ``root`` (the caller holds its ``import``
    lock). :meth:`run` looks at every session of the other store in name order."""

    root: Path
    source_root: Path
    tombstones: Tombstones
    progress: Callable[[int], None] = lambda _n: None

    def run(self) -> list[SessionResult]:
        source_root = self.source_root.absolute()
        ours = store_identity(self.root)
        store_id, label = source_identity(source_root)
        if source_root.resolve() == self.root.resolve() or store_id == ours.store_id:
            raise MemstoreError(f"{source_root} is this store ({ours.store_id}); nothing to import")
        self.now = utc_now()
        self.origin = Origin(store_id, label, str(source_root), "", self.now)
        results: list[SessionResult] = []
        staging = Staging.create(self.root)
        redaction = staging.redaction
        self.our_store_id = ours.store_id
        # Records are compared as this store's redaction sees them: a record this store wrote
        # redacted (at write, or scrubbed after the fact) is the same record as the other's.
        self.redact = redaction.redact_event
        waiting: list[SessionResult] = []
        try:
            area = staging.area("main")
            for entry in iter_session_dirs(source_root, require_log=True, sort=True):
                result = SessionResult(entry.path)
                try:
                    self._one(Path(entry.path), area, result)
                except (MemstoreError, OSError) as exc:
                    result.problems.append(f"not imported: {exc}")
                    logger.warning("import: %s not imported: %s", entry.path, exc)
                results.append(result)
                if result.staged is not None:
                    waiting.append(result)
                    if len(waiting) >= BATCH_SESSIONS or sum(r.bytes for r in waiting) >= BATCH_BYTES:
                        self._publish(staging, waiting)
                        waiting = []
        finally:
            try:
                self._publish(staging, waiting)
            finally:
                staging.close()
        return results

    def _one(self, directory: Path, area: Any, result: SessionResult) -> None:
        try:
            st = os.stat(directory / EVENTS_FILE, follow_symlinks=False)
        except OSError as exc:
            raise StoreIOError.from_os_error("stat", directory / EVENTS_FILE, exc) from exc
        result.bytes = st.st_size
        stamp = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ino": st.st_ino}
        try:
            with read_session_dir(directory) as theirs:
                session_id = result.source_session_id = theirs.session_id
                carried = load_origin(directory)
                if carried is not None and carried.store_id == self.our_store_id and carried.session_id:
                    # One of this store's own sessions, come back: only ever its own id here (and
                    # its tombstone, if it was forgotten), never a copy under a qualified id.
                    candidates = [carried.session_id]
                else:
                    candidates = [session_id, qualified_id(session_id, self.origin)]
                for number, candidate in enumerate(candidates):
                    result.qualified = number > 0
                    stone = self.tombstones.lookup(candidate)
                    if stone is not None:
                        result.session_id, result.tombstoned = candidate, stone
                        return
                    here = session_directory(self.root, candidate)
                    if not os.path.lexists(here):
                        self._stage(theirs, directory, candidate, area, result, stamp)
                        return
                    if self._unchanged_since(here, stamp):
                        result.session_id, result.unchanged = candidate, True
                        return
                    relation = self._merge(theirs, candidate, result)
                    if relation is not Relation.OTHER:
                        result.session_id = candidate
                        self._remember(here, stamp)
                        return
                result.problems.append(
                    f"session {session_id!r} differs from {' and '.join(map(repr, candidates))} here; "
                    "not imported (nothing here was changed)"
                )
        finally:
            self.progress(st.st_size)

    # -- a session that is new here

    def _stage(
        self, theirs: SessionReader, directory: Path, session_id: str, area: Any, result: SessionResult, stamp: dict
    ) -> None:
        name = session_dir_name(session_id)
        new = NewSession(
            area.staged(name),
            session_id,
            retained_turn_base=theirs.manifest.retained_turn_base,
            redaction=area.redaction,
        )
        try:
            for record in theirs.iter_records():
                ts = record.ts or theirs.manifest.updated_at or self.now
                try:
                    new.append(record.event, ts=ts, seq=record.seq)
                except InvalidEvent as exc:
                    raise MemstoreError(f"record {record.seq} cannot be stored: {exc}") from exc
            new.finish()
            carried = load_origin(directory)
            origin = self._origin_of(theirs.session_id, carried)
            atomic_write(new.directory / DERIVED_DIR / ORIGIN_FILE, _json(origin.to_dict()), durable=False)
            atomic_write(
                new.directory / DERIVED_DIR / STORE_IMPORTS_FILE,
                _json({self.origin.key: {**stamp, "next_seq": new.next_seq}}),
                durable=False,
            )
        except BaseException:
            new.abandon()
            area.discard(name)
            raise
        result.session_id, result.created, result.appended = session_id, True, new.event_count
        result.staged = str(new.directory)

    def _origin_of(self, session_id: str, carried: Optional[Origin]) -> Origin:
        here = Origin(self.origin.store_id, self.origin.label, self.origin.root, session_id, self.now)
        if carried is None:
            return here
        via = {k: v for k, v in here.to_dict().items() if k != "imported_at"}
        return Origin(carried.store_id, carried.label, carried.root, carried.session_id, carried.imported_at, via)

    # -- a session that is here already

    def _unchanged_since(self, here: Path, stamp: dict) -> bool:
        """Whether this session was merged from this very log (same size, time and inode) and
        has not been written since: then there is nothing to read."""
        remembered = _load_json(here / DERIVED_DIR / STORE_IMPORTS_FILE).get(self.origin.key)
        if not isinstance(remembered, dict):
            return False
        manifest = load_manifest(here)
        return (
            manifest is not None
            and all(remembered.get(k) == v for k, v in stamp.items())
            and remembered.get("next_seq") == manifest.next_seq
        )

    def _remember(self, here: Path, stamp: dict) -> None:
        manifest = load_manifest(here)
        if manifest is None:
            return
        path = here / DERIVED_DIR / STORE_IMPORTS_FILE
        known = _load_json(path)
        known[self.origin.key] = {**stamp, "next_seq": manifest.next_seq}
        # Not synced: losing it only costs reading the logs again next time.
        atomic_write(path, _json(known), durable=False)

    def _merge(self, theirs: SessionReader, session_id: str, result: SessionResult) -> Relation:
        """Compare the session here with theirs and append what it lacks (see :func:`compare`)."""
        try:
            with read_session(self.root, session_id) as ours:
                relation, last = compare(ours.iter_records(), theirs.iter_records(), self.redact)
        except SessionNotFound:
            return Relation.OTHER
        if relation is Relation.NOTHING_NEW:
            result.unchanged = True
            return relation
        if relation is Relation.OTHER:
            return relation
        try:
            log = open_session(self.root, session_id, max_events=0, durability="none")
        except SessionBusyError:
            result.problems.append(f"session {session_id!r} is open in another process; import again later")
            return Relation.NOTHING_NEW
        try:
            if log.manifest.next_seq != last + 1 and last:
                # Written meanwhile: look again next time rather than guess.
                result.problems.append(f"session {session_id!r} was written meanwhile; import again later")
                return Relation.NOTHING_NEW
            for record in theirs.iter_records():
                if (record.seq or 0) <= last:
                    continue
                seq = log.append(record.event, ts=record.ts or theirs.manifest.updated_at or self.now)
                if seq != record.seq:
                    logger.info("import: session %r: record %s appended as %s", session_id, record.seq, seq)
                result.appended += 1
        finally:
            log.close()  # flushes and syncs: the events are durable once the import says so
        result.updated = result.appended > 0
        result.unchanged = not result.updated
        return relation

    # -- publishing

    def _publish(self, staging: Staging, waiting: list[SessionResult]) -> None:
        if not waiting:
            return
        stones = self.tombstones.all()
        publish = []
        for result in waiting:
            stone = stones.get(result.session_id or "")
            assert result.staged is not None
            if stone is None:
                publish.append(result)
                continue
            staging.discard(result.staged)
            result.staged, result.created, result.appended, result.tombstoned = None, False, 0, stone
        outcomes = staging.publish([r.staged for r in publish if r.staged is not None])
        for result, outcome in zip(publish, outcomes):
            result.staged = None
            if not outcome.published:
                staging.discard(outcome.staged)
                result.created, result.appended = False, 0
                result.problems.append(
                    f"session {result.session_id!r} was created here meanwhile; not imported, import again"
                )


def _json(value: Any) -> bytes:
    return orjson.dumps(value, option=orjson.OPT_INDENT_2 | orjson.OPT_APPEND_NEWLINE)


def _load_json(path: Path) -> dict:
    data = read_no_follow(path)
    if data is None:
        return {}
    try:
        value = orjson.loads(data)
    except orjson.JSONDecodeError:
        logger.warning("%s is not JSON; ignored", path)
        return {}
    return value if isinstance(value, dict) else {}


__all__ = [
    "Origin",
    "Relation",
    "SessionResult",
    "StoreImport",
    "compare",
    "is_store",
    "load_origin",
    "qualified_id",
    "session_origins",
    "source_identity",
]
