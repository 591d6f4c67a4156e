"""The tile stage: which tokens share a 128 x 128 tile of the sm90 kernel.

`choose_tiling(table) -> Tiling`. The default is linear: 128 consecutive query tokens
against 128 consecutive keys. For a mask on a 2D token grid (a grid family of the interval
table: CLEAR, NATTEN) a tile can instead be a patch of `patch_rows` grid rows x
`patch_cols` tokens, for queries and keys alike, which can cut the pairs the kernel
computes without any being visible. The choice is made by counting, exactly from the
interval table, the computed pairs of every candidate on a reference sequence (weighted by
producer_factor for shapes whose TMA boxes, not their GEMMs, bound a key tile); a patch
tiling is taken only when it computes at least 10 % fewer pairs. `--tiling RxC` asks for
one shape instead (choose_tiling's `patch`). What was counted is kept
in `Tiling.reason` (the manifest records it).

Tokens before the grid origin stay linear tiles of 128; when the origin is not a multiple of
128 the last one is partial (it holds tokens up to the origin, the rest of its 128 belong to
patches), and it is counted as a whole tile: the kernel computes all of it.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from typing import Any

import numpy as np

from .errors import UsageError
from .evaluate import Env, ParamValue, eval_expr, eval_pred
from .ir import (
    LINEAR,
    TILE,
    And,
    BinOp,
    BoolConst,
    Call,
    Cmp,
    Const,
    Expr,
    GridRow,
    IntervalTable,
    LinearBand,
    Neg,
    Not,
    OffsetMasks,
    Or,
    PatchInterior,
    PatchMasks,
    Pred,
    TableRef,
    Tiling,
    Var,
    nodes,
)
from .periodic import shift_invariance, tail_period
from .ranges import LEN_MAX
from .render import expr_str, pred_str
from .tiles import instances, iter_row_intervals

PATCH_COLS = (8, 16, 32, 64)  # candidate tokens per grid row of a patch
MIN_GAIN = 0.10  # a patch tiling must compute this much less than the linear one
TIE = 0.02  # computed pairs this close count as equal
COUNT_BATCH = 1 << 22  # interval ends computed_pairs counts at once (bincount)
REF_ROWS = 64  # grid rows of the reference sequence (a multiple of every patch height)
MAX_MASK_CLASSES = 64  # per-offset tile masks compiled into one cubin (2 KiB each)
MAX_LATTICE_PERIOD_FACTOR = 64  # multiples of a grid mask's base period tried (Swin: M)
MAX_OFFSET_PHASES = 32  # offset masks of blocks up to 32 tiles (a phase per query tile of one)
# Patch offsets may have more: g_grid77_w96_r40's 16x8 patches have 77, and without
# masks each partial patch tile evaluated 16 grid spans per row (104 TFLOP/s at 16K,
# run 12), where one 8-byte load does (kernel notes, "Patch masks past 64 classes").
MAX_PATCH_MASK_CLASSES = 128
# Lattice masks (lattice_offset_masks): phases x tile offsets. A video's frames make the
# phases many (video3d: 15 x 19 = 285, 570 KiB per table); the bound keeps one table of a
# cubin at 2 MiB. At 512, g_grid0_w100_r16 (25 x 25 = 625, 1,250 KiB) evaluated spans on
# every partial tile; with its masks the forward ran 1.22 / 1.34 x as fast at 4K / 16K
# (H100, kernel notes "Run 17").
MAX_LATTICE_MASK_CLASSES = 1024
# lattice_offset_masks enumerates the queries of one sequence this long (the kernel selects
# no mask above it)
LATTICE_MAX_LEN = 1 << 18
# ... and every term instance on each: at most this many instance-queries, so a mask with more
# instances is checked (and its masks selected) on a shorter sequence. A radius-161 disc (323
# instances) took 21 s at 2^18 tokens, 4 s within the bound; g_grid77_w96_r40 (81) checks to
# 207,104 tokens. With at most 512 instances (emit.MAX_TERMS) the sequence is at least 32K.
LATTICE_WORK = 1 << 24
# Short sequences: patches must compute this much less than linear tiles at a length (and
# at every longer one counted) to be used there. Measured (kernel notes, stage 4): at 2K,
# CLEAR+text computes 9 % fewer pairs with patches and runs 12 % slower.
SHORT_GAIN = 0.25
# The producer's TMA boxes bound tall patches (docs/kernel-notes.md, "Run 17"): a key tile of
# patches R rows high is R boxes per operand and 64 columns of D, and a box costs the TMA unit
# about BOX_CYCLES plus its bytes at BOX_BYTES_PER_CYCLE (fitted to the H200's fwdprobe at
# D 128: 16x8 patches issue 4,155-4,210 cycles per key tile, linear tiles 480-590), against
# TILE_GEMM_CYCLES for the consumers' two GEMMs of a key tile at 600 TFLOP/s. 8x16 patches
# ran 1.31-1.45 x as fast as 16x8 on the two grids that chose 16x8 (3-5 % fewer pairs).
BOX_CYCLES = 60
BOX_BYTES_PER_CYCLE = 190
TILE_GEMM_CYCLES = 3400
# The backward's patch kinds (kv_patch: K, V gathered by token, Q and dO by patch-row boxes,
# the patch plan walked per key tile; the lockstep kv) took this much longer per computed
# pair than the linear ws kinds: 1.50-1.57 x on the three generality grids, 1.56-1.83 x on
# CLEAR with and without text, 2.0 x on natten_clamped (H100, 2026-12-06, kernel notes
# "Run 18": the same masks built with --tiling linear, computed pairs from computed_pairs).
# The ws kv with TMA patch loaders (the default since run 21) is cheaper: on the three grids
# at 8x16 it beats their linear builds by 4-8 % at 16K (about 1.13-1.15 x per pair) but lost
# 10-16 % at 4K, below their patch start lengths (kernel notes "The ws kv's patch tiling for
# the generality grids"). The kernels for short sequences now take those lengths; but 4-8 %
# is below MIN_GAIN, and natten_clamped's ws patch kv spills (16 / 124 bytes), so the
# constant stays (kernel notes "Kernels for short sequences").
BWD_PATCH_COST = 1.6




def grid_of(table: IntervalTable) -> GridRow | None:
    """The one grid every grid family of the table lies on, or None."""
    grids = {(t.family.grid.origin, t.family.grid.width) for t in table.terms
             if t.family is not None and t.family.grid is not None}
    if len(grids) != 1:
        return None
    for t in table.terms:
        if t.family is not None and t.family.grid is not None:
            return t.family.grid
    return None


def tile_ids(tiling: Tiling, length: int) -> np.ndarray:
    """Tile index of every token of one sequence."""
    tok = np.arange(length, dtype=np.int64)
    if tiling.kind == "linear":
        return tok // TILE
    o, w, ph, pw = tiling.origin_for(length), tiling.width, tiling.patch_rows, tiling.patch_cols
    g = np.maximum(tok - o, 0)
    patch = (g // w // ph) * (w // pw) + (g % w) // pw
    return np.where(tok < o, tok // TILE, -(-o // TILE) + patch)


def computed_pairs(table: IntervalTable, tiling: Tiling, length: int,
                   params: Mapping[str, ParamValue] | None = None, col_tile: int = TILE) -> int:
    """Pairs the kernel computes on one sequence: TILE^2 per (query tile, key tile) that a
    term instance touches (exactly, from the row intervals). It holds
    query_tiles(length) x (length + 1) counters. col_tile < TILE (linear tilings only): the
    table's columns in tiles of col_tile tokens instead, TILE x col_tile per touched pair (the
    sm90 kv kinds' items of 64 queries, counted on the transposed table)."""
    if col_tile != TILE and (tiling.kind != "linear" or TILE % col_tile):
        raise ValueError(f"column tiles of {col_tile} tokens: linear tilings, dividing {TILE}")
    qt = tile_ids(tiling, length)
    nt = tiling.query_tiles(length)
    kt, nk = (qt, nt) if col_tile == TILE else (np.arange(length) // col_tile, -(-length // col_tile))
    # cover[a, k] > 0: key k lies in some row interval of a row of query tile a; the
    # interval ends are counted (bincount) a batch of instances at a time
    size = nt * (length + 1)
    cover = np.zeros(size, dtype=np.int64)
    opens: list[np.ndarray] = []
    closes: list[np.ndarray] = []

    def flush() -> None:
        if opens:
            cover[:] += np.bincount(np.concatenate(opens), minlength=size)
            cover[:] -= np.bincount(np.concatenate(closes), minlength=size)
            opens.clear()
            closes.clear()

    held = 0
    for ri in iter_row_intervals(table, length, params or {}):
        rows = np.nonzero(ri.guard)[0]
        at = qt[rows] * (length + 1)
        opens.append(at + ri.lo[rows])
        closes.append(at + ri.hi[rows])
        held += rows.size
        if held >= COUNT_BATCH:
            flush()
            held = 0
    flush()
    covered = np.cumsum(cover.reshape(nt, length + 1), axis=1)[:, :length] > 0
    touched = np.zeros((nt, nk), dtype=bool)
    for a in range(nt):
        touched[a, kt[covered[a]]] = True
    return int(touched.sum()) * TILE * col_tile


@functools.lru_cache(maxsize=256)
def _counted(table: IntervalTable, tiling: Tiling, length: int) -> int:
    """computed_pairs of one sequence, cached: the tile stage counts the same shapes at the
    same lengths for the shape choice, the start length and the backward's choice."""
    return computed_pairs(table, tiling, length)


def _shape(tiling: Tiling) -> Tiling:
    """The facts computed_pairs reads (kind, grid, patch shape, start length), so that two
    tilings that differ only in reason or masks share one count."""
    return Tiling(tiling.kind, tiling.origin, tiling.width, tiling.patch_rows,
                  tiling.patch_cols, min_len=tiling.min_len)


def patch_tokens(tiling: Tiling, rows: int) -> np.ndarray:
    """[patch, local] token of every local index (box * patch_cols + column) of the patches
    of the first `rows` grid rows, patch-major as the kernel numbers them."""
    o, w, ph, pw = tiling.origin, tiling.width, tiling.patch_rows, tiling.patch_cols
    py, px = np.meshgrid(np.arange(rows // ph), np.arange(w // pw), indexing="ij")
    box, col = np.divmod(np.arange(TILE), pw)
    ky = py.reshape(-1, 1) * ph + box[None, :]
    return o + ky * w + px.reshape(-1, 1) * pw + col[None, :]


def _reads_len(table: IntervalTable, origin: int, length: int) -> bool:
    """Some term whose interval reads len holds for a grid query (or its guard reads len)."""
    q = np.arange(origin, length, dtype=np.int64)
    env = Env(length, {}, {"q": q})
    for t in table.terms:
        def reads(e: Expr | Pred) -> bool:
            return any(isinstance(x, Var) and x.name == "len" for x in nodes(e))
        if reads(t.guard):
            return True
        if (reads(t.lo.expr) or reads(t.hi.expr)) and any(
                np.broadcast_to(eval_pred(t.guard, e), q.shape).any()
                for e in instances(t, env)):
            return True
    return False


def _row_words(masks: list[np.ndarray]) -> tuple[int, ...]:
    """TILE x TILE boolean tile masks as row words (bit k of row r: key column k), in order:
    what PatchMasks.rows and OffsetMasks.rows hold."""
    if not masks:
        return ()
    packed = np.packbits(np.asarray(masks, dtype=bool).reshape(-1, TILE), axis=1,
                         bitorder="little")
    return tuple(int.from_bytes(row.tobytes(), "little") for row in packed)


def _patch_classes(found: dict[tuple[int, int, int], np.ndarray], sets: int = 1
                   ) -> tuple[tuple[int, int, int, int], tuple[int, ...]] | str:
    """The class box (dpy_lo, dpy_hi, dpx_lo, dpx_hi) of the patch offsets in `found`, keyed
    (set, dpy, dpx) for `sets` sets of classes (PatchInterior.per_column: one per interior
    patch column), and its masks' row words, set by set (offsets without a mask: nothing
    visible), or why not."""
    dys, dxs = [k[1] for k in found], [k[2] for k in found]
    box = (min(dys), max(dys) + 1, min(dxs), max(dxs) + 1)
    n = (box[1] - box[0]) * (box[3] - box[2]) * sets
    if n > MAX_PATCH_MASK_CLASSES:
        what = "patch offsets" if sets == 1 else "mask classes"
        return f"{n} {what}, more than {MAX_PATCH_MASK_CLASSES}"
    empty = np.zeros((TILE, TILE), dtype=bool)
    return box, _row_words([found.get((s, dpy, dpx), empty) for s in range(sets)
                            for dpy in range(box[0], box[1]) for dpx in range(box[2], box[3])])


def patch_masks(table: IntervalTable, tiling: Tiling) -> tuple[PatchMasks | None, str]:
    """The per-offset tile masks of a patch tiling, or None and why not.

    What makes one mask per patch offset (dpy, dpx) true for every pair of grid patches
    whose key patch lies below len, at every length up to tiling.max_len():
    1. no term that reads len (or whose guard does) holds for a grid query, so a grid key's
       visibility from a grid query never depends on the length;
    2. every term instance shifts with its query by a patch row: for each grid query q,
       I(q + s) ∩ [origin + s, L) == (I(q) ∩ [origin, L - s)) + s, s = patch_rows * width,
       checked for all q at L = max_len, so a pair of patches has the mask of the pair one
       patch row above it (induction: down to a pair with one patch in patch row 0);
    3. no grid query reaches grid keys more than `reach` patch rows away: the pairs of
       patches in patch rows 0 .. reach (every patch column) are then every case; they are
       computed densely and must agree per offset.
    """
    if tiling.kind != "patch" or not table.exact or table.mask.params:
        return None, "not an exact, parameter-free patch tiling"
    o, w, ph, pw = tiling.origin, tiling.width, tiling.patch_rows, tiling.patch_cols
    big = tiling.max_len() or 0
    s = ph * w
    if _reads_len(table, o, big):
        return None, "a term that reads len applies to grid queries"
    reach = 0  # grid rows between a grid query and the grid keys it sees
    n = big - s - o
    for ri in iter_row_intervals(table, big, {}):
        g, lo, hi = ri.guard[o:], np.maximum(ri.lo[o:], o), ri.hi[o:]
        a_hi = np.minimum(hi[:n], big - s)
        a_ok = g[:n] & (lo[:n] < a_hi)
        b_lo = np.maximum(lo[s:], o + s)
        b_ok = g[s:] & (b_lo < hi[s:])
        bad = (a_ok != b_ok) | (a_ok & ((lo[:n] + s != b_lo) | (a_hi + s != hi[s:])))
        if bad.any():
            at = o + int(np.argmax(bad))
            return None, (f"a term does not shift with its query by a patch row (query {at}"
                          f" against {at + s})")
        ok = g & (lo < hi)
        if ok.any():
            qy = np.nonzero(ok)[0] // w
            dy = np.maximum(np.abs((lo[ok] - o) // w - qy), np.abs((hi[ok] - 1 - o) // w - qy))
            reach = max(reach, int(dy.max()))
    reach_p = (reach + ph - 1) // ph
    ref_rows = (reach_p + 1) * ph  # every pair with a patch in patch row 0, up to the reach
    if ref_rows > REF_ROWS:
        return None, f"grid queries reach {reach} grid rows, past the reference's {REF_ROWS}"
    length = o + w * ref_rows
    cover = np.zeros((length - o, length - o + 1), dtype=np.int16)
    rows = np.arange(length - o)
    for ri in iter_row_intervals(table, length, {}):
        g = ri.guard[o:] & (ri.hi[o:] > o)
        lo = np.maximum(ri.lo[o:], o) - o
        hi = ri.hi[o:] - o
        cover[rows[g], lo[g]] += 1  # one interval a row: no index repeats (np.add.at's case)
        cover[rows[g], hi[g]] -= 1
    vis = np.cumsum(cover, axis=1, dtype=np.int16)[:, :-1] > 0
    tok = patch_tokens(tiling, ref_rows) - o
    ngx = w // pw
    npatch = tok.shape[0]
    ppy, ppx = np.divmod(np.arange(npatch), ngx)
    dpy_ab = ppy[None, :] - ppy[:, None]  # [query patch a, key patch b]
    dpx_ab = ppx[None, :] - ppx[:, None]
    offsets, which = np.unique(np.stack([dpy_ab.ravel(), dpx_ab.ravel()], axis=1), axis=0,
                               return_inverse=True)
    which = which.reshape(npatch, npatch)
    ref = np.zeros((len(offsets), TILE, TILE), dtype=bool)  # the first pair's mask per offset
    seen = np.zeros(len(offsets), dtype=bool)
    for a in range(npatch):  # query patch a against every key patch: [b, lr, lk]
        tiles = vis[tok[a][None, :, None], tok[:, None, :]]
        new = ~seen[which[a]]  # a row holds each offset once (b <-> its offset from a)
        ref[which[a][new]] = tiles[new]
        seen[which[a][new]] = True
        differs = (tiles != ref[which[a]]).any(axis=(1, 2))
        if differs.any():
            b = int(np.argmax(differs))
            return None, (f"patch offset ({int(dpy_ab[a, b])}, {int(dpx_ab[a, b])}) has two "
                          f"masks (query patch {a}, key patch {b} of the reference)")
    found = {(int(dy), int(dx)): ref[i] for i, (dy, dx) in enumerate(offsets)}
    visible = {k: m for k, m in found.items() if m.any()}
    if not visible:
        return None, "no grid pair is visible"
    packed = _patch_classes({(0, *k): m for k, m in visible.items()})
    if isinstance(packed, str):
        return None, packed
    (dpy_lo, dpy_hi, dpx_lo, dpx_hi), words = packed
    masks = PatchMasks(dpy_lo, dpy_hi, dpx_lo, dpx_hi, words)
    return masks, (f"tile masks of {masks.classes} patch offsets (rows {dpy_lo}..{dpy_hi - 1}, "
                   f"columns {dpx_lo}..{dpx_hi - 1}), shift-checked to len {big}")


class _ReadsLen(Exception):
    """An expression the interval evaluation over len cannot bound (a run-time parameter, a
    segment lookup, a divisor that varies)."""


Bounds = tuple[Any, Any]  # numpy arrays or scalars


def _point(op: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a op b with evaluate's semantics (x / 0 == 0, x % 0 == x)."""
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    c = np.asarray(b, dtype=np.int64)
    safe = np.where(c == 0, 1, c)
    return np.where(c == 0, 0 if op == "/" else a, a // safe if op == "/" else a % safe)


def _over_len(e: Expr, env: Env, lmin: np.ndarray, lmax: np.ndarray) -> Bounds:
    """The least and largest value of e per query of env (q an array) over every len in
    [lmin, lmax] (per query): interval arithmetic, sound; equal bounds prove that e does
    not depend on len there. A family instance's env shares the bounds of what does not
    read its index with the other instances (for the same lmin and lmax objects)."""
    sh = env.shared
    if sh is None or isinstance(e, (Const, Var)) or not sh.free(e):
        return _over_len_at(e, env, lmin, lmax)
    got = sh.bounds.get(id(e))
    if got is not None and got[0] is lmin and got[1] is lmax:
        return got[2]  # type: ignore[no-any-return]
    b = _over_len_at(e, env, lmin, lmax)
    sh.bounds[id(e)] = (lmin, lmax, b)
    return b


def _over_len_at(e: Expr, env: Env, lmin: np.ndarray, lmax: np.ndarray) -> Bounds:
    if isinstance(e, Const):
        return np.int64(e.value), np.int64(e.value)
    if isinstance(e, Var):
        if e.name == "len":
            return lmin, lmax
        v = np.asarray(env.vars[e.name], dtype=np.int64)
        return v, v
    if isinstance(e, Neg):
        lo, hi = _over_len(e.a, env, lmin, lmax)
        return (-lo, -lo) if lo is hi else (-hi, -lo)
    if isinstance(e, BinOp):
        (a0, a1), (b0, b1) = _over_len(e.a, env, lmin, lmax), _over_len(e.b, env, lmin, lmax)
        if a0 is a1 and b0 is b1:  # one value (the same object for both bounds)
            v = _point(e.op, a0, b0)
            return v, v
        if e.op == "+":
            return a0 + b0, a1 + b1
        if e.op == "-":
            return a0 - b1, a1 - b0
        if e.op == "*":
            ps = [a0 * b0, a0 * b1, a1 * b0, a1 * b1]
            return np.minimum.reduce(ps), np.maximum.reduce(ps)
        if not (b0 is b1 or np.array_equal(np.broadcast_to(b0, np.shape(b1)), b1)):
            raise _ReadsLen(f"the divisor of {expr_str(e)} depends on len")
        c = np.asarray(b0, dtype=np.int64)
        safe = np.where(c == 0, 1, c)
        if e.op == "/":  # floor division is monotone in the dividend (x / 0 == 0)
            x, y = np.where(c == 0, 0, a0 // safe), np.where(c == 0, 0, a1 // safe)
            return np.minimum(x, y), np.maximum(x, y)
        one = (a0 // safe) == (a1 // safe)  # one period: the remainder is monotone
        lo = np.where(one, a0 % safe, np.where(c > 0, 0, c + 1))
        hi = np.where(one, a1 % safe, np.where(c > 0, c - 1, 0))
        return np.where(c == 0, a0, lo), np.where(c == 0, a1, hi)
    if isinstance(e, Call):
        args = [_over_len(a, env, lmin, lmax) for a in e.args]
        if e.fn == "abs":
            lo, hi = args[0]
            return (np.where(lo >= 0, lo, np.where(hi <= 0, -hi, 0)),
                    np.maximum(np.abs(lo), np.abs(hi)))
        pick = np.minimum if e.fn == "min" else np.maximum
        lo, hi = args[0]
        for a0, a1 in args[1:]:
            if lo is hi and a0 is a1:
                lo = hi = pick(lo, a0)
            else:
                lo, hi = pick(lo, a0), pick(hi, a1)
        return lo, hi
    if isinstance(e, TableRef):
        i0, i1 = _over_len(e.index, env, lmin, lmax)
        if not np.array_equal(np.broadcast_to(i0, np.shape(i1)), i1):
            raise _ReadsLen(f"the index of {expr_str(e)} depends on len")
        v = np.asarray(env.tables[e.table], dtype=np.int64)[i0]
        return v, v
    raise _ReadsLen(f"it reads {expr_str(e)}")


def _pred_over_len(p: Pred, env: Env, lmin: np.ndarray,
                   lmax: np.ndarray) -> tuple[Any, Any]:
    """(may be true, may be false) of p per query over every len in [lmin, lmax]."""
    if isinstance(p, BoolConst):
        return np.bool_(p.value), np.bool_(not p.value)
    if isinstance(p, Cmp):
        (a0, a1), (b0, b1) = _over_len(p.a, env, lmin, lmax), _over_len(p.b, env, lmin, lmax)
        d0, d1 = a0 - b1, a1 - b0  # a - b lies in [d0, d1]
        return {"<": (d0 < 0, d1 >= 0), "<=": (d0 <= 0, d1 > 0), ">": (d1 > 0, d0 <= 0),
                ">=": (d1 >= 0, d0 < 0), "==": ((d0 <= 0) & (d1 >= 0), (d0 != 0) | (d1 != 0)),
                "!=": ((d0 != 0) | (d1 != 0), (d0 <= 0) & (d1 >= 0))}[p.op]
    if isinstance(p, (And, Or)):
        parts = [_pred_over_len(x, env, lmin, lmax) for x in p.items]
        ts, fs = [t for t, _ in parts], [f for _, f in parts]
        if isinstance(p, And):
            return np.logical_and.reduce(ts), np.logical_or.reduce(fs)
        return np.logical_or.reduce(ts), np.logical_and.reduce(fs)
    if isinstance(p, Not):
        t, f = _pred_over_len(p.a, env, lmin, lmax)
        return f, t
    raise _ReadsLen(f"it reads {pred_str(p)}")


def _grid_intervals(table: IntervalTable, o: int, q: np.ndarray, lmin: np.ndarray,
                    big: int) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
    """Per term instance, for the grid queries q over every len in [lmin, big] (per query):
    whether the instance's grid keys [max(lo, origin), hi) are one fixed interval, and its
    least bounds relative to q with whether they are non-empty (at lmin == big: the
    instance at that len). One instance's arrays at a time."""
    env = Env(big, {}, {"q": q})
    lmax = np.full(q.shape, big, dtype=np.int64)
    if np.array_equal(lmin, lmax):
        lmax = lmin  # one len: bounds stay single values (_over_len)
    for t in table.terms:
        for e in instances(t, env):
            gt, gf = (np.broadcast_to(x, q.shape) for x in _pred_over_len(t.guard, e, lmin, lmax))
            lo0, lo1 = (np.broadcast_to(np.maximum(x, o), q.shape)
                        for x in _over_len(t.lo.expr, e, lmin, lmax))
            hi0, hi1 = (np.broadcast_to(x, q.shape) for x in _over_len(t.hi.expr, e, lmin, lmax))
            none = ~gt | (lo0 >= hi1)  # no grid key at any len of the range
            fixed = none | (~gf & (lo0 == lo1) & (hi0 == hi1))
            ok = gt & (lo0 < hi0)
            yield fixed, ok, np.where(ok, lo0 - q, 0), np.where(ok, hi0 - q, 0)


def _least(holds: Callable[[int], bool], top: int) -> int | None:
    """The least n in [0, top] with holds(n), for a property monotone in n (false, then true
    from some n on), or None: doubling steps, then bisection of the last step."""
    n, step = 0, 1
    while n <= top and not holds(n):
        n, step = n + step, step * 2
    if n > top:
        return None
    lo = n - step // 2 + 1 if step > 1 else n
    while lo < n:
        mid = (lo + n) // 2
        if holds(mid):
            n = mid
        else:
            lo = mid + 1
    return n


def interior_patch_masks(table: IntervalTable,
                         tiling: Tiling) -> tuple[PatchMasks | None, str]:
    """The per-offset tile masks of the interior query patches of a patch tiling whose
    border patches see other windows (NATTEN's clamped neighbourhood), or None and why not:
    masks shared by every interior column (_interior_masks), or, where that leaves border
    columns out and masks per query patch column take them in (the clamp of a border column
    is the same in every interior row), one set per column. The fewer classes win a tie."""
    shared, why = _interior_masks(table, tiling, per_column=False)
    if shared is not None and _span(shared) == tiling.width // tiling.patch_cols:
        return shared, why  # every column already: nothing for per-column sets to add
    cols, why_cols = _interior_masks(table, tiling, per_column=True)
    if cols is None or (shared is not None and _span(shared) >= _span(cols)):
        return shared, why if shared is not None else f"{why}; per column: {why_cols}"
    return cols, why_cols


def _span(m: PatchMasks) -> int:
    """Query patches an interior rule takes in per patch row (its columns)."""
    assert m.interior is not None
    return m.interior.col_hi - m.interior.col_lo


def _interior_masks(table: IntervalTable, tiling: Tiling,
                    per_column: bool) -> tuple[PatchMasks | None, str]:
    """interior_patch_masks' masks, shared by the interior columns or one set per column.

    Let q + T be the grid keys of a grid query at len = max_len (T: one token interval per
    term instance, relative to q), and ref(q) the query the masks are built from: the grid's
    centre (shared), or the query of q's grid column in the centre's grid row (per_column).
    Then:
    1. regular queries: at len = max_len, every instance gives q the grid keys q + T_i with
       T_i ref(q)'s (token offsets; patches never cross a grid row, so the pair of patches one
       patch offset away holds every pair (q, k) translated by one token offset);
    2. the interior (PatchInterior) is the rectangle of patches around the centre's patch
       whose queries are all regular at max_len: patch rows >= row_top, columns
       [col_lo, col_hi), and the patch rows that leave `rows_below` grid rows below them;
    3. len does not matter: for each query of an interior patch, every instance's guard and
       grid bounds, evaluated by interval arithmetic over every len from the shortest at
       which the patch is interior (origin + ((py + 1) * patch_rows + rows_below) * width)
       to max_len, are one value. rows_below is the least for which 2 and 3 hold.
    So at every len <= max_len an interior query q sees exactly q + T(ref(q)) among the keys
    below len, and the mask of an interior query patch against a key patch wholly below len is
    [k - q in T(ref(q))] for its pairs, a function of the patch offset (and, per_column, of the
    query patch's column) alone. The masks are built from T; tests/test_interior_masks.py
    compares them with the dense oracle.
    """
    if tiling.kind != "patch" or not table.exact or table.mask.params:
        return None, "not an exact, parameter-free patch tiling"
    o, w, ph, pw = tiling.origin, tiling.width, tiling.patch_rows, tiling.patch_cols
    big = tiling.max_len() or 0
    ngx = w // pw
    npy = (big - o) // w // ph
    if npy < 3:
        return None, "fewer than 3 patch rows at the longest length"
    q = o + np.arange(npy * ph * w, dtype=np.int64)
    py = (q - o) // w // ph
    centre = ((npy * ph) // 2) * w + w // 2
    ref = (centre - w // 2 + (q - o) % w) if per_column else np.full(q.shape, centre)
    refs = np.unique(ref)
    regular: np.ndarray = np.ones(q.shape, dtype=bool)
    rel: dict[int, list[tuple[int, int]]] = {int(r): [] for r in refs}  # T of each ref
    try:
        at_big = np.full(q.shape, big, dtype=np.int64)
        for _, ok, rlo, rhi in _grid_intervals(table, o, q, at_big, big):
            for r in refs[ok[refs]]:
                rel[int(r)].append((int(rlo[r]), int(rhi[r])))
            regular &= np.where(ok[ref], ok & (rlo == rlo[ref]) & (rhi == rhi[ref]), ~ok)
    except _ReadsLen as e:
        return None, f"a bound cannot be evaluated over len: {e}"
    if not rel[centre]:
        return None, "no grid pair is visible"
    per_patch = np.asarray(regular.reshape(npy, ph, ngx, pw).all(axis=(1, 3)))
    pyc, pxc = centre // w // ph, (centre % w) // pw

    def run(line: np.ndarray, at: int) -> tuple[int, int]:
        a, b = at, at + 1
        while a > 0 and line[a - 1]:
            a -= 1
        while b < len(line) and line[b]:
            b += 1
        return a, b

    if not per_patch[pyc, pxc]:
        return None, "the query patch at the grid's centre is not regular"
    col_lo, col_hi = run(per_patch[pyc], pxc)
    row_top, row_end = run(np.asarray(per_patch[:, col_lo:col_hi].all(axis=1)), pyc)
    inside = (py >= row_top) & np.isin((q - o) % w // pw, np.arange(col_lo, col_hi))
    qi, pyi = q[inside], py[inside]

    def len_free(rb: int) -> bool:
        lmin = o + ((pyi + 1) * ph + rb) * w
        use = lmin <= big
        if (pyi[use] >= row_end).any():
            return False
        picks = np.nonzero(use)[0]
        try:  # a sample first: most failures show on it
            return all(all(fixed.all() for fixed, *_ in
                           _grid_intervals(table, o, qi[sel], lmin[sel], big))
                       for sel in (picks[::61], picks))
        except _ReadsLen:
            return False

    least = _least(len_free, npy * ph - row_top * ph)
    if least is None:
        return None, "no interior patch row has a window that does not depend on len"
    rows_below = least
    box, col = np.divmod(np.arange(TILE), pw)
    local = box * w + col  # token offset of each local index from its patch's first token
    base = local[None, :] - local[:, None]  # [lr, lk]
    cols = range(col_lo, col_hi) if per_column else range(pxc, pxc + 1)
    lx = np.broadcast_to(col[:, None], base.shape)  # each local query's column in its patch
    found: dict[tuple[int, int, int], np.ndarray] = {}  # (class set, dpy, dpx) -> mask
    for c in cols:
        # each local query row's T: its grid column's reference (shared: the centre's)
        ts = [rel[centre - w // 2 + c * pw + x] if per_column else rel[centre]
              for x in range(pw)]
        if not any(ts):
            continue  # no query of the column sees a grid key: its masks are empty
        dmin = min(a for t in ts for a, _ in t)
        dmax = max(b for t in ts for _, b in t)
        seen = np.zeros((pw, dmax - dmin), dtype=bool)
        for x, t in enumerate(ts):
            for a, b in t:
                seen[x, a - dmin:b - dmin] = True
        reach_p = (max(-dmin, dmax) // w + 1) // ph + 1
        for dpy in range(-reach_p, reach_p + 1):
            # a key patch column exists (for some interior column, or for column c)
            for dpx in (range(-c, ngx - c) if per_column else range(-(col_hi - 1), ngx - col_lo)):
                d = base + dpy * ph * w + dpx * pw - dmin
                m = np.zeros((TILE, TILE), dtype=bool)
                inr = (d >= 0) & (d < seen.shape[1])
                m[inr] = seen[lx[inr], d[inr]]
                if m.any():
                    found[(c - cols.start, dpy, dpx)] = m
    if not found:
        return None, "no grid pair is visible"
    packed = _patch_classes(found, len(cols))
    if isinstance(packed, str):
        return None, packed
    (dpy_lo, dpy_hi, dpx_lo, dpx_hi), words = packed
    n = (dpy_hi - dpy_lo) * (dpx_hi - dpx_lo)
    inner = PatchInterior(row_top, rows_below, col_lo, col_hi, per_column)
    masks = PatchMasks(dpy_lo, dpy_hi, dpx_lo, dpx_hi, words, inner)
    each = f" for each of the {col_hi - col_lo} patch columns" if per_column else ""
    return masks, (f"tile masks of {n} patch offsets (rows {dpy_lo}..{dpy_hi - 1}, columns "
                   f"{dpx_lo}..{dpx_hi - 1}){each} for interior query patches (patch rows from "
                   f"{row_top} with {rows_below} grid rows below them, patch columns "
                   f"{col_lo}..{col_hi - 1}), checked over len to {big}")


def _diagonal_reach(table: IntervalTable) -> tuple[int, int] | None:
    """[dmin, dmax]: the q - k the table's intervals reach (None: none), read at the longest
    length from its first row (every d <= 0: key -d) and its last (every d >= 0). The table
    over-approximates visibility at every length, so no visible pair lies outside."""
    rows = np.array([0, LEN_MAX - 1], dtype=np.int64)
    env = Env(LEN_MAX, {}, {"q": rows})
    max_hi0, min_lo1 = -1, LEN_MAX
    for t in table.terms:
        for e in instances(t, env):
            g = np.broadcast_to(eval_pred(t.guard, e), rows.shape)
            lo = np.clip(np.broadcast_to(eval_expr(t.lo.expr, e), rows.shape), 0, LEN_MAX)
            hi = np.clip(np.broadcast_to(eval_expr(t.hi.expr, e), rows.shape), 0, LEN_MAX)
            ok = g & (lo < hi)
            if ok[0]:
                max_hi0 = max(max_hi0, int(hi[0]))
            if ok[1]:
                min_lo1 = min(min_lo1, int(lo[1]))
    if max_hi0 < 0 and min_lo1 == LEN_MAX:
        return None
    dmin = -(max_hi0 - 1) if max_hi0 > 0 else 0
    dmax = LEN_MAX - 1 - min_lo1 if min_lo1 < LEN_MAX else 0
    return dmin, dmax


def _shift_phases(p: Pred) -> tuple[int, str | None]:
    """The fewest tiles P (up to MAX_OFFSET_PHASES) by which moving q and k together leaves
    p unchanged, and why a single tile does not (None: it does). Blocks of 256 or 1024
    tokens (`k / 256 == q / 256`, `k % 1024 < 16`) repeat every 2 or 8 tiles."""
    moves = shift_invariance(p, TILE)
    if moves is None:
        return 1, None
    # the least P that moves the mask onto itself: lcm(divisors) / gcd(.., 128) misses nested
    # divisions (k / 64 % 8 repeats every 512 tokens, 4 tiles), so each P is tried
    for phases in range(2, 2 * MAX_OFFSET_PHASES + 1):
        if shift_invariance(p, phases * TILE) is None:
            if phases > MAX_OFFSET_PHASES:
                return 0, (f"{moves}; it repeats every {phases} tiles, more than "
                           f"{MAX_OFFSET_PHASES}")
            return phases, moves
    return 0, moves


def offset_masks(table: IntervalTable) -> tuple[OffsetMasks | None, str]:
    """The per-offset tile masks of a linear tiling, or None and why not.

    What makes one mask per phase and tile offset (qt % P, dt = key tile - query tile) true
    for every pair whose key tile lies below len, at every length:
    1. no run-time parameters, and moving q and k together by P tiles leaves the predicate
       unchanged (cmc/periodic.py shift_invariance; never reading len): every function of
       q - k and tile-aligned block patterns with P = 1, blocks of 2 or more tiles with P
       tiles (_shift_phases). Then the pairs (qt, qt + dt) of one phase all have one mask;
    2. the table's intervals bound the q - k any visible pair has (_diagonal_reach), so the
       offsets outside the computed range see nothing; where they do not, the masks repeat
       past some offset with a period (tail_period over P tiles), and one period serves the
       rest;
    3. each class's mask is then the predicate evaluated on one pair of tiles.
    """
    if table.mask.params:
        names = ", ".join(p.name for p in table.mask.params)
        return None, f"the mask reads run-time parameters ({names})"
    phases, moves = _shift_phases(table.mask.predicate)
    if not phases:
        return None, f"a tile pair's mask may depend on more than its offset: {moves}"
    reach = _diagonal_reach(table)
    if reach is None:
        return None, "no pair is visible"
    dmin, dmax = reach
    lo, hi = -((127 + dmax) // TILE), (127 - dmin) // TILE + 1
    below = above = 0  # the periods of the offsets past each end (0: none)
    if hi - lo > 4 * MAX_MASK_CLASSES:
        tails = _offset_tails(table.mask.predicate, lo, hi, phases)
        if isinstance(tails, str):
            return None, (f"q - k reaches [{dmin}, {dmax}]: {hi - lo} tile offsets, more than "
                          f"{MAX_MASK_CLASSES}; {tails}")
        lo, hi, below, above = tails
    dts = np.arange(lo, hi, dtype=np.int64)
    ph = np.arange(phases, dtype=np.int64)[:, None]
    first = np.maximum(0, -dts)[None, :]  # the first query tile with both tiles in range
    qt = first + (ph - first) % phases  # [phase, offset]: that tile's phase ph or after
    lr = np.arange(TILE, dtype=np.int64)
    q = (qt * TILE)[..., None, None] + lr[:, None]
    k = ((qt + dts) * TILE)[..., None, None] + lr[None, :]
    length = int((np.maximum(qt, qt + dts).max() + 1) * TILE)
    vis = np.broadcast_to(eval_pred(table.mask.predicate, Env(length, {}, {"q": q, "k": k})),
                          qt.shape + (TILE, TILE))
    seen = np.nonzero(vis.any(axis=(0, 2, 3)))[0]
    if seen.size == 0:
        return None, "no pair is visible"
    # a periodic end keeps its whole period of offsets, seen or not
    a = 0 if below else int(seen[0])
    b = len(dts) if above else int(seen[-1]) + 1
    if b - a > MAX_MASK_CLASSES:
        return None, f"{b - a} tile offsets, more than {MAX_MASK_CLASSES}"
    if phases * (b - a) > MAX_LATTICE_MASK_CLASSES:  # phases: as many as a lattice may have
        return None, (f"{phases} phases x {b - a} tile offsets, more than "
                      f"{MAX_LATTICE_MASK_CLASSES} classes")
    masks = OffsetMasks(int(dts[a]), int(dts[b - 1]) + 1,
                        _row_words(list(vis[:, a:b].reshape(-1, TILE, TILE))),
                        phases=phases, below=below, above=above)
    if phases == 1:
        return masks, (f"a tile pair's mask depends only on its offset: tile masks of "
                       f"{masks.classes} tile offsets ({masks.lo}..{masks.hi - 1}"
                       f"{tails_note(masks)})")
    return masks, (f"a tile pair's mask depends only on its offset and its query tile's phase "
                   f"(the mask repeats every {phases} tiles: {moves}): tile masks of "
                   f"{phases} phases x {masks.offsets} tile offsets ({masks.lo}..{masks.hi - 1}"
                   f"{tails_note(masks)})")


def tails_note(m: OffsetMasks) -> str:
    """How the offsets past a periodic end reuse the table (empty: none do)."""
    ends = [f"below {m.lo} by {m.below}" if m.below else "",
            f"above {m.hi - 1} by {m.above}" if m.above else ""]
    return "; periodic " + " and ".join(e for e in ends if e) if m.below or m.above else ""


def _offset_tails(p: Pred, lo: int, hi: int,
                  phases: int = 1) -> tuple[int, int, int, int] | str:
    """The offsets [lo, hi) cut to one period of tile masks at each end whose masks repeat
    (cmc/periodic.py tail_period), with the periods in tile offsets (0 where an end is within
    reach), or why not. Side +1 is the key tiles start or more tiles behind the query tile
    (offsets <= -start), side -1 those ahead of it (offsets >= start). With phases P the
    proof reads blocks of P tiles: a block offset t >= start holds every tile offset of at
    least P start (whatever the query tile's phase), and P block periods are tile ones."""
    below = above = 0
    refused = []
    for side in (1, -1):
        tail = tail_period(p, side, phases * TILE)
        if isinstance(tail, str):
            refused.append(f"no periodic tail {'below' if side == 1 else 'above'} the "
                           f"diagonal: {tail}")
            continue
        start, period = tail.start * phases, tail.period * phases
        if side == 1 and -start - period + 1 > lo:
            lo, below = -start - period + 1, period
        if side == -1 and start + period < hi:
            hi, above = start + period, period
    if hi - lo > 4 * MAX_MASK_CLASSES:
        return "; ".join(refused) or f"{hi - lo} tile offsets past the periodic tails"
    return lo, hi, below, above


def _lattice_period(p: Pred, width: int) -> int:
    """The token period of a grid mask's lattice: the lcm of the grid width and of every
    constant the predicate divides or reduces by (x / c, x % c). Shifting q and k together by
    it leaves every such quotient difference and remainder as it was, so interior tiles of
    one phase (tile index mod period / gcd(128, period)) are translates. A plain 2D grid
    gives its width; a video's frames (q / (FH FW), q % (FH FW) / FW) give FH FW."""
    base = math.lcm(width, *(x.b.value for x in nodes(p) if isinstance(x, BinOp)
                             and x.op in ("/", "%") and isinstance(x.b, Const) and x.b.value > 1))
    # a constant that divides a coordinate ((q / W + S) / M: Swin's windows) repeats every
    # M grid rows, not every M tokens: the least multiple that moves the mask onto itself
    for m in range(1, MAX_LATTICE_PERIOD_FACTOR + 1):
        if shift_invariance(p, base * m) is None:
            return base * m
    return base


@functools.lru_cache(maxsize=64)
def lattice_offset_masks(table: IntervalTable, max_len: int = LATTICE_MAX_LEN,
                         ) -> tuple[OffsetMasks | None, str]:
    """Per-offset tile masks of LINEAR tiles for the query tiles of an interior band of a
    grid mask (NATTEN's clamped neighbourhood, CLEAR-like discs on any width and origin), or
    None and why not. Cached: a patch forward's linear tiles and a linear backward both ask.

    Linear tile qt and tile qt + P (P = phases = W / gcd(128, W)) are translates by 128 P
    tokens, whole grid rows; so are any two tiles of one phase qt % P. Keys before the first
    key tile wholly in the grid (key_tile_lo = ceil(origin / 128): text tokens, which every
    query may see) are left out: the masks hold for key tiles kt >= key_tile_lo, the kernel
    evaluates the spans on the others. Let big = max_len (a multiple of 128) and T_ph(lr) the
    grid keys (>= key_tile_lo * 128), relative to q, of each term instance for query lr of
    the centre tile of phase ph at len = big. Then:
    1. lattice regularity: at len = big, query qt * 128 + lr of a query tile of the band
       gets from every instance the same grid keys relative to q as query lr of the centre
       tile of its phase (the same instance visible or not, the same bounds). The band is
       the run of such tiles around the centres, [tile_top, tile_end);
    2. len does not matter: for each query of a band tile qt, every instance's guard and
       bounds, evaluated by interval arithmetic (_over_len) over every len from
       (qt + 1 + tiles_below) * 128 to big, are one value, and every tile that counts as
       interior at some len <= big lies in the band. tiles_below is the least for which
       this holds (searched; the property is monotone in it).
    So at every len <= big, a query of a tile qt >= tile_top with (qt + 1 + tiles_below) *
    128 <= len sees exactly q + T_ph(lr) among the grid keys below len, and its mask against
    a key tile kt >= key_tile_lo wholly below len is [128 dt + lk - lr in T_ph(lr)]: a
    function of (qt % P, dt = kt - qt) alone. The kernel must select no mask for other
    pairs, nor above big.
    """
    grid = grid_of(table)
    if grid is None:
        return None, "no grid family"
    if not table.exact or table.mask.params:
        return None, "not an exact, parameter-free table"
    o, w = grid.origin, grid.width
    if w <= 0 or o < 0:
        return None, f"grid width {w} (origin {o})"
    period = _lattice_period(table.mask.predicate, w)
    phases = period // math.gcd(TILE, period)
    kt0 = -(-o // TILE)  # the first key tile wholly in the grid
    big = min(max_len, LATTICE_WORK // max(1, table.max_intervals_per_row())) // TILE * TILE
    nqt = big // TILE
    if nqt - kt0 < 4 * phases:
        return None, f"fewer than {4 * phases} grid tiles at len {big}"
    q = np.arange(big, dtype=np.int64)
    mid = (kt0 + nqt) // 2
    centres = [mid + (ph - mid) % phases for ph in range(phases)]  # centre tile of each phase
    phase_of = np.arange(nqt) % phases
    regular: np.ndarray = np.ones((nqt, TILE), dtype=bool)
    regular[:kt0] = False  # query tiles that hold text
    rel: list[list[tuple[np.ndarray, np.ndarray, np.ndarray]]] = [[] for _ in range(phases)]
    # keys below the first grid key tile are not the masks' (key_tile_lo): a query's instance
    # is compared with its centre's cut at the same floor, so a window the grid's first row
    # cuts (a disc at the top) is as regular as an interior one, a clamped one that moves
    # (NATTEN) is not
    floor = (kt0 * TILE - q).reshape(nqt, TILE)
    try:
        at_big = np.full(q.shape, big, dtype=np.int64)
        for _, ok, rlo, rhi in _grid_intervals(table, kt0 * TILE, q, at_big, big):
            okr, lor, hir = (np.asarray(x).reshape(nqt, TILE) for x in (ok, rlo, rhi))
            okc, loc, hic = okr[centres], lor[centres], hir[centres]  # [phase, lr]
            for ph in range(phases):
                rel[ph].append((okc[ph].copy(), loc[ph].copy(), hic[ph].copy()))
            okp, lop, hip = okc[phase_of], loc[phase_of], hic[phase_of]  # each tile's centre
            lop = np.maximum(lop, floor)
            okp = okp & (lop < hip)
            regular &= (okr == okp) & (~okp | ((lor == lop) & (hir == hip)))
    except _ReadsLen as e:
        return None, f"a bound cannot be evaluated over len: {e}"
    if not any(okc.any() for r in rel for okc, _, _ in r):
        return None, "no pair is visible"
    per_tile = np.asarray(regular.all(axis=1))
    if not per_tile[centres].all():
        return None, (f"a centre query tile ({', '.join(map(str, centres))} at len {big}) is "
                      "not lattice-regular")
    t_top, t_end = min(centres), max(centres) + 1
    if not per_tile[t_top:t_end].all():
        return None, f"the centre tiles {t_top}..{t_end - 1} are not all lattice-regular"
    while t_top > 0 and per_tile[t_top - 1]:
        t_top -= 1
    while t_end < nqt and per_tile[t_end]:
        t_end += 1
    qi = q[t_top * TILE:]
    ti = qi // TILE

    def len_free(tb: int) -> bool:
        lmin = (ti + 1 + tb) * TILE
        use = lmin <= big
        if (ti[use] >= t_end).any():
            return False
        picks = np.nonzero(use)[0]
        try:  # a sample first: most failures show on it
            return all(all(fixed.all() for fixed, *_ in
                           _grid_intervals(table, kt0 * TILE, qi[sel], lmin[sel], big))
                       for sel in (picks[::61], picks))
        except _ReadsLen:
            return False

    least = _least(len_free, nqt - t_top)
    if least is None:
        return None, "no band of query tiles has windows that do not depend on len"
    tiles_below = least
    every = [x for r in rel for x in r if x[0].any()]
    dmin = min(int(loc[okc].min()) for okc, loc, _ in every)
    dmax = max(int(hic[okc].max()) for okc, _, hic in every) - 1
    dts = np.arange((dmin - (TILE - 1)) // TILE, dmax // TILE + 2, dtype=np.int64)
    lr = np.arange(TILE, dtype=np.int64)
    d = dts[:, None, None] * TILE + lr[None, None, :] - lr[None, :, None]  # [dt, lr, lk]
    # covered[ph, lr, x]: some instance of phase ph holds key q + d0 + x for query lr (a
    # difference array per row, then the offsets d gathered from it)
    d0 = int(d.min())
    size = int(d.max()) - d0 + 1
    cover = np.zeros((phases, TILE, size + 1), dtype=np.int32)
    for ph in range(phases):
        for okc, loc, hic in rel[ph]:
            lo, hi = np.clip(loc - d0, 0, size), np.clip(hic - d0, 0, size)
            hit = np.nonzero(okc & (lo < hi))[0]
            np.add.at(cover[ph], (hit, lo[hit]), 1)
            np.add.at(cover[ph], (hit, hi[hit]), -1)
    covered = np.cumsum(cover, axis=2)[:, :, :size] > 0
    vis = covered[:, lr[None, :, None], d - d0]  # [phase, dt, lr, lk]
    seen = np.nonzero(vis.any(axis=(0, 2, 3)))[0]
    a, b = int(seen[0]), int(seen[-1]) + 1
    if phases * (b - a) > MAX_LATTICE_MASK_CLASSES:
        return None, (f"{phases} phases x {b - a} tile offsets, more than "
                      f"{MAX_LATTICE_MASK_CLASSES} classes")
    band = LinearBand(t_top, tiles_below, big, kt0)
    masks = OffsetMasks(int(dts[a]), int(dts[b - 1]) + 1,
                        _row_words([vis[ph, c] for ph in range(phases) for c in range(a, b)]),
                        band, phases)
    what = (f"{masks.offsets} tile offsets ({masks.lo}..{masks.hi - 1})" if phases == 1 else
            f"{masks.classes} classes, {phases} tile phases x {masks.offsets} tile offsets "
            f"({masks.lo}..{masks.hi - 1}), key tiles from {kt0}")
    rows = ("whole grid rows per tile" if phases == 1 else
            f"whole grid rows per {phases} tiles" if period == w else
            f"a period of {period} tokens (the lcm of the grid width and the mask's divisors) "
            f"per {phases} tiles")
    return masks, (f"tile masks of {what} for interior query tiles (from tile {t_top}, with "
                   f"{tiles_below} tiles below them at len, len <= {big}): {rows}, "
                   f"checked over len to {big}")


def patch_min_len(table: IntervalTable, tiling: Tiling) -> tuple[int, str]:
    """The shortest length from which patches are used: the first grid-row count (in steps
    of half a patch height, up to REF_ROWS) from which every counted length computes at least
    SHORT_GAIN fewer pairs with patches (weighted by producer_factor) than with linear tiles."""
    step = max(1, tiling.patch_rows // 2)
    lengths = [tiling.origin + rows * tiling.width for rows in range(step, REF_ROWS + 1, step)]
    full = _shape(replace(tiling, min_len=0))
    slow = producer_factor(tiling.patch_rows)
    good = [_counted(table, full, n) * slow <= (1 - SHORT_GAIN) * _counted(table, LINEAR, n)
            for n in lengths]
    k = len(good)
    while k > 0 and good[k - 1]:
        k -= 1
    if k == len(good):
        return lengths[-1] + 1, f"patches from len {lengths[-1] + 1} (none counted gains)"
    return lengths[k], f"patches from len {lengths[k]} (linear tiles below)"


def units_for(table: IntervalTable) -> str:
    """The work counter's unit. A pair of query tiles (nqt - 1 - p, p) costs the same for
    every p when a tile's key count is affine in its index (causal-like masks), and pairs
    measure 2-4 % faster there than single tiles (kernel notes, stage 8). With run-time
    parameters (a prompt length, segments, targets) the compiler cannot see the tile costs,
    so the units are single tiles, costliest first: 3-10 % faster for shared-prefix and
    jagged batches."""
    return "tiles" if table.mask.params else "pairs"


HEAVY_REF_LEN = 8192  # heavy_tiles reads the rows at this length and twice it


@functools.lru_cache(maxsize=128)
def heavy_tiles(table: IntervalTable) -> int:
    """The leading query tiles (of 128 tokens) holding a row that reaches the last key at
    HEAVY_REF_LEN and at twice it (text or global tokens that see every key: such a tile's
    key tiles grow with len), when no later tile of the first half holds one. 0 where tile
    costs depend on run-time parameters (the compiler cannot see them), where no tile or
    every tile of the first half grows (a dense or anti-causal mask: nothing to take first),
    or where a later tile grows too. From the row intervals alone (a residual term's hull
    counts), so it costs milliseconds where classify's tiles take a second."""
    from .tiles import iter_row_intervals

    if table.mask.params:
        return 0
    heavy = np.ones(HEAVY_REF_LEN // 2 // TILE, dtype=bool)  # tiles of the first half
    for n in (HEAVY_REF_LEN, 2 * HEAVY_REF_LEN):
        ends = np.zeros(n, dtype=bool)
        for ri in iter_row_intervals(table, n, {}):
            ends |= ri.guard & (ri.hi >= n) & (ri.lo < ri.hi)
        heavy &= ends[:HEAVY_REF_LEN // 2].reshape(-1, TILE).any(axis=1)
    if heavy.all():
        return 0
    count = int(np.argmin(heavy))
    return 0 if heavy[count:].any() else count


def with_heavy_first(table: IntervalTable, tiling: Tiling) -> Tiling:
    """`tiling` with single-tile units whose heavy prefix (heavy_tiles) is taken first
    (struct Sched; choose_tiling's units), or unchanged where the mask has none. Pairs put a
    heavy tile with a short one of the same (sequence, head), and single tiles put it last in
    its L2 group: either way the CTAs that hold them end last (tools/sched_sim.py --heavy:
    grid77_w48_r6 at 16K balances 0.72 -> 0.985; measured +18-20 % / +60 % / +114 % at 4K /
    16K / 32K on an H100, docs/kernel-notes.md "Run 52"). For a patch tiling at most its
    linear tiles before the grid origin, the same tiles in both orders."""
    n = heavy_tiles(table)
    if tiling.kind == "patch":
        n = min(n, -(-tiling.origin // TILE))
    if n == 0:
        return tiling
    return replace(tiling, units="tiles", heavy_tiles=n)


def _with_units(table: IntervalTable, shape: Tiling) -> Tiling:
    """`shape` with the tile stage's work units: units_for's, then a heavy prefix first."""
    return with_heavy_first(table, replace(shape, units=units_for(table)))


def choose_tiling(table: IntervalTable, patch: tuple[int, int] | None = None,
                  linear: bool = False) -> Tiling:
    """Linear, or the patch shape with the fewest computed pairs (see the module doc); and
    the schedule's work unit (units_for; with_heavy_first where the mask has a heavy prefix). `patch` (rows, cols) asks for that shape instead
    (cmc compile --tiling RxC): a UsageError says why the mask cannot have it; `linear`
    asks for linear tiles (--tiling linear), with the tile masks proved for them as when
    they are chosen. Cached (a pure function of frozen values): the counts take seconds on
    a grid mask (CLEAR about 3 s), and a process that compiles and shows the same table
    asks more than once. The cache keys the three values, not how they were passed
    (lru_cache keys `f(t)` and `f(t, None, linear=False)` apart: cmc check chose CLEAR's
    tiling twice that way)."""
    return _choose_tiling(table, patch, linear)


@functools.lru_cache(maxsize=128)
def _choose_tiling(table: IntervalTable, patch: tuple[int, int] | None, linear: bool) -> Tiling:
    if linear:
        shape = Tiling("linear", reason="asked for (--tiling linear)")
    else:
        shape = _choose_shape(table) if patch is None else _forced_shape(table, *patch)
    if shape.kind == "linear" and not table.exact:
        shape = _with_offset_masks(table, shape)
    elif shape.kind == "linear" and grid_of(table) is not None:
        shape = _with_band_masks(table, shape)
    elif shape.kind == "patch" and shape.min_len > 0:
        shape = _with_linear_band_masks(table, shape)
    return _with_units(table, shape)


@functools.lru_cache(maxsize=128)
def choose_backward_tiling(table: IntervalTable, forward: Tiling) -> Tiling:
    """The backward kinds' tiling when the tile stage chose the forward's (--tiling auto): the
    forward's patch tiling where it computes fewer pairs than linear tiles by more than
    BWD_PATCH_COST (the patch kinds' cost per pair), else linear tiles with the tile masks
    proved for them. The two passes share no tile layout: the backward reads O, LSE and dO
    per token."""
    if forward.kind != "patch":
        return forward
    counted, patches = backward_count(table, forward)
    if patches:
        return replace(forward, reason=f"{counted}: the forward's patches; {forward.reason}")
    linear = _with_band_masks(table, Tiling("linear", reason=f"{counted}: linear tiles"))
    return _with_units(table, linear)


def backward_count(table: IntervalTable, forward: Tiling) -> tuple[str, bool]:
    """What choose_backward_tiling counts for a patch forward (its patches from the grid's
    first row, as the forward's shape choice counted them, and linear tiles, at the
    reference length) and whether the backward keeps the patches (cmc show prints the
    count). The forward's own start length may lie past the reference length (patches "from
    len REF + 1"), where counting its tiling would count linear tiles twice."""
    length = forward.origin + forward.width * REF_ROWS
    patch = _counted(table, _shape(replace(forward, min_len=0)), length)
    base = _counted(table, LINEAR, length)
    return (f"computed pairs at len {length}: linear {base}, {forward.patch_rows}x"
            f"{forward.patch_cols} {patch} (x {BWD_PATCH_COST}: the backward's patch kinds "
            "per pair)"), patch * BWD_PATCH_COST <= (1 - MIN_GAIN) * base


def _with_linear_band_masks(table: IntervalTable, tiling: Tiling) -> Tiling:
    """A patch tiling whose sequences below min_len are all linear tiles, with the band tile
    masks of those linear tiles where lattice_offset_masks proves them (the kernels select
    them only below min_len), and the reason either way."""
    masks, why = lattice_offset_masks(table)
    band = masks if masks is not None and masks.band is not None else None
    return _noted(tiling, f"below len {tiling.min_len}, {'band' if band else 'no band'} tile "
                          f"masks: {why}", band)


def _noted(tiling: Tiling, note: str, offset_masks: OffsetMasks | None) -> Tiling:
    """The tiling with these linear tile masks, its reason followed by the note (the note
    alone where the reason was the default's)."""
    reason = note if tiling.reason in ("", LINEAR.reason) else f"{tiling.reason}; {note}"
    return replace(tiling, reason=reason, offset_masks=offset_masks)


def _with_band_masks(table: IntervalTable, tiling: Tiling) -> Tiling:
    """A linear tiling of an exact grid mask with clamped borders (natten2d), with the
    per-offset tile masks that lattice_offset_masks proves for an interior band of query
    tiles (the kernel selects them by the band's rule, H::kOffsetBand, and evaluates the
    spans everywhere else), and the reason either way."""
    masks, why = lattice_offset_masks(table)
    return _noted(tiling, f"band tile masks: {why}" if masks is not None
                  else f"no band tile masks: {why}", masks)


def _with_offset_masks(table: IntervalTable, tiling: Tiling) -> Tiling:
    """A linear tiling of a mask with residual terms, with its per-offset tile masks where
    offset_masks proves them (the kernel then loads a partial tile's mask instead of
    evaluating the residual per element), and the reason either way. Exact tables keep
    their interval masks: a partial tile costs them one span compare per term."""
    masks, why = offset_masks(table)
    return _noted(tiling, why if masks is not None else f"no tile masks: {why}", masks)


def _patch_tiling(table: IntervalTable, shape: Tiling, why_shape: str) -> Tiling:
    """The patch tiling of `shape` with its tile masks (or interior masks) and the length
    it starts at; its reason begins with why_shape."""
    masks, why = patch_masks(table, shape)
    if masks is None and why.startswith("a term that reads len"):
        inner, why_inner = interior_patch_masks(table, shape)
        masks, why = inner, (why_inner if inner is not None
                             else f"{why}; no interior masks: {why_inner}")
    min_len, short = patch_min_len(table, shape)
    reason = (why_shape + f"{shape.patch_rows}x{shape.patch_cols} patches, " + short + "; "
              + (why if masks is not None else f"no tile masks: {why}"))
    return Tiling("patch", shape.origin, shape.width, shape.patch_rows, shape.patch_cols,
                  reason, masks, min_len)


def _patch_grid(table: IntervalTable) -> tuple[GridRow | None, str]:
    """The grid a patch tiling of the table would lie on, or None and why not ("" when the
    table has no grid)."""
    grid = grid_of(table)
    if grid is None:
        return None, ""
    if table.mask.params or not table.exact:
        return None, "grid mask with run-time parameters or residuals"
    if grid.origin < 0 or grid.width <= 0:
        return None, f"grid origin {grid.origin}, width {grid.width}"
    return grid, ""


def _cols_fit(grid: GridRow, cols: int) -> bool:
    """Patch rows of `cols` tokens tile the grid's rows: they divide its width, not all of it."""
    return grid.width % cols == 0 and cols < grid.width


def _forced_shape(table: IntervalTable, rows: int, cols: int) -> Tiling:
    """The patch tiling of rows x cols that the user asked for, or a UsageError naming the
    rule the mask or the shape breaks (never a silent linear tiling)."""
    asked = f"--tiling {rows}x{cols}"
    if cols not in PATCH_COLS or rows * cols != TILE:
        shapes = ", ".join(f"{TILE // c}x{c}" for c in PATCH_COLS)
        raise UsageError(f"{asked}: the sm90 kernel's patches are {TILE} tokens: {shapes}")
    grid, why_not = _patch_grid(table)
    if grid is None:
        raise UsageError(f"{asked}: mask {table.mask.name}: {why_not}" if why_not else
                         f"{asked}: mask {table.mask.name} has no grid (patches need the grid "
                         "families of one grid: a row and a column of a token grid)")
    if not _cols_fit(grid, cols):
        raise UsageError(f"{asked}: {cols} tokens per patch row must divide the grid width "
                         f"{grid.width} and be smaller than it")
    length = grid.origin + grid.width * REF_ROWS
    shape = Tiling("patch", grid.origin, grid.width, rows, cols)
    why = (f"asked for ({asked}); computed pairs at len {length}: linear "
           f"{_counted(table, LINEAR, length)}, {rows}x{cols} "
           f"{_counted(table, shape, length)}: ")
    return _patch_tiling(table, shape, why)


def producer_factor(patch_rows: int) -> float:
    """How much longer than its GEMMs a key tile of patches `patch_rows` high takes where the
    producer's TMA issue bounds it (1.0 where it does not: linear tiles, 8x16, 4x32, 2x64).
    At D 128: K and V are 2 x patch_rows boxes per 64 columns; the head dim scales the boxes
    and the GEMMs alike, so the ratio does not depend on it."""
    box_bytes = (TILE // patch_rows) * 64 * 2
    cycles = 2 * patch_rows * (128 // 64) * (BOX_CYCLES + box_bytes / BOX_BYTES_PER_CYCLE)
    return max(1.0, cycles / TILE_GEMM_CYCLES)


def _choose_shape(table: IntervalTable) -> Tiling:
    grid, why_not = _patch_grid(table)
    if grid is None:
        return Tiling("linear", reason=f"{why_not}: linear tiles") if why_not else LINEAR
    length = grid.origin + grid.width * REF_ROWS
    base = _counted(table, LINEAR, length)
    notes = [f"computed pairs at len {length}: linear {base}"]
    cands: list[tuple[float, Tiling]] = []
    for pw in PATCH_COLS:
        if not _cols_fit(grid, pw):
            continue
        cand = Tiling("patch", grid.origin, grid.width, TILE // pw, pw)
        n = _counted(table, cand, length)
        slow = producer_factor(cand.patch_rows)
        notes.append(f"{cand.patch_rows}x{pw} {n}"
                     + (f" (x {slow:.2f}: the producer's TMA boxes)" if slow > 1 else ""))
        cands.append((n * slow, cand))
    if cands:
        least = min(cost for cost, _ in cands)
        # near-ties go to wider patches: fewer grid rows per tile, less mask work per tile
        cost, best = max((c for c in cands if c[0] <= least * (1 + TIE)),
                         key=lambda c: c[1].patch_cols)
        if cost <= (1 - MIN_GAIN) * base:
            return _patch_tiling(table, best, "; ".join(notes) + ": ")
    if not cands:
        notes.append(f"no patch width of {PATCH_COLS} divides the grid width {grid.width} "
                     "(patches padded to a multiple are not built)")
    return Tiling("linear", reason="; ".join(notes) + ": linear tiles")
