"""The sim's estate series (services/sim/telemetry.py): what Prometheus makes of them.

histogram_quantile is reimplemented here as Prometheus documents and implements it
(promql/quantile.go, classic buckets), so the synthesized histograms are checked the way
the fleet reads them: ``histogram_quantile(0.95, rate(..._bucket[w]))``.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from services.sim import SimModel, create_sim_app
from services.sim.model import Service
from services.sim.telemetry import BUCKETS, EstateTelemetry, SyntheticHistogram, bucket_shares

CHECKOUT = "checkout-api"
ACTION_TOKEN = "executor-only-sim-action-token"
EXECUTOR = {"Authorization": f"Bearer {ACTION_TOKEN}"}
FAILOVER = {"dependency": "payments-api", "toTarget": "payments-api-secondary"}
ESTATE_FAMILIES = {
    "http_server_request_duration_seconds",
    "http_client_request_duration_seconds",
    "traces_service_graph_request",  # the parser drops a counter's _total
    "traces_service_graph_request_server_seconds",
    "slo_latency_p95_threshold_seconds",
    "kube_deployment_spec_replicas",
    "kube_deployment_status_replicas_available",
    "target_info",
    "http_server_active_requests",
    "worker_pool_slots",
}

Series = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def histogram_quantile(q: float, buckets: list[tuple[float, float]]) -> float:
    """Prometheus' interpolation over (upper bound, cumulative count) pairs, +Inf last."""
    buckets = sorted(buckets)
    assert buckets[-1][0] == math.inf
    observations = buckets[-1][1]
    if observations == 0:
        return math.nan
    rank = q * observations
    b = next(i for i, (_, count) in enumerate(buckets) if count >= rank)
    if b == len(buckets) - 1:
        return buckets[-2][0]  # in +Inf: the largest finite bound
    start, end = (0.0 if b == 0 else buckets[b - 1][0]), buckets[b][0]
    count = buckets[b][1]
    if b > 0:
        count -= buckets[b - 1][1]
        rank -= buckets[b - 1][1]
    return start + (end - start) * (rank / count)


def _delta_p95(before: list[float], after: list[float]) -> float:
    bounds = (*BUCKETS, math.inf)
    return histogram_quantile(0.95, [(le, a - b) for le, a, b in zip(bounds, after, before, strict=True)])


def _round_trip(p95: float, history: float = 0.42) -> float:
    """p95 read back from the delta between two advances, after some other history."""
    histogram = SyntheticHistogram()
    histogram.advance(100.0, 400.0, history)
    histogram.advance(130.0, 400.0, history)
    before = histogram.buckets
    histogram.advance(145.0, 400.0, p95)
    return _delta_p95(before, histogram.buckets)


# -- the synthesis, pure ----------------------------------------------------------------


@settings(max_examples=500, deadline=None)
@given(p95=st.floats(min_value=0.006, max_value=50.0), history=st.floats(min_value=0.001, max_value=100.0))
def test_the_p95_survives_histogram_quantile(p95: float, history: float) -> None:
    assert _round_trip(p95, history) == pytest.approx(p95, rel=1e-6)


NEAR_BOUNDS = sorted(
    {
        value
        for bound in BUCKETS[1:]
        for value in (bound, bound * (1 - 1e-9), bound * (1 + 1e-9), bound - 1e-12, bound + 1e-12)
        if BUCKETS[0] < value <= BUCKETS[-1]
    }
    | {(lo + hi) / 2 for lo, hi in itertools.pairwise(BUCKETS)}  # frac exactly 0.5
    | {0.18, 1.8312, 0.425, 0.19, 0.28, 0.035, 0.025, 0.0051}
)


@pytest.mark.parametrize("p95", NEAR_BOUNDS)
def test_the_p95_survives_at_and_near_bucket_bounds(p95: float) -> None:
    assert _round_trip(p95) == pytest.approx(p95, rel=1e-6)


@pytest.mark.parametrize("p95", [0.0001, 0.003, 0.005])
def test_a_p95_in_the_first_bucket_reads_as_its_resolution(p95: float) -> None:
    """Nothing below 5 ms to balance against: histogram_quantile says 0.95 x 5 ms."""
    assert bucket_shares(p95)[0] == 1.0
    assert _round_trip(p95) == pytest.approx(0.00475)


@pytest.mark.parametrize("p95", [60.0000001, 75.0, 3600.0])
def test_a_p95_beyond_the_largest_bound_reads_as_that_bound(p95: float) -> None:
    assert bucket_shares(p95)[-1] == 1.0
    assert _round_trip(p95) == 60.0


