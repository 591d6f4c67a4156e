"""The kv kinds' span words (templates/cmc/attn_bwd_sm90.cuh part A, cmc_bwd_kv_span_word).

A partial linear item of the sm90 kv kinds (64 consecutive queries against a thread's two key
rows) is masked by a 32-bit word built from the transposed hooks' exact spans (grid families by
query grid row, the other instances one by one) instead of the transposed predicate per
element. Built for the host with g++ from the emitted source: for every key row pair, item
start, cut and lane column, each bit against cmc_hooks_t::visible (the transposed predicate,
checked against the dense oracle by test_transpose), and the word must be produced (not the
per-element fallback) for the grid masks cmc/emit.py _span_words picks, and refused for others;
the same for the forward hooks (`cmc_hooks`), whose words the deterministic dq kind uses.
"""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

import pytest

from cmc.driver import front

from .conftest import ONE_SEQUENCE, ROOT, host_build, needs_gxx
from .conftest import emit_tiled as emit

MAIN = r"""
static int rd() { int v; if (scanf("%d", &v) != 1) { exit(3); } return v; }

// Every word of hooks HK (rows = its q, columns = its k) against HK::visible; one line:
// kSpanWords, words built, words refused, bits set, bits wrong.
template <class HK> static int check(const typename HK::seq_t& st, int len, int qlim_cut) {
  long words = 0, refused = 0, bits = 0, bad = 0;
  for (int kr = 0; kr < len; ++kr) {
    const int kr1 = kr + 8 < len ? kr + 8 : kr;
    const typename HK::row_t r0 = HK::row(st, kr), r1 = HK::row(st, kr1);
    for (int qa = -3; qa < len; qa += (qa % 64 == 0 ? 17 : 47)) {
      for (int qlim : {len, qlim_cut}) {
        for (int cq = 0; cq < 8; cq += 2) {
          unsigned mw = 0xdeadbeefu;
          if (!cmc_bwd_kv_span_word<HK>(st, r0, r1, qa, qlim, cq, mw)) {
            if (mw != 0xdeadbeefu) { printf("refused word written\n"); return 2; }
            ++refused;
            continue;
          }
          ++words;
          for (int i = 0; i < 2; ++i)
            for (int jj = 0; jj < 8; ++jj)
              for (int e = 0; e < 2; ++e) {
                const int q = qa + 8 * jj + cq + e;
                const bool want = q >= 0 && q < qlim && q < len && HK::visible(st, i ? r1 : r0, q);
                const bool got = (mw >> cmc_bwd_kv_mask_bit(i, jj, e)) & 1u;
                bits += got;
                if (got != want && bad++ < 5)
                  printf("row %d i %d qa %d qlim %d cq %d col %d: word %d, visible %d\n", kr, i,
                         qa, qlim, cq, q, got, want);
              }
        }
      }
    }
  }
  printf("hooks %d words %ld refused %ld bits %ld bad %ld\n", (int)HK::kSpanWords, words, refused,
         bits, bad);
  return bad ? 1 : 0;
}

int main() {
  const int len = rd(), qlim_cut = rd();
""" + ONE_SEQUENCE + r"""    const cmc_hooks_t::seq_t st = cmc_hooks_t::seq(d, 1);
  const int rt = check<cmc_hooks_t>(st, len, qlim_cut);  // the kv's
  const int rf = check<cmc_hooks>(s, len, qlim_cut);     // the deterministic dq's
  return rt | rf;
}
"""

