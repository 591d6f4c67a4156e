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
    "block_causal_video": "df79e30398d77767ee63d396911fc902a660d287a7fb6e3bc50a4f0b6bb35953",
    "block_causal_video.lin": "4484ca92bd1e639b1117b5978db278d390a0db3875487da04913f08a302b442c",
    "causal": "4b8efbd14b0159498e7e6ebf0d2d778b2f8b75e70a2cb9ee8b97257b2ab22732",
    "causal.lin": "86f4509e7f2dbd0b88504d0d9f69b67262c1bb1432c12a6c541e7488610eb6c5",
    "chunked_causal": "3a1cc9d86f75bc57f973fb68455f7b523ead4093e096af93cc800dbe2db77d00",
    "chunked_causal.lin": "7c50c12763142c83be31af69ed01374e79f2974feafcdb82179316146db9bc5a",
    "clear": "e5ac8a403d02635fa13984ebbabd5c28e353ab5545029d3604637ea1694236ba",
    "clear.lin": "dd07f25e54d1ddb6b69afd2287b5d46682d1162958cd7a62ee2fa652af018825",
    "document_causal": "86faffffa1c8ede1b333874f69b73fe17619b3a0d358ba5d7ab94100f23e0339",
    "document_causal.lin": "82b65d613b92ee5c5b5c91ceaf843b3cec780cff810c9914c6c823eb96fd8d68",
    "hstu": "f3f3a4957b14a233823ab45c1dcef4cec139ba19d2ba2b306c46ccc698048475",
    "hstu.lin": "264724c7c8f6f0ae4430c152d08639c69ebea0724722dd56e5158059e2c89272",
    "hstu_context": "0d0603402a998c3b5b7e1f8a4a81859c9204ffb15cb03bd8686a1aee0ab5b6f8",
    "hstu_context.lin": "6278a9b21ca4655ba708c5f00356c44731e83737d30c141de31558dcfb724115",
    "longformer": "701bfc063c9469f2c7993235bb98b0b515e83c8ff7d0721f438478fd785e9881",
    "longformer.lin": "be973f37c934a44392a9eaa1af4e6628c6f11aa39e2dd65bf27feccf78216880",
    "natten2d": "db606985f14c9944d4e947cc896060416cf7cbe330fee3ec23e2758d149e0721",
    "natten2d.lin": "ee38f8675d7d82509f59f365697388e56cdfef6b0c3e5a7ae82cde755f8a5f6b",
    "prefix_lm": "786694d0f51fb25de989724e8b5fb2f6b06b7f5beeab3dd59ed91edbd5e0b418",
    "prefix_lm.lin": "6fa25d601dfd5c5057688d678f13cfcaf5f6504e0d4decc9a44c96aa8ed2db98",
    "shared_prefix": "00bfce64a873b1dbcd2f385e0ba419283c7e3899573dff74c7a7da3ee2330e17",
    "shared_prefix.lin": "99c97404bd70893dbb6242c5f4101ff96ebf15d6949c0451d08ef9c12e2d0463",
    "sliding_window": "d5d699f252511ba5d210eabad3b0c096f9ec06ad07c476d3b4cfa92a08172f6e",
    "sliding_window.lin": "9ca5a09eb854e949fdbd1d1d7e3f8a2fcf4028fe0d00e483773ff5c5fcb17980",
    "sliding_window_rt": "1112db1a4d9e16043f8e5f2ced9772d3bf6788835ee210a03dd6b6db04c21fe4",
    "sliding_window_rt.lin": "632cadd17bd8faa6ce825c3a72459213a4c5d0cb012eecc0fd1eedfb70d91c9c",
}


@pytest.mark.parametrize("key", sorted(PINNED))
def test_forward_source_is_unchanged(key):
    stem, _, lin = key.partition(".")
    path = next(p for p in SAMPLES if p.stem == stem)
    opts = Options(kernel="portable", backward=False) if lin else Options(backward=False)
    text = back(front(path), opts).text
    assert hashlib.sha256(text.encode()).hexdigest() == PINNED[key]
