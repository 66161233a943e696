"""The audit service as a :class:`flotilla.runner.ServiceSpec`.

Why a raw consumer for every topic, not the runtime's decoding loop: an audit log's
unit is the Kafka record (topic, partition, offset), not the business event. The
decoding loop (a) dead-letters undecodable records before any handler runs, so poison
on ``incidents``/``commands`` and every undecodable dead letter on ``*.dlq`` would never
be audited; (b) dedupes by event id, so a re-queued record — which keeps its original
``ce_id`` by design — and any duplicate delivery would be hidden from the log, even when
an operator sanitized (changed) the value; and (c) reacts to records whose hop budget is
spent by emitting LoopTerminated, which a service that publishes nothing must not do.
So the audit runs one raw loop (consumer group ``audit``) over all four topics, decodes
best-effort itself, checks each record's producer signature as the fleet's loops do
(``FLOTILLA_PRODUCER_KEYS``; a record that fails is recorded, marked, and moves nothing),
and records every record exactly once by its coordinates; the spec
declares no decoding-loop topics (``topics=()``) and follows no workflow. Its batches
commit to the database before their offsets, like the runtime's.

It publishes one thing: the chain's signed head, every ``FLOTILLA_AUDIT_ANCHOR_SECONDS``
when it moved, to ``audit.anchors`` through its outbox (:mod:`services.audit.anchors`);
``/verify`` holds the log against those anchors and trusts only the configured keys.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from fastapi import FastAPI

from flotilla import RawLoop, ServiceContext, ServiceSpec, fact_provenance
from flotilla.provenance import Provenance
from services.audit.anchors import ANCHOR_MIGRATION, publisher, read_anchors
from services.audit.api import make_routes
from services.audit.chain import Anchor, Signer
from services.audit.recorder import Recorder
from services.audit.settings import AuditSettings

MIGRATIONS = (Path(__file__).with_name("migrations.sql").read_text(),)


def raw_loop(
    ctx: ServiceContext,
    settings: AuditSettings,
    signer: Signer,
    group: str | None = None,
    producers: Provenance | None = None,
) -> RawLoop:
    """The audit's loop; ``producers`` defaults to the settings' producer keys (fail closed)."""
    return RawLoop(
        group=group or ctx.spec.name,
        topics=settings.audit_topics,
        bootstrap=settings.kafka_client(),
        pool=ctx.pool,
        handle=Recorder(ctx.serde, signer, producers or fact_provenance(settings)),
    )


def _consumer(settings: AuditSettings, signer: Signer, producers: Provenance) -> Callable[[ServiceContext], None]:
    def record_every_topic(ctx: ServiceContext) -> None:
        raw_loop(ctx, settings, signer, producers=producers).run(ctx.stopping)  # returns when the service stops

    return record_every_topic


def build_spec(settings: AuditSettings | None = None, signer: Signer | None = None) -> ServiceSpec:
    settings = settings or AuditSettings.load()
    signer = signer or settings.signer()
    trusted = settings.trusted_keys(signer)
    producers = fact_provenance(settings)  # checked at build time: no producer keys, no audit
    topic = settings.audit_anchors_topic

    def read(ctx: ServiceContext) -> Callable[[], list[Anchor]]:
        return lambda: read_anchors(settings.kafka_client(), topic, ctx.serde)

    def routes(app: FastAPI, ctx: ServiceContext) -> None:
        make_routes(signer, trusted, read(ctx))(app, ctx)

    return ServiceSpec(
        name=settings.service_name,
        database=settings.service_database,
        topics=(),  # every audited topic is read raw, by the periodic task
        migrations=(*MIGRATIONS, ANCHOR_MIGRATION),
        periodic=(
            (0.1, _consumer(settings, signer, producers)),
            (settings.audit_anchor_seconds, publisher(signer, topic)),
        ),
        routes=routes,
        publishes=True,  # its anchors, and nothing else (emits)
        emits=(topic,),
        loop={"follow_workflow": False},
    )
