// cmc sm90a: PTX wrappers (TMA, mbarriers, named barriers, wgmma) and the tile GEMMs.
// Part of the sm90a forward kernel: emit concatenates the parts in the order of
// cmc/kernels.py KernelSpec.headers (design notes and launch contract in attn_fwd_sm90.cuh).

#if !defined(CMC_HOST)
namespace cmc_sm90 {

CMC_DEV unsigned smem_u32(const void* p) {
  unsigned r;
  asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(r) : "l"(p));
  return r;
}
// The generic address of a shared-window address (the inverse of smem_u32).
CMC_DEV void* shared_generic(unsigned a) {
  unsigned long long p;
  asm volatile("cvta.shared.u64 %0, %1;\n" : "=l"(p) : "l"((unsigned long long)a));
  return reinterpret_cast<void*>(p);
}
// v, which neither NVVM nor ptxas can see through: what is computed from it is computed
// here, not hoisted out of a loop and kept (or spilled) across it.
CMC_DEV int opaque(int v) {
  int r;
  asm volatile("mov.b32 %0, %1;\n" : "=r"(r) : "r"(v));
  return r;
}
// The kernel's second parameter: tensor maps of Q, K and V (cuTensorMapEncodeTiled by the
// runtime, layout in cmc/abi.py TENSOR_MAPS). Each is a 3-D tiled map over [T, H, D] (dims
// innermost first D, H, T; byte strides head, token), box (64, 1, 128), 128-byte swizzle,
// elements past T read as zero. 128 opaque bytes, 64-byte aligned (CUtensorMap of cuda.h).
struct alignas(64) TensorMap {
  unsigned long long opaque[16];
};
struct TensorMaps {
  TensorMap q, k, v;
};

// One box (64 head-dim elements x 1 head x 128 tokens) of a map into shared memory at dst
// (1 KiB aligned), completing `bar`'s transaction count by 128 * 128 bytes.
CMC_DEV void tma_load(unsigned dst, const TensorMap& map, unsigned bar, int d0, int h, int tok) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4, %5}], [%2];\n"
      ::"r"(dst), "l"(reinterpret_cast<unsigned long long>(&map)), "r"(bar), "r"(d0), "r"(h), "r"(tok)
      : "memory");
}
CMC_DEV void tma_prefetch_map(const TensorMap& map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<unsigned long long>(&map)) : "memory");
}
// A [rows][D] tile of `rows` = 128 tokens from token `tok` (absolute): D / 64 boxes, one per
// 128-byte column block of the swizzled layout, lane cb of the loader warp issuing box cb.
template <int D>
CMC_DEV void tma_tile(unsigned dst, const TensorMap& map, unsigned bar, int h, int tok, int lane) {
  if (lane < D / 64) tma_load(dst + lane * (128 * 128), map, bar, lane * 64, h, tok);
}
// The same tile in a patch tiling: box b (PW tokens from sequence token cmc_patch_box) goes
// to rows b PW .. of every column block (PW >= 8: each box starts on a 1 KiB swizzle atom).
// The PH x D/64 copies are spread over the loader warp's lanes: one thread issuing them all
// took about 90 cycles a copy (measured, tools/sm90_probe.py), 2900 per CLEAR key tile.
template <int D>
CMC_DEV void tma_tile_boxes(unsigned dst, const TensorMap& map, unsigned bar, int h, int tok0,
                            const cmc_patch_geo& g, int t, int lane) {
  constexpr int kCB = D / 64;
  for (int x = lane; x < g.PH * kCB; x += 32) {
    const int b = x / kCB, cb = x - b * kCB;
    tma_load(dst + cb * (128 * 128) + b * g.PW * 128, map, bar, cb * 64, h,
             tok0 + cmc_patch_box(g, t, b));
  }
}

