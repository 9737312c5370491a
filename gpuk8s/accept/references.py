"""What a GPU node is measured against: one row of reference figures per GPU model, each with its
source, the health rules, and the Xid events that take a GPU out of service.

A reference is what a healthy GPU of that model gives *with gpuk8s's own benchmark*
(gpuk8s/data/accept.cu: dense 8192^3 products on random data, held for seconds on every GPU at
once). That is not always the published peak: an H200 at its 700 W limit sustains about 680-700
dense BF16 TFLOPS, where short bursts (MAMF's 100 iterations, the figure published as 794.5 for
the H100 SXM) still run at the 1980 MHz boost clock. docs/real-hardware.md has the readings and
the why. Rows we could not measure carry the published figure and say so.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuk8s.facts.xid import FATAL_XIDS

__all__ = ["FATAL_XIDS"]

#: the verdict bands, as fractions of the reference (or of the node's best GPU)
FAIL_BELOW = 0.90
WARN_BELOW = 0.95

H200_READINGS = "docs/real-hardware.md, 2x H200 SXM (gpuk8s accept, 2026-11-29)"


@dataclass(frozen=True)
class Ref:
    value: float
    source: str


#: per-GPU metrics, their units, and how a report names them
METRICS = {
    "matmul_bf16": ("TFLOPS", "dense BF16 matmul"),
    "matmul_fp16": ("TFLOPS", "dense FP16 matmul"),
    "matmul_tf32": ("TFLOPS", "dense TF32 matmul"),
    "matmul_fp32": ("TFLOPS", "dense FP32 matmul"),
    "membw": ("GB/s", "device memory copy"),
    "h2d": ("GB/s", "host to device (pinned)"),
    "d2h": ("GB/s", "device to host (pinned)"),
    "p2p": ("GB/s", "GPU to GPU copy"),
    "nccl_busbw": ("GB/s", "NCCL all-reduce bus bandwidth"),
}

_AZ = ("Azure HPC node health check thresholds (Azure/azurehpc-health-checks, conf/"
       "nd96isr_h100_v5.conf / nd96isr_h200_v5.conf / nd96asr_v4.conf)")
_MAMF = "stas00/ml-engineering compute/accelerator (MAMF: best shape, 100-iteration bursts)"

#: nvidia-smi's name of a model -> metric -> reference. ``nccl_busbw:N`` is the all-reduce bus
#: bandwidth of N GPUs of that model in one node; ``p2p`` applies to NVLink pairs only.
REFERENCES: dict[str, dict[str, Ref]] = {
    "NVIDIA H200": {
        "matmul_bf16": Ref(670.0, f"measured: {H200_READINGS}; 656-700 sustained at 700 W"),
        "matmul_fp16": Ref(640.0, f"measured: {H200_READINGS}; 628-662 sustained"),
        "matmul_tf32": Ref(355.0, f"measured: {H200_READINGS}; 347-371 sustained"),
        "membw": Ref(4200.0, f"measured: {H200_READINGS}; 4187-4292 (datasheet 4800)"),
        "h2d": Ref(55.0, f"measured: {H200_READINGS}; 53.6-55.5 (Azure passes at 48)"),
        "d2h": Ref(55.0, f"measured: {H200_READINGS}; 55.2-55.4"),
        "p2p": Ref(390.0, f"measured: {H200_READINGS}; 392-396 over NV18 (Azure passes at "
                          "335)"),
        "nccl_busbw:2": Ref(340.0, f"measured: {H200_READINGS}; 346 at 8 GiB, NVLS off"),
        "nccl_busbw:8": Ref(475.0, "NVIDIA/nccl-tests#272: 475 GB/s measured on 8x H200 (Azure "
                                   "passes at 431 @16 GiB)"),
    },
    "NVIDIA H100 80GB HBM3": {  # the SXM part
        "matmul_bf16": Ref(670.0, "not measured here: the H200's sustained figure (same chip, "
                                  f"same 700 W limit); {_MAMF} gives 794.5 in bursts"),
        "matmul_fp16": Ref(640.0, "not measured here: as the H200 (same chip, same 700 W)"),
        "matmul_tf32": Ref(355.0, "not measured here: as the H200 (same chip, same 700 W)"),
        "membw": Ref(2900.0, "not measured here: datasheet 3350 GB/s x 0.875, the H200's "
                             "measured share of its datasheet figure"),
        "h2d": Ref(55.0, "nvbandwidth#6: about 57 GB/s per GPU on PCIe Gen5 (Azure passes at "
                         "52)"),
        "d2h": Ref(55.0, "nvbandwidth#6: about 57 GB/s per GPU on PCIe Gen5"),
        "p2p": Ref(370.0, f"{_AZ}: passes NVLink pairs at 350; NV18 as the H200"),
        "nccl_busbw:8": Ref(480.0, "NVIDIA/nccl-tests#212: about 480 GB/s on 8x H100 SXM with "
                                   f"NVLS at large sizes; {_AZ} passes at 460 @16 GiB"),
    },
    "NVIDIA H100 PCIe": {
        "matmul_bf16": Ref(540.0, "not measured here: datasheet 756 dense x 0.71, the H200's "
                                  "measured share of its datasheet figure (989)"),
        "membw": Ref(1750.0, "not measured here: datasheet 2000 GB/s x 0.875"),
        "h2d": Ref(55.0, "nvbandwidth#6: about 57 GB/s per GPU on PCIe Gen5"),
        "d2h": Ref(55.0, "nvbandwidth#6: about 57 GB/s per GPU on PCIe Gen5"),
        "nccl_busbw:2": Ref(116.0, "NVIDIA/nccl-tests#194: about 116 GB/s, 2x H100 PCIe with "
                                   "an NVLink bridge"),
    },
    "NVIDIA A100-SXM4-80GB": {
        "matmul_bf16": Ref(271.2, f"{_MAMF}: A100 SXM"),
        "membw": Ref(1780.0, "not measured here: datasheet 2039 GB/s x 0.875"),
        "h2d": Ref(24.0, f"{_AZ}: A100 on PCIe Gen4 passes at 24"),
        "d2h": Ref(24.0, f"{_AZ}: A100 on PCIe Gen4 passes at 24"),
        "nccl_busbw:8": Ref(225.0, "AKS PR 5938: 224.991 GB/s measured on 8x A100 (Azure "
                                   "passes at 228 @8 GiB)"),
    },
    "NVIDIA A100-SXM4-40GB": {
        "matmul_bf16": Ref(271.2, f"{_MAMF}: A100 SXM"),
        "membw": Ref(1360.0, "not measured here: datasheet 1555 GB/s x 0.875"),
        "h2d": Ref(24.0, f"{_AZ}: A100 on PCIe Gen4 passes at 24"),
        "d2h": Ref(24.0, f"{_AZ}: A100 on PCIe Gen4 passes at 24"),
        "nccl_busbw:8": Ref(225.0, "AKS PR 5938: 224.991 GB/s measured on 8x A100"),
    },
    "NVIDIA A100 80GB PCIe": {
        "matmul_bf16": Ref(252.9, f"{_MAMF}: A100 PCIe"),
        "membw": Ref(1660.0, "not measured here: datasheet 1935 GB/s x 0.875"),
        "h2d": Ref(24.0, f"{_AZ}: A100 on PCIe Gen4 passes at 24"),
        "d2h": Ref(24.0, f"{_AZ}: A100 on PCIe Gen4 passes at 24"),
    },
    "NVIDIA A100-PCIE-40GB": {
        "matmul_bf16": Ref(252.9, f"{_MAMF}: A100 PCIe"),
        "membw": Ref(1360.0, "not measured here: datasheet 1555 GB/s x 0.875"),
        "h2d": Ref(24.0, f"{_AZ}: A100 on PCIe Gen4 passes at 24"),
        "d2h": Ref(24.0, f"{_AZ}: A100 on PCIe Gen4 passes at 24"),
    },
    # L40S: no dense-matmul measurement we could find or make; the node's best GPU sets that
    # bar. Its PCIe Gen4 x16 link and GDDR6 give these:
    "NVIDIA L40S": {
        "membw": Ref(750.0, "not measured here: datasheet 864 GB/s x 0.875"),
        "h2d": Ref(24.0, "PCIe Gen4 x16 as the A100's (Azure passes those at 24)"),
        "d2h": Ref(24.0, "PCIe Gen4 x16 as the A100's"),
    },
}

#: nvidia-smi's clocks_event_reasons.active bits that mean a fault, not a policy (nvml.h's
#: nvmlClocksEventReason*): software power capping (0x4) is how a GPU at its power limit
#: normally runs a dense product, and is not one of them.
FAULT_CLOCK_REASONS = {0x8: "hardware slowdown", 0x20: "software thermal slowdown",
                       0x40: "hardware thermal slowdown", 0x80: "power brake slowdown"}

#: corrected ECC errors since the driver loaded above which a GPU is reported (a warning)
CORRECTED_ECC_WARN = 10000
#: a GPU this hot during the benchmark is reported (a warning); thermal slowdown fails it
HOT_C = 87


def reference(model: str, metric: str) -> Ref | None:
    return REFERENCES.get(model, {}).get(metric)
