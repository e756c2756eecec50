"""The compaction-safe progress ledger.

``ProgressLedger`` is a small mutable summary of "are we getting closer to done?", stored at
``<session_dir>/derived/progress.json`` and overwritten on every save. It is not a log: a resumed,
forked or compacted session reads it to re-ground itself without replaying events.

(The goal tracker lives in :mod:`memstore.goals`.)

The wire format follows VT Code's ``progress.rs``: the ledger's keys in a fixed order with a
float32 ``confidence`` (so ``1.0 - 0.1`` is written as ``0.9``).
"""

from __future__ import annotations

import math
import os
import struct
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Optional

import orjson

from ..errors import InvalidProgress, UnsafePathError
from ..events import utc_now
from ..fsio import atomic_write, ensure_private_dir, read_no_follow
from ..jsonfields import req, str_list
from ..layout import DERIVED_DIR, PROGRESS_FILE, session_directory
from ..store_redaction import store_redaction

# --------------------------------------------------------------------------------------------
# float32 helpers


def _f32(value: float) -> float:
    """Round ``value`` to the nearest float32 (returned as a Python float holding it exactly)."""
    try:
        return struct.unpack("<f", struct.pack("<f", value))[0]
    except OverflowError:
        return math.copysign(math.inf, value)


def _f32_shortest(value: float) -> float:
    """The float whose shortest repr is the shortest decimal that reads back as the same float32.

    ``orjson`` prints a Python float with its shortest float64 repr; feeding it this value makes
    it print what Rust prints for an ``f32`` (``0.9`` rather than ``0.8999999761581421``).
    """
    exact = _f32(value)
    if not math.isfinite(exact):
        raise InvalidProgress(f"confidence {value!r} is not a finite float32")
    for digits in range(1, 10):
        candidate = float(f"{exact:.{digits - 1}e}")
        if _f32(candidate) == exact:
            return candidate
    return exact  # unreachable: 9 significant digits always round-trip a float32


def _round_half_away(value: float) -> int:
    """Round to the nearest integer, halves away from zero (Rust's ``f32::round``)."""
    magnitude = abs(value)
    floor = math.floor(magnitude)
    rounded = int(floor) + (1 if magnitude - floor >= 0.5 else 0)
    return rounded if value >= 0 else -rounded


# --------------------------------------------------------------------------------------------
# Milestones


class MilestoneStatus(str, Enum):
    """Status of one milestone. Only ``done`` counts as progress."""

    PENDING = "pending"
    IN_PROGRESS = "in_progress"
    DONE = "done"
    BLOCKED = "blocked"

    def is_terminal(self) -> bool:
        """Whether this status counts toward completion (only ``done`` does)."""
        return self is MilestoneStatus.DONE


_TRACKER_STATUS = {
    **dict.fromkeys(("done", "complete", "completed", "pass", "passed", "success"), MilestoneStatus.DONE),
    **dict.fromkeys(("blocked", "stuck", "waiting"), MilestoneStatus.BLOCKED),
    **dict.fromkeys(("in_progress", "in progress", "active", "running"), MilestoneStatus.IN_PROGRESS),
}


def milestone_status_from_str(text: str) -> MilestoneStatus:
    """Map a task tracker's status string (trimmed, case-insensitive) to a ``MilestoneStatus``.

    ``done/complete/completed/pass/passed/success`` are done, ``blocked/stuck/waiting`` blocked,
    ``in_progress/in progress/active/running`` in progress, and anything else pending.
    """
    return _TRACKER_STATUS.get(text.strip().lower(), MilestoneStatus.PENDING)


@dataclass
class Milestone:
    """One tracked step toward the session goal."""

    id: str
    description: str
    status: MilestoneStatus = MilestoneStatus.PENDING

    def __post_init__(self) -> None:
        self.status = MilestoneStatus(self.status)

    def to_dict(self) -> dict:
        return {"id": self.id, "description": self.description, "status": self.status.value}

    @classmethod
    def from_dict(cls, data: Any) -> Milestone:
        """Parse ``{"id", "description", "status"}``; raise ``InvalidProgress`` otherwise."""
        if not isinstance(data, dict):
            raise InvalidProgress("a milestone must be a JSON object")
        ident, description = req(data, "id", str), req(data, "description", str)
        status = req(data, "status", str)
        try:
            return cls(ident, description, MilestoneStatus(status))
        except ValueError:
            raise InvalidProgress(f"unknown milestone status {status!r}") from None


def milestone_from_tracker_item(index: Optional[int], description: str, status: str) -> Milestone:
    """Build a milestone from a task-tracker item: the id is the item's 1-based ``index`` as a
    string, or the description when the item has no index."""
    ident = str(index) if index is not None else description
    return Milestone(ident, description, milestone_status_from_str(status))


