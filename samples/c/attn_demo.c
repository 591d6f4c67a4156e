/* attn_demo.c: run a cmc artifact from C through the CUDA driver API, no Python involved.
 *
 * It uses only what `cmc compile samples/causal.mask -o out/` writes: the header causal.h
 * (descriptor struct, kernel symbol and launch macros, grid rule) and a cubin. It fills
 * random bf16 Q/K/V for a small causal case (B=1, L=300, H=2, D=128, packed layout),
 * launches, copies O and LSE back and compares them with a float reference computed here.
 * Prints the errors and PASS or FAIL; the exit code is 0 only on PASS (2: no GPU/driver).
 *
 * libcuda is opened with dlopen and every entry point fetched through cuGetProcAddress, so
 * the program links without the driver and runs on any machine that has one.
 *
 *   make -C samples/c ARTIFACT=out/causal && samples/c/attn_demo out/causal
 */
#define _POSIX_C_SOURCE 200809L
#include <cuda.h>
#include <dlfcn.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "causal.h"

#define B 1
#define L 300
#define H 2
#define D 128
#define T (B * L)

/* ------------------------------------------------------------------ driver entry points */

#define CMC_DECL(name) static __typeof__(&name) p_##name
CMC_DECL(cuInit);
CMC_DECL(cuGetErrorName);
CMC_DECL(cuDeviceGet);
CMC_DECL(cuDeviceGetAttribute);
CMC_DECL(cuDevicePrimaryCtxRetain);
CMC_DECL(cuDevicePrimaryCtxRelease);
CMC_DECL(cuCtxSetCurrent);
CMC_DECL(cuCtxSynchronize);
CMC_DECL(cuModuleLoadData);
CMC_DECL(cuModuleUnload);
CMC_DECL(cuModuleGetFunction);
CMC_DECL(cuFuncSetAttribute);
CMC_DECL(cuMemAlloc);
CMC_DECL(cuMemFree);
CMC_DECL(cuMemcpyHtoD);
CMC_DECL(cuMemcpyDtoH);
CMC_DECL(cuMemsetD8);
CMC_DECL(cuLaunchKernel);
CMC_DECL(cuTensorMapEncodeTiled);

typedef CUresult (*get_proc_fn)(const char *, void **, int, cuuint64_t,
                                CUdriverProcAddressQueryResult *);
static get_proc_fn get_proc;

static int load_sym(const char *name, void **slot)
{
  CUdriverProcAddressQueryResult status;
  CUresult r = get_proc(name, slot, CUDA_VERSION, CU_GET_PROC_ADDRESS_DEFAULT, &status);
  if (r != CUDA_SUCCESS || status != CU_GET_PROC_ADDRESS_SUCCESS || *slot == NULL) {
    fprintf(stderr, "attn_demo: the driver has no %s (CUresult %d)\n", name, (int)r);
    return -1;
  }
  return 0;
}

