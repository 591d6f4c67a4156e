#!/usr/bin/env python3
"""GPU correctness and speed check of the portable (mma.sync) forward kernel.

Run on a CUDA machine from the repository root (no network needed):

    python3 tools/kernel_check.py            # every case, then the timing
    python3 tools/kernel_check.py --quick    # fewer shapes (a smoke test)
    python3 tools/kernel_check.py --masks causal,clear --no-timing

Needs torch (with CUDA), numpy, jinja2 and cuda-bindings (driver API + NVRTC). The masks come
from cmc's own pipeline (samples/*.mask through parse/check/lower); an error there stops the
check with its message. For each mask and shape: emit, NVRTC-compile for this device's
arch, load with cuModuleLoadData, launch with cuLaunchKernel (the packed descriptor as the
single parameter), with O and LSE poisoned with NaN first, and compare against a float64
reference of masked softmax attention built from the dense mask of cmc.evaluate. One line
per case, then 'N passed, M failed'; exit status 1 on any failure.
"""

from __future__ import annotations

import argparse
import ctypes
import math
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from cuda.bindings import driver as cu  # noqa: E402
from cuda.bindings import nvrtc  # noqa: E402

from cmc.emit import emit  # noqa: E402
from cmc.evaluate import Env, eval_pred  # noqa: E402
from cmc.ir import (  # noqa: E402
    LINEAR,
    IntervalTable,
    Mask,
    Var,
)

LOG2E = 1.4426950408889634
REL_TOL = 1e-2
LSE_TOL = 2e-3  # natural-log units

# ============================================================================ hand-made tables

q, k, L = Var("q"), Var("k"), Var("len")


DEFINES = {"chunked_causal": {"CHUNK": 512}, "block_causal_video": {"FRAME": 256},
           "hstu_context": {"CONTEXT": 64, "WINDOW": 300}}
REQUIRED = ("causal", "sliding_window", "hstu", "shared_prefix", "clear")


def load_tables(names: list[str] | None) -> tuple[dict[str, IntervalTable], str]:
    """Every sample through cmc's front half; an error there is reported, never replaced."""
    from cmc.driver import front
    from cmc.errors import CmcError

    stems = sorted(p.stem for p in (ROOT / "samples").glob("*.mask"))
    try:
        tabs = {s: front(ROOT / "samples" / f"{s}.mask", DEFINES.get(s, {})) for s in stems}
    except CmcError as e:
        raise SystemExit(f"front half failed: {e}") from e
    how = "cmc pipeline (samples/*.mask)"
    if names:
        missing = [n for n in names if n not in tabs]
        if missing:
            raise SystemExit(f"unknown masks {missing}; have {sorted(tabs)}")
        tabs = {n: tabs[n] for n in names}
    return tabs, how


# ============================================================================ parameters


