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
    "block_causal_video": "64ca0e825bd09ba2193fc3c56721af80e977dba7e194e4daaedaf331a37ef36d",
    "block_causal_video.lin": "5201dcdef9d4147788a6ebff16d1e3452e3d858447745e8f47183ce4dac69c7f",
    "causal": "3d5b354d3a89adb1c2ff814d2da5b437909b92ab771c9ca8c32825e2ad6d970e",
    "causal.lin": "6e42e846c1ba548944db7bc3f7a500a6279c15d4509d73924a0c00c00edfa1e8",
    "chunked_causal": "25d10bb91db45b23a089c3ccb1fefddc3da4f4f3eb1968a42adf0b1d55389ba4",
    "chunked_causal.lin": "8280b04cdf604b30cb02e47296d5cdbbf4c342fec43cf527658b5e5118931ab2",
    "clear": "628e3983e46d94d9fcb66e8c583d9e6c4723c79bcc539d93c44d3443b57cb81e",
    "clear.lin": "5c92ffd7361641ea13daa06cc5586899b0b794952e4df51b8ac19c24f7497bcb",
    "document_causal": "16bd12c5fb41ffec7ab526d13f00ad02339abf08f12bb6fe53a9e5c795cbc0ba",
    "document_causal.lin": "8d258cd5f52dc877d5e12b90d6dbd5de7f840e612442d9cffdc98c8ad5ce8d6b",
    "hstu": "19fee6ee3d561121eb021ca9e074a7b87e0a8248fc3cee48a44f3564b5d18f7a",
    "hstu.lin": "d7a19b295ee444a4d3433225da1745c7dca2d8b038d6738808f5edae92f17db6",
    "hstu_context": "a6706176e492673ca19640a596dd75cf92520a9ca03209779eb7fea140d8a0ce",
    "hstu_context.lin": "54745c250f651b35145900856effdf70ba50993c25fcc93debf789fd0651d011",
    "longformer": "1d3386481b419d8f699b6adb1e6373ae05a7e39e4b65c8a27360b40604a87bdd",
    "longformer.lin": "81f21cbcc2541f712b743b625e2f9746e3dfc6b07bd29df65c9f5376a34b82fd",
    "natten2d": "07ef49ffab6b8a7850c7195325d0076b925eb4a5bf1201ca0801db2212f705ef",
    "natten2d.lin": "8e90e3faceb93e5793f3fb4368a67fe4b839dd5d0d8a4de2e7aab045deb6f3fe",
    "prefix_lm": "643b1480af095b85005be2aee117a753354de89e7cef2ac23576be5837f67675",
    "prefix_lm.lin": "5a77aafc1bc24600c7420eff61221071ed3ccab6be1e086b1070aa4c385838fb",
    "shared_prefix": "f034dfffcfbb5fe7df9a5349fed62b32eed3b2129b6aff90048c73f3dfe922bb",
    "shared_prefix.lin": "8789988bd5b63877078d458f50fa15a246ec2daf0077d8e8ac228e714dbd42ea",
    "sliding_window": "40c2ca36765aabdbd406bb8abcd501d8ee858dff1e74bf926b1e505ed14e628f",
    "sliding_window.lin": "0c722fc2e537ecbc75b8c6451378818269ef3f7fd8c7a7c3d5740936e18df930",
    "sliding_window_rt": "b22b0e4a806775d8a8a0739807aeea21af050c2fd3bcaeacb2081434f435d6e8",
    "sliding_window_rt.lin": "c0eb9ef3616a88c70b99a2b02c20624c5808cd553873612a4c3056b297dca0b1",
}


@pytest.mark.parametrize("key", sorted(PINNED))
def test_forward_source_is_unchanged(key):
    stem, _, lin = key.partition(".")
    path = next(p for p in SAMPLES if p.stem == stem)
    opts = Options(kernel="portable", backward=False) if lin else Options(backward=False)
    text = back(front(path), opts).text
    assert hashlib.sha256(text.encode()).hexdigest() == PINNED[key]
