#!/usr/bin/env python3
"""Build, check and time the sm90a wgmma kernel (templates/cmc/attn_fwd_sm90.cuh).

Self-contained (repo root on sys.path; needs torch + cuda-bindings with NVRTC on the GPU
machine). For each mask in MASKS: the mask's source through cmc.driver.front and cmc.emit
(the hooks `cmc_hooks`), with the sm90 header and extern "C" entry points appended
(`cmc_<mask>_fwd_sm90_<dtype>_d<hd>`, under `#if defined(CMC_SM90_<dtype>_d<hd>)`), NVRTC
for sm_90a, then on the GPU: outputs poisoned with NaN, O and LSE compared with a float64
masked-attention reference (dense mask from cmc.oracle.dense per sequence); then causal
timings against the portable kernel and torch SDPA (flash).

    python3 tools/sm90_check.py                   # everything (needs an sm_90 GPU)
    python3 tools/sm90_check.py --compile-only    # NVRTC + ptxas -v + SASS check, no GPU
    python3 tools/sm90_check.py --no-bench        # correctness only
    python3 tools/sm90_check.py --masks causal,hstu --lengths 1,129

Exit status 0 iff every case passed.
"""

from __future__ import annotations

import argparse
import ctypes
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

HEADER = ROOT / "templates" / "cmc" / "attn_fwd_sm90.cuh"
MASKS = ("causal", "sliding_window", "hstu", "shared_prefix", "clear")
LENGTHS = (1, 100, 128, 129, 1000, 4096)
DTYPES = ("bf16", "fp16")
HEAD_DIMS = (64, 128)
ARCH = "sm_90a"
THREADS = 384  # cmc_sm90::kThreads
BLOCK_M = 128  # cmc_sm90::kBM (persistent grid: min(tiles * heads * batch, SMs), cmc/package.py)
HQ, HKV = 4, 2
# |O - O_ref| <= atol + rtol * |O_ref| elementwise (inputs ~ N(0, 1), so |O| <~ 4)
TOL_O = {"bf16": (1.5e-2, 1.5e-2), "fp16": (2.5e-3, 2.5e-3)}
TOL_LSE = 2e-3


def die(msg: str) -> None:
    print(f"FATAL: {msg}", flush=True)
    sys.exit(2)


# ================================================================================ source


def sm90_smem_bytes(head_dim: int, n_terms: int, tiling=None) -> int:
    """cmc_sm90::smem_bytes<D, NT, TILING>() (static_assert'ed in the generated entry points)."""
    from cmc.emit import sm90_smem_bytes as f
    from cmc.ir import LINEAR

    return f(head_dim, n_terms, tiling or LINEAR)


def sm90_symbol(name: str, dt: str, hd: int) -> str:
    return f"cmc_{name}_fwd_sm90_{dt}_d{hd}"


def build_source(mask_name: str):
    """(text, table, emitted): the emitted portable .cu plus the sm90 header and entries."""
    from cmc.driver import front
    from cmc.emit import emit
    from cmc.tiling import choose_tiling

    table = front(ROOT / "samples" / f"{mask_name}.mask")
    tiling = choose_tiling(table)  # the sm90 kernel's (the portable one ignores it)
    emitted = emit(table, dtypes=DTYPES, head_dims=HEAD_DIMS, archs=(ARCH,), kernel="portable",
                   tiling=tiling)
    text = emitted.text
    m = re.search(r"enum : int \{ kTerms = (\d+) \}", text)
    if not m:
        die(f"{mask_name}: cannot find kTerms in the emitted hooks (emit changed?)")
    n_terms = int(m.group(1))
    struct_name = emitted.layout.struct_name
    parts = [text.rstrip("\n"), ""]
    if "namespace cmc_sm90" not in text:  # emit does not inline the sm90 header (yet)
        parts += ["// ---- sm90 kernel (appended by tools/sm90_check.py)", HEADER.read_text(), ""]
    for dt in DTYPES:
        for hd in HEAD_DIMS:
            parts.append(
                f"#if defined(CMC_SM90_{dt}_d{hd})\n"
                f"static_assert(cmc_sm90::smem_bytes<{hd}, cmc_hooks::kTerms, cmc_hooks::kTiling>()"
                f" == {sm90_smem_bytes(hd, n_terms, tiling)}, \"dynamic shared memory\");\n"
                f"extern \"C\" __global__ void __launch_bounds__({THREADS}, 1)\n"
                f"{sm90_symbol(table.mask.name, dt, hd)}(const __grid_constant__ {struct_name} desc, "
                f"const __grid_constant__ cmc_sm90::TensorMaps maps) {{\n"
                f"  cmc_sm90::fwd<cmc_hooks, {'true' if dt == 'bf16' else 'false'}, {hd}>(desc, maps);\n"
                f"}}\n#endif\n")
    return "\n".join(parts), table, emitted, n_terms, tiling


