"""The transposed table (rows: keys, intervals: queries) reconstructs the oracle transposed."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from cmc.check import check
from cmc.driver import front
from cmc.ir import And, BinOp, Cmp, Const, Var
from cmc.lower import lower
from cmc.oracle import dense
from cmc.parse import parse
from cmc.tiles import dense_from_table
from cmc.transpose import summary, transpose

from .conftest import (
    EXACT,
    ROOT,
    SAMPLES,
    SMALL_DEFINES,
    assert_same_pairs,
    random_params,
    small_cases,
)
from .test_lower import PARAMS, _mask, _preds


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
    if path.stem in EXACT:
        assert tt.exact and not tt.residuals, summary(tt)
        assert summary(tt).startswith("exact, up to ")


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


# found by the CLI fuzz on 2026-12-07: k in 46 nested min / max / abs calls; the transposed
# case split doubled per call without a budget and `cmc check` ran for minutes
NESTED_CALLS = """mask fuzzed
const C = 3
param P : int
param B : int[batch]
param S : segments
let L0 = min(max(C, 4), max(11, q, P), min((len), C, q))
let L1 = min(L0 - C, 16 * k, -C)
let L2 = min(P, abs(L1), B)
allow same(S, min(k, q), -12 + L0)
allow k > max(19, q, L0) != min(L2, L2)
allow max((L0), (-17)) == abs(17)
deny -13 in [C, C)
"""


def test_a_mask_of_many_nested_calls_transposes_residual_and_quickly(tmp_path):
    import time

    path = tmp_path / "nested.mask"
    path.write_text(NESTED_CALLS)
    table = front(path, {})
    started = time.monotonic()
    t = transpose(table)
    assert time.monotonic() - started < 10
    assert not t.exact and "more than 512 cases" in summary(t)
    for length, params in small_cases(table.mask, 77):
        _check(table, length, params)


@settings(max_examples=400, deadline=None)
@given(
    allows=st.lists(_preds(), min_size=1, max_size=3),
    denies=st.lists(_preds(), max_size=1),
    length=st.integers(1, 24),
    n=st.integers(0, 24),
    starts=st.lists(st.integers(0, 24), max_size=4),
)
# found by hypothesis on 2026-12-05: the transposed mask's k / 1 and (k + k) % 1 made a radix
# without a row digit, which lower.radix_terms indexed past its end
@example(allows=[Cmp("<", Var("q"), BinOp("+", Var("q"), Var("q")))],
         denies=[And((Cmp("<", BinOp("/", Var("q"), Const(1)),
                          BinOp("%", BinOp("+", Var("q"), Var("q")), Const(1))),))],
         length=1, n=0, starts=[])
def test_random_masks_transposed_equals_oracle(allows, denies, length, n, starts):
    table = lower(_mask(allows, denies, PARAMS))
    params = {"n": min(n, length), "s": sorted(min(s, length) for s in starts)}
    _check(table, length, params)


# ---------------------------------------------------------------- clamped windows on a grid

def _clamped_window(w: int, kk: int, origin: int, ay: int, ax: int, y_only: bool = False):
    """NATTEN's window, generalised: grid width w from token `origin`, kk x kk windows
    placed ay rows and ax columns before the query, clamped inside the grid at both ends (or
    a window of kk grid rows only). The clamp at the bottom border reads len."""
    x = "" if y_only else " and x0 <= (k - C) % W and (k - C) % W < x0 + K"
    return check(parse(f"""mask m
