"""Runtime library figures on the real stack: serde cost, consumer throughput, dedupe cost.

    .venv/bin/python benchmarks/runtime.py [--records 5000] [--per-record 1000]

Prints:
- serialize + validate µs per record (a small fact and a multi-step proposal);
- records/s through one consumer process doing dedupe + workflow state + handler state
  + an outbox record per input, against the real PostgreSQL and Kafka, with one
  transaction per poll batch and with one transaction per record;
- the cost of dedupe: µs per (consumer, event id) claim inside a batch transaction, and
  records/s when every record is a duplicate.
"""

from __future__ import annotations

import argparse
import time
import timeit
import uuid
from typing import Any

import psycopg
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic
from flotilla_ops.samples import SERVICE_LATENCY_INCREASED, latency_fact, sample_value
from psycopg_pool import ConnectionPool

from flotilla import dedupe
from flotilla.bootstrap import bootstrap_outbox
from flotilla.consumer import ConsumerLoop, LoopConfig, migrate
from flotilla.contracts import Contract, load_contracts, register, register_all
from flotilla.handling import HandlerContext
from flotilla.records import DiagnosisRequested
from flotilla.registry import registrar_client
from flotilla.serde import AvroSerde
from flotilla.settings import StackSettings, load_settings

DB = "flotilla_bench_runtime"
# The handler's records go to a topic of their own: on `incidents` every service of a
# running fleet would have to read them.
OUT_TOPIC = "bench-runtime-out"
DIAGNOSIS_REQUESTED = DiagnosisRequested.TYPE
RECOVERY_PROPOSED = "dev.flotilla.decisions.RecoveryProposed"


def serde_cost(serde: AvroSerde) -> None:
    schemas = {c.full_name: c.schema for c in load_contracts()}
    small, _ = latency_fact("incident-bench")
    proposal = sample_value(schemas[RECOVERY_PROPOSED])
    for name, value in ((SERVICE_LATENCY_INCREASED, small), (RECOVERY_PROPOSED, proposal)):
        serde.serialize("incidents", name, value)  # warm the caches
        n = 20_000
        seconds = timeit.timeit(lambda: serde.serialize("incidents", name, value), number=n)  # noqa: B023
        size = len(serde.serialize("incidents", name, value))
        print(f"  serialize + validate {name.rsplit('.', 1)[-1]:<24} {seconds / n * 1e6:6.1f} µs/record ({size} B)")
        data = serde.serialize("incidents", name, value)
        seconds = timeit.timeit(lambda: serde.deserialize(data), number=n)  # noqa: B023
        print(f"  deserialize          {name.rsplit('.', 1)[-1]:<24} {seconds / n * 1e6:6.1f} µs/record")


def make_topic(settings: StackSettings, partitions: int = 6) -> str:
    name = f"bench-loop-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": settings.kafka_bootstrap})
    for fut in admin.create_topics(
        [NewTopic(name, num_partitions=partitions, replication_factor=1), NewTopic(f"{name}.dlq", 1, 1)]
    ).values():
        fut.result(15)
    return name


Record = tuple[str, bytes, list[tuple[str, str | bytes | None]]]


def new_records(serde: AvroSerde, count: int) -> list[Record]:
    records = []
    for n in range(count):
        incident = f"incident-bench-{uuid.uuid4().hex[:10]}-{n}"
        value, env = latency_fact(incident, source="/flotilla/bench")
        headers: list[tuple[str, str | bytes | None]] = list(env.headers())
        records.append((incident, serde.serialize("incidents", SERVICE_LATENCY_INCREASED, value), headers))
    return records


def fill(settings: StackSettings, topic: str, records: list[Record]) -> None:
    producer = Producer({"bootstrap.servers": settings.kafka_bootstrap, "linger.ms": 20})
    for n, (key, payload, headers) in enumerate(records):
        producer.produce(topic, key=key, value=payload, headers=headers)
        if n % 1000 == 0:
            producer.poll(0)
    assert producer.flush(60) == 0


def handlers() -> dict[str, Any]:
    schema = next(c.schema for c in load_contracts() if c.full_name == DIAGNOSIS_REQUESTED)
    template = sample_value(schema)
    template.pop("eventId")

    def on_latency(ctx: HandlerContext) -> None:
        incident = ctx.incoming.value["incidentId"]
        ctx.conn.execute("INSERT INTO bench_effects (incident_id) VALUES (%s)", (incident,))
        ctx.emit(DiagnosisRequested.from_value({**template, "incidentId": incident}), key=incident, topic=OUT_TOPIC)

    return {SERVICE_LATENCY_INCREASED: on_latency}


