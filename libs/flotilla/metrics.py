"""Prometheus metrics every Flotilla service exposes on ``/metrics``.

One set of names for the whole fleet, labelled by consumer (service) so a dashboard
works for all seven services without per-service queries.
"""

from __future__ import annotations

from prometheus_client import Counter, Histogram

RECORDS_CONSUMED = Counter(
    "flotilla_records_consumed_total", "Records taken off a topic by a consumer loop.", ["consumer", "topic"]
)
RECORDS_HANDLED = Counter(
    "flotilla_records_handled_total", "Records whose handler ran and committed.", ["consumer", "type"]
)
RECORDS_PRODUCED = Counter(
    "flotilla_records_produced_total", "Records written to the outbox for publication.", ["source", "topic", "type"]
)
HANDLER_SECONDS = Histogram(
    "flotilla_handler_seconds",
    "Time in a record's handler, dedupe and state included.",
    ["consumer", "type"],
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
)
BATCH_SECONDS = Histogram(
    "flotilla_batch_seconds",
    "Time to process one poll batch, commit included.",
    ["consumer"],
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
DEDUPE_HITS = Counter(
    "flotilla_dedupe_hits_total",
    "Records skipped because this consumer already processed their event id.",
    ["consumer"],
)
DEAD_LETTERS = Counter(
    "flotilla_dead_letters_total", "Records sent to a dead-letter topic, by reason.", ["consumer", "reason"]
)
LOOP_DROPS = Counter("flotilla_loop_drops_total", "Records dropped because their hop budget was spent.", ["consumer"])
STALE_TRANSITIONS = Counter(
    "flotilla_stale_transitions_total",
    "Records the incident workflow did not accept in its current state.",
    ["consumer", "type"],
)
RETRIES = Counter("flotilla_handler_retries_total", "Handler attempts retried after a transient error.", ["consumer"])
BUDGETS_EXCEEDED = Counter(
    "flotilla_budget_exceeded_total", "Incidents routed to a human for exceeding a budget.", ["consumer", "budget"]
)
