"""CPU tests of cmc.runtime: validation rules, array adapters, manifest reading, arch choice,
and the whole launch path against a fake driver whose "device memory" is host memory, so the
descriptor bytes and the arrays they point at can be read back and checked."""

from __future__ import annotations

import ctypes
import hashlib
import json
import math
import random
import shutil
import struct
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from cuda.bindings import driver as cu

from cmc import kernels
from cmc.abi import CTYPES, DescriptorLayout, descriptor_layout, kernel_param_bytes
from cmc.artifacts import SCHEMA_VERSION
from cmc.contract import FULL_INT32, Affine, ParamRange
from cmc.errors import ArtifactError, ParamError
from cmc.ir import Mask, ParamDecl
from cmc.runtime import _driver, backward, device, loader
from cmc.runtime.arrays import (
    ArrayInfo,
    DeviceArray,
    bf16_bits,
    bf16_to_f32,
    describe,
    from_cai,
    host_or_device_ints,
    parse_dlpack_capsule,
    stream_handle,
)
from cmc.runtime.params import (
    Segments,
    check_cu_seqlens,
    check_params,
    check_tensors,
    grid_dims,
    pack_segments,
    parse_grid_expr,
    resolve_max_len,
    scale_log2,
    select_arch,
)

VARIANTS = [("bf16", 64), ("bf16", 128), ("fp16", 64), ("fp16", 128)]


def info(shape, dtype="bf16", strides=None, ptr=0x10000, device=0, readonly=False):
    """An ArrayInfo for a C-contiguous array unless strides are given."""
    if strides is None:
        acc, st = 1, []
        for n in reversed(shape):
            st.append(acc)
            acc *= n
        strides = tuple(reversed(st))
    return ArrayInfo(ptr, tuple(shape), tuple(strides), dtype, device, "cai", None,
                     readonly=readonly)


def qkv(b=2, seq=16, hq=4, hkv=2, d=128, dtype="bf16"):
    return (info((b, seq, hq, d), dtype, ptr=0x10000), info((b, seq, hkv, d), dtype, ptr=0x20000),
            info((b, seq, hkv, d), dtype, ptr=0x30000))


def rule_of(exc: pytest.ExceptionInfo) -> tuple[str, str]:
    return exc.value.param, exc.value.rule


# --------------------------------------------------------------------------- tensors


def test_valid_batch_geometry_and_strides():
    q, k, v = qkv()
    out = info(q.shape, ptr=0x40000)
    g = check_tensors(q, k, v, out, packed=False, variants=VARIANTS)
    assert (g.batch, g.seq_len, g.tokens, g.heads_q, g.heads_kv, g.head_dim) == (2, 16, 32, 4, 2,
                                                                                  128)
    assert g.strides["q"].tok == 4 * 128 and g.strides["q"].head == 128
    assert g.strides["k"].tok == 2 * 128 and g.strides["out"].head == 128


def test_valid_packed_geometry():
    q = info((100, 4, 64), "fp16")
    k = info((100, 1, 64), "fp16", ptr=0x20000)
    g = check_tensors(q, k, k, None, packed=True, variants=VARIANTS)
    assert (g.tokens, g.heads_q, g.heads_kv, g.head_dim, g.dtype) == (100, 4, 1, 64, "fp16")
    assert g.strides["k"].head == 0  # one head: its stride is never used


@pytest.mark.parametrize("case, param, words", [
    ("q_dtype", "q", "dtype f32 is not one the artifact was built for"),
    ("k_dtype", "k", "must match q's"),
    ("out_dtype", "out", "must match q's"),
    ("v_device", "v", "q's device"),
    ("q_ndim", "q", "must have 4 dimensions"),
    ("last_stride", "q", "last dimension must be contiguous"),
    ("misaligned", "k", "16-byte aligned"),
    ("tok_stride", "v", "token stride"),
    ("head_stride", "q", "head stride"),
    ("batch_stride", "k", "batch stride"),
    ("negative", "q", "non-negative"),
    ("k_shape", "k", "shape"),
    ("v_shape", "v", "must equal k's"),
    ("out_shape", "out", "must equal q's"),
    ("head_dim", "q", "head_dim 96"),
    ("gqa", "k", "multiple of key/value heads"),
    ("readonly_out", "out", "writable"),
    ("overlap_out", "out", "overlap"),
])
def test_tensor_rules(case, param, words):
    q, k, v = qkv()
    out = None
    if case == "q_dtype":
        q = info(q.shape, "f32")
    elif case == "k_dtype":
        k = info(k.shape, "fp16")
    elif case == "out_dtype":
        out = info(q.shape, "fp16")
    elif case == "v_device":
        v = info(v.shape, device=1)
    elif case == "q_ndim":
        q = info((32, 4, 128))
    elif case == "last_stride":
        q = info(q.shape, strides=(16 * 4 * 256, 4 * 256, 256, 2))
    elif case == "misaligned":
        k = info(k.shape, ptr=0x20008)
    elif case == "tok_stride":
        v = info(v.shape, strides=(16 * 260, 260, 128, 1))
    elif case == "head_stride":
        q = info(q.shape, strides=(16 * 4 * 132, 4 * 132, 132, 1))
    elif case == "batch_stride":  # [B, H, L, D] transposed to [B, L, H, D]
        k = info(k.shape, strides=(2 * 16 * 128, 128, 16 * 128, 1))
    elif case == "negative":
        q = info(q.shape, strides=(-16 * 512, 512, 128, 1))
    elif case == "k_shape":
        k = info((2, 15, 2, 128))
    elif case == "v_shape":
        v = info((2, 16, 1, 128))
    elif case == "out_shape":
        out = info((2, 16, 2, 128))
    elif case == "head_dim":
        q, k, v = qkv(d=96)
    elif case == "gqa":
        q, k, v = qkv(hq=4, hkv=3)
    elif case == "readonly_out":
        out = info(q.shape, readonly=True)
    elif case == "overlap_out":
        out = info(q.shape, strides=(16 * 4 * 128, 4 * 128, 64, 1))
    with pytest.raises(ParamError) as e:
        check_tensors(q, k, v, out, packed=False, variants=VARIANTS)
    assert e.value.param == param
    assert words in e.value.rule


def test_head_dim_rule_names_built_dims():
    q, k, v = qkv(d=64)
    with pytest.raises(ParamError) as e:
        check_tensors(q, k, v, None, packed=False, variants=[("bf16", 128)])
    assert rule_of(e)[0] == "q" and "128" in e.value.rule


def test_size_one_dims_ignore_their_strides():
    # L == 1: tokens are consecutive sequences, so the token stride is the batch stride.
    q = info((3, 1, 1, 128), strides=(4096, 7, 5, 1))
    g = check_tensors(q, q, q, None, packed=False, variants=VARIANTS)
    assert g.strides["q"].tok == 4096 and g.strides["q"].head == 0
    # B == 1: the batch stride is never used.
    q = info((1, 10, 2, 128), strides=(3, 256, 128, 1))
    g = check_tensors(q, q, q, None, packed=False, variants=VARIANTS)
    assert g.strides["q"].tok == 256


def test_batch_stride_rule_accepts_padded_heads():
    # tokens padded (stride 3*128 for 2 heads) but batch stride consistent: fine.
    q = info((2, 8, 2, 128), strides=(8 * 384, 384, 128, 1))
    g = check_tensors(q, q, q, None, packed=False, variants=VARIANTS)
    assert g.strides["q"].tok == 384


def test_empty_tensors_skip_pointer_checks():
    q = info((0, 4, 128), ptr=0)
    g = check_tensors(q, q, q, None, packed=True, variants=VARIANTS)
    assert g.tokens == 0


# --------------------------------------------------------------------------- cu_seqlens


def test_cu_seqlens_rules():
    assert check_cu_seqlens(np.array([0, 3, 3, 10]), 10).tolist() == [3, 0, 7]
    for vals, words in [([1, 5], "start at 0"), ([0, 5, 4, 10], "non-decreasing"),
                        ([0, 5, 9], "end at T = 10"), ([], "B+1 >= 1")]:
        with pytest.raises(ParamError) as e:
            check_cu_seqlens(np.array(vals, dtype=np.int64), 10)
        assert e.value.param == "cu_seqlens" and words in e.value.rule
    with pytest.raises(ParamError):
        check_cu_seqlens(np.zeros((2, 2)), 0)


def test_max_len():
    lengths = np.array([3, 9, 2])
    assert resolve_max_len(None, lengths) == 9
    assert resolve_max_len(12, lengths) == 12
    for bad in (8, -1, True, 2.5, 2**31):
        with pytest.raises(ParamError) as e:
            resolve_max_len(bad, lengths)
        assert e.value.param == "max_len"
    with pytest.raises(ParamError):
        resolve_max_len(None, None)  # during capture it must be given


# --------------------------------------------------------------------------- params


DECLS = [("window", "scalar"), ("n_targets", "batch"), ("docs", "segments")]
LENS = np.array([10, 4])
ZERO_TO_LEN = ParamRange(Affine(0, 0), Affine(1, 0))
RANGES = {"n_targets": ZERO_TO_LEN}


def good(**over):
    p = {"window": 7, "n_targets": [2, 4], "docs": [[0, 5], []]}
    p.update(over)
    return p


def test_params_pack():
    out = check_params(DECLS, good(), batch=2, lengths=LENS, ranges=RANGES)
    assert out[0].value == 7
    assert out[1].arrays[0].dtype == np.int32 and out[1].arrays[0].tolist() == [2, 4]
    offsets, starts = out[2].arrays
    assert offsets.tolist() == [0, 2, 2] and starts.tolist() == [0, 5]
    assert offsets.dtype == np.int32 and starts.dtype == np.int32


def test_params_broadcast_int_and_numpy():
    out = check_params(DECLS, good(n_targets=3, docs=np.array([[1, 2], [3, 4]])), batch=2,
                       lengths=LENS, ranges=RANGES)
    assert out[1].arrays[0].tolist() == [3, 3]
    assert out[2].arrays[1].tolist() == [1, 2, 3, 4]


