"""The Debezium outbox connector definition (no Kafka Connect involved)."""

from __future__ import annotations

import re

import pytest
from pydantic import ValidationError

from flotilla import connectors
from flotilla.connectors import (
    BACKGROUND_POLL_INTERVAL_MS,
    DROP_NULL_HEADERS,
    POLL_INTERVAL_MS,
    ConnectError,
    connector_name,
    outbox_connector_config,
    poll_interval_ms,
    transforms_config,
)
from flotilla.delivery import DEFAULT_DELIVERY, delivery_config, worker_exactly_once_source_support
from flotilla.envelope import Envelope
from flotilla.fleet import AUDIT, DIAGNOSTIC, DLQ_RECONCILER, EXECUTOR, FLEET, HEALTH, POLICY, REMEDIATION
from flotilla.outbox import HEADER_COLUMNS, OUTBOX_MIGRATION, OUTBOX_TABLE
from flotilla.provenance import SIGNATURE_HEADER
from flotilla.settings import StackSettings

ENV_REF = re.compile(r"\$\{env:[A-Z][A-Z0-9_]*\}")


@pytest.fixture(scope="module")
def config() -> dict[str, str]:
    return outbox_connector_config("flotilla")


def _placements(config: dict[str, str]) -> list[tuple[str, str, str]]:
    entries = config["transforms.outbox.table.fields.additional.placement"].split(",")
    return [tuple(entry.split(":")) for entry in entries]  # type: ignore[misc]


def test_every_value_is_a_string(config: dict[str, str]) -> None:
    # Kafka Connect's REST API wants string values; a stray int would be refused.
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in config.items())


def test_postgres_connector_over_pgoutput(config: dict[str, str]) -> None:
    # Debezium's PostgreSQL connector, as our subclass (infra/connect-transforms): the same rows,
    # a cheaper idle task.
    assert config["connector.class"] == "dev.flotilla.connect.OutboxPostgresConnector"
    assert int(config["flotilla.idle.return.ms"]) >= 100
    assert config["plugin.name"] == "pgoutput"
    assert config["tasks.max"] == "1"
    assert config["database.dbname"] == "flotilla"


def test_only_the_outbox_table_is_published(config: dict[str, str]) -> None:
    assert OUTBOX_TABLE == "outbox"
    assert config["table.include.list"] == "public.outbox"
    assert config["publication.autocreate.mode"] == "filtered"


def test_poll_interval_is_lowered(config: dict[str, str]) -> None:
    assert int(config["poll.interval.ms"]) == POLL_INTERVAL_MS
    assert 0 < int(config["poll.interval.ms"]) <= 50


def test_only_members_no_incident_waits_on_poll_rarely() -> None:
    by_database = {m.database: m for m in FLEET if m.database is not None}
    rarely = {db for db in by_database if poll_interval_ms(db) == BACKGROUND_POLL_INTERVAL_MS}
    assert rarely == {AUDIT.database, DLQ_RECONCILER.database}  # anchors and quarantine notices
    for member in (HEALTH, DIAGNOSTIC, REMEDIATION, POLICY, EXECUTOR):  # the incident's chain
        assert member.database is not None
        assert int(outbox_connector_config(member.database)["poll.interval.ms"]) == POLL_INTERVAL_MS
    assert poll_interval_ms("flotilla_it_anything") == POLL_INTERVAL_MS  # not a member: fast
    assert BACKGROUND_POLL_INTERVAL_MS > POLL_INTERVAL_MS


def test_event_router_routes_by_aggregatetype_and_keys_by_aggregateid(config: dict[str, str]) -> None:
    assert config["transforms"].split(",")[0] == "outbox"
    assert config["transforms.outbox.type"] == "io.debezium.transforms.outbox.EventRouter"
    assert config["transforms.outbox.route.by.field"] == "aggregatetype"
    assert config["transforms.outbox.route.topic.replacement"] == "${routedByValue}"
    assert config["transforms.outbox.table.field.event.key"] == "aggregateid"
    assert config["transforms.outbox.table.field.event.id"] == "id"
    assert config["transforms.outbox.table.field.event.payload"] == "payload"
    assert config["transforms.outbox.table.expand.json.payload"] == "false"


