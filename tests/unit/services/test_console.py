"""The web console against stand-in services (an ``httpx.MockTransport`` that answers as
the policy service, audit and the DLQ reconciler do): login and logout (server-side
sessions: a copied cookie dies with the session), CSRF, approving the digest shown,
refusals in words, unreachable services, the timeline and the DLQ."""

from __future__ import annotations

import base64
import html
import json
import re
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from flotilla_ops.fleetapi import FleetApi, FleetEndpoints

from flotilla.digest import command_digest
from flotilla.fleet import AGENTS, BY_NAME, CONSOLE, FLEET
from services.console import views
from services.console.app import create_console_app
from services.console.session import COOKIE_NAME, Session, SessionStore
from services.console.settings import ConsoleSettings

POLICY = "http://policy.test"
AUDIT = "http://audit.test"
DLQ = "http://dlq.test"
EXECUTOR = "http://executor.test"

USERS = {"alice-token": ("alice", "approver"), "bob-token": ("bob", "viewer")}
OPERATORS = {"operator-token": "operator"}

INCIDENT = "incident-7"
PROPOSAL = str(uuid.UUID(int=7))
STEPS = [
    {
        "commandId": str(uuid.UUID(int=70)),
        "type": "ScaleService",
        "target": {"environment": "production", "name": "checkout-api"},
        "params": {"replicas": 12},
        "idempotencyKey": f"{INCIDENT}:scale:12",
        "expiresAt": 1_900_000_000_000,
    }
]
DIGEST = command_digest(STEPS)
ENTRY = str(uuid.UUID(int=99))


def _proposal(digest: str = DIGEST, status: str = "pending") -> dict[str, Any]:
    return {
        "proposalId": PROPOSAL,
        "incidentId": INCIDENT,
        "status": status,
        "decision": "needs-approval",
        "dryRun": False,
        "summary": "scale checkout-api from 4 to 12 replicas",
        "digest": digest,
        "steps": STEPS,
        "commands": [
            {
                "commandId": STEPS[0]["commandId"],
                "kind": "scale",
                "target": "production/checkout-api",
                "description": "scale checkout-api to 12 replicas",
                "idempotencyKey": f"{INCIDENT}:scale:12",
                "expiresAt": "2030-03-17T17:46:40+00:00",
            }
        ],
        "reasons": ["scaling beyond 2x in production needs a person"],
        "policyIds": ["production-scale-2x"],
        "decisionDetail": None,
        "requiredRole": "approver",
        "proposedBy": "remediation-agent",
        "proposedAt": "2026-01-01T10:00:00+00:00",
        "decidedAt": None,
        "deadline": "2026-01-01T10:15:00+00:00",
        "secondsLeft": 612.4,
        "resources": ["production/checkout-api"],
        "supersededBy": None,
        "resolvedBy": None,
        "resolvedAt": None,
        "resolution": None,
    }


NAMESPACES = {
    "DependencyFailureSuspected": "decisions",
    "DiagnosisConcluded": "decisions",
    "RecoveryProposed": "decisions",
    "ScaleService": "commands",
}


def _entry(seq: int, kind: str, source: str, elapsed: int, value: dict[str, Any], cause: int | None) -> dict[str, Any]:
    return {
        "seq": seq,
        "topic": "commands" if kind == "ScaleService" else "incidents",
        "partition": 2,
        "offset": 100 + seq,
        "type": f"dev.flotilla.{NAMESPACES.get(kind, 'incidents')}.{kind}",  # as audit names them
        "eventId": str(uuid.UUID(int=1000 + seq)),
        "source": f"/flotilla/{source}",
        "time": "2026-01-01T10:00:00.000Z",
        "elapsedMs": elapsed,
        "causationId": None if cause is None else str(uuid.UUID(int=1000 + cause)),
        "causedBy": None
        if cause is None
        else {"seq": cause, "type": "dev.flotilla.incidents.X", "eventId": str(uuid.UUID(int=1000 + cause))},
        "value": value,
        # as the audit marks a record whose producer's signature it verified
        "verified": True,
        "verifiedBy": source,
        "unverified": None,
    }


TIMELINE = [
    _entry(1, "ServiceLatencyIncreased", "health-agent", 0, {"service": "checkout-api", "p95LatencyMs": 1831.0}, None),
    _entry(
        2,
        "DependencyFailureSuspected",
        "diagnostic-agent",
        1520,
        {
            "service": "checkout-api",
            "suspectedDependency": "payments-api",
            "failureMode": "slow-responses",
            "reasoning": {
                "summary": "payments-api answers slowly and checkout waits on it",
                "evidence": [
                    {
                        "kind": "metric",
                        "source": "sim p95 of payments-api",
                        "description": "payments-api p95 is far above its usual level",
                        "observedValue": "1650 ms",
                    }
                ],
                "confidence": 0.86,
                "reasoner": "rules",
                "model": None,
            },
            "concludedAt": 1_767_261_601_520,
        },
        1,
    ),
    _entry(3, "HumanApprovalRequired", "policy-service", 2100, {"proposalId": PROPOSAL, "digest": DIGEST}, 2),
    _entry(4, "RecoveryApproved", "policy-service", 9000, {"approvedBy": "alice", "auto": False}, 3),
    _entry(5, "ScaleService", "policy-service", 9001, {"replicas": 12}, 4),
    _entry(6, "CommandFailed", "executor", 9200, {"errorClass": "Timeout", "errorMessage": "sim slow"}, 5),
    _entry(7, "RecoveryExecuted", "executor", 9500, {"outcome": "checkout-api scaled from 4 to 12 replicas"}, 5),
    _entry(8, "RecoveryCompleted", "health-agent", 15000, {"p95LatencyMs": 425.0, "thresholdMs": 500.0}, 7),
]


