"""The executor on the real PostgreSQL and Kafka, against an in-memory target.

The SQL pieces (leases and fencing, idempotency and reconciliation) are exercised
directly; the handlers run through ``flotilla.runner.prepare`` + ``build_loop`` on topics
of their own, and their facts are read back from the outbox. The target is a small
in-memory fake with the sim's semantics (a ledger by idempotency key, the newest fencing
token per resource), so each test can count exactly what reached it.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import psycopg
import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from psycopg import sql
from psycopg_pool import ConnectionPool

from flotilla import actions
from flotilla.authority import Grant, Signer, authorize_command
from flotilla.bootstrap import ensure_database
from flotilla.consumer import ConsumerLoop, migrate
from flotilla.envelope import Envelope
from flotilla.records import CommandFailed, RecoveryCompleted, RecoveryFailed
from flotilla.runner import ServiceContext, build_loop, prepare
from flotilla.serde import AvroSerde
from flotilla.settings import StackSettings
from services.executor import commands, idempotency, leases
from services.executor.commands import Step
from services.executor.execution import Applied, Executor, Failed, Replayed
from services.executor.idempotency import Begun, State
from services.executor.leases import LeaseLost, LeaseUnavailable
from services.executor.service import LOOP, MIGRATIONS, spec
from services.executor.settings import ExecutorSettings
from services.executor.targets import ActionResult, SimTarget, StaleFencingToken, TargetRejected, TargetUnavailable
from tests.keys import fact_settings, signed_headers
from tests.signing import POLICY_SIGNER, public, sign_command
from tests.support.producing import ordered_producer

pytestmark = pytest.mark.timeout(180)

DB = f"flotilla_it_executor_{uuid.uuid4().hex[:8]}"
POLICY = "/flotilla/policy-service"


# ---------------------------------------------------------------- the target


class FakeTarget:
    """An in-memory ActionTarget with the sim's contract.

    Each key applies once (a repeat returns the recorded result, ``replayed``); a token
    lower than the newest seen for the resource is refused before anything happens.
    Knobs: ``reject`` (keys refused as TargetRejected), ``unavailable`` (how many of the
    next calls fail as TargetUnavailable), ``crash_after_apply`` (raise SystemExit right
    after an action took effect: the executor dies between acting and recording), ``broken``
    (key → how many of its next calls raise RuntimeError after doing their work: a bug in
    the executor's process, not the target's answer).
    """

    def __init__(self) -> None:
        self.services: dict[str, dict[str, Any]] = {}
        self.ledger: dict[str, ActionResult] = {}
        self.newest: dict[str, int] = {}
        self.applied: list[tuple[str, int]] = []  # (key, token) of every action that took effect
        self.stale: list[tuple[str, int]] = []  # (key, token) refused as stale
        self.lookups: list[str] = []
        self.reject: set[str] = set()
        self.unavailable = 0
        self.unavailable_calls = 0
        self.crash_after_apply = False
        self.delay = 0.0  # seconds every apply takes before it acts (a slow target)
        self.lost_answers = 0  # how many of the next applies act, then fail as TargetUnavailable
        self.broken: dict[str, int] = {}
        self.expected_changes: dict[str, str | None] = {}  # key -> the approved change it was asked to check
        self._lock = threading.Lock()

    def _maybe_break(self, idempotency_key: str) -> None:
        if self.broken.get(idempotency_key, 0) > 0:
            self.broken[idempotency_key] -= 1
            raise RuntimeError(f"fake target: a bug after {idempotency_key} was done")

    def service(self, resource: str) -> dict[str, Any]:
        return self.services.setdefault(
            resource, {"replicas": 4, "revision": "v41", "previousRevision": "v40", "active": {}, "restarts": 0}
        )

    def apply(
        self,
        action: str,
        resource: str,
        params: Mapping[str, Any],
        idempotency_key: str,
        fencing_token: int,
        holder: str,
        expected_change: str | None = None,
    ) -> ActionResult:
        self.expected_changes[idempotency_key] = expected_change
        if self.delay:
            time.sleep(self.delay)
        with self._lock:
            if self.unavailable > 0:
                self.unavailable -= 1
                self.unavailable_calls += 1
                raise TargetUnavailable("fake target: 503")
            if idempotency_key in self.ledger:
                if self.lost_answers > 0:  # the replay's answer is lost too
                    self.lost_answers -= 1
                    raise TargetUnavailable("fake target: the answer was lost (a timeout after the action)")
                return replace(self.ledger[idempotency_key], replayed=True)
            newest = self.newest.get(resource, 0)
            if fencing_token < newest:
                self.stale.append((idempotency_key, fencing_token))
                raise StaleFencingToken(fencing_token, newest)
            if idempotency_key in self.reject:
                raise TargetRejected(f"fake target refuses {idempotency_key}", 422)
            self.newest[resource] = fencing_token
            before, after = self._do(action, self.service(resource), params)
            result = ActionResult(
                idempotency_key, action, resource, "applied", before, after, datetime.now(UTC), False, 7
            )
            self.ledger[idempotency_key] = result
            self.applied.append((idempotency_key, fencing_token))
            crash, self.crash_after_apply = self.crash_after_apply, False
            lost = self.lost_answers > 0
            self.lost_answers -= 1 if lost else 0
        if crash:
            raise SystemExit(17)
        if lost:
            raise TargetUnavailable("fake target: the answer was lost (a timeout after the action)")
        self._maybe_break(idempotency_key)
        return result

    def lookup(self, idempotency_key: str) -> ActionResult | None:
        with self._lock:
            self.lookups.append(idempotency_key)
            found = self.ledger.get(idempotency_key)
        self._maybe_break(idempotency_key)
        return found

    @staticmethod
    def _do(action: str, svc: dict[str, Any], params: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        if action == "scale":
            before = {"replicas": svc["replicas"]}
            svc["replicas"] = params["replicas"]
            return before, {"replicas": svc["replicas"]}
        if action == "rollback":
            before = {"revision": svc["revision"], "previousRevision": svc["previousRevision"]}
            if params["toRevision"] != svc["revision"]:
                svc["previousRevision"], svc["revision"] = svc["revision"], params["toRevision"]
            return before, {"revision": svc["revision"], "previousRevision": svc["previousRevision"]}
        if action == "failover":
            dep = params["dependency"]
            before = {"dependency": dep, "activeTarget": svc["active"].get(dep, dep)}
            svc["active"][dep] = params["toTarget"]
            return before, {"dependency": dep, "activeTarget": svc["active"][dep]}
        before = {"restarts": svc["restarts"]}
        svc["restarts"] += 1
        return before, {"restarts": svc["restarts"]}


# ------------------------------------------------------------------ fixtures


@pytest.fixture(scope="module")
def database(stack: StackSettings) -> Iterator[str]:
    """A database of this module's own, dropped afterwards."""
    ensure_database(stack, DB)
    with psycopg.connect(stack.pg_dsn(DB), autocommit=True) as conn:
        migrate(conn)
        for ddl in MIGRATIONS:
            conn.execute(ddl)
    yield DB
    with psycopg.connect(stack.pg_dsn("postgres"), autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(DB)))


@pytest.fixture(scope="module")
def settings(stack: StackSettings, database: str) -> ExecutorSettings:
    return ExecutorSettings(
        **stack.model_dump(),
        service_database=database,
        http_port=0,
        executor_id="it-executor-a",
        executor_lease_ttl_seconds=10,
        executor_lease_wait_seconds=1,
        executor_target_attempts=3,
        executor_target_backoff_seconds=0.01,
        authorization_public_keys=[public(POLICY_SIGNER)],
        **fact_settings(),
    )