def nvrtc_compile(text: str, name: str, define: str, arch: str = ARCH, extra=()):
    """(cubin bytes, ptxas log, seconds); prints the NVRTC log and raises on failure."""
    from cuda.bindings import nvrtc

    opts = [f"-arch={arch}", "-std=c++17", "-default-device", "--ptxas-options=-v", f"-D{define}",
            *extra]
    t0 = time.perf_counter()
    err, prog = nvrtc.nvrtcCreateProgram(text.encode(), f"{name}.cu".encode(), 0, [], [])
    if int(err):
        die(f"nvrtcCreateProgram: {err}")
    try:
        (res,) = nvrtc.nvrtcCompileProgram(prog, len(opts), [o.encode() for o in opts])
        _, n = nvrtc.nvrtcGetProgramLogSize(prog)
        buf = b" " * n
        nvrtc.nvrtcGetProgramLog(prog, buf)
        log = buf.rstrip(b"\0").decode("utf-8", "replace")
        if int(res):
            path = Path(tempfile.gettempdir()) / f"sm90_check_{name}_{define}.cu"
            path.write_text(text)
            print(f"NVRTC FAILED for {name} {define} ({res}); source saved to {path}\n"
                  f"---- compile log ----\n{log}\n---------------------", flush=True)
            raise RuntimeError(f"NVRTC failed: {name} {define}")
        from cmc.cubin import wgmma_pipeline_notes

        if notes := wgmma_pipeline_notes(log):  # cmc's build rejects these too
            print(f"ptxas did not keep the wgmma pipeline of {name} {define}:\n  "
                  + "\n  ".join(notes), flush=True)
            raise RuntimeError(f"wgmma pipeline given up: {name} {define}")
        _, n = nvrtc.nvrtcGetCUBINSize(prog)
        cubin = b" " * n
        nvrtc.nvrtcGetCUBIN(prog, cubin)
    finally:
        nvrtc.nvrtcDestroyProgram(prog)
    return cubin, log, time.perf_counter() - t0


def ptxas_summary(log: str) -> str:
    regs = re.findall(r"Used (\d+) registers", log)
    spill = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
    stack = re.findall(r"(\d+) bytes stack frame", log)
    s = f"regs={','.join(regs) or '?'}"
    if spill:
        s += f" spill_st/ld={spill[-1][0]}/{spill[-1][1]}"
    if stack:
        s += f" stack={stack[-1]}"
    warn = [ln.strip() for ln in log.splitlines()
            if "warning" in ln.lower() or "Performance Loss" in ln]
    if warn:
        s += " WARN: " + " | ".join(warn)
    return s


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
        out = subprocess.run([tool, "--dump-sass", path], capture_output=True, text=True, timeout=120)
    finally:
        os.unlink(path)
    sass = out.stdout
    n = lambda pat: len(re.findall(pat, sass))  # noqa: E731
    return (f"sass: HGMMA={n(r'HGMMA')} LDGSTS={n(r'LDGSTS')} SYNCS={n(r'SYNCS')} "
            f"USETMAXREG={n(r'USETMAXREG')} STL={n(r'STL')} LDL={n(r'LDL')} MUFU.EX2={n(r'MUFU.EX2')}")


# ================================================================================ device


