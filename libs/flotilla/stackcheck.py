"""Is the stack named by a settings object reachable? One probe per component.

Used by test fixtures and tools to decide whether an already-running stack (local,
compose or remote) can be used as is.
"""

from __future__ import annotations

import urllib.request

import psycopg
from confluent_kafka.admin import AdminClient

from flotilla.settings import StackSettings


def _http_ok(url: str) -> None:
    with urllib.request.urlopen(url, timeout=3) as resp:
        resp.read()


def problems(settings: StackSettings) -> dict[str, str]:
    """Component name → what is wrong with it; empty when everything answers."""
    found: dict[str, str] = {}
    try:
        with psycopg.connect(settings.pg_dsn("postgres"), connect_timeout=3) as conn:
            conn.execute("SELECT 1")
    except Exception as exc:
        found["postgres"] = f"{exc.__class__.__name__}: {exc}"
    try:
        md = AdminClient(settings.kafka_client()).list_topics(timeout=3)
        if not md.brokers:
            found["kafka"] = "no brokers in metadata"
    except Exception as exc:
        found["kafka"] = f"{exc.__class__.__name__}: {exc}"
    for name, url in (
        ("registry", f"{settings.schema_registry_url}/subjects"),
        ("connect", f"{settings.connect_url}/connectors"),
        # 200 once each serves (Prometheus: its storage opened and the config loaded).
        ("prometheus", f"{settings.prometheus_url.rstrip('/')}/-/ready"),
        ("alertmanager", f"{settings.alertmanager_url.rstrip('/')}/-/ready"),
    ):
        try:
            _http_ok(url)
        except Exception as exc:
            found[name] = f"{exc.__class__.__name__}: {exc}"
    return found
