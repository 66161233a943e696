"""Carrying out one step against the target, correct under a crash at any point.

Transaction boundaries — the one design decision everything else follows from:

The consumer loop runs a handler inside a database transaction and commits the outbox
record together with the handler's writes. An action at the target cannot join that
transaction. If the PENDING row and the lease epoch were written in it, a crash after
the target call would roll them back: the redelivered command would find no trace of
the first attempt, and the epoch the target already saw could be handed out again. So
:class:`Session` writes them in a *separate short transaction* on a connection of its
own from the service's pool, and commits it *before* calling the target:

1. short transaction: take (or renew) the resource's lease — a new epoch — and mark the
   idempotency key PENDING under that epoch; commit;
2. call the target with the epoch as fencing token (an in-doubt key is first looked up);
3. the handler's transaction: release the lease fenced on its epoch (``UPDATE ...
   WHERE resource AND epoch``, which fails if a newer holder took over and otherwise
   locks the row until commit), settle the key APPLIED/FAILED under the same epoch,
   write the saga step and the outbox record; the loop commits, then the Kafka offset.

A crash before 1 commits leaves nothing; between 1 and 3 it leaves a PENDING row, and
the redelivered command looks the key up at the target and records what happened
(applied → APPLIED + RecoveryExecuted; not applied → apply now, with a newer epoch). The
target sees the key at most once either way, because it keeps its own ledger by key.

Why not a second transaction for step 3 as well? Because the outcome and the record
announcing it must commit together (principle 2); the loop's transaction is the only
one that also holds the dedupe claim and the outbox.

The consequence for the handler: it must not hold a lock that a later short transaction
of the same handler needs, or it would wait on itself. So every fenced write goes in
:meth:`Session.record`, called once at the end of the handler; until then the
handler's transaction only reads (and locks saga rows, which short transactions never
touch). Short transactions also set ``lock_timeout`` so that a mistake here shows as an
error, not a hang.

Batches: the loop runs many records in one transaction (and, after a failure, each in a
savepoint of one), so a record's release keeps its lease row locked until the batch
commits, and the next command for that resource in the batch cannot take the lease in a
short transaction: it would wait on its own batch. It does not need to: the lease is
still ours while the row is locked, at an epoch that was committed when it was acquired.
The sessions of one handler transaction share a :class:`HandlerTransaction` naming the
leases it released; a session holds such a lease again by its row lock
(:func:`leases.relock`) and goes on under the same epoch, with only its PENDING row in a
short transaction. If that same record is retried in the batch (a savepoint rolled
back), its key is PENDING under that epoch already: :func:`idempotency.begin` re-stamps
it for the same holder, in doubt, so it is looked up before anything is called again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeVar

import psycopg
from prometheus_client import Counter
from psycopg_pool import ConnectionPool

from flotilla import tracing
from services.executor import idempotency, leases
from services.executor.commands import Step
from services.executor.idempotency import Begun, Execution, State
from services.executor.leases import Lease, LeaseUnavailable
from services.executor.targets import ActionResult, ActionTarget, StaleFencingToken, TargetRejected, TargetUnavailable

log = logging.getLogger(__name__)

T = TypeVar("T")

ACTIONS = Counter(
    "flotilla_executor_actions_total",
    "Steps the executor finished, by action and outcome (applied, reconciled, replayed, or the error class).",
    ["action", "outcome"],
)

SHORT_TX_LOCK_TIMEOUT = "5s"

# errorClass values of CommandFailed
COMMAND_EXPIRED = "CommandExpired"
LEASE_UNAVAILABLE = "LeaseUnavailable"
STALE_FENCING_TOKEN = "StaleFencingToken"
TARGET_REJECTED = "TargetRejected"
TARGET_UNAVAILABLE = "TargetUnavailable"
PROPOSAL_ABORTED = "ProposalAborted"
KEY_CONFLICT = "KeyConflict"


@dataclass(frozen=True)
class Applied:
    """The step's effect is in place at the target (applied now, or found applied)."""

    step: Step
    epoch: int
    before: Mapping[str, Any]
    after: Mapping[str, Any]
    duration_ms: int
    reconciled: bool = False  # found already applied (lookup after a crash, or a replay at the target)