class Gpu:
    def __init__(self):
        import torch
        from cuda.bindings import driver as cu

        self.torch, self.cu = torch, cu
        if not torch.cuda.is_available():
            die("no CUDA device visible to torch")
        major, minor = torch.cuda.get_device_capability()
        if (major, minor) != (9, 0):
            die(f"needs an sm_90 GPU, found sm_{major}{minor} ({torch.cuda.get_device_name()})")
        torch.zeros(1, device="cuda")  # creates and binds the primary context
        self._ok(cu.cuInit(0), "cuInit")
        err, ctx = cu.cuCtxGetCurrent()
        if int(err) or ctx is None or int(ctx) == 0:
            err, dev = cu.cuDeviceGet(torch.cuda.current_device())
            err, ctx = cu.cuDevicePrimaryCtxRetain(dev)
            self._ok(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
        self.modules = []

    def _ok(self, res, what):
        err = res[0] if isinstance(res, tuple) else res
        if int(err):
            die(f"{what} failed: {err}")
        return res[1] if isinstance(res, tuple) and len(res) > 1 else None

    def load(self, cubin: bytes, symbol: str, smem: int):
        cu = self.cu
        mod = self._ok(cu.cuModuleLoadData(cubin), f"cuModuleLoadData({symbol})")
        self.modules.append(mod)
        fn = self._ok(cu.cuModuleGetFunction(mod, symbol.encode()), f"cuModuleGetFunction({symbol})")
        self._ok(cu.cuFuncSetAttribute(
            fn, cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem),
            f"cuFuncSetAttribute({symbol}, smem={smem})")
        return fn

    def launch(self, fn, grid, threads, smem, desc: bytes, maps=None):
        cu = self.cu
        buf = ctypes.create_string_buffer(desc, len(desc))
        if maps is None:
            argv = (ctypes.c_void_p * 1)(ctypes.addressof(buf))
        else:  # (buffer, aligned address) from cmc.runtime.loader.tensor_maps_block
            argv = (ctypes.c_void_p * 2)(ctypes.addressof(buf), maps[1])
        stream = cu.CUstream(self.torch.cuda.current_stream().cuda_stream)
        self._ok(cu.cuLaunchKernel(fn, grid[0], grid[1], grid[2], threads, 1, 1, smem, stream,
                                   ctypes.addressof(argv), 0), "cuLaunchKernel")


class Kernel:
    def __init__(self, gpu, fn, layout, threads, smem, tiling=None, dynamic=False):
        from cmc.ir import LINEAR

        self.gpu, self.fn, self.layout, self.threads, self.smem = gpu, fn, layout, threads, smem
        self.tiling = tiling or LINEAR
        # the work counter (desc.sched) the kernel must leave zero; None: static schedule
        self.counter = (gpu.torch.zeros(2, dtype=gpu.torch.int32, device="cuda")
                        if dynamic else None)

    def counter_left(self):
        """The work counter after a launch (synchronised), or None: static."""
        return None if self.counter is None else self.counter.tolist()

    def prepare(self, q, k, v, o, lse, cu_seqlens, max_len, lse_stride, param_ptrs, scale):
        """Packed descriptor bytes and grid for tensors q/k/v/o [T, H, D]."""
        vals = {
            "q": q.data_ptr(), "k": k.data_ptr(), "v": v.data_ptr(), "o": o.data_ptr(),
            "lse": lse.data_ptr() if lse is not None else 0,
            "cu_seqlens": cu_seqlens.data_ptr(),
            "q_stride_tok": q.stride(0), "q_stride_head": q.stride(1),
            "k_stride_tok": k.stride(0), "k_stride_head": k.stride(1),
            "v_stride_tok": v.stride(0), "v_stride_head": v.stride(1),
            "o_stride_tok": o.stride(0), "o_stride_head": o.stride(1),
            "lse_stride_head": lse_stride,
            "batch": cu_seqlens.numel() - 1, "heads_q": q.shape[1], "heads_kv": k.shape[1],
            "max_len": max_len, "scale_log2": scale * math.log2(math.e),
            "sched": 0 if self.counter is None else self.counter.data_ptr(),
        }
        vals.update(param_ptrs)
        desc = self.layout.pack(vals)
        tiles = (max_len + BLOCK_M - 1) // BLOCK_M
        maps = None
        if self.threads == THREADS:  # sm90: TMA maps of q, k, v; persistent over tile pairs
            from cmc.runtime.loader import MapTensor, tensor_maps_block

            dt = "bf16" if q.dtype == self.gpu.torch.bfloat16 else "fp16"
            views = {n: MapTensor(t.data_ptr(), t.shape[1], t.stride(0), t.stride(1))
                     for n, t in (("q", q), ("k", k), ("v", v))}
            maps = tensor_maps_block(("q", "k", "v"), dt, q.shape[2], q.shape[0], views,
                                     self.tiling.box_rows)
            tiles = self.tiling.query_tiles(max_len)
            units = (tiles + 1) // 2 * q.shape[1] * (cu_seqlens.numel() - 1)
            sms = self.gpu.torch.cuda.get_device_properties(0).multi_processor_count
            grid = (min(units, sms), 1, 1)
        else:
            grid = (tiles, q.shape[1], cu_seqlens.numel() - 1)
        return (desc, maps), grid

    def __call__(self, desc, grid):
        desc, maps = desc
        self.gpu.launch(self.fn, grid, self.threads, self.smem, desc, maps)


# ============================================================================ test cases


def seq_params(mask_name: str, n: int) -> dict:
    if mask_name == "hstu":
        return {"n_targets": min(n, 1 + n // 10)}
    if mask_name == "shared_prefix":
        p = n // 3
        rest = n - p
        starts = sorted({min(n, p + rest * i // 3) for i in range(3)}) if n > 0 else []
        return {"prompt_len": p, "responses": starts}
    return {}


def param_tensors(torch, mask, per_seq: list[dict]):
    """Device arrays for the mask's parameters and the descriptor values pointing at them."""
    keep, vals = [], {}
    for p in mask.params:
        if p.kind == "scalar":
            vals[f"p_{p.name}"] = int(per_seq[0][p.name])
        elif p.kind == "batch":
            t = torch.tensor([int(d[p.name]) for d in per_seq], dtype=torch.int32, device="cuda")
            keep.append(t)
            vals[f"p_{p.name}"] = t.data_ptr()
        else:
            offs, starts = [0], []
            for d in per_seq:
                starts += list(d[p.name])
                offs.append(len(starts))
            to = torch.tensor(offs, dtype=torch.int32, device="cuda")
            ts = torch.tensor(starts + [0], dtype=torch.int32, device="cuda")
            keep += [to, ts]
            vals[f"p_{p.name}_offsets"] = to.data_ptr()
            vals[f"p_{p.name}_starts"] = ts.data_ptr()
    return keep, vals


def reference(torch, q, k, v, vis, scale):
    """float64 masked attention of one sequence: q [L, Hq, D], k/v [L, Hkv, D], vis [L, L]."""
    hq, hkv = q.shape[1], k.shape[1]
    qd = q.double().transpose(0, 1)
    kd = k.double().transpose(0, 1).repeat_interleave(hq // hkv, dim=0)
    vd = v.double().transpose(0, 1).repeat_interleave(hq // hkv, dim=0)
    s = torch.matmul(qd, kd.transpose(1, 2)) * scale
    s = s.masked_fill(~vis[None], float("-inf"))
    lse = torch.logsumexp(s, dim=-1)  # -inf on empty rows
    p = torch.exp(s - torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)[..., None])
    o = torch.matmul(p, vd)  # empty rows: p == 0 -> o == 0
    return o.transpose(0, 1), lse


def run_case(gpu, kern, mask, mask_name, dt, hd, lens, with_lse=True, seed=0):
    import numpy as np
    import torch

    from cmc.oracle import dense

    torch.manual_seed(seed)
    dtype = torch.bfloat16 if dt == "bf16" else torch.float16
    T = sum(lens)
    pad = 128
    q = torch.randn(T + pad, HQ, hd, device="cuda", dtype=dtype)[:T]
    k = torch.randn(T, HKV, hd, device="cuda", dtype=dtype)
    v = torch.randn(T, HKV, hd, device="cuda", dtype=dtype)
    o_full = torch.full((T + pad, HQ, hd), float("nan"), device="cuda", dtype=dtype)
    lse_stride = T + pad
    lse_full = torch.full((HQ, lse_stride), float("nan"), device="cuda", dtype=torch.float32)
    cu = torch.tensor(np.cumsum([0] + list(lens)), dtype=torch.int32, device="cuda")
    per_seq = [seq_params(mask_name, n) for n in lens]
    keep, pvals = param_tensors(torch, mask, per_seq)
    scale = 1.0 / math.sqrt(hd)
    desc, grid = kern.prepare(q, k, v, o_full, lse_full if with_lse else None, cu, max(lens),
                              lse_stride, pvals, scale)
    kern(desc, grid)
    try:
        torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001  (trap, illegal address: the context is gone)
        die(f"{mask_name} {dt}_d{hd} lens={lens}: kernel failed: {e}")
    del keep
    worst_o, worst_l, bad = 0.0, 0.0, []
    left = kern.counter_left()
    if left not in (None, [0, 0]):
        bad.append(f"work counter left at {left}, not zero")
    for b, n in enumerate(lens):
        t0 = int(cu[b])
        key = (mask_name, n, repr(sorted(per_seq[b].items())))
        if key not in _DENSE:
            _DENSE[key] = torch.from_numpy(dense(mask, n, per_seq[b])).to("cuda")
        vis = _DENSE[key]
        o_ref, lse_ref = reference(torch, q[t0:t0 + n], k[t0:t0 + n], v[t0:t0 + n], vis, scale)
        o = o_full[t0:t0 + n].double()
        if torch.isnan(o).any():
            bad.append(f"seq{b}: NaN in O ({int(torch.isnan(o).any(-1).any(-1).sum())} rows)")
            continue
        atol, rtol = TOL_O[dt]
        diff = (o - o_ref).abs()
        eo = diff.max().item() if n else 0.0
        worst_o = max(worst_o, eo)
        excess = (diff - rtol * o_ref.abs()).max().item() if n else 0.0
        if excess > atol:
            bad.append(f"seq{b}: O err {eo:.3g} beyond atol {atol} + rtol {rtol} * |ref|")
        if with_lse:
            lse = lse_full[:, t0:t0 + n].double()
            if torch.isnan(lse).any():
                bad.append(f"seq{b}: NaN in LSE")
                continue
            both_inf = torch.isinf(lse) & torch.isinf(lse_ref) & (lse.sign() == lse_ref.sign())
            el = torch.where(both_inf, torch.zeros_like(lse), (lse - lse_ref).abs())
            el = el.max().item() if n else 0.0
            worst_l = max(worst_l, el if el == el else float("inf"))
    if not torch.isnan(o_full[T:]).all():
        bad.append("wrote O past the last token")
    if with_lse and not torch.isnan(lse_full[:, T:]).all():
        bad.append("wrote LSE past the last token")
    if not with_lse and not torch.isnan(lse_full).all():
        bad.append("wrote LSE with desc.lse == 0")
    if worst_l > TOL_LSE:
        bad.append(f"LSE err {worst_l:.3g} > {TOL_LSE}")
    return (not bad), f"maxerr O={worst_o:.2e} LSE={worst_l:.2e}" + ("  " + "; ".join(bad) if bad else "")


_DENSE: dict = {}


def jagged(n: int) -> list[int]:
    return [n, max(1, n * 5 // 7 + 3)]


# ================================================================================= bench


def bench(gpu, kernels, args):
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    H, D = 16, 128
    print("\n== timing: causal, B*L = 32768, H = 16, D = 128, bf16 "
          "(median of 30 after warm-up; TFLOP/s = 4*B*H*D*visible_pairs / time)", flush=True)
    for L in (4096, 32768):
        B = 32768 // L
        pairs = B * L * (L + 1) // 2
        flops = 4.0 * H * D * pairs
        torch.manual_seed(1)
        q = torch.randn(B, L, H, D, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(B, L, H, D, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(B, L, H, D, device="cuda", dtype=torch.bfloat16)
        o = torch.empty_like(q)
        lse = torch.empty(H, B * L, device="cuda", dtype=torch.float32)
        cu = torch.arange(0, B * L + 1, L, dtype=torch.int32, device="cuda")
        flat = lambda x, n=B * L: x.view(n, H, D)  # noqa: E731
        res = {}

        def timeit(fn):
            for _ in range(5):
                fn()
            torch.cuda.synchronize()
            times = []
            for _ in range(30):
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                fn()
                b.record()
                b.synchronize()
                times.append(a.elapsed_time(b))
            times.sort()
            return times[len(times) // 2] / 1e3

        scale = 1.0 / math.sqrt(D)
        for label, kern in kernels.items():
            desc, grid = kern.prepare(flat(q), flat(k), flat(v), flat(o), lse, cu, L, B * L, {}, scale)
            res[label] = timeit(lambda kern=kern, desc=desc, grid=grid: kern(desc, grid))
            if label == "sm90":  # sanity of the timed run against SDPA
                ref = torch.nn.functional.scaled_dot_product_attention(
                    q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
                kern(desc, grid)
                torch.cuda.synchronize()
                err = (o.float() - ref.transpose(1, 2).float()).abs().max().item()
                print(f"  L={L}: sm90 vs SDPA max |dO| = {err:.3g}", flush=True)
        try:
            qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                res["sdpa-flash"] = timeit(
                    lambda qt=qt, kt=kt, vt=vt: torch.nn.functional.scaled_dot_product_attention(
                        qt, kt, vt, is_causal=True))
        except Exception as e:  # noqa: BLE001
            print(f"  sdpa flash unavailable: {e}")
        for label, t in res.items():
            print(f"  L={L:6d} B={B:2d} {label:11s} {t * 1e3:8.3f} ms  {flops / t / 1e12:7.1f} TFLOP/s",
                  flush=True)


# ================================================================================== main


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--compile-only", action="store_true", help="NVRTC + resources + SASS, no GPU")
    ap.add_argument("--no-bench", action="store_true")
    ap.add_argument("--bench-only", action="store_true")
    ap.add_argument("--masks", default=",".join(MASKS))
    ap.add_argument("--sched", choices=("dynamic", "static", "both"), default="both",
                    help="the sm90 schedule: the work counter (desc.sched), the static stride")
    ap.add_argument("--lengths", default=",".join(map(str, LENGTHS)))
    ap.add_argument("--variants", default="bf16_d64,bf16_d128,fp16_d64,fp16_d128")
    ap.add_argument("--jobs", type=int, default=min(16, os.cpu_count() or 1))
    args = ap.parse_args()
    t_start = time.perf_counter()

    masks = [m for m in args.masks.split(",") if m]
    modes = ("dynamic", "static") if args.sched == "both" else (args.sched,)
    lengths = [int(x) for x in args.lengths.split(",") if x]
    variants = [(v.split("_d")[0], int(v.split("_d")[1])) for v in args.variants.split(",") if v]
    if args.bench_only:
        masks, variants = ["causal"], [("bf16", 128)]
    elif not args.no_bench and "causal" in masks and ("bf16", 128) not in variants:
        variants.append(("bf16", 128))

    # ---- sources and NVRTC (threads: NVRTC releases the GIL)
    sources = {}
    for m in masks:
        try:
            sources[m] = build_source(m)
        except Exception as e:  # noqa: BLE001
            die(f"{m}: building the source failed: {type(e).__name__}: {e}")
    jobs = [(m, dt, hd) for m in masks for dt, hd in variants]
    want_portable = not args.compile_only and not args.no_bench and "causal" in masks

    def compile_one(job):
        m, dt, hd = job
        text = sources[m][0]
        # the watchdog turns a pipeline deadlock into a trap (2 s) instead of a hung GPU
        return nvrtc_compile(text, m, f"CMC_SM90_{dt}_d{hd}", extra=("-DCMC_SM90_WATCHDOG",))

    print(f"== NVRTC {ARCH}: {len(jobs)} sm90 variant(s), {args.jobs} thread(s)", flush=True)
    built, failed_build = {}, []
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as ex:
        futs = {job: ex.submit(compile_one, job) for job in jobs}
        pfut = None
        if want_portable:
            pfut = ex.submit(nvrtc_compile, sources["causal"][0], "causal", "CMC_VARIANT_bf16_d128")
        for job, fut in futs.items():
            try:
                cubin, log, secs = fut.result()
            except Exception as e:  # noqa: BLE001
                failed_build.append(job)
                print(f"  BUILD FAIL {job}: {e}", flush=True)
                continue
            built[job] = cubin
            m, dt, hd = job
            line = f"  {m:15s} {dt}_d{hd:<4d} {secs:5.1f} s  {ptxas_summary(log)}"
            if args.compile_only:
                line += "  " + sass_stats(cubin)
            print(line, flush=True)
        portable = pfut.result() if pfut else None
    if failed_build:
        die(f"{len(failed_build)} variant(s) failed to compile")
    if args.compile_only:
        print(f"compiled {len(built)} variant(s) in {time.perf_counter() - t_start:.1f} s")
        return 0

    # ---- correctness
    import torch  # noqa: F401

    gpu = Gpu()
    from cmc.abi import descriptor_layout

    passed = failed = 0
    if not args.bench_only:
        print("\n== correctness (batch 2 jagged, Hq=4/Hkv=2, NaN-poisoned outputs, float64 reference)",
              flush=True)
        for m in masks:
            text, table, emitted, n_terms, tiling = sources[m]
            layout = descriptor_layout(table.mask)
            for dt, hd in variants:
                smem = sm90_smem_bytes(hd, n_terms, tiling)
                fn = gpu.load(built[(m, dt, hd)], sm90_symbol(table.mask.name, dt, hd), smem)
                kerns = {mode: Kernel(gpu, fn, layout, THREADS, smem, tiling,
                                      dynamic=mode == "dynamic") for mode in modes}
                cases = [(n, True, mode) for n in lengths for mode in modes]
                if lengths:  # desc.lse == 0
                    cases.append((lengths[min(3, len(lengths) - 1)], False, modes[0]))
                for n, with_lse, mode in cases:
                    kern = kerns[mode]
                    lens = jagged(n)
                    try:
                        ok, msg = run_case(gpu, kern, table.mask, m, dt, hd, lens, with_lse)
                    except Exception as e:  # noqa: BLE001
                        ok, msg = False, f"EXCEPTION {type(e).__name__}: {e}"
                    passed += ok
                    failed += not ok
                    tag = ("" if with_lse else " lse=0") + f" {mode}"
                    print(f"  {'PASS' if ok else 'FAIL'} {m:15s} {dt}_d{hd:<3d} lens={lens}{tag}: {msg}",
                          flush=True)
                    if not ok and "EXCEPTION" in msg and "illegal" in msg.lower():
                        die("the GPU context is gone (illegal access); stopping")
        print(f"{passed} passed, {failed} failed", flush=True)

    if not args.no_bench and "causal" in masks:
        text, table, emitted, n_terms, _ = sources["causal"]
        layout = descriptor_layout(table.mask)
        kernels = {}
        smem = sm90_smem_bytes(128, n_terms)
        kernels["sm90"] = Kernel(gpu, gpu.load(built[("causal", "bf16", 128)],
                                               sm90_symbol("causal", "bf16", 128), smem),
                                 layout, THREADS, smem)
        if portable is not None:
            pv = next(v for v in emitted.variants if v.dtype == "bf16" and v.head_dim == 128)
            kernels["portable"] = Kernel(gpu, gpu.load(portable[0], pv.symbol, pv.smem_bytes),
                                         layout, pv.threads, pv.smem_bytes)
        bench(gpu, kernels, args)
    print(f"total {time.perf_counter() - t_start:.1f} s", flush=True)
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