@dataclass
class StandIns:
    """The services the console talks to, in memory; records what they were sent."""

    proposal: dict[str, Any] = field(default_factory=_proposal)
    down: set[str] = field(default_factory=set)  # base URLs that refuse connections
    expired: bool = False
    requeued: bool = False
    revoked: set[str] = field(default_factory=set)
    decisions: list[tuple[str, str | None, dict[str, Any]]] = field(default_factory=list)
    requeues: list[tuple[str | None, dict[str, Any]]] = field(default_factory=list)
    calls: list[tuple[str, str, str | None]] = field(default_factory=list)  # (method, URL, bearer token)
    timeline_page: int = 500  # audit's page size
    extra: list[dict[str, Any]] = field(default_factory=list)  # records after TIMELINE (forgeries)

    def handle(self, request: httpx.Request) -> httpx.Response:
        base = f"{request.url.scheme}://{request.url.host}"
        auth = request.headers.get("authorization", "")
        token = auth.removeprefix("Bearer ") if auth.startswith("Bearer ") else None
        path = request.url.path
        self.calls.append((request.method, str(request.url), token))
        if base in self.down:
            raise httpx.ConnectError("[Errno 111] Connection refused", request=request)
        if base == POLICY:
            return self._policy(request, path, token)
        if base == AUDIT:
            return self._audit(request, path)
        if base == DLQ:
            return self._dlq(request, path, token)
        return httpx.Response(404, json={"detail": "Not Found"})

    def _policy(self, request: httpx.Request, path: str, token: str | None) -> httpx.Response:
        if token not in USERS or token in self.revoked:
            return httpx.Response(401, json={"detail": "a valid bearer token is required"})
        if path == "/me" and request.method == "GET":
            user, role = USERS[token]
            return httpx.Response(200, json={"user": user, "roles": [role]})
        if path == "/approvals" and request.method == "GET":
            status = request.url.params.get("status", "pending")
            return httpx.Response(200, json=[self.proposal] if status in ("all", self.proposal["status"]) else [])
        if path == f"/approvals/{PROPOSAL}" and request.method == "GET":
            return httpx.Response(200, json=self.proposal)
        m = re.fullmatch(r"/approvals/([^/]+)/(approve|reject)", path)
        if m and request.method == "POST":
            body = json.loads(request.content)
            self.decisions.append((m.group(2), token, body))
            user, role = USERS[token]
            if m.group(1) != PROPOSAL:
                return httpx.Response(404, json={"detail": f"no proposal {m.group(1)}", "policyIds": []})
            if role != "approver":
                return httpx.Response(403, json={"detail": f"{user} does not hold the approver role", "policyIds": []})
            if body["digest"] != self.proposal["digest"]:
                detail = f"digest mismatch: proposal {PROPOSAL} has digest {self.proposal['digest']}"
                return httpx.Response(409, json={"detail": detail, "policyIds": []})
            if m.group(2) == "approve" and body.get("changeDigest") != self.proposal.get("changeDigest"):
                detail = f"you were shown another change: proposal {PROPOSAL} binds {self.proposal['changeDigest']}"
                return httpx.Response(409, json={"detail": detail, "policyIds": []})
            if self.expired:
                detail = "approval deadline 2026-01-01T10:15:00+00:00 has passed: the proposal expired"
                return httpx.Response(409, json={"detail": detail, "policyIds": []})
            self.proposal["status"] = "approved" if m.group(2) == "approve" else "rejected"
            return httpx.Response(
                200,
                json={
                    "proposalId": PROPOSAL,
                    "incidentId": INCIDENT,
                    "status": self.proposal["status"],
                    "by": user,
                    "eventIds": [str(uuid.uuid4())],
                    "commandIds": [STEPS[0]["commandId"]],
                },
            )
        return httpx.Response(404, json={"detail": "Not Found"})

    def _audit(self, request: httpx.Request, path: str) -> httpx.Response:
        summary = {
            "incidentId": INCIDENT,
            "status": "RESOLVED",
            "firstAt": "2026-01-01T10:00:00.000Z",
            "lastAt": "2026-01-01T10:00:15.000Z",
            "entries": len(TIMELINE),
        }
        if path == "/incidents":
            return httpx.Response(200, json={"incidents": [summary]})
        if path == "/incidents/incident-forged-only/timeline":  # only unverified records name it
            nothing = {"incidentId": "incident-forged-only", "status": None, "firstAt": None, "lastAt": None}
            paging = {"after": 0, "limit": self.timeline_page, "nextAfter": None}
            return httpx.Response(200, json={**nothing, "entries": 0, "timeline": FORGERIES, "page": paging})
        if path == f"/incidents/{INCIDENT}/timeline":
            after = int(request.url.params.get("after", 0))
            rest = [e for e in TIMELINE + self.extra if e["seq"] > after]
            page, more = rest[: self.timeline_page], len(rest) > self.timeline_page
            paging = {"after": after, "limit": self.timeline_page, "nextAfter": page[-1]["seq"] if more else None}
            return httpx.Response(200, json={**summary, "timeline": page, "page": paging})
        return httpx.Response(404, json={"detail": {"error": "no audited records for incident x"}})

    def _dlq_entry(self) -> dict[str, Any]:
        return {
            "id": ENTRY,
            "status": "requeued" if self.requeued else "quarantined",
            "incidentId": INCIDENT,
            "origin": {"topic": "incidents", "partition": 2, "offset": 41},
            "dlq": {"topic": "incidents.dlq", "partition": 0, "offset": 3},
            "consumer": "policy-service",
            "reason": "invalid-record",
            "errorClass": "BusinessRuleViolation",
            "errorMessage": "replicas must be positive",
            "firstFailureTime": "2026-01-01T10:00:01Z",
            "attempts": 1,
            "originalEventId": str(uuid.UUID(int=4242)),
            "originalType": "dev.flotilla.decisions.RecoveryProposed",
            "tags": [],
            "sightings": 1,
            "factEventId": None,
            "quarantinedAt": "2026-01-01T10:00:02+00:00",
            "requeue": None,
            "headers": [
                {"name": "ce_type", "text": "dev.flotilla.decisions.RecoveryProposed", "base64": "ZGV2"},
                {"name": "dlq_reason", "text": "invalid-record", "base64": "aW52"},
                {"name": "blob", "text": None, "base64": "AAEC"},
            ],
            "key": {"text": INCIDENT, "base64": "aW5j"},
            "value": {
                "base64": "AAAAAAE=",
                "decoded": {
                    "recordType": "dev.flotilla.decisions.RecoveryProposed",
                    "schemaId": 7,
                    "fields": {"x": -1},
                },
                "decodeError": None,
            },
            "requeuedValue": None,
        }

    def _dlq(self, request: httpx.Request, path: str, token: str | None) -> httpx.Response:
        if path == "/quarantine":
            return httpx.Response(200, json={"entries": [self._dlq_entry()]})
        if path == f"/quarantine/{ENTRY}":
            return httpx.Response(200, json=self._dlq_entry())
        if path == f"/quarantine/{ENTRY}/requeue" and request.method == "POST":
            body = json.loads(request.content) if request.content else {}
            self.requeues.append((token, body))
            if token not in OPERATORS:
                return httpx.Response(401, json={"detail": {"error": "an operator bearer token is required"}})
            if self.requeued:
                return httpx.Response(409, json={"detail": {"error": "already re-queued", "id": ENTRY}})
            value = body.get("value")
            if value is not None and "x" in value:
                problems = ["x: unknown field", "replicas: missing required field"]
                error = "incidents-dev.flotilla.decisions.RecoveryProposed: record does not match its schema"
                return httpx.Response(422, json={"detail": {"error": error, "problems": problems}})
            self.requeued = True
            return httpx.Response(
                200,
                json={
                    "id": ENTRY,
                    "status": "requeued",
                    "eventId": str(uuid.UUID(int=4242)),
                    "recordType": "dev.flotilla.decisions.RecoveryProposed",
                    "sanitized": value is not None,
                    "requeuedBy": OPERATORS[token],
                    "requeuedFrom": "incidents.dlq/0@3",
                    "requeuedTo": {"topic": "incidents", "partition": 2, "offset": 57},
                },
            )
        return httpx.Response(404, json={"detail": {"error": "no such entry"}})


