"""MIG on the nvidia-smi stand-in (labmig, labmigcli; formats from the real H200 captures), and the
kubelet stand-in's device plugin resources and admission of MIG pods."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from k8s import device_plugin, gpuview, kubelet

from tests.lab.selftest.standins.nvidia_helpers import (
    NEW,
    fake_pci,
    install_files,
    load_module,
    run,
)

H100 = "0x10de 0x2330 0x030200 0x10de 0x16c1 -"
MIG_LINE = re.compile(r"  MIG (\S+) +Device +(\d+): \(UUID: (MIG-[0-9a-f-]{36})\)")


def node(root: Path, *pci: str, persistence: bool = True) -> Path:
    fake_pci(root, list(pci))
    install_files(root, "nvidia-driver-cuda", NEW)
    load_module(root, NEW, persistence=persistence)
    return root


@pytest.fixture
def two_h100(root: Path) -> Path:
    return node(root, f"0000:1b:00.0 {H100}", f"0000:1c:00.0 {H100}")


def ok(root: Path, *args: str, env: dict[str, str] | None = None) -> str:
    res = run(root, "/usr/bin/nvidia-smi", *args, env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    return res.stdout


def created(out: str) -> list[int]:
    return [int(x) for x in re.findall(r"Successfully created GPU instance ID +(\d+)", out)]


def test_mig_two_h100_all_3g(two_h100: Path) -> None:
    assert ok(two_h100, "-mig", "1") == (
        "Enabled MIG Mode for GPU 00000000:1B:00.0\nEnabled MIG Mode for GPU 00000000:1C:00.0\n"
        "All done.\n")
    assert ok(two_h100, "mig", "-i", "0", "-cgi", "9,9", "-C").splitlines() == [
        "Successfully created GPU instance ID  2 on GPU  0 using profile MIG 3g.40gb (ID  9)",
        "Successfully created compute instance ID  0 on GPU  0 GPU instance ID  2 using profile "
        "MIG 3g.40gb (ID  2)",
        "Successfully created GPU instance ID  1 on GPU  0 using profile MIG 3g.40gb (ID  9)",
        "Successfully created compute instance ID  0 on GPU  0 GPU instance ID  1 using profile "
        "MIG 3g.40gb (ID  2)"]
    ok(two_h100, "mig", "-i", "1", "-cgi", "3g.40gb,3g.40gb", "-C")
    listing = ok(two_h100, "-L").splitlines()
    assert [ln.split(" (UUID")[0] for ln in listing] == [
        "GPU 0: NVIDIA H100 80GB HBM3", "  MIG 3g.40gb     Device  0:",
        "  MIG 3g.40gb     Device  1:", "GPU 1: NVIDIA H100 80GB HBM3",
        "  MIG 3g.40gb     Device  0:", "  MIG 3g.40gb     Device  1:"]
    migs = [m[3] for m in map(MIG_LINE.fullmatch, listing) if m]
    assert len(set(migs)) == 4 and ok(two_h100, "-L").splitlines() == listing
    assert ok(two_h100, "mig", "-lgi").splitlines()[5:] == [
        "|   0  MIG 3g.40gb            9        1          0:4     |", "+" + "-" * 57 + "+",
        "|   0  MIG 3g.40gb            9        2          4:4     |", "+" + "-" * 57 + "+",
        "|   1  MIG 3g.40gb            9        1          0:4     |", "+" + "-" * 57 + "+",
        "|   1  MIG 3g.40gb            9        2          4:4     |", "+" + "-" * 57 + "+"]
    lgip = ok(two_h100, "mig", "-lgip", "-i", "1").splitlines()
    assert lgip[5] == ("|   1  MIG 1g.10gb         19     0/7        9.75       No     16     "
                       "1     0   |")
    assert "|   1  MIG 3g.40gb          9     0/2        39.50      No     60     3     0   |" \
        in lgip
    assert ok(two_h100, "--query-gpu=index,mig.mode.current,mig.mode.pending",
              "--format=csv,noheader") == "0, Enabled, Enabled\n1, Enabled, Enabled\n"
    assert ok(two_h100, "mig", "-lci").splitlines()[6] == (
        "|   0      1       MIG 3g.40gb          2         0          0:4     |")


def test_mig_geometries_on_one_gpu(two_h100: Path) -> None:
    ok(two_h100, "-i", "0", "-mig", "1")
    # all-balanced, largest first: 3g at 4:4, 2g at 0:2, the 1g's at 2 and 3
    assert created(ok(two_h100, "mig", "-i", "0", "-cgi", "9,14,19,19", "-C")) == [2, 3, 9, 10]
    assert len(MIG_LINE.findall(ok(two_h100, "-L"))) == 4
    ok(two_h100, "mig", "-i", "0", "-dci")
    ok(two_h100, "mig", "-i", "0", "-dgi")
    # seven 1g fill the GPU; an eighth does not fit
    assert sorted(created(ok(two_h100, "mig", "-i", "0", "-cgi", ",".join(["19"] * 7)))) == \
        list(range(7, 14))
    res = run(two_h100, "/usr/bin/nvidia-smi", "mig", "-i", "0", "-cgi", "19")
    assert (res.returncode, res.stdout) == (23, (
        "Unable to create a GPU instance on GPU  0 using profile 19: Insufficient Resources\n"
        "Failed to create GPU instances: Insufficient Resources\n"))
    assert "|   0  MIG 1g.10gb         19     0/7 " in ok(two_h100, "mig", "-lgip", "-i", "0")
    ok(two_h100, "mig", "-i", "0", "-dgi")
    # 1g.10gb+me once per GPU; unknown profiles and placements are invalid
    assert created(ok(two_h100, "mig", "-i", "0", "-cgi", "1g.10gb+me")) == [13]
    res = run(two_h100, "/usr/bin/nvidia-smi", "mig", "-i", "0", "-cgi", "20")
    assert res.returncode == 23 and "using profile 20: Insufficient Resources" in res.stdout
    res = run(two_h100, "/usr/bin/nvidia-smi", "mig", "-i", "0", "-cgi", "3g.71gb")
    assert res.stdout.splitlines() == [
        "Unable to create a GPU instance on GPU  0 using profile 3g.71gb: Invalid Argument",
        "Failed to create GPU instances: Invalid Argument"] and res.returncode == 2
    assert created(ok(two_h100, "mig", "-i", "0", "-cgi", "9:0")) == [1]
    res = run(two_h100, "/usr/bin/nvidia-smi", "mig", "-i", "0", "-cgi", "14:0")
    assert "using profile 14:0: Insufficient Resources" in res.stdout


def test_mig_driver_placements_of_the_user_guide(root: Path) -> None:
    """The MIG user guide's A100 examples: the same IDs, placements and -lgi order."""
    node(root, "0000:43:00.0 0x10de 0x20b2 0x030200 0x10de 0x1463 -")
    ok(root, "-mig", "1")
    ok(root, "-r")
    res = run(root, "/usr/bin/nvidia-smi", "mig", "-cgi", "19,19,14,9")
    assert created(res.stdout) == [13, 11, 3] and res.returncode == 23
    assert res.stdout.splitlines()[-2:] == [
        "Unable to create a GPU instance on GPU  0 using profile 9: Insufficient Resources",
        "Failed to create GPU instances: Insufficient Resources"]
    ok(root, "mig", "-dgi")
    assert created(ok(root, "mig", "-cgi", "9,19,14,19")) == [2, 7, 4, 8]
    rows = [ln for ln in ok(root, "mig", "-lgi").splitlines() if "MIG" in ln]
    assert rows == ["|   0  MIG 1g.10gb           19        7          0:1     |",
                    "|   0  MIG 1g.10gb           19        8          1:1     |",
                    "|   0  MIG 2g.20gb           14        4          2:2     |",
                    "|   0  MIG 3g.40gb            9        2          4:4     |"]
    ok(root, "mig", "-dgi")
    assert created(ok(root, "mig", "-cgi", "14,19,19,19,19,19")) == [5, 13, 7, 8, 9, 10]
    rows = [ln.split()[5:7] for ln in ok(root, "mig", "-lgi").splitlines() if "MIG" in ln]
    assert rows == [["7", "0:1"], ["8", "1:1"], ["9", "2:1"], ["10", "3:1"], ["13", "6:1"],
                    ["5", "4:2"]]
    ok(root, "mig", "-dgi")
    out = ok(root, "mig", "-cgi", "14,14,14,20", "-C")
    assert created(out) == [5, 3, 4, 13]
    assert out.splitlines()[-1] == ("Successfully created compute instance ID  0 on GPU  0 GPU "
                                    "instance ID 13 using profile MIG 1g.10gb (ID  0)")
    assert "  MIG 1g.10gb+me  Device  3: (UUID: MIG-" in ok(root, "-L")


