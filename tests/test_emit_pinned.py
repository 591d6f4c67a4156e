"""The forward .cu of every sample, pinned by sha256 (default options, and --kernel portable
as NAME.lin) at the commit that moved the hook struct into templates/hooks.cu.j2: the
backward's additions must leave forward-only sources byte-identical. An intended change of
the forward source updates these values in the same commit."""

from __future__ import annotations

import hashlib

import pytest

from cmc.driver import Options, back, front

from .conftest import SAMPLES

PINNED = {
    "block_causal_video": "54b1e65591f1642762cf7138708bb81cfa05b84991077331e06f6b87c38124bd",
    "block_causal_video.lin": "868b925e0ee5162ea6921f022e513cf3988f60b86507346c1d666934eac483d5",
    "causal": "031493e3ea453ec87d69d0eb8adb517b42aed6c4387177de77916c4073b252a9",
    "causal.lin": "0cbf73ae083c7f92543d7955eba6b2f891e069e38fa329db1a96342468560424",
    "chunked_causal": "a5cf7f692cb5a6acb5c289bc7dde7565ab1610c7496476616622ac62bc9f5dc6",
    "chunked_causal.lin": "3944d8597e6c0bf8fb3af5f00eeef702e24552ca7629f560bed06aa7a3744ccd",
    "clear": "a7cea8fc96e87d681c068e7bb7a96ad1d1c6ce2ea28ef2072f9606525cdb68b8",
    "clear.lin": "7d17d7c57087b83dbc19de022871c18de3bc45019acb5f1af8add57cdd911eb7",
    "document_causal": "2c94bd99ef2e4d3adbe609cc030a84bb34b7c4178980574c8ecf1fdef22db2fc",
    "document_causal.lin": "b25399295af32664815252767fcf1617210f4762299cda4d241c25198b6d0692",
    "hstu": "877099f4b01210c1eb7383919564588cec4eaa5986768a875957d2fa7080b1d5",
    "hstu.lin": "b188096d0eec1ff37fdeb00422971b858118c413db7d5632112064f679d36d6d",
    "hstu_context": "2f488dcaec2daae5871ee7d5564734de378522a52ae869e67c3ae9cefbbbaf93",
    "hstu_context.lin": "9e39fcb643cc000b945bf3f14e50c96eefe88a2e689bf29f654ee464590b1cc5",
    "longformer": "96e4f29cd0efe68631052021982ec7ba385f3a328369a3cbfbe9ab5eb7c16602",
    "longformer.lin": "e68a8e235a25454975532880a3065b17debbffa6323ff673babef9d4d19d0736",
    "natten2d": "1dabae87a59f40ea777f2f5a520cb0289875fc25058604c4a08d042a021abc9b",
    "natten2d.lin": "4d3975102693171ad9c3343fd146c9e7b15bb1092e6957eab751a3324d46867a",
    "prefix_lm": "d22804db5602c99013f85a60b1763631057d1ec5917ddfd40823fcf1d801686d",
    "prefix_lm.lin": "f4ec3493f0ef44e1c7fba697b429b1a4ec113771105c7c8a51ffd554286fbce9",
    "shared_prefix": "89435ecd9a8ae2fca0be0a684262f7360f566aff80096eb85c71f9e03a153593",
    "shared_prefix.lin": "4a0d970c6c355762888a70966202e1863de3efcda4b9d842ec505d3585e0a194",
    "sliding_window": "a91827966e0c32862e6e53793c3f7c036ae44c2ded05d6908a36752346be2f20",
    "sliding_window.lin": "fee424afd12666b1c0ade1233743839e61693511d81234a55871980da126a2cd",
    "sliding_window_rt": "2df62dedc041bcb324d7c52627cbe02525dc2473a9a608bad19aab4b7d34c0dd",
    "sliding_window_rt.lin": "7bc229662ab068f37d46ae1575fcd79235a59342ee9ad0d03593bffc9147b644",
}


@pytest.mark.parametrize("key", sorted(PINNED))
def test_forward_source_is_unchanged(key):
    stem, _, lin = key.partition(".")
    path = next(p for p in SAMPLES if p.stem == stem)
    opts = Options(kernel="portable", backward=False) if lin else Options(backward=False)
    text = back(front(path), opts).text
    assert hashlib.sha256(text.encode()).hexdigest() == PINNED[key]
