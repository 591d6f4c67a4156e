"""The backward's own tiling (cmc/tiling.py choose_backward_tiling, driver.backward_tile).

The backward's patch kinds take about 1.6 x the linear kinds' time per computed pair (H100,
2026-12-06, docs/kernel-notes.md "Run 18"), so a mask whose forward takes patches keeps them
for the backward only where they save more than that: CLEAR does (2.3 x fewer pairs), the
generality grids and natten_clamped do not (1.2-1.4 x) and get linear tiles with the tile
masks proved for them. Where the passes differ NAME.cu carries the forward table's hooks a
second time on the backward's tiling (cmc_hooks_b), the same code a --tiling linear build
gives cmc_hooks.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace

import pytest

from cmc.artifacts import KernelKind
from cmc.driver import Options, back, backward_tile, compile_file, front, tile
from cmc.ir import LINEAR
from cmc.kernels import SPECS, Pass
from cmc.tiling import BWD_PATCH_COST, MIN_GAIN, REF_ROWS, computed_pairs

from .conftest import ROOT

GEN = ROOT / "benchmarks" / "generality"
SM90 = Options(archs=("sm_90a",), dtypes=("bf16",), head_dims=(64,))


def _tilings(path, defines=None, **kw):
    table = front(path, defines)
    opts = replace(SM90, **kw)
    fwd = tile(table, opts)
    return table, fwd, backward_tile(table, fwd, opts)


@pytest.mark.parametrize("path,defines,bwd", [
    (ROOT / "samples" / "clear.mask", {"TEXT": 0}, "patch"),
    (ROOT / "samples" / "clear.mask", None, "patch"),
    (GEN / "grid_text.mask", {"TEXT": 77, "W": 96, "R": 40}, "linear"),
    (GEN / "grid_text.mask", {"TEXT": 333, "W": 80, "R": 24}, "linear"),
    (GEN / "natten_clamped.mask", None, "linear"),
])
def test_backward_keeps_patches_only_where_they_pay_their_cost(path, defines, bwd):
    """The choice is the count's: patches x BWD_PATCH_COST against linear tiles (10 % margin)
    at the forward's reference length, and the reason says so."""
    table, fwd, bt = _tilings(path, defines)
    assert fwd.kind == "patch" and bt is not None and bt.kind == bwd
    length = fwd.origin + fwd.width * REF_ROWS
    patch = computed_pairs(table, replace(fwd, min_len=0), length)  # as the forward counted
    lin = computed_pairs(table, LINEAR, length)
    assert re.search(rf"; {fwd.patch_rows}x{fwd.patch_cols} {patch}\b", fwd.reason)
    assert (patch * BWD_PATCH_COST <= (1 - MIN_GAIN) * lin) == (bwd == "patch")
    assert f"computed pairs at len {length}: linear {lin}, " in bt.reason
    assert f"{fwd.patch_rows}x{fwd.patch_cols} {patch} (x {BWD_PATCH_COST}" in bt.reason
    if bwd == "patch":
        assert replace(bt, reason="") == replace(fwd, reason="")
    else:
        # the tile masks a linear tiling gets (--tiling linear), not the patch tiling's
        asked = _tilings(path, defines, tiling="linear")[1]
        assert replace(bt, reason="") == replace(asked, reason="")
        assert bt.offset_masks is not None and bt.offset_masks.band is not None


def test_a_tiling_asked_for_is_both_passes_and_linear_masks_stay_one_choice():
    nat = GEN / "natten_clamped.mask"
    for asked in ("8x16", "16x8", "linear"):
        _, fwd, bt = _tilings(nat, tiling=asked)
        assert bt == fwd
    _, fwd, bt = _tilings(ROOT / "samples" / "causal.mask")
    assert fwd.kind == "linear" and bt == fwd
    table = front(nat)
    assert backward_tile(table, tile(table, SM90), replace(SM90, backward=False)) is None


def _struct(text: str, name: str) -> str:
    found = re.search(rf"struct {name} \{{.*?\n\}};", text, re.S)
    assert found is not None, name
    return found.group(0)


