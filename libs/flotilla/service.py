"""What every service process shares: settings, HTTP surface, and the run loop.

A service is a consumer loop plus a small HTTP server for people and machines:
``/healthz`` (the process is alive), ``/readyz`` (its database and Kafka answer, and the
loop is running), ``/metrics`` (Prometheus). The loop runs on the main thread so
SIGTERM lets it finish the batch in hand; uvicorn serves from a daemon thread.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any, Self

import uvicorn
from fastapi import FastAPI, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from psycopg_pool import ConnectionPool
from pydantic_settings import SettingsConfigDict

from flotilla.settings import StackSettings, default_env_file

log = logging.getLogger(__name__)


class ServiceSettings(StackSettings):
    """Stack settings plus what one service needs; all from ``FLOTILLA_*`` variables."""

    model_config = SettingsConfigDict(env_prefix="FLOTILLA_", extra="ignore")

    service_name: str = "flotilla-service"
    service_database: str = "flotilla"
    http_host: str = "127.0.0.1"
    http_port: int = 0  # 0: no HTTP server
    log_level: str = "INFO"

    @classmethod
    def load(cls, **overrides: Any) -> Self:
        """The settings of this class from FLOTILLA_* variables over the stack's env file:
        the one loader every service uses (subclasses inherit it)."""
        path = default_env_file()
        return cls(_env_file=path if path.exists() else None, **overrides)  # type: ignore[call-arg]


def open_pool(settings: ServiceSettings, *, max_size: int = 4) -> ConnectionPool[Any]:
    """A connection pool on the service's own database, in autocommit mode: every
    transaction is an explicit ``conn.transaction()`` block."""
    return ConnectionPool(
        settings.pg_dsn(settings.service_database),
        min_size=1,
        max_size=max_size,
        kwargs={"autocommit": True},
        open=True,
        name=settings.service_name,
    )


def create_app(name: str, ready: Callable[[], bool]) -> FastAPI:
    """The operational HTTP surface; services add their own routes to it."""
    app = FastAPI(title=name, docs_url=None, redoc_url=None)

    @app.get("/healthz")
    def healthz() -> dict[str, str]:
        return {"status": "ok", "service": name}

    @app.get("/readyz")
    def readyz(response: Response) -> dict[str, str]:
        if ready():
            return {"status": "ready", "service": name}
        response.status_code = 503
        return {"status": "not ready", "service": name}

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
