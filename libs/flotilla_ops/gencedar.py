"""Generate the command kinds' Cedar actions in ``infra/policies/flotilla.cedarschema``.

Each kind's Cedar action and its context (the facts every step has, the kind's own
params, the facts the policy service adds) follow from its :class:`flotilla.actions.ActionSpec`,
so the part of the schema between the two marker lines is written from the specs:
``python -m flotilla_ops.gencedar`` rewrites it, ``--check`` (run by ``make lint``) fails
when it is stale. The rest of the file (entities, the plan's facts, people's actions)
is written by hand.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from flotilla import actions, project_path
from flotilla_ops.generated import write_or_check


def _target() -> Path:
    """The schema in the policy folder of this checkout (``$FLOTILLA_POLICY_DIR`` when set)."""
    return project_path("FLOTILLA_POLICY_DIR", "infra/policies") / "flotilla.cedarschema"


BEGIN = "// ---- begin: the command kinds, generated from flotilla.actions (python -m flotilla_ops.gencedar)"
END = "// ---- end: the command kinds"
REGENERATE = "python -m flotilla_ops.gencedar"

# What every step's context has, whatever its kind.
COMMON = (
    ("humanApproved", "Bool", "false: may it run with no person? true: may it run if a person approves?"),
    ("plan", "Plan", "facts about the whole plan"),
    ("secondsToExpiry", "Long", "until the command's expiresAt; <= 0 means already expired"),
)


def _line(name: str, cedar_type: str, doc: str, optional: bool = False) -> str:
    declared = f"    {name}{'?' if optional else ''}: {cedar_type},"
    return f"{declared:<32}// {doc}"


def action_block(spec: actions.ActionSpec) -> str:
    lines = [f"action {spec.kind} in [Remediate] appliesTo {{", "  principal: [Agent],", "  resource: [Service],"]
    lines.append("  context: {")
    lines += [_line(name, kind, doc) for name, kind, doc in COMMON]
    # A nullable param has no value in a record written before it existed: Cedar has no null.
    lines += [_line(p.name, p.type.cedar_type, p.doc, optional=p.nullable) for p in spec.params]
    lines += [
        _line(name, kind, "added by the policy service when it knows it", True)
        for name, kind in spec.cedar_extra.items()
    ]
    lines += ["  },", "};"]
    return "\n".join(lines)


def render(current: str) -> str:
    """``current`` with the generated part replaced by the specs' actions."""
    head, begin, rest = current.partition(BEGIN)
    _, end, tail = rest.partition(END)
    if not begin or not end:
        raise ValueError(f"flotilla.cedarschema has no '{BEGIN}' ... '{END}' section")
    body = "\n\n".join(action_block(spec) for spec in actions.SPECS)
    return f"{head}{BEGIN}\n{body}\n{END}{tail}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gencedar", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail when the schema's command kinds are stale")
    args = parser.parse_args(argv)
    target = _target()
    text = render(target.read_text())
    return write_or_check({target: text}, check=args.check, root=target.parents[2], regenerate=REGENERATE)


if __name__ == "__main__":
    raise SystemExit(main())
