"""Debezium outbox connectors, one per service database, registered idempotently.

The definition is the whole outbox contract on the Connect side: pgoutput logical
decoding of just the outbox table (a filtered publication), the Outbox Event Router
routing by ``aggregatetype`` and keying by ``aggregateid``, the payload passed through
as raw bytes, and the CloudEvents columns placed as headers — a NULL column as no header
at all (our DropNullHeaders transform, after the router). The database password is
an ``${env:...}`` reference resolved by the Connect worker, so definitions carry no
secret and the same JSON serves the local stack and docker compose.
"""

from __future__ import annotations

import json
import logging
import re
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from typing import Any

from flotilla.bounds import KAFKA_MAX_REQUEST_BYTES
from flotilla.deadletter import DLQ_SUFFIX
from flotilla.delivery import DEFAULT_DELIVERY, Delivery, delivery_config
from flotilla.fleet import FLEET
from flotilla.outbox import HEADER_COLUMNS, OUTBOX_TABLE

log = logging.getLogger(__name__)

# Debezium's PostgreSQL connector, as our subclass (infra/connect-transforms, in Debezium's
# plugin folder): rows pass exactly as with Debezium's own task, but an idle task waits for
# an event instead of spinning, and returns an empty batch to the worker (with exactly-once
# delivery: ending a transaction and a read of the offsets topic) once per IDLE_RETURN_MS
# rather than every poll. docs/operations/observability.md has the figures.
OUTBOX_CONNECTOR_CLASS = "dev.flotilla.connect.OutboxPostgresConnector"
# Connect checks whether a source task should stop only between polls, and gives up on a
# graceful stop after 5 s (task.shutdown.graceful.timeout.ms): well below that.
IDLE_RETURN_MS = 2000
# When the WAL ran dry, our task has Debezium's reader wait on its replication socket, which
# a new row ends at once, for at most WAL_WAIT_MS (infra/connect-transforms, WalWake): a row
# no longer waits for the reader's sleep (it was 8 ms of a 16 ms hop at the median, at 20 ms),
# and an idle reader wakes twice a second. POLL_INTERVAL_MS is Debezium's own sleep, the
# fallback for a Debezium the task cannot reach into (it logs a warning): the hop's worst
# wait for a row then, as before. Each of its wake-ups costs a few timed socket reads (~0.6 %
# of a core per connector at 20 ms), so databases whose records nobody waits on keep
# Debezium's default (poll_interval_ms).
WAL_WAIT_MS = 500
POLL_INTERVAL_MS = 20
BACKGROUND_POLL_INTERVAL_MS = 500
# A poll returns as soon as its batch is full; with one record per batch the first row is
# handed over at once. Under a burst each row is its own poll (with exactly-once delivery,
# its own transaction), which at Flotilla's rates costs less than the latency a larger
# batch would add.
MAX_BATCH_SIZE = 1

# Our own transforms (infra/connect-transforms), a plugin beside Debezium's on every Connect worker.
DROP_NULL_HEADERS = "dev.flotilla.connect.DropNullHeaders"
SET_ASIDE = "dev.flotilla.connect.SetAside"
# The most bytes one record may take when Connect's producer sends it: the producer's
# max.request.size (Kafka's default; neither the worker nor the connectors override it), below
# the broker's message.max.bytes (1,048,588). A row over it is set aside by SetAside: a notice
# goes to <topic>.dlq and the rows after it flow, where Kafka's refusal would fail the task at
# that row on every restart. SET_ASIDE_RECORD_OVERHEAD and SET_ASIDE_HEADER_OVERHEAD are
# SetAside's RECORD_OVERHEAD and HEADER_OVERHEAD: set_aside_rows counts with the same formula.
MAX_RECORD_BYTES = KAFKA_MAX_REQUEST_BYTES
SET_ASIDE_RECORD_OVERHEAD = 128
SET_ASIDE_HEADER_OVERHEAD = 16
FILTER = "org.apache.kafka.connect.transforms.Filter"
TOPIC_NAME_MATCHES = "org.apache.kafka.connect.transforms.predicates.TopicNameMatches"

# A transform's name in the chain and its settings without the ``transforms.<name>.`` prefix.
Transform = tuple[str, dict[str, str]]


def transforms_config(chain: list[Transform]) -> dict[str, str]:
    """Connect's ``transforms`` list and each transform's keys, in chain order (records pass
    through the transforms in that order)."""
    names = [name for name, _ in chain]
    duplicated = sorted({name for name in names if names.count(name) > 1})
    if duplicated:
        raise ValueError(f"transform name(s) used twice in one chain: {', '.join(duplicated)}")
    config = {"transforms": ",".join(names)}
    for name, settings in chain:
        if "type" not in settings:
            raise ValueError(f"transform {name!r} has no type (its class)")
        config.update({f"transforms.{name}.{key}": value for key, value in settings.items()})
    return config


