"""Device time of the cmc kernel vs wall time per call, for benchmark cases (torch.profiler).

A wall time well above the kernel's device time means the call is host-bound (parameter
validation and packing in the runtime), not kernel-bound.

    python tools/kernel_time.py --artifacts out/bench --cases shared_prefix/1024 causal/1024
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))


def main() -> None:
    import bench
    import numpy as np
    import torch
    from torch.profiler import ProfilerActivity, profile

    from cmc.runtime import load

    ap = argparse.ArgumentParser()
    ap.add_argument("--artifacts", default="out/bench")
    ap.add_argument("--cases", nargs="+", required=True)
    ap.add_argument("--calls", type=int, default=50)
    args = ap.parse_args()
    lengths = sorted({int(c.split("/")[1]) for c in args.cases})
    cases = {f"{c.pattern}/{c.length}": c
             for c in bench.make_cases(np.random.default_rng(20261202), tuple(lengths))}
    for name in args.cases:
        c = cases[name]
        attn = load(bench._artifact_dir(Path(args.artifacts), bench.artifact_for(c.pattern)))
        B, T = len(c.lengths), sum(c.lengths)
        q = torch.randn(T, bench.HEADS, bench.HEAD_DIM, device="cuda", dtype=torch.bfloat16)
        kw = bench._cmc_params(c)
        cu = torch.zeros(B + 1, dtype=torch.int32, device="cuda")
        cu[1:] = torch.cumsum(torch.tensor(c.lengths, device="cuda", dtype=torch.int32), 0)
        if c.jagged:
            call = functools.partial(attn, q, q, q, cu_seqlens=cu, max_len=max(c.lengths), **kw)
        else:
            qb = q.view(B, c.length, bench.HEADS, bench.HEAD_DIM)
            call = functools.partial(attn, qb, qb, qb, **kw)
        for _ in range(5):
            call()
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(args.calls):
            call()
        torch.cuda.synchronize()
        wall = (time.perf_counter() - t) / args.calls * 1e3
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(args.calls):
                call()
            torch.cuda.synchronize()
        dev = [e for e in prof.key_averages() if e.key.startswith("cmc_")]
        ms = sum(e.device_time_total for e in dev) / 1e3 / args.calls if dev else float("nan")
        print(f"{name:28s} wall {wall:7.3f} ms/call   kernel {ms:7.3f} ms/call "
              f"({', '.join(e.key for e in dev)})", flush=True)


if __name__ == "__main__":
    main()
