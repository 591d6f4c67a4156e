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
    "block_causal_video": "65fab63b7dec178d0c427aa7390b454bb1f962ad3941824a17cf32afa16e43b9",
    "block_causal_video.lin": "103107ea7e15a53b33324b3ff7fd0ae97f01ef126dea3f9afc3e78955364a7d4",
    "clear.short": "fa5c3bb48531d32871c3afd3a4677b24a51f4d18b9daa172d7e20c4b839c187d",
    "causal": "ee415dd0f580a3f837488064873d456bea17bab03ebb3ce3278ce0757aebb3ad",
    "causal.lin": "85eccb053e451902e1dd1e5887a362e41d1c378292d322bf21323c99ab66ef98",
    "chunked_causal": "0648d65d9908da9d9f3ffd0e43322df9b9ec49cd913ad19c8cf14162c9f50306",
    "chunked_causal.lin": "05556a9aa40d700239e496fcb3e0531b116be42c99f1d32bec3dbeb2fbab6fcc",
    "clear": "009f15b34d62d30b2df1c8fa747ca9fd91ed3bd031c6f3c65fe1315ea2b96994",
    "clear.lin": "107fda54ace7741b0fa5b5209323524e47688e35e4bf831554222163f8d451df",
    "document_causal": "dd33d28cdc29d2db497f2237522ab78e85acd0b0353f8867aacf357dc23a9af9",
    "document_causal.lin": "819eec2e79b95b55a7f7c2036b46681cd152d7785bcaf845282b70a71dda4630",
    "hstu": "6c08d1ac7c7993c3edb8aa020d5ec2a30aa1bed119fb5c33c63f595535717f2a",
    "hstu.lin": "52c48053345900935821330e6bacd13e311db37276dc98b1b938f1729642f68b",
    "hstu_context": "eff3fc0c11ba2a4d94b33b1ac8e3cc1049aeef6ea8c3a8739f63d809c50fef45",
    "hstu_context.lin": "2f90305275f8a34e597a68cf04d12952541bd6d065e3dfd364fb9514be5d5911",
    "longformer": "d14d2f71f2900c7ba1202e9de2928855a10ef2795474912c64cb2cfd9be13446",
    "longformer.lin": "369d23f01677e96ee6fdd3c6ef3dd46984c0894df7411295b156eb824b124926",
    "natten2d": "0f622304088cd0bf5bbae300bd4dd432777610a7169d78aa7f7bca3f65d88e62",
    "natten2d.lin": "cebdd6334c4a60e87da4fdb210fb59dddd1062d53cc0b176f14342de0785232e",
    "prefix_lm": "7e66218e99e4823bffa9c01ae1ae7299a4d080bb61c1105451ff7544f5db67dc",
    "prefix_lm.lin": "1a0dac0ee858e8193ace53ca6fecf2d0609314fd75e852e1503678f09a4eca37",
    "shared_prefix": "5a408e8edecde9f3ed495fa43f397bf9aa92fb74454ec0fae8a7c7a8402c75ae",
    "shared_prefix.lin": "63102cee08c36cdec4ac4f620e6a5f09ccd6ad635c099664825d7b7ee3362ea0",
    "sliding_window": "b8482db642fa9f4f69514c6303c4a58cdbb446efc71e7beec40570e5e44a96f5",
    "sliding_window.lin": "83e669165e24e59cbb64a63b5659e6d0b35e54866d48b00e081cf8a9868eeaee",
    "sliding_window_rt": "1cfd4edf4f27c8ce87f7d737893258cb852c933e4d693dc8c28acdc78d026699",
    "sliding_window_rt.lin": "4ddd642a4482559a0d74d011e97fececff49a0bfa51cb702f915f95f710c0031",
}


@pytest.mark.parametrize("key", sorted(PINNED))
def test_forward_source_is_unchanged(key):
    stem, _, kind = key.partition(".")
    path = next(p for p in SAMPLES if p.stem == stem)
    opts = (Options(kernel="portable", backward=False) if kind == "lin" else
            Options(backward=False, short_kernels=kind == "short"))
    text = back(front(path), opts).text
    assert hashlib.sha256(text.encode()).hexdigest() == PINNED[key]
