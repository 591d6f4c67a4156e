"""The tile stage (cmc/tiling.py) and the patch-tiled plan of the sm90 kernel.

The choice: grid masks whose patches compute clearly fewer pairs get them, everything else
stays linear, with the reason. The plan: the part-A helpers (cmc_patch_geo_of, _box, _mark,
_full) and the generated grid_span hook, built for the host with g++, against the dense
mask of cmc.evaluate: every token sits in exactly one box position of one tile, as
tiling.tile_ids says; no key tile holding a visible pair of a query tile is skipped; a full
key tile has every pair visible; and per query row and grid row, the grid spans plus the
other terms' spans are exactly the visible keys (what the kernel ORs into its column bits).
"""

from __future__ import annotations

import subprocess
import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from cmc.driver import front
from cmc.evaluate import Env, eval_pred
from cmc.ir import LINEAR, Tiling
from cmc.tiling import choose_tiling, computed_pairs, patch_masks, tile_ids

from .conftest import ONE_SEQUENCE, ROOT, host_build, needs_gxx
from .conftest import emit_tiled as emit


def _table(stem: str, defines: dict[str, int] | None = None):
    return front(ROOT / "samples" / f"{stem}.mask", defines or {})


def test_clear_gets_patches_and_says_why():
    t = choose_tiling(_table("clear"))
    assert (t.kind, t.origin, t.width, t.patch_rows, t.patch_cols) == ("patch", 512, 128, 8, 16)
    assert "linear" in t.reason and "8x16" in t.reason
    assert t.box_rows == 16
    assert t.query_tiles(32768) == 4 + 32 * 8  # 252 grid rows -> 32 patch rows of 8 patches


def test_clear_tile_masks_are_proven_and_recorded():
    t = choose_tiling(_table("clear"))
    assert t.masks is not None and t.masks.classes == 15
    assert (t.masks.dpy_lo, t.masks.dpy_hi, t.masks.dpx_lo, t.masks.dpx_hi) == (-2, 3, -1, 2)
    assert "tile masks of 15 patch offsets" in t.reason
    assert t.to_dict()["masks"] == {"classes": 15, "dpy": [-2, 3], "dpx": [-1, 2]}
    assert "cmc_patch_mask_words[3840]" in emit(_table("clear"), archs=("sm_90a",)).text


def _clear_with(tmp_path: Path, extra: str):
    src = (ROOT / "samples" / "clear.mask").read_text() + extra
    path = tmp_path / "clear.mask"
    path.write_text(src)
    return front(path, {})


def test_tile_masks_refused_when_a_term_does_not_shift(tmp_path):
    """One grid key hidden far past any reference: the per-row shift check finds it."""
    table = _clear_with(tmp_path, "deny k == 300000\n")
    t = choose_tiling(table)
    assert t.kind == "patch" and t.masks is None
    assert "does not shift with its query" in t.reason


def test_tile_masks_refused_when_grid_rows_read_len(tmp_path):
    table = _clear_with(tmp_path, "allow q >= TEXT and k >= len - 3\n")
    t = choose_tiling(table)
    assert t.masks is None and "reads len" in t.reason


def test_linear_masks_stay_linear():
    for stem in ("causal", "hstu", "shared_prefix", "document_causal"):
        t = choose_tiling(_table(stem))
        assert (t.kind, t.reason) == ("linear", LINEAR.reason), stem


def test_units_are_pairs_unless_tile_costs_depend_on_run_time_parameters():
    # causal-like pairs (nqt - 1 - p, p) cost the same; a prompt length, segments or target
    # counts make tile costs invisible to the compiler: single tiles, costliest first
    assert choose_tiling(_table("causal")).units == "pairs"
    assert choose_tiling(_table("clear", {"TEXT": 0})).units == "pairs"
    # 512 text rows see every key: single tiles, those first (tests/test_sched.py)
    assert (choose_tiling(_table("clear")).units, choose_tiling(_table("clear")).heavy_tiles) == (
        "tiles", 4)
    for stem in ("hstu", "shared_prefix", "document_causal"):
        assert choose_tiling(_table(stem)).units == "tiles", stem
    t = choose_tiling(_table("natten2d"))  # 7 x 7 windows: 128-token patches lose
    assert t.kind == "linear" and "linear tiles" in t.reason


