"""What VT Code would make of a session directory: a model of ``vtcode-memory``'s open (reference
section 5.3: the fast path, ``scan_turn_base`` and the scan with its turn state machine, 5.2),
written from the reference for tests that check memstore leaves directories VT Code reads right.

It reads only what VT Code reads: ``events.jsonl``, ``manifest.json``, ``index/turns.json``
(memstore does not write it) and ``index/pending-cap-rewrite.json``. It knows nothing of
memstore's own additions (the log head's ``retained_turn_base``, ``seq``, ``ts``, the SQLite
index), and it validates envelopes as VT Code does: a string ``schema_version``, an ``event``
object with a string ``type``, lifecycle events in full shape (checked with memstore's
validation of those five kinds, which follows the same contract). ``turn.aborted``,
``turn.blocked`` and every other type are "other" events to it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from memstore.events import lifecycle_problem

VTCODE_LIFECYCLE = ("thread.started", "thread.completed", "turn.started", "turn.completed", "turn.failed")


@dataclass
class VtTurn:
    number: int
    start: int
    end: int
    event_count: int


@dataclass
class VtView:
    """The state VT Code's open arrives at: counters, the turn index, and which way it took."""

    turn_count: int
    event_count: int
    in_turn: bool
    retained_turn_base: int
    turns: list[VtTurn] = field(default_factory=list)
    fast_path: bool = False

    def numbers(self) -> list[int]:
        return [t.number for t in self.turns]


def _load(path: Path) -> Optional[dict]:
    try:
        data = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _marker(session_dir: Path) -> Optional[tuple[int, int, int]]:
    data = _load(session_dir / "index" / "pending-cap-rewrite.json")
    if data is None:
        return None
    try:
        values = (data["previous_file_len"], data["new_file_len"], data["retained_turn_base"])
    except KeyError:
        return None
    return values if all(type(v) is int and v >= 0 for v in values) else None


def _manifest(session_dir: Path) -> Optional[dict]:
    data = _load(session_dir / "manifest.json")
    if data is None:
        return None
    summary = ("session_id", "turn_count", "event_count", "status", "updated_at")
    return data if all(k in data for k in summary) else None


def _index(session_dir: Path) -> Optional[list[VtTurn]]:
    data = _load(session_dir / "index" / "turns.json")
    if data is None or not isinstance(data.get("entries"), list):
        return None
    try:
        return [VtTurn(e["turn_number"], e["start_offset"], e["end_offset"], e["event_count"]) for e in data["entries"]]
    except (KeyError, TypeError):
        return None


def _valid_against(entries: list[VtTurn], length: int) -> bool:
    previous = 0
    for turn in entries:
        if turn.event_count <= 0 or turn.start < previous or turn.start > turn.end or turn.end > length:
            return False
        previous = turn.end
    return True


def _consistent(entries: list[VtTurn], manifest: dict) -> bool:
    base = manifest.get("retained_turn_base", 1)
    expected_last = manifest["turn_count"] + (1 if manifest.get("in_turn") else 0)
    if not entries:
        return expected_last == 0 or base > manifest["turn_count"]
    numbers = [t.number for t in entries]
    return (
        numbers == list(range(numbers[0], numbers[0] + len(numbers)))
        and numbers[0] == base
        and numbers[-1] == expected_last
    )


def valid_record(line: bytes) -> Optional[dict]:
    """The event of a line VT Code accepts as a record, else ``None``."""
    try:
        envelope = json.loads(line)
    except ValueError:
        return None
    if not isinstance(envelope, dict) or not isinstance(envelope.get("schema_version"), str):
        return None
    event = envelope.get("event")
    if not isinstance(event, dict) or not isinstance(event.get("type"), str):
        return None
    if event["type"] in VTCODE_LIFECYCLE and lifecycle_problem(event) is not None:
        return None
    return event


def scan_turn_base(session_dir: Path, file_len: int) -> int:
    marker = _marker(session_dir)
    if marker is not None and marker[1] == file_len < marker[0]:
        return max(1, marker[2])
    manifest = _manifest(session_dir)
    stale = _index(session_dir) or []
    if manifest is not None and manifest.get("persisted_file_len", 0) > file_len:
        previous = manifest["persisted_file_len"]
        removed = previous - file_len
        if _valid_against(stale, previous):
            for turn in stale:
                if turn.start >= removed:
                    return max(1, turn.number)
        if file_len == 0:
            return manifest["turn_count"] + 1
    if manifest is not None and "retained_turn_base" in manifest:
        return manifest["retained_turn_base"]
    if stale and _valid_against(stale, file_len):
        return max(1, stale[0].number)
    return 1


def open_view(session_dir: Path) -> VtView:
    """What VT Code's ``open`` of ``session_dir`` would hold (it changes nothing on disk)."""
    session_dir = Path(session_dir)
    data = (session_dir / "events.jsonl").read_bytes() if (session_dir / "events.jsonl").exists() else b""
    file_len = len(data)
    marker = _marker(session_dir)
    manifest = _manifest(session_dir)
    entries = _index(session_dir) or []
    matching = marker is not None and marker[1] == file_len < marker[0]
    if (
        not matching
        and manifest is not None
        and "in_turn" in manifest
        and manifest.get("persisted_file_len") == file_len
        and _valid_against(entries, file_len)
        and _consistent(entries, manifest)
    ):
        return VtView(
            manifest["turn_count"],
            manifest["event_count"],
            manifest["in_turn"],
            manifest.get("retained_turn_base", 1),
            entries,
            fast_path=True,
        )
    base = scan_turn_base(session_dir, file_len)
    view = VtView(base - 1, 0, False, base)
    position = 0
    for raw in data.split(b"\n")[:-1] if data.endswith(b"\n") else data.split(b"\n"):
        start, end = position, position + len(raw) + 1
        position = end
        if not raw.strip():
            continue
        event = valid_record(raw)
        if event is None:
            continue
        view.event_count += 1
        kind = event["type"]
        if kind == "turn.started":
            view.turns.append(VtTurn(view.turn_count + 1, start, end, 1))
            view.in_turn = True
        elif kind in ("turn.completed", "turn.failed"):
            if view.in_turn:
                last = view.turns[-1]
                last.end, last.event_count = end, last.event_count + 1
                view.turn_count = max(view.turn_count, last.number)
                view.in_turn = False
        elif kind in ("thread.started", "thread.completed"):
            continue  # session records: counted, never part of a turn (reference 5.2)
        elif view.in_turn:
            last = view.turns[-1]
            last.end, last.event_count = end, last.event_count + 1
    return view
