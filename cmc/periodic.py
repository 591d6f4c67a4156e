"""Masks read along the diagonal, tile by tile: the proofs behind per-offset tile masks.

`shift_invariance(pred, step)`: whether moving q and k together by `step` (the tile) leaves
pred unchanged, so that the mask of a (query tile, key tile) pair depends only on their
offset. Each expression's change under the move is computed exactly (q and k change by
step, `x / m` by the change of x over m when m divides it, `x % m` by nothing then); a
comparison must see both sides change alike. This holds for every function of q - k (a
dilated band) and for tile-aligned block patterns (`k / 128 == q / 128`, `k % 128 >= 112`).

`tail_period(pred, side, step)`: whether those tile masks repeat, with a period of P tiles,
once the key tile lies t >= start tiles behind the query tile (side +1) or ahead of it
(side -1): a strided or dilated causal mask reaches every key tile behind the query, and one
period of masks then serves them all. The pair (query tile t, key tile 0) stands for offset
-t (side +1; the roles swap for side -1): its q = step t + r and k = c, r and c within the
tile. Every expression is read as slope x t plus a part that is P-periodic in t and bounded
over all r, c; `/ m` and `% m` keep that form when slope x P is a multiple of m; `min`, `max`,
`abs` and comparisons whose two sides grow at different rates settle past a threshold on t.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from fractions import Fraction

from .ir import And, BinOp, BoolConst, Call, Cmp, Const, Expr, Neg, Not, Or, Pred, Var, nodes
from .render import expr_str, pred_str

MAX_PERIOD = 1 << 12  # tiles; a longer period is "not periodic" here


# ------------------------------------------------------------------------- shift invariance


class _Moves(Exception):
    """Why a predicate changes when q and k move together."""


def _change(e: Expr, step: int) -> int:
    """How much e changes when q and k both grow by step, or _Moves."""
    if isinstance(e, Const):
        return 0
    if isinstance(e, Var):
        if e.name in ("q", "k"):
            return step
        raise _Moves(f"it reads {e.name}")
    if isinstance(e, Neg):
        return -_change(e.a, step)
    if isinstance(e, BinOp):
        a, b = _change(e.a, step), _change(e.b, step)
        if e.op == "+":
            return a + b
        if e.op == "-":
            return a - b
        if e.op == "*":
            if isinstance(e.a, Const):
                return e.a.value * b
            if isinstance(e.b, Const):
                return a * e.b.value
            if a == 0 and b == 0:
                return 0
            raise _Moves(f"{expr_str(e)} multiplies terms that move")
        if not isinstance(e.b, Const):
            raise _Moves(f"{expr_str(e)} divides by a term that is not a constant")
        m = e.b.value
        if m == 0:  # x / 0 == 0, x % 0 == x (docs/language.md)
            return 0 if e.op == "/" else a
        if a % m != 0:
            raise _Moves(f"{expr_str(e.a)} moves by {a}, which {m} does not divide")
        return a // m if e.op == "/" else 0
    if isinstance(e, Call):
        moves = {_change(x, step) for x in e.args}
        if e.fn == "abs":
            if moves != {0}:
                raise _Moves(f"{expr_str(e)} takes abs of a term that moves")
            return 0
        if len(moves) != 1:
            raise _Moves(f"{expr_str(e)} compares terms that move apart")
        return moves.pop()
    raise _Moves(f"it reads {expr_str(e)}")


def _check_shift(p: Pred, step: int) -> None:
    if isinstance(p, BoolConst):
        return
    if isinstance(p, Cmp):
        if _change(p.a, step) != _change(p.b, step):
            raise _Moves(f"{pred_str(p)} changes when q and k move together by {step}")
        return
    if isinstance(p, (And, Or)):
        for x in p.items:
            _check_shift(x, step)
        return
    if isinstance(p, Not):
        _check_shift(p.a, step)
        return
    raise _Moves(f"it reads {pred_str(p)}")


def shift_invariance(p: Pred, step: int) -> str | None:
    """None when p(q + step, k + step) == p(q, k) for all q, k; else why that is not shown."""
    try:
        _check_shift(p, step)
    except _Moves as e:
        return str(e)
    return None


# ------------------------------------------------------------------------------- the tails


@dataclass(frozen=True)
class Tail:
    """The tile masks at t and t + period tiles from the diagonal are equal for t >= start."""

    side: int  # +1: key tiles behind the query tile (offset -t), -1: ahead of it (offset t)
    period: int  # tiles
    start: int  # tiles


class _NotPeriodic(Exception):
    def __init__(self, reason: str, factor: int = 1) -> None:
        super().__init__(reason)
        self.factor = factor  # a period this many times longer may succeed


@dataclass(frozen=True)
class _Form:
    """slope t + w(t), with w P-periodic in t and within [lo, hi] (for t past the threshold)."""

    slope: Fraction
    lo: Fraction
    hi: Fraction

    @property
    def const(self) -> Fraction | None:
        return self.lo if self.slope == 0 and self.lo == self.hi else None


_ZERO = Fraction(0)


@dataclass
class _Reader:
    side: int
    step: int
    period: int
    threshold: Fraction = field(default=_ZERO)  # t past which every settled choice holds

    def past(self, t: Fraction) -> None:
        self.threshold = max(self.threshold, t)

    def expr(self, e: Expr) -> _Form:
        if isinstance(e, Const):
            return _Form(_ZERO, Fraction(e.value), Fraction(e.value))
        if isinstance(e, Var) and e.name in ("q", "k"):
            # the query tile t (side +1) or the key tile t (side -1); the other is tile 0
            grows = (e.name == "q") == (self.side == 1)
            return _Form(Fraction(self.step if grows else 0), _ZERO, Fraction(self.step - 1))
        if isinstance(e, Neg):
            a = self.expr(e.a)
            return _Form(-a.slope, -a.hi, -a.lo)
        if isinstance(e, BinOp):
            return self.binop(e)
        if isinstance(e, Call):
            return self.call(e)
        raise _NotPeriodic(f"it reads {expr_str(e)}")

    def binop(self, e: BinOp) -> _Form:
        a, b = self.expr(e.a), self.expr(e.b)
        if e.op == "+":
            return _Form(a.slope + b.slope, a.lo + b.lo, a.hi + b.hi)
        if e.op == "-":
            return _Form(a.slope - b.slope, a.lo - b.hi, a.hi - b.lo)
        if e.op == "*":
            for c, x in ((a.const, b), (b.const, a)):
                if c is not None:
                    lo, hi = sorted((c * x.lo, c * x.hi))
                    return _Form(c * x.slope, lo, hi)
            if a.slope != 0 or b.slope != 0:
                raise _NotPeriodic("a product of two terms that grow along the diagonal")
            ends = [x * y for x in (a.lo, a.hi) for y in (b.lo, b.hi)]
            return _Form(_ZERO, min(ends), max(ends))
        m = b.const
        if m is None or m.denominator != 1:
            raise _NotPeriodic("division or remainder by a non-constant")
        if m == 0:  # x / 0 == 0, x % 0 == x (docs/language.md)
            return _Form(_ZERO, _ZERO, _ZERO) if e.op == "/" else a
        if m < 0:
            raise _NotPeriodic("division or remainder by a negative constant")
        growth = a.slope * self.period / m  # the quotient's growth over one period
        if growth.denominator != 1:
            raise _NotPeriodic(f"a period of {self.period} tiles does not carry {m} whole",
                               factor=growth.denominator)
        if e.op == "/":
            return _Form(a.slope / m, (a.lo - m + 1) / m, a.hi / m)
        if a.slope == 0 and a.lo >= 0 and a.hi < m:
            return a  # x % m == x
        return _Form(_ZERO, _ZERO, m - 1)

    def call(self, e: Call) -> _Form:
        args = [self.expr(a) for a in e.args]
        if e.fn == "abs":
            x = args[0]
            if x.slope > 0:
                self.past(-x.lo / x.slope)  # x >= 0 from here on
                return x
            if x.slope < 0:
                self.past(x.hi / -x.slope)
                return _Form(-x.slope, -x.hi, -x.lo)
            lo = _ZERO if x.lo <= 0 <= x.hi else min(abs(x.lo), abs(x.hi))
            return _Form(_ZERO, lo, max(abs(x.lo), abs(x.hi)))
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
        return _Form(a.slope, f(a.lo, b.lo), f(a.hi, b.hi))

    def pred(self, p: Pred) -> None:
        """Reads p; every comparison either keeps the period or settles past the threshold."""
        if isinstance(p, BoolConst):
            return
        if isinstance(p, Cmp):
            a, b = self.expr(p.a), self.expr(p.b)
            s, lo, hi = a.slope - b.slope, a.lo - b.hi, a.hi - b.lo
            if s != 0:  # a - b takes the slope's sign once |s| t exceeds the periodic part
                self.past((-lo if s > 0 else hi) / abs(s))
            return
        if isinstance(p, (And, Or)):
            for x in p.items:
                self.pred(x)
            return
        if isinstance(p, Not):
            self.pred(p.a)
            return
        raise _NotPeriodic(f"it reads {pred_str(p)}")


def _base_period(p: Pred, step: int) -> int:
    """The lcm, over every constant m the predicate divides or reduces by, of the tiles a
    term growing by step a tile needs to grow by a multiple of m."""
    ms = [abs(x.b.value) for x in nodes(p) if isinstance(x, BinOp) and x.op in ("/", "%")
          and isinstance(x.b, Const) and x.b.value != 0]
    return math.lcm(1, *(m // math.gcd(m, step) for m in ms))


def tail_period(p: Pred, side: int, step: int) -> Tail | str:
    """The tail of p's tile masks on one side of the diagonal (p shift-invariant by step),
    or why none was proved."""
    period = _base_period(p, step)
    while True:
        if period > MAX_PERIOD:
            return f"its period would exceed {MAX_PERIOD} tiles"
        reader = _Reader(side, step, period)
        try:
            reader.pred(p)
        except _NotPeriodic as e:
            if e.factor > 1:
                period *= e.factor
                continue
            return str(e)
        return Tail(side, period, math.floor(reader.threshold) + 1)
