"""The web console: pages for people over the fleet's HTTP APIs.

Server-rendered (Jinja2), one small script for the deadline countdown, auto-refresh and
copying a decoded value into the re-queue form. Every call to a service goes through
:class:`flotilla_ops.fleetapi.FleetApi`; a refusal becomes a message on the page, an
unreachable service a page that says so (503), never a traceback.

Pages: ``/login`` (a bearer token the policy service accepts), ``/approvals`` and
``/approvals/{id}`` (full context, with the exact change each command makes where its
target can dry-run it; approve/reject the digests shown), ``/incidents`` and
``/incidents/{id}`` (the audit timeline), ``/dlq`` and ``/dlq/{id}`` (inspect and
re-queue dead letters). Every POST carries the session's CSRF token. Sessions are kept in
this process (:mod:`services.console.session`); signing out ends one for good.
"""

# No `from __future__ import annotations`: FastAPI reads the route signatures at run time.

import json
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import quote

from fastapi import FastAPI, Form, Query, Request, Response
from fastapi.responses import HTMLResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates
from flotilla_ops.fleetapi import FleetApi, FleetApiError
from prometheus_client import Counter

from flotilla import create_app
from services.console import views
from services.console.session import COOKIE_NAME, Session, SessionStore
from services.console.settings import ConsoleSettings

log = logging.getLogger(__name__)

HERE = Path(__file__).resolve().parent

DECISIONS = Counter(
    "flotilla_console_decisions_total", "Approve/reject requests sent from the console.", ["action", "outcome"]
)
REQUEUES = Counter("flotilla_console_requeues_total", "Re-queue requests sent from the console.", ["outcome"])
LOGINS = Counter("flotilla_console_logins_total", "Console login attempts.", ["outcome"])
UPSTREAM_ERRORS = Counter(
    "flotilla_console_upstream_errors_total",
    "Refusals and failures the console got from the services (status 0: unreachable).",
    ["service", "status"],
)

OPERATIONAL = frozenset({"/healthz", "/readyz", "/metrics"})
# An anonymous session only carries the login form's CSRF token and a flash or two.
ANONYMOUS_LIFETIME_S = 3600.0
APPROVAL_STATUSES = ("pending", "approved", "rejected", "expired", "superseded", "withdrawn", "all")


class LoginRequired(Exception):
    """The page needs a signed-in person."""


class CsrfRefused(Exception):
    """A POST without this session's CSRF token."""


def _local_path(target: str | None, default: str = "/approvals") -> str:
    """A redirect target that stays on this console (no scheme, no host, no //)."""
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return default
    return target


def build_app(settings: ConsoleSettings) -> FastAPI:
    """The console ``python -m services.console`` serves."""
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per service call is noise
    return create_console_app(settings)


