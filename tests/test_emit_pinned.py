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
    "block_causal_video": "7a74afc36c66a30d793bede90f1605d37641381137029924ce78f8c7ab6e93ec",
    "block_causal_video.lin": "a6ef98617627c57aa217085d9d21343d0e319996081a0f63bee8d093f1c322d1",
    "clear.short": "752bdae5a9d900d6dcda273d22be6970d327bd22a305912f8fc4fb7ea89c9764",
    "causal": "cbe80510772acc5cf6a711d4fa5b0541209292d83201f362cece22a79c5bfab1",
    "causal.lin": "84a0940381725621eed59d8869817e020de1d4e6684b0a2ef1a90f85a404f5d0",
    "chunked_causal": "d41e00a7c12f58d3d38e3f3799bb518dba9706730f355a68c01d4f478abae5ed",
    "chunked_causal.lin": "a0c01929688dba14401c23723ac151b52c65b4d45cddf15a0b417eefd9473951",
    "clear": "44773c1e932deeb837da8e2b9a89a0e47f73fc252beb6bb63676d6c0ab839f7e",
    "clear.lin": "02a54e1b7a6659f54180a94f5bc397ed1151f9ef49c5c0cd65456bcfa88aa244",
    "document_causal": "59c23e7ca669ce667e4333e4a56d356cf6b400a9ec39fed3bef126d8366bbfb1",
    "document_causal.lin": "48234455615f904f04cc36aa8ca8e28b656db5f729df67b347ea3d33603531f0",
    "hstu": "2fb0f57936ffdfaf273ac249d894d9033a088fe192d57ec33d43649a9aa21e00",
    "hstu.lin": "944b6435a474998c0c6c5caa36061c31baf83d82f81bdd6118cee0803ab05316",
    "hstu_context": "3c522e77501bae2876a54bc2ce0b210085537b4457d7bbc0d48d023017b3b35a",
    "hstu_context.lin": "d1f5938b5485eb4c975dc964af7e49c92c71cd8fe6df3e688e2558d7a5a3848d",
    "longformer": "985815c59c345735875bf44e352f5f4070bd3fb1b192f2941cad8f17926b4cda",
    "longformer.lin": "ba35339a07b8d0beef7d7a1553e30a839eb1d99f0f5d38b70e1df38a8e68c381",
    "natten2d": "418423db845ae33c6c5834208f0964404062ff66b7bc42e34472695258211d12",
    "natten2d.lin": "f9538cf7d5300548b9993319d4acc4de7649809e564a4c75bcb0c86867ba4b8f",
    "prefix_lm": "fc6729effb7f41a96621102ef2e5dd53808225eafc1b4a16a367695329ebed63",
    "prefix_lm.lin": "8505ead85c3608b0b57657494963464056f95a967eed8b3d4cda1bad7136e1d2",
    "shared_prefix": "288ad35cab01a9a2a66e6f0a30baf1a93e87cf1d7a2db720b65eb8a0375a4cc8",
    "shared_prefix.lin": "be1ee19d3ad8c994f16e44b3c75499247c81b759b93491da125bb1480981d5b4",
    "sliding_window": "1133f2817378a266fc03bad9ae641907620c8f92bad0ee9c422d0ca14b9d80d3",
    "sliding_window.lin": "42c0fc03cdcedfd5366dc6d407d91b88f46b325971943976eef0869c169e4f1c",
    "sliding_window_rt": "62a8d0a9601199221599dcd8de24e863f75af2df268ad13c4369a2295a30f01a",
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
