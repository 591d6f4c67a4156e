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
    "block_causal_video": "60d363391079bd38a62adc3cb0c7e36e38406c2f654aecf64c18eac7196ed4a8",
    "block_causal_video.lin": "6ccdeb99111b2a853f42413427977f3d9ed0babdb57ef3e84539828f62e8a616",
    "causal": "94895bca96ec36c452f4f46ce330e08f259caa572524f31a91659b9a9ccfae48",
    "causal.lin": "5f2ba4f58fda4c7ac8680cdaa650168fbc34b2d2de27e9d2ac06c249ae547fb9",
    "chunked_causal": "b8bf6c8de49378fa0b9f9c324ecd9fcccdeaccc6bab83f9017dbc0576a33123e",
    "chunked_causal.lin": "44865de905f7c1ccca0e9e1ade54fd0d1dd287f9dcf47fe38dc84c0c5d1943c7",
    "clear": "124702652cd2c005044b011278eec778a46299a53af10a2b224a6c0a8aafe3b0",
    "clear.lin": "4b27fb271156dd07c48693c23b541b994416cf4caa4c739fc62308c6f60697b5",
    "document_causal": "4c2626076bafe7b4a2bb6ec4c7aca0446839c6d5a30d09cf3ef4a1d97fc52b08",
    "document_causal.lin": "9efc7d432788847454385f131ec6b9cac41b965c0e56d0874323ee2b2a988fe8",
    "hstu": "1948539f18546788921cbabcebfec25e14879ccb3662f61921361028065b3213",
    "hstu.lin": "6a5f881d735a6407ac6dc37b6dfa6e22b0101358ec4941f6124fc7eb54cc230a",
    "hstu_context": "5bc9e54b937034b51e6b0045ebad31392ee901a372eaa8af54605c76a530b429",
    "hstu_context.lin": "d2ee844cfb704739a7583f0b5c0e2504c0d2c501342255e1023c0186823fa634",
    "longformer": "99f650f6c182866725abfa6534c7db1c95b2aaaf56c4423ea942f27444114586",
    "longformer.lin": "631dcee9f568d1afb8e1729b8e4ec2b2d20add8d99053469bd54074a99de0dcc",
    "natten2d": "52c993334e37d208e8bcb3dc2c3ceb3d999ce21da6012424030630cf5a09a8ea",
    "natten2d.lin": "a156141511897284a9d8601bab78ce4b62ffce563a64afcd60e5b3d79b8725b8",
    "prefix_lm": "cee3a0e378a57d2dde82226424ab4329d49e65e15b01acdcedd0ae5af75c3a2a",
    "prefix_lm.lin": "a84d40eeee1cd558b67979a429e17d75ef7ce01b38a9c54a5c5079de9f5e0bb9",
    "shared_prefix": "1acd8f22dcab920ff0c4f27319996f6e84988330050bdca56f46b316d06ad2d4",
    "shared_prefix.lin": "f3317c0e1676f5806ae8c967554848ea17e14391a5a10c2242b0962647a3879e",
    "sliding_window": "1188bb6813c622ec041f9bb1e092194ad6331bf9e914fbc9073c011b77a98987",
    "sliding_window.lin": "4fc873e62150a301c28ccce51e97b41afdd65f300df5ea353a38792ed63788a0",
    "sliding_window_rt": "ed9b2af3f1167c84c23f8567940dd6ed1ca825c80fc3b8fede76748046a5500e",
    "sliding_window_rt.lin": "f2cd8e9a3085e47b07abf80d342590db4edf75701ba0728ace38e752aee5f0bf",
}


@pytest.mark.parametrize("key", sorted(PINNED))
def test_forward_source_is_unchanged(key):
    stem, _, lin = key.partition(".")
    path = next(p for p in SAMPLES if p.stem == stem)
    opts = Options(kernel="portable", backward=False) if lin else Options(backward=False)
    text = back(front(path), opts).text
    assert hashlib.sha256(text.encode()).hexdigest() == PINNED[key]
