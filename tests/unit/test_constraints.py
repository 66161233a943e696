"""constraints.txt pins the whole tested dependency tree; it must agree with the direct
pins in pyproject.toml and with what is installed, or `make lock` was forgotten."""

from __future__ import annotations

import re
import tomllib
from importlib import metadata
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?==([^\s;]+)$")
NOT_PINNED = {"flotilla", "pip", "setuptools", "wheel"}  # the project itself and the installer


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(lines: list[str]) -> dict[str, str]:
    found: dict[str, str] = {}
    for line in lines:
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        match = PIN.match(line)
        assert match, f"not an exact pin: {line!r}"
        found[normalized(match.group(1))] = match.group(2)
    return found


def constraints() -> dict[str, str]:
    return pins((REPO_ROOT / "constraints.txt").read_text().splitlines())


def test_every_direct_pin_in_pyproject_is_the_constrained_version() -> None:
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    direct = pins([*project["dependencies"], *project["optional-dependencies"]["dev"]])
    locked = constraints()
    mismatched = {name: (version, locked.get(name)) for name, version in direct.items() if locked.get(name) != version}
    assert not mismatched, f"pyproject.toml vs constraints.txt (run make lock): {mismatched}"


def test_the_environment_is_exactly_the_constrained_tree() -> None:
    installed = {
        normalized(dist.metadata["Name"]): dist.version
        for dist in metadata.distributions()
        if normalized(dist.metadata["Name"]) not in NOT_PINNED
    }
    locked = constraints()
    assert {n: v for n, v in installed.items() if locked.get(n) != v} == {}, "installed but not as constrained"
    assert set(locked) - set(installed) == set(), "constrained but not installed (run make lock)"
