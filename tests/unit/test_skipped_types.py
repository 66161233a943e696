"""Records a service skips unread: each service's loop reads the types it handles and every
type its copy of the workflow needs to answer what the service asks of it, and nothing it
skips can change one of those answers, in any order of records.

Two independent proofs per service: ``workflow.divergence`` (an exhaustive search over
pairs of states) finds no sequence, and random sequences replayed through the real
``accepts``/``transition`` on a full copy and on a copy fed only the needed types give the
same answers at every step (hypothesis).
"""

from __future__ import annotations

import importlib
from collections.abc import Collection, Iterator
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flotilla import fleet
from flotilla import records as r
from flotilla.consumer import LoopConfig
from flotilla.handling import HandlerContext
from flotilla.records import BY_TYPE
from flotilla.runner import ServiceSpec, loop_config
from flotilla.workflow import (
    TRANSITIONS,
    IncidentState,
    Status,
    accepting,
    accepts,
    divergence,
    needed_types,
    transition,
)
from tests.unit.test_compose_fleet import settings_class

LATENCY = r.ServiceLatencyIncreased.TYPE
DIAGNOSIS_REQUESTED = r.DiagnosisRequested.TYPE
JOB_STARTED = r.DiagnosticJobStarted.TYPE
CONCLUDED = r.DiagnosisConcluded.TYPE
ESCALATED = r.IncidentEscalated.TYPE
STAYS = {t for t, (_, target) in TRANSITIONS.items() if target is None}  # accepted, the status unchanged


# ------------------------------------------------------------------ the analysis itself


def test_a_type_that_moves_the_state_towards_a_handled_one_is_needed() -> None:
    without = set(TRANSITIONS) - {DIAGNOSIS_REQUESTED}
    path = divergence(without, [accepting(CONCLUDED)])
    # The shortest story: opened, then asked to diagnose; a copy that missed the request
    # would refuse the conclusion the full copy accepts.
    assert path == (LATENCY, DIAGNOSIS_REQUESTED)
    assert DIAGNOSIS_REQUESTED in needed_types([CONCLUDED])


def test_types_that_never_move_the_state_are_never_needed_unless_handled_or_counted() -> None:
    needs = needed_types([CONCLUDED], [accepting(ESCALATED)])
    assert STAYS.isdisjoint(needs)
    assert JOB_STARTED in needed_types([JOB_STARTED])  # handled: read, whatever the analysis says
    # Whoever enforces the budgets counts every accepted record as a step.
    assert needed_types([CONCLUDED], counts_steps=True) >= set(TRANSITIONS)


def test_what_a_service_observes_widens_what_it_needs() -> None:
    alone = needed_types([LATENCY])
    finished = frozenset({Status.RESOLVED, Status.ESCALATED, Status.COMPENSATED})
    watching = needed_types([LATENCY], [finished])
    assert alone < watching
    assert divergence(alone, [accepting(LATENCY)]) is None
    assert divergence(alone, [finished]) is not None


# ------------------------------------------------------------- each service, as deployed


def _members_with_a_loop() -> Iterator[fleet.Member]:
    for member in fleet.FLEET:
        try:
            service = importlib.import_module(f"{member.module}.service")
        except ModuleNotFoundError:
            continue
        if hasattr(service, "build_spec"):
            yield member


MEMBERS = [m for m in _members_with_a_loop()]


@pytest.fixture
def deployed(clean_env: None, monkeypatch: pytest.MonkeyPatch, signing_keys: dict[str, Any]) -> None:
    monkeypatch.setenv("FLOTILLA_PROFILE", "demo")  # the demo's credentials: only the code matters here
    monkeypatch.setenv("FLOTILLA_SIM_ACTION_TOKEN", "unit-test-token")


def _spec_and_handlers(member: fleet.Member) -> tuple[ServiceSpec, set[str]]:
    settings = settings_class(member)()
    spec = importlib.import_module(f"{member.module}.service").build_spec(settings)
    # The handler factories only wire objects together; none is called here.
    handlers = spec.handlers(SimpleNamespace(pool=None, settings=settings))
    return spec, set(handlers)


def _handle(ctx: HandlerContext) -> None:
    raise AssertionError("not called here")


def _config(spec: ServiceSpec, handled: Collection[str]) -> LoopConfig:
    return loop_config(spec, dict.fromkeys(handled, _handle), "/flotilla/unit")


def _views(spec: ServiceSpec, handled: Collection[str]) -> list[frozenset[Status]]:
    return [*spec.observes, *(accepting(t) for t in handled if t in TRANSITIONS)]


@pytest.mark.usefixtures("deployed")
@pytest.mark.parametrize("member", MEMBERS, ids=lambda m: m.name)
def test_a_service_reads_what_it_handles_and_all_its_workflow_copy_needs(member: fleet.Member) -> None:
    spec, handled = _spec_and_handlers(member)
    config = _config(spec, handled)
    assert config.needs is not None, "every service's loop declares what it reads"
    assert handled <= config.needs
    if not spec.topics:
        return
    if config.follow_workflow:
        assert divergence(config.needs, _views(spec, handled)) is None
        if config.budgets is not None:
            assert set(TRANSITIONS) <= config.needs  # every step counts
    else:
        assert config.needs == handled  # no workflow copy: what it handles is all it needs


@pytest.mark.usefixtures("deployed")
def test_the_fleet_skips_records_only_where_the_analysis_allows_and_skips_some() -> None:
    skipped = {}
    for member in MEMBERS:
        spec, handled = _spec_and_handlers(member)
        if not spec.topics:
            continue
        config = _config(spec, handled)
        assert config.needs is not None
        on_topics = {t for t, record in BY_TYPE.items() if record.TOPIC in spec.topics}
        skipped[member.name] = {t.rsplit(".", 1)[-1] for t in on_topics - config.needs}
    # The executor reads `incidents` for two types only: it no longer claims every incident record.
    assert skipped["executor"] >= {"ServiceLatencyIncreased", "RecoveryProposed", "RecoveryExecuted"}
    assert "DiagnosticJobStarted" in skipped["health-agent"]
    assert skipped["diagnostic-agent"] <= {"CommandRejected", "DeadLetterQuarantined"}  # it counts steps


# ------------------------------------------------- the same, replayed through the real code

WORKFLOW = sorted(TRANSITIONS)
AT = datetime(2026, 1, 1, tzinfo=UTC)


def _apply(state: IncidentState, record_type: str, n: int) -> IncidentState:
    if not accepts(state, record_type):
        return state  # stale: recorded, not applied
    return transition(state, record_type, event_id=f"e{n}", at=AT)


@pytest.mark.usefixtures("deployed")
@pytest.mark.parametrize("member", [m for m in MEMBERS if m.name != "executor"], ids=lambda m: m.name)
def test_random_stories_get_the_same_answers_from_the_reduced_copy(member: fleet.Member) -> None:
    spec, handled = _spec_and_handlers(member)
    needs = _config(spec, handled).needs
    assert needs is not None
    views = _views(spec, handled)

    @settings(max_examples=400, deadline=None)
    @given(sequence=st.lists(st.sampled_from(WORKFLOW), max_size=30))
    def same_answers(sequence: list[str]) -> None:
        full = kept = IncidentState(incident_id="incident-1")
        for n, record_type in enumerate(sequence):
            full = _apply(full, record_type, n)
            if record_type in needs:
                kept = _apply(kept, record_type, n)
            for view in views:
                assert (full.status in view) == (kept.status in view), (sequence[: n + 1], sorted(view))

    same_answers()
