"""The backward through the real pipeline (front -> back with backward on -> build -> package):
the emitted source, NVRTC builds without spills, and an artifact folder that inspect accepts.
NVRTC only, no GPU; the GPU check of the same cubins is tools/bwd_kernel_check.py."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from cmc.driver import Options, back, front
from cmc.kernels import Pass, spec

ROOT = Path(__file__).resolve().parent.parent
ROLES = ("pre", "kv", "dq", "post")


def test_backward_source_has_transposed_hooks_and_one_block_per_kind():
    opts = Options(archs=("sm_80", "sm_90a"), dtypes=("bf16",), head_dims=(64, 128),
                   bwd_kernel="portable")  # one kind per role on both archs
    src = back(front(ROOT / "samples" / "hstu.mask"), opts)
    fwd_only = back(front(ROOT / "samples" / "hstu.mask"), dataclasses.replace(opts, backward=False))
    assert src.transposed is not None and fwd_only.transposed is None
    assert "struct cmc_hooks_t" in src.text and "struct cmc_hooks_t" not in fwd_only.text
    assert "namespace cmc_bwd" in src.text and "cmc_bwd" not in fwd_only.text
    # the forward's text comes first, unchanged up to its hooks
    head = fwd_only.text.split("// ---- cmc hooks end")[0]
    assert src.text.startswith(head)
    bwd = [v for v in src.variants if spec(v.kernel).pass_ is Pass.BACKWARD]
    assert [spec(v.kernel).role for v in bwd] == list(ROLES) * 2
    for v in bwd:
        assert v.archs == ("sm_80", "sm_90a")
        block = src.text.split(f"#if defined({v.define})\n")[1].split("#endif")[0]
        assert f"{v.symbol}(const __grid_constant__ cmc_hstu_desc desc, " \
               "const __grid_constant__ cmc_bwd_args args)" in block
        assert f"== {v.threads}, \"threads\"" in block
        if v.smem_bytes:
            assert f"== {v.smem_bytes}, \"dynamic shared memory\"" in block
    # the transposed table of hstu: its family tables (if any) are cmc_tabT*, never cmc_tab*
    t_part = src.text.split("// ---- cmc transposed hooks begin")[1].split(
        "// ---- cmc transposed hooks end")[0]
    assert "cmc_tab0_" not in t_part


@pytest.mark.parametrize("name,params", [("causal", {}), ("hstu", {"n_targets": 5}),
                                         ("shared_prefix", {"prompt_len": 6, "responses": [9, 14]})])
def test_emitted_transposed_table_is_the_transpose(name, params):
    import numpy as np

    from cmc.oracle import dense

    src = back(front(ROOT / "samples" / f"{name}.mask"), Options(archs=("sm_80",)))
    assert src.transposed is not None
    assert np.array_equal(dense(src.transposed.mask, 21, params),
                          dense(src.table.mask, 21, params).T)


SM90_TAG = {"kv": "_sm90ws", "dq": "_sm90"}


def test_causal_backward_builds_without_spills_on_every_arch():
    """sm_80, sm_90a and sm_100a, the default kinds (on sm_90a the wgmma kv and dq; causal's
    linear tiling takes the warp-specialised kv); the backward variants only (the forward
    has its own tests)."""
    pytest.importorskip("cuda.bindings.nvrtc")
    from cmc.build import build

    archs = ("sm_80", "sm_90a", "sm_100a")
    src = back(front(ROOT / "samples" / "causal.mask"),
               Options(archs=archs, dtypes=("bf16",), head_dims=(128,)))
    bwd = tuple(v for v in src.variants if spec(v.kernel).pass_ is Pass.BACKWARD)
    built = build(dataclasses.replace(src, variants=bwd), archs=archs, jobs=2)
    assert {(c.arch, c.symbol) for c in built.cubins} == {
        (a, f"cmc_causal_bwd_{r}{SM90_TAG.get(r, '') if a == 'sm_90a' else ''}_bf16_d128")
        for a in archs for r in ROLES}
    for c in built.cubins:
        r = c.resources
        assert r.registers <= 255 and r.spill_stores == 0 and r.spill_loads == 0, (
            c.arch, c.symbol, r)


def test_hstu_artifacts_with_backward_pass_inspect(tmp_path):
    pytest.importorskip("cuda.bindings.nvrtc")
    from cmc.driver import compile_file
    from cmc.inspection import inspect

    art = compile_file(ROOT / "samples" / "hstu.mask", tmp_path, archs=["sm_80"],
                       dtypes=["fp16"], head_dims=[64])
    m = json.loads((art / "manifest.json").read_text())
    assert [(k["pass"], k["role"]) for k in m["kernels"]] == [
        ("forward", "fwd")] + [("backward", r) for r in ROLES]
    assert m["backward"]["transposed_table"]["exact"]
    r = inspect(art)
    assert len(r.kernels) == 5
    h = (art / "hstu.h").read_text()
    assert "CMC_HSTU_BWD_KV_FP16_D64_SYMBOL" in h and "cmc_hstu_launch_bwd_kv_fp16_d64" in h
