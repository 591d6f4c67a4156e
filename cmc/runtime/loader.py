"""Load a compiled artifact and launch its kernels: `load(path) -> Attention`.

The manifest is the whole contract (docs/architecture.md): the runtime never imports the
compiler. Loading verifies every cubin's sha256, picks the cubin for the device's compute
capability, loads it into the device's primary context (the one PyTorch and CuPy use, so
pointers from either are valid) and sets the dynamic shared memory it needs. A call packs
the descriptor at the manifest's byte offsets and launches on the caller's current stream.
"""

from __future__ import annotations

import ctypes
import hashlib
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

from ..abi import (
    CTYPES,
    HEADER_FIELDS,
    TENSOR_MAP_ALIGN,
    TENSOR_MAP_BOX_ROWS,
    TENSOR_MAP_BYTES,
    TENSOR_MAP_SWIZZLE,
    DescriptorLayout,
    Field,
)
from ..artifacts import SCHEMA_VERSION
from ..errors import ArtifactError, ParamError
from ..manifest_check import read_manifest_json
from . import _driver
from .arrays import (
    ArrayInfo,
    DeviceArray,
    _Allocation,
    current_stream_of,
    describe,
    host_or_device_ints,
    library_of,
    stream_handle,
)
from .params import (
    Geometry,
    PackedParam,
    check_cu_seqlens,
    check_int32_device,
    check_params,
    check_tensors,
    grid_dims,
    kernel_strides,
    parse_grid_expr,
    resolve_max_len,
    scale_log2,
    select_arch,
)

RESERVED = ("q", "k", "v", "scale", "return_lse", "out", "cu_seqlens", "max_len", "stream")
DEFAULT_GRID = ("ceil(max_len / block_m)", "heads_q", "batch")
# Persistent launches (one CTA per SM) pay off when the CTAs take their units from the work
# counter (desc.sched). With a static stride (artifacts without the field, or no counter)
# they pay off only for short sequences of equal length: measured on H200
# (docs/kernel-notes.md, 2026-12-02) +6-21 % at L <= 4K, but -5-10 % for jagged batches and
# up to -11 % at 32K (uneven unit costs), where one CTA per unit lets the hardware balance.
PERSISTENT_MAX_LEN = 4096


def persistent_ctas(num_sms: int, packed: bool, max_len: int, dynamic: bool = False) -> int:
    """max_ctas of the grid rule: the SM count with a work counter, or for an equal-length
    batch (batch layout) of sequences up to PERSISTENT_MAX_LEN; otherwise unbounded (one
    CTA per work unit)."""
    if dynamic or (not packed and max_len <= PERSISTENT_MAX_LEN):
        return num_sms
    return 2**31 - 1


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
_ROLES = {"scalar": (("value", "int32_t"),), "batch": (("per_sequence", "uint64_t"),),
          "segments": (("segment_offsets", "uint64_t"), ("segment_starts", "uint64_t"))}


# --------------------------------------------------------------------------- manifest


@dataclass(frozen=True)
class KernelEntry:
    """One kernel of the manifest: one (dtype, head_dim) variant built for one arch."""

    symbol: str
    arch: str
    file: str
    sha256: str
    dtype: str
    head_dim: int
    block_m: int
    block_n: int
    threads: int
    block: tuple[int, int, int]
    grid: tuple[Callable[[Mapping[str, int]], int], ...]
    dynamic_smem: int
    tensor_maps: tuple[str, ...] = ()  # tensors whose CUtensorMaps follow the descriptor
    box_rows: int = 128  # tokens per tensor-map box
    max_len: int | None = None  # longest sequence the kernel takes (patch tilings)
    work_counter: bool = False  # takes its work units from desc.sched (sm90)


@dataclass(frozen=True)
class Manifest:
    path: Path  # the artifact folder
    name: str
    raw: Mapping[str, Any]
    params: tuple[tuple[str, str], ...]  # (name, kind) in declaration order
    layout: DescriptorLayout
    kernels: tuple[KernelEntry, ...]

    def param_fields(self) -> dict[str, dict[str, Field]]:
        out: dict[str, dict[str, Field]] = {}
        for f in self.layout.fields:
            if f.param is not None:
                out.setdefault(f.param, {})[f.role] = f
        return out


