"""The evidence source against a real Prometheus scraping the real sim.

The sim (its app, in this process) publishes what an instrumented estate publishes; a
private Prometheus (Debian's binary, tests/support/prometheus.py) scrapes it every second
behind TLS and basic auth; :class:`PrometheusEvidence` reads it with the local stack's
queries and catalogue. The rules reasoner then diagnoses and plans the demo from what
Prometheus says, and the plan, applied at the sim, shows as a recovery in Prometheus.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
from flotilla_evidence import (
    Credentials,
    EvidenceUnavailable,
    PrometheusClient,
    PrometheusEvidence,
    PrometheusUnavailable,
    Queries,
    Topology,
    load_catalogue,
)
from flotilla_reasoning import Action, DiagnosticEvidence, RulesReasoner, Verdict

from flotilla.settings import StackSettings
from services.sim.app import create_sim_app
from tests.fakes.fake_openai import ThreadedServer
from tests.support.prometheus import PrivatePrometheus, Secured, free_port, self_signed

pytestmark = pytest.mark.timeout(240)

REPO = Path(__file__).resolve().parents[2]
ACTION_TOKEN = "the-executors-sim-action-token"
# The local stack's utilization query (infra/local/stackctl.py, LOCAL_ESTATE): the sim's pool gauges.
UTILIZATION = (
    'sum by (service_name, deployment_environment_name) (http_server_active_requests{service_name=~"$services"})'
    ' / sum by (service_name, deployment_environment_name) (worker_pool_slots{service_name=~"$services"})'
)
# How long until a 5 s rate window holds only what the sim did after a change.
SETTLE = 7.0

T = TypeVar("T")


@pytest.fixture(scope="module")
def sim() -> Iterator[ThreadedServer]:
    with ThreadedServer(create_sim_app(action_token=ACTION_TOKEN, action_seconds=0)) as server:
        yield server


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Secured:
    cert, key = self_signed(tmp_path_factory.mktemp("tls"))
    return Secured(cert, key, "flotilla", "s3cret-for-prometheus")


@pytest.fixture(scope="module")
def prometheus(
    stack: StackSettings, sim: ThreadedServer, secured: Secured, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[PrivatePrometheus]:
    """``stack``: the local stack installs Prometheus; this one is the test's own."""
    with PrivatePrometheus(tmp_path_factory.mktemp("prometheus"), [f"127.0.0.1:{sim.port}"], secured=secured) as p:
        yield p


def client(prometheus: PrivatePrometheus, secured: Secured, **overrides: Any) -> PrometheusClient:
    options: dict[str, Any] = {
        "credentials": Credentials(username=secured.username, password=secured.password),
        "ca_file": secured.cert,
        **overrides,
    }
    return PrometheusClient(prometheus.url, **options)


@pytest.fixture()
def evidence(prometheus: PrivatePrometheus, secured: Secured, sim: ThreadedServer) -> PrometheusEvidence:
    """The demo estate, healthy, read as the local stack reads it (a fresh sim each test)."""
    httpx.post(f"{sim.url}/reset").raise_for_status()
    return PrometheusEvidence(
        client(prometheus, secured),
        queries=Queries.with_overrides({"utilization": UTILIZATION}, "5s"),
        catalogue=load_catalogue(REPO / "infra" / "local" / "estate.yaml", default_environment="production"),
        lookback=timedelta(seconds=60),
        step=timedelta(seconds=2),
    )


def eventually(probe: Callable[[], T | None], what: str, timeout: float = 60) -> T:
    deadline = time.monotonic() + timeout
    while True:
        try:
            found = probe()
        except EvidenceUnavailable:  # nothing scraped yet, or not for long enough
            found = None
        if found is not None:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} within {timeout:.0f} s")
        time.sleep(0.5)


def settled_snapshot(evidence: PrometheusEvidence, check: Callable[[Topology], bool], what: str) -> Topology:
    def probe() -> Topology | None:
        topology = evidence.snapshot("checkout-api", environment="production")
        return topology if check(topology) else None

    return eventually(probe, what)


