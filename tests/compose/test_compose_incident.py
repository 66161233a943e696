"""`docker compose up` on a real Docker engine: a whole incident, approved with the CLI.

The engine and the images come from ``infra/compose/engine.py`` (Debian's docker.io, a
debootstrapped base, a stand-in under each official image's name, since no registry can
be reached here); the compose file is used exactly as users get it. Every service but
Grafana (no source for it here) and Jaeger (nothing waits for it) is started; the demo's
``incident`` job runs with DEMO_AUTO_APPROVE=0, so it waits for a person, and the test
approves the proposal with ``flotilla approve`` against the compose fleet's published
policy port, as an operator would. The job's exit code says whether the recovery was
verified and the audit chain intact. Everything is torn down with ``down -v`` whatever
happens; the project name is this test's own, so nothing else is touched. To prove that,
the test first puts bystanders on the engine (another compose project's container, volume
and network, an image of someone else's, tagged and untagged) and checks, after the
teardown and the removal of the images its rebuild replaced, that every one of them and
everything else on the engine that is not ours is still there.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.support.scripts import load_script

REPO_ROOT = Path(__file__).resolve().parents[2]
PROJECT = "flotilla-compose-test"
LEFT_OUT = {"grafana", "jaeger", "incident"}
FLOTILLA = Path(sys.executable).parent / "flotilla"
PY = sys.executable

engine = load_script("flotilla_compose_engine", REPO_ROOT / "infra" / "compose" / "engine.py")

pytestmark = pytest.mark.timeout(1200)


def compose(*args: str, timeout: float = 900, check: bool = True) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DOCKER_BUILDKIT": "0"}
    done = subprocess.run(
        ["docker", "compose", "-p", PROJECT, *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )
    if check and done.returncode != 0:
        raise AssertionError(f"docker compose {' '.join(args)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return done


def services() -> list[str]:
    names = compose("config", "--services").stdout.split()
    return [n for n in names if n not in LEFT_OUT]


def states() -> dict[str, str]:
    out = compose("ps", "-a", "--format", "json").stdout
    rows = [json.loads(line) for line in out.splitlines() if line.strip()]
    return {r["Service"]: f"{r['State']} {r.get('Health', '')}".strip() for r in rows}


def docker(*args: str, stdin: bytes | None = None) -> str:
    done = subprocess.run(["docker", *args], input=stdin, capture_output=True, timeout=120)
    assert done.returncode == 0, f"docker {' '.join(args)}: {done.stderr.decode()[-1000:]}"
    return done.stdout.decode()


def foreign() -> set[str]:
    """Everything on the engine that this lane did not make: containers, volumes and networks
    outside its compose project, images without the stand-ins' label (tagged or not)."""
    ids = set()
    project_label = '{{.Label "com.docker.compose.project"}}'
    for kind, listing in (
        ("container", ["ps", "-a", "--no-trunc", "--format", "{{.ID}} " + project_label]),
        ("volume", ["volume", "ls", "--format", "{{.Name}} " + project_label]),
        ("network", ["network", "ls", "--no-trunc", "--format", "{{.ID}} " + project_label]),
    ):
        for row in docker(*listing).splitlines():
            ident, _, project = row.partition(" ")
            if project != PROJECT:
                ids.add(f"{kind} {ident}")
    ours = set(docker("images", "-q", "--no-trunc", "--filter", f"label={engine.LABEL}").split())
    ids |= {f"image {i}" for i in set(docker("images", "-q", "--no-trunc").split()) - ours}
    return ids


@contextmanager
def bystanders() -> Iterator[set[str]]:
    """Another project's container, volume and network and someone else's images (one tagged,
    one untagged), none of them labelled as ours; removed afterwards."""
    name = f"flotilla-bystander-{os.getpid()}"
    made = []
    try:
        for tagged in (True, False):
            layer = io.BytesIO()
            with tarfile.open(fileobj=layer, mode="w") as tar:
                data = name.encode() + (b" tagged" if tagged else b" untagged")
                info = tarfile.TarInfo("bystander")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            image = docker("import", "-", *([f"{name}/image:1"] if tagged else []), stdin=layer.getvalue()).strip()
            made.append(("image", image))
        label = f"com.docker.compose.project={name}"
        made.append(("network", docker("network", "create", "--label", label, name).strip()))
        made.append(("volume", docker("volume", "create", "--label", label, name).strip()))
        made.append(("container", docker(
            "create", "--name", name, "--label", label, "--network", name, "-v", f"{name}:/data",
            f"{name}/image:1", "/bystander",
        ).strip()))  # fmt: skip
        yield {f"{kind} {ident}" for kind, ident in made}
    finally:
        for kind, ident in reversed(made):
            rm = {"container": ["rm", "-f"], "volume": ["volume", "rm"], "network": ["network", "rm"]}
            subprocess.run(["docker", *rm.get(kind, ["rmi", "-f"]), ident], capture_output=True)


