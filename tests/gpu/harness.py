"""The GPU harness, shared by the GPU tier and tools/: parameter values per sample, the
float64 reference (forward, and its gradients through torch autograd) and the comparisons.
It imports neither torch nor pytest: callers pass their torch module in, so that the CPU
tier and CPU-only tools can import it. It lives beside the GPU tier (not in cmc/) because it
is test code: it never ships in the wheel."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

# --------------------------------------------------------------------------- parameters


def seq_params(mask: Any, length: int, variant: int, rng: np.random.Generator,
               scalars: dict[str, int]) -> dict[str, Any]:
    """One sequence's values: edge cases by `variant`, random ones beyond."""
    out: dict[str, Any] = {}
    for p in mask.params:
        if p.kind == "scalar":
            out[p.name] = scalars[p.name]
        elif p.kind == "batch":
            choices = [0, length // 8, length, int(rng.integers(0, length + 1))]
            out[p.name] = choices[variant % len(choices)]
        else:
            v = variant % 5
            if v == 0:
                starts: list[int] = []
            elif v == 1:
                starts = [0]
            elif v == 2:
                starts = [length]
            elif v == 3:
                n = int(rng.integers(1, 7))
                starts = sorted(int(x) for x in rng.integers(0, length + 1, size=n))
                if len(starts) > 1:
                    starts[1] = starts[0]  # a duplicate start: an empty segment
                    starts.sort()
            else:
                starts = list(range(0, length, max(1, length // 4)))
            out[p.name] = starts
    return out


def scalar_values(mask: Any, variant: int) -> dict[str, int]:
    choices = [17, 0, 1, 300, 2**31 - 1]
    return {p.name: choices[variant % len(choices)] for p in mask.params if p.kind == "scalar"}


def call_params(mask: Any, per_seq: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per-sequence dicts -> the runtime's keyword arguments."""
    out: dict[str, Any] = {}
    for p in mask.params:
        if p.kind == "scalar":
            out[p.name] = per_seq[0][p.name] if per_seq else 0
        else:
            out[p.name] = [ps[p.name] for ps in per_seq]
    return out


# --------------------------------------------------------------------------- reference

MaskFn = Callable[[int, int], Any]  # rows [r0, r1) -> bool [r1 - r0, L] on the device


def _attend(torch: Any, qs: Any, ks: Any, vs: Any, visible: Any, scale: float) -> tuple[Any, Any]:
    """Rows qs [H, R, D] against keys ks, vs [H, L, D] under visible [R, L]: O [H, R, D] and
    the natural-log LSE [H, R]; a row with no visible key gives O = 0 and LSE = -inf. The
    row max is detached (softmax does not depend on it), so autograd sees plain softmax."""
    s = (qs @ ks.transpose(1, 2)) * scale
    s = s.masked_fill(~visible[None], float("-inf"))
    mx = s.amax(-1, keepdim=True).detach()
    mx = torch.where(torch.isinf(mx), torch.zeros_like(mx), mx)
    p = torch.exp(s - mx)
    den = p.sum(-1, keepdim=True)
    o = (p @ vs) / torch.where(den == 0, torch.ones_like(den), den)
    lse = torch.where(den > 0, mx + torch.log(den), torch.full_like(den, float("-inf")))
    return o, lse[..., 0]


def _sequences(q: Any, k: Any, v: Any, lengths: Sequence[int]):
    """(start, n, q, k, v) per non-empty sequence, [H, n, D] in float64, K/V repeated to the
    query heads (GQA)."""
    group = q.shape[1] // k.shape[1]
    start = 0
    for n in lengths:
        if n > 0:
            yield (start, n, q[start:start + n].double().transpose(0, 1),
                   k[start:start + n].double().transpose(0, 1).repeat_interleave(group, 0),
                   v[start:start + n].double().transpose(0, 1).repeat_interleave(group, 0))
        start += n


def reference(torch: Any, q: Any, k: Any, v: Any, lengths: Sequence[int],
              masks: Sequence[MaskFn], scale: float) -> tuple[Any, Any]:
    """Masked softmax attention in float64 on the GPU, packed layout: O [T, Hq, D] and the
    natural-log LSE [Hq, T]; a row that sees no key gives O = 0 and LSE = -inf. Row chunks
    keep the score matrix under 2^26 elements."""
    tokens, hq, d = q.shape
    o = torch.zeros((tokens, hq, d), dtype=torch.float64, device=q.device)
    lse = torch.full((hq, tokens), float("-inf"), dtype=torch.float64, device=q.device)
    fns = [m for n, m in zip(lengths, masks, strict=True) if n > 0]
    with torch.no_grad():
        for (start, n, qs, ks, vs), mask_fn in zip(_sequences(q, k, v, lengths), fns,
                                                   strict=True):
            chunk = max(1, min(n, 2**26 // (hq * n)))
            for r0 in range(0, n, chunk):
                r1 = min(n, r0 + chunk)
                oc, lc = _attend(torch, qs[:, r0:r1], ks, vs, mask_fn(r0, r1), scale)
                o[start + r0:start + r1] = oc.transpose(0, 1)
                lse[:, start + r0:start + r1] = lc
    return o, lse


def reference_grads(torch: Any, q: Any, k: Any, v: Any, do: Any, lengths: Sequence[int],
                    masks: Sequence[MaskFn], scale: float) -> tuple[Any, Any, Any, Any, Any]:
    """The reference forward and its gradients by torch autograd, all float64: O [T, Hq, D],
    LSE [Hq, T], and dq [T, Hq, D], dk, dv [T, Hkv, D] for the output gradient `do` (the
    backward kernel's inputs and outputs). One score matrix per sequence (no row chunks:
    autograd keeps them all), so it is meant for the short sequences of a gradient check."""
    with torch.enable_grad():  # also under no_grad (e.g. inside an autograd backward)
        return _reference_grads(torch, q, k, v, do, lengths, masks, scale)


def _reference_grads(torch: Any, q: Any, k: Any, v: Any, do: Any, lengths: Sequence[int],
                     masks: Sequence[MaskFn], scale: float) -> tuple[Any, Any, Any, Any, Any]:
    q64, k64, v64 = (x.detach().double().requires_grad_(True) for x in (q, k, v))
    outs = []
    tokens, hq, d = q.shape
    fns = [m for n, m in zip(lengths, masks, strict=True) if n > 0]
    for (start, n, qs, ks, vs), mask_fn in zip(_sequences(q64, k64, v64, lengths), fns,
                                               strict=True):
        oc, lc = _attend(torch, qs, ks, vs, mask_fn(0, n), scale)
        outs.append((start, n, oc.transpose(0, 1), lc))
    o = torch.zeros((tokens, hq, d), dtype=torch.float64, device=q.device)
    lse = torch.full((hq, tokens), float("-inf"), dtype=torch.float64, device=q.device)
    for start, n, oc, lc in outs:
        o = o.index_copy(0, torch.arange(start, start + n, device=q.device), oc)
        lse[:, start:start + n] = lc.detach()
    if outs:
        dq, dk, dv = torch.autograd.grad(o, (q64, k64, v64), grad_outputs=do.double(),
                                         allow_unused=True)
    else:  # every sequence empty: no graph, all gradients zero
        dq = dk = dv = None
    zero = [torch.zeros_like(x) for x in (q64, k64, v64)]
    grads = [g if g is not None else z for g, z in zip((dq, dk, dv), zero, strict=True)]
    return o.detach(), lse, grads[0], grads[1], grads[2]


def oracle_masks(torch: Any, mask: Any, lengths: Sequence[int],
                 per_seq: Sequence[dict[str, Any]], device: Any) -> list[MaskFn]:
    from cmc.oracle import dense

    fns: list[MaskFn] = []
    for n, ps in zip(lengths, per_seq, strict=True):
        vis = torch.from_numpy(dense(mask, n, ps)).to(device)
        fns.append(lambda r0, r1, vis=vis: vis[r0:r1])
    return fns


def causal_mask_fn(torch: Any, n: int, device: Any) -> MaskFn:
    """k <= q without an [L, L] matrix (the oracle's dense form is O(L^2) host memory)."""
    cols = torch.arange(n, device=device)

    def fn(r0: int, r1: int) -> Any:
        rows = torch.arange(r0, r1, device=device)[:, None]
        return cols[None, :] <= rows
    return fn


def compare(torch: Any, o: Any, lse: Any | None, ref_o: Any, ref_lse: Any) -> float:
    """Relative error ||o - ref|| / ||ref||, after the hard rules: no NaN, rows with no visible
    key exactly 0 (and LSE -inf), LSE close where defined. Raises AssertionError."""
    assert not torch.isnan(o).any(), "NaN in the output (unwritten or broken rows)"
    empty = torch.isinf(ref_lse).transpose(0, 1)  # [T, Hq]
    if empty.any():
        assert (o[empty] == 0).all(), "a row with no visible key must be exactly 0"
    if lse is not None:
        assert not torch.isnan(lse).any(), "NaN in the LSE"
        lse64 = lse.double()
        assert torch.equal(torch.isinf(lse64) & (lse64 < 0), torch.isinf(ref_lse)), \
            "LSE must be -inf exactly on the rows with no visible key"
        fin = ~torch.isinf(ref_lse)
        if fin.any():
            err = (lse64[fin] - ref_lse[fin]).abs().max().item()
            assert err < 2e-2, f"LSE max abs error {err:.3g}"
    num = torch.linalg.vector_norm(o.double() - ref_o).item()
    den = torch.linalg.vector_norm(ref_o).item()
    if den == 0:
        return 0.0 if num == 0 else float("inf")
    return num / den


# per-element RMS below which a reference gradient counts as zero (compare_grads)
ZERO_GRAD_RMS = 1e-2


def compare_grads(torch: Any, got: Sequence[Any], ref: Sequence[Any],
                  names: Sequence[str] = ("dq", "dk", "dv")) -> dict[str, float]:
    """Relative error ||g - ref|| / max(||ref||, ZERO_GRAD_RMS * sqrt(numel)) per gradient,
    after the hard rule that none is NaN (AssertionError). The floor is for gradients that
    are zero in exact arithmetic (a window of 1: P = 1, so dS = 0 and dQ = dK = 0): the
    kernel's float rounding there is measured against a small per-element RMS instead of
    dividing by zero, so 1e-7 noise passes and a wrong O(1) gradient still fails."""
    out: dict[str, float] = {}
    for name, g, r in zip(names, got, ref, strict=True):
        assert not torch.isnan(g).any(), f"NaN in {name}"
        num = torch.linalg.vector_norm(g.double() - r).item()
        den = max(torch.linalg.vector_norm(r).item(), ZERO_GRAD_RMS * r.numel() ** 0.5)
        out[name] = (0.0 if num == 0 else float("inf")) if den == 0 else num / den
    return out


def check_reference_grads_against_sdpa(torch: Any, device: str, lengths: Sequence[int],
                                       heads: tuple[int, int], head_dim: int) -> None:
    """The gradient reference against torch's own attention (float64 SDPA autograd, causal,
    GQA, a packed batch that may hold an empty sequence), and its forward against the
    forward reference: the harness's self-check, on any device."""
    import torch.nn.functional as F

    hq, hkv = heads
    g = torch.Generator(device=device).manual_seed(3)
    q, do = (torch.randn(sum(lengths), hq, head_dim, device=device, generator=g)
             for _ in range(2))
    k, v = (torch.randn(sum(lengths), hkv, head_dim, device=device, generator=g)
            for _ in range(2))
    fns = [causal_mask_fn(torch, n, device) for n in lengths]
    scale = head_dim ** -0.5
    o, lse, dq, dk, dv = reference_grads(torch, q, k, v, do, lengths, fns, scale)
    ref_o, ref_lse = reference(torch, q, k, v, lengths, fns, scale)
    assert torch.allclose(o, ref_o) and torch.equal(lse.isinf(), ref_lse.isinf())
    assert torch.allclose(lse[~lse.isinf()], ref_lse[~ref_lse.isinf()])
    q64, k64, v64 = (x.double().requires_grad_(True) for x in (q, k, v))
    start = 0
    for n in lengths:
        if n:
            sl = slice(start, start + n)
            os_ = F.scaled_dot_product_attention(
                q64[sl].transpose(0, 1), k64[sl].transpose(0, 1).repeat_interleave(hq // hkv, 0),
                v64[sl].transpose(0, 1).repeat_interleave(hq // hkv, 0), is_causal=True,
                scale=scale)
            os_.transpose(0, 1).backward(do[sl].double())
        start += n
    for got, want in ((dq, q64.grad), (dk, k64.grad), (dv, v64.grad)):
        assert torch.allclose(got, want, atol=1e-10)


def gpu_inputs(torch: Any, lengths: list[int], dtype: str, d: int, hq: int, hkv: int,
               seed: int, packed: bool, kw: dict[str, Any]) -> tuple[tuple[Any, ...],
                                                                     tuple[Any, ...]]:
    """q, k, v, dO [T, H, D] drawn from seed on the GPU, and the same as the call takes them:
    packed (kw gets cu_seqlens) or the batch layout [B, L, H, D] of equal lengths."""
    dt = torch.bfloat16 if dtype == "bf16" else torch.float16
    g = torch.Generator(device="cuda").manual_seed(seed)
    t = sum(lengths)
    flat = tuple(torch.randn((t, h, d), generator=g, device="cuda").to(dt)
                 for h in (hq, hkv, hkv, hq))
    if packed:
        kw["cu_seqlens"] = torch.tensor(np.concatenate([[0], np.cumsum(lengths)]),
                                        dtype=torch.int32, device="cuda")
        return flat, flat
    return flat, tuple(x.view(len(lengths), lengths[0], x.shape[1], d) for x in flat)


def backward_case(torch: Any, mask: Any, packed: bool, lengths: list[int], dtype: str, d: int,
                  hq: int, hkv: int, seed: int) -> dict[str, Any]:
    """Inputs of a backward check on the GPU and their float64 reference gradients: q, k, v,
    dO (packed [T, H, D] with cu_seqlens, or the batch layout) drawn from seed, the mask's
    parameters per sequence (seq_params), and which keys some query sees ("seen") and which
    rows see some key ("sees")."""
    import math

    rng = np.random.default_rng(seed)
    scal = scalar_values(mask, seed)
    per_seq = [seq_params(mask, n, seed + j, rng, scal) for j, n in enumerate(lengths)]
    kw = call_params(mask, per_seq)
    (q, k, v, do), shaped = gpu_inputs(torch, lengths, dtype, d, hq, hkv, seed, packed, kw)
    t = sum(lengths)
    masks = oracle_masks(torch, mask, lengths, per_seq, "cuda")
    scale = 1.0 / math.sqrt(d)
    _, _, rdq, rdk, rdv = reference_grads(torch, q, k, v, do, lengths, masks, scale)
    dense = [fn(0, n) for n, fn in zip(lengths, masks, strict=True)]
    seen = torch.cat([m.any(0) for m in dense]) if dense else torch.zeros(0, dtype=torch.bool)
    sees = torch.cat([m.any(1) for m in dense]) if dense else torch.zeros(0, dtype=torch.bool)
    return {"kw": kw, "shaped": shaped, "ref": (rdq, rdk, rdv), "seen": seen.cuda(),
            "sees": sees.cuda(), "tokens": t}