@dataclass(frozen=True)
class Failed:
    """The step was not carried out; ``retryable`` says whether the same step may succeed later."""

    step: Step
    error_class: str
    message: str
    retryable: bool
    epoch: int | None = None
    attempt: int = 1


@dataclass(frozen=True)
class Replayed:
    """The key was settled before: its recorded outcome, and nothing new to report."""

    step: Step
    execution: Execution


Outcome = Applied | Failed | Replayed


@dataclass(frozen=True)
class ExecutorConfig:
    holder: str  # lease holder id, e.g. host-pid
    lease_ttl_seconds: float = 15.0
    lease_wait_seconds: float = 20.0  # how long a step waits for another holder's lease to expire
    target_attempts: int = 3  # calls per step while the target is unavailable
    target_backoff_seconds: float = 0.5  # before the 2nd call; doubles after
    # No call to the target starts later than this after the step's first call: with the
    # heartbeat a slow action may take as long as it takes, but a step's retries end.
    action_timeout_seconds: float = 120.0

    @property
    def heartbeat_seconds(self) -> float:
        """How often a running action renews its lease and touches its handler's transaction."""
        return max(0.05, self.lease_ttl_seconds / 3)


@dataclass(frozen=True)
class _Settlement:
    key: str
    lease: Lease
    state: State
    result: Mapping[str, Any] | None = None
    error_class: str | None = None
    error_message: str | None = None
    retryable: bool = False


@dataclass
class HandlerTransaction:
    """The handler transaction open now, as this executor's sessions share it: the leases
    it has released so far, whose rows it keeps locked until it ends (see the module doc)."""

    xid: str
    released: dict[str, Lease] = field(default_factory=dict)


class Executor:
    """Runs steps against one target under per-resource leases, for one holder id."""

    def __init__(
        self,
        pool: ConnectionPool[Any],
        target: ActionTarget,
        config: ExecutorConfig,
        *,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.pool = pool
        self.target = target
        self.config = config
        self.sleep = sleep
        self._open = threading.local()  # .transaction: the handler transaction open on this thread

    def session(self, transaction: HandlerTransaction | None = None) -> Session:
        """A fresh session for one handler run, sharing ``transaction`` with the other
        records of its batch (what :meth:`bound_handler_transaction` returned)."""
        return Session(self, transaction or HandlerTransaction(xid=""))

    def bound_handler_transaction(self, conn: psycopg.Connection[Any]) -> HandlerTransaction:
        """Let PostgreSQL end the handler's transaction if this process stalls in it.

        The handler's transaction stays open while the target acts, holding the record's
        dedupe claim and the saga rows. An executor paused there (SIGSTOP, a long GC, a
        frozen VM) would keep them locked forever, and the executor that takes over its
        partition would block on the same claim. So the transaction may sit idle no longer
        than a lease lives: by the time the lease can be taken over, its locks are gone too.

        Returns the transaction as the sessions of its records share it: the same object for
        every record of one transaction (a loop thread runs them one after another), a new one
        for the next.
        """
        timeout_ms = max(1000, int(self.config.lease_ttl_seconds * 1000))
        row = conn.execute(
            "SELECT set_config('idle_in_transaction_session_timeout', %s, true), pg_current_xact_id()::text",
            (str(timeout_ms),),
        ).fetchone()
        assert row is not None
        transaction: HandlerTransaction | None = getattr(self._open, "transaction", None)
        if transaction is None or transaction.xid != row[1]:
            transaction = self._open.transaction = HandlerTransaction(xid=row[1])
        return transaction

    @contextmanager
    def short_transaction(self) -> Iterator[psycopg.Connection[Any]]:
        """A transaction of its own on a pool connection, committed on exit."""
        with self.pool.connection() as conn, conn.transaction():
            conn.execute(f"SET LOCAL lock_timeout = '{SHORT_TX_LOCK_TIMEOUT}'")
            yield conn


class Heartbeat:
    """While the target acts, keep the action's lease and its handler's transaction alive.

    An action slower than the lease would otherwise lose it (a standby would take the
    resource over with a newer epoch and the first call would be fenced out when it
    finished), and its handler's transaction — bounded by
    ``idle_in_transaction_session_timeout`` = the lease TTL so a frozen executor cannot hold
    its locks forever — would be ended by PostgreSQL while it waits. So every third of a
    TTL a thread renews the lease (same epoch) and runs ``SELECT 1`` in the handler's
    transaction. A frozen process freezes this thread too: then the lease expires and the
    transaction ends exactly as before. A renewal that finds the lease taken over stops
    the heartbeat; recording the outcome then fails on the epoch (LeaseLost), as it must.
    """

    def __init__(
        self,
        executor: Executor,
        lease: Lease,
        handler_conn: psycopg.Connection[Any] | None,
        *,
        renew: bool = True,  # False: the handler's transaction holds the lease row locked
    ) -> None:
        self._x = executor
        self._lease = lease
        self._conn = handler_conn
        self._renew = renew
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name=f"heartbeat {lease.resource}", daemon=True)
        self.beats = 0
        self.lost = False

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _beat(self) -> None:
        while not self._stop.wait(self._x.config.heartbeat_seconds):
            try:
                if self._renew:
                    with self._x.short_transaction() as short:
                        self._lease = leases.renew(short, self._lease, self._x.config.lease_ttl_seconds)
                if self._conn is not None:
                    self._conn.execute("SELECT 1")
                self.beats += 1
            except leases.LeaseLost:
                self.lost = True
                log.warning("lease on %s was taken over while its action ran", self._lease.resource)
                return
            except Exception:  # the next beat tries again; the lease has TTL/3 * 2 to spare
                log.exception("heartbeat of %s failed", self._lease.resource)


