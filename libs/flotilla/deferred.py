"""Deferred work: slow calls (a model, a remote read) outside the consumer's transaction.

A handler runs inside its batch's transaction, holding the claims and the incident rows
it locked, and a partition moves only as fast as its slowest record. So a handler that
needs a slow answer does not wait for it: it **defers** the record (:func:`defer`) — one
row in ``deferred_work``, written in the handler's transaction so it commits with the
claim — and the loop moves on. A :class:`Worker` (periodic tasks, one thread each) then

1. takes a due row under a **lease** in a short transaction, and commits: no lock is
   held while the slow call runs;
2. calls ``gather`` with no transaction open;
3. opens a short transaction, re-reads the row (still pending, still its lease), and lets
   ``decide`` write and emit. What it emits is caused by the deferred record, so
   causation, hops and the incident's trace go on as if the handler had emitted it.

While ``gather`` runs, the worker renews the lease every third of it (a heartbeat), so
the lease can be short whatever the call's worst case. A crash between 1 and 3 leaves the
row pending: the lease runs out and another worker runs it again, so ``gather`` must be
safe to repeat (reads and model calls are). Only step 3 writes, and only once: the row
turns ``done`` in the same transaction. A ``gather`` that fails is retried after
``retry_seconds``; at the work's deadline ``give_up`` decides instead (typically:
escalate to a person).

Workers do not poll for work. :func:`defer` also sends a PostgreSQL ``NOTIFY``, which is
delivered only when the handler's transaction commits, so a worker (of any replica) is
woken as the row becomes visible; otherwise a worker sleeps until the next due time it
knows of (a retry, a lease running out), at most ``Worker.idle_seconds``.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import psycopg
from prometheus_client import Counter, Histogram
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from flotilla import tracing
from flotilla.envelope import Envelope
from flotilla.handling import HandlerContext, Incoming
from flotilla.heartbeat import Heartbeat
from flotilla.typedrecord import Record
from flotilla.workflow import IncidentState, WorkflowStore

if TYPE_CHECKING:
    from flotilla.runner import Periodic, ServiceContext

__all__ = ["CHANNEL", "MIGRATION", "Bell", "Finish", "Work", "Worker", "defer"]

log = logging.getLogger(__name__)

T = TypeVar("T")

MIGRATION = """
CREATE TABLE IF NOT EXISTS deferred_work (
    work_id        uuid PRIMARY KEY,
    kind           text NOT NULL,
    incident_id    text NOT NULL,
    contract_topic text NOT NULL,          -- the record's contract (topic of its schema subject)
    topic          text NOT NULL,
    record_type    text NOT NULL,
    payload        bytea NOT NULL,         -- the record's value, Confluent-framed Avro
    envelope       jsonb NOT NULL,         -- its CloudEvents headers
    status         text NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'done', 'abandoned')),
    due_at         timestamptz NOT NULL,
    deadline       timestamptz NOT NULL,
    lease_token    uuid,
    lease_until    timestamptz,
    attempts       integer NOT NULL DEFAULT 0,
    last_error     text,
    outcome        text,
    created_at     timestamptz NOT NULL DEFAULT now(),
    finished_at    timestamptz
);
CREATE INDEX IF NOT EXISTS deferred_work_due ON deferred_work (kind, due_at) WHERE status = 'pending';
"""

# The NOTIFY channel of new deferred work; the payload is its kind.
CHANNEL = "flotilla_deferred_work"

# One row per (kind, record): a record handled again after a rollback defers nothing new.
_NAMESPACE = uuid.UUID("9f5f0c55-3c1e-4b43-9d7a-5b8f3f1e2d10")

WORK_TAKEN = Counter(
    "flotilla_deferred_work_total",
    "Deferred work taken by a worker, by what came of it (done, retry, abandoned, lost-lease).",
    ["service", "kind", "outcome"],
)
GATHER_SECONDS = Histogram(
    "flotilla_deferred_gather_seconds",
    "Time spent in a deferred slow call (no transaction open).",
    ["service", "kind"],
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
)


def defer(ctx: HandlerContext, kind: str, *, contract_topic: str, deadline_seconds: float, due_in: float = 0) -> str:
    """Remember the record being handled as work of ``kind``, in the handler's transaction.

    ``contract_topic`` is the topic of the record's schema subject (``incidents``), which
    can differ from the topic it was read from. Returns the work id.
    """
    incoming = ctx.incoming
    now = datetime.now(UTC)
    work_id = uuid.uuid5(_NAMESPACE, f"{kind}:{incoming.envelope.id}")
    payload = ctx.serde.serialize(contract_topic, incoming.record_type, incoming.value)
    ctx.conn.execute(
        """
        INSERT INTO deferred_work (work_id, kind, incident_id, contract_topic, topic, record_type, payload,
            envelope, due_at, deadline)
        VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)
        ON CONFLICT (work_id) DO NOTHING
        """,
        (
            work_id,
            kind,
            incoming.envelope.correlationid,
            contract_topic,
            incoming.topic,
            incoming.record_type,
            payload,
            Jsonb({k: v.decode() for k, v in incoming.envelope.headers()}),
            now + timedelta(seconds=due_in),
            now + timedelta(seconds=due_in + deadline_seconds),
        ),
    )
    # Delivered at commit (once per kind per transaction): wakes the workers as the row appears,
    # and one not yet due tells them when to look next.
    ctx.conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, kind))
    return str(work_id)


@dataclass(frozen=True)
class Work:
    """A deferred record, as the worker took it."""

    work_id: str
    kind: str
    record: Incoming
    attempts: int  # including this one
    deadline: datetime
    last_error: str | None

    @property
    def incident_id(self) -> str:
        return self.record.envelope.correlationid


class Finish:
    """What ``decide`` and ``give_up`` may touch: the short transaction that finishes the
    work, the incident's state (row-locked), and an outbox caused by the deferred record."""

    def __init__(self, ctx: ServiceContext, conn: psycopg.Connection[Any], work: Work, state: IncidentState) -> None:
        self.conn = conn
        self.work = work
        self.state = state
        self.now = datetime.now(UTC)
        self._ctx = ctx

    @property
    def incoming(self) -> Incoming:
        """The deferred record (as a handler's ``ctx.incoming``)."""
        return self.work.record

    def emit(self, record: Record, *, key: str | None = None, topic: str | None = None) -> Envelope:
        """Append a record caused by the deferred one, in this transaction."""
        return self._ctx.emit(
            self.conn,
            record,
            key=key,
            topic=topic,
            correlation=self.work.incident_id,
            cause=self.work.record.envelope,
        )

    def spend_tokens(self, tokens: int) -> None:
        """Charge model tokens to the incident's budget, as ``HandlerContext.spend_tokens``."""
        WorkflowStore.charge_tokens(self.conn, self.work.incident_id, tokens)


