#!/usr/bin/env python3
"""Ablated builds of the sm_90a backward's kv kernel (bwd_kv_sm90), timed beside the real one,
for finding where its time goes (timing only: the ablated kernels compute wrong gradients).

Each ablation removes one part of the kv kernel's per-item loop (templates/cmc/
attn_bwd_sm90.cuh) by a textual edit of the generated .cu, in memory, that must match the
given number of times; no tracked file is touched. The builds are bwd_kernel_check's own
(`build_variant` with an edit), the timing its `timing` (causal, H=16, D=128, bf16, atomic and
deterministic, each role alone too). The kv time of a variant without part X bounds what
removing X's cost could give. Run on the GPU machine from the repository root:

    CMC_ARCH=sm_90a python3 tools/bwd_ablate.py                 # every ablation
    CMC_ARCH=sm_90a python3 tools/bwd_ablate.py nored nodqgemm  # some
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(ROOT))

# name: (what it removes, [(old, new, times old must occur)])
ABLATIONS: dict[str, tuple[str, list[tuple[str, str, int]]]] = {
    "nored": ("the atomic dQ's red.global.add (the dS^T store, barrier and dQ GEMM stay)",
              [("    if (q >= 0) {\n      float* row = acc", "    if (q < -1) {\n      float* row = acc",
                1)]),
    "nodqgemm": ("the atomic dQ's GEMM (its wait and the red.global.add of zeros stay)",
                 [("    ss_n64<BF16, 1, 1>(dq, gdesc(dqA + kk * 2048, kBN * 128, 1024), "
                   "gdesc(dqB + kk * 2048, kBN * 128, 1024), kk);\n", "", 1)]),
    "noexp": ("the 2 exponentials per element of P^T become plain FMAs",
              [("float p0 = ex2(fmaf(s[4 * jj + e], sl2, -off)), p1 = ex2(fmaf(s[4 * jj + 2 + e], "
                "sl2, -off));",
                "float p0 = (fmaf(s[4 * jj + e], sl2, -off)), p1 = (fmaf(s[4 * jj + 2 + e], "
                "sl2, -off));", 2)]),
    "nosync": ("the per-item __syncthreads of the linear loop (the warpgroups drift apart)",
               [("    __syncthreads();       // everyone's; everyone is done with stage buf ^ 1 "
                 "and dS^T\n", "", 1)]),
    "noload": ("the next item's copies of Q, dO, LSE and Dsum (stale stages are reused)",
               [("    if (jn >= 0) kv_issue<typename H::desc_t, D>(base, buf ^ 1,",
                 "    if (jn < -1) kv_issue<typename H::desc_t, D>(base, buf ^ 1,", 1)]),
}


def apply(text: str, edits: list[tuple[str, str, int]]) -> str:
    for old, new, times in edits:
        if text.count(old) != times:
            raise SystemExit(f"ablation pattern found {text.count(old)} times, not {times}: "
                             f"{old!r}")
        text = text.replace(old, new)
    return text


def _build(name: str, arch: str):
    import bwd_kernel_check as bkc

    edits = ABLATIONS[name][1] if name != "base" else []
    return bkc.build_variant("causal", "bf16", 128, arch, True,
                             edit=(lambda t: apply(t, edits)) if edits else None)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("names", nargs="*", help=f"ablations (default all: {', '.join(ABLATIONS)})")
    ap.add_argument("--lengths", nargs="*", default=["4096x8", "16384x2"],
                    help="LxB pairs to time (default 4096x8 16384x2)")
    opts = ap.parse_args()
    names = opts.names or list(ABLATIONS)
    for n in names:
        if n not in ABLATIONS:
            raise SystemExit(f"unknown ablation {n!r}; known: {', '.join(ABLATIONS)}")
    arch = os.environ.get("CMC_ARCH", "sm_90a")
    if arch != "sm_90a":
        raise SystemExit("bwd_kv_sm90 is built for sm_90a only (CMC_ARCH=sm_90a)")
    t0 = time.perf_counter()
    variants = ["base", *names]
    with ProcessPoolExecutor(max_workers=min(len(variants), os.cpu_count() or 1)) as pool:
        futs = {n: pool.submit(_build, n, arch) for n in variants}
        built = {n: f.result() for n, f in futs.items()}
    import bwd_kernel_check as bkc

    if bkc.kc.device_arch() != arch:
        raise SystemExit(f"device is {bkc.kc.device_arch()}, built for {arch}")
    print(f"built {len(built)} variants in {time.perf_counter() - t0:.1f} s")
    for n in variants:
        regs = {s: r for s, r in built[n][1].items() if "bwd_kv_sm90" in s}
        print(f"  {n:9s} {ABLATIONS[n][0] if n != 'base' else 'the shipped kernel':84s} {regs}")
    from cmc.abi import descriptor_layout

    table = bkc.table_of("causal")
    lay = descriptor_layout(table.mask)
    for lb in opts.lengths:
        L, B = (int(x) for x in lb.split("x"))
        for n in variants:
            for line in bkc.timing(bkc.Bwd(built[n][0]), lay, table, "bf16", L, B,
                                   label=f"{n:9s} "):
                print(line, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
