import os
import stat

import orjson
import pytest

import memstore
import memstore.views.progress as progress_mod
from memstore import (
    GoalEvent,
    GoalHistoryEntry,
    GoalOrchestration,
    GoalPauseReason,
    GoalPhase,
    GoalStatus,
    GoalTracker,
    InvalidProgress,
    Milestone,
    MilestoneStatus,
    ProgressLedger,
    StoreIOError,
    load_progress,
    milestone_status_from_str,
    progress_path,
    save_progress,
)
from memstore.goals import GoalClassifierVerdict
from memstore.views.progress import milestone_from_tracker_item

F32_EPSILON = 1.1920929e-07


def sample_ledger():
    ledger = ProgressLedger.new("s1", "ship the feature")
    ledger.set_milestones(
        [
            Milestone("1", "design", MilestoneStatus.DONE),
            Milestone("2", "implement", MilestoneStatus.IN_PROGRESS),
            Milestone("3", "verify", MilestoneStatus.PENDING),
        ]
    )
    return ledger


class FakeClock:
    """Monotonic nanoseconds under test control."""

    def __init__(self):
        self.now = 1_000_000_000

    def __call__(self):
        return self.now

    def advance_ms(self, ms):
        self.now += ms * 1_000_000


def make_tracker(tmp_path, clock=None):
    return GoalTracker(tmp_path / "session", clock=clock or FakeClock())


def activate(tracker):
    tracker.create_goal("goal-1", "Build a widget", 100_000, 0, "2026-01-01T00:00:00Z", None)


# --------------------------------------------------------------------------------------------
# ProgressLedger: reference scenarios


def test_completion_ratio_reflects_terminal_milestones():
    ledger = sample_ledger()
    assert abs(ledger.completion_ratio() - 1 / 3) < F32_EPSILON
    assert not ledger.is_complete()


def test_empty_ledger_is_complete():
    ledger = ProgressLedger.new("s", "goal")
    assert ledger.is_complete()
    assert abs(ledger.completion_ratio() - 1.0) < F32_EPSILON


def test_advance_clears_stall_and_bumps_confidence():
    ledger = sample_ledger()
    ledger.note_stall()
    assert ledger.is_stalled()
    before = ledger.confidence
    ledger.note_advance()
    assert not ledger.is_stalled()
    assert ledger.confidence >= before


def test_persistence_round_trips(tmp_path):
    ledger = sample_ledger()
    ledger.note_stall()
    save_progress(tmp_path, "s1", ledger)
    loaded = load_progress(tmp_path, "s1")
    assert loaded == ledger
    assert loaded.is_stalled()
    assert load_progress(tmp_path, "absent") is None


def test_handoff_metadata_defaults_to_none():
    ledger = ProgressLedger.new("s1", "goal")
    assert ledger.previous_session_id is None
    assert ledger.handoff_summary is None
    assert ledger.known_issues == []
    assert ledger.git_checkpoint is None


def test_set_handoff_records_metadata():
    ledger = ProgressLedger.new("s2", "goal")
    ledger.set_handoff("s1", "implemented login", "abc123")
    assert ledger.previous_session_id == "s1"
    assert ledger.handoff_summary == "implemented login"
    assert ledger.git_checkpoint == "abc123"


def test_add_known_issue_accumulates():
    ledger = ProgressLedger.new("s3", "goal")
    ledger.add_known_issue("rate limiting missing")
    ledger.add_known_issue("no error handling for timeouts")
    assert len(ledger.known_issues) == 2
    assert ledger.known_issues[0] == "rate limiting missing"


def test_handoff_metadata_survives_persistence(tmp_path):
    ledger = sample_ledger()
    ledger.set_handoff("prev-session", "built auth", "def456")
    ledger.add_known_issue("tests are flaky")
    save_progress(tmp_path, "s4", ledger)
    loaded = load_progress(tmp_path, "s4")
    assert loaded.previous_session_id == "prev-session"
    assert loaded.handoff_summary == "built auth"
    assert loaded.git_checkpoint == "def456"
    assert loaded.known_issues == ["tests are flaky"]


def test_to_markdown_includes_handoff_metadata():
    ledger = ProgressLedger.new("s5", "build feature")
    ledger.set_handoff("s4", "implemented core", "abc123")
    ledger.add_known_issue("missing error handling")
    md = ledger.to_markdown()
    assert "Handed off from:** s4" in md
    assert "Handoff summary:** implemented core" in md
    assert "Git checkpoint:** `abc123`" in md
    assert "- missing error handling" in md


def test_to_markdown_omits_handoff_when_absent():
    md = ProgressLedger.new("s6", "goal").to_markdown()
    assert "Handed off from" not in md
    assert "Handoff summary" not in md
    assert "Git checkpoint" not in md
    assert "Known Issues" not in md


# --------------------------------------------------------------------------------------------
# ProgressLedger: wire format, arithmetic and rendering details


def test_json_has_reference_key_order_and_float32_confidence():
    ledger = ProgressLedger(
        session_id="s1",
        goal="g",
        milestones=[Milestone("1", "a", MilestoneStatus.BLOCKED)],
        updated_at="2026-11-30T08:30:29.123Z",
    )
    ledger.note_stall()  # 1.0 - 0.1 in float32
    ledger.stalled_since = ledger.updated_at = "2026-11-30T08:30:29.123Z"
    assert ledger.to_json() == (
        b'{"session_id":"s1","goal":"g","milestones":[{"id":"1","description":"a","status":"blocked"}],'
        b'"confidence":0.9,"stalled_since":"2026-11-30T08:30:29.123Z",'
        b'"updated_at":"2026-11-30T08:30:29.123Z","previous_session_id":null,"handoff_summary":null,'
        b'"known_issues":[],"git_checkpoint":null}'
    )


