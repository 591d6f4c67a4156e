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
    "block_causal_video": "992d51495575f34729419f61c02c59035901fea44491fb1ed94e50d822470b9c",
    "block_causal_video.lin": "868b925e0ee5162ea6921f022e513cf3988f60b86507346c1d666934eac483d5",
    "causal": "ee085c97f2b710ce07f41d9ee65375907784e3c9c13424aad803d640df1cf04d",
    "causal.lin": "0cbf73ae083c7f92543d7955eba6b2f891e069e38fa329db1a96342468560424",
    "chunked_causal": "b0c8afe8c331bc414e7748ae3bee45fc2e4815dae5ce2268a9a323dba810b69c",
    "chunked_causal.lin": "3944d8597e6c0bf8fb3af5f00eeef702e24552ca7629f560bed06aa7a3744ccd",
    "clear": "7a6fd2634a44acb434c4efa7ee6cf25f272d018dd87661883a7f5b6f7636ee70",
    "clear.lin": "7d17d7c57087b83dbc19de022871c18de3bc45019acb5f1af8add57cdd911eb7",
    "document_causal": "49155f6e4dbf3221633383558ed5182916f831ab858a2bef2a1333543e85c51f",
    "document_causal.lin": "b25399295af32664815252767fcf1617210f4762299cda4d241c25198b6d0692",
    "hstu": "10ef52ac9269b4da622b9d9ee7b6812b84a7d7f9c18adfd12b1753d9496aff2f",
    "hstu.lin": "b188096d0eec1ff37fdeb00422971b858118c413db7d5632112064f679d36d6d",
    "hstu_context": "bae8d981dee46069ebca61bbcde1852f22d3de7fd82779a5e1d90c58e10b74f1",
    "hstu_context.lin": "9e39fcb643cc000b945bf3f14e50c96eefe88a2e689bf29f654ee464590b1cc5",
    "longformer": "c991b2f2e35552d02719f2e4ef6232dea77137a8486a11912a3a23765e30efdf",
    "longformer.lin": "e68a8e235a25454975532880a3065b17debbffa6323ff673babef9d4d19d0736",
    "natten2d": "8fe255b5d8ea826add8bb80869b854dabbcfb84b82f367b273e7d306b9e8d8f3",
    "natten2d.lin": "4d3975102693171ad9c3343fd146c9e7b15bb1092e6957eab751a3324d46867a",
    "prefix_lm": "0de95de6343f73f7b4d483c3dd9337be1128b184446d8ea4672ea593fafb888c",
    "prefix_lm.lin": "f4ec3493f0ef44e1c7fba697b429b1a4ec113771105c7c8a51ffd554286fbce9",
    "shared_prefix": "16cf143237f61a7b89ff7c53424922aa921e2087a5d89a753c3a28421e8116d9",
    "shared_prefix.lin": "4a0d970c6c355762888a70966202e1863de3efcda4b9d842ec505d3585e0a194",
    "sliding_window": "f04b1a9f6d2833b8e7aa0d25aad411a9c107f45c87490c7f3fcc2be71283f592",
    "sliding_window.lin": "fee424afd12666b1c0ade1233743839e61693511d81234a55871980da126a2cd",
    "sliding_window_rt": "3af1af362a0b6c7a36e0ba26198e5cfcbdb2479ee9d2cbc03c3ed9c87a23d55b",
    "sliding_window_rt.lin": "7bc229662ab068f37d46ae1575fcd79235a59342ee9ad0d03593bffc9147b644",
}


@pytest.mark.parametrize("key", sorted(PINNED))
def test_forward_source_is_unchanged(key):
    stem, _, lin = key.partition(".")
    path = next(p for p in SAMPLES if p.stem == stem)
    opts = Options(kernel="portable", backward=False) if lin else Options(backward=False)
    text = back(front(path), opts).text
    assert hashlib.sha256(text.encode()).hexdigest() == PINNED[key]