@given(p95=st.floats(min_value=1e-6, max_value=1e5))
def test_shares_are_a_distribution(p95: float) -> None:
    shares = bucket_shares(p95)
    assert len(shares) == len(BUCKETS) + 1
    assert all(share >= 0 for share in shares)
    assert math.fsum(shares) == pytest.approx(1.0)


def test_count_grows_by_the_load_and_sum_is_plausible() -> None:
    histogram = SyntheticHistogram()
    histogram.advance(10.0, 400.0, 0.18)
    assert histogram.buckets[-1] == 0.0  # the first advance starts the clock: no burst
    histogram.advance(25.0, 400.0, 0.18)
    assert histogram.buckets[-1] == pytest.approx(6000.0)
    assert 0.075 < histogram.sum / histogram.buckets[-1] < 0.18  # a mean under the p95, as usual
    histogram.advance(20.0, 400.0, 0.18)  # a clock that went back adds nothing
    assert histogram.buckets[-1] == pytest.approx(6000.0)


def test_a_paused_series_resumes_without_a_burst() -> None:
    histogram = SyntheticHistogram()
    histogram.advance(0.0, 100.0, 0.05)
    histogram.advance(10.0, 100.0, 0.05)
    histogram.pause(12.0)  # takes the calls up to the moment it left, as it last saw them
    assert histogram.buckets[-1] == pytest.approx(1200.0)
    histogram.advance(500.0, 100.0, 0.05)
    assert histogram.buckets[-1] == pytest.approx(1200.0)
    histogram.advance(501.0, 100.0, 0.05)
    assert histogram.buckets[-1] == pytest.approx(1300.0)


def test_two_dependencies_failed_over_to_one_standby_make_one_edge() -> None:
    def service(name: str, **kwargs: Any) -> Service:
        return Service(
            name,
            replicas=2,
            base_ms=10.0,
            load_rps=100.0,
            pool_per_replica=50,
            threshold_ms=500.0,
            revision="v1",
            **kwargs,
        )

    model = SimModel(
        [
            service("front", dependencies=["a", "b"]),
            service("a", failover_target="standby"),
            service("b", failover_target="standby"),
            service("standby"),
        ]
    )
    model.apply("failover", "front", {"dependency": "a", "toTarget": "standby"})
    model.apply("failover", "front", {"dependency": "b", "toTarget": "standby"})
    telemetry = EstateTelemetry()
    rows = [(model.service("front"), model.latency("front"))]
    telemetry.advance(rows, 0.0)
    (reading,) = telemetry.advance(rows, 2.0)
    ((edge, buckets, _),) = reading.edges
    assert edge.graph_labels == 'client="front",server="standby",connection_type=""'
    assert buckets[-1] == pytest.approx(2 * 100.0 * 2.0)  # both calls of each request


# -- through the sim's /metrics ------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _client(model: SimModel | None = None) -> tuple[TestClient, Clock]:
    clock = Clock()
    return TestClient(create_sim_app(model, action_token=ACTION_TOKEN, action_seconds=0, clock=clock)), clock


def _scrape(client: TestClient, services: list[str] | None = None) -> Series:
    response = client.get("/metrics", params=None if services is None else {"service": services})
    assert response.status_code == 200
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(response.text)
        for s in family.samples
    }


def _buckets(series: Series, name: str, **labels: str) -> list[tuple[float, float]]:
    return [
        (float(dict(key)["le"]), value)
        for (sample, key), value in series.items()
        if sample == f"{name}_bucket" and {k: v for k, v in key if k != "le"} == labels
    ]


def _window_p95(before: Series, after: Series, name: str, **labels: str) -> float:
    """histogram_quantile(0.95, rate(name_bucket[w])) over the window between two scrapes."""
    earlier = dict(_buckets(before, name, **labels))
    delta = [(le, value - earlier[le]) for le, value in _buckets(after, name, **labels)]
    assert len(delta) == len(BUCKETS) + 1, f"no {name} series with {labels}"
    return histogram_quantile(0.95, delta)


def _value(series: Series, name: str, **labels: str) -> float:
    return series[(name, tuple(sorted(labels.items())))]


def _p95_ms(client: TestClient, name: str) -> float:
    p95: float = client.get(f"/services/{name}").json()["p95Ms"]
    return p95


def _action(action: str, params: dict[str, Any], key: str, token: int = 1) -> dict[str, Any]:
    return {"resource": CHECKOUT, "params": params, "idempotencyKey": key, "fencingToken": token, "holder": "x"}


PROD = {"deployment_environment_name": "production"}


