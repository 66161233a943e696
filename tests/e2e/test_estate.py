"""The fleet on a real estate's interfaces: the stack's Prometheus (scraping the sim) and
Alertmanager (its rules, and its webhook to the health agent), never the sim's own API.

Alerts are given to Alertmanager itself (its API, as Prometheus gives them), which
groups, delivers, repeats (every 10 s locally) and resolves them as it would in an estate.
"""

from __future__ import annotations

import contextlib
import json
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from dotenv import dotenv_values

from flotilla.fleet import HEALTH, url
from flotilla.settings import default_env_file
from tests.support.scripts import load_script
from tests.unit.test_http_body_limit import exchange

from .fleet import Fleet, HttpError, Watch, http, open_incident

pytestmark = pytest.mark.timeout(300)

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def stackctl() -> Any:
    return load_script("_e2e_stackctl", REPO / "infra" / "local" / "stackctl.py")


def webhook_token() -> str:
    """The token the stack's Alertmanager presents to the health agent (also what lists
    what it delivered: ``GET /alerts`` is for the same token holders)."""
    path = dotenv_values(default_env_file())["FLOTILLA_ALERT_WEBHOOK_TOKEN_FILE"]
    assert path, "the stack env file names no alert webhook token"
    return Path(path).read_text().strip()


@pytest.fixture(scope="module")
def alert_token() -> str:
    return webhook_token()


class Alerts:
    """Alerts given to the stack's Alertmanager, each with a label of its own so that its
    fingerprint is this test's; resolved at the end (Alertmanager tells the agent)."""

    def __init__(self, fleet: Fleet) -> None:
        self.base = fleet.stack.alertmanager_url
        self.given: list[dict[str, Any]] = []

    def fire(self, alertname: str, service: str, environment: str = "production", **labels: str) -> dict[str, Any]:
        alert = {
            "labels": {
                "alertname": alertname,
                "service_name": service,
                "deployment_environment_name": environment,
                "e2e_run": uuid.uuid4().hex[:12],
                **labels,
            },
            "annotations": {"summary": f"{alertname} on {service} (e2e)"},
            "startsAt": datetime.now(UTC).isoformat(),
            "endsAt": (datetime.now(UTC) + timedelta(minutes=10)).isoformat(),
            "generatorURL": "http://prometheus.e2e/graph",
        }
        self.again(alert)
        self.given.append(alert)
        return alert

    def again(self, alert: dict[str, Any]) -> None:
        """Give the same alert (same labels, same startsAt) again, as Prometheus re-sends it."""
        http("POST", f"{self.base}/api/v2/alerts", [alert])

    def resolve(self, alert: dict[str, Any]) -> None:
        http("POST", f"{self.base}/api/v2/alerts", [{**alert, "endsAt": datetime.now(UTC).isoformat()}])

    def close(self) -> None:
        for alert in self.given:
            with contextlib.suppress(OSError):
                self.resolve(alert)


@pytest.fixture()
def alerts(fleet: Fleet) -> Iterator[Alerts]:
    given = Alerts(fleet)
    yield given
    given.close()


def received(fleet: Fleet, alertname: str, run: str) -> dict[str, Any] | None:
    """The health agent's record of the alert with this ``e2e_run`` label, or None."""
    for row in fleet.call(HEALTH, "GET", "/alerts?limit=1000", token=webhook_token()):
        if row["alertName"] == alertname and row["labels"].get("e2e_run") == run:
            return dict(row)
    return None


def until(probe: Any, what: str, timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while (found := probe()) is None or found is False:
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} within {timeout:.0f} s")
        time.sleep(0.5)
    return found


def opened_for(watch: Watch, service: str) -> list[str]:
    """Incidents opened for ``service`` among what the watch has seen."""
    kinds = ("ServiceLatencyIncreased", "ServiceDegraded")
    return [s.envelope.correlationid for s in watch.seen if s.kind in kinds and s.value.get("service") == service]


def test_a_breach_read_through_prometheus_opens_one_incident_and_its_alert_joins_it(fleet: Fleet, watch: Watch) -> None:
    fleet.wait_until_healthy("checkout-dev")
    incident = open_incident(fleet, watch, service="checkout-dev", dependency="payments-dev")
    watch.kind("RecoveryCompleted", incident, timeout=120)
    # Prometheus' rule fired on the same breach; the alert joined the incident, opened none,
    # and its resolution was recorded before the recovery was called complete.
    joined = watch.wait(
        lambda s: s.kind == "AlertObserved" and s.envelope.correlationid == incident, what="the alert joining it"
    )
    assert joined.value["alert"]["alertName"] == "ServiceLatencyHigh" and joined.value["signal"] == "latency"
    resolved = [s for s in watch.of(incident, "AlertObserved") if s.value["alert"]["status"] == "resolved"]
    completed = watch.of(incident, "RecoveryCompleted")[0]
    assert resolved and resolved[0].at <= completed.at
    watch.settle(2)
    assert opened_for(watch, "checkout-dev") == [incident]
    fleet.reset_sim()
    fleet.wait_until_healthy("checkout-dev")


