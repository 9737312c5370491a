"""The lab's one node GPU view (tests/lab/standins/k8s/gpuview.py) against the REAL nvidia-smi
stand-in on a fake node root, without a booted lab: what it reads (each command once per
View), that a container's GPU selection does not narrow it, that the MIG devices of -L are
placed by the instance listings only where they agree, and that the three daemons reading it
(device plugin, DCGM exporter, DRA kubelet plugin) see the same GPUs."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.lab.standins.k8s import dcgm, device_plugin, dra_node, gpuview
from tests.unit.test_lab_dra_node import NVIDIA_SMI, smi_root

MIXED = {"flags": {"migStrategy": "mixed"}}
LISTING = """GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-11111111-2222-3333-4444-555555555555)
  MIG 1g.10gb     Device  0: (UUID: MIG-aaaaaaaa-2222-3333-4444-555555555555)
  MIG 3g.40gb     Device  1: (UUID: MIG-bbbbbbbb-2222-3333-4444-555555555555)
GPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-66666666-7777-8888-9999-000000000000)
"""


@pytest.fixture
def node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Two H100s, the driver loaded; GPU 0 split into a 1g.10gb and a 3g.40gb MIG device."""
    for k, v in smi_root(tmp_path).items():
        monkeypatch.setenv(k, v)
    for args in (["-i", "0", "-mig", "1"], ["mig", "-i", "0", "-cgi", "19,9", "-C"]):
        subprocess.run(["nvidia-smi", *args], check=True, capture_output=True)
    return Path(os.environ["GPUK8S_LAB_ROOT"])


def test_listing_parses_gpus_and_their_mig_devices() -> None:
    g0, g1 = gpuview.parse_list(LISTING + "garbage\n  MIG 1g.10gb Device 0: (UUID: nope)\n")
    assert (g0.index, g0.name, g0.uuid) == (0, "NVIDIA H100 80GB HBM3",
                                            "GPU-11111111-2222-3333-4444-555555555555")
    assert [(m.profile, m.uuid[:12]) for m in g0.migs] == [("1g.10gb", "MIG-aaaaaaaa"),
                                                           ("3g.40gb", "MIG-bbbbbbbb")]
    assert not any(m.placed for m in g0.migs) and g1.migs == ()
    assert gpuview.parse_list("  MIG 1g.10gb     Device  0: (UUID: MIG-a)\n") == []
    modes = gpuview.parse_modes(f"{g0.uuid}, Enabled\n{g1.uuid}, Disabled\nbad\n")
    assert [g.mig_mode for g in gpuview.with_modes([g0, g1], modes)] == ["Enabled", "Disabled"]


def test_the_view_of_a_node(node: Path) -> None:
    view = gpuview.View()
    assert gpuview.pci_gpus() == ["0000:00:06.0", "0000:00:07.0"]
    gpus = view.gpus()
    assert [(g.index, g.mig_mode, len(g.migs)) for g in gpus] == [(0, "Enabled", 2),
                                                                 (1, "Disabled", 0)]
    assert view.mig_on()
    detailed, cuda, why = view.detailed()
    assert detailed is not None and (cuda, why) == ("13.0", "")
    d0, d1 = detailed
    assert [g.uuid for g in detailed] == [g.uuid for g in gpus]
    assert (d1.name, d1.memory_mib, d1.bus_id, d1.compute_cap, d1.driver_version, d1.brand,
            d1.architecture, d1.minor) == ("NVIDIA H100 80GB HBM3", 81559, "00000000:00:07.0",
                                           "9.0", "580.159.04", "NVIDIA", "Hopper", 1)
    # -L's MIG devices (by GPU instance ID), placed: the stand-in's driver puts the 3g
    # instance at 0, the 1g one at 6
    assert [(m.profile, m.uuid) for m in d0.migs] == [(m.profile, m.uuid) for m in gpus[0].migs]
    assert [(m.profile, m.gi, m.ci, m.profile_id, m.start, m.size) for m in d0.migs] == [
        ("3g.40gb", 1, 0, 9, 0, 4), ("1g.10gb", 13, 0, 19, 6, 1)]
    assert d0.migs[1].engines == (9.75, 16, 1, 0, 1, 1, 0)
    p = view.query(["index", "uuid", "temperature.gpu"])
    assert p.returncode == 0
    assert [row.split(", ")[1] for row in p.stdout.splitlines()] == [g.uuid for g in gpus]


def test_one_view_runs_each_command_once(node: Path, tmp_path: Path) -> None:
    calls = tmp_path / "calls"
    counting = tmp_path / "counting-smi"
    counting.write_text(f"#!/bin/sh\necho \"$*\" >> {calls}\n"
                        f"exec {sys.executable} {NVIDIA_SMI} \"$@\"\n")
    counting.chmod(0o755)
    view = gpuview.View((str(counting),))
    assert view.listed() and view.gpus() and view.mig_on() and view.listing()
    assert calls.read_text().splitlines() == [
        "-L", "--query-gpu=uuid,mig.mode.current --format=csv,noheader"]
    view.detailed()
    view.detailed()
    assert calls.read_text().splitlines()[2:] == [
        f"--query-gpu={gpuview.DETAIL_QUERY} --format=csv,noheader,nounits", "-q",
        "mig -lgi", "mig -lci", "mig -lgip"]   # -L: already read