@pytest.fixture(scope="module")
def pool(settings: ExecutorSettings) -> Iterator[ConnectionPool[Any]]:
    with ConnectionPool(settings.pg_dsn(DB), min_size=1, max_size=4, kwargs={"autocommit": True}) as p:
        yield p


@pytest.fixture()
def target() -> FakeTarget:
    return FakeTarget()


@pytest.fixture()
def topics(stack: StackSettings) -> Iterator[tuple[str, str]]:
    """A commands topic (3 partitions) and an incidents topic of this test's own, with DLQs."""
    suffix = uuid.uuid4().hex[:8]
    names = (f"it-exec-commands-{suffix}", f"it-exec-incidents-{suffix}")
    admin = AdminClient({"bootstrap.servers": stack.kafka_bootstrap})
    created = [NewTopic(names[0], 3, 1), NewTopic(names[1], 1, 1)] + [NewTopic(f"{n}.dlq", 1, 1) for n in names]
    for fut in admin.create_topics(created).values():
        fut.result(15)
    yield names
    admin.delete_topics([t.topic for t in created])


# ------------------------------------------------------------------- helpers


def resource_name() -> str:
    return f"svc-{uuid.uuid4().hex[:8]}"


def command(
    kind: str,
    name: str,
    key: str,
    *,
    incident: str = "incident-it",
    proposal: str | None = None,
    expires_in: timedelta = timedelta(minutes=10),
    **params: Any,
) -> dict[str, Any]:
    now = datetime.now(UTC).replace(microsecond=0)
    spec = actions.by_kind(kind)
    return {
        "commandId": str(uuid.uuid4()),
        "idempotencyKey": key,
        "incidentId": incident,
        "proposalId": proposal or str(uuid.uuid4()),
        "target": {"kind": "service", "environment": "production", "name": name},
        # every field of the kind, as Avro decodes it: the authorization signs the decoded form
        **{p.name: p.default for p in spec.params if p.has_default},
        **params,
        "issuedAt": now,
        "expiresAt": now + expires_in,
    }


def as_step(kind: str, value: dict[str, Any]) -> Step:
    return commands.from_record(kind, value)


def produce_command(
    stack: StackSettings,
    serde: AvroSerde,
    topic: str,
    kind: str,
    value: dict[str, Any],
    *,
    event_id: str | None = None,
    signer: Signer | None = POLICY_SIGNER,
) -> Envelope:
    """A command as the policy service issues it: signed by ``signer`` (None: unsigned,
    as anyone else could produce it); a value that already has an authorization is sent as is."""
    envelope = Envelope(type=kind, source=POLICY, correlationid=value["incidentId"], id=event_id or value["commandId"])
    key = f"{value['target']['environment']}/{value['target']['name']}"
    if signer is not None and value.get("authorization") is None:
        value = sign_command(value, kind, signer=signer)
    _produce(stack, topic, key, serde.serialize("commands", kind, value), envelope)
    return envelope


def produce_fact(stack: StackSettings, serde: AvroSerde, topic: str, kind: str, value: dict[str, Any]) -> Envelope:
    envelope = Envelope(type=kind, source="/flotilla/health-agent", correlationid=value["incidentId"])
    value = {"eventId": envelope.id, **value}
    _produce(stack, topic, value["incidentId"], serde.serialize("incidents", kind, value), envelope)
    return envelope


def _produce(stack: StackSettings, topic: str, key: str, payload: bytes, envelope: Envelope) -> None:
    producer = ordered_producer(stack.kafka_bootstrap)
    producer.produce(topic, key=key, value=payload, headers=signed_headers(envelope, payload))
    assert producer.flush(15) == 0


@contextmanager
def executor_loop(
    settings: ExecutorSettings,
    target: Any,
    topics: tuple[str, str],
    *,
    group: str,
    clock: Callable[[], datetime] | None = None,
) -> Iterator[tuple[ConsumerLoop, ServiceContext]]:
    """The executor's spec on this test's topics and database, prepared and built as
    ``runner.start`` would, without publishing (the outbox is read directly)."""
    loop_config = {
        **LOOP,
        "backoff_initial": 0.01,
        "kafka": {"session.timeout.ms": 6000, "heartbeat.interval.ms": 1000},
        "contract_topics": {topics[0]: "commands", topics[1]: "incidents"},
    }
    executor_spec = spec(
        target=lambda _: target, clock=clock, name=group, database=DB, topics=topics, publishes=False, loop=loop_config
    )
    ctx = prepare(executor_spec, settings)
    try:
        yield build_loop(ctx), ctx
    finally:
        ctx.pool.close()


def drain(loop: ConsumerLoop, expected: int, timeout: float = 60) -> None:
    seen = 0
    deadline = time.monotonic() + timeout
    while seen < expected:
        assert time.monotonic() < deadline, f"consumed {seen} of {expected} records"
        seen += loop.poll_once()


def facts(stack: StackSettings, serde: AvroSerde, incident: str) -> list[tuple[str, dict[str, Any]]]:
    """The records the executor wrote to its outbox for ``incident``, in order."""
    with psycopg.connect(stack.pg_dsn(DB)) as conn:
        rows = conn.execute(
            "SELECT type, payload FROM outbox WHERE aggregateid = %s ORDER BY created_at, ctid", (incident,)
        ).fetchall()
    return [(t.rsplit(".", 1)[-1], serde.deserialize(bytes(p)).value) for t, p in rows]


def execution(pool: ConnectionPool[Any], key: str) -> idempotency.Execution | None:
    with pool.connection() as conn:
        return idempotency.find(conn, key)


def lease_of(pool: ConnectionPool[Any], resource: str) -> leases.Lease | None:
    with pool.connection() as conn:
        return leases.current(conn, resource)


def executor(pool: ConnectionPool[Any], target: FakeTarget, settings: ExecutorSettings, **changes: Any) -> Executor:
    return Executor(pool, target, replace(settings.executor_config(), **changes))


def run_and_record(x: Executor, pool: ConnectionPool[Any], step: Step) -> Any:
    """One step through a session, recorded in a transaction of its own (as a handler would)."""
    session = x.session()
    with pool.connection() as conn, conn.transaction():
        outcome = session.run(conn, step, datetime.now(UTC))
        session.record(conn)
    return outcome


# ------------------------------------------------------------ leases, fencing


def test_the_epoch_grows_with_every_acquisition_whoever_holds_it(pool: ConnectionPool[Any]) -> None:
    resource = f"production/{resource_name()}"
    with pool.connection() as conn:
        first = leases.acquire(conn, resource, "a", 10)
        again = leases.acquire(conn, resource, "a", 10)  # already ours: a new epoch all the same
        assert first is not None and again is not None
        assert (first.epoch, again.epoch) == (1, 2)
        assert leases.acquire(conn, resource, "b", 10) is None  # live and not b's
        leases.release(conn, again)
        taken = leases.acquire(conn, resource, "b", 10)
        assert taken is not None and (taken.holder, taken.epoch) == ("b", 3)
        renewed = leases.renew(conn, taken, 10)
        assert renewed.epoch == 3 and renewed.expires_at >= taken.expires_at


