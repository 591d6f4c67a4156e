"""The backward pass of a loaded artifact: `Attention.backward(dout, q, k, v, out, lse, ...)`.

The manifest's "backward" section (manifest.py) says how to pack the kernels' second
parameter (cmc_bwd_args), how large the two fp32 workspaces are and which kernel roles run in
which order; this module checks the arguments, packs the forward's descriptor (o and lse now
inputs) and the args, and launches that sequence on the caller's stream.

Workspaces (dq_accum, dsum) are allocated per call, stream-ordered (cuMemAllocAsync /
cuMemFreeAsync from the device's default pool). Why not a cache per stream and size: a
cached buffer would be shared by every call on that stream, so a CUDA graph captured with
it would race with later eager calls (and with other graphs) writing the same bytes; the
stream-ordered pool is cheap after the first call, needs no lifetime rules, and during
capture becomes the graph's own allocation and free nodes.
"""

from __future__ import annotations

import ctypes
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from cuda.bindings import driver as cu

from ..abi import dq_accum_bytes
from ..errors import ArtifactError, ParamError
from ..kernels import persistent_ctas
from . import _driver
from .arrays import (
    ArrayInfo,
    current_stream_of,
    describe,
    empty_like_q,
    library_of,
    stream_handle,
)
from .device import (
    MapTensor,
    _cached_seqlens,
    _Kernel,
    _Uploads,
    refuse_host_values_in_capture,
    tensor_maps_block,
)
from .params import (
    Geometry,
    TensorStrides,
    _check_one,
    _dtype_name,
    check_grid,
    check_tensors,
    grid_dims,
    packed_layout,
    scale_log2,
)

if TYPE_CHECKING:
    from .loader import Attention, Plan


def _check_like(name: str, a: ArrayInfo, like: ArrayInfo, like_name: str, packed: bool,
                writable: bool) -> TensorStrides:
    """A gradient-side tensor (dout, out, dq, dk, dv): the rules of q, k, v, and exactly the
    shape and dtype of the tensor it stands beside."""
    if a.dtype != like.dtype:
        raise ParamError(name, f"dtype {_dtype_name(a.dtype)} must match {like_name}'s "
                               f"({like.dtype})")
    if None not in (a.device, like.device) and a.device != like.device:
        raise ParamError(name, f"must be on q's device (cuda:{like.device}); is on "
                               f"cuda:{a.device}")
    if tuple(a.shape) != tuple(like.shape):
        raise ParamError(name, f"shape {list(a.shape)} must equal {like_name}'s "
                               f"{list(like.shape)}")
    return _check_one(name, a, packed, writable)


def _check_lse(a: ArrayInfo, geo: Geometry, packed: bool, batch: int, seq_len: int) -> None:
    """The LSE exactly as the forward returned it (return_lse=True): float32 [Hq, T] (packed),
    or the [B, Hq, L] view of that [Hq, B*L] array (batch layout); the kernels address it as
    lse + h * T + token."""
    want = "float32 [Hq, T], contiguous" if packed else \
        "float32 [B, Hq, L], the view of a contiguous [Hq, B*L] array"
    rule = f"must be the LSE the forward returned with return_lse=True ({want})"
    if a.dtype != "f32":
        raise ParamError("lse", f"dtype {_dtype_name(a.dtype)}: {rule}")
    if None not in (a.device, geo.device) and a.device != geo.device:
        raise ParamError("lse", f"must be on q's device (cuda:{geo.device}); is on "
                                f"cuda:{a.device}")
    if packed:
        shape: tuple[int, ...] = (geo.heads_q, geo.tokens)
        strides: tuple[int, ...] = (geo.tokens, 1)
    else:
        shape, strides = (batch, geo.heads_q, seq_len), (seq_len, geo.tokens, 1)
    if tuple(a.shape) != shape:
        raise ParamError("lse", f"shape {list(a.shape)}, expected {list(shape)}: {rule}")
    if a.numel and any(n > 1 and s != w
                       for n, s, w in zip(a.shape, a.strides, strides, strict=True)):
        raise ParamError("lse", f"strides {list(a.strides)}, expected {list(strides)}: {rule}")
    if a.numel and a.ptr % 4:
        raise ParamError("lse", "data pointer must be 4-byte aligned")


