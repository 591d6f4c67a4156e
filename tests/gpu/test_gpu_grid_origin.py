"""GPU correctness of patch tilings whose grid begins at any token (cmc/tiling.py): the last
linear tile is partial, so its rows past the origin must not be stored and its keys past the
origin must be masked (they belong to patches). CLEAR-like masks at origins 77, 133 and 333
(widths 128, 80, 96; at width 80 radius 6, since radius 10 counts linear tiles cheaper), the
generality suite's grids (grid_text at origin 77, width 48: linear; width 96: 8x16 patches
as chosen, and 16x8 as `--tiling 16x8` asks, with its 77 patch-offset masks; origin 333,
width 80: patches with tile masks), and a width-160, radius-64 grid whose patches have no
tile masks, forward against the float64 reference at lengths shorter than the origin, ending
inside the partial tile, just past it, below and above min_len, and long.

Run on a GPU machine: `pytest -m gpu tests/gpu/test_gpu_grid_origin.py -q` (builds with NVRTC
for the device's arch; skips cleanly without a CUDA device).
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

# (mask file, defines, --tiling, tiling kind the tile stage must give on sm_90a; the CPU tier
# checks the kinds: tests/test_tiling.py::test_grid_origin_cases_get_their_tilings)
GRIDS = [
    ("samples/clear.mask", {"TEXT": 77}, "auto", "patch"),
    ("samples/clear.mask", {"TEXT": 133, "W": 80, "R": 6}, "auto", "patch"),
    ("samples/clear.mask", {"TEXT": 333, "W": 96, "R": 12}, "auto", "patch"),
    ("benchmarks/generality/grid_text.mask", {}, "auto", "linear"),
    # the generality suite's other grids: 8x16 with tile masks (W 80; W 96, where 16x8
    # counts 5 % fewer pairs but its producer's 64 boxes per key tile bound it); 16x8 asked
    # for, with 77 tile masks (over 64: tiling.MAX_PATCH_MASK_CLASSES)
    ("benchmarks/generality/grid_text.mask", {"TEXT": 333, "W": 80, "R": 24}, "auto", "patch"),
    ("benchmarks/generality/grid_text.mask", {"TEXT": 77, "W": 96, "R": 40}, "auto", "patch"),
    ("benchmarks/generality/grid_text.mask", {"TEXT": 77, "W": 96, "R": 40}, "16x8", "patch"),
    # patches without tile masks (queries reach 63 grid rows, past the proof's 64-row
    # reference): every span evaluated
    ("benchmarks/generality/grid_text.mask", {"TEXT": 77, "W": 160, "R": 64}, "auto", "patch"),
]


@pytest.fixture(scope="module", autouse=True)
def _torch():
    import tests.gpu.test_gpu_correctness as corr

    corr.torch = cuda_torch()


def _lengths(origin: int, min_len: int) -> list[int]:
    part = origin - origin % 128
    return sorted({1, origin - 1, origin, origin + 1, part + 127, part + 129,
                   max(min_len - 1, 1), max(min_len, 1), min_len + 777, 9000})


def _build(path: str, defines: dict[str, int], tiling: str, out: Path) -> Path:
    from cmc.driver import compile_file

    return Path(compile_file(ROOT / path, out, archs=[device_arch()], dtypes=["bf16", "fp16"],
                             head_dims=[64, 128], defines=defines, tiling=tiling,
                             jobs=min(8, os.cpu_count() or 1), backward=False))


@pytest.mark.parametrize("path,defines,tiling,kind", GRIDS,
                         ids=[f"{Path(p).stem}-{d.get('TEXT', 77)}-{d.get('W', 0)}-{t}"
                              for p, d, t, _ in GRIDS])
def test_grid_at_any_origin_matches_reference(path: str, defines: dict[str, int], tiling: str,
                                              kind: str):
    from cmc.driver import load_mask
    from cmc.runtime import load

    with tempfile.TemporaryDirectory(prefix="cmc-grid-origin-") as d:
        art = _build(path, defines, tiling if device_arch() == "sm_90a" else "auto", Path(d))
        man = json.loads((art / "manifest.json").read_text())
        tilings = [k["tiling"] for k in man["kernels"]  # the short kernels: linear tiles
                   if k["arch"] == "sm_90a" and not k["below_len"]]
        if device_arch() == "sm_90a":
            assert tilings and all(t["kind"] == kind for t in tilings), tilings
            assert all("computed pairs" in t["reason"] for t in tilings), tilings
        origin = tilings[0]["origin"] if tilings and kind == "patch" else 77
        min_len = tilings[0]["min_len"] if tilings else 0
        attn = load(art)
        mask = load_mask(ROOT / path, defines)
        cases: list[Case] = []
        for i, n in enumerate(_lengths(origin, min_len)):
            dt, hd = [("bf16", 128), ("fp16", 64), ("bf16", 64), ("fp16", 128)][i % 4]
            cases.append(Case([n, n], False, dt, hd, 4, 2 if i % 2 else 4, variant=i))
        cases.append(Case([origin - 1, origin + 50, 9000, 130, origin], True, "bf16", 128,
                          variant=99, note="packed"))
        failures = run_cases(attn, mask, cases, lambda i: 7 * i + 1)
        assert not failures, "\n".join(failures)
