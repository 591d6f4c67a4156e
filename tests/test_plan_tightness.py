"""Plans touch only tiles with a visible pair on grid masks (emit.row_split_grid).

A kernel's plan takes a tile's ranges per term instance from term(): interval arithmetic over
the tile's rows. Over rows of several grid rows that arithmetic loses what ties a row's
quotient q / W to its remainder q % W, and the plan touched tiles without a visible pair:
10-14 % more kv items than needed on natten_clamped, 22-24 % on natten2d, 16-19 % more
forward tiles on video3d (2026-12-06). The plan builders (cmc_plan_terms) now cut a tile's
rows where a grid row begins (row_part), one thread per instance and part, and unite them.
Built for the host with g++ from the emitted source: for every row tile, the tiles the
builders' ranges touch (cmc_plan_terms itself, on one thread; equal to term_cut, the parts
one after the other) against the tiles in which span() (exact: tests/test_emit.py,
test_transpose.py) finds a visible pair. The forward hooks on 128-row tiles against 128-key
tiles, the transposed ones (the kv's) on 128 keys against 64-query items.
"""

from __future__ import annotations

import subprocess

import pytest

from cmc.driver import front
from cmc.tiling import LINEAR

from .conftest import ONE_SEQUENCE, ROOT, host_build, needs_gxx
from .conftest import emit_tiled as emit

MAIN = r"""
#include <algorithm>
static int rd() { int v; if (scanf("%d", &v) != 1) { exit(3); } return v; }

// Hooks HK on row tiles of rt against column tiles of ct: one line "touched T visible V
// missed M" (M: tiles with a visible pair the plan does not touch).
template <class HK> static void count(const typename HK::seq_t& st, int len, int rt, int ct) {
  const int nc = (len + ct - 1) / ct;
  std::vector<char> touched(nc), vis(nc);
  long t = 0, v = 0, missed = 0;
  for (int a = 0; a < len; a += rt) {
    const int b = std::min(len, a + rt) - 1;
    std::fill(touched.begin(), touched.end(), 0);
    std::fill(vis.begin(), vis.end(), 0);
    std::vector<int> plan(4 * HK::kTerms);
    cmc_plan_terms<HK>(st, a, b, plan.data(), 0, 1, [] {});  // the builders, one thread
    for (int i = 0; i < HK::kTerms; ++i) {
      const int* o = plan.data() + 4 * i;
      if constexpr (HK::kRowSplitParts > 0) {  // against term_cut, the parts one after another
        int w[4];
        HK::term_cut(st, a, b, i, w);
        if (w[1] <= w[0]) { w[0] = 0; w[1] = 0; }  // empty ranges as (0, 0)
        if (w[3] <= w[2]) { w[2] = 0; w[3] = 0; }
        for (int j = 0; j < 4; ++j) {
          if (o[j] != w[j]) {
            printf("parts differ: rows %d %d term %d: %d %d %d %d, term_cut %d %d %d %d\n", a,
                   b, i, o[0], o[1], o[2], o[3], w[0], w[1], w[2], w[3]);
            exit(4);
          }
        }
      }
      for (int c = o[0] / ct; o[1] > o[0] && c <= (o[1] - 1) / ct; ++c) touched[c] = 1;
    }
    for (int r = a; r <= b; ++r) {
      const typename HK::row_t row = HK::row(st, r);
      for (int i = 0; i < HK::kTerms; ++i) {
        int lo, hi;
        HK::span(st, row, i, lo, hi);
        for (int c = lo / ct; hi > lo && c <= (hi - 1) / ct; ++c) vis[c] = 1;
      }
    }
    for (int c = 0; c < nc; ++c) {
      t += touched[c];
      v += vis[c];
      missed += vis[c] && !touched[c];
    }
  }
  printf("touched %ld visible %ld missed %ld\n", t, v, missed);
}

int main() {
  const int len = rd();
""" + ONE_SEQUENCE + r"""    const cmc_hooks_t::seq_t st = cmc_hooks_t::seq(d, 1);
  count<cmc_hooks>(s, len, 128, 128);   // the forward's tiles
  count<cmc_hooks_t>(st, len, 128, 64);  // the kv's items
  return 0;
}
"""

CASES = {  # name -> (mask, defines): grid masks whose rows cross grid rows within a tile
    "natten_clamped": ("benchmarks/generality/natten_clamped.mask", {}),
    "natten2d": ("samples/natten2d.mask", {}),
    "video3d": ("benchmarks/generality/video3d.mask", {}),
    "grid_text_w48": ("benchmarks/generality/grid_text.mask", {"TEXT": 77, "W": 48, "R": 6}),
    "grid_text_w100": ("benchmarks/generality/grid_text.mask", {"TEXT": 0, "W": 100, "R": 16}),
    "clear": ("samples/clear.mask", {}),
    "grid_text_w96": ("benchmarks/generality/grid_text.mask", {"TEXT": 77, "W": 96, "R": 40}),
    "grid_text_w80": ("benchmarks/generality/grid_text.mask", {"TEXT": 333, "W": 80, "R": 24}),
}
OTHERS = {  # exact masks without run-time parameters and without a grid: one range per tile
    "causal": "samples/causal.mask",
    "block_causal_video": "samples/block_causal_video.mask",
    "chunked_causal": "samples/chunked_causal.mask",
    "longformer": "samples/longformer.mask",
    "sliding_window": "samples/sliding_window.mask",
}
LENGTHS = (4096, 3001)


@needs_gxx
@pytest.mark.parametrize("name", [*CASES, *OTHERS])
def test_plan_touches_exactly_the_tiles_with_a_visible_pair(name, tmp_path):
    mask, defines = CASES[name] if name in CASES else (OTHERS[name], {})
    src = emit(front(ROOT / mask, defines), tiling=LINEAR, archs=("sm_90a",), backward=True)
    cuts = src.text.count("kRowSplitParts = 4")
    assert cuts == (2 if name in CASES else 0), "the grid masks' builders cut the rows"
    exe = host_build(src.text, MAIN.replace("DESC", src.layout.struct_name), tmp_path / name,
                     sanitize=False)
    for n in LENGTHS:
        r = subprocess.run([str(exe)], input=str(n), capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, (name, n, r.stdout[-2000:], r.stderr[-2000:])
        for which, line in zip(("forward", "kv"), r.stdout.strip().splitlines(), strict=True):
            touched, visible, missed = (int(x) for x in line.split()[1::2])
            assert missed == 0, f"{name} {which} len {n}: {line} (unsound)"
            assert touched == visible > 0, f"{name} {which} len {n}: {line}"



def test_check_and_show_say_where_the_plans_cut():
    from click.testing import CliRunner

    from cmc.cli import cli

    def run(*args: str) -> str:
        r = CliRunner().invoke(cli, list(args), catch_exceptions=False)
        assert r.exit_code == 0, r.output
        return r.output

    out = run("check", str(ROOT / "benchmarks/generality/natten_clamped.mask"))
    assert ("plans: each term's ranges over a tile's rows are taken per grid row (96 tokens "
            "from 0, forward and transposed; at most 4 parts per tile)") in out
    out = run("show", str(ROOT / "samples/clear.mask"), "--len", "1024")
    assert "  plans: each term's ranges over a tile's rows are taken per grid row (128 tokens from 512" in out
    assert "plans:" not in run("check", str(ROOT / "samples/causal.mask"))
