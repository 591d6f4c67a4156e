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
    "block_causal_video": "79e738c73351cf60d747392092ea5e608d6a945e541ba1247e5d54d95721af6a",
    "block_causal_video.lin": "18bcf05cc105ac6986994a0ef7a773b7cee9cc12bb792dbd89bbc81863b3d943",
    "causal": "b8cb518366f0ad22552b489010c2fbcf844683a352672ccf8ee497272b4c0bb8",
    "causal.lin": "ebb47124cb8c18d1cc700a272205454548017736c227514f5b6164df5488bccc",
    "chunked_causal": "6c25b2edf3e0e886c3e1784b699aaff220aec6d38ff36cc65fc86e22500253e6",
    "chunked_causal.lin": "45c39c463cb1897e326c0d91aedd2c4219594b1ea48b1ffb58ed7e901bf37270",
    "clear": "3cdd2c68a46e02c5d1a2a00f6096a447a61e68b2eccf9cb5bb3acb08267e1a51",
    "clear.lin": "339cf3f1c3bb2d147616afd7e8240fad2f42a7afd7e44b86554d70ce7f18f9ac",
    "document_causal": "1da7a730d0cc0d1807a4ff05371854b9a455dc2ce174a5ba2966e9696e2c0bb3",
    "document_causal.lin": "e76c1f180622e421946cc1b931a74f666ec0bfa24dd039b708ae52d34fe6d2c1",
    "hstu": "20cf5bfda50bd8b2520e129e234b274e547dd7eed12dba9a8aa14884457d8a0d",
    "hstu.lin": "a97c5602daa75ba3d5cd9f2743e43d948a17351267872b19120faa443f3a9382",
    "hstu_context": "37750009c95f777b05deaf61004796feddcb32f83b600c6809eea3c546fc7f18",
    "hstu_context.lin": "201c71b27a071691e4593d940a42e76eb4bfef2eff685275d32dba0ff130c548",
    "longformer": "7aed6c2d1e497e1c26ddea11823beda2895ef4b166c48a70728e29d776e8bcb3",
    "longformer.lin": "de905ed049df1171921ca2aa93f4e2c0ec4db87098a691f389a557ac6d837c34",
    "natten2d": "85958fbb11c5a77aba80c506d5af54fae237713ec2c1dfd814998e8fbb9b00f4",
    "natten2d.lin": "2db4197f3e1ae69d62f67bb794625a4d3f8fa4124d6015145ba297c812f567a2",
    "prefix_lm": "b689c46b51d11f1f80e7b16ec99b64c64173eed838bf71e4cef2e952b9c1eeef",
    "prefix_lm.lin": "536a613727f8609549ecaff5c648fdb1cde14afdf1693e25c26962aea4d3c243",
    "shared_prefix": "52e3fa773c5d2a0c308dbc8068a79b815c5b82c30b212675069b8caf9c3730b1",
    "shared_prefix.lin": "0e22b91de60a59dc1885a43c7e291c39b2ec596cc50c106a5d81e3355a548ff5",
    "sliding_window": "15ee85b4a70d0e8b673435d88c59ec7ac9299ce80914194636e5372261349bf9",
    "sliding_window.lin": "266c1ffe2e287a74f00f29bde354e475b3463720e2eb83954b4d67c3020f6e1e",
    "sliding_window_rt": "7911ab9078dd32f0272e7a4d07700a3b9651e6ab1a7f255e35ed41a1f005b220",
    "sliding_window_rt.lin": "b8dd3e0e2b5ea61eff9dfe22aec287c5c82450991dba73738e8ed91e5e29af19",
}


@pytest.mark.parametrize("key", sorted(PINNED))
def test_forward_source_is_unchanged(key):
    stem, _, lin = key.partition(".")
    path = next(p for p in SAMPLES if p.stem == stem)
    opts = Options(kernel="portable", backward=False) if lin else Options(backward=False)
    text = back(front(path), opts).text
    assert hashlib.sha256(text.encode()).hexdigest() == PINNED[key]
