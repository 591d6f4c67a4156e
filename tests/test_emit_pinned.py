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
    "block_causal_video": "5cbd7b048aadb0b1244c9dc94c398eefebe804c15dfb746511b86deec332ff00",
    "block_causal_video.lin": "999e5daf5d4ad9bcbb22ac2347a3f18b565c00330a375f4ac7c1ac3a1542f68b",
    "causal": "ad57b91d8158f468fa375269fb6ff3fb05aa52077c9da0a4d68b47116611a570",
    "causal.lin": "fbb21ed23b68900e5cd5eab75a8bb2486518b2524e22c701815f00bdd45ce319",
    "chunked_causal": "1cc82ba8ba02243796473687ca1ae4b650ad1199da1e89019e4479dde01735b8",
    "chunked_causal.lin": "ca07a712335cba0bc12fa6f4fbff6f384fd1683766cc93119b09e81113d3dc3c",
    "clear": "1806d8b7eff773241b187c380e9387f08746ad3d8d3b4306aedeac049eedfab7",
    "clear.lin": "714122a5adc447a648fd2415d0451f0948d7ac6c97887675b04cd018fc16f313",
    "document_causal": "c790828787d9651f6a2f0db4958146aebc76067734296470cde0e1661a6fd0d0",
    "document_causal.lin": "704761e19a60710b17460ef41e5d988a884ec60e762e5a4654bf22a40ae51d6f",
    "hstu": "b8e5bb739a70cbf9733757a434446dde2088d5f28424254d813767d494250f11",
    "hstu.lin": "57979a9d9ad429f5017e84c9da9c287c7614df325fa0604cd025d4e651fbda54",
    "hstu_context": "f294d37126777ccc49d1f4cb3d8ba9b40686407207ccdab48d65aeeb10e81a4e",
    "hstu_context.lin": "9697268a3e6b26f382945d2812344b358d0772be081023bbf4d14651f5434830",
    "longformer": "034cd6c0179894da50ce8840b591c9c4842d4b467a74ec791fa7951bb1052786",
    "longformer.lin": "d003e92412203f37527532f61651acfa8f611d910f982a327a584ba19d7c8cb0",
    "natten2d": "35fbecd370024cfa6ca69c7104f7965b57c75642f2ea2507464412f2ca9436b2",
    "natten2d.lin": "2b6072bf13f499d2404554e28ebdc3ed5169e1d5d525b91b3fa936c4642342b7",
    "prefix_lm": "790e67a12a0f5db38a19d41f12773fa1e1f920843784195f2cf06b73b5ac8c2f",
    "prefix_lm.lin": "7753f275d11452a407777211f43a3ede2ffcfc46a6d5a5a79597d378ef00a250",
    "shared_prefix": "fffca1a084a71c9b0e2842580fab838765612b7a2dbb321e33f42ef0653d95b9",
    "shared_prefix.lin": "bb3da428940f28c27a07e9fa63b453e6429339c1c5b4bfb7ce92b62ee97fe09e",
    "sliding_window": "0df5a5e3ea0c508d21171e27b5fc86e8a3fe7cfefbe447953ccf8c291ce5fccf",
    "sliding_window.lin": "c66f701488a5eaa09b2d2f2993b83f4cf607845efeeb676acdbe935ac9135d77",
    "sliding_window_rt": "0344f83aca69bcb0fd9003ba7fc92f875092ef127aa492f02aa526fa9c6587bb",
    "sliding_window_rt.lin": "674cf80e2a3a28066b9da884506fd5732f17d7d8cba4963b0cb38a7ce166f8b2",
}


@pytest.mark.parametrize("key", sorted(PINNED))
def test_forward_source_is_unchanged(key):
    stem, _, lin = key.partition(".")
    path = next(p for p in SAMPLES if p.stem == stem)
    opts = Options(kernel="portable", backward=False) if lin else Options(backward=False)
    text = back(front(path), opts).text
    assert hashlib.sha256(text.encode()).hexdigest() == PINNED[key]