def _need(d: Mapping[str, Any], key: str, where: str, typ: type | tuple[type, ...]) -> Any:
    if not isinstance(d, Mapping):
        raise ArtifactError(f"manifest: {where} is a {type(d).__name__}, not an object")
    if key not in d:
        raise ArtifactError(f"manifest: {where} has no {key!r}")
    v = d[key]
    if not isinstance(v, typ) or (typ is int and isinstance(v, bool)):
        raise ArtifactError(f"manifest: {where}.{key} has the wrong type ({type(v).__name__})")
    return v


def _read_layout(raw: Mapping[str, Any], params: Sequence[tuple[str, str]]) -> DescriptorLayout:
    d = _need(raw, "descriptor", "manifest", dict)
    fields = []
    for i, f in enumerate(_need(d, "fields", "descriptor", list)):
        where = f"descriptor.fields[{i}]"
        ctype = _need(f, "ctype", where, str)
        if ctype not in CTYPES:
            raise ArtifactError(f"manifest: {where} has unknown C type {ctype!r}")
        size = _need(f, "size", where, int)
        off = _need(f, "offset", where, int)
        if size != CTYPES[ctype][0] or off < 0 or off % size:
            raise ArtifactError(f"manifest: {where} has a bad size/offset ({size}/{off})")
        fields.append(Field(_need(f, "name", where, str), ctype, off, size,
                            f.get("param"), str(f.get("role") or "")))
    size = _need(d, "size", "descriptor", int)
    layout = DescriptorLayout(_need(d, "struct", "descriptor", str), tuple(fields), size,
                              _need(d, "align", "descriptor", int))
    spans = sorted((f.offset, f.offset + f.size, f.name) for f in fields)
    for (_, a1, an), (b0, _, bn) in zip(spans, spans[1:], strict=False):
        if b0 < a1:
            raise ArtifactError(f"manifest: descriptor fields {an} and {bn} overlap")
    if spans and spans[-1][1] > size:
        raise ArtifactError(f"manifest: descriptor field {spans[-1][2]} runs past its size {size}")
    names = {f.name: f for f in fields}
    for name, ctype, _ in HEADER_FIELDS:
        if name not in names or names[name].ctype != ctype:
            raise ArtifactError(f"manifest: descriptor lacks header field {ctype} {name} "
                                "(built by an incompatible cmc?)")
    by_param: dict[str, dict[str, Field]] = {}
    for f in fields:
        if f.param is not None:
            by_param.setdefault(f.param, {})[f.role] = f
    for pname, kind in params:
        for role, ctype in _ROLES[kind]:
            got = by_param.get(pname, {}).get(role)
            if got is None or got.ctype != ctype:
                raise ArtifactError(f"manifest: parameter {pname} ({kind}) has no {ctype} "
                                    f"descriptor field with role {role!r}")
    return layout


