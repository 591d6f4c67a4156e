// ===========================================================================================
// cmc sm_90a backward attention: the dK / dV kernel (FA3-style, wgmma), Hopper only.
// Hand-written. Placed after templates/cmc/attn_bwd_portable.cuh in the backward .cu: it
// reuses cmc_portable's cp.async / conversion helpers and cmc_bwd's args struct, plan builder,
// cp_async4 and lse_offset; pre and post stay the portable ones, and the sm90 dq kernel
// (attn_bwd_sm90_dq.cuh, placed after this part) reuses this part's helpers. Same ABI and
// semantics as cmc_bwd::kv (docs/architecture.md, "The backward") with its own key tile: grid
// (ceil(max_len / cmc_bwd_sm90::kBN), heads_kv, batch), block Cfg<D>::kThreadsKV, dynamic
// shared memory smem_kv<D, NT, NTT>() (opt-in above 48 KiB; patch tilings: kv_patch). Own PTX wrappers (namespace
// cmc_bwd_sm90), so it does not depend on the forward sm90 header's names.
//
// CTA = one key tile of kBN = 128 keys x kv head x sequence, 2 warpgroups (256 threads),
// warpgroup w owning keys 64 w .. 64 w + 63 (wgmma M = 64). K, V [128 x D] stay in shared
// memory. The (query head, query tile of kBM = 64) items come from the transposed hooks'
// plan (cmc_hooks_t), walked for every query head of the GQA group as the portable kv does;
// Q, dO [64 x D], LSE and Dsum of item i + 1 are copied by cp.async (all 256 threads,
// zero-filled past len) into the other half of a 2-stage ring while item i computes (the
// copies are asynchronous, so no producer warpgroup is needed for them: one barrier per
// item publishes the stage). Per item and warpgroup:
//   S^T  = K_w Q^T         wgmma SS m64n64, A = K rows (K-major), B = Q (K-major)
//   dP^T = V_w dO^T        wgmma SS m64n64 (issued right behind S^T)
//   P^T  = exp2(S^T scale_log2 - LSE log2 e), masked on partial tiles (HT::visible with the
//          key's transposed row, q < len, k < len); LSE = -inf reads as +inf: P = 0
//   dV  += P^T dO          wgmma RS m64nD, A = P^T (the S^T accumulator repacked), B = dO
//                          read MN-major (transposed); runs under the dS math
//   dS^T = P^T (dP^T - Dsum)
//   dK  += dS^T Q          wgmma RS m64nD, B = Q MN-major
//   non-deterministic mode: dS^T -> shared memory [128 keys][64 queries] (128-byte swizzle),
//          barrier, dQ by wgmma SS m64n64k16, A = dS (MN-major view of dS^T), B = K
//          (MN-major); D = 128: warpgroup w computes dQ[:, 64 w .. 64 w + 63] over all 128
//          keys; D = 64: warpgroup w all of dQ over its own 64 keys (both add); fp32
//          red.global.add.v2.f32 into args.dq_accum. Deterministic mode: no dQ (the dq role's
//          kernel: bwd_dq_sm90 with --bwd-kernel sm90, else the portable one).
// dK (times scale = scale_log2 ln 2) and dV go through shared memory (the K, V tiles) to
// 16-byte row stores. Keys no query sees: dK = dV = 0.
// Shared memory (1 KiB aligned base): K | V | Q x2 | dO x2 | dS^T | LSE x2 | Dsum x2 | plan.
// Tiles use the 128-byte swizzle: a [rows][D] tile is D/64 column blocks of [rows][64]
// elements, 16-byte chunk c of row r at (c / 8) rows 128 + r 128 + ((c % 8) ^ (r % 8)) 16.
//   K-major operand (K, V as A; Q, dO as B of S^T, dP^T): start + 32 B per k16 step inside a
//          column block, + rows 128 B per block; SBO 1024 B.
//   MN-major operand (dO, Q as B of dV, dK; K as B of dQ; dS^T as A of dQ): + 2048 B per 16
//          rows of the K dimension, LBO = rows 128 B (next 64-wide column block), SBO 1024 B.
// ===========================================================================================

// ---------------------------------------------------- patch tiles (part A: host-checked)
// With the forward's patch tiling (hooks kTiling == 1, cmc/tiling.py) a backward CTA owns one
// forward tile t of cmc_patch_geo (linear tiles of 128 before the grid origin, the last one
// partial when the origin is not a multiple of 128, then PH x PW patches), so the pairs it
// computes are the forward's patch pairs, not 64 x 128 linear strips (docs/kernel-notes.md,
// "Backward patch tiles"). Tests: tests/test_bwd_patch.py builds these with g++.
enum : int { kBwdPatchWords = 128 };  // bits of key (or query) tiles a plan holds: cmc.kernels.MAX_KEY_TILES / 32

// The tiling of a sequence of n tokens, as the forward's geo(): below kPatchMinLen linear only.
template <class H> CMC_DEV cmc_patch_geo cmc_bwd_geo(int n) {
  return cmc_patch_geo_of(n, n < H::kPatchMinLen ? n : H::kGridOrigin, H::kGridWidth, H::kPatchRows,
                          H::kPatchCols);
}
// Row r (0 .. 127) of tile t -> its token, or -1: past len, or, in a partial linear tile, from
// the origin on (those tokens are rows of patches). Rows 64 h .. 64 h + 63 are half h: PH / 2
// grid rows of a patch.
template <class H> struct cmc_bwd_tile_tokens {
  int base, lim;
  bool linear;
  CMC_DEV int operator()(int r) const {
    const int tok = linear ? base + r : base + (r / H::kPatchCols) * H::kGridWidth + r % H::kPatchCols;
    return tok < lim ? tok : -1;
  }
};
template <class H> CMC_DEV cmc_bwd_tile_tokens<H> cmc_bwd_tokens_of(const cmc_patch_geo& g, int t, int len) {
  cmc_bwd_tile_tokens<H> m;
  m.base = cmc_patch_box(g, t, 0);
  m.lim = cmc_patch_lim(g, t, len);
  m.linear = t < g.nlin;
  return m;
}
// Rows r0 .. r0 + 63 of a tile's token map (cmc_bwd_tile_tokens) as runs of BOX consecutive
// tokens: 64 / BOX runs, run b from row r0 + b BOX (a patch row of PW = BOX tokens, or BOX rows
// of a linear tile), when the last row has a token, else 0. A map's tokens grow with the row
// and stop at its limit, so the last row's token is what every run needs (host-checked against
// the token maps' runs on every item: tests/test_bwd_patch.py). The ws kind adds such an item's
// dQ partial by BOX-row TMA boxes (attn_bwd_sm90_ws.cuh).
// The ws kind's dQ (and map) box rows on a patch tiling: one patch row of PW tokens, at most
// one 64-row item (abi.py's map_box_cap).
template <class H> constexpr int cmc_bwd_patch_box() { return H::kPatchCols < 64 ? H::kPatchCols : 64; }
template <int BOX, class Rows> CMC_DEV int cmc_bwd_item_runs(const Rows& rows, int r0) {
  static_assert(BOX >= 8 && 64 % BOX == 0, "boxes of 8 .. 64 rows");
  return rows(r0 + 63) >= 0 ? 64 / BOX : 0;
}
// The first token of run b of such an item (every row has a token): b patch rows down from
// row r0's, or b runs on in a linear tile (or in a patch row longer than an item). Host-checked
// against the token maps (tests/test_bwd_patch.py); the ws patch loader's TMA boxes start there.
template <class H> CMC_DEV int cmc_bwd_run_token(const cmc_bwd_tile_tokens<H>& rows, int r0, int b) {
  constexpr int BOX = cmc_bwd_patch_box<H>();
  return rows(r0) + b * (rows.linear || H::kPatchCols > 64 ? BOX : H::kGridWidth);
}
// The hull [a, b] of tile t's tokens; false when it has none (past the last tile, or a patch
// wholly past len).
CMC_DEV bool cmc_bwd_tile_hull(const cmc_patch_geo& g, int t, int len, int& a, int& b) {
  if (t >= g.nqt) return false;
  a = cmc_patch_box(g, t, 0);
  const int e = cmc_patch_box(g, t, g.PH - 1) + g.PW - 1, lim = cmc_patch_lim(g, t, len);
  b = e < lim - 1 ? e : lim - 1;
  return a < lim;
}
// The bit of a forward tile-mask word (cmc/emit.py sm90_mask_words: bit e * 16 + n for the
// forward consumer's column 8 n + 2 (lane % 4) + e) that holds key column 64 hh + 8 jj +
// 2 (lane % 4) + e of half hh, for the thread with the forward consumer's rows (dq_patch).
CMC_DEV int cmc_bwd_dq_mask_bit(int hh, int jj, int e) { return e * 16 + 8 * hh + jj; }
// The bit of a kv tile-mask word (cmc/emit.py sm90_kv_mask_words: the forward pair's mask
// transposed, word x for query half 0, y for half 1 of the kv thread's entry) that holds key
// row lr + 8 i (lr = 64 wg + 16 warp + lane / 4) against query column 8 jj + 2 (lane % 4) + e
// of the half (kv_patch).
CMC_DEV int cmc_bwd_kv_mask_bit(int i, int jj, int e) { return i * 16 + e * 8 + jj; }
// The bits (cmc_bwd_kv_mask_bit(0, jj, e)) of a kv thread's query columns qa + 8 jj + cq + e
// (cq = 2 (lane % 4)) that lie in [lo, hi) and below qlim.
CMC_DEV unsigned cmc_bwd_kv_colmask16(int lo, int hi, int qa, int qlim, int cq) {
  hi = (hi < qlim ? hi : qlim) - qa;
  // the forward's 128-column mask of columns below 64: n < 8 of each e, moved to bit e 8 + n
  const unsigned m = cmc_colmask32(lo - qa, hi < 64 ? hi : 64, cq);
  return (m & 0xffu) | ((m >> 8) & 0xff00u);
}
// The accumulator element s[4 jj + 2 i + e] that bit b = cmc_bwd_kv_mask_bit(i, jj, e) of a
// mask word keeps (cmc_bwd_sm90::p_by_word applies words in this order, bits ascending).
CMC_DEV int cmc_bwd_word_elem(int b) { return 4 * (b & 7) + 2 * (b >> 4) + ((b >> 3) & 1); }
// The forward tile-mask words of the dq thread's two rows (cmc_bwd_dq_mask_bit: bit e 16 + 8 hh
// + jj of mw.x for row 0, of mw.y for row 1) as one word of the kv's layout (bit i 16 + e 8 +
// jj), for key half hh: bytes hh, hh + 2 of each.
CMC_DEV unsigned cmc_bwd_dq_word_as_kv(cmc_uint2 mw, int hh) {
  const unsigned a = mw.x >> (8 * hh), b = mw.y >> (8 * hh);
  return (a & 0xffu) | ((a >> 8) & 0xff00u) | ((b & 0xffu) << 16) | ((b << 8) & 0xff000000u);
}
// The bits of the kv's word layout below len: columns qa + 8 jj + cq + e below qlim
// (cmc_bwd_kv_colmask16, as the span words are cut), in row i where row_in[i] (the kv's key
// rows; the dq's query rows, whose P is already 0 past len, pass true).
CMC_DEV unsigned cmc_bwd_kv_len_word(int qa, int qlim, int cq, bool row0_in, bool row1_in) {
  const unsigned m = cmc_bwd_kv_colmask16(qa, qa + 64, qa, qlim, cq);
  return (row0_in ? m : 0u) | (row1_in ? m << 16 : 0u);
}
// The kv mask word of an item of 64 consecutive queries from qa (those at or past qlim cut) for
// the key rows whose transposed rows are r0, r1, from the transposed hooks' exact spans: grid
// families by query grid row (grid_span, as the forward's MaskLinear does by key grid row) and
// the other instances one by one, or every instance one by one. False, and mw untouched, where
// the hooks say the predicate per element costs less (HT::kSpanWords, cmc/emit.py _span_words)
// or an instance has a residual. The words are built while the S^T and dP^T GEMMs run; the
// predicate per element ran after them (docs/kernel-notes.md, "Span words for the kv").
template <class HT>
CMC_DEV bool cmc_bwd_kv_span_word(const typename HT::seq_t& s, const typename HT::row_t& r0,
                                  const typename HT::row_t& r1, int qa, int qlim, int cq, unsigned& mw) {
  if constexpr (HT::kSpanWords == 0) {
    return false;
  } else {
    unsigned w0 = 0u, w1 = 0u;
    bool exact = true;
    auto add = [&](int i) {
      int lo, hi;
      exact = HT::span(s, r0, i, lo, hi) && exact;
      w0 |= cmc_bwd_kv_colmask16(lo, hi, qa, qlim, cq);
      HT::span(s, r1, i, lo, hi);
      w1 |= cmc_bwd_kv_colmask16(lo, hi, qa, qlim, cq);
    };
    if constexpr (HT::kGridFamilies > 0) {
      const int qe = (qa + 64 < qlim ? qa + 64 : qlim) - 1 - HT::kSpanGridOrigin;
      if (qe >= 0) {
        const int qy0 = qa > HT::kSpanGridOrigin ? (qa - HT::kSpanGridOrigin) / HT::kSpanGridWidth : 0;
        for (int qy = qy0; qy <= qe / HT::kSpanGridWidth; ++qy) {
#pragma unroll
          for (int fm = 0; fm < HT::kGridFamilies; ++fm) {
            int lo, hi;
            HT::grid_span(s, r0, fm, qy, lo, hi);
            w0 |= cmc_bwd_kv_colmask16(lo, hi, qa, qlim, cq);
            HT::grid_span(s, r1, fm, qy, lo, hi);
            w1 |= cmc_bwd_kv_colmask16(lo, hi, qa, qlim, cq);
          }
        }
      }
#pragma unroll
      for (int n = 0; n < HT::kOtherTerms; ++n) add(HT::other_term(n));
    } else {
#pragma unroll
      for (int i = 0; i < HT::kTerms; ++i) add(i);
    }
    if (exact) mw = w0 | (w1 << 16);
    return exact;
  }
}
// The class of the forward's linear offset masks (H::kOffsetMasks; cmc/tiling.py offset_masks
// or lattice_offset_masks) of the pair (query tile qt, key tile kt) of 128 tokens, or -1
// where the tile stage proved none: outside the band (cmc_offset_band) or outside the
// offsets (cmc_offset_index). Keys and queries at or past len are the caller's to cut.
template <class H> CMC_DEV int cmc_bwd_offset_class(int qt, int kt, int len) {
  if constexpr (H::kOffsetMasks == 0) {
    return -1;
  } else {
    // a patch tiling's band masks are its linear tiles', below the patches' start length
    if (H::kTiling == 1 && len >= H::kPatchMinLen) return -1;
    if (H::kOffsetBand != 0 && !cmc_offset_band(qt, kt, len, H::kBandTileTop, H::kBandTilesBelow,
                                                H::kBandMaxLen, H::kBandKeyTileLo))
      return -1;
    int d;
    return cmc_offset_index(kt - qt, H::kMaskTileLo, H::kMaskTileN, H::kMaskTileBelow,
                            H::kMaskTileAbove, d)
               ? (qt % H::kMaskPhases) * H::kMaskTileN + d
               : -1;
  }
}
#if defined(CMC_HOST)
CMC_DEV void cmc_and_word(unsigned* w, unsigned v) { *w &= v; }
#else
CMC_DEV void cmc_and_word(unsigned* w, unsigned v) { atomicAnd(w, v); }
#endif
// The patch plan of tile t (rows: its tokens) against the tiles of the other side, for hooks HH
// (the forward's for dq: key tiles; the transposed ones for kv: query tiles), into
// p = term ranges over the hull [4 NT] | touched bits | full bits (kBwdPatchWords each), as
// the forward's build_plan_patch: a tile is touched when a term of a box of t's rows (PW
// consecutive tokens of one grid row; a linear tile: its hull) marks it (cmc_patch_mark), and
// full when every box of it lies below its limit and inside a full range of the hull; unlike
// the forward's plan, patches wholly past len are never touched. Four
// steps, each by threads tid < nb, with a barrier between steps (the host test runs them in
// order with nb = 1).
template <class HH>
CMC_DEV void cmc_bwd_plan_step(int step, const typename HH::seq_t& s, const cmc_patch_geo& g, int t, int a,
                               int b, int* p, int tid, int nb) {
  constexpr int NT = HH::kTerms;
  unsigned* touched = reinterpret_cast<unsigned*>(p + 4 * NT);
  unsigned* full = touched + kBwdPatchWords;
  const int len = s.len, nw = (g.nqt + 31) >> 5;
  if (step == 0) {
    for (int w = tid; w < nw; w += nb) touched[w] = 0u;
  } else if (step == 1) {
    // items x < NT: term x over the hull (a linear tile's marks too); then term i over box bx.
    // One HH::term call site: with two, clear's ws kv spilled 12 / 24 bytes (2026-12-06).
    const int nbox = t < g.nlin ? 0 : g.PH;
    for (int x = tid; x < NT * (1 + nbox); x += nb) {
      const bool hull = x < NT;
      const int y = x - NT, i = hull ? x : y / nbox, bx = hull ? 0 : y - i * nbox;
      const int s0 = hull ? a : cmc_patch_box(g, t, bx);
      if (!hull && s0 >= len) continue;  // the hull holds a token (cmc_bwd_tile_hull)
      int r4[4];
      HH::term(s, s0, hull ? b : (s0 + g.PW - 1 < len - 1 ? s0 + g.PW - 1 : len - 1), i, r4);
      cmc_plan_patch_item(p, touched, g, i, r4, hull, nbox > 0);
    }
  } else if (step == 2) {
    // A range over several grid rows marks whole patch rows (cmc_patch_mark), so patches of
    // the last patch row that lie wholly past len (tiles e0 ..) may be marked: drop them.
    int e0 = g.nqt;
    if (len > g.O && g.nqt > g.nlin) {
      const int py = (g.nqt - g.nlin) / g.ngx - 1, px = cmc_ceil_div(len - g.O - py * g.PH * g.W, g.PW);
      if (px < g.ngx) e0 = g.nlin + py * g.ngx + px;
    }
    for (int w = tid; w < nw; w += nb) {
      const int lo = e0 - 32 * w;
      const unsigned keep = lo >= 32 ? ~0u : lo <= 0 ? 0u : (1u << lo) - 1u;
      full[w] = touched[w] = touched[w] & keep;
    }
  } else {
    for (int x = tid; x < g.nqt * g.PH; x += nb) {
      const int j = x / g.PH, bx = x - j * g.PH;
      if (!((touched[j >> 5] >> (j & 31)) & 1u)) continue;
      const int s0 = cmc_patch_box(g, j, bx);
      bool in = s0 + g.PW <= cmc_patch_lim(g, j, len);
      if (in) {
        in = false;
        for (int i = 0; i < NT && !in; ++i) in = p[4 * i + 2] <= s0 && s0 + g.PW <= p[4 * i + 3];
      }
      if (!in) cmc_and_word(full + (j >> 5), ~(1u << (j & 31)));
    }
  }
}
// Ints of a patch plan (kernels.py _bwd_patch_plan_ints).
template <int NT> constexpr int cmc_bwd_patch_plan_ints() { return 4 * NT + 2 * kBwdPatchWords; }

