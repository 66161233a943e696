"""Per-resource leases whose epoch is the fencing token.

A lease row names a resource (``<environment>/<name>``), its holder, when it expires,
and an *epoch* that only ever grows. Every acquisition bumps the epoch, and the new
epoch travels with every mutation sent to the target; the target refuses a mutation
carrying an epoch older than the newest it has seen. So an executor that was paused
(GC, SIGSTOP, a partition) while its lease expired and someone else took over cannot
act on the resource any more, even though it still believes it holds the lease.

The same epoch guards the executor's own rows: :func:`renew` and :func:`release` update
``WHERE resource = %s AND epoch = %s`` and raise :class:`LeaseLost` when no row matches,
so the paused executor cannot *record* anything either. The executor releases in the
transaction that records the outcome: the UPDATE locks the lease row until that
transaction ends, which orders a takeover strictly after (or before) the recording, so
there is no window in which both could succeed.

Expiry is judged by the database clock (``now()``), never by executor clocks, so two
executors on machines with skewed clocks agree on whether a lease is free.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

import psycopg
from prometheus_client import Counter

T = TypeVar("T")


class LeaseUnavailable(Exception):
    """Another holder's lease on the resource is live; it did not expire in time."""


class LeaseLost(Exception):
    """Our epoch is no longer the resource's current one: a newer holder took over."""


# by="executor": one of our own fenced writes found a newer epoch (LeaseLost, raised through
# fenced_out); by="target": the target refused our fencing token (services.executor.execution).
FENCING_REJECTIONS = Counter(
    "flotilla_executor_fencing_rejections_total",
    "Writes refused because a newer lease epoch exists, by who refused (executor, target).",
    ["by"],
)


def fenced_out(message: str) -> LeaseLost:
    """A LeaseLost for a fenced write of ours that matched no row, counted."""
    FENCING_REJECTIONS.labels("executor").inc()
    return LeaseLost(message)


@dataclass(frozen=True)
class Lease:
    resource: str
    holder: str
    epoch: int
    expires_at: datetime


_ACQUIRE = """
INSERT INTO leases AS l (resource, holder, epoch, expires_at, acquired_at)
VALUES (%(resource)s, %(holder)s, 1, now() + make_interval(secs => %(ttl)s), now())
ON CONFLICT (resource) DO UPDATE
    SET holder = EXCLUDED.holder, epoch = l.epoch + 1, expires_at = EXCLUDED.expires_at, acquired_at = now()
    WHERE l.expires_at <= now() OR l.holder = EXCLUDED.holder
RETURNING resource, holder, epoch, expires_at
"""

_RENEW = """
UPDATE leases SET expires_at = now() + make_interval(secs => %s)
WHERE resource = %s AND epoch = %s
RETURNING resource, holder, epoch, expires_at
"""

# A released lease keeps its holder and epoch (the epoch never goes back); it is merely
# expired at once, so the next acquirer need not wait.
_RELEASE = """
UPDATE leases SET expires_at = least(expires_at, now())
WHERE resource = %s AND epoch = %s
RETURNING resource
"""

# Our lease, held again by its row lock in the transaction that released it. SKIP LOCKED
# passes over a row another transaction has locked (it is not ours to hold this way) but
# not over a row our own transaction locked.
_RELOCK = """
SELECT resource, holder, epoch, expires_at FROM leases
WHERE resource = %s AND epoch = %s AND holder = %s
FOR UPDATE SKIP LOCKED
"""

_CURRENT = "SELECT resource, holder, epoch, expires_at FROM leases WHERE resource = %s"


def _lease(row: tuple[Any, ...] | None) -> Lease | None:
    return None if row is None else Lease(resource=row[0], holder=row[1], epoch=int(row[2]), expires_at=row[3])


def acquire(conn: psycopg.Connection[Any], resource: str, holder: str, ttl_seconds: float) -> Lease | None:
    """Take the lease with a new epoch if it is free, expired, or already ours; else None.

    Run it in a transaction that commits before the epoch is used: an epoch handed to
    the target must never be handed out again, and a rolled-back bump would be.
    """
    row = conn.execute(_ACQUIRE, {"resource": resource, "holder": holder, "ttl": ttl_seconds}).fetchone()
    return _lease(row)


def renew(conn: psycopg.Connection[Any], lease: Lease, ttl_seconds: float) -> Lease:
    """Extend our lease (same epoch); raises LeaseLost if a newer holder took over."""
    row = conn.execute(_RENEW, (ttl_seconds, lease.resource, lease.epoch)).fetchone()
    renewed = _lease(row)
    if renewed is None:
        raise fenced_out(f"lease on {lease.resource} at epoch {lease.epoch} was taken over")
    return renewed


def release(conn: psycopg.Connection[Any], lease: Lease) -> None:
    """Let the lease go (fenced: raises LeaseLost if it is no longer ours). The row stays
    locked until the caller's transaction ends."""
    if conn.execute(_RELEASE, (lease.resource, lease.epoch)).fetchone() is None:
        raise fenced_out(f"lease on {lease.resource} at epoch {lease.epoch} was taken over")


def relock(conn: psycopg.Connection[Any], lease: Lease) -> Lease | None:
    """``lease`` held again, in the transaction that released it, by the row lock that
    release took; None if another transaction holds the row or a newer epoch exists.

    Why this is as good as a committed lease: a takeover must update the row, so it waits
    for this transaction to end; and the epoch was committed when it was first acquired,
    so it is still the newest one the target has been shown. The same epoch fences every
    command run under it. A short transaction cannot renew the row meanwhile (it would
    wait on this one), which is why the executor's sessions come here first.
    """
    return _lease(conn.execute(_RELOCK, (lease.resource, lease.epoch, lease.holder)).fetchone())


def current(conn: psycopg.Connection[Any], resource: str) -> Lease | None:
    """The resource's lease row as it stands (held or not)."""
    return _lease(conn.execute(_CURRENT, (resource,)).fetchone())


def wait_for(
    attempt: Callable[[], T | None],
    *,
    wait_seconds: float,
    poll_seconds: float = 0.25,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> T | None:
    """Call ``attempt`` (an acquisition) until it yields something or ``wait_seconds`` passed.

    A live lease held by someone else is normally a crashed or paused executor's; it
    expires within the TTL, so waiting a little longer than that lets the command run
    instead of failing, while the wait stays bounded (a partition is never blocked long).
    """
    deadline = clock() + wait_seconds
    while True:
        got = attempt()
        if got is not None:
            return got
        remaining = deadline - clock()
        if remaining <= 0:
            return None
        sleep(min(poll_seconds, remaining))
