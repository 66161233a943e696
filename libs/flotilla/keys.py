"""Ed25519 key material: private keys in files, public keys as text, key ids, keyrings.

Three services sign what others must be able to trust: the policy service its command
authorizations, the remediation agent its proposals, the audit service its log. Each
keeps its private key in a PEM file (a mounted Secret in Kubernetes, ``.stack/secrets``
locally) and never in the repository; whoever verifies holds only public keys, in a
*keyring* of several (so a key can be rotated: add the new one, move the signer, drop
the old one).

A public key travels as text: ``ed25519:<base64 of the 32 raw bytes>`` (what
``python -m flotilla.keys generate`` prints) or a PEM ``PUBLIC KEY`` block. Its key id
is the first 16 hex digits of SHA-256 over the raw bytes: short enough to log, long
enough that a collision has to be searched for (2^64).
"""

from __future__ import annotations

import argparse
import base64
import binascii
import hashlib
import logging
import os
import stat
import sys
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    PublicFormat,
    load_pem_private_key,
    load_pem_public_key,
)

__all__ = [
    "KeyMaterialError",
    "Keyring",
    "create_private_key",
    "key_id",
    "load_or_create",
    "load_private_key",
    "parse_public_key",
    "public_key_text",
]

log = logging.getLogger(__name__)

PREFIX = "ed25519:"


class KeyMaterialError(ValueError):
    """Key material that cannot be used; the message names the file or entry."""


def key_id(public_key: Ed25519PublicKey) -> str:
    """A short, stable name for a public key: the first 16 hex of SHA-256 of its raw bytes."""
    return hashlib.sha256(public_key.public_bytes(Encoding.Raw, PublicFormat.Raw)).hexdigest()[:16]


def public_key_text(public_key: Ed25519PublicKey) -> str:
    """``ed25519:<base64>``: the form keyrings and settings hold."""
    return PREFIX + base64.b64encode(public_key.public_bytes(Encoding.Raw, PublicFormat.Raw)).decode("ascii")


def parse_public_key(text: str) -> Ed25519PublicKey:
    """A public key from ``ed25519:<base64>`` or a PEM ``PUBLIC KEY`` block."""
    text = text.strip()
    if text.startswith(PREFIX):
        try:
            raw = base64.b64decode(text[len(PREFIX) :], validate=True)
        except binascii.Error as exc:
            raise KeyMaterialError(f"public key {text[:24]}…: not base64: {exc}") from None
        if len(raw) != 32:
            raise KeyMaterialError(f"public key {text[:24]}…: an Ed25519 key has 32 bytes, not {len(raw)}")
        return Ed25519PublicKey.from_public_bytes(raw)
    if "BEGIN PUBLIC KEY" in text:
        try:
            loaded = load_pem_public_key(text.encode())
        except (ValueError, UnsupportedAlgorithm) as exc:
            raise KeyMaterialError(f"not a readable PEM public key: {exc}") from None
        if not isinstance(loaded, Ed25519PublicKey):
            raise KeyMaterialError(f"a {type(loaded).__name__} is not an Ed25519 public key")
        return loaded
    raise KeyMaterialError(f"public key {text[:24]!r}: expected 'ed25519:<base64>' or a PEM PUBLIC KEY block")


def _private_pem(key: Ed25519PrivateKey) -> bytes:
    return key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption())


def load_private_key(path: Path) -> Ed25519PrivateKey:
    """The Ed25519 private key in ``path`` (PEM, PKCS#8); an error names the file.

    A file readable by group or others is used but reported: whoever can read it can
    sign as this service.
    """
    try:
        data = path.read_bytes()
        mode = stat.S_IMODE(path.stat().st_mode)
    except OSError as exc:
        raise KeyMaterialError(f"cannot read the signing key {path}: {exc.strerror or exc}") from None
    if mode & 0o077:
        log.warning("signing key %s is accessible to group/others (mode %o); it should be 0600", path, mode)
    try:
        loaded = load_pem_private_key(data, password=None)
    except (ValueError, TypeError, UnsupportedAlgorithm) as exc:
        raise KeyMaterialError(f"{path} does not hold a readable, unencrypted PEM private key: {exc}") from None
    if not isinstance(loaded, Ed25519PrivateKey):
        raise KeyMaterialError(f"{path} holds a {type(loaded).__name__}, not an Ed25519 private key")
    return loaded


def create_private_key(path: Path) -> Ed25519PrivateKey | None:
    """Generate a key into ``path``, mode 0600 from the first byte (one ``O_EXCL`` open, so
    two processes starting together cannot both write one). None if the file exists."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    key = Ed25519PrivateKey.generate()
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return None
    with os.fdopen(fd, "wb") as out:
        out.write(_private_pem(key))
        out.flush()
        os.fsync(out.fileno())
    return key


def load_or_create(path: Path) -> tuple[Ed25519PrivateKey, bool]:
    """The key in ``path``, generated first if there is none; and whether it was generated."""
    if not path.exists():
        created = create_private_key(path)
        if created is not None:
            log.warning("generated a new signing key at %s (key id %s)", path, key_id(created.public_key()))
            return created, True
    return load_private_key(path), False


class Keyring(Mapping[str, Ed25519PublicKey]):
    """Trusted public keys by key id.

    Entries are key texts (see :func:`parse_public_key`) or paths of files holding one
    PEM block or key texts one per line; files let a mounted Secret or ConfigMap carry
    the keyring.
    """

    def __init__(self, keys: Iterable[Ed25519PublicKey]) -> None:
        self._keys = {key_id(k): k for k in keys}

    @classmethod
    def parse(cls, entries: Iterable[str]) -> Keyring:
        return cls(key for entry in entries for key in _entry_keys(entry))

    def __getitem__(self, kid: str) -> Ed25519PublicKey:
        return self._keys[kid]

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)

    def describe(self) -> str:
        return ", ".join(sorted(self._keys)) or "no key"


def _entry_keys(entry: str) -> list[Ed25519PublicKey]:
    entry = entry.strip()
    if not entry:
        return []
    if entry.startswith(PREFIX) or "BEGIN PUBLIC KEY" in entry:
        return [parse_public_key(entry)]
    path = Path(entry)
    try:
        text = path.read_text()
    except OSError as exc:
        raise KeyMaterialError(
            f"keyring entry {entry!r} is neither a key ('ed25519:<base64>', PEM) nor a readable file: "
            f"{exc.strerror or exc}"
        ) from None
    if "BEGIN PUBLIC KEY" in text:
        return [parse_public_key(text)]
    return [parse_public_key(line) for line in text.splitlines() if line.strip() and not line.startswith("#")]


def main(argv: list[str] | None = None) -> int:
    """``generate PATH``: a private key into PATH (0600, never overwritten); prints its public key."""
    parser = argparse.ArgumentParser(prog="python -m flotilla.keys", description=(__doc__ or "").split("\n\n")[0])
    sub = parser.add_subparsers(dest="action", required=True)
    gen = sub.add_parser("generate", help="write a new Ed25519 private key (kept if the file exists)")
    gen.add_argument("path", type=Path)
    gen.add_argument("--public", type=Path, help="also write the public key text to this file")
    show = sub.add_parser("public", help="print the public key of a private key file")
    show.add_argument("path", type=Path)
    args = parser.parse_args(argv)
    try:
        key = load_or_create(args.path)[0] if args.action == "generate" else load_private_key(args.path)
    except KeyMaterialError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    text = public_key_text(key.public_key())
    if getattr(args, "public", None) is not None:
        args.public.parent.mkdir(parents=True, exist_ok=True)
        args.public.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