def test_unaligned_origin_gets_patches():
    """The grid may begin anywhere: its last linear tile is then partial."""
    t = choose_tiling(_table("clear", {"TEXT": 100}))
    assert (t.kind, t.origin, t.patch_rows, t.patch_cols) == ("patch", 100, 8, 16)
    assert t.masks is not None and "computed pairs at len" in t.reason
    n = 100 + 128 * 8 * 4  # 32 grid rows: 4 patch rows of 8 patches
    assert t.min_len <= n and t.query_tiles(n) == 1 + 4 * 8 and t.query_tiles(100) == 1
    # the plan holds 4096 key tiles: one of them is the partial linear tile
    assert t.max_len() == 100 + (4096 - 1) // 8 * 8 * 128


def test_grid_text_stays_linear_by_its_counts():
    """grid_text (text 77, width 48, radius 6): its grid is recognised and counted; 128-token
    linear tiles span 2.7 grid rows of 48 and compute fewer pairs than any patch whose
    columns divide 48, so it stays linear, and the reason says so with the counts; its
    linear tiles get band masks of 3 tile phases from key tile 1 (lattice_offset_masks)."""
    t = choose_tiling(front(ROOT / "benchmarks" / "generality" / "grid_text.mask"))
    assert t.kind == "linear" and t.offset_masks is not None
    assert t.reason.startswith("computed pairs at len 3149: linear 2670592; 16x8 3424256 (x 1.23: "
                               "the producer's TMA boxes); "
                               "8x16 3325952: linear tiles; band tile masks: tile masks of 15 "
                               "classes, 3 tile phases x 5 tile offsets (-2..2), key tiles "
                               "from 1 for interior query tiles")
    src = emit(front(ROOT / "benchmarks" / "generality" / "grid_text.mask"), archs=("sm_90a",))
    assert {v.tiling.reason for v in src.variants} == {t.reason}  # the manifest's, not "default"


def test_a_grid_no_patch_width_divides_says_so():
    """A 100-token-wide grid: no width of PATCH_COLS divides it, so no candidate is counted and
    the reason names the gap (padded patches are not built) instead of a bare 'linear'."""
    t = choose_tiling(front(ROOT / "benchmarks" / "generality" / "grid_text.mask",
                            {"TEXT": 0, "W": 100, "R": 16}))
    assert t.kind == "linear"
    assert t.reason.startswith("computed pairs at len 6400: linear 17924096; no patch width of "
                               "(8, 16, 32, 64) divides the grid width 100 (patches padded to "
                               "a multiple are not built): linear tiles")


def test_grid_origin_cases_get_their_tilings():
    """The GPU grid-origin test's cases (tests/gpu/test_gpu_grid_origin.py) get the tiling
    kind it asserts on sm_90a: checked here, where a wrong expectation costs no GPU time
    (clear at origin 133, width 80, radius 10 counted linear tiles cheaper)."""
    from cmc.driver import Options, run

    from .gpu.test_gpu_grid_origin import GRIDS

    for path, defines, asked, kind in GRIDS:
        opts = Options(archs=("sm_90a",), defines=tuple(sorted(defines.items())), tiling=asked)
        tiling = run(ROOT / path, opts, stop_after="tile").tiling
        assert tiling is not None and tiling.kind == kind, (path, defines, tiling)
        assert "computed pairs" in tiling.reason


