"""Shared pieces of the evaluation suite's tests: the shipped cases, the real policies,
and a small valid fixture to break in one place at a time."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from flotilla_eval import PolicyCheck, Scenario, load_scenarios
from flotilla_eval.fixtures import parse_scenario

SCENARIOS = load_scenarios()
BY_ID = {s.id: s for s in SCENARIOS}

MINIMAL: dict[str, Any] = {
    "id": "minimal",
    "title": "payments-api is slow and checkout-api waits on it",
    "tags": ["easy", "slow-dependency"],
    "evidence": {
        "service": "checkout-api",
        "environment": "production",
        "symptom": "checkout-api p95 1840 ms over its 500 ms threshold",
        "topology": {
            "services": [
                {
                    "name": "checkout-api",
                    "replicas": 4,
                    "p95_ms": 1840,
                    "threshold_ms": 500,
                    "dependencies": ["payments-api", "payments-db"],
                    "failover_targets": {"payments-api": "payments-api-standby"},
                },
                {"name": "payments-api", "replicas": 3, "p95_ms": 880, "threshold_ms": 400},
                {"name": "payments-api-standby", "replicas": 2, "p95_ms": 60, "threshold_ms": 400},
                {"name": "payments-db", "replicas": 1, "p95_ms": 30, "threshold_ms": 100},
            ],
            "dependency_latency": [
                {"service": "checkout-api", "dependency": "payments-api", "p95_ms": 900, "baseline_ms": 110},
                {"service": "checkout-api", "dependency": "payments-db", "p95_ms": 30, "baseline_ms": 30},
            ],
            "utilization": {"checkout-api": 2.125},
            "history": {"checkout-api": [["2026-03-02T10:00:00Z", 310], ["2026-03-02T10:06:00Z", 1840]]},
        },
    },
    "expected": {
        "diagnosis": [{"verdict": "dependency-failure", "dependency": "payments-api"}],
        "actions": {
            "acceptable": [
                {"action": "scale", "service": "checkout-api", "replicas": [9, 17]},
                {
                    "action": "failover",
                    "service": "checkout-api",
                    "dependency": "payments-api",
                    "to_target": "payments-api-standby",
                },
                {"action": "none"},
            ],
            "harmful": [{"action": "restart", "service": "payments-db"}, {"action": "restart", "rolling": False}],
        },
    },
}


def minimal(**changes: Any) -> dict[str, Any]:
    """A deep copy of the minimal case with top-level keys replaced."""
    document = copy.deepcopy(MINIMAL)
    document.update(changes)
    return document


def parse(document: dict[str, Any], name: str = "minimal") -> Scenario:
    return parse_scenario(document, Path(f"{name}.yaml"))


def write(folder: Path, document: dict[str, Any], name: str | None = None) -> Path:
    path = folder / f"{name or document['id']}.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


@pytest.fixture(scope="session")
def policy() -> PolicyCheck:
    return PolicyCheck.from_directory()
