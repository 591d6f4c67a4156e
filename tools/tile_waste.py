"""Computed pairs per visible pair and partial-tile share of the kernel's 128 x 128 tiling, for
the benchmark's causal, HSTU and shared-prefix parameters (from the interval table alone).

    python tools/tile_waste.py 4096 32768
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


if __name__ == "__main__":
    main([int(a) for a in sys.argv[1:]] or [4096, 32768])
