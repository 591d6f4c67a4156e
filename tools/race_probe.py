#!/usr/bin/env python3
"""Does compute-sanitizer's racecheck model the orderings the ws kv kernel relies on?

racecheck reports hazards in bwd_kv_sm90_ws between the loader's cp.async writes of LSE and
Dsum and the consumers' reads, and between a consumer's store of the dQ item slot and the
writer warp's reads (docs/kernel-notes.md, "Run 15"), while every gradient check passes. Both
are ordered by mbarriers or by a named-barrier bar.arrive / bar.sync pair. This probe runs
one correct kernel of two warps per ordering (warp 0 writes 32 words of shared memory, warp 1
reads them after the ordering and copies them out), plus a __syncthreads control (no report
expected) and an unordered one (a report expected: the tool sees this kernel):

  mbar        st.shared, __syncwarp, lane 0 mbarrier.arrive; warp 1 waits on the parity
  noinc       cp.async of each word, cp.async.mbarrier.arrive.noinc (the ws loader's way)
  cpwait      cp.async, cp.async.wait_all, __syncwarp, lane 0 mbarrier.arrive (wsplain's)
  named       st.shared, bar.arrive 1, 64; warp 1 bar.sync 1, 64 (the dQ item slot's way)
  sync        st.shared, __syncthreads (control: ordered, and racecheck models it)
  none        st.shared, no ordering; warp 1 spins on a volatile flag word (control: a race)
  mbarwar     read then write: warp 1 reads, lane 0 mbarrier.arrive; warp 0 waits, then
              overwrites (the ws ring's release to the loader, the empty barrier)
  namedwar    read then write: warp 1 reads, bar.arrive 1, 64; warp 0 bar.sync 1, 64, then
              overwrites (the writer's release of the dQ staging and item slot)
  txnoinc     the ws full barrier: 33 arrivals, lane 0's arrive.expect_tx with a 128-byte
              cp.async.bulk into a second buffer, and every lane's cp.async with .noinc

Run on the GPU machine from the repository root, one process per mode under the tool:

    for m in mbar noinc cpwait named sync none mbarwar namedwar txnoinc; do
      compute-sanitizer --tool racecheck python3 tools/race_probe.py $m; done

Each run prints the values check (every mode must read what warp 0 wrote; `none` included,
thanks to the flag) and racecheck its hazard summary. Hazards under mbar, noinc, cpwait or
named with none under sync say racecheck does not model that ordering, and its ws reports
of the same kind are the tool's limit; no hazard under them says the ws reports point at a
real gap.
"""

from __future__ import annotations

import argparse
import ctypes
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))

