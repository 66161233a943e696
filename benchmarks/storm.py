"""The storm: K services breach at once on the auto-authorized path; what the fleet sustains.

    make bench-storm                                   # K = 50 and 200, R = 1 and 2
    .venv/bin/python benchmarks/storm.py --faults 50,200,1000 --replicas 1,2

For each replica count R the fleet is started afresh (``fleetctl``, every service as R
processes) on a generated estate with no production pairs, so every recovery is
authorized by policy without a person. An unmeasured warm-up storm (``--warmup``, 50
faults) runs first, as the DBOS run below discards its first workflows. (It does not
explain why a stack that had just run the long soak measured 0.13-0.17 CPU-s per
incident where fresh stacks measure 0.20-0.25: that cause is unknown; compare runs made
on one stack in one sitting.) For each K the sim is reset, K ``pay-NNNN`` turn
slow at once, and every record on ``incidents`` and ``commands`` is timed as it arrives
until each of the K incidents has its RecoveryExecuted and its verification verdict.

Figures: incidents/s and records/s sustained (first ServiceLatencyIncreased to last
RecoveryExecuted), time to drain (injection to the last verdict), end-to-end p50/p99
(ServiceLatencyIncreased -> RecoveryExecuted, the 7-record chain), and CPU per component
over the storm. The simulated action takes no time here, as in the DBOS run.

Then DBOS Transact runs the same 7-step workflow (benchmarks/dbos_baseline.py), K at
once, in its own scratch venv (.bench/dbos-venv, from benchmarks/dbos-requirements.txt),
on the same PostgreSQL, in the same run; both are printed side by side.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import defaultdict
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer
from flotilla_evidence.settings import EvidenceSettings
from idle_footprint import cpu_between, snapshot
from incident_latency import CHAIN, http, percentile
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from psycopg.conninfo import conninfo_to_dict

from flotilla.envelope import Envelope
from flotilla.fleet import DIAGNOSTIC, REMEDIATION, SIM, url
from flotilla.registry import registry_client
from flotilla.serde import AvroSerde, SerdeError
from flotilla.settings import StackSettings, load_settings
from flotilla.tailing import tail_consumer

REPO = Path(__file__).resolve().parents[1]
FLEETCTL = [sys.executable, str(REPO / "infra" / "local" / "fleetctl.py")]
STACKCTL = [sys.executable, str(REPO / "infra" / "local" / "stackctl.py")]
DBOS_VENV = REPO / ".bench" / "dbos-venv"
DBOS_WARMUP = 5  # dbos_baseline.py's WARMUP_WORKFLOWS: its fleet-work runs need as many more breaches
# DBOS's side of the race, each in the same run (benchmarks/dbos_baseline.py):
# (label, work per link, how incidents arrive, DBOS processes, queue polling s)
DBOS_RUNS = (
    ("dbos stub", "stub", "queue", 1, 1.0),  # a row per link and DBOS's defaults: the earlier baseline
    ("dbos fleet", "fleet", "queue", 1, 1.0),  # each link the fleet's own work, DBOS's defaults
    # as DBOS documents tuning: more processes on one system database, and faster polling for latency
    ("dbos fleet x2", "fleet", "queue", 2, 0.1),
    ("dbos kafka x2", "fleet", "kafka", 2, 0.1),  # incidents as Kafka records, DBOS's Kafka consumer
)
# How an incident's storm ends: its verification verdict, or on-call (e.g. a verification
# the health agent could not decide because its scrapes fell behind).
VERDICTS = ("RecoveryCompleted", "RecoveryFailed", "IncidentEscalated")

# The fleet as the storm runs it: quick detection, no simulated action time.
STORM_SETTINGS = {
    "FLOTILLA_SIM_PRODUCTION_SHARE": "0",
    "FLOTILLA_SIM_ACTION_SECONDS": "0",
    "FLOTILLA_HEALTH_SCRAPE_SECONDS": "1",
    "FLOTILLA_HEALTH_BREACH_SCRAPES": "2",
    "FLOTILLA_HEALTH_CLEAR_SCRAPES": "2",
    "FLOTILLA_HEALTH_VERIFY_SECONDS": "5",  # the default: a shorter window leaves a busy agent no slack
    # Detection by the health agent's own scrape of the sim, not by Prometheus' alerts: the
    # storm measures the incident path, and Prometheus evaluating the alert rule over a
    # generated estate of thousands of services every second is the estate's monitoring
    # cost, which on 2 cores starved the fleet (K=200: Prometheus 226 % of a core, 108 of
    # 200 incidents opened). benchmarks/detection_latency.py measures detection by alerts.
    "FLOTILLA_HEALTH_SOURCE": "scrape",
    # Only the agent's readings open incidents: Alertmanager's notifications of the same
    # breaches, arriving after a recovery's window, reopened incidents the storm never ended.
    "FLOTILLA_HEALTH_OPEN_FROM": "metrics",
    "FLOTILLA_HEALTH_METRICS_LAG_SECONDS": "0",  # the sim's gauges are of the moment
    # The agents' evidence from Prometheus, which scrapes every PROMETHEUS_SCRAPE_SECONDS here.
    "FLOTILLA_PROMQL_WINDOW": "20s",
}
# Prometheus during a storm: the estate scraped every 5 s (the local stack's 1 s over an
# estate of thousands of services is more than 2 cores give; production scrapes every 15-60
# s), and no rules or alerts (the readings open the incidents).
PROMETHEUS_SCRAPE_SECONDS = 5
# How long the estate is watched, healthy, before each storm: the idle rate of every
# component, subtracted to give the CPU the incidents themselves added.
BASELINE_SECONDS = 10.0


@dataclass
class Arrivals:
    """First arrival (monotonic s) of each record kind per incident, and a record count."""

    by_incident: dict[str, dict[str, float]] = field(default_factory=lambda: defaultdict(dict))
    service_of: dict[str, str] = field(default_factory=dict)
    records: list[float] = field(default_factory=list)


class Tail(threading.Thread):
    def __init__(self, settings: StackSettings, serde: AvroSerde) -> None:
        super().__init__(daemon=True)
        self.consumer: Consumer = tail_consumer(
            settings.kafka_bootstrap, ["incidents", "commands"], **{"fetch.wait.max.ms": 5}
        )
        self.serde = serde
        self.seen = Arrivals()
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            for msg in self.consumer.consume(500, timeout=0.1):
                now = time.monotonic()
                if msg.error():
                    continue
                try:
                    envelope = Envelope.from_headers(msg.headers())
                    decoded = self.serde.deserialize(msg.value())
                except (ValueError, SerdeError):
                    continue
                kind = decoded.record_name.rsplit(".", 1)[-1]
                self.seen.records.append(now)
                self.seen.by_incident[envelope.correlationid].setdefault(kind, now)
                if kind == "ServiceLatencyIncreased":
                    self.seen.service_of[envelope.correlationid] = str(decoded.value["service"])
        self.consumer.close()


@contextmanager
def storm_prometheus() -> Iterator[None]:
    """The stack's Prometheus at the storm's pace (PROMETHEUS_SCRAPE_SECONDS, no rules, no
    alerting) and back at the stack's afterwards (``stackctl.py prometheus-pace``)."""
    prometheus_pace("--every", str(PROMETHEUS_SCRAPE_SECONDS), "--no-rules")
    try:
        yield
    finally:
        prometheus_pace("--every", "1")