def _read_kernel(k: Mapping[str, Any], i: int) -> KernelEntry:
    where = f"kernels[{i}]"
    file = _need(k, "file", where, str)
    if "/" in file or "\\" in file or file in ("", ".", ".."):
        raise ArtifactError(f"manifest: {where}.file must be a file name in the artifact "
                            f"folder, not {file!r}")
    threads = _need(k, "threads", where, int)
    block = k.get("block", [threads, 1, 1])
    if not (isinstance(block, list) and len(block) == 3 and all(isinstance(b, int) for b in block)):
        raise ArtifactError(f"manifest: {where}.block must be [x, y, z] ints")
    grid_raw = k.get("grid", list(DEFAULT_GRID))
    if not (isinstance(grid_raw, list) and len(grid_raw) == 3):
        raise ArtifactError(f"manifest: {where}.grid must be 3 expressions")
    dtype = _need(k, "dtype", where, str)
    if dtype not in ("bf16", "fp16"):
        raise ArtifactError(f"manifest: {where}.dtype {dtype!r} is not bf16 or fp16")
    maps = k.get("tensor_maps", [])
    if not isinstance(maps, list):
        raise ArtifactError(f"manifest: {where}.tensor_maps must be a list")
    boxes = {r: [64, 1, r] for r in TENSOR_MAP_BOX_ROWS}
    rows = {t.get("box", [0, 0, 0])[2] if isinstance(t, dict) and isinstance(t.get("box"), list)
            and len(t["box"]) == 3 else 0 for t in maps}
    for t in maps:
        if not (isinstance(t, dict) and t.get("tensor") in ("q", "k", "v")
                and t.get("box") in boxes.values() and t.get("swizzle") == TENSOR_MAP_SWIZZLE
                and len(rows) == 1):
            raise ArtifactError(f"manifest: {where}.tensor_maps entry {t!r}: this runtime encodes "
                                f"maps of q, k, v with one box [64, 1, R] (R in "
                                f"{list(TENSOR_MAP_BOX_ROWS)}) and swizzle {TENSOR_MAP_SWIZZLE} "
                                "only (cmc/abi.py)")
    max_len = k.get("max_len")
    if max_len is not None and not (isinstance(max_len, int) and max_len > 0):
        raise ArtifactError(f"manifest: {where}.max_len must be null or a positive int")
    work_counter = k.get("work_counter", False)
    if not isinstance(work_counter, bool):
        raise ArtifactError(f"manifest: {where}.work_counter must be true or false")
    return KernelEntry(
        symbol=_need(k, "symbol", where, str), arch=_need(k, "arch", where, str), file=file,
        sha256=_need(k, "sha256", where, str).lower(), dtype=dtype,
        head_dim=_need(k, "head_dim", where, int), block_m=_need(k, "block_m", where, int),
        block_n=int(k.get("block_n", 0)), threads=threads,
        block=(int(block[0]), int(block[1]), int(block[2])),
        grid=tuple(parse_grid_expr(g) for g in grid_raw),
        dynamic_smem=_need(k, "dynamic_smem", where, int),
        tensor_maps=tuple(t["tensor"] for t in maps),
        box_rows=rows.pop() if maps else 128, max_len=max_len, work_counter=work_counter)


def read_manifest(path: str | Path) -> Manifest:
    """Parse and check manifest.json (path: the artifact folder or the manifest itself)."""
    p = Path(path)
    mpath = p if p.is_file() else p / "manifest.json"
    try:
        raw = read_manifest_json(mpath.read_bytes(), str(mpath))
    except FileNotFoundError:
        raise ArtifactError(f"{mpath}: no manifest.json (compile the mask first: "
                            "cmc compile x.mask -o out/)") from None
    except OSError as e:
        raise ArtifactError(f"{mpath}: cannot read the manifest: {e}") from e
    version = raw.get("schema_version")
    if version != SCHEMA_VERSION:
        raise ArtifactError(f"{mpath}: schema_version {version!r:.40}, this runtime reads "
                            f"{SCHEMA_VERSION}; recompile with this cmc")
    params = []
    for i, pr in enumerate(_need(raw, "params", "manifest", list)):
        kind = _need(pr, "kind", f"params[{i}]", str)
        if kind not in _ROLES:
            raise ArtifactError(f"manifest: params[{i}] has unknown kind {kind!r}")
        params.append((_need(pr, "name", f"params[{i}]", str), kind))
    for pname, _ in params:
        if pname in RESERVED:
            raise ArtifactError(f"mask parameter {pname!r} collides with a keyword of "
                                "Attention.__call__; rename it in the .mask file")
    kernels = tuple(_read_kernel(k, i) for i, k in enumerate(_need(raw, "kernels", "manifest",
                                                                   list)))
    if not kernels:
        raise ArtifactError(f"{mpath}: the manifest lists no kernels")
    mask_info = raw.get("mask")
    mask: dict[str, Any] = mask_info if isinstance(mask_info, dict) else {}
    name = str(mask.get("name") or mpath.parent.name)
    return Manifest(mpath.parent, name, raw, tuple(params), _read_layout(raw, params), kernels)


def verify_cubins(m: Manifest) -> dict[str, bytes]:
    """Read every cubin the manifest lists and check its sha256: file name -> bytes."""
    out: dict[str, bytes] = {}
    for k in m.kernels:
        if k.file in out:
            continue
        path = m.path / k.file
        try:
            data = path.read_bytes()
        except OSError as e:
            raise ArtifactError(f"{k.file}: cannot read the cubin ({e.strerror or e})") from e
        digest = hashlib.sha256(data).hexdigest()
        if digest != k.sha256:
            raise ArtifactError(f"{k.file}: sha256 mismatch (manifest {k.sha256[:16]}..., file "
                                f"{digest[:16]}...): the artifact is corrupt or stale; recompile")
        out[k.file] = data
    return out