// ------------------------------------------------------------------------------ mbarriers
CMC_DEV void mbar_init(unsigned bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// Arrives (count 1) and adds `bytes` to the phase's expected transaction count (TMA).
CMC_DEV void mbar_expect_tx(unsigned bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
CMC_DEV void mbar_arrive(unsigned bar) {
  asm volatile("{ .reg .b64 st; mbarrier.arrive.shared::cta.b64 st, [%0]; }\n" ::"r"(bar) : "memory");
}
CMC_DEV unsigned mbar_try_wait(unsigned bar, unsigned parity) {
  unsigned ok;
  asm volatile(
      "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }\n"
      : "=r"(ok) : "r"(bar), "r"(parity) : "memory");
  return ok;
}
// Blocks until the phase of the given parity has completed. With CMC_SM90_WATCHDOG defined
// (tools/sm90_check.py does), a wait of more than 2^22 polls (well over 0.1 s; a legitimate
// wait is microseconds) traps instead of hanging the GPU.
CMC_DEV void mbar_wait(unsigned bar, unsigned parity) {
#if defined(CMC_SM90_WATCHDOG)
  unsigned n = 0;  // (trap outside the poll loop: inside it, ptxas serialises the wgmmas)
  for (; !mbar_try_wait(bar, parity) && n < (1u << 22); ++n) {
  }
  if (n >= (1u << 22)) asm volatile("trap;");
#else
  while (!mbar_try_wait(bar, parity)) {
  }
#endif
}
CMC_DEV void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
// Named barrier of one consumer warpgroup (ids 1, 2; 0 is __syncthreads).
CMC_DEV void wg_bar_sync(int cw) {
  if (cw == 0) asm volatile("bar.sync 1, 128;\n" ::: "memory");
  else asm volatile("bar.sync 2, 128;\n" ::: "memory");
}

// Named barrier of the producer's plan builders (warps 1-3; warp 0 is the loader), or of
// the builders and both consumer warpgroups (kHelpers threads) for a CTA's first patch
// plan, which the consumers would otherwise wait for idle.
constexpr int kBuilders = 96;
constexpr int kHelpers = kBuilders + 256;
CMC_DEV void producer_bar() { asm volatile("bar.sync 3, 96;\n" ::: "memory"); }
CMC_DEV void builders_bar(int n) { asm volatile("bar.sync 3, %0;\n" ::"r"(n) : "memory"); }

// Ping-pong of the two consumer warpgroups (FA3's warp-scheduler barriers): barrier 4 + cw
// (256 threads) is consumer warpgroup cw's turn to issue wgmma. A warpgroup waits for its
// turn (bar.sync, its 128 threads) before issuing a round of GEMMs and hands the turn over
// (bar.arrive on the other's barrier, 128 threads) right after issuing, so its softmax runs
// under the other warpgroup's GEMMs instead of beside the other's softmax. Both warpgroups
// run the same rounds (same items, same plan), so the turns alternate strictly; warpgroup 1
// gives warpgroup 0 the first turn.
CMC_DEV void turn_wait(int cw) {
  if (cw == 0) asm volatile("bar.sync 4, 256;\n" ::: "memory");
  else asm volatile("bar.sync 5, 256;\n" ::: "memory");
}
CMC_DEV void turn_pass(int cw) {
  if (cw == 0) asm volatile("bar.arrive 5, 256;\n" ::: "memory");
  else asm volatile("bar.arrive 4, 256;\n" ::: "memory");
}

template <int N> CMC_DEV void setmaxnreg_inc() { asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N)); }
template <int N> CMC_DEV void setmaxnreg_dec() { asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N)); }

// ------------------------------------------------------------------------------ wgmma
CMC_DEV void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
CMC_DEV void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N> CMC_DEV void wg_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory"); }
// Keeps the compiler from moving accumulator reads/writes across wgmma issue / wait.
template <int N> CMC_DEV void fence_regs(float* r) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
template <int N> CMC_DEV void fence_regs(unsigned* r) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+r"(r[i])::"memory");
}

// Shared-memory matrix descriptor, 128-byte swizzle (layout type 1 in bits 62-63).
CMC_DEV unsigned long long gdesc(unsigned saddr, unsigned lbo, unsigned sbo) {
  return (unsigned long long)((saddr & 0x3FFFFu) >> 4) |
         ((unsigned long long)((lbo >> 4) & 0x3FFFu) << 16) |
         ((unsigned long long)((sbo >> 4) & 0x3FFFu) << 32) | (1ull << 62);
}
// The descriptor of the tile d describes, moved by `bytes` (a multiple of 16 inside the same
// shared memory window): one add to its address field, where gdesc of the moved address
// costs ptxas four uniform instructions per wgmma in the issue window.
CMC_DEV unsigned long long gdesc_at(unsigned long long d, unsigned bytes) { return d + (bytes >> 4); }

// The wgmma wrappers: each shape's asm is a macro of the operand type (cmc/wgmma.cuh).
// D[64 x 64] (+)= A[64 x 16] (shared, K-major) * B[16 x 64] (shared, K-major).
#define CMC_WGMMA_SS_N64(TY) \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n" \
               "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY " " \
               CMC_WGMMA_D32 ", %32, %33, p, 1, 1, 0, 0;\n}\n" \
               : CMC_WGMMA_ACC32 : "l"(da), "l"(db), "r"(scale_d))
