"""Op builders: each with a "needs change" and an "already satisfied" case."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from gpuk8s.facts.kube import ClusterState, NodeStatus
from gpuk8s.facts.system import FileState, PackageState
from gpuk8s.ops import files
from gpuk8s.ops.apt import packages, repo, source_line
from gpuk8s.ops.kube import apply, labels, stamp

DATA = b"overlay\nbr_netfilter\n"
SHA = hashlib.sha256(DATA).hexdigest()


def test_file_content_create_update_and_satisfied() -> None:
    missing = files.content(FileState("/etc/x", False), "r | x", DATA)
    assert missing.changes and missing.reason == "+ create /etc/x"
    assert missing.diff and "+br_netfilter" in missing.diff
    same = files.content(FileState("/etc/x", True, "644", "root", SHA), "r | x", DATA)
    assert not same.changes and same.reason.startswith("=")
    other = files.content(FileState("/etc/x", True, "644", "root", "0" * 64, b"old\n"),
                          "r | x", DATA)
    assert other.changes and "-old" in (other.diff or "")
    perms = files.content(FileState("/etc/x", True, "664", "root", SHA), "r | x", DATA,
                          mode="0644")
    assert perms.changes and perms.commands == ("chown root: /etc/x && chmod 0644 /etc/x",)


def test_secret_file_has_no_diff() -> None:
    op = files.content(FileState("/etc/k", False), "r | k", b"token: abc\n", mode="0600",
                       secret=True)
    assert op.changes and op.diff is None and op.secret


def test_file_absent() -> None:
    assert files.absent(FileState("/etc/x", True, "644", "root", SHA), "r | x").changes
    assert not files.absent(FileState("/etc/x", False), "r | x").changes


def test_packages_install_pin_and_hold() -> None:
    op = packages({}, "k | p", {"kubeadm": "1.36.", "kubelet": "1.36."}, hold=True)
    text = "\n".join(op.commands)
    assert op.changes and "v0=$(r kubeadm 1.36.)" in text and "apt-cache madison" in text
    assert "apt-mark hold kubeadm kubelet" in text
    held = {"kubeadm": PackageState("1.36.2-1.1", True, "hi"),
            "kubelet": PackageState("1.36.2-1.1", True, "hi")}
    assert not packages(held, "k | p", {"kubeadm": "1.36.", "kubelet": "1.36."},
                        hold=True).changes


def test_packages_hold_only_and_version_mismatch() -> None:
    unheld = {"kubeadm": PackageState("1.36.2-1.1", False, "ii")}
    op = packages(unheld, "k | p", {"kubeadm": "1.36."}, hold=True)
    assert op.commands == ("apt-mark hold kubeadm >/dev/null",)
    old = {"kubeadm": PackageState("1.35.4-1.1", True, "hi")}
    op = packages(old, "k | p", {"kubeadm": "1.36."}, hold=True)
    assert "--allow-change-held-packages" in " ".join(op.commands)


def test_packages_exact_version_with_pinned_dependencies() -> None:
    op = packages({}, "d | p", {"nvidia-open-580": "580.159.04"}, pin_deps=True)
    script = op.commands[-1]
    assert "v0=$(r nvidia-open-580 580.159.04)" in script
    assert 'nvidia-open-580="$v0" $(d nvidia-open-580 "$v0")' in script
    assert "--allow-downgrades" in script
    done = packages({"nvidia-open-580": PackageState("580.159.04-1", True, "hi")}, "d | p",
                    {"nvidia-open-580": "580.159.04"}, hold=True)
    assert not done.changes


def test_repo_writes_signed_by_line_and_is_idempotent() -> None:
    line = source_line("https://pkgs.k8s.io/core:/stable:/v1.36/deb/", "/", "",
                       "/etc/apt/keyrings/k.gpg")
    assert line == ("deb [signed-by=/etc/apt/keyrings/k.gpg] "
                    "https://pkgs.k8s.io/core:/stable:/v1.36/deb/ /\n")
    args = {"name": "kubernetes", "url": "https://pkgs.k8s.io/core:/stable:/v1.36/deb/",
            "suite": "/", "components": "", "key_url": "https://k/Release.key"}
    op = repo(FileState("/etc/apt/sources.list.d/k.list", False),
              FileState("/etc/apt/keyrings/k.gpg", False), "k | repo", **args)
    assert op.changes and "gpg --dearmor" in op.commands[0]
    text = ("# managed by gpuk8s; key from https://k/Release.key\n" + line).encode()
    done = repo(FileState("/etc/apt/sources.list.d/k.list", True, "644", "root",
                          hashlib.sha256(text).hexdigest()),
                FileState("/etc/apt/keyrings/k.gpg", True, "644", "root", "x"), "k | repo",
                **args)
    assert not done.changes


MANIFEST = """apiVersion: node.k8s.io/v1
kind: RuntimeClass
metadata:
  name: nvidia
