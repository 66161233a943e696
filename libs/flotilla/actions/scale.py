"""Scale a service to an absolute replica count (undone by scaling back)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flotilla.actions.spec import ActionSpec, Param, ParamType, Reversal, recorded


def _describe(where: str, params: Mapping[str, Any]) -> str:
    return f"scale {where} to {params['replicas']} replicas"


def _outcome(name: str, params: Mapping[str, Any], before: Mapping[str, Any], after: Mapping[str, Any]) -> str:
    return f"{name} scaled from {before.get('replicas', '?')} to {after.get('replicas', '?')} replicas"


def _undo(name: str, params: Mapping[str, Any], before: Mapping[str, Any], after: Mapping[str, Any]) -> Reversal:
    replicas = int(recorded(before, "replicas"))
    return Reversal({"replicas": replicas}, f"scale {name} back to {replicas}")


def _check(params: Mapping[str, Any]) -> list[str]:
    return [] if params["replicas"] >= 0 else [f"replicas must not be negative, got {params['replicas']}"]


SPEC = ActionSpec(
    kind="ScaleService",
    action="scale",
    usage="scale (replicas: the absolute count)",
    params=(Param("replicas", ParamType.INT, "scale: desired replica count"),),
    describe=_describe,
    outcome=_outcome,
    undo=_undo,
    check=_check,
    cedar_extra={"currentReplicas": "Long"},
)
