"""``flotilla approvals list|show``, ``flotilla approve|reject``: people deciding on proposals.

Approving shows exactly what is being approved (incident, commands, the change each
makes as its target's dry run showed it, digests, reasons, deadline) and asks before
sending, unless ``--yes``. The digests sent are the ones shown: if the proposal or its
changes differ in between, the policy service refuses it (409), so an approval never
covers commands or changes the person did not see.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from flotilla_ops.cli.output import ExitCode, Output, api_errors, table
from flotilla_ops.cli.runtime import runtime
from flotilla_ops.fleetapi import person_label

app = typer.Typer(help="Proposals waiting for (or decided by) a person (policy service).", no_args_is_help=True)

Token = Annotated[
    str | None,
    typer.Option("--token", envvar="FLOTILLA_TOKEN", help="Bearer token of the person (or FLOTILLA_TOKEN)."),
]
JsonFlag = Annotated[bool, typer.Option("--json", help="JSON output.")]


def need_token(out: Output, token: str | None) -> str:
    if not token:
        out.fail("a bearer token is required: --token or FLOTILLA_TOKEN", ExitCode.USAGE)
    return token


def change_lines(change: Any) -> list[str]:
    """What a command changes, as its target's dry run showed it, or why it cannot be shown."""
    if not isinstance(change, dict):
        return []
    if "unavailable" in change:
        return [f"change: not shown ({change['unavailable']})"]
    return ["change:"] + [f"  {line}" for line in change.get("lines") or []]


def render_proposal(p: dict[str, Any]) -> str:
    """Everything an approver needs to decide, in the order they need it."""
    left = p.get("secondsLeft")
    state = p.get("status", "?")
    timing = f"{left} s left, deadline {p.get('deadline')}" if state == "pending" else f"deadline {p.get('deadline')}"
    lines = [
        f"proposal   {p.get('proposalId')}  ({state}; {timing})",
        f"incident   {p.get('incidentId')}",
        f"summary    {p.get('summary') or '-'}",
        f"proposed   by {p.get('proposedBy')} at {p.get('proposedAt')}",
        f"decision   {p.get('decision') or '-'}; needs role {p.get('requiredRole') or '-'}"
        + ("  (DRY RUN: authorizes nothing)" if p.get("dryRun") else ""),
        f"digest     {p.get('digest')}",
        f"changes    {p.get('changeDigest') or '-'}",
        "reasons",
    ]
    lines += [f"  - {r}" for r in p.get("reasons") or []] or ["  -"]
    lines.append("commands")
    for i, c in enumerate(p.get("commands") or [], start=1):
        lines.append(f"  {i}. {c.get('kind')} {c.get('target')}: {c.get('description')}")
        lines.append(f"     key {c.get('idempotencyKey')}, expires {c.get('expiresAt')}")
        lines += [f"     {line}" for line in change_lines(c.get("change"))]
    if p.get("supersededBy"):
        lines.append(f"superseded by {p['supersededBy']}")
    if p.get("resolvedBy"):
        lines.append(f"resolved by {p['resolvedBy']} at {p.get('resolvedAt')}: {p.get('resolution')}")
    return "\n".join(lines)


def whoami(ctx: typer.Context, token: Token = None, as_json: JsonFlag = False) -> None:
    """Who the policy service takes the token for, and the roles it holds (check before approving)."""
    out = Output.of(ctx, as_json)
    bearer = need_token(out, token)
    with runtime(ctx).api() as api, api_errors(out, "asking who the token belongs to"):
        me = api.whoami(bearer)
    out.emit(me, lambda d: person_label(str(d.get("user")), d.get("roles") or []))


@app.command("list")
def list_approvals(
    ctx: typer.Context,
    token: Token = None,
    status: Annotated[
        str, typer.Option("--status", help="pending, all, or any status (approved, rejected, expired, withdrawn, ...).")
    ] = "pending",
    as_json: JsonFlag = False,
) -> None:
    """Proposals in a status (pending by default), with incident, commands, digest, time left."""
    out = Output.of(ctx, as_json)
    bearer = need_token(out, token)
    with runtime(ctx).api() as api, api_errors(out, "listing approvals"):
        found = api.approvals(bearer, status=status)
    out.emit(
        {"approvals": found},
        lambda d: (
            table(
                [
                    [
                        p["proposalId"],
                        p["incidentId"],
                        p["status"],
                        "; ".join(str(c.get("description")) for c in p.get("commands") or []),
                        str(p.get("digest", ""))[:19] + "…",
                        p.get("secondsLeft"),
                    ]
                    for p in d["approvals"]
                ],
                ["proposal", "incident", "status", "commands", "digest", "s left"],
            )
            if d["approvals"]
            else f"no {status} approvals"
        ),
    )