#ifndef CMC_WS_EPI_STSM
// 1 (bwd_ablate wsfragepi): the ws kv stages a linear tile's dK and dV by stmatrix (8 a thread
// and accumulator at D 128), not by 4-byte stores (32, each with its swizzled address), and
// store_staged copies them out from one shared and one global address a thread. Run 51's ncu:
// the consumers spend 9 % of their stall samples outside the item loop (set-up and these
// stores), FA4's about 2 %; the epilogue alone is about 900 instructions a warp
#define CMC_WS_EPI_STSM 0
#endif
#ifndef CMC_BWD_KV_TMA
#define CMC_BWD_KV_TMA 0
#endif
// An item's LSE offsets and Dsum in a stage (kLse, kDsum): 0 (shipped) by query row; 1
// (experiment, bwd_ablate wsstatv4 / statv4) each consumer thread's 16 values contiguous
// (kv_stat_slot), read as 4 ld.shared.v4 instead of 8 ld.shared.v2 (run 29's ncu: the LSE loads
// outlast the S^T wgmmas they are issued under)
#ifndef CMC_BWD_STAT_V4
#define CMC_BWD_STAT_V4 0
#endif
// Partial linear items of the kv kinds masked by the transposed hooks' span words
// (cmc_bwd_kv_span_word; 0: HT::visible per element, as before 2026-12-05: tools/bwd_ablate.py
// wsvis, lsvis).
#ifndef CMC_BWD_KV_SPANS
#define CMC_BWD_KV_SPANS 1
#endif
// The warp-specialised kv of attn_bwd_sm90_ws.cuh (experiment, tools/bwd_ablate.py ws).
#ifndef CMC_BWD_KV_WS
#define CMC_BWD_KV_WS 0
#endif
#if !defined(CMC_HOST)
// Tensor maps of Q and dO (cuTensorMapEncodeTiled: [T, H, D], box (64, 1, R), 128-byte
// swizzle) and of dq_accum (fp32 [T, Hq, D], box (32, 1, R), 128-byte swizzle), R = 64 on a
// linear tiling, a patch row (H::kPatchCols) on a patch tiling (abi.py): the
// bwd_kv_sm90_ws kind's second launch parameter (kv_ws_entry). The experiments
// CMC_BWD_KV_TMA and CMC_BWD_KV_WS read them from a module global the host writes before the
// launch (tools/bwd_ablate.py), so their kernels keep the shipped kinds' parameters.
struct alignas(64) cmc_kv_map {
  unsigned long long opaque[16];
};
struct cmc_kv_maps_t {
  cmc_kv_map q, dout, dq;
#if (defined(CMC_WS_PERSIST_KVTMA) && CMC_WS_PERSIST_KVTMA) || (defined(CMC_WS_KV_TMA) && CMC_WS_KV_TMA)
  cmc_kv_map k, v;  // (bwd_ablate wsperst: box (64, 1, 64), the persistent kv's K / V loads)
#endif
};
#if CMC_BWD_KV_TMA || CMC_BWD_KV_WS
__device__ cmc_kv_maps_t cmc_kv_maps;
#endif
#endif
#if !defined(CMC_HOST)
namespace cmc_bwd_sm90 {

using cmc_portable::cp_async16;
using cmc_portable::cp_commit;
using cmc_portable::cp_wait;
using cmc_portable::ex2;
using cmc_portable::pack2;
using cmc_portable::smem_u32;

enum : int {
  kBM = 64,   // query rows per item (wgmma N of S^T, K of dV / dK, M of dQ)
  kBN = 128,  // keys per CTA: 64 per warpgroup
  kWG = 2
};

// The warp-specialised kv (attn_bwd_sm90_ws.cuh): a producer warpgroup beside the kWG
// consumers, whatever CMC_BWD_KV_WS says (the bwd_kv_sm90_ws kind builds it without the macro).
enum : int { kThreadsWS = 128 * (kWG + 1) };

template <int D> struct Cfg {
  static_assert(D == 64 || D == 128, "head dim");
  enum : int {
    kThreadsKV = 128 * (kWG + CMC_BWD_KV_WS),  // CMC_BWD_KV_WS: + the producer warpgroup
    kTileQ = kBM * D * 2,
    kTileK = kBN * D * 2
  };
};
// The atomic dQ's path: 0 (shipped) red.global.add.v2.f32 from registers; 1 (experiment,
// tools/bwd_ablate.py bulkdq: not faster, 2026-12-05) the partial staged in shared memory and
// added by one cp.reduce.async.bulk per row, asynchronous; 2 (experiment, bwd_ablate tiledq:
// timing only, its workspace layout is not the post kernel's) linear items stage the partial
// in fragment order (each warpgroup's 64 x 64 block as 16 KB: float4 chunk jj of thread t at
// jj 512 + 4 t floats) in one of two buffers (item parity), and one thread per warpgroup adds
// the block to a contiguous 16 KB of the workspace with one cp.reduce.async.bulk, waiting for
// the read of the buffer's previous use (wait_group.read 1) before the item's dS^T barrier.
// 3 (experiment, bwd_ablate red4): red.global.add.v4.f32, lane pairs swapping one row's pair
// (8 requests per thread and item instead of 16). Shared memory grows only with 1 or 2.
#ifndef CMC_BWD_DQ_BULK
#define CMC_BWD_DQ_BULK 0
#endif
// The bulk path's staging: [64 rows][D fp32 + 32 B] per partial (D = 128: one, both
// warpgroups' column halves; D = 64: one per warpgroup). The 32-byte pad makes a warp's
// 8-byte fragment stores conflict-free (rows 8 banks apart); rows stay 16-byte aligned.
template <int D> struct DqStage {
  enum : int {
    kRow = D * 4 + 32,
    kParts = D == 128 ? 1 : 2,
    kBytes = CMC_BWD_DQ_BULK == 2 ? 2 * 2 * 4096 * 4 : CMC_BWD_DQ_BULK == 1 ? kParts * 64 * kRow : 0
  };
};
// The linear kv's Q / dO copies (CMC_BWD_KV_TMA, defined before the namespace): 0 (shipped)
// cp.async by all 256 threads; 1 (experiment,
// tools/bwd_ablate.py tmaload: the tensor maps are a module global the host writes, so only
// that tool launches it) one TMA box per 64-column block issued by thread 0 into the ring
// stage, completing the stage's mbarrier (LSE and Dsum stay cp.async). Removes the copies
// from the consumers' instruction stream (ablation noload: 13 % of the kv time, 2026-12-05).
template <int D> struct SmemKV {
  enum : int {
    kK = 0,
    kV = Cfg<D>::kTileK,
    kQ = 2 * Cfg<D>::kTileK,
    kDO = kQ + 2 * Cfg<D>::kTileQ,
    kDS = kDO + 2 * Cfg<D>::kTileQ,
    kLse = kDS + kBN * kBM * 2,
    kDsum = kLse + 2 * kBM * 4,
    kStg = kDsum + 2 * kBM * 4,
    kBar = kStg + DqStage<D>::kBytes,       // CMC_BWD_KV_TMA: the stages' mbarriers
    kPlan = kBar + (CMC_BWD_KV_TMA ? 16 : 0)
  };
};
// The warp-specialised kv (attn_bwd_sm90_ws.cuh)'s shared memory (1 KiB aligned base): K | V | Q x2 | dO x2 | dS^T x2 | dQ staging x2 (one per
// consumer warpgroup: 64 rows of 64 fp32 + 32 B pad, rows 8 banks apart for the fragment
// stores, 16-byte aligned for the bulk adds) | LSE x2 | Dsum x2 | item x2 (int4: query tile,
// head of the group, full or half, -1 = end) | mbarriers full x2, empty x2 | the staging's
// rows per warpgroup (kDqRows bytes: int query head, -1 = end; 3 ints pad; int token of each
// of the 64 rows, -1 = none) | plan.
template <int D> struct SmemWS {
  enum : int {
    kStgRow = 64 * 4 + 32,
    kK = 0,
    kV = Cfg<D>::kTileK,
    kQ = 2 * Cfg<D>::kTileK,
    kDO = kQ + 2 * Cfg<D>::kTileQ,
    kDS = kDO + 2 * Cfg<D>::kTileQ,
    kStg = kDS + 2 * kBN * kBM * 2,
    kLse = kStg + 2 * 64 * kStgRow,
    kDsum = kLse + 2 * kBM * 4,
    kItem = kDsum + 2 * kBM * 4,
    kFull = kItem + 2 * 16,
    kEmpty = kFull + 16,
    kDqItem = kEmpty + 16,
    kDqRows = 16 + 64 * 4,
#if (defined(CMC_WS_PERSIST) && CMC_WS_PERSIST) || (defined(CMC_WS_KV_TMA) && CMC_WS_KV_TMA)
    // the persistent kv (attn_bwd_sm90_ws.cuh kv_ws_persist): two tiles' (k0, kv head,
    // sequence, valid), the K / V full and empty and two plan-full mbarriers, the second plan
    kTile = kDqItem + 2 * kDqRows,
    kKvFull = kTile + 32,
    kKvEmpty = kKvFull + 8,
    kPlanFull = kKvEmpty + 8,
    kPlan2 = kPlanFull + 16,
#if defined(CMC_WS_PLAN2_BYTES)
    kPlan2Bytes = CMC_WS_PLAN2_BYTES,
#else
    kPlan2Bytes = 1024,
#endif
    kPlan = kPlan2 + kPlan2Bytes
#else
    kPlan = kDqItem + 2 * kDqRows
#endif
  };
};

// A kv kernel's dynamic shared memory: its fixed layout up to the plan (kPlan), the plan (the
// transposed table's term ranges, or the patch plan), and +1024: the kernel aligns its base up
// to 1 KiB (the swizzle atoms need it).
template <int NTT, int TILING> constexpr int smem_kv_bytes(int plan_at) {
  return (plan_at + (TILING == 1 ? cmc_bwd_patch_plan_ints<NTT>() : 8 * NTT + 2) * 4 + 15) / 16 * 16 + 1024;
}
// The bwd_kv_sm90_ws kind's (SmemWS), whatever CMC_BWD_KV_WS says.
template <int D, int NT, int NTT, int TILING = 0> constexpr int smem_kv_ws() {
  return smem_kv_bytes<NTT, TILING>(SmemWS<D>::kPlan);
}
template <int D, int NT, int NTT, int TILING = 0> constexpr int smem_kv() {
  return smem_kv_bytes<NTT, TILING>(CMC_BWD_KV_WS ? SmemWS<D>::kPlan : SmemKV<D>::kPlan);
}

// Byte offset of 16-byte chunk c of row r in a [ROWS][D] tile (128-byte swizzle).
template <int ROWS> CMC_DEV unsigned swz(int r, int c) {
  return (unsigned)((c >> 3) * (ROWS * 128) + r * 128 + (((c & 7) ^ (r & 7)) << 4));
}

// ------------------------------------------------------------------------------ PTX
CMC_DEV void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
CMC_DEV void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
CMC_DEV void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N> CMC_DEV void wg_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory"); }
// The warpgroup index tid / 128, broadcast from lane 0 so that the compiler knows it is
// warp-uniform (the CUTLASS idiom): the wgmma descriptors derived from it (this warpgroup's
// K, V rows kA / vA as A of S^T / dP^T, dQ's operands) then live in uniform registers. With
// tid >> 7, ptxas kept those loop-invariant descriptor words in ordinary registers across
// the item loop and moved each to a uniform one before its wgmma (R2UR); kv at D = 128 ran
// at 255 registers and spilled 8-24 bytes on 8 masks (NVRTC 13.0, 2026-12-05,
// docs/kernel-notes.md "Spills as built"). All 32 lanes must be active (kv's first lines).
CMC_DEV int wg_index(int tid) { return __shfl_sync(0xffffffffu, tid >> 7, 0); }
// Keeps registers (wgmma A operands) alive and unmoved up to this point.
template <int N> CMC_DEV void fence_regs(unsigned* r) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+r"(r[i])::"memory");
}
template <int N> CMC_DEV void fence_regs(float* r) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
// Shared-memory matrix descriptor, 128-byte swizzle (layout type 1 in bits 62-63).
CMC_DEV unsigned long long gdesc(unsigned saddr, unsigned lbo, unsigned sbo) {
  return (unsigned long long)((saddr & 0x3FFFFu) >> 4) |
         ((unsigned long long)((lbo >> 4) & 0x3FFFu) << 16) |
         ((unsigned long long)((sbo >> 4) & 0x3FFFu) << 32) | (1ull << 62);
}
// The descriptor d moved by `bytes` (a multiple of 16 inside the same shared memory window):
// one 64-bit uniform add per wgmma, where gdesc of the moved address cost ptxas about six
// uniform instructions per wgmma (ws kv, causal: 245M uniform instructions against FA4's
// 113M, ncu 2026-12-07); the forward's gdesc_at.
CMC_DEV unsigned long long gdesc_at(unsigned long long d, unsigned bytes) { return d + (bytes >> 4); }
CMC_DEV void red_add_v2(float* p, float a, float b) {
  asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(p), "f"(a), "f"(b) : "memory");
}
CMC_DEV void red_add_v4(float* p, float a, float b, float c, float d) {
  asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(p), "f"(a), "f"(b), "f"(c), "f"(d)
               : "memory");
}
// One row of the dQ partial added into global memory by the bulk-copy unit (bulk group).
CMC_DEV void bulk_reduce_add_f32(float* g, unsigned src, unsigned bytes) {
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n"
               ::"l"(g), "r"(src), "r"(bytes) : "memory");
}
// Rows tok .. tok + 63, columns d0 .. d0 + 31 of head h of dq_accum += the staged box at src
// (64 rows of 128 bytes, 128-byte swizzle) by the TMA unit (bulk group).
CMC_DEV void tma_reduce_add(const void* map, unsigned src, int d0, int h, int tok) {
  asm volatile("cp.reduce.async.bulk.tensor.3d.global.shared::cta.add.tile.bulk_group [%0, {%2, %3, %4}], [%1];\n"
               ::"l"(reinterpret_cast<unsigned long long>(map)), "r"(src), "r"(d0), "r"(h), "r"(tok)
               : "memory");
}
CMC_DEV void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
// This thread's bulk groups have read their shared memory (the staging may be rewritten).
CMC_DEV void bulk_wait_read() { asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory"); }
// ... all but the most recent one.
CMC_DEV void bulk_wait_read1() { asm volatile("cp.async.bulk.wait_group.read 1;\n" ::: "memory"); }
using KvMap = cmc_kv_map;
using KvMaps = cmc_kv_maps_t;
CMC_DEV void kv_mbar_init(unsigned bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
CMC_DEV void kv_mbar_expect_tx(unsigned bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
CMC_DEV void kv_mbar_wait(unsigned bar, unsigned parity) {
  asm volatile(
      "{\n.reg .pred p;\nW: mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n@!p bra W;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}
// One 64 x 1 x 64 box (columns d0 .., head h, 64 tokens from tok) into dst (1 KiB aligned).
CMC_DEV void kv_tma(unsigned dst, const KvMap* map, unsigned bar, int d0, int h, int tok) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4, %5}], [%2];\n" ::"r"(dst),
      "l"(reinterpret_cast<unsigned long long>(map)), "r"(bar), "r"(d0), "r"(h), "r"(tok)
      : "memory");
}

// D[64 x 64] (+)= A[64 x 16] (shared) * B[16 x 64] (shared); TA / TB: 1 = MN-major.
#define CMC_BWD_SS_N64(TY) \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n" \
               "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY " " \
               CMC_WGMMA_D32 ", %32, %33, p, 1, 1, %35, %36;\n}\n" \
               : CMC_WGMMA_ACC32 : "l"(da), "l"(db), "r"(scale_d), "n"(TA), "n"(TB))
