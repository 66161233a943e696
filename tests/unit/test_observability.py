"""docs/operations/observability.md and the Grafana dashboard cannot drift from the code.

Every module of flotilla, flotilla_evidence, flotilla_ops, flotilla_reasoning and services
is imported, and every metric with the ``flotilla_`` prefix registered with
prometheus_client's default registry is collected with its type and labels; the sim's own
registry is read from its ``/metrics``. The doc's tables must list exactly those, and every metric the dashboard
queries must be one of them (with labels it has).
"""

from __future__ import annotations

import importlib
import json
import pkgutil
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from prometheus_client import REGISTRY
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.parser import text_string_to_metric_families

REPO_ROOT = Path(__file__).resolve().parents[2]
DOC = REPO_ROOT / "docs" / "operations" / "observability.md"
DASHBOARD = REPO_ROOT / "infra" / "observability" / "grafana" / "dashboards" / "flotilla.json"
PACKAGES = ("flotilla", "flotilla_evidence", "flotilla_ops", "flotilla_reasoning", "services")
ROW = re.compile(r"^\| `((?:flotilla|sim)_\w+)` \| (\w+) \| ([^|]*) \|")
SUFFIXES = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_sum", "_count", "_created"), "gauge": ("",)}


@dataclass(frozen=True)
class Metric:
    name: str  # as exposed: counters with _total
    type: str
    labels: frozenset[str]

    def series(self) -> set[str]:
        base = self.name.removesuffix("_total") if self.type == "counter" else self.name
        return {base + suffix for suffix in SUFFIXES[self.type]}


def _modules() -> Iterator[str]:
    for package in PACKAGES:
        root = importlib.import_module(package)
        yield package
        for info in pkgutil.walk_packages(root.__path__, package + "."):
            if info.name.rsplit(".", 1)[-1] != "__main__":  # importing those would start a service
                yield info.name


@pytest.fixture(scope="module")
def registered() -> dict[str, Metric]:
    """Every flotilla_ metric the code registers, found by importing every module."""
    found: dict[str, Metric] = {}
    for name in _modules():
        module = importlib.import_module(name)
        for obj in vars(module).values():
            if isinstance(obj, MetricWrapperBase) and obj._name.startswith("flotilla_"):
                exposed = obj._name + ("_total" if obj._type == "counter" else "")
                found[exposed] = Metric(exposed, obj._type, frozenset(obj._labelnames))
    families = {
        f.name + ("_total" if f.type == "counter" else ""): f.type
        for f in REGISTRY.collect()
        if f.name.startswith("flotilla_")
    }
    # Everything registered was found as a module attribute (so its labels are known), and
    # nothing was found that is not registered.
    assert families == {n: m.type for n, m in found.items()}
    return found


@pytest.fixture(scope="module")
def simulated() -> dict[str, Metric]:
    """The sim's own metrics (``sim_*``), from its /metrics. The estate-shaped series it
    publishes beside them (OpenTelemetry's HTTP histograms, the service graph,
    kube-state-metrics) are what a real estate would publish: docs/operations/estate.md
    lists them, tests/unit/services/test_sim_telemetry.py checks them."""
    from services.sim.app import create_sim_app

    text = TestClient(create_sim_app(action_token="a-token-nobody-here-uses")).get("/metrics").text
    found = {}
    for family in text_string_to_metric_families(text):
        if not family.name.startswith("sim_"):
            continue
        labels = frozenset(k for s in family.samples for k in s.labels)
        found[family.name] = Metric(family.name, family.type, labels)
    assert found, "the sim exposes no metrics"
    return found


@pytest.fixture(scope="module")
def documented() -> dict[str, Metric]:
    rows: dict[str, Metric] = {}
    for line in DOC.read_text().splitlines():
        match = ROW.match(line)
        if match:
            name, kind, labels = match.groups()
            assert name not in rows, f"{name} is documented twice"
            rows[name] = Metric(name, kind, frozenset(re.findall(r"`(\w+)`", labels)))
    return rows


def test_the_registry_holds_the_fleet_metrics(registered: dict[str, Metric]) -> None:
    for name in ("flotilla_records_consumed_total", "flotilla_consumer_lag", "flotilla_llm_tokens_total"):
        assert name in registered


def test_every_registered_metric_is_documented(registered: dict[str, Metric], documented: dict[str, Metric]) -> None:
    missing = sorted(set(registered) - set(documented))
    assert not missing, f"registered but not in {DOC.name}: {missing}"


def test_every_documented_metric_is_registered(
    registered: dict[str, Metric], simulated: dict[str, Metric], documented: dict[str, Metric]
) -> None:
    gone = sorted(set(documented) - set(registered) - set(simulated))
    assert not gone, f"in {DOC.name} but registered nowhere: {gone}"
    assert {n for n in documented if n.startswith("sim_")} == set(simulated)


def test_types_and_labels_are_documented_as_registered(
    registered: dict[str, Metric], simulated: dict[str, Metric], documented: dict[str, Metric]
) -> None:
    for name, actual in {**registered, **simulated}.items():
        assert documented.get(name) == actual, f"{name}: documented {documented.get(name)}, registered {actual}"


# ------------------------------------------------------------------ dashboard

PROMQL_WORDS = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")


def _queries() -> list[tuple[str, str]]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [(panel["title"], t["expr"]) for panel in dashboard["panels"] for t in panel.get("targets", [])]


def test_every_panel_queries_something() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    for panel in dashboard["panels"]:
        if panel["type"] != "row":
            assert panel.get("targets"), panel["title"]
            assert all(t["expr"].strip() for t in panel["targets"]), panel["title"]


def test_every_metric_the_dashboard_queries_exists(registered: dict[str, Metric], simulated: dict[str, Metric]) -> None:
    series = {s: m for m in (*registered.values(), *simulated.values()) for s in m.series()}
    for title, expr in _queries():
        names = [w for w in PROMQL_WORDS.findall(expr) if w.startswith(("flotilla_", "sim_"))]
        assert names, f"{title}: {expr} queries no Flotilla metric"
        unknown = [n for n in names if n not in series]
        assert not unknown, f"{title}: {unknown} are not registered by the code"
        labels = set().union(*(series[n].labels for n in names)) | {"le"}
        grouped = {
            label.strip()
            for clause in re.findall(r"\b(?:by|without)\s*\(([^)]*)\)", expr)
            for label in clause.split(",")
            if label.strip()
        }
        matched = set(re.findall(r"(\w+)\s*=~?\s*\"", expr))
        assert grouped | matched <= labels, f"{title}: labels {sorted((grouped | matched) - labels)} do not exist"


@pytest.mark.parametrize(
    "metric",
    [
        "flotilla_records_produced_total",
        "flotilla_records_handled_total",
        "flotilla_consumer_lag",
        "flotilla_dead_letters_total",
        "flotilla_loop_drops_total",
        "flotilla_executor_fencing_rejections_total",
        "flotilla_policy_approvals_pending",
        "flotilla_llm_tokens_total",
    ],
)
def test_the_dashboard_covers(metric: str) -> None:
    assert any(metric in expr for _, expr in _queries()), f"no panel shows {metric}"


def test_panels_do_not_overlap() -> None:
    dashboard: dict[str, Any] = json.loads(DASHBOARD.read_text())
    taken: set[tuple[int, int]] = set()
    for panel in dashboard["panels"]:
        g = panel["gridPos"]
        assert g["x"] + g["w"] <= 24, panel["title"]
        cells = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not cells & taken, f"{panel['title']} overlaps another panel"
        taken |= cells
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])