class Session:
    """The steps of one handler run: the leases they hold and the outcomes to record.

    ``run`` each step (leases and PENDING rows commit as it goes, the target is called),
    emit what the outcomes say, then ``record`` once in the handler's transaction.
    """

    def __init__(self, executor: Executor, transaction: HandlerTransaction) -> None:
        self._x = executor
        self._transaction = transaction
        self._held: dict[str, Lease] = {}
        self._locked: set[str] = set()  # held by the handler transaction's row lock, not by expiry
        self._settlements: list[_Settlement] = []
        self._recorded = False

    # ------------------------------------------------------------------ running

    def run(self, conn: psycopg.Connection[Any], step: Step, now: datetime) -> Outcome:
        """Carry out ``step`` once: replay, refuse, reconcile, or apply. ``conn`` (the
        handler's transaction) is only read here."""
        recorded = idempotency.find(conn, step.idempotency_key)
        if recorded is not None and recorded.settled:
            _tally(step, "replayed")
            return Replayed(step, recorded)
        if recorded is None and step.expired(now):
            _tally(step, COMMAND_EXPIRED)
            return Failed(step, COMMAND_EXPIRED, _expired(step), retryable=False)

        started = self.begin(step, handler_conn=conn)
        if started is None:
            if recorded is not None:
                # An earlier attempt may have acted: no failure can be reported truthfully
                # until the key is looked up under the lease; let the loop retry.
                raise LeaseUnavailable(f"{step.resource} is leased to another holder; {step.idempotency_key} in doubt")
            message = f"{step.resource} stayed leased to another executor for {self._x.config.lease_wait_seconds:g} s"
            _tally(step, LEASE_UNAVAILABLE)
            return Failed(step, LEASE_UNAVAILABLE, message, retryable=True)
        lease, begun = started
        if isinstance(begun, Execution):  # settled by someone else since we looked
            _tally(step, "replayed")
            return Replayed(step, begun)
        return self.act(step, lease, begun, now, handler_conn=conn)

    def begin(
        self, step: Step, handler_conn: psycopg.Connection[Any] | None = None
    ) -> tuple[Lease, Begun | Execution] | None:
        """Step 1: lease (new epoch, ours renewed, or one this handler transaction released
        held again by its row lock) + PENDING, in a short committed transaction; None if
        another holder's lease did not expire within the wait.

        The wait (a little longer than a lease lives) outlasts the handler transaction's
        idle bound (a lease's life): each failed attempt touches that transaction, as the
        :class:`Heartbeat` does while the target acts, or PostgreSQL would end it and the
        failure could never be reported (the record retried every wait, its partition stuck).
        """
        config = self._x.config
        held = self._held.get(step.resource)
        if held is None and handler_conn is not None:
            held = self._relock(handler_conn, step.resource)

        def attempt() -> tuple[Lease, Begun | Execution] | None:
            with self._x.short_transaction() as short:
                if held is not None and step.resource in self._locked:
                    lease: Lease | None = held  # no one can take it over while our row lock holds
                elif held is not None:
                    lease = leases.renew(short, held, config.lease_ttl_seconds)
                else:
                    lease = leases.acquire(short, step.resource, config.holder, config.lease_ttl_seconds)
                if lease is not None:
                    return lease, idempotency.begin(short, step, lease)
            if handler_conn is not None:
                handler_conn.execute("SELECT 1")
            return None

        started = leases.wait_for(attempt, wait_seconds=config.lease_wait_seconds, sleep=self._x.sleep)
        if started is not None:
            self._held[step.resource] = started[0]
        return started

    def _relock(self, handler_conn: psycopg.Connection[Any], resource: str) -> Lease | None:
        """The lease an earlier record of this transaction released, held again by its row
        lock (:func:`leases.relock`); None if this transaction released none on ``resource``."""
        released = self._transaction.released.get(resource)
        if released is None:
            return None
        lease = leases.relock(handler_conn, released)
        if lease is not None:
            self._held[resource] = lease
            self._locked.add(resource)
        return lease

    def act(
        self,
        step: Step,
        lease: Lease,
        begun: Begun,
        now: datetime,
        *,
        handler_conn: psycopg.Connection[Any] | None = None,
    ) -> Outcome:
        """Step 2: reconcile an in-doubt key, then call the target with the epoch — under
        a :class:`Heartbeat`, however long the target takes."""
        renew = lease.resource not in self._locked
        with Heartbeat(self._x, lease, handler_conn, renew=renew) as heartbeat:
            outcome = self._act(step, lease, begun, now)
        if heartbeat.lost:
            # A newer holder owns the resource: it reconciles the key by lookup; recording
            # here would fail on the epoch anyway, so let the loop retry (redelivery).
            raise leases.fenced_out(f"lease on {step.resource} at epoch {lease.epoch} was taken over mid-action")
        return outcome

    def _act(self, step: Step, lease: Lease, begun: Begun, now: datetime) -> Outcome:
        target, attempt = self._x.target, begun.execution.attempts
        if begun.in_doubt:
            try:
                found = self._call(lambda: target.lookup(step.idempotency_key), lease)
            except TargetUnavailable as exc:
                message = f"cannot tell whether {step.idempotency_key} was applied: {exc}"
                return self._failed(step, lease, TARGET_UNAVAILABLE, message, retryable=True, attempt=attempt)
            if found is not None:
                log.info("%s was applied before a restart; recording it", step.idempotency_key)
                return self._applied(step, lease, found, reconciled=True)
            if step.expired(now):
                return self._failed(step, lease, COMMAND_EXPIRED, _expired(step), retryable=False, attempt=attempt)
        try:
            attributes = {"flotilla.action": step.action, "flotilla.idempotency_key": step.idempotency_key}
            with tracing.child_span(f"{step.action} apply", {**attributes, "flotilla.fencing_token": lease.epoch}):
                result = self._call(
                    lambda: target.apply(
                        step.action,
                        step.resource,
                        step.params,
                        step.idempotency_key,
                        lease.epoch,
                        lease.holder,
                        expected_change=step.expected_change,
                    ),
                    lease,
                )
        except StaleFencingToken as exc:
            leases.FENCING_REJECTIONS.labels("target").inc()
            return self._failed(step, lease, STALE_FENCING_TOKEN, str(exc), retryable=False, attempt=attempt)
        except TargetRejected as exc:
            return self._failed(step, lease, TARGET_REJECTED, str(exc), retryable=False, attempt=attempt)
        except TargetUnavailable as exc:
            # It may have acted all the same (a timeout, a lost answer): ask before saying
            # it failed, so a failure is reported only for an action that did not happen.
            try:
                found = target.lookup(step.idempotency_key)
            except TargetUnavailable:
                found = None
            if found is not None:
                log.info("%s: the target's answer was lost but the action applied; recording it", step.idempotency_key)
                return self._applied(step, lease, found, reconciled=True)
            return self._failed(step, lease, TARGET_UNAVAILABLE, str(exc), retryable=True, attempt=attempt)
        return self._applied(step, lease, result, reconciled=result.replayed)

    def _call(self, call: Callable[[], T], lease: Lease) -> T:
        """``call`` with bounded retries while the target is unavailable — at most
        ``target_attempts``, none starting after ``action_timeout_seconds``; the lease is
        renewed before each retry (LeaseLost ends it: a newer holder owns the resource)."""
        config = self._x.config
        delay = config.target_backoff_seconds
        deadline = time.monotonic() + config.action_timeout_seconds
        for attempt in range(1, config.target_attempts + 1):
            try:
                return call()
            except TargetUnavailable as exc:
                if attempt == config.target_attempts or time.monotonic() + delay >= deadline:
                    raise
                log.warning("target unavailable (attempt %d of %d): %s", attempt, config.target_attempts, exc)
                self._x.sleep(delay)
                delay *= 2
                if lease.resource not in self._locked:
                    with self._x.short_transaction() as short:
                        self._held[lease.resource] = leases.renew(short, lease, config.lease_ttl_seconds)
        raise AssertionError("unreachable")  # pragma: no cover

    # ---------------------------------------------------------------- outcomes

    def _applied(self, step: Step, lease: Lease, result: ActionResult, *, reconciled: bool) -> Applied:
        applied = Applied(step, lease.epoch, result.before, result.after, result.duration_ms, reconciled)
        self._settlements.append(_Settlement(step.idempotency_key, lease, State.APPLIED, result=result.to_json()))
        _tally(step, "reconciled" if reconciled else "applied")
        return applied

    def _failed(
        self, step: Step, lease: Lease, error_class: str, message: str, *, retryable: bool, attempt: int
    ) -> Failed:
        failed = Failed(step, error_class, message, retryable, lease.epoch, attempt)
        self._settlements.append(
            _Settlement(
                step.idempotency_key,
                lease,
                State.FAILED,
                error_class=error_class,
                error_message=message,
                retryable=retryable,
            )
        )
        _tally(step, error_class)
        return failed

    # --------------------------------------------------------------- recording

    def record(self, conn: psycopg.Connection[Any]) -> None:
        """Step 3, in the handler's transaction: release every lease this session holds,
        fenced on its epoch, then settle every outcome under its epoch. Raises LeaseLost
        (and so rolls the whole handler back) if any lease was taken over."""
        if self._recorded:
            raise RuntimeError("a session is recorded once")
        self._recorded = True
        for resource in sorted(self._held):  # one lock order for every executor
            leases.release(conn, self._held[resource])
        self._transaction.released.update(self._held)  # row-locked until the transaction ends
        for s in self._settlements:
            idempotency.settle(
                conn,
                s.key,
                s.lease,
                state=s.state,
                result=s.result,
                error_class=s.error_class,
                error_message=s.error_message,
                retryable=s.retryable,
            )


def _tally(step: Step, outcome: str) -> None:
    ACTIONS.labels(step.action, outcome).inc()


def _expired(step: Step) -> str:
    assert step.expires_at is not None
    return f"command {step.idempotency_key} expired at {step.expires_at.isoformat()}; it was not run"
