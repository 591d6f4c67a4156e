// cmc sm90a: the forward (producer: plan builders and loader; consumers: GEMMs, mask,
// online softmax, epilogue).
// Part of the sm90a forward kernel: emit concatenates the parts in the order of
// cmc/kernels.py KernelSpec.headers (design notes and launch contract in attn_fwd_sm90.cuh).

#if !defined(CMC_HOST)
namespace cmc_sm90 {

// Thread 0: the mbarriers at `bars` (per slot x (item parity): Q full (1 arrival + the TMA
// bytes), plan full (the builders), slot empty (8 consumer warps, after the epilogue); then
// the K/V ring of S stages: K full, K empty, V full, V empty), and the tensor-map prefetches.
template <int S>
CMC_DEV void init_barriers(unsigned bars, const TensorMaps& maps) {
  for (int x = 0; x < 2; ++x) {
    mbar_init(bars + 8 * x, 1);
    mbar_init(bars + 8 * (2 + x), kBuilders);
    mbar_init(bars + 8 * (4 + x), 8);
  }
  for (int s = 0; s < S; ++s) {
    mbar_init(bars + 8 * (6 + s), 1);
    mbar_init(bars + 8 * (6 + S + s), 8);
    mbar_init(bars + 8 * (6 + 2 * S + s), 1);
    mbar_init(bars + 8 * (6 + 3 * S + s), 8);
  }
  // mbarrier inits must be visible to the async proxy (TMA's complete_tx) too
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  tma_prefetch_map(maps.q);
  tma_prefetch_map(maps.k);
  tma_prefetch_map(maps.v);
}

// The CTA's shared memory at its 1 KiB-aligned base: the K/V ring, the mbarriers (laid out
// as in init_barriers) and the two plans (slot x = item parity). The members are references
// to fwd()'s locals, as the lambdas it replaces captured them: a struct of values changed
// every sm_90a cubin (other address arithmetic reached ptxas).
template <int D, int PLAN_INTS>
struct Smem {
  unsigned char* const& smem;  // generic pointer of the base
  const unsigned& base;        // shared-window addresses: the base, the K and V rings
  const unsigned& sK;
  const unsigned& sV;
  const unsigned& bars;        // the mbarriers
  CMC_DEV unsigned bar_qfull(int x) const { return bars + 8 * x; }
  CMC_DEV unsigned bar_plan(int x) const { return bars + 8 * (2 + x); }
  CMC_DEV unsigned bar_slot(int x) const { return bars + 8 * (4 + x); }
  CMC_DEV unsigned bar_kfull(int s) const { return bars + 8 * (6 + s); }
  CMC_DEV unsigned bar_kempty(int s) const { return bars + 8 * (6 + Cfg<D>::kStages + s); }
  CMC_DEV unsigned bar_vfull(int s) const { return bars + 8 * (6 + 2 * Cfg<D>::kStages + s); }
  CMC_DEV unsigned bar_vempty(int s) const { return bars + 8 * (6 + 3 * Cfg<D>::kStages + s); }
  CMC_DEV int* plan_of(int x) const {
    return reinterpret_cast<int*>(smem + Cfg<D>::kPlan) + x * PLAN_INTS;
  }
};

// The plan builders (producer threads 32 .. 127): they pick the items (Sched::next), up to
// two ahead of the loader (the slots), build each one's plan and publish the item in its
// plan's header (qt -1: no more items).
template <class H, class SM, class Geo>
CMC_DEV void run_builders(const typename H::desc_t& desc, Sched& sc, const int& units,
                          const SM& sm, const Geo& geo, const int& ptid CMC_PROBE_PARAMS) {
  constexpr bool kPatch = H::kTiling == 1;
  constexpr int kPlanInts = plan_ints<H::kTerms, H::kTiling>();
  int n = 0;
  int u = blockIdx.x, half = 0;
  int held = desc.sched != 0 && ptid == 32 ? Sched::fetch(desc.sched) : 0;
  for (;;) {
    const int x = n & 1;
    const unsigned use = (unsigned)(n >> 1) & 1u;
    ++n;
    int* plan = sm.plan_of(x);
    int* item = plan + kPlanInts - kItemInts;
    CMC_PROBE(6, mbar_wait(sm.bar_slot(x), use ^ 1u));  // consumers done with its last item
    CMC_PROBE_MARK(pr_build_);
    Item it;
    if constexpr (kPatch) {
      // h and b set on every path: Sched::tile's -1 path leaves them as they were, and
      // ptxas, not seeing that qt >= 0 implies tile set them, held the last item's h and b
      // across the build (clear D 128 spilled n; kernel notes, "Spills as built")
      it.h = 0;
      it.b = 0;
    }
    int qa = 0, qb = 0;
    bool found = false, fresh = false;  // fresh: item[3] was written by next() (patch)
    typename H::seq_t seq;
    cmc_patch_geo g;
    while (!found) {
      if (half == 2) {
        u = sc.next(desc.sched, u, item + 3, ptid == 32, held, units);
        half = 0;
        fresh = desc.sched != 0;
      }
      if (u >= units) break;
      it.qt = sc.tile<H::kHeavyTiles>(u, half++, it.h, it.b);
      if (it.qt < 0) continue;
      seq = H::seq(desc, it.b);
      g = geo(seq.len);
      found = tile_rows<kPatch, partial_linear_tile<H>()>(g, seq.len, it.qt, qa, qb);
    }
    if (!found) {
      if (ptid == 32) {
        item[0] = -1;
        sc.finish(desc.sched);
      }
      mbar_arrive(sm.bar_plan(x));
      break;
    }
    if (n == 1) CMC_PROBE_ADD(13, pr_build_ - pr_t0_);  // launch to the first build
    // the consumers help with the first plan when it is of the CTA's first unit
    // (first_item: fetched units are >= gridDim.x)
    // patch plans: the item header first (the consumers read it only after bar_plan), so
    // that h and b are not held across the build
    if (kPatch && ptid == 32) {
      item[0] = it.qt;
      item[1] = it.h;
      item[2] = it.b;
    }
    // patch plans: little of the loop is held in registers across the build (at D 128
    // ptxas spilled it; kernel notes, "Patch plan spills: the builders' loop state"). The lead builder parks
    // u in this slot's unit word (rewritten two items on, after every builder has passed
    // the next build's barriers); every builder reads it back after this build's last
    // barrier. The lead's reservation `held` stays in a register: parking it in the other
    // slot's word raced with builders still reading u from there (no builder barrier
    // separates that read from the next item's start unless next() ran). The slot, the
    // builder index and the plan's address are recomputed from opaque copies, so that
    // ptxas cannot hoist what it derives from them (the plan's generic address, the 64-bit
    // index of btid) out of the loop.
    int xa = x;
    if constexpr (kPatch) {
      const int nb = n == 1 && u == (int)blockIdx.x ? kHelpers : kBuilders;
      if (ptid == 32) {
        // after a next() of this item the word is u already, and builders may still read it
        if (!fresh) item[3] = u;
      }
      const int bt = opaque(ptid - 32);
      int* const pp = reinterpret_cast<int*>(
          shared_generic(sm.base + (unsigned)(reinterpret_cast<unsigned char*>(
                                                  sm.plan_of(opaque(x))) - sm.smem)));
      build_plan_patch<H>(seq, g, it.qt, pp, bt, nb);
      xa = (opaque(n) - 1) & 1;
      const int* const words = sm.plan_of(0) + kPlanInts - 1;  // slot 1's: + kPlanInts
      u = *reinterpret_cast<const volatile int*>(words + xa * kPlanInts);
    } else {
      build_plan<H>(seq, qa, qb, plan, ptid - 32);
    }
    if (!kPatch && ptid == 32) {
      item[0] = it.qt;
      item[1] = it.h;
      item[2] = it.b;
    }
    CMC_PROBE_SINCE(7, pr_build_);
    if (n == 1) CMC_PROBE_SINCE(12, pr_build_);  // the first build
    CMC_PROBE_COUNT(8);
    mbar_arrive(sm.bar_plan(xa));
  }
}

// The loader warp (producer threads 0 .. 31): for each item, in plan order, the Q tile into
// its slot and the K / V tiles of its walk into the ring; lane 0 waits and arms the barriers,
// the lanes issue the copies.
template <class H, int D, class SM, class Geo>
CMC_DEV void run_loader(const typename H::desc_t& desc, const TensorMaps& maps, const SM& sm,
                        const Geo& geo, const int& hpk, const int& lane CMC_PROBE_PARAMS) {
  typedef Cfg<D> C;
  constexpr int NT = H::kTerms;
  constexpr int S = C::kStages;
  constexpr bool kPatch = H::kTiling == 1;
  constexpr int kPlanInts = plan_ints<NT, H::kTiling>();
  typedef typename Pick<kPatch, BitWalk, Walk>::type WalkT;
  int stage = 0, n = 0;
  unsigned phase = 0;
  for (;;) {
    const int x = n & 1;
    const unsigned use = (unsigned)(n >> 1) & 1u;
    ++n;
    const int* plan = sm.plan_of(x);
    CMC_PROBE(0, mbar_wait(sm.bar_plan(x), use));  // the plan, so the slot, is ready
    Item it;
    if (!read_item(plan + kPlanInts - kItemInts, it)) break;
    CMC_PROBE_COUNT(10);
    const typename H::seq_t seq = H::seq(desc, it.b);
    const cmc_patch_geo g = geo(seq.len);
    // token coordinates are int32 (the runtime checks T < 2^31); rows past the sequence
    // belong to the next one (masked: k < len everywhere) or read as zero past T
    const int tok0 = (int)seq.tok0;
    const int hkv = it.h / hpk;
    // a tile of the tiling: one 128-row box per column block, or the patch's boxes
    // (the expect_tx comes before any copy can complete: __syncwarp between them)
    auto load = [&](unsigned dst, const TensorMap& map, unsigned bar, unsigned bytes, int h,
                    int t) {
      if (lane == 0) mbar_expect_tx(bar, bytes);
      __syncwarp();
      if constexpr (kPatch) tma_tile_boxes<D>(dst, map, bar, h, tok0, g, t, lane);
      else tma_tile<D>(dst, map, bar, h, tok0 + t * kBM, lane);
    };
    load(sm.base + C::kQ + x * C::kQBytes, maps.q, sm.bar_qfull(x), C::kQBytes, it.h, it.qt);
    WalkT wk;
    start_walk<NT>(wk, plan, g);
    while (wk.j >= 0) {
      CMC_PROBE(2, mbar_wait(sm.bar_kempty(stage), phase ^ 1));
      CMC_PROBE(4, load(sm.sK + stage * C::kTile, maps.k, sm.bar_kfull(stage), C::kTile, hkv, wk.j));
      CMC_PROBE(3, mbar_wait(sm.bar_vempty(stage), phase ^ 1));
      CMC_PROBE(4, load(sm.sV + stage * C::kTile, maps.v, sm.bar_vfull(stage), C::kTile, hkv, wk.j));
      CMC_PROBE_COUNT(9);
      CMC_PROBE(5, wk.next());
      if (++stage == S) { stage = 0; phase ^= 1; }
    }
  }
}

// Mask (partial tiles only) + online softmax of S in place (S becomes P in fp32);
// returns the rescale factors of the running O and l.
// The consumers' per-tile parts are closures written out: structs of references to fwd()'s
// locals, members in the order the lambdas they replace captured them, built where the
// lambdas were (functions taking the same references as parameters reordered the PTX and
// changed every sm_90a cubin).
template <class H, class ApplyBits, class MaskLinear, class MaskPatch>
struct Softmax {
  const unsigned* const& fullbits;
  int& f;
  const int& nfull;
  const int* const& full;
  const bool& mw_ok;
  const ApplyBits& apply_bits;
  const cmc_uint2& mw;
  const cmc_patch_geo& g;
  const MaskPatch& mask_patch;
  const MaskLinear& mask_linear;
  float (&s)[64];
  float& m0;
  float& m1;
  const float& sl2;
  bool& grow;
  float& l0;
  float& l1;
  CMC_PROBE_MEMBERS
  CMC_DEV void operator()(int j, float& c0, float& c1) const {
    constexpr bool kPatch = H::kTiling == 1;
    constexpr bool kLazy = kPatch;  // as in fwd()
    bool is_full;
    if constexpr (kPatch) {
      is_full = (fullbits[j >> 5] >> (j & 31)) & 1u;
    } else {
      while (f < nfull && full[2 * f + 1] <= j) ++f;
      is_full = f < nfull && full[2 * f] <= j;
    }
    CMC_PROBE_MARK(pr_mask_);
    if (!is_full) {
      if constexpr (kPatch) {
        if (mw_ok) apply_bits(mw.x, mw.y);
        else if (j >= g.nlin) mask_patch(j);
        else mask_linear(j * kBN);
      } else if constexpr (H::kOffsetMasks != 0 && H::kOffsetBand != 0) {
        if (mw_ok) apply_bits(mw.x, mw.y);  // a band pair (fetch_mask)
        else mask_linear(j * kBN);
      } else if constexpr (H::kOffsetMasks != 0) {
        apply_bits(mw.x, mw.y);  // the tile mask of its offset, cut at len (fetch_mask)
      } else {
        mask_linear(j * kBN);
      }
    }
    CMC_PROBE_SINCE(13, pr_mask_);
    // row maxima as 4 independent chains: the exponentials wait on this reduction
    float a0[4], a1[4];
#pragma unroll
    for (int n2 = 0; n2 < 16; ++n2) {
      const float v0 = fmaxf(s[4 * n2], s[4 * n2 + 1]);
      const float v1 = fmaxf(s[4 * n2 + 2], s[4 * n2 + 3]);
      a0[n2 & 3] = n2 < 4 ? v0 : fmaxf(a0[n2 & 3], v0);
      a1[n2 & 3] = n2 < 4 ? v1 : fmaxf(a1[n2 & 3], v1);
    }
    float mx0 = fmaxf(fmaxf(fmaxf(a0[0], a0[1]), fmaxf(a0[2], a0[3])), m0);
    float mx1 = fmaxf(fmaxf(fmaxf(a1[0], a1[1]), fmaxf(a1[2], a1[3])), m1);
    mx0 = quad_max(mx0);
    mx1 = quad_max(mx1);
    // kLazy: the offsets (and O) stay while no row of the warp has a max more than
    // 2^kLazyLog2 above its offset; P <= 2^kLazyLog2 then, exact in the end (O / l and
    // the LSE use the same offset). A row still at -inf grows by +inf.
    constexpr float kLazyLog2 = 8.f;
    if constexpr (kLazy)
      grow = __any_sync(0xffffffffu, (mx0 - m0) * sl2 > kLazyLog2 || (mx1 - m1) * sl2 > kLazyLog2);
    const float mn0 = grow ? mx0 : m0, mn1 = grow ? mx1 : m1;
    // a row whose max is still -inf uses 0 as its offset: never (-inf) - (-inf)
    const float ms0 = mn0 == neg_inf() ? 0.f : mn0 * sl2;
    const float ms1 = mn1 == neg_inf() ? 0.f : mn1 * sl2;
    c0 = grow ? ex2(m0 * sl2 - ms0) : 1.f;
    c1 = grow ? ex2(m1 * sl2 - ms1) : 1.f;
    m0 = mn0;
    m1 = mn1;
    float ps0[2] = {0.f, 0.f}, ps1[2] = {0.f, 0.f};
#pragma unroll
    for (int n2 = 0; n2 < 16; ++n2) {
      s[4 * n2 + 0] = ex2(fmaf(s[4 * n2 + 0], sl2, -ms0));
      s[4 * n2 + 1] = ex2(fmaf(s[4 * n2 + 1], sl2, -ms0));
      s[4 * n2 + 2] = ex2(fmaf(s[4 * n2 + 2], sl2, -ms1));
      s[4 * n2 + 3] = ex2(fmaf(s[4 * n2 + 3], sl2, -ms1));
      ps0[n2 & 1] += s[4 * n2 + 0] + s[4 * n2 + 1];
      ps1[n2 & 1] += s[4 * n2 + 2] + s[4 * n2 + 3];
    }
    l0 = l0 * c0 + (ps0[0] + ps0[1]);
    l1 = l1 * c1 + (ps1[0] + ps1[1]);
  }
};

// A key tile of 128 consecutive keys from k0: OR the exact spans of the terms touching
// it (touched ranges of the plan) into column bits, or evaluate visible() per element
// when one of them has a residual.
template <class H, class ApplyBits>
struct MaskLinear {
  const int* const& plan;
  const typename H::seq_t& seq;
  const typename H::row_t& rc0;
  const int& off;
  const typename H::row_t& rc1;
  const int& len;
  const ApplyBits& apply_bits;
  float (&s)[64];
  CMC_DEV void operator()(int k0) const {
    constexpr bool kPatch = H::kTiling == 1;
    constexpr int NT = H::kTerms;
    unsigned bits0 = 0u, bits1 = 0u;
    bool exact = true;
    auto add_term = [&](int i) {
      if (plan[4 * i] < k0 + kBN && plan[4 * i + 1] > k0) {
        int lo, hi;
        exact = H::span(seq, rc0, i, lo, hi) && exact;
        bits0 |= cmc_colmask32(lo - k0, hi - k0, off);
        H::span(seq, rc1, i, lo, hi);
        bits1 |= cmc_colmask32(lo - k0, hi - k0, off);
      }
    };
    if constexpr (kPatch || H::kGridFamilies > 0) {
      // the grid families give one span per key grid row the tile meets (a grid row
      // per tile when the grid width is 128 and the origin tile-aligned), instead of
      // one per instance; the other terms as below. A linear tiling has grid families
      // when the emitter found fewer grid rows than instances (emit._linear_span_grid).
      const int k1 = (k0 + kBN < len ? k0 + kBN : len) - 1 - H::kSpanGridOrigin;
      if (k1 >= 0) {
        const int ky0 = k0 > H::kSpanGridOrigin ? (k0 - H::kSpanGridOrigin) / H::kSpanGridWidth : 0;
        for (int ky = ky0; ky <= k1 / H::kSpanGridWidth; ++ky) {
#pragma unroll
          for (int fm = 0; fm < H::kGridFamilies; ++fm) {
            int lo, hi;
            H::grid_span(seq, rc0, fm, ky, lo, hi);
            bits0 |= cmc_colmask32(lo - k0, hi - k0, off);
            H::grid_span(seq, rc1, fm, ky, lo, hi);
            bits1 |= cmc_colmask32(lo - k0, hi - k0, off);
          }
        }
      }
#pragma unroll
      for (int n3 = 0; n3 < H::kOtherTerms; ++n3) add_term(H::other_term(n3));
    } else {
      // unrolled by 4: the touched-range loads of 4 terms are in flight together
#pragma unroll 4
      for (int i = 0; i < NT; ++i) add_term(i);
    }
    // keys from klim on are not this tile's: len, or in the last linear tile of a sequence
    // with patches the grid origin (below kPatchMinLen the origin is len)
    int klim = len;
    if constexpr (partial_linear_tile<H>()) {
      if (len >= H::kPatchMinLen && H::kGridOrigin < len) klim = H::kGridOrigin;
      if (k0 + kBN > klim) {
        const unsigned own = cmc_colmask32(0, klim - k0, off);
        bits0 &= own;
        bits1 &= own;
      }
    }
    if (exact) {
      apply_bits(bits0, bits1);
    } else {
      const int kbase = k0 + off;
#pragma unroll
      for (int n2 = 0; n2 < 16; ++n2) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int k = kbase + n2 * 8 + e;
          const bool in = k < klim;
          if (!(in && H::visible(seq, rc0, k))) s[4 * n2 + e] = neg_inf();
          if (!(in && H::visible(seq, rc1, k))) s[4 * n2 + 2 + e] = neg_inf();
        }
      }
    }
  }
};

