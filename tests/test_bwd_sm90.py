"""The sm_90a backward kinds: dK/dV (kernels.BWD_KV_SM90, templates/cmc/attn_bwd_sm90.cuh) and
the deterministic dQ (kernels.BWD_DQ_SM90, templates/cmc/attn_bwd_sm90_dq.cuh): chosen with
bwd_kernel "lockstep" (and the dq kind with "ws" and "auto", the default, which is "ws") on
sm_90a only and never with "portable", their specs against
the headers' constants, NVRTC builds without spills or wgmma pipeline notes (cmc.build raises
on C7515-C7520), and the runtime launching them by role with the manifest's grid, threads and
shared memory (fake driver). Their GPU check: tools/bwd_kernel_check.py --sm90 and tests/gpu
(passed on the H200, 2026-12-05)."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from cmc.driver import Options, back, front
from cmc.kernels import KernelKind, Pass, TileShape, backward_kinds, spec

ROOT = Path(__file__).resolve().parent.parent
SM90_KV = spec(KernelKind.BWD_KV_SM90)
SM90_DQ = spec(KernelKind.BWD_DQ_SM90)
SM90_KINDS = (KernelKind.BWD_KV_SM90, KernelKind.BWD_DQ_SM90)
HEADER = ROOT / "templates" / "cmc" / "attn_bwd_sm90.cuh"
DQ_HEADER = ROOT / "templates" / "cmc" / "attn_bwd_sm90_dq.cuh"


def _bwd(src):
    return [v for v in src.variants if spec(v.kernel).pass_ is Pass.BACKWARD]


def test_portable_backward_does_not_contain_the_sm90_kind():
    assert all(k not in SM90_KINDS for k, _ in backward_kinds(("sm_90a",), "portable"))
    src = back(front(ROOT / "samples" / "causal.mask"),
               Options(archs=("sm_90a", "sm_100a"), dtypes=("bf16",), head_dims=(128,),
                       bwd_kernel="portable"))
    assert [v.kernel for v in _bwd(src)] == [KernelKind.BWD_PRE, KernelKind.BWD_KV,
                                             KernelKind.BWD_DQ, KernelKind.BWD_POST]
    assert "cmc_bwd_sm90" not in src.text and "bwd_kv_sm90" not in src.text


def test_default_backward_is_the_sm90_kinds_on_sm90a():
    """The default (Options().bwd_kernel, "auto"): sm_90a gets the wgmma kinds (kv: the
    warp-specialised one), sm_100a the portable ones; pre and post are portable on both."""
    assert Options().bwd_kernel == "auto"
    got = {(k, a) for k, archs in backward_kinds(("sm_90a", "sm_100a")) for a in archs}
    assert got == {(KernelKind.BWD_PRE, "sm_90a"), (KernelKind.BWD_PRE, "sm_100a"),
                   (KernelKind.BWD_KV_SM90_WS, "sm_90a"), (KernelKind.BWD_KV, "sm_100a"),
                   (KernelKind.BWD_DQ_SM90, "sm_90a"), (KernelKind.BWD_DQ, "sm_100a"),
                   (KernelKind.BWD_POST, "sm_90a"), (KernelKind.BWD_POST, "sm_100a")}
    assert backward_kinds(("sm_90a",)) == backward_kinds(("sm_90a",), "ws")


@pytest.mark.parametrize("name", ["causal", "clear"])
def test_default_kv_is_the_ws_kind_on_either_tiling(name):
    """Through the driver: causal (linear tiles) and clear (the tile stage's patches) get the
    warp-specialised kv."""
    src = back(front(ROOT / "samples" / f"{name}.mask"),
               Options(archs=("sm_90a",), dtypes=("bf16",), head_dims=(128,)))
    assert [v.kernel.value for v in _bwd(src) if spec(v.kernel).role == "kv"] == [
        "bwd_kv_sm90_ws"] * (2 if name == "clear" else 1)  # clear: and for short sequences


def test_lockstep_choice_replaces_kv_and_dq_on_sm90a_only():
    opts = Options(archs=("sm_80", "sm_90a"), dtypes=("bf16",), head_dims=(64, 128),
                   bwd_kernel="lockstep")
    src = back(front(ROOT / "samples" / "hstu.mask"), opts)
    for role, portable, sm90 in (("kv", KernelKind.BWD_KV, KernelKind.BWD_KV_SM90),
                                 ("dq", KernelKind.BWD_DQ, KernelKind.BWD_DQ_SM90)):
        got = {(v.kernel, v.head_dim): v.archs for v in _bwd(src) if spec(v.kernel).role == role}
        assert got == {(portable, 64): ("sm_80",), (portable, 128): ("sm_80",),
                       (sm90, 64): ("sm_90a",), (sm90, 128): ("sm_90a",)}, role
    # pre and post stay portable on every arch
    assert all(v.archs == ("sm_80", "sm_90a") for v in _bwd(src)
               if spec(v.kernel).role in ("pre", "post"))
    # each header part once, in order: portable helpers, wgmma macros, kv (its helpers), the
    # warp-specialised kv experiment (compiled only with CMC_BWD_KV_WS), dq
    namespaces = src.text.split("namespace cmc_bwd_sm90 {")
    assert len(namespaces) == 4  # the kv part, the ws part and the dq part
    bwd_text = src.text[src.text.index("namespace cmc_bwd {"):]  # the forward's sm90 has its own
    assert bwd_text.count("#define CMC_WGMMA_MACROS") == 1
    assert (src.text.index("namespace cmc_bwd {") < src.text.index("CMC_DEV void kv(")
            < src.text.index("template <int D> struct DqCfg {"))
    for v in _bwd(src):
        if v.kernel is not KernelKind.BWD_KV_SM90:
            continue
        assert v.symbol == f"cmc_hstu_bwd_kv_sm90_bf16_d{v.head_dim}"
        assert (v.threads, v.block_m, v.block_n) == (256, 128, 64)
        block = src.text.split(f"#if defined({v.define})\n")[1].split("#endif")[0]
        assert f"cmc_bwd_sm90::Cfg<{v.head_dim}>::kThreadsKV == 256" in block
        assert (f"cmc_bwd_sm90::smem_kv<{v.head_dim}, cmc_hooks_b::kTerms, cmc_hooks_t::kTerms, "
                f"cmc_hooks_b::kTiling>() == {v.smem_bytes}") in block
        assert f"cmc_bwd_sm90::kv<cmc_hooks_b, cmc_hooks_t, true, {v.head_dim}>(desc, args)" in block
    for v in _bwd(src):
        if v.kernel is not KernelKind.BWD_DQ_SM90:
            continue
        assert v.symbol == f"cmc_hstu_bwd_dq_sm90_bf16_d{v.head_dim}"
        assert (v.threads, v.block_m, v.block_n) == (256, 128, 64)
        block = src.text.split(f"#if defined({v.define})\n")[1].split("#endif")[0]
        assert f"cmc_bwd_sm90::DqCfg<{v.head_dim}>::kThreads == 256" in block
        assert (f"cmc_bwd_sm90::smem_dq<{v.head_dim}, cmc_hooks_b::kTerms, cmc_hooks_b::kTiling>() "
                f"== {v.smem_bytes}") in block
        assert f"cmc_bwd_sm90::dq<cmc_hooks_b, true, {v.head_dim}>(desc, args)" in block
    # sm_90a not built: the choice changes nothing
    only80 = back(front(ROOT / "samples" / "hstu.mask"), dataclasses.replace(opts, archs=("sm_80",)))
    assert "cmc_bwd_sm90" not in only80.text


def test_spec_matches_the_header_constants():
    text = HEADER.read_text()

    def const(name: str) -> int:
        m = re.search(rf"\b{name} = (\d+)", text)
        assert m, name
        return int(m.group(1))

    assert SM90_KV.block_m == const("kBN") == 128  # keys per CTA: the grid's x
    assert SM90_KV.block_n == const("kBM") == 64  # query rows per item
    # (+ CMC_BWD_KV_WS: the experiment's producer warpgroup, 0 in every shipped build)
    assert "kThreadsKV = 128 * (kWG + CMC_BWD_KV_WS)" in text
    assert "#define CMC_BWD_KV_WS 0" in text and SM90_KV.threads == {64: 128 * const("kWG"),
                                                                   128: 128 * const("kWG")}
    assert SM90_KV.grid_rule(TileShape("linear"), SM90_KV.block_m) == ["ceil_div(max_len, 128)",
                                                            "heads_kv", "batch"]
    assert (SM90_KV.role, SM90_KV.params, SM90_KV.archs) == ("kv", ("desc", "bwd_args"),
                                                             ("sm_90a",))


def test_dq_spec_matches_the_header_constants():
    text = DQ_HEADER.read_text()

    def const(name: str) -> int:
        m = re.search(rf"\b{name} = (\d+)", text)
        assert m, name
        return int(m.group(1))

    kwg = int(re.search(r"\bkWG = (\d+)", HEADER.read_text()).group(1))
    assert SM90_DQ.block_m == const("kDqRows") == 128  # query rows per CTA: the grid's x
    assert SM90_DQ.block_n == const("kDqKeys") == 64  # keys per tile of the forward plan
    assert "kThreads = 128 * kWG" in text and SM90_DQ.threads == {64: 128 * kwg, 128: 128 * kwg}
    assert SM90_DQ.grid_rule(TileShape("linear"), SM90_DQ.block_m) == ["ceil_div(max_len, 128)",
                                                            "heads_q", "batch"]
    assert (SM90_DQ.role, SM90_DQ.params, SM90_DQ.archs, SM90_DQ.walks) == (
        "dq", ("desc", "bwd_args"), ("sm_90a",), "forward")
    # Q, dO [128 x D], K, V x2 [64 x D], the plan, the 1 KiB alignment pad (smem_dq<D, NT>)
    assert SM90_DQ.smem(128, SM90_DQ.plan_ints(1, None)) == (
        2 * 128 * 128 * 2 + 4 * 64 * 128 * 2 + (8 + 2) * 4 + 15) // 16 * 16 + 1024


def test_bad_bwd_kernel_is_refused():
    with pytest.raises(ValueError, match="backward kernel"):
        back(front(ROOT / "samples" / "causal.mask"), Options(bwd_kernel="fast"))


@pytest.mark.parametrize("choice,kv", [("lockstep", "sm90"), ("ws", "sm90ws"), ("auto", "sm90ws")])
def test_cli_bwd_kernel_option(tmp_path, choice, kv):
    """--bwd-kernel picks the kv kind on sm_90a ("ws", and "auto" on causal's linear tiles:
    the warp-specialised one); the dq role is bwd_dq_sm90 under all three."""
    from click.testing import CliRunner

    from cmc.cli import cli

    r = CliRunner().invoke(cli, ["compile", str(ROOT / "samples" / "causal.mask"), "-o",
                                 str(tmp_path), "--emit", "cu", "--arch", "sm_90a",
                                 "--bwd-kernel", choice])
    assert r.exit_code == 0, r.output
    cu = (tmp_path / "causal" / "causal.cu").read_text()
    assert f"cmc_causal_bwd_kv_{kv}_bf16_d128" in cu and "cmc_causal_bwd_dq_sm90_bf16_d128" in cu
    other = "sm90ws" if kv == "sm90" else "sm90"
    assert f"cmc_causal_bwd_kv_{other}_bf16_d128" not in cu
    r = CliRunner().invoke(cli, ["compile", str(ROOT / "samples" / "causal.mask"), "-o",
                                 str(tmp_path), "--emit", "cu", "--bwd-kernel", "fast"])
    assert r.exit_code == 2


@pytest.mark.parametrize("name,defines,dtype,head_dims", [
    ("causal", {}, "bf16", (64, 128)),
    ("clear", {}, "bf16", (128,)),  # a grid family: many (transposed) terms in the plans
    ("clear", {}, "fp16", (64,)),  # both kinds on the forward's patches (kv_patch, dq_patch)
    ("hstu", {}, "fp16", (64,)),  # per-sequence parameters in the hooks, the other dtype
    ("hstu", {}, "bf16", (128,)),  # kv spilled 8 bytes here before wg_index (2026-12-05)
])
def test_sm90_kinds_build_without_spills_or_wgmma_notes(name, defines, dtype, head_dims):
    """Through the real pipeline (emit with bwd_kernel "lockstep", cmc.build): a wgmma pipeline
    note (C7515-C7520) would be a BuildError; no spills, no local memory; both kinds' launch
    bounds are 256 threads (at most 255 registers)."""
    pytest.importorskip("cuda.bindings.nvrtc")
    from cmc.build import build

    src = back(front(ROOT / "samples" / f"{name}.mask", defines),
               Options(archs=("sm_90a",), dtypes=(dtype,), head_dims=head_dims,
                       bwd_kernel="lockstep"))
    mine = tuple(v for v in src.variants if v.kernel in SM90_KINDS)
    main = [v for v in mine if not v.below_len]
    assert sorted((v.kernel.value, v.head_dim) for v in main) == sorted(
        (k.value, hd) for k in SM90_KINDS for hd in head_dims)
    # clear's tile stage picks patches: both kinds follow them (kv_patch, dq_patch), and are
    # built again on linear tiles for sequences below the patches' start length
    assert all(v.tiling.kind == ("patch" if name == "clear" else "linear") for v in main)
    assert sorted((v.kernel, v.head_dim) for v in mine if v.below_len) == (
        sorted((v.kernel, v.head_dim) for v in main) if name == "clear" else [])
    built = build(dataclasses.replace(src, variants=mine), archs=("sm_90a",), jobs=2)
    assert {c.symbol for c in built.cubins} == {v.symbol for v in mine}
    for c in built.cubins:
        r = c.resources
        assert r.registers <= 255 and r.spill_stores == 0 and r.spill_loads == 0, (c.symbol, r)
        assert r.local_bytes == 0, (c.symbol, r)


def test_runtime_launches_the_kv_role_by_the_manifest(tmp_path, monkeypatch):
    """A backward section whose kv kernel is the sm90 kind: the runtime takes it by role and
    launches it on its own grid (128-key tiles), 256 threads and dynamic shared memory."""
    from cmc.runtime import loader

    from .test_backward_cpu import Recorder, packed_inputs, write_bwd_artifact
    from .test_runtime_cpu import FakeGPU, edit_manifest, finish_artifact

    gpu = FakeGPU(monkeypatch)
    d = write_bwd_artifact(tmp_path, variants=(("fp16", 64),))
    smem = SM90_KV.smem(64, SM90_KV.plan_ints(3, None))

    def to_sm90(m):
        for k in m["kernels"]:
            if k.get("role") == "kv":
                fname = "hstu.sm_90a.bwd_kv_sm90_fp16_d64.cubin"
                k.update({"symbol": "cmc_hstu_bwd_kv_sm90_fp16_d64", "file": fname,
                          "block_m": SM90_KV.block_m, "block_n": SM90_KV.block_n,
                          "threads": 256, "block": [256, 1, 1],
                          "grid": SM90_KV.grid_rule(TileShape("linear"), SM90_KV.block_m),
                          "dynamic_smem": smem, "kernel": SM90_KV.kind.value})

    edit_manifest(d, to_sm90)
    finish_artifact(d)  # its cubin and header macros, as a build writes them
    attn = loader.load(d)
    rec = Recorder(gpu, attn)
    q, k, v, out, dout, lse = packed_inputs(gpu)
    attn.backward(dout, q, k, v, out, lse, cu_seqlens=[0, 5, 5, 135], n_targets=[2, 0, 64])
    kv = rec.calls[1]
    assert kv["symbol"] == "cmc_hstu_bwd_kv_sm90_fp16_d64"
    assert kv["grid"] == (2, 2, 3)  # ceil(130 / 128) key tiles, heads_kv, batch
    assert kv["block"] == (256, 1, 1) and kv["smem"] == smem
    assert [c["grid"] for c in rec.calls] == [(3, 4, 3), (2, 2, 3), (3, 4, 3)]


def test_runtime_launches_the_dq_role_by_the_manifest(tmp_path, monkeypatch):
    """A backward section whose dq kernel is the sm90 kind: the deterministic sequence takes it
    by role and launches it on its own grid (128-row query tiles, heads_q), 256 threads and
    dynamic shared memory; the atomic sequence does not launch it."""
    from cmc.runtime import loader

    from .test_backward_cpu import Recorder, packed_inputs, write_bwd_artifact
    from .test_runtime_cpu import FakeGPU, edit_manifest, finish_artifact

    gpu = FakeGPU(monkeypatch)
    d = write_bwd_artifact(tmp_path, variants=(("fp16", 64),))
    smem = SM90_DQ.smem(64, SM90_DQ.plan_ints(3, None))

    def to_sm90(m):
        for k in m["kernels"]:
            if k.get("role") == "dq":
                fname = "hstu.sm_90a.bwd_dq_sm90_fp16_d64.cubin"
                k.update({"symbol": "cmc_hstu_bwd_dq_sm90_fp16_d64", "file": fname,
                          "block_m": SM90_DQ.block_m, "block_n": SM90_DQ.block_n,
                          "threads": 256, "block": [256, 1, 1],
                          "grid": SM90_DQ.grid_rule(TileShape("linear"), SM90_DQ.block_m),
                          "dynamic_smem": smem, "kernel": SM90_DQ.kind.value})

    edit_manifest(d, to_sm90)
    finish_artifact(d)
    attn = loader.load(d)
    rec = Recorder(gpu, attn)
    q, k, v, out, dout, lse = packed_inputs(gpu)
    kw = {"cu_seqlens": [0, 5, 5, 135], "n_targets": [2, 0, 64]}
    attn.backward(dout, q, k, v, out, lse, deterministic=True, **kw)
    dq = rec.calls[2]
    assert dq["symbol"] == "cmc_hstu_bwd_dq_sm90_fp16_d64"
    assert dq["grid"] == (2, 4, 3)  # ceil(130 / 128) query tiles, heads_q, batch
    assert dq["block"] == (256, 1, 1) and dq["smem"] == smem
    assert [c["grid"] for c in rec.calls] == [(3, 4, 3), (3, 2, 3), (2, 4, 3)]
    n = len(rec.calls)
    attn.backward(dout, q, k, v, out, lse, **kw)
    assert [c["symbol"] for c in rec.calls[n:]] == ["cmc_hstu_bwd_pre_fp16_d64",
                                                    "cmc_hstu_bwd_kv_fp16_d64",
                                                    "cmc_hstu_bwd_post_fp16_d64"]


def test_artifact_with_the_sm90_kind_passes_inspect(tmp_path):
    """sm_80 + sm_90a: the kv role is bwd_kv on sm_80 and bwd_kv_sm90 on sm_90a; the
    manifest, header and cubins pass `cmc inspect` with nothing new in them."""
    pytest.importorskip("cuda.bindings.nvrtc")
    import json

    from cmc.driver import compile_file
    from cmc.inspection import inspect

    art = compile_file(ROOT / "samples" / "causal.mask", tmp_path, archs=["sm_80", "sm_90a"],
                       dtypes=["bf16"], head_dims=[64], bwd_kernel="lockstep")
    m = json.loads((art / "manifest.json").read_text())
    kv = {k["arch"]: k for k in m["kernels"] if k["role"] == "kv"}
    assert kv["sm_80"]["kernel"] == "bwd_kv" and kv["sm_90a"]["kernel"] == "bwd_kv_sm90"
    k90 = kv["sm_90a"]
    assert k90["file"] == "causal.sm_90a.bwd_kv_sm90_bf16_d64.cubin"
    assert (k90["threads"], k90["block_m"], k90["grid"][0]) == (256, 128, "ceil_div(max_len, 128)")
    assert k90["spill_stores"] == 0 and k90["spill_loads"] == 0
    dq = {k["arch"]: k for k in m["kernels"] if k["role"] == "dq"}
    assert dq["sm_80"]["kernel"] == "bwd_dq" and dq["sm_90a"]["kernel"] == "bwd_dq_sm90"
    d90 = dq["sm_90a"]
    assert d90["file"] == "causal.sm_90a.bwd_dq_sm90_bf16_d64.cubin"
    assert (d90["threads"], d90["block_m"], d90["grid"]) == (
        256, 128, ["ceil_div(max_len, 128)", "heads_q", "batch"])
    assert d90["spill_stores"] == 0 and d90["spill_loads"] == 0
    assert len(inspect(art).kernels) == 10
    h = (art / "causal.h").read_text()
    assert "CMC_CAUSAL_SM_90A_BWD_KV_SM90_BF16_D64_CUBIN" in h
    assert "CMC_CAUSAL_SM_90A_BWD_DQ_SM90_BF16_D64_CUBIN" in h
