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
    "block_causal_video": "0015dc5ddec62e8993a436f1762307dce41f6a24692d97656e9958e7e7aec50b",
    "block_causal_video.lin": "868b925e0ee5162ea6921f022e513cf3988f60b86507346c1d666934eac483d5",
    "causal": "25472b20cce777093d708b80ce724781913801cd058e3b2c68fce7ccd8229f20",
    "causal.lin": "0cbf73ae083c7f92543d7955eba6b2f891e069e38fa329db1a96342468560424",
    "chunked_causal": "689efac0a04bbaf76ca1fa5d6a0aafd02a5cc3ded091e294a6730fe6e041e044",
    "chunked_causal.lin": "3944d8597e6c0bf8fb3af5f00eeef702e24552ca7629f560bed06aa7a3744ccd",
    "clear": "0c82a3523d28de792653166f46e640f83b0da8015f55297c0915d6b876f6f012",
    "clear.lin": "7d17d7c57087b83dbc19de022871c18de3bc45019acb5f1af8add57cdd911eb7",
    "document_causal": "4185cdbd701d87d1701287c86efce5b5e50044fe16a6e4b855790a0ceda871fe",
    "document_causal.lin": "b25399295af32664815252767fcf1617210f4762299cda4d241c25198b6d0692",
    "hstu": "292af4c0934a7569aded2e31d6c2f06397cf51db059cc299c02438e75a256cf7",
    "hstu.lin": "b188096d0eec1ff37fdeb00422971b858118c413db7d5632112064f679d36d6d",
    "hstu_context": "052ae191575d093c08aee6ad3861834aaab64ea8cc2abc8667ade58b67ab17ed",
    "hstu_context.lin": "9e39fcb643cc000b945bf3f14e50c96eefe88a2e689bf29f654ee464590b1cc5",
    "longformer": "05beb4f9561fdf6bcb8dd9afb41f7e9d1e6b2f2f6889621a49e9131db4faf9cd",
    "longformer.lin": "e68a8e235a25454975532880a3065b17debbffa6323ff673babef9d4d19d0736",
    "natten2d": "d674c28db677a39a48dd173ba5c146bd6f32941bc9d7bed4109544ac570780a4",
    "natten2d.lin": "4d3975102693171ad9c3343fd146c9e7b15bb1092e6957eab751a3324d46867a",
    "prefix_lm": "12187a2cb9aee538c7ea91771eab2059c16cb85463a5af5cb495104f0da5eab1",
    "prefix_lm.lin": "f4ec3493f0ef44e1c7fba697b429b1a4ec113771105c7c8a51ffd554286fbce9",
    "shared_prefix": "5475c0b481e41e0a0b6363a2b5facbd10f0e2e3e6595a32fe734b022f017306f",
    "shared_prefix.lin": "4a0d970c6c355762888a70966202e1863de3efcda4b9d842ec505d3585e0a194",
    "sliding_window": "4a6d1df9e16ab7a7240622ae6fe40322c99e4537908bf9e59f16c25a51e3e816",
    "sliding_window.lin": "fee424afd12666b1c0ade1233743839e61693511d81234a55871980da126a2cd",
    "sliding_window_rt": "524976f298e70c927459ed62108224adfc28fb2838f55c94888a2d9a67469282",
    "sliding_window_rt.lin": "7bc229662ab068f37d46ae1575fcd79235a59342ee9ad0d03593bffc9147b644",
}


@pytest.mark.parametrize("key", sorted(PINNED))
def test_forward_source_is_unchanged(key):
    stem, _, lin = key.partition(".")
    path = next(p for p in SAMPLES if p.stem == stem)
    opts = Options(kernel="portable", backward=False) if lin else Options(backward=False)
    text = back(front(path), opts).text
    assert hashlib.sha256(text.encode()).hexdigest() == PINNED[key]