def prometheus_pace(*args: str) -> None:
    done = subprocess.run([*STACKCTL, "prometheus-pace", *args], capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        raise SystemExit(f"stackctl prometheus-pace {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}")


def metric_families(base_url: str) -> Iterable[Metric]:
    """The metric families a ``/metrics`` page exposes now."""
    with urllib.request.urlopen(f"{base_url}/metrics", timeout=10) as resp:
        return text_string_to_metric_families(resp.read().decode())


def prometheus_queries(settings: StackSettings) -> float:
    """Query API requests Prometheus has answered so far (instant and range): what the
    agents' evidence reads cost it, counted by Prometheus itself."""
    return sum(
        sample.value
        for family in metric_families(settings.prometheus_url)
        if family.name == "prometheus_http_requests"
        for sample in family.samples
        if sample.name.endswith("_total") and sample.labels.get("handler") in ("/api/v1/query", "/api/v1/query_range")
    )


def gathers() -> dict[str, tuple[float, float]]:
    """(seconds, count) of the deferred slow calls so far, per "member/kind": the evidence and
    reasoning of the two agents, outside any transaction (flotilla.deferred)."""
    found: dict[str, tuple[float, float]] = {}
    for member in (DIAGNOSTIC, REMEDIATION):
        for family in metric_families(url(member)):
            if family.name != "flotilla_deferred_gather_seconds":
                continue
            for sample in family.samples:
                kind = f"{member.name}/{sample.labels.get('kind', '')}"
                total, count = found.get(kind, (0.0, 0.0))
                if sample.name.endswith("_sum"):
                    found[kind] = (total + sample.value, count)
                elif sample.name.endswith("_count"):
                    found[kind] = (total, count + sample.value)
    return found


def fleet(action: str, env: dict[str, str], *program: str) -> None:
    done = subprocess.run([*FLEETCTL, action, *program], capture_output=True, text=True, env=env, timeout=900)
    if done.returncode != 0:
        raise SystemExit(f"fleetctl {action} failed:\n{done.stdout}\n{done.stderr}")


def storm(settings: StackSettings, serde: AvroSerde, faults: int, timeout: float) -> dict[str, Any]:
    http("POST", f"{url(SIM)}/reset", {})
    time.sleep(3)  # the health agent sees the reset estate healthy before the storm
    idle_from, idle_started = snapshot(), time.monotonic()
    time.sleep(BASELINE_SECONDS)
    idle = cpu_between(idle_from, snapshot())
    idle_seconds = time.monotonic() - idle_started
    idle_rate = sum(idle.values()) / idle_seconds
    shops = {f"shop-{i:04d}" for i in range(faults)}
    tail = Tail(settings, serde)
    tail.start()
    cpu_before, gathered_before, queries_before = snapshot(), gathers(), prometheus_queries(settings)
    injected = time.monotonic()
    for i in range(faults):
        http("POST", f"{url(SIM)}/faults", {"service": f"pay-{i:04d}", "kind": "dependency-slow"})
    deadline = injected + timeout
    mine: dict[str, dict[str, float]] = {}
    while time.monotonic() < deadline:
        mine = {i: k for i, k in list(tail.seen.by_incident.items()) if tail.seen.service_of.get(i) in shops}
        # Done when every faulty service has an incident with a verdict (a breach that
        # outlives an escalation may open a second incident: counted in "opened").
        settled = {tail.seen.service_of[i] for i, k in mine.items() if any(v in k for v in VERDICTS)}
        if settled == shops:
            break
        time.sleep(0.2)
    cpu = cpu_between(cpu_before, snapshot())
    queries = prometheus_queries(settings) - queries_before
    gathered = {}
    for kind, (seconds, count) in gathers().items():
        seconds_before, count_before = gathered_before.get(kind, (0.0, 0.0))
        gathered[kind] = (seconds - seconds_before, count - count_before)
    tail.stop.set()
    tail.join(10)
    done = [k for k in mine.values() if "RecoveryExecuted" in k]
    if not done:
        raise SystemExit(f"no incident of the storm of {faults} executed within {timeout:.0f}s")
    first = min(k["ServiceLatencyIncreased"] for k in mine.values())
    last = max(k["RecoveryExecuted"] for k in done)
    drained = max(max(k.get(v, 0.0) for v in VERDICTS) for k in mine.values())
    window = [t for t in tail.seen.records if first <= t <= last]
    e2e = [(k["RecoveryExecuted"] - k["ServiceLatencyIncreased"]) * 1000 for k in done]
    measured = time.monotonic() - injected  # what cpu_between covered
    return {
        "system": "flotilla",
        "incidents": faults,
        "opened": len(mine),
        "executed": len(done),
        "verified": sum(1 for k in mine.values() if "RecoveryCompleted" in k),
        "escalated": sum(1 for k in mine.values() if "IncidentEscalated" in k),
        "incidents_per_s": round(len(done) / max(last - first, 1e-6), 1),
        "records_per_s": round(len(window) / max(last - first, 1e-6), 1),
        "drain_s": round(drained - injected, 1),
        "p50_ms": round(percentile(e2e, 50)),
        "p99_ms": round(percentile(e2e, 99)),
        # where the time goes: each link of the chain, p50 over the incidents that made it
        "link_p50_ms": {
            f"{a}->{b}": round(percentile(gaps, 50))
            for a, b in itertools.pairwise(CHAIN)
            if (gaps := [(k[b] - k[a]) * 1000 for k in done if a in k and b in k])
        },
        # the agents' slow calls (evidence, reasoning): how many, and the mean of each, ms
        "gather_mean_ms": {k: [int(n), round(1000 * t / n)] for k, (t, n) in sorted(gathered.items()) if n},
        # the evidence reads as Prometheus saw them: requests per incident (merged reads count once)
        "prometheus_queries_per_incident": round(queries / len(done), 1),
        "cpu_pct": {n: round(100 * s / measured, 1) for n, s in sorted(cpu.items(), key=lambda x: -x[1])},
        "cpu_s_per_incident": round(sum(cpu.values()) / len(done), 3),
        # the same minus what the machine spent at rest over as long (estate, monitoring, idle loops)
        "added_cpu_s_per_incident": round((sum(cpu.values()) - idle_rate * measured) / len(done), 3),
        "idle_cpu_pct": round(100 * idle_rate, 1),
        # where the added CPU went, ms per incident and component
        "added_ms_per_incident": {
            name: ms
            for name, spent in sorted(cpu.items(), key=lambda x: -x[1])
            if (ms := round(1000 * (spent - idle.get(name, 0.0) / idle_seconds * measured) / len(done))) != 0
        },
    }


def dbos_python() -> Path:
    """The DBOS venv's python: Flotilla with its pins (the fleet's work runs in DBOS's steps)
    plus benchmarks/dbos-requirements.txt; made again when either changes."""
    python = DBOS_VENV / "bin" / "python"
    inputs = [REPO / "constraints.txt", REPO / "pyproject.toml", REPO / "benchmarks" / "dbos-requirements.txt"]
    wanted = hashlib.sha256(b"".join(p.read_bytes() for p in inputs)).hexdigest()
    stamp = DBOS_VENV / ".inputs"
    if python.exists() and stamp.exists() and stamp.read_text() == wanted:
        return python
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(DBOS_VENV)], check=True)
    install = [str(python), "-m", "pip", "install", "-q", "-c", str(inputs[0]), "-e", str(REPO), "-r", str(inputs[2])]
    subprocess.run(install, check=True)
    stamp.write_text(wanted)
    return python


