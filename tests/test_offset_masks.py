"""Per-offset tile masks of linear tiles (cmc/tiling.py offset_masks) for masks whose
visibility depends only on q - k, or is unchanged when q and k move together by a tile, and
that keep a residual (a dilated band, a strided mask, tile-aligned block patterns).

The proof's refusals (len, a run-time parameter, q and k that do not cancel, an unbounded
reach) and, on the host with g++, the generated table read through the kernel's own
cmc_offset_tile_mask and decoded in the consumers' fragment order, against the dense mask,
for every (query tile, key tile) pair of a few lengths (including a key tile cut by len).
"""

from __future__ import annotations

import subprocess
import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from cmc.cli import cli
from cmc.driver import front
from cmc.evaluate import Env, eval_pred
from cmc.ir import LINEAR, OffsetMasks, Tiling
from cmc.tiling import MAX_MASK_CLASSES, choose_tiling, offset_masks

from .conftest import ROOT, host_build, needs_gxx
from .conftest import emit_tiled as emit


def _mask(tmp_path: Path, body: str, name: str = "m"):
    path = tmp_path / f"{name}.mask"
    path.write_text(f"mask {name}\n{body}\n")
    return front(path, {})


def test_dilated_band_gets_offset_masks():
    table = front(ROOT / "benchmarks" / "generality" / "dilated_band.mask", {})
    t = choose_tiling(table)
    assert t.kind == "linear" and t.offset_masks is not None
    # |q - k| < 2048: tile offsets -16 .. 16
    assert (t.offset_masks.lo, t.offset_masks.hi) == (-16, 17)
    assert "depends only on its offset" in t.reason and "33 tile offsets" in t.reason
    assert t.to_dict()["offset_masks"] == {"classes": 33, "offsets": [-16, 17]}
    text = emit(table, archs=("sm_90a",)).text
    assert "cmc_offset_mask_words[8448]" in text and "kOffsetMasks = 1" in text


def test_exact_masks_keep_their_interval_masks():
    """Causal and sliding windows depend only on q - k too, but their partial tiles cost one
    span compare per term: no tables for them (and their cubins stay as they were)."""
    for stem in ("causal", "sliding_window"):
        t = choose_tiling(front(ROOT / "samples" / f"{stem}.mask", {}))
        assert t.offset_masks is None and t.reason == LINEAR.reason, stem
        assert "kOffsetMasks = 0" in emit(front(ROOT / "samples" / f"{stem}.mask", {}),
                                          archs=("sm_90a",)).text


def test_check_and_show_say_what_the_residual_becomes(tmp_path):
    band = ROOT / "benchmarks" / "generality" / "dilated_band.mask"
    r = CliRunner().invoke(cli, ["check", str(band)], catch_exceptions=False)
    assert r.exit_code == 0
    assert "sm90 residual: per-offset tile masks replace it" in r.output
    assert "66 KiB in the cubin" in r.output
    assert "sm90 kv partial items: the forward's offset tile masks, transposed (33 tile" in r.output
    r = CliRunner().invoke(cli, ["show", str(band), "--len", "512"], catch_exceptions=False)
    assert "tile masks: 33 tile offsets (-16..16, 66 KiB in the cubin)" in r.output
    other = tmp_path / "sum.mask"
    other.write_text("mask sum\nallow abs(q - k) < 200 and (q + k) % 1001 == 0\n")
    r = CliRunner().invoke(cli, ["check", str(other)], catch_exceptions=False)
    assert "sm90 residual: evaluated per element on partial tiles (no tile masks:" in r.output


@pytest.mark.parametrize("body, why", [
    ("allow abs(q - k) < 200 and (q - k) % 3 == 0 and k < len - 5", "reads len"),
    ("param w : int in [0, 1000]\nallow abs(q - k) < 200 and (q - k) % w == 0",
     "run-time parameters (w)"),
    ("allow abs(q - k) < 200 and (q + k) % 1001 == 0",
     "q + k moves by 256, which 1001 does not"),
    ("allow abs(q - k) < 200 and (q - k) * q % 3 == 0", "multiplies terms that move"),
    ("allow abs(q - k) < 200 and (q - k) % 3 == 0 and q % 1001 == 0",
     "q moves by 128, which 1001"),
    ("allow k <= q and (q - k) * (q - k) % 3 == 0",
     "no periodic tail below the diagonal: a product of two terms that grow"),
    ("allow k <= q and (q - k) % 3 == 0 and k / 3 % 1001 == 0", "k moves by 128, which 3 does"),
    ("allow k <= q and (q - k) % 3 == 0 and k < 16", "k < 16 changes when q and k move together"),
    (f"allow abs(q - k) < {128 * (MAX_MASK_CLASSES // 2 + 1)} and (q - k) % 3 == 0",
     f"more than {MAX_MASK_CLASSES}"),
])
def test_offset_masks_refused_with_a_reason(tmp_path, body, why):
    table = _mask(tmp_path, body)
    assert not table.exact
    masks, reason = offset_masks(table)
    assert masks is None and why in reason, reason
    t = choose_tiling(table)
    assert t.offset_masks is None and "no tile masks" in t.reason and why in t.reason


