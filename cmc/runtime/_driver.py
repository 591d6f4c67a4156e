"""Thin, checked wrappers over the CUDA driver API (cuda-bindings), shared by the runtime.

Every call goes through `call`, which turns a non-success CUresult into an exception that
names the call and the CUresult, so a failure never passes silently. The driver library is
only touched when one of these functions runs: importing this module works without a GPU.
"""

from __future__ import annotations

import threading
from typing import Any

from cuda.bindings import driver as cu

from ..errors import ArtifactError, CmcError


class DriverError(CmcError):
    """A CUDA driver call failed at run time; `result` is the CUresult name."""

    def __init__(self, what: str, result: str):
        self.what, self.result = what, result
        super().__init__(f"{what} failed: {result}")


def result_name(err: Any) -> str:
    try:
        return str(cu.CUresult(int(err)).name)
    except (ValueError, TypeError):
        return f"CUresult {int(err)}"


def call(what: str, res: Any, error: type[CmcError] = DriverError) -> Any:
    """Unwrap a cuda-bindings result tuple (err, *values); raise on any error."""
    if isinstance(res, tuple):
        err, values = res[0], res[1:]
    else:
        err, values = res, ()
    if int(err) != 0:
        name = result_name(err)
        if error is DriverError:
            raise DriverError(what, name)
        raise error(f"{what} failed: {name}")
    if not values:
        return None
    return values[0] if len(values) == 1 else values


_init_lock = threading.Lock()
_initialised = False
_primary: dict[int, Any] = {}  # device ordinal -> retained primary CUcontext (process lifetime)


def init() -> None:
    """cuInit once; a missing driver or GPU is an ArtifactError (the artifact cannot run here)."""
    global _initialised
    if _initialised:
        return
    with _init_lock:
        if _initialised:
            return
        try:
            res = cu.cuInit(0)
        except Exception as e:  # the driver library itself is missing
            raise ArtifactError(f"cannot use the CUDA driver: {e}") from e
        call("cuInit", res, ArtifactError)
        _initialised = True


def device_count() -> int:
    init()
    return int(call("cuDeviceGetCount", cu.cuDeviceGetCount(), ArtifactError))


def device_handle(ordinal: int) -> Any:
    init()
    return call(f"cuDeviceGet({ordinal})", cu.cuDeviceGet(ordinal), ArtifactError)


def attribute(ordinal: int, attr: Any) -> int:
    dev = device_handle(ordinal)
    return int(call(f"cuDeviceGetAttribute({attr.name})", cu.cuDeviceGetAttribute(attr, dev)))


def compute_capability(ordinal: int) -> tuple[int, int]:
    a = cu.CUdevice_attribute
    return (
        attribute(ordinal, a.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR),
        attribute(ordinal, a.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR),
    )


def sm_count(ordinal: int) -> int:
    a = cu.CUdevice_attribute
    return attribute(ordinal, a.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)


def max_optin_smem(ordinal: int) -> int:
    a = cu.CUdevice_attribute
    return attribute(ordinal, a.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)


def primary_context(ordinal: int) -> Any:
    """The device's primary context (the one PyTorch and CuPy use), retained once."""
    ctx = _primary.get(ordinal)
    if ctx is None:
        with _init_lock:
            ctx = _primary.get(ordinal)
            if ctx is None:
                dev = device_handle(ordinal)
                ctx = call(
                    "cuDevicePrimaryCtxRetain", cu.cuDevicePrimaryCtxRetain(dev), ArtifactError
                )
                _primary[ordinal] = ctx
    return ctx


def current_device() -> int:
    """The device of the calling thread's current context, else 0."""
    init()
    ctx = call("cuCtxGetCurrent", cu.cuCtxGetCurrent())
    if ctx is None or int(ctx) == 0:
        return 0
    return int(call("cuCtxGetDevice", cu.cuCtxGetDevice()))


class on_device:
    """Make `ordinal`'s primary context current for a block, restoring the caller's after.

    Restoring matters: PyTorch derives its current device from the current context.
    """

    def __init__(self, ordinal: int):
        self.ordinal = ordinal
        self.prev: Any = None

    def __enter__(self) -> on_device:
        init()
        want = primary_context(self.ordinal)
        cur = call("cuCtxGetCurrent", cu.cuCtxGetCurrent())
        if cur is not None and int(cur) == int(want):
            self.prev = None
        else:
            self.prev = cur if cur is not None else cu.CUcontext(0)
            call("cuCtxSetCurrent", cu.cuCtxSetCurrent(want))
        return self

    def __exit__(self, *exc: object) -> None:
        if self.prev is not None:
            call("cuCtxSetCurrent", cu.cuCtxSetCurrent(self.prev))


def stream(handle: int) -> Any:
    return cu.CUstream(handle)