def test_confidence_follows_float32_arithmetic_and_bounds():
    ledger = ProgressLedger.new("s", "g")
    ledger.note_advance()
    assert ledger.to_dict()["confidence"] == 1.0  # capped
    ledger.note_stall()
    ledger.note_stall()
    # Rust prints 1.0f32 - 0.1 - 0.1 as 0.79999995: the float32 steps are kept, not tidied.
    assert orjson.dumps(ledger.to_dict()["confidence"]) == b"0.79999995"
    for _ in range(20):
        ledger.note_stall()
    assert ledger.confidence == 0.0
    ledger.note_advance()
    assert orjson.dumps(ledger.to_dict()["confidence"]) == b"0.05"
    assert orjson.dumps(ProgressLedger.new("s", "g").to_dict()["confidence"]) == b"1.0"


def test_note_stall_keeps_first_stall_timestamp(monkeypatch):
    stamps = iter(["2026-01-01T00:00:00.000Z", "2026-01-02T00:00:00.000Z"])
    monkeypatch.setattr(progress_mod, "utc_now", lambda: next(stamps))
    ledger = ProgressLedger("s", "g", updated_at="2025-01-01T00:00:00.000Z")
    ledger.note_stall()
    ledger.note_stall()
    assert ledger.stalled_since == "2026-01-01T00:00:00.000Z"
    assert ledger.updated_at == "2026-01-02T00:00:00.000Z"


@pytest.mark.parametrize(
    "op",
    [
        lambda log: log.note_advance(),
        lambda log: log.note_stall(),
        lambda log: log.set_milestones([]),
        lambda log: log.set_goal("other"),
        lambda log: log.set_handoff("p", "s"),
        lambda log: log.add_known_issue("i"),
    ],
)
def test_every_operation_refreshes_updated_at(monkeypatch, op):
    ledger = ProgressLedger("s", "g", updated_at="2020-01-01T00:00:00.000Z")
    monkeypatch.setattr(progress_mod, "utc_now", lambda: "2026-11-30T08:30:29.123Z")
    op(ledger)
    assert ledger.updated_at == "2026-11-30T08:30:29.123Z"


def test_set_handoff_without_checkpoint_overwrites_previous_one():
    ledger = ProgressLedger.new("s", "g")
    ledger.set_handoff("a", "first", "abc")
    ledger.set_handoff("b", "second")
    assert (ledger.previous_session_id, ledger.handoff_summary, ledger.git_checkpoint) == ("b", "second", None)


def test_markdown_exact_with_everything():
    ledger = ProgressLedger(
        session_id="s",
        goal="ship it",
        milestones=[
            Milestone("1", "design", MilestoneStatus.DONE),
            Milestone("2", "build", MilestoneStatus.IN_PROGRESS),
            Milestone("3", "wait", MilestoneStatus.BLOCKED),
            Milestone("4", "test", MilestoneStatus.PENDING),
        ],
        confidence=progress_mod._f32(0.9),
        stalled_since="2026-01-01T00:00:00.000Z",
        updated_at="2026-01-02T00:00:00.000Z",
        previous_session_id="prev",
        handoff_summary="built auth",
        known_issues=["flaky tests", "no docs"],
        git_checkpoint="abc123",
    )
    assert ledger.to_markdown() == (
        "# Session Progress\n"
        "\n"
        "**Goal:** ship it\n"
        "**Completion:** 25%\n"
        "**Confidence:** 0.90\n"
        "**Stalled since:** 2026-01-01T00:00:00.000Z\n"
        "**Updated:** 2026-01-02T00:00:00.000Z\n"
        "\n"
        "**Handed off from:** prev\n"
        "**Handoff summary:** built auth\n"
        "**Git checkpoint:** `abc123`\n"
        "\n"
        "## Known Issues\n"
        "\n"
        "- flaky tests\n"
        "- no docs\n"
        "\n"
        "## Milestones\n"
        "\n"
        "[x] 1 \u2014 design\n"
        "[~] 2 \u2014 build\n"
        "[!] 3 \u2014 wait\n"
        "[ ] 4 \u2014 test\n"
    )


def test_markdown_exact_for_a_fresh_ledger():
    ledger = ProgressLedger("s", "g", updated_at="2026-01-02T00:00:00.000Z")
    assert ledger.to_markdown() == (
        "# Session Progress\n\n**Goal:** g\n**Completion:** 100%\n**Confidence:** 1.00\n"
        "**Updated:** 2026-01-02T00:00:00.000Z\n\n\n_No tracked milestones yet._\n"
    )


def test_markdown_completion_rounds_halves_away_from_zero():
    done = [Milestone("1", "a", MilestoneStatus.DONE)]
    pending = [Milestone(str(i), "x") for i in range(2, 9)]
    ledger = ProgressLedger("s", "g", milestones=done + pending)  # 1/8 = 12.5%
    assert "**Completion:** 13%\n" in ledger.to_markdown()
    ledger.milestones = done + pending[:2]  # 1/3
    assert "**Completion:** 33%\n" in ledger.to_markdown()
    ledger.milestones = done + [Milestone("2", "b", MilestoneStatus.DONE), pending[0]]  # 2/3
    assert "**Completion:** 67%\n" in ledger.to_markdown()


