"""lower: Mask -> IntervalTable. Proves which key intervals each query row sees.

The predicate is put in negation normal form, k-dependent min/max/abs/!=/same are split
into plain comparisons, and the result is expanded into a disjunction of conjunctions.
In each conjunction, atoms free of k form the row guard; atoms that can be solved for k
give interval bounds; atoms over a 2D grid decomposition k = C + ky*W + kx (CLEAR,
NATTEN) give a family of intervals over a compile-time index; windows over the digits of a
mixed-radix decomposition of k (a video's frames, rows and columns: k / P, k % P / W,
k % W) give the product of the digits' ranges as families, one per value of the digits
above the row, each over the row offset (radix_terms); whatever is left stays a residual
predicate, checked per element, with the reason recorded.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from itertools import product
from math import isqrt

from .ir import (
    FALSE,
    TRUE,
    And,
    BinOp,
    BoolConst,
    Bound,
    Call,
    Cmp,
    CmpOp,
    Const,
    Expr,
    Family,
    GridRow,
    IntervalTable,
    Mask,
    Monotone,
    Neg,
    Not,
    Or,
    ParamRef,
    Pred,
    Residual,
    Same,
    SegFn,
    TableRef,
    Term,
    Var,
    nodes,
)
from .ranges import RangeEnv, fits_int64
from .render import pred_str

MAX_CONJUNCTIONS = 512
# Term instances an emitted kernel holds (a family counts once per index value): the per-CTA
# plan lives in shared memory (cmc/emit.py); past this the table is one catch-all term.
MAX_TERM_INSTANCES = 512
K = "k"

# --------------------------------------------------------------------------- small algebra


def uses(e: Expr | Pred, var: str) -> bool:
    """Does the tree mention Var(var)?"""
    if isinstance(e, Var):
        return e.name == var
    if isinstance(e, (Const, ParamRef, BoolConst)):
        return False
    if isinstance(e, BinOp):
        return uses(e.a, var) or uses(e.b, var)
    if isinstance(e, (Neg, Not)):
        return uses(e.a, var)
    if isinstance(e, Call):
        return any(uses(a, var) for a in e.args)
    if isinstance(e, SegFn):
        return uses(e.arg, var)
    if isinstance(e, TableRef):
        return uses(e.index, var)
    if isinstance(e, Cmp):
        return uses(e.a, var) or uses(e.b, var)
    if isinstance(e, (And, Or)):
        return any(uses(x, var) for x in e.items)
    if isinstance(e, Same):
        return uses(e.a, var) or uses(e.b, var)
    raise TypeError(e)


def add(a: Expr, b: Expr) -> Expr:
    if isinstance(a, Const) and isinstance(b, Const):
        return Const(a.value + b.value)
    if isinstance(b, Const):
        if b.value == 0:
            return a
        if isinstance(a, BinOp) and a.op in "+-" and isinstance(a.b, Const):
            c = a.b.value + b.value if a.op == "+" else -a.b.value + b.value
            return add(a.a, Const(c)) if c else a.a
        if b.value < 0:
            return BinOp("-", a, Const(-b.value))
    if isinstance(a, Const) and a.value == 0:
        return b
    if isinstance(b, Neg):
        return sub(a, b.a)
    return BinOp("+", a, b)


def sub(a: Expr, b: Expr) -> Expr:
    if isinstance(b, Const):
        return add(a, Const(-b.value))
    if a == b:
        return Const(0)
    if isinstance(a, Const) and a.value == 0:
        return neg(b)
    if isinstance(b, Neg):
        return add(a, b.a)
    return BinOp("-", a, b)


def neg(a: Expr) -> Expr:
    if isinstance(a, Const):
        return Const(-a.value)
    if isinstance(a, Neg):
        return a.a
    return Neg(a)


def mul(a: Expr, c: int) -> Expr:
    if c == 1:
        return a
    if c == 0:
        return Const(0)
    if isinstance(a, Const):
        return Const(a.value * c)
    if c == -1:
        return neg(a)
    return BinOp("*", a, Const(c))


def fdiv(a: Expr, c: int) -> Expr:
    if c == 1:
        return a
    if isinstance(a, Const):
        return Const(a.value // c)
    return BinOp("/", a, Const(c))


def emin(items: list[Expr]) -> Expr | None:
    return _fold("min", items)


def emax(items: list[Expr]) -> Expr | None:
    return _fold("max", items)


def _fold(fn: str, items: list[Expr]) -> Expr | None:
    uniq: list[Expr] = []
    for x in items:
        if x not in uniq:
            uniq.append(x)
    consts = [x.value for x in uniq if isinstance(x, Const)]
    rest: list[Expr] = [x for x in uniq if not isinstance(x, Const)]
    if consts:
        rest.append(Const(min(consts) if fn == "min" else max(consts)))
    if not rest:
        return None
    if len(rest) == 1:
        return rest[0]
    return Call(fn, tuple(rest))  # type: ignore[arg-type]


def lin_form(e: Expr) -> tuple[dict[Expr, int], int]:
    """e as sum of coefficient * opaque term + constant (opaque: anything not + - neg *c)."""
    if isinstance(e, Const):
        return {}, e.value
    if isinstance(e, BinOp) and e.op in "+-":
        ta, ca = lin_form(e.a)
        tb, cb = lin_form(e.b)
        s = 1 if e.op == "+" else -1
        out = dict(ta)
        for term, coef in tb.items():
            out[term] = out.get(term, 0) + s * coef
        return {term: coef for term, coef in out.items() if coef}, ca + s * cb
    if isinstance(e, Neg):
        terms, c = lin_form(e.a)
        return {x: -v for x, v in terms.items()}, -c
    if isinstance(e, BinOp) and e.op == "*" and (isinstance(e.a, Const) or isinstance(e.b, Const)):
        k, x = (e.a, e.b) if isinstance(e.a, Const) else (e.b, e.a)
        assert isinstance(k, Const)
        terms, c = lin_form(x)
        return {y: v * k.value for y, v in terms.items() if v * k.value}, c * k.value
    return {e: 1}, 0


def canon(e: Expr) -> Expr:
    """e with every + - neg *c rebuilt by add/sub/neg/mul (so `len - 0` is `len` and
    `(x + 1) + 2` is `x + 3`, also under / % and calls): the same value, fewer spellings."""
    if isinstance(e, BinOp):
        a, b = canon(e.a), canon(e.b)
        if e.op == "+":
            return add(a, b)
        if e.op == "-":
            return sub(a, b)
        if e.op == "*" and isinstance(b, Const):
            return mul(a, b.value)
        if e.op == "*" and isinstance(a, Const):
            return mul(b, a.value)
        if e.op in "/%" and b == Const(1):
            return a if e.op == "/" else Const(0)
        return BinOp(e.op, a, b)
    if isinstance(e, Neg):
        return neg(canon(e.a))
    if isinstance(e, Call):
        return Call(e.fn, tuple(canon(x) for x in e.args))
    if isinstance(e, SegFn):
        return SegFn(e.fn, e.segments, canon(e.arg))
    if isinstance(e, TableRef):
        return TableRef(e.table, canon(e.index))
    return e


def const_difference(a: Expr, b: Expr) -> int | None:
    """a - b when it is the same integer for every q (symbolic cancellation), else None."""
    ta, ca = lin_form(canon(a))
    tb, cb = lin_form(canon(b))
    for t in set(ta) | set(tb):
        if ta.get(t, 0) != tb.get(t, 0):
            return None
    return ca - cb


def linearize(e: Expr, var: str) -> tuple[int, Expr] | None:
    """e == coef * var + rest with rest free of var, or None when var is not linear in e."""
    if not uses(e, var):
        return 0, e
    if isinstance(e, Var):
        return 1, Const(0)
    if isinstance(e, BinOp) and e.op in "+-":
        la, lb = linearize(e.a, var), linearize(e.b, var)
        if la is None or lb is None:
            return None
        if e.op == "+":
            return la[0] + lb[0], add(la[1], lb[1])
        return la[0] - lb[0], sub(la[1], lb[1])
    if isinstance(e, Neg):
        la = linearize(e.a, var)
        return None if la is None else (-la[0], neg(la[1]))
    if isinstance(e, BinOp) and e.op == "*":
        for c, x in ((e.a, e.b), (e.b, e.a)):
            if isinstance(c, Const):
                lx = linearize(x, var)
                return None if lx is None else (lx[0] * c.value, mul(lx[1], c.value))
    return None


def substitute(e: Expr, fn: Callable[[Expr], Expr | None]) -> Expr:
    """Bottom-up rewrite: fn returns a replacement or None to keep the (rebuilt) node."""
    r = fn(e)
    if r is not None:
        return r
    if isinstance(e, BinOp):
        return BinOp(e.op, substitute(e.a, fn), substitute(e.b, fn))
    if isinstance(e, Neg):
        return Neg(substitute(e.a, fn))
    if isinstance(e, Call):
        return Call(e.fn, tuple(substitute(a, fn) for a in e.args))
    if isinstance(e, SegFn):
        return SegFn(e.fn, e.segments, substitute(e.arg, fn))
    if isinstance(e, TableRef):
        return TableRef(e.table, substitute(e.index, fn))
    return e


def map_exprs(p: Pred, fn: Callable[[Expr], Expr]) -> Pred:
    """p with fn applied to each of its expressions (its structure kept)."""
    if isinstance(p, BoolConst):
        return p
    if isinstance(p, Cmp):
        return Cmp(p.op, fn(p.a), fn(p.b))
    if isinstance(p, (And, Or)):
        return type(p)(tuple(map_exprs(x, fn) for x in p.items))
    if isinstance(p, Not):
        return Not(map_exprs(p.a, fn))
    if isinstance(p, Same):
        return Same(p.segments, fn(p.a), fn(p.b))
    raise TypeError(p)


# --------------------------------------------------------------------------- monotonicity


def monotone(e: Expr) -> Monotone:
    """Direction of e as q grows within one sequence (len, params: fixed)."""
    if isinstance(e, (Const, ParamRef, TableRef)):
        return "const" if not uses(e, "q") else "none"
    if isinstance(e, Var):
        return "nondec" if e.name == "q" else "const"
    if isinstance(e, BinOp):
        ma, mb = monotone(e.a), monotone(e.b)
        if e.op == "+":
            return _combine(ma, mb)
        if e.op == "-":
            return _combine(ma, _flip(mb))
        if e.op == "*":
            for c, m in ((e.a, mb), (e.b, ma)):
                if isinstance(c, Const):
                    return m if c.value >= 0 else _flip(m)
            return "const" if ma == mb == "const" else "none"
        if e.op == "/" and isinstance(e.b, Const):
            return ma if e.b.value > 0 else _flip(ma) if e.b.value < 0 else "const"
        return "const" if ma == mb == "const" else "none"
    if isinstance(e, Neg):
        return _flip(monotone(e.a))
    if isinstance(e, Call):
        ms = [monotone(a) for a in e.args]
        if e.fn == "abs":
            return "const" if ms[0] == "const" else "none"
        out: Monotone = "const"
        for m in ms:
            out = _combine(out, m)
        return out
    if isinstance(e, SegFn):
        return monotone(e.arg)  # seg, seg_start, seg_end are non-decreasing in their argument
    raise TypeError(e)


def _flip(m: Monotone) -> Monotone:
    return {"nondec": "noninc", "noninc": "nondec"}.get(m, m)  # type: ignore[return-value]


def _combine(a: Monotone, b: Monotone) -> Monotone:
    if a == "const":
        return b
    if b == "const":
        return a
    return a if a == b else "none"


# --------------------------------------------------------------------------- normal forms

_NEG: dict[str, CmpOp] = {"<": ">=", "<=": ">", ">": "<=", ">=": "<", "==": "!=", "!=": "=="}
_FLIP: dict[str, CmpOp] = {"<": ">", "<=": ">=", ">": "<", ">=": "<=", "==": "==", "!=": "!="}


def nnf(p: Pred, negate: bool = False) -> Pred:
    """Negation normal form, with k-dependent !=, same and not-same made plain comparisons."""
    if isinstance(p, BoolConst):
        return BoolConst(p.value != negate)
    if isinstance(p, Not):
        return nnf(p.a, not negate)
    if isinstance(p, And):
        items = tuple(nnf(x, negate) for x in p.items)
        return Or(items) if negate else And(items)
    if isinstance(p, Or):
        items = tuple(nnf(x, negate) for x in p.items)
        return And(items) if negate else Or(items)
    if isinstance(p, Cmp):
        op = _NEG[p.op] if negate else p.op
        if op == "!=" and uses(p, K):
            return Or((Cmp("<", p.a, p.b), Cmp(">", p.a, p.b)))
        window = _abs_window(op, p.a, p.b)
        return window if window is not None else Cmp(op, p.a, p.b)
    if isinstance(p, Same):
        # same(S, X, k) <=> seg_start(S, X) <= k < seg_end(S, X) holds because 0 <= k < len;
        # for another k-expression E outside [0, len) it would not (seg extends past both ends)
        ka, kb = p.a == Var(K), p.b == Var(K)
        if ka != kb and not uses(p.b if ka else p.a, K):
            x, e = (p.b, p.a) if ka else (p.a, p.b)
            lo, hi = SegFn("seg_start", p.segments, x), SegFn("seg_end", p.segments, x)
            if negate:
                return Or((Cmp("<", e, lo), Cmp(">=", e, hi)))
            return And((Cmp(">=", e, lo), Cmp("<", e, hi)))
        return Not(p) if negate else p
    raise TypeError(p)


def _digit_abs(e: Expr) -> Expr | None:
    """X of abs(X) when X reads a digit of k (k under / or %), else None."""
    if not (isinstance(e, Call) and e.fn == "abs" and len(e.args) == 1):
        return None
    x = e.args[0]
    if any(isinstance(n, BinOp) and n.op in "/%" and uses(n.a, K) for n in nodes(x)):
        return x
    return None


def _abs_window(op: CmpOp, a: Expr, b: Expr) -> Pred | None:
    """abs(X) op R (or R op abs(X)), R free of k, X over a digit of k, as comparisons of X:
    |X| <= R is -R <= X <= R (empty when R < 0), |X| >= R is X >= R or X <= -R, and the
    strict forms alike. One window instead of a case split per sign, so that a
    neighbourhood over mixed-radix digits (|qt - kt| <= RT, ...) stays one conjunction,
    whose family has one interval per offset (see radix_terms). Only digit windows are
    rewritten: a plain |q - k| <= W lowers to the same keys either way."""
    x, r = _digit_abs(a), b
    if x is None:
        x, r, op = _digit_abs(b), a, _FLIP[op]
    if x is None or uses(r, K):
        return None
    if op in ("<", "<="):
        return And((Cmp(op, x, r), Cmp(_FLIP[op], x, neg(r))))
    if op in (">", ">="):
        return Or((Cmp(op, x, r), Cmp(_FLIP[op], x, neg(r))))
    return None


class TooManyCases(Exception):
    """Splitting k-dependent min/max/abs would exceed the case budget (see split_k_calls)."""


def split_k_calls(p: Pred, budget: list[int] | None = None) -> Pred:
    """Replace each k-dependent min/max/abs inside a comparison by a case split.

    Each split doubles the cases, so the work is counted as it is done: past
    MAX_CONJUNCTIONS splits in all (the DNF could never stay under its own limit then),
    TooManyCases is raised before the tree grows any further."""
    if budget is None:
        budget = [MAX_CONJUNCTIONS]
    if isinstance(p, (And, Or)):
        return type(p)(tuple(split_k_calls(x, budget) for x in p.items))
    if not isinstance(p, Cmp) or not uses(p, K):
        return p
    for side in (p.a, p.b):
        for sub_e in nodes(side):
            if isinstance(sub_e, Call) and uses(sub_e, K):
                budget[0] -= 1
                if budget[0] < 0:
                    raise TooManyCases
                return split_k_calls(_case_split(p, sub_e), budget)
    return p


def k_call_count(p: Pred) -> int:
    """k-dependent min/max/abs calls of the predicate (each doubles the cases)."""
    return sum(1 for x in nodes(p) if isinstance(x, Call) and uses(x, K))


def _case_split(p: Cmp, call: Call) -> Pred:
    def repl(by: Expr) -> Cmp:
        def f(e: Expr) -> Expr | None:
            return by if e == call else None

        return Cmp(p.op, substitute(p.a, f), substitute(p.b, f))

    if call.fn == "abs":
        x = call.args[0]
        return Or((And((Cmp(">=", x, Const(0)), repl(x))), And((Cmp("<", x, Const(0)), repl(neg(x))))))
    a = call.args[0]
    b = call.args[1] if len(call.args) == 2 else Call(call.fn, call.args[1:])
    take_a: CmpOp = "<=" if call.fn == "min" else ">="
    take_b: CmpOp = ">" if call.fn == "min" else "<"
    return Or((And((Cmp(take_a, a, b), repl(a))), And((Cmp(take_b, a, b), repl(b)))))


def dnf(p: Pred) -> list[list[Pred]] | None:
    """Disjunction of conjunctions of atoms, or None when it would exceed MAX_CONJUNCTIONS."""
    if isinstance(p, BoolConst):
        return [[]] if p.value else []
    if isinstance(p, Or):
        out: list[list[Pred]] = []
        for x in p.items:
            d = dnf(x)
            if d is None:
                return None
            out.extend(d)
            if len(out) > MAX_CONJUNCTIONS:
                return None
        return out
    if isinstance(p, And):
        acc: list[list[Pred]] = [[]]
        for x in p.items:
            d = dnf(x)
            if d is None:
                return None
            if len(acc) * len(d) > MAX_CONJUNCTIONS:
                return None
            acc = [a + b for a in acc for b in d]
        return acc
    return [[p]]


# --------------------------------------------------------------------------- solving for k


@dataclass(frozen=True)
class Lo:
    """var >= expr"""

    expr: Expr


@dataclass(frozen=True)
class Hi:
    """var < expr"""

    expr: Expr


Constraint = Lo | Hi


def _base(op: str, r: Expr) -> list[Constraint]:
    if op == "<":
        return [Hi(r)]
    if op == "<=":
        return [Hi(add(r, Const(1)))]
    if op == ">":
        return [Lo(add(r, Const(1)))]
    if op == ">=":
        return [Lo(r)]
    if op == "==":
        return [Lo(r), Hi(add(r, Const(1)))]
    raise ValueError(op)


def isolate(e: Expr, op: str, r: Expr, var: str) -> list[Constraint] | None:
    """Solve `e op r` (r free of var) for var; None when e is not invertible in var."""
    if isinstance(e, Var) and e.name == var:
        return _base(op, r)
    if isinstance(e, BinOp):
        ua, ub = uses(e.a, var), uses(e.b, var)
        if e.op == "+" and ua != ub:
            return isolate(e.a, op, sub(r, e.b), var) if ua else isolate(e.b, op, sub(r, e.a), var)
        if e.op == "-" and ua != ub:
            if ua:
                return isolate(e.a, op, add(r, e.b), var)
            return isolate(e.b, _FLIP[op], sub(e.a, r), var)
        if e.op == "*" and ua != ub:
            c, x = (e.b, e.a) if ua else (e.a, e.b)
            if isinstance(c, Const) and c.value != 0:
                return _isolate_scaled(x, c.value, op, r, var)
            return None
        if e.op == "/" and ua and not ub and isinstance(e.b, Const) and e.b.value != 0:
            d = e.b.value
            if d < 0:
                return isolate(BinOp("/", neg(e.a), Const(-d)), op, r, var)
            return _isolate_floordiv(e.a, d, op, r, var)
        if e.op in "+-" and ua and ub:
            lin = linearize(e, var)
            if lin is not None and lin[0] != 0:
                return _isolate_scaled(Var(var), lin[0], op, sub(r, lin[1]), var)
            # A - x % C with A - x free of var: (x / C) * C + (A - x), floor division (the
            # chunk start of x: Llama 4's chunks written `q - k <= q % C`, transposed)
            b = e.b
            if (e.op == "-" and isinstance(b, BinOp) and b.op == "%" and isinstance(b.b, Const)
                    and b.b.value > 0):
                rest = linearize(sub(e.a, b.a), var)
                if rest is not None and rest[0] == 0:
                    return isolate(mul(fdiv(b.a, b.b.value), b.b.value), op, sub(r, rest[1]),
                                   var)
            return None
        return None
    if isinstance(e, Neg):
        return isolate(e.a, _FLIP[op], neg(r), var)
    if isinstance(e, SegFn) and e.fn in ("seg_start", "seg_end") and e.arg == Var(K) and var == K:
        return _isolate_segment_end(e, op, r)
    if isinstance(e, SegFn) and e.fn == "seg" and isinstance(r, SegFn) and r.fn == "seg":
        if r.segments != e.segments or e.arg != Var(K) or var != K:
            return None  # exact only for seg(S, k) itself (see nnf)
        lo, hi = SegFn("seg_start", e.segments, r.arg), SegFn("seg_end", e.segments, r.arg)
        parts = {"==": [(">=", lo), ("<", hi)], "<=": [("<", hi)], "<": [("<", lo)],
                 ">=": [(">=", lo)], ">": [(">=", hi)]}[op]
        out: list[Constraint] = []
        for o, bound in parts:
            got = isolate(e.arg, o, bound, var)
            if got is None:
                return None
            out += got
        return out
    return None


def _isolate_segment_end(e: SegFn, op: str, r: Expr) -> list[Constraint] | None:
    """seg_start(S, k) <= r is k < seg_end(S, r) (the keys before the first start after r),
    and seg_end(S, k) > r is k >= seg_start(S, r) (no start in (k, r]), where r = q + c: the
    first for c >= 0 (r >= 0), the second for c <= 0 (r < len); `<` and `>=` by r - 1. The
    transposed documents written `seg_start(S, q) <= k <= q` need them. None elsewhere."""
    lin = linearize(r, "q")
    c = lin[1].value if lin is not None and lin[0] == 1 and isinstance(lin[1], Const) else None
    if c is None:
        return None
    if e.fn == "seg_start" and op in ("<=", "<"):
        at = c - (op == "<")  # seg_start(S, k) <= q + at
        return [Hi(SegFn("seg_end", e.segments, add(Var("q"), Const(at))))] if at >= 0 else None
    if e.fn == "seg_end" and op in (">", ">="):
        at = c - (op == ">=")  # seg_end(S, k) > q + at
        return [Lo(SegFn("seg_start", e.segments, add(Var("q"), Const(at))))] if at <= 0 else None
    return None


def _isolate_scaled(x: Expr, c: int, op: str, r: Expr, var: str) -> list[Constraint] | None:
    """c*x op r, c != 0 constant."""
    if c < 0:
        return _isolate_scaled(x, -c, _FLIP[op], neg(r), var)
    if c == 1:
        return isolate(x, op, r, var)
    ceil_r = fdiv(add(r, Const(c - 1)), c)
    floor_r = fdiv(r, c)
    if op == "<":
        return isolate(x, "<", ceil_r, var)
    if op == "<=":
        return isolate(x, "<=", floor_r, var)
    if op == ">":
        return isolate(x, ">", floor_r, var)
    if op == ">=":
        return isolate(x, ">=", ceil_r, var)
    a, b = isolate(x, ">=", ceil_r, var), isolate(x, "<=", floor_r, var)
    return None if a is None or b is None else a + b


def _isolate_floordiv(x: Expr, d: int, op: str, r: Expr, var: str) -> list[Constraint] | None:
    """floor(x / d) op r, d > 0 constant."""
    r_lo = mul(r, d)
    r_hi = mul(add(r, Const(1)), d)
    if op == "<=":
        return isolate(x, "<", r_hi, var)
    if op == "<":
        return isolate(x, "<", r_lo, var)
    if op == ">=":
        return isolate(x, ">=", r_lo, var)
    if op == ">":
        return isolate(x, ">=", r_hi, var)
    a, b = isolate(x, ">=", r_lo, var), isolate(x, "<", r_hi, var)
    return None if a is None or b is None else a + b


def solve_atom(atom: Pred, var: str) -> list[Constraint] | None:
    if not isinstance(atom, Cmp):
        return None
    ua, ub = uses(atom.a, var), uses(atom.b, var)
    if ua and not ub:
        return isolate(atom.a, atom.op, atom.b, var)
    if ub and not ua:
        return isolate(atom.b, _FLIP[atom.op], atom.a, var)
    if ua and ub:
        return isolate(BinOp("-", atom.a, atom.b), atom.op, Const(0), var)
    return None


# --------------------------------------------------------------------------- guards


def simplify_guard(atoms: list[Pred]) -> Pred:
    """And of k-free atoms, dropping those decided by 0 <= q (e.g. `q < 0` with CONTEXT = 0)."""
    out: list[Pred] = []
    for a in atoms:
        v = _decide_by_q_range(a)
        if v is False:
            return FALSE
        if v is None:
            out.append(a)
    if not out:
        return TRUE
    return out[0] if len(out) == 1 else And(tuple(out))


def _decide_by_q_range(a: Pred) -> bool | None:
    if isinstance(a, BoolConst):
        return a.value
    if not isinstance(a, Cmp):
        return None
    ca, cb = _const_value(a.a), _const_value(a.b)
    if ca is not None and cb is not None:  # e.g. `0 >= W - K` from a case split
        return {"<": ca < cb, "<=": ca <= cb, ">": ca > cb, ">=": ca >= cb,
                "==": ca == cb, "!=": ca != cb}[a.op]
    if isinstance(a.a, Var) and a.a.name == "q" and isinstance(a.b, Const):
        c, op = a.b.value, a.op
    elif isinstance(a.b, Var) and a.b.name == "q" and isinstance(a.a, Const):
        c, op = a.a.value, _FLIP[a.op]
    else:
        return None
    # q op c, with q >= 0 for every row
    if op == "<" and c <= 0 or op == "<=" and c < 0 or op == "==" and c < 0:
        return False
    if op == ">=" and c <= 0 or op == ">" and c < 0 or op == "!=" and c < 0:
        return True
    return None


def _const_value(e: Expr) -> int | None:
    """The value of a constant expression of + - * and negation, else None."""
    if isinstance(e, Const):
        return e.value
    if isinstance(e, Neg):
        v = _const_value(e.a)
        return None if v is None else -v
    if isinstance(e, BinOp) and e.op in "+-*":
        a, b = _const_value(e.a), _const_value(e.b)
        if a is None or b is None:
            return None
        return a + b if e.op == "+" else a - b if e.op == "-" else a * b
    return None


# --------------------------------------------------------------------------- grid families


@dataclass(frozen=True)
class Grid:
    origin: int  # k = origin + ky * width + kx, 0 <= kx < width
    width: int


def find_grid(atoms: list[Pred]) -> Grid | None:
    """The one (origin, width) such that k only occurs as (k - origin) / width, % width or
    linearly. None when k is used in more than one grid or not at all under / or %."""
    grids: set[tuple[int, int]] = set()
    for atom in atoms:
        assert isinstance(atom, Cmp)
        for side in (atom.a, atom.b):
            for e in nodes(side):
                if isinstance(e, BinOp) and e.op in "/%" and uses(e.a, K):
                    if not isinstance(e.b, Const) or e.b.value <= 0:
                        return None
                    lin = linearize(e.a, K)
                    if lin is None and _of_grid_coordinate(e.a):
                        continue  # (kx + S) / M: Swin's windows; its kx is a node of its own
                    if lin is None or lin[0] != 1 or not isinstance(lin[1], Const):
                        return None
                    grids.add((-lin[1].value, e.b.value))
    if len(grids) != 1:
        return None
    origin, width = grids.pop()
    return Grid(origin, width)


def _of_grid_coordinate(e: Expr) -> bool:
    """e reads k only through `/` or `%` of k-linear expressions (grid coordinates), so a
    division of e is one of a coordinate, which grid_term solves after to_grid."""
    def coordinate(x: Expr) -> bool:
        return (isinstance(x, BinOp) and x.op in "/%" and isinstance(x.b, Const)
                and linearize(x.a, K) is not None)

    def reads_k_elsewhere(x: Expr) -> bool:
        if coordinate(x):
            return False
        if isinstance(x, Var):
            return x.name == K
        kids: tuple[Expr, ...] = ()
        if isinstance(x, BinOp):
            kids = (x.a, x.b)
        elif isinstance(x, Neg):
            kids = (x.a,)
        elif isinstance(x, Call):
            kids = x.args
        elif isinstance(x, (SegFn, TableRef)):
            return uses(x, K)
        return any(reads_k_elsewhere(c) for c in kids)

    return uses(e, K) and not reads_k_elsewhere(e)


def to_grid(e: Expr, g: Grid) -> Expr:
    def f(x: Expr) -> Expr | None:
        if isinstance(x, BinOp) and x.op in "/%" and uses(x.a, K) and linearize(x.a, K):
            return Var("ky") if x.op == "/" else Var("kx")
        return None

    return substitute(e, f)


def _square(e: Expr) -> Expr | None:
    if isinstance(e, BinOp) and e.op == "*" and e.a == e.b:
        return e.a
    return None


def match_disc(atom: Cmp) -> tuple[int, Expr, int, Expr, int] | None:
    """(A)*(A) + (B)*(B) < c with A = sy*ky + a0, B = sx*kx + b0, sy, sx = ±1, c constant.

    Returns (sy, a0, sx, b0, c) with the bound made strict (< c)."""
    op, lhs, rhs = atom.op, atom.a, atom.b
    if op in (">", ">="):
        op, lhs, rhs = _FLIP[op], rhs, lhs
    if op not in ("<", "<=") or not isinstance(rhs, Const):
        return None
    c = rhs.value + (1 if op == "<=" else 0)
    if not (isinstance(lhs, BinOp) and lhs.op == "+"):
        return None
    sa, sb = _square(lhs.a), _square(lhs.b)
    if sa is None or sb is None:
        return None
    parts = {}
    for s in (sa, sb):
        for var in ("ky", "kx"):
            if uses(s, var):
                other = "kx" if var == "ky" else "ky"
                lin = linearize(s, var)
                if lin is None or abs(lin[0]) != 1 or uses(lin[1], other) or uses(lin[1], K):
                    return None
                parts[var] = lin
    if set(parts) != {"ky", "kx"}:
        return None
    return parts["ky"][0], parts["ky"][1], parts["kx"][0], parts["kx"][1], c


def _clamp_args(e: Expr, fn: str) -> list[Expr]:
    """The arguments of fn (max or min) where e is fn(...) or fn(...) plus or minus a
    constant, each with that constant: the bounds a clamped row bound is the max / min of."""
    c = 0
    if isinstance(e, BinOp) and e.op in "+-" and isinstance(e.b, Const):
        c, e = (e.b.value if e.op == "+" else -e.b.value), e.a
    if not (isinstance(e, Call) and e.fn == fn):
        return []
    return [add(a, Const(c)) if c else a for a in e.args]


def _row_span(ylo: list[Expr], yhi: list[Expr]) -> tuple[Expr, int] | None:
    """The narrowest pair of grid-row bounds lo <= ky < hi whose width is one constant
    (the family's instance count); the other row bounds stay guards of each instance."""
    best: tuple[Expr, int] | None = None
    for lo in ylo:
        for hi in yhi:
            d = const_difference(hi, lo)
            if d is not None and 0 < d <= 4096 and (best is None or d < best[1]):
                best = (lo, d)
    return best


def grid_term(guard_atoms: list[Pred], k_atoms: list[Pred], g: Grid) -> Term | None:
    """One family term for a conjunction whose k-atoms live on grid g, or None."""
    klo: list[Expr] = []
    khi: list[Expr] = []
    ylo: list[Expr] = []
    yhi: list[Expr] = []
    xlo: list[Expr] = []
    xhi: list[Expr] = []
    disc = None
    for atom in k_atoms:
        assert isinstance(atom, Cmp)
        ga = Cmp(atom.op, to_grid(atom.a, g), to_grid(atom.b, g))
        vs = {v for v in (K, "ky", "kx") if uses(ga, v)}
        if len(vs) == 1:
            (v,) = vs
            got = solve_atom(ga, v)
            if got is None:
                return None
            lo_l, hi_l = {K: (klo, khi), "ky": (ylo, yhi), "kx": (xlo, xhi)}[v]
            for c in got:
                (lo_l if isinstance(c, Lo) else hi_l).append(c.expr)
        elif vs == {"ky", "kx"} and disc is None:
            disc = match_disc(ga)
            if disc is None:
                return None
        else:
            return None
    t = Var("t")
    guards = list(guard_atoms)
    tables: tuple[tuple[str, tuple[int, ...]], ...] = ()
    if disc is not None:
        sy, a0, sx, b0, radius2 = disc
        if radius2 <= 0:
            return None
        ry = isqrt(radius2 - 1)
        count = 2 * ry + 1
        widths = tuple(isqrt(radius2 - 1 - (i - ry) ** 2) for i in range(count))
        dy = sub(t, Const(ry))  # dy = sy*ky + a0  =>  ky = sy*(dy - a0)
        ky = sub(dy, a0) if sy == 1 else sub(add(a0, Const(ry)), t)
        ky_base, ky_step = (sub(neg(a0), Const(ry)), 1) if sy == 1 else (add(a0, Const(ry)), -1)
        w = TableRef("w", t)
        # |sx*kx + b0| <= w  =>  kx in [-w - b0, w - b0] (sx = 1) or [b0 - w, b0 + w] (sx = -1)
        if sx == 1:
            xlo.append(sub(neg(w), b0))
            xhi.append(add(sub(w, b0), Const(1)))
        else:
            xlo.append(sub(b0, w))
            xhi.append(add(add(b0, w), Const(1)))
        tables = (("w", widths),)
        guards += [Cmp(">=", ky, e) for e in ylo] + [Cmp("<", ky, e) for e in yhi]
    else:
        # Row bounds implied by the key bounds, used only when the atoms' own row bounds give
        # no span: k >= 0 and k >= e give ky >= (e - origin) / W; k < len and k < e give
        # ky < (e - origin) / W + 1 (floor division is monotone). The last is one row loose
        # where W divides e - origin: that instance's keys are all >= e, clipped away.
        ylo_k = [Const(-g.origin // g.width)] + [fdiv(sub(e, Const(g.origin)), g.width)
                                                 for e in klo]
        yhi_k = [add(fdiv(sub(e, Const(g.origin)), g.width), Const(1))
                 for e in [*khi, Var("len")]]
        if any(d is not None and d <= 0 for lo_e in ylo + ylo_k for hi_e in yhi + yhi_k
               for d in [const_difference(hi_e, lo_e)]):
            # no grid row for any q (a window clamped past the last row): always empty
            return Term(FALSE, Bound(Const(0), "const"), Bound(Const(0), "const"))
        span = (_row_span(ylo, yhi) or _row_span(ylo_k, yhi) or _row_span(ylo, yhi_k)
                or _row_span(ylo_k, yhi_k))
        if span is None:
            # k < e gives ky <= (e - 1 - origin) / W exactly: `k <= q` beside a one-sided row
            # window (`qy - ky <= R`, a raster-order causal 2D window) bounds the rows by qy,
            # which the loose form above, (q + 1 - origin) / W + 1, does not match
            yhi_t = [add(fdiv(sub(e, Const(g.origin + 1)), g.width), Const(1))
                     for e in [*khi, Var("len")]]
            span = _row_span(ylo, yhi_t) or _row_span(ylo_k, yhi_t)
        if span is None:
            # a row bound clamped by max / min (`max(qy - R, 0) <= ky`): the span of one of
            # its arguments covers it, and the clamped bound stays a guard of each instance
            ylo_a = [a for e in ylo for a in _clamp_args(e, "max")]
            yhi_a = [a for e in yhi for a in _clamp_args(e, "min")]
            if ylo_a or yhi_a:
                span = _row_span(ylo + ylo_a, yhi + yhi_a)
        if span is None:
            return None
        base, count = span
        ky = add(base, t)
        ky_base, ky_step = base, 1
        guards += [Cmp(">=", ky, e) for e in ylo if e != base]
        guards += [Cmp("<", ky, e) for e in yhi if const_difference(e, base) != count]
    row = add(Const(g.origin), mul(ky, g.width))
    x_lo = emax(xlo + [Const(0)])
    x_hi = emin(xhi + [Const(g.width)])
    assert x_lo is not None and x_hi is not None
    lo = emax([add(row, x_lo)] + klo)
    hi = emin([add(row, x_hi)] + khi)
    assert lo is not None and hi is not None
    return Term(
        guard=simplify_guard(guards),
        lo=Bound(lo, monotone(lo) if not uses(lo, "t") else "none"),
        hi=Bound(hi, monotone(hi) if not uses(hi, "t") else "none"),
        family=Family("t", 0, count, tables, GridRow(g.origin, g.width, ky_base, ky_step)),
    )


# --------------------------------------------------------------------------- mixed-radix families


@dataclass(frozen=True)
class Radix:
    """k = origin + sum of d_i * bounds[i] over the digits d_0 .. d_n of k (n = len(bounds)
    - 1): 0 <= d_i < bounds[i + 1] / bounds[i] below the top digit d_n, which is any integer
    (floor division). bounds[0] = 1 and each bound divides the next. A video of frames of
    FH x FW tokens has bounds (1, FW, FH * FW): d_0 = k % FW (the column), d_1 =
    k % (FH * FW) / FW (the row in the frame), d_2 = k / (FH * FW) (the frame)."""

    origin: int
    bounds: tuple[int, ...]


def _k_offset(e: Expr) -> int | None:
    """o when e == k - o (o constant), else None."""
    lin = linearize(e, K)
    if lin is None or lin[0] != 1 or not isinstance(lin[1], Const):
        return None
    return -lin[1].value


def _digit_form(e: Expr) -> tuple[int, int, int | None] | None:
    """(o, lo, hi) when e is the digit ((k - o) mod hi) div lo of k (hi None: no mod):
    (k - o) / lo, (k - o) % hi, (k - o) % hi / lo or (k - o) / lo % (hi / lo)."""
    if not (isinstance(e, BinOp) and e.op in "/%" and isinstance(e.b, Const) and e.b.value > 0):
        return None
    c = e.b.value
    o = _k_offset(e.a)
    if o is not None:
        return (o, c, None) if e.op == "/" else (o, 1, c)
    inner = e.a
    if not (isinstance(inner, BinOp) and inner.op in "/%" and inner.op != e.op
            and isinstance(inner.b, Const) and inner.b.value > 0):
        return None
    o = _k_offset(inner.a)
    d = inner.b.value
    if o is None:
        return None
    if e.op == "/":  # (k - o) % d / c
        return (o, c, d) if c < d and d % c == 0 else None
    return (o, d, d * c) if c > 1 else None  # (k - o) / d % c


def _zero_digit(e: Expr) -> bool:
    """(k - o) % d / c with c >= d > 0, or x % 1: zero for every k (an empty digit, such as
    the row of frames one row high)."""
    if not (isinstance(e, BinOp) and isinstance(e.b, Const) and e.b.value > 0 and uses(e.a, K)):
        return False
    if e.op == "%":
        return e.b.value == 1
    inner = e.a
    return (e.op == "/" and isinstance(inner, BinOp) and inner.op == "%"
            and isinstance(inner.b, Const) and 0 < inner.b.value <= e.b.value)


def find_radix(atoms: list[Pred]) -> Radix | None:
    """The one mixed-radix decomposition of k that every use of k under / or % in the atoms
    is a single digit of, or None (two origins, radices that do not divide each other, a
    digit that spans two of another's, k under / or % in another form)."""
    forms: set[tuple[int, int, int | None]] = set()

    def walk(e: Expr) -> bool:
        if _zero_digit(e):
            return True
        f = _digit_form(e)
        if f is not None:
            forms.add(f)
            return True
        if isinstance(e, BinOp):
            if e.op in "/%" and uses(e.a, K):
                return False
            return walk(e.a) and walk(e.b)
        if isinstance(e, Neg):
            return walk(e.a)
        if isinstance(e, Call):
            return all(walk(a) for a in e.args)
        return not isinstance(e, (SegFn, TableRef)) or not uses(e, K)

    for atom in atoms:
        if not isinstance(atom, Cmp) or not (walk(atom.a) and walk(atom.b)):
            return None
    if not forms or len({f[0] for f in forms}) != 1:
        return None
    bounds = sorted({1} | {f[1] for f in forms} | {f[2] for f in forms if f[2] is not None})
    if any(b % a for a, b in zip(bounds, bounds[1:], strict=False)):
        return None
    for _, lo, hi in forms:
        i = bounds.index(lo)
        if hi != (bounds[i + 1] if i + 1 < len(bounds) else None):
            return None
    return Radix(next(iter(forms))[0], tuple(bounds))


def _digit_var(i: int) -> str:
    return f"kd{i}"


def to_digits(e: Expr, rad: Radix) -> Expr:
    """e with every digit of k replaced by its variable kd<i> (find_radix matched them)."""

    def f(x: Expr) -> Expr | None:
        if _zero_digit(x):
            return Const(0)
        form = _digit_form(x)
        if form is None or form[0] != rad.origin:
            return None
        return Var(_digit_var(rad.bounds.index(form[1])))

    return substitute(e, f)


def radix_terms(guard_atoms: list[Pred], k_atoms: list[Pred], rad: Radix) -> list[Term] | None:
    """A conjunction of windows over the digits of k (a 3D neighbourhood: frames, rows,
    columns) as exact families, or None.

    Each atom must bound one digit (or k itself) alone. The lowest digit (the column) gives
    the key interval; every higher digit must range over a constant count of values from a
    k-free base (a window's width, else the digit's own range [0, radix)). The instances are
    the product of those ranges: one family per value of the digits above the row digit
    d_1, each indexed by d_1, so that every instance keeps its keys in one grid row
    (k - origin) / bounds[1] = base(q) + t, recorded as its GridRow. A radix without a row
    digit (bounds (1,): k / 1, k % 1) is no grid: None."""
    n = len(rad.bounds) - 1
    if n < 1:
        return None
    names = [_digit_var(i) for i in range(n + 1)]
    lows: dict[str, list[Expr]] = {v: [] for v in (K, *names)}
    highs: dict[str, list[Expr]] = {v: [] for v in (K, *names)}
    for atom in k_atoms:
        assert isinstance(atom, Cmp)
        ga = Cmp(atom.op, to_digits(atom.a, rad), to_digits(atom.b, rad))
        vs = [v for v in (K, *names) if uses(ga, v)]
        if not vs:  # k only in an empty digit: a row guard
            guard_atoms = [*guard_atoms, ga]
            continue
        if len(vs) != 1:
            return None
        got = solve_atom(ga, vs[0])
        if got is None:
            return None
        for c in got:
            (lows if isinstance(c, Lo) else highs)[vs[0]].append(c.expr)
    # every digit above the column: (base, count, radix or None for the top digit)
    spans: list[tuple[Expr, int, int | None]] = []
    for i in range(1, n + 1):
        los, his = lows[names[i]], highs[names[i]]
        radix = rad.bounds[i + 1] // rad.bounds[i] if i < n else None
        if radix is None:  # k >= 0 bounds the top digit from below
            span = _row_span(los, his) or _row_span([Const(-rad.origin // rad.bounds[n])], his)
        else:
            span = _row_span(los + [Const(0)], his + [Const(radix)])
        if span is None:
            return None
        spans.append((span[0], span[1], radix))
    total = 1
    for _, count, _ in spans:
        total *= count
    if total > MAX_TERM_INSTANCES:
        return None
    t = Var("t")
    width = rad.bounds[1]
    x_lo = emax(lows[names[0]] + [Const(0)])
    x_hi = emin(highs[names[0]] + [Const(width)])
    assert x_lo is not None and x_hi is not None
    terms: list[Term] = []
    for offsets in product(*(range(c) for _, c, _ in spans[1:])):
        digits = [spans[0][0]] + [add(base, Const(c)) for (base, _, _), c in
                                  zip(spans[1:], offsets, strict=True)]
        guards = list(guard_atoms)
        for i, ((base, count, radix), d) in enumerate(zip(spans, digits, strict=True), 1):
            digit = add(d, t) if i == 1 else d
            guards += [Cmp(">=", digit, e) for e in lows[names[i]] if e != base]
            guards += [Cmp("<", digit, e) for e in highs[names[i]]
                       if const_difference(e, base) != count]
            if radix is not None:  # a lower digit out of its range would alias another's keys
                lo_c = const_difference(base, Const(0))
                if lo_c is None or lo_c < 0:
                    guards.append(Cmp(">=", digit, Const(0)))
                if lo_c is None or lo_c + count > radix:
                    guards.append(Cmp("<", digit, Const(radix)))
        row_base = digits[0]  # the grid row of instance t = 0, in rows of `width` keys
        for i, d in enumerate(digits[1:], 2):
            row_base = add(row_base, mul(d, rad.bounds[i] // width))
        row = add(Const(rad.origin), mul(add(row_base, t), width))
        lo = emax([add(row, x_lo)] + lows[K])
        hi = emin([add(row, x_hi)] + highs[K])
        assert lo is not None and hi is not None
        terms.append(Term(
            guard=simplify_guard(guards),
            lo=Bound(lo, "none"),
            hi=Bound(hi, "none"),
            family=Family("t", 0, spans[0][1], (), GridRow(rad.origin, width, row_base, 1)),
        ))
    return terms


# --------------------------------------------------------------------------- the stage


def _bound(items: list[Expr], default: Expr, pick: Callable[[list[Expr]], Expr | None]) -> Bound:
    e = pick(items) if items else default
    assert e is not None
    return Bound(e, monotone(e))


def lower_conjunction(atoms: list[Pred], env: RangeEnv | None = None
                      ) -> tuple[list[Term], Residual | None]:
    """One conjunction as terms (none when it is always empty; several families for a
    window over three or more digits of k).

    A k-atom whose solved bounds could leave int64 for some q, k, len and declared parameter
    value stays in the residual (evaluated exactly from the mask's own expression)."""
    env = env or RangeEnv({})
    atoms = in_segment_of(atoms)
    guard_atoms = [a for a in atoms if not uses(a, K)]
    k_atoms = [a for a in atoms if uses(a, K)]
    guard = simplify_guard(guard_atoms)
    if guard == FALSE:
        return [], None
    lows: list[Expr] = []
    highs: list[Expr] = []
    unsolved: list[Pred] = []
    overflow: list[Pred] = []
    for a in k_atoms:
        got = solve_atom(a, K)
        if got is None:
            unsolved.append(a)
            continue
        if not all(fits_int64(c.expr, env) for c in got):
            overflow.append(a)
            continue
        for c in got:
            (lows if isinstance(c, Lo) else highs).append(c.expr)
    if _always_empty(lows, highs):
        return [], None
    if unsolved and not overflow:
        g = find_grid(k_atoms) if all(isinstance(a, Cmp) for a in k_atoms) else None
        if g is not None:
            term = grid_term(guard_atoms, k_atoms, g)
            if term is not None and _term_fits(term, env):
                return ([term] if term.guard != FALSE else []), None
        else:
            rad = find_radix(k_atoms) if all(isinstance(a, Cmp) for a in k_atoms) else None
            fams = radix_terms(guard_atoms, k_atoms, rad) if rad is not None else None
            if fams is not None and all(_term_fits(t, env) for t in fams):
                return [t for t in fams if t.guard != FALSE], None
    if unsolved or overflow:
        rest = unsolved + overflow
        residual: Pred = rest[0] if len(rest) == 1 else And(tuple(rest))
        term = Term(guard, _bound(lows, Const(0), emax), _bound(highs, Var("len"), emin), residual)
        if overflow:
            reason = ("solving for k would need arithmetic outside int64 for some q, k, len "
                      "and declared parameter values; it is checked per element, exactly, on "
                      "every tile these rows touch")
        else:
            reason = ("k appears in a form the interval analysis cannot invert; "
                      "it is checked per element on every tile these rows touch")
        return [term], Residual(reason, pred_str(residual))
    return [Term(guard, _bound(lows, Const(0), emax), _bound(highs, Var("len"), emin))], None


def in_segment_of(atoms: list[Pred]) -> list[Pred]:
    """The atoms with k's segment named by X's where they hold k in X's segment of S.

    k >= seg_start(S, X) and k < seg_end(S, X) (what same(S, X, k) and seg(S, k) == seg(S, X)
    solve to) make seg(S, k), seg_start(S, k) and seg_end(S, k) equal seg(S, X),
    seg_start(S, X) and seg_end(S, X): X's segment is [seg_start, seg_end) and holds no other
    start. Every other atom of the conjunction may then read X's for k's (the atoms that hold
    k there stay as they are): an atom on k's segment becomes a guard, not a residual. The
    transposed mask of causal text with bidirectional image spans (same(S, q, k) and seg(S,
    q) % 2 == 1, swapped) is the case: its seg(S, k) % 2 == 1 was evaluated per element."""
    bounds: list[tuple[str, str, Expr]] = []  # per atom: ("lo" | "hi", S, X) it solves to
    holds: list[set[tuple[str, str, Expr]]] = []
    for a in atoms:
        got = set()
        for c in (solve_atom(a, K) or []) if uses(a, K) else []:
            e = c.expr
            if isinstance(e, SegFn) and not uses(e.arg, K):
                if isinstance(c, Lo) and e.fn == "seg_start":
                    got.add(("lo", e.segments, e.arg))
                elif isinstance(c, Hi) and e.fn == "seg_end":
                    got.add(("hi", e.segments, e.arg))
        holds.append(got)
        bounds += sorted(got, key=repr)
    of: dict[str, Expr] = {}
    for side, segments, x in bounds:
        if side == "lo" and ("hi", segments, x) in bounds:
            of.setdefault(segments, x)
    if not of:
        return atoms

    def named(e: Expr) -> Expr | None:
        if isinstance(e, SegFn) and e.arg == Var(K) and e.segments in of:
            return SegFn(e.fn, e.segments, of[e.segments])
        return None

    keep = [any(x == of.get(s) for _, s, x in h) for h in holds]
    return [a if kept else map_exprs(a, lambda e: substitute(e, named))
            for a, kept in zip(atoms, keep, strict=True)]


def _always_empty(lows: list[Expr], highs: list[Expr]) -> bool:
    """Some lower bound is provably >= some upper bound (keys are also in [0, len))."""
    return any(d is not None and d <= 0
               for lo in lows + [Const(0)] for hi in highs + [Var("len")]
               for d in [const_difference(hi, lo)])


def _term_fits(term: Term, env: RangeEnv) -> bool:
    """Every bound and guard expression of a (family) term stays inside int64."""
    fam = term.family
    if fam is not None:
        env = RangeEnv(env.params, {fam.index: (fam.start, max(fam.start, fam.stop - 1))},
                       {name: (min(v, default=0), max(v, default=0)) for name, v in fam.tables})
    exprs: list[Expr] = [term.lo.expr, term.hi.expr]
    for x in nodes(term.guard):
        if isinstance(x, Cmp):
            exprs += [x.a, x.b]
    return all(fits_int64(e, env) for e in exprs)


def merge_adjacent(terms: list[Term]) -> list[Term]:
    """Join exact, same-guard terms where one ends exactly where the other starts, when
    neither can be empty (else the joined interval could admit keys that neither has)."""
    changed = True
    while changed:
        changed = False
        for i, a in enumerate(terms):
            for j, b in enumerate(terms):
                if i == j or a.family or b.family or a.residual or b.residual:
                    continue
                if a.guard == b.guard and a.hi.expr == b.lo.expr and _never_empty(a) \
                        and _never_empty(b):
                    lo, hi = a.lo.expr, b.hi.expr
                    merged = Term(a.guard, Bound(lo, monotone(lo)), Bound(hi, monotone(hi)))
                    terms = [t for n, t in enumerate(terms) if n not in (i, j)] + [merged]
                    changed = True
                    break
            if changed:
                break
    return terms


def _never_empty(t: Term) -> bool:
    """hi - lo is a non-negative constant (so the union of adjacent terms is one interval)."""
    d = const_difference(t.hi.expr, t.lo.expr)
    return d is not None and d >= 0


def range_env(mask: Mask) -> RangeEnv:
    """Every int parameter within its declared range (len at its extremes)."""
    return RangeEnv({p.name: p.range.extremes() for p in mask.params if p.kind != "segments"})


def _catch_all(mask: Mask, reason: str) -> IntervalTable:
    """One term over every key, never full, the whole predicate checked per element."""
    whole = mask.predicate
    term = Term(TRUE, Bound(Const(0), "const"), Bound(Var("len"), "const"), whole)
    return IntervalTable(mask, (term,), (Residual(reason, pred_str(whole)),))


def lower(mask: Mask) -> IntervalTable:
    try:
        pred = split_k_calls(nnf(mask.predicate))
    except TooManyCases:
        return _catch_all(mask, f"k appears in {k_call_count(mask.predicate)} min/max/abs "
                                f"calls; splitting them would give more than "
                                f"{MAX_CONJUNCTIONS} cases")
    conjs = dnf(pred)
    if conjs is None:
        return _catch_all(mask, f"the predicate expands to more than {MAX_CONJUNCTIONS} cases")
    env = range_env(mask)
    terms: list[Term] = []
    residuals: list[Residual] = []
    for atoms in conjs:
        got, reason = lower_conjunction(atoms, env)
        terms += [t for t in got if t not in terms]
        if reason is not None and reason not in residuals:
            residuals.append(reason)
    table = IntervalTable(mask, tuple(merge_adjacent(terms)), tuple(residuals))
    instances = table.max_intervals_per_row()
    if instances > MAX_TERM_INSTANCES:
        return _catch_all(mask, f"the table has {instances} term instances, more than the "
                                f"{MAX_TERM_INSTANCES} a kernel's plan holds")
    return table
