"""`flotilla publish`, offline: records built from flags, JSON and files, validated against
the registered schema (an in-memory registry holding the real contracts), produced to an
observable producer."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest
from flotilla_ops.cli import Runtime, app
from typer.testing import CliRunner

from flotilla.registry import registry_client
from flotilla.serde import AvroSerde
from flotilla.settings import StackSettings

from .fakes import FakeProducer

SLI = "dev.flotilla.incidents.ServiceLatencyIncreased"
FLAGS = [
    "--field", "service=cli-test-svc",
    "--field", "p95LatencyMs=1840.5",
    "--field", "thresholdMs=500",
    "--field", "windowSeconds=60",
    "--field", "observedAt=2024-05-01T12:00:00Z",
]  # fmt: skip


def publish(cli: CliRunner, rt: Runtime, *args: str) -> tuple[int, str, str]:
    result = cli.invoke(app, ["publish", *args], obj=rt)
    return result.exit_code, result.stdout, result.stderr


def test_flags_become_a_typed_record_with_its_envelope(
    cli: CliRunner, kafka_runtime: Runtime, producer: FakeProducer, serde: AvroSerde
) -> None:
    code, out, err = publish(cli, kafka_runtime, "--type", "ServiceLatencyIncreased", "-i", "incident-9", *FLAGS)
    assert code == 0, err
    assert len(producer.produced) == 1
    sent = producer.produced[0]
    assert sent.topic == "incidents"
    assert sent.key == "incident-9"
    decoded = serde.deserialize(sent.value)
    assert decoded.record_name == SLI
    value = decoded.value
    assert value["incidentId"] == "incident-9"
    assert value["p95LatencyMs"] == 1840.5 and value["windowSeconds"] == 60
    assert value["observedAt"] == datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
    assert value["environment"] == "production"  # the schema default
    headers = sent.headers
    assert headers["ce_type"] == SLI
    assert headers["ce_source"] == "/flotilla/cli"
    assert headers["ce_correlationid"] == "incident-9"
    assert headers["ce_hops"] == "16"
    assert headers["ce_specversion"] == "1.0"
    assert "ce_causationid" not in headers
    assert str(value["eventId"]) == headers["ce_id"]  # the event id in the value is the ce_id
    assert f"id={headers['ce_id']}" in out


def test_json_file_and_flags_build_the_same_record(
    cli: CliRunner, kafka_runtime: Runtime, producer: FakeProducer, serde: AvroSerde, tmp_path: Path
) -> None:
    body = {
        "incidentId": "incident-3",
        "service": "cli-test-svc",
        "p95LatencyMs": 900.0,
        "thresholdMs": 500.0,
        "windowSeconds": 30,
        "observedAt": "2024-05-01T12:00:00Z",
    }
    file = tmp_path / "record.json"
    file.write_text(json.dumps(body))
    assert publish(cli, kafka_runtime, "-t", SLI, "--json", json.dumps(body))[0] == 0
    assert publish(cli, kafka_runtime, "-t", SLI, "--file", str(file))[0] == 0
    # flags override what JSON gave
    assert publish(cli, kafka_runtime, "-t", SLI, "--file", str(file), "--field", "windowSeconds=45")[0] == 0
    values = [serde.deserialize(p.value).value for p in producer.produced]
    for value in values:
        value.pop("eventId")
    assert values[0] == values[1]
    assert values[2]["windowSeconds"] == 45
    assert {p.key for p in producer.produced} == {"incident-3"}


def test_envelope_options_fill_the_headers(cli: CliRunner, kafka_runtime: Runtime, producer: FakeProducer) -> None:
    event = str(uuid.uuid4())
    cause = str(uuid.uuid4())
    code, _, err = publish(
        cli, kafka_runtime, "-t", "ServiceLatencyIncreased", "-i", "incident-4", *FLAGS,
        "--id", event, "--causation", cause, "--hops", "3", "--source", "/tests/me",
        "--time", "2024-05-01T12:00:01.000Z", "--key", "custom-key",
    )  # fmt: skip
    assert code == 0, err
    headers = producer.produced[0].headers
    assert (headers["ce_id"], headers["ce_causationid"], headers["ce_hops"]) == (event, cause, "3")
    assert (headers["ce_source"], headers["ce_time"]) == ("/tests/me", "2024-05-01T12:00:01.000Z")
    assert producer.produced[0].key == "custom-key"


def test_a_command_goes_to_commands_keyed_by_its_target(
    cli: CliRunner, kafka_runtime: Runtime, producer: FakeProducer, serde: AvroSerde
) -> None:
    code, _, err = publish(
        cli, kafka_runtime, "-t", "ScaleService", "--sample", "-i", "incident-5",
        "--field", "target.environment=staging", "--field", "target.name=cli-test-svc", "--field", "replicas=7",
    )  # fmt: skip
    assert code == 0, err
    sent = producer.produced[0]
    assert sent.topic == "commands"
    assert sent.key == "staging/cli-test-svc"
    value = serde.deserialize(sent.value).value
    assert value["replicas"] == 7 and value["incidentId"] == "incident-5"
    assert value["target"]["name"] == "cli-test-svc"


def test_topic_override_keeps_the_records_registered_subject(
    cli: CliRunner, kafka_runtime: Runtime, producer: FakeProducer, serde: AvroSerde
) -> None:
    code, _, err = publish(cli, kafka_runtime, "-t", SLI, "-i", "i-1", *FLAGS, "--topic", "scratch")
    assert code == 0, err
    assert producer.produced[0].topic == "scratch"
    assert serde.deserialize(producer.produced[0].value).record_name == SLI


def test_invalid_fields_are_named_with_their_expected_type_and_nothing_is_produced(
    cli: CliRunner, kafka_runtime: Runtime, producer: FakeProducer
) -> None:
    code, _, err = publish(
        cli, kafka_runtime, "-t", "ServiceLatencyIncreased", "-i", "incident-6",
        "--field", "service=cli-test-svc", "--field", "p95LatencyMs=fast", "--field", "windowSeconds=6.5",
        "--field", "observedAt=yesterday", "--field", "colour=blue",
    )  # fmt: skip
    assert code == 2
    assert "nothing was published" in err
    assert "field 'p95LatencyMs': expected double, got str 'fast'" in err
    assert "field 'windowSeconds': expected int" in err
    assert "field 'observedAt': expected long (timestamp-millis)" in err
    assert "field 'thresholdMs' is missing (expected double)" in err
    assert "field 'colour' is not in the schema" in err
    assert producer.produced == []


def test_invalid_input_in_json_mode_is_a_json_error(
    cli: CliRunner, kafka_runtime: Runtime, producer: FakeProducer
) -> None:
    result = cli.invoke(
        app, ["--json", "publish", "-t", "ServiceLatencyIncreased", "-i", "x", "--field", "windowSeconds=many"],
        obj=kafka_runtime,
    )  # fmt: skip
    assert result.exit_code == 2
    error = json.loads(result.stdout)
    assert error["ok"] is False and error["exitCode"] == 2
    assert any(p.startswith("field 'windowSeconds': expected int") for p in error["problems"])
    assert producer.produced == []


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-t", "ServiceLatencyIncrease", "-i", "x"], "did you mean ServiceLatencyIncreased"),
        (["-t", "ServiceLatencyIncreased", "--json", "{not json"], "--json is not valid JSON"),
        (["-t", "ServiceLatencyIncreased", "--json", "[1, 2]"], "must be a JSON object"),
        (["-t", "ServiceLatencyIncreased", "--file", "/nonexistent/record.json"], "cannot read /nonexistent"),
        (["-t", "ServiceLatencyIncreased", "--json", "{}", "--file", "x.json"], "not both"),
        (["-t", "ServiceLatencyIncreased", "-i", "x", "--field", "service"], "expected name=value"),
        (["-t", "ServiceLatencyIncreased", *FLAGS], "no incident"),
        (["-t", "ServiceLatencyIncreased", "-i", "a", "--field", "incidentId=b"], "but field incidentId is 'b'"),
        (["-t", "ServiceLatencyIncreased", "-i", "a", "--time", "noon"], "not an ISO-8601 time"),
        (["-t", "ServiceLatencyIncreased", "-i", "a", "--count", "2", "--id", str(uuid.uuid4())], "--id names one"),
        (["-t", "ServiceLatencyIncreased", "-i", "a", "--count", "0"], "--count"),
        (["-i", "a"], "--type"),
    ],
)
def test_bad_input_exits_2_with_a_reason_and_produces_nothing(
    cli: CliRunner, kafka_runtime: Runtime, producer: FakeProducer, args: list[str], message: str
) -> None:
    code, _, err = publish(cli, kafka_runtime, *args)
    assert code == 2
    assert message in err
    assert producer.produced == []


def test_count_publishes_fresh_ids_and_reports_them(
    cli: CliRunner, kafka_runtime: Runtime, producer: FakeProducer, serde: AvroSerde
) -> None:
    result = cli.invoke(
        app, ["--json", "publish", "-t", "ServiceLatencyIncreased", "--sample", "-n", "20", "-r", "2000"],
        obj=kafka_runtime,
    )  # fmt: skip
    assert result.exit_code == 0, result.stdout
    report = json.loads(result.stdout)
    assert report["ok"] is True
    assert report["requested"] == report["published"] == 20
    assert report["deliveryErrors"] == []
    assert report["ratePerSecond"] > 0
    ids = [p.headers["ce_id"] for p in producer.produced]
    assert len(set(ids)) == 20 and ids == report["eventIds"]
    assert [str(serde.deserialize(p.value).value["eventId"]) for p in producer.produced] == ids
    assert len({p.headers["ce_correlationid"] for p in producer.produced}) == 1  # one incident


def test_delivery_errors_exit_1_and_are_reported(cli: CliRunner, serde: AvroSerde) -> None:
    failing = FakeProducer(fail_with="Broker: Message size too large")
    rt = Runtime(settings_factory=StackSettings, serde_factory=lambda _s: serde, producer_factory=lambda _s: failing)
    result = cli.invoke(app, ["--json", "publish", "-t", "ServiceLatencyIncreased", "--sample", "-n", "3"], obj=rt)
    assert result.exit_code == 1
    error = json.loads(result.stdout)
    assert error["report"]["published"] == 0
    assert len(error["report"]["deliveryErrors"]) == 3
    assert "0 of 3" in error["error"]


def test_unacknowledged_records_mean_kafka_is_unreachable(cli: CliRunner, serde: AvroSerde) -> None:
    silent = FakeProducer(never_ack=True)
    rt = Runtime(settings_factory=StackSettings, serde_factory=lambda _s: serde, producer_factory=lambda _s: silent)
    code, _, err = publish(cli, rt, "-t", "ServiceLatencyIncreased", "--sample", "--timeout", "0.1")
    assert code == 3
    assert "0 of 1" in err and "not acknowledged" in err


def test_dry_run_validates_and_produces_nothing(cli: CliRunner, kafka_runtime: Runtime, producer: FakeProducer) -> None:
    result = cli.invoke(
        app, ["--json", "publish", "-t", "ServiceLatencyIncreased", "-i", "i-2", *FLAGS, "--dry-run"], obj=kafka_runtime
    )
    assert result.exit_code == 0
    shown = json.loads(result.stdout)
    assert shown["dryRun"] is True and shown["headers"]["ce_type"] == SLI
    assert shown["value"]["service"] == "cli-test-svc"
    assert producer.produced == []


def test_unregistered_schema_exits_1(cli: CliRunner, producer: FakeProducer) -> None:
    from confluent_kafka.schema_registry._sync.mock_schema_registry_client import MockSchemaRegistryClient

    empty = AvroSerde(MockSchemaRegistryClient({"url": "mock://empty"}))
    rt = Runtime(settings_factory=StackSettings, serde_factory=lambda _s: empty, producer_factory=lambda _s: producer)
    code, _, err = publish(cli, rt, "-t", "ServiceLatencyIncreased", "--sample")
    assert code == 1
    assert "make schemas" in err
    assert producer.produced == []


def test_unreachable_registry_exits_3(cli: CliRunner, producer: FakeProducer) -> None:
    nowhere = AvroSerde(registry_client("http://127.0.0.1:9"))
    rt = Runtime(settings_factory=StackSettings, serde_factory=lambda _s: nowhere, producer_factory=lambda _s: producer)
    code, _, err = publish(cli, rt, "-t", "ServiceLatencyIncreased", "--sample")
    assert code == 3
    assert "registry unreachable" in err
    assert producer.produced == []


def test_a_signing_key_signs_each_record_as_the_member_its_source_names(
    cli: CliRunner, kafka_runtime: Runtime, producer: FakeProducer, tmp_path: Path
) -> None:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from flotilla.envelope import Envelope
    from flotilla.keys import Keyring, load_or_create
    from flotilla.provenance import SIGNATURE_HEADER, Provenance

    key, _ = load_or_create(tmp_path / "health-agent.pem")
    args = ["-t", "ServiceLatencyIncreased", "-i", "incident-s", "--source", "/flotilla/health-agent", *FLAGS]
    code, _, err = publish(
        cli, kafka_runtime, *args, "--count", "2", "--signing-key", str(tmp_path / "health-agent.pem")
    )
    assert code == 0, err
    trusted = Provenance({"health-agent": Keyring([key.public_key()])})
    for sent in producer.produced:
        envelope = Envelope.from_headers(sent.headers)
        assert trusted.verify(envelope, sent.value, sent.headers[SIGNATURE_HEADER]).producer == "health-agent"
    other = Provenance({"health-agent": Keyring([Ed25519PrivateKey.generate().public_key()])})
    with pytest.raises(Exception, match="not trusted"):
        other.verify(
            Envelope.from_headers(producer.produced[0].headers),
            producer.produced[0].value,
            producer.produced[0].headers[SIGNATURE_HEADER],
        )


def test_an_unreadable_signing_key_is_a_usage_error_and_nothing_is_published(
    cli: CliRunner, kafka_runtime: Runtime, producer: FakeProducer, tmp_path: Path
) -> None:
    code, _, err = publish(
        cli, kafka_runtime, "-t", "ServiceLatencyIncreased", "-i", "i", *FLAGS, "--signing-key", str(tmp_path / "none")
    )
    assert code == 2 and "cannot read the signing key" in err
    assert producer.produced == []
