#!/usr/bin/env python3
"""How fast the H200 adds fp32 blocks into global memory, by each path the backward's atomic
dQ could take, without any attention work around it: the ceiling the kv kernel's dQ
reductions run into (docs/kernel-notes.md, "Where the atomic dQ's time goes").

Each CTA (256 threads) adds `iters` blocks of 8192 floats (32 KB, one dQ partial of a 64-row
item at D = 128) into a buffer of `blocks` such blocks, block (cta * iters + i) % blocks, the
way consecutive key tiles walk consecutive query tiles. Paths:
  red2   16 red.global.add.v2.f32 per thread and block (the shipped kv kernel's)
  red4   8 red.global.add.v4.f32 per thread and block
  bulk   the block staged once in shared memory, 2 x 16 KB cp.reduce.async.bulk .add.f32 per
         block (bwd_ablate tiledq's), at most 4 groups in flight per issuing thread
  rows   the block staged once, 128 cp.reduce.async.bulk .add.f32 of 256 bytes (one row of a
         warpgroup's dQ partial, bwd_ablate ws's writer warps) by the 32 lanes of one warp,
         at most 4 groups in flight per lane
  store  16 st.global.v2.f32 per thread and block (plain write bandwidth, not an add)
Run on the GPU machine from the repository root (torch for buffers and events):

    python3 tools/red_probe.py                 # every path, 4.4 GB of adds each
"""

from __future__ import annotations

import argparse
import ctypes
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))

SOURCE = r"""
extern "C" __global__ void __launch_bounds__(256) probe(float* buf, long long blocks, int iters, int mode) {
  __shared__ __align__(128) float stage[8192];
  const int t = threadIdx.x;
  for (int i = t; i < 8192; i += 256) stage[i] = 1.0f;
  __syncthreads();
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  for (int it = 0; it < iters; ++it) {
    float* b = buf + ((long long)blockIdx.x * iters + it) % blocks * 8192;
    if (mode == 0) {
#pragma unroll
      for (int i = 0; i < 16; ++i)
        asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(b + 512 * i + 2 * t), "f"(1.f), "f"(1.f) : "memory");
    } else if (mode == 1) {
#pragma unroll
      for (int i = 0; i < 8; ++i)
        asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(b + 1024 * i + 4 * t), "f"(1.f),
                     "f"(1.f), "f"(1.f), "f"(1.f) : "memory");
    } else if (mode == 2) {
      if (t < 2) {
        asm volatile("cp.async.bulk.wait_group.read 3;\n" ::: "memory");
        const unsigned src = (unsigned)__cvta_generic_to_shared(stage + 4096 * t);
        asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], 16384;\n"
                     ::"l"(b + 4096 * t), "r"(src) : "memory");
        asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
      }
    } else if (mode == 4) {
      if (t < 32) {
        asm volatile("cp.async.bulk.wait_group.read 3;\n" ::: "memory");
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int r = t + 32 * i;
          const unsigned src = (unsigned)__cvta_generic_to_shared(stage + 64 * r);
          asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], 256;\n"
                       ::"l"(b + 64 * r), "r"(src) : "memory");
        }
        asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
      }
    } else {
#pragma unroll
      for (int i = 0; i < 16; ++i) *reinterpret_cast<float2*>(b + 512 * i + 2 * t) = make_float2(1.f, 1.f);
    }
  }
  if ((mode == 2 && t < 2) || (mode == 4 && t < 32)) asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
}
"""

MODES = {"red2": 0, "red4": 1, "bulk": 2, "rows": 4, "store": 3}


def build(arch: str) -> bytes:
    from kernel_check import probe_cubin

    return probe_cubin(SOURCE, "probe.cu", arch)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("paths", nargs="*", default=list(MODES))
    ap.add_argument("--blocks", type=int, default=8192, help="buffer size in 32 KB blocks")
    ap.add_argument("--ctas", type=int, default=264)
    ap.add_argument("--iters", type=int, default=512)
    ap.add_argument("--arch", default="sm_90a")
    opts = ap.parse_args()
    import torch
    from cuda.bindings import driver as cu
    from kernel_check import _ok

    torch.zeros(1, device="cuda")
    mod = _ok(cu.cuModuleLoadData(build(opts.arch)), "load")
    fn = _ok(cu.cuModuleGetFunction(mod, b"probe"), "function")
    buf = torch.zeros(opts.blocks * 8192, device="cuda", dtype=torch.float32)
    stream = cu.CUstream(torch.cuda.current_stream().cuda_stream)
    total = opts.ctas * opts.iters * 32768
    for name in opts.paths:
        vals = [ctypes.c_void_p(buf.data_ptr()), ctypes.c_longlong(opts.blocks),
                ctypes.c_int(opts.iters), ctypes.c_int(MODES[name])]
        argv = (ctypes.c_void_p * 4)(*[ctypes.addressof(v) for v in vals])

        def go(argv=argv) -> None:
            _ok(cu.cuLaunchKernel(fn, opts.ctas, 1, 1, 256, 1, 1, 0, stream,
                                  ctypes.addressof(argv), 0), "launch")
        go()
        torch.cuda.synchronize()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for _ in range(5):
            go()
        e1.record()
        torch.cuda.synchronize()
        ms = e0.elapsed_time(e1) / 5
        print(f"{name:6s} {total / 1e9:.2f} GB in {ms:.3f} ms: {total / ms / 1e9:.2f} TB/s "
              f"(ctas {opts.ctas}, buffer {opts.blocks * 32768 / 1e6:.0f} MB)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