CASES = {  # name -> (mask, defines, lengths and cuts)
    "clear_w32": ("samples/clear.mask", {"TEXT": 64, "W": 32, "R": 4}, [(300, 64), (97, 70)]),
    "clear_origin0": ("samples/clear.mask", {"TEXT": 0, "W": 16, "R": 3}, [(200, 128)]),
    "grid_text_w12": ("benchmarks/generality/grid_text.mask", {"TEXT": 7, "W": 12, "R": 3},
                      [(260, 7), (61, 40)]),
    "grid_text_w96": ("benchmarks/generality/grid_text.mask", {"TEXT": 77, "W": 96, "R": 2},
                      [(700, 77)]),
    # patch-tiled (the kv's linear query tiles are those below the patch length): the
    # transposed hooks' grid families are on the tiling's grid
    "grid_text_w96_r40": ("benchmarks/generality/grid_text.mask", {"TEXT": 77, "W": 96, "R": 40},
                          [(1500, 77), (333, 200)]),
    # clamped windows: the transposed clamp inverts into one family of query rows
    # (transpose.invert_clamps) and one for sequences under K grid rows, 2 grid families x 2
    # grid rows per item; lengths on both sides of K * W
    "natten_clamped_w96": ("benchmarks/generality/natten_clamped.mask", {},
                           [(1000, 200), (1700, 77)]),
    "natten2d": ("samples/natten2d.mask", {}, [(400, 64), (900, 300)]),
}
REFUSED = {  # name -> (mask, defines): the predicate per element costs less than the spans
    "causal": ("samples/causal.mask", {}),  # no grid
    # the transposed clamped window at W 20: 15 instances, and a 128-key tile meets too many
    # grid rows for its 2 families to pay (emit._linear_span_grid)
    "natten_clamped": ("benchmarks/generality/natten_clamped.mask", {"W": 20, "K": 5}),
    # 11 instances (R 5) and no grid family
    "clear_r5": ("samples/clear.mask", {"TEXT": 64, "W": 32, "R": 5}),
}


@pytest.fixture(scope="module")
def workdir():
    with tempfile.TemporaryDirectory(prefix="cmc-span-word-") as d:
        yield Path(d)


def _run(name: str, workdir: Path, mask: str, defines: dict, runs) -> list[tuple[int, ...]]:
    table = front(ROOT / mask, defines)
    src = emit(table, archs=("sm_90a",), backward=True, bwd_kernel="auto")
    exe = host_build(src.text, MAIN.replace("DESC", src.layout.struct_name), workdir / name)
    out = []
    for n, cut in runs:
        r = subprocess.run([str(exe)], input=f"{n} {cut}", capture_output=True, text=True,
                           timeout=300)
        assert r.returncode == 0, (name, n, r.stdout[-3000:], r.stderr[-3000:])
        kv, dq = (tuple(int(x) for x in line.split()[1::2])
                  for line in r.stdout.strip().splitlines()[-2:])
        assert dq[4] == 0, f"{name}: the forward hooks' words (bwd_dq_sm90) differ"
        assert (dq[1] > 0) == (dq[0] == 1) and (dq[2] > 0) == (dq[0] == 0), (name, dq)
        out.append(kv[1:])
    return out


@needs_gxx
@pytest.mark.parametrize("name", list(CASES))
def test_span_word_matches_the_transposed_predicate(name, workdir):
    mask, defines, runs = CASES[name]
    for words, refused, bits, bad in _run(name, workdir, mask, defines, runs):
        assert bad == 0
        assert words > 0 and refused == 0, "grid masks must get span words"
        assert bits > 0


@needs_gxx
@pytest.mark.parametrize("name", list(REFUSED))
def test_span_word_refused_where_the_predicate_is_cheaper(name, workdir):
    """cmc/emit.py _span_words says no: the kernels keep the per-element predicate."""
    mask, defines = REFUSED[name]
    ((words, refused, _, bad),) = _run(name, workdir, mask, defines, [(150, 70)])
    assert words == 0 and refused > 0 and bad == 0


