// ===========================================================================================
// cmc sm_90a backward: the warp-specialised dK / dV kernel. Hand-written. Placed after
// attn_bwd_sm90.cuh. Two ways in: the kind bwd_kv_sm90_ws (--bwd-kernel ws) launches
// kv_ws_entry, with the Q and dO tensor maps as its second launch parameter; the experiment
// CMC_BWD_KV_WS 1 (tools/bwd_ablate.py ws) makes kv() call kv_ws_entry with the maps of the
// module global cmc_kv_maps the host writes (as CMC_BWD_KV_TMA). Templates only: a build
// that instantiates neither emits no code from this part. Same semantics as kv /
// kv_patch; kv_ws takes Q and dO by TMA, kv_patch_ws gathers rows by token with cp.async from
// two loader warps (warps 0 and 3, one per stage); both add an item's dQ by TMA boxes where its
// rows are runs of consecutive tokens (64 rows, or patch rows).
//
// Why (docs/kernel-notes.md, "The warp-specialised kv"): kv's item loop runs both warpgroups
// in lockstep behind one CTA barrier per item, issues the next item's copies from the
// compute warps (noload: 13 % of the kernel) and waits for all of an item's GEMMs before its
// dQ adds, so the adds (nored: 27 %) never overlap a GEMM. This is FA3's layout of the same
// GEMMs:
//   WG0 (setmaxnreg 24): warp 0 walks the transposed plan and loads each item into a ring
//        of 2 stages: Q, dO by TMA (thread 0), LSE and Dsum by cp.async (32 lanes, whose
//        completion arrives on the stage's full barrier: cp.async.mbarrier.arrive.noinc);
//        warps 1, 2 add the dQ partials of consumer warpgroups 0, 1 to dq_accum from a
//        staging buffer in shared memory: two TMA tensor reduce-adds (dq_accum's map) when
//        the item's 64 query rows are consecutive tokens, else one cp.reduce.async.bulk per
//        query row; with dq_accum in blocks (CMC_DQ_BLOCK64) one 16 KiB bulk add per item.
//   WG1, WG2 (setmaxnreg 240): kv's item per warpgroup, reordered: S^T, dP^T; P^T; dV;
//        dS^T; dS^T to shared memory (2 buffers) and one barrier of the 256 consumers; then
//        dQ before dK, so the dQ partial's trip to the staging runs under the dK GEMM; the
//        stage is released (empty barrier, one arrival per warp) after dK.
// Barriers: 0 = __syncthreads (before the roles split); 1, 2 = a consumer warpgroup's own
// (store_acc; D = 64's dS^T); 3 = both consumer warpgroups (dS^T at D = 128, the end);
// 4 + w / 6 + w = staging w full / empty (consumer warpgroup w's 128 threads + its writer
// warp's 32).
// ===========================================================================================
#if !defined(CMC_HOST)
#ifndef CMC_WS_DQ_RED
#define CMC_WS_DQ_RED 0  // 1: the dQ writers add by red.global.add.v4.f32 (bwd_ablate wsred)
#endif
#ifndef CMC_WS_LSE_REGS
#define CMC_WS_LSE_REGS 1  // an item's LSE read into registers under its S^T GEMM (0: bwd_ablate wsnolse)
#endif
#ifndef CMC_WS_STG_XOR
// 1 (bwd_ablate wsstg): the swizzled dQ staging's 16 addresses from one per-thread base, the
// 128-byte swizzle applied by XOR immediates (the same bytes, the same layout)
#define CMC_WS_STG_XOR 0
#endif
#ifndef CMC_WS_LSE_FIRST
// 1: a linear item's LSE offsets read before its S^T and dP^T are issued, not under them (run
// 29's ncu: the loads had not landed when S^T was done; run 50 on an H100: the old order's
// atomic causal backward 7.6 % longer at 4K x 8, 8.4 % at 16K x 2). 0: under them (bwd_ablate wslselate; the build's spill
// fallback for this kind, kernels.py: natten2d's d128 kv spills 8 B with the LSE first)
#define CMC_WS_LSE_FIRST 1
#endif
#ifndef CMC_WS_DSUM_REGS
// 1 (bwd_ablate wsdsumregs): a linear item's Dsum read into registers once its P is made (the
// LSE offsets' registers are dead then), before dV is issued, not after the dP^T wait (run
// 28's ncu: 11 K stall samples on the first use of the loads after that wait; run 51 on an
// H100, with the block layout: the kv 2.4 % shorter at causal 4K x 8 in one pair, 0.7-5.1 % at
// 16K x 2; its --check not run yet, so off)
#define CMC_WS_DSUM_REGS 0
#endif
#ifndef CMC_WS_LSE_FIRST_PATCH
// the same for patch items: off (run 50: no gain on CLEAR's patches)
#define CMC_WS_LSE_FIRST_PATCH 0
#endif
#ifndef CMC_WS_STSM
#define CMC_WS_STSM 1  // dS^T to shared memory by stmatrix, FA3 / FA4's way (0: bwd_ablate wsnostsm)
#endif
#ifndef CMC_WS_PATCH_TMA
// 1: the patch loaders bring an item whose 64 rows all have tokens as TMA boxes of one patch
// row (lane b issues run b's), not as 2 x 64 rows of cp.async chunks (0: bwd_ablate wspcp;
// kernel notes, "A TMA patch loader for the ws kv": the kv 1.27-1.39 x faster on CLEAR)
#define CMC_WS_PATCH_TMA 1
#endif
#ifndef CMC_WS_FUSE_POST
// 1 (prototype, bwd_ablate wsfuse): the linear ws kv converts dQ itself, post's work, so the
// atomic sequence is pre, kv (ws_post_fused; kernel notes "Run 22": post is 0.15 ms of 1.2 at
// causal 1K x 32)
#define CMC_WS_FUSE_POST 0
#endif
#ifndef CMC_WS_HEAVY_FIRST
// 1 (emit defines it where the transposed hooks name heavy key tiles, HT::kHeavyTiles > 0,
// unless cmc compile --kv-heavy-from off): with cmc_bwd_args.flags bit 1 (the launcher's, from
// the manifest's backward.kv_order) the ws kv kinds take their tile from ws_kv_cta; 0: blockIdx
#define CMC_WS_HEAVY_FIRST 0
#endif
#ifndef CMC_WS_PERSIST
// 1 (prototype, bwd_ablate wspers): the linear ws kv is persistent, a CTA per SM taking key
// tiles from a counter (kv_ws_persist; kernel notes "A persistent kv"); 2: dK, dV stored from
// registers (wspers2)
#define CMC_WS_PERSIST 0
#endif
#ifndef CMC_WS_DQ_LAG
// 1 (bwd_ablate wslag): at D = 128 a consumer warpgroup computes item n - 1's dQ inside item n,
// right after its dS (ws_item_end_lag), so the two warpgroups no longer meet at a 256-thread
// barrier per item: each only waits for the other's dS^T of the item before, a whole item
// earlier (named barriers 9 + 2 w + parity, arrive / sync, so neither holds the other); 2
// (wslagpp): and the warpgroups take turns to issue their GEMMs, two blocks an item (S^T, dP^T;
// then dQ(n - 1), dV, dK, all after dS), as the forward's ping-pong (named barriers 13, 14), so
// one's P and dS run under the other's GEMMs
#define CMC_WS_DQ_LAG 0
#endif
#if CMC_WS_DQ_LAG && (CMC_WS_PERSIST || CMC_WS_FUSE_POST)
#error "CMC_WS_DQ_LAG: the one-tile kv only (barrier 8 and the persistent ring are not counted)"
#endif
#ifndef CMC_WS_KV_TMA
// 1 (bwd_ablate wskvtma): kv_ws's K, V by TMA boxes from thread 0 (the tile crossing len by
// cp.async as before), waited for by the consumers only, so the loader's first items go out
// beside them
#define CMC_WS_KV_TMA 0
#endif
#ifndef CMC_WS_PERSIST_KVTMA
#define CMC_WS_PERSIST_KVTMA 0  // 1: the persistent kv's K / V by TMA boxes (bwd_ablate wsperst)
#endif
#ifndef CMC_WS_PERSIST_LPT
// 1 (bwd_ablate wspersl): the persistent kv's units costliest first within groups of
// (sequence, kv head)s whose Q and dO fit in L2 together (the forward's Sched): group by group,
// key tile ascending (a causal-like mask's longest first), then (sequence, kv head); the CTAs'
// last units are short, so reserving a tile ahead leaves no long tile for the end
#define CMC_WS_PERSIST_LPT 0
#endif
namespace cmc_bwd_sm90 {

// Four 8 x 8 b16 matrices of the accumulator fragment layout (register i: matrix i, rows lane /
// 4, columns 2 (lane % 4) ..) to shared memory; lane 8 i + j gives matrix i's row j address.
CMC_DEV void ws_stmatrix_x4(unsigned addr, unsigned r0, unsigned r1, unsigned r2, unsigned r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(r0), "r"(r1),
               "r"(r2), "r"(r3) : "memory");
}
CMC_DEV void ws_bar_sync(int id, int n) { asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory"); }
CMC_DEV void ws_bar_arrive(int id, int n) { asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(n) : "memory"); }
CMC_DEV void ws_arrive(unsigned bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// Arrives on bar once this thread's earlier cp.async copies have landed (the barrier's count
// includes it: .noinc).
CMC_DEV void ws_cp_arrive(unsigned bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}
#if defined(CMC_SM90_WATCHDOG)
// Set when a wait gave up (tools/bwd_ablate.py reads it after its runs).
__device__ unsigned cmc_ws_watchdog;
CMC_DEV unsigned ws_try_wait(unsigned bar, unsigned parity) {
  unsigned ok;
  asm volatile(
      "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }\n"
      : "=r"(ok) : "r"(bar), "r"(parity) : "memory");
  return ok;
}
#endif
// Blocks until the phase of the given parity has completed (kv_mbar_wait); true. With
// CMC_SM90_WATCHDOG (bwd_ablate defines it) a wait of more than 2^22 polls gives up instead:
// false, and cmc_ws_watchdog is set; the roles then wind down (the loader stops, the
// consumers take it for the end item), so a protocol error ends the kernel with wrong
// results, not a hung GPU. (A trap there, as the forward's watchdog does, made ptxas ignore
// the consumers' setmaxnreg: 168 registers, 990 bytes of spills, the wgmmas serialised;
// NVRTC 13.0, 2026-12-05.)
CMC_DEV bool ws_wait(unsigned bar, unsigned parity) {
#if defined(CMC_SM90_WATCHDOG)
  unsigned n = 0;
  for (; !ws_try_wait(bar, parity) && n < (1u << 22); ++n) {
  }
  if (n < (1u << 22)) return true;
  cmc_ws_watchdog = 1u;
  return false;
#else
  kv_mbar_wait(bar, parity);
  return true;
#endif
}
// Cycle probe of the ws roles (tools/bwd_ablate.py wsprobe defines CMC_WS_PROBE; timing
// diagnosis only, the gradients stay right). Thread 0 of each consumer warpgroup, lane 0 of each
// dQ writer and of the loaders add the clock cycles of each phase of an item (CMC_WS_LAP: since
// the last lap) to their CTA's row of cmc_ws_probe (32 counters, row blockIdx.x % 256) by
// fire-and-forget atomics; slots: WsProbe. Without the macro every kernel is byte-identical.
enum WsProbe : int {
  kPrFull = 0, kPrIssue, kPrWord, kPrWaitS, kPrP, kPrDvDs, kPrDsSt, kPrBar, kPrIssueDqDk, kPrWaitDq,
  kPrStgWait, kPrStage, kPrWaitDk, kPrItems, kPrLoop,
  kPrFirstFull,  // the full wait of a warpgroup's first item (also in the full slot)
  kPrWrFull = 16, kPrWrAdd, kPrWrItems,
  kPrLdEmpty = 20, kPrLdIssue, kPrLdItems,
  kPrPrologue = 24, kPrEpilogue, kPrCtas,
  kPrTileTop = 27, kPrKvWait, kPrTiles, kPrKvLoad  // the persistent kv's (kv_ws_persist)
};
#if defined(CMC_WS_PROBE)
extern "C" {
__device__ unsigned long long cmc_ws_probe[256 * 32];
}
// 32-bit clock laps and no row pointer kept: the loader runs in 24 registers
#define CMC_WS_ROW_ (cmc_ws_probe + 32 * (blockIdx.x & 255))
#define CMC_WS_PROBE_DECL(lead) unsigned pr_t_ = (unsigned)clock(); const bool pr_lead_ = (lead)
#define CMC_WS_ADD(slot, v) do { if (pr_lead_) atomicAdd(CMC_WS_ROW_ + (slot), (unsigned long long)(v)); } while (0)
#define CMC_WS_LAP(slot) do { const unsigned pr_n_ = (unsigned)clock(); CMC_WS_ADD(slot, pr_n_ - pr_t_); \
  pr_t_ = pr_n_; } while (0)
