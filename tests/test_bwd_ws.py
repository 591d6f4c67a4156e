"""The warp-specialised dK/dV kind (kernels.BWD_KV_SM90_WS, templates/cmc/attn_bwd_sm90_ws.cuh
kv_ws_entry): chosen with bwd_kernel "ws", and by the default "auto" on linear tilings;
built through the normal driver for a linear (causal) and a patch (clear) tiling without
local memory, listed in the manifest with its
three parameters and its Q / dO maps of 64-token boxes, accepted by `cmc inspect` and the
runtime's reader, launched by the runtime with those maps (fake driver), and launchable from
C through NAME.h. Its GPU check is tests/gpu (the "ws" and "auto" choices): passed on the H200,
2026-12-05 (every sample and CLEAR's patch tiling; memcheck clean on the samples)."""

from __future__ import annotations

import ctypes
import json
import subprocess
from pathlib import Path

import pytest

from cmc.abi import kernel_param_bytes, param_bytes, tensor_maps_offset
from cmc.driver import Options, back, front
from cmc.kernels import BWD_KERNELS, KernelKind, TileShape, backward_kinds, spec

ROOT = Path(__file__).resolve().parent.parent
WS = spec(KernelKind.BWD_KV_SM90_WS)
HEADER = ROOT / "templates" / "cmc" / "attn_bwd_sm90.cuh"


def test_ws_choice_swaps_the_kv_kind_on_sm90a_only():
    assert "ws" in BWD_KERNELS
    got = {(k, a) for k, archs in backward_kinds(("sm_80", "sm_90a"), "ws") for a in archs}
    assert got == {(KernelKind.BWD_PRE, "sm_80"), (KernelKind.BWD_PRE, "sm_90a"),
                   (KernelKind.BWD_KV, "sm_80"), (KernelKind.BWD_KV_SM90_WS, "sm_90a"),
                   (KernelKind.BWD_DQ, "sm_80"), (KernelKind.BWD_DQ_SM90, "sm_90a"),
                   (KernelKind.BWD_POST, "sm_80"), (KernelKind.BWD_POST, "sm_90a")}
    for choice in ("lockstep", "portable"):
        assert all(k is not KernelKind.BWD_KV_SM90_WS
                   for k, _ in backward_kinds(("sm_90a",), choice))


def test_ws_spec():
    assert (WS.role, WS.archs, WS.params, WS.tensor_maps, WS.map_box_cap, WS.choices) == (
        "kv", ("sm_90a",), ("desc", "maps", "bwd_args"), ("q", "do", "dq_accum"), 64, ("ws",))
    assert WS.threads == {64: 384, 128: 384}
    assert "enum : int { kThreadsWS = 128 * (kWG + 1) };" in HEADER.read_text()
    assert WS.grid_rule(TileShape("linear"), WS.block_m) == ["ceil_div(max_len, 128)",
                                                            "heads_kv", "batch"]
    # bwd_ablate's ws growth over the shipped kind (the same SmemWS layout, macro on)
    from .test_tools import _tool

    growth = _tool("bwd_ablate").WS_SMEM_GROWTH
    kv = spec(KernelKind.BWD_KV_SM90)
    for hd in (64, 128):
        assert WS.smem(hd, 10) == kv.smem(hd, 10) + growth


def test_param_block_is_desc_maps_then_args():
    """The maps at tensor_maps_offset (64-byte aligned in constant bank 0), cmc_bwd_args 8-byte
    aligned after them (the builds below check the total against each cubin)."""
    for size in (152, 160, 168, 176):
        assert param_bytes(size, 3, True) == tensor_maps_offset(size) + 384 + 120
        assert kernel_param_bytes(size, "bwd_kv_sm90_ws") == param_bytes(size, 3, True)
    assert param_bytes(152, 0, True) == 152 + 120 and param_bytes(152, 3) == 176 + 384


def test_ws_source_passes_the_maps():
    src = back(front(ROOT / "samples" / "causal.mask"),
               Options(archs=("sm_90a",), dtypes=("bf16",), head_dims=(64,), bwd_kernel="ws"))
    (v,) = [v for v in src.variants if v.kernel is KernelKind.BWD_KV_SM90_WS]
    assert v.symbol == "cmc_causal_bwd_kv_sm90ws_bf16_d64" and v.threads == 384
    block = src.text.split(f"#if defined({v.define})\n")[1].split("#endif")[0]
    assert ("(const __grid_constant__ cmc_causal_desc desc, const __grid_constant__ "
            "cmc_bwd_sm90::KvMaps maps, const __grid_constant__ cmc_bwd_args args)") in block
    assert "cmc_bwd_sm90::kv_ws_entry<cmc_hooks_b, cmc_hooks_t, true, 64>(desc, maps, args)" in block
    assert "__launch_bounds__(cmc_bwd_sm90::kThreadsWS, 1)" in block
    assert not any(x.kernel is KernelKind.BWD_KV_SM90 for x in src.variants)