def test_an_expired_lease_is_taken_over_and_the_old_holder_is_fenced_out(pool: ConnectionPool[Any]) -> None:
    resource = f"production/{resource_name()}"
    with pool.connection() as conn:
        old = leases.acquire(conn, resource, "paused", 0.2)
        assert old is not None
        time.sleep(0.3)
        new = leases.acquire(conn, resource, "fresh", 10)
        assert new is not None and new.epoch == old.epoch + 1
        with pytest.raises(LeaseLost):
            leases.renew(conn, old, 10)
        with pytest.raises(LeaseLost):
            leases.release(conn, old)
        leases.renew(conn, new, 10)  # the current holder passes
        current = leases.current(conn, resource)
        assert current is not None and (current.holder, current.epoch) == ("fresh", new.epoch)


def begun_step(pool: ConnectionPool[Any], holder: str, ttl_seconds: float) -> tuple[Step, leases.Lease]:
    """A scale step whose key is PENDING under a fresh lease of ``holder``'s, committed."""
    name = resource_name()
    step = as_step(commands.SCALE, command(commands.SCALE, name, f"it:{name}:scale:6", replicas=6))
    with pool.connection() as conn, conn.transaction():
        lease = leases.acquire(conn, step.resource, holder, ttl_seconds)
        assert lease is not None
        begun = idempotency.begin(conn, step, lease)
        assert isinstance(begun, Begun) and not begun.in_doubt
    return step, lease


def test_a_holder_whose_lease_was_taken_over_cannot_record(pool: ConnectionPool[Any]) -> None:
    step, old = begun_step(pool, "paused", 0.2)
    time.sleep(0.3)
    with pool.connection() as conn, conn.transaction():
        new = leases.acquire(conn, step.resource, "fresh", 10)
        assert new is not None
    with pool.connection() as conn, pytest.raises(LeaseLost), conn.transaction():
        idempotency.settle(conn, step.idempotency_key, old, state=State.APPLIED, result={"after": {"replicas": 6}})
    row = execution(pool, step.idempotency_key)
    assert row is not None and (row.state, row.epoch) == (State.PENDING, old.epoch)  # nothing recorded
    # The new holder takes the in-doubt row over (re-stamped with its epoch) and may record.
    with pool.connection() as conn, conn.transaction():
        taken = idempotency.begin(conn, step, new)
        assert isinstance(taken, Begun) and taken.in_doubt and taken.execution.epoch == new.epoch
        assert taken.execution.attempts == 2
        idempotency.settle(conn, step.idempotency_key, new, state=State.APPLIED, result={})
    row = execution(pool, step.idempotency_key)
    assert row is not None and row.state is State.APPLIED and row.settled


def test_a_released_lease_is_held_again_only_by_the_transaction_that_released_it(
    pool: ConnectionPool[Any],
) -> None:
    """The batch path of the executor: a lease released in a handler transaction stays
    ours while that transaction keeps its row locked, and no one else's meanwhile."""
    resource = f"production/{resource_name()}"
    with pool.connection() as conn, conn.transaction():
        lease = leases.acquire(conn, resource, "batch", 10)
    assert lease is not None
    with pool.connection() as batch, batch.transaction():
        leases.release(batch, lease)
        relocked = leases.relock(batch, lease)
        assert relocked is not None and (relocked.holder, relocked.epoch) == (lease.holder, lease.epoch)
        with pool.connection() as other, other.transaction():
            other.execute("SET LOCAL lock_timeout = '2s'")
            assert leases.relock(other, lease) is None  # locked by the batch: skipped, no wait
    # Committed and released: nobody holds the row; still our epoch, so ours to hold again.
    with pool.connection() as conn, conn.transaction():
        again = leases.relock(conn, lease)
        assert again is not None and again.epoch == lease.epoch
    with pool.connection() as conn, conn.transaction():
        newer = leases.acquire(conn, resource, "someone-else", 10)
    assert newer is not None and newer.epoch == lease.epoch + 1
    with pool.connection() as conn, conn.transaction():
        assert leases.relock(conn, lease) is None  # a newer epoch exists: ours is gone


def test_the_records_of_one_handler_transaction_share_it_and_no_other_does(
    pool: ConnectionPool[Any], target: FakeTarget, settings: ExecutorSettings
) -> None:
    x = executor(pool, target, settings)
    with pool.connection() as conn, conn.transaction():
        first = x.bound_handler_transaction(conn)
        assert x.bound_handler_transaction(conn) is first
        with conn.transaction():  # a record's savepoint: still the same transaction
            assert x.bound_handler_transaction(conn) is first
        seen_elsewhere: list[Any] = []

        def on_another_thread() -> None:
            with pool.connection() as other, other.transaction():
                seen_elsewhere.append(x.bound_handler_transaction(other))

        thread = threading.Thread(target=on_another_thread)
        thread.start()
        thread.join()
        assert seen_elsewhere[0] is not first and seen_elsewhere[0].xid != first.xid
        assert x.bound_handler_transaction(conn) is first  # the other thread did not take its place
    with pool.connection() as conn, conn.transaction():
        assert x.bound_handler_transaction(conn) is not first


def test_an_in_doubt_key_is_restamped_under_its_own_epoch_only_by_its_holder(pool: ConnectionPool[Any]) -> None:
    step, lease = begun_step(pool, "batch", 10)
    with pool.connection() as conn, conn.transaction():
        again = idempotency.begin(conn, step, lease)  # a retried record, same lease: in doubt
        assert isinstance(again, Begun) and again.in_doubt and again.execution.attempts == 2
    with pool.connection() as conn, pytest.raises(LeaseLost), conn.transaction():
        idempotency.begin(conn, step, replace(lease, holder="impostor"))  # same epoch, not its holder


# ------------------------------------------------------------------ idempotency


def test_a_settled_key_returns_its_recorded_outcome_and_acts_no_more(
    pool: ConnectionPool[Any], target: FakeTarget, settings: ExecutorSettings
) -> None:
    x = executor(pool, target, settings)
    value = command(commands.SCALE, resource_name(), f"it:{uuid.uuid4()}:scale:12", replicas=12)
    first = run_and_record(x, pool, as_step(commands.SCALE, value))
    assert isinstance(first, Applied) and not first.reconciled
    # the same command again, and a copy of it under another command id: both replays
    second = run_and_record(x, pool, as_step(commands.SCALE, value))
    third = run_and_record(x, pool, as_step(commands.SCALE, {**value, "commandId": str(uuid.uuid4())}))
    assert isinstance(second, Replayed) and isinstance(third, Replayed)
    assert second.execution.state is State.APPLIED
    assert second.execution.result is not None and second.execution.result["after"] == {"replicas": 12}
    assert [k for k, _ in target.applied] == [value["idempotencyKey"]]


def test_a_pending_key_that_was_applied_is_recorded_without_acting_again(
    pool: ConnectionPool[Any], target: FakeTarget, settings: ExecutorSettings
) -> None:
    """Crash between acting and recording: the PENDING row is committed, the target acted."""
    x = executor(pool, target, settings)
    step = as_step(commands.SCALE, command(commands.SCALE, resource_name(), f"it:{uuid.uuid4()}:scale:8", replicas=8))
    started = x.session().begin(step)  # PENDING + lease committed
    assert started is not None
    lease, _ = started
    target.apply(step.action, step.resource, step.params, step.idempotency_key, lease.epoch, lease.holder)
    # ... the process dies here; the command is delivered again:
    outcome = run_and_record(x, pool, step)
    assert isinstance(outcome, Applied) and outcome.reconciled
    assert outcome.after == {"replicas": 8}
    assert target.lookups == [step.idempotency_key]
    assert len(target.applied) == 1
    row = execution(pool, step.idempotency_key)
    assert row is not None and row.state is State.APPLIED and row.attempts == 2


