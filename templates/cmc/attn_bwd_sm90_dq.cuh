// ===========================================================================================
// cmc sm_90a backward attention: the deterministic dQ kernel (wgmma), Hopper only.
// Hand-written. Placed after templates/cmc/attn_bwd_sm90.cuh (whose swizzle, descriptors,
// wgmma wrappers, tile loads and accumulator store it reuses) in the backward .cu. Same ABI and
// semantics as cmc_bwd::dq (docs/architecture.md, "The backward"), with its own query tile: grid
// (ceil(max_len / kDqRows), heads_q, batch; with a patch tiling see dq_patch below), block
// DqCfg<D>::kThreads, dynamic shared memory
// smem_dq<D, NT>() (opt-in above 48 KiB). Kind bwd_dq_sm90, the deterministic sequence's dq
// role (pre, kv, dq).
//
// CTA = kDqRows = 128 query rows x query head x sequence, 2 warpgroups (256 threads),
// warpgroup w owning rows 64 w .. 64 w + 63 (wgmma M = 64). Q, dO [128 x D] are loaded once
// and stay in shared memory; LSE and Dsum of the thread's two rows stay in registers. The key
// tiles (kDqKeys = 64 keys) come from the FORWARD hooks' plan of the CTA's rows, walked in
// order (so dQ is the same sum in the same order every run: deterministic); K, V of tile
// i + 1 arrive by cp.async (all 256 threads, zero-filled past len) into the other half of a
// 2-stage ring while tile i computes; one CTA barrier per tile publishes a stage. Per key
// tile and warpgroup:
//   S  = Q_w K^T     wgmma SS m64n64, A = Q rows (K-major), B = K tile (K-major)
//   dP = dO_w V^T    wgmma SS m64n64 (issued right behind S)
//   P  = exp2(S scale_log2 - LSE log2 e), masked on partial tiles (H::visible, k < len; rows
//        past len have LSE offset +inf); LSE = -inf reads as +inf: P = 0 (cmc_bwd::lse_offset)
//   dS = P (dP - Dsum)
//   dQ += dS K       wgmma RS m64nD, A = dS (the dP accumulator repacked, as the forward
//                    repacks P), B = K tile read MN-major (LBO = next 64-wide column block)
// dQ (times scale = scale_log2 ln 2) goes through shared memory (the Q tile) to 16-byte row
// stores of the dtype straight into args.dq (not the workspace), as cmc_bwd::dq. Rows that see
// nothing: P = 0 everywhere, dQ = 0.
// Shared memory (1 KiB aligned base): Q | dO | K x2 | V x2 | plan; tiles in the 128-byte
// swizzle of cmc_bwd_sm90::swz (Q, dO as [128][D], K, V as [64][D]).
// Registers per thread: dQ D/2 fp32, S 32, dP 32, dS packed 16.
// ===========================================================================================

#if !defined(CMC_HOST)
namespace cmc_bwd_sm90 {

enum : int {
  kDqRows = 128,  // query rows per CTA: 64 per warpgroup (wgmma M)
  kDqKeys = 64    // keys per tile of the forward plan (wgmma N of S, dP; K of dQ += dS K)
};
static_assert(kDqRows == 64 * kWG, "one wgmma M = 64 block of rows per warpgroup");

template <int D> struct DqCfg {
  static_assert(D == 64 || D == 128, "head dim");
  enum : int {
    kThreads = 128 * kWG,
    kTileQ = kDqRows * D * 2,
    kTileK = kDqKeys * D * 2
  };
};
template <int D> struct SmemDQ {
  enum : int {
    kQ = 0,
    kDO = DqCfg<D>::kTileQ,
    kK = 2 * DqCfg<D>::kTileQ,
    kV = kK + 2 * DqCfg<D>::kTileK,
    kPlan = kV + 2 * DqCfg<D>::kTileK
  };
};
// +1024: the kernel aligns its base up to 1 KiB (the swizzle atoms need it).
template <int D, int NT, int TILING = 0> constexpr int smem_dq() {
  return (SmemDQ<D>::kPlan + (TILING == 1 ? cmc_bwd_patch_plan_ints<NT>() : 8 * NT + 2) * 4 + 15) / 16 * 16 +
         1024;
}

// The end of a dq step (dq and dq_patch), once P is in s: dS = P (dP - Dsum) for the thread's
// rows (Dsum ds0, ds1), packed as the A fragments of dQ's k16 steps over the 64 keys; dQ += dS K
// (scaled at the end), waited for before the next tile's barrier lets the ring overwrite this
// K stage (kb).
template <bool BF16, int D>
CMC_DEV void dq_ds_dq(const float* s, float* dp, float ds0, float ds1, float* acc, unsigned kb) {
  wg_wait<0>();  // dP done
  fence_regs<32>(dp);
#pragma unroll
  for (int jj = 0; jj < 8; ++jj) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      dp[4 * jj + e] = s[4 * jj + e] * (dp[4 * jj + e] - ds0);
      dp[4 * jj + 2 + e] = s[4 * jj + 2 + e] * (dp[4 * jj + 2 + e] - ds1);
    }
  }
  unsigned dsa[16];