# --------------------------------------------------------------------------- real builds


@pytest.fixture(scope="module")
def ws_artifacts(tmp_path_factory) -> dict[str, Path]:
    """causal (linear) and clear (patch tiling) with bwd_kernel "ws", bf16, D 64 and 128."""
    pytest.importorskip("cuda.bindings.nvrtc")
    from cmc.driver import compile_file

    out = tmp_path_factory.mktemp("ws")
    return {name: compile_file(ROOT / "samples" / f"{name}.mask", out, archs=["sm_90a"],
                               dtypes=["bf16"], head_dims=[64, 128], bwd_kernel="ws", jobs=2)
            for name in ("causal", "clear")}


@pytest.mark.parametrize("name,tiling,rows", [("causal", "linear", 64), ("clear", "patch", 16)])
def test_ws_builds_without_local_memory_and_is_in_the_manifest(ws_artifacts, name, tiling, rows):
    """The ws kv's maps have boxes of the tiling's box rows capped at one 64-row item: 64
    tokens on a linear tiling, one patch row (CLEAR's 8 x 16 patches: 16) on a patch tiling."""
    from cmc.inspection import inspect
    from cmc.runtime.manifest import read_manifest

    art = ws_artifacts[name]
    m = json.loads((art / "manifest.json").read_text())
    ws = [k for k in m["kernels"] if k["kernel"] == "bwd_kv_sm90_ws" and not k["below_len"]]
    assert sorted(k["head_dim"] for k in ws) == [64, 128]
    assert not any(k["kernel"] == "bwd_kv_sm90" for k in m["kernels"])
    for k in ws:
        assert (art / k["file"]).is_file()
        assert k["file"] == f"{name}.sm_90a.bwd_kv_sm90ws_bf16_d{k['head_dim']}.cubin"
        assert (k["role"], k["params"], k["threads"]) == ("kv", ["desc", "maps", "bwd_args"], 384)
        assert k["tensor_maps"] == [{"tensor": "q", "box": [64, 1, rows], "swizzle": "128B"},
                                    {"tensor": "do", "box": [64, 1, rows], "swizzle": "128B"},
                                    {"tensor": "dq_accum", "box": [32, 1, rows], "swizzle": "128B"}]
        assert k["tiling"]["kind"] == tiling
        assert (k["local_bytes"], k["spill_stores"], k["spill_loads"]) == (0, 0, 0), k["symbol"]
        assert k["registers"] <= 168  # 384 x 168 at launch: setmaxnreg's 24 / 240 split fits
    assert inspect(art).kernels
    entries = [e for e in read_manifest(art).kernels if e.symbol in {k["symbol"] for k in ws}]
    assert all(e.tensor_maps == ("q", "do", "dq_accum") and e.box_rows == (rows,) * 3
               for e in entries)
    assert all(e.params == ("desc", "maps", "bwd_args") for e in entries)


def test_short_sequences_get_the_kinds_on_linear_tiles(ws_artifacts, monkeypatch):
    """clear's patch tiling starts at 2,560 tokens: its kv and dq are built again on linear
    tiles (one 64-row box per item, no spills), and the runtime launches those exactly when
    max_len is below that; pre and post have no such kernel (they follow no tiling)."""
    from cmc.runtime import loader

    from .test_runtime_cpu import FakeGPU

    m = json.loads((ws_artifacts["clear"] / "manifest.json").read_text())
    main = {(k["role"], k["head_dim"]): k for k in m["kernels"] if not k["below_len"]}
    short = [k for k in m["kernels"] if k["below_len"]]
    assert sorted((k["role"], k["head_dim"]) for k in short) == sorted(
        (r, hd) for r in ("fwd", "kv", "dq") for hd in (64, 128))
    for k in short:
        mine = main[(k["role"], k["head_dim"])]
        assert k["below_len"] == mine["tiling"]["min_len"] == 2560
        assert k["symbol"] == mine["symbol"] + "_short" and k["file"].endswith("_short.cubin")
        assert k["tiling"]["kind"] == "linear" and mine["tiling"]["kind"] == "patch"
        assert k["max_len"] is None and "max_len - " not in k["grid"][0]  # no grid origin
        assert (k["local_bytes"], k["spill_stores"], k["spill_loads"]) == (0, 0, 0), k["symbol"]
        if k["role"] == "kv":
            assert [t["box"][2] for t in k["tensor_maps"]] == [64, 64, 64]
    FakeGPU(monkeypatch)
    dk = loader.load(ws_artifacts["clear"])._kernels(0)
    for max_len, suffix in ((1, "_short"), (2559, "_short"), (2560, ""), (9000, "")):
        roles = dk.backward_roles("bf16", 128, max_len)
        assert {r: e.entry.symbol for r, e in roles.items()} == {
            r: f"cmc_clear_bwd_{r}_bf16_d128" if r in ("pre", "post") else
            main[(r, 128)]["symbol"] + suffix for r in ("pre", "kv", "dq", "post")}
        assert dk.forward("bf16", 128, max_len).entry.symbol == \
            main[("fwd", 128)]["symbol"] + suffix


