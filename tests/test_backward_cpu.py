"""CPU tests of the runtime's backward (cmc/runtime/backward.py) on the fake driver of
test_runtime_cpu: the manifest's backward section and its checks, the launch sequence with
the descriptor and cmc_bwd_args bytes each kernel gets, the workspaces, and the named
ParamErrors (each followed by a good call that still launches)."""

from __future__ import annotations

import ctypes
import math
import struct
from pathlib import Path
from typing import Any

import pytest

from cmc.errors import ArtifactError, ParamError
from cmc.runtime import loader
from cmc.runtime.arrays import DeviceArray

from .test_runtime_cpu import (
    LINEAR_TILING,
    FakeGPU,
    decode,
    edit_manifest,
    finish_artifact,
    ints_at,
    write_artifact,
)

ROLES = ("pre", "kv", "dq", "post")
# cmc_bwd_args as the contract lays it out (120 bytes)
ARGS = [(n, "uint64_t", 8) for n in ("dout", "dq", "dk", "dv", "dq_accum", "dsum")] + \
    [(f"{t}_stride_{w}", "int64_t", 8) for t in ("dout", "dq", "dk", "dv")
     for w in ("tok", "head")] + [("total_tokens", "int32_t", 4), ("flags", "int32_t", 4)]


def args_section() -> dict[str, Any]:
    fields, off = [], 0
    for n, ct, size in ARGS:
        fields.append({"name": n, "ctype": ct, "offset": off, "size": size})
        off += size
    assert off == 120
    return {"struct": "cmc_bwd_args", "size": 120, "align": 8, "fields": fields}


def write_bwd_artifact(root: Path, name: str = "hstu", params=(("n_targets", "batch"),),
                       archs=("sm_90a",), variants=(("fp16", 64), ("fp16", 128))) -> Path:
    """write_artifact plus the backward kernels (one fake cubin per role) and section,
    consistent with their cubins and header macros (finish_artifact)."""
    d = write_artifact(root, name, params, archs, list(variants))

    def add(m: dict[str, Any]) -> None:
        for k in m["kernels"]:
            k.update({"pass": "forward", "role": "fwd", "params": ["desc"]})
        for arch in archs:
            for dtype, hd in variants:
                for role in ROLES:
                    fname = f"{name}.{arch}.bwd_{role}_{dtype}_d{hd}.cubin"
                    threads = 256 if role in ("pre", "post") else 128
                    heads = "heads_kv" if role == "kv" else "heads_q"
                    m["kernels"].append({
                        "symbol": f"cmc_{name}_bwd_{role}_{dtype}_d{hd}", "arch": arch,
                        "file": fname, "sha256": "",  # finish_artifact writes the cubin
                        "dtype": dtype, "head_dim": hd, "block_m": 64, "block_n": 64,
                        "threads": threads, "block": [threads, 1, 1],
                        "grid": ["ceil_div(max_len, 64)", heads, "batch"],
                        "dynamic_smem": 0 if role in ("pre", "post") else 40960,
                        "pass": "backward", "role": role, "params": ["desc", "bwd_args"],
                        "kernel": f"bwd_{role}", "tiling": LINEAR_TILING, "max_len": None})
        m["backward"] = {
            "args": args_section(),
            "workspace": {
                "dq_accum": {"dtype": "float32", "shape": ["T", "heads_q", "head_dim"],
                             "bytes": "4 * T * heads_q * head_dim", "layout": "token"},
                "dsum": {"dtype": "float32", "shape": ["2", "heads_q", "T"],
                         "bytes": "8 * T * heads_q"}},
            "sequence": {"atomic": ["pre", "kv", "post"], "deterministic": ["pre", "kv", "dq"]},
            "transposed_table": {}}
    edit_manifest(d, add)
    finish_artifact(d)  # the backward kernels' cubins and header macros
    return d


