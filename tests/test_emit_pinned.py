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
    "block_causal_video": "7bbb41f52ede5f2e19aec83b8fe994bf6d191d039dd86cba7708acfc3124b5ec",
    "block_causal_video.lin": "e0402bfb65e6539e0039850e7b1ba061041afa0a20874d839b8e5813da6c1ee0",
    "causal": "c447b9b2103bc17a0d307a07e030fe70c19515565e859a522d0aa76d497dcee4",
    "causal.lin": "ffcc5d1bd360f9159ba280f147d48f908a401229726c40da8bc3dda6600e746c",
    "chunked_causal": "e9bb880f93d886b46828d7fc4c9ffa31625055e9081c4fd453799e1f379c81f8",
    "chunked_causal.lin": "f5e4b83310cd5f0cdc5d99d78c27fbc4504f4786335ff4b6ae15024717ca0b92",
    "clear": "a2f84fc9002845d968f6d946bd7d8745d8ec835aca7e1d0b21605bd2ec755682",
    "clear.lin": "c5afb18641d249453cfe04e30a8b954935878e2d00e1ab02a958c8f1bbfef760",
    "document_causal": "ede4cd050bf63dd50b0444ef55a6e104bdde4656289fab6803a0535ef6ecbee6",
    "document_causal.lin": "79d918939b289745e8740e6a8d00e7537541b18ffa0f21f1ae9b5306b5f6918d",
    "hstu": "02224feedcc648e6525679a322541d5203c9d2c5119b43d52100abae4aed721f",
    "hstu.lin": "60de574e9b033af08aa522e5621d5d3dbd518451cd9670d383a6726da2bd5051",
    "hstu_context": "937a1eb54ce3d919a5805b8c239d58ce523e210604098e61712ab191edbf9156",
    "hstu_context.lin": "817c54613f7e85bfc7fc268137db4860d28d1ab89cc05583afe55c0ee5cc2a18",
    "longformer": "fce0109b14b579c7b254695e118b668765312c071f31bc4d487531629b06fbb7",
    "longformer.lin": "b9f254b6a1627aa128e3aed51f3c843afc75f5e8c8939b2e9e7528f4b8c63f6f",
    "natten2d": "a8b04ac85413381d092ed6afebc6821f6b54411a38cddb316cdf648aa6407a95",
    "natten2d.lin": "6a5145b2f7873e5cbeffda59fb960b69771089deb3752ab4d342bdd2088b3f38",
    "prefix_lm": "04865c7f34086495acfb053452a5bf47213e742a313e45b26941d2f1755cbc8a",
    "prefix_lm.lin": "8237fff6c1edb30ab1521a526eec33a9cee485cfad010b641c2d3b524a272952",
    "shared_prefix": "811c0bb47e3894ffad7d97b3ec2f5c88647a909e8cf73a4c89ee98c7ea46a89d",
    "shared_prefix.lin": "baf441065341ba0ff137565e106e3c3e50d95601145c35b459daabdc93ef809f",
    "sliding_window": "36e087db66b06881e0e5f853e2141ca55d143537ee30aa289932ee86ca24e08f",
    "sliding_window.lin": "d3a6bd756b4fac09283a99f51c6057035712c82a7725693d8b0ffb506b03f132",
    "sliding_window_rt": "17cdd95e77478e5205f9f8bb13f2bec54f0c715a380f967615eb7eaa596d06c0",
    "sliding_window_rt.lin": "91162039456e0f477fe113dec6d0ffde5203d33ddd22e84cad6b46fcd6cca950",
}


@pytest.mark.parametrize("key", sorted(PINNED))
def test_forward_source_is_unchanged(key):
    stem, _, lin = key.partition(".")
    path = next(p for p in SAMPLES if p.stem == stem)
    opts = Options(kernel="portable", backward=False) if lin else Options(backward=False)
    text = back(front(path), opts).text
    assert hashlib.sha256(text.encode()).hexdigest() == PINNED[key]
