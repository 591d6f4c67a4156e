"""What tools/kernel_check.py and tools/sm90_check.py share: a mask built through cmc's own
pipeline (driver.front -> driver.back -> build.build, with extra NVRTC options where a tool
needs them -> package) into a folder, loaded with cmc.runtime.load, and one case launched
through Attention.__call__ (directly or with a plan) against the float64 reference of
tests/gpu/harness.py.

The CPU half (build_artifact) needs no GPU and no torch; the rest imports torch when called.
Two launch details the runtime keeps private are reached here on purpose, for checks only:
the LSE buffer it allocates is NaN-poisoned with padding after it (poisoned_lse), and the sm90
kernel can be run on its static schedule, without the work counter (static_schedule).
"""

from __future__ import annotations

import dataclasses
import math
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from unittest import mock

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from cmc.driver import Options, back, front  # noqa: E402
from tests.gpu import harness  # noqa: E402


def build_artifact(mask: str | Path, dest: Path, opts: Options, *,
                   defines: Mapping[str, int] | None = None,
                   variants: Sequence[tuple[str, int]] | None = None,
                   threads: int | None = None, extra_options: Sequence[str] = ()) -> tuple[Path, Any]:
    """mask (a path) through front, back, build (with extra_options) and package into
    dest/NAME; returns (that folder, the BuiltKernels). `variants` keeps only those (dtype,
    head dim) pairs; `threads` overrides the launch block of every forward variant (an
    option such as -DCMC_PORTABLE_MT=2 changes it; the backward kernels keep theirs, which
    load checks against their cubins' launch bounds)."""
    from cmc.build import build
    from cmc.package import package

    table = front(Path(mask), dict(defines or {}))
    source = back(table, opts)
    vs = source.variants
    if variants is not None:
        vs = tuple(v for v in vs if (v.dtype, v.head_dim) in set(variants))
        if not vs:
            raise SystemExit(f"{mask}: none of the variants {list(variants)} was emitted")
    if threads is not None:
        from cmc.kernels import Pass, spec

        vs = tuple(dataclasses.replace(v, threads=threads)
                   if spec(v.kernel).pass_ is Pass.FORWARD else v for v in vs)
    source = dataclasses.replace(source, variants=vs)
    built = build(source, archs=opts.archs, jobs=opts.jobs, cache=opts.cache,
                  extra_options=tuple(extra_options))
    return package(built, Path(dest), Path(mask).name), built


def ptxas_summary(log: str) -> str:
    """Registers, spills and stack of a ptxas -v log, and any warning or performance note."""
    import re

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


# --------------------------------------------------------------------------- launch hooks


@contextmanager
def poisoned_lse(torch: Any, pad: int) -> Iterator[list[tuple[Any, int]]]:
    """The runtime's LSE buffers, while inside, are NaN-filled with `pad` floats after them:
    yields the list of (whole buffer, used length) of every LSE allocated."""
    from cmc.runtime import loader

    made: list[tuple[Any, int]] = []

    def empty(q: Any, qi: Any, lib: str, heads: int, tokens: int) -> Any:
        buf = torch.full((heads * tokens + pad,), float("nan"), dtype=torch.float32,
                         device=q.device)
        made.append((buf, heads * tokens))
        return buf[:heads * tokens].view(heads, tokens)

    with mock.patch.object(loader, "_empty_lse", empty):
        yield made


@contextmanager
def static_schedule(attn: Any) -> Iterator[None]:
    """Launch the loaded kernels without their work counter (desc.sched = 0: each CTA strides
    over the units), on the persistent grid (min(units, SMs) CTAs) as the counter would."""
    from cmc.runtime import loader

    dk = attn._kernels(attn._device(None))
    saved = {key: kern.entry for key, kern in dk.kernels.items()}
    for kern in dk.kernels.values():
        kern.entry = dataclasses.replace(kern.entry, work_counter=False)
    try:
        with mock.patch.object(loader, "persistent_ctas", lambda n, *a, **k: n):
            yield
    finally:
        for key, entry in saved.items():
            dk.kernels[key].entry = entry


def counters_left(attn: Any) -> list[int]:
    """Every work counter of the current device (the kernel must leave each zero)."""
    import numpy as np
    from cuda.bindings import driver as cu

    dk = attn._kernels(attn._device(None))
    out: list[int] = []
    for ptr in dk.counters.by_stream.values():
        host = np.zeros(2, dtype=np.uint32)
        (err,) = cu.cuMemcpyDtoH(host.ctypes.data, ptr, host.nbytes)
        if int(err):
            raise RuntimeError(f"cuMemcpyDtoH of a work counter: {err}")
        out += [int(x) for x in host]
    return out


# --------------------------------------------------------------------------- one case


@dataclasses.dataclass
class Case:
    lens: list[int]
    heads_q: int
    heads_kv: int
    head_dim: int
    dtype: str  # bf16 | fp16
    variant: int = 0  # harness.seq_params / scalar_values: which edge values
    fused_qkv: bool = False  # Q, K, V as views of one [T, Hq + 2 Hkv, D] buffer
    pad: int = 64  # token rows after the batch in O (and floats after LSE): must stay NaN
    with_lse: bool = True
    planned: bool = False  # through attn.plan(...) and attn(..., plan=p)
    seed: int = 0


@dataclasses.dataclass
class Result:
    ok: bool
    rel: float = math.nan  # ||o - ref|| / ||ref||
    max_abs: float = math.nan
    lse_err: float = 0.0
    density: float = 0.0
    problems: list[str] = dataclasses.field(default_factory=list)

    def line(self) -> str:
        return (f"max_abs={self.max_abs:.3e} rel={self.rel:.3e} lse_err={self.lse_err:.2e}"
                + ("" if not self.problems else "  " + "; ".join(self.problems)))


