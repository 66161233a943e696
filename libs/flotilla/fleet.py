"""The fleet at a glance: each service's module, database and HTTP port.

The local fleet runner, docker compose, the Kubernetes manifests and the tests read
this table instead of repeating it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Member:
    name: str  # service name: group id, ce_source /flotilla/<name>, process name
    module: str  # python -m <module> runs it
    database: str | None  # its own PostgreSQL database (None: keeps no state)
    http_port: int
    # The topics its outbox may publish to (ServiceSpec.emits, the outbox table's
    # constraint and its connector's filter). Only the policy service writes `commands`.
    emits: tuple[str, ...] = ("incidents",)
    # Does an incident wait on its records? Then its outbox connector looks at the WAL
    # every few milliseconds; otherwise (audit anchors, quarantine notices) rarely, which
    # is cheaper while idle (flotilla.connectors.poll_interval_ms).
    awaited: bool = True


SIM = Member("sim", "services.sim", None, 18110, emits=())
HEALTH = Member("health-agent", "services.health_agent", "flotilla_health", 18101)
DIAGNOSTIC = Member("diagnostic-agent", "services.diagnostic_agent", "flotilla_diagnostic", 18102)
REMEDIATION = Member("remediation-agent", "services.remediation_agent", "flotilla_remediation", 18103)
POLICY = Member("policy-service", "services.policy", "flotilla_policy", 18104, emits=("incidents", "commands"))
EXECUTOR = Member("executor", "services.executor", "flotilla_executor", 18105)
AUDIT = Member("audit", "services.audit", "flotilla_audit", 18106, emits=("audit.anchors",), awaited=False)
DLQ_RECONCILER = Member("dlq-reconciler", "services.dlq_reconciler", "flotilla_dlq", 18107, awaited=False)
# The web console: a front end for people over the services' HTTP APIs (no database, no Kafka).
CONSOLE = Member("console", "services.console", None, 18108, emits=())

AGENTS = (HEALTH, DIAGNOSTIC, REMEDIATION, POLICY, EXECUTOR, AUDIT, DLQ_RECONCILER)
FLEET = (SIM, *AGENTS, CONSOLE)
BY_NAME = {m.name: m for m in FLEET}


def url(member: Member, host: str = "127.0.0.1") -> str:
    return f"http://{host}:{member.http_port}"
