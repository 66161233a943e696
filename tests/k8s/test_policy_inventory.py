"""The policy service's 2x rule counts replicas from the API server, with its own token.

The production overlay applied for real (conftest's ``production``): KubernetesInventory
reads the Deployment the executor would scale, in the namespace of its environment, as the
ServiceAccount policy-service (policy-rbac.yaml: ``get deployments`` in ``apps``). A count
written into the Deployment by whoever may write it is what the rule sees; a count no
Prometheus series can change.
"""

from __future__ import annotations

import pytest
from flotilla_evidence.kubernetes import KubernetesApi

from services.policy.decide import Target
from services.policy.inventory import KubernetesInventory

from .conftest import FLEET_NAMESPACE, MERGE, TARGET_NAMESPACE, Cluster, apps

pytestmark = pytest.mark.timeout(300)

SERVED = {"production": TARGET_NAMESPACE}  # FLOTILLA_KUBERNETES_NAMESPACES of the production overlay


def inventory(cluster: Cluster, member: str = "policy-service") -> KubernetesInventory:
    token = cluster.token_for(member, FLEET_NAMESPACE)
    return KubernetesInventory(KubernetesApi(cluster.url, token, ca_file=cluster.ca), SERVED)


def test_the_count_is_the_deployments_as_the_api_server_has_it(production: Cluster) -> None:
    checkout = Target("service", "production", "checkout-api")
    with production.client() as admin:
        answer = admin.patch(apps("/checkout-api/scale"), json={"spec": {"replicas": 3}}, headers=MERGE)
        assert answer.status_code == 200, answer.text
    counted = inventory(production)
    assert counted.current_replicas(checkout) == 3
    assert counted.exists(checkout) is True
    with production.client() as admin:
        answer = admin.patch(apps("/checkout-api/scale"), json={"spec": {"replicas": 1}}, headers=MERGE)
        assert answer.status_code == 200, answer.text
    assert counted.current_replicas(checkout) == 1


def test_a_deployment_that_is_not_there_does_not_exist(production: Cluster) -> None:
    gone = Target("service", "production", "no-such-api")
    counted = inventory(production)
    assert counted.exists(gone) is False
    assert counted.current_replicas(gone) is None


def test_an_environment_the_map_does_not_serve_is_never_read(production: Cluster) -> None:
    # checkout-api exists in `elsewhere` and in the fleet's own namespace: neither is served
    counted = inventory(production)
    assert counted.current_replicas(Target("service", "elsewhere", "checkout-api")) is None
    assert counted.exists(Target("service", "elsewhere", "checkout-api")) is None


def test_a_token_without_the_role_leaves_the_count_unknown(production: Cluster) -> None:
    checkout = Target("service", "production", "checkout-api")
    refused = inventory(production, member="health-agent")  # 403: no Role
    assert refused.current_replicas(checkout) is None
    assert refused.exists(checkout) is None  # unknown, so nothing is withdrawn on its word