const W = {w}
const K = {kk}
const C = {origin}
let rows = (len - C) / W
let y0 = max(0, min((q - C) / W - {ay}, rows - K))
let x0 = max(0, min((q - C) % W - {ax}, W - K))
allow q >= C and k >= C and y0 <= (k - C) / W and (k - C) / W < y0 + K{x}
"""))


@pytest.mark.parametrize(("w", "kk", "origin", "ay", "ax"), [
    (5, 3, 0, 1, 1), (5, 3, 2, 1, 1), (4, 2, 3, 0, 1), (6, 3, 1, 2, 0), (3, 3, 0, 1, 1),
    (1, 1, 0, 0, 0), (7, 5, 0, 2, 2), (4, 4, 1, 3, 0),
])
def test_clamped_windows_transpose_exact_at_every_small_length(w, kk, origin, ay, ax):
    """The bottom border's rows (from len / W - K: a len-dependent count of key rows) become
    a grid family bounded by k < len: exact, at every length through partial last rows."""
    table = lower(_clamped_window(w, kk, origin, ay, ax))
    tt = transpose(table)
    assert table.exact and tt.exact, summary(tt)
    for length in range(1, origin + w * (kk + 4) + 2):
        _check(table, length, {})


@settings(max_examples=60, deadline=None)
@given(w=st.integers(1, 8), kk=st.integers(1, 8), origin=st.integers(0, 6),
       ay=st.integers(0, 8), ax=st.integers(0, 8), y_only=st.booleans(),
       length=st.integers(1, 90))
def test_random_clamped_windows_transposed_equal_oracle(w, kk, origin, ay, ax, y_only, length):
    kk = min(kk, w) if not y_only else kk
    table = lower(_clamped_window(w, kk, origin, ay, ax, y_only))
    assert table.exact and transpose(table).exact, summary(transpose(table))
    assert (dense_from_table(table, length, {}) == dense(table.mask, length, {})).all()
    _check(table, length, {})


@pytest.mark.parametrize(("path", "defines", "intervals"), [
    ("benchmarks/generality/natten_clamped.mask", {}, 26 + 13),
    ("samples/natten2d.mask", {}, 14 + 7),
    ("benchmarks/generality/natten_clamped.mask", {"W": 20, "K": 5}, 10 + 5),
])
def test_clamped_windows_invert_into_one_family_of_query_rows(path, defines, intervals):
    """transpose.invert_clamps: a key row's query rows are one grid family (2K rows, each
    guarded by the clamp's exact step bounds) and one of K rows for sequences under K grid
    rows (the clamp's bounds crossed), where the case split gave 12 families (102 intervals
    for W 96, K 13); exact against the oracle on both sides of K grid rows."""
    table = front(ROOT / path, defines)
    tt = transpose(table)
    assert tt.exact and len(tt.terms) == 2
    assert tt.max_intervals_per_row() == intervals
    assert all(t.family is not None and t.family.grid is not None for t in tt.terms)
    w = defines.get("W", 96 if "clamped" in path else 64)
    k = defines.get("K", 13 if "clamped" in path else 7)
    for length in (w * k - 1, w * k, w * k + 5, w * (k + 3) + 7):
        _check(table, length, {})


@settings(max_examples=80, deadline=None)
@given(w=st.integers(1, 7), kk=st.integers(1, 6), origin=st.integers(0, 4),
       ay=st.integers(-2, 6), ax=st.integers(-2, 6), lo_y=st.integers(-3, 3),
       lo_x=st.integers(-3, 3), cut_y=st.integers(0, 8), cut_x=st.integers(0, 8),
       length=st.integers(1, 80))
def test_random_clamps_invert_exactly(w, kk, origin, ay, ax, lo_y, lo_x, cut_y, cut_x, length):
    """invert_clamps on clamps NATTEN's template does not write: any lower clamp A, any upper
    clamp (len-dependent rows - cut, or a constant W - cut, which may lie below A: the crossed
    case), windows placed before or after the query; against the oracle."""
    m = check(parse(f"""mask m