def test_unbounded_masks_that_repeat_get_one_period_of_offsets(tmp_path):
    """Strided and dilated causal masks reach every key behind the query, so their offsets
    are unbounded; past the point where each repeats along q - k, one period of tile
    offsets serves all (OffsetMasks.index)."""
    t = choose_tiling(front(ROOT / "benchmarks" / "generality" / "strided.mask", {}))
    m = t.offset_masks
    assert m is not None and (m.lo, m.hi, m.below, m.above) == (-2, 1, 1, 0), t.reason
    assert "periodic below -2 by 1" in t.reason
    assert [m.index(dt) for dt in (-40, -3, -2, -1, 0, 1)] == [0, 0, 0, 1, 2, None]
    assert t.to_dict()["offset_masks"] == {"classes": 3, "offsets": [-2, 1], "period_below": 1}
    # LOCAL 512, DIL 3: tiles 5 and more behind are past the window; 3 tile offsets a period
    m = offset_masks(front(ROOT / "benchmarks" / "generality" / "dilated_causal.mask", {}))[0]
    assert m is not None and (m.lo, m.hi, m.below, m.above) == (-7, 1, 3, 0)
    assert [m.index(dt) for dt in (-11, -10, -9, -8, -7, 0)] == [2, 0, 1, 2, 0, 7]
    fixed = offset_masks(front(ROOT / "benchmarks" / "generality" / "fixed_sparse.mask", {}))
    assert fixed[0] is not None and fixed[0].below == 1, fixed[1]
    both = offset_masks(_mask(tmp_path, "allow (q - k) % 5 == 0 or abs(q - k) < 40"))[0]
    assert both is not None and (both.below, both.above) == (5, 5)
    assert both.index(both.hi) == both.offsets - 5 and both.index(both.lo - 1) == 4


def test_blocks_of_several_tiles_get_a_mask_per_phase(tmp_path):
    """A pattern that repeats every P tiles (blocks of 256 tokens, (q + k) % 3) moves with q
    and k by P tiles, not by one: a mask per (qt % P, dt), with the tails in blocks."""
    fixed = ROOT / "benchmarks" / "generality" / "fixed_sparse.mask"
    m, why = offset_masks(front(fixed, {"L": 256}))
    assert m is not None and (m.phases, m.lo, m.hi, m.below, m.above) == (2, -5, 1, 2, 0), why
    assert "2 phases x 6 tile offsets" in why and "256 does not divide" in why
    assert m.classes == 12 and len(m.rows) == 12 * 128
    m3, why3 = offset_masks(_mask(tmp_path, "allow abs(q - k) < 200 and (q + k) % 3 == 0"))
    assert m3 is not None and m3.phases == 3 and (m3.lo, m3.hi) == (-2, 3), why3
    # 1024-token blocks: 8 phases x 24 offsets (as many classes as a lattice may have);
    # 4096-token blocks: 32 phases but 96 offsets; 8192-token ones: more phases than 32
    m8, why8 = offset_masks(front(fixed, {"L": 1024}))
    assert m8 is not None and (m8.phases, m8.offsets) == (8, 24), why8
    m32, why32 = offset_masks(front(fixed, {"L": 4096}))
    assert m32 is None and "96 tile offsets, more than 64" in why32
    m64, why64 = offset_masks(front(fixed, {"L": 8192}))
    assert m64 is None and "which 8192 does not divide; it repeats every 64 tiles" in why64
    t = choose_tiling(front(fixed, {"L": 256}))
    assert t.to_dict()["offset_masks"] == {"classes": 12, "offsets": [-5, 1], "phases": 2,
                                           "period_below": 2}


def test_a_one_sided_band_gets_only_its_offsets(tmp_path):
    """q - k from 300 to 599: keys 300 .. 599 behind the query, 2.3 .. 5.7 tiles back."""
    masks, _ = offset_masks(_mask(tmp_path, "allow 300 <= q - k < 600 and (q - k) % 4 != 1"))
    assert masks is not None and (masks.lo, masks.hi) == (-5, -1)


# =========================================================================== host harness

