"""CPU checks of the torch integration (cmc/runtime/torch_op.py, tests/gpu/harness.py,
examples/train_tiny.py) with the CPU build of torch; every test skips without torch, so CI
(no torch) stays green. No kernel runs here: the Attention is a stub that computes float64
masked softmax attention with torch and checks the LSE layout the real runtime would get.
What this does not cover (the real kernels, CUDA graphs, streams) is GPU-only."""

from __future__ import annotations

import ast
import importlib.util
import math
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from cmc.runtime import torch_op  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


# --------------------------------------------------------------------------- a stub Attention


def _manual_grads(q, k, v, do, lengths, scale):
    """Causal attention gradients by the closed form (no autograd: the backward op's impl
    runs below the autograd dispatch key). Packed [T, H, D]; GQA by repeat and group sum."""
    g = q.shape[1] // k.shape[1]
    dq, dk, dv = (torch.zeros_like(x, dtype=torch.float64) for x in (q, k, v))
    start = 0
    for n in lengths:
        sl = slice(start, start + n)
        qs, dos = q[sl].double().transpose(0, 1), do[sl].double().transpose(0, 1)
        ks, vs = (x[sl].double().transpose(0, 1).repeat_interleave(g, 0) for x in (k, v))
        s = (qs @ ks.transpose(1, 2)) * scale
        s = s.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), float("-inf"))
        p = torch.softmax(s, -1)
        o = p @ vs
        dp = dos @ vs.transpose(1, 2)
        ds = p * (dp - (dos * o).sum(-1, keepdim=True))
        dq[sl] = ((ds @ ks) * scale).transpose(0, 1)
        hk = k.shape[1]
        dk[sl] = ((ds.transpose(1, 2) @ qs) * scale).view(hk, g, n, -1).sum(1).transpose(0, 1)
        dv[sl] = (p.transpose(1, 2) @ dos).view(hk, g, n, -1).sum(1).transpose(0, 1)
        start += n
    return dq, dk, dv


class StubAttention:
    """The parts of loader.Attention the torch code uses: name, params, __call__ (batch or
    packed layout; lse [B, Hq, L] as a view of a contiguous [Hq, B*L], or [Hq, T]) and
    backward (checks the LSE is exactly that layout, as run_backward does). Causal mask."""

    def __init__(self, name="stub", params=(("n", "batch"),)):
        self.name = name
        self.params = list(params)
        self.calls: list[dict[str, Any]] = []
        self.bwd_calls: list[dict[str, Any]] = []

    @staticmethod
    def _packed(x, cu_seqlens):
        if x.dim() == 4:
            return x.reshape(-1, x.shape[2], x.shape[3]), [x.shape[1]] * x.shape[0]
        cu = cu_seqlens.tolist()
        return x, [b - a for a, b in zip(cu[:-1], cu[1:], strict=True)]

    def _forward(self, q, k, v, scale, cu_seqlens):
        from tests.gpu.harness import causal_mask_fn, reference

        qp, lengths = self._packed(q, cu_seqlens)
        kp, _ = self._packed(k, cu_seqlens)
        vp, _ = self._packed(v, cu_seqlens)
        scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
        masks = [causal_mask_fn(torch, n, q.device) for n in lengths]
        o, lse = reference(torch, qp, kp, vp, lengths, masks, scale)
        return o.to(q.dtype).reshape(q.shape), lse.float(), lengths, scale

    def __call__(self, q, k, v, *, scale=None, return_lse=False, out=None, cu_seqlens=None,
                 max_len=None, stream=None, plan=None, deterministic=False, **params):
        assert not torch.is_grad_enabled() or not any(x.requires_grad for x in (q, k, v))
        self.calls.append({"return_lse": return_lse, "params": params, "plan": plan,
                           "cu_seqlens": cu_seqlens, "max_len": max_len})
        o, lse, _, _ = self._forward(q, k, v, scale, cu_seqlens)
        if not return_lse:
            return o
        if q.dim() == 4:
            b, seq, h = q.shape[0], q.shape[1], q.shape[2]
            lse = lse.contiguous().view(h, b, seq).permute(1, 0, 2)
        return o, lse

    def backward(self, dout, q, k, v, out, lse, *, scale=None, cu_seqlens=None, max_len=None,
                 plan=None, stream=None, deterministic=False, **params):
        assert isinstance(deterministic, bool)
        assert dout.shape == q.shape and dout.dtype == q.dtype and out.shape == q.shape
        tokens = q.shape[0] if q.dim() == 3 else q.shape[0] * q.shape[1]
        hq = q.shape[-2]
        assert lse.dtype == torch.float32
        if q.dim() == 4:  # run_backward's rule: [B, Hq, L] with strides (L, B*L, 1)
            b, seq = q.shape[0], q.shape[1]
            assert tuple(lse.shape) == (b, hq, seq), lse.shape
            assert lse.stride() == (seq, b * seq, 1), lse.stride()
        else:
            assert tuple(lse.shape) == (hq, tokens) and lse.is_contiguous()
        self.bwd_calls.append({"params": params, "plan": plan, "deterministic": deterministic})
        qp, lengths = self._packed(q, cu_seqlens)
        kp, _ = self._packed(k, cu_seqlens)
        vp, _ = self._packed(v, cu_seqlens)
        dp, _ = self._packed(dout, cu_seqlens)
        scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
        dq, dk, dv = _manual_grads(qp, kp, vp, dp, lengths, scale)
        return (dq.to(q.dtype).reshape(q.shape), dk.to(k.dtype).reshape(k.shape),
                dv.to(v.dtype).reshape(v.shape))


