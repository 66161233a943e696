"""The consumer loop every Flotilla service runs: boring, idempotent, never blocked.

For each record of a poll batch:

1. read the CloudEvents envelope and decode the value through the registry — a record
   that cannot be decoded goes to ``<topic>.dlq``, and so does one its producer did not
   sign (``flotilla.provenance``: dead-lettered ``unauthorized``); one whose hop budget
   is spent is dropped and reported (metric + LoopTerminated), never handled;
2. claim (consumer, event id) — a redelivered record has no second effect (a dropped
   record claims only its drop, ``loop-dropped:<id>``: ``ce_hops`` is not signed);
3. ask the incident workflow whether it accepts the record in the incident's current
   state — a stale or out-of-order record is recorded and skipped;
4. run the handler, which changes state and appends outgoing records to the outbox;
5. advance the workflow state and the per-incident budgets.

All of it commits in one database transaction, and only then are the batch's Kafka
offsets stored (librdkafka commits stored offsets every second, on revoke and on close):
a crash in between means redelivery, which step 2 absorbs.

A batch first runs on the fast path — one transaction, claims and workflow state in
bulk, statements pipelined. If any record fails there, the batch is rolled back and
run again with a savepoint per record, so the failing record alone is retried (bounded,
with backoff) and then dead-lettered, and the rest commit. Dead letters are made durable
before the transaction commits. Poison never blocks a partition.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import nullcontext, suppress
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from types import FrameType
from typing import Any

import psycopg
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition
from psycopg_pool import ConnectionPool

from flotilla import dedupe, metrics, tracing
from flotilla.authority import Unauthorized
from flotilla.deadletter import DeadLetter, DeadLetterPublisher, Reason
from flotilla.envelope import Envelope
from flotilla.escalations import escalation
from flotilla.handling import BusinessRuleViolation, Handler, HandlerContext, Incoming, RecordRefused
from flotilla.outbox import OUTBOX_MIGRATION, Outbox, OutboxRow
from flotilla.provenance import Provenance, count_refused, payload_digest, signature_header
from flotilla.records import BY_TYPE, BudgetExceeded, IncidentEscalated, LoopTerminated
from flotilla.serde import AvroSerde, RegistryUnavailableError, SerdeError, UnknownSchemaIdError
from flotilla.settings import StackSettings
from flotilla.tailing import header
from flotilla.workflow import (
    WORKFLOW_MIGRATION,
    BudgetOverrun,
    Budgets,
    IncidentState,
    WorkflowStore,
    accepts,
    is_workflow_record,
    overrun,
    transition,
)

log = logging.getLogger(__name__)

# What storing offsets answers when none of the partitions is assigned here any more
# (_UNKNOWN_PARTITION once the client no longer holds the partition at all): "these
# partitions are no longer yours", not "Kafka is broken".
_LOST_PARTITIONS = frozenset({KafkaError._STATE, KafkaError._UNKNOWN_PARTITION})

# Offsets stored after each batch reach the group this often (and on revoke and close).
DEFAULT_COMMIT_INTERVAL_MS = 1000

_REPORT_IDS = uuid.UUID("3f0c2a6e-9b7d-4c1e-8a55-1d2e3f4a5b6c")  # namespace of refusal reports' ids


@dataclass(frozen=True)
class LoopConfig:
    """How one consumer loop behaves. ``name`` is the group id and the dedupe namespace."""

    name: str
    topics: tuple[str, ...]
    source: str  # ce_source of the records this service emits, e.g. /flotilla/health-agent
    batch_size: int = 200
    poll_timeout: float = 0.2
    # After the first record of a batch, how long to wait for more. No wait by default: under
    # load records pile up in librdkafka's queue while a batch runs and the next batch takes
    # them all, so lingering only delays the first record after a quiet spell (measured:
    # 5 ms of linger cost ~4 ms per hop, p50 171 -> 155 ms end to end without it).
    batch_linger: float = 0.0
    batch_transactions: bool = True  # False: one transaction (and offset store) per record
    # Pipeline mode saves round trips, but a pipelined session never looks idle to the
    # server, so idle_in_transaction_session_timeout cannot end a transaction whose process
    # froze mid-handler. A loop whose handlers wait on the outside world (the executor)
    # turns it off and bounds its transactions with that timeout instead.
    pipeline: bool = True
    max_retries: int = 3
    # How long a batch waits out a lost database (a restart, a failover) before the loop
    # gives up and the process exits: a PostgreSQL restart takes seconds, and a member that
    # crashes for it is restarted with a growing back-off (Kubernetes' CrashLoopBackOff).
    database_patience: float = 120.0
    backoff_initial: float = 0.05
    backoff_max: float = 2.0
    follow_workflow: bool = True  # gate incident records on the workflow state machine
    # How often librdkafka reports statistics, from which flotilla_consumer_lag is read; 0: never.
    stats_interval_ms: int = 5000
    # How often the offsets stored after each batch's transaction are committed to the group.
    commit_interval_ms: int = DEFAULT_COMMIT_INTERVAL_MS
    budgets: Budgets | None = None  # enforce per-incident budgets (one service owns this)
    kafka: Mapping[str, str | int | bool] = field(default_factory=dict)
    # A record's schema id must be registered under <topic>-<record name> for the topic it
    # is read from; a loop reading copies of a contract topic from a topic of another name
    # (tests do) maps that name to the contract topic here.
    contract_topics: Mapping[str, str] = field(default_factory=dict)
    # The topics handlers (and the loop's own reports) may emit to; None: not checked here.
    emits: tuple[str, ...] | None = None
    # The record types (ce_type) this loop reads; any other contract type is skipped before
    # it is decoded, verified or claimed, its offset stored with the batch's. None: every
    # record is read. A record without a ce_type, or with one no contract names, is always
    # read (and dead-lettered).
    needs: frozenset[str] | None = None


@dataclass(frozen=True)
class _Item:
    """One polled record after decoding: to handle, to drop (hops spent), or a dead letter."""

    msg: Message
    incoming: Incoming | None = None
    letter: DeadLetter | None = None

    @property
    def dropped(self) -> bool:
        return self.incoming is not None and self.incoming.envelope.hops <= 0

    def claim(self) -> dedupe.Claim:
        """The record's claim: its event id, or for a record dropped for its spent hop budget
        a claim of that drop alone (``loop-dropped:<id>``), so it is reported once.

        ``ce_hops`` is outside the producer's signature: a copy of a genuine record with no hops
        left verifies. Were the drop claimed by the event id, whoever can write the topic could
        pre-empt the genuine record (its copy first, dropped; the original then a duplicate)."""
        assert self.incoming is not None
        i = self.incoming
        if self.dropped:
            return dedupe.Claim(
                f"loop-dropped:{i.envelope.id}", i.record_type, "loop-dropped", i.topic, i.partition, i.offset
            )
        return dedupe.Claim(i.envelope.id, i.record_type, "handled", i.topic, i.partition, i.offset)


class _Isolate(Exception):
    """A record failed on the fast path: rerun the batch with a savepoint per record."""


class _LiveStates:
    """Workflow state read and written per record (the isolated path)."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self._conn = conn

    def get(self, incident_id: str) -> IncidentState:
        return WorkflowStore.load_for_update(self._conn, incident_id)

    def put(self, state: IncidentState) -> None:
        WorkflowStore.save(self._conn, state)


