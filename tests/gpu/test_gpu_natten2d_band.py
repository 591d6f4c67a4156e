"""GPU correctness of natten2d's band tile masks on linear tiles (cmc/tiling.py
`lattice_offset_masks`; the sm90 forward selects them with `cmc_offset_band` and evaluates
the spans for every other tile pair). natten2d (W 64, 7 x 7 clamped): band from query tile 2,
2 tiles below, so the first band tile appears at len 640. Lengths: no band tile (448), one
token short (639), exactly the first (640), a partial last row (700), 4096, a partial tile
past it (4196) and 16384, over bf16 / fp16 x d64 / d128, against the float64 reference,
plus a packed batch that mixes band and border-only sequences.

Run on a GPU machine: `pytest -m gpu tests/gpu/test_gpu_natten2d_band.py -q` (builds with
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

MASK = "samples/natten2d.mask"
LENGTHS = [448, 639, 640, 700, 4096, 4196, 16384]
VARIANTS = [("bf16", 64), ("bf16", 128), ("fp16", 64), ("fp16", 128)]


@pytest.fixture(scope="module", autouse=True)
def _torch():
    import tests.gpu.test_gpu_correctness as corr

    corr.torch = cuda_torch()


def test_natten2d_band_masks_match_reference():
    from cmc.driver import compile_file, load_mask
    from cmc.runtime import load

    with tempfile.TemporaryDirectory(prefix="cmc-natten2d-") as d:
        art = Path(compile_file(ROOT / MASK, Path(d), archs=[device_arch()],
                                dtypes=["bf16", "fp16"], head_dims=[64, 128],
                                jobs=min(8, os.cpu_count() or 1), backward=False))
        man = json.loads((art / "manifest.json").read_text())
        if device_arch() == "sm_90a":
            tilings = [k["tiling"] for k in man["kernels"]
                       if k["arch"] == "sm_90a" and not k["below_len"]]
            assert tilings and all(t["kind"] == "linear" for t in tilings), tilings
            assert all(t["offset_masks"] == {
                "classes": 5, "offsets": [-2, 3],
                "band": {"tile_top": 2, "tiles_below": 2, "max_len": 1 << 18}}
                for t in tilings), tilings
        attn = load(art)
        mask = load_mask(ROOT / MASK, {})
        cases: list[Case] = []
        for i, n in enumerate(LENGTHS):
            for j, (dt, hd) in enumerate(VARIANTS):
                hq, hkv = (2, 1) if n > 8192 else (4, 2 if j % 2 else 4)
                cases.append(Case([n], False, dt, hd, hq, hkv, variant=4 * i + j))
        cases.append(Case([640, 448, 4196, 639, 700], True, "bf16", 128, variant=99,
                          note="packed"))
        failures = run_cases(attn, mask, cases, lambda i: 13 * i + 5)
        assert not failures, "\n".join(failures)
