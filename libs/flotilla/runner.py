"""Running a service: everything but its handlers, written once.

A service module declares a :class:`ServiceSpec` — its name, its database, the topics
it consumes, a factory for its handlers, its migrations, its periodic tasks and its HTTP
routes — and calls :func:`start`. ``start`` makes the database ready to publish (outbox
table and Debezium connector), applies the runtime's and the service's migrations,
serves ``/healthz``, ``/readyz`` and ``/metrics`` plus the service's routes, runs the
periodic tasks on a thread (its own, the retention pruner, and the keeper that restarts
its outbox connector when Connect reports it FAILED), and runs the consumer loop on the
main thread until SIGTERM, finishing the batch in hand.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
import urllib.error
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol, TypeVar

import psycopg
from confluent_kafka.admin import AdminClient
from fastapi import FastAPI
from psycopg_pool import ConnectionPool

from flotilla import connectors, consumer, metrics, tracing
from flotilla.authority import Signer, required_signer
from flotilla.bootstrap import bootstrap_outbox, ensure_database, open_pool
from flotilla.connectors import ConnectError
from flotilla.consumer import ConsumerLoop, LoopConfig
from flotilla.deadletter import dlq_topic
from flotilla.envelope import Envelope
from flotilla.handling import Handler
from flotilla.http import create_app, database_ready, serve_http
from flotilla.outbox import Outbox, allow_topics
from flotilla.provenance import Provenance
from flotilla.registry import registry_client
from flotilla.retention import Retention, dedupe_window, prune, topic_retention_ms
from flotilla.serde import AvroSerde
from flotilla.settings import ServiceSettings
from flotilla.typedrecord import Record
from flotilla.workflow import Status, needed_types

log = logging.getLogger(__name__)

S = TypeVar("S", bound=ServiceSettings)


class ServiceContext:
    """What handlers, periodic tasks and routes of one service share."""

    def __init__(self, spec: ServiceSpec, settings: ServiceSettings, pool: ConnectionPool[Any], serde: AvroSerde):
        self.spec = spec
        self.settings = settings
        self.pool = pool
        self.serde = serde
        # Every record this member emits is signed with its key; every record it consumes
        # must carry its producer's signature (flotilla.provenance). Fail closed: a member
        # missing either refuses to start, naming the setting.
        self.signer = fact_signer(settings) if spec.publishes else None
        self.provenance = fact_provenance(settings) if spec.topics else None
        self.outbox = Outbox(serde, spec.emits, self.signer, max_record_bytes=settings.outbox_max_record_bytes)
        self.source = f"/flotilla/{spec.producer or spec.name}"
        self.stopping = threading.Event()

    def emit(
        self,
        conn: psycopg.Connection[Any],
        record: Record,
        *,
        key: str | None = None,
        correlation: str,
        cause: Envelope | None = None,
        topic: str | None = None,
    ) -> Envelope:
        """Append a record that no consumed record caused directly (a timer, a person, a
        scrape), inside the caller's transaction. With ``cause`` it continues that
        record's chain (causation, hops, trace); without, it starts a new one. Counted in
        ``flotilla_records_produced_total`` once appended, like a handler's emit."""
        record_type, topic = record.TYPE, topic or record.TOPIC
        if cause is not None and tracing.current_traceparent(cause.trace_id) is not None:
            envelope = cause.caused(record_type, self.source)  # a child of the span in progress
        else:
            # A producer span of its own: the trace's root, or a continuation of the cause's.
            attributes = {"flotilla.service": self.spec.name, "flotilla.incident_id": correlation}
            name = f"{record_type.rsplit('.', 1)[-1]} publish"
            with tracing.root_span(name, attributes, parent=cause.traceparent if cause else None) as traceparent:
                if cause is not None:
                    envelope = cause.caused(record_type, self.source)
                else:
                    envelope = Envelope(type=record_type, source=self.source, correlationid=correlation)
                    if traceparent is not None:
                        envelope = dataclasses.replace(envelope, traceparent=traceparent)
        self.outbox.append(conn, record, envelope, key=key, topic=topic)
        metrics.count_produced(self.source, topic, record_type)
        return envelope

    def now(self) -> datetime:
        return datetime.now(UTC)


HandlersFactory = Callable[[ServiceContext], Mapping[str, Handler]]


class Pace(Protocol):
    """When a periodic task runs again, for tasks better woken than polled (a fixed
    interval is a plain number of seconds)."""

    def wait(self, ctx: ServiceContext) -> None:
        """Block until the task should run again (or the service stops)."""
        ...


Periodic = tuple[float | Pace, Callable[[ServiceContext], None]]  # (interval seconds or pace, task)
Routes = Callable[[FastAPI, ServiceContext], None]


