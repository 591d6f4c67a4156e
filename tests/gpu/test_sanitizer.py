"""compute-sanitizer memcheck over every sample's kernels: no out-of-bounds or misaligned
access for batch and jagged packed launches with parameters, in both dtypes.

One sanitizer process runs a small script over all samples (a process per sample would cost
a CUDA start-up each); each sample's test then checks that its launches ran and that no
error names its kernel. Inputs are exact-size cuMemAlloc blocks (the runtime's DeviceArray),
so a read one element past a tensor is caught. Skipped without compute-sanitizer.
"""

from __future__ import annotations

import re

import pytest

from .gpu_common import SAMPLES, requires_gpu, run_memcheck

pytestmark = [pytest.mark.gpu, requires_gpu]

SCRIPT = r'''
import sys
import numpy as np
sys.path.insert(0, sys.argv[1])
from cmc.runtime import DeviceArray, load
from tests.gpu.gpu_common import mask_of
from tests.gpu.harness import call_params, scalar_values, seq_params

rng = np.random.default_rng(0)
for spec in sys.argv[2:]:
    name, path = spec.split("=", 1)
    attn = load(path)
    mask = mask_of(name)
    for variant, (dtype, hd, hq, hkv) in enumerate([("bf16", 128, 4, 2), ("fp16", 64, 2, 1)]):
        for packed, lengths in ((False, [129, 129]), (True, [1, 0, 200, 64, 130])):
            scal = scalar_values(mask, variant)
            per = [seq_params(mask, n, variant + j, rng, scal) for j, n in enumerate(lengths)]
            kw = call_params(mask, per)
            if packed:
                t = sum(lengths)
                shape_q, shape_k = (t, hq, hd), (t, hkv, hd)
                kw["cu_seqlens"] = DeviceArray.from_numpy(
                    np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32))
            else:
                shape_q = (len(lengths), lengths[0], hq, hd)
                shape_k = (len(lengths), lengths[0], hkv, hd)
            q = DeviceArray.from_numpy(rng.standard_normal(shape_q).astype(np.float32), dtype)
            k = DeviceArray.from_numpy(rng.standard_normal(shape_k).astype(np.float32), dtype)
            v = DeviceArray.from_numpy(rng.standard_normal(shape_k).astype(np.float32), dtype)
            o, lse = attn(q, k, v, return_lse=True, **kw)
            o.to_numpy()  # waits for the kernel
    print(f"OK {name}", flush=True)
'''


@pytest.fixture(scope="module")
def memcheck(tmp_path_factory) -> str:
    r = run_memcheck(SCRIPT, tmp_path_factory.mktemp("sanitizer"))
    return r.stdout + r.stderr + f"\nEXIT {r.returncode}\n"


def test_memcheck_clean(memcheck):
    m = re.search(r"ERROR SUMMARY: (\d+) error", memcheck)
    assert m, memcheck[-4000:]
    assert m.group(1) == "0", memcheck[-8000:]
    assert "EXIT 0" in memcheck, memcheck[-4000:]


@pytest.mark.parametrize("sample", SAMPLES, ids=lambda p: p.stem)
def test_sample_ran_clean(memcheck, sample):
    name = sample.stem
    assert f"OK {name}" in memcheck, memcheck[-4000:]
    bad = [ln for ln in memcheck.splitlines() if f"cmc_{name}_fwd" in ln]
    assert not bad, "\n".join(bad[:20])
