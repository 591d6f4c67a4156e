"""Host-side validation of one launch: every rule a kernel relies on, checked before launch.

Pure functions over `ArrayInfo` values and host integers (device-resident integer arrays are
read through a `read` callback), so every rule is testable on a CPU. Each violation raises
one `ParamError(param, rule)` naming the argument and the rule it broke. Nothing that could
make a kernel read or write out of bounds gets past these checks:

Tensors (q, k, v, out):
- batch layout q [B, L, Hq, D], k/v [B, L, Hkv, D]; packed layout q [T, Hq, D], k/v
  [T, Hkv, D] with cu_seqlens int32 [B+1]; out has q's shape; Hq % Hkv == 0.
- dtype is one the artifact was built for (bf16/fp16), the same for all four; head_dim D is
  one it was built for; all on one CUDA device.
- last dimension contiguous (stride 1); base pointers 16-byte aligned; token and head
  strides multiples of 8 elements (16-byte cp.async/TMA rows); strides non-negative.
- batch layout: a tensor's batch stride equals L times its token stride (the kernel sees
  the batch as the packed layout with cu_seqlens = [0, L, 2L, ...]). This is an error, not
  a silent copy: copies would cost a full pass over Q/K/V and could not write `out` in place.
  (Strides of size-1 dimensions are never checked: they are never used.)
- out is writable and its (token, head, dim) elements do not overlap.

Sequences: cu_seqlens non-decreasing, starts at 0, ends at T; max_len, when given, is at
least the longest sequence (a larger value only adds idle blocks).

Mask parameters (every declared one present, no unknown ones), checked by cmc/contract.py,
the validator the oracle and `cmc show` use, against the range the manifest declares:
- scalar `int`: a Python int in int32 ('must fit int32') and in its declared range ('must
  be in the declared range'; by default every int32).
- `int[batch]`: an int (same value for every sequence), a sequence or 1-D array of B ints,
  or a device int32 array [B]; every value in int32 and in its declared range at len_b
  (an empty sequence: in the range's hull over every len, since no row reads it).
- `segments`: a list of B lists of starts (one list for B == 1 may be given flat), or
  `Segments(offsets, starts)` already packed (offsets int32 [B+1] into starts int32 []);
  each sequence's starts non-decreasing and inside [0, len_b].
Device-resident values are copied to the host to be checked (correctness first); during
CUDA graph capture that copy is impossible, so only their shapes and types are checked.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..contract import DEFAULT_RANGE, ParamRange, check_in_range, check_int
from ..errors import ArtifactError, ParamError
from .arrays import ArrayInfo, host_or_device_ints

INT32_MAX = 2**31 - 1
INT32_MIN = -(2**31)
GRID_YZ_MAX = 65535
ALIGN_BYTES = 16
STRIDE_MULTIPLE = 8  # elements: 16 bytes of a 2-byte dtype

ReadFn = Callable[[ArrayInfo], np.ndarray]


@dataclass(frozen=True)
class Segments:
    """Segment starts already packed: offsets int32 [B+1] into starts int32 [] (host or device).

    starts[offsets[b]:offsets[b+1]] are sequence b's starts, relative to its first token.
    """

    offsets: Any
    starts: Any


@dataclass(frozen=True)
class TensorStrides:
    """Element strides of one tensor as the kernel sees it (token-major packed view)."""

    tok: int
    head: int


@dataclass(frozen=True)
class Geometry:
    packed: bool
    batch: int  # for the packed layout: from cu_seqlens, filled in later (0 until then)
    seq_len: int  # batch layout: L; packed: 0
    tokens: int  # T (B * L for the batch layout)
    heads_q: int
    heads_kv: int
    head_dim: int
    dtype: str
    device: int | None
    strides: Mapping[str, TensorStrides] = field(default_factory=dict)


# --------------------------------------------------------------------------- tensors


def _dtype_name(d: str) -> str:
    return d[6:] if d.startswith("other:") else d


def kernel_strides(name: str, a: ArrayInfo, packed: bool) -> TensorStrides:
    """(token, head) strides in elements, checking the batch rule and the size-1 cases."""
    if packed:
        t, h, _ = a.shape
        st, sh, _ = a.strides
        tok = st if t > 1 else 0
    else:
        b, seq, h, _ = a.shape
        sb, st, sh, _ = a.strides
        if b > 1 and seq > 1 and sb != seq * st:
            raise ParamError(name, f"batch stride {sb} must equal L * token stride "
                                   f"({seq} * {st} = {seq * st}): the batch layout is read as "
                                   "packed tokens; use .contiguous() or the packed layout")
        if seq > 1:
            tok = st
        else:
            tok = sb if b > 1 else 0  # L == 1: consecutive tokens are consecutive sequences
    head = sh if h > 1 else 0
    return TensorStrides(tok, head)


def _check_one(name: str, a: ArrayInfo, packed: bool, writable: bool) -> TensorStrides:
    nd = 3 if packed else 4
    layout = "[T, H, D] (packed, with cu_seqlens)" if packed else "[B, L, H, D]"
    if a.ndim != nd:
        raise ParamError(name, f"must have {nd} dimensions {layout}; got shape {list(a.shape)}")
    if any(s < 0 for s in a.strides):
        raise ParamError(name, f"strides must be non-negative; got {list(a.strides)}")
    if a.shape[-1] > 1 and a.strides[-1] != 1:
        raise ParamError(name, f"last dimension must be contiguous (stride 1); got stride "
                               f"{a.strides[-1]}")
    if writable and a.readonly:
        raise ParamError(name, "must be writable (the array is read-only)")
    strides = kernel_strides(name, a, packed)
    if a.numel == 0:
        return strides
    if a.ptr % ALIGN_BYTES:
        raise ParamError(name, f"data pointer must be {ALIGN_BYTES}-byte aligned "
                               f"(0x{a.ptr:x} is not)")
    for what, s in (("token", strides.tok), ("head", strides.head)):
        if s % STRIDE_MULTIPLE:
            raise ParamError(name, f"{what} stride {s} must be a multiple of "
                                   f"{STRIDE_MULTIPLE} elements (16-byte rows)")
    if writable:
        tokens = a.shape[0] if packed else a.shape[0] * a.shape[1]
        dims = sorted(((s, n) for s, n in ((strides.tok, tokens), (strides.head, a.shape[-2]))
                       if n > 1), key=lambda sn: sn[0])
        extent = a.shape[-1]
        for s, n in dims:
            if s < extent:
                raise ParamError(name, f"elements must not overlap (strides {list(a.strides)} "
                                       f"for shape {list(a.shape)})")
            extent = s * n
    return strides


def packed_layout(qi: ArrayInfo, cu_seqlens: Any) -> bool:
    """Whether an unplanned call (forward or backward) is packed [T, H, D] (with cu_seqlens)
    rather than batch [B, L, H, D] (without)."""
    if cu_seqlens is not None and qi.ndim == 4:
        raise ParamError("cu_seqlens", "only for the packed layout q [T, Hq, D]; the batch "
                                       "layout [B, L, Hq, D] needs none")
    if qi.ndim == 3 and cu_seqlens is None:
        raise ParamError("cu_seqlens", "required for the packed layout q [T, Hq, D]")
    return qi.ndim == 3 or cu_seqlens is not None


def check_tensors(q: ArrayInfo, k: ArrayInfo, v: ArrayInfo, out: ArrayInfo | None, *,
                  packed: bool, variants: Sequence[tuple[str, int]]) -> Geometry:
    """Shapes, dtypes, devices, strides and alignment of q, k, v (and out, when given).

    `variants` lists the (dtype, head_dim) pairs the artifact has kernels for.
    """
    dtypes = sorted({d for d, _ in variants})
    if q.dtype not in dtypes:
        raise ParamError("q", f"dtype {_dtype_name(q.dtype)} is not one the artifact was "
                              f"built for ({', '.join(dtypes)})")
    for name, a in (("k", k), ("v", v), ("out", out)):
        if a is not None and a.dtype != q.dtype:
            raise ParamError(name, f"dtype {_dtype_name(a.dtype)} must match q's ({q.dtype})")
    for name, a in (("k", k), ("v", v), ("out", out)):
        if a is not None and None not in (a.device, q.device) and a.device != q.device:
            raise ParamError(name, f"must be on q's device (cuda:{q.device}); is on "
                                   f"cuda:{a.device}")
    strides = {"q": _check_one("q", q, packed, False)}
    strides["k"] = _check_one("k", k, packed, False)
    strides["v"] = _check_one("v", v, packed, False)
    if out is not None:
        strides["out"] = _check_one("out", out, packed, True)
    head_dim = q.shape[-1]
    if packed:
        tokens, heads_q = q.shape[0], q.shape[1]
        seq_len, batch = 0, 0
        lead: tuple[int, ...] = (tokens,)
    else:
        batch, seq_len, heads_q = q.shape[0], q.shape[1], q.shape[2]
        tokens = batch * seq_len
        lead = (batch, seq_len)
    heads_kv = k.shape[-2]
    want_kv = (*lead, heads_kv, head_dim)
    if tuple(k.shape) != want_kv:
        raise ParamError("k", f"shape {list(k.shape)} must be {list(want_kv)} "
                              f"(q's tokens and head_dim)")
    if tuple(v.shape) != tuple(k.shape):
        raise ParamError("v", f"shape {list(v.shape)} must equal k's {list(k.shape)}")
    if out is not None and tuple(out.shape) != tuple(q.shape):
        raise ParamError("out", f"shape {list(out.shape)} must equal q's {list(q.shape)}")
    dims = sorted({d for dt, d in variants if dt == q.dtype})
    if head_dim not in dims:
        raise ParamError("q", f"head_dim {head_dim} is not one the artifact was built for "
                              f"({q.dtype}: {', '.join(map(str, dims))})")
    if heads_kv < 1 or heads_q % heads_kv:
        raise ParamError("k", f"query heads ({heads_q}) must be a multiple of key/value heads "
                              f"({heads_kv})")
    if heads_q > GRID_YZ_MAX:
        raise ParamError("q", f"at most {GRID_YZ_MAX} query heads (grid y limit)")
    if tokens > INT32_MAX:
        raise ParamError("q", f"at most {INT32_MAX} tokens")
    if not packed and seq_len > INT32_MAX:
        raise ParamError("q", f"sequence length must fit int32 (is {seq_len})")
    if not packed and batch > GRID_YZ_MAX:
        raise ParamError("q", f"at most {GRID_YZ_MAX} sequences (grid z limit)")
    return Geometry(packed, batch, seq_len, tokens, heads_q, heads_kv, head_dim, q.dtype,
                    q.device, strides)


# --------------------------------------------------------------------------- int32 arrays


def check_int32_device(name: str, a: ArrayInfo, length: int | None, device: int | None) -> None:
    """A device int32 array the kernel indexes directly: 1-D, contiguous, aligned, on device."""
    if a.dtype != "i32":
        raise ParamError(name, f"device array must be int32 (got {_dtype_name(a.dtype)})")
    if a.ndim != 1:
        raise ParamError(name, f"device array must be 1-D (got shape {list(a.shape)})")
    if length is not None and a.shape[0] != length:
        raise ParamError(name, f"must have {length} values (got {a.shape[0]})")
    if a.shape[0] > 1 and a.strides[0] != 1:
        raise ParamError(name, "device array must be contiguous")
    if a.shape[0] and a.ptr % 4:
        raise ParamError(name, "device array must be 4-byte aligned")
    if None not in (a.device, device) and a.device != device:
        raise ParamError(name, f"must be on q's device (cuda:{device}); is on cuda:{a.device}")


def _int32(name: str, vals: np.ndarray) -> np.ndarray:
    if vals.size and (vals.min() < INT32_MIN or vals.max() > INT32_MAX):
        raise ParamError(name, "values must fit int32")
    return vals.astype(np.int32)


def check_cu_seqlens(values: np.ndarray, tokens: int) -> np.ndarray:
    """Sequence lengths (int64 [B]) from host cu_seqlens values, checking every rule."""
    vals = np.asarray(values, dtype=np.int64).reshape(-1) if np.ndim(values) == 1 else None
    if vals is None:
        raise ParamError("cu_seqlens", f"must be 1-D [B+1] (got shape {list(np.shape(values))})")
    if vals.size < 1:
        raise ParamError("cu_seqlens", "must have B+1 >= 1 values")
    if vals[0] != 0:
        raise ParamError("cu_seqlens", f"must start at 0 (starts at {vals[0]})")
    lengths = np.diff(vals)
    if lengths.size and lengths.min() < 0:
        b = int(np.argmax(lengths < 0))
        raise ParamError("cu_seqlens", f"must be non-decreasing (cu_seqlens[{b + 1}] = "
                                       f"{vals[b + 1]} < cu_seqlens[{b}] = {vals[b]})")
    if vals[-1] != tokens:
        raise ParamError("cu_seqlens", f"must end at T = {tokens}, the tokens of q "
                                       f"(ends at {vals[-1]})")
    if lengths.size > GRID_YZ_MAX:
        raise ParamError("cu_seqlens", f"at most {GRID_YZ_MAX} sequences (grid z limit)")
    return lengths


def resolve_max_len(given: Any, lengths: np.ndarray | None) -> int:
    """max_len for the grid: the longest sequence, or a given bound that is at least that."""
    longest = int(lengths.max()) if lengths is not None and lengths.size else 0
    if given is None:
        if lengths is None:
            raise ParamError("max_len", "required when cu_seqlens cannot be read "
                                        "(during CUDA graph capture)")
        return longest
    if isinstance(given, bool) or not isinstance(given, (int, np.integer)):
        raise ParamError("max_len", f"must be an int (got {type(given).__name__})")
    g = int(given)
    if g < 0 or g > INT32_MAX:
        raise ParamError("max_len", "must be in [0, 2**31 - 1]")
    if g < longest:
        raise ParamError("max_len", f"must be >= the longest sequence ({longest}); got {g}")
    return g


# --------------------------------------------------------------------------- mask params


@dataclass(frozen=True)
class PackedParam:
    """One mask parameter ready for the descriptor: a scalar, or int32 arrays (host/device).

    For `batch`: arrays == (values,); for `segments`: arrays == (offsets, starts).
    """

    name: str
    kind: str
    value: int = 0
    arrays: tuple[np.ndarray | ArrayInfo, ...] = ()


def _scalar(name: str, v: Any, rng: ParamRange) -> PackedParam:
    """Rule 'must be an int' and 'must fit int32' (contract.check_int), then 'must be in the
    declared range' (a scalar's range never uses len)."""
    iv = check_int(name, v)
    check_in_range(name, np.array([iv]), rng, None)
    return PackedParam(name, "scalar", value=iv)


def _per_sequence(name: str, v: Any, rng: ParamRange, batch: int, lengths: np.ndarray | None,
                  device: int | None, read: ReadFn | None, stream: int) -> PackedParam:
    if isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_)):
        vals = np.full(batch, check_int(name, v), dtype=np.int64)
    else:
        got = host_or_device_ints(v, name, stream)
        if isinstance(got, ArrayInfo):
            check_int32_device(name, got, batch, device)
            if read is None:  # cannot copy (graph capture): shape/type checks only
                return PackedParam(name, "batch", arrays=(got,))
            check_in_range(name, np.asarray(read(got), dtype=np.int64), rng, lengths)
            return PackedParam(name, "batch", arrays=(got,))
        if got.ndim != 1 or got.shape[0] != batch:
            raise ParamError(name, f"needs one value per sequence: {batch} values "
                                   f"(got shape {list(got.shape)})")
        vals = got
    check_in_range(name, vals, rng, lengths)
    return PackedParam(name, "batch", arrays=(vals.astype(np.int32),))


def _pack_segments_fast(per_seq: Sequence[Sequence[int]],
                        lengths: np.ndarray | None) -> tuple[np.ndarray, np.ndarray] | None:
    """pack_segments for lists / tuples of plain ints that pass every check, vectorised
    (the runtime does this on every call); None sends anything else, including every
    error, to the per-sequence path and its messages."""
    if not all(type(x) in (list, tuple) for x in per_seq):
        return None
    sizes = np.fromiter((len(x) for x in per_seq), dtype=np.int64, count=len(per_seq))
    flat_list = [v for x in per_seq for v in x]
    if not all(type(v) is int for v in flat_list):
        return None
    flat = np.asarray(flat_list, dtype=np.int64) if flat_list else np.zeros(0, np.int64)
    offsets = np.zeros(len(per_seq) + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    if offsets[-1] > INT32_MAX or (flat.size and (flat.min() < INT32_MIN or
                                                  flat.max() > INT32_MAX)):
        return None
    if flat.size:
        step = np.diff(flat)
        inside = np.ones(step.size, dtype=bool)  # steps between two starts of one sequence
        ends = offsets[1:-1]
        ends = ends[(ends > 0) & (ends < flat.size)]
        inside[ends - 1] = False
        if np.any(step[inside] < 0) or flat.min() < 0:
            return None
        if lengths is not None:
            limit = np.repeat(np.asarray(lengths, dtype=np.int64), sizes)
            if np.any(flat > limit):
                return None
    return offsets.astype(np.int32), flat.astype(np.int32)


def pack_segments(name: str, per_seq: Sequence[Sequence[int]],
                  lengths: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """List of per-sequence start lists -> (offsets int32 [B+1], starts int32 [])."""
    fast = _pack_segments_fast(per_seq, lengths)
    if fast is not None:
        return fast
    offsets = [0]
    flat: list[np.ndarray] = []
    for b, starts in enumerate(per_seq):
        got = host_or_device_ints(starts, name)
        if isinstance(got, ArrayInfo):
            raise ParamError(name, "per-sequence start lists must be host values; pass "
                                   "Segments(offsets, starts) for device arrays")
        if got.ndim > 1:
            raise ParamError(name, f"sequence {b}: starts must be a flat list of ints")
        arr = got.reshape(-1)
        _check_starts(name, b, arr, None if lengths is None else int(lengths[b]))
        flat.append(arr)
        offsets.append(offsets[-1] + arr.size)
    starts_all = np.concatenate(flat) if flat else np.zeros(0, dtype=np.int64)
    if offsets[-1] > INT32_MAX:
        raise ParamError(name, "too many segment starts (int32 offsets)")
    return np.asarray(offsets, dtype=np.int32), _int32(name, starts_all)


def _check_starts(name: str, b: int, starts: np.ndarray, length: int | None) -> None:
    if starts.size == 0:
        return
    if starts.size > 1 and np.any(np.diff(starts) < 0):
        raise ParamError(name, f"sequence {b}: starts must be sorted (non-decreasing); "
                               f"got {starts.tolist()[:16]}")
    if length is not None and (starts[0] < 0 or starts[-1] > length):
        raise ParamError(name, f"sequence {b}: starts must be in [0, len] = [0, {length}]; "
                               f"got {starts.tolist()[:16]}")
    if length is None and starts[0] < 0:
        raise ParamError(name, f"sequence {b}: starts must be >= 0")


def _segments(name: str, v: Any, batch: int, lengths: np.ndarray | None, device: int | None,
              read: ReadFn | None, stream: int) -> PackedParam:
    if isinstance(v, Segments):
        return _packed_segments(name, v, batch, lengths, device, read, stream)
    if isinstance(v, np.ndarray) and v.ndim in (1, 2):
        items: list[Any] = [v] if v.ndim == 1 and batch == 1 else list(v)
    elif isinstance(v, Sequence) and not isinstance(v, (str, bytes)):
        items = list(v)
        flat = all(isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))
                   for x in items)
        if batch == 1 and flat:
            items = [items]  # one sequence, given flat (also `[]`: no starts)
    else:
        raise ParamError(name, "segments: a list of start lists, one per sequence, or "
                               "Segments(offsets, starts)")
    if len(items) != batch:
        raise ParamError(name, f"needs one list of starts per sequence: {batch} lists "
                               f"(got {len(items)})")
    offsets, starts = pack_segments(name, items, lengths)
    return PackedParam(name, "segments", arrays=(offsets, starts))


def _packed_segments(name: str, v: Segments, batch: int, lengths: np.ndarray | None,
                     device: int | None, read: ReadFn | None, stream: int) -> PackedParam:
    off = host_or_device_ints(v.offsets, f"{name}.offsets", stream)
    sts = host_or_device_ints(v.starts, f"{name}.starts", stream)
    off_h: np.ndarray | None
    sts_h: np.ndarray | None
    if isinstance(off, ArrayInfo):
        check_int32_device(f"{name}.offsets", off, batch + 1, device)
        off_h = None if read is None else np.asarray(read(off), dtype=np.int64)
    else:
        off_h = off
    if isinstance(sts, ArrayInfo):
        check_int32_device(f"{name}.starts", sts, None, device)
        sts_h = None if read is None else np.asarray(read(sts), dtype=np.int64)
        n_starts = sts.shape[0]
    else:
        sts_h = sts.reshape(-1)
        n_starts = sts_h.size
    if isinstance(off, ArrayInfo) != isinstance(sts, ArrayInfo):
        raise ParamError(name, "Segments offsets and starts must both be host or both device "
                               "arrays")
    if off_h is not None:
        if off_h.ndim != 1 or off_h.shape[0] != batch + 1:
            raise ParamError(f"{name}.offsets", f"must have B+1 = {batch + 1} values "
                                                f"(got shape {list(off_h.shape)})")
        if off_h[0] != 0 or np.any(np.diff(off_h) < 0) or off_h[-1] != n_starts:
            raise ParamError(f"{name}.offsets", f"must be non-decreasing from 0 to the number "
                                                f"of starts ({n_starts})")
        if sts_h is not None:
            for b in range(batch):
                seq = sts_h[off_h[b]:off_h[b + 1]]
                _check_starts(name, b, seq, None if lengths is None else int(lengths[b]))
    if isinstance(off, ArrayInfo):
        return PackedParam(name, "segments", arrays=(off, sts))
    assert off_h is not None and sts_h is not None
    return PackedParam(name, "segments", arrays=(_int32(f"{name}.offsets", off_h),
                                                 _int32(f"{name}.starts", sts_h)))


def check_params(decls: Sequence[tuple[str, str]], given: Mapping[str, Any], *, batch: int,
                 lengths: np.ndarray | None, device: int | None = None,
                 read: ReadFn | None = None, stream: int = 0,
                 ranges: Mapping[str, ParamRange] | None = None) -> list[PackedParam]:
    """Every declared mask parameter present and valid, and no unknown ones.

    `lengths` (int64 [B]) are the sequence lengths when known; `read` copies a device int32
    array to the host (None: values cannot be read, e.g. during graph capture). `ranges`
    are the declared ranges from the manifest (an int parameter missing there accepts every
    int32, the language's default).
    """
    declared = [n for n, _ in decls]
    for name in given:
        if name not in declared:
            known = ", ".join(declared) if declared else "none"
            raise ParamError(name, f"unknown parameter; the mask declares: {known}")
    out: list[PackedParam] = []
    for name, kind in decls:
        if name not in given:
            raise ParamError(name, f"missing: the mask declares `param {name} : "
                                   f"{KIND_SYNTAX.get(kind, kind)}`")
        v = given[name]
        rng = (ranges or {}).get(name, DEFAULT_RANGE)
        if kind == "scalar":
            out.append(_scalar(name, v, rng))
        elif kind == "batch":
            out.append(_per_sequence(name, v, rng, batch, lengths, device, read, stream))
        elif kind == "segments":
            out.append(_segments(name, v, batch, lengths, device, read, stream))
        else:
            raise ArtifactError(f"parameter {name}: unknown kind {kind!r} in the manifest")
    return out


KIND_SYNTAX = {"scalar": "int", "batch": "int[batch]", "segments": "segments"}


# --------------------------------------------------------------------------- arch choice


def _arch_cc(arch: str) -> tuple[int, int, str] | None:
    """'sm_90a' -> (9, 0, 'a'); None if not an sm_ arch name."""
    if not arch.startswith("sm_"):
        return None
    body = arch[3:]
    suffix = ""
    if body and body[-1] in "af":
        body, suffix = body[:-1], body[-1]
    if not body.isdigit() or len(body) < 2:
        return None
    return int(body[:-1]), int(body[-1]), suffix


def select_arch(cc: tuple[int, int], available: Sequence[str]) -> str:
    """The best cubin arch for a device of compute capability cc.

    SASS runs only on its own major version, at the same or a higher minor; an arch-specific
    ('a') cubin runs only on exactly its compute capability. So a 9.0 device takes sm_90a,
    else sm_90; a 10.0 device sm_100a, else sm_100; an 8.6 device sm_86, else sm_80. (An sm_80
    cubin cannot run on sm_90: that would need PTX, which the artifact does not ship.)
    """
    major, minor = cc
    best: tuple[int, int, str] | None = None
    for arch in available:
        p = _arch_cc(arch)
        if p is None or p[0] != major:
            continue
        m, suffix = p[1], p[2]
        if (m != minor) if suffix == "a" else (m > minor):
            continue
        rank = (m, {"a": 2, "f": 1}.get(suffix, 0))
        if best is None or rank > best[:2]:
            best = (rank[0], rank[1], arch)
    if best is None:
        have = ", ".join(sorted(set(available))) or "none"
        raise ArtifactError(
            f"no cubin for this GPU (compute capability {major}.{minor}, sm_{major}{minor}); "
            f"the artifact has: {have}; recompile with --arch sm_{major}{minor}"
            f"{'a' if major >= 9 else ''}")
    return best[2]


# --------------------------------------------------------------------------- grid rule

_BINOPS: dict[type, Callable[[int, int], int]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
    ast.FloorDiv: lambda a, b: a // b if b else 0, ast.Div: lambda a, b: a // b if b else 0,
    ast.Mod: lambda a, b: a % b if b else a,
}


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b) if b else 0


def _eval_node(node: ast.AST, env: Mapping[str, int]) -> int:
    if isinstance(node, ast.Expression):
        return _eval_node(node.body, env)
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return int(node.value)
    if isinstance(node, ast.Name):
        if node.id not in env:
            raise KeyError(node.id)
        return int(env[node.id])
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        return _BINOPS[type(node.op)](_eval_node(node.left, env), _eval_node(node.right, env))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_eval_node(node.operand, env)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.keywords:
        fn = node.func.id
        if fn == "ceil" and len(node.args) == 1 and isinstance(node.args[0], ast.BinOp) \
                and isinstance(node.args[0].op, (ast.Div, ast.FloorDiv)):
            a = _eval_node(node.args[0].left, env)
            return _ceil_div(a, _eval_node(node.args[0].right, env))
        args = [_eval_node(a, env) for a in node.args]
        if fn in ("ceil_div", "cdiv", "div_up") and len(args) == 2:
            return _ceil_div(args[0], args[1])
        if fn in ("min", "max") and args:
            return min(args) if fn == "min" else max(args)
    raise ValueError(f"unsupported grid expression: {ast.dump(node)[:80]}")


def parse_grid_expr(expr: int | str) -> Callable[[Mapping[str, int]], int]:
    """A manifest grid entry (int, or an expression over descriptor fields and block_m etc.)
    as a function; `ceil(a / b)` and `ceil_div(a, b)` are ceiling division, `/` floors."""
    if isinstance(expr, bool):
        raise ArtifactError(f"bad grid entry {expr!r}")
    if isinstance(expr, int):
        value = int(expr)
        return lambda env: value
    text = str(expr).replace("&&", " and ").strip()
    try:
        tree = ast.parse(text, mode="eval")
        _eval_node(tree, _ProbeEnv())
    except (SyntaxError, ValueError) as e:
        raise ArtifactError(f"cannot read grid expression {expr!r} in the manifest: {e}") from e
    return lambda env: _eval_node(tree, env)


class _ProbeEnv(dict):  # type: ignore[type-arg]
    """Any name evaluates to 1: checks an expression's shape at load time."""

    def __contains__(self, key: object) -> bool:
        return True

    def __getitem__(self, key: str) -> int:
        return 1


def grid_dims(fns: Sequence[Callable[[Mapping[str, int]], int]],
              env: Mapping[str, int]) -> tuple[int, int, int]:
    try:
        dims = tuple(int(f(env)) for f in fns)
    except KeyError as e:
        raise ArtifactError(f"grid rule uses unknown name {e}") from None
    if len(dims) != 3:
        raise ArtifactError(f"grid must have 3 dimensions, has {len(dims)}")
    return dims[0], dims[1], dims[2]


def check_grid(grid: tuple[int, int, int], symbol: str) -> None:
    """A launch grid within the device limits (x up to 2^31 - 1, y and z up to 65535, none
    zero), else a ParamError on q naming the kernel: the forward and the backward check each
    kernel's grid with it before launching."""
    if not (0 < grid[0] <= INT32_MAX and 0 < grid[1] <= GRID_YZ_MAX
            and 0 < grid[2] <= GRID_YZ_MAX):
        raise ParamError("q", f"launch grid {grid} of {symbol} is outside the device limits "
                              f"(x in [1, 2^31 - 1], y and z in [1, {GRID_YZ_MAX}])")


def scale_log2(scale: Any, head_dim: int) -> float:
    """Softmax scale (default 1/sqrt(D)) times log2(e), as the kernel's exp2 wants it; the
    scale must be positive (the kernel's running maximum relies on it)."""
    if scale is None:
        s = 1.0 / math.sqrt(head_dim)
    else:
        if isinstance(scale, bool) or not isinstance(scale, (int, float, np.floating,
                                                             np.integer)):
            raise ParamError("scale", f"must be a float (got {type(scale).__name__})")
        s = float(scale)
        if not math.isfinite(s) or s <= 0:
            raise ParamError("scale", f"must be finite and > 0 (got {s}): the kernel's online "
                                      "softmax assumes a positive scale")
    return s * math.log2(math.e)