def outbox_router(placement: str) -> dict[str, str]:
    """Debezium's Outbox Event Router: topic from ``aggregatetype``, key from ``aggregateid``,
    the payload as it is, and the columns of ``placement`` as headers."""
    return {
        "type": "io.debezium.transforms.outbox.EventRouter",
        "route.by.field": "aggregatetype",
        "route.topic.replacement": "${routedByValue}",
        "table.field.event.id": "id",
        "table.field.event.key": "aggregateid",
        "table.field.event.payload": "payload",
        "table.expand.json.payload": "false",
        "table.fields.additional.placement": placement,
        "route.tombstone.on.empty.payload": "false",
    }


def connector_name(database: str) -> str:
    """``outbox-<database>`` with ``_`` as ``-``: a valid Kubernetes name, so the connector
    a service registers and the KafkaConnector Strimzi manages are one and the same."""
    return f"outbox-{database.replace('_', '-')}"


def poll_interval_ms(database: str) -> int:
    """How often the connector of ``database`` looks at the WAL: often for a fleet member an
    incident waits on (and any other database), rarely for one it does not (fleet.Member.awaited).
    Decided here, from the database, so every path that registers it writes the same config."""
    background = {m.database for m in FLEET if m.database is not None and not m.awaited}
    return BACKGROUND_POLL_INTERVAL_MS if database in background else POLL_INTERVAL_MS


def outbox_connector_config(
    database: str,
    *,
    host: str = "${env:FLOTILLA_PG_HOST}",
    port: str = "${env:FLOTILLA_PG_PORT}",
    user: str = "${env:FLOTILLA_PG_USER}",
    password: str = "${env:FLOTILLA_PG_PASSWORD}",
    topics: Sequence[str] | None = None,
    delivery: Delivery = DEFAULT_DELIVERY,
) -> dict[str, str]:
    """The Kafka Connect config of the outbox connector for one service database.

    ``delivery``: how its rows reach their topics; the worker must agree
    (:func:`worker_exactly_once_source_support`).

    ``topics``: the only topics this database's rows may be published to (its service's
    ``emits``); any other row is dropped by Connect itself. The outbox table's constraint
    already refuses such rows; this holds too when someone with the database role has
    dropped the constraint. None: any topic (the compose outbox demo).

    A row Kafka would refuse for its size (over :data:`MAX_RECORD_BYTES`) is set aside, last
    in the chain (after the allowlist, as its notice goes to another topic): a notice with the
    row's identity goes to ``<topic>.dlq``, where the DLQ reconciler quarantines it like any
    dead letter, and the row stays in the outbox table (docs/operations/delivery.md).
    """
    placement = ",".join(f"{col}:header:{hdr}" for col, hdr in HEADER_COLUMNS.items())
    chain: list[Transform] = [
        ("outbox", outbox_router(placement)),
        # After the router: it adds a null-valued header for each NULL column (a root
        # record's ce_causationid); an absent CloudEvents attribute is an absent header.
        ("dropnulls", {"type": DROP_NULL_HEADERS}),
    ]
    predicates: dict[str, str] = {}
    if topics is not None:
        # Filter drops what its predicate matches; negated, it keeps only the declared topics.
        chain.append(("allowlist", {"type": FILTER, "predicate": "declared", "negate": "true"}))
        predicates = {
            "predicates": "declared",
            "predicates.declared.type": TOPIC_NAME_MATCHES,
            "predicates.declared.pattern": topic_pattern(topics),
        }
    chain.append(
        (
            "setaside",
            {
                "type": SET_ASIDE,
                "max.bytes": str(MAX_RECORD_BYTES),
                "topic.suffix": DLQ_SUFFIX,
                "origin": connector_name(database),
            },
        )
    )
    return {
        "connector.class": OUTBOX_CONNECTOR_CLASS,
        "tasks.max": "1",
        "plugin.name": "pgoutput",
        "database.hostname": host,
        "database.port": port,
        "database.user": user,
        "database.password": password,
        "database.dbname": database,
        "topic.prefix": f"flotilla.{database}",
        "table.include.list": f"public.{OUTBOX_TABLE}",
        "publication.name": f"flotilla_outbox_{database}",
        "publication.autocreate.mode": "filtered",
        "slot.name": f"flotilla_outbox_{database}",
        # Rows written before the connector existed are still published (snapshot),
        # then the WAL is streamed.
        "snapshot.mode": "initial",
        **delivery_config(delivery),
        "poll.interval.ms": str(poll_interval_ms(database)),
        "flotilla.wal.wait.ms": str(WAL_WAIT_MS),
        "flotilla.idle.return.ms": str(IDLE_RETURN_MS),
        "max.batch.size": str(MAX_BATCH_SIZE),
        "tombstones.on.delete": "false",
        # Only the CloudEvents headers travel; no __debezium.context.* noise.
        "extended.headers.enabled": "false",
        "key.converter": "org.apache.kafka.connect.storage.StringConverter",
        "value.converter": "org.apache.kafka.connect.converters.ByteArrayConverter",
        "header.converter": "org.apache.kafka.connect.storage.SimpleHeaderConverter",
        **transforms_config(chain),
        **predicates,
    }


