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
    "block_causal_video": "8dfe83c3136b67b21abad7d2e43f4e8c618c96ccdd34d9821fcd4a8cb47b7ecf",
    "block_causal_video.lin": "18bcf05cc105ac6986994a0ef7a773b7cee9cc12bb792dbd89bbc81863b3d943",
    "causal": "5ef9f169c5fbf6d6f6d9d506c49d98b555050ed4de3e15a30d4c0ec4575a1697",
    "causal.lin": "ebb47124cb8c18d1cc700a272205454548017736c227514f5b6164df5488bccc",
    "chunked_causal": "feab68fbc1a05953e1f065c35461466557a6da31db00954d1480dedfd1ec5366",
    "chunked_causal.lin": "45c39c463cb1897e326c0d91aedd2c4219594b1ea48b1ffb58ed7e901bf37270",
    "clear": "07e39945c86f0e6c8f37a58855300ad201107385de5160e64f615dc3aa9360d4",
    "clear.lin": "339cf3f1c3bb2d147616afd7e8240fad2f42a7afd7e44b86554d70ce7f18f9ac",
    "document_causal": "0aeeba4dec0cb3058168759e08a6c23778b9e8d000772586f05fefd8c1a6786c",
    "document_causal.lin": "e76c1f180622e421946cc1b931a74f666ec0bfa24dd039b708ae52d34fe6d2c1",
    "hstu": "2c3582155c46471db796a584c2cacbe6e7784299279a55ce8fb88a6693e19080",
    "hstu.lin": "a97c5602daa75ba3d5cd9f2743e43d948a17351267872b19120faa443f3a9382",
    "hstu_context": "f6401482f4fbc8153b868cd31f0ffebfa9bc05b7591c12ef161c78c73dbb556d",
    "hstu_context.lin": "201c71b27a071691e4593d940a42e76eb4bfef2eff685275d32dba0ff130c548",
    "longformer": "6b617236b849fead8475eff239d79773387fb21031aa8fd8f384aeb2b1437beb",
    "longformer.lin": "de905ed049df1171921ca2aa93f4e2c0ec4db87098a691f389a557ac6d837c34",
    "natten2d": "9e351ec4870eafef3d9dc62ee4ad89032d820d951f134cd1e6237e866f938518",
    "natten2d.lin": "2db4197f3e1ae69d62f67bb794625a4d3f8fa4124d6015145ba297c812f567a2",
    "prefix_lm": "7c0d64388b36e9c64436d4652a56328c69d7ace7fdac228fee415131a379053c",
    "prefix_lm.lin": "536a613727f8609549ecaff5c648fdb1cde14afdf1693e25c26962aea4d3c243",
    "shared_prefix": "e60632ac3793bb8578803ffdd2f3f9a95274785b440623be68acd8ef4cbe45f2",
    "shared_prefix.lin": "0e22b91de60a59dc1885a43c7e291c39b2ec596cc50c106a5d81e3355a548ff5",
    "sliding_window": "904c9f69baf0299563079c038ae7f5a0b482388322e86f2f3b800c807ffd66b3",
    "sliding_window.lin": "266c1ffe2e287a74f00f29bde354e475b3463720e2eb83954b4d67c3020f6e1e",
    "sliding_window_rt": "760d7342e0bd851bce3951c7275eaa272a2c93fbd11fab8071d9ec3622fa1e77",
    "sliding_window_rt.lin": "b8dd3e0e2b5ea61eff9dfe22aec287c5c82450991dba73738e8ed91e5e29af19",
}


@pytest.mark.parametrize("key", sorted(PINNED))
def test_forward_source_is_unchanged(key):
    stem, _, lin = key.partition(".")
    path = next(p for p in SAMPLES if p.stem == stem)
    opts = Options(kernel="portable", backward=False) if lin else Options(backward=False)
    text = back(front(path), opts).text
    assert hashlib.sha256(text.encode()).hexdigest() == PINNED[key]
