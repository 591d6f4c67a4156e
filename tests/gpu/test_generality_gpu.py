"""GPU tier over masks the samples do not tune to (issue 21's "generated set of masks"): the
generality suite of the benchmark, benchmarks/masks.py GENERALITY (its mask files, -D values
and parameter draws), forward and backward, against the float64 reference on cmc.oracle's
dense mask (tests/gpu/harness.py).

Bounded time: one case per spec, at lengths where each mask's structure shows (an unaligned
text block before a grid, a clamped border, two video frames, windows shorter than the
sequence), one dtype / head dim / GQA combination per spec, alternating (bf16 D=128 GQA 4/2
packed; fp16 D=64 MQA 2/1 batch layout), so both head dims and both layouts meet both
backward kernels. Backward: atomic and deterministic mode, gradients NaN-poisoned first;
pass as tests/gpu/test_backward_gpu.py (relative error < 1e-2, dK = dV = 0 for keys no query
sees, dQ = 0 for rows that see nothing).

Artifacts: CMC_GPU_ARTIFACTS/gen/KEY[/bwd_sm90]/NAME when set (tools/gpu_artifacts.py builds
them), else built here once per session.
"""

from __future__ import annotations

import math
import os
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from .gpu_common import BUILDS, ROOT, cuda_torch, device_arch, requires_gpu
from .harness import (
    call_params,
    compare,
    compare_grads,
    gpu_inputs,
    oracle_masks,
    reference,
    reference_grads,
)

sys.path.insert(0, str(ROOT / "benchmarks"))
from masks import GENERALITY  # noqa: E402

pytestmark = [pytest.mark.gpu, requires_gpu]
TOL = 1e-2
COMBOS = [  # (packed, lengths, dtype, head_dim, hq, hkv), by spec index parity
    (True, [1300, 77, 517], "bf16", 128, 4, 2),
    (False, [1100, 1100], "fp16", 64, 2, 1),
]
SPECS = list(enumerate(GENERALITY))
torch: Any = None
_lock = threading.Lock()
_built: dict[tuple[str, str], Path] = {}
_tmp: Path | None = None


@pytest.fixture(scope="module", autouse=True)
def _torch():
    global torch
    torch = cuda_torch()


def gen_artifact(spec: Any, bwd_kernel: str) -> Path:
    global _tmp
    from cmc.driver import compile_file, load_mask

    sub, kind, layout = BUILDS[bwd_kernel]  # as tools/gpu_artifacts.py prebuilds it
    prebuilt = os.environ.get("CMC_GPU_ARTIFACTS")
    if prebuilt:
        name = load_mask(ROOT / spec.mask, spec.defines).name
        path = Path(prebuilt) / "gen" / spec.key / sub / name
        if not (path / "manifest.json").is_file():
            pytest.fail(f"CMC_GPU_ARTIFACTS={prebuilt} has no gen/{spec.key}/{sub}/{name} "
                        "(tools/gpu_artifacts.py builds it)")
        return path
    with _lock:
        if (spec.key, bwd_kernel) not in _built:
            if _tmp is None:
                _tmp = Path(tempfile.mkdtemp(prefix="cmc-gen-"))
            _built[(spec.key, bwd_kernel)] = Path(compile_file(
                ROOT / spec.mask, _tmp / spec.key / sub, archs=[device_arch()],
                dtypes=["bf16", "fp16"], head_dims=[64, 128], defines=spec.defines,
                jobs=min(8, os.cpu_count() or 1), bwd_kernel=kind, dq_layout=layout))
        return _built[(spec.key, bwd_kernel)]