def test_check_and_show_say_how_the_kv_masks_partial_items():
    """The masking path is never silent: cmc check and cmc show name it and why."""
    from click.testing import CliRunner

    from cmc.cli import cli

    def run(*args: str) -> str:
        r = CliRunner().invoke(cli, list(args), catch_exceptions=False)
        assert r.exit_code == 0, r.output
        return r.output

    grid = str(ROOT / "benchmarks/generality/grid_text.mask")
    out = run("check", grid, "-D", "W=96", "-D", "R=40")
    assert ("sm90 kv partial items: span words (4 spans per key row and item: 1 grid family x "
            "2 grid rows + 2 other instances)") in out
    out = run("show", grid, "--len", "512", "-D", "W=96", "-D", "R=40")
    assert "  sm90 kv partial items: span words (4 spans" in out
    out = run("check", str(ROOT / "benchmarks/generality/natten_clamped.mask"))
    assert ("sm90 kv partial items: span words (4 spans per key row and item: 2 grid families "
            "x 2 grid rows + 0 other instances)") in out
    out = run("check", str(ROOT / "samples/causal.mask"))
    assert "sm90 kv partial items: the transposed predicate per element (not a grid mask" in out


WORDS_MAIN = r"""
int main() {
  long checks = 0, bad = 0;
  unsigned x = 12345u;
  for (int t = 0; t < 4000; ++t) {
    x = x * 1664525u + 1013904223u;
    const unsigned a = x;
    x = x * 1664525u + 1013904223u;
    const unsigned b = t < 2 ? 0u : (t < 4 ? ~0u : x);
    const cmc_uint2 mw = {a, b};
    float s[32];
    for (int k = 0; k < 32; ++k) s[k] = 1.f;
    for (int b2 = 0; b2 < 32; ++b2)
      if (!((a >> b2) & 1u)) s[cmc_bwd_word_elem(b2)] = 0.f;
    for (int hh = 0; hh < 2; ++hh) {
      const unsigned w = cmc_bwd_dq_word_as_kv(mw, hh);
      for (int i = 0; i < 2; ++i)
        for (int jj = 0; jj < 8; ++jj)
          for (int e = 0; e < 2; ++e) {
            const bool kv_keep = (a >> cmc_bwd_kv_mask_bit(i, jj, e)) & 1u;
            const bool dq_keep = ((i ? b : a) >> cmc_bwd_dq_mask_bit(hh, jj, e)) & 1u;
            bad += (s[4 * jj + 2 * i + e] != 0.f) != kv_keep;
            bad += (((w >> cmc_bwd_kv_mask_bit(i, jj, e)) & 1u) != 0u) != dq_keep;
            checks += 2;
          }
    }
  }
  for (int qa = 0; qa < 200; qa += 13)
    for (int qlim = qa + 1; qlim < qa + 80; ++qlim)
      for (int cq = 0; cq < 8; cq += 2)
        for (int in = 0; in < 4; ++in) {
          const unsigned w = cmc_bwd_kv_len_word(qa, qlim, cq, in & 1, in >> 1);
          for (int i = 0; i < 2; ++i)
            for (int jj = 0; jj < 8; ++jj)
              for (int e = 0; e < 2; ++e) {
                const bool want = ((in >> i) & 1) && qa + 8 * jj + cq + e < qlim;
                bad += (((w >> cmc_bwd_kv_mask_bit(i, jj, e)) & 1u) != 0u) != want;
                ++checks;
              }
        }
  printf("checks %ld bad %ld\n", checks, bad);
  return bad ? 1 : 0;
}
"""


@needs_gxx
def test_words_are_applied_as_the_bit_helpers_decode_them(workdir):
    """The kinds apply a mask word's bit b to element cmc_bwd_word_elem(b) (p_by_word), the dq's
    forward words through cmc_bwd_dq_word_as_kv, and cut a word at len with cmc_bwd_kv_len_word: each must
    keep exactly the elements that cmc_bwd_kv_mask_bit / cmc_bwd_dq_mask_bit (the helpers the
    oracle tests decode the words with) and the columns below qlim say."""
    src = emit(front(ROOT / "samples/causal.mask"), archs=("sm_90a",), backward=True, bwd_kernel="auto")
    exe = host_build(src.text, WORDS_MAIN, workdir / "words")
    r = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    checks, bad = (int(v) for v in r.stdout.split()[1::2])
    assert bad == 0 and checks > 500_000