class _BatchStates:
    """Workflow state loaded for the whole batch up front and saved once (the fast path)."""

    def __init__(self, conn: psycopg.Connection[Any], incident_ids: set[str]) -> None:
        self._states = WorkflowStore.load_many_for_update(conn, incident_ids) if incident_ids else {}
        self._dirty: set[str] = set()

    def get(self, incident_id: str) -> IncidentState:
        return self._states.get(incident_id) or IncidentState(incident_id=incident_id)

    def put(self, state: IncidentState) -> None:
        self._states[state.incident_id] = state
        self._dirty.add(state.incident_id)

    def flush(self, conn: psycopg.Connection[Any]) -> None:
        if self._dirty:
            WorkflowStore.save_many(conn, [self._states[i] for i in sorted(self._dirty)])


States = _LiveStates | _BatchStates


def group_consumer_config(
    connection: Mapping[str, Any],
    group: str,
    *,
    lag: metrics.ConsumerLag,
    stats_interval_ms: int,
    overrides: Mapping[str, str | int | bool],
    commit_interval_ms: int = DEFAULT_COMMIT_INTERVAL_MS,
) -> dict[str, Any]:
    """librdkafka settings of a group member that marks a record done only after its transaction.

    Auto offset store is off: the loop stores a batch's offsets once its database
    transaction has committed (``store_offsets``), and librdkafka commits what is stored
    every ``commit_interval_ms``, when partitions are revoked and on close. A member
    killed between two commits re-reads at most that interval's records, which the
    processed-events claims absorb; committing after every batch instead cost a
    synchronous round trip per batch and an OffsetCommit request per batch per group,
    a large share of the broker's work in a storm (docs/operations/chaos.md).
    ``lag`` receives librdkafka's statistics, from which ``flotilla_consumer_lag`` is
    read; ``overrides`` win.
    """
    conf: dict[str, Any] = {
        **connection,
        "group.id": group,
        "enable.auto.commit": True,
        "auto.commit.interval.ms": commit_interval_ms,
        "enable.auto.offset.store": False,
        "on_commit": _report_failed_commit,
        "auto.offset.reset": "earliest",
        # The broker answers a fetch as soon as a record arrives (or a transaction commits);
        # this only bounds how often an idle member asks again (50 ms made the idle broker
        # busy; 2 s costs no hop latency, docs/operations/observability.md).
        "fetch.wait.max.ms": 2000,
    }
    if stats_interval_ms > 0:
        # Served from poll()/consume() on the loop's own thread.
        conf["statistics.interval.ms"] = stats_interval_ms
        conf["stats_cb"] = lag
    return {**conf, **overrides}