def setup(index: int, spec: Any, seed: int) -> dict[str, Any]:
    """Inputs, keyword arguments and the dense oracle masks of spec's case."""
    from cmc.driver import load_mask

    packed, lengths, dtype, d, hq, hkv = COMBOS[index % 2]
    mask = load_mask(ROOT / spec.mask, spec.defines)
    rng = np.random.default_rng(seed)
    per_seq = [spec.make_params(rng, n) for n in lengths]
    kw = call_params(mask, per_seq)
    flat, shaped = gpu_inputs(torch, lengths, dtype, d, hq, hkv, seed, packed, kw)
    return {"kw": kw, "flat": flat, "shaped": shaped, "lengths": lengths,
            "masks": oracle_masks(torch, mask, lengths, per_seq, "cuda"), "packed": packed,
            "scale": 1.0 / math.sqrt(d), "what": f"{spec.key} {'packed' if packed else 'batch'} "
                                                 f"{dtype} d{d} h{hq}/{hkv}"}


@pytest.mark.parametrize("index, spec", SPECS, ids=[s.key for _, s in SPECS])
def test_generality_forward(index, spec):
    from cmc.runtime import load

    attn = load(gen_artifact(spec, "auto"))
    c = setup(index, spec, seed=100 + index)
    q, k, v, _ = c["shaped"]
    out = torch.full_like(q, float("nan"))
    o, lse = attn(q, k, v, out=out, return_lse=True, **c["kw"])
    assert o is out
    torch.cuda.synchronize()
    t = sum(c["lengths"])
    if not c["packed"]:
        lse = lse.permute(1, 0, 2).reshape(lse.shape[1], t)
    fq, fk, fv, _ = c["flat"]
    ref_o, ref_lse = reference(torch, fq, fk, fv, c["lengths"], c["masks"], c["scale"])
    err = compare(torch, o.reshape(fq.shape), lse, ref_o, ref_lse)
    assert err < TOL, f"{c['what']}: relative error {err:.3g}"


@pytest.mark.parametrize("bwd_kernel", ["portable", "auto"], ids=["portable", "sm90"])
@pytest.mark.parametrize("index, spec", SPECS, ids=[s.key for _, s in SPECS])
def test_generality_backward(index, spec, bwd_kernel):
    from cmc.runtime import load

    if bwd_kernel == "auto" and device_arch() != "sm_90a":
        pytest.skip("the sm90 dK/dV kind is built for sm_90a only")
    attn = load(gen_artifact(spec, bwd_kernel))
    assert attn.has_backward
    c = setup(index, spec, seed=200 + index)
    q, k, v, do = c["shaped"]
    fq, fk, fv, fdo = c["flat"]
    _, _, rdq, rdk, rdv = reference_grads(torch, fq, fk, fv, fdo, c["lengths"], c["masks"],
                                          c["scale"])
    dense = [fn(0, n) for n, fn in zip(c["lengths"], c["masks"], strict=True)]
    seen = torch.cat([m.any(0) for m in dense])
    sees = torch.cat([m.any(1) for m in dense])
    out, lse = attn(q, k, v, return_lse=True, **c["kw"])
    runs = []
    for mode in ("atomic", "det", "det"):
        dq, dk, dv = (torch.full_like(x, float("nan")) for x in (q, k, v))
        attn.backward(do, q, k, v, out, lse, dq=dq, dk=dk, dv=dv,
                      deterministic=mode == "det", **c["kw"])
        torch.cuda.synchronize()
        flat = [x.reshape(-1, x.shape[-2], x.shape[-1]) for x in (dq, dk, dv)]
        errs = compare_grads(torch, flat, (rdq, rdk, rdv))
        what = f"{c['what']} {bwd_kernel} {mode}"
        assert all(e < TOL for e in errs.values()), f"{what}: {errs}"
        if (~seen).any():
            assert (flat[1][~seen] == 0).all() and (flat[2][~seen] == 0).all(), \
                f"{what}: keys no query sees must get dK = dV = 0"
        if (~sees).any():
            assert (flat[0][~sees] == 0).all(), f"{what}: rows that see no key must get dQ = 0"
        if mode == "det":
            runs.append((dq.clone(), dk.clone(), dv.clone()))
    assert all(torch.equal(a, b) for a, b in zip(*runs, strict=True)), \
        f"{c['what']}: deterministic mode must be bitwise reproducible"
