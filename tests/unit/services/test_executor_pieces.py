"""The executor's pure pieces: commands as steps, expiry, lease waiting, compensation
planning and ordering, and the facts it reports (checked against the Avro contracts)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import fastavro
import pytest

from flotilla.contracts import load_contracts
from flotilla.envelope import Envelope
from flotilla.escalations import escalation
from flotilla.handling import BusinessRuleViolation
from flotilla.records import CommandFailed
from flotilla.typedrecord import Record
from flotilla.validation import RecordValidator
from services.executor import commands, compensation, leases, outcomes
from services.executor.commands import Step
from services.executor.compensation import Completed
from services.executor.execution import Applied, Failed, Outcome, Replayed

NOW = datetime(2026, 5, 4, 12, 0, tzinfo=UTC)
VALIDATORS = {c.full_name: RecordValidator(fastavro.parse_schema(c.schema, named_schemas={})) for c in load_contracts()}


def record(kind: str = commands.SCALE, **overrides: Any) -> dict[str, Any]:
    params: dict[str, dict[str, Any]] = {
        commands.SCALE: {"replicas": 12},
        commands.RESTART: {"rolling": True},
        commands.ROLLBACK: {"toRevision": "v40"},
        commands.FAILOVER: {"dependency": "payments-api", "toTarget": "payments-api-secondary"},
    }
    return {
        "commandId": uuid.uuid4(),
        "idempotencyKey": "incident-204:scale:12",
        "incidentId": "incident-204",
        "proposalId": uuid.uuid4(),
        "target": {"kind": "service", "environment": "production", "name": "checkout-api"},
        **params[kind],
        "issuedAt": NOW,
        "expiresAt": NOW + timedelta(minutes=15),
        **overrides,
    }


def step(kind: str = commands.SCALE, key: str = "incident-204:scale:12", **overrides: Any) -> Step:
    return commands.from_record(kind, record(kind, idempotencyKey=key, **overrides))


# ------------------------------------------------------------------- commands


@pytest.mark.parametrize(
    ("kind", "action", "params"),
    [
        (commands.SCALE, "scale", {"replicas": 12}),
        (commands.RESTART, "restart", {"rolling": True}),
        (
            commands.ROLLBACK,
            "rollback",  # the fields a record written before them lacks come with their defaults
            {
                "toRevision": "v40",
                "fromRevision": None,
                "fromTemplateHash": None,
                "toTemplateHash": None,
                "fromImages": [],
                "toImages": [],
            },
        ),
        (commands.FAILOVER, "failover", {"dependency": "payments-api", "toTarget": "payments-api-secondary"}),
    ],
)
def test_each_command_becomes_one_target_action(kind: str, action: str, params: dict[str, Any]) -> None:
    value = record(kind)
    s = commands.from_record(kind, value)
    assert (s.action, dict(s.params)) == (action, params)
    assert s.resource == "production/checkout-api"  # the commands-topic key and the lease scope
    assert s.command_id == str(value["commandId"]) and s.proposal_id == str(value["proposalId"])
    assert s.compensates is None


def test_a_command_expires_at_its_deadline_not_before() -> None:
    s = step()
    assert not s.expired(NOW + timedelta(minutes=15) - timedelta(milliseconds=1))
    assert s.expired(NOW + timedelta(minutes=15))


@pytest.mark.parametrize(
    ("kind", "overrides", "says"),
    [
        ("dev.flotilla.incidents.RecoveryExecuted", {}, "not a command"),
        (commands.SCALE, {"idempotencyKey": "  "}, "without an idempotency key"),
        (commands.SCALE, {"idempotencyKey": "incident-1:scale:3:compensate"}, "reserved"),
        (commands.SCALE, {"target": {"kind": "service", "environment": "", "name": "x"}}, "environment and name"),
    ],
)
def test_commands_that_cannot_run_are_business_rule_violations(kind: str, overrides: dict[str, Any], says: str) -> None:
    with pytest.raises(BusinessRuleViolation, match=says):
        commands.from_record(kind, record(commands.SCALE, **overrides))


def test_a_step_carries_the_approved_change_and_its_compensation_none() -> None:
    """The verified authorization's expectedChange rides on the step to the target; an
    undo was never shown to anyone, so it carries none (it is checked by its own reads)."""
    approved = commands.from_record(commands.SCALE, record(commands.SCALE), "sha256:ab")
    assert approved.expected_change == "sha256:ab" and step().expected_change is None
    assert commands.compensation(approved, "scale", {"replicas": 4}).expected_change is None


def test_a_compensation_has_its_own_key_and_a_stable_command_id() -> None:
    s = step()
    undo = commands.compensation(s, "scale", {"replicas": 4})
    again = commands.compensation(s, "scale", {"replicas": 4})
    assert undo.idempotency_key == "incident-204:scale:12:compensate"
    assert undo.command_id == again.command_id != s.command_id  # a retried compensation is the same one
    assert uuid.UUID(undo.command_id)
    assert undo.compensates == s.command_id
    assert undo.expires_at is None and not undo.expired(NOW + timedelta(days=365))  # undo never expires
    assert (undo.resource, undo.proposal_id, undo.incident_id) == (s.resource, s.proposal_id, s.incident_id)


# --------------------------------------------------------------------- leases


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.t += seconds


def test_waiting_for_a_lease_returns_as_soon_as_it_is_free() -> None:
    clock = FakeClock()
    answers = iter([None, None, "lease"])
    got = leases.wait_for(lambda: next(answers), wait_seconds=5, poll_seconds=0.25, clock=clock, sleep=clock.sleep)
    assert got == "lease"
    assert clock.sleeps == [0.25, 0.25]


def test_waiting_for_a_lease_is_bounded() -> None:
    clock = FakeClock()
    calls = []

    def never() -> None:
        calls.append(clock.t)

    assert leases.wait_for(never, wait_seconds=1.0, poll_seconds=0.3, clock=clock, sleep=clock.sleep) is None
    assert clock.t == pytest.approx(1.0)  # the last sleep is cut to the deadline
    assert len(calls) == 5  # at 0, 0.3, 0.6, 0.9 and 1.0


def test_no_wait_means_one_attempt() -> None:
    clock = FakeClock()
    assert leases.wait_for(lambda: None, wait_seconds=0, clock=clock, sleep=clock.sleep) is None
    assert clock.sleeps == []


# --------------------------------------------------------------- compensation


def done(s: Step, before: dict[str, Any], after: dict[str, Any] | None = None) -> Completed:
    return Completed(s, before, after or {})


SCALED = done(step(commands.SCALE, "i:scale:12"), {"replicas": 4, "p95Ms": 1800.0}, {"replicas": 12})
FAILED_OVER = done(
    step(commands.FAILOVER, "i:failover"), {"dependency": "payments-api", "activeTarget": "payments-api"}
)
ROLLED_BACK = done(
    step(commands.ROLLBACK, "i:rollback:v40"), {"revision": "v41", "previousRevision": "v40"}, {"revision": "v40"}
)
RESTARTED = done(step(commands.RESTART, "i:restart"), {"replicas": 12, "restarts": 0})


def test_each_step_is_undone_by_driving_back_to_its_before_state() -> None:
    assert {
        u.completed.step.action: (u.compensation.action, dict(u.compensation.params)) if u.compensation else None
        for u in compensation.plan([SCALED, FAILED_OVER, ROLLED_BACK, RESTARTED])
    } == {
        "scale": ("scale", {"replicas": 4}),
        "failover": ("failover", {"dependency": "payments-api", "toTarget": "payments-api"}),
        "rollback": (  # rolled forward to what ran before, from what the rollback left running
            "rollback",
            {
                "toRevision": "v41",
                "fromRevision": "v40",
                "fromTemplateHash": None,
                "toTemplateHash": None,
                "fromImages": [],
                "toImages": [],
            },
        ),
        "restart": None,  # nothing to undo
    }


def test_compensation_runs_in_reverse_order_of_completion() -> None:
    undos = compensation.plan([SCALED, FAILED_OVER, ROLLED_BACK, RESTARTED])
    assert [u.completed.step.idempotency_key for u in undos] == [
        "i:restart",
        "i:rollback:v40",
        "i:failover",
        "i:scale:12",
    ]
    assert undos[0].note == "restart of checkout-api has nothing to undo"
    assert all(u.compensation is None or u.compensation.compensates == u.completed.step.command_id for u in undos)


def _runner(fail: set[str] | None = None) -> tuple[list[str], Any]:
    ran: list[str] = []

    def run(s: Step) -> Outcome:
        ran.append(s.idempotency_key)
        if s.idempotency_key in (fail or set()):
            return Failed(s, "TargetRejected", "no", retryable=False, epoch=3)
        return Applied(s, epoch=3, before={}, after={}, duration_ms=5)

    return ran, run


def test_running_a_plan_undoes_everything_and_says_what() -> None:
    ran, run = _runner()
    report = compensation.run_plan(compensation.plan([SCALED, FAILED_OVER, RESTARTED]), run)
    assert ran == ["i:failover:compensate", "i:scale:12:compensate"]
    assert report.complete and report.remaining == []
    assert report.compensated_command_ids == [FAILED_OVER.step.command_id, SCALED.step.command_id]
    assert report.summary() == (
        "Undid 2 step(s) in reverse order: restart of checkout-api has nothing to undo; "
        "fail checkout-api's payments-api back to payments-api; scale checkout-api back to 4."
    )


def test_a_failed_undo_stops_the_compensation_and_leaves_the_earlier_steps() -> None:
    ran, run = _runner(fail={"i:rollback:v40:compensate"})
    report = compensation.run_plan(compensation.plan([SCALED, ROLLED_BACK, FAILED_OVER]), run)
    assert ran == ["i:failover:compensate", "i:rollback:v40:compensate"]  # the scale was not undone
    assert not report.complete
    assert report.stopped_at == ROLLED_BACK and report.failure is not None
    assert report.remaining == [ROLLED_BACK, SCALED]
    assert report.compensated_command_ids == [FAILED_OVER.step.command_id]
    assert "Left as they are: i:rollback:v40, i:scale:12" in report.summary()


def test_a_step_whose_before_state_is_unusable_stops_the_compensation() -> None:
    blind = done(step(commands.SCALE, "i:scale:20"), {"p95Ms": 900.0})
    ran, run = _runner()
    report = compensation.run_plan(compensation.plan([SCALED, blind]), run)
    assert ran == []
    assert report.stopped_at == blind and report.failure is None
    assert report.reason is not None and "has no replicas" in report.reason


def test_a_replayed_undo_counts_as_undone() -> None:
    def run(s: Step) -> Outcome:
        return Replayed(s, execution=None)  # type: ignore[arg-type]

    report = compensation.run_plan(compensation.plan([SCALED]), run)
    assert report.complete and report.compensated_command_ids == [SCALED.step.command_id]


# -------------------------------------------------------------------- outcomes


def valid(record: Record) -> None:
    problems = VALIDATORS[record.TYPE].problems({"eventId": str(uuid.uuid4()), **record.to_value()})
    assert problems == []


def test_recovery_executed_says_what_was_done_and_fits_its_contract() -> None:
    applied = Applied(
        step(),
        epoch=7,
        before={"replicas": 4, "p95Ms": 1800.0},
        after={"replicas": 12, "p95Ms": 410.0},
        duration_ms=203,
    )
    executed = outcomes.recovery_executed(applied, NOW)
    valid(executed)
    assert executed.outcome == "checkout-api scaled from 4 to 12 replicas (p95 1800.0 ms → 410.0 ms)"
    assert (executed.fencing_epoch, executed.action_duration_ms, executed.compensates) == (7, 203, None)


def test_a_compensation_is_reported_as_such() -> None:
    original = step()
    undo = commands.compensation(original, "scale", {"replicas": 4})
    executed = outcomes.recovery_executed(
        Applied(undo, 9, {"replicas": 12}, {"replicas": 4}, 180, reconciled=True), NOW
    )
    valid(executed)
    assert executed.compensates == original.command_id
    assert executed.command_type == commands.SCALE
    assert executed.outcome.startswith("Compensation of incident-204:scale:12: checkout-api scaled from 12 to 4")
    assert executed.outcome.endswith("found applied at the target and recorded late")


@pytest.mark.parametrize("epoch", [None, 4])
def test_command_failed_fits_its_contract(epoch: int | None) -> None:
    failed = Failed(step(), "StaleFencingToken", "token 4 < 5", retryable=False, epoch=epoch, attempt=2)
    record = outcomes.command_failed(failed, NOW)
    valid(record)
    assert (record.error_class, record.retryable, record.attempt, record.fencing_epoch) == (
        "StaleFencingToken",
        False,
        2,
        epoch,
    )


def test_compensation_completed_and_escalation_fit_their_contracts() -> None:
    ids = [str(uuid.uuid4()), str(uuid.uuid4())]
    cause = Envelope(type=CommandFailed.TYPE, source="/flotilla/executor", correlationid="incident-204")
    completed = outcomes.compensation_completed("incident-204", str(uuid.uuid4()), ids, cause.id, "undid", NOW)
    valid(completed)
    assert list(completed.compensated_command_ids) == ids
    escalated = escalation("incident-204", "undo failed", cause=cause, at=NOW)
    valid(escalated)
    assert (escalated.cause_event_id, escalated.cause_type, escalated.escalated_to) == (cause.id, cause.type, "on-call")


def test_timestamps_are_cut_to_milliseconds() -> None:
    record = outcomes.command_failed(Failed(step(), "X", "y", False), NOW.replace(microsecond=123456))
    assert record.to_value()["failedAt"].microsecond == 123000


@pytest.mark.parametrize(
    ("kind", "before", "after", "says"),
    [
        (commands.ROLLBACK, {"revision": "v41"}, {"revision": "v40"}, "checkout-api moved from v41 to v40"),
        (
            commands.FAILOVER,
            {"activeTarget": "payments-api"},
            {"activeTarget": "payments-api-secondary"},
            "checkout-api's dependency payments-api switched from payments-api to payments-api-secondary",
        ),
        (commands.RESTART, {}, {}, "checkout-api restarted (rolling)"),
    ],
)
def test_outcome_sentences(kind: str, before: dict[str, Any], after: dict[str, Any], says: str) -> None:
    assert outcomes.describe(step(kind), before, after) == says
