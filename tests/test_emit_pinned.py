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
    "block_causal_video": "9c661ec6171a286ec3a443f1866a7691ae39654113a7d2d5e7ef7193240d1ccd",
    "block_causal_video.lin": "048284c003377f6a873163ccaf61b0255cd5d8ee84d3f6a995132cf987a621e5",
    "clear.short": "a87da339408644e82ddffa533f0cedc8a108c20ac41706451f95f6301acb80c7",
    "causal": "1ab1aa5dc13ab857e966a40b894cf36888c14b59e1dd532c1515d6f4df25ce71",
    "causal.lin": "1fc77e5f2d02e51727f1d75fb5ac409cf3f2a9b0aabaaf0b989f88c4279de957",
    "chunked_causal": "07bcb4a2611eff25c29e1f331c48e97f95bbaff7deb9ffbacb4d76899c7721b3",
    "chunked_causal.lin": "eb6d377769bf34f1d741166360c7ddcc6a95dc5e655759230890b1253d09481e",
    "clear": "05663e7667079931477ffa7fce15182f4c5cba3119373ed7fce4d2e047e95515",
    "clear.lin": "63188146d656cd6a4b32be1577709c24fb0a6fb0dc18bf81e47235d806140c9a",
    "document_causal": "6be495a1d511dedd7b01192478eb5bafefd61f531e06eb3101b1e19d06a13c90",
    "document_causal.lin": "d99e4daaccae30029e7f89d92c6082bde8ac8bdcd455e5e75ae23452962cead3",
    "hstu": "23b9e76e97b168dadd71ce5fbfdace9bae45871aea46fb6576616b5800122c3f",
    "hstu.lin": "80f228b7bd0b1fd94d2197641802eb00a1a9732b7b43c2f6f52c822b079c9240",
    "hstu_context": "4f6336b90a2e6126f86a729c9c5cedda6482fabda57414786072d8c41e69e8dc",
    "hstu_context.lin": "e8e05ba40812c71da09dcf3c4ca6254d906e20ecfb0e8ae1278e3af542c0256e",
    "longformer": "38cef0e0edebec0c90ccb0cb7344d28bc64ec8f61604cb8e264067be2af5d123",
    "longformer.lin": "40807de64b2f9185b08feec7a689a5a939b98a1572670dea797c7d6f46f64678",
    "natten2d": "fb600dcf3d819f0df4e0a6cd094781087b931c8dc5e8f7136b912c32355c445d",
    "natten2d.lin": "f2e67d581d4b976be4390cfcd423c6990ae201f574f4bdf06b323835f3904179",
    "prefix_lm": "772cedc29f080b85bd9a572c53a4e14ca6400efdd4b8b7e9997393cafd741c4a",
    "prefix_lm.lin": "8232e90f8450959d4550ff0084998d6640060d4b436f684f2b2c4c3a02a2b816",
    "shared_prefix": "24e38a5ced52dd18488cf3c8f1c8770ba09b4bce12e85c3ba6bdddf104a30a58",
    "shared_prefix.lin": "0549c3c8cb32cfa8ff0c6740664de3d04a24ad18e2f19ec86679df6fc396eee8",
    "sliding_window": "8f38fec66f25742f10ed4f97e714a2ffa3ba60bbb4a7931e42d9c299bd35a3d6",
    "sliding_window.lin": "e475b5465feaebc058d3dacc5d085273d8a40931282ac56b48bd2fef1a112b34",
    "sliding_window_rt": "db21f96a683c554c7b201f07f2fc18f518f7a1bacaf656f414f92e22736460d2",
    "sliding_window_rt.lin": "fc203d2bc92976d35fea2bebc6bdf6e26f1f7ec5f0e4cb2ae28ab133fd0bcb13",
}


@pytest.mark.parametrize("key", sorted(PINNED))
def test_forward_source_is_unchanged(key):
    stem, _, kind = key.partition(".")
    path = next(p for p in SAMPLES if p.stem == stem)
    opts = (Options(kernel="portable", backward=False) if kind == "lin" else
            Options(backward=False, short_kernels=kind == "short"))
    text = back(front(path), opts).text
    assert hashlib.sha256(text.encode()).hexdigest() == PINNED[key]
