"""Reading the Maven POMs in the tests: the versions that must agree across the repository."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
LOCAL_STACK_POM = REPO_ROOT / "infra" / "local" / "pom.xml"
TRANSFORMS_POM = REPO_ROOT / "infra" / "connect-transforms" / "pom.xml"
_NS = {"m": "http://maven.apache.org/POM/4.0.0"}


def pom_text(pom: Path, path: str) -> str:
    """The text at ``path`` below <project>, e.g. ``m:version`` or ``m:properties/m:kafka.version``."""
    node = ET.parse(pom).getroot().find(path, _NS)
    assert node is not None and node.text, f"{path} not in {pom}"
    return node.text.strip()


def pom_property(pom: Path, name: str) -> str:
    return pom_text(pom, f"m:properties/m:{name}")


def pom_elements(pom: Path, path: str) -> list[ET.Element]:
    return ET.parse(pom).getroot().findall(path, _NS)


def child_text(element: ET.Element, path: str) -> str | None:
    """The text at ``path`` below a POM element, None when it is not there."""
    node = element.find(path, _NS)
    return node.text.strip() if node is not None and node.text else None