#define CMC_WS_COUNT(slot) CMC_WS_ADD(slot, 1)
// a lap added to slot, and to slot2 too when also
#define CMC_WS_LAP2(slot, slot2, also) do { const unsigned pr_n_ = (unsigned)clock(); \
  CMC_WS_ADD(slot, pr_n_ - pr_t_); if (also) CMC_WS_ADD(slot2, pr_n_ - pr_t_); pr_t_ = pr_n_; } while (0)
#define CMC_WS_MARK(t) const unsigned t = (unsigned)clock()
#define CMC_WS_SINCE(slot, t) CMC_WS_ADD(slot, (unsigned)clock() - (t))
// the probe state as the last parameters / arguments of a part of a role
#define CMC_WS_PROBE_PARAMS , unsigned& pr_t_, const bool pr_lead_
#define CMC_WS_PROBE_ARGS , pr_t_, pr_lead_
// the persistent kv's per-tile phases (lead: the counting thread; t: a CMC_WS_MARK; laps
// since then are cumulative: the tool takes differences)
#define CMC_WS_PERSIST_LAP(lead, slot, t) do { if (lead) \
  atomicAdd(CMC_WS_ROW_ + (slot), (unsigned long long)((unsigned)clock() - (t))); } while (0)
#define CMC_WS_PERSIST_COUNT(lead, slot) do { if (lead) atomicAdd(CMC_WS_ROW_ + (slot), 1ull); } while (0)
// a CTA's set-up before the roles split (K, V, the plan, the barrier), by its thread 128
#define CMC_WS_CTA_READY(t0, tid) do { if ((tid) == 128) { \
  atomicAdd(CMC_WS_ROW_ + kPrPrologue, (unsigned long long)((unsigned)clock() - (t0))); \
  atomicAdd(CMC_WS_ROW_ + kPrCtas, 1ull); } } while (0)
#else
#define CMC_WS_PROBE_DECL(lead)
#define CMC_WS_ADD(slot, v)
#define CMC_WS_LAP(slot)
#define CMC_WS_COUNT(slot)
#define CMC_WS_LAP2(slot, slot2, also)
#define CMC_WS_MARK(t)
#define CMC_WS_SINCE(slot, t)
#define CMC_WS_PROBE_PARAMS
#define CMC_WS_PROBE_ARGS
#define CMC_WS_CTA_READY(t0, tid)
#define CMC_WS_PERSIST_LAP(lead, slot, t)
#define CMC_WS_PERSIST_COUNT(lead, slot)
#endif
template <int N> CMC_DEV void ws_setmaxnreg_inc() { asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N)); }
template <int N> CMC_DEV void ws_setmaxnreg_dec() { asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N)); }
// 384 x 168 registers (__launch_bounds__(384, 1)) = 128 x 24 + 256 x 240.
enum : int { kWsProducerRegs = 24, kWsConsumerRegs = 240 };

// The 64 query rows of an item into stage st by the loader's 32 lanes (tok(r): row r's
// token, -1: none, zero-filled): Q and dO by cp.async when qdo (else TMA brings them), LSE and
// Dsum always.
template <int D, class Desc, class Tok>
CMC_DEV void ws_copy_rows(unsigned base, int st, const Desc& desc, const cmc_bwd_args& args, cmc_i64 tok0, int hq,
                          const Tok& tok, bool qdo, int lane) {
  if (qdo) {
    load_rows<D, kBM, 32>(base + SmemWS<D>::kQ + st * Cfg<D>::kTileQ,
                          reinterpret_cast<const unsigned short*>(desc.q) + tok0 * desc.q_stride_tok +
                              (cmc_i64)hq * desc.q_stride_head, desc.q_stride_tok, tok, 0, lane);
    load_rows<D, kBM, 32>(base + SmemWS<D>::kDO + st * Cfg<D>::kTileQ,
                          reinterpret_cast<const unsigned short*>(args.dout) + tok0 * args.dout_stride_tok +
                              (cmc_i64)hq * args.dout_stride_head, args.dout_stride_tok, tok, 0, lane);
  }
  const float* lse = cmc_bwd::lse_offsets(args, desc.heads_q, hq) + tok0;
  const float* dsum = reinterpret_cast<const float*>(args.dsum) + (cmc_i64)hq * args.total_tokens + tok0;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int rr = lane + 32 * h, q = tok(rr);
    const int slot = st * kBM + kv_stat_slot(rr);
    cmc_bwd::cp_async4(base + SmemWS<D>::kLse + slot * 4, lse + (q >= 0 ? q : 0), q >= 0);
    cmc_bwd::cp_async4(base + SmemWS<D>::kDsum + slot * 4, dsum + (q >= 0 ? q : 0), q >= 0);
  }
}

// A lane's arrival on stage full barrier bar once its copies are usable: gathered Q and dO
// (generic-proxy writes that wgmma reads) waited for and fenced to the async proxy first;
// otherwise (LSE and Dsum only) when they land (cp.async.mbarrier.arrive.noinc).
CMC_DEV void ws_filled(unsigned bar, bool gathered) {
  if (gathered) {
    cp_commit();
    cp_wait<0>();
    fence_proxy_async();
    ws_arrive(bar);
  } else {
    ws_cp_arrive(bar);
  }
}

// The loader (warp 0 of WG0): item n goes to stage n % 2 once the consumers have released
// the stage's previous item (empty barrier, phase n / 2 - 1), with its Q, dO, LSE and Dsum
// arriving on the stage's full barrier (33 arrivals: thread 0's, with the TMA bytes, and one
// per lane's cp.async copies); after the last item an end item (-1), with no copies. Q and
// dO come by TMA, except in a tile that crosses len (cp.async, zero-filled).
template <class H, class HT, int D>
CMC_DEV bool ws_load(unsigned base, unsigned char* smem, const typename H::desc_t& desc, const cmc_bwd_args& args,
                     const KvMaps* maps, const int* plan, cmc_i64 tok0, int len, int k0, int hq0, int group,
                     int lane, int& n) {
  constexpr int NTT = HT::kTerms;
  const int* run = plan + 4 * NTT;
  const int* full = plan + 6 * NTT;
  const int nrun = plan[8 * NTT], nfull = plan[8 * NTT + 1];
  CMC_WS_PROBE_DECL(lane == 0);
  // One push: j < 0 is the end item. Lane 0 writes the item and arrives (with the TMA bytes
  // of Q and dO, unless the tile crosses len: then they are gathered by cp.async).
  auto push = [&](int j, int g, bool is_full) {
    const int st = n & 1;
    const unsigned fullb = base + SmemWS<D>::kFull + 8 * st;
    CMC_WS_LAP(kPrLdIssue);  // (the walk to this item)
    if (!ws_wait(base + SmemWS<D>::kEmpty + 8 * st, ((n >> 1) & 1) ^ 1)) return false;
    CMC_WS_LAP(kPrLdEmpty);
    CMC_WS_COUNT(kPrLdItems);
    const int hq = hq0 + g, q0 = j * kBM;
    const bool edge = j >= 0 && q0 + kBM > len;
    if (lane == 0) {
      *reinterpret_cast<int4*>(smem + SmemWS<D>::kItem + 16 * st) = make_int4(j, g, is_full ? 1 : 0, 0);
      if (j >= 0 && !edge) {
        kv_mbar_expect_tx(fullb, 2 * Cfg<D>::kTileQ);
        const unsigned sq = base + SmemWS<D>::kQ + st * Cfg<D>::kTileQ, sdo = base + SmemWS<D>::kDO + st * Cfg<D>::kTileQ;
#pragma unroll
        for (int cb = 0; cb < D / 64; ++cb) {
          kv_tma(sq + cb * (kBM * 128), &maps->q, fullb, 64 * cb, hq, (int)(tok0 + q0));
          kv_tma(sdo + cb * (kBM * 128), &maps->dout, fullb, 64 * cb, hq, (int)(tok0 + q0));
        }
      } else {
        ws_arrive(fullb);
      }
    }
    // An edge tile is gathered with zeros past len, as kv does: a TMA box would bring the next
    // sequence's rows, or a batch layout's padding, whose non-finite values would reach dK and
    // dV as 0 x inf.
    if (j >= 0)
      ws_copy_rows<D>(base, st, desc, args, tok0, hq, [&](int r) { return q0 + r < len ? q0 + r : -1; }, edge,
                      lane);
    ws_filled(fullb, edge);
    CMC_WS_LAP(kPrLdIssue);
    ++n;
    return true;
  };
#pragma unroll 1
  for (int g = 0; g < group; ++g) {
    int f = 0;
#pragma unroll 1
    for (int r = 0; r < nrun; ++r) {
#pragma unroll 1
      for (int j = run[2 * r]; j < run[2 * r + 1]; ++j) {
        while (f < nfull && full[2 * f + 1] <= j) ++f;
        if (!push(j, g, f < nfull && full[2 * f] <= j && k0 + kBN <= len)) return false;
      }
    }
  }
  if (!push(-1, 0, false)) return false;
  // The last items' LSE and Dsum copies arrive on their full barriers when they land: the
  // warp stays until they have (PTX does not say an exited thread's cp.async completes).
  cp_commit();
  cp_wait<0>();
  return true;
}

// The Q and dO boxes of one run (BOX tokens from tok) into its stage rows at dst_q / dst_do, one
// 64-column chunk CB: the chunk's offset and column are immediates, and dO's map is made from
// Q's inside the asm (maps->dout lies 128 bytes after maps->q), so ptxas keeps no second map
// pointer live across the loader's loop (with one more value the 24-register loaders spill).
template <int CB>
CMC_DEV void ws_tma_run(unsigned dst_q, unsigned dst_do, const KvMaps* maps, unsigned bar, int h, int tok) {
  static_assert(sizeof(cmc_kv_map) == 128, "map stride");
  asm volatile(
      "{\n.reg .u64 m;\n"
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%2, {%4, %5, %6}], [%3];\n"
      "add.u64 m, %2, 128;\n"
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%1], [m, {%4, %5, %6}], [%3];\n}\n" ::"r"(dst_q + CB * (kBM * 128)),
      "r"(dst_do + CB * (kBM * 128)), "l"(reinterpret_cast<unsigned long long>(&maps->q)), "r"(bar), "n"(64 * CB),
      "r"(h), "r"(tok)
      : "memory");
}

