"""The schema registry client: one way to reach the Confluent-compatible API.

Its own module so that the catalogue (``contracts``) and the serde can both use it
without either importing the other.

Reading is anonymous: every service that only serializes and deserializes (the serde
looks schemas up by content and fetches them by id) uses ``registry_client(url)``.
Writing (registering a version, deleting one, changing the compatibility rule) needs the
registrar's credentials, ``user:password`` in ``FLOTILLA_SCHEMA_REGISTRY_AUTH`` or in the
file ``FLOTILLA_SCHEMA_REGISTRY_AUTH_FILE`` names (``StackSettings.registrar_auth()``):
the registry (Apicurio, HTTP basic auth, anonymous reads allowed) refuses the rest with
401. ``registrar_client(settings)`` is the client of the paths that write: ``make
schemas``, ``flotilla.provision``, the stack's own set-up and the test session.

``python -m flotilla.registrar users --credentials FILE --users FILE`` makes the
registrar's credentials once and writes the registry's users file from them (compose's
``registry-auth-init``); ``python -m flotilla.registrar compatibility LEVEL`` sets the
registry's global compatibility rule as the registrar (compose's ``registry-init``).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import secrets
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.error import SchemaRegistryError

if TYPE_CHECKING:
    from flotilla.settings import StackSettings

__all__ = [
    "REGISTRAR_ROLE",
    "REGISTRAR_USER",
    "RegistrarRefused",
    "new_credentials",
    "password_digest",
    "read_credentials",
    "registrar_client",
    "registry_client",
    "split_credentials",
    "users_properties",
    "write_private",
    "write_refused",
]

# Who registers: one user, Apicurio's admin role (role-based authorization is off, so
# any authenticated user may write; the role is there for the day it is turned on).
REGISTRAR_USER = "registrar"
REGISTRAR_ROLE = "sr-admin"
# Quarkus' embedded users (quarkus-elytron-security-properties-file) as Apicurio 3 ships
# them: passwords are stored as hex(SHA-512("<user>:<realm>:<password>")) for realm Quarkus
# (quarkus.security.users.embedded.algorithm=digest-sha-512, plain-text=false: the defaults).
QUARKUS_REALM = "Quarkus"

# How the registry itself is told (the local stack, compose and Kubernetes set the same):
# basic auth on, anonymous reads allowed, the users file read as extra Quarkus config.
SERVER_ENV = {
    "QUARKUS_HTTP_AUTH_BASIC": "true",
    "APICURIO_AUTH_ANONYMOUS_READ_ACCESS_ENABLED": "true",
}


class RegistrarRefused(RuntimeError):
    """The registry refused a write (401/403): no registrar credentials, or wrong ones."""


def write_refused(exc: SchemaRegistryError, settings: StackSettings) -> RegistrarRefused | None:
    """A RegistrarRefused saying what to set, when ``exc`` is the registry refusing a write;
    None for any other error."""
    if exc.http_status_code not in (401, 403):
        return None
    if settings.registrar_auth():
        why = "refused the registrar's credentials"
    else:
        why = "refuses anonymous writes and no registrar credentials are set"
    return RegistrarRefused(
        f"the schema registry {why} ({exc.http_status_code}): set FLOTILLA_SCHEMA_REGISTRY_AUTH "
        "(user:password) or FLOTILLA_SCHEMA_REGISTRY_AUTH_FILE (a file holding it; the local "
        "stack's is .stack/secrets/registry-registrar)"
    )


def split_credentials(auth: str) -> tuple[str, str]:
    """``user:password`` → (user, password); ValueError without either half (never echoing it)."""
    user, sep, password = auth.strip().partition(":")
    if not sep or not user or not password:
        raise ValueError("registry credentials must be user:password, both non-empty")
    return user, password


def registry_client(url: str, auth: str | None = None) -> SchemaRegistryClient:
    """A registry client for the Confluent-compatible API at ``url``; with ``auth``
    (``user:password``) it presents HTTP basic credentials on every request."""
    conf = {"url": url}
    if auth:
        split_credentials(auth)  # refuse a malformed value here, not as a 401 later
        conf["basic.auth.user.info"] = auth.strip()
    return SchemaRegistryClient(conf)


def registrar_client(settings: StackSettings) -> SchemaRegistryClient:
    """The client of a path that writes to the registry, with the registrar's credentials
    (``settings.registrar_auth()``). Without any it is anonymous and the registry decides:
    one that requires them answers 401 (``write_refused`` says what to set)."""
    return registry_client(settings.schema_registry_url, settings.registrar_auth())


def read_credentials(path: Path) -> str:
    """The ``user:password`` in ``path`` (one line); ValueError naming the file, not its content."""
    text = path.read_text().strip()
    try:
        split_credentials(text)
    except ValueError:
        raise ValueError(f"{path} does not hold registry credentials as user:password") from None
    return text


def new_credentials(user: str = REGISTRAR_USER) -> str:
    """``<user>:<32 random bytes, URL-safe>`` (no ``:`` in the password)."""
    return f"{user}:{secrets.token_urlsafe(32)}"


def password_digest(user: str, password: str, realm: str = QUARKUS_REALM) -> str:
    """What Quarkus' embedded users file stores for a password: hex SHA-512 of user:realm:password."""
    return hashlib.sha512(f"{user}:{realm}:{password}".encode()).hexdigest()