def topic_pattern(topics: Sequence[str]) -> str:
    """A Java regex matching exactly these topic names (Connect's TopicNameMatches matches
    the whole name); no topic: a pattern that matches nothing."""
    if not topics:
        return "(?!)"
    return "|".join(re.escape(t) for t in sorted(set(topics)))


class ConnectError(RuntimeError):
    """Kafka Connect refused or failed a request; the message carries its answer and
    ``status`` its HTTP status (None when the connector itself failed or never ran)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status

    @property
    def transient(self) -> bool:
        """Connect could not answer now (starting, rebalancing: 409, 5xx); asking again may work."""
        return self.status is not None and (self.status == 409 or self.status >= 500)


def _request(url: str, method: str = "GET", body: object | None = None) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            raw = resp.read()
    except urllib.error.HTTPError as exc:
        raise ConnectError(f"{method} {url} -> {exc.code}: {exc.read().decode(errors='replace')}", exc.code) from exc
    return json.loads(raw) if raw else None


def register_connector(connect_url: str, name: str, config: dict[str, str]) -> None:
    """Create or update a connector; leave it alone when its config is already this one.

    Connect restarts a connector on every PUT of its config, an unchanged one included
    ("connector-only config update"), so a service that restarts (a crash, a deploy) would
    otherwise restart its outbox connector too. A changed connector is awaited until its
    tasks run the new config (bounded)."""
    url = f"{connect_url}/connectors/{name}/config"
    try:
        current = _request(url)
    except ConnectError as exc:
        if exc.status != 404:
            raise
        current = None
    if isinstance(current, dict) and _without_name(current) == _without_name(config):
        return
    try:
        _request(url, method="PUT", body=config)
    except ConnectError as exc:
        if exc.status == 500 and config.get("exactly.once.support") == "required":
            # A worker without exactly.once.source.support answers this with a bare NPE.
            raise ConnectError(
                f"{exc} — the connector requires exactly-once delivery: is the Connect worker's "
                "exactly.once.source.support enabled? FLOTILLA_OUTBOX_DELIVERY and the worker must agree "
                "(docs/operations/delivery.md)",
                exc.status,
            ) from exc
        raise
    if current is not None:
        _await_tasks_with(connect_url, name, config)


# How long a changed connector may take to run its tasks with the new config.
RECONFIGURE_WAIT_SECONDS = 30.0


def _await_tasks_with(connect_url: str, name: str, config: dict[str, str]) -> None:
    """Until the connector's tasks carry ``config`` and run. Connect applies a changed
    config asynchronously, and until then the old tasks keep publishing under the old one:
    a narrowed topic allowlist would still let a row through (with exactly-once delivery the
    new generation fences the old tasks; at least once it does not). Bounded: a worker slow
    to rebalance is logged, not fatal to the service that starts."""
    deadline = time.monotonic() + RECONFIGURE_WAIT_SECONDS
    base = f"{connect_url}/connectors/{name}"
    while time.monotonic() < deadline:
        try:
            tasks = _request(f"{base}/tasks")
            states = _request(f"{base}/status").get("tasks", [])
        except ConnectError:
            tasks, states = [], []
        configured = bool(tasks) and all(
            all(task["config"].get(k, v) == v for k, v in config.items()) for task in tasks
        )
        if configured and len(states) == len(tasks) and all(t.get("state") == "RUNNING" for t in states):
            return
        time.sleep(0.2)
    log.warning("connector %s: tasks not running with its new config after %g s", name, RECONFIGURE_WAIT_SECONDS)


def _without_name(config: dict[str, Any]) -> dict[str, Any]:
    """A connector's config as Connect returns it holds its name too."""
    return {k: v for k, v in config.items() if k != "name"}


