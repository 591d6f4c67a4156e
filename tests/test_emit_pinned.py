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
    "block_causal_video": "70b50fbc854955b68e52f6c5853f3823a26bf55a970ca10662a504b2c7b26f18",
    "block_causal_video.lin": "14d8986b41a575319a24ab7ecb3b8f131a4d57f5912754393d9daf42cea3f297",
    "causal": "411a847979c0055c4f5b5735e8782b4652b48502d80d31526032ce83cc39e7f0",
    "causal.lin": "bdb77ba61adf246f6c6f040d1f362f3933954d2ae73fcc9adddeeb79469811a0",
    "chunked_causal": "0b2072aba48adc9f0bbeabd516908d445be0a117e69f6b5c653d0b25dc9a3d26",
    "chunked_causal.lin": "38ba4c614e4a5d81e2966c3e3ad7a086e8669de47ec5708b395da1a4615f0783",
    "clear": "50cec9ff97c06104a9ca2b209f59aa415ad4ea9ac33bd4713fdf9cc85089e1dc",
    "clear.lin": "91a0077cad49ee17d625895b8c2018c05a4e5ac38d582810d0273b56663d045e",
    "document_causal": "86ad0f454b7d02f3ea586ca3bef002d0a4cc8689427c0fa4b4bdb074980700e2",
    "document_causal.lin": "866d2929c7b59a45e55ad2b4dedd7df5a5b8cd0e6de5f7dd4d01a8bd10e6601e",
    "hstu": "81bb2b5e4a2fdb58529a34c1d9309839aeee1b93757f97e2d4e2af305b1cdc05",
    "hstu.lin": "4a0e23a29ca85b04ce6f2bedebf21f4897c3b763b4f1b32ff45e0fab824cd14f",
    "hstu_context": "dbd806e3abfc77b503281eb362b3f82ceb1021599de7298a01c3bf25ea00efd6",
    "hstu_context.lin": "3b1c47aef5903547da28e797ba4be898978bb5a7630fc063fa81ef8f9816cab5",
    "longformer": "3f5ae65191262c1d9a629d54e2af89950eda6acb66fa60bdc1b2b9c5b385741e",
    "longformer.lin": "2823163a752530a597462c99cf1e7796c2e3e7cb62661c920d85c67dc54a4df2",
    "natten2d": "30a883a33079c011fb69503abccd50d10ca7af72386ee1dc1903beeb2a38b6b8",
    "natten2d.lin": "ea18459b4a67b253917bbb196325f1bbe8296391238a75059d466652cb4be85f",
    "prefix_lm": "415941d95fd916524644d2162b512e9648c3f656bd536f34a6836f1dbd706fca",
    "prefix_lm.lin": "15ed4223f341e754818633cb6965415d6c0cab4d4ad3b815e4db21741355ebc2",
    "shared_prefix": "1b2590810ce804340cc28dd54003055d1d09c83101d73edbc12537dcbbd0fc71",
    "shared_prefix.lin": "a94028684c270912d2d936ab86c7cd3862d64d3ca38086d5746611a23fae2b5e",
    "sliding_window": "035eaa56c347f430023335643cf778402fc314c3614a17bb164ab7f059e32002",
    "sliding_window.lin": "6ee96cbf002cb06274c58ab7a77a7d7af298a80c7e71ceb8d3de77324a2a7850",
    "sliding_window_rt": "0fd200f7789b612bd98eb73cf999599c271797fa203033562ed9d1647d6a8ece",
    "sliding_window_rt.lin": "f8711e0730c5e9533574802fd5905d99827ee527a53cfca9682787175f19a8c9",
}


@pytest.mark.parametrize("key", sorted(PINNED))
def test_forward_source_is_unchanged(key):
    stem, _, lin = key.partition(".")
    path = next(p for p in SAMPLES if p.stem == stem)
    opts = Options(kernel="portable", backward=False) if lin else Options(backward=False)
    text = back(front(path), opts).text
    assert hashlib.sha256(text.encode()).hexdigest() == PINNED[key]
