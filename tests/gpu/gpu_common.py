"""Shared by the GPU tier: device detection through the driver API (not torch), one build of
every sample per session, the float64 reference, and parameter values per sample."""

from __future__ import annotations

import os
import tempfile
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent.parent
SAMPLES = sorted((ROOT / "samples").glob("*.mask"))
DTYPES = ("bf16", "fp16")
HEAD_DIMS = (64, 128)


def _probe() -> tuple[int, int] | None:
    """Compute capability of device 0, or None without a usable CUDA driver and device."""
    try:
        from cuda.bindings import driver as cu

        if int(cu.cuInit(0)[0]) != 0:
            return None
        err, n = cu.cuDeviceGetCount()
        if int(err) != 0 or n < 1:
            return None
        a = cu.CUdevice_attribute
        major = cu.cuDeviceGetAttribute(a.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, 0)[1]
        minor = cu.cuDeviceGetAttribute(a.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, 0)[1]
        return int(major), int(minor)
    except Exception:
        return None


CC = _probe()
requires_gpu = pytest.mark.skipif(CC is None, reason="no CUDA device (driver API probe)")


def device_arch() -> str:
    assert CC is not None
    major, minor = CC
    return f"sm_{major}{minor}{'a' if major >= 9 else ''}"


_lock = threading.Lock()
_out_dir: Path | None = None
_built: dict[str, Path] = {}


def artifact(name: str) -> Path:
    """OUT/NAME for samples/NAME.mask, built once per session for this GPU's arch, for every
    dtype and head dim, through the project's own pipeline (or taken from the folder named by
    CMC_GPU_ARTIFACTS, when the GPU machine cannot run NVRTC)."""
    global _out_dir
    prebuilt = os.environ.get("CMC_GPU_ARTIFACTS")
    if prebuilt:  # built elsewhere, e.g. `cmc compile samples/*.mask -o out/gpu --arch sm_90a`
        path = Path(prebuilt) / name
        if not (path / "manifest.json").is_file():
            pytest.fail(f"CMC_GPU_ARTIFACTS={prebuilt} has no {name}/manifest.json")
        return path
    from cmc.driver import compile_file

    with _lock:
        if name not in _built:
            if _out_dir is None:
                _out_dir = Path(tempfile.mkdtemp(prefix="cmc-gpu-"))
            _built[name] = Path(compile_file(
                ROOT / "samples" / f"{name}.mask", _out_dir, archs=[device_arch()],
                dtypes=list(DTYPES), head_dims=list(HEAD_DIMS), jobs=min(8, os.cpu_count() or 1)))
        return _built[name]


def mask_of(name: str) -> Any:
    from cmc.driver import load_mask

    return load_mask(ROOT / "samples" / f"{name}.mask")


# --------------------------------------------------------------------------- parameters