class Recorder:
    """Wraps the fake launch: decodes the descriptor and cmc_bwd_args while they are alive."""

    def __init__(self, gpu: FakeGPU, attn: Any):
        self.calls: list[dict[str, Any]] = []
        self.allocs: list[tuple[int, int]] = []
        real_alloc = gpu.alloc
        spec = attn.manifest.backward

        def launch(f, gx, gy, gz, bx, by, bz, smem, stream, params, extra):
            ptrs = [ctypes.c_void_p.from_address(params + 8 * i).value for i in range(2)]
            rec = {"symbol": f, "grid": (gx, gy, gz), "block": (bx, by, bz), "smem": smem,
                   "stream": int(stream),
                   "desc": decode(attn.manifest.layout,
                                  ctypes.string_at(ptrs[0], attn.manifest.layout.size))}
            if "_bwd_" in str(f):
                rec["args"] = decode(spec.args, ctypes.string_at(ptrs[1], spec.args.size))
                d = rec["desc"]
                rec["seqlens"] = ints_at(d["cu_seqlens"], d["batch"] + 1)
            self.calls.append(rec)
            gpu.launches.append(rec)
            return (0,)

        def alloc(n: int) -> int:
            ptr = real_alloc(n)
            self.allocs.append((ptr, n))
            return ptr

        loader.cu.cuLaunchKernel = launch
        gpu.launch = launch
        gpu.alloc = alloc
        from cmc.runtime import _driver
        _driver.mem_alloc_async = lambda n, h: alloc(n)  # monkeypatched by FakeGPU already


@pytest.fixture
def gpu(monkeypatch):
    return FakeGPU(monkeypatch)


def ptr(a: Any) -> int:
    return a.__cuda_array_interface__["data"][0]


def packed_inputs(gpu, tokens=135, hq=4, hkv=2, d=64):
    q = gpu.array((tokens, hq, d))
    k, v = gpu.array((tokens, hkv, d)), gpu.array((tokens, hkv, d))
    out, dout = gpu.array((tokens, hq, d)), gpu.array((tokens, hq, d))
    lse = gpu.array((hq, tokens), "f32")
    return q, k, v, out, dout, lse


# --------------------------------------------------------------------------- manifest


def test_manifest_backward_section(tmp_path, gpu):
    attn = loader.load(write_bwd_artifact(tmp_path))
    spec = attn.manifest.backward
    assert spec is not None and spec.args.size == 120
    assert spec.sequence == {"atomic": ("pre", "kv", "post"),
                             "deterministic": ("pre", "kv", "dq")}
    assert spec.workspace["dq_accum"]({"T": 10, "heads_q": 4, "head_dim": 64}) == 4 * 10 * 4 * 64
    assert attn.has_backward
    assert attn.variants() == [("fp16", 128), ("fp16", 64)][::-1]  # forward kernels only
    roles = {(e.role, e.pass_) for e in attn.manifest.kernels}
    assert ("fwd", "forward") in roles and ("dq", "backward") in roles


def test_forward_only_has_no_backward(tmp_path, gpu):
    d = write_artifact(tmp_path, archs=("sm_90a",))
    edit_manifest(d, lambda m: m.update(backward=None))
    attn = loader.load(d)
    assert not attn.has_backward and attn.manifest.backward is None
    q, k, v, out, dout, lse = packed_inputs(gpu, 8)
    with pytest.raises(ArtifactError) as e:
        attn.backward(dout, q, k, v, out, lse, cu_seqlens=[0, 8], n_targets=[1])
    assert "no-backward" in str(e.value) and not gpu.launches


def _drop_dq(m):
    m["kernels"] = [k for k in m["kernels"] if k.get("role") != "dq"]


def _short_twin(m, role="kv", keep_main=True, below_len=1024):
    """A kernel for short sequences beside (or, keep_main False, instead of) the role's one."""
    k = next(k for k in m["kernels"] if k.get("role") == role)
    m["kernels"].append({**k, "below_len": below_len, "symbol": k["symbol"] + "_short"})
    if not keep_main:
        m["kernels"].remove(k)


