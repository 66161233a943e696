"""The incident workflow: states, which records each state accepts, and budgets.

Workflow state is explicit and durable (a row per incident in the service's own
database), never inferred from a conversation. Every accepted record moves the incident
along a known edge and bumps its version; a record the current state does not accept
(late, duplicated under a new id, out of order) is a *stale transition*: recorded and
skipped, never applied. Budgets for LLM tokens, wall time and steps live in the same row,
so exceeding one is detected in the same transaction that would have spent it.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Collection, Iterable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

import psycopg
from psycopg.rows import dict_row

from flotilla import records as r


class Status(enum.StrEnum):
    NEW = "NEW"  # no record seen yet
    DETECTED = "DETECTED"
    DIAGNOSING = "DIAGNOSING"
    DIAGNOSED = "DIAGNOSED"
    PROPOSED = "PROPOSED"
    AWAITING_APPROVAL = "AWAITING_APPROVAL"
    AUTHORIZED = "AUTHORIZED"
    EXECUTED = "EXECUTED"
    RESOLVED = "RESOLVED"
    FAILED = "FAILED"
    COMPENSATED = "COMPENSATED"
    REJECTED = "REJECTED"
    DENIED = "DENIED"
    EXPIRED = "EXPIRED"
    ESCALATED = "ESCALATED"


S = Status
TERMINAL = frozenset({S.RESOLVED, S.ESCALATED})
OPEN = frozenset(Status) - TERMINAL - {S.NEW}

# Where an execution's result is accepted: after the approval, or before it has arrived.
EXECUTABLE = frozenset({S.PROPOSED, S.AWAITING_APPROVAL, S.AUTHORIZED, S.EXECUTED})

# record type -> (states that accept it, state it leads to; None = stays where it is)
TRANSITIONS: dict[str, tuple[frozenset[Status], Status | None]] = {
    r.ServiceLatencyIncreased.TYPE: (frozenset({S.NEW}), S.DETECTED),
    # An incident opened by an Alertmanager alert rather than by the agent's own reading.
    r.ServiceDegraded.TYPE: (frozenset({S.NEW}), S.DETECTED),
    r.DiagnosisRequested.TYPE: (frozenset({S.DETECTED}), S.DIAGNOSING),
    r.DiagnosticJobStarted.TYPE: (frozenset({S.DIAGNOSING}), None),
    r.DependencyFailureSuspected.TYPE: (frozenset({S.DIAGNOSING}), S.DIAGNOSED),
    r.DiagnosisConcluded.TYPE: (frozenset({S.DIAGNOSING}), S.DIAGNOSED),
    # A newer proposal may supersede one still waiting for a decision.
    r.RecoveryProposed.TYPE: (frozenset({S.DIAGNOSED, S.PROPOSED, S.AWAITING_APPROVAL}), S.PROPOSED),
    r.HumanApprovalRequired.TYPE: (frozenset({S.PROPOSED}), S.AWAITING_APPROVAL),
    r.RecoveryApproved.TYPE: (frozenset({S.PROPOSED, S.AWAITING_APPROVAL}), S.AUTHORIZED),
    r.RecoveryRejected.TYPE: (frozenset({S.AWAITING_APPROVAL}), S.REJECTED),
    r.ApprovalExpired.TYPE: (frozenset({S.AWAITING_APPROVAL}), S.EXPIRED),
    r.CommandDenied.TYPE: (frozenset({S.PROPOSED}), S.DENIED),
    # Multi-step plans execute step after step. An execution (or its failure) is also taken
    # before the approval that led to it: the policy's approval and its command leave in one
    # PostgreSQL transaction but may reach Kafka in two Connect transactions, and the
    # executor's result can come in between (a policy kill in the chaos soak held the
    # approval back; the execution was then dropped as stale and the incident hung). The
    # executor acts only on a command the policy signed, so the approval is implied; when
    # it arrives it is stale.
    r.RecoveryExecuted.TYPE: (EXECUTABLE, S.EXECUTED),
    r.CommandFailed.TYPE: (EXECUTABLE, S.FAILED),
    r.RecoveryCompleted.TYPE: (frozenset({S.EXECUTED}), S.RESOLVED),
    r.RecoveryFailed.TYPE: (frozenset({S.EXECUTED}), S.FAILED),
    r.CompensationCompleted.TYPE: (frozenset({S.FAILED}), S.COMPENSATED),
    r.IncidentEscalated.TYPE: (OPEN, S.ESCALATED),
    r.BudgetExceeded.TYPE: (OPEN, None),
    r.LoopTerminated.TYPE: (frozenset(Status) - {S.NEW}, None),
    # An alert joining the open incident, or resolving: a note on it, whatever its state.
    r.AlertObserved.TYPE: (frozenset(Status) - {S.NEW}, None),
}


class BudgetKind(enum.StrEnum):
    LLM_TOKENS = "LLM_TOKENS"
    WALL_TIME = "WALL_TIME"
    STEPS = "STEPS"


@dataclass(frozen=True)
class Budgets:
    """Per-incident limits; exceeding one routes the incident to a human."""

    llm_tokens: int = 50_000
    wall_time: timedelta = timedelta(hours=4)
    steps: int = 40


@dataclass(frozen=True)
class BudgetOverrun:
    kind: BudgetKind
    limit: int
    used: int


@dataclass(frozen=True)
class IncidentState:
    """One incident as this service's workflow sees it."""

    incident_id: str
    status: Status = Status.NEW
    version: int = 0
    opened_at: datetime | None = None
    tokens_used: int = 0
    steps: int = 0
    last_event_id: str | None = None