template <bool BF16, int TA, int TB>
CMC_DEV void ss_n64(float* d, unsigned long long da, unsigned long long db, int scale_d) {
  CMC_WGMMA_DTYPE(BF16, CMC_BWD_SS_N64);
}
// D[64 x 64] += A[64 x 16] (registers) * B[16 x 64] (shared, MN-major).
#define CMC_BWD_RS_N64(TY) \
  asm volatile("wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY " " \
               CMC_WGMMA_D32 ", {%32, %33, %34, %35}, %36, 1, 1, 1, 1;\n" \
               : CMC_WGMMA_ACC32 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db))
template <bool BF16>
CMC_DEV void rs_n64(float* d, const unsigned* a, unsigned long long db) {
  CMC_WGMMA_DTYPE(BF16, CMC_BWD_RS_N64);
}
// D[64 x 128] += A[64 x 16] (registers) * B[16 x 128] (shared, MN-major).
#define CMC_BWD_RS_N128(TY) \
  asm volatile("wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY " " \
               CMC_WGMMA_D64 ", {%64, %65, %66, %67}, %68, 1, 1, 1, 1;\n" \
               : CMC_WGMMA_ACC64 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db))
template <bool BF16>
CMC_DEV void rs_n128(float* d, const unsigned* a, unsigned long long db) {
  CMC_WGMMA_DTYPE(BF16, CMC_BWD_RS_N128);
}

// D[64 x 64] = A[64 x D] B[64 x D]^T over the head dim, both operands K-major swizzled tiles:
// A: 64 rows at `a` inside a [ROWS_A][D] tile; B: the whole [ROWS_B = 64][D] tile at `b`.
template <bool BF16, int D, int ROWS_A, int ROWS_B>
CMC_DEV void ss_headdim(float* d, unsigned a, unsigned b) {
  const unsigned long long da = gdesc(a, 16, 1024), db = gdesc(b, 16, 1024);
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    const unsigned oa = (kk >> 2) * (ROWS_A * 128) + (kk & 3) * 32, ob = (kk >> 2) * (ROWS_B * 128) + (kk & 3) * 32;
    ss_n64<BF16, 0, 0>(d, gdesc_at(da, oa), gdesc_at(db, ob), kk);
  }
}

// Unified names for the head-dim-dependent GEMMs of one warpgroup.
// acc[64 x D] += A[64 x 16] (registers) * B[16 x D] (MN-major at db).
template <bool BF16, int D> CMC_DEV void rs_nd(float* acc, const unsigned* a, unsigned long long db) {
  if constexpr (D == 128) rs_n128<BF16>(acc, a, db);
  else rs_n64<BF16>(acc, a, db);
}
// dQ split between the warpgroups: D = 128 by columns (warpgroup w: dQ[:, 64 w ..) over all
// 128 keys, B = column block w of K, a whole 64-wide swizzle atom); D = 64 by keys (warpgroup
// w: all 64 columns over its own 64 keys; both add to the workspace, twice the atomics), so
// no MN-major operand narrower than a 128-byte swizzle atom is needed.
template <int D> struct DQ {
  static constexpr bool kSplitN = D == 128;
  static constexpr int kSteps = kSplitN ? kBN / 16 : 64 / 16;  // k16 steps over keys
  static constexpr int kRegs = 32;                              // [64 x 64] fp32 per thread
};

// cp.async copies of rows [row0, row0 + ROWS) of a [len][D] operand into a swizzled
// [ROWS][D] tile (rows >= len zero-filled), by all NTHREADS threads of the CTA.
template <int D, int ROWS, int NTHREADS = Cfg<D>::kThreadsKV>
CMC_DEV void load_tile(unsigned dst, const unsigned short* g, cmc_i64 stride, int row0, int len, int tid) {
  constexpr int kChunks = D / 8;
#pragma unroll
  for (int c = tid; c < ROWS * kChunks; c += NTHREADS) {
    const int r = c / kChunks, ch = c % kChunks;
    const bool valid = row0 + r < len;
    cp_async16(dst + swz<ROWS>(r, ch), g + (cmc_i64)(valid ? row0 + r : 0) * stride + ch * 8, valid);
  }
}

// Where query row rr (0 .. kBM) of an item's LSE offsets / Dsum lies in its stage row: by row,
// or (CMC_BWD_STAT_V4) the 16 rows 8 jj + cq + e of the threads with columns cq, cq + 1 at
// 16 (cq / 2) + 2 jj + e, so that a thread's values are 64 contiguous bytes.
CMC_DEV int kv_stat_slot(int rr) {
  return CMC_BWD_STAT_V4 ? ((rr & 7) >> 1) * 16 + (rr >> 3) * 2 + (rr & 1) : rr;
}
// The LSE and Dsum of query rows q0 .. q0 + kBM - 1 (zero past len: those rows are masked)
// into ring stage `buf`, by cp.async of threads tid < 2 kBM.
template <class Desc, int D>
CMC_DEV void kv_issue_stats(unsigned base, int buf, const Desc& desc, const cmc_bwd_args& args, cmc_i64 tok0,
                            int len, int hq, int q0, int tid) {
  if (tid < 2 * kBM) {
    const float* lse = cmc_bwd::lse_offsets(args, desc.heads_q, hq) + tok0;
    const float* dsum = reinterpret_cast<const float*>(args.dsum) + (cmc_i64)hq * args.total_tokens + tok0;
    const int rr = tid % kBM, q = q0 + rr;
    const bool valid = q < len;
    const float* src = (tid < kBM ? lse : dsum) + (valid ? q : 0);
    cmc_bwd::cp_async4(base + (tid < kBM ? SmemKV<D>::kLse : SmemKV<D>::kDsum) + (buf * kBM + kv_stat_slot(rr)) * 4,
                       src, valid);
  }
}

// Copies of one (query head hq, query tile qt) item into ring stage `buf`.
template <class Desc, int D>
CMC_DEV void kv_issue(unsigned base, int buf, const Desc& desc, const cmc_bwd_args& args, cmc_i64 tok0,
                      int len, int hq, int qt, int tid) {
  const int q0 = qt * kBM;
  load_tile<D, kBM>(base + SmemKV<D>::kQ + buf * Cfg<D>::kTileQ,
                    reinterpret_cast<const unsigned short*>(desc.q) + tok0 * desc.q_stride_tok +
                        (cmc_i64)hq * desc.q_stride_head, desc.q_stride_tok, q0, len, tid);
  load_tile<D, kBM>(base + SmemKV<D>::kDO + buf * Cfg<D>::kTileQ,
                    reinterpret_cast<const unsigned short*>(args.dout) + tok0 * args.dout_stride_tok +
                        (cmc_i64)hq * args.dout_stride_head, args.dout_stride_tok, q0, len, tid);
  kv_issue_stats<Desc, D>(base, buf, desc, args, tok0, len, hq, q0, tid);
}

#if CMC_BWD_KV_TMA
// kv_issue with Q and dO by TMA (thread 0; rows past T zero, rows past len the next
// sequence's: masked as with cp.async's zeros, but a non-finite value there would reach dK,
// dV as 0 * inf), LSE and Dsum by cp.async as before.
template <class Desc, int D>
CMC_DEV void kv_issue_tma(unsigned base, int buf, const Desc& desc, const cmc_bwd_args& args, cmc_i64 tok0,
                          int len, int hq, int qt, int tid, const KvMaps* maps) {
  const int q0 = qt * kBM;
  if (tid == 0) {
    const unsigned bar = base + SmemKV<D>::kBar + 8 * buf;
    kv_mbar_expect_tx(bar, 2 * Cfg<D>::kTileQ);
#pragma unroll
    for (int cb = 0; cb < D / 64; ++cb) {
      kv_tma(base + SmemKV<D>::kQ + buf * Cfg<D>::kTileQ + cb * (kBM * 128), &maps->q, bar, 64 * cb, hq,
             (int)(tok0 + q0));
      kv_tma(base + SmemKV<D>::kDO + buf * Cfg<D>::kTileQ + cb * (kBM * 128), &maps->dout, bar, 64 * cb, hq,
             (int)(tok0 + q0));
    }
  }
  kv_issue_stats<Desc, D>(base, buf, desc, args, tok0, len, hq, q0, tid);
}
#endif

// S (or S^T) = A B^T and dP = A' B'^T over the head dim, issued as two commit groups (the
// caller waits for S with wg_wait<1>, after any loads it wants under the GEMMs).
template <bool BF16, int D, int ROWS_A, int ROWS_B>
CMC_DEV void issue_s_dp(float* s, float* dp, unsigned a, unsigned b, unsigned a2, unsigned b2) {
  wg_fence();
  ss_headdim<BF16, D, ROWS_A, ROWS_B>(s, a, b);
  wg_commit();
  ss_headdim<BF16, D, ROWS_A, ROWS_B>(dp, a2, b2);
  wg_commit();
}

// store_acc's second half: once the warpgroup's rows r0 .. r0 + 63 are staged, out to global
// memory (16 bytes a thread and row chunk, rows at or past len left out).
template <int D>
CMC_DEV void store_staged(const unsigned char* stage, int r0, unsigned short* g, cmc_i64 stride, int grow0, int len,
                          int wtid, int wg) {
  if (wg == 0) asm volatile("bar.sync 1, 128;\n" ::: "memory");
  else asm volatile("bar.sync 2, 128;\n" ::: "memory");
#if CMC_WS_EPI_STSM
  // The same copies from one shared and one global address a thread: its chunk is wtid % (D / 8)
  // in every pass and its rows step by kPass, a multiple of 8, which keeps the swizzle (rr & 7).
  constexpr int kCh = D / 8, kPass = 128 / kCh;
  static_assert(kPass % 8 == 0, "rows a pass: a multiple of the swizzle's 8");
  const int ch = wtid % kCh, rr0 = r0 + wtid / kCh, left = len - (grow0 + rr0);
  const unsigned char* src = stage + swz<kBN>(rr0, ch);
  uint4 v[64 / kPass];
#pragma unroll
  for (int i = 0; i < 64 / kPass; ++i) v[i] = *reinterpret_cast<const uint4*>(src + kPass * 128 * i);
  unsigned short* dst = g + (cmc_i64)(grow0 + rr0) * stride + ch * 8;
  const cmc_i64 step = (cmc_i64)kPass * stride;
#pragma unroll
  for (int i = 0; i < 64 / kPass; ++i, dst += step)
    if (kPass * i < left) st_global_v4(dst, v[i]);
#else
#pragma unroll
  for (int c = wtid; c < 64 * (D / 8); c += 128) {
    const int rr = r0 + c / (D / 8), ch = c % (D / 8);
    const int row = grow0 + rr;
    if (row < len)
      *reinterpret_cast<uint4*>(g + (cmc_i64)row * stride + ch * 8) =
          *reinterpret_cast<const uint4*>(stage + swz<kBN>(rr, ch));
  }
#endif
}
// Writes a warpgroup's [64 x D] fp32 accumulator (wgmma layout, rows r0 .. r0 + 63 of the
// [kBN][D] staging tile at `stage`) times mul as rows of the dtype to global memory.
template <bool BF16, int D>
CMC_DEV void store_acc(unsigned char* stage, const float* acc, float mul, int r0, unsigned short* g,
                       cmc_i64 stride, int grow0, int len, int wtid, int wg) {
  const int warp = wtid >> 5, lane = wtid & 31;
  const int r = r0 + 16 * warp + (lane >> 2);
  const unsigned off = (unsigned)((lane & 3) * 4);
#pragma unroll
  for (int j = 0; j < D / 8; ++j) {
    *reinterpret_cast<unsigned*>(stage + swz<kBN>(r, j) + off) = pack2<BF16>(acc[4 * j] * mul, acc[4 * j + 1] * mul);
    *reinterpret_cast<unsigned*>(stage + swz<kBN>(r + 8, j) + off) =
        pack2<BF16>(acc[4 * j + 2] * mul, acc[4 * j + 3] * mul);
  }
  store_staged<D>(stage, r0, g, stride, grow0, len, wtid, wg);
}

// store_acc without the staging: each thread's pairs straight to global memory (4-byte stores;
// the persistent ws kv, CMC_WS_PERSIST 2, whose K / V buffers take the next tile's meanwhile).
template <bool BF16, int D>
CMC_DEV void store_acc_direct(const float* acc, float mul, int r0, unsigned short* g, cmc_i64 stride, int grow0,
                              int len, int wtid) {
  const int warp = wtid >> 5, lane = wtid & 31;
  const int r = grow0 + r0 + 16 * warp + (lane >> 2), c = 2 * (lane & 3);
#pragma unroll
  for (int j = 0; j < D / 8; ++j) {
    if (r < len)
      *reinterpret_cast<unsigned*>(g + (cmc_i64)r * stride + 8 * j + c) = pack2<BF16>(acc[4 * j] * mul, acc[4 * j + 1] * mul);
    if (r + 8 < len)
      *reinterpret_cast<unsigned*>(g + (cmc_i64)(r + 8) * stride + 8 * j + c) =
          pack2<BF16>(acc[4 * j + 2] * mul, acc[4 * j + 3] * mul);
  }
}

// ------------------------------------------------------------------ patch tiles (device)
// load_tile for the rows of a token map (cmc_bwd_tile_tokens: -1 rows zero-filled), by
// NTHREADS threads (tid < NTHREADS). Unrolled for a CTA's threads; one warp (the ws loader,
// 24 registers) loops: unrolled, its 32 copies' addresses spilled 1-2.5 KB (ptxas, 2026-12-05).
template <int D, int ROWS, int NTHREADS = Cfg<D>::kThreadsKV, class Tok>
CMC_DEV void load_rows(unsigned dst, const unsigned short* g, cmc_i64 stride, const Tok& tok, int r0, int tid) {
  constexpr int kChunks = D / 8;
  auto copy = [&](int c) {
    const int r = c / kChunks, ch = c % kChunks;
    const int t = tok(r0 + r);
    cp_async16(dst + swz<ROWS>(r, ch), g + (cmc_i64)(t >= 0 ? t : 0) * stride + ch * 8, t >= 0);
  };
  if constexpr (NTHREADS >= 128) {
#pragma unroll
    for (int c = tid; c < ROWS * kChunks; c += NTHREADS) copy(c);
  } else {
#pragma unroll 1
    for (int c = tid; c < ROWS * kChunks; c += NTHREADS) copy(c);
  }
}

// store_acc for the rows of a token map: staging row rr goes to token tok(rr), if any.
template <bool BF16, int D, class Tok>
CMC_DEV void store_acc_rows(unsigned char* stage, const float* acc, float mul, int r0, unsigned short* g,
                            cmc_i64 stride, const Tok& tok, int wtid, int wg) {
  const int warp = wtid >> 5, lane = wtid & 31;
  const int r = r0 + 16 * warp + (lane >> 2);
  const unsigned off = (unsigned)((lane & 3) * 4);
#pragma unroll
  for (int j = 0; j < D / 8; ++j) {
    *reinterpret_cast<unsigned*>(stage + swz<kBN>(r, j) + off) = pack2<BF16>(acc[4 * j] * mul, acc[4 * j + 1] * mul);
    *reinterpret_cast<unsigned*>(stage + swz<kBN>(r + 8, j) + off) =
        pack2<BF16>(acc[4 * j + 2] * mul, acc[4 * j + 3] * mul);
  }
  if (wg == 0) asm volatile("bar.sync 1, 128;\n" ::: "memory");
  else asm volatile("bar.sync 2, 128;\n" ::: "memory");
#pragma unroll
  for (int c = wtid; c < 64 * (D / 8); c += 128) {
    const int rr = r0 + c / (D / 8), ch = c % (D / 8);
    const int row = tok(rr);
    if (row >= 0)
      *reinterpret_cast<uint4*>(g + (cmc_i64)row * stride + ch * 8) =
          *reinterpret_cast<const uint4*>(stage + swz<kBN>(rr, ch));
  }
}

// The patch plan (cmc_bwd_plan_step) by all threads of the CTA.
template <class HH, int NTHREADS>
CMC_DEV void build_plan_patch(int* p, const typename HH::seq_t& s, const cmc_patch_geo& g, int t, int a, int b,
                              int tid) {
#pragma unroll 1
  for (int step = 0; step < 4; ++step) {
    cmc_bwd_plan_step<HH>(step, s, g, t, a, b, p, tid, NTHREADS);
    __syncthreads();
  }
}
// The first set bit >= from of a plan's bit set of nw words, or -1.
CMC_DEV int next_tile(const unsigned* bits, int nw, int from) {
  for (int w = from >> 5; w < nw; ++w) {
    unsigned m = bits[w];
    if (w == from >> 5) m &= ~0u << (from & 31);
    if (m) return 32 * w + __ffs(m) - 1;
  }
  return -1;
}
CMC_DEV bool tile_bit(const unsigned* bits, int j) { return (bits[j >> 5] >> (j & 31)) & 1u; }

template <class H, class HT, bool BF16, int D>
CMC_DEV void kv_patch(const typename H::desc_t& desc, const cmc_bwd_args& args);
template <class H, class HT, bool BF16, int D>
CMC_DEV void kv_ws_entry(const typename H::desc_t& desc, const KvMaps& maps,
                         const cmc_bwd_args& args);  // attn_bwd_sm90_ws.cuh

// A kv thread's LSE values of an item (kv_p_linear, kv_p_patch): query 8 jj + cq + e read from
// the stage's row (a shared-memory pointer), or held in registers (KvRowRegs, v[2 jj + e]:
// loaded under the GEMMs; ws with CMC_WS_LSE_REGS). Passed by value: a reference parameter
// changed the lockstep patch kv's code.
struct KvRowRegs {
  float v[16];
};
CMC_DEV float kv_row_at(const float* b, int jj, int e, int cq) {
  return CMC_BWD_STAT_V4 ? b[(cq >> 1) * 16 + 2 * jj + e] : b[8 * jj + cq + e];
}
CMC_DEV float kv_row_at(const KvRowRegs& r, int jj, int e, int) { return r.v[2 * jj + e]; }
// KvRowRegs of a stage's row b: issued as 8 shared loads now (4 with CMC_BWD_STAT_V4), used
// after the next waits.
CMC_DEV KvRowRegs kv_row_regs(const float* b, int cq) {
  KvRowRegs r;
#if CMC_BWD_STAT_V4
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const float4 x = *reinterpret_cast<const float4*>(b + (cq >> 1) * 16 + 4 * k);
    r.v[4 * k] = x.x;
    r.v[4 * k + 1] = x.y;
    r.v[4 * k + 2] = x.z;
    r.v[4 * k + 3] = x.w;
  }
#else
#pragma unroll
  for (int jj = 0; jj < 8; ++jj) {
    const float2 x = *reinterpret_cast<const float2*>(b + 8 * jj + cq);
    r.v[2 * jj] = x.x;
    r.v[2 * jj + 1] = x.y;
  }
#endif
  return r;
}

