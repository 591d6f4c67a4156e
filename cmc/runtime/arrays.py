"""Array adapters: (pointer, shape, element strides, dtype, device) from any GPU array.

The runtime accepts PyTorch tensors, CuPy arrays, and anything speaking DLPack
(`__dlpack__`/`__dlpack_device__`) or `__cuda_array_interface__` (CAI v2/v3). It never
imports torch or cupy itself: it only recognises their types when the caller already has
them in `sys.modules`, so `import cmc.runtime` stays light and works without either.

Protocol order: torch and cupy natively (fast, and both know bfloat16), then DLPack (which
can express bfloat16), then CAI (which cannot: its typestr has no bfloat16, so a CAI-only
bf16 array is reported as an unknown dtype). `DeviceArray` is the runtime's own owning
allocation for callers without an array library.
"""

from __future__ import annotations

import contextlib
import ctypes
import sys
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import ParamError

ITEMSIZE = {"bf16": 2, "fp16": 2, "f32": 4, "f64": 8, "i8": 1, "i16": 2, "i32": 4, "i64": 8,
            "u8": 1, "u16": 2, "u32": 4, "u64": 8, "bool": 1}

_TORCH_DTYPES = {
    "torch.bfloat16": "bf16", "torch.float16": "fp16", "torch.float32": "f32",
    "torch.float64": "f64", "torch.int32": "i32", "torch.int64": "i64", "torch.int16": "i16",
    "torch.int8": "i8", "torch.uint8": "u8", "torch.bool": "bool",
}
_NUMPY_NAMES = {
    "bfloat16": "bf16", "float16": "fp16", "float32": "f32", "float64": "f64", "int32": "i32",
    "int64": "i64", "int16": "i16", "int8": "i8", "uint8": "u8", "uint16": "u16",
    "uint32": "u32", "uint64": "u64", "bool": "bool",
}
_CAI_TYPESTRS = {
    "<f2": "fp16", "<f4": "f32", "<f8": "f64", "<i4": "i32", "<i8": "i64", "<i2": "i16",
    "|i1": "i8", "|u1": "u8", "<u2": "u16", "<u4": "u32", "<u8": "u64", "|b1": "bool",
}
_TYPESTR_OF = {v: k for k, v in _CAI_TYPESTRS.items()}

KDL_CPU, KDL_CUDA, KDL_CUDA_HOST, KDL_CUDA_MANAGED = 1, 2, 3, 13


@dataclass(frozen=True)
class ArrayInfo:
    """What a kernel launch needs to know about one array; `obj` keeps the owner alive."""

    ptr: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]  # in elements, not bytes
    dtype: str  # "bf16" | "fp16" | "f32" | "i32" | ... | "other:<name>"
    device: int | None  # CUDA ordinal; None = not known yet (CAI: resolved from the pointer)
    lib: str  # "torch" | "cupy" | "raw" | "dlpack" | "cai"
    obj: Any = field(default=None, compare=False, repr=False)
    keep: Any = field(default=None, compare=False, repr=False)  # e.g. the DLPack capsule
    readonly: bool = False
    cai_stream: int | None = None  # CAI v3: producer stream the consumer must wait on

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) if self.shape else 1

    @property
    def itemsize(self) -> int:
        return ITEMSIZE.get(self.dtype, 0)

    def is_contiguous(self) -> bool:
        """C-contiguous, ignoring strides of size-1 dimensions."""
        expect = 1
        for n, s in zip(reversed(self.shape), reversed(self.strides), strict=True):
            if n != 1 and s != expect:
                return False
            expect *= n
        return True


# --------------------------------------------------------------------------- recognition


