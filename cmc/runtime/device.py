"""Device resources of a loaded artifact: modules and functions per device, work counters, the
packed-layout cu_seqlens of the batch layout, staged parameter uploads and TMA tensor maps.

Each is owned per device (or per stream) and outlives single launches; Attention (loader.py)
asks for them and packs the launch.
"""

from __future__ import annotations

import ctypes
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from cuda.bindings import driver as cu

from ..abi import F32_MAP_TENSORS, TENSOR_MAP_ALIGN, TENSOR_MAP_BYTES, map_box
from ..errors import ArtifactError, ParamError
from . import _driver
from .arrays import _Allocation
from .manifest import KernelEntry, Manifest
from .params import select_arch


class _Counters:
    """The sm90 kernels' work counters (cmc/abi.py, desc.sched) of one device: 8 zeroed bytes
    per stream, from chunks allocated outside any graph capture. The kernel leaves its
    counter zero, so launches in stream order share one; a stream first seen during capture
    when the chunk is used up gets 0 (the static schedule) rather than an allocation."""

    CHUNK = 256

    def __init__(self, device: int):
        self.device = device
        self.lock = threading.Lock()
        self.by_stream: dict[int, int] = {}
        self.chunks: list[_Allocation] = []
        self.free: list[int] = []

    def _grow(self) -> None:
        a = _Allocation(8 * self.CHUNK, self.device)
        zeros = np.zeros(2 * self.CHUNK, dtype=np.uint32)
        with _driver.on_device(self.device):
            _driver.htod(a.ptr, zeros.ctypes.data, zeros.nbytes)
        self.chunks.append(a)
        self.free.extend(a.ptr + 8 * i for i in range(self.CHUNK - 1, -1, -1))

    def for_stream(self, stream: int) -> int:
        with self.lock:
            c = self.by_stream.get(stream)
            if c is None:
                if not self.free:
                    if _driver.is_capturing(stream):
                        return 0
                    self._grow()
                c = self.by_stream[stream] = self.free.pop()
            return c



@dataclass
class _Kernel:
    entry: KernelEntry
    module: Any
    function: Any


class _DeviceKernels:
    """The kernels of one arch, loaded into one device's primary context."""

    def __init__(self, m: Manifest, cubins: Mapping[str, bytes], device: int):
        self.device = device
        with _driver.on_device(device):
            cc = _driver.compute_capability(device)
            self.arch = select_arch(cc, [k.arch for k in m.kernels])
            smem_max = _driver.max_optin_smem(device)
            self.num_sms = _driver.sm_count(device)
            self.counters = _Counters(device)
            if any(k.work_counter for k in m.kernels if k.arch == self.arch):
                self.counters.for_stream(0)  # the first chunk, outside any capture
            self.kernels: dict[tuple[str, int], _Kernel] = {}  # the forward
            # (dtype, head_dim) -> role -> kernel; manifest.py checked every role is there
            self.backward: dict[tuple[str, int], dict[str, _Kernel]] = {}
            # the kernels for short sequences (below_len): (dtype, head_dim) -> role -> kernel
            self.short: dict[tuple[str, int], dict[str, _Kernel]] = {}
            for k in m.kernels:
                if k.arch != self.arch:
                    continue
                if k.dynamic_smem > smem_max:
                    raise ArtifactError(f"{k.file}: needs {k.dynamic_smem} bytes of shared "
                                        f"memory, the device allows {smem_max}")
                module = _driver.call(f"cuModuleLoadData({k.file})",
                                      cu.cuModuleLoadData(cubins[k.file]), ArtifactError)
                func = _driver.call(f"cuModuleGetFunction({k.symbol})",
                                    cu.cuModuleGetFunction(module, k.symbol.encode()),
                                    ArtifactError)
                attr = cu.CUfunction_attribute
                _driver.call("cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)",
                             cu.cuFuncSetAttribute(
                                 func, attr.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                 k.dynamic_smem), ArtifactError)
                # no driver query of MAX_THREADS_PER_BLOCK: load() checked the block against
                # the cubin's recorded launch bounds (launch_check.verify_launch), which set it
                if k.below_len:
                    self.short.setdefault((k.dtype, k.head_dim), {})[k.role] = \
                        _Kernel(k, module, func)
                elif k.pass_ == "backward":
                    self.backward.setdefault((k.dtype, k.head_dim), {})[k.role] = \
                        _Kernel(k, module, func)
                else:
                    self.kernels[(k.dtype, k.head_dim)] = _Kernel(k, module, func)

    def forward(self, dtype: str, head_dim: int, max_len: int) -> _Kernel:
        """The forward kernel for sequences up to max_len: the one for short sequences where
        max_len is below its bound, else the one for every length."""
        short = self.short.get((dtype, head_dim), {}).get("fwd")
        if short is not None and max_len < short.entry.below_len:
            return short
        return self.kernels[(dtype, head_dim)]

    def backward_roles(self, dtype: str, head_dim: int, max_len: int) -> dict[str, _Kernel]:
        """The backward kernel of each role for sequences up to max_len (as forward())."""
        roles = dict(self.backward[(dtype, head_dim)])
        for role, k in self.short.get((dtype, head_dim), {}).items():
            if role in roles and max_len < k.entry.below_len:
                roles[role] = k
        return roles