def test_the_server_histogram_reads_back_the_models_p95_before_and_after_a_fault() -> None:
    client, clock = _client()
    first = _scrape(client)
    clock.now += 15
    second = _scrape(client)
    assert _window_p95(first, second, "http_server_request_duration_seconds", service_name=CHECKOUT, **PROD) == (
        pytest.approx(0.18, rel=1e-6)
    )
    count = _value(second, "http_server_request_duration_seconds_count", service_name=CHECKOUT, **PROD)
    assert count == pytest.approx(400 * 15)

    assert client.post("/faults", json={"service": "payments-api", "kind": "dependency-slow"}).status_code == 201
    clock.now += 5
    fault_seen = _scrape(client)  # advances over [second, now]: the window below is all after the fault
    clock.now += 15
    after = _scrape(client)
    slow_checkout, slow_payments = _p95_ms(client, CHECKOUT) / 1000, _p95_ms(client, "payments-api") / 1000
    assert slow_checkout == pytest.approx(1.8312)
    server = _window_p95(fault_seen, after, "http_server_request_duration_seconds", service_name=CHECKOUT, **PROD)
    assert server == pytest.approx(slow_checkout, rel=1e-6)
    client_side = _window_p95(
        fault_seen,
        after,
        "http_client_request_duration_seconds",
        service_name=CHECKOUT,
        server_address="payments-api",
        **PROD,
    )
    assert client_side == pytest.approx(slow_payments, rel=1e-6)
    edge = {"client": CHECKOUT, "server": "payments-api", "connection_type": ""}
    graph = _window_p95(fault_seen, after, "traces_service_graph_request_server_seconds", **edge)
    assert graph == pytest.approx(slow_payments, rel=1e-6)
    requests = _value(after, "traces_service_graph_request_total", **edge)
    assert requests - _value(fault_seen, "traces_service_graph_request_total", **edge) == pytest.approx(400 * 15)
    assert requests == _value(after, "traces_service_graph_request_server_seconds_count", **edge)


def test_the_gauges_an_estate_publishes() -> None:
    client, _ = _client()
    series = _scrape(client)
    assert _value(series, "slo_latency_p95_threshold_seconds", service_name=CHECKOUT, **PROD) == 0.5
    kube = {"namespace": "production", "deployment": CHECKOUT}
    assert _value(series, "kube_deployment_spec_replicas", **kube) == 4
    assert _value(series, "kube_deployment_status_replicas_available", **kube) == 4
    image = {"container_image_name": CHECKOUT, "container_image_tags": "v41"}  # OTel's container.image.*
    assert _value(series, "target_info", service_name=CHECKOUT, service_version="v41", **image, **PROD) == 1
    dev = {"service_name": "payments-dev", "deployment_environment_name": "dev"}
    dev_image = {"container_image_name": "payments-dev", "container_image_tags": "v17"}
    assert _value(series, "target_info", service_version="v17", **dev_image, **dev) == 1
    assert _value(series, "kube_deployment_spec_replicas", namespace="dev", deployment="payments-dev") == 2


@pytest.mark.parametrize(
    "fault",
    [None, {"service": "payments-api", "kind": "dependency-slow"}, {"service": CHECKOUT, "kind": "pool-exhausted"}],
)
def test_active_requests_over_slots_is_the_pool_utilization(fault: dict[str, str] | None) -> None:
    client, _ = _client()
    if fault is not None:
        client.post("/faults", json=fault)
    series = _scrape(client)
    for name in SimModel.default().names:
        labels = {
            "service_name": name,
            "deployment_environment_name": client.get(f"/services/{name}").json()["environment"],
        }
        ratio = _value(series, "http_server_active_requests", **labels) / _value(series, "worker_pool_slots", **labels)
        assert ratio == pytest.approx(_value(series, "sim_pool_utilization_ratio", service=name), abs=5e-5), name
    if fault is not None and fault["kind"] == "pool-exhausted":
        assert _value(series, "worker_pool_slots", service_name=CHECKOUT, **PROD) == pytest.approx(4 * 20 * 0.4)


def test_a_failover_moves_the_client_series_to_the_new_target() -> None:
    client, clock = _client()
    client.post("/faults", json={"service": "payments-api", "kind": "dependency-slow"})
    _scrape(client)
    clock.now += 10
    before = _scrape(client)
    response = client.post("/actions/failover", json=_action("failover", FAILOVER, "k-failover"), headers=EXECUTOR)
    assert response.status_code == 200
    clock.now += 10
    moved = _scrape(client)
    clock.now += 10
    after = _scrape(client)

    def targets(series: Series) -> set[str]:
        return {
            dict(key)["server_address"]
            for name, key in series
            if name == "http_client_request_duration_seconds_count" and dict(key)["service_name"] == CHECKOUT
        }

    assert targets(before) == {"payments-api", "inventory-db"}
    assert targets(after) == {"payments-api-secondary", "inventory-db"}
    secondary = {"service_name": CHECKOUT, "server_address": "payments-api-secondary", **PROD}
    p95 = _window_p95(moved, after, "http_client_request_duration_seconds", **secondary)
    assert p95 == pytest.approx(_p95_ms(client, "payments-api-secondary") / 1000, rel=1e-6)
    edges = {dict(key)["server"] for name, key in after if name == "traces_service_graph_request_total"}
    assert "payments-api-secondary" in edges and "payments-api" not in edges
    assert _window_p95(moved, after, "http_server_request_duration_seconds", service_name=CHECKOUT, **PROD) == (
        pytest.approx(_p95_ms(client, CHECKOUT) / 1000, rel=1e-6)
    )


