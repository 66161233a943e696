"""Where the executor's actions land: the sim (:mod:`.sim`), or a Deployment in
Kubernetes (:mod:`.kubernetes`); :mod:`.base` holds what both are (the result, the
errors, the protocol)."""

from services.executor.targets.base import (
    ActionResult,
    ActionTarget,
    StaleFencingToken,
    TargetError,
    TargetRejected,
    TargetUnavailable,
)
from services.executor.targets.kubernetes import KubernetesTarget
from services.executor.targets.sim import SimTarget

__all__ = [
    "ActionResult",
    "ActionTarget",
    "KubernetesTarget",
    "SimTarget",
    "StaleFencingToken",
    "TargetError",
    "TargetRejected",
    "TargetUnavailable",
]
