"""GPU correctness of the interior tile masks of clamped (NATTEN-style) neighbourhoods
(cmc/tiling.py `interior_patch_masks`): the generality suite's natten_clamped (W 96, 13 x 13,
8x16 patches as chosen and 16x8 as `--tiling 16x8` asks, from len 6144) and a W 128 variant
(patches from len 1024). Every length from
min_len on has border patches (the top row and the bottom rows, which evaluate the spans)
and, from ((row_top + 1) * rows + rows_below) grid rows on, interior ones (which load a tile
mask: one set per patch column, so the first and last columns' clamped windows load their
own); lengths below, at and above that bound, ending inside a grid row and inside a patch
row, against the float64 reference, batched and packed.

Run on a GPU machine: `pytest -m gpu tests/gpu/test_gpu_natten_interior.py -q` (builds with
NVRTC for the device's arch; skips cleanly without a CUDA device).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pytest

from .gpu_common import ROOT, cuda_torch, device_arch, requires_gpu
from .test_gpu_correctness import Case, run_cases

pytestmark = [pytest.mark.gpu, requires_gpu]

MASK = "benchmarks/generality/natten_clamped.mask"
# (defines, --tiling)
VARIANTS = [({}, "auto"), ({}, "16x8"), ({"W": 128, "K": 13}, "auto")]


@pytest.fixture(scope="module", autouse=True)
def _torch():
    import tests.gpu.test_gpu_correctness as corr

    corr.torch = cuda_torch()


def _lengths(width: int, min_len: int, first_interior: int) -> list[int]:
    """Linear only, border patches only, the first interior patch, partial rows, long."""
    return sorted({max(min_len - 1, 1), min_len, min_len + 5, first_interior - 1,
                   first_interior, first_interior + width // 2 + 3,
                   first_interior + 16 * width + 7, 9000, 12288})


@pytest.mark.parametrize("defines,tiling", VARIANTS, ids=["w96_k13", "w96_k13_16x8", "w128_k13"])
def test_natten_interior_masks_match_reference(defines: dict[str, int], tiling: str):
    from cmc.driver import compile_file, load_mask
    from cmc.runtime import load

    with tempfile.TemporaryDirectory(prefix="cmc-natten-") as d:
        art = Path(compile_file(ROOT / MASK, Path(d), archs=[device_arch()],
                                dtypes=["bf16", "fp16"], head_dims=[64, 128], defines=defines,
                                tiling=tiling if device_arch() == "sm_90a" else "auto",
                                jobs=min(8, os.cpu_count() or 1), backward=False))
        man = json.loads((art / "manifest.json").read_text())
        tilings = [k["tiling"] for k in man["kernels"]  # the short kernels: linear tiles
                   if k["arch"] == "sm_90a" and not k["below_len"]]
        width = defines.get("W", 96)
        min_len, first = 0, 3 * 16 * width
        if device_arch() == "sm_90a":
            assert tilings and all(t["kind"] == "patch" for t in tilings), tilings
            rows, cols = tilings[0]["patch_rows"], tilings[0]["patch_cols"]
            if tiling == "16x8":
                assert (rows, cols) == (16, 8)
            inner = tilings[0]["masks"]["interior"]
            assert inner == {"row_top": 1, "rows_below": 6, "cols": [0, width // cols],
                             "per_column": True}
            min_len = tilings[0]["min_len"]
            first = ((inner["row_top"] + 1) * rows + inner["rows_below"]) * width
        attn = load(art)
        mask = load_mask(ROOT / MASK, defines)
        cases: list[Case] = []
        for i, n in enumerate(_lengths(width, min_len, first)):
            dt, hd = [("bf16", 128), ("fp16", 64), ("bf16", 64), ("fp16", 128)][i % 4]
            cases.append(Case([n], False, dt, hd, 4, 2 if i % 2 else 4, variant=i))
        cases.append(Case([first + 50, min_len + 1, first - 1, 1000], True, "bf16", 128,
                          variant=99, note="packed"))
        failures = run_cases(attn, mask, cases, lambda i: 11 * i + 3)
        assert not failures, "\n".join(failures)