# --------------------------------------------------------------------------- cu_seqlens cache

_seqlens_lock = threading.Lock()
# (device, B, L) -> device int32 [0, L, 2L, ...]. Never freed: CUDA graphs captured with one
# keep pointing at it, and each is only 4 * (B + 1) bytes.
_seqlens: dict[tuple[int, int, int], _Allocation] = {}


def batch_cu_seqlens(batch: int, seq_len: int) -> np.ndarray:
    """The packed view of the batch layout (cmc/abi.py): cu_seqlens = [0, L, 2L, ..., BL]."""
    return (np.arange(batch + 1, dtype=np.int64) * seq_len).astype(np.int32)


def _cached_seqlens(device: int, batch: int, seq_len: int, capturing: bool) -> int:
    key = (device, batch, seq_len)
    with _seqlens_lock:
        a = _seqlens.get(key)
        if a is None:
            if capturing:
                raise ParamError("q", f"first call with batch {batch} and length {seq_len} "
                                      "happened during CUDA graph capture; call once before "
                                      "capturing (warm-up) so cu_seqlens is on the device")
            host = batch_cu_seqlens(batch, seq_len)
            a = _Allocation(host.nbytes, device)
            with _driver.on_device(device):
                _driver.htod(a.ptr, host.ctypes.data, host.nbytes)
            _seqlens[key] = a
        return a.ptr


# --------------------------------------------------------------------------- uploads


class _Staging:
    """Pinned host slots for the per-launch parameter upload, one ring per device.

    cuMemcpyHtoDAsync from pageable memory synchronises the stream before copying (CUDA's
    API sync rules), which would make every launch with host parameters wait for the GPU
    to drain. A slot is reused once the copy recorded on its event is done; with SLOTS in
    the ring that wait only happens when the GPU is that many launches behind.
    """

    SLOTS = 8

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.slots: list[list[Any]] = []  # [pointer, size, event or None]
        self.next = 0

    def copy(self, dst: int, host: np.ndarray, stream: int) -> None:
        with self.lock:
            if len(self.slots) < self.SLOTS:
                self.slots.append([0, 0, None])
            slot = self.slots[self.next]
            self.next = (self.next + 1) % self.SLOTS
            if slot[2] is not None:
                _driver.event_synchronize(slot[2])
            else:
                slot[2] = _driver.event_create()
            if slot[1] < host.nbytes:
                if slot[0]:
                    _driver.pinned_free(slot[0])
                slot[0], slot[1] = 0, 0
                size = max(4096, 1 << (host.nbytes - 1).bit_length())
                slot[0], slot[1] = _driver.pinned_alloc(size), size
            ctypes.memmove(slot[0], host.ctypes.data, host.nbytes)
            _driver.htod_async(dst, slot[0], host.nbytes, stream)
            _driver.event_record(slot[2], stream)


_staging: dict[int, _Staging] = {}
_staging_lock = threading.Lock()


def _staging_for(device: int) -> _Staging:
    with _staging_lock:
        st = _staging.get(device)
        if st is None:
            st = _staging[device] = _Staging()
        return st


class _Uploads:
    """Host int32 arrays gathered into one stream-ordered device buffer per launch."""

    ALIGN = 16

    def __init__(self, device: int) -> None:
        self.device = device
        self.items: list[tuple[int, np.ndarray]] = []
        self.size = 0
        self.base = 0

    def add(self, a: np.ndarray) -> int:
        """Reserve room for a; returns its offset (the pointer is base + offset)."""
        off = self.size
        self.items.append((off, np.ascontiguousarray(a, dtype=np.int32)))
        self.size += max(a.nbytes, 4) + (-max(a.nbytes, 4)) % self.ALIGN
        return off

    def upload(self, stream: int) -> None:
        if not self.items:
            return
        host = np.zeros(self.size, dtype=np.uint8)
        for off, a in self.items:
            host[off:off + a.nbytes] = a.view(np.uint8)
        self.base = _driver.mem_alloc_async(self.size, stream)
        _staging_for(self.device).copy(self.base, host, stream)

    def free(self, stream: int) -> None:
        if self.base:
            _driver.mem_free_async(self.base, stream)
            self.base = 0