# --------------------------------------------------------------------------------------------
# ProgressLedger


@dataclass
class ProgressLedger:
    """The compaction-safe view of a session's progress: goal, milestones, confidence, stall
    marker and handoff metadata. Every mutating method refreshes ``updated_at``.

    ``confidence`` is kept as a float32 value, as in VT Code, so that the JSON is the same.
    """

    session_id: str
    goal: str
    milestones: list[Milestone] = field(default_factory=list)
    confidence: float = 1.0
    stalled_since: Optional[str] = None
    updated_at: str = field(default_factory=utc_now)
    previous_session_id: Optional[str] = None
    handoff_summary: Optional[str] = None
    known_issues: list[str] = field(default_factory=list)
    git_checkpoint: Optional[str] = None

    @classmethod
    def new(cls, session_id: str, goal: str) -> ProgressLedger:
        """A fresh ledger: no milestones, confidence 1.0, not stalled, no handoff data."""
        return cls(session_id=session_id, goal=goal)

    def completion_ratio(self) -> float:
        """Fraction of milestones that are done, computed in float32; 1.0 when there are none."""
        if not self.milestones:
            return 1.0
        done = sum(1 for m in self.milestones if m.status.is_terminal())
        return _f32(_f32(done) / _f32(len(self.milestones)))

    def is_complete(self) -> bool:
        """Whether every milestone is done (an empty ledger is complete)."""
        return self.completion_ratio() >= 1.0

    def is_stalled(self) -> bool:
        """Whether a stall is currently recorded."""
        return self.stalled_since is not None

    def note_advance(self) -> None:
        """Record forward progress: clear the stall marker and raise confidence by 0.05 (max 1)."""
        self.stalled_since = None
        self.confidence = min(1.0, _f32(_f32(self.confidence) + _f32(0.05)))
        self.updated_at = utc_now()

    def note_stall(self) -> None:
        """Record a stall: mark ``stalled_since`` if not already stalled and lower confidence by
        0.1 (min 0)."""
        now = utc_now()
        if self.stalled_since is None:
            self.stalled_since = now
        self.confidence = max(0.0, _f32(_f32(self.confidence) - _f32(0.1)))
        self.updated_at = now

    def set_milestones(self, milestones: list[Milestone]) -> None:
        """Replace the milestone list."""
        self.milestones = list(milestones)
        self.updated_at = utc_now()

    def set_goal(self, goal: str) -> None:
        """Replace the goal."""
        self.goal = goal
        self.updated_at = utc_now()

    def set_handoff(self, previous_session_id: str, summary: str, git_checkpoint: Optional[str] = None) -> None:
        """Record the predecessor session, its handoff summary and the git checkpoint; a ``None``
        checkpoint overwrites any previous one."""
        self.previous_session_id = previous_session_id
        self.handoff_summary = summary
        self.git_checkpoint = git_checkpoint
        self.updated_at = utc_now()

    def add_known_issue(self, issue: str) -> None:
        """Append an issue carried forward to the next session."""
        self.known_issues.append(issue)
        self.updated_at = utc_now()

    def to_markdown(self) -> str:
        """Render the ledger as the Markdown summary VT Code writes to ``memories/progress.md``."""
        lines = [
            "# Session Progress\n\n",
            f"**Goal:** {self.goal}\n",
            f"**Completion:** {_round_half_away(_f32(self.completion_ratio() * 100.0))}%\n",
            f"**Confidence:** {_f32(self.confidence):.2f}\n",
        ]
        if self.stalled_since is not None:
            lines.append(f"**Stalled since:** {self.stalled_since}\n")
        lines.append(f"**Updated:** {self.updated_at}\n\n")
        if self.previous_session_id is not None:
            lines.append(f"**Handed off from:** {self.previous_session_id}\n")
        if self.handoff_summary is not None:
            lines.append(f"**Handoff summary:** {self.handoff_summary}\n")
        if self.git_checkpoint is not None:
            lines.append(f"**Git checkpoint:** `{self.git_checkpoint}`\n")
        if self.known_issues:
            lines.append("\n## Known Issues\n\n")
            lines.extend(f"- {issue}\n" for issue in self.known_issues)
        if not self.milestones:
            lines.append("\n_No tracked milestones yet._\n")
        else:
            lines.append("\n## Milestones\n\n")
            marks = {
                MilestoneStatus.DONE: "[x]",
                MilestoneStatus.IN_PROGRESS: "[~]",
                MilestoneStatus.BLOCKED: "[!]",
                MilestoneStatus.PENDING: "[ ]",
            }
            lines.extend(f"{marks[m.status]} {m.id} \u2014 {m.description}\n" for m in self.milestones)
        return "".join(lines)

    def orientation(self) -> str:
        """One line for re-grounding: ``Goal: … | Completion: N% | Confidence: x.xx | STALLED``
        (or ``on track``)."""
        pct = _round_half_away(_f32(self.completion_ratio() * 100.0))
        state = "STALLED" if self.is_stalled() else "on track"
        return f"Goal: {self.goal} | Completion: {pct}% | Confidence: {_f32(self.confidence):.2f} | {state}"

    def to_dict(self) -> dict:
        """The JSON form, keys in VT Code's order, ``confidence`` as its shortest float32 text."""
        return {
            "session_id": self.session_id,
            "goal": self.goal,
            "milestones": [m.to_dict() for m in self.milestones],
            "confidence": _f32_shortest(self.confidence),
            "stalled_since": self.stalled_since,
            "updated_at": self.updated_at,
            "previous_session_id": self.previous_session_id,
            "handoff_summary": self.handoff_summary,
            "known_issues": list(self.known_issues),
            "git_checkpoint": self.git_checkpoint,
        }

    def to_json(self) -> bytes:
        """Compact JSON bytes, as stored in ``derived/progress.json``."""
        return orjson.dumps(self.to_dict())

    @classmethod
    def from_dict(cls, data: Any) -> ProgressLedger:
        """Parse the JSON form. ``session_id``, ``goal``, ``milestones``, ``confidence`` and
        ``updated_at`` are required; the handoff keys and ``stalled_since`` default to empty."""
        if not isinstance(data, dict):
            raise InvalidProgress("a progress ledger must be a JSON object")
        milestones = [Milestone.from_dict(m) for m in req(data, "milestones", list)]
        confidence = data.get("confidence")
        if not isinstance(confidence, (int, float)) or isinstance(confidence, bool):
            raise InvalidProgress("key 'confidence' must be a number")
        if not math.isfinite(_f32(confidence)):
            raise InvalidProgress("key 'confidence' does not fit a float32")
        return cls(
            session_id=req(data, "session_id", str),
            goal=req(data, "goal", str),
            milestones=milestones,
            confidence=_f32(confidence),
            stalled_since=req(data, "stalled_since", str, None, nullable=True),
            updated_at=req(data, "updated_at", str),
            previous_session_id=req(data, "previous_session_id", str, None, nullable=True),
            handoff_summary=req(data, "handoff_summary", str, None, nullable=True),
            known_issues=str_list(data, "known_issues"),
            git_checkpoint=req(data, "git_checkpoint", str, None, nullable=True),
        )