#pragma unroll
  for (int m = 0; m < 16; ++m) dsa[m] = pack2<BF16>(dp[2 * m], dp[2 * m + 1]);
  wg_fence();
#pragma unroll
  for (int kk = 0; kk < kDqKeys / 16; ++kk)
    rs_nd<BF16, D>(acc, dsa + 4 * kk, gdesc(kb + kk * 2048, kDqKeys * 128, 1024));
  wg_commit();
  wg_wait<0>();
  fence_regs<16>(dsa);
}

template <class H, bool BF16, int D>
CMC_DEV void dq_patch(const typename H::desc_t& desc, const cmc_bwd_args& args);

template <class H, bool BF16, int D>
CMC_DEV void dq(const typename H::desc_t& desc, const cmc_bwd_args& args) {
  if constexpr (H::kTiling == 1) {
    dq_patch<H, BF16, D>(desc, args);
    return;
  }
  // load_tile strides by Cfg<D>::kThreadsKV; store_acc stages rows of a [kBN][D] tile.
  static_assert(DqCfg<D>::kThreads == Cfg<D>::kThreadsKV && kDqRows == kBN, "shared helpers");
  constexpr int NT = H::kTerms;
  constexpr int kAcc = D / 2;  // fp32 accumulator registers of a [64 x D] tile per thread
  extern __shared__ __align__(1024) unsigned char cmc_smem_raw[];
  unsigned char* smem = cmc_smem_raw + ((1024u - (smem_u32(cmc_smem_raw) & 1023u)) & 1023u);
  const unsigned base = smem_u32(smem);
  const int tid = threadIdx.x, wg = tid >> 7, wtid = tid & 127, warp = wtid >> 5, lane = tid & 31;
  const int h = blockIdx.y, b = blockIdx.z;
  const int q0 = blockIdx.x * kDqRows;
  const typename H::seq_t seq = H::seq(desc, b);
  const int len = seq.len;
  if (q0 >= len) return;
  const cmc_i64 tok0 = seq.tok0;
  const int hkv = h / (desc.heads_q / desc.heads_kv);

  const unsigned sQ = base + SmemDQ<D>::kQ, sDO = base + SmemDQ<D>::kDO;
  const unsigned sK = base + SmemDQ<D>::kK, sV = base + SmemDQ<D>::kV;
  int* plan = reinterpret_cast<int*>(smem + SmemDQ<D>::kPlan);

  load_tile<D, kDqRows>(sQ, reinterpret_cast<const unsigned short*>(desc.q) + tok0 * desc.q_stride_tok +
                                (cmc_i64)h * desc.q_stride_head, desc.q_stride_tok, q0, len, tid);
  load_tile<D, kDqRows>(sDO, reinterpret_cast<const unsigned short*>(args.dout) + tok0 * args.dout_stride_tok +
                                 (cmc_i64)h * args.dout_stride_head, args.dout_stride_tok, q0, len, tid);
  cp_commit();

  // Key tiles that rows [q0, min(q0 + kDqRows, len) - 1] see, from the forward hooks.
  cmc_bwd::build_plan<H, DqCfg<D>::kThreads>(plan, seq, q0, cmc_min(q0 + kDqRows, len) - 1, kDqKeys, tid);
  const int* run = plan + 4 * NT;
  const int* full = plan + 6 * NT;
  const int nrun = plan[8 * NT], nfull = plan[8 * NT + 1];

  const unsigned short* kg = reinterpret_cast<const unsigned short*>(desc.k) + tok0 * desc.k_stride_tok +
                             (cmc_i64)hkv * desc.k_stride_head;
  const unsigned short* vg = reinterpret_cast<const unsigned short*>(desc.v) + tok0 * desc.v_stride_tok +
                             (cmc_i64)hkv * desc.v_stride_head;
  int j = nrun > 0 ? run[0] : 0;
  if (nrun > 0) {
    load_tile<D, kDqKeys>(sK, kg, desc.k_stride_tok, j * kDqKeys, len, tid);
    load_tile<D, kDqKeys>(sV, vg, desc.v_stride_tok, j * kDqKeys, len, tid);
  }
  cp_commit();

  // This thread's rows (wgmma accumulator layout): qr and qr + 8; rows past len get the
  // offset +inf (P = 0) and Dsum 0.
  const int qr = q0 + 64 * wg + 16 * warp + (lane >> 2);
  const typename H::row_t rc0 = H::row(seq, qr), rc1 = H::row(seq, qr + 8);
  const float* lse = reinterpret_cast<const float*>(desc.lse) + (cmc_i64)h * desc.lse_stride_head + tok0;
  const float* dsum = reinterpret_cast<const float*>(args.dsum) + (cmc_i64)h * args.total_tokens + tok0;
  const float inf = __int_as_float(0x7f800000);
  const float off0 = qr < len ? cmc_bwd::lse_offset(lse[qr]) : inf;
  const float off1 = qr + 8 < len ? cmc_bwd::lse_offset(lse[qr + 8]) : inf;
  const float ds0 = qr < len ? dsum[qr] : 0.f;
  const float ds1 = qr + 8 < len ? dsum[qr + 8] : 0.f;
  const float sl2 = desc.scale_log2;
  const int cq = 2 * (lane & 3);  // this thread's first key column in each group of 8

  // A operands of S and dP: this warpgroup's 64 rows of Q and dO (K-major).
  const unsigned qA = sQ + wg * 64 * 128, doA = sDO + wg * 64 * 128;

  float acc[kAcc];
#pragma unroll
  for (int i = 0; i < kAcc; ++i) acc[i] = 0.f;

  int r = 0, f = 0, buf = 0;
  while (nrun > 0) {
    int jn, rn = r;
    if (j + 1 < run[2 * r + 1]) {
      jn = j + 1;
    } else {
      rn = r + 1;
      jn = rn < nrun ? run[2 * rn] : -1;
    }
    cp_wait<0>();          // this thread's copies of tile j (and Q, dO) landed
    fence_proxy_async();   // ... visible to wgmma (async proxy)
    __syncthreads();       // everyone's; both warpgroups are done with stage buf ^ 1
    if (jn >= 0) {
      load_tile<D, kDqKeys>(sK + (buf ^ 1) * DqCfg<D>::kTileK, kg, desc.k_stride_tok, jn * kDqKeys, len, tid);
      load_tile<D, kDqKeys>(sV + (buf ^ 1) * DqCfg<D>::kTileK, vg, desc.v_stride_tok, jn * kDqKeys, len, tid);
    }
    cp_commit();
    const unsigned kb = sK + buf * DqCfg<D>::kTileK, vb = sV + buf * DqCfg<D>::kTileK;

    while (f < nfull && full[2 * f + 1] <= j) ++f;
    const bool is_full = f < nfull && full[2 * f] <= j;
    // The forward's linear offset mask of the pair (query tile of q0, key tile j / 2) where
    // the tile stage proved one (cmc_bwd_offset_class): this thread has the forward
    // consumer's rows, and half j % 2's key columns are bits of its words
    // (cmc_bwd_dq_mask_bit). Loaded before the GEMMs so that the load runs under them.
    cmc_uint2 mw = {0u, 0u};
    bool mw_ok = false;
    if constexpr (H::kOffsetMasks != 0) {
      const int cls = is_full ? -1 : cmc_bwd_offset_class<H>(q0 / kDqRows, j >> 1, len);
      mw_ok = cls >= 0;
      if (mw_ok) mw = __ldg(H::offset_masks() + cls * 256 + tid);
    }

    // S and dP (two commit groups).
    float s[32], dp[32];
    issue_s_dp<BF16, D, kDqRows, kDqKeys>(s, dp, qA, kb, doA, vb);
    // Else a grid mask's span word of this thread's rows over the half's 64 keys (the kv's
    // cmc_bwd_kv_span_word over the forward hooks: rows are queries here), built under the GEMMs.
    unsigned sw = 0u;
    bool sw_ok = false;
    if constexpr (span_words_on<H>()) {
      if (!mw_ok && !is_full) sw_ok = cmc_bwd_kv_span_word<H>(seq, rc0, rc1, j * kDqKeys, len, cq, sw);
    }
    wg_wait<1>();
    fence_regs<32>(s);

    // P: element (query qr + 8 i, key j kDqKeys + 8 jj + cq + e) is s[4 jj + 2 i + e]. A word
    // inside the exponentials' loop (p_by_word); span words are cut at len already, the
    // forward's offset words here where the half crosses len.
    if (mw_ok || sw_ok) {
      unsigned w = mw_ok ? cmc_bwd_dq_word_as_kv(mw, j & 1) : sw;
      if (mw_ok && j * kDqKeys + kDqKeys > len) w &= cmc_bwd_kv_len_word(j * kDqKeys, len, cq, true, true);
      p_by_word<false>(s, w, sl2, [&](int i, int, int) { return i ? off1 : off0; });
    } else {
      const int kbase = j * kDqKeys + cq;
#pragma unroll
      for (int jj = 0; jj < 8; ++jj) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float p0 = ex2(fmaf(s[4 * jj + e], sl2, -off0)), p1 = ex2(fmaf(s[4 * jj + 2 + e], sl2, -off1));
          if (!is_full) {
            const int k = kbase + 8 * jj + e;
            const bool in = k < len;
            if (!(in && H::visible(seq, rc0, k))) p0 = 0.f;
            if (!(in && H::visible(seq, rc1, k))) p1 = 0.f;
          }
          s[4 * jj + e] = p0;
          s[4 * jj + 2 + e] = p1;
        }
      }
    }
    dq_ds_dq<BF16, D>(s, dp, ds0, ds1, acc, kb);

    buf ^= 1;
    if (jn < 0) break;
    j = jn;
    r = rn;
  }
  cp_wait<0>();
  fence_regs<kAcc>(acc);
  __syncthreads();  // Q is no longer read: its tile stages dQ

  store_acc<BF16, D>(smem + SmemDQ<D>::kQ, acc, sl2 * 0.6931471805599453f, 64 * wg,
                     reinterpret_cast<unsigned short*>(args.dq) + tok0 * args.dq_stride_tok +
                         (cmc_i64)h * args.dq_stride_head, args.dq_stride_tok, q0, len, wtid, wg);
}