def refuse_host_values_in_capture(packed_params: Sequence[Any], uploads: _Uploads) -> None:
    """During CUDA graph capture nothing can be uploaded: a ParamError naming the first
    parameter that holds a host array (packed_params: params.PackedParam), else cu_seqlens
    (the only other upload), where there is anything to upload. The forward and the backward
    raise the same error."""
    for p in packed_params:
        if any(isinstance(a, np.ndarray) for a in p.arrays):
            name = p.name
            break
    else:
        if not uploads.items:
            return
        name = "cu_seqlens"
    raise ParamError(name, "host values cannot be uploaded during CUDA graph capture; pass "
                           "device int32 arrays (and cu_seqlens on the device), or a plan")


# --------------------------------------------------------------------------- tensor maps

_tmap_lock = threading.Lock()
_TMAP_CACHE_SIZE = 256
# (dtype, pointer, dims, byte strides) -> the encoded map. A map only records an address and
# a shape, never owns memory, so a cached one is exactly what encoding again would give.
_tmaps: OrderedDict[tuple[Any, ...], bytes] = OrderedDict()


def _tensor_map(name: str, dtype: str, ptr: int, dims: tuple[int, int, int],
                byte_strides: tuple[int, int], box: tuple[int, int, int]) -> bytes:
    key = (dtype, ptr, dims, byte_strides, box)
    with _tmap_lock:
        m = _tmaps.get(key)
        if m is not None:
            _tmaps.move_to_end(key)
            return m
    try:
        m = _driver.tensor_map_3d(dtype, ptr, dims, byte_strides, box)
    except _driver.DriverError as e:
        raise ParamError(name, f"cannot be described by a TMA tensor map ({e.result}): the "
                               "sm90 kernel needs head and token strides that are nonzero "
                               "multiples of 16 bytes below 2^40") from None
    with _tmap_lock:
        _tmaps[key] = m
        if len(_tmaps) > _TMAP_CACHE_SIZE:
            _tmaps.popitem(last=False)
    return m


@dataclass(frozen=True)
class MapTensor:
    """What a tensor map needs of one tensor in its packed [T, H, D] view (elements), and the
    call's parameter it came from (named when the map is refused)."""

    ptr: int
    heads: int
    stride_tok: int
    stride_head: int
    param: str


def tensor_maps_block(tensors: Sequence[str], dtype: str, head_dim: int, tokens: int,
                      views: Mapping[str, MapTensor], box_rows: Sequence[int] = ()
                      ) -> tuple[ctypes.Array[ctypes.c_char], int]:
    """The kernel's maps parameter (cmc/abi.py): one map per tensor, boxes of its own
    box_rows tokens (128 where none is given; an fp32 tensor's, dq_accum, of F32_MAP_COLS), in
    a host buffer (kept alive by the caller until the launch returns: the driver copies it
    then) and its 64-byte-aligned address."""
    if tokens > 2**31 - 1:
        raise ParamError("q", f"{tokens} tokens: the sm90 kernel addresses tokens with int32 "
                              "TMA coordinates (at most 2^31 - 1)")
    maps = []
    rows = tuple(box_rows) or (128,) * len(tensors)
    for t, r in zip(tensors, rows, strict=True):
        m = views[t]
        f32 = t in F32_MAP_TENSORS
        elem = 4 if f32 else 2
        # size-1 dimensions may carry any stride (never used): give TMA a valid one
        head = m.stride_head if m.heads > 1 else head_dim
        tok = m.stride_tok if tokens > 1 else m.heads * head
        maps.append(_tensor_map(m.param, "f32" if f32 else dtype, m.ptr,
                                (head_dim, m.heads, tokens), (head * elem, tok * elem),
                                map_box(t, r)))
    buf = ctypes.create_string_buffer(TENSOR_MAP_BYTES * len(maps) + TENSOR_MAP_ALIGN)
    at = ctypes.addressof(buf) + (-ctypes.addressof(buf) % TENSOR_MAP_ALIGN)
    data = b"".join(maps)
    ctypes.memmove(at, data, len(data))
    return buf, at
