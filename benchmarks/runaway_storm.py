"""The runaway storm: many misconfigured loops at once, each cut by the hop budget.

    make stack-up schemas && .venv/bin/python benchmarks/runaway_storm.py --loops 100

Two handlers answer each other for ever: A turns every DiagnosisRequested on a ping topic
into one on a pong topic, B does the reverse (the seed's "two agents feeding each
other"). ``--loops`` chains are started at once, each with the default hop budget
(``ce_hops`` = 16), each its own incident. Every caused record carries one hop fewer, so
a chain can produce at most 16 records before one arrives with no hops left, is dropped
and is reported once (LoopTerminated). Printed: records per loop (the budget holds when
the maximum is ≤ 16), LoopTerminated reports (one per loop), and how long until the
storm was quiet. Real stack: Kafka, Debezium outboxes, PostgreSQL; both consumers run in
this process, each on its own thread.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import threading
import time
import uuid
from collections import Counter
from typing import Any

import psycopg
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic
from flotilla_ops.samples import sample_value
from psycopg_pool import ConnectionPool

from flotilla.bootstrap import bootstrap_outbox, drop_outbox
from flotilla.consumer import ConsumerLoop, LoopConfig, migrate
from flotilla.contracts import Contract, load_contracts, register
from flotilla.envelope import DEFAULT_HOPS, Envelope
from flotilla.handling import HandlerContext
from flotilla.records import DiagnosisRequested, LoopTerminated
from flotilla.registry import registrar_client
from flotilla.serde import AvroSerde
from flotilla.settings import StackSettings, load_settings

REQUEST = DiagnosisRequested.TYPE


def bouncer(target: str) -> dict[str, Any]:
    def bounce(ctx: HandlerContext) -> None:
        value = {k: v for k, v in ctx.incoming.value.items() if k != "eventId"}
        ctx.emit(DiagnosisRequested.from_value(value), key=ctx.incoming.envelope.correlationid, topic=target)

    return {REQUEST: bounce}


def consumer(settings: StackSettings, serde: AvroSerde, db: str, consume: str, emit: str) -> tuple[ConsumerLoop, Any]:
    pool: ConnectionPool[Any] = ConnectionPool(settings.pg_dsn(db), min_size=1, max_size=2, kwargs={"autocommit": True})
    config = LoopConfig(name=f"storm-{db}", topics=(consume,), source=f"/bench/{db}", follow_workflow=False)
    return ConsumerLoop(config, settings, serde, pool, bouncer(emit)), pool


def emitted(settings: StackSettings, databases: tuple[str, ...]) -> list[tuple[str, str]]:
    """(record type, incident) of every record the two handlers wrote."""
    rows: list[tuple[str, str]] = []
    for db in databases:
        with psycopg.connect(settings.pg_dsn(db)) as conn:
            rows += [(r[0], r[1]) for r in conn.execute("SELECT type, ce_correlationid FROM outbox").fetchall()]
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--loops", type=int, default=100, help="loops started at once (default 100)")
    parser.add_argument("--quiet-seconds", type=float, default=5.0, help="no record for this long: the storm is over")
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)  # not a line per dropped record: the summary counts them
    settings = load_settings()
    registry = registrar_client(settings)  # it registers: the registrar
    serde = AvroSerde(registry)
    suffix = uuid.uuid4().hex[:6]
    ping, pong = f"storm-ping-{suffix}", f"storm-pong-{suffix}"
    databases = (f"flotilla_storm_ping_{suffix}", f"flotilla_storm_pong_{suffix}")
    admin = AdminClient(settings.kafka_client())
    topics = (ping, pong, f"{ping}.dlq", f"{pong}.dlq")
    for future in admin.create_topics([NewTopic(t, 3, 1) for t in topics]).values():
        future.result(15)
    schema = next(c.schema for c in load_contracts() if c.full_name == REQUEST)
    for topic in (ping, pong):
        register(registry, Contract(topic, schema))
    for db in databases:
        bootstrap_outbox(settings, db)
        with psycopg.connect(settings.pg_dsn(db), autocommit=True) as conn:
            migrate(conn)
    loops = [consumer(settings, serde, databases[0], ping, pong), consumer(settings, serde, databases[1], pong, ping)]
    try:
        from confluent_kafka import Producer

        producer = Producer({**settings.kafka_client(), "enable.idempotence": True})
        incidents = [f"incident-storm-{suffix}-{n}" for n in range(args.loops)]
        started = time.monotonic()
        for incident in incidents:
            first = sample_value(schema, incidentId=incident)
            envelope = Envelope(type=REQUEST, source="/bench", correlationid=incident, id=first["eventId"])
            headers: list[tuple[str, str | bytes | None]] = list(envelope.headers())
            producer.produce(ping, key=incident, value=serde.serialize(ping, REQUEST, first), headers=headers)
        assert producer.flush(30) == 0
        last_record = [time.monotonic()]
        stop = threading.Event()

        def run(loop: ConsumerLoop) -> None:
            while not stop.is_set():
                if loop.poll_once():
                    last_record[0] = time.monotonic()

        threads = [threading.Thread(target=run, args=(loop,), daemon=True) for loop, _ in loops]
        for thread in threads:
            thread.start()
        while time.monotonic() - last_record[0] < args.quiet_seconds:
            time.sleep(0.5)
        stop.set()
        for thread in threads:
            thread.join(30)
        quiet_after = last_record[0] - started
        rows = emitted(settings, databases)
    finally:
        for _, pool in loops:
            pool.close()
        for db in databases:
            drop_outbox(settings, db)
        admin.delete_topics(list(topics))
    bounced = Counter(incident for kind, incident in rows if kind == REQUEST)
    reports = Counter(incident for kind, incident in rows if kind == LoopTerminated.TYPE)
    # What each loop produced: every record its two handlers emitted (the seed that started
    # it came from outside). The last one arrives with no hops left and is only reported.
    per_loop = [bounced.get(i, 0) for i in incidents]
    verdict = "held" if max(per_loop) <= DEFAULT_HOPS else "BROKEN"
    print(f"runaway storm: {args.loops} loops at once, each seeded with ce_hops={DEFAULT_HOPS}")
    print(
        f"  records produced per loop: max {max(per_loop)}, min {min(per_loop)}, "
        f"mean {statistics.mean(per_loop):.1f} (budget {DEFAULT_HOPS}: {verdict})"
    )
    twice = sum(1 for n in reports.values() if n > 1)
    print(
        f"  records in all: {sum(per_loop)} (+{args.loops} seeds); LoopTerminated: {sum(reports.values())} "
        f"({len(reports)} loops reported, {twice} more than once)"
    )
    total = sum(per_loop) + args.loops
    print(
        f"  quiet {quiet_after:.1f} s after the first seed ({total / quiet_after:.0f} records/s through two outboxes)"
    )


if __name__ == "__main__":
    main()
