"""The public benchmark suite: cmc beside FlexAttention (Triton and FA4 backends), SDPA/cuDNN
and FA4 native, in one process, on the same inputs. Prints a table last, writes JSON and PNGs.

    python benchmarks/bench.py --artifacts out/bench --out results/   (on a GPU machine)

Artifacts come from `python benchmarks/bench.py --compile out/bench` (CPU is enough).
Effective TFLOP/s = 4 * B * H * D * visible pairs / time. Timing: triton.testing.do_bench
(median; it clears the L2 between runs), warm-up excluded; first-call latency measured apart.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TOKENS = 32768
HEADS = 16
HEAD_DIM = 128
LENGTHS = (1024, 2048, 4096, 8192, 16384, 32768)

# mask file, -D overrides, artifact folder name
ARTIFACTS = {
    "causal": ("samples/causal.mask", {}),
    "hstu": ("samples/hstu.mask", {}),
    "shared_prefix": ("samples/shared_prefix.mask", {}),
    "clear": ("samples/clear.mask", {"TEXT": 0}),
    "clear_text": ("samples/clear.mask", {"TEXT": 512}),
}


def compile_all(dest: Path, tiling: str = "auto") -> None:
    from cmc.driver import compile_file

    for key, (mask, defines) in ARTIFACTS.items():
        t = time.perf_counter()
        path = compile_file(ROOT / mask, dest / key, archs=["sm_90a"], dtypes=["bf16"],
                            head_dims=[HEAD_DIM], defines=defines, jobs=2, tiling=tiling)
        print(f"compiled {key} -> {path} in {time.perf_counter() - t:.1f} s")


@dataclass
class Case:
    pattern: str  # causal | hstu | shared_prefix | clear | hstu_jagged | shared_prefix_jagged | clear_text
    length: int
    lengths: list[int]  # per sequence (packed when jagged)
    params: list[dict[str, Any]]  # per sequence, host values (cmc's show/oracle form)
    jagged: bool
    visible_pairs: int = 0


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


def make_cases(rng: Any, lengths: tuple[int, ...]) -> list[Case]:
    cases = []
    for L in lengths:
        B = TOKENS // L
        cases.append(Case("causal", L, [L] * B, [{}] * B, False))
        cases.append(Case("hstu", L, [L] * B, [{"n_targets": L // 8}] * B, False))
        r = (L - L // 4) // 4
        starts = [L // 4 + i * r for i in range(4)]
        cases.append(Case("shared_prefix", L, [L] * B,
                          [{"prompt_len": L // 4, "responses": starts}] * B, False))
        cases.append(Case("clear", L, [L] * B, [{}] * B, False))
        # jagged: lengths in [L/2, L] packed into at most TOKENS tokens
        lens: list[int] = []
        while True:
            n = int(rng.integers(L // 2, L + 1))
            if sum(lens) + n > TOKENS:
                break
            lens.append(n)
        cases.append(Case("hstu_jagged", L, lens, [{"n_targets": n // 8} for n in lens], True))
        sp: list[dict[str, Any]] = []
        for _ in range(B):
            p = int(rng.integers(L // 8, L // 2))
            cuts = sorted(int(x) for x in rng.choice(range(p + 1, L), size=3, replace=False))
            sp.append({"prompt_len": p, "responses": [p] + cuts})
        cases.append(Case("shared_prefix_jagged", L, [L] * B, sp, False))
        if L > 512:
            cases.append(Case("clear_text", L, [L] * B, [{}] * B, False))
    return cases


def artifact_for(pattern: str) -> str:
    return {"hstu_jagged": "hstu", "shared_prefix_jagged": "shared_prefix"}.get(pattern, pattern)


# --------------------------------------------------------------------------- flex mask_mods


def flex_mask_mod(case: Case, torch: Any, device: str) -> Any:
    """The same mask as a FlexAttention mask_mod, over one packed sequence (B = 1) when
    jagged, else per batch (b indexes per-sequence tensors)."""
    pat = case.pattern
    lens = torch.tensor(case.lengths, device=device, dtype=torch.int32)
    if case.jagged:
        offs = torch.zeros(len(case.lengths) + 1, device=device, dtype=torch.int32)
        offs[1:] = torch.cumsum(lens, 0)
        # padded past T with the last document: a backend may evaluate mask_mod on the
        # padding rows of its last tile (FA4's flex path does), which must not read out of bounds
        doc = torch.repeat_interleave(
            torch.arange(len(case.lengths), device=device, dtype=torch.int32), lens)
        doc = torch.cat([doc, doc[-1:].expand(256)])
        nt = torch.tensor([p["n_targets"] for p in case.params], device=device,
                          dtype=torch.int32)

        def jag(b: Any, h: Any, q: Any, k: Any) -> Any:
            d = doc[q]
            lq, lk = q - offs[d], k - offs[d]
            hist = lens[d] - nt[d]
            return (doc[k] == d) & (((lk <= lq) & (lk < hist)) | (lk == lq))

        return jag
    if pat == "causal":
        return lambda b, h, q, k: k <= q
    if pat == "hstu":
        nt = torch.tensor([p["n_targets"] for p in case.params], device=device)
        L = case.length
        return lambda b, h, q, k: ((k <= q) & (k < L - nt[b])) | (k == q)
    if pat.startswith("shared_prefix"):
        L = case.length
        pl = torch.tensor([p["prompt_len"] for p in case.params], device=device)
        seg = torch.full((len(case.params), L), -1, device=device, dtype=torch.int32)
        for i, p in enumerate(case.params):
            for j, s in enumerate(p["responses"]):
                seg[i, s:] = j
        return lambda b, h, q, k: (k <= q) & ((k < pl[b]) | (seg[b, q] == seg[b, k]))
    if pat.startswith("clear"):
        text = 512 if pat == "clear_text" else 0
        W, R = 128, 16

        def clear(b: Any, h: Any, q: Any, k: Any) -> Any:
            qq, kk = q - text, k - text
            dy = qq // W - kk // W
            dx = qq % W - kk % W
            return (q < text) | (k < text) | ((q >= text) & (k >= text) & (dy * dy + dx * dx < R * R))

        return clear
    raise ValueError(pat)


# --------------------------------------------------------------------------- runner


def run(args: argparse.Namespace) -> list[Result]:
    import numpy as np
    import torch
    import triton

    from cmc.driver import front
    from cmc.runtime import load
    from cmc.tiles import visible_pairs

    dev = "cuda"
    rng = np.random.default_rng(20261202)
    cases = make_cases(rng, tuple(args.lengths))
    if args.patterns:
        cases = [c for c in cases if c.pattern in args.patterns]
    tables = {key: front(ROOT / m, d) for key, (m, d) in ARTIFACTS.items()}
    for c in cases:
        t = tables[artifact_for(c.pattern)]
        c.visible_pairs = sum(visible_pairs(t, n, p) for n, p in zip(c.lengths, c.params))

    kernels, load_s = {}, {}
    for key in ARTIFACTS:
        t0 = time.perf_counter()
        kernels[key] = load(_artifact_dir(Path(args.artifacts), key))
        load_s[key] = time.perf_counter() - t0

    ab_kernels = {Path(d).name: {key: load(_artifact_dir(Path(d), key)) for key in ARTIFACTS}
                  for d in (args.ab or [])}

    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    have_fa4 = True
    try:
        from flash_attn.cute.interface import flash_attn_func
    except Exception as e:  # noqa: BLE001
        have_fa4 = False
        print(f"flash-attn-4 not available: {e!r}")

    results: list[Result] = []
    if args.check:
        results += check_peers(cases, tables, kernels, have_fa4, flex_attention,
                               create_block_mask)

    def bench(fn: Any) -> float:
        return float(triton.testing.do_bench(fn, warmup=args.warmup, rep=args.rep,
                                             return_mode="median"))

    for c in cases:
        T = sum(c.lengths)
        B = len(c.lengths)
        torch.manual_seed(0)
        q = torch.randn(T, HEADS, HEAD_DIM, device=dev, dtype=torch.bfloat16)
        k = torch.randn_like(q)
        v = torch.randn_like(q)
        flops = 4.0 * HEADS * HEAD_DIM * c.visible_pairs
        name = f"{c.pattern}/{c.length}"
        attn = kernels[artifact_for(c.pattern)]
        cu = torch.zeros(B + 1, dtype=torch.int32, device=dev)
        cu[1:] = torch.cumsum(torch.tensor(c.lengths, device=dev, dtype=torch.int32), 0)
        kw = _cmc_params(c)

        # equal lengths go in the batch layout [B, L, H, D] (the runtime may then launch
        # persistently); jagged ones packed with cu_seqlens. Lengths and mask parameters go
        # through a plan, checked and uploaded once on the first call (as Flex's block mask
        # is built once, outside the timing)
        plans: dict[int, Any] = {}

        def call(a: Any) -> Any:
            p = plans.get(id(a))
            if p is None:
                p = plans[id(a)] = (a.plan(cu_seqlens=cu, max_len=max(c.lengths), **kw)
                                    if c.jagged else a.plan(batch=B, seq_len=c.length, **kw))
            if c.jagged:
                return a(q, k, v, plan=p)
            shape = (B, c.length, HEADS, HEAD_DIM)
            return a(q.view(shape), k.view(shape), v.view(shape), plan=p)

        def ours() -> Any:
            return call(attn)

        if ab_kernels:  # kernel A/B: variants interleaved per round, median over rounds
            # the order flips every round: a fixed order favoured the first variant by 2-5 %
            # (identical kernels, docs/bench/ab_qrp.json and ab_msm.json)
            times: dict[str, list[float]] = {n: [] for n in ab_kernels}
            for rnd in range(args.ab_rounds):
                order = list(ab_kernels.items())
                for n, ks in (order if rnd % 2 == 0 else order[::-1]):
                    a = ks[artifact_for(c.pattern)]
                    times[n].append(bench(lambda a=a: call(a)))
            for n, ts in times.items():
                ms = float(np.median(ts))
                results.append(Result(name, c.pattern, c.length, f"cmc:{n}", ms,
                                      flops / ms / 1e9, None, extra={"ms": ts}))
            continue

        # every system is first called once (first-call latency), then timed in rounds,
        # interleaved, the order reversed every round: timed one after the other, a system's
        # ratio also measured the card's drift (clock, temperature) between them
        timed: list[tuple[str, Any, float | None, float | None]] = []  # system, fn, first, mask
        t_first = time.perf_counter()
        ours()
        torch.cuda.synchronize()
        timed.append(("cmc", ours, time.perf_counter() - t_first + load_s[artifact_for(c.pattern)],
                      None))
        fq = fk = fv = bm = None
        if not args.only_cmc:
            # flex (B, H, L, D); jagged: one packed sequence
            if c.jagged:
                fq, fk, fv = (x.unsqueeze(0).transpose(1, 2).contiguous() for x in (q, k, v))
                fb, fl = 1, T
            else:
                fq, fk, fv = (x.view(B, c.length, HEADS, HEAD_DIM).transpose(1, 2).contiguous()
                              for x in (q, k, v))
                fb, fl = B, c.length
            mm = flex_mask_mod(c, torch, dev)
            # a fresh compile per case: dynamo's recompile limit would otherwise send later
            # cases to the unfused eager path (it materialises the L x L scores)
            torch._dynamo.reset()
            flex = torch.compile(flex_attention, dynamic=False)
            t_first = time.perf_counter()
            bm = create_block_mask(mm, fb, None, fl, fl, device=dev)
            torch.cuda.synchronize()
            mask_ms = (time.perf_counter() - t_first) * 1e3
            peers: list[tuple[str, Any]] = []
            for system, opts in (("flex-triton", None), ("flex-fa4", {"BACKEND": "FLASH"})):
                if system == "flex-fa4" and not have_fa4:
                    continue

                def peer(opts: Any = opts, bm: Any = bm) -> Any:
                    return flex(fq, fk, fv, block_mask=bm, kernel_options=opts)

                peers.append((system, peer))
            if c.pattern == "causal":
                from torch.nn.attention import SDPBackend, sdpa_kernel

                def cudnn() -> Any:
                    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                        return torch.nn.functional.scaled_dot_product_attention(
                            fq, fk, fv, is_causal=True)

                peers.append(("sdpa-cudnn", cudnn))
                if have_fa4:
                    bq, bk, bv = (x.view(B, c.length, HEADS, HEAD_DIM) for x in (q, k, v))
                    peers.append(("fa4", lambda: flash_attn_func(bq, bk, bv, causal=True)))
            for system, fn in peers:
                try:
                    t_first = time.perf_counter()
                    fn()
                    torch.cuda.synchronize()
                    timed.append((system, fn, time.perf_counter() - t_first,
                                  mask_ms if system.startswith("flex") else None))
                except Exception as e:  # noqa: BLE001
                    results.append(Result(name, c.pattern, c.length, system, None, None,
                                          note=f"failed: {type(e).__name__}: {str(e)[:160]}"))
        rounds: dict[str, list[float]] = {sysname: [] for sysname, *_ in timed}
        failed: dict[str, str] = {}
        for rnd in range(args.rounds):
            for system, fn, *_ in (timed if rnd % 2 == 0 else timed[::-1]):
                if system in failed:
                    continue
                try:
                    rounds[system].append(bench(fn))
                except Exception as e:  # noqa: BLE001
                    failed[system] = f"failed: {type(e).__name__}: {str(e)[:160]}"
        for system, _, first, mask in timed:
            if system in failed:
                results.append(Result(name, c.pattern, c.length, system, None, None,
                                      note=failed[system]))
                continue
            ms = float(np.median(rounds[system]))
            results.append(Result(name, c.pattern, c.length, system, ms, flops / ms / 1e9,
                                  first, mask, extra={"ms": rounds[system]}))
        for r in results[-6:]:
            if r.case == name:
                print(f"{name:28s} {r.system:12s} "
                      f"{'-' if r.tflops is None else f'{r.tflops:7.1f}'} TFLOP/s {r.note}",
                      flush=True)
        del q, k, v, fq, fk, fv, bm
        torch.cuda.empty_cache()
        if args.partial:
            Path(args.partial).write_text(json.dumps([asdict(r) for r in results], indent=1))
    return results


def check_peers(cases: list[Case], tables: dict[str, Any], kernels: dict[str, Any],
                have_fa4: bool, flex_attention: Any, create_block_mask: Any) -> list[Result]:
    """Every system against one float32 reference per pattern on a small case (L = 1024 or
    the case's own jagged lengths cut to 2 sequences). The reference mask comes from cmc's
    interval table, so the check also proves each peer's mask_mod is the same mask."""
    import torch

    from cmc.tiles import dense_from_table

    out: list[Result] = []
    seen: set[str] = set()
    for c in cases:
        if c.pattern in seen:
            continue
        seen.add(c.pattern)
        lens = c.lengths[:2] if c.jagged else [1024, 1024]
        params = c.params[:2] if c.jagged else [_small_params(c, 1024)] * 2
        small = Case(c.pattern, 1024, lens, params, c.jagged)
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
                                                       **_cmc_params(small))}
        if c.jagged:
            fq, fk, fv = (x.unsqueeze(0).transpose(1, 2).contiguous() for x in (q, k, v))
            fb, fl = 1, T
        else:
            fq, fk, fv = (x.view(2, 1024, H, HEAD_DIM).transpose(1, 2).contiguous()
                          for x in (q, k, v))
            fb, fl = 2, 1024
        bm = create_block_mask(flex_mask_mod(small, torch, "cuda"), fb, None, fl, fl,
                               device="cuda")
        for system, opts in (("flex-triton", None), ("flex-fa4", {"BACKEND": "FLASH"})):
            if system == "flex-fa4" and not have_fa4:
                continue
            torch._dynamo.reset()
            try:
                o = torch.compile(flex_attention)(fq, fk, fv, block_mask=bm, kernel_options=opts)
                got[system] = (o.transpose(1, 2).reshape(T, H, HEAD_DIM) if c.jagged
                               else o.transpose(1, 2).reshape(T, H, HEAD_DIM))
            except Exception as e:  # noqa: BLE001
                out.append(Result(f"check/{c.pattern}", c.pattern, 1024, system, None, None,
                                  note=f"check failed: {type(e).__name__}: {str(e)[:120]}"))
        for system, o in got.items():
            err = float(((o.float() - ref).norm() / ref.norm()).item())
            out.append(Result(f"check/{c.pattern}", c.pattern, 1024, system, None, None,
                              max_err=err, note="rel err vs float32 reference (L=1024)"))
            print(f"check {c.pattern:24s} {system:12s} rel err {err:.2e}", flush=True)
    return out


