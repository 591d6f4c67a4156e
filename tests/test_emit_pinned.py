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
    "block_causal_video": "db3c7110d38e37745faaa6e2a29102ca7aac753f4253e6bff6027e18d18bc458",
    "block_causal_video.lin": "4ea078e1b437ac9adb753c6c88538cd66d78dd9ddb75d29a58a4c401a52ec4ff",
    "causal": "0f6a5525592ecca834f1f6eefa2079b9395b4462c1f51cd3f509c1264d34dd25",
    "causal.lin": "25a3f479296feca086689bad2395f0fb9bbc646b606c6354d1e8954cb0d3a515",
    "chunked_causal": "7cda27883d1ab55930ccc7dc79292932af5b48d0f8ce2903a13392555812aff6",
    "chunked_causal.lin": "c7602250fbe2af47fe0c44d907f310754a1599793260eddbcff9410913eb8c56",
    "clear": "fbade29ff582f38231ddf45a19d00f330fec430c56be21e7c49f48b532c14d9d",
    "clear.lin": "309f8509b04f8616eb9a308c8beaea90238630505d37066f02cf30c8ee863cfb",
    "document_causal": "d260fbb35061eae6480eb792187ae06b494e7344442ae61fe4c0eb862541e98d",
    "document_causal.lin": "81d4e7522ff9d997ae861f468faba7fa37523dc8e863ff1584f053664e8c59f9",
    "hstu": "f05da96527b9a950e71360668f40279fa19cfb8cb0fb9cfc681877f3846c4542",
    "hstu.lin": "59ba7182c32ac6ef8feaad5e924fa523ac3098c82d97b6e0a0d2735a3272e8bf",
    "hstu_context": "0498297315a4418a2bf48c003dbfa721fcd80384c37b03ee7f793c33f0292e21",
    "hstu_context.lin": "4e7659c14f1c509e64cb4a4ecd072e664616511aea2eca8b4bb70b27d63d3ed9",
    "longformer": "e6aa6d6d4631d61e15799bafba2f2f5d325d5620e6f333f14066adc6a147b7ca",
    "longformer.lin": "a5c85873d26ee16f082ffc66a6499a41feca41cc4efa2f629fd0d95cdc971014",
    "natten2d": "af55af46d4894e3d17c74ef7dba3bce599f7a9e75b16cd1f4cb5041498270f23",
    "natten2d.lin": "3b98c1eb9b072bd8c0b508f0a30ecc0fe0dac3a3a39e2cae5eea6b351106d9ce",
    "prefix_lm": "b940712efc7a6b3c161811afd4b508eaefb4b9d8bc02bc3d18a53df2ddfdb8a6",
    "prefix_lm.lin": "cfd4b234072ee5d644f3fcbe5cdf9384c67beadcc42d0ff36e27f80f2dbce565",
    "shared_prefix": "fab4fd64cdbc4ef87ef4c5e007e72ce27034a1a5ecf8849bf84200d2561da372",
    "shared_prefix.lin": "1a5b7b5b3c756c8f81d0eef821502d292d4e28a15f0cadee27cb55a2bd08799d",
    "sliding_window": "16c0fd200f7a60cf5ee9ff3892edc17745cb34f43da4948ce9f601da3acb766f",
    "sliding_window.lin": "c51470cf73ee4ed89d1d8025ed58b4602439be985c6ba9575e88aaa283249eac",
    "sliding_window_rt": "dbf64b428dd8ee451182817359d13137604a3c1b4e2d6575be67dcd637af37a2",
    "sliding_window_rt.lin": "6e6b350f7c542022c7fbb4b7dc118676c3e110fb9172cb7b98f95780cc5b478d",
}


@pytest.mark.parametrize("key", sorted(PINNED))
def test_forward_source_is_unchanged(key):
    stem, _, lin = key.partition(".")
    path = next(p for p in SAMPLES if p.stem == stem)
    opts = Options(kernel="portable", backward=False) if lin else Options(backward=False)
    text = back(front(path), opts).text
    assert hashlib.sha256(text.encode()).hexdigest() == PINNED[key]