def delete_connector(connect_url: str, name: str) -> None:
    """Stop the connector, forget its source offsets, then delete it.

    Connect keeps a deleted connector's offsets; a new connector of the same name (a
    database dropped and recreated, say) would resume from an LSN that no longer exists
    and fail. Offsets can only be reset while the connector is STOPPED.
    """
    base = f"{connect_url}/connectors/{name}"
    try:
        _request(f"{base}/stop", method="PUT")
    except ConnectError as exc:
        if "404" in str(exc):
            return
        raise
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if _request(f"{base}/status")["connector"]["state"] == "STOPPED":
            break
        time.sleep(0.2)
    _request(f"{base}/offsets", method="DELETE")
    _request(base, method="DELETE")


def failure(status: Any) -> str | None:
    """Why a connector status (GET /connectors/NAME/status) has its connector or a task
    FAILED, one line per failed part: each Java trace condensed to its exception and every
    cause ("A: … <- B: … <- C: …"), cut to 2,000 characters; None when nothing failed.
    The causes are the point: the last lines of a trace are frames of the driver."""
    parts = [status["connector"], *status.get("tasks", [])]
    if not any(part.get("state") == "FAILED" for part in parts):
        return None
    reasons = [condensed(part.get("trace", "")) for part in parts if part.get("state") == "FAILED"]
    return (" | ".join(r for r in reasons if r) or "(no trace)")[:2000]


def condensed(trace: str) -> str:
    """A Java stack trace as its first line and its "Caused by:" lines, innermost last."""
    lines = [line.strip() for line in trace.splitlines()]
    kept = [lines[0]] if lines else []
    kept += [line.removeprefix("Caused by: ") for line in lines[1:] if line.startswith("Caused by: ")]
    return " <- ".join(kept)


def restart_failed(connect_url: str, name: str) -> None:
    """Restart the parts of a connector that FAILED (connector and tasks alike).

    Connect never restarts a failed task itself ("will not recover until manually
    restarted"), and Debezium fails its task for good on errors it does not classify as
    retriable: PostgreSQL exiting while the task starts ("terminating connection due to
    unexpected postmaster exit"), a failover, a slot still held by the previous task."""
    _request(f"{connect_url}/connectors/{name}/restart?includeTasks=true&onlyFailed=true", method="POST")


def heal(connect_url: str, name: str) -> str | None:
    """Restart the connector's failed parts if it has any; what had failed (None: nothing)."""
    failed = failure(_request(f"{connect_url}/connectors/{name}/status"))
    if failed is not None:
        log.warning("connector %s had failed, restarting it: %s", name, failed[:500])
        restart_failed(connect_url, name)
    return failed


# After a restart Connect may still report the old FAILED state for a moment: the next look
# comes this much later, so one failure is not restarted twice.
RESTART_SETTLE_SECONDS = 2.0