def test_mig_ampere_pending_until_reset_hopper_at_once(root: Path) -> None:
    node(root, f"0000:1b:00.0 {H100}", "0000:43:00.0 0x10de 0x20b2 0x030200 0x10de 0x1463 -")
    out = ok(root, "-i", "1", "-mig", "1")
    assert out.splitlines()[0] == ("Warning: MIG mode is in pending enable state for GPU "
                                   "00000000:43:00.0:In use by another client")
    assert out.endswith("to make MIG mode effective.\nAll done.\n")
    query = ("--query-gpu=index,mig.mode.current,mig.mode.pending", "--format=csv,noheader")
    assert ok(root, *query) == "0, Disabled, Disabled\n1, Disabled, Enabled\n"
    assert ok(root, "mig", "-lgi") == "No MIG-enabled devices found.\n"
    res = run(root, "/usr/bin/nvidia-smi", "mig", "-cgi", "9")
    assert (res.returncode, res.stdout) == (6, "No MIG-enabled devices found.\n")
    assert ok(root, "-i", "1", "-r") == "GPU 00000000:43:00.0 was successfully reset.\nAll done.\n"
    assert ok(root, "-i", "00000000:1B:00.0", "-mig", "1") == (
        "Enabled MIG Mode for GPU 00000000:1B:00.0\nAll done.\n")
    assert ok(root, *query) == "0, Enabled, Enabled\n1, Enabled, Enabled\n"
    q = ok(root, "-q", "-i", "1").splitlines()
    assert q[q.index("    MIG Mode") + 1].endswith(": Enabled")
    assert "    Product Name                                       : NVIDIA A100-SXM4-80GB" in q


