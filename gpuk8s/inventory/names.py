"""Names of variables an inventory may carry that gpuk8s does not define: a near-miss of one of
its own (a typo, refused with "did you mean"), another tool's name for one of its settings
(refused with the exact rename), or another playbook's variable (ignored with a warning)."""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable
from typing import Any

from gpuk8s.inventory.text import _text_value
from gpuk8s.sinks import APT_CONF_HOST
from gpuk8s.variables import VarProblem, VarSpec

#: other tools' settings that mean a gpuk8s variable: read as it (with a note), the value
#: translated; a value gpuk8s cannot honour is refused naming the setting as written
OTHER_TOOLS_NAMES = {
    "kube_version": ("kubespray", "kubernetes_version"),
    "kube_pods_subnet": ("kubespray", "pod_cidr"),
    "kube_service_addresses": ("kubespray", "service_cidr"),
    "kube_network_plugin": ("kubespray", "cni"),
    "container_manager": ("kubespray", "container_runtime"),
    "dns_domain": ("kubespray", "cluster_dns_domain"),
    "kube_feature_gates": ("kubespray", "feature_gates"),
    "kubelet_feature_gates": ("kubespray", "feature_gates"),
    "kube_apiserver_feature_gates": ("kubespray", "feature_gates"),
    # kubespray's proxies serve apt and the container engine; gpuk8s applies them to apt
    "http_proxy": ("kubespray", "apt_proxy"),
    "https_proxy": ("kubespray", "apt_https_proxy"),
    "no_proxy": ("kubespray", "apt_proxy_direct"),
    "additional_no_proxy": ("kubespray", "apt_proxy_direct"),
}
_CHOICES = {"cni": ("flannel", "calico"), "container_runtime": ("containerd", "docker")}


def translate(name: str, value: Any) -> tuple[str, Any] | VarProblem | None:
    """Another tool's setting as the gpuk8s variable it means: (variable, value); a
    VarProblem when gpuk8s cannot do what it asks; None when it is a Jinja expression gpuk8s
    does not evaluate (the caller notes that the gpuk8s default stays)."""
    ours = OTHER_TOOLS_NAMES[name][1]
    if isinstance(value, str) and "{{" in value:
        return None
    if ours == "kubernetes_version":
        m = re.fullmatch(r"v?(\d+)\.(\d+)(?:\.\d+)?", str(value).strip())
        if not m:
            return VarProblem(name, f"{name}: {value!r} is not a Kubernetes version",
                              'write it like v1.36.2, or set kubernetes_version: "1.36"')
        return ours, f"{m.group(1)}.{m.group(2)}"
    if ours in _CHOICES:
        text = str(value).strip()
        if text not in _CHOICES[ours]:
            return VarProblem(name, f"{name}: {text} is not something gpuk8s installs "
                              f"({' or '.join(_CHOICES[ours])})",
                              f"set {name} (or {ours}) to {' or '.join(_CHOICES[ours])}")
        return ours, text
    if ours == "apt_proxy_direct":
        return ours, direct_hosts(value)[0]
    if ours == "feature_gates":
        if isinstance(value, dict):
            return ours, value
        gates: dict[str, bool] = {}
        for item in value if isinstance(value, list) else str(value).split(","):
            gate, sep, flag = str(item).strip().partition("=")
            if not sep or flag.strip().lower() not in ("true", "false"):
                return VarProblem(name, f"{name}: {item!r} is not Name=true or Name=false",
                                  f'write {name}: ["Name=true"], or feature_gates: '
                                  "{Name: true}")
            gates[gate.strip()] = flag.strip().lower() == "true"
        return ours, gates
    return ours, value


def direct_hosts(value: Any) -> tuple[list[str], list[str]]:
    """no_proxy's entries apt can go to directly (whole host names and IPv4 addresses), and
    the others (domains like .svc, networks, wildcards, ports), which apt cannot match."""
    items = value if isinstance(value, list) else str(value).split(",")
    hosts: list[str] = []
    other: list[str] = []
    for item in (str(i).strip() for i in items):
        if item:
            (hosts if APT_CONF_HOST.fullmatch(item) else other).append(item)
    return list(dict.fromkeys(hosts)), other