@dataclass(frozen=True)
class ServiceSpec:
    """One service of the fleet, declared."""

    name: str  # group id, dedupe namespace, ce_source suffix, metrics label
    database: str
    topics: tuple[str, ...] = ()
    handlers: HandlersFactory = lambda ctx: {}
    migrations: Sequence[str] = ()
    periodic: Sequence[Periodic] = ()
    routes: Routes | None = None
    publishes: bool = True  # has an outbox read by a Debezium connector
    # The topics its outbox may publish to: checked when a record is emitted, and by a
    # constraint on its outbox table. Only the policy service may write `commands`.
    emits: tuple[str, ...] = ("incidents",)
    loop: Mapping[str, Any] = field(default_factory=dict)  # extra LoopConfig fields
    # The member whose records this service states (its ce_source, whose key signs them:
    # flotilla.provenance), when it runs under a name of its own (a second deployment with
    # its own consumer group, a test); None: its name.
    producer: str | None = None
    # Why the service cannot do its job now, beyond its database (None: it can): makes
    # /readyz answer 503 with the reason (the health agent while its metrics fail).
    not_ready: Callable[[], str | None] | None = None
    # What the service reads from its copy of the incident workflow besides whether a
    # record it handles is accepted: the sets of states its deferred work and its API check
    # (``status in S``). With the handled types they decide which records it may skip
    # unread (``workflow.needed_types``); a check missing here could be answered wrongly.
    observes: tuple[frozenset[Status], ...] = ()


def prepare(spec: ServiceSpec, settings: ServiceSettings) -> ServiceContext:
    """Database, connector, migrations, pool and serde: everything before running."""
    if spec.publishes:
        bootstrap_outbox(settings, spec.database, topics=spec.emits)
    else:
        ensure_database(settings, spec.database)
    with psycopg.connect(settings.pg_dsn(spec.database), autocommit=True) as conn:
        consumer.migrate(conn)
        allow_topics(conn, spec.emits)
        for sql in spec.migrations:
            conn.execute(sql)
    pool = open_pool(settings.model_copy(update={"service_database": spec.database}))
    serde = AvroSerde(registry_client(settings.schema_registry_url))
    return ServiceContext(spec, settings, pool, serde)


def _unavailable(exc: BaseException) -> bool:
    """A dependency that is not answering yet (down, restarting, rebalancing), as opposed
    to one that answered no (a bad connector config, a failed migration)."""
    if isinstance(exc, ConnectError):
        return exc.transient
    return isinstance(exc, psycopg.OperationalError | urllib.error.URLError | ConnectionError | TimeoutError)


