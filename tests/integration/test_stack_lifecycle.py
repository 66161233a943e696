"""The local stack's lifecycle: status, and a stop/start that keeps schemas and data.

Runs last in the integration suite (file order) because it restarts the stack.
Skipped unless the session uses the local stack.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.schema_registry import SchemaRegistryClient
from flotilla_ops.samples import SERVICE_LATENCY_INCREASED, latency_fact

from flotilla.registry import registry_client
from flotilla.serde import AvroSerde
from flotilla.settings import StackSettings
from flotilla.tailing import tail_consumer
from tests.support.producing import ordered_producer

from .kafka_wait import by_event_id, wait_for

STACKCTL = [sys.executable, str(Path(__file__).resolve().parents[2] / "infra" / "local" / "stackctl.py")]

pytestmark = pytest.mark.timeout(600)


@pytest.fixture()
def local_stack(stack: StackSettings) -> StackSettings:
    if stack.stack != "local":
        pytest.skip("lifecycle of the local stack only")
    return stack


def test_status_reports_every_component_up_with_endpoint_and_version(local_stack: StackSettings) -> None:
    done = subprocess.run([*STACKCTL, "status", "--json"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = {row["component"]: row for row in json.loads(done.stdout)}
    assert set(rows) == {"postgres", "kafka", "registry", "connect", "prometheus", "alertmanager"}
    assert all(row["state"] == "up" for row in rows.values())
    assert rows["prometheus"]["version"].startswith("prometheus 2.")  # Debian's package
    assert rows["alertmanager"]["version"].startswith("alertmanager 0.")
    assert rows["kafka"]["version"] == "4.3.0"
    assert "debezium-postgres 3.6.1.Final" in rows["connect"]["version"]
    assert rows["registry"]["version"].startswith("apicurio 3.")
    assert rows["postgres"]["endpoint"] == f"127.0.0.1:{local_stack.pg_port}"


def test_up_on_a_running_stack_leaves_it_alone(local_stack: StackSettings) -> None:
    done = subprocess.run([*STACKCTL, "up"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "starting" not in done.stdout  # nothing was (re)started


def test_down_then_up_keeps_schemas_and_topic_data(
    local_stack: StackSettings, registry: SchemaRegistryClient, serde: AvroSerde
) -> None:
    subject = f"incidents-{SERVICE_LATENCY_INCREASED}"
    schema_id = registry.get_latest_version(subject).schema_id
    value, env = latency_fact(f"incident-{uuid.uuid4().hex[:8]}")
    payload = serde.serialize("incidents", SERVICE_LATENCY_INCREASED, value)
    producer = ordered_producer(local_stack.kafka_bootstrap)
    delivered: list[tuple[int, int]] = []
    producer.produce(
        "incidents",
        key=env.correlationid,
        value=payload,
        headers=env.headers(),
        on_delivery=lambda err, msg: delivered.append((msg.partition(), msg.offset())) if err is None else None,
    )
    producer.flush(10)
    assert delivered, "sentinel record was not acknowledged"

    for action in ("down", "up"):
        done = subprocess.run([*STACKCTL, action], capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, f"{action}: {done.stdout}{done.stderr}"

    fresh = registry_client(local_stack.schema_registry_url)
    assert fresh.get_latest_version(subject).schema_id == schema_id
    assert fresh.get_compatibility() == "BACKWARD"

    partition, offset = delivered[0]
    consumer = tail_consumer(local_stack.kafka_bootstrap, "incidents")
    consumer.assign([TopicPartition("incidents", partition, offset)])
    try:
        msg = wait_for(consumer, by_event_id(env.id), timeout=30)
        assert msg.value() == payload
    finally:
        consumer.close()