# --------------------------------------------------------------------------- per device


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
            self.kernels: dict[tuple[str, int], _Kernel] = {}
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
                max_threads = _driver.call(
                    "cuFuncGetAttribute(MAX_THREADS_PER_BLOCK)",
                    cu.cuFuncGetAttribute(attr.CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, func),
                    ArtifactError)
                threads = k.block[0] * k.block[1] * k.block[2]
                if threads > int(max_threads):
                    raise ArtifactError(f"{k.file}: block of {threads} threads, the kernel "
                                        f"allows {int(max_threads)}")
                self.kernels[(k.dtype, k.head_dim)] = _Kernel(k, module, func)


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


# --------------------------------------------------------------------------- tensor maps

_tmap_lock = threading.Lock()
_TMAP_CACHE_SIZE = 256
# (dtype, pointer, dims, byte strides) -> the encoded map. A map only records an address and
# a shape, never owns memory, so a cached one is exactly what encoding again would give.
_tmaps: OrderedDict[tuple[Any, ...], bytes] = OrderedDict()


def _tensor_map(name: str, dtype: str, ptr: int, dims: tuple[int, int, int],
                byte_strides: tuple[int, int], box_rows: int) -> bytes:
    key = (dtype, ptr, dims, byte_strides, box_rows)
    with _tmap_lock:
        m = _tmaps.get(key)
        if m is not None:
            _tmaps.move_to_end(key)
            return m
    try:
        m = _driver.tensor_map_3d(dtype, ptr, dims, byte_strides, (64, 1, box_rows))
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
    """What a tensor map needs of one tensor in its packed [T, H, D] view (elements)."""

    ptr: int
    heads: int
    stride_tok: int
    stride_head: int


def tensor_maps_block(tensors: Sequence[str], dtype: str, head_dim: int, tokens: int,
                      views: Mapping[str, MapTensor],
                      box_rows: int = 128) -> tuple[ctypes.Array[ctypes.c_char], int]:
    """The kernel's second parameter (cmc/abi.py): one map per tensor, in a host buffer
    (kept alive by the caller until the launch returns: the driver copies it then) and its
    64-byte-aligned address."""
    if tokens > 2**31 - 1:
        raise ParamError("q", f"{tokens} tokens: the sm90 kernel addresses tokens with int32 "
                              "TMA coordinates (at most 2^31 - 1)")
    elem = 2
    maps = []
    for t in tensors:
        m = views[t]
        # size-1 dimensions may carry any stride (never used): give TMA a valid one
        head = m.stride_head if m.heads > 1 else head_dim
        tok = m.stride_tok if tokens > 1 else m.heads * head
        maps.append(_tensor_map(t, dtype, m.ptr, (head_dim, m.heads, tokens),
                                (head * elem, tok * elem), box_rows))
    buf = ctypes.create_string_buffer(TENSOR_MAP_BYTES * len(maps) + TENSOR_MAP_ALIGN)
    at = ctypes.addressof(buf) + (-ctypes.addressof(buf) % TENSOR_MAP_ALIGN)
    data = b"".join(maps)
    ctypes.memmove(at, data, len(data))
    return buf, at


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


_TORCH_OF = {"bf16": "bfloat16", "fp16": "float16", "f32": "float32"}


def _empty_like_q(q: Any, qi: ArrayInfo, lib: str) -> Any:
    """A C-contiguous array shaped like q, from q's own library (so it follows its streams)."""
    if lib == "torch":
        return _torch().empty_like(q, memory_format=_torch().contiguous_format)
    if lib == "cupy":
        with q.device:
            return _cupy().empty_like(q, order="C")
    assert qi.device is not None
    return DeviceArray(qi.shape, qi.dtype, qi.device)


