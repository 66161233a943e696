"""Where the 2x rule's replica count comes from when a Kubernetes inventory is configured.

The API server's answers here are recorded (an httpx transport); tests/k8s/test_policy_inventory.py
reads a real API server with the policy service's own token."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from flotilla_evidence import parse_catalogue
from flotilla_evidence.kubernetes import KubernetesApi

from flotilla.keys import create_private_key, public_key_text
from services.policy.decide import Target
from services.policy.inventory import KubernetesInventory, missing
from services.policy.runtime import PolicyRuntime
from services.policy.settings import PolicySettings

APPS = "/apis/apps/v1/namespaces/apps/deployments"


def api(deployments: dict[str, Any], status: int = 200) -> tuple[KubernetesApi, list[str]]:
    asked: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        asked.append(request.url.raw_path.decode())
        if status != 200:
            return httpx.Response(status, text="no")
        body = deployments.get(request.url.path)
        return httpx.Response(404, json={"kind": "Status"}) if body is None else httpx.Response(200, json=body)

    return KubernetesApi("https://k8s.test", "t", transport=httpx.MockTransport(answer)), asked


def deployment(replicas: Any) -> dict[str, Any]:
    return {"kind": "Deployment", "metadata": {"name": "checkout-api"}, "spec": {"replicas": replicas}}


def test_the_count_is_the_deployments_in_its_environments_namespace() -> None:
    client, asked = api({f"{APPS}/checkout-api": deployment(3)})
    inventory = KubernetesInventory(client, {"production": "apps"})
    target = Target("service", "production", "checkout-api")
    assert inventory.current_replicas(target) == 3
    assert inventory.exists(target) is True
    assert asked == [f"{APPS}/checkout-api", f"{APPS}/checkout-api"]


def test_a_deployment_the_api_server_does_not_have_does_not_exist() -> None:
    client, _ = api({})
    inventory = KubernetesInventory(client, {"production": "apps"})
    gone = Target("service", "production", "checkout-api")
    assert inventory.current_replicas(gone) is None
    assert inventory.exists(gone) is False
    assert missing(inventory, (gone,)) == [gone]


@pytest.mark.parametrize("status", [403, 500])
def test_an_api_server_that_refuses_or_fails_leaves_the_count_unknown(status: int) -> None:
    client, _ = api({f"{APPS}/checkout-api": deployment(3)}, status=status)
    inventory = KubernetesInventory(client, {"production": "apps"})
    target = Target("service", "production", "checkout-api")
    assert inventory.current_replicas(target) is None  # a person decides
    assert inventory.exists(target) is None  # and the proposal is not withdrawn
    assert missing(inventory, (target,)) == []


def test_an_environment_outside_the_map_is_never_counted_and_its_existence_is_the_catalogues() -> None:
    client, asked = api({f"{APPS}/checkout-api": deployment(3)})
    catalogue = parse_catalogue(
        {"services": [{"name": "checkout-api", "environment": "staging", "latency_threshold_ms": 300}]},
        origin="test",
        default_environment="production",
    )
    inventory = KubernetesInventory(client, {"production": "apps"}, catalogue)
    assert inventory.current_replicas(Target("service", "staging", "checkout-api")) is None
    assert inventory.exists(Target("service", "staging", "checkout-api")) is True
    assert inventory.exists(Target("service", "staging", "search-api")) is False
    assert asked == []  # nothing asked of the API server for an environment it does not hold
    assert KubernetesInventory(client, {"production": "apps"}).exists(Target("service", "staging", "x")) is None


@pytest.mark.parametrize("replicas", ["3", True, None, 2.5])
def test_a_count_that_is_not_an_integer_is_unknown(replicas: Any) -> None:
    client, _ = api({f"{APPS}/checkout-api": deployment(replicas)})
    assert (
        KubernetesInventory(client, {"production": "apps"}).current_replicas(
            Target("service", "production", "checkout-api")
        )
        is None
    )


def test_a_name_is_one_path_segment() -> None:
    client, asked = api({})
    KubernetesInventory(client, {"production": "apps"}).current_replicas(
        Target("service", "production", "../../secrets/x")
    )
    assert asked == [f"{APPS}/..%2F..%2Fsecrets%2Fx"]


def _settings(tmp_path: Path, **env: Any) -> PolicySettings:
    token = tmp_path / "token"
    token.write_text("a-token\n")
    values: dict[str, Any] = {
        "policy_inventory": "kubernetes",
        "kubernetes_token_file": token,
        "kubernetes_ca_file": None,
        "kubernetes_api_url": "https://k8s.test",
        **env,
    }
    return PolicySettings(**values)


def test_the_setting_needs_the_namespace_map_and_a_token(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="FLOTILLA_KUBERNETES_NAMESPACES"):
        KubernetesInventory.from_settings(_settings(tmp_path), timeout=1)
    settings = _settings(tmp_path, kubernetes_namespaces={"production": "apps"})
    inventory = KubernetesInventory.from_settings(settings, timeout=1)
    assert isinstance(inventory, KubernetesInventory)
    settings.kubernetes_token_file = tmp_path / "absent"
    with pytest.raises(ValueError, match="cannot be read"):
        KubernetesInventory.from_settings(settings, timeout=1)


def test_the_policy_service_reads_the_api_server_when_told_to(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLOTILLA_PROFILE", "demo")  # the demo approvers: this test is about the inventory
    signing = tmp_path / "authorization.pem"
    key = create_private_key(signing)
    assert key is not None
    settings = _settings(
        tmp_path,
        kubernetes_namespaces={"production": "apps"},
        authorization_signing_key_file=signing,
        proposal_public_keys=[public_key_text(key.public_key())],
    )
    runtime = PolicyRuntime.from_settings(settings)
    assert isinstance(runtime.inventory, KubernetesInventory)
