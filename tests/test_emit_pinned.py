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
    "block_causal_video": "80be009745fcc8d5ff3832a0d273c3b6c4e7aabec55f981562283228297bee4a",
    "block_causal_video.lin": "5201dcdef9d4147788a6ebff16d1e3452e3d858447745e8f47183ce4dac69c7f",
    "causal": "6a51bbe10f8088ddb182e43f9d640a1e173aca53c0be46307906af93a45d3ee4",
    "causal.lin": "6e42e846c1ba548944db7bc3f7a500a6279c15d4509d73924a0c00c00edfa1e8",
    "chunked_causal": "ec08c761a1c1ea3809f67bea0ac74eff62103b7b10b3358363d0dff49579e522",
    "chunked_causal.lin": "8280b04cdf604b30cb02e47296d5cdbbf4c342fec43cf527658b5e5118931ab2",
    "clear": "598b706ce96c1411de2116e0b9dce192fc8247d676d8617d8ac3c17206ead662",
    "clear.lin": "5c92ffd7361641ea13daa06cc5586899b0b794952e4df51b8ac19c24f7497bcb",
    "document_causal": "146cea4bba805dec9dba0ec357637fb9bc237b6811056dad34ac93580d537ab3",
    "document_causal.lin": "8d258cd5f52dc877d5e12b90d6dbd5de7f840e612442d9cffdc98c8ad5ce8d6b",
    "hstu": "9876fddcf9cfbd48752395f7f126dac3d4206d1dc2caf2075ba3a0423edfba64",
    "hstu.lin": "d7a19b295ee444a4d3433225da1745c7dca2d8b038d6738808f5edae92f17db6",
    "hstu_context": "da98a210c4792ab95a4af7ba3c2fc47f8b3d740f89e62c155d9ccb44a3992b77",
    "hstu_context.lin": "54745c250f651b35145900856effdf70ba50993c25fcc93debf789fd0651d011",
    "longformer": "4faece11d8c7256bb80bcae835a9dc9922ef06aa2d7aa87eb317a05d22b072b1",
    "longformer.lin": "81f21cbcc2541f712b743b625e2f9746e3dfc6b07bd29df65c9f5376a34b82fd",
    "natten2d": "7c2c41a61c9ab5690ffafe0d1ba1811ea0dc65d472441e0e9dad4d7d1c70d5a2",
    "natten2d.lin": "8e90e3faceb93e5793f3fb4368a67fe4b839dd5d0d8a4de2e7aab045deb6f3fe",
    "prefix_lm": "3f906efe90994efda4495add0843b1c7cde6ce25c6ec46babd5544264dde2c06",
    "prefix_lm.lin": "5a77aafc1bc24600c7420eff61221071ed3ccab6be1e086b1070aa4c385838fb",
    "shared_prefix": "e8522e3c54cfc9a868b775e3e97641817efe2e3ca178a974a6f268da3b245d78",
    "shared_prefix.lin": "8789988bd5b63877078d458f50fa15a246ec2daf0077d8e8ac228e714dbd42ea",
    "sliding_window": "941f7c6fe96c3e90c5ec0d71b903f974a00b3c9137b220225d02c17e2c24381e",
    "sliding_window.lin": "0c722fc2e537ecbc75b8c6451378818269ef3f7fd8c7a7c3d5740936e18df930",
    "sliding_window_rt": "a2565bf04f0714df4a44fa0177b5ed1acf0f6f7cd7f937c44b2fb2de0e27484b",
    "sliding_window_rt.lin": "c0eb9ef3616a88c70b99a2b02c20624c5808cd553873612a4c3056b297dca0b1",
}


@pytest.mark.parametrize("key", sorted(PINNED))
def test_forward_source_is_unchanged(key):
    stem, _, lin = key.partition(".")
    path = next(p for p in SAMPLES if p.stem == stem)
    opts = Options(kernel="portable") if lin else Options()
    text = back(front(path), opts).text
    assert hashlib.sha256(text.encode()).hexdigest() == PINNED[key]
