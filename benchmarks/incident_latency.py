"""Incident latency on the auto-authorized path, next to the floor measured in the same run.

    FLOTILLA_HEALTH_INCIDENTS_PER_HOUR=0 make fleet-up && .venv/bin/python benchmarks/incident_latency.py --incidents 20

(the cap off: 20 incidents on checkout-dev within minutes is past the default cap of 12
an hour per service, services/health_agent/settings.py)

For each incident: reset the sim, slow down payments-dev (so checkout-dev breaches in the
`dev` environment, where policy authorizes without a person), and time every record of
the chain as it arrives at a consumer, from ServiceLatencyIncreased to RecoveryExecuted.
The simulated action time (RecoveryExecuted.actionDurationMs) is taken out of the
figures: it is the sim pretending to scale, not Flotilla. Detection (scrapes and
hysteresis) comes before ServiceLatencyIncreased and is not counted either. When
Alertmanager's alert reaches the health agent before its own reading does, the incident
opens with ServiceDegraded instead: it stands in for ServiceLatencyIncreased (the same
link, the record that opens the incident).

The floor is one PostgreSQL commit plus one raw Kafka produce → consume round trip, on
the same machine and in the same run: what a hop through the outbox cannot beat.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time
import uuid
from collections import defaultdict

import psycopg
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from flotilla.envelope import Envelope
from flotilla.fleet import HEALTH, SIM, url
from flotilla.registry import registry_client
from flotilla.serde import AvroSerde, SerdeError
from flotilla.settings import StackSettings, load_settings
from flotilla.tailing import tail_consumer
from services.health_agent.scrape import settled

# An incident opened by an alert starts with ServiceDegraded: the same first link.
OPENED_BY = {"ServiceDegraded": "ServiceLatencyIncreased"}
CHAIN = [
    "ServiceLatencyIncreased",
    "DiagnosisRequested",
    "DependencyFailureSuspected",
    "RecoveryProposed",
    "RecoveryApproved",
    "ScaleService",
    "RecoveryExecuted",
]


def http(method: str, address: str, body: object | None = None) -> None:
    import json
    import urllib.request

    request = urllib.request.Request(
        address, data=json.dumps(body).encode() if body is not None else None, method=method
    )
    request.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(request, timeout=10) as resp:
        resp.read()


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(p / 100 * len(ordered)) - 1))]


def wait_healthy(settings: StackSettings, service: str, timeout: float = 60) -> None:
    """Until the health agent has seen ``service`` healthy and nothing holds an incident of
    it open (an alert about it still firing keeps one open)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with psycopg.connect(settings.pg_dsn(HEALTH.database)) as conn:
            if settled(conn, service):
                return
        time.sleep(0.2)
    raise SystemExit(f"{service} did not return to healthy within {timeout:.0f}s")


def one_incident(settings: StackSettings, serde: AvroSerde) -> dict[str, float]:
    """Arrival time of each chain record (seconds, monotonic) and the action time."""
    http("POST", f"{url(SIM)}/reset", {})
    wait_healthy(settings, "checkout-dev")
    consumer = tail_consumer(settings.kafka_bootstrap, ["incidents", "commands"], **{"fetch.wait.max.ms": 5})
    http("POST", f"{url(SIM)}/faults", {"service": "payments-dev", "kind": "dependency-slow"})
    arrived: dict[str, float] = {}
    incident = None
    deadline = time.monotonic() + 120
    try:
        # Until the health agent has verified the recovery: starting the next incident
        # earlier would fail this one's verification and make the executor compensate it
        # while the next command waits.
        while not {"RecoveryCompleted", "RecoveryFailed"} & arrived.keys():
            if time.monotonic() > deadline:
                raise SystemExit(f"incident did not finish within 120 s; saw {sorted(arrived)}")
            msg = consumer.poll(0.05)
            now = time.monotonic()
            if msg is None or msg.error():
                continue
            try:
                envelope = Envelope.from_headers(msg.headers())
                decoded = serde.deserialize(msg.value())
            except (ValueError, SerdeError):
                continue
            name = decoded.record_name.rsplit(".", 1)[-1]
            kind = OPENED_BY.get(name, name)
            if incident is None:
                if kind != "ServiceLatencyIncreased" or decoded.value.get("service") != "checkout-dev":
                    continue
                incident = envelope.correlationid
            if envelope.correlationid != incident or kind in arrived:
                continue
            arrived[kind] = now
            if kind == "RecoveryExecuted":
                arrived["actionSeconds"] = float(decoded.value["actionDurationMs"]) / 1000
    finally:
        consumer.close()
    return arrived


