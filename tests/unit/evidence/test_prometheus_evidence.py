"""PrometheusEvidence and its client, against a scripted query API (the wire shapes of
Prometheus' /api/v1/query and /query_range). The same code against a real Prometheus
scraping the sim: tests/integration/test_prometheus_evidence.py."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import parse_qs

import httpx
import pytest
from flotilla_evidence import (
    Catalogue,
    Credentials,
    EvidenceUnavailable,
    PrometheusClient,
    PrometheusEvidence,
    PrometheusUnavailable,
    Queries,
    parse_catalogue,
)
from flotilla_evidence.queries import DEFAULTS, name_regex

NOW = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)
DEFAULT_P95 = DEFAULTS["service_p95"]
Series = tuple[dict[str, str], float]


def matcher(query: str, label: str) -> re.Pattern[str] | None:
    found = re.search(label + r'=~"((?:[^"\\]|\\.)*)"', query)
    return None if found is None else re.compile(found.group(1).replace("\\\\", "\\"))


class Scripted:
    """A query API answering by metric name, honouring ``<label>=~"regex"`` matchers as
    Prometheus would (so neighbourhood queries get only what they ask for)."""

    def __init__(self, series: dict[str, list[Series]], ranges: dict[str, list[tuple[dict[str, str], list[Any]]]]):
        self.series = series
        self.ranges = ranges
        self.asked: list[str] = []

    def _filter(self, query: str, items: list[Any]) -> list[Any]:
        for label in ("service_name", "client", "deployment"):
            pattern = matcher(query, label)
            if pattern is not None:
                items = [i for i in items if label not in i[0] or pattern.fullmatch(i[0][label])]
        return items

    def __call__(self, request: httpx.Request) -> httpx.Response:
        form = {k: v[0] for k, v in parse_qs(request.content.decode()).items()}
        query = form["query"]
        self.asked.append(query)
        ranged = request.url.path.endswith("query_range")
        # a bundle: label_replace(<query>, "flotilla_reading", "<name>", "", "") or ...
        parts = re.findall(r'label_replace\((.*?), "flotilla_reading", "(\w+)", "", ""\)', query) or [(query, None)]
        result = []
        for part, tag in parts:
            extra = {} if tag is None else {"flotilla_reading": tag}
            if ranged:
                metric = next(m for m in self.ranges if m in part)
                result += [{"metric": {**m, **extra}, "values": v} for m, v in self._filter(part, self.ranges[metric])]
            else:
                metric = next((m for m in self.series if m in part), None)
                items = self._filter(part, self.series.get(metric, [])) if metric else []
                result += [{"metric": {**m, **extra}, "value": [NOW.timestamp(), str(v)]} for m, v in items]
        data = {"resultType": "matrix" if ranged else "vector", "result": result}
        return httpx.Response(200, json={"status": "success", "data": data})


def svc(name: str, env: str = "production") -> dict[str, str]:
    return {"service_name": name, "deployment_environment_name": env}


def demo_estate(*, failed_over: bool = False) -> Scripted:
    payments = "payments-api-secondary" if failed_over else "payments-api"
    return Scripted(
        {
            "http_server_request_duration_seconds": [
                (svc("checkout-api"), 1831.2),
                (svc("payments-api"), 280.0),
                (svc("payments-api-secondary"), 45.0),
                (svc("inventory-db"), 25.0),
                (svc("checkout-dev", "dev"), 180.0),
            ],
            "http_client_request_duration_seconds": [
                ({"service_name": "checkout-api", "server_address": f"{payments}.shop.svc:8080"}, 280.0),
                ({"service_name": "checkout-api", "server_address": "inventory-db"}, 25.0),
            ],
            "traces_service_graph_request_total": [
                ({"client": "checkout-api", "server": payments}, 400.0),
                ({"client": "checkout-api", "server": "inventory-db"}, 400.0),
                ({"client": "checkout-api", "server": "payments-api" if failed_over else "nobody"}, 0.0),
            ],
            "traces_service_graph_request_server_seconds": [],
            "slo_latency_p95_threshold_seconds": [
                (svc("checkout-api"), 500.0),
                (svc("payments-api"), 400.0),
                (svc("payments-api-secondary"), 400.0),
                (svc("inventory-db"), 150.0),
                (svc("checkout-dev", "dev"), 500.0),
            ],
            "kube_deployment_spec_replicas": [
                ({"namespace": "production", "deployment": "checkout-api"}, 4.0),
                ({"namespace": "production", "deployment": "payments-api"}, 3.0),
                ({"namespace": "dev", "deployment": "checkout-dev"}, 2.0),
            ],
        },
        {
            "target_info": [
                (
                    {**svc("checkout-api"), "service_version": "v41"},
                    [[NOW.timestamp() - 600, "1"], [NOW.timestamp() - 300, "1"]],
                ),
                (
                    {**svc("checkout-api"), "service_version": "v42"},
                    [[NOW.timestamp() - 240, "1"], [NOW.timestamp(), "1"]],
                ),
                (
                    {**svc("payments-api"), "service_version": "v17"},
                    [[NOW.timestamp() - 600, "1"], [NOW.timestamp(), "1"]],
                ),
            ],
            "http_server_request_duration_seconds": [
                (
                    svc("checkout-api"),
                    [[NOW.timestamp() - 60, "180"], [NOW.timestamp() - 30, "NaN"], [NOW.timestamp(), "1831.2"]],
                ),
            ],
        },
    )


def evidence(
    api: Callable[[httpx.Request], httpx.Response], catalogue: Catalogue | None = None, **kw: Any
) -> PrometheusEvidence:
    client = PrometheusClient("http://prometheus.test", transport=httpx.MockTransport(api))
    return PrometheusEvidence(client, catalogue=catalogue, clock=lambda: NOW, **kw)


CATALOGUE = parse_catalogue(
    {
        "services": [
            {"name": "checkout-api", "depends_on": ["payments-api", "inventory-db"]},
            {"name": "payments-api", "failover_to": "payments-api-secondary"},
            {"name": "payments-api-secondary"},
            {"name": "inventory-db", "latency_threshold_ms": 120},
        ]
    },
    origin="test",
    default_environment="production",
)


def test_a_neighbourhood_from_telemetry_alone() -> None:
    api = demo_estate()
    topology = evidence(api, graph="telemetry").snapshot("checkout-api", environment="production")
    checkout = topology.services["checkout-api"]
    assert (checkout.p95_ms, checkout.threshold_ms, checkout.replicas) == (1831.2, 500.0, 4)
    assert checkout.dependencies == ("inventory-db", "payments-api")  # edges with traffic, by name
    assert checkout.failover_targets == {}  # telemetry cannot know a standby
    assert topology.dependency_p95 == {("checkout-api", "payments-api"): 280.0, ("checkout-api", "inventory-db"): 25.0}
    assert (checkout.revision, checkout.previous_revision) == ("v42", "v41")
    assert checkout.revision_changed_at == datetime.fromtimestamp(NOW.timestamp() - 240, UTC)
    assert topology.services["payments-api"].revision_changed_at is None  # one version in the look-back
    assert "checkout-dev" not in topology.services and "search-api" not in topology.services
    assert (
        topology.history["checkout-api"][-1][1] == 1831.2 and len(topology.history["checkout-api"]) == 2
    )  # NaN dropped
    assert topology.source == "http://prometheus.test"
    # the neighbourhood was asked for by name, never the whole estate
    assert all('=~".+"' not in q for q in api.asked), api.asked


def test_the_catalogue_adds_standbys_and_thresholds_and_sees_a_failover() -> None:
    topology = evidence(demo_estate(), CATALOGUE).snapshot("checkout-api", environment="production")
    checkout = topology.services["checkout-api"]
    assert checkout.dependencies == ("payments-api", "inventory-db")  # declared order first
    assert checkout.failover_targets == {"payments-api": "payments-api-secondary"}
    assert checkout.active_dependencies == {"payments-api": "payments-api", "inventory-db": "inventory-db"}
    assert topology.services["inventory-db"].threshold_ms == 120.0  # the catalogue's wins
    assert "payments-api-secondary" in topology.services  # a plan may name it

    failed_over = evidence(demo_estate(failed_over=True), CATALOGUE).snapshot("checkout-api", environment="production")
    checkout = failed_over.services["checkout-api"]
    assert checkout.dependencies == ("payments-api", "inventory-db")  # still the primary, by name
    assert checkout.active_dependencies["payments-api"] == "payments-api-secondary"
    assert failed_over.dependency_p95[("checkout-api", "payments-api")] == 280.0  # what it sees from the standby


def test_the_catalogue_alone_declares_the_graph() -> None:
    topology = evidence(demo_estate(), CATALOGUE, graph="catalogue").snapshot("checkout-api", environment="production")
    assert topology.services["checkout-api"].dependencies == ("payments-api", "inventory-db")


def test_the_whole_estate_and_the_environment_of_an_unnamed_one() -> None:
    whole = evidence(demo_estate()).snapshot()
    assert {"checkout-api", "payments-api", "checkout-dev"} <= set(whole.services)
    assert whole.history == {}
    dev = evidence(demo_estate()).snapshot("checkout-dev")  # no environment given: where it runs
    assert dev.services["checkout-dev"].environment == "dev" and dev.services["checkout-dev"].replicas == 2


def test_no_reading_for_the_service_is_evidence_unavailable() -> None:
    with pytest.raises(EvidenceUnavailable, match="no p95 for production/search-api"):
        evidence(demo_estate()).snapshot("search-api", environment="production")


def test_latency_readings_are_what_the_health_agent_watches() -> None:
    readings = {
        (r.environment, r.service): (r.p95_ms, r.threshold_ms)
        for r in evidence(demo_estate(), CATALOGUE).latency_readings()
    }
    assert readings[("production", "checkout-api")] == (1831.2, 500.0)
    assert readings[("production", "inventory-db")] == (25.0, 120.0)
    assert readings[("dev", "checkout-dev")] == (180.0, 500.0)


def test_replicas_of_one_service() -> None:
    source = evidence(demo_estate())
    assert source.replicas("production", "checkout-api") == 4
    assert source.replicas("production", "search-api") is None


def answer(body: Any, status: int = 200) -> Callable[[httpx.Request], httpx.Response]:
    def respond(request: httpx.Request) -> httpx.Response:
        if isinstance(body, str):
            return httpx.Response(status, text=body)
        return httpx.Response(status, json=body)

    return respond


@pytest.mark.parametrize(
    ("body", "status", "says"),
    [
        ("<html>login</html>", 200, "not JSON"),
        ({"status": "error", "errorType": "bad_data", "error": "parse error"}, 400, "bad_data: parse error"),
        (
            {"status": "success", "warnings": ["store 2 unavailable"], "data": {"resultType": "vector", "result": []}},
            200,
            "partial answer",
        ),
        ({"status": "success", "data": {"result": []}}, 200, "no data.resultType"),
        ({"status": "success", "data": {"resultType": "matrix", "result": []}}, 200, "expected a vector"),
        (
            {"status": "success", "data": {"resultType": "vector", "result": [{"value": [1, "2"]}]}},
            200,
            "not the documented shape",
        ),
        ("Service Unavailable", 503, "HTTP 503"),
    ],
)
def test_anything_but_a_whole_answer_is_unavailable(body: Any, status: int, says: str) -> None:
    client = PrometheusClient("http://prometheus.test", transport=httpx.MockTransport(answer(body, status)))
    with pytest.raises(PrometheusUnavailable, match=says):
        client.query("up")


def test_a_refused_connection_is_unavailable() -> None:
    with pytest.raises(PrometheusUnavailable, match="ConnectError"):
        PrometheusClient("http://127.0.0.1:9", timeout=1).query("up")


def test_credentials_travel_as_configured() -> None:
    seen: list[httpx.Request] = []

    def record(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={"status": "success", "data": {"resultType": "scalar", "result": [1, "2"]}})

    bearer = PrometheusClient(
        "http://mimir.test/prometheus",
        credentials=Credentials(bearer_token="s3cret", tenant="team-a"),
        transport=httpx.MockTransport(record),
    )
    assert [r.value for r in bearer.query("vector(2)")] == [2.0]
    assert seen[-1].headers["Authorization"] == "Bearer s3cret" and seen[-1].headers["X-Scope-OrgID"] == "team-a"
    assert seen[-1].url.path == "/prometheus/api/v1/query"
    basic = PrometheusClient(
        "http://vm.test", credentials=Credentials(username="u", password="p"), transport=httpx.MockTransport(record)
    )
    basic.query("1")
    assert seen[-1].headers["Authorization"] == "Basic dTpw"
    with pytest.raises(ValueError, match="not both"):
        Credentials(bearer_token="t", username="u", password="p")


def test_queries_can_be_overridden_and_names_are_escaped() -> None:
    queries = Queries.with_overrides(
        {"utilization": 'busy{service_name=~"$services"}[$window]', "threshold": None}, "30s"
    )
    assert queries.render("utilization", services=["a.b", "c"]) == 'busy{service_name=~"a\\\\.b|c"}[30s]'
    assert "slo_latency_p95_threshold_seconds" in queries.render("threshold")  # None keeps the default
    assert queries.render("service_p95").count('=~".+"') == 1  # everything
    assert name_regex(["checkout-api"]) == "checkout-api"
    with pytest.raises(ValueError, match="no PromQL query named"):
        Queries.with_overrides({"p99": "x"}, "1m")
    assert re.fullmatch(name_regex(["a.b"]).replace("\\\\", "\\"), "a.b") and not re.fullmatch(
        name_regex(["a.b"]).replace("\\\\", "\\"), "axb"
    )


def test_a_window_is_a_promql_duration() -> None:
    from flotilla_evidence import promql_seconds

    assert promql_seconds("5s") == 5 and promql_seconds("1m30s") == 90 and promql_seconds("250ms") == 0.25
    with pytest.raises(ValueError, match="not a PromQL duration"):
        promql_seconds("5 minutes")


def test_an_unused_query_is_not_asked() -> None:
    api = demo_estate()
    evidence(api).snapshot("checkout-api", environment="production")
    assert not any(q == "" for q in api.asked)  # utilization is off by default
    assert timedelta(minutes=15) == evidence(api).lookback


def test_a_whole_estate_with_no_reading_yet_is_empty_not_an_error() -> None:
    # Prometheus just started (seen on the compose fleet): no p95 series at all. The replicas
    # query must not be asked about "no service" (name_regex refuses that, rightly).
    nothing = Scripted({}, {"target_info": [], "http_server_request_duration_seconds": []})
    assert evidence(nothing).snapshot().services == {}


def test_concurrent_snapshots_share_requests_and_each_sees_only_its_neighbourhood() -> None:
    api = demo_estate()

    def slow(request: httpx.Request) -> httpx.Response:
        time.sleep(0.02)  # long enough for the other snapshots' reads to arrive meanwhile
        return api(request)

    around = ["checkout-api", "payments-api", "inventory-db"]
    alone = {name: evidence(api, catalogue=CATALOGUE).snapshot(name, environment="production") for name in around}
    asked_alone = len(api.asked)
    api.asked.clear()
    shared = evidence(slow, catalogue=CATALOGUE)
    start = threading.Barrier(len(around))
    found: dict[str, Any] = {}

    def snapshot(name: str) -> None:
        start.wait()
        found[name] = shared.snapshot(name, environment="production")

    threads = [threading.Thread(target=snapshot, args=(name,)) for name in around]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert found == alone  # the merged answers were cut back to each neighbourhood
    assert len(api.asked) < asked_alone, (len(api.asked), asked_alone)
    assert any("|" in q and "payments-api" in q and "inventory-db" in q for q in api.asked), api.asked


def test_an_estates_own_query_is_never_merged() -> None:
    queries = Queries.with_overrides({"service_p95": 'my_p95{svc=~"$services"}'}, "2m")
    assert queries.scoped_label("service_p95") is None  # where its scope goes is unknown
    assert queries.scoped_label("edges") == "client"
    assert queries.scoped_label("utilization") is None


def test_a_neighbourhood_is_three_requests_and_an_estates_own_query_goes_alone() -> None:
    # the names around the service, then its instant readings and its range readings
    api = demo_estate()
    bundled = evidence(api, catalogue=CATALOGUE).snapshot("checkout-api", environment="production")
    assert len(api.asked) == 3, api.asked
    assert all("flotilla_reading" in q for q in api.asked)  # each a bundle (the first of one query)
    # the same p95 query, written by the estate: not the default text, so asked on its own
    own = Queries.with_overrides({"service_p95": DEFAULT_P95 + " + 0"}, "2m")
    api.asked.clear()
    alone = evidence(api, catalogue=CATALOGUE, queries=own).snapshot("checkout-api", environment="production")
    assert len(api.asked) == 5, api.asked  # its instant and its range reading, each alone
    assert alone == bundled
