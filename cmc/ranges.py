"""Static value ranges of checked expressions, for every q, k, len and parameter value allowed.

check uses them to refuse user arithmetic that could leave int64 (the widest type the
emitted kernels and cmc/evaluate.py compute in), lower to refuse such a bound (the term stays
a residual predicate, evaluated exactly from the mask's own expressions, instead of a bound
that could wrap), and emit to type each expression int32 or int64 by its range.
"""

from __future__ import annotations

from collections.abc import Mapping

from .ir import BinOp, Call, Const, Expr, Neg, ParamRef, SegFn, TableRef, Var

I32_MIN, I32_MAX = -(2**31), 2**31 - 1
I64_MIN, I64_MAX = -(2**63), 2**63 - 1
LEN_MAX = I32_MAX  # documented limit: a sequence holds at most 2**31 - 1 tokens

Range = tuple[int, int]


def fdiv(a: int, b: int) -> int:
    """Floor division with x / 0 == 0 (evaluate's semantics)."""
    return 0 if b == 0 else a // b


def fmod(a: int, b: int) -> int:
    """Its remainder, x % 0 == x."""
    return a if b == 0 else a % b


def mul_range(a: Range, b: Range) -> Range:
    ps = [x * y for x in a for y in b]
    return (min(ps), max(ps))


def div_range(a: Range, b: Range) -> Range:
    if b[0] == b[1]:
        x, y = fdiv(a[0], b[0]), fdiv(a[1], b[0])
        return (min(x, y), max(x, y))
    if b[0] > 0 or b[1] < 0:
        ps = [fdiv(x, y) for x in a for y in b]
        return (min(ps), max(ps))
    m = max(abs(a[0]), abs(a[1]))
    return (-m, m)


def mod_range(a: Range, b: Range) -> Range:
    if b[0] == b[1]:
        c = b[0]
        if c == 0:
            return a
        if fdiv(a[0], c) == fdiv(a[1], c):
            return (a[0] % c, a[1] % c)
        return (0, c - 1) if c > 0 else (c + 1, 0)
    if b[0] > 0:
        return (0, b[1] - 1)
    if b[1] < 0:
        return (b[0] + 1, 0)
    return (min(a[0], b[0] + 1, 0), max(a[1], b[1] - 1, 0))


class RangeEnv:
    """Ranges of the free names: q, k in [0, len), len in [0, LEN_MAX], each int parameter in
    its declared range (as numbers, len at its extremes), a family index in its span."""

    def __init__(self, params: Mapping[str, Range], index: Mapping[str, Range] | None = None,
                 tables: Mapping[str, Range] | None = None):
        self.params = params
        self.index = dict(index or {})
        self.tables = dict(tables or {})


def value_range(e: Expr, env: RangeEnv, seen: list[int] | None = None) -> Range:
    """The smallest and largest value e can take (a sound over-approximation); `seen`, when
    given, is widened to cover every subexpression's range as well."""
    r = _range(e, env, seen)
    if seen is not None:
        seen[0], seen[1] = min(seen[0], r[0]), max(seen[1], r[1])
    return r


def _range(e: Expr, env: RangeEnv, seen: list[int] | None) -> Range:
    if isinstance(e, (Neg, BinOp)):
        kids = [e.a] if isinstance(e, Neg) else [e.a, e.b]
        return step(e, [value_range(x, env, seen) for x in kids], env)
    if isinstance(e, Call):
        return step(e, [value_range(x, env, seen) for x in e.args], env)
    if isinstance(e, SegFn):
        value_range(e.arg, env, seen)
    return step(e, [], env)


def step(e: Expr, args: list[Range], env: RangeEnv) -> Range:
    """The range of e from its operands' ranges (`args`, in operand order; none for a leaf
    or SegFn): one step of value_range, so the checker can range expressions as it builds
    them."""
    if isinstance(e, Const):
        return (e.value, e.value)
    if isinstance(e, Var):
        if e.name in env.index:
            return env.index[e.name]
        if e.name == "len":
            return (0, LEN_MAX)
        return (0, LEN_MAX - 1)
    if isinstance(e, ParamRef):
        return env.params.get(e.name, (I32_MIN, I32_MAX))
    if isinstance(e, Neg):
        lo, hi = args[0]
        return (-hi, -lo)
    if isinstance(e, BinOp):
        a, b = args
        if e.op == "+":
            return (a[0] + b[0], a[1] + b[1])
        if e.op == "-":
            return (a[0] - b[1], a[1] - b[0])
        if e.op == "*":
            return mul_range(a, b)
        if e.op == "/":
            return div_range(a, b)
        return mod_range(a, b)
    if isinstance(e, Call):
        if e.fn == "abs":
            lo, hi = args[0]
            return (lo, hi) if lo >= 0 else (-hi, -lo) if hi <= 0 else (0, max(-lo, hi))
        pick = min if e.fn == "min" else max
        return (pick(r[0] for r in args), pick(r[1] for r in args))
    if isinstance(e, SegFn):
        return (-1, LEN_MAX - 1) if e.fn == "seg" else (0, LEN_MAX)
    if isinstance(e, TableRef):
        return env.tables.get(e.table, (I32_MIN, I32_MAX))
    raise TypeError(e)


def widest_range(e: Expr, env: RangeEnv) -> Range:
    """The union of the ranges of e and of every subexpression (what its arithmetic meets)."""
    seen = [0, 0]
    lo, hi = value_range(e, env, seen)
    return min(lo, seen[0]), max(hi, seen[1])


def fits_int64(e: Expr, env: RangeEnv) -> bool:
    lo, hi = widest_range(e, env)
    return I64_MIN <= lo and hi <= I64_MAX
