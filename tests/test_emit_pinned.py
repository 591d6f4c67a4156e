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
    "block_causal_video": "170a451362a5552e4915df7cb26e597c65132626c3d98497f11d23124dc9caf5",
    "block_causal_video.lin": "49f2938419e6c6ab116ff708e5b49096ad478f953f15e1863d28d25cedc9720c",
    "causal": "5e441e65b92d749225bc3d3e453c30367d05dec44f99f6bd5eab3fde34e0276e",
    "causal.lin": "2fdb238abaae3e9b23599aec05318b7d7aaa9c7c7ac7b2f309bc104a141228d6",
    "chunked_causal": "375cd1b42e1b6affd9247af50a090122141d056d7fd732a0e598c6df9e575826",
    "chunked_causal.lin": "70e0c8af92c70cce3549640584f2d2d407d3c04632f17e46e66c2a773772580e",
    "clear": "8af152bdc1abad86681b7698214e7d8caf4d9e362171ed33927040c63d5bb058",
    "clear.lin": "73e9b6023217c57ae98db2413477f6b1134c1772c6b039a0167e4fc966712281",
    "document_causal": "4504a53fc5009ee7116204a3be929c4898d49d191129625ceb27c8a79b9959d6",
    "document_causal.lin": "b76effd240797428beb353993b60f9b995f4ac585efd56feccf1dcb62864dab8",
    "hstu": "44eb8fbdaa0027ef57ccb864398fa45e1e22f425833fac0251e4e41845f74a1b",
    "hstu.lin": "463047101c00b7fe29c5b3bebf839230fafa6241b819f9174b2719a1cd7e2c6e",
    "hstu_context": "14483e6155187a4ab43e602eb3d80cc67e896e43f4282ff50433904a9655c800",
    "hstu_context.lin": "70e35f40daedec0a20c8b6337744eaba0bd10cb7b4af33090ea69dd10ce9083c",
    "longformer": "3f16fb92e8cd434cca9c6b15c6652adbc3bb4eaf27538ad59a92359c19c46322",
    "longformer.lin": "1b67fa86889b048eb5bd24d204526a0de9ebc6df8a3d48f417390c57bc26b0fe",
    "natten2d": "d1c79d954d4f0827e2806f355257dabb9eb2fa2d288877fa380960f95a97c8d0",
    "natten2d.lin": "c604a4b09552dea691c12b06b5ed1e9de40c6b997e2c5272d5d48c5a60bbe6b7",
    "prefix_lm": "2e043e9f61b7cbdee80abd3a54590b10755a13d2ce9c55d20a9d37eb059e93d8",
    "prefix_lm.lin": "c9a68d21bd200199ffc43deb6c7f9c2a41d5575d8388bbcda780187f59edbe9a",
    "shared_prefix": "84ccc845bfa68992272ba435d5a6d729f5c8e2bf761090beb42c92b6c415d5a9",
    "shared_prefix.lin": "5f692a5dc7d56354b68fd26b9e405755400a3598f9663ce2f35388ccbc0935d6",
    "sliding_window": "2771ad42d8998d4fade55b97fabd4cf3bec68e85fb8d9e2779087cfae3a62f71",
    "sliding_window.lin": "1f631acd7fb97b4558b79df2bb09040ebbaebe0600595fb676286ce6de3428a5",
    "sliding_window_rt": "38062384a10a7018a654ba1a3f22288317de4994d8fe4f070f32db16c9b132aa",
    "sliding_window_rt.lin": "fe3f82136c578fd067403f4367127c19d87fa956a2f18a2337e904fbf9367055",
}


@pytest.mark.parametrize("key", sorted(PINNED))
def test_forward_source_is_unchanged(key):
    stem, _, lin = key.partition(".")
    path = next(p for p in SAMPLES if p.stem == stem)
    opts = Options(kernel="portable", backward=False) if lin else Options(backward=False)
    text = back(front(path), opts).text
    assert hashlib.sha256(text.encode()).hexdigest() == PINNED[key]