def test_patches_keep_the_common_gain_and_masks_past_64_classes():
    """Width 96, radius 40: patches (16 % fewer pairs at the reference length), 8x16 although
    16x8 counts 5 % fewer, since a 16x8 key tile is 64 TMA boxes that bound the producer
    (producer_factor; 8x16 ran 1.45 x as fast, docs/kernel-notes.md "Run 17"). Asked for,
    16x8 keeps its 77 patch-offset tile masks (MAX_PATCH_MASK_CLASSES: run 12 ran them
    unmasked, 16 grid spans per row of a partial tile). A 25 % rule for unmasked patches
    (2026-12-05) sent it to the linear kernel, measured 2.2 x slower at 4K on the same tiles
    (H200, 111 against 245 TFLOP/s; "Unmasked patches: the rule withdrawn"). Width 160,
    radius 64 keeps patches without masks (the GPU tier's unmasked case)."""
    from cmc.tiling import MAX_MASK_CLASSES, MAX_PATCH_MASK_CLASSES

    grid = ROOT / "benchmarks" / "generality" / "grid_text.mask"
    table = front(grid, {"TEXT": 77, "W": 96, "R": 40})
    t = choose_tiling(table)
    assert (t.kind, t.patch_rows, t.patch_cols) == ("patch", 8, 16)
    assert "16x8 27344896 (x 1.23: the producer's TMA boxes); 8x16 28721152" in t.reason
    t = choose_tiling(table, (16, 8))
    m = t.masks
    assert m is not None
    assert MAX_MASK_CLASSES < (m.dpy_hi - m.dpy_lo) * (m.dpx_hi - m.dpx_lo) == 77 \
        <= MAX_PATCH_MASK_CLASSES
    t = choose_tiling(front(grid, {"TEXT": 77, "W": 160, "R": 64}))
    assert (t.kind, t.patch_rows, t.patch_cols, t.masks) == ("patch", 8, 16, None)


def test_producer_factor_weighs_tall_patches_only():
    """A 16x8 key tile's 64 boxes of 1 KiB take the TMA unit longer than its GEMMs (the fitted
    model gives the measured 4,190 cycles); every other shape, and linear tiles, are bound by
    their GEMMs (at either head dim: it scales the boxes and the GEMMs alike)."""
    from cmc.tiling import BOX_BYTES_PER_CYCLE, BOX_CYCLES, producer_factor

    assert 4100 < 64 * (BOX_CYCLES + 1024 / BOX_BYTES_PER_CYCLE) < 4300
    assert 4 * (BOX_CYCLES + 16384 / BOX_BYTES_PER_CYCLE) < 600  # linear: 480-590 measured
    assert producer_factor(16) > 1.15
    assert [producer_factor(r) for r in (1, 2, 4, 8)] == [1.0] * 4