def create_console_app(settings: ConsoleSettings | None = None, api: FleetApi | None = None) -> FastAPI:
    """The console's app; ``api`` defaults to a client of ``settings``' endpoints."""
    settings = settings or ConsoleSettings.load()
    api = api or FleetApi(settings.endpoints(), timeout=settings.console_upstream_timeout_seconds)
    sessions = SessionStore(
        capacity=settings.console_max_sessions, anonymous_capacity=settings.console_max_anonymous_sessions
    )
    lifetime_s = settings.console_session_hours * 3600
    anonymous_s = min(ANONYMOUS_LIFETIME_S, lifetime_s)
    endpoints = api.endpoints

    # Nothing to be ready for but the process itself: the services' availability is
    # shown on the pages, and the console must keep serving while one of them is down.
    app = create_app(settings.service_name, lambda: True, max_body_bytes=settings.http_max_body_bytes)
    app.state.api = api
    app.state.sessions = sessions
    app.mount("/static", StaticFiles(directory=HERE / "static"), name="static")
    templates = Jinja2Templates(directory=HERE / "templates")
    templates.env.globals.update(short=views.short, tone=views.tone, field_rows=views.field_rows, pretty=views.pretty)

    # ------------------------------------------------------------------ session
    @app.middleware("http")
    async def session_cookie(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        presented = request.cookies.get(COOKIE_NAME)
        loaded = sessions.get(presented)
        request.state.session = loaded or Session.fresh(anonymous_s)
        response = await call_next(request)
        current: Session = request.state.session
        operational = request.url.path in OPERATIONAL or request.url.path.startswith("/static/")
        # A page replaced the session (login, logout, a token the policy service dropped) or a
        # new visitor opened a page (probes and static files get none): the presented id ends
        # here, whatever it was, and the browser gets the new session's id.
        if current is not loaded and not (operational and loaded is None):
            sessions.close(presented)
            remaining = max(1, int(current.expires - time.time()))
            response.set_cookie(
                COOKIE_NAME,
                sessions.open(current),
                max_age=remaining,
                path="/",
                httponly=True,
                samesite="strict",
                secure=settings.console_cookie_secure,
            )
        response.headers.setdefault("X-Frame-Options", "DENY")
        response.headers.setdefault("X-Content-Type-Options", "nosniff")
        response.headers.setdefault("Referrer-Policy", "same-origin")
        response.headers.setdefault(
            "Content-Security-Policy",
            "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
            "frame-ancestors 'none'; form-action 'self'",
        )
        if not operational:
            response.headers.setdefault("Cache-Control", "no-store")
        return response

    def session_of(request: Request) -> Session:
        found: Session = request.state.session
        return found

    def token_of(request: Request) -> str:
        session = session_of(request)
        if session.token is None:
            raise LoginRequired()
        return session.token

    def check_csrf(request: Request, presented: str | None) -> None:
        if not session_of(request).csrf_ok(presented):
            raise CsrfRefused()

    def page(request: Request, name: str, status_code: int = 200, **context: Any) -> HTMLResponse:
        session = session_of(request)
        context.setdefault("flashes", session.take_flashes())
        response: HTMLResponse = templates.TemplateResponse(
            request,
            name,
            {"session": session, "csrf": session.csrf, **context},
            status_code=status_code,
        )
        return response

    def count_upstream(exc: FleetApiError) -> None:
        UPSTREAM_ERRORS.labels(endpoints.service_of(exc.url), str(exc.status)).inc()

    def problem_page(request: Request, exc: FleetApiError) -> HTMLResponse:
        found = views.problem(exc, endpoints)
        return page(request, "problem.html", status_code=found.http_status, problem=found)

    @app.exception_handler(LoginRequired)
    async def login_required(request: Request, exc: LoginRequired) -> Response:
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        return RedirectResponse(f"/login?next={quote(target)}", status_code=303)

    @app.exception_handler(CsrfRefused)
    async def csrf_refused(request: Request, exc: CsrfRefused) -> Response:
        return page(
            request,
            "message.html",
            status_code=403,
            title="Form refused",
            message="The form did not carry this session's CSRF token (it is stale, from another site, or "
            "your session ended). Nothing was done. Reload the page and try again.",
        )

    @app.exception_handler(FleetApiError)
    async def fleet_api_error(request: Request, exc: FleetApiError) -> Response:
        count_upstream(exc)
        if exc.status == 401 and endpoints.service_of(exc.url) == "policy service":
            # the token was revoked or the policy service's users changed: sign out
            fresh = Session.fresh(anonymous_s)
            fresh.flash("error", "The policy service no longer accepts your token; sign in again.")
            request.state.session = fresh
            return RedirectResponse("/login", status_code=303)
        return problem_page(request, exc)

    # -------------------------------------------------------------------- login
    @app.get("/", include_in_schema=False)
    def home(request: Request) -> Response:
        return RedirectResponse("/approvals" if session_of(request).logged_in else "/login", status_code=303)

    @app.get("/login", response_class=HTMLResponse)
    def login_form(request: Request, next: str | None = None) -> HTMLResponse:
        return page(request, "login.html", next=_local_path(next))

    @app.post("/login", response_class=HTMLResponse)
    def login(
        request: Request,
        token: Annotated[str, Form()] = "",
        csrf: Annotated[str, Form()] = "",
        next: Annotated[str, Form()] = "/approvals",
    ) -> Response:
        check_csrf(request, csrf)
        token = token.strip()
        target = _local_path(next)
        if not token:
            return page(request, "login.html", status_code=400, next=target, error="Enter a bearer token.")
        try:
            me = api.whoami(token)
        except FleetApiError as exc:
            count_upstream(exc)
            if exc.status == 401:
                LOGINS.labels("refused").inc()
                error = "The policy service does not accept this token."
            else:
                LOGINS.labels("error").inc()
                error = views.problem(exc, endpoints).message
            status = 401 if exc.status == 401 else views.problem(exc, endpoints).http_status
            return page(request, "login.html", status_code=status, next=target, error=error)
        LOGINS.labels("ok").inc()
        # A new session: new CSRF token. Name and roles are for display; the policy
        # service checks the token on every call.
        user, roles = str(me.get("user", "?")), tuple(str(r) for r in me.get("roles", []))
        session = Session.fresh(lifetime_s, token=token, user=user, roles=roles)
        session.flash("ok", f"Signed in as {user}.")
        request.state.session = session
        return RedirectResponse(target, status_code=303)

    @app.post("/logout")
    def logout(request: Request, csrf: Annotated[str, Form()] = "") -> Response:
        check_csrf(request, csrf)
        # A new anonymous session replaces this one, which the middleware then deletes from the
        # store: the old cookie, wherever a copy of it is, opens nothing any more.
        session = Session.fresh(anonymous_s)
        session.flash("ok", "Signed out.")
        request.state.session = session
        return RedirectResponse("/login", status_code=303)

    # ---------------------------------------------------------------- approvals
    @app.get("/approvals", response_class=HTMLResponse)
    def approvals(request: Request, status: str = "pending") -> HTMLResponse:
        token = token_of(request)
        if status not in APPROVAL_STATUSES:
            status = "pending"
        found = api.approvals(token, status=status)
        return page(request, "approvals.html", approvals=found, status=status, statuses=APPROVAL_STATUSES)

    @app.get("/approvals/{proposal_id}", response_class=HTMLResponse)
    def approval(request: Request, proposal_id: str) -> HTMLResponse:
        token = token_of(request)
        proposal = api.approval(token, proposal_id)
        timeline: list[dict[str, Any]] = []
        timeline_problem = None
        try:
            timeline = api.timeline(str(proposal["incidentId"]))["timeline"]
        except FleetApiError as exc:
            count_upstream(exc)
            timeline_problem = views.problem(exc, endpoints)
        return page(
            request,
            "approval.html",
            p=proposal,
            timeline=timeline,
            timeline_problem=timeline_problem,
            # only what the agents signed is their diagnosis; the rest is marked where listed
            diagnoses=views.diagnoses(timeline, proposal_id=str(proposal["proposalId"])),
            unverified=views.unverified(timeline),
            unverified_note=views.unverified_note,
            digest_ok=views.digest_matches(proposal.get("steps"), proposal.get("digest")),
        )

    def decide(
        request: Request, proposal_id: str, approve: bool, digest: str, csrf: str, reason: str, change_digest: str = ""
    ) -> Response:
        check_csrf(request, csrf)
        token = token_of(request)
        action = "approve" if approve else "reject"
        session = session_of(request)
        back = f"/approvals/{quote(proposal_id)}"
        if not digest:
            session.flash("error", "The form carried no digest; nothing was sent.")
            return RedirectResponse(back, status_code=303)
        try:
            decided = api.decide(
                token,
                proposal_id,
                approve=approve,
                digest=digest,
                reason=reason.strip() or None,
                change_digest=change_digest or None,  # the changes the page showed, bound as shown
            )
        except FleetApiError as exc:
            if exc.status in (0, 401) or exc.status >= 500:
                DECISIONS.labels(action, "error").inc()
                raise
            count_upstream(exc)
            DECISIONS.labels(action, f"refused-{exc.status}").inc()
            session.flash("error", views.decision_refusal(exc, action))
            return RedirectResponse(back, status_code=303)
        DECISIONS.labels(action, "done").inc()
        incident = str(decided.get("incidentId", ""))
        by = decided.get("by", "you")
        if approve:
            session.flash(
                "ok",
                f"Approved by {by}: {len(decided.get('commandIds') or [])} command(s) sent for digest {digest}. "
                "The executor's outcome appears in the timeline below.",
            )
        else:
            session.flash("ok", f"Rejected by {by}.")
        return RedirectResponse(f"/incidents/{quote(incident)}" if incident else back, status_code=303)

    @app.post("/approvals/{proposal_id}/approve")
    def approve(
        request: Request,
        proposal_id: str,
        digest: Annotated[str, Form()] = "",
        csrf: Annotated[str, Form()] = "",
        reason: Annotated[str, Form()] = "",
        change_digest: Annotated[str, Form()] = "",
    ) -> Response:
        return decide(request, proposal_id, True, digest, csrf, reason, change_digest)

    @app.post("/approvals/{proposal_id}/reject")
    def reject(
        request: Request,
        proposal_id: str,
        digest: Annotated[str, Form()] = "",
        csrf: Annotated[str, Form()] = "",
        reason: Annotated[str, Form()] = "",
    ) -> Response:
        return decide(request, proposal_id, False, digest, csrf, reason)

    # ---------------------------------------------------------------- incidents
    @app.get("/incidents", response_class=HTMLResponse)
    def incidents(request: Request, limit: Annotated[int, Query(ge=1, le=5000)] = 200) -> HTMLResponse:
        token = token_of(request)
        found = api.incidents(limit=limit)
        waiting: dict[str, str] = {}
        try:
            for p in api.approvals(token, status="pending"):
                waiting.setdefault(str(p["incidentId"]), str(p["proposalId"]))
        except FleetApiError as exc:
            if exc.status == 401:
                raise
            count_upstream(exc)  # the list is still worth showing without the badges
        return page(request, "incidents.html", incidents=found, waiting=waiting, is_terminal=views.is_terminal)

    @app.get("/incidents/{incident_id}", response_class=HTMLResponse)
    def incident(request: Request, incident_id: str, after: Annotated[int, Query(ge=0)] = 0) -> HTMLResponse:
        token = token_of(request)
        found = api.timeline(incident_id, after=after or None)  # one page (audit's default size)
        timeline = found.get("timeline", [])
        page_info = found.get("page") or {}
        pending: list[dict[str, Any]] = []
        try:
            pending = [p for p in api.approvals(token, status="pending") if p.get("incidentId") == incident_id]
        except FleetApiError as exc:
            if exc.status == 401:
                raise
            count_upstream(exc)
        return page(
            request,
            "timeline.html",
            incident=found,
            timeline=timeline,
            outcomes=views.outcomes(timeline),
            diagnoses=views.diagnoses(timeline),
            unverified=views.unverified(timeline),
            unverified_note=views.unverified_note,
            pending=pending,
            after=after,
            page_info=page_info,
            # refreshing shows new records only on the last page
            live=not views.is_terminal(found.get("status")) and page_info.get("nextAfter") is None,
        )

    # ---------------------------------------------------------------------- DLQ
    @app.get("/dlq", response_class=HTMLResponse)
    def dlq(
        request: Request,
        status: str | None = None,
        reason: str | None = None,
        origin: str | None = None,
        incident: str | None = None,
        limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    ) -> HTMLResponse:
        token_of(request)
        filters = {"status": status or None, "reason": reason or None, "origin": origin or None}
        filters["incident"] = incident or None
        entries = api.quarantine(**filters, limit=limit)
        return page(request, "dlq.html", entries=entries, filters=filters)

    def dlq_entry_page(request: Request, entry_id: str, status_code: int = 200, **extra: Any) -> HTMLResponse:
        entry = api.quarantined(entry_id)
        decoded = (entry.get("value") or {}).get("decoded")
        fields_json = views.pretty(decoded["fields"]) if decoded else ""
        return page(request, "dlq_entry.html", status_code=status_code, e=entry, fields_json=fields_json, **extra)

    @app.get("/dlq/{entry_id}", response_class=HTMLResponse)
    def dlq_entry(request: Request, entry_id: str) -> HTMLResponse:
        token_of(request)
        return dlq_entry_page(request, entry_id)

    @app.post("/dlq/{entry_id}/requeue", response_class=HTMLResponse)
    def requeue(
        request: Request,
        entry_id: str,
        csrf: Annotated[str, Form()] = "",
        operator_token: Annotated[str, Form()] = "",
        value: Annotated[str, Form()] = "",
    ) -> Response:
        check_csrf(request, csrf)
        token = operator_token.strip() or token_of(request)
        sanitized: dict[str, Any] | None = None
        if value.strip():
            try:
                parsed = json.loads(value)
            except json.JSONDecodeError as exc:
                REQUEUES.labels("invalid-json").inc()
                return dlq_entry_page(
                    request,
                    entry_id,
                    status_code=422,
                    value=value,
                    requeue_error=f"The sanitized value is not valid JSON: {exc.msg} (line {exc.lineno}, "
                    f"column {exc.colno}). Nothing was sent.",
                )
            if not isinstance(parsed, dict):
                REQUEUES.labels("invalid-json").inc()
                return dlq_entry_page(
                    request,
                    entry_id,
                    status_code=422,
                    value=value,
                    requeue_error="The sanitized value must be a JSON object of the record's fields. Nothing was sent.",
                )
            sanitized = parsed
        try:
            done = api.requeue(token, entry_id, sanitized)
        except FleetApiError as exc:
            if exc.status == 0 or exc.status >= 500:
                REQUEUES.labels("error").inc()
                raise
            count_upstream(exc)
            REQUEUES.labels(f"refused-{exc.status}").inc()
            found = views.problem(exc, endpoints)
            if exc.status == 401:
                message = "The DLQ reconciler does not accept this operator token. Nothing was re-queued."
            elif exc.status == 409:
                message = f"Refused (409): {found.message}. A record is re-queued at most once."
            elif exc.status == 422:
                message = f"Refused (422): {found.message}"
            else:
                message = f"Refused ({exc.status}): {found.message}"
            return dlq_entry_page(
                request,
                entry_id,
                status_code=exc.status,
                value=value,
                requeue_error=message,
                requeue_problems=found.problems,
            )
        REQUEUES.labels("done").inc()
        to = done.get("requeuedTo") or {}
        session_of(request).flash(
            "ok",
            f"Re-queued {done.get('recordType', 'the record')} (event {done.get('eventId')}) to "
            f"{to.get('topic')}[{to.get('partition')}]@{to.get('offset')} by {done.get('requeuedBy')}"
            f"{' with the sanitized value' if done.get('sanitized') else ''}.",
        )
        return RedirectResponse(f"/dlq/{quote(entry_id)}", status_code=303)

    return app
