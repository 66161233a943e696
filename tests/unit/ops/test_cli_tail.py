"""`flotilla tail`, offline: decoding, filters, DLQ context, JSON lines, --max/--timeout."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import pytest
from flotilla_ops.cli import Runtime, app
from flotilla_ops.cli.tail import parse_since
from flotilla_ops.samples import latency_fact
from typer.testing import CliRunner

from flotilla.serde import AvroSerde
from flotilla.settings import StackSettings
from tests.support.messages import FakeMessage

from .fakes import FakeConsumer, json_lines

SLI = "dev.flotilla.incidents.ServiceLatencyIncreased"


def fact(serde: AvroSerde, incident: str, offset: int, topic: str = "incidents", **extra: bytes) -> FakeMessage:
    value, envelope = latency_fact(incident, service="cli-test-svc")
    headers = [*envelope.headers(), *extra.items()]
    return FakeMessage(
        topic=topic,
        value=serde.serialize("incidents", SLI, value),
        headers=headers,
        key=incident.encode(),
        partition=2,
        offset=offset,
    )


def run(cli: CliRunner, serde: AvroSerde, messages: Sequence[FakeMessage], *args: str) -> tuple[Any, FakeConsumer]:
    consumer = FakeConsumer(messages)

    def open_consumer(topics: Sequence[str], **where: Any) -> FakeConsumer:
        consumer.opened_with = {"topics": list(topics), **where}
        return consumer

    rt = Runtime(settings_factory=StackSettings, serde_factory=lambda _s: serde, consumer_factory=open_consumer)
    return cli.invoke(app, ["tail", *args], obj=rt), consumer


def test_json_lines_are_decoded_with_headers_and_filtered_by_incident(cli: CliRunner, serde: AvroSerde) -> None:
    messages = [fact(serde, "incident-a", 1), fact(serde, "incident-b", 2), fact(serde, "incident-a", 3)]
    result, consumer = run(cli, serde, messages, "--incident", "incident-a", "--json", "--timeout", "0.5")
    assert result.exit_code == 0
    records = list(json_lines(result.stdout))
    assert [r["offset"] for r in records] == [1, 3]
    first = records[0]
    assert first["topic"] == "incidents" and first["partition"] == 2 and first["key"] == "incident-a"
    assert first["type"] == SLI and isinstance(first["schemaId"], int)
    assert first["envelope"]["correlationid"] == "incident-a"
    assert first["envelope"]["id"] == first["value"]["eventId"]  # UUID rendered as text
    assert first["headers"]["content-type"] == "application/avro"
    assert first["value"]["service"] == "cli-test-svc"
    assert first["timestamp"].endswith("Z")
    assert consumer.closed
    assert consumer.opened_with == {"topics": ["incidents"], "from_beginning": False, "since_ms": None}


def test_type_filter_takes_short_or_full_names(cli: CliRunner, serde: AvroSerde) -> None:
    messages = [fact(serde, "i", 1)]
    for wanted, count in (("ServiceLatencyIncreased", 1), (SLI, 1), ("RecoveryExecuted", 0)):
        result, _ = run(cli, serde, list(messages), "--type", wanted, "--json", "--timeout", "0.3")
        assert len(list(json_lines(result.stdout))) == count, wanted


def test_max_stops_early_and_exit_1_when_not_reached(cli: CliRunner, serde: AvroSerde) -> None:
    messages = [fact(serde, "i", n) for n in range(5)]
    result, _ = run(cli, serde, messages, "--max", "2", "--json")
    assert result.exit_code == 0
    assert len(list(json_lines(result.stdout))) == 2
    result, _ = run(cli, serde, [fact(serde, "i", 1)], "--max", "3", "--timeout", "0.3", "--json")
    assert result.exit_code == 1
    assert "saw 1 of 3" not in result.stdout  # progress notes never pollute JSON output


def test_dead_letters_show_their_context_and_undecodable_values(cli: CliRunner, serde: AvroSerde) -> None:
    good = fact(serde, "i", 7, topic="incidents.dlq", dlq_reason=b"invalid-record", dlq_consumer=b"executor")
    poison = FakeMessage(
        topic="incidents.dlq",
        value=b"not avro",
        headers=[("ce_correlationid", b"i"), ("dlq_reason", b"undecodable")],
        key=b"i",
        offset=8,
    )
    result, _ = run(cli, serde, [good, poison], "--topic", "incidents.dlq", "--json", "--timeout", "0.3")
    first, second = json_lines(result.stdout)
    assert first["dlq"] == {"reason": "invalid-record", "consumer": "executor"}
    assert first["value"]["incidentId"] == "i"
    assert second["dlq"] == {"reason": "undecodable"}
    assert "magic byte" in second["decodeError"] and second["value"] is None
    text, _ = run(cli, serde, [fact(serde, "i", 7, topic="incidents.dlq", dlq_reason=b"invalid-record")],
                  "-T", "incidents.dlq", "--timeout", "0.3")  # fmt: skip
    assert "dead letter: reason=invalid-record" in text.stdout


def test_text_rendering_shows_the_envelope_and_the_value(cli: CliRunner, serde: AvroSerde) -> None:
    result, _ = run(cli, serde, [fact(serde, "incident-t", 4)], "--timeout", "0.3")
    assert result.exit_code == 0
    lines = result.stdout.splitlines()
    assert lines[0].startswith("incidents[2]@4  ") and "ServiceLatencyIncreased  key=incident-t" in lines[0]
    assert "ce_correlationid=incident-t" in lines[1] and "ce_hops=16" in lines[1]
    assert '"service": "cli-test-svc"' in result.stdout


def test_where_to_start(cli: CliRunner, serde: AvroSerde) -> None:
    _, consumer = run(cli, serde, [], "--from-beginning", "--timeout", "0.1", "-T", "commands", "-T", "incidents")
    assert consumer.opened_with == {"topics": ["commands", "incidents"], "from_beginning": True, "since_ms": None}
    _, consumer = run(cli, serde, [], "--since", "10m", "--timeout", "0.1")
    assert isinstance(consumer.opened_with["since_ms"], int)
    result, _ = run(cli, serde, [], "--since", "10m", "--from-beginning")
    assert result.exit_code == 2
    result, _ = run(cli, serde, [], "--since", "a while")
    assert result.exit_code == 2 and "--since" in result.stderr


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("90s", datetime(2024, 5, 1, 11, 58, 30, tzinfo=UTC)),
        ("10m", datetime(2024, 5, 1, 11, 50, tzinfo=UTC)),
        ("2h", datetime(2024, 5, 1, 10, 0, tzinfo=UTC)),
        ("2024-05-01T11:00:00Z", datetime(2024, 5, 1, 11, 0, tzinfo=UTC)),
    ],
)
def test_parse_since(text: str, expected: datetime) -> None:
    now = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
    assert parse_since(text, now) == int(expected.timestamp() * 1000)
