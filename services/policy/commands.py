"""The steps of a proposal as commands: which kind each is, where it goes, what it says.

A ``RecoveryProposed`` carries its steps as an Avro union of the command records.
Decoded, a step is a plain mapping without its record name, so the kind is read off the
fields that only that command has (each kind's in :mod:`flotilla.actions`). Stored, a
step is kept in the canonical form the digest is computed over (timestamps as epoch
milliseconds, UUIDs as text): hashing the stored steps again gives the proposal's
digest, and the command records issued after an approval are exactly those bytes'
source, not a re-creation.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from flotilla import actions
from flotilla.commands import COMMON_FIELDS
from flotilla.digest import canonical_json

# Each kind's own fields, from the one definition of the commands.
KIND_FIELDS: dict[str, frozenset[str]] = {spec.kind: frozenset(spec.fields) for spec in actions.SPECS}


class MalformedStep(ValueError):
    """A step that is none of the known commands (or more than one)."""


def command_kind(step: Mapping[str, Any]) -> str:
    """``ScaleService`` etc.: the one command whose fields ``step`` has: all its required
    ones, and nothing but its own (a field with a default may be absent from a step
    stored before the field existed)."""
    fields = set(step)
    matches = [
        spec.kind
        for spec in actions.SPECS
        if COMMON_FIELDS | spec.required <= fields <= COMMON_FIELDS | set(spec.fields)
    ]
    if len(matches) != 1:
        raise MalformedStep(f"step fields {sorted(fields)} match no single command kind")
    return matches[0]


def canonical_step(step: Mapping[str, Any]) -> dict[str, Any]:
    """The step as the digest sees it: JSON-safe, timestamps in epoch milliseconds."""
    value = json.loads(canonical_json(step))
    assert isinstance(value, dict)
    return value


def epoch_ms(value: datetime | int) -> int:
    """Epoch milliseconds of a decoded timestamp or an already canonical one."""
    if isinstance(value, datetime):
        return int(canonical_json(value))
    return int(value)


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
TIMESTAMP_FIELDS = ("issuedAt", "expiresAt")


def from_epoch_ms(ms: int) -> datetime:
    """Exact: integer arithmetic, no float seconds in between."""
    return _EPOCH + timedelta(milliseconds=ms)


def command_record(stored: Mapping[str, Any]) -> dict[str, Any]:
    """A stored (canonical) step back as the command record to issue: the same fields,
    timestamps as datetimes again. Its digest is the stored step's digest (for a step
    stored before a field of its kind existed: once the field's default is left out)."""
    record = dict(stored)
    for name in TIMESTAMP_FIELDS:
        record[name] = from_epoch_ms(int(record[name]))
    record["target"] = dict(record["target"])
    # A step stored before a field of its kind existed gets the field's default, as Avro
    # will decode it at the executor, so the signature covers what the executor reads.
    return {**record, **actions.by_kind(command_kind(record)).params_of(record)}


def describe(step: Mapping[str, Any]) -> str:
    """One line for a person, e.g. ``scale checkout-api in production to 12 replicas``."""
    target = step["target"]
    return actions.by_kind(command_kind(step)).describe(f"{target['name']} in {target['environment']}", step)


def summarize(steps: Sequence[Mapping[str, Any]]) -> str:
    """The whole plan in one line, steps in order."""
    return "; then ".join(describe(step) for step in steps)