def breaching(count: int, timeout: float = 180) -> list[dict[str, Any]]:
    """The sim reset, ``count`` pay-NNNN slow, and each shop-NNNN above its threshold in
    Prometheus (what DBOS's incidents start from, as the fleet's start from its detection)."""
    http("POST", f"{url(SIM)}/reset", {})
    for i in range(count):
        http("POST", f"{url(SIM)}/faults", {"service": f"pay-{i:04d}", "kind": "dependency-slow"})
    evidence = EvidenceSettings.load().model_copy(update={"promql_window": STORM_SETTINGS["FLOTILLA_PROMQL_WINDOW"]})
    readings = evidence.evidence()
    shops = [f"shop-{i:04d}" for i in range(count)]
    deadline = time.monotonic() + timeout
    while True:
        above = {r.service: r for r in readings.latency_readings() if r.p95_ms > r.threshold_ms}
        if all(shop in above for shop in shops):
            return [
                {
                    "service": shop,
                    "environment": above[shop].environment,
                    "p95_ms": above[shop].p95_ms,
                    "threshold_ms": above[shop].threshold_ms,
                }
                for shop in shops
            ]
        if time.monotonic() > deadline:
            raise SystemExit(f"{count - sum(s in above for s in shops)} of {count} services never breached")
        time.sleep(1)


