"""How gpuk8s reaches hosts, over real SSH to lab nodes: a bastion (ProxyJump), host-key
checking (unknown refused, trust-on-first-use opt-in, changed key always refused), and a
wrong sudo password."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import yaml

from gpuk8s import api
from gpuk8s.errors import PhaseFailed
from gpuk8s.report import Reporter
from tests.lab.lab import Lab

pytestmark = pytest.mark.lab


def write_inventory(lab: Lab, tmp: Path, hosts: dict[str, dict[str, object]],
                    **extra: object) -> Path:
    inv = {"all": {"vars": {"ansible_user": "root",
                            "ansible_ssh_private_key_file": str(lab.ssh_key),
                            **extra},
                   "children": {"control_plane": {"hosts": hosts}}}}
    path = tmp / "inventory.yaml"
    path.write_text(yaml.safe_dump(inv))
    return path


def facts(path: Path) -> dict[str, object]:
    return api.facts(path, reporter=Reporter(io.StringIO()))


def test_bastion_proxyjump(lab: Lab, tmp_path: Path) -> None:
    cp, gpu = lab.node("cp-01"), lab.node("gpu-01")
    path = write_inventory(lab, tmp_path, {"gpu-01": {"ansible_host": gpu.ip}},
                           ansible_ssh_common_args=f"-o ProxyJump=root@{cp.ip} "
                           f"-o UserKnownHostsFile={lab.known_hosts}")
    data = facts(path)
    assert data["gpu-01"]["System"].hostname == "gpu-01"
    # gpu-01's sshd saw the session come from the bastion, not from this machine
    rc, out, _ = lab.ssh("gpu-01", "journalctl -u ssh --no-pager -n 50 -o cat")
    assert rc == 0
    assert f"Accepted publickey for root from {cp.ip}" in out


def test_kubespray_bastion_group_is_the_jump_host(lab: Lab, tmp_path: Path) -> None:
    """kubespray's documented shape: a host and a group both named bastion. gpu-01 is reached
    through it (its sshd sees cp-01's address); the bastion itself is no member: its facts are
    never gathered."""
    cp, gpu = lab.node("cp-01"), lab.node("gpu-01")
    path = tmp_path / "inventory.ini"
    path.write_text(f"gpu-01 ansible_host={gpu.ip} ip={gpu.ip}\n\n"
                    "[kube_control_plane]\ngpu-01\n\n"
                    f"[bastion]\nbastion ansible_host={cp.ip}\n\n"
                    f"[all:vars]\nansible_user=root\nansible_ssh_private_key_file={lab.ssh_key}\n"
                    f"ansible_ssh_common_args='-o UserKnownHostsFile={lab.known_hosts}'\n")
    _, before, _ = lab.ssh("gpu-01", "journalctl -u ssh --no-pager -o cat | wc -l")
    data = facts(path)
    assert list(data) == ["gpu-01"] and data["gpu-01"]["System"].hostname == "gpu-01"
    rc, out, _ = lab.ssh("gpu-01", f"journalctl -u ssh --no-pager -o cat | tail -n +"
                         f"{int(before.strip()) + 1}")
    assert rc == 0
    assert f"Accepted publickey for root from {cp.ip}" in out


def test_unknown_host_key_is_refused(lab: Lab, tmp_path: Path) -> None:
    node = lab.node("cpu-01")
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    path = write_inventory(lab, tmp_path, {"cpu-01": {"ansible_host": node.ip}},
                           ansible_ssh_common_args=f"-o UserKnownHostsFile={empty}")
    with pytest.raises(PhaseFailed, match=r"host key of .* is unknown"):
        facts(path)
    assert empty.read_text() == ""


def test_trust_on_first_use_records_the_key(lab: Lab, tmp_path: Path) -> None:
    node = lab.node("cpu-01")
    known = tmp_path / "known_hosts"
    known.write_text("")
    path = write_inventory(lab, tmp_path, {"cpu-01": {"ansible_host": node.ip}},
                           ansible_ssh_common_args=f"-o UserKnownHostsFile={known} "
                           "-o StrictHostKeyChecking=accept-new")
    assert facts(path)["cpu-01"]["System"].hostname == "cpu-01"
    assert node.ip in known.read_text()
    # the recorded key is then enforced without the opt-in
    path = write_inventory(lab, tmp_path, {"cpu-01": {"ansible_host": node.ip}},
                           ansible_ssh_common_args=f"-o UserKnownHostsFile={known}")
    assert facts(path)["cpu-01"]["System"].hostname == "cpu-01"


def test_changed_host_key_is_always_refused(lab: Lab, tmp_path: Path) -> None:
    node, other = lab.node("cpu-01"), lab.node("cp-01")
    lines = [ln for ln in lab.known_hosts.read_text().splitlines()
             if ln.split()[0] == other.ip]
    assert lines, "lab known_hosts lacks cp-01"
    forged = tmp_path / "known_hosts"
    # cpu-01's address with cp-01's key: what a reinstalled or impersonated host looks like
    forged.write_text("".join(f"{node.ip} {' '.join(ln.split()[1:])}\n" for ln in lines))
    for policy in ("", "-o StrictHostKeyChecking=accept-new"):
        path = write_inventory(lab, tmp_path, {"cpu-01": {"ansible_host": node.ip}},
                               ansible_ssh_common_args=f"-o UserKnownHostsFile={forged} "
                               + policy)
        with pytest.raises(PhaseFailed, match="HOST KEY CHANGED"):
            facts(path)


def test_wrong_sudo_password_is_one_clear_error(lab: Lab, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    node = lab.node("cpu-01")
    monkeypatch.setenv("GPUK8S_BECOME_PASSWORD", "not-the-password")
    path = write_inventory(lab, tmp_path, {"cpu-01": {"ansible_host": node.ip}},
                           ansible_user="labadmin", ansible_become=True,
                           ansible_ssh_common_args=f"-o UserKnownHostsFile={lab.known_hosts}")
    with pytest.raises(PhaseFailed) as err:
        facts(path)
    text = str(err.value)
    assert "sudo rejected the become password" in text or "cannot become root" in text
    assert "not-the-password" not in text
