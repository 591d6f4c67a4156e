// ===========================================================================================
// cmc sm90a forward attention: wgmma + mbarrier ring + warp specialisation (Hopper only).
// Hand-written. Follows the portable kernel (templates/cmc/attn_fwd_portable.cuh) and must be
// placed AFTER it in NAME.cu: it reuses part A (cmc_i64, CMC_DEV, cmc_plan_place /
// cmc_plan_merge) and is a template over the SAME hook struct H (contract at the top of the
// portable header), so every mask works unchanged. No header includes; inline PTX only.
//
// Semantics = the portable kernel's: fp32 accumulation, online softmax in exp2 units with
// desc.scale_log2 (> 0), LSE (natural log, float32 [H, T]) written when desc.lse != 0, a row
// with no visible key gives O = 0 and LSE = -inf (never NaN), rows >= len never written, GQA
// (h_kv = h / (heads_q / heads_kv)), bf16 / fp16, head dim 64 / 128, jagged via cu_seqlens.
// Per key tile: tiles no term touches are never loaded, full tiles do no mask work, partial
// tiles OR the exact row spans (H::span) of the terms touching them into a column bit mask,
// one bit test per element; only a tile touched by a term with a residual evaluates
// H::visible(s, r, k) && k < len per element.
//
// ------------------------------------------------------------------------------ launch
// Grid (min(pairs, max_ctas), 1, 1) (cmc/abi.py), pairs = ceil(tiles / 2) * heads_q * batch
// (tiles = ceil(max_len / 128), or with a patch tiling (H::kTiling == 1)
// cmc_patch_geo_of(max_len).nqt). The work units (struct Sched: pairs of query tiles, or with
// a work counter and H::kTileUnits single tiles) are taken from the work counter
// (desc.sched) or by a static stride; CTA c starts with unit c, so any max_ctas >= 1 is
// correct (the SM count: persistent; no cap: one CTA per pair). Block 384 threads, dynamic shared memory cmc_sm90::smem_bytes<D, H::kTerms>()
// (needs the opt-in cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES); at most 227 KiB), no
// cluster. Two parameters: the descriptor (as the portable kernel) and TensorMaps (Q, K, V
// tensor maps, cmc/abi.py TENSOR_MAPS), both __grid_constant__.
// Requirements as the portable kernel: base pointers and token strides 16-byte aligned, head
// dim contiguous; (ceil(max_len / 128) + 1) * heads_q * batch < 2^31 and T < 2^31 (checked by
// the runtime). K/V rows past a sequence's end are the next sequence's (TMA cannot stop at a
// sequence boundary inside the packed tensor); they are always masked, so P is exactly 0
// there, but a non-finite V in the next sequence's first rows would still reach O as 0 * inf.
//
// Per item (one query tile of a unit) the plan builders wait for the item's slot (parity of
// the CTA's item count) to be released, pick the item (struct Sched: the CTA's first unit,
// then units from the work counter desc.sched, or a static stride when it is 0), build the
// tile plan and the item header into the slot's plan buffer; the loader waits for the plan,
// loads Q into the slot's Q buffer and streams K/V through the ring (stage and phase
// continue across items); the consumers wait for the slot's plan and Q, compute, write O
// through the slot's Q buffer and release the slot. A header with qt = -1 ends the CTA.
//
// ------------------------------------------------------------------------------ design
// CTA = 3 warpgroups (384 threads), __launch_bounds__(384, 1):
//   WG0 producer (setmaxnreg.dec to 40): warps 1-3 build each item's tile plan (named
//       barrier 3, 96 threads) as soon as the item's slot is free, up to two items ahead
//       (a patch tiling's first plan of a CTA: with both consumer warpgroups, 352 threads);
//       warp 0, the loader, waits for the plan and copies the Q tile [128 x D] and, for every
//       walked key tile j (plan order), K(j) and V(j) into a kStages-deep ring by TMA (one
//       64 x 1 x 128 box per 128-byte column block, or a patch's PH boxes per block; the
//       lanes issue the boxes). Each FULL barrier (count 1) gets an arrive.expect_tx of the
//       tile's bytes from lane 0 and completes when the TMA has written them. It waits on the
//       stage's EMPTY barrier (count 8: lane 0 of each consumer warp) before refilling.
//   WG1, WG2 consumers (setmaxnreg.inc to 232): 64 query rows each (BLOCK_M = 128).
//       S = Q K^T:  wgmma m64n128k16, A = Q and B = K both from shared memory (K-major,
//                   128-byte swizzle descriptors), f32 accumulators (64 regs/thread); for
//                   a patch tiling A = Q from registers (loaded once per item).
//       O += P V:   wgmma m64nDk16, A = P from registers (the S accumulator layout repacked
//                   to bf16/fp16 pairs is exactly the A-fragment layout), B = V from shared
//                   memory as an MN-major (transposed) 128-byte-swizzle descriptor.
//       Intra-warpgroup pipelining (FA3): iteration t issues S(t+1) = Q K(t+1)^T and
//       O += P(t) V(t) (two commit groups), waits for the first (wait_group 1), masks +
//       softmaxes S(t+1), waits for the second (wait_group 0), repacks P(t+1) and rescales
//       O by the factors of S(t+1)'s softmax (patch tilings: only when a row max of the warp
//       grew by more than 2^8, FA4's lazy rescale). The two consumer warpgroups take turns to
//       issue their GEMMs (named barriers 4 and 5, turn_wait / turn_pass), so one's softmax
//       runs under the other's GEMMs. The descriptors of a turn's 16 wgmmas are warp-uniform
//       (uniform registers), made before the turn: a vector chain in front of each wgmma
//       costs 1.5-3 % (kernel notes, stage 11).
// Key tiles: BLOCK_N = 128 for both head dims. Stages: D = 64: 4, D = 128: 2.
// Shared memory (1 KiB-aligned base): Q[2 slots] | K[kStages] | V[kStages] | mbarriers |
// plan ints [2 slots].  A [rows][D] tile is stored as D/64 column blocks of [rows][64]
// elements (128 B per row), 16-byte chunk c of row r at r*128 + ((c ^ (r & 7)) << 4): the
// canonical SWIZZLE_128B layout (8-row atoms of 1024 B), which wgmma reads with
//   K-major (Q, K): start + 32 B per k16 step inside a column block, + rows*128 B per block,
//                   LBO (ignored) 16 B, SBO 1024 B (next 8-row group);
//   MN-major (V):   start + 2048 B per 16 keys, LBO = 128 keys * 128 B (next 64-wide block
//                   of head dim), SBO 1024 B (next 8 keys).
// TMA's box layout with CU_TENSOR_MAP_SWIZZLE_128B is exactly this layout (the 1 KiB-aligned
// destination makes the XOR pattern line up).
// Proxies: TMA writes and wgmma reads are both async-proxy, so the ring needs no fence. The
// epilogue's generic writes and reads of the Q slot (O staging) are followed by
// fence.proxy.async.shared::cta before the slot is released to the next Q TMA.
// ===========================================================================================

