"""The local fleet's sim action token (infra/local/fleetctl.py): made once, private,
reused, and given to the sim and the executor only. Nothing is started here."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import stat
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from flotilla.fleet import AUDIT, DLQ_RECONCILER, EXECUTOR, FLEET, POLICY, REMEDIATION, SIM
from services.sim.auth import check_action_token

REPO_ROOT = Path(__file__).resolve().parents[2]
LOCAL = REPO_ROOT / "infra" / "local"


def _load(name: str, path: Path, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """A script of infra/local as module ``name``, in sys.modules for the test only
    (dataclasses look their module up while the body runs)."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, module)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def fleetctl(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> ModuleType:
    """fleetctl over a stack home in tmp_path (its stackctl import sees the same one)."""
    monkeypatch.setenv("FLOTILLA_STACK_HOME", str(tmp_path / "stack"))
    monkeypatch.delenv("FLOTILLA_SIM_ACTION_TOKEN", raising=False)
    _load("stackctl", LOCAL / "stackctl.py", monkeypatch)  # what fleetctl imports by name
    return _load("_fleetctl_under_test", LOCAL / "fleetctl.py", monkeypatch)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_token_is_made_once_private_and_reused(fleetctl: ModuleType, tmp_path: Path) -> None:
    path: Path = fleetctl.SIM_ACTION_TOKEN_FILE
    assert path == tmp_path / "stack" / "secrets" / "sim-action-token"
    token = fleetctl.sim_action_token()
    assert check_action_token(token) == token  # one the sim accepts
    assert len(token) >= 40
    assert (_mode(path), _mode(path.parent)) == (0o600, 0o700)
    assert fleetctl.sim_action_token() == token  # reused, not regenerated
    path.unlink()
    assert fleetctl.sim_action_token() != token  # a new one only when the file is gone


def test_a_token_file_others_can_read_is_refused(fleetctl: ModuleType) -> None:
    path: Path = fleetctl.SIM_ACTION_TOKEN_FILE
    fleetctl.sim_action_token()
    path.chmod(0o644)
    with pytest.raises(fleetctl.StackError, match="readable by other users"):
        fleetctl.sim_action_token()
    path.chmod(0o600)
    path.write_text("\n")
    with pytest.raises(fleetctl.StackError, match="empty"):
        fleetctl.sim_action_token()


def _secrets(fleetctl: ModuleType, token: str = "the-fleets-own-token-123456") -> Any:
    made = fleetctl.FleetSecrets.ensure()
    return dataclasses.replace(made, sim_action_token=token)


