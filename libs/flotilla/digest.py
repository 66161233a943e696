"""Digests that bind an approval to the exact command it approves.

An approver approves *this* command — target, parameters, idempotency key — not "the
proposal". The digest is SHA-256 over a canonical JSON rendering (sorted keys, no
whitespace, timestamps as epoch milliseconds, UUIDs as text), so any service computes
the same digest from the decoded record, whatever its field order.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any


def _canonical(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _canonical(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_canonical(v) for v in value]
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise ValueError("naive datetime in a digested value: timestamps must be timezone-aware")
        return int(value.timestamp() * 1000)
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def canonical_json(value: Any) -> bytes:
    return json.dumps(_canonical(value), sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def command_digest(steps: Sequence[Mapping[str, Any]]) -> str:
    """``sha256:<hex>`` of the exact steps of a proposal (one command is a one-step plan)."""
    return "sha256:" + hashlib.sha256(canonical_json(list(steps))).hexdigest()
