"""The operator's HTTP surface: list and inspect quarantined records, re-queue one.

Re-queueing produces to Kafka directly instead of going through the outbox. The outbox
is for *new* records this service decides to publish: Debezium gives each row the
identity and the fixed set of ``ce_*`` headers held in the row's columns. A re-queue is
not a new record: it re-sends an existing one, under the identity it already has
(its original ``ce_id``, ``ce_source``, ``ce_time``, causation, hops and trace) plus two
provenance headers (``flotilla_requeued_from``, ``flotilla_requeued_by``) that the
outbox table and the connector's header placement have no place for. Producing
directly keeps every original header byte for byte.

The price: the produce and the database update are not one transaction. The entry's
row is locked while the record is produced and marked re-queued only after Kafka
acknowledged it (idempotent producer, ``acks=all``), so two operators cannot both
re-queue it. If the process dies between the acknowledgement and the commit, the entry
stays 'quarantined' and a second re-queue sends a second copy with the same event id,
which every consumer's event-id dedupe absorbs.
"""

from __future__ import annotations

import base64
import logging
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaException, Message, Producer
from fastapi import FastAPI, Header, HTTPException, Query
from prometheus_client import Counter
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb
from pydantic import BaseModel

from flotilla import (
    AvroSerde,
    KafkaTarget,
    RecordValidationError,
    RegistryUnavailableError,
    SchemaNotRegisteredError,
    ServiceContext,
    UndecodableRecordError,
    commands,
    fact_provenance,
    kafka_connection,
    metrics,
)
from flotilla.authority import Unauthorized, verify_command
from flotilla.keys import Keyring
from flotilla.provenance import Provenance, signature_header
from flotilla.rawrecords import b64, from_jsonable, jsonable
from services.dlq_reconciler.quarantine import (
    DeadLetter,
    RequeueRefused,
    check_envelope,
    provenance,
    requeue_headers,
    with_identity,
)
from services.dlq_reconciler.settings import DlqSettings

log = logging.getLogger(__name__)

REQUEUED = Counter(
    "flotilla_requeued_total",
    "Quarantined records re-queued to their origin topic by an operator.",
    ["origin_topic", "sanitized"],
)

_SUMMARY = """id, status, origin_topic, origin_partition, origin_offset, dlq_topic, dlq_partition, dlq_offset,
    consumer, reason, error_class, error_message, first_failure_time, attempts, incident_id, original_event_id,
    original_type, tags, sightings, fact_event_id, quarantined_at, requeued_at, requeued_by, requeued_partition,
    requeued_offset, requeued_sanitized"""


class RequeueBody(BaseModel):
    """An optional sanitized replacement: the decoded record's fields, as GET shows them."""

    value: dict[str, Any] | None = None


def _iso(value: Any) -> str | None:
    return None if value is None else value.isoformat()


def _summary(row: dict[str, Any]) -> dict[str, Any]:
    requeue = None
    if row["status"] == "requeued":
        requeue = {
            "at": _iso(row["requeued_at"]),
            "by": row["requeued_by"],
            "topic": row["origin_topic"],
            "partition": row["requeued_partition"],
            "offset": row["requeued_offset"],
            "sanitized": row["requeued_sanitized"],
        }
    return {
        "id": str(row["id"]),
        "status": row["status"],
        "incidentId": row["incident_id"],
        "origin": {"topic": row["origin_topic"], "partition": row["origin_partition"], "offset": row["origin_offset"]},
        "dlq": {"topic": row["dlq_topic"], "partition": row["dlq_partition"], "offset": row["dlq_offset"]},
        "consumer": row["consumer"],
        "reason": row["reason"],
        "errorClass": row["error_class"],
        "errorMessage": row["error_message"],
        "firstFailureTime": row["first_failure_time"],
        "attempts": row["attempts"],
        "originalEventId": row["original_event_id"],
        "originalType": row["original_type"],
        "tags": row["tags"],
        "sightings": row["sightings"],
        "factEventId": None if row["fact_event_id"] is None else str(row["fact_event_id"]),
        "quarantinedAt": _iso(row["quarantined_at"]),
        "requeue": requeue,
    }


