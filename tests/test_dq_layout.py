"""dq_accum's layouts (abi.DQ_LAYOUTS; `cmc compile --dq-layout`): "block64" (64-row blocks in
the sm90 accumulator order, attn_bwd_portable.cuh dq_acc_at) on linear backward tilings, else
"token", by default ("auto"). The source, the builds of every kind that touches dq_accum, the
manifest, the runtime's reader and its floor, the refusals and auto's choice. Its GPU checks:
bwd_ablate's `wsfrag` (the same macro) and the GPU tier (the default build, "token",
"portable-block64")."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from cmc.abi import DQ_LAYOUTS, dq_accum_bytes
from cmc.cli import cli
from cmc.driver import Options, back, front
from cmc.errors import ArtifactError
from cmc.kernels import KernelKind

ROOT = Path(__file__).resolve().parent.parent


def _dq_acc_at(q: int, c: int, tok0: int, b: int, heads_q: int, h: int, d: int) -> int:
    """attn_bwd_portable.cuh dq_acc_at with CMC_DQ_BLOCK64, in Python."""
    i, cc = q & 63, c & 63
    t = (i >> 4) * 32 + (i & 7) * 4 + ((cc & 7) >> 1)
    blk = ((tok0 + 64 * b) >> 6) + (q >> 6)
    return ((blk * heads_q + h) * 64 * d + (c >> 6) * 4096 * (d == 128)
            + ((cc >> 3) * 128 + t) * 4 + ((i >> 3) & 1) * 2 + (cc & 1))


@pytest.mark.parametrize("d", [64, 128])
def test_block64_is_a_bijection_inside_the_rule(d):
    """The layout as specified (dq_acc_at transcribed; the CUDA is checked on the GPU by
    bwd_ablate wsfrag --check and the tier's block64 cases): every (token, head, column) of a
    jagged batch gets its own float, inside abi.dq_accum_bytes, and a sequence's item of 64
    rows fills one contiguous 64 x 64 half per column half, what the ws kv's one bulk add
    needs."""
    lens, heads_q = [1, 17, 130, 600, 64], 3
    seen: set[int] = set()
    tok0 = 0
    for b, n in enumerate(lens):
        for q in range(n):
            for h in range(heads_q):
                for c in range(d):
                    seen.add(_dq_acc_at(q, c, tok0, b, heads_q, h, d))
        for j in range(-(-n // 64)):  # item j's floats: 64 rows x 64 columns per half
            for half in range(d // 64):
                offs = sorted(_dq_acc_at(64 * j + r, 64 * half + c, tok0, b, heads_q, 1, d)
                              for r in range(64) for c in range(64))
                assert offs == list(range(offs[0], offs[0] + 4096)) and offs[0] % 4096 == 0
        tok0 += n
    total = sum(lens) * heads_q * d
    assert len(seen) == total
    assert max(seen) < dq_accum_bytes("block64", sum(lens), len(lens), heads_q, d) // 4
    assert dq_accum_bytes("token", sum(lens), len(lens), heads_q, d) == 4 * total


def test_block64_source_and_builds():
    """The define reaches NAME.cu once, before the backward headers; the sm_90a ws kv (one bulk
    add, no TMA reduce) and the portable kinds elsewhere build without local memory."""
    from cmc.build import build

    src = back(front(ROOT / "samples" / "causal.mask"),
               Options(archs=("sm_90a", "sm_100a"), dtypes=("bf16",), head_dims=(64, 128),
                       dq_layout="block64"))
    assert src.dq_layout == "block64"
    assert src.text.count("#define CMC_DQ_BLOCK64 1") == 1
    assert src.text.index("#define CMC_DQ_BLOCK64 1") < src.text.index("#ifndef CMC_DQ_BLOCK64")
    token = back(front(ROOT / "samples" / "causal.mask"),
                 Options(archs=("sm_90a",), dtypes=("bf16",), head_dims=(128,), dq_layout="token"))
    assert token.dq_layout == "token" and "#define CMC_DQ_BLOCK64 1" not in token.text
    kinds = {KernelKind.BWD_KV_SM90_WS, KernelKind.BWD_KV, KernelKind.BWD_PRE, KernelKind.BWD_POST}
    built = build(dataclasses.replace(src, variants=tuple(v for v in src.variants if v.kernel in kinds)),
                  archs=("sm_90a", "sm_100a"), jobs=2)
    assert {c.symbol for c in built.cubins} >= {"cmc_causal_bwd_kv_sm90ws_bf16_d128",
                                                 "cmc_causal_bwd_kv_bf16_d128"}
    for c in built.cubins:
        r = c.resources
        assert (r.local_bytes, r.spill_stores, r.spill_loads) == (0, 0, 0), c.symbol


def test_block64_manifest_and_runtime_reader(tmp_path):
    from cmc.driver import compile_file as compile_mask
    from cmc.runtime.manifest import read_manifest

    out = compile_mask(ROOT / "samples" / "causal.mask", tmp_path, archs=["sm_90a"],
                       dtypes=["bf16"], head_dims=[64], dq_layout="block64")
    m = json.loads((out / "manifest.json").read_text())
    ws = m["backward"]["workspace"]["dq_accum"]
    shape, rule = DQ_LAYOUTS["block64"]
    assert (ws["layout"], ws["shape"], ws["bytes"]) == ("block64", list(shape), rule)
    r = CliRunner().invoke(cli, ["inspect", str(out)])
    assert r.exit_code == 0, r.output
    spec = read_manifest(out).backward
    assert spec is not None and spec.dq_layout == "block64"
    env = {"T": 1000, "batch": 3, "heads_q": 4, "head_dim": 64}
    assert spec.workspace["dq_accum"](env) == dq_accum_bytes("block64", 1000, 3, 4, 64)
    m["backward"]["workspace"]["dq_accum"]["layout"] = "rows"
    (out / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(ArtifactError, match="dq_accum.layout 'rows'"):
        read_manifest(out)


def _compile(tmp_path, args: list[str], *flags: str):
    """`cmc compile` of ARGS (a sample path first, relative to the repository) for sm_90a."""
    return CliRunner().invoke(cli, ["compile", *[str(ROOT / a) if a.endswith(".mask") else a
                                                 for a in args],
                                    "-o", str(tmp_path), "--arch", "sm_90a", *flags])


@pytest.mark.parametrize("args, why", [
    (["samples/clear.mask"], "tiling is patch"),
    (["samples/causal.mask", "--bwd-kernel", "lockstep"], "lockstep kv"),
])
def test_block64_refusals(tmp_path, args, why):
    r = _compile(tmp_path, args, "--dq-layout", "block64")
    assert r.exit_code != 0 and "--dq-layout block64" in r.output and why in r.output, r.output
    assert "Traceback" not in r.output


@pytest.mark.parametrize("args, layout", [
    (["samples/causal.mask"], "block64"),
    (["samples/clear.mask"], "token"),
    (["samples/causal.mask", "--bwd-kernel", "lockstep"], "token"),
])
def test_auto_takes_block64_where_allowed_and_says_which(tmp_path, args, layout):
    """The default (--dq-layout auto)."""
    r = _compile(tmp_path, args, "--head-dim", "64")
    assert r.exit_code == 0, r.output
    assert f"dq_accum {layout}" in r.output
    name = Path(args[0]).stem
    m = json.loads((tmp_path / name / "manifest.json").read_text())
    assert m["backward"]["workspace"]["dq_accum"]["layout"] == layout
