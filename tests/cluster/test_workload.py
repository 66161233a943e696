"""Issue 41, item 3, on the real one-node cluster: the shop (storefront -> checkout ->
payments, built here in four versions), its load generator, kube-state-metrics,
Prometheus and Alertmanager deployed from infra/k8s/cluster/workload/, and each fault
made as production makes it (faults.py: a new image, a configuration, a replica count),
seen where Flotilla reads it: the shop's OpenTelemetry histograms and kube-state-metrics'
series in the cluster's Prometheus, and the alerts in its Alertmanager.

Every read goes from the machine through the API server's relayed port on 127.0.0.1 and
its Service proxy. Each test resets the shop to shop.yaml afterwards.

With FLOTILLA_CLUSTER_REUSE=1 and a healthy cluster already up (another engineer's, say),
the module deploys into it and leaves the cluster running; otherwise it uses the lane's
session fixture, and brings the cluster up again if test_base's teardown test ran first.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import time
import urllib.error
from collections.abc import Iterator
from typing import Any

import pytest

from tests.cluster.conftest import REPO_ROOT, Cluster, clusterctl
from tests.support.scripts import load_script

WORKLOAD_DIR = REPO_ROOT / "infra" / "k8s" / "cluster" / "workload"
workload = load_script("flotilla_workload", WORKLOAD_DIR / "workload.py")
faults = load_script("flotilla_faults", WORKLOAD_DIR / "faults.py")

THRESHOLD = 0.25  # seconds: monitoring.yaml's slo_latency_p95_threshold_seconds


def _healthy() -> bool:
    if any(pid is None for pid in clusterctl.status().values()):
        return False
    try:
        return bool(clusterctl.api("/readyz", timeout=5) == "ok")
    except (OSError, ValueError):
        return False


@pytest.fixture(scope="module")
def shop(request: pytest.FixtureRequest) -> Iterator[Cluster]:
    started = False
    if os.environ.get("FLOTILLA_CLUSTER_REUSE") and _healthy():
        cluster = Cluster(clusterctl.PATHS, {}, [], {})
    else:
        cluster = request.getfixturevalue("cluster")
        if not _healthy():  # test_base's last test tore it down
            clusterctl.up(cluster.paths)
            started = True
    try:
        began = time.monotonic()
        took = workload.deploy(cluster.paths)
        print(f"\n[workload] deployed in {time.monotonic() - began:.1f}s: {json.dumps(took)}")
        yield cluster
    finally:
        try:
            workload.remove(cluster.paths)
        finally:
            if started:
                clusterctl.down(cluster.paths)


@pytest.fixture
def reset(shop: Cluster) -> Iterator[Cluster]:
    """Whatever a test broke is put back as shop.yaml says."""
    yield shop
    workload.reset(shop.paths)


def _query(cluster: Cluster, promql: str) -> list[dict[str, Any]]:
    result: list[dict[str, Any]] = workload.query(promql, cluster.paths)
    return result


def _value(cluster: Cluster, promql: str) -> float | None:
    """The largest value of an instant query, or None for an empty (or NaN) result."""
    values = [float(r["value"][1]) for r in _query(cluster, promql)]
    values = [v for v in values if v == v]
    return max(values) if values else None


def _above(cluster: Cluster, promql: str, limit: float) -> float | None:
    """The query's value when it is over ``limit`` (for waiting on it)."""
    value = _value(cluster, promql)
    return value if value is not None and value > limit else None


def _under(cluster: Cluster, promql: str, limit: float) -> float | None:
    """The query's value when it is under ``limit``."""
    value = _value(cluster, promql)
    return value if value is not None and value < limit else None


def _settled(cluster: Cluster, service: str) -> float | None:
    """The service's p95 when it is under its objective and no latency alert about it is
    pending or firing: the shop healthy before a fault, so what follows is the fault's (on a
    busy machine a startup can breach for a while)."""
    value = _value(cluster, _p95(service))
    alerts = _query(cluster, f'ALERTS{{alertname="ServiceLatencyHigh", service_name="{service}"}}')
    return value if value is not None and value < THRESHOLD and not alerts else None


def _p95(service: str, window: str = "1m") -> str:
    return (
        "histogram_quantile(0.95, sum by (le, service_name, deployment_environment_name) "
        f'(rate(http_server_request_duration_seconds_bucket{{job="shop", service_name="{service}"}}[{window}])))'
    )


def _buy(cluster: Cluster) -> str:
    path = workload.service_path("shop", "storefront", 80, "/buy")
    return str(clusterctl.api(path, cluster.paths, timeout=10))


def _firing(cluster: Cluster, alertname: str, service: str, since: float) -> dict[str, Any] | None:
    """The alert as Alertmanager holds it, active, for this service, begun after ``since``."""
    for alert in workload.alerts(cluster.paths):
        labels = alert["labels"]
        starts = dt.datetime.fromisoformat(alert["startsAt"]).timestamp()
        if (
            labels.get("alertname") == alertname
            and labels.get("service_name") == service
            and alert["status"]["state"] == "active"
            and starts >= since - 5
        ):
            found: dict[str, Any] = alert
            return found
    return None


