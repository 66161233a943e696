"""``flotilla tail``: follow topics, decoded through the registry, with their headers.

Positioned by :func:`flotilla.tailing.tail_consumer` (the end of each partition, resolved
before the first poll), or at the beginning (``--from-beginning``) or at a time
(``--since``). Filters read the ``ce_*`` headers first, so records of other incidents or
types are skipped without decoding. A dead-letter topic's records also show their
``dlq_*`` context (why, where from, which consumer, how many attempts).
"""

from __future__ import annotations

import json
import re
import time
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

import typer
from confluent_kafka import KafkaError, KafkaException

from flotilla.envelope import header_pairs
from flotilla.serde import AvroSerde, RegistryUnavailableError, SerdeError
from flotilla_ops.cli.output import ExitCode, Output, jsonable
from flotilla_ops.cli.records import short_name
from flotilla_ops.cli.runtime import runtime

_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}


def parse_since(text: str, now: datetime | None = None) -> int:
    """``90s``, ``10m``, ``2h``, ``1d`` ago, or an ISO-8601 time → epoch milliseconds."""
    now = now or datetime.now(UTC)
    match = _DURATION.fullmatch(text.strip())
    if match:
        seconds = float(match.group(1)) * _UNITS[match.group(2)]
        return int((now - timedelta(seconds=seconds)).timestamp() * 1000)
    at = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    at = at if at.tzinfo is not None else at.replace(tzinfo=UTC)
    return int(at.timestamp() * 1000)


def headers_text(raw: Any) -> dict[str, str | None]:
    """Headers by name (the first of a repeated name), as text."""
    found: dict[str, str | None] = {}
    for name, value in header_pairs(raw):
        if name not in found:
            found[name] = None if value is None else value.decode("utf-8", errors="replace")
    return found


def type_matches(wanted: list[str], record_type: str | None) -> bool:
    if not wanted:
        return True
    if record_type is None:
        return False
    return any(
        w in (record_type, short_name(record_type)) or w.lower() == short_name(record_type).lower() for w in wanted
    )


def describe(msg: Any, serde: AvroSerde) -> dict[str, Any]:
    """A consumed record as data: where it is, its headers and envelope, its decoded value."""
    headers = headers_text(msg.headers())
    topic = msg.topic() or ""
    _, ts = msg.timestamp()
    raw_key = msg.key()
    record: dict[str, Any] = {
        "topic": topic,
        "partition": msg.partition(),
        "offset": msg.offset(),
        "timestamp": None if ts is None or ts <= 0 else datetime.fromtimestamp(ts / 1000, tz=UTC),
        "key": None if raw_key is None else raw_key.decode("utf-8", errors="replace"),
        "type": headers.get("ce_type"),
        "envelope": {k[3:]: v for k, v in headers.items() if k.startswith("ce_")},
        "headers": headers,
        "schemaId": None,
        "value": None,
    }
    try:
        decoded = serde.deserialize(msg.value())
        record.update(type=decoded.record_name, schemaId=decoded.schema_id, value=jsonable(decoded.value))
    except (SerdeError, RegistryUnavailableError) as exc:
        record["decodeError"] = str(exc)
    if topic.endswith(".dlq"):
        record["dlq"] = {k[4:]: v for k, v in headers.items() if k.startswith("dlq_")}
    return record


def render(record: dict[str, Any]) -> str:
    """A record for people: one summary line, the envelope, DLQ context, the value."""
    when = record["timestamp"].isoformat(timespec="milliseconds").replace("+00:00", "Z") if record["timestamp"] else "-"
    kind = short_name(record["type"]) if record["type"] else "?"
    lines = [f"{record['topic']}[{record['partition']}]@{record['offset']}  {when}  {kind}  key={record['key']}"]
    env = record["envelope"]
    order = ("id", "source", "time", "correlationid", "causationid", "hops", "traceparent")
    shown = [f"ce_{k}={env[k]}" for k in order if env.get(k) is not None]
    shown += [f"{k}={v}" for k, v in record["headers"].items() if not k.startswith(("ce_", "dlq_"))]
    lines.append("  " + "  ".join(shown))
    if "dlq" in record:
        lines.append("  dead letter: " + "  ".join(f"{k}={v}" for k, v in record["dlq"].items()))
    if "decodeError" in record:
        lines.append(f"  not decodable: {record['decodeError']}")
    else:
        body = json.dumps(record["value"], indent=2, default=str)
        lines.extend("  " + line for line in body.splitlines())
    return "\n".join(lines)


def tail(
    ctx: typer.Context,
    topics: Annotated[
        list[str] | None,
        typer.Option("--topic", "-T", help="Topic to follow (repeatable): incidents, commands, incidents.dlq, ..."),
    ] = None,
    incident: Annotated[
        str | None, typer.Option("--incident", "-i", help="Only this incident (ce_correlationid).")
    ] = None,
    record_types: Annotated[
        list[str] | None, typer.Option("--type", "-t", help="Only this record type, short or full (repeatable).")
    ] = None,
    from_beginning: Annotated[bool, typer.Option("--from-beginning", help="Start at the oldest record.")] = False,
    since: Annotated[str | None, typer.Option("--since", help="Start at a time: 10m, 2h, 1d ago, or ISO-8601.")] = None,
    max_records: Annotated[int | None, typer.Option("--max", min=1, help="Stop after N matching records.")] = None,
    timeout: Annotated[float | None, typer.Option("--timeout", min=0.0, help="Stop after S seconds.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per line.")] = False,
) -> None:
    """Follow topics, decoded, with headers. Exit 1 when --max N was not reached in --timeout."""
    out = Output.of(ctx, as_json)
    rt = runtime(ctx)
    chosen = topics or ["incidents"]
    if from_beginning and since is not None:
        out.fail("--from-beginning and --since both say where to start; give one", ExitCode.USAGE)
    since_ms = None
    if since is not None:
        try:
            since_ms = parse_since(since)
        except ValueError:
            out.fail(f"--since {since!r}: expected 90s, 10m, 2h, 1d or an ISO-8601 time", ExitCode.USAGE)
    try:
        consumer = rt.consumer(chosen, from_beginning=from_beginning, since_ms=since_ms)
    except KafkaException as exc:
        out.fail(f"Kafka unreachable ({rt.settings.kafka_bootstrap}): {exc}", ExitCode.UNREACHABLE)
    except LookupError as exc:
        out.fail(str(exc), ExitCode.FAILED)
    serde = rt.serde()
    wanted = record_types or []
    seen = 0
    deadline = None if timeout is None else time.monotonic() + timeout
    out.note(f"following {', '.join(chosen)} (Ctrl-C to stop)")
    try:
        while max_records is None or seen < max_records:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                break
            msg = consumer.poll(min(0.5, left) if left is not None else 0.5)
            if msg is None:
                continue
            if msg.error():
                if msg.error().code() != KafkaError._PARTITION_EOF:
                    out.note(f"kafka: {msg.error()}")
                continue
            headers = headers_text(msg.headers())
            if incident is not None and headers.get("ce_correlationid") != incident:
                continue
            if wanted and headers.get("ce_type") is not None and not type_matches(wanted, headers.get("ce_type")):
                continue
            record = describe(msg, serde)
            if not type_matches(wanted, record["type"]):
                continue
            seen += 1
            if out.json:
                out.line(record)
            else:
                typer.echo(render(record))
    except KeyboardInterrupt:
        pass
    finally:
        consumer.close()
    if max_records is not None and seen < max_records:
        out.note(f"saw {seen} of {max_records} matching records")
        raise typer.Exit(int(ExitCode.FAILED))