def test_source_carries_the_backward_hooks_where_the_tilings_differ():
    """natten_clamped: cmc_hooks_b is the forward table on linear tiles, token for token the
    cmc_hooks of a --tiling linear build (whose hooks the host tests check against the oracle)
    but for its names; its mask table is compiled into the deterministic dq only, and the
    forward's no longer; every backward kind reads cmc_hooks_b and follows its tiling (ws kv)."""
    table = front(GEN / "natten_clamped.mask")
    src = back(table, replace(SM90, dtypes=("bf16",), head_dims=(64, 128)))
    lin = back(table, replace(SM90, tiling="linear", head_dims=(64, 128)))
    mine = _struct(src.text, "cmc_hooks_b")
    theirs = _struct(lin.text, "cmc_hooks")
    assert "kTiling = 0" in mine and "kTiling = 1" in _struct(src.text, "cmc_hooks")
    renamed = (theirs.replace("struct cmc_hooks ", "struct cmc_hooks_b ")
               .replace("cmc_tab", "cmc_tabB").replace("CMC_FWD_MASKS", "CMC_BWD_MASKS")
               .replace("cmc_offset_mask_words;", "cmc_offset_mask_words_b;"))
    assert mine == renamed
    assert "typedef cmc_hooks cmc_hooks_b" not in src.text
    main = [v for v in src.variants if not v.below_len]  # the first set (the short one's after)
    dq = [v.define for v in main if v.kernel is KernelKind.BWD_DQ_SM90]
    fwd = [v.define for v in main if SPECS[v.kernel].pass_ is Pass.FORWARD]
    guard_b = src.text.split("#define CMC_BWD_MASKS 1")[0].rsplit("#if ", 1)[1].split("\n")[0]
    guard_f = src.text.split("#define CMC_FWD_MASKS 1")[0].rsplit("#if ", 1)[1].split("\n")[0]
    assert guard_b == " || ".join(["defined(CMC_HOST)", *(f"defined({d})" for d in dq)])
    assert guard_f == " || ".join(["defined(CMC_HOST)", *(f"defined({d})" for d in fwd)])
    for v in main:
        spec = SPECS[v.kernel]
        if spec.pass_ is Pass.BACKWARD:
            assert "cmc_hooks_b" in spec.entry and "cmc_hooks," not in spec.entry
            assert v.tiling.kind == "linear"
            assert ("x 1.6" in v.tiling.reason) == spec.tiled  # pre, post: always linear
        else:
            assert v.tiling.kind == "patch"
    # the forward alone has a start length, so it alone gets a kernel for short sequences
    short = [v for v in src.variants if v.below_len]
    assert {v.kernel for v in short} == {KernelKind.FWD_SM90} and len(short) == len(fwd)
    assert all(v.tiling.kind == "linear" and v.below_len == main[0].tiling.min_len > 0
               for v in short)
    assert {v.kernel for v in src.variants} >= {KernelKind.BWD_KV_SM90_WS}


def test_source_aliases_the_hooks_where_the_tilings_agree():
    src = back(front(ROOT / "samples" / "clear.mask"), SM90)
    assert "typedef cmc_hooks cmc_hooks_b;" in src.text and "struct cmc_hooks_b" not in src.text
    assert "cmc_tabB" not in src.text and "CMC_BWD_MASKS" not in src.text
    fwd_only = back(front(ROOT / "samples" / "clear.mask"), replace(SM90, backward=False))
    assert "cmc_hooks_b" not in fwd_only.text


def test_artifact_records_each_pass_tiling_and_builds_without_spills(tmp_path):
    """NVRTC builds natten_clamped's two hook structs: the forward on patches, the backward on
    linear tiles (grid rules, tensor-map boxes and reasons in the manifest), no local memory."""
    art = compile_file(GEN / "natten_clamped.mask", tmp_path, archs=["sm_90a"], dtypes=["bf16"],
                       head_dims=[64])
    manifest = json.loads((art / "manifest.json").read_text())
    by_kind = {k["kernel"]: k for k in manifest["kernels"] if not k["below_len"]}
    assert by_kind["sm90"]["tiling"]["kind"] == "patch"
    short = [k for k in manifest["kernels"] if k["below_len"]]
    assert [k["kernel"] for k in short] == ["sm90"] and short[0]["tiling"]["kind"] == "linear"
    assert short[0]["below_len"] == by_kind["sm90"]["tiling"]["min_len"]
    for kind in ("bwd_kv_sm90_ws", "bwd_dq_sm90"):
        k = by_kind[kind]
        assert k["tiling"]["kind"] == "linear" and "backward's patch kinds" in k["tiling"]["reason"]
        assert k["grid"][0] == "ceil_div(max_len, 128)" and k["max_len"] is None
    assert [t["box"][2] for t in by_kind["bwd_kv_sm90_ws"]["tensor_maps"]] == [64, 64, 64]
    for k in manifest["kernels"]:
        assert (k["local_bytes"], k["spill_stores"], k["spill_loads"]) == (0, 0, 0), k["symbol"]
    dq = (art / by_kind["bwd_dq_sm90"]["file"]).read_bytes()
    assert b"cmc_offset_mask_words_b" in dq and b"cmc_patch_mask_words" not in dq
    assert b"cmc_offset_mask_words_b" not in (art / by_kind["sm90"]["file"]).read_bytes()


def test_show_prints_the_backward_tiling_and_counts_its_pairs():
    from click.testing import CliRunner

    from cmc.cli import cli

    r = CliRunner().invoke(cli, ["show", str(GEN / "natten_clamped.mask"), "--len", "8192"])
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    i = lines.index("  sm90 backward tiling: linear (128-token tiles)")
    assert lines[i + 1].startswith("    reason: computed pairs at len 6144: linear 8486912, 8x16 ")
    assert "(128 keys x 64 queries)" in lines[i + 2]  # linear kv items
    r = CliRunner().invoke(cli, ["show", str(ROOT / "samples" / "clear.mask"), "--len", "4096"])
    assert "  sm90 backward tiling: the forward's (computed pairs at len 8704" in r.output
    assert "(128 keys x 128 queries)" in r.output
    r = CliRunner().invoke(cli, ["show", str(ROOT / "samples" / "clear.mask"), "--len", "4096",
                                 "--tiling", "8x16"])
    assert "  sm90 backward tiling: the forward's\n" in r.output
