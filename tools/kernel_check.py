#!/usr/bin/env python3
"""GPU correctness and speed check of the portable (mma.sync) forward kernel.

Run on a CUDA machine from the repository root (no network needed):

    python3 tools/kernel_check.py            # every case, then the timing
    python3 tools/kernel_check.py --quick    # fewer shapes (a smoke test)
    python3 tools/kernel_check.py --masks causal,clear --no-timing

Needs torch (with CUDA), numpy, jinja2 and cuda-bindings (driver API + NVRTC). Every mask
goes through cmc's own pipeline: samples/NAME.mask -> cmc.driver front/back (the portable
kernel, for this device's arch) -> cmc.build.build -> cmc.package into a temporary folder
(tools/runtime_check.py), loaded with cmc.runtime.load and launched through
Attention.__call__ (every other case through a plan). An error in the front half stops the
check with its message. Parameters, the float64 reference and the comparisons come from
tests/gpu/harness.py.

What it checks, per mask, dtype x head dim (all four for the masks in REQUIRED or with
--all-variants-all-masks, else bf16 d128 and fp16 d64) and shape (jagged batches, GQA, MQA,
MHA, Q/K/V as views of one buffer; --quick: three shapes):
- no NaN in O or LSE (both poisoned with NaN before the launch);
- ||O - ref|| / ||ref|| < 1e-2 against masked softmax attention in float64;
- LSE within 2e-3 (natural log) where a row sees a key; -inf exactly where it sees none,
  and O exactly 0 on such rows;
- nothing written past the last token: 64 token rows after O, 64 floats after LSE.
The same for the 32-rows-per-warp shape (-DCMC_PORTABLE_MT=2, 128 threads: one constant away
from the default, cmc/kernels.py ROWS_PER_WARP) on causal, shared_prefix, clear and hstu,
unless --no-mt2. One line per case, then 'N passed, M failed'; exit status 1 on any failure.
Then (unless --no-timing) the median time and effective TFLOP/s of bf16 d128 at L=8192,
B=4, H=16 for the required masks, MT=2 beside it, causal d64, and torch SDPA as a reference.

seq_params, dense_mask, descriptor_values, Problem, make_inputs, _ok and device_arch stay
importable for tools/bwd_kernel_check.py.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

import numpy as np  # noqa: E402
import runtime_check as rc  # noqa: E402

from cmc.driver import Options  # noqa: E402
from cmc.evaluate import Env, eval_pred  # noqa: E402
from cmc.ir import IntervalTable, Mask  # noqa: E402
from tests.gpu import harness  # noqa: E402

LOG2E = 1.4426950408889634
REL_TOL = 1e-2
LSE_TOL = 2e-3  # natural-log units

DEFINES = {"chunked_causal": {"CHUNK": 512}, "block_causal_video": {"FRAME": 256},
           "hstu_context": {"CONTEXT": 64, "WINDOW": 300}}
REQUIRED = ("causal", "sliding_window", "hstu", "shared_prefix", "clear")
MT2_MASKS = ("causal", "shared_prefix", "clear", "hstu")
SMALL_VARIANTS = (("bf16", 128), ("fp16", 64))
ALL_VARIANTS = (("bf16", 64), ("bf16", 128), ("fp16", 64), ("fp16", 128))


def load_tables(names: list[str] | None) -> tuple[dict[str, IntervalTable], str]:
    """Every sample through cmc's front half; an error there is reported, never replaced."""
    from cmc.driver import front
    from cmc.errors import CmcError

    stems = sorted(p.stem for p in (ROOT / "samples").glob("*.mask"))
    if names:
        missing = [n for n in names if n not in stems]
        if missing:
            raise SystemExit(f"unknown masks {missing}; have {stems}")
        stems = list(names)
    try:
        tabs = {s: front(ROOT / "samples" / f"{s}.mask", DEFINES.get(s, {})) for s in stems}
    except CmcError as e:
        raise SystemExit(f"front half failed: {e}") from e
    return tabs, "cmc pipeline (samples/*.mask)"


# ============================================================================ parameters


