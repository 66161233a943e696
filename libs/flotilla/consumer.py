"""The consumer loop every Flotilla service runs: boring, idempotent, never blocked.

For each record of a poll batch, inside one database transaction (a savepoint per
record):

1. read the CloudEvents envelope; a record whose hop budget is spent is dropped and
   reported (metric + LoopTerminated), never handled;
2. decode the value through the registry;
3. dedupe on (consumer, event id) — a redelivered record has no second effect;
4. ask the incident workflow whether it accepts the record in the incident's current
   state — a stale or out-of-order record is recorded and skipped;
5. run the handler, which changes state and appends outgoing records to the outbox;
6. advance the workflow state and the per-incident budgets.

The transaction commits, then the Kafka offsets are committed — never before, so a
crash in between means redelivery, which step 3 absorbs. A record that cannot be
decoded, breaks a business rule, or keeps failing after bounded retries goes to
``<topic>.dlq`` with context headers (made durable before the commit) and the loop
moves on: poison never blocks a partition.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from types import FrameType
from typing import Any

import psycopg
from confluent_kafka import Consumer, KafkaError, Message, TopicPartition
from psycopg_pool import ConnectionPool

from flotilla import metrics
from flotilla.deadletter import DeadLetter, DeadLetterPublisher, Reason
from flotilla.envelope import Envelope
from flotilla.outbox import Outbox
from flotilla.serde import AvroSerde, SerdeError, UndecodableRecordError, UnknownSchemaIdError
from flotilla.settings import StackSettings
from flotilla.workflow import (
    BudgetOverrun,
    Budgets,
    IncidentState,
    Status,
    WorkflowStore,
    accepts,
    is_workflow_record,
    overrun,
    transition,
)

log = logging.getLogger(__name__)

LOOP_TERMINATED = "dev.flotilla.incidents.LoopTerminated"
BUDGET_EXCEEDED = "dev.flotilla.incidents.BudgetExceeded"
INCIDENT_ESCALATED = "dev.flotilla.incidents.IncidentEscalated"
REPORT_TOPIC = "incidents"
ESCALATION_TARGET = "on-call"  # who an escalated incident is routed to

CONSUMER_MIGRATION = """
CREATE TABLE IF NOT EXISTS processed_events (
    consumer     text        NOT NULL,
    event_id     text        NOT NULL,
    record_type  text        NOT NULL,
    outcome      text        NOT NULL,
    topic        text,
    partition    integer,
    "offset"     bigint,
    processed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, event_id)
);
CREATE TABLE IF NOT EXISTS stale_transitions (
    id          bigserial   PRIMARY KEY,
    consumer    text        NOT NULL,
    event_id    text        NOT NULL,
    incident_id text        NOT NULL,
    record_type text        NOT NULL,
    status      text        NOT NULL,
    version     integer     NOT NULL,
    recorded_at timestamptz NOT NULL DEFAULT now()
);
"""


class BusinessRuleViolation(Exception):
    """The record is well-formed but must not be acted on; it goes to the DLQ, no retry."""


@dataclass(frozen=True)
class Incoming:
    """A decoded record as a handler sees it."""

    topic: str
    partition: int
    offset: int
    key: str | None
    envelope: Envelope
    record_type: str
    value: dict[str, Any]


class HandlerContext:
    """What a handler may touch: the transaction, the incident state, and the outbox."""

    def __init__(
        self,
        conn: psycopg.Connection[Any],
        incoming: Incoming,
        state: IncidentState | None,
        outbox: Outbox,
        source: str,
    ) -> None:
        self.conn = conn
        self.incoming = incoming
        self.state = state
        self.tokens_spent = 0
        self.emitted: list[Envelope] = []
        self._outbox = outbox
        self._source = source

    def emit(self, topic: str, key: str, record_type: str, value: dict[str, Any]) -> Envelope:
        """Append a record caused by the incoming one (same transaction, one hop fewer).

        A fact's ``eventId`` is its envelope's id: it is filled in here when absent.
        """
        envelope = self.incoming.envelope.caused(record_type, self._source)
        value = {"eventId": envelope.id, **value}
        self._outbox.append(self.conn, topic=topic, key=key, value=value, envelope=envelope)
        metrics.RECORDS_PRODUCED.labels(self._source, topic, record_type).inc()
        self.emitted.append(envelope)
        return envelope

    def spend_tokens(self, tokens: int) -> None:
        """Charge LLM tokens to the incident's budget."""
        self.tokens_spent += tokens


