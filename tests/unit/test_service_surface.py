"""The operational HTTP surface every service exposes, and its settings."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from pydantic import ValidationError

import flotilla.metrics  # noqa: F401  (registers the fleet's metrics)
from flotilla.http import create_app
from flotilla.settings import ServiceSettings

FLEET_METRICS = [
    "flotilla_records_consumed_total",
    "flotilla_dead_letters_total",
    "flotilla_loop_drops_total",
    "flotilla_dedupe_hits_total",
    "flotilla_stale_transitions_total",
    "flotilla_handler_seconds",
]


pytestmark = pytest.mark.usefixtures("clean_env")  # tests/conftest.py


def _client(name: str = "policy-service", ready: bool = True) -> TestClient:
    return TestClient(create_app(name, lambda: ready))


def test_healthz_names_the_service() -> None:
    response = _client("policy-service").get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok", "service": "policy-service"}


def test_healthz_is_ok_even_when_not_ready() -> None:
    assert _client(ready=False).get("/healthz").status_code == 200


def test_readyz_when_ready() -> None:
    response = _client("executor", ready=True).get("/readyz")
    assert response.status_code == 200
    assert response.json() == {"status": "ready", "service": "executor"}


def test_readyz_when_not_ready() -> None:
    response = _client("executor", ready=False).get("/readyz")
    assert response.status_code == 503
    assert response.json() == {"status": "not ready", "service": "executor"}


def test_readyz_asks_on_every_request() -> None:
    answers = iter([True, False, True])
    calls: list[bool] = []

    def ready() -> bool:
        calls.append(True)
        return next(answers)

    client = TestClient(create_app("audit", ready))
    assert [client.get("/readyz").status_code for _ in range(3)] == [200, 503, 200]
    assert len(calls) == 3


def test_metrics_are_prometheus_text_with_the_fleet_metrics() -> None:
    response = _client().get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    body = response.text
    for name in FLEET_METRICS:
        assert f"# TYPE {name} " in body, name
    families = {f.name: f.type for f in text_string_to_metric_families(body)}
    # The parser drops the _total suffix of counters.
    assert families["flotilla_records_consumed"] == "counter"
    assert families["flotilla_dead_letters"] == "counter"
    assert families["flotilla_loop_drops"] == "counter"
    assert families["flotilla_dedupe_hits"] == "counter"
    assert families["flotilla_stale_transitions"] == "counter"
    assert families["flotilla_handler_seconds"] == "histogram"


def test_there_are_no_docs_routes() -> None:
    client = _client()
    assert client.get("/docs").status_code == 404
    assert client.get("/redoc").status_code == 404


# ------------------------------------------------------------------- settings


def test_settings_defaults() -> None:
    s = ServiceSettings.load()
    assert s.service_name == "flotilla-service"
    assert s.service_database == "flotilla"
    assert s.http_port == 0
    assert s.http_host == "127.0.0.1"


def test_settings_read_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLOTILLA_SERVICE_NAME", "policy-service")
    monkeypatch.setenv("FLOTILLA_HTTP_PORT", "8081")
    monkeypatch.setenv("FLOTILLA_SERVICE_DATABASE", "policy")
    s = ServiceSettings.load()
    assert s.service_name == "policy-service"
    assert s.http_port == 8081
    assert s.service_database == "policy"
    assert "dbname=policy " in s.pg_dsn(s.service_database)


def test_settings_overrides_win_over_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLOTILLA_SERVICE_NAME", "from-env")
    assert ServiceSettings.load(service_name="explicit").service_name == "explicit"


def test_settings_read_the_env_file_and_the_environment_wins(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    env_file = tmp_path / "stack.env"
    env_file.write_text("FLOTILLA_SERVICE_NAME=from-file\nFLOTILLA_HTTP_PORT=9000\n")
    monkeypatch.setenv("FLOTILLA_ENV_FILE", str(env_file))
    assert ServiceSettings.load().service_name == "from-file"
    monkeypatch.setenv("FLOTILLA_SERVICE_NAME", "from-env")
    s = ServiceSettings.load()
    assert s.service_name == "from-env"
    assert s.http_port == 9000


def test_settings_refuse_a_non_numeric_port(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLOTILLA_HTTP_PORT", "eighty")
    with pytest.raises(ValidationError):
        ServiceSettings.load()


def _failing(exc: Exception) -> TestClient:
    app = create_app("policy-service", lambda: True)

    @app.get("/approvals")
    def approvals() -> None:
        raise exc

    return TestClient(app, raise_server_exceptions=False)


def test_a_database_that_went_away_mid_request_is_a_503_with_retry_after() -> None:
    from psycopg import errors

    response = _failing(errors.AdminShutdown("terminating connection due to unexpected postmaster exit")).get(
        "/approvals"
    )
    assert response.status_code == 503
    assert response.headers["Retry-After"] == "2"
    assert response.json() == {"detail": "policy-service's database is unavailable (AdminShutdown); retry shortly"}


def test_no_pool_connection_in_time_is_a_503_too() -> None:
    from psycopg_pool import ConnectionPool

    # a real pool against a port nothing listens on: the PoolTimeout a PostgreSQL restart gives
    with ConnectionPool("host=127.0.0.1 port=1 connect_timeout=1", min_size=0, max_size=1, timeout=0.3) as pool:
        app = create_app("audit", lambda: True)

        @app.get("/entries")
        def entries() -> None:
            with pool.connection() as conn:
                conn.execute("SELECT 1")

        response = TestClient(app, raise_server_exceptions=False).get("/entries")
    assert response.status_code == 503
    assert "audit's database is unavailable (PoolTimeout)" in response.json()["detail"]


def test_other_errors_stay_500() -> None:
    assert _failing(RuntimeError("a bug")).get("/approvals").status_code == 500
