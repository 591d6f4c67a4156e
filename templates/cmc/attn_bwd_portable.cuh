// ===========================================================================================
// cmc portable backward attention: FlashAttention-2 style, mma.sync m16n8k16, sm_80 and newer.
// Hand-written. Inlined into NAME.cu after the portable forward header (it reuses part A's
// plan helpers and cmc_portable's cp.async / ldmatrix / mma / swizzle helpers) and after both
// hook structs (cmc_hooks: visible(q, k); cmc_hooks_t: the transposed mask, visibleT(k, q)).
// The ABI is docs/architecture.md, "The backward" (arguments, grids, workspaces, entry points).
//
// Kernels (all grids (tiles, heads, batch); every CTA returns at once past its sequence):
//   pre   Dsum[q] = rowsum(dO * O) (fp32); zeroes the dQ workspace rows (non-deterministic).
//   kv    one CTA per key tile of kBN keys and kv head. K, V stay in shared memory; the query
//         tiles (kBM rows) that see the tile come from the TRANSPOSED hooks' plan, walked for
//         every query head of the GQA group; Q, dO, LSE, Dsum of the next (head, tile) item are
//         prefetched with cp.async while the current one computes. Warp w owns keys
//         16w .. 16w+15 of the tile, so S^T = K Q^T, P^T, dP^T = V dO^T and dS^T are all
//         m16 tiles of keys x queries, and dV += P^T dO, dK += dS^T Q reuse them as A
//         operands straight from registers (no shared-memory round trip). dK, dV are fp32
//         accumulators in registers, written once. Non-deterministic mode: dS^T goes through
//         shared memory and each warp adds a D/4-column slice of dQ += dS K into the fp32
//         workspace with atomicAdd.
//   dq    deterministic mode: one CTA per query tile (4 warps x 16 rows), the FORWARD plan's
//         key tiles in order, recomputes S, P, dP, dS, accumulates dQ in registers.
//   post  dq = dq_accum * scale in the dtype (non-deterministic mode).
// Masking: full tiles none; partial tiles visible() per element plus q < len, k < len. P is
// computed as exp2(S * scale_log2 - LSE * log2 e) with LSE = -inf read as +inf, so a row that
// sees nothing gives P = 0 and never computes -inf - -inf.
// ===========================================================================================

struct cmc_bwd_args {  // 8-byte aligned, 120 bytes: the contract's fields (its "112" miscounts them)
  uint64_t dout;
  uint64_t dq;
  uint64_t dk;
  uint64_t dv;
  uint64_t dq_accum;  // fp32 [T, Hq, D], token-major, contiguous
  uint64_t dsum;      // fp32 [Hq, T]
  int64_t dout_stride_tok, dout_stride_head;
  int64_t dq_stride_tok, dq_stride_head;
  int64_t dk_stride_tok, dk_stride_head;
  int64_t dv_stride_tok, dv_stride_head;
  int32_t total_tokens;
  int32_t flags;  // bit 0: deterministic; bit 1: the ws kv's heavy key tiles first (CMC_WS_HEAVY_FIRST)
};
static_assert(sizeof(cmc_bwd_args) == 120, "cmc_bwd_args size");

#ifndef CMC_DQ_BLOCK64
// dq_accum's layout. 0: token-major [T, Hq, D]. 1: blocks of 64 query rows, each sequence's rows
// starting a block (sequence b's blocks from (tok0 + 64 b) / 64 on, FA3's padding, so ceil(T /
// 64) + batch blocks hold any batch), block-major then head, and inside a block the sm90
// wgmma accumulator order of its [64 x 64] column halves (dq_acc_at): a warpgroup's dQ partial
// of one item is one contiguous 16 KiB, staged by 8 st.shared.v4 a thread and added by one
// bulk copy (the ws kv), as FA3 / FA4 lay out dQaccum.
#define CMC_DQ_BLOCK64 0
#endif

#ifndef CMC_PREPOST_BATCH
// 1 (bwd_ablate wsfragpp): pre issues all of a thread's O, dO and LSE loads before its first
// reduction, and post all of its dq_accum loads before its first shared-memory store. 0: one
// chunk's loads per round trip (run 51: pre 0.233 ms, post 0.176 ms at causal 4K x 8, D 128,
// where FA4's take 0.181 and 0.126 for the same bytes, run 28's ncu).
#define CMC_PREPOST_BATCH 0
#endif