@pytest.mark.parametrize("over, param, words", [
    ({"window": True}, "window", "must be an int"),
    ({"window": 2.0}, "window", "must be an int"),
    ({"window": 2**31}, "window", "int32"),
    ({"n_targets": [1]}, "n_targets", "2 values"),
    ({"n_targets": [1, 5]}, "n_targets", "[0, len]"),
    ({"n_targets": [-1, 0]}, "n_targets", "[0, len]"),
    ({"n_targets": [1.5, 2]}, "n_targets", "integers"),
    ({"docs": [[5, 2], []]}, "docs", "sorted"),
    ({"docs": [[0, 11], []]}, "docs", "[0, len]"),
    ({"docs": [[0], [5]]}, "docs", "[0, len]"),
    ({"docs": [[0]]}, "docs", "2 lists"),
    ({"docs": "abc"}, "docs", "segments"),
    ({"extra": 1}, "extra", "unknown parameter"),
])
def test_param_rules(over, param, words):
    with pytest.raises(ParamError) as e:
        check_params(DECLS, good(**over), batch=2, lengths=LENS, ranges=RANGES)
    assert e.value.param == param and words in e.value.rule


def test_params_follow_the_declared_range_not_a_fixed_one():
    """The runtime checks exactly the manifest's ranges: a prefix longer than its sequence is
    fine without a declared range, and a range like [1, len - 1] is enforced per sequence."""
    d = [("n", "batch"), ("w", "scalar")]
    out = check_params(d, {"n": [99, -3], "w": -7}, batch=2, lengths=LENS)  # default: int32
    assert out[0].arrays[0].tolist() == [99, -3] and out[1].value == -7
    ranges = {"n": ParamRange(Affine(0, 1), Affine(1, -1)), "w": ParamRange(Affine(0, 0),
                                                                           Affine(0, 64))}
    check_params(d, {"n": [9, 3], "w": 64}, batch=2, lengths=LENS, ranges=ranges)
    for given, param, words in [({"n": [10, 3], "w": 0}, "n", "[1, len - 1]; sequence 0 has len 10"),
                                ({"n": [1, 0], "w": 0}, "n", "sequence 1 has len 4 and value 0"),
                                ({"n": 2**31, "w": 0}, "n", "int32"),
                                ({"n": [1, 1], "w": 65}, "w", "declared range [0, 64]; got 65")]:
        with pytest.raises(ParamError) as e:
            check_params(d, given, batch=2, lengths=LENS, ranges=ranges)
        assert e.value.param == param and words in e.value.rule, e.value.rule


def test_empty_sequence_value_needs_only_the_hull():
    """len 0: no row reads the value, but the kernels' arithmetic was typed for the range over
    every len, so [1, len] takes 5 (or 1) for an empty sequence, never 0 or a negative."""
    d = [("n", "batch")]
    ranges = {"n": ParamRange(Affine(0, 1), Affine(1, 0))}
    lens = np.array([0, 3])
    check_params(d, {"n": [5, 3]}, batch=2, lengths=lens, ranges=ranges)
    with pytest.raises(ParamError) as e:
        check_params(d, {"n": [0, 3]}, batch=2, lengths=lens, ranges=ranges)
    assert "sequence 0 is empty" in e.value.rule and "[1, 2147483647]" in e.value.rule
    # lengths unknown (device cu_seqlens during capture): the hull as well
    check_params(d, {"n": [7, 1]}, batch=2, lengths=None, ranges=ranges)
    with pytest.raises(ParamError):
        check_params(d, {"n": [7, 0]}, batch=2, lengths=None, ranges=ranges)


def test_missing_param():
    p = good()
    del p["docs"]
    with pytest.raises(ParamError) as e:
        check_params(DECLS, p, batch=2, lengths=LENS, ranges=RANGES)
    assert e.value.param == "docs" and "missing" in e.value.rule


def test_segments_flat_for_one_sequence_and_empty():
    d = [("docs", "segments")]
    out = check_params(d, {"docs": [0, 3, 3]}, batch=1, lengths=np.array([5]))
    assert out[0].arrays[0].tolist() == [0, 3] and out[0].arrays[1].tolist() == [0, 3, 3]
    out = check_params(d, {"docs": []}, batch=1, lengths=np.array([5]))
    assert out[0].arrays[0].tolist() == [0, 0] and out[0].arrays[1].size == 0
    out = check_params(d, {"docs": [[], [], [2]]}, batch=3, lengths=np.array([0, 0, 2]))
    assert out[0].arrays[0].tolist() == [0, 0, 0, 1]


def test_pack_segments_fast_path_matches_the_checked_one():
    """The vectorised path (plain int lists, every call) packs exactly what the per-sequence
    path packs, and hands every invalid input to it (so its errors stay the same)."""
    from cmc.runtime import params as pm

    rng = random.Random(5)
    for _ in range(3000):
        b = rng.randint(1, 5)
        lengths = np.array([rng.randint(0, 9) for _ in range(b)])
        per = [sorted(rng.randint(0, int(n)) for _ in range(rng.randint(0, 4))) for n in lengths]
        if rng.random() < 0.3:  # break one: unsorted, negative, past len, bool, float, tuple
            i = rng.randrange(b)
            bad = rng.choice(["swap", "neg", "big", "bool", "float", "tuple", "none"])
            if bad == "swap" and len(per[i]) >= 2 and per[i][0] != per[i][-1]:
                per[i] = per[i][::-1]
            elif bad == "neg":
                per[i] = [-1] + per[i]
            elif bad == "big":
                per[i] = per[i] + [int(lengths[i]) + 1]
            elif bad == "bool":
                per[i] = per[i] + [True]
            elif bad == "float":
                per[i] = per[i] + [1.0]
            elif bad == "tuple":
                per[i] = tuple(per[i])
        lens = None if rng.random() < 0.2 else lengths
        fast = pm._pack_segments_fast(per, lens)
        try:
            slow = _slow_pack(per, lens)
        except ParamError:
            assert fast is None, (per, lens)
            continue
        if fast is not None:
            assert fast[0].dtype == slow[0].dtype and fast[1].dtype == slow[1].dtype
            assert fast[0].tolist() == slow[0].tolist() and fast[1].tolist() == slow[1].tolist()


def _slow_pack(per, lens):
    from cmc.runtime import params as pm

    real = pm._pack_segments_fast
    try:
        pm._pack_segments_fast = lambda *a: None
        return pm.pack_segments("s", per, lens)
    finally:
        pm._pack_segments_fast = real


def test_pack_segments_boundaries():
    offsets, starts = pack_segments("s", [[0, 0, 4], [4]], np.array([4, 4]))
    assert offsets.tolist() == [0, 3, 4] and starts.tolist() == [0, 0, 4, 4]


def test_segments_prepacked_host():
    d = [("docs", "segments")]
    out = check_params(d, {"docs": Segments([0, 1, 3], [2, 0, 1])}, batch=2,
                       lengths=np.array([4, 4]))
    assert out[0].arrays[0].tolist() == [0, 1, 3]
    for seg, param in [(Segments([0, 1], [2]), "docs.offsets"),
                       (Segments([0, 2, 1], [0, 0]), "docs.offsets"),
                       (Segments([0, 1, 3], [2, 1, 0]), "docs"),
                       (Segments([0, 1, 2], [9, 0]), "docs")]:
        with pytest.raises(ParamError) as e:
            check_params(d, {"docs": seg}, batch=2, lengths=np.array([4, 4]))
        assert e.value.param == param


class FakeDeviceInts:
    """A device int32 array as the CAI protocol describes it, with host-side contents."""

    def __init__(self, values, typestr="<i4", ptr=0x5000):
        self.values = np.asarray(values)
        self.__cuda_array_interface__ = {"shape": self.values.shape, "typestr": typestr,
                                         "data": (ptr, False), "version": 3, "strides": None}


def reader(table):
    def read(a: ArrayInfo) -> np.ndarray:
        return np.asarray(table[a.ptr], dtype=np.int32)
    return read


def test_device_params_are_range_checked_through_a_host_copy():
    d = [("n_targets", "batch")]
    good_arr, bad_arr = FakeDeviceInts([1, 4], ptr=0x5000), FakeDeviceInts([1, 5], ptr=0x6000)
    read = reader({0x5000: [1, 4], 0x6000: [1, 5]})
    out = check_params(d, {"n_targets": good_arr}, batch=2, lengths=LENS, device=None, read=read,
                       ranges=RANGES)
    assert isinstance(out[0].arrays[0], ArrayInfo) and out[0].arrays[0].ptr == 0x5000
    with pytest.raises(ParamError) as e:
        check_params(d, {"n_targets": bad_arr}, batch=2, lengths=LENS, read=read, ranges=RANGES)
    assert e.value.param == "n_targets" and "[0, len]" in e.value.rule
    # during capture (read=None) the values cannot be checked, the shape and type still are
    check_params(d, {"n_targets": bad_arr}, batch=2, lengths=LENS, read=None)
    for arr, words in [(FakeDeviceInts([1, 2], "<i8"), "int32"),
                       (FakeDeviceInts([1, 2, 3]), "2 values"),
                       (FakeDeviceInts([[1, 2]]), "1-D")]:
        with pytest.raises(ParamError) as e:
            check_params(d, {"n_targets": arr}, batch=2, lengths=LENS, read=None)
        assert e.value.param == "n_targets" and words in e.value.rule


def test_device_segments_checked_through_a_host_copy():
    d = [("docs", "segments")]
    offs, sts = FakeDeviceInts([0, 2, 2], ptr=0x7000), FakeDeviceInts([3, 1], ptr=0x8000)
    read = reader({0x7000: [0, 2, 2], 0x8000: [3, 1]})
    with pytest.raises(ParamError) as e:
        check_params(d, {"docs": Segments(offs, sts)}, batch=2, lengths=LENS, read=read)
    assert e.value.param == "docs" and "sorted" in e.value.rule


# --------------------------------------------------------------------------- arrays


class FakeCAI:
    def __init__(self, **cai):
        self.__cuda_array_interface__ = cai


def test_cai_adapter():
    a = describe(FakeCAI(shape=(2, 3, 4), typestr="<f2", data=(0x1000, False), version=3,
                         strides=(48, 16, 2), stream=7), "q")
    assert (a.ptr, a.shape, a.strides, a.dtype, a.device, a.cai_stream) == (
        0x1000, (2, 3, 4), (24, 8, 1), "fp16", None, 7)
    a = describe(FakeCAI(shape=(2, 3), typestr="<i4", data=(0x2000, True), version=2), "x")
    assert a.strides == (3, 1) and a.readonly and a.dtype == "i32"
    with pytest.raises(ParamError) as e:
        describe(FakeCAI(shape=(2,), typestr="<f2", data=(0, False), version=3, strides=(3,)),
                 "k")
    assert e.value.param == "k" and "multiple of the element size" in e.value.rule
    with pytest.raises(ParamError):
        from_cai({"shape": (2,), "typestr": "<f2", "data": (0, False), "mask": object()}, "q")
    # bf16 has no CAI typestr: an unknown dtype, rejected by the dtype rule later
    a = describe(FakeCAI(shape=(2,), typestr="<V2", data=(0, False), version=3), "q")
    assert a.dtype == "other:<V2"