def test_payload_passes_through_as_raw_bytes(config: dict[str, str]) -> None:
    assert config["value.converter"] == "org.apache.kafka.connect.converters.ByteArrayConverter"
    assert config["key.converter"] == "org.apache.kafka.connect.storage.StringConverter"
    assert "value.converter.schemas.enable" not in config


def test_every_header_column_is_placed_as_a_header(config: dict[str, str]) -> None:
    placements = _placements(config)
    assert all(len(p) == 3 for p in placements), placements
    assert all(kind == "header" for _, kind, _ in placements)
    assert {(col, hdr) for col, _, hdr in placements} == set(HEADER_COLUMNS.items())
    assert len(placements) == len(HEADER_COLUMNS)


def test_placed_headers_are_exactly_the_envelopes_headers(config: dict[str, str]) -> None:
    placed = {hdr for _, _, hdr in _placements(config)}
    emitted = {name for name, _ in Envelope(type="t", source="s", correlationid="c", causationid="x").headers()}
    assert placed == emitted | {SIGNATURE_HEADER}  # the producer's signature travels beside them


def test_placed_columns_exist_in_the_outbox_table(config: dict[str, str]) -> None:
    body = OUTBOX_MIGRATION.split("(", 1)[1]
    columns = set(re.findall(r"^\s+([a-z_]+)\s+(?:uuid|text|bytea|timestamptz)\b", body, flags=re.MULTILINE))
    assert {"id", "aggregatetype", "aggregateid", "payload"} <= columns
    assert {col for col, _, _ in _placements(config)} <= columns


def test_connection_settings_are_env_references(config: dict[str, str]) -> None:
    for key in ("database.hostname", "database.port", "database.user", "database.password"):
        assert ENV_REF.fullmatch(config[key]), f"{key} = {config[key]!r}"
    assert config["database.password"] == "${env:FLOTILLA_PG_PASSWORD}"


def test_no_secret_is_inline() -> None:
    config = outbox_connector_config("svc")
    # The local stack's development password is "flotilla"; it must not appear as a value.
    assert "flotilla" not in config.values()
    assert not any("password" in k and not ENV_REF.fullmatch(v) for k, v in config.items())


def test_connection_overrides_are_used() -> None:
    config = outbox_connector_config("svc", host="db", port="5433", user="u", password="${env:OTHER}")
    assert config["database.hostname"] == "db"
    assert config["database.port"] == "5433"
    assert config["database.user"] == "u"
    assert config["database.password"] == "${env:OTHER}"


def test_names_are_distinct_per_database() -> None:
    a = outbox_connector_config("incidents_svc")
    b = outbox_connector_config("commands_svc")
    for key in ("slot.name", "publication.name", "topic.prefix", "database.dbname"):
        assert a[key] != b[key], key
        assert "incidents_svc" in a[key]
        assert "commands_svc" in b[key]
    assert connector_name("incidents_svc") != connector_name("commands_svc")
    assert connector_name("incidents_svc") == "outbox-incidents-svc"  # a valid Kubernetes name


def test_slot_name_is_a_valid_replication_slot_name() -> None:
    # PostgreSQL slot names: lower-case letters, digits and underscores, at most 63 bytes.
    slot = outbox_connector_config("flotilla")["slot.name"]
    assert re.fullmatch(r"[a-z0-9_]{1,63}", slot), slot


def test_no_tombstones_and_no_extended_headers(config: dict[str, str]) -> None:
    assert config["tombstones.on.delete"] == "false"
    assert config["transforms.outbox.route.tombstone.on.empty.payload"] == "false"
    assert config["extended.headers.enabled"] == "false"


# ------------------------------------------------------------ the transforms chain


def test_null_headers_are_dropped_after_the_router(config: dict[str, str]) -> None:
    # The router adds a header with a null value for a NULL column (a root record's
    # ce_causationid); CloudEvents SDKs refuse such a header, so the drop must run after it.
    chain = config["transforms"].split(",")
    assert chain == ["outbox", "dropnulls", "setaside"]
    assert config["transforms.dropnulls.type"] == DROP_NULL_HEADERS == "dev.flotilla.connect.DropNullHeaders"
    # Every null header, not a list of names: any optional column added later is covered too.
    assert "transforms.dropnulls.headers" not in config


