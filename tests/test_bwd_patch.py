"""Patch tiles of the sm90 backward kinds (templates/cmc/attn_bwd_sm90.cuh part A).

With the forward's patch tiling a bwd_dq_sm90 CTA owns one forward tile of query rows and
walks the forward patch plan's key tiles (each as two 64-key halves). The part-A helpers
(cmc_bwd_geo, cmc_bwd_tokens_of, cmc_bwd_tile_hull, cmc_bwd_plan_step), built for the host
with g++ from the emitted source, against the dense oracle on small CLEARs (grid origins 0
and 77, two patch shapes): the row -> token maps partition the sequence as tiling.tile_ids
says; the plan of the forward hooks (dq) and of the transposed hooks (what a patch kv would
walk) touch exactly the tile pairs that hold a visible pair, so every visible pair is
computed by exactly one (CTA, tile, half) and no touched pair is invisible-only; full tiles
are all visible; the touched counts are tiling.computed_pairs of the table (dq) and of the
transposed table (kv), the counts the notes use.
"""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pytest

from cmc.driver import front
from cmc.ir import Tiling
from cmc.tiling import computed_pairs, tile_ids

from .conftest import ONE_SEQUENCE, ROOT, host_build, needs_gxx
from .conftest import emit_tiled as emit
from .test_tiling import _dense

MAIN = r"""
static int rd() { int v; if (scanf("%d", &v) != 1) { exit(3); } return v; }

template <class HH>
static void plan(const typename HH::seq_t& s, const cmc_patch_geo& g, int t, int a, int b) {
  std::vector<int> p(cmc_bwd_patch_plan_ints<HH::kTerms>(), -7);
  for (int step = 0; step < 4; ++step) cmc_bwd_plan_step<HH>(step, s, g, t, a, b, p.data(), 0, 1);
  const unsigned* touched = reinterpret_cast<const unsigned*>(p.data() + 4 * HH::kTerms);
  const unsigned* full = touched + kBwdPatchWords;
  for (int j = 0; j < g.nqt; ++j) {
    const bool tb = (touched[j >> 5] >> (j & 31)) & 1u, fb = (full[j >> 5] >> (j & 31)) & 1u;
    putchar(fb ? 'f' : tb ? 'p' : '.');
  }
  putchar('\n');
}

int main() {
  const int ncase = rd();
  for (int c = 0; c < ncase; ++c) {
    const int len = rd();
""" + ONE_SEQUENCE + r"""    const cmc_hooks_t::seq_t st = cmc_hooks_t::seq(d, 1);
    const cmc_patch_geo g = cmc_bwd_geo<cmc_hooks>(len);
    printf("%d\n", g.nqt);
    for (int t = 0; t < g.nqt; ++t) {
      const cmc_bwd_tile_tokens<cmc_hooks> m = cmc_bwd_tokens_of<cmc_hooks>(g, t, len);
      for (int r = 0; r < 128; ++r) printf("%d ", m(r));
      putchar('\n');
      // the ws kind's dQ boxes of each half (cmc_bwd_item_runs)
      constexpr int kBox = cmc_bwd_patch_box<cmc_hooks>();
      for (int hh = 0; hh < 2; ++hh) {
        const int runs = cmc_bwd_item_runs<kBox>(m, 64 * hh);
        printf("%d %d ", kBox, runs);
        for (int b = 0; b < runs; ++b) printf("%d ", cmc_bwd_run_token<cmc_hooks>(m, 64 * hh, b));
      }
      putchar('\n');
      int a, b;
      if (!cmc_bwd_tile_hull(g, t, len, a, b)) { printf("-\n-\n"); continue; }
      plan<cmc_hooks>(s, g, t, a, b);
      plan<cmc_hooks_t>(st, g, t, a, b);
    }
  }
  return 0;
}
"""


def _build(table, tiling: Tiling, workdir: Path) -> tuple[Path, object]:
    src = emit(table, archs=("sm_90a",), tiling=tiling, backward=True, bwd_kernel="auto")
    exe = host_build(src.text, MAIN.replace("DESC", src.layout.struct_name),
                     workdir / "bwd_patch")
    return exe, src.transposed


