"""``flotilla publish``: the CLI producer of test events, straight to Kafka.

The fleet itself publishes through each service's outbox (Debezium); this command is
for people and load tests. It builds a catalogue record from ``--field``/``--json``/
``--file``, gives it a CloudEvents envelope (:class:`flotilla.envelope.Envelope`),
validates and frames it with the schema *registered* for the record's subject
(:class:`flotilla.serde.AvroSerde`), and reports success only once Kafka acknowledged
every record. Invalid input is reported field by field and nothing is produced.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any

import typer
from confluent_kafka import KafkaException
from confluent_kafka.schema_registry.error import SchemaRegistryError

from flotilla.authority import Signer
from flotilla.envelope import DEFAULT_HOPS, Envelope
from flotilla.keys import KeyMaterialError, load_private_key
from flotilla.provenance import SIGNATURE_HEADER, sign_fact
from flotilla.serde import AvroSerde, RecordValidationError, SchemaNotRegisteredError
from flotilla_ops.cli.output import ExitCode, Output, unreachable
from flotilla_ops.cli.records import (
    InputError,
    build_value,
    field_names,
    parse_field_flags,
    parse_json_object,
    read_json_file,
    resolve_type,
    short_name,
)
from flotilla_ops.cli.runtime import ProducerLike, runtime
from flotilla_ops.samples import sample_value

DEFAULT_SOURCE = "/flotilla/cli"


@dataclass
class Delivery:
    """Acknowledgements and failures reported by the producer's delivery callbacks."""

    acked: list[tuple[str, int, int]] = field(default_factory=list)  # (event id, partition, offset)
    errors: list[dict[str, str]] = field(default_factory=list)

    def callback(self, event_id: str) -> Any:
        def delivered(err: Any, msg: Any) -> None:
            if err is not None:
                self.errors.append({"eventId": event_id, "error": str(err)})
            else:
                self.acked.append((event_id, int(msg.partition()), int(msg.offset())))

        return delivered


def record_key(topic: str, incident: str, value: dict[str, Any]) -> str:
    """What the fleet keys records by: the incident on ``incidents``, ``<environment>/<name>``
    of the target resource on ``commands`` (see services/policy/commands.resource_key)."""
    target = value.get("target")
    if topic == "commands" and isinstance(target, dict) and "environment" in target and "name" in target:
        return f"{target['environment']}/{target['name']}"
    return incident


def _check_time(text: str | None, out: Output) -> None:
    if text is None:
        return
    try:
        datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        out.fail(f"--time {text!r} is not an ISO-8601 time (e.g. 2024-05-01T12:00:00Z)", ExitCode.USAGE)


def _writer(serde: AvroSerde, topic: str, full_name: str, out: Output) -> dict[str, Any]:
    """The registered (parsed) schema, or the right failure."""
    try:
        parsed: dict[str, Any] = serde.writer(topic, full_name).parsed
    except SchemaNotRegisteredError as exc:
        out.fail(str(exc), ExitCode.FAILED)
    except SchemaRegistryError as exc:
        code = ExitCode.UNREACHABLE if exc.http_status_code >= 500 else ExitCode.FAILED
        out.fail(f"schema registry: {exc}", code)
    except Exception as exc:
        if unreachable(exc):
            out.fail(f"schema registry unreachable: {type(exc).__name__}: {exc}", ExitCode.UNREACHABLE)
        raise
    return parsed