// dS^T = P^T (dP^T - Dsum) in place of dP^T (s: P^T; dsum_b: the item's Dsum, this thread's
// query columns from cq).
template <class Row>
CMC_DEV void kv_ds(const float* s, float* dp, const Row& dsum_b, int cq) {
#pragma unroll
  for (int jj = 0; jj < 8; ++jj) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const float dd = kv_row_at(dsum_b, jj, e, cq);
      dp[4 * jj + e] = s[4 * jj + e] * (dp[4 * jj + e] - dd);
      dp[4 * jj + 2 + e] = s[4 * jj + 2 + e] * (dp[4 * jj + 2 + e] - dd);
    }
  }
}
// One kv item after P^T (kv, kv_patch, kv_ws): P^T packed as dV's A operand, dV += P^T dO
// issued; once dP^T lands, dS^T = P^T (dP^T - Dsum) packed into dsa. pa, dsa: the packed
// operands, live until the caller's last wgmma wait. dsum_b: the stage's Dsum row, or its
// KvRowRegs read before the call.
template <bool BF16, int D, class Row>
CMC_DEV void kv_dv_ds(float* s, float* dp, const Row& dsum_b, int cq, float* dv, unsigned doB, unsigned* pa,
                      unsigned* dsa) {
#pragma unroll
  for (int m = 0; m < 16; ++m) pa[m] = pack2<BF16>(s[2 * m], s[2 * m + 1]);
  wg_fence();
  const unsigned long long do_desc = gdesc(doB, kBM * 128, 1024);
#pragma unroll
  for (int kk = 0; kk < kBM / 16; ++kk) rs_nd<BF16, D>(dv, pa + 4 * kk, gdesc_at(do_desc, kk * 2048));
  wg_commit();
  wg_wait<1>();  // dP^T done (dV may still run)
  fence_regs<32>(dp);
  kv_ds(s, dp, dsum_b, cq);
#pragma unroll
  for (int m = 0; m < 16; ++m) dsa[m] = pack2<BF16>(dp[2 * m], dp[2 * m + 1]);
}
// dK += dS^T Q issued as one commit group (scaled at the end).
template <bool BF16, int D> CMC_DEV void kv_dk(float* dk, const unsigned* dsa, unsigned qB) {
  wg_fence();
  const unsigned long long q_desc = gdesc(qB, kBM * 128, 1024);
#pragma unroll
  for (int kk = 0; kk < kBM / 16; ++kk) rs_nd<BF16, D>(dk, dsa + 4 * kk, gdesc_at(q_desc, kk * 2048));
  wg_commit();
}
// kv_dv_ds, then kv_dk (kv, kv_patch).
template <bool BF16, int D>
CMC_DEV void kv_dv_ds_dk(float* s, float* dp, const float* dsum_b, int cq, float* dv, float* dk,
                         unsigned doB, unsigned qB, unsigned* pa, unsigned* dsa) {
  kv_dv_ds<BF16, D>(s, dp, dsum_b, cq, dv, doB, pa, dsa);
  kv_dk<BF16, D>(dk, dsa, qB);
}