def poll_batch(consumer: Consumer, *, poll_timeout: float, batch_size: int, linger: float, name: str) -> list[Message]:
    """Up to ``batch_size`` records: wait ``poll_timeout`` for the first, then at most
    ``linger`` for the rest. Errors are logged and left out (end of partition silently).

    consume() waits until a batch is *full* or its timeout passes, so a long timeout
    there would be added to every hop when traffic is light: the wait is for the first
    record only.
    """
    first = consumer.poll(poll_timeout)
    if first is None:
        return []
    msgs = [first]
    if batch_size > 1:
        msgs += consumer.consume(num_messages=batch_size - 1, timeout=linger)
    records = []
    for msg in msgs:
        err = msg.error()
        if err is None:
            records.append(msg)
        elif err.code() != KafkaError._PARTITION_EOF:
            log.warning("%s: consumer error: %s", name, err)
    return records


def _report_failed_commit(error: KafkaError | None, partitions: list[TopicPartition]) -> None:
    """librdkafka's answer to a background commit: only a failure is worth a line (the
    offsets stay stored and go with the next commit; a lost partition's are redelivered)."""
    if error is not None and error.code() != KafkaError._NO_OFFSET:
        log.warning("offset commit failed (%s); retried with the next one", error)


def store_offsets(consumer: Consumer, msgs: Iterable[Message]) -> None:
    """Mark ``msgs`` done (their batch's transaction has committed): the next auto-commit
    takes the group past them.

    Offsets of partitions the group has meanwhile moved to another member are refused
    (librdkafka stores nothing for a partition not assigned here); that is logged, not
    raised: the database transaction already committed, and whoever owns the partitions
    now gets these records again and its dedupe absorbs them.
    """
    highest: dict[tuple[str, int], int] = {}
    for msg in msgs:
        key = (msg.topic() or "", msg.partition() or 0)
        highest[key] = max(highest.get(key, -1), msg.offset() or 0)
    offsets = [TopicPartition(t, p, o + 1) for (t, p), o in highest.items()]
    try:
        consumer.store_offsets(offsets=offsets)
    except KafkaException as exc:
        error = exc.args[0] if exc.args else None
        if not isinstance(error, KafkaError) or error.code() not in _LOST_PARTITIONS:
            raise
        log.warning("offsets not stored (%s): partitions were reassigned; redelivery is deduped", error)


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
        outbox: Outbox | None = None,
        provenance: Provenance | None = None,
    ) -> None:
        self.config = config
        self._serde = serde
        # The service's outbox (it signs with the service's key); an unsigned one for a
        # loop run on its own (tests of the loop's mechanics).
        self._outbox = outbox or Outbox(serde, config.emits)
        # Whose signature each record must carry (flotilla.provenance); None: not checked,
        # for those loops alone. A fleet member always has one (runner.ServiceContext).
        self._provenance = provenance
        self._pool = pool
        self._handlers = dict(handlers)
        self._on_committed = on_committed  # fault-injection point: after the DB commit, before offsets are stored
        self._stopping = threading.Event()
        self._connection = settings.kafka_client()
        self._dlq = DeadLetterPublisher(self._connection, config.name)
        self._lag = metrics.ConsumerLag(config.name)
        self._consumer: Consumer | None = None  # made on first use: librdkafka connects as it is made
        self._subscribed = False

    @property
    def consumer(self) -> Consumer:
        """The group consumer, made on first use (a loop built to be inspected, as in
        tests, connects to nothing)."""
        if self._consumer is None:
            self._consumer = Consumer(self.kafka_config())
        return self._consumer

    def kafka_config(self) -> dict[str, Any]:
        """The consumer's librdkafka configuration (``config.kafka`` wins)."""
        return group_consumer_config(
            self._connection,
            self.config.name,
            lag=self._lag,
            stats_interval_ms=self.config.stats_interval_ms,
            overrides=self.config.kafka,
            commit_interval_ms=self.config.commit_interval_ms,
        )

    # ---------------------------------------------------------------- lifecycle

    def stop(self, *_: object) -> None:
        """Ask the loop to finish the batch in hand, store its offsets, and return (closing commits them)."""
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

    def run(self) -> None:
        """Poll and process until stop(); the last batch is always finished, and its offsets
        committed as the consumer closes."""
        try:
            while not self._stopping.is_set():
                self.poll_once()
        finally:
            if self._consumer is not None:
                self._consumer.close()
            self._lag.clear()

    def poll_once(self) -> int:
        """Consume one batch and process it; returns how many records it held."""
        if not self._subscribed:
            self.consumer.subscribe(list(self.config.topics))
            self._subscribed = True
        records = poll_batch(
            self.consumer,
            poll_timeout=self.config.poll_timeout,
            batch_size=self.config.batch_size,
            linger=self.config.batch_linger,
            name=self.config.name,
        )
        if records:
            self.process(records)
        return len(records)

    # --------------------------------------------------------------- processing

    def process(self, msgs: list[Message]) -> None:
        """Process records and store their offsets: one transaction per batch, or per record."""
        if self.config.batch_transactions:
            self._process_batch(msgs)
        else:
            for msg in msgs:
                self._process_batch([msg])

    def _process_batch(self, msgs: list[Message]) -> None:
        started = time.perf_counter()
        items = self._decode_batch(self._needed(msgs))
        if items is None:
            return  # asked to stop while the registry was away: nothing done, nothing committed
        gives_up_at = time.monotonic() + self.config.database_patience
        attempt = 0
        while items:
            try:
                with self._pool.connection() as conn:
                    self._run(conn, items)
                break
            except psycopg.OperationalError as exc:
                # The connection or the transaction failed: nothing of the batch
                # committed, so running it again is safe.
                attempt += 1
                if time.monotonic() >= gives_up_at or self._stopping.is_set():
                    raise
                metrics.RETRIES.labels(self.config.name).inc()
                log.warning("batch transaction failed (%s), retrying (attempt %d)", exc, attempt)
                time.sleep(self._backoff(attempt))
                with suppress(psycopg.Error):
                    self._pool.check()  # after a restart every pooled connection is dead: drop them at once
        if self._on_committed is not None:
            self._on_committed(msgs)
        self._store_offsets(msgs)
        metrics.BATCH_SECONDS.labels(self.config.name).observe(time.perf_counter() - started)

    def _run(self, conn: psycopg.Connection[Any], items: list[_Item]) -> None:
        decode_letters = [(it.msg, it.letter) for it in items if it.letter is not None]
        work = [it for it in items if it.incoming is not None]
        try:
            with conn.transaction():
                self._fast(conn, work)
                self._send_letters(conn, decode_letters)
            return
        except _Isolate as exc:
            log.info("batch of %d rerun record by record: %s", len(items), exc.__cause__)
        with conn.transaction():
            letters = self._isolated(conn, work)
            self._send_letters(conn, decode_letters + letters)

    def _fast(self, conn: psycopg.Connection[Any], work: list[_Item]) -> None:
        """The whole batch in bulk; raises _Isolate (after rollback) if any record fails."""
        try:
            with conn.pipeline() if self.config.pipeline else nullcontext():
                fresh = dedupe.claim_many(conn, self.config.name, [it.claim() for it in work])
                states = _BatchStates(conn, {self._incident_of(it.incoming) for it in work if self._gated(it)})
                pending: list[OutboxRow] = []
                seen: set[str] = set()
                for it in work:
                    assert it.incoming is not None
                    claimed = it.claim().event_id
                    if claimed in seen or claimed not in fresh:
                        metrics.DEDUPE_HITS.labels(self.config.name).inc()
                        continue
                    seen.add(claimed)
                    if it.dropped:
                        self._report_loop(it.incoming, pending)
                    else:
                        self._apply(conn, it.incoming, states, pending)
                Outbox.insert(conn, pending)
                states.flush(conn)
        except psycopg.OperationalError:
            raise
        except Exception as exc:
            raise _Isolate() from exc

    def _isolated(self, conn: psycopg.Connection[Any], work: list[_Item]) -> list[tuple[Message, DeadLetter]]:
        """Each record in its own savepoint: a failure rolls back that record only."""
        letters: list[tuple[Message, DeadLetter]] = []
        for it in work:
            letter = self._isolated_one(conn, it)
            if letter is not None:
                letters.append((it.msg, letter))
        return letters

    def _isolated_one(self, conn: psycopg.Connection[Any], it: _Item) -> DeadLetter | None:
        assert it.incoming is not None
        first_failure: datetime | None = None
        attempt = 0
        while True:
            try:
                with conn.transaction():  # a savepoint; the claim rolls back with it
                    pending: list[OutboxRow] = []
                    if not dedupe.claim_one(conn, self.config.name, it.claim()):
                        metrics.DEDUPE_HITS.labels(self.config.name).inc()
                    elif it.dropped:
                        self._report_loop(it.incoming, pending)
                    else:
                        self._apply(conn, it.incoming, _LiveStates(conn), pending)
                    Outbox.insert(conn, pending)
                return None
            except RecordRefused as exc:
                self._report_refusal(conn, it.incoming, exc)
                return self._letter(it.msg, exc.reason, exc)
            except (BusinessRuleViolation, SerdeError) as exc:
                return self._letter(it.msg, Reason.INVALID_RECORD, exc)
            except psycopg.OperationalError:
                raise  # the transaction is gone: the whole batch is retried
            except Exception as exc:
                attempt += 1
                first_failure = first_failure or datetime.now(UTC)
                if attempt > self.config.max_retries:
                    return self._letter(it.msg, Reason.RETRIES_EXHAUSTED, exc, first_failure, attempt)
                metrics.RETRIES.labels(self.config.name).inc()
                log.warning("handler failed on %s (attempt %d): %s", it.incoming.envelope.id, attempt, exc)
                time.sleep(self._backoff(attempt))

    def _needed(self, msgs: list[Message]) -> list[Message]:
        """The records this loop reads; the others are counted as consumed and skipped, by
        their ce_type header alone (no decoding, no signature check, no claim: nothing in
        this service acts on them, so nothing of them needs to be believed). Only a type
        some contract names is ever skipped: a record without a ce_type, with several (a
        repeated attribute: :func:`flotilla.envelope.header_value`), or with one no contract
        names, is garbage on the topic and is read, to be dead-lettered."""
        needs = self.config.needs
        if needs is None:
            return msgs
        kept = []
        for msg in msgs:
            raw = header(msg.headers(), "ce_type")
            record_type = None if raw is None else raw.decode(errors="replace")
            if record_type is None or record_type in needs or record_type not in BY_TYPE:
                kept.append(msg)
                continue
            metrics.RECORDS_CONSUMED.labels(self.config.name, msg.topic() or "").inc()
            metrics.RECORDS_SKIPPED.labels(self.config.name, record_type).inc()
        return kept

    def _decode_batch(self, msgs: list[Message]) -> list[_Item] | None:
        """Decode every record; while the registry cannot answer, wait and decode again.

        A registry outage says nothing about the records, so nothing is dead-lettered for
        it and no offset moves: the partition waits (backing off) until the registry is
        back. None when the loop was asked to stop meanwhile.
        """
        attempt = 0
        while True:
            try:
                return [self._decode(msg) for msg in msgs]
            except RegistryUnavailableError as exc:
                attempt += 1
                metrics.RETRIES.labels(self.config.name).inc()
                log.warning("schema registry unavailable (attempt %d), decoding again later: %s", attempt, exc)
                if self._stopping.wait(self._backoff(attempt)):
                    return None

    def _decode(self, msg: Message) -> _Item:
        """One record as something to handle, or a dead letter. Poison never blocks a
        partition: whatever the bytes and headers hold, the answer is an item."""
        metrics.RECORDS_CONSUMED.labels(self.config.name, msg.topic() or "").inc()
        try:
            return self._decode_record(msg)
        except RegistryUnavailableError:
            raise
        except UnknownSchemaIdError as exc:
            return _Item(msg, letter=self._letter(msg, Reason.UNKNOWN_SCHEMA, exc))
        except Exception as exc:  # UndecodableRecordError, a bad envelope, or any surprise
            return _Item(msg, letter=self._letter(msg, Reason.UNDECODABLE, exc))

    def _decode_record(self, msg: Message) -> _Item:
        topic = msg.topic() or ""
        envelope = Envelope.from_headers(msg.headers())
        key = msg.key()

        def incoming(record_type: str, value: dict[str, Any]) -> Incoming:
            return Incoming(
                topic=topic,
                partition=msg.partition() or 0,
                offset=msg.offset() or 0,
                key=key.decode(errors="replace") if isinstance(key, bytes) else key,
                envelope=envelope,
                record_type=record_type,
                value=value,
                digest=payload_digest(msg.value() or b""),
            )

        if envelope.hops <= 0 or self._only_steps(envelope.type):  # not decoded: it is never handled
            refused = self._unauthorized(msg, envelope)
            return _Item(msg, letter=refused) if refused else _Item(msg, incoming=incoming(envelope.type, {}))
        decoded = self._serde.deserialize(msg.value(), topic=self.config.contract_topics.get(topic, topic))
        if decoded.record_name != envelope.type:
            mismatch = BusinessRuleViolation(f"ce_type is {envelope.type} but the value is a {decoded.record_name}")
            return _Item(msg, letter=self._letter(msg, Reason.INVALID_RECORD, mismatch))
        refused = self._unauthorized(msg, envelope)
        if refused is not None:
            return _Item(msg, letter=refused)
        return _Item(msg, incoming=incoming(decoded.record_name, decoded.value))

    def _only_steps(self, record_type: str) -> bool:
        """Whether a record of this type only steps this loop's workflow (no handler here
        reads its value) and is believed by its signature: then its value is never decoded.
        Its producer's signature covers the exact bytes and type (an outbox row is validated
        against its contract before it is written), so decoding would add nothing but CPU; a
        storm's agents spent a third of their loop decoding records they never read. Without
        provenance checks every record is decoded: the schema is then all that vouches for it."""
        return self._provenance is not None and record_type not in self._handlers and record_type in BY_TYPE

    def _unauthorized(self, msg: Message, envelope: Envelope) -> DeadLetter | None:
        """The dead letter of a record its producer did not sign (None: it did, or this loop
        does not check). Checked after decoding, so poison keeps its own reason, and before
        the claim, the workflow and any handler: a refused record moves nothing."""
        if self._provenance is None:
            return None
        try:
            self._provenance.verify(envelope, msg.value() or b"", signature_header(msg.headers()))
        except Unauthorized as exc:
            count_refused(self.config.name, envelope.type, exc.refusal)
            return self._letter(msg, Reason.UNAUTHORIZED, exc)
        return None

    def _gated(self, it: _Item) -> bool:
        return (
            it.incoming is not None
            and not it.dropped
            and self.config.follow_workflow
            and is_workflow_record(it.incoming.record_type)
        )

    @staticmethod
    def _incident_of(incoming: Incoming | None) -> str:
        assert incoming is not None
        return incoming.envelope.correlationid

    def _apply(
        self, conn: psycopg.Connection[Any], incoming: Incoming, states: States, pending: list[OutboxRow]
    ) -> None:
        """Workflow check, budgets, handler, state: the claim is already made. One span per
        record this service handles (the agents read most records of ``incidents``; the ones
        a service only steps its workflow over are not worth a span each)."""
        if incoming.record_type not in self._handlers:
            self._apply_traced(conn, incoming, states, pending)
            return
        with tracing.handling_span(self.config.name, incoming) as span:
            tracing.set_outcome(span, self._apply_traced(conn, incoming, states, pending))

    def _apply_traced(
        self, conn: psycopg.Connection[Any], incoming: Incoming, states: States, pending: list[OutboxRow]
    ) -> str:
        state: IncidentState | None = None
        if self.config.follow_workflow and is_workflow_record(incoming.record_type):
            state = states.get(incoming.envelope.correlationid)
            if not accepts(state, incoming.record_type):
                self._record_stale(conn, incoming, state)
                return "stale"
            if self.config.budgets is not None:
                exceeded = overrun(state, self.config.budgets, datetime.now(UTC))
                if exceeded is not None:
                    self._escalate(conn, incoming, state, exceeded, states, pending)
                    return "escalated"
        ctx = HandlerContext(conn, incoming, state, self._outbox, self.config.source, pending)
        handler = self._handlers.get(incoming.record_type)
        outcome = "ignored"
        if handler is not None:
            with metrics.HANDLER_SECONDS.labels(self.config.name, incoming.record_type).time():
                handler(ctx)
            metrics.RECORDS_HANDLED.labels(self.config.name, incoming.record_type).inc()
            outcome = "handled"
        if state is not None:
            advanced = transition(state, incoming.record_type, event_id=incoming.envelope.id, at=datetime.now(UTC))
            states.put(replace(advanced, tokens_used=advanced.tokens_used + ctx.tokens_spent))
        return outcome

    # ------------------------------------------------------------ side branches

    def _record_stale(self, conn: psycopg.Connection[Any], incoming: Incoming, state: IncidentState) -> None:
        dedupe.set_outcome(conn, self.config.name, incoming.envelope.id, "stale")
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
        self,
        conn: psycopg.Connection[Any],
        incoming: Incoming,
        state: IncidentState,
        exceeded: BudgetOverrun,
        states: States,
        pending: list[OutboxRow],
    ) -> None:
        """Route the incident to a human: BudgetExceeded + IncidentEscalated, handler skipped.

        The local state moves to ESCALATED at once so no further record spends more; the
        IncidentEscalated record coming back later is then a (recorded) stale transition.
        """
        ctx = HandlerContext(conn, incoming, state, self._outbox, self.config.source, pending)
        incident = state.incident_id
        now = datetime.now(UTC)
        overrun_record = BudgetExceeded(
            incident_id=incident,
            budget=exceeded.kind.value,
            limit=exceeded.limit,
            used=exceeded.used,
            detected_by=self.config.name,
            exceeded_at=now,
        )
        reason = f"{exceeded.kind.value} budget exceeded: used {exceeded.used} of {exceeded.limit}"
        ctx.emit(escalation(incident, reason, cause=ctx.emit(overrun_record, key=incident), at=now), key=incident)
        states.put(transition(state, IncidentEscalated.TYPE, event_id=incoming.envelope.id, at=now))
        metrics.BUDGETS_EXCEEDED.labels(self.config.name, exceeded.kind.value).inc()

    def _report_refusal(self, conn: psycopg.Connection[Any], refused: Incoming, exc: RecordRefused) -> None:
        """Emit the refusal's report (the refused record's own effects are rolled back)."""
        if exc.report is None:
            return
        report = exc.report.record
        envelope = refused.envelope.caused(
            report.TYPE,
            self.config.source,
            id=str(uuid.uuid5(_REPORT_IDS, f"{self.config.name}/{refused.envelope.id}")),
        )
        row = self._outbox.row(report, envelope, key=exc.report.key)
        with conn.transaction():
            Outbox.insert(conn, [row], if_absent=True)
        metrics.count_produced(self.config.source, report.TOPIC, report.TYPE)

    def _report_loop(self, dropped: Incoming, pending: list[OutboxRow]) -> None:
        """A record whose hop budget is spent: count it and report it once, never handle it."""
        envelope = dropped.envelope
        if envelope.type not in self._handlers:
            # Not ours to act on anyway: several services read `incidents`, and only a
            # consumer that would have handled the record reports the loop it cut (else
            # one spent record would be reported once per service that reads it).
            return
        metrics.LOOP_DROPS.labels(self.config.name).inc()
        log.warning("dropping %s %s: hop budget spent", envelope.type, envelope.id)
        if envelope.type == LoopTerminated.TYPE:
            return  # never report a report: that could loop too
        report = Envelope(
            type=LoopTerminated.TYPE,
            source=self.config.source,
            correlationid=envelope.correlationid,
            causationid=envelope.id,
            hops=1,  # a terminal report: whatever reacts to it is dropped at once
        )
        terminated = LoopTerminated(
            event_id=report.id,
            incident_id=envelope.correlationid,
            dropped_event_id=envelope.id,
            dropped_type=envelope.type,
            dropped_causation_id=envelope.causationid,
            consumer=self.config.name,
            origin_topic=dropped.topic,
            origin_partition=dropped.partition,
            origin_offset=dropped.offset,
            hops=envelope.hops,
            terminated_at=datetime.now(UTC),
        )
        try:
            pending.append(self._outbox.row(terminated, report, key=envelope.correlationid))
        except SerdeError as exc:
            # e.g. a foreign producer's non-UUID ce_id: still dropped, reported in the log
            log.error("cannot report the dropped record %s: %s", envelope.id, exc)

    def _letter(
        self,
        msg: Message,
        reason: Reason,
        error: BaseException,
        first_failure: datetime | None = None,
        attempts: int = 1,
    ) -> DeadLetter:
        log.warning("dead letter %s[%s]@%s (%s): %s", msg.topic(), msg.partition(), msg.offset(), reason, error)
        first = first_failure or datetime.now(UTC)
        return DeadLetter(reason=reason, error=error, first_failure=first, attempts=attempts)

    def _send_letters(self, conn: psycopg.Connection[Any], letters: Sequence[tuple[Message, DeadLetter]]) -> None:
        """Publish and flush dead letters before the transaction commits: a crash after
        this re-sends them (the reconciler dedupes by origin), never loses them.

        Each letter is claimed by its record's position in the same transaction, so a
        record read again later (a rewound group, a redelivery after the commit) is not
        dead-lettered again: by position, because poison may carry no usable event id."""
        if not letters:
            return
        claims = [dedupe.letter_claim(msg.topic() or "", msg.partition() or 0, msg.offset() or 0) for msg, _ in letters]
        fresh = dedupe.claim_many(conn, self.config.name, claims)
        sent = 0
        for (msg, letter), claim in zip(letters, claims, strict=True):
            if claim.event_id not in fresh:
                metrics.DEDUPE_HITS.labels(self.config.name).inc()
                continue
            fresh.discard(claim.event_id)
            self._dlq.publish(msg, letter)
            metrics.DEAD_LETTERS.labels(self.config.name, letter.reason.value).inc()
            sent += 1
        if sent:
            self._dlq.flush()

    def _store_offsets(self, msgs: Iterable[Message]) -> None:
        store_offsets(self.consumer, msgs)

    def _backoff(self, attempt: int) -> float:
        return float(min(self.config.backoff_max, self.config.backoff_initial * 2 ** (attempt - 1)))


def migrate(conn: psycopg.Connection[Any]) -> None:
    """The runtime's own tables: outbox, processed events, stale transitions, workflow."""
    conn.execute(OUTBOX_MIGRATION)
    conn.execute(dedupe.DEDUPE_MIGRATION)
    conn.execute(WORKFLOW_MIGRATION)