def publish(
    ctx: typer.Context,
    record_type: Annotated[
        str, typer.Option("--type", "-t", help="Record type: short (ServiceLatencyIncreased) or full name.")
    ],
    fields: Annotated[
        list[str] | None,
        typer.Option("--field", "-f", help="name=value (repeatable); nested: target.name=value; JSON for records."),
    ] = None,
    json_value: Annotated[
        str | None, typer.Option("--json", "--value", help="The record's fields as a JSON object.")
    ] = None,
    file: Annotated[
        Path | None, typer.Option("--file", help="A file holding the record's fields as a JSON object.")
    ] = None,
    sample: Annotated[
        bool, typer.Option("--sample", help="Start from a valid sample of the type; fields given override it.")
    ] = False,
    incident: Annotated[
        str | None,
        typer.Option("--incident", "-i", help="Incident id (ce_correlationid); fills incidentId when absent."),
    ] = None,
    topic: Annotated[str | None, typer.Option("--topic", help="Publish here instead of the catalogue's topic.")] = None,
    key: Annotated[
        str | None, typer.Option("--key", help="Kafka key (default: incident, or target on commands).")
    ] = None,
    source: Annotated[str, typer.Option("--source", help="ce_source.")] = DEFAULT_SOURCE,
    event_id: Annotated[str | None, typer.Option("--id", help="ce_id (and eventId); only with --count 1.")] = None,
    causation: Annotated[
        str | None, typer.Option("--causation", help="ce_causationid: the event that caused this.")
    ] = None,
    hops: Annotated[int, typer.Option("--hops", min=1, help="ce_hops: the remaining hop budget.")] = DEFAULT_HOPS,
    at: Annotated[str | None, typer.Option("--time", help="ce_time (ISO-8601); default: now.")] = None,
    count: Annotated[int, typer.Option("--count", "-n", min=1, help="How many records (fresh ids each).")] = 1,
    rate: Annotated[
        float | None, typer.Option("--rate", "-r", min=0.001, help="Records per second (default: as fast as possible).")
    ] = None,
    timeout: Annotated[float, typer.Option("--timeout", min=0.1, help="Seconds to wait for acknowledgements.")] = 30.0,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Build and validate; publish nothing.")] = False,
    signing_key: Annotated[
        Path | None,
        typer.Option(
            "--signing-key",
            help="Sign each record (ce_signature) with this member's private key, as the member --source names; "
            "the fleet refuses unsigned records (dead letter 'unauthorized').",
        ),
    ] = None,
) -> None:
    """Publish catalogue records to Kafka, validated against the registered schema.

    Exits 2 naming each bad field (nothing is published), 1 when a record was not
    acknowledged, 3 when Kafka or the registry is unreachable. JSON output: root
    option (flotilla --json publish ...), since --json here is the record itself.
    """
    out = Output.of(ctx)
    rt = runtime(ctx)
    if json_value is not None and file is not None:
        out.fail("give the record with --json or --file, not both", ExitCode.USAGE)
    if event_id is not None and count > 1:
        out.fail("--id names one record; with --count each record gets a fresh id", ExitCode.USAGE)
    _check_time(at, out)
    try:
        contract = resolve_type(record_type)
        flags = parse_field_flags(fields or [])
        base = read_json_file(file) if file is not None else None
        if json_value is not None:
            base = parse_json_object(json_value, "--json")
    except InputError as exc:
        out.fail(str(exc), ExitCode.USAGE, problems=exc.problems)

    full_name = contract.full_name
    target_topic = topic or contract.topic
    serde = rt.serde()
    parsed = _writer(serde, contract.topic, full_name, out)
    given = build_value(parsed, base, flags)
    names = field_names(parsed)
    # a sample is a starting point: JSON replaces its fields, flags set (nested) fields over both
    value = build_value(parsed, {**sample_value(contract.schema), **(base or {})}, flags) if sample else given

    # the incident: the flag, else the record's own incidentId
    in_value = value.get("incidentId") if "incidentId" in given else None
    if incident is not None and in_value is not None and in_value != incident:
        out.fail(f"--incident {incident!r} but field incidentId is {in_value!r}", ExitCode.USAGE)
    correlation = incident or (str(in_value) if in_value is not None else None)
    if correlation is None:
        if not sample:
            out.fail("no incident: give --incident or the field incidentId", ExitCode.USAGE)
        correlation = f"incident-cli-{uuid.uuid4().hex[:8]}"
    if "incidentId" in names:
        value["incidentId"] = correlation
    explicit_id = event_id or (str(given["eventId"]) if "eventId" in given else None)
    if explicit_id is not None and count > 1:
        out.fail("field eventId names one record; with --count each record gets a fresh id", ExitCode.USAGE)

    def fresh(first: bool) -> tuple[dict[str, Any], Envelope]:
        ident = explicit_id if (first and explicit_id) else str(uuid.uuid4())
        env_kwargs: dict[str, Any] = {"time": at} if at else {}
        envelope = Envelope(
            type=full_name,
            source=source,
            correlationid=correlation,
            id=ident,
            causationid=causation,
            hops=hops,
            **env_kwargs,
        )
        record = dict(value)
        if "eventId" in names:
            record["eventId"] = ident
        return record, envelope

    first_value, first_envelope = fresh(True)
    try:
        serde.validate(contract.topic, full_name, first_value)
    except RecordValidationError as exc:
        out.fail(
            f"{short_name(full_name)} does not match its registered schema ({exc.subject}); nothing was published",
            ExitCode.USAGE,
            problems=exc.problems,
        )
    message_key = key or record_key(target_topic, correlation, first_value)
    if dry_run:
        out.emit(
            {
                "ok": True,
                "dryRun": True,
                "topic": target_topic,
                "key": message_key,
                "type": full_name,
                "headers": {k: v.decode() for k, v in first_envelope.headers()},
                "value": first_value,
            },
            lambda d: (
                f"valid {short_name(full_name)} for {target_topic} (key {message_key}); not published (--dry-run)"
            ),
        )
        return
    signer = None
    if signing_key is not None:
        try:
            signer = Signer(load_private_key(signing_key))
        except KeyMaterialError as exc:
            out.fail(str(exc), ExitCode.USAGE)
    _produce(
        out,
        rt.producer(),
        serde,
        contract.topic,
        target_topic,
        full_name,
        message_key,
        count,
        rate,
        timeout,
        fresh,
        signer,
    )