def test_only_the_sim_and_the_executor_get_the_token(fleetctl: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLOTILLA_SIM_ACTION_TOKEN", "from-the-calling-shell-1234")  # never passed through
    monkeypatch.setenv("FLOTILLA_SIM_ACTION_TOKEN_FILE", "/tmp/the-shells-token")  # nor a file of its own
    for member in FLEET:
        env = fleetctl.member_env(member, _secrets(fleetctl))
        assert "FLOTILLA_SIM_ACTION_TOKEN_FILE" not in env, member.name
        if member in (SIM, EXECUTOR):
            assert env["FLOTILLA_SIM_ACTION_TOKEN"] == "the-fleets-own-token-123456", member.name
        else:
            assert "FLOTILLA_SIM_ACTION_TOKEN" not in env, member.name


def test_each_signing_key_is_held_by_its_signer_alone(fleetctl: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    """The policy service signs commands, the remediation agent proposals; whoever verifies
    gets the public key only, and nothing comes from the calling shell."""
    monkeypatch.setenv("FLOTILLA_AUTHORIZATION_PUBLIC_KEYS", '["ed25519:from-the-shell"]')
    secrets = _secrets(fleetctl)
    assert (_mode(secrets.authorization_key), _mode(secrets.proposal_key)) == (0o600, 0o600)
    holders: dict[str, set[str]] = {}
    for member in FLEET:
        for name, value in fleetctl.member_env(member, secrets).items():
            if name in fleetctl.FLEET_SECRET_SETTINGS:
                holders.setdefault(name, set()).add(member.name)
                assert "from-the-shell" not in value
    assert holders["FLOTILLA_AUTHORIZATION_SIGNING_KEY_FILE"] == {POLICY.name}
    assert holders["FLOTILLA_PROPOSAL_SIGNING_KEY_FILE"] == {REMEDIATION.name}
    assert holders["FLOTILLA_AUTHORIZATION_PUBLIC_KEYS"] == {EXECUTOR.name, DLQ_RECONCILER.name}
    assert holders["FLOTILLA_PROPOSAL_PUBLIC_KEYS"] == {POLICY.name}
    assert holders["FLOTILLA_AUDIT_SIGNING_KEY_FILE"] == holders["FLOTILLA_AUDIT_PUBLIC_KEYS"] == {AUDIT.name}
    policy_env = fleetctl.member_env(POLICY, secrets)
    assert json.loads(policy_env["FLOTILLA_PROPOSAL_PUBLIC_KEYS"]) == [secrets.proposal_public]
    again = fleetctl.FleetSecrets.ensure()  # reused, not regenerated
    assert (again.authorization_public, again.proposal_public) == (
        secrets.authorization_public,
        secrets.proposal_public,
    )


def test_the_supervisor_config_holding_the_token_is_private(fleetctl: ModuleType, tmp_path: Path) -> None:
    token = "the-fleets-own-token-123456"
    config = fleetctl._config(_secrets(fleetctl, token))
    programs = config.split("[program:")[1:]
    holders = {p.split("]", 1)[0] for p in programs if token in p}
    assert holders == {SIM.name, EXECUTOR.name}
    target = tmp_path / "supervisord.conf"
    target.write_text("older, world-readable\n")
    target.chmod(0o644)
    fleetctl.write_private(target, config)
    assert _mode(target) == 0o600 and target.read_text() == config


# ---------------------------------------------------------------- replicas


def test_replicas_are_counted_for_every_consuming_member_or_by_name(fleetctl: ModuleType) -> None:
    counts = fleetctl.replica_counts("2")
    assert counts[SIM.name] == 1 and counts["console"] == 1  # never replicated
    assert {counts[m.name] for m in FLEET if m.name not in ("sim", "console")} == {2}
    assert fleetctl.replica_counts("executor=3, policy-service=2") == {
        **{m.name: 1 for m in FLEET},
        EXECUTOR.name: 3,
        POLICY.name: 2,
    }
    assert fleetctl.replica_counts(None) == {m.name: 1 for m in FLEET}
    for bad, says in (
        ("executor=0", "from 1 to 8"),
        ("executor=x", "from 1 to 8"),
        ("nobody=2", "no fleet member named 'nobody'"),
        ("sim=2", "runs as one process"),
    ):
        with pytest.raises(fleetctl.StackError, match=says):
            fleetctl.replica_counts(bad)


def test_each_replica_is_its_own_program_port_and_instance_in_one_group(fleetctl: ModuleType) -> None:
    token = fleetctl.sim_action_token()
    processes = fleetctl.instances(fleetctl.replica_counts("executor=2"))
    executors = [i for i in processes if i.member is EXECUTOR]
    assert [(i.program, i.port) for i in executors] == [("executor", 18105), ("executor-1", 18205)]
    config = fleetctl._config(_secrets(fleetctl, token), processes)
    assert "[program:executor]" in config and "[program:executor-1]" in config
    second = fleetctl.member_env(EXECUTOR, _secrets(fleetctl, token), 1)
    first = fleetctl.member_env(EXECUTOR, _secrets(fleetctl, token), 0)
    assert (second["FLOTILLA_HTTP_PORT"], second["FLOTILLA_INSTANCE_ID"]) == ("18205", "executor-1")
    assert "FLOTILLA_INSTANCE_ID" not in first
    # one consumer group and one database: the same service name and database
    assert (first["FLOTILLA_SERVICE_NAME"], first["FLOTILLA_SERVICE_DATABASE"]) == (
        second["FLOTILLA_SERVICE_NAME"],
        second["FLOTILLA_SERVICE_DATABASE"],
    )
    ports = [i.port for i in fleetctl.instances(fleetctl.replica_counts("8"))]
    assert len(ports) == len(set(ports))  # no two processes share a port


def test_an_llm_fleet_reasons_through_the_stacks_model_server_unless_told_otherwise(
    fleetctl: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLOTILLA_REASONER", "llm")
    monkeypatch.delenv("FLOTILLA_LLM_BASE_URL", raising=False)
    monkeypatch.delenv("FLOTILLA_LLM_MODEL", raising=False)
    env = fleetctl.member_env(REMEDIATION, _secrets(fleetctl))
    assert env["FLOTILLA_LLM_BASE_URL"] == fleetctl.stackctl.MODEL_SERVER.url == "http://127.0.0.1:18122/v1"
    assert env["FLOTILLA_LLM_MODEL"] == "smollm2"
    monkeypatch.setenv("FLOTILLA_LLM_BASE_URL", "http://vllm.internal:8000/v1")  # the user's own server wins
    assert (
        fleetctl.member_env(REMEDIATION, _secrets(fleetctl))["FLOTILLA_LLM_BASE_URL"] == "http://vllm.internal:8000/v1"
    )
    monkeypatch.setenv("FLOTILLA_REASONER", "rules")
    monkeypatch.delenv("FLOTILLA_LLM_BASE_URL")
    assert "FLOTILLA_LLM_BASE_URL" not in fleetctl.member_env(REMEDIATION, _secrets(fleetctl))