#if !defined(CMC_HOST)
// Cycle probe (tools/sm90_probe.py defines CMC_PROBE; timing diagnosis only). Lane 0 of the
// loader, the first plan builder and thread 0 of each consumer warpgroup add the clock64
// cycles of each wait and stage to their CTA's row of cmc_probe (16 counters each: producer
// (loader and builder slots), consumer 0, consumer 1; row = blockIdx.x % 256), by
// fire-and-forget atomics, so the probe holds no counters in registers.
#if defined(CMC_PROBE)
extern "C" {
__device__ unsigned long long cmc_probe[256 * 48];
}
#define CMC_PROBE_DECL(row, leader) const long long pr_t0_ = clock64(); \
  unsigned long long* const pr_row_ = cmc_probe + 48 * (blockIdx.x & 255) + 16 * (row); \
  const bool pr_lead_ = (leader)
#define CMC_PROBE_ADD(slot, v) do { if (pr_lead_) atomicAdd(pr_row_ + (slot), \
  (unsigned long long)(v)); } while (0)
#define CMC_PROBE(slot, stmt) do { const long long pr_t_ = clock64(); stmt; \
  CMC_PROBE_ADD(slot, clock64() - pr_t_); } while (0)
#define CMC_PROBE_COUNT(slot) CMC_PROBE_ADD(slot, 1)
#define CMC_PROBE_MARK(t) const long long t = clock64()
#define CMC_PROBE_SINCE(slot, t) CMC_PROBE_ADD(slot, clock64() - (t))
#define CMC_PROBE_FLUSH() CMC_PROBE_ADD(11, clock64() - pr_t0_)
#else
#define CMC_PROBE_DECL(row, leader)
#define CMC_PROBE_ADD(slot, v)
#define CMC_PROBE(slot, stmt) stmt
#define CMC_PROBE_COUNT(slot)
#define CMC_PROBE_MARK(t)
#define CMC_PROBE_SINCE(slot, t)
#define CMC_PROBE_FLUSH()
#endif

