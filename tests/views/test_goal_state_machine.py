"""A hypothesis state machine that drives GoalTracker with random operation sequences and checks
it against a model written straight from the transition table (reference §2.4-2.5)."""

import shutil
import tempfile

import orjson
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from memstore import GoalEvent, GoalOrchestration, GoalPauseReason, GoalPhase, GoalStatus, GoalTracker

# A hypothesis state machine over the goal tracker.
pytestmark = pytest.mark.slow

PAUSED = {"user_paused", "back_off_paused", "no_progress_paused", "infra_paused", "blocked"}
REASON = {  # reason -> (status, history detail)
    "user": ("user_paused", "user"),
    "back_off": ("back_off_paused", "back_off"),
    "no_progress": ("no_progress_paused", "no_progress"),
    "verification": ("blocked", "blocked"),
    "infra": ("infra_paused", "infra"),
}


class Clock:
    def __init__(self):
        self.now = 10**12

    def __call__(self):
        return self.now


class GoalTrackerMachine(RuleBasedStateMachine):
    @initialize()
    def setup(self):
        self.tmp = tempfile.mkdtemp(prefix="memstore-goal-")
        self.clock = Clock()
        self.tracker = GoalTracker(self.tmp, clock=self.clock)
        self.goal = None  # the model: a dict of the expected orchestration, or None
        self.active = False  # whether the active timer runs
        self.unaccounted_ns = 0

    def teardown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    # -- helpers

    def _reset_strategist(self):
        self.goal.update(
            consecutive_not_achieved=0,
            last_strategist_fired_at=0,
            strategist_cap_bonus=0,
            last_strategy_path=None,
            last_strategy_recommendation=None,
        )

    def _reset_stall(self):
        self.goal.update(classifier_stall_count=0, last_gap_fingerprint=None)

    def _account(self, carry=False):
        # Whole milliseconds are accounted; account_elapsed carries the sub-millisecond
        # remainder into the next interval, pause and finish drop it (as the reference does).
        self.goal["elapsed_ms"] += self.unaccounted_ns // 1_000_000
        self.unaccounted_ns = self.unaccounted_ns % 1_000_000 if carry else 0

    # -- transitions

    @rule(budget=st.one_of(st.none(), st.integers(0, 10**9)), baseline=st.integers(0, 10**6))
    def create_goal(self, budget, baseline):
        self.tracker.create_goal("g", "objective", budget, baseline, "2026-01-01T00:00:00Z", None)
        vid = self.tracker.verifier_id()
        assert self.goal is None or vid != self.goal["verifier_id"]
        self.goal = dict(
            status="active",
            phase="executing",
            elapsed_ms=0,
            pause_message=None,
            history=["goal_created"],
            subagent=None,
            classifier_stall_count=0,
            last_gap_fingerprint=None,
            classifier_runs_attempted=0,
            rounds_since_verify=0,
            verifier_id=vid,
            token_budget=budget,
            last_session_tokens_seen=baseline,
        )
        self._reset_strategist()
        self.active = True
        self.unaccounted_ns = 0

    @rule(reason=st.sampled_from(sorted(REASON)), message=st.one_of(st.none(), st.text(max_size=5)))
    def pause(self, reason, message):
        if message is None:
            applied = self.tracker.pause(GoalPauseReason(reason))
        else:
            applied = self.tracker.pause_with_message(GoalPauseReason(reason), message)
        allowed = self.goal is not None and self.goal["status"] == "active"
        assert applied == allowed
        if allowed:
            self._account()
            self.active = False
            self.goal["status"] = REASON[reason][0]
            if message is not None:
                self.goal["pause_message"] = message
            self.goal["history"].append(("goal_paused", REASON[reason][1]))

    @rule()
    def resume(self):
        applied = self.tracker.resume()
        allowed = self.goal is not None and self.goal["status"] in PAUSED
        assert applied == allowed
        if allowed:
            self.goal.update(status="active", pause_message=None, classifier_runs_attempted=0, rounds_since_verify=0)
            self._reset_strategist()
            self._reset_stall()
            self.active = True
            self.goal["history"].append("goal_resumed")

    @rule(budget=st.booleans())
    def finish(self, budget):
        applied = self.tracker.budget_limit() if budget else self.tracker.complete()
        allowed = self.goal is not None and (self.goal["status"] == "active" or self.goal["status"] in PAUSED)
        assert applied == allowed
        if allowed:
            self._account()
            self.active = False
            self.goal.update(
                status="budget_limited" if budget else "complete", phase="idle", subagent=None, pause_message=None
            )
            self._reset_strategist()
            self.goal["history"].append("budget_exceeded" if budget else "goal_completed")

    @rule()
    def clear(self):
        self.tracker.clear()
        self.goal = None
        self.active = False
        self.unaccounted_ns = 0

    @rule(phase=st.sampled_from(["idle", "planning", "executing"]))
    def set_phase(self, phase):
        self.tracker.set_phase(GoalPhase(phase))
        if self.goal is not None:
            self.goal["phase"] = phase

    @rule(sub=st.one_of(st.none(), st.sampled_from(["a", "b"])))
    def set_subagent(self, sub):
        self.tracker.set_current_subagent(sub, None if sub is None else "worker")
        if self.goal is not None:
            self.goal["subagent"] = sub

    @rule(ms=st.integers(0, 5000), ns=st.integers(0, 999_999))
    def tick(self, ms, ns):
        self.clock.now += ms * 1_000_000 + ns
        if self.active:
            self.unaccounted_ns += ms * 1_000_000 + ns

    @rule()
    def account_elapsed(self):
        self.tracker.account_elapsed()
        if self.goal is not None and self.active:
            self._account(carry=True)

    @rule(fp=st.sampled_from(["fp-a", "fp-b"]))
    def record_classifier_stall(self, fp):
        tripped = self.tracker.record_classifier_stall(fp)
        if self.goal is None:
            assert tripped is False
            return
        if self.goal["last_gap_fingerprint"] == fp:
            self.goal["classifier_stall_count"] += 1
        else:
            self.goal.update(last_gap_fingerprint=fp, classifier_stall_count=1)
        assert tripped == (self.goal["classifier_stall_count"] >= 2)

    @rule()
    def reset_classifier_stall(self):
        self.tracker.reset_classifier_stall()
        if self.goal is not None:
            self._reset_stall()

    @rule()
    def reserve_and_rollback_attempts(self):
        if self.goal is not None:
            self.tracker.snapshot().classifier_runs_attempted += 1
            self.goal["classifier_runs_attempted"] += 1
        self.tracker.rollback_classifier_attempt()
        self.tracker.rollback_classifier_attempt()
        if self.goal is not None:
            self.goal["classifier_runs_attempted"] = max(0, self.goal["classifier_runs_attempted"] - 2)

    @rule()
    def not_achieved(self):
        streak = self.tracker.record_not_achieved_streak()
        if self.goal is None:
            assert streak == 0
        else:
            self.goal["consecutive_not_achieved"] += 1
            assert streak == self.goal["consecutive_not_achieved"]

    @rule(fire=st.booleans())
    def claim_strategist_fire(self, fire):
        got = self.tracker.claim_strategist_fire(lambda _streak, _last: fire)
        if self.goal is None or not fire:
            assert got is None
            return
        streak = self.goal["consecutive_not_achieved"]
        assert got == streak
        self.goal.update(last_strategist_fired_at=streak, strategist_cap_bonus=3)
        self._reset_stall()

    @rule()
    def revoke_bonus(self):
        self.tracker.revoke_strategist_cap_bonus()
        if self.goal is not None:
            self.goal["strategist_cap_bonus"] = 0

    @rule()
    def reset_strategist(self):
        self.tracker.reset_strategist_state()
        if self.goal is not None:
            self._reset_strategist()

    @rule(text=st.text(max_size=5))
    def recommend(self, text):
        self.tracker.record_strategy_recommendation("/tmp/strategy.md", text)
        if self.goal is not None:
            self.goal.update(last_strategy_path="/tmp/strategy.md", last_strategy_recommendation=text)

    @precondition(lambda self: self.goal is not None)
    @rule()
    def persist_and_restore(self):
        wire = orjson.dumps(self.tracker.snapshot().to_dict())
        snapshot = GoalOrchestration.from_dict(orjson.loads(wire))
        self.tracker = GoalTracker.from_snapshot(self.tmp, snapshot, clock=self.clock)
        if self.goal["phase"] in ("planning", "executing"):
            self.goal["phase"] = "idle"
            if self.goal["status"] == "active":
                self.goal["status"] = "user_paused"
            self.goal["subagent"] = None
        self.active = self.goal["status"] == "active"
        self.unaccounted_ns = 0  # time not yet accounted is not part of a snapshot

    # -- invariants

    @invariant()
    def matches_model(self):
        o = self.tracker.snapshot()
        if self.goal is None:
            assert o is None and self.tracker.status() is None and self.tracker.active_since is None
            return
        g = self.goal
        assert o.status is GoalStatus(g["status"])
        assert o.phase is GoalPhase(g["phase"])
        assert self.tracker.is_active() == (g["status"] == "active")
        assert (self.tracker.active_since is not None) == self.active == (g["status"] == "active")
        assert o.elapsed_ms == g["elapsed_ms"]
        assert o.pause_message == g["pause_message"]
        assert o.current_subagent_id == g["subagent"]
        assert o.verifier_id == g["verifier_id"]
        assert o.token_budget == g["token_budget"] and o.last_session_tokens_seen == g["last_session_tokens_seen"]
        for name in (
            "classifier_stall_count",
            "last_gap_fingerprint",
            "classifier_runs_attempted",
            "rounds_since_verify",
            "consecutive_not_achieved",
            "last_strategist_fired_at",
            "strategist_cap_bonus",
            "last_strategy_path",
            "last_strategy_recommendation",
        ):
            assert getattr(o, name) == g[name], name
        history = [e.event.value if e.detail is None else (e.event.value, e.detail) for e in o.history]
        assert history == g["history"]
        assert all(e.event is not GoalEvent.UNKNOWN for e in o.history)

    @invariant()
    def terminal_states_stop_the_clock(self):
        # set_phase and set_current_subagent stay allowed (unvalidated, as in the reference), so
        # only the timer and the pause message are fixed by a terminal state.
        o = self.tracker.snapshot()
        if o is not None and o.status.is_terminal():
            assert self.tracker.active_since is None and o.pause_message is None

    @invariant()
    def wire_round_trip_is_lossless(self):
        o = self.tracker.snapshot()
        if o is not None:
            assert GoalOrchestration.from_dict(orjson.loads(orjson.dumps(o.to_dict()))) == o


GoalTrackerMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
test_goal_tracker_state_machine = GoalTrackerMachine.TestCase
