"""Fetch the CustomResourceDefinitions the manifests use, for offline validation.

Nothing is vendored: the CRDs are obtained from package registries and cached under
``.cache/k8s-crds/`` (git-ignored), keyed by version, so a second run is offline.

* KEDA ``ScaledObject`` and ``TriggerAuthentication``: ``config/crd/bases/keda.sh_*.yaml``
  of the KEDA Go module, from the Go module proxy (``go mod download``).
* Strimzi ``KafkaConnect`` / ``KafkaConnector`` / ``KafkaUser`` / ``KafkaTopic``: Strimzi's
  CRDs are not published as files on Maven Central, but the model classes they are generated from are
  (``io.strimzi:api``), and so is the generator Strimzi's build runs on them
  (``io.strimzi:crd-generator``, last published for 0.45.0). The CRDs are generated
  here with Strimzi's own arguments (CRD apiextensions/v1, API versions v1beta2 and v1).
  Annotations the generator learned after 0.45.0 are not applied, so the schema can be a
  little looser than the one a 0.51 operator installs; its structure, types, enums and
  required fields come from the 0.51 classes.

Usage::

    python infra/k8s/crds.py            # fetch (if needed) and print the cached files
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
CACHE = REPO_ROOT / ".cache" / "k8s-crds"

KEDA_MODULE = "github.com/kedacore/keda/v2"
KEDA_VERSION = "v2.16.1"
KEDA_CRDS = ("keda.sh_scaledobjects.yaml", "keda.sh_triggerauthentications.yaml")

STRIMZI_API_VERSION = "0.51.0"  # io.strimzi:api, the model classes
STRIMZI_GENERATOR_VERSION = "0.45.0"  # io.strimzi:crd-generator, the last one on Maven Central
STRIMZI_CLASSES = {
    "kafkaconnects.yaml": "io.strimzi.api.kafka.model.connect.KafkaConnect",
    "kafkaconnectors.yaml": "io.strimzi.api.kafka.model.connector.KafkaConnector",
    "kafkausers.yaml": "io.strimzi.api.kafka.model.user.KafkaUser",
    "kafkatopics.yaml": "io.strimzi.api.kafka.model.topic.KafkaTopic",
}
GENERATOR = "io.strimzi.crdgenerator.CrdGenerator"

POM = """\
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>local.flotilla</groupId>
  <artifactId>strimzi-crds</artifactId>
  <version>0</version>
  <dependencies>
    <dependency>
      <groupId>io.strimzi</groupId><artifactId>api</artifactId><version>{api}</version>
    </dependency>
    <dependency>
      <groupId>io.strimzi</groupId><artifactId>crd-generator</artifactId><version>{generator}</version>
    </dependency>
  </dependencies>
</project>
"""


class FetchError(RuntimeError):
    """A registry or tool failed; the message says which command and why."""


def _run(cmd: list[str], *, cwd: Path, env: dict[str, str] | None = None, timeout: float = 600) -> str:
    try:
        done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    except FileNotFoundError as exc:
        raise FetchError(f"{cmd[0]} is not installed ({exc})") from exc
    if done.returncode != 0:
        raise FetchError(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stderr[-3000:]}{done.stdout[-2000:]}")
    return done.stdout


def _publish(tmp: Path, final: Path, names: Iterable[str]) -> Path:
    """Move a finished folder into place (another run may have won: keep theirs). A cache
    made when fewer CRDs were needed gets the missing files, one atomic rename each."""
    try:
        tmp.rename(final)
    except OSError:
        for name in names:
            if not (final / name).exists():
                os.replace(tmp / name, final / name)
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def keda_dir() -> Path:
    """The KEDA CRDs of :data:`KEDA_VERSION`, fetched once through the Go module proxy."""
    final = CACHE / f"keda-{KEDA_VERSION}"
    if all((final / name).exists() for name in KEDA_CRDS):
        return final
    CACHE.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env.update(
        GOMODCACHE=str(CACHE / "gomod"),
        GOFLAGS="-modcacherw",  # a cache that rm -rf can clean
        GOTOOLCHAIN="local",
        GO111MODULE="on",
    )
    with tempfile.TemporaryDirectory(dir=CACHE) as work:
        info = json.loads(
            _run(["go", "mod", "download", "-json", f"{KEDA_MODULE}@{KEDA_VERSION}"], cwd=Path(work), env=env)
        )
        if info.get("Error"):
            raise FetchError(f"go mod download {KEDA_MODULE}@{KEDA_VERSION}: {info['Error']}")
        bases = Path(info["Dir"]) / "config" / "crd" / "bases"
        tmp = Path(tempfile.mkdtemp(dir=CACHE, prefix=".keda-"))
        for name in KEDA_CRDS:
            shutil.copyfile(bases / name, tmp / name)
    return _publish(tmp, final, KEDA_CRDS)


def strimzi_dir() -> Path:
    """The Strimzi CRDs, generated once from Maven Central artifacts (needs mvn and java)."""
    final = CACHE / f"strimzi-{STRIMZI_API_VERSION}-gen{STRIMZI_GENERATOR_VERSION}"
    if all((final / name).exists() for name in STRIMZI_CLASSES):
        return final
    CACHE.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=CACHE, prefix=".strimzi-"))
    try:
        (tmp / "pom.xml").write_text(POM.format(api=STRIMZI_API_VERSION, generator=STRIMZI_GENERATOR_VERSION))
        _run(["mvn", "-q", "-B", "dependency:build-classpath", "-Dmdep.outputFile=classpath.txt"], cwd=tmp)
        classpath = (tmp / "classpath.txt").read_text().strip()
        outputs = [f"{cls}={tmp / name}" for name, cls in STRIMZI_CLASSES.items()]
        # The arguments of Strimzi's own build (api/pom.xml, generate-crd-co-install-v1).
        versions = ["--crd-api-version", "v1", "--api-versions", "v1beta2,v1", "--storage-version", "v1beta2"]
        _run(["java", "-cp", classpath, GENERATOR, *versions, "--yaml", *outputs], cwd=tmp)
        for name in STRIMZI_CLASSES:
            if not (tmp / name).exists():
                raise FetchError(f"{GENERATOR} wrote no {name}")
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return _publish(tmp, final, STRIMZI_CLASSES)


def load_crds() -> list[dict[str, Any]]:
    """Every CRD document, fetched or generated if not cached yet."""
    files = [keda_dir() / name for name in KEDA_CRDS] + [strimzi_dir() / name for name in STRIMZI_CLASSES]
    docs: list[dict[str, Any]] = []
    for path in files:
        docs.extend(d for d in yaml.safe_load_all(path.read_text()) if d)
    return docs


def schemas() -> dict[tuple[str, str], dict[str, Any]]:
    """``(apiVersion, kind)`` -> that version's openAPIV3Schema, for every CRD."""
    found: dict[tuple[str, str], dict[str, Any]] = {}
    for crd in load_crds():
        group = crd["spec"]["group"]
        kind = crd["spec"]["names"]["kind"]
        for version in crd["spec"]["versions"]:
            if version.get("served", True):
                found[(f"{group}/{version['name']}", kind)] = version["schema"]["openAPIV3Schema"]
    return found


def main() -> int:
    try:
        found = schemas()
    except FetchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for api_version, kind in sorted(found):
        print(f"{api_version} {kind}")
    print(f"cached in {CACHE.relative_to(REPO_ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
