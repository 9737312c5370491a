"""gpu_node_lock on a bootstrapped lab, against the REAL unattended-upgrades (Debian 12's
2.9.1+nmu3, from the Debian mirror through the lab's cache): a newer kernel, a newer driver
and an unrelated update are published (the lab-updates repo, tests/lab/CONTRACT.md); on the
locked gpu-01, unattended-upgrade installs the unrelated update only; on gpu-02, which the
inventory opts out (gpu_node_lock: false), the same run installs the new kernel and the new
driver library too (so the locked node's result is the lock's doing, not the lab's), and
status shows its library ahead of the loaded module: "reboot pending".

The tests run in order and share one cluster, starting from the "bootstrapped" snapshot."""

from __future__ import annotations

import io
import os
import re
from pathlib import Path
from typing import Any

import pytest

from gpuk8s import api, day2
from gpuk8s.report import Reporter
from roles.nvidia_container_toolkit.role import DEV_CHAR_RULE, DEV_CHAR_RULES
from tests.lab.lab import Lab
from tests.lab.paths import REPO_URL
from tests.lab.product.runs import call, derived_inventory, ssh_ok
from tests.lab.product.test_bootstrap import GATE_VARS
from tests.lab.product.test_day2 import restore_bootstrapped

pytestmark = pytest.mark.lab

KREL = os.uname().release          # the lab nodes run the host's kernel
NEW = f"{KREL}-lab2"               # published in lab-updates (tests/lab/packages/kernel)
DRIVER = "580.159.04-1"            # what bootstrap installs (the newest in the CUDA repo)
NEW_DRIVER = "580.173.02-1"        # published in lab-updates
APT = "DEBIAN_FRONTEND=noninteractive apt-get -q -y -o Dpkg::Options::=--force-confold"


@pytest.fixture(scope="module")
def cluster(lab: Lab) -> Lab:
    return restore_bootstrapped(lab)