namespace cmc_sm90 {

constexpr int kBM = 128;        // query rows per CTA (2 consumer warpgroups x 64)
constexpr int kBN = 128;        // keys per tile
constexpr int kThreads = 384;   // producer WG + 2 consumer WGs
// Registers per thread after setmaxnreg. The CTA holds what the launch gave it, 168 per
// thread (__launch_bounds__(384, 1)), and setmaxnreg.inc waits until the producer's dec has
// freed enough of that, so the split must not exceed 384 x 168 (more hangs the consumers).
// A patch-tiled plan (box geometry, bit sets) needs more in the producer: 56 / 224.
constexpr int kLaunchRegs = 168;
template <int TILING> struct Regs {
  static constexpr int kProducer = TILING == 1 ? 56 : 40;
  static constexpr int kConsumer = TILING == 1 ? 224 : 232;
  static_assert(128 * kProducer + (kThreads - 128) * kConsumer <= kThreads * kLaunchRegs,
                "setmaxnreg split above the CTA's registers");
};

template <int D> struct Cfg {
  static constexpr int kStages = D == 64 ? 4 : 2;
  static constexpr int kQBytes = kBM * D * 2;
  static constexpr int kTile = kBN * D * 2;
  static constexpr int kQ = 0;                             // two Q slots (item parity)
  static constexpr int kK = 2 * kQBytes;
  static constexpr int kV = kK + kStages * kTile;
  static constexpr int kBar = kV + kStages * kTile;        // 8-byte mbarriers
  static constexpr int kNumBars = 6 + 4 * kStages;          // per slot Q/plan/empty, K/V ring
  static constexpr int kPlan = kBar + kNumBars * 8;         // two plans (item parity)
};
// Key tiles a patch-tiled plan can hold (one bit each; cmc.ir.MAX_KEY_TILES).
constexpr int kMaxKeyTiles = 4096;
constexpr int kMaxKeyWords = kMaxKeyTiles / 32;
// Ints of one tile plan. Linear tiling: term ranges [4 NT] | touched runs [2 NT] | full runs
// [2 NT] | nrun | nfull. Patch tiling: term ranges over the tile's hull of rows [4 NT] |
// touched key tiles [kMaxKeyWords bits] | full key tiles [kMaxKeyWords bits]. Both end with
// the item header [kItemInts]: qt (-1: no more items), h, b, and the builders' unit word.
constexpr int kItemInts = 4;
template <int NT, int TILING> constexpr int plan_ints() {
  return (TILING == 1 ? 4 * NT + 2 * kMaxKeyWords : 8 * NT + 2) + kItemInts;
}
// +1024: the kernel aligns its base up to 1 KiB itself (the swizzle atoms need it).
template <int D, int NT, int TILING> constexpr int smem_bytes() {
  return (Cfg<D>::kPlan + 2 * plan_ints<NT, TILING>() * 4 + 15) / 16 * 16 + 1024;
}
// Byte offset of 16-byte chunk c (0 <= c < D/8) of row r in a [rows][D] tile.
template <int ROWS> CMC_DEV unsigned swz(int r, int c) {
  return (unsigned)((c >> 3) * (ROWS * 128) + r * 128 + (((c & 7) ^ (r & 7)) << 4));
}

CMC_DEV unsigned smem_u32(const void* p) {
  unsigned r;
  asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(r) : "l"(p));
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
// 16-byte global store; plain C++ here was split into four 4-byte stores by ptxas.
CMC_DEV void st_global_v4(void* p, uint4 v) {
  asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"l"(p), "r"(v.x), "r"(v.y),
               "r"(v.z), "r"(v.w) : "memory");
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

// D[64 x 64] (+)= A[64 x 16] (shared, K-major) * B[16 x 64] (shared, K-major).
template <bool BF16> CMC_DEV void wgmma_ss_n64(float* d, unsigned long long da, unsigned long long db, int scale_d) {
  if constexpr (BF16) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
                 "{"
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
                 "}, %32, %33, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
                   "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                   "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                 : "l"(da), "l"(db), "r"(scale_d));
  } else {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
                 "{"
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
                 "}, %32, %33, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
                   "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                   "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                 : "l"(da), "l"(db), "r"(scale_d));
  }
}
// D[64 x 64] += A[64 x 16] (registers) * B[16 x 64] (shared, MN-major: imm-trans-b 1).
template <bool BF16> CMC_DEV void wgmma_rs_n64(float* d, const unsigned* a, unsigned long long db, int scale_d) {
  if constexpr (BF16) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
                 "{"
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
                 "}, {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
                   "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                   "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d));
  } else {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
                 "{"
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
                 "}, {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
                   "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                   "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d));
  }
}
// D[64 x 128] (+)= A[64 x 16] (shared, K-major) * B[16 x 128] (shared, K-major).
template <bool BF16> CMC_DEV void wgmma_ss_n128(float* d, unsigned long long da, unsigned long long db, int scale_d) {
  if constexpr (BF16) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
                 "{"
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
                 "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
                 "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
                 "}, %64, %65, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
                   "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                   "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
                   "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
                   "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
                   "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
                   "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                 : "l"(da), "l"(db), "r"(scale_d));
  } else {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 "
                 "{"
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
                 "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
                 "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
                 "}, %64, %65, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
                   "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                   "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
                   "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
                   "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
                   "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
                   "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                 : "l"(da), "l"(db), "r"(scale_d));
  }
}
// D[64 x 128] (+)= A[64 x 16] (registers) * B[16 x 128] (shared; TB 1: MN-major, V; TB 0:
// K-major, K).
template <bool BF16, int TB = 1>
CMC_DEV void wgmma_rs_n128(float* d, const unsigned* a, unsigned long long db, int scale_d) {
  if constexpr (BF16) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
                 "{"
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
                 "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
                 "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
                 "}, {%64, %65, %66, %67}, %68, p, 1, 1, %70;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
                   "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                   "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
                   "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
                   "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
                   "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
                   "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d), "n"(TB));
  } else {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 "
                 "{"
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
                 "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
                 "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
                 "}, {%64, %65, %66, %67}, %68, p, 1, 1, %70;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
                   "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                   "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
                   "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
                   "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
                   "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
                   "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d), "n"(TB));
  }
}

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