def seq_params(mask: Mask, length: int, b: int) -> dict:
    """One sequence's parameter values (deterministic): the harness's edge cases by b, one
    scalar value for every sequence of a launch."""
    rng = np.random.default_rng(1000 * length + b)
    return harness.seq_params(mask, length, b, rng, harness.scalar_values(mask, 0))


def dense_mask(mask: Mask, length: int, params: dict) -> np.ndarray:
    from cmc.oracle import dense

    return dense(mask, length, params)


def count_visible(mask: Mask, length: int, params: dict, rows: int = 256) -> int:
    """Visible pairs of one sequence, a block of rows at a time (long sequences)."""
    kk = np.arange(length, dtype=np.int64)[None, :]
    total = 0
    for r0 in range(0, length, rows):
        qq = np.arange(r0, min(length, r0 + rows), dtype=np.int64)[:, None]
        v = eval_pred(mask.predicate, Env(length, params, {"q": qq, "k": kk}))
        total += int(np.broadcast_to(np.asarray(v, dtype=bool), (qq.shape[0], length)).sum())
    return total


# ============================================================================ for bwd_kernel_check


def probe_cubin(source: str, name: str, arch: str) -> bytes:
    """A probe kernel's source (tools/red_probe.py, race_probe.py) built for arch by NVRTC
    (cmc.build's compile); the log ends the run if it does not build."""
    from cmc.build import nvrtc_compile

    r = nvrtc_compile(source, name, [f"--gpu-architecture={arch}", "-std=c++17"])
    if not r.ok:
        raise SystemExit(r.log)
    return r.cubin


def _ok(res: Any, what: str) -> Any:
    """A cuda-bindings result: raises on an error, else the value(s) after it."""
    from cuda.bindings import driver as cu

    err = res[0] if isinstance(res, tuple) else res
    if int(err) != 0:
        name = cu.cuGetErrorName(err)[1] if isinstance(err, cu.CUresult) else err
        raise RuntimeError(f"{what} failed: {name}")
    if isinstance(res, tuple):
        return res[1] if len(res) == 2 else res[1:]
    return None


def device_arch() -> str:
    """The arch to build for on device 0 (driver API; torch not needed)."""
    from cuda.bindings import driver as cu

    _ok(cu.cuInit(0), "cuInit")
    a = cu.CUdevice_attribute
    major = _ok(cu.cuDeviceGetAttribute(a.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, 0), "cc")
    minor = _ok(cu.cuDeviceGetAttribute(a.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, 0), "cc")
    if (major, minor) in ((9, 0), (10, 0)):
        return f"sm_{major}{minor}a"
    if major == 8:
        return "sm_80"
    return f"sm_{major}{minor}"


@dataclass
class Problem:
    lens: list[int]
    heads_q: int
    heads_kv: int
    head_dim: int
    dtype: Any  # torch.dtype
    fused_qkv: bool = False  # Q, K, V as views of one [T, Hq + 2 Hkv, D] buffer
    pad: int = 64  # extra token rows after the batch in O/LSE: must stay NaN


def make_inputs(pb: Problem, seed: int) -> tuple[Any, Any, Any, Any, Any]:
    """q, k, v [T, H, D] and NaN-filled o [T + pad, Hq, D], lse [Hq, T + pad]."""
    import torch

    c = rc.Case(pb.lens, pb.heads_q, pb.heads_kv, pb.head_dim,
                "bf16" if pb.dtype == torch.bfloat16 else "fp16", fused_qkv=pb.fused_qkv,
                seed=seed)
    qt, kt, vt = rc.inputs(torch, c)
    total = sum(pb.lens)
    o = torch.full((total + pb.pad, pb.heads_q, pb.head_dim), float("nan"), device="cuda",
                   dtype=pb.dtype)
    lse = torch.full((pb.heads_q, total + pb.pad), float("nan"), device="cuda",
                     dtype=torch.float32)
    return qt, kt, vt, o, lse


def descriptor_values(mask: Mask, pb: Problem, qt: Any, kt: Any, vt: Any, o: Any, lse: Any,
                      per_seq: list[dict], keep: list) -> dict:
    """Descriptor field values for a hand-made launch (tools/bwd_kernel_check.py); this tool
    launches through cmc.runtime instead."""
    import torch

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