@pytest.mark.timeout(60)
def test_the_shop_answers_through_the_storefront(shop: Cluster) -> None:
    answer = _buy(shop)
    assert answer.startswith("storefront v1 ok; checkout v1 ok; payments v1 ok"), answer
    # The load generator, inside the cluster, is served too.
    logs = shop.kubectl("logs", "-n", "shop", "deployment/loadgen", "--tail=5")
    assert "ok " in logs and "errors 0" in logs, logs


@pytest.mark.timeout(90)
def test_prometheus_has_the_semconv_histograms_and_kube_state_metrics(shop: Cluster) -> None:
    def scraped() -> bool:
        return all(_value(shop, f'up{{job="{job}"}}') == 1 for job in ("shop", "kube-state-metrics"))

    shop.wait("the shop and kube-state-metrics scraped", scraped, 60)
    server = shop.wait(
        "storefront's server histogram",
        lambda: _query(shop, 'http_server_request_duration_seconds_bucket{service_name="storefront", le="+Inf"}'),
        30,
    )
    labels = server[0]["metric"]
    assert labels["deployment_environment_name"] == "cluster"
    assert labels["http_response_status_code"] == "200"
    assert labels["http_request_method"] == "GET"
    client = shop.wait(
        "checkout's client histogram",
        lambda: _query(shop, 'http_client_request_duration_seconds_bucket{service_name="checkout", le="+Inf"}'),
        30,
    )
    assert client[0]["metric"]["server_address"] == "payments.shop.svc"
    versions = {
        r["metric"]["service_name"]: r["metric"]["service_version"]
        for r in _query(shop, 'target_info{deployment_environment_name="cluster"}')
    }
    assert versions == {"storefront": "v1", "checkout": "v1", "payments": "v1"}
    for series in (
        'kube_deployment_status_replicas_available{namespace="shop", deployment="storefront"}',
        'kube_replicaset_owner{namespace="shop", owner_kind="Deployment", owner_name="checkout"}',
        'kube_pod_container_status_restarts_total{namespace="shop", container="payments"}',
        'kube_horizontalpodautoscaler_spec_max_replicas{namespace="shop", horizontalpodautoscaler="storefront"}',
    ):
        assert _query(shop, series), f"no {series} in Prometheus"
    assert _value(shop, 'kube_horizontalpodautoscaler_spec_max_replicas{namespace="shop"}') == 3
    assert _value(shop, 'slo_latency_p95_threshold_seconds{service_name="storefront"}') == THRESHOLD


@pytest.mark.timeout(300)
def test_a_slow_release_raises_p95_and_the_latency_alert_fires(reset: Cluster) -> None:
    shop = reset
    baseline = shop.wait("storefront healthy, no latency alert", lambda: _settled(shop, "storefront"), 120)
    began = time.time()
    faults.bad_rollout("storefront", "v2-slow", shop.paths)
    shop.wait(
        "target_info says v2-slow",
        lambda: _query(shop, 'target_info{service_name="storefront", service_version="v2-slow"}'),
        60,
    )
    slow = shop.wait("storefront's p95 over its objective", lambda: _above(shop, _p95("storefront"), THRESHOLD), 60)
    print(f"\n[workload] storefront p95 {baseline * 1000:.0f} ms at v1, {slow * 1000:.0f} ms at v2-slow")
    alert = shop.wait(
        "ServiceLatencyHigh in Alertmanager",
        lambda: _firing(shop, "ServiceLatencyHigh", "storefront", began),
        90,
    )
    assert alert["labels"]["deployment_environment_name"] == "cluster"
    assert alert["labels"]["severity"] == "page" and alert["labels"]["signal"] == "latency"
    print(f"[workload] ServiceLatencyHigh active {time.time() - began:.0f}s after the rollout began")
    # Routed to the health agent's webhook (delivered once the fleet runs in the cluster;
    # failed, and counted so, without it).
    shop.wait(
        "a notification to the health agent's webhook",
        lambda: _above(shop, 'sum(alertmanager_notifications_total{integration="webhook"})', 0),
        30,
    )
    history = shop.kubectl("rollout", "history", "-n", "shop", "deployment/storefront")
    assert "release v2-slow of storefront" in history, history


@pytest.mark.timeout(120)
def test_an_erroring_dependency_shows_5xx_in_server_and_client_histograms(reset: Cluster) -> None:
    shop = reset
    faults.bad_rollout("payments", "v2-errors", shop.paths)
    shop.wait(
        "most of payments' answers 500",
        lambda: _above(
            shop,
            'sum(rate(http_server_request_duration_seconds_count{service_name="payments",'
            ' http_response_status_code="500"}[20s]))'
            ' / sum(rate(http_server_request_duration_seconds_count{service_name="payments"}[20s]))',
            0.5,
        ),
        60,
    )
    shop.wait(
        "checkout seeing 500 from payments",
        lambda: _query(
            shop,
            'http_client_request_duration_seconds_count{service_name="checkout", server_address="payments.shop.svc",'
            ' http_response_status_code="500"}',
        ),
        30,
    )
    with pytest.raises(urllib.error.HTTPError) as answer:
        _buy(shop)
    assert answer.value.code == 502


