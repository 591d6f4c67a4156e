#!/usr/bin/env python3
"""GPU check of the backward kernels: the portable ones (templates/cmc/attn_bwd_portable.cuh,
`bwd_kernel="portable"`), or with --sm90 the sm_90a default, issue 21.

Run on the GPU machine from the repository root:  python3 tools/bwd_kernel_check.py
(--no-timing skips the causal timing; --sm90 builds with `bwd_kernel="lockstep"`, so the kv
role is the sm_90a kind bwd_kv_sm90 (templates/cmc/attn_bwd_sm90.cuh: wgmma, 128-key tiles,
256 threads) and the dq role bwd_dq_sm90 (templates/cmc/attn_bwd_sm90_dq.cuh: wgmma, 128-row
tiles, 256 threads), checks them on the same cases and modes (the default build's kv on
linear tiles is the warp-specialised bwd_kv_sm90_ws: its GPU checks are tools/bwd_ablate.py
ws --check and tests/gpu), and times portable and sm90 side by side, atomic and
deterministic, each role alone too, at causal L=4096 B=8 and L=16384 B=2, H=16, D=128,
bf16). For each case: the real pipeline (cmc.driver front ->
back with backward on, the portable forward -> cmc.build.build) for the device's arch (builds
in parallel processes first), so the cubins, symbols, threads and shared memory are exactly
what `cmc compile` ships; the portable forward cubin of the same build for O and LSE, then pre -> kv -> post (non-deterministic) and pre -> kv -> dq
(deterministic, twice: bitwise equal), against float64 torch autograd of masked softmax
attention on the dense mask of cmc.oracle. Outputs and workspaces are NaN-poisoned first.
Checks: no NaN, relative error (Frobenius) < 1e-2 for dq, dk, dv, dK = dV = 0 exactly for
keys no query sees, dQ = 0 exactly for rows that see nothing. A table at the end; exit 1 on
any failure.
"""

from __future__ import annotations

import argparse
import ctypes
import dataclasses
import importlib.util
import math
import os
import sys
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))
sys.path.append(str(ROOT / "benchmarks"))  # bench's parameter rules (_timing_params)

import numpy as np  # noqa: E402
import torch  # noqa: E402
from cuda.bindings import driver as cu  # noqa: E402


