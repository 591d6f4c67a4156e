"""GPU correctness of the per-offset tile masks of linear tiles (cmc/tiling.py
offset_masks): masks whose visibility depends only on q - k, with a residual, against the
float64 reference of the dense oracle (the harness of test_gpu_correctness.py).

benchmarks/generality/dilated_band.mask (33 tile offsets), two small dilated masks (a
skewed band and one with a deny), one periodic without bound on both sides of the diagonal
(offsets past each end reuse one period) and tile-aligned blocks, every dtype and head dim,
batch and packed layouts,
lengths that cut the last key tile at len. The manifest must say that the sm90 kernels
carry the tile masks, so that these cases run the loaded masks, not the predicate.

Run on a GPU machine: `pytest -m gpu tests/gpu/test_offset_masks_gpu.py -q`.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pytest

from . import test_gpu_correctness as corr
from .gpu_common import DTYPES, HEAD_DIMS, ROOT, cuda_torch, device_arch, requires_gpu

pytestmark = [pytest.mark.gpu, requires_gpu]

SMALL = {
    "dilated_skew": "allow -100 <= q - k < 400 and (2 * q - 2 * k + 1) % 5 == 0",
    "dilated_deny": "allow abs(q - k) < 260 and (k - q) % 4 != 1\ndeny abs(q - k) == 7",
    # unbounded on both sides, periodic past |q - k| >= 40 (cmc/periodic.py): 5 offsets reused
    "periodic_two_sided": "allow (q - k) % 5 == 0 or abs(q - k) < 40",
    # tile-aligned blocks, unchanged when q and k move together by a tile (not q - k alone)
    "blocks64": "allow k <= q and (k / 64 == q / 64 or k % 64 < 8 or q % 32 == 0)",
}


@pytest.fixture(scope="module", autouse=True)
def _torch():
    corr.torch = cuda_torch()


@pytest.fixture(scope="module")
def masks_dir():
    with tempfile.TemporaryDirectory(prefix="cmc-offset-gpu-") as d:
        folder = Path(d)
        paths = {"dilated_band": ROOT / "benchmarks" / "generality" / "dilated_band.mask"}
        for name, body in SMALL.items():
            paths[name] = folder / f"{name}.mask"
            paths[name].write_text(f"mask {name}\n{body}\n")
        yield folder, paths


def _cases() -> list[corr.Case]:
    out = []
    i = 0
    for n in (1, 127, 129, 1000, 2048, 5000):
        dt, hd = corr.VARIANTS[i % 4]
        hq, hkv = corr.HEADS[i % 3]
        out.append(corr.Case([n] * 2, False, dt, hd, hq, hkv, variant=i))
        i += 1
    for lens in ([1, 127, 0, 129, 700], [4200, 5, 1000]):
        for _rep in range(4):
            dt, hd = corr.VARIANTS[i % 4]
            hq, hkv = corr.HEADS[i % 3]
            out.append(corr.Case(lens, True, dt, hd, hq, hkv, variant=i))
            i += 1
    return out


@pytest.mark.parametrize("name", ["dilated_band", *sorted(SMALL)])
def test_offset_masks_match_reference(name, masks_dir):
    from cmc.driver import compile_file, load_mask
    from cmc.runtime import load

    folder, paths = masks_dir
    art = Path(compile_file(paths[name], folder / "out", archs=[device_arch()],
                            dtypes=list(DTYPES), head_dims=list(HEAD_DIMS),
                            jobs=min(8, os.cpu_count() or 1), backward=False))
    manifest = json.loads((art / "manifest.json").read_text())
    sm90 = [k for k in manifest["kernels"] if k["kernel"] == "sm90"]
    if device_arch() == "sm_90a":
        assert sm90 and all(k["tiling"]["offset_masks"] for k in sm90), "no tile masks"
    attn = load(art)
    mask = load_mask(paths[name])
    failures = corr.run_cases(attn, mask, _cases(), lambda i: 7000 + 31 * i)
    assert not failures, "\n".join(failures)
