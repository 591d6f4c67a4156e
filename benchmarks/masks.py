"""The benchmark's masks as mask_mods, and the interval-endpoint layout cuDNN flex takes.

Every predicate is written once, with operators and indexing only, so the same function runs
on numpy arrays (the CPU test against cmc.oracle) and on torch tensors (FlexAttention's
mask_mod, and the dense evaluation cuDNN flex's endpoints come from).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

GEN = "benchmarks/generality"


def _min(a: Any, b: Any) -> Any:
    return b + (a - b) * (a < b)


def _max(a: Any, b: Any) -> Any:
    return a + (b - a) * (b > a)


# A predicate: pred(P, b, q, k) -> bool array. q, k are positions inside sequence b; P holds
# per-sequence arrays: P["len"][b], one entry per int[batch] param, and for a segments param S
# the segment of every position, P["seg:S"][b, i].
Pred = Callable[[dict[str, Any], Any, Any, Any], Any]


def causal(P: dict[str, Any], b: Any, q: Any, k: Any) -> Any:
    return k <= q


def hstu(P: dict[str, Any], b: Any, q: Any, k: Any) -> Any:
    return ((k <= q) & (k < P["len"][b] - P["n_targets"][b])) | (k == q)


def shared_prefix(P: dict[str, Any], b: Any, q: Any, k: Any) -> Any:
    seg = P["seg:responses"]
    return (k <= q) & ((k < P["prompt_len"][b]) | (seg[b, q] == seg[b, k]))


def grid(text: int, width: int, radius: int) -> Pred:
    def pred(P: dict[str, Any], b: Any, q: Any, k: Any) -> Any:
        qq, kk = q - text, k - text
        dy = qq // width - kk // width
        dx = qq % width - kk % width
        inside = (q >= text) & (k >= text) & (dy * dy + dx * dx < radius * radius)
        return (q < text) | (k < text) | inside

    return pred


def natten_clamped(width: int = 96, side: int = 13) -> Pred:
    def pred(P: dict[str, Any], b: Any, q: Any, k: Any) -> Any:
        rows = P["len"][b] // width
        y0 = _max(0, _min(q // width - side // 2, rows - side))
        x0 = _max(0, _min(q % width - side // 2, width - side))
        ky, kx = k // width, k % width
        return (y0 <= ky) & (ky < y0 + side) & (x0 <= kx) & (kx < x0 + side)

    return pred


def video3d(fh: int = 24, fw: int = 40, rt: int = 1, ry: int = 4, rx: int = 6) -> Pred:
    frame = fh * fw

    def pred(P: dict[str, Any], b: Any, q: Any, k: Any) -> Any:
        dt = q // frame - k // frame
        dy = (q % frame) // fw - (k % frame) // fw
        dx = q % fw - k % fw
        return (abs(dt) <= rt) & (abs(dy) <= ry) & (abs(dx) <= rx)

    return pred


def dilated_band(band: int = 2048, dil: int = 3) -> Pred:
    def pred(P: dict[str, Any], b: Any, q: Any, k: Any) -> Any:
        return (abs(q - k) < band) & ((q - k) % dil == 0)

    return pred


def strided(stride: int = 128) -> Pred:
    def pred(P: dict[str, Any], b: Any, q: Any, k: Any) -> Any:
        return (k <= q) & ((q - k < stride) | ((q - k) % stride == 0))

    return pred


def dilated_causal(local: int = 512, dil: int = 3) -> Pred:
    def pred(P: dict[str, Any], b: Any, q: Any, k: Any) -> Any:
        return (k <= q) & ((q - k < local) | ((q - k) % dil == 0))

    return pred


def fixed_sparse(block: int = 128, last: int = 16) -> Pred:
    def pred(P: dict[str, Any], b: Any, q: Any, k: Any) -> Any:
        return (k <= q) & ((k // block == q // block) | (k % block >= block - last))

    return pred


def window_rt(P: dict[str, Any], b: Any, q: Any, k: Any) -> Any:
    return abs(q - k) <= P["window"][b]


def doc_window(win: int = 1000) -> Pred:
    def pred(P: dict[str, Any], b: Any, q: Any, k: Any) -> Any:
        seg = P["seg:docs"]
        return (k <= q) & (q - k < win) & (seg[b, q] == seg[b, k])

    return pred


def swin(width: int = 56, window: int = 7, shift: int = 3) -> Pred:
    def pred(P: dict[str, Any], b: Any, q: Any, k: Any) -> Any:
        same_row = (q // width + shift) // window == (k // width + shift) // window
        return same_row & ((q % width + shift) // window == (k % width + shift) // window)

    return pred


def raster_local(width: int = 48, radius: int = 6) -> Pred:
    def pred(P: dict[str, Any], b: Any, q: Any, k: Any) -> Any:
        dy = q // width - k // width
        return (k <= q) & (dy <= radius) & (abs(q % width - k % width) <= radius)

    return pred


def image_spans(P: dict[str, Any], b: Any, q: Any, k: Any) -> Any:
    seg = P["seg:spans"]
    return (k <= q) | ((seg[b, q] == seg[b, k]) & (seg[b, q] % 2 == 1))


def doc_causal(P: dict[str, Any], b: Any, q: Any, k: Any) -> Any:
    seg = P["seg:docs"]
    return (k <= q) & (seg[b, q] == seg[b, k])


def prefix_lm(P: dict[str, Any], b: Any, q: Any, k: Any) -> Any:
    return (k < P["prefix"][b]) | (k <= q)


@dataclass(frozen=True)
class Spec:
    """One benchmarked mask: the cmc artifact (mask file, -D values) and the same mask as a
    predicate. `make_params(rng, n)` draws one sequence's host parameter values."""

    key: str
    suite: str
    mask: str
    defines: dict[str, int]
    pred: Pred
    make_params: Callable[[Any, int], dict[str, Any]] = field(default=lambda rng, n: {})
    jagged: bool = False
    scalars: tuple[str, ...] = ()


