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
    "block_causal_video": "6ff4d2aaf6d5da6d3339a2cd01ed99a5caff57067725249b5be5a6cecf73c6e2",
    "block_causal_video.lin": "400754c72068aa1a5aff5d4b13e511757f60e5729dcd4b6c2f836e0de589b4ec",
    "clear.short": "1e51eb555c2f5747559e9c59345c70ebc7e1cf4d22ddb1d72e022bc54b130946",
    "causal": "20819c2da56ca0222210867b56d726ab2bd12fa4bfc6698eee3b13bbc5bf2929",
    "causal.lin": "25a70673c984ba5423e9a45d5df6cdd87ddffbfa29d2e9ab65ebabfe06394407",
    "chunked_causal": "547b2c04df2b1fd85c293bebd103d07d59d5f1e6e7c813eb466c499fe013b3e8",
    "chunked_causal.lin": "da1b7412452a366f3e0e5777e947bb5c2d423fe4ba00482fe86b5bda5a4df54a",
    "clear": "a42aa77d37c44e667e0521701a5b1783c3db09404fcd019ca86de2a9b1578104",
    "clear.lin": "bc3d41c8b121d75aac4801ceece343404ee0f2f43e082e544b8b7b934d3e9c12",
    "document_causal": "9ce8b90d5f69257807c71d57fcedf9ff5afc0df3763d0ec553c74b3a191469a1",
    "document_causal.lin": "8d0c6c2bae8463b073fc1af0e4b9d1bf3f1ab4a1b58c7a993579f462cfdecc56",
    "hstu": "7be8f85d216a5aa1db6f84262f3767479b24bd999758e041313bfc07da9b7609",
    "hstu.lin": "b879ec69ca660da08ca76aafcec3c99a9a954e3b774246e4f01c771707858649",
    "hstu_context": "11e6cf34213801d88171a5ff8d87252aba64f9702bd5fd54a6e870bbb2f22fc2",
    "hstu_context.lin": "c7635625101fd25b40d00b013023fc927e0a3c680a032fb16479680a715be6d1",
    "longformer": "45d8fcad171bdacda51b4fef0d912d03006764ce6f80cd610a4add956db32da1",
    "longformer.lin": "ab744d8ba8f347549aea152781e8152f4ac33791f46d1932e49343a5e33ab3d6",
    "natten2d": "b9bf4026d4bec813cb59ab99228394420d338945e1a40f49be33b82ea33c01a4",
    "natten2d.lin": "60217a5c4bb911f359f0edce4585da3b6445c6332d6ffa580710157e79f62c14",
    "prefix_lm": "1342675f09220ea1da9a5cee7a554a504bcee1182b006daa71755d37c6e8ffd6",
    "prefix_lm.lin": "8cf334e1e9c979ac3a44d146ced3f5a7fa7647ce2d144547c0a5a9dd9b72bf19",
    "shared_prefix": "32f754984dea8631950dff98ec19201068b5388da855f35f85730b0e704fbf5b",
    "shared_prefix.lin": "b59d4a1678d945a65240af03ea594067e8569e9862dd04833298748183f05f02",
    "sliding_window": "2a2fec9a5cd52e54bc9f0ffdbe869304f88c2a65f1a3c134172a5e7911da467d",
    "sliding_window.lin": "4eee28b01244d990af7d51b5442be04311b317c831ff5bd9bea7e9345ef27495",
    "sliding_window_rt": "bda2ea0f2a9063a55ff591b15be89add2dd5dff50c876fc2df83b8adb4c2e5c0",
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
