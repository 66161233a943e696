"""Two deliberately misconfigured services, run beside the fleet by the hop-budget test.

``escalator`` answers every BudgetExceeded with an IncidentEscalated; ``watchdog`` answers
every IncidentEscalated with a BudgetExceeded. Each one alone is plausible; together they
answer each other forever — unless the hop budget cuts the chain. Both are ordinary
Flotilla services (runner, own database, outbox, Debezium) on the real ``incidents``
topic, so the loop runs through the same path as the fleet's own records. Each states its
records as a real member (``MEMBER``) with that member's key, as a second deployment of it
with a bad configuration would.

``python -m tests.e2e.misconfigured escalator|watchdog`` runs one until SIGTERM.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping

from flotilla_ops.samples import sample_value

from flotilla.contracts import load_contracts
from flotilla.handling import Handler, HandlerContext
from flotilla.records import BY_TYPE
from flotilla.runner import ServiceContext, ServiceSpec, start
from flotilla.settings import ServiceSettings

BUDGET_EXCEEDED = "dev.flotilla.incidents.BudgetExceeded"
INCIDENT_ESCALATED = "dev.flotilla.incidents.IncidentEscalated"
ROLES = {"escalator": (BUDGET_EXCEEDED, INCIDENT_ESCALATED), "watchdog": (INCIDENT_ESCALATED, BUDGET_EXCEEDED)}
# Each is a misconfigured second deployment of a real member (any member that runs a loop
# may state these runtime reports: flotilla.provenance), signing with that member's key.
MEMBER = {"escalator": "executor", "watchdog": "policy-service"}


def database(role: str) -> str:
    return f"flotilla_e2e_{role}"


def spec(role: str) -> ServiceSpec:
    listens, answers = ROLES[role]
    schema = next(c.schema for c in load_contracts() if c.full_name == answers)

    def handlers(ctx: ServiceContext) -> Mapping[str, Handler]:
        def answer(h: HandlerContext) -> None:
            incident = h.incoming.envelope.correlationid
            value = sample_value(schema, incidentId=incident)
            value.pop("eventId", None)
            h.emit(BY_TYPE[answers].from_value(value), key=incident)

        return {listens: answer}

    return ServiceSpec(
        name=f"misconfigured-{role}",
        database=database(role),
        topics=("incidents",),
        handlers=handlers,
        loop={"follow_workflow": False},
        producer=MEMBER[role],
    )


def main() -> None:
    role = sys.argv[1]
    start(spec(role), ServiceSettings.load(service_name=f"misconfigured-{role}", service_database=database(role)))


if __name__ == "__main__":
    main()