#if !defined(CMC_HOST)
namespace cmc_bwd {

using cmc_portable::cp_async16;
using cmc_portable::cp_commit;
using cmc_portable::cp_wait;
using cmc_portable::ex2;
using cmc_portable::ldsm_x4;
using cmc_portable::ldsm_x4_t;
using cmc_portable::mma;
using cmc_portable::neg_inf;
using cmc_portable::pack2;
using cmc_portable::smem_u32;
using cmc_portable::swz;
using cmc_portable::swz_step;

enum : int {
  kPreRows = 64,  // rows per CTA of pre and post
  kBM = 64,       // query rows per tile (kv: the plan's tile; dq: rows per CTA)
  kBN = 64,       // keys per tile (kv: keys per CTA; dq: the plan's tile)
  kWarps = 4      // kv: 16 keys per warp; dq: 16 query rows per warp
};
static_assert(kBN == 16 * kWarps && kBM == 16 * kWarps, "one m16 tile per warp");

// dq_accum's 64-row block of query row q of sequence b, whose first token is tok0 (CMC_DQ_BLOCK64).
CMC_DEV cmc_i64 dq_block(cmc_i64 tok0, int b, int q) { return ((tok0 + 64 * (cmc_i64)b) >> 6) + (q >> 6); }
// The float offset in dq_accum of query row q of sequence b (first token tok0), head h, column c.
// CMC_DQ_BLOCK64: in block dq_block, head h's 64 x D floats hold column half c / 64 (D 128) at
// 4096 (c / 64), and in a half, thread t's accumulator quad jj of a m64n64 wgmma (rows
// 16 (t / 32) + t % 32 / 4 + {0, 8}, columns 8 jj + 2 (t % 4) + {0, 1}) at 4 (128 jj + t).
template <int D>
CMC_DEV cmc_i64 dq_acc_at(cmc_i64 tok0, int b, int q, int heads_q, int h, int c) {
#if CMC_DQ_BLOCK64
  const int i = q & 63, cc = c & 63;
  const int t = (i >> 4) * 32 + (i & 7) * 4 + ((cc & 7) >> 1);
  return (dq_block(tok0, b, q) * heads_q + h) * (64 * D) + (D == 128 ? (c >> 6) * 4096 : 0) +
         ((cc >> 3) * 128 + t) * 4 + ((i >> 3) & 1) * 2 + (cc & 1);
#else
  (void)b;
  return ((tok0 + q) * heads_q + h) * D + c;
#endif
}

template <int D> struct Cfg {
  static_assert(D == 64 || D == 128, "head dim");
  enum : int {
    kThreadsPre = 256,
    kThreadsKV = 32 * kWarps,
    kThreadsDQ = 32 * kWarps,
    kThreadsPost = 256,
    kRowBytes = D * 2,
    kTileQ = kBM * D * 2,  // one [kBM][D] tile
    kTileK = kBN * D * 2   // one [kBN][D] tile
  };
};

// kv shared memory: K | V | Q x2 | dO x2 | LSE x2 | Dsum x2 | dS^T [kBN][kBM] | plan ints.
template <int D> struct SmemKV {
  enum : int {
    kK = 0,
    kV = Cfg<D>::kTileK,
    kQ = 2 * Cfg<D>::kTileK,
    kDO = kQ + 2 * Cfg<D>::kTileQ,
    kLse = kDO + 2 * Cfg<D>::kTileQ,
    kDsum = kLse + 2 * kBM * 4,
    kDS = kDsum + 2 * kBM * 4,
    kPlan = kDS + kBN * kBM * 2
  };
};
// dq shared memory: Q | dO | K x2 | V x2 | plan ints.
template <int D> struct SmemDQ {
  enum : int {
    kQ = 0,
    kDO = Cfg<D>::kTileQ,
    kK = 2 * Cfg<D>::kTileQ,
    kV = kK + 2 * Cfg<D>::kTileK,
    kPlan = kV + 2 * Cfg<D>::kTileK
  };
};
template <int D, int NT, int NTT> constexpr int smem_kv() {
  return (SmemKV<D>::kPlan + (8 * NTT + 2) * 4 + 15) / 16 * 16;
}
template <int D, int NT> constexpr int smem_dq() {
  return (SmemDQ<D>::kPlan + (8 * NT + 2) * 4 + 15) / 16 * 16;
}

// ------------------------------------------------------------------------------- helpers
// 4-byte async copy (LSE, Dsum); valid == false writes zero.
CMC_DEV void cp_async4(unsigned dst, const void* src, bool valid) {
  const int n = valid ? 4 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(n) : "memory");
}
// One packed pair of 16-bit values to two floats.
template <bool BF16> CMC_DEV void unpack2(unsigned w, float& lo, float& hi) {
  if constexpr (BF16) {
    lo = __int_as_float((int)(w << 16));
    hi = __int_as_float((int)(w & 0xffff0000u));
  } else {
    asm("{ .reg .f16 a, b; mov.b32 {a, b}, %2; cvt.f32.f16 %0, a; cvt.f32.f16 %1, b; }"
        : "=f"(lo), "=f"(hi) : "r"(w));
  }
}
// LSE (natural log) to the exp2 offset; -inf (a row that sees nothing) becomes +inf so that
// exp2(s - offset) == 0 for every finite s.
CMC_DEV float lse_offset(float lse) {
  return lse == neg_inf() ? __int_as_float(0x7f800000) : lse * 1.4426950408889634f;
}
// Row h (query head) of the dsum workspace's second half, [heads_q][T] from token 0: pre
// writes lse_offset of every query row's LSE there, so that the sm90 kv kernels take it as it
// is, one FFMA an exponential (FA3 / FA4 read a log2-scaled LSE too); converting it in the kv
// cost 3 instructions per value and item on the path to the S^T wgmmas' issue (ncu, 2026-12-07).
CMC_DEV float* lse_offsets(const cmc_bwd_args& args, int heads_q, int h) {
  return reinterpret_cast<float*>(args.dsum) + ((cmc_i64)heads_q + h) * args.total_tokens;
}

// cp.async copies of rows [row0, row0 + ROWS) of a [len][D] operand (token stride `stride`)
// into a swizzled tile; rows >= len are zero-filled.
template <int D, int ROWS, int NTHREADS>
CMC_DEV void load_rows(unsigned dst, const unsigned short* g, cmc_i64 stride, int row0, int len,
                       int tid) {
  constexpr int kChunks = D / 8;
#pragma unroll
  for (int c = tid; c < ROWS * kChunks; c += NTHREADS) {
    const int r = c / kChunks, ch = c % kChunks;
    const bool valid = row0 + r < len;
    cp_async16(dst + swz<D>(r, ch), g + (cmc_i64)(valid ? row0 + r : 0) * stride + ch * 8, valid);
  }
}

