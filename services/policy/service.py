"""The policy service, declared: the one place where a recommendation becomes authority.

Consumes ``incidents`` (RecoveryProposed, IncidentEscalated), serves the approval API,
sweeps expired approvals every ``FLOTILLA_APPROVAL_SWEEP_SECONDS`` and withdraws those
whose target left the estate every ``FLOTILLA_APPROVAL_TARGET_CHECK_SECONDS``. Its database
(``flotilla_policy``) holds proposals, decisions and who is current per resource.
"""

from __future__ import annotations

from fastapi import FastAPI

from flotilla import Periodic, ServiceContext, ServiceSpec
from flotilla.fleet import POLICY
from services.policy import approvals, store
from services.policy.api import install_routes
from services.policy.approval_rules import DECIDABLE_INCIDENT_STATES
from services.policy.handlers import make_handlers
from services.policy.runtime import PolicyRuntime
from services.policy.settings import PolicySettings

DATABASE = POLICY.database or "flotilla_policy"


def build_spec(settings: PolicySettings | None = None, *, runtime: PolicyRuntime | None = None) -> ServiceSpec:
    """The ServiceSpec; ``runtime`` (engine, inventory, users, TTL, dry run) defaults to
    the one the settings describe."""
    rt = runtime or PolicyRuntime.from_settings(settings or PolicySettings.load())

    def expiry_sweep(ctx: ServiceContext) -> None:
        approvals.sweep(ctx)

    def target_check(ctx: ServiceContext) -> None:
        approvals.withdraw_orphaned(ctx, rt)

    def routes(app: FastAPI, ctx: ServiceContext) -> None:
        install_routes(app, ctx, rt)

    periodic: list[Periodic] = [(rt.sweep_seconds, expiry_sweep)]
    if rt.target_check_seconds > 0:
        periodic.append((rt.target_check_seconds, target_check))

    return ServiceSpec(
        name=POLICY.name,
        database=DATABASE,
        topics=("incidents",),
        handlers=lambda ctx: make_handlers(ctx, rt),
        migrations=(store.migration(),),
        periodic=tuple(periodic),
        routes=routes,
        emits=POLICY.emits,
        # A person's decision is taken only while the incident can still take one (approvals.py).
        observes=(DECIDABLE_INCIDENT_STATES,),
    )
