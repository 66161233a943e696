"""Where one hop's time goes: each stage from an outbox commit to the consumer's commit.

    make bench-hops        # or: .venv/bin/python benchmarks/hop_stages.py --rows 300

One hop, as every service makes it, on the real stack: a row is committed to an outbox
(with a state change, in its own transaction), Debezium reads it from the WAL, Kafka
Connect produces it (as the stack delivers: FLOTILLA_OUTBOX_DELIVERY) to a topic of the benchmark's own, and
a ``ConsumerLoop`` (the library's, default settings, the workflow gate on) fetches it,
claims it, runs a handler that writes one row, and commits. Rows go one at a time (the
next only after the previous hop committed), so no stage queues behind another. Each row
is timestamped at every stage it passes, on this machine's clock:

    commit       INSERT + COMMIT of the outbox row, from the client
    wal read     Debezium read the row from the WAL: the record's timestamp, which the
                 outbox router takes from Debezium's event (its processing time, ms)
    appended     a read_uncommitted consumer has it: Connect's producer sent it and the
                 broker appended it (with exactly-once delivery, its transaction still open)
    visible      a read_committed consumer has it: with exactly-once delivery, Connect's
                 transaction committed; at-least-once, at once
    fetched      the service's consumer loop got it from poll()
    handled      decoded, claimed, through the workflow gate, its handler returned
    committed    the loop's database transaction committed (before its offsets are stored)

Both tail consumers fetch with ``fetch.wait.max.ms`` 1; the loop with the service default.
Prints p50 / p99 per stage and for the whole hop, beside the floor measured in the same
run (one PostgreSQL commit + one raw Kafka produce → consume, benchmarks/incident_latency.py).
Run it on the stack alone (``make stack-up``; the fleet need not run: nothing reads the
benchmark's topic but the benchmark).
"""

from __future__ import annotations

import argparse
import random
import statistics
import threading
import time
import uuid
from collections import defaultdict
from typing import Any

import psycopg
from confluent_kafka import TIMESTAMP_CREATE_TIME, Message
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic
from incident_latency import floor, percentile
from outbox_latency import commit_fact, prepare_state
from psycopg_pool import ConnectionPool

from flotilla import migrate
from flotilla.bootstrap import bootstrap_outbox, drop_outbox, ensure_database
from flotilla.consumer import ConsumerLoop, LoopConfig
from flotilla.contracts import register_all
from flotilla.handling import HandlerContext
from flotilla.outbox import Outbox
from flotilla.records import ServiceLatencyIncreased
from flotilla.registry import registrar_client
from flotilla.serde import AvroSerde
from flotilla.settings import StackSettings, load_settings
from flotilla.tailing import header, tail_consumer

SOURCE_DB = "flotilla_bench_hop_source"
SINK_DB = "flotilla_bench_hop_sink"
STAGES = ["commit", "wal read", "appended", "visible", "fetched", "handled", "committed"]


class Stamps:
    """Wall-clock seconds at which each row (by event id) reached each stage."""

    def __init__(self) -> None:
        self._at: dict[str, dict[str, float]] = defaultdict(dict)
        self._lock = threading.Lock()
        self.committed = threading.Condition(self._lock)

    def mark(self, event_id: str, stage: str, at: float | None = None) -> None:
        with self._lock:
            self._at[event_id].setdefault(stage, time.time() if at is None else at)
            if stage == "committed":
                self.committed.notify_all()

    def of(self, event_id: str) -> dict[str, float]:
        with self._lock:
            return dict(self._at.get(event_id, {}))

    def wait_committed(self, event_id: str, timeout: float) -> bool:
        with self._lock:
            return self.committed.wait_for(lambda: "committed" in self._at.get(event_id, {}), timeout)


class TimedLoop(ConsumerLoop):
    """The library's loop, stamping when a batch reaches it (the rest of it unchanged)."""

    stamps: Stamps

    def process(self, msgs: list[Message]) -> None:
        now = time.time()
        for msg in msgs:
            self.stamps.mark(event_id(msg), "fetched", now)
        super().process(msgs)


def event_id(msg: Message) -> str:
    return (header(msg.headers(), "ce_id") or b"").decode()


def tail(
    settings: StackSettings, topic: str, isolation: str, stage: str, stamps: Stamps, stop: threading.Event
) -> None:
    overrides: dict[str, str | int | bool] = {"fetch.wait.max.ms": 1, "isolation.level": isolation}
    consumer = tail_consumer(settings.kafka_bootstrap, topic, **overrides)
    try:
        while not stop.is_set():
            msg = consumer.poll(0.1)
            if msg is None or msg.error():
                continue
            now = time.time()
            stamps.mark(event_id(msg), stage, now)
            kind, created_ms = msg.timestamp()
            if stage == "visible" and kind == TIMESTAMP_CREATE_TIME:
                stamps.mark(event_id(msg), "wal read", created_ms / 1000)
    finally:
        consumer.close()


