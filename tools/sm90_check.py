#!/usr/bin/env python3
"""Build, check and time the sm90a wgmma kernel (templates/cmc/attn_fwd_sm90*.cuh).

Every mask in MASKS goes through cmc's own pipeline for sm_90a: samples/NAME.mask ->
cmc.driver front/back (the sm90 kernel and its tiling) -> cmc.build.build with
-DCMC_SM90_WATCHDOG (a pipeline deadlock traps after 2 s instead of hanging the GPU) ->
cmc.package into a temporary folder (tools/runtime_check.py). The build rejects a kernel
whose wgmma pipeline ptxas gave up (notes C7515-C7520). On the GPU the artifacts are loaded
with cmc.runtime.load and launched through Attention.__call__; parameters, the float64
reference and the comparisons come from tests/gpu/harness.py.

    python3 tools/sm90_check.py                   # everything (needs an sm_90 GPU)
    python3 tools/sm90_check.py --compile-only    # NVRTC + ptxas -v + SASS counts, no GPU
    python3 tools/sm90_check.py --no-bench        # correctness only
    python3 tools/sm90_check.py --masks causal,hstu --lengths 1,129

What it checks, per mask, variant (--variants), length n (--lengths; a jagged batch of two,
[n, 5n/7 + 3], GQA 4/2) and schedule (--sched: the work counter, the static stride):
- no NaN in O or LSE (both poisoned with NaN first);
- |O - ref| <= atol + rtol |ref| elementwise (bf16 1.5e-2, fp16 2.5e-3) and
  ||O - ref|| / ||ref|| < 1e-2, against masked softmax attention in float64;
- LSE within 2e-3 where a row sees a key; -inf and O exactly 0 where it sees none;
- nothing written past the last token of O or LSE;
- the work counter (desc.sched) left at zero after a dynamic-schedule launch;
- one case per variant without LSE (return_lse=False: desc.lse == 0).
Then (unless --no-bench) causal timings at B*L = 32768, H = 16, D = 128, bf16 against the
portable kernel (built with --kernel portable for sm_90a) and torch SDPA (flash), with the
sm90 output's distance from SDPA. Exit status 0 iff every case passed (2: a fatal error).
"""

from __future__ import annotations

import argparse
import functools
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

import runtime_check as rc  # noqa: E402

from cmc.driver import Options  # noqa: E402

MASKS = ("causal", "sliding_window", "hstu", "shared_prefix", "clear")
LENGTHS = (1, 100, 128, 129, 1000, 4096)
ARCH = "sm_90a"
HQ, HKV = 4, 2
# |O - O_ref| <= atol + rtol * |O_ref| elementwise (inputs ~ N(0, 1), so |O| <~ 4)
TOL_O = {"bf16": (1.5e-2, 1.5e-2), "fp16": (2.5e-3, 2.5e-3)}
TOL_LSE = 2e-3
WATCHDOG = "-DCMC_SM90_WATCHDOG"


def die(msg: str) -> None:
    print(f"FATAL: {msg}", flush=True)
    sys.exit(2)


# ================================================================================ build


def find_cuobjdump() -> str | None:
    p = shutil.which("cuobjdump")
    if p:
        return p
    try:
        import nvidia  # type: ignore

        for base in nvidia.__path__:
            for c in Path(base).glob("*/bin/cuobjdump"):
                return str(c)
    except Exception:
        pass
    return None


def sass_stats(cubin: bytes) -> str:
    tool = find_cuobjdump()
    if not tool:
        return "sass: cuobjdump not found"
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(cubin)
        path = f.name
    try:
        out = subprocess.run([tool, "--dump-sass", path], capture_output=True, text=True,
                             timeout=120)
    finally:
        os.unlink(path)
    sass = out.stdout
    n = lambda pat: len(re.findall(pat, sass))  # noqa: E731
    return (f"sass: HGMMA={n(r'HGMMA')} LDGSTS={n(r'LDGSTS')} SYNCS={n(r'SYNCS')} "
            f"USETMAXREG={n(r'USETMAXREG')} STL={n(r'STL')} LDL={n(r'LDL')} "
            f"MUFU.EX2={n(r'MUFU.EX2')}")


