#!/usr/bin/env python3
"""Ablated and alternative builds of the sm_90a backward's kv kernel (bwd_kv_sm90), timed beside
the real one, for finding where its time goes (ablations: timing only, they compute wrong
gradients) and trying a change before it ships (alternatives: also checked, --check).

Each ablation removes one part of the kv kernel's per-item loop (templates/cmc/
attn_bwd_sm90.cuh) by a textual edit of the generated .cu, in memory, that must match the
given number of times; no tracked file is touched. The builds are bwd_kernel_check's own
(`build_variant` with an edit), the timing its `timing` (causal, H=16, D=128, bf16, atomic and
deterministic, each role alone too). The kv time of a variant without part X bounds what
removing X's cost could give. Run on the GPU machine from the repository root:

    CMC_ARCH=sm_90a python3 tools/bwd_ablate.py                 # every ablation and alternative
    CMC_ARCH=sm_90a python3 tools/bwd_ablate.py nored nodqgemm  # some
    CMC_ARCH=sm_90a python3 tools/bwd_ablate.py bulkdq --check  # also bwd_kernel_check's cases
    ncu --clock-control none --kernel-name regex:bwd_kv_sm90 --section SpeedOfLight \\
        env CMC_ARCH=sm_90a python3 tools/bwd_ablate.py ws --once --lengths 4096x8

Alternatives (ALTERNATIVES) switch on a variant the kernel header keeps behind a macro, and
grow the kv kernel's dynamic shared memory as the header does: its static_assert in the .cu
and the launch's byte count.
"""

from __future__ import annotations

import argparse
import functools
import os
import re
import sys
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(ROOT))

# The per-element predicate of kv_p_linear's partial items (the edits below that change it).
_LIN_PRED = ("      if (!(qin && kr < len && HT::visible(seqt, krow0, q))) p0 = 0.f;\n"
             "      if (!(qin && kr + 8 < len && HT::visible(seqt, krow1, q))) p1 = 0.f;")

# name: (what it removes, [(old, new, times old must occur)])
ABLATIONS: dict[str, tuple[str, list[tuple[str, str, int]]]] = {
    "nored": ("the atomic dQ's red.global.add (the dS^T store, barrier and dQ GEMM stay)",
              [("    if (q >= 0) {\n      float* row = acc", "    if (q < -1) {\n      float* row = acc",
                1)]),
    "nodqgemm": ("the atomic dQ's GEMM (its wait and the red.global.add of zeros stay)",
                 [("ss_n64<BF16, 1, 1>(dq, gdesc_at(ds_desc, kk * 2048), gdesc_at(k_desc, kk * 2048), kk);",
                   ";", 1)]),
    "noexp": ("the 2 exponentials per element of P^T become plain FMAs",
              [("float p0 = ex2(fmaf(s[4 * jj + e], sl2, -off)), p1 = ex2(fmaf(s[4 * jj + 2 + e], "
                "sl2, -off));",
                "float p0 = (fmaf(s[4 * jj + e], sl2, -off)), p1 = (fmaf(s[4 * jj + 2 + e], "
                "sl2, -off));", 3)]),
    "nosync": ("the per-item __syncthreads of the linear loop (the warpgroups drift apart)",
               [("    __syncthreads();       // everyone's; everyone is done with stage buf ^ 1 "
                 "and dS^T\n", "", 1)]),
    "noload": ("the next item's copies of Q, dO, LSE and Dsum (stale stages are reused)",
               [("    if (jn >= 0) kv_issue<typename H::desc_t, D>(base, buf ^ 1,",
                 "    if (jn < -1) kv_issue<typename H::desc_t, D>(base, buf ^ 1,", 1)]),
    "lsvis": ("the lockstep kv masking partial linear items by the transposed predicate per "
              "element, not span words (CMC_BWD_KV_SPANS 0: as before 2026-12-05 19:00 UTC)",
              [("#define CMC_BWD_KV_SPANS 1", "#define CMC_BWD_KV_SPANS 0", 1)]),
}


def _stage_bytes(d: int) -> int:
    """attn_bwd_sm90.cuh DqStage<D>::kBytes with CMC_BWD_DQ_BULK = 1."""
    return (1 if d == 128 else 2) * 64 * (d * 4 + 32)


def _tile_stage_bytes(d: int) -> int:
    """DqStage<D>::kBytes with CMC_BWD_DQ_BULK = 2: two parities of two 16 KB blocks."""
    return 2 * 2 * 4096 * 4


def _with_macro(value: int, grow_of: Callable[[int], int],
                macro: str = "CMC_BWD_DQ_BULK") -> Callable[[str], str]:
    """`macro` = value, and each bwd_kv_sm90 block's shared-memory assertion grown by
    grow_of(head dim)."""
    def edit(text: str) -> str:
        out, pos = [f"#define {macro} {value}\n"], 0
        for m in re.finditer(r"#if defined\(CMC_VARIANT_bwd_kv_sm90_\w+_d(\d+)\)\n", text):
            end = text.index("#endif", m.end())
            grow = grow_of(int(m.group(1)))

            def grown(a: re.Match[str], grow: int = grow) -> str:
                return f'== {int(a.group(1)) + grow}, "dynamic shared memory"'

            block, n = re.subn(r'== (\d+), "dynamic shared memory"', grown, text[m.end():end])
            if n != 1:
                raise SystemExit(f"{macro} {value}: {n} shared-memory assertions in "
                                 f"{m.group(0)!r}")
            out += [text[pos:m.end()], block]
            pos = end
        if pos == 0:
            raise SystemExit("no bwd_kv_sm90 variant in the source")
        return "".join(out) + text[pos:]
    return edit


def _tmaload(text: str) -> str:
    """CMC_BWD_KV_TMA = 1; the kv kernels' shared memory grows by the two mbarriers (16
    bytes). Their tensor maps are the module global cmc_kv_maps (TmaBwd writes it)."""
    return _with_macro(1, lambda d: 16, "CMC_BWD_KV_TMA")(text)


