"""The DLQ reconciler as a :class:`flotilla.runner.ServiceSpec`.

It consumes ``incidents.dlq`` and ``commands.dlq`` with a raw loop of its own (own
consumer group, ``dlq-reconciler``) instead of the runtime's decoding loop: dead letters
are, by definition, records that loop refuses (see :mod:`.rawrecords`). The raw loop
runs as the service's one periodic task, for as long as the service runs; the spec
declares no topics, so the runner starts no decoding loop. Each batch of letters is
quarantined in one transaction together with its DeadLetterQuarantined facts (outbox),
then the offsets are committed.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from flotilla import RawLoop, ServiceContext, ServiceSpec
from services.dlq_reconciler.api import make_routes
from services.dlq_reconciler.settings import DlqSettings
from services.dlq_reconciler.store import Reconciler

MIGRATIONS = (Path(__file__).with_name("migrations.sql").read_text(),)


def raw_loop(ctx: ServiceContext, settings: DlqSettings, group: str | None = None) -> RawLoop:
    return RawLoop(
        group=group or ctx.spec.name,
        topics=settings.dlq_topics,
        bootstrap=settings.kafka_client(),
        pool=ctx.pool,
        handle=Reconciler(ctx, settings.incidents_topic, settings.origin_topics),
    )


def _consumer(settings: DlqSettings) -> Callable[[ServiceContext], None]:
    def consume_dead_letters(ctx: ServiceContext) -> None:
        raw_loop(ctx, settings).run(ctx.stopping)  # returns when the service stops

    return consume_dead_letters


def build_spec(settings: DlqSettings | None = None) -> ServiceSpec:
    settings = settings or DlqSettings.load()
    return ServiceSpec(
        name=settings.service_name,
        database=settings.service_database,
        topics=(),  # the dead-letter topics are read raw, by the periodic task
        migrations=MIGRATIONS,
        periodic=((0.1, _consumer(settings)),),
        routes=make_routes(settings),
        publishes=True,
        emits=(settings.incidents_topic,),  # its facts; re-queues go straight to Kafka (api.py)
    )
