"""The NVIDIA driver's Xid events as the kernel log shows them: which ones take a GPU out of
service (`invoke accept` fails the GPU; gpu_health_watch quarantines the node)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpuk8s.facts import Fact

#: Xid events NVIDIA's Xid catalog (docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html)
#: marks, for the H100 and A100, with the immediate action RESET_GPU or RESTART_BM (reboot), and
#: those whose workflow ends in a reset (48: double-bit ECC, 74: NVLink, 154: recovery action
#: changed). A GPU that logged one takes no more work until it is reset and accepted again.
FATAL_XIDS: dict[int, str] = {
    46: "GPU stopped responding", 48: "double-bit ECC error", 62: "PMU halt",
    64: "row remapping failed", 74: "NVLink error", 79: "GPU has fallen off the bus",
    95: "uncontained ECC error", 109: "context switch timeout", 110: "security fault",
    119: "GSP RPC timeout", 120: "GSP error", 136: "link training failed",
    140: "unrecovered ECC error", 143: "GPU init error", 154: "recovery action changed",
    156: "resource retirement event", 158: "GPU fatal timeout",
}

#: one Xid line as dmesg prints it ("[ 1843.308145] NVRM: Xid (PCI:0000:44:00): 79, GPU has
#: fallen off the bus."; drivers 535-595 add "pid=..., name=...," or not, and a MIG instance
#: after the address: "(PCI:0000:01:00 GPU-I:05)"); journalctl's prefix is allowed too
XID_LINE = re.compile(r"\[\s*(\d{1,9}\.\d{1,9})\]\s.{0,80}?NVRM: Xid \((?:PCI:)?"
                      r"([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2})[^)]{0,40}\): "
                      r"(\d{1,4}),\s?(.{0,200})")


@dataclass(frozen=True)
class XidEvent:
    uptime_s: float
    bus: str        # bus:device, lower case, as the kernel log names the GPU
    xid: int
    text: str

    @property
    def fatal(self) -> bool:
        return self.xid in FATAL_XIDS


def bus_key(bus: str) -> str:
    """A PCI address without its domain, lower case: nvidia-smi pads the domain to 8 digits,
    CUDA to 4, and the kernel log's Xid lines leave the function out ("44:00")."""
    return ":".join(bus.lower().split(":")[-2:])


def parse_xid(line: str) -> XidEvent | None:
    """One kernel log line (node output: matched, never trusted to be well formed)."""
    m = XID_LINE.search(line)
    if m is None:
        return None
    return XidEvent(float(m.group(1)), bus_key(m.group(2)),
                    int(m.group(3)), m.group(4).strip()[:200])


class XidEvents(Fact[tuple[XidEvent, ...]]):
    """The NVIDIA driver's Xid events in the kernel log since boot (the last 50)."""

    def command(self) -> str:
        return "dmesg 2>/dev/null | grep -F 'NVRM: Xid' | tail -n 50 || true"

    def parse(self, output: str, exit_code: int) -> tuple[XidEvent, ...]:
        return tuple(e for line in output.splitlines() if (e := parse_xid(line)) is not None)