def built_here() -> list[str]:
    """The images compose builds (services with a ``build:``), by tag."""
    config = json.loads(compose("config", "--format", "json").stdout)
    return sorted({s["image"] for s in config["services"].values() if "build" in s and "image" in s})


@contextmanager
def compose_fleet() -> Iterator[None]:
    began = time.monotonic()
    before = {tag: engine.image_id(tag) for tag in built_here()}
    try:
        compose("up", "-d", "--build", *services(), timeout=1500)
        print(f"[compose] up --build: {time.monotonic() - began:.0f}s")
        deadline = time.monotonic() + 600
        while True:
            now = states()
            waiting = {s: st for s, st in now.items() if st not in ("running healthy", "exited")}
            if not waiting:
                break
            assert time.monotonic() < deadline, f"not healthy within 600 s: {waiting}"
            time.sleep(3)
        print(f"[compose] every service healthy, the init jobs done: {time.monotonic() - began:.0f}s")
        failed = compose("ps", "-a", "--status", "exited", "--format", "{{.Service}} {{.ExitCode}}").stdout
        assert all(line.endswith(" 0") for line in failed.splitlines() if line), failed
        yield
    finally:
        logs = compose("logs", "--no-color", "--tail", "200", check=False).stdout
        (REPO_ROOT / ".stack").mkdir(exist_ok=True)
        (REPO_ROOT / ".stack" / "compose-test.log").write_text(logs)
        compose("down", "-v", "--remove-orphans", check=False, timeout=300)
        print(f"[compose] removed {engine.remove_replaced(before)} image(s) of ours a rebuild replaced")


@pytest.fixture(scope="module")
def engine_with_images() -> None:
    # The compose file publishes the local stack's ports: the local stack and fleet stop first.
    subprocess.run([PY, "infra/local/fleetctl.py", "down"], cwd=REPO_ROOT, capture_output=True, timeout=300)
    subprocess.run([PY, "infra/local/stackctl.py", "down"], cwd=REPO_ROOT, capture_output=True, timeout=300)
    subprocess.run([PY, "infra/local/stackctl.py", "fetch"], cwd=REPO_ROOT, check=True, timeout=1800)
    began = time.monotonic()
    built = engine.images()
    made = ", ".join(f"{tag} {seconds:.0f}s" for tag, seconds in built.items() if seconds) or "none, all current"
    print(f"[compose] engine and images ready in {time.monotonic() - began:.0f}s; built: {made}")


def flotilla(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(FLOTILLA), *args], capture_output=True, text=True, timeout=60)


def run_incident() -> None:
    job = compose("run", "-d", "--no-deps", "-e", "DEMO_AUTO_APPROVE=0", "incident").stdout.strip().splitlines()[-1]
    try:
        deadline = time.monotonic() + 300
        proposal = None
        while proposal is None:
            listed = flotilla("--json", "approvals", "list", "--token", "alice-token")
            pending = json.loads(listed.stdout)["approvals"] if listed.returncode == 0 else []
            proposal = next((p["proposalId"] for p in pending), None)
            assert time.monotonic() < deadline, f"no proposal waiting within 300 s: {listed.stdout} {listed.stderr}"
            time.sleep(2)
        approved = flotilla("approve", proposal, "--yes", "--token", "alice-token")
        assert approved.returncode == 0, approved.stdout + approved.stderr
        assert "approved by alice" in approved.stdout
        waited = subprocess.run(["docker", "wait", job], capture_output=True, text=True, timeout=600)
        logs = subprocess.run(["docker", "logs", job], capture_output=True, text=True).stdout
        assert waited.stdout.strip() == "0", logs[-3000:]
        assert "recovered" in logs and '"ok": true' in logs, logs[-3000:]
    finally:
        subprocess.run(["docker", "rm", "-f", "-v", job], capture_output=True)


def test_an_incident_on_the_compose_fleet_is_approved_with_the_cli_and_recovers_touching_nothing_else(
    engine_with_images: None,
) -> None:
    with bystanders() as theirs:
        before = foreign()
        assert theirs <= before
        began = time.monotonic()
        with compose_fleet():
            run_incident()
            print(f"[compose] incident approved with the CLI and recovered: {time.monotonic() - began:.0f}s")
        after = foreign()
        assert before <= after, f"the compose lane removed what it did not make: {sorted(before - after)}"
        left = {c for c in after - before if c.startswith(("container", "volume", "network"))}
        project = f"label=com.docker.compose.project={PROJECT}"
        for listing in (
            ["ps", "-a", "-q", "--no-trunc"],
            ["volume", "ls", "-q"],
            ["network", "ls", "-q", "--no-trunc"],
        ):
            left |= {f"{listing[0]} {i}" for i in docker(*listing, "--filter", project).split()}
        assert not left, f"left behind by the compose lane: {sorted(left)}"
        print(f"[compose] torn down, {len(before)} things it did not make untouched: {time.monotonic() - began:.0f}s")
