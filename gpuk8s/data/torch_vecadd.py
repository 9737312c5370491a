"""gpuk8s node GPU check, PyTorch fallback: c = a + b on every GPU, checked on the host; the
same lines as vecadd.cu ("OK GPU ..." then "TIMING GPU <n> kernel_ms=... first_launch_ms=...")."""

import sys
import time

import torch


def main() -> int:
    failed = 0
    n = 1 << 24
    for i in range(torch.cuda.device_count()):
        dev = f"cuda:{i}"
        a = (torch.arange(n, dtype=torch.float32) % 1024).to(dev)
        b = (2 * (torch.arange(n, dtype=torch.float32) % 2048)).to(dev)
        torch.cuda.synchronize(dev)
        w0 = time.perf_counter()
        c = a + b  # warm-up: the first launch loads the kernel
        torch.cuda.synchronize(dev)
        first_ms = (time.perf_counter() - w0) * 1000
        t0 = torch.cuda.Event(enable_timing=True)
        t1 = torch.cuda.Event(enable_timing=True)
        with torch.cuda.device(i):
            t0.record()
            c = a + b
            t1.record()
        t1.synchronize()
        kernel_ms = t0.elapsed_time(t1)
        bad = int((c.cpu() != a.cpu() + b.cpu()).sum())
        failed += bool(bad)
        name = torch.cuda.get_device_name(i)
        print(("FAIL" if bad else "OK") + f" GPU {i} {name}: vecadd of {n} floats: {bad} wrong")
        print(f"TIMING GPU {i} kernel_ms={kernel_ms:.3f} first_launch_ms={first_ms:.3f}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