def dbos_side(sizes: list[int], env: dict[str, str]) -> dict[int, list[dict[str, Any]]]:
    """Each of DBOS_RUNS for each storm size, on the fleet's sim alone (every other member
    stopped), each fleet-work run on services breaching afresh."""
    python = dbos_python()
    fleet("down", env)
    fleet("up", env)
    programs = json.loads(subprocess.run([*FLEETCTL, "status", "--json"], capture_output=True, text=True).stdout)
    for program in (p["service"] for p in programs if p["service"] != SIM.name):
        fleet("stop", env, program)
    token = Path(subprocess.run([*FLEETCTL, "sim-token-file"], capture_output=True, text=True).stdout.strip())
    run_env = {**env, "FLOTILLA_SIM_ACTION_TOKEN": token.read_text().strip()}
    # the same PostgreSQL as the fleet's, as a URL (SQLAlchemy's form, which DBOS takes)
    parts = conninfo_to_dict(load_settings().pg_dsn("postgres"))
    dsn = f"postgresql://{parts['user']}:{parts['password']}@{parts['host']}:{parts['port']}/postgres"
    found: dict[int, list[dict[str, Any]]] = {}
    for k in sizes:
        for label, work, trigger, processes, poll in DBOS_RUNS:
            # each process takes its share of the storm at once (one with no limit claims it all)
            command = [str(python), str(REPO / "benchmarks" / "dbos_baseline.py"), "--workflows", str(k)]
            command += ["--concurrency", str(math.ceil(k / processes))]
            command += ["--dsn", dsn, "--work", work, "--trigger", trigger, "--processes", str(processes)]
            command += ["--poll-interval", str(poll), "--baseline-seconds", str(BASELINE_SECONDS)]
            with tempfile.NamedTemporaryFile("w", suffix=".json") as breaches:
                if work == "fleet":
                    json.dump(breaching(k + DBOS_WARMUP), breaches)
                    breaches.flush()
                    command += ["--breaches", breaches.name]
                done = subprocess.run(command, capture_output=True, text=True, env=run_env, timeout=1800)
            if done.returncode != 0:
                raise SystemExit(f"the DBOS run {label!r} failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
            result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1]) | {"label": label}
            print(json.dumps(result), flush=True)
            found.setdefault(k, []).append(result)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--faults", default="50,200", help="storm sizes K, comma-separated (default 50,200)")
    parser.add_argument("--replicas", default="1,2", help="replica counts R, comma-separated (default 1,2)")
    parser.add_argument("--timeout", type=float, default=600, help="seconds a storm may take")
    parser.add_argument("--no-dbos", action="store_true", help="skip the DBOS baseline")
    parser.add_argument("--warmup", type=int, default=50, help="faults of the unmeasured first storm (0: none)")
    args = parser.parse_args()

    # Stopped (SIGTERM), still put Prometheus back and stop the fleet: the finally blocks run,
    # and a second SIGTERM (`timeout` passes its own on) is ignored so it cannot cut them short.
    def stop(signum: int, frame: object) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    sizes = [int(k) for k in args.faults.split(",")]
    settings = load_settings()
    serde = AvroSerde(registry_client(settings.schema_registry_url))
    results: list[dict[str, Any]] = []
    baselines: dict[int, list[dict[str, Any]]] = {}
    try:
        with storm_prometheus():
            for replicas in [int(r) for r in args.replicas.split(",")]:
                results += storms(settings, serde, replicas, sizes, args)
            if not args.no_dbos:  # at the storms' Prometheus pace: the fleet-work runs read it too
                baselines = dbos_side(sizes, storm_env(sizes, args, replicas=1))
    finally:
        fleet("down", {**os.environ})
    report(results, baselines)


