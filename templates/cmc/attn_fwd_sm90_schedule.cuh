// cmc sm90a: the schedule (plan walks, tile plans, work units, query tile rows).
// Part of the sm90a forward kernel: emit concatenates the parts in the order of
// cmc/kernels.py KernelSpec.headers (design notes and launch contract in attn_fwd_sm90.cuh).

#if !defined(CMC_HOST)
namespace cmc_sm90 {

// Conversion and special-function helpers: the portable header's (emit always inlines it
// first, since both kernels share its plan and hook code).
using cmc_portable::pack2;
using cmc_portable::ex2;
using cmc_portable::lg2;
using cmc_portable::neg_inf;
using cmc_portable::quad_max;
using cmc_portable::quad_sum;

// The walk over the plan: tiles of the sorted disjoint runs, in order.
struct Walk {
  const int* run;
  int nrun, r, j;  // j = current tile, -1 once past the last
  CMC_DEV void start(const int* rn, int n) { run = rn; nrun = n; r = 0; j = n > 0 ? rn[0] : -1; }
  CMC_DEV void next() {
    if (j + 1 < run[2 * r + 1]) { ++j; return; }
    ++r;
    j = r < nrun ? run[2 * r] : -1;
  }
};

template <bool B, class T, class F> struct Pick { typedef T type; };
template <class T, class F> struct Pick<false, T, F> { typedef F type; };

// The walk over a patch plan: the set bits of the touched key tiles, in order.
struct BitWalk {
  const unsigned* bits;
  int nw, w, j;  // j = current tile, -1 once past the last
  unsigned cur;
  CMC_DEV void seek() {
    while (cur == 0u && ++w < nw) cur = bits[w];
    j = cur != 0u ? 32 * w + __ffs(cur) - 1 : -1;
  }
  CMC_DEV void start(const unsigned* b, int n) {
    bits = b; nw = n; w = 0;
    cur = n > 0 ? b[0] : 0u;
    seek();
  }
  CMC_DEV void next() { cur &= cur - 1u; seek(); }
};

// Whether a patch kernel's last linear tile can be partial (the grid origin is not a
// multiple of 128): only then do its rows and keys stop at cmc_patch_lim, not at len.
template <class H> CMC_DEV constexpr bool partial_linear_tile() {
  return H::kTiling == 1 && H::kGridOrigin % kBM != 0;
}

// Tile plan of query rows [qa, qb] into p (8 NT + 2 ints) by the plan builders
// (btid < kBuilders; named barrier 3 among them).
template <class H>
CMC_DEV void build_plan(const typename H::seq_t& seq, int qa, int qb, int* p, int btid) {
  constexpr int NT = H::kTerms;
  cmc_plan_terms<H>(seq, qa, qb, p, btid, kBuilders, [] { producer_bar(); });
  producer_bar();
  for (int i = btid; i < NT; i += kBuilders) cmc_plan_place(p, NT, i, kBN);
  producer_bar();
  if (btid == 0) cmc_plan_merge(p, NT, kBN);
  producer_bar();
}

// Patch-tiled plan of query tile qt into p (plan_ints<NT, 1>() ints) by nb threads
// (btid < nb; named barrier 3): the term ranges over the tile's hull of rows (tile_rows; full
// ranges, and the consumers' test of which terms can touch a key tile), the key tiles
// touched by some row of the tile (per box of PW consecutive rows, so a grid row of the patch
// is never widened to the hull; a linear tile is its own hull) and, of those, the full ones:
// a touched tile stays full unless one of its boxes (one work item per tile and box) lies
// past len (past the origin in a partial linear tile) or outside every full range.
// The hull and box ranges are one loop with one H::term: with two inlined copies of the
// term code the producer's 56 registers spilled at D = 128 (kernel notes, "Patch plan
// spills"); the hull rows are recomputed per item, not held across the builders' loop.
template <class H>
CMC_DEV void build_plan_patch(const typename H::seq_t& seq, const cmc_patch_geo& g, int qt,
                              int* p, int btid, int nb) {
  constexpr int NT = H::kTerms, PH = H::kPatchRows, PW = H::kPatchCols;
  unsigned* touched = reinterpret_cast<unsigned*>(p + 4 * NT);
  unsigned* full = touched + kMaxKeyWords;
  const int len = seq.len, nw = (g.nqt + 31) >> 5;
  for (int w = btid; w < nw; w += nb) touched[w] = 0u;
  builders_bar(nb);
  // items x < NT: term x over the hull; then (patch tiles) term i over box b
  const int nbox = qt < g.nlin ? 0 : PH;
  for (int x = btid; x < NT * (1 + nbox); x += nb) {
    const bool hull = x < NT;
    const int y = x - NT, i = hull ? x : y / nbox, b = hull ? 0 : y - i * nbox;
    const int s = cmc_patch_box(g, qt, b);
    if (s >= len) continue;
    // the hull: tile_rows's rows (a tile holds a row: box 0 is below len)
    const int lim = hull ? (partial_linear_tile<H>() ? cmc_patch_lim(g, qt, len) : len) : len;
    const int end = hull ? cmc_patch_box(g, qt, PH - 1) + PW - 1 : s + PW - 1;
    const int e = end < lim - 1 ? end : lim - 1;
    int r4[4];
    H::term(seq, s, e, i, r4);
    cmc_plan_patch_item(p, touched, g, i, r4, hull, nbox > 0);
  }
  builders_bar(nb);
  // btid opaque: else ptxas keeps btid < nw (the first loop's test) across the term code
  for (int w = opaque(btid); w < nw; w += nb) full[w] = touched[w];
  builders_bar(nb);
  for (int x = btid; x < g.nqt * PH; x += nb) {
    const int t = x / PH, b = x - t * PH;
    if (!((touched[t >> 5] >> (t & 31)) & 1u)) continue;
    const int s = cmc_patch_box(g, t, b);
    bool in;
    if constexpr (partial_linear_tile<H>()) in = s + PW <= cmc_patch_lim(g, t, len);
    else in = s + PW <= len;
    if (in) {
      in = false;
      for (int i = 0; i < NT && !in; ++i) in = p[4 * i + 2] <= s && s + PW <= p[4 * i + 3];
    }
    if (!in) atomicAnd(full + (t >> 5), ~(1u << (t & 31)));
  }
  builders_bar(nb);
}

// The persistent schedule. CTA c starts with unit c; with a work counter (desc.sched != 0)
// it then takes gridDim.x + an atomicAdd on the counter, without one units c + gridDim.x,
// c + 2 gridDim.x, ... The unit is chosen by the compiler (H::kTileUnits, cmc/tiling.py
// units_for):
// - pairs (always without a counter): query tiles nqt - 1 - p and p of one (sequence, head)
//   (p < ceil(nqt / 2); the middle tile of an odd nqt alone), the longer first, numbered
//   head-major within a sequence. Every pair of a causal-like mask costs about the same
//   (nqt + 1 key tiles), so the CTAs running together share a few heads' K/V in L2.
// - single tiles, for masks with run-time parameters (tile costs the compiler cannot see):
//   costliest first within groups of (sequence, head)s whose K/V fit in L2 together
//   (kL2Budget): group by group, tile index descending, then (sequence, head). The units
//   left at the end are short, so the CTAs finish together (tools/sched_sim.py).
// - single tiles with a heavy prefix (H::kHeavyTiles = N > 0, cmc/tiling.py with_heavy_first):
//   the first N query tiles of every (sequence, head) first, tile by tile, then the rest as
//   above. Their rows see every key (text or global tokens): such a tile costs about nqt
//   key tiles, and taken last within its L2 group the last groups' ones made the tail
//   (tools/sched_sim.py --heavy).
// Only the plan builders pick items; the loader and the consumers read each from its plan's
// item header.
struct Item {
  int qt, h, b;
};
// The item header of a plan slot: false at the end of the CTA's items.
CMC_DEV bool read_item(const int* item, Item& it) {
  it.qt = item[0];
  it.h = item[1];
  it.b = item[2];
  return it.qt >= 0;
}
struct Sched {
  int nqt, npair, heads, nbh, group;
  bool dyn;  // single tiles in groups (a counter and H::kTileUnits; see above); else pairs
  // K/V bytes a group of (sequence, head)s may share in L2 (50 MB on an H200)
  static constexpr long long kL2Budget = 24ll << 20;
  CMC_DEV void init(int nqt_, int heads_, int batch, int hpk, int max_len, int d, bool dyn_) {
    nqt = nqt_;
    npair = (nqt + 1) / 2;
    heads = heads_;
    nbh = heads_ * batch;
    dyn = dyn_;
    const long long per = (long long)max_len * d * 4 / hpk;  // K + V of one query head
    const long long gs = per > 0 ? kL2Budget / per : nbh;
    group = (int)(gs < 1 ? 1 : (gs > nbh ? nbh : gs));
  }
  CMC_DEV int units(int batch) const { return (dyn ? nqt : npair) * heads * batch; }
  // A unit from the counter (the lead builder's reservation; its latency is hidden until
  // the next call of next()).
  CMC_DEV static int fetch(unsigned long long counter) {
    return (int)gridDim.x + (int)atomicAdd(reinterpret_cast<unsigned*>(counter), 1u);
  }
  // The unit after u, for every plan builder (word: a shared int; lead: the one builder that
  // holds the reservation `held` and reserves the next one).
  CMC_DEV int next(unsigned long long counter, int u, int* word, bool lead, int& held,
                   int units) const {
    if (counter == 0) return u + (int)gridDim.x;
    if (lead) {
      *word = held;
      if (held < units) held = fetch(counter);
    }
    producer_bar();
    return *word;
  }
  // After the lead builder's last next(): the last CTA to finish leaves the counter zero for
  // the next launch on its stream (every CTA's fetches are before its count: the fence).
  CMC_DEV void finish(unsigned long long counter) const {
    if (counter == 0) return;
    unsigned* c = reinterpret_cast<unsigned*>(counter);
    __threadfence();
    if (atomicAdd(c + 1, 1u) == gridDim.x - 1) {
      atomicExch(c, 0u);
      atomicExch(c + 1, 0u);
    }
  }
  // query tile `half` of unit u (pairs: 0 the long one, 1 the short one; single tiles: 0),
  // or -1 if it has none; HEAVY: H::kHeavyTiles (single tiles only)
  template <int HEAVY>
  CMC_DEV int tile(int u, int half, int& h, int& b) const {
    int bh, qt;
    if (dyn) {
      if (half == 1) return -1;
      int first = 0, rest = nqt;  // the grouped units' tiles: [first, nqt)
      if constexpr (HEAVY > 0) {
        first = HEAVY < nqt ? HEAVY : nqt;
        rest = nqt - first;
        if (u < first * nbh) {
          qt = u / nbh;
          bh = u - qt * nbh;
          h = bh % heads;
          b = bh / heads;
          return qt;
        }
        u -= first * nbh;
      }
      const int g = u / (group * rest), r = u - g * group * rest;
      const int left = nbh - g * group, gsz = left < group ? left : group;
      qt = nqt - 1 - r / gsz;
      bh = g * group + r % gsz;
    } else {
      bh = u / npair;
      const int p = u - bh * npair;
      qt = half == 0 ? nqt - 1 - p : p;
      if (half == 1 && qt == nqt - 1 - p) return -1;
    }
    h = bh % heads;
    b = bh / heads;
    return qt;
  }
};

// Query tile qt of a sequence: its hull of rows [qa, qb] (qb < len; with PARTIAL, below
// cmc_patch_lim), or false when it holds no row (past the sequence's last tile, or a patch
// wholly past len).
template <bool PATCH, bool PARTIAL = false>
CMC_DEV bool tile_rows(const cmc_patch_geo& g, int len, int qt, int& qa, int& qb) {
  if constexpr (PATCH) {
    if (qt >= g.nqt) return false;
    qa = cmc_patch_box(g, qt, 0);
    const int e = cmc_patch_box(g, qt, g.PH - 1) + g.PW - 1;
    const int lim = PARTIAL ? cmc_patch_lim(g, qt, len) : len;
    qb = e < lim - 1 ? e : lim - 1;
  } else {
    qa = qt * kBM;
    qb = len - 1 - qa < kBM - 1 ? len - 1 : qa + kBM - 1;
  }
  return qa < len;
}
// The walk over a plan's touched key tiles (plan_ints layout).
template <int NT> CMC_DEV void start_walk(Walk& wk, const int* plan, const cmc_patch_geo&) {
  wk.start(plan + 4 * NT, plan[8 * NT]);
}
template <int NT> CMC_DEV void start_walk(BitWalk& wk, const int* plan, const cmc_patch_geo& g) {
  wk.start(reinterpret_cast<const unsigned*>(plan + 4 * NT), (g.nqt + 31) >> 5);
}

}  // namespace cmc_sm90
#endif  // !CMC_HOST
