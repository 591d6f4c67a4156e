"""GPU check of the sm90 backward on patch tiles (bwd_dq_sm90 and bwd_kv_sm90 with the forward's
patch tiling; templates/cmc/attn_bwd_sm90_dq.cuh dq_patch, templates/cmc/attn_bwd_sm90.cuh
kv_patch). Run on GPUs since 2026-12-05; the split case since run 18 (H100, 2026-12-06).

Small CLEARs whose tile stage picks 8x16 patches at these lengths for both passes (grid origin
77: a partial linear tile before the grid; origin 0: none), and a clamped NATTEN (W 128, 13 x
13: interior patch masks, border patches on spans) on 8x16 and 16x8 patches asked for, and as
chosen: patches for the forward, linear tiles for the backward (tiling.choose_backward_tiling),
the split whose kinds read the second hook struct cmc_hooks_b; built for sm_90a, against
float64 autograd of the dense oracle mask (tests/gpu/harness.py), as
tests/gpu/test_backward_gpu.py does, in both modes: atomic (pre, kv, post: kv_patch's dK, dV
and its dQ atomics scattered to query tokens) and deterministic (pre, kv, dq: kv_patch's dK,
dV, dq_patch's dQ); gradients
NaN-poisoned first; pass: no NaN, relative error < 1e-2, keys no query sees dK = dV = 0, and
the deterministic runs bitwise equal.

Run on a GPU machine: `pytest -m gpu tests/gpu/test_backward_patch_gpu.py -q`.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import pytest

from .gpu_common import ROOT, cuda_torch, device_arch, requires_gpu
from .harness import backward_case, compare_grads

pytestmark = [pytest.mark.gpu, requires_gpu]
TOL = 1e-2
torch: Any = None

CLEAR = "samples/clear.mask"
NATTEN = "benchmarks/generality/natten_clamped.mask"
# (mask, defines, --tiling, packed, lengths, dtype, head_dim, hq, hkv, the backward on patches):
# every length >= the tiling's min_len has patches; the short ones are linear tiles in the same
# launch (a jagged batch).
CASES = [
    (CLEAR, {"TEXT": 77, "W": 128, "R": 16}, "auto", True, [1500, 77, 2133, 1101], "bf16", 128,
     4, 2, True),
    (CLEAR, {"TEXT": 0, "W": 128, "R": 16}, "auto", False, [1024 + 128 * 3 + 5] * 2, "fp16", 64,
     2, 1, True),
    (NATTEN, {"W": 128, "K": 13}, "8x16", True, [128 * 40 + 77, 900, 128 * 17], "bf16", 128, 2, 1,
     True),
    (NATTEN, {"W": 128, "K": 13}, "16x8", False, [128 * 66 + 5] * 2, "fp16", 64, 2, 2, True),
    (NATTEN, {"W": 128, "K": 13}, "auto", True, [128 * 40 + 77, 900, 128 * 17], "fp16", 64, 4, 2,
     False),
]
IDS = ["origin77-packed-bf16-d128", "origin0-batch-fp16-d64", "natten8x16-packed-bf16-d128",
       "natten16x8-batch-fp16-d64", "natten-split-packed-fp16-d64"]


@pytest.fixture(scope="module", autouse=True)
def _torch():
    global torch
    torch = cuda_torch()


def _artifact(mask: str, defines: dict[str, int], tiling: str, dtype: str, d: int, out: Path,
              bwd_kernel: str = "auto") -> Any:
    from cmc.driver import compile_file
    from cmc.runtime import load

    path = compile_file(ROOT / mask, out, archs=["sm_90a"], dtypes=[dtype], head_dims=[d],
                        defines=defines, jobs=min(8, os.cpu_count() or 1), tiling=tiling,
                        bwd_kernel=bwd_kernel)
    return load(path)


@pytest.mark.parametrize("bwd_kernel", ["auto", "lockstep"], ids=["sm90", "lockstep"])
@pytest.mark.parametrize("case", range(len(CASES)), ids=IDS)
def test_patch_backward_matches_reference(case, bwd_kernel):
    from cmc.driver import load_mask

    if device_arch() != "sm_90a":
        pytest.skip("the sm90 backward kinds are built for sm_90a only")
    mask, defines, tiling, packed, lengths, dtype, d, hq, hkv, bwd_patch = CASES[case]
    name = Path(mask).stem
    with tempfile.TemporaryDirectory(prefix="cmc-bwd-patch-") as tmp:
        attn = _artifact(mask, defines, tiling, dtype, d, Path(tmp), bwd_kernel)
    # a patch tiling bounds the sequence length (kernels.TileShape.max_len); linear does not
    # (the kernels for short sequences, below_len, are on linear tiles: test_short_sequences)
    main = [k for k in attn.manifest.kernels if not k.below_len]
    assert all(k.max_len is not None for k in main if k.pass_ == "forward")
    for role in ("dq", "kv"):
        ks = [k for k in main if k.role == role]
        kind = "sm90ws" if role == "kv" and bwd_kernel == "auto" else "sm90"
        assert ks and all(k.symbol.startswith(f"cmc_{name}_bwd_{role}_{kind}_") for k in ks)
        assert all((k.max_len is not None) == bwd_patch for k in ks), f"{role}'s tiling"
    c = backward_case(torch, load_mask(ROOT / mask, defines), packed,
                      lengths, dtype, d, hq, hkv, seed=11 + case)
    runs = _check_gradients(attn, c, d, ("atomic", "det", "det"), str(defines))
    assert torch.equal(runs[1], runs[2]), "deterministic dQ must be bitwise reproducible"


def _check_gradients(attn: Any, c: dict[str, Any], d: int, modes: tuple[str, ...],
                     what: str) -> list[Any]:
    """Forward, then a backward per mode (atomic / det) into NaN-poisoned gradients: each
    within TOL of float64, keys no query sees dK = dV = 0; returns each run's dQ."""
    kw, (q, k, v, do), (rdq, rdk, rdv), seen, t = c["kw"], c["shaped"], c["ref"], c["seen"], c["tokens"]
    out, lse = attn(q, k, v, return_lse=True, **kw)
    runs = []
    for mode in modes:
        dq, dk, dv = (torch.full_like(x, float("nan")) for x in (q, k, v))
        attn.backward(do, q, k, v, out, lse, dq=dq, dk=dk, dv=dv, deterministic=mode == "det",
                      **kw)
        torch.cuda.synchronize()
        got = [x.reshape(t, x.shape[-2], d) for x in (dq, dk, dv)]
        errs = compare_grads(torch, got, (rdq, rdk, rdv))
        assert all(e < TOL for e in errs.values()), f"{what} {mode}: {errs}"
        if (~seen).any():
            assert (got[1][~seen] == 0).all() and (got[2][~seen] == 0).all()
        runs.append(dq.clone())
    return runs