def test_dlpack_parse_numpy():
    base = np.arange(2 * 3 * 8, dtype=np.float16).reshape(2, 3, 8)
    view = base[:, 1:, ::2]
    v = parse_dlpack_capsule(view.__dlpack__())
    assert v.ptr == view.ctypes.data
    assert v.shape == (2, 2, 4) and v.strides == (24, 8, 2) and v.dtype == "fp16"
    assert v.device_type == 1
    i = parse_dlpack_capsule(np.zeros(5, dtype=np.int32).__dlpack__())
    assert i.dtype == "i32" and i.strides == (1,)


def test_describe_rejects_host_arrays():
    with pytest.raises(ParamError) as e:
        describe(np.zeros((2, 2)), "q")
    assert e.value.param == "q" and "CUDA" in e.value.rule

    class CpuDL:
        def __dlpack__(self, stream=None):
            return np.zeros(2).__dlpack__()

        def __dlpack_device__(self):
            return (1, 0)

    with pytest.raises(ParamError):
        describe(CpuDL(), "v")
    with pytest.raises(ParamError):
        describe(object(), "k")


def test_describe_cuda_dlpack_object():
    """A producer that says CUDA: the capsule is parsed, the stream is passed as DLPack wants."""
    host = np.zeros((4, 8), dtype=np.float16)
    seen = {}

    class CudaDL:
        def __dlpack__(self, stream=None):
            seen["stream"] = stream
            return host.__dlpack__()

        def __dlpack_device__(self):
            return (2, 3)

    a = describe(CudaDL(), "q", stream=0)
    assert seen["stream"] == 1  # the legacy default stream, as DLPack spells it
    assert (a.ptr, a.shape, a.device, a.dtype) == (host.ctypes.data, (4, 8), 3, "fp16")
    describe(CudaDL(), "q", stream=0xABC)
    assert seen["stream"] == 0xABC


def test_host_ints():
    assert host_or_device_ints([1, 2], "n").tolist() == [1, 2]
    assert host_or_device_ints(np.array([3], dtype=np.int16), "n").dtype == np.int64
    assert host_or_device_ints([], "n").size == 0
    for bad in (True, [1.0, 2.0], ["a"]):
        with pytest.raises(ParamError):
            host_or_device_ints(bad, "n")
    assert isinstance(host_or_device_ints(FakeDeviceInts([1]), "n"), ArrayInfo)


def test_stream_handle():
    assert stream_handle(None) == 0 and stream_handle(5) == 5
    assert stream_handle(SimpleNamespace(cuda_stream=7)) == 7
    assert stream_handle(SimpleNamespace(ptr=9)) == 9

    class S:
        def __cuda_stream__(self):
            return (0, 11)

    assert stream_handle(S()) == 11
    assert stream_handle(cu.CUstream(13)) == 13
    with pytest.raises(ParamError):
        stream_handle("x")


def test_bf16_round_trip():
    x = np.array([1.0, -2.5, 3.140625, 1e-3, 65504.0, np.inf], dtype=np.float32)
    back = bf16_to_f32(bf16_bits(x))
    assert np.allclose(back, x, rtol=1 / 128) and np.isinf(back[-1])
    assert bf16_bits(np.array([1.00390625], dtype=np.float32))[0] == 0x3F80  # ties to even
    assert np.isnan(bf16_to_f32(bf16_bits(np.array([np.nan], dtype=np.float32))))[0]


# --------------------------------------------------------------------------- arch choice


@pytest.mark.parametrize("cc, have, want", [
    ((9, 0), ["sm_80", "sm_90", "sm_90a", "sm_100a"], "sm_90a"),
    ((9, 0), ["sm_80", "sm_90"], "sm_90"),
    ((10, 0), ["sm_90a", "sm_100a"], "sm_100a"),
    ((8, 6), ["sm_80", "sm_86"], "sm_86"),
    ((8, 9), ["sm_80", "sm_86", "sm_90a"], "sm_86"),
    ((8, 0), ["sm_80", "sm_86"], "sm_80"),
])
def test_select_arch(cc, have, want):
    assert select_arch(cc, have) == want


@pytest.mark.parametrize("cc, have", [((9, 0), ["sm_80"]), ((9, 0), ["sm_100a"]),
                                      ((9, 1), ["sm_90a"]), ((8, 0), ["sm_86"])])
def test_select_arch_none_fits(cc, have):
    with pytest.raises(ArtifactError) as e:
        select_arch(cc, have)
    assert all(a in str(e.value) for a in have)
    assert f"{cc[0]}.{cc[1]}" in str(e.value)


# --------------------------------------------------------------------------- grid, scale


def test_grid_expressions():
    env = {"max_len": 300, "heads_q": 4, "batch": 3, "block_m": 128}
    for expr, want in [("ceil_div(max_len, 128)", 3), ("ceil(max_len / block_m)", 3),
                       ("(max_len + block_m - 1) / block_m", 3), ("heads_q", 4), (7, 7),
                       ("max(1, batch * 2)", 6), ("cdiv(max_len, 64)", 5)]:
        assert parse_grid_expr(expr)(env) == want, expr
    fns = [parse_grid_expr(e) for e in ("ceil_div(max_len, 128)", "heads_q", "batch")]
    assert grid_dims(fns, env) == (3, 4, 3)
    for bad in ("__import__('os')", "max_len.real", "max_len ** 2", "lambda: 1", True):
        with pytest.raises(ArtifactError):
            parse_grid_expr(bad)
    with pytest.raises(ArtifactError):
        grid_dims([parse_grid_expr("nope")] * 3, env)


def test_scale():
    assert scale_log2(None, 64) == pytest.approx(math.log2(math.e) / 8)
    assert scale_log2(0.5, 64) == pytest.approx(0.5 * math.log2(math.e))
    for bad in (float("nan"), float("inf"), "1", True, 0.0, -0.5):
        with pytest.raises(ParamError) as e:
            scale_log2(bad, 64)
        assert e.value.param == "scale"


# --------------------------------------------------------------------------- manifests


def mask_of(name: str, params: list[tuple[str, str]]) -> Mask:
    return Mask(name, "", "", f"{name}.mask", (), tuple(ParamDecl(n, k) for n, k in params),
                (), ())


LINEAR_TILING = {"kind": "linear", "masks": None, "min_len": 0, "origin": 0, "patch_cols": 128,
                 "patch_rows": 1, "reason": "default", "units": "pairs", "width": 0}


def fake_cubin(arch: str, symbol: str, threads: int, param_bytes: int) -> bytes:
    """The smallest CUDA ELF that cmc/cubin.py reads as a cubin for `arch` with one entry
    point `symbol`: its __launch_bounds__ (EIATTR_MAX_THREADS) and parameter block size
    (EIATTR_CBANK_PARAM_SIZE), which load checks against the manifest."""
    from cmc.cubin import (
        EIATTR_CBANK_PARAM_SIZE,
        EIATTR_MAX_THREADS,
        EICOMPAT_ATTR_ISA_CLASS,
        EIFMT_BVAL,
        EIFMT_SVAL,
        ELFOSABI_CUDA,
        EM_CUDA,
        SHT_SYMTAB,
    )

    sm = int(arch[3:].rstrip("a"))
    names = ["", ".shstrtab", ".strtab", ".symtab", f".text.{symbol}", f".nv.info.{symbol}",
             ".nv.compat"]
    shstr = b"\0".join(n.encode() for n in names) + b"\0"
    name_at = [shstr.index(n.encode() + b"\0") if n else 0 for n in names]
    strtab = b"\0" + symbol.encode() + b"\0"
    symtab = bytes(24) + struct.pack("<IBBHQQ", 1, 0x12, 0, 4, 0, 0)  # global function, .text
    info = (struct.pack("<BBH3I", EIFMT_SVAL, EIATTR_MAX_THREADS, 12, threads, 1, 1)
            + struct.pack("<BBHI", EIFMT_SVAL, EIATTR_CBANK_PARAM_SIZE, 4, param_bytes))
    compat = struct.pack("<BBH", EIFMT_BVAL, EICOMPAT_ATTR_ISA_CLASS, arch.endswith("a"))
    bodies = [b"", shstr, strtab, symtab, b"\0" * 16, info, compat]
    types = [0, 3, 3, SHT_SYMTAB, 1, 0x70000000, 0x70000086]
    data, offsets = bytearray(64), []
    for b in bodies:
        data += bytes(-len(data) % 8)
        offsets.append(len(data))
        data += b
    data += bytes(-len(data) % 8)
    shoff = len(data)
    for i, b in enumerate(bodies):
        data += struct.pack("<IIQQQQIIQQ", name_at[i], types[i], 0, 0, offsets[i], len(b),
                            2 if i == 3 else 0, 1 if i == 3 else 0, 8, 24 if i == 3 else 0)
    data[0:16] = b"\x7fELF" + bytes([2, 1, 1, ELFOSABI_CUDA, 8]) + bytes(7)
    struct.pack_into("<HHIQQQIHHHHHH", data, 16, 2, EM_CUDA, 1, 0, 0, shoff, sm << 8, 64, 0, 0,
                     64, len(bodies), 1)
    return bytes(data)


def finish_artifact(d: Path) -> None:
    """Make the folder what one build writes: for every kernel entry of the manifest, a cubin
    that records its threads and its kind's parameter block, and the header's macros of its
    variant; sha256s updated. Edits of the manifest after this are tampering."""
    m = json.loads((d / "manifest.json").read_text())
    name = m["mask"]["name"]
    lines = [f"/* {name}.h: the launch macros of a cut-down test artifact */"]
    for k in m["kernels"]:
        data = fake_cubin(k["arch"], k["symbol"], k["threads"],
                          kernel_param_bytes(m["descriptor"]["size"], k["kernel"]))
        (d / k["file"]).write_bytes(data)
        k["sha256"] = hashlib.sha256(data).hexdigest()
        tag = kernels.spec(k["kernel"]).tag.format(dtype=k["dtype"], head_dim=k["head_dim"])
        prefix = f"#define CMC_{name.upper()}_{tag.upper()}_"
        lines += [f"{prefix}THREADS {k['threads']}u", f"{prefix}BLOCK_M {k['block_m']}u",
                  f"{prefix}BLOCK_N {k['block_n']}u", f"{prefix}DYNAMIC_SMEM {k['dynamic_smem']}u",
                  f"{prefix}MAX_LEN {k['max_len'] or 0}"]
    header = ("\n".join(dict.fromkeys(lines)) + "\n").encode()
    (d / f"{name}.h").write_bytes(header)
    m["header"] = {"file": f"{name}.h", "sha256": hashlib.sha256(header).hexdigest()}
    (d / "manifest.json").write_text(json.dumps(m, indent=2))


