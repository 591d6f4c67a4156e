"""transpose: IntervalTable -> IntervalTable of the transposed mask, for the backward.

The backward walks key tiles, so each key row needs the query intervals that see it:
visibleT(q', k') = visible(k', q'). The mask predicate with q and k swapped is lowered by
the same analysis (`lower`), so the transposed table carries the same guarantee: exact
terms where the analysis inverts every bound, residual terms (checked per element) with
their reasons elsewhere. In the transposed table "q" is a key position and "k" a query
position (the hook contract of `struct cmc_hooks_t`).

One rewrite comes first. A clamped window (NATTEN: x0 = max(0, min(qx - K/2, W - K)),
x0 <= kx < x0 + K) puts the clamp on q in the forward mask, a guard-side expression; the
transposed mask has it on k, where `lower` splits every min/max per comparison, so the
two comparisons of one window multiply their cases (6^4 conjunctions for NATTEN 2D, past
MAX_CONJUNCTIONS, and the whole mask became one residual). Splitting each k-dependent
call once per conjunction, for all of its comparisons together, gives 16 cases; 8 of them
stay residual (the windows clamped at the bottom border have len-dependent row counts that
no constant family covers), the rest are exact.

The bottom border needs one more step, in `lower.grid_term`: a key row near the bottom is
seen by the query rows from len / W - K / 2 on to the last one, a family whose only upper
row bound is k < len. The grid rows that k < len (or k < e) allows, ky < (len - origin) / W
+ 1, then bound the family, len / W - 3 + t for t in [0, 4) in NATTEN 7 x 7: exact (every
instance is clipped to [0, len) as any other), where it was 8 residual terms of 16.

The split is for the lowering only: the transposed table's `mask` keeps the swapped
predicate, the same function, because the hooks' `visible` evaluates `mask.predicate` per
element on the kv kernel's partial tiles, where NATTEN's 16 split conjunctions of fdiv, fmod
and comparisons cost several times the one window test.

The forward table's monotone bounds are not used as a fallback: every sample's transposed
table is exact (tests/test_transpose.py, also NATTEN-style windows of any width, size,
origin and offset), and the inverse of a monotone bound is a search, not an expression the
hooks evaluate per key row. A mask whose transpose stays residual keeps the residual path:
its rows' query ranges are [0, len) cut by the bounds the analysis did solve.
"""

from __future__ import annotations

from dataclasses import replace

from .ir import (
    And,
    BoolConst,
    Call,
    Cmp,
    Const,
    Expr,
    IntervalTable,
    Not,
    Or,
    Pred,
    Same,
    Var,
    nodes,
)
from .lower import K, lower, neg, nnf, substitute, uses

_SWAP = {"q": "k", "k": "q"}


def swap_expr(e: Expr) -> Expr:
    """e with the positions q and k exchanged."""

    def f(x: Expr) -> Expr | None:
        return Var(_SWAP[x.name]) if isinstance(x, Var) and x.name in _SWAP else None

    return substitute(e, f)


def swap_pred(p: Pred) -> Pred:
    """p(q, k) -> p(k, q)."""
    if isinstance(p, BoolConst):
        return p
    if isinstance(p, Cmp):
        return Cmp(p.op, swap_expr(p.a), swap_expr(p.b))
    if isinstance(p, (And, Or)):
        return type(p)(tuple(swap_pred(x) for x in p.items))
    if isinstance(p, Not):
        return Not(swap_pred(p.a))
    if isinstance(p, Same):
        return Same(p.segments, swap_expr(p.a), swap_expr(p.b))
    raise TypeError(p)


def split_shared_calls(p: Pred) -> Pred:
    """p (in negation normal form) with every k-dependent min/max/abs of a conjunction's
    comparisons case-split once for the whole conjunction (see the module docstring)."""
    if isinstance(p, Or):
        return Or(tuple(split_shared_calls(x) for x in p.items))
    items = p.items if isinstance(p, And) else (p,)
    items = tuple(split_shared_calls(x) if isinstance(x, Or) else x for x in items)
    call = _first_k_call(items)
    if call is None:
        return And(items) if len(items) > 1 else items[0]
    cases = []
    for cond, by in _cases(call):

        def f(e: Expr, by: Expr = by) -> Expr | None:
            return by if e == call else None

        rewritten = tuple(Cmp(x.op, substitute(x.a, f), substitute(x.b, f))
                          if isinstance(x, Cmp) else x for x in items)
        cases.append(split_shared_calls(And((*cond, *rewritten))))
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


def transpose(table: IntervalTable) -> IntervalTable:
    """The transposed table: its rows are key positions, its intervals query positions.

    Its `mask` is the transposed mask (same name, params and constants), so the dense
    oracle of it is the forward oracle transposed."""
    mask = table.mask
    swapped = replace(mask, allows=tuple(swap_pred(a) for a in mask.allows),
                      denies=tuple(swap_pred(d) for d in mask.denies))
    split = split_shared_calls(nnf(swapped.predicate))
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