def _empty_lse(q: Any, qi: ArrayInfo, lib: str, heads: int, tokens: int) -> Any:
    if lib == "torch":
        return _torch().empty((heads, tokens), dtype=_torch().float32, device=q.device)
    if lib == "cupy":
        with q.device:
            return _cupy().empty((heads, tokens), dtype=_cupy().float32)
    assert qi.device is not None
    return DeviceArray((heads, tokens), "f32", qi.device)


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
                                         lengths=lengths, device=dev, read=read, stream=sh)
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
        return Plan(dev, packed, nb, mlen, tokens, values, buf)

    # -- launch
    def __call__(self, q: Any, k: Any, v: Any, *, scale: float | None = None,
                 return_lse: bool = False, out: Any = None, cu_seqlens: Any = None,
                 max_len: int | None = None, stream: Any = None, plan: Plan | None = None,
                 **params: Any) -> Any:
        if plan is not None and (cu_seqlens is not None or max_len is not None or params):
            given = [n for n, x in (("cu_seqlens", cu_seqlens), ("max_len", max_len))
                     if x is not None] + sorted(params)
            raise ParamError("plan", f"carries cu_seqlens, max_len and the mask parameters; "
                                     f"do not pass {', '.join(given)} with it")
        lib = library_of(q)
        sh = stream_handle(stream) if stream is not None else current_stream_of(q)
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
                return self._replay(rec, plan, q, qi, lib, out, return_lse)
        assert qi.device is not None
        device = qi.device
        dk = self._kernels(device)
        with _driver.on_device(device):
            return self._launch(dk, lib, sh, q, qi, k, v, out, scale, return_lse,
                                cu_seqlens, max_len, params, plan)

    def _replay(self, rec: _Launch, plan: Plan, q: Any, qi: ArrayInfo, lib: str, out: Any,
                return_lse: bool) -> Any:
        desc = bytearray(rec.desc)
        if out is None:  # else the key holds out's pointer, and the descriptor has it
            out = _empty_like_q(q, qi, lib)
            struct.pack_into("<Q", desc, rec.o_offset, describe(out, "out", rec.stream).ptr)
        lse = _empty_lse(q, qi, lib, rec.heads_q, rec.tokens) if return_lse else None
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
                params: Mapping[str, Any], plan: Plan | None = None) -> Any:
        device = dk.device
        infos = [self._resolve(describe(x, n, sh), device) for n, x in (("k", k), ("v", v))]
        ki, vi = infos
        oi = None if out is None else self._resolve(describe(out, "out", sh), device)
        if plan is not None:
            return self._launch_planned(dk, lib, sh, q, qi, ki, vi, out, oi, scale,
                                        return_lse, plan)
        packed = qi.ndim == 3 or cu_seqlens is not None
        if cu_seqlens is not None and qi.ndim == 4:
            raise ParamError("cu_seqlens", "only for the packed layout q [T, Hq, D]; the batch "
                                           "layout [B, L, Hq, D] needs none")
        if qi.ndim == 3 and cu_seqlens is None:
            raise ParamError("cu_seqlens", "required for the packed layout q [T, Hq, D]")
        geo = check_tensors(qi, ki, vi, oi, packed=packed, variants=list(dk.kernels))
        for a in (qi, ki, vi, oi):  # CAI v3: order after the producer's stream
            if a is not None and a.cai_stream is not None and a.cai_stream != sh:
                _driver.stream_wait_stream(sh, a.cai_stream)
        capturing = _driver.is_capturing(sh)
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
                                     device=device, read=read, stream=sh)
        slog2 = scale_log2(scale, geo.head_dim)
        if capturing and (uploads.items or any(isinstance(a, np.ndarray)
                                               for p in packed_params for a in p.arrays)):
            raise ParamError(_host_param_name(packed_params, uploads),
                             "host values cannot be uploaded during CUDA graph capture; pass "
                             "device int32 arrays (and cu_seqlens on the device)")
        kern = dk.kernels[(geo.dtype, geo.head_dim)]
        if out is None:
            out = _empty_like_q(q, qi, lib)
            oi = describe(out, "out", sh)
            geo = replace(geo, strides={**geo.strides, "out": kernel_strides("out", oi, packed)})
        lse = _empty_lse(q, qi, lib, geo.heads_q, geo.tokens) if return_lse else None
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

    def _launch_planned(self, dk: _DeviceKernels, lib: str, sh: int, q: Any, qi: ArrayInfo,
                        ki: ArrayInfo, vi: ArrayInfo, out: Any, oi: ArrayInfo | None,
                        scale: Any, return_lse: bool, plan: Plan) -> Any:
        if plan.device != dk.device:
            raise ParamError("plan", f"made for device {plan.device}; the tensors are on "
                                     f"device {dk.device}")
        if plan.packed != (qi.ndim == 3):
            want = "packed [T, H, D]" if plan.packed else "batch [B, L, H, D]"
            raise ParamError("plan", f"made for the {want} layout; q has {qi.ndim} dimensions")
        geo = check_tensors(qi, ki, vi, oi, packed=plan.packed, variants=list(dk.kernels))
        for a in (qi, ki, vi, oi):
            if a is not None and a.cai_stream is not None and a.cai_stream != sh:
                _driver.stream_wait_stream(sh, a.cai_stream)
        if plan.packed and geo.tokens != plan.tokens:
            raise ParamError("plan", f"made for T = {plan.tokens} tokens (cu_seqlens[-1]); q "
                                     f"has {geo.tokens}")
        if not plan.packed and (geo.batch, geo.seq_len) != (plan.batch, plan.max_len):
            raise ParamError("plan", f"made for batch {plan.batch} x length {plan.max_len}; q "
                                     f"is {geo.batch} x {geo.seq_len}")
        slog2 = scale_log2(scale, geo.head_dim)
        kern = dk.kernels[(geo.dtype, geo.head_dim)]
        fresh_out = out is None
        if out is None:
            out = _empty_like_q(q, qi, lib)
            oi = describe(out, "out", sh)
            geo = replace(geo, strides={**geo.strides,
                                        "out": kernel_strides("out", oi, plan.packed)})
        assert oi is not None
        lse = _empty_lse(q, qi, lib, geo.heads_q, geo.tokens) if return_lse else None
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

    def _run(self, kern: _Kernel, dk: _DeviceKernels, packed: bool, sh: int, geo: Geometry,
             qi: ArrayInfo, ki: ArrayInfo, vi: ArrayInfo, oi: ArrayInfo, lse_ptr: int,
             seq_ptr: int | tuple[str, int],
             batch: int, mlen: int, slog2: float, packed_params: Sequence[PackedParam],
             uploads: _Uploads, fixed: Mapping[str, int] | None = None,
             plan: Plan | None = None) -> _Launch | None:
        """Launch; with a plan, also the record that replays it (_Launch)."""
        pending: list[tuple[str, int]] = []  # (field name, upload offset)
        values: dict[str, int | float] = dict(fixed or {})
        for fname, arr in self._param_slots(packed_params):
            if isinstance(arr, int):
                values[fname] = arr
            elif isinstance(arr, ArrayInfo):
                values[fname] = arr.ptr
            else:
                pending.append((fname, uploads.add(arr)))
        s = geo.strides
        values.update({
            "q": qi.ptr, "k": ki.ptr, "v": vi.ptr, "o": oi.ptr, "lse": lse_ptr,
            "q_stride_tok": s["q"].tok, "q_stride_head": s["q"].head,
            "k_stride_tok": s["k"].tok, "k_stride_head": s["k"].head,
            "v_stride_tok": s["v"].tok, "v_stride_head": s["v"].head,
            "o_stride_tok": s["out"].tok, "o_stride_head": s["out"].head,
            "lse_stride_head": geo.tokens, "batch": batch, "heads_q": geo.heads_q,
            "heads_kv": geo.heads_kv, "max_len": mlen, "scale_log2": slog2,
        })
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
        if not (0 < grid[0] <= 2**31 - 1 and 0 < grid[1] <= 65535 and 0 < grid[2] <= 65535):
            raise ParamError("q", f"launch grid {grid} is outside the device limits")
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
                views = {t: MapTensor(a.ptr, h, s[t].tok, s[t].head) for t, a, h in (
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


def _host_param_name(packed_params: Sequence[PackedParam], uploads: _Uploads) -> str:
    for p in packed_params:
        if any(isinstance(a, np.ndarray) for a in p.arrays):
            return p.name
    return "cu_seqlens"


def load(path: str | Path, *, device: int | None = None) -> Attention:
    """Load an artifact folder (out/NAME, or its manifest.json) for a CUDA device.

    Checks the manifest and every cubin's sha256 before touching the GPU, then loads the
    kernels for `device` (default: the current context's device, else 0) so a missing or
    unfit GPU is reported here rather than at the first call.
    """
    m = read_manifest(path)
    cubins = verify_cubins(m)
    attn = Attention(m, cubins)
    attn._kernels(attn._device(device))
    return attn


__all__ = ["Attention", "KernelEntry", "Manifest", "batch_cu_seqlens", "load", "read_manifest",
           "verify_cubins"]