// The patch loader (kv_patch_ws; warp 0 of WG0 loads stage 0, warp 3 stage 1, so each has two
// items' time for its copies): kv_patch's items (head of the group g, touched query tile j,
// half hh: query rows 64 hh .. of tile j's token map), each into stage n % 2 as ws_load, all by
// cp.async with zero fill (rows without a token) from the 32 lanes, which wait for their copies
// and fence them to the async proxy before they arrive; then the end item. Issuing those 2 x 64
// rows of chunks takes a loader 11.4K cycles per item on CLEAR's patches, more than a consumer
// item (run 20), so with CMC_WS_PATCH_TMA an item whose rows all have tokens comes as TMA boxes
// of one patch row instead (lane b: run b's Q and dO boxes; the maps' boxes are patch rows,
// abi.py), LSE and Dsum by cp.async with .noinc arrivals: 3.7K cycles a push (run 21).
template <class H, class HT, int D>
CMC_DEV void ws_load_patch(unsigned base, unsigned char* smem, const typename H::desc_t& desc,
                           const cmc_bwd_args& args, const KvMaps* maps, const unsigned* touched, int nw,
                           const cmc_patch_geo& geo, cmc_i64 tok0, int len, int hq0, int group, int lane,
                           int mine) {
  int n = 0;
  CMC_WS_PROBE_DECL(lane == 0);
  auto push = [&](int j, int g, int hh) {
    const int st = n & 1;
    ++n;
    if (st != mine) return true;
    const unsigned fullb = base + SmemWS<D>::kFull + 8 * st;
    CMC_WS_LAP(kPrLdIssue);  // (the walk to this item)
    if (!ws_wait(base + SmemWS<D>::kEmpty + 8 * st, (((n - 1) >> 1) & 1) ^ 1)) return false;
    CMC_WS_LAP(kPrLdEmpty);
    CMC_WS_COUNT(kPrLdItems);
    if (lane == 0) *reinterpret_cast<int4*>(smem + SmemWS<D>::kItem + 16 * st) = make_int4(j, g, hh, 0);
#if CMC_WS_PATCH_TMA
    if (j >= 0) {
      const cmc_bwd_tile_tokens<H> rows = cmc_bwd_tokens_of<H>(geo, j, len);
      constexpr int BOX = cmc_bwd_patch_box<H>(), NR = 64 / BOX;
      if (cmc_bwd_item_runs<BOX>(rows, 64 * hh)) {  // every row has a token: boxes by TMA
        const int tok = (int)tok0 + cmc_bwd_run_token<H>(rows, 64 * hh, lane);  // run `lane`
        if (lane == 0) kv_mbar_expect_tx(fullb, 2 * Cfg<D>::kTileQ);
        __syncwarp();
        if (lane < NR) {  // lane b: run b's boxes, Q's and dO's, every column chunk
          const unsigned dst = st * Cfg<D>::kTileQ + lane * (BOX * 128);
          ws_tma_run<0>(base + SmemWS<D>::kQ + dst, base + SmemWS<D>::kDO + dst, maps, fullb, hq0 + g, tok);
          if constexpr (D == 128)
            ws_tma_run<1>(base + SmemWS<D>::kQ + dst, base + SmemWS<D>::kDO + dst, maps, fullb, hq0 + g, tok);
        }
        ws_copy_rows<D>(base, st, desc, args, tok0, hq0 + g, [&](int r) { return rows(64 * hh + r); }, false,
                        lane);
        ws_filled(fullb, false);  // LSE and Dsum as they land; Q and dO by the boxes' bytes
        CMC_WS_LAP(kPrLdIssue);
        return true;
      }
    }
#endif
    if (lane == 0) ws_arrive(fullb);
    if (j >= 0) {
      const cmc_bwd_tile_tokens<H> rows = cmc_bwd_tokens_of<H>(geo, j, len);
      ws_copy_rows<D>(base, st, desc, args, tok0, hq0 + g, [&](int r) { return rows(64 * hh + r); }, true, lane);
    }
    ws_filled(fullb, true);  // (waits for this lane's copies)
    CMC_WS_LAP(kPrLdIssue);
    return true;
  };
#pragma unroll 1
  for (int g = 0; g < group; ++g) {
#pragma unroll 1
    for (int j = next_tile(touched, nw, 0); j >= 0; j = next_tile(touched, nw, j + 1)) {
      if (!push(j, g, 0)) return;
      if (cmc_bwd_tokens_of<H>(geo, j, len)(64) >= 0 && !push(j, g, 1)) return;
    }
  }
  push(-1, 0, 0);
#if CMC_WS_PATCH_TMA
  cp_commit();  // as ws_load: the warp stays until its last copies (.noinc arrivals) have landed
  cp_wait<0>();
#endif
}

// A warp's 16 rows r0 + 16 warp .. of a [kBN][...] tile at sb (128-byte swizzle) from a packed
// accumulator fragment (p[2 j], p[2 j + 1]: 16-byte chunk j's rows 0-7 and 8-15), CHUNKS
// chunks, by stmatrix: matrices (j, rows 0-7), (j, rows 8-15), (j + 1, rows 0-7), (j + 1, rows
// 8-15) per instruction, lane 8 i + k giving matrix i's row k.
template <int CHUNKS>
CMC_DEV void ws_stmatrix_rows(unsigned sb, int r0, int warp, int lane, const unsigned* p) {
  const int mi = lane >> 3, mr = r0 + 16 * warp + 8 * (mi & 1) + (lane & 7);
#pragma unroll
  for (int j = 0; j < CHUNKS; j += 2)
    ws_stmatrix_x4(sb + swz<kBN>(mr, j + (mi >> 1)), p[2 * j], p[2 * j + 1], p[2 * j + 2], p[2 * j + 3]);
}

// A warpgroup's [64 x D] fp32 accumulator times mul, as the dtype, into rows r0 .. r0 + 63 of
// the [kBN][D] staging tile at stage (store_acc's layout).
template <bool BF16, int D>
CMC_DEV void ws_stage_acc(unsigned char* stage, const float* acc, float mul, int r0, int wtid) {
  unsigned p[D / 4];
#pragma unroll
  for (int j = 0; j < D / 8; ++j) {
    p[2 * j] = pack2<BF16>(acc[4 * j] * mul, acc[4 * j + 1] * mul);
    p[2 * j + 1] = pack2<BF16>(acc[4 * j + 2] * mul, acc[4 * j + 3] * mul);
  }
  ws_stmatrix_rows<D / 8>(smem_u32(stage), r0, wtid >> 5, wtid & 31, p);
}

// dS^T rows of consumer warpgroup wg (dsa: its packed accumulator) into the dS^T buffer at sb
// ([kBN keys][kBM queries]): 4 stmatrix instead of 16 stores.
CMC_DEV void ws_store_ds(unsigned sb, int wg, int warp, int lane, const unsigned* dsa) {
  ws_stmatrix_rows<kBM / 8>(sb, 64 * wg, warp, lane, dsa);
}

// A dQ writer (warps 1, 2 of WG0, for consumer warpgroup w): per item, once the staging is
// full (barrier 4 + w), one cp.reduce.async.bulk of each row that has a token (256 bytes: the
// warpgroup's 64 columns at D = 128, the whole row of its key half's partial at D = 64), then
// the staging is released (barrier 6 + w) once the bulk unit has read it. An item whose 64 rows
// are rows[1] = 64 / BOX runs of BOX consecutive tokens (run b from token rows[4 + b]) is added
// by two TMA reduce-adds of 32 columns per run (dq_accum's map, boxes of BOX rows) from lane 0
// instead: 2 64 / BOX operations instead of 64 (2 for a linear item, BOX = 64; 8 for a
// patch item of CLEAR's 8 x 16 patches, BOX = 16). CMC_DQ_BLOCK64: every item is one
// cp.reduce.async.bulk of 16 KiB into dq_accum's block rows[4].
template <int D, int BOX>
CMC_DEV void ws_write_dq(unsigned char* smem, float* acc, const KvMaps* maps, int heads_q, int w, int lane) {
  const int* rows = reinterpret_cast<const int*>(smem + SmemWS<D>::kDqItem + w * SmemWS<D>::kDqRows);
  const unsigned stg = smem_u32(smem + SmemWS<D>::kStg + w * 64 * SmemWS<D>::kStgRow);
  const int col = DQ<D>::kSplitN ? 64 * w : 0;
  CMC_WS_PROBE_DECL(lane == 0);
  ws_bar_arrive(6 + w, 160);
#pragma unroll 1
  for (;;) {
    CMC_WS_LAP(kPrWrAdd);  // (the last item's release)
    ws_bar_sync(4 + w, 160);
    CMC_WS_LAP(kPrWrFull);
    CMC_WS_COUNT(kPrWrItems);
    const int hq = rows[0];
    if (hq < 0) break;
#if CMC_DQ_BLOCK64
    // block rows[4] of dq_accum, this warpgroup's column half (D 128) or the whole block (D 64)
    if (lane == 0) {
      bulk_reduce_add_f32(acc + (((cmc_i64)rows[4] * heads_q + hq) * 64 * D + col * 64), stg, 16384u);
      bulk_commit();
      bulk_wait_read();
    }
    __syncwarp();
    ws_bar_arrive(6 + w, 160);
    continue;
#endif
#if CMC_WS_DQ_RED
    // (experiment, bwd_ablate wsred) red.global.add.v4.f32 from the staging: a row's 64 floats
    // by 16 lanes, two rows per pass
    const float* sf = reinterpret_cast<const float*>(smem + SmemWS<D>::kStg + w * 64 * SmemWS<D>::kStgRow);
#pragma unroll 4
    for (int p = 0; p < 32; ++p) {
      const int r = 2 * p + (lane >> 4), c = 4 * (lane & 15), tok = rows[4 + r];
      const float4 v = *reinterpret_cast<const float4*>(sf + r * (SmemWS<D>::kStgRow / 4) + c);
      if (tok >= 0) red_add_v4(acc + ((cmc_i64)tok * heads_q + hq) * D + col + c, v.x, v.y, v.z, v.w);
    }
#else
    if (rows[1]) {
      if (lane == 0) {
#pragma unroll 1
        for (int b = 0; b < rows[1]; ++b) {
          tma_reduce_add(&maps->dq, stg + b * (BOX * 128), col, hq, rows[4 + b]);
          tma_reduce_add(&maps->dq, stg + 8192 + b * (BOX * 128), col + 32, hq, rows[4 + b]);
        }
        bulk_commit();
        bulk_wait_read();
      }
      __syncwarp();
      ws_bar_arrive(6 + w, 160);
      continue;
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = lane + 32 * h, tok = rows[4 + r];
      if (tok >= 0)
        bulk_reduce_add_f32(acc + ((cmc_i64)tok * heads_q + hq) * D + col, stg + r * SmemWS<D>::kStgRow, 256u);
    }
    bulk_commit();
    bulk_wait_read();
#endif
    ws_bar_arrive(6 + w, 160);
  }
}

// The dQ partial of consumer warpgroup w (dq[4 jj + 2 i + e]: row 16 warp + lane / 4 + 8 i,
// column 8 jj + 2 (lane % 4) + e of its 64 x 64 block) into its staging, once the writer has
// read the last one; then the writer is told the query head hq (< 0: the end) and each row's
// token in the workspace, tok(r) (-1: none). nb > 0 (the rows are nb = 64 / BOX runs of BOX
// consecutive tokens from tok(b BOX)): staged as the two 32-column halves of dq_accum's boxes
// instead (64 rows of 128 bytes each, 128-byte swizzle, at 0 and 8 KiB; run b's box at b BOX
// rows, 1 KiB-aligned as the swizzle needs), for the writer's TMA reduce-adds. CMC_DQ_BLOCK64:
// nb is the item's dq_accum block (WsLinear::boxes), the partial is staged in accumulator order
// (16 KiB, as dq_accum's block holds it) and the writer adds it by one bulk copy.
template <int D, int BOX, class Tok>
CMC_DEV void ws_stage_dq(unsigned char* smem, const float* dq, int w, int wtid, int hq, const Tok& tok,
                         int nb CMC_WS_PROBE_PARAMS) {
  static_assert(BOX >= 8 && 64 % BOX == 0, "boxes of whole 1 KiB swizzle atoms");
  const int warp = wtid >> 5, lane = wtid & 31;
  int* rows = reinterpret_cast<int*>(smem + SmemWS<D>::kDqItem + w * SmemWS<D>::kDqRows);
  unsigned char* stg = smem + SmemWS<D>::kStg + w * 64 * SmemWS<D>::kStgRow;
  ws_bar_sync(6 + w, 160);
  CMC_WS_LAP(kPrStgWait);
#if CMC_DQ_BLOCK64
  static_assert(BOX == kBM, "dq_accum's blocks take linear items only");
  if (dq != nullptr) {  // accumulator order: quad i of thread t at 16 (128 i + t)
#pragma unroll
    for (int i = 0; i < 8; ++i)
      *reinterpret_cast<float4*>(stg + (i * 128 + wtid) * 16) = make_float4(dq[4 * i], dq[4 * i + 1], dq[4 * i + 2],
                                                                             dq[4 * i + 3]);
    if (wtid == 0) rows[4] = nb;
  }
#else
  if (dq != nullptr && nb > 0) {
#if CMC_WS_STG_XOR
    // chunk ^ (r & 7) = 2 (jj & 3) ^ ((lane & 3) >> 1 ^ (lane >> 2) & 7): bits 4-6 of the
    // offset, which the 1 KiB-aligned staging and the row's 128 bytes leave clear, so the
    // column block is an XOR of the thread's base; row r + 8 is 1 KiB on, block jj / 4 8 KiB
    const unsigned o0 = (16 * warp + (lane >> 2)) * 128 + ((((lane & 3) >> 1) ^ ((lane >> 2) & 7)) << 4) +
                        ((lane & 1) << 3);
#pragma unroll
    for (int jj = 0; jj < 8; ++jj) {
      unsigned char* a = stg + ((o0 ^ ((jj & 3) << 5)) + (jj >> 2) * 8192);
      *reinterpret_cast<float2*>(a) = make_float2(dq[4 * jj], dq[4 * jj + 1]);
      *reinterpret_cast<float2*>(a + 1024) = make_float2(dq[4 * jj + 2], dq[4 * jj + 3]);
    }
#else
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int r = 16 * warp + (lane >> 2) + 8 * i;
#pragma unroll
      for (int jj = 0; jj < 8; ++jj) {
        const int chunk = ((jj & 3) << 1) | ((lane & 3) >> 1);
        *reinterpret_cast<float2*>(stg + (jj >> 2) * 8192 + r * 128 + ((chunk ^ (r & 7)) << 4) + ((lane & 1) << 3)) =
            make_float2(dq[4 * jj + 2 * i], dq[4 * jj + 2 * i + 1]);
      }
    }
#endif
    if (wtid == 0) rows[1] = nb;
    if (wtid < nb) rows[4 + wtid] = tok(wtid * BOX);
  } else if (dq != nullptr) {
    if (wtid == 0) rows[1] = 0;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      float* row = reinterpret_cast<float*>(stg + (16 * warp + (lane >> 2) + 8 * i) * SmemWS<D>::kStgRow) +
                   2 * (lane & 3);
#pragma unroll
      for (int jj = 0; jj < 8; ++jj)
        *reinterpret_cast<float2*>(row + 8 * jj) = make_float2(dq[4 * jj + 2 * i], dq[4 * jj + 2 * i + 1]);
    }
    if (wtid < 64) rows[4 + wtid] = tok(wtid);
  }
