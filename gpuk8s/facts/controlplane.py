"""A control plane's own health, seen on the node itself: its stacked etcd member (etcd's
/health and member list, with the health-check client certificate kubeadm makes for exactly
this) and its API server (/readyz on the node's advertise address). Read-only; nothing is
printed when the node runs no control plane."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from gpuk8s.facts import Fact

ETCD_MANIFEST = "/etc/kubernetes/manifests/etcd.yaml"
APISERVER_MANIFEST = "/etc/kubernetes/manifests/kube-apiserver.yaml"
ETCD_PKI = "/etc/kubernetes/pki/etcd"
#: ``TCP_OPEN HOST PORT`` exits 0 when HOST:PORT accepts a TCP connection within 3 s
TCP_OPEN = "timeout 3 bash -c 'exec 3<>/dev/tcp/$0/$1'"
#: the node's CRI socket, as kubeadm's criSocket names it (roles/control_plane)
CRICTL = "crictl --runtime-endpoint unix:///var/run/containerd/containerd.sock"
#: sets $id to the running etcd container of kubeadm's static pod (found by the kubelet's labels)
ETCD_CONTAINER = (f"id=$({CRICTL} ps --state running --label io.kubernetes.container.name=etcd "
                  "--label io.kubernetes.pod.namespace=kube-system -q | head -n 1)")
#: etcdctl of that container ($id): the registry.k8s.io/etcd image carries etcdctl and etcdutl,
#: so nothing is installed on the node; kubeadm's health-check client certificate
ETCDCTL_IN = (f'{CRICTL} exec "$id" etcdctl --endpoints=https://127.0.0.1:2379 '
              f"--cacert={ETCD_PKI}/ca.crt --cert={ETCD_PKI}/healthcheck-client.crt "
              f"--key={ETCD_PKI}/healthcheck-client.key")
#: where the first control plane keeps its scheduled local snapshots (etcd_backup_schedule)
LOCAL_SNAPSHOTS = "/var/lib/gpuk8s/etcd-snapshots"
LOCAL_SNAPSHOT_RE = re.compile(r"etcd-(\d{8}T\d{6}Z)\.db")


@dataclass(frozen=True)
class ControlPlaneHealthState:
    #: this node runs a stacked etcd member (kubeadm's etcd.yaml exists)
    present: bool = False
    #: etcd's own word: True (healthy, has a leader), False (with reason), None (no answer)
    etcd_healthy: bool | None = None
    etcd_reason: str = ""
    #: member names as this member knows them (empty when it did not answer)
    members: tuple[str, ...] = ()
    api_ready: bool = False
    #: the API server's failing checks ("[-]etcd failed: ...") or why it did not answer
    api_problem: str = ""
    checks: dict[str, bool] = field(default_factory=dict)

    @property
    def words(self) -> str:
        """The member and its API server in a few words ("etcd ok, API ok")."""
        if not self.present:
            return ""
        etcd = ("ok" if self.etcd_healthy else
                f"unhealthy: {self.etcd_reason or 'no reason given'}"
                if self.etcd_healthy is False else "not answering")
        api = "ok" if self.api_ready else f"not ready: {self.api_problem}"
        return f"etcd {etcd}, API {api}"


class ControlPlaneHealth(Fact[ControlPlaneHealthState]):
    """etcd /health and member list on 127.0.0.1:2379, API server /readyz?verbose: one
    curl for the three (--next; a transfer that fails leaves its part empty and curl goes on
    to the next), so the etcd connection is made once."""

    def command(self) -> str:
        cert = (f"--cacert {ETCD_PKI}/ca.crt --cert {ETCD_PKI}/healthcheck-client.crt "
                f"--key {ETCD_PKI}/healthcheck-client.key")
        return f"""[ -f {ETCD_MANIFEST} ] && command -v curl >/dev/null 2>&1 || exit 0
a=$(grep -o -- '--advertise-address=[^" ]*' {APISERVER_MANIFEST} 2>/dev/null | head -n 1)
a=${{a#--advertise-address=}}; case "$a" in *:*) a="[$a]";; esac
set --; [ -z "$a" ] || set -- --next -sk --max-time 3 "https://$a:6443/readyz?verbose"
echo '## health'
curl -s --max-time 3 {cert} -w '\\n## members\\n' https://127.0.0.1:2379/health \\
  --next -s --max-time 3 {cert} -X POST -d '{{}}' -w '\\n## readyz\\n' \\
  https://127.0.0.1:2379/v3/cluster/member/list "$@"
[ -n "$a" ] || echo "no answer"
true"""

    def parse(self, output: str, exit_code: int) -> ControlPlaneHealthState:
        if "## health" not in output:
            return ControlPlaneHealthState()
        parts: dict[str, str] = {}
        for chunk in output.split("## ")[1:]:
            name, _, body = chunk.partition("\n")
            parts[name.strip()] = body.strip()
        healthy: bool | None = None
        reason = ""
        try:
            health = json.loads(parts.get("health", ""))
            healthy = str(health.get("health")).lower() == "true"
            reason = str(health.get("reason", ""))
        except (ValueError, AttributeError):
            pass
        members: tuple[str, ...] = ()
        try:
            listed = json.loads(parts.get("members", "")).get("members", [])
            members = tuple(sorted(str(m.get("name") or m.get("ID", "?")) for m in listed))
        except (ValueError, AttributeError):
            pass
        readyz = parts.get("readyz", "")
        checks = {line[3:].split(" ")[0]: line.startswith("[+]")
                  for line in readyz.splitlines() if line.startswith(("[+]", "[-]"))}
        ready = readyz.splitlines()[-1:] in (["readyz check passed"], ["ok"])
        failed = [line[3:] for line in readyz.splitlines() if line.startswith("[-]")]
        problem = "" if ready else ", ".join(failed) or (readyz.splitlines() or ["no answer"])[-1]
        return ControlPlaneHealthState(True, healthy, reason, members, ready, problem[:200],
                                       checks)


class Reaches(Fact[dict[str, str]]):
    """Whether this node resolves and reaches each ``host:port`` over TCP (3 s each):
    "host:port" -> "ok", "unresolved" (a name DNS and /etc/hosts do not know) or "no answer"."""

    def command(self) -> str:
        from gpuk8s.sinks import shell

        lines = []
        for target in self.args:
            host, _, port = target.rpartition(":")
            host = host.strip("[]")
            lines.append(
                f"h={shell(host)}; p={shell(port)}; "
                'if ! getent ahosts "$h" >/dev/null 2>&1; then echo "R unresolved"; '
                f'elif {TCP_OPEN} "$h" "$p" 2>/dev/null; '
                'then echo "R ok"; else echo "R no answer"; fi')
        return "\n".join(lines) or "true"

    def parse(self, output: str, exit_code: int) -> dict[str, str]:
        said = [line[2:] for line in output.splitlines() if line.startswith("R ")]
        return {t: (said[i] if i < len(said) else "no answer") for i, t in enumerate(self.args)}


class LocalSnapshots(Fact[tuple[str, ...]]):
    """The scheduled local etcd snapshots on this node (etcd-<UTC time>.db), oldest first."""

    def command(self) -> str:
        return f"ls -1 {LOCAL_SNAPSHOTS} 2>/dev/null || true"

    def parse(self, output: str, exit_code: int) -> tuple[str, ...]:
        return tuple(sorted(line.strip() for line in output.splitlines()
                            if LOCAL_SNAPSHOT_RE.fullmatch(line.strip())))