handler: nvidia
"""


def test_manifest_apply_and_satisfied() -> None:
    text, keys, digest = stamp(MANIFEST, "runtimeclass-nvidia")
    assert keys == ["RuntimeClass//nvidia"]
    assert "app.kubernetes.io/managed-by: gpuk8s" in text and digest in text
    op = apply(ClusterState(True), "g | rc", "runtimeclass-nvidia", MANIFEST)
    assert op.changes and "apply --server-side" in op.commands[0]
    done = apply(ClusterState(True, managed={"RuntimeClass//nvidia": digest}), "g | rc",
                 "runtimeclass-nvidia", MANIFEST)
    assert not done.changes
    stale = apply(ClusterState(True, managed={"RuntimeClass//nvidia": "old"}), "g | rc",
                  "runtimeclass-nvidia", MANIFEST)
    assert stale.changes and stale.reason.startswith("+ update")


def test_manifest_with_untracked_kind_is_refused() -> None:
    with pytest.raises(ValueError, match="not tracked"):
        stamp("apiVersion: v1\nkind: Secret\nmetadata: {name: x}\n", "secret")


def test_node_labels() -> None:
    node = NodeStatus("gpu-01", True, False, "v1.36.2", "containerd://2.1.9", 2,
                      {"nvidia.com/gpu.present": "true"})
    cluster = ClusterState(True, nodes={"gpu-01": node})
    assert not labels(cluster, "g | l", "gpu-01", {"nvidia.com/gpu.present": "true"}).changes
    op = labels(cluster, "g | l", "gpu-01", {"nvidia.com/gpu.count": "2"})
    assert op.commands[0].endswith("label node gpu-01 nvidia.com/gpu.count=2 --overwrite")


def test_purge_script_unholds_then_purges_with_the_hosts_lock_wait() -> None:
    from gpuk8s.ops.apt import Apt, purge_script

    script = purge_script(["kubeadm", "nvidia-open-580"], Apt(lock_timeout=42))
    assert script.startswith("apt-mark unhold kubeadm nvidia-open-580 >/dev/null 2>&1; ")
    assert "-o DPkg::Lock::Timeout=42" in script
    assert script.endswith("purge --autoremove kubeadm nvidia-open-580")


def test_apt_update_waits_for_the_lists_lock_and_fails_on_anything_else(tmp_path: Path) -> None:
    """An apt-get update left running by an interrupted run holds the lists' lock, which
    DPkg::Lock::Timeout does not cover: gpuk8s waits for it; any other failure fails at once."""
    import subprocess

    from gpuk8s.ops.apt import Apt

    count = tmp_path / "count"
    fake = tmp_path / "apt-get"
    fake.write_text(f"""#!/bin/sh
n=$(cat {count} 2>/dev/null || echo 0); n=$((n + 1)); echo $n > {count}
case "$MODE" in
  lock) [ $n -ge 3 ] && exit 0
        echo "E: Could not get lock /var/lib/apt/lists/lock. It is held by process 656"; exit 100;;
  broken) echo "E: The repository is not signed."; exit 100;;
  hang) [ $n -ge 2 ] && exit 0
        sleep 30;;
esac
""")
    fake.chmod(0o755)
    script = Apt(30).update().replace(" apt-get ", f" {fake} ")
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin", "MODE": "lock"}
    fast = script.replace("sleep 2", "sleep 0")
    assert subprocess.run(["sh", "-c", fast], env=env).returncode == 0
    assert count.read_text().strip() == "3"
    count.unlink()
    proc = subprocess.run(["sh", "-c", fast], env={**env, "MODE": "broken"},
                          capture_output=True, text=True)
    assert proc.returncode != 0 and "not signed" in proc.stderr
    assert count.read_text().strip() == "1"
    count.unlink()
    proc = subprocess.run(["sh", "-c", Apt(0).update().replace(" apt-get ", f" {fake} ")],
                          env=env, capture_output=True, text=True)
    assert proc.returncode != 0 and "lists/lock" in proc.stderr  # the wait has an end
    count.unlink()
    # a stalled update is killed after update_timeout and tried once more
    hang = Apt(30, update_timeout=1).update().replace(" apt-get ", f" {fake} ")
    proc = subprocess.run(["sh", "-c", hang], env={**env, "MODE": "hang"},
                          capture_output=True, text=True, timeout=25)
    assert proc.returncode == 0 and count.read_text().strip() == "2"
    assert "did not finish in 1s; trying once more" in proc.stderr


def test_pod_diagnosis_names_the_latest_warning_event_of_a_pod_that_never_started(
        tmp_path: Path) -> None:
    """A device plugin pod stuck in ContainerCreating has no log to show: the rollout wait's
    diagnosis prints its latest Warning events (FailedMount, with the kubelet's text), asked
    for by the pod's name, before the (empty) log."""
    import subprocess

    from gpuk8s.ops.kube import pod_diagnosis
    mount = ('FailedMount: MountVolume.SetUp failed for volume "device-plugin" : hostPath '
             "type check failed: /var/lib/kubelet/device-plugins is not a directory")
    fake = tmp_path / "kubectl"
    fake.write_text(f"""#!/bin/sh
echo "$*" >> {tmp_path}/calls
case "$*" in
  *"get pods"*"-o name"*) echo pod/nvidia-device-plugin-ds-x7k2p ;;
  *"get pods"*"-o wide"*) echo "nvidia-device-plugin-ds-x7k2p 0/1 ContainerCreating 0 3m" ;;
  *"get events"*"involvedObject.name=nvidia-device-plugin-ds-x7k2p,type=Warning"*)
    echo 'FailedScheduling: old'; echo '{mount}' ;;
  *logs*) echo 'Error from server (BadRequest): container is waiting to start' ;;
esac
""")
    fake.chmod(0o755)
    script = pod_diagnosis("kube-system", "name=nvidia-device-plugin-ds", "gpu-01",
                           "nvidia-device-plugin-ctr", kubectl=str(fake))
    err = subprocess.run(["sh", "-c", script], capture_output=True, text=True,
                         check=True).stderr
    assert err.splitlines() == [
        "nvidia-device-plugin-ds-x7k2p 0/1 ContainerCreating 0 3m",
        "--- pod/nvidia-device-plugin-ds-x7k2p: latest warning events",
        "FailedScheduling: old", mount,
        "--- pod/nvidia-device-plugin-ds-x7k2p: last log lines",
        "Error from server (BadRequest): container is waiting to start"]
    assert "--sort-by=.lastTimestamp" in (tmp_path / "calls").read_text()
