"""The developer tools under tools/ stay in step with what they edit or count."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent


def _tool(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / f"{name}.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("name", sorted(_tool("sm90_ablate").ABLATIONS))
def test_every_ablation_still_matches_the_kernel_once(name):
    from cmc.emit import sm90_header_text

    ab = _tool("sm90_ablate")
    text = sm90_header_text()  # what every generated sm90 .cu inlines, and the ablations edit
    _, edits = ab.ABLATIONS[name]
    for old, _new in edits:
        assert text.count(old) == 1, f"{name}: {old!r}"
    assert ab.apply(text, edits) != text


def test_patch_order_is_a_permutation_of_patches():
    pc = _tool("patch_cost")
    order = pc.patch_order(512 + 4096, 512, 64, 8, 16)
    assert sorted(order) == list(range(512 + 4096))
    assert list(order[:512]) == list(range(512))  # text tokens first, in order
    first = order[512:512 + 128] - 512  # the first patch: rows 0-7, columns 0-15
    assert sorted(first) == sorted(y * 64 + x for y in range(8) for x in range(16))
    assert pc.patch_order(4096, 0, 64, 3, 16) is None  # 64 rows do not split into 3s
    vis = np.zeros((256, 256), dtype=bool)
    vis[0, 255] = True
    ident = np.arange(256)
    assert pc.tile_counts(vis, ident, ident) == (1, 0)
    # 64-token tiles: the same pair is one of 16 tiles of 64 x 64, and 8 x 8 patches exist
    vis[:64, :64] = True
    assert pc.tile_counts(vis, ident, ident, 64) == (2, 1)
    assert pc.patch_order(4096, 0, 64, 8, 8, tile=64) is not None
    assert pc.patch_order(4096 + 100, 100, 64, 8, 8, tile=64) is None  # text not tile-aligned