def users_properties(auth: str, role: str = REGISTRAR_ROLE) -> str:
    """The registry's users file (Quarkus config, ``QUARKUS_CONFIG_LOCATIONS``) for one user."""
    user, password = split_credentials(auth)
    if not user.replace("-", "").replace("_", "").isalnum():
        raise ValueError("the registrar's user name must be letters, digits, - or _ (it is a config key)")
    return (
        "# written by flotilla.registry: the registry's users (Quarkus embedded users, digest-sha-512)\n"
        f"quarkus.security.users.embedded.users.{user}={password_digest(user, password)}\n"
        f"quarkus.security.users.embedded.roles.{user}={role}\n"
    )


def write_private(path: Path, text: str, mode: int = 0o600, owner: tuple[int, int] | None = None) -> None:
    """Write ``text`` to ``path`` created with ``mode`` (never wider, whatever the umask or an
    earlier file's mode), then give it to ``owner`` (uid, gid) when set."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(fd, "w") as out:
        out.write(text)
    os.chmod(tmp, mode)
    if owner is not None:
        os.chown(tmp, *owner)
    os.replace(tmp, path)


def _owner(text: str) -> tuple[int, int]:
    uid, _, gid = text.partition(":")
    return int(uid), int(gid or uid)


def _users(args: argparse.Namespace) -> int:
    explicit = os.environ.get("FLOTILLA_SCHEMA_REGISTRY_AUTH", "").strip()
    credentials: Path = args.credentials
    if explicit:
        auth = explicit
        split_credentials(auth)
        origin = "from FLOTILLA_SCHEMA_REGISTRY_AUTH"
    elif credentials.exists():
        auth = read_credentials(credentials)
        origin = f"kept from {credentials}"
    else:
        auth = new_credentials()
        origin = "generated"
    owner = _owner(args.credentials_owner) if args.credentials_owner else None
    write_private(credentials, auth + "\n", 0o600, owner)
    # Read by the registry only, which runs under a user of its image's choosing in group 0
    # (OpenShift-style images): group-readable, the volume mounted into nothing else.
    write_private(args.users, users_properties(auth), int(args.users_mode, 8))
    print(f"registry registrar credentials {origin}; users file {args.users}", flush=True)
    return 0


def _compatibility(args: argparse.Namespace) -> int:
    from flotilla.settings import load_settings

    client = registrar_client(load_settings())
    deadline = time.monotonic() + args.timeout
    while True:
        try:
            client.set_compatibility(level=args.level)
            print(f"registry global compatibility set to {args.level}", flush=True)
            return 0
        except SchemaRegistryError as exc:
            refused = write_refused(exc, load_settings())
            if refused is not None:
                print(f"error: {refused}", file=sys.stderr)
                return 1
            if time.monotonic() > deadline:
                raise
        except OSError:
            if time.monotonic() > deadline:
                raise
        time.sleep(2)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flotilla.registrar", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    users = sub.add_parser("users", help="make the registrar's credentials once and write the registry's users file")
    users.add_argument("--credentials", type=Path, required=True, help="user:password (0600; kept if it exists)")
    users.add_argument("--credentials-owner", metavar="UID[:GID]", help="who may read the credentials file")
    users.add_argument("--users", type=Path, required=True, help="the registry's users file (Quarkus config)")
    users.add_argument("--users-mode", default="600", help="octal mode of the users file (default 600)")
    compat = sub.add_parser("compatibility", help="set the global compatibility rule, as the registrar")
    compat.add_argument("level", help="e.g. BACKWARD")
    compat.add_argument("--timeout", type=float, default=30.0, help="seconds to retry while the registry is not up")
    args = parser.parse_args(argv)
    try:
        return _users(args) if args.command == "users" else _compatibility(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
