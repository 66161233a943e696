"""`make demo` (for now): the outbox round trip, shown live.

Opens a few incidents the way a service will: each one a state change plus a
ServiceLatencyIncreased record in one PostgreSQL transaction. Debezium publishes the
outbox rows to Kafka and this script, as a consumer, prints each record as it lands —
decoded through the schema registry, with its CloudEvents headers and the time from
commit to arrival. Exits 0 only when every record arrived intact.
The full incident simulation replaces this once the services exist.
"""

from __future__ import annotations

import argparse
import sys
import time

import psycopg
from confluent_kafka import Consumer
from flotilla_ops.samples import latency_fact

from flotilla.bootstrap import bootstrap_outbox
from flotilla.envelope import Envelope
from flotilla.outbox import Outbox
from flotilla.records import ServiceLatencyIncreased
from flotilla.registry import registry_client
from flotilla.serde import AvroSerde
from flotilla.settings import load_settings
from flotilla.tailing import header, tail_consumer

DB = "flotilla_demo"
SERVICES = ["checkout-api", "payments-api", "inventory-db", "search-api", "checkout-api"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=len(SERVICES))
    args = parser.parse_args()

    settings = load_settings()
    serde = AvroSerde(registry_client(settings.schema_registry_url))
    outbox = Outbox(serde)
    print(f"outbox connector for database {DB}: {bootstrap_outbox(settings, DB)} RUNNING")
    consumer = tail_consumer(settings.kafka_bootstrap, "incidents")
    started = time.perf_counter()
    ok = True
    with psycopg.connect(settings.pg_dsn(DB)) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS demo_incidents (incident_id text PRIMARY KEY, service text)")
        conn.commit()
        for n in range(args.count):
            service = SERVICES[n % len(SERVICES)]
            incident = f"incident-{int(time.time())}-{n}"
            value, env = latency_fact(incident, source="/flotilla/demo", service=service, p95_ms=900.0 + 250 * n)
            conn.execute("INSERT INTO demo_incidents VALUES (%s, %s)", (incident, service))
            payload = outbox.append(conn, ServiceLatencyIncreased.from_value(value), env, key=incident)
            conn.commit()
            committed = time.perf_counter()
            print(f"[{committed - started:6.2f}s] committed  {incident}: state row + outbox row ({len(payload)} bytes)")
            ok &= _await(consumer, serde, env, payload, committed, started)
            time.sleep(0.5)
    consumer.close()
    print("every record crossed the outbox intact" if ok else "SOME RECORDS DID NOT ARRIVE INTACT")
    return 0 if ok else 1


def _await(
    consumer: Consumer, serde: AvroSerde, env: Envelope, payload: bytes, committed: float, started: float
) -> bool:
    deadline = committed + 30
    while time.perf_counter() < deadline:
        msg = consumer.poll(0.05)
        if msg is None or msg.error() or header(msg.headers(), "ce_id") != env.id.encode():
            continue
        arrived = time.perf_counter()
        decoded = serde.deserialize(msg.value())
        v = decoded.value
        print(
            f"[{arrived - started:6.2f}s] published  {msg.topic()}[{msg.partition()}]@{msg.offset()} "
            f"key={(msg.key() or b'').decode()} {decoded.record_name.rsplit('.', 1)[-1]}"
            f" service={v['service']} p95={v['p95LatencyMs']:.0f}ms (+{(arrived - committed) * 1000:.0f} ms)"
        )
        hops, correlation = (header(msg.headers(), h) or b"?" for h in ("ce_hops", "ce_correlationid"))
        print(f"{'':10} headers    ce_id={env.id} ce_hops={hops.decode()} ce_correlationid={correlation.decode()}")
        return msg.value() == payload and Envelope.from_headers(msg.headers()) == env
    print(f"{'':10} NOT RECEIVED within 30 s: {env.id}")
    return False


if __name__ == "__main__":
    sys.exit(main())
