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
    "block_causal_video": "ad1a4aba7f8397dbad18411e2445307d08bd91c8c399b0101076d6fb31c9a97d",
    "block_causal_video.lin": "e3e1321e7bb1d1de6a3e093a874fabab192def37bcaa7c5c43c01c8db506d4fc",
    "causal": "bd6e4bc8f88d7bc2e465dfdeb87a0dcacd507d8562f89a1c8602b4ff7cd5eb9f",
    "causal.lin": "73c767cf26a3ffdf82b41ff93f24755376fcb6e2c8073d98debd7a6f07370367",
    "chunked_causal": "05215a504de127b264e06d1975606d951557601ea742c8f67e7408b72fcebd16",
    "chunked_causal.lin": "55bf3fa823ff524d89fb405d51140c45c9bb9766c41f7cb6738aae56a0caa8d4",
    "clear": "7bafffd959aadd5bbd58ebd14d4c6db0cb370bc980d8d5a20b31d7b29818cce8",
    "clear.lin": "c87ada64df889da9b7ec996be16e4e935553ecae4699ffb6e54b8861327d9d07",
    "document_causal": "62ea07a21879263a7b2378f1278834d7c94e268b50e5d7407af943e58b1e4ddc",
    "document_causal.lin": "92d6402057e73c68169044447dcb24cc9ece4352536bf26b9f12660ba7be2c81",
    "hstu": "1ca9499704ff29c722cfdda1105b973e69cf9d51903bf7ef2cce2721f0d1b992",
    "hstu.lin": "704aa910c45ed4a149079d6c2c3f837c3e94b38d3878f8461fac7dc6721a1995",
    "hstu_context": "29e9f0ef3aba46456e75a9d8ebdedc65d1a189ceaf332918825865406a78fe2b",
    "hstu_context.lin": "393dab21009558d2f703ec236216aaf7d29edd618e54a120b1fff0c4682e5041",
    "longformer": "849eef934a61444caeeedf300faa003d154ae1194dd0675c6886a2216146081a",
    "longformer.lin": "df7f3983b2da40c56584c5dd07bb12e7502049d2105ebc80b6c4be11e66deb44",
    "natten2d": "bf6a80c8545f698feec83598898b1fcbb8b9ed365bd90aa4c17055f0e516a790",
    "natten2d.lin": "72ece012eb75221c64dec449444d33d3912b991ae7a2ba8a3b87f7c5f75a72e9",
    "prefix_lm": "afc39888f2231dfd3d800b6f3eea81f4ea84ff6f12d8090a750b9a7f241ee237",
    "prefix_lm.lin": "a457069de66b883baac03a11cc219e6ef7407f32d03e9db53bdee6c38cb16a48",
    "shared_prefix": "a0730afef4b635ca23fdb5bf00ccc13a63419c66e92f4b9a3cc27f53dfb7f50d",
    "shared_prefix.lin": "7f8e5cafd96ec9c8ec6eff9b5a37825b11def4a6d4e2c42a09f9b0e9b28ea9f3",
    "sliding_window": "27b79cc7d291df865de871588765571da2130eaddd35811fa7f9ba0b4db262c1",
    "sliding_window.lin": "2d54f5b2dd0ed21033f626c6e6311d207dd1e0c0bf34f4afd24846ecc7a12010",
    "sliding_window_rt": "733e07499535266da9025be8d52a30e0909937bf03d51d13d3ea2c86dbd579d1",
    "sliding_window_rt.lin": "3c1b91f1fff4cf8f60689a05980285aa9cef1d87049ac857b63667d5ed7c191f",
}


@pytest.mark.parametrize("key", sorted(PINNED))
def test_forward_source_is_unchanged(key):
    stem, _, lin = key.partition(".")
    path = next(p for p in SAMPLES if p.stem == stem)
    opts = Options(kernel="portable", backward=False) if lin else Options(backward=False)
    text = back(front(path), opts).text
    assert hashlib.sha256(text.encode()).hexdigest() == PINNED[key]