Gather = Callable[["ServiceContext", Work], T]  # the service (its pool for reads, no transaction) and the work
Decide = Callable[[Finish, T], str]  # returns the outcome to record (e.g. the emitted record type)
GiveUp = Callable[[Finish, str], str]  # (finish, last error) -> outcome


class Worker(Generic[T]):
    """Runs the deferred work of one kind: claim under a lease, gather outside any
    transaction, decide in a short one. Register :meth:`run_due` as one periodic task per
    thread wanted (``periodic(n)``)."""

    def __init__(
        self,
        kind: str,
        *,
        gather: Gather[T],
        decide: Decide[T],
        give_up: GiveUp,
        lease_seconds: float,
        retry_seconds: float,
        idle_seconds: float = 5.0,
    ) -> None:
        self.kind = kind
        self._gather = gather
        self._decide = decide
        self._give_up = give_up
        # Renewed every third of itself while ``gather`` runs (flotilla.heartbeat): a live
        # worker keeps its work however slow the call, a killed one loses it this soon.
        self.lease_seconds = lease_seconds
        self.retry_seconds = retry_seconds
        # The longest sleep without a NOTIFY: bounds what a missed one (listener reconnecting) costs.
        self.idle_seconds = idle_seconds
        self.bell = Bell()
        self._listener: threading.Thread | None = None
        self._listener_lock = threading.Lock()

    def periodic(self, threads: int) -> tuple[Periodic, ...]:
        """``threads`` tasks draining this worker's due work (one slow call per thread), each
        run when it is woken (:class:`_WorkPace`), not on an interval."""
        return tuple((_WorkPace(self), self._drain) for _ in range(threads))

    def _drain(self, ctx: ServiceContext) -> None:
        self.run_due(ctx)

    def next_due_seconds(self, ctx: ServiceContext) -> float | None:
        """Seconds until pending work comes due or its lease runs out (0 if some is now); None if none is pending."""
        with ctx.pool.connection() as conn:
            row = conn.execute(
                "SELECT EXTRACT(EPOCH FROM min(greatest(due_at, coalesce(lease_until, due_at))) - now()) "
                "FROM deferred_work WHERE kind = %s AND status = 'pending'",
                (self.kind,),
            ).fetchone()
        return None if row is None or row[0] is None else max(float(row[0]), 0.0)

    def start_listening(self, ctx: ServiceContext) -> None:
        """Start the thread that LISTENs for this kind's new work (the first caller does)."""
        with self._listener_lock:
            if self._listener is None:
                self._listener = threading.Thread(
                    target=_listen, args=(ctx, self.kind, self.bell), name=f"{self.kind}-listener", daemon=True
                )
                self._listener.start()

    def run_due(self, ctx: ServiceContext) -> int:
        """Take and run due work until none is left (or the service stops)."""
        taken = 0
        while not ctx.stopping.is_set() and self.run_one(ctx) is not None:
            taken += 1
        return taken

    def run_one(self, ctx: ServiceContext, now: datetime | None = None) -> str | None:
        """Claim one due piece of work and run it; what came of it, None when none is due."""
        now = now or datetime.now(UTC)
        claimed = self._claim(ctx, now)
        if claimed is None:
            return None
        work, token = claimed
        started = time.perf_counter()
        with tracing.root_span(
            f"{self.kind} deferred",
            {"flotilla.service": ctx.spec.name, "flotilla.incident_id": work.incident_id, "flotilla.work": self.kind},
            parent=work.record.envelope.traceparent,
        ):
            try:
                with Heartbeat(lambda: self._renew(ctx, work, token), self.lease_seconds / 3, f"{self.kind} work"):
                    result = self._gather(ctx, work)
            except Exception as exc:
                error = f"{exc.__class__.__name__}: {exc}"
                log.warning("%s work %s (%s) failed: %s", self.kind, work.work_id, work.incident_id, error)
                outcome = self._failed(ctx, work, token, error, now)
            else:
                outcome = self._finish(ctx, work, token, lambda finish: self._decide(finish, result))
            finally:
                GATHER_SECONDS.labels(ctx.spec.name, self.kind).observe(time.perf_counter() - started)
        WORK_TAKEN.labels(ctx.spec.name, self.kind, _metric_outcome(outcome)).inc()
        return outcome

    # ----------------------------------------------------------------- steps

    def _claim(self, ctx: ServiceContext, now: datetime) -> tuple[Work, str] | None:
        token = str(uuid.uuid4())
        with ctx.pool.connection() as conn, conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
            row = cur.execute(
                """
                UPDATE deferred_work SET lease_token = %(token)s, lease_until = %(until)s, attempts = attempts + 1
                WHERE work_id = (
                    SELECT work_id FROM deferred_work
                    WHERE kind = %(kind)s AND status = 'pending' AND due_at <= %(now)s
                      AND (lease_until IS NULL OR lease_until <= %(now)s)
                    ORDER BY due_at, work_id
                    LIMIT 1
                    FOR UPDATE SKIP LOCKED
                )
                RETURNING work_id::text, kind, contract_topic, topic, record_type, payload, envelope, attempts,
                    deadline, last_error
                """,
                {"token": token, "until": now + timedelta(seconds=self.lease_seconds), "kind": self.kind, "now": now},
            ).fetchone()
        if row is None:
            return None
        envelope = Envelope.from_headers(list(row["envelope"].items()))
        decoded = ctx.serde.deserialize(bytes(row["payload"]), topic=row["contract_topic"])
        record = Incoming(row["topic"], 0, 0, envelope.correlationid, envelope, row["record_type"], decoded.value)
        work = Work(row["work_id"], row["kind"], record, row["attempts"], row["deadline"], row["last_error"])
        return work, token

    def _renew(self, ctx: ServiceContext, work: Work, token: str) -> bool:
        """Move the lease on from now; False if the work is no longer ours."""
        until = datetime.now(UTC) + timedelta(seconds=self.lease_seconds)
        with ctx.pool.connection() as conn:
            held = conn.execute(
                "UPDATE deferred_work SET lease_until = greatest(lease_until, %s) "
                "WHERE work_id = %s AND status = 'pending' AND lease_token = %s RETURNING 1",
                (until, work.work_id, token),
            ).fetchone()
        return held is not None

    def _finish(self, ctx: ServiceContext, work: Work, token: str, step: Callable[[Finish], str]) -> str:
        """Run ``step`` in a short transaction if the work is still ours; mark it finished."""
        with ctx.pool.connection() as conn, conn.transaction():
            held = conn.execute(
                "SELECT 1 FROM deferred_work WHERE work_id = %s AND status = 'pending' AND lease_token = %s FOR UPDATE",
                (work.work_id, token),
            ).fetchone()
            if held is None:
                log.warning("%s work %s: lease lost (slower than %.0f s); its result is dropped",
                            self.kind, work.work_id, self.lease_seconds)  # fmt: skip
                return "lost-lease"
            finish = Finish(ctx, conn, work, WorkflowStore.load_for_update(conn, work.incident_id))
            outcome = step(finish)
            status = "abandoned" if outcome == "abandoned" else "done"
            conn.execute(
                "UPDATE deferred_work SET status = %s, outcome = %s, finished_at = now(), lease_until = NULL "
                "WHERE work_id = %s",
                (status, outcome, work.work_id),
            )
        return outcome

    def _failed(self, ctx: ServiceContext, work: Work, token: str, error: str, now: datetime) -> str:
        if now >= work.deadline:
            return self._finish(ctx, work, token, lambda finish: self._give_up(finish, error))
        with ctx.pool.connection() as conn, conn.transaction():
            conn.execute(
                "UPDATE deferred_work SET due_at = %s, last_error = %s, lease_until = NULL "
                "WHERE work_id = %s AND status = 'pending' AND lease_token = %s",
                (now + timedelta(seconds=self.retry_seconds), error[:2000], work.work_id, token),
            )
        return "retry"


