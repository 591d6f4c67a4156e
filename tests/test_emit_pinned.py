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
    "block_causal_video": "08946269c5c8ed63377d8bd64eb60320aeadd905be19fdd0aa732541e3cbe2dc",
    "block_causal_video.lin": "fd019e48d226cc031d9a8298b53104a707a0f18ac6eac788419443f22e902335",
    "clear.short": "2f48667e2d37b3843b8f4dd07fe825cfafb8328f9f019ae11a585498694d1835",
    "causal": "95dd76c5aa6f1c22e982504bbc63ffd6e3a9ec440386d1a21272c0a8e2622722",
    "causal.lin": "dffdb104b444e3ece597277d8eacb150c87bd3797e5dd22bbc4acaacdd583dbd",
    "chunked_causal": "820357a53982e3e5924f7a37b74a295a8d688851837e92a388e20fe5eadc0776",
    "chunked_causal.lin": "87e298bcb64c2cd418d99eaf471d7feb652852256f15642e7550d12d274aa1bf",
    "clear": "98e01fa518ff3098f900e103f7ae0caf80676378c92d5e47fc9fd0cf2c0fe1e0",
    "clear.lin": "f5418e5a57830c18ef427d7cb70a828ea12753c2c3d52ad07f2bf70af3b78e43",
    "document_causal": "52a4f150ba14686c13affc9d54941738958d9e3222858d9379831fc237a00ade",
    "document_causal.lin": "07e1f6a53b25df9e0abe2b81359dd260eee33d8e53c774ce321c7b2593f441cc",
    "hstu": "1d00f4f31b409387abf4d1331141cc8637df3d6037bbbce97feba3af12c0a80a",
    "hstu.lin": "3f1e855a4218bc92b43be599883efb12490893ee2cafe31e71bf57c46b267929",
    "hstu_context": "b01dde3fa8487b418f7d0299ad2d9bbfdc6cffefc821be4a5559e3fa2cd0a888",
    "hstu_context.lin": "52fb361318e33c15dd02563e4d78193816a2956e90f47252d3c79452822bce46",
    "longformer": "44dfe8b49bf4c013bad6c283e8680dffd45d6e6ba55b88ce53ff55182f98fe12",
    "longformer.lin": "d080851bd2502915ce054042249251a1e0f17f996a06eae7415f4f36fbf467e9",
    "natten2d": "c672059750be5143c3b8307212ec7b4ff18ad928e9760052edefa4973525d980",
    "natten2d.lin": "ff7cfd58c529884e8c1208e98bdfc78c720853c77190a9f9e79b5c0d079e4547",
    "prefix_lm": "0a18bb05c23d7b4371e85e1982ef42459bbc7744627c4f3eb19dbdf88e47f1c0",
    "prefix_lm.lin": "177730afbf13f246b109e0b5136679b5d95d377117c391d16137c7e8a3c94829",
    "shared_prefix": "a934a7f485ab9cf8a39fc24b6a23a2a6c90a2a470dfb2db398ed077f7aa7d702",
    "shared_prefix.lin": "860fbdd7a9725eef0797a0b9d2bdfe3ed4959e8d838689945f2ef829c82395ce",
    "sliding_window": "a34f9b578640f5af9f78a347a8605865294377186c2b3ea02a1f1a6baadfe6f7",
    "sliding_window.lin": "d4ddf94199eaa46b40585826d6768004d4fb195fb52fa335ea55e6414ef704d4",
    "sliding_window_rt": "1c61cf5aed0855a479a14e24108aedb24734fbb4a7e55aa05f5160b09618bab4",
    "sliding_window_rt.lin": "4ff985e716f9b6f3e7475d5aa64d37140bfa5e1248b7b7dad94ccf7d9c4f633b",
}


@pytest.mark.parametrize("key", sorted(PINNED))
def test_forward_source_is_unchanged(key):
    stem, _, kind = key.partition(".")
    path = next(p for p in SAMPLES if p.stem == stem)
    opts = (Options(kernel="portable", backward=False) if kind == "lin" else
            Options(backward=False, short_kernels=kind == "short"))
    text = back(front(path), opts).text
    assert hashlib.sha256(text.encode()).hexdigest() == PINNED[key]
