"""invoke upgrade --kernel on a bootstrapped lab: the GPU nodes' kernel meta-packages wait
with a newer kernel (lab-updates: tests/lab/CONTRACT.md); a kernel the NVIDIA module does not
build against is refused before any reboot with the build log, the node's packages as before;
the roll moves both GPU nodes one at a time (a poller of the Node objects sees at most one
unschedulable), each back on the new kernel with its driver loaded and its GPUs offered; a
second run has nothing to do.

The lab's nodes run the host's kernel: they "boot" the newest /boot/vmlinuz-* (the
gpuk8s-lab-kernel-boot stand-in, with a uname stand-in), and the NVIDIA module stand-in loads
only where the DKMS stand-in built one for that kernel. The tests run in order and share one
cluster, starting from the "bootstrapped" snapshot."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest

from gpuk8s import api, day2
from gpuk8s.errors import Gpuk8sError
from tests.lab.lab import Lab
from tests.lab.paths import REPO_URL
from tests.lab.product.runs import call, derived_inventory, ssh_ok
from tests.lab.product.test_bootstrap import GATE_VARS
from tests.lab.product.test_day2 import restore_bootstrapped
from tests.lab.product.test_kernel_lock import APT, status_rows

pytestmark = pytest.mark.lab

KREL = os.uname().release
NEW = f"{KREL}-lab2"
BAD = f"{KREL}-lab3"
GPU_NODES = ("gpu-01", "gpu-02")
KUBECTL = "kubectl --kubeconfig /etc/kubernetes/admin.conf"
STATE = ("dpkg-query -W -f='${Package} ${Version} ${db:Status-Abbrev}\\n' | "
         "awk '$3 ~ /^[ih]i/' | sort; apt-mark showhold")


@pytest.fixture(scope="module")
def cluster(lab: Lab) -> Lab:
    return restore_bootstrapped(lab)


@pytest.fixture(scope="module")
def inv(cluster: Lab, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The GPU nodes with their distribution's kernel metas, locked by a bootstrap, and the
    newer kernel published."""
    inv = derived_inventory(cluster, tmp_path_factory.mktemp("kernel"), feature_gates=GATE_VARS)
    for node in GPU_NODES:
        ssh_ok(cluster, node, f"{APT} install linux-image-lab linux-headers-lab", timeout=300)
    result, out = call(api.bootstrap, inv, yes=True)
    assert result["changed"] > 0, out
    for node in GPU_NODES:
        assert "linux-image-lab" in ssh_ok(cluster, node, "apt-mark showhold").split()
        ssh_ok(cluster, node, (
            "echo 'deb [signed-by=/etc/apt/keyrings/gpuk8s-lab.gpg] "
            f"{REPO_URL}/lab-updates/ /' > /etc/apt/sources.list.d/lab-updates.list && "
            "apt-get -q update"), timeout=300)
    return inv


def boot_id(lab: Lab, node: str) -> str:
    return ssh_ok(lab, node, "cat /proc/sys/kernel/random/boot_id").strip()


def test_a_kernel_the_module_does_not_build_for_is_refused_before_any_reboot(
        cluster: Lab, inv: Path) -> None:
    before, boot = ssh_ok(cluster, "gpu-01", STATE), boot_id(cluster, "gpu-01")
    with pytest.raises(Gpuk8sError) as err:
        call(day2.upgrade, inv, kernel=BAD, limit="gpu-01", yes=True)
    text = str(err.value)
    print(text)
    assert f"kernel {BAD} refused before any reboot" in text, text
    # DKMS's hook failed the headers' postinst: apt's install failed, with dpkg's words
    assert f"linux-headers-{BAD}" in text and "Error 1" in text, text
    assert "driver 580.159.04" in text and "make.log" in text and "packages are back" in text
    assert ssh_ok(cluster, "gpu-01", STATE) == before, "the packages are not as before"
    assert boot_id(cluster, "gpu-01") == boot, "gpu-01 rebooted"
    node = json.loads(ssh_ok(cluster, "cp-01", f"{KUBECTL} get node gpu-01 -o json"))
    assert not node["spec"].get("unschedulable"), "gpu-01 left cordoned"


class Unschedulable(threading.Thread):
    """Polls the Node objects and records the largest set cordoned at one moment."""

    def __init__(self, lab: Lab) -> None:
        super().__init__(daemon=True)
        self.lab, self.stop, self.seen, self.polls = lab, threading.Event(), [], 0

    def run(self) -> None:
        while not self.stop.is_set():
            rc, out, _ = self.lab.ssh("cp-01", f"{KUBECTL} get nodes -o jsonpath="
                                      "'{range .items[*]}{.metadata.name}="
                                      "{.spec.unschedulable}{\"\\n\"}{end}'")
            if rc == 0:
                self.polls += 1
                self.seen.append(sorted(line.split("=")[0] for line in out.splitlines()
                                        if line.endswith("=true")))
            time.sleep(0.2)


def test_the_roll_moves_each_gpu_node_to_the_new_kernel_one_at_a_time(cluster: Lab,
                                                                     inv: Path) -> None:
    poller = Unschedulable(cluster)
    poller.start()
    try:
        result, out = call(day2.upgrade, inv, kernel=True, yes=True)
    finally:
        poller.stop.set()
        poller.join()
    assert result["upgraded"] == list(GPU_NODES), out
    most = max(len(s) for s in poller.seen)
    print(f"poller: {poller.polls} polls, at most {most} node(s) unschedulable at once; "
          f"cordoned sets seen: {sorted({tuple(s) for s in poller.seen})}")
    assert most == 1, poller.seen      # one at a time, and the poller saw the drains
    assert {tuple(s) for s in poller.seen if s} == {("gpu-01",), ("gpu-02",)}
    rows, text = status_rows(inv)
    for node in GPU_NODES:
        assert ssh_ok(cluster, node, "uname -r").strip() == NEW
        k = rows[node]["kernel"]
        assert k["running"] == NEW and not k["reboot_pending"], k
        assert k["loaded_module"] == "580.159.04", k
        assert rows[node]["allocatable_gpu"] == rows[node]["gpus"] and not rows[node]["cordoned"]
        held = ssh_ok(cluster, node, "apt-mark showhold").split()
        assert {"linux-image-lab", f"linux-image-{NEW}", f"linux-headers-{NEW}"} <= set(held)
    assert f"gpu-01: kernel {NEW} (newest installed)" in text, text


def test_a_second_roll_has_nothing_to_do(inv: Path) -> None:
    result, out = call(day2.upgrade, inv, kernel=True, yes=True)
    assert result["upgraded"] == [] and "nothing to upgrade" in out, out
    again, out = call(api.bootstrap, inv, yes=True)
    assert again["changed"] == 0, out
