"""The estate catalogue: what a team declares, and every mistake named at load."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from flotilla_evidence import CatalogueError, load_catalogue, parse_catalogue

REPO = Path(__file__).resolve().parents[3]
GOOD = """
services:
  - name: checkout-api
    environment: production
    deployment: checkout
    namespace: shop
    depends_on: [payments-api, inventory-db]
    latency_threshold_ms: 500
  - name: payments-api
    failover_to: payments-api-secondary
  - name: payments-api-secondary
  - name: inventory-db
    latency_threshold_ms: 150.5
  - name: checkout-api
    environment: dev
"""


def parse(text: str) -> object:
    return parse_catalogue(yaml.safe_load(text), origin="estate.yaml", default_environment="production")


def test_a_catalogue_declares_services_per_environment() -> None:
    catalogue = parse_catalogue(yaml.safe_load(GOOD), origin="estate.yaml", default_environment="production")
    checkout = catalogue.get("production", "checkout-api")
    assert checkout is not None
    assert (checkout.deployment, checkout.namespace, checkout.depends_on) == (
        "checkout",
        "shop",
        ("payments-api", "inventory-db"),
    )
    assert checkout.latency_threshold_ms == 500.0
    payments = catalogue.get("production", "payments-api")
    assert payments is not None and payments.failover_to == "payments-api-secondary"
    assert payments.deployment == "payments-api"  # the name unless said otherwise
    assert catalogue.get("dev", "checkout-api") is not None and len(catalogue) == 5
    assert set(catalogue.in_environment("dev")) == {"checkout-api"}


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("services:\n  - name: a\n    depends_on: [b]\n", "depends on b, which names no service in production"),
        ("services:\n  - name: a\n    latency_treshold_ms: 5\n", "unknown key(s) latency_treshold_ms"),
        ("servces: []\n", "unknown key(s) servces"),
        (
            "services:\n  - {name: a, depends_on: [b]}\n  - {name: b, depends_on: [c]}\n"
            "  - {name: c, depends_on: [a]}\n",
            "dependency cycle in production: a -> b -> c -> a",
        ),
        (
            # a cycle only through a standby is a cycle too: a failover would loop
            "services:\n  - {name: a, depends_on: [b]}\n  - {name: b, failover_to: s}\n"
            "  - {name: s, depends_on: [a]}\n",
            "dependency cycle",
        ),
        ("services:\n  - {name: a, failover_to: nowhere}\n", "fails over to nowhere, which names no service"),
        ("services:\n  - {name: a}\n  - {name: a}\n", "production/a is declared twice"),
        ("services:\n  - {name: a, latency_threshold_ms: -1}\n", "latency_threshold_ms must be a positive number"),
        ("services:\n  - {name: a, latency_threshold_ms: fast}\n", "latency_threshold_ms must be a positive number"),
        ("services:\n  - {depends_on: [a]}\n", "services[0] has no name"),
        ("services:\n  - {name: a, depends_on: b}\n", "depends_on must be a list"),
        ("services:\n  - {name: a, environment: dev, depends_on: [b]}\n  - {name: b}\n", "names no service in dev"),
        ("- a\n- b\n", "expected a mapping"),
        ("services:\n  - {name: a, failover_to: a}\n", "fails over to itself"),
    ],
)
def test_every_mistake_is_named_at_load(text: str, says: str) -> None:
    with pytest.raises(CatalogueError) as refused:
        parse(text)
    assert says in str(refused.value) and "estate.yaml" in str(refused.value)


def test_no_file_is_no_catalogue_and_a_missing_or_broken_file_is_an_error(tmp_path: Path) -> None:
    assert len(load_catalogue(None, default_environment="production")) == 0
    with pytest.raises(CatalogueError, match="cannot read it"):
        load_catalogue(tmp_path / "absent.yaml", default_environment="production")
    broken = tmp_path / "broken.yaml"
    broken.write_text("services: [\n")
    with pytest.raises(CatalogueError, match="not YAML"):
        load_catalogue(broken, default_environment="production")
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    assert len(load_catalogue(empty, default_environment="production")) == 0


def test_the_local_estates_catalogue_loads() -> None:
    catalogue = load_catalogue(REPO / "infra" / "local" / "estate.yaml", default_environment="production")
    checkout = catalogue.get("production", "checkout-api")
    assert checkout is not None and checkout.depends_on == ("payments-api", "inventory-db")
    payments = catalogue.get("production", "payments-api")
    assert payments is not None and payments.failover_to == "payments-api-secondary"
    assert catalogue.get("dev", "checkout-dev") is not None
