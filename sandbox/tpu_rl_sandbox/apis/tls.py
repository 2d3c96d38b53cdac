"""The sandbox's certificate authority and the serving certificate of its Kubernetes API servers.

Generated once per sandbox under ``<root>/tls`` (``ca.pem``, ``ca.key``, ``server.pem``,
``server.key``). The serving certificate is for ``IP:127.0.0.1`` and ``DNS:localhost``, signed by
the CA whose PEM the fake GKE API returns as ``masterAuth.clusterCaCertificate`` (base64), so a
client that verifies the server against that CA, as ``GKEKubernetesAsyncHook`` does, connects.
"""

from __future__ import annotations

import base64
import datetime as dt
import fcntl
import ipaddress
import os
import ssl
import tempfile
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tpu_rl_sandbox.world.layout import SandboxLayout

TLS_DIR = "tls"
VALID_DAYS = 3650

__all__ = ["SandboxTls", "ca_base64", "ensure_tls", "server_ssl_context"]


@dataclass(frozen=True)
class SandboxTls:
    """Paths of the CA and serving certificate."""

    ca_cert: Path
    ca_key: Path
    server_cert: Path
    server_key: Path


def _paths(layout: SandboxLayout) -> SandboxTls:
    directory = layout.root / TLS_DIR
    return SandboxTls(
        ca_cert=directory / "ca.pem",
        ca_key=directory / "ca.key",
        server_cert=directory / "server.pem",
        server_key=directory / "server.key",
    )


def _write(path: Path, data: bytes, private: bool = False) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    if private:
        os.chmod(tmp, 0o600)
    os.replace(tmp, path)


def _key_pem(key: rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.TraditionalOpenSSL,
        serialization.NoEncryption(),
    )


def _generate(paths: SandboxTls) -> None:
    now = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)
    ca_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    # GKE's cluster CA has a UUID-like common name; any self-signed CA with CA:TRUE works for clients.
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "tpu-rl-sandbox cluster CA")])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + dt.timedelta(days=VALID_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    server_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    server_cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver")]))
        .issuer_name(ca_name)
        .public_key(server_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + dt.timedelta(days=VALID_DAYS))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    _write(paths.ca_key, _key_pem(ca_key), private=True)
    _write(paths.server_key, _key_pem(server_key), private=True)
    _write(paths.server_cert, server_cert.public_bytes(serialization.Encoding.PEM))
    _write(paths.ca_cert, ca_cert.public_bytes(serialization.Encoding.PEM))  # last: marks completion


def ensure_tls(layout: SandboxLayout) -> SandboxTls:
    """The sandbox's CA and serving certificate (generated on first use, then kept)."""
    paths = _paths(layout)
    paths.ca_cert.parent.mkdir(parents=True, exist_ok=True)
    with (paths.ca_cert.parent / ".lock").open("a") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        try:
            if not all(
                p.is_file() for p in (paths.ca_cert, paths.ca_key, paths.server_cert, paths.server_key)
            ):
                _generate(paths)
        finally:
            fcntl.flock(lock.fileno(), fcntl.LOCK_UN)
    return paths


def ca_base64(layout: SandboxLayout) -> str:
    """The CA certificate as GKE returns it in ``masterAuth.clusterCaCertificate`` (base64 of the PEM)."""
    return base64.b64encode(ensure_tls(layout).ca_cert.read_bytes()).decode()


def server_ssl_context(layout: SandboxLayout) -> ssl.SSLContext:
    """A server-side TLS context with the sandbox's serving certificate."""
    paths = ensure_tls(layout)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(str(paths.server_cert), str(paths.server_key))
    return context
