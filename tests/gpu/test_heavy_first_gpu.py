"""GPU correctness of the heavy prefix (cmc/tiling.py with_heavy_first, the tile stage's
default since run 52): the sm90 forward's units are single tiles from the work counter with
the query tiles whose rows see every key taken first for every (sequence, head) (struct
Sched, H::kHeavyTiles); the ws kv kinds launch such key tiles first where the launcher sets
cmc_bwd_args.flags bit 1 (from the manifest's backward.kv_order.heavy_from_len on, cmc compile
--kv-heavy-from). The order must change no output: longformer (1 heavy tile), clear (4), and
the generality grids with text (77 tokens at width 48, linear; 333 at width 80, patches),
forward against the float64 reference at lengths shorter than the prefix, inside it, just
past it and long, in batches and packed; and the backward of longformer and clear, whose ws
kv kinds launch the key tiles every query sees first (ws_kv_cta, CMC_WS_HEAVY_FIRST) at
every length (--kv-heavy-from 0) or keep the grid's order below the default length, against
the float64 autograd reference in both dQ modes.

Run on a GPU machine: `pytest -m gpu tests/gpu/test_heavy_first_gpu.py -q` (builds with NVRTC
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

# (mask file, defines, heavy tiles the compiler must find; the CPU tier checks the counts:
# tests/test_sched.py)
MASKS = [
    ("samples/longformer.mask", {}, 1),
    ("samples/clear.mask", {}, 4),
    ("benchmarks/generality/grid_text.mask", {}, 1),
    ("benchmarks/generality/grid_text.mask", {"TEXT": 333, "W": 80, "R": 24}, 3),
]


@pytest.fixture(scope="module", autouse=True)
def _torch():
    import tests.gpu.test_backward_gpu as bwd
    import tests.gpu.test_gpu_correctness as corr

    corr.torch = bwd.torch = cuda_torch()


@pytest.mark.parametrize("path,defines,heavy", MASKS,
                         ids=[f"{Path(p).stem}-{d.get('TEXT', '')}" for p, d, _ in MASKS])
def test_heavy_first_matches_reference(path: str, defines: dict[str, int], heavy: int):
    from cmc.driver import compile_file, load_mask
    from cmc.runtime import load

    with tempfile.TemporaryDirectory(prefix="cmc-heavy-") as d:
        art = Path(compile_file(ROOT / path, d, archs=[device_arch()], dtypes=["bf16", "fp16"],
                                head_dims=[64, 128], defines=defines, backward=False,
                                jobs=min(8, os.cpu_count() or 1)))
        man = json.loads((art / "manifest.json").read_text())
        if device_arch() == "sm_90a":
            tilings = [k["tiling"] for k in man["kernels"] if k["arch"] == "sm_90a"]
            assert tilings and all((t["units"], t.get("heavy_tiles")) == ("tiles", heavy)
                                   for t in tilings), tilings
        attn = load(art)
        mask = load_mask(ROOT / path, defines)
        edge = heavy * 128
        lengths = sorted({1, 100, edge - 1, edge, edge + 1, edge + 300, 4096, 9000})
        cases: list[Case] = []
        for i, n in enumerate(lengths):
            dt, hd = [("bf16", 128), ("fp16", 64), ("bf16", 64), ("fp16", 128)][i % 4]
            cases.append(Case([n, n, n], False, dt, hd, 4, 2 if i % 2 else 4, variant=i))
        cases.append(Case([edge - 1, 9000, 130, edge + 5, 3000], True, "bf16", 128,
                          variant=99, note="packed"))
        failures = run_cases(attn, mask, cases, lambda i: 11 * i + 3)
        assert not failures, "\n".join(failures)


@pytest.mark.parametrize("from_len", [0, None])
@pytest.mark.parametrize("name,heavy", [("longformer", 1), ("clear", 4)])
def test_heavy_first_backward_matches_reference(name: str, heavy: int, from_len: int | None):
    from cmc.driver import compile_file
    from cmc.kernels import KV_HEAVY_FROM
    from cmc.runtime import load

    from .gpu_common import mask_of
    from .harness import backward_case
    from .test_backward_gpu import check_grads

    torch = cuda_torch()
    if device_arch() != "sm_90a":
        pytest.skip("the ws kv kinds are built for sm_90a only")
    with tempfile.TemporaryDirectory(prefix="cmc-heavy-bwd-") as d:
        art = Path(compile_file(ROOT / "samples" / f"{name}.mask", d, archs=["sm_90a"],
                                dtypes=["bf16", "fp16"], head_dims=[64, 128],
                                kv_heavy_from=KV_HEAVY_FROM if from_len is None else from_len,
                                jobs=min(8, os.cpu_count() or 1)))
        assert "#define CMC_WS_HEAVY_FIRST 1" in (art / f"{name}.cu").read_text()
        order = json.loads((art / "manifest.json").read_text())["backward"]["kv_order"]
        assert order == {"heavy_tiles": heavy, "heavy_from_len": from_len if from_len is not None
                         else KV_HEAVY_FROM}
        attn = load(art)
        # every case below is shorter than the default length: the grid's order there
        assert attn.manifest.backward.flags(False, 4000) == (2 if from_len == 0 else 0)
        edge = heavy * 128
        for i, (packed, lengths, dtype, dd, hq, hkv) in enumerate([
                (True, [1, edge + 300, 77, edge - 1, 2000], "bf16", 128, 4, 2),
                (False, [edge + 129, edge + 129], "fp16", 64, 2, 1)]):
            c = backward_case(torch, mask_of(name), packed, lengths, dtype, dd, hq, hkv, 5 + i)
            q, k, v, do = c["shaped"]
            out, lse = attn(q, k, v, return_lse=True, **c["kw"])
            for det in (False, True):
                dq, dk, dv = (torch.full_like(x, float("nan")) for x in (q, k, v))
                attn.backward(do, q, k, v, out, lse, dq=dq, dk=dk, dv=dv, deterministic=det,
                              **c["kw"])
                torch.cuda.synchronize()
                check_grads(c, (dq, dk, dv), f"{name} kv from {from_len} "
                                             f"{'det' if det else 'atomic'}")