def _tma_bwd(bkc):
    """bwd_kernel_check.Bwd whose kv launches also pass the Q, dO (box 64 x 1 x R) and dq_accum
    (fp32, box 32 x 1 x R) tensor maps, made from the descriptor and cmc_bwd_args bytes
    (TmaBwd.layout: the descriptor's; TmaBwd.box_rows: R, as abi.tensor_maps gives the ws kind
    for the build's tiling: 64 on a linear one, a patch row on a patch one)."""
    import struct

    from cuda.bindings import driver as cu

    from cmc.abi import CTYPES, bwd_args_layout
    from cmc.runtime._driver import tensor_map_3d

    def read(layout, data: bytes) -> dict:
        return {f.name: struct.unpack_from("<" + CTYPES[f.ctype][1], data, f.offset)[0]
                for f in layout.fields}

    class TmaBwd(bkc.Bwd):
        layout = None
        dtype = "bf16"
        head_dim = 128
        box_rows = 64
        kv_maps = False
        _written: dict = {}

        def launch_role(self, role, desc, args, max_len, hq, hk, batch):
            if role != "kv":
                return super().launch_role(role, desc, args, max_len, hq, hk, batch)
            dv, av = read(self.layout, desc), read(bwd_args_layout(), args)
            d = self.head_dim
            total = av["total_tokens"]
            r = self.box_rows
            maps = b"".join(tensor_map_3d(self.dtype, ptr, (d, hq, total), (2 * sh, 2 * st),
                                          (64, 1, r))
                            for ptr, st, sh in ((dv["q"], dv["q_stride_tok"], dv["q_stride_head"]),
                                                (av["dout"], av["dout_stride_tok"],
                                                 av["dout_stride_head"])))
            # dq_accum, fp32 [T, Hq, D] contiguous, boxes of 32 x R (the ws writers' adds)
            maps += tensor_map_3d("f32", av["dq_accum"], (d, hq, total), (4 * d, 4 * d * hq),
                                  (32, 1, r))
            if self.kv_maps:  # K, V (box 64 x 1 x 64): the persistent kv's TMA loads (wsperst)
                maps += b"".join(tensor_map_3d(self.dtype, dv[t], (d, hk, total),
                                               (2 * dv[f"{t}_stride_head"], 2 * dv[f"{t}_stride_tok"]),
                                               (64, 1, 64)) for t in ("k", "v"))
            f = self.k[role][0]
            if self._written.get(f) != maps:  # the global, written only when the maps change
                mod = bkc.kc._ok(cu.cuFuncGetModule(f), "cuFuncGetModule")
                ptr, size = bkc.kc._ok(cu.cuModuleGetGlobal(mod, b"cmc_kv_maps"), "global")
                assert int(size) == len(maps), (int(size), len(maps))
                bkc.kc._ok(cu.cuCtxSynchronize(), "sync")
                bkc.kc._ok(cu.cuMemcpyHtoD(ptr, maps, len(maps)), "cuMemcpyHtoD")
                self._written[f] = maps
            return super().launch_role(role, desc, args, max_len, hq, hk, batch)

    return TmaBwd


# attn_bwd_sm90.cuh SmemWS<D>::kPlan - SmemKV<D>::kPlan (the macros off): a second dS^T
# buffer, two dQ stagings of 64 rows x (256 + 32) bytes, the item slots, four mbarriers and
# the stagings' row tokens.
WS_SMEM_GROWTH = 128 * 64 * 2 + 2 * 64 * (64 * 4 + 32) + 2 * 16 + 16 + 16 + 2 * (16 + 64 * 4)
WS_THREADS = 384


def _ws(text: str) -> str:
    """CMC_BWD_KV_WS = 1 (attn_bwd_sm90_ws.cuh) with the mbarrier watchdog; the kv kernels'
    shared memory grows by WS_SMEM_GROWTH and their asserted threads become 384."""
    text = _with_macro(1, lambda d: WS_SMEM_GROWTH, "CMC_BWD_KV_WS")(text)
    # only in the kv variants' compiles (the dq kind shares load_tile, whose stride it sets)
    kv = sorted(set(re.findall(r"defined\((CMC_VARIANT_bwd_kv_sm90_\w+)\)", text)))
    cond = " || ".join(f"defined({v})" for v in kv)
    text = text.replace("#define CMC_BWD_KV_WS 1\n", f"#if {cond}\n#define CMC_BWD_KV_WS 1\n#endif\n", 1)
    text, n = re.subn(r"(static_assert\(cmc_bwd_sm90::Cfg<\d+>::kThreadsKV == )"
                      + str(256) + r'(, "threads"\);)', rf"\g<1>{WS_THREADS}\2", text)
    if n == 0:
        raise SystemExit("ws: no bwd_kv_sm90 threads assertion in the source")
    return "#define CMC_SM90_WATCHDOG 1\n" + text


def _watchdogs_fired(bkc, funcs) -> int:
    """How many of the launched kv functions' modules have cmc_ws_watchdog set (ws builds
    define it, attn_bwd_sm90_ws.cuh ws_wait)."""
    import numpy as np
    from cuda.bindings import driver as cu

    fired = 0
    for f in funcs:
        mod = bkc.kc._ok(cu.cuFuncGetModule(f), "cuFuncGetModule")
        err, ptr, size = cu.cuModuleGetGlobal(mod, b"cmc_ws_watchdog")
        if err != cu.CUresult.CUDA_SUCCESS:
            continue
        bkc.kc._ok(cu.cuCtxSynchronize(), "sync")
        host = np.zeros(1, np.uint32)
        (err,) = cu.cuMemcpyDtoH(host.ctypes.data, ptr, host.nbytes)
        if err != cu.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"cuMemcpyDtoH of cmc_ws_watchdog: {err}")
        fired += int(host[0] != 0)
    return fired


# name: (what it changes, edit of the .cu text, extra kv shared memory per head dim)
ALTERNATIVES: dict[str, tuple[str, Callable[[str], str], Callable[[int], int]]] = {
    "bulkdq": ("the atomic dQ staged in shared memory, one cp.reduce.async.bulk per row "
               "(CMC_BWD_DQ_BULK 1)", _with_macro(1, _stage_bytes), _stage_bytes),
    "tiledq": ("linear items' dQ staged in fragment order, one 16 KB cp.reduce.async.bulk per "
               "warpgroup and item (CMC_BWD_DQ_BULK 2; timing only: not post's layout)",
               _with_macro(2, _tile_stage_bytes), _tile_stage_bytes),
    "tmaload": ("the linear kv's Q and dO copies by TMA from thread 0 into the ring stage, "
                "completing a stage mbarrier (CMC_BWD_KV_TMA 1; LSE, Dsum stay cp.async)",
                _tmaload, lambda d: 16),
    "red4": ("the atomic dQ by red.global.add.v4.f32, lane pairs swapping a row's pair (half "
             "the requests; CMC_BWD_DQ_BULK 3)", _with_macro(3, lambda d: 0), lambda d: 0),
    "ws": ("warp-specialised kv: a loader warp (TMA Q, dO; cp.async LSE, Dsum; mbarrier ring), "
           "dQ before dK, dQ bulk-added by writer warps (CMC_BWD_KV_WS 1; 384 threads)",
           _ws, lambda d: WS_SMEM_GROWTH),
    "wsred": ("ws with the writer warps adding dQ by red.global.add.v4.f32 from the staging "
              "(CMC_WS_DQ_RED 1)", lambda t: "#define CMC_WS_DQ_RED 1\n" + _ws(t),
              lambda d: WS_SMEM_GROWTH),
}


def _ws_without(edits: list[tuple[str, str, int]]) -> Callable[[str], str]:
    """ws with `edits` (apply's) on its part of the .cu text: the ws ablations below."""
    return lambda text: apply(_ws(text), edits)


# The alternatives _ws_alt registers: ws with macros defined (all of them in WS_BASED).
WS_MACRO_ALTS: set[str] = set()


def _ws_alt(name: str, what: str, **macros: int) -> None:
    """Alternative `name`: ws with these template macros defined (CMC_... = value)."""
    head = "".join(f"#define CMC_{k} {v}\n" for k, v in macros.items())
    ALTERNATIVES[name] = (what, lambda text: head + _ws(text), lambda d: WS_SMEM_GROWTH)
    WS_MACRO_ALTS.add(name)