def write_artifact(root: Path, name: str = "hstu", params=(("n_targets", "batch"),),
                   archs=("sm_90a", "sm_100a"), variants=VARIANTS, smem=49152) -> Path:
    """An artifact folder shaped like the packager's: manifest, (fake) cubins and the header's
    launch macros, consistent with each other (finish_artifact)."""
    layout = descriptor_layout(mask_of(name, list(params)))
    d = root / name
    d.mkdir(parents=True, exist_ok=True)
    kernels = []
    for arch in archs:
        for dtype, hd in variants:
            fname = f"{name}.{arch}.{dtype}_d{hd}.cubin"
            data = f"cubin {arch} {dtype} {hd}".encode()
            (d / fname).write_bytes(data)
            kernels.append({
                "symbol": f"cmc_{name}_fwd_{dtype}_d{hd}", "arch": arch, "file": fname,
                "sha256": hashlib.sha256(data).hexdigest(), "dtype": dtype, "head_dim": hd,
                "block_m": 128, "block_n": 64, "threads": 256, "block": [256, 1, 1],
                "grid": ["ceil_div(max_len, 128)", "heads_q", "batch"], "dynamic_smem": smem,
                "kernel": "portable", "tiling": LINEAR_TILING, "max_len": None,
            })
    manifest = {
        "schema_version": SCHEMA_VERSION, "cmc_version": "0.1.0",
        "mask": {"name": name, "doc": "", "file": f"{name}.mask", "source": "", "sha256": ""},
        "constants": {}, "params": [{"name": n, "kind": k} if k == "segments" else
                                    {"name": n, "kind": k, "range": (ZERO_TO_LEN if k == "batch"
                                                                     else FULL_INT32).to_json()}
                                    for n, k in params],
        "descriptor": {"struct": layout.struct_name, "size": layout.size, "align": layout.align,
                       "fields": [{"name": f.name, "ctype": f.ctype, "offset": f.offset,
                                   "size": f.size, "param": f.param, "role": f.role}
                                  for f in layout.fields]},
        "kernels": kernels,
    }
    (d / "manifest.json").write_text(json.dumps(manifest, indent=2))
    finish_artifact(d)
    return d


def edit_manifest(d: Path, fn) -> None:
    m = json.loads((d / "manifest.json").read_text())
    fn(m)
    (d / "manifest.json").write_text(json.dumps(m))


def test_read_manifest(tmp_path):
    d = write_artifact(tmp_path)
    m = loader.read_manifest(d)
    assert m.name == "hstu" and m.params == (("n_targets", "batch"),)
    assert len(m.kernels) == 8 and m.kernels[0].block == (256, 1, 1)
    assert m.layout.field("p_n_targets").role == "per_sequence"
    assert loader.read_manifest(d / "manifest.json").name == "hstu"
    assert len(loader.verify_cubins(m)) == 8


def test_sha256_mismatch_names_the_file(tmp_path):
    d = write_artifact(tmp_path)
    (d / "hstu.sm_90a.fp16_d64.cubin").write_bytes(b"tampered")
    with pytest.raises(ArtifactError) as e:
        loader.load(d)  # fails before any driver call
    assert "hstu.sm_90a.fp16_d64.cubin" in str(e.value) and "sha256" in str(e.value)


def test_missing_cubin_names_the_file(tmp_path):
    d = write_artifact(tmp_path)
    (d / "hstu.sm_100a.bf16_d128.cubin").unlink()
    with pytest.raises(ArtifactError) as e:
        loader.verify_cubins(loader.read_manifest(d))
    assert "hstu.sm_100a.bf16_d128.cubin" in str(e.value)


@pytest.mark.parametrize("edit, words", [
    (lambda m: m.update(schema_version=SCHEMA_VERSION + 1), "schema_version"),
    (lambda m: m.pop("kernels"), "kernels"),
    (lambda m: m.update(kernels=[]), "no kernels"),
    (lambda m: m["kernels"][0].update(file="../evil.cubin"), "file name"),
    (lambda m: m["kernels"][0].pop("sha256"), "sha256"),
    (lambda m: m["kernels"][0].update(dtype="fp8"), "dtype"),
    (lambda m: m["kernels"][0].update(grid=["os.system('x')", "heads_q", "batch"]), "grid"),
    (lambda m: m["params"][0].update(kind="tensor"), "unknown kind"),
    (lambda m: m["params"][0].pop("range"), "range"),
    (lambda m: m["params"][0].update(range={"lo": [0, 0]}), "range"),
    (lambda m: m["params"][0].update(range={"lo": [0, 0], "hi": [0, 2**40]}), "int32"),
    (lambda m: m["descriptor"]["fields"].pop(0), "header field"),
    (lambda m: m["descriptor"]["fields"][-1].update(role="value"), "role"),
    (lambda m: m["descriptor"]["fields"][1].update(offset=4), "offset"),
    (lambda m: m["descriptor"]["fields"][1].update(offset=0), "overlap"),
    (lambda m: m["descriptor"].update(size=8), "past its size"),
])
def test_manifest_problems(tmp_path, edit, words):
    d = write_artifact(tmp_path)
    edit_manifest(d, edit)
    with pytest.raises(ArtifactError) as e:
        loader.read_manifest(d)
    assert words in str(e.value)


def test_manifest_missing_and_reserved(tmp_path):
    with pytest.raises(ArtifactError) as e:
        loader.read_manifest(tmp_path / "nothing")
    assert "no manifest.json" in str(e.value)
    d = write_artifact(tmp_path, name="odd", params=(("scale", "scalar"),))
    with pytest.raises(ArtifactError) as e:
        loader.read_manifest(d)
    assert "scale" in str(e.value)


# The edits of tests/test_manifest_check.py's TAMPER (inspect), here on load: each launch
# field the runtime launches with, edited alone, against the cubins, header and rules.
TAMPER = {
    "dynamic_smem": lambda k: k.update(dynamic_smem=k["dynamic_smem"] + 16),
    "threads": lambda k: k.update(threads=k["threads"] * 2, block=[k["threads"] * 2, 1, 1]),
    "block": lambda k: k.update(block=[k["threads"], 2, 1]),
    "grid": lambda k: k.update(grid=["ceil_div(max_len, 64)", "heads_q", "1"]),
    "max_len": lambda k: k.update(max_len=4096),
    "block_m": lambda k: k.update(block_m=k["block_m"] // 2),
}


@pytest.mark.parametrize("field", sorted(TAMPER))
@pytest.mark.parametrize("entry", [0, 5])  # a forward kernel, one of another arch
def test_load_refuses_tampered_launch_fields(tmp_path, gpu, field, entry):
    d = write_artifact(tmp_path)
    loader.load(d)
    edit_manifest(d, lambda m: TAMPER[field](m["kernels"][entry]))
    gpu.loaded.clear()
    with pytest.raises(ArtifactError, match=rf"manifest (says|launches).*\b{field}\b") as e:
        loader.load(d)
    assert f"hstu.{('sm_90a', 'sm_100a')[entry // 4]}." in str(e.value)
    assert not gpu.loaded  # refused before any module is loaded


@pytest.mark.parametrize("edit, words", [
    (lambda d: (d / "hstu.h").write_text("#define CMC_HSTU_BF16_D64_THREADS 512u\n"),
     "hstu.h: sha256"),
    (lambda d: (d / "hstu.h").unlink(), "cannot read the header"),
    (lambda d: edit_manifest(d, lambda m: m.pop("header")), "names no header"),
    (lambda d: edit_manifest(d, lambda m: m["kernels"][1].pop("tiling")), "tiling"),
    (lambda d: edit_manifest(d, lambda m: m["kernels"][1]["tiling"].update(kind="spiral")),
     "tiling must be"),
    (lambda d: edit_manifest(d, lambda m: m["kernels"][1].update(kernel="fancy")), "malformed"),
    (lambda d: (d / "hstu.sm_90a.bf16_d128.cubin").write_bytes(
        fake_cubin("sm_90a", "cmc_hstu_fwd_bf16_d128", 256, 8)), "parameter bytes"),
    (lambda d: (d / "hstu.sm_90a.bf16_d128.cubin").write_bytes(fake_cubin(
        "sm_90a", "cmc_hstu_fwd_bf16_d128", 128, kernel_param_bytes(
            loader.read_manifest(d).layout.size, "portable"))),
     r"manifest launches 256 threads, the cubin's launch bounds are \[128, 1, 1\]"),
    (lambda d: (d / "hstu.sm_90a.bf16_d128.cubin").write_bytes(
        fake_cubin("sm_100a", "cmc_hstu_fwd_bf16_d128", 256, 8)), "the cubin is for sm_100a"),
    (lambda d: (d / "hstu.sm_90a.bf16_d128.cubin").write_bytes(
        fake_cubin("sm_90a", "other", 256, 8)), "no entry point"),
    (lambda d: (d / "hstu.sm_90a.bf16_d128.cubin").write_bytes(b"cubin"), "not a valid cubin"),
])
def test_load_refuses_launch_facts_it_cannot_confirm(tmp_path, gpu, edit, words):
    d = write_artifact(tmp_path)
    edit(d)  # a replaced cubin gets its sha256 in the manifest: only its contents are wrong
    edit_manifest(d, lambda m: m["kernels"][1].update(sha256=hashlib.sha256(
        (d / m["kernels"][1]["file"]).read_bytes()).hexdigest()))
    with pytest.raises(ArtifactError, match=words):
        loader.load(d)
    assert not gpu.loaded  # refused before any module is loaded


def test_load_without_a_driver_is_an_artifact_error(tmp_path):
    try:
        _driver.init()
        pytest.skip("a CUDA driver is present")
    except ArtifactError:
        pass
    d = write_artifact(tmp_path)
    with pytest.raises(ArtifactError):
        loader.load(d)


# --------------------------------------------------------------------------- fake driver


class _Null:
    def __init__(self, *a: Any):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc: Any):
        return None