// The end of a kv item (kv and kv_patch). Atomic mode: dS^T rows of this warpgroup into the
// [kBN keys][kBM queries] tile (dsa[2 jj] is (key row lr, query chunk jj), dsa[2 jj + 1] the
// row 8 below), dQ by wgmma (DQ<D>), each of the thread's query rows 16 warp + lane / 4 + 8 i
// of the item added to dq_accum at its token tok(row) (-1: none). Otherwise the item's wgmmas
// are waited for.
template <bool BF16, int D, bool TILE = false, class Tok>
CMC_DEV void kv_dq_or_wait(bool atomic_dq, unsigned char* sds, const unsigned* pa, const unsigned* dsa,
                           int lr, int wg, int warp, int lane, unsigned dqA, unsigned dqB, int dqCol,
                           const Tok& tok, float* acc, cmc_i64 tok0, int heads_q, int hq,
                           cmc_i64 tile = 0, int par = 0) {
  static_assert(!CMC_DQ_BLOCK64 || CMC_BWD_KV_WS || sizeof(Tok) == 0, "the lockstep kv adds dQ token-major only");
  constexpr int kDQ = DQ<D>::kRegs;
  if (!atomic_dq) {
    wg_wait<0>();
    fence_regs<16>(const_cast<unsigned*>(pa));
    fence_regs<16>(const_cast<unsigned*>(dsa));
    return;
  }
  const unsigned off = (unsigned)((lane & 3) * 4);
#if CMC_BWD_DQ_BULK == 2
  if (TILE && warp == 0 && lane == 0) bulk_wait_read1();  // this parity's buffer was read
#elif CMC_BWD_DQ_BULK == 1
  bulk_wait_read();  // the last item's rows have left the staging (the barrier below publishes it)
#endif
#pragma unroll
  for (int jj = 0; jj < 8; ++jj) {
    *reinterpret_cast<unsigned*>(sds + swz<kBN>(lr, jj) + off) = dsa[2 * jj];
    *reinterpret_cast<unsigned*>(sds + swz<kBN>(lr + 8, jj) + off) = dsa[2 * jj + 1];
  }
  fence_proxy_async();
  if constexpr (DQ<D>::kSplitN) asm volatile("bar.sync 3, 256;\n" ::: "memory");  // both warpgroups'
  else if (wg == 0) asm volatile("bar.sync 1, 128;\n" ::: "memory");             // this warpgroup's
  else asm volatile("bar.sync 2, 128;\n" ::: "memory");
  float dq[kDQ];
#pragma unroll
  for (int i = 0; i < kDQ; ++i) dq[i] = 0.f;
  wg_fence();
  const unsigned long long ds_desc = gdesc(dqA, kBN * 128, 1024), k_desc = gdesc(dqB, kBN * 128, 1024);
#pragma unroll
  for (int kk = 0; kk < DQ<D>::kSteps; ++kk)
    ss_n64<BF16, 1, 1>(dq, gdesc_at(ds_desc, kk * 2048), gdesc_at(k_desc, kk * 2048), kk);
  wg_commit();
  wg_wait<0>();
  fence_regs<16>(const_cast<unsigned*>(pa));
  fence_regs<16>(const_cast<unsigned*>(dsa));
  fence_regs<kDQ>(dq);
  // dq[4 jj + 2 i + e] is (query row 16 warp + lane / 4 + 8 i, column dqCol + 8 jj + 2 (lane % 4) + e).
#if CMC_BWD_DQ_BULK == 2
  if constexpr (TILE) {
    float* stg = reinterpret_cast<float*>(sds + (SmemKV<D>::kStg - SmemKV<D>::kDS)) + par * 8192 + wg * 4096;
    const int t = 32 * warp + lane;
#pragma unroll
    for (int jj = 0; jj < 8; ++jj)
      *reinterpret_cast<float4*>(stg + jj * 512 + 4 * t) =
          make_float4(dq[4 * jj], dq[4 * jj + 1], dq[4 * jj + 2], dq[4 * jj + 3]);
    fence_proxy_async();
    if (wg == 0) asm volatile("bar.sync 1, 128;\n" ::: "memory");
    else asm volatile("bar.sync 2, 128;\n" ::: "memory");
    if (t == 0) {
      // The address is made here from opaque copies, not hoisted and kept across the loop
      // (which spilled at D = 128).
      // timing experiment: the batch layout's tile of 64 rows (tok0 = b len, len = max_len a
      // multiple of 128: len / 64 = 2 gridDim.x)
      cmc_i64 tl = tile + (cmc_i64)blockIdx.z * (2 * gridDim.x);
      int hqo = hq, hqs = heads_q;
      asm volatile("" : "+l"(tl), "+r"(hqo), "+r"(hqs));
      bulk_reduce_add_f32(acc + (tl * hqs + hqo) * (64 * D) + (D == 128 ? wg * 4096 : 0), smem_u32(stg),
                          16384u);
      bulk_commit();
    }
    return;
  }
#endif
#if CMC_BWD_DQ_BULK == 1
  // Stage the partial (D = 128: this warpgroup's column half of the one partial; D = 64: its
  // own partial), publish it to the async proxy, then one thread per row adds the row.
  unsigned char* stg = sds + (SmemKV<D>::kStg - SmemKV<D>::kDS) +
                       (DqStage<D>::kParts == 2 ? wg * 64 * DqStage<D>::kRow : 0);
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    float* row = reinterpret_cast<float*>(stg + (16 * warp + (lane >> 2) + 8 * i) * DqStage<D>::kRow) +
                 dqCol + 2 * (lane & 3);
#pragma unroll
    for (int jj = 0; jj < 8; ++jj)
      *reinterpret_cast<float2*>(row + 8 * jj) = make_float2(dq[4 * jj + 2 * i], dq[4 * jj + 2 * i + 1]);
  }
  fence_proxy_async();
  if constexpr (DQ<D>::kSplitN) asm volatile("bar.sync 3, 256;\n" ::: "memory");
  else if (wg == 0) asm volatile("bar.sync 1, 128;\n" ::: "memory");
  else asm volatile("bar.sync 2, 128;\n" ::: "memory");
  const int r = 32 * warp + lane;  // this warpgroup's thread index: rows 0 .. 63 issue
  if (r < 64 && (DqStage<D>::kParts == 2 || wg == 0)) {
    const int q = tok(r);
    if (q >= 0) {
      bulk_reduce_add_f32(acc + ((tok0 + q) * heads_q + hq) * D,
                          smem_u32(stg + r * DqStage<D>::kRow), (unsigned)(D * 4));
      bulk_commit();
    }
  }
