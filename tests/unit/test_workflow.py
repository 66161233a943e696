"""The incident workflow: edges, stale transitions, budgets, and graph properties."""

from __future__ import annotations

from collections import deque
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flotilla.workflow import (
    OPEN,
    TERMINAL,
    TRANSITIONS,
    BudgetKind,
    BudgetOverrun,
    Budgets,
    IncidentState,
    StaleTransition,
    Status,
    accepts,
    is_workflow_record,
    overrun,
    transition,
)

FACT = "dev.flotilla.incidents."
DECISION = "dev.flotilla.decisions."

LATENCY = FACT + "ServiceLatencyIncreased"
DIAGNOSIS_REQUESTED = FACT + "DiagnosisRequested"
JOB_STARTED = FACT + "DiagnosticJobStarted"
SUSPECTED = DECISION + "DependencyFailureSuspected"
CONCLUDED = DECISION + "DiagnosisConcluded"
PROPOSED = DECISION + "RecoveryProposed"
APPROVAL_REQUIRED = FACT + "HumanApprovalRequired"
APPROVED = FACT + "RecoveryApproved"
REJECTED = FACT + "RecoveryRejected"
EXPIRED = FACT + "ApprovalExpired"
DENIED = FACT + "CommandDenied"
EXECUTED = FACT + "RecoveryExecuted"
COMMAND_FAILED = FACT + "CommandFailed"
COMPLETED = FACT + "RecoveryCompleted"
RECOVERY_FAILED = FACT + "RecoveryFailed"
COMPENSATED = FACT + "CompensationCompleted"
ESCALATED = FACT + "IncidentEscalated"
BUDGET_EXCEEDED = FACT + "BudgetExceeded"
LOOP_TERMINATED = FACT + "LoopTerminated"

T0 = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)

HAPPY_PATH = [
    LATENCY,
    DIAGNOSIS_REQUESTED,
    SUSPECTED,
    PROPOSED,
    APPROVAL_REQUIRED,
    APPROVED,
    EXECUTED,
    COMPLETED,
]
THROUGH_DIAGNOSIS = [LATENCY, DIAGNOSIS_REQUESTED, SUSPECTED]


def _apply(types: list[str], state: IncidentState | None = None, start: datetime = T0) -> IncidentState:
    state = state or IncidentState(incident_id="incident-204")
    for i, record_type in enumerate(types):
        state = transition(state, record_type, event_id=f"evt-{i}", at=start + timedelta(minutes=i))
    return state


def _state(status: Status, **fields: object) -> IncidentState:
    return IncidentState(incident_id="incident-204", status=status, **fields)  # type: ignore[arg-type]


# ------------------------------------------------------------------- the chain


def test_happy_path_resolves_after_eight_records() -> None:
    final = _apply(HAPPY_PATH)
    assert final.status is Status.RESOLVED
    assert final.version == 8
    assert final.steps == 8
    assert final.last_event_id == "evt-7"
    assert final.incident_id == "incident-204"


def test_happy_path_visits_each_state_in_order() -> None:
    state = IncidentState(incident_id="incident-204")
    seen = []
    for i, record_type in enumerate(HAPPY_PATH):
        state = transition(state, record_type, event_id=f"evt-{i}", at=T0)
        seen.append(state.status)
    assert seen == [
        Status.DETECTED,
        Status.DIAGNOSING,
        Status.DIAGNOSED,
        Status.PROPOSED,
        Status.AWAITING_APPROVAL,
        Status.AUTHORIZED,
        Status.EXECUTED,
        Status.RESOLVED,
    ]


def test_auto_authorized_path_skips_human_approval() -> None:
    final = _apply([*THROUGH_DIAGNOSIS, PROPOSED, APPROVED, EXECUTED, COMPLETED])
    assert final.status is Status.RESOLVED
    assert final.version == 7


def test_diagnosis_concluded_is_an_alternative_diagnosis() -> None:
    state = _apply([LATENCY, DIAGNOSIS_REQUESTED, JOB_STARTED, CONCLUDED])
    assert state.status is Status.DIAGNOSED
    assert state.version == 4


def test_self_edges_keep_the_state_but_count() -> None:
    diagnosing = _apply([LATENCY, DIAGNOSIS_REQUESTED])
    after = transition(diagnosing, JOB_STARTED, event_id="job", at=T0)
    assert after.status is Status.DIAGNOSING
    assert after.version == diagnosing.version + 1
    assert after.steps == diagnosing.steps + 1
    assert after.last_event_id == "job"


