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
    "block_causal_video": "60008b7402c468893d720cbc4c1564bfb42f3c6dbaec005b859e062c32af4ee9",
    "block_causal_video.lin": "2bce48f391957f9f39695aa92bd418f17d93a596dd5ffc5164dd0b32937930ba",
    "causal": "347e4dd3d40703a08c4a75296dc4907691ce1195c455f9ed8a73cea13f7310d3",
    "causal.lin": "fae239ddd54603193a27e6d5596521fedc9507a3ffc6e073f0405e8fd2995aa4",
    "chunked_causal": "70fcd3398d7d753080e821c1c6cbbea0edf68d20445f7d49a1a6fe1e6ab54aaf",
    "chunked_causal.lin": "9c234602479f27863a255187518e144a015535a26ae50de13f6b723e4395cad1",
    "clear": "fc5a9fccde4d98d93d525478fe9fa183f4813f94c8c517eabccbc50ed1de1417",
    "clear.lin": "872a330e84b2d0fe2fdfc0b26c208a21576f4a096acd7fd917da85a51ce3a9dd",
    "document_causal": "4841b0342abfcf453202460d86ea39ac4aefaea209cd8cb119ae66c28064cb82",
    "document_causal.lin": "41d78d806134ac69569653bd247e8ad9d0a7fea05621619ad9c080f409103fa1",
    "hstu": "3fdf24183a7e9223d931c373826ccf1847e0a5f469596238fc773eec29794426",
    "hstu.lin": "663b30a1802062211f6256ba6d06931ffdd54254a548db274fb0dd3aaa5e898b",
    "hstu_context": "f71efc8d75fdc13f91160f48d424d8fd1e186a61ea7b91afeca7d967f9eef213",
    "hstu_context.lin": "4cb337db2d12eed6021f7050c6838930d27e76ab8b0a671e6e86d8bd7a5afe71",
    "longformer": "3bf4e61813d33d6a19bf8a76924fc11326c9dfcbf69940f8f61ce0259235bbd6",
    "longformer.lin": "3512fa241cf988519186498a9a520cda4b9bb6fbed2d1e49022b420e3724365f",
    "natten2d": "eedcf5956fab317dfa74b6fdcb71249b0253cba2ed9a620d16a49e22bdc5364c",
    "natten2d.lin": "0df7ea852f05ddd902db917c288bd29d98aa303075e2a651b4e869cfff8ec235",
    "prefix_lm": "4b7474945500f1ad1d88a2f2764c45e7facc54fe304af77087d8f3f48b0000ec",
    "prefix_lm.lin": "b4f911cac5d7b5ab16ace21a647ee18cf66c5fc7bdcc898f83c852fe4d6d0977",
    "shared_prefix": "33a361a747f004ba5943d4da4914e5ea989ae41246d092e54ebc766debe1bfb4",
    "shared_prefix.lin": "a82f2eed08ab1a2388ec4ed00030fe7ef7f939113515197b6d6c731e6fc0d219",
    "sliding_window": "cf376e4cf8ed24acee2ba2248fb4c65c0aaa02300fef2b07ddbbbca741ef0fbe",
    "sliding_window.lin": "f41aae8e5c251fd21c31b038157ced04b696f6b45da791d2c3a4715c4ffd7d08",
    "sliding_window_rt": "45993fa863c2c39f97b4ba02ffb60403a2e966ba2f8c5381d65fd57c26af239b",
    "sliding_window_rt.lin": "d4e3f36cc70e6dde2afdd6461da919cc8726e94ca564b3eb3764cc5ea271b4f0",
}


@pytest.mark.parametrize("key", sorted(PINNED))
def test_forward_source_is_unchanged(key):
    stem, _, lin = key.partition(".")
    path = next(p for p in SAMPLES if p.stem == stem)
    opts = Options(kernel="portable", backward=False) if lin else Options(backward=False)
    text = back(front(path), opts).text
    assert hashlib.sha256(text.encode()).hexdigest() == PINNED[key]