# One linear tile pair's mask as the sm90 consumers read it (cmc_offset_tile_mask, every
# consumer thread, its two rows, in the fragment order), printed as 128 rows of '0' / '1'.
DECODE_TILE = r"""
static int rd() { int v; if (scanf("%d", &v) != 1) { exit(3); } return v; }

static void decode_tile(int t, int j, int len) {
  static char m[128][129];
  for (int r = 0; r < 128; ++r) { memset(m[r], '0', 128); m[r][128] = 0; }
  for (int th = 0; th < 256; ++th) {
    const int ct = th % 128, lane = ct % 32;
    const int lrow = (th / 128) * 64 + (ct / 32) * 16 + lane / 4, off = 2 * (lane % 4);
    const cmc_uint2 w = cmc_offset_tile_mask(cmc_hooks::offset_masks(), cmc_hooks::kMaskTileLo,
                                             cmc_hooks::kMaskTileN, cmc_hooks::kMaskPhases,
                                             cmc_hooks::kMaskTileBelow, cmc_hooks::kMaskTileAbove,
                                             t, j, th, len, off);
    for (int n = 0; n < 16; ++n)
      for (int e = 0; e < 2; ++e) {
        if ((w.x >> (e * 16 + n)) & 1u) m[lrow][8 * n + off + e] = '1';
        if ((w.y >> (e * 16 + n)) & 1u) m[lrow + 8][8 * n + off + e] = '1';
      }
  }
  for (int r = 0; r < 128; ++r) puts(m[r]);
}
"""

MAIN = DECODE_TILE + r"""
int main() {
  const int ncase = rd();
  for (int c = 0; c < ncase; ++c) {
    const int len = rd(), nt = (len + 127) / 128;
    for (int t = 0; t < nt; ++t)
      for (int j = 0; j < nt; ++j) decode_tile(t, j, len);
  }
  return 0;
}
"""


def _build(table, tiling: Tiling, workdir: Path) -> Path:
    src = emit(table, archs=("sm_90a",), tiling=tiling)
    return host_build(src.text, MAIN, workdir / table.mask.name)


