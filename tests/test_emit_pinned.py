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
    "block_causal_video": "5bd93a8a55970fac188cc5ed50a9c19fa007ae1f391db7c49cbf17f42c797cca",
    "block_causal_video.lin": "999e5daf5d4ad9bcbb22ac2347a3f18b565c00330a375f4ac7c1ac3a1542f68b",
    "causal": "e185703e4b9f5b41adb054abec231bdd68d3901343e61c725ac4d4b0805593fe",
    "causal.lin": "fbb21ed23b68900e5cd5eab75a8bb2486518b2524e22c701815f00bdd45ce319",
    "chunked_causal": "9ce14a17d8aa9ada27445676d0a82357b72c77e066cd691aa62d0eecc06555ca",
    "chunked_causal.lin": "ca07a712335cba0bc12fa6f4fbff6f384fd1683766cc93119b09e81113d3dc3c",
    "clear": "26433b8ae3dd9996018c89b026c19ccf058dc0c31524f526229153c9b0b31752",
    "clear.lin": "714122a5adc447a648fd2415d0451f0948d7ac6c97887675b04cd018fc16f313",
    "document_causal": "b666700e74c4b11903ed717f662f753de9743d840dfd520edbd90cae16ff6dd5",
    "document_causal.lin": "704761e19a60710b17460ef41e5d988a884ec60e762e5a4654bf22a40ae51d6f",
    "hstu": "46ee202dca99c2291256238c276906e137dae403b48477ce790df05fbd53c394",
    "hstu.lin": "57979a9d9ad429f5017e84c9da9c287c7614df325fa0604cd025d4e651fbda54",
    "hstu_context": "de5acd32d77fc7fb9263255bafe1abbc4dcfea4531520b824eceda325d24df28",
    "hstu_context.lin": "9697268a3e6b26f382945d2812344b358d0772be081023bbf4d14651f5434830",
    "longformer": "9aea47af4947cb622e063b46e52f38608263da329a87d7864935e38aff2f72c5",
    "longformer.lin": "d003e92412203f37527532f61651acfa8f611d910f982a327a584ba19d7c8cb0",
    "natten2d": "c783075617cb9482545078d3720b207d3594ed7c9f7c4c244ddf27b1f3f92c27",
    "natten2d.lin": "2b6072bf13f499d2404554e28ebdc3ed5169e1d5d525b91b3fa936c4642342b7",
    "prefix_lm": "2a79de69d54d096dc2bb987ff30d1770d31cca62401c8c27bec779b4896822c3",
    "prefix_lm.lin": "7753f275d11452a407777211f43a3ede2ffcfc46a6d5a5a79597d378ef00a250",
    "shared_prefix": "bdaa6286bd660bf6add71908578c3e44601a65b27bc7be67c95d1740278ed61f",
    "shared_prefix.lin": "bb3da428940f28c27a07e9fa63b453e6429339c1c5b4bfb7ce92b62ee97fe09e",
    "sliding_window": "86a02d6bc270e663f76a5934096bee51632183a409d47b8722109316f5c29c3b",
    "sliding_window.lin": "c66f701488a5eaa09b2d2f2993b83f4cf607845efeeb676acdbe935ac9135d77",
    "sliding_window_rt": "091979902513f5f5c56445f5260c288255fa409a5c6daa2528f5753d878276f3",
    "sliding_window_rt.lin": "674cf80e2a3a28066b9da884506fd5732f17d7d8cba4963b0cb38a7ce166f8b2",
}


@pytest.mark.parametrize("key", sorted(PINNED))
def test_forward_source_is_unchanged(key):
    stem, _, lin = key.partition(".")
    path = next(p for p in SAMPLES if p.stem == stem)
    opts = Options(kernel="portable", backward=False) if lin else Options(backward=False)
    text = back(front(path), opts).text
    assert hashlib.sha256(text.encode()).hexdigest() == PINNED[key]