class FakeGPU:
    """The driver as the runtime uses it, with host memory standing in for device memory."""

    def __init__(self, monkeypatch, cc=(9, 0)):
        self.buffers: list[np.ndarray] = []
        self.pinned: list[Any] = []
        self.launches: list[dict[str, Any]] = []
        self.loaded: list[bytes] = []
        self.freed: list[int] = []
        self.maps: list[dict[str, Any]] = []
        self.capturing = False
        d = _driver
        for name, fn in {
            "init": lambda: None, "compute_capability": lambda dev: cc,
            "max_optin_smem": lambda dev: 232448, "sm_count": lambda dev: 132,
            "current_device": lambda: 0,
            "pointer_device": lambda ptr: 0, "is_capturing": lambda h: self.capturing,
            "on_device": _Null, "mem_alloc": self.alloc,
            "mem_alloc_async": lambda n, h: self.alloc(n), "mem_free": lambda p: None,
            "mem_free_async": lambda p, h: self.freed.append(p),
            "htod": lambda dst, src, n: ctypes.memmove(dst, src, n),
            "htod_async": lambda dst, src, n, h: ctypes.memmove(dst, src, n),
            "dtoh_sync": lambda dst, src, n, h: ctypes.memmove(dst, src, n),
            "stream_wait_stream": lambda w, p: None,
            "pinned_alloc": self.pinned_alloc, "pinned_free": lambda p: None,
            "event_create": lambda: object(), "event_record": lambda ev, h: None,
            "event_synchronize": lambda ev: None, "tensor_map_3d": self.tensor_map,
        }.items():
            monkeypatch.setattr(d, name, fn)
        # no cuFuncGetAttribute: load asks the driver nothing of a kernel's threads (the
        # cubin's launch bounds are checked against the manifest first: launch_check.py)
        fake_cu = SimpleNamespace(
            cuModuleLoadData=lambda data: (self.loaded.append(bytes(data)) or 0, object()),
            cuModuleGetFunction=lambda mod, name: (0, name.decode()),
            cuFuncSetAttribute=lambda f, a, v: (0,),
            CUfunction_attribute=cu.CUfunction_attribute,
            cuLaunchKernel=self.launch)
        monkeypatch.setattr(loader, "cu", fake_cu)
        monkeypatch.setattr(device, "cu", fake_cu)
        monkeypatch.setattr(backward, "cu", fake_cu)
        monkeypatch.setattr(device, "_seqlens", {})
        monkeypatch.setattr(device, "_staging", {})
        monkeypatch.setattr(device, "_tmaps", device.OrderedDict())

    def tensor_map(self, dtype, ptr, dims, byte_strides, box) -> bytes:
        self.maps.append({"dtype": dtype, "ptr": ptr, "dims": tuple(dims),
                          "strides": tuple(byte_strides), "box": tuple(box)})
        return struct.pack("<16Q", ptr, *dims, *byte_strides, *box, *([0] * 7))

    def pinned_alloc(self, n: int) -> int:
        buf = np.zeros(n, dtype=np.uint8)
        self.pinned.append(buf)
        return buf.ctypes.data

    def alloc(self, n: int) -> int:
        buf = np.zeros(n + 64, dtype=np.uint8)
        self.buffers.append(buf)
        return buf.ctypes.data + (-buf.ctypes.data) % 16

    def launch(self, f, gx, gy, gz, bx, by, bz, smem, stream, params, extra):
        argv = ctypes.c_void_p.from_address(params).value
        maps_at = ctypes.c_void_p.from_address(params + 8).value if "sm90" in str(f) else None
        if maps_at is not None:  # the second parameter: 3 maps, 64-byte aligned
            assert maps_at % 64 == 0
            self.launched_maps = [struct.unpack_from("<16Q", ctypes.string_at(maps_at + 128 * i,
                                                                              128))
                                  for i in range(3)]
        self.launches.append({"symbol": f, "grid": (gx, gy, gz), "block": (bx, by, bz),
                              "smem": smem, "stream": int(stream), "raw": argv})
        self.launches[-1]["desc_ptr"] = argv
        return (0,)

    def array(self, shape, dtype="fp16"):
        """A 'device' array: host memory described by CAI."""
        np_dtype = {"fp16": np.float16, "i32": np.int32, "f32": np.float32}[dtype]
        n = int(np.prod(shape)) * np.dtype(np_dtype).itemsize
        ptr = self.alloc(n)
        typestr = {"fp16": "<f2", "i32": "<i4", "f32": "<f4"}[dtype]
        return FakeCAI(shape=tuple(shape), typestr=typestr, data=(ptr, False), version=3,
                       strides=None)


def decode(layout: DescriptorLayout, raw: bytes) -> dict[str, Any]:
    return {f.name: struct.unpack_from("<" + CTYPES[f.ctype][1], raw, f.offset)[0]
            for f in layout.fields}


def ints_at(ptr: int, n: int) -> list[int]:
    return list((ctypes.c_int32 * n).from_address(ptr)) if n else []


@pytest.fixture
def gpu(monkeypatch):
    return FakeGPU(monkeypatch)


def run_and_decode(gpu, attn, *args, **kw):
    """Call attn, decoding the descriptor while the launch's buffers are still alive."""
    real_launch = gpu.launch
    descs = []

    def launch(*a):
        real_launch(*a)
        raw = ctypes.string_at(gpu.launches[-1]["desc_ptr"], attn.manifest.layout.size)
        descs.append(decode(attn.manifest.layout, raw))
        d = descs[-1]
        gpu.launches[-1]["seqlens"] = ints_at(d["cu_seqlens"], d["batch"] + 1)
        for f in attn.manifest.layout.fields:
            if f.role == "per_sequence":
                gpu.launches[-1][f.param] = ints_at(d[f.name], d["batch"])
            if f.role == "segment_offsets":
                offs = ints_at(d[f.name], d["batch"] + 1)
                starts = ints_at(d[f.name.replace("_offsets", "_starts")], offs[-1])
                gpu.launches[-1][f.param] = (offs, starts)
        return (0,)

    gpu.launch = launch
    loader.cu.cuLaunchKernel = launch
    res = attn(*args, **kw)
    return res, descs


def test_launch_batch_layout_descriptor(tmp_path, gpu):
    d = write_artifact(tmp_path)
    attn = loader.load(d)
    assert attn.arch() == "sm_90a" and len(gpu.loaded) == 4
    assert (("fp16", 64) in attn.variants()) and attn.params == (("n_targets", "batch"),)
    b, seq, hq, hkv, dim = 3, 300, 4, 2, 64
    q, k, v = gpu.array((b, seq, hq, dim)), gpu.array((b, seq, hkv, dim)), gpu.array(
        (b, seq, hkv, dim))
    out = gpu.array((b, seq, hq, dim))
    res, descs = run_and_decode(gpu, attn, q, k, v, out=out, n_targets=[0, 37, 300],
                                stream=0x77, scale=0.25)
    assert res is out
    (desc,) = descs
    launch = gpu.launches[-1]
    assert launch["symbol"] == "cmc_hstu_fwd_fp16_d64"
    assert launch["grid"] == (3, hq, b) and launch["block"] == (256, 1, 1)
    assert launch["smem"] == 49152 and launch["stream"] == 0x77
    ptr = lambda a: a.__cuda_array_interface__["data"][0]  # noqa: E731
    assert desc["q"] == ptr(q) and desc["k"] == ptr(k) and desc["v"] == ptr(v)
    assert desc["o"] == ptr(out) and desc["lse"] == 0
    assert (desc["q_stride_tok"], desc["q_stride_head"]) == (hq * dim, dim)
    assert (desc["k_stride_tok"], desc["v_stride_head"]) == (hkv * dim, dim)
    assert (desc["o_stride_tok"], desc["lse_stride_head"]) == (hq * dim, b * seq)
    assert (desc["batch"], desc["heads_q"], desc["heads_kv"], desc["max_len"]) == (b, hq, hkv,
                                                                                   seq)
    assert desc["scale_log2"] == pytest.approx(0.25 * math.log2(math.e), rel=1e-6)
    assert launch["seqlens"] == [0, 300, 600, 900]  # the batch layout as packed tokens
    assert launch["n_targets"] == [0, 37, 300]
    assert gpu.freed, "the per-launch upload buffer is freed (stream-ordered)"
    # the batch cu_seqlens device array is cached per (device, B, L)
    _, descs2 = run_and_decode(gpu, attn, q, k, v, out=out, n_targets=1)
    assert descs2[0]["cu_seqlens"] == desc["cu_seqlens"]
    assert gpu.launches[-1]["n_targets"] == [1, 1, 1]


def test_launch_packed_layout_and_lse(tmp_path, gpu):
    d = write_artifact(tmp_path, name="shared_prefix",
                       params=(("prompt_len", "batch"), ("responses", "segments")))
    attn = loader.load(d)
    lens = [5, 0, 130]
    tokens = sum(lens)
    q, k = gpu.array((tokens, 2, 128)), gpu.array((tokens, 1, 128))
    cu_seqlens = [0, 5, 5, 135]
    out = gpu.array((tokens, 2, 128))
    # raw arrays (no torch/cupy): the runtime allocates the LSE itself
    gpu_lse_allocs = len(gpu.buffers)
    (o, lse), descs = run_and_decode(gpu, attn, q, k, k, out=out, cu_seqlens=cu_seqlens,
                                     return_lse=True, prompt_len=[2, 0, 64],
                                     responses=[[2, 4], [], [64, 64, 100]])
    assert len(gpu.buffers) > gpu_lse_allocs
    assert isinstance(lse, DeviceArray) and lse.shape == (2, tokens) and lse.dtype == "f32"
    desc = descs[0]
    launch = gpu.launches[-1]
    assert desc["lse"] == lse.ptr and desc["lse_stride_head"] == tokens
    assert desc["max_len"] == 130 and desc["batch"] == 3 and launch["grid"] == (2, 2, 3)
    assert launch["seqlens"] == cu_seqlens
    assert launch["prompt_len"] == [2, 0, 64]
    assert launch["responses"] == ([0, 2, 2, 5], [2, 4, 64, 64, 100])
    assert desc["k_stride_head"] == 0 and desc["q_stride_head"] == 128


def test_launch_scalar_param_and_lse_batch_view(tmp_path, gpu):
    d = write_artifact(tmp_path, name="sliding_window_rt", params=(("window", "scalar"),))
    attn = loader.load(d)
    q = gpu.array((2, 10, 2, 64))
    (o, lse), descs = run_and_decode(gpu, attn, q, q, q, return_lse=True, window=-5)
    assert descs[0]["p_window"] == -5
    assert isinstance(o, DeviceArray) and o.shape == (2, 10, 2, 64) and o.dtype == "fp16"
    assert descs[0]["o"] == o.ptr and descs[0]["o_stride_tok"] == 128
    # LSE: kernel layout [H, T]; the caller gets [B, H, L] as a view of it
    assert lse.shape == (2, 2, 10) and lse.strides == (10, 20, 1)
    assert lse.ptr == descs[0]["lse"]