def test_mig_not_supported_on_l40s(root: Path) -> None:
    node(root, "0000:9a:00.0 0x10de 0x26b9 0x030000 0x10de 0x1851 -")
    res = run(root, "/usr/bin/nvidia-smi", "-i", "0", "-mig", "1")
    assert (res.returncode, res.stdout) == (3, (
        "Unable to enable MIG Mode for GPU 00000000:9A:00.0: Not Supported\n"
        "Terminating early due to previous errors.\n"))
    assert ok(root, "--query-gpu=mig.mode.current,mig.mode.pending",
              "--format=csv,noheader") == "[N/A], [N/A]\n"
    assert ok(root, "mig", "-lgip") == "No MIG-enabled devices found.\n"
    assert ok(root).splitlines()[10].endswith("|                  N/A |")
    assert not (root / "var/lib/gpuk8s-lab/nvidia/mig.json").exists()


def test_mig_destroy_order_and_not_found(two_h100: Path) -> None:
    smi_ = lambda *a: run(two_h100, "/usr/bin/nvidia-smi", *a)  # noqa: E731
    ok(two_h100, "-i", "1", "-mig", "1")
    ok(two_h100, "mig", "-i", "1", "-cgi", "14,14", "-C")
    res = smi_("mig", "-i", "1", "-dgi")
    assert (res.returncode, res.stdout) == (19, (
        "Unable to destroy GPU instance ID  3 from GPU  1: In use by another client\n"
        "Failed to destroy GPU instances: In use by another client\n"))
    res = smi_("-i", "1", "-mig", "0")
    assert (res.returncode, res.stdout) == (19, (
        "Unable to disable MIG Mode for GPU 00000000:1C:00.0: In use by another client\n"
        "Terminating early due to previous errors.\n"))
    assert ok(two_h100, "mig", "-i", "1", "-dci", "-gi", "5") == (
        "Successfully destroyed compute instance ID  0 from GPU  1 GPU instance ID  5\n")
    assert ok(two_h100, "mig", "-i", "1", "-dgi", "-gi", "5") == (
        "Successfully destroyed GPU instance ID  5 from GPU  1\n")
    assert ok(two_h100, "mig", "-dci") == (
        "Successfully destroyed compute instance ID  0 from GPU  1 GPU instance ID  3\n")
    assert ok(two_h100, "mig", "-dci") == "No compute instances found: Not Found\n"
    assert ok(two_h100, "mig", "-lci") == "No compute instances found: Not Found\n"
    # a GPU instance without its compute instance is no MIG device; -cci gives it one
    assert not MIG_LINE.search(ok(two_h100, "-L"))
    assert ok(two_h100, "mig", "-cci") == (
        "Successfully created compute instance ID  0 on GPU  1 GPU instance ID  3 using "
        "profile MIG 2g.20gb (ID  1)\n")
    assert len(MIG_LINE.findall(ok(two_h100, "-L"))) == 1
    ok(two_h100, "mig", "-dci")
    assert ok(two_h100, "mig", "-dgi") == "Successfully destroyed GPU instance ID  3 from GPU  1\n"
    assert ok(two_h100, "mig", "-dgi") == "No GPU instances found: Not Found\n"
    assert ok(two_h100, "mig", "-lgi") == "No GPU instances found: Not Found\n"
    assert ok(two_h100, "-i", "1", "-mig", "0") == (
        "Disabled MIG Mode for GPU 00000000:1C:00.0\nAll done.\n")
    res = smi_("mig", "-i", "7", "-lgi")
    assert (res.returncode, res.stdout) == (6, "No devices were found\n")


