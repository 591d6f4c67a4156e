#!/usr/bin/env python3
"""Train a tiny model with a cmc attention (the HSTU mask) and, beside it, the same model on a
float32 reference attention (dense mask from cmc.oracle) from the same initial weights: the
losses fall and agree to about 1e-2.

    python3 examples/train_tiny.py            # on a CUDA machine with torch; < 1 minute
    python3 examples/train_tiny.py --out out  # reuse out/hstu if already compiled

The cmc model runs attention in bf16 (the kernels' dtype); everything else is float32 in both.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

B, L, H, D, VOCAB, WIDTH, STEPS = 4, 256, 2, 64, 64, 128, 30


class Tiny(torch.nn.Module):
    """Embedding -> one masked attention block -> next-token logits."""

    def __init__(self, attend):
        super().__init__()
        self.attend = attend
        self.emb = torch.nn.Embedding(VOCAB, WIDTH)
        self.qkv = torch.nn.Linear(WIDTH, 3 * H * D)
        self.proj = torch.nn.Linear(H * D, WIDTH)
        self.head = torch.nn.Linear(WIDTH, VOCAB)

    def forward(self, tokens):
        x = self.emb(tokens)
        q, k, v = self.qkv(x).view(B, L, 3, H, D).unbind(2)
        o = self.attend(q, k, v).reshape(B, L, H * D)
        return self.head(x + self.proj(o))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None, help="artifact root holding hstu/ (else compiled)")
    opts = ap.parse_args()
    from cmc.oracle import dense
    from cmc.runtime import load

    if opts.out and (Path(opts.out) / "hstu" / "manifest.json").is_file():
        path = Path(opts.out) / "hstu"
    else:
        import tempfile

        from cmc.driver import compile_file
        major, minor = torch.cuda.get_device_capability()
        arch = f"sm_{major}{minor}{'a' if major >= 9 else ''}"
        path = Path(compile_file(ROOT / "samples" / "hstu.mask", Path(tempfile.mkdtemp()),
                                 archs=[arch], dtypes=["bf16"], head_dims=[D], jobs=4))
    attn = load(path)
    assert attn.has_backward, "the artifact was compiled without the backward"
    from cmc.driver import load_mask

    mask = load_mask(ROOT / "samples" / "hstu.mask")
    n_targets = [16, 32, 0, 64]
    vis = torch.stack([torch.from_numpy(dense(mask, L, {"n_targets": n})) for n in n_targets])
    vis = vis.cuda()  # [B, L, L]
    nt = torch.tensor(n_targets, dtype=torch.int32, device="cuda")
    plan = attn.plan(batch=B, seq_len=L, n_targets=nt)

    def cmc_attend(q, k, v):
        o = attn(q.bfloat16(), k.bfloat16(), v.bfloat16(), plan=plan)
        return o.float()

    def ref_attend(q, k, v):  # float32, [B, L, H, D]
        s = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(D)
        s = s.masked_fill(~vis[:, None], float("-inf"))
        p = torch.nan_to_num(torch.softmax(s, -1))  # rows that see nothing: 0
        return torch.einsum("bhqk,bkhd->bqhd", p, v)

    torch.manual_seed(0)
    models = [Tiny(cmc_attend).cuda(), Tiny(ref_attend).cuda()]
    models[1].load_state_dict(models[0].state_dict())
    opts_ = [torch.optim.Adam(m.parameters(), lr=3e-3) for m in models]
    g = torch.Generator(device="cuda").manual_seed(1)
    data = torch.randint(0, VOCAB, (B, L + 1), device="cuda", generator=g)
    data[:, 1::2] = data[:, 0:-1:2]  # a learnable pattern: every odd token repeats the last
    worst = 0.0
    first = last = 0.0
    for step in range(STEPS):
        losses = []
        for m, opt in zip(models, opts_, strict=True):
            opt.zero_grad()
            logits = m(data[:, :-1])
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB),
                                                     data[:, 1:].reshape(-1))
            loss.backward()
            opt.step()
            losses.append(loss.item())
        worst = max(worst, abs(losses[0] - losses[1]) / abs(losses[1]))
        first = first or losses[0]
        last = losses[0]
        print(f"step {step:2d}  loss cmc {losses[0]:.4f}  reference {losses[1]:.4f}")
    print(f"loss {first:.4f} -> {last:.4f}; worst relative difference {worst:.2e}")
    ok = last < first and worst < 2e-2
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
