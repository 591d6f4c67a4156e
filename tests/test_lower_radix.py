"""Neighbourhoods over mixed-radix digits of q and k (frames x rows x columns) lower to exact
product families: the table equals the dense oracle, forward and transposed, and every
instance keeps its keys in the grid row its GridRow names."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest

from cmc.check import check
from cmc.driver import front
from cmc.evaluate import Env, eval_expr, eval_pred
from cmc.lower import Radix, dnf, find_radix, lower, nnf, split_k_calls, uses
from cmc.oracle import dense
from cmc.parse import parse
from cmc.tiles import dense_from_table, instances
from cmc.transpose import summary, transpose

ROOT = Path(__file__).resolve().parents[1]
VIDEO3D = ROOT / "benchmarks" / "generality" / "video3d.mask"

# The video neighbourhood with its radii and frame shape as constants; TEXT leading tokens
# (an origin) are fully connected when TEXT > 0.
VIDEO = """mask v
const TEXT = {text}
const FH = {fh}
const FW = {fw}
let qt = (q - TEXT) / (FH * FW)
let kt = (k - TEXT) / (FH * FW)
let qy = (q - TEXT) % (FH * FW) / FW
let ky = (k - TEXT) % (FH * FW) / FW
allow q < TEXT or k < TEXT
allow q >= TEXT and k >= TEXT and {window}
"""
WINDOW = ("abs(qt - kt) <= {rt} and abs(qy - ky) <= {ry} and "
          "abs((q - TEXT) % FW - (k - TEXT) % FW) <= {rx}")


def _mask(text=0, fh=3, fw=4, window=None, **radii):
    w = window or WINDOW.format(**{"rt": 1, "ry": 1, "rx": 1, **radii})
    src = VIDEO.format(text=text, fh=fh, fw=fw, window=w)
    return check(parse(src, "v.mask"))


def _exact_both_ways(table):
    assert table.exact and not table.residuals, table.residuals
    tt = transpose(table)
    assert tt.exact and not tt.residuals, summary(tt)
    return tt


def _equals_oracle(table, lengths):
    tt = transpose(table)
    for length in lengths:
        truth = dense(table.mask, length, {})
        got = dense_from_table(table, length, {})
        assert (got == truth).all(), (length, np.argwhere(got != truth)[:4].tolist())
        got_t = dense_from_table(tt, length, {})
        assert (got_t == truth.T).all(), (length, np.argwhere(got_t != truth.T)[:4].tolist())


def _rows_stay_in_grid_rows(table, length):
    """Every exact family instance with a GridRow keeps its keys in grid row base(q) + t."""
    q = np.arange(length, dtype=np.int64)
    for term in table.terms:
        fam = term.family
        if fam is None or fam.grid is None:
            continue
        g = fam.grid
        for env in instances(term, Env(length, {}, {"q": q})):
            t = env.vars[fam.index]
            ky = np.broadcast_to(eval_expr(g.base, env), q.shape) + g.step * t
            lo = np.broadcast_to(eval_expr(term.lo.expr, env), q.shape)
            hi = np.broadcast_to(eval_expr(term.hi.expr, env), q.shape)
            lo, hi = np.clip(lo, 0, length), np.clip(hi, 0, length)
            ok = np.broadcast_to(eval_pred(term.guard, env), q.shape) & (lo < hi)
            row0 = g.origin + ky * g.width
            assert (lo[ok] >= row0[ok]).all() and (hi[ok] <= row0[ok] + g.width).all()


def test_video3d_is_exact_as_product_families():
    table = front(VIDEO3D)
    tt = _exact_both_ways(table)
    # frame offsets -1..1, each a family over the row offsets -4..4: 27 intervals per row
    assert len(table.terms) == 3 and table.max_intervals_per_row() == 27
    assert all(t.family is not None and t.family.stop - t.family.start == 9
               and t.family.grid is not None and t.family.grid.width == 40
               for t in table.terms)
    assert tt.max_intervals_per_row() == 27
    _equals_oracle(table, (1, 500, 1000, 2100))
    _rows_stay_in_grid_rows(table, 2100)


@pytest.mark.parametrize("fh,fw,rt,ry,rx", [
    (3, 4, 1, 1, 1), (2, 3, 0, 1, 2), (3, 2, 2, 0, 0), (4, 3, 1, 2, 1), (1, 5, 1, 0, 2),
    (3, 3, 0, 0, 0), (2, 2, 1, 3, 3),
])
def test_table_equals_oracle_exhaustively(fh, fw, rt, ry, rx):
    for text in (0, 2):
        table = lower(_mask(text, fh, fw, rt=rt, ry=ry, rx=rx))
        _exact_both_ways(table)
        _equals_oracle(table, range(1, 41))
        _rows_stay_in_grid_rows(table, 40)


@pytest.mark.parametrize("window", [
    # asymmetric radii, one side strict
    "qt - 1 <= kt and kt <= qt and ky - qy in [-2, 1] and (k - TEXT) % FW - (q - TEXT) % FW < 2"
    " and (q - TEXT) % FW - (k - TEXT) % FW <= 1",
    # no row window: every row of the frames in range
    "abs(qt - kt) <= 1 and abs((q - TEXT) % FW - (k - TEXT) % FW) <= 1",
    # the two frames before, rows windowed, every column, causal keys (k bounds too)
    "qt - 2 <= kt and kt <= qt and abs(qy - ky) <= 1 and k <= q",
    # the row in the frame written as (k / FW) % FH, a window not centred on q
    "abs(qt - kt) <= 1 and abs((q - TEXT) / FW % FH - 1 - (k - TEXT) / FW % FH) <= 1",
    # a negated window: outside the row band, inside the frame band
    "abs(qt - kt) <= 1 and not abs(qy - ky) > 1 and abs(qt - kt) >= 0",
])
def test_variants_equal_oracle(window):
    for text in (0, 3):
        table = lower(_mask(text, 3, 4, window=window))
        _exact_both_ways(table)
        _equals_oracle(table, (1, 5, 12, 13, 29, 40))


def test_frame_size_not_a_multiple_of_128_and_rt_zero():
    for defines in ({"FH": 5, "FW": 7}, {"RT": 0}, {"RT": 0, "RY": 0},
                    {"RT": 2, "RY": 1, "RX": 3, "FH": 6, "FW": 9}):
        table = front(VIDEO3D, defines)
        _exact_both_ways(table)
        _equals_oracle(table, (37, 200, 333))


def test_asymmetric_radii_at_default_shape():
    src = VIDEO3D.read_text().replace(
        "allow abs(qt - kt) <= RT and abs(qy - ky) <= RY and abs(q % FW - k % FW) <= RX",
        "allow kt <= qt and qt - kt <= 2 and ky - qy in [-3, 1] and abs(q % FW - k % FW) <= RX")
    table = lower(check(parse(src, "v.mask")))
    _exact_both_ways(table)
    assert table.max_intervals_per_row() == 3 * 5
    _equals_oracle(table, (2900,))


def test_find_radix():
    mask = _mask(0, 3, 4, window=WINDOW.format(rt=1, ry=1, rx=1))
    (conj,) = dnf(split_k_calls(nnf(mask.allows[1])))
    assert find_radix([a for a in conj if uses(a, "k")]) == Radix(0, (1, 4, 12))
    # radices that do not divide each other are no decomposition: residual, still exact
    table = lower(_mask(0, 3, 4, window="abs(qy - ky) <= 1 and abs(q % 5 - k % 5) <= 1"))
    assert not table.exact
    _equals_oracle(table, (13, 40))


def test_instance_limit_keeps_the_residual():
    # 3 x 201 row offsets: past the 512 instances a kernel plan holds
    table = front(VIDEO3D, {"RY": 100, "FH": 300})
    assert not table.exact
    assert "cannot invert" in table.residuals[0].reason


def test_natten_and_clear_tables_unchanged():
    for stem, terms, per_row in (("natten2d", 1, 7), ("clear", 3, 33)):
        table = front(ROOT / "samples" / f"{stem}.mask")
        assert table.exact and len(table.terms) == terms
        assert table.max_intervals_per_row() == per_row


def test_products_cover_every_offset():
    """Every (frame, row) offset pair is one instance of one family."""
    table = front(VIDEO3D, {"RT": 2, "RY": 3})
    seen = set()
    q = np.array([5000], dtype=np.int64)
    qt, qy = 5000 // 960, 5000 % 960 // 40
    for term in table.terms:
        for env in instances(term, Env(20000, {}, {"q": q})):
            lo = int(np.asarray(eval_expr(term.lo.expr, env)).reshape(-1)[0])
            seen.add((lo // 960 - qt, lo % 960 // 40 - qy))
    assert seen == set(itertools.product(range(-2, 3), range(-3, 4)))


def test_a_radix_without_a_row_digit_is_no_grid():
    """Hypothesis found (2026-12-05) a mask whose only digits were k / 1 and (k + k) % 1:
    a radix with bounds (1,) has no row digit, and radix_terms indexed bounds[1]."""
    from cmc.ir import BinOp, Cmp, Const, Var
    from cmc.lower import Radix, radix_terms

    k = Var("k")
    atoms = [Cmp("<", k, BinOp("+", k, k)),
             Cmp(">=", BinOp("/", k, Const(1)), BinOp("%", BinOp("+", k, k), Const(1)))]
    assert radix_terms([], atoms, Radix(origin=0, bounds=(1,))) is None