// A patch key tile (patch tilings are exact): box b holds keys [kb + b W, + PW), the
// columns b PW ..; each grid family gives the one span of each box's grid row, the
// other terms their spans cut to each box.
template <class H, class ApplyBits>
struct MaskPatch {
  const cmc_patch_geo& g;
  const int& off;
  const typename H::seq_t& seq;
  const typename H::row_t& rc0;
  const typename H::row_t& rc1;
  const int* const& plan;
  const ApplyBits& apply_bits;
  CMC_DEV void operator()(int j) const {
    constexpr int kPH = H::kPatchRows, kPW = H::kPatchCols;
    const int u = j - g.nlin, py = u / g.ngx;
    const int kb = g.O + py * kPH * H::kGridWidth + (u - py * g.ngx) * kPW;
    const int khi = kb + (kPH - 1) * H::kGridWidth + kPW;
    unsigned bits0 = 0u, bits1 = 0u;
    auto add = [&](unsigned& bits, int b, int lo, int hi) {
      const int ks = kb + b * H::kGridWidth;
      const int a = lo - ks > 0 ? lo - ks : 0, e = hi - ks < kPW ? hi - ks : kPW;
      if (a < e) bits |= cmc_colmask32(a + b * kPW, e + b * kPW, off);
    };
#pragma unroll
    for (int b = 0; b < kPH; ++b) {
#pragma unroll
      for (int f = 0; f < H::kGridFamilies; ++f) {
        int lo, hi;
        H::grid_span(seq, rc0, f, py * kPH + b, lo, hi);
        add(bits0, b, lo, hi);
        H::grid_span(seq, rc1, f, py * kPH + b, lo, hi);
        add(bits1, b, lo, hi);
      }
    }
#pragma unroll
    for (int n3 = 0; n3 < H::kOtherTerms; ++n3) {
      const int i = H::other_term(n3);
      if (plan[4 * i] < khi && plan[4 * i + 1] > kb) {
        int lo0, hi0, lo1, hi1;
        H::span(seq, rc0, i, lo0, hi0);
        H::span(seq, rc1, i, lo1, hi1);
#pragma unroll
        for (int b = 0; b < kPH; ++b) {
          add(bits0, b, lo0, hi0);
          add(bits1, b, lo1, hi1);
        }
      }
    }
    apply_bits(bits0, bits1);
  }
};

