"""The runtime's connector keeper: restarts a FAILED outbox connector, counts it, and
treats a Connect that does not answer as a tick to skip, not an error."""

from __future__ import annotations

import urllib.error
from types import SimpleNamespace
from typing import cast

import pytest
from prometheus_client import REGISTRY

from flotilla import connectors, runner
from flotilla.runner import ServiceContext, keep_outbox_connector


def context(name: str) -> ServiceContext:
    spec = SimpleNamespace(name=name, database="flotilla_health")
    return cast(ServiceContext, SimpleNamespace(spec=spec, settings=SimpleNamespace(connect_url="http://connect")))


def restarts(name: str) -> float:
    return REGISTRY.get_sample_value("flotilla_outbox_connector_restarts_total", {"service": name}) or 0.0


@pytest.mark.parametrize(("failed", "counted"), [(False, 0), (True, 1)])
def test_the_keeper_counts_a_restart_only_when_something_had_failed(
    monkeypatch: pytest.MonkeyPatch, failed: bool, counted: int
) -> None:
    asked = []
    monkeypatch.setattr(connectors.Keeper, "check", lambda self: asked.append((self.connect_url, self.name)) or failed)
    before = restarts(f"keeper-{counted}")
    keep_outbox_connector(context(f"keeper-{counted}"))
    assert asked == [("http://connect", "outbox-flotilla-health")]
    assert restarts(f"keeper-{counted}") - before == counted


@pytest.mark.parametrize(
    "error",
    [urllib.error.URLError("connection refused"), connectors.ConnectError("GET … -> 409: rebalance", 409)],
)
def test_a_connect_that_does_not_answer_is_a_skipped_tick(monkeypatch: pytest.MonkeyPatch, error: Exception) -> None:
    def unreachable(self: connectors.Keeper) -> bool:
        raise error

    monkeypatch.setattr(connectors.Keeper, "check", unreachable)
    keep_outbox_connector(context("keeper-unreachable"))  # no exception
    assert restarts("keeper-unreachable") == 0


def test_only_a_publishing_service_keeps_a_connector() -> None:
    silent = SimpleNamespace(spec=SimpleNamespace(publishes=False))
    assert runner._start_connector_keeper(cast(ServiceContext, silent)) == []