def _small_params(c: Case, n: int) -> dict[str, Any]:
    if c.pattern.startswith("hstu"):
        return {"n_targets": n // 8}
    if c.pattern.startswith("shared_prefix"):
        r = (n - n // 4) // 4
        return {"prompt_len": n // 4, "responses": [n // 4 + i * r for i in range(4)]}
    return {}


def _artifact_dir(root: Path, key: str) -> Path:
    sub = root / key
    inner = [p for p in sub.iterdir() if (p / "manifest.json").exists()]
    if len(inner) != 1:
        raise SystemExit(f"expected one artifact under {sub}; run --compile first")
    return inner[0]


def _cmc_params(c: Case) -> dict[str, Any]:
    if c.pattern.startswith("hstu"):
        return {"n_targets": [p["n_targets"] for p in c.params]}
    if c.pattern.startswith("shared_prefix"):
        return {"prompt_len": [p["prompt_len"] for p in c.params],
                "responses": [p["responses"] for p in c.params]}
    return {}


def summarize(results: list[Result]) -> str:
    by: dict[str, dict[str, Result]] = {}
    for r in results:
        by.setdefault(r.case, {})[r.system] = r
    systems = ["cmc", "flex-fa4", "flex-triton", "sdpa-cudnn", "fa4"]
    head = f"{'case':28s}" + "".join(f"{s:>12s}" for s in systems) + "   cmc/flexfa4  cmc/flextri  cmc/best"
    lines = [head]
    for case, row in by.items():
        vals = [row[s].tflops if s in row and row[s].tflops else None for s in systems]
        cells = "".join(f"{v:12.1f}" if v else f"{'-':>12s}" for v in vals)
        ours = vals[0]
        ratios = []
        for v in (vals[1], vals[2], max([x for x in vals[1:] if x] or [0]) or None):
            ratios.append(f"{ours / v:12.2f}" if ours and v else f"{'-':>12s}")
        lines.append(f"{case:28s}{cells} " + " ".join(ratios))
    return "\n".join(lines)


def markdown(results: list[Result]) -> str:
    """The docs/benchmarks.md table: TFLOP/s per system, cmc's ratios, cmc's first call."""
    by: dict[tuple[str, int], dict[str, Result]] = {}
    for r in results:
        by.setdefault((r.pattern if r.case.startswith(r.pattern) else r.case, r.length),
                      {})[r.system] = r
    systems = ["cmc", "flex-fa4", "flex-triton", "sdpa-cudnn", "fa4"]
    lines = ["| case | L | cmc | Flex-FA4 | Flex-Triton | cuDNN | FA4 | cmc / Flex-FA4 | "
             "cmc / Flex-Triton | cmc / FA4 | cmc first call (s) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    order = ["causal", "hstu", "hstu_jagged", "shared_prefix", "shared_prefix_jagged", "clear",
             "clear_text"]
    for (pat, length), row in sorted(by.items(), key=lambda kv: (
            order.index(kv[0][0]) if kv[0][0] in order else 99, kv[0][1])):
        vals = [row[s].tflops if s in row and row[s].tflops else None for s in systems]
        ours = vals[0]
        cells = [f"{v:.1f}" if v else "-" for v in vals]
        ratios = [f"{ours / v:.2f}" if ours and v else "-" for v in (vals[1], vals[2], vals[4])]
        fc = row["cmc"].first_call_s if "cmc" in row else None
        first = f"{fc:.3f}" if fc is not None else "-"
        lines.append(f"| {pat} | {length} | " + " | ".join([*cells, *ratios, first]) + " |")
    return "\n".join(lines)


def plot(results: list[Result], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    patterns = sorted({r.pattern for r in results})
    fig, axes = plt.subplots(math.ceil(len(patterns) / 3), 3, figsize=(15, 4 * math.ceil(len(patterns) / 3)))
    for ax, pat in zip(axes.flat, patterns):
        for system, color in (("cmc", "C0"), ("flex-fa4", "C1"), ("flex-triton", "C2"),
                              ("sdpa-cudnn", "C3"), ("fa4", "C4")):
            pts = sorted((r.length, r.tflops) for r in results
                         if r.pattern == pat and r.system == system and r.tflops)
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=system,
                        color=color)
        ax.set_xscale("log", base=2)
        ax.set_title(pat)
        ax.set_xlabel("sequence length")
        ax.set_ylabel("effective TFLOP/s")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    for ax in list(axes.flat)[len(patterns):]:
        ax.axis("off")
    fig.tight_layout()
    p = out / "bench.png"
    fig.savefig(p, dpi=90)
    paths.append(p)
    return paths


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--compile", metavar="DIR", help="only compile the artifacts into DIR")
    ap.add_argument("--tiling", choices=("auto", "linear"), default="auto",
                    help="with --compile: the tile stage's choice, or linear tiles everywhere")
    ap.add_argument("--artifacts", default="out/bench")
    ap.add_argument("--out", default="results")
    ap.add_argument("--lengths", type=int, nargs="*", default=list(LENGTHS))
    ap.add_argument("--patterns", nargs="*")
    ap.add_argument("--warmup", type=int, default=25)
    ap.add_argument("--rep", type=int, default=100)
    ap.add_argument("--partial", help="rewrite this JSON file after every case")
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
    args = ap.parse_args()
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
        plot(merged, out)
        print(summarize(merged))
        (out / "bench.md").write_text(markdown(merged) + "\n")
        return
    if args.compile:
        compile_all(Path(args.compile), args.tiling)
        return
    import torch

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = run(args)
    meta = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "tokens": TOKENS, "heads": HEADS, "head_dim": HEAD_DIM,
        "command": " ".join(sys.argv),
    }
    try:
        import flash_attn  # type: ignore[import-not-found]

        meta["flash_attn"] = getattr(flash_attn, "__version__", "?")
    except Exception:  # noqa: BLE001
        pass
    (out / "bench.json").write_text(json.dumps({"meta": meta, "results": [asdict(r) for r in results]},
                                               indent=2))
    plot(results, out)
    print(json.dumps(meta))
    print(summarize(results))


if __name__ == "__main__":
    main()