def sim_says(sim: ThreadedServer, name: str) -> dict[str, Any]:
    answer: dict[str, Any] = httpx.get(f"{sim.url}/services/{name}").json()
    return answer


def act(sim: ThreadedServer, action: str, params: dict[str, Any], key: str) -> None:
    answer = httpx.post(
        f"{sim.url}/actions/{action}",
        json={"resource": "checkout-api", "params": params, "idempotencyKey": key, "fencingToken": 1},
        headers={"Authorization": f"Bearer {ACTION_TOKEN}"},  # as the executor acts
    )
    assert answer.status_code == 200, answer.text


def test_the_neighbourhood_as_prometheus_shows_it(evidence: PrometheusEvidence, sim: ThreadedServer) -> None:
    topology = settled_snapshot(
        evidence, lambda t: abs(t.services["checkout-api"].p95_ms - 180.0) < 1, "checkout-api at its healthy 180 ms"
    )
    checkout = topology.services["checkout-api"]
    assert (checkout.threshold_ms, checkout.replicas, checkout.revision) == (500.0, 4, "v41")
    assert checkout.dependencies == ("payments-api", "inventory-db")
    assert checkout.failover_targets == {"payments-api": "payments-api-secondary"}  # the catalogue's
    assert checkout.active_dependencies == {"payments-api": "payments-api", "inventory-db": "inventory-db"}
    assert set(topology.services) == {"checkout-api", "payments-api", "payments-api-secondary", "inventory-db"}
    assert topology.dependency_p95[("checkout-api", "payments-api")] == pytest.approx(35.0, abs=0.5)
    assert topology.dependency_p95[("checkout-api", "inventory-db")] == pytest.approx(25.0, abs=0.5)
    sim_ratio = httpx.get(f"{sim.url}/metrics", params={"service": "checkout-api"}).text
    [line] = [x for x in sim_ratio.splitlines() if x.startswith("sim_pool_utilization_ratio")]
    assert topology.utilization["checkout-api"] == pytest.approx(float(line.split()[-1]), abs=1e-3)
    assert topology.history["checkout-api"] and all(
        v == pytest.approx(180, abs=1) for _, v in topology.history["checkout-api"]
    )
    assert topology.source == evidence.name


def test_the_demo_is_diagnosed_planned_and_verified_through_prometheus(
    evidence: PrometheusEvidence, sim: ThreadedServer
) -> None:
    """The sim's latency model seen only through Prometheus: learn while healthy, break
    payments, diagnose, plan — and the plan brings checkout-api back under its threshold."""
    healthy = settled_snapshot(evidence, lambda t: t.services["checkout-api"].p95_ms < 200, "a healthy estate")
    learned = dict(healthy.dependency_p95)
    revisions = {name: s.revision for name, s in healthy.services.items() if s.revision}
    httpx.post(f"{sim.url}/faults", json={"service": "payments-api", "kind": "dependency-slow"}).raise_for_status()
    model = sim_says(sim, "checkout-api")["p95Ms"]
    time.sleep(SETTLE)
    broken = settled_snapshot(
        evidence,
        lambda t: abs(t.services["checkout-api"].p95_ms - model) < 1,
        f"checkout-api at the model's {model} ms",
    )
    broken = dataclasses.replace(broken, baselines=learned, healthy_revisions=revisions)

    evidence_of = DiagnosticEvidence("incident-it", "checkout-api", "production", "p95 over threshold", broken)
    diagnosis = RulesReasoner().diagnose(evidence_of)
    assert (diagnosis.verdict, diagnosis.suspected_dependency) == (Verdict.DEPENDENCY_FAILURE, "payments-api")
    assert any(e.kind == "metric-history" for e in diagnosis.reasoning.evidence)  # before and after, from a range
    proposal = RulesReasoner().propose(dataclasses.replace(diagnosis, event_id="e-1"), broken)
    [step] = proposal.steps
    assert (step.action, step.service, dict(step.params)) == (Action.SCALE, "checkout-api", {"replicas": 12})

    act(sim, "scale", {"replicas": 12}, "it:scale:12")
    time.sleep(SETTLE)
    recovered = settled_snapshot(evidence, lambda t: t.services["checkout-api"].replicas == 12, "12 replicas")
    assert recovered.services["checkout-api"].p95_ms < 500