def floor(settings: StackSettings, rounds: int = 200) -> list[float]:
    """PostgreSQL commit + raw Kafka produce→consume, ms, per round."""
    topic = "bench-floor"  # a topic of its own: no service reads it
    admin = AdminClient({"bootstrap.servers": settings.kafka_bootstrap})
    if topic not in admin.list_topics(timeout=10).topics:
        admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])[topic].result(15)
    consumer = tail_consumer(settings.kafka_bootstrap, topic, **{"fetch.wait.max.ms": 5})
    producer = Producer({"bootstrap.servers": settings.kafka_bootstrap, "linger.ms": 0, "acks": "all"})
    results = []
    with psycopg.connect(settings.pg_dsn("flotilla")) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS bench_floor (id text PRIMARY KEY)")
        conn.commit()
        for _ in range(rounds):
            marker = str(uuid.uuid4())
            started = time.perf_counter()
            conn.execute("INSERT INTO bench_floor VALUES (%s)", (marker,))
            conn.commit()
            producer.produce(topic, key=marker, value=b"floor", headers=[("bench_floor", b"1")])
            producer.flush(5)
            while True:
                msg = consumer.poll(1)
                if msg is not None and not msg.error() and msg.key() == marker.encode():
                    break
            results.append((time.perf_counter() - started) * 1000)
    consumer.close()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--incidents", type=int, default=20)
    args = parser.parse_args()
    settings = load_settings()
    serde = AvroSerde(registry_client(settings.schema_registry_url))
    try:
        http("GET", f"{url(SIM)}/healthz")
    except OSError as exc:  # URLError is one
        raise SystemExit(f"the fleet is not answering ({url(SIM)}: {exc}); start it with `make fleet-up`") from None

    runs = [one_incident(settings, serde) for _ in range(args.incidents)]
    http("POST", f"{url(SIM)}/reset", {})
    floor_ms = floor(settings)

    end_to_end = [(r["RecoveryExecuted"] - r["ServiceLatencyIncreased"] - r["actionSeconds"]) * 1000 for r in runs]
    hops: dict[str, list[float]] = defaultdict(list)
    for r in runs:
        for before, after in itertools.pairwise(CHAIN):
            gap = r[after] - r[before] - (r["actionSeconds"] if after == "RecoveryExecuted" else 0)
            hops[f"{before} -> {after}"].append(gap * 1000)
    floor_p50 = statistics.median(floor_ms)
    print(f"{args.incidents} incidents on the auto-authorized path (dev/checkout-dev, scale 2 -> 6)")
    print(
        f"  ServiceLatencyIncreased -> RecoveryExecuted (action time excluded): "
        f"p50 {percentile(end_to_end, 50):.0f} ms  p99 {percentile(end_to_end, 99):.0f} ms"
    )
    print(
        f"  floor (PostgreSQL commit + Kafka produce->consume): "
        f"p50 {floor_p50:.1f} ms  p99 {percentile(floor_ms, 99):.1f} ms"
    )
    print("  per hop (p50 / p99, ms; ratio of p50 to the floor's p50):")
    for name, values in hops.items():
        p50 = percentile(values, 50)
        print(f"    {name:<55} {p50:7.1f} / {percentile(values, 99):7.1f}   {p50 / floor_p50:5.1f}x")
    print(f"  simulated action time taken out: p50 {statistics.median(r['actionSeconds'] for r in runs) * 1000:.0f} ms")


if __name__ == "__main__":
    main()
