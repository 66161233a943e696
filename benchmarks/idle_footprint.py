"""What the idle fleet costs: CPU (% of one core) and memory per component.

    make fleet-up && .venv/bin/python benchmarks/idle_footprint.py --seconds 60

Nothing is injected: the sim runs healthy, Prometheus scrapes it (and evaluates the alert
rule) every second, the health agent queries Prometheus every second, every loop polls.
Processes are found from /proc by what they run (Kafka, Kafka Connect, the registry,
Prometheus, Alertmanager, PostgreSQL's WAL senders and its other processes, each
service's ``python -m services.<name>``, the supervisors), and their CPU time is read
twice, ``--seconds`` apart. Memory is the proportional set size (PSS: shared pages split
between the processes sharing them), so PostgreSQL's shared buffers are not counted once
per backend.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

TICKS = os.sysconf("SC_CLK_TCK")
COMPONENTS = (
    ("kafka", "kafka.Kafka"),
    ("connect", "ConnectDistributed"),
    ("registry", "apicurio"),
    ("alertmanager", "/usr/bin/prometheus-alertmanager"),  # before prometheus: its path contains it
    ("prometheus", "/usr/bin/prometheus"),
    ("supervisors", "supervisord"),
    ("dbos", "dbos_baseline.py"),  # the storm's other side (benchmarks/dbos_baseline.py), while it runs
)


def _processes() -> Iterator[tuple[int, str, str]]:
    """(pid, command name, command line) of every process we can read."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            comm = (entry / "comm").read_text().strip()
        except OSError:
            continue
        yield int(entry.name), comm, cmdline


def component_of(comm: str, cmdline: str) -> str | None:
    if comm == "postgres":
        # The logical-decoding senders apart (one per outbox connector, each decoding the
        # whole cluster's WAL): what sharing one connector between databases could save.
        return "postgresql-walsenders" if "walsender" in cmdline else "postgresql"
    if " -m services." in cmdline:
        return cmdline.split(" -m services.", 1)[1].split()[0]
    for name, marker in COMPONENTS:
        if marker in cmdline and "idle_footprint" not in cmdline:
            return name
    return None


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime + stime


def pss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1]) / 1024
    return 0.0


def snapshot() -> dict[int, tuple[str, float]]:
    found: dict[int, tuple[str, float]] = {}
    for pid, comm, cmdline in _processes():
        name = component_of(comm, cmdline)
        if name is None:
            continue
        try:
            found[pid] = (name, cpu_seconds(pid))
        except OSError:
            continue
    return found


def cpu_between(before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]]) -> dict[str, float]:
    """CPU seconds per component between two snapshots (a process born meanwhile: all of it)."""
    cpu: dict[str, float] = defaultdict(float)
    for pid, (name, seconds) in after.items():
        cpu[name] += seconds - (before[pid][1] if pid in before else 0.0)
    return cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="how long to watch (default 60)")
    args = parser.parse_args()
    before = snapshot()
    started = time.monotonic()
    time.sleep(args.seconds)
    after = snapshot()
    elapsed = time.monotonic() - started
    cpu = cpu_between(before, after)
    memory: dict[str, float] = defaultdict(float)
    count: dict[str, int] = defaultdict(int)
    for pid, (name, _) in after.items():
        count[name] += 1
        with contextlib.suppress(OSError):  # the process ended meanwhile
            memory[name] += pss_mib(pid)
    print(f"idle footprint over {elapsed:.0f} s ({os.cpu_count()} cores)")
    print(f"{'component':<20} {'procs':>5} {'CPU % of a core':>16} {'PSS MiB':>9}")
    for name in sorted(cpu, key=lambda n: -cpu[n]):
        print(f"{name:<20} {count[name]:>5} {100 * cpu[name] / elapsed:>16.1f} {memory[name]:>9.0f}")
    total = 100 * sum(cpu.values()) / elapsed
    print(f"{'total':<20} {sum(count.values()):>5} {total:>16.1f} {sum(memory.values()):>9.0f}")


if __name__ == "__main__":
    main()
