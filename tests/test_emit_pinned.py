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
    "block_causal_video": "ff27c95157d4932c02b4845dd0174412eba06da958503aef105d0830ec7d499c",
    "block_causal_video.lin": "4ea078e1b437ac9adb753c6c88538cd66d78dd9ddb75d29a58a4c401a52ec4ff",
    "causal": "2a78edc4e6dbdb1b2d21a3a20e07acbba28e718eab4f56cbe17077fa890ee8ef",
    "causal.lin": "25a3f479296feca086689bad2395f0fb9bbc646b606c6354d1e8954cb0d3a515",
    "chunked_causal": "15be4ecd977f1312ec27e6eb928b78cb254dff1cd55dcb5ba8dfdeba546776eb",
    "chunked_causal.lin": "c7602250fbe2af47fe0c44d907f310754a1599793260eddbcff9410913eb8c56",
    "clear": "af96dff0cf2b9975cb4e5d7cfdfbc21b019f4e2703d42a67f9d9cd4e70f28b34",
    "clear.lin": "309f8509b04f8616eb9a308c8beaea90238630505d37066f02cf30c8ee863cfb",
    "document_causal": "f61e724a052438f4649f03f111ec99497f0fcea6ca8469adc3ae1e231d0d78e3",
    "document_causal.lin": "81d4e7522ff9d997ae861f468faba7fa37523dc8e863ff1584f053664e8c59f9",
    "hstu": "71eee1c9fec2edfbb8cd2c8f5668b673469b895040a87814cda6c37c8d6ca87e",
    "hstu.lin": "59ba7182c32ac6ef8feaad5e924fa523ac3098c82d97b6e0a0d2735a3272e8bf",
    "hstu_context": "cbfd57f4f43a037daf4c9024db6630d5f35c362d6c077ebed78da2dbb5ec0371",
    "hstu_context.lin": "4e7659c14f1c509e64cb4a4ecd072e664616511aea2eca8b4bb70b27d63d3ed9",
    "longformer": "288344b04e7a64eaca4d7758141f34c69cacc43d0f6e8689ab9d855081688644",
    "longformer.lin": "a5c85873d26ee16f082ffc66a6499a41feca41cc4efa2f629fd0d95cdc971014",
    "natten2d": "9eb00e3fdb0902dc3bb88398301b9199198b5f46fdbd097f3ddd4527b1966078",
    "natten2d.lin": "3b98c1eb9b072bd8c0b508f0a30ecc0fe0dac3a3a39e2cae5eea6b351106d9ce",
    "prefix_lm": "5d5c9142651eb222b6ad4d333fafbbbf790f5db0f584e0d066e0d5b0ed1af7bb",
    "prefix_lm.lin": "cfd4b234072ee5d644f3fcbe5cdf9384c67beadcc42d0ff36e27f80f2dbce565",
    "shared_prefix": "5983d1fc0a86db9cac6b5c58e10baabe41fe1ef6d99e8257f683f070d778eb28",
    "shared_prefix.lin": "1a5b7b5b3c756c8f81d0eef821502d292d4e28a15f0cadee27cb55a2bd08799d",
    "sliding_window": "0ced5b3c0b5acc13f468729688c457cee0368b24613b26ffaebfbe050fdcb170",
    "sliding_window.lin": "c51470cf73ee4ed89d1d8025ed58b4602439be985c6ba9575e88aaa283249eac",
    "sliding_window_rt": "7243f6aa856d1884abf688d3e4e520ef930e4cc452f1be9df8f474fb3b577245",
    "sliding_window_rt.lin": "6e6b350f7c542022c7fbb4b7dc118676c3e110fb9172cb7b98f95780cc5b478d",
}


@pytest.mark.parametrize("key", sorted(PINNED))
def test_forward_source_is_unchanged(key):
    stem, _, lin = key.partition(".")
    path = next(p for p in SAMPLES if p.stem == stem)
    opts = Options(kernel="portable", backward=False) if lin else Options(backward=False)
    text = back(front(path), opts).text
    assert hashlib.sha256(text.encode()).hexdigest() == PINNED[key]
