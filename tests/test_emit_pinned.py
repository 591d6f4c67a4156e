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
    "block_causal_video": "f4c14afbac53003281f98747a1e038538df6a94a4b919e747845478a953699aa",
    "block_causal_video.lin": "f982558c153bba318d27a65443ce35becbb538363bd993b680582b9270c984a3",
    "causal": "87fcfaf67dc0b29250502e06089ed98e7891fc847f37d53fc4066ac568f9fd09",
    "causal.lin": "aca1f46269d991a7cca23ce90da6c9cdd44077439a123f39a75e0bca14324cef",
    "chunked_causal": "7078032c347aa89fcf6d4fa53f081ad881c012b43821b4b2b4c40443a99bced7",
    "chunked_causal.lin": "28922644236a0452fefe31985c7fe114e481d5b4f01212ff3ec13435734ca131",
    "clear": "fe048fc3b3353df8720ccdc39e4c99cd17cf0b24cbcb473d719b29f44c6c4735",
    "clear.lin": "9e10566d7efd48c5a2c24e23f0f6a23c59df6f01d27c580e4ed6afd8ea68e0cd",
    "document_causal": "f9e04fc1b501a2ae01901c4e3d077487cd6b5052d8a0ec1c66b9b932b7c58596",
    "document_causal.lin": "03fac0d357c2bf8f38a5f471733fdcad11671eda849dcb62f8c84f144d5c36e2",
    "hstu": "c4a7a33bae28ff14c8e3dbeaa28b29f7033acb7070fe89e8b84d01d79966eb73",
    "hstu.lin": "f1b7c7ac75d3884047c8ebe01332c52e7b97adb7ee30909504f0e5756f5c15dc",
    "hstu_context": "6bb0c388afc24d9a6739ec7e5653fef40f4b45ca385bbdbe223ec2ca4e25e570",
    "hstu_context.lin": "673144cfabdea722210f380a83083a196b90d319fba64804e2c14b207a746ee4",
    "longformer": "1dfde600d02445c47c8a50a3aa9f52875b0da4599024c79d1a73c8eb88561b17",
    "longformer.lin": "0fb3610aa1688bd2c64b06a1a35a3db986a91eec5542c5ef578a8bd82c074e1f",
    "natten2d": "3be293110f63092a22b65f5e84f6e4ad8520ff8c29059b3748f70dcb7f4fcc20",
    "natten2d.lin": "ec8b7ac47f3a8a0c173e9282b14b6efa3b991ad2ef76cecb36eaeab657b85dca",
    "prefix_lm": "25ac7dfdc86e8aba3af2fea7baf94bdcd95c2078bc8041daf30197bcd05aa94a",
    "prefix_lm.lin": "1017e22ab3001d08f64f3bbcc853d71467e97975fafa2127c5bfbd06bf822276",
    "shared_prefix": "1e14d65bc6b5869e6545a886666bce92cb9d04b2bf1be17daae0b79d234ad8f3",
    "shared_prefix.lin": "6da9c420cb6e58b0a1e151b9a4be956439ebc632dbe0c9661e5844c32e5b3f33",
    "sliding_window": "27eb6602d4c5ad21b548efdc890e2692a178f946942697417224c8f29e8b9117",
    "sliding_window.lin": "80f2efd732815e25b6996850d70a17edb76b4038c1388de383d785f1a3495f56",
    "sliding_window_rt": "1669ee8dd288815b756ec4af2cbe44d7d43ab97b64e3fd3e0dc0f4ebbd9513ab",
    "sliding_window_rt.lin": "40fd5692bf84b621c522d16ffe6979e7e676b2c338f60aab05e7c004e7b1a4e3",
}


@pytest.mark.parametrize("key", sorted(PINNED))
def test_forward_source_is_unchanged(key):
    stem, _, lin = key.partition(".")
    path = next(p for p in SAMPLES if p.stem == stem)
    opts = Options(kernel="portable", backward=False) if lin else Options(backward=False)
    text = back(front(path), opts).text
    assert hashlib.sha256(text.encode()).hexdigest() == PINNED[key]
