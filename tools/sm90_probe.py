"""Where the sm90 kernel's cycles go: a clock64 probe build, read back after real launches.

`build` compiles the bench artifacts with -DCMC_PROBE=1 (cmc.build.build's extra options;
no file is edited) into out/ab/probe (the header's cycle counters, `cmc_probe` in each cubin; results stay correct, the clock reads
cost a little). `run`, on the device, launches each case, reads the counters back with
cuModuleGetGlobal and prints per key tile (consumers) and per item (producer) where the
cycles went:

    python tools/sm90_probe.py build                      # CPU
    python tools/sm90_probe.py build --patterns g_natten_clamped --tiling linear --out out/ab/probel
    python3 tools/sm90_probe.py run causal/32768 clear/32768   # device
    python3 tools/sm90_probe.py run g_video3d/4096 --artifacts out/abrun/probe  # a runtime copy

Consumer columns (per key tile, both warpgroups averaged): K full, V full, turn (waiting
for the other warpgroup's GEMM issue), QK (wait for own S), softmax, PV (wait for own O
after the softmax); per item: plan + Q wait, epilogue. Producer: slot wait and plan build
per item, K / V empty waits and TMA issue per tile. `busy` is the rest of the consumer's
time (issue, repack, rescale, bookkeeping).
"""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))

CONSUMER = {"plan": 0, "q": 1, "kfull": 2, "vfull": 3, "turn": 4, "qk": 5, "pv": 6,
            "epilogue": 7, "softmax": 8, "tiles": 9, "items": 10, "total": 11,
            "first_plan": 12, "mask": 13, "fetch_mask": 14, "ctas": 15}
PRODUCER = {"slot": 0, "plan": 1, "kempty": 2, "vempty": 3, "issue": 4, "walk": 5,
            "bslot": 6, "build": 7, "bitems": 8, "tiles": 9, "items": 10, "total": 11}


def build(dest: Path, keys: Sequence[str] = (), tiling: str = "auto") -> None:
    from sm90_ablate import compile_edited

    compile_edited(dest, lambda text: text, extra_options=("-DCMC_PROBE=1",), keys=keys, tiling=tiling)