def test_multi_step_plan_executes_step_after_step() -> None:
    final = _apply([*THROUGH_DIAGNOSIS, PROPOSED, APPROVED, EXECUTED, EXECUTED, EXECUTED, COMPLETED])
    assert final.status is Status.RESOLVED
    assert final.version == 9


@pytest.mark.parametrize("waiting", [[], [APPROVAL_REQUIRED]])
@pytest.mark.parametrize(("result", "then"), [(EXECUTED, Status.EXECUTED), (COMMAND_FAILED, Status.FAILED)])
def test_an_execution_ahead_of_its_approval_is_taken_and_the_late_approval_is_stale(
    waiting: list[str], result: str, then: Status
) -> None:
    """The approval and its command leave the policy in one PostgreSQL transaction but may
    reach Kafka in two Connect transactions, and the executor's result can land in between
    (seen in the chaos soak): the result is taken, the approval that follows is stale."""
    state = _apply([*THROUGH_DIAGNOSIS, PROPOSED, *waiting, result])
    assert state.status is then
    assert not accepts(state, APPROVED)
    if result == EXECUTED:
        assert _apply([*THROUGH_DIAGNOSIS, PROPOSED, *waiting, EXECUTED, COMPLETED]).status is Status.RESOLVED


def test_a_newer_proposal_supersedes_one_awaiting_approval() -> None:
    waiting = _apply([*THROUGH_DIAGNOSIS, PROPOSED, APPROVAL_REQUIRED])
    assert waiting.status is Status.AWAITING_APPROVAL
    assert transition(waiting, PROPOSED, event_id="p2", at=T0).status is Status.PROPOSED


@pytest.mark.parametrize(
    ("tail", "expected"),
    [
        ([PROPOSED, APPROVAL_REQUIRED, REJECTED], Status.REJECTED),
        ([PROPOSED, APPROVAL_REQUIRED, EXPIRED], Status.EXPIRED),
        ([PROPOSED, DENIED], Status.DENIED),
        ([PROPOSED, APPROVED, COMMAND_FAILED], Status.FAILED),
        ([PROPOSED, APPROVED, COMMAND_FAILED, COMPENSATED], Status.COMPENSATED),
        ([PROPOSED, APPROVED, EXECUTED, COMMAND_FAILED, COMPENSATED], Status.COMPENSATED),
        ([PROPOSED, APPROVED, EXECUTED, RECOVERY_FAILED], Status.FAILED),
        ([PROPOSED, APPROVED, EXECUTED, RECOVERY_FAILED, COMPENSATED], Status.COMPENSATED),
    ],
    ids=[
        "rejected",
        "expired",
        "denied",
        "command-failed",
        "command-failed-compensated",
        "later-step-failed-compensated",
        "recovery-failed",
        "recovery-failed-compensated",
    ],
)
def test_unhappy_branches(tail: list[str], expected: Status) -> None:
    final = _apply([*THROUGH_DIAGNOSIS, *tail])
    assert final.status is expected
    assert final.version == len(THROUGH_DIAGNOSIS) + len(tail)


@pytest.mark.parametrize("status", sorted(OPEN), ids=str)
def test_escalation_is_accepted_from_every_open_state(status: Status) -> None:
    state = _state(status, version=3, steps=3)
    assert accepts(state, ESCALATED)
    after = transition(state, ESCALATED, event_id="esc", at=T0)
    assert after.status is Status.ESCALATED
    assert after.version == 4


@pytest.mark.parametrize("status", [Status.RESOLVED, Status.ESCALATED, Status.NEW], ids=str)
def test_escalation_is_refused_when_terminal_or_new(status: Status) -> None:
    state = _state(status)
    assert not accepts(state, ESCALATED)
    with pytest.raises(StaleTransition):
        transition(state, ESCALATED, event_id="esc", at=T0)


def test_open_is_every_state_but_new_and_terminal() -> None:
    assert frozenset({Status.RESOLVED, Status.ESCALATED}) == TERMINAL
    assert Status.NEW not in OPEN
    assert OPEN | TERMINAL | {Status.NEW} == set(Status)


def test_budget_exceeded_and_loop_terminated_leave_the_state_alone() -> None:
    executed = _apply([*THROUGH_DIAGNOSIS, PROPOSED, APPROVED, EXECUTED])
    after = transition(executed, BUDGET_EXCEEDED, event_id="b", at=T0)
    assert after.status is Status.EXECUTED
    assert after.version == executed.version + 1
    resolved = _apply(HAPPY_PATH)
    assert not accepts(resolved, BUDGET_EXCEEDED)
    assert transition(resolved, LOOP_TERMINATED, event_id="l", at=T0).status is Status.RESOLVED
    assert not accepts(IncidentState(incident_id="x"), LOOP_TERMINATED)