def test_a_pending_key_that_was_not_applied_is_applied_once_with_a_newer_epoch(
    pool: ConnectionPool[Any], target: FakeTarget, settings: ExecutorSettings
) -> None:
    """Crash after PENDING committed, before the target was called."""
    x = executor(pool, target, settings)
    step = as_step(commands.SCALE, command(commands.SCALE, resource_name(), f"it:{uuid.uuid4()}:scale:9", replicas=9))
    started = x.session().begin(step)
    assert started is not None
    first_epoch = started[0].epoch
    outcome = run_and_record(x, pool, step)
    assert isinstance(outcome, Applied) and not outcome.reconciled
    assert outcome.epoch == first_epoch + 1
    assert target.lookups == [step.idempotency_key]
    assert target.applied == [(step.idempotency_key, first_epoch + 1)]


def test_target_unavailable_is_retried_a_bounded_number_of_times_then_reported_retryable(
    pool: ConnectionPool[Any], target: FakeTarget, settings: ExecutorSettings
) -> None:
    x = executor(pool, target, settings)
    value = command(commands.SCALE, resource_name(), f"it:{uuid.uuid4()}:scale:5", replicas=5)
    target.unavailable = 10
    outcome = run_and_record(x, pool, as_step(commands.SCALE, value))
    assert isinstance(outcome, Failed)
    assert (outcome.error_class, outcome.retryable) == ("TargetUnavailable", True)
    assert target.unavailable_calls == settings.executor_target_attempts
    row = execution(pool, value["idempotencyKey"])
    assert row is not None and row.state is State.FAILED and row.retryable and not row.settled
    # A retryable failure is in doubt: the same key later is looked up first, then applied once.
    target.unavailable = 1  # and the target is flaky once more: retried within the bounds
    again = run_and_record(x, pool, as_step(commands.SCALE, value))
    assert isinstance(again, Applied)
    # looked up before it was reported failed (not applied), and again before the retry
    assert target.lookups == [value["idempotencyKey"], value["idempotencyKey"]]
    assert len(target.applied) == 1


def test_a_resource_leased_to_a_live_holder_is_waited_for_then_reported(
    pool: ConnectionPool[Any], target: FakeTarget, settings: ExecutorSettings
) -> None:
    x = executor(pool, target, settings, lease_wait_seconds=0.3)
    value = command(commands.SCALE, resource_name(), f"it:{uuid.uuid4()}:scale:3", replicas=3)
    step = as_step(commands.SCALE, value)
    with pool.connection() as conn:
        assert leases.acquire(conn, step.resource, "someone-else", 30) is not None
    started = time.monotonic()
    outcome = run_and_record(x, pool, step)
    assert time.monotonic() - started >= 0.3  # waited, boundedly
    assert isinstance(outcome, Failed)
    assert (outcome.error_class, outcome.retryable, outcome.epoch) == ("LeaseUnavailable", True, None)
    assert execution(pool, step.idempotency_key) is None and target.applied == []
    # With an in-doubt row, no failure can be reported truthfully: the loop retries instead.
    with pool.connection() as conn:  # a crashed executor's row, PENDING at epoch 1
        conn.execute(
            "INSERT INTO executions (idempotency_key, resource, epoch, holder, state, command_id, command_type,"
            " incident_id, proposal_id, action, params) VALUES (%s, %s, 1, 'crashed', 'PENDING', %s, %s, %s, %s,"
            " 'scale', '{}')",
            (
                step.idempotency_key,
                step.resource,
                step.command_id,
                step.command_type,
                step.incident_id,
                step.proposal_id,
            ),
        )
    with pytest.raises(LeaseUnavailable):
        run_and_record(x, pool, step)


def test_a_stale_epoch_is_refused_and_the_paused_holder_records_nothing(
    pool: ConnectionPool[Any],
    target: FakeTarget,
    settings: ExecutorSettings,
    topics: tuple[str, str],
    stack: StackSettings,
    serde: AvroSerde,
) -> None:
    """Executor A takes the lease and marks its command PENDING, then pauses past the
    TTL; a second executor instance B takes the lease over and acts through its loop.
    When A resumes, the target refuses A's stale epoch and A cannot record anything."""
    name, incident = resource_name(), f"incident-{uuid.uuid4().hex[:8]}"
    a = executor(pool, target, settings, holder="it-executor-paused", lease_ttl_seconds=0.5)
    x_value = command(commands.SCALE, name, f"{incident}:scale:10", incident=incident, replicas=10)
    x_step = as_step(commands.SCALE, x_value)
    session_a = a.session()
    started = session_a.begin(x_step)
    assert started is not None
    lease_a, begun_a = started
    assert isinstance(begun_a, Begun)
    time.sleep(0.6)  # A is paused; its lease expires

    b_settings = settings.model_copy(update={"executor_id": "it-executor-b"})
    y_value = command(commands.SCALE, name, f"{incident}:scale:11", incident=incident, replicas=11)
    produce_command(stack, serde, topics[0], commands.SCALE, y_value)
    with executor_loop(b_settings, target, topics, group=f"it-exec-{uuid.uuid4().hex[:8]}") as (loop, _):
        drain(loop, 1)
    assert [t for _, t in target.applied] == [lease_a.epoch + 1]  # B acted with the next epoch

    outcome = session_a.act(x_step, lease_a, begun_a, datetime.now(UTC))  # A wakes up
    assert isinstance(outcome, Failed) and outcome.error_class == "StaleFencingToken"
    assert target.stale == [(x_value["idempotencyKey"], lease_a.epoch)]
    with pool.connection() as conn, pytest.raises(LeaseLost), conn.transaction():
        session_a.record(conn)
    row = execution(pool, x_value["idempotencyKey"])
    assert row is not None and (row.state, row.epoch, row.holder) == (State.PENDING, lease_a.epoch, lease_a.holder)
    assert [t for t, _ in facts(stack, serde, incident)] == ["RecoveryExecuted"]  # B's, and nothing of A's
    assert target.service(x_step.resource)["replicas"] == 11


# -------------------------------------------------------- through the loop


def test_a_scale_command_is_applied_once_with_the_current_epoch_and_reported(
    stack: StackSettings,
    serde: AvroSerde,
    settings: ExecutorSettings,
    pool: ConnectionPool[Any],
    target: FakeTarget,
    topics: tuple[str, str],
) -> None:
    name, incident = resource_name(), f"incident-{uuid.uuid4().hex[:8]}"
    value = command(commands.SCALE, name, f"{incident}:scale:12", incident=incident, replicas=12)
    envelope = produce_command(stack, serde, topics[0], commands.SCALE, value)
    produce_command(stack, serde, topics[0], commands.SCALE, value)  # redelivered as is
    produce_command(stack, serde, topics[0], commands.SCALE, value, event_id=str(uuid.uuid4()))  # re-sent anew
    with executor_loop(settings, target, topics, group=f"it-exec-{uuid.uuid4().hex[:8]}") as (loop, _):
        drain(loop, 3)

    lease = lease_of(pool, f"production/{name}")
    assert lease is not None and lease.holder == settings.executor_id
    assert target.applied == [(value["idempotencyKey"], lease.epoch)]  # one apply, the current epoch
    reported = facts(stack, serde, incident)
    assert [t for t, _ in reported] == ["RecoveryExecuted"]
    executed = reported[0][1]
    assert executed["fencingEpoch"] == lease.epoch
    assert str(executed["commandId"]) == value["commandId"]
    assert executed["outcome"] == f"{name} scaled from 4 to 12 replicas"
    assert executed["actionDurationMs"] == 7 and executed["compensates"] is None
    with psycopg.connect(stack.pg_dsn(DB)) as conn:
        causation = conn.execute("SELECT ce_causationid FROM outbox WHERE aggregateid = %s", (incident,)).fetchone()
    assert causation == (envelope.id,)