@pytest.mark.parametrize("lang", ["c", "c++"])
def test_ws_header_compiles_and_describes_the_do_and_dq_accum_maps(ws_artifacts, tmp_path, lang):
    from cmc.build import cuda_include_dir

    from .test_header import CC, CXX, compile_

    if not (CC and CXX):
        pytest.skip("needs gcc and g++")
    art = ws_artifacts["clear"]
    h = art / "clear.h"
    text = h.read_text()
    tag = "BWD_KV_SM90WS_BF16_D128"
    for line in (f"#define CMC_CLEAR_{tag}_TENSOR_MAPS 3", f"#define CMC_CLEAR_{tag}_BOX_ROWS 16u",
                 f"#define CMC_CLEAR_{tag}_TENSOR_MAP_0 0 ", f"#define CMC_CLEAR_{tag}_TENSOR_MAP_1 3 ",
                 f"#define CMC_CLEAR_{tag}_TENSOR_MAP_2 4 "):
        assert line in text, line
    for extra in ([], ["-DCMC_WITH_DRIVER_API", "-I", cuda_include_dir()]):
        r = compile_(lang, h, None, *extra)
        assert r.returncode == 0, r.stderr
    src = tmp_path / "probe.c"
    src.write_text("\n".join([
        '#include "clear.h"', "#include <stdio.h>", "#include <string.h>",
        "int main(void) {", "  cmc_clear_desc d; cmc_bwd_args b; cmc_clear_tensor_map_args a;",
        "  memset(&d, 0, sizeof d); memset(&b, 0, sizeof b);",
        "  d.q = 4096u; d.q_stride_tok = 512; d.q_stride_head = 128; d.heads_q = 4;",
        "  b.dout = 8192u; b.dout_stride_tok = 1024; b.dout_stride_head = 256; b.dq_accum = 65536u;",
        f"  cmc_clear_bwd_tensor_map_args_of(&d, &b, CMC_CLEAR_{tag}_TENSOR_MAP_1, 100u, 128u,",
        f"      CMC_CLEAR_{tag}_BOX_ROWS, &a);",
        '  printf("%llu %llu %llu %llu %llu %llu %u\\n", (unsigned long long)a.address,',
        "      (unsigned long long)a.dims[0], (unsigned long long)a.dims[1],",
        "      (unsigned long long)a.dims[2], (unsigned long long)a.strides[0],",
        "      (unsigned long long)a.strides[1], a.box[2]);",
        f"  cmc_clear_bwd_tensor_map_args_of(&d, &b, CMC_CLEAR_{tag}_TENSOR_MAP_0, 100u, 128u,",
        f"      CMC_CLEAR_{tag}_BOX_ROWS, &a);",
        '  printf("%llu %llu %u\\n", (unsigned long long)a.address, (unsigned long long)a.strides[1],',
        "      a.f32);",
        f"  cmc_clear_bwd_tensor_map_args_of(&d, &b, CMC_CLEAR_{tag}_TENSOR_MAP_2, 100u, 128u,",
        f"      CMC_CLEAR_{tag}_BOX_ROWS, &a);",
        '  printf("%llu %llu %llu %llu %llu %llu %u %u %u %u\\n", (unsigned long long)a.address,',
        "      (unsigned long long)a.dims[0], (unsigned long long)a.dims[1],",
        "      (unsigned long long)a.dims[2], (unsigned long long)a.strides[0],",
        "      (unsigned long long)a.strides[1], a.box[0], a.box[1], a.box[2], a.f32);",
        "  return 0;", "}"]) + "\n")
    exe = tmp_path / "probe"
    r = compile_(lang, src, exe, "-I", str(art))
    assert r.returncode == 0, r.stderr
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout
    # dO: its strides x 2 bytes; Q: the descriptor's; dq_accum: fp32 [100, 4, 128] contiguous;
    # boxes of one patch row of CLEAR's 8 x 16 patches, dq_accum's too
    assert out.split("\n")[:3] == ["8192 128 4 100 512 2048 16", "4096 1024 0",
                                   "65536 128 4 100 512 2048 32 1 16 1"]