@pytest.mark.parametrize("edit, words", [
    (lambda m: m["kernels"][-1].update(role="fwd"), "not a backward role"),
    (lambda m: m["kernels"][0].update(role="kv"), "not a forward role"),
    (lambda m: m["kernels"][0].update({"pass": "sideways"}), "pass must be"),
    (lambda m: m["kernels"][-1].update(params=["desc"]), "params"),
    (lambda m: m["kernels"][0].update(params=["desc", "bwd_args"]), "params"),
    (_drop_dq, "lack the roles ['dq']"),
    (lambda m: m["kernels"].append(dict(m["kernels"][-1])), "two backward"),
    (lambda m: m.update(backward=None), "null"),
    (lambda m: m["backward"]["args"]["fields"].pop(), "cmc_bwd_args fields"),
    (lambda m: m["backward"]["args"]["fields"][1].update(offset=0), "overlap"),
    (lambda m: m["backward"]["args"]["fields"][0].update(ctype="int32_t"), "C type"),
    (lambda m: m["backward"]["args"].update(size=64), "does not hold"),
    (lambda m: m["backward"]["workspace"].pop("dsum"), "dsum"),
    (lambda m: m["backward"]["workspace"]["dsum"].update(bytes="open('x')"), "dsum.bytes"),
    (lambda m: m["backward"]["workspace"]["dsum"].update(dtype="float16"), "float32"),
    (lambda m: m["backward"]["sequence"].update(atomic=["kv", "pre", "post"]), "sequence"),
    (lambda m: m["backward"].pop("args"), "args"),
    (lambda m: _short_twin(m, keep_main=False), "takes longer ones"),
    (lambda m: (_short_twin(m), _short_twin(m)), "two backward kv kernels for sm_90a fp16 d64 "
                                                 "for short sequences"),
    (lambda m: _short_twin(m, below_len=-1), "below_len must be an int >= 0"),
    (lambda m: _short_twin(m, role="fwd", below_len=True), "below_len must be an int >= 0"),
    (lambda m: m["backward"].update(kv_order=[]), "kv_order must be an object"),
    (lambda m: m["backward"].update(kv_order={"heavy_tiles": 1, "heavy_from_len": -1}),
     "heavy_from_len -1"),
    (lambda m: m["backward"].update(kv_order={"heavy_tiles": 1, "heavy_from_len": True}),
     "heavy_from_len True"),
])
def test_backward_manifest_problems(tmp_path, edit, words):
    d = write_bwd_artifact(tmp_path)
    edit_manifest(d, edit)
    with pytest.raises(ArtifactError) as e:
        loader.read_manifest(d)
    assert words in str(e.value)


# --------------------------------------------------------------------------- launches


@pytest.mark.parametrize("from_len, want", [(None, 0), (131, 0), (130, 2), (0, 2)])
@pytest.mark.parametrize("deterministic", [False, True])
def test_backward_flags_ask_for_the_kv_order_from_its_length(tmp_path, gpu, deterministic,
                                                             from_len, want):
    """flags bit 1 from the manifest's kv_order.heavy_from_len on (max_len 130 here), in
    both dQ modes, on every launch of the sequence."""
    d = write_bwd_artifact(tmp_path)
    edit_manifest(d, lambda m: m["backward"].update(
        kv_order={"heavy_tiles": 1 if from_len is not None else 0, "heavy_from_len": from_len}))
    attn = loader.load(d)
    rec = Recorder(gpu, attn)
    q, k, v, out, dout, lse = packed_inputs(gpu)
    attn.backward(dout, q, k, v, out, lse, cu_seqlens=[0, 5, 5, 135], scale=0.5,
                  n_targets=[2, 0, 64], deterministic=deterministic)
    assert [c["args"]["flags"] for c in rec.calls] == [int(deterministic) | want] * 3


