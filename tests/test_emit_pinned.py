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
    "block_causal_video": "7f42f44707226ceb0d3263073927f041d0cd0ea47805e418af79c0a23218e95a",
    "block_causal_video.lin": "048284c003377f6a873163ccaf61b0255cd5d8ee84d3f6a995132cf987a621e5",
    "clear.short": "b9d40f46933fd7a625b18732058c6363a56e5917042fecbeb30781c52cdd6a7f",
    "causal": "bc41d29ad6099f770b90c11a45a73cee9286e6bf1ab204738dab99c489b2655d",
    "causal.lin": "1fc77e5f2d02e51727f1d75fb5ac409cf3f2a9b0aabaaf0b989f88c4279de957",
    "chunked_causal": "ae16ac5fecba562dbfb6cc62d48c2b141c9764b0a59b364ed31a9d80822aecb4",
    "chunked_causal.lin": "eb6d377769bf34f1d741166360c7ddcc6a95dc5e655759230890b1253d09481e",
    "clear": "d4b1d6343f47aaf9d57833a0f8305577a442795bab2f064aaaaa3315c449ff20",
    "clear.lin": "63188146d656cd6a4b32be1577709c24fb0a6fb0dc18bf81e47235d806140c9a",
    "document_causal": "bd6f8e3467a13e24055f8e29dfa829c6b24c8822b0c12ba199d5295aa906576a",
    "document_causal.lin": "d99e4daaccae30029e7f89d92c6082bde8ac8bdcd455e5e75ae23452962cead3",
    "hstu": "cf539636588c66ebbc6712f399b522d18c58e758c1c855934941a6d5aff38af1",
    "hstu.lin": "80f228b7bd0b1fd94d2197641802eb00a1a9732b7b43c2f6f52c822b079c9240",
    "hstu_context": "d836ffea8739a81db799a33af334c114042d4a95de85cb839a57914f3f6fed35",
    "hstu_context.lin": "e8e05ba40812c71da09dcf3c4ca6254d906e20ecfb0e8ae1278e3af542c0256e",
    "longformer": "c215970c81672fed325454049a32dce735cd209a4d3aaa964a4f447d8ec8d754",
    "longformer.lin": "40807de64b2f9185b08feec7a689a5a939b98a1572670dea797c7d6f46f64678",
    "natten2d": "e9e3f50eb9db5a274a0921afae318d85041a40215d0b28d23b3e7fd7ac85ef72",
    "natten2d.lin": "f2e67d581d4b976be4390cfcd423c6990ae201f574f4bdf06b323835f3904179",
    "prefix_lm": "ddd4a0f7ee360fbaccf3446dabd195a079d31aa9c246e34f512d44e6801a24e2",
    "prefix_lm.lin": "8232e90f8450959d4550ff0084998d6640060d4b436f684f2b2c4c3a02a2b816",
    "shared_prefix": "f4422d4ebedad6a52ecc915213a7fb4ac74575bfb748d4350d1cb14bb161bc44",
    "shared_prefix.lin": "0549c3c8cb32cfa8ff0c6740664de3d04a24ad18e2f19ec86679df6fc396eee8",
    "sliding_window": "ab768612e484453c3d4edfe6250a7cb96b4678c9629751773504e0838f1c0b4f",
    "sliding_window.lin": "e475b5465feaebc058d3dacc5d085273d8a40931282ac56b48bd2fef1a112b34",
    "sliding_window_rt": "2b2d6b7a7fbbcad65d70ef08c5e9751e1751d2d5846c91bf7e78051a02adc4fd",
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
