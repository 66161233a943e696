"""What every action target is: the result of an action, the errors a caller acts on, and
the protocol the executor calls.

Targets do the two things the executor relies on *at the target*, not only in its own
database:

- an idempotency key: applying the same key twice has one effect, and the second call
  returns the first result marked ``replayed``; ``lookup`` answers "did this key apply?"
  after a crash between acting and recording;
- a fencing token (the executor's lease epoch for the resource): the target remembers
  the newest token it has seen per resource and refuses a lower one, so an executor
  that was paused while its lease moved on cannot act.

Errors say what the caller may do next: :class:`StaleFencingToken` (stop; a newer
holder owns the resource), :class:`TargetRejected` (this request will never succeed),
:class:`TargetUnavailable` (try again with the *same* key: the action may or may not
have been applied, and a retry or ``lookup`` tells which).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol, runtime_checkable

import httpx


@dataclass(frozen=True)
class ActionResult:
    """What the target did for one idempotency key."""

    idempotency_key: str
    action: str
    resource: str
    status: str  # "applied"
    before: dict[str, Any]
    after: dict[str, Any]
    applied_at: datetime
    replayed: bool  # True: recorded earlier, nothing was done by this call
    duration_ms: int

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> ActionResult:
        """From the sim's wire shape (camelCase), which the Kubernetes target reuses."""
        return cls(
            idempotency_key=str(body["idempotencyKey"]),
            action=str(body["action"]),
            resource=str(body["resource"]),
            status=str(body["status"]),
            before=dict(body["before"]),
            after=dict(body["after"]),
            applied_at=datetime.fromisoformat(str(body["appliedAt"])),
            replayed=bool(body["replayed"]),
            duration_ms=int(body["durationMs"]),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "idempotencyKey": self.idempotency_key,
            "action": self.action,
            "resource": self.resource,
            "status": self.status,
            "before": self.before,
            "after": self.after,
            "appliedAt": self.applied_at.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "replayed": self.replayed,
            "durationMs": self.duration_ms,
        }


class TargetError(Exception):
    retryable = False


class StaleFencingToken(TargetError):
    """The target has seen a newer fencing token for the resource; nothing was applied."""

    def __init__(self, token: int, newest: int) -> None:
        super().__init__(f"fencing token {token} is stale: the target has seen {newest}")
        self.token = token
        self.newest = newest


class TargetRejected(TargetError):
    """The target refused the request as such (unknown resource, bad params, an action it
    cannot do); retrying it unchanged cannot succeed."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class TargetUnavailable(TargetError):
    """The target could not be reached or failed (network, timeout, 5xx, 429). The action
    may have been applied; retry with the same idempotency key or ``lookup`` it."""

    retryable = True


@runtime_checkable
class ActionTarget(Protocol):
    def apply(
        self,
        action: str,
        resource: str,
        params: Mapping[str, Any],
        idempotency_key: str,
        fencing_token: int,
        holder: str,
        expected_change: str | None = None,
    ) -> ActionResult:
        """Apply ``action`` once per key. ``expected_change``: the digest of the change a
        person approved; a target refuses (TargetRejected) when its dry run of the step
        shows another change, and one that cannot dry-run refuses any."""
        ...

    def lookup(self, idempotency_key: str) -> ActionResult | None: ...


def message_of(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text[:200] or response.reason_phrase
    if isinstance(body, dict):
        return str(body.get("error") or body.get("message") or body)
    return str(body)


def failure(response: httpx.Response, what: str) -> TargetError:
    """The exception for a non-2xx answer other than the caller's special cases."""
    message = f"{what}: HTTP {response.status_code}: {message_of(response)}"
    if response.status_code >= 500 or response.status_code in (408, 429):
        return TargetUnavailable(message)
    return TargetRejected(message, response.status_code)


def now_ms() -> datetime:
    """Now, to the millisecond: what the recorded (JSON) result can hold, so a result
    and its replay compare equal."""
    now = datetime.now(UTC)
    return now.replace(microsecond=now.microsecond // 1000 * 1000)
