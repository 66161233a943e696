"""Resolutions Alertmanager never delivered, asked of the rule's own source.

Alertmanager sends a resolution once (with retries); a health agent unreachable for longer,
or an Alertmanager restarted without its notification log, loses it, and the alert stays
firing in the agent's view, holding its incident's recovery unverified. Prometheus keeps
the state of its own rules as the ``ALERTS`` series: an alert whose rule series was there
within the look-back (so this Prometheus made it) and no longer fires is resolved. An alert
from another source (no such series) is left to Alertmanager.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from flotilla_evidence import EvidenceUnavailable, PrometheusClient

log = logging.getLogger(__name__)

_NOT_LABELS = frozenset({"__name__", "alertstate"})


def _made(series: Mapping[str, str], alert: Mapping[str, str]) -> bool:
    """Whether the rule series ``series`` is that alert: every label of the series (but
    its name and state) is the alert's (Alertmanager may add external labels)."""
    return all(alert.get(k) == v for k, v in series.items() if k not in _NOT_LABELS)


class RuleStates:
    def __init__(self, client: PrometheusClient, lookback: str = "15m") -> None:
        self._client = client
        self._lookback = lookback

    def resolved(self, alerts: Sequence[Mapping[str, str]]) -> list[bool]:
        """For each alert's labels: True when Prometheus made it and it fires no more;
        False when it still fires, or when that cannot be told (not Prometheus' alert,
        Prometheus not answering)."""
        if not alerts:
            return []
        try:
            firing = [r.labels for r in self._client.query('ALERTS{alertstate="firing"}')]
            seen = [r.labels for r in self._client.query(f"last_over_time(ALERTS[{self._lookback}])")]
        except EvidenceUnavailable as exc:
            log.debug("cannot ask Prometheus about its alerts: %s", exc)
            return [False] * len(alerts)
        return [any(_made(s, labels) for s in seen) and not any(_made(f, labels) for f in firing) for labels in alerts]
