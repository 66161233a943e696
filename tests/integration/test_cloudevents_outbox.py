"""Records leaving through the outbox are CloudEvents the official SDK reads, on the real stack.

A root record (no cause) has a NULL ``ce_causationid`` column; Debezium's Outbox Event
Router would publish it as a header with a null value, which the SDK refuses. The
connector chains our DropNullHeaders after the router, so the header is absent instead.
"""

from __future__ import annotations

import json
import urllib.request
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from confluent_kafka import Consumer

from flotilla import connectors
from flotilla.bootstrap import bootstrap_outbox, drop_outbox
from flotilla.envelope import Envelope
from flotilla.outbox import Outbox
from flotilla.serde import AvroSerde
from flotilla.settings import StackSettings
from flotilla.testing.samples import latency_fact

from ..cloudevents_conformance import assert_conformant, null_valued_headers
from ..poms import TRANSFORMS_POM, pom_text
from .kafka_wait import header, read_until_all, tail_consumer

DB = "flotilla_it_cloudevents"

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def outbox_db(stack: StackSettings) -> Iterator[str]:
    bootstrap_outbox(stack, DB)
    yield DB
    drop_outbox(stack, DB)


@pytest.fixture()
def incidents(stack: StackSettings, outbox_db: str) -> Iterator[Consumer]:
    consumer = tail_consumer(stack.kafka_bootstrap, "incidents")
    yield consumer
    consumer.close()


def test_connect_has_our_transform_and_the_connector_chains_it(stack: StackSettings, outbox_db: str) -> None:
    with urllib.request.urlopen(f"{stack.connect_url}/connector-plugins?connectorsOnly=false", timeout=10) as resp:
        plugins = {p["class"]: p for p in json.loads(resp.read())}
    ours = plugins.get(connectors.DROP_NULL_HEADERS)
    assert ours is not None, "DropNullHeaders is not on Connect's plugin.path"
    assert ours["type"] == "transformation" and ours["version"] == pom_text(TRANSFORMS_POM, "m:version")
    name = connectors.connector_name(outbox_db)
    with urllib.request.urlopen(f"{stack.connect_url}/connectors/{name}/config", timeout=10) as resp:
        live = json.loads(resp.read())
    assert live["transforms"] == "outbox,dropnulls"
    assert live["transforms.dropnulls.type"] == connectors.DROP_NULL_HEADERS


def test_a_root_record_has_no_causation_header_and_a_caused_one_has_it(
    stack: StackSettings, serde: AvroSerde, incidents: Consumer, outbox_db: str
) -> None:
    incident = f"incident-{uuid.uuid4().hex[:8]}"
    root_value, root = latency_fact(incident)
    assert root.causationid is None
    caused = root.caused(root.type, "/flotilla/tests")
    caused_value = {**latency_fact(incident)[0], "eventId": caused.id}
    outbox = Outbox(serde)
    with psycopg.connect(stack.pg_dsn(outbox_db)) as conn:
        outbox.append(conn, topic="incidents", key=incident, value=root_value, envelope=root)
        outbox.append(conn, topic="incidents", key=incident, value=caused_value, envelope=caused)
    with psycopg.connect(stack.pg_dsn(outbox_db)) as conn:
        stored = conn.execute("SELECT ce_causationid FROM outbox WHERE id = %s", (root.id,)).fetchone()
    assert stored == (None,), "the root row's column is NULL: the case the transform exists for"

    by_id = {(header(msg, "ce_id") or b"").decode(): msg for msg in read_until_all(incidents, {root.id, caused.id}, 60)}
    root_msg, caused_msg = by_id[root.id], by_id[caused.id]

    root_names = [name for name, _ in root_msg.headers() or []]
    assert "ce_causationid" not in root_names, root_names
    assert null_valued_headers(root_msg.headers()) == []
    assert Envelope.from_headers(root_msg.headers()) == root
    root_event = assert_conformant(root_msg, caused_by=None)
    assert "causationid" not in root_event.get_attributes()

    assert header(caused_msg, "ce_causationid") == root.id.encode()
    assert null_valued_headers(caused_msg.headers()) == []
    caused_event = assert_conformant(caused_msg, caused_by=root.id)
    assert caused_event.get_extension("causationid") == root.id

    # Debezium's own `id` header and every CloudEvents header survive, in the router's order.
    assert root_names == ["id", "ce_id", "ce_type", "ce_specversion", "ce_source", "ce_time",
                          "ce_correlationid", "ce_hops", "ce_traceparent", "content-type"]  # fmt: skip
