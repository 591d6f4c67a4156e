"""transpose: IntervalTable -> IntervalTable of the transposed mask, for the backward.

The backward walks key tiles, so each key row needs the query intervals that see it:
visibleT(q', k') = visible(k', q'). The mask predicate with q and k swapped is lowered by
the same analysis (`lower`), so the transposed table carries the same guarantee: exact
terms where the analysis inverts every bound, residual terms (checked per element) with
their reasons elsewhere. In the transposed table "q" is a key position and "k" a query
position (the hook contract of `struct cmc_hooks_t`).

Two rewrites come first. A clamped window (NATTEN: x0 = max(0, min(qx - K/2, W - K)),
x0 <= kx < x0 + K) puts the clamp on q in the forward mask, a guard-side expression; the
transposed mask has it on k, where `lower` splits every min/max per comparison, so the
two comparisons of one window multiply their cases (6^4 conjunctions for NATTEN 2D, past
MAX_CONJUNCTIONS, and the whole mask became one residual).

`invert_clamps` (2026-12-06) inverts the clamp instead: F = max(A, min(G, B)) with G a grid
coordinate of k plus a constant, exactly, F <= v is A <= v and G <= v + max(0, v - B + 1) *
up, and F >= w (with A <= B) is B >= w and G >= w - max(0, A - w + 1) * down, where up and
down are constants (max G - B, A - min G) that make the step reach the coordinate's end. Each
comparison also gives an implied linear bound (G <= v + up, G >= w - down), the constant row
span that `lower.grid_term` counts a family by. The query set that sees a key is then one
rectangle of the grid: NATTEN 13 x 13 on W 96 lowers to one family of 26 query rows (each
guarded by the exact step bounds) and one of 13 for sequences under K grid rows, where the
clamp's bounds cross (A > B, F = A): 39 intervals per key row where the case split gave 102
in 12 families, and few enough grid families for the kv's span words.

Where a clamp does not invert (its bounds are not constants apart from the coordinate's),
`split_shared_calls` splits each k-dependent call once per conjunction, for all of its
comparisons together: 16 cases for NATTEN, 8 of them residual without the next step (the
windows clamped at the bottom border have len-dependent row counts that no constant
family covers), the rest exact.

The bottom border needs one more step, in `lower.grid_term`: a key row near the bottom is
seen by the query rows from len / W - K / 2 on to the last one, a family whose only upper
row bound is k < len. The grid rows that k < len (or k < e) allows, ky < (len - origin) / W
+ 1, then bound the family, len / W - 3 + t for t in [0, 4) in NATTEN 7 x 7: exact (every
instance is clipped to [0, len) as any other), where it was 8 residual terms of 16.

The rewrites are for the lowering only: the transposed table's `mask` keeps the swapped
predicate, the same function, because the hooks' `visible` evaluates `mask.predicate` per
element on the kv kernel's partial tiles, where NATTEN's split conjunctions of fdiv, fmod
and comparisons cost several times the one window test.

The forward table's monotone bounds are not used as a fallback: every sample's transposed
table is exact (tests/test_transpose.py, also NATTEN-style windows of any width, size,
origin and offset), and the inverse of a monotone bound is a search, not an expression the
hooks evaluate per key row. A mask whose transpose stays residual keeps the residual path:
its rows' query ranges are [0, len) cut by the bounds the analysis did solve.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from .ir import (
    And,
    BinOp,
    Call,
    Cmp,
    Const,
    Expr,
    IntervalTable,
    Or,
    Pred,
    Var,
    nodes,
)
from .lower import (
    MAX_CONJUNCTIONS,
    K,
    add,
    const_difference,
    linearize,
    lower,
    map_exprs,
    mul,
    neg,
    nnf,
    sub,
    substitute,
    uses,
)

_SWAP = {"q": "k", "k": "q"}


def swap_expr(e: Expr) -> Expr:
    """e with the positions q and k exchanged."""

    def f(x: Expr) -> Expr | None:
        return Var(_SWAP[x.name]) if isinstance(x, Var) and x.name in _SWAP else None

    return substitute(e, f)


def swap_pred(p: Pred) -> Pred:
    """p(q, k) -> p(k, q)."""
    return map_exprs(p, swap_expr)


class _TooManyCases(Exception):
    """The case split passed its budget of conjunctions."""


def split_shared_calls(p: Pred, limit: int = MAX_CONJUNCTIONS) -> Pred:
    """p (in negation normal form) with every k-dependent min/max/abs of a conjunction's
    comparisons case-split once for the whole conjunction (see the module docstring). Past
    `limit` conjunctions in all, p as it is: the split doubles per nested call, and a fuzzed
    mask with eight of them ran for minutes (2026-12-07); `lower` then makes such a mask
    residual with its own reason, as it does the forward."""
    left = [limit]
    try:
        return _split(p, left)
    except _TooManyCases:
        return p


def _split(p: Pred, left: list[int]) -> Pred:
    if isinstance(p, Or):
        return Or(tuple(_split(x, left) for x in p.items))
    items = p.items if isinstance(p, And) else (p,)
    items = tuple(_split(x, left) if isinstance(x, Or) else x for x in items)
    call = _first_k_call(items)
    if call is None:
        left[0] -= 1
        if left[0] < 0:
            raise _TooManyCases
        return And(items) if len(items) > 1 else items[0]
    cases = []
    for cond, by in _cases(call):

        def f(e: Expr, by: Expr = by) -> Expr | None:
            return by if e == call else None

        rewritten = tuple(Cmp(x.op, substitute(x.a, f), substitute(x.b, f))
                          if isinstance(x, Cmp) else x for x in items)
        cases.append(_split(And((*cond, *rewritten)), left))
    return Or(tuple(cases))


def _first_k_call(items: tuple[Pred, ...]) -> Call | None:
    for x in items:
        if isinstance(x, Cmp) and uses(x, K):
            for side in (x.a, x.b):
                for e in nodes(side):
                    if isinstance(e, Call) and uses(e, K):
                        return e
    return None


def _cases(call: Call) -> list[tuple[tuple[Pred, ...], Expr]]:
    """(conditions, value) pairs that cover every case of the call exactly once."""
    if call.fn == "abs":
        x = call.args[0]
        return [((Cmp(">=", x, Const(0)),), x), ((Cmp("<", x, Const(0)),), neg(x))]
    a = call.args[0]
    b = call.args[1] if len(call.args) == 2 else Call(call.fn, call.args[1:])
    take_a = "<=" if call.fn == "min" else ">="
    take_b = ">" if call.fn == "min" else "<"
    return [((Cmp(take_a, a, b),), a), ((Cmp(take_b, a, b),), b)]  # type: ignore[arg-type]


@dataclass(frozen=True)
class _Clamp:
    """F = max(A, min(G, B)) with G = U + g, U a grid coordinate of k ((k + c) / W or
    (k + c) % W), A and B free of k: F's comparisons with expressions of q invert into
    bounds on G without case splits (invert_clamps)."""

    call: Call
    a: Expr
    b: Expr
    g_expr: Expr
    up: int  # F <= v: G <= v + max(0, v - B + 1) * up (up >= max G - B over the domain)
    down: int  # F >= w: G >= w - max(0, A - w + 1) * down (down >= A - min G)
    gap: int | None  # const B - A (None: depends on len or q)


def _clamp(call: Call) -> _Clamp | None:
    """call as a _Clamp, or None where it is not one (or its bounds are not constants)."""
    if not (call.fn == "max" and len(call.args) == 2):
        return None
    for a, inner in (call.args, call.args[::-1]):
        if uses(a, K) or not (isinstance(inner, Call) and inner.fn == "min"
                              and len(inner.args) == 2):
            continue
        for g_expr, b in (inner.args, inner.args[::-1]):
            if uses(b, K):
                continue
            span = _coordinate_span(g_expr)
            if span is None:
                continue
            g_min, g_max = span
            up, down = const_difference(g_max, b), const_difference(a, g_min)
            if up is None or down is None:
                continue
            return _Clamp(call, a, b, g_expr, max(0, up), max(0, down), const_difference(b, a))
    return None


def _coordinate_span(g_expr: Expr) -> tuple[Expr, Expr] | None:
    """(a lower bound, an upper bound) of G = U + g over k in [0, len), U = (k + c) / W
    (upper bound one row loose: (len + c) / W) or (k + c) % W; None for other G."""
    units = [x for x in nodes(g_expr) if isinstance(x, BinOp) and x.op in "/%"
             and isinstance(x.b, Const) and x.b.value > 0 and uses(x, K)]
    if len(units) != 1:
        return None
    u = units[0]
    assert isinstance(u, BinOp) and isinstance(u.b, Const)
    form = linearize(substitute(g_expr, lambda x: _U if x == u else None), _U.name)
    inner = linearize(u.a, K)
    if form is None or form[0] != 1 or uses(form[1], K) or inner is None or inner[0] != 1:
        return None
    g, c, w = form[1], inner[1], u.b.value
    if u.op == "%":
        return g, add(g, Const(w - 1))
    if not isinstance(c, Const):
        return None
    return add(g, Const(c.value // w)), add(g, BinOp("/", add(Var("len"), c), Const(w)))


_U = Var("_u")
_F = Var("_f")


def _side(atom: Cmp, cl: _Clamp) -> tuple[str, Expr] | None:
    """atom as F <= v ("le", v) or F >= w ("ge", w), v and w free of k; None otherwise."""
    d = substitute(sub(atom.a, atom.b), lambda x: _F if x == cl.call else None)
    form = linearize(d, _F.name)
    if form is None or form[0] not in (1, -1) or uses(form[1], K) or atom.op in ("==", "!="):
        return None
    coef, rest = form
    rhs = neg(rest) if coef == 1 else rest  # F op rhs, op flipped where coef is -1
    op = atom.op if coef == 1 else {"<": ">", "<=": ">=", ">": "<", ">=": "<="}[atom.op]
    if op in ("<", "<="):
        return "le", rhs if op == "<=" else sub(rhs, Const(1))
    return "ge", rhs if op == ">=" else add(rhs, Const(1))


def _inverted(side: str, bound: Expr, cl: _Clamp) -> list[Pred]:
    """F <= v or F >= w (with A <= B) as a guard on v or w and bounds on G: the exact bound
    and an implied linear one (the constant row span grid_term counts a family by)."""
    g = cl.g_expr
    if side == "le":  # A <= v and (G <= v or B <= v)
        step = mul(Call("max", (Const(0), add(sub(bound, cl.b), Const(1)))), cl.up)
        return [Cmp("<=", cl.a, bound), Cmp("<=", g, add(bound, step) if cl.up else bound),
                Cmp("<=", g, add(bound, Const(cl.up)))]
    # B >= w and (A >= w or G >= w), A <= B
    step = mul(Call("max", (Const(0), add(sub(cl.a, bound), Const(1)))), cl.down)
    return [Cmp(">=", cl.b, bound), Cmp(">=", g, sub(bound, step) if cl.down else bound),
            Cmp(">=", g, sub(bound, Const(cl.down)))]


def invert_clamps(p: Pred) -> Pred:
    """p (in negation normal form) with the comparisons of each clamped window on k (NATTEN's
    x0 = max(0, min(kx - K/2, W - K)) after the swap) rewritten as bounds on its grid
    coordinate, where every comparison of that clamp in the conjunction inverts: one family
    of the query rows a key row is seen from, instead of split_shared_calls' cases. Where
    the clamp's bounds can cross (A > B: NATTEN below K grid rows), that case is its own
    conjunction, F = A, with the row bound G <= A - 1 + (max G - B)."""
    if isinstance(p, Or):
        return Or(tuple(invert_clamps(x) for x in p.items))
    items = p.items if isinstance(p, And) else (p,)
    items = tuple(invert_clamps(x) if isinstance(x, Or) else x for x in items)
    for x in items:
        if not (isinstance(x, Cmp) and uses(x, K)):
            continue
        for e in (*nodes(x.a), *nodes(x.b)):
            cl = _clamp(e) if isinstance(e, Call) else None
            if cl is None:
                continue
            users = [y for y in items if isinstance(y, Cmp) and any(
                z == cl.call for z in (*nodes(y.a), *nodes(y.b)))]
            sides = [_side(y, cl) for y in users]
            if any(sd is None for sd in sides):
                continue
            rest = tuple(y for y in items if y not in users)
            inverted = [a for sd in sides if sd is not None for a in _inverted(*sd, cl)]
            if cl.gap is not None and cl.gap >= 0:
                return invert_clamps(And((*rest, *inverted)))

            def const(e: Expr, cl: _Clamp = cl) -> Expr | None:
                return cl.a if e == cl.call else None

            crossed = [Cmp(y.op, substitute(y.a, const), substitute(y.b, const)) for y in users]
            row = Cmp("<=", cl.g_expr, add(cl.a, Const(cl.up - 1)))
            if cl.gap is not None:  # always crossed
                return invert_clamps(And((*rest, *crossed, row)))
            return Or((invert_clamps(And((*rest, Cmp("<=", cl.a, cl.b), *inverted))),
                       invert_clamps(And((*rest, Cmp(">", cl.a, cl.b), *crossed, row)))))
    return And(items) if len(items) > 1 else items[0]


def transpose(table: IntervalTable) -> IntervalTable:
    """The transposed table: its rows are key positions, its intervals query positions.

    Its `mask` is the transposed mask (same name, params and constants), so the dense
    oracle of it is the forward oracle transposed."""
    mask = table.mask
    swapped = replace(mask, allows=tuple(swap_pred(a) for a in mask.allows),
                      denies=tuple(swap_pred(d) for d in mask.denies))
    split = split_shared_calls(invert_clamps(nnf(swapped.predicate)))
    # The table is lowered from the case split; its mask keeps the swapped predicate, the
    # same function, which the hooks' visible() evaluates per element on partial tiles: for
    # NATTEN's clamped window the split is 16 conjunctions of 8-10 comparisons, the swapped
    # predicate one window test.
    return replace(lower(replace(swapped, allows=(split,), denies=())), mask=swapped)


def summary(table: IntervalTable) -> str:
    """One line for `cmc check`: exact with its interval count, or which part is residual."""
    size = f"up to {table.max_intervals_per_row()} intervals per key row"
    if table.exact:
        return f"exact, {size}"
    residual = sum(t.residual is not None for t in table.terms)
    reasons = "; ".join(dict.fromkeys(r.reason for r in table.residuals))
    return f"residual in {residual} of {len(table.terms)} terms, {size} ({reasons})"
