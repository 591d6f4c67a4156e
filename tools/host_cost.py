"""Host time of one runtime call (device).

`queued`: a short sleep kernel keeps the GPU busy, so each batch of calls only queues and
the wall time per call is the Python path (checks, descriptor, tensor maps, launch), not
the kernel. Batches are 8 calls: the pinned staging ring lets calls with host parameters
and no plan run 8 launches ahead of the GPU, no more. `back to back`: a small problem
called in a loop without the sleep, wall time per call including the GPU, which is what
a caller with small launches sees.

    python3 tools/host_cost.py --artifacts out/gpu_new causal hstu
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

BATCH = 8
SLEEP_CYCLES = 100_000_000  # about 50 ms: longer than a batch of calls on the host


def queued_us(fn: Callable[[], object], batches: int, torch) -> float:
    times = []
    for _ in range(batches):
        torch.cuda._sleep(SLEEP_CYCLES)
        t0 = time.perf_counter()
        for _ in range(BATCH):
            fn()
        times.append((time.perf_counter() - t0) / BATCH * 1e6)
        torch.cuda.synchronize()
    return statistics.median(times)


def back_to_back_us(fn: Callable[[], object], calls: int, torch) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / calls * 1e6


def calls_of(attn, name: str, torch, b: int, n: int, h: int, d: int
             ) -> dict[str, Callable[[], object]]:
    import numpy as np

    params = {"hstu": {"n_targets": [n // 8] * b},
              "shared_prefix": {"prompt_len": [n // 4] * b,
                                "responses": [[n // 4, n // 2, 3 * n // 4]] * b}}.get(name, {})
    q = torch.randn((b, n, h, d), device="cuda").bfloat16()
    k, v = torch.randn_like(q), torch.randn_like(q)
    plan = attn.plan(batch=b, seq_len=n, **params)
    out = torch.empty_like(q)
    checked = np.float32(1 / d ** 0.5)  # a scale that is not a Python number: never replayed
    return {
        "plan (replayed)": lambda: attn(q, k, v, plan=plan),
        "plan, out= (replayed)": lambda: attn(q, k, v, plan=plan, out=out),
        "plan, lse (replayed)": lambda: attn(q, k, v, plan=plan, return_lse=True),
        "plan (checked)": lambda: attn(q, k, v, plan=plan, scale=checked),
        "no plan (checked)": lambda: attn(q, k, v, **params),
        "torch.empty_like alone": lambda: torch.empty_like(q),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="+")
    ap.add_argument("--artifacts", type=Path, required=True)
    ap.add_argument("--batches", type=int, default=40)
    args = ap.parse_args()
    import torch

    from cmc.runtime import load

    shapes = {"queued": (4, 1024, 16, 128), "back to back": (1, 512, 8, 128)}
    print(f"us per call; queued: median of {args.batches} batches of {BATCH} behind a sleep "
          f"kernel; back to back: 400 calls, GPU included; bf16 [B, L, H, D] = {shapes}")
    for name in args.names:
        attn = load(args.artifacts / name)
        queued = calls_of(attn, name, torch, *shapes["queued"])
        small = calls_of(attn, name, torch, *shapes["back to back"])
        for label in queued:
            queued[label]()
            small[label]()
            print(f"  {name:14s} {label:24s} queued {queued_us(queued[label], args.batches, torch):8.1f}"
                  f"   back to back {back_to_back_us(small[label], 400, torch):8.1f}", flush=True)


if __name__ == "__main__":
    main()
