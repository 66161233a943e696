"""Each service's outbox publishes only to the topics it declares (ServiceSpec.emits).

The attack: a service that is not the policy service (here: a spec declared like the
remediation agent's) writes a `commands` row to its own outbox — through the runtime, or
with raw SQL as anyone holding its database role could. The runtime refuses the emit as a
programming error, and the outbox table's constraint refuses the row, so the connector
never sees a command from that database.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from flotilla_ops.samples import SERVICE_LATENCY_INCREASED, latency_fact, sample_value

from flotilla.bootstrap import drop_outbox
from flotilla.contracts import load_contracts
from flotilla.fleet import POLICY, REMEDIATION
from flotilla.outbox import ALLOWLIST_CONSTRAINT, UndeclaredTopicError
from flotilla.records import BY_TYPE
from flotilla.runner import ServiceContext, ServiceSpec, prepare
from flotilla.settings import ServiceSettings, StackSettings
from flotilla.typedrecord import Record
from tests.keys import fact_settings

SCALE = "dev.flotilla.commands.ScaleService"
DB = f"flotilla_it_allow_{uuid.uuid4().hex[:6]}"

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def agent(stack: StackSettings) -> Iterator[ServiceContext]:
    spec = ServiceSpec(name="it-allowlist-agent", database=DB, emits=REMEDIATION.emits)
    ctx = prepare(spec, ServiceSettings(**stack.model_dump(), **fact_settings()))
    yield ctx
    ctx.pool.close()
    drop_outbox(stack, DB)


def emit_latency_fact(agent: ServiceContext, conn: psycopg.Connection[Any]) -> None:
    """A record of a topic the agent declares (incidents), in the caller's transaction."""
    value, env = latency_fact(f"incident-{uuid.uuid4().hex[:8]}")
    fact = BY_TYPE[SERVICE_LATENCY_INCREASED].from_value({k: v for k, v in value.items() if k != "eventId"})
    agent.emit(conn, fact, key=env.correlationid, correlation=env.correlationid)


def _a_command() -> Record:
    schema = next(c.schema for c in load_contracts() if c.full_name == SCALE)
    return BY_TYPE[SCALE].from_value(sample_value(schema))


class _RolledBack(Exception):
    pass


def _raw_row(conn: psycopg.Connection[object], topic: str) -> None:
    """What anyone with the database role could write, bypassing the runtime."""
    conn.execute(
        "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, ce_specversion, ce_source, ce_time,"
        " ce_correlationid, ce_hops, ce_traceparent, content_type)"
        " VALUES (%s, %s, 'production/checkout-api', %s, '\\x00', '1.0', '/forged', 'now', 'incident-1', '16',"
        " '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01', 'application/avro')",
        (str(uuid.uuid4()), topic, SCALE),
    )


def test_the_remediation_agent_declares_incidents_only_and_policy_also_commands() -> None:
    assert REMEDIATION.emits == ("incidents",)
    assert set(POLICY.emits) == {"incidents", "commands"}


def test_an_emit_to_an_undeclared_topic_is_a_programming_error(agent: ServiceContext) -> None:
    with agent.pool.connection() as conn, pytest.raises(UndeclaredTopicError, match="not to 'commands'"):
        agent.emit(conn, _a_command(), key="production/checkout-api", correlation="x")
    with agent.pool.connection() as conn, conn.transaction():  # its own topic works
        emit_latency_fact(agent, conn)


def test_the_outbox_table_refuses_a_command_row_written_with_raw_sql(agent: ServiceContext) -> None:
    with agent.pool.connection() as conn:
        with pytest.raises(psycopg.errors.CheckViolation, match=ALLOWLIST_CONSTRAINT), conn.transaction():
            _raw_row(conn, "commands")
        with pytest.raises(psycopg.errors.CheckViolation), conn.transaction():
            _raw_row(conn, "incidents.dlq")
        count = conn.execute("SELECT count(*) FROM outbox WHERE aggregatetype <> 'incidents'").fetchone()
    assert count == (0,)


def test_the_constraint_follows_the_declaration_at_every_start(stack: StackSettings, agent: ServiceContext) -> None:
    """Declaring a topic (re-applied at start) lets rows for it in; nothing else changes."""
    widened = ServiceSpec(name="it-allowlist-agent", database=DB, emits=POLICY.emits)
    ctx = prepare(widened, ServiceSettings(**stack.model_dump(), **fact_settings()))
    try:
        # accepted now; rolled back so that nothing reaches the real commands topic
        with ctx.pool.connection() as conn, pytest.raises(_RolledBack), conn.transaction():
            _raw_row(conn, "commands")
            raise _RolledBack
    finally:
        ctx.pool.close()
    prepare(
        ServiceSpec(name="it-allowlist-agent", database=DB, emits=REMEDIATION.emits),
        ServiceSettings(**stack.model_dump(), **fact_settings()),
    ).pool.close()
    with agent.pool.connection() as conn, pytest.raises(psycopg.errors.CheckViolation), conn.transaction():
        _raw_row(conn, "commands")


def test_connect_itself_drops_a_row_for_an_undeclared_topic(stack: StackSettings, agent: ServiceContext) -> None:
    """Someone with the database role drops the constraint and writes a command row: the
    connector's own filter (the service's declared topics) still never publishes it, and
    the rows behind it are published."""
    from .kafka_wait import read_until_all, tail_consumer

    commands = tail_consumer(stack.kafka_bootstrap, "commands")
    incidents = tail_consumer(stack.kafka_bootstrap, "incidents")
    try:
        with agent.pool.connection() as conn, conn.transaction():
            conn.execute(f"ALTER TABLE outbox DROP CONSTRAINT {ALLOWLIST_CONSTRAINT}")  # the compromised role
            _raw_row(conn, "commands")
            emit_latency_fact(agent, conn)
        with agent.pool.connection() as conn:
            sentinel = conn.execute(
                "SELECT id::text FROM outbox WHERE aggregatetype = 'incidents' ORDER BY created_at DESC LIMIT 1"
            ).fetchone()
        assert sentinel is not None
        read_until_all(incidents, {sentinel[0]}, timeout=30)  # the connector got past the forged row
        forged = [m for m in (commands.poll(1.0) for _ in range(5)) if m is not None and not m.error()]
        assert [m.headers() for m in forged] == []
    finally:
        commands.close()
        incidents.close()
        prepare(
            ServiceSpec(name="it-allowlist-agent", database=DB, emits=REMEDIATION.emits),
            ServiceSettings(**stack.model_dump(), **fact_settings()),
        ).pool.close()  # the constraint back