def test_mig_table_and_persistence_warning(root: Path) -> None:
    node(root, f"0000:1b:00.0 {H100}", persistence=False)
    out = ok(root, "-mig", "1")
    assert out.splitlines()[1:3] == ["", (
        "Warning: persistence mode is disabled on device 00000000:1B:00.0. See the Known Issues "
        "section of the nvidia-smi(1) man page for more information. Run with [--help | -h] "
        "switch to get more information on how to enable persistence mode.")]
    ok(root, "mig", "-cgi", "9,19", "-C")
    table = ok(root).splitlines()
    assert table[8].endswith("|   00000000:1B:00.0 Off |                   On |")
    assert table[9].endswith("|      59MiB /  81559MiB |     N/A      Default |")
    assert table[10].endswith("|              Enabled |")
    start = table.index("| MIG devices:" + " " * 76 + "|")
    assert table[start + 6:start + 12] == [
        "|  0    2   0   0  |              44MiB / 40448MiB    | 60      0 |  3   0    3    0"
        "    3 |",
        "|                  |               0MiB / 24673MiB    |           |                 "
        "      |",
        "+------------------+----------------------------------+-----------+-----------------"
        "------+",
        "|  0    7   0   1  |              15MiB /  9984MiB    | 16      0 |  1   0    1    0"
        "    1 |",
        "|                  |               0MiB /  6090MiB    |           |                 "
        "      |",
        "+------------------+----------------------------------+-----------+-----------------"
        "------+"]
    assert table[start + 12] == "" and table[start + 14].startswith("| Processes:")


def test_mig_instances_do_not_survive_a_reboot(two_h100: Path) -> None:
    boot = two_h100 / "proc/sys/kernel/random/boot_id"
    boot.parent.mkdir(parents=True)
    boot.write_text("6a4c1f6e-0000-4000-8000-000000000001\n")
    ok(two_h100, "-mig", "1")
    ok(two_h100, "mig", "-cgi", "0", "-C")
    assert len(MIG_LINE.findall(ok(two_h100, "-L"))) == 2
    boot.write_text("6a4c1f6e-0000-4000-8000-000000000002\n")
    assert not MIG_LINE.search(ok(two_h100, "-L"))   # MIG mode stays, instances are gone
    assert ok(two_h100, "--query-gpu=mig.mode.current", "--format=csv,noheader") == \
        "Enabled\nEnabled\n"
    assert ok(two_h100, "mig", "-lgi") == "No GPU instances found: Not Found\n"


def test_mig_container_sees_its_device_only(two_h100: Path) -> None:
    ok(two_h100, "-mig", "1")
    ok(two_h100, "mig", "-cgi", "9,9", "-C")
    host = ok(two_h100, "-L").splitlines()
    mig = MIG_LINE.fullmatch(host[5])
    assert mig
    # the container gets neither the state file nor the other devices: only its UUID
    (two_h100 / "var/lib/gpuk8s-lab/nvidia/mig.json").unlink()
    env = {"GPUK8S_LAB_VISIBLE_GPUS": mig[3]}
    assert ok(two_h100, "-L", env=env).splitlines() == [
        host[3].replace("GPU 1:", "GPU 0:"), host[5].replace("Device  1", "Device  0")]
    assert "|                  N/A   |     N/A      Default |" in ok(two_h100, env=env)
    whole = host[0].split("UUID: ")[1].rstrip(")")
    assert ok(two_h100, "-L", env={"GPUK8S_LAB_VISIBLE_GPUS": whole}) == host[0] + "\n"


# ------------------------------------------------------------------ kubelet: device plugin
MIXED = {"version": "v1", "flags": {"migStrategy": "mixed"}}


