# LAB STAND-IN: not the real client-go. Test infrastructure for gpuk8s; never shipped to users.
"""kubeconfig files: the real v1 Config layout with embedded base64 data or file references."""

from __future__ import annotations

import base64
import os
from dataclasses import dataclass
from typing import Any

from .common import P, yaml_dump, yaml_load_all


@dataclass
class Creds:
    server: str
    ca_pem: str | None = None
    cert_pem: str | None = None
    key_pem: str | None = None
    token: str | None = None
    insecure: bool = False
    path: str = ""


def build(server: str, ca_pem: str, user: str, *, cert_pem: str | None = None,
          key_pem: str | None = None, cert_file: str | None = None,
          key_file: str | None = None, token: str | None = None,
          cluster: str = "kubernetes") -> str:
    u: dict[str, Any] = {}
    if cert_file:
        u["client-certificate"] = cert_file
        u["client-key"] = key_file
    elif cert_pem:
        u["client-certificate-data"] = base64.b64encode(cert_pem.encode()).decode()
        u["client-key-data"] = base64.b64encode((key_pem or "").encode()).decode()
    if token:
        u["token"] = token
    ctx = f"{user}@{cluster}"
    cfg = {
        "apiVersion": "v1",
        "clusters": [{"cluster": {
            "certificate-authority-data": base64.b64encode(ca_pem.encode()).decode(),
            "server": server}, "name": cluster}],
        "contexts": [{"context": {"cluster": cluster, "user": user}, "name": ctx}],
        "current-context": ctx,
        "kind": "Config",
        "preferences": {},
        "users": [{"name": user, "user": u}],
    }
    return yaml_dump(cfg)


def _data(entry: dict[str, Any], key: str, base_dir: str) -> str | None:
    if entry.get(f"{key}-data"):
        return base64.b64decode(entry[f"{key}-data"]).decode()
    if entry.get(key):
        path = entry[key]
        path = P(path) if os.path.isabs(path) else os.path.join(base_dir, path)
        with open(path) as f:
            return f.read()
    return None


def parse(text: str, base_dir: str = "/", context: str | None = None) -> Creds:
    docs = yaml_load_all(text)
    cfg = docs[0] if docs else {}
    ctx_name = context or cfg.get("current-context")
    ctxs = {c["name"]: c.get("context", {}) for c in cfg.get("contexts") or []}
    if not ctx_name or ctx_name not in ctxs:
        raise ValueError("invalid configuration: no configuration has been provided, try setting "
                         "KUBERNETES_MASTER environment variable")
    ctx = ctxs[ctx_name]
    cluster = next(c["cluster"] for c in cfg.get("clusters") or [] if c["name"] == ctx["cluster"])
    user = next((u.get("user") or {} for u in cfg.get("users") or []
                 if u["name"] == ctx.get("user")), {})
    return Creds(
        server=cluster["server"],
        ca_pem=_data(cluster, "certificate-authority", base_dir),
        cert_pem=_data(user, "client-certificate", base_dir),
        key_pem=_data(user, "client-key", base_dir),
        token=user.get("token"),
        insecure=bool(cluster.get("insecure-skip-tls-verify")),
    )


def load(path: str, context: str | None = None) -> Creds:
    with open(path) as f:
        creds = parse(f.read(), os.path.dirname(path), context)
    creds.path = path
    return creds