def test_launch_rejects_before_launching(tmp_path, gpu):
    d = write_artifact(tmp_path)
    attn = loader.load(d)
    q = gpu.array((2, 8, 2, 64))
    cases = [
        (dict(n_targets=[1, 9]), "n_targets"),
        (dict(), "n_targets"),
        (dict(n_targets=1, bogus=2), "bogus"),
        (dict(n_targets=1, cu_seqlens=[0, 8, 16]), "cu_seqlens"),
        (dict(n_targets=1, max_len=9), "max_len"),
        (dict(n_targets=1, scale=float("nan")), "scale"),
    ]
    for kw, param in cases:
        with pytest.raises(ParamError) as e:
            attn(q, q, q, **kw)
        assert e.value.param == param, kw
    qp = gpu.array((16, 2, 64))
    for cs, words in [([0, 8], "end at T"), ([0, 9, 16], "[0, len]"), (None, "required")]:
        with pytest.raises(ParamError) as e:
            attn(qp, qp, qp, cu_seqlens=cs, n_targets=[8, 8] if cs != [0, 8] else [8])
        assert words in e.value.rule
    assert not gpu.launches
    attn(q, q, q, n_targets=[8, 0])  # and a good call after the bad ones still launches
    assert len(gpu.launches) == 1


def test_launch_device_cu_seqlens_and_capture(tmp_path, gpu):
    d = write_artifact(tmp_path)
    attn = loader.load(d)
    qp = gpu.array((16, 2, 64))
    cs = gpu.array((3,), "i32")
    ints = (ctypes.c_int32 * 3).from_address(cs.__cuda_array_interface__["data"][0])
    ints[:] = [0, 6, 16]
    nt = gpu.array((2,), "i32")
    (ctypes.c_int32 * 2).from_address(nt.__cuda_array_interface__["data"][0])[:] = [6, 11]
    with pytest.raises(ParamError) as e:  # 11 > len 10 of sequence 1: read back and caught
        attn(qp, qp, qp, cu_seqlens=cs, n_targets=nt)
    assert e.value.param == "n_targets"
    (ctypes.c_int32 * 2).from_address(nt.__cuda_array_interface__["data"][0])[:] = [6, 10]
    _, descs = run_and_decode(gpu, attn, qp, qp, qp, cu_seqlens=cs, n_targets=nt)
    assert descs[0]["cu_seqlens"] == cs.__cuda_array_interface__["data"][0]
    assert descs[0]["max_len"] == 10 and gpu.launches[-1]["grid"][0] == 1
    gpu.capturing = True
    with pytest.raises(ParamError) as e:  # nothing can be read back during capture
        attn(qp, qp, qp, cu_seqlens=cs, n_targets=nt)
    assert e.value.param == "max_len"
    with pytest.raises(ParamError) as e:  # nor uploaded
        attn(qp, qp, qp, cu_seqlens=cs, max_len=10, n_targets=[6, 10])
    assert e.value.param == "n_targets" and "capture" in e.value.rule
    attn(qp, qp, qp, cu_seqlens=cs, max_len=10, n_targets=nt)  # device values: launches
    q = gpu.array((1, 4, 2, 64))
    with pytest.raises(ParamError) as e:  # first use of (B, L) must be before capture
        attn(q, q, q, n_targets=gpu.array((1,), "i32"))
    assert "warm" in e.value.rule


def test_empty_work_does_not_launch(tmp_path, gpu):
    d = write_artifact(tmp_path)
    attn = loader.load(d)
    q = gpu.array((0, 2, 64))
    out = attn(q, q, q, cu_seqlens=[0], n_targets=[])
    assert isinstance(out, DeviceArray) and out.shape == (0, 2, 64)
    q = gpu.array((4, 2, 64))
    attn(q, q, q, cu_seqlens=[0, 0, 4], n_targets=[0, 4])
    assert len(gpu.launches) == 1


def test_no_cubin_for_this_device(tmp_path, monkeypatch):
    FakeGPU(monkeypatch, cc=(8, 0))
    d = write_artifact(tmp_path, archs=("sm_90a", "sm_100a"))
    with pytest.raises(ArtifactError) as e:
        loader.load(d)
    assert "sm_90a" in str(e.value) and "sm_100a" in str(e.value) and "8.0" in str(e.value)


def test_too_much_shared_memory(tmp_path, gpu):
    d = write_artifact(tmp_path, smem=300000)
    with pytest.raises(ArtifactError) as e:
        loader.load(d)
    assert "shared memory" in str(e.value)


# --------------------------------------------------------------------------- torch op


def test_torch_op_schema_and_fake_shapes(tmp_path, gpu):
    torch = pytest.importorskip("torch")
    from torch._subclasses.fake_tensor import FakeTensorMode

    from cmc.runtime import torch_op

    d = write_artifact(tmp_path, name="shared_prefix",
                       params=(("prompt_len", "batch"), ("responses", "segments")))
    attn = loader.load(d)
    schema, plan = torch_op._schema(attn)
    assert "Tensor p_prompt_len" in schema and "Tensor p_responses_starts" in schema
    fn = torch_op.register(attn, "cpu_test_shared_prefix")
    assert torch_op.register(attn, "cpu_test_shared_prefix") is fn
    with FakeTensorMode():
        q = torch.empty(2, 16, 4, 128, dtype=torch.bfloat16)
        k = torch.empty(2, 16, 2, 128, dtype=torch.bfloat16)
        o, lse = fn.op(q, k, k, None, None, None, True, False,
                       torch.zeros(2, dtype=torch.int32),
                       torch.zeros(3, dtype=torch.int32), torch.zeros(0, dtype=torch.int32))
        assert o.shape == q.shape and lse.shape == (4, 32) and lse.dtype == torch.float32
    with pytest.raises(ParamError) as e:
        fn(q, k, k, prompt_len=[1, 2])
    assert e.value.param == "responses"


# --------------------------------------------------------------------------- real artifacts


@pytest.fixture(scope="module")
def real_artifacts(tmp_path_factory):
    """Artifacts from the real pipeline (NVRTC runs on a CPU): the packager's manifest, read
    by the runtime and launched on the fake driver."""
    try:
        from cmc.driver import compile_file
    except ImportError as e:  # a stage not written yet
        pytest.skip(f"pipeline not available: {e}")
    root = tmp_path_factory.mktemp("real")
    out = {}
    for name in ("causal", "shared_prefix", "sliding_window_rt", "clear"):
        out[name] = compile_file(Path(__file__).parent.parent / "samples" / f"{name}.mask", root,
                                 archs=["sm_90a"], dtypes=["bf16"], head_dims=[128],
                                 backward=False)
    return out


def test_real_manifest_packs_and_launches(real_artifacts, gpu):
    attn = loader.load(real_artifacts["shared_prefix"])
    assert attn.params == (("prompt_len", "batch"), ("responses", "segments"))
    assert attn.variants() == [("bf16", 128)]
    fields = {f.role: f.name for f in attn.manifest.layout.fields if f.param}
    assert fields == {"per_sequence": "p_prompt_len", "segment_offsets": "p_responses_offsets",
                      "segment_starts": "p_responses_starts"}
    da = DeviceArray((2, 40, 2, 128), "bf16")
    _, descs = run_and_decode(gpu, attn, da, da, da, prompt_len=[3, 40],
                              responses=[[3, 20], [40]])
    launch = gpu.launches[-1]
    assert launch["symbol"] == "cmc_shared_prefix_fwd_sm90_bf16_d128"
    k = attn.manifest.kernels[0]
    # persistent: min(query tiles * heads * batch, SMs) CTAs, one dimension
    assert launch["grid"] == (1 * 2 * 2, 1, 1) and launch["block"] == k.block
    assert launch["smem"] == k.dynamic_smem
    assert launch["prompt_len"] == [3, 40] and launch["responses"] == ([0, 2, 3], [3, 20, 40])
    assert descs[0]["q"] == da.ptr and descs[0]["q_stride_tok"] == 256
    # the sm90 kernel's tensor maps: q, k, v over [T = B * L, H, D], box (64, 1, 128); q, k
    # and v are one array here, so the cache encodes its map once
    assert gpu.maps == [{"dtype": "bf16", "ptr": da.ptr, "dims": (128, 2, 80),
                         "strides": (256, 512), "box": (64, 1, 128)}]
    assert [m[:4] for m in gpu.launched_maps] == [(da.ptr, 128, 2, 80)] * 3


