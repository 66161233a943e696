"""Digests that bind an approval to the exact command it approves.

An approver approves *this* command — target, parameters, idempotency key — not "the
proposal". The digest is SHA-256 over a canonical JSON rendering (sorted keys, no
whitespace, timestamps as epoch milliseconds, UUIDs as text), so any service computes
the same digest from the decoded record, whatever its field order.

A step's ``authorization`` (the policy service's signature, added when it issues the
command) is never part of a digest: the digest is what gets approved and signed, so it
must be the same before and after.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

AUTHORIZATION_FIELD = "authorization"
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MILLISECOND = timedelta(milliseconds=1)


def _canonical(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _canonical(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_canonical(v) for v in value]
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise ValueError("naive datetime in a digested value: timestamps must be timezone-aware")
        return (value - _EPOCH) // _MILLISECOND  # exact: float seconds would turn 123 ms into 122
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def canonical_json(value: Any) -> bytes:
    return json.dumps(_canonical(value), sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def without_authorization(step: Mapping[str, Any]) -> dict[str, Any]:
    """The step as proposed and approved: every field but the policy's signature."""
    return {k: v for k, v in step.items() if k != AUTHORIZATION_FIELD}


def command_digest(steps: Sequence[Mapping[str, Any]]) -> str:
    """``sha256:<hex>`` of the exact steps of a proposal (one command is a one-step plan)."""
    return "sha256:" + hashlib.sha256(canonical_json([without_authorization(s) for s in steps])).hexdigest()


def step_digest(step: Mapping[str, Any]) -> str:
    """``sha256:<hex>`` of one step (a command record) alone: what its authorization signs."""
    return "sha256:" + hashlib.sha256(canonical_json(without_authorization(step))).hexdigest()
