"""The exact change a step makes, as the target's own dry run of it showed.

Before a person approves a step, the policy service asks the target for a dry run of the
write (Kubernetes: ``dryRun=All``) and keeps what it would change: the few facts a person
can check (images, env names, replicas, paused, memory limits, the template's digest),
before and after. The person is shown it and approves it by its digest; the policy signs
that digest into the command's authorization; the executor dry-runs again before it
writes and refuses when the result is not that digest: nothing is applied but what the
person saw. A target that cannot dry-run (the sim) gives a :class:`NoPreview` with why.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["Change", "NoPreview", "change_digest", "change_from_json"]

CHANGE_PREFIX = "sha256:"


@dataclass(frozen=True)
class Change:
    """``before`` and ``after``: the same keys (e.g. ``images``, ``replicas``), JSON values."""

    before: Mapping[str, Any]
    after: Mapping[str, Any]

    @property
    def digest(self) -> str:
        return change_digest(self)

    def lines(self) -> list[str]:
        """What differs, one line a key, e.g. ``images: shop=shop:1.5 → shop=shop:1.4``;
        an unchanged write says so."""
        changed = [
            f"{key}: {_shown(self.before.get(key))} → {_shown(self.after.get(key))}"
            for key in sorted(set(self.before) | set(self.after))
            if self.before.get(key) != self.after.get(key)
        ]
        return changed or ["no field a person checks changes"]

    def to_json(self) -> dict[str, Any]:
        return {"before": dict(self.before), "after": dict(self.after), "digest": self.digest, "lines": self.lines()}


@dataclass(frozen=True)
class NoPreview:
    """The target cannot show the change before it is made, and why (shown to the person)."""

    reason: str

    def to_json(self) -> dict[str, Any]:
        return {"unavailable": self.reason}


def _shown(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, list | tuple):
        return ", ".join(str(v) for v in value) or "(none)"
    return str(value)


def change_digest(change: Change) -> str:
    """``sha256:<hex>`` of the canonical JSON of before and after (sorted keys, no spaces)."""
    body = json.dumps({"after": change.after, "before": change.before}, sort_keys=True, separators=(",", ":"))
    return CHANGE_PREFIX + hashlib.sha256(body.encode()).hexdigest()


def change_from_json(value: Mapping[str, Any]) -> Change | NoPreview:
    """Back from :meth:`Change.to_json` / :meth:`NoPreview.to_json` (as stored)."""
    if "unavailable" in value:
        return NoPreview(str(value["unavailable"]))
    return Change(dict(value["before"]), dict(value["after"]))
