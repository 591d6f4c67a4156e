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
    "block_causal_video": "7bbf5df3544200a2dfeed4aaea968c08fae60c03fd8383a456b3b8eb503406c6",
    "block_causal_video.lin": "6ccdeb99111b2a853f42413427977f3d9ed0babdb57ef3e84539828f62e8a616",
    "causal": "267f263ddffb60364dd252ac6091910de152f15a3516454da833969ff60c5ffe",
    "causal.lin": "5f2ba4f58fda4c7ac8680cdaa650168fbc34b2d2de27e9d2ac06c249ae547fb9",
    "chunked_causal": "7843b0d52b030de3b27650a05491062c8abc42beaa2c244250e0b3884cb30e39",
    "chunked_causal.lin": "44865de905f7c1ccca0e9e1ade54fd0d1dd287f9dcf47fe38dc84c0c5d1943c7",
    "clear": "298bb66e31c702266de2dd472a6a5c6fee4e184261b3825f9e23939ae72969f5",
    "clear.lin": "4b27fb271156dd07c48693c23b541b994416cf4caa4c739fc62308c6f60697b5",
    "document_causal": "ec7d0a514126cab0ad4aa3babb15f489f340746511efa3ad31e4a4f9a46cf876",
    "document_causal.lin": "9efc7d432788847454385f131ec6b9cac41b965c0e56d0874323ee2b2a988fe8",
    "hstu": "65b098631bc84ae447e0af203862b31132de781985e7aff7e67a3d8944e21bdc",
    "hstu.lin": "6a5f881d735a6407ac6dc37b6dfa6e22b0101358ec4941f6124fc7eb54cc230a",
    "hstu_context": "c6d33f5b73c99e74df1b5611a6118616c5bdc61e5286f01a726b77dc66745a4d",
    "hstu_context.lin": "d2ee844cfb704739a7583f0b5c0e2504c0d2c501342255e1023c0186823fa634",
    "longformer": "9a8915b2319884f56612d59fd83a4dfd3011f0e5789165266bcda24d3f5fe175",
    "longformer.lin": "631dcee9f568d1afb8e1729b8e4ec2b2d20add8d99053469bd54074a99de0dcc",
    "natten2d": "bc5db673630f3855ae371c32b602e1f5d2dad630a988903c4ec5773651ff1a3c",
    "natten2d.lin": "a156141511897284a9d8601bab78ce4b62ffce563a64afcd60e5b3d79b8725b8",
    "prefix_lm": "50be2f24d626211eff6ac741c0eec533517e67fde42eb392e7bd8179d0d15c80",
    "prefix_lm.lin": "a84d40eeee1cd558b67979a429e17d75ef7ce01b38a9c54a5c5079de9f5e0bb9",
    "shared_prefix": "7db62616441b956fdc066f1daca3aa99d7ab587dac679f38940ba977a4ef50b1",
    "shared_prefix.lin": "f3317c0e1676f5806ae8c967554848ea17e14391a5a10c2242b0962647a3879e",
    "sliding_window": "ee2a3f66c5c310988f7becffd0cfdda1cdb344bfee0296af142da86c26094434",
    "sliding_window.lin": "4fc873e62150a301c28ccce51e97b41afdd65f300df5ea353a38792ed63788a0",
    "sliding_window_rt": "008078a8c6dbabb21b04e9b6ab9245763292d45f762c6f953d6a9b0fecd512fd",
    "sliding_window_rt.lin": "f2cd8e9a3085e47b07abf80d342590db4edf75701ba0728ace38e752aee5f0bf",
}


@pytest.mark.parametrize("key", sorted(PINNED))
def test_forward_source_is_unchanged(key):
    stem, _, lin = key.partition(".")
    path = next(p for p in SAMPLES if p.stem == stem)
    opts = Options(kernel="portable", backward=False) if lin else Options(backward=False)
    text = back(front(path), opts).text
    assert hashlib.sha256(text.encode()).hexdigest() == PINNED[key]
