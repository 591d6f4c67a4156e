"""The wheel works outside the repo: grammar, templates and schema ship as package data, and
`cmc compile` / `cmc inspect` run from a fresh environment in a directory far from the source.

Slow (a wheel build and a real NVRTC compile), but it runs in CI: the wheel is built with
`python -m build --wheel` from a copy of the tree (so the shared checkout gets no build/ or
egg-info), installed with --no-deps into a new venv whose dependencies are links to the current
environment's installed packages (cheap: no downloads beyond the isolated build backend).
"""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow
SHIPPED = ("cmc", "grammar", "templates", "schema", "pyproject.toml", "README.md")
DATA = (
    "cmc/grammar/mask.lark",
    "cmc/templates/header.h.j2",
    "cmc/schema/manifest.schema.json",
)


def run(args: list[str], cwd: Path, env: dict[str, str] | None = None, timeout: int = 300):
    r = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, f"{args}\nstdout:\n{r.stdout}\nstderr:\n{r.stderr}"
    return r


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    src = tmp_path_factory.mktemp("src")
    for name in SHIPPED:
        p = ROOT / name
        if p.is_dir():
            shutil.copytree(p, src / name, ignore=shutil.ignore_patterns("__pycache__"))
        elif p.exists():
            shutil.copy(p, src / name)
    dist = tmp_path_factory.mktemp("dist")
    run([sys.executable, "-m", "build", "--wheel", "--outdir", str(dist), str(src)], cwd=src)
    (whl,) = dist.glob("cmc-*.whl")
    return whl


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory) -> Path:
    env_dir = tmp_path_factory.mktemp("venv")
    run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)], cwd=env_dir)
    py = env_dir / "bin" / "python"
    run([sys.executable, "-m", "pip", "--python", str(py), "install", "-q", "--no-deps",
         "--no-index", str(wheel)], cwd=env_dir)
    purelib = run([str(py), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                  cwd=env_dir).stdout.strip()
    # Dependencies: link every package of this environment except cmc itself (and its
    # editable-install hooks), so libraries found by site-packages search (NVRTC's) are found.
    for sp in site.getsitepackages():
        for item in Path(sp).iterdir():
            skip = item.name.startswith(("cmc", "__editable__", "_distutils_hack", "distutils"))
            dst = Path(purelib) / item.name
            if not skip and item.suffix != ".pth" and not dst.exists():
                dst.symlink_to(item)
    return env_dir


def test_wheel_ships_the_data_files(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    for d in DATA:
        assert d in names, d
    assert not any(n.startswith(("tests/", "samples/")) for n in names)


def test_installed_cmc_compiles_outside_the_repo(venv, tmp_path):
    if not (ROOT / "cmc" / "emit.py").exists():
        pytest.skip("cmc/emit.py not written yet: `cmc compile` cannot run")
    work = tmp_path / "elsewhere"
    work.mkdir()
    shutil.copy(ROOT / "samples" / "causal.mask", work / "causal.mask")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["CMC_CACHE_DIR"] = str(tmp_path / "cache")
    py, cmc = str(venv / "bin" / "python"), str(venv / "bin" / "cmc")
    where = run([py, "-c", "import cmc; print(cmc.__file__)"], work, env).stdout.strip()
    assert where.startswith(str(venv)), where
    run([cmc, "compile", "causal.mask", "-o", "out", "--arch", "sm_90a", "--dtype", "bf16",
         "--head-dim", "64", "--no-backward"], work, env)
    dest = work / "out" / "causal"
    assert {p.name for p in dest.iterdir()} == {
        "manifest.json", "causal.cu", "causal.h", "causal.sm_90a.sm90_bf16_d64.cubin"}
    m = json.loads((dest / "manifest.json").read_text())
    assert m["mask"]["file"] == "causal.mask"
    assert [k["arch"] for k in m["kernels"]] == ["sm_90a"]
    out = run([cmc, "inspect", "out/causal"], work, env).stdout
    assert "all checks passed" in out and "cmc_causal_fwd_sm90_bf16_d64" in out
    check = subprocess.run([cmc, "compile", "causal.mask", "-o", "out", "--arch", "sm_90a",
                            "--dtype", "bf16", "--head-dim", "64", "--no-backward", "--check"],
                           cwd=work, env=env, capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
