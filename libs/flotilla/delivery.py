"""How outbox rows reach their topics: at-least-once or exactly-once (FLOTILLA_OUTBOX_DELIVERY).

The choice is the Kafka Connect worker's, and each outbox connector's config must agree
with it; both are derived from here (docs/operations/delivery.md has the figures).
"""

from __future__ import annotations

from typing import Literal, get_args

# How outbox rows reach their topics (FLOTILLA_OUTBOX_DELIVERY, StackSettings.outbox_delivery).
# exactly-once: each poll's rows and the LSN they reach commit in one Kafka transaction
# (KIP-618), so a killed worker re-publishes nothing. at-least-once: rows are produced as
# they come (idempotent producer) and the LSN is committed every offset.flush.interval.ms,
# so a killed worker re-publishes the rows of its last second; every consumer claims each
# event id in the same transaction as its effects, so effects stay exactly once either way.
# Measured (docs/operations/delivery.md): at-least-once saves Connect's transaction on every
# row (8-23 ms a hop; half the CPU per incident in a storm), hence the default.
Delivery = Literal["at-least-once", "exactly-once"]
DELIVERIES: tuple[Delivery, ...] = get_args(Delivery)
DEFAULT_DELIVERY: Delivery = "at-least-once"


def worker_exactly_once_source_support(delivery: Delivery) -> str:
    """The Connect worker's ``exactly.once.source.support`` for ``delivery``. It is the worker
    that decides: every source task of an enabled worker is transactional, and a connector
    that requires exactly-once is refused by a disabled one."""
    if delivery not in DELIVERIES:
        raise ValueError(f"unknown outbox delivery {delivery!r}: one of {', '.join(DELIVERIES)}")
    return "enabled" if delivery == "exactly-once" else "disabled"


def delivery_config(delivery: Delivery) -> dict[str, str]:
    """The connector's part of ``delivery``. Exactly-once is *required*, so that a worker
    without it refuses the connector instead of silently running it at-least-once."""
    if worker_exactly_once_source_support(delivery) == "enabled":
        return {"exactly.once.support": "required", "transaction.boundary": "poll"}
    return {}
