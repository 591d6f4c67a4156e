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
    "block_causal_video": "0e89aaf84729aca81c595952fd0f3e9cedb770b467606cdfb67247bdef39694d",
    "block_causal_video.lin": "2bce48f391957f9f39695aa92bd418f17d93a596dd5ffc5164dd0b32937930ba",
    "causal": "a7eef5a98e0b70c3be707dc567513e68fed0d8ae21bd5bf179fced0954ebd6b0",
    "causal.lin": "fae239ddd54603193a27e6d5596521fedc9507a3ffc6e073f0405e8fd2995aa4",
    "chunked_causal": "cf6a201d35db014e97811df40813ff3276c3b8b0982f5ecf10b81855ca4350c7",
    "chunked_causal.lin": "9c234602479f27863a255187518e144a015535a26ae50de13f6b723e4395cad1",
    "clear": "33ea328c6d4b3582e12ab5a19f0d70e2ebdec02163d806c2a583446473cd9aab",
    "clear.lin": "872a330e84b2d0fe2fdfc0b26c208a21576f4a096acd7fd917da85a51ce3a9dd",
    "document_causal": "da42b708a5bca46d3ceeb6620369a53af6cc8af38373e90686fc2dc81eb835a0",
    "document_causal.lin": "41d78d806134ac69569653bd247e8ad9d0a7fea05621619ad9c080f409103fa1",
    "hstu": "edfe5658957c873c4ce78c0f752dd5cbe8e14cc9f3c9e28f58eedeb8273488c8",
    "hstu.lin": "663b30a1802062211f6256ba6d06931ffdd54254a548db274fb0dd3aaa5e898b",
    "hstu_context": "90e9124c86d30e77dea3f7e6328461431c3030bce19e69d270b74c5aa6807b79",
    "hstu_context.lin": "4cb337db2d12eed6021f7050c6838930d27e76ab8b0a671e6e86d8bd7a5afe71",
    "longformer": "51ee70abfe0c57e33a354702ba26de00b5a4c09d310d2d1112f1668aae86acc4",
    "longformer.lin": "3512fa241cf988519186498a9a520cda4b9bb6fbed2d1e49022b420e3724365f",
    "natten2d": "292057fa32ca5162d6715afa28d3ee43beb84ad94acce403d65dde025d39ad99",
    "natten2d.lin": "0df7ea852f05ddd902db917c288bd29d98aa303075e2a651b4e869cfff8ec235",
    "prefix_lm": "69fe06d6156d03fde071138ad1627e2f27ba21cdf0a4b6d9041299680b91e005",
    "prefix_lm.lin": "b4f911cac5d7b5ab16ace21a647ee18cf66c5fc7bdcc898f83c852fe4d6d0977",
    "shared_prefix": "7002cdc113d9c217fda65c957bb76219a6f618480cd8ace80bfc462360d73bb0",
    "shared_prefix.lin": "a82f2eed08ab1a2388ec4ed00030fe7ef7f939113515197b6d6c731e6fc0d219",
    "sliding_window": "5457a933dd42d38bf9345cef8cdf24a64be90d1cf4a7e33a06e5dd6ec47f3ab7",
    "sliding_window.lin": "f41aae8e5c251fd21c31b038157ced04b696f6b45da791d2c3a4715c4ffd7d08",
    "sliding_window_rt": "d9c1ca1463255648da4e8ce13b9aacc71ff7a7eb65f152ad4da647a69d53026f",
    "sliding_window_rt.lin": "d4e3f36cc70e6dde2afdd6461da919cc8726e94ca564b3eb3764cc5ea271b4f0",
}


@pytest.mark.parametrize("key", sorted(PINNED))
def test_forward_source_is_unchanged(key):
    stem, _, lin = key.partition(".")
    path = next(p for p in SAMPLES if p.stem == stem)
    opts = Options(kernel="portable", backward=False) if lin else Options(backward=False)
    text = back(front(path), opts).text
    assert hashlib.sha256(text.encode()).hexdigest() == PINNED[key]
