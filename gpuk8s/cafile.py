"""A registry mirror's ca_file, read on this machine: only its CERTIFICATE blocks, each a valid
X.509 certificate, never a private key. The variable check (checks.py) and the op that copies
it to every node (ops/registry.py) read it the same way, so it sits below both."""

from __future__ import annotations

import os
import re

from gpuk8s.errors import Gpuk8sError

#: one PEM block: its label and the whole block, BEGIN to END line (RFC 7468)
_PEM_BLOCK = re.compile(rb"-----BEGIN ([A-Z0-9 ]+)-----\r?\n.*?-----END \1-----", re.S)
#: a CA file larger than this is not a CA file (Debian's whole bundle is about 220 KB)
CA_FILE_LIMIT = 1 << 20


class CaFileProblem(Gpuk8sError):
    """A ca_file that cannot be copied to the nodes: what is wrong (``problem``) and what to
    do (``fix``)."""

    def __init__(self, problem: str, fix: str) -> None:
        super().__init__(f"{problem}; {fix}")
        self.problem = problem
        self.fix = fix


def ca_certificates(data: bytes, source: str) -> bytes:
    """The CERTIFICATE blocks of the PEM text ``data`` (from ``source``, named in errors), each
    checked to parse as an X.509 certificate, and nothing else: the copy goes 0644 to every node
    and into ``plan --diff``. A private key anywhere in the file refuses it."""
    found = list(_PEM_BLOCK.finditer(data))
    if b"PRIVATE KEY" in data:
        labels = sorted({m[1].decode() for m in found if b"PRIVATE KEY" in m[1]})
        raise CaFileProblem(
            f"ca_file {source} holds a private key ({', '.join(labels) or 'PRIVATE KEY'}): "
            "gpuk8s copies ca_file to every node, readable by every user there, and shows it "
            "in plan --diff",
            "give a file that holds only the registry's CA certificate (openssl x509 -in "
            f"{source} -out ca.crt writes its first certificate alone) and keep the key on "
            "the registry")
    certs = [m for m in found if m[1] == b"CERTIFICATE"]
    if not certs:
        raise CaFileProblem(f"ca_file {source} holds no PEM certificate (-----BEGIN "
                            "CERTIFICATE-----)", "give the registry's CA certificate in PEM "
                            "(openssl x509 -inform der -in ca.der -out ca.pem converts DER)")
    from cryptography import x509

    for i, m in enumerate(certs, 1):
        try:
            x509.load_pem_x509_certificate(m[0])
        except ValueError as exc:
            raise CaFileProblem(f"ca_file {source}: certificate {i} of {len(certs)} is not a "
                                "valid X.509 certificate", "export the registry's CA "
                                "certificate again, in PEM") from exc
    return b"".join(m[0] + b"\n" for m in certs)


def read_ca_file(path: str) -> bytes:
    """The certificates of the CA file at ``path`` on this machine (see ca_certificates);
    CaFileProblem when it cannot be read or is not a CA file."""
    fix = ("give the absolute path of the registry's CA certificate (PEM) on this machine; "
           "gpuk8s copies it to every node")
    try:
        with open(os.path.expanduser(path), "rb") as fh:
            data = fh.read(CA_FILE_LIMIT + 1)
    except OSError as exc:
        raise CaFileProblem(f"cannot read ca_file {path}: {exc.strerror}", fix) from None
    if len(data) > CA_FILE_LIMIT:
        raise CaFileProblem(f"ca_file {path} is larger than {CA_FILE_LIMIT >> 20} MiB, which "
                            "no CA certificate file is", fix)
    return ca_certificates(data, path)
