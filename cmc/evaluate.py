"""Vectorised numpy evaluation of checked expressions and predicates (for one sequence).

The evaluator of single IR nodes; cmc/oracle.py builds the whole mask's dense reference on it.

Used by the dense oracle, by host-side tile classification and by tests. Semantics follow
docs/language.md: floor division and its remainder; x / 0 == 0 and x % 0 == x at run time
(a constant zero divisor is a check error); seg(S, i) counts the starts <= i, minus one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .ir import (
    And,
    BinOp,
    BoolConst,
    Call,
    Cmp,
    Const,
    Expr,
    Neg,
    Not,
    Or,
    ParamRef,
    Pred,
    Same,
    SegFn,
    TableRef,
    Var,
    nodes,
)

ParamValue = int | Sequence[int]


@dataclass(eq=False)
class Shared:
    """Values of the sub-expressions that do not read a family's index, kept for every
    instance of one term over the same q and len: a disc's (q - o) / W and (q - o) % W are
    then divided once, not once per row of the disc (the tile stage's proofs evaluate every
    instance over whole sequences). Keyed by node identity: one term's tree, alive
    throughout."""

    index: str
    values: dict[int, Any] = field(default_factory=dict)
    bounds: dict[int, tuple[Any, Any, Any]] = field(default_factory=dict)  # lmin, lmax, bounds
    _free: dict[int, bool] = field(default_factory=dict)

    def free(self, e: Expr) -> bool:
        """e reads no family index (so it has one value in every instance)."""
        f = self._free.get(id(e))
        if f is None:
            f = self._free[id(e)] = not any(isinstance(x, Var) and x.name == self.index
                                            for x in nodes(e))
        return f


@dataclass
class Env:
    """Values for one sequence: len, scalar/per-sequence ints, segment starts, q/k arrays;
    `shared` where the env is one instance of a family (tiles.instances)."""

    length: int
    params: Mapping[str, ParamValue]
    vars: dict[str, np.ndarray | int] = field(default_factory=dict)
    tables: Mapping[str, Sequence[int]] = field(default_factory=dict)
    shared: Shared | None = None

    def with_vars(self, **vs: np.ndarray | int) -> Env:
        """Other variables: the shared values (of the old ones) do not carry over."""
        return Env(self.length, self.params, {**self.vars, **vs}, self.tables)


def _nonzero_scalar(b: np.ndarray) -> bool:
    """A divisor that is one nonzero value (a grid width, a block size: the common case),
    which needs none of the zero guards below."""
    return np.ndim(b) == 0 and int(b) != 0


def _floordiv(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if _nonzero_scalar(b):
        return np.asarray(np.asarray(a, dtype=np.int64) // np.int64(b))
    a, b = np.broadcast_arrays(np.asarray(a, dtype=np.int64), np.asarray(b, dtype=np.int64))
    safe = np.where(b == 0, 1, b)
    return np.where(b == 0, 0, a // safe)


def _mod(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if _nonzero_scalar(b):
        return np.asarray(np.asarray(a, dtype=np.int64) % np.int64(b))
    a, b = np.broadcast_arrays(np.asarray(a, dtype=np.int64), np.asarray(b, dtype=np.int64))
    safe = np.where(b == 0, 1, b)
    return np.where(b == 0, a, a % safe)


def seg_lookup(fn: str, starts: Sequence[int], length: int, i: np.ndarray) -> np.ndarray:
    s = np.asarray(starts, dtype=np.int64)
    i = np.asarray(i, dtype=np.int64)
    j = np.searchsorted(s, i, side="right") - 1
    if fn == "seg":
        return j
    ext = np.concatenate([[0], s, [length]]).astype(np.int64)  # ext[j+1] = start of segment j
    if fn == "seg_start":
        return ext[j + 1]
    return ext[j + 2]  # seg_end


def eval_expr(e: Expr, env: Env) -> Any:
    sh = env.shared
    if sh is not None and not isinstance(e, (Const, Var)) and sh.free(e):
        v = sh.values.get(id(e))
        if v is None:
            v = sh.values[id(e)] = _eval_expr(e, env)
        return v
    return _eval_expr(e, env)


def _eval_expr(e: Expr, env: Env) -> Any:
    if isinstance(e, Const):
        return np.int64(e.value)
    if isinstance(e, Var):
        if e.name == "len":
            return np.int64(env.length)
        return np.asarray(env.vars[e.name], dtype=np.int64)
    if isinstance(e, ParamRef):
        v = env.params[e.name]
        return np.int64(int(v))  # type: ignore[arg-type]
    if isinstance(e, BinOp):
        a, b = eval_expr(e.a, env), eval_expr(e.b, env)
        if e.op == "+":
            return a + b
        if e.op == "-":
            return a - b
        if e.op == "*":
            return a * b
        if e.op == "/":
            return _floordiv(a, b)
        return _mod(a, b)
    if isinstance(e, Neg):
        return -eval_expr(e.a, env)
    if isinstance(e, Call):
        vals = [eval_expr(x, env) for x in e.args]
        if e.fn == "abs":
            return np.abs(vals[0])
        out = vals[0]
        for v in vals[1:]:
            out = np.minimum(out, v) if e.fn == "min" else np.maximum(out, v)
        return out
    if isinstance(e, SegFn):
        starts = env.params[e.segments]
        return seg_lookup(e.fn, starts, env.length, eval_expr(e.arg, env))  # type: ignore[arg-type]
    if isinstance(e, TableRef):
        tab = np.asarray(env.tables[e.table], dtype=np.int64)
        return tab[eval_expr(e.index, env)]
    raise TypeError(f"not an expression: {e!r}")


def eval_pred(p: Pred, env: Env) -> Any:
    if isinstance(p, BoolConst):
        return np.bool_(p.value)
    if isinstance(p, Cmp):
        a, b = eval_expr(p.a, env), eval_expr(p.b, env)
        return {
            "<": np.less,
            "<=": np.less_equal,
            ">": np.greater,
            ">=": np.greater_equal,
            "==": np.equal,
            "!=": np.not_equal,
        }[p.op](a, b)
    if isinstance(p, And):
        out: Any = np.bool_(True)
        for x in p.items:
            out = np.logical_and(out, eval_pred(x, env))
        return out
    if isinstance(p, Or):
        out = np.bool_(False)
        for x in p.items:
            out = np.logical_or(out, eval_pred(x, env))
        return out
    if isinstance(p, Not):
        return np.logical_not(eval_pred(p.a, env))
    if isinstance(p, Same):
        starts = env.params[p.segments]
        a = seg_lookup("seg", starts, env.length, eval_expr(p.a, env))  # type: ignore[arg-type]
        b = seg_lookup("seg", starts, env.length, eval_expr(p.b, env))  # type: ignore[arg-type]
        return np.equal(a, b)
    raise TypeError(f"not a predicate: {p!r}")