// Stores a [16 x D] fp32 accumulator of this warp (mma C layout, rows r0 .. r0+15 of the
// shared tile at `stage`) through shared memory as 16-byte row-contiguous global stores.
template <bool BF16, int D>
CMC_DEV void store_rows(unsigned char* stage, const float (*acc)[4], float mul, int r0,
                        unsigned short* g, cmc_i64 stride, int grow0, int len, int lane) {
  const int wr = r0 + (lane >> 2);
  const unsigned off = (unsigned)((lane & 3) * 4);
#pragma unroll
  for (int d = 0; d < D / 8; ++d) {
    *reinterpret_cast<unsigned*>(stage + swz<D>(wr, d) + off) = pack2<BF16>(acc[d][0] * mul, acc[d][1] * mul);
    *reinterpret_cast<unsigned*>(stage + swz<D>(wr + 8, d) + off) = pack2<BF16>(acc[d][2] * mul, acc[d][3] * mul);
  }
  __syncwarp();
#pragma unroll
  for (int c = lane; c < 16 * (D / 8); c += 32) {
    const int rr = c / (D / 8), ch = c % (D / 8);
    const int row = grow0 + r0 + rr;
    if (row < len)
      *reinterpret_cast<uint4*>(g + (cmc_i64)row * stride + ch * 8) =
          *reinterpret_cast<const uint4*>(stage + swz<D>(r0 + rr, ch));
  }
}

// C[16 x 8NN] = A[16 rows x D] B[8NN rows x D]^T: A rows at aBase (swizzled [.][D] tile, this
// warp's 16 rows), B the 8NN rows at bBase. Both operands read with ldmatrix.
template <bool BF16, int D, int NN = 8>
CMC_DEV void gemm_abt(float (*c)[4], unsigned aBase, unsigned bBase, int lane) {
  const unsigned apre = swz<D>(lane & 15, lane >> 4);
  const unsigned bpre = swz<D>((lane & 7) + ((lane >> 4) << 3), (lane >> 3) & 1);
#pragma unroll
  for (int n = 0; n < NN; ++n) c[n][0] = c[n][1] = c[n][2] = c[n][3] = 0.f;
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    unsigned a[4];
    ldsm_x4(aBase + swz_step<D>(apre, kk), a[0], a[1], a[2], a[3]);
#pragma unroll
    for (int np = 0; np < NN / 2; ++np) {
      unsigned b0, b1, b2, b3;
      ldsm_x4(bBase + np * 16 * (D * 2) + swz_step<D>(bpre, kk), b0, b1, b2, b3);
      mma<BF16>(c[2 * np], a, b0, b1);
      mma<BF16>(c[2 * np + 1], a, b2, b3);
    }
  }
}

// acc[16 x D] += A[16 x 8NN] B[8NN x D]: A from registers (NN/2 k-steps of 16), B the 8NN
// rows of a [.][D] tile at bBase read transposed (ldmatrix.trans), as the forward's P V.
template <bool BF16, int D, int NN = 8>
CMC_DEV void gemm_ab(float (*acc)[4], const unsigned (*a)[4], unsigned bBase, int lane) {
  const unsigned bpre = swz<D>(lane & 15, lane >> 4);
#pragma unroll
  for (int kk = 0; kk < NN / 2; ++kk) {
#pragma unroll
    for (int dp = 0; dp < D / 16; ++dp) {
      unsigned b0, b1, b2, b3;
      ldsm_x4_t(bBase + kk * 16 * (D * 2) + swz_step<D>(bpre, dp), b0, b1, b2, b3);
      mma<BF16>(acc[2 * dp], a[kk], b0, b1);
      mma<BF16>(acc[2 * dp + 1], a[kk], b2, b3);
    }
  }
}

// A fragments (NN/2 k-steps of 16 columns) of a [16 x 8NN] fp32 C-layout tile, packed.
template <bool BF16, int NN = 8> CMC_DEV void to_a(unsigned (*a)[4], const float (*c)[4]) {
#pragma unroll
  for (int n = 0; n < NN; ++n) {
    a[n >> 1][(n & 1) * 2 + 0] = pack2<BF16>(c[n][0], c[n][1]);
    a[n >> 1][(n & 1) * 2 + 1] = pack2<BF16>(c[n][2], c[n][3]);
  }
}

// Builds the tile plan of the rows [a, b] of hook struct HH (bn per tile) in shared memory.
template <class HH, int NTHREADS>
CMC_DEV void build_plan(int* plan, const typename HH::seq_t& s, int a, int b, int bn, int tid) {
  constexpr int NT = HH::kTerms;
  cmc_plan_terms<HH>(s, a, b, plan, tid, NTHREADS, [] { __syncthreads(); });
  __syncthreads();
  for (int i = tid; i < NT; i += NTHREADS) cmc_plan_place(plan, NT, i, bn);
  __syncthreads();
  if (tid == 0) cmc_plan_merge(plan, NT, bn);
  __syncthreads();
}

// ----------------------------------------------------------------------------------- pre
// The dot product of eight dtype values o and d (16 bytes each), in pre's summation order.
template <bool BF16> CMC_DEV float dot8(const uint4 o, const uint4 d) {
  const unsigned ow[4] = {o.x, o.y, o.z, o.w}, dw[4] = {d.x, d.y, d.z, d.w};
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    float o0, o1, d0, d1;
    unpack2<BF16>(ow[i], o0, o1);
    unpack2<BF16>(dw[i], d0, d1);
    s = fmaf(o0, d0, fmaf(o1, d1, s));
  }
  return s;
}

