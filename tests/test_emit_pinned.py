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
    "block_causal_video": "df372397e39ad740ace81034a54017d75e62e44e5876976895545b416c106687",
    "block_causal_video.lin": "5201dcdef9d4147788a6ebff16d1e3452e3d858447745e8f47183ce4dac69c7f",
    "causal": "fbd9df1e8dc38521b536802755337e26e312fc3f66d6fbae4d3d067c7d8894c6",
    "causal.lin": "6e42e846c1ba548944db7bc3f7a500a6279c15d4509d73924a0c00c00edfa1e8",
    "chunked_causal": "bb1874052202d06f4301e89d9ef4d708a20d4a13b84c241be151e0bfa7d0946b",
    "chunked_causal.lin": "8280b04cdf604b30cb02e47296d5cdbbf4c342fec43cf527658b5e5118931ab2",
    "clear": "23176b6141e6abca729400994a132e3c0eadbc65f411200174661a3492159d37",
    "clear.lin": "5c92ffd7361641ea13daa06cc5586899b0b794952e4df51b8ac19c24f7497bcb",
    "document_causal": "514c133dd471f9bece137ac4c90fc1b291d2b966e259f8e077345d1e09164a6e",
    "document_causal.lin": "8d258cd5f52dc877d5e12b90d6dbd5de7f840e612442d9cffdc98c8ad5ce8d6b",
    "hstu": "b6628a3d812320701a754890074b12125554c2a50131778236c4d5a3789ceaaf",
    "hstu.lin": "d7a19b295ee444a4d3433225da1745c7dca2d8b038d6738808f5edae92f17db6",
    "hstu_context": "9abdc8d75e250b8e768ccd96f8178e372d0cbb45ee7ccb8b5476dd8239c607f2",
    "hstu_context.lin": "54745c250f651b35145900856effdf70ba50993c25fcc93debf789fd0651d011",
    "longformer": "16f86de93332e60111cf40735e5cca03d9b45b9fc36285b8ab740b6186cabee8",
    "longformer.lin": "81f21cbcc2541f712b743b625e2f9746e3dfc6b07bd29df65c9f5376a34b82fd",
    "natten2d": "f6682c0af9952c4338900c6e23907ea76a54989318f0ccc5d4a2da867dd27dd6",
    "natten2d.lin": "8e90e3faceb93e5793f3fb4368a67fe4b839dd5d0d8a4de2e7aab045deb6f3fe",
    "prefix_lm": "0c66c99a9f03d0028f33cf0a871a4b3502a50ef5415277fd3ec571cb07d250f7",
    "prefix_lm.lin": "5a77aafc1bc24600c7420eff61221071ed3ccab6be1e086b1070aa4c385838fb",
    "shared_prefix": "4951b6f67c4616bc463d9f4be3c088e68f7e7e21664f0028213089f3692daca4",
    "shared_prefix.lin": "8789988bd5b63877078d458f50fa15a246ec2daf0077d8e8ac228e714dbd42ea",
    "sliding_window": "5a5189ae5ca3735876807609fcce8270c852023121d7d67fe51e9e3520dab134",
    "sliding_window.lin": "0c722fc2e537ecbc75b8c6451378818269ef3f7fd8c7a7c3d5740936e18df930",
    "sliding_window_rt": "d8f439e6efc4483ca30d1c8cffb19a948dcc4922f3b8c35d9317cecba77ff75e",
    "sliding_window_rt.lin": "c0eb9ef3616a88c70b99a2b02c20624c5808cd553873612a4c3056b297dca0b1",
}


@pytest.mark.parametrize("key", sorted(PINNED))
def test_forward_source_is_unchanged(key):
    stem, _, lin = key.partition(".")
    path = next(p for p in SAMPLES if p.stem == stem)
    opts = Options(kernel="portable") if lin else Options()
    text = back(front(path), opts).text
    assert hashlib.sha256(text.encode()).hexdigest() == PINNED[key]
