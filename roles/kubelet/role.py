"""kubelet: a joined node's kubelet runs with the inventory's feature_gates. kubeadm writes
the kubelet config at init and join; after that a gate change reaches a node the way kubeadm
documents reconfiguring kubelets: `kubeadm upgrade node phase kubelet-config` (the cluster's
kubelet-config ConfigMap, updated by the control_plane role) and a kubelet restart. The
playbook runs this role one node at a time."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpuk8s.facts import Fact
from gpuk8s.facts.kube import KUBELET_CONFIG, FeatureGates
from gpuk8s.ops import Op, change, noop, q
from gpuk8s.ops.kube import feature_gate_arg, feature_gates, gate_change
from gpuk8s.roles import HostContext

HEALTHZ = "http://127.0.0.1:10248/healthz"


def facts(vars: Mapping[str, Any]) -> list[Fact[Any]]:
    return [FeatureGates()]


def _has_gates(want: Mapping[str, bool], removed: set[str]) -> str:
    """A shell test: the kubelet config file has exactly these gate lines."""
    tests = [f"grep -qxF -- {q(f'  {name}: ' + ('true' if on else 'false'))} {KUBELET_CONFIG}"
             for name, on in want.items()]
    tests += [f"! grep -q -- {q(f'^  {name}:')} {KUBELET_CONFIG}" for name in sorted(removed)]
    return " && ".join(tests) or "true"


def plan(ctx: HostContext) -> list[Op]:
    op_id = "kubelet | feature gates"
    running = ctx.facts[FeatureGates()].kubelet
    want = feature_gates(ctx.var("feature_gates"))
    if running is None:
        return [noop(op_id, f"= no {KUBELET_CONFIG} yet: kubeadm writes it with the cluster's "
                     "gates when the node joins")]
    if running == want:
        return [noop(op_id, f"= the kubelet runs with the inventory's gates "
                     f"({feature_gate_arg(want) or 'none'})")]
    timeout = int(ctx.var("kubelet_restart_timeout"))
    script = f"""\
b=$(mktemp {KUBELET_CONFIG}.before-gates.XXXXXX); cp -p {KUBELET_CONFIG} "$b"
kubeadm upgrade node phase kubelet-config >/dev/null
if ! {{ {_has_gates(want, set(running) - set(want))}; }}; then
  cp -p "$b" {KUBELET_CONFIG}; rm -f "$b"
  echo "kube-system/kubelet-config (kubeadm's kubelet config for the cluster) does not" \\
    "hold the inventory's feature_gates ({feature_gate_arg(want) or 'none'}); the first" \\
    "control plane's 'control_plane | feature gates' step updates it: see its result" >&2
  exit 1
fi
systemctl restart kubelet
end=$(( $(date +%s) + {timeout} ))
until curl -sf --max-time 5 {HEALTHZ} >/dev/null 2>&1; do
  if [ "$(date +%s)" -ge "$end" ]; then
    cp -p "$b" {KUBELET_CONFIG}; rm -f "$b"; systemctl restart kubelet
    echo "the kubelet did not answer {HEALTHZ} within {timeout}s with the new feature" \\
      "gates; its previous config is back. See: journalctl -u kubelet -n 50" >&2
    exit 1
  fi
  sleep 1
done
rm -f "$b"
"""
    return [change(op_id, f"+ kubelet feature gates {gate_change(running, want)}; restart the "
                   "kubelet", script, timeout=timeout + 120)]
