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
    "block_causal_video": "ee445fd686a69d60de40318dace644d82362e3eab4315a243fad35ed8aa009da",
    "block_causal_video.lin": "f3774266ea1db4106c9e5ef075ffbc25ad9534e381b5a8468e60f4972a483f3c",
    "causal": "fd60c9d6df92cdb216e21f5913eb62b2920f9ca99d964c9ac51d0ca952af2089",
    "causal.lin": "95ce89cd51d7a4c9a246450eb2d990d18820b069a1b1e7a9c59ddefe55cd0caf",
    "chunked_causal": "37ff92173441b2af84ea269db256ea6d73bf8bc5ef6c9d0e738fc5919b326735",
    "chunked_causal.lin": "d4e198c374387efb0b1bfa07eb721ea9d42368429be83de5550eef8e27921cc0",
    "clear": "c41a8a19d2a67e2427e2f0a97e25628ba556d55f9637e1f09e24abcf4f93c0c5",
    "clear.lin": "4c92aeb6a8649e4a7c4f9e9f56ab7a57438627b61dd56bd5be043ad6e56827f8",
    "document_causal": "3359045e31e8363bda3f4b45f7c4ae52a1b53f618b679172968e7eff85873bc3",
    "document_causal.lin": "6ddd41ac666c6471946e9222d8ba9c563eeba3c65bbde3dee579cfc739e78b67",
    "hstu": "c3e0f5649bd12f01a56da74af2ad2626dfba3b96a4f0ee1d114b45aea1c13121",
    "hstu.lin": "6410fc390e8e5931a8ef3577884fb632331f104fdfbb8d51beaf7052df6f0652",
    "hstu_context": "7a8df1571c4aa30a12305e9551be8db8209a5b069d9dbd78e8f33593a31811f8",
    "hstu_context.lin": "adc90d02f7576c5d6ed7591dc28c586b31ea199e09ac1a48d30f9193d02ce031",
    "longformer": "be8e66583ef8c3961a4e29ad6817bbdd6fdad02399f44404848902f8b2913056",
    "longformer.lin": "3c498d0481a7ad1dc7632ba22634f1bdbdcff5e6898a408338f283185d1554ab",
    "natten2d": "17d92d5699a0f0aad61e0d7361b0dadfda83880334582c3b4a31997837ab9430",
    "natten2d.lin": "9418b4ec6cbe360ccdbd2fdab6cf3f0d8d50b108ad62609ac2ea875412c2c4f4",
    "prefix_lm": "bb6ef77fbf401f5976ba08b53b31815a8b6fe2435ab42fe1b0805268e49676bc",
    "prefix_lm.lin": "34be21071ae9b731fad44f605ffb9e816fab2e9334321b5ff9ca29b30b4a759e",
    "shared_prefix": "96ef4405c44c569b091bb78474ed98cb2fa815ddc570b7777a2d5f0daf264253",
    "shared_prefix.lin": "85febd0e07e45f85e6260fadfc31e175827893fc037c8d8349128266bb42af5f",
    "sliding_window": "5247643b44290ea1dd98bae23f8b5ae3497ae11bddde26655526a11b0b2ae176",
    "sliding_window.lin": "dc6520b8ca7bfcae89435af730a65e6a16c2fe05aa0db7b0a9951cfba5293c1f",
    "sliding_window_rt": "e8f5148f443d05f7e58c8d54ea9debaaad0c1230baff88246ca7148146a9c8c4",
    "sliding_window_rt.lin": "0e390dc7b5fc524701eab5da6d8391b326e504647e7e64592689b2874036f876",
}


@pytest.mark.parametrize("key", sorted(PINNED))
def test_forward_source_is_unchanged(key):
    stem, _, lin = key.partition(".")
    path = next(p for p in SAMPLES if p.stem == stem)
    opts = Options(kernel="portable", backward=False) if lin else Options(backward=False)
    text = back(front(path), opts).text
    assert hashlib.sha256(text.encode()).hexdigest() == PINNED[key]
