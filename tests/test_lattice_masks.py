"""Per-offset tile masks of LINEAR tiles for an interior band of a clamped grid mask
(cmc/tiling.py lattice_offset_masks; samples/natten2d.mask, W 64, 7 x 7 clamped).

A linear tile is 128 / W whole grid rows, so tiles translate by whole rows; the proof finds
the band of query tiles whose windows are translates of the centre tile's and do not
depend on len. Here: the table in the consumers' fragment order (emit.sm90_mask_words),
decoded back, equals the dense mask for every (band query tile, key tile below len) pair at
lengths with no band, exactly the first band tile, a partial last row, and longer; border
query tiles never select a mask; a band one tile too wide (at the top or at the bottom) is
caught by the same dense comparison. With g++: the emitted source's own rule helper
(cmc_offset_band) and cmc_offset_tile_mask, as the sm90 forward's fetch_mask calls them,
select and decode the same masks; border query tiles select nothing.
"""

from __future__ import annotations

import subprocess
import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from cmc.driver import front
from cmc.emit import sm90_mask_words
from cmc.evaluate import Env, eval_pred
from cmc.ir import TILE, LinearBand, OffsetMasks
from cmc.tiling import choose_tiling, lattice_offset_masks

from .conftest import ROOT, host_build, needs_gxx
from .conftest import emit_tiled as emit
from .test_offset_masks import DECODE_TILE

NATTEN = """doc "clamped neighbourhood"
const W = {w}
const K = {k}
let rows = len / W
let qy = q / W
let qx = q % W
let y0 = max(0, min(qy - K / 2, rows - K))
let x0 = max(0, min(qx - K / 2, W - K))
allow y0 <= k / W < y0 + K and x0 <= k % W < x0 + K"""


def _natten(tmp_path: Path, w: int, k: int):
    path = tmp_path / f"n{w}_{k}.mask"
    path.write_text(f"mask n{w}_{k}\n" + NATTEN.format(w=w, k=k) + "\n")
    return front(path, {})


def _decoded(masks: OffsetMasks) -> np.ndarray:
    """[class, lr, lk] read back from the words in the consumers' fragment order."""
    words = sm90_mask_words(masks)
    out = np.zeros((masks.classes, TILE, TILE), dtype=bool)
    for i, (w0, w1) in enumerate(words):
        c, t = divmod(i, 256)
        cw, ctid = divmod(t, 128)
        warp, lane = divmod(ctid, 32)
        lrow = cw * 64 + warp * 16 + (lane >> 2)
        off = 2 * (lane & 3)
        for r, wd in ((lrow, w0), (lrow + 8, w1)):
            for n in range(16):
                for e in range(2):
                    if (wd >> (e * 16 + n)) & 1:
                        out[c, r, 8 * n + off + e] = True
    return out


def _dense(table, length: int) -> np.ndarray:
    q = np.arange(length, dtype=np.int64)[:, None]
    k = np.arange(length, dtype=np.int64)[None, :]
    return np.broadcast_to(eval_pred(table.mask.predicate, Env(length, {}, {"q": q, "k": k})),
                           (length, length))


