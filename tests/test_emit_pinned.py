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
    "block_causal_video": "1ff4699196e77a0c9b49dc1a291b297ea029f986e2dd2984cdfe6939a82e20e8",
    "block_causal_video.lin": "744553991970f3c729b8fbcdac004fc24e728f98b199df09bb645ea4d48a4225",
    "causal": "4231b0ec3f3581e361161713e10ec081303fbbe57e0c517adbd7cb6598f906db",
    "causal.lin": "1b27504342b0a1308dca58f07ac9f4734c542490eeb0bf352d936f6333eb26ed",
    "chunked_causal": "6b1fee42dbf9e839d334e345381c25d81826cc7495810e926cbe5a812d04023a",
    "chunked_causal.lin": "fed7b83410c75ff84120980e84f595c359cde93dbb601bcb02d54b52a5ad6432",
    "clear": "c7ca4b6d2a135e9490f61559c269d85d433fd5a818c7b8cfd73860956b25991c",
    "clear.lin": "2995e663518805bad5c8f6d801fedb51473c7500e8f74f3021d4047200e5f2bb",
    "document_causal": "7e66e1d6cf634b15437837fad3d910f14c1d565f6bed556baa7d0f1a46852aa4",
    "document_causal.lin": "e989f59468cbc70347f7ad9bfaf017f93d4e4c83fd50ce89a5f1c9eedaf77311",
    "hstu": "8f2d31b1b3f6b4d676d9d25495a9d0c7b70acf15582e51d4ea96b651e09e8632",
    "hstu.lin": "34b04428da90097420a28c906a0300e47962d0fe5dd58dc52991c7f9c50ba08d",
    "hstu_context": "9a988f972741863b52b4aad65405c558e32b64889a663cce8414894694f116fb",
    "hstu_context.lin": "a1204620738418a9ddbbb5ff2c7083434740d0c905e1e2f8b6aa960e5050817c",
    "longformer": "419b609023c4265070f74d283ee9ed6c4c4fe24c8eee3255f0e401aa8a4525d8",
    "longformer.lin": "0129d61930a926fafaacf5cfa2870eba64eeab1db3e841e06bb917c31a1bd1cb",
    "natten2d": "9c884fcefd578445c73c34096d5233f8926b9fe70ac33facc34ed9d4aff7dddf",
    "natten2d.lin": "93341ea463c2ed98406d80fc906583128de5218875c263c30f21ff16da6b2a7d",
    "prefix_lm": "ab4ce7eb5b0017ac7410a68523ff04764ef84297131726056ee08f396cd8c8ee",
    "prefix_lm.lin": "c00b0125fbf9770f0e0aaecf0f9b267d5dbbebcabb150b4ad11019cf12818124",
    "shared_prefix": "653e009dc179f2729ec508fabd981055ef598a30f0dbf126a9617968ef27dec2",
    "shared_prefix.lin": "a0d158884a6ccdbb5f208dabcb1d71ddf7c17ee3ae0c33ddfd19474730b347ad",
    "sliding_window": "727ddeb3fea1a5ef9ec84e39987424415604a46afdb2a73b3ad72b4dae87255c",
    "sliding_window.lin": "4b2add9d9b76a9d1487e1d90b3dcc94c6a30eb6c1a8046f5366856db9e32286e",
    "sliding_window_rt": "bc3bbc7e1882a25ce4fed7eec2fb0303f1adc0e876aa7e97ad6cc030b885258f",
    "sliding_window_rt.lin": "a1344c8316892d723e3a5d110898c1232f7425d2fac9361e6f74651bc31c0f11",
}


@pytest.mark.parametrize("key", sorted(PINNED))
def test_forward_source_is_unchanged(key):
    stem, _, lin = key.partition(".")
    path = next(p for p in SAMPLES if p.stem == stem)
    opts = Options(kernel="portable", backward=False) if lin else Options(backward=False)
    text = back(front(path), opts).text
    assert hashlib.sha256(text.encode()).hexdigest() == PINNED[key]