Handler = Callable[[HandlerContext], None]


@dataclass(frozen=True)
class LoopConfig:
    """How one consumer loop behaves. ``name`` is the group id and the dedupe namespace."""

    name: str
    topics: tuple[str, ...]
    source: str  # ce_source of the records this service emits, e.g. /flotilla/health-agent
    batch_size: int = 200
    poll_timeout: float = 0.2
    batch_transactions: bool = True  # False: one transaction (and offset commit) per record
    max_retries: int = 3
    backoff_initial: float = 0.05
    backoff_max: float = 2.0
    follow_workflow: bool = True  # gate incident records on the workflow state machine
    budgets: Budgets | None = None  # enforce per-incident budgets (one service owns this)
    kafka: Mapping[str, str | int | bool] = field(default_factory=dict)


class ConsumerLoop:
    """Runs handlers over topics with exactly-once effects in the service's database."""

    def __init__(
        self,
        config: LoopConfig,
        settings: StackSettings,
        serde: AvroSerde,
        pool: ConnectionPool[Any],
        handlers: Mapping[str, Handler],
        *,
        on_committed: Callable[[list[Message]], None] | None = None,
    ) -> None:
        self.config = config
        self._serde = serde
        self._outbox = Outbox(serde)
        self._pool = pool
        self._handlers = dict(handlers)
        self._on_committed = on_committed
        self._stopping = threading.Event()
        self._dlq = DeadLetterPublisher(settings.kafka_bootstrap, config.name)
        self._consumer = Consumer(
            {
                "bootstrap.servers": settings.kafka_bootstrap,
                "group.id": config.name,
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                "auto.offset.reset": "earliest",
                "fetch.wait.max.ms": 50,
                **config.kafka,
            }
        )
        self._subscribed = False

    # ---------------------------------------------------------------- lifecycle

    def stop(self, *_: object) -> None:
        """Ask the loop to finish the batch in hand, commit, and return."""
        self._stopping.set()

    def install_signal_handlers(self) -> None:
        def handle(signum: int, frame: FrameType | None) -> None:
            log.info("signal %s: finishing the batch in hand", signum)
            self.stop()

        signal.signal(signal.SIGTERM, handle)
        signal.signal(signal.SIGINT, handle)

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def subscribe(self) -> None:
        if not self._subscribed:
            self._consumer.subscribe(list(self.config.topics))
            self._subscribed = True

    def run(self) -> None:
        """Poll and process until stop(); the last batch is always finished and committed."""
        self.subscribe()
        try:
            while not self._stopping.is_set():
                self.poll_once()
        finally:
            self._consumer.close()

    def poll_once(self) -> int:
        """Consume one batch and process it; returns how many records it held."""
        self.subscribe()
        msgs = self._consumer.consume(num_messages=self.config.batch_size, timeout=self.config.poll_timeout)
        records = []
        for msg in msgs:
            err = msg.error()
            if err is None:
                records.append(msg)
            elif err.code() != KafkaError._PARTITION_EOF:
                log.warning("consumer error: %s", err)
        if records:
            self.process(records)
        return len(records)

    # --------------------------------------------------------------- processing

    def process(self, msgs: list[Message]) -> None:
        """Process records and commit: one transaction per batch, or per record."""
        if self.config.batch_transactions:
            self._process_in_one_transaction(msgs)
        else:
            for msg in msgs:
                self._process_in_one_transaction([msg])

    def _process_in_one_transaction(self, msgs: list[Message]) -> None:
        started = time.perf_counter()
        for attempt in range(self.config.max_retries + 1):
            try:
                with self._pool.connection() as conn, conn.transaction():
                    letters = 0
                    for msg in msgs:
                        letters += self._process_one(conn, msg)
                    if letters:
                        # Dead letters are durable before the transaction (and then the
                        # offsets) commit; a crash in between re-sends them, never loses them.
                        self._dlq.flush()
                break
            except psycopg.OperationalError as exc:
                # The connection or the whole transaction failed: nothing of the batch
                # committed, so running it again is safe.
                if attempt == self.config.max_retries:
                    raise
                metrics.RETRIES.labels(self.config.name).inc()
                log.warning("batch transaction failed (%s), retrying", exc)
                time.sleep(self._backoff(attempt + 1))
        if self._on_committed is not None:
            self._on_committed(msgs)
        self._commit_offsets(msgs)
        metrics.BATCH_SECONDS.labels(self.config.name).observe(time.perf_counter() - started)

    def _commit_offsets(self, msgs: Iterable[Message]) -> None:
        highest: dict[tuple[str, int], int] = {}
        for msg in msgs:
            key = (msg.topic() or "", msg.partition() or 0)
            highest[key] = max(highest.get(key, -1), msg.offset() or 0)
        offsets = [TopicPartition(t, p, o + 1) for (t, p), o in highest.items()]
        self._consumer.commit(offsets=offsets, asynchronous=False)

    def _process_one(self, conn: psycopg.Connection[Any], msg: Message) -> int:
        """Handle one record inside the batch transaction; returns 1 if dead-lettered."""
        topic = msg.topic() or ""
        metrics.RECORDS_CONSUMED.labels(self.config.name, topic).inc()
        try:
            envelope = Envelope.from_headers(msg.headers())
        except ValueError as exc:
            return self._dead_letter(msg, Reason.UNDECODABLE, exc)
        if envelope.hops <= 0:
            self._drop_looping(conn, msg, envelope)
            return 0
        try:
            decoded = self._serde.deserialize(msg.value())
        except UnknownSchemaIdError as exc:
            return self._dead_letter(msg, Reason.UNKNOWN_SCHEMA, exc)
        except UndecodableRecordError as exc:
            return self._dead_letter(msg, Reason.UNDECODABLE, exc)
        if decoded.record_name != envelope.type:
            mismatch = BusinessRuleViolation(f"ce_type is {envelope.type} but the value is a {decoded.record_name}")
            return self._dead_letter(msg, Reason.INVALID_RECORD, mismatch)
        key = msg.key()
        incoming = Incoming(
            topic=topic,
            partition=msg.partition() or 0,
            offset=msg.offset() or 0,
            key=key.decode(errors="replace") if isinstance(key, bytes) else key,
            envelope=envelope,
            record_type=decoded.record_name,
            value=decoded.value,
        )
        first_failure: datetime | None = None
        attempt = 0
        while True:
            try:
                with conn.transaction():  # a savepoint: a failed record leaves the batch intact
                    self._apply(conn, incoming)
                return 0
            except (BusinessRuleViolation, SerdeError) as exc:
                return self._dead_letter(msg, Reason.INVALID_RECORD, exc)
            except psycopg.OperationalError:
                raise  # the transaction is gone: the whole batch is retried
            except Exception as exc:
                attempt += 1
                first_failure = first_failure or datetime.now(UTC)
                if attempt > self.config.max_retries:
                    return self._dead_letter(msg, Reason.RETRIES_EXHAUSTED, exc, first_failure, attempt)
                metrics.RETRIES.labels(self.config.name).inc()
                log.warning("handler failed on %s (attempt %d): %s", incoming.envelope.id, attempt, exc)
                time.sleep(self._backoff(attempt))

    def _apply(self, conn: psycopg.Connection[Any], incoming: Incoming) -> None:
        env = incoming.envelope
        if not self._mark_processed(conn, incoming, "handled"):
            metrics.DEDUPE_HITS.labels(self.config.name).inc()
            return
        state: IncidentState | None = None
        if self.config.follow_workflow and is_workflow_record(incoming.record_type):
            state = WorkflowStore.load_for_update(conn, env.correlationid)
            if not accepts(state, incoming.record_type):
                self._record_stale(conn, incoming, state)
                return
            if self.config.budgets is not None:
                exceeded = overrun(state, self.config.budgets, datetime.now(UTC))
                if exceeded is not None:
                    self._escalate(conn, incoming, state, exceeded)
                    return
        ctx = HandlerContext(conn, incoming, state, self._outbox, self.config.source)
        handler = self._handlers.get(incoming.record_type)
        if handler is not None:
            with metrics.HANDLER_SECONDS.labels(self.config.name, incoming.record_type).time():
                handler(ctx)
            metrics.RECORDS_HANDLED.labels(self.config.name, incoming.record_type).inc()
        if state is not None:
            advanced = transition(state, incoming.record_type, event_id=env.id, at=datetime.now(UTC))
            advanced = replace(advanced, tokens_used=advanced.tokens_used + ctx.tokens_spent)
            WorkflowStore.save(conn, advanced)

    # ------------------------------------------------------------ side branches

    def _mark_processed(self, conn: psycopg.Connection[Any], incoming: Incoming, outcome: str) -> bool:
        """Claim (consumer, event id); False when this consumer already processed it."""
        cur = conn.execute(
            'INSERT INTO processed_events (consumer, event_id, record_type, outcome, topic, partition, "offset") '
            "VALUES (%s, %s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING",
            (
                self.config.name,
                incoming.envelope.id,
                incoming.record_type,
                outcome,
                incoming.topic,
                incoming.partition,
                incoming.offset,
            ),
        )
        return cur.rowcount == 1

    def _record_stale(self, conn: psycopg.Connection[Any], incoming: Incoming, state: IncidentState) -> None:
        conn.execute(
            "UPDATE processed_events SET outcome = 'stale' WHERE consumer = %s AND event_id = %s",
            (self.config.name, incoming.envelope.id),
        )
        conn.execute(
            "INSERT INTO stale_transitions (consumer, event_id, incident_id, record_type, status, version) "
            "VALUES (%s, %s, %s, %s, %s, %s)",
            (
                self.config.name,
                incoming.envelope.id,
                state.incident_id,
                incoming.record_type,
                state.status.value,
                state.version,
            ),
        )
        metrics.STALE_TRANSITIONS.labels(self.config.name, incoming.record_type).inc()
        log.info("stale transition: %s for %s in %s", incoming.record_type, state.incident_id, state.status.value)

    def _escalate(
        self, conn: psycopg.Connection[Any], incoming: Incoming, state: IncidentState, exceeded: BudgetOverrun
    ) -> None:
        """Route the incident to a human: BudgetExceeded + IncidentEscalated, handler skipped.

        The local state moves to ESCALATED at once so no further record spends more; the
        IncidentEscalated record coming back later is then a (recorded) stale transition.
        """
        ctx = HandlerContext(conn, incoming, state, self._outbox, self.config.source)
        incident = state.incident_id
        now = datetime.now(UTC)
        exceeded_env = ctx.emit(
            REPORT_TOPIC,
            incident,
            BUDGET_EXCEEDED,
            {
                "incidentId": incident,
                "budget": exceeded.kind.value,
                "limit": exceeded.limit,
                "used": exceeded.used,
                "detectedBy": self.config.name,
                "exceededAt": now,
            },
        )
        ctx.emit(
            REPORT_TOPIC,
            incident,
            INCIDENT_ESCALATED,
            {
                "incidentId": incident,
                "reason": f"{exceeded.kind.value} budget exceeded: used {exceeded.used} of {exceeded.limit}",
                "causeEventId": exceeded_env.id,
                "causeType": BUDGET_EXCEEDED,
                "escalatedTo": ESCALATION_TARGET,
                "escalatedAt": now,
            },
        )
        WorkflowStore.save(conn, transition(state, INCIDENT_ESCALATED, event_id=incoming.envelope.id, at=now))
        metrics.BUDGETS_EXCEEDED.labels(self.config.name, exceeded.kind.value).inc()

    def _drop_looping(self, conn: psycopg.Connection[Any], msg: Message, envelope: Envelope) -> None:
        """A record whose hop budget is spent: count it, report it once, never handle it."""
        metrics.LOOP_DROPS.labels(self.config.name).inc()
        log.warning("dropping %s %s: hop budget spent", envelope.type, envelope.id)
        incoming = Incoming(
            topic=msg.topic() or "",
            partition=msg.partition() or 0,
            offset=msg.offset() or 0,
            key=None,
            envelope=envelope,
            record_type=envelope.type,
            value={},
        )
        with conn.transaction():
            if not self._mark_processed(conn, incoming, "loop-dropped"):
                return
            if envelope.type == LOOP_TERMINATED:
                return  # never report a report: that could loop too
            report = Envelope(
                type=LOOP_TERMINATED,
                source=self.config.source,
                correlationid=envelope.correlationid,
                causationid=envelope.id,
                hops=1,  # a terminal report: whatever reacts to it is dropped at once
            )
            value = {
                "eventId": report.id,
                "incidentId": envelope.correlationid,
                "droppedEventId": envelope.id,
                "droppedType": envelope.type,
                "droppedCausationId": envelope.causationid,
                "consumer": self.config.name,
                "originTopic": incoming.topic,
                "originPartition": incoming.partition,
                "originOffset": incoming.offset,
                "hops": envelope.hops,
                "terminatedAt": datetime.now(UTC),
            }
            try:
                self._outbox.append(conn, topic=REPORT_TOPIC, key=envelope.correlationid, value=value, envelope=report)
            except SerdeError as exc:
                # e.g. a foreign producer's non-UUID ce_id: still dropped, reported in the log
                log.error("cannot report the dropped record %s: %s", envelope.id, exc)

    def _dead_letter(
        self,
        msg: Message,
        reason: Reason,
        error: BaseException,
        first_failure: datetime | None = None,
        attempts: int = 1,
    ) -> int:
        log.warning("dead-lettering %s[%s]@%s (%s): %s", msg.topic(), msg.partition(), msg.offset(), reason, error)
        letter = DeadLetter(
            reason=reason, error=error, first_failure=first_failure or datetime.now(UTC), attempts=attempts
        )
        self._dlq.publish(msg, letter)
        metrics.DEAD_LETTERS.labels(self.config.name, reason.value).inc()
        return 1

    def _backoff(self, attempt: int) -> float:
        return float(min(self.config.backoff_max, self.config.backoff_initial * 2 ** (attempt - 1)))


def migrate(conn: psycopg.Connection[Any]) -> None:
    """The runtime's own tables: processed events, stale transitions, incident workflow."""
    from flotilla.outbox import OUTBOX_MIGRATION
    from flotilla.workflow import WORKFLOW_MIGRATION

    conn.execute(OUTBOX_MIGRATION)
    conn.execute(CONSUMER_MIGRATION)
    conn.execute(WORKFLOW_MIGRATION)


__all__ = [
    "BusinessRuleViolation",
    "ConsumerLoop",
    "Handler",
    "HandlerContext",
    "Incoming",
    "LoopConfig",
    "Status",
    "migrate",
]
