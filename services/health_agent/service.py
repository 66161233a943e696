"""The health agent as a :class:`flotilla.runner.ServiceSpec`.

- periodic (every ``FLOTILLA_HEALTH_SCRAPE_SECONDS``): :class:`.scrape.Scraper` — read
  every watched service's latency (Prometheus, :mod:`.metrics_source`), detect breaches
  with hysteresis, open incidents, decide verification windows;
- HTTP: Alertmanager's webhook, ``POST /alerts`` (:mod:`.alerts`, :mod:`.api`), and
  ``GET /alerts``; ``/readyz`` says not ready while the latency cannot be read;
- consumed (``incidents``, through the runtime's loop, following the incident workflow):
  RecoveryProposed (learn the plan's steps) and RecoveryExecuted (count them; open the
  verification window after the last one) — see :mod:`.handlers`.
"""

from __future__ import annotations

import logging
from pathlib import Path

from fastapi import FastAPI

from flotilla import ServiceContext, ServiceSpec
from services.health_agent.alerts import Intake
from services.health_agent.api import install_routes
from services.health_agent.handlers import make_handlers
from services.health_agent.incidents import FINISHED
from services.health_agent.metrics_source import MetricsSource, PromQLMetrics, SimMetrics
from services.health_agent.reconcile import RuleStates
from services.health_agent.scrape import Scraper
from services.health_agent.settings import HealthSettings

MIGRATIONS = (Path(__file__).with_name("migrations.sql").read_text(),)

log = logging.getLogger(__name__)


def metrics_source(settings: HealthSettings) -> MetricsSource:
    if settings.health_source == "scrape":
        return SimMetrics(
            settings.sim_url,
            timeout=settings.health_scrape_timeout_seconds,
            default_environment=settings.estate_default_environment,
        )
    return PromQLMetrics(settings.evidence())


def build_spec(settings: HealthSettings | None = None, source: MetricsSource | None = None) -> ServiceSpec:
    settings = settings or HealthSettings.load()
    # Where a resolution Alertmanager never delivered can be found out: the rules' Prometheus.
    rules = RuleStates(settings.prometheus_client()) if settings.health_source == "prometheus" else None
    scraper = Scraper(settings, source or metrics_source(settings), rules)
    intake = Intake(
        service_labels=settings.alert_service_labels,
        environment_labels=settings.alert_environment_labels,
        default_environment=settings.estate_default_environment,
        catalogue=settings.catalogue(),
        opens="alerts" in settings.health_open_from,
        topic=settings.incidents_topic,
    )
    senders, demo = settings.alert_senders()
    if demo:
        log.warning("the alert webhook takes the public demo token (FLOTILLA_PROFILE=demo): set FLOTILLA_ALERT_TOKENS")

    def routes(app: FastAPI, ctx: ServiceContext) -> None:
        install_routes(app, ctx, intake, senders, max_body_bytes=settings.alert_max_body_bytes)

    return ServiceSpec(
        name=settings.service_name,
        database=settings.service_database,
        topics=(settings.incidents_topic,),
        handlers=make_handlers(settings.health_verify_seconds, settings.metrics_lag_seconds()),
        migrations=MIGRATIONS,
        periodic=((settings.health_scrape_seconds, scraper),),
        routes=routes,
        emits=(settings.incidents_topic,),
        not_ready=scraper.not_ready,
        # A finished incident no longer holds its service (incidents.open_incident_of, scrape.settled).
        observes=(FINISHED,),
    )
