"""The dedupe window outlasts every consumed topic's retention, or is for ever."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from flotilla import ServiceSettings
from flotilla.retention import Retention, dedupe_window
from tests.keys import fact_settings

DAY_MS = 24 * 3600 * 1000


def test_the_window_is_the_longest_retention_plus_the_margin() -> None:
    assert dedupe_window([7 * DAY_MS, 14 * DAY_MS], margin=timedelta(days=1)) == timedelta(days=15)


def test_a_topic_kept_for_ever_keeps_the_claims_for_ever() -> None:
    assert dedupe_window([7 * DAY_MS, -1], margin=timedelta(days=1)) is None


def test_a_service_consuming_nothing_needs_only_the_margin() -> None:
    assert dedupe_window([], margin=timedelta(hours=6)) == timedelta(hours=6)


def test_a_service_keeps_its_claims_when_the_brokers_cannot_say_how_long_they_keep_records(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from flotilla import runner

    def unreachable(admin: object, topics: object) -> dict[str, int]:
        raise RuntimeError("no broker")

    monkeypatch.setattr(runner, "topic_retention_ms", unreachable)
    spec = runner.ServiceSpec(name="x", database="x", topics=("incidents",), publishes=False)
    ctx = runner.ServiceContext(spec, ServiceSettings(**fact_settings(tmp_path)), None, None)  # type: ignore[arg-type]
    assert runner.service_retention(ctx) == Retention(dedupe=None, outbox=None)

    monkeypatch.setattr(runner, "topic_retention_ms", lambda admin, topics: {"incidents": 7 * DAY_MS})
    spec = runner.ServiceSpec(name="x", database="x", topics=("incidents",))
    ctx = runner.ServiceContext(spec, ServiceSettings(outbox_retention_hours=2, **fact_settings(tmp_path)), None, None)  # type: ignore[arg-type]
    assert runner.service_retention(ctx) == Retention(dedupe=timedelta(days=8), outbox=timedelta(hours=2))