@pytest.mark.timeout(120)
def test_a_release_that_crashes_shows_crashloopbackoff_in_kube_state_metrics(reset: Cluster) -> None:
    shop = reset
    faults.bad_rollout("checkout", "v2-crash", shop.paths)
    shop.wait(
        "CrashLoopBackOff in kube-state-metrics",
        lambda: (
            _value(
                shop,
                'kube_pod_container_status_waiting_reason{namespace="shop", container="checkout",'
                ' reason="CrashLoopBackOff"}',
            )
            == 1
        ),
        90,
    )
    restarts = _value(shop, 'kube_pod_container_status_restarts_total{namespace="shop", container="checkout"}')
    assert restarts is not None and restarts >= 1
    # The rollout is stuck, not done: the old ReplicaSet's pod still serves (maxUnavailable 0).
    owners = _query(shop, 'kube_replicaset_owner{namespace="shop", owner_name="checkout"}')
    assert len(owners) >= 2, owners
    assert _value(shop, 'kube_deployment_status_replicas_unavailable{namespace="shop", deployment="checkout"}') == 1
    assert _buy(shop).startswith("storefront v1 ok; checkout v1 ok")


@pytest.mark.timeout(120)
def test_a_leak_is_killed_at_the_memory_limit_and_seen_as_oomkilled(reset: Cluster) -> None:
    shop = reset
    faults.oom("checkout", 16, shop.paths)
    shop.wait(
        "OOMKilled in kube-state-metrics",
        lambda: (
            _value(
                shop,
                'kube_pod_container_status_last_terminated_reason{namespace="shop", container="checkout",'
                ' reason="OOMKilled"}',
            )
            == 1
        ),
        90,
    )


@pytest.mark.timeout(150)
def test_a_dependency_scaled_to_zero_fails_its_callers(reset: Cluster) -> None:
    shop = reset
    faults.dependency_down("payments", shop.paths)

    def refused() -> bool:
        try:
            _buy(shop)
        except urllib.error.HTTPError as error:
            return error.code == 502
        return False

    shop.wait("the storefront answering 502", refused, 60)
    shop.wait(
        "checkout's 502s in Prometheus",
        lambda: _query(
            shop, 'http_server_request_duration_seconds_count{service_name="checkout", http_response_status_code="502"}'
        ),
        60,  # a 5 s scrape, DNS discovery of the pods and a busy machine: 30 s was once too short
    )


@pytest.mark.timeout(120)
def test_a_slow_dependency_shows_in_its_callers_client_histogram(reset: Cluster) -> None:
    shop = reset
    # FLOTILLA_PROMQL_DEPENDENCY_P95's shape: the p95 each caller sees per server_address.
    dependency_p95 = (
        "histogram_quantile(0.95, sum by (le, service_name, server_address) (rate("
        'http_client_request_duration_seconds_bucket{service_name="checkout",'
        ' server_address="payments.shop.svc"}[30s])))'
    )
    shop.wait("checkout's p95 to payments under 0.25s first", lambda: _under(shop, dependency_p95, THRESHOLD), 60)
    faults.slow_dependency("payments", 500, shop.paths)
    seen = shop.wait("checkout's p95 to payments over 0.25s", lambda: _above(shop, dependency_p95, THRESHOLD), 60)
    assert seen < 5, seen  # late, not timing out


@pytest.mark.timeout(200)
def test_load_beyond_capacity_raises_p95_and_scaling_out_restores_it(reset: Cluster) -> None:
    shop = reset
    shop.wait(
        "storefront's p95 under its objective first", lambda: _under(shop, _p95("storefront", "20s"), THRESHOLD), 60
    )
    faults.overload(150, shop.paths)  # one storefront serves 100/s
    shop.wait("storefront's p95 over its objective", lambda: _above(shop, _p95("storefront", "20s"), THRESHOLD), 60)
    began = time.monotonic()
    shop.kubectl("scale", "-n", "shop", "deployment/storefront", "--replicas=3")
    shop.wait(
        "kube-state-metrics: 3 storefront replicas available",
        lambda: (
            _value(shop, 'kube_deployment_status_replicas_available{namespace="shop", deployment="storefront"}') == 3
        ),
        60,
    )

    after = shop.wait(
        "storefront's p95 back under its objective", lambda: _under(shop, _p95("storefront", "20s"), THRESHOLD), 100
    )
    print(f"\n[workload] overload: p95 {after * 1000:.0f} ms {time.monotonic() - began:.0f}s after scaling to 3")