// Tile plan of query rows [qa, qb] into p (8 NT + 2 ints) by the plan builders
// (btid < kBuilders; named barrier 3 among them).
template <class H>
CMC_DEV void build_plan(const typename H::seq_t& seq, int qa, int qb, int* p, int btid) {
  constexpr int NT = H::kTerms;
  for (int i = btid; i < NT; i += kBuilders) H::term(seq, qa, qb, i, p + 4 * i);
  producer_bar();
  for (int i = btid; i < NT; i += kBuilders) cmc_plan_place(p, NT, i, kBN);
  producer_bar();
  if (btid == 0) cmc_plan_merge(p, NT, kBN);
  producer_bar();
}

// Patch-tiled plan of query tile qt into p (plan_ints<NT, 1>() ints) by nb threads
// (btid < nb; named barrier 3): the term ranges over the tile's hull of rows [qa, qb] (full
// ranges, and the consumers' test of which terms can touch a key tile), the key tiles
// touched by some row of the tile (per box of PW consecutive rows, so a grid row of the patch
// is never widened to the hull) and, of those, the full ones: a touched tile stays full
// unless one of its boxes (one work item per tile and box) lies past len or outside every
// full range.
template <class H>
CMC_DEV void build_plan_patch(const typename H::seq_t& seq, const cmc_patch_geo& g, int qt,
                              int qa, int qb, int* p, int btid, int nb) {
  constexpr int NT = H::kTerms, PH = H::kPatchRows, PW = H::kPatchCols;
  unsigned* touched = reinterpret_cast<unsigned*>(p + 4 * NT);
  unsigned* full = touched + kMaxKeyWords;
  const int len = seq.len, nw = (g.nqt + 31) >> 5;
  for (int i = btid; i < NT; i += nb) H::term(seq, qa, qb, i, p + 4 * i);
  for (int w = btid; w < nw; w += nb) touched[w] = 0u;
  builders_bar(nb);
  const int nbox = qt < g.nlin ? 1 : PH;  // a linear tile is its own hull
  for (int x = btid; x < NT * nbox; x += nb) {
    const int i = x / nbox, b = x - i * nbox;
    if (nbox == 1) {
      cmc_patch_mark(touched, g, p[4 * i], p[4 * i + 1]);
      continue;
    }
    const int s = cmc_patch_box(g, qt, b);
    if (s >= len) continue;
    int r4[4];
    H::term(seq, s, s + PW - 1 < len - 1 ? s + PW - 1 : len - 1, i, r4);
    cmc_patch_mark(touched, g, r4[0], r4[1]);
  }
  builders_bar(nb);
  for (int w = btid; w < nw; w += nb) full[w] = touched[w];
  builders_bar(nb);
  for (int x = btid; x < g.nqt * PH; x += nb) {
    const int t = x / PH, b = x - t * PH;
    if (!((touched[t >> 5] >> (t & 31)) & 1u)) continue;
    const int s = cmc_patch_box(g, t, b);
    bool in = s + PW <= len;
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
  // or -1 if it has none
  CMC_DEV int tile(int u, int half, int& h, int& b) const {
    int bh, qt;
    if (dyn) {
      if (half == 1) return -1;
      const int g = u / (group * nqt), r = u - g * group * nqt;
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

// Query tile qt of a sequence: its hull of rows [qa, qb] (qb < len), or false when it holds
// no row (past the sequence's last tile, or a patch wholly past len).
template <bool PATCH>
CMC_DEV bool tile_rows(const cmc_patch_geo& g, int len, int qt, int& qa, int& qb) {
  if constexpr (PATCH) {
    if (qt >= g.nqt) return false;
    qa = cmc_patch_box(g, qt, 0);
    const int e = cmc_patch_box(g, qt, g.PH - 1) + g.PW - 1;
    qb = e < len - 1 ? e : len - 1;
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
  static_assert(!kPatch || (kPH * kPW == kBM && kPW >= 8 && H::kGridOrigin % kBM == 0 &&
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
      f.qt = sc.tile(u, half, f.h, f.b);
      if (f.qt < 0) continue;
      const typename H::seq_t fs = H::seq(desc, f.b);
      int fa, fb;
      if (tile_rows<kPatch>(geo(fs.len), fs.len, f.qt, fa, fb)) return true;
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
  // per slot x (item parity): Q full (1 arrival + the TMA bytes), plan full (128 producer
  // threads), slot empty (8 consumer warps, after the epilogue); then the K/V ring.
  auto bar_qfull = [&](int x) { return bars + 8 * x; };
  auto bar_plan = [&](int x) { return bars + 8 * (2 + x); };
  auto bar_slot = [&](int x) { return bars + 8 * (4 + x); };
  auto bar_kfull = [&](int s) { return bars + 8 * (6 + s); };
  auto bar_kempty = [&](int s) { return bars + 8 * (6 + S + s); };
  auto bar_vfull = [&](int s) { return bars + 8 * (6 + 2 * S + s); };
  auto bar_vempty = [&](int s) { return bars + 8 * (6 + 3 * S + s); };
  auto plan_of = [&](int x) { return reinterpret_cast<int*>(smem + C::kPlan) + x * kPlanInts; };

  if (tid == 0) {
    for (int x = 0; x < 2; ++x) {
      mbar_init(bar_qfull(x), 1);
      mbar_init(bar_plan(x), kBuilders);
      mbar_init(bar_slot(x), 8);
    }
    for (int s = 0; s < S; ++s) {
      mbar_init(bar_kfull(s), 1);
      mbar_init(bar_kempty(s), 8);
      mbar_init(bar_vfull(s), 1);
      mbar_init(bar_vempty(s), 8);
    }
    // mbarrier inits must be visible to the async proxy (TMA's complete_tx) too
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    tma_prefetch_map(maps.q);
    tma_prefetch_map(maps.k);
    tma_prefetch_map(maps.v);
  }
  __syncthreads();  // publishes the mbarrier inits

  const int wg = __shfl_sync(0xffffffffu, tid >> 7, 0);  // warp-uniform for ptxas (uniform registers)
  if (wg == 0) {
    // ======================================================================= producer
    setmaxnreg_dec<Regs<H::kTiling>::kProducer>();
    const int ptid = tid, lane = tid & 31;
    int stage = 0, n = 0;
    unsigned phase = 0;
    CMC_PROBE_DECL(0, ptid == 0 || ptid == 32);  // the loader's lane 0, the first builder
    if (ptid >= 32) {
      // plan builders: they pick the items (Sched::next), up to two ahead of the loader
      // (the slots), and publish each in its plan's item header
      int u = blockIdx.x, half = 0;
      int held = desc.sched != 0 && ptid == 32 ? Sched::fetch(desc.sched) : 0;
      for (;;) {
        const int x = n & 1;
        const unsigned use = (unsigned)(n >> 1) & 1u;
        ++n;
        int* plan = plan_of(x);
        int* item = plan + kPlanInts - kItemInts;
        CMC_PROBE(6, mbar_wait(bar_slot(x), use ^ 1u));  // consumers done with its last item
        CMC_PROBE_MARK(pr_build_);
        Item it;
        int qa = 0, qb = 0;
        bool found = false;
        typename H::seq_t seq;
        cmc_patch_geo g;
        while (!found) {
          if (half == 2) {
            u = sc.next(desc.sched, u, item + 3, ptid == 32, held, units);
            half = 0;
          }
          if (u >= units) break;
          it.qt = sc.tile(u, half++, it.h, it.b);
          if (it.qt < 0) continue;
          seq = H::seq(desc, it.b);
          g = geo(seq.len);
          found = tile_rows<kPatch>(g, seq.len, it.qt, qa, qb);
        }
        if (!found) {
          if (ptid == 32) {
            item[0] = -1;
            sc.finish(desc.sched);
          }
          mbar_arrive(bar_plan(x));
          break;
        }
        if (n == 1) CMC_PROBE_ADD(13, pr_build_ - pr_t0_);  // launch to the first build
        // the consumers help with the first plan when it is of the CTA's first unit
        // (first_item: fetched units are >= gridDim.x)
        if constexpr (kPatch)
          build_plan_patch<H>(seq, g, it.qt, qa, qb, plan, ptid - 32,
                              n == 1 && u == (int)blockIdx.x ? kHelpers : kBuilders);
        else build_plan<H>(seq, qa, qb, plan, ptid - 32);
        if (ptid == 32) {
          item[0] = it.qt;
          item[1] = it.h;
          item[2] = it.b;
        }
        CMC_PROBE_SINCE(7, pr_build_);
        if (n == 1) CMC_PROBE_SINCE(12, pr_build_);  // the first build
        CMC_PROBE_COUNT(8);
        mbar_arrive(bar_plan(x));
      }
    }
    else for (;;) {
      // the loader warp: lane 0 waits and arms the barriers, the lanes issue the copies
      const int x = n & 1;
      const unsigned use = (unsigned)(n >> 1) & 1u;
      ++n;
      const int* plan = plan_of(x);
      CMC_PROBE(0, mbar_wait(bar_plan(x), use));  // the plan, so the slot, is ready
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
      load(base + C::kQ + x * C::kQBytes, maps.q, bar_qfull(x), C::kQBytes, it.h, it.qt);
      WalkT wk;
      start_walk<NT>(wk, plan, g);
      while (wk.j >= 0) {
        CMC_PROBE(2, mbar_wait(bar_kempty(stage), phase ^ 1));
        CMC_PROBE(4, load(sK + stage * C::kTile, maps.k, bar_kfull(stage), C::kTile, hkv, wk.j));
        CMC_PROBE(3, mbar_wait(bar_vempty(stage), phase ^ 1));
        CMC_PROBE(4, load(sV + stage * C::kTile, maps.v, bar_vfull(stage), C::kTile, hkv, wk.j));
        CMC_PROBE_COUNT(9);
        CMC_PROBE(5, wk.next());
        if (++stage == S) { stage = 0; phase ^= 1; }
      }
    }
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
      mbar_wait(bar_plan(x), use);
      CMC_PROBE_SINCE(0, pr_plan_);
      if (n == 1) CMC_PROBE_SINCE(12, pr_plan_);  // the first item's plan (cold start)
      read_item(plan_of(x) + kPlanInts - kItemInts, it);
    };
    if constexpr (kPatch) {  // the CTA's first plan: help the builders (see builders_bar)
      Item f;
      if (first_item(f)) {
        const typename H::seq_t fs = H::seq(desc, f.b);
        const cmc_patch_geo fg = geo(fs.len);
        int fa, fb;
        tile_rows<kPatch>(fg, fs.len, f.qt, fa, fb);
        build_plan_patch<H>(fs, fg, f.qt, fa, fb, plan_of(0), kBuilders + cw * 128 + ctid,
                            kHelpers);
      }
    }
    for (take(); it.qt >= 0; take()) {
      const int* plan = plan_of(x);
      const typename H::seq_t seq = H::seq(desc, it.b);
      const int len = seq.len;
      const cmc_patch_geo g = geo(len);
      int qa, qb;
      tile_rows<kPatch>(g, len, it.qt, qa, qb);
      const cmc_i64 tok0 = seq.tok0;
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
      CMC_PROBE(1, mbar_wait(bar_qfull(x), use));  // also before the epilogue reuses the Q slot

      if (wk.j >= 0) {
        float s[64];
        unsigned p[32];
        const unsigned sq = sQx + cw * 64 * 128;
        unsigned qf[kQr ? D / 4 : 1];
        if constexpr (kQr) load_q<D>(qf, sq, warp, lane);

        // Mask (partial tiles only) + online softmax of S in place (S becomes P in fp32);
        // returns the rescale factors of the running O and l.
        auto apply_bits = [&](unsigned bits0, unsigned bits1) {
#pragma unroll
          for (int n2 = 0; n2 < 16; ++n2) {
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              if (!((bits0 >> (e * 16 + n2)) & 1u)) s[4 * n2 + e] = neg_inf();
              if (!((bits1 >> (e * 16 + n2)) & 1u)) s[4 * n2 + 2 + e] = neg_inf();
            }
          }
        };
        const int off = 2 * (lane & 3);
        // A key tile of 128 consecutive keys from k0: OR the exact spans of the terms touching
        // it (touched ranges of the plan) into column bits, or evaluate visible() per element
        // when one of them has a residual.
        auto mask_linear = [&](int k0) {
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
          if constexpr (kPatch) {
            // the grid families give one span per key grid row the tile meets (a grid row
            // per tile when the grid width is 128 and the origin tile-aligned), instead of
            // one per instance; the other terms as below
            const int k1 = (k0 + kBN < len ? k0 + kBN : len) - 1 - H::kGridOrigin;
            if (k1 >= 0) {
              const int ky0 = k0 > H::kGridOrigin ? (k0 - H::kGridOrigin) / H::kGridWidth : 0;
              for (int ky = ky0; ky <= k1 / H::kGridWidth; ++ky) {
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
          if (exact) {
            apply_bits(bits0, bits1);
          } else {
            const int kbase = k0 + off;
#pragma unroll
            for (int n2 = 0; n2 < 16; ++n2) {
#pragma unroll
              for (int e = 0; e < 2; ++e) {
                const int k = kbase + n2 * 8 + e;
                const bool in = k < len;
                if (!(in && H::visible(seq, rc0, k))) s[4 * n2 + e] = neg_inf();
                if (!(in && H::visible(seq, rc1, k))) s[4 * n2 + 2 + e] = neg_inf();
              }
            }
          }
        };
        // A patch key tile (patch tilings are exact): box b holds keys [kb + b W, + PW), the
        // columns b PW ..; each grid family gives the one span of each box's grid row, the
        // other terms their spans cut to each box.
        auto mask_patch = [&](int j) {
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
        };
        // The per-offset tile mask of key tile j when the tile stage proved one
        // (H::kPatchMasks): fetched as the walk reaches j, so that the load runs under j's
        // QK GEMM; mw_ok: the softmax of j applies it instead of the spans.
        cmc_uint2 mw = {0u, 0u};
        bool mw_ok = false;
        auto fetch_mask = [&](int j) {
          if constexpr (kPatch && H::kPatchMasks != 0) {
            const int c = cmc_patch_mask_class(g, it.qt, j, len, H::kMaskDyLo, H::kMaskDyN,
                                               H::kMaskDxLo, H::kMaskDxN);
            mw_ok = c >= 0;
            if (mw_ok) mw = __ldg(H::patch_masks() + c * 256 + cw * 128 + ctid);
          }
          (void)j;
        };
        int f = 0;
        bool grow = true;  // the last softmax moved the offsets: O owes the rescale c0, c1

        // Mask (partial tiles only) + online softmax of S in place (S becomes P in fp32);
        // returns the rescale factors of the running O and l.
        auto softmax = [&](int j, float& c0, float& c1) {
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
        };
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
        CMC_PROBE(2, mbar_wait(bar_kfull(stage), phase));
        CMC_PROBE(4, turn_wait(cw));
        wg_fence();
        issue_qk<BF16, D, kQr>(s, sq, qf, sK + stage * C::kTile);
        wg_commit();
        turn_pass(cw);
        CMC_PROBE(5, wg_wait<0>());
        fence_regs<64>(s);
        release(bar_kempty(stage));
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
          CMC_PROBE(2, mbar_wait(bar_kfull(ns), nph));      // K(next)
          CMC_PROBE(3, mbar_wait(bar_vfull(stage), phase));  // V(cur)
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
          release(bar_kempty(ns));
          CMC_PROBE(8, softmax(wk.j, c0, c1));
          fence_regs<64>(s);
          CMC_PROBE(6, wg_wait<0>());
          fence_regs<kO>(o);
          fence_regs<32>(p);
          release(bar_vempty(stage));
          repack();
          if (grow) rescale_o(c0, c1);  // FA4's place: after the PV wait, out of the turn window
          stage = ns;
          phase = nph;
        }
        CMC_PROBE(3, mbar_wait(bar_vfull(stage), phase));
        CMC_PROBE(4, turn_wait(cw));
        wg_fence();
        fence_regs<kO>(o);
        fence_regs<32>(p);
        issue_pv<BF16, D>(o, p, sV + stage * C::kTile);
        wg_commit();
        turn_pass(cw);
        CMC_PROBE(6, wg_wait<0>());
        fence_regs<kO>(o);
        release(bar_vempty(stage));
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
        if (row0 < len) lse[row0] = l0 > 0.f ? (m0 * sl2 + lg2(l0)) * kLn2 : neg_inf();
        if (row1 < len) lse[row1] = l1 > 0.f ? (m1 * sl2 + lg2(l1)) * kLn2 : neg_inf();
      }
      wg_bar_sync(cw);  // every warp of this WG is past its last wgmma
#pragma unroll
      for (int d = 0; d < kO / 4; ++d) {  // fragment d: columns 8d + 2 (lane & 3) ..
        const unsigned w0 = pack2<BF16>(o[4 * d + 0] * inv0, o[4 * d + 1] * inv0);
        const unsigned w1 = pack2<BF16>(o[4 * d + 2] * inv1, o[4 * d + 3] * inv1);
        const unsigned off = (unsigned)((lane & 3) * 4);
        *reinterpret_cast<unsigned*>(gQx + swz<kBM>(lrow, d) + off) = w0;
        *reinterpret_cast<unsigned*>(gQx + swz<kBM>(lrow + 8, d) + off) = w1;
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
      release(bar_slot(x));  // this warp's reads of the slot (plan, Q / O staging) are done
#pragma unroll
      for (int i = 0; i < kPer; ++i) {
        const int ch = (ctid + 128 * i) % kChunks;
        if (orow[i] < len) st_global_v4(og + (cmc_i64)orow[i] * desc.o_stride_tok + ch * 8, ov[i]);
      }
      CMC_PROBE_SINCE(7, pr_epi_);
    }
    CMC_PROBE_FLUSH();
  }
}


}  // namespace cmc_sm90
#endif  // !CMC_HOST
