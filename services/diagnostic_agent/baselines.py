"""What "normal" latency is, learned from the estate's evidence while callers are healthy.

A dependency that answers in 280 ms is only suspect if it normally answers faster; the
evidence reports current latencies, not normal ones. So the agent samples them on a timer:
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

# One statement per sample made a baseline tick over a 400-service estate ~1,400 round
# trips every 5 s; the samples go as arrays instead. A topology names each (service,
# dependency) once, so no row is touched twice by one statement.
_UPSERT_LATENCY = """
INSERT INTO latency_baselines (service, dependency, p95_ms, samples, updated_at)
SELECT s.service, s.dependency, s.p95, 1, now()
FROM unnest(%(services)s::text[], %(dependencies)s::text[], %(p95)s::float8[]) AS s(service, dependency, p95)
ON CONFLICT (service, dependency) DO UPDATE SET
    p95_ms = latency_baselines.p95_ms + %(weight)s * (EXCLUDED.p95_ms - latency_baselines.p95_ms),
    samples = latency_baselines.samples + 1,
    updated_at = now()
WHERE EXCLUDED.p95_ms < %(ratio)s * latency_baselines.p95_ms
"""

_UPSERT_REVISION = """
INSERT INTO healthy_revisions (service, revision, updated_at)
SELECT s.service, s.revision, now() FROM unnest(%s::text[], %s::text[]) AS s(service, revision)
ON CONFLICT (service) DO UPDATE SET revision = EXCLUDED.revision, updated_at = now()
"""


def learn(conn: psycopg.Connection[Any], topology: Topology, *, weight: float, suspect_ratio: float) -> int:
    """Fold one snapshot into the baselines; returns how many samples were offered."""
    samples: dict[tuple[str, str], float] = {}
    revisions: dict[str, str] = {}
    for service in topology.services.values():
        if service.degraded:
            continue
        if service.revision:
            revisions[service.name] = service.revision
        for dependency in service.dependencies:
            observed = topology.dependency_p95.get((service.name, dependency))
            if observed is not None and observed > 0:
                samples[(service.name, dependency)] = observed
    if revisions:
        conn.execute(_UPSERT_REVISION, (list(revisions), list(revisions.values())))
    if samples:
        conn.execute(
            _UPSERT_LATENCY,
            {
                "services": [s for s, _ in samples],
                "dependencies": [d for _, d in samples],
                "p95": list(samples.values()),
                "weight": weight,
                "ratio": suspect_ratio,
            },
        )
    return len(samples)


def with_baselines(conn: psycopg.Connection[Any], topology: Topology) -> Topology:
    """The snapshot plus what the agent learned as normal about its services."""
    names = list(topology.services)
    latency = conn.execute(
        "SELECT service, dependency, p95_ms FROM latency_baselines WHERE service = ANY(%s)", (names,)
    ).fetchall()
    revisions = conn.execute(
        "SELECT service, revision FROM healthy_revisions WHERE service = ANY(%s)", (names,)
    ).fetchall()
    return dataclasses.replace(
        topology,
        baselines={(s, d): float(ms) for s, d, ms in latency},
        healthy_revisions={s: r for s, r in revisions},
    )