def test_orientation_line():
    ledger = sample_ledger()
    assert ledger.orientation() == "Goal: ship the feature | Completion: 33% | Confidence: 1.00 | on track"
    ledger.note_stall()
    assert ledger.orientation().endswith("| Confidence: 0.90 | STALLED")


@pytest.mark.parametrize(
    "text, status",
    [
        ("done", MilestoneStatus.DONE),
        (" Completed ", MilestoneStatus.DONE),
        ("PASS", MilestoneStatus.DONE),
        ("passed", MilestoneStatus.DONE),
        ("success", MilestoneStatus.DONE),
        ("complete", MilestoneStatus.DONE),
        ("blocked", MilestoneStatus.BLOCKED),
        ("Stuck", MilestoneStatus.BLOCKED),
        ("waiting", MilestoneStatus.BLOCKED),
        ("in_progress", MilestoneStatus.IN_PROGRESS),
        ("In Progress", MilestoneStatus.IN_PROGRESS),
        ("active", MilestoneStatus.IN_PROGRESS),
        ("running", MilestoneStatus.IN_PROGRESS),
        ("todo", MilestoneStatus.PENDING),
        ("", MilestoneStatus.PENDING),
        ("in-progress", MilestoneStatus.PENDING),
    ],
)
def test_milestone_status_from_tracker_strings(text, status):
    assert milestone_status_from_str(text) is status


def test_milestone_from_tracker_item_uses_index_or_description():
    assert milestone_from_tracker_item(2, "build", "done") == Milestone("2", "build", MilestoneStatus.DONE)
    assert milestone_from_tracker_item(None, "build", "x") == Milestone("build", "build", MilestoneStatus.PENDING)


def test_only_done_is_terminal():
    assert [s for s in MilestoneStatus if s.is_terminal()] == [MilestoneStatus.DONE]


# --------------------------------------------------------------------------------------------
# Persistence


def test_progress_path_is_under_derived_and_sanitized(tmp_path):
    path = progress_path(tmp_path, "../outside")
    assert path == tmp_path / "sessions" / memstore.session_dir_name("../outside") / "derived" / "progress.json"
    assert path.parent.parent.name.startswith("_outside~")


def test_save_is_private_and_leaves_no_temp_files(tmp_path):
    path = save_progress(tmp_path, "s1", sample_ledger())
    assert path == progress_path(tmp_path, "s1")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(path.parent).st_mode) == 0o700
    assert os.listdir(path.parent) == ["progress.json"]
    assert orjson.loads(path.read_bytes())["session_id"] == "s1"


def test_failed_save_keeps_the_previous_ledger(tmp_path, monkeypatch):
    first = sample_ledger()
    save_progress(tmp_path, "s1", first)
    before = progress_path(tmp_path, "s1").read_bytes()

    def crash(*args, **kwargs):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "replace", crash)
    second = sample_ledger()
    second.set_goal("something else")
    with pytest.raises(StoreIOError):
        save_progress(tmp_path, "s1", second)
    assert progress_path(tmp_path, "s1").read_bytes() == before
    assert os.listdir(progress_path(tmp_path, "s1").parent) == ["progress.json"]


def test_save_refuses_a_symlinked_ledger(tmp_path):
    target = tmp_path / "elsewhere.json"
    target.write_text("keep")
    path = progress_path(tmp_path, "s1")
    path.parent.mkdir(parents=True)
    path.symlink_to(target)
    with pytest.raises(StoreIOError):
        save_progress(tmp_path, "s1", sample_ledger())
    assert target.read_text() == "keep"
    with pytest.raises(StoreIOError):
        load_progress(tmp_path, "s1")


def test_load_applies_defaults_for_optional_keys(tmp_path):
    path = progress_path(tmp_path, "s")
    path.parent.mkdir(parents=True)
    path.write_bytes(
        b'{"session_id":"s","goal":"g","milestones":[],"confidence":1,"updated_at":"2026-01-01T00:00:00Z"}'
    )
    ledger = load_progress(tmp_path, "s")
    assert ledger.stalled_since is None
    assert ledger.known_issues == [] and ledger.previous_session_id is None and ledger.git_checkpoint is None
    assert ledger.confidence == 1.0


@pytest.mark.parametrize(
    "content, fragment",
    [
        (b'{"session_id":"s","goal":"g","confidence":1,"updated_at":"t"}', "milestones"),
        (b'{"session_id":"s","goal":"g","milestones":[],"updated_at":"t"}', "confidence"),
        (b'{"session_id":"s","goal":"g","milestones":[],"confidence":1}', "updated_at"),
        (
            b'{"session_id":"s","goal":"g","milestones":[{"id":"1","description":"d","status":"Done"}],'
            b'"confidence":1,"updated_at":"t"}',
            "milestone status",
        ),
        (b"{not json", "not valid JSON"),
    ],
)
def test_load_rejects_malformed_ledgers_naming_the_file(tmp_path, content, fragment):
    path = progress_path(tmp_path, "s")
    path.parent.mkdir(parents=True)
    path.write_bytes(content)
    with pytest.raises(InvalidProgress) as info:
        load_progress(tmp_path, "s")
    assert str(path) in str(info.value)
    assert fragment in str(info.value)


# --------------------------------------------------------------------------------------------
# GoalTracker: reference scenarios


def test_create_goal_activates_and_starts_timer(tmp_path):
    t = make_tracker(tmp_path)
    activate(t)
    assert t.is_active()
    assert t.phase() is GoalPhase.EXECUTING
    assert t.status() is GoalStatus.ACTIVE
    assert t.objective() == "Build a widget"
    assert t.token_budget() == 100_000
    assert t.active_since is not None