def seq_params(mask: Mask, length: int, b: int) -> dict:
    """Per-sequence parameter values with some structure (deterministic)."""
    rng = np.random.default_rng(1000 * length + b)
    out: dict = {}
    for p in mask.params:
        n = p.name
        if n == "n_targets":
            out[n] = length // 8
        elif n == "prompt_len" or n == "prefix":
            out[n] = length // 4
        elif n == "responses":
            p0 = length // 4
            out[n] = [p0 + i * (length - p0) // 4 for i in range(4)]
        elif n == "window":
            out[n] = 100  # a scalar: one value for the launch
        elif p.kind == "segments":
            m = int(rng.integers(0, 6))
            out[n] = sorted(int(x) for x in rng.integers(0, length + 1, size=m))
        else:
            out[n] = int(rng.integers(0, length + 1))
    return out


def dense_mask(mask: Mask, length: int, params: dict) -> np.ndarray:
    try:
        from cmc.oracle import dense

        return dense(mask, length, params)
    except ImportError:
        qq = np.arange(length, dtype=np.int64)[:, None]
        kk = np.arange(length, dtype=np.int64)[None, :]
        v = eval_pred(mask.predicate, Env(length, params, {"q": qq, "k": kk}))
        return np.array(np.broadcast_to(np.asarray(v, dtype=bool), (length, length)))


def count_visible(mask: Mask, length: int, params: dict, rows: int = 256) -> int:
    """Visible pairs of one sequence, a block of rows at a time (long sequences)."""
    kk = np.arange(length, dtype=np.int64)[None, :]
    total = 0
    for r0 in range(0, length, rows):
        qq = np.arange(r0, min(length, r0 + rows), dtype=np.int64)[:, None]
        v = eval_pred(mask.predicate, Env(length, params, {"q": qq, "k": kk}))
        total += int(np.broadcast_to(np.asarray(v, dtype=bool), (qq.shape[0], length)).sum())
    return total


# ============================================================================ CUDA plumbing


def _ok(res, what: str):
    err = res[0] if isinstance(res, tuple) else res
    if int(err) != 0:
        name = cu.cuGetErrorName(err)[1] if isinstance(err, cu.CUresult) else err
        raise RuntimeError(f"{what} failed: {name}")
    if isinstance(res, tuple):
        return res[1] if len(res) == 2 else res[1:]
    return None


def device_arch() -> str:
    major, minor = torch.cuda.get_device_capability()
    if (major, minor) in ((9, 0), (10, 0)):
        return f"sm_{major}{minor}a"
    if major == 8:
        return "sm_80"
    return f"sm_{major}{minor}"


def nvrtc_build(text: str, name: str, arch: str, defines: list[str]) -> tuple[bytes, str, float]:
    err, prog = nvrtc.nvrtcCreateProgram(text.encode(), name.encode(), 0, [], [])
    _ok(err, "nvrtcCreateProgram")
    try:
        opts = [f"-arch={arch}", "-std=c++17", "-default-device", "--ptxas-options=-v",
                *(f"-D{d}" for d in defines)]
        t0 = time.perf_counter()
        (res,) = nvrtc.nvrtcCompileProgram(prog, len(opts), [o.encode() for o in opts])
        secs = time.perf_counter() - t0
        _, n = nvrtc.nvrtcGetProgramLogSize(prog)
        log = b" " * n
        nvrtc.nvrtcGetProgramLog(prog, log)
        text_log = log.rstrip(b"\0").decode(errors="replace")
        if int(res) != 0:
            raise RuntimeError(f"NVRTC failed for {name} {defines}:\n{text_log}")
        _, n = nvrtc.nvrtcGetCUBINSize(prog)
        cubin = b" " * n
        nvrtc.nvrtcGetCUBIN(prog, cubin)
        return bytes(cubin), text_log, secs
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def _ptxas_summary(log: str) -> str:
    regs = spill = ""
    for line in log.splitlines():
        if "Used" in line and "registers" in line:
            regs = line.split("Used", 1)[1].split(",")[0].strip()
        if "spill stores" in line:
            spill = line.split(",", 1)[1].strip() if "," in line else line.strip()
    return f"{regs}; {spill}"


@dataclass
class Kernel:
    func: object
    smem: int
    threads: int
    block_m: int
    layout: object
    symbol: str


_MODULES: list = []


def load_kernel(src, variant, arch: str, mt: int | None = None) -> Kernel:
    """mt overrides the rows per warp (16 * mt, 256 / mt threads) for A/B checks."""
    defines = [f"CMC_VARIANT_{variant.dtype}_d{variant.head_dim}"]
    threads = variant.threads
    if mt is not None:
        defines.append(f"CMC_PORTABLE_MT={mt}")
        threads = 256 // mt
    cubin, log, secs = nvrtc_build(src.text, src.filename, arch, defines)
    mod = _ok(cu.cuModuleLoadData(cubin), "cuModuleLoadData")
    _MODULES.append(mod)
    func = _ok(cu.cuModuleGetFunction(mod, variant.symbol.encode()), "cuModuleGetFunction")
    _ok(cu.cuFuncSetAttribute(
        func, cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
        variant.smem_bytes), "cuFuncSetAttribute")
    tag = "" if mt is None else f" [MT={mt}]"
    print(f"  built {variant.symbol}{tag} for {arch}: NVRTC {secs:.2f} s, {threads} threads, "
          f"{_ptxas_summary(log)}, {variant.smem_bytes} B dynamic smem", flush=True)
    return Kernel(func, variant.smem_bytes, threads, variant.block_m, src.layout,
                  variant.symbol + tag)


def launch(kern: Kernel, values: dict, grid: tuple[int, int, int]) -> None:
    desc = kern.layout.pack(values)  # type: ignore[attr-defined]
    buf = ctypes.create_string_buffer(desc, len(desc))
    argv = (ctypes.c_void_p * 1)(ctypes.addressof(buf))
    stream = cu.CUstream(torch.cuda.current_stream().cuda_stream)
    _ok(cu.cuLaunchKernel(kern.func, grid[0], grid[1], grid[2], kern.threads, 1, 1, kern.smem,
                          stream, ctypes.addressof(argv), 0), "cuLaunchKernel")


# ============================================================================ one case


@dataclass
class Problem:
    lens: list[int]
    heads_q: int
    heads_kv: int
    head_dim: int
    dtype: torch.dtype
    fused_qkv: bool = False  # Q, K, V as views of one [T, Hq + 2 Hkv, D] buffer
    pad: int = 64  # extra token rows after the batch in O/LSE: must stay NaN


def make_inputs(pb: Problem, seed: int):
    dev = "cuda"
    total = sum(pb.lens)
    g = torch.Generator(device=dev).manual_seed(seed)
    hq, hk, d = pb.heads_q, pb.heads_kv, pb.head_dim
    if pb.fused_qkv:
        qkv = torch.randn(total, hq + 2 * hk, d, device=dev, generator=g).to(pb.dtype)
        qt, kt, vt = qkv[:, :hq], qkv[:, hq:hq + hk], qkv[:, hq + hk:]
    else:
        qt = torch.randn(total, hq, d, device=dev, generator=g).to(pb.dtype)
        kt = torch.randn(total, hk, d, device=dev, generator=g).to(pb.dtype)
        vt = torch.randn(total, hk, d, device=dev, generator=g).to(pb.dtype)
    o = torch.full((total + pb.pad, hq, d), float("nan"), device=dev, dtype=pb.dtype)
    lse = torch.full((hq, total + pb.pad), float("nan"), device=dev, dtype=torch.float32)
    return qt, kt, vt, o, lse


def descriptor_values(mask: Mask, pb: Problem, qt, kt, vt, o, lse, per_seq: list[dict],
                      keep: list) -> dict:
    lens = pb.lens
    cu_seq = torch.tensor([0] + list(np.cumsum(lens)), dtype=torch.int32, device="cuda")
    keep.append(cu_seq)
    scale = 1.0 / math.sqrt(pb.head_dim)
    vals: dict = {
        "q": qt.data_ptr(), "k": kt.data_ptr(), "v": vt.data_ptr(), "o": o.data_ptr(),
        "lse": lse.data_ptr(), "cu_seqlens": cu_seq.data_ptr(),
        "q_stride_tok": qt.stride(0), "q_stride_head": qt.stride(1),
        "k_stride_tok": kt.stride(0), "k_stride_head": kt.stride(1),
        "v_stride_tok": vt.stride(0), "v_stride_head": vt.stride(1),
        "o_stride_tok": o.stride(0), "o_stride_head": o.stride(1),
        "lse_stride_head": lse.stride(0),
        "batch": len(lens), "heads_q": pb.heads_q, "heads_kv": pb.heads_kv,
        "max_len": max(lens), "scale_log2": scale * LOG2E,
    }
    for p in mask.params:
        if p.kind == "scalar":
            vals[f"p_{p.name}"] = int(per_seq[0][p.name])
        elif p.kind == "batch":
            t = torch.tensor([ps[p.name] for ps in per_seq], dtype=torch.int32, device="cuda")
            keep.append(t)
            vals[f"p_{p.name}"] = t.data_ptr()
        else:
            starts = [s for ps in per_seq for s in ps[p.name]]
            offs = [0] + list(np.cumsum([len(ps[p.name]) for ps in per_seq]))
            ts = torch.tensor(starts + [0], dtype=torch.int32, device="cuda")  # never empty
            to = torch.tensor(offs, dtype=torch.int32, device="cuda")
            keep += [ts, to]
            vals[f"p_{p.name}_offsets"] = to.data_ptr()
            vals[f"p_{p.name}_starts"] = ts.data_ptr()
    return vals


def reference(pb: Problem, qt, kt, vt, masks: list[np.ndarray]):
    """float64 masked softmax attention per sequence: O [T, Hq, D], LSE [Hq, T]."""
    scale = 1.0 / math.sqrt(pb.head_dim)
    group = pb.heads_q // pb.heads_kv
    outs, lses = [], []
    t0 = 0
    for n, m in zip(pb.lens, masks, strict=True):
        qd = qt[t0:t0 + n].double().transpose(0, 1)  # [Hq, n, D]
        kd = kt[t0:t0 + n].double().transpose(0, 1).repeat_interleave(group, 0)
        vd = vt[t0:t0 + n].double().transpose(0, 1).repeat_interleave(group, 0)
        mt = torch.from_numpy(m).to("cuda")
        s = (qd @ kd.transpose(1, 2)) * scale
        s = s.masked_fill(~mt, float("-inf"))
        mx = s.amax(-1, keepdim=True)
        safe = torch.where(torch.isfinite(mx), mx, torch.zeros_like(mx))
        p = torch.exp(s - safe)
        l_ = p.sum(-1, keepdim=True)
        o = torch.where(l_ > 0, (p @ vd) / torch.where(l_ > 0, l_, torch.ones_like(l_)),
                        torch.zeros_like(qd))
        lse = torch.where(l_[..., 0] > 0, safe[..., 0] + torch.log(l_[..., 0]),
                          torch.full_like(l_[..., 0], float("-inf")))
        outs.append(o.transpose(0, 1))
        lses.append(lse)
        t0 += n
    return torch.cat(outs, 0), torch.cat(lses, 1)


def run_case(name: str, table: IntervalTable, kern: Kernel, pb: Problem, seed: int,
             dense_cache: dict) -> tuple[bool, str]:
    mask = table.mask
    per_seq = [seq_params(mask, n, b) for b, n in enumerate(pb.lens)]
    if any(p.kind == "scalar" for p in mask.params):  # one value per launch
        for ps in per_seq[1:]:
            for p in mask.params:
                if p.kind == "scalar":
                    ps[p.name] = per_seq[0][p.name]
    masks = []
    for n, ps in zip(pb.lens, per_seq, strict=True):
        key = (name, n, repr(sorted(ps.items())))
        if key not in dense_cache:
            dense_cache[key] = dense_mask(mask, n, ps)
        masks.append(dense_cache[key])
    qt, kt, vt, o, lse = make_inputs(pb, seed)
    keep: list = []
    vals = descriptor_values(mask, pb, qt, kt, vt, o, lse, per_seq, keep)
    grid = (-(-max(pb.lens) // kern.block_m), pb.heads_q, len(pb.lens))
    launch(kern, vals, grid)
    _ok(cu.cuCtxSynchronize(), f"kernel {kern.symbol}")
    total = sum(pb.lens)
    ref_o, ref_lse = reference(pb, qt, kt, vt, masks)
    got_o = o[:total].double()
    got_lse = lse[:, :total].double()
    nan = int(torch.isnan(got_o).sum()) + int(torch.isnan(got_lse).sum())
    pad_written = int((~torch.isnan(o[total:])).sum()) + int((~torch.isnan(lse[:, total:])).sum())
    err = (got_o - ref_o).abs()
    max_abs = float(torch.nan_to_num(err, nan=float("inf")).max()) if total else 0.0
    denom = float(ref_o.norm())
    rel = float(torch.nan_to_num(got_o - ref_o, nan=1e30).norm()) / max(denom, 1e-30)
    if denom == 0.0:  # every row sees nothing: O must be exactly 0
        rel = 0.0 if max_abs == 0.0 else float("inf")
    fin = torch.isfinite(ref_lse)
    lse_ok = bool(torch.equal(torch.isneginf(got_lse), ~fin)) and not bool(
        torch.isposinf(got_lse).any())
    lse_err = float((got_lse[fin] - ref_lse[fin]).abs().max()) if bool(fin.any()) else 0.0
    empty_rows = ~fin  # rows that see no key: O exactly 0
    empty_ok = bool((got_o.transpose(0, 1)[empty_rows] == 0).all()) if bool(
        empty_rows.any()) else True
    ok = (nan == 0 and pad_written == 0 and rel < REL_TOL and lse_ok and lse_err < LSE_TOL
          and empty_ok)
    visible = sum(int(m.sum()) for m in masks)
    dt = "bf16" if pb.dtype == torch.bfloat16 else "fp16"
    tag = kern.symbol[kern.symbol.index(" ["):] if " [" in kern.symbol else ""
    line = (f"{'PASS' if ok else 'FAIL'} {name:<20} {dt} d{pb.head_dim:<3}{tag} lens={pb.lens} "
            f"heads={pb.heads_q}:{pb.heads_kv}{' fused-qkv' if pb.fused_qkv else ''} "
            f"density={visible / max(1, sum(n * n for n in pb.lens)):.3f} "
            f"max_abs={max_abs:.3e} rel={rel:.3e} lse_err={lse_err:.2e} nan={nan}"
            + ("" if pad_written == 0 else f" PAD_WRITTEN={pad_written}")
            + ("" if lse_ok else " LSE_INF_MISMATCH") + ("" if empty_ok else " EMPTY_ROW_NOT_0"))
    return ok, line


# ============================================================================ timing


def time_kernel(name: str, table: IntervalTable, kern: Kernel, length: int, batch: int,
                heads: int, dim: int, iters: int = 20, sdpa: bool = True) -> None:
    mask = table.mask
    pb = Problem([length] * batch, heads, heads, dim, torch.bfloat16, pad=0)
    per_seq = [seq_params(mask, length, b) for b in range(batch)]
    for ps in per_seq[1:]:
        for p in mask.params:
            if p.kind == "scalar":
                ps[p.name] = per_seq[0][p.name]
    qt, kt, vt, o, lse = make_inputs(pb, 0)
    keep: list = []
    vals = descriptor_values(mask, pb, qt, kt, vt, o, lse, per_seq, keep)
    grid = (-(-length // kern.block_m), heads, batch)
    for _ in range(3):
        launch(kern, vals, grid)
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        launch(kern, vals, grid)
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    med = statistics.median(times)
    if name == "causal":
        pairs_per_seq = [length * (length + 1) // 2] * batch
    else:
        pairs_per_seq = [count_visible(mask, length, ps) for ps in per_seq]
    flops = 4 * heads * dim * sum(pairs_per_seq)
    tag = kern.symbol[kern.symbol.index(" ["):] if " [" in kern.symbol else ""
    print(f"TIME {name:<20} bf16 d{dim}{tag} L={length} B={batch} H={heads}: "
          f"median {med * 1e3:.3f} ms, {flops / med / 1e12:.1f} effective TFLOP/s "
          f"(min {min(times) * 1e3:.3f} ms)", flush=True)
    if name == "causal" and sdpa:
        try:
            import torch.nn.functional as F

            qb = qt.view(batch, length, heads, dim).transpose(1, 2)
            kb = kt.view(batch, length, heads, dim).transpose(1, 2)
            vb = vt.view(batch, length, heads, dim).transpose(1, 2)
            for _ in range(3):
                F.scaled_dot_product_attention(qb, kb, vb, is_causal=True)
            torch.cuda.synchronize()
            ts = []
            for _ in range(iters):
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                F.scaled_dot_product_attention(qb, kb, vb, is_causal=True)
                b.record()
                b.synchronize()
                ts.append(a.elapsed_time(b) / 1e3)
            m2 = statistics.median(ts)
            print(f"TIME torch SDPA causal (reference point) : median {m2 * 1e3:.3f} ms, "
                  f"{flops / m2 / 1e12:.1f} effective TFLOP/s", flush=True)
        except Exception as e:  # informational only
            print(f"(torch SDPA timing skipped: {e})")


# ============================================================================ main


def problems(quick: bool) -> list[tuple[list[int], int, int, bool]]:
    """(lens, heads_q, heads_kv, fused_qkv)."""
    if quick:
        return [([1], 4, 2, False), ([129], 4, 2, False), ([1000, 129], 4, 2, False)]
    return [
        ([1], 4, 2, False),
        ([127], 4, 2, False),
        ([129], 4, 2, False),
        ([1000], 4, 2, False),
        ([4096], 4, 2, False),
        ([1000, 129], 4, 2, False),      # jagged batch of 2
        ([300, 1, 77, 513], 4, 1, True),  # jagged, MQA, Q/K/V views of one buffer
        ([640], 4, 4, False),             # MHA
    ]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--masks", help="comma-separated mask names (default: all)")
    ap.add_argument("--quick", action="store_true", help="fewer shapes")
    ap.add_argument("--no-timing", action="store_true")
    ap.add_argument("--no-mt2", action="store_true",
                    help="skip the 32-rows-per-warp (CMC_PORTABLE_MT=2) checks and timing")
    ap.add_argument("--all-variants-all-masks", action="store_true",
                    help="every dtype x head dim for every mask (default: full matrix for the "
                         "required masks, bf16 d128 + fp16 d64 for the others)")
    args = ap.parse_args()

    torch.zeros(1, device="cuda")  # make torch's primary context current for the driver API
    _ok(cu.cuInit(0), "cuInit")
    arch = device_arch()
    print(f"device: {torch.cuda.get_device_name()} ({arch}), torch {torch.__version__}, "
          f"NVRTC {'.'.join(map(str, nvrtc.nvrtcVersion()[1:]))}", flush=True)
    tables, how = load_tables(args.masks.split(",") if args.masks else None)
    print(f"tables: {how}", flush=True)

    passed = failed = 0
    dense_cache: dict = {}
    kernels: dict = {}
    seed = 0
    for name, table in tables.items():
        src = emit(table, dtypes=("bf16", "fp16"), head_dims=(64, 128), archs=(arch,), kernel="portable",
                   tiling=LINEAR)
        full_matrix = args.all_variants_all_masks or name in REQUIRED
        for v in src.variants:
            if not full_matrix and (v.dtype, v.head_dim) not in (("bf16", 128), ("fp16", 64)):
                continue
            try:
                kern = load_kernel(src, v, arch)
            except Exception as e:
                print(f"FAIL {name:<20} {v.dtype} d{v.head_dim}: build/load: {e}", flush=True)
                failed += 1
                continue
            kernels[(name, v.dtype, v.head_dim)] = kern
            dtype = torch.bfloat16 if v.dtype == "bf16" else torch.float16
            for lens, hq, hk, fused in problems(args.quick):
                seed += 1
                pb = Problem(lens, hq, hk, v.head_dim, dtype, fused)
                try:
                    ok, line = run_case(name, table, kern, pb, seed, dense_cache)
                except Exception as e:
                    ok, line = False, f"FAIL {name:<20} {v.dtype} d{v.head_dim} lens={lens}: {e}"
                print(line, flush=True)
                passed += ok
                failed += not ok
        # The alternative shape (32 rows per warp, 4 warps) must stay correct too: it is one
        # constant away from being the default (cmc/emit.py ROWS_PER_WARP).
        if not args.no_mt2 and name in ("causal", "shared_prefix", "clear", "hstu"):
            for v in src.variants:
                if (v.dtype, v.head_dim) not in (("bf16", 128), ("fp16", 64)):
                    continue
                try:
                    kern = load_kernel(src, v, arch, mt=2)
                except Exception as e:
                    print(f"FAIL {name:<20} {v.dtype} d{v.head_dim} [MT=2]: build/load: {e}")
                    failed += 1
                    continue
                kernels[(name, v.dtype, v.head_dim, 2)] = kern
                dtype = torch.bfloat16 if v.dtype == "bf16" else torch.float16
                for lens, hq, hk, fused in problems(True) + [([4096], 4, 2, False)]:
                    seed += 1
                    pb = Problem(lens, hq, hk, v.head_dim, dtype, fused)
                    try:
                        ok, line = run_case(name, table, kern, pb, seed, dense_cache)
                    except Exception as e:
                        ok, line = False, f"FAIL {name} [MT=2] lens={lens}: {e}"
                    print(line, flush=True)
                    passed += ok
                    failed += not ok
        dense_cache.clear()
    print(f"{passed} passed, {failed} failed", flush=True)

    if not args.no_timing:
        for name in ("causal", "sliding_window", "hstu", "shared_prefix", "clear"):
            key = (name, "bf16", 128)
            if key in kernels:
                try:
                    time_kernel(name, tables[name], kernels[key], 8192, 4, 16, 128)
                except Exception as e:
                    print(f"TIME {name}: failed: {e}", flush=True)
        for key in (("causal", "bf16", 128, 2), ("hstu", "bf16", 128, 2)):
            if key in kernels:  # A/B: 32 rows per warp
                try:
                    time_kernel(key[0], tables[key[0]], kernels[key], 8192, 4, 16, 128,
                                sdpa=False)
                except Exception as e:
                    print(f"TIME {key}: failed: {e}", flush=True)
        if "causal" in tables:  # head dim 64, both shapes
            src = emit(tables["causal"], dtypes=("bf16",), head_dims=(64,), archs=(arch,), kernel="portable",
                       tiling=LINEAR)
            for mt in (None, 2):
                try:
                    kern = load_kernel(src, src.variants[0], arch, mt=mt)
                    time_kernel("causal", tables["causal"], kern, 8192, 4, 16, 64,
                                sdpa=mt is None)
                except Exception as e:
                    print(f"TIME causal d64 MT={mt}: failed: {e}", flush=True)
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    os.environ.setdefault("CMC_NO_CACHE", "1")
    sys.exit(main())