#endif
  if (wtid == 0) rows[0] = hq;
  fence_proxy_async();  // the staging, to the bulk unit
  ws_bar_arrive(4 + w, 160);
  CMC_WS_LAP(kPrStage);
}

// The end of a ws item, after kv_dv_ds (ws_consume). Atomic mode: dS^T rows
// of this warpgroup into buffer st ([kBN keys][kBM queries]), one barrier, then dQ (DQ<D>)
// ahead of dK, so that dK runs under the partial's trip to the staging (tok: each row's
// workspace token, -1: none; nb: its runs of BOX tokens, ws_stage_dq). Otherwise dK alone.
// Then the stage is released (8 warps).
template <bool BF16, int D, int BOX, class Tok>
CMC_DEV void ws_item_end(bool atomic_dq, unsigned char* smem, unsigned base, int st, int wg, int wtid, unsigned* pa,
                         unsigned* dsa, float* dk, unsigned qB, unsigned dqB, int hq, const Tok& tok,
                         int nb CMC_WS_PROBE_PARAMS) {
  using L = SmemWS<D>;
  const int warp = wtid >> 5, lane = wtid & 31;
  if (atomic_dq) {
    unsigned char* sds = smem + L::kDS + st * (kBN * kBM * 2);
#if CMC_WS_STSM
    ws_store_ds(smem_u32(sds), wg, warp, lane, dsa);
#else
    const int lr = 64 * wg + 16 * warp + (lane >> 2);
    const unsigned off = (unsigned)((lane & 3) * 4);
#pragma unroll
    for (int jj = 0; jj < 8; ++jj) {
      *reinterpret_cast<unsigned*>(sds + swz<kBN>(lr, jj) + off) = dsa[2 * jj];
      *reinterpret_cast<unsigned*>(sds + swz<kBN>(lr + 8, jj) + off) = dsa[2 * jj + 1];
    }
#endif
    fence_proxy_async();
    CMC_WS_LAP(kPrDsSt);
    if constexpr (DQ<D>::kSplitN) ws_bar_sync(3, 256);
    else ws_bar_sync(1 + wg, 128);
    CMC_WS_LAP(kPrBar);
    const unsigned dqA = smem_u32(sds) + (DQ<D>::kSplitN ? 0 : wg * 64 * 128);
    float dq[DQ<D>::kRegs];
#pragma unroll
    for (int i = 0; i < DQ<D>::kRegs; ++i) dq[i] = 0.f;
    wg_fence();
    const unsigned long long ds_desc = gdesc(dqA, kBN * 128, 1024), k_desc = gdesc(dqB, kBN * 128, 1024);
#pragma unroll
    for (int kk = 0; kk < DQ<D>::kSteps; ++kk)
      ss_n64<BF16, 1, 1>(dq, gdesc_at(ds_desc, 2048 * kk), gdesc_at(k_desc, 2048 * kk), kk);
    wg_commit();
    kv_dk<BF16, D>(dk, dsa, qB);
    CMC_WS_LAP(kPrIssueDqDk);
    wg_wait<1>();  // dV and dQ done; dK runs on
    fence_regs<DQ<D>::kRegs>(dq);
    fence_regs<16>(pa);
    CMC_WS_LAP(kPrWaitDq);
    ws_stage_dq<D, BOX>(smem, dq, wg, wtid, hq, tok, nb CMC_WS_PROBE_ARGS);
  } else {
    kv_dk<BF16, D>(dk, dsa, qB);
    CMC_WS_LAP(kPrIssueDqDk);
  }
  wg_wait<0>();
  fence_regs<16>(pa);
  fence_regs<16>(dsa);
  __syncwarp();
  if (lane == 0) ws_arrive(base + L::kEmpty + 8 * st);
  CMC_WS_LAP(kPrWaitDk);
}

#if CMC_WS_DQ_LAG
// CMC_WS_DQ_LAG: warpgroup wg's arrival for its item n (its dS^T(n) stored, its dQ(n - 1)
// done), and the wait for the other's (barriers 9 + 2 w + n % 2: a parity apart, an arrival is
// never followed by the same warpgroup's next before the other has waited for it).
CMC_DEV void ws_lag_arrive(int wg, int n) { ws_bar_arrive(9 + 2 * wg + (n & 1), 256); }
CMC_DEV void ws_lag_wait(int wg, int n) { ws_bar_sync(9 + 2 * (1 - wg) + (n & 1), 256); }
// Warpgroup wg's dQ columns over all kBN keys (dS^T at dqA, K's column half at dqB), one group.
// (ws_item_end and kv's item end write the same steps out: bwd_ablate's wsnodqgemm and
// nodqgemm edit those lines.)
template <bool BF16, int D>
CMC_DEV void ws_dq_gemm(float* dq, unsigned dqA, unsigned dqB) {
#pragma unroll
  for (int i = 0; i < DQ<D>::kRegs; ++i) dq[i] = 0.f;
  wg_fence();
  const unsigned long long ds_desc = gdesc(dqA, kBN * 128, 1024), k_desc = gdesc(dqB, kBN * 128, 1024);
#pragma unroll
  for (int kk = 0; kk < DQ<D>::kSteps; ++kk)
    ss_n64<BF16, 1, 1>(dq, gdesc_at(ds_desc, 2048 * kk), gdesc_at(k_desc, 2048 * kk), kk);
  wg_commit();
}
// A lagged item's end once dQ(n - 1) is done (dq): the arrival for item n, dQ(n - 1) staged if
// there was an item n - 1 (prev), then the wait for the rest and the stage's release (none for
// the phantom end item).
template <int D, int BOX, class Tok>
CMC_DEV void ws_lag_tail(unsigned char* smem, unsigned base, int n, bool prev, bool phantom, int wg, int wtid,
                         float* dq, unsigned* pa, unsigned* dsa, int hq, const Tok& tok, int nb CMC_WS_PROBE_PARAMS) {
  if (!phantom) ws_lag_arrive(wg, n);
  if (prev) {
    fence_regs<DQ<D>::kRegs>(dq);
    CMC_WS_LAP(kPrWaitDq);
    ws_stage_dq<D, BOX>(smem, dq, wg, wtid, hq, tok, nb CMC_WS_PROBE_ARGS);
  }
  wg_wait<0>();
  fence_regs<16>(pa);
  fence_regs<16>(dsa);
  __syncwarp();
  if ((wtid & 31) == 0 && !phantom) ws_arrive(base + SmemWS<D>::kEmpty + 8 * (n & 1));
  CMC_WS_LAP(kPrWaitDk);
}
// Item n's end with item n - 1's dQ (CMC_WS_DQ_LAG; atomic mode, D = 128: dQ's columns of
// warpgroup wg over both warpgroups' keys). With dV(n) in flight: once the other warpgroup has
// arrived for item n - 1 (so buffer n % 2 is no longer read by its dQ(n - 2)), dS^T(n) into
// buffer n % 2, then dQ(n - 1) from buffer (n - 1) % 2 and dK(n); once dV and dQ are done, this
// warpgroup's arrival for item n; dQ(n - 1) staged under dK(n). prev: there is an item n - 1
// (its query head hq, row tokens tok, runs nb); phantom: the end item (dS zeroed here, P^T by the
// caller; no arrival, no release).
template <bool BF16, int D, int BOX, class Tok>
CMC_DEV void ws_item_end_lag(unsigned char* smem, unsigned base, int n, bool prev, bool phantom, int wg, int wtid,
                             unsigned* pa, unsigned* dsa, float* dk, unsigned qB, unsigned dqB, int hq,
                             const Tok& tok, int nb CMC_WS_PROBE_PARAMS) {
  static_assert(DQ<D>::kSplitN, "the lag is for the split dQ (D = 128)");
  using L = SmemWS<D>;
  const int st = n & 1, warp = wtid >> 5, lane = wtid & 31;
  unsigned char* sds = smem + L::kDS + st * (kBN * kBM * 2);
  if (phantom) {
#pragma unroll
    for (int i = 0; i < 16; ++i) dsa[i] = 0u;
  }
  ws_lag_wait(wg, n - 1);
  CMC_WS_LAP(kPrBar);
  ws_store_ds(smem_u32(sds), wg, warp, lane, dsa);
  fence_proxy_async();
  CMC_WS_LAP(kPrDsSt);
  // unconditional (a first item's GEMM reads the unused buffer, never staged): ptxas keeps the
  // wgmma pipeline only if no accumulator is issued on one path alone (C7512 otherwise)
  float dq[DQ<D>::kRegs];
  ws_dq_gemm<BF16, D>(dq, smem_u32(smem + L::kDS + (st ^ 1) * (kBN * kBM * 2)), dqB);
  kv_dk<BF16, D>(dk, dsa, qB);
  CMC_WS_LAP(kPrIssueDqDk);
  wg_wait<1>();  // dV(n) and dQ(n - 1) done; dK(n) runs on
  fence_regs<16>(pa);
  ws_lag_tail<D, BOX>(smem, base, n, prev, phantom, wg, wtid, dq, pa, dsa, hq, tok, nb CMC_WS_PROBE_ARGS);
}
#endif

