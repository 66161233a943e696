"""The incident cap's setting (the behaviour on the real stack: tests/integration/services/
test_health_incident_cap.py)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

import pytest
from pydantic import ValidationError

from flotilla import ServiceContext, ServiceSettings
from services.health_agent.incidents import incidents_per_hour
from services.health_agent.settings import HealthSettings


def context(settings: Any) -> ServiceContext:
    return cast(ServiceContext, SimpleNamespace(settings=settings))


def test_a_sane_cap_by_default_and_none_when_set_to_zero(monkeypatch: pytest.MonkeyPatch) -> None:
    assert HealthSettings().health_incidents_per_hour == 12
    monkeypatch.setenv("FLOTILLA_HEALTH_INCIDENTS_PER_HOUR", "0")
    assert incidents_per_hour(context(HealthSettings())) == 0
    monkeypatch.setenv("FLOTILLA_HEALTH_INCIDENTS_PER_HOUR", "3")
    assert incidents_per_hour(context(HealthSettings())) == 3


def test_a_negative_cap_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLOTILLA_HEALTH_INCIDENTS_PER_HOUR", "-1")
    with pytest.raises(ValidationError, match="health_incidents_per_hour"):
        HealthSettings()


def test_settings_that_are_not_the_health_agents_carry_no_cap() -> None:
    assert incidents_per_hour(context(ServiceSettings())) == 0