def _letter(row: dict[str, Any]) -> DeadLetter:
    headers = [(str(n), None if v is None else base64.b64decode(v)) for n, v in row["headers"]]
    return DeadLetter(
        dlq_topic=row["dlq_topic"],
        dlq_partition=row["dlq_partition"],
        dlq_offset=row["dlq_offset"],
        key=None if row["record_key"] is None else bytes(row["record_key"]),
        value=None if row["record_value"] is None else bytes(row["record_value"]),
        headers=headers,
    )


def _text(raw: bytes | None) -> str | None:
    if raw is None:
        return None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return None


@dataclass
class _Delivery:
    error: str | None = None
    partition: int | None = None
    offset: int | None = None


class _RequeueProducer:
    """One idempotent producer per process, created on first use."""

    def __init__(self, bootstrap: KafkaTarget, timeout: float) -> None:
        self._bootstrap = bootstrap
        self._timeout = timeout
        self._producer: Producer | None = None
        self._lock = threading.Lock()

    def _get(self) -> Producer:
        with self._lock:
            if self._producer is None:
                self._producer = Producer(
                    {
                        **kafka_connection(self._bootstrap),
                        "enable.idempotence": True,
                        "acks": "all",
                        "linger.ms": 0,
                        # Place by key as Debezium (a Java client) does, murmur2, so the copy
                        # lands in its key's partition and keeps per-incident order
                        # (librdkafka's default, CRC32, would put it elsewhere). A keyless
                        # record goes to any partition.
                        "partitioner": "murmur2_random",
                    }
                )
            return self._producer

    def send(
        self,
        topic: str,
        key: bytes | None,
        value: bytes,
        headers: list[tuple[str, str | bytes | None]],
    ) -> _Delivery:
        """Produce and wait for the acknowledgement. The partition is the key's, as the
        fleet's producers place every record: never one a letter names. Its
        ``dlq_origin_partition`` is a header, which whoever writes to a DLQ chooses; sent
        there, a copy could land outside its key's partition, behind or ahead of its own
        incident's records, or on a partition another consumer owns."""
        delivery = _Delivery()
        done = threading.Event()

        def delivered(err: Any, msg: Message) -> None:
            if err is not None:
                delivery.error = str(err)
            else:
                delivery.partition, delivery.offset = msg.partition(), msg.offset()
            done.set()

        producer = self._get()
        try:
            producer.produce(
                topic,
                key=key,
                value=value,
                headers=headers,
                on_delivery=delivered,
            )
        except (KafkaException, BufferError) as exc:
            return _Delivery(error=str(exc))
        producer.flush(self._timeout)
        if not done.is_set():
            return _Delivery(error=f"not acknowledged within {self._timeout:.0f} s")
        return delivery


