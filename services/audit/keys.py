"""The audit signing key: an Ed25519 private key in a PEM file, created on first start.

The file is created with mode 0600 in one ``open(O_CREAT | O_EXCL)``: never readable by
others, not even for an instant, and two replicas starting together cannot both write
one (the loser reads the winner's). An existing file readable by group or others is
used but reported, since anyone who can read it can forge the chain.
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    load_pem_private_key,
)

log = logging.getLogger(__name__)


def load_or_create(path: Path) -> Ed25519PrivateKey:
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        key = Ed25519PrivateKey.generate()
        pem = key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption())
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            pass  # another process created it first: use theirs
        else:
            with os.fdopen(fd, "wb") as out:
                out.write(pem)
                out.flush()
                os.fsync(out.fileno())
            log.warning("generated a new audit signing key at %s", path)
            return key
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        log.warning("audit signing key %s is accessible to group/others (mode %o); it should be 0600", path, mode)
    loaded = load_pem_private_key(path.read_bytes(), password=None)
    if not isinstance(loaded, Ed25519PrivateKey):
        raise ValueError(f"{path} does not hold an Ed25519 private key")
    return loaded
