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
    "block_causal_video": "27bc231dab3b83e62bb7e1b973381c3c03368633a4aa6442c130ddacc845e73c",
    "block_causal_video.lin": "868b925e0ee5162ea6921f022e513cf3988f60b86507346c1d666934eac483d5",
    "causal": "6775b4f523af83c50fa3b8f83a2f26fa20b1ea58b080e7ac73c559f9b6ac28a7",
    "causal.lin": "0cbf73ae083c7f92543d7955eba6b2f891e069e38fa329db1a96342468560424",
    "chunked_causal": "f5e81f30aae49228582a4aa0a72448398be7011a4988fef567bf4a6c9ff1f3ce",
    "chunked_causal.lin": "3944d8597e6c0bf8fb3af5f00eeef702e24552ca7629f560bed06aa7a3744ccd",
    "clear": "d12568a0c2305f4407fa19d983042077a90070a9535c1e563e18921292c1ac6d",
    "clear.lin": "7d17d7c57087b83dbc19de022871c18de3bc45019acb5f1af8add57cdd911eb7",
    "document_causal": "f3e1bea102a7c289c120e420e5a9c5ca4ece8fa1d941600bc34471e7fa5fc931",
    "document_causal.lin": "b25399295af32664815252767fcf1617210f4762299cda4d241c25198b6d0692",
    "hstu": "6d6a9fd2b21bab2146d9088e6b978294371bbb35d6fb3937f745cda5a578e63f",
    "hstu.lin": "b188096d0eec1ff37fdeb00422971b858118c413db7d5632112064f679d36d6d",
    "hstu_context": "ca1d4de4ff450f1155f6fa103490896adc9ff335fd7b1cc53162e1ec212afbab",
    "hstu_context.lin": "9e39fcb643cc000b945bf3f14e50c96eefe88a2e689bf29f654ee464590b1cc5",
    "longformer": "ab1a41effbf856a676e2158979d70692dfd2cd2db3e0c4039ae35d94e32aacc7",
    "longformer.lin": "e68a8e235a25454975532880a3065b17debbffa6323ff673babef9d4d19d0736",
    "natten2d": "7c37baf2b5199ddbd444efa5334ea6b78894332253a4a28694011c008ae8852c",
    "natten2d.lin": "4d3975102693171ad9c3343fd146c9e7b15bb1092e6957eab751a3324d46867a",
    "prefix_lm": "7fac7caee701e9249d5d4046bdd2ff92e80601cd3fa7db7d694642ae65e7b7d9",
    "prefix_lm.lin": "f4ec3493f0ef44e1c7fba697b429b1a4ec113771105c7c8a51ffd554286fbce9",
    "shared_prefix": "7048eb78d0a40692eeab93651f4dd34df09c1dcdc9b9a9ce10ce8d12077edca2",
    "shared_prefix.lin": "4a0d970c6c355762888a70966202e1863de3efcda4b9d842ec505d3585e0a194",
    "sliding_window": "5b08f6da2a8612ab9374fd5b931d4bfff48368f1be8394ae95e407e266f50285",
    "sliding_window.lin": "fee424afd12666b1c0ade1233743839e61693511d81234a55871980da126a2cd",
    "sliding_window_rt": "eabd9602c85a9ef1a97321140d158136a0ed87555b759ac8d537155812da3033",
    "sliding_window_rt.lin": "7bc229662ab068f37d46ae1575fcd79235a59342ee9ad0d03593bffc9147b644",
}


@pytest.mark.parametrize("key", sorted(PINNED))
def test_forward_source_is_unchanged(key):
    stem, _, lin = key.partition(".")
    path = next(p for p in SAMPLES if p.stem == stem)
    opts = Options(kernel="portable", backward=False) if lin else Options(backward=False)
    text = back(front(path), opts).text
    assert hashlib.sha256(text.encode()).hexdigest() == PINNED[key]
