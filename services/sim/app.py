"""The sim's HTTP API (see docs/design/fleet-contracts.md, "The sim").

Errors are ``{"error": message}``: 400 for a malformed request (not JSON, a field of the
wrong type, no idempotency key or fencing token), 401 for an action call without the
action token, 404 for an unknown service, action, fault or key, 409 for a stale fencing
token (``fencingToken`` and ``newestToken`` say which), 422 for parameters the service
cannot take (and for an idempotency key reused with a different action, resource or
params).

The action API (``/actions``) admits only the executor, by the shared action token
(:mod:`services.sim.auth`); the token is checked before the request is, so a caller
without it learns nothing about actions, resources or keys. The read API (services,
metrics) and the test harness's controls (faults, reset, settings) need no token: the
agents read evidence, and the tests break and repair the simulated production through
them (docs/design/fleet-contracts.md).

``/metrics`` is the model read at scrape time, under the state's lock: the ``sim_*``
gauges through prometheus_client (a registry per scrape, so two apps in one process, as
in the tests, never share series), then what a real instrumented estate would publish
(:mod:`services.sim.telemetry`), rendered directly: those histograms keep their counts
between scrapes, and prometheus_client's per-sample path was too slow for 2,000 services.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr

from flotilla import limit_bodies
from flotilla.bounds import DEFAULT_MAX_BODY_BYTES
from services.sim.auth import ActionToken
from services.sim.ledger import Ledger
from services.sim.model import ACTIONS, InvalidAction, Latency, SimModel, UnknownResource
from services.sim.settings import SimSettings
from services.sim.state import KeyReused, SimState, StaleToken
from services.sim.telemetry import EstateTelemetry, ServiceReading, render


class ActionRequest(BaseModel):
    model_config = ConfigDict(populate_by_name=True)

    resource: StrictStr | None = None
    params: dict[str, Any] = Field(default_factory=dict)
    idempotency_key: StrictStr | None = Field(default=None, alias="idempotencyKey")
    fencing_token: StrictInt | None = Field(default=None, alias="fencingToken")
    holder: StrictStr | None = None


class FaultRequest(BaseModel):
    service: StrictStr
    kind: StrictStr
    dependency: StrictStr | None = None


def _error(status: int, message: str, **extra: Any) -> JSONResponse:
    return JSONResponse({"error": message, **extra}, status_code=status)


class _NotTheExecutor(Exception):
    """An action call without the action token."""


# auto_error=False: a missing or non-Bearer header is ours to answer (401, the sim's error shape).
_bearer = HTTPBearer(auto_error=False)


# name, environment, replicas, threshold_ms, latency: read under the lock
_Row = tuple[str, str, int, float, Latency]


class _SimCollector(Collector):
    """The ``sim_*`` series of rows read from the model at scrape time."""

    def __init__(self, rows: list[_Row]) -> None:
        self._rows = rows

    def collect(self) -> Iterable[Metric]:
        # Every series carries the environment too: watchers and policies scope by it.
        p95 = GaugeMetricFamily(
            "sim_latency_p95_ms", "p95 latency of the service, ms.", labels=["service", "environment"]
        )
        replicas = GaugeMetricFamily(
            "sim_replicas", "Running replicas of the service.", labels=["service", "environment"]
        )
        threshold = GaugeMetricFamily(
            "sim_latency_threshold_ms",
            "p95 above which the service is in trouble, ms.",
            labels=["service", "environment"],
        )
        dependency = GaugeMetricFamily(
            "sim_dependency_latency_p95_ms",
            "p95 latency the service sees from a dependency (its active target), ms.",
            labels=["service", "dependency"],
        )
        utilization = GaugeMetricFamily(
            "sim_pool_utilization_ratio",
            "Worker-slot demand over worker slots of the service; above 1 requests wait for the pool.",
            labels=["service"],
        )
        for name, environment, running, threshold_ms, latency in self._rows:
            p95.add_metric([name, environment], latency.p95_ms)
            replicas.add_metric([name, environment], running)
            threshold.add_metric([name, environment], threshold_ms)
            utilization.add_metric([name], latency.utilization)
            for dep, ms in latency.dependencies_ms.items():
                dependency.add_metric([name, dep], ms)
        return [p95, replicas, threshold, dependency, utilization]


def _scrape(
    state: SimState, telemetry: EstateTelemetry, clock: Callable[[], float], services: list[str] | None
) -> bytes:
    """Every service's series, or only those of ``services`` (plain names, as
    :meth:`SimState.known` gives them). The model is read, the clock read and the
    telemetry advanced under one hold of the lock, so concurrent scrapes advance in order
    and every series of a scrape describes the same moment; rendering happens outside."""

    def snapshot(model: SimModel) -> tuple[list[_Row], list[ServiceReading]]:
        names = model.names if services is None else services
        rows = [(model.service(name), model.latency(name)) for name in names]
        forbidden = {name: why for name in names if (why := model.rollback_forbidden(name)) is not None}
        readings = telemetry.advance(rows, clock(), forbidden)
        return [(s.name, s.environment, s.replicas, s.threshold_ms, latency) for s, latency in rows], readings

    rows, readings = state.read(snapshot)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_SimCollector(rows))
    return generate_latest(registry) + render(readings).encode()


MISSING_TOKEN = (
    "sim: FLOTILLA_SIM_ACTION_TOKEN is not set; the sim does not serve actions without the token the executor "
    "presents (the executor's setting of the same name; or FLOTILLA_SIM_ACTION_TOKEN_FILE, a file holding it). "
    "The local fleet generates one (.stack/secrets/sim-action-token), so does docker compose (keys-init); "
    "Kubernetes takes it from a Secret."
)


def build_app(settings: SimSettings) -> FastAPI:
    """The sim ``python -m services.sim`` serves. Without an action token
    (``FLOTILLA_SIM_ACTION_TOKEN``, or a readable ``FLOTILLA_SIM_ACTION_TOKEN_FILE``) it
    refuses to start (exit status 1): a sim the executor cannot act on is a
    misconfiguration, better reported when it is deployed than as a failed command during
    the first incident."""
    try:
        action_token = settings.action_token()
    except ValueError as exc:
        sys.exit(f"sim: no usable action token: {exc}")
    if action_token is None:
        sys.exit(MISSING_TOKEN)
    model = (
        SimModel.generated(settings.sim_services, production_share=settings.sim_production_share)
        if settings.sim_services
        else None
    )
    return create_sim_app(
        model,
        action_token=action_token,
        action_seconds=settings.sim_action_seconds,
        ledger=Ledger(settings.sim_ledger_file) if settings.sim_ledger_file else None,
        max_body_bytes=settings.http_max_body_bytes,
    )


def create_sim_app(
    model: SimModel | None = None,
    *,
    action_token: str,
    action_seconds: float = 0.2,
    ledger: Ledger | None = None,
    clock: Callable[[], float] = time.monotonic,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
) -> FastAPI:
    """The sim over ``model`` (the default topology if None); ``/reset`` returns to it.
    ``ledger``: where applied actions are kept (in memory if None). ``clock``: seconds,
    never going back; the synthesized histograms grow with it (tests step it).

    ``action_token`` is what the executor must present to act (ValueError if it is too
    short to be a secret): there is no sim without one, so none serves actions openly.
    """
    token = ActionToken(action_token)
    state = SimState(model or SimModel.default(), action_seconds=action_seconds, ledger=ledger)
    # Outlives /reset: an estate's counters do not restart because its topology was
    # restored. An edge the reset takes away (a failover undone) pauses at the next scrape.
    telemetry = EstateTelemetry()

    app = FastAPI(title="flotilla sim", docs_url=None, redoc_url=None)
    limit_bodies(app, max_body_bytes)  # FLOTILLA_HTTP_MAX_BODY_BYTES, as every service's API
    app.state.sim = state

    @app.exception_handler(RequestValidationError)
    async def malformed(request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = [
            "body is not valid JSON"
            if e.get("type") == "json_invalid"
            else f"{'.'.join(str(p) for p in e.get('loc', ()) if p != 'body') or 'body'}: {e.get('msg')}"
            for e in exc.errors()
        ]
        return _error(400, "malformed request: " + "; ".join(problems))

    @app.exception_handler(_NotTheExecutor)
    async def not_the_executor(request: Request, exc: _NotTheExecutor) -> JSONResponse:
        response = _error(401, "the action API needs the action token: Authorization: Bearer <token>")
        response.headers["WWW-Authenticate"] = "Bearer"
        return response

    def executor_only(credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]) -> None:
        """Run before the body is validated, so a caller without the token learns nothing more."""
        if credentials is None or not token.admits(credentials.credentials):
            raise _NotTheExecutor()

    @app.get("/healthz")
    def healthz() -> dict[str, str]:
        return {"status": "ok", "service": "sim"}

    @app.get("/metrics")
    def metrics(service: Annotated[list[str] | None, Query()] = None) -> Response:
        """Every series; with ``?service=a&service=b`` only those services' (an agent
        reasoning about one incident reads its neighbourhood, not the whole estate)."""
        names = None if service is None else state.known(service)
        return Response(_scrape(state, telemetry, clock, names), media_type=CONTENT_TYPE_LATEST)

    @app.get("/services")
    def services(name: Annotated[list[str] | None, Query()] = None) -> list[dict[str, Any]]:
        """Every service; with ``?name=a&name=b`` only those the sim knows (unknown names
        are left out, not an error: a caller asking for a neighbourhood gets what exists)."""
        return state.services(name)

    @app.get("/services/{name:path}", response_model=None)
    def service(name: str) -> dict[str, Any] | JSONResponse:
        try:
            return state.service(name)
        except UnknownResource as exc:
            return _error(404, str(exc))

    @app.get("/faults")
    def faults() -> list[dict[str, Any]]:
        return state.faults()

    @app.post("/faults", status_code=201, response_model=None)
    def add_fault(body: FaultRequest) -> dict[str, Any] | JSONResponse:
        try:
            return state.add_fault(body.service, body.kind, body.dependency).as_json()
        except UnknownResource as exc:
            return _error(404, str(exc))
        except InvalidAction as exc:
            return _error(422, str(exc))

    @app.delete("/faults/{fault_id}", response_model=None)
    def remove_fault(fault_id: str) -> dict[str, Any] | JSONResponse:
        try:
            return state.remove_fault(fault_id).as_json()
        except UnknownResource as exc:
            return _error(404, str(exc))

    @app.post("/reset")
    def reset() -> dict[str, str]:
        state.reset()
        return {"status": "reset"}

    @app.get("/settings")
    def read_settings() -> dict[str, float]:
        return {"actionSeconds": state.action_seconds}

    @app.put("/settings", response_model=None)
    def change_settings(body: dict[str, Any]) -> dict[str, float] | JSONResponse:
        """Tests slow actions down to catch an executor in the middle of one."""
        seconds = body.get("actionSeconds")
        if not isinstance(seconds, int | float) or isinstance(seconds, bool) or not 0 <= seconds <= 60:
            return _error(422, "actionSeconds must be a number of seconds from 0 to 60")
        state.action_seconds = float(seconds)
        return {"actionSeconds": state.action_seconds}

    @app.post("/actions/{action}", response_model=None, dependencies=[Depends(executor_only)])
    def act(action: str, body: ActionRequest) -> dict[str, Any] | JSONResponse:
        if action not in ACTIONS:
            return _error(404, f"unknown action {action!r}; one of {', '.join(ACTIONS)}")
        if not body.idempotency_key:
            return _error(400, "idempotencyKey is required")
        if body.fencing_token is None:
            return _error(400, "fencingToken is required")
        if body.fencing_token < 0:
            return _error(400, "fencingToken must not be negative")
        if not body.resource:
            return _error(400, "resource is required")
        try:
            return state.perform(
                action, body.resource, body.params, body.idempotency_key, body.fencing_token, body.holder
            )
        except StaleToken as exc:
            return _error(409, "stale fencing token", fencingToken=exc.token, newestToken=exc.newest)
        except UnknownResource as exc:
            return _error(404, str(exc))
        except (InvalidAction, KeyReused) as exc:
            return _error(422, str(exc))

    @app.get("/action-counts", dependencies=[Depends(executor_only)])
    def action_counts() -> dict[str, Any]:
        """Ground truth for exactly-once checks: requests and applications per key."""
        counts = state.action_counts()
        return {
            "keys": counts,
            "appliedMoreThanOnce": sorted(k for k, c in counts.items() if c["applied"] > 1),
            "requestedMoreThanOnce": sorted(k for k, c in counts.items() if c["requests"] > 1),
        }

    @app.get("/actions/{idempotency_key:path}", response_model=None, dependencies=[Depends(executor_only)])
    def lookup(idempotency_key: str) -> dict[str, Any] | JSONResponse:
        recorded = state.lookup(idempotency_key)
        if recorded is None:
            return _error(404, f"no action applied with idempotency key {idempotency_key!r}")
        return recorded

    return app