def inputs(torch: Any, c: Case) -> tuple[Any, Any, Any]:
    """Packed q [T, Hq, D], k, v [T, Hkv, D] on the GPU, N(0, 1)."""
    total = sum(c.lens)
    g = torch.Generator(device="cuda").manual_seed(c.seed)
    dt = torch.bfloat16 if c.dtype == "bf16" else torch.float16
    hq, hk, d = c.heads_q, c.heads_kv, c.head_dim
    if c.fused_qkv:
        qkv = torch.randn(total, hq + 2 * hk, d, device="cuda", generator=g).to(dt)
        return qkv[:, :hq], qkv[:, hq:hq + hk], qkv[:, hq + hk:]
    return tuple(torch.randn(total, h, d, device="cuda", generator=g).to(dt)  # type: ignore
                 for h in (hq, hk, hk))


def case_params(mask: Any, c: Case) -> list[dict[str, Any]]:
    import numpy as np

    rng = np.random.default_rng(1000 * sum(c.lens) + c.variant)
    scalars = harness.scalar_values(mask, c.variant)
    return [harness.seq_params(mask, n, c.variant + b, rng, scalars)
            for b, n in enumerate(c.lens)]


def run_case(torch: Any, attn: Any, mask: Any, c: Case, *, rel_tol: float = 1e-2,
             lse_tol: float = 2e-3, elementwise: tuple[float, float] | None = None,
             after: Callable[[], list[str]] | None = None) -> Result:
    """One launch through the runtime on NaN-poisoned outputs, against the harness's float64
    reference. Checks (harness.compare and here): no NaN in O or LSE; rows with no visible key
    exactly 0 with LSE -inf; ||o - ref|| / ||ref|| < rel_tol; max LSE error < lse_tol; with
    `elementwise` = (atol, rtol), |o - ref| <= atol + rtol |ref| everywhere; nothing written
    past the last token of O or LSE; `after()` (e.g. the work counter) returns no problem."""
    per_seq = case_params(mask, c)
    q, k, v = inputs(torch, c)
    total = sum(c.lens)
    o_full = torch.full((total + c.pad, c.heads_q, c.head_dim), float("nan"), device="cuda",
                        dtype=q.dtype)
    out = o_full[:total]
    cu = torch.tensor([0, *torch.tensor(c.lens).cumsum(0).tolist()], dtype=torch.int32,
                      device="cuda")
    kw = harness.call_params(mask, per_seq)
    res = Result(False)
    with poisoned_lse(torch, c.pad) as made:
        if c.planned:
            p = attn.plan(cu_seqlens=cu, max_len=max(c.lens), **kw)
            got = attn(q, k, v, out=out, return_lse=c.with_lse, plan=p)
        else:
            got = attn(q, k, v, out=out, return_lse=c.with_lse, cu_seqlens=cu,
                       max_len=max(c.lens), **kw)
        torch.cuda.synchronize()
    lse = got[1] if c.with_lse else None
    scale = 1.0 / math.sqrt(c.head_dim)
    masks = harness.oracle_masks(torch, mask, c.lens, per_seq, "cuda")
    ref_o, ref_lse = harness.reference(torch, q, k, v, c.lens, masks, scale)
    visible = sum(int(m(0, n).sum()) for n, m in zip(c.lens, masks, strict=True) if n)
    res.density = visible / max(1, sum(n * n for n in c.lens))
    try:
        res.rel = harness.compare(torch, out, lse, ref_o, ref_lse)
    except AssertionError as e:
        res.problems.append(str(e))
    diff = (out.double() - ref_o).abs()
    res.max_abs = float(torch.nan_to_num(diff, nan=math.inf).max()) if total else 0.0
    if not res.rel < rel_tol:
        res.problems.append(f"relative error {res.rel:.3g} >= {rel_tol}")
    if elementwise is not None and total:
        atol, rtol = elementwise
        excess = float(torch.nan_to_num(diff - rtol * ref_o.abs(), nan=math.inf).max())
        if excess > atol:
            res.problems.append(f"O error {res.max_abs:.3g} beyond atol {atol} + rtol {rtol} |ref|")
    if lse is not None:
        fin = torch.isfinite(ref_lse)
        if bool(fin.any()):
            err = torch.nan_to_num((lse.double()[fin] - ref_lse[fin]).abs(), nan=math.inf)
            res.lse_err = float(err.max())
        if not res.lse_err < lse_tol:
            res.problems.append(f"LSE error {res.lse_err:.2e} >= {lse_tol}")
    written = int((~torch.isnan(o_full[total:])).sum())
    if written:
        res.problems.append(f"wrote {written} O values past the last token")
    for buf, used in made:
        n = int((~torch.isnan(buf[used:])).sum())
        if n:
            res.problems.append(f"wrote {n} LSE values past the end")
    if after is not None:
        res.problems += after()
    res.ok = not res.problems
    return res


def time_calls(torch: Any, call: Callable[[], Any], iters: int = 20, warmup: int = 3) -> list[float]:
    """Seconds per call from CUDA events around each call; the calls are queued without a
    sync between them, so the runtime's host time hides behind the previous kernel."""
    for _ in range(warmup):
        call()
    torch.cuda.synchronize()
    events = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        call()
        b.record()
        events.append((a, b))
    torch.cuda.synchronize()
    return [a.elapsed_time(b) / 1e3 for a, b in events]