def make_routes(settings: DlqSettings) -> Callable[[FastAPI, ServiceContext], None]:
    tokens, demo = settings.operators()  # refuses to start without operators outside the demo profile
    origin_label = metrics.BoundedLabel(settings.origin_topics)  # the origin comes from a dlq_* header
    if demo:
        log.warning("the public demo operator token is accepted: set FLOTILLA_OPERATOR_TOKENS outside the demo")
    authority = Keyring.parse(settings.authorization_public_keys)
    producers = fact_provenance(settings)  # whose signature a re-queued record must still carry

    def routes(app: FastAPI, ctx: ServiceContext) -> None:
        producer = _RequeueProducer(settings.kafka_client(), settings.requeue_timeout_seconds)

        @app.get("/quarantine")
        def list_quarantine(
            status: str | None = None,
            reason: str | None = None,
            origin: str | None = None,
            incident: str | None = None,
            limit: int = Query(100, ge=1, le=1000),
        ) -> dict[str, Any]:
            where, args = [], []
            for column, wanted in (
                ("status", status),
                ("reason", reason),
                ("origin_topic", origin),
                ("incident_id", incident),
            ):
                if wanted is not None:
                    where.append(f"{column} = %s")
                    args.append(wanted)
            clause = f"WHERE {' AND '.join(where)}" if where else ""
            with ctx.pool.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
                rows = cur.execute(
                    f"SELECT {_SUMMARY} FROM quarantine {clause} ORDER BY quarantined_at DESC, id LIMIT %s",
                    (*args, limit),
                ).fetchall()
            return {"entries": [_summary(r) for r in rows]}

        @app.get("/quarantine/{entry_id}")
        def show(entry_id: uuid.UUID) -> dict[str, Any]:
            with ctx.pool.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
                row = cur.execute(
                    f"SELECT {_SUMMARY}, headers, record_key, record_value, requeued_value FROM quarantine "
                    "WHERE id = %s",
                    (entry_id,),
                ).fetchone()
            if row is None:
                raise HTTPException(404, {"error": f"no quarantine entry {entry_id}"})
            letter = _letter(row)
            decoded: dict[str, Any] | None = None
            decode_error = None
            try:
                result = ctx.serde.deserialize(letter.value)
                decoded = {
                    "recordType": result.record_name,
                    "schemaId": result.schema_id,
                    "fields": jsonable(result.value),
                }
            except (UndecodableRecordError, RegistryUnavailableError) as exc:
                decode_error = str(exc)
            return {
                **_summary(row),
                "headers": [{"name": n, "text": _text(v), "base64": b64(v)} for n, v in letter.headers],
                "key": {"text": _text(letter.key), "base64": b64(letter.key)},
                "value": {"base64": b64(letter.value), "decoded": decoded, "decodeError": decode_error},
                "requeuedValue": row["requeued_value"],
            }

        @app.post("/quarantine/{entry_id}/requeue")
        def requeue(
            entry_id: uuid.UUID,
            body: RequeueBody | None = None,
            authorization: str | None = Header(default=None),
        ) -> dict[str, Any]:
            operator = tokens.authenticate(authorization)
            if operator is None:
                raise HTTPException(
                    401, {"error": "an operator bearer token is required"}, headers={"WWW-Authenticate": "Bearer"}
                )
            sanitized = body.value if body is not None else None
            with ctx.pool.connection() as conn, conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
                row = cur.execute(
                    f"SELECT {_SUMMARY}, headers, record_key, record_value FROM quarantine WHERE id = %s FOR UPDATE",
                    (entry_id,),
                ).fetchone()
                if row is None:
                    raise HTTPException(404, {"error": f"no quarantine entry {entry_id}"})
                if row["status"] == "requeued":
                    raise HTTPException(409, {"error": "already re-queued", **_summary(row)})
                letter = _letter(row)
                try:
                    value, payload = requeue_payload(ctx.serde, letter, sanitized, authority)
                except RequeueRefused as exc:
                    raise HTTPException(422, {"error": str(exc), "problems": exc.problems}) from None
                except RegistryUnavailableError as exc:
                    raise HTTPException(503, {"error": str(exc)}) from None
                if sanitized is None:
                    payload = letter.value or payload  # the very bytes its producer signed
                try:
                    still_signed(producers, letter, payload)
                except RequeueRefused as exc:
                    raise HTTPException(422, {"error": str(exc), "problems": exc.problems}) from None
                origin = provenance(letter.dlq_topic, letter.dlq_partition, letter.dlq_offset)
                headers = requeue_headers(letter.original_headers, requeued_from=origin, requeued_by=operator.name)
                delivery = producer.send(letter.origin_topic, letter.key, payload, headers)
                if delivery.error is not None:
                    raise HTTPException(502, {"error": f"could not produce to {letter.origin_topic}: {delivery.error}"})
                cur.execute(
                    "UPDATE quarantine SET status = 'requeued', requeued_at = now(), requeued_by = %s, "
                    "requeued_partition = %s, requeued_offset = %s, requeued_sanitized = %s, requeued_value = %s "
                    "WHERE id = %s",
                    (
                        operator.name,
                        delivery.partition,
                        delivery.offset,
                        sanitized is not None,
                        Jsonb(jsonable(value)),
                        entry_id,
                    ),
                )
            REQUEUED.labels(origin_label(letter.origin_topic), str(sanitized is not None).lower()).inc()
            log.info(
                "%s re-queued %s to %s[%s]@%s",
                operator.name,
                origin,
                letter.origin_topic,
                delivery.partition,
                delivery.offset,
            )
            return {
                "id": str(entry_id),
                "status": "requeued",
                "eventId": letter.original_event_id,
                "recordType": letter.original_type,
                "sanitized": sanitized is not None,
                "requeuedBy": operator.name,
                "requeuedFrom": origin,
                "requeuedTo": {
                    "topic": letter.origin_topic,
                    "partition": delivery.partition,
                    "offset": delivery.offset,
                },
            }

    return routes


