"""A real workload for the test cluster (issue 41, item 3): a shop of three HTTP services,
a load generator, kube-state-metrics, Prometheus and Alertmanager, all built here.

- ``go/shop``: storefront -> checkout -> payments, one binary in four versions (the
  version is stamped at link time: v1, v2-slow, v2-errors, v2-crash), instrumented with
  the OpenTelemetry Go SDK (otelhttp) and its Prometheus exporter; ``go/loadgen``.
- kube-state-metrics from the Go module proxy (``k8s.io/kube-state-metrics/v2``).
- Prometheus and Alertmanager: Debian's binaries (the local stack runs the same ones),
  with the two shared libraries they link, in images ``clusterimages.py`` writes.

``shop.yaml`` and ``monitoring.yaml`` deploy them into the namespaces ``shop`` and
``monitoring``; ``faults.py`` breaks the shop the way production breaks::

    python infra/k8s/cluster/workload/workload.py build     # seconds each part took
    python infra/k8s/cluster/workload/workload.py deploy    # import images, apply, wait
    python infra/k8s/cluster/workload/workload.py reset     # the shop as shop.yaml says
    python infra/k8s/cluster/workload/workload.py query 'PROMQL'
    python infra/k8s/cluster/workload/workload.py remove    # its namespaces and RBAC
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import secrets
import shutil
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
CLUSTER = HERE.parent
for folder in (CLUSTER, CLUSTER.parent):  # run by path: clusterctl, clusterimages, controlplane
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))

import clusterctl  # noqa: E402
import clusterimages  # noqa: E402

SHOP_VERSIONS = ("v1", "v2-slow", "v2-errors", "v2-crash")
KSM_VERSION = "v2.20.0"
# Debian's packages: the binary, and the version its image is tagged with.
DEBIAN = {
    "prometheus": ("prometheus", "/usr/bin/prometheus", "2.42.0"),
    "alertmanager": ("prometheus-alertmanager", "/usr/bin/prometheus-alertmanager", "0.25.0"),
}
TEMPLATES = {
    "alertmanager": ("/usr/share/prometheus/alertmanager/default.tmpl", "/usr/share/prometheus/alertmanager/email.tmpl")
}
NOBODY = "65534"
SHOP_NAMESPACE = "shop"
MONITORING_NAMESPACE = "monitoring"
MANIFESTS = (HERE / "shop.yaml", HERE / "monitoring.yaml")
CLUSTER_OBJECTS = (  # cluster-scoped, so not removed with the namespaces
    "clusterrole/flotilla-workload:kube-state-metrics",
    "clusterrolebinding/flotilla-workload:kube-state-metrics",
)
SHOP_DEPLOYMENTS = ("payments", "checkout", "storefront", "loadgen")
MONITORING_DEPLOYMENTS = ("kube-state-metrics", "prometheus", "alertmanager")


class WorkloadError(RuntimeError):
    """The workload could not be built or deployed; the message says where to look."""


def shop_tag(version: str) -> str:
    return f"flotilla.local/shop:{version}"


LOADGEN_TAG = "flotilla.local/loadgen:1"
KSM_TAG = f"flotilla.local/kube-state-metrics:{KSM_VERSION}"


def _sources_digest() -> str:
    digest = hashlib.sha256()
    for source in sorted((HERE / "go").rglob("*")):
        if source.is_file():
            digest.update(source.relative_to(HERE).as_posix().encode() + b"\0" + source.read_bytes())
    return digest.hexdigest()[:12]


def shop_bin(paths: Any) -> Path:
    """The shop's binaries, keyed by a digest of their sources (go.mod and go.sum too)."""
    return Path(paths.home) / "bin" / f"workload-{_sources_digest()}"


def ksm_bin(paths: Any) -> Path:
    return Path(paths.home) / "bin" / f"kube-state-metrics-{KSM_VERSION}" / "kube-state-metrics"


