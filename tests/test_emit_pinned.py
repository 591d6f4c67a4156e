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
    "block_causal_video": "687f9e2fc3663dae88baa6cf079f7c722147de631c9a3ccc4b1d74a3f84cb55e",
    "block_causal_video.lin": "2bce48f391957f9f39695aa92bd418f17d93a596dd5ffc5164dd0b32937930ba",
    "causal": "1894ebb8b8eca33dfdc06d9e59fb8ffc7973c3512debcc264aba1d6a23c08ea6",
    "causal.lin": "fae239ddd54603193a27e6d5596521fedc9507a3ffc6e073f0405e8fd2995aa4",
    "chunked_causal": "57958d58d657c9e3a9b197df04598fbc5d92e0d9a6a345a04ca2204bb0bbc99c",
    "chunked_causal.lin": "9c234602479f27863a255187518e144a015535a26ae50de13f6b723e4395cad1",
    "clear": "ac21feaae1cfb6c8c23b4ffa2d18424431d1efc584ab32714a42dd88a2851958",
    "clear.lin": "872a330e84b2d0fe2fdfc0b26c208a21576f4a096acd7fd917da85a51ce3a9dd",
    "document_causal": "7cf81228995d416edb66b577187e018bb3070e0cae61c0d2ec95705a7fb16d1e",
    "document_causal.lin": "41d78d806134ac69569653bd247e8ad9d0a7fea05621619ad9c080f409103fa1",
    "hstu": "20ed46b21729f190a4fc1ab0075f8d0a3613643078b79ba54207db921f97d01c",
    "hstu.lin": "663b30a1802062211f6256ba6d06931ffdd54254a548db274fb0dd3aaa5e898b",
    "hstu_context": "18af8e37680ba3aba67a64b84f596e53f0778f99aecd651d29e02df14530b9e6",
    "hstu_context.lin": "4cb337db2d12eed6021f7050c6838930d27e76ab8b0a671e6e86d8bd7a5afe71",
    "longformer": "41c510d4e9adf9b3610daf58db4fa468f2fb2590437df16e77de9533bef8892c",
    "longformer.lin": "3512fa241cf988519186498a9a520cda4b9bb6fbed2d1e49022b420e3724365f",
    "natten2d": "3e18a800962bd365a9bfa4d623deeea34d9313d768f3f75e536beae8cda4f660",
    "natten2d.lin": "0df7ea852f05ddd902db917c288bd29d98aa303075e2a651b4e869cfff8ec235",
    "prefix_lm": "0cf378c08001712777de681c25e3335619ca2a830c719f2c2aa217a42d3795e7",
    "prefix_lm.lin": "b4f911cac5d7b5ab16ace21a647ee18cf66c5fc7bdcc898f83c852fe4d6d0977",
    "shared_prefix": "a9abe48bda5af949ee04e7924c9950d0a43e86882a8b63476741626972d718bb",
    "shared_prefix.lin": "a82f2eed08ab1a2388ec4ed00030fe7ef7f939113515197b6d6c731e6fc0d219",
    "sliding_window": "75644c5ab2ead12dc4287e49354b9d92118a48ae6fcfd18659a6b63cfaf87ebd",
    "sliding_window.lin": "f41aae8e5c251fd21c31b038157ced04b696f6b45da791d2c3a4715c4ffd7d08",
    "sliding_window_rt": "023f7d2495c80ab35011f9001123848aa2b871e3aefe117f3f7373029bb46893",
    "sliding_window_rt.lin": "d4e3f36cc70e6dde2afdd6461da919cc8726e94ca564b3eb3764cc5ea271b4f0",
}


@pytest.mark.parametrize("key", sorted(PINNED))
def test_forward_source_is_unchanged(key):
    stem, _, lin = key.partition(".")
    path = next(p for p in SAMPLES if p.stem == stem)
    opts = Options(kernel="portable", backward=False) if lin else Options(backward=False)
    text = back(front(path), opts).text
    assert hashlib.sha256(text.encode()).hexdigest() == PINNED[key]
