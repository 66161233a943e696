"""NetworkPolicy semantics (networking.k8s.io/v1), evaluated over policy objects.

The Kubernetes lanes run no CNI: nothing enforces a NetworkPolicy there. What a test can
do is read the policies as the API server stored them (defaults applied) and decide, by
the rules the Kubernetes documentation gives, whether a connection would be allowed:

- a pod is isolated for ingress (egress) when a policy of its namespace selects it and
  lists that policy type; an isolated pod admits only what some rule of such a policy
  allows, and policies add up (a union, never an intersection);
- a peer with only ``podSelector`` means pods of the *policy's* namespace; only
  ``namespaceSelector``: every pod of the namespaces it selects; both: those pods in those
  namespaces; a rule without ``from``/``to`` allows every peer; without ``ports``, every port;
- a named port is the destination container's port of that name; the protocol is TCP
  unless the rule says otherwise.

``ipBlock`` peers are never matched: the pods here have no addresses.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Pod:
    """A pod as a policy sees it: its namespace (and that namespace's labels), its labels,
    and its container ports by name."""

    namespace: str
    labels: Mapping[str, str]
    namespace_labels: Mapping[str, str]
    ports: Mapping[str, int] = field(default_factory=dict)
    name: str = ""

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name or dict(self.labels)}"


def selects(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """Label-selector semantics; an empty selector selects everything."""
    if selector is None:
        return False
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], expr.get("values") or []
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


def _peer_matches(peer: Mapping[str, Any], policy_namespace: str, other: Pod) -> bool:
    if "ipBlock" in peer:
        return False
    if "namespaceSelector" in peer:
        if not selects(peer["namespaceSelector"], other.namespace_labels):
            return False
    elif other.namespace != policy_namespace:
        return False
    return "podSelector" not in peer or selects(peer["podSelector"], other.labels)


def _port_matches(ports: Sequence[Mapping[str, Any]] | None, destination: Pod, port: int, protocol: str) -> bool:
    if not ports:
        return True
    for entry in ports:
        if entry.get("protocol", "TCP") != protocol:
            continue
        wanted = entry.get("port")
        if wanted is None:
            return True
        number = destination.ports.get(wanted) if isinstance(wanted, str) else wanted
        end = entry.get("endPort", number)
        if number is not None and number <= port <= end:
            return True
    return False


def _governing(policies: Iterable[Mapping[str, Any]], pod: Pod, kind: str) -> list[Mapping[str, Any]]:
    return [
        p
        for p in policies
        if p["metadata"]["namespace"] == pod.namespace
        and kind in p["spec"].get("policyTypes", [])
        and selects(p["spec"].get("podSelector", {}), pod.labels)
    ]


def admits(
    policies: Iterable[Mapping[str, Any]], source: Pod, destination: Pod, port: int, protocol: str = "TCP"
) -> bool:
    """Whether ``destination``'s ingress policies let ``source`` in on ``port``."""
    governing = _governing(policies, destination, "Ingress")
    if not governing:
        return True
    for policy in governing:
        for rule in policy["spec"].get("ingress") or []:
            peers = rule.get("from")
            if peers and not any(_peer_matches(p, policy["metadata"]["namespace"], source) for p in peers):
                continue
            if _port_matches(rule.get("ports"), destination, port, protocol):
                return True
    return False


def lets_out(
    policies: Iterable[Mapping[str, Any]], source: Pod, destination: Pod, port: int, protocol: str = "TCP"
) -> bool:
    """Whether ``source``'s egress policies let it reach ``destination`` on ``port``."""
    governing = _governing(policies, source, "Egress")
    if not governing:
        return True
    for policy in governing:
        for rule in policy["spec"].get("egress") or []:
            peers = rule.get("to")
            if peers and not any(_peer_matches(p, policy["metadata"]["namespace"], destination) for p in peers):
                continue
            if _port_matches(rule.get("ports"), destination, port, protocol):
                return True
    return False


def connects(
    policies: Iterable[Mapping[str, Any]], source: Pod, destination: Pod, port: int, protocol: str = "TCP"
) -> bool:
    """Both ends agree: the source may leave, and the destination lets it in."""
    listed = list(policies)
    return lets_out(listed, source, destination, port, protocol) and admits(listed, source, destination, port, protocol)