@pytest.mark.parametrize("deterministic", [False, True])
def test_backward_packed_launch_sequence_and_bytes(tmp_path, gpu, deterministic):
    attn = loader.load(write_bwd_artifact(tmp_path))
    rec = Recorder(gpu, attn)
    q, k, v, out, dout, lse = packed_inputs(gpu)
    cu = [0, 5, 5, 135]
    dq, dk, dv = attn.backward(dout, q, k, v, out, lse, cu_seqlens=cu, scale=0.5,
                               n_targets=[2, 0, 64], stream=0x55, deterministic=deterministic)
    last = "dq" if deterministic else "post"
    assert [c["symbol"] for c in rec.calls] == [f"cmc_hstu_bwd_{r}_fp16_d64"
                                                for r in ("pre", "kv", last)]
    assert [c["grid"] for c in rec.calls] == [(3, 4, 3), (3, 2, 3), (3, 4, 3)]
    assert [c["block"][0] for c in rec.calls] == [256, 128, 256 if last == "post" else 128]
    assert rec.calls[1]["smem"] == 40960 and all(c["stream"] == 0x55 for c in rec.calls)
    descs = [c["desc"] for c in rec.calls]
    args = [c["args"] for c in rec.calls]
    assert all(x == descs[0] for x in descs) and all(x == args[0] for x in args)
    d, a = descs[0], args[0]
    assert (d["q"], d["k"], d["v"], d["o"], d["lse"]) == (ptr(q), ptr(k), ptr(v), ptr(out),
                                                          ptr(lse))
    assert (d["o_stride_tok"], d["o_stride_head"], d["lse_stride_head"]) == (256, 64, 135)
    assert (d["batch"], d["heads_q"], d["heads_kv"], d["max_len"]) == (3, 4, 2, 130)
    assert d["scale_log2"] == pytest.approx(0.5 * math.log2(math.e), rel=1e-6)
    assert rec.calls[0]["seqlens"] == cu
    assert isinstance(dq, DeviceArray) and dq.shape == (135, 4, 64) and dk.shape == (135, 2, 64)
    assert (a["dout"], a["dq"], a["dk"], a["dv"]) == (ptr(dout), dq.ptr, dk.ptr, dv.ptr)
    assert (a["dout_stride_tok"], a["dout_stride_head"], a["dq_stride_tok"]) == (256, 64, 256)
    assert (a["dk_stride_tok"], a["dk_stride_head"], a["dv_stride_tok"]) == (128, 64, 128)
    assert a["total_tokens"] == 135 and a["flags"] == (1 if deterministic else 0)
    sizes = dict(rec.allocs)
    assert sizes[a["dq_accum"]] == 4 * 135 * 4 * 64 and sizes[a["dsum"]] == 8 * 135 * 4
    assert a["dq_accum"] in gpu.freed and a["dsum"] in gpu.freed  # freed in stream order


def test_backward_batch_layout_with_plan_and_given_outputs(tmp_path, gpu):
    attn = loader.load(write_bwd_artifact(tmp_path))
    rec = Recorder(gpu, attn)
    b, seq, hq, d = 2, 70, 2, 128
    q, out, dout = (gpu.array((b, seq, hq, d)) for _ in range(3))
    k, v = gpu.array((b, seq, 1, d)), gpu.array((b, seq, 1, d))
    base = DeviceArray((hq, b * seq), "f32", 0)
    lse = loader.lse_batch_view(base, b, hq, seq)
    dq, dk, dv = (gpu.array(s) for s in ((b, seq, hq, d), (b, seq, 1, d), (b, seq, 1, d)))
    p = attn.plan(batch=b, seq_len=seq, n_targets=[3, 70])
    res = attn.backward(dout, q, k, v, out, lse, plan=p, dq=dq, dk=dk, dv=dv)
    assert res == (dq, dk, dv)
    (c0, c1, c2) = rec.calls
    assert c1["grid"] == (2, 1, 2) and c0["grid"] == (2, 2, 2)
    assert c0["desc"]["cu_seqlens"] == p.values["cu_seqlens"]
    assert c0["seqlens"] == [0, 70, 140]
    assert c0["desc"]["p_n_targets"] == p.values["p_n_targets"]
    assert c0["desc"]["lse"] == base.ptr and c0["desc"]["lse_stride_head"] == 140
    assert (c0["args"]["dq"], c0["args"]["dk"], c0["args"]["dv"]) == (ptr(dq), ptr(dk), ptr(dv))
    assert c0["args"]["dk_stride_head"] == 0  # one kv head: its stride is never used


