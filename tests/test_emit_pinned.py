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
    "block_causal_video": "510047b075e8db014c2d683ac9cbdc37e1aac0be7c7085a46a1411e84729a907",
    "block_causal_video.lin": "400754c72068aa1a5aff5d4b13e511757f60e5729dcd4b6c2f836e0de589b4ec",
    "clear.short": "7a8f2a7acc0c010814f639c8ff7c2fe8d5a0f70cb7bcb4f4baf81e44f012c0de",
    "causal": "7d1d16c03e6cb588b12263130b7210eb1715320b880ff0835909849e7a8f1a45",
    "causal.lin": "25a70673c984ba5423e9a45d5df6cdd87ddffbfa29d2e9ab65ebabfe06394407",
    "chunked_causal": "f82806696a7ace3cacad4e997cb2241a1e85cf5bfa671da31462e8a8677d8af0",
    "chunked_causal.lin": "da1b7412452a366f3e0e5777e947bb5c2d423fe4ba00482fe86b5bda5a4df54a",
    "clear": "105cccd199edaec839b86bb746dac5277df0beab5bff8ed61260601850771f05",
    "clear.lin": "bc3d41c8b121d75aac4801ceece343404ee0f2f43e082e544b8b7b934d3e9c12",
    "document_causal": "f79353f4e89fc9b9d72cd39b603b873123c664dd0206ab83714a23ec42d6ced6",
    "document_causal.lin": "8d0c6c2bae8463b073fc1af0e4b9d1bf3f1ab4a1b58c7a993579f462cfdecc56",
    "hstu": "0f8b6c25a4b57095b29a54c45b98ff353486fb8b7e9077886420c761a5fd0c34",
    "hstu.lin": "b879ec69ca660da08ca76aafcec3c99a9a954e3b774246e4f01c771707858649",
    "hstu_context": "98c8e52c93f1c1ea253b66053c542572167efac79e3f1e9182866777b8b316e8",
    "hstu_context.lin": "c7635625101fd25b40d00b013023fc927e0a3c680a032fb16479680a715be6d1",
    "longformer": "3418e690634d2acc1d1edc8f59624736075a6c12d9a893a7de6f5c244d5de9d8",
    "longformer.lin": "ab744d8ba8f347549aea152781e8152f4ac33791f46d1932e49343a5e33ab3d6",
    "natten2d": "274822a383bdbf5ffc876e87854b00c0e56581d97a00e50aad3817e101d9fccc",
    "natten2d.lin": "60217a5c4bb911f359f0edce4585da3b6445c6332d6ffa580710157e79f62c14",
    "prefix_lm": "b5f8f7fe75b2190b294a238e485737d5f14fdea8b23f29aa1c099623d9525b0a",
    "prefix_lm.lin": "8cf334e1e9c979ac3a44d146ced3f5a7fa7647ce2d144547c0a5a9dd9b72bf19",
    "shared_prefix": "1726e418fc1950229869c9485855db3a7f4a94b17dea37d7fb2c4437a30f7734",
    "shared_prefix.lin": "b59d4a1678d945a65240af03ea594067e8569e9862dd04833298748183f05f02",
    "sliding_window": "ec46729bf51cf6ecb72065c7ec04dff3df324807c42d8ecefbdbce75083e3dec",
    "sliding_window.lin": "4eee28b01244d990af7d51b5442be04311b317c831ff5bd9bea7e9345ef27495",
    "sliding_window_rt": "5a9b87e4a91cec30df26c4dd4d9742e1c80a8ecef79859faf99cce7238929205",
    "sliding_window_rt.lin": "466c5a1905903065f276ec1674e15c069588ce6b8d556dfba7263e702caebd0c",
}


@pytest.mark.parametrize("key", sorted(PINNED))
def test_forward_source_is_unchanged(key):
    stem, _, kind = key.partition(".")
    path = next(p for p in SAMPLES if p.stem == stem)
    opts = (Options(kernel="portable", backward=False) if kind == "lin" else
            Options(backward=False, short_kernels=kind == "short"))
    text = back(front(path), opts).text
    assert hashlib.sha256(text.encode()).hexdigest() == PINNED[key]