pytestmark = pytest.mark.usefixtures("clean_env")  # tests/conftest.py


@pytest.fixture()
def services() -> StandIns:
    return StandIns()


def _settings(**extra: Any) -> ConsoleSettings:
    return ConsoleSettings(
        policy_url=POLICY,
        audit_url=AUDIT,
        dlq_url=DLQ,
        executor_url=EXECUTOR,
        **extra,
    )


@pytest.fixture()
def client(services: StandIns) -> Iterator[TestClient]:
    settings = _settings()
    api = FleetApi(settings.endpoints(), transport=httpx.MockTransport(services.handle))
    with TestClient(create_console_app(settings, api), follow_redirects=False) as c:
        yield c
    api.close()


def csrf_of(html: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', html)
    assert found, "no CSRF field on the page"
    return found.group(1)


def login(client: TestClient, token: str = "alice-token") -> None:
    form = client.get("/login")
    done = client.post("/login", data={"token": token, "csrf": csrf_of(form.text), "next": "/approvals"})
    assert done.status_code == 303, done.text
    assert done.headers["location"] == "/approvals"


def text_of(page: str) -> str:
    """The page's text, tags dropped and whitespace collapsed (what a person reads)."""
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", page)).split())


# --------------------------------------------------------------------- surface


def test_console_is_a_fleet_member_but_not_an_agent() -> None:
    assert CONSOLE in FLEET and CONSOLE not in AGENTS
    assert BY_NAME["console"] == CONSOLE
    assert (CONSOLE.module, CONSOLE.database, CONSOLE.http_port) == ("services.console", None, 18108)


def test_settings_defaults_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    defaults = ConsoleSettings.load()
    assert (defaults.service_name, defaults.http_host, defaults.http_port) == ("console", "127.0.0.1", 18108)
    assert (defaults.console_session_hours, defaults.console_max_sessions) == (8.0, 1000)
    assert defaults.console_max_anonymous_sessions == 10000
    assert defaults.policy_url == "http://127.0.0.1:18104"
    monkeypatch.setenv("FLOTILLA_CONSOLE_MAX_SESSIONS", "50")
    monkeypatch.setenv("FLOTILLA_POLICY_URL", "http://policy:8080")
    monkeypatch.setenv("FLOTILLA_HTTP_PORT", "9000")
    configured = ConsoleSettings.load()
    assert configured.console_max_sessions == 50
    assert configured.endpoints().policy_url == "http://policy:8080"
    assert configured.http_port == 9000


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("FLOTILLA_CONSOLE_MAX_SESSIONS", "0"),
        ("FLOTILLA_CONSOLE_MAX_ANONYMOUS_SESSIONS", "-1"),
        ("FLOTILLA_CONSOLE_SESSION_HOURS", "0"),
    ],
)
def test_unbounded_or_empty_session_limits_are_refused(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(ValueError, match=variable.removeprefix("FLOTILLA_").lower()):
        ConsoleSettings.load()


def test_operational_endpoints(client: TestClient) -> None:
    health = client.get("/healthz")
    assert health.json() == {"status": "ok", "service": "console"}
    assert "set-cookie" not in health.headers  # probes get no session
    assert client.get("/readyz").status_code == 200
    metrics = client.get("/metrics")
    assert metrics.status_code == 200
    assert "flotilla_console_decisions_total" in metrics.text
    assert client.app.state.sessions.counts() == (0, 0)  # type: ignore[attr-defined]


# ----------------------------------------------------------------------- session


def _token_leaks(cookie: str, token: str) -> bool:
    """Whether ``token`` can be read off ``cookie``: as is, or base64url-decoding any part."""
    if token in cookie:
        return True
    for part in cookie.split("."):
        for start in range(4):  # every alignment, so a token inside a longer base64 text is found
            chunk = part[start:]
            chunk = chunk[: len(chunk) - len(chunk) % 4]
            try:
                if token.encode() in base64.urlsafe_b64decode(chunk):
                    return True
            except ValueError:
                continue
    return False


class FakeClock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def _signed_in(clock: FakeClock, lifetime_s: float = 60, token: str = "alice-token") -> Session:
    return Session.fresh(lifetime_s, token=token, user="alice", roles=("approver",), now=clock())


def test_the_store_gives_each_session_a_random_id_that_carries_nothing() -> None:
    store = SessionStore(capacity=10, anonymous_capacity=10)
    session = Session.fresh(60, token="alice-secret-bearer-token", user="alice", roles=("approver",))
    first, second = store.open(session), store.open(session)
    assert first != second and re.fullmatch(r"[A-Za-z0-9_-]{43}", first)
    assert not _token_leaks(first, "alice-secret-bearer-token") and not _token_leaks(first, "alice")
    assert store.get(first) is session
    loaded = store.get(first)
    assert loaded is not None and loaded.who == "alice (approver)" and loaded.holds("approver")
    assert not loaded.holds("operator")
    for made_up in (None, "", "garbage", first[:-1], first + "A", "é" * 43, first[:-1] + "!", "A" * 4096):
        assert store.get(made_up) is None, made_up
        store.close(made_up)  # a no-op, never an error
    assert store.get(first) is session


def test_closing_a_session_ends_it_for_every_copy_of_its_id() -> None:
    store = SessionStore(capacity=10, anonymous_capacity=10)
    signed_in, anonymous = store.open(Session.fresh(60, token="alice-token")), store.open(Session.fresh(60))
    store.close(signed_in)
    store.close(anonymous)
    assert store.get(signed_in) is None and store.get(anonymous) is None
    assert store.counts() == (0, 0)


def test_a_session_ends_at_its_absolute_expiry_however_often_it_is_used() -> None:
    clock = FakeClock()
    store = SessionStore(capacity=10, anonymous_capacity=10, clock=clock)
    session_id = store.open(_signed_in(clock, lifetime_s=60))
    for _ in range(5):  # use does not extend it
        clock.now += 10
        assert store.get(session_id) is not None
    clock.now += 10
    assert store.get(session_id) is None
    assert store.counts() == (0, 0)  # and it is dropped, not kept
    already_over = _signed_in(clock, lifetime_s=-1)
    assert store.get(store.open(already_over)) is None


def test_a_full_store_ends_the_least_recently_used_session() -> None:
    clock = FakeClock()
    store = SessionStore(capacity=3, anonymous_capacity=3, clock=clock)
    ids = [store.open(_signed_in(clock, token=f"t{i}")) for i in range(3)]
    assert store.get(ids[0]) is not None  # used: now the most recent
    newest = store.open(_signed_in(clock, token="t3"))
    assert store.get(ids[1]) is None  # the least recently used went
    assert all(store.get(i) is not None for i in (ids[0], ids[2], newest))
    assert store.counts() == (3, 0)


def test_expired_sessions_go_before_live_ones_when_the_store_is_full() -> None:
    clock = FakeClock()
    store = SessionStore(capacity=2, anonymous_capacity=2, clock=clock)
    short = store.open(_signed_in(clock, lifetime_s=5))
    long = store.open(_signed_in(clock, lifetime_s=600))
    assert store.get(short) is not None  # the short one is the most recently used ...
    clock.now += 10
    third = store.open(_signed_in(clock, lifetime_s=600))
    assert store.get(long) is not None and store.get(third) is not None  # ... but it had expired


def test_a_flood_of_anonymous_visitors_never_pushes_out_a_signed_in_person() -> None:
    clock = FakeClock()
    store = SessionStore(capacity=1, anonymous_capacity=5, clock=clock)
    alice = store.open(_signed_in(clock))
    for _ in range(1000):
        store.open(Session.fresh(60, now=clock()))
    assert store.get(alice) is not None
    assert store.counts() == (1, 5)


def test_the_store_is_safe_to_share_between_threads() -> None:
    store = SessionStore(capacity=50, anonymous_capacity=50)
    failures: list[BaseException] = []

    def churn() -> None:
        try:
            for n in range(2000):
                session_id = store.open(Session.fresh(60, token="t" if n % 2 else None))
                store.get(session_id)
                if n % 3 == 0:
                    store.close(session_id)
        except BaseException as exc:  # reported below, whatever it is
            failures.append(exc)

    threads = [threading.Thread(target=churn) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []
    signed_in, anonymous = store.counts()
    assert signed_in <= 50 and anonymous <= 50


def test_capacities_below_one_are_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        SessionStore(capacity=0, anonymous_capacity=10)


def test_pages_need_a_login(client: TestClient) -> None:
    for path in ("/approvals", f"/approvals/{PROPOSAL}", "/incidents", f"/incidents/{INCIDENT}", "/dlq"):
        answer = client.get(path)
        assert answer.status_code == 303, path
        assert answer.headers["location"].startswith("/login?next=")


def test_login_sets_an_opaque_httponly_strict_cookie_and_starts_a_new_session(client: TestClient) -> None:
    form = client.get("/login")
    anonymous = client.cookies.get(COOKIE_NAME)
    done = client.post("/login", data={"token": "alice-token", "csrf": csrf_of(form.text), "next": "/approvals"})
    set_cookie = done.headers["set-cookie"].lower()
    assert "httponly" in set_cookie and "samesite=strict" in set_cookie and "path=/" in set_cookie
    assert "secure" not in set_cookie.replace("samesite", "")  # not behind HTTPS in this test
    assert "max-age=28800" in set_cookie or "max-age=2879" in set_cookie  # the absolute 8 h
    cookie = client.cookies.get(COOKIE_NAME)
    assert cookie and cookie != anonymous and re.fullmatch(r"[A-Za-z0-9_-]{43}", cookie)
    assert not _token_leaks(cookie, "alice-token")
    page = client.get("/approvals")
    assert page.status_code == 200
    assert "signed in as alice (approver)" in page.text and "Signed in as alice." in page.text
    # a new session: the CSRF token of the login form is no longer valid, nor the id it had
    assert csrf_of(page.text) != csrf_of(form.text)
    sessions: SessionStore = client.app.state.sessions  # type: ignore[attr-defined]
    assert sessions.get(anonymous) is None
    assert sessions.counts() == (1, 0)


def test_the_cookie_is_secure_when_configured(services: StandIns) -> None:
    settings = _settings(console_cookie_secure=True)
    api = FleetApi(settings.endpoints(), transport=httpx.MockTransport(services.handle))
    with TestClient(create_console_app(settings, api), follow_redirects=False) as secure:
        assert "; secure" in secure.get("/login").headers["set-cookie"].lower()


def _with_cookie(client: TestClient, cookie: str) -> TestClient:
    """``client`` presenting exactly ``cookie`` (whatever the last response set)."""
    client.cookies.clear()
    client.cookies.set(COOKIE_NAME, cookie)
    return client


def test_logout_ends_the_session_on_the_server_so_a_copied_cookie_opens_nothing(
    client: TestClient, services: StandIns
) -> None:
    login(client)
    page = client.get(f"/approvals/{PROPOSAL}")
    copied, copied_csrf = client.cookies.get(COOKIE_NAME), csrf_of(page.text)
    assert copied is not None
    assert _with_cookie(client, copied).get("/approvals").status_code == 200  # the copy works before logout

    out = client.post("/logout", data={"csrf": copied_csrf})
    assert out.status_code == 303 and out.headers["location"] == "/login"
    signed_out = out.cookies.get(COOKIE_NAME)
    assert signed_out and signed_out != copied
    assert "Signed out." in _with_cookie(client, signed_out).get("/login").text
    assert client.get("/approvals").status_code == 303
    after_logout = len(services.calls)

    # whoever kept a copy of the cookie (and the page's CSRF token) replays it
    for path in ("/approvals", f"/approvals/{PROPOSAL}", f"/incidents/{INCIDENT}", "/dlq", f"/dlq/{ENTRY}"):
        answer = _with_cookie(client, copied).get(path)
        assert answer.status_code == 303 and answer.headers["location"].startswith("/login"), path
    for path, data in (
        (f"/approvals/{PROPOSAL}/approve", {"csrf": copied_csrf, "digest": DIGEST}),
        (f"/approvals/{PROPOSAL}/reject", {"csrf": copied_csrf, "digest": DIGEST, "reason": "x"}),
        (f"/dlq/{ENTRY}/requeue", {"csrf": copied_csrf, "value": ""}),
        ("/logout", {"csrf": copied_csrf}),
    ):
        answer = _with_cookie(client, copied).post(path, data=data)
        assert answer.status_code == 403 and "CSRF" in answer.text, path  # refused before anything is sent
    assert services.decisions == [] and services.requeues == []
    assert [c for c in services.calls[after_logout:] if c[2] == "alice-token"] == []
    assert [c for c in services.calls[after_logout:] if c[1].startswith(POLICY)] == []


def test_a_session_past_its_expiry_is_signed_out(client: TestClient) -> None:
    login(client)
    sessions: SessionStore = client.app.state.sessions  # type: ignore[attr-defined]
    session = sessions.get(client.cookies.get(COOKIE_NAME))
    assert session is not None
    session.expires = time.time() - 1
    answer = client.get("/approvals")
    assert answer.status_code == 303 and answer.headers["location"].startswith("/login")


def test_login_with_an_unknown_token_is_refused(client: TestClient) -> None:
    form = client.get("/login")
    answer = client.post("/login", data={"token": "nobody-token", "csrf": csrf_of(form.text)})
    assert answer.status_code == 401
    assert "The policy service does not accept this token." in answer.text
    assert client.get("/approvals").status_code == 303
    assert client.app.state.sessions.counts()[0] == 0  # type: ignore[attr-defined]


def test_login_redirects_only_within_the_console(client: TestClient) -> None:
    form = client.get("/login?next=//evil.example/x")
    assert 'name="next" value="/approvals"' in form.text
    done = client.post(
        "/login", data={"token": "alice-token", "csrf": csrf_of(form.text), "next": "https://evil.example/"}
    )
    assert done.headers["location"] == "/approvals"


def test_posts_without_the_csrf_token_are_refused(client: TestClient, services: StandIns) -> None:
    assert client.get("/login").status_code == 200
    assert client.post("/login", data={"token": "alice-token"}).status_code == 403
    login(client)
    for path, data in (
        (f"/approvals/{PROPOSAL}/approve", {"digest": DIGEST}),
        (f"/approvals/{PROPOSAL}/reject", {"digest": DIGEST, "csrf": "forged"}),
        (f"/dlq/{ENTRY}/requeue", {"operator_token": "operator-token"}),
        ("/logout", {}),
    ):
        answer = client.post(path, data=data)
        assert answer.status_code == 403, path
        assert "CSRF" in answer.text
    assert services.decisions == [] and services.requeues == []
    assert client.get("/approvals").status_code == 200  # still signed in


def test_a_tampered_cookie_is_an_anonymous_session(client: TestClient) -> None:
    login(client)
    cookie = client.cookies.get(COOKIE_NAME)
    assert cookie is not None
    tampered = cookie[:-3] + ("xyz" if not cookie.endswith("xyz") else "abc")
    assert _with_cookie(client, tampered).get("/approvals").status_code == 303
    assert _with_cookie(client, cookie).get("/approvals").status_code == 200  # the real one still works


def test_unknown_and_old_cookies_are_anonymous_sessions(client: TestClient, services: StandIns) -> None:
    other_console = SessionStore(capacity=1, anonymous_capacity=1).open(Session.fresh(60, token="alice-token"))
    for cookie in (
        other_console,  # a session of another replica, or of this console before a restart
        "A" * 43,  # made up
        "gAAAAABmZ2VybmV0LXNlc3Npb24tY29va2llLWZyb20tYmVmb3Jl",  # the former encrypted-cookie format
        "eyJ0b2siOiJhbGljZS10b2tlbiJ9.c2lnbmF0dXJl",  # the signed-only format before that
    ):
        answer = _with_cookie(client, cookie).get("/approvals")
        assert answer.status_code == 303 and answer.headers["location"].startswith("/login")
        assert f"{COOKIE_NAME}=" in answer.headers["set-cookie"]  # a fresh, anonymous session
        assert cookie not in answer.headers["set-cookie"]
    assert not [c for c in services.calls if c[2] == "alice-token"]


# --------------------------------------------------------------------- approvals


def test_pending_approvals_are_listed(client: TestClient) -> None:
    login(client)
    page = client.get("/approvals")
    assert page.status_code == 200
    assert "scale checkout-api from 4 to 12 replicas" in page.text
    assert f"/approvals/{PROPOSAL}" in page.text
    assert 'data-seconds-left="612.4"' in page.text


def test_the_approval_page_shows_the_full_context(client: TestClient) -> None:
    login(client)
    page = client.get(f"/approvals/{PROPOSAL}")
    assert page.status_code == 200
    text = text_of(page.text)
    assert DIGEST in text and "matches the steps shown" in text
    assert "scale checkout-api to 12 replicas" in text and f"{INCIDENT}:scale:12" in text
    assert "scaling beyond 2x in production needs a person" in text and "production-scale-2x" in text
    # evidence from the diagnosis record in the audit timeline
    assert "payments-api p95 is far above its usual level" in text and "1650 ms" in text
    assert "confidence 0.86" in text and "payments-api answers slowly" in text
    assert "DependencyFailureSuspected" in text and "ServiceLatencyIncreased" in text
    assert 'data-seconds-left="612.4"' in page.text
    assert f'name="digest" value="{DIGEST}"' in page.text


def test_approve_sends_the_digest_shown_and_leads_to_the_timeline(client: TestClient, services: StandIns) -> None:
    login(client)
    page = client.get(f"/approvals/{PROPOSAL}")
    shown = re.search(r'id="shown-digest">([^<]+)<', page.text)
    assert shown is not None
    answer = client.post(f"/approvals/{PROPOSAL}/approve", data={"csrf": csrf_of(page.text), "digest": shown.group(1)})
    assert answer.status_code == 303 and answer.headers["location"] == f"/incidents/{INCIDENT}"
    assert services.decisions == [("approve", "alice-token", {"digest": shown.group(1)})]
    timeline = client.get(answer.headers["location"])
    assert "Approved by alice" in timeline.text


CHANGE_DIGEST = "sha256:" + "c" * 64


def test_the_page_shows_the_exact_change_and_approves_the_change_digest_shown(
    client: TestClient, services: StandIns
) -> None:
    services.proposal["changeDigest"] = CHANGE_DIGEST
    services.proposal["commands"][0]["change"] = {"lines": ["replicas: 4 → 12"], "digest": "sha256:" + "d" * 64}
    login(client)
    page = client.get(f"/approvals/{PROPOSAL}")
    assert "replicas: 4 → 12" in text_of(page.text) and CHANGE_DIGEST in page.text
    posted = re.search(r'name="change_digest" value="([^"]+)"', page.text)
    assert posted is not None and posted.group(1) == CHANGE_DIGEST
    form = {"csrf": csrf_of(page.text), "digest": DIGEST, "change_digest": posted.group(1)}
    answer = client.post(f"/approvals/{PROPOSAL}/approve", data=form)
    assert answer.status_code == 303 and answer.headers["location"] == f"/incidents/{INCIDENT}"
    assert services.decisions == [("approve", "alice-token", {"digest": DIGEST, "changeDigest": CHANGE_DIGEST})]


def test_a_change_that_differs_from_the_one_shown_is_refused_with_a_clear_message(
    client: TestClient, services: StandIns
) -> None:
    services.proposal["changeDigest"] = CHANGE_DIGEST
    login(client)
    page = client.get(f"/approvals/{PROPOSAL}")
    services.proposal["changeDigest"] = "sha256:" + "e" * 64  # another dry run than the page showed
    form = {"csrf": csrf_of(page.text), "digest": DIGEST, "change_digest": CHANGE_DIGEST}
    client.post(f"/approvals/{PROPOSAL}/approve", data=form)
    text = text_of(client.get(f"/approvals/{PROPOSAL}").text)
    assert "Refused (409 another change)" in text and "Nothing was approved" in text


def test_a_target_that_cannot_dry_run_says_so_on_the_page(client: TestClient, services: StandIns) -> None:
    why = "the sim cannot dry-run a change: what it does is the step's own description"
    services.proposal["commands"][0]["change"] = {"unavailable": why}
    login(client)
    page = client.get(f"/approvals/{PROPOSAL}")
    assert why in text_of(page.text)
    assert 'name="change_digest"' not in page.text


def test_reject_sends_the_digest_and_the_reason(client: TestClient, services: StandIns) -> None:
    login(client)
    page = client.get(f"/approvals/{PROPOSAL}")
    client.post(
        f"/approvals/{PROPOSAL}/reject",
        data={"csrf": csrf_of(page.text), "digest": DIGEST, "reason": "wrong service"},
    )
    assert services.decisions == [("reject", "alice-token", {"digest": DIGEST, "reason": "wrong service"})]


def _decide_and_read(client: TestClient, digest: str = DIGEST) -> str:
    page = client.get(f"/approvals/{PROPOSAL}")
    answer = client.post(f"/approvals/{PROPOSAL}/approve", data={"csrf": csrf_of(page.text), "digest": digest})
    assert answer.status_code == 303 and answer.headers["location"] == f"/approvals/{PROPOSAL}"
    return text_of(client.get(answer.headers["location"]).text)


def test_a_viewer_is_warned_before_deciding(client: TestClient) -> None:
    login(client, "bob-token")
    page = text_of(client.get(f"/approvals/{PROPOSAL}").text)
    assert "You (bob (viewer)) do not hold the approver role" in page
    login(client)
    assert "do not hold" not in client.get(f"/approvals/{PROPOSAL}").text


def test_the_proposer_is_warned_before_deciding(client: TestClient, services: StandIns) -> None:
    services.proposal["proposedBy"] = "alice"
    login(client)
    assert "You (alice) proposed this plan" in text_of(client.get(f"/approvals/{PROPOSAL}").text)


def test_a_viewer_is_refused_with_a_clear_message(client: TestClient, services: StandIns) -> None:
    login(client, "bob-token")
    text = _decide_and_read(client)
    assert "Refused (403)" in text and "bob does not hold the approver role" in text
    assert services.proposal["status"] == "pending"


def test_a_changed_proposal_is_a_digest_mismatch(client: TestClient, services: StandIns) -> None:
    login(client)
    page = client.get(f"/approvals/{PROPOSAL}")
    services.proposal["digest"] = "sha256:" + "0" * 64  # the commands changed after the page was shown
    client.post(f"/approvals/{PROPOSAL}/approve", data={"csrf": csrf_of(page.text), "digest": DIGEST})
    text = text_of(client.get(f"/approvals/{PROPOSAL}").text)
    assert "Refused (409 digest mismatch)" in text and "Nothing was approved" in text
    assert services.decisions[0][2] == {"digest": DIGEST}


def test_an_expired_proposal_is_refused_with_a_clear_message(client: TestClient, services: StandIns) -> None:
    services.expired = True
    login(client)
    text = _decide_and_read(client)
    assert "Refused (409 expired)" in text and "deadline has passed" in text


def test_a_digest_that_does_not_match_the_steps_is_flagged(client: TestClient, services: StandIns) -> None:
    services.proposal["digest"] = "sha256:" + "1" * 64
    login(client)
    assert "does not match the steps shown" in client.get(f"/approvals/{PROPOSAL}").text


def test_a_revoked_token_signs_the_person_out(client: TestClient, services: StandIns) -> None:
    login(client)
    copied = client.cookies.get(COOKIE_NAME)
    assert copied is not None
    services.revoked.add("alice-token")
    answer = client.get("/approvals")
    assert answer.status_code == 303 and answer.headers["location"] == "/login"
    assert "no longer accepts your token" in client.get("/login").text
    assert client.get("/approvals").status_code == 303
    # that session is gone for good: even with the token accepted again, its old cookie opens nothing
    services.revoked.clear()
    assert _with_cookie(client, copied).get("/approvals").status_code == 303


# ----------------------------------------------------------------- unreachable


def test_an_unreachable_policy_service_is_a_page_not_a_traceback(client: TestClient, services: StandIns) -> None:
    services.down.add(POLICY)
    form = client.get("/login")
    refused = client.post("/login", data={"token": "alice-token", "csrf": csrf_of(form.text)})
    assert refused.status_code == 503
    assert "policy service unreachable" in refused.text
    services.down.clear()
    login(client)
    services.down.add(POLICY)
    for path in ("/approvals", f"/approvals/{PROPOSAL}"):
        page = client.get(path)
        assert page.status_code == 503, path
        assert "policy service unreachable" in page.text
        assert "Traceback" not in page.text
    page = client.get(f"/approvals/{PROPOSAL}")
    answer = client.post(f"/approvals/{PROPOSAL}/approve", data={"csrf": csrf_of(page.text), "digest": DIGEST})
    assert answer.status_code == 503 and "policy service unreachable" in answer.text


def test_an_unreachable_audit_service(client: TestClient, services: StandIns) -> None:
    login(client)
    services.down.add(AUDIT)
    for path in ("/incidents", f"/incidents/{INCIDENT}"):
        page = client.get(path)
        assert page.status_code == 503 and "audit service unreachable" in page.text
    # the approval itself still shows, with the timeline's problem in its place
    page = client.get(f"/approvals/{PROPOSAL}")
    assert page.status_code == 200 and "audit service unreachable" in page.text


def test_an_unreachable_dlq_reconciler(client: TestClient, services: StandIns) -> None:
    login(client)
    services.down.add(DLQ)
    page = client.get("/dlq")
    assert page.status_code == 503 and "DLQ reconciler unreachable" in page.text


# ------------------------------------------------------------------- incidents


def test_incident_list(client: TestClient) -> None:
    login(client)
    page = client.get("/incidents")
    assert page.status_code == 200
    assert f"/incidents/{INCIDENT}" in page.text and "RESOLVED" in page.text
    assert f"/approvals/{PROPOSAL}" in page.text  # awaiting approval badge


def test_the_timeline_shows_every_record_and_the_outcome(client: TestClient) -> None:
    login(client)
    page = client.get(f"/incidents/{INCIDENT}")
    assert page.status_code == 200
    for entry in TIMELINE:
        assert f'id="seq-{entry["seq"]}"' in page.text
        assert f'data-type="{entry["type"].rsplit(".", 1)[-1]}"' in page.text
        assert entry["source"] in page.text
    text = text_of(page.text)
    assert "+9500 ms" in text and "checkout-api scaled from 4 to 12 replicas" in text
    assert "CommandFailed" in text and "Timeout sim slow" in text
    assert "RecoveryCompleted" in text and "p95 425.0 ms" in text
    assert 'href="#seq-5"' in page.text  # causation links to the causing entry
    for kind in ("RecoveryApproved", "CommandFailed", "RecoveryExecuted", "RecoveryCompleted"):
        assert '<li class="tone-' in page.text and f'data-type="{kind}"><a href="#seq-' in page.text, kind
    assert 'class="tone-bad" data-type="CommandFailed"' in page.text
    assert "2026-01-01T10:00:01.520Z" in text  # a timestamp field decoded
    assert "suspectedDependency" in text and "payments-api" in text


def test_a_long_timeline_is_shown_a_page_at_a_time(client: TestClient, services: StandIns) -> None:
    services.timeline_page = 5
    login(client)
    first = client.get(f"/incidents/{INCIDENT}")
    assert first.status_code == 200
    assert [f'id="seq-{n}"' in first.text for n in range(1, 9)] == [True] * 5 + [False] * 3
    assert 'id="next-page" href="/incidents/incident-7?after=5"' in first.text and "first-page" not in first.text
    assert 'id="auto-refresh" data-seconds="3" >' in first.text  # no refreshing a page new records never reach
    second = client.get(f"/incidents/{INCIDENT}?after=5")
    assert [f'id="seq-{n}"' in second.text for n in range(1, 9)] == [False] * 5 + [True] * 3
    assert 'id="first-page"' in second.text and "next-page" not in second.text
    assert "this page: 3 records after #5" in text_of(second.text)
    audit_calls = [c[1] for c in services.calls if c[1].startswith(AUDIT)]
    assert audit_calls[-2:] == [
        f"{AUDIT}/incidents/{INCIDENT}/timeline",
        f"{AUDIT}/incidents/{INCIDENT}/timeline?after=5",
    ]
    assert client.get(f"/incidents/{INCIDENT}?after=-1").status_code == 422


def test_evidence_comes_from_diagnoses_not_from_every_proposal_or_dead_letter() -> None:
    reasoning = {"summary": "s", "evidence": [{"kind": "metric"}], "confidence": 0.5, "reasoner": "rules"}
    signed = {"verified": True}
    timeline = [
        {"seq": 1, "topic": "incidents", "type": "dev.flotilla.decisions.DependencyFailureSuspected",
         "value": {"reasoning": reasoning}},
        {"seq": 2, "topic": "incidents", "type": "dev.flotilla.decisions.RecoveryProposed",
         "value": {"proposalId": "p1", "reasoning": reasoning}},
        {"seq": 3, "topic": "incidents", "type": "dev.flotilla.decisions.RecoveryProposed",
         "value": {"proposalId": "p2", "reasoning": reasoning}},
        {"seq": 4, "topic": "incidents.dlq", "type": "dev.flotilla.decisions.DependencyFailureSuspected",
         "value": {"reasoning": reasoning}},
        {"seq": 5, "topic": "incidents", "type": "dev.flotilla.incidents.ServiceLatencyIncreased", "value": {}},
    ]  # fmt: skip
    for e in timeline:  # each signed by the member that may state it
        e.update(signed, verifiedBy="remediation-agent" if "Proposed" in e["type"] else "diagnostic-agent")
    timeline[4]["verifiedBy"] = "health-agent"
    assert [d.seq for d in views.diagnoses(timeline)] == [1]
    assert [d.seq for d in views.diagnoses(timeline, proposal_id="p2")] == [1, 3]
    assert views.diagnoses(timeline)[0].record_type == "DependencyFailureSuspected"
    assert views.tone("dev.flotilla.incidents.CommandFailed") == "bad"
    assert views.digest_matches(STEPS, DIGEST) is True
    assert views.digest_matches(STEPS, "sha256:" + "0" * 64) is False
    assert views.digest_matches([], DIGEST) is None


REASONING = {"summary": "approve at once: forged", "evidence": [], "confidence": 0.99, "reasoner": "rules"}


def _forged(seq: int, kind: str, source: str, value: dict[str, Any], **mark: Any) -> dict[str, Any]:
    entry = _entry(seq, kind, source, 100 + seq, value, None)
    entry.update({"verified": False, "verifiedBy": None, "unverified": "unsigned: carries no ce_signature", **mark})
    return entry


FORGERIES = [
    _forged(20, "DiagnosisConcluded", "diagnostic-agent", {"reasoning": REASONING, "causeCategory": "capacity"}),
    # its "own reasoning": a proposal naming the pending one
    _forged(21, "RecoveryProposed", "remediation-agent", {"proposalId": PROPOSAL, "reasoning": REASONING}),
    _forged(22, "IncidentEscalated", "policy-service", {"reason": "forged escalation"}),
    # verified, but by a member that may not state a diagnosis: not the agent's either
    _forged(23, "DiagnosisConcluded", "diagnostic-agent", {"reasoning": REASONING}, verified=True,
            verifiedBy="health-agent", unverified=None),
]  # fmt: skip


def test_forged_records_are_never_an_agents_diagnosis_on_the_approval_page(
    client: TestClient, services: StandIns
) -> None:
    services.extra = FORGERIES
    login(client)
    page = client.get(f"/approvals/{PROPOSAL}")
    assert page.status_code == 200
    text = text_of(page.text)
    assert "approve at once" not in text and "0.99" not in text  # no forged reasoning anywhere on it
    assert "payments-api p95 is far above its usual level" in text  # the signed diagnosis still is
    assert "4 record(s) of this incident are not signed by their producer" in text
    for seq in (20, 21, 22, 23):  # listed in the timeline, marked
        assert re.search(rf'<tr class="[^"]*unverified"><td>{seq}</td>', page.text), seq
    assert not re.search(r'<tr class="[^"]*unverified"><td>2</td>', page.text)


def test_forged_records_are_marked_in_the_timeline_and_are_no_outcome(client: TestClient, services: StandIns) -> None:
    services.extra = FORGERIES
    login(client)
    page = client.get(f"/incidents/{INCIDENT}")
    assert page.status_code == 200
    evidence = page.text.split('id="evidence"', 1)[1].split("</section>", 1)[0]
    assert "approve at once" not in evidence and "payments-api answers slowly" in evidence
    outcome = page.text.split('id="outcome"', 1)[1].split("</section>", 1)[0]
    assert "IncidentEscalated" not in outcome and "forged escalation" not in outcome
    for seq in (20, 21, 22, 23):
        row = page.text.split(f'id="seq-{seq}"', 1)[1].split("</tr>", 1)[0]
        assert 'data-verified="false"' in row and "unverified" in row, seq
    assert "unsigned: carries no ce_signature" in text_of(page.text)
    assert (
        'id="seq-2" class="entry tone-plain" data-type="DependencyFailureSuspected" data-verified="true"' in page.text
    )


def test_an_incident_only_forgeries_name_has_no_status(client: TestClient) -> None:
    login(client)
    page = client.get("/incidents/incident-forged-only")
    assert page.status_code == 200
    text = text_of(page.text)
    assert "no verified record" in text and "nothing here is a fact" in text and "None" not in text
    assert 'id="incident-status"' in page.text and "4 unverified on this page" in text
    assert "approve at once" not in page.text.split('id="evidence"', 1)[1].split("</section>", 1)[0]


def test_views_believe_only_a_signature_of_a_member_that_may_state_the_type() -> None:
    signed = TIMELINE[1]
    assert views.believed(signed) and views.unverified_note(signed) is None
    assert not views.believed({**signed, "verified": False})
    assert not views.believed({**signed, "verifiedBy": "health-agent"})  # not a diagnostic agent
    assert not views.believed({k: v for k, v in signed.items() if k not in ("verified", "verifiedBy")})  # old audit
    assert views.unverified_note(FORGERIES[0]) == "unsigned: carries no ce_signature"
    assert [d.seq for d in views.diagnoses([*TIMELINE, *FORGERIES], proposal_id=PROPOSAL)] == [2]
    assert [e["seq"] for e in views.outcomes([*TIMELINE, *FORGERIES])] == [4, 6, 7, 8]


def test_an_unknown_incident_is_a_404_page(client: TestClient) -> None:
    login(client)
    page = client.get("/incidents/incident-404")
    assert page.status_code == 404 and "no audited records" in page.text


# -------------------------------------------------------------------------- DLQ


def test_dlq_list_and_detail(client: TestClient) -> None:
    login(client)
    listing = client.get("/dlq?status=quarantined")
    assert listing.status_code == 200 and f"/dlq/{ENTRY}" in listing.text and "invalid-record" in listing.text
    detail = client.get(f"/dlq/{ENTRY}")
    text = text_of(detail.text)
    assert "BusinessRuleViolation" in text and "replicas must be positive" in text
    assert "dlq_reason" in text and "(binary) AAEC" in text
    assert "schema id 7" in text and '"x": -1' in html.unescape(detail.text)


def test_requeue_with_an_operator_token(client: TestClient, services: StandIns) -> None:
    login(client)
    page = client.get(f"/dlq/{ENTRY}")
    answer = client.post(
        f"/dlq/{ENTRY}/requeue", data={"csrf": csrf_of(page.text), "operator_token": "operator-token", "value": ""}
    )
    assert answer.status_code == 303
    assert services.requeues == [("operator-token", {})]
    assert "Re-queued dev.flotilla.decisions.RecoveryProposed" in client.get(f"/dlq/{ENTRY}").text


def test_requeue_problems_are_shown(client: TestClient, services: StandIns) -> None:
    login(client)
    csrf = csrf_of(client.get(f"/dlq/{ENTRY}").text)
    # not JSON: nothing is sent
    bad_json = client.post(
        f"/dlq/{ENTRY}/requeue", data={"csrf": csrf, "operator_token": "operator-token", "value": "{x"}
    )
    assert bad_json.status_code == 422 and "not valid JSON" in bad_json.text
    assert services.requeues == []
    # the schema refuses the sanitized value: the problems, by field, and the text kept
    refused = client.post(
        f"/dlq/{ENTRY}/requeue", data={"csrf": csrf, "operator_token": "operator-token", "value": '{"x": 1}'}
    )
    assert refused.status_code == 422
    assert "x: unknown field" in refused.text and "replicas: missing required field" in refused.text
    assert '>{"x": 1}</textarea>' in html.unescape(refused.text)
    # an unknown operator token: refused, and the person stays signed in
    unknown = client.post(f"/dlq/{ENTRY}/requeue", data={"csrf": csrf, "operator_token": "nope", "value": ""})
    assert unknown.status_code == 401 and "does not accept this operator token" in unknown.text
    assert client.get("/approvals").status_code == 200
    # a second re-queue
    services.requeued = True
    again = client.post(f"/dlq/{ENTRY}/requeue", data={"csrf": csrf, "operator_token": "operator-token", "value": ""})
    assert again.status_code == 409 and "already re-queued" in again.text


def test_the_endpoints_name_their_service() -> None:
    endpoints = FleetEndpoints(policy_url=POLICY, audit_url=AUDIT, dlq_url=DLQ, executor_url=EXECUTOR)
    assert endpoints.service_of(f"{POLICY}/approvals") == "policy service"
    assert endpoints.service_of(f"{DLQ}/quarantine/1") == "DLQ reconciler"
    assert endpoints.service_of("http://elsewhere/x") == "http://elsewhere/x"
