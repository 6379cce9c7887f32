#!/usr/bin/env python3
"""PyTorch's torch.matmul in f16 at the matrix probe's size (4096^3): the anchor the sweep's
matrix-unit GEMMs are compared with (`sweep --matrix ...`, BENCHMARKS.md "Matrix units").

Random f16 inputs in [-1, 1) (never zeros), CUDA events around each product, the median of
50 after a second of warm-up products (clocks up). One JSON line per form:
  a@b           B stored k x n (as the probe's GEMMs read it)
  a@bt.T        B stored n x k (the probe's `-bt` variants)
  a@b f32-red   with allow_fp16_reduced_precision_reduction off (f32 reductions throughout)
Usage: python3 bench/anchor_torch_matmul.py [SIZE]
"""
import json
import sys
import time

import torch


def median_ms(fn, reps=50):
    times = []
    for _ in range(reps):
        s = torch.cuda.Event(enable_timing=True)
        e = torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e))
    times.sort()
    return times[len(times) // 2]


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 4096
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(51)
    a = torch.rand(n, n, device=dev, dtype=torch.float16, generator=g) * 2 - 1
    b = torch.rand(n, n, device=dev, dtype=torch.float16, generator=g) * 2 - 1
    bt = b.t().contiguous()
    t0 = time.time()
    while time.time() - t0 < 1.0:
        torch.matmul(a, b)
    torch.cuda.synchronize()
    flop = 2.0 * n ** 3
    forms = [("a@b", lambda: torch.matmul(a, b)), ("a@bt.T", lambda: torch.matmul(a, bt.t()))]
    rows = []
    for name, fn in forms:
        rows.append((name, median_ms(fn)))
    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
    rows.append(("a@b f32-red", median_ms(forms[0][1])))
    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = True
    ref = (a.double() @ b.double())
    err = ((torch.matmul(a, b).double() - ref).norm() / ref.norm()).item()
    for name, ms in rows:
        print(json.dumps({
            "form": name, "size": n, "ms": round(ms, 4),
            "tflops": round(flop / (ms * 1e-3) / 1e12, 1),
            "rel_err_f64": err if name == "a@b" else None,
            "device": torch.cuda.get_device_name(), "torch": torch.__version__,
        }), flush=True)


if __name__ == "__main__":
    main()
