"""Files generated from code (connector definitions, manifests): write them, or check them.

The generators under ``infra/`` render the content a file must have; this writes it, or
with ``check`` reports every file that is missing or differs, so CI catches a hand
edit or a forgotten regeneration.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path


def stale(files: Mapping[Path, str]) -> list[Path]:
    """The files that are missing or whose content is not the rendered one."""
    return [path for path, text in files.items() if not path.exists() or path.read_text() != text]


def write_or_check(files: Mapping[Path, str], *, check: bool, root: Path, regenerate: str) -> int:
    """Write ``files`` (exit status 0), or with ``check`` only name the stale ones on
    stderr, saying to run ``regenerate`` (exit status 1 if any)."""
    if check:
        outdated = stale(files)
        for path in outdated:
            print(f"stale: {path.relative_to(root)} (run {regenerate})", file=sys.stderr)
        return 1 if outdated else 0
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(f"wrote {path.relative_to(root)}")
    return 0