def test_lifecycle_transitions_record_history_events(tmp_path):
    t = make_tracker(tmp_path)
    activate(t)
    assert t.snapshot().history[-1].event is GoalEvent.GOAL_CREATED
    assert t.pause(GoalPauseReason.USER)
    last = t.snapshot().history[-1]
    assert last.event is GoalEvent.GOAL_PAUSED
    assert last.detail == "user"
    assert t.resume()
    assert t.snapshot().history[-1].event is GoalEvent.GOAL_RESUMED
    assert t.complete()
    assert t.snapshot().history[-1].event is GoalEvent.GOAL_COMPLETED
    assert [e.event for e in t.snapshot().history] == [
        GoalEvent.GOAL_CREATED,
        GoalEvent.GOAL_PAUSED,
        GoalEvent.GOAL_RESUMED,
        GoalEvent.GOAL_COMPLETED,
    ]


def test_pause_only_from_active(tmp_path):
    t = make_tracker(tmp_path)
    activate(t)
    assert t.pause(GoalPauseReason.USER)
    assert t.status() is GoalStatus.USER_PAUSED
    assert not t.is_active()
    assert not t.pause(GoalPauseReason.BACK_OFF)  # no re-pause with another reason
    assert t.status() is GoalStatus.USER_PAUSED
    assert t.resume()
    assert t.status() is GoalStatus.ACTIVE
    assert t.is_active()


def test_pause_from_complete_is_noop(tmp_path):
    t = make_tracker(tmp_path)
    activate(t)
    t.complete()
    history = len(t.snapshot().history)
    assert not t.pause(GoalPauseReason.USER)
    assert t.status() is GoalStatus.COMPLETE
    assert len(t.snapshot().history) == history


def test_resume_only_from_paused_variants(tmp_path):
    t = make_tracker(tmp_path)
    activate(t)
    assert not t.resume()
    assert t.status() is GoalStatus.ACTIVE
    t.budget_limit()
    assert not t.resume()
    assert t.status() is GoalStatus.BUDGET_LIMITED


def test_complete_from_active_succeeds(tmp_path):
    t = make_tracker(tmp_path)
    activate(t)
    t.set_current_subagent("sub-1", "worker")
    assert t.complete()
    assert t.status() is GoalStatus.COMPLETE
    assert t.current_subagent_id() is None
    assert t.snapshot().current_subagent_role is None


@pytest.mark.parametrize("reason", [GoalPauseReason.USER, GoalPauseReason.VERIFICATION])
def test_complete_from_paused_or_blocked_succeeds(tmp_path, reason):
    t = make_tracker(tmp_path)
    activate(t)
    t.pause(reason)
    assert t.complete()
    assert t.status() is GoalStatus.COMPLETE


def test_budget_limit_from_active_succeeds(tmp_path):
    t = make_tracker(tmp_path)
    activate(t)
    t.set_phase(GoalPhase.EXECUTING)
    assert t.budget_limit()
    assert t.status() is GoalStatus.BUDGET_LIMITED
    assert t.phase() is GoalPhase.IDLE
    assert t.snapshot().history[-1].event is GoalEvent.BUDGET_EXCEEDED


def test_terminal_states_refuse_every_transition(tmp_path):
    for finish in (GoalTracker.complete, GoalTracker.budget_limit):
        t = make_tracker(tmp_path)
        activate(t)
        assert finish(t)
        status = t.status()
        assert not t.pause(GoalPauseReason.USER)
        assert not t.resume()
        assert not t.complete()
        assert not t.budget_limit()
        assert t.status() is status


def test_pause_reason_maps_to_correct_status(tmp_path):
    t = make_tracker(tmp_path)
    activate(t)
    assert t.pause(GoalPauseReason.USER)
    assert t.status() is GoalStatus.USER_PAUSED
    t.resume()
    assert t.pause(GoalPauseReason.BACK_OFF)
    assert t.status() is GoalStatus.BACK_OFF_PAUSED
    t.resume()
    assert t.pause(GoalPauseReason.NO_PROGRESS)
    assert t.status() is GoalStatus.NO_PROGRESS_PAUSED
    t.resume()
    assert t.pause_with_message(GoalPauseReason.INFRA, "Turn failed: rate limit")
    assert t.status() is GoalStatus.INFRA_PAUSED
    details = [e.detail for e in t.snapshot().history if e.event is GoalEvent.GOAL_PAUSED]
    assert details == ["user", "back_off", "no_progress", "infra"]


def test_is_paused_matches_all_paused_variants():
    paused = {s for s in GoalStatus if s.is_paused()}
    assert paused == {
        GoalStatus.USER_PAUSED,
        GoalStatus.BACK_OFF_PAUSED,
        GoalStatus.NO_PROGRESS_PAUSED,
        GoalStatus.INFRA_PAUSED,
        GoalStatus.BLOCKED,
    }
    assert not GoalStatus.ACTIVE.is_paused()
    assert not GoalStatus.COMPLETE.is_paused()
    assert not GoalStatus.BUDGET_LIMITED.is_paused()


def test_no_progress_paused_round_trips_distinctly_from_back_off():
    assert GoalStatus.from_wire_str("no_progress_paused") is GoalStatus.NO_PROGRESS_PAUSED
    wire = orjson.dumps(GoalStatus.NO_PROGRESS_PAUSED)
    assert wire == b'"no_progress_paused"'
    assert GoalStatus(orjson.loads(wire)) is GoalStatus.NO_PROGRESS_PAUSED
    assert GoalStatus.from_wire_str("back_off_paused") is GoalStatus.BACK_OFF_PAUSED
    assert GoalStatus.NO_PROGRESS_PAUSED is not GoalStatus.BACK_OFF_PAUSED


