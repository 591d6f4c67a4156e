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
    "block_causal_video": "ef438291487f91f2c4a8bc46cf0655e6e433cbaa0ae64a2f9481d4ab941466ca",
    "block_causal_video.lin": "43ea58d840052f18a961bd74dfe87ddeb62d7e397c177e555dd5dc9a8ca7b577",
    "causal": "4e879fe7cc1102026707eb5a8c61aa2540779d858ce6da43b91f7c4fb38b7884",
    "causal.lin": "7b17a9f3b21c30c07c324cfb4f7de9cf89c0a3fd1073c1e52940cbe26fad164e",
    "chunked_causal": "b0ed07abce2c48d521480d7012019bd8ca513951cf3e7c26c1c250ba8270d521",
    "chunked_causal.lin": "8a8e8c87d9194f8f0fc14a990dc63e25c73c171750396c311b7f2d7b8884ecdf",
    "clear": "f1bf1fbfe0a8151da20af4b9a6ecbe6b25edb22690d710a3f7929274865f5b82",
    "clear.lin": "77499748acb245bfa3799baef7ebc3bfe63d7c78fe065731ed2ab5285b4bd069",
    "document_causal": "a18c32f75cd3739bf36d413dd0564fd23f4ab3fda185ffc2304134630ad2e797",
    "document_causal.lin": "3bff71346ad5911858c66bdae373ee4418468ff2f1812310b00c23870fdfa3d7",
    "hstu": "da7a0099054770b18a1b373a9c8332c4358de5cee412c68b61d3f46a9f518fff",
    "hstu.lin": "4ed031998bfdecf4ea580e4712c802fbfc2d6d9307a2cee857447dd328909a7a",
    "hstu_context": "40e9482f67f00f28a22a277735ae773dc6105c1764430af522295cf3ea79e7c8",
    "hstu_context.lin": "20342507d320cd3be5683bea82bf98f092294dd472d63ceec08e543276eb96d8",
    "longformer": "51a6558d837a1f40bd944ccb58faf7a3434cf82a834920250f682245fe299781",
    "longformer.lin": "1a85530d062dce5b05ec4d2f4261ccd51d9fce488c442f41d82e996a066b81e5",
    "natten2d": "f23897d509a7f4b977ca9882fa37333af3c5a25b5c65a6bc773b255d3d592546",
    "natten2d.lin": "f3dce9a026585244bd5bea9f623f98c082cc260053e4e688943b9598052737e6",
    "prefix_lm": "bdda67a3819959a83e26e0074b62aa2baa82a7f064689279c012775cd3edfcf4",
    "prefix_lm.lin": "a9163e005f1b8851c7ca65cfcb2b6d4a41812e82f28c644289389fd14b9e03b0",
    "shared_prefix": "ca8af237898ebedcf9456d3a99681461fead439fa704b3fa7f6ae65cf016e478",
    "shared_prefix.lin": "74a418396b094253ab6e69be7c64a53251bd2d3e4890a6b3fdd3c96ab6fe95ca",
    "sliding_window": "9f99badf83ecefc89ee08f4139d67c04fd9de288dfb9b336f7004602434a34f8",
    "sliding_window.lin": "439838c7e71ec1a7cc4bca1bbf50cf625c54e9b3724491c253270f5d7e3316de",
    "sliding_window_rt": "c45083861b35b2a36794da2347df76cf81dd150a17e1e63a38d4e6636799cb54",
    "sliding_window_rt.lin": "2b2ebfd4dd5a05dc3354bd86b0c2f92aef94cdeeebfbf955ea0f701b146e528a",
}


@pytest.mark.parametrize("key", sorted(PINNED))
def test_forward_source_is_unchanged(key):
    stem, _, lin = key.partition(".")
    path = next(p for p in SAMPLES if p.stem == stem)
    opts = Options(kernel="portable", backward=False) if lin else Options(backward=False)
    text = back(front(path), opts).text
    assert hashlib.sha256(text.encode()).hexdigest() == PINNED[key]
