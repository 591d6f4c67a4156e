"""Tile masks of the interior query patches of clamped (NATTEN-style) neighbourhoods
(cmc/tiling.py `interior_patch_masks`, the kernel's `cmc_patch_class_of`), shared by the
interior columns or one set per query patch column (a border column's clamped window).

Small natten_clamped variants are built for the host with g++ (the plan and span checks of
tests/test_tiling.py run too): every pair that selects a mask class decodes, in the
consumers' fragment order, to the dense mask of the predicate; only interior query patches
select one; and interior pairs do select one, at lengths with and without an interior.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from cmc.driver import front
from cmc.ir import Tiling
from cmc.tiling import _interior_masks, choose_tiling, interior_patch_masks, patch_masks

from .conftest import ROOT
from .test_tiling import _build, _check, needs_gxx, workdir  # noqa: F401  (fixture)

NATTEN = ROOT / "benchmarks" / "generality" / "natten_clamped.mask"


def _natten(w: int, k: int):
    return front(NATTEN, {"W": w, "K": k})


def _interior(tiling: Tiling, n: int, t: int) -> bool:
    """Query tile t is an interior patch at len n (ir.PatchInterior, in Python)."""
    inner = tiling.masks.interior
    o, w, ph = tiling.origin_for(n), tiling.width, tiling.patch_rows
    nlin = -(-min(n, o) // 128)
    if t < nlin:
        return False
    py, px = divmod(t - nlin, w // tiling.patch_cols)
    return (py >= inner.row_top and inner.col_lo <= px < inner.col_hi
            and o + ((py + 1) * ph + inner.rows_below) * w <= n)


@needs_gxx
@pytest.mark.parametrize("per_column", [False, True])
@pytest.mark.parametrize("w,k,shape", [(32, 5, (16, 8)), (48, 7, (8, 16)), (96, 13, (16, 8)),
                                       (32, 5, (8, 16)), (96, 13, (8, 16))])
def test_interior_masks_equal_the_dense_mask(w, k, shape, per_column, workdir):  # noqa: F811
    table = _natten(w, k)
    ph, pw = shape
    tiling = Tiling("patch", 0, w, ph, pw, "test")
    plain, why = patch_masks(table, tiling)
    assert plain is None and "len" in why
    r = k // 2  # the window's reach: what the stage must have derived, not been told
    masks, why = _interior_masks(table, tiling, per_column)
    if not per_column and -(-r // pw) >= (w - r) // pw:  # every patch column holds a clamp
        assert masks is None and "not regular" in why
        return
    assert masks is not None and masks.interior is not None, why
    inner = masks.interior
    assert inner.rows_below == r
    assert inner.row_top == -(-r // ph)
    if per_column:
        assert (inner.col_lo, inner.col_hi, inner.per_column) == (0, w // pw, True)
        assert masks.classes == masks.offsets * (w // pw)
    else:
        assert inner.col_lo == -(-r // pw) and inner.col_hi == (w - r) // pw
    t = replace(tiling, masks=masks)
    first = ((inner.row_top + 1) * ph + r) * w  # the shortest len with an interior patch
    lengths = [w * 3 + 1, first - 1, first, first + w * ph + 5]
    masked: list[tuple[int, int, int]] = []
    seen = _check(table, t, _build(table, t, workdir), lengths, masked)
    assert seen["m"] > 0 and seen["p"] > 0
    assert all(_interior(t, n, qt) for n, qt, _ in masked), "a border patch selected a class"
    assert {n for n, _, _ in masked} == {first, first + w * ph + 5}


def test_natten_clamped_gets_interior_masks():
    """8x16 as chosen (16x8 counts 3 % fewer pairs, but its 64 boxes per key tile bound the
    producer: tiling.producer_factor), and 16x8 as asked for: both with interior masks."""
    t = choose_tiling(front(NATTEN, {}))
    assert (t.kind, t.patch_rows, t.patch_cols) == ("patch", 8, 16)
    assert t.masks is not None and t.masks.offsets == 9 and t.masks.classes == 54
    assert t.masks.to_dict()["interior"] == {"row_top": 1, "rows_below": 6, "cols": [0, 6],
                                             "per_column": True}
    assert "for each of the 6 patch columns for interior query patches" in t.reason
    t = choose_tiling(front(NATTEN, {}), (16, 8))
    assert t.masks is not None and t.masks.classes == 9 * 12
    assert t.masks.to_dict()["interior"] == {"row_top": 1, "rows_below": 6, "cols": [0, 12],
                                             "per_column": True}


def test_interior_masks_per_column_only_where_they_take_in_more_columns():
    """W 32, 16-token patch columns: both columns hold a clamped query column, so only
    masks per column have an interior; a window that never clamps keeps the shared ones."""
    table = _natten(32, 5)
    tiling = Tiling("patch", 0, 32, 8, 16, "test")
    shared, why = _interior_masks(table, tiling, per_column=False)
    assert shared is None and "not regular" in why
    masks, why = interior_patch_masks(table, tiling)
    assert masks is not None and masks.interior is not None and masks.interior.per_column, why
    many = _natten(32 * 40, 5)  # a grid this wide: 80 patch columns, 720 classes per column
    masks, why = interior_patch_masks(many, Tiling("patch", 0, 32 * 40, 8, 16, "test"))
    assert masks is not None and masks.interior is not None, why
    assert not masks.interior.per_column and masks.classes == 9


@needs_gxx
def test_a_column_that_sees_nothing_gets_empty_masks(tmp_path, workdir):  # noqa: F811
    """Queries of the first patch column (x < 16) see no key: per column, its classes
    are empty (nothing visible), the others clamp as NATTEN's; dense-checked."""
    src = NATTEN.read_text().replace("allow y0 <= k / W", "allow qx >= 16 and y0 <= k / W")
    path = tmp_path / "natten_blind.mask"
    path.write_text(src)
    table = front(path, {"W": 32, "K": 5})
    tiling = Tiling("patch", 0, 32, 8, 16, "test")
    masks, why = interior_patch_masks(table, tiling)
    assert masks is not None and masks.interior is not None and masks.interior.per_column, why
    t = replace(tiling, masks=masks)
    inner = masks.interior
    first = ((inner.row_top + 1) * 8 + inner.rows_below) * 32
    masked: list[tuple[int, int, int]] = []
    seen = _check(table, t, _build(table, t, workdir), [first, first + 32 * 8 + 5], masked)
    assert seen["m"] > 0


