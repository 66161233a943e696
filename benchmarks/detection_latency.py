"""Fault -> incident: how long the health agent takes to open an incident, three ways, in one run.

    make bench-detection                      # 10 faults each way
    .venv/bin/python benchmarks/detection_latency.py --faults 20

The fleet is started three times on the running stack, each with its health agent reading
the estate differently, and the same fault is injected N times each way: payments-dev
slows down, so checkout-dev breaches (dev: the fleet recovers it without a person). The
figure is the time from the fault's injection at the sim to the opening record
(ServiceLatencyIncreased or ServiceDegraded) arriving at a consumer of ``incidents``:

- ``scrape``: the sim's own /metrics gauges read directly every second (the path before
  Prometheus; FLOTILLA_HEALTH_SOURCE=scrape), opened by the agent's hysteresis (3 readings);
- ``prometheus``: Prometheus (scraping the sim every second) queried every second for the
  p95 of each service's request-duration histogram over a 5 s rate window, same hysteresis;
- ``alertmanager``: only alerts open incidents (FLOTILLA_HEALTH_OPEN_FROM=alerts):
  Prometheus' rule (the same p95, ``for: 2s``, evaluated every second) -> Alertmanager
  (group_wait 1 s) -> the health agent's webhook.

Between faults the sim is reset and the agent must have seen checkout-dev healthy again.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import psycopg

from flotilla.envelope import Envelope
from flotilla.fleet import HEALTH, SIM, url
from flotilla.registry import registry_client
from flotilla.serde import AvroSerde, SerdeError
from flotilla.settings import StackSettings, load_settings
from flotilla.tailing import tail_consumer
from services.health_agent.scrape import settled

REPO = Path(__file__).resolve().parents[1]
FLEETCTL = [sys.executable, str(REPO / "infra" / "local" / "fleetctl.py")]
SERVICE, DEPENDENCY = "checkout-dev", "payments-dev"
OPENING = {"ServiceLatencyIncreased", "ServiceDegraded"}
WAYS = {
    "scrape": {"FLOTILLA_HEALTH_SOURCE": "scrape", "FLOTILLA_HEALTH_OPEN_FROM": "metrics"},
    "prometheus": {"FLOTILLA_HEALTH_SOURCE": "prometheus", "FLOTILLA_HEALTH_OPEN_FROM": "metrics"},
    "alertmanager": {"FLOTILLA_HEALTH_SOURCE": "prometheus", "FLOTILLA_HEALTH_OPEN_FROM": "alerts"},
}


def http(method: str, address: str, body: object | None = None) -> None:
    import json
    import urllib.request

    request = urllib.request.Request(
        address, data=json.dumps(body).encode() if body is not None else None, method=method
    )
    request.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(request, timeout=10) as resp:
        resp.read()


def fleet(action: str, env: dict[str, str]) -> None:
    done = subprocess.run([*FLEETCTL, action], capture_output=True, text=True, timeout=600, env=env)
    if done.returncode != 0:
        raise SystemExit(f"fleetctl {action} failed:\n{done.stdout}\n{done.stderr}")


def wait_healthy(settings: StackSettings, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with psycopg.connect(settings.pg_dsn(HEALTH.database)) as conn:
            open_incident = conn.execute(
                "SELECT 1 FROM health_incidents WHERE service = %s AND cleared_at IS NULL", (SERVICE,)
            ).fetchone()
            if settled(conn, SERVICE) and open_incident is None:
                return
        time.sleep(0.2)
    raise SystemExit(f"{SERVICE} did not return to healthy within {timeout:.0f}s")


def one_fault(settings: StackSettings, serde: AvroSerde) -> float:
    """Seconds from the fault to its incident's opening record at a consumer."""
    http("POST", f"{url(SIM)}/reset", {})
    wait_healthy(settings)
    time.sleep(6)  # a 5 s rate window of healthy requests only, whatever the last fault left
    consumer = tail_consumer(settings.kafka_bootstrap, ["incidents"], **{"fetch.wait.max.ms": 5})
    try:
        consumer.poll(1.0)  # joined and positioned at the end before the fault
        injected = time.monotonic()
        http("POST", f"{url(SIM)}/faults", {"service": DEPENDENCY, "kind": "dependency-slow"})
        while time.monotonic() - injected < 120:
            msg = consumer.poll(0.1)
            if msg is None or msg.error():
                continue
            try:
                Envelope.from_headers(msg.headers())
                decoded = serde.deserialize(msg.value())
            except (ValueError, SerdeError):
                continue
            kind = decoded.record_name.rsplit(".", 1)[-1]
            if kind in OPENING and decoded.value.get("service") == SERVICE:
                return time.monotonic() - injected
        raise SystemExit("no incident within 120 s of the fault")
    finally:
        consumer.close()
        http("POST", f"{url(SIM)}/reset", {})


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(p / 100 * len(ordered)) - 1))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--faults", type=int, default=10, help="faults per way")
    parser.add_argument("--ways", default=",".join(WAYS), help="which of scrape, prometheus, alertmanager")
    args = parser.parse_args()
    settings = load_settings()
    serde = AvroSerde(registry_client(settings.schema_registry_url))
    results: dict[str, list[float]] = {}
    try:
        for way in args.ways.split(","):
            env = {**os.environ, **WAYS[way]}
            fleet("down", env)
            fleet("up", env)
            results[way] = [one_fault(settings, serde) for _ in range(args.faults)]
            print(f"[detection] {way:<12} {' '.join(f'{s:.2f}' for s in results[way])}", flush=True)
    finally:
        fleet("down", dict(os.environ))
        fleet("up", dict(os.environ))  # the fleet as `make fleet-up` leaves it
    print(f"\nfault -> incident opened (s), {args.faults} faults each, {SERVICE} (dependency {DEPENDENCY} slowed)")
    print(f"{'way':<14}{'p50':>8}{'p95':>8}{'min':>8}{'max':>8}")
    for way, values in results.items():
        print(
            f"{way:<14}{statistics.median(values):8.2f}{percentile(values, 95):8.2f}"
            f"{min(values):8.2f}{max(values):8.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