def build_artifacts(masks: list[str], variants: list[tuple[str, int]], dest: Path, *,
                    jobs: int = 1, portable: bool = False, compile_only: bool = False
                    ) -> tuple[dict[str, Path], Path | None]:
    """mask -> its sm90 artifact folder under dest/sm90 (the watchdog on), and with
    `portable` the causal portable kernel (bf16 d128, sm_90a) under dest/portable. Masks
    build in parallel threads (NVRTC releases the GIL). Prints one line per cubin."""
    dts = tuple(sorted({d for d, _ in variants}))
    hds = tuple(sorted({h for _, h in variants}))
    per = max(1, jobs // max(1, len(masks)))

    def one(m: str) -> tuple[Path, Any]:
        opts = Options(archs=(ARCH,), dtypes=dts, head_dims=hds, jobs=per, backward=False)
        return rc.build_artifact(ROOT / "samples" / f"{m}.mask", dest / "sm90", opts,
                                 variants=variants, extra_options=(WATCHDOG,))

    def port() -> tuple[Path, Any]:
        opts = Options(archs=(ARCH,), dtypes=("bf16",), head_dims=(128,), kernel="portable",
                       backward=False)
        return rc.build_artifact(ROOT / "samples" / "causal.mask", dest / "portable", opts)

    print(f"== NVRTC {ARCH}: {len(masks) * len(variants)} sm90 variant(s), {jobs} thread(s)",
          flush=True)
    out: dict[str, Path] = {}
    failed = []
    with ThreadPoolExecutor(max_workers=max(1, min(jobs, len(masks) + 1))) as ex:
        futs = {m: ex.submit(one, m) for m in masks}
        pfut = ex.submit(port) if portable else None
        for m, fut in futs.items():
            try:
                path, built = fut.result()
            except Exception as e:  # noqa: BLE001  (BuildError: NVRTC log, wgmma notes)
                failed.append(m)
                print(f"  BUILD FAIL {m}: {type(e).__name__}: {e}", flush=True)
                continue
            out[m] = path
            for c in built.cubins:
                tag = c.filename.split(".")[-2]
                line = f"  {m:15s} {tag:18s} {c.build_seconds:5.1f} s  {rc.ptxas_summary(c.log)}"
                if compile_only:
                    line += "  " + sass_stats(c.data)
                print(line, flush=True)
        ppath = pfut.result()[0] if pfut is not None else None
    if failed:
        die(f"{len(failed)} mask(s) failed to compile: {', '.join(failed)}")
    return out, ppath


# ================================================================================ cases


def jagged(n: int) -> list[int]:
    return [n, max(1, n * 5 // 7 + 3)]


def check_case(torch: Any, attn: Any, mask: Any, dt: str, hd: int, lens: list[int],
               with_lse: bool, mode: str, variant: int) -> tuple[bool, str]:
    c = rc.Case(lens, HQ, HKV, hd, dt, variant=variant, pad=128, with_lse=with_lse,
                planned=variant % 2 == 1, seed=variant)

    def counter() -> list[str]:
        left = rc.counters_left(attn)
        return [] if not any(left) else [f"work counter left at {left}, not zero"]

    kw = dict(rel_tol=1e-2, lse_tol=TOL_LSE, elementwise=TOL_O[dt])
    if mode == "static":
        with rc.static_schedule(attn):
            r = rc.run_case(torch, attn, mask, c, **kw)  # type: ignore[arg-type]
    else:
        r = rc.run_case(torch, attn, mask, c, after=counter, **kw)  # type: ignore[arg-type]
    return r.ok, r.line()


# ================================================================================= bench


def median(torch: Any, call: Any) -> float:
    """Median seconds of 30 calls after 5 warm-up calls."""
    return sorted(rc.time_calls(torch, call, 30, 5))[15]


def bench(torch: Any, kernels: dict[str, Any]) -> None:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    H, D = 16, 128
    print("\n== timing: causal, B*L = 32768, H = 16, D = 128, bf16 "
          "(median of 30 after warm-up; TFLOP/s = 4*B*H*D*visible_pairs / time)", flush=True)
    for L in (4096, 32768):
        B = 32768 // L
        flops = 4.0 * H * D * B * L * (L + 1) // 2
        torch.manual_seed(1)
        q, k, v = (torch.randn(B, L, H, D, device="cuda", dtype=torch.bfloat16)
                   for _ in range(3))
        o = torch.empty_like(q)
        res = {}
        for label, attn in kernels.items():
            p = attn.plan(batch=B, seq_len=L)
            res[label] = median(torch, functools.partial(attn, q, k, v, out=o, plan=p))
            if label == "sm90":  # sanity of the timed run against SDPA
                ref = torch.nn.functional.scaled_dot_product_attention(
                    q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
                attn(q, k, v, out=o, plan=p)
                torch.cuda.synchronize()
                err = (o.float() - ref.transpose(1, 2).float()).abs().max().item()
                print(f"  L={L}: sm90 vs SDPA max |dO| = {err:.3g}", flush=True)
        try:
            qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                res["sdpa-flash"] = median(torch, functools.partial(
                    torch.nn.functional.scaled_dot_product_attention, qt, kt, vt,
                    is_causal=True))
        except Exception as e:  # noqa: BLE001
            print(f"  sdpa flash unavailable: {e}")
        for label, t in res.items():
            print(f"  L={L:6d} B={B:2d} {label:11s} {t * 1e3:8.3f} ms  "
                  f"{flops / t / 1e12:7.1f} TFLOP/s", flush=True)


# ================================================================================== main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--compile-only", action="store_true",
                    help="NVRTC + resources + SASS, no GPU")
    ap.add_argument("--no-bench", action="store_true")
    ap.add_argument("--bench-only", action="store_true")
    ap.add_argument("--masks", default=",".join(MASKS))
    ap.add_argument("--sched", choices=("dynamic", "static", "both"), default="both",
                    help="the sm90 schedule: the work counter (desc.sched), the static stride")
    ap.add_argument("--lengths", default=",".join(map(str, LENGTHS)))
    ap.add_argument("--variants", default="bf16_d64,bf16_d128,fp16_d64,fp16_d128")
    ap.add_argument("--jobs", type=int, default=min(16, os.cpu_count() or 1))
    args = ap.parse_args(argv)
    args.mask_list = [m for m in args.masks.split(",") if m]
    args.modes = ("dynamic", "static") if args.sched == "both" else (args.sched,)
    args.length_list = [int(x) for x in args.lengths.split(",") if x]
    args.variant_list = [(v.split("_d")[0], int(v.split("_d")[1]))
                         for v in args.variants.split(",") if v]
    if args.bench_only:
        args.mask_list, args.variant_list = ["causal"], [("bf16", 128)]
    elif not args.no_bench and "causal" in args.mask_list and \
            ("bf16", 128) not in args.variant_list:
        args.variant_list.append(("bf16", 128))
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    t_start = time.perf_counter()
    masks, variants = args.mask_list, args.variant_list
    want_portable = not args.compile_only and not args.no_bench and "causal" in masks
    with tempfile.TemporaryDirectory(prefix="sm90_check-") as tmp:
        paths, portable = build_artifacts(masks, variants, Path(tmp), jobs=args.jobs,
                                          portable=want_portable,
                                          compile_only=args.compile_only)
        if args.compile_only:
            print(f"compiled {len(paths) * len(variants)} variant(s) in "
                  f"{time.perf_counter() - t_start:.1f} s")
            return 0
        failed = run_gpu(args, paths, portable)
    print(f"total {time.perf_counter() - t_start:.1f} s", flush=True)
    return 0 if failed == 0 else 1


def run_gpu(args: argparse.Namespace, paths: dict[str, Path], portable: Path | None) -> int:
    import torch

    from cmc.driver import load_mask
    from cmc.runtime import load

    if not torch.cuda.is_available():
        die("no CUDA device visible to torch")
    if torch.cuda.get_device_capability() != (9, 0):
        die(f"needs an sm_90 GPU, found {torch.cuda.get_device_name()}")
    torch.zeros(1, device="cuda")  # torch's primary context, shared with the runtime
    passed = failed = 0
    attns = {m: load(p) for m, p in paths.items()}
    if not args.bench_only:
        print("\n== correctness (batch 2 jagged, Hq=4/Hkv=2, NaN-poisoned outputs, float64 "
              "reference)", flush=True)
        variant = 0
        for m in args.mask_list:
            mask = load_mask(ROOT / "samples" / f"{m}.mask")
            lengths = args.length_list
            cases = [(n, True, mode) for n in lengths for mode in args.modes]
            if lengths:  # desc.lse == 0
                cases.append((lengths[min(3, len(lengths) - 1)], False, args.modes[0]))
            for dt, hd in args.variant_list:
                for n, with_lse, mode in cases:
                    lens = jagged(n)
                    variant += 1
                    try:
                        ok, msg = check_case(torch, attns[m], mask, dt, hd, lens, with_lse,
                                             mode, variant)
                    except Exception as e:  # noqa: BLE001
                        ok, msg = False, f"EXCEPTION {type(e).__name__}: {e}"
                    passed += ok
                    failed += not ok
                    tag = ("" if with_lse else " lse=0") + f" {mode}"
                    print(f"  {'PASS' if ok else 'FAIL'} {m:15s} {dt}_d{hd:<3d} lens={lens}"
                          f"{tag}: {msg}", flush=True)
                    if not ok and "EXCEPTION" in msg and "illegal" in msg.lower():
                        die("the GPU context is gone (illegal access); stopping")
        print(f"{passed} passed, {failed} failed", flush=True)
    if not args.no_bench and "causal" in attns:
        kernels = {"sm90": attns["causal"]}
        if portable is not None:
            kernels["portable"] = load(portable)
        bench(torch, kernels)
    return failed


if __name__ == "__main__":
    sys.exit(main())