const W = {w}
const K = {kk}
const C = {origin}
let rows = (len - C) / W
let y0 = max({lo_y}, min((q - C) / W - ({ay}), rows - {cut_y}))
let x0 = max({lo_x}, min((q - C) % W - ({ax}), W - {cut_x}))
allow q >= C and k >= C and y0 <= (k - C) / W and (k - C) / W < y0 + K and x0 <= (k - C) % W and (k - C) % W < x0 + K
"""))
    table = lower(m)
    assert table.exact and transpose(table).exact, summary(transpose(table))
    _check(table, length, {})


IMAGE_SPANS = """mask spans_{i}
param S : segments
allow k <= q
allow {body}
"""


@pytest.mark.parametrize("body, exact", [
    ("same(S, q, k) and seg(S, q) % 2 == 1", (True, True)),  # generality/image_spans.mask
    ("same(S, k, q) and seg(S, k) % 2 == 1", (True, True)),  # the image guard on k's segment
    ("seg(S, k) == seg(S, q) and seg_start(S, k) > 2 and seg_end(S, k) - q < 4", (True, True)),
    # X another expression than q (the transposed same(S, k - 1, q) stays residual)
    ("same(S, q - 1, k) and seg(S, k) % 3 == 0", (True, False)),
    ("k < q + 3 and seg(S, k) % 2 == 1", (False, True)),  # k not held in a segment
    ("same(S, q, k + 1) and seg(S, k) % 2 == 1", (False, True)),  # k + 1's segment, not k's
])
def test_atoms_on_ks_segment_become_guards_where_k_is_in_xs(tmp_path, body, exact):
    """lower.in_segment_of: where a conjunction holds k inside X's segment, an atom on k's
    segment reads X's, so it is a guard (forward and transposed exact) and not a residual;
    both tables equal the oracle, also with repeated starts and text before the first."""
    path = tmp_path / "spans.mask"
    path.write_text(IMAGE_SPANS.format(i=0, body=body))
    table = front(path, {})
    assert (table.exact, transpose(table).exact) == exact, (summary(table),
                                                           summary(transpose(table)))
    rng = np.random.default_rng(11)
    for length, params in [*small_cases(table.mask, 5), (23, {"S": [0, 4, 4, 9, 23]}),
                           (19, {"S": [3, 3, 7, 19, 19]}), (12, {"S": []})]:
        assert_same_pairs(dense_from_table(table, length, params), dense(table.mask, length, params),
                          f"{body} len={length} params={params}")
        _check(table, length, params)
    for length in (300, 777):
        _check(table, length, random_params(table.mask, length, rng))


@st.composite
def _grid_and_segment_masks(draw) -> str:
    """Masks of the forms lower.in_segment_of, find_grid's coordinate divisions, grid_term's
    tight and clamped row bounds and the segment-bound inversion serve (windows of a grid
    coordinate, one-sided row windows beside k <= q, max / min row clamps, atoms on k's
    segment, documents by their bounds), mixed at random."""
    w = draw(st.sampled_from([3, 4, 5, 6, 8]))
    m = draw(st.sampled_from([2, 3, 4]))
    s = draw(st.integers(0, m))
    o = draw(st.sampled_from([0, 0, 2, 5]))
    r = draw(st.integers(0, 3))
    qy, qx, ky, kx = (f"(q - {o}) / {w}", f"(q - {o}) % {w}", f"(k - {o}) / {w}",
                      f"(k - {o}) % {w}")
    atoms = [f"({qy} + {s}) / {m} == ({ky} + {s}) / {m}",
             f"({qx} + {s}) / {m} == ({kx} + {s}) / {m}", f"{qy} - {ky} <= {r}",
             f"{ky} - {qy} <= {r}", f"abs({qx} - {kx}) <= {r}", "k <= q", "k < q", f"k >= {o}",
             f"q >= {o}", f"({kx} + {s}) / {m} <= ({qx} + {s}) / {m}", "same(S, q, k)",
             "seg(S, q) % 2 == 1", "seg(S, k) % 2 == 0", "seg(S, k) == seg(S, q)",
             f"seg_start(S, k) + {r} <= q", f"max({qy} - {r}, 0) <= {ky}",
             f"{ky} <= min({qy} + {r}, 4)", "seg_start(S, q) <= k", "k < seg_end(S, q)"]
    allows = draw(st.lists(st.lists(st.sampled_from(atoms), min_size=1, max_size=4, unique=True),
                           min_size=1, max_size=2))
    return "mask g\nparam S : segments\n" + "".join(f"allow {' and '.join(a)}\n" for a in allows)


@settings(max_examples=150, deadline=None)
@given(text=_grid_and_segment_masks(), starts=st.lists(st.integers(0, 41), max_size=4))
def test_random_grid_and_segment_masks_equal_the_oracle_both_ways(tmp_path_factory, text,
                                                                   starts):
    path = tmp_path_factory.mktemp("g") / "g.mask"
    path.write_text(text)
    table = front(path, {})
    for length in (1, 7, 23, 41):
        params = {"S": sorted(min(x, length) for x in starts)}
        _check(table, length, params)
        assert_same_pairs(dense_from_table(table, length, params),
                          dense(table.mask, length, params), text)


@pytest.mark.parametrize("body", [
    "seg_start(S, q) <= k <= q",  # packed documents, varlen style
    "k <= q\ndeny k < seg_start(S, q)",
    "k >= seg_start(S, q) and k < seg_end(S, q)",  # packed bidirectional documents
    "seg_start(S, k) <= q + 2 and seg_end(S, k) > q",
    "seg_start(S, k) < q and seg_end(S, k) >= q",
    "seg_start(S, k) <= q - 1 or seg_end(S, k) > q + 1",  # the forward keeps its residual
    "k <= q and q - k <= q % 8",  # Llama 4's chunks, two spellings
    "q - q % 8 <= k <= q",
])
def test_segment_bounds_and_chunk_starts_invert(tmp_path, body):
    """seg_start(S, k) <= q + c is k < seg_end(S, q + c) (c >= 0), seg_end(S, k) > q + c is k
    >= seg_start(S, q + c) (c <= 0), and A - x % C is (x / C) * C + (A - x): the transposed
    tables of documents written by their bounds, and of chunks written with %, are exact;
    both tables equal the oracle (repeated starts, text before the first, none)."""
    path = tmp_path / "m.mask"
    path.write_text(f"mask m\nparam S : segments\nallow {body}\n")
    table = front(path, {})
    assert transpose(table).exact, summary(transpose(table))
    for length, params in [*small_cases(table.mask, 3), (23, {"S": [0, 4, 4, 9, 23]}),
                           (19, {"S": [3, 3, 7, 19, 19]}), (12, {"S": []}), (40, {"S": [39]})]:
        assert_same_pairs(dense_from_table(table, length, params),
                          dense(table.mask, length, params), f"{body} {length} {params}")
        _check(table, length, params)