def throughput(
    settings: StackSettings,
    serde: AvroSerde,
    pool: ConnectionPool[Any],
    topic: str,
    count: int,
    *,
    batched: bool,
    group: str,
) -> float:
    config = LoopConfig(
        name=group, topics=(topic,), source="/flotilla/bench", batch_size=500, batch_transactions=batched
    )
    loop = ConsumerLoop(config, settings, serde, pool, handlers())
    seen = 0
    first = None
    while seen < count:
        got = loop.poll_once()
        if got and first is None:
            first = time.perf_counter()  # the clock starts at the first delivered batch
        seen += got
    assert first is not None
    elapsed = time.perf_counter() - first
    return count / elapsed


def dedupe_cost(pool: ConnectionPool[Any], n: int = 5000, batch: int = 500) -> tuple[float, float]:
    """µs per claim: one statement per record (isolated path) and one per batch (fast path)."""

    def claim(i: int) -> dedupe.Claim:
        return dedupe.Claim(str(uuid.uuid4()), SERVICE_LATENCY_INCREASED, "handled", "bench", 0, i)

    with pool.connection() as conn, conn.transaction():
        started = time.perf_counter()
        for i in range(n):
            dedupe.claim_one(conn, "bench-dedupe", claim(i))
        single = (time.perf_counter() - started) / n * 1e6
        started = time.perf_counter()
        for first in range(0, n, batch):
            dedupe.claim_many(conn, "bench-dedupe", [claim(i) for i in range(first, first + batch)])
        bulk = (time.perf_counter() - started) / n * 1e6
    return single, bulk


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=5000, help="records for the batched run")
    parser.add_argument("--per-record", type=int, default=1000, help="records for the per-record run")
    args = parser.parse_args()

    settings = load_settings()
    client = registrar_client(settings)  # it registers: the registrar
    register_all(client)
    serde = AvroSerde(client)
    print("serde (in process):")
    serde_cost(serde)

    admin = AdminClient({"bootstrap.servers": settings.kafka_bootstrap})
    if OUT_TOPIC not in admin.list_topics(timeout=10).topics:
        admin.create_topics([NewTopic(OUT_TOPIC, num_partitions=6, replication_factor=1)])[OUT_TOPIC].result(15)
    schema = next(c.schema for c in load_contracts() if c.full_name == DIAGNOSIS_REQUESTED)
    register(client, Contract(OUT_TOPIC, schema))
    bootstrap_outbox(settings, DB)
    with psycopg.connect(settings.pg_dsn(DB), autocommit=True) as conn:
        migrate(conn)
        conn.execute("CREATE TABLE IF NOT EXISTS bench_effects (incident_id text, at timestamptz DEFAULT now())")
    pool: ConnectionPool[Any] = ConnectionPool(
        settings.pg_dsn(DB), min_size=1, max_size=2, kwargs={"autocommit": True}, open=True
    )
    print("one consumer process, dedupe + workflow state + handler state + outbox record per input:")
    batched = new_records(serde, args.records)
    topic = make_topic(settings)
    fill(settings, topic, batched)
    group = f"bench-{topic}"
    rate = throughput(settings, serde, pool, topic, args.records, batched=True, group=group)
    print(f"  batched (one transaction per poll batch of <= 500): {rate:8.0f} records/s over {args.records}")
    topic = make_topic(settings)
    fill(settings, topic, new_records(serde, args.per_record))
    rate = throughput(settings, serde, pool, topic, args.per_record, batched=False, group=f"bench-{topic}")
    print(f"  per record (one transaction + offset commit each):  {rate:8.0f} records/s over {args.per_record}")

    print("dedupe:")
    single, bulk = dedupe_cost(pool)
    print(f"  claim (consumer, event id), one statement per record:  {single:6.1f} µs/record")
    print(f"  claim (consumer, event id), one statement per batch:   {bulk:6.1f} µs/record")
    # The same records (same event ids) again, on a new topic, to the same consumer.
    replay = make_topic(settings)
    fill(settings, replay, batched)
    rate = throughput(settings, serde, pool, replay, args.records, batched=True, group=group)
    print(f"  every record a duplicate (same consumer, {args.records} again):  {rate:8.0f} records/s")
    pool.close()


if __name__ == "__main__":
    main()
