"""The executor as a ServiceSpec: topics, handlers, migrations and a read-only HTTP view."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fastapi import FastAPI, HTTPException
from psycopg.rows import dict_row

from flotilla import Handler, ServiceContext, ServiceSpec
from flotilla.fleet import EXECUTOR
from services.executor.execution import Executor
from services.executor.handlers import ExecutorHandlers
from services.executor.settings import ExecutorSettings
from services.executor.targets import ActionTarget

MIGRATIONS = (Path(__file__).with_name("migrations.sql").read_text(),)

# Batched like every loop: a command for a resource whose lease an earlier record of the
# batch released goes on under that lease's row lock (services.executor.execution).
# A shorter Kafka session than the 45 s default: when an executor stops heartbeating
# (paused, partitioned, dead) its partitions should move to a standby at about the pace
# its leases expire (15 s TTL), not three times slower. The broker's minimum is 6 s.
LOOP = {
    "follow_workflow": False,
    "pipeline": False,  # so a frozen executor's transaction can be ended (Executor.bound_handler_transaction)
    "kafka": {"session.timeout.ms": 10_000, "heartbeat.interval.ms": 2_000},
}

TargetFactory = Callable[[ExecutorSettings], ActionTarget]


def executor_settings(ctx: ServiceContext) -> ExecutorSettings:
    if isinstance(ctx.settings, ExecutorSettings):
        return ctx.settings
    return ExecutorSettings(**ctx.settings.model_dump())


def build_spec(settings: ExecutorSettings | None = None) -> ServiceSpec:
    """The ServiceSpec, as ``__main__`` runs it."""
    return spec(settings=settings or ExecutorSettings.load())


def spec(
    target: TargetFactory | None = None,
    clock: Callable[[], datetime] | None = None,
    *,
    settings: ExecutorSettings | None = None,
    **overrides: Any,
) -> ServiceSpec:
    """The executor's ServiceSpec; ``target`` replaces the one the settings select (tests,
    other deployments), ``overrides`` replace ServiceSpec fields (e.g. topics in tests).
    Without ``settings``, the handlers read the ones the service was started with."""
    given = settings

    def handlers(ctx: ServiceContext) -> Mapping[str, Handler]:
        settings = given or executor_settings(ctx)
        action_target = target(settings) if target is not None else settings.build_target()
        executor = Executor(ctx.pool, action_target, settings.executor_config())
        keyring = settings.authorization_keyring()
        return ExecutorHandlers(executor, keyring, clock or (lambda: datetime.now(UTC))).mapping()

    fields: dict[str, Any] = {
        "name": EXECUTOR.name,
        "database": EXECUTOR.database,
        "topics": ("commands", "incidents"),
        "handlers": handlers,
        "migrations": MIGRATIONS,
        "routes": routes,
        "loop": LOOP,
        **overrides,
    }
    return ServiceSpec(**fields)


def routes(app: FastAPI, ctx: ServiceContext) -> None:
    """Read-only views for operators: leases and executions."""

    @app.get("/leases")
    def list_leases() -> list[dict[str, Any]]:
        with ctx.pool.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
            rows: list[dict[str, Any]] = cur.execute(
                "SELECT resource, holder, epoch, expires_at, expires_at > now() AS held FROM leases ORDER BY resource"
            ).fetchall()
        return rows

    @app.get("/executions/{idempotency_key}")
    def execution(idempotency_key: str) -> dict[str, Any]:
        with ctx.pool.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
            row: dict[str, Any] | None = cur.execute(
                "SELECT * FROM executions WHERE idempotency_key = %s", (idempotency_key,)
            ).fetchone()
        if row is None:
            raise HTTPException(404, f"no execution for {idempotency_key}")
        return row