def wait_running(connect_url: str, name: str, timeout: float = 60, *, restarts: int = 3) -> None:
    """Block until the connector and its task report RUNNING. A part that FAILED is
    restarted up to ``restarts`` times (a start that raced a database restart succeeds on
    the next try); after that the failure is raised with its trace."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = _request(f"{connect_url}/connectors/{name}/status")
        except ConnectError:
            time.sleep(0.3)
            continue
        failed = failure(last)
        if failed is not None:
            if restarts <= 0:
                raise ConnectError(f"connector {name} failed: {failed}")
            restarts -= 1
            log.warning("connector %s failed, restarting it (%d more tries): %s", name, restarts, failed[:500])
            restart_failed(connect_url, name)
            time.sleep(RESTART_SETTLE_SECONDS)
            continue
        states = [last["connector"]["state"]] + [t["state"] for t in last.get("tasks", [])]
        if last.get("tasks") and all(s == "RUNNING" for s in states):
            return
        time.sleep(0.3)
    raise ConnectError(f"connector {name} not RUNNING after {timeout:.0f}s; last status: {last}")


def committed_position(connect_url: str, name: str) -> str | None:
    """The source position Connect last committed for the connector (Debezium's ``lsn``,
    else the whole offset), or None when it has none or Connect cannot say. A task that fails
    again at the same position failed on the same row: the one after it."""
    try:
        answer = _request(f"{connect_url}/connectors/{name}/offsets")
    except (ConnectError, OSError):
        return None
    offsets = [entry.get("offset") or {} for entry in (answer or {}).get("offsets", [])]
    if not offsets:
        return None
    lsns = [str(o["lsn"]) for o in offsets if "lsn" in o]
    return f"lsn {','.join(lsns)}" if lsns else json.dumps(offsets, sort_keys=True)


# A task that fails again at the position it failed at before is restarted after this many
# seconds, doubling with each further failure up to RESTART_BACKOFF_MAX_SECONDS; the first
# failure at a position is restarted at once (most failures are a database or broker restart).
RESTART_BACKOFF_SECONDS = 10.0
RESTART_BACKOFF_MAX_SECONDS = 600.0


class Keeper:
    """Restarts a FAILED outbox connector, and knows when restarting no longer helps.

    Connect never restarts a failed task, so a service restarts its own connector. A task
    that fails again at the same committed position is failing on the same row: restarting
    it at once, for ever, only repeats the failure (and its log). The keeper then waits
    RESTART_BACKOFF_SECONDS, doubling, between restarts, logs the failure's causes and the
    position at each failure, and says so in :attr:`stuck` (the service's ``/readyz`` and
    ``flotilla_outbox_connector_failures``) until the task runs again.
    """

    def __init__(self, connect_url: str, name: str, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.connect_url = connect_url
        self.name = name
        self._clock = clock
        self.failures = 0  # failures in a row at `position`, 0 while the task runs
        self.position: str | None = None
        self.trace: str | None = None
        self._restarted = False  # a restart since the failure last counted
        self._next_restart = 0.0

    @property
    def stuck(self) -> str | None:
        """Why publishing is held up (None: it is not): the task failed again at the same
        position after a restart."""
        if self.failures < 2:
            return None
        return (
            f"outbox connector {self.name} failed {self.failures} times at {self.position or 'an unknown position'}: "
            f"{(self.trace or '')[:500]}"
        )

    def check(self) -> bool:
        """One look at the connector: restart it if it FAILED and its back-off is over.
        True when it was restarted. Raises :class:`ConnectError` / OSError when Connect
        does not answer."""
        status = _request(f"{self.connect_url}/connectors/{self.name}/status")
        failed = failure(status)
        if failed is None:
            if status.get("tasks") and all(t.get("state") == "RUNNING" for t in status["tasks"]):
                if self.failures >= 2:
                    log.warning(
                        "connector %s runs again after %d failures at %s", self.name, self.failures, self.position
                    )
                self.failures, self.position, self.trace = 0, None, None
            return False
        now = self._clock()
        if self.failures == 0 or self._restarted:  # a failure not counted yet
            position = committed_position(self.connect_url, self.name)
            where = position or "an unknown position"
            same = self.failures > 0 and position == self.position
            self.failures = self.failures + 1 if same else 1
            self.position, self.trace, self._restarted = position, failed, False
            delay = 0.0 if self.failures == 1 else RESTART_BACKOFF_SECONDS * 2 ** (self.failures - 2)
            self._next_restart = now + min(delay, RESTART_BACKOFF_MAX_SECONDS)
            if self.failures == 1:
                log.warning("connector %s had failed at %s, restarting it: %s", self.name, where, failed[:500])
            else:
                log.error(
                    "connector %s failed again at the same position (%s), %d times in a row; next restart in %.0f s. "
                    "A row it cannot publish? docs/operations/delivery.md says what to do: %s",
                    self.name,
                    where,
                    self.failures,
                    self._next_restart - now,
                    failed,
                )
        if now < self._next_restart:
            return False
        restart_failed(self.connect_url, self.name)
        self._restarted = True
        return True


# Headers the Outbox Event Router adds of its own: the row's id as ``id``.
ROUTER_HEADERS = {"id": "id"}


def set_aside_size_sql() -> str:
    """SQL for the bytes an outbox row's record takes as SetAside counts them: its key
    (aggregateid), its payload, and each header with its name: the router's own and one per
    non-NULL header column."""
    placed = [*ROUTER_HEADERS.items(), *HEADER_COLUMNS.items()]
    headers = " + ".join(
        # id is a uuid: as a header, its 36-character text
        f"coalesce(octet_length({'id::text' if column == 'id' else column}) "
        f"+ {SET_ASIDE_HEADER_OVERHEAD + len(header.encode())}, 0)"
        for column, header in placed
    )
    return f"({SET_ASIDE_RECORD_OVERHEAD} + octet_length(aggregateid) + octet_length(payload) + {headers})"


def set_aside_rows(conn: Any) -> list[tuple[str, str, str, int]]:
    """The rows of this database's outbox that the connector sets aside for their size, still
    in the table: (id, topic, type, bytes)."""
    size = set_aside_size_sql()
    rows = conn.execute(
        f"SELECT id::text, aggregatetype, type, {size} FROM {OUTBOX_TABLE} WHERE {size} > %s ORDER BY created_at",
        (MAX_RECORD_BYTES,),
    ).fetchall()
    return [(str(r[0]), str(r[1]), str(r[2]), int(r[3])) for r in rows]