class StaleTransition(Exception):
    """The record is not accepted in the incident's current state."""

    def __init__(self, state: IncidentState, record_type: str) -> None:
        self.state = state
        self.record_type = record_type
        super().__init__(
            f"{record_type.rsplit('.', 1)[-1]} is not accepted by incident {state.incident_id} "
            f"in state {state.status} (version {state.version})"
        )


def is_workflow_record(record_type: str) -> bool:
    """Whether the incident workflow has an opinion on this record type at all."""
    return record_type in TRANSITIONS


def accepts(state: IncidentState, record_type: str) -> bool:
    """Whether ``record_type`` is a valid next record for the incident in ``state``."""
    edge = TRANSITIONS.get(record_type)
    return edge is not None and state.status in edge[0]


def accepting(record_type: str) -> frozenset[Status]:
    """The states in which ``record_type`` is accepted (none for a type the workflow ignores)."""
    edge = TRANSITIONS.get(record_type)
    return frozenset() if edge is None else edge[0]


# ---------------------------------------------------------------- what a consumer must see
#
# Every service keeps its own copy of each incident's workflow state, from the records it
# reads. A record type a service neither handles nor needs for its copy can be skipped
# before it is decoded or claimed. "Needs" is exact here: the service looks at its copy
# in a few ways only (whether a record it handles is accepted; the sets of states its
# deferred work and its API check), and a type is needed unless leaving it out can never
# change one of those answers, whatever the order of the records.


def _after(status: Status, record_type: str) -> Status:
    """The status a copy moves to on ``record_type`` (a stale record leaves it)."""
    accepted, target = TRANSITIONS[record_type]
    return (target or status) if status in accepted else status


def divergence(needed: Collection[str], observed: Iterable[Collection[Status]]) -> tuple[str, ...] | None:
    """A shortest sequence of records after which a copy that applies only the ``needed``
    types answers one of the ``observed`` questions (is the status in this set?) otherwise
    than a copy that applied them all; None when no sequence does.

    Exhaustive: a breadth-first search over pairs (status of the full copy, status of the
    reduced one), at most 16 x 16 of them, so every order of records is covered."""
    views = [frozenset(v) for v in observed]
    start = (Status.NEW, Status.NEW)
    paths: dict[tuple[Status, Status], tuple[str, ...]] = {start: ()}
    queue = deque([start])
    while queue:
        full, kept = queue.popleft()
        for record_type in TRANSITIONS:
            pair = (_after(full, record_type), _after(kept, record_type) if record_type in needed else kept)
            if pair in paths:
                continue
            paths[pair] = (*paths[(full, kept)], record_type)
            if any((pair[0] in view) != (pair[1] in view) for view in views):
                return paths[pair]
            queue.append(pair)
    return None


def needed_types(
    handled: Iterable[str], observed: Iterable[Collection[Status]] = (), *, counts_steps: bool = False
) -> frozenset[str]:
    """The record types a consumer that follows the workflow must read: those it handles,
    and every workflow type without which its copy could answer differently whether a
    handled record is accepted or whether the status is in one of ``observed``.
    ``counts_steps``: it enforces the budgets, whose step count is every accepted record."""
    handled = frozenset(handled)
    if counts_steps:
        return handled | frozenset(TRANSITIONS)
    views = [*observed, *(accepting(t) for t in handled if t in TRANSITIONS)]
    needed = set(TRANSITIONS) | handled
    for record_type in sorted(set(TRANSITIONS) - handled):
        if divergence(needed - {record_type}, views) is None:
            needed.discard(record_type)
    return frozenset(needed)


def transition(state: IncidentState, record_type: str, *, event_id: str, at: datetime) -> IncidentState:
    """The state after applying ``record_type``; raises StaleTransition if not accepted."""
    if not accepts(state, record_type):
        raise StaleTransition(state, record_type)
    _, target = TRANSITIONS[record_type]
    return replace(
        state,
        status=target or state.status,
        version=state.version + 1,
        opened_at=state.opened_at or at,
        steps=state.steps + 1,
        last_event_id=event_id,
    )


