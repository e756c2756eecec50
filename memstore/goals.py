"""The goal tracker state machine (VT Code's ``GoalTracker``): a pure state machine over one
``GoalOrchestration`` (the persistable snapshot of a goal): create, pause for a reason, resume,
complete, hit the budget, clear.

Goal statuses parse fail-safe (an unknown status restores as ``user_paused``, never as
``active``) and goal events parse forward-compatibly (an unknown event is ``unknown``), as in VT
Code's ``progress.rs``. memstore itself does not drive goals; agents that do use this module.
"""

from __future__ import annotations

import copy
import os
import re
import shutil
import stat
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Optional

from .errors import InvalidProgress, MemstoreError
from .events import utc_now
from .fsio import ensure_private_dir
from .jsonfields import int_field, req, str_list
from .layout import GOAL_DIR

STRATEGIST_CAP_BONUS = 3

_U32_MAX = 2**32 - 1
_I64_MIN, _I64_MAX = -(2**63), 2**63 - 1
_U64_MAX = 2**64 - 1
_VERIFIER_ID_RE = re.compile(r"[0-9a-f]{12}")

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
    def _missing_(cls, value: object) -> Optional[GoalStatus]:
        if not isinstance(value, str):
            return None
        return cls(_STATUS_ALIASES.get(value, "user_paused"))

    @classmethod
    def from_wire_str(cls, text: str) -> GoalStatus:
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
    def _missing_(cls, value: object) -> Optional[GoalEvent]:
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
    def now(cls, event: GoalEvent, detail: Optional[str] = None) -> GoalHistoryEntry:
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
    def from_dict(cls, data: Any) -> GoalHistoryEntry:
        """Parse the JSON form; an unknown ``event`` string becomes ``GoalEvent.UNKNOWN``."""
        if not isinstance(data, dict):
            raise InvalidProgress("a history entry must be a JSON object")
        return cls(
            timestamp=req(data, "timestamp", str),
            event=_parse_enum(GoalEvent, req(data, "event", str), "event"),
            detail=req(data, "detail", str, None, nullable=True),
            round=int_field(data, "round", 0, _U32_MAX, None, nullable=True),
            tokens_used=int_field(data, "tokens_used", _I64_MIN, _I64_MAX, None, nullable=True),
            unmet=str_list(data, "unmet"),
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
    def from_dict(cls, data: Any) -> GoalOrchestration:
        """Parse the JSON wire form.

        ``goal_id``, ``objective``, ``status``, ``phase``, ``elapsed_ms``, ``created_at`` and
        ``history`` are required; other keys take their defaults. ``status`` parses fail-safe
        (unknown → ``user_paused``), ``phase`` strictly. A missing ``verifier_id`` is backfilled
        with a fresh one; a present but malformed one raises ``InvalidProgress`` rather than being
        silently replaced, since a changed id would break the stability callers rely on.
        """
        if not isinstance(data, dict):
            raise InvalidProgress("a goal snapshot must be a JSON object")
        history = [GoalHistoryEntry.from_dict(e) for e in req(data, "history", list)]
        verifier_id = data.get("verifier_id")
        values: dict = dict(
            goal_id=req(data, "goal_id", str),
            objective=req(data, "objective", str),
            status=_parse_enum(GoalStatus, req(data, "status", str), "status"),
            phase=_parse_enum(GoalPhase, req(data, "phase", str), "phase"),
            token_budget=int_field(data, "token_budget", _I64_MIN, _I64_MAX, None, nullable=True),
            elapsed_ms=int_field(data, "elapsed_ms", 0, _U64_MAX),
            created_at=req(data, "created_at", str),
            current_subagent_id=req(data, "current_subagent_id", str, None, nullable=True),
            current_subagent_role=req(data, "current_subagent_role", str, None, nullable=True),
            token_baseline=int_field(data, "token_baseline", _I64_MIN, _I64_MAX, 0),
            tokens_used_high_water=int_field(data, "tokens_used_high_water", _I64_MIN, _I64_MAX, 0),
            parent_tokens_spent=int_field(data, "parent_tokens_spent", _I64_MIN, _I64_MAX, 0),
            last_session_tokens_seen=int_field(
                data, "last_session_tokens_seen", _I64_MIN, _I64_MAX, None, nullable=True
            ),
            history=history,
            pause_message=req(data, "pause_message", str, None, nullable=True),
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
            values[name] = int_field(data, name, 0, _U32_MAX, 0)
        for name in (
            "last_strategy_path",
            "last_strategy_recommendation",
            "changes_baseline_commit",
            "last_gap_fingerprint",
        ):
            values[name] = req(data, name, str, None, nullable=True)
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
    ) -> GoalTracker:
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
