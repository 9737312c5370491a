"""The nvidia-smi stand-in against the real H200 captures (tests/fixtures/nvidia): the table, -L,
--query-gpu, its errors and exit codes, -q, topo and persistence mode."""

from __future__ import annotations

import re
from pathlib import Path

from tests.lab.selftest.standins.nvidia_helpers import (
    DUAL,
    FIXTURES,
    NEW,
    OLD,
    SINGLE,
    fake_pci,
    install_files,
    load_module,
    smi,
)


def _mask_table(text: str) -> list[str]:
    lines = text.rstrip("\n").split("\n")[1:]  # first line: timestamp
    return [re.sub(r"\d\dC    P0 +\d+W", "NNC    P0 NNNW", ln) for ln in lines]


def test_table_matches_fixture_layout(dual: Path) -> None:
    res = smi(dual)
    assert res.returncode == 0, res.stdout + res.stderr
    assert _mask_table(res.stdout) == _mask_table((DUAL / "nvidia-smi.txt").read_text())
    assert re.fullmatch(r"\w{3} \w{3} [ \d]\d \d\d:\d\d:\d\d \d{4} {7}", res.stdout.split("\n")[0])


def test_table_single_gpu_matches_fixture(root: Path) -> None:
    fake_pci(root, (SINGLE / "sys-pci-nvidia.txt").read_text().splitlines())
    install_files(root, "nvidia-driver-cuda", NEW)
    load_module(root, NEW)
    assert _mask_table(smi(root).stdout) == _mask_table((SINGLE / "nvidia-smi.txt").read_text())


def test_header_line_carries_installed_version(root: Path) -> None:
    fake_pci(root, (SINGLE / "sys-pci-nvidia.txt").read_text().splitlines())
    install_files(root, "nvidia-driver-cuda", OLD)
    load_module(root, OLD)
    header = smi(root).stdout.split("\n")[2]
    want = (
        (SINGLE / "nvidia-smi.txt").read_text().split("\n")[2].replace("580.159.04", "580.105.08")
    )
    assert header == want


def test_list_gpus_format(dual: Path) -> None:
    res = smi(dual, "-L")
    assert res.returncode == 0
    pat = re.compile(
        r"GPU (\d+): (.+) "
        r"\(UUID: (GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})\)"
    )
    got = [pat.fullmatch(x) for x in res.stdout.splitlines()]
    want = [pat.fullmatch(x) for x in (DUAL / "nvidia-smi-L.txt").read_text().splitlines()]
    assert all(got) and all(want) and len(got) == len(want)
    assert [(m[1], m[2]) for m in got] == [(m[1], m[2]) for m in want]  # type: ignore[index]
    assert len({m[3] for m in got}) == 2  # type: ignore[index]


def test_query_gpu_csv_matches_fixture(dual: Path) -> None:
    fixture = (DUAL / "query-gpu.csv").read_text().splitlines()
    header = fixture[0]
    fields = ",".join(re.sub(r" \[.*\]", "", f) for f in header.split(", "))
    res = smi(dual, f"--query-gpu={fields}", "--format=csv")
    assert res.returncode == 0, res.stdout
    out = res.stdout.splitlines()
    assert out[0] == header
    uuid = re.compile(r"GPU-[0-9a-f-]{36}")
    assert [uuid.sub("U", x) for x in out[1:]] == [uuid.sub("U", x) for x in fixture[1:3]]


def test_query_gpu_noheader_nounits_matches_fixture(dual: Path) -> None:
    fixture = (DUAL / "query-gpu.csv").read_text().splitlines()[3:]
    res = smi(
        dual,
        "--query-gpu=index,name,uuid,driver_version,memory.total,pci.bus_id,compute_cap",
        "--format=csv,noheader,nounits",
    )
    uuid = re.compile(r"GPU-[0-9a-f-]{36}")
    assert [uuid.sub("U", x) for x in res.stdout.splitlines()] == [
        uuid.sub("U", x) for x in fixture
    ]
    listed = smi(dual, "-L").stdout
    for line in res.stdout.splitlines():
        assert line.split(", ")[2] in listed


def test_query_persistence_mig_and_more(dual: Path) -> None:
    res = smi(
        dual,
        "--query-gpu=persistence_mode,mig.mode.current,memory.used,utilization.gpu",
        "--format=csv",
    )
    assert res.stdout.splitlines() == [
        "persistence_mode, mig.mode.current, memory.used [MiB], utilization.gpu [%]",
        "Enabled, Disabled, 0 MiB, 0 %",
        "Enabled, Disabled, 0 MiB, 0 %",
    ]
    res = smi(dual, "--query-gpu=count,serial,index", "--format=csv,noheader")
    rows = [r.split(", ") for r in res.stdout.splitlines()]
    assert [r[0] for r in rows] == ["2", "2"] and all(r[1].isdigit() for r in rows)


def test_invalid_field(dual: Path) -> None:
    res = smi(dual, "--query-gpu=index,bogus", "--format=csv")
    assert res.returncode == 2
    assert res.stdout.startswith('Field "bogus" is not a valid field to query.')


#: the fact probe's nvidia-smi runs on the real H200 (2026-11-28), as transcripts
PROBE_CAPTURE = FIXTURES.parent / "real" / "h200-ubuntu2404" / "probe-2026-11-28"


def _transcript(name: str) -> dict[str, tuple[str, int]]:
    """A capture transcript: {command: (what it printed, exit code)}."""
    out: dict[str, tuple[str, int]] = {}
    command, lines = "", []
    for line in (PROBE_CAPTURE / name).read_text().splitlines(keepends=True):
        if line.startswith("## rc "):
            out[command] = ("".join(lines), int(line.split()[2]))
        elif line.startswith("## "):
            command, lines = line[3:].rstrip("\n"), []
        else:
            lines.append(line)
    return out


