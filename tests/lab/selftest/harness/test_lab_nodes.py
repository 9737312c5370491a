"""The lab nodes themselves: real SSH, sudo, fake GPUs, identity, reboot, apt proxy, down."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.lab import net
from tests.lab.lab import Lab
from tests.lab.lock import others_in_use
from tests.lab.paths import (
    BRIDGE,
    BRIDGE_MAC,
    CGROUP_PREFIX,
    NETNS_PREFIX,
    REPO_ROOT,
    VETH_PREFIX,
    node_ip,
    own_veth_octet,
)

pytestmark = pytest.mark.lab

NODES = ["cp-01", "gpu-01", "gpu-02", "cpu-01"]
IPS = {name: node_ip(i) for i, name in enumerate(NODES, 1)}


def ok(lab: Lab, node: str, cmd: str, **kw: object) -> str:
    rc, out, err = lab.ssh(node, cmd, **kw)  # type: ignore[arg-type]
    assert rc == 0, f"{node}: {cmd!r} -> rc={rc}\nstdout:{out}\nstderr:{err}"
    return out


def test_default_topology(lab: Lab) -> None:
    nodes = {n.name: n for n in lab.nodes()}
    assert list(nodes) == NODES
    assert {n: nodes[n].ip for n in NODES} == IPS
    assert (nodes["gpu-01"].gpus, nodes["gpu-01"].gpu_model) == (2, "H100")
    assert (nodes["gpu-02"].gpus, nodes["gpu-02"].gpu_model) == (1, "H200")
    assert nodes["cp-01"].role == "control_plane" and nodes["cp-01"].gpus == 0


def test_root_ssh_by_key_with_known_host_keys(lab: Lab) -> None:
    for node in NODES:
        assert ok(lab, node, "id -u; hostname").split() == ["0", node]
    # host keys were recorded before boot, by IP, and strict checking passes
    known = lab.known_hosts.read_text().splitlines()
    assert sorted(line.split()[0] for line in known) == sorted(IPS.values())
    # no password logins over ssh
    argv = [a for a in lab.ssh_argv("cp-01") if a != "IdentitiesOnly=yes"]
    argv[1:1] = ["-o", "PreferredAuthentications=password,keyboard-interactive"]
    proc = subprocess.run([*argv, "true"], capture_output=True, text=True, timeout=30,
                          stdin=subprocess.DEVNULL, check=False)
    assert proc.returncode == 255, proc


def test_labadmin_sudo_needs_the_password(lab: Lab) -> None:
    pw = lab.labadmin_password
    assert lab.password_file.stat().st_mode & 0o077 == 0
    for node in ("cp-01", "gpu-01"):
        assert ok(lab, node, "id -nG", user="labadmin").split().count("sudo") == 1
        rc, _, err = lab.ssh(node, "sudo -n true", user="labadmin")
        assert rc != 0 and "password is required" in err
        rc, _, _ = lab.ssh(node, "sudo -S -k true", user="labadmin", input="wrong\n")
        assert rc != 0
        out = ok(lab, node, "sudo -S -k -p '' id -u", user="labadmin", input=pw + "\n")
        assert out.strip() == "0"


def test_fake_gpus_in_lspci(lab: Lab) -> None:
    gpu1 = ok(lab, "gpu-01", "lspci -nn").splitlines()
    h100 = [line for line in gpu1 if "[10de:2330]" in line]
    assert len(h100) == 2, gpu1
    assert all("3D controller [0302]: NVIDIA Corporation GH100 [H100 SXM5 80GB] [10de:2330]"
               in line for line in h100), h100
    gpu2 = ok(lab, "gpu-02", "lspci -nn").splitlines()
    h200 = [line for line in gpu2 if "NVIDIA" in line]
    assert len(h200) == 1 and "[10de:2335]" in h200[0] and "H200" in h200[0], gpu2
    for node in ("cp-01", "cpu-01"):
        out = ok(lab, node, "lspci -nn")
        assert "NVIDIA" not in out and "10de" not in out
        assert "Host bridge" in out  # lspci works and shows a non-NVIDIA device
    # the sysfs files gpuk8s' facts may read directly
    out = ok(lab, "gpu-01", "cd /sys/bus/pci/devices/0000:18:00.0 && cat vendor device class "
                            "numa_node && stat -c %s config")
    assert out.split() == ["0x10de", "0x2330", "0x030200", "0", "64"]


def test_nodes_have_their_own_identity(lab: Lab) -> None:
    seen: dict[str, set[str]] = {"uuid": set(), "mid": set()}
    for node in NODES:
        out = ok(lab, node, "hostname; ip -4 -o addr show dev eth0 | awk '{print $4}'; "
                            "cat /sys/class/dmi/id/product_uuid /etc/machine-id; "
                            "ip route show default").splitlines()
        assert out[0] == node
        assert out[1] == f"{IPS[node]}/24"
        assert len(out[2]) == 36 and len(out[3]) == 32
        assert out[4].startswith("default via 10.88.0.1 ")
        seen["uuid"].add(out[2])
        seen["mid"].add(out[3])
        hosts = ok(lab, node, "cat /etc/hosts")
        assert all(f"{ip}\t{name}" in hosts for name, ip in IPS.items())
    assert len(seen["uuid"]) == len(NODES) and len(seen["mid"]) == len(NODES)


def test_node_can_set_net_sysctls_and_is_systemd(lab: Lab) -> None:
    out = ok(lab, "cp-01", "sysctl -w net.ipv4.ip_forward=1 && sysctl -n net.ipv4.ip_forward "
                           "&& sysctl -w net.ipv4.ip_forward=0 >/dev/null; "
                           "systemctl is-system-running --wait; ps -p 1 -o comm=")
    assert out.split()[-3:] == ["1", "running", "systemd"], out
    assert Path("/proc/sys/net/ipv4/ip_forward").read_text().strip() == "0"  # host untouched


def test_reboot_gives_a_new_boot_id_and_sshd_comes_back(lab: Lab) -> None:
    node = "cpu-01"
    ok(lab, node, "touch /run/lab-reboot-marker /var/tmp/lab-reboot-marker")
    old = lab.boot_id(node)
    new = lab.reboot(node, timeout=120)
    assert new and new != old
    assert lab.boot_id(node) == new
    out = ok(lab, node, "ls /run/lab-reboot-marker /var/tmp/lab-reboot-marker 2>&1; true")
    assert "No such file" in out and "/var/tmp/lab-reboot-marker" in out  # /run is fresh
    st = {s.name: s for s in lab.status()}
    assert st[node].state == "up" and st[node].boot_id == new and st[node].boots >= 2


def test_apt_goes_through_the_proxy_and_nothing_else_gets_out(lab: Lab) -> None:
    out = ok(lab, "cp-01", "apt-config dump | grep -i 'Acquire::http::Proxy'")
    assert '"http://10.88.0.1:3142"' in out and '10.88.0.1 "DIRECT"' in out
    ok(lab, "cp-01", "apt-get update -q", timeout=300)
    ok(lab, "cp-01", "apt-get install -q -y --no-install-recommends --download-only hello",
       timeout=300)
    rc, _, _ = lab.ssh("cp-01", "curl -sS --noproxy '*' -m 3 -o /dev/null http://1.1.1.1/")
    assert rc != 0


def test_the_host_keeps_its_mac_when_ports_come_and_go(lab: Lab) -> None:
    """The bridge has a MAC of its own: a port with a lower MAC (another instance's node
    coming up) or one leaving does not move 10.88.0.1 to another MAC under the nodes (their
    ARP entries would go stale and their traffic to the host stall)."""
    mac = Path(f"/sys/class/net/{BRIDGE}/address")
    assert mac.read_text().strip() == BRIDGE_MAC
    subprocess.run(["ip", "link", "add", "gk8stest0", "address", "02:00:00:00:00:01", "type",
                    "veth", "peer", "name", "gk8stest1"], check=True)
    try:
        subprocess.run(["ip", "link", "set", "gk8stest0", "master", BRIDGE, "up"], check=True)
        assert mac.read_text().strip() == BRIDGE_MAC
    finally:
        subprocess.run(["ip", "link", "del", "gk8stest0"], check=True)
    assert mac.read_text().strip() == BRIDGE_MAC


def test_inventory(lab: Lab) -> None:
    inv = yaml.safe_load(lab.inventory_path.read_text())["all"]
    v = inv["vars"]
    assert v["ansible_user"] == "root"
    assert v["ansible_ssh_private_key_file"] == str(lab.ssh_key)
    assert str(lab.known_hosts) in v["ansible_ssh_common_args"]
    assert v["kubernetes_repo_url"] == (
        "http://10.88.0.1:8081/pkgs.k8s.io/core:/stable:/v{{ kubernetes_version }}/deb/")
    assert v["docker_repo_key_url"] == "http://10.88.0.1:8081/download.docker.com/linux/debian/gpg"
    ch = inv["children"]
    assert ch["control_plane"]["hosts"] == {"cp-01": {"ansible_host": IPS["cp-01"]}}
    workers = ch["workers"]["hosts"]
    assert workers["gpu-01"] == {"ansible_host": IPS["gpu-01"], "gpu_required": True}
    assert workers["cpu-01"] == {"ansible_host": IPS["cpu-01"]}
    become = yaml.safe_load(lab.become_inventory_path.read_text())["all"]["vars"]
    assert become["ansible_user"] == "labadmin" and become["ansible_become"] is True
    assert lab.labadmin_password not in lab.become_inventory_path.read_text()


def test_status_fails_on_a_dead_node_and_up_recovers_from_a_crash(lab: Lab) -> None:
    import json
    import os
    import signal

    from tests.lab import node as labnode

    nd = labnode.node_dir("gpu-02")
    sup = int((nd / "supervisor.pid").read_text())
    nspawn = json.loads((nd / "supervisor.json").read_text())["nspawn_pid"]
    os.kill(sup, signal.SIGKILL)
    os.kill(nspawn, signal.SIGKILL)  # leaves the container orphaned, as a crash would
    # kill() only queues the signal: wait until the kernel has really ended both processes
    deadline = time.monotonic() + 10
    while (net.pid_alive(sup) or net.pid_alive(nspawn)) and time.monotonic() < deadline:
        time.sleep(0.05)
    rows = {r.name: r.state for r in lab.status()}
    assert rows["gpu-02"] == "down" and rows["gpu-01"] == "up"
    proc = subprocess.run([sys.executable, "-m", "tests.lab", "status"], capture_output=True,
                          text=True, check=False, cwd=REPO_ROOT)
    assert proc.returncode == 1 and "gpu-02" in proc.stderr
    lab.up()
    assert {r.state for r in lab.status()} == {"up"}
    assert ok(lab, "gpu-02", "lspci -nn | grep -c 10de:2335").strip() == "1"


def _leftovers(lab: Lab) -> list[str]:
    left = []
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    left += [f"netns {line}" for line in netns.splitlines() if line.startswith(NETNS_PREFIX)]
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    # the other lab instance, when in use, keeps the bridge and its own veths
    shared = others_in_use()
    for line in links.splitlines():
        name = line.split(":")[1].strip().split("@")[0]
        if (name == BRIDGE and not shared) or (
                name.startswith(VETH_PREFIX) and name[len(VETH_PREFIX):].isdigit()
                and own_veth_octet(int(name[len(VETH_PREFIX):]), shared)):
            left.append(f"link {name}")
    mounts = Path("/proc/mounts").read_text()
    left += [f"mount {line}" for line in mounts.splitlines()
             if f"{lab.state}/" in line or f"{lab.state} " in line]
    left += [f"cgroup {d}" for d in Path("/sys/fs/cgroup").glob(f"*/{CGROUP_PREFIX}*")]
    return left


def test_down_twice_is_clean_then_up_again(lab: Lab) -> None:
    """Last: takes the lab down (twice) and boots it again for whatever runs next."""
    lab.down()
    assert _leftovers(lab) == []
    lab.down()
    assert _leftovers(lab) == []
    assert not lab.inventory_path.exists()
    lab.up()
    assert ok(lab, "gpu-02", "hostname").strip() == "gpu-02"
