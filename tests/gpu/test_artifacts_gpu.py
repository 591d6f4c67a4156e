"""GPU tier for build/package: cubins load, the driver agrees with the resources read from
the ELF, and a C program launches a kernel through NAME.h's driver-API helper with the
descriptor passed by value."""

from __future__ import annotations

import ctypes
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from cmc.build import build, cuda_include_dir
from cmc.cubin import read_cubin
from cmc.package import package

from ..handmade import emitted

pytestmark = pytest.mark.gpu


def _device_sm() -> int | None:
    try:
        from cuda.bindings import driver as cu

        (err,) = cu.cuInit(0)
        if int(err) != 0:
            return None
        err, n = cu.cuDeviceGetCount()
        if int(err) != 0 or n == 0:
            return None
        err, dev = cu.cuDeviceGet(0)
        A = cu.CUdevice_attribute
        _, major = cu.cuDeviceGetAttribute(A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev)
        _, minor = cu.cuDeviceGetAttribute(A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev)
        return 10 * major + minor
    except Exception:
        return None


SM = _device_sm()
needs_sm90 = pytest.mark.skipif(SM != 90, reason="needs an sm_90 (Hopper) GPU")


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    built = build(emitted(), archs=["sm_90a"], cache=False)
    return package(built, tmp_path_factory.mktemp("out"), "demo.mask")


def _ok(res):
    err = res[0] if isinstance(res, tuple) else res
    assert int(err) == 0, err
    return res[1:] if isinstance(res, tuple) and len(res) > 1 else None


@needs_sm90
def test_driver_agrees_with_the_elf(folder):
    from cuda.bindings import driver as cu

    (dev,) = _ok(cu.cuDeviceGet(0))
    (ctx,) = _ok(cu.cuDevicePrimaryCtxRetain(dev))
    _ok(cu.cuCtxSetCurrent(ctx))
    m = json.loads((folder / "manifest.json").read_text())
    F = cu.CUfunction_attribute
    for k in m["kernels"]:
        data = (folder / k["file"]).read_bytes()
        (mod,) = _ok(cu.cuModuleLoadData(data))
        (fn,) = _ok(cu.cuModuleGetFunction(mod, k["symbol"].encode()))
        got = {
            name: _ok(cu.cuFuncGetAttribute(attr, fn))[0]
            for name, attr in (
                ("registers", F.CU_FUNC_ATTRIBUTE_NUM_REGS),
                ("shared_static", F.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES),
                ("local_bytes", F.CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES),
                ("max_threads", F.CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK),
            )
        }
        info = read_cubin(data).kernel(k["symbol"])
        print(k["file"], got, "elf shared section", info.shared_section)
        assert got["registers"] == k["registers"]
        assert got["shared_static"] == k["shared_static"]
        assert got["local_bytes"] == k["local_bytes"]
        assert got["max_threads"] >= k["threads"]
        _ok(cu.cuModuleUnload(mod))


LAUNCH_C = r"""
#define CMC_WITH_DRIVER_API
#include "demo.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CK(x) do { CUresult r_ = (x); if (r_ != CUDA_SUCCESS) { const char *s_ = "?"; \
  cuGetErrorName(r_, &s_); fprintf(stderr, "%s: %s\n", #x, s_); return 1; } } while (0)

static void *slurp(const char *path) {
  FILE *f = fopen(path, "rb"); long n; void *buf;
  if (!f) return NULL;
  fseek(f, 0, SEEK_END); n = ftell(f); fseek(f, 0, SEEK_SET);
  buf = malloc((size_t)n); if (fread(buf, 1, (size_t)n, f) != (size_t)n) { free(buf); buf = NULL; }
  fclose(f); return buf;
}

static int run(CUmodule mod, const char *symbol, int which) {
  CUfunction fn; CUdeviceptr q, o; cmc_demo_desc d; unsigned g[3], n, i, threads, bad = 0;
  float host[4096];
  CK(cuModuleGetFunction(&fn, mod, symbol));
  CK(cuMemAlloc(&q, sizeof host)); CK(cuMemsetD32(q, 0, 4096));
  CK(cuMemAlloc(&o, sizeof host)); CK(cuMemsetD32(o, 0, 4096));
  memset(&d, 0, sizeof d);
  d.q = (uint64_t)q; d.o = (uint64_t)o; d.max_len = 300; d.heads_q = 2; d.batch = 3;
  d.scale_log2 = 1.0f; d.p_window = 7;
  if (which == 0) { CK(cmc_demo_launch_bf16_d64(fn, &d, NULL, NULL)); cmc_demo_grid_bf16_d64(&d, 0u, g);
                    threads = CMC_DEMO_BF16_D64_THREADS; }
  else { CK(cmc_demo_launch_fp16_d128(fn, &d, NULL, NULL)); cmc_demo_grid_fp16_d128(&d, 0u, g);
         threads = CMC_DEMO_FP16_D128_THREADS; }
  CK(cuCtxSynchronize());
  CK(cuMemcpyDtoH(host, o, sizeof host));
  n = g[0] * threads;
  for (i = 0; i < 4096; ++i) bad += host[i] != (i < n ? 307.0f : 0.0f);
  printf("%s grid %u %u %u wrote %u bad %u\n", symbol, g[0], g[1], g[2], n, bad);
  cuMemFree(q); cuMemFree(o);
  return bad != 0;
}

int main(int argc, char **argv) {
  CUdevice dev; CUcontext ctx; CUmodule m0, m1; void *c0 = slurp(argv[1]), *c1 = slurp(argv[2]);
  (void)argc;
  if (!c0 || !c1) { fprintf(stderr, "cannot read cubins\n"); return 1; }
  CK(cuInit(0)); CK(cuDeviceGet(&dev, 0)); CK(cuDevicePrimaryCtxRetain(&ctx, dev));
  CK(cuCtxSetCurrent(ctx));
  CK(cuModuleLoadData(&m0, c0)); CK(cuModuleLoadData(&m1, c1));
  return run(m0, CMC_DEMO_SM_90A_BF16_D64_SYMBOL, 0) | run(m1, CMC_DEMO_SM_90A_FP16_D128_SYMBOL, 1);
}
"""


def _libcuda() -> str:
    ctypes.CDLL("libcuda.so.1")
    for line in Path("/proc/self/maps").read_text().splitlines():
        if line.rstrip().endswith("libcuda.so.1") or "/libcuda.so." in line:
            return line.split()[-1]
    pytest.skip("libcuda.so.1 not found")


@needs_sm90
@pytest.mark.skipif(not shutil.which("gcc"), reason="needs gcc")
def test_c_program_launches_through_the_header(folder, tmp_path):
    src = tmp_path / "launch.c"
    src.write_text(LAUNCH_C)
    exe = tmp_path / "launch"
    cc = subprocess.run(
        ["gcc", "-std=c11", "-Wall", "-Werror", "-I", str(folder), "-I", cuda_include_dir(),
         str(src), _libcuda(), "-o", str(exe)],
        capture_output=True, text=True,
    )
    assert cc.returncode == 0, cc.stderr
    r = subprocess.run(
        [str(exe), str(folder / "demo.sm_90a.bf16_d64.cubin"),
         str(folder / "demo.sm_90a.fp16_d128.cubin")],
        capture_output=True, text=True,
    )
    print(r.stdout, r.stderr)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "bad 0" in r.stdout