def test_resume_from_user_paused(tmp_path):
    t = make_tracker(tmp_path)
    activate(t)
    t.pause(GoalPauseReason.USER)
    assert t.resume()
    assert t.status() is GoalStatus.ACTIVE


def test_resume_from_infra_paused_clears_pause_message(tmp_path):
    t = make_tracker(tmp_path)
    activate(t)
    t.pause_with_message(GoalPauseReason.INFRA, "Turn failed: auth")
    assert t.snapshot().pause_message == "Turn failed: auth"
    assert t.resume()
    assert t.status() is GoalStatus.ACTIVE
    assert t.snapshot().pause_message is None


def test_pause_with_verification_reason_transitions_to_blocked(tmp_path):
    t = make_tracker(tmp_path)
    activate(t)
    assert t.pause(GoalPauseReason.VERIFICATION)
    assert t.status() is GoalStatus.BLOCKED
    assert t.status().is_paused()
    assert t.snapshot().history[-1].detail == "blocked"


def test_resume_from_blocked_transitions_to_active(tmp_path):
    t = make_tracker(tmp_path)
    activate(t)
    t.pause(GoalPauseReason.VERIFICATION)
    assert t.resume()
    assert t.status() is GoalStatus.ACTIVE


@pytest.mark.parametrize("wire", ["error_paused", "quarantined", "v9_super_active", "", "not-a-status"])
def test_unknown_statuses_deserialize_to_user_paused(wire):
    assert GoalStatus(orjson.loads(orjson.dumps(wire))) is GoalStatus.USER_PAUSED
    assert GoalStatus.from_wire_str(wire) is GoalStatus.USER_PAUSED


@pytest.mark.parametrize(
    "wire, status",
    [
        ("Paused", GoalStatus.USER_PAUSED),
        ("paused", GoalStatus.USER_PAUSED),
        ("doom_loop_paused", GoalStatus.USER_PAUSED),
        ("Active", GoalStatus.ACTIVE),
        ("BudgetLimited", GoalStatus.BUDGET_LIMITED),
        ("Complete", GoalStatus.COMPLETE),
        ("infra_paused", GoalStatus.INFRA_PAUSED),
        ("blocked", GoalStatus.BLOCKED),
    ],
)
def test_legacy_and_current_statuses_parse(wire, status):
    assert GoalStatus(wire) is status


def test_status_parsing_is_case_sensitive_and_rejects_non_strings():
    assert GoalStatus("ACTIVE") is GoalStatus.USER_PAUSED  # not an alias: fail safe, never active
    with pytest.raises(ValueError):
        GoalStatus(1)


def test_goal_event_unknown_string_deserializes_to_unknown():
    assert GoalEvent("some_future_event") is GoalEvent.UNKNOWN
    assert GoalEvent("goal_paused") is GoalEvent.GOAL_PAUSED
    entry = GoalHistoryEntry.from_dict({"timestamp": "t", "event": "some_future_event"})
    assert entry.event is GoalEvent.UNKNOWN


def test_goal_phase_has_no_aliases():
    assert GoalPhase("idle") is GoalPhase.IDLE
    for wire in ("Idle", "Planning", "EXECUTING"):
        with pytest.raises(ValueError):
            GoalPhase(wire)


def test_classifier_verdict_wire_values():
    assert [v.value for v in GoalClassifierVerdict] == ["achieved", "not_achieved"]


def test_record_classifier_stall_trips_on_two_consecutive_identical_fingerprints(tmp_path):
    t = make_tracker(tmp_path)
    activate(t)
    assert not t.record_classifier_stall("fp-a")
    assert t.record_classifier_stall("fp-a")
    assert t.snapshot().classifier_stall_count == 2


def test_record_classifier_stall_resets_when_fingerprint_changes(tmp_path):
    t = make_tracker(tmp_path)
    activate(t)
    assert not t.record_classifier_stall("fp-a")
    assert t.record_classifier_stall("fp-a")
    assert not t.record_classifier_stall("fp-b")
    assert t.snapshot().classifier_stall_count == 1
    assert t.record_classifier_stall("fp-b")


def test_reset_classifier_stall_clears_streak_so_next_occurrence_is_first(tmp_path):
    t = make_tracker(tmp_path)
    activate(t)
    assert not t.record_classifier_stall("fp-a")
    assert t.record_classifier_stall("fp-a")
    t.reset_classifier_stall()
    assert t.snapshot().classifier_stall_count == 0
    assert t.snapshot().last_gap_fingerprint is None
    assert not t.record_classifier_stall("fp-a")


def test_full_lifecycle_create_to_complete(tmp_path):
    t = make_tracker(tmp_path)
    activate(t)
    t.set_phase(GoalPhase.EXECUTING)
    assert t.phase() is GoalPhase.EXECUTING
    t.set_current_subagent("sub-1", "worker")
    assert t.current_subagent_id() == "sub-1"
    assert t.complete()
    assert t.status() is GoalStatus.COMPLETE
    assert t.phase() is GoalPhase.IDLE
    assert t.current_subagent_id() is None
    assert t.active_since is None


def test_serde_round_trip_preserves_data(tmp_path):
    t = make_tracker(tmp_path)
    activate(t)
    t.set_phase(GoalPhase.EXECUTING)
    original = t.snapshot()
    restored = GoalOrchestration.from_dict(orjson.loads(orjson.dumps(original.to_dict())))
    assert restored.goal_id == original.goal_id
    assert restored.objective == original.objective
    assert restored.status is original.status
    assert restored.phase is original.phase
    assert restored == original  # and everything else, history and verifier_id included


