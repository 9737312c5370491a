"""Interrupted bootstraps converge: a `gpuk8s bootstrap` subprocess is killed with SIGKILL at
10 points (before any op, inside a role's script, inside apt with the node's dpkg SIGKILLed
too, during the driver install, during the driver reboot, during kubeadm init, during the
join, during the cluster phase, in the middle of the node phase on all hosts, inside the CUDA
toolkit's unpack, leaving it half-installed), each time run again; the last re-run exits 0,
`plan` then shows 0 changes, and the cluster is the one an uninterrupted run gives (4 nodes
Ready, nvidia.com/gpu 2 on gpu-01 and 1 on gpu-02, none elsewhere).

Points come in sequence on one restore of the "fresh" snapshot (each re-run is killed at
the next point, so the partial state of the previous kill is what it starts from): chain A
has points 1-8, chain B points 9-10 on a second restore."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from tests.lab.lab import Lab
from tests.lab.product.runs import Bootstrap, assert_converged_like_uninterrupted, restore_fresh

pytestmark = pytest.mark.lab

#: armed on a node: a tight loop (the lab's packages are small: apt's dpkg runs are short) that
#: SIGKILLs an apt-started dpkg once it has journalled a status change (so the database is
#: left mid-change, as after a power cut), then apt-get, and notes the pid; the pattern does
#: not match the loop's own command line
ARM_DPKG_KILLER = ("rm -f /run/gpuk8s-test-killed; nohup timeout {t} sh -c 'until "
                   "ls /var/lib/dpkg/updates | grep -q \"^[0-9]\" && "
                   "p=$(pgrep -f \"dpkg .*--status-f[d]\"); do :; done; kill -9 $p; "
                   "pkill -9 -x apt-get; echo $p > /run/gpuk8s-test-killed' "
                   ">/dev/null 2>&1 &")
#: dpkg left interrupted: packages mid-change, or journal entries not yet applied
INTERRUPTED = "dpkg --audit; ls /var/lib/dpkg/updates | grep '^[0-9]'"
#: the lab's cuda-toolkit preinst waits while this file exists (it survives the driver reboot)
HOLD = Path("/var/lib/gpuk8s-lab/hold-unpack")
#: the lab driver's "loaded" module, copied at boot (tests/lab/standins/nvidia/labgpu.py)
LOADED_MODULE = "/run/nvidia-lab/loaded-module-version"
TOOLKIT_STATUS = "dpkg-query -W -f='${db:Status-Abbrev}' cuda-toolkit-13-0"


@pytest.fixture
def fresh(lab: Lab) -> Lab:
    return restore_fresh(lab)  # the lab as booted: made by test_bootstrap, or here


def kill_remote_dpkg(lab: Lab, host: str, run: Bootstrap, timeout: int = 300) -> str:
    """SIGKILL the first apt-started dpkg on ``host`` from now on, then the bootstrap: dpkg
    is left interrupted there. Returns the killed dpkg's pid."""
    rc, _, err = lab.ssh(host, ARM_DPKG_KILLER.format(t=timeout))
    assert rc == 0, err
    said: list[str] = []

    def killed() -> bool:
        rc, out, _ = lab.ssh(host, "cat /run/gpuk8s-test-killed", timeout=30)
        said.append(out.strip())
        return rc == 0 and bool(out.strip())

    run.wait_for(f"a dpkg on {host}", killed, timeout)
    run.kill()
    return f"{host}: killed dpkg {said[-1]}"


def kill_dpkg_in_unpack(lab: Lab, host: str, run: Bootstrap, timeout: int = 400) -> str:
    """The lab's CUDA toolkit package holds its unpack while HOLD exists (its preinst); once
    the run's dpkg is held there, SIGKILL it, apt-get and the bootstrap. Returns its pid."""
    said: list[str] = []

    def held() -> bool:
        rc, out, _ = lab.ssh(host, f"cat {HOLD.with_name('held-unpack')}", timeout=30)
        said.append(out.strip())
        return rc == 0 and out.strip().isdigit()

    run.wait_for(f"dpkg held inside the toolkit's unpack on {host}", held, timeout)
    rc, _, err = lab.ssh(host, f"kill -9 {said[-1]}; pkill -9 -x apt-get; "
                         f"rm -f {HOLD} {HOLD.with_name('held-unpack')}")
    assert rc == 0, err
    run.kill()
    return f"{host}: killed dpkg {said[-1]} inside the unpack of cuda-toolkit-13-0"


