"""GPU correctness: every sample, compiled by the pipeline, against a float64 reference whose
mask is the dense oracle's. Fresh random inputs per case, output poisoned with NaN before
each launch, batch and packed (jagged) layouts, GQA/MQA, bf16/fp16, head dims 64/128, LSE.
Pass: ||o - ref|| / ||ref|| < 1e-2, no NaN, rows that see no key exactly 0 with LSE -inf.
A table of the worst relative error per sample is printed at the end of the session.

Run on a GPU machine: `pytest -m gpu tests/gpu -q` (skips cleanly without a CUDA device).
"""

from __future__ import annotations

import itertools
import math
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

from .gpu_common import SAMPLES, artifact, cuda_torch, mask_of, requires_gpu
from .harness import (
    call_params,
    causal_mask_fn,
    check_reference_grads_against_sdpa,
    compare,
    oracle_masks,
    reference,
    scalar_values,
    seq_params,
)

pytestmark = [pytest.mark.gpu, requires_gpu]
TOL = 1e-2
DEV = "cuda"  # the harness can be dry-run on "cpu" against a stand-in attention

torch: Any = None


def sync() -> None:
    if DEV == "cuda":
        torch.cuda.synchronize()


@pytest.fixture(scope="module", autouse=True)
def _torch():
    global torch
    torch = cuda_torch()


@pytest.fixture(scope="session")
def worst(request):
    """sample -> (worst relative error, the case): printed as a table at session end."""
    table: dict[str, tuple[float, str]] = {}
    yield table
    tr = request.config.pluginmanager.get_plugin("terminalreporter")
    if tr is None or not table:
        return
    tr.write_line("")
    tr.write_line("worst relative error per sample (||o - ref|| / ||ref||, float64 reference)")
    for name in sorted(table):
        err, case = table[name]
        tr.write_line(f"  {name:22s} {err:9.2e}  {case}")


@dataclass
class Case:
    lengths: list[int]
    packed: bool
    dtype: str = "bf16"
    head_dim: int = 128
    hq: int = 4
    hkv: int = 4
    variant: int = 0
    lse: bool = True
    scale: float | None = None
    out_given: bool = True
    qkv_view: bool = False  # q/k/v as slices of one [B, L, 3, H, D] tensor (strided)
    note: str = field(default="")

    def describe(self) -> str:
        lay = "packed" if self.packed else "batch"
        return (f"{lay} lens={self.lengths if len(self.lengths) < 6 else len(self.lengths)} "
                f"{self.dtype} d{self.head_dim} h{self.hq}/{self.hkv} v{self.variant}"
                f"{' qkv-view' if self.qkv_view else ''}{' ' + self.note if self.note else ''}")


VARIANTS = [("bf16", 128), ("fp16", 64), ("bf16", 64), ("fp16", 128)]
HEADS = [(4, 4), (4, 2), (4, 1)]


def cases_for(name: str) -> list[Case]:
    out = []
    i = 0
    for n in (1, 127, 129, 1000, 2048):
        for _rep in range(2 if n < 2048 else 1):
            dt, hd = VARIANTS[i % 4]
            hq, hkv = HEADS[i % 3]
            out.append(Case([n] * (2 if n < 2048 else 1), False, dt, hd, hq, hkv, variant=i,
                            out_given=(i % 5 != 4), scale=0.3 if i % 7 == 3 else None,
                            qkv_view=(i % 6 == 3)))
            i += 1
    for lens in ([1, 127, 0, 129, 700], [2048, 5, 1000], [64] * 9):
        for _rep in range(2):
            dt, hd = VARIANTS[i % 4]
            hq, hkv = HEADS[i % 3]
            out.append(Case(lens, True, dt, hd, hq, hkv, variant=i, out_given=(i % 5 != 4)))
            i += 1
    return out


def make_inputs(c: Case, gen: Any) -> tuple[Any, Any, Any]:
    dt = torch.bfloat16 if c.dtype == "bf16" else torch.float16
    dev = DEV
    if c.packed:
        t = sum(c.lengths)
        return tuple(torch.randn((t, h, c.head_dim), generator=gen, device=dev).to(dt)
                     for h in (c.hq, c.hkv, c.hkv))
    b, n = len(c.lengths), c.lengths[0]
    if c.qkv_view:
        qkv = torch.randn((b, n, 3, c.hq, c.head_dim), generator=gen, device=dev).to(dt)
        return qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    return tuple(torch.randn((b, n, h, c.head_dim), generator=gen, device=dev).to(dt)
                 for h in (c.hq, c.hkv, c.hkv))


