"""The operational HTTP surface every service process serves.

``/healthz`` (the process is alive), ``/readyz`` (its database and Kafka answer, and the
loop is running), ``/metrics`` (Prometheus). The consumer loop runs on the main thread so
SIGTERM lets it finish the batch in hand; uvicorn serves from a daemon thread.

A request that finds the service's database gone (restarting, failing over) is answered
503 with ``Retry-After``, not 500: the caller (a person approving, the console) should
try again shortly rather than report a bug.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import uvicorn
from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from psycopg import OperationalError
from psycopg_pool import ConnectionPool

# Seconds a caller is told to wait when the database is away; a PostgreSQL restart takes ~1-5 s.
DATABASE_RETRY_AFTER_SECONDS = 2


def create_app(name: str, ready: Callable[[], bool], *, not_ready: Callable[[], str | None] | None = None) -> FastAPI:
    """The operational HTTP surface; services add their own routes to it. ``not_ready``
    says why a service whose database answers still cannot do its job (None: it can)."""
    app = FastAPI(title=name, docs_url=None, redoc_url=None)

    # OperationalError: the connection broke mid-request (AdminShutdown, connection
    # refused), or psycopg_pool's PoolTimeout (a subclass): no connection came in time.
    @app.exception_handler(OperationalError)
    async def database_unavailable(request: Request, exc: Exception) -> JSONResponse:
        return JSONResponse(
            {"detail": f"{name}'s database is unavailable ({type(exc).__name__}); retry shortly"},
            status_code=503,
            headers={"Retry-After": str(DATABASE_RETRY_AFTER_SECONDS)},
        )

    @app.get("/healthz")
    def healthz() -> dict[str, str]:
        return {"status": "ok", "service": name}

    @app.get("/readyz")
    def readyz(response: Response) -> dict[str, str]:
        if not ready():
            response.status_code = 503
            return {"status": "not ready", "service": name}
        reason = not_ready() if not_ready is not None else None
        if reason is not None:
            response.status_code = 503
            return {"status": "not ready", "service": name, "reason": reason}
        return {"status": "ready", "service": name}

    @app.get("/metrics")
    def prometheus() -> Response:
        return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)

    return app


def database_ready(pool: ConnectionPool[Any]) -> bool:
    try:
        with pool.connection(timeout=2) as conn:
            conn.execute("SELECT 1")
        return True
    except Exception:
        return False


def serve_http(app: FastAPI, host: str, port: int) -> uvicorn.Server:
    """Start uvicorn on a daemon thread and return the server (``should_exit`` stops it)."""
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="off"))
    threading.Thread(target=server.run, name="http", daemon=True).start()
    return server
