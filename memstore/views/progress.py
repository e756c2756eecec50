"""The compaction-safe progress ledger and the goal tracker state machine.

``ProgressLedger`` is a small mutable summary of "are we getting closer to done?", stored at
``<session_dir>/derived/progress.json`` and overwritten on every save. It is not a log: a resumed,
forked or compacted session reads it to re-ground itself without replaying events.

``GoalTracker`` is a pure state machine over one ``GoalOrchestration`` (the persistable snapshot
of a goal): create, pause for a reason, resume, complete, hit the budget, clear.

Wire formats follow VT Code's ``progress.rs``: the ledger's keys in a fixed order with a float32
``confidence`` (so ``1.0 - 0.1`` is written as ``0.9``), goal statuses that parse fail-safe (an
unknown status restores as ``user_paused``, never as ``active``) and goal events that parse
forward-compatibly (an unknown event is ``unknown``).
"""

from __future__ import annotations

import copy
import math
import os
import re
import shutil
import stat
import struct
import time
import uuid
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Callable, Optional

import orjson

from ..layout import DERIVED_DIR, GOAL_DIR, PROGRESS_FILE, session_directory
from ..errors import InvalidProgress, MemstoreError, UnsafePathError
from ..events import utc_now
from ..fsio import atomic_write, ensure_private_dir, read_no_follow

STRATEGIST_CAP_BONUS = 3

_U32_MAX = 2**32 - 1
_I64_MIN, _I64_MAX = -(2**63), 2**63 - 1
_U64_MAX = 2**64 - 1
_VERIFIER_ID_RE = re.compile(r"[0-9a-f]{12}")


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
    def from_dict(cls, data: Any) -> "Milestone":
        """Parse ``{"id", "description", "status"}``; raise ``InvalidProgress`` otherwise."""
        if not isinstance(data, dict):
            raise InvalidProgress("a milestone must be a JSON object")
        ident, description = _req(data, "id", str), _req(data, "description", str)
        status = _req(data, "status", str)
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
# JSON field helpers

_MISSING = object()


def _req(data: dict, key: str, kind: type, default: Any = _MISSING, nullable: bool = False) -> Any:
    value = data.get(key, _MISSING)
    if value is _MISSING:
        if default is _MISSING:
            raise InvalidProgress(f"missing key {key!r}")
        return copy.copy(default)
    if value is None and nullable:
        return None
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise InvalidProgress(f"key {key!r} must be {kind.__name__}{' or null' if nullable else ''}")
    return value


def _int(data: dict, key: str, lo: int, hi: int, default: Any = _MISSING, nullable: bool = False) -> Any:
    value = _req(data, key, int, default, nullable)
    if value is not None and not lo <= value <= hi:
        raise InvalidProgress(f"key {key!r} is out of range [{lo}, {hi}]")
    return value


