"""Load a compiled artifact and launch its kernels: `load(path) -> Attention`.

The manifest is the whole contract (docs/architecture.md): the runtime never imports the
compiler. Loading reads the manifest (manifest.py), verifies every cubin's sha256 and the
launch fields against the cubins and the header (launch_check.py, as inspect does), picks the
cubin for the device's compute capability, loads it into the device's primary context (the
one PyTorch and CuPy use, so pointers from either are valid; device.py) and sets the dynamic
shared memory it needs. A call packs the descriptor at the manifest's byte offsets and
launches on the caller's current stream.
"""

from __future__ import annotations

import ctypes
import struct
import sys
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
from cuda.bindings import driver as cu

from ..errors import ParamError
from ..kernels import persistent_ctas
from . import _driver
from .arrays import (
    ArrayInfo,
    DeviceArray,
    _Allocation,
    current_stream_of,
    describe,
    empty_like_q,
    empty_lse,
    host_or_device_ints,
    library_of,
    stream_handle,
)
from .device import (
    MapTensor,
    _cached_seqlens,
    _DeviceKernels,
    _Kernel,
    _Uploads,
    batch_cu_seqlens,
    refuse_host_values_in_capture,
    tensor_maps_block,
)
from .launch_check import verify_launch
from .manifest import KernelEntry, Manifest, read_manifest, verify_cubins
from .params import (
    Geometry,
    PackedParam,
    TensorStrides,
    check_cu_seqlens,
    check_grid,
    check_int32_device,
    check_params,
    check_tensors,
    grid_dims,
    kernel_strides,
    packed_layout,
    resolve_max_len,
    scale_log2,
)


@dataclass(frozen=True)
class _Launch:
    """One checked launch of a plan, replayed when the same plan meets the same q, k, v
    (and out, when given), stream, scale and return_lse again: every check and every
    descriptor field but the pointers of a fresh output and LSE is a function of those."""

    plan: weakref.ref[Plan]
    device: int
    function: Any
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    smem: int
    stream: int
    desc: bytes
    o_offset: int
    lse_offset: int
    maps: Any  # the tensor map block (kept alive here) or None
    maps_at: int
    symbol: str
    heads_q: int = 0  # the LSE's [H, T] and, for the batch layout, its [B, H, L] view
    tokens: int = 0


_LAUNCH_CACHE_SIZE = 64


def _plain_scale(scale: Any) -> bool:
    """A scale that keys a replayed launch by value (None or a Python number)."""
    return scale is None or type(scale) in (int, float)


def _replay_key(plan: Plan, stream: int, scale: Any, return_lse: bool, q: ArrayInfo,
                k: ArrayInfo, v: ArrayInfo, out: ArrayInfo | None) -> tuple[Any, ...] | None:
    """What a replayed launch must match: the plan, stream, scale, return_lse and each
    array's pointer, geometry, dtype, device and writability (out: None when the call
    allocates it); None when it cannot be replayed (an array that carries a CAI stream to
    order after)."""
    arrays = (q, k, v) if out is None else (q, k, v, out)
    if any(a.cai_stream is not None for a in arrays):
        return None
    return (id(plan), stream, scale, return_lse, out is None,
            *((a.ptr, a.shape, a.strides, a.dtype, a.device, a.readonly) for a in arrays))


# --------------------------------------------------------------------------- Attention


def _torch() -> Any:
    return sys.modules["torch"]


def _cupy() -> Any:
    return sys.modules["cupy"]


_empty_like_q = empty_like_q
_empty_lse = empty_lse  # the tools patch this name to poison the LSE (tools/runtime_check.py)

_TORCH_OF = {"bf16": "bfloat16", "fp16": "float16", "f32": "float32"}




def lse_batch_view(lse: Any, batch: int, heads: int, seq_len: int) -> Any:
    """[H, T] with T = B*L, seen as [B, H, L] without a copy."""
    if isinstance(lse, DeviceArray):
        return lse.view((batch, heads, seq_len), (seq_len, batch * seq_len, 1))
    if hasattr(lse, "permute"):  # torch
        return lse.view(heads, batch, seq_len).permute(1, 0, 2)
    return lse.reshape(heads, batch, seq_len).transpose(1, 0, 2)  # cupy