def _dense_causal(q, k, v, scale=None):
    """Batch layout [B, L, H, D] float64 reference via plain softmax (GQA by repeat)."""
    q, k, v = (x.double() for x in (q, k, v))
    g = q.shape[2] // k.shape[2]
    k, v = k.repeat_interleave(g, 2), v.repeat_interleave(g, 2)
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) * scale
    n = q.shape[1]
    s = s.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), float("-inf"))
    return torch.einsum("bhqk,bkhd->bqhd", torch.softmax(s, -1), v)


def _qkv(b=2, seq=5, hq=4, hkv=2, d=8, dtype=None, grad=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    dtype = dtype or torch.float64
    out = [torch.randn(b, seq, h, d, generator=g, dtype=dtype) for h in (hq, hkv, hkv)]
    return [x.requires_grad_(grad) for x in out]


# --------------------------------------------------------------------------- harness


def test_reference_grads_match_dense_softmax():
    from tests.gpu.harness import causal_mask_fn, compare, reference, reference_grads

    q, k, v = _qkv(grad=False)
    do = torch.randn_like(q)
    b, seq, hq, d = q.shape
    packed = [x.reshape(b * seq, x.shape[2], d) for x in (q, k, v, do)]
    lengths = [seq] * b
    masks = [causal_mask_fn(torch, n, "cpu") for n in lengths]
    scale = 0.3
    o, lse, dq, dk, dv = reference_grads(torch, *packed[:3], packed[3], lengths, masks, scale)
    qr, kr, vr = (x.detach().clone().requires_grad_(True) for x in (q, k, v))
    want = _dense_causal(qr, kr, vr, scale)
    want.backward(do)
    assert torch.allclose(o, want.reshape(b * seq, hq, d).detach())
    for got, ref in ((dq, qr.grad), (dk, kr.grad), (dv, vr.grad)):
        assert torch.allclose(got, ref.reshape(got.shape), atol=1e-10)
    o2, lse2 = reference(torch, *packed[:3], lengths, masks, scale)
    assert compare(torch, o2, lse2, o, lse) < 1e-12
    s = torch.einsum("bqhd,bkhd->bhqk", q, k.repeat_interleave(2, 2)) * scale
    s = s.masked_fill(~torch.ones(seq, seq, dtype=torch.bool).tril(), float("-inf"))
    want_lse = torch.logsumexp(s, -1).permute(1, 0, 2).reshape(hq, -1)
    assert torch.allclose(lse, want_lse)


def test_reference_grads_empty_rows_and_sequences():
    """A row that sees no key: O 0, LSE -inf, gradients finite (no NaN); a zero-length
    sequence is skipped; every sequence empty gives zero gradients."""
    from tests.gpu.harness import compare_grads, reference_grads

    q, k, v = (x.reshape(-1, x.shape[2], x.shape[3]) for x in _qkv(b=1, seq=4, grad=False))
    do = torch.ones_like(q)

    def none_first(r0, r1):  # row 0 sees nothing, others causal
        vis = torch.ones(4, 4, dtype=torch.bool).tril()
        vis[0] = False
        return vis[r0:r1]

    o, lse, dq, dk, dv = reference_grads(torch, q, k, v, do, [4], [none_first], 0.5)
    assert (o[0] == 0).all() and torch.isinf(lse[:, 0]).all()
    assert compare_grads(torch, (dq, dk, dv), (dq, dk, dv)) == {"dq": 0, "dk": 0, "dv": 0}
    assert (dq[0] == 0).all()
    o, lse, dq, dk, dv = reference_grads(torch, q[:0], k[:0], v[:0], do[:0], [0], [None], 0.5)
    assert dq.shape == (0, 4, 8) and dk.shape == (0, 2, 8)


def test_compare_grads_zero_reference():
    """A gradient that is zero in exact arithmetic (window 1: dS = 0): rounding noise passes,
    a wrong gradient of the usual size fails, an exact zero is 0, a NaN is refused."""
    from tests.gpu.harness import compare_grads

    zero = torch.zeros(64, 4, 8, dtype=torch.float64)
    noise = torch.full_like(zero, 1e-7)
    wrong = torch.randn(zero.shape, generator=torch.Generator().manual_seed(1))
    assert compare_grads(torch, (noise,), (zero,), ("dq",))["dq"] < 1e-4
    assert compare_grads(torch, (wrong,), (zero,), ("dq",))["dq"] > 10
    assert compare_grads(torch, (zero,), (zero,), ("dq",)) == {"dq": 0.0}
    with pytest.raises(AssertionError, match="NaN in dq"):
        compare_grads(torch, (zero / 0,), (zero,), ("dq",))


# --------------------------------------------------------------------------- autograd.Function


def test_autograd_function_plumbing():
    attn = StubAttention()
    q, k, v = _qkv()
    o, lse = torch_op.autograd_call(attn, q, k, v, scale=None, return_lse=True, out=None,
                                    cu_seqlens=None, max_len=None, stream=None, plan="P",
                                    deterministic=True, params={"n": [1, 2]})
    assert o.requires_grad and not lse.requires_grad
    assert attn.calls[-1]["return_lse"] and attn.calls[-1]["plan"] == "P"
    do = torch.randn_like(o)
    o.backward(do)
    assert attn.bwd_calls[-1] == {"params": {"n": [1, 2]}, "plan": "P", "deterministic": True}
    qr, kr, vr = (x.detach().clone().requires_grad_(True) for x in (q, k, v))
    _dense_causal(qr, kr, vr).backward(do)
    for x, r in ((q, qr), (k, kr), (v, vr)):
        assert torch.allclose(x.grad, r.grad, atol=1e-10)
    o2 = torch_op.autograd_call(attn, q, k, v, scale=None, return_lse=False, out=None,
                                cu_seqlens=None, max_len=None, stream=None, plan=None,
                                deterministic=False, params={"n": [1, 2]})
    assert not isinstance(o2, tuple)
    from cmc.errors import ParamError

    with pytest.raises(ParamError):
        torch_op.autograd_call(attn, q, k, v, scale=None, return_lse=False, out=o2,
                               cu_seqlens=None, max_len=None, stream=None, plan=None,
                               deterministic=False, params={})


# --------------------------------------------------------------------------- the custom op


_counter = [0]


@pytest.fixture
def cpu_op(monkeypatch):
    """torch_op.register on a StubAttention, with the ops' device_types dropped so that their
    real impl (and autograd formula) run on CPU tensors."""
    real = torch.library.custom_op

    def any_device(*a, **kw):
        kw["device_types"] = None
        return real(*a, **kw)

    monkeypatch.setattr(torch.library, "custom_op", any_device)
    _counter[0] += 1

    def make(params=(("n", "batch"),)):
        attn = StubAttention(params=params)
        return attn, torch_op.register(attn, f"cpu_stub_{_counter[0]}_{len(params)}",
                                       namespace="cmc_cpu_test")
    return make


def test_backward_schema():
    attn = StubAttention(params=(("w", "scalar"), ("n", "batch"), ("s", "segments")))
    fwd, plan = torch_op._schema(attn)
    bwd = torch_op._backward_schema(attn)
    assert bwd == ("(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, "
                   "Tensor? cu_seqlens, int? max_len, float? scale, bool deterministic, "
                   "int p_w, Tensor p_n, Tensor p_s_offsets, Tensor p_s_starts) "
                   "-> (Tensor, Tensor, Tensor)")
    assert [n for _, _, n in plan] == [("p_w",), ("p_n",), ("p_s_offsets", "p_s_starts")]


@pytest.mark.parametrize("layout", ["batch", "packed"])
def test_op_forward_backward_on_cpu(cpu_op, layout):
    attn, fn = cpu_op()
    q, k, v = _qkv()
    kw: dict[str, Any] = {"n": 3}
    if layout == "packed":
        q, k, v = (x.detach().reshape(-1, x.shape[2], x.shape[3]).requires_grad_(True)
                   for x in (q, k, v))
        kw["cu_seqlens"] = [0, 5, 10]
        kw["max_len"] = 5
    o, lse = fn(q, k, v, return_lse=True, **kw)
    assert o.shape == q.shape
    tokens = 10
    want_lse = (2, 4, 5) if layout == "batch" else (4, tokens)
    assert tuple(lse.shape) == want_lse and not lse.requires_grad
    do = torch.randn_like(o)
    o.backward(do)
    assert attn.bwd_calls[-1]["deterministic"] is False
    n = attn.bwd_calls[-1]["params"]["n"]
    assert n.dtype == torch.int32 and n.tolist() == [3, 3]
    qr, kr, vr = (x.detach().clone().reshape(2, 5, x.shape[-2], 8).requires_grad_(True)
                  for x in (q, k, v))
    _dense_causal(qr, kr, vr).backward(do.reshape(2, 5, 4, 8))
    for x, r in ((q, qr), (k, kr), (v, vr)):
        assert torch.allclose(x.grad, r.grad.reshape(x.shape), atol=1e-10)
    # no grad: the op runs without the LSE; with grad the LSE is asked for
    with torch.no_grad():
        o2 = fn(q, k, v, **kw)
    assert attn.calls[-1]["return_lse"] is False and torch.allclose(o2, o)


def test_op_opcheck(cpu_op):
    """torch.library.opcheck: schema, fake impl, autograd registration, aot dispatch."""
    attn, fn = cpu_op()
    q, k, v = _qkv(d=8)
    n = torch.tensor([2, 5], dtype=torch.int32)
    torch.library.opcheck(fn.op, (q, k, v, None, None, None, True, False, n))
    q2, k2, v2 = (x.detach() for x in (q, k, v))
    torch.library.opcheck(fn.op, (q2, k2, v2, None, None, 0.5, False, False, n))
    o, lse = fn.op(q2, k2, v2, None, None, None, True, False, n)
    torch.library.opcheck(fn.backward_op,
                          (torch.randn_like(o), q2, k2, v2, o, lse, None, None, None, False, n),
                          test_utils=("test_schema", "test_faketensor",
                                      "test_aot_dispatch_dynamic"))


def test_op_segments_and_scalar_params(cpu_op):
    attn, fn = cpu_op((("w", "scalar"), ("s", "segments")))
    q, k, v = _qkv()
    o = fn(q, k, v, w=7, s=[[0, 2], [1]])
    o.sum().backward()
    got = attn.bwd_calls[-1]["params"]
    assert got["w"] == 7
    assert [t.tolist() for t in (got["s"].offsets, got["s"].starts)] == [[0, 2, 3], [0, 2, 1]]


def test_make_fx_traces_forward_and_backward(cpu_op):
    from torch.fx.experimental.proxy_tensor import make_fx

    attn, fn = cpu_op()
    n = torch.tensor([5, 5], dtype=torch.int32)

    def step(q, k, v, do, n):
        o = fn(q, k, v, n=n)
        dq, dk, dv = torch.autograd.grad(o, (q, k, v), do)
        return o, dq, dk, dv

    q, k, v = _qkv()
    before = len(attn.calls)
    gm = make_fx(step, tracing_mode="fake")(q, k, v, torch.randn_like(q), n)
    assert len(attn.calls) == before  # fake impls only
    code = gm.code
    assert f"{fn.op._qualname.split('::')[0]}.{fn.op._qualname.split('::')[1]}" in code
    assert "_backward" in code


@pytest.mark.parametrize("dynamic", [False, True])
def test_torch_compile_fullgraph(cpu_op, dynamic):
    attn, fn = cpu_op()

    class Layer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(4 * 8, 4 * 8, dtype=torch.float64)

        def forward(self, q, k, v, n):
            o = fn(q, k, v, n=n)
            return self.proj(o.reshape(*o.shape[:2], -1))

    layer = Layer()
    compiled = torch.compile(layer, backend="aot_eager", fullgraph=True, dynamic=dynamic)
    q, k, v = _qkv()
    n = torch.tensor([5, 5], dtype=torch.int32)
    y = compiled(q, k, v, n)
    y.sum().backward()
    qr, kr, vr = (x.detach().clone().requires_grad_(True) for x in (q, k, v))
    layer(qr, kr, vr, n).sum().backward()
    for x, r in ((q, qr), (k, kr), (v, vr)):
        assert torch.allclose(x.grad, r.grad, atol=1e-10)
    assert attn.bwd_calls, "the backward op ran"


def test_torch_compile_int_batch_param(cpu_op):
    """A plain int for a batch parameter (broadcast by torch.full) traces without a break."""
    attn, fn = cpu_op()
    compiled = torch.compile(lambda q, k, v: fn(q, k, v, n=3), backend="aot_eager",
                             fullgraph=True)
    q, k, v = _qkv(grad=False)
    compiled(q, k, v)


# --------------------------------------------------------------------------- GPU files import


@pytest.mark.parametrize("path", ["tests/gpu/test_backward_gpu.py",
                                  "tests/gpu/test_gpu_correctness.py",
                                  "tests/gpu/test_artifacts_gpu.py",
                                  "tests/gpu/test_sanitizer.py",
                                  "tests/gpu/gpu_common.py", "tests/gpu/harness.py"])
def test_gpu_modules_import(path):
    name = "cpu_import_" + Path(path).stem
    mod = f"tests.gpu.{Path(path).stem}"
    importlib.import_module(mod)
    assert name


def test_train_tiny_imports_and_model_shapes():
    spec = importlib.util.spec_from_file_location("train_tiny", ROOT / "examples/train_tiny.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    calls = []

    def attend(q, k, v):
        calls.append((q.shape, q.is_contiguous()))
        return _dense_causal(q, k, v).float()

    m = mod.Tiny(attend)
    tokens = torch.randint(0, mod.VOCAB, (mod.B, mod.L))
    logits = m(tokens)
    assert logits.shape == (mod.B, mod.L, mod.VOCAB)
    assert calls[0][0] == (mod.B, mod.L, mod.H, mod.D)
    ast.parse((ROOT / "examples/train_tiny.py").read_text())


@pytest.mark.parametrize("packed", [True, False])
def test_harness_pipeline_every_sample(packed):
    """What tests/gpu/test_backward_gpu.py's setup_case does, on CPU at small lengths: the
    harness' parameters, oracle masks (an empty sequence included) and float64 reference
    gradients for every sample; no NaN, dK = dV = 0 for keys nobody sees."""
    import numpy as np

    from tests.gpu.gpu_common import SAMPLES, mask_of
    from tests.gpu.harness import (
        call_params,
        compare_grads,
        oracle_masks,
        reference_grads,
        scalar_values,
        seq_params,
    )

    lengths = [1, 0, 9, 20, 13] if packed else [12, 12]
    for p in SAMPLES:
        mask = mask_of(p.stem)
        rng = np.random.default_rng(3)
        scal = scalar_values(mask, 3)
        per_seq = [seq_params(mask, n, 3 + j, rng, scal) for j, n in enumerate(lengths)]
        kw = call_params(mask, per_seq)
        assert set(kw) == {q.name for q in mask.params}
        t = sum(lengths)
        g = torch.Generator().manual_seed(0)
        q, k, v, do = (torch.randn((t, h, 8), generator=g).to(torch.bfloat16)
                       for h in (4, 2, 2, 4))
        masks = oracle_masks(torch, mask, lengths, per_seq, "cpu")
        o, lse, dq, dk, dv = reference_grads(torch, q, k, v, do, lengths, masks, 0.35)
        assert compare_grads(torch, (dq, dk, dv), (dq, dk, dv)) == \
            {"dq": 0.0, "dk": 0.0, "dv": 0.0}, p.stem
        dense = [fn(0, n) for n, fn in zip(lengths, masks, strict=True)]
        seen = torch.cat([m.any(0) for m in dense])
        sees = torch.cat([m.any(1) for m in dense])
        assert seen.shape == (t,) and sees.shape == (t,)
        assert (dk[~seen] == 0).all() and (dv[~seen] == 0).all() and (dq[~sees] == 0).all()


def test_reference_grads_match_sdpa_on_cpu():
    """test_gpu_correctness.test_reference_grads_match_sdpa_autograd, on CPU tensors."""
    from tests.gpu.harness import check_reference_grads_against_sdpa

    check_reference_grads_against_sdpa(torch, "cpu", [5, 0, 17], (4, 2), 16)


def test_real_attention_op_traces_on_fake_tensors(tmp_path, monkeypatch):
    """torch_op.register on a real loader.Attention (fake driver, fake artifact): forward and
    backward of fn traced by make_fx over fake tensors (CPU: this torch has no CUDA device guard; the ops' fakes only: no kernel),
    in both layouts."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    from cmc.runtime import loader

    from .test_runtime_cpu import FakeGPU, write_artifact

    FakeGPU(monkeypatch)
    attn = loader.load(write_artifact(tmp_path, name="hstu"))
    fn = torch_op.register(attn, "cpu_fake_cuda_hstu")

    def step(q, k, v, do, cu):
        o, lse = fn(q, k, v, return_lse=True, cu_seqlens=cu, n_targets=2)
        dq, dk, dv = torch.autograd.grad(o, (q, k, v), do)
        return o, lse, dq, dk, dv

    with FakeTensorMode():
        for shape, cu in (((2, 16, 4, 128), None),
                          ((32, 4, 128), torch.tensor([0, 10, 32], dtype=torch.int32,
                                                      device="cpu"))):
            q = torch.empty(shape, dtype=torch.bfloat16, device="cpu", requires_grad=True)
            kv = (*shape[:-2], 2, 128)
            k, v = (torch.empty(kv, dtype=torch.bfloat16, device="cpu", requires_grad=True)
                    for _ in range(2))
            gm = make_fx(step)(q, k, v, torch.empty_like(q), cu)
            o, lse, dq, dk, dv = gm(q, k, v, torch.empty_like(q), cu)
            assert o.shape == q.shape and dq.shape == q.shape and dk.shape == k.shape
            assert tuple(lse.shape) == ((2, 4, 16) if len(shape) == 4 else (4, 32))
            assert "cpu_fake_cuda_hstu_backward" in gm.code


def test_train_tiny_step_through_autograd_function():
    """examples/train_tiny.py's cmc_attend (bf16 casts of the qkv views, plan=) through
    AttentionFunction on the stub: one step gives the qkv weights a gradient close to the
    float reference model's."""
    spec = importlib.util.spec_from_file_location("train_tiny", ROOT / "examples/train_tiny.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    attn = StubAttention(params=())

    def cmc_attend(q, k, v):
        o = torch_op.autograd_call(attn, q.bfloat16(), k.bfloat16(), v.bfloat16(), scale=None,
                                   return_lse=False, out=None, cu_seqlens=None, max_len=None,
                                   stream=None, plan="P", deterministic=False, params={})
        return o.float()

    torch.manual_seed(0)
    models = [mod.Tiny(cmc_attend), mod.Tiny(lambda q, k, v: _dense_causal(q, k, v).float())]
    models[1].load_state_dict(models[0].state_dict())
    data = torch.randint(0, mod.VOCAB, (mod.B, mod.L + 1))
    grads = []
    for m in models:
        loss = torch.nn.functional.cross_entropy(m(data[:, :-1]).reshape(-1, mod.VOCAB),
                                                 data[:, 1:].reshape(-1))
        loss.backward()
        grads.append(m.qkv.weight.grad)
    assert attn.bwd_calls and attn.bwd_calls[-1]["plan"] == "P"
    err = (grads[0] - grads[1]).norm() / grads[1].norm()
    assert err < 5e-2, err


def test_torch_compile_inductor_trains(cpu_op):
    """test_backward_gpu.test_torch_compile_fullgraph_trains's layer (default backend,
    inductor) on CPU: the ops' fakes' strides agree with what impl returns."""
    import shutil

    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("inductor on CPU needs a C compiler")
    attn, fn = cpu_op()

    class Layer(torch.nn.Module):
        def forward(self, q, k, v):
            return fn(q * 1.0, k, v, n=3)

    layer = torch.compile(Layer(), fullgraph=True)
    q, k, v = _qkv()
    out = layer(q, k, v)
    do = torch.randn_like(out)
    out.backward(do)
    qr, kr, vr = (x.detach().clone().requires_grad_(True) for x in (q, k, v))
    _dense_causal(qr, kr, vr).backward(do)
    for x, r in ((q, qr), (k, kr), (v, vr)):
        assert torch.allclose(x.grad, r.grad, atol=1e-10)
    assert attn.bwd_calls


def test_torch_compile_fullgraph_python_list_params(cpu_op):
    """Lists for batch and segments parameters (and cu_seqlens) under fullgraph: numpy does
    not trace, so fn packs them in plain Python there; same op arguments as eager."""
    from cmc.errors import ParamError

    attn, fn = cpu_op((("n", "batch"), ("s", "segments")))
    q, k, v = (x.detach().flatten(0, 1) for x in _qkv())

    def f(q, k, v):
        return fn(q, k, v, cu_seqlens=[0, 5, 10], n=[1, 2], s=[[0, 2], [1]])

    want = f(q, k, v)
    eager = attn.calls[-1]["params"]
    got = torch.compile(f, backend="aot_eager", fullgraph=True)(q, k, v)
    assert torch.equal(got, want)
    seen = attn.calls[-1]["params"]
    assert seen["n"].tolist() == eager["n"].tolist() == [1, 2]
    for part in ("offsets", "starts"):
        a, b = getattr(seen["s"], part), getattr(eager["s"], part)
        assert a.dtype == b.dtype == torch.int32 and a.tolist() == b.tolist()
    bad = torch.compile(lambda q, k, v: fn(q, k, v, cu_seqlens=[0, 5, 10], n=[1, 2],
                                           s=[[2, 0], [1]]), backend="aot_eager",
                        fullgraph=True)
    # a bad value: eager raises the ParamError; fullgraph tracing cannot raise it (Dynamo
    # does not trace the exception's __init__) and fails with its source line in the message
    with pytest.raises(ParamError, match="sorted"):
        fn(q, k, v, cu_seqlens=[0, 5, 10], n=[1, 2], s=[[2, 0], [1]])
    with pytest.raises(Exception, match="starts must be sorted"):
        bad(q, k, v)
