"""The health agent's HTTP surface: Alertmanager's webhook and what it delivered.

``POST /alerts`` takes Alertmanager's webhook payload (version 4) with ``Authorization:
Bearer <token>`` (a token whose SHA-256 digest is in ``FLOTILLA_ALERT_TOKENS``): 401
without a valid one, 413 for a body over ``FLOTILLA_ALERT_MAX_BODY_BYTES``, 422 for a
payload that is not the documented shape or breaks a bound (:mod:`.alerts`; nothing
changes), 200 with what became of each alert. ``GET /alerts`` (``?outcome=unknown-service``
and ``?limit=``) lists what was received, newest first, for operators holding a sender's
token (401 otherwise).

The sender is authenticated before a byte of the body is read (the route declares no body
for FastAPI to read first): the webhook's larger body limit is open to token holders only.
"""

# No `from __future__ import annotations`: FastAPI reads the route signatures at run time.

from typing import Annotated, Any

from fastapi import Depends, FastAPI, Header, HTTPException, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from flotilla import RecordTooLargeError, ServiceContext, allow_body
from flotilla.bearer import Bearer, BearerTokens
from services.health_agent import alerts


def install_routes(
    app: FastAPI, svc: ServiceContext, intake: alerts.Intake, senders: BearerTokens, *, max_body_bytes: int
) -> None:
    allow_body(app, "/alerts", max_body_bytes)

    def sender(authorization: Annotated[str | None, Header()] = None) -> Bearer:
        found = senders.authenticate(authorization)
        if found is None:
            raise HTTPException(
                401, "a valid bearer token is required (FLOTILLA_ALERT_TOKENS)", headers={"WWW-Authenticate": "Bearer"}
            )
        return found

    @app.post("/alerts")
    async def receive(request: Request, who: Annotated[Bearer, Depends(sender)]) -> dict[str, Any]:
        try:
            notification = intake.parse(await request.body())
        except ValidationError as exc:
            # FastAPI's shape (loc starts at "body"), without the inputs: a refused value
            # may be the megabyte it was refused for.
            errors = exc.errors(include_url=False, include_input=False, include_context=False)
            raise RequestValidationError([{**e, "loc": ("body", *e["loc"])} for e in errors]) from None
        try:
            received = await run_in_threadpool(alerts.receive, svc, intake, notification)
        except RecordTooLargeError as exc:  # a bound of the intake above the outbox's limit
            raise HTTPException(413, str(exc)) from None
        return {"sender": who.name, "alerts": [r.as_json() for r in received]}

    # The listing names labels, annotations and fingerprints: for the same token holders
    # as the webhook (review 3, L3), not for anyone who reaches the port.
    @app.get("/alerts")
    def listing(
        _who: Annotated[Bearer, Depends(sender)],
        outcome: Annotated[str | None, Query(pattern="^(opened|joined|recorded|unknown-service)$")] = None,
        limit: Annotated[int, Query(ge=1, le=1000)] = 200,
    ) -> list[dict[str, Any]]:
        with svc.pool.connection() as conn:
            return alerts.listing(conn, outcome, limit)