def test_a_deployment_shows_as_a_revision_change_and_a_failover_as_the_active_target(
    evidence: PrometheusEvidence, sim: ThreadedServer
) -> None:
    settled_snapshot(evidence, lambda t: t.services["checkout-api"].revision == "v41", "checkout-api on v41")
    time.sleep(2)  # v41 seen for a while: the change has a before
    httpx.post(f"{sim.url}/faults", json={"service": "checkout-api", "kind": "bad-deploy"}).raise_for_status()
    changed = settled_snapshot(evidence, lambda t: t.services["checkout-api"].revision == "v42", "the new revision")
    checkout = changed.services["checkout-api"]
    assert checkout.previous_revision == "v41" and checkout.revision_changed_at is not None

    act(sim, "failover", {"dependency": "payments-api", "toTarget": "payments-api-secondary"}, "it:failover")
    failed_over = settled_snapshot(
        evidence,
        lambda t: t.services["checkout-api"].active_dependencies["payments-api"] == "payments-api-secondary",
        "calls going to the standby",
    )
    assert failed_over.services["checkout-api"].dependencies == ("payments-api", "inventory-db")


def test_the_health_agents_readings_are_every_service_against_its_threshold(evidence: PrometheusEvidence) -> None:
    def readings() -> dict[tuple[str, str], tuple[float, float]] | None:
        found = {(r.environment, r.service): (r.p95_ms, r.threshold_ms) for r in evidence.latency_readings()}
        return found if len(found) == 7 else None

    found = eventually(readings, "all seven services of the demo estate")
    assert found[("dev", "checkout-dev")][1] == 500.0 and found[("production", "inventory-db")][1] == 150.0
    assert found[("production", "search-api")][0] == pytest.approx(60.0 * 1.0, rel=0.5)


def test_wrong_credentials_an_untrusted_certificate_and_no_prometheus_are_unavailable(
    prometheus: PrivatePrometheus, secured: Secured, sim: ThreadedServer
) -> None:
    assert client(prometheus, secured).query("vector(1)")[0].value == 1.0
    with pytest.raises(PrometheusUnavailable, match="HTTP 401"):
        client(prometheus, secured, credentials=Credentials(username="flotilla", password="wrong")).query("up")
    with pytest.raises(PrometheusUnavailable, match="ConnectError"):  # the system CAs do not know ours
        client(prometheus, secured, ca_file=None).query("up")
    with pytest.raises(PrometheusUnavailable, match="ConnectError"):
        PrometheusClient(f"http://127.0.0.1:{free_port()}", timeout=2).query("up")
    with pytest.raises(PrometheusUnavailable, match="HTTP 404"):
        PrometheusClient(sim.url).query("up")  # something else at that URL: the sim has no query API


def test_a_failed_scrape_leaves_the_threshold_readable_while_the_p95_is(tmp_path: Path) -> None:
    """One failed scrape marks every series of its target stale. A rate over the window (the
    p95) still answers for a few seconds; an instant read of a gauge (the threshold, the
    replicas) no longer does, and the service dropped out of the topology while its p95 was
    there: a long chaos soak escalated 30 diagnoses in one second that way ("not in the
    topology"). Read as their last value over the window, the gauges stay with the p95."""
    sim_app = create_sim_app(action_token=ACTION_TOKEN, action_seconds=0)
    with ThreadedServer(sim_app) as target, PrivatePrometheus(tmp_path, [f"127.0.0.1:{target.port}"]) as prometheus:
        evidence = PrometheusEvidence(
            PrometheusClient(prometheus.url), queries=Queries.with_overrides({}, "5s"), graph="telemetry"
        )  # no catalogue: the threshold comes from Prometheus only
        settled_snapshot(evidence, lambda t: t.services["checkout-api"].threshold_ms == 500.0, "the threshold")
        target.stop()  # every scrape from now on fails
        checked = 0
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                topology = evidence.snapshot("checkout-api", environment="production")
            except EvidenceUnavailable:  # the p95's window has no two samples left: done
                break
            if down(prometheus):
                checked += 1
                assert "checkout-api" in topology.services, "a p95 without its threshold after a failed scrape"
                assert topology.services["checkout-api"].replicas == 4
            time.sleep(0.1)
        assert checked, "never read the estate between the failed scrape and the end of the p95's window"


