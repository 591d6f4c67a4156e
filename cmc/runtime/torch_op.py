"""A loaded artifact as a PyTorch custom op, so it traces into torch.compile graphs and can
be captured in CUDA graphs: `fn = register(attn, "causal"); o = fn(q, k, v)`.

Imported only on demand (it imports torch). The op itself, `cmc::<name>`, takes only
tensors and ints (schema below), returns (out, lse[Hq, T]) and never aliases its inputs; its
fake implementation gives the shapes, so torch.compile needs no real kernel to trace it.
The Python wrapper `register` returns turns friendly parameter values (ints, lists, lists of
segment starts) into those tensors before calling the op; under torch.compile Python lists
are packed without numpy (numpy calls do not trace) and become constants of the graph, so
new values recompile: pass int32 tensors for values that change.

CUDA graph capture: warm up once outside capture with the same shapes (the batch layout's
cu_seqlens is created and cached then), and pass per-sequence parameters and cu_seqlens as
device int32 tensors (no host-to-device copy can run during capture). During capture the
values of device tensors cannot be read back, so only their shapes and types are checked.
Forward + backward in one graph: use a plan (`attn(q, k, v, plan=p)`, nothing is read back
or uploaded), keep the plan alive as long as the graph, and warm up (one forward and
backward) before capturing; the backward's workspaces are stream-ordered allocations, which
a captured graph owns (allocated and freed inside each replay).

Autograd: `attn(q, k, v, ...)` on tensors that require grad (grad mode on) goes through
`AttentionFunction` (autograd_call below): the forward keeps its LSE, the backward calls
`attn.backward`. The LSE output is not differentiable (its gradient is ignored).
`register(attn)` gives the op an autograd formula (a second op, `<name>_backward`, with its
fake), so torch.compile(fullgraph=True) traces forward and backward.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import ParamError
from .params import KIND_SYNTAX, Segments, pack_segments

if TYPE_CHECKING:
    from .loader import Attention

_registered: dict[str, tuple[Attention, Callable[..., Any]]] = {}


def _schema(attn: Attention) -> tuple[str, list[tuple[str, str, tuple[str, ...]]]]:
    """The op schema, and per mask parameter (name, kind, op argument names)."""
    args = ["Tensor q", "Tensor k", "Tensor v", "Tensor? cu_seqlens", "int? max_len",
            "float? scale", "bool return_lse", "bool deterministic"]
    plan = []
    for name, kind in attn.params:
        if kind == "scalar":
            names: tuple[str, ...] = (f"p_{name}",)
            args.append(f"int p_{name}")
        elif kind == "batch":
            names = (f"p_{name}",)
            args.append(f"Tensor p_{name}")
        else:
            names = (f"p_{name}_offsets", f"p_{name}_starts")
            args += [f"Tensor p_{name}_offsets", f"Tensor p_{name}_starts"]
        plan.append((name, kind, names))
    return "(" + ", ".join(args) + ") -> (Tensor, Tensor)", plan


def _backward_schema(attn: Attention) -> str:
    """The backward op: dout, q, k, v, out, lse ([Hq, T]) and the forward's other arguments."""
    fwd, _ = _schema(attn)
    rest = fwd[1:fwd.index(")")].split(", ")[3:]
    rest = [a for a in rest if a != "bool return_lse"]
    args = ["Tensor dout", "Tensor q", "Tensor k", "Tensor v", "Tensor out", "Tensor lse", *rest]
    return "(" + ", ".join(args) + ") -> (Tensor, Tensor, Tensor)"


_function: Any = None


def _autograd_function() -> Any:
    """torch.autograd.Function over Attention.__call__ / Attention.backward (made on first use:
    this module must not import torch at import time)."""
    global _function
    if _function is not None:
        return _function
    import torch

    class AttentionFunction(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, q: Any, k: Any, v: Any, attn: Attention,
                    kw: dict[str, Any]) -> Any:
            o, lse = attn(q, k, v, return_lse=True, scale=kw["scale"],
                          cu_seqlens=kw["cu_seqlens"], max_len=kw["max_len"],
                          stream=kw["stream"], plan=kw["plan"], **kw["params"])
            ctx.attn, ctx.kw = attn, kw
            ctx.save_for_backward(q, k, v, o, lse)
            ctx.mark_non_differentiable(lse)
            return o, lse

        @staticmethod
        def backward(ctx: Any, do: Any, _dlse: Any) -> Any:
            q, k, v, o, lse = ctx.saved_tensors
            kw = ctx.kw
            dq, dk, dv = ctx.attn.backward(
                do.contiguous(), q, k, v, o, lse, scale=kw["scale"],
                cu_seqlens=kw["cu_seqlens"], max_len=kw["max_len"], plan=kw["plan"],
                stream=kw["stream"], deterministic=kw["deterministic"], **kw["params"])
            return dq, dk, dv, None, None

    _function = AttentionFunction
    return _function


