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
    "block_causal_video": "8c39d35337ceadb53d74d03af2e38724e0ebff959a8f5f2608db67c0a011f177",
    "block_causal_video.lin": "2bce48f391957f9f39695aa92bd418f17d93a596dd5ffc5164dd0b32937930ba",
    "causal": "41da0389001a1ad82c2ed49fdd6f36ba569ff9f882d8f1009f25bd7e27848414",
    "causal.lin": "fae239ddd54603193a27e6d5596521fedc9507a3ffc6e073f0405e8fd2995aa4",
    "chunked_causal": "da7e7a5b0ac9e3851ddf2f4611a5c407dc7ca72aed66d9dc261d024d143e8bbb",
    "chunked_causal.lin": "9c234602479f27863a255187518e144a015535a26ae50de13f6b723e4395cad1",
    "clear": "4875fe25c6bd92245a2595153f9cd7e0e10e7c9d46ca6481255be00bb3084321",
    "clear.lin": "872a330e84b2d0fe2fdfc0b26c208a21576f4a096acd7fd917da85a51ce3a9dd",
    "document_causal": "25f47dc282605c470097d4ade3d91dccc4fc0138f1eda57132fe9553eb19de20",
    "document_causal.lin": "41d78d806134ac69569653bd247e8ad9d0a7fea05621619ad9c080f409103fa1",
    "hstu": "452fcb9bd6cb634a3dce45a9f72af114511a8030f4463f3c1456915f62020eca",
    "hstu.lin": "663b30a1802062211f6256ba6d06931ffdd54254a548db274fb0dd3aaa5e898b",
    "hstu_context": "7ebdb27fd60430f5535aed7ee6cb5ce836e261b01d46d92b59728f75ec8c20de",
    "hstu_context.lin": "4cb337db2d12eed6021f7050c6838930d27e76ab8b0a671e6e86d8bd7a5afe71",
    "longformer": "cb7b0c8c9c622ecb2a4f733bee429dae8dbee930643419d9bdddb23efdb81c4e",
    "longformer.lin": "3512fa241cf988519186498a9a520cda4b9bb6fbed2d1e49022b420e3724365f",
    "natten2d": "43f1129796255482f0c4cf5f604c77bcbafd8f09db1d3ec3031d73d976cf2996",
    "natten2d.lin": "0df7ea852f05ddd902db917c288bd29d98aa303075e2a651b4e869cfff8ec235",
    "prefix_lm": "5e7883e4f3ab12c3835d7aa6ce8f7b2c85fb55b37b3118340c1acac58bac0e2b",
    "prefix_lm.lin": "b4f911cac5d7b5ab16ace21a647ee18cf66c5fc7bdcc898f83c852fe4d6d0977",
    "shared_prefix": "e6de803009e9f0dad971a46134cbd0218ba65727052b0c45fa635cc3d5bcec93",
    "shared_prefix.lin": "a82f2eed08ab1a2388ec4ed00030fe7ef7f939113515197b6d6c731e6fc0d219",
    "sliding_window": "d361a82c6eefc926d25c858594bb09522ee6fb002a520a3213f3b144749c817a",
    "sliding_window.lin": "f41aae8e5c251fd21c31b038157ced04b696f6b45da791d2c3a4715c4ffd7d08",
    "sliding_window_rt": "dcea610f7e567acc9154fa43d954d01eb06b81a6d18097cfd2a670bb9c23e5f7",
    "sliding_window_rt.lin": "d4e3f36cc70e6dde2afdd6461da919cc8726e94ca564b3eb3764cc5ea271b4f0",
}


@pytest.mark.parametrize("key", sorted(PINNED))
def test_forward_source_is_unchanged(key):
    stem, _, lin = key.partition(".")
    path = next(p for p in SAMPLES if p.stem == stem)
    opts = Options(kernel="portable", backward=False) if lin else Options(backward=False)
    text = back(front(path), opts).text
    assert hashlib.sha256(text.encode()).hexdigest() == PINNED[key]
