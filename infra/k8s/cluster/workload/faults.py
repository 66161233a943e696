"""Faults in the test cluster's shop, made the way they happen in production: a change to
the Deployments through the API server (as a CI pipeline or an operator makes it), not a
switch inside the simulator. ``reset`` puts the shop back as ``shop.yaml`` says::

    python infra/k8s/cluster/workload/faults.py bad-rollout [--service storefront] [--version v2-slow]
    python infra/k8s/cluster/workload/faults.py slow-dependency [--service payments] [--delay-ms 500]
    python infra/k8s/cluster/workload/faults.py dependency-down [--service payments]
    python infra/k8s/cluster/workload/faults.py overload [--rate 250]
    python infra/k8s/cluster/workload/faults.py oom [--service checkout] [--mb-per-second 16]
    python infra/k8s/cluster/workload/faults.py reset

What each does, and what fixes it (docs/operations/cluster.md, "The workload"):

| fault | the change | what fixes it |
|---|---|---|
| bad-rollout | ``kubectl set image`` to v2-slow, v2-errors or v2-crash | roll back to the previous revision |
| slow-dependency | ``kubectl set env RESPONSE_DELAY_MS=...`` on payments | undo the configuration |
| dependency-down | ``kubectl scale --replicas=0`` on payments | scale it back up |
| overload | ``kubectl set env RATE=...`` on the load generator (storefront: 100/s a pod) | scale out |
| oom | ``kubectl set env LEAK_MB_PER_SECOND=...``: killed at the 64Mi limit | roll back; raise the limit |
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
for folder in (HERE, HERE.parent):  # run by path: workload, clusterctl
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))

import clusterctl  # noqa: E402
import workload  # noqa: E402

NAMESPACE = workload.SHOP_NAMESPACE
SERVICES = ("storefront", "checkout", "payments")


def _kubectl(*args: str, paths: Any) -> str:
    return workload.kubectl(*args, "-n", NAMESPACE, paths=paths)


def bad_rollout(service: str = "storefront", version: str = "v2-slow", paths: Any = clusterctl.PATHS) -> str:
    """Roll ``service`` out at a bad version; the rollout history says why (change-cause)."""
    if version not in workload.SHOP_VERSIONS or version == "v1":
        raise ValueError(f"a bad version is one of {workload.SHOP_VERSIONS[1:]}")
    cause = f"release {version} of {service}"
    _kubectl("set", "image", f"deployment/{service}", f"{service}={workload.shop_tag(version)}", paths=paths)
    # After the change: the controller copies the Deployment's annotations to its newest
    # ReplicaSet, so annotating first would label the good revision with this cause.
    _kubectl("annotate", f"deployment/{service}", f"kubernetes.io/change-cause={cause}", "--overwrite", paths=paths)
    return f"deployment/{service}: image {workload.shop_tag(version)}"


def slow_dependency(service: str = "payments", delay_ms: int = 500, paths: Any = clusterctl.PATHS) -> str:
    """A configuration change that makes a dependency answer ``delay_ms`` later."""
    _kubectl("set", "env", f"deployment/{service}", f"RESPONSE_DELAY_MS={delay_ms}", paths=paths)
    return f"deployment/{service}: RESPONSE_DELAY_MS={delay_ms}"


def dependency_down(service: str = "payments", paths: Any = clusterctl.PATHS) -> str:
    """Every replica of a dependency gone: its callers get connection errors (502 upstream)."""
    _kubectl("scale", f"deployment/{service}", "--replicas=0", paths=paths)
    return f"deployment/{service}: 0 replicas"


def overload(rate: float = 250, paths: Any = clusterctl.PATHS) -> str:
    """More customers than one storefront serves (100 requests/s a pod): requests queue
    for a worker and p95 climbs; another replica restores it."""
    _kubectl("set", "env", "deployment/loadgen", f"RATE={rate:g}", paths=paths)
    return f"deployment/loadgen: RATE={rate:g}"


def oom(service: str = "checkout", mb_per_second: int = 16, paths: Any = clusterctl.PATHS) -> str:
    """Switch on a leak: the container grows until the kernel kills it at its memory limit
    (OOMKilled), restarts, and grows again."""
    _kubectl("set", "env", f"deployment/{service}", f"LEAK_MB_PER_SECOND={mb_per_second}", paths=paths)
    return f"deployment/{service}: LEAK_MB_PER_SECOND={mb_per_second}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="faults", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="fault", required=True)
    rollout = sub.add_parser("bad-rollout", help="kubectl set image to a bad version")
    rollout.add_argument("--service", choices=SERVICES, default="storefront")
    rollout.add_argument("--version", choices=workload.SHOP_VERSIONS[1:], default="v2-slow")
    slow = sub.add_parser("slow-dependency", help="a dependency configured to answer late")
    slow.add_argument("--service", choices=SERVICES, default="payments")
    slow.add_argument("--delay-ms", type=int, default=500)
    down = sub.add_parser("dependency-down", help="a dependency scaled to 0 replicas")
    down.add_argument("--service", choices=SERVICES, default="payments")
    load = sub.add_parser("overload", help="the load generator beyond one storefront's capacity")
    load.add_argument("--rate", type=float, default=250)
    leak = sub.add_parser("oom", help="a memory leak switched on, killed at the memory limit")
    leak.add_argument("--service", choices=SERVICES, default="checkout")
    leak.add_argument("--mb-per-second", type=int, default=16)
    sub.add_parser("reset", help="the shop as shop.yaml says, and wait until it is available")
    args = parser.parse_args(argv)
    try:
        if args.fault == "bad-rollout":
            done = bad_rollout(args.service, args.version)
        elif args.fault == "slow-dependency":
            done = slow_dependency(args.service, args.delay_ms)
        elif args.fault == "dependency-down":
            done = dependency_down(args.service)
        elif args.fault == "overload":
            done = overload(args.rate)
        elif args.fault == "oom":
            done = oom(args.service, args.mb_per_second)
        else:
            workload.reset()
            done = "the shop as shop.yaml says"
    except (workload.WorkloadError, clusterctl.ClusterError) as exc:
        print(f"[faults] ERROR: {exc}", file=sys.stderr)
        return 1
    print(f"[faults] {args.fault}: {done}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
