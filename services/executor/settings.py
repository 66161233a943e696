"""The executor's settings (``FLOTILLA_*``) and the target they select."""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import SettingsConfigDict

from flotilla import ServiceSettings
from flotilla.authority import required_keyring
from flotilla.fleet import EXECUTOR
from flotilla.keys import Keyring
from services.executor.execution import ExecutorConfig
from services.executor.namespaces import EnvironmentNamespaces
from services.executor.targets import ActionTarget, KubernetesTarget, SimTarget

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")


def default_executor_id() -> str:
    """``<hostname>-<pid>``: unique per process, so a restarted executor is a new holder
    and waits for its predecessor's lease to expire (set FLOTILLA_EXECUTOR_ID to a stable
    id, e.g. a StatefulSet pod name, to take its own leases back at once)."""
    return f"{socket.gethostname()}-{os.getpid()}"


class ExecutorSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="FLOTILLA_", extra="ignore")

    service_name: str = EXECUTOR.name
    service_database: str = EXECUTOR.database or "flotilla_executor"
    http_port: int = EXECUTOR.http_port

    executor_id: str = Field(default_factory=default_executor_id, min_length=1)  # the lease holder
    executor_lease_ttl_seconds: float = Field(15.0, gt=0)
    executor_lease_wait_seconds: float = Field(20.0, ge=0)  # wait for another holder's lease, then fail
    executor_target_attempts: int = Field(3, ge=1)  # calls per step while the target is unavailable
    executor_target_backoff_seconds: float = Field(0.5, ge=0)
    # One call to the target; a slow action keeps its lease meanwhile (a heartbeat), so
    # this is about a target that stopped answering, not about slow actions.
    executor_target_timeout_seconds: float = Field(30.0, gt=0)
    # No retry of a step starts later than this after its first call.
    executor_action_timeout_seconds: float = Field(120.0, gt=0)
    executor_target: Literal["sim", "kubernetes"] = "sim"
    # The policy service's public keys (flotilla.keys: "ed25519:<base64>", PEM, or a file
    # of them): a command runs only if one of them signed it. Several: key rotation.
    authorization_public_keys: list[str] = Field(default_factory=list)

    sim_url: str = "http://127.0.0.1:18110"
    # The bearer token the sim's action API requires (the sim's setting of the same name),
    # or a file holding it (docker compose: keys-init generates one into a volume only the
    # sim and the executor mount). One or the other, not both.
    sim_action_token: SecretStr | None = None
    sim_action_token_file: Path | None = None
    kubernetes_api_url: str = "https://kubernetes.default.svc"
    # environment -> namespace (JSON), e.g. {"production": "apps"}: the Kubernetes target
    # acts on <environment>/<name> only as Deployment <name> in that namespace.
    kubernetes_namespaces: dict[str, str] = Field(default_factory=dict)
    # Replaced by kubernetes_namespaces; read only to refuse it (one namespace for every
    # environment is how a dev command reached production).
    kubernetes_namespace: str | None = None
    kubernetes_token_file: str = str(SERVICE_ACCOUNT / "token")
    kubernetes_ca_file: str = str(SERVICE_ACCOUNT / "ca.crt")

    @model_validator(mode="after")
    def _targets_are_configured(self) -> ExecutorSettings:
        """The target's settings, checked when they are loaded rather than at the first command."""
        if self.kubernetes_namespace is not None:
            raise ValueError(
                "FLOTILLA_KUBERNETES_NAMESPACE is no longer read: set FLOTILLA_KUBERNETES_NAMESPACES to a JSON "
                f'object of environment -> namespace instead, e.g. {{"production": "{self.kubernetes_namespace}"}}'
            )
        if self.executor_target == "kubernetes":
            EnvironmentNamespaces(self.kubernetes_namespaces)
        if self.sim_action_token is not None and not self.sim_action_token.get_secret_value().strip():
            raise ValueError("FLOTILLA_SIM_ACTION_TOKEN is empty")
        if self.sim_action_token is not None and self.sim_action_token_file is not None:
            raise ValueError("set FLOTILLA_SIM_ACTION_TOKEN or FLOTILLA_SIM_ACTION_TOKEN_FILE, not both")
        return self

    def sim_token(self) -> str | None:
        """The sim's action token: FLOTILLA_SIM_ACTION_TOKEN, else the content of
        FLOTILLA_SIM_ACTION_TOKEN_FILE (read now; ValueError when unreadable or empty), else None."""
        if self.sim_action_token is not None:
            return self.sim_action_token.get_secret_value()
        if self.sim_action_token_file is None:
            return None
        try:
            token = self.sim_action_token_file.read_text().strip()
        except OSError as exc:
            raise ValueError(f"FLOTILLA_SIM_ACTION_TOKEN_FILE {self.sim_action_token_file}: {exc.strerror}") from None
        if not token:
            raise ValueError(f"FLOTILLA_SIM_ACTION_TOKEN_FILE {self.sim_action_token_file} is empty")
        return token

    def authorization_keyring(self) -> Keyring:
        return required_keyring(
            self.authorization_public_keys,
            setting="FLOTILLA_AUTHORIZATION_PUBLIC_KEYS",
            why="the executor runs only commands the policy service signed",
        )

    def executor_config(self) -> ExecutorConfig:
        return ExecutorConfig(
            holder=self.executor_id,
            lease_ttl_seconds=self.executor_lease_ttl_seconds,
            lease_wait_seconds=self.executor_lease_wait_seconds,
            target_attempts=self.executor_target_attempts,
            target_backoff_seconds=self.executor_target_backoff_seconds,
            action_timeout_seconds=self.executor_action_timeout_seconds,
        )

    def build_target(self) -> ActionTarget:
        if self.executor_target == "kubernetes":
            ca = Path(self.kubernetes_ca_file)
            return KubernetesTarget(
                self.kubernetes_api_url,
                Path(self.kubernetes_token_file).read_text().strip(),
                EnvironmentNamespaces(self.kubernetes_namespaces),
                verify=str(ca) if ca.exists() else True,
                timeout=self.executor_target_timeout_seconds,
            )
        token = self.sim_token()
        if token is None:
            raise ValueError(
                "FLOTILLA_SIM_ACTION_TOKEN is not set: the sim's action API admits only the executor, by that "
                "token (the sim's setting of the same name, or FLOTILLA_SIM_ACTION_TOKEN_FILE; the local fleet "
                "and docker compose generate one)"
            )
        return SimTarget(self.sim_url, token, timeout=self.executor_target_timeout_seconds)