def _str_list(data: dict, key: str) -> list:
    value = _req(data, key, list, [], nullable=True)
    if value is None:
        return []
    if not all(isinstance(item, str) for item in value):
        raise InvalidProgress(f"key {key!r} must be a list of strings")
    return list(value)


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
    def new(cls, session_id: str, goal: str) -> "ProgressLedger":
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
    def from_dict(cls, data: Any) -> "ProgressLedger":
        """Parse the JSON form. ``session_id``, ``goal``, ``milestones``, ``confidence`` and
        ``updated_at`` are required; the handoff keys and ``stalled_since`` default to empty."""
        if not isinstance(data, dict):
            raise InvalidProgress("a progress ledger must be a JSON object")
        milestones = [Milestone.from_dict(m) for m in _req(data, "milestones", list)]
        confidence = data.get("confidence")
        if not isinstance(confidence, (int, float)) or isinstance(confidence, bool):
            raise InvalidProgress("key 'confidence' must be a number")
        if not math.isfinite(_f32(confidence)):
            raise InvalidProgress("key 'confidence' does not fit a float32")
        return cls(
            session_id=_req(data, "session_id", str),
            goal=_req(data, "goal", str),
            milestones=milestones,
            confidence=_f32(confidence),
            stalled_since=_req(data, "stalled_since", str, None, nullable=True),
            updated_at=_req(data, "updated_at", str),
            previous_session_id=_req(data, "previous_session_id", str, None, nullable=True),
            handoff_summary=_req(data, "handoff_summary", str, None, nullable=True),
            known_issues=_str_list(data, "known_issues"),
            git_checkpoint=_req(data, "git_checkpoint", str, None, nullable=True),
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


def save_progress(
    root: os.PathLike | str, session_id: str, ledger: ProgressLedger, *, durable: bool = True
) -> Path:
    """Write the ledger to ``derived/progress.json`` and return the path.

    Unlike VT Code, which writes the file in place, the write is atomic and private (0600, in a
    0700 ``derived/``): a crash mid-write leaves the previous ledger, never a torn one.
    """
    path = progress_path(root, session_id)
    ensure_private_dir(path.parent)
    atomic_write(path, ledger.to_json(), durable=durable)
    return path


# --------------------------------------------------------------------------------------------
# Goal enums


class GoalPhase(str, Enum):
    """Execution phase of a goal. Strict: ``"Idle"`` and other spellings do not parse."""

    IDLE = "idle"
    PLANNING = "planning"
    EXECUTING = "executing"


_STATUS_ALIASES = {
    "Active": "active",
    "paused": "user_paused",
    "Paused": "user_paused",
    "doom_loop_paused": "user_paused",
    "BudgetLimited": "budget_limited",
    "Complete": "complete",
}


class GoalStatus(str, Enum):
    """Lifecycle status of a goal.

    Parsing (``GoalStatus(text)`` or ``GoalStatus.from_wire_str``) accepts the legacy spellings
    ``Active``, ``Paused``, ``paused``, ``doom_loop_paused``, ``BudgetLimited`` and ``Complete``,
    and maps **any other string** to ``USER_PAUSED``: a status this version cannot interpret is
    restored as a resumable paused goal, never as an active self-driving one. A non-string is an
    error.
    """

    ACTIVE = "active"
    USER_PAUSED = "user_paused"
    BACK_OFF_PAUSED = "back_off_paused"
    NO_PROGRESS_PAUSED = "no_progress_paused"
    INFRA_PAUSED = "infra_paused"
    BLOCKED = "blocked"
    BUDGET_LIMITED = "budget_limited"
    COMPLETE = "complete"

    @classmethod
    def _missing_(cls, value: object) -> Optional["GoalStatus"]:
        if not isinstance(value, str):
            return None
        return cls(_STATUS_ALIASES.get(value, "user_paused"))

    @classmethod
    def from_wire_str(cls, text: str) -> "GoalStatus":
        """Parse a wire status, fail-safe (see the class docstring)."""
        return cls(text)

    def is_paused(self) -> bool:
        """True for every paused variant, ``BLOCKED`` included."""
        return self in _PAUSED

    def is_terminal(self) -> bool:
        """True for ``COMPLETE`` and ``BUDGET_LIMITED``: only create_goal and clear leave them."""
        return self in (GoalStatus.COMPLETE, GoalStatus.BUDGET_LIMITED)


_PAUSED = frozenset(
    {
        GoalStatus.USER_PAUSED,
        GoalStatus.BACK_OFF_PAUSED,
        GoalStatus.NO_PROGRESS_PAUSED,
        GoalStatus.INFRA_PAUSED,
        GoalStatus.BLOCKED,
    }
)


class GoalPauseReason(str, Enum):
    """Why a goal is paused; each reason maps to one paused status and a history detail."""

    USER = "user"
    BACK_OFF = "back_off"
    NO_PROGRESS = "no_progress"
    VERIFICATION = "verification"
    INFRA = "infra"

    @property
    def status(self) -> GoalStatus:
        """The status a pause for this reason produces (verification gives ``BLOCKED``)."""
        return _REASON_STATUS[self]

    @property
    def history_detail(self) -> str:
        """The ``detail`` of the ``goal_paused`` history entry."""
        return "blocked" if self is GoalPauseReason.VERIFICATION else self.value


_REASON_STATUS = {
    GoalPauseReason.USER: GoalStatus.USER_PAUSED,
    GoalPauseReason.BACK_OFF: GoalStatus.BACK_OFF_PAUSED,
    GoalPauseReason.NO_PROGRESS: GoalStatus.NO_PROGRESS_PAUSED,
    GoalPauseReason.VERIFICATION: GoalStatus.BLOCKED,
    GoalPauseReason.INFRA: GoalStatus.INFRA_PAUSED,
}


class GoalClassifierVerdict(str, Enum):
    """Verdict of goal verification. No tracker method consumes it; callers translate it
    (``achieved`` → ``complete()``; ``not_achieved`` → streak and stall bookkeeping)."""

    ACHIEVED = "achieved"
    NOT_ACHIEVED = "not_achieved"


class GoalEvent(str, Enum):
    """Kind of a goal history entry. Any unknown string parses as ``UNKNOWN``."""

    GOAL_CREATED = "goal_created"
    PLANNING_STARTED = "planning_started"
    PLANNING_COMPLETED = "planning_completed"
    PLANNING_FAILED = "planning_failed"
    WORKER_STARTED = "worker_started"
    WORKER_COMPLETED = "worker_completed"
    WORKER_FAILED = "worker_failed"
    CONTEXT_ROTATED = "context_rotated"
    GOAL_PAUSED = "goal_paused"
    GOAL_RESUMED = "goal_resumed"
    GOAL_COMPLETED = "goal_completed"
    GOAL_CLEARED = "goal_cleared"
    BUDGET_EXCEEDED = "budget_exceeded"
    PREMATURE_STOP_DETECTED = "premature_stop_detected"
    UNKNOWN = "unknown"

    @classmethod
    def _missing_(cls, value: object) -> Optional["GoalEvent"]:
        return cls.UNKNOWN if isinstance(value, str) else None


def _parse_enum(enum_cls: type, value: Any, key: str) -> Any:
    try:
        return enum_cls(value)
    except ValueError:
        raise InvalidProgress(f"key {key!r}: invalid {enum_cls.__name__} {value!r}") from None


# --------------------------------------------------------------------------------------------
# History entries and the orchestration snapshot


@dataclass
class GoalHistoryEntry:
    """One goal lifecycle event. Optional keys are omitted from the JSON when unset or empty."""

    timestamp: str
    event: GoalEvent
    detail: Optional[str] = None
    round: Optional[int] = None
    tokens_used: Optional[int] = None
    unmet: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.event = GoalEvent(self.event)

    @classmethod
    def now(cls, event: GoalEvent, detail: Optional[str] = None) -> "GoalHistoryEntry":
        """An entry stamped with the current time."""
        return cls(utc_now(), event, detail)

    def to_dict(self) -> dict:
        out: dict = {"timestamp": self.timestamp, "event": self.event.value}
        if self.detail is not None:
            out["detail"] = self.detail
        if self.round is not None:
            out["round"] = self.round
        if self.tokens_used is not None:
            out["tokens_used"] = self.tokens_used
        if self.unmet:
            out["unmet"] = list(self.unmet)
        return out

    @classmethod
    def from_dict(cls, data: Any) -> "GoalHistoryEntry":
        """Parse the JSON form; an unknown ``event`` string becomes ``GoalEvent.UNKNOWN``."""
        if not isinstance(data, dict):
            raise InvalidProgress("a history entry must be a JSON object")
        return cls(
            timestamp=_req(data, "timestamp", str),
            event=_parse_enum(GoalEvent, _req(data, "event", str), "event"),
            detail=_req(data, "detail", str, None, nullable=True),
            round=_int(data, "round", 0, _U32_MAX, None, nullable=True),
            tokens_used=_int(data, "tokens_used", _I64_MIN, _I64_MAX, None, nullable=True),
            unmet=_str_list(data, "unmet"),
        )


def new_verifier_id() -> str:
    """A fresh verifier id: the first 12 hex characters of a UUIDv4."""
    return uuid.uuid4().hex[:12]


def _check_verifier_id(value: Any) -> str:
    if not isinstance(value, str) or not _VERIFIER_ID_RE.fullmatch(value):
        raise InvalidProgress(f"verifier_id {value!r} is not 12 lowercase hex characters")
    return value


@dataclass
class GoalOrchestration:
    """The persistable state of one goal (VT Code's ``GoalOrchestration``).

    ``to_dict`` writes the reference's keys in its order and then ``verifier_id`` (memstore's
    addition, last so the reference prefix is unchanged). The ``live_*``, ``*_in_flight`` and
    ``budget_limit_reported`` fields are runtime-only: never serialized, reset on restore.
    """

    goal_id: str
    objective: str
    status: GoalStatus = GoalStatus.ACTIVE
    phase: GoalPhase = GoalPhase.EXECUTING
    token_budget: Optional[int] = None
    elapsed_ms: int = 0
    created_at: str = field(default_factory=utc_now)
    current_subagent_id: Optional[str] = None
    current_subagent_role: Optional[str] = None
    total_worker_rounds: int = 0
    total_verify_rounds: int = 0
    token_baseline: int = 0
    tokens_used_high_water: int = 0
    parent_tokens_spent: int = 0
    last_session_tokens_seen: Optional[int] = None
    history: list[GoalHistoryEntry] = field(default_factory=list)
    pause_message: Optional[str] = None
    classifier_stall_count: int = 0
    classifier_runs_attempted: int = 0
    rounds_since_verify: int = 0
    consecutive_not_achieved: int = 0
    last_strategist_fired_at: int = 0
    strategist_cap_bonus: int = 0
    last_strategy_path: Optional[str] = None
    last_strategy_recommendation: Optional[str] = None
    changes_baseline_commit: Optional[str] = None
    last_gap_fingerprint: Optional[str] = None
    verifier_id: str = field(default_factory=new_verifier_id)
    # Runtime-only state, never serialized.
    budget_limit_reported: bool = False
    live_subagent_tokens: int = 0
    live_tokens_by_model: list[tuple[str, int]] = field(default_factory=list)
    live_context_window: int = 0
    live_context_pct: int = 0
    live_turn_count: int = 0
    live_tool_call_count: int = 0
    planning_in_flight: bool = False
    verifying_in_flight: bool = False

    def __post_init__(self) -> None:
        self.status = GoalStatus(self.status)
        self.phase = GoalPhase(self.phase)

    def reset_strategist_fields(self) -> None:
        """Zero the not-achieved streak, fire marker and cap bonus; drop the last strategy."""
        self.consecutive_not_achieved = 0
        self.last_strategist_fired_at = 0
        self.strategist_cap_bonus = 0
        self.last_strategy_path = None
        self.last_strategy_recommendation = None

    def reset_classifier_stall_fields(self) -> None:
        """Zero the stall count and forget the last gap fingerprint."""
        self.classifier_stall_count = 0
        self.last_gap_fingerprint = None

    def to_dict(self) -> dict:
        """The JSON wire form (see the class docstring for key order)."""
        out: dict = {
            "goal_id": self.goal_id,
            "objective": self.objective,
            "status": self.status.value,
            "phase": self.phase.value,
            "token_budget": self.token_budget,
            "elapsed_ms": self.elapsed_ms,
            "created_at": self.created_at,
            "current_subagent_id": self.current_subagent_id,
            "current_subagent_role": self.current_subagent_role,
            "total_worker_rounds": self.total_worker_rounds,
            "total_verify_rounds": self.total_verify_rounds,
            "token_baseline": self.token_baseline,
            "tokens_used_high_water": self.tokens_used_high_water,
            "parent_tokens_spent": self.parent_tokens_spent,
            "last_session_tokens_seen": self.last_session_tokens_seen,
            "history": [entry.to_dict() for entry in self.history],
        }
        if self.pause_message is not None:
            out["pause_message"] = self.pause_message
        for name in (
            "classifier_stall_count",
            "classifier_runs_attempted",
            "rounds_since_verify",
            "consecutive_not_achieved",
            "last_strategist_fired_at",
            "strategist_cap_bonus",
        ):
            out[name] = getattr(self, name)
        for name in (
            "last_strategy_path",
            "last_strategy_recommendation",
            "changes_baseline_commit",
            "last_gap_fingerprint",
        ):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        out["verifier_id"] = self.verifier_id
        return out

    @classmethod
    def from_dict(cls, data: Any) -> "GoalOrchestration":
        """Parse the JSON wire form.

        ``goal_id``, ``objective``, ``status``, ``phase``, ``elapsed_ms``, ``created_at`` and
        ``history`` are required; other keys take their defaults. ``status`` parses fail-safe
        (unknown → ``user_paused``), ``phase`` strictly. A missing ``verifier_id`` is backfilled
        with a fresh one; a present but malformed one raises ``InvalidProgress`` rather than being
        silently replaced, since a changed id would break the stability callers rely on.
        """
        if not isinstance(data, dict):
            raise InvalidProgress("a goal snapshot must be a JSON object")
        history = [GoalHistoryEntry.from_dict(e) for e in _req(data, "history", list)]
        verifier_id = data.get("verifier_id")
        values: dict = dict(
            goal_id=_req(data, "goal_id", str),
            objective=_req(data, "objective", str),
            status=_parse_enum(GoalStatus, _req(data, "status", str), "status"),
            phase=_parse_enum(GoalPhase, _req(data, "phase", str), "phase"),
            token_budget=_int(data, "token_budget", _I64_MIN, _I64_MAX, None, nullable=True),
            elapsed_ms=_int(data, "elapsed_ms", 0, _U64_MAX),
            created_at=_req(data, "created_at", str),
            current_subagent_id=_req(data, "current_subagent_id", str, None, nullable=True),
            current_subagent_role=_req(data, "current_subagent_role", str, None, nullable=True),
            token_baseline=_int(data, "token_baseline", _I64_MIN, _I64_MAX, 0),
            tokens_used_high_water=_int(data, "tokens_used_high_water", _I64_MIN, _I64_MAX, 0),
            parent_tokens_spent=_int(data, "parent_tokens_spent", _I64_MIN, _I64_MAX, 0),
            last_session_tokens_seen=_int(data, "last_session_tokens_seen", _I64_MIN, _I64_MAX, None, nullable=True),
            history=history,
            pause_message=_req(data, "pause_message", str, None, nullable=True),
            verifier_id=new_verifier_id() if verifier_id is None else _check_verifier_id(verifier_id),
        )
        for name in (
            "total_worker_rounds",
            "total_verify_rounds",
            "classifier_stall_count",
            "classifier_runs_attempted",
            "rounds_since_verify",
            "consecutive_not_achieved",
            "last_strategist_fired_at",
            "strategist_cap_bonus",
        ):
            values[name] = _int(data, name, 0, _U32_MAX, 0)
        for name in (
            "last_strategy_path",
            "last_strategy_recommendation",
            "changes_baseline_commit",
            "last_gap_fingerprint",
        ):
            values[name] = _req(data, name, str, None, nullable=True)
        return cls(**values)


# --------------------------------------------------------------------------------------------
# GoalTracker


def _remove_real_dir(path: Path) -> None:
    """Remove the directory tree at ``path``; a symlink there is left alone, never followed."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(path)  # does not descend into symlinks


def _sat_add(value: int, delta: int, hi: int) -> int:
    return min(hi, value + delta)


class GoalTracker:
    """The goal state machine (VT Code's ``GoalTracker``), over at most one orchestration.

    Status graph: ``active`` ⇄ the paused variants (``pause(reason)`` / ``resume()``);
    ``active`` or paused → ``complete`` / ``budget_limited`` (terminal: only ``create_goal`` and
    ``clear`` leave them). A paused goal cannot be re-paused for another reason.

    Wall-clock time spent active is accounted into ``elapsed_ms`` using ``clock`` (monotonic
    nanoseconds; injectable for tests).

    Two fixes over the reference:

    * ``account_elapsed`` restarts the active interval at the instant it accounted up to, so
      repeated calls do not count the same time twice (VT Code keeps the old start instant).
    * ``create_goal`` replacing an existing goal leaves ``<session_dir>/goal`` existing and empty
      (VT Code creates the directory and then deletes it when a goal already existed).
    """

    def __init__(self, session_dir: os.PathLike | str, *, clock: Callable[[], int] = time.monotonic_ns):
        self.session_dir = Path(session_dir)
        self._clock = clock
        self._orchestration: Optional[GoalOrchestration] = None
        self._active_since: Optional[int] = None

    # -- restore and inspection

    @classmethod
    def from_snapshot(
        cls,
        session_dir: os.PathLike | str,
        snapshot: GoalOrchestration,
        *,
        clock: Callable[[], int] = time.monotonic_ns,
    ) -> "GoalTracker":
        """Restore a tracker from a snapshot (which is copied, not aliased).

        A goal caught mid-planning or mid-execution is parked: its phase becomes ``idle``, an
        ``active`` status becomes ``user_paused`` (other statuses are kept) and the subagent is
        cleared. In-flight flags are reset. The active timer runs only if the status is still
        ``active``. The snapshot's ``verifier_id`` must be 12 lowercase hex characters.
        """
        snap = copy.deepcopy(snapshot)
        _check_verifier_id(snap.verifier_id)
        if snap.phase in (GoalPhase.PLANNING, GoalPhase.EXECUTING):
            snap.phase = GoalPhase.IDLE
            if snap.status is GoalStatus.ACTIVE:
                snap.status = GoalStatus.USER_PAUSED
            snap.current_subagent_id = None
            snap.current_subagent_role = None
        snap.planning_in_flight = False
        snap.verifying_in_flight = False
        tracker = cls(session_dir, clock=clock)
        tracker._orchestration = snap
        tracker._active_since = clock() if snap.status is GoalStatus.ACTIVE else None
        return tracker

    def snapshot(self) -> Optional[GoalOrchestration]:
        """The current orchestration (live, not a copy), or ``None`` without a goal."""
        return self._orchestration

    snapshot_mut = snapshot

    @property
    def active_since(self) -> Optional[int]:
        """The clock reading at which the current active interval started, if it is running."""
        return self._active_since

    def is_active(self) -> bool:
        """Whether there is a goal and its status is ``active``."""
        return self._orchestration is not None and self._orchestration.status is GoalStatus.ACTIVE

    def phase(self) -> Optional[GoalPhase]:
        return self._orchestration.phase if self._orchestration else None

    def status(self) -> Optional[GoalStatus]:
        return self._orchestration.status if self._orchestration else None

    def current_subagent_id(self) -> Optional[str]:
        return self._orchestration.current_subagent_id if self._orchestration else None

    def objective(self) -> Optional[str]:
        return self._orchestration.objective if self._orchestration else None

    def token_budget(self) -> Optional[int]:
        return self._orchestration.token_budget if self._orchestration else None

    def verifier_id(self) -> Optional[str]:
        """The goal's verifier id: set by ``create_goal``, stable until the goal is replaced."""
        return self._orchestration.verifier_id if self._orchestration else None

    def goal_dir(self) -> Path:
        """The goal's scratch directory, ``<session_dir>/goal``."""
        return self.session_dir / GOAL_DIR

    # -- transitions

    def create_goal(
        self,
        goal_id: str,
        objective: str,
        token_budget: Optional[int] = None,
        token_baseline: int = 0,
        created_at: Optional[str] = None,
        baseline_commit: Optional[str] = None,
    ) -> None:
        """Start a new goal (``active``, ``executing``), replacing any existing one.

        The scratch directory ``<session_dir>/goal`` is prepared best-effort (a failure does not
        stop the goal). When a goal is replaced, the old scratch contents are removed and the
        directory is recreated, so it always exists afterwards; VT Code deletes it instead.
        Records ``goal_created``.
        """
        self._prepare_goal_dir(clear=self._orchestration is not None)
        self._orchestration = GoalOrchestration(
            goal_id=goal_id,
            objective=objective,
            status=GoalStatus.ACTIVE,
            phase=GoalPhase.EXECUTING,
            token_budget=token_budget,
            created_at=created_at if created_at is not None else utc_now(),
            token_baseline=token_baseline,
            last_session_tokens_seen=token_baseline,
            changes_baseline_commit=baseline_commit,
        )
        self._active_since = self._clock()
        self._record(GoalEvent.GOAL_CREATED)

    def _prepare_goal_dir(self, clear: bool) -> None:
        goal_dir = self.goal_dir()
        try:
            if clear:
                _remove_real_dir(goal_dir)
            ensure_private_dir(goal_dir)
        except (OSError, MemstoreError):
            pass  # best effort, as in the reference: a scratch dir problem must not block the goal

    def _take_elapsed(self) -> None:
        o = self._orchestration
        if o is not None and self._active_since is not None:
            delta_ms = max(0, self._clock() - self._active_since) // 1_000_000
            o.elapsed_ms = _sat_add(o.elapsed_ms, delta_ms, _U64_MAX)
        self._active_since = None

    def pause(self, reason: GoalPauseReason) -> bool:
        """Pause an ``active`` goal for ``reason``; returns False (and changes nothing) from any
        other state. Accounts elapsed time and records ``goal_paused`` with the reason's detail.
        An existing ``pause_message`` is kept."""
        return self._pause(GoalPauseReason(reason), None)

    def pause_with_message(self, reason: GoalPauseReason, message: str) -> bool:
        """Like ``pause``, also storing a user-facing ``pause_message``."""
        return self._pause(GoalPauseReason(reason), message)

    def _pause(self, reason: GoalPauseReason, message: Optional[str]) -> bool:
        o = self._orchestration
        if o is None or o.status is not GoalStatus.ACTIVE:
            return False
        self._take_elapsed()
        o.status = reason.status
        if message is not None:
            o.pause_message = message
        self._record(GoalEvent.GOAL_PAUSED, reason.history_detail)
        return True

    def resume(self) -> bool:
        """Resume a paused goal (any paused variant, ``blocked`` included); False otherwise.

        Clears the pause message, the classifier attempt and verify-round counters, the
        strategist fields and the classifier stall. The phase is unchanged. Records
        ``goal_resumed``.
        """
        o = self._orchestration
        if o is None or not o.status.is_paused():
            return False
        o.status = GoalStatus.ACTIVE
        o.pause_message = None
        o.classifier_runs_attempted = 0
        o.rounds_since_verify = 0
        o.reset_strategist_fields()
        o.reset_classifier_stall_fields()
        self._active_since = self._clock()
        self._record(GoalEvent.GOAL_RESUMED)
        return True

    def complete(self) -> bool:
        """Finish an active or paused goal as ``complete``; False from a terminal state or
        without a goal. Records ``goal_completed``."""
        return self._finish(GoalStatus.COMPLETE, GoalEvent.GOAL_COMPLETED)

    def budget_limit(self) -> bool:
        """Finish an active or paused goal as ``budget_limited``; False from a terminal state
        or without a goal. Records ``budget_exceeded``."""
        return self._finish(GoalStatus.BUDGET_LIMITED, GoalEvent.BUDGET_EXCEEDED)

    def _finish(self, status: GoalStatus, event: GoalEvent) -> bool:
        o = self._orchestration
        if o is None or not (o.status is GoalStatus.ACTIVE or o.status.is_paused()):
            return False
        self._take_elapsed()
        o.status = status
        o.phase = GoalPhase.IDLE
        o.current_subagent_id = None
        o.current_subagent_role = None
        o.pause_message = None
        o.reset_strategist_fields()
        self._record(event)
        return True

    def clear(self) -> None:
        """Drop the goal entirely (no history is recorded; the goal dir is left alone)."""
        self._orchestration = None
        self._active_since = None

    def set_phase(self, phase: GoalPhase) -> None:
        """Set the phase of the goal, if any (no transition checks)."""
        if self._orchestration is not None:
            self._orchestration.phase = GoalPhase(phase)

    def set_current_subagent(self, subagent_id: Optional[str], role: Optional[str]) -> None:
        """Set the running subagent's id and role, if there is a goal."""
        if self._orchestration is not None:
            self._orchestration.current_subagent_id = subagent_id
            self._orchestration.current_subagent_role = role

    def account_elapsed(self) -> None:
        """Add the time active since the last accounting to ``elapsed_ms``.

        Fix over the reference: the active interval restarts where this accounting stopped
        (whole milliseconds, the sub-millisecond remainder carried over), so calling it again does
        not count the same time twice.
        """
        o = self._orchestration
        if o is None or self._active_since is None:
            return
        delta_ms = max(0, self._clock() - self._active_since) // 1_000_000
        o.elapsed_ms = _sat_add(o.elapsed_ms, delta_ms, _U64_MAX)
        self._active_since += delta_ms * 1_000_000

    # -- classifier and strategist bookkeeping

    def record_classifier_stall(self, fingerprint: str) -> bool:
        """Note a not-achieved verdict's gap ``fingerprint``; True once the same fingerprint has
        been seen twice in a row (the caller then pauses for ``NO_PROGRESS``)."""
        o = self._orchestration
        if o is None:
            return False
        if o.last_gap_fingerprint == fingerprint:
            o.classifier_stall_count = _sat_add(o.classifier_stall_count, 1, _U32_MAX)
        else:
            o.last_gap_fingerprint = fingerprint
            o.classifier_stall_count = 1
        return o.classifier_stall_count >= 2

    def reset_classifier_stall(self) -> None:
        """Clear the stall streak, so the next fingerprint counts as a first occurrence."""
        if self._orchestration is not None:
            self._orchestration.reset_classifier_stall_fields()

    def rollback_classifier_attempt(self) -> None:
        """Undo one ``classifier_runs_attempted`` reservation (floored at 0)."""
        if self._orchestration is not None:
            o = self._orchestration
            o.classifier_runs_attempted = max(0, o.classifier_runs_attempted - 1)

    def record_not_achieved_streak(self) -> int:
        """Increment the consecutive not-achieved streak and return it (0 without a goal)."""
        o = self._orchestration
        if o is None:
            return 0
        o.consecutive_not_achieved = _sat_add(o.consecutive_not_achieved, 1, _U32_MAX)
        return o.consecutive_not_achieved

    def claim_strategist_fire(self, should_fire: Callable[[int, int], bool]) -> Optional[int]:
        """If ``should_fire(consecutive_not_achieved, last_strategist_fired_at)``, mark the
        current streak as fired, grant the cap bonus (3), reset the classifier stall and return
        the streak; otherwise change nothing and return ``None``."""
        o = self._orchestration
        if o is None or not should_fire(o.consecutive_not_achieved, o.last_strategist_fired_at):
            return None
        o.last_strategist_fired_at = o.consecutive_not_achieved
        o.strategist_cap_bonus = STRATEGIST_CAP_BONUS
        o.reset_classifier_stall_fields()
        return o.consecutive_not_achieved

    def revoke_strategist_cap_bonus(self) -> None:
        """Take back the cap bonus granted by ``claim_strategist_fire``."""
        if self._orchestration is not None:
            self._orchestration.strategist_cap_bonus = 0

    def reset_strategist_state(self) -> None:
        """Reset all strategist fields."""
        if self._orchestration is not None:
            self._orchestration.reset_strategist_fields()

    def record_strategy_recommendation(self, path: str, recommendation: str) -> None:
        """Remember the strategist's latest output path and short recommendation."""
        if self._orchestration is not None:
            self._orchestration.last_strategy_path = path
            self._orchestration.last_strategy_recommendation = recommendation

    def append_history(self, entry: GoalHistoryEntry) -> None:
        """Append a history entry to the goal, if any."""
        if self._orchestration is not None:
            self._orchestration.history.append(entry)

    def _record(self, event: GoalEvent, detail: Optional[str] = None) -> None:
        self.append_history(GoalHistoryEntry.now(event, detail))
