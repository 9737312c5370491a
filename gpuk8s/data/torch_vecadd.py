"""gpuk8s node GPU check, PyTorch fallback: c = a + b on every GPU, checked on the host; the
same lines as vecadd.cu ("OK GPU ..." then "TIMING GPU <n> kernel_ms=... first_launch_ms=...").

Timed as vecadd.cu times its kernel: the output tensor is allocated once, a first launch
(host wall clock, launch to completion) loads the kernel, then one ``torch.add(a, b, out=c)``
between two CUDA events on the device's stream, behind one add queued ahead so that the
device is busy while Python dispatches: the add kernel alone, no allocation (``a + b`` would
allocate 64 MiB for its result inside the timed span) and no Python dispatch time."""

import sys
import time

import torch


def main() -> int:
    failed = 0
    n = 1 << 24
    for i in range(torch.cuda.device_count()):
        dev = f"cuda:{i}"
        with torch.cuda.device(i):
            a = (torch.arange(n, dtype=torch.float32) % 1024).to(dev)
            b = (2 * (torch.arange(n, dtype=torch.float32) % 2048)).to(dev)
            c = torch.empty_like(a)
            torch.cuda.synchronize(dev)
            w0 = time.perf_counter()
            torch.add(a, b, out=c)  # warm-up: the first launch loads the kernel
            torch.cuda.synchronize(dev)
            first_ms = (time.perf_counter() - w0) * 1000
            t0 = torch.cuda.Event(enable_timing=True)
            t1 = torch.cuda.Event(enable_timing=True)
            # one add queued ahead, not waited for: the device is still running it while
            # Python records t0 and dispatches the timed add, so t0 fires when the device
            # reaches it and the timed add starts right after (the host's dispatch time,
            # 0.03-0.07 ms on the H200 host, is not counted as kernel time)
            torch.add(a, b, out=c)
            t0.record()
            torch.add(a, b, out=c)
            t1.record()
            t1.synchronize()
            torch.cuda.synchronize(dev)
            kernel_ms = t0.elapsed_time(t1)
        bad = int((c.cpu() != a.cpu() + b.cpu()).sum())
        failed += bool(bad)
        name = torch.cuda.get_device_name(i)
        print(("FAIL" if bad else "OK") + f" GPU {i} {name}: vecadd of {n} floats: {bad} wrong")
        print(f"TIMING GPU {i} kernel_ms={kernel_ms:.3f} first_launch_ms={first_ms:.3f}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