def test_record_not_achieved_streak_increments_and_returns_new_count(tmp_path):
    t = make_tracker(tmp_path)
    activate(t)
    assert [t.record_not_achieved_streak() for _ in range(3)] == [1, 2, 3]
    assert t.snapshot().consecutive_not_achieved == 3


def test_claim_strategist_fire_marks_current_streak(tmp_path):
    t = make_tracker(tmp_path)
    activate(t)
    t.record_not_achieved_streak()
    t.record_not_achieved_streak()
    t.record_classifier_stall("fp")
    seen = []
    assert t.claim_strategist_fire(lambda streak, last: seen.append((streak, last)) or True) == 2
    assert seen == [(2, 0)]
    o = t.snapshot()
    assert (o.consecutive_not_achieved, o.last_strategist_fired_at) == (2, 2)
    assert o.classifier_stall_count == 0 and o.last_gap_fingerprint is None


def test_claim_strategist_fire_skips_and_preserves_state_when_predicate_false(tmp_path):
    t = make_tracker(tmp_path)
    activate(t)
    t.record_not_achieved_streak()
    t.record_classifier_stall("fp")
    assert t.claim_strategist_fire(lambda _streak, _last: False) is None
    o = t.snapshot()
    assert o.last_strategist_fired_at == 0
    assert o.strategist_cap_bonus == 0
    assert o.classifier_stall_count == 1


def test_strategist_fire_grants_cap_bonus_then_reset_clears_it(tmp_path):
    t = make_tracker(tmp_path)
    activate(t)
    assert t.snapshot().strategist_cap_bonus == 0
    t.record_not_achieved_streak()
    t.record_not_achieved_streak()
    t.claim_strategist_fire(lambda _s, _l: True)
    assert t.snapshot().strategist_cap_bonus == 3
    t.revoke_strategist_cap_bonus()
    assert t.snapshot().strategist_cap_bonus == 0
    t.claim_strategist_fire(lambda _s, _l: True)
    t.reset_strategist_state()
    assert t.snapshot().strategist_cap_bonus == 0


def test_reset_strategist_state_clears_streak_marker_and_recommendation(tmp_path):
    t = make_tracker(tmp_path)
    activate(t)
    t.record_not_achieved_streak()
    t.record_not_achieved_streak()
    t.claim_strategist_fire(lambda _s, _l: True)
    t.record_strategy_recommendation("/tmp/goal/strategy.md", "split it")
    assert t.snapshot().last_strategy_recommendation == "split it"
    t.reset_strategist_state()
    o = t.snapshot()
    assert o.consecutive_not_achieved == 0
    assert o.last_strategist_fired_at == 0
    assert o.last_strategy_path is None
    assert o.last_strategy_recommendation is None


# --------------------------------------------------------------------------------------------
# GoalTracker: the rest of the transition table


def test_create_goal_initial_state(tmp_path):
    t = make_tracker(tmp_path)
    t.create_goal("g", "obj", None, 1234, "2026-01-01T00:00:00Z", "deadbeef")
    o = t.snapshot()
    assert (o.status, o.phase, o.elapsed_ms, o.token_budget) == (GoalStatus.ACTIVE, GoalPhase.EXECUTING, 0, None)
    assert o.token_baseline == 1234 and o.last_session_tokens_seen == 1234
    assert o.changes_baseline_commit == "deadbeef"
    assert o.created_at == "2026-01-01T00:00:00Z"
    assert [e.event for e in o.history] == [GoalEvent.GOAL_CREATED]
    assert (tmp_path / "session" / "goal").is_dir()


def test_create_goal_replacing_keeps_an_empty_goal_dir(tmp_path):
    t = make_tracker(tmp_path)
    activate(t)
    goal_dir = tmp_path / "session" / "goal"
    (goal_dir / "scratch.md").write_text("old notes")
    (goal_dir / "nested").mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("keep")
    (goal_dir / "link").symlink_to(outside)
    old_id = t.verifier_id()
    t.create_goal("goal-2", "Another", None, 0, "2026-01-02T00:00:00Z", None)
    assert goal_dir.is_dir()  # the reference deletes it here
    assert os.listdir(goal_dir) == []
    assert (outside / "keep.txt").read_text() == "keep"
    assert t.snapshot().goal_id == "goal-2"
    assert [e.event for e in t.snapshot().history] == [GoalEvent.GOAL_CREATED]
    assert t.verifier_id() != old_id