template <class H, bool BF16, int D>
CMC_DEV void pre(const typename H::desc_t& desc, const cmc_bwd_args& args) {
  constexpr int kCh = D / 8;  // 16-byte chunks per row: lanes per row (8 or 16, in one warp)
  constexpr int kThreads = Cfg<D>::kThreadsPre;
  const int tid = threadIdx.x, h = blockIdx.y, b = blockIdx.z;
  const typename H::seq_t seq = H::seq(desc, b);
  const int len = seq.len, q0 = blockIdx.x * kPreRows;
  if (q0 >= len) return;
  const cmc_i64 tok0 = seq.tok0;
  const unsigned short* og = reinterpret_cast<const unsigned short*>(desc.o) + (cmc_i64)h * desc.o_stride_head;
  const unsigned short* dg = reinterpret_cast<const unsigned short*>(args.dout) + (cmc_i64)h * args.dout_stride_head;
  float* dsum = reinterpret_cast<float*>(args.dsum) + (cmc_i64)h * args.total_tokens;
  float* loff = lse_offsets(args, desc.heads_q, h);
  const float* lse = reinterpret_cast<const float*>(desc.lse) + (cmc_i64)h * desc.lse_stride_head;
  float* acc = reinterpret_cast<float*>(args.dq_accum);
  const bool zero_acc = (args.flags & 1) == 0;
  // dq_accum's 8 floats of pass chunk c (row c / kCh of the CTA's 64, chunk ch, token t) to
  // zero: token-major, or in the CTA's 64-row block, whose rows past len are zeroed too (the
  // ws kv adds them: zeros)
  auto zero8 = [&](int c, int ch, cmc_i64 t) {
#if CMC_DQ_BLOCK64
    (void)ch;
    (void)t;
    float4* z = reinterpret_cast<float4*>(acc + (dq_block(tok0, b, q0) * desc.heads_q + h) * (64 * D) + c * 8);
#else
    (void)c;
    float4* z = reinterpret_cast<float4*>(acc + (t * desc.heads_q + h) * D + ch * 8);
#endif
    z[0] = make_float4(0.f, 0.f, 0.f, 0.f);
    z[1] = make_float4(0.f, 0.f, 0.f, 0.f);
  };
#if CMC_PREPOST_BATCH
  constexpr int kIters = kPreRows * kCh / kThreads;
  static_assert(kPreRows * kCh % kThreads == 0 && kThreads % kCh == 0, "whole rows per pass");
  uint4 ov[kIters], dv[kIters];
  float lv[kIters];
#pragma unroll
  for (int i = 0; i < kIters; ++i) {  // every load first: kIters round trips become one
    const int c = tid + i * kThreads, ch = c % kCh, q = q0 + c / kCh;
    ov[i] = dv[i] = make_uint4(0u, 0u, 0u, 0u);
    lv[i] = 0.f;
    if (q < len) {
      const cmc_i64 t = tok0 + q;
      ov[i] = *reinterpret_cast<const uint4*>(og + t * desc.o_stride_tok + ch * 8);
      dv[i] = *reinterpret_cast<const uint4*>(dg + t * args.dout_stride_tok + ch * 8);
      if (ch == 1) lv[i] = lse[t];
    }
  }
#pragma unroll
  for (int i = 0; i < kIters; ++i) {
    const int c = tid + i * kThreads, ch = c % kCh, q = q0 + c / kCh;
    const bool in = q < len;
    if (zero_acc && (CMC_DQ_BLOCK64 || in)) zero8(c, ch, tok0 + q);
    float s = dot8<BF16>(ov[i], dv[i]);
#pragma unroll
    for (int m = 1; m < kCh; m <<= 1) s += __shfl_xor_sync(0xffffffffu, s, m);
    if (in && ch == 0) dsum[tok0 + q] = s;
    if (in && ch == 1) loff[tok0 + q] = lse_offset(lv[i]);
  }
#else
  for (int c = tid; c < kPreRows * kCh; c += kThreads) {  // kThreads is a multiple of kCh
    const int r = c / kCh, ch = c % kCh, q = q0 + r;
    float s = 0.f;
    const bool in = q < len;
    if (in) {
      const cmc_i64 t = tok0 + q;
      s = dot8<BF16>(*reinterpret_cast<const uint4*>(og + t * desc.o_stride_tok + ch * 8),
                     *reinterpret_cast<const uint4*>(dg + t * args.dout_stride_tok + ch * 8));
#if !CMC_DQ_BLOCK64
      if (zero_acc) zero8(c, ch, t);
#endif
    }
#if CMC_DQ_BLOCK64
    if (zero_acc) zero8(c, ch, 0);
#endif
#pragma unroll
    for (int m = 1; m < kCh; m <<= 1) s += __shfl_xor_sync(0xffffffffu, s, m);
    if (in && ch == 0) dsum[tok0 + q] = s;
    if (in && ch == 1) loff[tok0 + q] = lse_offset(lse[tok0 + q]);
  }
#endif
}

// ---------------------------------------------------------------------------------- post
// Eight dq_accum values (x, y) times scale as eight dtype values: post's conversion (also the
// sm90 ws kv's, where it converts dQ itself: ws_post_fused).
template <bool BF16>
CMC_DEV uint4 dq_pack8(const float4 x, const float4 y, float scale) {
  uint4 w;
  w.x = pack2<BF16>(x.x * scale, x.y * scale);
  w.y = pack2<BF16>(x.z * scale, x.w * scale);
  w.z = pack2<BF16>(y.x * scale, y.y * scale);
  w.w = pack2<BF16>(y.z * scale, y.w * scale);
  return w;
}

