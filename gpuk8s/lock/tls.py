"""serve-bundle's TLS: a CA made once for the admin machine (kept under the serve state, key
0600) and a server certificate for the addresses the nodes use, in its subjectAltName (Go's TLS,
containerd's, matches names against the SAN only: https://go.dev/doc/go1.15#commonname)."""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from collections.abc import Sequence
from pathlib import Path


def ensure_ca(state: Path) -> tuple[Path, Path]:
    """The admin machine's bundle CA (made once, kept under ``state``, key 0600)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    crt, key = state / "ca.crt", state / "ca.key"
    if crt.is_file() and key.is_file():
        return crt, key
    private = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gpuk8s bundle CA")])
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(private.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(hours=1))
            .not_valid_after(now + dt.timedelta(days=3650))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(private.public_key()),
                           critical=False)
            .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False,
                                         False), critical=True)
            .sign(private, hashes.SHA256()))
    state.mkdir(parents=True, exist_ok=True, mode=0o700)
    _write_private(key, private.private_bytes(serialization.Encoding.PEM,
                                              serialization.PrivateFormat.PKCS8,
                                              serialization.NoEncryption()))
    crt.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return crt, key


def _write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)


def server_cert(state: Path, names: Sequence[str]) -> tuple[Path, Path]:
    """A server certificate for ``names`` (IP addresses and DNS names), signed by the CA."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    ca_crt, ca_key = ensure_ca(state)
    ca = x509.load_pem_x509_certificate(ca_crt.read_bytes())
    signer = serialization.load_pem_private_key(ca_key.read_bytes(), None)
    private = ec.generate_private_key(ec.SECP256R1())
    sans: list[x509.GeneralName] = []
    for name in names:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            sans.append(x509.DNSName(name))
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]))
            .issuer_name(ca.subject).public_key(private.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(hours=1))
            .not_valid_after(now + dt.timedelta(days=825))
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]),
                           critical=False)
            # Python 3.13's default verification (VERIFY_X509_STRICT) wants both identifiers
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(private.public_key()),
                           critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
                ca.public_key()), critical=False)  # type: ignore[arg-type]
            .sign(signer, hashes.SHA256()))  # type: ignore[arg-type]
    crt, key = state / "server.crt", state / "server.key"
    _write_private(key, private.private_bytes(serialization.Encoding.PEM,
                                              serialization.PrivateFormat.PKCS8,
                                              serialization.NoEncryption()))
    crt.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return crt, key