def test_the_change_a_person_approved_reaches_the_target_and_an_undo_carries_none(
    stack: StackSettings,
    serde: AvroSerde,
    settings: ExecutorSettings,
    target: FakeTarget,
    topics: tuple[str, str],
) -> None:
    """The authorization's signed expectedChange is what the target is asked to check
    (its dry run must show that change); the compensation of the step, which no person was
    shown, carries none."""
    name, incident, proposal = resource_name(), f"incident-{uuid.uuid4().hex[:8]}", str(uuid.uuid4())
    approved = "sha256:" + "ab" * 32
    first = command(commands.SCALE, name, f"{incident}:scale:8", incident=incident, proposal=proposal, replicas=8)
    second = command(commands.RESTART, name, f"{incident}:restart", incident=incident, proposal=proposal, rolling=True)
    target.reject.add(second["idempotencyKey"])  # fails, so the scale is undone
    for kind, value in ((commands.SCALE, first), (commands.RESTART, second)):
        signed = authorize_command(
            POLICY_SIGNER,
            kind,
            value,
            decision=Grant.APPROVED,
            approved_by="alice",
            proposal_digest="sha256:" + "0" * 64,
            now=datetime.now(UTC),
            expected_change=approved,
        )
        produce_command(stack, serde, topics[0], kind, signed)
    with executor_loop(settings, target, topics, group=f"it-exec-{uuid.uuid4().hex[:8]}") as (loop, _):
        drain(loop, 2)
    assert target.expected_changes == {
        first["idempotencyKey"]: approved,
        second["idempotencyKey"]: approved,
        first["idempotencyKey"] + ":compensate": None,
    }


def three_scales_in_one_batch(
    stack: StackSettings,
    serde: AvroSerde,
    settings: ExecutorSettings,
    pool: ConnectionPool[Any],
    target: FakeTarget,
    topics: tuple[str, str],
    *,
    broken_second: int = 0,
) -> list[str]:
    """Three scale commands for one resource, waiting on one partition before the loop's
    first poll (so they make one batch), drained; checks that each key acted once, in
    order, all under the lease the resource has now, and returns the keys."""
    name, incident = resource_name(), f"incident-{uuid.uuid4().hex[:8]}"
    sent = [command(commands.SCALE, name, f"{incident}:scale:{n}", incident=incident, replicas=n) for n in (5, 6, 7)]
    keys = [v["idempotencyKey"] for v in sent]
    target.broken[keys[1]] = broken_second
    for value in sent:
        produce_command(stack, serde, topics[0], commands.SCALE, value)
    with executor_loop(settings, target, topics, group=f"it-exec-{uuid.uuid4().hex[:8]}") as (loop, _):
        drain(loop, 3)

    assert [k for k, _ in target.applied] == keys  # each key acted on once, in order
    assert target.service(f"production/{name}")["replicas"] == 7
    reported = facts(stack, serde, incident)
    assert [(t, v["idempotencyKey"]) for t, v in reported] == [("RecoveryExecuted", k) for k in keys]
    lease = lease_of(pool, f"production/{name}")
    assert lease is not None
    assert {v["fencingEpoch"] for _, v in reported} == {lease.epoch}  # one lease, held on through the batch
    for key in keys:
        row = execution(pool, key)
        assert row is not None and row.state is State.APPLIED
    with pool.connection() as conn:
        released = conn.execute("SELECT expires_at <= now() FROM leases WHERE resource = %s", (lease.resource,))
        assert released.fetchone() == (True,)  # let go when the batch committed
    return keys


def test_commands_for_one_resource_in_one_batch_run_under_its_lease_one_after_another(
    stack: StackSettings,
    serde: AvroSerde,
    settings: ExecutorSettings,
    pool: ConnectionPool[Any],
    target: FakeTarget,
    topics: tuple[str, str],
) -> None:
    """A batch releases each command's lease in its own transaction, so the row stays locked
    until the batch commits; the next command for the resource goes on under that lock (a
    short transaction would wait on its own batch until lock_timeout)."""
    three_scales_in_one_batch(stack, serde, settings, pool, target, topics)
    assert target.lookups == []


def test_a_batch_that_fails_midway_reruns_record_by_record_and_acts_once_per_key(
    stack: StackSettings,
    serde: AvroSerde,
    settings: ExecutorSettings,
    pool: ConnectionPool[Any],
    target: FakeTarget,
    topics: tuple[str, str],
) -> None:
    """The second command's process breaks after the target acted, twice (the apply, then
    the rerun's first lookup): the batch rolls back and runs again with a savepoint per
    record. Every key that may have acted is looked up before it is called again, the
    retried record under the lease the first record released in the same transaction."""
    keys = three_scales_in_one_batch(stack, serde, settings, pool, target, topics, broken_second=2)
    assert target.lookups == [keys[0], keys[1], keys[1]]


def test_a_crash_right_after_the_target_acted_leads_to_exactly_one_action(
    stack: StackSettings,
    serde: AvroSerde,
    settings: ExecutorSettings,
    pool: ConnectionPool[Any],
    target: FakeTarget,
    topics: tuple[str, str],
) -> None:
    name, incident = resource_name(), f"incident-{uuid.uuid4().hex[:8]}"
    value = command(commands.SCALE, name, f"{incident}:scale:12", incident=incident, replicas=12)
    produce_command(stack, serde, topics[0], commands.SCALE, value)
    group = f"it-exec-{uuid.uuid4().hex[:8]}"
    target.crash_after_apply = True
    with executor_loop(settings, target, topics, group=group) as (loop, _), pytest.raises(SystemExit):
        loop.run()  # dies inside the handler: nothing of its transaction commits, no offset either
    assert len(target.applied) == 1
    row = execution(pool, value["idempotencyKey"])
    assert row is not None and row.state is State.PENDING  # committed before the target was called
    assert facts(stack, serde, incident) == []

    with executor_loop(settings, target, topics, group=group) as (loop, _):
        drain(loop, 1)  # the same record again
    assert len(target.applied) == 1  # the target saw one apply
    assert target.lookups == [value["idempotencyKey"]]  # ... and a lookup reconciled it
    reported = facts(stack, serde, incident)
    assert [t for t, _ in reported] == ["RecoveryExecuted"]
    assert reported[0][1]["outcome"].endswith("found applied at the target and recorded late")
    row = execution(pool, value["idempotencyKey"])
    assert row is not None and row.state is State.APPLIED


def test_an_expired_command_is_refused_and_not_retryable(
    stack: StackSettings, serde: AvroSerde, settings: ExecutorSettings, target: FakeTarget, topics: tuple[str, str]
) -> None:
    name, incident = resource_name(), f"incident-{uuid.uuid4().hex[:8]}"
    value = command(
        commands.SCALE, name, f"{incident}:scale:12", incident=incident, replicas=12, expires_in=timedelta(seconds=30)
    )
    produce_command(stack, serde, topics[0], commands.SCALE, value)
    later = datetime.now(UTC) + timedelta(minutes=1)
    with executor_loop(settings, target, topics, group=f"it-exec-{uuid.uuid4().hex[:8]}", clock=lambda: later) as (
        loop,
        _,
    ):
        drain(loop, 1)
    assert target.applied == [] and target.lookups == []
    [(kind, failed), (ending, nothing)] = facts(stack, serde, incident)
    assert kind == "CommandFailed"
    assert (failed["errorClass"], failed["retryable"], failed["fencingEpoch"]) == ("CommandExpired", False, None)
    # The proposal's saga still ends in a fact: an incident left FAILED would hold its service
    # at the health agent for good.
    assert ending == "CompensationCompleted"
    assert nothing["compensatedCommandIds"] == [] and "nothing to undo" in nothing["summary"]
    assert str(nothing["causeEventId"]) == str(failed["eventId"])