@app.command("show")
def show(
    ctx: typer.Context,
    proposal_id: Annotated[str, typer.Argument(help="The proposal id (from HumanApprovalRequired).")],
    token: Token = None,
    as_json: JsonFlag = False,
) -> None:
    """One proposal with everything an approver needs."""
    out = Output.of(ctx, as_json)
    bearer = need_token(out, token)
    with runtime(ctx).api() as api, api_errors(out, f"reading proposal {proposal_id}"):
        found = api.approval(bearer, proposal_id)
    out.emit(found, render_proposal)


def decide(
    ctx: typer.Context,
    proposal_id: str,
    token: str | None,
    *,
    approve: bool,
    yes: bool,
    expected_digest: str | None,
    reason: str | None,
    as_json: bool,
) -> None:
    out = Output.of(ctx, as_json)
    bearer = need_token(out, token)
    verb = "approve" if approve else "reject"
    if out.json and not yes:
        out.fail(f"--json cannot ask for confirmation: add --yes to {verb}", ExitCode.USAGE)
    with runtime(ctx).api() as api:
        with api_errors(out, f"reading proposal {proposal_id}"):
            shown = api.approval(bearer, proposal_id)
        if shown.get("status") != "pending":
            out.fail(f"proposal {proposal_id} is {shown.get('status')}; there is nothing to {verb}", proposal=shown)
        digest = str(shown["digest"])
        change_digest = shown.get("changeDigest")  # the changes shown below, bound as shown
        if expected_digest is not None and expected_digest != digest:
            out.fail(
                f"proposal {proposal_id} now has digest {digest}, not the {expected_digest} given; nothing sent",
                proposal=shown,
            )
        if not out.json:
            typer.echo(render_proposal(shown))
        bound = f"digest {digest}" + (f", changes {change_digest}" if change_digest else "")
        if not yes and not typer.confirm(f"\n{verb.capitalize()} exactly these commands ({bound})?"):
            out.fail(f"not {verb}d; nothing was sent")
        with api_errors(out, f"{verb} {proposal_id}"):
            decided = api.decide(
                bearer, proposal_id, approve=approve, digest=digest, reason=reason, change_digest=change_digest
            )
    out.emit(
        {"ok": True, "decision": decided, "proposal": shown, "digest": digest, "changeDigest": change_digest},
        lambda d: (
            f"{d['decision'].get('status')} by {d['decision'].get('by')}: proposal {proposal_id} "
            f"(incident {d['decision'].get('incidentId')}, digest {digest})"
        ),
    )


Yes = Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")]
Digest = Annotated[
    str | None, typer.Option("--digest", help="Refuse unless the proposal still has this digest (for scripts).")
]


@app.command("approve")
def approve(
    ctx: typer.Context,
    proposal_id: Annotated[str, typer.Argument(help="The proposal id.")],
    token: Token = None,
    yes: Yes = False,
    digest: Digest = None,
    as_json: JsonFlag = False,
) -> None:
    """Show a proposal, confirm, and approve exactly the digest shown."""
    decide(ctx, proposal_id, token, approve=True, yes=yes, expected_digest=digest, reason=None, as_json=as_json)


@app.command("reject")
def reject(
    ctx: typer.Context,
    proposal_id: Annotated[str, typer.Argument(help="The proposal id.")],
    token: Token = None,
    reason: Annotated[str | None, typer.Option("--reason", help="Why (kept with the decision).")] = None,
    yes: Yes = False,
    digest: Digest = None,
    as_json: JsonFlag = False,
) -> None:
    """Show a proposal, confirm, and reject it (naming the digest shown)."""
    decide(ctx, proposal_id, token, approve=False, yes=yes, expected_digest=digest, reason=reason, as_json=as_json)