#elif CMC_BWD_DQ_BULK == 3
  // Lane pairs swap one row's pair: the even lane adds 4 columns of row i = 0, the odd lane
  // 4 columns of row i = 1 (one red.global.add.v4.f32 each per jj: half the requests).
  {
    const int odd = lane & 1;
    const int qr = tok(16 * warp + (lane >> 2) + 8 * odd);
    float* row4 = acc + ((tok0 + (qr >= 0 ? qr : 0)) * heads_q + hq) * D + dqCol + 2 * (lane & 2);
#pragma unroll
    for (int jj = 0; jj < 8; ++jj) {
      const float s0 = dq[4 * jj + 2 * (odd ^ 1)], s1 = dq[4 * jj + 2 * (odd ^ 1) + 1];
      const float r0 = __shfl_xor_sync(0xffffffffu, s0, 1), r1 = __shfl_xor_sync(0xffffffffu, s1, 1);
      const float m0 = dq[4 * jj + 2 * odd], m1 = dq[4 * jj + 2 * odd + 1];
      if (qr >= 0) {
        if (odd) red_add_v4(row4 + 8 * jj, r0, r1, m0, m1);
        else red_add_v4(row4 + 8 * jj, m0, m1, r0, r1);
      }
    }
  }
#else
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int q = tok(16 * warp + (lane >> 2) + 8 * i);
    if (q >= 0) {
      float* row = acc + ((tok0 + q) * heads_q + hq) * D + dqCol + 2 * (lane & 3);
#pragma unroll
      for (int jj = 0; jj < 8; ++jj) red_add_v2(row + 8 * jj, dq[4 * jj + 2 * i], dq[4 * jj + 2 * i + 1]);
    }
  }
#endif
}

// The forward's linear offset mask of the pair (query tile j / 2, key tile of k0) where the
// tile stage proved one (cmc_bwd_offset_class), transposed to the key rows of kv thread ctid
// (0 .. 255; HT::offset_masks_t, cmc/emit.py sm90_kv_mask_words): the word of query half
// j % 2 into mw, loaded under the GEMMs; false where there is none. Keys and queries past len
// stay the caller's to cut. Band masks (H::kOffsetBand: natten2d, lattice phases) too since
// the transposed visible() became the swapped predicate (cmc/transpose.py): before, natten2d's
// D = 128 spilled 64 bytes with them (ptxas, 2026-12-05).
template <class H, class HT>
CMC_DEV bool kv_offset_word(bool is_full, int j, int k0, int len, int ctid, unsigned& mw) {
  if constexpr (H::kOffsetMasks != 0) {
    const int cls = is_full ? -1 : cmc_bwd_offset_class<H>(j >> 1, k0 / kBN, len);
    if (cls >= 0) mw = __ldg(reinterpret_cast<const unsigned*>(HT::offset_masks_t() + cls * 256 + ctid) + (j & 1));
    return cls >= 0;
  } else {
    return false;
  }
}
// Whether the backward kinds mask partial linear items by span words of hooks HK (the
// transposed hooks in kv, the forward's in the deterministic dq; callers choose with if
// constexpr, so that kinds without them compile exactly as before).
template <class HK> constexpr bool span_words_on() { return CMC_BWD_KV_SPANS != 0 && HK::kSpanWords != 0; }
// A partial linear item's mask word (query item j of 64, keys from k0) where span_words_on<HT>():
// the forward's offset mask where the tile stage proved one, else the transposed hooks' span
// word of this thread's key rows (cmc_bwd_kv_span_word); false: HT::visible per element.
template <class H, class HT>
CMC_DEV bool kv_linear_word(bool is_full, int j, int k0, int len, int ctid, int cq, const typename HT::seq_t& seqt,
                            const typename HT::row_t& krow0, const typename HT::row_t& krow1, unsigned& mw) {
  if (kv_offset_word<H, HT>(is_full, j, k0, len, ctid, mw)) return true;
  return !is_full && cmc_bwd_kv_span_word<HT>(seqt, krow0, krow1, j * kBM, len, cq, mw);
}

// P of a partial item whose mask word w is known (P^T in kv), in place: s[4 jj + 2 i + e]
// becomes exp2(s sl2 - off(i, jj, e)) where bit cmc_bwd_kv_mask_bit(i, jj, e) of w is set, else
// 0 (kClamp: at most 2, for rows without a token). The word is applied inside the
// exponentials' loop, its bits ascending, so that ptxas selects by R2P without holding the word
// and all 32 values across a second loop: clear's ws kv 8 % faster than a bit per element
// (run 26), the grids' backward 4-15 % faster than the word applied after the loop (run 27).
template <bool kClamp, class Off>
CMC_DEV void p_by_word(float* s, unsigned w, float sl2, const Off& off) {
#pragma unroll
  for (int b = 0; b < 32; ++b) {
    const int i = b >> 4, e = (b >> 3) & 1, jj = b & 7;
    float& x = s[cmc_bwd_word_elem(b)];
    const float p = ex2(fmaf(x, sl2, -off(i, jj, e)));
    x = w & (1u << b) ? (kClamp ? fminf(p, 2.f) : p) : 0.f;
  }
}

// P^T of a full linear item in place (kv_p_linear): every element's exponential,
// unmasked. One branch an item picks it, where the test of a partial item per element pair
// inside one loop cost ptxas 16 branches an item (ws kv, causal: ncu, 2026-12-07).
template <class Row>
CMC_DEV void p_full(float* s, Row lse_b, int cq, float sl2) {
#pragma unroll
  for (int jj = 0; jj < 8; ++jj) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const float off = kv_row_at(lse_b, jj, e, cq);
      float p0 = ex2(fmaf(s[4 * jj + e], sl2, -off)), p1 = ex2(fmaf(s[4 * jj + 2 + e], sl2, -off));
      s[4 * jj + e] = p0;
      s[4 * jj + 2 + e] = p1;
    }
  }
}

// P^T of a linear item in place: element (key kr + 8 i, query qbase + 8 jj + cq + e) is
// s[4 jj + 2 i + e]; on a partial tile masked by the offset word (mw_ok) or HT::visible with
// the key rows' transposed rows, and cut at len on both sides (a word is cut only where the
// item or the thread's key rows cross len).
template <class HT, class Row = const float*>
CMC_DEV void kv_p_linear(float* s, Row lse_b, int cq, float sl2, bool is_full, bool mw_ok, unsigned mw,
                         const typename HT::seq_t& seqt, const typename HT::row_t& krow0,
                         const typename HT::row_t& krow1, int kr, int qbase, int len) {
  if (mw_ok) {  // (mw_ok implies a partial tile)
    if (qbase + kBM > len || kr + 8 >= len) mw &= cmc_bwd_kv_len_word(qbase, len, cq, kr < len, kr + 8 < len);
    p_by_word<false>(s, mw, sl2, [&](int, int jj, int e) { return kv_row_at(lse_b, jj, e, cq); });
    return;
  }
  if (is_full) {
    p_full(s, lse_b, cq, sl2);
    return;
  }
#pragma unroll
  for (int jj = 0; jj < 8; ++jj) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int c = 8 * jj + cq + e;
      const float off = kv_row_at(lse_b, jj, e, cq);
      float p0 = ex2(fmaf(s[4 * jj + e], sl2, -off)), p1 = ex2(fmaf(s[4 * jj + 2 + e], sl2, -off));
      const int q = qbase + c;
      const bool qin = q < len;
      if (!(qin && kr < len && HT::visible(seqt, krow0, q))) p0 = 0.f;
      if (!(qin && kr + 8 < len && HT::visible(seqt, krow1, q))) p1 = 0.f;
      s[4 * jj + e] = p0;
      s[4 * jj + 2 + e] = p1;
    }
  }
}