# --------------------------------------------------------------------------- the runtime


def _to_ws(m: dict) -> None:
    for k in m["kernels"]:
        if k.get("role") == "kv":
            k.update({"symbol": "cmc_hstu_bwd_kv_sm90ws_fp16_d64",
                      "file": "hstu.sm_90a.bwd_kv_sm90ws_fp16_d64.cubin",
                      "block_m": WS.block_m, "block_n": WS.block_n, "threads": 384,
                      "block": [384, 1, 1],
                      "grid": WS.grid_rule(TileShape("linear"), WS.block_m),
                      "dynamic_smem": WS.smem(64, WS.plan_ints(3, None)),
                      "kernel": WS.kind.value, "params": ["desc", "maps", "bwd_args"],
                      "tensor_maps": [{"tensor": t, "box": [64, 1, 64], "swizzle": "128B"}
                                      for t in ("q", "do")]
                      + [{"tensor": "dq_accum", "box": [32, 1, 64], "swizzle": "128B"}]})


def _ws_artifact(tmp_path: Path) -> Path:
    """test_backward_cpu's hstu artifact (fp16, D 64) with its kv made the ws kind."""
    from .test_backward_cpu import write_bwd_artifact
    from .test_runtime_cpu import edit_manifest, finish_artifact

    d = write_bwd_artifact(tmp_path, variants=(("fp16", 64),))
    edit_manifest(d, _to_ws)
    finish_artifact(d)
    return d


def test_runtime_passes_the_q_do_and_dq_accum_maps(tmp_path, monkeypatch):
    """The kv launch gets (desc, maps, args): maps of q and dO (dO's pointer and strides),
    boxes of 64 tokens, and of the fp32 workspace dq_accum (boxes of 32 x 1 x 64), 64-byte
    aligned; args is cmc_bwd_args."""
    from cmc.runtime import loader

    from .test_backward_cpu import decode, packed_inputs, ptr
    from .test_runtime_cpu import FakeGPU

    gpu = FakeGPU(monkeypatch)
    attn = loader.load(_ws_artifact(tmp_path))
    spec_args = attn.manifest.backward.args
    calls = []

    def launch(f, gx, gy, gz, bx, by, bz, smem, stream, params, extra):
        n = 3 if "sm90ws" in str(f) else 2
        p = [ctypes.c_void_p.from_address(params + 8 * i).value for i in range(n)]
        rec = {"symbol": str(f), "grid": (gx, gy, gz), "block": (bx, by, bz), "smem": smem,
               "args": decode(spec_args, ctypes.string_at(p[-1], spec_args.size))}
        if n == 3:
            assert p[1] % 64 == 0
            rec["maps"] = [ctypes.string_at(p[1] + 128 * i, 128) for i in range(3)]
        calls.append(rec)
        return (0,)

    loader.cu.cuLaunchKernel = launch
    q, k, v, out, dout, lse = packed_inputs(gpu)
    attn.backward(dout, q, k, v, out, lse, cu_seqlens=[0, 5, 5, 135], n_targets=[2, 0, 64])
    kv = calls[1]
    assert kv["symbol"] == "cmc_hstu_bwd_kv_sm90ws_fp16_d64"
    assert kv["block"] == (384, 1, 1) and kv["grid"] == (2, 2, 3)
    assert kv["args"]["dout"] == ptr(dout)
    # q [135, 4, 64] and dO the same shape: byte strides (head 128, token 512), box 64 rows
    assert gpu.maps == [
        {"dtype": "fp16", "ptr": ptr(q), "dims": (64, 4, 135), "strides": (128, 512),
         "box": (64, 1, 64)},
        {"dtype": "fp16", "ptr": ptr(dout), "dims": (64, 4, 135), "strides": (128, 512),
         "box": (64, 1, 64)},
        {"dtype": "f32", "ptr": kv["args"]["dq_accum"], "dims": (64, 4, 135),
         "strides": (256, 1024), "box": (32, 1, 64)}]
    assert [m[:8] for m in kv["maps"]] == [ptr(q).to_bytes(8, "little"),
                                          ptr(dout).to_bytes(8, "little"),
                                          kv["args"]["dq_accum"].to_bytes(8, "little")]
    assert "maps" not in calls[0] and "maps" not in calls[2]