def storm_env(sizes: list[int], args: argparse.Namespace, replicas: int) -> dict[str, str]:
    """The fleet's environment for the storms (and the DBOS runs: the same sim and estate)."""
    return {
        **os.environ,
        **STORM_SETTINGS,
        "FLOTILLA_SIM_SERVICES": str(2 * (max(*sizes, args.warmup, 10) + DBOS_WARMUP)),  # pairs: shop-N calls pay-N
        "FLOTILLA_ESTATE_CATALOGUE_FILE": "",  # a generated estate: no catalogue
        "FLOTILLA_FLEET_REPLICAS": str(replicas),
    }


def storms(
    settings: StackSettings, serde: AvroSerde, replicas: int, sizes: list[int], args: argparse.Namespace
) -> list[dict[str, Any]]:
    """The fleet started afresh with ``replicas`` per member, a warm-up, then one storm per size."""
    results: list[dict[str, Any]] = []
    env = storm_env(sizes, args, replicas)
    fleet("down", env)
    fleet("up", env)
    if args.warmup:
        warm = storm(settings, serde, args.warmup, args.timeout)
        print(f"warm-up storm of {args.warmup} (not counted): {warm['incidents_per_s']} wf/s", flush=True)
    for k in sizes:
        result = storm(settings, serde, k, args.timeout) | {"replicas": replicas}
        print(json.dumps(result), flush=True)
        results.append(result)
    return results


