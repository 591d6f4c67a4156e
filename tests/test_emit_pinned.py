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
    "block_causal_video": "657f33a929186686ea357aed4d77830c199b1031242093d55ed5471154e88181",
    "block_causal_video.lin": "f3774266ea1db4106c9e5ef075ffbc25ad9534e381b5a8468e60f4972a483f3c",
    "causal": "a36066411ee36205c942dc9a53d8c820f380a881fcc46c4af669e20ef374a4c7",
    "causal.lin": "95ce89cd51d7a4c9a246450eb2d990d18820b069a1b1e7a9c59ddefe55cd0caf",
    "chunked_causal": "56f2becdd0f836d6f37aebddef02a31c25679c19eada1089cde4c750377bc744",
    "chunked_causal.lin": "d4e198c374387efb0b1bfa07eb721ea9d42368429be83de5550eef8e27921cc0",
    "clear": "dbbc39210071b809a8346b351461605682d0eda471a344dc111327e5207d9bfc",
    "clear.lin": "4c92aeb6a8649e4a7c4f9e9f56ab7a57438627b61dd56bd5be043ad6e56827f8",
    "document_causal": "dcba8c9f71c8feb41e68af537f3efdb875a36a8db2f6f95ce7cc4c13dbb190d0",
    "document_causal.lin": "6ddd41ac666c6471946e9222d8ba9c563eeba3c65bbde3dee579cfc739e78b67",
    "hstu": "830cce6a6750bd5c23413454c7320b9bf0fc349f7dd36fabb5feec40771f6d03",
    "hstu.lin": "6410fc390e8e5931a8ef3577884fb632331f104fdfbb8d51beaf7052df6f0652",
    "hstu_context": "33b9750a87d9a685f861c07b38e6b084e54e0dc48b4e9572e2c02e6fa019fdf9",
    "hstu_context.lin": "adc90d02f7576c5d6ed7591dc28c586b31ea199e09ac1a48d30f9193d02ce031",
    "longformer": "98ffa94dc2f205e3cb50aa9552dc2e0196e2367ce34217b44286814506135fea",
    "longformer.lin": "3c498d0481a7ad1dc7632ba22634f1bdbdcff5e6898a408338f283185d1554ab",
    "natten2d": "1d2a174f92319a0b8ad865d040b3460b3d8b8374d8c42913dab90291c0e03fc8",
    "natten2d.lin": "9418b4ec6cbe360ccdbd2fdab6cf3f0d8d50b108ad62609ac2ea875412c2c4f4",
    "prefix_lm": "98fe4f9efd16dcab577b21a24a89a44061fba727bb0c2f9efdc57621135ba209",
    "prefix_lm.lin": "34be21071ae9b731fad44f605ffb9e816fab2e9334321b5ff9ca29b30b4a759e",
    "shared_prefix": "092831f31f1fa470f56009c6192a80b937be884cf68ed90d8d9824308b140f13",
    "shared_prefix.lin": "85febd0e07e45f85e6260fadfc31e175827893fc037c8d8349128266bb42af5f",
    "sliding_window": "1eb422a319860ff0e3fd21aeb32935a68c6df66a7566b43f53b5520f501447eb",
    "sliding_window.lin": "dc6520b8ca7bfcae89435af730a65e6a16c2fe05aa0db7b0a9951cfba5293c1f",
    "sliding_window_rt": "edc9aac391220a6437fbedfaad44d37ca638eca09438ff8c215d24e732a48ee4",
    "sliding_window_rt.lin": "0e390dc7b5fc524701eab5da6d8391b326e504647e7e64592689b2874036f876",
}


@pytest.mark.parametrize("key", sorted(PINNED))
def test_forward_source_is_unchanged(key):
    stem, _, lin = key.partition(".")
    path = next(p for p in SAMPLES if p.stem == stem)
    opts = Options(kernel="portable", backward=False) if lin else Options(backward=False)
    text = back(front(path), opts).text
    assert hashlib.sha256(text.encode()).hexdigest() == PINNED[key]