def _owner(name: str, labels: Mapping[str, str]) -> str:
    """The service a series belongs to (a call edge belongs to its caller)."""
    for label in ("service", "service_name", "deployment", "client"):
        if label in labels:
            return labels[label]
    raise AssertionError(f"{name} {labels} names no service")


def test_narrowed_metrics_have_the_estate_series_of_only_those_services() -> None:
    client, clock = _client()
    everything = _scrape(client)
    assert {_owner(name, dict(key)) for name, key in everything} == set(SimModel.default().names)
    clock.now += 3
    response = client.get("/metrics", params={"service": [CHECKOUT, "nope", "dev/payments-dev"]})
    families = {f.name for f in text_string_to_metric_families(response.text)}
    assert families >= ESTATE_FAMILIES
    scoped = _scrape(client, [CHECKOUT, "nope", "dev/payments-dev"])
    assert {_owner(name, dict(key)) for name, key in scoped} == {CHECKOUT, "payments-dev"}
    edge = {"client": CHECKOUT, "server": "payments-api", "connection_type": ""}
    assert _value(scoped, "traces_service_graph_request_total", **edge) > 0
    nothing = client.get("/metrics", params={"service": ["nope"]}).text
    assert not [s for family in text_string_to_metric_families(nothing) for s in family.samples]


def test_a_scrape_of_a_few_services_does_not_burst_the_others() -> None:
    """A service scraped late catches up at its load, not more: nothing is counted twice."""
    client, clock = _client()
    _scrape(client)
    for _ in range(3):
        clock.now += 5
        _scrape(client, ["search-api"])
    series = _scrape(client)
    for name, load in (("search-api", 150), (CHECKOUT, 400)):
        count = _value(series, "http_server_request_duration_seconds_count", service_name=name, **PROD)
        assert count == pytest.approx(load * 15), name


def _counters(series: Series) -> Series:
    return {
        key: value
        for key, value in series.items()
        if key[0].endswith(("_bucket", "_sum", "_count", "_total")) and not key[0].startswith("sim_")
    }


OPERATIONS = st.lists(
    st.one_of(
        st.tuples(st.just("scrape"), st.floats(min_value=0, max_value=30)),
        st.tuples(st.just("scoped"), st.sampled_from([CHECKOUT, "payments-api", "checkout-dev"])),
        st.tuples(
            st.just("fault"),
            st.sampled_from(
                [("payments-api", "dependency-slow"), (CHECKOUT, "pool-exhausted"), (CHECKOUT, "bad-deploy")]
            ),
        ),
        st.tuples(st.just("clear"), st.integers(min_value=0, max_value=5)),
        st.tuples(st.just("scale"), st.integers(min_value=1, max_value=20)),
        st.tuples(st.just("failover"), st.sampled_from(["payments-api", "payments-api-secondary"])),
        st.tuples(st.just("reset"), st.none()),
    ),
    max_size=12,
)


@settings(max_examples=30, deadline=None)
@given(operations=OPERATIONS)
def test_counters_never_go_down(operations: list[tuple[str, Any]]) -> None:
    client, clock = _client()
    seen = _counters(_scrape(client))
    for step, (operation, argument) in enumerate(operations):
        if operation in ("scrape", "scoped"):
            clock.now += argument if operation == "scrape" else 1.0
            series = _counters(_scrape(client, None if operation == "scrape" else [argument]))
            for key, value in series.items():
                assert value >= seen.get(key, 0.0), key
            seen.update(series)
        elif operation == "fault":
            client.post("/faults", json={"service": argument[0], "kind": argument[1]})
        elif operation == "clear":
            faults = client.get("/faults").json()
            if faults:
                client.delete(f"/faults/{faults[argument % len(faults)]['id']}")
        elif operation in ("scale", "failover"):
            params = (
                {"replicas": argument} if operation == "scale" else {"dependency": "payments-api", "toTarget": argument}
            )
            client.post(f"/actions/{operation}", json=_action(operation, params, f"k-{step}", step), headers=EXECUTOR)
        else:
            client.post("/reset")