def overrun(state: IncidentState, budgets: Budgets, now: datetime) -> BudgetOverrun | None:
    """The first budget this incident has exceeded, if any."""
    if state.tokens_used > budgets.llm_tokens:
        return BudgetOverrun(BudgetKind.LLM_TOKENS, budgets.llm_tokens, state.tokens_used)
    if state.steps > budgets.steps:
        return BudgetOverrun(BudgetKind.STEPS, budgets.steps, state.steps)
    if state.opened_at is not None:
        elapsed = now - state.opened_at
        if elapsed > budgets.wall_time:
            return BudgetOverrun(
                BudgetKind.WALL_TIME, int(budgets.wall_time.total_seconds()), int(elapsed.total_seconds())
            )
    return None


WORKFLOW_MIGRATION = """
CREATE TABLE IF NOT EXISTS incident_workflow (
    incident_id   text        PRIMARY KEY,
    status        text        NOT NULL,
    version       integer     NOT NULL,
    opened_at     timestamptz,
    tokens_used   bigint      NOT NULL DEFAULT 0,
    steps         integer     NOT NULL DEFAULT 0,
    last_event_id text,
    updated_at    timestamptz NOT NULL DEFAULT now()
);
"""


_COLUMNS = "incident_id, status, version, opened_at, tokens_used, steps, last_event_id"
_UPSERT = """
INSERT INTO incident_workflow (incident_id, status, version, opened_at, tokens_used, steps, last_event_id, updated_at)
VALUES (%s, %s, %s, %s, %s, %s, %s, now())
ON CONFLICT (incident_id) DO UPDATE SET
    status = EXCLUDED.status, version = EXCLUDED.version, opened_at = EXCLUDED.opened_at,
    tokens_used = EXCLUDED.tokens_used, steps = EXCLUDED.steps,
    last_event_id = EXCLUDED.last_event_id, updated_at = now()
"""


def _row(state: IncidentState) -> tuple[Any, ...]:
    return (
        state.incident_id,
        state.status.value,
        state.version,
        state.opened_at,
        state.tokens_used,
        state.steps,
        state.last_event_id,
    )


class WorkflowStore:
    """Loads and saves incident state inside the caller's transaction."""

    @staticmethod
    def load_for_update(conn: psycopg.Connection[Any], incident_id: str) -> IncidentState:
        """The incident's state, row-locked until the transaction ends (NEW if unseen)."""
        with conn.cursor(row_factory=dict_row) as cur:
            row = cur.execute(
                f"SELECT {_COLUMNS} FROM incident_workflow WHERE incident_id = %s FOR UPDATE", (incident_id,)
            ).fetchone()
        if row is None:
            return IncidentState(incident_id=incident_id)
        return IncidentState(**{**row, "status": Status(row["status"])})

    @staticmethod
    def load_many_for_update(conn: psycopg.Connection[Any], incident_ids: Collection[str]) -> dict[str, IncidentState]:
        """States of several incidents in one round trip, row-locked (absent = NEW)."""
        states = {i: IncidentState(incident_id=i) for i in incident_ids}
        with conn.cursor(row_factory=dict_row) as cur:
            rows = cur.execute(
                f"SELECT {_COLUMNS} FROM incident_workflow WHERE incident_id = ANY(%s) ORDER BY incident_id FOR UPDATE",
                (list(incident_ids),),
            ).fetchall()
        for row in rows:
            states[row["incident_id"]] = IncidentState(**{**row, "status": Status(row["status"])})
        return states

    @staticmethod
    def save_many(conn: psycopg.Connection[Any], states: Iterable[IncidentState]) -> None:
        with conn.cursor() as cur:
            cur.executemany(_UPSERT, [_row(s) for s in states])

    @staticmethod
    def save(conn: psycopg.Connection[Any], state: IncidentState) -> None:
        conn.execute(_UPSERT, _row(state))

    @staticmethod
    def status_of(conn: psycopg.Connection[Any], incident_id: str) -> Status | None:
        """The incident's status as this service's table has it; None if it has none."""
        row = conn.execute("SELECT status FROM incident_workflow WHERE incident_id = %s", (incident_id,)).fetchone()
        return None if row is None else Status(row[0])

    @staticmethod
    def charge_tokens(conn: psycopg.Connection[Any], incident_id: str, tokens: int) -> None:
        """Tokens spent outside a handler (a job, deferred work) still count against the
        incident's budget: added to its row, in the caller's transaction."""
        if tokens > 0:
            conn.execute(
                "UPDATE incident_workflow SET tokens_used = tokens_used + %s WHERE incident_id = %s",
                (tokens, incident_id),
            )