def settle(lab: Lab) -> None:
    """After a kill: a reboot the killed run had already asked for (1 s timer) may still be
    on its way; re-run once every node answers, as someone would after a crash."""
    time.sleep(3)
    lab.wait_ssh(timeout=180)


def first_op(run: Bootstrap, host: str) -> str:
    m = re.search(r"^\S+ --> ([^:]+):", run.log(host), re.M)
    return m.group(1) if m else ""


def test_chain_a_eight_kill_points(fresh: Lab, tmp_path: Path) -> None:
    inv, runs = fresh.inventory_path, tmp_path / "runs"
    timings = {}
    # 1: during connect / fact gathering, before any op
    run = Bootstrap(inv, runs)
    run.wait_for("the run folder", lambda: run.run_dir is not None, 60)
    time.sleep(0.5)
    timings[1] = run.kill()
    settle(fresh)
    # 2: inside the base role's script on every host (killed as cp-01 starts it)
    run = Bootstrap(inv, runs)
    run.wait_op("cp-01", "base |")
    timings[2] = run.kill()
    settle(fresh)
    # 3: inside apt on gpu-01, with its dpkg SIGKILLed: dpkg is left interrupted
    run = Bootstrap(inv, runs)
    print(kill_remote_dpkg(fresh, "gpu-01", run))
    timings[3] = time.monotonic() - run.started
    _, audit, _ = fresh.ssh("gpu-01", INTERRUPTED)
    print(f"gpu-01 after the dpkg kill: {audit}")
    assert audit.strip(), "dpkg on gpu-01 does not look interrupted"
    # 4: the re-run repairs dpkg first on gpu-01; killed inside gpu-02's driver install
    run = Bootstrap(inv, runs)
    run.wait_op("gpu-02", "nvidia_driver | driver packages", 400)
    time.sleep(2)
    timings[4] = run.kill()
    settle(fresh)
    assert first_op(run, "gpu-01") == "base | repair interrupted dpkg", run.log("gpu-01")
    # 5: during a GPU node's driver reboot: gpu-01's, unless it got ahead of gpu-02 in run 4
    # and rebooted already (CI of 8ef863b: gpu-02's apt-get update hung 4 minutes there)
    waiting = [h for h in ("gpu-01", "gpu-02")
               if fresh.ssh(h, f"test -s {LOADED_MODULE}")[0] != 0]
    assert waiting, "both GPU nodes finished their driver reboot before kill point 5:\n" \
        + run.log("gpu-01")[-2000:] + run.log("gpu-02")[-2000:]
    target = waiting[0]
    boot = fresh.boot_id(target)
    run = Bootstrap(inv, runs)
    run.wait_op(target, "nvidia_driver | reboot", 400)

    def going_down() -> bool:  # the reboot was sent: sshd gone, or already a new boot
        rc, out, _ = fresh.ssh(target, "cat /proc/sys/kernel/random/boot_id", timeout=10)
        return rc != 0 or out.strip() != boot

    run.wait_for(f"{target} going down", going_down, 120)
    timings[5] = run.kill()
    fresh.wait_for_reboot(target, boot, 180)
    settle(fresh)
    # 6: inside kubeadm init
    run = Bootstrap(inv, runs)
    run.wait_op("cp-01", "control_plane | kubeadm init", 400)
    time.sleep(1.0)
    timings[6] = run.kill()
    settle(fresh)
    # 7: inside kubeadm join
    run = Bootstrap(inv, runs)
    run.wait_op("gpu-01", "join |", 400)
    time.sleep(0.5)
    timings[7] = run.kill()
    settle(fresh)
    # 8: inside the cluster phase (labels, device plugin, allocatable wait)
    run = Bootstrap(inv, runs)
    run.wait_op("cp-01", "gpu_cluster |", 400)
    time.sleep(1.0)
    timings[8] = run.kill()
    settle(fresh)
    # then one full run converges
    run = Bootstrap(inv, runs)
    assert run.finish() == 0, run.stderr[-3000:]
    print(f"\nkill points (s after start): {timings}; final run "
          f"{time.monotonic() - run.started:.1f}s")
    assert_converged_like_uninterrupted(fresh, inv, runs)