def test_create_goal_does_not_follow_a_symlinked_goal_dir(tmp_path):
    t = make_tracker(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("keep")
    (tmp_path / "session").mkdir()
    (tmp_path / "session" / "goal").symlink_to(outside)
    activate(t)
    activate(t)  # replacing must not clear the symlink's target
    assert (outside / "keep.txt").read_text() == "keep"
    assert t.is_active()


def test_pause_keeps_existing_message_when_none_given(tmp_path):
    t = make_tracker(tmp_path)
    activate(t)
    t.snapshot().pause_message = "earlier"
    assert t.pause(GoalPauseReason.BACK_OFF)
    assert t.snapshot().pause_message == "earlier"


def test_resume_resets_counters_strategist_and_stall_but_not_phase(tmp_path):
    t = make_tracker(tmp_path)
    activate(t)
    o = t.snapshot()
    t.set_phase(GoalPhase.PLANNING)
    o.classifier_runs_attempted = 4
    o.rounds_since_verify = 2
    t.record_not_achieved_streak()
    t.claim_strategist_fire(lambda _s, _l: True)
    t.record_strategy_recommendation("p", "r")
    t.record_classifier_stall("fp")
    t.pause(GoalPauseReason.NO_PROGRESS)
    assert t.resume()
    assert (o.classifier_runs_attempted, o.rounds_since_verify) == (0, 0)
    assert (o.consecutive_not_achieved, o.last_strategist_fired_at, o.strategist_cap_bonus) == (0, 0, 0)
    assert o.last_strategy_path is None and o.last_strategy_recommendation is None
    assert o.classifier_stall_count == 0 and o.last_gap_fingerprint is None
    assert o.phase is GoalPhase.PLANNING


def test_complete_resets_strategist_but_not_classifier_stall(tmp_path):
    t = make_tracker(tmp_path)
    activate(t)
    t.record_classifier_stall("fp")
    t.record_not_achieved_streak()
    t.pause_with_message(GoalPauseReason.INFRA, "Turn failed")
    assert t.complete()
    o = t.snapshot()
    assert o.pause_message is None
    assert o.consecutive_not_achieved == 0
    assert (o.classifier_stall_count, o.last_gap_fingerprint) == (1, "fp")


def test_clear_drops_the_goal_without_touching_the_goal_dir(tmp_path):
    t = make_tracker(tmp_path)
    activate(t)
    t.clear()
    assert t.snapshot() is None and t.active_since is None and t.status() is None
    assert (tmp_path / "session" / "goal").is_dir()
    assert not t.pause(GoalPauseReason.USER) and not t.resume() and not t.complete() and not t.budget_limit()
    assert not t.record_classifier_stall("fp")
    assert t.record_not_achieved_streak() == 0
    assert t.claim_strategist_fire(lambda _s, _l: True) is None
    t.set_phase(GoalPhase.PLANNING)  # no-ops without a goal
    t.append_history(GoalHistoryEntry("t", GoalEvent.WORKER_STARTED))
    assert t.snapshot() is None


def test_rollback_classifier_attempt_floors_at_zero(tmp_path):
    t = make_tracker(tmp_path)
    activate(t)
    t.snapshot().classifier_runs_attempted = 1
    t.rollback_classifier_attempt()
    t.rollback_classifier_attempt()
    assert t.snapshot().classifier_runs_attempted == 0


def test_elapsed_is_accounted_on_pause_and_complete(tmp_path):
    clock = FakeClock()
    t = make_tracker(tmp_path, clock)
    activate(t)
    clock.advance_ms(1500)
    t.pause(GoalPauseReason.USER)
    clock.advance_ms(10_000)  # paused time does not count
    t.resume()
    clock.advance_ms(250)
    t.complete()
    assert t.snapshot().elapsed_ms == 1750
    assert t.active_since is None


def test_repeated_account_elapsed_does_not_double_count(tmp_path):
    clock = FakeClock()
    t = make_tracker(tmp_path, clock)
    activate(t)
    clock.advance_ms(1000)
    t.account_elapsed()
    t.account_elapsed()
    assert t.snapshot().elapsed_ms == 1000  # the reference would say 2000
    clock.now += 1_500_000  # 1.5 ms: the half millisecond is carried, not lost
    t.account_elapsed()
    clock.now += 500_000
    t.account_elapsed()
    assert t.snapshot().elapsed_ms == 1002
    clock.advance_ms(7)
    t.pause(GoalPauseReason.USER)
    assert t.snapshot().elapsed_ms == 1009


def test_history_entry_wire_format_omits_empty_optionals():
    entry = GoalHistoryEntry("2026-01-01T00:00:00Z", GoalEvent.GOAL_PAUSED, "user")
    assert (
        orjson.dumps(entry.to_dict()) == b'{"timestamp":"2026-01-01T00:00:00Z","event":"goal_paused","detail":"user"}'
    )
    full = GoalHistoryEntry("t", GoalEvent.WORKER_FAILED, "d", 3, -5, ["a", "b"])
    assert list(full.to_dict()) == ["timestamp", "event", "detail", "round", "tokens_used", "unmet"]
    assert GoalHistoryEntry.from_dict(full.to_dict()) == full


def test_orchestration_wire_format_key_order_and_omissions(tmp_path):
    t = make_tracker(tmp_path)
    activate(t)
    data = t.snapshot().to_dict()
    assert list(data) == [
        "goal_id",
        "objective",
        "status",
        "phase",
        "token_budget",
        "elapsed_ms",
        "created_at",
        "current_subagent_id",
        "current_subagent_role",
        "total_worker_rounds",
        "total_verify_rounds",
        "token_baseline",
        "tokens_used_high_water",
        "parent_tokens_spent",
        "last_session_tokens_seen",
        "history",
        "classifier_stall_count",
        "classifier_runs_attempted",
        "rounds_since_verify",
        "consecutive_not_achieved",
        "last_strategist_fired_at",
        "strategist_cap_bonus",
        "verifier_id",
    ]
    assert data["status"] == "active" and data["phase"] == "executing"
    t.pause_with_message(GoalPauseReason.INFRA, "Turn failed")
    t.record_classifier_stall("fp")
    t.record_strategy_recommendation("p", "r")
    data = t.snapshot().to_dict()
    assert data["pause_message"] == "Turn failed"
    assert list(data).index("pause_message") == list(data).index("history") + 1
    assert data["last_gap_fingerprint"] == "fp" and data["last_strategy_path"] == "p"
    for runtime in ("live_turn_count", "planning_in_flight", "budget_limit_reported", "live_tokens_by_model"):
        assert runtime not in data


def test_orchestration_from_dict_defaults_and_required_keys():
    minimal = {
        "goal_id": "g",
        "objective": "o",
        "status": "paused",
        "phase": "idle",
        "elapsed_ms": 5,
        "created_at": "t",
        "history": [],
    }
    o = GoalOrchestration.from_dict(minimal)
    assert o.status is GoalStatus.USER_PAUSED
    assert o.token_budget is None and o.last_session_tokens_seen is None and o.total_worker_rounds == 0
    assert o.pause_message is None and o.last_gap_fingerprint is None
    for key in ("goal_id", "objective", "status", "phase", "elapsed_ms", "created_at", "history"):
        broken = dict(minimal)
        del broken[key]
        with pytest.raises(InvalidProgress, match=key):
            GoalOrchestration.from_dict(broken)
    with pytest.raises(InvalidProgress):
        GoalOrchestration.from_dict({**minimal, "phase": "Idle"})
    with pytest.raises(InvalidProgress):
        GoalOrchestration.from_dict({**minimal, "status": 3})
    with pytest.raises(InvalidProgress):
        GoalOrchestration.from_dict({**minimal, "elapsed_ms": -1})
    with pytest.raises(InvalidProgress):
        GoalOrchestration.from_dict({**minimal, "total_worker_rounds": 2**32})


def test_runtime_fields_are_reset_on_restore(tmp_path):
    t = make_tracker(tmp_path)
    activate(t)
    o = t.snapshot()
    o.live_turn_count, o.planning_in_flight, o.budget_limit_reported = 9, True, True
    restored = GoalOrchestration.from_dict(o.to_dict())
    assert (restored.live_turn_count, restored.planning_in_flight, restored.budget_limit_reported) == (0, False, False)


# --------------------------------------------------------------------------------------------
# verifier_id


def test_verifier_id_is_12_hex_and_stable_across_pause_resume_complete(tmp_path):
    t = make_tracker(tmp_path)
    activate(t)
    vid = t.verifier_id()
    assert len(vid) == 12 and all(c in "0123456789abcdef" for c in vid)
    t.pause(GoalPauseReason.USER)
    assert t.verifier_id() == vid
    t.resume()
    assert t.verifier_id() == vid
    t.complete()
    assert t.verifier_id() == vid
    assert GoalOrchestration.from_dict(t.snapshot().to_dict()).verifier_id == vid


def test_verifier_ids_are_fresh_per_goal(tmp_path):
    ids = set()
    for _ in range(50):
        t = make_tracker(tmp_path)
        activate(t)
        ids.add(t.verifier_id())
    assert len(ids) == 50


def test_missing_verifier_id_is_backfilled(tmp_path):
    t = make_tracker(tmp_path)
    activate(t)
    data = t.snapshot().to_dict()
    del data["verifier_id"]
    a = GoalOrchestration.from_dict(data)
    b = GoalOrchestration.from_dict(data)
    assert len(a.verifier_id) == 12 and int(a.verifier_id, 16) >= 0
    assert a.verifier_id != b.verifier_id


@pytest.mark.parametrize("bad", ["ABCDEF123456", "abc", "0123456789abc", "../../etc/x", 12])
def test_invalid_verifier_id_is_refused_on_restore(tmp_path, bad):
    t = make_tracker(tmp_path)
    activate(t)
    data = t.snapshot().to_dict()
    data["verifier_id"] = bad
    with pytest.raises(InvalidProgress):
        GoalOrchestration.from_dict(data)
    snap = t.snapshot()
    snap.verifier_id = bad
    with pytest.raises(InvalidProgress):
        GoalTracker.from_snapshot(tmp_path, snap)


# --------------------------------------------------------------------------------------------
# from_snapshot


@pytest.mark.parametrize("phase", [GoalPhase.PLANNING, GoalPhase.EXECUTING])
def test_restore_parks_a_goal_caught_mid_phase(tmp_path, phase):
    t = make_tracker(tmp_path)
    activate(t)
    t.set_phase(phase)
    t.set_current_subagent("sub", "worker")
    t.snapshot().verifying_in_flight = True
    snap = GoalOrchestration.from_dict(t.snapshot().to_dict())
    snap.planning_in_flight = True
    restored = GoalTracker.from_snapshot(tmp_path, snap)
    o = restored.snapshot()
    assert (o.phase, o.status) == (GoalPhase.IDLE, GoalStatus.USER_PAUSED)
    assert o.current_subagent_id is None and o.current_subagent_role is None
    assert not o.planning_in_flight and not o.verifying_in_flight
    assert restored.active_since is None
    assert snap.phase is phase  # the caller's snapshot is not modified
    assert restored.resume() and restored.is_active()


def test_restore_keeps_non_active_statuses_and_idle_active_goals(tmp_path):
    t = make_tracker(tmp_path)
    activate(t)
    t.pause(GoalPauseReason.VERIFICATION)
    restored = GoalTracker.from_snapshot(tmp_path, t.snapshot())
    assert restored.status() is GoalStatus.BLOCKED and restored.phase() is GoalPhase.IDLE
    assert restored.active_since is None

    t2 = make_tracker(tmp_path)
    activate(t2)
    t2.set_phase(GoalPhase.IDLE)
    t2.set_current_subagent("sub", "worker")
    restored = GoalTracker.from_snapshot(tmp_path, t2.snapshot())
    assert restored.status() is GoalStatus.ACTIVE
    assert restored.current_subagent_id() == "sub"
    assert restored.active_since is not None
    assert restored.verifier_id() == t2.verifier_id()
    assert restored.snapshot().history == t2.snapshot().history
