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
    "block_causal_video": "28ed019b3478601266d5213bd996ba8d7fea456f2242ec880f19a4d92a721293",
    "block_causal_video.lin": "2bce48f391957f9f39695aa92bd418f17d93a596dd5ffc5164dd0b32937930ba",
    "causal": "14c7cbd232411e8116f59fad8c9c54b4e01b0b42a08aaccf81c40494a6b787d9",
    "causal.lin": "fae239ddd54603193a27e6d5596521fedc9507a3ffc6e073f0405e8fd2995aa4",
    "chunked_causal": "088519112fb07a8ea2dfd9d7d049f96df6ad2dcc2560f112ed92b84da2fd6b1f",
    "chunked_causal.lin": "9c234602479f27863a255187518e144a015535a26ae50de13f6b723e4395cad1",
    "clear": "bcbf08f98fbab9076509e16a87bb834bb6e6dd503e741cdc8f94994cd4710444",
    "clear.lin": "872a330e84b2d0fe2fdfc0b26c208a21576f4a096acd7fd917da85a51ce3a9dd",
    "document_causal": "b4e61f43339c6895c54ecc7388d74d02513b5f6c98c1b5844337c5d9d4d7973b",
    "document_causal.lin": "41d78d806134ac69569653bd247e8ad9d0a7fea05621619ad9c080f409103fa1",
    "hstu": "0e748604416d9984aef5c24becf91977fef6bcc9db1cb688aad5f84991b18a94",
    "hstu.lin": "663b30a1802062211f6256ba6d06931ffdd54254a548db274fb0dd3aaa5e898b",
    "hstu_context": "d642feb962bbb9ed349a191989f38c72fa11f4d8fd3ab3bb7ef598b099b61d3e",
    "hstu_context.lin": "4cb337db2d12eed6021f7050c6838930d27e76ab8b0a671e6e86d8bd7a5afe71",
    "longformer": "b6e4c1710ebb0f10a60a48fe0b53fbb99823e9efb1815920faa7e257896f12d3",
    "longformer.lin": "3512fa241cf988519186498a9a520cda4b9bb6fbed2d1e49022b420e3724365f",
    "natten2d": "143d4c522013955490b71ea1eb24f2060dc97e76813a0c983a0f2327c1a246fc",
    "natten2d.lin": "0df7ea852f05ddd902db917c288bd29d98aa303075e2a651b4e869cfff8ec235",
    "prefix_lm": "c5fdb22d03158da25599dfde2f2b9028b011c088f3702a9e40745188cedbbe9c",
    "prefix_lm.lin": "b4f911cac5d7b5ab16ace21a647ee18cf66c5fc7bdcc898f83c852fe4d6d0977",
    "shared_prefix": "c133d6382b6c6d2189cbc7eaca199dd0704fbec24e4acdfe8cc4aec900e45296",
    "shared_prefix.lin": "a82f2eed08ab1a2388ec4ed00030fe7ef7f939113515197b6d6c731e6fc0d219",
    "sliding_window": "5a446109f728f0f7b217676840dd27c6cdb6fe0e60b78d5a6fa03448d5b279e4",
    "sliding_window.lin": "f41aae8e5c251fd21c31b038157ced04b696f6b45da791d2c3a4715c4ffd7d08",
    "sliding_window_rt": "242b509f22590e6fb3623d3f4ef6ed0ab2486029aa8d68a9d42a314088af8f9f",
    "sliding_window_rt.lin": "d4e3f36cc70e6dde2afdd6461da919cc8726e94ca564b3eb3764cc5ea271b4f0",
}


@pytest.mark.parametrize("key", sorted(PINNED))
def test_forward_source_is_unchanged(key):
    stem, _, lin = key.partition(".")
    path = next(p for p in SAMPLES if p.stem == stem)
    opts = Options(kernel="portable", backward=False) if lin else Options(backward=False)
    text = back(front(path), opts).text
    assert hashlib.sha256(text.encode()).hexdigest() == PINNED[key]
