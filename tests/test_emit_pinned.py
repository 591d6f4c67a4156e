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
    "block_causal_video": "709a153f7d0de6e2067ddb70a0b2560fa6ecb841f2d8d95d9a151ef250c064f7",
    "block_causal_video.lin": "2bce48f391957f9f39695aa92bd418f17d93a596dd5ffc5164dd0b32937930ba",
    "causal": "bba27cb5c178a4003e70733d0f1f86b8e6ca5aaa609343f37d1b83a528181821",
    "causal.lin": "fae239ddd54603193a27e6d5596521fedc9507a3ffc6e073f0405e8fd2995aa4",
    "chunked_causal": "15720affcc2c17949faba5ab62205eadbb5c5a99e345153d6a06e53a4c3182dd",
    "chunked_causal.lin": "9c234602479f27863a255187518e144a015535a26ae50de13f6b723e4395cad1",
    "clear": "8bc8ab61dc4185f4b0ff8d77525e1cd971d4ba7680b475b084ef6175f9e6dcb2",
    "clear.lin": "872a330e84b2d0fe2fdfc0b26c208a21576f4a096acd7fd917da85a51ce3a9dd",
    "document_causal": "e75cc3d3bcc98347fb0716135aa845850b5ee721ca710a76e13909b42b40c1b1",
    "document_causal.lin": "41d78d806134ac69569653bd247e8ad9d0a7fea05621619ad9c080f409103fa1",
    "hstu": "17b5a2e289a2a66e2c26b3d76e9c307927d128e8f02046ae6aa30a8c7389a8ee",
    "hstu.lin": "663b30a1802062211f6256ba6d06931ffdd54254a548db274fb0dd3aaa5e898b",
    "hstu_context": "272f9df0b351b8a0befa589c2435d4f1e8f3ab389ce190cca0a25b3addf1f424",
    "hstu_context.lin": "4cb337db2d12eed6021f7050c6838930d27e76ab8b0a671e6e86d8bd7a5afe71",
    "longformer": "0048d8a3da612f2e01a5821b7cff22449d8f9b0efdf4fb8fecfb54c3b184bd9c",
    "longformer.lin": "3512fa241cf988519186498a9a520cda4b9bb6fbed2d1e49022b420e3724365f",
    "natten2d": "704d000e385981c95f2b19c56c454eb3812f8a9e6ba68225dc3a05c97bd2e00a",
    "natten2d.lin": "0df7ea852f05ddd902db917c288bd29d98aa303075e2a651b4e869cfff8ec235",
    "prefix_lm": "f67aeda807b17494c5100dbfaab33078e9607b8a35368a914e9db63f9593e2af",
    "prefix_lm.lin": "b4f911cac5d7b5ab16ace21a647ee18cf66c5fc7bdcc898f83c852fe4d6d0977",
    "shared_prefix": "672658359fc04192dbe31a12a49d1429b11cdadde6742b6a8b5b4d5e2edc24b1",
    "shared_prefix.lin": "a82f2eed08ab1a2388ec4ed00030fe7ef7f939113515197b6d6c731e6fc0d219",
    "sliding_window": "4c915e6e47b60a3482908603d40750f995a4113a516adfb43e3211d8f62d7017",
    "sliding_window.lin": "f41aae8e5c251fd21c31b038157ced04b696f6b45da791d2c3a4715c4ffd7d08",
    "sliding_window_rt": "42e76dc23e284eceb48e8f4de4e79ca3c5c6ff55dc43cc0647d8585a020be8ef",
    "sliding_window_rt.lin": "d4e3f36cc70e6dde2afdd6461da919cc8726e94ca564b3eb3764cc5ea271b4f0",
}


@pytest.mark.parametrize("key", sorted(PINNED))
def test_forward_source_is_unchanged(key):
    stem, _, lin = key.partition(".")
    path = next(p for p in SAMPLES if p.stem == stem)
    opts = Options(kernel="portable", backward=False) if lin else Options(backward=False)
    text = back(front(path), opts).text
    assert hashlib.sha256(text.encode()).hexdigest() == PINNED[key]