def test_computed_pairs_counts_tiles():
    table = _table("causal")
    n = 1000
    tiles = -(-n // 128)
    assert computed_pairs(table, LINEAR, n) == tiles * (tiles + 1) // 2 * 128 * 128


def test_patches_cut_clear_work():
    table = _table("clear")
    n = 512 + 128 * 64
    lin = computed_pairs(table, LINEAR, n)
    pat = computed_pairs(table, choose_tiling(table), n)
    assert pat < 0.6 * lin


def test_emit_records_tiling_per_variant():
    src = emit(_table("clear"), archs=("sm_90a", "sm_100a"))
    kinds = {(v.kernel, v.tiling.kind) for v in src.variants}
    assert kinds == {("sm90", "patch"), ("portable", "linear")}
    assert "kTiling = 1" in src.text and "grid_span" in src.text
    lin = emit(_table("clear"), archs=("sm_90a",), tiling=LINEAR)
    assert all(v.tiling.kind == "linear" for v in lin.variants) and "kTiling = 0" in lin.text


# =========================================================================== host harness

PATCH_MAIN = r"""
static int rd() { int v; if (scanf("%d", &v) != 1) { exit(3); } return v; }

int main() {
  const int ncase = rd();
  for (int c = 0; c < ncase; ++c) {
    const int len = rd(), O = rd(), W = rd(), PH = rd(), PW = rd();
""" + ONE_SEQUENCE + r"""    const cmc_patch_geo g = cmc_patch_geo_of(len, O, W, PH, PW);
    printf("%d\n", g.nqt);
    const int nt = cmc_hooks::kTerms;
    std::vector<int> p(4 * nt);
    const int nw = (g.nqt + 31) / 32;
    for (int t = 0; t < g.nqt; ++t) {
      for (int b = 0; b < PH; ++b) printf("%d ", cmc_patch_box(g, t, b));
      const int lim = cmc_patch_lim(g, t, len);
      printf("%d\n", lim);
      // the plan of query tile t, as build_plan_patch makes it (serially)
      std::vector<unsigned> touched(nw, 0u), full(nw, 0u);
      const int qa = cmc_patch_box(g, t, 0);
      if (qa >= len) { printf("-\n"); continue; }
      const int e = cmc_patch_box(g, t, PH - 1) + PW - 1, qb = e < lim - 1 ? e : lim - 1;
      // one item list: x < nt the hull of term x, then term i over box b (patch tiles);
      // a linear tile (nbox 0) marks from its hull
      const int nbox = t < g.nlin ? 0 : PH;
      for (int x = 0; x < nt * (1 + nbox); ++x) {
        const bool hull = x < nt;
        const int y = x - nt, i = hull ? x : y / nbox, b = hull ? 0 : y - i * nbox;
        const int st = cmc_patch_box(g, t, b);
        if (st >= len) continue;
        const int lm = hull ? lim : len;
        const int end = hull ? cmc_patch_box(g, t, PH - 1) + PW - 1 : st + PW - 1;
        const int en = end < lm - 1 ? end : lm - 1;
        if (hull && (st != qa || en != qb)) { printf("hull %d %d != %d %d\n", st, en, qa, qb); return 2; }
        int r4[4];
        cmc_hooks::term(s, st, en, i, r4);
        if (hull) for (int c = 0; c < 4; ++c) p[4 * i + c] = r4[c];
        if (!hull || nbox == 0) cmc_patch_mark(touched.data(), g, r4[0], r4[1]);
      }
      for (int j = 0; j < g.nqt; ++j) {
        const bool tj = (touched[j >> 5] >> (j & 31)) & 1u;
        const bool fj = tj && cmc_patch_full(g, p.data(), nt, len, j);
        putchar(fj ? 'f' : (tj ? 'p' : '.'));
      }
      putchar('\n');
    }
    // per row and grid row: grid spans of every family, and the other terms' spans
    const int rows = len > O ? (len - O + W - 1) / W : 0;
    for (int qq = 0; qq < len; ++qq) {
      const cmc_hooks::row_t r = cmc_hooks::row(s, qq);
      std::vector<char> seen(len, '0');
      for (int ky = 0; ky < rows; ++ky) {
        for (int f = 0; f < cmc_hooks::kGridFamilies; ++f) {
          int lo, hi;
          cmc_hooks::grid_span(s, r, f, ky, lo, hi);
          if (hi > lo && (lo < O + ky * W || hi > O + (ky + 1) * W)) {
            printf("grid span outside its row: q %d ky %d\n", qq, ky); return 2;
          }
          for (int kk = lo; kk < hi; ++kk) seen[kk] = '1';
        }
      }
      for (int n = 0; n < cmc_hooks::kOtherTerms; ++n) {
        int lo, hi;
        if (cmc_hooks::grid_term(cmc_hooks::other_term(n))) { printf("other is grid\n"); return 2; }
        cmc_hooks::span(s, r, cmc_hooks::other_term(n), lo, hi);
        for (int kk = lo; kk < hi; ++kk) if (kk >= O) seen[kk] = '1';
      }
      for (int kk = O; kk < len; ++kk) putchar(seen[kk]);
      putchar('\n');
    }
    // the per-offset tile masks as the consumers read them (fragment order decoded)
    if (cmc_hooks::kPatchMasks) {
      static char m[128][129];
      cmc_uint2 w0;
      for (int t = 0; t < g.nqt; ++t)
        for (int j = 0; j < g.nqt; ++j) {
          if (!cmc_patch_tile_mask<cmc_hooks>(g, t, j, len, 0, 0, w0)) continue;
          printf("M %d %d\n", t, j);
          for (int r = 0; r < 128; ++r) { memset(m[r], '0', 128); m[r][128] = 0; }
          for (int th = 0; th < 256; ++th) {
            const int ct = th % 128, lane = ct % 32;
            const int lrow = (th / 128) * 64 + (ct / 32) * 16 + lane / 4, off = 2 * (lane % 4);
            cmc_uint2 w;
            cmc_patch_tile_mask<cmc_hooks>(g, t, j, len, th, off, w);
            for (int n = 0; n < 16; ++n)
              for (int e = 0; e < 2; ++e) {
                if ((w.x >> (e * 16 + n)) & 1u) m[lrow][8 * n + off + e] = '1';
                if ((w.y >> (e * 16 + n)) & 1u) m[lrow + 8][8 * n + off + e] = '1';
              }
          }
          for (int r = 0; r < 128; ++r) puts(m[r]);
        }
    }
    printf("E\n");
  }
  return 0;
}
"""


def _build(table, tiling: Tiling, workdir: Path) -> Path:
    src = emit(table, archs=("sm_90a",), tiling=tiling)
    return host_build(src.text, PATCH_MAIN.replace("DESC", src.layout.struct_name),
                      workdir / "patch")


def _dense(table, length: int) -> np.ndarray:
    qq = np.arange(length, dtype=np.int64)[:, None]
    kk = np.arange(length, dtype=np.int64)[None, :]
    v = eval_pred(table.mask.predicate, Env(length, {}, {"q": qq, "k": kk}))
    return np.broadcast_to(np.asarray(v, dtype=bool), (length, length))


def _check(table, tiling: Tiling, exe: Path, lengths: list[int],
           masked: list[tuple[int, int, int]] | None = None) -> dict[str, int]:
    """Run the host build on `lengths` and compare with the dense mask; `masked` collects
    (len, query tile, key tile) of every pair that selected a tile mask class."""
    toks = [len(lengths)]
    for n in lengths:
        toks += [n, tiling.origin_for(n), tiling.width, tiling.patch_rows, tiling.patch_cols]
    r = subprocess.run([str(exe)], input=" ".join(map(str, toks)), capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-4000:])
    lines = r.stdout.split("\n")
    pos = 0
    seen = {"f": 0, "p": 0, ".": 0, "m": 0, "cut": 0}
    for n in lengths:
        vis = _dense(table, n)
        nqt = int(lines[pos])
        pos += 1
        assert nqt == tiling.query_tiles(n)
        pw = tiling.patch_cols
        owner = np.full(n, -1)
        boxes = []
        for t in range(nqt):
            *starts, lim = (int(x) for x in lines[pos].split())
            assert lim == tile_limit(t, tiling, n), f"len {n}: limit of tile {t}"
            boxes.append(starts)
            for st in starts:
                for x in range(pw):
                    if st + x < lim:
                        assert owner[st + x] == -1, f"token {st + x} in two tiles"
                        owner[st + x] = t
            pos += 1
            plan = lines[pos]
            pos += 1
            if plan == "-":
                continue
            assert len(plan) == nqt
            rows = [s + x for s in starts for x in range(pw) if s + x < lim]
            for j, c in enumerate(plan):
                klim = tile_limit(j, tiling, n)
                keys = [s + x for s in boxes_of(j, nqt, tiling, n) for x in range(pw) if s + x < klim]
                blk = vis[np.ix_(rows, keys)] if keys else np.zeros((0, 0), bool)
                seen[c] += 1
                where = f"len {n}, query tile {t}, key tile {j}"
                if c == ".":
                    assert not blk.any(), f"skipped tile holds a visible pair: {where}"
                if c == "f":
                    assert len(keys) == 128 and blk.all(), f"full tile not all visible: {where}"
        assert (owner >= 0).all(), "a token in no tile"
        assert (owner == tile_ids(tiling, n)).all(), "C and Python tile numbering differ"
        o = tiling.origin_for(n)
        for qq in range(n):
            got = np.array([ch == "1" for ch in lines[pos]], dtype=bool)
            pos += 1
            assert (got == vis[qq, o:]).all(), (
                f"len {n}: row {qq}: grid + other spans {lines[pos - 1]} vs "
                f"{''.join('01'[x] for x in vis[qq, o:])}")
        while lines[pos] != "E":
            _, t, j = lines[pos].split()
            got = np.array([[ch == "1" for ch in ln] for ln in lines[pos + 1:pos + 129]])
            pos += 129
            qrows = [s + x for s in boxes_of(int(t), nqt, tiling, n) for x in range(pw)]
            keys = [s + x for s in boxes_of(int(j), nqt, tiling, n) for x in range(pw)]
            live = [r for r in range(128) if qrows[r] < n]  # rows past len are never stored
            kin = [c for c in range(128) if keys[c] < n]  # a key patch cut by len: a prefix
            want = vis[np.ix_([qrows[r] for r in live], [keys[c] for c in kin])]
            assert (got[np.ix_(live, kin)] == want).all(), f"len {n}: tile mask of tiles ({t}, {j})"
            assert not got[:, len(kin):].any(), f"len {n}: tile ({t}, {j}) has a key past len"
            seen["cut"] += int(len(kin) < 128)
            seen["m"] += 1
            if masked is not None:
                masked.append((n, int(t), int(j)))
        pos += 1
    return seen