def test_a_containers_gpu_selection_does_not_narrow_it(node: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    (g0, g1) = gpuview.View().listed()
    monkeypatch.setenv("GPUK8S_LAB_VISIBLE_GPUS", g1.uuid)
    monkeypatch.setenv("NVIDIA_VISIBLE_DEVICES", g1.uuid)
    assert [g.uuid for g in gpuview.View().listed()] == [g0.uuid, g1.uuid]
    got = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout
    assert g0.uuid not in got   # what a container given GPU 1 sees


def test_mig_devices_the_listings_disagree_on_stay_unplaced(node: Path) -> None:
    def smi(*a: str) -> str:
        return subprocess.run(["nvidia-smi", *a], capture_output=True, text=True).stdout

    query = smi(f"--query-gpu={gpuview.DETAIL_QUERY}", "--format=csv,noheader,nounits")
    q, listing = smi("-q"), smi("-L").splitlines()
    lgi, lci, lgip = smi("mig", "-lgi"), smi("mig", "-lci"), smi("mig", "-lgip")
    _, (g0, _) = gpuview.detail(query, q, "\n".join(listing), lgi, lci, lgip)
    assert [m.placed for m in g0.migs] == [True, True]
    swapped = "\n".join([listing[0], listing[2], listing[1], *listing[3:]])
    _, (g0, _) = gpuview.detail(query, q, swapped, lgi, lci, lgip)
    assert [m.placed for m in g0.migs] == [False, False]
    extra = "\n".join([*listing[:3], "  MIG 1g.10gb     Device  2: (UUID: MIG-0123)", *listing[3:]])
    _, (g0, _) = gpuview.detail(query, q, extra, lgi, lci, lgip)
    assert [m.placed for m in g0.migs] == [True, True, False]


def test_without_a_driver_the_view_is_empty(node: Path) -> None:
    (node / "run/nvidia-lab/loaded-module-version").unlink()
    view = gpuview.View()
    assert view.listing() is None and view.listed() == [] and view.gpus() == []
    assert view.mig_modes() == {} and not view.mig_on()
    gpus, _, why = view.detailed()
    assert gpus is None and why.startswith("NVIDIA-SMI has failed")
    assert view.query(["index", "uuid"]).returncode == 9
    assert gpuview.pci_gpus() == ["0000:00:06.0", "0000:00:07.0"]   # the kernel still lists them


class _Kubelet:
    node_name = "gpu-01"


def test_the_three_daemons_see_the_same_gpus(node: Path) -> None:
    """The device plugin's resources, the DRA plugin's devices and the DCGM exporter's rows
    name the same GPUs and MIG devices (what the old per-daemon readers computed, 0faacd6)."""
    view = gpuview.View()
    g0, g1 = view.gpus()
    resources = device_plugin.resources_for(view.gpus(), MIXED, len(gpuview.pci_gpus()))
    assert resources == {"nvidia.com/gpu": [g1.uuid],
                         "nvidia.com/mig-1g.10gb": [g0.migs[1].uuid],
                         "nvidia.com/mig-3g.40gb": [g0.migs[0].uuid]}
    devices, why = dra_node.node_devices()
    assert devices is not None and why == ""
    assert [(d["name"], d["attributes"]["uuid"]["string"]) for d in devices] == [
        ("gpu-0-mig-1g10gb-19-6", g0.migs[1].uuid), ("gpu-0-mig-3g40gb-9-0", g0.migs[0].uuid),
        ("gpu-1", g1.uuid)]
    code, csv, fields = dcgm.Exporter(_Kubelet()).query()
    assert code == 0 and fields[:2] == ["index", "uuid"]
    assert [row.split(", ")[1] for row in csv.splitlines()] == [g0.uuid, g1.uuid]


def test_a_kept_view_asks_again_only_when_the_gpus_state_changed(
        node: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The device plugin asks on every kubelet sync: its -L and MIG mode answers are kept
    while the state nvidia-smi reads stays as it is, and a MIG mode change is seen at once.
    nvidia-smi is installed as on a lab node: the stand-in itself, its modules beside it."""
    # the fixture's nvidia-smi is a shell wrapper, as the stand-ins' own tests script theirs:
    # what it reads is not known, so it is asked every time
    assert gpuview.state_key() is None
    bin_dir = node.parent / "node-bin"
    bin_dir.mkdir()
    smi = NVIDIA_SMI.read_text().replace("#!/usr/bin/python3", f"#!{sys.executable}", 1)
    (bin_dir / "nvidia-smi").write_text(smi)
    (bin_dir / "nvidia-smi").chmod(0o755)
    for module in ("labgpu.py", "labmig.py", "labmigcli.py"):
        shutil.copy(NVIDIA_SMI.parent / module, bin_dir / module)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    assert gpuview.state_key() is not None
    asked: list[tuple[str, ...]] = []
    real_run = gpuview.run

    def counted(argv: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
        asked.append(tuple(argv[1:]))
        return real_run(argv, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(gpuview, "run", counted)
    assert [g.mig_mode for g in gpuview.View(kept=True).gpus()] == ["Enabled", "Disabled"]
    assert len(asked) == 2
    assert [g.mig_mode for g in gpuview.View(kept=True).gpus()] == ["Enabled", "Disabled"]
    assert len(asked) == 2  # nothing changed: nothing asked
    gpuview.View().listing()
    assert len(asked) == 3  # a View that is not kept always asks
    for args in (["mig", "-i", "0", "-dci"], ["mig", "-i", "0", "-dgi"], ["-i", "0", "-mig", "0"]):
        subprocess.run(["nvidia-smi", *args], check=True, capture_output=True)
    gpus = gpuview.View(kept=True).gpus()
    assert [(g.mig_mode, len(g.migs)) for g in gpus] == [("Disabled", 0), ("Disabled", 0)]
    assert len(asked) == 5
