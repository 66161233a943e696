"""A consumer loop with test handlers, run in-process or as a subprocess.

    python -m tests.integration.loop_worker --topic T --database D --group G [--crash-after-commit]

The handler for ServiceLatencyIncreased writes one row into ``effects`` per call (no
unique constraint: a duplicate effect would show as a second row) and emits a
DiagnosisRequested caused by the incoming record. Services named ``always-fails`` make
the handler raise; a negative p95 breaks a business rule.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

from flotilla_ops.samples import sample_value
from psycopg_pool import ConnectionPool

from flotilla.consumer import ConsumerLoop, LoopConfig
from flotilla.contracts import load_contracts
from flotilla.handling import BusinessRuleViolation, HandlerContext
from flotilla.records import BY_TYPE
from flotilla.registry import registry_client
from flotilla.serde import AvroSerde
from flotilla.settings import StackSettings, load_settings
from flotilla.workflow import Budgets

LATENCY = "dev.flotilla.incidents.ServiceLatencyIncreased"
DIAGNOSIS_REQUESTED = "dev.flotilla.incidents.DiagnosisRequested"
EFFECTS_DDL = (
    "CREATE TABLE IF NOT EXISTS effects (consumer text, event_id text, incident_id text, at timestamptz DEFAULT now())"
)


def _schema(full_name: str) -> dict[str, Any]:
    return next(c.schema for c in load_contracts() if c.full_name == full_name)


def make_handlers(handler_sleep: float = 0.0) -> dict[str, Any]:
    diagnosis_schema = _schema(DIAGNOSIS_REQUESTED)

    def on_latency(ctx: HandlerContext) -> None:
        value = ctx.incoming.value
        if value["p95LatencyMs"] < 0:
            raise BusinessRuleViolation(f"p95LatencyMs must not be negative, got {value['p95LatencyMs']}")
        if value["service"] == "always-fails":
            raise RuntimeError("the metrics backend is down")
        if handler_sleep:
            time.sleep(handler_sleep)
        ctx.conn.execute(
            "INSERT INTO effects (consumer, event_id, incident_id) VALUES (%s, %s, %s)",
            ("loop-worker", ctx.incoming.envelope.id, value["incidentId"]),
        )
        request = sample_value(diagnosis_schema, incidentId=value["incidentId"])
        request.pop("eventId", None)
        ctx.emit(BY_TYPE[DIAGNOSIS_REQUESTED].from_value(request), key=value["incidentId"])

    return {LATENCY: on_latency}


def build_loop(
    settings: StackSettings,
    *,
    topic: str,
    database: str,
    group: str,
    batch_size: int = 100,
    handler_sleep: float = 0.0,
    budgets: Budgets | None = None,
    crash_after_commit: bool = False,
    batch_transactions: bool = True,
    needs: frozenset[str] | None = None,
) -> tuple[ConsumerLoop, ConnectionPool[Any]]:
    serde = AvroSerde(registry_client(settings.schema_registry_url))
    pool: ConnectionPool[Any] = ConnectionPool(
        settings.pg_dsn(database), min_size=1, max_size=2, kwargs={"autocommit": True}, open=True
    )
    with pool.connection() as conn:
        conn.execute(EFFECTS_DDL)
    config = LoopConfig(
        name=group,
        topics=(topic,),
        contract_topics={topic: "incidents"},
        source="/flotilla/tests/loop-worker",
        batch_size=batch_size,
        budgets=budgets,
        backoff_initial=0.01,
        batch_transactions=batch_transactions,
        needs=needs,
        # A crashed member holds its partitions until its session expires; keep that
        # short so the restarted consumer gets them back quickly (6 s is the broker minimum).
        kafka={"session.timeout.ms": 6000, "heartbeat.interval.ms": 1000},
    )

    def crash(_: object) -> None:
        os._exit(17)  # after the database commit, before the offset commit

    loop = ConsumerLoop(
        config, settings, serde, pool, make_handlers(handler_sleep), on_committed=crash if crash_after_commit else None
    )
    return loop, pool


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--topic", required=True)
    parser.add_argument("--database", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--batch-size", type=int, default=100)
    parser.add_argument("--handler-sleep", type=float, default=0.0)
    parser.add_argument("--crash-after-commit", action="store_true")
    args = parser.parse_args()
    loop, pool = build_loop(
        load_settings(),
        topic=args.topic,
        database=args.database,
        group=args.group,
        batch_size=args.batch_size,
        handler_sleep=args.handler_sleep,
        crash_after_commit=args.crash_after_commit,
    )
    loop.install_signal_handlers()
    print("ready", flush=True)
    try:
        loop.run()
    finally:
        pool.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