template <bool BF16> CMC_DEV void wgmma_ss_n64(float* d, unsigned long long da, unsigned long long db, int scale_d) {
  CMC_WGMMA_DTYPE(BF16, CMC_WGMMA_SS_N64);
}
// D[64 x 64] += A[64 x 16] (registers) * B[16 x 64] (shared, MN-major: imm-trans-b 1).
#define CMC_WGMMA_RS_N64(TY) \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n" \
               "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY " " \
               CMC_WGMMA_D32 ", {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n" \
               : CMC_WGMMA_ACC32 \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d))
template <bool BF16> CMC_DEV void wgmma_rs_n64(float* d, const unsigned* a, unsigned long long db, int scale_d) {
  CMC_WGMMA_DTYPE(BF16, CMC_WGMMA_RS_N64);
}
// D[64 x 128] (+)= A[64 x 16] (shared, K-major) * B[16 x 128] (shared, K-major).
#define CMC_WGMMA_SS_N128(TY) \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n" \
               "wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY " " \
               CMC_WGMMA_D64 ", %64, %65, p, 1, 1, 0, 0;\n}\n" \
               : CMC_WGMMA_ACC64 : "l"(da), "l"(db), "r"(scale_d))
template <bool BF16> CMC_DEV void wgmma_ss_n128(float* d, unsigned long long da, unsigned long long db, int scale_d) {
  CMC_WGMMA_DTYPE(BF16, CMC_WGMMA_SS_N128);
}
// D[64 x 128] (+)= A[64 x 16] (registers) * B[16 x 128] (shared; TB 1: MN-major, V; TB 0:
// K-major, K).
#define CMC_WGMMA_RS_N128(TY) \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n" \
               "wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY " " \
               CMC_WGMMA_D64 ", {%64, %65, %66, %67}, %68, p, 1, 1, %70;\n}\n" \
               : CMC_WGMMA_ACC64 \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d), "n"(TB))
template <bool BF16, int TB = 1>
CMC_DEV void wgmma_rs_n128(float* d, const unsigned* a, unsigned long long db, int scale_d) {
  CMC_WGMMA_DTYPE(BF16, CMC_WGMMA_RS_N128);
}

// S[64 x 128] = Q_wg[64 x D] K[128 x D]^T for this consumer warpgroup (issue only). QR:
// A = Q from registers (load_q) instead of shared memory. Measured (kernel notes, stage 6):
// 4-6 % faster for patch tiles (CLEAR), 4-7 % slower for causal, so patch tilings only.
template <bool BF16, int D, bool QR>
CMC_DEV void issue_qk(float* s, unsigned sq, const unsigned* q, unsigned sk) {
  const unsigned long long dk = gdesc(sk, 16, 1024);
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    const unsigned long long db = gdesc_at(dk, (kk >> 2) * (kBN * 128) + (kk & 3) * 32);
    if constexpr (QR) {
      wgmma_rs_n128<BF16, 0>(s, q + 4 * kk, db, kk > 0 ? 1 : 0);
    } else {
      const unsigned long long da = gdesc(sq + (kk >> 2) * (kBM * 128) + (kk & 3) * 32, 16, 1024);
      wgmma_ss_n128<BF16>(s, da, db, kk > 0 ? 1 : 0);
    }
  }
}
// This thread's A fragments of Q_wg[64 x D] (the layout the S accumulator repacks into for
// P): k-step kk = registers 4kk .. 4kk + 3 = (row r, cols c, c + 1), (r + 8, c ..),
// (r, c + 8 ..), (r + 8, c + 8 ..), r = 16 warp + lane / 4, c = 16 kk + 2 (lane % 4), read
// from the swizzled Q slot rows of the warpgroup (sq).
template <int D>
CMC_DEV void load_q(unsigned* q, unsigned sq, int warp, int lane) {
  const int r = warp * 16 + (lane >> 2), cb = 4 * (lane & 3);
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
    for (int h = 0; h < 4; ++h) {
      const int row = r + 8 * (h & 1), chunk = 2 * (kk & 3) + (h >> 1);
      const unsigned a = sq + (kk >> 2) * (kBM * 128) + row * 128 +
                         (((unsigned)chunk ^ (unsigned)(row & 7)) << 4) + cb;
      asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(q[4 * kk + h]) : "r"(a));
    }
  }
}
// O[64 x D] += P[64 x 128] V[128 x D] (issue only).
template <bool BF16, int D>
CMC_DEV void issue_pv(float* o, const unsigned* p, unsigned sv) {
  const unsigned long long dv = gdesc(sv, kBN * 128, 1024);
#pragma unroll
  for (int kk = 0; kk < kBN / 16; ++kk) {
    const unsigned long long db = gdesc_at(dv, kk * 2048);
    if constexpr (D == 128) wgmma_rs_n128<BF16>(o, p + 4 * kk, db, 1);
    else wgmma_rs_n64<BF16>(o, p + 4 * kk, db, 1);
  }
}

}  // namespace cmc_sm90
#endif  // !CMC_HOST
