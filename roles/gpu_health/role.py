"""gpu_health: with gpu_health_watch, a service on each GPU node that quarantines the node by
itself when the NVIDIA driver logs a fatal Xid (gpuk8s.facts.xid.FATAL_XIDS), with no gpuk8s
command running and no admin machine online.

Which credentials: the node's own kubelet.conf. The Node authorizer lets a kubelet patch its own
Node object, and NodeRestriction lets it change spec.unschedulable, its annotations and labels
outside kubernetes.io/k8s.io, but not its taints ("node %q is not allowed to modify taints":
plugin/pkg/admission/noderestriction/admission.go, admitNode). So the watch cordons (the node
lifecycle controller then taints the node node.kubernetes.io/unschedulable:NoSchedule itself),
labels gpuk8s.io/gpu-unhealthy=xid-N and annotates the reason; `invoke accept` adds gpuk8s's own
taint when it next runs. A credential that could taint (a ServiceAccount allowed to patch this
Node) could also remove taints, the very thing NodeRestriction keeps a node from doing to
attract work, so none is made."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpuk8s.checks import Rule
from gpuk8s.facts import Fact
from gpuk8s.facts.kube import (
    CORDONED_BY,
    CORDONED_BY_ACCEPT,
    GPU_UNHEALTHY,
    GPU_UNHEALTHY_REASON,
    GPU_UNHEALTHY_SINCE,
)
from gpuk8s.facts.system import Files, PciDevices, Services
from gpuk8s.facts.xid import FATAL_XIDS, XidEvents
from gpuk8s.ops import Op, change, files, noop
from gpuk8s.roles import HostContext
from gpuk8s.sinks import node_name

UNIT = "gpuk8s-gpu-health.service"
UNIT_PATH = f"/etc/systemd/system/{UNIT}"
SCRIPT = "/usr/local/lib/gpuk8s/gpu-health-watch"
ENV = "/etc/gpuk8s/gpu-health.env"
FILES = Files("+" + SCRIPT, "+" + ENV, "+" + UNIT_PATH)
#: seconds between two reads of the kernel log
EVERY = 5

RULES: dict[str, Rule] = {}


def facts(vars: Mapping[str, Any]) -> list[Fact[Any]]:
    # XidEvents is status's (gpuk8s.day2.status): listed so that every probe gathers it
    return [PciDevices(), FILES, Services(UNIT), XidEvents()]


def watch_script() -> bytes:
    """The service: every EVERY seconds, each fatal Xid line of the kernel log not acted on
    yet (this boot) quarantines the node. Kernel log text only ever reaches kubectl as one
    quoted argument."""
    fatal = " ".join(str(x) for x in sorted(FATAL_XIDS))
    return f"""#!/bin/sh
# gpuk8s gpu_health_watch: quarantine this node when the NVIDIA driver logs an Xid that needs a
# GPU reset or a reboot. Managed by gpuk8s (roles/gpu_health): edits are undone.
. {ENV}
fatal=" {fatal} "
k="kubectl --kubeconfig /etc/kubernetes/kubelet.conf"
state=/run/gpuk8s/gpu-health
mkdir -p "$state"; touch "$state/seen"
while :; do
  dmesg 2>/dev/null | grep -F 'NVRM: Xid' > "$state/xids" || true
  while IFS= read -r line; do
    code=$(printf '%s\\n' "$line" | sed -n 's/.*NVRM: Xid ([^)]*): \\([0-9][0-9]*\\),.*/\\1/p')
    case "$fatal" in *" $code "*) ;; *) continue;; esac
    grep -qxF -- "$line" "$state/seen" && continue
    why="Xid $code in the kernel log, which needs a GPU reset or a reboot: \
$(printf '%s' "$line" | cut -c1-300)"
    by=""
    [ "$($k get node "$NODE" -o jsonpath='{{.spec.unschedulable}}' 2>/dev/null)" = true ] \\
      || by="{CORDONED_BY}={CORDONED_BY_ACCEPT}"
    if $k cordon "$NODE" >/dev/null \\
        && $k label node "$NODE" "{GPU_UNHEALTHY}=xid-$code" --overwrite >/dev/null \\
        && $k annotate node "$NODE" "{GPU_UNHEALTHY_REASON}=$why" \\
             "{GPU_UNHEALTHY_SINCE}=$(date -u +%Y-%m-%dT%H:%M:%SZ)" $by \\
             --overwrite >/dev/null; then
      printf '%s\\n' "$line" >> "$state/seen"
      echo "quarantined $NODE: $why"
    fi
  done < "$state/xids"
  sleep {EVERY}
done
""".encode()


UNIT_TEXT = f"""[Unit]
Description=gpuk8s GPU health watch: quarantine this node on a fatal NVIDIA Xid
After=kubelet.service

[Service]
ExecStart={SCRIPT}
Restart=always
RestartSec=5

[Install]
WantedBy=multi-user.target
""".encode()


def plan(ctx: HostContext) -> list[Op]:
    if not any(d.is_gpu for d in ctx.facts[PciDevices()]):
        return []
    state = ctx.facts[FILES]
    unit = ctx.facts[Services(UNIT)][UNIT]
    if not ctx.var("gpu_health_watch"):
        ops = []
        if unit.active == "active" or unit.enabled == "enabled":
            ops.append(change("gpu_health | watch", f"- stop and disable {UNIT} "
                              "(gpu_health_watch is false)", f"systemctl disable --now -q {UNIT}"))
        ops += [files.absent(state[p], f"gpu_health | {p}") for p in (UNIT_PATH, SCRIPT, ENV)]
        if not any(op.changes for op in ops):
            return [noop("gpu_health | watch", "= off (gpu_health_watch is false)")]
        return [*ops, change("gpu_health | systemd", "+ systemctl daemon-reload",
                             "systemctl daemon-reload")]
    name = node_name(str(ctx.cluster["nodes"][ctx.host]["name"]))
    ops = [files.content(state[SCRIPT], "gpu_health | watch script", watch_script(),
                         mode="0755"),
           files.content(state[ENV], "gpu_health | node name", f"NODE={name}\n".encode()),
           files.content(state[UNIT_PATH], "gpu_health | unit", UNIT_TEXT)]
    if any(op.changes for op in ops) or unit.active != "active" or unit.enabled != "enabled":
        ops.append(change("gpu_health | watch", f"+ (re)start {UNIT}: a fatal Xid cordons "
                          "and labels this node", "systemctl daemon-reload",
                          f"systemctl enable -q {UNIT}", f"systemctl restart {UNIT}"))
    else:
        ops.append(noop("gpu_health | watch", f"= {UNIT} running"))
    return ops
