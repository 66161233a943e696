"""What the fleet can observe of an estate: the evidence seam and its sources.

``EvidenceSource.snapshot(around)`` → a source-neutral :class:`Topology`, or
:class:`EvidenceUnavailable` (which the agents wait out). The real source is
:class:`PrometheusEvidence` (Prometheus' query API plus an optional estate catalogue);
:class:`StaticEvidence` is a fixed topology for tests. Settings:
:class:`~flotilla_evidence.settings.EvidenceSettings`.
"""

from flotilla_evidence.base import EvidenceSource, EvidenceUnavailable, StaticEvidence, neighbourhood
from flotilla_evidence.catalogue import Catalogue, CatalogueError, Declared, load_catalogue, parse_catalogue
from flotilla_evidence.estate import LatencyReading, PrometheusEvidence
from flotilla_evidence.model import RevisionFacts, Series, ServiceView, Topology
from flotilla_evidence.prometheus import Credentials, PrometheusClient, PrometheusUnavailable
from flotilla_evidence.queries import Labels, Queries
from flotilla_evidence.settings import EvidenceSettings, promql_seconds

__all__ = [
    "Catalogue",
    "CatalogueError",
    "Credentials",
    "Declared",
    "EvidenceSettings",
    "EvidenceSource",
    "EvidenceUnavailable",
    "Labels",
    "LatencyReading",
    "PrometheusClient",
    "PrometheusEvidence",
    "PrometheusUnavailable",
    "Queries",
    "RevisionFacts",
    "Series",
    "ServiceView",
    "StaticEvidence",
    "Topology",
    "load_catalogue",
    "neighbourhood",
    "parse_catalogue",
    "promql_seconds",
]