def seq_params(mask: Any, length: int, variant: int, rng: np.random.Generator,
               scalars: dict[str, int]) -> dict[str, Any]:
    """One sequence's values: edge cases by `variant`, random ones beyond."""
    out: dict[str, Any] = {}
    for p in mask.params:
        if p.kind == "scalar":
            out[p.name] = scalars[p.name]
        elif p.kind == "batch":
            choices = [0, length // 8, length, int(rng.integers(0, length + 1))]
            out[p.name] = choices[variant % len(choices)]
        else:
            v = variant % 5
            if v == 0:
                starts: list[int] = []
            elif v == 1:
                starts = [0]
            elif v == 2:
                starts = [length]
            elif v == 3:
                n = int(rng.integers(1, 7))
                starts = sorted(int(x) for x in rng.integers(0, length + 1, size=n))
                if len(starts) > 1:
                    starts[1] = starts[0]  # a duplicate start: an empty segment
                    starts.sort()
            else:
                starts = list(range(0, length, max(1, length // 4)))
            out[p.name] = starts
    return out


def scalar_values(mask: Any, variant: int) -> dict[str, int]:
    choices = [17, 0, 1, 300, 2**31 - 1]
    return {p.name: choices[variant % len(choices)] for p in mask.params if p.kind == "scalar"}


def call_params(mask: Any, per_seq: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per-sequence dicts -> the runtime's keyword arguments."""
    out: dict[str, Any] = {}
    for p in mask.params:
        if p.kind == "scalar":
            out[p.name] = per_seq[0][p.name] if per_seq else 0
        else:
            out[p.name] = [ps[p.name] for ps in per_seq]
    return out


# --------------------------------------------------------------------------- reference

MaskFn = Callable[[int, int], Any]  # rows [r0, r1) -> bool [r1 - r0, L] on the device


def reference(torch: Any, q: Any, k: Any, v: Any, lengths: Sequence[int],
              masks: Sequence[MaskFn], scale: float) -> tuple[Any, Any]:
    """Masked softmax attention in float64 on the GPU, packed layout: O [T, Hq, D] and the
    natural-log LSE [Hq, T]; a row that sees no key gives O = 0 and LSE = -inf."""
    tokens, hq, d = q.shape
    group = hq // k.shape[1]
    o = torch.zeros((tokens, hq, d), dtype=torch.float64, device=q.device)
    lse = torch.full((hq, tokens), float("-inf"), dtype=torch.float64, device=q.device)
    start = 0
    for n, mask_fn in zip(lengths, masks, strict=True):
        if n == 0:
            continue
        qs = q[start:start + n].double().transpose(0, 1)
        ks = k[start:start + n].double().transpose(0, 1).repeat_interleave(group, 0)
        vs = v[start:start + n].double().transpose(0, 1).repeat_interleave(group, 0)
        chunk = max(1, min(n, 2**26 // (hq * n)))
        for r0 in range(0, n, chunk):
            r1 = min(n, r0 + chunk)
            s = (qs[:, r0:r1] @ ks.transpose(1, 2)) * scale
            s = s.masked_fill(~mask_fn(r0, r1)[None], float("-inf"))
            mx = s.amax(-1, keepdim=True)
            mx = torch.where(torch.isinf(mx), torch.zeros_like(mx), mx)
            p = torch.exp(s - mx)
            den = p.sum(-1, keepdim=True)
            oc = (p @ vs) / torch.where(den == 0, torch.ones_like(den), den)
            o[start + r0:start + r1] = oc.transpose(0, 1)
            lc = torch.where(den > 0, mx + torch.log(den), torch.full_like(den, float("-inf")))
            lse[:, start + r0:start + r1] = lc[..., 0]
        start += n
    return o, lse


def oracle_masks(torch: Any, mask: Any, lengths: Sequence[int],
                 per_seq: Sequence[dict[str, Any]], device: Any) -> list[MaskFn]:
    from cmc.oracle import dense

    fns: list[MaskFn] = []
    for n, ps in zip(lengths, per_seq, strict=True):
        vis = torch.from_numpy(dense(mask, n, ps)).to(device)
        fns.append(lambda r0, r1, vis=vis: vis[r0:r1])
    return fns


def causal_mask_fn(torch: Any, n: int, device: Any) -> MaskFn:
    """k <= q without an [L, L] matrix (the oracle's dense form is O(L^2) host memory)."""
    cols = torch.arange(n, device=device)

    def fn(r0: int, r1: int) -> Any:
        rows = torch.arange(r0, r1, device=device)[:, None]
        return cols[None, :] <= rows
    return fn


def compare(torch: Any, o: Any, lse: Any | None, ref_o: Any, ref_lse: Any) -> float:
    """Relative error ||o - ref|| / ||ref||, after the hard rules: no NaN, rows with no visible
    key exactly 0 (and LSE -inf), LSE close where defined. Raises AssertionError."""
    assert not torch.isnan(o).any(), "NaN in the output (unwritten or broken rows)"
    empty = torch.isinf(ref_lse).transpose(0, 1)  # [T, Hq]
    if empty.any():
        assert (o[empty] == 0).all(), "a row with no visible key must be exactly 0"
    if lse is not None:
        assert not torch.isnan(lse).any(), "NaN in the LSE"
        lse64 = lse.double()
        assert torch.equal(torch.isinf(lse64) & (lse64 < 0), torch.isinf(ref_lse)), \
            "LSE must be -inf exactly on the rows with no visible key"
        fin = ~torch.isinf(ref_lse)
        if fin.any():
            err = (lse64[fin] - ref_lse[fin]).abs().max().item()
            assert err < 2e-2, f"LSE max abs error {err:.3g}"
    num = torch.linalg.vector_norm(o.double() - ref_o).item()
    den = torch.linalg.vector_norm(ref_o).item()
    if den == 0:
        return 0.0 if num == 0 else float("inf")
    return num / den