@pytest.fixture(scope="module")
def inv(cluster: Lab, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """gpu-01 locked (the default), gpu-02 opted out."""
    return derived_inventory(cluster, tmp_path_factory.mktemp("lock"), feature_gates=GATE_VARS,
                             hosts={"gpu-02": {"gpu_node_lock": False}})


def versions(lab: Lab, node: str) -> dict[str, str]:
    out = ssh_ok(lab, node, "dpkg-query -W -f='${Package} ${Version} ${db:Status-Abbrev}\\n'")
    return {p[0]: p[1] for p in (line.split() for line in out.splitlines())
            if len(p) == 3 and p[2].startswith(("ii", "hi"))}


def holds(lab: Lab, node: str) -> set[str]:
    return set(ssh_ok(lab, node, "apt-mark showhold").split())


def status_rows(inv: Path) -> tuple[dict[str, dict[str, Any]], str]:
    out = io.StringIO()
    rows = day2.status(inv, as_json=True, reporter=Reporter(io.StringIO()))
    day2.status(inv, reporter=Reporter(out))
    # the GPU nodes' lines wrap at 80 columns: one space for each break
    return {r["host"]: r for r in rows}, re.sub(r"\n +", " ", out.getvalue())


def test_bootstrap_locks_a_gpu_node_and_unlocks_one_that_opts_out(cluster: Lab,
                                                                  inv: Path) -> None:
    # what a real box has before gpuk8s comes: unattended-upgrades and the distribution's
    # kernel meta-packages (lab-only names, see CONTRACT.md), and some other package
    for node in ("gpu-01", "gpu-02"):
        ssh_ok(cluster, node, f"{APT} install unattended-upgrades linux-image-lab "
               "linux-headers-lab gpuk8s-lab-motd", timeout=600)
    result, out = call(api.bootstrap, inv, yes=True)
    assert result["changed"] > 0, out
    assert "+ hold " in out and "51gpuk8s-gpu-node-lock" in out, out

    locked = holds(cluster, "gpu-01")
    assert {"linux-image-lab", "linux-headers-lab", f"linux-image-{KREL}",
            f"linux-headers-{KREL}", "nvidia-open-580", "nvidia-kernel-open-dkms",
            "nvidia-driver-cuda"} <= locked, locked
    assert "gpuk8s-lab-motd" not in locked and "kubelet" in locked
    dump = ssh_ok(cluster, "gpu-01", "apt-config dump Unattended-Upgrade::Package-Blacklist")
    for prefix in ("linux-", "nvidia-", "libnvidia-", "cuda-"):
        assert f'Unattended-Upgrade::Package-Blacklist:: "{prefix}";' in dump, dump

    opted_out = holds(cluster, "gpu-02")
    assert not opted_out & {"linux-image-lab", f"linux-image-{KREL}", "nvidia-open-580",
                            "nvidia-kernel-open-dkms", "nvidia-driver-cuda"}, opted_out
    ssh_ok(cluster, "gpu-02", "! test -e /etc/apt/apt.conf.d/51gpuk8s-gpu-node-lock")

    again, out = call(api.bootstrap, inv, yes=True)
    assert again["changed"] == 0, out
    _, plan = call(api.bootstrap, inv, check=True)
    assert f"= kernel {KREL} and driver 580.159.04 held together" in plan, plan


def test_the_dev_char_rule_linked_the_devices_at_the_driver_load(cluster: Lab) -> None:
    """NVIDIA's udev rule (installed by bootstrap) ran when the driver loaded at this boot
    (the lab plays udev's "add" event: nvidia-lab-devices), and the /dev/char links it made
    stay through `systemctl daemon-reload`. The lab cannot show runc's half of the bug
    (containers losing their device cgroup entries): its pods get no NVIDIA device nodes."""
    rule = ssh_ok(cluster, "gpu-01", f"cat {DEV_CHAR_RULES}")
    assert rule == DEV_CHAR_RULE
    log = ssh_ok(cluster, "gpu-01", "journalctl -b -u nvidia-lab-modload --no-pager")
    assert "udev rule 71-nvidia-dev-char.rules: RUN /usr/bin/nvidia-ctk system " \
        "create-dev-char-symlinks --create-all" in log, log
    ssh_ok(cluster, "gpu-01", "systemctl daemon-reload")
    links = ssh_ok(cluster, "gpu-01", "for l in /dev/char/*; do [ -L \"$l\" ] && "
                   "printf '%s %s\\n' \"${l##*/}\" \"$(readlink \"$l\")\"; done")
    for pair in ("195:255 /dev/nvidiactl", "195:254 /dev/nvidia-modeset", "195:0 /dev/nvidia0",
                 "195:1 /dev/nvidia1", "510:0 /dev/nvidia-uvm", "510:1 /dev/nvidia-uvm-tools"):
        assert pair in links.splitlines(), links


def test_unattended_upgrade_leaves_the_locked_node_s_kernel_and_driver(cluster: Lab,
                                                                      inv: Path) -> None:
    # the updates are published, and the admin lets unattended-upgrades take that origin
    # (as Ubuntu's -security pocket carries kernels and linux-modules-nvidia-*)
    for node in ("gpu-01", "gpu-02"):
        ssh_ok(cluster, node, (
            "echo 'deb [signed-by=/etc/apt/keyrings/gpuk8s-lab.gpg] "
            f"{REPO_URL}/lab-updates/ /' > /etc/apt/sources.list.d/lab-updates.list && "
            "echo 'Unattended-Upgrade::Origins-Pattern { \"origin=gpuk8s-lab-updates\"; };' "
            "> /etc/apt/apt.conf.d/52lab-updates && apt-get -q update"), timeout=300)
    _, plan = call(api.bootstrap, inv, check=True)
    assert "waiting: linux-image-lab 2.0~lab2" in plan and \
        f"nvidia-open-580 {NEW_DRIVER}" in plan, plan

    for node in ("gpu-01", "gpu-02"):
        out = ssh_ok(cluster, node, "unattended-upgrade -v 2>&1; "
                     "cat /var/log/unattended-upgrades/unattended-upgrades.log", timeout=600)
        print(f"--- {node}\n{out}")

    locked = versions(cluster, "gpu-01")
    assert locked["gpuk8s-lab-motd"] == "1.1~lab2", locked.get("gpuk8s-lab-motd")
    assert locked["linux-image-lab"] == "1.0~lab1" and f"linux-image-{NEW}" not in locked
    assert locked["nvidia-driver-cuda"] == DRIVER and locked["nvidia-open-580"] == DRIVER
    log = ssh_ok(cluster, "gpu-01", "cat /var/log/unattended-upgrades/unattended-upgrades.log")
    assert "Initial blacklist: linux- nvidia- libnvidia- cuda-" in log, log

    free = versions(cluster, "gpu-02")
    assert free["gpuk8s-lab-motd"] == "1.1~lab2"
    assert free["linux-image-lab"] == "2.0~lab2" and f"linux-image-{NEW}" in free, free
    assert free["nvidia-driver-cuda"] == NEW_DRIVER, free.get("nvidia-driver-cuda")
    # DKMS's kernel hook built the new driver's module for the new kernel
    assert ssh_ok(cluster, "gpu-02", f"modinfo -F version /lib/modules/{NEW}/updates/dkms/"
                  "nvidia.ko").strip() == NEW_DRIVER.split("-")[0]


def test_status_shows_reboot_pending_where_the_library_moved(inv: Path) -> None:
    rows, text = status_rows(inv)
    ok, moved = rows["gpu-01"]["kernel"], rows["gpu-02"]["kernel"]
    assert ok["locked"] and not ok["reboot_pending"], ok
    assert ok["running"] == KREL and ok["newest"] == KREL
    assert ok["loaded_module"] == ok["library"] == DRIVER.split("-")[0], ok
    assert ok["waiting"]["linux-image-lab"] == "2.0~lab2", ok
    assert moved["reboot_pending"] and not moved["locked"], moved
    assert moved["library"] == NEW_DRIVER.split("-")[0] and moved["newest"] == NEW, moved
    assert [k["nvidia_module"] for k in moved["kernels"]] == \
        [NEW_DRIVER.split("-")[0]] * 2, moved["kernels"]
    assert "gpu-02: kernel" in text and "REBOOT PENDING" in text, text
    assert "gpu_node_lock is false on gpu-02" in text, text
    assert "gpu-01: kernel" in text and "held (gpu_node_lock)" in text, text
