"""The portable backward (templates/cmc/attn_bwd_portable.cuh) builds without spills.

Uses tools/bwd_source.py to assemble the source (transposed hooks by swapping q and k) until
emit produces the backward itself; NVRTC only, no GPU.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _bwd_source():
    spec = importlib.util.spec_from_file_location("bwd_source", ROOT / "tools" / "bwd_source.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules["bwd_source"] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_causal_backward_builds_without_spills(arch):
    pytest.importorskip("cuda.bindings.nvrtc")
    from cmc.driver import front

    bs = _bwd_source()
    src = bs.assemble(front(ROOT / "samples" / "causal.mask"), dtypes=("bf16",),
                      head_dims=(128,), archs=(arch,))
    _, res = bs.build(src, src.variants[0], arch)
    assert set(res) == {f"cmc_causal_bwd_{k}_bf16_d128" for k in bs.KINDS}
    for sym, (regs, stores, loads) in res.items():
        assert regs <= 255 and stores == 0 and loads == 0, (sym, regs, stores, loads)


@pytest.mark.parametrize("name,params", [("causal", {}), ("hstu", {"n_targets": 5}),
                                         ("shared_prefix", {"prompt_len": 6, "responses": [9, 14]})])
def test_transposed_mask_is_the_transpose(name, params):
    import numpy as np

    from cmc.driver import load_mask
    from cmc.oracle import dense

    bs = _bwd_source()
    m = load_mask(ROOT / "samples" / f"{name}.mask")
    assert np.array_equal(dense(bs.transpose_mask(m), 21, params), dense(m, 21, params).T)