# ============================================================================ builds


def variants_of(name: str, all_variants: bool) -> tuple[tuple[str, int], ...]:
    return ALL_VARIANTS if all_variants or name in REQUIRED else SMALL_VARIANTS


def build_kernels(names: list[str], arch: str, dest: Path, *, all_variants: bool = False,
                  mt2: bool = True, timing: bool = True, jobs: int = 2,
                  only: tuple[tuple[str, int], ...] | None = None
                  ) -> dict[tuple[str, int | None], Path]:
    """(mask, MT or None) -> its artifact folder under dest: the portable kernel for `arch`
    through cmc's pipeline; MT=2 with -DCMC_PORTABLE_MT=2 and 128-thread blocks. `only`
    narrows every build to those (dtype, head dim) variants."""
    out: dict[tuple[str, int | None], Path] = {}
    for name in names:
        mask = ROOT / "samples" / f"{name}.mask"
        shapes: list[tuple[int | None, tuple[tuple[str, int], ...]]] = [
            (None, variants_of(name, all_variants))]
        if mt2 and name in MT2_MASKS:
            want = SMALL_VARIANTS + ((("bf16", 64),) if timing and name == "causal" else ())
            shapes.append((2, want))
        for mt, variants in shapes:
            variants = tuple(x for x in variants if only is None or x in only)
            if not variants:
                continue
            dts = tuple(sorted({d for d, _ in variants}))
            hds = tuple(sorted({h for _, h in variants}))
            opts = Options(archs=(arch,), dtypes=dts, head_dims=hds, jobs=jobs, kernel="portable",
                           backward=False)
            extra = () if mt is None else (f"-DCMC_PORTABLE_MT={mt}",)
            path, built = rc.build_artifact(
                mask, dest / f"mt{mt or 1}", opts, defines=DEFINES.get(name, {}),
                variants=variants, threads=None if mt is None else 256 // mt,
                extra_options=extra)
            out[(name, mt)] = path
            for c in built.cubins:
                tag = "" if mt is None else f" [MT={mt}]"
                print(f"  built {c.symbol}{tag} for {arch}: NVRTC {c.build_seconds:.2f} s, "
                     f"{rc.ptxas_summary(c.log)}", flush=True)
    return out


# ============================================================================ cases


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


def run_one(torch: Any, attn: Any, mask: Mask, name: str, c: rc.Case, tag: str) -> bool:
    try:
        r = rc.run_case(torch, attn, mask, c, rel_tol=REL_TOL, lse_tol=LSE_TOL)
        ok, detail = r.ok, f"density={r.density:.3f} {r.line()}"
    except Exception as e:  # noqa: BLE001
        ok, detail = False, f"{type(e).__name__}: {e}"
    print(f"{'PASS' if ok else 'FAIL'} {name:<20} {c.dtype} d{c.head_dim:<3}{tag} lens={c.lens} "
          f"heads={c.heads_q}:{c.heads_kv}{' fused-qkv' if c.fused_qkv else ''}"
          f"{' plan' if c.planned else ''} {detail}", flush=True)
    return ok


# ============================================================================ timing


def time_kernel(torch: Any, name: str, mask: Mask, attn: Any, length: int, batch: int,
                heads: int, dim: int, tag: str = "", iters: int = 20, sdpa: bool = True) -> None:
    c = rc.Case([length] * batch, heads, heads, dim, "bf16", variant=1, pad=0)
    per_seq = rc.case_params(mask, c)
    q, k, v = (x.view(batch, length, heads, dim) for x in rc.inputs(torch, c))
    p = attn.plan(batch=batch, seq_len=length, **harness.call_params(mask, per_seq))
    out = torch.empty_like(q)
    times = rc.time_calls(torch, lambda: attn(q, k, v, out=out, plan=p), iters)
    med = statistics.median(times)
    if name == "causal":
        pairs = length * (length + 1) // 2 * batch
    else:
        pairs = sum(count_visible(mask, length, ps) for ps in per_seq)
    flops = 4 * heads * dim * pairs
    print(f"TIME {name:<20} bf16 d{dim}{tag} L={length} B={batch} H={heads}: "
          f"median {med * 1e3:.3f} ms, {flops / med / 1e12:.1f} effective TFLOP/s "
          f"(min {min(times) * 1e3:.3f} ms)", flush=True)
    if name == "causal" and sdpa:
        try:
            import torch.nn.functional as F

            qb, kb, vb = (x.transpose(1, 2) for x in (q, k, v))
            ts = rc.time_calls(torch, lambda: F.scaled_dot_product_attention(
                qb, kb, vb, is_causal=True), iters)
            m2 = statistics.median(ts)
            print(f"TIME torch SDPA causal (reference point) : median {m2 * 1e3:.3f} ms, "
                  f"{flops / m2 / 1e12:.1f} effective TFLOP/s", flush=True)
        except Exception as e:  # informational only
            print(f"(torch SDPA timing skipped: {e})")


