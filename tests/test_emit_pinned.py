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
    "block_causal_video": "194b5a8d9886550948bd0e2ad3297d7e4cbe9c3a03a0616363e094c87cdd917f",
    "block_causal_video.lin": "744553991970f3c729b8fbcdac004fc24e728f98b199df09bb645ea4d48a4225",
    "causal": "0d0b1096256f36f3fdc495a713e0ab997fbab42b5126741d7968ab7a5b618b98",
    "causal.lin": "1b27504342b0a1308dca58f07ac9f4734c542490eeb0bf352d936f6333eb26ed",
    "chunked_causal": "7aa97c9938c28205d86853f74047fc2939da44a78f9dd01fd66c86002d29ffba",
    "chunked_causal.lin": "fed7b83410c75ff84120980e84f595c359cde93dbb601bcb02d54b52a5ad6432",
    "clear": "e79dee4c5ede8f4ffa67af56aebb25344335314201c728948228c753836b4aea",
    "clear.lin": "2995e663518805bad5c8f6d801fedb51473c7500e8f74f3021d4047200e5f2bb",
    "document_causal": "27a68e33690cbaf452e3dae4d621a763320abfcbf4464587a635427b26403204",
    "document_causal.lin": "e989f59468cbc70347f7ad9bfaf017f93d4e4c83fd50ce89a5f1c9eedaf77311",
    "hstu": "11b7d8e6e61fcf5e1a855efcabcd2dfb6a03a67802a2c222beb89c2637f543bf",
    "hstu.lin": "34b04428da90097420a28c906a0300e47962d0fe5dd58dc52991c7f9c50ba08d",
    "hstu_context": "3fe443e863ca9bffa2cc4310054dea5462ebe24f9656b6c38e863c9b58ee4667",
    "hstu_context.lin": "a1204620738418a9ddbbb5ff2c7083434740d0c905e1e2f8b6aa960e5050817c",
    "longformer": "b9f180293dc31d29e153f5bb104d68473b83b915d7af6cb05336b5b2343530bc",
    "longformer.lin": "0129d61930a926fafaacf5cfa2870eba64eeab1db3e841e06bb917c31a1bd1cb",
    "natten2d": "1094cd35bf0cc0037ad80bbfa9990be33eaccc916260ddf88802965bd3560f1b",
    "natten2d.lin": "93341ea463c2ed98406d80fc906583128de5218875c263c30f21ff16da6b2a7d",
    "prefix_lm": "f59aca2da62cd3e85f3271761965fac80247aa55af3e304f08a365ea5cadb01d",
    "prefix_lm.lin": "c00b0125fbf9770f0e0aaecf0f9b267d5dbbebcabb150b4ad11019cf12818124",
    "shared_prefix": "53dd5d45addafc25442fb278851092fdfd35b1e494aa88b5cbcc8a98932b4e5e",
    "shared_prefix.lin": "a0d158884a6ccdbb5f208dabcb1d71ddf7c17ee3ae0c33ddfd19474730b347ad",
    "sliding_window": "91114b969adab0f8b6fa5a92ac15b4d08077d0c467f09b24d4859694dab118c5",
    "sliding_window.lin": "4b2add9d9b76a9d1487e1d90b3dcc94c6a30eb6c1a8046f5366856db9e32286e",
    "sliding_window_rt": "00b9add93470ecdae9a3f4253941f99ec2e56c376a19eb86a88e1028497c102d",
    "sliding_window_rt.lin": "a1344c8316892d723e3a5d110898c1232f7425d2fac9361e6f74651bc31c0f11",
}


@pytest.mark.parametrize("key", sorted(PINNED))
def test_forward_source_is_unchanged(key):
    stem, _, lin = key.partition(".")
    path = next(p for p in SAMPLES if p.stem == stem)
    opts = Options(kernel="portable", backward=False) if lin else Options(backward=False)
    text = back(front(path), opts).text
    assert hashlib.sha256(text.encode()).hexdigest() == PINNED[key]