# The ws kernel's atomic dQ path taken apart (timing only: wrong gradients). Where its 1.3 ms
# at causal 4K x 8 goes (ws atomic kv 3.31 ms, ws deterministic kv 2.01; docs/kernel-notes.md,
# "The warp-specialised kv on the H200"): the writers' bulk adds, the consumers' staging
# stores, the dQ GEMM.
WS_ABLATIONS = {
    "wsnobulk": ("ws whose dQ writers issue no adds, neither the row bulk adds nor the TMA "
                 "tensor adds (they still wait for and release each staging)",
                 [("      if (tok >= 0)\n        bulk_reduce_add_f32(",
                   "      if (tok < -1)\n        bulk_reduce_add_f32(", 1),
                  ("          tma_reduce_add(&maps->dq, stg + b * (BOX * 128), col, hq, rows[4 + b]);\n"
                   "          tma_reduce_add(&maps->dq, stg + 8192 + b * (BOX * 128), col + 32, hq, "
                   "rows[4 + b]);\n", "", 1)]),
    "wsnostage": ("ws whose consumers do not store the dQ partial to the staging (behind a "
                  "condition that never holds, so the GEMM stays; the hand-off stays)",
                  [("        *reinterpret_cast<float2*>(row + 8 * jj) = make_float2(dq[4 * jj + "
                    "2 * i], dq[4 * jj + 2 * i + 1]);",
                    "        if (hq < -1) *reinterpret_cast<float2*>(row + 8 * jj) = "  # never: the
                    "make_float2(dq[4 * jj + 2 * i], dq[4 * jj + 2 * i + 1]);", 1),  # GEMM stays live
                   ("        *reinterpret_cast<float2*>(stg + (jj >> 2) * 8192",
                    "        if (hq < -1) *reinterpret_cast<float2*>(stg + (jj >> 2) * 8192", 1)]),
    "wsnomask": ("ws without the per-element mask of partial tiles (P^T unmasked there; with "
                 "--mask grid96: what the mask's evaluation costs the backward)",
                 [(_LIN_PRED, "      (void)qin;  // (ablated)", 1),
                  ("  if (mw_ok) {  // (mw_ok implies a partial tile)\n    if (qbase + kBM > len",
                   "  if (false) {\n    if (qbase + kBM > len", 1)]),
    "wsnobar": ("ws without the per-item barrier of both consumer warpgroups before the dQ "
                "GEMM (D 128: each reads both halves of dS^T; the warpgroups drift apart, dQ "
                "reads a half-written dS^T): what the lockstep costs",
                [("    if constexpr (DQ<D>::kSplitN) ws_bar_sync(3, 256);",
                  "    if constexpr (false) ws_bar_sync(3, 256);", 1)]),
    "wsnodqgemm": ("ws without the dQ GEMM (zeros are staged and added)",
                   [("      ss_n64<BF16, 1, 1>(dq, gdesc_at(ds_desc, 2048 * kk), gdesc_at(k_desc, 2048 * kk), kk);",
                     "      ;", 1)]),
    "wsnodsst": ("ws without the dS^T stores to shared memory (dQ reads a stale dS^T; the fence "
                 "and the barrier stay)",
                 [("      *reinterpret_cast<unsigned*>(sds + swz<kBN>(lr, jj) + off) = dsa[2 * jj];",
                   "      if (hq < -1) *reinterpret_cast<unsigned*>(sds + swz<kBN>(lr, jj) + off) = "
                   "dsa[2 * jj];", 1),
                  ("      *reinterpret_cast<unsigned*>(sds + swz<kBN>(lr + 8, jj) + off) = "
                   "dsa[2 * jj + 1];",
                   "      if (hq < -1) *reinterpret_cast<unsigned*>(sds + swz<kBN>(lr + 8, jj) + off) "
                   "= dsa[2 * jj + 1];", 1)]),
    "wspnoqdo": ("ws whose patch loaders copy no Q or dO rows (LSE and Dsum only, by the cp.async "
                 "loader: CMC_WS_PATCH_TMA 0; the consumers read stale stages): the ceiling of any "
                 "patch loader (--mask clear_patch)",
                 [("#define CMC_WS_PATCH_TMA 1\n", "#define CMC_WS_PATCH_TMA 0\n", 1),
                  ("      ws_copy_rows<D>(base, st, desc, args, tok0, hq0 + g, [&](int r) { return "
                   "rows(64 * hh + r); }, true, lane);",
                   "      ws_copy_rows<D>(base, st, desc, args, tok0, hq0 + g, [&](int r) { return "
                   "rows(64 * hh + r); }, false, lane);", 1)]),
}
for _n, (_what, _edits) in WS_ABLATIONS.items():
    ALTERNATIVES[_n] = (_what, _ws_without(_edits), lambda d: WS_SMEM_GROWTH)
# The kind before its writers added items of consecutive tokens by TMA tensor reduce-adds
# (linear items: 2026-12-05 run 15; patch items, by patch-row boxes: later that day): every
# item by one bulk add per row. Correct, so --check runs it.
ALTERNATIVES["wsrows"] = (
    "ws whose writers add every item by one cp.reduce.async.bulk per row (no TMA tensor adds)",
    _ws_without([("  CMC_DEV int boxes(const Item& i) const { return CMC_DQ_BLOCK64 ? blk0 + i.j : i.qbase + kBM <= len ? 1 : 0; }",
                  "  CMC_DEV int boxes(const Item&) const { return 0; }", 1),
                 ("  CMC_DEV int boxes(const Item& i) const { return cmc_bwd_item_runs<kBox>(i.qrows, i.r0); }",
                  "  CMC_DEV int boxes(const Item&) const { return 0; }", 1)]),
    lambda d: WS_SMEM_GROWTH)
# The kind before span words (2026-12-05): partial linear items masked by the transposed
# predicate per element after the S^T GEMM. Correct, so --check runs it.
ALTERNATIVES["wsvis"] = (
    "ws masking partial linear items by the transposed predicate per element, not span words "
    "(CMC_BWD_KV_SPANS 0)",
    _ws_without([("#define CMC_BWD_KV_SPANS 1", "#define CMC_BWD_KV_SPANS 0", 1)]),
    lambda d: WS_SMEM_GROWTH)
# The kv's P^T words. Run 25 (kernel notes): by R2P after the exponentials' loop the words
# made the grids' backward 6-9 % faster (linear items) and CLEAR's 3 % slower (patch items);
# run 26: the patch items' word inside the loop, bits ascending, 8 % faster than a bit per
# element; run 27: the linear items' word inside the loop too (both now the default), the
# grids' backward 5-15 % faster than after it. wsbitpatch: the patch items bit by bit as in
# runs 21-25; wsbitlin: the linear items bit by bit (as before 2026-12-07); wslinafter: the
# linear items' word after the loop (runs 25-26). All correct (checked), for timing.
_LIN_WORD_LOOP = "  if (mw_ok) {  // (mw_ok implies a partial tile)\n    if (qbase + kBM > len"
ALTERNATIVES["wsbitpatch"] = (
    "ws with the patch items' P^T word applied bit by bit (the default of runs 21-25)",
    _ws_without([("  if (mw_ok) {  // (the word applied after the loop", "  if (false) {  // (the word applied after the loop", 1),
                 ("      if (!is_full) {\n        const int q = qrows(r0 + c);",
                  "      if (mw_ok) {\n"
                  "        p0 = (mw >> cmc_bwd_kv_mask_bit(0, jj, e)) & 1u ? fminf(p0, 2.f) : 0.f;\n"
                  "        p1 = (mw >> cmc_bwd_kv_mask_bit(1, jj, e)) & 1u ? fminf(p1, 2.f) : 0.f;\n"
                  "      } else if (!is_full) {\n        const int q = qrows(r0 + c);", 1)]),
    lambda d: WS_SMEM_GROWTH)