template <class H, class HT, bool BF16, int D>
CMC_DEV void kv(const typename H::desc_t& desc, const cmc_bwd_args& args) {
#if CMC_BWD_KV_WS
  kv_ws_entry<H, HT, BF16, D>(desc, cmc_kv_maps, args);  // bwd_ablate ws: the module global's maps
  return;
#else
  if constexpr (H::kTiling == 1) {
    kv_patch<H, HT, BF16, D>(desc, args);
    return;
  }
#endif
  constexpr int NTT = HT::kTerms;
  constexpr int kAcc = D / 2;   // fp32 accumulator registers of a [64 x D] tile per thread
  extern __shared__ __align__(1024) unsigned char cmc_smem_raw[];
  unsigned char* smem = cmc_smem_raw + ((1024u - (smem_u32(cmc_smem_raw) & 1023u)) & 1023u);
  const unsigned base = smem_u32(smem);
  const int tid = threadIdx.x, wg = wg_index(tid), wtid = tid & 127, warp = wtid >> 5, lane = tid & 31;
  const int hkv = blockIdx.y, b = blockIdx.z;
  const int k0 = blockIdx.x * kBN;
  const typename HT::seq_t seqt = HT::seq(desc, b);
  const int len = seqt.len;
  if (k0 >= len) return;
  const cmc_i64 tok0 = seqt.tok0;
  const int group = desc.heads_q / desc.heads_kv;
  const bool atomic_dq = (args.flags & 1) == 0;

  const unsigned sK = base + SmemKV<D>::kK, sV = base + SmemKV<D>::kV;
  const unsigned sQ = base + SmemKV<D>::kQ, sDO = base + SmemKV<D>::kDO;
  const unsigned sDS = base + SmemKV<D>::kDS;
  const float* lse_s = reinterpret_cast<const float*>(smem + SmemKV<D>::kLse);
  const float* dsum_s = reinterpret_cast<const float*>(smem + SmemKV<D>::kDsum);
  int* plan = reinterpret_cast<int*>(smem + SmemKV<D>::kPlan);

  load_tile<D, kBN>(sK, reinterpret_cast<const unsigned short*>(desc.k) + tok0 * desc.k_stride_tok +
                            (cmc_i64)hkv * desc.k_stride_head, desc.k_stride_tok, k0, len, tid);
  load_tile<D, kBN>(sV, reinterpret_cast<const unsigned short*>(desc.v) + tok0 * desc.v_stride_tok +
                            (cmc_i64)hkv * desc.v_stride_head, desc.v_stride_tok, k0, len, tid);
  cp_commit();
#if CMC_BWD_KV_TMA
  const KvMaps* maps = &cmc_kv_maps;
  if (tid == 0) {
    kv_mbar_init(base + SmemKV<D>::kBar, 1);
    kv_mbar_init(base + SmemKV<D>::kBar + 8, 1);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  // (build_plan's barriers publish the inits before the first TMA waits on them)
#endif

  // Query tiles that see keys [k0, min(k0 + kBN, len) - 1], from the transposed hooks.
  cmc_bwd::build_plan<HT, Cfg<D>::kThreadsKV>(plan, seqt, k0, cmc_min(k0 + kBN, len) - 1, kBM, tid);
  const int* run = plan + 4 * NTT;
  const int* full = plan + 6 * NTT;
  const int nrun = plan[8 * NTT], nfull = plan[8 * NTT + 1];

  // This thread's key rows (wgmma accumulator layout): kr and kr + 8.
  const int kr = k0 + 64 * wg + 16 * warp + (lane >> 2);
  const typename HT::row_t krow0 = HT::row(seqt, kr), krow1 = HT::row(seqt, kr + 8);
  const float sl2 = desc.scale_log2;
  const int cq = 2 * (lane & 3);  // this thread's first query column in each group of 8

  // Descriptors' fixed parts: this warpgroup's K / V rows (K-major A), Q / dO stage 0.
  const unsigned kA = sK + wg * 64 * 128, vA = sV + wg * 64 * 128;
  // dQ's operands (MN-major): A = dS^T rows, B = K (DQ<D>: split by columns or by keys).
  const unsigned dqA = sDS + (DQ<D>::kSplitN ? 0 : wg * 64 * 128);
  const unsigned dqB = sK + wg * (DQ<D>::kSplitN ? kBN * 128 : 64 * 128);
  const int dqCol = DQ<D>::kSplitN ? wg * 64 : 0;

  float dk[kAcc], dv[kAcc];
#pragma unroll
  for (int i = 0; i < kAcc; ++i) dk[i] = dv[i] = 0.f;

  int g = 0, r = 0, j = nrun > 0 ? run[0] : 0;
#if CMC_BWD_KV_TMA
  if (nrun > 0) kv_issue_tma<typename H::desc_t, D>(base, 0, desc, args, tok0, len, hkv * group, j, tid, maps);
  unsigned tma_phase = 0u;  // bit b: the parity stage b's barrier completes next
#else
  if (nrun > 0) kv_issue<typename H::desc_t, D>(base, 0, desc, args, tok0, len, hkv * group, j, tid);
#endif
  cp_commit();
  int buf = 0, f = 0;
#if CMC_BWD_DQ_BULK == 2
  int nitem = 0;
#endif
  while (nrun > 0) {
    int gn = g, rn = r, jn;
    if (j + 1 < run[2 * r + 1]) {
      jn = j + 1;
    } else if (r + 1 < nrun) {
      rn = r + 1;
      jn = run[2 * rn];
    } else {
      gn = g + 1;
      rn = 0;
      jn = gn < group ? run[0] : -1;
    }
    cp_wait<0>();          // this thread's copies of the item (and K, V) landed
#if CMC_BWD_KV_TMA
    kv_mbar_wait(base + SmemKV<D>::kBar + 8 * buf, (tma_phase >> buf) & 1u);  // the item's Q, dO
    tma_phase ^= 1u << buf;
#endif
    fence_proxy_async();   // ... visible to wgmma (async proxy)
    __syncthreads();       // everyone's; everyone is done with stage buf ^ 1 and dS^T
#if CMC_BWD_KV_TMA
    if (jn >= 0)
      kv_issue_tma<typename H::desc_t, D>(base, buf ^ 1, desc, args, tok0, len, hkv * group + gn, jn, tid, maps);
#else
    if (jn >= 0) kv_issue<typename H::desc_t, D>(base, buf ^ 1, desc, args, tok0, len, hkv * group + gn, jn, tid);
#endif
    cp_commit();

    const unsigned qB = sQ + buf * Cfg<D>::kTileQ, doB = sDO + buf * Cfg<D>::kTileQ;
    const float* lse_b = lse_s + buf * kBM;
    const float* dsum_b = dsum_s + buf * kBM;
    while (f < nfull && full[2 * f + 1] <= j) ++f;
    const bool is_full = f < nfull && full[2 * f] <= j && k0 + kBN <= len;
    const int qbase = j * kBM;

    // S^T and dP^T (two commit groups).
    float s[32], dp[32];
    issue_s_dp<BF16, D, kBN, kBM>(s, dp, kA, qB, vA, doB);
    unsigned mw = 0u;
    bool mw_ok;
    if constexpr (span_words_on<HT>()) mw_ok = kv_linear_word<H, HT>(is_full, j, k0, len, tid, cq, seqt, krow0, krow1, mw);
    else mw_ok = kv_offset_word<H, HT>(is_full, j, k0, len, tid, mw);
    wg_wait<1>();
    fence_regs<32>(s);
    kv_p_linear<HT>(s, lse_b, cq, sl2, is_full, mw_ok, mw, seqt, krow0, krow1, kr, qbase, len);
    unsigned pa[16], dsa[16];
    kv_dv_ds_dk<BF16, D>(s, dp, dsum_b, cq, dv, dk, doB, qB, pa, dsa);
    kv_dq_or_wait<BF16, D, CMC_BWD_DQ_BULK == 2>(atomic_dq, smem + SmemKV<D>::kDS, pa, dsa, 64 * wg + 16 * warp + (lane >> 2),
                           wg, warp, lane, dqA, dqB, dqCol,
                           [&](int r) { return qbase + r < len ? qbase + r : -1; },
                           reinterpret_cast<float*>(args.dq_accum), tok0, desc.heads_q, hkv * group + g
#if CMC_BWD_DQ_BULK == 2
                           , j, buf
#endif
                           );

    buf ^= 1;
    if (jn < 0) break;
    if (gn != g) f = 0;
    g = gn;
    r = rn;
    j = jn;
  }
  cp_wait<0>();
#if CMC_BWD_DQ_BULK == 1 || CMC_BWD_DQ_BULK == 2
  bulk_wait_read();  // the staging stays valid until the bulk unit has read it
#endif
  fence_regs<kAcc>(dk);
  fence_regs<kAcc>(dv);
  __syncthreads();  // K, V no longer read: they stage dK, dV

  const float scale = sl2 * 0.6931471805599453f;
  store_acc<BF16, D>(smem + SmemKV<D>::kK, dk, scale, 64 * wg,
                     reinterpret_cast<unsigned short*>(args.dk) + tok0 * args.dk_stride_tok +
                         (cmc_i64)hkv * args.dk_stride_head, args.dk_stride_tok, k0, len, wtid, wg);
  store_acc<BF16, D>(smem + SmemKV<D>::kV, dv, 1.f, 64 * wg,
                     reinterpret_cast<unsigned short*>(args.dv) + tok0 * args.dv_stride_tok +
                         (cmc_i64)hkv * args.dv_stride_head, args.dv_stride_tok, k0, len, wtid, wg);
}

// ------------------------------------------------------------------ kv on patch tiles
// Copies of the query rows r0 .. r0 + kBM - 1 of a token map (one half of a forward tile) of
// query head hq into ring stage `buf`: kv_issue by token (rows without a token zero-filled).
template <class Desc, int D, class Tok>
CMC_DEV void kv_issue_rows(unsigned base, int buf, const Desc& desc, const cmc_bwd_args& args, cmc_i64 tok0,
                           int hq, const Tok& rows, int r0, int tid) {
  load_rows<D, kBM>(base + SmemKV<D>::kQ + buf * Cfg<D>::kTileQ,
                    reinterpret_cast<const unsigned short*>(desc.q) + tok0 * desc.q_stride_tok +
                        (cmc_i64)hq * desc.q_stride_head, desc.q_stride_tok, rows, r0, tid);
  load_rows<D, kBM>(base + SmemKV<D>::kDO + buf * Cfg<D>::kTileQ,
                    reinterpret_cast<const unsigned short*>(args.dout) + tok0 * args.dout_stride_tok +
                        (cmc_i64)hq * args.dout_stride_head, args.dout_stride_tok, rows, r0, tid);
  if (tid < 2 * kBM) {
    const float* lse = cmc_bwd::lse_offsets(args, desc.heads_q, hq) + tok0;
    const float* dsum = reinterpret_cast<const float*>(args.dsum) + (cmc_i64)hq * args.total_tokens + tok0;
    const int rr = tid % kBM, q = rows(r0 + rr);
    const bool valid = q >= 0;
    const float* src = (tid < kBM ? lse : dsum) + (valid ? q : 0);
    cmc_bwd::cp_async4(base + (tid < kBM ? SmemKV<D>::kLse : SmemKV<D>::kDsum) + (buf * kBM + kv_stat_slot(rr)) * 4,
                       src, valid);
  }
}

// The forward's per-offset tile mask of the pair (query tile j, key tile kt) where the tile
// stage proved one (H::kPatchMasks; class from the forward geometry and hooks H), transposed
// to the key rows of kv thread ctid (HT::patch_masks_t, cmc/emit.py sm90_kv_mask_words): the
// word of half hh into mw, loaded under the S^T / dP^T GEMMs; false where there is none. The
// key patch may be cut by len (cmc_patch_class_cut): its key rows past len have no token, so
// K = V = 0, S = dP = 0, P is clamped to 2 (kv_p_patch), their dS adds dS K = 0 to dQ, and
// their dK, dV rows are never stored. A query row without a token may still have its bit set:
// its Q, dO, LSE and Dsum are zero-filled, so S = 0, P = 1 (clamped to 2), dP = 0 and its
// dS = P (dP - Dsum) = 0 and P dO = 0 add exactly 0 to dK and dV; its dQ row is never stored.
template <class H, class HT>
CMC_DEV bool kv_patch_word(bool is_full, const cmc_patch_geo& geo, int j, int kt, int len, int ctid, int hh,
                           unsigned& mw) {
  if constexpr (H::kPatchMasks != 0) {
    const int c = is_full ? -1 : cmc_patch_class_cut<H>(geo, j, kt, len);
    if (c >= 0) mw = __ldg(reinterpret_cast<const unsigned*>(HT::patch_masks_t() + c * 256 + ctid) + hh);
    return c >= 0;
  } else {
    return false;
  }
}
// A partial patch item's mask word where span_words_on<HT>(): kv_patch_word, else, for half hh of a
// linear query tile (consecutive tokens from qrows.base, cut at qrows.lim: len, or the grid
// origin), the span word of kv_linear_word.
template <class H, class HT>
CMC_DEV bool kv_patch_item_word(bool is_full, const cmc_patch_geo& geo, int j, int kt, int len, int ctid, int hh,
                                int cq, const typename HT::seq_t& seqt, const typename HT::row_t& krow0,
                                const typename HT::row_t& krow1, const cmc_bwd_tile_tokens<H>& qrows, unsigned& mw) {
  if (kv_patch_word<H, HT>(is_full, geo, j, kt, len, ctid, hh, mw)) return true;
  return !is_full && qrows.linear &&
         cmc_bwd_kv_span_word<HT>(seqt, krow0, krow1, qrows.base + 64 * hh, qrows.lim, cq, mw);
}

// P^T of a patch item in place (kv_patch, kv_patch_ws): element (key row lr + 8 i, query
// row r0 + 8 jj + cq + e of the query tile's token map qrows) is s[4 jj + 2 i + e]. A key
// row without a token (K = V = 0: S = dP = 0) is masked as token 0's row and its P clamped to
// 2 (a real pair has P <= 1 up to rounding, so the clamp never changes one): its dS = -P Dsum
// stays finite, adds exactly 0 to dQ (times its zero K row), and its dK, dV are never
// stored. A per-row token check here instead made D = 128 spill (ptxas, 2026-12-05: 255
// registers, 4 B spilled).
template <class HT, class Tok, class Row = const float*>
CMC_DEV void kv_p_patch(float* s, Row lse_b, int cq, float sl2, bool is_full, bool mw_ok, unsigned mw,
                        const typename HT::seq_t& seqt, const typename HT::row_t& krow0,
                        const typename HT::row_t& krow1, const Tok& qrows, int r0) {
  if (mw_ok) {  // (the word applied after the loop was 3 % slower: run 25)
    p_by_word<true>(s, mw, sl2, [&](int, int jj, int e) { return kv_row_at(lse_b, jj, e, cq); });
    return;
  }
  // (p_full's branch here kept ptxas from the lockstep kv's wgmma pipeline on patch tilings:
  // C7519, 2026-12-07)
#pragma unroll
  for (int jj = 0; jj < 8; ++jj) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int c = 8 * jj + cq + e;
      const float off = kv_row_at(lse_b, jj, e, cq);
      float p0 = ex2(fmaf(s[4 * jj + e], sl2, -off)), p1 = ex2(fmaf(s[4 * jj + 2 + e], sl2, -off));
      if (!is_full) {
        const int q = qrows(r0 + c);
        const bool qin = q >= 0;
        p0 = qin && HT::visible(seqt, krow0, q) ? fminf(p0, 2.f) : 0.f;
        p1 = qin && HT::visible(seqt, krow1, q) ? fminf(p1, 2.f) : 0.f;
      }
      s[4 * jj + e] = p0;
      s[4 * jj + 2 + e] = p1;
    }
  }
}

