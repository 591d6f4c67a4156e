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
    "block_causal_video": "272e6637476a820ec1a15790f569c3bef8bdd1976f174911c99a61d3169ecd00",
    "block_causal_video.lin": "58caa334d5acc4307963b231bc6b5cc5589d7a54873d4d77719117e9e8255050",
    "causal": "733ccbf334644f4be8e4bc960f847136b8627085193485bc50930cbc9f20461c",
    "causal.lin": "1ca03185d862d7607e122c12e31e3d0485d7ad95f332136cf9780a50632968d9",
    "chunked_causal": "dcdef69ca5bcbe4590bd5a43078b11ce55f637774e35cae287764f6085ffd6c7",
    "chunked_causal.lin": "5d0af96cfd54738a8891bc3a979b14650cdc48c7925fcbaae6b4777dbf3a93b8",
    "clear": "36e3403435d3adc2ce42d1efbc2cb14e00b384b8fbd68c14f50e99457aceee92",
    "clear.lin": "cbfd406d366aee9b110a671cb5cfef4ee80c7c4ec7cdd2347804270c90824bf5",
    "document_causal": "f569b70b81c5f2e39c8806a6092f89e8c90c33fd41f9c5705fa03b30ef7695f1",
    "document_causal.lin": "656c630191eb944ea5b25d2daed9ffd72eb61927281fb5cdde3ef57642a9d2bd",
    "hstu": "6bfcbc220cd82d8a78ef0c5cd44a4159a5f3254a2704c803f467bd37edc363ae",
    "hstu.lin": "5ae8b10e5c34906325d8baa505c1705dbd7191e1d3d2f089f9ce1a2da7c3a8f3",
    "hstu_context": "c8f4f5d0970b151ca5a67802d0f313ed7c36fcd86874f91a13208e8ac389942a",
    "hstu_context.lin": "17a6f54375c1edc5c4e700e971ce1adbc238d4e246b3331612440ceb57e742a2",
    "longformer": "9e118a7787258532d2f89e1932bb29f5f2db136329bb2731f38ba58530f45683",
    "longformer.lin": "01591900ff329294c6f29d480c1ae5fefa2f2cb86ec110bc2035ca0545f44e59",
    "natten2d": "3186ee86a9270ab70d838736af98ad56117cc196a65b4365b2c5a39b170bc7ba",
    "natten2d.lin": "e0f677419cdd180d3b6b753868c8459729f36221f989e4a60b2ba20ca31d182d",
    "prefix_lm": "e4798adc78a594efc81c80c6f1dd16444ed4ec59708455bfce4ed25a7a20cc5d",
    "prefix_lm.lin": "ba53b0dc11a686052d0ff7472825f2fdd8d292ce36013d72b13426ce5a40f28a",
    "shared_prefix": "ae6ca7a0ca4bec84a783ab5579ce93803a3b961a7f3370a8d9f88460cc0425e4",
    "shared_prefix.lin": "db9cbdd538fe7b73325acc501eeeec48af75d23dc6a3d761674cbf3f7a217e72",
    "sliding_window": "79e8a25e427cd39698ae4ff78fdbf992566c57a66de9cd63daf23282b030f842",
    "sliding_window.lin": "aa5ba31144e6013fc80b4d7e0974ab3d8e5e0b915450f98b1d331e95cbe8c989",
    "sliding_window_rt": "d0226a2e2255b6ddf518986adf9f8e30bcc758c0c5fdd95420ffa5b88e5cc8b6",
    "sliding_window_rt.lin": "2e32c8391a3d0cd0762d9837bea810eacfc9e00d9a0bd07233597c6079bacf73",
}


@pytest.mark.parametrize("key", sorted(PINNED))
def test_forward_source_is_unchanged(key):
    stem, _, lin = key.partition(".")
    path = next(p for p in SAMPLES if p.stem == stem)
    opts = Options(kernel="portable", backward=False) if lin else Options(backward=False)
    text = back(front(path), opts).text
    assert hashlib.sha256(text.encode()).hexdigest() == PINNED[key]