def test_the_probes_one_query_as_the_real_h200_prints_it(root: Path) -> None:
    """The fact probe's one --query-gpu (SMI_FIELDS), in each format, --version, and the
    fields real nvidia-smi refuses (virtualization_mode is none of its fields): the bytes
    the real H200 printed, but for its UUID (the lab makes its own)."""
    from gpuk8s.facts.nvidia import SMI_FIELDS

    fake_pci(root, (SINGLE / "sys-pci-nvidia.txt").read_text().splitlines())
    install_files(root, "nvidia-driver-cuda", NEW)
    load_module(root, NEW)
    uuid = re.compile(r"GPU-[0-9a-f-]{36}")
    real = {**_transcript("queries.txt"), **_transcript("mig-queries.txt")}
    asked = [c for c in real if c.startswith("nvidia-smi ") and "2>&1" not in c]
    assert f"nvidia-smi --query-gpu={SMI_FIELDS} --format=csv,noheader,nounits" in asked
    for command in asked:
        if command.split()[1] in ("-L", "-q", "nvlink"):
            continue  # -L: test_list_gpus_format; -q: test_q_and_topo; no NVLink here
        res = smi(root, *command.split()[1:])
        want, code = real[command]
        assert (res.returncode, uuid.sub("U", res.stdout), res.stderr) == \
            (code, uuid.sub("U", want), ""), command


def test_not_loaded_exit_9(root: Path) -> None:
    fake_pci(root, (SINGLE / "sys-pci-nvidia.txt").read_text().splitlines())
    install_files(root, "nvidia-driver-cuda", NEW)
    for args in ((), ("-L",), ("--query-gpu=index", "--format=csv")):
        res = smi(root, *args)
        assert res.returncode == 9
        assert res.stdout == (
            "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
            "Make sure that the latest NVIDIA driver is installed and running.\n"
        )


def test_version_mismatch_exit_18(root: Path) -> None:
    fake_pci(root, (SINGLE / "sys-pci-nvidia.txt").read_text().splitlines())
    install_files(root, "nvidia-driver-cuda", NEW)
    load_module(root, OLD)
    res = smi(root)
    assert res.returncode == 18
    assert res.stdout == (
        "Failed to initialize NVML: Driver/library version mismatch\n"
        "NVML library version: 580.159\n"
    )


def test_no_devices_exit_6(root: Path) -> None:
    fake_pci(root, ["0000:00:02.0 0x8086 0x1234 0x030000 0x8086 0x0001 i915"])
    install_files(root, "nvidia-driver-cuda", NEW)
    load_module(root, NEW)
    res = smi(root)
    assert (res.returncode, res.stdout) == (6, "No devices were found\n")


def test_models_bus_ids_and_uuids(root: Path) -> None:
    fake_pci(
        root,
        [
            "0000:1b:00.0 0x10de 0x2330 0x030200 0x10de 0x16c1 -",
            "0000:43:00.0 0x10de 0x20b2 0x030200 0x10de 0x1463 -",
            "0000:9a:00.0 0x10de 0x26b9 0x030000 0x10de 0x1851 -",
            "0000:c0:00.0 0x10de 0x22a3 0x068000 0x10de 0x1796 -",  # NVSwitch: not a GPU
        ],
    )
    install_files(root, "nvidia-driver-cuda", NEW)
    load_module(root, NEW, persistence=False)
    res = smi(
        root,
        "--query-gpu=index,name,memory.total,pci.bus_id,compute_cap,persistence_mode,mig.mode.current",
        "--format=csv,noheader,nounits",
    )
    assert res.stdout.splitlines() == [
        "0, NVIDIA H100 80GB HBM3, 81559, 00000000:1B:00.0, 9.0, Disabled, Disabled",
        "1, NVIDIA A100-SXM4-80GB, 81920, 00000000:43:00.0, 8.0, Disabled, Disabled",
        "2, NVIDIA L40S, 46068, 00000000:9A:00.0, 8.9, Disabled, [N/A]",
    ]
    first = smi(root, "-L").stdout
    assert smi(root, "-L").stdout == first  # deterministic
    (root / "etc/machine-id").write_text("00000000000000000000000000000001\n")
    assert smi(root, "-L").stdout != first  # per node


def test_q_and_topo(dual: Path) -> None:
    q = smi(dual, "-q").stdout.splitlines()
    fixture = (SINGLE / "nvidia-smi-q.txt").read_text().splitlines()
    assert q[:2] == fixture[:2]
    keyed = [ln for ln in q if " : " in ln]
    width = {ln.index(" : ") for ln in fixture if " : " in ln}
    assert {ln.index(" : ") for ln in keyed} == width
    assert "    Product Name                                       : NVIDIA H200" in q
    topo = smi(dual, "topo", "-m").stdout.splitlines()
    ftopo = (DUAL / "nvidia-smi-topo-m.txt").read_text().splitlines()
    assert topo[0] == ftopo[0]
    assert topo[1].split("\t")[:3] == ftopo[1].split("\t")[:3]
    assert topo[-7:] == ftopo[-7:]


def test_persistence_mode_set(dual: Path) -> None:
    res = smi(dual, "-pm", "0")
    assert (
        res.returncode == 0 and "Disabled persistence mode for GPU 00000000:00:06.0." in res.stdout
    )
    assert "Off  |" in smi(dual).stdout
