"""The persistent grid's balance, simulated from the interval table (CPU): how close the work
counter schedule comes to a perfect split over the SMs, taking units in index order (the
kernel) or costliest first, for the benchmark's linear cases. `--bwd`: the backward's
non-persistent kv grid (one CTA per key tile, head and sequence, started in launch order) in
the grid's own order (the key tile fastest) and numbered costliest first within L2 groups of
(sequence, head)s. That numbering was built and measured slower, not faster (run 20,
docs/kernel-notes.md "The backward grids numbered costliest first in L2 groups"): the
simulation leaves out what the grid's order keeps in L2.

Units as struct Sched in templates/cmc/attn_fwd_sm90.cuh: "pairs" of query tiles
(nqt - 1 - p, p) of one (sequence, head), or single "tiles" in L2 groups. An item costs ITEM key tiles plus its visible key tiles
(partial ones PART); a CTA takes its next unit when its last one ends (the counter).

    python tools/sched_sim.py 1024 4096 8192
    python tools/sched_sim.py --bwd 4096 16384 32768
    python tools/sched_sim.py --heavy 4096 16384 32768   # masks whose leading tiles see every key
"""

from __future__ import annotations

import heapq
import sys
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

SMS, ITEM, PART = 132, 1.5, 1.2
KV_SETUP = 1.1  # a kv CTA's set-up and dK, dV stores, in items (6.5K cycles; run 19 probe)


def tile_costs(table: Any, n: int, params: Any) -> np.ndarray:
    """Per query tile of one sequence: ITEM + key tiles, partial ones weighted PART."""
    from cmc.tiles import FULL, PARTIAL, classify

    cls = classify(table, n, params)
    return ITEM + (cls == FULL).sum(1) + PART * (cls == PARTIAL).sum(1)


def makespan(costs: list[float]) -> float:
    """CTA c starts unit c, then the first CTA to finish takes the next unit."""
    heap = [0.0] * SMS
    for c in costs:
        t = heapq.heappop(heap)
        heapq.heappush(heap, t + c)
    return max(heap)


