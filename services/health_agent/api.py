"""The health agent's HTTP surface: Alertmanager's webhook and what it delivered.

``POST /alerts`` takes Alertmanager's webhook payload (version 4) with ``Authorization:
Bearer <token>`` (a token whose SHA-256 digest is in ``FLOTILLA_ALERT_TOKENS``): 401
without a valid one, 422 for a payload that is not the documented shape (nothing
changes), 200 with what became of each alert. ``GET /alerts`` (``?outcome=unknown-service``
and ``?limit=``) lists what was received, newest first, for operators.
"""

# No `from __future__ import annotations`: FastAPI reads the route signatures at run time.

from typing import Annotated, Any

from fastapi import Depends, FastAPI, Header, HTTPException, Query

from flotilla import ServiceContext
from flotilla.bearer import Bearer, BearerTokens
from services.health_agent import alerts


def install_routes(app: FastAPI, svc: ServiceContext, intake: alerts.Intake, senders: BearerTokens) -> None:
    def sender(authorization: Annotated[str | None, Header()] = None) -> Bearer:
        found = senders.authenticate(authorization)
        if found is None:
            raise HTTPException(
                401, "a valid bearer token is required (FLOTILLA_ALERT_TOKENS)", headers={"WWW-Authenticate": "Bearer"}
            )
        return found

    @app.post("/alerts")
    def receive(notification: alerts.Notification, who: Annotated[Bearer, Depends(sender)]) -> dict[str, Any]:
        received = alerts.receive(svc, intake, notification)
        return {"sender": who.name, "alerts": [r.as_json() for r in received]}

    @app.get("/alerts")
    def listing(
        outcome: Annotated[str | None, Query(pattern="^(opened|joined|recorded|unknown-service)$")] = None,
        limit: Annotated[int, Query(ge=1, le=1000)] = 200,
    ) -> list[dict[str, Any]]:
        with svc.pool.connection() as conn:
            return alerts.listing(conn, outcome, limit)