def test_one_alert_is_one_incident_however_often_alertmanager_delivers_it(
    fleet: Fleet, watch: Watch, alerts: Alerts, stackctl: Any
) -> None:
    """Repeats (every 10 s here) and a restart of Alertmanager deliver the same firing
    again: counted, never a second incident. Its resolution is recorded on the incident."""
    alert = alerts.fire("HighErrorRate", "search-api", severity="warning", signal="errors")
    run = alert["labels"]["e2e_run"]
    opened = watch.wait(
        lambda s: s.kind == "ServiceDegraded" and s.value["alert"]["labels"].get("e2e_run") == run,
        what="the incident the alert opens",
    )
    incident = opened.envelope.correlationid
    assert (opened.value["service"], opened.value["signal"]) == ("search-api", "errors")
    assert opened.value["alert"]["severity"] == "warning"
    request = watch.kind("DiagnosisRequested", incident)
    assert request.value["signal"] == "errors" and request.value["alert"]["alertName"] == "HighErrorRate"

    until(lambda: (received(fleet, "HighErrorRate", run) or {}).get("received", 0) >= 2, "a repeat delivery", 40)
    stackctl.SUPERVISOR.ctl("restart", "alertmanager")  # forgets what it held (no HA peer here)
    until(lambda: stackctl.BY_NAME["alertmanager"].health(), "Alertmanager back", 60)
    before = received(fleet, "HighErrorRate", run)["received"]  # type: ignore[index]
    alerts.again(alert)  # what Prometheus does for an alert that still fires
    until(lambda: received(fleet, "HighErrorRate", run)["received"] > before, "a delivery after the restart", 40)  # type: ignore[index]

    row = received(fleet, "HighErrorRate", run)
    assert row is not None and (row["outcome"], row["incidentId"], row["status"]) == ("opened", incident, "firing")
    assert opened_for(watch, "search-api") == [incident]

    alerts.resolve(alert)
    noted = watch.wait(
        lambda s: (
            s.kind == "AlertObserved"
            and s.envelope.correlationid == incident
            and s.value["alert"]["status"] == "resolved"
        ),
        what="the resolution recorded on the incident",
    )
    assert noted.value["alert"]["endsAt"] is not None
    assert received(fleet, "HighErrorRate", run)["status"] == "resolved"  # type: ignore[index]
    watch.settle(2)
    assert opened_for(watch, "search-api") == [incident]


def test_an_alert_about_a_service_the_estate_does_not_know_is_kept_for_an_operator(
    fleet: Fleet, watch: Watch, alerts: Alerts
) -> None:
    alert = alerts.fire("HighErrorRate", "ghost-api")
    run = alert["labels"]["e2e_run"]
    row = until(lambda: received(fleet, "HighErrorRate", run), "the unknown service's alert received")
    assert (row["outcome"], row["incidentId"], row["service"]) == ("unknown-service", None, "ghost-api")
    listed = fleet.call(HEALTH, "GET", "/alerts?outcome=unknown-service", token=webhook_token())
    assert run in {r["labels"].get("e2e_run") for r in listed}
    watch.settle(2)
    assert opened_for(watch, "ghost-api") == []


def test_a_malformed_payload_or_a_missing_token_is_refused_and_changes_nothing(
    fleet: Fleet, watch: Watch, alert_token: str
) -> None:
    address = f"{url(HEALTH)}/alerts"
    firing = {
        "status": "firing",
        "labels": {"alertname": "HighErrorRate", "service_name": "search-api"},
        "annotations": {},
        "startsAt": datetime.now(UTC).isoformat(),
        "endsAt": "0001-01-01T00:00:00Z",
        "generatorURL": "",
        "fingerprint": uuid.uuid4().hex[:16],
    }
    payload = {"version": "4", "status": "firing", "receiver": "x", "groupKey": "{}", "alerts": [firing]}
    before = len(fleet.call(HEALTH, "GET", "/alerts?limit=1000", token=webhook_token()))

    for token in (None, "not-the-token"):
        with pytest.raises(HttpError) as refused:
            http("POST", address, payload, token)
        assert refused.value.status == 401
        with pytest.raises(HttpError) as unlisted:  # what was delivered is the token holders' too
            http("GET", f"{address}?limit=1", None, token)
        assert unlisted.value.status == 401
    for broken, names in (
        ({**payload, "version": "3"}, "version"),
        ({**payload, "alerts": [{**firing, "labels": {"service_name": "search-api"}}]}, "alertname"),
        ({**payload, "alerts": [{**firing, "startsAt": "yesterday"}]}, "startsAt"),
    ):
        with pytest.raises(HttpError) as refused:
            http("POST", address, broken, alert_token)
        assert refused.value.status == 422 and names in json.dumps(refused.value.body), refused.value.body
    request = urllib.request.Request(address, data=b"{not json", method="POST")
    request.add_header("Authorization", f"Bearer {alert_token}")
    request.add_header("Content-Type", "application/json")
    with pytest.raises(urllib.error.HTTPError) as bad:
        urllib.request.urlopen(request, timeout=10)
    assert bad.value.code == 422

    watch.settle(2)
    assert len(fleet.call(HEALTH, "GET", "/alerts?limit=1000", token=webhook_token())) == before
    assert opened_for(watch, "search-api") == []