def build_shop(paths: Any, log: Path) -> None:
    """Each version of the shop is the same source linked with another version stamp: Go's
    build cache compiles once and links four times."""
    src = Path(paths.src) / "workload"
    shutil.rmtree(src, ignore_errors=True)
    shutil.copytree(HERE / "go", src)

    def build(out: Path) -> None:
        for version in SHOP_VERSIONS:
            (out / version).mkdir()
            flags = f"-ldflags=-s -w -X main.version={version}"
            clusterctl._go(["build", "-trimpath", flags, "-o", str(out / version / "shop"), "./shop"], src, log)
        clusterctl._go(["build", "-trimpath", "-ldflags=-s -w", "-o", str(out / "loadgen"), "./loadgen"], src, log)

    clusterctl._build_into(shop_bin(paths), build)
    for stale in shop_bin(paths).parent.glob("workload-*"):  # earlier sources' binaries
        if stale != shop_bin(paths) and not stale.name.endswith(".partial"):
            shutil.rmtree(stale, ignore_errors=True)


def build_ksm(paths: Any, log: Path) -> None:
    """kube-state-metrics from its module, as clusterctl builds CoreDNS: a scratch module
    that requires it, its own requirements resolved by the Go command (no go.sum kept)."""
    src = Path(paths.src) / "kube-state-metrics"
    src.mkdir(parents=True, exist_ok=True)
    (src / "go.mod").write_text(
        f"module flotilla.local/ksm\n\ngo 1.26.0\n\nrequire k8s.io/kube-state-metrics/v2 {KSM_VERSION}\n"
    )
    (src / "go.sum").unlink(missing_ok=True)
    stamp = f"-X github.com/prometheus/common/version.Version={KSM_VERSION.lstrip('v')}"
    target = ksm_bin(paths)
    clusterctl._build_into(
        target.parent,
        lambda out: clusterctl._go(
            [
                "build",
                "-trimpath",
                f"-ldflags=-s -w {stamp}",
                "-o",
                str(out / target.name),
                "k8s.io/kube-state-metrics/v2",
            ],
            src,
            log,
        ),
    )


def _shared_libraries(binary: Path) -> dict[str, Path]:
    """What ``ldd`` says a dynamically linked binary loads: path in the image -> file here."""
    done = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, check=True)
    found: dict[str, Path] = {}
    for line in done.stdout.splitlines():
        parts = line.split()
        if "=>" in parts and len(parts) >= 3 and parts[2].startswith("/"):
            found[parts[2]] = Path(parts[2])
        elif parts and parts[0].startswith("/"):  # the loader itself
            found[parts[0]] = Path(parts[0])
    return found


def debian_image(name: str) -> clusterimages.Image:
    """Debian's binary as the entrypoint, with the libraries it links (glibc and the loader),
    resolved to their files; run as nobody."""
    _package, binary, version = DEBIAN[name]
    files = {binary: clusterimages.ImageFile(Path(binary).read_bytes(), 0o755)}
    for inside, here in _shared_libraries(Path(binary)).items():
        files[inside] = clusterimages.ImageFile(here.resolve().read_bytes(), 0o755)
    for template in TEMPLATES.get(name, ()):  # Alertmanager parses its default templates at start
        files[template] = clusterimages.ImageFile(Path(template).read_bytes())
    return clusterimages.Image(tag=f"flotilla.local/{name}:{version}", files=files, entrypoint=[binary], user=NOBODY)


def ensure_debian_packages() -> list[str]:
    missing = [package for package, binary, _ in DEBIAN.values() if not Path(binary).exists()]
    if missing:
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        for argv in (
            ["apt-get", "update", "-q"],
            ["apt-get", "install", "-y", "-q", "--no-install-recommends", *missing],
        ):
            done = subprocess.run(argv, env=env, capture_output=True, text=True)
            if done.returncode != 0:
                raise WorkloadError(f"{' '.join(argv)} failed: {done.stderr[-500:]}")
    return missing


