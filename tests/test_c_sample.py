"""CI for samples/c: the C demo compiles and links (-Werror) against an emitted causal.h and
the CUDA headers of the pip wheel, without libcuda (it dlopens the driver at run time)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "samples" / "c" / "attn_demo.c"


def cuda_include() -> Path | None:
    try:
        import nvidia.cu13 as m

        for p in m.__path__:
            if (Path(p) / "include" / "cuda.h").is_file():
                return Path(p) / "include"
    except ImportError:
        pass
    for p in (os.environ.get("CUDA_HOME", ""), "/usr/local/cuda"):
        if p and (Path(p) / "include" / "cuda.h").is_file():
            return Path(p) / "include"
    return None


def compile_demo(header_dir: Path, out: Path) -> subprocess.CompletedProcess[str]:
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler")
    inc = cuda_include()
    if inc is None:
        pytest.skip("no cuda.h (nvidia-cuda-runtime wheel or CUDA_HOME)")
    return subprocess.run(
        [cc, "-O2", "-std=c11", "-Wall", "-Wextra", "-Werror", f"-I{inc}", f"-I{header_dir}",
         "-o", str(out), str(DEMO), "-ldl", "-lm"],
        capture_output=True, text=True, timeout=120)


def test_demo_builds_against_the_emitted_header(tmp_path):
    from cmc.driver import compile_file

    art = compile_file(ROOT / "samples" / "causal.mask", tmp_path, archs=["sm_90a"],
                       dtypes=["bf16"], head_dims=[128], backward=False)
    r = compile_demo(art, tmp_path / "attn_demo")
    assert r.returncode == 0, r.stderr
    nm = shutil.which("nm")
    if nm:  # no driver symbol is linked: every entry point comes from cuGetProcAddress
        syms = subprocess.run([nm, "-u", str(tmp_path / "attn_demo")], capture_output=True,
                              text=True).stdout
        linked = [ln.split()[-1] for ln in syms.splitlines() if ln.strip()]
        assert linked and not [s for s in linked if s.startswith("cu")], linked


def test_demo_fails_to_build_against_a_wrong_struct(tmp_path):
    """The demo really uses the header: a struct without the ABI's fields does not compile."""
    (tmp_path / "causal.h").write_text(
        "struct cmc_causal_desc { int x; };\ntypedef struct cmc_causal_desc cmc_causal_desc;\n")
    r = compile_demo(tmp_path, tmp_path / "attn_demo")
    assert r.returncode != 0


def test_demo_without_a_driver_exits_2(tmp_path):
    from cmc.driver import compile_file

    if Path("/dev/nvidiactl").exists():
        pytest.skip("a GPU driver is present (tests/gpu runs the demo)")
    art = compile_file(ROOT / "samples" / "causal.mask", tmp_path, archs=["sm_90a"],
                       dtypes=["bf16"], head_dims=[128], backward=False)
    r = compile_demo(art, tmp_path / "attn_demo")
    assert r.returncode == 0, r.stderr
    run = subprocess.run([str(tmp_path / "attn_demo"), str(art)], capture_output=True,
                         text=True, timeout=60)
    assert run.returncode == 2 and "libcuda" in run.stderr