def test_every_transform_key_belongs_to_a_transform_in_the_chain(config: dict[str, str]) -> None:
    chain = set(config["transforms"].split(","))
    owners = {key.split(".")[1] for key in config if key.startswith("transforms.")}
    assert owners == chain
    assert all(f"transforms.{name}.type" in config for name in chain)


def test_the_causation_and_signature_columns_are_the_only_nullable_placed_columns() -> None:
    # What DropNullHeaders exists for: which placed columns can be NULL (a root record has
    # no cause; a tool's unsigned outbox has no signature).
    body = OUTBOX_MIGRATION.split("(", 1)[1]
    nullable = {
        m.group(1)
        for m in re.finditer(r"^\s+([a-z_]+)\s+[a-z]+(.*)$", body, flags=re.MULTILINE)
        if "NOT NULL" not in m.group(2) and "PRIMARY KEY" not in m.group(2)
    }
    assert nullable & set(HEADER_COLUMNS) == {"ce_causationid", "ce_signature"}


def test_transforms_config_keeps_the_chain_order_and_prefixes_the_keys() -> None:
    assert transforms_config([("b", {"type": "B", "x": "1"}), ("a", {"type": "A"})]) == {
        "transforms": "b,a",
        "transforms.b.type": "B",
        "transforms.b.x": "1",
        "transforms.a.type": "A",
    }


def test_transforms_config_refuses_a_name_used_twice() -> None:
    with pytest.raises(ValueError, match="used twice in one chain: outbox"):
        transforms_config([("outbox", {"type": "A"}), ("dropnulls", {"type": "B"}), ("outbox", {"type": "C"})])


def test_transforms_config_refuses_a_transform_without_a_class() -> None:
    with pytest.raises(ValueError, match="'dropnulls' has no type"):
        transforms_config([("dropnulls", {"headers": "ce_causationid"})])


def test_a_connector_publishes_only_its_services_topics() -> None:
    """Connect's own Filter drops a row routed anywhere else (the outbox constraint refuses
    it first; this holds if that constraint was dropped by someone with the database role)."""
    config = outbox_connector_config("flotilla_remediation", topics=("incidents",))
    assert config["transforms"] == "outbox,dropnulls,allowlist,setaside"
    assert config["transforms.allowlist.type"] == "org.apache.kafka.connect.transforms.Filter"
    assert config["transforms.allowlist.negate"] == "true"  # keep what matches, drop the rest
    assert config["predicates.declared.pattern"] == "incidents"
    policy = outbox_connector_config("flotilla_policy", topics=("incidents", "commands", "incidents"))
    assert policy["predicates.declared.pattern"] == "commands|incidents"
    assert outbox_connector_config("x", topics=("incidents.dlq",))["predicates.declared.pattern"] == r"incidents\.dlq"
    assert outbox_connector_config("x", topics=())["predicates.declared.pattern"] == "(?!)"  # nothing
    assert "predicates" not in outbox_connector_config("x")  # unrestricted: the compose outbox demo


def test_a_row_too_large_for_kafka_is_set_aside_last_in_the_chain() -> None:
    """SetAside replaces a record Kafka would refuse (which would fail the task at that row on
    every restart) by a notice on <topic>.dlq: after the allowlist, which would drop the
    notice, and with the producer's own limit (security review 3, H2)."""
    config = outbox_connector_config("flotilla_health", topics=("incidents",))
    assert config["transforms"].split(",")[-1] == "setaside"
    assert config["transforms.setaside.type"] == connectors.SET_ASIDE == "dev.flotilla.connect.SetAside"
    assert int(config["transforms.setaside.max.bytes"]) == connectors.MAX_RECORD_BYTES == 1024 * 1024
    assert config["transforms.setaside.topic.suffix"] == ".dlq"
    assert config["transforms.setaside.origin"] == "outbox-flotilla-health"
    # Connect's own tolerance stays off: it would drop a record after a producer error with a
    # log line only, every record of a topic the worker may not write to included.
    assert not any(key.startswith("errors.") for key in config)