def _doc_starts(rng: Any, n: int) -> dict[str, Any]:
    count = max(1, n // 1536)
    cuts = sorted(int(x) for x in rng.choice(range(1, n), size=count - 1, replace=False))
    return {"docs": [0, *cuts]}


def _image_spans(rng: Any, n: int) -> dict[str, Any]:
    """Text runs of 64-1023 tokens and images of 256, 576 or 1024 tokens, alternating from 0
    (image_spans.mask: odd segments are images)."""
    starts: list[int] = []
    at, image = 0, False
    while at < n:
        starts.append(at)
        at += int(rng.choice([256, 576, 1024])) if image else int(rng.integers(64, 1024))
        image = not image
    return {"spans": starts}


GENERALITY: tuple[Spec, ...] = (
    Spec("g_grid77_w48_r6", "generality", f"{GEN}/grid_text.mask",
         {"TEXT": 77, "W": 48, "R": 6}, grid(77, 48, 6)),
    Spec("g_grid333_w80_r24", "generality", f"{GEN}/grid_text.mask",
         {"TEXT": 333, "W": 80, "R": 24}, grid(333, 80, 24)),
    Spec("g_grid77_w96_r40", "generality", f"{GEN}/grid_text.mask",
         {"TEXT": 77, "W": 96, "R": 40}, grid(77, 96, 40)),
    # a 100-token-wide latent (no patch width divides 100: linear tiles, 4.26 computed pairs
    # per visible pair at 8K, where 8 x 16 patches padded to 112 would compute 2.75;
    # docs/kernel-notes.md, "Grids no patch width divides")
    Spec("g_grid0_w100_r16", "generality", f"{GEN}/grid_text.mask",
         {"TEXT": 0, "W": 100, "R": 16}, grid(0, 100, 16)),
    Spec("g_natten_clamped", "generality", f"{GEN}/natten_clamped.mask", {}, natten_clamped()),
    Spec("g_video3d", "generality", f"{GEN}/video3d.mask", {}, video3d()),
    Spec("g_dilated_band", "generality", f"{GEN}/dilated_band.mask", {}, dilated_band()),
    # unbounded residuals that repeat along the diagonal (offset masks with a period)
    Spec("g_strided", "generality", f"{GEN}/strided.mask", {}, strided()),
    Spec("g_dilated_causal", "generality", f"{GEN}/dilated_causal.mask", {}, dilated_causal()),
    # a residual in k alone on tile-aligned blocks (offset masks by shift invariance)
    Spec("g_fixed_sparse", "generality", f"{GEN}/fixed_sparse.mask", {}, fixed_sparse()),
    # blocks of two tiles: offset masks per query tile phase (evaluated per element before)
    Spec("g_fixed_sparse256", "generality", f"{GEN}/fixed_sparse.mask", {"L": 256},
         fixed_sparse(block=256)),
    Spec("g_window_rt", "generality", f"{GEN}/window_rt.mask", {}, window_rt,
         lambda rng, n: {"window": 777}, scalars=("window",)),
    Spec("g_doc_window", "generality", f"{GEN}/doc_window.mask", {}, doc_window(),
         _doc_starts),
    # a raster-order causal 2D window: a residual per element until lower.grid_term's tight
    # row bound (k <= q) made it one grid family (band tile masks)
    Spec("g_raster_local", "generality", f"{GEN}/raster_local.mask", {}, raster_local()),
    # shifted window attention: a residual per element until a division of a grid coordinate
    # lowered (lower.find_grid) and its lattice repeated by window rows (_lattice_period)
    Spec("g_swin", "generality", f"{GEN}/swin.mask", {}, swin()),
    # causal text with bidirectional images: its transposed table was residual (the image
    # guard on k's segment) until lower.in_segment_of
    Spec("g_image_spans", "generality", f"{GEN}/image_spans.mask", {}, image_spans,
         _image_spans),
    # packed documents by their bounds: the transposed table was residual (every tile of the
    # backward computed) until lower._isolate_segment_end
    Spec("g_doc_bounds", "generality", f"{GEN}/doc_bounds.mask", {}, doc_causal, _doc_starts),
    Spec("g_prefix_lm_jagged", "generality", f"{GEN}/prefix_lm_seq.mask", {}, prefix_lm,
         lambda rng, n: {"prefix": int(rng.integers(n // 8, n // 2))}, jagged=True),
)

PUBLIC_PREDS: dict[str, Pred] = {
    "causal": causal, "hstu": hstu, "hstu_jagged": hstu, "shared_prefix": shared_prefix,
    "shared_prefix_jagged": shared_prefix, "clear": grid(0, 128, 16),
    "clear_text": grid(512, 128, 16),
}


def segment_ids(starts: Sequence[int], length: int) -> np.ndarray:
    """The segment of every position (-1 before the first start), as cmc's seg() counts."""
    ids = np.full(length, -1, dtype=np.int32)
    for j, s in enumerate(starts):
        ids[s:] = j
    return ids


def param_arrays(lengths: Sequence[int], params: Sequence[dict[str, Any]],
                 asarray: Callable[[Any], Any]) -> dict[str, Any]:
    """P for a predicate: per-sequence values, padded segment tables (numpy, then asarray)."""
    width = max(lengths) + 256  # padding rows a backend evaluates past the end stay in bounds
    P: dict[str, Any] = {"len": asarray(np.asarray(lengths, dtype=np.int32))}
    for name in params[0] if params else ():
        if isinstance(params[0][name], list):
            tab = np.full((len(params), width), -2, dtype=np.int32)
            for i, (n, p) in enumerate(zip(lengths, params, strict=True)):
                tab[i, :n] = segment_ids(p[name], n)
            P[f"seg:{name}"] = asarray(tab)
        else:
            P[name] = asarray(np.asarray([int(p[name]) for p in params], dtype=np.int32))
    return P


def mask_mod(pred: Pred, lengths: Sequence[int], params: Sequence[dict[str, Any]],
             jagged: bool, asarray: Callable[[Any], Any]) -> Callable[..., Any]:
    """A FlexAttention mask_mod(b, h, q, k): per batch entry, or over one packed sequence
    (B = 1) when jagged, where documents never see each other."""
    P = param_arrays(lengths, params, asarray)
    if not jagged:
        return lambda b, h, q, k: pred(P, b, q, k)
    offs = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    doc = np.repeat(np.arange(len(lengths), dtype=np.int32), lengths)
    # padded past the end with the last document: FA4's flex path evaluates mask_mod on the
    # padding rows of its last tile, which must not read out of bounds
    doc = np.concatenate([doc, np.full(256, len(lengths) - 1, dtype=np.int32)])
    offs_a, doc_a = asarray(offs), asarray(doc)
    top = max(lengths) + 255

    def jag(b: Any, h: Any, q: Any, k: Any) -> Any:
        d = doc_a[q]
        lq = _min(_max(q - offs_a[d], 0), top)
        lk = _min(_max(k - offs_a[d], 0), top)
        return (doc_a[k] == d) & pred(P, d, lq, lk)

    return jag


# --------------------------------------------------------------------------- cuDNN endpoints


def endpoints_from_edges(rows: np.ndarray, cols: np.ndarray, n_rows: int,
                         nfunc: int | None = None) -> np.ndarray:
    """int32 [nfunc, n_rows]: visible keys [0,F0) U [F1,F2) U ..., odd nfunc, padded with
    equal endpoints. `rows`, `cols` (row-major order) are each row's run edges: the start and
    one-past-the-end of every run of visible keys, alternating."""
    rows = np.asarray(rows, dtype=np.int64)
    cols = np.asarray(cols, dtype=np.int64)
    counts = np.bincount(rows, minlength=n_rows)
    first = np.concatenate([[0], np.cumsum(counts)[:-1]])
    rank = np.arange(len(rows)) - first[rows]
    # [0, s0, e0, s1, e1, ...]; a row whose first run starts at 0 drops the empty [0, 0)
    starts_at_zero = np.zeros(n_rows, dtype=bool)
    head = rank == 0
    starts_at_zero[rows[head]] = cols[head] == 0
    shift = np.where(starts_at_zero, -1, 1)
    slot = rank + shift[rows]
    keep = slot >= 0
    need = int((counts + shift).max(initial=1))
    width = max(need, nfunc or 1)
    if width % 2 == 0:
        width += 1
    out = np.zeros((n_rows, width), dtype=np.int64)
    out[rows[keep], slot[keep]] = cols[keep]
    out = np.maximum.accumulate(out, axis=1)  # non-decreasing: pads repeat the last endpoint
    return np.ascontiguousarray(out.T.astype(np.int32))


def edges_from_dense(vis: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Run edges of a bool [rows, keys] matrix (numpy; bench.py does the same in torch)."""
    pad = np.zeros((vis.shape[0], 1), dtype=bool)
    change = np.concatenate([vis, pad], axis=1) != np.concatenate([pad, vis], axis=1)
    r, c = np.nonzero(change)
    return r, c


def endpoints_from_dense(vis: np.ndarray) -> np.ndarray:
    r, c = edges_from_dense(vis)
    return endpoints_from_edges(r, c, vis.shape[0])


def dense_from_endpoints(ends: np.ndarray, n_keys: int) -> np.ndarray:
    """The inverse, for checks: bool [rows, n_keys] from int32 [nfunc, rows]."""
    k = np.arange(n_keys)[None, :]
    vis = k < ends[0][:, None]
    for j in range(1, ends.shape[0], 2):
        vis |= (ends[j][:, None] <= k) & (k < ends[j + 1][:, None])
    return vis