def progress_path(root: os.PathLike | str, session_id: str) -> Path:
    """Where the ledger of ``session_id`` lives: ``<session_dir>/derived/progress.json``."""
    return session_directory(root, session_id) / DERIVED_DIR / PROGRESS_FILE


def load_progress(root: os.PathLike | str, session_id: str) -> Optional[ProgressLedger]:
    """The session's ledger, or ``None`` when none was saved.

    A ledger that cannot be read raises ``StoreIOError``; one that does not parse raises
    ``InvalidProgress``; both name the file.
    """
    path = progress_path(root, session_id)
    # As saving does: a session or derived/ directory that is a symlink could lead out of the store.
    for directory in (path.parent.parent, path.parent):
        if directory.is_symlink():
            raise UnsafePathError("read progress", directory, "is a symlink; refusing to follow it")
    data = read_no_follow(path)
    if data is None:
        return None
    try:
        return ProgressLedger.from_dict(orjson.loads(data))
    except orjson.JSONDecodeError as exc:
        raise InvalidProgress(f"{path}: not valid JSON: {exc}") from exc
    except InvalidProgress as exc:
        raise InvalidProgress(f"{path}: {exc}") from exc


def save_progress(root: os.PathLike | str, session_id: str, ledger: ProgressLedger, *, durable: bool = True) -> Path:
    """Write the ledger to ``derived/progress.json`` and return the path.

    Unlike VT Code, which writes the file in place, the write is atomic and private (0600, in a
    0700 ``derived/``): a crash mid-write leaves the previous ledger, never a torn one. In a store
    that redacts at write time (``[redact] at_write``) its text is redacted first.
    """
    path = progress_path(root, session_id)
    data = ledger.to_dict()
    redaction = store_redaction(root)
    if redaction.at_write:  # the store keeps every secret off the disk, the ledger's too
        data = redaction.redact_event(data)
    ensure_private_dir(path.parent)
    atomic_write(path, orjson.dumps(data), durable=durable)
    return path