def test_chain_b_two_kill_points(fresh: Lab, tmp_path: Path) -> None:
    inv, runs = fresh.inventory_path, tmp_path / "runs"
    # 9: in the middle of the node phase, every host somewhere in its stack
    run = Bootstrap(inv, runs)
    run.wait_op("cpu-01", "container_runtime |")
    run.kill()
    # 10: inside the unpack of the CUDA toolkit on gpu-02 (after its driver reboot): dpkg is
    # SIGKILLed with the package half-installed, which `dpkg --configure -a` cannot mend
    rc, _, err = fresh.ssh("gpu-02", f"mkdir -p {HOLD.parent} && touch {HOLD}")
    assert rc == 0, err
    run = Bootstrap(inv, runs)
    print(kill_dpkg_in_unpack(fresh, "gpu-02", run))
    _, status, _ = fresh.ssh("gpu-02", TOOLKIT_STATUS)
    assert status.strip() == "iHR", f"cuda-toolkit-13-0 is {status!r}, not half-installed"
    run = Bootstrap(inv, runs)
    assert run.finish() == 0, run.stderr[-3000:]
    assert first_op(run, "gpu-02") == "base | repair interrupted dpkg", run.log("gpu-02")
    assert "reinstall cuda-toolkit-13-0 (left half-installed" in run.stdout, run.stdout[-3000:]
    _, status, _ = fresh.ssh("gpu-02", TOOLKIT_STATUS)
    assert status.strip() == "ii", status
    assert_converged_like_uninterrupted(fresh, inv, runs)


def test_kubeadm_init_interrupted_twice_then_converges(fresh: Lab, tmp_path: Path) -> None:
    """kubeadm init killed (1) after it wrote admin.conf but before any static pod, then
    (2) with the control plane up but before its post-init steps (kubeadm-config, bootstrap
    token RBAC, cluster-info): admin.conf exists both times, so only gpuk8s's init-complete
    marker tells the cluster is not there. Each re-run resets and initialises again; a cluster
    that did finish (marker removed by hand) is adopted, never reset."""
    inv, runs = fresh.inventory_path, tmp_path / "runs"
    fault = "/run/gpuk8s-lab/kubeadm-init-fault"
    kubectl = "kubectl --kubeconfig /etc/kubernetes/super-admin.conf --request-timeout=5s"
    for point in ("after-kubeconfig", "before-upload-config"):
        rc, _, err = fresh.ssh("cp-01", f"mkdir -p /run/gpuk8s-lab && echo {point} > {fault}")
        assert rc == 0, err
        run = Bootstrap(inv, runs)
        assert run.finish() != 0
        assert "control_plane | kubeadm init" in run.stderr + run.stdout, run.stderr
        _, left, _ = fresh.ssh("cp-01", "ls /etc/kubernetes /etc/kubernetes/gpuk8s; "
                               f"{kubectl} -n kube-system get configmap kubeadm-config 2>&1")
        print(f"after a kill at {point}:\n{left}")
        assert "admin.conf" in left and "init-complete" not in left
        if point == "before-upload-config":  # the API server runs, kubeadm-config is missing
            assert 'configmaps "kubeadm-config" not found' in left
        else:
            static = fresh.ssh("cp-01", "ls /etc/kubernetes/manifests")[1]
            assert "kube-apiserver.yaml" not in static, static
    run = Bootstrap(inv, runs)
    assert run.finish() == 0, run.stderr[-3000:]
    log = run.log("cp-01")
    assert "kubeadm init did not finish" in log and "kubeadm reset, then init again" in log
    assert_converged_like_uninterrupted(fresh, inv, runs)
    # a finished cluster whose marker is gone is adopted: same kubeadm-config, no reset
    uid = fresh.ssh("cp-01", f"{kubectl} -n kube-system get configmap kubeadm-config "
                    "-o jsonpath='{.metadata.uid}'")[1]
    fresh.ssh("cp-01", "rm /etc/kubernetes/gpuk8s/init-complete")
    run = Bootstrap(inv, runs)
    assert run.finish() == 0, run.stderr[-3000:]
    assert "kubeadm init had finished; recording it" in run.log("cp-01")
    assert fresh.ssh("cp-01", f"{kubectl} -n kube-system get configmap kubeadm-config "
                     "-o jsonpath='{.metadata.uid}'")[1] == uid
    assert fresh.ssh("cp-01", "test -f /etc/kubernetes/gpuk8s/init-complete")[0] == 0