ALTERNATIVES["wsbitlin"] = (
    "ws with the linear items' P^T word applied bit by bit in the exponentials' loop",
    _ws_without([(_LIN_WORD_LOOP, "  if (false) {\n    if (qbase + kBM > len", 1),
                 (_LIN_PRED,
                  "      const bool v0 = mw_ok ? ((mw >> cmc_bwd_kv_mask_bit(0, jj, e)) & 1u) != 0u"
                  " : HT::visible(seqt, krow0, q);\n"
                  "      const bool v1 = mw_ok ? ((mw >> cmc_bwd_kv_mask_bit(1, jj, e)) & 1u) != 0u"
                  " : HT::visible(seqt, krow1, q);\n"
                  "      if (!(qin && kr < len && v0)) p0 = 0.f;\n"
                  "      if (!(qin && kr + 8 < len && v1)) p1 = 0.f;", 1)]),
    lambda d: WS_SMEM_GROWTH)
ALTERNATIVES["wslinafter"] = (
    "ws with the linear items' P^T word applied by R2P after the exponentials' loop (runs 25-26)",
    _ws_without([(_LIN_WORD_LOOP, "  if (false) {\n    if (qbase + kBM > len", 1),
                 (_LIN_PRED,
                  "      if (!mw_ok && !(qin && kr < len && HT::visible(seqt, krow0, q))) p0 = 0.f;\n"
                  "      if (!mw_ok && !(qin && kr + 8 < len && HT::visible(seqt, krow1, q))) p1 = 0.f;", 1),
                 ("      s[4 * jj + 2 + e] = p1;\n    }\n  }\n}\n\ntemplate <class H, class HT, bool BF16, int D>\n"
                  "CMC_DEV void kv(",
                  "      s[4 * jj + 2 + e] = p1;\n    }\n  }\n  if (mw_ok) {\n"
                  "    if (qbase + kBM > len || kr + 8 >= len) mw &= cmc_bwd_kv_len_word(qbase, len, cq, kr < len, kr + 8 < len);\n"
                  "    for (int b = 0; b < 32; ++b)\n      if (!(mw & (1u << b))) s[cmc_bwd_word_elem(b)] = 0.f;\n"
                  "  }\n}\n\ntemplate <class H, class HT, bool BF16, int D>\n"
                  "CMC_DEV void kv(", 1)]),
    lambda d: WS_SMEM_GROWTH)
# For racecheck, not speed (correct; a little slower): whether its hazards on the LSE ring
# came from the cp.async-completed mbarrier arrival. Run 15: the same hazards as ws, so not
# (docs/kernel-notes.md, "Run 15").
ALTERNATIVES["wsplain"] = (
    "ws whose loader waits for its LSE and Dsum copies and arrives plainly (no "
    "cp.async.mbarrier.arrive.noinc)",
    _ws_without([("    ws_filled(fullb, edge);", "    ws_filled(fullb, true);", 1)]),
    lambda d: WS_SMEM_GROWTH)
# Where a ws item's cycles go, phase by phase (CMC_WS_PROBE: clock laps by thread 0 of each
# consumer warpgroup, lane 0 of each dQ writer and of the loader; correct gradients, so --check
# runs it). The 1.1 ms between ws's atomic and deterministic kv (run 15) is read off as the
# phases that grow between the two modes (ws_probe below).
_ws_alt("wsprobe",
    "ws with clock cycle counters per phase of an item (CMC_WS_PROBE; correct, a little "
    "slower), read back and printed per mode after the timings", WS_PROBE=1)
# attn_bwd_sm90_ws.cuh enum WsProbe: consumer phases of an item, in their order
PROBE_PHASES = ("full", "issue", "word", "wait_s", "p", "dv_ds", "ds_st", "bar", "issue_dq_dk",
                "wait_dq", "stg_wait", "stage", "wait_dk")
PROBE_ITEMS, PROBE_LOOP, PROBE_FIRST_FULL = 13, 14, 15
PROBE_WRITER = {"full": 16, "add": 17, "items": 18}
PROBE_LOADER = {"empty": 20, "issue": 21, "items": 22}
PROBE_CTA = {"prologue": 24, "epilogue": 25, "ctas": 26}
PROBE_TILES = {"top": 27, "kv": 28, "tiles": 29, "load": 30}  # kv_ws_persist's (wspersprobe)


def probe_summary(sums, calls: int) -> list[str]:
    """The lines ws_probe prints from the 32 counters summed over every CTA row (cycles, and
    counts in the items / ctas slots): consumer cycles per warpgroup item by phase, the dQ
    writers' and the loader's per item, and the CTA's set-up and dK / dV stores per CTA."""
    items = max(float(sums[PROBE_ITEMS]), 1.0)
    phases = {n: float(sums[i]) / items for i, n in enumerate(PROBE_PHASES)}
    loop = float(sums[PROBE_LOOP]) / items
    share = {n: 100 * v / max(loop, 1.0) for n, v in phases.items()}
    wi = max(float(sums[PROBE_WRITER["items"]]), 1.0)
    li = max(float(sums[PROBE_LOADER["items"]]), 1.0)
    ctas = max(float(sums[PROBE_CTA["ctas"]]), 1.0)
    firsts = 2 * ctas  # a CTA's two consumer warpgroups' first items (a persistent CTA's once)
    rest = max(items - firsts, 1.0)
    return [
        f"  consumer: {items / calls:.0f} warpgroup items per call, {loop:.0f} cycles per item "
        f"(phases sum to {sum(phases.values()):.0f})",
        "  per item: " + "  ".join(f"{n} {v:.0f}" for n, v in phases.items()),
        "  share:    " + "  ".join(f"{n} {v:.1f}%" for n, v in share.items()),
        f"  dQ writers per item: staging full wait {sums[PROBE_WRITER['full']] / wi:.0f}, "
        f"adds and release {sums[PROBE_WRITER['add']] / wi:.0f} ({wi / calls:.0f} items per call)",
        f"  loader per item: empty wait {sums[PROBE_LOADER['empty']] / li:.0f}, issue "
        f"{sums[PROBE_LOADER['issue']] / li:.0f} ({li / calls:.0f} pushes per call)",
        f"  per CTA: set-up {sums[PROBE_CTA['prologue']] / ctas:.0f}, dK and dV stores "
        f"{sums[PROBE_CTA['epilogue']] / (2 * ctas):.0f} cycles ({ctas / calls:.0f} CTAs per call)",
        f"  full wait: a warpgroup's first item {sums[PROBE_FIRST_FULL] / firsts:.0f}, the others "
        f"{(sums[PROBE_PHASES.index('full')] - sums[PROBE_FIRST_FULL]) / rest:.0f} cycles",
    ] + ([] if not sums[PROBE_TILES["tiles"]] else [
        f"  persistent, per tile ({sums[PROBE_TILES['tiles']] / calls:.0f} a call, "
        f"{sums[PROBE_TILES['tiles']] / ctas:.1f} a CTA): stores "
        f"{sums[PROBE_CTA['epilogue']] / (2 * sums[PROBE_TILES['tiles']]):.0f}, next tile and its "
        f"plan {sums[PROBE_TILES['top']] / sums[PROBE_TILES['tiles']]:.0f}, then the K / V wait "
        f"{(sums[PROBE_TILES['kv']] - sums[PROBE_TILES['top']]) / sums[PROBE_TILES['tiles']]:.0f}; "
        f"warp 3's K / V load {sums[PROBE_TILES['load']] / max(sums[PROBE_TILES['tiles']] - ctas, 1):.0f}"])


