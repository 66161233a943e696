"""The audit service's settings (``FLOTILLA_*`` variables over the stack env file)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from flotilla import ServiceSettings, default_env_file
from flotilla.authority import required_keyring
from flotilla.fleet import AUDIT
from flotilla.keys import Keyring, load_private_key
from services.audit.chain import Signer

ALL_TOPICS = ("incidents", "commands", "incidents.dlq", "commands.dlq")
ANCHORS_TOPIC = "audit.anchors"


def _default_key_file() -> Path:
    """Beside the stack's env file (``.stack/``), which is not committed."""
    return default_env_file().parent / "audit" / "signing-key.pem"


class AuditSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="FLOTILLA_", extra="ignore")

    service_name: str = AUDIT.name
    service_database: str = AUDIT.database or "flotilla_audit"
    http_port: int = AUDIT.http_port

    audit_topics: tuple[str, ...] = ALL_TOPICS
    audit_signing_key_file: Path | None = None  # FLOTILLA_AUDIT_SIGNING_KEY_FILE
    # The keys /verify trusts (flotilla.keys: "ed25519:<base64>", PEM, or files of them):
    # never the key an entry names. The signing key must be one of them. Several: rotation.
    audit_public_keys: list[str] = Field(default_factory=list)
    # Where the signed chain head is anchored, and how often (when the log has grown).
    audit_anchors_topic: str = ANCHORS_TOPIC
    audit_anchor_seconds: float = Field(5.0, gt=0)

    @property
    def signing_key_path(self) -> Path:
        return self.audit_signing_key_file or _default_key_file()

    def signer(self) -> Signer:
        """The log's signing key. Never made here: a key the audit made itself after the
        old one went missing would be a new identity for an existing log."""
        path = self.signing_key_path
        if not path.exists():
            raise ValueError(
                f"the audit signing key {path} does not exist; the audit never makes one itself. Create it "
                f"(python -m flotilla.keys generate {path}) and trust its public key in FLOTILLA_AUDIT_PUBLIC_KEYS"
            )
        return Signer(load_private_key(path))

    def trusted_keys(self, signer: Signer) -> Keyring:
        """The keys /verify trusts; the signing key must be among them (fail closed)."""
        trusted = required_keyring(
            self.audit_public_keys,
            setting="FLOTILLA_AUDIT_PUBLIC_KEYS",
            why="/verify trusts only configured keys, never the key an entry names",
        )
        if signer.key_id not in trusted:
            raise ValueError(
                f"the audit signing key {signer.key_id} is not among FLOTILLA_AUDIT_PUBLIC_KEYS "
                f"({trusted.describe()}): entries it signs would not verify"
            )
        return trusted