def test_backward_empty_does_not_launch(tmp_path, gpu):
    attn = loader.load(write_bwd_artifact(tmp_path))
    q, k, v, out, dout, lse = packed_inputs(gpu, 0)
    dq, dk, dv = attn.backward(dout, q, k, v, out, lse, cu_seqlens=[0], n_targets=[])
    assert dq.shape == (0, 4, 64) and not gpu.launches


def test_backward_param_errors_then_a_good_call(tmp_path, gpu):
    attn = loader.load(write_bwd_artifact(tmp_path))
    other = loader.load(write_bwd_artifact(tmp_path / "o", name="causal", params=()))
    q, k, v, out, dout, lse = packed_inputs(gpu, 16)
    cu = [0, 6, 16]
    good = dict(cu_seqlens=cu, n_targets=[1, 2])
    bf = DeviceArray((16, 4, 64), "bf16", 0)
    cases = [
        (dict(dout=gpu.array((16, 4, 128))), {}, "dout", "shape"),
        (dict(dout=bf), {}, "dout", "dtype"),
        (dict(out=gpu.array((16, 2, 64))), {}, "out", "shape"),
        (dict(out=gpu.array((16, 4, 64), "f32")), {}, "out", "dtype"),
        (dict(lse=gpu.array((4, 15), "f32")), {}, "lse", "shape"),
        (dict(lse=gpu.array((4, 16))), {}, "lse", "dtype"),
        (dict(lse=DeviceArray((4, 16), "f32", 0).view((4, 16), (1, 4))), {}, "lse", "strides"),
        (dict(lse=DeviceArray((4, 16), "f32", 1)), {}, "lse", "device"),
        (dict(dout=DeviceArray((16, 4, 64), "fp16", 0).view((16, 4, 64), (256, 64, 2))), {},
         "dout", "contiguous"),
        ({}, dict(dq=gpu.array((16, 2, 64))), "dq", "shape"),
        ({}, dict(dk=gpu.array((16, 4, 64))), "dk", "shape"),
        ({}, dict(deterministic=1), "deterministic", "True or False"),
        ({}, dict(full=True, n_targets=[1, 2]), "cu_seqlens", "required"),
        ({}, dict(n_targets=[1, 20]), "n_targets", "len"),
        ({}, dict(scale=-1.0), "scale", "> 0"),
        ({}, dict(full=True, plan=other.plan(cu_seqlens=cu)), "plan", "another artifact"),
        ({}, dict(full=True, plan=attn.plan(cu_seqlens=[0, 16], n_targets=[1]),
                  n_targets=[1]), "plan", "do not pass"),
    ]
    for tensors, kw, param, words in cases:
        t = {**dict(dout=dout, q=q, k=k, v=v, out=out, lse=lse), **tensors}
        call = {n: x for n, x in kw.items() if n != "full"} if kw.get("full") else \
            {**good, **kw}
        with pytest.raises(ParamError) as e:
            attn.backward(t["dout"], t["q"], t["k"], t["v"], t["out"], t["lse"], **call)
        assert e.value.param == param, (param, e.value)
        assert words in e.value.rule, (words, e.value.rule)
        assert not gpu.launches
        attn.backward(dout, q, k, v, out, lse, **good)  # the next good call still works
        assert len(gpu.launches) == 3
        gpu.launches.clear()


