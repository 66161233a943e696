"""A private Prometheus for one test module: Debian's binary (the local stack installs it),
its own config, data folder and port, scraping targets the test serves itself.

The stack's own Prometheus scrapes the fleet's sim on its fixed port; a test that needs
an estate it controls (a sim it breaks, TLS, basic auth) gets one of these instead."""

from __future__ import annotations

import datetime as dt
import ipaddress
import json
import socket
import ssl
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import bcrypt
import httpx
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

PROMETHEUS = Path("/usr/bin/prometheus")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def self_signed(folder: Path) -> tuple[Path, Path]:
    """A CA-capable self-signed certificate for 127.0.0.1 and its key: (cert, key)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "flotilla-test-prometheus")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = folder / "prometheus.crt", folder / "prometheus.key"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return cert_file, key_file


@dataclass(frozen=True)
class Secured:
    """TLS with this certificate (also the CA a client trusts) and one basic-auth user."""

    cert: Path
    key: Path
    username: str
    password: str


class PrivatePrometheus:
    def __init__(self, folder: Path, targets: list[str], *, secured: Secured | None = None) -> None:
        self.folder = folder
        self.targets = targets
        self.secured = secured
        self.port = free_port()
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        scheme = "https" if self.secured else "http"
        return f"{scheme}://127.0.0.1:{self.port}"

    def _write_config(self) -> list[str]:
        config = {
            "global": {"scrape_interval": "1s", "scrape_timeout": "900ms", "evaluation_interval": "1s"},
            "scrape_configs": [{"job_name": "estate", "static_configs": [{"targets": self.targets}]}],
        }
        (self.folder / "prometheus.yml").write_text(json.dumps(config))  # JSON is YAML
        args = []
        if self.secured is not None:
            hashed = bcrypt.hashpw(self.secured.password.encode(), bcrypt.gensalt(rounds=4)).decode()
            web = {
                "tls_server_config": {"cert_file": str(self.secured.cert), "key_file": str(self.secured.key)},
                "basic_auth_users": {self.secured.username: hashed},
            }
            (self.folder / "web.yml").write_text(json.dumps(web))
            args.append(f"--web.config.file={self.folder / 'web.yml'}")
        return args

    def start(self, timeout: float = 60) -> PrivatePrometheus:
        if not PROMETHEUS.exists():
            raise RuntimeError(f"{PROMETHEUS} is missing: the local stack installs it (make stack-up)")
        args = self._write_config()
        log = (self.folder / "prometheus.log").open("wb")
        self._process = subprocess.Popen(
            [
                str(PROMETHEUS),
                f"--config.file={self.folder / 'prometheus.yml'}",
                f"--storage.tsdb.path={self.folder / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                *args,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + timeout
        while not self._ready():
            if self._process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                tail = (self.folder / "prometheus.log").read_text()[-2000:]
                raise RuntimeError(f"the private Prometheus did not become ready:\n{tail}")
            time.sleep(0.2)
        return self

    def _ready(self) -> bool:
        secured = self.secured
        try:
            answer = httpx.get(
                f"{self.url}/-/ready",
                verify=ssl.create_default_context(cafile=str(secured.cert)) if secured else True,
                auth=(secured.username, secured.password) if secured else None,
                timeout=2,
            )
        except httpx.HTTPError:
            return False
        return answer.status_code == 200

    def stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(30)
            except subprocess.TimeoutExpired:
                self._process.kill()

    def __enter__(self) -> PrivatePrometheus:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()
