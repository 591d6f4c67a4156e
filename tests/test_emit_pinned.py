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
    "block_causal_video": "f1bb6d7a9b26ee99a239ce665f437d61400b5b0103574c1fd5202005098a00d0",
    "block_causal_video.lin": "8a9fd4755f10415b15293f885eb34e6b968dbd2d5da2ecd4571a2b6d60cfcc36",
    "causal": "ef7a0f83687755c36a41346c2e011e17292017b6cd8046aa03561e45cb9b5dfc",
    "causal.lin": "06cb7681dc7515d679dc4cb8deae97fb10a7ddcb13d7ca9f13a9895104d2be86",
    "chunked_causal": "87b2125f4a062dd08ddac4818d3a3cb14ad0ce2fb5ec79cf6a2c508095a05fb4",
    "chunked_causal.lin": "9d08edcb1c0bfa56a589fbafc16917bda60f3a3ee032a1c117cdb82e8177904c",
    "clear": "447c94f87e403838825d74f923c79e3f5c0423ce9dcaaf8e3f3990593d84c39a",
    "clear.lin": "6527581b0018cefd207f2fb4dc0571b5a3a5bebdd17ec599d38eca010727b42b",
    "document_causal": "d14130d6bb9a74015e734e0d4ce9d9e3c7d086293c7011a61736231a12ad3561",
    "document_causal.lin": "cda08c70b88eb01f02edddce861d718b1ecdf0885fa882e48be39ed0f9ed57f4",
    "hstu": "625f36ea329ded23b17db1bc9240ee5a21112e5a5fe85d9dff24607233c8608f",
    "hstu.lin": "f4ba575fe0aba949c7566d7cf4d6ddfc7b7fa477cfd19ab39949d0f3ecb2f357",
    "hstu_context": "879b179cc7e9260b5785b3a1861174debc36e7c59d424c62515430b2592274bf",
    "hstu_context.lin": "965bb828a1507a7fa9a4657f3829ba549ecbbf1b3dac89ded6ba3bac939650ea",
    "longformer": "39550e3cf0820582ddb186045e976f665aaea545fa231887652b89a9b91ba9f9",
    "longformer.lin": "79ade64ac4a0925d482d473ce1d2d001451c5ad7464f2dfbb5e62f3daa9b9833",
    "natten2d": "65519c2a98e5396d2d1765a0dd3c4fe831dfd2b9653c35d6152a3422b3cda548",
    "natten2d.lin": "375d7f2256a7231f644d6c1bd48afa0f7040201f2b66fe9d80cb65e404d09d06",
    "prefix_lm": "ee7b1af72ab944fe4825e3bc5821a4b8313e109bdf20990411b38e6e76e13d35",
    "prefix_lm.lin": "7dcb1cac383bea1511b9109686ccb1c79da2a655cd6d38cd35f15297c26dddd3",
    "shared_prefix": "db086a517037c3991035ccca908fea1aa8be463b571db8de299be75594042617",
    "shared_prefix.lin": "fc17f51225824e9d81f71ee29f508eda1781c2acf07d891956fec6fdc70c8f17",
    "sliding_window": "f9b673e4a4bf73fd95edacaf7e67d223243033d9b0b05831cb11a359b5eb7026",
    "sliding_window.lin": "e0bdffd2c59ab7575d089454390976ccc1f37bcaad4dd2efc9e7b72952c0eb57",
    "sliding_window_rt": "afe5f0c97239a35312974e82737230717c3492557b27df826073b47ed411a06e",
    "sliding_window_rt.lin": "6c360b25a5c1743795b7768dada58f1f20c01dbf7a7589b5fdf742e049822b51",
}


@pytest.mark.parametrize("key", sorted(PINNED))
def test_forward_source_is_unchanged(key):
    stem, _, lin = key.partition(".")
    path = next(p for p in SAMPLES if p.stem == stem)
    opts = Options(kernel="portable", backward=False) if lin else Options(backward=False)
    text = back(front(path), opts).text
    assert hashlib.sha256(text.encode()).hexdigest() == PINNED[key]