def test_the_sql_size_counts_what_set_aside_counts() -> None:
    """Java's formula (SetAside.estimatedBytes) over the row's columns: key, payload, the
    router's own ``id`` header and each header column with its header name;
    tests/integration/test_outbox_set_aside.py checks the two give the same figure for a real row."""
    size = connectors.set_aside_size_sql()
    assert size.startswith(
        f"({connectors.SET_ASIDE_RECORD_OVERHEAD} + octet_length(aggregateid) + octet_length(payload)"
    )
    placed = [("id", "id"), *HEADER_COLUMNS.items()]
    for column, header in placed:
        expected = f"{'id::text' if column == 'id' else column}) + {connectors.SET_ASIDE_HEADER_OVERHEAD + len(header)}"
        assert expected in size
    assert size.count("coalesce(") == len(placed)


def test_each_delivery_mode_is_one_worker_setting_and_one_connector_setting() -> None:
    """Exactly-once is the worker's (every task of an enabled worker is transactional) and is
    *required* by the connector, so that a worker without it refuses the connector rather
    than silently publishing at-least-once; at-least-once asks nothing of either."""
    eos = outbox_connector_config("flotilla_health", delivery="exactly-once")
    assert eos["exactly.once.support"] == "required" and eos["transaction.boundary"] == "poll"
    assert worker_exactly_once_source_support("exactly-once") == "enabled"
    alo = outbox_connector_config("flotilla_health", delivery="at-least-once")
    assert "exactly.once.support" not in alo and "transaction.boundary" not in alo
    assert worker_exactly_once_source_support("at-least-once") == "disabled"
    # nothing else differs between the two
    assert {k: v for k, v in eos.items() if k not in alo} == delivery_config("exactly-once")
    assert {k: v for k, v in eos.items() if k in alo} == alo
    with pytest.raises(ValueError, match="unknown outbox delivery"):
        worker_exactly_once_source_support("exactly-twice")  # type: ignore[arg-type]


def test_every_connect_we_ship_runs_the_default_delivery() -> None:
    """The generated connector definitions (compose, Kubernetes) and every worker we ship
    agree with DEFAULT_DELIVERY; the local stack derives its worker from the setting."""
    from pathlib import Path

    import yaml

    root = Path(__file__).resolve().parents[2]
    worker = worker_exactly_once_source_support(DEFAULT_DELIVERY)
    compose = yaml.safe_load((root / "docker-compose.yml").read_text())
    assert compose["services"]["connect"]["environment"]["CONNECT_EXACTLY_ONCE_SOURCE_SUPPORT"] == worker
    strimzi = yaml.safe_load((root / "infra" / "k8s" / "base" / "connect" / "kafkaconnect.yaml").read_text())
    assert strimzi["spec"]["config"]["exactly.once.source.support"] == worker
    assert StackSettings().outbox_delivery == DEFAULT_DELIVERY
    assert StackSettings(outbox_delivery="exactly-once").outbox_delivery == "exactly-once"
    with pytest.raises(ValidationError):
        StackSettings(outbox_delivery="exactly-twice")  # type: ignore[arg-type]