def build_loop(settings: StackSettings, serde: AvroSerde, topic: str, stamps: Stamps) -> tuple[TimedLoop, Any]:
    ensure_database(settings, SINK_DB)
    with psycopg.connect(settings.pg_dsn(SINK_DB), autocommit=True) as conn:
        migrate(conn)
        conn.execute("CREATE TABLE IF NOT EXISTS bench_effects (event_id text PRIMARY KEY, incident_id text)")
    pool: ConnectionPool[Any] = ConnectionPool(
        settings.pg_dsn(SINK_DB), min_size=1, max_size=2, kwargs={"autocommit": True}, open=True
    )

    def handle(ctx: HandlerContext) -> None:
        incoming = ctx.incoming
        ctx.conn.execute(
            "INSERT INTO bench_effects VALUES (%s, %s)", (incoming.envelope.id, incoming.envelope.correlationid)
        )
        stamps.mark(incoming.envelope.id, "handled")

    def committed(msgs: list[Message]) -> None:
        now = time.time()
        for msg in msgs:
            stamps.mark(event_id(msg), "committed", now)

    config = LoopConfig(
        name=f"bench-hops-{uuid.uuid4().hex[:8]}",
        topics=(topic,),
        contract_topics={topic: "incidents"},
        source="/flotilla/bench-hops",
    )
    loop = TimedLoop(config, settings, serde, pool, {ServiceLatencyIncreased.TYPE: handle}, on_committed=committed)
    loop.stamps = stamps
    return loop, pool


def measure(settings: StackSettings, *, rows: int, warmup: int, pause_ms: float) -> tuple[list[dict[str, float]], int]:
    client = registrar_client(settings)
    register_all(client)
    serde = AvroSerde(client)
    outbox = Outbox(serde)
    topic = f"bench-hops-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": settings.kafka_bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])[topic].result(15)
    stamps, stop = Stamps(), threading.Event()
    loop, pool = build_loop(settings, serde, topic, stamps)
    threads = [
        threading.Thread(target=tail, args=(settings, topic, iso, stage, stamps, stop), daemon=True)
        for iso, stage in (("read_uncommitted", "appended"), ("read_committed", "visible"))
    ]
    threads.append(threading.Thread(target=loop.run, daemon=True))
    bootstrap_outbox(settings, SOURCE_DB)
    results, lost = [], 0
    try:
        for thread in threads:
            thread.start()
        time.sleep(3)  # the consumers joined their partitions
        with psycopg.connect(settings.pg_dsn(SOURCE_DB)) as conn:
            prepare_state(conn)
            for i in range(warmup + rows):
                time.sleep(random.uniform(0, pause_ms) / 1000)
                began = time.time()
                env = commit_fact(conn, outbox, i, route_to=topic)  # to the benchmark's own topic
                stamps.mark(env.id, "commit")
                if not stamps.wait_committed(env.id, 30):
                    lost += 1
                    continue
                time.sleep(0.05)  # the tail consumers have it too (they are faster than the loop)
                if i >= warmup:
                    results.append({"began": began, **stamps.of(env.id)})
    finally:
        stop.set()
        loop.stop()
        for thread in threads:
            thread.join(10)
        pool.close()
        drop_outbox(settings, SOURCE_DB)
        admin.delete_topics([topic])
    return results, lost


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--pause-ms", type=float, default=200.0, help="random pause before each row (default 200)")
    args = parser.parse_args()
    settings = load_settings()
    results, lost = measure(settings, rows=args.rows, warmup=args.warmup, pause_ms=args.pause_ms)
    complete = [r for r in results if all(s in r for s in STAGES)]
    floor_ms = sorted(floor(settings))
    print(
        f"one hop, {len(complete)} rows one at a time (after {args.warmup} warm-up rows; a random "
        f"0-{args.pause_ms:.0f} ms pause before each){f'; {lost} not committed within 30 s' if lost else ''}; "
        f"outbox delivery {settings.outbox_delivery}"
    )
    print(f"  {'stage':<36} {'p50 ms':>8} {'p99 ms':>8} {'mean ms':>8}")
    previous = "began"
    for stage in STAGES:
        gaps = [(r[stage] - r[previous]) * 1000 for r in complete]
        row(f"{previous} -> {stage}" if previous != "began" else "outbox INSERT + COMMIT", gaps)
        previous = stage
    hop = [(r["committed"] - r["commit"]) * 1000 for r in complete]
    row("commit -> committed (the hop)", hop)
    floor_p50, hop_p50 = percentile(floor_ms, 50), percentile(hop, 50)
    print(
        f"  floor (PostgreSQL commit + Kafka produce->consume): p50 {floor_p50:.1f}, p99 {percentile(floor_ms, 99):.1f}"
    )
    print(f"  the hop's p50 is {hop_p50 / floor_p50:.1f}x the floor's")


def row(name: str, gaps: list[float]) -> None:
    print(f"  {name:<36} {percentile(gaps, 50):8.1f} {percentile(gaps, 99):8.1f} {statistics.fmean(gaps):8.1f}")


if __name__ == "__main__":
    main()
