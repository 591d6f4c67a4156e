"""The transposed table (rows: keys, intervals: queries) reconstructs the oracle transposed."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cmc.driver import front
from cmc.ir import BinOp, Cmp, Var
from cmc.lower import lower
from cmc.oracle import dense
from cmc.tiles import dense_from_table
from cmc.transpose import summary, transpose

from .conftest import (
    EXACT,
    SAMPLES,
    SMALL_DEFINES,
    assert_same_pairs,
    random_params,
    small_cases,
)
from .test_lower import PARAMS, _mask, _preds

# Exact forward tables whose transposes keep residual terms: NATTEN's windows clamped at
# the bottom border have len-dependent row counts that no constant family covers.
TRANSPOSED_RESIDUAL = {"natten2d"}


def _check(table, length, params):
    truth = dense(table.mask, length, params).T
    got = dense_from_table(transpose(table), length, params)
    assert_same_pairs(got, truth, f"{table.mask.name} len={length} params={params}")


@pytest.mark.parametrize("path", SAMPLES, ids=lambda p: p.stem)
def test_sample_transposed_equals_oracle_transposed(path):
    table = front(path, SMALL_DEFINES.get(path.stem, {}))
    for length, params in small_cases(table.mask, 4321):
        _check(table, length, params)


@pytest.mark.parametrize("path", SAMPLES, ids=lambda p: p.stem)
def test_sample_transposed_at_default_constants(path):
    table = front(path)
    rng = np.random.default_rng(8)
    for length in (300, 777):
        _check(table, length, random_params(table.mask, length, rng))


@pytest.mark.parametrize("path", SAMPLES, ids=lambda p: p.stem)
def test_exactness_of_transposed_samples(path):
    tt = transpose(front(path))
    if path.stem in EXACT - TRANSPOSED_RESIDUAL:
        assert tt.exact and not tt.residuals, summary(tt)
        assert summary(tt).startswith("exact, up to ")
    elif path.stem in TRANSPOSED_RESIDUAL:
        assert not tt.exact and summary(tt).startswith("residual in ")


@pytest.mark.parametrize("stem", ["clear", "natten2d"])
def test_grid_families_transpose_into_grid_families(stem):
    path = next(p for p in SAMPLES if p.stem == stem)
    tt = transpose(front(path))
    grids = {(t.family.grid.origin, t.family.grid.width)
             for t in tt.terms if t.family is not None and t.family.grid is not None}
    assert len(grids) == 1, tt.terms


def test_transposed_sizes():
    sizes = {p.stem: transpose(front(p)).max_intervals_per_row() for p in SAMPLES}
    assert sizes["causal"] == 1 and sizes["shared_prefix"] == 2
    assert sizes["clear"] == 2 + 31  # the circle is symmetric: the same rows per key


def test_transposing_twice_gives_the_forward_oracle():
    table = front(next(p for p in SAMPLES if p.stem == "hstu"), {"CONTEXT": 2})
    back = transpose(transpose(table))
    rng = np.random.default_rng(3)
    for length in (5, 17, 33):
        params = random_params(table.mask, length, rng)
        assert (dense_from_table(back, length, params) == dense(table.mask, length, params)).all()


def test_a_residual_forward_can_transpose_exact():
    q, k = Var("q"), Var("k")
    m = _mask([Cmp("<", BinOp("*", k, k), q)])  # k*k < q: residual forward, q' > k'^2 exact
    assert not lower(m).exact and transpose(lower(m)).exact
    for length in (1, 9, 30):
        _check(lower(m), length, {})


@settings(max_examples=400, deadline=None)
@given(
    allows=st.lists(_preds(), min_size=1, max_size=3),
    denies=st.lists(_preds(), max_size=1),
    length=st.integers(1, 24),
    n=st.integers(0, 24),
    starts=st.lists(st.integers(0, 24), max_size=4),
)
def test_random_masks_transposed_equals_oracle(allows, denies, length, n, starts):
    table = lower(_mask(allows, denies, PARAMS))
    params = {"n": min(n, length), "s": sorted(min(s, length) for s in starts)}
    _check(table, length, params)