def test_a_worker_without_exactly_once_gets_a_clear_error_from_an_exactly_once_registration(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Connect answers a connector that requires exactly-once on a worker without it with a
    bare NullPointerException (HTTP 500): the error says what to check."""

    def refuse(url: str, method: str = "GET", body: object | None = None) -> object:
        if method == "GET":
            raise ConnectError("GET -> 404", 404)
        raise ConnectError('PUT -> 500: {"message":"Cannot invoke ConfigValueInfo.errors()"}', 500)

    monkeypatch.setattr(connectors, "_request", refuse)
    config = outbox_connector_config("flotilla_health", delivery="exactly-once")
    with pytest.raises(ConnectError, match=r"exactly\.once\.source\.support enabled"):
        connectors.register_connector("http://connect", "outbox-flotilla-health", config)
    # the same refusal of an at-least-once connector is passed on as it is
    with pytest.raises(ConnectError, match="Cannot invoke") as raised:
        connectors.register_connector("http://connect", "outbox-flotilla-health", outbox_connector_config("x"))
    assert "exactly.once.source.support" not in str(raised.value)


def test_a_task_hands_over_each_row_at_once_and_reads_a_one_partition_offsets_topic() -> None:
    """Idle cost and hop latency (docs/operations/observability.md): a poll returns with its
    first row rather than waiting out the interval, and the read of the offsets topic an
    exactly-once task makes after every poll covers one partition on every Connect we ship."""
    from pathlib import Path

    import yaml

    root = Path(__file__).resolve().parents[2]
    assert outbox_connector_config("flotilla_health")["max.batch.size"] == "1"
    compose = yaml.safe_load((root / "docker-compose.yml").read_text())
    assert compose["services"]["connect"]["environment"]["CONNECT_OFFSET_STORAGE_PARTITIONS"] == "1"
    strimzi = yaml.safe_load((root / "infra" / "k8s" / "base" / "connect" / "kafkaconnect.yaml").read_text())
    assert strimzi["spec"]["config"]["offset.storage.partitions"] == 1
    assert "offset.storage.partitions=1" in (root / "infra" / "local" / "stackctl.py").read_text()


class FakeConnect:
    """Stands in for Connect's REST API: one connector's config, every request recorded."""

    def __init__(self, current: dict[str, str] | None, stale_reads: int = 0) -> None:
        self.current = current
        self.calls: list[tuple[str, str]] = []
        self.running = current  # the config the task runs with
        self.stale_reads = stale_reads  # task reads that still show the old config after a PUT

    def __call__(self, url: str, method: str = "GET", body: object | None = None) -> object:
        self.calls.append((method, url))
        if method == "GET" and url.endswith("/tasks"):
            if self.stale_reads:
                self.stale_reads -= 1
            else:
                self.running = self.current
            return [{"id": {"task": 0}, "config": dict(self.running or {})}]
        if method == "GET" and url.endswith("/status"):
            return {"connector": {"state": "RUNNING"}, "tasks": [{"id": 0, "state": "RUNNING"}]}
        if method == "GET":
            if self.current is None:
                raise connectors.ConnectError(f"GET {url} -> 404: not found", 404)
            return self.current
        assert isinstance(body, dict)
        self.current = {**body, "name": "outbox-flotilla-health"}
        return self.current


@pytest.mark.parametrize(
    ("current", "puts"),
    [
        (None, 1),  # new connector
        ("same", 0),  # a restarting service: Connect would restart the connector on any PUT
        ("changed", 1),  # a changed setting
    ],
)
def test_a_connector_is_put_only_when_missing_or_changed(
    monkeypatch: pytest.MonkeyPatch, config: dict[str, str], current: str | None, puts: int
) -> None:
    existing = {
        None: None,
        "same": {**config, "name": "outbox-flotilla-health"},
        "changed": {**config, "poll.interval.ms": "999", "name": "outbox-flotilla-health"},
    }[current]
    fake = FakeConnect(existing)
    monkeypatch.setattr(connectors, "_request", fake)
    connectors.register_connector("http://connect", "outbox-flotilla-health", config)
    assert [m for m, _ in fake.calls].count("PUT") == puts
    assert fake.current is not None and {k: v for k, v in fake.current.items() if k != "name"} == config


def test_a_changed_connector_is_awaited_until_its_tasks_run_the_new_config(
    monkeypatch: pytest.MonkeyPatch, config: dict[str, str]
) -> None:
    """The old tasks publish under the old config until Connect restarts them (a narrowed
    topic allowlist let a forged row through, at least once): a service starts writing
    only once its connector runs what it declared."""
    fake = FakeConnect({**config, "poll.interval.ms": "999", "name": "outbox-flotilla-health"}, stale_reads=3)
    monkeypatch.setattr(connectors, "_request", fake)
    monkeypatch.setattr(connectors.time, "sleep", lambda _: None)
    connectors.register_connector("http://connect", "outbox-flotilla-health", config)
    assert [m for m, u in fake.calls if u.endswith("/tasks")] == ["GET"] * 4  # three stale, then the new one
    assert fake.running is not None and fake.running["poll.interval.ms"] == config["poll.interval.ms"]


def test_a_connect_that_cannot_answer_is_not_taken_for_a_missing_connector(
    monkeypatch: pytest.MonkeyPatch, config: dict[str, str]
) -> None:
    def busy(url: str, method: str = "GET", body: object | None = None) -> object:
        raise connectors.ConnectError(f"{method} {url} -> 409: rebalance in progress", 409)

    monkeypatch.setattr(connectors, "_request", busy)
    with pytest.raises(connectors.ConnectError) as caught:
        connectors.register_connector("http://connect", "outbox-flotilla-health", config)
    assert caught.value.transient


TYPE_REGISTRY_FAILED = "io.debezium.DebeziumException: Failed to create TypeRegistry"


def connect_status(*task_states: str, trace: str = TYPE_REGISTRY_FAILED) -> dict:
    tasks = [{"id": i, "state": s, **({"trace": trace} if s == "FAILED" else {})} for i, s in enumerate(task_states)]
    return {"connector": {"state": "RUNNING"}, "tasks": tasks}


class ScriptedConnect:
    """Connect's status answers in order (the last one repeats); restarts recorded."""

    def __init__(self, *answers: dict) -> None:
        self.answers = list(answers)
        self.restarts: list[str] = []

    def __call__(self, url: str, method: str = "GET", body: object | None = None) -> object:
        if method == "POST":
            self.restarts.append(url)
            return None
        return self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]


