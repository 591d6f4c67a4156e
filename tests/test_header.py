"""NAME.h compiles as C and C++ (with and without the driver-API helpers), its struct has the
manifest's offsets, and its grid function computes the manifest's grid rule."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from cmc.artifacts import BuiltKernels
from cmc.build import build, cuda_include_dir
from cmc.ir import Tiling
from cmc.package import package

from .handmade import BWD_VARIANTS, VARIANTS, emitted

CC, CXX = shutil.which("gcc"), shutil.which("g++")
pytestmark = pytest.mark.skipif(not (CC and CXX), reason="needs gcc and g++")
WARN = ["-Wall", "-Wextra", "-Werror", "-pedantic"]
LANGS = {"c": (CC, "-std=c11", "c"), "c++": (CXX, "-std=c++11", "c++")}
GRID_CASES = [(0, 1, 1), (1, 2, 3), (63, 16, 2), (64, 1, 1), (65, 8, 4), (1000, 1, 1),
              (32768, 16, 1)]
NUM_SMS = 132
# a persistent (sm90-kind) variant beside the two portable ones: its grid is the work-item
# count capped at the SM count
PERSISTENT = dataclasses.replace(VARIANTS[0], symbol="cmc_demo_fwd_sm90_bf16_d64",
                                 kernel="sm90", archs=("sm_90a",))
# and a patch-tiled one (the grid rule and the header then count grid patches)
PATCH = dataclasses.replace(VARIANTS[0], symbol="cmc_demo_fwd_sm90_fp16_d64", dtype="fp16",
                            block_m=128, kernel="sm90", archs=("sm_90a",),
                            tiling=Tiling("patch", 256, 96, 4, 32, "test"))


def _tag(k: dict) -> str:
    base = f"{k['dtype']}_d{k['head_dim']}"
    return base if k["kernel"] == "portable" else f"{k['kernel']}_{base}"


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    built: BuiltKernels = build(emitted(VARIANTS + (PERSISTENT, PATCH)), cache=False, jobs=2)
    return package(built, tmp_path_factory.mktemp("out"), "demo.mask")


@pytest.fixture(scope="module")
def manifest(folder) -> dict:
    return json.loads((folder / "manifest.json").read_text())


def compile_(lang: str, src: Path, out: Path | None, *extra: str) -> subprocess.CompletedProcess:
    cc, std, x = LANGS[lang]
    args = [cc, std, *WARN, "-x", x, str(src), *extra]
    args += ["-o", str(out)] if out else ["-fsyntax-only"]
    return subprocess.run(args, capture_output=True, text=True)


def probe_program(manifest: dict) -> str:
    """A C program printing sizeof, every offsetof, and the grid of each variant."""
    s = manifest["descriptor"]["struct"]
    lines = ['#include "demo.h"', "#include <stdio.h>", "#include <string.h>",
             "int main(void) {", f"  {s} d;", "  unsigned g[3];",
             f'  printf("size %u\\n", (unsigned)sizeof({s}));']
    for f in manifest["descriptor"]["fields"]:
        lines.append(f'  printf("{f["name"]} %u\\n", (unsigned)offsetof({s}, {f["name"]}));')
    tags = sorted({_tag(k) for k in manifest["kernels"]})
    for max_len, heads, batch in GRID_CASES:
        lines += ["  memset(&d, 0, sizeof d);",
                  f"  d.max_len = {max_len}; d.heads_q = {heads}; d.batch = {batch};"]
        for t in tags:
            lines += [f"  cmc_demo_grid_{t}(&d, {NUM_SMS}u, g);",
                      f'  printf("grid {t} {max_len} {heads} {batch} %u %u %u\\n", '
                      "g[0], g[1], g[2]);"]
    lines += ["  return 0;", "}"]
    return "\n".join(lines) + "\n"


def expected_grid(manifest: dict, tag: str, max_len: int, heads: int, batch: int) -> list[int]:
    k = next(k for k in manifest["kernels"] if _tag(k) == tag)
    env = {"ceil_div": lambda a, b: -(-a // b), "min": min, "max": max, "max_len": max_len,
           "heads_q": heads, "batch": batch, "max_ctas": NUM_SMS, "__builtins__": {}}
    return [eval(expr, env) for expr in k["grid"]]  # our own generated expressions


@pytest.mark.parametrize("lang", ["c", "c++"])
@pytest.mark.parametrize("driver_api", [False, True], ids=["plain", "driver_api"])
def test_header_compiles(folder, lang, driver_api):
    extra = ["-DCMC_WITH_DRIVER_API", "-I", cuda_include_dir()] if driver_api else []
    r = compile_(lang, folder / "demo.h", None, *extra)
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("lang", ["c", "c++"])
def test_offsets_and_grid_match_the_manifest(folder, manifest, tmp_path, lang):
    src = tmp_path / "probe.c"
    src.write_text(probe_program(manifest))
    exe = tmp_path / "probe"
    r = compile_(lang, src, exe, "-I", str(folder), "-DCMC_WITH_DRIVER_API", "-I",
                 cuda_include_dir())
    assert r.returncode == 0, r.stderr
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout
    got = {}
    grids = []
    for line in out.splitlines():
        parts = line.split()
        if parts[0] == "grid":
            grids.append((parts[1], *map(int, parts[2:])))
        else:
            got[parts[0]] = int(parts[1])
    d = manifest["descriptor"]
    assert got.pop("size") == d["size"]
    assert got == {f["name"]: f["offset"] for f in d["fields"]}
    assert len(grids) == len(GRID_CASES) * 4
    for tag, max_len, heads, batch, *g in grids:
        want = expected_grid(manifest, tag, max_len, heads, batch)
        if 0 in want:  # nothing to launch: the header reports it as a zero dimension
            assert 0 in g, (tag, max_len, g)
        else:
            assert g == want, (tag, max_len)
    persistent = {(m, h, b): g for t, m, h, b, *g in grids if t.startswith("sm90_")}
    assert persistent[(32768, 16, 1)] == [NUM_SMS, 1, 1]
    assert persistent[(65, 8, 4)] == [1 * 8 * 4, 1, 1]  # 2 query tiles of 64: one unit
    assert persistent[(63, 16, 2)] == [16 * 2, 1, 1]
    patch = {(m, h, b): g for t, m, h, b, *g in grids if t == "sm90_fp16_d64"}
    # 1000 tokens: 2 linear tiles, then 744 / 96 -> 8 grid rows = 2 patch rows of 3 patches
    assert PATCH.tiling.query_tiles(1000) == 2 + 2 * 3
    assert patch[(1, 2, 3)] == [2 * 3, 1, 1]
    assert patch[(1000, 1, 1)] == [(8 + 1) // 2, 1, 1]


def test_static_asserts_catch_a_wrong_layout(folder, tmp_path):
    text = (folder / "demo.h").read_text()
    bad = text.replace("max_len) == 140", "max_len) == 144")
    assert bad != text
    (tmp_path / "bad.h").write_text(bad)
    for lang in LANGS:
        r = compile_(lang, tmp_path / "bad.h", None)
        assert r.returncode != 0 and "max_len offset" in r.stderr


def test_header_names_every_cubin(folder, manifest):
    text = (folder / "demo.h").read_text()
    assert text.startswith("/* demo.h: generated by cmc")
    assert "#ifndef CMC_DEMO_H" in text and "#include <stdint.h>" in text
    for k in manifest["kernels"]:
        arch, tag = k["arch"].upper(), _tag(k).upper()
        assert f'#define CMC_DEMO_{arch}_{tag}_CUBIN "{k["file"]}"' in text
        assert f'#define CMC_DEMO_{arch}_{tag}_SYMBOL "{k["symbol"]}"' in text
        assert f"#define CMC_DEMO_{tag}_THREADS {k['threads']}u" in text
        assert f"#define CMC_DEMO_{tag}_PERSISTENT {int(k['kernel'] == 'sm90')}" in text
        assert f"#define CMC_DEMO_{tag}_DYNAMIC_SMEM {k['dynamic_smem']}u" in text
    assert "cuLaunchKernel" in text and "CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES" in text


# ------------------------------------------------------------------------------ backward


@pytest.fixture(scope="module")
def bwd_built() -> BuiltKernels:
    return build(emitted(VARIANTS + BWD_VARIANTS), archs=["sm_80"], cache=False, jobs=2)


@pytest.fixture(scope="module")
def bwd_folder(bwd_built, tmp_path_factory) -> Path:
    return package(bwd_built, tmp_path_factory.mktemp("bwd"), "demo.mask")


@pytest.fixture(scope="module", params=["token", "block64"])
def bwd_folder_layouts(request, bwd_built, tmp_path_factory) -> Path:
    """The backward folder packaged as each dq_accum layout (the header and the manifest
    follow the source's dq_layout; these cubins are the token build's, not launched here)."""
    src = dataclasses.replace(bwd_built.source, dq_layout=request.param)
    return package(dataclasses.replace(bwd_built, source=src),
                   tmp_path_factory.mktemp(f"bwd_{request.param}"), "demo.mask")


@pytest.mark.parametrize("lang", ["c", "c++"])
@pytest.mark.parametrize("driver_api", [False, True], ids=["plain", "driver_api"])
def test_backward_header_compiles(bwd_folder, lang, driver_api):
    extra = ["-DCMC_WITH_DRIVER_API", "-I", cuda_include_dir()] if driver_api else []
    r = compile_(lang, bwd_folder / "demo.h", None, *extra)
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("lang", ["c", "c++"])
def test_backward_args_grid_and_workspace_match_the_manifest(bwd_folder_layouts, tmp_path, lang):
    bwd_folder = bwd_folder_layouts
    m = json.loads((bwd_folder / "manifest.json").read_text())
    b = m["backward"]
    lines = ['#include "demo.h"', "#include <stdio.h>", "#include <string.h>",
             "int main(void) {", "  cmc_demo_desc d;", "  unsigned g[3];",
             "  uint64_t wa, wb;",
             '  printf("size %u\\n", (unsigned)sizeof(cmc_bwd_args));']
    for f in b["args"]["fields"]:
        lines.append(f'  printf("{f["name"]} %u\\n", (unsigned)offsetof(cmc_bwd_args, {f["name"]}));')
    bwd = [k for k in m["kernels"] if k["pass"] == "backward"]
    cases = [(0, 4, 2, 1), (1, 4, 2, 3), (130, 8, 2, 2), (4096, 16, 4, 1)]
    for max_len, hq, hkv, batch in cases:
        lines += ["  memset(&d, 0, sizeof d);",
                  f"  d.max_len = {max_len}; d.heads_q = {hq}; d.heads_kv = {hkv};"
                  f" d.batch = {batch};"]
        for k in bwd:
            t = _tag(k)
            lines += [f"  cmc_demo_grid_{t}(&d, g);",
                      f'  printf("grid {t} {max_len} {hq} {hkv} {batch} %u %u %u\\n", '
                      "g[0], g[1], g[2]);"]
    lines += ["  cmc_demo_bwd_workspace(1000u, 3u, 6u, 128u, &wa, &wb);",
              '  printf("ws %llu %llu\\n", (unsigned long long)wa, (unsigned long long)wb);',
              "  return 0;", "}"]
    src = tmp_path / "probe.c"
    src.write_text("\n".join(lines) + "\n")
    exe = tmp_path / "probe"
    r = compile_(lang, src, exe, "-I", str(bwd_folder))
    assert r.returncode == 0, r.stderr
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout
    got, grids = {}, 0
    for line in out.splitlines():
        p = line.split()
        if p[0] == "grid":
            tag, max_len, hq, hkv, batch, *g = p[1], *map(int, p[2:])
            k = next(k for k in bwd if _tag(k) == tag)
            env = {"ceil_div": lambda a, b: -(-a // b), "max_len": max_len, "heads_q": hq,
                   "heads_kv": hkv, "batch": batch, "__builtins__": {}}
            assert g == [eval(e, env) for e in k["grid"]], (tag, max_len)
            grids += 1
        elif p[0] == "ws":
            env = {"ceil_div": lambda a, b: -(-a // b), "T": 1000, "batch": 3, "heads_q": 6,
                   "head_dim": 128, "__builtins__": {}}
            assert [int(p[1]), int(p[2])] == [eval(b["workspace"][w]["bytes"], env)
                                              for w in ("dq_accum", "dsum")]
        else:
            got[p[0]] = int(p[1])
    assert grids == len(cases) * 4
    layout = b["workspace"]["dq_accum"]["layout"]
    assert f"#define CMC_DEMO_DQ_ACCUM_BLOCK64 {int(layout == 'block64')}" in (
        bwd_folder / "demo.h").read_text()
    assert got.pop("size") == b["args"]["size"] == 120
    assert got == {f["name"]: f["offset"] for f in b["args"]["fields"]}
    kv = next(k for k in bwd if k["role"] == "kv")
    assert kv["grid"][1] == "heads_kv"


def test_backward_static_asserts_catch_a_wrong_args_layout(bwd_folder, tmp_path):
    text = (bwd_folder / "demo.h").read_text()
    bad = text.replace("flags) == 116", "flags) == 112")
    assert bad != text
    (tmp_path / "bad.h").write_text(bad)
    r = compile_("c", tmp_path / "bad.h", None)
    assert r.returncode != 0 and "cmc_bwd_args.flags offset" in r.stderr


def test_forward_only_header_has_no_backward(folder):
    text = (folder / "demo.h").read_text()
    assert "cmc_bwd_args" not in text and "bwd_workspace" not in text