def run_backward(attn: Attention, dout: Any, q: Any, k: Any, v: Any, out: Any, lse: Any, *,
                 scale: Any, cu_seqlens: Any, max_len: Any, plan: Plan | None, stream: Any,
                 deterministic: bool, dq: Any, dk: Any, dv: Any,
                 params: Mapping[str, Any]) -> tuple[Any, Any, Any]:
    if plan is not None and (cu_seqlens is not None or max_len is not None or params):
        extra = [n for n, x in (("cu_seqlens", cu_seqlens), ("max_len", max_len))
                 if x is not None] + sorted(params)
        raise ParamError("plan", f"carries cu_seqlens, max_len and the mask parameters; "
                                 f"do not pass {', '.join(extra)} with it")
    if not isinstance(deterministic, bool):
        raise ParamError("deterministic", f"must be True or False (got {deterministic!r})")
    lib = library_of(q)
    sh = stream_handle(stream) if stream is not None else current_stream_of(q)
    qi = describe(q, "q", sh)
    if qi.device is None:
        qi = replace(qi, device=_driver.pointer_device(qi.ptr) if qi.ptr
                     else _driver.current_device())
    assert qi.device is not None
    device = qi.device
    kern = attn._kernels(device)
    spec = attn.manifest.backward
    if spec is None or not kern.backward:
        raise ArtifactError(f"{attn.name}: the artifact has no backward kernels for "
                            f"{kern.arch} (compiled with --no-backward?); check "
                            "attn.has_backward")
    info = {n: attn._resolve(describe(x, n, sh), device)
            for n, x in (("k", k), ("v", v), ("out", out), ("dout", dout), ("lse", lse))}
    given = {n: attn._resolve(describe(x, n, sh), device)
             for n, x in (("dq", dq), ("dk", dk), ("dv", dv)) if x is not None}
    with _driver.on_device(device):
        if plan is not None:
            attn._check_plan(plan, device, qi)
            packed = plan.packed
        else:
            packed = packed_layout(qi, cu_seqlens)
        geo = check_tensors(qi, info["k"], info["v"], None, packed=packed,
                            variants=list(kern.backward))
        st = dict(geo.strides)
        st["out"] = _check_like("out", info["out"], qi, "q", packed, False)
        st["dout"] = _check_like("dout", info["dout"], qi, "q", packed, False)
        for n, like in (("dq", "q"), ("dk", "k"), ("dv", "v")):
            if n in given:
                st[n] = _check_like(n, given[n], info.get(like, qi), like, packed, True)
        for a in (qi, *info.values(), *given.values()):  # CAI v3: after the producer's stream
            if a.cai_stream is not None and a.cai_stream != sh:
                _driver.stream_wait_stream(sh, a.cai_stream)
        capturing = _driver.is_capturing(sh)
        uploads = _Uploads(device)
        fixed: dict[str, int] = {}
        packed_params: list[Any] = []
        seq_ptr: int | tuple[str, int]
        if plan is not None:
            plan.check_geometry(geo)
            batch, mlen, seq_ptr = plan.batch, plan.max_len, plan.values["cu_seqlens"]
            fixed = dict(plan.values)
        else:
            batch, mlen, seq_ptr, packed_params, uploads = attn._sequences(
                device, sh, geo, packed, cu_seqlens, max_len, params, capturing)
        _check_lse(info["lse"], geo, packed, batch, geo.seq_len)
        slog2 = scale_log2(scale, geo.head_dim)
        if capturing:
            refuse_host_values_in_capture(packed_params, uploads)
        outs = {}
        for n, x, xi in (("dq", q, qi), ("dk", k, info["k"]), ("dv", v, info["v"])):
            if n in given:
                outs[n] = dq if n == "dq" else dk if n == "dk" else dv
            else:
                outs[n] = empty_like_q(x, xi, lib, sh if stream is not None else None)
                given[n] = describe(outs[n], n, sh)
                st[n] = _check_one(n, given[n], packed, True)
        if not (geo.tokens and batch and geo.heads_q and mlen):
            return outs["dq"], outs["dk"], outs["dv"]
        if not packed and plan is None:  # a plan holds its own copy (capturable)
            seq_ptr = _cached_seqlens(device, batch, mlen, capturing)
        _launch_all(attn, kern.backward_roles(geo.dtype, geo.head_dim, mlen), kern.num_sms,
                    sh, geo, st, qi, info, given, seq_ptr, batch, mlen, slog2, packed_params,
                    uploads, fixed, packed, deterministic)
    return outs["dq"], outs["dk"], outs["dv"]