def tile_limit(j: int, tiling: Tiling, n: int) -> int:
    """The end of tile j's own tokens (cmc_patch_lim, in Python): the origin for the linear
    tiles of a sequence whose grid begins inside its last one, else len."""
    o = tiling.origin_for(n)
    return o if j < -(-min(n, o) // 128) and o < n else n


def boxes_of(j: int, nqt: int, tiling: Tiling, n: int) -> list[int]:
    """Box starts of key tile j (cmc_patch_box, in Python)."""
    o = tiling.origin_for(n)
    nlin = -(-min(n, o) // 128)
    if j < nlin:
        return [j * 128 + b * tiling.patch_cols for b in range(tiling.patch_rows)]
    ngx = tiling.width // tiling.patch_cols
    u = j - nlin
    py, px = divmod(u, ngx)
    return [o + (py * tiling.patch_rows + b) * tiling.width + px * tiling.patch_cols
            for b in range(tiling.patch_rows)]


@pytest.fixture(scope="module")
def workdir():
    with tempfile.TemporaryDirectory(prefix="cmc-tiling-") as d:
        yield Path(d)


@needs_gxx
@pytest.mark.parametrize("shape", [(8, 16), (16, 8), (4, 32)])
def test_host_patch_plan_clear(shape, workdir):
    """A small CLEAR (text 128, grid width 32, radius 5) under several patch shapes, lengths
    ending inside grid rows and inside patch rows."""
    table = _table("clear", {"TEXT": 128, "W": 32, "R": 5})
    ph, pw = shape
    tiling = Tiling("patch", 128, 32, ph, pw, "test")
    masks, why = patch_masks(table, tiling)
    assert masks is not None, why
    for t in (tiling, replace(tiling, masks=masks)):
        exe = _build(table, t, workdir)
        seen = _check(table, t, exe, [1, 100, 128, 129, 128 + 32 * 7 + 5, 128 + 32 * 20, 700])
        assert seen["p"] > 0 and seen["f"] > 0 and seen["."] > 0
    assert seen["m"] > 0 and seen["cut"] > 0  # key patches cut by len have their classes


@needs_gxx
def test_host_patch_plan_short_sequences_are_linear(workdir):
    """Below min_len the patch kernel cuts a sequence into linear tiles (its grid origin
    moves to the sequence's end): the same plan, spans and tile-mask checks, both sides of
    the threshold."""
    table = _table("clear", {"TEXT": 128, "W": 32, "R": 5})
    tiling = Tiling("patch", 128, 32, 8, 16, "test")
    masks, _ = patch_masks(table, tiling)
    t = replace(tiling, masks=masks, min_len=128 + 32 * 8)
    assert t.query_tiles(128 + 32 * 8 - 1) == 3 and t.query_tiles(128 + 32 * 8) == 1 + 2
    exe = _build(table, t, workdir)
    seen = _check(table, t, exe, [100, 129, 128 + 32 * 8 - 1, 128 + 32 * 8, 128 + 32 * 17 + 3])
    assert seen["p"] > 0 and seen["m"] > 0


@needs_gxx
@pytest.mark.parametrize("origin,width,shape", [
    (0, 48, (8, 16)), (77, 48, (8, 16)), (133, 80, (16, 8)), (333, 96, (4, 32)),
    (77, 96, (8, 16)), (333, 48, (16, 8))])
def test_host_patch_plan_any_origin(origin, width, shape, workdir):
    """A small CLEAR whose grid begins at any token: the last linear tile is partial (its
    rows and keys stop at the origin), checked with and without tile masks at lengths
    shorter than the origin, ending inside the partial tile, and spanning grid rows."""
    table = _table("clear", {"TEXT": origin, "W": width, "R": 3})
    ph, pw = shape
    tiling = Tiling("patch", origin, width, ph, pw, "test")
    masks, why = patch_masks(table, tiling)
    assert masks is not None, why
    part = origin % 128
    lengths = sorted({max(1, origin - 5), origin, origin + 1, origin + 128 - part - 1 if part
                      else origin + 3, origin + width * 5 + 7, origin + width * (3 * ph) + 1})
    for t in (tiling, replace(tiling, masks=masks)):
        exe = _build(table, t, workdir)
        seen = _check(table, t, exe, lengths)
        assert seen["p"] > 0 and seen["."] > 0
    assert seen["m"] > 0


def test_min_len_is_counted_and_recorded():
    t = choose_tiling(_table("clear"))  # TEXT = 512: text rows dominate short sequences
    assert t.min_len == 512 + 128 * 16 and "patches from len 2560" in t.reason
    assert t.query_tiles(2559) == 20 and t.query_tiles(2560) == 4 + 2 * 8
    assert choose_tiling(_table("clear", {"TEXT": 0})).min_len == 1024


@needs_gxx
def test_host_patch_plan_natten(workdir):
    """NATTEN's windows shift inward at the borders (a grid family with a clamped base)."""
    table = _table("natten2d", {"W": 16, "K": 5})
    tiling = Tiling("patch", 0, 16, 16, 8, "test")
    masks, why = patch_masks(table, tiling)
    assert masks is None and "len" in why  # its windows' clamp at the last grid row
    exe = _build(table, tiling, workdir)
    seen = _check(table, tiling, exe, [16 * 5, 16 * 9 + 3, 16 * 64])
    assert seen["p"] > 0 and seen["."] > 0


@needs_gxx
def test_host_patch_plan_video3d(workdir):
    """A 3D neighbourhood (frames of 5 x 16 tokens) lowers to one grid family per frame
    offset, each instance in the grid row its GridRow names: the generated grid_span of
    every family, under a 2D patch tiling of the rows, against the dense oracle."""
    table = front(ROOT / "benchmarks" / "generality" / "video3d.mask",
                  {"FH": 5, "FW": 16, "RT": 1, "RY": 1, "RX": 2})
    assert table.exact and len(table.terms) == 3
    tiling = Tiling("patch", 0, 16, 16, 8, "test")
    masks, why = patch_masks(table, tiling)
    assert masks is None and "shift" in why  # frames of 5 rows: patch rows of 16 do not repeat
    exe = _build(table, tiling, workdir)
    seen = _check(table, tiling, exe, [16 * 5 * 2 + 7, 16 * 5 * 7, 16 * 64])
    assert seen["p"] > 0 and seen["."] > 0


# =========================================================================== linear grid spans

LINEAR_GRID_MAIN = r"""
static int rd() { int v; if (scanf("%d", &v) != 1) { exit(3); } return v; }

// Per row q: the keys the sm90 linear kernel's partial tiles OR together (MaskLinear with
// kGridFamilies > 0): grid_span of every family for every grid row of the span grid, and
// span of every other term. Printed as a 0/1 string of the row's keys.
int main() {
  const int ncase = rd();
  printf("%d %d %d\n", (int)cmc_hooks::kGridFamilies, (int)cmc_hooks::kSpanGridOrigin,
         (int)cmc_hooks::kSpanGridWidth);
  for (int c = 0; c < ncase; ++c) {
    const int len = rd();
""" + ONE_SEQUENCE + r"""    const int O = cmc_hooks::kSpanGridOrigin, W = cmc_hooks::kSpanGridWidth;
    const int rows = len > O ? (len - O + W - 1) / W : 0;
    for (int qq = 0; qq < len; ++qq) {
      const cmc_hooks::row_t r = cmc_hooks::row(s, qq);
      std::vector<char> seen(len, '0');
      for (int ky = 0; ky < rows; ++ky)
        for (int f = 0; f < cmc_hooks::kGridFamilies; ++f) {
          int lo, hi;
          cmc_hooks::grid_span(s, r, f, ky, lo, hi);
          if (hi > lo && (lo < O + ky * W || hi > O + (ky + 1) * W)) {
            printf("grid span outside its row: q %d ky %d\n", qq, ky); return 2;
          }
          for (int kk = lo; kk < hi && kk < len; ++kk) seen[kk] = '1';
        }
      for (int n = 0; n < cmc_hooks::kOtherTerms; ++n) {
        int lo, hi;
        if (!cmc_hooks::span(s, r, cmc_hooks::other_term(n), lo, hi)) { printf("residual\n"); return 2; }
        for (int kk = lo < 0 ? 0 : lo; kk < hi && kk < len; ++kk) seen[kk] = '1';
      }
      for (int kk = 0; kk < len; ++kk) putchar(seen[kk]);
      putchar('\n');
    }
  }
  return 0;
}
"""


@needs_gxx
@pytest.mark.parametrize(("mask", "defines", "lengths"), [
    ("samples/natten2d.mask", {}, [64 * 3 + 5, 64 * 9, 64 * 20 + 17]),
    ("benchmarks/generality/grid_text.mask", {}, [60, 77 + 48 * 4 + 7, 77 + 48 * 25]),
])
def test_linear_tiles_or_grid_spans_by_grid_row(mask, defines, lengths, workdir):
    """A linear tiling of a grid mask with many instances per family gets grid_span (one span
    per grid row a tile meets, as the patch kernel's linear tiles): the spans of every grid
    row and other term, ORed, are each row of the dense mask."""
    table = front(ROOT / mask, defines)
    assert choose_tiling(table).kind == "linear"
    src = emit(table, archs=("sm_90a",))
    exe = host_build(src.text, LINEAR_GRID_MAIN.replace("DESC", src.layout.struct_name),
                     workdir / "lingrid")
    r = subprocess.run([str(exe)], input=" ".join(map(str, [len(lengths), *lengths])),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-4000:])
    lines = r.stdout.split("\n")
    fams, origin, width = (int(x) for x in lines[0].split())
    grid = {(t.family.grid.origin, t.family.grid.width) for t in table.terms
            if t.family is not None and t.family.grid is not None}
    assert fams == 1 and grid == {(origin, width)}
    pos = 1
    for n in lengths:
        vis = _dense(table, n)
        for q in range(n):
            got = np.frombuffer(lines[pos].encode(), dtype=np.uint8) == ord("1")
            assert (got == vis[q]).all(), f"len {n} row {q}"
            pos += 1


def test_linear_grid_spans_only_where_rows_are_fewer():
    """video3d's three families (15 rows x families per tile, 27 instances) and masks without
    a grid keep the per-instance loop: no grid_span blocks in a linear tiling."""
    for path in ("benchmarks/generality/video3d.mask", "samples/causal.mask"):
        src = emit(front(ROOT / path, {}), archs=("sm_90a",))
        assert "kGridFamilies = 0," in src.text, path


def test_family_instances_divide_once_and_match_a_fresh_evaluation(monkeypatch):
    """A disc's instances share what does not read the family index (evaluate.Shared): the
    row intervals equal an evaluation of every instance on its own, and the grid's quotient
    and remainder of q are computed for the first instance only, not once per disc row."""
    import cmc.evaluate as ev
    from cmc.tiles import instances, iter_row_intervals

    table = _table("clear", {"R": 24})
    n = 4096
    q = np.arange(n, dtype=np.int64)
    divisions = [0]
    plain = ev._floordiv

    def counted(a, b):
        divisions[0] += 1
        return plain(a, b)

    monkeypatch.setattr(ev, "_floordiv", counted)
    got = list(iter_row_intervals(table, n, {}))
    shared_divisions = divisions[0]
    want = []
    for term in table.terms:
        for env in instances(term, Env(n, {}, {"q": q})):
            fresh = Env(env.length, env.params, env.vars, env.tables)  # no shared values
            want.append((np.broadcast_to(ev.eval_expr(term.lo.expr, fresh), q.shape),
                         np.broadcast_to(ev.eval_expr(term.hi.expr, fresh), q.shape)))
    instances_n = sum(1 for t in table.terms if t.family is not None
                      for _ in range(t.family.start, t.family.stop))
    assert instances_n > 40 and shared_divisions <= 4 < divisions[0] - shared_divisions
    assert len(got) == len(want)
    for ri, (lo, hi) in zip(got, want, strict=True):
        ok = ri.guard
        assert np.array_equal(ri.lo[ok], np.clip(lo, 0, n)[ok])
        assert np.array_equal(ri.hi[ok], np.clip(hi, 0, n)[ok])
