"""Shared by the GPU tier: device detection through the driver API (not torch) and one build
of every sample per session. Parameters, the float64 reference and the comparisons are in
harness.py, which tools import too."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

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
_built: dict[tuple[str, str], Path] = {}


# The tier's builds: name -> (subfolder, --bwd-kernel, --dq-layout); "auto" is the default
# build. tools/gpu_artifacts.py builds them into the same folders, the samples' and the
# generality masks' (test_generality_gpu.gen_artifact) alike.
BUILDS = {
    "auto": ("", "auto", "auto"),
    "portable": ("bwd_portable", "portable", "token"),
    "ws": ("bwd_ws", "ws", "token"),
    "lockstep": ("bwd_lockstep", "lockstep", "token"),
    "token": ("dq_token", "auto", "token"),
    "portable_block64": ("bwd_portable_block64", "portable", "block64"),
}


@functools.cache
def block64_allowed(name: str) -> bool:
    """Whether the default sm_90a build of samples/NAME.mask holds dq_accum in 64-row blocks
    (`--dq-layout auto` takes them on a linear backward tiling), as the pipeline decides it."""
    from cmc.driver import Options, back, front

    return back(front(ROOT / "samples" / f"{name}.mask"),
                Options(archs=("sm_90a",), dtypes=("bf16",), head_dims=(64,))).dq_layout == "block64"


def artifact(name: str, bwd_kernel: str = "auto") -> Path:
    """OUT/NAME for samples/NAME.mask, built once per session for this GPU's arch, for every
    dtype and head dim, through the project's own pipeline (or taken from the folder named by
    CMC_GPU_ARTIFACTS, when the GPU machine cannot run NVRTC). bwd_kernel "auto" (the default
    build: the sm_90a dK/dV and dQ kinds there, dq_accum in 64-row blocks where the tiling is
    linear) in OUT/NAME, "portable" in OUT/bwd_portable/NAME, "ws" in OUT/bwd_ws/NAME,
    "lockstep" in OUT/bwd_lockstep/NAME (all three token-major; prebuilt:
    tools/gpu_artifacts.py); "token": the default kinds with `--dq-layout token` in
    OUT/dq_token/NAME; "portable_block64": the portable build with `--dq-layout block64` in
    OUT/bwd_portable_block64/NAME (samples on linear backward tilings only)."""
    global _out_dir
    prebuilt = os.environ.get("CMC_GPU_ARTIFACTS")
    sub, kind, layout = BUILDS[bwd_kernel]
    if prebuilt:  # built elsewhere, e.g. `cmc compile samples/*.mask -o out/gpu --arch sm_90a`
        path = Path(prebuilt) / sub / name
        if not (path / "manifest.json").is_file():
            pytest.fail(f"CMC_GPU_ARTIFACTS={prebuilt} has no {name}/manifest.json")
        return path
    from cmc.driver import compile_file

    with _lock:
        if (name, bwd_kernel) not in _built:
            if _out_dir is None:
                _out_dir = Path(tempfile.mkdtemp(prefix="cmc-gpu-"))
            _built[(name, bwd_kernel)] = Path(compile_file(
                ROOT / "samples" / f"{name}.mask", _out_dir / sub, archs=[device_arch()],
                dtypes=list(DTYPES), head_dims=list(HEAD_DIMS), jobs=min(8, os.cpu_count() or 1),
                bwd_kernel=kind, dq_layout=layout))
        return _built[(name, bwd_kernel)]


def mask_of(name: str) -> Any:
    from cmc.driver import load_mask

    return load_mask(ROOT / "samples" / f"{name}.mask")


def cuda_torch() -> Any:
    """torch with CUDA and TF32 matmuls off (the float64 references' inputs stay exact), or
    skip the module."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA")
    torch.backends.cuda.matmul.allow_tf32 = False
    return torch


def sanitizer() -> str | None:
    found = shutil.which("compute-sanitizer")
    if found:
        return found
    for base in (os.environ.get("CUDA_HOME", ""), "/usr/local/cuda"):
        p = Path(base) / "bin" / "compute-sanitizer"
        if base and p.is_file():
            return str(p)
    return None


def run_memcheck(script: str, folder: Path) -> subprocess.CompletedProcess[str]:
    """compute-sanitizer memcheck of `script` (written into folder) over every sample's
    artifact, in one process: argv[1] is ROOT, then NAME=PATH per sample. Skips without
    compute-sanitizer."""
    tool = sanitizer()
    if tool is None:
        pytest.skip("compute-sanitizer not found (PATH, $CUDA_HOME/bin, /usr/local/cuda/bin)")
    specs = [f"{p.stem}={artifact(p.stem)}" for p in SAMPLES]
    path = folder / "run.py"
    path.write_text(script)
    return subprocess.run([tool, "--tool", "memcheck", "--print-limit", "200", sys.executable,
                           str(path), str(ROOT), *specs], capture_output=True, text=True,
                          timeout=900, cwd=ROOT)