def test_interior_masks_refused_when_every_window_reads_len(tmp_path):
    """A window whose row moves with len's parity on every row: no interior is len-free."""
    src = NATTEN.read_text().replace("let y0 = max(0, min(qy - K / 2, rows - K))",
                                     "let y0 = max(0, min(qy - K / 2 + rows % 2, rows - K))")
    path = tmp_path / "natten_parity.mask"
    path.write_text(src)
    masks, why = interior_patch_masks(front(path, {"W": 32, "K": 5}),
                                      Tiling("patch", 0, 32, 16, 8, "test"))
    assert masks is None and "depend on len" in why


def test_over_len_bounds_are_sound():
    """The interval evaluation over len contains every value at every len of the range."""
    from cmc.evaluate import Env, eval_expr
    from cmc.tiling import _over_len

    table = _natten(32, 5)
    term = table.terms[0]
    q = np.arange(0, 32 * 40, 7, dtype=np.int64)
    lmin = np.full(q.shape, 32 * 20, dtype=np.int64)
    lmax = np.full(q.shape, 32 * 40, dtype=np.int64)
    env = Env(32 * 40, {}, {"q": q, term.family.index: 3})
    lo, hi = (np.broadcast_to(x, q.shape) for x in _over_len(term.lo.expr, env, lmin, lmax))
    for n in range(32 * 20, 32 * 40 + 1, 13):
        v = np.broadcast_to(eval_expr(term.lo.expr, Env(n, {}, env.vars)), q.shape)
        assert ((lo <= v) & (v <= hi)).all()
    assert (lo < hi).any()  # the bottom rows' window does move with len


@needs_gxx
def test_a_too_small_interior_is_caught(workdir):  # noqa: F811
    """One grid row less below the patch lets a bottom-border patch select a class: the
    dense comparison catches it (the check above can fail)."""
    table = _natten(32, 5)
    tiling = Tiling("patch", 0, 32, 16, 8, "test")
    masks, _ = interior_patch_masks(table, tiling)
    inner = replace(masks.interior, rows_below=masks.interior.rows_below - 1)
    t = replace(tiling, masks=replace(masks, interior=inner))
    first = ((inner.row_top + 1) * 16 + inner.rows_below) * 32
    with pytest.raises(AssertionError, match="tile mask of tiles"):
        _check(table, t, _build(table, t, workdir), [first])