def _mismatches(table, exe: Path, lengths: list[int]) -> list[str]:
    """Tile pairs whose decoded mask differs from the dense mask (rows past len are never
    stored; keys past len must be masked)."""
    r = subprocess.run([str(exe)], input=" ".join(map(str, [len(lengths), *lengths])),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-4000:]
    lines = r.stdout.split("\n")
    pos, bad = 0, []
    for n in lengths:
        nt = -(-n // 128)
        pad = nt * 128
        qq = np.arange(pad, dtype=np.int64)[:, None]
        kk = np.arange(pad, dtype=np.int64)[None, :]
        vis = np.broadcast_to(eval_pred(table.mask.predicate, Env(n, {}, {"q": qq, "k": kk})),
                              (pad, pad)) & (kk < n)
        for t in range(nt):
            for j in range(nt):
                got = np.array([[ch == "1" for ch in ln] for ln in lines[pos:pos + 128]])
                pos += 128
                live = min(128, n - t * 128)
                want = vis[t * 128:t * 128 + live, j * 128:(j + 1) * 128]
                if not (got[:live] == want).all():
                    bad.append(f"len {n}: tiles ({t}, {j})")
    return bad


LENGTHS = [100, 128, 700, 1000, 1290]
CASES = {
    "dil3": "allow abs(q - k) < 300 and (q - k) % 3 == 0",
    "dil5_skew": "allow -100 <= q - k < 400 and (2 * q - 2 * k + 1) % 5 == 0",
    "dil_deny": "allow abs(q - k) < 260 and (k - q) % 4 != 1\ndeny abs(q - k) == 7",
}
# unbounded offsets, periodic past a point (two periods of tile offsets past each end at 3,900)
TAIL_LENGTHS = [700, 3900]
TAIL_CASES = {
    "strided": "allow k <= q and (q - k < 128 or (q - k) % 128 == 0)",
    "dil_causal3": "allow k <= q and (q - k < 300 or (q - k) % 3 == 0)",
    "two_sided5": "allow (q - k) % 5 == 0 or abs(q - k) < 40",
    "halves": "allow k <= q and ((q - k) / 64) % 2 == 0 and abs(q - k - 200) % 7 != 3",
    # tile-aligned blocks (Sparse Transformer's fixed pattern): not functions of q - k, but
    # unchanged when q and k move together by a tile
    "fixed": "allow k <= q and (k / 128 == q / 128 or k % 128 >= 112)",
    "blocks64": "allow k <= q and (k / 64 == q / 64 or k % 64 < 8 or q % 32 == 0)",
    # blocks of 2 and 4 tiles: a mask per query tile phase (OffsetMasks.phases)
    "fixed256": "allow k <= q and (k / 256 == q / 256 or k % 256 >= 240)",
    "memory512": "allow k <= q and (k / 512 == q / 512 or k % 512 < 16)",
}
# bounded offsets whose masks repeat every 3 tiles
PHASE_CASES = {  # (mask, phases)
    "sum3": ("allow abs(q - k) < 300 and (q + k) % 3 == 0", 3),
    "blocks384": ("allow abs(q - k) < 600 and (k / 384 + q / 384) % 2 == 0", 3),
    # 8 phases x 11 offsets: more classes than a one-phase table may have (64)
    "blocks1024": ("allow abs(q - k) < 600 and (k / 1024 + q / 1024) % 2 == 0", 8),
    # vertical stripes of blocks (DeepSpeed's "variable" sparsity): k / 64 % 8 repeats every
    # 4 tiles, which the lcm of 64 and 8 does not say
    "stripes": ("allow k <= q and q - k < 900 and (q / 64 - k / 64 < 4 or k / 64 % 8 == 0)", 4),
}


@pytest.fixture(scope="module")
def workdir():
    with tempfile.TemporaryDirectory(prefix="cmc-offset-") as d:
        yield Path(d)


@needs_gxx
@pytest.mark.parametrize("name", sorted(CASES))
def test_host_offset_masks_equal_the_dense_mask(name, workdir):
    table = _mask(workdir, CASES[name], name)
    t = choose_tiling(table)
    assert t.offset_masks is not None, t.reason
    assert _mismatches(table, _build(table, t, workdir), LENGTHS) == []


@needs_gxx
@pytest.mark.parametrize("name", sorted(TAIL_CASES))
def test_host_periodic_offset_masks_equal_the_dense_mask(name, workdir):
    table = _mask(workdir, TAIL_CASES[name], name)
    t = choose_tiling(table)
    m = t.offset_masks
    assert m is not None and (m.below or m.above), t.reason
    far = TAIL_LENGTHS[-1] // 128
    assert -far < m.lo - 2 * m.below and m.hi + 2 * m.above < far
    assert _mismatches(table, _build(table, t, workdir), TAIL_LENGTHS) == []


@needs_gxx
@pytest.mark.parametrize("name", sorted(PHASE_CASES))
def test_host_phase_offset_masks_equal_the_dense_mask(name, workdir):
    body, phases = PHASE_CASES[name]
    table = _mask(workdir, body, name)
    t = choose_tiling(table)
    assert t.offset_masks is not None and t.offset_masks.phases == phases, t.reason
    assert _mismatches(table, _build(table, t, workdir), [*LENGTHS, 2100]) == []


def _one_phase(m: OffsetMasks) -> OffsetMasks:
    """A 2-phase table read as one phase (its first phase's masks for every query tile)."""
    return replace(m, phases=1, rows=m.rows[:m.offsets * 128])


def _period_one_longer(m: OffsetMasks) -> OffsetMasks:
    """A period-3 table read with a period one offset longer."""
    return replace(m, lo=m.lo - 1, rows=m.rows[:128] + m.rows, below=4)


@needs_gxx
@pytest.mark.parametrize("case, misread, length", [
    ("fixed256", _one_phase, 1290), ("dil_causal3", _period_one_longer, 2600)])
def test_host_offset_masks_misread_tables_are_found(case, misread, length, workdir):
    """The same table read wrongly (its phases, its period): some tile pair is wrong."""
    table = _mask(workdir, TAIL_CASES[case], f"{case}_misread")
    t = choose_tiling(table)
    m = t.offset_masks
    assert m is not None and (m.phases, m.below) == {"fixed256": (2, 2), "dil_causal3": (1, 3)}[case]
    wrong = replace(t, offset_masks=misread(m))
    assert _mismatches(table, _build(table, wrong, workdir), [length]) != []


@needs_gxx
def test_host_offset_masks_one_flipped_bit_is_found(workdir):
    table = _mask(workdir, CASES["dil3"], "dil3_flip")
    t = choose_tiling(table)
    assert t.offset_masks is not None
    rows = list(t.offset_masks.rows)
    c = -t.offset_masks.lo  # offset 0: the diagonal tiles
    rows[c * 128 + 5] ^= 1 << 77
    flipped = replace(t, offset_masks=OffsetMasks(t.offset_masks.lo, t.offset_masks.hi,
                                                  tuple(rows)))
    bad = _mismatches(table, _build(table, flipped, workdir), [1000])
    assert bad and all(b.startswith("len 1000: tiles (") for b in bad)
    assert "len 1000: tiles (0, 0)" in bad
