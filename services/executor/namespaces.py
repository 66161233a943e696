"""Which Kubernetes namespace holds which environment's Deployments.

The Kubernetes target acts on a resource ``<environment>/<name>`` (the commands-topic
key) as the Deployment ``<name>`` in *that environment's* namespace, and nowhere else:
policy trusts the environment a command names (everything in ``dev`` is authorized
without a person), so a ``dev/checkout-api`` command must never reach production's
``checkout-api``. The mapping is configuration (``FLOTILLA_KUBERNETES_NAMESPACES``, JSON
``{"production": "apps", "dev": "apps-dev"}``), checked when it is loaded: one
namespace per environment, each a valid namespace name, none shared.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

SETTING = "FLOTILLA_KUBERNETES_NAMESPACES"

# RFC 1123 label (namespace names) and subdomain (Deployment names), as the API server checks them.
_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
NAMESPACE_NAME = re.compile(_LABEL)
NAMESPACE_MAX = 63
DEPLOYMENT_NAME = re.compile(rf"{_LABEL}(\.{_LABEL})*")
DEPLOYMENT_MAX = 253
# An environment is the part of a resource before its first "/", so it cannot hold one.
ENVIRONMENT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


class NamespaceMapError(ValueError):
    """The environment -> namespace mapping cannot be used as configured."""


class OutsideTheMap(ValueError):
    """A resource this mapping does not place: no environment, an environment it does not
    serve, or a name that cannot be a Deployment's."""


@dataclass(frozen=True)
class Placement:
    """Where a resource lives on the cluster."""

    resource: str  # <environment>/<name>, as the command named it
    environment: str
    namespace: str
    name: str  # the Deployment

    @property
    def deployment(self) -> str:
        """``<namespace>/<name>``, as kubectl shows it."""
        return f"{self.namespace}/{self.name}"


class EnvironmentNamespaces(Mapping[str, str]):
    """environment -> namespace, validated; read-only."""

    def __init__(self, mapping: Mapping[str, str]) -> None:
        if not isinstance(mapping, Mapping) or not mapping:
            raise NamespaceMapError(
                f"{SETTING} is empty: name each environment this target serves and its namespace, "
                'e.g. {"production": "apps"}'
            )
        owner: dict[str, str] = {}
        for environment, namespace in mapping.items():
            if not isinstance(environment, str) or not ENVIRONMENT_NAME.fullmatch(environment):
                raise NamespaceMapError(
                    f"{SETTING}: environment {environment!r} is not a name "
                    "(letters, digits, '.', '_', '-'; it is the part of a resource before its '/')"
                )
            if (
                not isinstance(namespace, str)
                or len(namespace) > NAMESPACE_MAX
                or not NAMESPACE_NAME.fullmatch(namespace)
            ):
                raise NamespaceMapError(
                    f"{SETTING}: namespace {namespace!r} of environment {environment!r} is not a Kubernetes "
                    f"namespace name (RFC 1123 label: lower-case letters, digits and '-', at most {NAMESPACE_MAX})"
                )
            if namespace in owner:
                raise NamespaceMapError(
                    f"{SETTING}: namespace {namespace!r} is given to both {owner[namespace]!r} and {environment!r}; "
                    "each environment needs a namespace of its own, or a command for one would act on the other's "
                    "Deployments"
                )
            owner[namespace] = environment
        self._namespaces = {environment: mapping[environment] for environment in sorted(mapping)}

    def __getitem__(self, environment: str) -> str:
        return self._namespaces[environment]

    def __iter__(self) -> Iterator[str]:
        return iter(self._namespaces)

    def __len__(self) -> int:
        return len(self._namespaces)

    def __repr__(self) -> str:
        return f"EnvironmentNamespaces({self._namespaces!r})"

    def describe(self) -> str:
        """``dev (namespace apps-dev), production (namespace apps)``: for error messages."""
        return ", ".join(f"{environment} (namespace {namespace})" for environment, namespace in self.items())

    def place(self, resource: str) -> Placement:
        """The namespace and Deployment of ``<environment>/<name>``; OutsideTheMap if there is none."""
        environment, slash, name = resource.partition("/")
        if not slash or not environment:
            raise OutsideTheMap(
                f"resource {resource!r} names no environment (expected <environment>/<name>); "
                f"this target serves {self.describe()}"
            )
        if environment not in self._namespaces:
            raise OutsideTheMap(
                f"environment {environment!r} of {resource!r} is not served by this target; it serves {self.describe()}"
            )
        if len(name) > DEPLOYMENT_MAX or not DEPLOYMENT_NAME.fullmatch(name):
            raise OutsideTheMap(f"{name!r} in {resource!r} cannot be a Deployment name (RFC 1123 subdomain)")
        return Placement(resource, environment, self._namespaces[environment], name)