SOURCE = r"""
__device__ __forceinline__ unsigned smem_u32(const void* p) {
  return (unsigned)__cvta_generic_to_shared(p);
}
__device__ __forceinline__ void mbar_wait(unsigned bar, unsigned parity) {
  asm volatile("{\n .reg .pred p;\n WAIT_%=:\n"
               " mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
               " @!p bra WAIT_%=;\n}\n" ::"r"(bar), "r"(parity) : "memory");
}
extern "C" __global__ void __launch_bounds__(64) probe(const int* src, int* out, int mode) {
  __shared__ __align__(8) unsigned long long bar;
  __shared__ __align__(128) int data[32];
  __shared__ __align__(128) int data2[32];
  __shared__ volatile int flag;
  const int t = threadIdx.x, warp = t >> 5, lane = t & 31;
  const unsigned b = smem_u32(&bar);
  if (t == 0) {
    const int count = mode == 1 ? 32 : mode == 8 ? 33 : 1;
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(b), "r"(count) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    flag = 0;
  }
  if (mode == 6 || mode == 7) {  // the values warp 1 reads, ordered by __syncthreads
    if (warp == 0) data[lane] = src[lane];
  }
  __syncthreads();
  if (mode == 6 || mode == 7) {
    if (warp == 1) {
      out[lane] = data[lane];
      if (mode == 6) {
        __syncwarp();
        if (lane == 0) asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(b) : "memory");
      } else {
        asm volatile("bar.arrive 1, 64;\n" ::: "memory");
      }
    } else {
      if (mode == 6) mbar_wait(b, 0);
      else asm volatile("bar.sync 1, 64;\n" ::: "memory");
      data[lane] = -1;
    }
    return;
  }
  if (mode == 8) {
    if (warp == 0) {
      if (lane == 0) {
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], 128;\n" ::"r"(b) : "memory");
        asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], 128, [%2];\n"
                     ::"r"(smem_u32(data2)), "l"(src), "r"(b) : "memory");
      }
      asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(smem_u32(data + lane)), "l"(src + lane)
                   : "memory");
      asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(b) : "memory");
    } else {
      mbar_wait(b, 0);
      out[lane] = data[lane] + data2[lane] - src[lane];
    }
    return;
  }
  if (warp == 0) {
    if (mode == 1 || mode == 2) {
      asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(smem_u32(data + lane)), "l"(src + lane)
                   : "memory");
      if (mode == 1) {
        asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(b) : "memory");
      } else {
        asm volatile("cp.async.wait_all;\n" ::: "memory");
        __syncwarp();
        if (lane == 0) asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(b) : "memory");
      }
    } else {
      data[lane] = src[lane];
      if (mode == 0) {
        __syncwarp();
        if (lane == 0) asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(b) : "memory");
      } else if (mode == 3) {
        asm volatile("bar.arrive 1, 64;\n" ::: "memory");
      } else if (mode == 5) {
        __threadfence_block();
        __syncwarp();
        if (lane == 0) flag = 1;
      }
    }
  } else {
    if (mode <= 2) mbar_wait(b, 0);
    else if (mode == 3) asm volatile("bar.sync 1, 64;\n" ::: "memory");
    else if (mode == 5) {
      while (flag == 0) {
      }
      __threadfence_block();
    }
  }
  if (mode == 4) __syncthreads();
  if (warp == 1) out[lane] = data[lane];
}
"""

MODES = {"mbar": 0, "noinc": 1, "cpwait": 2, "named": 3, "sync": 4, "none": 5, "mbarwar": 6,
         "namedwar": 7, "txnoinc": 8}


def build(arch: str) -> bytes:
    from kernel_check import probe_cubin

    return probe_cubin(SOURCE, "race_probe.cu", arch)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("modes", nargs="*", default=list(MODES))
    ap.add_argument("--arch", default="sm_90a")
    opts = ap.parse_args()
    for m in opts.modes:
        if m not in MODES:
            raise SystemExit(f"unknown mode {m!r}; known: {', '.join(MODES)}")
    cubin = build(opts.arch)
    from cuda.bindings import driver as cu

    from cmc.runtime import _driver

    want = [7 * i + 3 for i in range(32)]
    host, got = (ctypes.c_int * 32)(*want), (ctypes.c_int * 32)()
    bad = 0
    with _driver.on_device(0):
        mod = _driver.call("cuModuleLoadData", cu.cuModuleLoadData(cubin))
        fn = _driver.call("cuModuleGetFunction", cu.cuModuleGetFunction(mod, b"probe"))
        src, out = _driver.mem_alloc(128), _driver.mem_alloc(128)
        _driver.htod(src, ctypes.addressof(host), 128)
        for m in opts.modes:
            _driver.call("cuMemsetD8", cu.cuMemsetD8(out, 0, 128))
            vals = [ctypes.c_uint64(src), ctypes.c_uint64(out), ctypes.c_int(MODES[m])]
            argv = (ctypes.c_void_p * 3)(*[ctypes.addressof(v) for v in vals])
            _driver.call("cuLaunchKernel", cu.cuLaunchKernel(fn, 1, 1, 1, 64, 1, 1, 0, _driver.stream(0),
                                                             ctypes.addressof(argv), 0))
            _driver.dtoh_sync(ctypes.addressof(got), out, 128, 0)
            ok = list(got) == want
            bad += not ok
            print(f"{m:7s} values {'ok' if ok else 'WRONG'}", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
