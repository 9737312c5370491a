# LAB STAND-IN: not the real kubeadm PKI. Test infrastructure for gpuk8s; never shipped to users.
"""Key and certificate handling through the node's openssl CLI (no Python crypto on nodes)."""

from __future__ import annotations

import base64
import hashlib
import ipaddress
import os
import secrets
import subprocess
import tempfile

from .common import P


class PKIError(RuntimeError):
    pass


def _openssl(*args: str, data: str | None = None) -> str:
    try:
        p = subprocess.run(["openssl", *args], input=data, capture_output=True, text=True,
                           timeout=60)
    except FileNotFoundError as e:
        raise PKIError("openssl: command not found") from e
    if p.returncode != 0:
        raise PKIError(f"openssl {' '.join(args[:2])} failed: {p.stderr.strip()}")
    return p.stdout


def gen_key(path: str, algorithm: str = "RSA-2048") -> None:
    """algorithm as kubeadm v1beta4 encryptionAlgorithm: RSA-2048 (default), RSA-3072,
    RSA-4096, ECDSA-P256, ECDSA-P384."""
    real = P(path)
    os.makedirs(os.path.dirname(real), exist_ok=True)
    if algorithm.startswith("ECDSA"):
        curve = {"ECDSA-P384": "P-384"}.get(algorithm, "P-256")
        _openssl("genpkey", "-algorithm", "EC", "-pkeyopt", f"ec_paramgen_curve:{curve}",
                 "-out", real)
    else:
        bits = algorithm.split("-")[1] if "-" in algorithm else "2048"
        _openssl("genpkey", "-algorithm", "RSA", "-pkeyopt", f"rsa_keygen_bits:{bits}",
                 "-out", real)
    os.chmod(real, 0o600)


def gen_ca(crt: str, key: str, cn: str = "kubernetes", days: int = 3650,
           algorithm: str = "RSA-2048") -> None:
    gen_key(key, algorithm)
    _openssl("req", "-x509", "-new", "-key", P(key), "-subj", f"/CN={cn}", "-days", str(days),
             "-sha256", "-set_serial", str(secrets.randbits(63)),
             "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,digitalSignature,keyEncipherment,keyCertSign",
             "-out", P(crt))


def _subject(cn: str, orgs: list[str] | tuple[str, ...] = ()) -> str:
    return "".join(f"/O={o}" for o in orgs) + f"/CN={cn}"


#: how long a leaf certificate lives, in days: kubeadm's certificateValidityPeriod
#: (ClusterConfiguration v1beta4, default 8760h: one year); kubeadm sets it from its config
LEAF_DAYS = 365


def make_csr(key: str, cn: str, orgs: list[str] | tuple[str, ...] = ()) -> str:
    return _openssl("req", "-new", "-key", P(key), "-subj", _subject(cn, orgs))


def sign_csr(csr_pem: str, ca_crt: str, ca_key: str, *, server: bool = False,
             client: bool = True, sans: list[str] | None = None, days: int | None = None
             ) -> str:
    days = days or LEAF_DAYS
    usages = []
    if server:
        usages.append("serverAuth")
    if client:
        usages.append("clientAuth")
    ext = ["[ext]", "basicConstraints=critical,CA:FALSE",
           "keyUsage=critical,digitalSignature,keyEncipherment"]
    if usages:  # a renewed certificate that had none gets none (kubeadm's certToConfig)
        ext.append(f"extendedKeyUsage={','.join(usages)}")
    if sans:
        alt = []
        for s in sans:
            try:
                ipaddress.ip_address(s)
                alt.append(f"IP:{s}")
            except ValueError:
                alt.append(f"DNS:{s}")
        ext.append("subjectAltName=" + ",".join(alt))
    with tempfile.TemporaryDirectory() as td:
        extf = os.path.join(td, "ext.cnf")
        csrf = os.path.join(td, "req.csr")
        with open(extf, "w") as f:
            f.write("\n".join(ext) + "\n")
        with open(csrf, "w") as f:
            f.write(csr_pem)
        return _openssl("x509", "-req", "-in", csrf, "-CA", P(ca_crt), "-CAkey", P(ca_key),
                        "-set_serial", str(secrets.randbits(63)), "-days", str(days), "-sha256",
                        "-extfile", extf, "-extensions", "ext")