def images(paths: Any) -> dict[str, clusterimages.Image]:
    """Every image of the workload, by the name of its tar."""
    shop = shop_bin(paths)
    found = {
        f"shop-{version}": clusterimages.binary_image(shop_tag(version), shop / version / "shop", user="65532")
        for version in SHOP_VERSIONS
    }
    found["loadgen"] = clusterimages.binary_image(LOADGEN_TAG, shop / "loadgen", user="65532")
    found["kube-state-metrics"] = clusterimages.binary_image(KSM_TAG, ksm_bin(paths), user=NOBODY)
    for name in DEBIAN:
        found[name] = debian_image(name)
    return found


def build(paths: Any = clusterctl.PATHS) -> dict[str, float]:
    """Build what is missing, write the image tars that changed; seconds each took."""
    paths.logs.mkdir(parents=True, exist_ok=True)
    log = paths.logs / "workload-build.log"
    took: dict[str, float] = {}
    for name, ready, step in (
        ("shop, loadgen", (shop_bin(paths) / "loadgen").exists(), build_shop),
        ("kube-state-metrics", ksm_bin(paths).exists(), build_ksm),
    ):
        began = time.monotonic()
        if not ready:
            step(paths, log)
        took[name] = 0.0 if ready else round(time.monotonic() - began, 1)
    ensure_debian_packages()
    began = time.monotonic()
    for name, wanted in images(paths).items():
        tar = paths.images / f"{name}.tar"
        stamp = paths.images / f"{name}.id"
        wanted_id = clusterimages.image_id(wanted)
        if not tar.exists() or not stamp.exists() or stamp.read_text() != wanted_id:
            stamp.write_text(clusterimages.write(wanted, tar))
    took["images"] = round(time.monotonic() - began, 1)
    return took


# ---------------------------------------------------------------------------- deploy


def kubectl(*args: str, paths: Any = clusterctl.PATHS, input: str | None = None, timeout: float = 60) -> str:
    return str(clusterctl.kubectl(*args, paths=paths, input=input, timeout=timeout))


def token_file(paths: Any) -> Path:
    return Path(paths.home) / "workload" / "alertmanager-token"


def alertmanager_token(paths: Any) -> str:
    """Alertmanager's bearer token for the health agent, made once and kept with the
    cluster's files; the health agent admits its SHA-256 (flotilla-alert-senders)."""
    path = token_file(paths)
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(secrets.token_urlsafe(32))
        path.chmod(0o600)
    return path.read_text().strip()


def wait_available(namespace: str, names: tuple[str, ...], paths: Any, timeout: float = 120) -> None:
    for name in names:
        kubectl(
            "rollout",
            "status",
            f"deployment/{name}",
            "-n",
            namespace,
            f"--timeout={int(timeout)}s",
            paths=paths,
            timeout=timeout + 10,
        )


def deploy(paths: Any = clusterctl.PATHS, *, timeout: float = 180) -> dict[str, float]:
    """Build if needed, import the images into the node, apply both manifests, wait until
    every Deployment is available; seconds per phase."""
    took = {"build": sum(build(paths).values())}
    began = time.monotonic()
    clusterctl.import_images(paths, tuple(images(paths)))
    took["images imported"] = time.monotonic() - began
    began = time.monotonic()
    for manifest in MANIFESTS:
        kubectl("apply", "-f", str(manifest), paths=paths)
    secret = kubectl(
        "create",
        "secret",
        "generic",
        "alertmanager-flotilla-token",
        "-n",
        MONITORING_NAMESPACE,
        f"--from-literal=token={alertmanager_token(paths)}",
        "--dry-run=client",
        "-o",
        "json",
        paths=paths,
    )
    kubectl("apply", "-f", "-", input=secret, paths=paths)
    wait_available(SHOP_NAMESPACE, SHOP_DEPLOYMENTS, paths, timeout)
    wait_available(MONITORING_NAMESPACE, MONITORING_DEPLOYMENTS, paths, timeout)
    took["available"] = time.monotonic() - began
    return {k: round(v, 1) for k, v in took.items()}