#if CMC_WS_DQ_LAG >= 2
// CMC_WS_DQ_LAG 2: warpgroup wg's turn to issue GEMMs (barrier 13 + wg, arrived by the other
// after its block; warpgroup 1 arrives once for warpgroup 0 before the loop).
CMC_DEV void ws_turn_wait(int wg) { ws_bar_sync(13 + wg, 256); }
CMC_DEV void ws_turn_pass(int wg) { ws_bar_arrive(14 - wg, 256); }
// Item n's end under the turns (s: P^T, dp: dP^T landed): dS^T = P^T (dP^T - Dsum) and both
// packed; once the other's dS^T(n - 1) is stored, dS^T(n) into buffer n % 2; in this
// warpgroup's turn dQ(n - 1), dV(n), dK(n); once dQ is done, the arrival for item n and
// dQ(n - 1) staged under dV and dK (as ws_item_end_lag otherwise).
template <bool BF16, int D, int BOX, class Tok>
CMC_DEV void ws_item_end_lag2(unsigned char* smem, unsigned base, int n, bool prev, bool phantom, int wg,
                              int wtid, float* s, float* dp, const float* dsum_b, int cq, float* dv, float* dk,
                              unsigned doB, unsigned qB, unsigned dqB, int hq, const Tok& tok,
                              int nb CMC_WS_PROBE_PARAMS) {
  using L = SmemWS<D>;
  const int st = n & 1, warp = wtid >> 5, lane = wtid & 31;
  kv_ds(s, dp, dsum_b, cq);
  unsigned pa[16], dsa[16];
#pragma unroll
  for (int m = 0; m < 16; ++m) {
    pa[m] = pack2<BF16>(s[2 * m], s[2 * m + 1]);
    dsa[m] = phantom ? 0u : pack2<BF16>(dp[2 * m], dp[2 * m + 1]);
  }
  CMC_WS_LAP(kPrDvDs);
  ws_lag_wait(wg, n - 1);
  CMC_WS_LAP(kPrBar);
  ws_store_ds(smem_u32(smem + L::kDS + st * (kBN * kBM * 2)), wg, warp, lane, dsa);
  fence_proxy_async();
  CMC_WS_LAP(kPrDsSt);
  ws_turn_wait(wg);
  float dq[DQ<D>::kRegs];
  ws_dq_gemm<BF16, D>(dq, smem_u32(smem + L::kDS + (st ^ 1) * (kBN * kBM * 2)), dqB);
  // dV as kv_dv_ds issues it, without a second wgmma fence (one spilled CLEAR's kv 8 bytes)
  const unsigned long long do_desc = gdesc(doB, kBM * 128, 1024);
#pragma unroll
  for (int kk = 0; kk < kBM / 16; ++kk) rs_nd<BF16, D>(dv, pa + 4 * kk, gdesc_at(do_desc, kk * 2048));
  wg_commit();
  kv_dk<BF16, D>(dk, dsa, qB);
  if (!(phantom && wg == 1)) ws_turn_pass(wg);  // (warpgroup 0 waits for no turn after the end)
  CMC_WS_LAP(kPrIssueDqDk);
  wg_wait<2>();  // dQ(n - 1) done; dV(n), dK(n) run on
  ws_lag_tail<D, BOX>(smem, base, n, prev, phantom, wg, wtid, dq, pa, dsa, hq, tok, nb CMC_WS_PROBE_ARGS);
}
#endif

// What a ws consumer needs of its tiling. WsLinear: key rows k0 + lr, items of 64 query rows
// from qbase = 64 j (kv's). WsPatch: the key rows of forward tile kt by token, items of query
// tile j's rows 64 hh .. by token map (kv_patch's). Each gives per item its fullness, the
// forward's tile-mask word, P^T in place, each row's workspace token for dQ and its runs of
// kBox consecutive tokens (boxes: 64 / kBox, or 0 where the rows are not such runs); and the
// final dK, dV stores.
template <class H, class HT> struct WsLinear {
  static constexpr int kBox = kBM;
  static constexpr bool kLseFirst = CMC_WS_LSE_FIRST;
  static constexpr bool kDsumRegs = CMC_WS_DSUM_REGS;
  const typename HT::seq_t& seqt;
  int len, k0;
  cmc_i64 tok0;
  int kr;
  typename HT::row_t krow0, krow1;
  int blk0;  // CMC_DQ_BLOCK64: dq_accum's block of the sequence's first 64 rows
  struct Item {
    int j, qbase;
    bool is_full;
  };
  CMC_DEV WsLinear(const typename HT::seq_t& s, int n, int key0, cmc_i64 t0, int lr, int b)
      : seqt(s), len(n), k0(key0), tok0(t0), kr(key0 + lr), krow0(HT::row(s, key0 + lr)),
        krow1(HT::row(s, key0 + lr + 8)), blk0((int)cmc_bwd::dq_block(t0, b, 0)) {}
  CMC_DEV Item item(const int4& it) const { return {it.x, it.x * kBM, it.z != 0}; }
  CMC_DEV bool word(const Item& i, int ctid, unsigned& mw) const {
    if constexpr (span_words_on<HT>())
      return kv_linear_word<H, HT>(i.is_full, i.j, k0, len, ctid, 2 * (ctid & 3), seqt, krow0, krow1, mw);
    else
      return kv_offset_word<H, HT>(i.is_full, i.j, k0, len, ctid, mw);
  }
  template <class Row>
  CMC_DEV void p(float* s, Row lse_b, int cq, float sl2, const Item& i, bool mw_ok, unsigned mw) const {
    kv_p_linear<HT>(s, lse_b, cq, sl2, i.is_full, mw_ok, mw, seqt, krow0, krow1, kr, i.qbase, len);
  }
  CMC_DEV int tok(const Item& i, int r) const { return i.qbase + r < len ? (int)(tok0 + i.qbase + r) : -1; }
  // (CMC_DQ_BLOCK64: the item's dq_accum block, every item one, rows past len adding zeros)
  CMC_DEV int boxes(const Item& i) const { return CMC_DQ_BLOCK64 ? blk0 + i.j : i.qbase + kBM <= len ? 1 : 0; }
#if CMC_WS_PERSIST >= 2
  // store without a staging (the persistent kv's K / V buffers take the next tile's meanwhile)
  template <bool BF16, int D>
  CMC_DEV void store_direct(const float* dk, const float* dv, float scale, int wg, int wtid,
                            const cmc_bwd_args& args, int hkv) const {
    store_acc_direct<BF16, D>(dk, scale, 64 * wg,
                              reinterpret_cast<unsigned short*>(args.dk) + tok0 * args.dk_stride_tok +
                                  (cmc_i64)hkv * args.dk_stride_head, args.dk_stride_tok, k0, len, wtid);
    store_acc_direct<BF16, D>(dv, 1.f, 64 * wg,
                              reinterpret_cast<unsigned short*>(args.dv) + tok0 * args.dv_stride_tok +
                                  (cmc_i64)hkv * args.dv_stride_head, args.dv_stride_tok, k0, len, wtid);
  }
#endif
  // This sequence's rows of kv head hkv in a [T, heads_kv, D] output (dK, dV).
  CMC_DEV unsigned short* rows_of(uint64_t out, cmc_i64 stride_tok, cmc_i64 stride_head, int hkv) const {
    return reinterpret_cast<unsigned short*>(out) + tok0 * stride_tok + (cmc_i64)hkv * stride_head;
  }
  template <bool BF16, int D>
  CMC_DEV void store(unsigned char* smem, const float* dk, const float* dv, float scale, int wg, int wtid,
                     const cmc_bwd_args& args, int hkv) const {
#if CMC_WS_EPI_STSM
    ws_stage_acc<BF16, D>(smem + SmemWS<D>::kK, dk, scale, 64 * wg, wtid);
    ws_stage_acc<BF16, D>(smem + SmemWS<D>::kV, dv, 1.f, 64 * wg, wtid);
    store_staged<D>(smem + SmemWS<D>::kK, 64 * wg, rows_of(args.dk, args.dk_stride_tok, args.dk_stride_head, hkv),
                    args.dk_stride_tok, k0, len, wtid, wg);
    store_staged<D>(smem + SmemWS<D>::kV, 64 * wg, rows_of(args.dv, args.dv_stride_tok, args.dv_stride_head, hkv),
                    args.dv_stride_tok, k0, len, wtid, wg);
#else
    store_acc<BF16, D>(smem + SmemWS<D>::kK, dk, scale, 64 * wg,
                       rows_of(args.dk, args.dk_stride_tok, args.dk_stride_head, hkv), args.dk_stride_tok, k0,
                       len, wtid, wg);
    store_acc<BF16, D>(smem + SmemWS<D>::kV, dv, 1.f, 64 * wg,
                       rows_of(args.dv, args.dv_stride_tok, args.dv_stride_head, hkv), args.dv_stride_tok, k0,
                       len, wtid, wg);
#endif
  }
};
template <class H, class HT> struct WsPatch {
  static_assert(!CMC_DQ_BLOCK64 || sizeof(H) == 0, "dq_accum's blocks take linear tilings only");
  static constexpr int kBox = cmc_bwd_patch_box<H>();
  static constexpr bool kLseFirst = CMC_WS_LSE_FIRST_PATCH;
  static constexpr bool kDsumRegs = false;
  const typename HT::seq_t& seqt;
  const cmc_patch_geo& geo;
  const cmc_bwd_tile_tokens<H>& keys;
  const unsigned* full;
  int len, kt;
  cmc_i64 tok0;
  bool keys_all;
  typename HT::row_t krow0, krow1;
  struct Item {
    int j, r0;
    bool is_full;
    cmc_bwd_tile_tokens<H> qrows;
  };
  CMC_DEV WsPatch(const typename HT::seq_t& s, const cmc_patch_geo& g, const cmc_bwd_tile_tokens<H>& k,
                  const unsigned* f, int n, int t, cmc_i64 t0, int lr)
      : seqt(s), geo(g), keys(k), full(f), len(n), kt(t), tok0(t0), keys_all(k(kBN - 1) >= 0),
        krow0(HT::row(s, k(lr) >= 0 ? k(lr) : 0)), krow1(HT::row(s, k(lr + 8) >= 0 ? k(lr + 8) : 0)) {}
  CMC_DEV Item item(const int4& it) const {
    return {it.x, 64 * it.z, keys_all && tile_bit(full, it.x), cmc_bwd_tokens_of<H>(geo, it.x, len)};
  }
  CMC_DEV bool word(const Item& i, int ctid, unsigned& mw) const {
    if constexpr (span_words_on<HT>())
      return kv_patch_item_word<H, HT>(i.is_full, geo, i.j, kt, len, ctid, i.r0 >> 6, 2 * (ctid & 3), seqt, krow0,
                                       krow1, i.qrows, mw);
    else
      return kv_patch_word<H, HT>(i.is_full, geo, i.j, kt, len, ctid, i.r0 >> 6, mw);
  }
  template <class Row>
  CMC_DEV void p(float* s, Row lse_b, int cq, float sl2, const Item& i, bool mw_ok, unsigned mw) const {
    kv_p_patch<HT>(s, lse_b, cq, sl2, i.is_full, mw_ok, mw, seqt, krow0, krow1, i.qrows, i.r0);
  }
  CMC_DEV int tok(const Item& i, int r) const {
    const int q = i.qrows(i.r0 + r);
    return q >= 0 ? (int)(tok0 + q) : -1;
  }
  CMC_DEV int boxes(const Item& i) const { return cmc_bwd_item_runs<kBox>(i.qrows, i.r0); }
  template <bool BF16, int D>
  CMC_DEV void store(unsigned char* smem, const float* dk, const float* dv, float scale, int wg, int wtid,
                     const cmc_bwd_args& args, int hkv) const {
    store_acc_rows<BF16, D>(smem + SmemWS<D>::kK, dk, scale, 64 * wg,
                            reinterpret_cast<unsigned short*>(args.dk) + tok0 * args.dk_stride_tok +
                                (cmc_i64)hkv * args.dk_stride_head, args.dk_stride_tok, keys, wtid, wg);
    store_acc_rows<BF16, D>(smem + SmemWS<D>::kV, dv, 1.f, 64 * wg,
                            reinterpret_cast<unsigned short*>(args.dv) + tok0 * args.dv_stride_tok +
                                (cmc_i64)hkv * args.dv_stride_head, args.dv_stride_tok, keys, wtid, wg);
  }
};