def _torch_tensor(x: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def _cupy_array(x: Any) -> bool:
    cupy = sys.modules.get("cupy")
    return cupy is not None and isinstance(x, cupy.ndarray)


def is_device_array(x: Any) -> bool:
    """True for anything that claims to live in CUDA device memory (not host arrays)."""
    if isinstance(x, DeviceArray):
        return True
    if _torch_tensor(x):
        return bool(x.device.type == "cuda")
    if _cupy_array(x):
        return True
    if hasattr(x, "__dlpack_device__") and not isinstance(x, np.ndarray):
        try:
            dev_type = int(x.__dlpack_device__()[0])
        except Exception:
            return False
        return dev_type in (KDL_CUDA, KDL_CUDA_MANAGED)
    try:
        return hasattr(x, "__cuda_array_interface__")
    except Exception:
        return False


def library_of(x: Any) -> str:
    if _torch_tensor(x):
        return "torch"
    if _cupy_array(x):
        return "cupy"
    return "raw"


def current_stream_of(x: Any) -> int:
    """The caller's current stream for x's library (so work orders with theirs), else 0."""
    if _torch_tensor(x) and x.device.type == "cuda":
        torch = sys.modules["torch"]
        return int(torch.cuda.current_stream(x.device).cuda_stream)
    if _cupy_array(x):
        cupy = sys.modules["cupy"]
        with x.device:
            return int(cupy.cuda.get_current_stream().ptr)
    return 0


def stream_handle(stream: Any) -> int:
    """An int CUstream from an int, a torch/cupy stream, a CUstream or `__cuda_stream__`."""
    if stream is None:
        return 0
    if isinstance(stream, bool):
        raise ParamError("stream", "must be a stream handle (int) or a stream object")
    if isinstance(stream, (int, np.integer)):
        return int(stream)
    if hasattr(stream, "__cuda_stream__"):
        return int(stream.__cuda_stream__()[1])
    for attr in ("cuda_stream", "ptr", "handle"):
        if hasattr(stream, attr):
            return int(getattr(stream, attr))
    try:
        return int(stream)
    except (TypeError, ValueError):
        raise ParamError("stream", f"cannot get a CUDA stream handle from {type(stream).__name__}") from None


# --------------------------------------------------------------------------- DLPack


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p)]


class _DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class _DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [("version", _DLPackVersion), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p), ("flags", ctypes.c_uint64),
                ("dl_tensor", _DLTensor)]


_DL_READ_ONLY = 1
_capsule_get_name = ctypes.pythonapi.PyCapsule_GetName
_capsule_get_name.restype = ctypes.c_char_p
_capsule_get_name.argtypes = [ctypes.py_object]
_capsule_get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_get_pointer.restype = ctypes.c_void_p
_capsule_get_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]


@dataclass(frozen=True)
class DLPackView:
    ptr: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]  # elements
    dtype: str
    device_type: int
    device_id: int
    readonly: bool


def _dl_dtype(code: int, bits: int, lanes: int) -> str:
    if lanes != 1:
        return f"other:dl({code},{bits},{lanes})"
    name = {(0, 8): "i8", (0, 16): "i16", (0, 32): "i32", (0, 64): "i64", (1, 8): "u8",
            (1, 16): "u16", (1, 32): "u32", (1, 64): "u64", (2, 16): "fp16", (2, 32): "f32",
            (2, 64): "f64", (4, 16): "bf16", (6, 8): "bool"}.get((code, bits))
    return name or f"other:dl({code},{bits},{lanes})"


def parse_dlpack_capsule(capsule: Any) -> DLPackView:
    """Read a DLPack capsule without consuming it: the producer keeps ownership (its capsule
    destructor frees the managed tensor), so the caller must keep the capsule and the source
    object alive while the pointer is used."""
    raw = _capsule_get_name(capsule)
    name = raw.decode() if raw else ""
    if name == "dltensor":
        addr = _capsule_get_pointer(capsule, b"dltensor")
        t = _DLManagedTensor.from_address(addr).dl_tensor
        readonly = False
    elif name == "dltensor_versioned":
        addr = _capsule_get_pointer(capsule, b"dltensor_versioned")
        mt = _DLManagedTensorVersioned.from_address(addr)
        t = mt.dl_tensor
        readonly = bool(mt.flags & _DL_READ_ONLY)
    else:
        raise TypeError(f"not an unconsumed DLPack capsule (name {name!r})")
    ndim = int(t.ndim)
    shape = tuple(int(t.shape[i]) for i in range(ndim))
    if t.strides:
        strides = tuple(int(t.strides[i]) for i in range(ndim))
    else:
        strides = _c_strides(shape)
    ptr = int(t.data or 0) + int(t.byte_offset)
    dtype = _dl_dtype(int(t.dtype.code), int(t.dtype.bits), int(t.dtype.lanes))
    return DLPackView(ptr, shape, strides, dtype, int(t.device.device_type),
                      int(t.device.device_id), readonly)


