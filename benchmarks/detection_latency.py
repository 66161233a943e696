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
import sys
import time

from incident_latency import http, percentile, wait_healthy
from storm import fleet

from flotilla.envelope import Envelope
from flotilla.fleet import SIM, url
from flotilla.registry import registry_client
from flotilla.serde import AvroSerde, SerdeError
from flotilla.settings import StackSettings, load_settings
from flotilla.tailing import tail_consumer

SERVICE, DEPENDENCY = "checkout-dev", "payments-dev"
OPENING = {"ServiceLatencyIncreased", "ServiceDegraded"}
WAYS = {
    "scrape": {"FLOTILLA_HEALTH_SOURCE": "scrape", "FLOTILLA_HEALTH_OPEN_FROM": "metrics"},
    "prometheus": {"FLOTILLA_HEALTH_SOURCE": "prometheus", "FLOTILLA_HEALTH_OPEN_FROM": "metrics"},
    "alertmanager": {"FLOTILLA_HEALTH_SOURCE": "prometheus", "FLOTILLA_HEALTH_OPEN_FROM": "alerts"},
}


SETTLED = {"RecoveryCompleted", "RecoveryFailed", "CompensationCompleted", "IncidentEscalated"}


def one_fault(settings: StackSettings, serde: AvroSerde) -> float:
    """Seconds from the fault to its incident's opening record at a consumer. The incident
    is then left to finish (the fleet scales checkout-dev) before the sim is reset: a scale
    landing after the reset would leave the next fault with nothing to breach."""
    http("POST", f"{url(SIM)}/reset", {})
    wait_healthy(settings, SERVICE, timeout=120)
    time.sleep(6)  # a 5 s rate window of healthy requests only, whatever the last fault left
    consumer = tail_consumer(settings.kafka_bootstrap, ["incidents"], **{"fetch.wait.max.ms": 5})
    try:
        consumer.poll(1.0)  # joined and positioned at the end before the fault
        injected = time.monotonic()
        http("POST", f"{url(SIM)}/faults", {"service": DEPENDENCY, "kind": "dependency-slow"})
        opened: float | None = None
        incident: str | None = None
        while time.monotonic() - injected < 240:
            msg = consumer.poll(0.1)
            if msg is None or msg.error():
                continue
            try:
                envelope = Envelope.from_headers(msg.headers())
                decoded = serde.deserialize(msg.value())
            except (ValueError, SerdeError):
                continue
            kind = decoded.record_name.rsplit(".", 1)[-1]
            if incident is None and kind in OPENING and decoded.value.get("service") == SERVICE:
                opened, incident = time.monotonic() - injected, envelope.correlationid
            elif incident is not None and envelope.correlationid == incident and kind in SETTLED:
                assert opened is not None
                return opened
        raise SystemExit(f"no settled incident within 240 s of the fault (opened: {incident})")
    finally:
        consumer.close()
        http("POST", f"{url(SIM)}/reset", {})


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
            # every fault opens an incident on checkout-dev: no cap on incidents per service
            env = {**os.environ, "FLOTILLA_HEALTH_INCIDENTS_PER_HOUR": "0", **WAYS[way]}
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
