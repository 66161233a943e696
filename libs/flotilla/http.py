"""The operational HTTP surface every service process serves.

``/healthz`` (the process is alive), ``/readyz`` (its database and Kafka answer, and the
loop is running), ``/metrics`` (Prometheus). The consumer loop runs on the main thread so
SIGTERM lets it finish the batch in hand; uvicorn serves from a daemon thread.

A request that finds the service's database gone (restarting, failing over) is answered
503 with ``Retry-After``, not 500: the caller (a person approving, the console) should
try again shortly rather than report a bug.

Every request body is bounded before anything reads it (:class:`BodyLimit`, security
review 3, L5): FastAPI reads and parses a route's body before its dependencies run, so
without a bound an unauthenticated caller could make any service hold gigabytes.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping
from typing import Any

import uvicorn
from fastapi import FastAPI, HTTPException, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from psycopg import OperationalError
from psycopg_pool import ConnectionPool
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from flotilla.bounds import DEFAULT_MAX_BODY_BYTES

# Seconds a caller is told to wait when the database is away; a PostgreSQL restart takes ~1-5 s.
DATABASE_RETRY_AFTER_SECONDS = 2


class BodyTooLarge(HTTPException):
    """A request body over its limit: 413. An HTTPException so that FastAPI, reading a
    route's body, passes it on as it is (any other error there becomes a 400)."""

    def __init__(self, limit: int, declared: int | None = None) -> None:
        size = "a body" if declared is None else f"a body of {declared} bytes"
        super().__init__(413, f"request refused: {size} is over this endpoint's limit of {limit} bytes")


class BodyLimit:
    """ASGI middleware: no request body over ``limit`` bytes (``paths``: other limits for
    some paths, e.g. a webhook that takes thousands of alerts at once) is read.

    A declared ``Content-Length`` over the limit is answered 413 before the app sees the
    request at all (nothing runs, not even authentication); a body without one (chunked)
    is counted as it streams in and cut at the limit: the app's read raises
    :class:`BodyTooLarge`, answered 413 if no response has started. Either way the answer
    is JSON, ``{"detail": reason}``, as FastAPI's errors are."""

    def __init__(self, app: ASGIApp, limit: int, paths: Mapping[str, int] | None = None) -> None:
        if limit < 0 or any(v < 0 for v in (paths or {}).values()):
            raise ValueError("a body limit is a number of bytes, 0 or more")
        self.app = app
        self.limit = limit
        self.paths = paths if paths is not None else {}  # the app's own: see allow_body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.paths.get(scope["path"], self.limit)
        declared = _content_length(scope)
        if declared is not None and declared > limit:
            await self._refuse(send, BodyTooLarge(limit, declared))
            return
        seen = 0
        started = False

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise BodyTooLarge(limit)
            return message

        async def sending(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted, sending)
        except BodyTooLarge as exc:
            if started:
                raise
            await self._refuse(send, exc)

    async def _refuse(self, send: Send, exc: BodyTooLarge) -> None:
        body = json.dumps({"detail": exc.detail}).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        # The body is left unread: the server closes the connection rather than reuse it.
        headers.append((b"connection", b"close"))
        await send({"type": "http.response.start", "status": 413, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None  # the server refuses a malformed one before the app is called
    return None


def limit_bodies(app: FastAPI, limit: int, paths: Mapping[str, int] | None = None) -> None:
    """Bound ``app``'s request bodies (see :class:`BodyLimit`), around every route: no
    route reads a byte first. ``paths`` stays the app's own
    (``app.state.body_limits``): routes added later give their path a limit of its own
    with :func:`allow_body`."""
    app.state.body_limits = dict(paths or {})
    app.add_middleware(BodyLimit, limit=limit, paths=app.state.body_limits)


def allow_body(app: FastAPI, path: str, limit: int) -> None:
    """Let ``path`` of an app made by :func:`create_app` take bodies up to ``limit`` bytes
    (before it serves its first request)."""
    if limit < 0:
        raise ValueError("a body limit is a number of bytes, 0 or more")
    app.state.body_limits[path] = limit


def create_app(
    name: str,
    ready: Callable[[], bool],
    *,
    not_ready: Callable[[], str | None] | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
) -> FastAPI:
    """The operational HTTP surface; services add their own routes to it. ``not_ready``
    says why a service whose database answers still cannot do its job (None: it can).
    Request bodies are bounded at ``max_body_bytes`` (``FLOTILLA_HTTP_MAX_BODY_BYTES``)
    unless a path is given its own limit (:func:`allow_body`)."""
    app = FastAPI(title=name, docs_url=None, redoc_url=None)
    limit_bodies(app, max_body_bytes)

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
