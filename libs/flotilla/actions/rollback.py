"""Roll a service back to an exact earlier revision, named with the one it rolls back from.

The plan names both ends: the revision running when it was planned (``fromRevision``, its
pod-template hash) and the one to return to (``toRevision``, its hash and images). The
target refuses when the service no longer runs the "from" revision, so a person's change
between approval and execution is never overwritten. Only ``toRevision`` is chosen by a
reasoner; the rest are facts the agent copies from the evidence. The "from" fields are
nullable only so that a record proposed before they existed still decodes; a target
refuses such a rollback.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flotilla.actions.spec import ActionSpec, Param, ParamType, Reversal, recorded


def _images(images: Any) -> str:
    return ", ".join(images) if images else "images not recorded"


def _describe(where: str, params: Mapping[str, Any]) -> str:
    text = f"roll {where} back"
    if params.get("fromRevision"):
        text += f" from revision {params['fromRevision']}"
        if params.get("fromImages"):
            text += f" ({_images(params['fromImages'])})"
    text += f" to revision {params['toRevision']}"
    if params.get("toImages"):
        text += f" ({_images(params['toImages'])})"
    return text


def _outcome(name: str, params: Mapping[str, Any], before: Mapping[str, Any], after: Mapping[str, Any]) -> str:
    text = f"{name} moved from {before.get('revision', '?')} to {after.get('revision', '?')}"
    if after.get("restoredRevision") not in (None, after.get("revision")):
        text += f" (revision {after['restoredRevision']}'s template, renumbered)"
    if before.get("images") or after.get("images"):
        text += f" ({_images(before.get('images'))} → {_images(after.get('images'))})"
    return text


def _undo(name: str, params: Mapping[str, Any], before: Mapping[str, Any], after: Mapping[str, Any]) -> Reversal:
    revision = str(recorded(before, "revision"))
    return Reversal(
        {
            "toRevision": revision,
            "fromRevision": None if after.get("revision") is None else str(after["revision"]),
            "fromTemplateHash": after.get("templateHash"),
            "toTemplateHash": before.get("templateHash"),
            "fromImages": list(after.get("images") or []),
            "toImages": list(before.get("images") or []),
        },
        f"roll {name} forward to {revision}",
    )


def _check(params: Mapping[str, Any]) -> list[str]:
    found = [] if str(params["toRevision"]).strip() else ["toRevision must not be empty"]
    if params.get("fromRevision") is not None and params["fromRevision"] == params["toRevision"]:
        found.append(f"a rollback from revision {params['toRevision']} to itself changes nothing")
    return found


SPEC = ActionSpec(
    kind="RollbackDeployment",
    action="rollback",
    usage="rollback (toRevision: the service's rollbackCandidate.revision, exactly)",
    params=(
        Param("toRevision", ParamType.TEXT, "rollback: the revision to return to"),
        Param("fromRevision", ParamType.TEXT, "the revision running when planned", True, False, False),
        Param("fromTemplateHash", ParamType.TEXT, "its pod-template hash", True, False, False),
        Param("toTemplateHash", ParamType.TEXT, "the pod-template hash to return to", True, False, False),
        Param("fromImages", ParamType.TEXTS, "the running revision's images", in_key=False, planned=False),
        Param("toImages", ParamType.TEXTS, "the images to return to", in_key=False, planned=False),
    ),
    describe=_describe,
    outcome=_outcome,
    undo=_undo,
    check=_check,
)