template <class H, bool BF16, int D>
CMC_DEV void post(const typename H::desc_t& desc, const cmc_bwd_args& args) {
  constexpr int kCh = D / 8;
  const int tid = threadIdx.x, h = blockIdx.y, b = blockIdx.z;
  const typename H::seq_t seq = H::seq(desc, b);
  const int len = seq.len, q0 = blockIdx.x * kPreRows;
  if (q0 >= len) return;
  const float scale = desc.scale_log2 * 0.6931471805599453f;
  const float* acc = reinterpret_cast<const float*>(args.dq_accum);
  unsigned short* dq = reinterpret_cast<unsigned short*>(args.dq) + (cmc_i64)h * args.dq_stride_head;
#if CMC_DQ_BLOCK64
  // the block's accumulator quads into rows (coalesced float4 reads), then rows out as below
  __shared__ __align__(16) float rows[64][D + 4];
  const float4* blk = reinterpret_cast<const float4*>(acc + (dq_block(seq.tok0, b, q0) * desc.heads_q + h) * (64 * D));
#if CMC_PREPOST_BATCH
  constexpr int kLoads = 16 * D / Cfg<D>::kThreadsPost;
  static_assert(16 * D % Cfg<D>::kThreadsPost == 0, "whole passes");
  float4 xs[kLoads];
#pragma unroll
  for (int i = 0; i < kLoads; ++i) xs[i] = blk[tid + i * Cfg<D>::kThreadsPost];  // all in flight
#pragma unroll
  for (int i = 0; i < kLoads; ++i) {
    const int f = tid + i * Cfg<D>::kThreadsPost;
    const float4 x = xs[i];
#else
  for (int f = tid; f < 16 * D; f += Cfg<D>::kThreadsPost) {
    const float4 x = blk[f];
#endif
    const int t = f & 127, r = 16 * (t >> 5) + ((t & 31) >> 2), c = 64 * (f >> 10) + 8 * ((f >> 7) & 7) + 2 * (t & 3);
    *reinterpret_cast<float2*>(&rows[r][c]) = make_float2(x.x, x.y);
    *reinterpret_cast<float2*>(&rows[r + 8][c]) = make_float2(x.z, x.w);
  }
  __syncthreads();
#endif
  for (int c = tid; c < kPreRows * kCh; c += Cfg<D>::kThreadsPost) {
    const int r = c / kCh, ch = c % kCh, q = q0 + r;
    if (q >= len) continue;
    const cmc_i64 t = seq.tok0 + q;
#if CMC_DQ_BLOCK64
    const float4* a = reinterpret_cast<const float4*>(&rows[r][ch * 8]);
#else
    const float4* a = reinterpret_cast<const float4*>(acc + (t * desc.heads_q + h) * D + ch * 8);
#endif
    const float4 x = a[0], y = a[1];
    *reinterpret_cast<uint4*>(dq + t * args.dq_stride_tok + ch * 8) = dq_pack8<BF16>(x, y, scale);
  }
}

// ------------------------------------------------------------------------------------ kv
// Issues the copies of one (query head hq, query tile qt) item into buffer `buf`: Q and dO
// rows (zero past len), LSE and Dsum (zero past len: those rows are masked anyway).
template <class Desc, bool BF16, int D>
CMC_DEV void kv_issue(unsigned char* smem, int buf, const Desc& desc, const cmc_bwd_args& args,
                      cmc_i64 tok0, int len, int hq, int qt, int tid) {
  constexpr int kThreads = Cfg<D>::kThreadsKV;
  const int q0 = qt * kBM;
  load_rows<D, kBM, kThreads>(smem_u32(smem + SmemKV<D>::kQ + buf * Cfg<D>::kTileQ),
                              reinterpret_cast<const unsigned short*>(desc.q) + tok0 * desc.q_stride_tok +
                                  (cmc_i64)hq * desc.q_stride_head, desc.q_stride_tok, q0, len, tid);
  load_rows<D, kBM, kThreads>(smem_u32(smem + SmemKV<D>::kDO + buf * Cfg<D>::kTileQ),
                              reinterpret_cast<const unsigned short*>(args.dout) + tok0 * args.dout_stride_tok +
                                  (cmc_i64)hq * args.dout_stride_head, args.dout_stride_tok, q0, len, tid);
  const float* lse = reinterpret_cast<const float*>(desc.lse) + (cmc_i64)hq * desc.lse_stride_head + tok0;
  const float* dsum = reinterpret_cast<const float*>(args.dsum) + (cmc_i64)hq * args.total_tokens + tok0;
  for (int i = tid; i < 2 * kBM; i += kThreads) {
    const int rr = i % kBM, q = q0 + rr;
    const bool valid = q < len;
    const float* src = (i < kBM ? lse : dsum) + (valid ? q : 0);
    cp_async4(smem_u32(smem + (i < kBM ? SmemKV<D>::kLse : SmemKV<D>::kDsum) + (buf * kBM + rr) * 4),
              src, valid);
  }
}

// dS^T fragments (packed A layout, k-steps ks0, ks0 + 1 = queries 32 h .. 32 h + 31) of this
// warp's 16 keys into the [kBN][kBM] dS^T tile.
CMC_DEV void kv_store_ds(unsigned char* sds, const unsigned (*dsa)[4], int hh, int warp, int lane) {
  const unsigned off = (unsigned)((lane & 3) * 4);
  const int kw = warp * 16 + (lane >> 2);
#pragma unroll
  for (int n = 0; n < 4; ++n) {
    *reinterpret_cast<unsigned*>(sds + swz<kBM>(kw, hh * 4 + n) + off) = dsa[n >> 1][(n & 1) * 2];
    *reinterpret_cast<unsigned*>(sds + swz<kBM>(kw + 8, hh * 4 + n) + off) = dsa[n >> 1][(n & 1) * 2 + 1];
  }
}

// Non-deterministic dQ, once every warp stored its dS^T: warp w adds
// dQ[:, w D/4 .. (w+1) D/4) += dS K for the kBM rows into the fp32 workspace.
template <class Desc, bool BF16, int D>
CMC_DEV void kv_dq_atomic(unsigned sDS, unsigned sK,
                          const Desc& desc, const cmc_bwd_args& args, cmc_i64 tok0, int b, int len,
                          int hq, int qbase, int warp, int lane) {
  constexpr int kCols = D / kWarps;  // dQ columns per warp: 16 or 32
  constexpr int kDP = kCols / 16;    // 16-column steps per warp
  __syncthreads();
  float* acc = reinterpret_cast<float*>(args.dq_accum);
  const unsigned bpre = swz<D>(lane & 15, lane >> 4);
  const int mi = lane >> 3, mr = lane & 7;  // ldmatrix: matrix index, row inside it
#pragma unroll 1
  for (int mt = 0; mt < kBM / 16; ++mt) {
    float c[2 * kDP][4];
#pragma unroll
    for (int n = 0; n < 2 * kDP; ++n) c[n][0] = c[n][1] = c[n][2] = c[n][3] = 0.f;
#pragma unroll
    for (int ks = 0; ks < kBN / 16; ++ks) {
      // A = dS[rows mt*16.., keys ks*16..] read transposed out of dS^T [key][query].
      unsigned a[4];
      ldsm_x4_t(sDS + swz<kBM>(ks * 16 + mr + ((mi >> 1) << 3), 2 * mt + (mi & 1)), a[0], a[1], a[2], a[3]);
#pragma unroll
      for (int dp = 0; dp < kDP; ++dp) {
        unsigned b0, b1, b2, b3;
        ldsm_x4_t(sK + ks * 16 * (D * 2) + swz_step<D>(bpre, warp * kDP + dp), b0, b1, b2, b3);
        mma<BF16>(c[2 * dp], a, b0, b1);
        mma<BF16>(c[2 * dp + 1], a, b2, b3);
      }
    }
    const int q = qbase + mt * 16 + (lane >> 2);
#pragma unroll
    for (int n = 0; n < 2 * kDP; ++n) {
      const int col = warp * kCols + n * 8 + 2 * (lane & 3);
      if (q < len) {
        float* d = acc + dq_acc_at<D>(tok0, b, q, desc.heads_q, hq, col);
        atomicAdd(d, c[n][0]);
        atomicAdd(d + 1, c[n][1]);
      }
      if (q + 8 < len) {
        float* d = acc + dq_acc_at<D>(tok0, b, q + 8, desc.heads_q, hq, col);
        atomicAdd(d, c[n][2]);
        atomicAdd(d + 1, c[n][3]);
      }
    }
  }
}

template <class H, class HT, bool BF16, int D>
CMC_DEV void kv(const typename H::desc_t& desc, const cmc_bwd_args& args) {
  constexpr int NTT = HT::kTerms;
  constexpr int kThreads = Cfg<D>::kThreadsKV;
  extern __shared__ __align__(128) unsigned char cmc_smem[];
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int hkv = blockIdx.y, b = blockIdx.z;
  const int k0 = blockIdx.x * kBN;
  const typename HT::seq_t seqt = HT::seq(desc, b);
  const int len = seqt.len;
  if (k0 >= len) return;
  const cmc_i64 tok0 = seqt.tok0;
  const int group = desc.heads_q / desc.heads_kv;
  const bool atomic_dq = (args.flags & 1) == 0;

  const unsigned sK = smem_u32(cmc_smem + SmemKV<D>::kK);
  const unsigned sV = smem_u32(cmc_smem + SmemKV<D>::kV);
  const unsigned sQ = smem_u32(cmc_smem + SmemKV<D>::kQ);
  const unsigned sDO = smem_u32(cmc_smem + SmemKV<D>::kDO);
  const unsigned sDS = smem_u32(cmc_smem + SmemKV<D>::kDS);
  const float* lse_s = reinterpret_cast<const float*>(cmc_smem + SmemKV<D>::kLse);
  const float* dsum_s = reinterpret_cast<const float*>(cmc_smem + SmemKV<D>::kDsum);
  int* plan = reinterpret_cast<int*>(cmc_smem + SmemKV<D>::kPlan);

  load_rows<D, kBN, kThreads>(sK, reinterpret_cast<const unsigned short*>(desc.k) + tok0 * desc.k_stride_tok +
                                      (cmc_i64)hkv * desc.k_stride_head, desc.k_stride_tok, k0, len, tid);
  load_rows<D, kBN, kThreads>(sV, reinterpret_cast<const unsigned short*>(desc.v) + tok0 * desc.v_stride_tok +
                                      (cmc_i64)hkv * desc.v_stride_head, desc.v_stride_tok, k0, len, tid);
  cp_commit();

  // Query tiles that see keys [k0, min(k0 + kBN, len) - 1], from the transposed hooks.
  build_plan<HT, kThreads>(plan, seqt, k0, cmc_min(k0 + kBN, len) - 1, kBM, tid);
  const int* run = plan + 4 * NTT;
  const int* full = plan + 6 * NTT;
  const int nrun = plan[8 * NTT], nfull = plan[8 * NTT + 1];

  // This thread's key rows (C layout): kr and kr + 8; their transposed-hook rows.
  const int kr = k0 + warp * 16 + (lane >> 2);
  const typename HT::row_t krow0 = HT::row(seqt, kr), krow1 = HT::row(seqt, kr + 8);
  const float sl2 = desc.scale_log2;

  float dk[D / 8][4], dv[D / 8][4];
#pragma unroll
  for (int d = 0; d < D / 8; ++d) {
    dk[d][0] = dk[d][1] = dk[d][2] = dk[d][3] = 0.f;
    dv[d][0] = dv[d][1] = dv[d][2] = dv[d][3] = 0.f;
  }

  // Items: (g, tile) for g over the group's query heads, tiles in plan order.
  int g = 0, r = 0, j = nrun > 0 ? run[0] : 0;
  if (nrun > 0) kv_issue<typename H::desc_t, BF16, D>(cmc_smem, 0, desc, args, tok0, len, hkv * group, j, tid);
  cp_commit();
  int buf = 0, f = 0;
  while (nrun > 0) {
    // Next item: the next tile of this head's plan, else the first tile of the next head.
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
    cp_wait<0>();     // this item (and K, V) landed
    __syncthreads();  // ... for everyone; everyone is done with buffer buf ^ 1 and dS
    if (jn >= 0) kv_issue<typename H::desc_t, BF16, D>(cmc_smem, buf ^ 1, desc, args, tok0, len, hkv * group + gn, jn, tid);
    cp_commit();

    const unsigned q_b = sQ + buf * Cfg<D>::kTileQ, do_b = sDO + buf * Cfg<D>::kTileQ;
    const float* lse_b = lse_s + buf * kBM;
    const float* dsum_b = dsum_s + buf * kBM;
    while (f < nfull && full[2 * f + 1] <= j) ++f;
    // (a key tile reaching past len is never full: keys >= len must get P = 0)
    const bool is_full = f < nfull && full[2 * f] <= j && k0 + kBN <= len;

    // The kBM queries in two halves of 32 (fewer live registers beside dK, dV): per half,
    // P^T = exp2(S^T scale_log2 - LSE log2 e) with S^T = K Q^T (this warp's 16 keys x 32
    // queries), dV += P^T dO, dP^T = V dO^T, dS^T = P^T (dP^T - Dsum), dK += dS^T Q.
    const int qbase = j * kBM;
#pragma unroll 1
    for (int hh = 0; hh < 2; ++hh) {
      const unsigned qh = q_b + hh * 32 * Cfg<D>::kRowBytes, doh = do_b + hh * 32 * Cfg<D>::kRowBytes;
      float p[4][4];
      gemm_abt<BF16, D, 4>(p, sK + warp * 16 * Cfg<D>::kRowBytes, qh, lane);
#pragma unroll
      for (int n = 0; n < 4; ++n) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int c = hh * 32 + n * 8 + 2 * (lane & 3) + e;
          const float off = lse_offset(lse_b[c]);
          float p0 = ex2(fmaf(p[n][e], sl2, -off)), p1 = ex2(fmaf(p[n][2 + e], sl2, -off));
          if (!is_full) {
            const int q = qbase + c;
            const bool qin = q < len;
            if (!(qin && kr < len && HT::visible(seqt, krow0, q))) p0 = 0.f;
            if (!(qin && kr + 8 < len && HT::visible(seqt, krow1, q))) p1 = 0.f;
          }
          p[n][e] = p0;
          p[n][2 + e] = p1;
        }
      }
      {
        unsigned pa[2][4];
        to_a<BF16, 4>(pa, p);
        gemm_ab<BF16, D, 4>(dv, pa, doh, lane);
      }
      float ds[4][4];
      gemm_abt<BF16, D, 4>(ds, sV + warp * 16 * Cfg<D>::kRowBytes, doh, lane);
#pragma unroll
      for (int n = 0; n < 4; ++n) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float dd = dsum_b[hh * 32 + n * 8 + 2 * (lane & 3) + e];
          ds[n][e] = p[n][e] * (ds[n][e] - dd);
          ds[n][2 + e] = p[n][2 + e] * (ds[n][2 + e] - dd);
        }
      }
      unsigned dsa[2][4];
      to_a<BF16, 4>(dsa, ds);
      gemm_ab<BF16, D, 4>(dk, dsa, qh, lane);  // scaled at the end
      if (atomic_dq) kv_store_ds(cmc_smem + SmemKV<D>::kDS, dsa, hh, warp, lane);
    }

    if (atomic_dq) kv_dq_atomic<typename H::desc_t, BF16, D>(sDS, sK, desc, args, tok0, b, len,
                                                             hkv * group + g, qbase, warp, lane);

    buf ^= 1;
    if (jn < 0) break;
    if (gn != g) f = 0;
    g = gn;
    r = rn;
    j = jn;
  }
  cp_wait<0>();
  __syncthreads();  // K, V no longer read: they become the staging tiles of dK, dV

  const float scale = sl2 * 0.6931471805599453f;
  store_rows<BF16, D>(cmc_smem + SmemKV<D>::kK, dk, scale, warp * 16,
                      reinterpret_cast<unsigned short*>(args.dk) + tok0 * args.dk_stride_tok +
                          (cmc_i64)hkv * args.dk_stride_head, args.dk_stride_tok, k0, len, lane);
  store_rows<BF16, D>(cmc_smem + SmemKV<D>::kV, dv, 1.f, warp * 16,
                      reinterpret_cast<unsigned short*>(args.dv) + tok0 * args.dv_stride_tok +
                          (cmc_i64)hkv * args.dv_stride_head, args.dv_stride_tok, k0, len, lane);
}

