"""Eventually periodic masks of q - k: the proof behind offset tile masks whose offsets are
unbounded (a strided or dilated causal mask: `k <= q and (q - k) % 128 == 0`).

`tail_period(pred, side)` proves that pred, a predicate over d = q - k, repeats with a
period P for every d >= start (side +1) or every d <= -start (side -1), or says why not.
Along the tail, t = side * d >= T, every integer expression is read as slope * t + w(t)
with w P-periodic and bounded. Floor division and remainder by a constant m keep that form
when slope * P is a multiple of m; min, max, abs and comparisons whose two sides' slopes
differ are settled past a threshold on t (after which they pick one side, or are constant);
everything else keeps the period. The tile stage (cmc/tiling.py offset_masks) then needs
only one period of tile masks past the start.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from fractions import Fraction

from .ir import And, BinOp, BoolConst, Call, Cmp, Const, Expr, Neg, Not, Or, Pred, Var, nodes

MAX_PERIOD = 1 << 16  # tokens; a longer period is "not periodic" here


@dataclass(frozen=True)
class Tail:
    """pred(d + period) == pred(d) for every d with side * d >= start."""

    side: int  # +1: d -> +infinity (keys below the diagonal), -1: d -> -infinity
    period: int
    start: int


class _NotPeriodic(Exception):
    def __init__(self, reason: str, factor: int = 1) -> None:
        super().__init__(reason)
        self.factor = factor  # a period this many times longer may succeed


@dataclass(frozen=True)
class _Form:
    """cq q + ck k + slope t + w(t), w P-periodic in [lo, hi] (for t >= the threshold)."""

    cq: Fraction
    ck: Fraction
    slope: Fraction
    lo: Fraction
    hi: Fraction

    @property
    def const(self) -> Fraction | None:
        plain = self.cq == 0 and self.ck == 0 and self.slope == 0 and self.lo == self.hi
        return self.lo if plain else None


_ZERO = Fraction(0)


def _const(v: Fraction) -> _Form:
    return _Form(_ZERO, _ZERO, _ZERO, v, v)


@dataclass
class _Reader:
    side: int
    period: int
    threshold: Fraction = field(default=_ZERO)  # t past which every settled choice holds

    def past(self, t: Fraction) -> None:
        self.threshold = max(self.threshold, t)

    def fold(self, f: _Form) -> _Form:
        """f as a function of t alone: its q and k must cancel (q - k = side t)."""
        if f.cq + f.ck != 0:
            raise _NotPeriodic("an operand is not a function of q - k")
        return _Form(_ZERO, _ZERO, f.slope + f.cq * self.side, f.lo, f.hi)

    def expr(self, e: Expr) -> _Form:
        if isinstance(e, Const):
            return _const(Fraction(e.value))
        if isinstance(e, Var) and e.name in ("q", "k"):
            one = Fraction(1)
            return _Form(one if e.name == "q" else _ZERO, one if e.name == "k" else _ZERO,
                         _ZERO, _ZERO, _ZERO)
        if isinstance(e, Neg):
            a = self.expr(e.a)
            return _Form(-a.cq, -a.ck, -a.slope, -a.hi, -a.lo)
        if isinstance(e, BinOp):
            return self.binop(e)
        if isinstance(e, Call):
            return self.call(e)
        raise _NotPeriodic(f"it reads {type(e).__name__}")

    def binop(self, e: BinOp) -> _Form:
        a, b = self.expr(e.a), self.expr(e.b)
        if e.op in "+-":
            s = 1 if e.op == "+" else -1
            lo, hi = (b.lo, b.hi) if s == 1 else (-b.hi, -b.lo)
            return _Form(a.cq + s * b.cq, a.ck + s * b.ck, a.slope + s * b.slope,
                         a.lo + lo, a.hi + hi)
        if e.op == "*":
            for c, x in ((a.const, b), (b.const, a)):
                if c is not None:
                    lo, hi = sorted((c * x.lo, c * x.hi))
                    return _Form(c * x.cq, c * x.ck, c * x.slope, lo, hi)
            a, b = self.fold(a), self.fold(b)
            if a.slope != 0 or b.slope != 0:
                raise _NotPeriodic("a product of two terms that grow along the diagonal")
            ends = [x * y for x in (a.lo, a.hi) for y in (b.lo, b.hi)]
            return _Form(_ZERO, _ZERO, _ZERO, min(ends), max(ends))
        m = b.const
        if m is None or m.denominator != 1:
            raise _NotPeriodic("division or remainder by a non-constant")
        if m == 0:  # x / 0 == 0, x % 0 == x (docs/language.md)
            return _const(_ZERO) if e.op == "/" else a
        if m < 0:
            raise _NotPeriodic("division or remainder by a negative constant")
        x = self.fold(a)
        step = x.slope * self.period / m  # the quotient's growth over one period
        if step.denominator != 1:
            raise _NotPeriodic(f"a period of {self.period} does not carry {m} whole",
                               factor=step.denominator)
        q = _Form(_ZERO, _ZERO, x.slope / m, (x.lo - m + 1) / m, x.hi / m)
        if e.op == "/":
            return q
        if x.slope == 0 and x.lo >= 0 and x.hi < m:
            return x  # x % m == x
        return _Form(_ZERO, _ZERO, _ZERO, _ZERO, m - 1)

    def call(self, e: Call) -> _Form:
        args = [self.fold(self.expr(a)) for a in e.args]
        if e.fn == "abs":
            x = args[0]
            if x.slope > 0:
                self.past(-x.lo / x.slope)  # x >= 0 from here on
                return x
            if x.slope < 0:
                self.past(x.hi / -x.slope)
                return _Form(_ZERO, _ZERO, -x.slope, -x.hi, -x.lo)
            lo = _ZERO if x.lo <= 0 <= x.hi else min(abs(x.lo), abs(x.hi))
            return _Form(_ZERO, _ZERO, _ZERO, lo, max(abs(x.lo), abs(x.hi)))
        out = args[0]
        for y in args[1:]:
            out = self.pick(out, y, e.fn == "min")
        return out

    def pick(self, a: _Form, b: _Form, smaller: bool) -> _Form:
        """min (smaller) or max of a and b along the tail."""
        s = a.slope - b.slope
        if s != 0:
            # a - b = s t + (a.w - b.w): its sign is s's once t passes the bound
            self.past((b.hi - a.lo) / s if s > 0 else (b.lo - a.hi) / s)
            return b if (s > 0) == smaller else a
        f = min if smaller else max
        return _Form(_ZERO, _ZERO, a.slope, f(a.lo, b.lo), f(a.hi, b.hi))

    def pred(self, p: Pred) -> Pred:
        """p with every comparison that settles along the tail replaced by its constant."""
        if isinstance(p, BoolConst):
            return p
        if isinstance(p, Cmp):
            a, b = self.expr(p.a), self.expr(p.b)
            h = self.fold(_Form(a.cq - b.cq, a.ck - b.ck, a.slope - b.slope, a.lo - b.hi,
                                a.hi - b.lo))
            if h.slope == 0:
                return p
            # h's sign is the slope's once |slope| t exceeds the periodic part
            self.past((-h.lo if h.slope > 0 else h.hi) / abs(h.slope))
            positive = h.slope > 0
            value = {"<": not positive, "<=": not positive, ">": positive, ">=": positive,
                     "==": False, "!=": True}[p.op]
            return BoolConst(value)
        if isinstance(p, (And, Or)):
            return type(p)(tuple(self.pred(x) for x in p.items))
        if isinstance(p, Not):
            return Not(self.pred(p.a))
        raise _NotPeriodic(f"it reads {type(p).__name__}")


def _base_period(p: Pred) -> int:
    """The lcm of every constant the predicate divides or reduces by."""
    return math.lcm(1, *(abs(x.b.value) for x in nodes(p) if isinstance(x, BinOp)
                         and x.op in ("/", "%") and isinstance(x.b, Const) and x.b.value != 0))


def tail_period(p: Pred, side: int) -> Tail | str:
    """The tail of p (a predicate whose comparisons are functions of q - k) on one side of
    the diagonal, or why none was proved."""
    period = _base_period(p)
    while True:
        if period > MAX_PERIOD:
            return f"its period along q - k would exceed {MAX_PERIOD}"
        reader = _Reader(side, period)
        try:
            reader.pred(p)
        except _NotPeriodic as e:
            if e.factor > 1:
                period *= e.factor
                continue
            return str(e)
        return Tail(side, period, math.floor(reader.threshold) + 1)
