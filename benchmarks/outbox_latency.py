"""Outbox-commit → consumer latency on the real stack.

Each row is committed in its own transaction (with a state change, as a service
would), then the script waits until a consumer receives it before committing the next,
so the figure is the latency of one hop with no queueing: PostgreSQL commit → WAL →
Debezium → Connect's producer → broker → consumer. Prints p50/p90/p99/max.

Committing right after the previous row arrived catches Debezium's stream reader awake
(it sleeps ``poll.interval.ms`` only once the WAL ran dry), which flatters the median;
``--pause-ms N`` waits a random 0..N ms before each commit, as unrelated incidents would.

    make bench-outbox            # or: .venv/bin/python benchmarks/outbox_latency.py --rows 1000
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
import uuid
from typing import Any

import psycopg
from flotilla_ops.samples import latency_fact

from flotilla.bootstrap import bootstrap_outbox, drop_outbox
from flotilla.contracts import register_all
from flotilla.envelope import Envelope
from flotilla.outbox import Outbox
from flotilla.records import ServiceLatencyIncreased
from flotilla.registry import registrar_client
from flotilla.serde import AvroSerde
from flotilla.settings import StackSettings, load_settings
from flotilla.tailing import header, tail_consumer

DB = "flotilla_bench"


def percentile(sorted_ms: list[float], p: float) -> float:
    index = min(len(sorted_ms) - 1, max(0, round(p / 100 * len(sorted_ms)) - 1))
    return sorted_ms[index]


def prepare_state(conn: psycopg.Connection[Any]) -> None:
    """The table each benchmark row changes beside its outbox row, as a service would."""
    conn.execute("CREATE TABLE IF NOT EXISTS bench_state (incident_id text PRIMARY KEY, seen int NOT NULL)")
    conn.commit()


def commit_fact(conn: psycopg.Connection[Any], outbox: Outbox, seq: int, *, route_to: str | None = None) -> Envelope:
    """One latency fact about a new incident, with its state change, committed on its own
    (after a pause the caller chose). ``route_to``: publish it on that topic instead of
    ``incidents``, encoded as the ``incidents`` contract (a topic no service reads)."""
    incident = f"incident-bench-{uuid.uuid4().hex[:8]}"
    value, env = latency_fact(incident, source="/flotilla/bench")
    conn.execute("INSERT INTO bench_state VALUES (%s, %s)", (incident, seq))
    row = outbox.row(ServiceLatencyIncreased.from_value(value), env, key=incident)
    Outbox.insert(conn, [row if route_to is None else (row[0], route_to, *row[2:])])
    conn.commit()
    return env


def _measure(settings: StackSettings, outbox: Outbox, *, rows: int, warmup: int, pause_ms: float) -> list[float]:
    """Milliseconds from each row's commit to its record at a consumer, warm-up excluded."""
    consumer = tail_consumer(settings.kafka_bootstrap, "incidents", **{"fetch.wait.max.ms": 5})
    latencies: list[float] = []
    with psycopg.connect(settings.pg_dsn(DB)) as conn:
        prepare_state(conn)
        for i in range(warmup + rows):
            time.sleep(random.uniform(0, pause_ms) / 1000)
            env = commit_fact(conn, outbox, i)
            committed = time.perf_counter()
            want = env.id.encode()
            deadline = committed + 30
            while True:
                msg = consumer.poll(0.05)
                now = time.perf_counter()
                if msg is not None and not msg.error() and header(msg.headers(), "ce_id") == want:
                    break
                if now > deadline:
                    raise SystemExit(f"row {i} not received within 30 s")
            if i >= warmup:
                latencies.append((now - committed) * 1000)
    consumer.close()
    return latencies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1000)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--pause-ms", type=float, default=0.0, help="random pause before each commit (default 0)")
    args = parser.parse_args()

    settings = load_settings()
    client = registrar_client(settings)  # it registers: the registrar
    register_all(client)
    serde = AvroSerde(client)
    outbox = Outbox(serde)
    bootstrap_outbox(settings, DB)
    try:
        latencies = _measure(settings, outbox, rows=args.rows, warmup=args.warmup, pause_ms=args.pause_ms)
    finally:
        drop_outbox(settings, DB)  # an idle connector costs ~3 % of a core (docs/operations/observability.md)
    latencies.sort()
    paused = f", a random 0-{args.pause_ms:.0f} ms pause before each" if args.pause_ms else ""
    print(f"outbox-commit -> consumer latency over {len(latencies)} rows (after {args.warmup} warm-up rows{paused})")
    print(
        f"  p50 {percentile(latencies, 50):.1f} ms   p90 {percentile(latencies, 90):.1f} ms   "
        f"p99 {percentile(latencies, 99):.1f} ms   max {latencies[-1]:.1f} ms   "
        f"mean {statistics.fmean(latencies):.1f} ms"
    )


if __name__ == "__main__":
    main()