class Bell:
    """Wakes every thread waiting for work. Rings are counted, so a ring between a thread's
    last look for work and its wait is not lost."""

    def __init__(self) -> None:
        self._rang = threading.Condition()
        self._rings = 0

    @property
    def rings(self) -> int:
        with self._rang:
            return self._rings

    def ring(self) -> None:
        with self._rang:
            self._rings += 1
            self._rang.notify_all()

    def wait_past(self, seen: int, timeout: float, stopping: threading.Event | None = None) -> bool:
        """Until it has rung since ``seen`` (True), ``timeout`` passes or ``stopping`` is set."""
        deadline = time.monotonic() + timeout
        with self._rang:
            while self._rings == seen:
                left = deadline - time.monotonic()
                if left <= 0 or (stopping is not None and stopping.is_set()):
                    return False
                # In slices, so a stopping service is not kept waiting.
                self._rang.wait(min(left, 0.5))
            return True


class _WorkPace:
    """One worker thread's pace: at once the first time, then when new work is notified, the
    next pending work comes due, or ``idle_seconds`` pass, whichever is first."""

    def __init__(self, worker: Worker[Any]) -> None:
        self._worker = worker
        self._seen: int | None = None

    def wait(self, ctx: ServiceContext) -> None:
        worker = self._worker
        if self._seen is not None:
            try:
                due = worker.next_due_seconds(ctx)
                sleep = worker.idle_seconds if due is None else min(due, worker.idle_seconds)
            except psycopg.Error as exc:  # PostgreSQL restarting: look again in a second
                log.warning("deferred %s: cannot read when work is due (%s)", worker.kind, exc)
                sleep = 1.0
            worker.bell.wait_past(self._seen, sleep, ctx.stopping)
        else:
            worker.start_listening(ctx)
        # Rings from here on (while the task drains) wake the next wait at once.
        self._seen = worker.bell.rings


def _listen(ctx: ServiceContext, kind: str, bell: Bell) -> None:
    """LISTEN for new work of ``kind`` and ring ``bell``; on a lost connection, reconnect and
    ring once (what was sent meanwhile is not delivered again)."""
    while not ctx.stopping.is_set():
        try:
            with psycopg.connect(ctx.settings.pg_dsn(ctx.spec.database), autocommit=True) as conn:
                conn.execute(f"LISTEN {CHANNEL}")
                bell.ring()
                while not ctx.stopping.is_set():
                    for notice in conn.notifies(timeout=1.0):
                        if notice.payload == kind:
                            bell.ring()
        except psycopg.Error as exc:
            log.warning("deferred %s: listening for new work failed (%s); retrying in 1 s", kind, exc)
            ctx.stopping.wait(1.0)
    bell.ring()  # let waiting threads see the service stop


def _metric_outcome(outcome: str) -> str:
    """Bounded label values: the fixed outcomes, else 'done' (decide returned a record type)."""
    return outcome if outcome in ("retry", "abandoned", "lost-lease") else "done"