#define CMC_LOAD(name) \
  if (load_sym(#name, (void **)&p_##name)) return -1

static int load_driver(void)
{
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    fprintf(stderr, "attn_demo: cannot open libcuda.so.1 (%s)\n", dlerror());
    return -1;
  }
  *(void **)&get_proc = dlsym(lib, "cuGetProcAddress_v2");
  if (!get_proc) {
    fprintf(stderr, "attn_demo: libcuda has no cuGetProcAddress_v2 (driver older than 12.0)\n");
    return -1;
  }
  CMC_LOAD(cuInit);
  CMC_LOAD(cuGetErrorName);
  CMC_LOAD(cuDeviceGet);
  CMC_LOAD(cuDeviceGetAttribute);
  CMC_LOAD(cuDevicePrimaryCtxRetain);
  CMC_LOAD(cuDevicePrimaryCtxRelease);
  CMC_LOAD(cuCtxSetCurrent);
  CMC_LOAD(cuCtxSynchronize);
  CMC_LOAD(cuModuleLoadData);
  CMC_LOAD(cuModuleUnload);
  CMC_LOAD(cuModuleGetFunction);
  CMC_LOAD(cuFuncSetAttribute);
  CMC_LOAD(cuMemAlloc);
  CMC_LOAD(cuMemFree);
  CMC_LOAD(cuMemcpyHtoD);
  CMC_LOAD(cuMemcpyDtoH);
  CMC_LOAD(cuMemsetD8);
  CMC_LOAD(cuLaunchKernel);
  CMC_LOAD(cuTensorMapEncodeTiled);
  return 0;
}

static int check(CUresult r, const char *what)
{
  const char *name = "?";
  if (r == CUDA_SUCCESS) return 0;
  if (p_cuGetErrorName) p_cuGetErrorName(r, &name);
  fprintf(stderr, "attn_demo: %s failed: %s\n", what, name);
  return -1;
}

#define CK(call) \
  if (check((call), #call)) goto fail

/* ------------------------------------------------------------------ bf16 and data */

static uint16_t f32_to_bf16(float f)
{
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0; /* NaN */
  u += 0x7fffu + ((u >> 16) & 1u);                    /* round to nearest even */
  return (uint16_t)(u >> 16);
}

static float bf16_to_f32(uint16_t h)
{
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static float uniform(void) /* in [-1, 1) */
{
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return (float)((rng_state >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

static void *read_file(const char *path, size_t *size)
{
  FILE *f = fopen(path, "rb");
  void *buf = NULL;
  long n;
  if (!f) return NULL;
  if (fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) > 0 && fseek(f, 0, SEEK_SET) == 0) {
    buf = malloc((size_t)n);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
      free(buf);
      buf = NULL;
    }
    *size = (size_t)n;
  }
  fclose(f);
  return buf;
}

/* Causal attention on [T, H, D] float arrays (one sequence): o and natural-log lse [H, T]. */
static void reference(const float *q, const float *k, const float *v, float scale, float *o,
                      float *lse)
{
  static float p[L];
  for (int h = 0; h < H; h++)
    for (int i = 0; i < T; i++) {
      const float *qi = q + ((size_t)i * H + h) * D;
      float m = -INFINITY, sum = 0.0f;
      for (int j = 0; j <= i; j++) {
        const float *kj = k + ((size_t)j * H + h) * D;
        float s = 0.0f;
        for (int d = 0; d < D; d++) s += qi[d] * kj[d];
        p[j] = s * scale;
        if (p[j] > m) m = p[j];
      }
      for (int j = 0; j <= i; j++) {
        p[j] = expf(p[j] - m);
        sum += p[j];
      }
      float *oi = o + ((size_t)i * H + h) * D;
      for (int d = 0; d < D; d++) {
        double acc = 0.0;
        for (int j = 0; j <= i; j++) acc += (double)p[j] * v[((size_t)j * H + h) * D + d];
        oi[d] = (float)(acc / sum);
      }
      lse[(size_t)h * T + i] = m + logf(sum);
    }
}

/* ------------------------------------------------------------------ main */

int main(int argc, char **argv)
{
  const char *dir = argc > 1 ? argv[1] : ".";
  const char *cubin_name = NULL;
  const char *symbol = NULL;
  unsigned threads = 0, smem = 0, block_m = 0, box_rows = 0;
  int persistent = 0, num_sms = 0, n_maps = 0;
  char path[4096];
  int major = 0, minor = 0, status = 1;
  size_t cubin_size = 0, n_in = (size_t)T * H * D;
  void *cubin = NULL;
  CUdevice dev;
  CUcontext ctx = NULL;
  CUmodule mod = NULL;
  CUfunction fn;
  CUdeviceptr dq = 0, dk = 0, dv = 0, dout = 0, dlse = 0, dseq = 0;
  uint16_t *hq = malloc(n_in * 2), *hk = malloc(n_in * 2), *hv = malloc(n_in * 2),
           *hout = malloc(n_in * 2);
  float *fq = malloc(n_in * 4), *fk = malloc(n_in * 4), *fv = malloc(n_in * 4),
        *fo = malloc(n_in * 4), *flse = malloc((size_t)H * T * 4), *hlse = malloc((size_t)H * T * 4);
  int32_t seqlens[B + 1] = {0, L};
  const float scale = 1.0f / sqrtf((float)D);

  if (!hq || !hk || !hv || !hout || !fq || !fk || !fv || !fo || !flse || !hlse) return 1;
  if (load_driver()) return 2;
  if (check(p_cuInit(0), "cuInit")) return 2;
  CK(p_cuDeviceGet(&dev, 0));
  CK(p_cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev));
  CK(p_cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev));
  CK(p_cuDeviceGetAttribute(&num_sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev));
  /* The cubin and kernel variant for this GPU: SASS runs only on its own major version, and
     sm_90a gets the wgmma kernel (its own symbol, block and shared memory). */
#define PICK(CUBIN, V)                                                                      \
  do {                                                                                      \
    cubin_name = CUBIN;                                                                     \
    symbol = CMC_CAUSAL_##V##_SYMBOL;                                                       \
    threads = CMC_CAUSAL_##V##_THREADS;                                                     \
    smem = CMC_CAUSAL_##V##_DYNAMIC_SMEM;                                                   \
    block_m = CMC_CAUSAL_##V##_BLOCK_M;                                                     \
    box_rows = CMC_CAUSAL_##V##_BOX_ROWS;                                                   \
    persistent = CMC_CAUSAL_##V##_PERSISTENT;                                               \
    n_maps = CMC_CAUSAL_##V##_TENSOR_MAPS;                                                  \
  } while (0)
#ifdef CMC_CAUSAL_SM_90A_SM90_BF16_D128_CUBIN
  if (major == 9 && minor == 0) PICK(CMC_CAUSAL_SM_90A_SM90_BF16_D128_CUBIN, SM90_BF16_D128);
#endif
#ifdef CMC_CAUSAL_SM_90A_BF16_D128_CUBIN
  if (!cubin_name && major == 9 && minor == 0) PICK(CMC_CAUSAL_SM_90A_BF16_D128_CUBIN, BF16_D128);
#endif
#ifdef CMC_CAUSAL_SM_100A_BF16_D128_CUBIN
  if (major == 10 && minor == 0) PICK(CMC_CAUSAL_SM_100A_BF16_D128_CUBIN, BF16_D128);
#endif
#ifdef CMC_CAUSAL_SM_80_BF16_D128_CUBIN
  if (!cubin_name && major == 8) PICK(CMC_CAUSAL_SM_80_BF16_D128_CUBIN, BF16_D128);
#endif
  if (!cubin_name) {
    fprintf(stderr, "attn_demo: the artifact has no bf16 d128 cubin for sm_%d%d\n", major, minor);
    goto fail;
  }
  snprintf(path, sizeof path, "%s/%s", dir, cubin_name);
  cubin = read_file(path, &cubin_size);
  if (!cubin) {
    fprintf(stderr, "attn_demo: cannot read %s\n", path);
    goto fail;
  }
  printf("device sm_%d%d, cubin %s (%zu bytes)\n", major, minor, path, cubin_size);

  /* The primary context: the one PyTorch and CuPy would share with us. */
  CK(p_cuDevicePrimaryCtxRetain(&ctx, dev));
  CK(p_cuCtxSetCurrent(ctx));
  CK(p_cuModuleLoadData(&mod, cubin));
  CK(p_cuModuleGetFunction(&fn, mod, symbol));
  CK(p_cuFuncSetAttribute(fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                          (int)smem));

  for (size_t i = 0; i < n_in; i++) {
    hq[i] = f32_to_bf16(uniform());
    hk[i] = f32_to_bf16(uniform());
    hv[i] = f32_to_bf16(uniform());
    fq[i] = bf16_to_f32(hq[i]);
    fk[i] = bf16_to_f32(hk[i]);
    fv[i] = bf16_to_f32(hv[i]);
  }
  CK(p_cuMemAlloc(&dq, n_in * 2));
  CK(p_cuMemAlloc(&dk, n_in * 2));
  CK(p_cuMemAlloc(&dv, n_in * 2));
  CK(p_cuMemAlloc(&dout, n_in * 2));
  CK(p_cuMemAlloc(&dlse, (size_t)H * T * 4));
  CK(p_cuMemAlloc(&dseq, sizeof seqlens));
  CK(p_cuMemcpyHtoD(dq, hq, n_in * 2));
  CK(p_cuMemcpyHtoD(dk, hk, n_in * 2));
  CK(p_cuMemcpyHtoD(dv, hv, n_in * 2));
  CK(p_cuMemcpyHtoD(dseq, seqlens, sizeof seqlens));
  CK(p_cuMemsetD8(dout, 0xff, n_in * 2)); /* NaN everywhere: unwritten rows show up */
  CK(p_cuMemsetD8(dlse, 0xff, (size_t)H * T * 4));

  {
    cmc_causal_desc desc;
    unsigned grid[3];
    CUtensorMap maps[3];
    void *args[2] = {&desc, maps};
    int i;
    memset(&desc, 0, sizeof desc);
    desc.q = dq;
    desc.k = dk;
    desc.v = dv;
    desc.o = dout;
    desc.lse = dlse;
    desc.cu_seqlens = dseq;
    desc.q_stride_tok = desc.k_stride_tok = desc.v_stride_tok = desc.o_stride_tok = H * D;
    desc.q_stride_head = desc.k_stride_head = desc.v_stride_head = desc.o_stride_head = D;
    desc.lse_stride_head = T;
    desc.batch = B;
    desc.heads_q = H;
    desc.heads_kv = H;
    desc.max_len = L;
    desc.scale_log2 = scale * 1.4426950408889634f;
    for (i = 0; i < n_maps; i++) { /* the sm90 kernel's TMA maps of Q, K, V */
      static const cuuint32_t ones[3] = {1u, 1u, 1u};
      cmc_causal_tensor_map_args a;
      cmc_causal_tensor_map_args_of(&desc, i, T, D, box_rows, &a);
      CK(p_cuTensorMapEncodeTiled(&maps[i], CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3,
                                  (void *)(uintptr_t)a.address, a.dims, a.strides, a.box, ones,
                                  CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                  CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                                  CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE));
    }
    cmc_causal_grid(&desc, block_m, persistent, L <= 4096 ? (unsigned)num_sms : 0xffffffffu, grid);
    printf("grid (%u, %u, %u), block %u, dynamic smem %u\n", grid[0], grid[1], grid[2],
           threads, smem);
    CK(p_cuLaunchKernel(fn, grid[0], grid[1], grid[2], threads, 1, 1, smem, NULL, args, NULL));
    CK(p_cuCtxSynchronize());
  }
  CK(p_cuMemcpyDtoH(hout, dout, n_in * 2));
  CK(p_cuMemcpyDtoH(hlse, dlse, (size_t)H * T * 4));

  reference(fq, fk, fv, scale, fo, flse);
  {
    double num = 0.0, den = 0.0, max_err = 0.0, max_lse = 0.0;
    int nan = 0;
    for (size_t i = 0; i < n_in; i++) {
      double got = bf16_to_f32(hout[i]), want = fo[i], e = fabs(got - want);
      if (isnan(got)) nan++;
      num += (got - want) * (got - want);
      den += want * want;
      if (e > max_err) max_err = e;
    }
    for (size_t i = 0; i < (size_t)H * T; i++) {
      double e = fabs((double)hlse[i] - flse[i]);
      if (isnan(hlse[i])) nan++;
      if (e > max_lse) max_lse = e;
    }
    double rel = sqrt(num / (den > 0 ? den : 1.0));
    int ok = nan == 0 && rel < 1e-2 && max_lse < 1e-2;
    printf("max |o - ref| = %.3g, ||o - ref|| / ||ref|| = %.3g, max |lse - ref| = %.3g, "
           "NaN %d\n", max_err, rel, max_lse, nan);
    printf("%s\n", ok ? "PASS" : "FAIL");
    status = ok ? 0 : 1;
  }

fail:
  if (dq) p_cuMemFree(dq);
  if (dk) p_cuMemFree(dk);
  if (dv) p_cuMemFree(dv);
  if (dout) p_cuMemFree(dout);
  if (dlse) p_cuMemFree(dlse);
  if (dseq) p_cuMemFree(dseq);
  if (mod) p_cuModuleUnload(mod);
  if (ctx) p_cuDevicePrimaryCtxRelease(dev);
  free(cubin);
  free(hq); free(hk); free(hv); free(hout);
  free(fq); free(fk); free(fv); free(fo); free(flse); free(hlse);
  return status;
}