def _load_kernel_check():
    spec = importlib.util.spec_from_file_location("kernel_check", ROOT / "tools" / "kernel_check.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules["kernel_check"] = mod
    spec.loader.exec_module(mod)
    return mod


kc = _load_kernel_check()  # seq_params, dense_mask, descriptor_values, _ok, device_arch

LOG2E = 1.4426950408889634
REL_TOL = 1e-2
RESIDUAL = "mask residual\nallow k <= q and (q * k) % 7 != 3\n"
MASKS = {  # name -> (sample path or mask text, defines)
    "causal": ("samples/causal.mask", {}),
    "hstu": ("samples/hstu.mask", {}),
    "shared_prefix": ("samples/shared_prefix.mask", {}),
    "document_causal": ("samples/document_causal.mask", {}),
    "clear": ("samples/clear.mask", {"TEXT": 64, "W": 32, "R": 5}),
    # patches from len 1024 (bwd_ablate's patch cases; tests/gpu/test_backward_patch_gpu.py)
    "clear_patch": ("samples/clear.mask", {"TEXT": 77, "W": 128, "R": 16}),
    "residual": (RESIDUAL, {}),
    # bwd_ablate --mask: a disc in a 96-wide grid, every tile partial, linear tiles below len
    # 6222 (run 14: backward 0.36 x cuDNN flex at 4K)
    "grid96": ("benchmarks/generality/grid_text.mask", {"TEXT": 77, "W": 96, "R": 40}),
    # bwd_ablate --mask: the clamped 13 x 13 NATTEN window (W 96), linear tiles below len
    # 6144; its kv evaluates the transposed predicate per element on partial items outside the
    # band (12 grid families: run 17, backward 0.36 x cuDNN flex at 4K)
    "natten": ("benchmarks/generality/natten_clamped.mask", {}),
    # bwd_ablate --mask: grid96 with its backward on the forward's 8 x 16 patches (--tiling
    # 8x16): the patch kinds on linear tiles below len 6222, on patches above (run 21: 0.90 x
    # grid96's linear kinds at 4K, 1.08 x at 16K through the runtime)
    "grid96p": ("benchmarks/generality/grid_text.mask", {"TEXT": 77, "W": 96, "R": 40}),
    # bwd_ablate --mask: packed documents under a causal window of 1000 (run 51: backward 0.84 /
    # 0.86 x cuDNN flex, per visible pair 0.66 of causal's rate); the harness's segment starts
    "doc_window": ("benchmarks/generality/doc_window.mask", {}),
}
# (mask, dtype, head dim) variants to build; every case runs GQA 4/2 on a jagged batch.
VARIANTS = [
    ("causal", "bf16", 64), ("causal", "bf16", 128), ("causal", "fp16", 64), ("causal", "fp16", 128),
    ("hstu", "bf16", 128), ("hstu", "fp16", 64),
    ("shared_prefix", "bf16", 64), ("shared_prefix", "fp16", 128),
    ("document_causal", "bf16", 128),
    ("clear", "bf16", 64), ("clear", "fp16", 128),
    ("residual", "bf16", 128), ("residual", "fp16", 64),
    # a grid mask whose kv items are masked by span words of grid rows (cmc_bwd_kv_span_word)
    ("grid96", "bf16", 128),
]
LENS = [1, 17, 130, 600]
# --sm90 also runs the sm_90a kinds on CLEAR's patches (TILED_MASKS: LENS stay below
# every min_len, and the portable forward's builds are linear), on
# tests/gpu/test_backward_patch_gpu.py's jagged batch: 1500 and 2133 tokens are past min_len
# 1101, 77 and 1101 are linear tiles.
PATCH_VARIANTS = [("clear_patch", "bf16", 128), ("clear_patch", "fp16", 64)]
# Masks whose backward kinds are built on a tiling as an artifact has them, with the --tiling
# value that gives it: the tile stage's backward tiling (CLEAR's patches, natten's linear tiles
# with band masks: tiling.choose_backward_tiling), or patches asked for (grid96p).
TILED_MASKS = {"clear_patch": "auto", "natten": "auto", "grid96p": "8x16"}
PATCH_LENS = [1500, 77, 2133, 1101]


def table_of(name: str):
    from cmc.check import check
    from cmc.driver import front
    from cmc.lower import lower
    from cmc.parse import parse

    src, defines = MASKS[name]
    if src.endswith(".mask"):
        return front(ROOT / src, defines)
    return lower(check(parse(src, f"{name}.mask"), defines))


def build_variant(name: str, dtype: str, d: int, arch: str, sm90: bool = False,
                  edit: Callable[[str], str] | None = None):
    """Worker: {role: (cubin, symbol, threads, dynamic smem, block_m, grid y, grid x)} of the
    forward ("fwd") and the four backward kernels (grid x: the manifest's expression over
    max_len, which a patch tiling's sm90 kinds need), and {symbol: (registers, spill st,
    spill ld)}.
    sm90: the kv role is bwd_kv_sm90 and the dq role bwd_dq_sm90 (cmc.build refuses wgmma
    pipeline notes C7515-C7520, so a built variant has none). edit: applied to the .cu text
    before the build (tools/bwd_ablate.py). The forward is the portable kernel, which the
    tile stage does not follow, so the backward kinds are on linear tiles; sm90 builds of
    TILED_MASKS are built on the tile stage's backward tiling instead (patches for CLEAR,
    band-masked linear tiles for natten), as a default compile builds them, and the forward
    still comes from the portable build."""
    from cmc.build import build
    from cmc.driver import Options, back
    from cmc.kernels import Pass, spec
    from cmc.package import grid_rule

    opts = Options(archs=(arch,), dtypes=(dtype,), head_dims=(d,), kernel="portable",
                   backward=True, cache=False, bwd_kernel="lockstep" if sm90 else "portable",
                   short_kernels=False)
    sources = [back(table_of(name), opts)]
    if sm90 and name in TILED_MASKS:
        auto = back(table_of(name), dataclasses.replace(opts, kernel="auto", tiling=TILED_MASKS[name]))
        sources = [dataclasses.replace(sources[0], variants=tuple(
                       v for v in sources[0].variants if spec(v.kernel).pass_ is Pass.FORWARD)),
                   dataclasses.replace(auto, variants=tuple(
                       v for v in auto.variants if spec(v.kernel).pass_ is Pass.BACKWARD))]
    kernels, res = {}, {}
    for source in sources:
        if edit is not None:
            source = dataclasses.replace(source, text=edit(source.text))
        built = build(source, archs=(arch,), jobs=1, cache=False)
        for v in built.source.variants:
            s = spec(v.kernel)
            c = next(c for c in built.cubins if c.symbol == v.symbol)
            kernels[s.role] = (c.data, v.symbol, v.threads, v.smem_bytes, v.block_m, s.grid[1],
                               grid_rule(v)[0])
            r = c.resources
            res[v.symbol] = (r.registers, r.spill_stores, r.spill_loads)
    return kernels, res


_MODULES: list = []


def get_func(cubin: bytes, symbol: str, smem: int):
    mod = kc._ok(cu.cuModuleLoadData(cubin), "cuModuleLoadData")
    _MODULES.append(mod)
    f = kc._ok(cu.cuModuleGetFunction(mod, symbol.encode()), f"cuModuleGetFunction {symbol}")
    kc._ok(cu.cuFuncSetAttribute(
        f, cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem),
        "cuFuncSetAttribute")
    return f


def launch(func, grid, threads: int, smem: int, params: list[bytes]) -> None:
    bufs = [ctypes.create_string_buffer(p, len(p)) for p in params]
    argv = (ctypes.c_void_p * len(bufs))(*[ctypes.addressof(b) for b in bufs])
    stream = cu.CUstream(torch.cuda.current_stream().cuda_stream)
    kc._ok(cu.cuLaunchKernel(func, grid[0], grid[1], grid[2], threads, 1, 1, smem, stream,
                             ctypes.addressof(argv), 0), "cuLaunchKernel")


def acc_rows(total: int, batch: int) -> int:
    """dq_accum's rows for either layout: token-major needs total, CMC_DQ_BLOCK64 64 per block
    of ceil(total / 64) + batch (attn_bwd_portable.cuh dq_block)."""
    return 64 * (-(-total // 64) + batch)


def pack_args(do, dq, dk, dv, acc, dsum, total: int, deterministic: bool) -> bytes:
    """cmc_bwd_args packed from the layout the manifest's backward.args is written from."""
    from cmc.abi import BWD_FLAG_DETERMINISTIC, bwd_args_layout

    vals = {"dout": do.data_ptr(), "dq": dq.data_ptr(), "dk": dk.data_ptr(),
            "dv": dv.data_ptr(), "dq_accum": acc.data_ptr(), "dsum": dsum.data_ptr(),
            "total_tokens": total, "flags": BWD_FLAG_DETERMINISTIC if deterministic else 0}
    for n, t in (("dout", do), ("dq", dq), ("dk", dk), ("dv", dv)):
        vals[f"{n}_stride_tok"], vals[f"{n}_stride_head"] = t.stride(0), t.stride(1)
    return bwd_args_layout().pack(vals)


class Bwd:
    """The four backward kernels of one variant and their launch shapes."""

    def __init__(self, kernels: dict):
        from cmc.runtime.params import parse_grid_expr

        self.k = {r: (get_func(cub, sym, smem), threads, smem, parse_grid_expr(gx), heads)
                  for r, (cub, sym, threads, smem, _, heads, gx) in kernels.items() if r != "fwd"}
        self.smem_kv = self.k["kv"][2]

    def grid(self, role: str, max_len: int, hq: int, hk: int, batch: int) -> tuple[int, int, int]:
        """The grid rule of the role's spec (the manifest's)."""
        _, _, _, gx, heads = self.k[role]
        return (gx({"max_len": max_len}), hk if heads == "heads_kv" else hq, batch)

    def launch_role(self, role: str, desc: bytes, args: bytes, max_len: int, hq: int, hk: int,
                    batch: int) -> None:
        """One kernel, on its grid (Bwd.grid)."""
        f, threads, smem, _, _ = self.k[role]
        launch(f, self.grid(role, max_len, hq, hk, batch), threads, smem, [desc, args])

    def run(self, desc: bytes, args: bytes, max_len: int, hq: int, hk: int, batch: int,
            deterministic: bool) -> None:
        from cmc.kernels import BWD_SEQUENCE

        for role in BWD_SEQUENCE["deterministic" if deterministic else "atomic"]:
            self.launch_role(role, desc, args, max_len, hq, hk, batch)


def reference(lens, q, k, v, do, masks, scale):
    """float64 autograd of masked softmax attention: (dq, dk, dv) [T, H, D]."""
    hq, hk = q.shape[1], k.shape[1]
    qd, kd, vd = (x.double().detach().requires_grad_(True) for x in (q, k, v))
    outs, t0 = [], 0
    for n, m in zip(lens, masks, strict=True):
        qs = qd[t0:t0 + n].transpose(0, 1)
        ks = kd[t0:t0 + n].transpose(0, 1).repeat_interleave(hq // hk, 0)
        vs = vd[t0:t0 + n].transpose(0, 1).repeat_interleave(hq // hk, 0)
        mt = torch.from_numpy(m).to(q.device)
        s = torch.where(mt, (qs @ ks.transpose(1, 2)) * scale, torch.full_like(qs[..., :1], -1e30))
        mx = s.amax(-1, keepdim=True).detach()
        p = torch.exp(s - mx) * mt
        lsum = p.sum(-1, keepdim=True)
        o = (p @ vs) / torch.where(lsum > 0, lsum, torch.ones_like(lsum))
        outs.append(o.transpose(0, 1))
        t0 += n
    out = torch.cat(outs, 0)
    (out * do.double()).sum().backward()
    return qd.grad, kd.grad, vd.grad


def rel(got, ref) -> float:
    return float((got.double() - ref).norm() / ref.norm().clamp_min(1e-12))


def run_case(name, dtype, d, built, table, lens: list[int] | None = None) -> list[tuple[str, bool, str]]:
    """Forward (portable) then the backward sequence in each mode, against the float64
    reference, on a jagged batch of `lens` (default LENS)."""
    lens = lens or LENS
    kernels, _ = built
    fcub, fsym, fthreads, fsmem, fbm, _, _ = kernels["fwd"]
    mask = table.mask
    tdt = torch.bfloat16 if dtype == "bf16" else torch.float16
    hq, hk = 4, 2
    pb = kc.Problem(lens, hq, hk, d, tdt)
    per_seq = [kc.seq_params(mask, n, b) for b, n in enumerate(lens)]
    for ps in per_seq[1:]:  # scalar params: one value per launch
        for p in mask.params:
            if p.kind == "scalar":
                ps[p.name] = per_seq[0][p.name]
    masks = [kc.dense_mask(mask, n, ps) for n, ps in zip(lens, per_seq, strict=True)]
    total = sum(lens)
    qt, kt, vt, o, lse = kc.make_inputs(pb, 1234 + d)
    keep: list = []
    vals = kc.descriptor_values(mask, pb, qt, kt, vt, o, lse, per_seq, keep)
    vals.setdefault("sched", 0)  # kernel_check predates the work-counter field
    desc = _LAYOUTS[(name, dtype, d)].pack(vals)
    ffunc = get_func(fcub, fsym, fsmem)
    launch(ffunc, (-(-max(lens) // fbm), hq, len(lens)), fthreads, fsmem, [desc])
    g = torch.Generator(device="cuda").manual_seed(99)
    do = torch.randn(total, hq, d, device="cuda", generator=g).to(tdt)
    bwd = Bwd(kernels)
    ref = reference(lens, qt, kt, vt, do, masks, 1.0 / math.sqrt(d))

    seen_k = np.concatenate([m.any(0) for m in masks])  # keys some query sees
    sees_q = np.concatenate([m.any(1) for m in masks])  # rows that see some key
    results = []
    det_runs = []
    for mode in ("atomic", "det", "det"):
        deterministic = mode == "det"
        dq = torch.full((total, hq, d), float("nan"), device="cuda", dtype=tdt)
        dk = torch.full((total, hk, d), float("nan"), device="cuda", dtype=tdt)
        dv = torch.full((total, hk, d), float("nan"), device="cuda", dtype=tdt)
        acc = torch.full((acc_rows(total, len(lens)), hq, d), float("nan"), device="cuda",
                         dtype=torch.float32)
        dsum = torch.full((2, hq, total), float("nan"), device="cuda", dtype=torch.float32)
        args = pack_args(do, dq, dk, dv, acc, dsum, total, deterministic)
        bwd.run(desc, args, max(lens), hq, hk, len(lens), deterministic)
        kc._ok(cu.cuCtxSynchronize(), f"backward {name} {mode}")
        msgs = []
        for what, got, r in (("dq", dq, ref[0]), ("dk", dk, ref[1]), ("dv", dv, ref[2])):
            if torch.isnan(got).any():
                msgs.append(f"{what} NaN")
                continue
            e = rel(got, r)
            if e >= REL_TOL:
                msgs.append(f"{what} rel {e:.2e}")
        dead = torch.from_numpy(~seen_k).to("cuda")
        if dead.any() and ((dk[dead] != 0).any() or (dv[dead] != 0).any()):
            msgs.append("unseen keys: dK/dV not 0")
        blind = torch.from_numpy(~sees_q).to("cuda")
        if blind.any() and (dq[blind] != 0).any():
            msgs.append("blind rows: dQ not 0")
        errs = " ".join(f"{rel(x, r):.1e}" for x, r in zip((dq, dk, dv), ref, strict=True)
                        if not torch.isnan(x).any())
        results.append((mode, not msgs, "; ".join(msgs) or f"rel dq/dk/dv {errs}"))
        if deterministic:
            det_runs.append((dq.clone(), dk.clone(), dv.clone()))
    same = all(torch.equal(a, b) for a, b in zip(det_runs[0], det_runs[1], strict=True))
    results.append(("det bitwise", same, "two runs equal" if same else "runs differ"))
    return results


_LAYOUTS: dict = {}  # (mask, dtype, head dim) -> the descriptor layout (cmc.abi)


def timing_problem(layout, table, dtype: str, L: int, B: int, H: int = 16, D: int = 128):
    """The inputs timing() runs on: (descriptor bytes, args(deterministic) -> cmc_bwd_args
    bytes, backward FLOPs: 2.5 x the forward's of the visible pairs). Random Q, K, V, dO and
    any finite LSE: timing only."""
    from cmc.tiles import visible_pairs

    tdt = torch.bfloat16 if dtype == "bf16" else torch.float16
    pb = kc.Problem([L] * B, H, H, D, tdt, pad=0)
    qt, kt, vt, o, lse = kc.make_inputs(pb, 7)
    o.normal_()
    lse.fill_(20.0)
    keep: list = []
    per_seq = _timing_params(table.mask, L, B)
    vals = kc.descriptor_values(table.mask, pb, qt, kt, vt, o, lse, per_seq, keep)
    vals.setdefault("sched", 0)
    desc = layout.pack(vals)
    total = L * B
    do = torch.randn_like(qt)
    dq, dk, dv = torch.empty_like(qt), torch.empty_like(kt), torch.empty_like(vt)
    acc = torch.empty(acc_rows(total, B), H, D, device="cuda", dtype=torch.float32)
    dsum = torch.empty(2, H, total, device="cuda", dtype=torch.float32)
    keep += [qt, kt, vt, o, lse, do, dq, dk, dv, acc, dsum]

    def args(det: bool) -> bytes:
        _ = keep  # the tensors live as long as the packed pointers are used
        return pack_args(do, dq, dk, dv, acc, dsum, total, det)

    pairs = (sum(kc.count_visible(table.mask, L, ps) for ps in per_seq) if table.mask.params
             else B * visible_pairs(table, L, {}))
    return desc, args, 2.5 * 4 * H * D * pairs


def _timing_params(mask, L: int, B: int) -> list[dict]:
    """Each sequence's parameter values for timing: the benchmark's own rule where the mask is
    one of its cases (doc_window: a document every 1,536 tokens, benchmarks/masks.py), drawn
    with a fixed seed per sequence; none for masks without parameters."""
    if not mask.params:
        return [{} for _ in range(B)]
    import bench

    src = mask.source
    for spec in bench.all_specs():
        if (ROOT / spec.mask).read_text() == src:
            return [spec.make_params(np.random.default_rng(1000 * L + b), L) for b in range(B)]
    raise SystemExit(f"timing: no benchmark rule gives {mask.name}'s parameters "
                     f"{[p.name for p in mask.params]}")


def timing(bwd: Bwd, layout, table, dtype: str, L: int = 4096, B: int = 8,
           label: str = "", once: bool = False, name: str = "causal") -> list[str]:
    """The mask `name` (table) at L, B, H=16, D=128: backward TFLOP/s (2.5 x forward
    effective FLOPs, of its visible pairs). once: one atomic-mode sequence and no timing, for
    a profiler that captures the first launches (ncu --launch-count)."""
    H, D = 16, 128
    desc, make_args, flops = timing_problem(layout, table, dtype, L, B, H, D)
    if once:
        bwd.run(desc, make_args(False), L, H, H, B, False)
        torch.cuda.synchronize()
        return [f"{label}{name} bwd L={L} B={B} H={H} D={D} {dtype} atomic dQ: ran once"]
    out = []
    for det in (False, True):
        args = make_args(det)
        for _ in range(2):
            bwd.run(desc, args, L, H, H, B, det)
        torch.cuda.synchronize()
        t = fastest_ms(lambda a=args, d=det: bwd.run(desc, a, L, H, H, B, d)) / 1e3
        out.append(f"{label}{name} bwd L={L} B={B} H={H} D={D} {dtype} "
                   f"{'deterministic' if det else 'atomic dQ':14s} {t * 1e3:8.3f} ms "
                   f"{flops / t / 1e12:7.1f} TFLOP/s  ({role_times(bwd, desc, args, L, H, B, det)})")
    return out


def role_times(bwd: Bwd, desc: bytes, args: bytes, L: int, H: int, B: int, det: bool) -> str:
    """Each role of the sequence timed alone (fastest of 5, ms): where the backward's time goes."""
    from cmc.kernels import BWD_SEQUENCE

    return ", ".join(f"{role} {fastest_ms(lambda r=role: bwd.launch_role(r, desc, args, L, H, H, B)):.3f}"
                     for role in BWD_SEQUENCE["deterministic" if det else "atomic"])


def fastest_ms(fn, n: int = 5) -> float:
    """The fastest of n CUDA-event timings of fn (ms)."""
    times = []
    for _ in range(n):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        fn()
        e1.record()
        torch.cuda.synchronize()
        times.append(e0.elapsed_time(e1))
    return min(times)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--no-timing", action="store_true")
    ap.add_argument("--sm90", action="store_true",
                    help="the kv and dq roles are the sm_90a kinds bwd_kv_sm90 and "
                         "bwd_dq_sm90; times them beside the portable kv and dq")
    opts = ap.parse_args()
    sm90 = opts.sm90
    t_start = time.perf_counter()
    # NVRTC builds run in forked processes before CUDA is touched here; the arch is checked after.
    arch = os.environ.get("CMC_ARCH", "sm_90a")
    if sm90 and arch != "sm_90a":
        raise SystemExit("--sm90 needs CMC_ARCH=sm_90a (the kind is built for sm_90a only)")
    # jobs: (mask, dtype, head dim, sm90 kv); the patch cases build tiled (TILED_MASKS)
    cases = VARIANTS + (PATCH_VARIANTS if sm90 else [])
    jobs = [(n, dt, d, sm90) for n, dt, d in cases]
    if not opts.no_timing:
        for j in [("causal", "bf16", 128, False)] + ([("causal", "bf16", 128, True)] if sm90 else []):
            if j not in jobs:
                jobs.append(j)
    with ProcessPoolExecutor(max_workers=min(len(jobs), os.cpu_count() or 1)) as pool:
        futs = {j: pool.submit(build_variant, *j[:3], arch, j[3])
                for j in jobs}
        built = {j: f.result() for j, f in futs.items()}
    if kc.device_arch() != arch:
        raise SystemExit(f"device is {kc.device_arch()}, built for {arch} (set CMC_ARCH)")
    print(f"built {len(built)} variants for {arch} in {time.perf_counter() - t_start:.1f} s")
    print("resources (registers, spill stores, spill loads):")
    seen = set()
    for b in built.values():
        for sym, r in b[1].items():
            if sym not in seen:
                seen.add(sym)
                print(f"  {sym:48s} {r}")
    if sm90:
        print("  wgmma pipeline notes (C7515-C7520): none (cmc.build refuses a kernel with any)")
    tables = {n: table_of(n) for n in MASKS}
    from cmc.abi import descriptor_layout

    for n, dt, d, _ in jobs:
        _LAYOUTS[(n, dt, d)] = descriptor_layout(tables[n].mask)

    rows, failed = [], 0
    for n, dt, d in cases:
        try:
            res = run_case(n, dt, d, built[(n, dt, d, sm90)], tables[n],
                           lens=PATCH_LENS if (n, dt, d) in PATCH_VARIANTS else None)
        except Exception as e:  # a launch error poisons the context: report and stop
            rows.append((f"{n} {dt} d{d}", "ERROR", False, f"{type(e).__name__}: {e}"))
            failed += 1
            break
        for mode, ok, msg in res:
            rows.append((f"{n} {dt} d{d}", mode, ok, msg))
            failed += 0 if ok else 1
    timing_lines: list[str] = []
    # Timing also after numeric failures (flagged), not after a launch error (the context is gone).
    if not opts.no_timing and not any(mode == "ERROR" for _, mode, _, _ in rows):
        if failed:
            timing_lines.append("(timings below are of kernels that FAILED the checks above)")
        lay = _LAYOUTS[("causal", "bf16", 128)]
        kinds = [False, True] if sm90 else [False]
        bwds = {k: Bwd(built[("causal", "bf16", 128, k)][0]) for k in kinds}
        for L, B in ((4096, 8), (16384, 2)) if sm90 else ((4096, 8),):
            for k in kinds:
                label = ("sm90     " if k else "portable ") if sm90 else ""
                timing_lines += timing(bwds[k], lay, tables["causal"], "bf16", L, B, label)

    print(f"\n{'case':28s} {'mode':12s} {'result':6s} detail   (lens {LENS}; {PATCH_VARIANTS[0][0]}: "
          f"{PATCH_LENS}; heads 4/2)")
    for case, mode, ok, msg in rows:
        print(f"{case:28s} {mode:12s} {'ok' if ok else 'FAIL':6s} {msg}")
    for line in timing_lines:
        print(line)
    print(f"\n{len(rows) - failed} passed, {failed} failed, {time.perf_counter() - t_start:.1f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