def autograd_call(attn: Attention, q: Any, k: Any, v: Any, *, scale: Any, return_lse: bool,
                  out: Any, cu_seqlens: Any, max_len: Any, stream: Any, plan: Any,
                  deterministic: bool, params: dict[str, Any]) -> Any:
    """Attention.__call__ for torch tensors that require grad: an output that backpropagates."""
    if out is not None:
        raise ParamError("out", "cannot be given when q, k or v require grad (autograd "
                                "needs an output it owns); call under torch.no_grad() or "
                                "drop out=")
    if not isinstance(deterministic, bool):
        raise ParamError("deterministic", f"must be True or False (got {deterministic!r})")
    kw = {"scale": scale, "cu_seqlens": cu_seqlens, "max_len": max_len, "stream": stream,
          "plan": plan, "deterministic": deterministic, "params": params}
    o, lse = _autograd_function().apply(q, k, v, attn, kw)
    return (o, lse) if return_lse else o


def register(attn: Attention, name: str | None = None, *, namespace: str = "cmc") -> Any:
    """Register `attn` as the op `namespace::name` (default: the mask's name).

    Returns fn(q, k, v, *, scale=None, return_lse=False, cu_seqlens=None, max_len=None,
    deterministic=False, **params) with `fn.op` the custom op (with an autograd formula:
    `fn.backward_op` is `namespace::name_backward`). Registering the same name again returns the same
    fn for the same Attention, and is an error for another one (torch ops are global).
    """
    import torch

    opname = name or attn.name
    qual = f"{namespace}::{opname}"
    if qual in _registered:
        prev_attn, prev_fn = _registered[qual]
        if prev_attn is attn:
            return prev_fn
        raise ValueError(f"torch op {qual} is already registered for another artifact")
    schema, plan = _schema(attn)

    def _kwargs(pargs: tuple[Any, ...]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        i = 0
        for pname, kind, names in plan:
            if kind == "segments":
                out[pname] = Segments(pargs[i], pargs[i + 1])
            else:
                out[pname] = pargs[i]
            i += len(names)
        return out

    def impl(q: Any, k: Any, v: Any, cu_seqlens: Any, max_len: Any, scale: Any,
             return_lse: bool, deterministic: bool, *pargs: Any) -> tuple[Any, Any]:
        with torch.no_grad():  # the op's autograd formula handles gradients, not __call__
            res = attn(q, k, v, scale=scale, return_lse=return_lse, cu_seqlens=cu_seqlens,
                       max_len=max_len, **_kwargs(pargs))
        if return_lse:
            o, lse = res
            if q.dim() == 4:  # back to the kernel's [Hq, T] (contiguous base of the view)
                lse = lse.permute(1, 0, 2).reshape(q.shape[2], -1)
            return o, lse
        return res, q.new_empty((0,), dtype=torch.float32)

    def fake(q: Any, k: Any, v: Any, cu_seqlens: Any, max_len: Any, scale: Any,
             return_lse: bool, deterministic: bool, *pargs: Any) -> tuple[Any, Any]:
        tokens = q.shape[0] if q.dim() == 3 else q.shape[0] * q.shape[1]
        o = torch.empty_like(q, memory_format=torch.contiguous_format)
        lse_shape = (q.shape[-2], tokens) if return_lse else (0,)
        return o, q.new_empty(lse_shape, dtype=torch.float32)

    op = torch.library.custom_op(qual, impl, mutates_args=(), device_types="cuda",
                                 schema=schema)
    op.register_fake(fake)

    def bwd_impl(dout: Any, q: Any, k: Any, v: Any, out: Any, lse: Any, cu_seqlens: Any,
                 max_len: Any, scale: Any, deterministic: bool, *pargs: Any
                 ) -> tuple[Any, Any, Any]:
        if lse.dim() != 2 or lse.shape[1] != (q.shape[0] if q.dim() == 3
                                              else q.shape[0] * q.shape[1]):
            raise ParamError("lse", "the forward op ran without return_lse; its backward "
                                    "needs the LSE (call fn, which asks for it under grad)")
        if q.dim() == 4:  # the kernel's [Hq, T] -> the [B, Hq, L] view backward takes
            lse = lse.view(q.shape[2], q.shape[0], q.shape[1]).permute(1, 0, 2)
        dq, dk, dv = attn.backward(dout, q, k, v, out, lse, scale=scale, cu_seqlens=cu_seqlens,
                                   max_len=max_len, deterministic=deterministic,
                                   **_kwargs(pargs))
        return dq, dk, dv

    def bwd_fake(dout: Any, q: Any, k: Any, v: Any, out: Any, lse: Any, cu_seqlens: Any,
                 max_len: Any, scale: Any, deterministic: bool, *pargs: Any
                 ) -> tuple[Any, Any, Any]:
        dq, dk, dv = (torch.empty_like(x, memory_format=torch.contiguous_format)
                      for x in (q, k, v))
        return dq, dk, dv

    bwd_op = torch.library.custom_op(f"{qual}_backward", bwd_impl, mutates_args=(),
                                     device_types="cuda", schema=_backward_schema(attn))
    bwd_op.register_fake(bwd_fake)

    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: tuple[Any, Any]) -> None:
        q, k, v, cu_seqlens, max_len, scale, _, deterministic, *pargs = inputs
        tensors = [p for p in pargs if isinstance(p, torch.Tensor)]
        ctx.save_for_backward(q, k, v, output[0], output[1], cu_seqlens, *tensors)
        ctx.meta = (max_len, scale, deterministic,
                    [None if isinstance(p, torch.Tensor) else p for p in pargs])
        ctx.n_inputs = len(inputs)
        ctx.mark_non_differentiable(output[1])

    def backward(ctx: Any, do: Any, _dlse: Any) -> tuple[Any, ...]:
        q, k, v, o, lse, cu_seqlens, *tensors = ctx.saved_tensors
        max_len, scale, deterministic, plain = ctx.meta
        it = iter(tensors)
        pargs = [next(it) if p is None else p for p in plain]
        dq, dk, dv = bwd_op(do.contiguous(), q, k, v, o, lse, cu_seqlens, max_len, scale,
                            deterministic, *pargs)
        return (dq, dk, dv, *([None] * (ctx.n_inputs - 3)))

    op.register_autograd(backward, setup_context=setup_context)

    def fn(q: Any, k: Any, v: Any, *, scale: float | None = None, return_lse: bool = False,
           cu_seqlens: Any = None, max_len: int | None = None, deterministic: bool = False,
           **params: Any) -> Any:
        if cu_seqlens is not None and not isinstance(cu_seqlens, torch.Tensor):
            cu_seqlens = torch.as_tensor(cu_seqlens, dtype=torch.int32, device=q.device)
        batch = q.shape[0] if q.dim() == 4 else (cu_seqlens.shape[0] - 1
                                                 if cu_seqlens is not None else 0)
        declared = [n for n, _, _ in plan]
        for pname in params:
            if pname not in declared:
                raise ParamError(pname, "unknown parameter; the mask declares: "
                                        f"{', '.join(declared) or 'none'}")
        pargs: list[Any] = []
        for pname, kind, _ in plan:
            if pname not in params:
                raise ParamError(pname, f"missing: the mask declares `param {pname} : "
                                        f"{KIND_SYNTAX[kind]}`")
            pargs += _to_op_args(torch, pname, kind, params[pname], batch, q.device)
        grad = torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v))
        o, lse = op(q, k, v, cu_seqlens, max_len, scale, return_lse or grad, deterministic,
                    *pargs)
        if not return_lse:
            return o
        if q.dim() == 4:
            b, seq, h = q.shape[0], q.shape[1], q.shape[2]
            lse = lse.view(h, b, seq).permute(1, 0, 2)
        return o, lse

    fn.op = op  # type: ignore[attr-defined]
    fn.backward_op = bwd_op  # type: ignore[attr-defined]
    _registered[qual] = (attn, fn)
    return fn


