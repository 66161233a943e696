"""The Flotilla fleet deployed into the one-node cluster by its own manifests.

``infra/k8s/overlays/cluster`` is base/ plus the stack as plain workloads (Kafka, Kafka
Connect with Debezium and our transforms, Apicurio Registry, PostgreSQL);
this script gives it what a cluster operator would: the images, the Secrets, and the
wait until it runs::

    python infra/k8s/cluster/fleetdeploy.py images   # build (if needed), save, import
    python infra/k8s/cluster/fleetdeploy.py up       # images, Secrets, apply, wait; times
    python infra/k8s/cluster/fleetdeploy.py status   # the fleet's pods and Jobs
    python infra/k8s/cluster/fleetdeploy.py usage    # CPU and memory, by namespace
    python infra/k8s/cluster/fleetdeploy.py down     # delete the namespaces it made

The images are the ones docker compose runs, built on the Docker engine compose uses
(``infra/compose/engine.py``: the stand-ins, and the fleet and Connect images from their
Dockerfiles), written with ``docker save`` and imported into the node's containerd. Each
step is skipped when its input did not change: an image is rebuilt only when a digest of
its build inputs changed, saved only when its image id changed, imported only when the
node lacks it. In the cluster an image is ``flotilla.local/<name>:<12 hex of its id>``,
pinned by a generated kustomization over the overlay, so a rebuilt image rolls its pods.

The Secrets are production's (docs/operations/kubernetes.md, "Secrets"), made with the
same generators (``flotilla.keys``, ``flotilla.registrar``) into ``.stack/cluster/fleet/
secrets`` (0700) and kept there, so a second ``up`` reuses the same keys and passwords.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import importlib.util
import json
import os
import re
import secrets
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parents[2]
for folder in (HERE, HERE.parent, REPO_ROOT / "infra" / "compose"):  # scripts, not a package
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))

import clusterctl  # noqa: E402
import engine  # noqa: E402


def _workload() -> Any:
    """workload.py (item 3's shop and monitoring), by path: its folder is named like it."""
    spec = importlib.util.spec_from_file_location("flotilla_cluster_workload", HERE / "workload" / "workload.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


OVERLAY = REPO_ROOT / "infra" / "k8s" / "overlays" / "cluster"
HOME = clusterctl.HOME / "fleet"
NAMESPACE = "flotilla"
NAMESPACES = ("flotilla", "apps")  # the overlay's (namespace.yaml): all fleet-down deletes
PYTHON = sys.executable

# The signing keys (docs/security/keys.md): one Secret each, flotilla-<key>-signing-key.
KEYS = ("authorization", "proposal", "audit", "health-agent", "diagnostic-agent", "executor", "dlq-reconciler")


class FleetError(RuntimeError):
    """The fleet could not be built, loaded or brought up; the message says where."""


# ---------------------------------------------------------------------------- images


@dataclass(frozen=True)
class FleetImage:
    """One image of the overlay: its name in the cluster, the Docker tag it is built
    under, and how (a compose stand-in by its folder, or a Dockerfile's context)."""

    name: str
    docker_tag: str
    standin: str | None = None  # engine.standins() folder
    context: Path | None = None  # docker build context (its Dockerfile)
    inputs: tuple[str, ...] = ()  # files and folders of the context the build reads
    needs: tuple[str, ...] = ()  # stand-ins it is built on (their ids join its digest)

    @property
    def cluster_name(self) -> str:
        return f"flotilla.local/{self.name}"


IMAGES = (
    FleetImage(
        "flotilla",
        "flotilla/flotilla:0.1.0",
        context=REPO_ROOT,
        inputs=(
            "Dockerfile",
            "pyproject.toml",
            "README.md",
            "constraints.txt",
            "libs",
            "services",
            "schemas",
            "infra/policies",
            "infra/local/demo.py",
        ),
        needs=("python",),
    ),
    FleetImage(
        "connect",
        "flotilla/connect:3.6.1.Final-0.2.0",
        context=REPO_ROOT / "infra" / "connect-transforms",
        inputs=("Dockerfile", "pom.xml", "src"),
        needs=("maven", "debezium-connect"),
    ),
    FleetImage("kafka", "apache/kafka:4.3.0", standin="kafka"),
    FleetImage("registry", "apicurio/apicurio-registry:3.3.3", standin="apicurio-registry"),
    FleetImage("postgres", "postgres:16", standin="postgres"),
)
SKIPPED = ("__pycache__", ".pyc", ".pem", ".egg-info", "target")  # .dockerignore's, and Maven's output


def _files(root: Path, names: Iterable[str]) -> list[Path]:
    found = []
    for name in names:
        path = root / name
        candidates = sorted(path.rglob("*")) if path.is_dir() else [path]
        found += [p for p in candidates if p.is_file() and not any(s in p.as_posix() for s in SKIPPED)]
    return found


def inputs_digest(image: FleetImage) -> str:
    """What a Dockerfile build reads: its context's files (content) and the ids of the
    stand-ins it starts from."""
    assert image.context is not None
    digest = hashlib.sha256(image.docker_tag.encode())
    for need in image.needs:
        digest.update(engine.image_id(_standin(need).official).encode())
    for path in _files(image.context, image.inputs):
        digest.update(f"{path.relative_to(image.context)}|{path.stat().st_mode & 0o111}\0".encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def _standin(folder: str) -> Any:
    return next(s for s in engine.standins() if s.folder == folder)


def _docker(*args: str, what: str, timeout: float = 1800) -> str:
    done = subprocess.run(
        ["nice", "-n", "10", "docker", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "DOCKER_BUILDKIT": "0"},  # BuildKit would fetch its frontend
    )
    if done.returncode != 0:
        raise FleetError(f"{what} failed: {(done.stderr or done.stdout).strip()[-800:]}")
    return done.stdout


def _record() -> dict[str, dict[str, str]]:
    path = HOME / "images.json"
    return json.loads(path.read_text()) if path.exists() else {}


def ensure_docker_image(image: FleetImage, record: dict[str, str]) -> float:
    """The image built on the Docker engine unless current; seconds spent building."""
    if image.standin is not None:
        return float(engine.build(_standin(image.standin)))  # cached by its recipe's digest
    began = time.monotonic()
    for need in image.needs:
        engine.build(_standin(need))
    wanted = inputs_digest(image)
    if record.get("inputs") == wanted and engine.image_id(image.docker_tag) == record.get("image_id"):
        return 0.0
    assert image.context is not None
    _docker("build", "-t", image.docker_tag, str(image.context), what=f"docker build {image.docker_tag}")
    record["inputs"] = wanted
    return time.monotonic() - began


def save(image: FleetImage, image_id: str) -> float:
    """``docker save`` of the image under its cluster tag, unless the tar holds that id."""
    tar, saved = HOME / "images" / f"{image.name}.tar", HOME / "images" / f"{image.name}.id"
    if tar.exists() and saved.exists() and saved.read_text().strip() == image_id:
        return 0.0
    began = time.monotonic()
    tar.parent.mkdir(parents=True, exist_ok=True)
    tag = f"{image.cluster_name}:{short(image_id)}"
    _docker("tag", image_id, tag, what=f"docker tag {tag}")
    try:
        _docker("save", "-o", f"{tar}.partial", tag, what=f"docker save {tag}")
    finally:
        _docker("rmi", tag, what=f"docker rmi {tag}")  # the tag only: the image keeps its own
    os.replace(f"{tar}.partial", tar)
    saved.write_text(image_id + "\n")
    return time.monotonic() - began


def short(image_id: str) -> str:
    return image_id.split(":", 1)[-1][:12]


def _ctr(*args: str, paths: Any = clusterctl.PATHS, timeout: float = 600) -> str:
    """``ctr`` in the node's mount namespace, on the node's containerd (clusterctl.import_images)."""
    holder = clusterctl.pid_of("node", paths)
    if holder is None:
        raise FleetError("the cluster is not running: make cluster-up")
    argv = ["nsenter", f"--target={holder}", "--mount", "--", "ctr", f"--address={paths.containerd_socket}"]
    done = subprocess.run([*argv, "--namespace=k8s.io", *args], capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise FleetError(f"ctr {' '.join(args)} failed: {done.stderr.strip()[-500:]}")
    return done.stdout


def load(image: FleetImage, image_id: str) -> float:
    """Import the tar into the node's containerd unless it has that tag already."""
    tag = f"{image.cluster_name}:{short(image_id)}"
    if tag in _ctr("images", "ls", "-q").split():
        return 0.0
    began = time.monotonic()
    _ctr("images", "import", str(HOME / "images" / f"{image.name}.tar"))
    return time.monotonic() - began


def images() -> tuple[dict[str, str], dict[str, dict[str, float]]]:
    """Every image built (if needed), saved and loaded; its tag per image, and seconds per
    step per image (0: cached)."""
    engine.up()
    HOME.mkdir(parents=True, exist_ok=True)
    records = _record()
    tags, took = {}, {}
    for image in IMAGES:
        record = records.setdefault(image.name, {})
        built = ensure_docker_image(image, record)
        image_id = engine.image_id(image.docker_tag)
        if not image_id:
            raise FleetError(f"no Docker image {image.docker_tag} after building it")
        record["image_id"] = image_id
        (HOME / "images.json").write_text(json.dumps(records, indent=2))
        took[image.name] = {"build": built, "save": save(image, image_id), "import": load(image, image_id)}
        tags[image.cluster_name] = short(image_id)
    return tags, {name: {k: round(v, 1) for k, v in steps.items()} for name, steps in took.items()}


# ---------------------------------------------------------------------------- Secrets


def _secret_files() -> Path:
    folder = HOME / "secrets"
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o700)
    return folder


def _kept(path: Path, make: Callable[[], str]) -> str:
    """A generated value kept in a 0600 file: the same on every ``up``."""
    if not path.exists():
        path.touch(mode=0o600)
        path.write_text(make())
    return path.read_text()


def _generate(*args: str) -> None:
    done = subprocess.run([PYTHON, "-m", *args], capture_output=True, text=True, cwd=REPO_ROOT)
    if done.returncode != 0:
        raise FleetError(f"python -m {' '.join(args)} failed: {done.stderr.strip()[-500:]}")


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def secret_manifests() -> list[dict[str, Any]]:
    """Every Secret the overlay references, from files made once by the production
    generators; tokens for the approver, the operator and Alertmanager are kept in clear
    only in the secrets folder (the Secrets hold their digests)."""
    folder = _secret_files()
    for key in (k for k in KEYS if not (folder / k / "signing-key.pem").exists() or not (folder / f"{k}.pub").exists()):
        _generate(
            "flotilla.keys", "generate", str(folder / key / "signing-key.pem"), "--public", str(folder / f"{key}.pub")
        )
    registrar, users = folder / "registrar", folder / "users.properties"
    if not (registrar.exists() and users.exists()):
        _generate("flotilla.registrar", "users", "--credentials", str(registrar), "--users", str(users))
    password = _kept(folder / "postgres-password", lambda: secrets.token_hex(24))
    approver = _kept(folder / "approver-token", lambda: secrets.token_urlsafe(32))
    operator = _kept(folder / "operator-token", lambda: secrets.token_urlsafe(32))
    alerts = _kept(folder / "alert-token", lambda: secrets.token_urlsafe(32))

    def secret(name: str, data: dict[str, str]) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": name, "namespace": NAMESPACE, "labels": {"app.kubernetes.io/part-of": "flotilla"}},
            "type": "Opaque",
            # data, not stringData: apply compares it with what is stored, so an unchanged
            # Secret stays unchanged (stringData is never stored, and always differs)
            "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()},
        }

    made = [
        secret("flotilla-postgres", {"username": "flotilla", "password": password}),
        secret("flotilla-trusted-keys", {f"{key}.pub": (folder / f"{key}.pub").read_text() for key in KEYS}),
        secret("flotilla-schema-registry-registrar", {"auth": (folder / "registrar").read_text().strip()}),
        secret("flotilla-registry-users", {"users.properties": (folder / "users.properties").read_text()}),
        secret(
            "flotilla-approvers",
            {"users.json": json.dumps({f"sha256:{_digest(approver)}": {"user": "alice", "roles": ["approver"]}})},
        ),
        secret("flotilla-operators", {"tokens.json": json.dumps([_digest(operator)])}),
        # who may deliver alerts: the tests, and the workload's Alertmanager (its token is
        # made once by workload.py, whichever of the two runs first)
        secret(
            "flotilla-alert-senders",
            {"tokens.json": json.dumps([_digest(alerts), _digest(_workload().alertmanager_token(clusterctl.PATHS))])},
        ),
    ]
    made += [
        secret(f"flotilla-{key}-signing-key", {"signing-key.pem": (folder / key / "signing-key.pem").read_text()})
        for key in KEYS
    ]
    return made


# ---------------------------------------------------------------------------- apply and wait


def kustomization(tags: dict[str, str]) -> Path:
    """The overlay with every image pinned to the id loaded into the node."""
    HOME.mkdir(parents=True, exist_ok=True)
    path = HOME / "kustomization.yaml"
    lines = [
        "# Generated by infra/k8s/cluster/fleetdeploy.py: the cluster overlay, images pinned.",
        "apiVersion: kustomize.config.k8s.io/v1beta1",
        "kind: Kustomization",
        "resources:",
        f"  - {os.path.relpath(OVERLAY, HOME)}",
        "images:",
        *(f"  - name: {name}\n    newTag: {tag}" for name, tag in sorted(tags.items())),
    ]
    path.write_text("\n".join(lines) + "\n")
    return HOME


def kubectl(*args: str, input: str | None = None, timeout: float = 120) -> str:
    try:
        return str(clusterctl.kubectl(*args, input=input, timeout=timeout))
    except clusterctl.ClusterError as exc:
        raise FleetError(str(exc)) from None


def rendered(folder: Path) -> list[dict[str, Any]]:
    import yaml

    return [doc for doc in yaml.safe_load_all(kubectl("kustomize", str(folder))) if doc]


def replace_changed_jobs(objects: list[dict[str, Any]]) -> list[str]:
    """A Job's pod template is immutable: delete each Job whose images changed (it runs
    again once applied); the names deleted."""
    deleted = []
    for job in (o for o in objects if o["kind"] == "Job"):
        name, namespace = job["metadata"]["name"], job["metadata"].get("namespace", NAMESPACE)
        try:
            current = json.loads(kubectl("get", "job", name, "-n", namespace, "-o", "json"))
        except FleetError:
            continue  # not there yet
        images = [c["image"] for c in current["spec"]["template"]["spec"]["containers"]]
        if images != [c["image"] for c in job["spec"]["template"]["spec"]["containers"]]:
            kubectl("delete", "job", name, "-n", namespace, "--wait=true", timeout=120)
            deleted.append(name)
    return deleted


def _ready(pod: dict[str, Any]) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in pod.get("status", {}).get("conditions") or [])


def _complete(job: dict[str, Any]) -> bool:
    return any(c["type"] == "Complete" and c["status"] == "True" for c in job.get("status", {}).get("conditions") or [])


def waiting_for(expected: list[dict[str, Any]]) -> list[str]:
    """What is not there yet: Deployments without a Ready pod of their current template
    (every replica available and updated), Jobs not Complete."""
    missing = []
    deployments = clusterctl.api(f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments")["items"]
    by_name = {d["metadata"]["name"]: d for d in deployments}
    jobs = {j["metadata"]["name"]: j for j in clusterctl.api(f"/apis/batch/v1/namespaces/{NAMESPACE}/jobs")["items"]}
    for obj in expected:
        name = obj["metadata"]["name"]
        if obj["kind"] == "Deployment":
            found = by_name.get(name)
            status = (found or {}).get("status", {})
            wanted = (found or {}).get("spec", {}).get("replicas", 1)
            if (
                not found
                or status.get("observedGeneration", 0) < found["metadata"]["generation"]
                or not (
                    status.get("updatedReplicas", 0)
                    == status.get("readyReplicas", 0)
                    == status.get("replicas", 0)
                    == wanted
                )
            ):
                missing.append(f"deployment/{name}")
        elif obj["kind"] == "Job" and not _complete(jobs.get(name, {})):
            missing.append(f"job/{name}")
    return missing


def wait(expected: list[dict[str, Any]], timeout: float) -> float:
    began = time.monotonic()
    deadline = began + timeout
    while True:
        try:
            missing = waiting_for(expected)
        except OSError as exc:
            missing = [f"(API: {exc})"]
        if not missing:
            return time.monotonic() - began
        if time.monotonic() > deadline:
            raise FleetError(f"not ready within {timeout:.0f}s: {', '.join(missing)}\n{problems()}")
        time.sleep(2)


def problems() -> str:
    """The pods that are not Ready, with their containers' waiting or last-terminated reasons."""
    lines = []
    for pod in clusterctl.api(f"/api/v1/namespaces/{NAMESPACE}/pods")["items"]:
        if _ready(pod) or pod["status"].get("phase") == "Succeeded":
            continue
        for c in pod["status"].get("containerStatuses") or []:
            state = c.get("state", {})
            why = state.get("waiting") or state.get("terminated") or c.get("lastState", {}).get("terminated") or {}
            lines.append(f"  {pod['metadata']['name']}/{c['name']}: restarts {c['restartCount']}, {why}")
            try:  # a member says why it is not ready in its log (its /readyz reason)
                tail = kubectl("logs", "-n", NAMESPACE, pod["metadata"]["name"], "--tail=2", timeout=30)
            except FleetError:
                continue
            lines += [f"    {line[:300]}" for line in tail.splitlines()]
    return "\n".join(lines)


def up(timeout: float = 900) -> dict[str, Any]:
    """Images, Secrets, apply, and the wait until every Deployment is Ready and every Job
    Complete; seconds per phase."""
    import yaml

    if clusterctl.pid_of("kubelet") is None:
        raise FleetError("the cluster is not running: make cluster-up")
    began = time.monotonic()
    tags, image_steps = images()
    took: dict[str, Any] = {"images": time.monotonic() - began}
    mark = time.monotonic()
    kubectl("apply", "-f", str(OVERLAY / "namespace.yaml"))
    applied = kubectl("apply", "-f", "-", input=yaml.safe_dump_all(secret_manifests()))
    # The pods read their Secrets at start (docs/operations/kubernetes.md): a changed one
    # takes a restart, as a person rotating a key does it.
    changed = [line.split()[0] for line in applied.splitlines() if line.endswith(" configured")]
    took["secrets"] = time.monotonic() - mark
    took["secrets changed"] = changed
    mark = time.monotonic()
    folder = kustomization(tags)
    objects = rendered(folder)
    took["jobs replaced"] = replace_changed_jobs(objects)
    kubectl("apply", "-k", str(folder), timeout=300)
    if changed:
        kubectl("rollout", "restart", "deployment", "-n", NAMESPACE, "-l", "app.kubernetes.io/part-of=flotilla")
    took["apply"] = time.monotonic() - mark
    took["ready"] = wait([o for o in objects if o["kind"] in ("Deployment", "Job")], timeout)
    took["total"] = time.monotonic() - began
    took["image steps"] = image_steps
    took = {k: round(v, 1) if isinstance(v, float) else v for k, v in took.items()}
    (HOME / "up-times.json").write_text(json.dumps(took, indent=2))
    return took


CLUSTER_SCOPED = ("validatingadmissionpolicy", "validatingadmissionpolicybinding")  # the overlay's, by name


def down(timeout: float = 180) -> float:
    """Delete the overlay's namespaces (and with them everything of the fleet) and its
    cluster-scoped objects (the policy service's admission policy); seconds."""
    began = time.monotonic()
    for kind in CLUSTER_SCOPED:
        kubectl("delete", kind, "flotilla-policy-service-dry-run-only", "--ignore-not-found")
    kubectl("delete", "namespace", *NAMESPACES, "--ignore-not-found", "--wait=true", f"--timeout={timeout:.0f}s",
            timeout=timeout + 30)  # fmt: skip
    return time.monotonic() - began


def _pod_uid(pid: int) -> str | None:
    """The uid of the pod a process runs in (its cgroup path names ``pod<uid>``), if any."""
    try:
        text = Path(f"/proc/{pid}/cgroup").read_text()
    except OSError:
        return None
    match = re.search(r"/pod([0-9a-f-]{36})(/|$)", text)
    return match.group(1) if match else None


def usage(seconds: float = 60) -> dict[str, Any]:
    """CPU (% of one core) and memory (PSS, MiB) of every process of the cluster over
    ``seconds``, as clusterctl.usage measures them, and split by the namespace of the pod
    each runs in (the node's own daemons and shims as `node`): what the fleet adds."""
    pods = clusterctl.api("/api/v1/pods")["items"]
    namespace_of = {p["metadata"]["uid"]: p["metadata"]["namespace"] for p in pods}
    pids = clusterctl.node_processes() | {p for p in clusterctl.status().values() if p is not None}
    before = {pid: clusterctl._ticks(pid) for pid in pids}
    time.sleep(seconds)
    hertz = os.sysconf("SC_CLK_TCK")
    split: dict[str, dict[str, float]] = {}
    for pid, ticks in before.items():
        uid = _pod_uid(pid)
        where = "node" if uid is None else namespace_of.get(uid, "(gone)")
        entry = split.setdefault(where, {"processes": 0, "cpu_percent_of_a_core": 0.0, "memory_pss_mib": 0.0})
        entry["processes"] += 1
        entry["cpu_percent_of_a_core"] += max(clusterctl._ticks(pid) - ticks, 0) / hertz / seconds * 100
        entry["memory_pss_mib"] += clusterctl._pss_kib(pid) / 1024
    total = {k: sum(e[k] for e in split.values()) for k in ("processes", "cpu_percent_of_a_core", "memory_pss_mib")}
    rounded = {where: {k: round(v, 1) for k, v in e.items()} for where, e in sorted({**split, "total": total}.items())}
    return {"seconds": seconds, **rounded}


def status() -> str:
    return kubectl("get", "pods,jobs", "-n", NAMESPACE, "-o", "wide")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="fleetdeploy", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="action", required=True)
    sub.add_parser("images", help="build (if needed), save and import every image; seconds per step")
    start = sub.add_parser("up", help="images, Secrets, apply the overlay, wait for every pod and Job")
    start.add_argument("--timeout", type=float, default=900)
    sub.add_parser("status", help="the fleet's pods and Jobs")
    measure = sub.add_parser("usage", help="CPU and memory of the cluster, split by namespace")
    measure.add_argument("--seconds", type=float, default=60)
    sub.add_parser("down", help="delete the fleet's namespaces")
    args = parser.parse_args(argv)
    try:
        if args.action == "images":
            _, took = images()
            print(f"[fleet] images (seconds per step; 0 = cached): {json.dumps(took)}")
        elif args.action == "up":
            print(f"[fleet] up (seconds): {json.dumps(up(args.timeout))}")
        elif args.action == "usage":
            print(f"[fleet] usage: {json.dumps(usage(args.seconds))}")
        elif args.action == "status":
            print(status(), end="")
        else:
            print(f"[fleet] down in {down():.1f}s")
    except (FleetError, engine.EngineError, clusterctl.ClusterError) as exc:
        print(f"[fleet] ERROR: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
