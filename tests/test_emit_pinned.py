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
    "block_causal_video": "a6885c2d86f15c2fe68ed76a7c057861695f68e4c460cac84be7ea9ed0913492",
    "block_causal_video.lin": "4ea078e1b437ac9adb753c6c88538cd66d78dd9ddb75d29a58a4c401a52ec4ff",
    "causal": "c891dbf2b7b294cf89dbcd619b868238339451d306d00d1b681504dbce8d9f9c",
    "causal.lin": "25a3f479296feca086689bad2395f0fb9bbc646b606c6354d1e8954cb0d3a515",
    "chunked_causal": "507c3bd5f201a73ac18852d3f75045ca8764659dfed497180abc66b3a52475c0",
    "chunked_causal.lin": "c7602250fbe2af47fe0c44d907f310754a1599793260eddbcff9410913eb8c56",
    "clear": "02d263265b4fba78fdfe4169ac2b0309539b2c6736991d11a5f2ec1164dd6635",
    "clear.lin": "309f8509b04f8616eb9a308c8beaea90238630505d37066f02cf30c8ee863cfb",
    "document_causal": "91bf7019f62f48d0aef19eb95559824f8c2eeda0dcff8405194c09b7e3efb018",
    "document_causal.lin": "81d4e7522ff9d997ae861f468faba7fa37523dc8e863ff1584f053664e8c59f9",
    "hstu": "4fbfce0712d70d84e2c2da829aee28f3b18f1cafdc5f5dc488099b6ea87c3549",
    "hstu.lin": "59ba7182c32ac6ef8feaad5e924fa523ac3098c82d97b6e0a0d2735a3272e8bf",
    "hstu_context": "eb8b03c379ab8818994d95af29ee3c42bb0b112d33ccaeb2d5649c47a46ae720",
    "hstu_context.lin": "4e7659c14f1c509e64cb4a4ecd072e664616511aea2eca8b4bb70b27d63d3ed9",
    "longformer": "9979ec877a67f8ce071fd5a0ec1fa16ec7fff61cd2a3737452c66b95969fcd03",
    "longformer.lin": "a5c85873d26ee16f082ffc66a6499a41feca41cc4efa2f629fd0d95cdc971014",
    "natten2d": "8cd18af02ca347fcce16f7deb950bf7d58228a7118113fb4fb2a238948dff12e",
    "natten2d.lin": "3b98c1eb9b072bd8c0b508f0a30ecc0fe0dac3a3a39e2cae5eea6b351106d9ce",
    "prefix_lm": "f78eb3b8b42ded5992831627369e3e736b18443b22b01ae28884b07895cb1ac3",
    "prefix_lm.lin": "cfd4b234072ee5d644f3fcbe5cdf9384c67beadcc42d0ff36e27f80f2dbce565",
    "shared_prefix": "9b5b510d8a6273729c68575c149ece6ac37adc300d568e75e75e8642b2752685",
    "shared_prefix.lin": "1a5b7b5b3c756c8f81d0eef821502d292d4e28a15f0cadee27cb55a2bd08799d",
    "sliding_window": "4c2517741b40e435926128c563a16517befb6d26ead89fd872dedc751794f867",
    "sliding_window.lin": "c51470cf73ee4ed89d1d8025ed58b4602439be985c6ba9575e88aaa283249eac",
    "sliding_window_rt": "6c5ef1172c4d01aa9e99519bd8af193590ebe069383b37b3cdaef1f12cfbae23",
    "sliding_window_rt.lin": "6e6b350f7c542022c7fbb4b7dc118676c3e110fb9172cb7b98f95780cc5b478d",
}


@pytest.mark.parametrize("key", sorted(PINNED))
def test_forward_source_is_unchanged(key):
    stem, _, lin = key.partition(".")
    path = next(p for p in SAMPLES if p.stem == stem)
    opts = Options(kernel="portable", backward=False) if lin else Options(backward=False)
    text = back(front(path), opts).text
    assert hashlib.sha256(text.encode()).hexdigest() == PINNED[key]