def still_signed(producers: Provenance, letter: DeadLetter, payload: bytes) -> None:
    """Refuse a re-queue whose record its producer would not have signed: an edited value,
    or a record that was never signed (a dead letter ``unauthorized``). A re-queue goes back
    to consumers that check the signature anyway; refusing here says why at once, to the
    operator, instead of as one more dead letter."""
    envelope = check_envelope(letter.original_headers)
    try:
        producers.verify(envelope, payload, signature_header(letter.original_headers))
    except Unauthorized as exc:
        raise RequeueRefused(
            f"the record's signature by its producer does not hold ({exc.refusal.value}): {exc}; a re-queue never "
            "speaks for a producer: re-queue the record unchanged, or let its producer state it again",
            [f"signature: {exc.refusal.value}"],
        ) from exc


def requeue_payload(
    serde: AvroSerde, letter: DeadLetter, sanitized: dict[str, Any] | None, authority: Keyring | None = None
) -> tuple[dict[str, Any], bytes]:
    """The value to re-queue and its bytes, serialized against the registered schema of the
    original record type on the origin topic; raises RequeueRefused saying what is wrong.

    A command goes back only unchanged and only with the policy service's signature intact
    (checked against ``authority``): any edit would void the signature, and an operator's
    token is not the policy service's authority."""
    envelope = check_envelope(letter.original_headers)
    record_type = envelope.type
    is_command = commands.kind_of(record_type) is not None
    if is_command and sanitized is not None:
        raise RequeueRefused(
            "a command cannot be sanitized: any change voids the policy service's signature; re-queue it "
            "unchanged, or let a new proposal be decided",
            ["value: commands are re-queued unchanged"],
        )
    if sanitized is None:
        try:
            decoded = serde.deserialize(letter.value)
        except UndecodableRecordError as exc:
            raise RequeueRefused(
                f'the original value does not decode ({exc}); send a sanitized replacement as {{"value": {{...}}}}'
            ) from exc
        if decoded.record_name != record_type:
            raise RequeueRefused(
                f"the original value is a {decoded.record_name} but ce_type says {record_type}; "
                "send a sanitized replacement"
            )
        value = dict(decoded.value)
    else:
        value = dict(sanitized)
    try:
        writer = serde.writer(letter.origin_topic, record_type)
        if sanitized is not None:  # as the API shows values: bytes (signatures) as base64 text
            value = from_jsonable(writer.parsed, value)
        field_names = {f["name"] for f in writer.parsed["fields"]}
        value = with_identity(value, field_names, envelope.id)
        payload = serde.serialize(letter.origin_topic, record_type, value)
    except SchemaNotRegisteredError as exc:
        raise RequeueRefused(str(exc)) from exc
    except RecordValidationError as exc:
        raise RequeueRefused(str(exc), exc.problems) from exc
    if is_command:
        if authority is None or not authority:
            raise RequeueRefused(
                "no policy keys are configured here (FLOTILLA_AUTHORIZATION_PUBLIC_KEYS): no command can be re-queued"
            )
        try:
            verify_command(authority, record_type, value)
        except Unauthorized as exc:
            raise RequeueRefused(
                f"the command's policy authorization does not hold ({exc.refusal.value}): {exc}; "
                "a re-queue never authorizes anything",
                [f"authorization: {exc.refusal.value}"],
            ) from exc
    return value, payload