# ------------------------------------------------------------------- stale


@pytest.mark.parametrize(
    ("done", "late"),
    [
        ([], DIAGNOSIS_REQUESTED),
        ([LATENCY], LATENCY),
        ([LATENCY], COMPLETED),
        ([LATENCY, DIAGNOSIS_REQUESTED], PROPOSED),
        (THROUGH_DIAGNOSIS, APPROVAL_REQUIRED),
        ([*THROUGH_DIAGNOSIS, PROPOSED], REJECTED),
        ([*THROUGH_DIAGNOSIS, PROPOSED, APPROVED], DENIED),
        (HAPPY_PATH, APPROVED),
    ],
)
def test_out_of_order_records_are_stale(done: list[str], late: str) -> None:
    state = _apply(done)
    assert not accepts(state, late)
    with pytest.raises(StaleTransition) as caught:
        transition(state, late, event_id="late", at=T0)
    err = caught.value
    assert err.state == state
    assert err.record_type == late
    message = str(err)
    short = late.rsplit(".", 1)[-1]
    assert message.startswith(short)
    assert "incident-204" in message
    assert state.status.value in message
    assert f"version {state.version}" in message


def test_stale_message_names_record_incident_state_and_version() -> None:
    state = _state(Status.DIAGNOSED, version=3)
    with pytest.raises(StaleTransition) as caught:
        transition(state, COMPLETED, event_id="late", at=T0)
    assert str(caught.value) == (
        "RecoveryCompleted is not accepted by incident incident-204 in state DIAGNOSED (version 3)"
    )


def test_a_stale_transition_does_not_change_the_state() -> None:
    state = _apply([LATENCY])
    with pytest.raises(StaleTransition):
        transition(state, COMPLETED, event_id="late", at=T0)
    assert state.status is Status.DETECTED
    assert state.version == 1


def test_unknown_record_types_are_not_workflow_records() -> None:
    assert is_workflow_record(LATENCY)
    assert not is_workflow_record("dev.flotilla.commands.ScaleService")
    assert not is_workflow_record("ServiceLatencyIncreased")  # short name is not enough
    with pytest.raises(StaleTransition):
        transition(IncidentState(incident_id="i"), "dev.flotilla.incidents.Unheard", event_id="e", at=T0)


# ------------------------------------------------------------------- opened_at


def test_opened_at_is_set_by_the_first_transition_and_then_kept() -> None:
    fresh = IncidentState(incident_id="incident-204")
    assert fresh.opened_at is None
    first = transition(fresh, LATENCY, event_id="a", at=T0)
    assert first.opened_at == T0
    later = transition(first, DIAGNOSIS_REQUESTED, event_id="b", at=T0 + timedelta(hours=1))
    assert later.opened_at == T0
    assert _apply(HAPPY_PATH, start=T0).opened_at == T0


def test_opened_at_of_a_loaded_state_is_not_overwritten() -> None:
    opened = T0 - timedelta(days=1)
    state = _state(Status.DETECTED, version=1, opened_at=opened)
    assert transition(state, DIAGNOSIS_REQUESTED, event_id="b", at=T0).opened_at == opened


# ------------------------------------------------------------------- budgets

SMALL = Budgets(llm_tokens=1000, wall_time=timedelta(minutes=30), steps=5)


def test_default_budgets() -> None:
    assert Budgets() == Budgets(llm_tokens=50_000, wall_time=timedelta(hours=4), steps=40)


def test_no_overrun_for_a_fresh_incident() -> None:
    assert overrun(IncidentState(incident_id="i"), SMALL, T0) is None


def test_token_budget_boundary() -> None:
    assert overrun(_state(Status.DIAGNOSING, tokens_used=1000), SMALL, T0) is None
    assert overrun(_state(Status.DIAGNOSING, tokens_used=1001), SMALL, T0) == BudgetOverrun(
        BudgetKind.LLM_TOKENS, 1000, 1001
    )


def test_step_budget_boundary() -> None:
    assert overrun(_state(Status.EXECUTED, steps=5), SMALL, T0) is None
    assert overrun(_state(Status.EXECUTED, steps=6), SMALL, T0) == BudgetOverrun(BudgetKind.STEPS, 5, 6)