// ------------------------------------------------------------------------------------ dq
// Deterministic dQ of one query tile: warp w owns rows 16w .. 16w+15; key tiles of the
// forward plan in order, K and V double-buffered through cp.async.
template <class H, bool BF16, int D>
CMC_DEV void dq(const typename H::desc_t& desc, const cmc_bwd_args& args) {
  constexpr int NT = H::kTerms;
  constexpr int kThreads = Cfg<D>::kThreadsDQ;
  extern __shared__ __align__(128) unsigned char cmc_smem[];
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int h = blockIdx.y, b = blockIdx.z;
  const int q0 = blockIdx.x * kBM;
  const typename H::seq_t seq = H::seq(desc, b);
  const int len = seq.len;
  if (q0 >= len) return;
  const cmc_i64 tok0 = seq.tok0;
  const int hkv = h / (desc.heads_q / desc.heads_kv);

  const unsigned sQ = smem_u32(cmc_smem + SmemDQ<D>::kQ);
  const unsigned sDO = smem_u32(cmc_smem + SmemDQ<D>::kDO);
  const unsigned sK = smem_u32(cmc_smem + SmemDQ<D>::kK);
  const unsigned sV = smem_u32(cmc_smem + SmemDQ<D>::kV);
  int* plan = reinterpret_cast<int*>(cmc_smem + SmemDQ<D>::kPlan);

  load_rows<D, kBM, kThreads>(sQ, reinterpret_cast<const unsigned short*>(desc.q) + tok0 * desc.q_stride_tok +
                                      (cmc_i64)h * desc.q_stride_head, desc.q_stride_tok, q0, len, tid);
  load_rows<D, kBM, kThreads>(sDO, reinterpret_cast<const unsigned short*>(args.dout) + tok0 * args.dout_stride_tok +
                                       (cmc_i64)h * args.dout_stride_head, args.dout_stride_tok, q0, len, tid);
  cp_commit();
  build_plan<H, kThreads>(plan, seq, q0, cmc_min(q0 + kBM, len) - 1, kBN, tid);
  const int* run = plan + 4 * NT;
  const int* full = plan + 6 * NT;
  const int nrun = plan[8 * NT], nfull = plan[8 * NT + 1];

  const unsigned short* kg = reinterpret_cast<const unsigned short*>(desc.k) + tok0 * desc.k_stride_tok +
                             (cmc_i64)hkv * desc.k_stride_head;
  const unsigned short* vg = reinterpret_cast<const unsigned short*>(desc.v) + tok0 * desc.v_stride_tok +
                             (cmc_i64)hkv * desc.v_stride_head;
  int j = nrun > 0 ? run[0] : 0;
  if (nrun > 0) {
    load_rows<D, kBN, kThreads>(sK, kg, desc.k_stride_tok, j * kBN, len, tid);
    load_rows<D, kBN, kThreads>(sV, vg, desc.v_stride_tok, j * kBN, len, tid);
  }
  cp_commit();

  // This thread's rows: qr and qr + 8 (C layout); rows past len get P = 0 via +inf offsets.
  const int qr = q0 + warp * 16 + (lane >> 2);
  const typename H::row_t rc0 = H::row(seq, qr), rc1 = H::row(seq, qr + 8);
  const float* lse = reinterpret_cast<const float*>(desc.lse) + (cmc_i64)h * desc.lse_stride_head + tok0;
  const float* dsum = reinterpret_cast<const float*>(args.dsum) + (cmc_i64)h * args.total_tokens + tok0;
  const float inf = __int_as_float(0x7f800000);
  const float off0 = qr < len ? lse_offset(lse[qr]) : inf;
  const float off1 = qr + 8 < len ? lse_offset(lse[qr + 8]) : inf;
  const float ds0 = qr < len ? dsum[qr] : 0.f;
  const float ds1 = qr + 8 < len ? dsum[qr + 8] : 0.f;
  const float sl2 = desc.scale_log2;

  float acc[D / 8][4];
#pragma unroll
  for (int d = 0; d < D / 8; ++d) acc[d][0] = acc[d][1] = acc[d][2] = acc[d][3] = 0.f;

  int r = 0, f = 0, buf = 0;
  while (nrun > 0) {
    int jn, rn = r;
    if (j + 1 < run[2 * r + 1]) {
      jn = j + 1;
    } else {
      rn = r + 1;
      jn = rn < nrun ? run[2 * rn] : -1;
    }
    cp_wait<0>();
    __syncthreads();
    if (jn >= 0) {
      load_rows<D, kBN, kThreads>(sK + (buf ^ 1) * Cfg<D>::kTileK, kg, desc.k_stride_tok, jn * kBN, len, tid);
      load_rows<D, kBN, kThreads>(sV + (buf ^ 1) * Cfg<D>::kTileK, vg, desc.v_stride_tok, jn * kBN, len, tid);
    }
    cp_commit();
    const unsigned kb = sK + buf * Cfg<D>::kTileK, vb = sV + buf * Cfg<D>::kTileK;

    while (f < nfull && full[2 * f + 1] <= j) ++f;
    const bool is_full = f < nfull && full[2 * f] <= j;
    float p[8][4];
    gemm_abt<BF16, D>(p, sQ + warp * 16 * Cfg<D>::kRowBytes, kb, lane);
    const int kbase = j * kBN + 2 * (lane & 3);
#pragma unroll
    for (int n = 0; n < 8; ++n) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float p0 = ex2(fmaf(p[n][e], sl2, -off0)), p1 = ex2(fmaf(p[n][2 + e], sl2, -off1));
        if (!is_full) {
          const int k = kbase + n * 8 + e;
          const bool in = k < len;
          if (!(in && H::visible(seq, rc0, k))) p0 = 0.f;
          if (!(in && H::visible(seq, rc1, k))) p1 = 0.f;
        }
        p[n][e] = p0;
        p[n][2 + e] = p1;
      }
    }
    float dp[8][4];  // dP = dO V^T, then dS = P (dP - Dsum)
    gemm_abt<BF16, D>(dp, sDO + warp * 16 * Cfg<D>::kRowBytes, vb, lane);
#pragma unroll
    for (int n = 0; n < 8; ++n) {
      dp[n][0] = p[n][0] * (dp[n][0] - ds0);
      dp[n][1] = p[n][1] * (dp[n][1] - ds0);
      dp[n][2] = p[n][2] * (dp[n][2] - ds1);
      dp[n][3] = p[n][3] * (dp[n][3] - ds1);
    }
    unsigned dsa[4][4];
    to_a<BF16>(dsa, dp);
    gemm_ab<BF16, D>(acc, dsa, kb, lane);  // dQ += dS K

    buf ^= 1;
    if (jn < 0) break;
    j = jn;
    r = rn;
  }
  cp_wait<0>();
  __syncthreads();  // Q is no longer read: its tile stages dQ
  store_rows<BF16, D>(cmc_smem + SmemDQ<D>::kQ, acc, sl2 * 0.6931471805599453f, warp * 16,
                      reinterpret_cast<unsigned short*>(args.dq) + tok0 * args.dq_stride_tok +
                          (cmc_i64)h * args.dq_stride_head, args.dq_stride_tok, q0, len, lane);
}

}  // namespace cmc_bwd
#endif  // !CMC_HOST