def _launch_all(attn: Attention, roles: Mapping[str, _Kernel], num_sms: int, sh: int,
                geo: Geometry, st: Mapping[str, TensorStrides], qi: ArrayInfo,
                info: Mapping[str, ArrayInfo], grads: Mapping[str, ArrayInfo],
                seq_ptr: int | tuple[str, int], batch: int, mlen: int, slog2: float,
                packed_params: list[Any], uploads: _Uploads, fixed: Mapping[str, int],
                packed: bool, deterministic: bool) -> None:
    """Pack the descriptor and cmc_bwd_args, allocate the workspaces, and launch the roles of
    the manifest's sequence in order; the workspaces are freed after the last launch in
    stream order (also when a launch fails)."""
    spec = attn.manifest.backward
    assert spec is not None
    ki, vi, oi = info["k"], info["v"], info["out"]
    values, pending = attn._desc_values(packed_params, uploads, fixed, geo, st,
                                        (qi, ki, vi, oi), info["lse"].ptr, batch, mlen, slog2)
    values["sched"] = 0
    sizes_env = {"T": geo.tokens, "batch": batch, "heads_q": geo.heads_q,
                 "heads_kv": geo.heads_kv, "head_dim": geo.head_dim}
    try:
        sizes = {n: int(rule(sizes_env)) for n, rule in spec.workspace.items()}
    except KeyError as missing:
        raise ArtifactError(f"backward.workspace rule uses unknown name {missing}") from None
    floor = {"dq_accum": dq_accum_bytes(spec.dq_layout, geo.tokens, batch, geo.heads_q,
                                        geo.head_dim),
             "dsum": 8 * geo.tokens * geo.heads_q}
    for n, b in sizes.items():
        if b < floor[n]:  # the kernels' contract: never hand them a short buffer
            raise ArtifactError(f"backward.workspace.{n}: the rule gives {b} bytes, the "
                                f"kernels write {floor[n]}")
    mode = "deterministic" if deterministic else "atomic"
    plans = []
    for role in spec.sequence[mode]:
        ent = roles[role].entry
        if ent.max_len is not None and mlen > ent.max_len:
            raise ParamError("max_len", f"{mlen} tokens: {ent.symbol} holds sequences of at "
                                        f"most {ent.max_len} tokens")
        env = {**{n: int(x) for n, x in values.items() if isinstance(x, int)}, **sizes_env,
               "block_m": ent.block_m, "block_n": ent.block_n, "threads": ent.threads,
               "max_ctas": persistent_ctas(num_sms, packed, mlen, dynamic=False)}
        grid = grid_dims(ent.grid, env)
        check_grid(grid, ent.symbol)
        plans.append((roles[role], grid))
    work: dict[str, int] = {}
    uploads.upload(sh)
    try:
        for n in spec.workspace:
            work[n] = _driver.mem_alloc_async(max(sizes[n], 16), sh)
        for fname, off in pending:
            values[fname] = uploads.base + off
        values["cu_seqlens"] = uploads.base + seq_ptr[1] if isinstance(seq_ptr, tuple) \
            else seq_ptr
        desc = attn.manifest.layout.pack(values)
        g = {n: st[n] for n in ("dout", "dq", "dk", "dv")}
        args = spec.args.pack({
            "dout": info["dout"].ptr, "dq": grads["dq"].ptr, "dk": grads["dk"].ptr,
            "dv": grads["dv"].ptr, "dq_accum": work["dq_accum"], "dsum": work["dsum"],
            **{f"{n}_stride_{w}": getattr(g[n], w) for n in g for w in ("tok", "head")},
            "total_tokens": geo.tokens, "flags": spec.flags(deterministic, mlen)})
        dbuf = ctypes.create_string_buffer(desc, len(desc))
        abuf = ctypes.create_string_buffer(args, len(args))
        keep: list[Any] = []
        for kn, grid in plans:
            e = kn.entry
            ptrs = []
            for p in e.params:
                if p == "desc":
                    ptrs.append(ctypes.addressof(dbuf))
                elif p == "bwd_args":
                    ptrs.append(ctypes.addressof(abuf))
                else:  # "maps": those the manifest lists, of q, k, v, dO and dq_accum
                    views = {t: MapTensor(a.ptr, h, st[n].tok, st[n].head, n) for t, n, a, h in (
                        ("q", "q", qi, geo.heads_q), ("k", "k", ki, geo.heads_kv),
                        ("v", "v", vi, geo.heads_kv), ("do", "dout", info["dout"], geo.heads_q))}
                    hd = geo.head_dim  # the fp32 workspace, [T, heads_q, D] contiguous
                    views["dq_accum"] = MapTensor(work["dq_accum"], geo.heads_q,
                                                  geo.heads_q * hd, hd, "dq_accum")
                    block, at = tensor_maps_block(e.tensor_maps, geo.dtype, geo.head_dim,
                                                  geo.tokens, views, e.box_rows)
                    keep.append(block)
                    ptrs.append(at)
            argv = (ctypes.c_void_p * len(ptrs))(*ptrs)
            _driver.call(f"cuLaunchKernel({e.symbol})", cu.cuLaunchKernel(
                kn.function, grid[0], grid[1], grid[2], e.block[0], e.block[1], e.block[2],
                e.dynamic_smem, _driver.stream(sh), ctypes.addressof(argv), 0))
    finally:
        for ptr in work.values():
            _driver.mem_free_async(ptr, sh)
        uploads.free(sh)


__all__ = ["run_backward"]
