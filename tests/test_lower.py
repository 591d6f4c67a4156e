"""The interval table reconstructs the oracle exactly, and tile classes are sound."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cmc.driver import front
from cmc.evaluate import Env, eval_pred
from cmc.ir import (
    And,
    BinOp,
    Call,
    Cmp,
    Const,
    Mask,
    Not,
    Or,
    ParamDecl,
    ParamRef,
    Same,
    SegFn,
    Var,
)
from cmc.lower import lower
from cmc.oracle import dense
from cmc.tiles import EMPTY, FULL, classify, dense_from_table, visible_pairs
from cmc.transpose import transpose

from .conftest import (
    EXACT,
    SAMPLES,
    SMALL_DEFINES,
    assert_same_pairs,
    random_params,
    small_cases,
)


def _check(table, length, params, tiles=((4, 4), (3, 5), (8, 2))):
    truth = dense(table.mask, length, params)
    got = dense_from_table(table, length, params)
    assert_same_pairs(got, truth, f"{table.mask.name} len={length} params={params}")
    assert visible_pairs(table, length, params) == int(truth.sum())
    for tm, tn in tiles:
        cls = classify(table, length, params, tm, tn)
        for i in range(cls.shape[0]):
            for j in range(cls.shape[1]):
                block = truth[i * tm:(i + 1) * tm, j * tn:(j + 1) * tn]
                if cls[i, j] == EMPTY:
                    assert not block.any(), (table.mask.name, length, params, i, j, "empty")
                elif cls[i, j] == FULL:
                    assert block.all(), (table.mask.name, length, params, i, j, "full")


@pytest.mark.parametrize("path", SAMPLES, ids=lambda p: p.stem)
def test_sample_table_equals_oracle_exhaustively(path):
    table = front(path, SMALL_DEFINES.get(path.stem, {}))
    for length, params in small_cases(table.mask, 1234):
        _check(table, length, params)


@pytest.mark.parametrize("path", SAMPLES, ids=lambda p: p.stem)
def test_sample_table_at_default_constants(path):
    table = front(path)
    rng = np.random.default_rng(7)
    for length in (300, 777):
        _check(table, length, random_params(table.mask, length, rng), tiles=((128, 128), (64, 96)))


@pytest.mark.parametrize("path", SAMPLES, ids=lambda p: p.stem)
def test_exact_samples_have_no_residual(path):
    table = front(path)
    if path.stem in EXACT:
        assert table.exact and not table.residuals, table.residuals


def test_seed_table_sizes():
    sizes = {p.stem: front(p).max_intervals_per_row() for p in SAMPLES}
    assert sizes["causal"] == 1
    assert sizes["shared_prefix"] == 2
    assert sizes["hstu"] == 2  # CONTEXT = 0: the contextual-row class is empty and dropped
    hstu = next(p for p in SAMPLES if p.stem == "hstu")
    assert front(hstu, {"CONTEXT": 4}).max_intervals_per_row() == 3
    assert sizes["clear"] == 2 + 31  # text rows/keys, then one interval per grid row offset


def test_causal_tiles_are_triangular():
    table = front(next(p for p in SAMPLES if p.stem == "causal"))
    cls = classify(table, 512, {}, 128, 128)
    assert (np.diag(cls) == 2).all() and (cls[np.triu_indices(4, 1)] == EMPTY).all()
    assert (cls[np.tril_indices(4, -1)] == FULL).all()


def _mask(allows, denies=(), params=()):
    return Mask("m", "", "", "m.mask", (), tuple(params), tuple(allows), tuple(denies))


def test_residual_is_reported_and_still_exact():
    q, k = Var("q"), Var("k")
    # k * k is not invertible by the analysis: it must stay a residual, checked per element
    m = _mask([Cmp("<", BinOp("*", k, k), q)])
    table = lower(m)
    assert not table.exact and table.residuals
    for length in (1, 9, 30):
        _check(table, length, {})


# ---------------------------------------------------------------- random masks (hypothesis)

PARAMS = (ParamDecl("n", "batch"), ParamDecl("s", "segments"))
q, k, ln = Var("q"), Var("k"), Var("len")

leaf = st.one_of(
    st.just(q), st.just(k), st.just(ln), st.just(ParamRef("n")),
    st.integers(-6, 12).map(Const),
)


def _exprs():
    return st.recursive(
        leaf,
        lambda inner: st.one_of(
            st.tuples(st.sampled_from("+-"), inner, inner).map(lambda t: BinOp(*t)),
            st.tuples(inner, st.integers(-3, 4)).map(lambda t: BinOp("*", t[0], Const(t[1]))),
            st.tuples(st.sampled_from("/%"), inner, st.integers(1, 5)).map(
                lambda t: BinOp(t[0], t[1], Const(t[2]))),
            st.tuples(st.sampled_from(["min", "max"]), inner, inner).map(
                lambda t: Call(t[0], (t[1], t[2]))),
            inner.map(lambda e: Call("abs", (e,))),
            st.tuples(st.sampled_from(["seg", "seg_start", "seg_end"]), inner).map(
                lambda t: SegFn(t[0], "s", t[1])),
        ),
        max_leaves=6,
    )


def _preds():
    atom = st.one_of(
        st.tuples(st.sampled_from(["<", "<=", ">", ">=", "==", "!="]), _exprs(), _exprs()).map(
            lambda t: Cmp(*t)),
        st.tuples(_exprs(), _exprs()).map(lambda t: Same("s", t[0], t[1])),
    )
    return st.recursive(
        atom,
        lambda inner: st.one_of(
            st.lists(inner, min_size=2, max_size=3).map(lambda xs: And(tuple(xs))),
            st.lists(inner, min_size=2, max_size=3).map(lambda xs: Or(tuple(xs))),
            inner.map(Not),
        ),
        max_leaves=4,
    )


@settings(max_examples=600, deadline=None)
@given(
    allows=st.lists(_preds(), min_size=1, max_size=3),
    denies=st.lists(_preds(), max_size=1),
    length=st.integers(1, 24),
    n=st.integers(0, 24),
    starts=st.lists(st.integers(0, 24), max_size=4),
)
def test_random_masks_table_equals_oracle(allows, denies, length, n, starts):
    table = lower(_mask(allows, denies, PARAMS))
    params = {"n": min(n, length), "s": sorted(min(s, length) for s in starts)}
    _check(table, length, params, tiles=((4, 4), (5, 3)))


def test_oracle_agrees_with_direct_evaluation():
    """Guards the test itself: the oracle is the predicate evaluated densely."""
    m = _mask([Cmp("<=", k, q)])
    d = dense(m, 6, {})
    qq, kk = np.arange(6)[:, None], np.arange(6)[None, :]
    assert (d == np.broadcast_to(eval_pred(m.predicate, Env(6, {}, {"q": qq, "k": kk})), (6, 6))).all()
    assert d.sum() == 21


CAUSAL_2D = """mask raster_{i}
const T = {text}
const W = {width}
const R = {radius}
let qy = (q - T) / W
let qx = (q - T) % W
let ky = (k - T) / W
let kx = (k - T) % W
allow q >= T and k >= T and {order} and qy - ky <= R and abs(qx - kx) <= R
"""


@pytest.mark.parametrize("text, width, radius, order", [
    (0, 8, 2, "k <= q"), (0, 5, 1, "k < q"), (3, 6, 2, "k <= q"), (0, 4, 3, "k <= q + 0"),
])
def test_raster_causal_2d_window_lowers_to_one_family(tmp_path, text, width, radius, order):
    """k <= q bounds a one-sided row window by the query's own row (ky <= qy, exactly:
    lower.grid_term's tight row bound), so a raster-order causal 2D window is a family of
    R + 1 grid rows, not a residual; the table equals the oracle."""
    path = tmp_path / "raster.mask"
    path.write_text(CAUSAL_2D.format(i=0, text=text, width=width, radius=radius, order=order))
    table = front(path, {})
    assert table.exact and table.max_intervals_per_row() == radius + 1, table
    for length in (1, 7, width * (radius + 3) + text + 1, 97):
        assert_same_pairs(dense_from_table(table, length, {}), dense(table.mask, length, {}),
                          f"{order} W {width} len {length}")


def _equal_the_oracle_both_ways(table, lengths, what: str) -> None:
    """The table and its transposed one reconstruct the oracle (parameter-free masks)."""

    for length in lengths:
        truth = dense(table.mask, length, {})
        assert_same_pairs(dense_from_table(table, length, {}), truth, f"{what} len {length}")
        assert_same_pairs(dense_from_table(transpose(table), length, {}), truth.T,
                          f"transposed {what} len {length}")


SWIN = """mask swin_{i}
const W = {width}
const M = {window}
const S = {shift}
let qy = q / W
let qx = q % W
let ky = k / W
let kx = k % W
allow {body}
"""


@pytest.mark.parametrize("width, window, shift, body", [
    (8, 4, 0, "qy / M == ky / M and qx / M == kx / M"),
    (8, 4, 2, "(qy + S) / M == (ky + S) / M and (qx + S) / M == (kx + S) / M"),
    (10, 4, 1, "(qy + S) / M == (ky + S) / M and (qx + S) / M == (kx + S) / M"),
    (9, 3, 1, "k <= q and (qx + S) / M == (kx + S) / M and abs(qy - ky) <= 1"),
])
def test_swin_windows_lower_to_one_family(tmp_path, width, window, shift, body):
    """Window attention on a token grid (Swin, shifted or not): a division of a grid
    coordinate, (kx + S) / M, is solved on the coordinate (lower.find_grid no longer refuses
    it, to_grid keeps it), so the windows are one family of grid rows, not a residual; the
    table and the transposed one equal the oracle."""
    path = tmp_path / "swin.mask"
    path.write_text(SWIN.format(i=0, width=width, window=window, shift=shift, body=body))
    table = front(path, {})
    assert table.exact and transpose(table).exact, table
    _equal_the_oracle_both_ways(table, (1, 5, width * 7 + 3, 113), body)


@pytest.mark.parametrize("rows", [
    "max(qy - R, 0) <= ky and ky <= qy + R",
    "qy - R <= ky and ky <= min(qy + R, 5)",
    "max(0, qy - R) <= ky and ky < min(qy + R + 1, 6)",
])
def test_clamped_row_bounds_lower_to_one_family(tmp_path, rows):
    """A row window written with max / min clamps (`max(qy - R, 0) <= k / W`): the span of
    the clamp's argument covers it and the clamp stays each instance's guard, so the window
    is a family of grid rows, not a residual; both tables equal the oracle."""
    path = tmp_path / "rows.mask"
    path.write_text("mask rows\nconst W = 6\nconst R = 2\nlet qy = q / W\nlet ky = k / W\n"
                    f"allow {rows} and max(0, q % W - R) <= k % W and k % W <= q % W + R\n")
    table = front(path, {})
    assert table.exact and table.max_intervals_per_row() == 5, table
    _equal_the_oracle_both_ways(table, (1, 7, 40, 61), rows)


@pytest.mark.parametrize("text", [
    "mask a\nallow abs(q - k) < 300 and (q - k) % 3 == 0",
    "mask b\nallow k <= q and (q - k < 64 or k % 64 == 63)",
    "mask c\nparam S : segments\nallow same(S, q, k)\nallow k == seg_start(S, k)",
    "mask d\nconst W = 40\nallow k <= q and q % W == k % W",
])
def test_visible_pairs_of_residual_tables_by_row_blocks(tmp_path, text):
    """visible_pairs evaluates a residual table's keys a block of rows at a time, over the
    keys its intervals reach: the count equals the dense one across block boundaries."""
    from cmc import tiles

    path = tmp_path / "m.mask"
    path.write_text(text + "\n")
    table = front(path, {})
    assert not table.exact
    rng = np.random.default_rng(5)
    for length in (1, tiles.VISIBLE_ROWS - 1, tiles.VISIBLE_ROWS + 1, 1300):
        params = random_params(table.mask, length, rng)
        assert visible_pairs(table, length, params) == int(
            dense_from_table(table, length, params).sum()), (text, length, params)