def test_an_oversized_alert_is_refused_and_changes_nothing(fleet: Fleet, watch: Watch, alert_token: str) -> None:
    """Security review 3, H2 and L5, against the running agent: the review's alert (a 1.1 MB
    label, for a service the estate knows) used to open an incident whose records Kafka
    refused, and the agent's publishing stopped. Now 422 naming the field, a body over the
    webhook's limit 413 before it is read (token or not), and nothing at all changes."""
    address = f"{url(HEALTH)}/alerts"
    since = datetime.now(UTC)
    run = uuid.uuid4().hex[:12]
    labels = {"alertname": "HighErrorRate", "service_name": "search-api", "e2e_run": run}
    firing = {
        "status": "firing",
        "labels": {**labels, "big": "x" * 1_100_000},
        "annotations": {"summary": "an oversized alert (e2e)"},
        "startsAt": since.isoformat(),
        "endsAt": "0001-01-01T00:00:00Z",
        "generatorURL": "",
        "fingerprint": uuid.uuid4().hex[:16],
    }
    payload = {"version": "4", "status": "firing", "receiver": "x", "groupKey": "{}", "alerts": [firing]}
    before = len(fleet.call(HEALTH, "GET", "/alerts?limit=1000", token=webhook_token()))

    with pytest.raises(HttpError) as refused:
        http("POST", address, payload, alert_token)
    assert refused.value.status == 422, refused.value.body
    said = json.dumps(refused.value.body)
    assert "labels" in said and "'big' is 1100000 characters" in said and len(said) < 2000  # not echoed back
    for broken, names in (
        ({**firing, "labels": {**labels, "service_name": "s" * 254}}, "'service_name' names"),
        ({**firing, "labels": labels, "generatorURL": "http://p/" + "g" * 4096}, "generatorURL"),
    ):
        with pytest.raises(HttpError) as refused:
            http("POST", address, {**payload, "alerts": [broken]}, alert_token)
        assert refused.value.status == 422 and names in json.dumps(refused.value.body), refused.value.body
    # without a token the body is not even parsed: 401 (it was read and parsed first before)
    with pytest.raises(HttpError) as refused:
        http("POST", address, payload)
    assert refused.value.status == 401
    # a body over the webhook's limit (16 MiB): 413 from its declared length, nothing read
    host, port = url(HEALTH).removeprefix("http://").rsplit(":", 1)
    for token in (alert_token, None):
        auth = f"Authorization: Bearer {token}\r\n".encode() if token else b""
        status, body = exchange(
            int(port),
            b"POST /alerts HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n%s"
            b"Content-Length: 17000000\r\n\r\n{" % (host.encode(), auth),
            host=host,
        )
        assert status == 413 and "17000000 bytes" in body["detail"] and "16777216" in body["detail"], body

    watch.settle(2)
    assert len(fleet.call(HEALTH, "GET", "/alerts?limit=1000", token=webhook_token())) == before
    assert received(fleet, "HighErrorRate", run) is None
    assert opened_for(watch, "search-api") == []
    with psycopg.connect(fleet.stack.pg_dsn(HEALTH.database)) as conn:
        written = conn.execute(
            "SELECT count(*) FILTER (WHERE type LIKE '%%.ServiceDegraded' OR type LIKE '%%.DiagnosisRequested' "
            "OR type LIKE '%%.AlertObserved'), max(length(payload)) FROM outbox WHERE created_at >= %s",
            (since,),
        ).fetchone()
    assert written is not None and written[0] == 0 and (written[1] or 0) < 64 * 1024, written


def test_prometheus_stopped_mid_incident_the_fleet_waits_and_the_incident_completes(
    fleet: Fleet, watch: Watch, stackctl: Any
) -> None:
    fleet.wait_until_healthy("checkout-dev")
    incident = open_incident(fleet, watch, service="checkout-dev", dependency="payments-dev")
    stackctl.SUPERVISOR.ctl("stop", "prometheus")
    try:

        def not_ready() -> dict[str, Any] | None:
            try:
                http("GET", f"{url(HEALTH)}/readyz")
            except HttpError as exc:
                return dict(exc.body) if exc.status == 503 else None
            return None

        said = until(not_ready, "the health agent saying it cannot read the metrics", 30)
        assert "metrics source" in said["reason"]
        time.sleep(10)  # the agents wait: no escalation, no decision on nothing
        assert not watch.of(incident, "IncidentEscalated")
    finally:
        stackctl.SUPERVISOR.ctl("start", "prometheus")
    watch.kind("RecoveryCompleted", incident, timeout=180)
    assert not watch.of(incident, "IncidentEscalated")
    assert len(watch.of(incident, "RecoveryExecuted")) == 1
    until(lambda: http("GET", f"{url(HEALTH)}/readyz")["status"] == "ready", "the health agent ready again", 30)
    fleet.reset_sim()
    fleet.wait_until_healthy("checkout-dev")
