"""Reading a Dockerfile's stages in the tests, without Docker."""

from __future__ import annotations

import re
from pathlib import Path

# (base image, stage name, [(instruction, arguments)]) for each FROM.
Stage = tuple[str, str | None, list[tuple[str, str]]]


def stages(dockerfile: Path) -> list[Stage]:
    """Every stage, continuation lines joined and global ARG defaults substituted in FROM."""
    text = re.sub(r"\\\n", " ", dockerfile.read_text())
    args = dict(
        (m.group(1), m.group(2)) for m in re.finditer(r"^ARG (\w+)=(\S+)", text, re.MULTILINE)
    )  # global ARG defaults
    found: list[Stage] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        instruction, _, rest = line.partition(" ")
        if instruction.upper() == "FROM":
            words = rest.split()
            base = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], words[0])
            found.append((base, words[2] if len(words) > 2 and words[1].upper() == "AS" else None, []))
        elif found:
            found[-1][2].append((instruction.upper(), rest.strip()))
    return found