def poison_allocator(nbytes: int) -> None:
    """Leave NaNs in the caching allocator's next block of this size (for runtime-allocated
    outputs: a kernel that skips rows then shows NaN instead of stale zeros)."""
    x = torch.full((max(1, nbytes // 4),), float("nan"), device=DEV)
    del x


def run_case(attn: Any, mask: Any, c: Case, seed: int, mask_fns=None) -> float:
    gen = torch.Generator(device=DEV).manual_seed(seed)
    rng = np.random.default_rng(seed)
    q, k, v = make_inputs(c, gen)
    scalars = scalar_values(mask, c.variant)
    per_seq = [seq_params(mask, n, c.variant + j, rng, scalars) for j, n in enumerate(c.lengths)]
    kw = call_params(mask, per_seq)
    if c.packed:
        cu = torch.tensor(np.concatenate([[0], np.cumsum(c.lengths)]), dtype=torch.int32,
                          device=DEV)
        kw["cu_seqlens"] = cu
    if c.out_given:
        kw["out"] = torch.full(q.shape, float("nan"), dtype=q.dtype, device=DEV)
    else:
        poison_allocator(q.numel() * 2)
    if c.lse:
        poison_allocator(4 * q.shape[-2] * (q.shape[0] if c.packed else q.shape[0] * q.shape[1]))
    res = attn(q, k, v, return_lse=c.lse, scale=c.scale, **kw)
    o, lse = res if c.lse else (res, None)
    if c.out_given:
        assert o is kw["out"]
    assert o.shape == q.shape and o.dtype == q.dtype
    sync()
    if not c.packed:
        b, n, hq = q.shape[0], q.shape[1], q.shape[2]
        if lse is not None:
            assert lse.shape == (b, hq, n)
            lse = lse.permute(1, 0, 2).reshape(hq, b * n)
        q, k, v, o = (x.reshape(b * n, x.shape[2], x.shape[3]) for x in (q, k, v, o))
    elif lse is not None:
        assert lse.shape == (q.shape[1], q.shape[0])
    fns = mask_fns or oracle_masks(torch, mask, c.lengths, per_seq, DEV)
    scale = c.scale if c.scale is not None else 1.0 / math.sqrt(c.head_dim)
    ref_o, ref_lse = reference(torch, q, k, v, c.lengths, fns, scale)
    err = compare(torch, o, lse, ref_o, ref_lse)
    assert err < TOL, f"{c.describe()}: relative error {err:.3g}"
    return err


def run_cases(attn: Any, mask: Any, cases: list[Case], seed: Callable[[int], int]) -> list[str]:
    """run_case on every case (case i with seed(i)); the failures, one line each, so that a
    test reports all of them at once."""
    failures = []
    for i, c in enumerate(cases):
        try:
            run_case(attn, mask, c, seed=seed(i))
        except AssertionError as e:
            failures.append(f"{c.describe()}: {e}")
    return failures


def record(worst: dict, name: str, err: float, c: Case) -> None:
    if name not in worst or err > worst[name][0]:
        worst[name] = (err, c.describe())


@pytest.mark.parametrize("sample", SAMPLES, ids=lambda p: p.stem)
def test_sample_matches_reference(sample, worst):
    from cmc.runtime import load

    name = sample.stem
    attn = load(artifact(name))
    mask = mask_of(name)
    assert {n for n, _ in attn.params} == {p.name for p in mask.params}
    assert set(attn.variants()) == {(d, h) for d in ("bf16", "fp16") for h in (64, 128)}
    failures = []
    for i, c in enumerate(cases_for(name)):
        try:
            record(worst, name, run_case(attn, mask, c, seed=1000 * i + len(name)), c)
        except AssertionError as e:
            failures.append(f"{c.describe()}: {e}")
    assert not failures, "\n".join(failures)


def test_empty_rows_give_zero_and_minus_inf(worst):
    """window = 0 hides every key: O must be exactly 0 and LSE -inf on every row."""
    from cmc.runtime import load

    attn = load(artifact("sliding_window_rt"))
    q = torch.randn((2, 300, 2, 128), device="cuda").bfloat16()
    out = torch.full_like(q, float("nan"))
    o, lse = attn(q, q, q, out=out, return_lse=True, window=0)
    torch.cuda.synchronize()
    assert (o == 0).all() and torch.isneginf(lse).all()


@pytest.mark.parametrize("n, hq, hkv, packed", [(4096, 4, 4, False), (8192, 4, 1, False),
                                               (32768, 2, 2, False), (32768, 2, 1, True)])
def test_causal_long(n, hq, hkv, packed, worst):
    """Long causal sequences; the mask is k <= q directly (checked against the oracle below)."""
    from cmc.runtime import load

    attn = load(artifact("causal"))
    mask = mask_of("causal")
    lengths = [n] if not packed else [n - 3000, 3000]
    c = Case(lengths, packed, "bf16", 128, hq, hkv, note="long")
    fns = [causal_mask_fn(torch, m, "cuda") for m in lengths]
    record(worst, "causal", run_case(attn, mask, c, seed=n + hkv, mask_fns=fns), c)


def test_causal_mask_fn_is_the_oracle():
    from cmc.oracle import dense

    vis = torch.from_numpy(dense(mask_of("causal"), 300, {})).cuda()
    assert torch.equal(causal_mask_fn(torch, 300, "cuda")(0, 300), vis)


def test_reference_grads_match_sdpa_autograd():
    """The gradient reference against torch's own attention (float64, GQA, a packed batch
    with an empty sequence), and its forward against the forward reference."""
    pytest.importorskip("torch.nn.functional")
    check_reference_grads_against_sdpa(torch, "cuda", [5, 0, 70], (4, 2), 64)


# --------------------------------------------------------------------------- bad inputs


def test_bad_inputs_raise_param_errors_and_later_launches_work():
    from cmc.errors import ParamError
    from cmc.runtime import Segments, load

    attn = load(artifact("shared_prefix"))
    mask = mask_of("shared_prefix")
    dev = "cuda"
    b, n, h, d = 2, 64, 2, 128
    q = torch.randn((b, n, h, d), device=dev).bfloat16()
    good = {"prompt_len": [8, 64], "responses": [[8, 30], []]}
    qp = q.reshape(b * n, h, d)
    cu = torch.tensor([0, 20, 128], dtype=torch.int32, device=dev)
    pgood = {"prompt_len": [4, 50], "responses": [[4], [50, 60]]}

    def padded_tok(dim_pad):  # token stride d + pad, one head
        x = torch.randn((b, n, 1, d + dim_pad), device=dev).bfloat16()
        return x[..., :d]

    misaligned = torch.empty(q.numel() + 8, device=dev, dtype=torch.bfloat16)[1:1 + q.numel()]
    cases = [
        ("q", lambda: attn(q.float(), q, q, **good)),
        ("k", lambda: attn(q, q.half(), q, **good)),
        ("q", lambda: attn(torch.randn((b, n, h, 96), device=dev).bfloat16(),
                           torch.randn((b, n, h, 96), device=dev).bfloat16(),
                           torch.randn((b, n, h, 96), device=dev).bfloat16(), **good)),
        ("k", lambda: attn(torch.randn((b, n, 3, d), device=dev).bfloat16(), q, q, **good)),
        ("q", lambda: attn(torch.randn((b, n, h, 2 * d), device=dev).bfloat16()[..., ::2], q,
                           q, **good)),
        ("q", lambda: attn(misaligned.view(q.shape), q, q, **good)),
        ("q", lambda: attn(padded_tok(4), padded_tok(0), padded_tok(0), **good)),
        ("q", lambda: attn(torch.randn((b, h, n, d), device=dev).bfloat16().transpose(1, 2),
                           q, q, **good)),
        ("q", lambda: attn(q.cpu(), q, q, **good)),
        ("out", lambda: attn(q, q, q, out=torch.empty((b, n, h, 64), device=dev,
                                                         dtype=q.dtype), **good)),
        ("responses", lambda: attn(q, q, q, prompt_len=[8, 64])),
        ("bogus", lambda: attn(q, q, q, bogus=1, **good)),
        ("prompt_len", lambda: attn(q, q, q, prompt_len=[8, 65], responses=[[], []])),
        ("prompt_len", lambda: attn(q, q, q, prompt_len=torch.tensor(
            [8, 65], dtype=torch.int32, device=dev), responses=[[], []])),
        ("prompt_len", lambda: attn(q, q, q, prompt_len=torch.tensor(
            [8, 6], dtype=torch.int64, device=dev), responses=[[], []])),
        ("prompt_len", lambda: attn(q, q, q, prompt_len=[1, 2, 3], responses=[[], []])),
        ("responses", lambda: attn(q, q, q, prompt_len=[1, 2], responses=[[9, 3], []])),
        ("responses", lambda: attn(q, q, q, prompt_len=[1, 2], responses=[[65], []])),
        ("responses", lambda: attn(q, q, q, prompt_len=[1, 2], responses=Segments(
            torch.tensor([0, 1, 2], dtype=torch.int32, device=dev),
            torch.tensor([3, 99], dtype=torch.int32, device=dev)))),
        ("cu_seqlens", lambda: attn(qp, qp, qp, cu_seqlens=torch.tensor(
            [1, 20, 128], dtype=torch.int32, device=dev), **pgood)),
        ("cu_seqlens", lambda: attn(qp, qp, qp, cu_seqlens=torch.tensor(
            [0, 70, 60, 128], dtype=torch.int32, device=dev), prompt_len=[0, 0, 0],
            responses=[[], [], []])),
        ("cu_seqlens", lambda: attn(qp, qp, qp, cu_seqlens=torch.tensor(
            [0, 20, 127], dtype=torch.int32, device=dev), **pgood)),
        ("cu_seqlens", lambda: attn(qp, qp, qp, cu_seqlens=cu.long(), **pgood)),
        ("cu_seqlens", lambda: attn(qp, qp, qp, **pgood)),
        ("max_len", lambda: attn(qp, qp, qp, cu_seqlens=cu, max_len=100, **pgood)),
        ("scale", lambda: attn(q, q, q, scale=-1.0, **good)),
    ]
    for param, fn in cases:
        with pytest.raises(ParamError) as e:
            fn()
        assert e.value.param == param, (param, e.value)
    # a later launch still works, in both layouts
    c = Case([n] * b, False, variant=0)
    run_case(attn, mask, c, seed=5)
    out = torch.full_like(qp, float("nan"))
    o, lse = attn(qp, qp, qp, cu_seqlens=cu, out=out, return_lse=True, **pgood)
    torch.cuda.synchronize()
    fns = oracle_masks(torch, mask, [20, 108], [
        {"prompt_len": 4, "responses": [4]}, {"prompt_len": 50, "responses": [50, 60]}], dev)
    ref_o, ref_lse = reference(torch, qp, qp, qp, [20, 108], fns, 1 / math.sqrt(d))
    assert compare(torch, o, lse, ref_o, ref_lse) < TOL


def test_tensors_on_two_devices_are_rejected():
    from cmc.errors import ParamError
    from cmc.runtime import load

    if torch.cuda.device_count() < 2:
        pytest.skip("one GPU")
    attn = load(artifact("causal"))
    q = torch.randn((1, 16, 2, 128), device="cuda:0").bfloat16()
    with pytest.raises(ParamError) as e:
        attn(q, q.to("cuda:1"), q)
    assert e.value.param == "k"
    q1 = q.to("cuda:1")  # and the kernel loads and runs on the second device
    o = attn(q1, q1, q1)
    assert o.device == q1.device and not torch.isnan(o).any()


# --------------------------------------------------------------------------- interop


def _check_simple(attn: Any, q: Any, o: Any) -> None:
    mask = mask_of("causal")
    b, n, h, d = q.shape
    qp, op = q.reshape(b * n, h, d), o.reshape(b * n, h, d)
    fns = oracle_masks(torch, mask, [n] * b, [{}] * b, "cuda")
    ref_o, ref_lse = reference(torch, qp, qp, qp, [n] * b, fns, 1 / math.sqrt(d))
    assert compare(torch, op, None, ref_o, ref_lse) < TOL


def test_interop_dlpack_cai_and_raw():
    from cmc.runtime import DeviceArray, load

    attn = load(artifact("causal"))
    q = torch.randn((2, 129, 2, 64), device="cuda").half()

    class OnlyDLPack:
        def __init__(self, t):
            self.t = t

        def __dlpack__(self, stream=None):
            return self.t.__dlpack__(stream=stream)

        def __dlpack_device__(self):
            return self.t.__dlpack_device__()

    class OnlyCAI:
        def __init__(self, t):
            self.__cuda_array_interface__ = t.__cuda_array_interface__

    torch.cuda.synchronize()
    o = torch.full_like(q, float("nan"))
    attn(OnlyDLPack(q), OnlyDLPack(q), OnlyDLPack(q), out=OnlyDLPack(o))
    torch.cuda.synchronize()
    _check_simple(attn, q, o)
    o2 = torch.full_like(q, float("nan"))
    attn(OnlyCAI(q), OnlyCAI(q), OnlyCAI(q), out=OnlyCAI(o2))
    torch.cuda.synchronize()
    _check_simple(attn, q, o2)
    # raw: the runtime's own DeviceArray, bf16 uploaded from numpy, output allocated by cmc
    host = np.random.default_rng(0).standard_normal((1, 200, 2, 128)).astype(np.float32)
    qa = DeviceArray.from_numpy(host, "bf16")
    oa, lse = attn(qa, qa, qa, return_lse=True)
    assert isinstance(oa, DeviceArray) and lse.shape == (1, 2, 200)
    got = torch.from_numpy(oa.to_numpy()).cuda()
    qt = torch.from_numpy(qa.to_numpy()).cuda().bfloat16()
    _check_simple(attn, qt, got)
    assert np.isneginf(lse.to_numpy()).sum() == 0


def test_interop_cupy():
    cupy = pytest.importorskip("cupy")
    from cmc.runtime import load

    attn = load(artifact("causal"))
    q = torch.randn((1, 300, 2, 64), device="cuda").half()
    torch.cuda.synchronize()
    qc = cupy.asarray(q)  # shares memory via CAI
    oc = attn(qc, qc, qc)
    assert isinstance(oc, cupy.ndarray) and oc.shape == qc.shape and oc.dtype == qc.dtype
    cupy.cuda.get_current_stream().synchronize()
    _check_simple(attn, q, torch.as_tensor(oc, device="cuda"))
    s = cupy.cuda.Stream(non_blocking=True)
    with s:
        o2 = attn(qc, qc, qc)
    s.synchronize()
    _check_simple(attn, q, torch.as_tensor(o2, device="cuda"))


def test_runs_on_the_callers_torch_stream():
    from cmc.runtime import load

    attn = load(artifact("causal"))
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        # produced on s, consumed on s: correct only if the kernel is ordered on s too
        q = torch.randn((2, 1000, 2, 128), device="cuda").bfloat16() * 1.5
        o = attn(q, q, q)
        o2 = o.clone()
    s.synchronize()
    _check_simple(attn, q, o2)


# --------------------------------------------------------------------------- torch.compile, graphs


def test_torch_compile_and_cuda_graph():
    from cmc.runtime import load, torch_op

    attn = load(artifact("hstu"))
    mask = mask_of("hstu")
    fn = torch_op.register(attn, "gpu_test_hstu")
    b, n, h, d = 2, 257, 4, 128
    q = torch.randn((b, n, h, d), device="cuda").bfloat16()
    nt = torch.tensor([0, 32], dtype=torch.int32, device="cuda")

    def f(q, k, v, nt):
        o, lse = fn(q, k, v, return_lse=True, n_targets=nt)
        return o * 1.0, lse

    compiled = torch.compile(f, backend="aot_eager", fullgraph=True)
    o, lse = compiled(q, q, q, nt)
    torch.cuda.synchronize()
    per_seq = [{"n_targets": 0}, {"n_targets": 32}]
    fns = oracle_masks(torch, mask, [n] * b, per_seq, "cuda")
    qp = q.reshape(b * n, h, d)
    ref_o, ref_lse = reference(torch, qp, qp, qp, [n] * b, fns, 1 / math.sqrt(d))
    assert compare(torch, o.reshape(b * n, h, d), lse.permute(1, 0, 2).reshape(h, b * n),
                   ref_o, ref_lse) < TOL

    # CUDA graph: warm up on a side stream, capture, then replay with new inputs
    static_q = q.clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            f(static_q, static_q, static_q, nt)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        g_o, g_lse = f(static_q, static_q, static_q, nt)
    new_q = torch.randn_like(q)
    static_q.copy_(new_q)
    graph.replay()
    torch.cuda.synchronize()
    qp = new_q.reshape(b * n, h, d)
    ref_o, ref_lse = reference(torch, qp, qp, qp, [n] * b, fns, 1 / math.sqrt(d))
    assert compare(torch, g_o.reshape(b * n, h, d), g_lse.permute(1, 0, 2).reshape(h, b * n),
                   ref_o, ref_lse) < TOL


def test_plan_gives_the_unplanned_result_and_replays_in_a_graph():
    from cmc.runtime import load

    attn = load(artifact("hstu"))
    mask = mask_of("hstu")
    lens, h, d = [300, 1, 777, 129], 4, 128
    cu = torch.tensor([0, *itertools.accumulate(lens)], dtype=torch.int32, device="cuda")
    nt = torch.tensor([7, 0, 300, 129], dtype=torch.int32, device="cuda")
    q = torch.randn((sum(lens), h, d), device="cuda").bfloat16()
    k, v = torch.randn_like(q), torch.randn_like(q)
    plain = attn(q, k, v, cu_seqlens=cu, n_targets=nt)
    plan = attn.plan(cu_seqlens=cu, n_targets=nt)
    out = torch.full_like(q, float("nan"))
    attn(q, k, v, plan=plan, out=out)
    torch.cuda.synchronize()
    assert torch.equal(out, plain)  # same kernel, same descriptor values: bitwise equal
    cu.zero_()  # the plan holds its own copy of what it checked
    nt.fill_(10**6)
    graph = torch.cuda.CUDAGraph()
    static_out = torch.full_like(q, float("nan"))
    attn(q, k, v, plan=plan, out=static_out)  # warm-up outside the capture
    with torch.cuda.graph(graph):
        attn(q, k, v, plan=plan, out=static_out)
    new_q = torch.randn_like(q)
    q.copy_(new_q)
    static_out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    per_seq = [{"n_targets": t} for t in (7, 0, 300, 129)]
    fns = oracle_masks(torch, mask, lens, per_seq, "cuda")
    ref_o, ref_lse = reference(torch, new_q, k, v, lens, fns, 1 / math.sqrt(d))
    o, lse = attn(new_q, k, v, plan=plan, return_lse=True)
    assert compare(torch, static_out, lse, ref_o, ref_lse) < TOL
    assert compare(torch, o, lse, ref_o, ref_lse) < TOL


@pytest.mark.parametrize("name", ["causal", "hstu"])
def test_replayed_planned_calls_read_the_new_inputs_and_write_fresh_outputs(name):
    from cmc.runtime import load

    attn = load(artifact(name))
    mask = mask_of(name)
    b, n, h, d = 3, 700, 4, 128
    params = {"n_targets": [5, 0, 700]} if name == "hstu" else {}
    plan = attn.plan(batch=b, seq_len=n, **params)
    q = torch.randn((b, n, h, d), device="cuda").bfloat16()
    k, v = torch.randn_like(q), torch.randn_like(q)
    given = torch.empty_like(q)
    calls = {  # each checked and recorded once here, then replayed below
        "fresh": lambda: (attn(q, k, v, plan=plan), None),
        "lse": lambda: attn(q, k, v, plan=plan, return_lse=True),
        "out=": lambda: (attn(q, k, v, plan=plan, out=given), None),
    }
    for call in calls.values():
        call()
    per_seq = [{p: vals[i] for p, vals in params.items()} for i in range(b)]
    fns = oracle_masks(torch, mask, [n] * b, per_seq, "cuda")
    for _ in range(2):  # replayed: same pointers, new contents
        for label, call in calls.items():
            q.copy_(torch.randn_like(q))
            given.fill_(float("nan"))
            poison_allocator(q.numel() * 2)
            o, lse = call()
            torch.cuda.synchronize()
            assert (o is given) == (label == "out=")
            assert (o.data_ptr() == given.data_ptr()) == (label == "out=")
            qp, kp, vp = (x.reshape(b * n, h, d) for x in (q, k, v))
            ref_o, ref_lse = reference(torch, qp, kp, vp, [n] * b, fns, 1 / math.sqrt(d))
            got_lse = None if lse is None else lse.permute(1, 0, 2).reshape(h, b * n)
            assert compare(torch, o.reshape(b * n, h, d), got_lse, ref_o, ref_lse) < TOL, label
    assert torch.equal(attn(q, k, v, plan=plan, out=torch.empty_like(q)), calls["fresh"]()[0])


# --------------------------------------------------------------------------- the C sample


def test_c_demo_passes_on_the_gpu(tmp_path):
    from ..test_c_sample import compile_demo

    art = artifact("causal")
    if shutil.which("gcc") is None and shutil.which("cc") is None:
        pytest.skip("no C compiler on this machine")
    r = compile_demo(art, tmp_path / "attn_demo")
    assert r.returncode == 0, r.stderr
    run = subprocess.run([str(tmp_path / "attn_demo"), str(art)], capture_output=True,
                         text=True, timeout=120)
    # rc < 0: killed by that signal; the demo's stdout is line-buffered, so it shows how far
    # it got
    assert run.returncode == 0 and "PASS" in run.stdout, \
        f"rc {run.returncode}\n{run.stdout}{run.stderr}"