// kv with the forward's patch tiling (H::kTiling == 1; part A above): the CTA's 128 keys are
// forward tile blockIdx.x (cmc_bwd_tokens_of: a linear tile, possibly the partial one before
// the grid origin, or a PH x PW patch), grid (nqt of max_len, heads_kv, batch); K, V gathered
// by token, rows without a token zero-filled and never stored. Its plan is the transposed
// hooks' patch plan (cmc_bwd_plan_step<HT>: touched and full query tiles of 128). Items =
// (query head of the GQA group, touched query tile, half hh): query rows 64 hh .. of that
// tile's token map (PH / 2 grid rows of a patch), Q, dO, LSE, Dsum gathered into the ring; a
// half with no token is skipped (a tile's tokens are a prefix of its rows, so half 1 has one
// iff row 64 has). Full / partial per half: both halves of a full query tile are full when
// all 128 keys of the CTA have a token (the plan's full bit is per query tile; a key row past
// len would otherwise get P != 0); every other half masks by HT::visible per element. dK, dV
// rows are stored to their key tokens; atomic mode adds dQ rows to their query tokens.
template <class H, class HT, bool BF16, int D>
CMC_DEV void kv_patch(const typename H::desc_t& desc, const cmc_bwd_args& args) {
  static_assert(H::kPatchRows % 2 == 0 && H::kPatchRows * H::kPatchCols == kBN, "patch halves of 64 rows");
  static_assert(H::kTiling == 1 && CMC_BWD_KV_WS == 0, "CMC_BWD_KV_WS: kv_patch_ws");
  constexpr int NTT = HT::kTerms;
  constexpr int kAcc = D / 2;
  extern __shared__ __align__(1024) unsigned char cmc_smem_raw[];
  unsigned char* smem = cmc_smem_raw + ((1024u - (smem_u32(cmc_smem_raw) & 1023u)) & 1023u);
  const unsigned base = smem_u32(smem);
  const int tid = threadIdx.x, wg = wg_index(tid), wtid = tid & 127, warp = wtid >> 5, lane = tid & 31;
  const int hkv = blockIdx.y, b = blockIdx.z, kt = blockIdx.x;
  const typename HT::seq_t seqt = HT::seq(desc, b);
  const int len = seqt.len;
  const cmc_patch_geo geo = cmc_bwd_geo<H>(len);
  int ka, kb;
  if (!cmc_bwd_tile_hull(geo, kt, len, ka, kb)) return;
  const cmc_i64 tok0 = seqt.tok0;
  const int group = desc.heads_q / desc.heads_kv;
  const bool atomic_dq = (args.flags & 1) == 0;
  const cmc_bwd_tile_tokens<H> keys = cmc_bwd_tokens_of<H>(geo, kt, len);

  const unsigned sK = base + SmemKV<D>::kK, sV = base + SmemKV<D>::kV;
  const unsigned sQ = base + SmemKV<D>::kQ, sDO = base + SmemKV<D>::kDO;
  const unsigned sDS = base + SmemKV<D>::kDS;
  const float* lse_s = reinterpret_cast<const float*>(smem + SmemKV<D>::kLse);
  const float* dsum_s = reinterpret_cast<const float*>(smem + SmemKV<D>::kDsum);
  int* plan = reinterpret_cast<int*>(smem + SmemKV<D>::kPlan);

  load_rows<D, kBN>(sK, reinterpret_cast<const unsigned short*>(desc.k) + tok0 * desc.k_stride_tok +
                            (cmc_i64)hkv * desc.k_stride_head, desc.k_stride_tok, keys, 0, tid);
  load_rows<D, kBN>(sV, reinterpret_cast<const unsigned short*>(desc.v) + tok0 * desc.v_stride_tok +
                            (cmc_i64)hkv * desc.v_stride_head, desc.v_stride_tok, keys, 0, tid);
  cp_commit();

  // Query tiles that see any of the CTA's keys, from the transposed hooks.
  build_plan_patch<HT, Cfg<D>::kThreadsKV>(plan, seqt, geo, kt, ka, kb, tid);
  const unsigned* touched = reinterpret_cast<const unsigned*>(plan + 4 * NTT);
  const unsigned* full = touched + kBwdPatchWords;
  const int nw = (geo.nqt + 31) >> 5;
  const bool keys_all = keys(kBN - 1) >= 0;  // every key row has a token

  // This thread's key rows (wgmma accumulator layout): local lr and lr + 8.
  const int lr = 64 * wg + 16 * warp + (lane >> 2);
  const int tk0 = keys(lr), tk1 = keys(lr + 8);  // -1: no token (masked as row 0, see P^T)
  const typename HT::row_t krow0 = HT::row(seqt, tk0 >= 0 ? tk0 : 0), krow1 = HT::row(seqt, tk1 >= 0 ? tk1 : 0);
  const float sl2 = desc.scale_log2;
  const int cq = 2 * (lane & 3);

  const unsigned kA = sK + wg * 64 * 128, vA = sV + wg * 64 * 128;
  const unsigned dqA = sDS + (DQ<D>::kSplitN ? 0 : wg * 64 * 128);
  const unsigned dqB = sK + wg * (DQ<D>::kSplitN ? kBN * 128 : 64 * 128);
  const int dqCol = DQ<D>::kSplitN ? wg * 64 : 0;

  float dk[kAcc], dv[kAcc];
#pragma unroll
  for (int i = 0; i < kAcc; ++i) dk[i] = dv[i] = 0.f;

  // items: (query head g of the group, touched query tile j, half hh)
  int g = 0, j = next_tile(touched, nw, 0), hh = 0;
  if (j >= 0)
    kv_issue_rows<typename H::desc_t, D>(base, 0, desc, args, tok0, hkv * group, cmc_bwd_tokens_of<H>(geo, j, len),
                                         0, tid);
  cp_commit();
  int buf = 0;
  while (j >= 0) {
    int gn = g, jn = j, hn = 1;
    if (hh == 1 || cmc_bwd_tokens_of<H>(geo, j, len)(64) < 0) {
      hn = 0;
      jn = next_tile(touched, nw, j + 1);
      if (jn < 0 && ++gn < group) jn = next_tile(touched, nw, 0);
    }
    cp_wait<0>();
    fence_proxy_async();
    __syncthreads();
    if (jn >= 0)
      kv_issue_rows<typename H::desc_t, D>(base, buf ^ 1, desc, args, tok0, hkv * group + gn,
                                           cmc_bwd_tokens_of<H>(geo, jn, len), 64 * hn, tid);
    cp_commit();

    const unsigned qB = sQ + buf * Cfg<D>::kTileQ, doB = sDO + buf * Cfg<D>::kTileQ;
    const float* lse_b = lse_s + buf * kBM;
    const float* dsum_b = dsum_s + buf * kBM;
    const bool is_full = keys_all && tile_bit(full, j);
    const cmc_bwd_tile_tokens<H> qrows = cmc_bwd_tokens_of<H>(geo, j, len);
    const int r0 = 64 * hh;

    float s[32], dp[32];
    issue_s_dp<BF16, D, kBN, kBM>(s, dp, kA, qB, vA, doB);
    unsigned mw = 0u;
    bool mw_ok;
    if constexpr (span_words_on<HT>())
      mw_ok = kv_patch_item_word<H, HT>(is_full, geo, j, kt, len, tid, hh, cq, seqt, krow0, krow1, qrows, mw);
    else
      mw_ok = kv_patch_word<H, HT>(is_full, geo, j, kt, len, tid, hh, mw);
    wg_wait<1>();
    fence_regs<32>(s);

    kv_p_patch<HT>(s, lse_b, cq, sl2, is_full, mw_ok, mw, seqt, krow0, krow1, qrows, r0);
    unsigned pa[16], dsa[16];
    kv_dv_ds_dk<BF16, D>(s, dp, dsum_b, cq, dv, dk, doB, qB, pa, dsa);
    kv_dq_or_wait<BF16, D>(atomic_dq, smem + SmemKV<D>::kDS, pa, dsa, lr, wg, warp, lane, dqA, dqB, dqCol,
                           [&](int r) { return qrows(r0 + r); },
                           reinterpret_cast<float*>(args.dq_accum), tok0, desc.heads_q, hkv * group + g);

    buf ^= 1;
    g = gn;
    j = jn;
    hh = hn;
  }
  cp_wait<0>();
#if CMC_BWD_DQ_BULK == 1 || CMC_BWD_DQ_BULK == 2
  bulk_wait_read();  // the staging stays valid until the bulk unit has read it
#endif
  fence_regs<kAcc>(dk);
  fence_regs<kAcc>(dv);
  __syncthreads();  // K, V no longer read: they stage dK, dV

  const float scale = sl2 * 0.6931471805599453f;
  store_acc_rows<BF16, D>(smem + SmemKV<D>::kK, dk, scale, 64 * wg,
                          reinterpret_cast<unsigned short*>(args.dk) + tok0 * args.dk_stride_tok +
                              (cmc_i64)hkv * args.dk_stride_head, args.dk_stride_tok, keys, wtid, wg);
  store_acc_rows<BF16, D>(smem + SmemKV<D>::kV, dv, 1.f, 64 * wg,
                          reinterpret_cast<unsigned short*>(args.dv) + tok0 * args.dv_stride_tok +
                              (cmc_i64)hkv * args.dv_stride_head, args.dv_stride_tok, keys, wtid, wg);
}

}  // namespace cmc_bwd_sm90
#endif  // !CMC_HOST