def near_miss(name: str, known: Iterable[str]) -> str | None:
    """A known name ``name`` is a typo of, or None.

    Tight on purpose: a proposal must share the first three characters, differ in length by at
    most three and be at least 85% similar. A loose match proposes variables of another meaning
    (kubespray's container_manager is not containerd_sandbox_image, DeepOps' slurm_password is
    not ansible_become_password)."""
    best: tuple[float, str] | None = None
    for k in known:
        if k[:3] != name[:3] or abs(len(k) - len(name)) > 3:
            continue
        ratio = difflib.SequenceMatcher(None, name, k).ratio()
        if ratio >= 0.85 and (best is None or ratio > best[0]):
            best = (ratio, k)
    return best[1] if best else None


def unknown_variable(name: str, specs: Iterable[str]) -> VarProblem | None:
    """The problem for a variable that no defaults file defines and no other tool's name maps:
    a near-miss of a gpuk8s name (did you mean...). None: a variable gpuk8s does not use
    (another playbook's), which the inventory may carry."""
    best = near_miss(name, list(specs))
    if best:
        return VarProblem(name, f"unknown variable {name!r}; did you mean {best!r}?",
                          f"rename it to {best}")
    return None


class _OtherTools:
    """The builder's side of OTHER_TOOLS_NAMES (mixed into it): read another tool's setting as
    the gpuk8s variable, note it, and refuse a file that sets both names differently."""

    notes: list[str]
    specs: dict[str, VarSpec]
    mapped: dict[tuple[str, str], tuple[str, Any, int | None]]

    def problem(self, message: str, *, line: int | None, fix: str, path: str | None = None
                ) -> None:
        raise NotImplementedError

    def _other_tools(self, e: Any) -> bool:
        """False when the entry is done with (refused, or a Jinja value left alone); else the
        entry now names the gpuk8s variable (when it named another tool's)."""
        key = e.key
        if key in OTHER_TOOLS_NAMES and key not in self.specs:
            mapped = translate(key, e.value)
            tool, ours = OTHER_TOOLS_NAMES[key]
            if mapped is None:
                self.notes.append(f"{e.path}: {key} is a Jinja expression ({e.value}); gpuk8s "
                                  f"does not evaluate it and keeps {ours} as set elsewhere "
                                  "(or its default)")
                return False
            if isinstance(mapped, VarProblem):
                self.problem(mapped.message, line=e.line, path=e.path, fix=mapped.fix)
                return False
            self.notes.append(f"{key} ({tool}'s name) is read as {mapped[0]}: {mapped[1]}")
            if ours == "apt_proxy_direct":  # no_proxy and additional_no_proxy add up
                skipped = direct_hosts(e.value)[1]
                if skipped:
                    self.notes.append(f"{key}: {', '.join(skipped)} not applied to apt (apt "
                                      "matches whole host names and addresses only)")
                earlier = self.mapped.get((e.path, ours))
                if earlier is not None:
                    mapped = (ours, list(dict.fromkeys([*earlier[1], *mapped[1]])))
                self.mapped[(e.path, ours)] = (key, mapped[1], e.line)
            elif ours in ("apt_proxy", "apt_https_proxy"):
                self.notes.append(f"{key} is applied to apt only: containerd and the "
                                  "kubelet pull images directly (or through registry_mirrors)")
            earlier = self.mapped.setdefault((e.path, ours), (key, mapped[1], e.line))
            if earlier[1] != mapped[1]:
                self.problem(f"{key} and {earlier[0]} (line {earlier[2]}) both set {ours}, "
                             "differently", line=e.line, path=e.path,
                             fix=f"keep one of them (or set {ours} once)")
                return False
            e.key, e.value, e.text = ours, mapped[1], False
        elif key in self.specs and (e.path, key) in self.mapped:
            other = self.mapped[(e.path, key)]
            value = _text_value(e.value, self.specs[key]) if e.text and isinstance(
                e.value, str) else e.value
            if value != other[1]:
                self.problem(f"{key} and {other[0]} (line {other[2]}) disagree: {value!r} vs "
                             f"{other[1]!r}", line=e.line, path=e.path,
                             fix=f"keep one of them ({key} is gpuk8s's own)")
                return False
        return True
