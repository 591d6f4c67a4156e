"""The tile stage: which tokens share a 128 x 128 tile of the sm90 kernel.

`choose_tiling(table) -> Tiling`. The default is linear: 128 consecutive query tokens
against 128 consecutive keys. For a mask on a 2D token grid (a grid family of the interval
table: CLEAR, NATTEN) a tile can instead be a patch of `patch_rows` grid rows x
`patch_cols` tokens, for queries and keys alike, which can cut the pairs the kernel
computes without any being visible. The choice is made by counting, exactly from the
interval table, the computed pairs of every candidate on a reference sequence; a patch
tiling is taken only when it computes at least 10 % fewer pairs. What was counted is kept
in `Tiling.reason` (the manifest records it).

Tokens before the grid origin stay linear tiles; so the origin must be a multiple of 128.
"""

from __future__ import annotations

import numpy as np

from .ir import LINEAR, TILE, GridRow, IntervalTable, Tiling
from .tiles import row_intervals

PATCH_COLS = (8, 16, 32, 64)  # candidate tokens per grid row of a patch
MIN_GAIN = 0.10  # a patch tiling must compute this much less than the linear one
TIE = 0.02  # computed pairs this close count as equal
REF_ROWS = 64  # grid rows of the reference sequence (a multiple of every patch height)




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
    o, w, ph, pw = tiling.origin, tiling.width, tiling.patch_rows, tiling.patch_cols
    g = np.maximum(tok - o, 0)
    patch = (g // w // ph) * (w // pw) + (g % w) // pw
    return np.where(tok < o, tok // TILE, -(-o // TILE) + patch)


def computed_pairs(table: IntervalTable, tiling: Tiling, length: int) -> int:
    """Pairs the kernel computes on one sequence: TILE^2 per (query tile, key tile) that a
    term instance touches (exactly, from the row intervals)."""
    qt = tile_ids(tiling, length)
    kt = tile_ids(tiling, length)
    nt = tiling.query_tiles(length)
    # cover[a, k] > 0: key k lies in some row interval of a row of query tile a
    cover = np.zeros((nt, length + 1), dtype=np.int32)
    for ri in row_intervals(table, length, {}):
        rows = np.nonzero(ri.guard)[0]
        np.add.at(cover, (qt[rows], ri.lo[rows]), 1)
        np.add.at(cover, (qt[rows], ri.hi[rows]), -1)
    covered = np.cumsum(cover, axis=1)[:, :length] > 0
    touched = np.zeros((nt, nt), dtype=bool)
    for a in range(nt):
        touched[a, np.unique(kt[covered[a]])] = True
    return int(touched.sum()) * TILE * TILE


def choose_tiling(table: IntervalTable) -> Tiling:
    """Linear, or the patch shape with the fewest computed pairs (see the module doc)."""
    grid = grid_of(table)
    if grid is None:
        return LINEAR
    if table.mask.params or not table.exact:
        return Tiling("linear", reason="grid mask with run-time parameters or residuals: "
                      "linear tiles")
    if grid.origin < 0 or grid.origin % TILE or grid.width <= 0:
        return Tiling("linear", reason=f"grid origin {grid.origin} is not a multiple of "
                      f"{TILE}: linear tiles")
    length = grid.origin + grid.width * REF_ROWS
    base = computed_pairs(table, LINEAR, length)
    notes = [f"computed pairs at len {length}: linear {base}"]
    cands: list[tuple[int, Tiling]] = []
    for pw in PATCH_COLS:
        if grid.width % pw or pw >= grid.width:
            continue
        cand = Tiling("patch", grid.origin, grid.width, TILE // pw, pw)
        n = computed_pairs(table, cand, length)
        notes.append(f"{cand.patch_rows}x{pw} {n}")
        cands.append((n, cand))
    if cands:
        least = min(n for n, _ in cands)
        # near-ties go to wider patches: fewer grid rows per tile, less mask work per tile
        n, best = max((c for c in cands if c[0] <= least * (1 + TIE)),
                      key=lambda c: c[1].patch_cols)
        if n <= (1 - MIN_GAIN) * base:
            reason = "; ".join(notes) + f": {best.patch_rows}x{best.patch_cols} patches"
            return Tiling("patch", best.origin, best.width, best.patch_rows, best.patch_cols,
                          reason)
    return Tiling("linear", reason="; ".join(notes) + ": linear tiles")