def _produce(
    out: Output,
    producer: ProducerLike,
    serde: AvroSerde,
    subject_topic: str,
    topic: str,
    full_name: str,
    key: str,
    count: int,
    rate: float | None,
    timeout: float,
    fresh: Any,
    signer: Signer | None = None,
) -> None:
    delivery = Delivery()
    ids: list[str] = []
    started = time.monotonic()
    interrupted = False
    try:
        for index in range(count):
            if rate is not None:
                wait = started + index / rate - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
            value, envelope = fresh(index == 0)
            data = serde.serialize(subject_topic, full_name, value)
            headers = envelope.headers()
            if signer is not None:
                headers.append((SIGNATURE_HEADER, sign_fact(signer, envelope, data).encode()))
            while True:
                try:
                    producer.produce(
                        topic,
                        key=key,
                        value=data,
                        headers=headers,
                        on_delivery=delivery.callback(envelope.id),
                    )
                    break
                except BufferError:  # the local queue is full: let deliveries drain
                    producer.poll(0.1)
            ids.append(envelope.id)
            producer.poll(0)
    except KeyboardInterrupt:  # stop sending, but still wait for what was sent
        interrupted = True
    except KafkaException as exc:
        out.fail(f"Kafka refused the record: {exc}", ExitCode.FAILED, eventIds=ids)
    sent = time.monotonic() - started
    try:
        remaining = producer.flush(timeout)
    except KafkaException as exc:
        out.fail(f"Kafka refused the record: {exc}", ExitCode.FAILED, eventIds=ids)
    elapsed = time.monotonic() - started
    acked = {event for event, _, _ in delivery.acked}
    unconfirmed = [i for i in ids if i not in acked and i not in {e["eventId"] for e in delivery.errors}]
    report: dict[str, Any] = {
        "ok": len(acked) == count,
        "topic": topic,
        "key": key,
        "type": full_name,
        "requested": count,
        "interrupted": interrupted,
        "published": len(acked),
        "deliveryErrors": delivery.errors,
        "unconfirmed": unconfirmed if remaining else [],
        "elapsedSeconds": round(elapsed, 3),
        # acknowledged records over the whole run (connection and final flush included),
        # and the pace at which they were handed to the producer
        "ratePerSecond": round(len(acked) / elapsed, 1) if elapsed > 0 else None,
        "sendRatePerSecond": round(count / sent, 1) if sent > 0 else None,
        "eventIds": ids,
        "deliveries": [{"eventId": e, "partition": p, "offset": o} for e, p, o in delivery.acked],
    }
    if not report["ok"]:
        problems = [f"{e['eventId']}: {e['error']}" for e in delivery.errors]
        problems += [f"{i}: not acknowledged within {timeout:g} s" for i in report["unconfirmed"]]
        everything_lost = not acked and all(unreachable_text(e["error"]) for e in delivery.errors)
        code = ExitCode.UNREACHABLE if everything_lost and (delivery.errors or remaining) else ExitCode.FAILED
        out.fail(
            f"{len(acked)} of {count} {short_name(full_name)} acknowledged by Kafka ({topic})",
            code,
            problems=problems[:20],
            report=report,
        )
    out.emit(report, _text_report)


def unreachable_text(error: str) -> bool:
    lowered = error.lower()
    return any(word in lowered for word in ("timed out", "transport", "connect", "all brokers down", "msg_timed_out"))


def _text_report(report: dict[str, Any]) -> str:
    name = short_name(report["type"])
    if report["requested"] == 1:
        d = report["deliveries"][0]
        where = f"{report['topic']}[{d['partition']}]@{d['offset']}"
        return f"published {name} to {where} key={report['key']} id={d['eventId']}"
    return (
        f"published {report['published']}/{report['requested']} {name} to {report['topic']} in "
        f"{report['elapsedSeconds']:.2f} s ({report['ratePerSecond']} acknowledged records/s, "
        f"sent at {report['sendRatePerSecond']}/s), "
        f"{len(report['deliveryErrors'])} delivery errors"
    )
