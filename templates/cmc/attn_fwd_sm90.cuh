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
// H::visible(s, r, k) && k < len per element, unless the tile stage proved the mask a
// function of q - k (H::kOffsetMasks: one 8-byte load of the tile offset's mask bits).
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
//   WG0 producer (setmaxnreg.dec to 40, Regs): warps 1-3 build each item's tile plan (named
//       barrier 3, 96 threads) as soon as the item's slot is free, up to two items ahead
//       (a patch tiling's first plan of a CTA: with both consumer warpgroups, 352 threads);
//       warp 0, the loader, waits for the plan and copies the Q tile [128 x D] and, for every
//       walked key tile j (plan order), K(j) and V(j) into a kStages-deep ring by TMA (one
//       64 x 1 x 128 box per 128-byte column block, or a patch's PH boxes per block; the
//       lanes issue the boxes). Each FULL barrier (count 1) gets an arrive.expect_tx of the
//       tile's bytes from lane 0 and completes when the TMA has written them. It waits on the
//       stage's EMPTY barrier (count 8: lane 0 of each consumer warp) before refilling.
//   WG1, WG2 consumers (setmaxnreg.inc to 232, Regs): 64 query rows each (BLOCK_M = 128).
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
// the probe state (CMC_PROBE_DECL's) as the last parameters / arguments of a part of fwd()
#define CMC_PROBE_PARAMS , const long long pr_t0_, unsigned long long* const pr_row_, \
  const bool pr_lead_
#define CMC_PROBE_ARGS , pr_t0_, pr_row_, pr_lead_
// ... and as the last members of a closure struct (initialised by CMC_PROBE_ARGS)
#define CMC_PROBE_MEMBERS const long long pr_t0_; unsigned long long* const pr_row_; \
  const bool pr_lead_;
#else
#define CMC_PROBE_DECL(row, leader)
#define CMC_PROBE_ADD(slot, v)
#define CMC_PROBE(slot, stmt) stmt
#define CMC_PROBE_COUNT(slot)
#define CMC_PROBE_MARK(t)
#define CMC_PROBE_SINCE(slot, t)
#define CMC_PROBE_FLUSH()
#define CMC_PROBE_PARAMS
#define CMC_PROBE_ARGS
#define CMC_PROBE_MEMBERS
#endif

namespace cmc_sm90 {

constexpr int kBM = 128;        // query rows per CTA (2 consumer warpgroups x 64)
constexpr int kBN = 128;        // keys per tile
constexpr int kThreads = 384;   // producer WG + 2 consumer WGs
// Registers per thread after setmaxnreg. The CTA holds what the launch gave it, 168 per
// thread (__launch_bounds__(384, 1)), and setmaxnreg.inc waits until the producer's dec has
// freed enough of that, so the split must not exceed 384 x 168 (more hangs the consumers).
// ptxas allocates each region within its budget, so the split decides where spills happen:
// the build chooses it per kernel (cmc/kernels.py, SM90_REG_SPLITS: the first candidate
// without local memory) and passes it as -DCMC_SM90_REGS_PRODUCER=P
// -DCMC_SM90_REGS_CONSUMER=C; without them, the first candidate of the tiling: 40 / 232
// linear, 56 / 224 patch (a patch-tiled plan's box geometry and bit sets need more).
constexpr int kLaunchRegs = 168;
template <int TILING> struct Regs {
#if defined(CMC_SM90_REGS_PRODUCER) && defined(CMC_SM90_REGS_CONSUMER)
  static constexpr int kProducer = CMC_SM90_REGS_PRODUCER;
  static constexpr int kConsumer = CMC_SM90_REGS_CONSUMER;
#else
  static constexpr int kProducer = TILING == 1 ? 56 : 40;
  static constexpr int kConsumer = TILING == 1 ? 224 : 232;
#endif
  static_assert(128 * kProducer + (kThreads - 128) * kConsumer <= kThreads * kLaunchRegs,
                "setmaxnreg split above the CTA's registers");
  static_assert(kProducer % 8 == 0 && kConsumer % 8 == 0 && kProducer >= 24 &&
                kConsumer <= 256, "setmaxnreg counts are multiples of 8 in [24, 256]");
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

}  // namespace cmc_sm90
#endif  // !CMC_HOST