def ws_probe(bkc, bwd, layout, table, L: int, B: int, calls: int = 5, name: str = "wsprobe") -> list[str]:
    """A probed variant's counters (module global cmc_ws_probe) over `calls` kv launches alone,
    atomic then deterministic, each from zero: probe_summary per mode, headed by its name."""
    import numpy as np
    from cuda.bindings import driver as cu

    H = 16
    desc, make_args, _ = bkc.timing_problem(layout, table, "bf16", L, B, H)
    out = []
    for det in (False, True):
        args = make_args(det)
        bwd.run(desc, args, L, H, H, B, det)  # writes the kv's maps (TmaBwd) and warms up
        mod = bkc.kc._ok(cu.cuFuncGetModule(bwd.k["kv"][0]), "cuFuncGetModule")
        ptr, size = bkc.kc._ok(cu.cuModuleGetGlobal(mod, b"cmc_ws_probe"), "cmc_ws_probe")
        bkc.kc._ok(cu.cuCtxSynchronize(), "sync")
        bkc.kc._ok(cu.cuMemsetD8(ptr, 0, size), "cuMemsetD8")
        for _ in range(calls):
            bwd.launch_role("kv", desc, args, L, H, H, B)
        bkc.kc._ok(cu.cuCtxSynchronize(), "sync")
        host = np.zeros(int(size) // 8, dtype=np.uint64)
        bkc.kc._ok(cu.cuMemcpyDtoH(host.ctypes.data, ptr, int(size)), "cuMemcpyDtoH")
        sums = host.reshape(-1, 32).astype(np.float64).sum(axis=0)
        out.append(f"{name} {'deterministic' if det else 'atomic dQ'} L={L} B={B}, {calls} kv "
                   "launches:")
        out += probe_summary(sums, calls)
    return out


# ws before its patch loaders took whole-row items as TMA boxes (run 21, 2026-12-06: the kv on
# clear_patch 4K x 8 4.34 -> 3.40 ms; kernel notes, "A TMA patch loader for the ws kv"): every
# item's Q and dO rows by cp.async chunks. Correct, so --check runs it.
_ws_alt("wspcp",
    "ws whose patch loaders bring every item by cp.async chunks, not TMA boxes of one patch row "
    "(CMC_WS_PATCH_TMA 0)", WS_PATCH_TMA=0)

# SmemWS's persistent fields besides the second plan: two tiles (32 bytes), four mbarriers (32)
PERSIST_SMEM = 32 + 32

# post folded into the linear ws kv (kernel notes, "Run 22": pre and post are 0.35 ms at causal
# 1K-4K; FA4 runs both too): the last kv CTA of each (sequence, kv head)
# converts its dQ, and the atomic sequence launches no post (FUSED_POST). Linear tilings only
# (kv_patch_ws does not convert). Predicted: causal +8 % at 1K x 32, +6 % at 2K x 16, +4 % at
# 4K x 8. Correct if the counting is, so --check runs it.
_ws_alt("wsfuse",
    "ws converting dQ itself, post's work, in the last kv CTA of each sequence and kv head "
    "(CMC_WS_FUSE_POST 1; linear tilings; the atomic sequence is pre, kv)", WS_FUSE_POST=1)
FUSED_POST = {"wsfuse"}

# The persistent linear ws kv (kernel notes, "A persistent kv"; run 22's probe: at causal 1K x
# 32 a kv CTA's set-up is 7,440 cycles and its first item's wait long, over about 9 items): one
# CTA per SM takes key tiles from a counter; the next tile's plan is built, its first items
# loaded and its K, V loaded while the current tile ends. Linear tilings only. Correct if the
# hand-offs are, so --check runs it.
def _persist(text: str, level: int = 1, macro: str = "CMC_WS_PERSIST") -> str:
    """CMC_WS_PERSIST = level on ws, its second plan buffer sized by the transposed hooks' term
    count (CMC_WS_PLAN2_BYTES); the growth is kept for the launch (_PERSIST_GROWTH: _build
    calls the edit and then the growth in one process)."""
    m = re.search(r"struct cmc_hooks_t \{\n  typedef \w+ desc_t;\n  enum : int \{ kTerms = (\d+) \};", text)
    if m is None:
        raise SystemExit("wspers: no cmc_hooks_t term count in the source")
    plan2 = ((8 * int(m.group(1)) + 2) * 4 + 15) // 16 * 16
    _PERSIST_GROWTH[0] = PERSIST_SMEM + plan2
    text = _with_macro(level, lambda d: PERSIST_SMEM + plan2, macro)(text)
    return _ws(f"#define CMC_WS_PLAN2_BYTES {plan2}\n" + text)


_PERSIST_GROWTH = [0]


def _persist_alt(what: str, level: int = 1, macro: str = "CMC_WS_PERSIST", **more: int
                 ) -> tuple[str, Callable[[str], str], Callable[[int], int]]:
    """An alternative: _persist(level, macro) with these attn_bwd_sm90_ws.cuh macros too."""
    head = "".join(f"#define CMC_{k} {v}\n" for k, v in more.items())
    return (what, lambda text: head + _persist(text, level, macro),
            lambda d: WS_SMEM_GROWTH + _PERSIST_GROWTH[0])


ALTERNATIVES["wspers"] = _persist_alt(
    "ws persistent: a CTA per SM takes linear key tiles from a counter, the next tile's plan, "
    "items and K, V loaded under the current one's end (CMC_WS_PERSIST 1)")
# wspers with dK, dV stored from registers (no staging in the K / V buffers), so the next tile's
# K, V load under the stores (K / V empty arrived at the epilogue's start)
ALTERNATIVES["wspers2"] = _persist_alt(
    "wspers storing dK, dV from registers, the next tile's K, V loaded under the stores "
    "(CMC_WS_PERSIST 2)", 2)
# wspers with wsprobe's cycle counters (per item as wsprobe; "per CTA" there is per persistent
# CTA: its one set-up, and the dK / dV stores of all its tiles; per tile: PROBE_TILES)
ALTERNATIVES["wspersprobe"] = _persist_alt(
    "wspers with clock cycle counters per phase of an item (CMC_WS_PROBE)", WS_PROBE=1)
# wspers whose warp 3 loads no K, V (timing only: what the K / V hand-off costs per tile)
ALTERNATIVES["wsperskv0"] = _persist_alt(
    "wspers whose warp 3 loads no K, V after the first tile (timing only)", WS_PERSIST_NOKV=1)
# wspers (and wspers2) whose warp 3 loads K, V by TMA boxes (K / V maps after dq_accum's), the
# tile crossing len by cp.async (run 23: warp 3's 4,096 cp.async took 15K cycles a tile). (The
# next ticket fetched a tile ahead spilled grid96's consumers, 4-12 bytes: not kept.)
ALTERNATIVES["wsperst"] = _persist_alt(
    "wspers loading K, V by TMA (CMC_WS_PERSIST_KVTMA 1)", WS_PERSIST_KVTMA=1)
ALTERNATIVES["wsperst2"] = _persist_alt(
    "wspers2 loading K, V by TMA (CMC_WS_PERSIST 2, CMC_WS_PERSIST_KVTMA 1)", 2, WS_PERSIST_KVTMA=1)
ALTERNATIVES["wsperstprobe"] = _persist_alt(
    "wsperst with clock cycle counters (CMC_WS_PROBE)", WS_PROBE=1, WS_PERSIST_KVTMA=1)
# kv_ws (one tile a CTA) with K, V by TMA from thread 0, waited for by the consumers alone: the
# loader's first items go out beside them (the persistent layout's K / V barrier, unused fields)
ALTERNATIVES["wskvtma"] = _persist_alt(
    "ws loading K, V by TMA boxes, waited for by the consumers alone (CMC_WS_KV_TMA 1)",
    macro="CMC_WS_KV_TMA")
# wsperst with units costliest first in L2 groups (run 23: wsperst's tiles cost less than kv_ws's
# set-up and stores, yet its kv was 6 % slower at causal 16K x 2: a long key tile reserved a tile
# ahead at the end)
ALTERNATIVES["wspersl"] = _persist_alt(
    "wsperst with units costliest first in L2 groups (CMC_WS_PERSIST_LPT 1)", WS_PERSIST_LPT=1,
    WS_PERSIST_KVTMA=1)
ALTERNATIVES["wspersl2"] = _persist_alt(
    "wsperst2 with units costliest first in L2 groups (CMC_WS_PERSIST_LPT 1)", 2,
    WS_PERSIST_LPT=1, WS_PERSIST_KVTMA=1)
# wsperst on the shipped linear kv's layout since run 50 (dq_accum in 64-row blocks): for masks
# whose key tiles hold few items (run 51: g_doc_window, about 14 an item at 4K against causal's
# 33), where a CTA's start and first items' waits weigh most
ALTERNATIVES["wsperstfrag"] = _persist_alt(
    "wsperst with dq_accum in 64-row blocks (CMC_WS_PERSIST_KVTMA 1, CMC_DQ_BLOCK64 1)",
    WS_PERSIST_KVTMA=1, DQ_BLOCK64=1)
PERSISTENT = {"wspers", "wspers2", "wspersprobe", "wsperskv0", "wsperst", "wsperst2", "wsperstprobe",
              "wspersl", "wspersl2", "wsperstfrag"}
# (wskvtma is not persistent: run 23 launched it on the persistent grid by mistake, one CTA per
# SM of a one-tile kernel, and read its missing tiles as a fault of the kernel)
KV_MAPS = {"wsperst", "wsperst2", "wsperstprobe", "wskvtma", "wspersl", "wspersl2", "wsperstfrag"}

# FA3 / FA4's two small differences, in ws by default since run 16 (2026-12-06: causal 4K x 8
# kv atomic 2.95 -> 2.82 ms, grid96 8.39 -> 7.79; docs/kernel-notes.md, "Run 16"): dS^T stored
# by stmatrix.x4 (4 per warp instead of 16 st.shared.b32) and an item's LSE read into registers
# while the S^T GEMM runs. Each variant below is ws without one or both. Correct, so --check
# runs them.
_ws_alt("wsnostsm",
    "ws storing dS^T to shared memory by st.shared.b32, not stmatrix (CMC_WS_STSM 0)", WS_STSM=0)
_ws_alt("wsnolse",
    "ws reading an item's LSE from shared memory after the S^T wait (CMC_WS_LSE_REGS 0)",
    WS_LSE_REGS=0)
_ws_alt("wsnofa",
    "ws before run 16: neither of FA3 / FA4's differences (CMC_WS_LSE_REGS 0, CMC_WS_STSM 0)",
    WS_LSE_REGS=0, WS_STSM=0)
# Item n - 1's dQ inside item n (attn_bwd_sm90_ws.cuh CMC_WS_DQ_LAG): the two consumer
# warpgroups wait for each other's dS^T of the item before, not at a barrier of both per item.
_ws_alt("wslag",
    "ws with item n - 1's dQ computed in item n after its dS, no per-item barrier of both consumer "
    "warpgroups (CMC_WS_DQ_LAG 1)", WS_DQ_LAG=1)
_ws_alt("wslagpp",
    "wslag with the consumer warpgroups taking turns to issue their GEMMs, two blocks an item "
    "(S^T, dP^T; dQ(n - 1), dV, dK after dS), the forward's ping-pong (CMC_WS_DQ_LAG 2)", WS_DQ_LAG=2)
_ws_alt("wslagppprobe", "wslagpp with wsprobe's clock laps (CMC_WS_DQ_LAG 2, CMC_WS_PROBE 1)",
        WS_DQ_LAG=2, WS_PROBE=1)
_ws_alt("wslagprobe", "wslag with wsprobe's clock laps (CMC_WS_DQ_LAG 1, CMC_WS_PROBE 1)",
        WS_DQ_LAG=1, WS_PROBE=1)
# FA3 / FA4's dQ hand-off (run 28's ncu: FA4 stages dQ by 8 st.shared.v4 and adds 16 KiB a
# warpgroup item in one bulk copy, its dQaccum in accumulator order): dq_accum in 64-row blocks
# in that order (CMC_DQ_BLOCK64; pre, post and the portable kinds follow), so it is checked.
_ws_alt("wsfrag",
    "ws with dq_accum in 64-row blocks in accumulator order: dQ staged by 8 st.shared.v4 and "
    "added by one 16 KiB bulk copy per warpgroup item (CMC_DQ_BLOCK64 1)", DQ_BLOCK64=1)
# The item's LSE offsets and Dsum stored so that each consumer thread's 16 values are
# contiguous, read by 4 ld.shared.v4 instead of 8 ld.shared.v2 (run 29's ncu: the LSE loads
# outlast the S^T wgmmas they are issued under). Correct, so --check runs it.
_ws_alt("wsstatv4",
    "ws reading an item's LSE offsets and Dsum by 4 ld.shared.v4 each, its loader storing them "
    "per thread (CMC_BWD_STAT_V4 1)", BWD_STAT_V4=1)
# The token-major staging's addresses from one per-thread base and XOR immediates (run 28's
# ncu: about 35 integer instructions rebuilt the 16 swizzled addresses every item): what of
# wsfrag's gain the addresses alone give, with the layout unchanged. Correct, so --check runs it.
_ws_alt("wsstg",
    "ws staging dQ at one per-thread base plus XOR immediates, the same swizzled layout "
    "(CMC_WS_STG_XOR 1)", WS_STG_XOR=1)
# The item's LSE offsets loaded under its S^T and dP^T wgmmas, as before run 50 (the shipped
# kernel loads a linear item's before issuing them: CMC_WS_LSE_FIRST 1; run 50 on an H100, this
# order's atomic causal backward 7.6 % / 8.4 % longer at 4K / 16K). Correct, so --check runs it.
_ws_alt("wslselate",
    "ws loading the item's LSE offsets under its S^T and dP^T, as before run 50 "
    "(CMC_WS_LSE_FIRST 0)", WS_LSE_FIRST=0)
# A linear item's Dsum read into registers once P is made, before dV is issued (run 28's ncu:
# 11 K samples waiting for the Dsum loads after the dP^T wait). Correct, so --check runs it.
_ws_alt("wsdsumregs",
    "ws reading a linear item's Dsum into registers before issuing dV, not after the dP^T wait "
    "(CMC_WS_DSUM_REGS 1)", WS_DSUM_REGS=1)
# The spill fallback's kv on the block layout (what natten's d128 kv ships since 5a25061).
_ws_alt("wsfraglselate",
    "wsfrag with the LSE offsets read under S^T and dP^T (CMC_DQ_BLOCK64 1, CMC_WS_LSE_FIRST 0)",
    DQ_BLOCK64=1, WS_LSE_FIRST=0)
# The same on the shipped linear kv since run 50 (wsfrag: dq_accum in 64-row blocks).
_ws_alt("wsfragdsum",
    "wsfrag reading a linear item's Dsum into registers before issuing dV (CMC_DQ_BLOCK64 1, "
    "CMC_WS_DSUM_REGS 1)", DQ_BLOCK64=1, WS_DSUM_REGS=1)
# pre and post with every load of a thread issued before its first use (run 51: at causal 4K x
# 8 they take 0.41 ms, 13 % of the backward, against FA4's 0.31 for the same bytes). Correct,
# so --check runs both layouts' pre and post.
_ws_alt("wsfragpp",
    "wsfrag with pre and post issuing all of a thread's loads first (CMC_DQ_BLOCK64 1, "
    "CMC_PREPOST_BATCH 1)", DQ_BLOCK64=1, PREPOST_BATCH=1)
_ws_alt("wspp",
    "ws (token-major dq_accum) with pre and post issuing all of a thread's loads first "
    "(CMC_PREPOST_BATCH 1)", PREPOST_BATCH=1)
# A linear tile's dK and dV staged by stmatrix (run 51's ncu: 9 % of the consumers' stall
# samples outside the item loop against FA4's 2 %; the epilogue about 900 instructions a warp).
# Correct, so --check runs it.
_ws_alt("wsfragepi",
    "wsfrag staging a linear tile's dK and dV by stmatrix, not 4-byte stores (CMC_DQ_BLOCK64 1, "
    "CMC_WS_EPI_STSM 1)", DQ_BLOCK64=1, WS_EPI_STSM=1)
# Patch items' LSE offsets before the issue too (off in the shipped kernel: run 50 measured no
# gain on CLEAR's patches).
_ws_alt("wsplsefirst",
    "ws loading patch items' LSE offsets before issuing their S^T and dP^T "
    "(CMC_WS_LSE_FIRST_PATCH 1)", WS_LSE_FIRST_PATCH=1)
# Alternatives whose gradients are not checkable (their workspace layout is not post's, or
# they leave out part of the work).
UNCHECKED = {"tiledq", "wsperskv0", *WS_ABLATIONS}
# The alternatives built on the ws kernel (_ws): 384 threads, the Q, dO and dq_accum maps.
WS_BASED = {"ws", "wsred", "wsrows", "wsplain", "wsvis", "wsbitpatch", "wsbitlin", "wslinafter",
            *WS_MACRO_ALTS, *FUSED_POST, *PERSISTENT, *KV_MAPS, *WS_ABLATIONS}
# Alternatives whose kv launches pass the Q, dO and dq_accum tensor maps (module global
# cmc_kv_maps).
TMA = {"tmaload", *WS_BASED}
# Alternatives with their own patch-tiling kernel (kv_patch_ws): --check also runs
# bwd_kernel_check's PATCH_VARIANTS (CLEAR with patches, on PATCH_LENS).
PATCH_CHECKED = {"ws", "wsred", "wsstatv4", "wsrows", "wsvis", "wsbitpatch", "wsbitlin", "wslinafter", "wsnostsm", "wsnolse", "wsnofa", "wspcp", "wslag", "wslagpp"}
THREADS = {n: WS_THREADS for n in WS_BASED}
# Alternatives with wsprobe's counters (CMC_WS_PROBE 1): their kv is probed after the timings.
PROBED = {"wsprobe", "wspersprobe", "wsperstprobe", "wslagprobe", "wslagppprobe"}


def combo(name: str) -> bool:
    """Registers `a+b+...` (ws ablations, e.g. wsnodqgemm+wsnostage): ws with all their edits,
    timing only, to see where ablations that each save little interact; False if name is not
    such a combination."""
    parts = name.split("+")
    if len(parts) < 2 or not all(p in WS_ABLATIONS for p in parts) or len(set(parts)) < len(parts):
        return False
    if name not in ALTERNATIVES:
        ALTERNATIVES[name] = (" and ".join(WS_ABLATIONS[p][0] for p in parts),
                              _ws_without([e for p in parts for e in WS_ABLATIONS[p][1]]),
                              lambda d: WS_SMEM_GROWTH)
        UNCHECKED.add(name)
        WS_BASED.add(name)
        TMA.add(name)
        THREADS[name] = WS_THREADS
    return True


def apply(text: str, edits: list[tuple[str, str, int]]) -> str:
    for old, new, times in edits:
        if text.count(old) != times:
            raise SystemExit(f"ablation pattern found {text.count(old)} times, not {times}: "
                             f"{old!r}")
        text = text.replace(old, new)
    return text


def _build(name: str, arch: str, mask: str = "causal", dtype: str = "bf16", d: int = 128):
    """bwd_kernel_check.build_variant of one variant, edited by `name` (base: as shipped); an
    alternative's extra shared memory goes into the kv role's launch."""
    import bwd_kernel_check as bkc

    combo(name)  # a worker process registers its combination itself
    if name in ALTERNATIVES:
        _, edit, extra = ALTERNATIVES[name]
        kernels, res = bkc.build_variant(mask, dtype, d, arch, True, edit=edit)
        cub, sym, threads, smem, bm, heads, gx = kernels["kv"]
        kernels["kv"] = (cub, sym, THREADS.get(name, threads), smem + extra(d), bm, heads, gx)
        return kernels, res
    edits = ABLATIONS[name][1] if name != "base" else []
    return bkc.build_variant(mask, dtype, d, arch, True,
                             edit=(lambda t: apply(t, edits)) if edits else None)


@functools.cache
def _bwd_tiling(mask: str):
    """The backward kinds' tiling of bwd_kernel_check's mask as the alternatives build it: the
    driver's tile stage with --tiling TILED_MASKS[mask] (build_variant), else linear."""
    import bwd_kernel_check as bkc

    from cmc.driver import Options, backward_tile, tiling_for
    from cmc.ir import LINEAR

    if mask not in bkc.TILED_MASKS:
        return LINEAR
    table, value = bkc.table_of(mask), bkc.TILED_MASKS[mask]
    return backward_tile(table, tiling_for(table, value), Options(tiling=value))


def _box_rows(case: tuple[str, str, int]) -> int:
    """The ws kind's map box rows for bwd_kernel_check's case (mask, dtype, head dim)."""
    from cmc.abi import tensor_maps

    return tensor_maps("bwd_kv_sm90_ws", _bwd_tiling(case[0]).box_rows)[0].box[2]


def _describe(name: str) -> str:
    if name == "base":
        return "the shipped kernel"
    return ABLATIONS[name][0] if name in ABLATIONS else ALTERNATIVES[name][0]


def main() -> int:
    ap = argparse.ArgumentParser()
    known = [*ABLATIONS, *ALTERNATIVES]
    ap.add_argument("names", nargs="*", help=f"variants (default all: {', '.join(known)})")
    ap.add_argument("--check", action="store_true",
                    help="also run bwd_kernel_check's cases on the alternatives")
    ap.add_argument("--lengths", nargs="*", default=["4096x8", "16384x2"],
                    help="LxB pairs to time (default 4096x8 16384x2)")
    ap.add_argument("--cases", nargs="*", default=None,
                    help="--check only bwd_kernel_check's cases of these masks (e.g. causal; "
                         "under a sanitizer)")
    ap.add_argument("--mask", default="causal",
                    help="bwd_kernel_check's mask to time (default causal; grid96: a grid "
                         "mask whose tiles are all partial)")
    ap.add_argument("--once", action="store_true",
                    help="run each variant's atomic sequence once per length, untimed, for a "
                         "profiler: ncu --kernel-name regex:bwd_kv_sm90 captures base first")
    opts = ap.parse_args()
    names = opts.names or known
    for n in names:
        if n not in known and not combo(n):
            raise SystemExit(f"unknown variant {n!r}; known: {', '.join(known)} (and a+b of "
                             f"{', '.join(WS_ABLATIONS)})")
    checked = [n for n in names if n in ALTERNATIVES and n not in UNCHECKED] if opts.check else []
    arch = os.environ.get("CMC_ARCH", "sm_90a")
    if arch != "sm_90a":
        raise SystemExit("bwd_kv_sm90 is built for sm_90a only (CMC_ARCH=sm_90a)")
    t0 = time.perf_counter()
    variants = ["base", *names]
    import bwd_kernel_check as bkc

    cases = {n: [v for v in bkc.VARIANTS + (bkc.PATCH_VARIANTS if n in PATCH_CHECKED else [])
                 if opts.cases is None or v[0] in opts.cases] for n in checked}
    tm = opts.mask
    if tm not in bkc.MASKS:
        raise SystemExit(f"unknown --mask {tm!r}; known: {', '.join(bkc.MASKS)}")
    if (FUSED_POST | PERSISTENT) & set(names) and _bwd_tiling(tm).kind == "patch":
        raise SystemExit(f"{', '.join(sorted((FUSED_POST | PERSISTENT) & set(names)))}: linear "
                         f"tilings only (--mask {tm} is on patches, whose kv is neither)")
    jobs = [(n, tm, "bf16", 128) for n in variants]
    jobs += [(n, *v) for n in checked for v in cases[n] if (n, *v) not in jobs]
    with ProcessPoolExecutor(max_workers=min(len(jobs), os.cpu_count() or 1)) as pool:
        futs = {j: pool.submit(_build, j[0], arch, *j[1:]) for j in jobs}
        built = {j: f.result() for j, f in futs.items()}
    if bkc.kc.device_arch() != arch:
        raise SystemExit(f"device is {bkc.kc.device_arch()}, built for {arch}")
    bkc.torch.zeros(1, device="cuda")  # the primary context the module loads need (no --check)
    print(f"built {len(built)} variants in {time.perf_counter() - t0:.1f} s")
    for n in variants:
        regs = {s: r for s, r in built[(n, tm, "bf16", 128)][1].items() if "bwd_kv_sm90" in s}
        print(f"  {n:9s} {_describe(n):84s} {regs}")
    from cmc.abi import descriptor_layout

    failed = passed = 0
    plain_bwd, tma_bwd = bkc.Bwd, _tma_bwd(bkc)

    class VariantBwd(tma_bwd):  # type: ignore[misc,valid-type]
        """TmaBwd with a variant's launch choices (bwd_class sets them from the sets above):
        fused_post, no post in the atomic sequence (FUSED_POST: its kv converts dQ);
        persistent, the kv on a CTA per SM, at most one per unit (PERSISTENT; CMC_WS_CTAS=N
        runs N instead: --check with a few CTAs, each taking many tiles); kv_maps (KV_MAPS)."""

        fused_post = persistent = False

        def grid(self, role, max_len, hq, hk, batch):
            g = super().grid(role, max_len, hq, hk, batch)
            if not (self.persistent and role == "kv"):
                return g
            sms = int(os.environ.get("CMC_WS_CTAS") or
                      bkc.torch.cuda.get_device_properties(0).multi_processor_count)
            return (min(g[0] * g[1] * g[2], sms), 1, 1)

        def run(self, desc, args, max_len, hq, hk, batch, deterministic):
            from cmc.kernels import BWD_SEQUENCE

            for role in BWD_SEQUENCE["deterministic" if deterministic else "atomic"]:
                if not (self.fused_post and role == "post"):
                    self.launch_role(role, desc, args, max_len, hq, hk, batch)

    def bwd_class(n: str):
        """Variant n's launcher: the plain one, or (TMA) a VariantBwd with n's choices."""
        if n not in TMA:
            return plain_bwd
        return type(f"Bwd_{n}", (VariantBwd,), {"fused_post": n in FUSED_POST,
                                                  "persistent": n in PERSISTENT,
                                                  "kv_maps": n in KV_MAPS})

    for n in checked:
        for v in cases[n]:
            bkc._LAYOUTS[v] = descriptor_layout(bkc.table_of(v[0]).mask)
            tma_bwd.layout, tma_bwd.dtype, tma_bwd.head_dim = bkc._LAYOUTS[v], v[1], v[2]
            tma_bwd.box_rows = _box_rows(v)
            bkc.Bwd = bwd_class(n)  # type: ignore[misc]  # run_case makes its own
            lens = bkc.PATCH_LENS if v in bkc.PATCH_VARIANTS else None
            for mode, ok, msg in bkc.run_case(*v, built[(n, *v)], bkc.table_of(v[0]), lens=lens):
                failed += 0 if ok else 1
                passed += 1 if ok else 0
                print(f"check {n:9s} {v[0]} {v[1]} d{v[2]:<4d} {mode:12s} "
                      f"{'ok' if ok else 'FAIL'} {msg}", flush=True)
    bkc.Bwd = plain_bwd  # type: ignore[misc]
    table = bkc.table_of(tm)
    lay = descriptor_layout(table.mask)
    tma_bwd.layout, tma_bwd.dtype, tma_bwd.head_dim = lay, "bf16", 128
    tma_bwd.box_rows = _box_rows((tm, "bf16", 128))
    for lb in opts.lengths:
        L, B = (int(x) for x in lb.split("x"))
        for n in variants:
            for line in bkc.timing(bwd_class(n)(built[(n, tm, "bf16", 128)][0]), lay, table,
                                   "bf16", L, B, label=f"{n:9s} ", once=opts.once, name=tm):
                print(line, flush=True)
            if n in PROBED and not opts.once:
                for line in ws_probe(bkc, bwd_class(n)(built[(n, tm, "bf16", 128)][0]), lay,
                                     table, L, B, name=n):
                    print(line, flush=True)
    fired = _watchdogs_fired(bkc, tma_bwd._written)
    if fired:
        print(f"WATCHDOG FIRED in {fired} kv module(s): an mbarrier wait gave up (the ws "
              "kernel's protocol), so its gradients and times above are void", flush=True)
        failed += 1
    if checked:
        print(f"{passed} passed, {failed} failed (checks of {', '.join(checked)})")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
