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
    "block_causal_video": "82a25cb2a359ca965fb0c86bf79d56285f3770f7947f2d6efc4c51dc1981a050",
    "block_causal_video.lin": "868b925e0ee5162ea6921f022e513cf3988f60b86507346c1d666934eac483d5",
    "causal": "d99a11c23fb18091a6d973398534fa8f5ea2a0ce7af9ea58b29d9d5df1d97e0f",
    "causal.lin": "0cbf73ae083c7f92543d7955eba6b2f891e069e38fa329db1a96342468560424",
    "chunked_causal": "c39ca78d8111f16906a54a227a84c77a5431af0bb183cb1abeccbf779449d53d",
    "chunked_causal.lin": "3944d8597e6c0bf8fb3af5f00eeef702e24552ca7629f560bed06aa7a3744ccd",
    "clear": "6e021c92a000bbe189ba167a5e2972075cc70d7d9301a3361e2f10a2afd091f2",
    "clear.lin": "7d17d7c57087b83dbc19de022871c18de3bc45019acb5f1af8add57cdd911eb7",
    "document_causal": "961b026f43271c4b227aca6032ecbc38b110bd347f0d099984d5f5ac704e17fc",
    "document_causal.lin": "b25399295af32664815252767fcf1617210f4762299cda4d241c25198b6d0692",
    "hstu": "ce333cc65c10bd43cf497bd505b86e7961e4bab1278cfc82104e2231e8ef8549",
    "hstu.lin": "b188096d0eec1ff37fdeb00422971b858118c413db7d5632112064f679d36d6d",
    "hstu_context": "0efcc3dece2ae94c51d3870f9453e4e8e6ad21784152a8306bde1a8cb45324c4",
    "hstu_context.lin": "9e39fcb643cc000b945bf3f14e50c96eefe88a2e689bf29f654ee464590b1cc5",
    "longformer": "489ecd11855664761f377f8c028d9d3710e5246c15e965a9a73880a9e5bd870f",
    "longformer.lin": "e68a8e235a25454975532880a3065b17debbffa6323ff673babef9d4d19d0736",
    "natten2d": "c801198efaab3df006af3be94096f25715995d43b1340e3a25872d7d5ffb8f7c",
    "natten2d.lin": "4d3975102693171ad9c3343fd146c9e7b15bb1092e6957eab751a3324d46867a",
    "prefix_lm": "4d30c8856bc615f2b4c78dea982a31cdfd5b644c8587016df29adbdcfc0b15c2",
    "prefix_lm.lin": "f4ec3493f0ef44e1c7fba697b429b1a4ec113771105c7c8a51ffd554286fbce9",
    "shared_prefix": "580a7fd2a610ced729b4154a79e751e1d337e012bff5554ab1083d94a8bf0dbf",
    "shared_prefix.lin": "4a0d970c6c355762888a70966202e1863de3efcda4b9d842ec505d3585e0a194",
    "sliding_window": "3f89bce08f9e60007f9610cda3f2529f0b76efebed1670c57275af7b16c08d1a",
    "sliding_window.lin": "fee424afd12666b1c0ade1233743839e61693511d81234a55871980da126a2cd",
    "sliding_window_rt": "0875956f606077533124dfb4003219d7d11dfb63281a82d5ab608dad87fd9a36",
    "sliding_window_rt.lin": "7bc229662ab068f37d46ae1575fcd79235a59342ee9ad0d03593bffc9147b644",
}


@pytest.mark.parametrize("key", sorted(PINNED))
def test_forward_source_is_unchanged(key):
    stem, _, lin = key.partition(".")
    path = next(p for p in SAMPLES if p.stem == stem)
    opts = Options(kernel="portable", backward=False) if lin else Options(backward=False)
    text = back(front(path), opts).text
    assert hashlib.sha256(text.encode()).hexdigest() == PINNED[key]