def down(prometheus: PrivatePrometheus) -> bool:
    """Whether Prometheus' last scrape of its target failed (staleness markers written)."""
    targets = httpx.get(f"{prometheus.url}/api/v1/targets").json()["data"]["activeTargets"]
    return all(t["health"] == "down" for t in targets)


def test_a_bad_deploy_is_rolled_back_by_the_revisions_prometheus_shows(
    evidence: PrometheusEvidence, sim: ThreadedServer
) -> None:
    """Issue 40 on the local fleet's path: the sim's revisions, paused state and irreversible
    mark reach the evidence through Prometheus (as kube-state-metrics' series), the rules
    plan a rollback naming both revisions, and the sim takes exactly that plan."""
    healthy = settled_snapshot(evidence, lambda t: t.services["checkout-api"].p95_ms < 200, "a healthy estate")
    revisions = {name: s.revision for name, s in healthy.services.items() if s.revision}
    assert healthy.services["checkout-api"].paused is False
    time.sleep(2)  # v41 seen for a while: the deploy has a before
    httpx.post(f"{sim.url}/faults", json={"service": "checkout-api", "kind": "bad-deploy"}).raise_for_status()
    time.sleep(SETTLE)
    broken = settled_snapshot(
        evidence,
        lambda t: t.services["checkout-api"].rollback_candidate is not None and t.services["checkout-api"].degraded,
        "v42 running, slow, with v41 before it",
    )
    broken = dataclasses.replace(broken, healthy_revisions=revisions)
    diagnosis = RulesReasoner().diagnose(
        DiagnosticEvidence(
            "incident-it", "checkout-api", "production", "p95 over threshold", broken, may_request_more=False
        )
    )
    assert diagnosis.cause_category == "bad-deployment"
    [step] = RulesReasoner().propose(dataclasses.replace(diagnosis, event_id="e-1"), broken).steps
    assert step.action is Action.ROLLBACK
    assert (step.params["fromRevision"], step.params["toRevision"]) == ("v42", "v41")

    # marked irreversible and paused: both reach the evidence, and the sim refuses the plan
    mark = httpx.post(f"{sim.url}/faults", json={"service": "checkout-api", "kind": "rollback-forbidden"})
    mark.raise_for_status()
    act(sim, "pause", {"paused": True}, "it:pause")
    held = settled_snapshot(
        evidence,
        lambda t: (
            t.services["checkout-api"].paused is True and t.services["checkout-api"].rollback_forbidden is not None
        ),
        "paused and marked irreversible",
    )
    assert "release v42 of checkout-api is marked irreversible" in (
        held.services["checkout-api"].rollback_forbidden or ""
    )
    refused = httpx.post(
        f"{sim.url}/actions/rollback",
        json={"resource": "checkout-api", "params": dict(step.params), "idempotencyKey": "it:rb:0", "fencingToken": 1},
        headers={"Authorization": f"Bearer {ACTION_TOKEN}"},
    )
    assert refused.status_code == 422 and "may not be rolled back" in refused.json()["error"]

    httpx.delete(f"{sim.url}/faults/{mark.json()['id']}").raise_for_status()
    act(sim, "pause", {"paused": False}, "it:resume")
    act(sim, "rollback", dict(step.params), "it:rollback")
    time.sleep(SETTLE)
    recovered = settled_snapshot(evidence, lambda t: t.services["checkout-api"].revision == "v41", "back on v41")
    assert recovered.services["checkout-api"].p95_ms < 500