def _mismatches(table, masks: OffsetMasks, band: LinearBand, lengths: list[int]) -> list[str]:
    dec = _decoded(masks)
    bad: list[str] = []
    for n in lengths:
        dense = _dense(table, n)
        for qt in range(-(-n // TILE)):
            if not band.holds(qt, n):
                continue
            for kt in range(band.key_tile_lo, n // TILE):  # grid key tiles wholly below len
                dt = kt - qt
                c = (qt % masks.phases) * masks.offsets + dt - masks.lo
                m = (dec[c] if masks.lo <= dt < masks.hi
                     else np.zeros((TILE, TILE), dtype=bool))
                want = dense[qt * TILE:(qt + 1) * TILE, kt * TILE:(kt + 1) * TILE]
                if want.shape == m.shape and not np.array_equal(m, want):
                    bad.append(f"len {n} qt {qt} kt {kt}")
    return bad


def _lengths(band: LinearBand) -> list[int]:
    first = (band.tile_top + 1 + band.tiles_below) * TILE  # the first band tile's length
    return [first - 64, first - 1, first, first + 37, first + 64 * 3 + 5, 4096, 4096 + 100]


def test_natten2d_gets_a_band():
    table = front(ROOT / "samples" / "natten2d.mask", {})
    masks, why = lattice_offset_masks(table)
    assert masks is not None, why
    # 7 x 7 window, 2 rows per tile: rows 0..2 are clamped at the top (tiles 0, 1); a tile
    # of rows 2t, 2t + 1 needs rows >= 2t + 5 (len >= (t + 2.5) * 128)
    assert masks.band == LinearBand(2, 2, 1 << 18)
    assert (masks.lo, masks.hi) == (-2, 3)
    assert "5 tile offsets" in why and "from tile 2" in why


@pytest.mark.parametrize("w,k", [(64, 7), (32, 5), (128, 9), (16, 3), (48, 5), (80, 7)])
def test_band_masks_equal_the_dense_mask(tmp_path, w, k):
    table = _natten(tmp_path, w, k) if (w, k) != (64, 7) else front(
        ROOT / "samples" / "natten2d.mask", {})
    masks, why = lattice_offset_masks(table, max_len=1 << 14)
    assert masks is not None and masks.band is not None, why
    band = masks.band
    lengths = _lengths(band)
    assert not band.holds(band.tile_top, lengths[1])  # one token short: no band tile
    assert band.holds(band.tile_top, lengths[2])
    assert _mismatches(table, masks, band, lengths) == []
    # border query tiles never select a mask
    for n in lengths:
        for qt in range(-(-n // TILE)):
            if qt < band.tile_top or (qt + 1 + band.tiles_below) * TILE > n:
                assert not band.holds(qt, n)
    assert not band.holds(band.tile_top + 1, band.max_len + TILE)  # nothing above max_len


@pytest.mark.parametrize("w,k", [(64, 7), (32, 5)])
def test_a_band_one_tile_too_wide_is_caught(tmp_path, w, k):
    table = _natten(tmp_path, w, k)
    masks, _ = lattice_offset_masks(table, max_len=1 << 14)
    assert masks is not None and masks.band is not None
    band = masks.band
    lengths = _lengths(band) + [(band.tile_top + 1 + band.tiles_below) * TILE + 64 * j
                                for j in range(-2, 3)]
    low = replace(band, tiles_below=band.tiles_below - 1)
    assert _mismatches(table, masks, low, sorted(set(lengths)))
    if band.tile_top > 0:
        high = replace(band, tile_top=band.tile_top - 1)
        assert _mismatches(table, masks, high, lengths)


@pytest.mark.parametrize("body,why", [
    ("allow k <= q", "no grid family"),
])
def test_refusals(tmp_path, body, why):
    path = tmp_path / "r.mask"
    path.write_text("mask r\n" + body + "\n")
    masks, reason = lattice_offset_masks(front(path, {}), max_len=1 << 14)
    assert masks is None and why in reason, reason


def test_phases_and_text_before_the_grid():
    """A width that does not divide 128 repeats every W / gcd(128, W) tiles (grid_text: 48,
    3 phases), and text before the grid (77 tokens) leaves key tile 0 out of the masks: the
    decoded classes equal the dense mask on every band pair with a grid key tile; including
    key tile 0 (text and grid keys) would not."""
    table = front(ROOT / "benchmarks" / "generality" / "grid_text.mask", {})
    masks, why = lattice_offset_masks(table, max_len=1 << 14)
    assert masks is not None and masks.band is not None, why
    assert (masks.phases, masks.band.key_tile_lo) == (3, 1)
    assert "3 tile phases x" in why and "key tiles from 1" in why
    lengths = _lengths(masks.band)
    assert _mismatches(table, masks, masks.band, lengths) == []
    wide = replace(masks.band, key_tile_lo=0)
    assert _mismatches(table, masks, wide, lengths)
    one = replace(masks, phases=1, rows=masks.rows[:masks.offsets * TILE])
    assert _mismatches(table, one, masks.band, lengths)  # a single phase would be wrong


@pytest.mark.parametrize("path", ["samples/natten2d.mask",
                                  "benchmarks/generality/grid_text.mask",
                                  "benchmarks/generality/video3d.mask"])
def test_band_manifests_pass_the_schema(tmp_path, path):
    """The manifest's tiling.offset_masks with a band (and phases, key_tile_lo) conforms to
    schema/manifest.schema.json: `cmc inspect` refused natten2d's band until 2026-12-05."""
    from cmc.driver import compile_file
    from cmc.manifest_check import schema_problems

    art = compile_file(ROOT / path, tmp_path, archs=["sm_90a"], dtypes=["bf16"],
                       head_dims=[64], backward=False)
    import json

    m = json.loads((art / "manifest.json").read_text())
    om = [k["tiling"]["offset_masks"] for k in m["kernels"] if k["kernel"] == "sm90"]
    assert om and om[0] and "band" in om[0]
    assert ("phases" in om[0]) == (not path.endswith("natten2d.mask"))
    assert schema_problems(m) == []


VIDEO = """doc "3D neighbourhood: frames of FH x FW tokens"
const FH = {fh}
const FW = {fw}
let qy = q % (FH * FW) / FW
let ky = k % (FH * FW) / FW
allow abs(q / (FH * FW) - k / (FH * FW)) <= 1 and abs(qy - ky) <= 2 and abs(q % FW - k % FW) <= 3"""


def test_swin_windows_repeat_by_window_rows():
    """(q / W + S) / M repeats every M grid rows, not every M tokens (_lattice_period takes
    the least multiple of the base period that moves the mask onto itself): every query
    tile is in the band, 49 phases."""
    masks, why = lattice_offset_masks(front(ROOT / "benchmarks" / "generality" / "swin.mask",
                                            {}))
    assert masks is not None and masks.band is not None, why
    assert masks.phases == 49 and (masks.lo, masks.hi) == (-3, 4), why
    assert (masks.band.tile_top, masks.band.tiles_below) == (0, 0), why


def test_a_video_repeats_by_frames():
    """video3d (frames of 24 x 40 tokens): the lattice's period is the frame, 960 tokens, so 15
    tile phases (5, the grid width's, would be wrong at frame borders); the decoded classes
    equal the dense mask on every band pair, and with the grid width's 5 phases they would
    not."""
    table = front(ROOT / "benchmarks" / "generality" / "video3d.mask", {})
    masks, why = lattice_offset_masks(table, max_len=1 << 14)
    assert masks is not None and masks.band is not None, why
    assert (masks.phases, masks.offsets) == (15, 19) and "a period of 960 tokens" in why, why
    lengths = _lengths(masks.band) + [2880, 1920 * 3 + 17, 8192]
    assert _mismatches(table, masks, masks.band, lengths) == []
    five = replace(masks, phases=5, rows=masks.rows[:5 * masks.offsets * TILE])
    assert _mismatches(table, five, masks.band, lengths)


def test_too_many_classes_are_refused(tmp_path):
    """Frames of 23 x 52 tokens repeat every 1196 tokens: 299 phases x 11 tile offsets."""
    path = tmp_path / "v.mask"
    path.write_text("mask v\n" + VIDEO.format(fh=23, fw=52) + "\n")
    from cmc.tiling import MAX_LATTICE_MASK_CLASSES

    masks, why = lattice_offset_masks(front(path, {}))
    assert 299 * 11 > MAX_LATTICE_MASK_CLASSES
    assert masks is None and "299 phases x" in why and \
        f"more than {MAX_LATTICE_MASK_CLASSES} classes" in why, why


def test_show_says_what_was_proved():
    from click.testing import CliRunner

    from cmc.cli import cli
    res = CliRunner().invoke(cli, ["show", str(ROOT / "samples" / "natten2d.mask"),
                                   "--len", "4096"])
    assert res.exit_code == 0, res.output
    assert "band tile masks (applied): 5 tile offsets (-2..2, 10 KiB in the cubin)" in res.output
    res = CliRunner().invoke(cli, ["check", str(ROOT / "samples" / "natten2d.mask")])
    assert res.exit_code == 0, res.output
    assert "sm90 band tile masks: applied on interior query tiles (10 KiB" in res.output


def test_choose_tiling_attaches_the_band():
    table = front(ROOT / "samples" / "natten2d.mask", {})
    t = choose_tiling(table)
    assert t.kind == "linear" and t.offset_masks is not None
    assert t.offset_masks.band == LinearBand(2, 2, 1 << 18)
    assert "band tile masks: tile masks of 5 tile offsets" in t.reason
    assert t.to_dict()["offset_masks"] == {
        "classes": 5, "offsets": [-2, 3],
        "band": {"tile_top": 2, "tiles_below": 2, "max_len": 1 << 18}}
    text = emit(table, archs=("sm_90a",)).text
    for line in ("kOffsetMasks = 1", "kOffsetBand = 1", "kBandTileTop = 2", "kBandTilesBelow = 2",
                 "kBandMaxLen = 262144"):
        assert line in text, line
    # dilated_band's stage-12 masks hold for every tile: no band
    dil = front(ROOT / "benchmarks" / "generality" / "dilated_band.mask", {})
    td = choose_tiling(dil)
    assert td.offset_masks is not None and td.offset_masks.band is None
    assert "kOffsetBand = 0" in emit(dil, archs=("sm_90a",)).text


# =========================================================================== host harness

MAIN = DECODE_TILE + r"""
int main() {
  const int ncase = rd();
  for (int c = 0; c < ncase; ++c) {
    const int len = rd(), nt = (len + 127) / 128;
    for (int t = 0; t < nt; ++t)
      for (int j = 0; j < nt; ++j) {
        // as fetch_mask: the band rule, then the tile offset's words
        if (!cmc_offset_band(t, j, len, cmc_hooks::kBandTileTop, cmc_hooks::kBandTilesBelow,
                             cmc_hooks::kBandMaxLen, cmc_hooks::kBandKeyTileLo))
          continue;
        printf("%d %d %d\n", len, t, j);
        decode_tile(t, j, len);
      }
  }
  return 0;
}
"""


def _host_selected(table, workdir: Path, lengths: list[int]) -> dict[tuple[int, int, int], np.ndarray]:
    """(len, qt, j) -> the 128 x 128 mask the emitted helpers select and decode."""
    t = choose_tiling(table)
    assert t.offset_masks is not None and t.offset_masks.band is not None, t.reason
    src = emit(table, archs=("sm_90a",), tiling=t)
    exe = host_build(src.text, MAIN, workdir / table.mask.name)
    r = subprocess.run([str(exe)], input=" ".join(map(str, [len(lengths), *lengths])),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-4000:]
    lines = r.stdout.split("\n")
    out: dict[tuple[int, int, int], np.ndarray] = {}
    pos = 0
    while pos < len(lines) and lines[pos]:
        n, qt, j = map(int, lines[pos].split())
        block = "".join(lines[pos + 1:pos + 129]).encode()
        out[(n, qt, j)] = (np.frombuffer(block, dtype=np.uint8) == ord("1")).reshape(TILE, TILE)
        pos += 129
    return out


@needs_gxx
@pytest.mark.parametrize("case", ["natten2d", (32, 5), (48, 5), "grid_text", "video3d", "swin",
                                  "raster_local"])
def test_host_band_selection_equals_the_dense_mask(case):
    """grid_text: width 48, 3 phases; 77 text tokens: key tile 0 keeps the spans. video3d:
    frames of 960 tokens, 15 phases (285 classes). swin: 7 x 7 windows shifted by 3 on a
    width of 56, repeating every 7 grid rows (392 tokens: 49 phases, 343 classes), the band
    from tile 0. raster_local: a one-sided window, W 48."""
    with tempfile.TemporaryDirectory(prefix="cmc-lattice-") as d:
        workdir = Path(d)
        table = (front(ROOT / "samples" / "natten2d.mask", {}) if case == "natten2d" else
                 front(ROOT / "benchmarks" / "generality" / f"{case}.mask", {})
                 if isinstance(case, str) else _natten(workdir, *case))
        band = choose_tiling(table).offset_masks.band  # type: ignore[union-attr]
        assert band is not None
        lengths = _lengths(band)
        got = _host_selected(table, workdir, lengths)
    bad: list[str] = []
    for n in lengths:
        dense = _dense(table, n)
        nt = -(-n // TILE)
        for qt in range(nt):
            for j in range(nt):
                sel = (n, qt, j) in got
                want_sel = band.holds(qt, n, j) and (j + 1) * TILE <= n
                if sel != want_sel:
                    bad.append(f"len {n} qt {qt} kt {j}: selected {sel}")
                    continue
                if sel:
                    # border query tiles (and key tiles crossing len) never get here
                    assert qt >= band.tile_top and (qt + 1 + band.tiles_below) * TILE <= n
                    live = min(TILE, n - qt * TILE)
                    want = dense[qt * TILE:qt * TILE + live, j * TILE:(j + 1) * TILE]
                    if not np.array_equal(got[(n, qt, j)][:live], want):
                        bad.append(f"len {n} qt {qt} kt {j}: mask")
        if n < (band.tile_top + 1 + band.tiles_below) * TILE:
            assert not any(key[0] == n for key in got), n  # no band tile: nothing selected
    assert bad == []


@pytest.mark.parametrize("path,defines", [
    ("benchmarks/generality/grid_text.mask", {"TEXT": 77, "W": 96, "R": 40}),
    ("benchmarks/generality/grid_text.mask", {"TEXT": 333, "W": 80, "R": 24}),
    ("benchmarks/generality/grid_text.mask", {"TEXT": 77, "W": 48, "R": 6}),
    ("benchmarks/generality/video3d.mask", {}),
])
def test_windows_the_first_grid_row_cuts_are_in_the_band(path, defines):
    """A disc (or a video neighbourhood) that the grid's first row cuts sees, among the grid
    key tiles, the translate of an interior window: its query tiles belong to the band from
    the first tile wholly in the grid, and the masks equal the dense mask there (before
    2026-12-06 the band began where no window reached the first grid row: tile 31 of 32 at
    4K for the W 96, R 40 disc)."""
    table = front(ROOT / path, defines)
    masks, why = lattice_offset_masks(table, max_len=1 << 13)
    assert masks is not None and masks.band is not None, why
    band = masks.band
    assert band.tile_top == band.key_tile_lo, why  # the first tile wholly in the grid
    lengths = sorted({n for n in _lengths(band) if n > 0} | {8192})
    assert _mismatches(table, masks, band, lengths) == []
    if band.tile_top > 0:  # one tile higher holds text, which sees every key: caught
        assert _mismatches(table, masks, replace(band, tile_top=band.tile_top - 1), lengths)


def test_a_patch_tiling_takes_the_band_for_its_linear_tiles():
    """Below its start length a patch tiling is all linear tiles: it gets the band masks of the
    linear tiling (from the first grid tile for the W 96, R 40 disc), emit writes both tables
    and both rules' constants, the kernels select the band only below kPatchMinLen (the
    forward's fetch_mask, the backward's cmc_bwd_offset_class), and show says where."""
    from click.testing import CliRunner

    from cmc.cli import cli

    grid = ROOT / "benchmarks" / "generality" / "grid_text.mask"
    defines = {"TEXT": 77, "W": 96, "R": 40}
    t = choose_tiling(front(grid, defines))
    assert t.kind == "patch" and t.masks is not None and t.offset_masks is not None
    # 81 instances: checked to LATTICE_WORK / 81 tokens (tiling.LATTICE_WORK)
    assert t.offset_masks.band == LinearBand(1, 0, 207104, key_tile_lo=1)
    assert "; below len 6222, band tile masks: tile masks of 183 classes" in t.reason
    src = emit(front(grid, defines), archs=("sm_90a",), backward=True).text
    for needle in ("cmc_patch_mask_words[", "cmc_offset_mask_words[", "kTiling = 1,",
                   "kOffsetMasks = 1,", "kBandTileTop = 1,", "kPatchMinLen = 6222,",
                   "if (H::kTiling == 1 && len >= H::kPatchMinLen) return -1;",
                   "if (len < H::kPatchMinLen) {", "offset_masks_t() { return "):
        assert needle in src, needle
    res = CliRunner().invoke(cli, ["show", str(grid), "--len", "4096", "-D", "TEXT=77",
                                   "-D", "W=96", "-D", "R=40"])
    assert "band tile masks (applied below len 6222, where every tile is linear): 3 tile " \
        "phases x 61 tile offsets" in res.output
    res = CliRunner().invoke(cli, ["check", str(grid), "-D", "TEXT=77", "-D", "W=96", "-D", "R=40"])
    assert "sm90 band tile masks: applied below len 6222, where the patch tiling is all linear " \
        "tiles (366 KiB in the cubin)" in res.output, res.output
    # CLEAR (W 128, R 16) too, from its first grid tile; NATTEN's clamp keeps its border out
    clear = choose_tiling(front(ROOT / "samples" / "clear.mask", {}))
    assert clear.offset_masks is not None and clear.offset_masks.band is not None
    assert clear.offset_masks.band.tile_top == clear.offset_masks.band.key_tile_lo == 4
