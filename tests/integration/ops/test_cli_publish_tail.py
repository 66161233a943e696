"""The CLI producer and tail on the real stack: Kafka, the registry, the registered contracts.

Records here name a service nothing watches (``cli-itest``) and incidents of their own.
A fleet running beside the tests refuses them (unsigned: flotilla.provenance) and its DLQ
reconciler reports each under its incident, so reads here keep the CLI's own records.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer
from flotilla_ops.cli import Runtime, app
from typer.testing import CliRunner

from flotilla.envelope import Envelope
from flotilla.serde import AvroSerde
from flotilla.settings import StackSettings
from flotilla.tailing import tail_consumer

pytestmark = pytest.mark.timeout(120)

SLI = "dev.flotilla.incidents.ServiceLatencyIncreased"
FLOTILLA = Path(sys.executable).parent / "flotilla"


def fields(incident: str) -> list[str]:
    return [
        "--type", "ServiceLatencyIncreased", "--incident", incident,
        "--field", "service=cli-itest", "--field", "p95LatencyMs=1234.5", "--field", "thresholdMs=500",
        "--field", "windowSeconds=60", "--field", "observedAt=now",
    ]  # fmt: skip


@pytest.fixture
def rt(stack: StackSettings, serde: AvroSerde) -> Runtime:
    return Runtime(settings_factory=lambda: stack, serde_factory=lambda _s: serde)


@pytest.fixture
def reader(stack: StackSettings) -> Iterator[Consumer]:
    """An independent reader of incidents, positioned at the end before the test acts."""
    consumer = tail_consumer(stack.kafka_bootstrap, "incidents")
    yield consumer
    consumer.close()


def read_incident(consumer: Consumer, incident: str, until: int, timeout: float = 30) -> list[Any]:
    found = []
    deadline = time.monotonic() + timeout
    while len(found) < until and time.monotonic() < deadline:
        msg = consumer.poll(0.2)
        if msg is None or msg.error():
            continue
        envelope = Envelope.from_headers(msg.headers())
        if envelope.correlationid == incident and envelope.source == "/flotilla/cli":
            found.append(msg)
    return found


def publish_json(cli: CliRunner, rt: Runtime, *args: str) -> tuple[int, dict[str, Any]]:
    result = cli.invoke(app, ["--json", "publish", *args], obj=rt)
    return result.exit_code, json.loads(result.stdout)


def test_a_published_record_is_found_by_tail_decoded_with_its_headers(rt: Runtime, serde: AvroSerde) -> None:
    cli = CliRunner()
    incident = f"incident-cli-{uuid.uuid4().hex[:10]}"
    code, report = publish_json(cli, rt, *fields(incident))
    assert code == 0, report
    assert report["published"] == 1 and report["deliveries"][0]["offset"] >= 0
    event_id = report["eventIds"][0]

    tailed = cli.invoke(
        app, ["tail", "--since", "5m", "--incident", incident, "--max", "1", "--timeout", "30", "--json"], obj=rt
    )
    assert tailed.exit_code == 0, tailed.stderr
    record = json.loads(tailed.stdout.strip().splitlines()[0])
    assert record["type"] == SLI and record["key"] == incident
    assert record["envelope"]["id"] == event_id
    assert record["headers"]["ce_source"] == "/flotilla/cli"
    assert record["headers"]["ce_correlationid"] == incident and record["headers"]["ce_hops"] == "16"
    assert record["value"]["eventId"] == event_id and record["value"]["p95LatencyMs"] == 1234.5
    assert record["value"]["service"] == "cli-itest"
    assert record["schemaId"] == serde.writer("incidents", SLI).schema_id  # framed with the registered schema
    assert (record["partition"], record["offset"]) == (
        report["deliveries"][0]["partition"],
        report["deliveries"][0]["offset"],
    )

    # the console script, as a person runs it: text output
    shown = subprocess.run(
        [str(FLOTILLA), "tail", "--since", "5m", "--incident", incident, "--max", "1", "--timeout", "30"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert shown.returncode == 0, shown.stderr
    assert "ServiceLatencyIncreased" in shown.stdout and f"ce_id={event_id}" in shown.stdout
    assert '"service": "cli-itest"' in shown.stdout


def test_invalid_input_publishes_nothing(rt: Runtime, reader: Consumer) -> None:
    cli = CliRunner()
    incident = f"incident-cli-{uuid.uuid4().hex[:10]}"
    bad = cli.invoke(app, ["publish", *fields(incident), "--field", "windowSeconds=sixty"], obj=rt)
    assert bad.exit_code == 2
    assert "field 'windowSeconds': expected int, got str 'sixty'" in bad.stderr
    unknown = cli.invoke(app, ["publish", *fields(incident), "--field", "colour=red"], obj=rt)
    assert unknown.exit_code == 2 and "field 'colour' is not in the schema" in unknown.stderr
    # a valid record after the invalid ones: once it is read, anything sent before it was too
    code, report = publish_json(cli, rt, *fields(incident))
    assert code == 0
    # same key, same partition: the invalid ones, had they been sent, would come first
    seen = read_incident(reader, incident, until=1)
    assert [Envelope.from_headers(m.headers()).id for m in seen] == report["eventIds"]
    assert read_incident(reader, incident, until=1, timeout=1) == []


def test_count_and_rate_publish_distinct_ids(rt: Runtime, reader: Consumer) -> None:
    cli = CliRunner()
    incident = f"incident-cli-{uuid.uuid4().hex[:10]}"
    started = time.monotonic()
    code, report = publish_json(cli, rt, *fields(incident), "--count", "50", "--rate", "200")
    took = time.monotonic() - started
    assert code == 0, report
    assert report["published"] == 50 and report["deliveryErrors"] == []
    assert len(set(report["eventIds"])) == 50
    assert took >= 49 / 200  # paced, not a burst
    assert 0 < report["sendRatePerSecond"] <= 220
    seen = read_incident(reader, incident, until=50)
    ids = [Envelope.from_headers(m.headers()).id for m in seen]
    assert len(ids) == 50 and set(ids) == set(report["eventIds"])
    assert len({m.partition() for m in seen}) == 1  # one key, one partition, in order
    assert ids == report["eventIds"]