def test_wall_time_budget_boundary() -> None:
    state = _state(Status.PROPOSED, opened_at=T0)
    assert overrun(state, SMALL, T0 + timedelta(minutes=30)) is None
    late = overrun(state, SMALL, T0 + timedelta(minutes=30, seconds=1))
    assert late == BudgetOverrun(BudgetKind.WALL_TIME, 1800, 1801)
    just_over = overrun(state, SMALL, T0 + timedelta(minutes=30, microseconds=1))
    assert just_over is not None
    assert just_over.kind is BudgetKind.WALL_TIME


def test_wall_time_needs_an_opened_at() -> None:
    assert overrun(_state(Status.DETECTED), SMALL, T0 + timedelta(days=365)) is None


def test_tokens_are_reported_before_steps_and_wall_time() -> None:
    everything = _state(Status.EXECUTED, tokens_used=2000, steps=50, opened_at=T0 - timedelta(days=1))
    found = overrun(everything, SMALL, T0)
    assert found is not None
    assert found.kind is BudgetKind.LLM_TOKENS
    steps_and_time = _state(Status.EXECUTED, steps=50, opened_at=T0 - timedelta(days=1))
    found = overrun(steps_and_time, SMALL, T0)
    assert found is not None
    assert found.kind is BudgetKind.STEPS


def test_every_budget_kind_is_covered() -> None:
    assert {k.value for k in BudgetKind} == {"LLM_TOKENS", "WALL_TIME", "STEPS"}


# ------------------------------------------------------------------- properties

UNKNOWN_TYPES = [
    "dev.flotilla.incidents.Unheard",
    "dev.flotilla.commands.ScaleService",
    "ServiceLatencyIncreased",
    "",
]
record_types = st.sampled_from(sorted(TRANSITIONS) + UNKNOWN_TYPES)


@given(st.lists(record_types, max_size=60))
def test_any_sequence_keeps_the_state_coherent(types: list[str]) -> None:
    state = IncidentState(incident_id="incident-prop")
    accepted = 0
    reached_terminal: Status | None = None
    for i, record_type in enumerate(types):
        if not accepts(state, record_type):
            with pytest.raises(StaleTransition):
                transition(state, record_type, event_id=f"e{i}", at=T0)
            continue
        state = transition(state, record_type, event_id=f"e{i}", at=T0 + timedelta(seconds=i))
        accepted += 1
        assert isinstance(state.status, Status)
        assert state.version == accepted
        assert state.steps == accepted
        assert state.last_event_id == f"e{i}"
        if reached_terminal is not None:
            assert state.status is reached_terminal, f"left {reached_terminal} via {record_type}"
        elif state.status in TERMINAL:
            reached_terminal = state.status
    assert state.version == accepted
    assert (state.opened_at is None) == (accepted == 0)


@given(st.text(max_size=80).filter(lambda t: t not in TRANSITIONS), st.sampled_from(list(Status)))
def test_unknown_types_are_never_accepted(record_type: str, status: Status) -> None:
    assert not accepts(_state(status), record_type)
    assert not is_workflow_record(record_type)


@pytest.mark.parametrize("status", sorted(set(Status) - TERMINAL), ids=str)
def test_no_open_state_is_a_dead_end(status: Status) -> None:
    state = _state(status)
    moves = [t for t in TRANSITIONS if accepts(state, t)]
    assert moves, f"{status} accepts nothing"
    # ...and at least one of them leads somewhere else.
    assert any((TRANSITIONS[t][1] or status) != status for t in moves), f"{status} can never be left"


def _reachable_from(start: Status) -> set[Status]:
    seen = {start}
    queue = deque([start])
    while queue:
        here = queue.popleft()
        for sources, target in TRANSITIONS.values():
            nxt = target or here
            if here in sources and nxt not in seen:
                seen.add(nxt)
                queue.append(nxt)
    return seen


def test_every_state_is_reachable_from_new() -> None:
    assert _reachable_from(Status.NEW) == set(Status)


def test_terminal_states_reach_only_themselves() -> None:
    for status in TERMINAL:
        assert _reachable_from(status) == {status}


def test_transition_targets_and_sources_are_statuses() -> None:
    for record_type, (sources, target) in TRANSITIONS.items():
        assert record_type.startswith((FACT, DECISION)), record_type
        assert sources, record_type
        assert all(isinstance(s, Status) for s in sources)
        assert target is None or isinstance(target, Status)
        assert not sources & TERMINAL or target is None, f"{record_type} leaves a terminal state"
