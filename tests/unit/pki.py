"""Real PEM material for tests of what gpuk8s accepts as a CA file: a self-signed certificate
and a private key, made fresh with the cryptography package (paramiko's own dependency)."""

from __future__ import annotations

import datetime as dt


def certificate_pem(name: str = "lab registry CA") -> bytes:
    """A self-signed X.509 certificate in PEM, and nothing else."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now).not_valid_after(now + dt.timedelta(days=1))
            .sign(key, hashes.SHA256()))
    return cert.public_bytes(serialization.Encoding.PEM)


def private_key_pem() -> bytes:
    """An unencrypted PKCS#8 private key in PEM (-----BEGIN PRIVATE KEY-----)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    return ec.generate_private_key(ec.SECP256R1()).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption())
