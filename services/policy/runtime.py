"""What the policy service's handlers, routes and sweep share besides the ServiceContext."""

from __future__ import annotations

from dataclasses import dataclass, field

from flotilla.authority import Signer
from flotilla.keys import Keyring
from services.policy.auth import TokenStore
from services.policy.decide import PolicyEngine
from services.policy.inventory import EstateInventory, Inventory, KubernetesInventory, NoInventory, SimInventory
from services.policy.preview import ChangePreviewer, NoPreviewer, previewer_from_settings
from services.policy.settings import PolicySettings


@dataclass(frozen=True)
class PolicyRuntime:
    engine: PolicyEngine
    inventory: Inventory
    tokens: TokenStore
    signer: Signer  # signs the commands this service authorizes
    proposers: Keyring  # whose proposals it decides on
    approval_ttl_seconds: float = 900.0
    sweep_seconds: float = 1.0
    target_check_seconds: float = 15.0
    dry_run: bool = False
    required_role: str = "approver"
    demo_users: bool = False
    previewer: ChangePreviewer = field(default_factory=NoPreviewer)  # the exact change each step makes
    preview_timeout_seconds: float = 3.0

    @classmethod
    def from_settings(cls, settings: PolicySettings) -> PolicyRuntime:
        engine = PolicyEngine.from_directory(settings.policy_dir)
        inventory: Inventory = NoInventory()
        if settings.policy_inventory == "sim":
            inventory = SimInventory(settings.sim_url, settings.inventory_timeout_seconds)
        elif settings.policy_inventory == "kubernetes":
            inventory = KubernetesInventory.from_settings(settings, timeout=settings.inventory_timeout_seconds)
        elif settings.policy_inventory == "prometheus":
            inventory = EstateInventory(settings.evidence())
        tokens, demo = settings.token_store()
        return cls(
            engine=engine,
            inventory=inventory,
            tokens=tokens,
            signer=settings.authorization_signer(),
            proposers=settings.proposer_keyring(),
            approval_ttl_seconds=settings.approval_ttl_seconds,
            sweep_seconds=settings.approval_sweep_seconds,
            target_check_seconds=settings.approval_target_check_seconds,
            dry_run=settings.policy_dry_run,
            required_role=settings.approval_required_role,
            demo_users=demo,
            previewer=previewer_from_settings(settings),
            preview_timeout_seconds=settings.preview_timeout_seconds,
        )