def test_forward_rejects_a_plan_of_another_mask(tmp_path, gpu):
    attn = loader.load(write_bwd_artifact(tmp_path))
    other = loader.load(write_bwd_artifact(tmp_path / "o", name="causal", params=()))
    q = gpu.array((8, 2, 64))
    with pytest.raises(ParamError) as e:
        attn(q, q, q, plan=other.plan(cu_seqlens=[0, 8]))
    assert e.value.param == "plan" and "causal" in e.value.rule
    attn(q, q, q, plan=attn.plan(cu_seqlens=[0, 8], n_targets=[2]))
    assert len(gpu.launches) == 1


def test_args_struct_matches_the_kernel_header():
    """The fixture's layout is the header's cmc_bwd_args (offsets from the .cuh's order)."""
    from cmc.abi import CTYPES

    text = (Path(__file__).resolve().parent.parent / "templates" / "cmc" /
            "attn_bwd_portable.cuh").read_text()
    assert "static_assert(sizeof(cmc_bwd_args) == 120" in text
    body = text[text.index("struct cmc_bwd_args {"):text.index("};", text.index(
        "struct cmc_bwd_args {"))]
    names = [n for n, _, _ in ARGS]
    pos = [body.index(f" {n}") for n in names if n.endswith(("tok", "head")) is False]
    assert pos == sorted(pos)
    assert struct.calcsize("<6Q8q2i") == 120 and CTYPES["int64_t"][0] == 8


def test_backward_capture_names_the_host_parameter(tmp_path, gpu):
    """During capture, host values name the parameter that holds them, as the forward does:
    not the first parameter when that is a scalar (nothing to upload) and a later one holds a
    host array."""
    attn = loader.load(write_bwd_artifact(
        tmp_path, params=(("window", "scalar"), ("n_targets", "batch"))))
    q, k, v, out, dout, lse = packed_inputs(gpu, 16)
    cs = gpu.array((3,), "i32")
    (ctypes.c_int32 * 3).from_address(ptr(cs))[:] = [0, 6, 16]
    gpu.capturing = True
    with pytest.raises(ParamError) as fwd:
        attn(q, k, v, cu_seqlens=cs, max_len=10, window=3, n_targets=[6, 10])
    with pytest.raises(ParamError) as bwd:
        attn.backward(dout, q, k, v, out, lse, cu_seqlens=cs, max_len=10, window=3,
                      n_targets=[6, 10])
    assert (bwd.value.param, bwd.value.rule) == (fwd.value.param, fwd.value.rule)
    assert bwd.value.param == "n_targets" and "capture" in bwd.value.rule
    assert not gpu.launches
    nt = gpu.array((2,), "i32")
    (ctypes.c_int32 * 2).from_address(ptr(nt))[:] = [6, 10]
    attn.backward(dout, q, k, v, out, lse, cu_seqlens=cs, max_len=10, window=3, n_targets=nt)
    assert len(gpu.launches) == 3  # device values: launches during capture


@pytest.mark.parametrize("grid", [(1, 65536, 1), (1, 1, 65536), (2**31, 1, 1), (0, 1, 1)])
def test_launch_grid_limit_names_the_kernel(tmp_path, gpu, monkeypatch, grid):
    """The forward and the backward refuse a grid outside the device limits with one message
    that names the kernel, before any launch."""
    from cmc.runtime import backward
    attn = loader.load(write_bwd_artifact(tmp_path))
    q, k, v, out, dout, lse = packed_inputs(gpu, 16)
    good = dict(cu_seqlens=[0, 6, 16], n_targets=[1, 2])
    for mod in (loader, backward):
        monkeypatch.setattr(mod, "grid_dims", lambda fns, env: grid)
    with pytest.raises(ParamError) as fwd:
        attn(q, k, v, **good)
    with pytest.raises(ParamError) as bwd:
        attn.backward(dout, q, k, v, out, lse, **good)
    for e, symbol in ((fwd, "cmc_hstu_fwd_fp16_d64"), (bwd, "cmc_hstu_bwd_pre_fp16_d64")):
        assert e.value.param == "q"
        assert e.value.rule == (f"launch grid {grid} of {symbol} is outside the device limits "
                                "(x in [1, 2^31 - 1], y and z in [1, 65535])")
    assert not gpu.launches