// A consumer warpgroup (WG1, WG2: keys 64 (wg - 1) .. of the CTA's tile): the items of the ring
// (from ring count n, which it advances) until the end item, kv's per-item GEMMs in ws's order
// (ws_item_end), then dK, dV. kPersist: the end item's stage is released (the next tile's items
// follow it), and the writers are told the end only with end_writers (the CTA's last tile).
template <bool BF16, int D, bool kPersist = false, class T>
CMC_DEV void ws_consume(const T& tiling, float sl2, unsigned char* smem, unsigned base, const cmc_bwd_args& args,
                        int hkv, int group, bool atomic_dq, int tid, int& n, bool end_writers = true,
                        unsigned kv_bar = 0u) {
  constexpr int kAcc = D / 2;
  using L = SmemWS<D>;
  const int wg = wg_index(tid) - 1, ctid = tid - 128, wtid = tid & 127, lane = tid & 31;
  const unsigned sK = base + L::kK, sV = base + L::kV;
  const float* lse_s = reinterpret_cast<const float*>(smem + L::kLse);
  const float* dsum_s = reinterpret_cast<const float*>(smem + L::kDsum);
  const int cq = 2 * (lane & 3);
  const unsigned kA = sK + wg * 64 * 128, vA = sV + wg * 64 * 128;
  const unsigned dqB = sK + wg * (DQ<D>::kSplitN ? kBN * 128 : 64 * 128);

  float dk[kAcc], dv[kAcc];
#pragma unroll
  for (int i = 0; i < kAcc; ++i) dk[i] = dv[i] = 0.f;
  if (kv_bar != 0u) ws_wait(kv_bar, 0);  // (wskvtma: K, V by TMA, phase 0)

  CMC_WS_PROBE_DECL(wtid == 0);
  CMC_WS_MARK(pr_loop);
#if CMC_WS_DQ_LAG
  // lag: the end item runs as a phantom (a full item 0 whose P and dS are zeroed, its GEMMs on
  // the K / V tile, finite, instead of a stage that may never have been loaded), so that the
  // last item's dQ is issued from the loop's one dQ site: a second one after the loop spilled
  // 20-44 bytes
  const bool lag = DQ<D>::kSplitN && atomic_dq;
  bool lag_prev = false;  // an item before this one, whose dQ is still to do
  typename T::Item lag_item{};
  int lag_hq = 0, lag_nb = 0;
  if (lag) ws_lag_arrive(wg, n - 1);  // as if an item before the first: its wait below
#if CMC_WS_DQ_LAG >= 2
  if (lag && wg == 1) ws_turn_pass(wg);  // warpgroup 0 issues first
#endif
#endif
#pragma unroll 1
  for (;; ++n) {
    const int st = n & 1;
    if (!ws_wait(base + L::kFull + 8 * st, (n >> 1) & 1)) break;
    CMC_WS_LAP2(kPrFull, kPrFirstFull, n == 0);
#if CMC_WS_DQ_LAG
    const int4 slot_in = *reinterpret_cast<const int4*>(smem + L::kItem + 16 * st);
    const bool phantom = lag && slot_in.x < 0;
    const int4 slot = phantom ? make_int4(0, 0, 1, 0) : slot_in;
#else
    const int4 slot = *reinterpret_cast<const int4*>(smem + L::kItem + 16 * st);
#endif
    if (slot.x < 0) {
      if constexpr (kPersist) {
        if (lane == 0) ws_arrive(base + L::kEmpty + 8 * st);
        ++n;
      }
      break;
    }
    CMC_WS_COUNT(kPrItems);
    const typename T::Item item = tiling.item(slot);
    const int hq = hkv * group + slot.y;
#if CMC_WS_DQ_LAG
    auto lag_keep = [&] {  // this item's dQ is the next one's to do
      lag_prev = true;
      lag_item = item;
      lag_hq = hq;
      lag_nb = tiling.boxes(item);
    };
    const unsigned qB = phantom ? sK : base + L::kQ + st * Cfg<D>::kTileQ,
                   doB = phantom ? sV : base + L::kDO + st * Cfg<D>::kTileQ;
#else
    const unsigned qB = base + L::kQ + st * Cfg<D>::kTileQ, doB = base + L::kDO + st * Cfg<D>::kTileQ;
#endif

    float s[32], dp[32];
#if CMC_WS_LSE_REGS
    KvRowRegs lse_r;
    if constexpr (T::kLseFirst) lse_r = kv_row_regs(lse_s + st * kBM, cq);
#endif
#if CMC_WS_DQ_LAG >= 2
    if (lag) ws_turn_wait(wg);
#endif
    issue_s_dp<BF16, D, kBN, kBM>(s, dp, kA, qB, vA, doB);
#if CMC_WS_DQ_LAG >= 2
    if (lag) ws_turn_pass(wg);
#endif
    CMC_WS_LAP(kPrIssue);
    unsigned mw = 0u;
    const bool mw_ok = tiling.word(item, ctid, mw);
    CMC_WS_LAP(kPrWord);
#if CMC_WS_LSE_REGS
    // FA3 / FA4's order: the item's LSE read while S^T runs (after the mask word, which needs
    // the registers). Its Dsum too, under P^T, spilled on the mask-heavy kinds (grid96: 12 B,
    // CLEAR's patches: 88 B; 2026-12-05, not kept), so Dsum stays read after the dP^T wait
    // (CMC_WS_DSUM_REGS: before dV's issue instead, on linear items; off: run 51's timing,
    // -0.7 to -5 %, is not yet checked).
    if constexpr (!T::kLseFirst) lse_r = kv_row_regs(lse_s + st * kBM, cq);
#endif
    wg_wait<1>();
    fence_regs<32>(s);
    CMC_WS_LAP(kPrWaitS);
#if CMC_WS_LSE_REGS
    tiling.p(s, lse_r, cq, sl2, item, mw_ok, mw);
#else
    tiling.p(s, lse_s + st * kBM, cq, sl2, item, mw_ok, mw);
#endif
#if CMC_WS_DQ_LAG
    if (phantom) {
#pragma unroll
      for (int i = 0; i < 32; ++i) s[i] = 0.f;
    }
#endif
    CMC_WS_LAP(kPrP);
#if CMC_WS_DQ_LAG >= 2
    if (lag) {
      wg_wait<0>();  // dP^T
      fence_regs<32>(dp);
      ws_item_end_lag2<BF16, D, T::kBox>(smem, base, n, lag_prev, phantom, wg, wtid, s, dp, dsum_s + st * kBM, cq,
                                         dv, dk, doB, qB, dqB, lag_hq,
                                         [&](int r) { return tiling.tok(lag_item, r); }, lag_nb CMC_WS_PROBE_ARGS);
      if (phantom) break;
      lag_keep();
      continue;
    }
#endif
    unsigned pa[16], dsa[16];
    if constexpr (T::kDsumRegs)
      kv_dv_ds<BF16, D>(s, dp, kv_row_regs(dsum_s + st * kBM, cq), cq, dv, doB, pa, dsa);
    else
      kv_dv_ds<BF16, D>(s, dp, dsum_s + st * kBM, cq, dv, doB, pa, dsa);
    CMC_WS_LAP(kPrDvDs);
#if CMC_WS_DQ_LAG
    if constexpr (DQ<D>::kSplitN) {
      if (lag) {
        ws_item_end_lag<BF16, D, T::kBox>(smem, base, n, lag_prev, phantom, wg, wtid, pa, dsa, dk, qB, dqB,
                                          lag_hq, [&](int r) { return tiling.tok(lag_item, r); }, lag_nb
                                          CMC_WS_PROBE_ARGS);
        if (phantom) break;
        lag_keep();
        continue;
      }
    }
#endif
    ws_item_end<BF16, D, T::kBox>(atomic_dq, smem, base, st, wg, wtid, pa, dsa, dk, qB, dqB, hq,
                                  [&](int r) { return tiling.tok(item, r); }, tiling.boxes(item)
                                  CMC_WS_PROBE_ARGS);
  }
  CMC_WS_SINCE(kPrLoop, pr_loop);
  if (atomic_dq && end_writers)  // the writer's end
    ws_stage_dq<D, T::kBox>(smem, nullptr, wg, wtid, -1, [](int) { return -1; }, 0 CMC_WS_PROBE_ARGS);
  fence_regs<kAcc>(dk);
  fence_regs<kAcc>(dv);
  ws_bar_sync(3, 256);  // K, V no longer read (dQ reads both halves of K): they stage dK, dV
  CMC_WS_MARK(pr_epi);
#if CMC_WS_PERSIST >= 2
  if constexpr (kPersist) {  // K, V free for the next tile's: dK, dV stored from registers
    if (ctid == 0 && !end_writers) ws_arrive(base + L::kKvEmpty);
    tiling.template store_direct<BF16, D>(dk, dv, sl2 * 0.6931471805599453f, wg, wtid, args, hkv);
  } else
#endif
  tiling.template store<BF16, D>(smem, dk, dv, sl2 * 0.6931471805599453f, wg, wtid, args, hkv);
  CMC_WS_SINCE(kPrEpilogue, pr_epi);
}