def test_a_failed_second_step_compensates_the_first(
    stack: StackSettings,
    serde: AvroSerde,
    settings: ExecutorSettings,
    pool: ConnectionPool[Any],
    target: FakeTarget,
    topics: tuple[str, str],
) -> None:
    name, incident, proposal = resource_name(), f"incident-{uuid.uuid4().hex[:8]}", str(uuid.uuid4())
    first = command(commands.SCALE, name, f"{incident}:scale:12", incident=incident, proposal=proposal, replicas=12)
    second = command(
        commands.ROLLBACK, name, f"{incident}:rollback:v40", incident=incident, proposal=proposal, toRevision="v40"
    )
    third = command(commands.RESTART, name, f"{incident}:restart", incident=incident, proposal=proposal, rolling=True)
    target.reject.add(second["idempotencyKey"])
    for kind, value in ((commands.SCALE, first), (commands.ROLLBACK, second), (commands.RESTART, third)):
        produce_command(stack, serde, topics[0], kind, value)
    with executor_loop(settings, target, topics, group=f"it-exec-{uuid.uuid4().hex[:8]}") as (loop, _):
        drain(loop, 3)

    assert [k for k, _ in target.applied] == [first["idempotencyKey"], first["idempotencyKey"] + ":compensate"]
    assert target.service(f"production/{name}")["replicas"] == 4  # back where it was
    reported = facts(stack, serde, incident)
    assert [t for t, _ in reported] == [
        "RecoveryExecuted",  # step 1
        "CommandFailed",  # step 2, refused by the target
        "RecoveryExecuted",  # step 1 undone
        "CompensationCompleted",
        "CommandFailed",  # step 3 arrives for a proposal that is no longer open
    ]
    failed, undone, completed, refused = (v for _, v in reported[1:])
    assert (failed["errorClass"], failed["retryable"]) == ("TargetRejected", False)
    assert str(undone["compensates"]) == first["commandId"]
    assert undone["idempotencyKey"] == first["idempotencyKey"] + ":compensate"
    # under the lease step 1 ran under (its batch holds the row on) or a newer one, never an older
    assert undone["fencingEpoch"] >= reported[0][1]["fencingEpoch"]
    assert [str(c) for c in completed["compensatedCommandIds"]] == [first["commandId"]]
    assert str(completed["causeEventId"]) == str(failed["eventId"])
    assert refused["errorClass"] == "ProposalAborted"
    # each compensation has its own execution row, under its own key
    row = execution(pool, first["idempotencyKey"] + ":compensate")
    assert row is not None and row.state is State.APPLIED and row.compensates == first["commandId"]


def test_recovery_failed_compensates_completed_steps_in_reverse_order(
    stack: StackSettings,
    serde: AvroSerde,
    settings: ExecutorSettings,
    target: FakeTarget,
    topics: tuple[str, str],
) -> None:
    name, incident, proposal = resource_name(), f"incident-{uuid.uuid4().hex[:8]}", str(uuid.uuid4())
    steps = [
        (commands.SCALE, command(commands.SCALE, name, f"{incident}:scale:12", replicas=12)),
        (
            commands.FAILOVER,
            command(commands.FAILOVER, name, f"{incident}:failover", dependency="db", toTarget="db-replica"),
        ),
        (commands.RESTART, command(commands.RESTART, name, f"{incident}:restart", rolling=True)),
    ]
    for kind, value in steps:
        value.update(incidentId=incident, proposalId=proposal)
        produce_command(stack, serde, topics[0], kind, value)
    group = f"it-exec-{uuid.uuid4().hex[:8]}"
    with executor_loop(settings, target, topics, group=group) as (loop, _):
        drain(loop, 3)
        failure = produce_fact(
            stack,
            serde,
            topics[1],
            RecoveryFailed.TYPE,
            {
                "incidentId": incident,
                "proposalId": proposal,
                "stage": "VERIFICATION",
                "reason": "p95 still above the threshold",
                "failedCommandId": None,
                "p95LatencyMs": 1700.0,
                "compensationRequired": True,
                "failedAt": datetime.now(UTC).replace(microsecond=0),
            },
        )
        drain(loop, 1)
        produce_fact(  # delivered again under a new id: the saga is closed, nothing happens
            stack,
            serde,
            topics[1],
            RecoveryFailed.TYPE,
            {
                "incidentId": incident,
                "proposalId": proposal,
                "stage": "VERIFICATION",
                "reason": "p95 still above the threshold",
                "compensationRequired": True,
                "failedAt": datetime.now(UTC).replace(microsecond=0),
            },
        )
        drain(loop, 1)

    keys = [k for k, _ in target.applied]
    assert keys[3:] == [f"{incident}:failover:compensate", f"{incident}:scale:12:compensate"]
    svc = target.service(f"production/{name}")
    assert (svc["replicas"], svc["active"]["db"]) == (4, "db")
    reported = facts(stack, serde, incident)
    assert [t for t, _ in reported] == ["RecoveryExecuted"] * 5 + ["CompensationCompleted"]
    ids = {v["idempotencyKey"]: str(v["commandId"]) for _, v in reported[:3]}
    completed = reported[-1][1]
    assert [str(c) for c in completed["compensatedCommandIds"]] == [
        ids[f"{incident}:failover"],
        ids[f"{incident}:scale:12"],
    ]
    assert str(completed["causeEventId"]) == failure.id
    assert "restart of" in completed["summary"] and "nothing to undo" in completed["summary"]


# ------------------------------------------------------------------ the real sim


SIM_ACTION_TOKEN = "executor-integration-sim-token"


