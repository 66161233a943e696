"""A Docker engine and the images docker-compose.yml needs, on a machine with no image registry.

    python infra/compose/engine.py up        # install (Debian's docker.io) and start dockerd if needed
    python infra/compose/engine.py images    # the base and every stand-in image, built if missing
    python infra/compose/engine.py clean     # remove the images this tool built, nothing else

No image can be pulled here, so each official image the compose file names is replaced,
under its own name, by a stand-in built from the same upstream artifacts: a Debian
bookworm base made with ``debootstrap --variant=minbase`` and ``docker import``, Debian's
packages (PostgreSQL, Python, Java, curl), and the jars the local stack already fetches
from Maven Central (``infra/local/pom.xml``). Each stand-in's Dockerfile
(``infra/compose/standins/<name>``) says which of the official image's documented
behaviours it reproduces. Every image this tool builds carries the label
``dev.flotilla.standin`` and a digest of its recipe (``dev.flotilla.standin.recipe``):
a stand-in is built again only when its recipe changed, and ``clean`` removes only
images with that label. Builds use the classic builder
(``DOCKER_BUILDKIT=0``): BuildKit would fetch its Dockerfile frontend from Docker Hub.

Where this machine's outbound TLS goes through a private CA (the host's
``/usr/local/share/ca-certificates``), the base image trusts it too, so ``pip`` and
``apt`` inside builds work as they do on the host; those certificates stay in the local
images and are never part of the repository.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
STANDINS = Path(__file__).resolve().parent / "standins"
STACK_HOME = Path(os.environ.get("FLOTILLA_STACK_HOME", REPO_ROOT / ".stack"))
ENGINE_HOME = STACK_HOME / "docker"
LABEL = "dev.flotilla.standin"
RECIPE_LABEL = "dev.flotilla.standin.recipe"  # digest of what built it: rebuilt when that changes
BASE = "flotilla-standin/debian:{suite}"
SUITES = ("bookworm", "trixie")  # trixie for what needs Java 21 (Apicurio Registry 3)
MIRROR = "http://deb.debian.org/debian"
HOST_CAS = Path("/usr/local/share/ca-certificates")
# Compose v2 from the Go module proxy: v5's client needs engine API 1.44, Debian bookworm's
# docker.io speaks 1.41; bookworm's own docker-compose package is the old Python 1.29.
COMPOSE_MODULE = "github.com/docker/compose/v2"
COMPOSE_VERSION = "v2.40.3"
PLUGINS = Path("/usr/local/lib/docker/cli-plugins")


class EngineError(RuntimeError):
    """The engine could not be installed or started, or an image not built; says why."""


def _run(argv: Sequence[str], *, what: str, env: dict[str, str] | None = None, log: Path | None = None) -> str:
    done = subprocess.run(list(argv), capture_output=True, text=True, env=env)
    if log is not None:
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        tail = " | ".join((done.stderr or done.stdout).strip().splitlines()[-5:])
        raise EngineError(f"{what} failed (exit {done.returncode}): {tail}")
    return done.stdout


def engine_answers() -> bool:
    return subprocess.run(["docker", "info"], capture_output=True).returncode == 0


def up(timeout: float = 60) -> None:
    """Docker's CLI answering a running engine: Debian's docker.io installed and dockerd
    started (as root, its log in .stack/docker) when there is none; and `docker compose`."""
    if engine_answers():
        compose_plugin()
        return
    if shutil.which("dockerd") is None:
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        _run(["apt-get", "install", "-y", "-q", "docker.io"], what="apt-get install docker.io", env=env)
    ENGINE_HOME.mkdir(parents=True, exist_ok=True)
    log = (ENGINE_HOME / "dockerd.log").open("ab")
    subprocess.Popen(
        ["dockerd"], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
    )
    deadline = time.monotonic() + timeout
    while not engine_answers():
        if time.monotonic() > deadline:
            raise EngineError(f"dockerd did not answer within {timeout:.0f}s; read {ENGINE_HOME / 'dockerd.log'}")
        time.sleep(0.5)
    compose_plugin()


def compose_answers() -> bool:
    return subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0


def compose_plugin() -> None:
    """The Compose v2 CLI plugin, built from the Go module proxy when `docker compose` is
    missing. Built inside a copy of the downloaded module: `go install pkg@version` refuses
    a module whose go.mod has an `exclude` block, as compose's has."""
    if compose_answers():
        return
    env = {**os.environ, "GOFLAGS": "-mod=mod -buildvcs=false", "CGO_ENABLED": "0"}
    with tempfile.TemporaryDirectory(prefix="flotilla-compose-") as work:
        info = _run(
            ["go", "mod", "download", "-json", f"{COMPOSE_MODULE}@{COMPOSE_VERSION}"],
            what=f"go mod download {COMPOSE_MODULE}@{COMPOSE_VERSION}",
            env={**env, "GOFLAGS": "-mod=mod"},
        )
        source = Path(work) / "compose"
        shutil.copytree(json.loads(info)["Dir"], source)
        for path in source.rglob("*"):  # the module cache is read-only
            path.chmod(path.stat().st_mode | 0o200)
        PLUGINS.mkdir(parents=True, exist_ok=True)
        version = f"-X {COMPOSE_MODULE}/internal.Version={COMPOSE_VERSION}"
        plugin = str(PLUGINS / "docker-compose")
        done = subprocess.run(
            ["go", "build", "-trimpath", "-ldflags", f"-s -w {version}", "-o", plugin, "./cmd"],
            cwd=source,
            env=env,
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            raise EngineError(f"building docker compose {COMPOSE_VERSION} failed: {done.stderr[-500:]}")
    if not compose_answers():
        raise EngineError(f"docker compose does not answer after installing it in {PLUGINS}")


def inspect_image(ref: str, template: str) -> str | None:
    """``docker image inspect`` of one image through a Go template; None when there is none."""
    done = subprocess.run(["docker", "image", "inspect", "--format", template, ref], capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else None


def image_exists(tag: str) -> bool:
    return inspect_image(tag, "{{.Id}}") is not None


def image_id(tag: str) -> str:
    """The image's id, empty when there is none of that name."""
    return inspect_image(tag, "{{.Id}}") or ""


def labels(ref: str) -> dict[str, str] | None:
    """The image's labels, or None when there is no such image."""
    found = inspect_image(ref, "{{json .Config.Labels}}")
    return None if found is None else json.loads(found or "null") or {}


def base_image(suite: str = "bookworm") -> str:
    """Debian ``suite`` (minbase) imported as BASE, trusting the host's extra CAs."""
    tag = BASE.format(suite=suite)
    if image_exists(tag):
        return tag
    if shutil.which("debootstrap") is None:
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        _run(["apt-get", "install", "-y", "-q", "debootstrap"], what="apt-get install debootstrap", env=env)
    with tempfile.TemporaryDirectory(prefix="flotilla-rootfs-") as rootfs:
        root = Path(rootfs)
        _run(
            ["debootstrap", "--variant=minbase", suite, rootfs, MIRROR],
            what=f"debootstrap {suite}",
            log=ENGINE_HOME / f"debootstrap-{suite}.log",
        )
        # Same packages as the host's apt; no daemon started by a package's postinst.
        (root / "etc/apt/sources.list").write_text(f"deb {MIRROR} {suite} main\ndeb {MIRROR} {suite}-updates main\n")
        policy = root / "usr/sbin/policy-rc.d"
        policy.write_text("#!/bin/sh\nexit 101\n")
        policy.chmod(0o755)
        trusted = root / "usr/local/share/ca-certificates"
        trusted.mkdir(parents=True, exist_ok=True)
        for cert in sorted(HOST_CAS.glob("*.crt")):
            shutil.copy(cert, trusted / cert.name)
        shutil.rmtree(root / "var/cache/apt/archives", ignore_errors=True)
        (root / "var/cache/apt/archives/partial").mkdir(parents=True)
        changes = ["--change", f"LABEL {LABEL}=debian"]
        if any(HOST_CAS.glob("*.crt")):
            # pip trusts its own bundle, not the system's: point it (and Python's ssl) at the
            # system bundle, which Debian's ca-certificates builds with the host's CAs in it.
            bundle = "/etc/ssl/certs/ca-certificates.crt"
            changes += ["--change", f"ENV PIP_CERT={bundle} SSL_CERT_FILE={bundle} REQUESTS_CA_BUNDLE={bundle}"]
        tar = subprocess.Popen(["tar", "-C", rootfs, "-c", "."], stdout=subprocess.PIPE)
        imported = subprocess.run(["docker", "import", *changes, "-", tag], stdin=tar.stdout, capture_output=True)
        tar.wait()
        if imported.returncode != 0:
            raise EngineError(f"docker import of the {suite} rootfs failed: {imported.stderr.decode()[-300:]}")
    return tag


@dataclass(frozen=True)
class StandIn:
    """An official image the compose file names, and the folder that builds its stand-in."""

    official: str
    folder: str
    needs: tuple[tuple[Path, str], ...] = ()  # (source, name in the build context)
    suite: str = "bookworm"  # the Debian base it builds on


def standins() -> list[StandIn]:
    dist = STACK_HOME / "dist"
    return [
        StandIn("python:3.11-slim-bookworm", "python"),
        StandIn("postgres:16", "postgres"),
        StandIn("curlimages/curl:8.17.0", "curl"),
        StandIn("apache/kafka:4.3.0", "kafka", ((dist / "kafka" / "libs", "libs"),)),
        StandIn("maven:3.9.11-eclipse-temurin-17", "maven"),
        StandIn(
            "quay.io/debezium/connect:3.6.1.Final",
            "debezium-connect",
            (
                (dist / "kafka" / "libs", "libs"),
                (dist / "connect-plugins" / "debezium-connector-postgres", "debezium-connector-postgres"),
            ),
        ),
        StandIn("apicurio/apicurio-registry:3.3.3", "apicurio-registry", ((dist / "apicurio", "app"),), "trixie"),
        StandIn("prom/prometheus:v3.5.0", "prometheus", suite="trixie"),
        StandIn("prom/alertmanager:v0.28.1", "alertmanager", suite="trixie"),
    ]


def recipe(standin: StandIn, base_id: str) -> str:
    """A digest of everything a stand-in is built from: its folder's files (content), the
    names and sizes of the artifacts copied in (hashing 300 MB of jars at every run would
    cost more than it saves; a new version changes names), and its base image's id."""
    digest = hashlib.sha256(f"{standin.official}|{BASE.format(suite=standin.suite)}|{base_id}".encode())
    for path in sorted((STANDINS / standin.folder).rglob("*")):
        if path.is_file():
            digest.update(f"{path.relative_to(STANDINS)}|{path.stat().st_mode & 0o111}".encode())
            digest.update(path.read_bytes())
    for source, name in standin.needs:
        for path in sorted(source.rglob("*")) if source.exists() else []:
            if path.is_file():
                digest.update(f"{name}/{path.relative_to(source)}|{path.stat().st_size}".encode())
    return digest.hexdigest()[:16]


def must_build(present: dict[str, str] | None, wanted: str, *, rebuild: bool = False) -> bool:
    """Whether to build a stand-in whose image of that name has ``present`` labels (None:
    there is none) and whose recipe digest is now ``wanted``. Never over an image that is
    not ours."""
    if present is None:
        return True
    if LABEL not in present:
        return False
    return rebuild or present.get(RECIPE_LABEL) != wanted


def build(standin: StandIn, *, rebuild: bool = False) -> float:
    """Build one stand-in under its official name unless it is there and current; seconds
    taken (0: kept). An image of that name that this tool did not build (a real official
    image, pulled by someone) is used as it is and never replaced."""
    wanted = recipe(standin, image_id(BASE.format(suite=standin.suite)))
    if not must_build(labels(standin.official), wanted, rebuild=rebuild):
        return 0.0
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="flotilla-standin-") as context:
        shutil.copytree(STANDINS / standin.folder, context, dirs_exist_ok=True)
        for source, name in standin.needs:
            if not source.exists():
                raise EngineError(
                    f"{standin.official}: {source} is missing; the local stack fetches it (make stack-up) once"
                )
            shutil.copytree(source, Path(context) / name)
        env = {**os.environ, "DOCKER_BUILDKIT": "0"}
        _run(
            ["docker", "build", "--label", f"{LABEL}={standin.official}", "--label", f"{RECIPE_LABEL}={wanted}",
             "--build-arg", f"BASE={BASE.format(suite=standin.suite)}",
             "-t", standin.official, context],
            what=f"docker build of the {standin.official} stand-in",
            env=env,
            log=ENGINE_HOME / "build" / f"{standin.folder}.log",
        )  # fmt: skip
    return time.monotonic() - began


def images(*, rebuild: bool = False) -> dict[str, float]:
    """The base and every stand-in; seconds each build took (0: it was there)."""
    up()
    built = {}
    for suite in SUITES:
        began, tag = time.monotonic(), BASE.format(suite=suite)
        present = image_exists(tag)
        base_image(suite)
        built[tag] = 0.0 if present else time.monotonic() - began
    for standin in standins():
        built[standin.official] = build(standin, rebuild=rebuild)
    return built


def ours() -> list[str]:
    """Ids of the images this tool built (by label), nothing else."""
    out = _run(["docker", "images", "-q", "--filter", f"label={LABEL}"], what="docker images")
    return sorted(set(out.split()))


def clean() -> None:
    """Remove every image of ours. An image another one is built on cannot go before it
    (the engine refuses, even forced), so pass after pass removes what it can until
    nothing of ours is left; one that will not go (a container still uses it) is raised."""
    remaining = ours()
    while remaining:
        refused = {}
        for image in remaining:
            done = subprocess.run(["docker", "rmi", "-f", image], capture_output=True, text=True)
            if done.returncode != 0 and "No such image" not in done.stderr:
                refused[image] = done.stderr.strip()
        if len(refused) == len(remaining):
            raise EngineError(f"could not remove {len(refused)} image(s) of ours: {next(iter(refused.values()))}")
        remaining = sorted(set(ours()) & set(refused))


def remove_replaced(before: dict[str, str]) -> int:
    """Remove the images a rebuild replaced: ``before`` maps each tag compose builds to the
    id it had before the build; an old id that lost its tag (and carries our label: every
    image built on a stand-in inherits it) is removed. Untagged images in general are not:
    the classic builder keeps its layer cache in them (a multi-stage build's first stage
    ends in one), and removing those made every fleet image build start from scratch.
    How many were removed."""
    removed = 0
    for tag, old in before.items():
        if not old or image_id(tag) == old:
            continue
        if inspect_image(old, "{{len .RepoTags}}") != "0" or LABEL not in (labels(old) or {}):
            continue  # gone already, still tagged, or not ours
        if subprocess.run(["docker", "rmi", old], capture_output=True).returncode == 0:
            removed += 1
    return removed


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="engine", description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=["up", "images", "clean"])
    parser.add_argument("--rebuild", action="store_true", help="build the stand-ins again even if present")
    args = parser.parse_args(argv)
    try:
        if args.action == "up":
            up()
            print("[engine] docker answers")
        elif args.action == "images":
            for tag, seconds in images(rebuild=args.rebuild).items():
                print(f"[engine] {tag}: {f'built in {seconds:.0f}s' if seconds else 'present'}")
        else:
            clean()
            print("[engine] stand-ins removed")
    except EngineError as exc:
        print(f"[engine] ERROR: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
