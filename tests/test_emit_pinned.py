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
    "block_causal_video": "ddec4c4619024a00298c14a90ea0a488411ce0519cf6b2ea814c84cbd51f3b64",
    "block_causal_video.lin": "2bce48f391957f9f39695aa92bd418f17d93a596dd5ffc5164dd0b32937930ba",
    "causal": "e54a6381b28f72b8ac5f4de99a7278ce663a1ea6a92680ff73872d34b5bdcba9",
    "causal.lin": "fae239ddd54603193a27e6d5596521fedc9507a3ffc6e073f0405e8fd2995aa4",
    "chunked_causal": "1af55f0ee7b4f136a2a29368d40f1532e3015bc42418d75dfd460123e30e97be",
    "chunked_causal.lin": "9c234602479f27863a255187518e144a015535a26ae50de13f6b723e4395cad1",
    "clear": "b78cbb4feae081c1151294c0b06f6a8beaad63fe01f468155a3b2dd720c8de75",
    "clear.lin": "872a330e84b2d0fe2fdfc0b26c208a21576f4a096acd7fd917da85a51ce3a9dd",
    "document_causal": "674bb1bf9748e1d4fa032516563e104afbd5e690ddd90d21e2002a7a33c74178",
    "document_causal.lin": "41d78d806134ac69569653bd247e8ad9d0a7fea05621619ad9c080f409103fa1",
    "hstu": "38c11c844c65a9341866fd6982dc9df6f6c6d481c7169050971077c280de2add",
    "hstu.lin": "663b30a1802062211f6256ba6d06931ffdd54254a548db274fb0dd3aaa5e898b",
    "hstu_context": "1cd20485d1b235a6225a5c3aec4a3abe4032bd01fa9328b2b4ccd39848dbfc91",
    "hstu_context.lin": "4cb337db2d12eed6021f7050c6838930d27e76ab8b0a671e6e86d8bd7a5afe71",
    "longformer": "cd769039dc42dbcb6646573f7a4b16f6a8d6ae3a100db3d2a9b6c027601b1af1",
    "longformer.lin": "3512fa241cf988519186498a9a520cda4b9bb6fbed2d1e49022b420e3724365f",
    "natten2d": "91065840ce46e7ab72bbb7e727e1c9a3f8118a31b93633d31685110b9e609df7",
    "natten2d.lin": "0df7ea852f05ddd902db917c288bd29d98aa303075e2a651b4e869cfff8ec235",
    "prefix_lm": "a6155b76a4bc101ca908b850c58f2035e9df3722bb7fbd4887d2813390ff7ad8",
    "prefix_lm.lin": "b4f911cac5d7b5ab16ace21a647ee18cf66c5fc7bdcc898f83c852fe4d6d0977",
    "shared_prefix": "37ce06a2e99dedb389318aeced15bf32656e2f9abc840a6cc69d22db70d4afde",
    "shared_prefix.lin": "a82f2eed08ab1a2388ec4ed00030fe7ef7f939113515197b6d6c731e6fc0d219",
    "sliding_window": "62e1e487dea35fb562df2de8d0d722e7ef7a1195ad695b39bdd099563821989c",
    "sliding_window.lin": "f41aae8e5c251fd21c31b038157ced04b696f6b45da791d2c3a4715c4ffd7d08",
    "sliding_window_rt": "af84fe1410978659280c9539b951e8f1b5b8b703cb8ae21b66d4e6bc8ad10264",
    "sliding_window_rt.lin": "d4e3f36cc70e6dde2afdd6461da919cc8726e94ca564b3eb3764cc5ea271b4f0",
}


@pytest.mark.parametrize("key", sorted(PINNED))
def test_forward_source_is_unchanged(key):
    stem, _, lin = key.partition(".")
    path = next(p for p in SAMPLES if p.stem == stem)
    opts = Options(kernel="portable", backward=False) if lin else Options(backward=False)
    text = back(front(path), opts).text
    assert hashlib.sha256(text.encode()).hexdigest() == PINNED[key]