# (case of CASES, lengths all below its tiling's min_len: CLEAR origin 77's is 1,101, the
# 16 x 8 NATTEN's 8,192)
SHORT = [(0, [1000, 77, 1100]), (3, [128 * 40 + 5] * 2)]


@pytest.mark.parametrize("case,lengths", SHORT, ids=["origin77-packed", "natten16x8-batch"])
def test_short_sequences_run_their_own_kernels_and_match_reference(case, lengths):
    """Where every sequence is below the patch tiling's start length, the runtime launches the
    kernels for short sequences (linear tiles, below_len) for the forward, kv and dq: the same
    gradients within 1e-2 of float64, atomic and deterministic."""
    from cmc.driver import load_mask

    if device_arch() != "sm_90a":
        pytest.skip("the sm90 kinds are built for sm_90a only")
    mask, defines, tiling, packed, _, dtype, d, hq, hkv, _ = CASES[case]
    with tempfile.TemporaryDirectory(prefix="cmc-bwd-short-") as tmp:
        attn = _artifact(mask, defines, tiling, dtype, d, Path(tmp))
    short = {k.role: k for k in attn.manifest.kernels if k.below_len}
    assert sorted(short) == ["dq", "fwd", "kv"] and max(lengths) < short["fwd"].below_len
    dk = attn._kernels(torch.cuda.current_device())
    assert dk.forward(dtype, d, max(lengths)).entry is short["fwd"]
    roles = dk.backward_roles(dtype, d, max(lengths))
    assert roles["kv"].entry is short["kv"] and roles["dq"].entry is short["dq"]
    c = backward_case(torch, load_mask(ROOT / mask, defines), packed,
                      lengths, dtype, d, hq, hkv, seed=23 + case)
    _check_gradients(attn, c, d, ("atomic", "det"), f"{defines} short")
