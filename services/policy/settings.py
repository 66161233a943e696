"""The policy service's settings: the runtime's ``FLOTILLA_*`` plus its own."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from flotilla_evidence import EvidenceSettings
from pydantic import Field
from pydantic_settings import SettingsConfigDict

from flotilla.authority import Signer, required_keyring, required_signer
from flotilla.fleet import POLICY, SIM, url
from flotilla.keys import Keyring
from services.policy.auth import DEMO_USERS, TokenStore, UsersConfigError


class PolicySettings(EvidenceSettings):
    """``FLOTILLA_POLICY_*`` / ``FLOTILLA_APPROVAL_*`` on top of the service settings."""

    model_config = SettingsConfigDict(env_prefix="FLOTILLA_", extra="ignore")

    service_name: str = POLICY.name
    service_database: str = POLICY.database or "flotilla_policy"
    http_port: int = POLICY.http_port

    # Decide and report, never authorize: every decision is emitted as CommandDenied
    # with the reason "dry-run: would <decision>".
    policy_dry_run: bool = False
    # Folder of *.cedar files and flotilla.cedarschema (default: infra/policies).
    policy_dir: Path | None = None
    # JSON {"<token>": {"user": ..., "roles": [...]}}, or a file of the same. Neither: the demo
    # users in the demo profile (FLOTILLA_PROFILE=demo), a refusal to start otherwise.
    policy_users: str | None = None
    policy_users_file: Path | None = None
    # Where current replica counts come from (the 2x rule): the sim's API (the local
    # target), the Kubernetes API server (the Deployments the executor scales:
    # FLOTILLA_KUBERNETES_NAMESPACES, _API_URL, _TOKEN_FILE, _CA_FILE), the estate's
    # Prometheus and catalogue (FLOTILLA_PROMETHEUS_URL, FLOTILLA_ESTATE_CATALOGUE_FILE: a
    # count anyone who can write series there can raise), or nowhere (then every production
    # scale needs a person).
    policy_inventory: Literal["sim", "kubernetes", "prometheus", "none"] = "sim"
    sim_url: str = url(SIM)
    inventory_timeout_seconds: float = 1.0
    # What shows a person the exact change of each step before they approve it
    # (services/policy/preview.py): nothing (the sim and the compose fleet cannot dry-run;
    # the page says so), or the Kubernetes API server's dry run of each write
    # (services/policy/preview_kubernetes.py: the same FLOTILLA_KUBERNETES_* settings as
    # the inventory, and a token that may dry-run those writes). The timeout bounds all
    # of one proposal's previews together: past it, a step is shown as not dry-run.
    policy_preview: Literal["none", "kubernetes"] = "none"
    preview_timeout_seconds: float = 3.0

    # The Ed25519 key the policy service signs every command it authorizes with (the
    # executor runs nothing else); a file or mounted Secret, never the repository.
    authorization_signing_key_file: Path | None = None
    # The remediation agents' public keys: a proposal is decided on only if one of them
    # attested it (flotilla.keys: "ed25519:<base64>", PEM, or a file of them).
    proposal_public_keys: list[str] = Field(default_factory=list)

    approval_ttl_seconds: float = 900.0
    approval_sweep_seconds: float = 1.0
    # How often pending proposals are checked against the inventory: one whose target has
    # left the estate is withdrawn (0: only when someone tries to approve it).
    approval_target_check_seconds: float = 15.0
    approval_required_role: str = "approver"

    def authorization_signer(self) -> Signer:
        return required_signer(
            self.authorization_signing_key_file,
            setting="FLOTILLA_AUTHORIZATION_SIGNING_KEY_FILE",
            why="the policy service signs every command it authorizes, and the executor runs nothing unsigned",
        )

    def proposer_keyring(self) -> Keyring:
        return required_keyring(
            self.proposal_public_keys,
            setting="FLOTILLA_PROPOSAL_PUBLIC_KEYS",
            why="proposals are decided on only when a remediation agent signed them",
        )

    def token_store(self) -> tuple[TokenStore, bool]:
        """The configured users, and whether they are the demo defaults.

        Raises :class:`~flotilla.settings.MissingCredentials` when no users are configured
        outside the demo profile, and :class:`UsersConfigError` for a configuration that
        names nobody (``{}``, in any profile: an approval API no one can use is a mistake).
        """
        if self.policy_users and self.policy_users.strip():
            store, source = TokenStore.from_json(self.policy_users), "FLOTILLA_POLICY_USERS"
        elif self.policy_users_file is not None:
            store = TokenStore.from_file(self.policy_users_file)
            source = f"FLOTILLA_POLICY_USERS_FILE ({self.policy_users_file})"
        else:
            self.allow_demo_credentials("FLOTILLA_POLICY_USERS")
            return TokenStore(DEMO_USERS), True
        if len(store) == 0:
            raise UsersConfigError(f"{source} names no users: configure at least one token")
        return store, False