def plugin(root: Path, config: dict[str, object]) -> dict[str, list[str]]:
    listing = ok(root, "-L")
    modes = gpuview.parse_modes(ok(root, "--query-gpu=uuid,mig.mode.current",
                                   "--format=csv,noheader"))
    return device_plugin.resources_for(gpuview.with_modes(gpuview.parse_list(listing), modes),
                                       config)


def test_device_plugin_resources_from_nvidia_smi(two_h100: Path) -> None:
    gpus = re.findall(r"GPU-[0-9a-f-]{36}", ok(two_h100, "-L"))
    assert plugin(two_h100, MIXED) == plugin(two_h100, {}) == {"nvidia.com/gpu": gpus}
    ok(two_h100, "-mig", "1")
    ok(two_h100, "mig", "-cgi", "9,9", "-C")
    migs = [m[3] for m in MIG_LINE.finditer(ok(two_h100, "-L"))]
    assert plugin(two_h100, MIXED) == {"nvidia.com/mig-3g.40gb": migs}
    assert plugin(two_h100, {"flags": {"migStrategy": "single"}}) == {"nvidia.com/gpu": migs}
    assert plugin(two_h100, {"version": "v1", "flags": {"migStrategy": "none"}}) == {
        "nvidia.com/gpu": gpus}
    # GPU 1 back to whole, GPU 0 split 3g + 2g + 1g+me: mixed offers each kind
    ok(two_h100, "mig", "-i", "1", "-dci")
    ok(two_h100, "mig", "-i", "1", "-dgi")
    ok(two_h100, "-i", "1", "-mig", "0")
    ok(two_h100, "mig", "-i", "0", "-dci")
    ok(two_h100, "mig", "-i", "0", "-dgi")
    ok(two_h100, "mig", "-i", "0", "-cgi", "9,14,20", "-C")
    got = plugin(two_h100, MIXED)
    assert {k: len(v) for k, v in got.items()} == {
        "nvidia.com/gpu": 1, "nvidia.com/mig-1g.10gb.me": 1, "nvidia.com/mig-2g.20gb": 1,
        "nvidia.com/mig-3g.40gb": 1}
    assert got["nvidia.com/gpu"] == [gpus[1]]
    assert plugin(two_h100, {"flags": {"migStrategy": "single"}}) == {}  # plugin exits
    sliced = {"version": "v1", "flags": {"migStrategy": "none"}, "sharing": {"timeSlicing": {
        "resources": [{"name": "nvidia.com/gpu", "replicas": 4}]}}}
    assert plugin(two_h100, sliced)["nvidia.com/gpu"][:3] == [
        f"{gpus[0]}::0", f"{gpus[1]}::0", f"{gpus[0]}::1"]
    assert device_plugin.config_ok(sliced) and device_plugin.config_ok(MIXED)
    assert not device_plugin.config_ok({"flags": {"migStrategy": "all"}})
    assert not device_plugin.config_ok({"sharing": {"timeSlicing": {"resources": [
        {"name": "nvidia.com/gpu", "replicas": 1}]}}})


def test_kubelet_admits_mig_pods_per_resource() -> None:
    k = kubelet.Kubelet.__new__(kubelet.Kubelet)
    k.devices = {"nvidia.com/gpu": ["GPU-a"], "nvidia.com/mig-3g.40gb": ["MIG-1", "MIG-2"]}
    k.gpu_assign = {"other": ["MIG-1"]}
    events: list[tuple[str, str]] = []
    k.set_status = lambda pod, phase, *a, **kw: events.append(  # type: ignore[method-assign]
        (phase, pod["status"].get("message", "")))
    pod = {"metadata": {"uid": "p1", "name": "p", "namespace": "default"}, "spec": {
        "containers": [{"resources": {"limits": {"nvidia.com/mig-3g.40gb": "2"}}}]}}
    avail = {"nvidia.com/gpu": 1, "nvidia.com/mig-3g.40gb": 2}
    assert k.held() == {"nvidia.com/mig-3g.40gb": 1}
    assert k.sync_pod(pod, {}, avail, {}) == {}
    assert events == [("Failed", "Allocate failed due to requested number of devices "
                       "unavailable for nvidia.com/mig-3g.40gb. Requested: 2, Available: 1, "
                       "which is unexpected")]
    assert k.allocate("nvidia.com/mig-3g.40gb", 1) == ["MIG-2"]
    assert k.allocate("nvidia.com/gpu", 2) == ["GPU-a"]
    assert kubelet.is_device_resource("nvidia.com/mig-1g.10gb.me")
    assert not kubelet.is_device_resource("nvidia.com/gpu.replicas")