def pair_units(seqs: list[np.ndarray], nqt: int, heads: int) -> list[float]:
    """Units "pairs": tiles (nqt - 1 - p, p) of one (sequence, head), in index order."""
    units: list[float] = []
    for tc in seqs:
        per = [sum(float(tc[t]) for t in {nqt - 1 - p, p} if t < len(tc))
               for p in range((nqt + 1) // 2)]
        units += per * heads
    return units


def grouped_tiles(seqs: list[np.ndarray], nqt: int, heads: int, max_len: int,
                  first: int = 0) -> list[float]:
    """Units "tiles": groups of (sequence, head)s whose K/V fit the 24 MiB L2 budget (bf16,
    D = 128); within a group tile index descending down to `first`, then (sequence, head); a
    tile past its sequence's end costs almost nothing."""
    group = max(1, (24 << 20) // (max_len * 512))
    bh = [tc for tc in seqs for _ in range(heads)]
    units: list[float] = []
    for g0 in range(0, len(bh), group):
        for qt in range(nqt - 1, first - 1, -1):
            units += [float(tc[qt]) if qt < len(tc) else 0.05 for tc in bh[g0:g0 + group]]
    return units


def kv_grid(seqs: list[np.ndarray], nkt: int, heads: int, max_len: int,
            grouped: bool) -> list[float]:
    """The kv grid's CTAs in launch order: key tile fastest, then head, then sequence; or
    (grouped) in groups of (sequence, head)s whose Q and dO fit the L2 budget (bf16, D =
    128), key tile ascending, then (sequence, head). A CTA costs KV_SETUP items beside its
    own; one past its sequence's end almost nothing."""
    group = max(1, (24 << 20) // (max_len * 512)) if grouped else 1
    bh = [tc for tc in seqs for _ in range(heads)]
    units: list[float] = []
    for g0 in range(0, len(bh), group):
        for kt in range(nkt):
            units += [KV_SETUP + float(tc[kt]) if kt < len(tc) else 0.05 for tc in bh[g0:g0 + group]]
    return units


def main(lengths: list[int]) -> None:
    import bench

    from cmc.driver import front

    rng = np.random.default_rng(0)
    print("balance = ideal makespan / simulated makespan (1.0: every SM ends together)")
    for case in bench.make_cases(rng, tuple(lengths)):
        if case.pattern.startswith("clear"):
            continue
        table = front(ROOT / "samples" / f"{bench.artifact_for(case.pattern)}.mask")
        nqt = (max(case.lengths) + 127) // 128
        seqs = [tile_costs(table, n, params)
                for n, params in zip(case.lengths, case.params, strict=True)]
        pairs = pair_units(seqs, nqt, bench.HEADS)
        tiles = grouped_tiles(seqs, nqt, bench.HEADS, max(case.lengths))
        ideal = sum(pairs) / SMS
        print(f"{case.pattern:22s} L={case.length:6d}  pairs: index "
              f"{ideal / makespan(pairs):.3f} costliest "
              f"{ideal / makespan(sorted(pairs, reverse=True)):.3f}  tiles: grouped "
              f"{ideal / makespan(tiles):.3f} all costliest "
              f"{ideal / makespan(sorted(tiles, reverse=True)):.3f}")


def main_bwd(lengths: list[int]) -> None:
    """The kv grid's balance in the grid's order and numbered in L2 groups: key tiles cost
    their query tiles on the transposed table (64-row items, two per 128-row tile)."""
    import bench

    from cmc.driver import front
    from cmc.transpose import transpose

    rng = np.random.default_rng(0)
    print("kv grid balance = ideal makespan / simulated (1.0: every SM ends together)")
    for case in bench.make_cases(rng, tuple(lengths)):
        if case.pattern.startswith("clear"):
            continue
        table = transpose(front(ROOT / "samples" / f"{bench.artifact_for(case.pattern)}.mask"))
        nkt = (max(case.lengths) + 127) // 128
        seqs = [2 * (tile_costs(table, n, params) - ITEM)
                for n, params in zip(case.lengths, case.params, strict=True)]
        plain = kv_grid(seqs, nkt, bench.HEADS, max(case.lengths), False)
        grouped = kv_grid(seqs, nkt, bench.HEADS, max(case.lengths), True)
        ideal = sum(plain) / SMS
        a, b = ideal / makespan(plain), ideal / makespan(grouped)
        print(f"{case.pattern:22s} L={case.length:6d}  grid order {a:.3f}  grouped {b:.3f}"
              f"  ({a / b:.3f} of the time)")


def static_makespan(costs: list[float]) -> float:
    """Without the counter: CTA c takes units c, c + SMS, ... (pairs' schedule)."""
    loads = [0.0] * SMS
    for u, c in enumerate(costs):
        loads[u % SMS] += c
    return max(loads)


def heavy_first(seqs: list[np.ndarray], nqt: int, heads: int, max_len: int,
                heavy: int) -> list[float]:
    """Units "tiles" with a heavy prefix (struct Sched, H::kHeavyTiles): query tiles
    0 .. heavy - 1 of every (sequence, head) first, tile by tile, then grouped_tiles' order
    over the rest."""
    bh = [tc for tc in seqs for _ in range(heads)]
    units = [float(tc[qt]) if qt < len(tc) else 0.05 for qt in range(heavy) for tc in bh]
    return units + grouped_tiles(seqs, nqt, heads, max_len, first=heavy)


def kv_heavy_first(seqs: list[np.ndarray], nkt: int, heads: int, heavy: int) -> list[float]:
    """The kv grid in the heavy order (ws_kv_cta, flags bit 1): key tiles 0 .. heavy - 1 of every
    (sequence, head) launched first, then the grid's order over the rest."""
    grid = kv_grid(seqs, nkt, heads, 0, False)  # (sequence, head)-major, key tile fastest
    cost = [grid[i:i + nkt] for i in range(0, len(grid), nkt)]
    return [c[kt] for kt in range(heavy) for c in cost] + [x for c in cost for x in c[heavy:]]


def main_heavy(lengths: list[int]) -> None:
    """The balance on the masks with a heavy prefix (cmc/tiling.py heavy_tiles): the forward's
    pairs as shipped (no counter), single tiles in L2 groups, heavy tiles first; the kv grid
    in its order and with the heavy key tiles first (the transposed table's); equal-length
    batches of 32K tokens, 16 heads."""
    import bench

    from cmc.driver import front
    from cmc.tiling import heavy_tiles
    from cmc.transpose import transpose

    print("balance = ideal makespan / simulated makespan (1.0: every SM ends together)")
    for key, (mask, defines) in bench.ARTIFACTS.items():
        table = front(ROOT / mask, defines)
        heavy = heavy_tiles(table)
        if heavy == 0:
            continue
        tt = transpose(table)
        heavy_keys = heavy_tiles(tt)
        for n in lengths:
            seqs = [tile_costs(table, n, {})] * max(1, 32768 // n)
            nqt = len(seqs[0])
            pairs = pair_units(seqs, nqt, bench.HEADS)
            ideal = sum(pairs) / SMS
            tiles = grouped_tiles(seqs, nqt, bench.HEADS, n)
            first = heavy_first(seqs, nqt, bench.HEADS, n, min(heavy, nqt))
            hk = min(heavy_keys, nqt)
            kseqs = [2 * (tile_costs(tt, n, {}) - ITEM)] * len(seqs)
            grid = kv_grid(kseqs, nqt, bench.HEADS, n, False)
            kideal = sum(grid) / SMS
            print(f"{key:20s} heavy {heavy} L={n:6d}  pairs {ideal / static_makespan(pairs):.3f}"
                  f"  tiles {ideal / makespan(tiles):.3f}  heavy first {ideal / makespan(first):.3f}"
                  f"  | kv (heavy keys {hk}) grid {kideal / makespan(grid):.3f}  heavy first "
                  f"{kideal / makespan(kv_heavy_first(kseqs, nqt, bench.HEADS, hk)):.3f}")


if __name__ == "__main__":
    args = sys.argv[1:]
    if args[:1] == ["--bwd"]:
        main_bwd([int(a) for a in args[1:]] or [4096, 16384, 32768])
    elif args[:1] == ["--heavy"]:
        main_heavy([int(a) for a in args[1:]] or [4096, 16384, 32768])
    else:
        main([int(a) for a in args] or [1024, 4096, 32768])
