"""The proofs of cmc/periodic.py. shift_invariance: masks that move with the diagonal are
accepted (functions of q - k, tile-aligned blocks), others refused with the term that moves.
tail_period: where it says the tile masks repeat with period P from a start on, they do,
checked densely over several periods on the representative tile pairs (hypothesis draws
the predicates from the operations the proof reads; small tiles keep it quick); masks users
write are proved with the period and start expected; what it cannot read is refused."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cmc.evaluate import Env, eval_pred
from cmc.ir import And, BinOp, Call, Cmp, Const, Expr, Neg, Not, Or, Pred, Var
from cmc.periodic import Tail, shift_invariance, tail_period

Q, K = Var("q"), Var("k")
D = BinOp("-", Q, K)


def _c(v: int) -> Const:
    return Const(v)


def _tile(p: Pred, side: int, step: int, t: np.ndarray) -> np.ndarray:
    """The masks of the pairs (query tile t, key tile 0) (side +1) or (query tile 0, key tile
    t) (side -1): [len(t), step, step] booleans."""
    shape = (len(t), step, step)
    r = np.arange(step, dtype=np.int64)
    far = step * t[:, None, None]
    q = np.broadcast_to(r[None, :, None] + (far if side == 1 else 0), shape)
    k = np.broadcast_to(r[None, None, :] + (far if side == -1 else 0), shape)
    return np.broadcast_to(eval_pred(p, Env(1 << 30, {}, {"q": q, "k": k})), shape)


def _holds(p: Pred, tail: Tail, step: int, span: int) -> bool:
    """The tile masks at t and t + period agree for the tail's first `span` t."""
    t = np.arange(tail.start, tail.start + span, dtype=np.int64)
    return bool((_tile(p, tail.side, step, t) == _tile(p, tail.side, step, t + tail.period)).all())


STRIDED = And((Cmp("<=", K, Q), Or((Cmp("<", D, _c(128)), Cmp("==", BinOp("%", D, _c(128)),
                                                                   _c(0))))))
FIXED = And((Cmp("<=", K, Q), Or((Cmp("==", BinOp("/", K, _c(128)), BinOp("/", Q, _c(128))),
                                  Cmp(">=", BinOp("%", K, _c(128)), _c(112))))))


@pytest.mark.parametrize("p, side, period, start_at_most", [
    (STRIDED, 1, 1, 2),  # past the window of 128, one diagonal a tile
    (FIXED, 1, 1, 2),  # Sparse Transformer's fixed pattern: a column band a tile
    (Cmp("==", BinOp("%", D, _c(3)), _c(0)), -1, 3, 1),
    (Cmp("==", BinOp("%", BinOp("/", D, _c(4)), _c(4)), _c(1)), 1, 1, 1),
    (Cmp("<", Call("abs", (BinOp("-", D, _c(300)),)), _c(1000)), 1, 1, 12),
    (Cmp("==", BinOp("%", Call("min", (D, _c(1000))), _c(7)), _c(6)), 1, 7, 9),
    (Cmp("!=", BinOp("%", BinOp("*", _c(2), D), _c(6)), _c(2)), 1, 3, 1),
])
def test_masks_users_write_are_proved(p, side, period, start_at_most):
    assert shift_invariance(p, 128) is None
    tail = tail_period(p, side, 128)
    assert isinstance(tail, Tail), tail
    assert tail.period == period and tail.start <= start_at_most, tail
    assert _holds(p, tail, 128, 3 * tail.period + 12)


@pytest.mark.parametrize("p, why", [
    (Cmp("==", BinOp("%", BinOp("+", Q, K), _c(3)), _c(0)), "q + k moves by 256"),
    (Cmp("==", BinOp("%", BinOp("*", D, Q), _c(3)), _c(0)), "multiplies terms that move"),
    (Cmp("<", K, _c(16)), "changes when q and k move together by 128"),
    (Cmp("<", BinOp("%", Q, _c(256)), _c(16)), "which 256 does not divide"),
    (Cmp("<", Call("abs", (Q,)), _c(16)), "abs of a term that moves"),
    (Cmp("<", Var("len"), _c(16)), "it reads len"),
])
def test_moving_masks_are_refused(p, why):
    got = shift_invariance(p, 128)
    assert got is not None and why in got, got


@pytest.mark.parametrize("p, why", [
    (Cmp("==", BinOp("%", BinOp("*", D, D), _c(3)), _c(0)), "a product of two terms that grow"),
    (Cmp("==", BinOp("%", D, Q), _c(0)), "division or remainder by a non-constant"),
    (Cmp("==", BinOp("%", D, _c(-3)), _c(0)), "a negative constant"),
    (Cmp("==", BinOp("%", D, _c(8191 * 4099)), _c(0)), "would exceed"),
])
def test_what_the_tail_cannot_read_is_refused(p, why):
    for side in (1, -1):
        got = tail_period(p, side, 128)
        assert isinstance(got, str) and why in got, got


def test_the_dense_check_can_fail():
    """A wrong period or a start before the settling point is caught by _holds."""
    p = And((Cmp("<=", K, Q), Cmp("==", BinOp("%", D, _c(6)), _c(0))))
    assert _holds(p, Tail(1, 3, 1), 128, 20)
    assert not _holds(p, Tail(1, 2, 1), 128, 20)
    assert not _holds(STRIDED, Tail(1, 1, 0), 128, 20)  # tile 1 still holds the window's end


def _exprs() -> st.SearchStrategy[Expr]:
    leaf = st.one_of(st.just(D), st.just(Q), st.just(K), st.integers(-100, 100).map(Const))
    divisor = st.sampled_from([1, 2, 3, 5, 7, 12, 16, 48, 0])

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


@settings(max_examples=300, deadline=None)
@given(_preds(), st.sampled_from([1, -1]))
def test_a_proved_tail_repeats(p, side):
    tail = tail_period(p, side, 16)  # 16-token tiles: the same proof, smaller masks
    if isinstance(tail, str):
        return
    assert tail.start >= 1 and tail.period >= 1
    assert _holds(p, tail, 16, 2 * tail.period + 40), (p, tail)


@settings(max_examples=300, deadline=None)
@given(_preds())
def test_a_shift_invariant_predicate_is(p):
    if shift_invariance(p, 16) is not None:
        return
    q = np.arange(-40, 200, dtype=np.int64)[:, None]
    k = np.arange(-40, 200, dtype=np.int64)[None, :]
    env = lambda dq: Env(1 << 30, {}, {"q": q + dq, "k": k + dq})  # noqa: E731
    assert (np.broadcast_to(eval_pred(p, env(0)), (240, 240))
            == np.broadcast_to(eval_pred(p, env(16)), (240, 240))).all()
