"""The persistent grid's balance, simulated from the interval table (CPU): how close the work
counter schedule comes to a perfect split over the SMs, taking units in index order (the
kernel) or costliest first, for the benchmark's linear cases.

Units as struct Sched in templates/cmc/attn_fwd_sm90.cuh: "pairs" of query tiles
(nqt - 1 - p, p) of one (sequence, head), or single "tiles" in L2 groups. An item costs ITEM key tiles plus its visible key tiles
(partial ones PART); a CTA takes its next unit when its last one ends (the counter).

    python tools/sched_sim.py 1024 4096 8192
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


def grouped_tiles(seqs: list[np.ndarray], nqt: int, heads: int, max_len: int) -> list[float]:
    """Units "tiles": groups of (sequence, head)s whose K/V fit the 24 MiB L2 budget (bf16,
    D = 128); within a group tile index descending, then (sequence, head); a tile past its
    sequence's end costs almost nothing."""
    group = max(1, (24 << 20) // (max_len * 512))
    bh = [tc for tc in seqs for _ in range(heads)]
    units: list[float] = []
    for g0 in range(0, len(bh), group):
        for qt in range(nqt - 1, -1, -1):
            units += [float(tc[qt]) if qt < len(tc) else 0.05 for tc in bh[g0:g0 + group]]
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


if __name__ == "__main__":
    main([int(a) for a in sys.argv[1:]] or [1024, 4096, 32768])