@dataclass(frozen=True, eq=False)
class Plan:
    """Sequence lengths and mask parameters checked once, for many launches (`attn.plan`).

    Holds its own device copy of cu_seqlens and of every parameter array, made when it was
    checked, so later changes to the caller's arrays cannot reach a launch that skipped
    the checks. A call with a plan reads nothing back from the device and uploads nothing,
    so it may be captured in a CUDA graph; the graph then points into the plan's buffer,
    so keep the plan alive as long as the graph.
    """

    device: int
    packed: bool  # packed layout [T, H, D] (cu_seqlens) or batch layout [B, L, H, D]
    batch: int
    max_len: int
    tokens: int  # T the plan was made for (cu_seqlens[-1]; B * L for the batch layout)
    values: Mapping[str, int]  # descriptor fields: cu_seqlens and the mask parameters
    buffer: _Allocation | None = field(default=None, repr=False)
    # (mask name, descriptor layout, params) of the artifact that made it: a plan's values are
    # descriptor fields, so only an artifact with the same layout may use them
    owner: Any = field(default=None, repr=False)

    def check_geometry(self, geo: Geometry) -> None:
        """q's tokens (packed) or batch and length (batch layout) are the plan's (forward and
        backward)."""
        if self.packed and geo.tokens != self.tokens:
            raise ParamError("plan", f"made for T = {self.tokens} tokens (cu_seqlens[-1]); q "
                                     f"has {geo.tokens}")
        if not self.packed and (geo.batch, geo.seq_len) != (self.batch, self.max_len):
            raise ParamError("plan", f"made for batch {self.batch} x length {self.max_len}; q "
                                     f"is {geo.batch} x {geo.seq_len}")