def _c_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    out, acc = [], 1
    for n in reversed(shape):
        out.append(acc)
        acc *= max(n, 1)
    return tuple(reversed(out))


def _dlpack_stream_arg(stream: int) -> int:
    # DLPack: 1 is the legacy default stream (0 is not allowed); -1 would mean "no sync".
    return 1 if stream == 0 else stream


def _export_dlpack(x: Any, stream: int) -> Any:
    try:
        return x.__dlpack__(stream=_dlpack_stream_arg(stream))
    except TypeError:
        return x.__dlpack__()


# --------------------------------------------------------------------------- describe


def _byte_strides_to_elems(name: str, strides: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
    if itemsize <= 0:
        return tuple(strides)
    for s in strides:
        if s % itemsize:
            raise ParamError(name, f"byte stride {s} is not a multiple of the element size {itemsize}")
    return tuple(s // itemsize for s in strides)


def describe(x: Any, name: str, stream: int = 0) -> ArrayInfo:
    """ArrayInfo for a CUDA device array, or ParamError(name, ...) when x is not one."""
    if isinstance(x, DeviceArray):
        return ArrayInfo(x.ptr, x.shape, x.strides, x.dtype, x.device, "raw", x)
    if _torch_tensor(x):
        if x.device.type != "cuda":
            raise ParamError(name, f"must be a CUDA tensor (is on {x.device})")
        dtype = _TORCH_DTYPES.get(str(x.dtype), f"other:{x.dtype}")
        return ArrayInfo(int(x.data_ptr()), tuple(int(n) for n in x.shape),
                         tuple(int(s) for s in x.stride()), dtype, int(x.device.index), "torch", x)
    if _cupy_array(x):
        dtype = _NUMPY_NAMES.get(x.dtype.name, f"other:{x.dtype.name}")
        strides = _byte_strides_to_elems(name, tuple(x.strides), int(x.dtype.itemsize))
        return ArrayInfo(int(x.data.ptr), tuple(x.shape), strides, dtype, int(x.device.id),
                         "cupy", x)
    if isinstance(x, np.ndarray):
        raise ParamError(name, "must be a CUDA device array (got a numpy host array)")
    if hasattr(x, "__dlpack__") and hasattr(x, "__dlpack_device__"):
        dev_type, dev_id = (int(v) for v in x.__dlpack_device__())
        if dev_type not in (KDL_CUDA, KDL_CUDA_MANAGED):
            raise ParamError(name, f"must be a CUDA device array (DLPack device type {dev_type})")
        cap = _export_dlpack(x, stream)
        view = parse_dlpack_capsule(cap)
        return ArrayInfo(view.ptr, view.shape, view.strides, view.dtype, dev_id, "dlpack", x,
                         keep=cap, readonly=view.readonly)
    try:
        cai = x.__cuda_array_interface__
    except AttributeError:
        cai = None
    if cai is not None:
        return from_cai(cai, name, x)
    raise ParamError(name, f"must be a CUDA array (torch, cupy, DLPack or "
                           f"__cuda_array_interface__); got {type(x).__name__}")


def from_cai(cai: dict[str, Any], name: str, owner: Any = None) -> ArrayInfo:
    if cai.get("mask") is not None:
        raise ParamError(name, "masked __cuda_array_interface__ arrays are not supported")
    typestr = str(cai["typestr"])
    dtype = _CAI_TYPESTRS.get(typestr, f"other:{typestr}")
    shape = tuple(int(n) for n in cai["shape"])
    ptr, readonly = cai["data"]
    size = ITEMSIZE.get(dtype, int(typestr[2:]) if typestr[2:].isdigit() else 0)
    raw_strides = cai.get("strides")
    if raw_strides is None:
        strides = _c_strides(shape)
    else:
        strides = _byte_strides_to_elems(name, tuple(int(s) for s in raw_strides), size)
    stream = cai.get("stream")
    return ArrayInfo(int(ptr or 0), shape, strides, dtype, None, "cai", owner,
                     readonly=bool(readonly), cai_stream=None if stream is None else int(stream))


# --------------------------------------------------------------------------- host ints


def host_or_device_ints(value: Any, name: str, stream: int = 0) -> np.ndarray | ArrayInfo:
    """Integer parameter values: a host int64 numpy array, or the device array as given."""
    if is_device_array(value):
        return describe(value, name, stream)
    if isinstance(value, (bool, np.bool_)):
        raise ParamError(name, "must be integers, not booleans")
    try:
        arr = np.asarray(value)
    except Exception:
        raise ParamError(name, f"cannot read integers from {type(value).__name__}") from None
    if arr.size == 0:
        return np.zeros(arr.shape, dtype=np.int64)
    if arr.dtype == object or not np.issubdtype(arr.dtype, np.integer):
        raise ParamError(name, f"must be integers (got {arr.dtype})")
    return arr.astype(np.int64)


# --------------------------------------------------------------------------- DeviceArray

_NP_DTYPE = {"fp16": np.float16, "f32": np.float32, "f64": np.float64, "i32": np.int32,
             "i64": np.int64, "bf16": np.uint16, "u8": np.uint8}


def bf16_bits(a: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns (round to nearest even), as uint16."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    rounding = ((u >> 16) & 1) + np.uint32(0x7FFF)
    out = ((u + rounding) >> 16).astype(np.uint16)
    nan = np.isnan(a)
    if nan.any():
        out[nan] = 0x7FC0
    return out


def bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


class _Allocation:
    """Owns one cuMemAlloc block; freed (in its device's primary context) when unreferenced."""

    def __init__(self, nbytes: int, device: int):
        from . import _driver

        self.device = device
        with _driver.on_device(device):
            self.ptr = _driver.mem_alloc(nbytes)
        self._finalizer = weakref.finalize(self, _free, self.ptr, device)


def _free(ptr: int, device: int) -> None:
    from . import _driver

    try:
        with _driver.on_device(device):
            _driver.mem_free(ptr)
    except Exception:  # interpreter shutdown: the driver may be gone already
        pass


class DeviceArray:
    """A device array owned by the runtime (for callers with no array library).

    Exposes `__cuda_array_interface__` (v3) for every dtype CAI can name; bfloat16 has no
    CAI typestr, so a bf16 DeviceArray is only understood by cmc and by `to_numpy`.
    """

    def __init__(self, shape: tuple[int, ...], dtype: str, device: int = 0, *,
                 strides: tuple[int, ...] | None = None, ptr: int | None = None,
                 base: Any = None):
        if dtype not in ITEMSIZE:
            raise ValueError(f"unknown dtype {dtype!r}")
        self.shape = tuple(int(n) for n in shape)
        self.dtype = dtype
        self.device = int(device)
        self.strides = tuple(strides) if strides is not None else _c_strides(self.shape)
        if ptr is None:
            nbytes = int(np.prod(self.shape, dtype=np.int64)) * ITEMSIZE[dtype]
            self._base: Any = _Allocation(nbytes, self.device)
            self.ptr = self._base.ptr
        else:
            self._base, self.ptr = base, int(ptr)

    @classmethod
    def from_numpy(cls, a: np.ndarray, dtype: str | None = None, device: int = 0) -> DeviceArray:
        """Upload a host array; floats become `dtype` (bf16 by rounding to nearest even)."""
        from . import _driver

        dtype = dtype or _NUMPY_NAMES[np.asarray(a).dtype.name]
        host = bf16_bits(a) if dtype == "bf16" else np.ascontiguousarray(a, dtype=_NP_DTYPE[dtype])
        out = cls(tuple(np.shape(a)), dtype, device)
        if host.nbytes:
            with _driver.on_device(device):
                _driver.htod(out.ptr, host.ctypes.data, host.nbytes)
        return out

    def to_numpy(self) -> np.ndarray:
        """Copy to the host (waits for the device); bf16 comes back as float32."""
        from . import _driver

        span = 1 + sum((n - 1) * s for n, s in zip(self.shape, self.strides, strict=True)
                       if n > 0)
        if 0 in self.shape:
            return np.zeros(self.shape, dtype=np.float32 if self.dtype == "bf16" else
                            _NP_DTYPE[self.dtype])
        flat = np.empty(span, dtype=_NP_DTYPE[self.dtype])
        with _driver.on_device(self.device):
            _driver.synchronize_context()
            _driver.dtoh_sync(flat.ctypes.data, self.ptr, flat.nbytes, 0)
        view = np.lib.stride_tricks.as_strided(
            flat, self.shape, tuple(s * flat.itemsize for s in self.strides))
        out = np.array(view)
        return bf16_to_f32(out) if self.dtype == "bf16" else out

    def view(self, shape: tuple[int, ...], strides: tuple[int, ...]) -> DeviceArray:
        return DeviceArray(shape, self.dtype, self.device, strides=strides, ptr=self.ptr,
                           base=self)

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        typestr = _TYPESTR_OF.get(self.dtype)
        if typestr is None:
            raise AttributeError(f"__cuda_array_interface__ cannot express dtype {self.dtype}")
        size = ITEMSIZE[self.dtype]
        return {"shape": self.shape, "typestr": typestr, "data": (self.ptr, False), "version": 3,
                "strides": tuple(s * size for s in self.strides), "stream": None}

    def __repr__(self) -> str:
        return f"DeviceArray(shape={self.shape}, dtype={self.dtype}, device={self.device})"


ReadDevice = Callable[[ArrayInfo], np.ndarray]


# --------------------------------------------------------------------------- outputs


def _on_stream(q: Any, lib: str, stream: int | None) -> contextlib.AbstractContextManager[Any]:
    """Allocate on `stream` (a launch stream the caller named; None: the current one) when it
    is not the library's current one: torch's and CuPy's pools tie a block to the stream it
    was allocated on, so a block freed after our kernels wrote it on another stream could be
    reused before they finish."""
    if stream is None or stream == current_stream_of(q):
        return contextlib.nullcontext()
    if lib == "torch":
        torch = sys.modules["torch"]
        return torch.cuda.stream(torch.cuda.ExternalStream(stream, device=q.device))
    if lib == "cupy":
        return sys.modules["cupy"].cuda.ExternalStream(stream)
    return contextlib.nullcontext()


def empty_like_q(q: Any, qi: ArrayInfo, lib: str, stream: int | None = None) -> Any:
    """A C-contiguous array shaped like q, from q's own library, allocated on `stream` (the
    launch stream) when that is not the library's current one."""
    if lib == "torch":
        with _on_stream(q, lib, stream):
            return sys.modules["torch"].empty_like(
                q, memory_format=sys.modules["torch"].contiguous_format)
    if lib == "cupy":
        with q.device, _on_stream(q, lib, stream):
            return sys.modules["cupy"].empty_like(q, order="C")
    assert qi.device is not None
    return DeviceArray(qi.shape, qi.dtype, qi.device)


def empty_lse(q: Any, qi: ArrayInfo, lib: str, heads: int, tokens: int,
              stream: int | None = None) -> Any:
    """A float32 [heads, tokens] LSE from q's own library, on `stream` as empty_like_q."""
    if lib == "torch":
        with _on_stream(q, lib, stream):
            return sys.modules["torch"].empty((heads, tokens), dtype=sys.modules["torch"].float32,
                                              device=q.device)
    if lib == "cupy":
        with q.device, _on_stream(q, lib, stream):
            return sys.modules["cupy"].empty((heads, tokens), dtype=sys.modules["cupy"].float32)
    assert qi.device is not None
    return DeviceArray((heads, tokens), "f32", qi.device)
