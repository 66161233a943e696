"""The policy service, declared: the one place where a recommendation becomes authority.

Consumes ``incidents`` (RecoveryProposed, IncidentEscalated), serves the approval API,
and sweeps expired approvals every ``FLOTILLA_APPROVAL_SWEEP_SECONDS``. Its database
(``flotilla_policy``) holds proposals, decisions and who is current per resource.
"""

from __future__ import annotations

from fastapi import FastAPI

from flotilla import ServiceContext, ServiceSpec
from flotilla.fleet import POLICY
from services.policy import approvals, store
from services.policy.api import install_routes
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

    def routes(app: FastAPI, ctx: ServiceContext) -> None:
        install_routes(app, ctx, rt)

    return ServiceSpec(
        name=POLICY.name,
        database=DATABASE,
        topics=("incidents",),
        handlers=lambda ctx: make_handlers(ctx, rt),
        migrations=(store.migration(),),
        periodic=((rt.sweep_seconds, expiry_sweep),),
        routes=routes,
        emits=POLICY.emits,
    )
