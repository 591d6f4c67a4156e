"""The forward .cu of every sample, pinned by sha256 (default options, and --kernel portable
as NAME.lin) at the commit that moved the hook struct into templates/hooks.cu.j2: the
backward's additions must leave forward-only sources byte-identical. An intended change of
the forward source updates these values in the same commit. They pin the sources without
the kernels for short sequences (--no-short-kernels), which leave the rest unchanged;
NAME.short pins a source with them."""

from __future__ import annotations

import hashlib

import pytest

from cmc.driver import Options, back, front

from .conftest import SAMPLES

PINNED = {
    "block_causal_video": "efffb0522c35102e78407a50f88983f512f2fdd91ddd5a378e73eefd8aec22e1",
    "block_causal_video.lin": "a6ef98617627c57aa217085d9d21343d0e319996081a0f63bee8d093f1c322d1",
    "clear.short": "1cec8aa5a151cd942e3deee53274bfbb3ac275bf9b86c86e013fa1abefeb1185",
    "causal": "856b71b9e00dea0116ad67afba4676eb956284585adda23ffbdbf17a055dd1d0",
    "causal.lin": "84a0940381725621eed59d8869817e020de1d4e6684b0a2ef1a90f85a404f5d0",
    "chunked_causal": "ec2177955d3580c98ff3a7e2d7d1577505759b4233e868d7e18dea05fb36e257",
    "chunked_causal.lin": "a0c01929688dba14401c23723ac151b52c65b4d45cddf15a0b417eefd9473951",
    "clear": "5a7427aaaf0a884b6bce93482c074489c5565e7700b8284f867bbcb848fec772",
    "clear.lin": "02a54e1b7a6659f54180a94f5bc397ed1151f9ef49c5c0cd65456bcfa88aa244",
    "document_causal": "214fee81e9ff3e46858606d5e421465d3e6ef42bffc61082783467a5f7f55a50",
    "document_causal.lin": "48234455615f904f04cc36aa8ca8e28b656db5f729df67b347ea3d33603531f0",
    "hstu": "c34c3acb33f9d4b0f53b075f92f0dd52050c9616c7ab44e6fb32a15049c90e11",
    "hstu.lin": "944b6435a474998c0c6c5caa36061c31baf83d82f81bdd6118cee0803ab05316",
    "hstu_context": "17487edaa68de03efb4ae9118845a692caef4ba1e0c57a4d1cf3503d33cca272",
    "hstu_context.lin": "d1f5938b5485eb4c975dc964af7e49c92c71cd8fe6df3e688e2558d7a5a3848d",
    "longformer": "8450a1a76ca489164cc67faa200573ee4755924d93434622a532fdc7134fc318",
    "longformer.lin": "ba35339a07b8d0beef7d7a1553e30a839eb1d99f0f5d38b70e1df38a8e68c381",
    "natten2d": "b3f37eb8bc367b83fdc7c56cd7476ad728957778ccdc4080acd8c82f1272dac3",
    "natten2d.lin": "f9538cf7d5300548b9993319d4acc4de7649809e564a4c75bcb0c86867ba4b8f",
    "prefix_lm": "4f5f15dcefaa346952891d43b322d794bf93aa2559ab0f930ad66343405981f3",
    "prefix_lm.lin": "8505ead85c3608b0b57657494963464056f95a967eed8b3d4cda1bad7136e1d2",
    "shared_prefix": "6736b89c81f528bb930bacf82b6a6bed0cb388f8e7a54e080d98d9cb9f626c9d",
    "shared_prefix.lin": "be1ee19d3ad8c994f16e44b3c75499247c81b759b93491da125bb1480981d5b4",
    "sliding_window": "180a8267d4a0b7caaec7f1bb8dd1abedcbf2b4148e0cef2a8159dc8034edc2dd",
    "sliding_window.lin": "42c0fc03cdcedfd5366dc6d407d91b88f46b325971943976eef0869c169e4f1c",
    "sliding_window_rt": "0ac62ebb8ce69b068e2e5723753eed3f83ceb351cc829f2d462c05e02a38dd2f",
    "sliding_window_rt.lin": "7a56b059e070792923fbd32a311c6a014a7ee2aa0e608365b194a1fb6b005b7f",
}


@pytest.mark.parametrize("key", sorted(PINNED))
def test_forward_source_is_unchanged(key):
    stem, _, kind = key.partition(".")
    path = next(p for p in SAMPLES if p.stem == stem)
    opts = (Options(kernel="portable", backward=False) if kind == "lin" else
            Options(backward=False, short_kernels=kind == "short"))
    text = back(front(path), opts).text
    assert hashlib.sha256(text.encode()).hexdigest() == PINNED[key]