// The ring's mbarriers (thread 0, before the CTA barrier that publishes them): full, 33
// arrivals (the loader's lane 0 and each lane's copies); empty, 8 (the consumer warps).
template <int D> CMC_DEV void ws_init_barriers(unsigned base) {
#pragma unroll
  for (int st = 0; st < 2; ++st) {
    kv_mbar_init(base + SmemWS<D>::kFull + 8 * st, 33);
    kv_mbar_init(base + SmemWS<D>::kEmpty + 8 * st, 8);
  }
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
// A consumer thread's first key row in the CTA's tile (wgmma accumulator layout; the other
// is 8 below): consumer warpgroup (tid / 128 - 1) owns rows 64 (tid / 128 - 1) ..
CMC_DEV int ws_key_row(int tid) { return 64 * (wg_index(tid) - 1) + 16 * ((tid >> 5) & 3) + ((tid & 31) >> 2); }

// The roles once the CTA is set up. WG0 (kWsProducerRegs): warps 1, 2 the dQ writers of the
// consumer warpgroups (atomic mode; runs of BOX tokens), warps 0 and 3 load(warp, lane). WG1,
// WG2 (kWsConsumerRegs): ws_consume on the tiling make_tiling() gives, built after setmaxnreg.
// kFuse (CMC_WS_FUSE_POST, linear tilings): once done, the writers' adds complete and they
// arrive on barrier 8, where the consumers then run post(tid) (ws_post_fused), in their own
// registers (code after the roles join would be compiled for WG0's kWsProducerRegs).
template <bool BF16, int D, int BOX, bool kFuse = false, class Load, class MakeTiling, class Desc,
          class Post = int>
CMC_DEV void ws_roles(const Load& load, const MakeTiling& make_tiling, const Desc& desc, const cmc_bwd_args& args,
                      const KvMaps* maps, unsigned char* smem, unsigned base, int hkv, bool atomic_dq, int tid,
                      const Post& post = 0, unsigned kv_bar = 0u) {
  if (wg_index(tid) == 0) {
    ws_setmaxnreg_dec<kWsProducerRegs>();
    const int warp = __shfl_sync(0xffffffffu, tid >> 5, 0), lane = tid & 31;
    if (warp == 1 || warp == 2) {
      if (atomic_dq) {
        ws_write_dq<D, BOX>(smem, reinterpret_cast<float*>(args.dq_accum), maps, desc.heads_q, warp - 1, lane);
        if constexpr (kFuse) {  // the adds themselves complete, not only their staging reads
          bulk_commit();
          asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
          asm volatile("fence.proxy.async;\n" ::: "memory");
          ws_bar_arrive(8, 320);
        }
      }
    } else {
      load(warp, lane);
    }
  } else {
    ws_setmaxnreg_inc<kWsConsumerRegs>();
    int n = 0;
    ws_consume<BF16, D>(make_tiling(), desc.scale_log2, smem, base, args, hkv, desc.heads_q / desc.heads_kv,
                        atomic_dq, tid, n, true, kv_bar);
    if constexpr (kFuse) {
      if (atomic_dq) post(tid);
    }
  }
}

#if CMC_WS_FUSE_POST
// Done kv CTAs per (sequence, kv head): a module global, zero at load, put back to zero by the
// last CTA, so one launch of the module at a time (a prototype: a shipped kind would take it
// from the workspace).
__device__ int cmc_ws_post_done[1 << 16];

// post folded into the linear ws kv: once every warp is done (the writers' adds completed), the
// CTA counts itself; the last of its sequence's ceil(len / 128) key tiles converts the dQ of
// the kv head's query heads from dq_accum (L2-resident by then) as post does. The consumer
// warpgroups (tid 128 ..) alone count and convert (ws_roles' post).
template <bool BF16, int D, class Desc>
CMC_DEV void ws_post_fused(const Desc& desc, const cmc_bwd_args& args, unsigned char* smem, int b, int hkv,
                           int group, int len, cmc_i64 tok0, int tid) {
  constexpr int kCh = D / 8;
  int* last = reinterpret_cast<int*>(smem + SmemWS<D>::kPlan);
  ws_bar_sync(8, 320);  // the writers' adds completed (ws_roles)
  if (tid == 128) {
    const int slot = b * desc.heads_kv + hkv;
    if (slot >= (1 << 16)) __trap();
    __threadfence();
    const int is_last = atomicAdd(&cmc_ws_post_done[slot], 1) == (len + kBN - 1) / kBN - 1;
    if (is_last) cmc_ws_post_done[slot] = 0;
    *last = is_last;
  }
  ws_bar_sync(3, 256);
  if (!*last) return;
  __threadfence();
  const float scale = desc.scale_log2 * 0.6931471805599453f;
  const float* acc = reinterpret_cast<const float*>(args.dq_accum);
  for (int hh = 0; hh < group; ++hh) {
    const int h = hkv * group + hh;
    unsigned short* dq = reinterpret_cast<unsigned short*>(args.dq) + (cmc_i64)h * args.dq_stride_head;
#pragma unroll 4
    for (int c = tid - 128; c < len * kCh; c += kThreadsWS - 128) {
      const int q = c / kCh, ch = c - q * kCh;
      const cmc_i64 t = tok0 + q;
      const float4* a = reinterpret_cast<const float4*>(acc + (t * desc.heads_q + h) * D + ch * 8);
      *reinterpret_cast<uint4*>(dq + t * args.dq_stride_tok + ch * 8) =
          cmc_bwd::dq_pack8<BF16>(__ldcg(a), __ldcg(a + 1), scale);
    }
  }
}
#endif

#if CMC_WS_KV_TMA || CMC_WS_PERSIST_KVTMA
// A whole key tile's K and V (128 rows from token tok of kv head hkv) by TMA boxes of 64 x 64
// (the K / V maps: wsperst, wskvtma), their bytes expected on bar; one thread issues them.
template <int D>
CMC_DEV void ws_kv_tma(unsigned base, const KvMaps* maps, unsigned bar, int hkv, int tok) {
  kv_mbar_expect_tx(bar, 2 * Cfg<D>::kTileK);
#pragma unroll
  for (int cb = 0; cb < D / 64; ++cb)
#pragma unroll
    for (int rb = 0; rb < 2; ++rb) {
      const unsigned off = cb * (kBN * 128) + rb * (64 * 128);
      kv_tma(base + SmemWS<D>::kK + off, &maps->k, bar, 64 * cb, hkv, tok + 64 * rb);
      kv_tma(base + SmemWS<D>::kV + off, &maps->v, bar, 64 * cb, hkv, tok + 64 * rb);
    }
}
#endif

// The CTA's key tile, kv head and sequence: the grid's own (key tile fastest), or with
// HEAVY > 0 (HT::kHeavyTiles: key tiles every query sees; launched with flags bit 1) the
// first HEAVY key tiles of every (sequence, kv head) in the first CTAs launched, then the
// rest in the grid's order (HEAVY = 0: the grid's own). Such a tile takes every query item,
// and last in its (sequence, kv head) the last heads' ones made the tail (tools/sched_sim.py
// --heavy). Only CMC_WS_HEAVY_FIRST builds call it; the others read blockIdx as it is.
template <int HEAVY> CMC_DEV void ws_kv_cta(int& kt, int& hkv, int& b) {
  const int nkt = gridDim.x, nbh = gridDim.y * gridDim.z;
  const int first = HEAVY < nkt ? HEAVY : nkt;
  int id = blockIdx.x + nkt * (blockIdx.y + gridDim.y * blockIdx.z), bh;
  if (id < first * nbh) {
    kt = id / nbh;
    bh = id - kt * nbh;
  } else {
    id -= first * nbh;
    const int rest = nkt - first;
    bh = id / rest;
    kt = first + (id - bh * rest);
  }
  hkv = bh % gridDim.y;
  b = bh / gridDim.y;
}

template <class H, class HT, bool BF16, int D>
CMC_DEV void kv_ws(const typename H::desc_t& desc, const cmc_bwd_args& args, const KvMaps* maps) {
  using L = SmemWS<D>;
  extern __shared__ __align__(1024) unsigned char cmc_smem_raw[];
  unsigned char* smem = cmc_smem_raw + ((1024u - (smem_u32(cmc_smem_raw) & 1023u)) & 1023u);
  const unsigned base = smem_u32(smem);
  const int tid = threadIdx.x;
  CMC_WS_MARK(pr_start);
#if CMC_WS_HEAVY_FIRST
  int kt_ = blockIdx.x, hkv_ = blockIdx.y, b_ = blockIdx.z;
  if (args.flags & 2) ws_kv_cta<HT::kHeavyTiles>(kt_, hkv_, b_);
  const int hkv = hkv_, b = b_;
  const int k0 = kt_ * kBN;
#else
  const int hkv = blockIdx.y, b = blockIdx.z;
  const int k0 = blockIdx.x * kBN;
#endif
  const typename HT::seq_t seqt = HT::seq(desc, b);
  const int len = seqt.len;
  if (k0 >= len) return;
  const cmc_i64 tok0 = seqt.tok0;
  const int group = desc.heads_q / desc.heads_kv;
  const bool atomic_dq = (args.flags & 1) == 0;
  int* plan = reinterpret_cast<int*>(smem + L::kPlan);

#if CMC_WS_KV_TMA
  const bool kv_by_tma = k0 + kBN <= len;
  if (tid == 0) {
    kv_mbar_init(base + L::kKvFull, 1);
    ws_init_barriers<D>(base);
    if (kv_by_tma) ws_kv_tma<D>(base, maps, base + L::kKvFull, hkv, (int)(tok0 + k0));
  }
  if (!kv_by_tma) {
#endif
  load_tile<D, kBN, kThreadsWS>(base + L::kK, reinterpret_cast<const unsigned short*>(desc.k) + tok0 * desc.k_stride_tok +
                                     (cmc_i64)hkv * desc.k_stride_head, desc.k_stride_tok, k0, len, tid);
  load_tile<D, kBN, kThreadsWS>(base + L::kV, reinterpret_cast<const unsigned short*>(desc.v) + tok0 * desc.v_stride_tok +
                                     (cmc_i64)hkv * desc.v_stride_head, desc.v_stride_tok, k0, len, tid);
  cp_commit();
#if CMC_WS_KV_TMA
  }
#else
  if (tid == 0) ws_init_barriers<D>(base);
#endif
  cmc_bwd::build_plan<HT, kThreadsWS>(plan, seqt, k0, cmc_min(k0 + kBN, len) - 1, kBM, tid);
  cp_wait<0>();
  fence_proxy_async();
  __syncthreads();  // K, V landed, visible to wgmma; the plan and the mbarrier inits published
  CMC_WS_CTA_READY(pr_start, tid);

  ws_roles<BF16, D, WsLinear<H, HT>::kBox, CMC_WS_FUSE_POST != 0>(
      [&](int warp, int lane) {
        int n = 0;
        if (warp == 0) ws_load<H, HT, D>(base, smem, desc, args, maps, plan, tok0, len, k0, hkv * group, group, lane, n);
      },
      [&] { return WsLinear<H, HT>(seqt, len, k0, tok0, ws_key_row(tid), b); }, desc, args, maps, smem, base, hkv,
      atomic_dq, tid
#if CMC_WS_FUSE_POST
      , [&](int t) { ws_post_fused<BF16, D>(desc, args, smem, b, hkv, group, len, tok0, t); }
#elif CMC_WS_KV_TMA
      , 0, kv_by_tma ? base + L::kKvFull : 0u
#endif
  );
}

#if CMC_WS_PERSIST
// The persistent kv's work counter: tickets from 0 (unit gridDim.x + ticket) and the CTAs done;
// zero at load, put back to zero by the last CTA done (a prototype's module global: one launch
// of the module at a time; a shipped kind would take desc.sched).
__device__ unsigned cmc_ws_sched[2];

// The first unit from u on with a key row (unit u: key tile u % nkt of kv head (u / nkt) %
// heads_kv of sequence u / nkt / heads_kv, the non-persistent grid's CTA order), as (k0, kv
// head, sequence, 1), taking the next ones from the counter; (0, 0, 0, 0) past the last unit,
// once the CTA is counted done (it fetches no more). CMC_WS_PERSIST_LPT numbers them otherwise.
template <class HT, int D>
CMC_DEV int4 ws_next_tile(const typename HT::desc_t& desc, int u, int nkt, int units) {
  for (;;) {
    if (u >= units) {
      __threadfence();
      if (atomicAdd(cmc_ws_sched + 1, 1u) == gridDim.x - 1) {
        atomicExch(cmc_ws_sched, 0u);
        atomicExch(cmc_ws_sched + 1, 0u);
      }
      return make_int4(0, 0, 0, 0);
    }
#if CMC_WS_PERSIST_LPT
    const int nbh = units / nkt;
    const long long per = (long long)desc.max_len * D * 4 * (desc.heads_q / desc.heads_kv);  // Q, dO
    const int gs = (int)cmc_min((long long)nbh, cmc_max(1ll, (24ll << 20) / cmc_max(per, 1ll)));
    const int g = u / (gs * nkt), r = u - g * gs * nkt, gsz = cmc_min(gs, nbh - g * gs);
    const int kt = r / gsz, bh = g * gs + r % gsz;
#else
    const int kt = u % nkt, bh = u / nkt;
#endif
    const int hkv = bh % desc.heads_kv, b = bh / desc.heads_kv;
    if (kt * kBN < HT::seq(desc, b).len) return make_int4(kt * kBN, hkv, b, 1);
    u = (int)gridDim.x + (int)atomicAdd(cmc_ws_sched, 1u);
  }
}

// build_plan by the 256 consumer threads (ctid < 256; barrier 3).
template <class HH>
CMC_DEV void ws_build_plan(int* plan, const typename HH::seq_t& s, int a, int b, int ctid) {
  constexpr int NT = HH::kTerms;
  cmc_plan_terms<HH>(s, a, b, plan, ctid, 256, [] { ws_bar_sync(3, 256); });
  ws_bar_sync(3, 256);
  for (int i = ctid; i < NT; i += 256) cmc_plan_place(plan, NT, i, kBM);
  ws_bar_sync(3, 256);
  if (ctid == 0) cmc_plan_merge(plan, NT, kBM);
  ws_bar_sync(3, 256);
}

// kv_ws, persistent: gridDim.x CTAs (one per SM) take linear key tiles (units, ws_next_tile)
// until none is left. The first tile is set up as kv_ws sets up its one; then, for tile i:
// - the consumers, first (their accumulators dead), take tile i + 1 from the counter and build
//   its plan (plans and tiles double-buffered by i % 2) and arrive on plan-full (i + 1) % 2;
//   wait for tile i's K, V (K / V full, i >= 1), consume its items up to its end item (whose
//   stage they release), store dK, dV through the K / V buffers, and arrive on K / V empty;
// - warp 0 pushes tile i's items and its end item into the ring (ring count n runs on across
//   tiles), once plan-full i has completed, so the next tile's first items load under this
//   tile's last items and its dK, dV stores;
// - warp 3 loads tile i's K and V by cp.async (zero rows past len; with CMC_WS_PERSIST_KVTMA
//   whole tiles by ws_kv_tma) once plan-full i and K / V empty (tile i - 1's stores done) have
//   completed, and arrives on K / V full;
// - warps 1, 2 write dQ as in kv_ws; the consumers tell them the end after the last tile.
template <class H, class HT, bool BF16, int D>
CMC_DEV void kv_ws_persist(const typename H::desc_t& desc, const cmc_bwd_args& args, const KvMaps* maps) {
  using L = SmemWS<D>;
  static_assert((8 * HT::kTerms + 2) * 4 <= L::kPlan2Bytes, "the second plan buffer");
  extern __shared__ __align__(1024) unsigned char cmc_smem_raw[];
  unsigned char* smem = cmc_smem_raw + ((1024u - (smem_u32(cmc_smem_raw) & 1023u)) & 1023u);
  const unsigned base = smem_u32(smem);
  const int tid = threadIdx.x;
  CMC_WS_MARK(pr_start);
  const int nkt = (desc.max_len + kBN - 1) / kBN, units = nkt * desc.heads_kv * desc.batch;
  const int group = desc.heads_q / desc.heads_kv;
  const bool atomic_dq = (args.flags & 1) == 0;
  int4* tiles = reinterpret_cast<int4*>(smem + L::kTile);
  const unsigned kv_full = base + L::kKvFull, kv_empty = base + L::kKvEmpty, plan_full = base + L::kPlanFull;
  auto plan_of = [&](int i) { return reinterpret_cast<int*>(smem + ((i & 1) ? L::kPlan2 : L::kPlan)); };
  if (tid == 0) {
    kv_mbar_init(kv_full, CMC_WS_PERSIST_KVTMA ? 1 : 32);
    kv_mbar_init(kv_empty, 1);
    kv_mbar_init(plan_full, 1);
    kv_mbar_init(plan_full + 8, 1);
    ws_init_barriers<D>(base);  // (its fence publishes these inits too)
    tiles[0] = ws_next_tile<HT, D>(desc, (int)blockIdx.x, nkt, units);
  }
  __syncthreads();
  const int4 first = tiles[0];
  if (!first.w) return;
  {
    const typename HT::seq_t seqt = HT::seq(desc, first.z);
    const int len = seqt.len, k0 = first.x;
    const cmc_i64 tok0 = seqt.tok0;
    load_tile<D, kBN, kThreadsWS>(base + L::kK, reinterpret_cast<const unsigned short*>(desc.k) + tok0 * desc.k_stride_tok +
                                       (cmc_i64)first.y * desc.k_stride_head, desc.k_stride_tok, k0, len, tid);
    load_tile<D, kBN, kThreadsWS>(base + L::kV, reinterpret_cast<const unsigned short*>(desc.v) + tok0 * desc.v_stride_tok +
                                       (cmc_i64)first.y * desc.v_stride_head, desc.v_stride_tok, k0, len, tid);
    cp_commit();
    cmc_bwd::build_plan<HT, kThreadsWS>(plan_of(0), seqt, k0, cmc_min(k0 + kBN, len) - 1, kBM, tid);
    cp_wait<0>();
    fence_proxy_async();
    __syncthreads();  // K, V landed, visible to wgmma; the plan published
  }
  CMC_WS_CTA_READY(pr_start, tid);
  if (wg_index(tid) == 0) {
    ws_setmaxnreg_dec<kWsProducerRegs>();
    const int warp = __shfl_sync(0xffffffffu, tid >> 5, 0), lane = tid & 31;
    if (warp == 1 || warp == 2) {
      if (atomic_dq)
        ws_write_dq<D, WsLinear<H, HT>::kBox>(smem, reinterpret_cast<float*>(args.dq_accum), maps, desc.heads_q,
                                              warp - 1, lane);
    } else if (warp == 0) {
      int n = 0;
#pragma unroll 1
      for (int i = 0;; ++i) {
        if (i > 0 && !ws_wait(plan_full + 8 * (i & 1), ((i - 1) >> 1) & 1)) break;
        const int4 t = tiles[i & 1];
        if (!t.w) break;
        const typename HT::seq_t seqt = HT::seq(desc, t.z);
        if (!ws_load<H, HT, D>(base, smem, desc, args, maps, plan_of(i), seqt.tok0, seqt.len, t.x, t.y * group,
                               group, lane, n))
          break;
      }
    } else {
#pragma unroll 1
      for (int i = 1;; ++i) {
        if (!ws_wait(plan_full + 8 * (i & 1), ((i - 1) >> 1) & 1)) break;
        const int4 t = tiles[i & 1];
        if (!t.w) break;
        if (!ws_wait(kv_empty, (i - 1) & 1)) break;
        CMC_WS_MARK(pr_kv);
        const typename HT::seq_t seqt = HT::seq(desc, t.z);
        const int len = seqt.len, k0 = t.x;
        auto tok = [&](int r) { return k0 + r < len ? k0 + r : -1; };
#if CMC_WS_PERSIST_KVTMA
        if (k0 + kBN <= len) {  // whole tiles by TMA boxes (64 x 64); the tile crossing len below
          if (lane == 0) ws_kv_tma<D>(base, maps, kv_full, t.y, (int)(seqt.tok0 + k0));
          CMC_WS_PERSIST_LAP(lane == 0, kPrKvLoad, pr_kv);
          continue;
        }
#endif
#if !defined(CMC_WS_PERSIST_NOKV)  // (bwd_ablate wsperskv0: timing only, the last tile's K, V stay)
        load_rows<D, kBN, 32>(base + L::kK, reinterpret_cast<const unsigned short*>(desc.k) + seqt.tok0 * desc.k_stride_tok +
                                   (cmc_i64)t.y * desc.k_stride_head, desc.k_stride_tok, tok, 0, lane);
        load_rows<D, kBN, 32>(base + L::kV, reinterpret_cast<const unsigned short*>(desc.v) + seqt.tok0 * desc.v_stride_tok +
                                   (cmc_i64)t.y * desc.v_stride_head, desc.v_stride_tok, tok, 0, lane);
#endif
        cp_commit();
        cp_wait<0>();
        fence_proxy_async();
#if CMC_WS_PERSIST_KVTMA
        __syncwarp();
        if (lane == 0) ws_arrive(kv_full);
#else
        ws_arrive(kv_full);
#endif
        CMC_WS_PERSIST_LAP(lane == 0, kPrKvLoad, pr_kv);
      }
    }
  } else {
    ws_setmaxnreg_inc<kWsConsumerRegs>();
    const int ctid = tid - 128;
    int n = 0;
#pragma unroll 1
    for (int i = 0;; ++i) {
      CMC_WS_MARK(pr_top);
      const int4 t = tiles[i & 1];
      if (ctid == 0)
        tiles[(i + 1) & 1] = ws_next_tile<HT, D>(desc, (int)gridDim.x + (int)atomicAdd(cmc_ws_sched, 1u), nkt, units);
      ws_bar_sync(3, 256);
      const int4 nx = tiles[(i + 1) & 1];
      if (nx.w) {
        const typename HT::seq_t sn = HT::seq(desc, nx.z);
        ws_build_plan<HT>(plan_of(i + 1), sn, nx.x, cmc_min(nx.x + kBN, sn.len) - 1, ctid);
      }
      if (ctid == 0) ws_arrive(plan_full + 8 * ((i + 1) & 1));
      CMC_WS_PERSIST_LAP(ctid == 0, kPrTileTop, pr_top);
      if (i > 0) ws_wait(kv_full, (i - 1) & 1);
      CMC_WS_PERSIST_LAP(ctid == 0, kPrKvWait, pr_top);
      CMC_WS_PERSIST_COUNT(ctid == 0, kPrTiles);
      const typename HT::seq_t seqt = HT::seq(desc, t.z);
      ws_consume<BF16, D, true>(WsLinear<H, HT>(seqt, seqt.len, t.x, seqt.tok0, ws_key_row(tid), t.z), desc.scale_log2,
                                smem, base, args, t.y, group, atomic_dq, tid, n, !nx.w);
      if (!nx.w) break;
#if CMC_WS_PERSIST < 2  // (2: ws_consume arrives before its dK / dV stores, which use no buffer)
      ws_bar_sync(3, 256);  // every consumer's dK / dV stores have read the K / V buffers
      if (ctid == 0) ws_arrive(kv_empty);
#endif
    }
  }
}
#endif

// kv_patch warp-specialised (kv_ws's roles; ws_load_patch, ws_consume with WsPatch): the CTA's 128
// keys are forward tile blockIdx.x, K and V gathered by token as kv_patch does.
template <class H, class HT, bool BF16, int D>
CMC_DEV void kv_patch_ws(const typename H::desc_t& desc, const cmc_bwd_args& args, const KvMaps* maps) {
  static_assert(H::kPatchRows % 2 == 0 && H::kPatchRows * H::kPatchCols == kBN, "patch halves of 64 rows");
  constexpr int NTT = HT::kTerms;
  using L = SmemWS<D>;
  extern __shared__ __align__(1024) unsigned char cmc_smem_raw[];
  unsigned char* smem = cmc_smem_raw + ((1024u - (smem_u32(cmc_smem_raw) & 1023u)) & 1023u);
  const unsigned base = smem_u32(smem);
  const int tid = threadIdx.x;
  CMC_WS_MARK(pr_start);
#if CMC_WS_HEAVY_FIRST
  int kt_ = blockIdx.x, hkv_ = blockIdx.y, b_ = blockIdx.z;
  if (args.flags & 2) ws_kv_cta<HT::kHeavyTiles>(kt_, hkv_, b_);
  const int hkv = hkv_, b = b_, kt = kt_;
#else
  const int hkv = blockIdx.y, b = blockIdx.z, kt = blockIdx.x;
#endif
  const typename HT::seq_t seqt = HT::seq(desc, b);
  const int len = seqt.len;
  const cmc_patch_geo geo = cmc_bwd_geo<H>(len);
  int ka, kb;
  if (!cmc_bwd_tile_hull(geo, kt, len, ka, kb)) return;
  const cmc_i64 tok0 = seqt.tok0;
  const int group = desc.heads_q / desc.heads_kv;
  const bool atomic_dq = (args.flags & 1) == 0;
  const cmc_bwd_tile_tokens<H> keys = cmc_bwd_tokens_of<H>(geo, kt, len);
  int* plan = reinterpret_cast<int*>(smem + L::kPlan);

  load_rows<D, kBN, kThreadsWS>(base + L::kK, reinterpret_cast<const unsigned short*>(desc.k) + tok0 * desc.k_stride_tok +
                                     (cmc_i64)hkv * desc.k_stride_head, desc.k_stride_tok, keys, 0, tid);
  load_rows<D, kBN, kThreadsWS>(base + L::kV, reinterpret_cast<const unsigned short*>(desc.v) + tok0 * desc.v_stride_tok +
                                     (cmc_i64)hkv * desc.v_stride_head, desc.v_stride_tok, keys, 0, tid);
  cp_commit();
  if (tid == 0) ws_init_barriers<D>(base);
  build_plan_patch<HT, kThreadsWS>(plan, seqt, geo, kt, ka, kb, tid);
  const unsigned* touched = reinterpret_cast<const unsigned*>(plan + 4 * NTT);
  const unsigned* full = touched + kBwdPatchWords;
  cp_wait<0>();
  fence_proxy_async();
  __syncthreads();  // K, V landed, visible to wgmma; the plan and the mbarrier inits published
  CMC_WS_CTA_READY(pr_start, tid);

  // the geometry and the key map again from len: cheaper than keeping them live across the plan
  // builder (kept live, they spilled 12 bytes on grids with many terms: g_grid77_w96_r40 at 8x16)
  const cmc_patch_geo g2 = cmc_bwd_geo<H>(len);
  const cmc_bwd_tile_tokens<H> keys2 = cmc_bwd_tokens_of<H>(g2, kt, len);  // (WsPatch keeps references)
  ws_roles<BF16, D, WsPatch<H, HT>::kBox>(
      [&](int warp, int lane) {  // warps 0 and 3: stages 0 and 1
        ws_load_patch<H, HT, D>(base, smem, desc, args, maps, touched, (g2.nqt + 31) >> 5, g2, tok0, len, hkv * group,
                                group, lane, warp == 0 ? 0 : 1);
      },
      [&] { return WsPatch<H, HT>(seqt, g2, keys2, full, len, kt, tok0, ws_key_row(tid)); }, desc, args, maps, smem,
      base, hkv, atomic_dq, tid);
}

// The bwd_kv_sm90_ws kind's entry (cmc/kernels.py): kv_ws on a linear tiling, kv_patch_ws on a
// patch tiling (which gathers Q and dO by token, and adds dQ through the maps' boxes of one
// patch row: abi.py).
template <class H, class HT, bool BF16, int D>
CMC_DEV void kv_ws_entry(const typename H::desc_t& desc, const KvMaps& maps, const cmc_bwd_args& args) {
  if constexpr (H::kTiling == 1) kv_patch_ws<H, HT, BF16, D>(desc, args, &maps);
#if CMC_WS_PERSIST
  else kv_ws_persist<H, HT, BF16, D>(desc, args, &maps);
#else
  else kv_ws<H, HT, BF16, D>(desc, args, &maps);
#endif
}

}  // namespace cmc_bwd_sm90
#endif  // !CMC_HOST
