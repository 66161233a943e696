"""Raise the ceiling of the autoscaler that sizes a service, when it is pinned at it.

Scaling a service an autoscaler manages is undone by the autoscaler; raising its
``maxReplicas`` (an HPA) or ``maxReplicaCount`` (a KEDA ScaledObject, which owns its HPA)
is the change that holds. The plan names the ceiling it found (``fromMaxReplicas``): a
target refuses when the ceiling is no longer that, above 2x it, or above the maximum the
autoscaler declares (``flotilla.dev/max-replicas-ceiling``); policies bound it too.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flotilla.actions.spec import ActionSpec, Param, ParamType, Reversal

AUTOSCALER_KINDS = ("HorizontalPodAutoscaler", "ScaledObject")


def _describe(where: str, params: Mapping[str, Any]) -> str:
    return (
        f"raise the ceiling of {params['autoscalerKind']} {params['autoscaler']} of {where}"
        f" from {params['fromMaxReplicas']} to {params['maxReplicas']} replicas"
    )


def _outcome(name: str, params: Mapping[str, Any], before: Mapping[str, Any], after: Mapping[str, Any]) -> str:
    return (
        f"{name}'s autoscaler {params.get('autoscaler', '?')} ceiling moved from"
        f" {before.get('maxReplicas', '?')} to {after.get('maxReplicas', '?')} replicas"
    )


def _undo(name: str, params: Mapping[str, Any], before: Mapping[str, Any], after: Mapping[str, Any]) -> Reversal:
    """Left raised: lowering a ceiling during an incident, only because a later step
    failed, could take capacity away when it is needed; a person lowers it (targets
    refuse to lower one anyway: this kind only raises)."""
    return Reversal(None, f"{name}'s autoscaler ceiling stays at {params['maxReplicas']}: a person may lower it")


def _check(params: Mapping[str, Any]) -> list[str]:
    found = []
    if params["autoscalerKind"] not in AUTOSCALER_KINDS:
        found.append(f"autoscalerKind must be one of {', '.join(AUTOSCALER_KINDS)}, got {params['autoscalerKind']!r}")
    if not str(params["autoscaler"]).strip():
        found.append("autoscaler must name the autoscaler")
    if params["fromMaxReplicas"] < 1 or params["maxReplicas"] < 1:
        found.append("a ceiling is at least 1 replica")
    return found


SPEC = ActionSpec(
    kind="RaiseAutoscalerCeiling",
    action="raise-ceiling",
    usage=(
        "raise-ceiling (autoscalerKind, autoscaler, fromMaxReplicas: the service's autoscaler and its"
        " current ceiling; maxReplicas: the new one, at most 2x)"
    ),
    params=(
        Param("autoscalerKind", ParamType.TEXT, "raise-ceiling: HorizontalPodAutoscaler or ScaledObject"),
        Param("autoscaler", ParamType.TEXT, "raise-ceiling: the autoscaler's name"),
        Param("fromMaxReplicas", ParamType.INT, "raise-ceiling: its ceiling when planned", in_key=False),
        Param("maxReplicas", ParamType.INT, "raise-ceiling: the new ceiling"),
    ),
    describe=_describe,
    outcome=_outcome,
    undo=_undo,
    check=_check,
    reasoners_plan=False,  # the evidence does not read it yet
)
