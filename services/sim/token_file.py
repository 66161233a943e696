"""``python -m services.sim.token_file PATH``: the sim's action token, as a file.

Docker compose has no public default for the token: its one-shot ``keys-init`` runs this
into a volume only the sim and the executor mount, and both read the file
(``FLOTILLA_SIM_ACTION_TOKEN_FILE``). The token is ``FLOTILLA_SIM_ACTION_TOKEN`` when
that is set (an operator's own, from ``.env``; checked, and it replaces what the file
held), else the one already in the file (so restarting one of the two keeps them equal),
else a new random one: 32 bytes, URL-safe base64, like the local fleet's. The file is
written whole (a temporary file renamed over it), mode 0600. Nothing secret is printed.
"""

from __future__ import annotations

import os
import secrets
import sys
import tempfile
from pathlib import Path

from services.sim.auth import check_action_token

GIVEN = "FLOTILLA_SIM_ACTION_TOKEN"


def _usable(path: Path) -> str | None:
    try:
        return check_action_token(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _write(path: Path, token: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")  # mode 0600
    try:
        with os.fdopen(fd, "w") as out:
            out.write(token + "\n")
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def ensure(path: Path, given: str | None = None) -> str:
    """Make ``path`` hold the action token; say which one: ``given``, ``kept`` or ``generated``.
    ValueError when ``given`` cannot be a token (nothing is written then)."""
    if given:
        token = check_action_token(given)
        if _usable(path) != token:
            _write(path, token)
        return "given"
    if _usable(path) is not None:
        return "kept"
    _write(path, secrets.token_urlsafe(32))
    return "generated"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m services.sim.token_file PATH", file=sys.stderr)
        return 2
    path = Path(args[0])
    try:
        how = ensure(path, os.environ.get(GIVEN) or None)
    except ValueError as exc:
        print(f"error: {GIVEN}: {exc}", file=sys.stderr)
        return 2
    said = {"given": f"from {GIVEN}", "kept": "kept", "generated": "generated"}[how]
    print(f"the sim's action token at {path}: {said}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