def test_patch_tiled_kernel_gets_patch_boxes_and_its_grid(real_artifacts, gpu):
    attn = loader.load(real_artifacts["clear"])
    k = attn.manifest.kernels[0]
    assert (k.box_rows, k.max_len) == ((16, 16, 16), 523776)
    da = DeviceArray((1, 4096, 2, 128), "bf16")
    run_and_decode(gpu, attn, da, da, da)
    # 4 text tiles + ceil(28 grid rows / 8) = 4 patch rows of 8 patches: 18 units per head
    assert gpu.launches[-1]["grid"] == ((4 + 4 * 8 + 1) // 2 * 2, 1, 1)
    assert gpu.maps[-1]["box"] == (64, 1, 16)
    assert gpu.launches[-1]["symbol"] == "cmc_clear_fwd_sm90_bf16_d128"
    # below the tiling's min_len (2560) the kernel for short sequences (linear tiles, one box
    # per tile) runs instead
    short = DeviceArray((1, 2559, 2, 128), "bf16")
    run_and_decode(gpu, attn, short, short, short)
    assert gpu.launches[-1]["symbol"] == "cmc_clear_fwd_sm90_bf16_d128_short"
    assert gpu.launches[-1]["grid"] == ((20 + 1) // 2 * 2, 1, 1)
    assert gpu.maps[-1]["box"] == (64, 1, 128)
    # a jagged batch runs the patch kernel when max_len reaches min_len, however short the rest
    jag = DeviceArray((2560 + 100, 2, 128), "bf16")
    run_and_decode(gpu, attn, jag, jag, jag, cu_seqlens=[0, 100, 2660])
    assert gpu.launches[-1]["symbol"] == "cmc_clear_fwd_sm90_bf16_d128"
    run_and_decode(gpu, attn, jag, jag, jag, cu_seqlens=[0, 101, 2660])  # 2559 at most
    assert gpu.launches[-1]["symbol"] == "cmc_clear_fwd_sm90_bf16_d128_short"


def test_patch_tiled_kernel_refuses_sequences_past_its_plan(real_artifacts, gpu):
    attn = loader.load(real_artifacts["clear"])
    q = DeviceArray((600000, 1, 128), "bf16")
    with pytest.raises(ParamError, match=r"^max_len: 600000 tokens: .* at most 523776"):
        attn(q, q, q, cu_seqlens=[0, 600000])
    assert not gpu.launches


def test_manifest_with_an_unknown_box_is_refused(real_artifacts, tmp_path):
    import json
    import shutil

    dest = tmp_path / "clear"
    shutil.copytree(real_artifacts["clear"], dest)
    m = json.loads((dest / "manifest.json").read_text())
    m["kernels"][0]["tensor_maps"][1]["box"] = [64, 1, 48]
    (dest / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(ArtifactError, match=r"box \[64, 1, R\]"):
        loader.read_manifest(dest)


def test_tensor_maps_give_size_one_dimensions_a_valid_stride(real_artifacts, gpu):
    attn = loader.load(real_artifacts["sliding_window_rt"])
    q = DeviceArray((1, 1, 128), "bf16")  # T = 1, H = 1: strides may be anything
    run_and_decode(gpu, attn, q, q, q, cu_seqlens=[0, 1], window=3)
    assert [m["strides"] for m in gpu.maps] == [(256, 256)]


def test_tensor_map_encode_failure_names_the_tensor(real_artifacts, gpu, monkeypatch):
    def refuse(dtype, ptr, dims, strides, box):
        raise _driver.DriverError("cuTensorMapEncodeTiled", "CUDA_ERROR_INVALID_VALUE")

    monkeypatch.setattr(_driver, "tensor_map_3d", refuse)
    attn = loader.load(real_artifacts["sliding_window_rt"])
    q = DeviceArray((5, 1, 128), "bf16")
    with pytest.raises(ParamError, match=r"^q: cannot be described by a TMA tensor map"):
        attn(q, q, q, cu_seqlens=[0, 5], window=3)
    assert not gpu.launches


def test_tensor_maps_need_int32_token_coordinates(real_artifacts, gpu):
    from cmc.runtime.loader import MapTensor, tensor_maps_block

    v = MapTensor(ptr=1 << 20, heads=1, stride_tok=128, stride_head=128, param="q")
    with pytest.raises(ParamError, match="int32 TMA coordinates"):
        tensor_maps_block(("q",), "bf16", 128, 2**31, {"q": v})


def test_real_manifest_scalar(real_artifacts, gpu):
    attn = loader.load(real_artifacts["sliding_window_rt"])
    da = DeviceArray((5, 1, 128), "bf16")
    _, descs = run_and_decode(gpu, attn, da, da, da, cu_seqlens=[0, 5], window=3)
    assert descs[0]["p_window"] == 3 and descs[0]["batch"] == 1


def test_launch_uses_each_tensors_own_strides(tmp_path, gpu):
    d = write_artifact(tmp_path, name="causal", params=())
    attn = loader.load(d)
    q = gpu.array((10, 2, 128))
    k = gpu.array((10, 1, 128))
    ptr = gpu.alloc(10 * 3 * 128 * 2)  # out padded to 3 heads per token, then head-major V
    out = FakeCAI(shape=(10, 2, 128), typestr="<f2", data=(ptr, False), version=3,
                  strides=(3 * 128 * 2, 128 * 2, 2))
    vptr = gpu.alloc(2 * 10 * 128 * 2)  # V as [H, T, D] seen as [T, H, D]: head-major
    v = FakeCAI(shape=(10, 1, 128), typestr="<f2", data=(vptr, False), version=3,
                strides=(128 * 2, 10 * 128 * 2, 2))
    _, descs = run_and_decode(gpu, attn, q, k, v, out=out, cu_seqlens=[0, 4, 10])
    s = descs[0]
    assert (s["q_stride_tok"], s["q_stride_head"]) == (256, 128)
    assert (s["k_stride_tok"], s["k_stride_head"]) == (128, 0)
    assert s["v_stride_tok"] == 128 and s["o"] == ptr
    assert (s["o_stride_tok"], s["o_stride_head"]) == (384, 128)


def test_persistent_grid_is_capped_at_the_sm_count(real_artifacts, gpu):
    """An sm90 kernel with a work counter (manifest work_counter) runs one CTA per SM at
    every length and layout; each launch's desc.sched is its stream's zeroed counter."""
    attn = loader.load(real_artifacts["causal"])
    assert all(k.work_counter == (k.tensor_maps != ()) for k in attn.manifest.kernels)
    da = DeviceArray((9, 1000, 4, 128), "bf16")
    _, descs = run_and_decode(gpu, attn, da, da, da)
    assert gpu.launches[-1]["grid"] == (132, 1, 1)  # 4 tile pairs * 4 heads * 9 > 132
    small = DeviceArray((1, 300, 4, 128), "bf16")
    _, more = run_and_decode(gpu, attn, small, small, small)
    assert gpu.launches[-1]["grid"] == (2 * 4, 1, 1)  # 3 tiles: one pair and one single
    long = DeviceArray((1, kernels.PERSISTENT_MAX_LEN + 1, 40, 128), "bf16")
    run_and_decode(gpu, attn, long, long, long)
    assert gpu.launches[-1]["grid"] == (132, 1, 1)  # 33 tiles: 17 units * 40 heads
    packed = DeviceArray((9000, 4, 128), "bf16")
    cu = np.array([0, 1000, 3000, 9000], dtype=np.int32)
    run_and_decode(gpu, attn, packed, packed, packed, cu_seqlens=cu, max_len=6000)
    assert gpu.launches[-1]["grid"] == (132, 1, 1)  # 47 tiles: 24 units * 4 heads * 3
    counter = descs[0]["sched"]
    assert counter != 0 and counter % 8 == 0 and more[0]["sched"] == counter
    assert ints_at(counter, 2) == [0, 0]
    other = attn(small, small, small, stream=7)
    assert other is not None
    raw = ctypes.string_at(gpu.launches[-1]["desc_ptr"], attn.manifest.layout.size)
    assert decode(attn.manifest.layout, raw)["sched"] not in (0, counter)  # its own stream's
    assert kernels.persistent_ctas(132, False, 4096) == 132
    assert kernels.persistent_ctas(132, True, 1024) == 2**31 - 1
    assert kernels.persistent_ctas(132, True, 65536, dynamic=True) == 132


def test_without_a_work_counter_the_grid_is_static(real_artifacts, gpu, tmp_path):
    """Artifacts whose kernels take no counter (work_counter false) keep the static rule:
    persistent only for the batch layout up to PERSISTENT_MAX_LEN, desc.sched = 0."""
    d = tmp_path / "causal"
    shutil.copytree(real_artifacts["causal"], d)
    m = json.loads((d / "manifest.json").read_text())
    for k in m["kernels"]:
        k["work_counter"] = False
    (d / "manifest.json").write_text(json.dumps(m))
    attn = loader.load(d)
    da = DeviceArray((9, 1000, 4, 128), "bf16")
    _, descs = run_and_decode(gpu, attn, da, da, da)
    assert gpu.launches[-1]["grid"] == (132, 1, 1) and descs[0]["sched"] == 0
    long = DeviceArray((1, kernels.PERSISTENT_MAX_LEN + 1, 40, 128), "bf16")
    attn(long, long, long)
    assert gpu.launches[-1]["grid"] == (17 * 40, 1, 1)  # uncapped: one CTA per unit


def test_parameter_uploads_go_through_the_pinned_ring(real_artifacts, gpu):
    """Host parameters are staged in pinned slots (a pageable cuMemcpyHtoDAsync would
    synchronise the stream on every launch); each launch still sees its own values."""
    attn = loader.load(real_artifacts["shared_prefix"])
    da = DeviceArray((2, 40, 2, 128), "bf16")
    for i in range(device._Staging.SLOTS + 3):
        _, descs = run_and_decode(gpu, attn, da, da, da, prompt_len=[i % 5, 40],
                                  responses=[[3, 20 + i], [40]])
        launch = gpu.launches[-1]
        assert launch["prompt_len"] == [i % 5, 40]
        assert launch["responses"] == ([0, 2, 3], [3, 20 + i, 40])
    ring = device._staging[0]
    assert len(ring.slots) == device._Staging.SLOTS and len(gpu.pinned) == device._Staging.SLOTS


# --------------------------------------------------------------------------- plans


def _set_ints(arr, vals):
    (ctypes.c_int32 * len(vals)).from_address(arr.__cuda_array_interface__["data"][0])[:] = vals


def test_plan_reads_device_values_once_and_keeps_its_own_copy(tmp_path, gpu, monkeypatch):
    attn = loader.load(write_artifact(tmp_path))
    qp = gpu.array((16, 2, 64))
    cs, nt = gpu.array((3,), "i32"), gpu.array((2,), "i32")
    _set_ints(cs, [0, 6, 16])
    _set_ints(nt, [6, 10])
    reads = []
    real = _driver.dtoh_sync
    monkeypatch.setattr(_driver, "dtoh_sync", lambda *a: reads.append(a) or real(*a))
    plan = attn.plan(cu_seqlens=cs, n_targets=nt)
    assert (plan.packed, plan.batch, plan.max_len, plan.tokens) == (True, 2, 10, 16)
    n_reads = len(reads)
    assert n_reads >= 2  # cu_seqlens and n_targets, read back to be checked
    _set_ints(cs, [0, 16, 16])  # the caller's arrays change: the plan's copy does not
    _set_ints(nt, [99, 99])
    for _ in range(3):
        _, descs = run_and_decode(gpu, attn, qp, qp, qp, plan=plan)
        assert len(reads) == n_reads  # nothing read back per call
        assert gpu.launches[-1]["seqlens"] == [0, 6, 16]
        assert gpu.launches[-1]["n_targets"] == [6, 10]
        assert descs[0]["max_len"] == 10
        assert descs[0]["cu_seqlens"] != cs.__cuda_array_interface__["data"][0]


def test_plan_launch_matches_the_unplanned_one(tmp_path, gpu):
    attn = loader.load(write_artifact(tmp_path))
    q = gpu.array((3, 40, 2, 64))
    _, plain = run_and_decode(gpu, attn, q, q, q, n_targets=[0, 7, 40], scale=0.5)
    plain_launch = dict(gpu.launches[-1])
    plan = attn.plan(batch=3, seq_len=40, n_targets=[0, 7, 40])
    _, planned = run_and_decode(gpu, attn, q, q, q, plan=plan, scale=0.5)
    pointers = {"cu_seqlens", "p_n_targets", "o"}
    assert {k: v for k, v in plain[0].items() if k not in pointers} == \
        {k: v for k, v in planned[0].items() if k not in pointers}
    for key in ("grid", "block", "smem", "seqlens", "n_targets"):
        assert gpu.launches[-1][key] == plain_launch[key]
    res = attn(q, q, q, plan=plan, return_lse=True)
    assert res[1].shape == (3, 2, 40)  # the batch layout's lse view


def test_plan_rules(tmp_path, gpu):
    attn = loader.load(write_artifact(tmp_path))
    with pytest.raises(ParamError) as e:  # parameters are checked when the plan is made
        attn.plan(cu_seqlens=[0, 6, 16], n_targets=[6, 11])
    assert e.value.param == "n_targets"
    with pytest.raises(ParamError, match="^cu_seqlens: a plan needs"):
        attn.plan(n_targets=[1])
    with pytest.raises(ParamError, match="not both"):
        attn.plan(cu_seqlens=[0, 4], batch=1, seq_len=4, n_targets=[1])
    with pytest.raises(ParamError) as e:
        attn.plan(batch=2, seq_len=-1, n_targets=[0, 0])
    assert e.value.param == "seq_len"
    plan = attn.plan(cu_seqlens=[0, 6, 16], n_targets=[6, 10])
    qp = gpu.array((16, 2, 64))
    with pytest.raises(ParamError, match="^plan: carries .* do not pass cu_seqlens, n_targets"):
        attn(qp, qp, qp, plan=plan, cu_seqlens=[0, 6, 16], n_targets=[6, 10])
    with pytest.raises(ParamError, match="T = 16 tokens"):
        q12 = gpu.array((12, 2, 64))
        attn(q12, q12, q12, plan=plan)
    with pytest.raises(ParamError, match="packed"):
        q4 = gpu.array((2, 8, 2, 64))
        attn(q4, q4, q4, plan=plan)
    bplan = attn.plan(batch=2, seq_len=8, n_targets=[1, 2])
    with pytest.raises(ParamError, match="batch 2 x length 8"):
        q3 = gpu.array((2, 9, 2, 64))
        attn(q3, q3, q3, plan=bplan)
    assert not gpu.launches


def test_plan_launches_during_graph_capture(tmp_path, gpu):
    attn = loader.load(write_artifact(tmp_path))
    plan = attn.plan(cu_seqlens=[0, 6, 16], n_targets=[6, 10])  # host values, uploaded once
    gpu.capturing = True
    qp = gpu.array((16, 2, 64))
    with pytest.raises(ParamError):  # without a plan, host values cannot be uploaded now
        attn(qp, qp, qp, cu_seqlens=[0, 6, 16], max_len=10, n_targets=[6, 10])
    attn(qp, qp, qp, plan=plan)
    assert len(gpu.launches) == 1


# --------------------------------------------------------------------------- replayed launches


def _count_checks(monkeypatch) -> list[int]:
    calls = [0]
    real = loader.check_tensors

    def counting(*a, **kw):
        calls[0] += 1
        return real(*a, **kw)

    monkeypatch.setattr(loader, "check_tensors", counting)
    return calls


@pytest.mark.parametrize("source", ["hstu", "causal"])
def test_a_planned_call_is_replayed_with_only_the_output_pointer_changed(
        source, tmp_path, gpu, real_artifacts, monkeypatch):
    if source == "hstu":  # the portable kernel, a per-sequence parameter in the plan
        attn = loader.load(write_artifact(tmp_path))
        q = k = v = gpu.array((16, 2, 64))
        plan = attn.plan(cu_seqlens=[0, 6, 16], n_targets=[6, 10])
    else:  # the sm90 kernel: tensor maps and a work counter
        attn = loader.load(real_artifacts["causal"])
        q, k, v = (DeviceArray((2, 300, 2, 128), "bf16") for _ in range(3))
        plan = attn.plan(batch=2, seq_len=300)
    checks = _count_checks(monkeypatch)
    out1, (d1,) = run_and_decode(gpu, attn, q, k, v, plan=plan, scale=0.3)
    first = dict(gpu.launches[-1])
    maps1 = getattr(gpu, "launched_maps", None)
    assert checks[0] == 1
    out2, (d2,) = run_and_decode(gpu, attn, q, k, v, plan=plan, scale=0.3)
    assert checks[0] == 1  # replayed: nothing checked again
    ptr = lambda a: describe(a, "out", 0).ptr  # noqa: E731
    assert out2 is not out1 and ptr(out2) != ptr(out1)
    assert (d1["o"], d2["o"]) == (ptr(out1), ptr(out2))
    assert {n: x for n, x in d1.items() if n != "o"} == {n: x for n, x in d2.items() if n != "o"}
    for key in ("symbol", "grid", "block", "smem", "stream", "seqlens"):
        assert gpu.launches[-1][key] == first[key]
    assert getattr(gpu, "launched_maps", None) == maps1
    assert (describe(out2, "out", 0).shape, describe(out2, "out", 0).dtype) == \
        (describe(q, "q", 0).shape, describe(q, "q", 0).dtype)


def test_what_is_not_replayed(tmp_path, gpu, monkeypatch):
    attn = loader.load(write_artifact(tmp_path))
    q, q2 = gpu.array((16, 2, 64)), gpu.array((16, 2, 64))
    plan = attn.plan(cu_seqlens=[0, 6, 16], n_targets=[6, 10])
    checks = _count_checks(monkeypatch)
    attn(q, q, q, plan=plan)
    attn(q, q, q, plan=plan)
    assert checks[0] == 1
    n = 1
    for call in (
        lambda: attn(q2, q, q, plan=plan),  # another q
        lambda: attn(q, q2, q, plan=plan),  # another k
        lambda: attn(q, q, q, plan=plan, scale=0.5),  # another scale
        lambda: attn(q, q, q, plan=plan, stream=0x55),  # another stream
        lambda: attn(q, q, q, plan=attn.plan(cu_seqlens=[0, 6, 16], n_targets=[6, 10])),
        lambda: attn(q, q, q, plan=plan, out=gpu.array((16, 2, 64))),  # the caller's out
        lambda: attn(q, q, q, plan=plan, return_lse=True),
        lambda: attn(q, q, q, plan=plan, scale=np.float32(0.5)),  # not a Python number
        lambda: attn(q, q, q, plan=plan, scale=np.float32(0.5)),
    ):
        call()
        n += 1
        assert checks[0] == n
    attn(q, q, q, plan=plan, scale=0.5)  # each of those that made a record replays
    attn(q, q, q, plan=plan, stream=0x55)
    attn(q, q, q, plan=plan, return_lse=True)
    assert checks[0] == n
    out = gpu.array((16, 2, 64))
    attn(q, q, q, plan=plan, out=out)
    attn(q, q, q, plan=plan, out=out)
    assert checks[0] == n + 1
    wrong = gpu.array((12, 2, 64))
    with pytest.raises(ParamError, match="T = 16 tokens"):  # a new geometry is checked
        attn(wrong, wrong, wrong, plan=plan)


def test_replay_records_are_bounded_and_do_not_outlive_their_plan(tmp_path, gpu, monkeypatch):
    attn = loader.load(write_artifact(tmp_path))
    q = gpu.array((16, 2, 64))
    checks = _count_checks(monkeypatch)
    plan = attn.plan(cu_seqlens=[0, 6, 16], n_targets=[6, 10])
    for i in range(loader._LAUNCH_CACHE_SIZE + 5):
        attn(q, q, q, plan=plan, scale=0.01 * (i + 1))
    assert len(attn._launches) == loader._LAUNCH_CACHE_SIZE
    key, rec = next(reversed(attn._launches.items()))
    del plan
    plan = attn.plan(cu_seqlens=[0, 6, 16], n_targets=[6, 10])
    attn._launches[(id(plan), *key[1:])] = rec  # as if the new plan reused the old one's id()
    before = checks[0]
    attn(q, q, q, plan=plan, scale=key[2])
    assert rec.plan() is None and checks[0] == before + 1


def test_replay_with_the_callers_out_and_with_lse(tmp_path, gpu, monkeypatch):
    attn = loader.load(write_artifact(tmp_path))
    q = gpu.array((3, 40, 2, 64))
    plan = attn.plan(batch=3, seq_len=40, n_targets=[0, 7, 40])
    checks = _count_checks(monkeypatch)
    out = gpu.array((3, 40, 2, 64))
    r1, (d1,) = run_and_decode(gpu, attn, q, q, q, plan=plan, out=out)
    r2, (d2,) = run_and_decode(gpu, attn, q, q, q, plan=plan, out=out)
    assert checks[0] == 1 and r1 is out and r2 is out and d1 == d2
    (o1, l1), (e1,) = run_and_decode(gpu, attn, q, q, q, plan=plan, return_lse=True)
    (o2, l2), (e2,) = run_and_decode(gpu, attn, q, q, q, plan=plan, return_lse=True)
    assert checks[0] == 2
    ptr = lambda a: describe(a, "x", 0).ptr  # noqa: E731
    assert ptr(l2) != ptr(l1) and (e1["lse"], e2["lse"]) == (ptr(l1), ptr(l2))
    assert (e1["o"], e2["o"]) == (ptr(o1), ptr(o2))
    assert {n: x for n, x in e1.items() if n not in ("o", "lse")} == \
        {n: x for n, x in e2.items() if n not in ("o", "lse")}
    assert l1.shape == l2.shape == (3, 2, 40)  # the batch layout's [B, H, L] view
    pq = gpu.array((16, 2, 64))
    pplan = attn.plan(cu_seqlens=[0, 6, 16], n_targets=[6, 10])
    for _ in range(2):
        _, lse = attn(pq, pq, pq, plan=pplan, return_lse=True)
        assert lse.shape == (2, 16)  # packed: [H, T]
    assert checks[0] == 3
    ro = loader.DeviceArray((3, 40, 2, 64), "fp16", ptr=ptr(out))
    monkeypatch.setattr(loader, "describe", lambda a, n, s: replace(describe(a, n, s),
                        readonly=True) if a is ro else describe(a, n, s))
    with pytest.raises(ParamError):  # the same memory, read-only: not the recorded key
        attn(q, q, q, plan=plan, out=ro)
