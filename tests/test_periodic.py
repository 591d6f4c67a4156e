"""The tail proof of cmc/periodic.py: where it says a predicate of q - k repeats with period
P from a start on, it does, checked densely over several periods (hypothesis draws the
predicates from the operations the proof reads); masks users write are proved with the
period and start expected; what it cannot read is refused with a reason."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cmc.evaluate import Env, eval_pred
from cmc.ir import And, BinOp, Call, Cmp, Const, Expr, Neg, Not, Or, Pred, Var
from cmc.periodic import Tail, tail_period

D = BinOp("-", Var("q"), Var("k"))
BASE = 1 << 20  # q and k stay non-negative around d


def _holds(p: Pred, tail: Tail, span: int) -> bool:
    """p(d + period) == p(d) for every d of the tail's first `span` positions."""
    t = np.arange(tail.start, tail.start + span, dtype=np.int64)
    d = tail.side * t
    shift = tail.side * tail.period

    def at(dd: np.ndarray) -> np.ndarray:
        return np.broadcast_to(eval_pred(p, Env(1 << 22, {}, {"q": dd + BASE, "k": BASE})),
                               dd.shape)

    return bool((at(d) == at(d + shift)).all())


def _c(v: int) -> Const:
    return Const(v)


@pytest.mark.parametrize("p, side, period, start_at_most", [
    # strided: past the window of 128 only the multiples of 128
    (And((Cmp("<=", Var("k"), Var("q")),
          Or((Cmp("<", D, _c(128)), Cmp("==", BinOp("%", D, _c(128)), _c(0)))))), 1, 128, 129),
    (Cmp("==", BinOp("%", D, _c(3)), _c(0)), -1, 3, 1),
    (Cmp("==", BinOp("%", BinOp("/", D, _c(4)), _c(4)), _c(1)), 1, 16, 1),
    (Cmp("<", Call("abs", (BinOp("-", D, _c(300)),)), _c(1000)), 1, 1, 1301),
    (Cmp("==", BinOp("%", Call("min", (D, _c(1000))), _c(7)), _c(6)), 1, 7, 1001),
    (Cmp("!=", BinOp("%", BinOp("*", _c(2), D), _c(6)), _c(2)), 1, 6, 1),
])
def test_masks_users_write_are_proved(p, side, period, start_at_most):
    tail = tail_period(p, side)
    assert isinstance(tail, Tail), tail
    assert tail.period == period and tail.start <= start_at_most, tail
    assert _holds(p, tail, 3 * tail.period + 4000)


@pytest.mark.parametrize("p, why", [
    (Cmp("==", BinOp("%", BinOp("*", D, D), _c(3)), _c(0)), "a product of two terms that grow"),
    (Cmp("==", BinOp("%", D, Var("q")), _c(0)), "division or remainder by a non-constant"),
    (Cmp("==", BinOp("%", D, _c(-3)), _c(0)), "a negative constant"),
    (Cmp("==", BinOp("%", Var("q"), _c(3)), _c(0)), "not a function of q - k"),
    (Cmp("==", BinOp("%", D, _c(65537 * 2)), _c(0)), "would exceed"),
])
def test_what_it_cannot_read_is_refused(p, why):
    for side in (1, -1):
        got = tail_period(p, side)
        assert isinstance(got, str) and why in got, got


def test_the_dense_check_can_fail():
    """A wrong period or a start before the settling point is caught by _holds."""
    p = And((Cmp("<=", Var("k"), Var("q")), Cmp("==", BinOp("%", D, _c(6)), _c(0))))
    assert _holds(p, Tail(1, 6, 1), 200)
    assert not _holds(p, Tail(1, 4, 1), 200)
    assert not _holds(p, Tail(-1, 6, -5), 200)  # crosses the diagonal, where k <= q settles


def _exprs() -> st.SearchStrategy[Expr]:
    leaf = st.one_of(st.just(D), st.integers(-300, 300).map(Const))
    divisor = st.sampled_from([1, 2, 3, 5, 7, 12, 64, 128, 0])

    def grow(e: st.SearchStrategy[Expr]) -> st.SearchStrategy[Expr]:
        return st.one_of(
            st.tuples(st.sampled_from("+-"), e, e).map(lambda t: BinOp(t[0], t[1], t[2])),
            st.tuples(st.integers(-3, 3), e).map(lambda t: BinOp("*", Const(t[0]), t[1])),
            st.tuples(e, e).map(lambda t: BinOp("*", t[0], t[1])),
            st.tuples(st.sampled_from("/%"), e, divisor).map(
                lambda t: BinOp(t[0], t[1], Const(t[2]))),
            e.map(Neg),
            e.map(lambda x: Call("abs", (x,))),
            st.tuples(st.sampled_from(["min", "max"]), e, e).map(
                lambda t: Call(t[0], (t[1], t[2]))),
        )

    return st.recursive(leaf, grow, max_leaves=6)


def _preds() -> st.SearchStrategy[Pred]:
    atom = st.tuples(st.sampled_from(["<", "<=", ">", ">=", "==", "!="]), _exprs(),
                     _exprs()).map(lambda t: Cmp(t[0], t[1], t[2]))
    return st.recursive(atom, lambda p: st.one_of(
        st.lists(p, min_size=2, max_size=3).map(lambda xs: And(tuple(xs))),
        st.lists(p, min_size=2, max_size=3).map(lambda xs: Or(tuple(xs))),
        p.map(Not)), max_leaves=4)


@settings(max_examples=400, deadline=None)
@given(_preds(), st.sampled_from([1, -1]))
def test_a_proved_tail_repeats(p, side):
    tail = tail_period(p, side)
    if isinstance(tail, str):
        return
    assert tail.start >= 1 and tail.period >= 1
    assert _holds(p, tail, 2 * tail.period + 3000), (p, tail)
