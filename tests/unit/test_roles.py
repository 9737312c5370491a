"""Golden plans: each role's ops on fresh Ubuntu 22.04, 24.04 and Debian 12 nodes, GPU and CPU.

Regenerate after an intended change with GPUK8S_UPDATE_GOLDEN=1 and review the diff.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest

from gpuk8s.playbook import PHASES
from gpuk8s.roles import HostContext, load_role
from tests.unit.scenarios import OSES, default_vars, fresh_facts

GOLDEN = Path(__file__).parent / "golden"
_B64 = re.compile(r"<<'(GPUK8S_EOF\w*)'\n.*?\1", re.S)


def summarise(cmd: str) -> str:
    return _B64.sub("<<'GPUK8S_EOF' <content> GPUK8S_EOF", cmd)


def plan_all(os_key: str, gpus: int) -> dict[str, Any]:
    vars = default_vars(feature_gates={"DynamicResourceAllocation": True})
    cluster: dict[str, Any] = {
        "endpoint": "10.0.0.10:6443", "advertise_address": "10.0.0.10", "node_name": "cp-01",
        "endpoint_mode": "direct", "control_planes": [{"host": "cp-01", "address": "10.0.0.10"}],
        "nodes": {"node": {"name": "node", "address": "10.0.0.11", "gpus": gpus,
                           "model": "NVIDIA H100 80GB HBM3"}}}
    facts = fresh_facts(os_key, gpus, "node", vars)
    out: dict[str, Any] = {}
    for phase in PHASES:
        for role_name in phase.roles:
            role = load_role(role_name)
            ctx = HostContext("node", role_name, vars, facts, cluster,
                              ("control_plane",) if phase.hosts != "workers" else ("workers",))
            ops = role.plan(ctx)
            out[role_name] = [{"id": op.id, "change": op.symbol, "reason": op.reason,
                               "notify": list(op.notify),
                               "commands": [summarise(c) for c in op.commands]
                               if not op.secret else ["<secret>"],
                               **({"diff": op.diff} if op.diff else {})} for op in ops]
    return out


@pytest.mark.parametrize("gpus", [0, 2], ids=["cpu", "gpu"])
@pytest.mark.parametrize("os_key", sorted(OSES))
def test_golden_fresh_plan(os_key: str, gpus: int) -> None:
    got = plan_all(os_key, gpus)
    path = GOLDEN / f"fresh-{os_key}-{'gpu' if gpus else 'cpu'}.json"
    text = json.dumps(got, indent=1, sort_keys=False) + "\n"
    if os.environ.get("GPUK8S_UPDATE_GOLDEN") == "1" or not path.exists():
        path.write_text(text)
    assert json.loads(path.read_text()) == got, f"plan changed: see {path}"


def test_gpu_plan_differs_by_os() -> None:
    ubuntu = plan_all("ubuntu2404", 2)["nvidia_driver"]
    debian = plan_all("debian12", 2)["nvidia_driver"]
    ubuntu_cmds = " ".join(c for op in ubuntu for c in op["commands"])
    debian_cmds = " ".join(c for op in debian for c in op["commands"])
    assert "nvidia-driver-580-server-open" in ubuntu_cmds and "CUDA apt repo" not in \
        " ".join(op["id"] for op in ubuntu)
    assert "nvidia-open-580" in debian_cmds
    assert "compute/cuda/repos/debian12/x86_64/" in debian_cmds
    assert any("reboot" in op["notify"] for op in debian)


def test_cpu_nodes_get_no_gpu_roles() -> None:
    plan = plan_all("debian12", 0)
    assert plan["nvidia_driver"] == [] and plan["cuda"] == [] and \
        plan["nvidia_container_toolkit"] == []


def test_kubeadm_config_carries_feature_gates_and_cidrs() -> None:
    plan = plan_all("ubuntu2204", 0)
    diff = next(op["diff"] for op in plan["control_plane"]
                if op["id"] == "control_plane | kubeadm config")
    assert "kind: InitConfiguration" in diff and "apiVersion: kubeadm.k8s.io/v1beta4" in diff
    assert "value: \"DynamicResourceAllocation=true\"" in diff
    assert '  "DynamicResourceAllocation": true' in diff
    assert 'podSubnet: "10.244.0.0/16"' in diff and "cgroupDriver: systemd" in diff


def test_swap_turned_off_on_ubuntu_2404() -> None:
    base = plan_all("ubuntu2404", 0)["base"]
    swap = next(op for op in base if op["id"] == "base | swap off")
    assert swap["change"] == "+" and any("swapoff -a" in c for c in swap["commands"])


def _driver_plan(loaded: str, **vars: Any) -> list[Any]:
    from gpuk8s.facts import HostFacts
    from gpuk8s.facts.nvidia import Gpu, Nvidia, NvidiaState

    v = default_vars(**vars)
    facts = fresh_facts("ubuntu2404", 2, "gpu", v)
    values = dict(facts.items())
    gpus = tuple(Gpu(i, "NVIDIA H200", f"GPU-{i}", loaded, 143771, f"00000000:0{i}:00.0",
                     "9.0") for i in range(2))
    values[Nvidia()] = NvidiaState(True, gpus, module="open", module_version=loaded)
    ctx = HostContext("gpu", "nvidia_driver", v, HostFacts("gpu", values), {}, ("workers",))
    return load_role("nvidia_driver").plan(ctx)


def test_preinstalled_driver_of_the_wanted_branch_is_left_alone() -> None:
    ops = _driver_plan("580.159.04")
    assert not any(op.changes for op in ops)
    assert "not installed with apt" in ops[0].reason


def test_preinstalled_driver_of_another_branch_plans_an_upgrade() -> None:
    ops = _driver_plan("570.172.08")
    pkg = next(op for op in ops if op.id == "nvidia_driver | driver packages")
    assert pkg.changes and "nvidia-driver-580-server-open" in pkg.reason
    assert "replaces the loaded driver 570.172.08" in pkg.reason
    assert "reboot" in pkg.notify
    pinned = _driver_plan("580.159.04", nvidia_driver_version="580.105.08-1")
    assert any(op.changes for op in pinned)


def test_docker_runtime_adds_docker_ce_and_keeps_cri_on() -> None:
    from gpuk8s.facts import HostFacts

    v = default_vars(container_runtime="docker")
    facts = fresh_facts("ubuntu2404", 0, "node", v)
    ctx = HostContext("node", "container_runtime", v, HostFacts("node", dict(facts.items())),
                      {}, ("workers",))
    ops = load_role("container_runtime").plan(ctx)
    pkgs = next(op for op in ops if op.id == "container_runtime | packages")
    assert "docker-ce" in pkgs.reason and "containerd.io" in pkgs.reason
    config = next(op for op in ops if op.id == "container_runtime | config.toml")
    assert config.diff and "disabled_plugins" not in config.diff
    assert "SystemdCgroup = true" in config.diff
    service = next(op for op in ops if op.id == "container_runtime | service")
    assert "containerd docker" in service.reason


def _cni_plan(cni: str, managed: dict[str, str]) -> list[Any]:
    from gpuk8s.facts import HostFacts
    from gpuk8s.facts.kube import Cluster, ClusterState

    v = default_vars(cni=cni)
    facts = fresh_facts("ubuntu2404", 0, "cp", v)
    values = dict(facts.items())
    values[Cluster()] = ClusterState(True, "", {}, managed)
    ctx = HostContext("cp", "cni", v, HostFacts("cp", values), {}, ("control_plane",))
    return load_role("cni").plan(ctx)


def test_calico_is_applied_and_then_a_noop() -> None:
    from gpuk8s.ops.kube import stamp

    [op] = _cni_plan("calico", {})
    assert op.id == "cni | calico" and op.changes
    assert "apply --server-side" in op.commands[0]
    text = render_cni("calico")
    _, keys, digest = stamp(text, "calico")
    assert "CustomResourceDefinition//ippools.crd.projectcalico.org" in keys
    assert "Deployment/kube-system/calico-kube-controllers" in keys
    [again] = _cni_plan("calico", dict.fromkeys(keys, digest))
    assert not again.changes


def render_cni(cni: str) -> str:
    from gpuk8s.roles import render

    return render("cni", f"cni/{cni}.yaml.j2", default_vars(cni=cni))


def test_switching_the_pod_network_of_a_running_cluster_is_refused() -> None:
    from gpuk8s.errors import PlanError

    with pytest.raises(PlanError, match=r"the cluster runs flannel, the inventory asks for "
                       r"calico.*invoke reset, then invoke bootstrap"):
        _cni_plan("calico", {"DaemonSet/kube-flannel/kube-flannel-ds": "abc"})


def _join_plan(existing: set[str]) -> list[Any]:
    from gpuk8s.facts import HostFacts
    from gpuk8s.facts.system import Files, FileState

    v = default_vars()
    facts = fresh_facts("ubuntu2404", 0, "w1", v)
    values = dict(facts.items())
    join_files = next(f for f in values if isinstance(f, Files) and
                      "/etc/kubernetes/kubelet.conf" in f.args)
    values[join_files] = {p: FileState(p, p in existing) for p in join_files.args}
    cluster = {"endpoint": "10.0.0.10:6443", "control_planes": [],
               "nodes": {"w1": {"name": "w1", "address": "10.0.0.12"}},
               "join": {"endpoint": "10.0.0.10:6443", "token": "abcdef.0123456789abcdef",
                        "ca_hash": "sha256:" + "0" * 64}}
    ctx = HostContext("w1", "join", v, HostFacts("w1", values), cluster, ("workers",))
    return load_role("join").plan(ctx)


def test_join_resets_what_an_interrupted_join_left_behind() -> None:
    [clean] = _join_plan(set())
    assert not any("kubeadm reset" in c for c in clean.commands)
    [again] = _join_plan({"/etc/kubernetes/bootstrap-kubelet.conf",
                          "/etc/kubernetes/pki/ca.crt"})
    assert again.commands[0].startswith("kubeadm reset -f")
    assert "interrupted join left /etc/kubernetes/bootstrap-kubelet.conf" in again.reason
    assert "kubeadm join --config" in again.commands[-1]
    [joined] = _join_plan({"/etc/kubernetes/kubelet.conf", "/etc/kubernetes/pki/ca.crt"})
    assert not joined.changes


@pytest.mark.parametrize(("kubectl", "etcd_files", "rc", "said", "reset"), [
    ("echo configmap/kubeadm-config", 0, 0, "kubeadm init had finished; recording it", False),
    ('echo \'Error from server (NotFound): configmaps "kubeadm-config" not found\' >&2; exit 1',
     3, 0, "kubeadm init did not finish", True),
    ("echo 'The connection to the server 10.0.0.10:6443 was refused' >&2; exit 1", 0, 0,
     "kubeadm init did not finish", True),
    ("echo 'The connection to the server 10.0.0.10:6443 was refused' >&2; exit 1", 2, 1,
     "will not reset a control plane that may be live", False),
])
def test_recovering_an_interrupted_init(tmp_path: Path, kubectl: str, etcd_files: int, rc: int,
                                        said: str, reset: bool) -> None:
    import subprocess

    from roles.control_plane.role import ETCD_DATA, MARKER, RECOVER

    bin_, etcd, calls = tmp_path / "bin", tmp_path / "etcd", tmp_path / "calls"
    bin_.mkdir()
    etcd.mkdir()
    for i in range(etcd_files):
        (etcd / f"member-{i}").write_text("x")
    for tool, body in {"kubectl": kubectl, "kubeadm": f'echo "kubeadm $*" >> {calls}'}.items():
        (bin_ / tool).write_text(f"#!/bin/sh\n{body}\n")
        (bin_ / tool).chmod(0o755)
    marker = tmp_path / "init-complete"
    script = RECOVER.replace(ETCD_DATA, str(etcd)).replace(MARKER, str(marker))
    proc = subprocess.run(["sh", "-c", script], capture_output=True, text=True, check=False,
                          env={"PATH": f"{bin_}:/usr/bin:/bin"})
    assert proc.returncode == rc, proc.stdout + proc.stderr
    assert said in proc.stdout
    made = calls.read_text() if calls.exists() else ""
    assert ("kubeadm reset -f" in made) is reset
    assert ("kubeadm init --config" in made) is reset
    assert marker.exists() is (rc == 0)


def _base_plan(dpkg: dict[str, Any]) -> list[Any]:
    from gpuk8s.facts import HostFacts
    from gpuk8s.facts.system import DpkgHealth

    v = default_vars()
    values = dict(fresh_facts("ubuntu2404", 0, "node", v).items())
    values[DpkgHealth()] = dpkg
    ctx = HostContext("node", "base", v, HostFacts("node", values), {}, ("workers",))
    return load_role("base").plan(ctx)


def test_a_package_left_half_installed_is_reinstalled_not_only_configured() -> None:
    """dpkg killed inside an unpack leaves the package half-installed (iHR): `dpkg --configure
    -a` stops at it ("very bad inconsistent state", exit 1) and apt refuses every install
    until it is reinstalled. The fact lists such packages from dpkg-query; a hostile name is
    dropped, never put in a command."""
    from gpuk8s.facts.system import DpkgHealth

    out = ("audit=The following packages are in a mess due to serious problems during \n"
           "journal=1\nreinstall=cuda-toolkit-13-0\nreinstall=libfoo1:amd64\n"
           "reinstall=x;reboot\n")
    dpkg = DpkgHealth().parse(out, 0)
    assert dpkg == {"interrupted": True, "reinstall": ["cuda-toolkit-13-0", "libfoo1:amd64"],
                    "lock_holders": []}
    repair = _base_plan(dpkg)[0]
    assert repair.id == "base | repair interrupted dpkg"
    assert "reinstall cuda-toolkit-13-0, libfoo1:amd64 (left half-installed" in repair.reason
    first, reinstall, last = repair.commands
    assert first.startswith("dpkg --configure -a || echo ")  # stops at the package: go on
    assert "install --reinstall cuda-toolkit-13-0 libfoo1:amd64 ||" in reinstall
    assert "dpkg --remove --force-remove-reinstreq" in reinstall  # the hint if apt cannot
    assert last == "dpkg --configure -a"  # and this one must succeed
    # only an interrupted journal: configure, nothing to reinstall
    plain = _base_plan(DpkgHealth().parse("audit=\njournal=2\n", 0))[0]
    assert plain.commands == ("dpkg --configure -a",)
    assert _base_plan(DpkgHealth().parse("audit=\njournal=0\n", 0))[0].id != repair.id
