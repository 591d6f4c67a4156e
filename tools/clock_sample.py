#!/usr/bin/env python3
"""SM clock and board power while one kernel runs back to back (device only).

The cycle probe counts SM cycles, the benchmark counts time; the two differ by the clock,
which the GPU lowers under its power limit. This runs each system of the benchmark (cmc from
--artifacts, Flex-FA4, FA4 native for causal) in a loop for --seconds while nvidia-smi samples
the SM clock and the power draw every 100 ms, and prints the medians beside the rate:

    python3 tools/clock_sample.py --artifacts out/bench causal/32768 hstu/32768
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))

import bench  # noqa: E402


def sustain(fn: Callable[[], Any], seconds: float, torch: Any) -> tuple[float, float, float]:
    """(ms per call, median SM MHz, median W) over `seconds` of back-to-back calls."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    smi = subprocess.Popen(["nvidia-smi", "--query-gpu=clocks.sm,power.draw",
                            "--format=csv,noheader,nounits", "-lms", "100"],
                           stdout=subprocess.PIPE, text=True)
    t0, n = time.perf_counter(), 0
    while time.perf_counter() - t0 < seconds:
        for _ in range(10):
            fn()
        n += 10
        torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    smi.terminate()
    out, _ = smi.communicate()
    rows = [line.split(",") for line in out.strip().splitlines() if "," in line]
    rows = rows[len(rows) // 5:]  # skip the ramp
    mhz = statistics.median(float(r[0]) for r in rows) if rows else float("nan")
    watts = statistics.median(float(r[1]) for r in rows) if rows else float("nan")
    return dt / n * 1e3, mhz, watts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--artifacts", type=Path, default=ROOT / "out" / "bench")
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("cases", nargs="+", help="PATTERN/LENGTH")
    args = ap.parse_args()

    import numpy as np

    try:
        from flash_attn.cute.interface import flash_attn_func
    except Exception:  # noqa: BLE001
        flash_attn_func = None
    want = [tuple(c.split("/")) for c in args.cases]
    lengths = tuple(sorted({int(n) for _, n in want}))
    cases = [c for c in bench.make_cases(np.random.default_rng(20261202), lengths)
             if (c.pattern, str(c.length)) in want]
    for c in cases:
        run_case(c, args.artifacts, args.seconds, flash_attn_func)


def run_case(c: Any, artifacts: Path, seconds: float, flash_attn_func: Any) -> None:
    import torch
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    from cmc.driver import front
    from cmc.runtime import load
    from cmc.tiles import visible_pairs

    key = bench.artifact_for(c.pattern)
    mask, defs = bench.ARTIFACTS[key]
    table = front(ROOT / mask, defs)
    pairs = sum(visible_pairs(table, n, p) for n, p in zip(c.lengths, c.params, strict=True))
    flops = 4.0 * bench.HEADS * bench.HEAD_DIM * pairs
    attn = load(bench._artifact_dir(artifacts, key))
    B, L, H, D = len(c.lengths), c.length, bench.HEADS, bench.HEAD_DIM
    q = torch.randn(B * L, H, D, device="cuda", dtype=torch.bfloat16)
    k, v = torch.randn_like(q), torch.randn_like(q)
    shape = (B, L, H, D)
    plan = attn.plan(batch=B, seq_len=L, **bench._cmc_params(c))
    systems: dict[str, Callable[[], Any]] = {
        "cmc": lambda: attn(q.view(shape), k.view(shape), v.view(shape), plan=plan)}
    fq, fk, fv = (x.view(shape).transpose(1, 2).contiguous() for x in (q, k, v))
    bm = create_block_mask(bench.flex_mask_mod(c, torch, "cuda"), B, None, L, L, device="cuda")
    torch._dynamo.reset()
    flex = torch.compile(flex_attention, dynamic=False)
    if flash_attn_func is not None:
        systems["flex-fa4"] = lambda: flex(fq, fk, fv, block_mask=bm,
                                           kernel_options={"BACKEND": "FLASH"})
        if c.pattern == "causal":
            systems["fa4"] = lambda: flash_attn_func(q.view(shape), k.view(shape),
                                                     v.view(shape), causal=True)
    for name, fn in systems.items():
        ms, mhz, watts = sustain(fn, seconds, torch)
        print(f"{c.pattern}/{c.length:<6} {name:9s} {flops / ms / 1e9:7.1f} TFLOP/s  "
              f"SM {mhz:6.0f} MHz  {watts:6.1f} W  "
              f"{flops / ms / 1e9 / (mhz / 1e3):6.1f} TFLOP/s per GHz  "
              f"{flops / ms / 1e9 / watts:5.3f} TFLOP/s per W", flush=True)
    torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