def prepare_when_available(
    spec: ServiceSpec,
    settings: ServiceSettings,
    *,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> ServiceContext:
    """:func:`prepare`, retried with back-off (0.5 s doubling to 10 s) while PostgreSQL or
    Kafka Connect is unavailable, for ``startup_patience_seconds``; any other error, or
    the patience running out, is raised."""
    deadline = clock() + settings.startup_patience_seconds
    delay = 0.5
    while True:
        try:
            return prepare(spec, settings)
        except Exception as exc:
            if not _unavailable(exc) or clock() + delay > deadline:
                raise
            what = (
                "PostgreSQL" if isinstance(exc, psycopg.OperationalError) else f"Kafka Connect ({settings.connect_url})"
            )
            log.warning("%s: %s unavailable at start (%s); retrying in %.1f s", spec.name, what, exc, delay)
            sleep(delay)
            delay = min(delay * 2, 10.0)


def build_loop(ctx: ServiceContext) -> ConsumerLoop:
    spec = ctx.spec
    handlers = spec.handlers(ctx)
    config = loop_config(spec, handlers, ctx.source)
    return ConsumerLoop(
        config, ctx.settings, ctx.serde, ctx.pool, handlers, outbox=ctx.outbox, provenance=ctx.provenance
    )


def loop_config(spec: ServiceSpec, handlers: Mapping[str, Handler], source: str) -> LoopConfig:
    """The service's loop settings, with the record types it reads: those it handles, and
    (following the workflow) those its copy of each incident's state needs; the rest are
    skipped unread."""
    config = LoopConfig(name=spec.name, topics=spec.topics, source=source, emits=spec.emits, **dict(spec.loop))
    if not config.follow_workflow:
        return replace(config, needs=frozenset(handlers))
    needs = needed_types(handlers, spec.observes, counts_steps=config.budgets is not None)
    return replace(config, needs=needs)


def fact_signer(settings: ServiceSettings) -> Signer:
    """The member's own signing key (FLOTILLA_SIGNING_KEY_FILE)."""
    return required_signer(
        settings.signing_key_file,
        setting="FLOTILLA_SIGNING_KEY_FILE",
        why="every record a member emits is signed with its own key, and its consumers refuse unsigned ones",
    )


def fact_provenance(settings: ServiceSettings) -> Provenance:
    """Each producer's trusted keys (FLOTILLA_PRODUCER_KEYS: a JSON object, member name → keys)."""
    provenance = Provenance.parse(settings.producer_keys)
    if not provenance:
        raise ValueError(
            "FLOTILLA_PRODUCER_KEYS is empty: a member believes a record only when its producer's key signed it; "
            'set {"health-agent": ["ed25519:…"], …} (python -m flotilla.keys public <key file>)'
        )
    return provenance


def _run_periodic(ctx: ServiceContext, interval: float | Pace, task: Callable[[ServiceContext], None]) -> None:
    name = getattr(task, "__name__", "task")
    while not _paced(ctx, interval):
        try:
            task(ctx)
        except Exception:  # a failing tick is logged and retried next tick, never fatal
            log.exception("periodic task %s failed", name)


def _paced(ctx: ServiceContext, interval: float | Pace) -> bool:
    """Wait for the next run; True when the service is stopping instead."""
    if isinstance(interval, (int, float)):
        return ctx.stopping.wait(interval)
    interval.wait(ctx)
    return ctx.stopping.is_set()


def start_periodic(ctx: ServiceContext) -> list[threading.Thread]:
    threads = []
    for interval, task in ctx.spec.periodic:
        thread = threading.Thread(
            target=_run_periodic, args=(ctx, interval, task), name=getattr(task, "__name__", "periodic"), daemon=True
        )
        thread.start()
        threads.append(thread)
    return threads


def service_retention(ctx: ServiceContext) -> Retention:
    """What this service may prune: dedupe claims once no consumed topic can deliver their
    record again (read from the brokers; kept for ever if they cannot be asked), outbox rows
    after ``outbox_retention_hours``."""
    settings = ctx.settings
    try:
        kept = topic_retention_ms(AdminClient(settings.kafka_client()), ctx.spec.topics)
        window = dedupe_window(kept.values(), margin=timedelta(hours=settings.dedupe_margin_hours))
    except Exception as exc:  # no answer about retention: prune nothing that dedupe needs
        log.warning("topic retention unknown (%s): dedupe claims are kept", exc)
        window = None
    outbox = timedelta(hours=settings.outbox_retention_hours) if ctx.spec.publishes else None
    return Retention(dedupe=window, outbox=outbox)


def _start_retention(ctx: ServiceContext) -> threading.Thread:
    retention = service_retention(ctx)
    log.info("retention: dedupe claims %s, outbox rows %s", retention.dedupe or "kept", retention.outbox or "-")

    def prune_tables(ctx: ServiceContext) -> None:
        with ctx.pool.connection() as conn:
            prune(conn, retention, ctx.now(), service=ctx.spec.name)

    thread = threading.Thread(
        target=_run_periodic, args=(ctx, ctx.settings.retention_interval_seconds, prune_tables), daemon=True
    )
    thread.name = "retention"
    thread.start()
    return thread


# One keeper per connector, for the life of the process: what failed, where, and since when.
_keepers: dict[str, connectors.Keeper] = {}
_keepers_lock = threading.Lock()


def outbox_keeper(ctx: ServiceContext) -> connectors.Keeper:
    """The keeper of this service's outbox connector."""
    name = connectors.connector_name(ctx.spec.database)
    with _keepers_lock:
        keeper = _keepers.get(name)
        if keeper is None or keeper.connect_url != ctx.settings.connect_url:
            keeper = _keepers[name] = connectors.Keeper(ctx.settings.connect_url, name)
        return keeper


def keep_outbox_connector(ctx: ServiceContext) -> None:
    """Restart this service's outbox connector if it FAILED: its rows would otherwise wait
    in the outbox until someone restarts it by hand. One that fails again at the same row
    is restarted with back-off and reported (:class:`flotilla.connectors.Keeper`). Connect
    not answering is the stack's problem, not this task's: logged briefly, asked again next tick."""
    keeper = outbox_keeper(ctx)
    try:
        restarted = keeper.check()
    except (ConnectError, OSError) as exc:
        log.info("outbox connector %s: Kafka Connect did not answer (%s)", keeper.name, exc)
        return
    finally:
        metrics.CONNECTOR_FAILURES.labels(ctx.spec.name).set(keeper.failures)
    if restarted:
        metrics.CONNECTOR_RESTARTS.labels(ctx.spec.name).inc()


def count_set_aside_rows(ctx: ServiceContext) -> None:
    """``flotilla_outbox_rows_set_aside``: the rows of this service's outbox its connector sets
    aside for their size; each logged once per process with its id, so an operator can find
    the notice on ``<topic>.dlq`` and the row itself."""
    with ctx.pool.connection() as conn:
        rows = connectors.set_aside_rows(conn)
    metrics.ROWS_SET_ASIDE.labels(ctx.spec.name).set(len(rows))
    for row_id, topic, record_type, size in rows:
        if row_id not in _reported_set_aside:
            _reported_set_aside.add(row_id)
            log.error(
                "outbox row %s (%s for %s, about %d bytes) is over the %d bytes Kafka accepts: its connector set it "
                "aside (a notice on %s); see docs/operations/delivery.md",
                row_id,
                record_type,
                topic,
                size,
                connectors.MAX_RECORD_BYTES,
                dlq_topic(topic),
            )


_reported_set_aside: set[str] = set()
# How often the outbox is scanned for rows set aside: a sequential scan of the rows kept.
SET_ASIDE_SCAN_SECONDS = 60.0


def connector_not_ready(ctx: ServiceContext) -> str | None:
    """Why the service cannot publish (its connector is held up at one row), else None."""
    return outbox_keeper(ctx).stuck if ctx.spec.publishes else None


def _start_connector_keeper(ctx: ServiceContext) -> list[threading.Thread]:
    if not ctx.spec.publishes:
        return []
    threads = []
    for interval, task in (
        (ctx.settings.connector_check_seconds, keep_outbox_connector),
        (SET_ASIDE_SCAN_SECONDS, count_set_aside_rows),
    ):
        thread = threading.Thread(
            target=_run_periodic, args=(ctx, interval, task), name=task.__name__.replace("_", "-"), daemon=True
        )
        thread.start()
        threads.append(thread)
    return threads


def start(spec: ServiceSpec, settings: ServiceSettings | None = None) -> None:
    """Run ``spec`` until SIGTERM/SIGINT (blocking)."""
    settings = settings or ServiceSettings.load(service_name=spec.name, service_database=spec.database)
    logging.basicConfig(level=settings.log_level, format=f"%(asctime)s %(levelname)s {spec.name} %(name)s %(message)s")
    # httpx logs every request at INFO: the health agent queries Prometheus twice a second.
    logging.getLogger("httpx").setLevel(max(logging.WARNING, logging.getLogger().level))
    tracing.configure(spec.name)  # OTEL_* variables; off unless OTEL_TRACES_EXPORTER is set
    ctx = prepare_when_available(spec, settings)
    loop = build_loop(ctx) if spec.topics else None
    server = None
    if settings.http_port:
        app = create_app(
            spec.name,
            lambda: database_ready(ctx.pool) and not ctx.stopping.is_set(),
            not_ready=lambda: (spec.not_ready() if spec.not_ready is not None else None) or connector_not_ready(ctx),
            max_body_bytes=settings.http_max_body_bytes,
        )
        if spec.routes is not None:
            spec.routes(app, ctx)
        server = serve_http(app, settings.http_host, settings.http_port)
    threads = [*start_periodic(ctx), _start_retention(ctx), *_start_connector_keeper(ctx)]
    log.info("%s started (topics: %s, http: %s)", spec.name, ", ".join(spec.topics) or "-", settings.http_port or "-")
    try:
        if loop is not None:
            loop.install_signal_handlers()
            loop.run()
        else:
            _wait_for_signal(ctx)
    finally:
        ctx.stopping.set()
        for thread in threads:
            thread.join(timeout=10)
        if server is not None:
            server.should_exit = True
        ctx.pool.close()
        log.info("%s stopped", spec.name)


def run_service(build_spec: Callable[[S], ServiceSpec], settings_class: type[S]) -> None:
    """A service's whole ``__main__``: its settings from the environment, its spec built
    from them, run until SIGTERM. Every service starts this one way."""
    settings = settings_class.load()
    start(build_spec(settings), settings)


def run_app(
    build_app: Callable[[S], FastAPI],
    settings_class: type[S],
    *,
    address: Callable[[S], tuple[str, int]] = lambda s: (s.http_host, s.http_port),
    access_log: bool = True,
) -> None:
    """The whole ``__main__`` of a service that only serves HTTP (the sim, the console):
    its settings, its app built from them, served by uvicorn until SIGTERM (uvicorn stops
    gracefully and re-raises the signal, so the process ends "killed by SIGTERM")."""
    import uvicorn

    settings = settings_class.load()
    logging.basicConfig(
        level=settings.log_level, format=f"%(asctime)s %(levelname)s {settings.service_name} %(name)s %(message)s"
    )
    app = build_app(settings)
    host, port = address(settings)
    uvicorn.run(app, host=host, port=port, log_level=settings.log_level.lower(), access_log=access_log)


def _wait_for_signal(ctx: ServiceContext) -> None:
    import signal

    def handle(signum: int, frame: object) -> None:
        ctx.stopping.set()

    signal.signal(signal.SIGTERM, handle)
    signal.signal(signal.SIGINT, handle)
    while not ctx.stopping.wait(0.5):
        pass