def _check_plan(line: str, vis: np.ndarray, toks: list[np.ndarray], t: int, side: str) -> int:
    """One tile's plan string against the dense mask; returns its touched tiles. side "dq":
    tile t's tokens are query rows, the plan's tiles keys; "kv": the other way round."""
    assert len(line) == len(toks)
    touched = 0
    mine = toks[t][toks[t] >= 0]
    for j, ch in enumerate(line):
        other = toks[j][toks[j] >= 0]
        blk = vis[np.ix_(mine, other)] if side == "dq" else vis[np.ix_(other, mine)].T
        where = f"{side}: tile {t}, other tile {j}"
        if blk.any():
            assert ch != ".", f"a visible pair skipped: {where}"
        else:
            assert ch == ".", f"touched but nothing visible: {where}"
        if ch == "f":
            assert len(other) == 128 and blk.all(), f"full tile not all visible: {where}"
        touched += ch != "."
    return touched


def _check_runs(tok: np.ndarray, got: list[int], seen: dict[str, int]) -> None:
    """One tile's ws boxes (per half: box rows, cmc_bwd_item_runs, then each run's first token,
    cmc_bwd_run_token) against the token map: a half of whole runs has 64 / box of them, each
    box rows consecutive tokens from the token printed; any other half none (a half with no
    token is never an item). The dQ writers' adds and the patch loader's TMA boxes use them."""
    pos = 0
    for hh in range(2):
        box, runs = got[pos:pos + 2]
        starts = got[pos + 2:pos + 2 + runs]
        pos += 2 + runs
        half = tok[64 * hh:64 * hh + 64]
        ok = all((half[b * box:(b + 1) * box] == half[b * box] + np.arange(box)).all()
                 and half[b * box] >= 0 for b in range(64 // box))
        assert runs == (64 // box if ok else 0), (hh, box, half)
        assert starts == [int(half[b * box]) for b in range(runs)], (hh, box, starts, half)
        if half[0] >= 0:
            seen["boxed" if ok else "gathered"] += 1
    assert pos == len(got)


def _run(table, transposed, tiling: Tiling, exe: Path, lengths: list[int]) -> dict[str, int]:
    r = subprocess.run([str(exe)], input=" ".join(map(str, [len(lengths), *lengths])),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-4000:])
    lines = r.stdout.split("\n")
    pos = 0
    seen = {"f": 0, "p": 0, "half_empty": 0, "boxed": 0, "gathered": 0}
    for n in lengths:
        vis = _dense(table, n)
        nqt = int(lines[pos])
        pos += 1
        assert nqt == tiling.query_tiles(n)
        toks, plans = [], []
        for _ in range(nqt):
            toks.append(np.array([int(x) for x in lines[pos].split()]))
            _check_runs(toks[-1], [int(x) for x in lines[pos + 1].split()], seen)
            plans.append((lines[pos + 2], lines[pos + 3]))
            pos += 4
        owner = np.full(n, -1)
        for t, tk in enumerate(toks):
            live = tk[tk >= 0]
            assert (owner[live] == -1).all(), f"len {n}: a token in two rows"
            owner[live] = t
        assert (owner == tile_ids(tiling, n)).all(), f"len {n}: C and Python tile numbering differ"
        dq_touched = kv_touched = 0
        for t, (dq, kv) in enumerate(plans):
            if dq == "-":
                assert (toks[t] < 0).all() and kv == "-"
                continue
            dq_touched += _check_plan(dq, vis, toks, t, "dq")
            kv_touched += _check_plan(kv, vis, toks, t, "kv")
            seen["f"] += dq.count("f") + kv.count("f")
            seen["p"] += dq.count("p") + kv.count("p")
            # the kv CTA's items are halves of its touched query tiles: count the empty ones
            for j, ch in enumerate(kv):
                if ch == ".":
                    continue
                for h in range(2):
                    qs = toks[j][64 * h:64 * h + 64]
                    qs = qs[qs >= 0]
                    ks = toks[t][toks[t] >= 0]
                    seen["half_empty"] += not vis[np.ix_(qs, ks)].any()
        assert dq_touched * 128 * 128 == computed_pairs(table, tiling, n), f"len {n}: dq count"
        assert kv_touched * 128 * 128 == computed_pairs(transposed, tiling, n), f"len {n}: kv count"
    return seen


@pytest.fixture(scope="module")
def workdir():
    with tempfile.TemporaryDirectory(prefix="cmc-bwd-patch-") as d:
        yield Path(d)


@needs_gxx
@pytest.mark.parametrize("origin,width,shape", [
    (0, 32, (8, 16)), (0, 32, (16, 8)), (77, 48, (8, 16)), (77, 48, (16, 8))])
def test_host_bwd_patch_plans_clear(origin, width, shape, workdir):
    """Small CLEARs (radius 3 and 5), lengths before the origin, inside the partial linear
    tile, inside grid rows and inside patch rows."""
    radius = 5 if origin == 0 else 3
    table = front(ROOT / "samples" / "clear.mask", {"TEXT": origin, "W": width, "R": radius})
    ph, pw = shape
    tiling = Tiling("patch", origin, width, ph, pw, "test")
    exe, transposed = _build(table, tiling, workdir)
    lengths = sorted({max(1, origin - 5), origin + 1, origin + 60, origin + width * 5 + 7,
                      origin + width * (2 * ph) + 3, origin + width * (3 * ph)})
    seen = _run(table, transposed, tiling, exe, lengths)
    assert seen["p"] > 0 and (seen["f"] > 0) == (origin > 0)  # full: text rows and columns
    assert seen["boxed"] > 0 and seen["gathered"] > 0


@needs_gxx
def test_host_bwd_patch_plans_short_sequences_are_linear(workdir):
    """Below min_len the forward cuts a sequence into linear tiles: so does the backward."""
    table = front(ROOT / "samples" / "clear.mask", {"TEXT": 128, "W": 32, "R": 5})
    tiling = Tiling("patch", 128, 32, 8, 16, "test", min_len=128 + 32 * 8)
    exe, transposed = _build(table, tiling, workdir)
    seen = _run(table, transposed, tiling, exe,
                [100, 128 + 32 * 8 - 1, 128 + 32 * 8, 128 + 32 * 17 + 3])
    assert seen["p"] > 0


@pytest.mark.parametrize("choice", ["auto", "lockstep"])
def test_dq_and_kv_follow_the_forward_tiling(choice):
    """bwd_dq_sm90 and either kv kind (auto: the ws one) get the tile stage's patch tiling
    (grid: the forward's tiles, heads_q for dq and heads_kv for kv; plan: the term ranges of
    the table each walks, the transposed one for kv, and two bit sets); a linear mask keeps
    the linear rule."""
    from cmc.artifacts import KernelKind
    from cmc.kernels import TileShape, spec

    src = emit(front(ROOT / "samples" / "clear.mask"), archs=("sm_90a",), backward=True,
               bwd_kernel=choice, dtypes=("bf16",), head_dims=(128,))
    by_kind = {v.kernel: v for v in src.variants}
    dq = by_kind[KernelKind.BWD_DQ_SM90]
    kv = by_kind[KernelKind.BWD_KV_SM90 if choice == "lockstep" else KernelKind.BWD_KV_SM90_WS]
    assert (dq.tiling.kind, kv.tiling.kind) == ("patch", "patch")
    assert dq.tiling == kv.tiling
    shape = dq.tiling.shape
    assert spec(dq.kernel).grid_rule(shape, 128) == [shape.query_tiles_expr(128), "heads_q", "batch"]
    assert spec(kv.kernel).grid_rule(shape, 128) == [shape.query_tiles_expr(128), "heads_kv", "batch"]
    assert "(max_len - 512, 0), 128), 8) * 8" in shape.query_tiles_expr(128)
    for k in (dq.kernel, kv.kernel):
        assert spec(k).grid_rule(TileShape("linear"), 128)[0] == "ceil_div(max_len, 128)"
    assert dq.smem_bytes == spec(dq.kernel).smem(128, 4 * _terms(src) + 2 * 128)
    assert kv.smem_bytes == spec(kv.kernel).smem(128, 4 * _terms(src, "cmc_hooks_t") + 2 * 128)
    # the patch plan is smaller than the linear one here, so the variant's size is its own
    linear_kv = spec(kv.kernel).smem(128, spec(kv.kernel).plan_ints(_terms(src, "cmc_hooks_t"), None))
    assert kv.smem_bytes != linear_kv
    assert "cmc_hooks_b::kTiling>()" in spec(kv.kernel).smem_expr
    causal = emit(front(ROOT / "samples" / "causal.mask"), archs=("sm_90a",), backward=True,
                  bwd_kernel="auto", dtypes=("bf16",), head_dims=(128,))
    assert all(v.tiling.kind == "linear" for v in causal.variants)


def _terms(src, hooks: str = "cmc_hooks") -> int:
    import re

    return int(re.search(rf"struct {hooks} \{{.*?kTerms = (\d+)", src.text, re.S).group(1))


MASK_MAIN = r"""
static int rd() { int v; if (scanf("%d", &v) != 1) { exit(3); } return v; }

int main() {
  const int len = rd();
  const cmc_patch_geo g = cmc_bwd_geo<cmc_hooks>(len);
  for (int t = 0; t < g.nqt; ++t)
    for (int j = 0; j < g.nqt; ++j) {
      // dq_patch's word (cmc_patch_tile_mask) and decoding: thread (wg, wtid) rows lr, lr + 8;
      // half hh, column 64 hh + 8 jj + cq + e from bit e * 16 + 8 hh + jj
      static char m[128][129];
      bool has = false;
      for (int tid = 0; tid < 256; ++tid) {
        const int wg = tid >> 7, wtid = tid & 127, warp = wtid >> 5, lane = tid & 31;
        const int lr = 64 * wg + 16 * warp + (lane >> 2), cq = 2 * (lane & 3);
        cmc_uint2 mw;
        has = cmc_patch_tile_mask<cmc_hooks>(g, t, j, len, wg * 128 + wtid, cq, mw);
        if (!has) break;
        for (int hh = 0; hh < 2; ++hh)
          for (int jj = 0; jj < 8; ++jj)
            for (int e = 0; e < 2; ++e) {
              const int bit = cmc_bwd_dq_mask_bit(hh, jj, e), col = 64 * hh + 8 * jj + cq + e;
              m[lr][col] = (mw.x >> bit) & 1u ? '1' : '0';
              m[lr + 8][col] = (mw.y >> bit) & 1u ? '1' : '0';
            }
      }
      if (!has) continue;
      printf("%d %d\n", t, j);
      for (int r = 0; r < 128; ++r) { m[r][128] = 0; puts(m[r]); }
    }
  return 0;
}
"""


def _masked_clear(shape: tuple[int, int]):
    """A small CLEAR (text 128, width 32, radius 5) on patches of `shape` with its proven
    tile masks, and its emitted source with the sm90 backward kinds."""
    from dataclasses import replace

    from cmc.tiling import patch_masks

    table = front(ROOT / "samples" / "clear.mask", {"TEXT": 128, "W": 32, "R": 5})
    tiling = Tiling("patch", 128, 32, *shape, "test")
    masks, why = patch_masks(table, tiling)
    assert masks is not None, why
    tiling = replace(tiling, masks=masks)
    return table, tiling, emit(table, archs=("sm_90a",), tiling=tiling, backward=True,
                               bwd_kernel="auto")


def _masked_clear_case(table, tiling: Tiling):
    """The length (four patch rows and a cut one), the dense mask, each tile's tokens, and
    the [patch, local] tokens of the patches, patch-major as the kernels number them."""
    from cmc.tiling import patch_tokens

    ph = tiling.patch_rows
    n = 128 + 32 * (4 * ph) + 9
    ids = tile_ids(tiling, n)
    toks = [np.nonzero(ids == t)[0] for t in range(tiling.query_tiles(n))]
    return n, _dense(table, n), toks, patch_tokens(tiling, 5 * ph)


def _pairs(stdout: str):
    """(t, j) and the 128 x 128 bool mask of each block a host main printed ("t j", then 128
    rows of '0' / '1')."""
    lines = stdout.split("\n")
    for pos in range(0, len(lines) - 1, 129):
        t, j = map(int, lines[pos].split())
        yield (t, j), np.array([[ch == "1" for ch in row] for row in lines[pos + 1:pos + 129]])


@needs_gxx
@pytest.mark.parametrize("shape", [(8, 16), (16, 8)])
def test_host_dq_patch_reads_the_forward_tile_masks(shape, workdir):
    """bwd_dq_sm90 on patches applies the forward's per-offset tile mask of (query tile, key
    tile) for its 64-key halves (dq_patch: bit cmc_bwd_dq_mask_bit(hh, jj, e) of the forward
    consumer thread's words). That decoding, compiled from the emitted source with the real
    table, cmc_patch_tile_mask and the kernel's bit helper, equals the dense mask on every
    pair that has a class; a key patch cut by len has one, its keys past len cleared."""
    table, tiling, src = _masked_clear(shape)
    exe = host_build(src.text, MASK_MAIN, workdir / f"dq_masks_{shape[0]}", sanitize=False)
    n, vis, toks, local = _masked_clear_case(table, tiling)
    out = subprocess.run([str(exe)], input=str(n), capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    pairs = cut = 0
    for (t, j), got in _pairs(out.stdout):
        qt, kt = local[t - 1], local[j - 1]  # one linear tile (the 128 text tokens) first
        rows = qt < n  # rows past len: P = 0 by their LSE offset, whatever the bits say
        keys = kt < n
        assert set(qt[rows]) <= set(toks[t]) and set(kt[keys]) <= set(toks[j])
        want = vis[np.ix_(qt[rows], kt[keys])]
        assert (got[np.ix_(rows, keys)] == want).all(), f"tile pair ({t}, {j}): dq decoding differs"
        assert not got[:, ~keys].any(), f"tile pair ({t}, {j}): a key past len has a bit"
        pairs += 1
        cut += int(not keys.all())
    assert pairs > 0 and cut > 0


KV_MASK_MAIN = r"""
static int rd() { int v; if (scanf("%d", &v) != 1) { exit(3); } return v; }

int main() {
  const int len = rd(), swap = rd();
  const cmc_patch_geo g = cmc_bwd_geo<cmc_hooks>(len);
  for (int t = 0; t < g.nqt; ++t)
    for (int j = 0; j < g.nqt; ++j) {
      // kv_patch: CTA key tile j, item query tile t; the pair's class (key patch cut by len too)
      const int c = cmc_patch_class_cut<cmc_hooks>(g, t, j, len);
      if (c < 0) continue;
      // thread (wg, wtid) key rows lr, lr + 8; half hh's word, query column 64 hh + 8 jj +
      // cq + e of key row lr + 8 i at bit cmc_bwd_kv_mask_bit(i, jj, e)
      static char m[128][129];
      for (int tid = 0; tid < 256; ++tid) {
        const int wg = tid >> 7, wtid = tid & 127, warp = wtid >> 5, lane = tid & 31;
        const int lr = 64 * wg + 16 * warp + (lane >> 2), cq = 2 * (lane & 3);
        const cmc_uint2 mw = cmc_hooks_t::patch_masks_t()[c * 256 + tid];
        for (int hh = 0; hh < 2; ++hh) {
          const unsigned w = (hh ^ swap) ? mw.y : mw.x;
          for (int i = 0; i < 2; ++i)
            for (int jj = 0; jj < 8; ++jj)
              for (int e = 0; e < 2; ++e)
                m[lr + 8 * i][64 * hh + 8 * jj + cq + e] =
                    (w >> cmc_bwd_kv_mask_bit(i, jj, e)) & 1u ? '1' : '0';
        }
      }
      printf("%d %d\n", t, j);
      for (int r = 0; r < 128; ++r) { m[r][128] = 0; puts(m[r]); }
    }
  return 0;
}
"""


@needs_gxx
@pytest.mark.parametrize("shape", [(8, 16), (16, 8)])
def test_host_kv_patch_reads_the_transposed_tile_masks(shape, workdir):
    """bwd_kv_sm90 on patches applies the forward's per-offset tile mask of (query tile, key
    tile), transposed to its layout (cmc_patch_mask_words_t, cmc/emit.py sm90_kv_mask_words:
    key rows of the thread, the word of query half hh, bit cmc_bwd_kv_mask_bit(i, jj, e)).
    That decoding, compiled from the emitted source with the real table, cmc_patch_class_cut
    and the kernel's bit helper, equals the dense mask transposed on every pair that has a
    class, the key patches cut by len included (on their keys below len); the same decoding
    with the halves swapped differs (the comparison can fail)."""
    table, tiling, src = _masked_clear(shape)
    assert "cmc_patch_mask_words_t[" in src.text
    exe = host_build(src.text, KV_MASK_MAIN, workdir / f"kv_masks_{shape[0]}", sanitize=False)
    n, vis, toks, local = _masked_clear_case(table, tiling)

    def mismatches(swap: int) -> tuple[int, int, int]:
        out = subprocess.run([str(exe)], input=f"{n} {swap}", capture_output=True, text=True,
                             timeout=120)
        assert out.returncode == 0, out.stderr[-2000:]
        pairs = bad = cut = 0
        for (t, j), got in _pairs(out.stdout):
            qt, kt = local[t - 1], local[j - 1]  # one linear tile (the 128 text tokens) first
            # rows and columns past len: K, V (Q, dO, Dsum) zero, adding 0 whatever the bits
            rows, cols = kt < n, qt < n
            assert set(qt[cols]) <= set(toks[t]) and set(kt[rows]) <= set(toks[j])
            want = vis[np.ix_(qt[cols], kt[rows])].T  # [key local][query local]
            bad += int(not (got[np.ix_(rows, cols)] == want).all())
            pairs += 1
            cut += int(not rows.all())
        return pairs, bad, cut

    pairs, bad, cut = mismatches(0)
    assert pairs > 0 and bad == 0, f"{bad} of {pairs} pairs: kv decoding differs"
    assert cut > 0, "no key patch cut by len had a class"
    assert mismatches(1)[1] > 0, "a swapped half was not caught"
