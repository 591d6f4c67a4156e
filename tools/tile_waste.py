"""Computed pairs per visible pair and partial-tile share of the kernel's 128 x 128 tiling, for
the benchmark's causal, HSTU and shared-prefix parameters (from the interval table alone).

    python tools/tile_waste.py 4096 32768
    python tools/tile_waste.py --jagged 1024 2048 4096

`--jagged` takes the benchmark's own cases (benchmarks/bench.py make_cases, its seed, the
lengths grouped as tools/device_bench.sh runs them) and compares the jagged ones with
causal at the same length. Besides 128 x 128 tiles it counts two finer granularities the
kernel does not have: 64 x 128 (a consumer warpgroup that skips its GEMMs when its 64
rows see nothing of the key tile) and 64 x 64 quarters. `bound` = causal's computed per
visible over the case's: the jagged rate over our causal rate if every computed pair cost
the same, at each granularity.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main(lengths: list[int]) -> None:
    from cmc.driver import front
    from cmc.tiles import FULL, PARTIAL, classify, visible_pairs

    for L in lengths:
        r = (L - L // 4) // 4  # as benchmarks/bench.py make_cases
        cases = {
            "causal": ("causal", {}),
            "hstu": ("hstu", {"n_targets": L // 8}),
            "shared_prefix": ("shared_prefix", {"prompt_len": L // 4,
                                                "responses": [L // 4 + i * r for i in range(4)]}),
        }
        for name, (mask, params) in cases.items():
            table = front(ROOT / "samples" / f"{mask}.mask")
            cls = classify(table, L, params)
            full, part = int((cls == FULL).sum()), int((cls == PARTIAL).sum())
            computed = (full + part) * 128 * 128
            print(f"L={L:6d} {name:14s} full {full:6d} partial {part:5d}  computed / visible "
                  f"{computed / visible_pairs(table, L, params):.3f}  partial share "
                  f"{part / (full + part):.1%}")


def computed_per_visible(table, lengths, params, tile_m: int, tile_n: int) -> float:
    from cmc.tiles import EMPTY, classify, visible_pairs

    computed = visible = 0
    for n, p in zip(lengths, params, strict=True):
        computed += int((classify(table, n, p, tile_m, tile_n) != EMPTY).sum()) * tile_m * tile_n
        visible += visible_pairs(table, n, p)
    return computed / visible


def jagged(lengths: list[int]) -> None:
    import numpy as np

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import bench

    from cmc.driver import front

    groups = [tuple(L for L in (1024, 2048, 4096) if L in lengths),
              tuple(L for L in (8192, 16384, 32768) if L in lengths)]
    cases = [c for g in groups if g for c in bench.make_cases(np.random.default_rng(20261202), g)]
    tables = {m: front(ROOT / "samples" / f"{m}.mask") for m in ("causal", "hstu",
                                                                 "shared_prefix")}
    grains = [(128, 128), (64, 128), (64, 64)]
    base: dict[int, list[float]] = {}
    print("computed / visible at tiles 128x128, 64x128, 64x64; bound = causal's / the case's")
    for c in cases:
        if c.pattern not in ("causal", "hstu_jagged", "shared_prefix_jagged"):
            continue
        table = tables[bench.artifact_for(c.pattern)]
        cv = [computed_per_visible(table, c.lengths, c.params, m, n) for m, n in grains]
        if c.pattern == "causal":
            base[c.length] = cv
        bound = "  ".join(f"{b / x:.2f}" for b, x in zip(base[c.length], cv, strict=True))
        print(f"L={c.length:6d} {c.pattern:22s} {len(c.lengths):4d} seqs  "
              + "  ".join(f"{x:.3f}" for x in cv) + f"   bound {bound}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--jagged"]:
        jagged([int(a) for a in sys.argv[2:]] or [1024, 2048, 4096])
    else:
        main([int(a) for a in sys.argv[1:]] or [4096, 32768])