def report(results: list[dict[str, Any]], baselines: dict[int, list[dict[str, Any]]]) -> None:
    """The table: CPU s/wf is the whole machine's CPU over the storm per incident (for DBOS
    too: its processes, PostgreSQL, Prometheus, the sim...); "added" subtracts what the
    machine spends at rest over as long (the estate, its monitoring, idle loops)."""
    print(f"\nstorm on the auto-authorized path, {os.cpu_count()} cores; the 7-record chain {' -> '.join(CHAIN)}")
    header = ("system", "K", "wf/s", "rec/s", "drain s", "p50 ms", "p99 ms", "CPU s/wf", "added")
    widths = (5, 7, 7, 8, 7, 7, 9, 7)
    print(f"{header[0]:<14} " + " ".join(f"{h:>{w}}" for h, w in zip(header[1:], widths, strict=True)))
    for r in results:
        print(
            f"{'flotilla R=' + str(r['replicas']):<14} {r['incidents']:>5} {r['incidents_per_s']:>7} "
            f"{r['records_per_s']:>7} {r['drain_s']:>8} {r['p50_ms']:>7} {r['p99_ms']:>7} "
            f"{r['cpu_s_per_incident']:>9} {r['added_cpu_s_per_incident']:>7}"
        )
    for k, runs in baselines.items():
        for b in runs:
            print(
                f"{b['label']:<14} {k:>5} {b['workflows_per_s']:>7.1f} {b['steps_per_s']:>7.1f} "
                f"{b['wall_s']:>8.1f} {b['p50_ms']:>7.0f} {b['p99_ms']:>7.0f} "
                f"{b['cpu_s_per_incident']:>9.3f} {b['added_cpu_s_per_incident']:>7.3f}"
            )
    by = {(r["replicas"], r["incidents"]): r for r in results}
    for k in sorted({r["incidents"] for r in results}):
        one, two = by.get((1, k)), by.get((2, k))
        if one and two:
            print(f"K={k}: R=2 / R=1 = {two['incidents_per_s'] / one['incidents_per_s']:.2f}x", end="")
        if one:
            for b in baselines.get(k, []):
                print(f"; flotilla R=1 / {b['label']} = {one['incidents_per_s'] / b['workflows_per_s']:.2f}x", end="")
        print()
    busiest = max(results, key=lambda r: r["incidents"])
    print(f"CPU per component at K={busiest['incidents']}, R={busiest['replicas']} (% of a core): {busiest['cpu_pct']}")
    print(f"each link of the chain there, p50 ms: {busiest['link_p50_ms']}")
    print(f"the agents' slow calls there, [count, mean ms]: {busiest['gather_mean_ms']}")
    print(f"Prometheus query requests per incident there: {busiest['prometheus_queries_per_incident']}")
    print(f"added CPU per incident there, ms per component: {busiest['added_ms_per_incident']}")
    for k, runs in baselines.items():
        for b in runs:
            print(f"{b['label']} at K={k}, CPU per component (% of a core): {b['cpu_pct']}")
    print(f"median CPU per incident: {statistics.median(r['cpu_s_per_incident'] for r in results):.3f} s")


if __name__ == "__main__":
    main()
