"""The forward's linear offset masks in the sm90 backward kinds (templates/cmc/attn_bwd_sm90.cuh
cmc_bwd_offset_class; bwd_dq_sm90 reads the forward's table, bwd_kv_sm90 a transposed one,
cmc/emit.py sm90_kv_mask_words). Built for the host with g++ from the emitted source: the
class of every linear tile pair and the kernels' own bit helpers decode, for each thread of
each kind, a mask that equals the dense oracle on every pair that has a class (below len:
the kernels cut keys and queries at len themselves). A dilated band (q - k residual: offset
masks for every tile pair), a dilated causal mask (unbounded offsets, periodic past its
window), natten2d (masks for a band of query tiles), grid_text (3 tile phases, text before the
grid: key tile 0 keeps the spans) and video3d (15 frame phases), in both kinds.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest

from cmc.driver import Options, back, front

from .conftest import ROOT, host_build, needs_gxx
from .test_tiling import _dense

MAIN = r"""
static int rd() { int v; if (scanf("%d", &v) != 1) { exit(3); } return v; }

int main() {
  const int len = rd(), swap = rd(), nt = (len + 127) / 128;
  static char dq[128][129], kv[128][129];
  for (int qt = 0; qt < nt; ++qt)
    for (int kt = 0; kt < nt; ++kt) {
      const int c = cmc_bwd_offset_class<cmc_hooks>(qt, kt, len);
      if (c < 0) continue;
      memset(dq, '0', sizeof dq);
      memset(kv, '0', sizeof kv);
      for (int tid = 0; tid < 256; ++tid) {
        const int wg = tid >> 7, wtid = tid & 127, warp = wtid >> 5, lane = tid & 31;
        const int lr = 64 * wg + 16 * warp + (lane >> 2), cq = 2 * (lane & 3);
        // dq: the forward consumer's rows lr, lr + 8; key half hh of the pair's key tile
        const cmc_uint2 mw = cmc_hooks::offset_masks()[c * 256 + tid];
        for (int hh = 0; hh < 2; ++hh)
          for (int jj = 0; jj < 8; ++jj)
            for (int e = 0; e < 2; ++e) {
              const int bit = cmc_bwd_dq_mask_bit(hh ^ swap, jj, e);
              dq[lr][64 * hh + 8 * jj + cq + e] = (mw.x >> bit) & 1u ? '1' : '0';
              dq[lr + 8][64 * hh + 8 * jj + cq + e] = (mw.y >> bit) & 1u ? '1' : '0';
            }
#if KV
        // kv: key rows lr + 8 i of the CTA's key tile; query half hh's word
        const cmc_uint2 kw = cmc_hooks_t::offset_masks_t()[c * 256 + tid];
        for (int hh = 0; hh < 2; ++hh) {
          const unsigned w = (hh ^ swap) ? kw.y : kw.x;
          for (int i = 0; i < 2; ++i)
            for (int jj = 0; jj < 8; ++jj)
              for (int e = 0; e < 2; ++e)
                kv[64 * hh + 8 * jj + cq + e][lr + 8 * i] =
                    (w >> cmc_bwd_kv_mask_bit(i, jj, e)) & 1u ? '1' : '0';
        }
#endif
      }
      printf("%d %d\n", qt, kt);
      for (int r = 0; r < 128; ++r) { dq[r][128] = 0; puts(dq[r]); }
      for (int r = 0; r < 128; ++r) { kv[r][128] = 0; puts(kv[r]); }
    }
  return 0;
}
"""


def _decode(path: Path, defines: dict[str, int], n: int, workdir: Path, kv: bool
            ) -> tuple[np.ndarray, list[tuple[int, int, np.ndarray, np.ndarray]]]:
    """(dense mask at n, [(qt, kt, dq view, kv view)] for each pair with a class, for the
    halves as the kernels read them (swap 0) and swapped (swap 1))."""
    table = front(path, defines)
    src = back(table, Options(archs=("sm_90a",), dtypes=("bf16",), head_dims=(128,)))
    assert ("cmc_offset_mask_words_t[" in src.text) == kv
    exe = host_build(src.text, MAIN, workdir / f"{path.stem}_offset",
                     defines=f"#define KV {int(kv)}\n", sanitize=False)
    vis = _dense(table, n)
    out = []
    for swap in (0, 1):
        run = subprocess.run([str(exe)], input=f"{n} {swap}", capture_output=True, text=True,
                             timeout=120)
        assert run.returncode == 0, run.stderr[-2000:]
        lines = run.stdout.split("\n")
        for pos in range(0, len(lines) - 1, 257):
            qt, kt = map(int, lines[pos].split())
            grid = np.array([[ch == "1" for ch in row] for row in lines[pos + 1:pos + 257]])
            out.append((swap, qt, kt, grid[:128], grid[128:]))
    return vis, out


def _mismatches(vis: np.ndarray, rows: list, swap: int, kv: bool) -> tuple[int, int]:
    n = vis.shape[0]
    pairs = bad = 0
    for s, qt, kt, dq, kvm in rows:
        if s != swap:
            continue
        q = np.arange(qt * 128, qt * 128 + 128)
        k = np.arange(kt * 128, kt * 128 + 128)
        qi, ki = q < n, k < n  # the kernels cut at len themselves
        want = vis[np.ix_(q[qi], k[ki])]
        bad += int(not (dq[np.ix_(qi, ki)] == want).all())
        if kv:
            bad += int(not (kvm[np.ix_(qi, ki)] == want).all())
        pairs += 1
    return pairs, bad


def _check_decoded(path: Path, n: int, workdir: Path, kv: bool, min_pairs: int,
                   defines: dict[str, int] | None = None) -> list:
    """Decode the kinds' masks at length n: more than min_pairs classed pairs, none wrong, and
    wrong ones once the halves are swapped (the check can fail). Returns the decoded rows."""
    vis, rows = _decode(path, defines or {}, n, workdir, kv=kv)
    pairs, bad = _mismatches(vis, rows, 0, kv)
    assert pairs > min_pairs and bad == 0, (pairs, bad)
    assert _mismatches(vis, rows, 1, kv)[1] > 0  # halves swapped: the check can fail
    return rows


@needs_gxx
def test_dilated_band_offset_masks_decode_in_both_kinds(workdir):
    _check_decoded(ROOT / "benchmarks" / "generality" / "dilated_band.mask", 128 * 9 + 53,
                   workdir, kv=True, min_pairs=10)


@needs_gxx
def test_periodic_offset_masks_decode_in_both_kinds(workdir):
    """A dilated causal mask: offsets past its window reuse one period of the table
    (cmc_offset_index), in the dq's forward table and the kv's transposed one alike."""
    _check_decoded(ROOT / "benchmarks" / "generality" / "dilated_causal.mask", 128 * 17 + 29,
                   workdir, kv=True, min_pairs=140)


@needs_gxx
def test_block_phase_offset_masks_decode_in_both_kinds(workdir):
    """Sparse Transformer's fixed pattern on 256-token blocks: a mask per query tile phase
    (2) and offset, periodic below the diagonal, in the dq's table and the kv's alike."""
    _check_decoded(ROOT / "benchmarks" / "generality" / "fixed_sparse.mask", 128 * 17 + 29,
                   workdir, kv=True, min_pairs=140, defines={"L": 256})


@needs_gxx
def test_natten2d_band_masks_decode_in_both_kinds(workdir):
    _check_decoded(ROOT / "samples" / "natten2d.mask", 128 * 14 + 37, workdir, kv=True,
                   min_pairs=5)


@needs_gxx
def test_grid_text_phase_masks_decode_in_both_kinds(workdir):
    rows = _check_decoded(ROOT / "benchmarks" / "generality" / "grid_text.mask",
                          128 * 16 + 21, workdir, kv=True, min_pairs=10)
    assert all(kt >= 1 for _, _, kt, _, _ in rows)  # key tile 0 holds text: no class


@needs_gxx
def test_video3d_frame_phase_masks_decode_in_both_kinds(workdir):
    """15 tile phases (frames of 960 tokens): both kinds decode every classed pair as the
    dense mask."""
    _check_decoded(ROOT / "benchmarks" / "generality" / "video3d.mask", 128 * 24 + 45, workdir,
                   kv=True, min_pairs=30)


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    return tmp_path