// dq with the forward's patch tiling (H::kTiling == 1; templates/cmc/attn_bwd_sm90.cuh part A):
// the CTA's 128 query rows are forward tile blockIdx.x (cmc_bwd_tokens_of: a linear tile or
// a PH x PW patch), grid (nqt of max_len, heads_q, batch). Its plan is the forward's patch
// plan (cmc_bwd_plan_step with H: touched and full key tiles of 128); each touched key tile
// is walked as its two 64-key halves (rows 64 h .. of the tile's token map: PH / 2 grid rows
// of a patch), K, V gathered row by row by cp.async. Partial tiles mask by H::visible per
// element; dQ rows are stored to their tokens. Same order every run: deterministic.
template <class H, bool BF16, int D>
CMC_DEV void dq_patch(const typename H::desc_t& desc, const cmc_bwd_args& args) {
  static_assert(H::kPatchRows % 2 == 0 && H::kPatchRows * H::kPatchCols == kDqRows, "patch halves of 64 rows");
  constexpr int NT = H::kTerms;
  constexpr int kAcc = D / 2;
  extern __shared__ __align__(1024) unsigned char cmc_smem_raw[];
  unsigned char* smem = cmc_smem_raw + ((1024u - (smem_u32(cmc_smem_raw) & 1023u)) & 1023u);
  const unsigned base = smem_u32(smem);
  const int tid = threadIdx.x, wg = tid >> 7, wtid = tid & 127, warp = wtid >> 5, lane = tid & 31;
  const int h = blockIdx.y, b = blockIdx.z, qt = blockIdx.x;
  const typename H::seq_t seq = H::seq(desc, b);
  const int len = seq.len;
  const cmc_patch_geo g = cmc_bwd_geo<H>(len);
  int qa, qb;
  if (!cmc_bwd_tile_hull(g, qt, len, qa, qb)) return;
  const cmc_i64 tok0 = seq.tok0;
  const int hkv = h / (desc.heads_q / desc.heads_kv);
  const cmc_bwd_tile_tokens<H> rows = cmc_bwd_tokens_of<H>(g, qt, len);

  const unsigned sQ = base + SmemDQ<D>::kQ, sDO = base + SmemDQ<D>::kDO;
  const unsigned sK = base + SmemDQ<D>::kK, sV = base + SmemDQ<D>::kV;
  int* plan = reinterpret_cast<int*>(smem + SmemDQ<D>::kPlan);

  load_rows<D, kDqRows>(sQ, reinterpret_cast<const unsigned short*>(desc.q) + tok0 * desc.q_stride_tok +
                                (cmc_i64)h * desc.q_stride_head, desc.q_stride_tok, rows, 0, tid);
  load_rows<D, kDqRows>(sDO, reinterpret_cast<const unsigned short*>(args.dout) + tok0 * args.dout_stride_tok +
                                 (cmc_i64)h * args.dout_stride_head, args.dout_stride_tok, rows, 0, tid);
  cp_commit();

  build_plan_patch<H, DqCfg<D>::kThreads>(plan, seq, g, qt, qa, qb, tid);
  const unsigned* touched = reinterpret_cast<const unsigned*>(plan + 4 * NT);
  const unsigned* full = touched + kBwdPatchWords;
  const int nw = (g.nqt + 31) >> 5;

  const unsigned short* kg = reinterpret_cast<const unsigned short*>(desc.k) + tok0 * desc.k_stride_tok +
                             (cmc_i64)hkv * desc.k_stride_head;
  const unsigned short* vg = reinterpret_cast<const unsigned short*>(desc.v) + tok0 * desc.v_stride_tok +
                             (cmc_i64)hkv * desc.v_stride_head;
  // items: (touched key tile j, half hh)
  int j = next_tile(touched, nw, 0), hh = 0;
  if (j >= 0) {
    const cmc_bwd_tile_tokens<H> keys = cmc_bwd_tokens_of<H>(g, j, len);
    load_rows<D, kDqKeys>(sK, kg, desc.k_stride_tok, keys, 0, tid);
    load_rows<D, kDqKeys>(sV, vg, desc.v_stride_tok, keys, 0, tid);
  }
  cp_commit();

  // This thread's rows (wgmma accumulator layout): local lr and lr + 8, tokens tq0, tq1;
  // rows without a token get the offset +inf (P = 0) and Dsum 0.
  const int lr = 64 * wg + 16 * warp + (lane >> 2);
  const int tq0 = rows(lr), tq1 = rows(lr + 8);
  const typename H::row_t rc0 = H::row(seq, tq0 >= 0 ? tq0 : 0), rc1 = H::row(seq, tq1 >= 0 ? tq1 : 0);
  const float* lse = reinterpret_cast<const float*>(desc.lse) + (cmc_i64)h * desc.lse_stride_head + tok0;
  const float* dsum = reinterpret_cast<const float*>(args.dsum) + (cmc_i64)h * args.total_tokens + tok0;
  const float inf = __int_as_float(0x7f800000);
  const float off0 = tq0 >= 0 ? cmc_bwd::lse_offset(lse[tq0]) : inf;
  const float off1 = tq1 >= 0 ? cmc_bwd::lse_offset(lse[tq1]) : inf;
  const float ds0 = tq0 >= 0 ? dsum[tq0] : 0.f;
  const float ds1 = tq1 >= 0 ? dsum[tq1] : 0.f;
  const float sl2 = desc.scale_log2;
  const int cq = 2 * (lane & 3);

  const unsigned qA = sQ + wg * 64 * 128, doA = sDO + wg * 64 * 128;

  float acc[kAcc];
#pragma unroll
  for (int i = 0; i < kAcc; ++i) acc[i] = 0.f;

  int buf = 0;
  while (j >= 0) {
    const int jn = hh == 0 ? j : next_tile(touched, nw, j + 1), hn = hh ^ 1;
    cp_wait<0>();
    fence_proxy_async();
    __syncthreads();
    if (jn >= 0) {
      const cmc_bwd_tile_tokens<H> kn = cmc_bwd_tokens_of<H>(g, jn, len);
      load_rows<D, kDqKeys>(sK + (buf ^ 1) * DqCfg<D>::kTileK, kg, desc.k_stride_tok, kn, 64 * hn, tid);
      load_rows<D, kDqKeys>(sV + (buf ^ 1) * DqCfg<D>::kTileK, vg, desc.v_stride_tok, kn, 64 * hn, tid);
    }
    cp_commit();
    const unsigned kb = sK + buf * DqCfg<D>::kTileK, vb = sV + buf * DqCfg<D>::kTileK;
    const bool is_full = tile_bit(full, j);
    const cmc_bwd_tile_tokens<H> keys = cmc_bwd_tokens_of<H>(g, j, len);
    // The forward's per-offset tile mask of (qt, j) where the tile stage proved one
    // (H::kPatchMasks; cmc/tiling.py patch_masks): this thread has the forward consumer's
    // rows (warpgroup wg, lr, lr + 8), and half hh's key columns are bits of its words
    // (cmc_bwd_dq_mask_bit). Loaded before the GEMMs so that the load runs under them.
    cmc_uint2 mw = {0u, 0u};
    bool mw_ok = false;
    if constexpr (H::kPatchMasks != 0) {
      mw_ok = !is_full && cmc_patch_tile_mask<H>(g, qt, j, len, wg * 128 + wtid, cq, mw);
    }

    float s[32], dp[32];
    issue_s_dp<BF16, D, kDqRows, kDqKeys>(s, dp, qA, kb, doA, vb);
    wg_wait<1>();
    fence_regs<32>(s);

    // P: element (row lr + 8 i, key row 64 hh + 8 jj + cq + e of tile j) is s[4 jj + 2 i + e].
    if (mw_ok) {
      p_by_word<false>(s, cmc_bwd_dq_word_as_kv(mw, hh), sl2, [&](int i, int, int) { return i ? off1 : off0; });
    } else {
#pragma unroll
      for (int jj = 0; jj < 8; ++jj) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float p0 = ex2(fmaf(s[4 * jj + e], sl2, -off0)), p1 = ex2(fmaf(s[4 * jj + 2 + e], sl2, -off1));
          if (!is_full) {
            const int k = keys(64 * hh + 8 * jj + cq + e);
            const bool in = k >= 0;
            if (!(in && H::visible(seq, rc0, k))) p0 = 0.f;
            if (!(in && H::visible(seq, rc1, k))) p1 = 0.f;
          }
          s[4 * jj + e] = p0;
          s[4 * jj + 2 + e] = p1;
        }
      }
    }
    dq_ds_dq<BF16, D>(s, dp, ds0, ds1, acc, kb);

    buf ^= 1;
    j = jn;
    hh = hn;
  }
  cp_wait<0>();
  fence_regs<kAcc>(acc);
  __syncthreads();

  store_acc_rows<BF16, D>(smem + SmemDQ<D>::kQ, acc, sl2 * 0.6931471805599453f, 64 * wg,
                          reinterpret_cast<unsigned short*>(args.dq) + tok0 * args.dq_stride_tok +
                              (cmc_i64)h * args.dq_stride_head, args.dq_stride_tok, rows, wtid, wg);
}

}  // namespace cmc_bwd_sm90
#endif  // !CMC_HOST
