"""GPU tier of the backward (issue 21): every sample, compiled by the pipeline with the
backward (on by default), against float64 torch autograd of masked softmax attention on the
dense oracle mask (tests/gpu/harness.py).

Per sample: a jagged packed batch (bf16, D=128, GQA 4/2) and the batch layout (fp16, D=64,
MQA 2/1), each in the atomic and the deterministic mode (twice: bitwise equal). Gradients
are NaN-poisoned first; pass: no NaN, ||g - ref|| / ||ref|| < 1e-2 for dq, dk, dv, dK = dV = 0
exactly for keys no query sees, dQ = 0 exactly for rows that see no key. Once each: the
torch autograd path, torch.compile(fullgraph=True) of a layer calling the registered op,
CUDA-graph capture of forward + backward with a plan, and compute-sanitizer memcheck of one
backward per sample (skipped without compute-sanitizer).

Run on a GPU machine: `pytest -m gpu tests/gpu/test_backward_gpu.py -q` (artifacts from
gpu_common.artifact: built here, or CMC_GPU_ARTIFACTS).
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from .gpu_common import (
    SAMPLES,
    artifact,
    block64_allowed,
    cuda_torch,
    device_arch,
    mask_of,
    requires_gpu,
    run_memcheck,
)
from .harness import backward_case, compare_grads

pytestmark = [pytest.mark.gpu, requires_gpu]
TOL = 1e-2
torch: Any = None
_loaded: dict[str, Any] = {}


@pytest.fixture(scope="module", autouse=True)
def _torch():
    global torch
    torch = cuda_torch()


def load_bwd(name: str, bwd_kernel: str = "auto") -> Any:
    from cmc.runtime import load

    key = f"{name}/{bwd_kernel}"
    if key not in _loaded:
        attn = load(artifact(name, bwd_kernel))
        assert attn.has_backward, f"{name}: artifact has no backward (built --no-backward?)"
        _loaded[key] = attn
    return _loaded[key]


CASES = [  # (packed, lengths, dtype, head_dim, hq, hkv)
    (True, [1, 0, 77, 200, 130], "bf16", 128, 4, 2),
    (False, [129, 129], "fp16", 64, 2, 1),
]


def setup_case(name: str, packed: bool, lengths: list[int], dtype: str, d: int, hq: int,
               hkv: int, seed: int) -> dict[str, Any]:
    return backward_case(torch, mask_of(name), packed, lengths, dtype, d, hq, hkv, seed)


def check_grads(c: dict[str, Any], grads: tuple[Any, ...], what: str) -> None:
    t = c["tokens"]
    flat = [g.reshape(t, g.shape[-2], g.shape[-1]) for g in grads]
    errs = compare_grads(torch, flat, c["ref"])
    assert all(e < TOL for e in errs.values()), f"{what}: {errs}"
    dead, blind = ~c["seen"], ~c["sees"]
    if dead.any():
        assert (flat[1][dead] == 0).all() and (flat[2][dead] == 0).all(), \
            f"{what}: keys no query sees must get dK = dV = 0"
    if blind.any():
        assert (flat[0][blind] == 0).all(), f"{what}: rows that see no key must get dQ = 0"


@pytest.mark.parametrize("bwd_kernel", ["portable", "auto", "lockstep", "ws", "token",
                                        "portable_block64"],
                         ids=["portable", "sm90", "lockstep", "ws", "token", "portable-block64"])
@pytest.mark.parametrize("case", range(len(CASES)), ids=["packed-bf16-d128", "batch-fp16-d64"])
@pytest.mark.parametrize("sample", SAMPLES, ids=lambda p: p.stem)
def test_backward_matches_reference(sample, case, bwd_kernel):
    """bwd_kernel "auto" (id sm90, the default build): on sm_90a the dq role is bwd_dq_sm90
    (the deterministic runs go through it) and the kv role the warp-specialised
    bwd_kv_sm90_ws (its Q and dO tensor maps passed by the runtime) on either tiling;
    "lockstep" and "ws": that kv kind on every sample; "portable": --bwd-kernel portable.
    The default build holds dq_accum in 64-row blocks where the backward tiling is linear
    (--dq-layout auto), "portable", "ws" and "lockstep" token-major; "token": the default
    kinds with --dq-layout token; "portable-block64": the portable build with --dq-layout
    block64, on the samples whose backward tiling is linear."""
    name = sample.stem
    portable = bwd_kernel.startswith("portable")
    if not portable and device_arch() != "sm_90a":
        pytest.skip("the sm90 dK/dV and dQ kinds are built for sm_90a only")
    blocks = block64_allowed(name)
    if bwd_kernel == "portable_block64" and not blocks:
        pytest.skip(f"{name}: its backward tiling is not linear (--dq-layout block64 refuses it)")
    attn = load_bwd(name, bwd_kernel)
    want = ("block64" if blocks else "token") if bwd_kernel == "auto" else (
        "block64" if bwd_kernel == "portable_block64" else "token")
    assert attn.manifest.backward is not None and attn.manifest.backward.dq_layout == want
    if not portable:
        kv = "sm90" if bwd_kernel == "lockstep" else "sm90ws"
        assert any(k.role == "kv" and k.symbol.startswith(f"cmc_{name}_bwd_kv_{kv}_")
                   for k in attn.manifest.kernels), f"the artifact's kv is not the {kv} kind"
        assert any(k.role == "dq" and k.symbol.startswith(f"cmc_{name}_bwd_dq_sm90_")
                   for k in attn.manifest.kernels), "the artifact's dq is not the sm90 kind"
    packed, lengths, dtype, d, hq, hkv = CASES[case]
    c = setup_case(name, packed, lengths, dtype, d, hq, hkv, seed=7 + case)
    q, k, v, do = c["shaped"]
    out, lse = attn(q, k, v, return_lse=True, **c["kw"])
    runs = []
    for mode in ("atomic", "det", "det"):
        dq, dk, dv = (torch.full_like(x, float("nan")) for x in (q, k, v))
        res = attn.backward(do, q, k, v, out, lse, dq=dq, dk=dk, dv=dv,
                            deterministic=mode == "det", **c["kw"])
        assert res[0] is dq and res[1] is dk and res[2] is dv
        torch.cuda.synchronize()
        check_grads(c, (dq, dk, dv), f"{name} {mode}")
        if mode == "det":
            runs.append((dq.clone(), dk.clone(), dv.clone()))
    assert all(torch.equal(a, b) for a, b in zip(*runs, strict=True)), \
        "deterministic mode must be bitwise reproducible"


def test_torch_autograd_path():
    attn = load_bwd("hstu")
    c = setup_case("hstu", True, [50, 0, 190], "bf16", 128, 4, 2, seed=3)
    q, k, v, do = (x.detach().clone() for x in c["shaped"])
    for x in (q, k, v):
        x.requires_grad_(True)
    out = attn(q, k, v, **c["kw"])
    assert out.requires_grad
    out.backward(do)
    check_grads(c, (q.grad, k.grad, v.grad), "autograd")


def test_torch_compile_fullgraph_trains():
    from cmc.runtime.torch_op import register

    attn = load_bwd("causal")
    fn = register(attn, "bwdtest_causal")
    c = setup_case("causal", False, [128, 128], "bf16", 64, 2, 2, seed=5)

    class Layer(torch.nn.Module):
        def forward(self, q: Any, k: Any, v: Any) -> Any:
            return fn(q * 1.0, k, v)

    layer = torch.compile(Layer(), fullgraph=True)
    q, k, v, do = (x.detach().clone() for x in c["shaped"])
    for x in (q, k, v):
        x.requires_grad_(True)
    out = layer(q, k, v)
    out.backward(do)
    check_grads(c, (q.grad, k.grad, v.grad), "torch.compile")


def test_cuda_graph_forward_backward_with_plan():
    attn = load_bwd("shared_prefix")
    c = setup_case("shared_prefix", True, [64, 130, 7], "bf16", 128, 4, 4, seed=11)
    plan = attn.plan(**c["kw"])
    q, k, v, do = (x.detach().clone() for x in c["shaped"])
    for x in (q, k, v):
        x.requires_grad_(True)

    def step() -> None:
        for x in (q, k, v):
            x.grad = None
        attn(q, k, v, plan=plan).backward(do)

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        step()  # warm-up outside capture
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    for x in (q, k, v):
        x.grad = None
    with torch.cuda.graph(g):
        attn(q, k, v, plan=plan).backward(do)
    grads = (q.grad, k.grad, v.grad)
    for x in grads:
        x.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    check_grads(c, grads, "cuda graph")


def _alloc_stream(t: Any) -> int:
    """The stream torch's caching allocator tied t's block to (its memory snapshot)."""
    ptr = t.data_ptr()
    for seg in torch.cuda.memory._snapshot()["segments"]:
        if seg["address"] <= ptr < seg["address"] + seg["total_size"]:
            return int(seg["stream"])
    raise AssertionError("tensor not found in the allocator's snapshot")


def test_outputs_are_allocated_on_the_stream_argument():
    """attn(..., stream=s) and attn.backward(..., stream=s) with s not torch's current stream:
    o, lse, dq, dk, dv come from s's pool (a block tied to the current stream could be reused
    there while our kernels still write it on s), and the gradients are right."""
    attn = load_bwd("causal")
    c = setup_case("causal", False, [256, 256], "bf16", 128, 2, 2, seed=13)
    q, k, v, do = c["shaped"]
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    out, lse = attn(q, k, v, return_lse=True, stream=s, **c["kw"])
    dq, dk, dv = attn.backward(do, q, k, v, out, lse, stream=s, **c["kw"])
    s.synchronize()
    assert s.cuda_stream != torch.cuda.current_stream().cuda_stream
    for name, t in (("out", out), ("lse", lse), ("dq", dq), ("dk", dk), ("dv", dv)):
        assert _alloc_stream(t) == s.cuda_stream, name
    check_grads(c, (dq, dk, dv), "stream=")


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
    lengths = [1, 0, 200, 64, 130]
    scal = scalar_values(mask, 0)
    kw = call_params(mask, [seq_params(mask, n, j, rng, scal) for j, n in enumerate(lengths)])
    t = sum(lengths)
    kw["cu_seqlens"] = DeviceArray.from_numpy(
        np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32))
    q, do = (DeviceArray.from_numpy(rng.standard_normal((t, 4, 128)).astype(np.float32), "bf16")
             for _ in range(2))
    k, v = (DeviceArray.from_numpy(rng.standard_normal((t, 2, 128)).astype(np.float32), "bf16")
            for _ in range(2))
    o, lse = attn(q, k, v, return_lse=True, **kw)
    for det in (False, True):
        dq, dk, dv = attn.backward(do, q, k, v, o, lse, deterministic=det, **kw)
        dq.to_numpy()
    print(f"OK {name}", flush=True)
'''


def test_backward_memcheck(tmp_path):
    r = run_memcheck(SCRIPT, tmp_path)
    log = r.stdout + r.stderr
    m = re.search(r"ERROR SUMMARY: (\d+) error", log)
    assert m and m.group(1) == "0" and r.returncode == 0, log[-8000:]
    for p in SAMPLES:
        assert f"OK {p.stem}" in log, log[-4000:]