def run(artifacts: Path, names: list[str], calls: int) -> None:
    import bench
    import numpy as np
    import torch
    from cuda.bindings import driver as cu

    from cmc.runtime import load

    lengths = sorted({int(c.split("/")[1]) for c in names})
    cases = {f"{c.pattern}/{c.length}": c
             for c in bench.make_cases(np.random.default_rng(20261202), tuple(lengths), suite="all",
                                       gen_lengths=tuple(lengths))}
    unknown = [n for n in names if n not in cases]
    if unknown:
        raise SystemExit(f"unknown case {', '.join(unknown)}; known at these lengths: "
                         f"{', '.join(sorted(cases))}")
    for name in names:
        c = cases[name]
        attn = load(bench._artifact_dir(artifacts, bench.artifact_for(c.pattern)))
        B, T = len(c.lengths), sum(c.lengths)
        q = torch.randn(T, bench.HEADS, bench.HEAD_DIM, device="cuda", dtype=torch.bfloat16)
        kw = bench.cmc_params(c)
        if c.jagged:
            cu_seq = torch.zeros(B + 1, dtype=torch.int32, device="cuda")
            cu_seq[1:] = torch.cumsum(torch.tensor(c.lengths, device="cuda",
                                                   dtype=torch.int32), 0)
            call = functools.partial(attn, q, q, q, cu_seqlens=cu_seq, max_len=max(c.lengths),
                                     **kw)
        else:
            qb = q.view(B, c.length, bench.HEADS, bench.HEAD_DIM)
            call = functools.partial(attn, qb, qb, qb, **kw)
        call()
        torch.cuda.synchronize()
        module = attn._kernels(torch.cuda.current_device()).kernels[("bf16", bench.HEAD_DIM)].module
        err, ptr, size = cu.cuModuleGetGlobal(module, b"cmc_probe")
        if err != cu.CUresult.CUDA_SUCCESS:
            raise SystemExit(f"{name}: no cmc_probe in the cubin (not a probe build?): {err}")
        cu.cuMemsetD8(ptr, 0, size)
        ev0, ev1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        ev0.record()
        for _ in range(calls):
            call()
        ev1.record()
        torch.cuda.synchronize()
        ms = ev0.elapsed_time(ev1) / calls
        host = np.zeros(size // 8, dtype=np.uint64)
        cu.cuMemcpyDtoH(host.ctypes.data, ptr, size)
        per_cta = host.reshape(-1, 3, 16).astype(np.float64)
        rows = per_cta.sum(axis=0)
        ctas = rows[1, 15] / calls  # CTAs per call (a row sums several without persistence)
        prod, cons = rows[0], (rows[1] + rows[2]) / 2
        tiles, items = max(cons[CONSUMER["tiles"]], 1.0), max(cons[CONSUMER["items"]], 1.0)
        per_tile = {k: cons[i] / tiles for k, i in CONSUMER.items()
                    if k in ("kfull", "vfull", "turn", "qk", "softmax", "pv")}
        per_item = {k: cons[i] / items for k, i in CONSUMER.items() if k in ("plan", "q", "epilogue")}
        total = cons[CONSUMER["total"]]
        busy = total - sum(cons[CONSUMER[k]] for k in
                           ("plan", "q", "kfull", "vfull", "turn", "qk", "pv", "epilogue",
                            "softmax"))
        print(f"{name}: {ms:.3f} ms/call, {tiles / calls:.0f} tiles and {items / calls:.0f} "
              f"items per call and warpgroup; consumer cycles per tile "
              f"{total / tiles:.0f}", flush=True)
        print("  consumer per tile: " + "  ".join(f"{k} {v:.0f}" for k, v in per_tile.items())
              + f"  busy {busy / tiles:.0f}")
        print("  consumer per item: " + "  ".join(f"{k} {v:.0f}" for k, v in per_item.items())
              + f"  (first item's plan {cons[12] / max(calls * ctas, 1.0):.0f} per CTA)"
              + f";  inside the softmax: mask {cons[13] / tiles:.0f} per tile;"
              + f"  busy: fetch_mask {cons[14] / tiles:.0f} per tile")
        print("  consumer share:    " + "  ".join(
            f"{k} {100 * cons[i] / total:.1f}%" for k, i in CONSUMER.items()
            if k not in ("tiles", "items", "total", "ctas")) + f"  busy {100 * busy / total:.1f}%")
        pt, pi = max(prod[PRODUCER["tiles"]], 1.0), max(prod[PRODUCER["items"]], 1.0)
        print(f"  producer per item: slot {prod[0] / pi:.0f}  plan {prod[1] / pi:.0f};"
              f"  per tile: kempty {prod[2] / pt:.0f}  vempty {prod[3] / pt:.0f}  "
              f"issue {prod[4] / pt:.0f}  walk {prod[5] / pt:.0f}; total share: "
              f"plan {100 * prod[1] / prod[11]:.1f}%  waits "
              f"{100 * (prod[0] + prod[2] + prod[3]) / prod[11]:.1f}%", flush=True)
        tot = per_cta[:, 1, CONSUMER["total"]]
        tot = tot[tot > 0]
        print(f"  balance: consumer cycles per CTA, mean / max {tot.mean() / tot.max():.3f} "
              f"over {len(tot)} CTAs", flush=True)
        bi = max(prod[PRODUCER["bitems"]], 1.0)
        print(f"  builders per item: slot wait {prod[6] / bi:.0f}  build {prod[7] / bi:.0f};"
              f"  per CTA: launch to first build {prod[13] / max(calls * ctas, 1.0):.0f}, first"
              f" build {prod[12] / max(calls * ctas, 1.0):.0f}, whole {prod[14] / max(calls * ctas, 1.0):.0f}"
              f" (loader whole {prod[11] / max(calls * ctas, 1.0):.0f})", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build")
    b.add_argument("--out", type=Path, default=ROOT / "out" / "ab" / "probe")
    b.add_argument("--patterns", nargs="*", default=[], help="only these artifacts (default all)")
    b.add_argument("--tiling", default="auto", help="the tile stage's choice (cmc compile --tiling)")
    r = sub.add_parser("run")
    r.add_argument("cases", nargs="+")
    r.add_argument("--artifacts", type=Path, default=ROOT / "out" / "ab" / "probe")
    r.add_argument("--calls", type=int, default=20)
    args = ap.parse_args()
    if args.cmd == "build":
        build(args.out, args.patterns, args.tiling)
    else:
        run(args.artifacts, args.cases, args.calls)


if __name__ == "__main__":
    main()