# ============================================================================ main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--masks", help="comma-separated mask names (default: all)")
    ap.add_argument("--quick", action="store_true", help="fewer shapes")
    ap.add_argument("--no-timing", action="store_true")
    ap.add_argument("--no-mt2", action="store_true",
                    help="skip the 32-rows-per-warp (CMC_PORTABLE_MT=2) checks and timing")
    ap.add_argument("--all-variants-all-masks", action="store_true",
                    help="every dtype x head dim for every mask (default: full matrix for the "
                         "required masks, bf16 d128 + fp16 d64 for the others)")
    ap.add_argument("--jobs", type=int, default=min(8, os.cpu_count() or 1),
                    help="NVRTC threads per build")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    from cmc.build import nvrtc_version
    from cmc.runtime import load

    torch.zeros(1, device="cuda")  # torch's primary context, shared with the runtime
    arch = device_arch()
    print(f"device: {torch.cuda.get_device_name()} ({arch}), torch {torch.__version__}, "
          f"NVRTC {nvrtc_version()}", flush=True)
    tables, how = load_tables(args.masks.split(",") if args.masks else None)
    print(f"tables: {how}", flush=True)
    timing = not args.no_timing
    passed = failed = 0
    seed = 0
    attns: dict[tuple[str, int | None], Any] = {}
    with tempfile.TemporaryDirectory(prefix="kernel_check-") as tmp:
        for name, table in tables.items():
            try:
                paths = build_kernels([name], arch, Path(tmp), mt2=not args.no_mt2,
                                      all_variants=args.all_variants_all_masks, timing=timing,
                                      jobs=args.jobs)
            except Exception as e:  # noqa: BLE001
                print(f"FAIL {name:<20} build: {type(e).__name__}: {e}", flush=True)
                failed += 1
                continue
            for (_, mt), path in paths.items():
                attn = attns[(name, mt)] = load(path)
                tag = "" if mt is None else f" [MT={mt}]"
                shapes = problems(args.quick) if mt is None else (
                    problems(True) + [([4096], 4, 2, False)])
                wanted = (variants_of(name, args.all_variants_all_masks) if mt is None
                          else SMALL_VARIANTS)
                for dt, hd in wanted:
                    for lens, hq, hk, fused in shapes:
                        seed += 1
                        c = rc.Case(lens, hq, hk, hd, dt, variant=seed, fused_qkv=fused,
                                    planned=seed % 2 == 0, seed=seed)
                        ok = run_one(torch, attn, table.mask, name, c, tag)
                        passed += ok
                        failed += not ok
        print(f"{passed} passed, {failed} failed", flush=True)

        if timing:
            runs = [(n, None, 128, True) for n in REQUIRED] + [
                ("causal", 2, 128, False), ("hstu", 2, 128, False),
                ("causal", None, 64, True), ("causal", 2, 64, False)]
            for name, mt, dim, sdpa in runs:
                if (name, mt) not in attns:
                    continue
                tag = "" if mt is None else f" [MT={mt}]"
                try:
                    time_kernel(torch, name, tables[name].mask, attns[(name, mt)], 8192, 4, 16,
                                dim, tag, sdpa=sdpa)
                except Exception as e:  # noqa: BLE001
                    print(f"TIME {name} d{dim}{tag}: failed: {e}", flush=True)
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
