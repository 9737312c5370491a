"""Fake /sys/bus/pci/devices folders: NVIDIA GPUs (and NVSwitches) that `lspci -nn` shows."""

from __future__ import annotations

import shutil
import struct
from pathlib import Path

from .topology import GPU_MODELS, NVSWITCH, NodeSpec

NVIDIA = 0x10DE
# HGX-style bus addresses: GPUs spread over two NUMA nodes
GPU_BUSES = [0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB]
NVSWITCH_BUSES = [0x05, 0x06, 0x07, 0x08]


def config_space(vendor: int, device: int, cls: int, sub_vendor: int, sub_device: int,
                 revision: int = 0xA1) -> bytes:
    """A 64-byte type-0 PCI config header."""
    cfg = bytearray(64)
    struct.pack_into("<HHHH", cfg, 0, vendor, device, 0x0006, 0x0010)  # command, status
    cfg[0x08] = revision
    cfg[0x09] = cls & 0xFF
    cfg[0x0A] = (cls >> 8) & 0xFF
    cfg[0x0B] = (cls >> 16) & 0xFF
    cfg[0x0E] = 0x00  # header type 0
    struct.pack_into("<HH", cfg, 0x2C, sub_vendor, sub_device)
    cfg[0x3C] = 0xFF  # irq line
    cfg[0x3D] = 0x01  # INTA
    return bytes(cfg)


def write_device(root: Path, slot: str, vendor: int, device: int, cls: int, sub_vendor: int,
                 sub_device: int, numa: int, revision: int = 0xA1) -> None:
    d = root / slot
    d.mkdir(parents=True)
    files = {
        "vendor": f"0x{vendor:04x}",
        "device": f"0x{device:04x}",
        "class": f"0x{cls:06x}",
        "subsystem_vendor": f"0x{sub_vendor:04x}",
        "subsystem_device": f"0x{sub_device:04x}",
        "revision": f"0x{revision:02x}",
        "numa_node": str(numa),
        "irq": "0",
        "enable": "1",
        "local_cpulist": "0-1",
        "current_link_speed": "32.0 GT/s PCIe",
        "current_link_width": "16",
        "max_link_speed": "32.0 GT/s PCIe",
        "max_link_width": "16",
        "modalias": (f"pci:v{vendor:08X}d{device:08X}sv{sub_vendor:08X}sd{sub_device:08X}"
                     f"bc{cls >> 16:02X}sc{(cls >> 8) & 0xFF:02X}i{cls & 0xFF:02X}"),
        "uevent": (f"PCI_CLASS={cls:X}\nPCI_ID={vendor:04X}:{device:04X}\n"
                   f"PCI_SUBSYS_ID={sub_vendor:04X}:{sub_device:04X}\nPCI_SLOT_NAME={slot}\n"),
        "resource": "\n".join(["0x0000000000000000 0x0000000000000000 0x0000000000000000"] * 13),
    }
    for name, text in files.items():
        (d / name).write_text(text + "\n")
    (d / "config").write_bytes(config_space(vendor, device, cls, sub_vendor, sub_device,
                                            revision))


def build(root: Path, spec: NodeSpec) -> Path:
    """(Re)create ``root`` as the node's /sys/bus/pci/devices."""
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    # an ordinary host bridge so lspci always has something non-NVIDIA to show
    write_device(root, "0000:00:00.0", 0x8086, 0x1237, 0x060000, 0x1AF4, 0x1100, 0, 0x02)
    if spec.gpus and spec.gpu_model:
        dev, cls, sub, _name = GPU_MODELS[spec.gpu_model]
        for i in range(spec.gpus):
            bus = GPU_BUSES[i] if i < len(GPU_BUSES) else 0xE0 + i
            numa = 0 if i < max(1, spec.gpus // 2) else 1
            write_device(root, f"0000:{bus:02x}:00.0", NVIDIA, dev, cls, NVIDIA, sub, numa)
    for i in range(spec.nvswitches):
        dev, cls, sub, _name = NVSWITCH
        bus = NVSWITCH_BUSES[i] if i < len(NVSWITCH_BUSES) else 0x10 + i
        write_device(root, f"0000:{bus:02x}:00.0", NVIDIA, dev, cls, NVIDIA, sub, 0)
    return root
