"""tests/support/netpol.py decides as the Kubernetes documentation says NetworkPolicies do:
the k8s lane's Connect test (no CNI there) is only as good as this evaluation."""

from __future__ import annotations

from typing import Any

from tests.support.netpol import Pod, admits, connects, lets_out


def pod(namespace: str = "a", **labels: str) -> Pod:
    return Pod(namespace, labels, {"kubernetes.io/metadata.name": namespace}, {"api": 8083})


def ingress(*rules: dict[str, Any], namespace: str = "a", selector: dict[str, Any] | None = None) -> dict[str, Any]:
    spec = {"podSelector": selector or {}, "policyTypes": ["Ingress"], "ingress": list(rules)}
    return {"metadata": {"namespace": namespace, "name": "p"}, "spec": spec}


def test_a_pod_no_policy_selects_admits_everything() -> None:
    assert admits([ingress(selector={"matchLabels": {"app": "other"}})], pod("b"), pod(app="x"), 1)


def test_a_selected_pod_admits_only_what_a_rule_allows() -> None:
    deny = {"metadata": {"namespace": "a", "name": "d"}, "spec": {"podSelector": {}, "policyTypes": ["Ingress"]}}
    assert not admits([deny], pod(), pod(), 8083)


def test_a_pod_selector_alone_means_the_policys_namespace() -> None:
    policy = ingress({"from": [{"podSelector": {"matchLabels": {"role": "client"}}}]})
    assert admits([policy], pod(role="client"), pod(), 8083)
    assert not admits([policy], pod("b", role="client"), pod(), 8083)


def test_an_empty_namespace_selector_means_every_namespace() -> None:
    policy = ingress({"from": [{"namespaceSelector": {}, "podSelector": {"matchLabels": {"role": "op"}}}]})
    assert admits([policy], pod("anywhere", role="op"), pod(), 8083)
    named = ingress(
        {"from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ops"}}, "podSelector": {}}]}
    )
    assert admits([named], pod("ops"), pod(), 8083) and not admits([named], pod("anywhere"), pod(), 8083)


def test_ports_by_number_name_and_protocol() -> None:
    by_number = ingress({"ports": [{"port": 8083}]})
    assert admits([by_number], pod("b"), pod(), 8083) and not admits([by_number], pod("b"), pod(), 9092)
    by_name = ingress({"ports": [{"port": "api", "protocol": "TCP"}]})
    assert admits([by_name], pod("b"), pod(), 8083)
    assert not admits([by_name], pod("b"), pod(), 8083, "UDP")


def test_policies_add_up_and_both_ends_must_agree() -> None:
    narrow = ingress({"from": [{"podSelector": {"matchLabels": {"role": "client"}}}]})
    wide = ingress({"from": [{"namespaceSelector": {}}]})
    assert not admits([narrow], pod("b"), pod(), 8083)
    assert admits([narrow, wide], pod("b"), pod(), 8083)  # a union: the wider one lets it in
    no_egress = {"metadata": {"namespace": "b", "name": "e"}, "spec": {"podSelector": {}, "policyTypes": ["Egress"]}}
    assert not lets_out([no_egress], pod("b"), pod(), 8083)
    assert not connects([wide, no_egress], pod("b"), pod(), 8083)
