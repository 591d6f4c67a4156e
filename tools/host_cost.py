"""Host time of one runtime call (device).

`queued`: a short sleep kernel keeps the GPU busy, so each batch of calls only queues and
the wall time per call is the Python path (checks, descriptor, tensor maps, launch), not
the kernel. Batches are 8 calls: the pinned staging ring lets calls with host parameters
and no plan run 8 launches ahead of the GPU, no more. `back to back`: a small problem
called in a loop without the sleep, wall time per call including the GPU, which is what
a caller with small launches sees. The backward's host path is timed the same way
("backward ..." rows: attn.backward on a planned forward's out and LSE).

`--split LxB` (GPU time, not host time): where the benchmark's backward column, (forward +
backward through autograd) - forward, spends more than the kernels' sequence. Medians of
CUDA-event timings at the benchmark's shape [B, L, 16, 128] of the forward with LSE, of
attn.backward alone, and of the autograd step, so that the runtime's part and autograd's part
of the gap are told apart (run 15: 3.45 ms of backward through the benchmark against 3.18 ms of
bwd_kernel_check's pre, kv, post at causal 4K x 8):

    python3 tools/host_cost.py --artifacts out/gpu_new causal hstu
    python3 tools/host_cost.py --artifacts out/benchrun causal --split 4096x8
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
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(ROOT / "benchmarks"))

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


def params_of(name: str, b: int, n: int) -> dict[str, object]:
    """Run-time parameters for the samples that have them (others: none)."""
    return {"hstu": {"n_targets": [n // 8] * b},
            "shared_prefix": {"prompt_len": [n // 4] * b,
                              "responses": [[n // 4, n // 2, 3 * n // 4]] * b}}.get(name, {})


def calls_of(attn, name: str, torch, b: int, n: int, h: int, d: int
             ) -> dict[str, Callable[[], object]]:
    import numpy as np

    params = params_of(name, b, n)
    q = torch.randn((b, n, h, d), device="cuda").bfloat16()
    k, v = torch.randn_like(q), torch.randn_like(q)
    plan = attn.plan(batch=b, seq_len=n, **params)
    out = torch.empty_like(q)
    checked = np.float32(1 / d ** 0.5)  # a scale that is not a Python number: never replayed
    dout = torch.randn_like(q)
    fwd_out, lse = attn(q, k, v, plan=plan, return_lse=True)
    calls = {
        "plan (replayed)": lambda: attn(q, k, v, plan=plan),
        "plan, out= (replayed)": lambda: attn(q, k, v, plan=plan, out=out),
        "plan, lse (replayed)": lambda: attn(q, k, v, plan=plan, return_lse=True),
        "plan (checked)": lambda: attn(q, k, v, plan=plan, scale=checked),
        "no plan (checked)": lambda: attn(q, k, v, **params),
        "torch.empty_like alone": lambda: torch.empty_like(q),
    }
    if getattr(attn, "has_backward", False):
        calls["backward, plan"] = lambda: attn.backward(dout, q, k, v, fwd_out, lse, plan=plan)
        calls["backward, plan, det."] = lambda: attn.backward(dout, q, k, v, fwd_out, lse, plan=plan,
                                                              deterministic=True)
    return calls


def median_ms(fn: Callable[[], object], torch) -> float:
    """Median of 20 CUDA-event timings of fn, queued (runtime_check.time_calls), in ms."""
    from runtime_check import time_calls

    return statistics.median(time_calls(torch, fn)) * 1e3


def split_lines(name: str, fwd: float, bwd: float, step: float) -> list[str]:
    """The --split report: the runtime's backward beside the benchmark's way of taking it."""
    return [f"  {name}: forward (LSE) {fwd:.3f} ms, attn.backward {bwd:.3f} ms, autograd step "
            f"{step:.3f} ms",
            f"    benchmark's backward (step - forward) {step - fwd:.3f} ms: attn.backward "
            f"{bwd:.3f} + autograd and the op's own work {step - fwd - bwd:+.3f}"]


def split(attn, name: str, torch, length: int, batch: int) -> list[str]:
    """--split for one artifact at [batch, length, 16, 128] bf16."""
    shape = (batch, length, 16, 128)
    q, k, v, dout = (torch.randn(shape, device="cuda").bfloat16() for _ in range(4))
    plan = attn.plan(batch=batch, seq_len=length, **params_of(name, batch, length))
    out, lse = attn(q, k, v, plan=plan, return_lse=True)
    qg, kg, vg = (x.detach().clone().requires_grad_(True) for x in (q, k, v))

    def step() -> None:
        o = attn(qg, kg, vg, plan=plan)
        (o[0] if isinstance(o, tuple) else o).backward(dout)
        qg.grad = kg.grad = vg.grad = None

    return split_lines(f"{name} {length}x{batch}",
                       median_ms(lambda: attn(q, k, v, plan=plan, return_lse=True), torch),
                       median_ms(lambda: attn.backward(dout, q, k, v, out, lse, plan=plan), torch),
                       median_ms(step, torch))


def artifact_dir(root: Path, name: str) -> Path:
    """The artifact folder of `name` under root: root/name (tools/gpu_artifacts.py's layout),
    or its one subfolder with a manifest (bench.py --compile's root/CASE/MASK, as carried in
    out/benchrun), so that --split runs on the bench's build without an artifact build."""
    top = root / name
    if (top / "manifest.json").is_file():
        return top
    import bench

    return bench._artifact_dir(root, name)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="+")
    ap.add_argument("--artifacts", type=Path, required=True)
    ap.add_argument("--batches", type=int, default=40)
    ap.add_argument("--split", metavar="LxB", help="GPU times of the backward's parts instead")
    args = ap.parse_args()
    import torch

    from cmc.runtime import load

    if args.split:
        length, batch = (int(x) for x in args.split.split("x"))
        for name in args.names:
            for line in split(load(artifact_dir(args.artifacts, name)), name, torch, length, batch):
                print(line, flush=True)
        return

    shapes = {"queued": (4, 1024, 16, 128), "back to back": (1, 512, 8, 128)}
    print(f"us per call; queued: median of {args.batches} batches of {BATCH} behind a sleep "
          f"kernel; back to back: 400 calls, GPU included; bf16 [B, L, H, D] = {shapes}")
    for name in args.names:
        attn = load(artifact_dir(args.artifacts, name))
        queued = calls_of(attn, name, torch, *shapes["queued"])
        small = calls_of(attn, name, torch, *shapes["back to back"])
        for label in queued:
            queued[label]()
            small[label]()
            print(f"  {name:14s} {label:24s} queued {queued_us(queued[label], args.batches, torch):8.1f}"
                  f"   back to back {back_to_back_us(small[label], 400, torch):8.1f}", flush=True)


if __name__ == "__main__":
    main()
