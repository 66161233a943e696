"""The health agent as a :class:`flotilla.runner.ServiceSpec`.

- periodic (every ``FLOTILLA_HEALTH_SCRAPE_SECONDS``): :class:`.scrape.Scraper` — scrape
  the sim, detect breaches with hysteresis, open incidents, decide verification windows;
- consumed (``incidents``, through the runtime's loop, following the incident workflow):
  RecoveryProposed (learn the plan's steps) and RecoveryExecuted (count them; open the
  verification window after the last one) — see :mod:`.handlers`.
"""

from __future__ import annotations

from pathlib import Path

from flotilla import ServiceSpec
from services.health_agent.handlers import make_handlers
from services.health_agent.metrics_source import SimMetrics
from services.health_agent.scrape import Scraper
from services.health_agent.settings import HealthSettings

MIGRATIONS = (Path(__file__).with_name("migrations.sql").read_text(),)


def build_spec(settings: HealthSettings | None = None, source: SimMetrics | None = None) -> ServiceSpec:
    settings = settings or HealthSettings.load()
    return ServiceSpec(
        name=settings.service_name,
        database=settings.service_database,
        topics=(settings.incidents_topic,),
        handlers=make_handlers(settings.health_verify_seconds),
        migrations=MIGRATIONS,
        periodic=((settings.health_scrape_seconds, Scraper(settings, source)),),
        emits=(settings.incidents_topic,),
    )
