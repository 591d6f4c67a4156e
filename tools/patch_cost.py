"""Computed pairs per visible pair of 2D-patch tilings of a grid mask (the 2D-tiling design input).

A tiling puts 128 query tokens and 128 key tokens in one tile (--tile N: N query tokens, and N
key tokens unless --key-tile says otherwise). The sm90 kernel today takes
128 consecutive tokens; a patch tiling takes a py x px patch of the token grid (width W,
starting at token OFF). The kernel computes every pair of every tile that holds a visible
pair, so the ratio computed / visible is the work a tiling wastes. Counted exactly from
the dense mask of the interval table (cmc.tiles.dense_from_table), on one sequence.

    python tools/patch_cost.py samples/clear.mask -D TEXT=0 --width 128 --length 8192
    python tools/patch_cost.py samples/natten2d.mask --width 64 --length 8192
    python tools/patch_cost.py samples/clear.mask -D TEXT=0 --width 128 --length 32768 --tile 64
    python tools/patch_cost.py benchmarks/generality/video3d.mask --width 40 --length 15360 --tile 64 --key-tile 32

"linear" is the token order (what a block-sparse kernel of 128-token tiles computes); a
patch order needs the grid to split into whole patches (else "-").
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TILE = 128


def patch_order(length: int, offset: int, width: int, py: int, px: int,
                tile: int = TILE) -> np.ndarray | None:
    """Token order in which consecutive runs of 128 are py x px patches of the grid (tokens
    before `offset` stay in order first); None if the grid does not split into patches."""
    grid = length - offset
    if offset % tile or grid % (width * py) or width % px:
        return None
    rows = grid // width
    t = np.arange(grid).reshape(rows // py, py, width // px, px)  # (patch row, y, patch col, x)
    return np.concatenate([np.arange(offset), offset + t.transpose(0, 2, 1, 3).reshape(-1)])


def tile_counts(vis: np.ndarray, q_order: np.ndarray, k_order: np.ndarray,
                tile: int = TILE, key_tile: int | None = None) -> tuple[int, int]:
    """(tiles holding a visible pair, tiles with every pair visible): tile query tokens by
    key_tile (default tile) key tokens."""
    n, kt = vis.shape[0], key_tile or tile
    v = vis[q_order][:, k_order].reshape(n // tile, tile, n // kt, kt)
    return int(v.any(axis=(1, 3)).sum()), int(v.all(axis=(1, 3)).sum())


def _name(shape: tuple[int, int] | None) -> str:
    return "linear" if shape is None else f"{shape[0]}x{shape[1]}"


def main() -> None:
    from cmc.driver import front
    from cmc.tiles import dense_from_table

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mask")
    ap.add_argument("-D", action="append", default=[], metavar="NAME=INT")
    ap.add_argument("--width", type=int, required=True, help="grid width W in tokens")
    ap.add_argument("--offset", type=int, default=0, help="first grid token (text before it)")
    ap.add_argument("--length", type=int, default=8192)
    ap.add_argument("--tile", type=int, default=TILE, help="tokens per query tile (and key tile)")
    ap.add_argument("--key-tile", type=int, default=None, help="tokens per key tile (default --tile)")
    a = ap.parse_args()
    defines = {k: int(v) for k, v in (d.split("=", 1) for d in a.D)}
    table = front(a.mask, defines)
    vis = dense_from_table(table, a.length, {})
    visible = int(vis.sum())
    tile, key_tile = a.tile, a.key_tile or a.tile

    def shapes(n: int) -> list[tuple[int, int] | None]:
        """None (linear: the token order, a 1 x n patch) and the py x px patches of n tokens."""
        return [None, *((n // px, px) for px in (64, 32, 16, 8, 4) if px < n and n % px == 0)]

    def order(s: tuple[int, int] | None, n: int) -> np.ndarray | None:
        return np.arange(a.length) if s is None else patch_order(a.length, a.offset, a.width, *s, tile=n)

    print(f"{Path(a.mask).name} {defines} L={a.length} W={a.width}: {visible} visible pairs "
          f"({visible / a.length:.1f} per row); tiles of {tile} query x {key_tile} key tokens")
    print("computed / visible pairs (full tiles among the computed ones)")
    print("query patch \\ key patch  " + "".join(f"{_name(s):>16}" for s in shapes(key_tile)))
    for qs in shapes(tile):
        cells = []
        for ks in shapes(key_tile):
            qo, ko = order(qs, tile), order(ks, key_tile)
            if qo is None or ko is None:
                cells.append(f"{'-':>16}")
                continue
            touched, full = tile_counts(vis, qo, ko, tile, key_tile)
            cells.append(f"{touched * tile * key_tile / visible:9.2f} ({full / touched:3.0%})")
        print(f"{_name(qs):>22}  " + "".join(cells))

if __name__ == "__main__":
    main()