def _to_op_args(torch: Any, name: str, kind: str, value: Any, batch: int,
                device: Any) -> list[Any]:
    """Friendly values -> the op's tensors (device int32) or ints."""
    def dev(x: Any) -> Any:
        if isinstance(x, torch.Tensor):  # a no-op for device int32 tensors
            return x.to(device=device, dtype=torch.int32)
        return torch.as_tensor(np.asarray(x, dtype=np.int32), device=device)

    if kind == "scalar":
        return [value]
    if kind == "batch":
        if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
            return [torch.full((batch,), int(value), dtype=torch.int32, device=device)]
        if _compiling(torch) and _int_list(value):  # numpy does not trace (fullgraph)
            return [torch.tensor(list(value), dtype=torch.int32, device=device)]
        return [dev(value)]
    if isinstance(value, Segments):
        return [dev(value.offsets), dev(value.starts)]
    items = list(value)
    if batch == 1 and all(isinstance(x, (int, np.integer)) for x in items):
        items = [items]
    if _compiling(torch) and all(_int_list(x) for x in items):
        offsets_l, starts_l = _pack_segments_py(name, items)
        return [torch.tensor(offsets_l, dtype=torch.int32, device=device),
                torch.tensor(starts_l, dtype=torch.int32, device=device)]
    offsets, starts = pack_segments(name, items, None)
    return [dev(offsets), dev(starts)]


def _compiling(torch: Any) -> bool:
    return bool(torch.compiler.is_compiling())


def _int_list(x: Any) -> bool:
    return isinstance(x, (list, tuple)) and all(
        isinstance(i, int) and not isinstance(i, bool) for i in x)


def _pack_segments_py(name: str, per_seq: list[Any]) -> tuple[list[int], list[int]]:
    """pack_segments for Python lists of ints, without numpy (torch.compile traces this;
    it specializes on the values, as on any Python constant). Same rules and messages."""
    offsets, flat = [0], []
    for b, starts in enumerate(per_seq):
        if any(y < x for x, y in zip(starts[:-1], starts[1:], strict=True)):
            raise ParamError(name, f"sequence {b}: starts must be sorted (non-decreasing); "
                                   f"got {list(starts)[:16]}")
        if starts and starts[0] < 0:
            raise ParamError(name, f"sequence {b}: starts must be >= 0")
        flat += starts
        offsets.append(len(flat))
    return offsets, flat
