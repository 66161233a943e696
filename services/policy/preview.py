"""The exact change each step would make, as its target's dry run shows it.

Before a person is asked to approve a plan, the policy service asks a
:class:`ChangePreviewer` what each step would change (Kubernetes: a server-side
``dryRun=All`` of the write, :mod:`services.policy.preview_kubernetes`). The person is shown
those changes, approves them by :func:`changes_digest`, and each command's authorization
carries its step's :attr:`~flotilla.actions.Change.digest` (``expectedChange``), which the
executor checks against its own dry run before it writes.

A target that cannot dry-run (the sim) answers :class:`~flotilla.actions.NoPreview` with
why, and so does a previewer that fails or is slow: a preview informs a person, it never
decides, so it never blocks nor crashes the decision (:func:`preview_steps`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import TYPE_CHECKING, Any, Protocol

from flotilla.actions import Change, NoPreview, change_from_json
from services.policy.decide import StepFacts

if TYPE_CHECKING:
    from services.policy.settings import PolicySettings

log = logging.getLogger(__name__)

SIM_CANNOT = "the sim cannot dry-run a change: what it does is the step's own description"

Preview = Change | NoPreview


class ChangePreviewer(Protocol):
    def preview(self, step: StepFacts) -> Preview:
        """What ``step`` would change at its target, or NoPreview saying why it cannot tell.
        May raise: :func:`preview_steps` turns any error into a NoPreview."""
        ...


class NoPreviewer:
    """A target with no dry run (the sim, the compose fleet): every step says so."""

    def __init__(self, reason: str = SIM_CANNOT) -> None:
        self._reason = reason

    def preview(self, step: StepFacts) -> Preview:
        return NoPreview(self._reason)


# One worker pool for every preview: the consumer waits at most the budget, and a call
# still running after it (its client's own timeout ends it) occupies a worker, not the loop.
_POOL = ThreadPoolExecutor(max_workers=4, thread_name_prefix="policy-preview")


def preview_steps(previewer: ChangePreviewer, steps: Sequence[StepFacts], *, timeout: float) -> list[Preview]:
    """Each step's preview, in order, within ``timeout`` seconds in all. An error becomes a
    NoPreview with its text and a step not previewed in time a NoPreview saying so: the
    decision waits for no target and fails for none."""
    deadline = time.monotonic() + timeout
    futures = [_POOL.submit(previewer.preview, step) for step in steps]
    found: list[Preview] = []
    for step, future in zip(steps, futures, strict=True):
        try:
            # The budget is for all steps: they run side by side, so each waits what is left.
            result = future.result(timeout=max(0.0, deadline - time.monotonic()))
        except FutureTimeout:
            future.cancel()
            found.append(NoPreview(f"the target gave no dry run within {timeout:g}s"))
            log.warning("preview of command %s: no answer within %gs", step.command_id, timeout)
            continue
        except Exception as exc:  # any previewer failure is shown, never raised
            found.append(NoPreview(f"the dry run failed: {exc}"))
            log.warning("preview of command %s failed: %s", step.command_id, exc)
            continue
        found.append(result if isinstance(result, Change | NoPreview) else NoPreview(f"no preview ({result!r})"))
    return found


def changes_digest(previews: Sequence[Preview]) -> str | None:
    """What a person approves of the changes: ``sha256:`` over the canonical JSON list of
    each step's Change digest (null for a step without one); None when no step has one
    (nothing was shown to bind, so nothing is required of the approval)."""
    digests = [p.digest if isinstance(p, Change) else None for p in previews]
    if all(d is None for d in digests):
        return None
    body = json.dumps(digests, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(body.encode()).hexdigest()


def expected_changes(previews: Sequence[Preview]) -> list[str | None]:
    """Each step's Change digest, the authorization's ``expectedChange`` (None without one)."""
    return [p.digest if isinstance(p, Change) else None for p in previews]


def to_json(previews: Sequence[Preview]) -> list[dict[str, Any]]:
    return [p.to_json() for p in previews]


def from_json(stored: Sequence[Mapping[str, Any]]) -> list[Preview]:
    return [change_from_json(p) for p in stored]


def previewer_from_settings(settings: PolicySettings) -> ChangePreviewer:
    """``FLOTILLA_POLICY_PREVIEW``: ``none`` (the sim and the compose fleet) or ``kubernetes``."""
    if settings.policy_preview == "kubernetes":
        from services.policy.preview_kubernetes import KubernetesPreviewer  # only where it runs

        return KubernetesPreviewer.from_settings(settings, timeout=settings.preview_timeout_seconds)
    return NoPreviewer()