def is_capturing(handle: int) -> bool:
    status = call("cuStreamIsCapturing", cu.cuStreamIsCapturing(stream(handle)))
    return int(status) != int(cu.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_NONE)


def pointer_device(ptr: int) -> int:
    """Device ordinal owning a device pointer (for arrays whose protocol does not say)."""
    init()
    attr = cu.CUpointer_attribute.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL
    return int(call("cuPointerGetAttribute(DEVICE_ORDINAL)", cu.cuPointerGetAttribute(attr, ptr)))


def mem_alloc(nbytes: int) -> int:
    return int(call(f"cuMemAlloc({nbytes})", cu.cuMemAlloc(max(nbytes, 1))))


def mem_free(ptr: int) -> None:
    call("cuMemFree", cu.cuMemFree(ptr))


def mem_alloc_async(nbytes: int, handle: int) -> int:
    return int(call(f"cuMemAllocAsync({nbytes})", cu.cuMemAllocAsync(max(nbytes, 1), stream(handle))))


def mem_free_async(ptr: int, handle: int) -> None:
    call("cuMemFreeAsync", cu.cuMemFreeAsync(ptr, stream(handle)))


def htod(dst: int, src_host: int, nbytes: int) -> None:
    call("cuMemcpyHtoD", cu.cuMemcpyHtoD(dst, src_host, nbytes))


def htod_async(dst: int, src_host: int, nbytes: int, handle: int) -> None:
    call("cuMemcpyHtoDAsync", cu.cuMemcpyHtoDAsync(dst, src_host, nbytes, stream(handle)))


def pinned_alloc(nbytes: int) -> int:
    """Page-locked host memory usable from every context (CU_MEMHOSTALLOC_PORTABLE)."""
    return int(call(f"cuMemHostAlloc({nbytes})", cu.cuMemHostAlloc(max(nbytes, 1), 1)))


def pinned_free(ptr: int) -> None:
    call("cuMemFreeHost", cu.cuMemFreeHost(ptr))


def event_create() -> Any:
    return call("cuEventCreate", cu.cuEventCreate(cu.CUevent_flags.CU_EVENT_DISABLE_TIMING))


def event_record(ev: Any, handle: int) -> None:
    call("cuEventRecord", cu.cuEventRecord(ev, stream(handle)))


def event_synchronize(ev: Any) -> None:
    call("cuEventSynchronize", cu.cuEventSynchronize(ev))


def dtoh_sync(dst_host: int, src: int, nbytes: int, handle: int) -> None:
    """Copy after the work already queued on the stream, and wait for it."""
    call("cuMemcpyDtoHAsync", cu.cuMemcpyDtoHAsync(dst_host, src, nbytes, stream(handle)))
    call("cuStreamSynchronize", cu.cuStreamSynchronize(stream(handle)))


def stream_wait_stream(waiter: int, producer: int) -> None:
    """Order `waiter` after the work queued so far on `producer` (CAI v3 stream semantics)."""
    flags = cu.CUevent_flags.CU_EVENT_DISABLE_TIMING
    ev = call("cuEventCreate", cu.cuEventCreate(flags))
    try:
        call("cuEventRecord", cu.cuEventRecord(ev, stream(producer)))
        call("cuStreamWaitEvent", cu.cuStreamWaitEvent(stream(waiter), ev, 0))
    finally:
        call("cuEventDestroy", cu.cuEventDestroy(ev))


def synchronize_context() -> None:
    call("cuCtxSynchronize", cu.cuCtxSynchronize())


_TMAP_DTYPE = {"bf16": "CU_TENSOR_MAP_DATA_TYPE_BFLOAT16", "fp16": "CU_TENSOR_MAP_DATA_TYPE_FLOAT16",
               "f32": "CU_TENSOR_MAP_DATA_TYPE_FLOAT32"}


def tensor_map_3d(dtype: str, ptr: int, dims: tuple[int, int, int],
                  byte_strides: tuple[int, int], box: tuple[int, int, int]) -> bytes:
    """cuTensorMapEncodeTiled of a 3-D tensor as cmc/abi.py specifies (128B swizzle, L2
    promotion 128B, zero fill): the map's 128 opaque bytes."""
    import struct

    m = call("cuTensorMapEncodeTiled", cu.cuTensorMapEncodeTiled(
        getattr(cu.CUtensorMapDataType, _TMAP_DTYPE[dtype]), 3, ptr,
        [cu.cuuint64_t(x) for x in dims], [cu.cuuint64_t(x) for x in byte_strides],
        [cu.cuuint32_t(x) for x in box], [cu.cuuint32_t(1)] * 3,
        cu.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
        cu.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B,
        cu.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
        cu.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE))
    return struct.pack("<16Q", *(int(x) for x in m.opaque))
