"""What "normal" latency is, learned from the sim while callers are healthy.

A dependency that answers in 280 ms is only suspect if it normally answers faster; the
sim reports current latencies, not normal ones. So the agent samples them on a timer:
for every caller under its threshold, each dependency's p95 moves an exponentially
weighted average, and the caller's revision is remembered as one it ran healthily.
Samples far above the current baseline (the suspect ratio or more) are not learned —
an anomaly must not become the new normal — and nothing is learned from a degraded
caller.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import psycopg
from flotilla_reasoning.model import Topology

_UPSERT_LATENCY = """
INSERT INTO latency_baselines (service, dependency, p95_ms, samples, updated_at)
VALUES (%(service)s, %(dependency)s, %(p95)s, 1, now())
ON CONFLICT (service, dependency) DO UPDATE SET
    p95_ms = latency_baselines.p95_ms + %(weight)s * (EXCLUDED.p95_ms - latency_baselines.p95_ms),
    samples = latency_baselines.samples + 1,
    updated_at = now()
WHERE EXCLUDED.p95_ms < %(ratio)s * latency_baselines.p95_ms
"""

_UPSERT_REVISION = """
INSERT INTO healthy_revisions (service, revision, updated_at) VALUES (%s, %s, now())
ON CONFLICT (service) DO UPDATE SET revision = EXCLUDED.revision, updated_at = now()
"""


def learn(conn: psycopg.Connection[Any], topology: Topology, *, weight: float, suspect_ratio: float) -> int:
    """Fold one snapshot into the baselines; returns how many samples were offered."""
    offered = 0
    with conn.cursor() as cur:
        for service in topology.services.values():
            if service.degraded:
                continue
            if service.revision:
                cur.execute(_UPSERT_REVISION, (service.name, service.revision))
            for dependency in service.dependencies:
                observed = topology.dependency_p95.get((service.name, dependency))
                if observed is None or observed <= 0:
                    continue
                cur.execute(
                    _UPSERT_LATENCY,
                    {
                        "service": service.name,
                        "dependency": dependency,
                        "p95": observed,
                        "weight": weight,
                        "ratio": suspect_ratio,
                    },
                )
                offered += 1
    return offered


def with_baselines(conn: psycopg.Connection[Any], topology: Topology) -> Topology:
    """The snapshot plus what the agent learned as normal."""
    latency = conn.execute("SELECT service, dependency, p95_ms FROM latency_baselines").fetchall()
    revisions = conn.execute("SELECT service, revision FROM healthy_revisions").fetchall()
    return dataclasses.replace(
        topology,
        baselines={(s, d): float(ms) for s, d, ms in latency},
        healthy_revisions={s: r for s, r in revisions},
    )