def reset(paths: Any = clusterctl.PATHS, *, timeout: float = 120) -> None:
    """The shop's Deployments and autoscaler exactly as shop.yaml says (``replace``, not
    ``apply``: apply keeps fields another writer added, such as a fault's env), then wait."""
    import yaml

    documents = [
        d
        for d in yaml.safe_load_all((HERE / "shop.yaml").read_text())
        if d["kind"] in ("Deployment", "HorizontalPodAutoscaler")
    ]
    # A controller (the HPA, the Deployment controller's status) may write between the read
    # replace makes and its write: a conflict is that, and the replace is made again.
    for attempt in range(5):
        try:
            kubectl("replace", "-f", "-", input=yaml.safe_dump_all(documents), paths=paths)
            break
        except clusterctl.ClusterError as error:
            if "Conflict" not in str(error) or attempt == 4:
                raise
            time.sleep(1)
    wait_available(SHOP_NAMESPACE, SHOP_DEPLOYMENTS, paths, timeout)


def remove(paths: Any = clusterctl.PATHS) -> None:
    """Delete the workload's two namespaces and its cluster-scoped RBAC (nothing else)."""
    kubectl(
        "delete",
        "namespace",
        SHOP_NAMESPACE,
        MONITORING_NAMESPACE,
        "--ignore-not-found",
        "--wait=true",
        paths=paths,
        timeout=180,
    )
    kubectl("delete", *CLUSTER_OBJECTS, "--ignore-not-found", paths=paths)


# ---------------------------------------------------------------------------- reading it


def service_path(namespace: str, service: str, port: int, path: str) -> str:
    """The API server's proxy to a Service: reached from the machine through the relayed
    port on 127.0.0.1, like every other call of the admin."""
    return f"/api/v1/namespaces/{namespace}/services/{service}:{port}/proxy{path}"


def query(promql: str, paths: Any = clusterctl.PATHS) -> list[dict[str, Any]]:
    """An instant query to the cluster's Prometheus: its result vector."""
    answer = clusterctl.api(
        service_path(
            MONITORING_NAMESPACE, "prometheus", 9090, "/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        ),
        paths,
        timeout=10,
    )
    if isinstance(answer, str):
        answer = json.loads(answer)
    if answer.get("status") != "success":
        raise WorkloadError(f"query {promql!r}: {answer}")
    result: list[dict[str, Any]] = answer["data"]["result"]
    return result


def alerts(paths: Any = clusterctl.PATHS) -> list[dict[str, Any]]:
    """The alerts Alertmanager holds (API v2)."""
    answer = clusterctl.api(
        service_path(MONITORING_NAMESPACE, "alertmanager", 9093, "/api/v2/alerts"), paths, timeout=10
    )
    found: list[dict[str, Any]] = json.loads(answer) if isinstance(answer, str) else answer
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="workload", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="action", required=True)
    sub.add_parser("build", help="build the binaries and image tars that are missing")
    sub.add_parser("deploy", help="import the images, apply shop.yaml and monitoring.yaml, wait")
    sub.add_parser("reset", help="the shop's Deployments as shop.yaml says (undo every fault)")
    ask = sub.add_parser("query", help="an instant PromQL query to the cluster's Prometheus")
    ask.add_argument("promql")
    sub.add_parser("alerts", help="the alerts Alertmanager holds")
    sub.add_parser("remove", help="delete the namespaces shop and monitoring and the workload's RBAC")
    args = parser.parse_args(argv)
    try:
        if args.action == "build":
            print(f"[workload] built (seconds; 0 = cached): {json.dumps(build())}")
        elif args.action == "deploy":
            print(f"[workload] deployed (seconds): {json.dumps(deploy())}")
            print(f"[workload] Alertmanager's token for the health agent: {token_file(clusterctl.PATHS)}")
        elif args.action == "reset":
            reset()
        elif args.action == "query":
            print(json.dumps(query(args.promql), indent=2))
        elif args.action == "alerts":
            print(json.dumps(alerts(), indent=2))
        else:
            remove()
    except (WorkloadError, clusterctl.ClusterError) as exc:
        print(f"[workload] ERROR: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