def test_a_failed_task_is_restarted_at_start_and_the_wait_ends_when_it_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    connect = ScriptedConnect(connect_status("FAILED"), connect_status("RESTARTING"), connect_status("RUNNING"))
    monkeypatch.setattr(connectors, "_request", connect)
    monkeypatch.setattr(connectors, "RESTART_SETTLE_SECONDS", 0)
    connectors.wait_running("http://connect", "outbox-flotilla-health", timeout=5)
    assert connect.restarts == [
        "http://connect/connectors/outbox-flotilla-health/restart?includeTasks=true&onlyFailed=true"
    ]


def test_a_task_that_fails_after_every_restart_is_raised_with_its_trace(monkeypatch: pytest.MonkeyPatch) -> None:
    connect = ScriptedConnect(connect_status("FAILED", trace="PSQLException: slot is active"))
    monkeypatch.setattr(connectors, "_request", connect)
    monkeypatch.setattr(connectors, "RESTART_SETTLE_SECONDS", 0)
    with pytest.raises(connectors.ConnectError, match="outbox-flotilla-health failed: PSQLException: slot is active"):
        connectors.wait_running("http://connect", "outbox-flotilla-health", timeout=5, restarts=2)
    assert len(connect.restarts) == 2


@pytest.mark.parametrize(
    ("answer", "restarted"),
    [(connect_status("RUNNING"), False), (connect_status("UNASSIGNED"), False), (connect_status("FAILED"), True)],
)
def test_heal_restarts_only_what_failed(monkeypatch: pytest.MonkeyPatch, answer: dict, restarted: bool) -> None:
    connect = ScriptedConnect(answer)
    monkeypatch.setattr(connectors, "_request", connect)
    failed = connectors.heal("http://connect", "outbox-flotilla-health")
    assert (failed is not None) == restarted == bool(connect.restarts)


def test_a_failed_connector_itself_counts_as_failed() -> None:
    status = {"connector": {"state": "FAILED", "trace": "ConnectException: bad"}, "tasks": []}
    assert connectors.failure(status) == "ConnectException: bad"


POSTMASTER_EXIT = "org.postgresql.util.PSQLException: FATAL: terminating connection due to unexpected postmaster exit"


def test_a_failure_reads_as_its_causes_not_as_the_drivers_last_frames() -> None:
    # What the CI chaos soak printed was the last three lines of this trace: three frames.
    trace = "\n".join(
        [
            "io.debezium.DebeziumException: Failed to create TypeRegistry",
            "\tat io.debezium.connector.postgresql.connection.PostgresConnection.createTypeRegistry(X.java:130)",
            "Caused by: io.debezium.DebeziumException: Couldn't initialize type registry",
            "\tat io.debezium.connector.postgresql.TypeRegistry.<init>(TypeRegistry.java:137)",
            f"Caused by: {POSTMASTER_EXIT}",
            "\tat org.postgresql.jdbc.PgStatement.execute(PgStatement.java:437)",
        ]
    )
    status = {"connector": {"state": "RUNNING"}, "tasks": [{"id": 0, "state": "FAILED", "trace": trace}]}
    assert connectors.failure(status) == (
        "io.debezium.DebeziumException: Failed to create TypeRegistry"
        " <- io.debezium.DebeziumException: Couldn't initialize type registry"
        f" <- {POSTMASTER_EXIT}"
    )