def test_runtime_names_dout_when_its_map_is_refused(tmp_path, monkeypatch):
    from cmc.errors import ParamError
    from cmc.runtime import _driver, loader

    from .test_backward_cpu import packed_inputs, ptr
    from .test_runtime_cpu import FakeGPU

    gpu = FakeGPU(monkeypatch)
    attn = loader.load(_ws_artifact(tmp_path))
    q, k, v, out, dout, lse = packed_inputs(gpu)
    real = _driver.tensor_map_3d

    def refuse_dout(dtype, p, dims, strides, box):
        if p == ptr(dout):
            raise _driver.DriverError("cuTensorMapEncodeTiled", "CUDA_ERROR_INVALID_VALUE")
        return real(dtype, p, dims, strides, box)

    monkeypatch.setattr(_driver, "tensor_map_3d", refuse_dout)
    with pytest.raises(ParamError, match=r"^dout: cannot be described by a TMA tensor map"):
        attn.backward(dout, q, k, v, out, lse, cu_seqlens=[0, 5, 5, 135], n_targets=[2, 0, 64])


def test_reader_takes_do_maps_for_backward_kernels_only(tmp_path):
    from cmc.errors import ArtifactError
    from cmc.runtime.manifest import read_manifest

    from .test_runtime_cpu import edit_manifest

    d = _ws_artifact(tmp_path)
    kv = [e for e in read_manifest(d).kernels if e.role == "kv"]
    assert [(e.tensor_maps, e.box_rows) for e in kv] == [(("q", "do", "dq_accum"), (64, 64, 64))]

    def do_in_forward(m):
        fwd = next(k for k in m["kernels"] if k["pass"] == "forward")
        fwd["tensor_maps"] = [{"tensor": "do", "box": [64, 1, 128], "swizzle": "128B"}]
        fwd["params"] = ["desc", "maps"]

    edit_manifest(d, do_in_forward)
    with pytest.raises(ArtifactError, match="do, dq_accum: backward kernels only"):
        read_manifest(d)

    def dq_accum_box(m):  # back to the ws kv, with a 16-bit box on dq_accum's map
        _to_ws(m)
        fwd = next(k for k in m["kernels"] if k["pass"] == "forward")
        fwd.pop("tensor_maps")
        fwd["params"] = ["desc"]
        kv = next(k for k in m["kernels"] if k.get("role") == "kv")
        kv["tensor_maps"][2]["box"] = [64, 1, 64]

    edit_manifest(d, dq_accum_box)
    with pytest.raises(ArtifactError, match=r"entry \{'tensor': 'dq_accum', 'box': \[64, 1, 64\]"):
        read_manifest(d)


def test_ws_patch_kv_of_a_many_term_grid_builds_without_local_memory():
    """The ws kv on 8x16 patches of a grid with many transposed terms (g_grid77_w96_r40's
    disc of radius 40, `--tiling 8x16`): kv_patch_ws recomputes the geometry and the key
    map after the plan builder instead of keeping them live across it; kept live, three
    values spilled 12 bytes (2026-12-06, kernel notes "The ws kv's patch tiling for the
    generality grids")."""
    pytest.importorskip("cuda.bindings.nvrtc")
    import dataclasses

    from cmc.build import build

    src = back(front(ROOT / "benchmarks" / "generality" / "grid_text.mask",
                     {"TEXT": 77, "W": 96, "R": 40}),
               Options(archs=("sm_90a",), dtypes=("bf16",), head_dims=(128,), tiling="8x16"))
    kv = tuple(v for v in src.variants
               if v.kernel is KernelKind.BWD_KV_SM90_WS and not v.below_len)
    assert kv and all(v.tiling.kind == "patch" for v in kv)
    built = build(dataclasses.replace(src, variants=kv), archs=("sm_90a",), jobs=1)
    for c in built.cubins:
        r = c.resources
        assert (r.local_bytes, r.spill_stores, r.spill_loads) == (0, 0, 0), (c.symbol, r)