template <class H, bool BF16, int D>
CMC_DEV void fwd(const typename H::desc_t& desc, const TensorMaps& maps) {
  static_assert(D == 64 || D == 128, "head dim");
  static_assert(kBM == 128 && kBN == 128, "a tile is one 128-token box per column block");
  typedef Cfg<D> C;
  constexpr int NT = H::kTerms;
  constexpr int S = C::kStages;
  constexpr bool kPatch = H::kTiling == 1;
  constexpr bool kQr = kPatch;  // QK with Q from registers (issue_qk)
  // FA4's lazy rescale of O (softmax): patch tilings only, where it measured +1.2 % (every
  // tile masked, a longer softmax); the linear ones measured -0.5 % (kernel notes, stage 11)
  constexpr bool kLazy = kPatch;
  constexpr int kPH = H::kPatchRows, kPW = H::kPatchCols;
  static_assert(!kPatch || (kPH * kPW == kBM && kPW >= 8 && H::kGridOrigin >= 0 &&
                            H::kGridWidth % kPW == 0), "patch shape");
  constexpr int kPlanInts = plan_ints<NT, H::kTiling>();
  typedef typename Pick<kPatch, BitWalk, Walk>::type WalkT;
  extern __shared__ __align__(1024) unsigned char cmc_smem_raw[];

  const int tid = threadIdx.x;
  const int heads = desc.heads_q, batch = desc.batch;
  // below kPatchMinLen a sequence is linear tiles only (its grid "begins" at its end)
  auto geo = [](int n) {
    return cmc_patch_geo_of(n, n < H::kPatchMinLen ? n : H::kGridOrigin, H::kGridWidth, kPH,
                            kPW);
  };
  const int hpk = heads / desc.heads_kv;
  Sched sc;
  sc.init(kPatch ? geo(desc.max_len).nqt : (desc.max_len + kBM - 1) / kBM, heads, batch, hpk,
          desc.max_len, D, desc.sched != 0 && H::kTileUnits != 0);
  const int units = sc.units(batch);
  // the CTA's first item, as the builders will pick it, if it is of its first unit
  auto first_item = [&](Item& f) {
    const int u = blockIdx.x;
    for (int half = 0; half < 2 && u < units; ++half) {
      f.qt = sc.tile<H::kHeavyTiles>(u, half, f.h, f.b);
      if (f.qt < 0) continue;
      const typename H::seq_t fs = H::seq(desc, f.b);
      int fa, fb;
      if (tile_rows<kPatch, partial_linear_tile<H>()>(geo(fs.len), fs.len, f.qt, fa, fb)) return true;
    }
    return false;
  };

  // 1 KiB-aligned base (shared-window addresses; the generic pointer moves by the same amount).
  const unsigned raw = smem_u32(cmc_smem_raw);
  const unsigned pad = ((raw + 1023u) & ~1023u) - raw;
  unsigned char* smem = cmc_smem_raw + pad;
  const unsigned base = raw + pad;
  const unsigned sK = base + C::kK, sV = base + C::kV;
  const unsigned bars = base + C::kBar;
  const Smem<D, kPlanInts> sm = {smem, base, sK, sV, bars};

  if (tid == 0) init_barriers<S>(bars, maps);
  __syncthreads();  // publishes the mbarrier inits

  const int wg = __shfl_sync(0xffffffffu, tid >> 7, 0);  // warp-uniform for ptxas (uniform registers)
  if (wg == 0) {
    // ======================================================================= producer
    setmaxnreg_dec<Regs<H::kTiling>::kProducer>();
    const int ptid = tid, lane = tid & 31;
    CMC_PROBE_DECL(0, ptid == 0 || ptid == 32);  // the loader's lane 0, the first builder
    if (ptid >= 32) run_builders<H>(desc, sc, units, sm, geo, ptid CMC_PROBE_ARGS);
    else run_loader<H, D>(desc, maps, sm, geo, hpk, lane CMC_PROBE_ARGS);
    if (ptid < 32) CMC_PROBE_FLUSH();
    else CMC_PROBE_ADD(14, clock64() - pr_t0_);  // the first builder's whole time
  } else {
    // ======================================================================= consumers
    setmaxnreg_inc<Regs<H::kTiling>::kConsumer>();
    const int cw = wg - 1;                  // consumer warpgroup 0 / 1: rows cw*64 ...
    const int ctid = tid & 127;
    const int warp = ctid >> 5, lane = tid & 31;
    const int lrow = cw * 64 + warp * 16 + (lane >> 2);  // this thread's rows: lrow, lrow + 8
    const float sl2 = desc.scale_log2;
    constexpr int kO = D / 2;  // O accumulator floats per thread
    int stage = 0, n = 0;
    unsigned phase = 0;
    auto release = [&](unsigned bar) {
      __syncwarp();
      if (lane == 0) mbar_arrive(bar);
    };
    CMC_PROBE_DECL(1 + cw, ctid == 0);
    CMC_PROBE_COUNT(15);  // CTAs (a probe row sums several when the grid is not persistent)
    if (cw == 1) turn_pass(cw);  // warpgroup 0 issues first

    // the next item: its slot x, the slot's use parity, and the item from its plan's header
    // (the loop is rotated so that its only exit is the loop test: a break after the wait
    // costs ptxas hundreds of spills in the steady loop)
    int x = 0;
    unsigned use = 0;
    Item it;
    auto take = [&]() {
      x = n & 1;
      use = (unsigned)(n >> 1) & 1u;
      ++n;
      CMC_PROBE_COUNT(10);
      CMC_PROBE_MARK(pr_plan_);
      mbar_wait(sm.bar_plan(x), use);
      CMC_PROBE_SINCE(0, pr_plan_);
      if (n == 1) CMC_PROBE_SINCE(12, pr_plan_);  // the first item's plan (cold start)
      read_item(sm.plan_of(x) + kPlanInts - kItemInts, it);
    };
    if constexpr (kPatch) {  // the CTA's first plan: help the builders (see builders_bar)
      Item f;
      if (first_item(f)) {
        const typename H::seq_t fs = H::seq(desc, f.b);
        const cmc_patch_geo fg = geo(fs.len);
        build_plan_patch<H>(fs, fg, f.qt, sm.plan_of(0), kBuilders + cw * 128 + ctid, kHelpers);
      }
    }
    for (take(); it.qt >= 0; take()) {
      const int* plan = sm.plan_of(x);
      const typename H::seq_t seq = H::seq(desc, it.b);
      const int len = seq.len;
      const cmc_patch_geo g = geo(len);
      int qa, qb;
      tile_rows<kPatch, partial_linear_tile<H>()>(g, len, it.qt, qa, qb);
      const cmc_i64 tok0 = seq.tok0;
      // rows from here on are not this tile's: len, or the grid origin in a partial linear tile
      const int rlim = partial_linear_tile<H>() ? cmc_patch_lim(g, it.qt, len) : len;
      // sequence position of local row lr (0 .. 127) of this query tile
      auto qpos = [&](int lr) {
        if constexpr (kPatch) return cmc_patch_box(g, it.qt, lr / kPW) + lr % kPW;
        else return qa + lr;
      };
      const int row0 = qpos(lrow), row1 = qpos(lrow + 8);
      const typename H::row_t rc0 = H::row(seq, row0);
      const typename H::row_t rc1 = H::row(seq, row1);
      const unsigned sQx = base + C::kQ + x * C::kQBytes;
      unsigned char* gQx = smem + C::kQ + x * C::kQBytes;

      const int* full = plan + 6 * NT;  // linear: full runs
      const int nfull = kPatch ? 0 : plan[8 * NT + 1];
      const unsigned* fullbits = reinterpret_cast<const unsigned*>(plan + 4 * NT) + kMaxKeyWords;
      WalkT wk;
      start_walk<NT>(wk, plan, g);

      float o[kO];
#pragma unroll
      for (int i = 0; i < kO; ++i) o[i] = 0.f;
      float m0 = neg_inf(), m1 = neg_inf(), l0 = 0.f, l1 = 0.f;
      CMC_PROBE(1, mbar_wait(sm.bar_qfull(x), use));  // also before the epilogue reuses the Q slot

      if (wk.j >= 0) {
        float s[64];
        unsigned p[32];
        const unsigned sq = sQx + cw * 64 * 128;
        unsigned qf[kQr ? D / 4 : 1];
        if constexpr (kQr) load_q<D>(qf, sq, warp, lane);

        // Mask (partial tiles only) + online softmax of S in place (S becomes P in fp32);
        // returns the rescale factors of the running O and l.
        // Bit e 16 + n2 of bits0 / bits1 keeps s[4 n2 + e] / s[4 n2 + 2 + e]. One word's bits in
        // ascending order, so that ptxas moves 7 of them into predicates per R2P instead of one
        // LOP3 per bit (in the other order, or with the words interleaved, it does not).
        auto apply_bits = [&](unsigned bits0, unsigned bits1) {
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const unsigned bits = h ? bits1 : bits0;
#pragma unroll
            for (int b = 0; b < 32; ++b)
              if (!(bits & (1u << b))) s[4 * (b & 15) + 2 * h + (b >> 4)] = neg_inf();
          }
        };
        const int off = 2 * (lane & 3);
        // the masks of a linear key tile from k0 and of a patch key tile j (closures, see Softmax)
        const MaskLinear<H, decltype(apply_bits)> mask_linear = {plan, seq, rc0, off, rc1, len,
                                                                 apply_bits, s};
        const MaskPatch<H, decltype(apply_bits)> mask_patch = {g, off, seq, rc0, rc1, plan, apply_bits};
        // The per-offset tile mask of key tile j when the tile stage proved one
        // (H::kPatchMasks, or H::kOffsetMasks for linear tiles): fetched as the walk reaches
        // j, so that the load runs under j's QK GEMM; mw_ok: the softmax of j applies it
        // instead of the spans (linear offset masks: always, instead of the predicate).
        cmc_uint2 mw = {0u, 0u};
        bool mw_ok = false;
        auto offset_mask = [&](int j) {
          return cmc_offset_tile_mask(H::offset_masks(), H::kMaskTileLo, H::kMaskTileN,
                                      H::kMaskPhases, H::kMaskTileBelow, H::kMaskTileAbove,
                                      it.qt, j, cw * 128 + ctid, len, off);
        };
        // proved for a band of query tiles only (H::kOffsetBand): the others keep the spans
        auto band_mask = [&](int j) {
          mw_ok = cmc_offset_band(it.qt, j, len, H::kBandTileTop, H::kBandTilesBelow,
                                  H::kBandMaxLen, H::kBandKeyTileLo);
          if (mw_ok) mw = offset_mask(j);
        };
        auto fetch_mask = [&](int j) {
          if constexpr (kPatch && H::kOffsetMasks != 0) {
            // below the patches' start length every tile is linear: the band masks of the
            // linear tiling (cmc/tiling.py choose_tiling)
            if (len < H::kPatchMinLen) {
              band_mask(j);
              return;
            }
          }
          if constexpr (kPatch && H::kPatchMasks != 0) {
            mw_ok = cmc_patch_tile_mask<H>(g, it.qt, j, len, cw * 128 + ctid, off, mw);
          } else if constexpr (kPatch && H::kOffsetMasks != 0) {
            mw_ok = false;  // a longer sequence's item after a shorter one's
          } else if constexpr (!kPatch && H::kOffsetMasks != 0 && H::kOffsetBand != 0) {
            band_mask(j);
          } else if constexpr (!kPatch && H::kOffsetMasks != 0) {
            mw = offset_mask(j);  // a linear tile pair's mask depends only on j - qt
          }
          (void)j;
        };
        int f = 0;
        bool grow = true;  // the last softmax moved the offsets: O owes the rescale c0, c1

        // mask + online softmax of key tile j (a closure, see Softmax)
        const Softmax<H, decltype(apply_bits), decltype(mask_linear), decltype(mask_patch)> softmax = {
            fullbits, f, nfull, full, mw_ok, apply_bits, mw, g, mask_patch, mask_linear, s, m0, m1,
            sl2, grow, l0, l1 CMC_PROBE_ARGS};
        auto rescale_o = [&](float c0, float c1) {
#pragma unroll
          for (int d = 0; d < kO / 4; ++d) {
            o[4 * d + 0] *= c0; o[4 * d + 1] *= c0;
            o[4 * d + 2] *= c1; o[4 * d + 3] *= c1;
          }
        };
        // P as the A operand: k-step kk (keys 16kk ..) = accumulator fragments 2kk, 2kk + 1.
        auto repack = [&]() {
#pragma unroll
          for (int n2 = 0; n2 < 16; ++n2) {
            p[2 * n2 + 0] = pack2<BF16>(s[4 * n2 + 0], s[4 * n2 + 1]);
            p[2 * n2 + 1] = pack2<BF16>(s[4 * n2 + 2], s[4 * n2 + 3]);
          }
        };

        fetch_mask(wk.j);
        CMC_PROBE(2, mbar_wait(sm.bar_kfull(stage), phase));
        CMC_PROBE(4, turn_wait(cw));
        wg_fence();
        issue_qk<BF16, D, kQr>(s, sq, qf, sK + stage * C::kTile);
        wg_commit();
        turn_pass(cw);
        CMC_PROBE(5, wg_wait<0>());
        fence_regs<64>(s);
        release(sm.bar_kempty(stage));
        // c0, c1: the rescale of O owed to the last softmax, applied after the PV wait
        // (FA4's place: out of the turn window); O is still zero for the first softmax.
        float c0, c1;
        softmax(wk.j, c0, c1);
        repack();
        CMC_PROBE_COUNT(9);
        for (;;) {
          wk.next();
          if (wk.j < 0) break;
          CMC_PROBE_COUNT(9);
          CMC_PROBE(14, fetch_mask(wk.j));
          const int ns = stage + 1 == S ? 0 : stage + 1;
          const unsigned nph = stage + 1 == S ? phase ^ 1 : phase;
          CMC_PROBE(2, mbar_wait(sm.bar_kfull(ns), nph));      // K(next)
          CMC_PROBE(3, mbar_wait(sm.bar_vfull(stage), phase));  // V(cur)
          CMC_PROBE(4, turn_wait(cw));
          wg_fence();
          fence_regs<kO>(o);
          fence_regs<32>(p);
          issue_qk<BF16, D, kQr>(s, sq, qf, sK + ns * C::kTile);
          wg_commit();
          issue_pv<BF16, D>(o, p, sV + stage * C::kTile);
          wg_commit();
          turn_pass(cw);
          CMC_PROBE(5, wg_wait<1>());
          fence_regs<64>(s);
          release(sm.bar_kempty(ns));
          CMC_PROBE(8, softmax(wk.j, c0, c1));
          fence_regs<64>(s);
          CMC_PROBE(6, wg_wait<0>());
          fence_regs<kO>(o);
          fence_regs<32>(p);
          release(sm.bar_vempty(stage));
          repack();
          if (grow) rescale_o(c0, c1);  // FA4's place: after the PV wait, out of the turn window
          stage = ns;
          phase = nph;
        }
        CMC_PROBE(3, mbar_wait(sm.bar_vfull(stage), phase));
        CMC_PROBE(4, turn_wait(cw));
        wg_fence();
        fence_regs<kO>(o);
        fence_regs<32>(p);
        issue_pv<BF16, D>(o, p, sV + stage * C::kTile);
        wg_commit();
        turn_pass(cw);
        CMC_PROBE(6, wg_wait<0>());
        fence_regs<kO>(o);
        release(sm.bar_vempty(stage));
        if (++stage == S) { stage = 0; phase ^= 1; }
      }
      CMC_PROBE_MARK(pr_epi_);

      // Epilogue: row sums across the quad, normalise, LSE, O through this warpgroup's own
      // Q rows of the slot (all its wgmma reads of Q are complete) for 16-byte stores.
      l0 = quad_sum(l0);
      l1 = quad_sum(l1);
      auto rcp = [](float v) { float r; asm("rcp.approx.ftz.f32 %0, %1;\n" : "=f"(r) : "f"(v)); return r; };
      const float inv0 = l0 > 0.f ? rcp(l0) : 0.f;
      const float inv1 = l1 > 0.f ? rcp(l1) : 0.f;
      if (desc.lse != 0 && (lane & 3) == 0) {
        float* lse = reinterpret_cast<float*>(desc.lse) + (cmc_i64)it.h * desc.lse_stride_head + tok0;
        constexpr float kLn2 = 0.6931471805599453f;
        if (row0 < rlim) lse[row0] = l0 > 0.f ? (m0 * sl2 + lg2(l0)) * kLn2 : neg_inf();
        if (row1 < rlim) lse[row1] = l1 > 0.f ? (m1 * sl2 + lg2(l1)) * kLn2 : neg_inf();
      }
      wg_bar_sync(cw);  // every warp of this WG is past its last wgmma
      // patch tilings: the row is opaque here, so that ptxas computes the 32 staging
      // addresses in the epilogue instead of hoisting them out of the item loop and
      // spilling them across it (natten_clamped D 128: 144 bytes; kernel notes,
      // "Patch plan spills")
      int erow = lrow;
      if constexpr (kPatch) asm volatile("mov.b32 %0, %1;\n" : "=r"(erow) : "r"(lrow));
#pragma unroll
      for (int d = 0; d < kO / 4; ++d) {  // fragment d: columns 8d + 2 (lane & 3) ..
        const unsigned w0 = pack2<BF16>(o[4 * d + 0] * inv0, o[4 * d + 1] * inv0);
        const unsigned w1 = pack2<BF16>(o[4 * d + 2] * inv1, o[4 * d + 3] * inv1);
        const unsigned off = (unsigned)((lane & 3) * 4);
        *reinterpret_cast<unsigned*>(gQx + swz<kBM>(erow, d) + off) = w0;
        *reinterpret_cast<unsigned*>(gQx + swz<kBM>(erow + 8, d) + off) = w1;
      }
      wg_bar_sync(cw);
      unsigned short* og = reinterpret_cast<unsigned short*>(desc.o) + tok0 * desc.o_stride_tok +
                           (cmc_i64)it.h * desc.o_stride_head;
      // The rows go to registers, the slot is released, then the global stores: the fence
      // before the release (MEMBAR.ALL.CTA) would otherwise wait for the stores to reach L2.
      constexpr int kChunks = D / 8, kPer = 64 * kChunks / 128;
      uint4 ov[kPer];
      int orow[kPer];
#pragma unroll
      for (int i = 0; i < kPer; ++i) {
        const int c = ctid + 128 * i;
        const int rr = cw * 64 + c / kChunks;
        orow[i] = qpos(rr);
        ov[i] = *reinterpret_cast<const uint4*>(gQx + swz<kBM>(rr, c % kChunks));
      }
      // generic accesses of the Q / O slot before the next TMA (async proxy) write into it
      fence_proxy_async();
      release(sm.bar_slot(x));  // this warp's reads of the slot (plan, Q / O staging) are done
#pragma unroll
      for (int i = 0; i < kPer; ++i) {
        const int ch = (ctid + 128 * i) % kChunks;
        if (orow[i] < rlim) st_global_v4(og + (cmc_i64)orow[i] * desc.o_stride_tok + ch * 8, ov[i]);
      }
      CMC_PROBE_SINCE(7, pr_epi_);
    }
    CMC_PROBE_FLUSH();
  }
}

}  // namespace cmc_sm90
#endif  // !CMC_HOST