class Attention:
    """A loaded artifact: call it like an attention function.

    `attn(q, k, v, *, scale=None, return_lse=False, out=None, cu_seqlens=None,
    max_len=None, stream=None, **params)` -> out, or (out, lse) with return_lse.
    Batch layout: q [B, L, Hq, D], k/v [B, L, Hkv, D]; lse [B, Hq, L] (a view of the
    kernel's [Hq, B*L]). Packed layout: q [T, Hq, D], k/v [T, Hkv, D], cu_seqlens int32
    [B+1]; lse [Hq, T]. A row that sees no key gives 0 and lse -inf. The rules each argument
    must follow are listed in cmc/runtime/params.py; breaking one raises ParamError.
    """

    def __init__(self, manifest: Manifest, cubins: Mapping[str, bytes]):
        self.manifest = manifest
        self._cubins = dict(cubins)
        self._devices: dict[int, _DeviceKernels] = {}
        self._lock = threading.Lock()
        self._param_fields = manifest.param_fields()
        self._launches: OrderedDict[tuple[Any, ...], _Launch] = OrderedDict()
        self._plan_owner = (manifest.name, manifest.layout, manifest.params)

    # -- introspection
    @property
    def name(self) -> str:
        return self.manifest.name

    @property
    def path(self) -> Path:
        return self.manifest.path

    @property
    def params(self) -> tuple[tuple[str, str], ...]:
        """Declared mask parameters as (name, kind), kind in scalar / batch / segments."""
        return self.manifest.params

    @property
    def has_backward(self) -> bool:
        """Whether the artifact has the backward kernels for the current device's arch (False
        for `cmc compile --no-backward`)."""
        return self.manifest.backward is not None and \
            bool(self._kernels(self._device(None)).backward)

    def variants(self, device: int | None = None) -> list[tuple[str, int]]:
        """(dtype, head_dim) pairs with a kernel for the device's arch."""
        return sorted(self._kernels(self._device(device)).kernels)

    def arch(self, device: int | None = None) -> str:
        return self._kernels(self._device(device)).arch

    def _device(self, device: int | None) -> int:
        return _driver.current_device() if device is None else int(device)

    def _kernels(self, device: int) -> _DeviceKernels:
        dk = self._devices.get(device)
        if dk is None:
            with self._lock:
                dk = self._devices.get(device)
                if dk is None:
                    dk = _DeviceKernels(self.manifest, self._cubins, device)
                    self._devices[device] = dk
        return dk

    # -- plans
    def plan(self, *, cu_seqlens: Any = None, max_len: int | None = None,
             batch: int | None = None, seq_len: int | None = None, device: int | None = None,
             stream: Any = None, **params: Any) -> Plan:
        """Check cu_seqlens (packed layout) or (batch, seq_len) (batch layout) and the mask
        parameters once, and copy them to the device: `attn(q, k, v, plan=p)` then skips
        those checks and copies (FlashInfer's plan / run split). Device arrays are read back
        here, once, to be checked."""
        dev = self._device(device)
        self._kernels(dev)
        sh = stream_handle(stream) if stream is not None else 0
        with _driver.on_device(dev):
            read = self._read(sh)
            host: list[tuple[str, np.ndarray]] = []
            if cu_seqlens is not None:
                if batch is not None or seq_len is not None:
                    raise ParamError("cu_seqlens", "a plan is for the packed layout "
                                                   "(cu_seqlens) or the batch layout (batch, "
                                                   "seq_len), not both")
                cs = host_or_device_ints(cu_seqlens, "cu_seqlens", sh)
                if isinstance(cs, ArrayInfo):
                    cs = self._resolve(cs, dev)
                    check_int32_device("cu_seqlens", cs, None, dev)
                    vals = read(cs).astype(np.int64)
                else:
                    vals = cs
                if vals.ndim != 1 or vals.size < 1:
                    raise ParamError("cu_seqlens", "must be 1-D [B+1] with B+1 >= 1 values")
                tokens = int(vals[-1])
                lengths = check_cu_seqlens(vals, tokens)
                nb, mlen, packed = int(lengths.size), resolve_max_len(max_len, lengths), True
                host.append(("cu_seqlens", vals.astype(np.int32)))
            else:
                if batch is None or seq_len is None:
                    raise ParamError("cu_seqlens", "a plan needs cu_seqlens (packed layout) "
                                                   "or batch and seq_len (batch layout)")
                if max_len is not None and max_len != seq_len:
                    raise ParamError("max_len", f"must be seq_len = {seq_len} for the batch "
                                                "layout (or None)")
                for n, x in (("batch", batch), ("seq_len", seq_len)):
                    if not isinstance(x, int) or isinstance(x, bool) or not 0 <= x <= 2**31 - 1:
                        raise ParamError(n, f"must be an int in [0, 2^31) (got {x!r})")
                nb, mlen, packed, tokens = batch, seq_len, False, batch * seq_len
                lengths = np.full(nb, mlen, dtype=np.int64)
                host.append(("cu_seqlens", batch_cu_seqlens(nb, mlen)))
            packed_params = check_params(self.manifest.params, params, batch=nb,
                                         lengths=lengths, device=dev, read=read, stream=sh,
                                         ranges=self.manifest.ranges)
            values: dict[str, int] = {}
            for fname, val in self._param_slots(packed_params):
                if isinstance(val, int):
                    values[fname] = val
                else:
                    snap = read(val) if isinstance(val, ArrayInfo) else val
                    host.append((fname, np.ascontiguousarray(snap, dtype=np.int32)))
            offsets, size = [], 0
            for _, a in host:
                offsets.append(size)
                size += max(a.nbytes, 4) + (-max(a.nbytes, 4)) % _Uploads.ALIGN
            buf = _Allocation(size, dev)
            blob = np.zeros(size, dtype=np.uint8)
            for (fname, a), off in zip(host, offsets, strict=True):
                blob[off:off + a.nbytes] = a.view(np.uint8)
                values[fname] = buf.ptr + off
            _driver.htod(buf.ptr, blob.ctypes.data, size)
        return Plan(dev, packed, nb, mlen, tokens, values, buf, owner=self._plan_owner)

    # -- launch
    def __call__(self, q: Any, k: Any, v: Any, *, scale: float | None = None,
                 return_lse: bool = False, out: Any = None, cu_seqlens: Any = None,
                 max_len: int | None = None, stream: Any = None, plan: Plan | None = None,
                 deterministic: bool = False, **params: Any) -> Any:
        if _wants_grad(q, k, v):  # torch autograd: keep the LSE, backpropagate through it
            from .torch_op import autograd_call

            return autograd_call(self, q, k, v, scale=scale, return_lse=return_lse, out=out,
                                 cu_seqlens=cu_seqlens, max_len=max_len, stream=stream,
                                 plan=plan, deterministic=deterministic, params=params)
        if plan is not None and (cu_seqlens is not None or max_len is not None or params):
            given = [n for n, x in (("cu_seqlens", cu_seqlens), ("max_len", max_len))
                     if x is not None] + sorted(params)
            raise ParamError("plan", f"carries cu_seqlens, max_len and the mask parameters; "
                                     f"do not pass {', '.join(given)} with it")
        lib = library_of(q)
        sh = stream_handle(stream) if stream is not None else current_stream_of(q)
        # outputs are allocated on the launch stream only when the caller named one
        # (arrays.empty_like_q); otherwise the library's current stream is sh already
        alloc = sh if stream is not None else None
        qi = describe(q, "q", sh)
        if qi.device is None:
            qi = replace(qi, device=_driver.pointer_device(qi.ptr)) if qi.ptr else \
                replace(qi, device=_driver.current_device())
        if plan is not None and _plain_scale(scale):
            assert qi.device is not None
            ki, vi, oi = (None if x is None else self._resolve(describe(x, n, sh), qi.device)
                          for n, x in (("k", k), ("v", v), ("out", out)))
            assert ki is not None and vi is not None
            key = _replay_key(plan, sh, scale, return_lse, qi, ki, vi, oi)
            rec = None
            if key is not None:
                with self._lock:
                    rec = self._launches.get(key)
                    if rec is not None:
                        self._launches.move_to_end(key)
            if rec is not None and rec.plan() is plan:
                return self._replay(rec, plan, q, qi, lib, out, return_lse, alloc)
        assert qi.device is not None
        device = qi.device
        dk = self._kernels(device)
        with _driver.on_device(device):
            return self._launch(dk, lib, sh, q, qi, k, v, out, scale, return_lse,
                                cu_seqlens, max_len, params, plan, alloc)

    def backward(self, dout: Any, q: Any, k: Any, v: Any, out: Any, lse: Any, *,
                 scale: float | None = None, cu_seqlens: Any = None, max_len: int | None = None,
                 plan: Plan | None = None, stream: Any = None, deterministic: bool = False,
                 dq: Any = None, dk: Any = None, dv: Any = None,
                 **params: Any) -> tuple[Any, Any, Any]:
        """Gradients (dq, dk, dv) of the forward `out, lse = attn(q, k, v, return_lse=True,
        ...)` for the output gradient dout: the same q, k, v, scale and parameters (or plan),
        with out and lse exactly as that call returned them. dq, dk, dv are written into the
        given arrays or allocated like q, k, v. deterministic=True accumulates dQ in a fixed
        order (bitwise reproducible, a second pass over the keys) instead of fp32 atomics.
        Breaking a rule raises ParamError naming the argument (backward.py)."""
        from .backward import run_backward

        return run_backward(self, dout, q, k, v, out, lse, scale=scale, cu_seqlens=cu_seqlens,
                            max_len=max_len, plan=plan, stream=stream,
                            deterministic=deterministic, dq=dq, dk=dk, dv=dv, params=params)

    def _replay(self, rec: _Launch, plan: Plan, q: Any, qi: ArrayInfo, lib: str, out: Any,
                return_lse: bool, alloc: int | None) -> Any:
        desc = bytearray(rec.desc)
        if out is None:  # else the key holds out's pointer, and the descriptor has it
            out = _empty_like_q(q, qi, lib, alloc)
            struct.pack_into("<Q", desc, rec.o_offset, describe(out, "out", rec.stream).ptr)
        lse = _empty_lse(q, qi, lib, rec.heads_q, rec.tokens, alloc) if return_lse else None
        if lse is not None:
            struct.pack_into("<Q", desc, rec.lse_offset, describe(lse, "lse", rec.stream).ptr)
        buf = ctypes.create_string_buffer(bytes(desc), len(desc))
        if rec.maps is not None:
            argv = (ctypes.c_void_p * 2)(ctypes.addressof(buf), rec.maps_at)
        else:
            argv = (ctypes.c_void_p * 1)(ctypes.addressof(buf))
        with _driver.on_device(rec.device):
            _driver.call(f"cuLaunchKernel({rec.symbol})", cu.cuLaunchKernel(
                rec.function, *rec.grid, *rec.block, rec.smem, _driver.stream(rec.stream),
                ctypes.addressof(argv), 0))
        return out if lse is None else (out, self._lse_result(lse, plan, rec.heads_q))

    def _resolve(self, a: ArrayInfo, device: int) -> ArrayInfo:
        if a.device is not None:
            return a
        return replace(a, device=_driver.pointer_device(a.ptr) if a.ptr else device)

    def _read(self, stream: int) -> Callable[[ArrayInfo], np.ndarray]:
        def read(a: ArrayInfo) -> np.ndarray:
            host = np.empty(a.shape[0], dtype=np.int32)
            if host.nbytes:
                _driver.dtoh_sync(host.ctypes.data, a.ptr, host.nbytes, stream)
            return host
        return read

    def _launch(self, dk: _DeviceKernels, lib: str, sh: int, q: Any, qi: ArrayInfo, k: Any,
                v: Any, out: Any, scale: Any, return_lse: bool, cu_seqlens: Any, max_len: Any,
                params: Mapping[str, Any], plan: Plan | None = None,
                alloc: int | None = None) -> Any:
        device = dk.device
        infos = [self._resolve(describe(x, n, sh), device) for n, x in (("k", k), ("v", v))]
        ki, vi = infos
        oi = None if out is None else self._resolve(describe(out, "out", sh), device)
        if plan is not None:
            return self._launch_planned(dk, lib, sh, q, qi, ki, vi, out, oi, scale,
                                        return_lse, plan, alloc)
        packed = packed_layout(qi, cu_seqlens)
        geo = check_tensors(qi, ki, vi, oi, packed=packed, variants=list(dk.kernels))
        for a in (qi, ki, vi, oi):  # CAI v3: order after the producer's stream
            if a is not None and a.cai_stream is not None and a.cai_stream != sh:
                _driver.stream_wait_stream(sh, a.cai_stream)
        capturing = _driver.is_capturing(sh)
        batch, mlen, seq_ptr, packed_params, uploads = self._sequences(
            device, sh, geo, packed, cu_seqlens, max_len, params, capturing)
        slog2 = scale_log2(scale, geo.head_dim)
        if capturing:
            refuse_host_values_in_capture(packed_params, uploads)
        kern = dk.forward(geo.dtype, geo.head_dim, mlen)
        if out is None:
            out = _empty_like_q(q, qi, lib, alloc)
            oi = describe(out, "out", sh)
            geo = replace(geo, strides={**geo.strides, "out": kernel_strides("out", oi, packed)})
        lse = _empty_lse(q, qi, lib, geo.heads_q, geo.tokens, alloc) if return_lse else None
        lse_ptr = describe(lse, "lse", sh).ptr if lse is not None else 0
        assert oi is not None
        if not packed:
            seq_ptr = _cached_seqlens(device, batch, mlen, capturing) if batch and mlen else 0
        if geo.tokens and batch and geo.heads_q and mlen:
            self._run(kern, dk, packed, sh, geo, qi, ki, vi, oi, lse_ptr, seq_ptr, batch,
                      mlen, slog2, packed_params, uploads)
        if lse is None:
            return out
        if not packed:
            lse = lse_batch_view(lse, batch, geo.heads_q, mlen)
        return out, lse

    def _sequences(self, device: int, sh: int, geo: Geometry, packed: bool, cu_seqlens: Any,
                   max_len: Any, params: Mapping[str, Any], capturing: bool
                   ) -> tuple[int, int, int | tuple[str, int], list[PackedParam], _Uploads]:
        """The unplanned call's checks of cu_seqlens, max_len and the mask parameters (the
        forward's and the backward's): batch, max_len, the cu_seqlens pointer (or its
        upload), the checked parameters and the uploads they need."""
        read = None if capturing else self._read(sh)
        uploads = _Uploads(device)
        seq_ptr: int | tuple[str, int]
        if packed:
            cs = host_or_device_ints(cu_seqlens, "cu_seqlens", sh)
            if isinstance(cs, ArrayInfo):
                cs = self._resolve(cs, device)
                check_int32_device("cu_seqlens", cs, None, device)
                if cs.shape[0] < 1:
                    raise ParamError("cu_seqlens", "must have B+1 >= 1 values")
                lengths = None if read is None else check_cu_seqlens(read(cs), geo.tokens)
                batch = cs.shape[0] - 1
                seq_ptr = cs.ptr
            else:
                lengths = check_cu_seqlens(cs, geo.tokens)
                batch = lengths.size
                seq_ptr = ("upload", uploads.add(cs.astype(np.int32)))
            mlen = resolve_max_len(max_len, lengths)
        else:
            batch, mlen = geo.batch, geo.seq_len
            if max_len is not None and max_len != mlen:
                raise ParamError("max_len", f"must be L = {mlen} for the batch layout (or None)")
            lengths = np.full(batch, mlen, dtype=np.int64)
            seq_ptr = 0  # filled from the cache below, once everything else is checked
        packed_params = check_params(self.manifest.params, params, batch=batch, lengths=lengths,
                                     device=device, read=read, stream=sh,
                                     ranges=self.manifest.ranges)
        return batch, mlen, seq_ptr, list(packed_params), uploads

    def _launch_planned(self, dk: _DeviceKernels, lib: str, sh: int, q: Any, qi: ArrayInfo,
                        ki: ArrayInfo, vi: ArrayInfo, out: Any, oi: ArrayInfo | None,
                        scale: Any, return_lse: bool, plan: Plan,
                        alloc: int | None = None) -> Any:
        self._check_plan(plan, dk.device, qi)
        geo = check_tensors(qi, ki, vi, oi, packed=plan.packed, variants=list(dk.kernels))
        for a in (qi, ki, vi, oi):
            if a is not None and a.cai_stream is not None and a.cai_stream != sh:
                _driver.stream_wait_stream(sh, a.cai_stream)
        plan.check_geometry(geo)
        slog2 = scale_log2(scale, geo.head_dim)
        kern = dk.forward(geo.dtype, geo.head_dim, plan.max_len)
        fresh_out = out is None
        if out is None:
            out = _empty_like_q(q, qi, lib, alloc)
            oi = describe(out, "out", sh)
            geo = replace(geo, strides={**geo.strides,
                                        "out": kernel_strides("out", oi, plan.packed)})
        assert oi is not None
        lse = _empty_lse(q, qi, lib, geo.heads_q, geo.tokens, alloc) if return_lse else None
        lse_ptr = describe(lse, "lse", sh).ptr if lse is not None else 0
        if geo.tokens and plan.batch and geo.heads_q and plan.max_len:
            rec = self._run(kern, dk, plan.packed, sh, geo, qi, ki, vi, oi, lse_ptr,
                            plan.values["cu_seqlens"], plan.batch, plan.max_len, slog2, (),
                            _Uploads(dk.device), fixed=plan.values, plan=plan)
            key = _replay_key(plan, sh, scale, return_lse, qi, ki, vi,
                              None if fresh_out else oi)
            if rec is not None and key is not None and _plain_scale(scale):
                rec = replace(rec, heads_q=geo.heads_q, tokens=geo.tokens)
                with self._lock:
                    self._launches[key] = rec
                    if len(self._launches) > _LAUNCH_CACHE_SIZE:
                        self._launches.popitem(last=False)
        return out if lse is None else (out, self._lse_result(lse, plan, geo.heads_q))

    def _check_plan(self, plan: Any, device: int, qi: ArrayInfo) -> None:
        """A plan of this artifact, for this device and q's layout (forward and backward)."""
        if not isinstance(plan, Plan):
            raise ParamError("plan", f"must be a Plan from attn.plan(...), not "
                                     f"{type(plan).__name__}")
        if plan.owner != self._plan_owner:
            other = plan.owner[0] if isinstance(plan.owner, tuple) else "?"
            raise ParamError("plan", f"made by another artifact (mask {other!r}); this is "
                                     f"{self.name!r}: make the plan with this attn.plan(...)")
        if plan.device != device:
            raise ParamError("plan", f"made for device {plan.device}; the tensors are on "
                                     f"device {device}")
        if plan.packed != (qi.ndim == 3):
            want = "packed [T, H, D]" if plan.packed else "batch [B, L, H, D]"
            raise ParamError("plan", f"made for the {want} layout; q has {qi.ndim} dimensions")

    @staticmethod
    def _lse_result(lse: Any, plan: Plan, heads: int) -> Any:
        return lse if plan.packed else lse_batch_view(lse, plan.batch, heads, plan.max_len)

    def _param_slots(self, packed_params: Sequence[PackedParam]
                     ) -> Iterator[tuple[str, int | np.ndarray | ArrayInfo]]:
        """(descriptor field, value) of each checked parameter: an int for a scalar, the
        int32 array (host or device) for each array field."""
        for p in packed_params:
            fields = self._param_fields[p.name]
            if p.kind == "scalar":
                yield fields["value"].name, p.value
                continue
            roles = ("per_sequence",) if p.kind == "batch" else ("segment_offsets",
                                                                  "segment_starts")
            for role, arr in zip(roles, p.arrays, strict=True):
                yield fields[role].name, arr

    def _desc_values(self, packed_params: Sequence[PackedParam], uploads: _Uploads,
                     fixed: Mapping[str, int], geo: Geometry,
                     strides: Mapping[str, TensorStrides],
                     qkvo: tuple[ArrayInfo, ArrayInfo, ArrayInfo, ArrayInfo], lse_ptr: int,
                     batch: int, mlen: int, slog2: float
                     ) -> tuple[dict[str, int | float], list[tuple[str, int]]]:
        """The descriptor's values but sched and cu_seqlens (the forward's and the
        backward's), and the (field name, upload offset) of each host parameter array, whose
        pointer is known once the uploads are."""
        pending: list[tuple[str, int]] = []
        values: dict[str, int | float] = dict(fixed)
        for fname, arr in self._param_slots(packed_params):
            if isinstance(arr, int):
                values[fname] = arr
            elif isinstance(arr, ArrayInfo):
                values[fname] = arr.ptr
            else:
                pending.append((fname, uploads.add(arr)))
        qi, ki, vi, oi = qkvo
        s = strides
        values.update({
            "q": qi.ptr, "k": ki.ptr, "v": vi.ptr, "o": oi.ptr, "lse": lse_ptr,
            "q_stride_tok": s["q"].tok, "q_stride_head": s["q"].head,
            "k_stride_tok": s["k"].tok, "k_stride_head": s["k"].head,
            "v_stride_tok": s["v"].tok, "v_stride_head": s["v"].head,
            "o_stride_tok": s["out"].tok, "o_stride_head": s["out"].head,
            "lse_stride_head": geo.tokens, "batch": batch, "heads_q": geo.heads_q,
            "heads_kv": geo.heads_kv, "max_len": mlen, "scale_log2": slog2,
        })
        return values, pending

    def _run(self, kern: _Kernel, dk: _DeviceKernels, packed: bool, sh: int, geo: Geometry,
             qi: ArrayInfo, ki: ArrayInfo, vi: ArrayInfo, oi: ArrayInfo, lse_ptr: int,
             seq_ptr: int | tuple[str, int],
             batch: int, mlen: int, slog2: float, packed_params: Sequence[PackedParam],
             uploads: _Uploads, fixed: Mapping[str, int] | None = None,
             plan: Plan | None = None) -> _Launch | None:
        """Launch; with a plan, also the record that replays it (_Launch)."""
        values, pending = self._desc_values(packed_params, uploads, fixed or {}, geo,
                                            geo.strides, (qi, ki, vi, oi), lse_ptr, batch,
                                            mlen, slog2)
        s = geo.strides
        e = kern.entry
        sched = dk.counters.for_stream(sh) if e.work_counter else 0
        values["sched"] = sched
        env = {**{n: int(x) for n, x in values.items() if isinstance(x, int)},
               "block_m": e.block_m, "block_n": e.block_n, "threads": e.threads,
               "max_ctas": persistent_ctas(dk.num_sms, packed, mlen, dynamic=sched != 0)}
        if e.max_len is not None and mlen > e.max_len:
            raise ParamError("max_len", f"{mlen} tokens: this kernel's tile plan ("
                                        f"{e.symbol}, grid patches) holds sequences of at most "
                                        f"{e.max_len} tokens")
        if (-(-mlen // e.block_m) + 1) * geo.heads_q * batch > 2**31 - 1:
            raise ParamError("q", "(ceil(max_len / block_m) + 1) * heads * batch must be below "
                                  "2^31 (the kernels number query tiles in int32)")
        grid = grid_dims(e.grid, env)
        check_grid(grid, e.symbol)
        uploads.upload(sh)
        try:
            for fname, off in pending:
                values[fname] = uploads.base + off
            if isinstance(seq_ptr, tuple):
                values["cu_seqlens"] = uploads.base + seq_ptr[1]
            else:
                values["cu_seqlens"] = seq_ptr
            desc = self.manifest.layout.pack(values)
            buf = ctypes.create_string_buffer(desc, len(desc))
            maps: Any = None
            maps_at = 0
            if e.tensor_maps:
                views = {t: MapTensor(a.ptr, h, s[t].tok, s[t].head, t) for t, a, h in (
                    ("q", qi, geo.heads_q), ("k", ki, geo.heads_kv), ("v", vi, geo.heads_kv))}
                maps, maps_at = tensor_maps_block(e.tensor_maps, geo.dtype, geo.head_dim,
                                                  geo.tokens, views, e.box_rows)
                argv = (ctypes.c_void_p * 2)(ctypes.addressof(buf), maps_at)
            else:
                argv = (ctypes.c_void_p * 1)(ctypes.addressof(buf))
            _driver.call(f"cuLaunchKernel({e.symbol})", cu.cuLaunchKernel(
                kern.function, grid[0], grid[1], grid[2], e.block[0], e.block[1], e.block[2],
                e.dynamic_smem, _driver.stream(sh), ctypes.addressof(argv), 0))
        finally:
            uploads.free(sh)
        if plan is None or pending or isinstance(seq_ptr, tuple):
            return None
        return _Launch(weakref.ref(plan), dk.device, kern.function,
                       (grid[0], grid[1], grid[2]), (e.block[0], e.block[1], e.block[2]),
                       e.dynamic_smem, sh, desc, self.manifest.layout.field("o").offset,
                       self.manifest.layout.field("lse").offset, maps, maps_at, e.symbol)


def _wants_grad(q: Any, k: Any, v: Any) -> bool:
    """torch tensors that need gradients, with grad mode on (never true without torch)."""
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(q, torch.Tensor) or not torch.is_grad_enabled():
        return False
    return any(isinstance(x, torch.Tensor) and x.requires_grad for x in (q, k, v))


def load(path: str | Path, *, device: int | None = None) -> Attention:
    """Load an artifact folder (out/NAME, or its manifest.json) for a CUDA device.

    Checks the manifest, every cubin's sha256 and the launch fields (against the cubins,
    the header and the rules that derive them: launch_check.py, what `cmc inspect` checks)
    before touching the GPU, then loads the kernels for `device` (default: the current
    context's device, else 0) so a missing or unfit GPU is reported here rather than at the
    first call.
    """
    m = read_manifest(path)
    cubins = verify_cubins(m)
    verify_launch(m, cubins)
    attn = Attention(m, cubins)
    attn._kernels(attn._device(device))
    return attn


__all__ = ["Attention", "KernelEntry", "Manifest", "batch_cu_seqlens", "load", "read_manifest",
           "verify_cubins"]
