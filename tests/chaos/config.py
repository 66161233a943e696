"""How big and how violent a chaos run is: ``CHAOS_*`` variables, CI-sized by default.

    make chaos                      # the long soak: 1,000 incidents, a kill every 4 s
    CHAOS_INCIDENTS=60 make chaos   # anything in between

The defaults are the short run ``make test`` includes; ``make chaos`` sets the long one.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
APPROVER_TOKEN = "chaos-approver-token"


def _env(name: str, default: float) -> float:
    raw = os.environ.get(name)
    return float(raw) if raw not in (None, "") else default


@dataclass(frozen=True)
class ChaosConfig:
    incidents: int  # service pairs that breach (one incident each, plus any a failure reopens)
    inject_per_second: float  # how fast the faults arrive
    kill_every_seconds: float  # a SIGKILL this often while incidents run
    failure_share: float  # share of incidents forced to fail verification and compensate
    poison: int  # undecodable / invalid records published among the real ones
    drain_seconds: float  # how long incidents may take to settle after the last kill
    seed: int
    # Seconds between Prometheus' scrapes of the estate and between the health agent's
    # readings. 1 (the local stack's pace) for the short soak; the long soak's 2,000+
    # services every second were more than 2 cores give (Prometheus missed scrapes, and
    # diagnoses failed on "no p95 for dev/shop-N now"), so `make chaos` reads every 5 s.
    read_seconds: float = 1.0

    @classmethod
    def from_env(cls) -> ChaosConfig:
        return cls(
            incidents=int(_env("CHAOS_INCIDENTS", 40)),
            inject_per_second=_env("CHAOS_INJECT_PER_SECOND", 2.0),
            kill_every_seconds=_env("CHAOS_KILL_EVERY_SECONDS", 5.0),
            failure_share=_env("CHAOS_FAILURE_SHARE", 0.1),
            poison=int(_env("CHAOS_POISON", 6)),
            drain_seconds=_env("CHAOS_DRAIN_SECONDS", 420.0),
            seed=int(_env("CHAOS_SEED", 1)),
            read_seconds=_env("CHAOS_READ_SECONDS", 1.0),
        )

    @property
    def estate(self) -> int:
        """Services in the generated estate: a pair per incident, at least 10 pairs."""
        return 2 * max(self.incidents, 10)


def fleet_settings(config: ChaosConfig, ledger: Path) -> dict[str, str]:
    """The fleet as an operator would tune it to ride out crashes of its neighbours.

    - the sim keeps its ledger on disk (it is SIGKILLed too) and hosts the generated estate;
    - the executor retries an unreachable target for ~15 s, backing off (the sim restarts in ~2 s) and
      runs as two replicas, so a frozen one's leases pass to the other;
    - approvals live long enough that a restarted policy service still finds them pending,
      and the policy service soon withdraws one whose target is not in this estate;
    - the scripted approver is a person with the approver role.
    """
    every = config.read_seconds
    window = max(5, round(4 * every))  # a rate over at least four scrapes
    return {
        "FLOTILLA_SIM_SERVICES": str(config.estate),
        # the generated estate has no catalogue: its graph and thresholds come from telemetry
        "FLOTILLA_ESTATE_CATALOGUE_FILE": "",
        "FLOTILLA_SIM_LEDGER_FILE": str(ledger),
        "FLOTILLA_SIM_ACTION_SECONDS": "0.1",
        "FLOTILLA_HEALTH_SCRAPE_SECONDS": f"{every:g}",
        "FLOTILLA_HEALTH_BREACH_SCRAPES": "2",
        "FLOTILLA_HEALTH_CLEAR_SCRAPES": "2",
        "FLOTILLA_HEALTH_VERIFY_SECONDS": f"{4 * every:g}",
        # the rate window and the lag after an action before a reading counts (the stack's
        # 5 s and 6 s at a 1 s pace)
        "FLOTILLA_PROMQL_WINDOW": f"{window}s",
        "FLOTILLA_HEALTH_METRICS_LAG_SECONDS": f"{window + every:g}",
        "FLOTILLA_APPROVAL_SWEEP_SECONDS": "1",
        "FLOTILLA_APPROVAL_TARGET_CHECK_SECONDS": "2",
        "FLOTILLA_APPROVAL_TTL_SECONDS": "1800",
        "FLOTILLA_EXECUTOR_TARGET_ATTEMPTS": "6",
        "FLOTILLA_EXECUTOR_TARGET_BACKOFF_SECONDS": "0.5",
        "FLOTILLA_EXECUTOR_LEASE_TTL_SECONDS": "6",
        "FLOTILLA_FLEET_REPLICAS": "executor=2",
        "FLOTILLA_POLICY_USERS": json.dumps({APPROVER_TOKEN: {"user": "chaos-approver", "roles": ["approver"]}}),
    }
