"""The benchmark: cmc beside FlexAttention (Triton and FA4 backends), cuDNN flex (interval
masks), SDPA/cuDNN and FA4 native, in one process, on the same inputs, forward and backward.
Prints a table last, writes JSON (after every case) and PNGs.

    python benchmarks/bench.py --artifacts out/bench --out results/   (on a GPU machine)

Artifacts come from `python benchmarks/bench.py --compile out/bench` (CPU is enough).
Two suites: `public` (the masks cmc's samples ship) and `generality` (masks a user would write,
benchmarks/generality/*.mask, that the samples do not tune to).
Effective TFLOP/s = 4 * B * H * D * visible pairs / time (forward); backward = 2.5 x those FLOPs
/ (time of forward+backward - time of forward); training step = 3.5 x / time of forward+backward.
Timing: triton.testing.do_bench (median; it clears the L2 between runs), warm-up excluded;
first-call latency measured apart.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import masks  # noqa: E402

from cmc.kernels import BWD_KERNELS, KV_HEAVY_FROM  # noqa: E402

TOKENS = 32768
HEADS = 16
HEAD_DIM = 128
LENGTHS = (1024, 2048, 4096, 8192, 16384, 32768)
GEN_LENGTHS = (4096, 16384)
CHECK_LEN = 1024


def _sp_params(rng: Any, n: int) -> dict[str, Any]:
    r = (n - n // 4) // 4
    return {"prompt_len": n // 4, "responses": [n // 4 + i * r for i in range(4)]}


PUBLIC: tuple[masks.Spec, ...] = (
    masks.Spec("causal", "public", "samples/causal.mask", {}, masks.causal),
    masks.Spec("hstu", "public", "samples/hstu.mask", {}, masks.hstu,
               lambda rng, n: {"n_targets": n // 8}),
    masks.Spec("shared_prefix", "public", "samples/shared_prefix.mask", {}, masks.shared_prefix,
               _sp_params),
    masks.Spec("clear", "public", "samples/clear.mask", {"TEXT": 0}, masks.grid(0, 128, 16)),
    masks.Spec("clear_text", "public", "samples/clear.mask", {"TEXT": 512},
               masks.grid(512, 128, 16)),
)
# cases that reuse another case's artifact
ALIASES = {"hstu_jagged": "hstu", "shared_prefix_jagged": "shared_prefix"}


def all_specs() -> list[masks.Spec]:
    return [*PUBLIC, *masks.GENERALITY]


SPECS = {s.key: s for s in all_specs()}
# mask file, -D overrides, per artifact folder name
ARTIFACTS = {s.key: (s.mask, s.defines) for s in all_specs()}


def compile_all(dest: Path, tiling: str = "auto", suite: str = "all",
                bwd_kernel: str = "auto", reg_split: str = "auto",
                patterns: Sequence[str] = (), short_kernels: bool = True,
                dq_layout: str = "auto", kv_heavy_from: int | None = KV_HEAVY_FROM) -> None:
    from cmc.driver import compile_file

    for spec in all_specs():
        if suite != "all" and spec.suite != suite:
            continue
        if patterns and spec.key not in patterns:
            continue
        t = time.perf_counter()
        path = compile_file(ROOT / spec.mask, dest / spec.key, archs=["sm_90a"], dtypes=["bf16"],
                            head_dims=[HEAD_DIM], defines=spec.defines, jobs=2, tiling=tiling,
                            bwd_kernel=bwd_kernel, reg_split=reg_split,
                            short_kernels=short_kernels, dq_layout=dq_layout,
                            kv_heavy_from=kv_heavy_from)
        print(f"compiled {spec.key} -> {path} in {time.perf_counter() - t:.1f} s", flush=True)


def runtime_copy(src: Path, dst: Path) -> int:
    """The artifacts under src as the runtime loads them, without their NAME.cu sources (which
    only `cmc compile --check` reads): 8 of out/bench's 19 MB on 2026-12-05, small enough to
    carry to the device beside the FA4 parts. Returns the bytes copied."""
    import shutil

    if dst.exists():
        shutil.rmtree(dst)
    n = 0
    for f in sorted(src.rglob("*")):
        if f.is_file() and f.suffix != ".cu":
            out = dst / f.relative_to(src)
            out.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(f, out)
            n += f.stat().st_size
    return n


@dataclass
class Case:
    pattern: str  # a Spec key, or an ALIASES key
    length: int
    lengths: list[int]  # per sequence (packed when jagged)
    params: list[dict[str, Any]]  # per sequence, host values (cmc's show/oracle form)
    jagged: bool
    visible_pairs: int = 0
    suite: str = "public"


@dataclass
class Result:
    case: str
    pattern: str
    length: int
    system: str
    ms: float | None
    tflops: float | None
    first_call_s: float | None = None
    mask_build_ms: float | None = None
    max_err: float | None = None
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    fwdbwd_ms: float | None = None
    bwd_tflops: float | None = None  # 2.5 x forward FLOPs / (fwd+bwd - fwd)
    step_tflops: float | None = None  # 3.5 x forward FLOPs / (fwd+bwd)
    bwd_note: str = ""


def _jagged_lengths(rng: Any, L: int) -> list[int]:
    """Lengths in [L/2, L] packed into at most TOKENS tokens."""
    lens: list[int] = []
    while True:
        n = int(rng.integers(L // 2, L + 1))
        if sum(lens) + n > TOKENS:
            return lens
        lens.append(n)


def make_cases(rng: Any, lengths: tuple[int, ...], suite: str = "public",
               gen_lengths: tuple[int, ...] = GEN_LENGTHS) -> list[Case]:
    cases = []
    for L in lengths if suite in ("public", "all") else ():
        B = TOKENS // L
        cases.append(Case("causal", L, [L] * B, [{}] * B, False))
        cases.append(Case("hstu", L, [L] * B, [{"n_targets": L // 8}] * B, False))
        cases.append(Case("shared_prefix", L, [L] * B, [_sp_params(rng, L)] * B, False))
        cases.append(Case("clear", L, [L] * B, [{}] * B, False))
        lens = _jagged_lengths(rng, L)
        cases.append(Case("hstu_jagged", L, lens, [{"n_targets": n // 8} for n in lens], True))
        sp: list[dict[str, Any]] = []
        for _ in range(B):
            p = int(rng.integers(L // 8, L // 2))
            cuts = sorted(int(x) for x in rng.choice(range(p + 1, L), size=3, replace=False))
            sp.append({"prompt_len": p, "responses": [p] + cuts})
        cases.append(Case("shared_prefix_jagged", L, [L] * B, sp, False))
        if L > 512:
            cases.append(Case("clear_text", L, [L] * B, [{}] * B, False))
    for L in gen_lengths if suite in ("generality", "all") else ():
        for spec in masks.GENERALITY:
            lens = _jagged_lengths(rng, L) if spec.jagged else [L] * (TOKENS // L)
            params = [spec.make_params(rng, n) for n in lens]
            if not spec.jagged:  # one draw for the batch: equal rows, like the public suite
                params = [params[0]] * len(lens)
            cases.append(Case(spec.key, L, lens, params, spec.jagged, suite="generality"))
    return cases


def artifact_for(pattern: str) -> str:
    return ALIASES.get(pattern, pattern)


def spec_for(pattern: str) -> masks.Spec:
    return SPECS[artifact_for(pattern)]


def cmc_params(c: Case) -> dict[str, Any]:
    """Host values in the runtime's form: int[batch] and segments as per-sequence lists, an
    int param as one value."""
    scalars = spec_for(c.pattern).scalars
    out: dict[str, Any] = {}
    for name in c.params[0] if c.params else ():
        out[name] = (int(c.params[0][name]) if name in scalars
                     else [p[name] for p in c.params])
    return out


def estimate(cases: list[Case], rounds: int, rep: int, bwd: bool) -> str:
    """A rough time estimate. The per-case costs are assumptions: run 10 took about 6 s a
    case forward only (two Flex compiles), a backward compile is taken as twice a forward,
    cuDNN flex's first call as the bundle notes' 4 s; bench.json records the measured
    first-call times to correct them."""
    compile_s = 2 * (2.5 + (5.0 if bwd else 0.0)) + 4.0 * (2 if bwd else 1)  # flex x2, cuDNN
    per_bench_s = (25 + rep) / 1e3 + 0.15
    systems = 5
    timing_s = rounds * systems * (2 if bwd else 1) * per_bench_s
    total = len(cases) * (compile_s + timing_s + 1.0)
    return (f"estimate: {len(cases)} cases x ({compile_s:.0f} s compiles + {timing_s:.0f} s "
            f"timing) = {total / 60:.1f} min (assumed costs; see bench.py estimate())")


# --------------------------------------------------------------------------- cuDNN endpoints


def cudnn_endpoints(c: Case, mod: Any, torch: Any, device: str) -> Any:
    """int32 [1, nfunc, total_q] for cuDNN flex, from the same mask_mod the Flex peers run,
    evaluated densely on the GPU in row chunks; the layout is masks.endpoints_from_edges."""
    import numpy as np

    rows_all, cols_all = [], []
    q0 = 0
    for i, n in enumerate(c.lengths):
        off = q0 if c.jagged else 0
        b = 0 if c.jagged else i
        k = torch.arange(n, device=device, dtype=torch.int32)[None, :] + off
        chunk = max(1, (1 << 26) // n)
        for r0 in range(0, n, chunk):
            r1 = min(n, r0 + chunk)
            q = torch.arange(r0, r1, device=device, dtype=torch.int32)[:, None] + off
            vis = torch.broadcast_to(mod(b, 0, q, k), (r1 - r0, n)).to(torch.bool)
            pad = torch.zeros((r1 - r0, 1), device=device, dtype=torch.bool)
            change = torch.cat([vis, pad], 1) != torch.cat([pad, vis], 1)
            r, col = torch.nonzero(change, as_tuple=True)
            rows_all.append((r + q0 + r0).cpu().numpy())
            cols_all.append(col.cpu().numpy())
        q0 += n
    ends = masks.endpoints_from_edges(np.concatenate(rows_all), np.concatenate(cols_all), q0)
    return torch.from_numpy(ends).to(device).unsqueeze(0).contiguous()


# --------------------------------------------------------------------------- runner


def run(args: argparse.Namespace, sink: Any = None) -> list[Result]:
    import numpy as np
    import torch
    import triton

    from cmc.driver import front
    from cmc.runtime import load
    from cmc.tiles import visible_pairs

    dev = "cuda"
    rng = np.random.default_rng(20261202)
    cases = make_cases(rng, tuple(args.lengths), args.suite, tuple(args.gen_lengths))
    if args.patterns:
        cases = [c for c in cases if c.pattern in args.patterns]
    with_bwd = not args.no_bwd
    print(estimate(cases, args.rounds, args.rep, with_bwd), flush=True)
    keys = sorted({artifact_for(c.pattern) for c in cases})
    tables = {key: front(ROOT / ARTIFACTS[key][0], ARTIFACTS[key][1]) for key in keys}
    for c in cases:
        t = tables[artifact_for(c.pattern)]
        c.visible_pairs = sum(visible_pairs(t, n, p) for n, p in zip(c.lengths, c.params))

    kernels: dict[str, Any] = {}
    load_s: dict[str, float] = {}
    load_err: dict[str, str] = {}
    for key in keys:
        t0 = time.perf_counter()
        try:
            kernels[key] = load(_artifact_dir(Path(args.artifacts), key))
        except (Exception, SystemExit) as e:  # noqa: BLE001
            load_err[key] = f"failed: {type(e).__name__}: {str(e)[:160]}"
            print(f"cmc {key}: {load_err[key]}", flush=True)
        load_s[key] = time.perf_counter() - t0

    ab_kernels = {Path(d).name: {key: load(_artifact_dir(Path(d), key)) for key in keys}
                  for d in (args.ab or [])}

    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    have_fa4 = True
    try:
        from flash_attn.cute.interface import flash_attn_func
    except Exception as e:  # noqa: BLE001
        have_fa4 = False
        print(f"flash-attn-4 not available: {e!r}")
    have_cudnn_flex = True
    try:
        from cudnn.flex_attention import create_mask_plan, flex_attn_func
    except Exception as e:  # noqa: BLE001
        have_cudnn_flex = False
        print(f"cuDNN flex not available: {e!r}")

    results: list[Result] = []

    def flush() -> None:
        if sink is not None:
            sink(results)

    if args.check:
        results += check_peers(cases, tables, kernels, have_fa4, flex_attention,
                               create_block_mask)
        flush()
    if have_cudnn_flex:
        results += check_endpoints(cases, tables, torch, dev)
        flush()

    def bench(fn: Any, grads: list[Any] | None = None) -> float:
        return float(triton.testing.do_bench(fn, warmup=args.warmup, rep=args.rep,
                                             grad_to_none=grads, return_mode="median"))

    def out_of(o: Any) -> Any:
        return o[0] if isinstance(o, tuple) else o

    for c in cases:
        T = sum(c.lengths)
        B = len(c.lengths)
        torch.manual_seed(0)
        q = torch.randn(T, HEADS, HEAD_DIM, device=dev, dtype=torch.bfloat16)
        k = torch.randn_like(q)
        v = torch.randn_like(q)
        do = torch.randn_like(q)
        flops = 4.0 * HEADS * HEAD_DIM * c.visible_pairs
        name = f"{c.pattern}/{c.length}"
        key = artifact_for(c.pattern)
        attn = kernels.get(key)
        cu = torch.zeros(B + 1, dtype=torch.int32, device=dev)
        cu[1:] = torch.cumsum(torch.tensor(c.lengths, device=dev, dtype=torch.int32), 0)
        kw = cmc_params(c)
        shape = (B, c.length, HEADS, HEAD_DIM)

        # equal lengths go in the batch layout [B, L, H, D] (the runtime may then launch
        # persistently); jagged ones packed with cu_seqlens. Lengths and mask parameters go
        # through a plan, checked and uploaded once on the first call (as Flex's block mask
        # is built once, outside the timing)
        plans: dict[int, Any] = {}

        def call(a: Any, q: Any = q, k: Any = k, v: Any = v) -> Any:
            p = plans.get(id(a))
            if p is None:
                p = plans[id(a)] = (a.plan(cu_seqlens=cu, max_len=max(c.lengths), **kw)
                                    if c.jagged else a.plan(batch=B, seq_len=c.length, **kw))
            if c.jagged:
                return a(q, k, v, plan=p, deterministic=args.deterministic)
            return a(q.view(shape), k.view(shape), v.view(shape), plan=p,
                     deterministic=args.deterministic)

        def grad_inputs(*xs: Any) -> list[Any]:
            return [x.detach().clone().requires_grad_(True) for x in xs]

        def make_fwdbwd(fn: Any, xs: list[Any], dout: Any) -> Any:
            def fb() -> None:
                out_of(fn(*xs)).backward(dout)
            return fb

        if ab_kernels:  # kernel A/B: variants interleaved per round, median over rounds
            # the order flips every round: a fixed order favoured the first variant by 2-5 %
            # (identical kernels, docs/bench/ab_qrp.json and ab_msm.json). With the backward
            # (not --no-bwd, artifacts that have it), forward+backward is timed beside it, so
            # two backward kinds (--compile --bwd-kernel auto / ws) compare on every case.
            times: dict[str, list[float]] = {n: [] for n in ab_kernels}
            fb_times: dict[str, list[float]] = {n: [] for n in ab_kernels}
            xs = grad_inputs(q, k, v)
            dout = do if c.jagged else do.view(shape)
            for rnd in range(args.ab_rounds):
                order = list(ab_kernels.items())
                for n, ks in (order if rnd % 2 == 0 else order[::-1]):
                    a = ks[key]
                    times[n].append(bench(lambda a=a: call(a)))
                    if with_bwd and getattr(a, "has_backward", False):
                        fb = make_fwdbwd(lambda x, y, z, a=a: call(a, x, y, z), xs, dout)
                        fb_times[n].append(bench(fb, xs))
            for n, ts in times.items():
                ms = float(np.median(ts))
                r = Result(name, c.pattern, c.length, f"cmc:{n}", ms, flops / ms / 1e9, None,
                           extra={"ms": ts, "fwdbwd_ms": fb_times[n]})
                if fb_times[n]:
                    r.fwdbwd_ms = float(np.median(fb_times[n]))
                    if r.fwdbwd_ms > ms:
                        r.bwd_tflops = 2.5 * flops / (r.fwdbwd_ms - ms) / 1e9
                    r.step_tflops = 3.5 * flops / r.fwdbwd_ms / 1e9
                results.append(r)
            flush()
            continue

        # A system: fwd() under no_grad, and fwdbwd() (None where it has no backward) on
        # inputs that require grad. Every system is first called once (first-call latency),
        # then timed in rounds, interleaved, the order reversed every round: timed one after
        # the other, a system's ratio also measured the card's drift (clock, temperature)
        @dataclass
        class System:
            name: str
            fwd: Any
            fwdbwd: Any = None
            grads: list[Any] = field(default_factory=list)
            first_s: float | None = None
            mask_ms: float | None = None
            bwd_first_s: float | None = None
            bwd_note: str = ""
            extra: dict[str, Any] = field(default_factory=dict)

        candidates: list[System] = []
        if attn is None:
            results.append(Result(name, c.pattern, c.length, "cmc", None, None,
                                  note=load_err.get(key, "no artifact")))
        else:
            s = System("cmc", lambda: call(attn))
            if with_bwd and getattr(attn, "has_backward", False):
                gq, gk, gv = grad_inputs(q, k, v)
                s.fwdbwd = make_fwdbwd(lambda a, b_, c_: call(attn, a, b_, c_), [gq, gk, gv],
                                       do if c.jagged else do.view(shape))
                s.grads = [gq, gk, gv]
            elif with_bwd:
                s.bwd_note = "no backward in this cmc"
            s.extra["load_s"] = load_s[key]
            candidates.append(s)
        fq = fk = fv = bm = None
        if not args.only_cmc:
            # flex (B, H, L, D); jagged: one packed sequence
            if c.jagged:
                fq, fk, fv = (x.unsqueeze(0).transpose(1, 2).contiguous() for x in (q, k, v))
                fdo = do.unsqueeze(0).transpose(1, 2).contiguous()
                fb, fl = 1, T
            else:
                fq, fk, fv = (x.view(shape).transpose(1, 2).contiguous() for x in (q, k, v))
                fdo = do.view(shape).transpose(1, 2).contiguous()
                fb, fl = B, c.length
            mm = masks.mask_mod(spec_for(c.pattern).pred, c.lengths, c.params, c.jagged,
                                lambda a: torch.as_tensor(a, device=dev))
            # a fresh compile per case: dynamo's recompile limit would otherwise send later
            # cases to the unfused eager path (it materialises the L x L scores)
            torch._dynamo.reset()
            flex = torch.compile(flex_attention, dynamic=False)
            mask_ms = None
            try:
                t_first = time.perf_counter()
                bm = create_block_mask(mm, fb, None, fl, fl, device=dev)
                torch.cuda.synchronize()
                mask_ms = (time.perf_counter() - t_first) * 1e3
            except Exception as e:  # noqa: BLE001
                for sysname in ("flex-triton", "flex-fa4"):
                    results.append(Result(name, c.pattern, c.length, sysname, None, None,
                                          note=f"block mask failed: {type(e).__name__}: "
                                               f"{str(e)[:140]}"))
            flex_backends = (("flex-triton", None), ("flex-fa4", {"BACKEND": "FLASH"}))
            for sysname, opts in flex_backends if bm is not None else ():
                if sysname == "flex-fa4" and not have_fa4:
                    continue

                def peer(a: Any = fq, b_: Any = fk, c_: Any = fv, opts: Any = opts,
                         bm: Any = bm) -> Any:
                    return flex(a, b_, c_, block_mask=bm, kernel_options=opts)

                s = System(sysname, peer, mask_ms=mask_ms)
                if with_bwd:
                    xs = grad_inputs(fq, fk, fv)
                    s.fwdbwd, s.grads = make_fwdbwd(peer, xs, fdo), xs
                candidates.append(s)
            if have_cudnn_flex:
                try:
                    t0 = time.perf_counter()
                    mf = cudnn_endpoints(c, mm, torch, dev)
                    torch.cuda.synchronize()
                    ends_ms = (time.perf_counter() - t0) * 1e3
                    cq, ck, cv = (x if c.jagged else x.view(shape) for x in (q, k, v))
                    varlen = ({"cu_seqlens_q": cu, "cu_seqlens_k": cu,
                               "max_seqlen_q": max(c.lengths), "max_seqlen_k": max(c.lengths)}
                              if c.jagged else {})
                    t0 = time.perf_counter()
                    plan = create_mask_plan(mf, cq, ck, cv, build_backward=with_bwd, **varlen)
                    torch.cuda.synchronize()
                    plan_ms = (time.perf_counter() - t0) * 1e3

                    def cudnn_flex(a: Any = cq, b_: Any = ck, c_: Any = cv,
                                   plan: Any = plan) -> Any:
                        return flex_attn_func(a, b_, c_, mask_plan=plan)

                    s = System("cudnn-flex", cudnn_flex, mask_ms=plan_ms,
                               extra={"nfunc": int(mf.shape[1]), "endpoints_ms": ends_ms})
                    if with_bwd:
                        xs = grad_inputs(cq, ck, cv)
                        s.fwdbwd, s.grads = make_fwdbwd(cudnn_flex, xs,
                                                        do if c.jagged else do.view(shape)), xs
                    candidates.append(s)
                except Exception as e:  # noqa: BLE001
                    results.append(Result(name, c.pattern, c.length, "cudnn-flex", None, None,
                                          note=f"plan failed: {type(e).__name__}: "
                                               f"{str(e)[:160]}"))
            if c.pattern == "causal":
                from torch.nn.attention import SDPBackend, sdpa_kernel

                def cudnn_sdpa(a: Any = fq, b_: Any = fk, c_: Any = fv) -> Any:
                    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                        return torch.nn.functional.scaled_dot_product_attention(
                            a, b_, c_, is_causal=True)

                s = System("sdpa-cudnn", cudnn_sdpa)
                if with_bwd:
                    xs = grad_inputs(fq, fk, fv)
                    s.fwdbwd, s.grads = make_fwdbwd(cudnn_sdpa, xs, fdo), xs
                candidates.append(s)
                if have_fa4:
                    bq, bk, bv = (x.view(shape) for x in (q, k, v))

                    def fa4(a: Any = bq, b_: Any = bk, c_: Any = bv) -> Any:
                        return flash_attn_func(a, b_, c_, causal=True)

                    s = System("fa4", fa4)
                    if with_bwd:
                        xs = grad_inputs(bq, bk, bv)
                        s.fwdbwd, s.grads = make_fwdbwd(fa4, xs, do.view(shape)), xs
                    candidates.append(s)
        timed: list[System] = []
        for s in candidates:
            try:
                t_first = time.perf_counter()
                with torch.no_grad():
                    s.fwd()
                torch.cuda.synchronize()
                s.first_s = time.perf_counter() - t_first
                if s.name == "cmc":
                    s.first_s += load_s[key]
                timed.append(s)
            except Exception as e:  # noqa: BLE001
                results.append(Result(name, c.pattern, c.length, s.name, None, None,
                                      note=f"failed: {type(e).__name__}: {str(e)[:160]}"))
                continue
            if s.fwdbwd is not None:
                try:
                    t_first = time.perf_counter()
                    s.fwdbwd()
                    torch.cuda.synchronize()
                    s.bwd_first_s = time.perf_counter() - t_first
                except Exception as e:  # noqa: BLE001
                    s.fwdbwd = None
                    s.bwd_note = f"backward failed: {type(e).__name__}: {str(e)[:160]}"
        fwd_ms: dict[str, list[float]] = {s.name: [] for s in timed}
        fb_ms: dict[str, list[float]] = {s.name: [] for s in timed}
        failed: dict[str, str] = {}
        for rnd in range(args.rounds):
            for s in (timed if rnd % 2 == 0 else timed[::-1]):
                if s.name in failed:
                    continue
                try:
                    with torch.no_grad():
                        fwd_ms[s.name].append(bench(s.fwd))
                except Exception as e:  # noqa: BLE001
                    failed[s.name] = f"failed: {type(e).__name__}: {str(e)[:160]}"
                    continue
                if s.fwdbwd is not None:
                    try:
                        fb_ms[s.name].append(bench(s.fwdbwd, s.grads))
                    except Exception as e:  # noqa: BLE001
                        s.fwdbwd = None
                        s.bwd_note = f"backward failed: {type(e).__name__}: {str(e)[:160]}"
        for s in timed:
            if s.name in failed:
                results.append(Result(name, c.pattern, c.length, s.name, None, None,
                                      note=failed[s.name]))
                continue
            ms = float(np.median(fwd_ms[s.name]))
            r = Result(name, c.pattern, c.length, s.name, ms, flops / ms / 1e9, s.first_s,
                       s.mask_ms, extra={"ms": fwd_ms[s.name], **s.extra}, bwd_note=s.bwd_note)
            if s.fwdbwd is not None and fb_ms[s.name]:
                r.fwdbwd_ms = float(np.median(fb_ms[s.name]))
                r.step_tflops = 3.5 * flops / r.fwdbwd_ms / 1e9
                if r.fwdbwd_ms > ms:
                    r.bwd_tflops = 2.5 * flops / (r.fwdbwd_ms - ms) / 1e9
                r.extra.update(fwdbwd_ms=fb_ms[s.name], bwd_first_call_s=s.bwd_first_s)
            results.append(r)
        for r in results:
            if r.case == name:
                bwd = f"{r.bwd_tflops:7.1f}" if r.bwd_tflops else "      -"
                print(f"{name:28s} {r.system:12s} "
                      f"{'-' if r.tflops is None else f'{r.tflops:7.1f}'} fwd {bwd} bwd TFLOP/s "
                      f"{r.note} {r.bwd_note}", flush=True)
        del q, k, v, do, fq, fk, fv, bm, candidates, timed
        torch.cuda.empty_cache()
        flush()
    return results


def check_endpoints(cases: list[Case], tables: dict[str, Any], torch: Any,
                    device: str) -> list[Result]:
    """cuDNN flex's endpoints (from the Flex peers' mask_mod, on the GPU) against cmc's dense
    oracle of the .mask file, once per pattern at a small length; mismatches printed."""
    import numpy as np

    from cmc.tiles import dense_from_table

    out: list[Result] = []
    seen: set[str] = set()
    for c in cases:
        if c.pattern in seen:
            continue
        seen.add(c.pattern)
        spec = spec_for(c.pattern)
        if c.jagged:
            lens = [min(n, CHECK_LEN + 77 * i) for i, n in enumerate(c.lengths[:2])]
            params = c.params[:2]
        else:
            lens = [CHECK_LEN] * 2
            params = [spec.make_params(np.random.default_rng(5), CHECK_LEN)] * 2
        small = Case(c.pattern, CHECK_LEN, lens, params, c.jagged)
        mm = masks.mask_mod(spec.pred, lens, params, c.jagged,
                            lambda a: torch.as_tensor(a, device=device))
        try:
            ends = cudnn_endpoints(small, mm, torch, device)[0].cpu().numpy()
        except Exception as e:  # noqa: BLE001
            out.append(Result(f"check/{c.pattern}", c.pattern, CHECK_LEN, "cudnn-flex", None,
                              None, note=f"endpoints failed: {type(e).__name__}: {str(e)[:120]}"))
            continue
        table = tables[artifact_for(c.pattern)]
        bad, q0 = 0, 0
        for n, p in zip(lens, params):
            want = dense_from_table(table, n, p)
            bad += int((masks.dense_from_endpoints(ends[:, q0:q0 + n], n) != want).sum())
            q0 += n
        print(f"check {c.pattern:24s} cudnn-flex endpoints vs cmc oracle: {bad} mismatches "
              f"(nfunc {ends.shape[0]})", flush=True)
        out.append(Result(f"check/{c.pattern}", c.pattern, CHECK_LEN, "cudnn-flex", None, None,
                          note=f"endpoint mismatches vs cmc oracle: {bad}",
                          extra={"mismatches": bad, "nfunc": int(ends.shape[0])}))
    return out


def check_peers(cases: list[Case], tables: dict[str, Any], kernels: dict[str, Any],
                have_fa4: bool, flex_attention: Any, create_block_mask: Any) -> list[Result]:
    """Every system against one float32 reference per pattern on a small case (L = 1024 or
    the case's own jagged lengths cut to 2 sequences). The reference mask comes from cmc's
    interval table, so the check also proves each peer's mask_mod is the same mask."""
    import numpy as np
    import torch

    from cmc.tiles import dense_from_table

    out: list[Result] = []
    seen: set[str] = set()
    for c in cases:
        if c.pattern in seen or artifact_for(c.pattern) not in kernels:
            continue
        seen.add(c.pattern)
        spec = spec_for(c.pattern)
        lens = c.lengths[:2] if c.jagged else [CHECK_LEN, CHECK_LEN]
        params = (c.params[:2] if c.jagged
                  else [spec.make_params(np.random.default_rng(5), CHECK_LEN)] * 2)
        small = Case(c.pattern, CHECK_LEN, lens, params, c.jagged)
        T, H = sum(lens), 4
        torch.manual_seed(1)
        q, k, v = (torch.randn(T, H, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
                   for _ in range(3))
        ref = torch.empty(T, H, HEAD_DIM, device="cuda")
        t0 = 0
        table = tables[artifact_for(c.pattern)]
        for n, p in zip(lens, params):
            m = torch.from_numpy(dense_from_table(table, n, p)).cuda()
            qs, ks, vs = (x[t0:t0 + n].float().transpose(0, 1) for x in (q, k, v))
            sc = (qs @ ks.transpose(1, 2)) / math.sqrt(HEAD_DIM)
            sc = sc.masked_fill(~m, float("-inf"))
            pr = torch.nan_to_num(torch.softmax(sc, -1))
            ref[t0:t0 + n] = (pr @ vs).transpose(0, 1)
            t0 += n
        cu = torch.tensor([0, lens[0], T], device="cuda", dtype=torch.int32)
        got = {"cmc": kernels[artifact_for(c.pattern)](q, k, v, cu_seqlens=cu, max_len=max(lens),
                                                       **cmc_params(small))}
        if c.jagged:
            fq, fk, fv = (x.unsqueeze(0).transpose(1, 2).contiguous() for x in (q, k, v))
            fb, fl = 1, T
        else:
            fq, fk, fv = (x.view(2, CHECK_LEN, H, HEAD_DIM).transpose(1, 2).contiguous()
                          for x in (q, k, v))
            fb, fl = 2, CHECK_LEN
        mm = masks.mask_mod(spec.pred, lens, params, c.jagged,
                            lambda a: torch.as_tensor(a, device="cuda"))
        bm = create_block_mask(mm, fb, None, fl, fl, device="cuda")
        for system, opts in (("flex-triton", None), ("flex-fa4", {"BACKEND": "FLASH"})):
            if system == "flex-fa4" and not have_fa4:
                continue
            torch._dynamo.reset()
            try:
                o = torch.compile(flex_attention)(fq, fk, fv, block_mask=bm, kernel_options=opts)
                got[system] = o.transpose(1, 2).reshape(T, H, HEAD_DIM)
            except Exception as e:  # noqa: BLE001
                out.append(Result(f"check/{c.pattern}", c.pattern, CHECK_LEN, system, None, None,
                                  note=f"check failed: {type(e).__name__}: {str(e)[:120]}"))
        for system, o in got.items():
            err = float(((o.float() - ref).norm() / ref.norm()).item())
            out.append(Result(f"check/{c.pattern}", c.pattern, CHECK_LEN, system, None, None,
                              max_err=err, note="rel err vs float32 reference (L=1024)"))
            print(f"check {c.pattern:24s} {system:12s} rel err {err:.2e}", flush=True)
    return out


def artifact_kinds(root: Path) -> list[str]:
    """The kernel kinds the run's cmc artifacts hold (which backward was timed)."""
    from cmc.runtime.manifest import read_manifest_json

    kinds: set[str] = set()
    for m in root.glob("*/*/manifest.json"):
        kinds.update(str(k.get("kernel", "?")) for k in read_manifest_json(m)[1]["kernels"])
    return sorted(kinds)


def _artifact_dir(root: Path, key: str) -> Path:
    sub = root / key
    inner = [p for p in sub.iterdir() if (p / "manifest.json").exists()] if sub.is_dir() else []
    if len(inner) != 1:
        raise SystemExit(f"expected one artifact under {sub} (found {len(inner)}); run --compile "
                         "first")
    return inner[0]


PEERS = ["flex-fa4", "flex-triton", "cudnn-flex", "sdpa-cudnn", "fa4"]
TITLES = {"cmc": "cmc", "flex-fa4": "Flex-FA4", "flex-triton": "Flex-Triton",
          "cudnn-flex": "cuDNN flex", "sdpa-cudnn": "cuDNN SDPA", "fa4": "FA4"}
ORDER = ["causal", "hstu", "hstu_jagged", "shared_prefix", "shared_prefix_jagged", "clear",
         "clear_text", *(s.key for s in masks.GENERALITY)]


def _ratio(ours: float | None, peers: list[float | None]) -> str:
    best = max((v for v in peers if v), default=None)
    return f"{ours / best:.2f}" if ours and best else "-"


def _rows(results: list[Result]) -> list[tuple[str, int, dict[str, Result]]]:
    by: dict[tuple[str, int], dict[str, Result]] = {}
    for r in results:
        if r.case.startswith("check/"):
            continue
        by.setdefault((r.pattern, r.length), {})[r.system] = r
    return [(pat, length, row) for (pat, length), row in sorted(by.items(), key=lambda kv: (
        ORDER.index(kv[0][0]) if kv[0][0] in ORDER else 99, kv[0][1]))]


def summarize(results: list[Result]) -> str:
    systems = ["cmc", *PEERS]
    lines = [f"{'case':30s}" + "".join(f"{s:>12s}" for s in systems)
             + "  cmc/best fwd  cmc/best bwd"]
    for pat, length, row in _rows(results):
        fwd = [row[s].tflops if s in row else None for s in systems]
        bwd = [row[s].bwd_tflops if s in row else None for s in systems]
        cells = "".join(f"{v:12.1f}" if v else f"{'-':>12s}" for v in fwd)
        lines.append(f"{pat + '/' + str(length):30s}{cells}  {_ratio(fwd[0], fwd[1:]):>12s}"
                     f"  {_ratio(bwd[0], bwd[1:]):>12s}")
    return "\n".join(lines)


def summarize_ab(results: list[Result]) -> str:
    """--ab's table: per case each folder's forward, backward and step TFLOP/s, and each
    folder's over the first folder's (the baseline)."""
    rows: dict[str, dict[str, Result]] = {}
    for r in results:
        rows.setdefault(r.case, {})[r.system] = r
    folders = list(dict.fromkeys(r.system for r in results))
    if not folders:
        return ""
    base = folders[0]
    head = f"{'case':28s}" + "".join(f"{f + ' fwd/bwd/step':>34s}" for f in folders)
    lines = [head + "".join(f"{f + ' / ' + base + ' bwd':>28s}" for f in folders[1:])]

    def cell(r: Result | None) -> str:
        v = [r.tflops, r.bwd_tflops, r.step_tflops] if r else [None] * 3
        return "".join(f"{x:11.1f}" if x else f"{'-':>11s}" for x in v) + " "

    for case, row in rows.items():
        line = f"{case:28s}" + "".join(cell(row.get(f)) for f in folders)
        b = row.get(base)
        for f in folders[1:]:
            r = row.get(f)
            ratio = (r.bwd_tflops / b.bwd_tflops
                     if r and b and r.bwd_tflops and b.bwd_tflops else float("nan"))
            line += f"{ratio:28.2f}"
        lines.append(line)
    return "\n".join(lines)


def markdown(results: list[Result]) -> str:
    """docs/benchmarks.md's table: forward and backward TFLOP/s per system, cmc over the best
    peer per point, first calls and mask/plan builds; then every peer's failure, as a result."""
    systems = ["cmc", *PEERS]
    head = (["case", "L"] + [f"{TITLES[s]} fwd" for s in systems] + ["cmc / best fwd"]
            + [f"{TITLES[s]} bwd" for s in systems] + ["cmc / best bwd", "cmc step",
                                                       "first call (s): cmc / best-peer"])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    notes: list[str] = []
    for pat, length, row in _rows(results):
        fwd = [row[s].tflops if s in row else None for s in systems]
        bwd = [row[s].bwd_tflops if s in row else None for s in systems]
        best = max((s for s in PEERS if s in row and row[s].tflops),
                   key=lambda s: row[s].tflops or 0.0, default=None)
        fc = row["cmc"].first_call_s if "cmc" in row else None
        pc = row[best].first_call_s if best else None
        step = row["cmc"].step_tflops if "cmc" in row else None
        cells = ([pat, str(length)] + [f"{v:.1f}" if v else "-" for v in fwd]
                 + [_ratio(fwd[0], fwd[1:])] + [f"{v:.1f}" if v else "-" for v in bwd]
                 + [_ratio(bwd[0], bwd[1:]), f"{step:.1f}" if step else "-",
                    f"{fc:.2f} / {pc:.2f} ({TITLES[best]})" if fc is not None and pc is not None
                    and best else "-"])
        lines.append("| " + " | ".join(cells) + " |")
        for s in systems:
            if s in row and (row[s].note or row[s].bwd_note):
                notes.append(f"- {pat} {length}: {s}: {(row[s].note + ' ' + row[s].bwd_note).strip()}")
    if notes:
        lines += ["", "Not measured (each is a result: the system could not express, build or "
                      "run this point):", *notes]
    return "\n".join(lines)


def plot(results: list[Result], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in results if not r.case.startswith("check/")]
    patterns = [p for p in ORDER if any(r.pattern == p for r in rows)]
    ncol = 4
    nrow = max(1, math.ceil(len(patterns) / ncol))
    fig, axes = plt.subplots(nrow, ncol, figsize=(5 * ncol, 4 * nrow), squeeze=False)
    for ax, pat in zip(axes.flat, patterns):
        for i, system in enumerate(["cmc", *PEERS]):
            for attr, style in (("tflops", "-"), ("bwd_tflops", ":")):
                pts = sorted((r.length, getattr(r, attr)) for r in rows
                             if r.pattern == pat and r.system == system and getattr(r, attr))
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], style, marker="o",
                            color=f"C{i}",
                            label=f"{TITLES[system]} {'fwd' if attr == 'tflops' else 'bwd'}")
        ax.set_xscale("log", base=2)
        ax.set_title(pat)
        ax.set_xlabel("sequence length")
        ax.set_ylabel("effective TFLOP/s")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(patterns):]:
        ax.axis("off")
    fig.tight_layout()
    p = out / "bench.png"
    fig.savefig(p, dpi=80)
    return [p]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--compile", metavar="DIR", help="only compile the artifacts into DIR")
    ap.add_argument("--tiling", default="auto",
                    help="with --compile: the tile stage's choice (auto), linear tiles "
                         "everywhere, or RxC patches (cmc compile --tiling; with --patterns of "
                         "grid masks)")
    ap.add_argument("--bwd-kernel", choices=BWD_KERNELS, default="auto",
                    help="with --compile: the backward kinds (cmc compile --bwd-kernel); a run "
                         "records the kinds it loaded in bench.json's meta")
    ap.add_argument("--reg-split", choices=("auto", "fixed"), default="auto",
                    help="with --compile: cmc compile --reg-split (fixed: the A/B baseline of "
                         "the sm90 forward's register split)")
    ap.add_argument("--dq-layout", choices=("token", "block64", "auto"), default="auto",
                    help="with --compile: dq_accum's layout (cmc compile --dq-layout)")
    ap.add_argument("--no-short-kernels", action="store_true",
                    help="with --compile: cmc compile --no-short-kernels (the A/B baseline of "
                         "the kernels for short sequences)")
    ap.add_argument("--kv-heavy-from", default=str(KV_HEAVY_FROM), metavar="LEN|off",
                    help="with --compile: cmc compile --kv-heavy-from (the max_len from which "
                         "the ws kv launches its heavy key tiles first; off: never)")
    ap.add_argument("--suite", choices=("public", "generality", "all"), default="all",
                    help="which masks to compile and run")
    ap.add_argument("--artifacts", default="out/bench")
    ap.add_argument("--out", default="results")
    ap.add_argument("--lengths", type=int, nargs="*", default=list(LENGTHS),
                    help="lengths of the public suite")
    ap.add_argument("--gen-lengths", type=int, nargs="*", default=list(GEN_LENGTHS),
                    help="lengths of the generality suite")
    ap.add_argument("--patterns", nargs="*", help="only these cases (names as in the table); with --compile, only their masks")
    ap.add_argument("--warmup", type=int, default=25)
    ap.add_argument("--rep", type=int, default=100)
    ap.add_argument("--no-bwd", action="store_true", help="forward only")
    ap.add_argument("--deterministic", action="store_true",
                    help="cmc's backward in its deterministic mode (fixed dQ order; the peers "
                         "as they are)")
    ap.add_argument("--only-cmc", action="store_true", help="time cmc alone")
    ap.add_argument("--ab", nargs="*", metavar="DIR",
                    help="kernel A/B: time these artifact folders (as made by --compile) "
                         "interleaved, cmc only")
    ap.add_argument("--ab-rounds", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3,
                    help="timing rounds per case, systems interleaved (median reported)")
    ap.add_argument("--check", action="store_true",
                    help="first check every system against a float32 reference")
    ap.add_argument("--merge", nargs="*", help="merge bench.json files, print and plot them")
    ap.add_argument("--runtime-copy", nargs=2, metavar=("SRC", "DST"),
                    help="copy the artifacts of SRC (--compile's) to DST without their .cu "
                         "sources, for a device carry")
    ap.add_argument("--no-plot", action="store_true")
    args = ap.parse_args()
    unknown = [p for p in args.patterns or () if p not in ORDER]
    if unknown:  # else a typo (or an older tree's suite) would build or time nothing, silently
        ap.error(f"--patterns {' '.join(unknown)}: no such case (cases: {' '.join(ORDER)})")
    if args.merge:
        merged: list[Result] = []
        meta_all = []
        for f in args.merge:
            d = json.loads(Path(f).read_text())
            meta_all.append(d["meta"])
            merged += [Result(**r) for r in d["results"]]
        last = {(r.case, r.system): r for r in merged}  # a later file re-measures a case
        merged = sorted(last.values(), key=lambda r: (r.length, r.pattern))
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "bench.json").write_text(json.dumps(
            {"meta": meta_all, "results": [asdict(r) for r in merged]}, indent=2))
        if not args.no_plot:
            plot(merged, out)
        print(summarize(merged))
        (out / "bench.md").write_text(markdown(merged) + "\n")
        return
    if args.runtime_copy:
        src, dst = (Path(p) for p in args.runtime_copy)
        print(f"{runtime_copy(src, dst) / 2**20:.1f} MiB in {dst}")
        return
    if args.compile:
        from cmc.driver import parse_kv_heavy_from

        compile_all(Path(args.compile), args.tiling, args.suite, args.bwd_kernel, args.reg_split,
                    args.patterns or (), not args.no_short_kernels, args.dq_layout,
                    parse_kv_heavy_from(args.kv_heavy_from))
        return
    import torch

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "tokens": TOKENS, "heads": HEADS, "head_dim": HEAD_DIM,
        "command": " ".join(sys.argv),
        "cmc_kernel_kinds": artifact_kinds(Path(args.artifacts)),
    }
    for mod, dist in (("flash_attn", "flash-attn-4"), ("cudnn", "nvidia-cudnn-frontend"),
                      ("triton", "triton")):
        try:
            from importlib.metadata import version

            meta[mod] = version(dist)
        except Exception:  # noqa: BLE001
            pass

    def sink(results: list[Result]) -> None:
        (out / "bench.json").write_text(json.dumps(
            {"meta": meta, "results": [asdict(r) for r in results]}, indent=2))

    results = run(args, sink)
    sink(results)
    (out / "bench.md").write_text(markdown(results) + "\n")
    if not args.no_plot:
        plot(results, out)
    print(json.dumps(meta))
    print(summarize_ab(results) if args.ab else summarize(results))


if __name__ == "__main__":
    main()