def issue(crt: str, key: str, ca_crt: str, ca_key: str, cn: str, *,
          orgs: list[str] | tuple[str, ...] = (), server: bool = False, client: bool = True,
          sans: list[str] | None = None, algorithm: str = "RSA-2048") -> None:
    gen_key(key, algorithm)
    pem = sign_csr(make_csr(key, cn, orgs), ca_crt, ca_key, server=server, client=client,
                   sans=sans)
    with open(P(crt), "w") as f:
        f.write(pem)


def csr_subject(csr_pem: str) -> str:
    return _openssl("req", "-noout", "-subject", "-nameopt", "RFC2253", data=csr_pem).strip()


def spki_der(cert_pem: str) -> bytes:
    pub = _openssl("x509", "-noout", "-pubkey", data=cert_pem)
    body = "".join(ln for ln in pub.splitlines() if ln and not ln.startswith("-----"))
    return base64.b64decode(body)


def ca_cert_hash(cert_pem: str) -> str:
    """kubeadm pubkeypin: 'sha256:' + hex SHA-256 of the certificate's SubjectPublicKeyInfo."""
    return "sha256:" + hashlib.sha256(spki_der(cert_pem)).hexdigest()


def b64(data: str | bytes) -> str:
    return base64.b64encode(data.encode() if isinstance(data, str) else data).decode()


def seal(key_hex: str, data: bytes) -> bytes:
    """kubeadm's encryption of the certificates it uploads (kubeadm-certs): AES-256-GCM with
    the certificate key, a random 12-byte nonce before the ciphertext and its tag."""
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    nonce = os.urandom(12)
    return nonce + AESGCM(bytes.fromhex(key_hex)).encrypt(nonce, data, None)


def unseal(key_hex: str, blob: bytes) -> bytes:
    """The reverse of seal; raises PKIError for a wrong key or damaged data."""
    from cryptography.exceptions import InvalidTag
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    try:
        return AESGCM(bytes.fromhex(key_hex)).decrypt(blob[:12], blob[12:], None)
    except (InvalidTag, ValueError) as e:
        raise PKIError("cipher: message authentication failed") from e


def attributes(cert_pem: str) -> tuple[str, list[str], list[str], bool, bool]:
    """(CN, organizations, SANs, server, client) of a certificate, as openssl prints them."""
    subject = _openssl("x509", "-noout", "-subject", "-nameopt", "RFC2253",
                       data=cert_pem).strip().removeprefix("subject=")
    cn, orgs = "", []
    for part in subject.split(","):
        key, _, value = part.strip().partition("=")
        if key == "CN":
            cn = value
        elif key == "O":
            orgs.append(value)
    text = _openssl("x509", "-noout", "-ext", "subjectAltName,extendedKeyUsage",
                    data=cert_pem)
    sans = [s.strip().split(":", 1)[1].strip() for line in text.splitlines()
            for s in line.split(",") if s.strip().startswith(("DNS:", "IP Address:"))]
    return (cn, orgs, sans, "TLS Web Server Authentication" in text,
            "TLS Web Client Authentication" in text)


def renew(cert_pem: str, key: str, ca_crt: str, ca_key: str, algorithm: str,
          days: int | None = None) -> str:
    """A new key at ``key`` and a certificate for it with the old one's attributes, signed
    by the CA: what kubeadm's renewal does (a new key and certificate from the old
    certificate's config)."""
    cn, orgs, sans, server, client = attributes(cert_pem)
    gen_key(key, algorithm)
    return sign_csr(make_csr(key, cn, orgs), ca_crt, ca_key, server=server, client=client,
                    sans=sans or None, days=days)