@pytest.fixture()
def sim() -> Iterator[str]:
    """``python -m services.sim`` on a free port; its URL."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {
        **os.environ,
        "FLOTILLA_SIM_PORT": str(port),
        "FLOTILLA_SIM_ACTION_SECONDS": "0.05",
        "FLOTILLA_SIM_ACTION_TOKEN": SIM_ACTION_TOKEN,
    }
    proc = subprocess.Popen([sys.executable, "-m", "services.sim"], env=env, stdout=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, "the sim exited"
            try:
                if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "the sim did not come up"
            time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=15)


def test_against_the_sim_a_failed_step_is_compensated_and_stale_tokens_are_refused(
    stack: StackSettings,
    serde: AvroSerde,
    settings: ExecutorSettings,
    pool: ConnectionPool[Any],
    topics: tuple[str, str],
    sim: str,
) -> None:
    incident, proposal = f"incident-{uuid.uuid4().hex[:8]}", str(uuid.uuid4())
    scale = command(commands.SCALE, "checkout-api", f"{incident}:scale:12", incident=incident, proposal=proposal)
    scale["replicas"] = 12
    rollback = command(  # the sim can only roll checkout-api back to v40: refused
        commands.ROLLBACK, "checkout-api", f"{incident}:rollback:v39", incident=incident, proposal=proposal
    )
    rollback["toRevision"] = "v39"
    produce_command(stack, serde, topics[0], commands.SCALE, scale)
    produce_command(stack, serde, topics[0], commands.SCALE, scale, event_id=str(uuid.uuid4()))  # re-sent
    produce_command(stack, serde, topics[0], commands.ROLLBACK, rollback)
    with (
        SimTarget(sim, SIM_ACTION_TOKEN) as target,
        executor_loop(settings, target, topics, group=f"it-exec-{uuid.uuid4().hex[:8]}") as (loop, _),
    ):
        drain(loop, 3)
        reported = facts(stack, serde, incident)
        assert [t for t, _ in reported] == [
            "RecoveryExecuted",
            "CommandFailed",
            "RecoveryExecuted",
            "CompensationCompleted",
        ]
        assert reported[0][1]["outcome"].startswith("checkout-api scaled from 4 to 12 replicas (p95 ")
        assert reported[1][1]["errorClass"] == "TargetRejected"
        assert reported[2][1]["outcome"].startswith(
            f"Compensation of {incident}:scale:12: checkout-api scaled from 12 to 4 replicas"
        )
        assert httpx.get(f"{sim}/services/checkout-api").json()["replicas"] == 4
        applied = target.lookup(f"{incident}:scale:12")
        assert applied is not None and applied.after["replicas"] == 12 and not applied.replayed

        lease = lease_of(pool, "production/checkout-api")
        assert lease is not None
        with pytest.raises(StaleFencingToken) as stale:
            target.apply("scale", "production/checkout-api", {"replicas": 5}, f"{incident}:late", lease.epoch - 1, "x")
        assert stale.value.newest == lease.epoch
        assert target.lookup(f"{incident}:late") is None


def test_an_undo_that_fails_stops_the_compensation_and_escalates(
    stack: StackSettings,
    serde: AvroSerde,
    settings: ExecutorSettings,
    target: FakeTarget,
    topics: tuple[str, str],
) -> None:
    name, incident, proposal = resource_name(), f"incident-{uuid.uuid4().hex[:8]}", str(uuid.uuid4())
    scale = command(commands.SCALE, name, f"{incident}:scale:12", incident=incident, proposal=proposal, replicas=12)
    restart = command(commands.RESTART, name, f"{incident}:restart", incident=incident, proposal=proposal, rolling=True)
    rollback = command(
        commands.ROLLBACK, name, f"{incident}:rollback:v40", incident=incident, proposal=proposal, toRevision="v40"
    )
    target.reject |= {rollback["idempotencyKey"], scale["idempotencyKey"] + ":compensate"}
    for kind, value in ((commands.SCALE, scale), (commands.RESTART, restart), (commands.ROLLBACK, rollback)):
        produce_command(stack, serde, topics[0], kind, value)
    with executor_loop(settings, target, topics, group=f"it-exec-{uuid.uuid4().hex[:8]}") as (loop, _):
        drain(loop, 3)

    reported = facts(stack, serde, incident)
    assert [t for t, _ in reported] == [
        "RecoveryExecuted",
        "RecoveryExecuted",
        "CommandFailed",  # the rollback
        "CommandFailed",  # undoing the scale (the restart had nothing to undo)
        "IncidentEscalated",
    ]
    undo_failed, escalated = reported[3][1], reported[4][1]
    assert str(undo_failed["compensates"]) == scale["commandId"]
    assert undo_failed["idempotencyKey"] == scale["idempotencyKey"] + ":compensate"
    assert str(escalated["causeEventId"]) == str(undo_failed["eventId"])
    assert escalated["causeType"] == CommandFailed.TYPE and escalated["escalatedTo"] == "on-call"
    assert f"Left as they are: {incident}:scale:12" in escalated["reason"]
    assert target.service(f"production/{name}")["replicas"] == 12  # left for a person


def test_a_verified_recovery_is_no_longer_compensated(
    stack: StackSettings,
    serde: AvroSerde,
    settings: ExecutorSettings,
    target: FakeTarget,
    topics: tuple[str, str],
) -> None:
    name, incident, proposal = resource_name(), f"incident-{uuid.uuid4().hex[:8]}", str(uuid.uuid4())
    scale = command(commands.SCALE, name, f"{incident}:scale:12", incident=incident, proposal=proposal, replicas=12)
    produce_command(stack, serde, topics[0], commands.SCALE, scale)
    now = datetime.now(UTC).replace(microsecond=0)
    with executor_loop(settings, target, topics, group=f"it-exec-{uuid.uuid4().hex[:8]}") as (loop, _):
        drain(loop, 1)
        produce_fact(
            stack,
            serde,
            topics[1],
            RecoveryCompleted.TYPE,
            {
                "incidentId": incident,
                "proposalId": proposal,
                "service": name,
                "p95LatencyMs": 420.0,
                "thresholdMs": 500.0,
                "windowSeconds": 60,
                "completedAt": now,
            },
        )
        produce_fact(  # a late, contradicting verdict: the executor's saga is closed
            stack,
            serde,
            topics[1],
            RecoveryFailed.TYPE,
            {
                "incidentId": incident,
                "proposalId": proposal,
                "stage": "VERIFICATION",
                "reason": "late",
                "compensationRequired": True,
                "failedAt": now,
            },
        )
        drain(loop, 2)
    assert [k for k, _ in target.applied] == [scale["idempotencyKey"]]
    assert [t for t, _ in facts(stack, serde, incident)] == ["RecoveryExecuted"]


# ------------------------------------------------- attacks on the executor's authority


def dead_letters(stack: StackSettings, topic: str, expected: int) -> list[dict[str, str]]:
    """The context headers of the first ``expected`` letters on ``<topic>.dlq``."""
    from confluent_kafka import Consumer

    reader = Consumer(
        {"bootstrap.servers": stack.kafka_bootstrap, "group.id": f"dlq-{uuid.uuid4()}", "auto.offset.reset": "earliest"}
    )
    reader.subscribe([f"{topic}.dlq"])
    letters: list[dict[str, str]] = []
    deadline = time.monotonic() + 30
    try:
        while len(letters) < expected and time.monotonic() < deadline:
            msg = reader.poll(0.2)
            if msg is not None and not msg.error():
                letters.append({k: (v or b"").decode(errors="replace") for k, v in msg.headers() or []})
    finally:
        reader.close()
    assert len(letters) == expected, letters
    return letters


def test_commands_the_policy_service_did_not_sign_are_refused_before_any_lease(
    stack: StackSettings,
    serde: AvroSerde,
    settings: ExecutorSettings,
    pool: ConnectionPool[Any],
    target: FakeTarget,
    topics: tuple[str, str],
) -> None:
    """A forged command (unsigned), one signed by a key nobody trusts, and a genuine one
    changed after signing: nothing reaches the target, no lease is taken, each is reported
    (CommandRejected) and dead-lettered as unauthorized; redelivered, none is reported twice."""
    name, incident = resource_name(), f"incident-{uuid.uuid4().hex[:8]}"
    rogue = Signer(Ed25519PrivateKey.generate())
    unsigned = command(commands.SCALE, name, f"{incident}:a", incident=incident, replicas=21)
    foreign = sign_command(command(commands.SCALE, name, f"{incident}:b", incident=incident, replicas=21), signer=rogue)
    genuine = sign_command(command(commands.SCALE, name, f"{incident}:c", incident=incident, replicas=8))
    tampered = {**genuine, "replicas": 20}
    sent = [
        produce_command(stack, serde, topics[0], commands.SCALE, unsigned, signer=None),
        produce_command(stack, serde, topics[0], commands.SCALE, foreign),
        produce_command(stack, serde, topics[0], commands.SCALE, tampered),
    ]
    produce_command(stack, serde, topics[0], commands.SCALE, unsigned, signer=None)  # redelivered
    with executor_loop(settings, target, topics, group=f"it-exec-{uuid.uuid4().hex[:8]}") as (loop, _):
        drain(loop, 4)

    assert target.applied == [] and target.lookups == []
    assert lease_of(pool, f"production/{name}") is None
    assert all(execution(pool, v["idempotencyKey"]) is None for v in (unsigned, foreign, tampered))
    reported = facts(stack, serde, incident)
    assert [t for t, _ in reported] == ["CommandRejected"] * 3  # the redelivery reported nothing new
    refusals = {str(v["commandId"]): v for _, v in reported}
    assert refusals[unsigned["commandId"]]["refusal"] == "unsigned"
    assert refusals[foreign["commandId"]]["refusal"] == "unknown-key"
    assert refusals[foreign["commandId"]]["keyId"] == rogue.key_id
    assert refusals[tampered["commandId"]]["refusal"] == "bad-signature"
    assert {v["producer"] for v in refusals.values()} == {POLICY}  # what the record claimed
    letters = dead_letters(stack, topics[0], 4)
    assert {h["dlq_reason"] for h in letters} == {"unauthorized"}
    assert {h["ce_id"] for h in letters} == {e.id for e in sent}


def test_a_refused_command_re_queued_once_its_key_is_trusted_runs_once(
    stack: StackSettings,
    serde: AvroSerde,
    settings: ExecutorSettings,
    pool: ConnectionPool[Any],
    target: FakeTarget,
    topics: tuple[str, str],
) -> None:
    """A refusal holds no dedupe claim: after a key rotation was rolled out in the wrong
    order, the re-queued command (same event id) is judged again, and runs."""
    name, incident = resource_name(), f"incident-{uuid.uuid4().hex[:8]}"
    new_key = Signer(Ed25519PrivateKey.generate())
    value = sign_command(
        command(commands.SCALE, name, f"{incident}:scale:9", incident=incident, replicas=9), signer=new_key
    )
    envelope = produce_command(stack, serde, topics[0], commands.SCALE, value)
    with executor_loop(settings, target, topics, group=f"it-exec-{uuid.uuid4().hex[:8]}") as (loop, _):
        drain(loop, 1)
    assert target.applied == []
    rotated = settings.model_copy(update={"authorization_public_keys": [public(POLICY_SIGNER), public(new_key)]})
    produce_command(stack, serde, topics[0], commands.SCALE, value, event_id=envelope.id)  # the re-queued copy
    with executor_loop(rotated, target, topics, group=f"it-exec-{uuid.uuid4().hex[:8]}") as (loop, _):
        drain(loop, 2)
    assert [k for k, _ in target.applied] == [value["idempotencyKey"]]
    assert [t for t, _ in facts(stack, serde, incident)] == ["CommandRejected", "RecoveryExecuted"]


def test_a_different_command_reusing_an_executed_key_is_refused_naming_both(
    stack: StackSettings,
    serde: AvroSerde,
    settings: ExecutorSettings,
    pool: ConnectionPool[Any],
    target: FakeTarget,
    topics: tuple[str, str],
) -> None:
    """Never dropped as a replay: the second command is CommandFailed(KeyConflict), and it
    never reaches the target."""
    name, incident = resource_name(), f"incident-{uuid.uuid4().hex[:8]}"
    key = f"{incident}:scale:12"
    first = command(commands.SCALE, name, key, incident=incident, replicas=12)
    second = command(commands.SCALE, name, key, incident=incident, replicas=16)
    produce_command(stack, serde, topics[0], commands.SCALE, first)
    produce_command(stack, serde, topics[0], commands.SCALE, second)
    with executor_loop(settings, target, topics, group=f"it-exec-{uuid.uuid4().hex[:8]}") as (loop, _):
        drain(loop, 2)
    assert [k for k, _ in target.applied] == [key]  # the first only
    reported = facts(stack, serde, incident)
    # the second's proposal had carried out nothing: its saga ends with nothing undone
    assert [t for t, _ in reported] == ["RecoveryExecuted", "CommandFailed", "CompensationCompleted"]
    assert reported[2][1]["compensatedCommandIds"] == [] and str(reported[2][1]["proposalId"]) == second["proposalId"]
    failed = reported[1][1]
    assert failed["errorClass"] == "KeyConflict" and failed["retryable"] is False
    assert str(failed["commandId"]) == second["commandId"]
    assert first["commandId"] in failed["errorMessage"] and second["commandId"] in failed["errorMessage"]
    row = execution(pool, key)
    assert row is not None and row.command_id == first["commandId"] and row.state is State.APPLIED


# ------------------------------------------------------------------ slow targets


def test_an_action_slower_than_the_lease_keeps_its_lease_and_is_reported_once(
    stack: StackSettings,
    serde: AvroSerde,
    settings: ExecutorSettings,
    pool: ConnectionPool[Any],
    target: FakeTarget,
    topics: tuple[str, str],
) -> None:
    """A 2 s lease (and so a 2 s idle-in-transaction bound on the handler) and a 5 s action:
    the heartbeat renews the lease and keeps the transaction busy, nobody can take the
    resource over meanwhile, and the action is applied and reported once, not retried
    into a livelock with ever newer epochs."""
    short = settings.model_copy(update={"executor_lease_ttl_seconds": 2.0})
    name, incident = resource_name(), f"incident-{uuid.uuid4().hex[:8]}"
    value = command(commands.SCALE, name, f"{incident}:scale:12", incident=incident, replicas=12)
    produce_command(stack, serde, topics[0], commands.SCALE, value)
    target.delay = 5.0
    taken_over: list[leases.Lease | None] = []

    def standby_tries() -> None:  # another executor, while the action runs
        time.sleep(3.5)
        with pool.connection() as conn, conn.transaction():
            taken_over.append(leases.acquire(conn, f"production/{name}", "it-executor-b", 2.0))

    threading.Thread(target=standby_tries, daemon=True).start()
    with executor_loop(short, target, topics, group=f"it-exec-{uuid.uuid4().hex[:8]}") as (loop, _):
        drain(loop, 1, timeout=60)
    assert taken_over == [None]  # the lease was live throughout
    lease = lease_of(pool, f"production/{name}")
    assert lease is not None and lease.epoch == 1 and lease.holder == short.executor_id
    assert target.applied == [(value["idempotencyKey"], 1)]
    assert [t for t, _ in facts(stack, serde, incident)] == ["RecoveryExecuted"]
    row = execution(pool, value["idempotencyKey"])
    assert row is not None and row.state is State.APPLIED and row.attempts == 1


def test_an_action_whose_answer_is_lost_is_looked_up_before_it_is_called_failed(
    stack: StackSettings,
    serde: AvroSerde,
    settings: ExecutorSettings,
    pool: ConnectionPool[Any],
    target: FakeTarget,
    topics: tuple[str, str],
) -> None:
    """The target acted but every answer was lost (timeouts after the fact): the executor
    asks the target by key before it reports anything, and reports what happened."""
    name, incident = resource_name(), f"incident-{uuid.uuid4().hex[:8]}"
    value = command(commands.SCALE, name, f"{incident}:scale:7", incident=incident, replicas=7)
    produce_command(stack, serde, topics[0], commands.SCALE, value)
    target.lost_answers = 3  # every attempt of the step
    with executor_loop(settings, target, topics, group=f"it-exec-{uuid.uuid4().hex[:8]}") as (loop, _):
        drain(loop, 1)
    assert [k for k, _ in target.applied] == [value["idempotencyKey"]]
    assert value["idempotencyKey"] in target.lookups
    reported = facts(stack, serde, incident)
    assert [t for t, _ in reported] == ["RecoveryExecuted"]
    assert "found applied at the target" in reported[0][1]["outcome"]
