/* attn_demo.c: run a cmc artifact from C through the CUDA driver API, no Python involved.
 *
 * It uses only what `cmc compile samples/causal.mask -o out/` writes: the header causal.h
 * (descriptor struct, kernel symbols and launch macros, grid rules, the backward's
 * cmc_bwd_args, workspace rule and launch helpers) and the cubins. It fills random bf16
 * Q/K/V and dO for a small causal case (B=1, L=300, H=2, D=128, packed layout), then
 *   forward:  launches the forward kernel, copies O and LSE back and compares them with a
 *             float reference computed here;
 *   backward: (artifacts compiled with the backward, the default; skipped for
 *             --no-backward) allocates dQ/dK/dV and the two fp32 workspaces by the header's
 *             rule (cmc_causal_bwd_workspace), fills cmc_bwd_args, and launches through the
 *             header's helpers (cmc_causal_launch_<tag>_bf16_d128 of each role's kernel:
 *             bwd_kv_sm90 and bwd_dq_sm90 on sm_90a by default, bwd_<role> else) the atomic sequence
 *             pre, kv, post, then the deterministic one (flags CMC_CAUSAL_BWD_FLAG_DETERMINISTIC)
 *             pre, kv, dq twice; it compares dQ/dK/dV of both modes with a float reference
 *             and checks that the two deterministic runs are bitwise equal.
 * Prints the errors and PASS or FAIL; the exit code is 0 only on PASS (2: no GPU/driver).
 *
 * libcuda is opened with dlopen and every entry point fetched through cuGetProcAddress, at
 * the ABI version of the prototype it is called with (CMC_DRIVER_ENTRY_POINTS), so the
 * program links without the driver and runs on any machine that has one. The header's
 * driver-API helpers call cuLaunchKernel and friends by name: below, before the header is
 * included, those names are defined to the fetched entry points.
 *
 * On a GPU machine (sm_90a, sm_100a or sm_80 with a driver for CUDA 12.0 or newer):
 *   cmc compile samples/causal.mask -o out/ --arch sm_90a --dtype bf16 --head-dim 128
 *   make -C samples/c ARTIFACT=../../out/causal run
 * or by hand: make -C samples/c ARTIFACT=../../out/causal && samples/c/attn_demo out/causal
 */
#define _POSIX_C_SOURCE 200809L
#include <cuda.h>
#include <cudaTypedefs.h>
#include <dlfcn.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define B 1
#define L 300
#define H 2
#define D 128
#define T (B * L)

/* ------------------------------------------------------------------ driver entry points */

/* Each entry point with the ABI version it is declared with: its pointer has the type
   PFN_<name>_v<version> (cudaTypedefs.h) and load_driver asks cuGetProcAddress for that
   version, as cuda-python does. Asking for CUDA_VERSION instead hands out the newest ABI of
   each name: with cuda.h 13.0 and a CUDA 13 driver (580) that is cuCtxSynchronize_v2(CUcontext)
   and cuCtxGetDevice_v2(CUdevice *, CUcontext), which a caller with the old prototypes hands
   whatever its registers hold as the context (a crash, or CUDA_ERROR_INVALID_CONTEXT). */
#define CMC_DRIVER_ENTRY_POINTS(X)                                                          \
  X(cuInit, 2000)                                                                           \
  X(cuGetErrorName, 6000)                                                                   \
  X(cuDeviceGet, 2000)                                                                      \
  X(cuDeviceGetAttribute, 2000)                                                             \
  X(cuDevicePrimaryCtxRetain, 7000)                                                         \
  X(cuDevicePrimaryCtxRelease, 11000)                                                       \
  X(cuCtxSetCurrent, 4000)                                                                  \
  X(cuCtxGetDevice, 2000)                                                                   \
  X(cuCtxSynchronize, 2000)                                                                 \
  X(cuModuleLoadData, 2000)                                                                 \
  X(cuModuleUnload, 2000)                                                                   \
  X(cuModuleGetFunction, 2000)                                                              \
  X(cuFuncSetAttribute, 9000)                                                               \
  X(cuMemAlloc, 3020)                                                                       \
  X(cuMemFree, 3020)                                                                        \
  X(cuMemcpyHtoD, 3020)                                                                     \
  X(cuMemcpyDtoH, 3020)                                                                     \
  X(cuMemsetD8, 3020)                                                                       \
  X(cuLaunchKernel, 4000)                                                                   \
  X(cuTensorMapEncodeTiled, 12000)
#define CMC_DECL(name, version) static PFN_##name##_v##version p_##name;
CMC_DRIVER_ENTRY_POINTS(CMC_DECL)

/* The header's CMC_WITH_DRIVER_API helpers (cmc_causal_launch_*, cmc_causal_tensor_maps)
   call the driver by name; these names now mean the entry points that load_driver fetches,
   so the helpers need no -lcuda. (#undef: cuda.h may itself map a name to a versioned one.) */
#undef cuCtxGetDevice
#define cuCtxGetDevice p_cuCtxGetDevice
#undef cuDeviceGetAttribute
#define cuDeviceGetAttribute p_cuDeviceGetAttribute
#undef cuFuncSetAttribute
#define cuFuncSetAttribute p_cuFuncSetAttribute
#undef cuLaunchKernel
#define cuLaunchKernel p_cuLaunchKernel
#undef cuTensorMapEncodeTiled
#define cuTensorMapEncodeTiled p_cuTensorMapEncodeTiled
#define CMC_WITH_DRIVER_API
#include "causal.h"

typedef CUresult (*get_proc_fn)(const char *, void **, int, cuuint64_t,
                                CUdriverProcAddressQueryResult *);
static get_proc_fn get_proc;

static int load_sym(const char *name, int version, void **slot)
{
  CUdriverProcAddressQueryResult status;
  CUresult r = get_proc(name, slot, version, CU_GET_PROC_ADDRESS_DEFAULT, &status);
  if (r != CUDA_SUCCESS || status != CU_GET_PROC_ADDRESS_SUCCESS || *slot == NULL) {
    fprintf(stderr, "attn_demo: the driver has no %s (version %d, CUresult %d)\n", name,
            version, (int)r);
    return -1;
  }
  return 0;
}

#define CMC_LOAD(name, version) \
  if (load_sym(#name, version, (void **)&p_##name)) return -1;

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
  CMC_DRIVER_ENTRY_POINTS(CMC_LOAD)
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

/* ||got - want|| / ||want|| over n bf16 values; NaNs are counted into *nan. */
static double rel_err(const uint16_t *got, const float *want, size_t n, int *nan)
{
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < n; i++) {
    double g = bf16_to_f32(got[i]), w = want[i];
    if (isnan(g)) (*nan)++;
    num += (g - w) * (g - w);
    den += w * w;
  }
  return sqrt(num / (den > 0 ? den : 1.0));
}

/* ------------------------------------------------------------------ backward kernels */

#ifdef CMC_CAUSAL_BWD_FLAG_DETERMINISTIC /* the artifact has the backward (no --no-backward) */
#define HAVE_BACKWARD 1

/* The reference's backward from its o and lse and dout: dq, dk, dv [T, H, D]. With
   p = exp(scale q.k - lse) and Dsum_i = dout_i . o_i:  dv_j = sum_i p_ij dout_i,
   ds_ij = p_ij (dout_i . v_j - Dsum_i),  dq_i = scale sum_j ds_ij k_j,  dk_j = scale sum_i ds_ij q_i. */
static void reference_bwd(const float *q, const float *k, const float *v, const float *o,
                          const float *lse, const float *dout, float scale, float *dq, float *dk,
                          float *dv)
{
  const size_t n = (size_t)T * H * D;
  memset(dq, 0, n * sizeof *dq);
  memset(dk, 0, n * sizeof *dk);
  memset(dv, 0, n * sizeof *dv);
  for (int h = 0; h < H; h++)
    for (int i = 0; i < T; i++) {
      const size_t qi = ((size_t)i * H + h) * D;
      float dsum = 0.0f;
      for (int d = 0; d < D; d++) dsum += dout[qi + d] * o[qi + d];
      for (int j = 0; j <= i; j++) {
        const size_t kj = ((size_t)j * H + h) * D;
        float s = 0.0f, dp = 0.0f;
        for (int d = 0; d < D; d++) {
          s += q[qi + d] * k[kj + d];
          dp += dout[qi + d] * v[kj + d];
        }
        const float p = expf(s * scale - lse[(size_t)h * T + i]);
        const float ds = p * (dp - dsum) * scale;
        for (int d = 0; d < D; d++) {
          dv[kj + d] += p * dout[qi + d];
          dk[kj + d] += ds * q[qi + d];
          dq[qi + d] += ds * k[kj + d];
        }
      }
    }
}

/* One backward kernel per role, each in its own cubin; the header's launch helper of each
   computes the role's grid (cmc_causal_grid_<tag>) and sets its dynamic shared memory. A kind
   with tensor maps (the warp-specialised kv: Q, dO, dq_accum) launches through launch_maps after
   its maps are encoded (cmc_causal_tensor_maps_<tag>); the others through launch. */
enum role { PRE, KV, DQ, POST, N_ROLES };
typedef CUresult (*bwd_launch_fn)(CUfunction, const cmc_causal_desc *, const cmc_bwd_args *,
                                  CUstream);
typedef CUresult (*bwd_launch_maps_fn)(CUfunction, const cmc_causal_desc *, const CUtensorMap *,
                                       const cmc_bwd_args *, CUstream);
typedef CUresult (*bwd_maps_fn)(const cmc_causal_desc *, const cmc_bwd_args *, uint64_t,
                                CUtensorMap *);
typedef void (*bwd_grid_fn)(const cmc_causal_desc *, unsigned[3]);
struct bwd_kernel {
  const char *name, *symbol, *cubin;
  bwd_launch_fn launch;
  bwd_grid_fn grid;
  bwd_launch_maps_fn launch_maps;
  bwd_maps_fn maps;
};

/* Room for the maps of any backward kind (cmc_causal_tensor_maps_<tag> writes its
   TENSOR_MAPS of them: the warp-specialised kv's Q, dO and dq_accum). */
#define MAX_BWD_MAPS 4
#ifdef CMC_CAUSAL_BWD_KV_SM90WS_BF16_D128_TENSOR_MAPS
typedef char bwd_maps_fit[CMC_CAUSAL_BWD_KV_SM90WS_BF16_D128_TENSOR_MAPS <= MAX_BWD_MAPS ? 1 : -1];
#endif

/* The launch order on one stream (the header's comment; the manifest's backward.sequence):
   atomic dQ (flags 0) pre, kv, post; deterministic (flags bit 0) pre, kv, dq. */
static const enum role seq_atomic[3] = {PRE, KV, POST};
static const enum role seq_deterministic[3] = {PRE, KV, DQ};

/* A role's kernel on arch A: its variant TAG (header macros) and tag (helper names). */
#define BWD_KERNEL(A, NAME, TAG, tag)                                                       \
  {NAME, CMC_CAUSAL_##TAG##_BF16_D128_SYMBOL, CMC_CAUSAL_##A##_##TAG##_BF16_D128_CUBIN,     \
   cmc_causal_launch_##tag##_bf16_d128, cmc_causal_grid_##tag##_bf16_d128, NULL, NULL}
#define BWD_KERNEL_MAPS(A, NAME, TAG, tag)                                                  \
  {NAME, CMC_CAUSAL_##TAG##_BF16_D128_SYMBOL, CMC_CAUSAL_##A##_##TAG##_BF16_D128_CUBIN,     \
   NULL, cmc_causal_grid_##tag##_bf16_d128, cmc_causal_launch_##tag##_bf16_d128,            \
   cmc_causal_tensor_maps_##tag##_bf16_d128}
#define PORTABLE_KERNELS(A)                                                                 \
  {BWD_KERNEL(A, "pre", BWD_PRE, bwd_pre), BWD_KERNEL(A, "kv", BWD_KV, bwd_kv),             \
   BWD_KERNEL(A, "dq", BWD_DQ, bwd_dq), BWD_KERNEL(A, "post", BWD_POST, bwd_post)}

/* The backward kernels of this GPU by role (NULL: none for its arch). On sm_90a the default
   build (--bwd-kernel auto) has the wgmma kinds for kv and dq (causal's linear tiling: the
   warp-specialised kv, tag BWD_KV_SM90WS; --bwd-kernel lockstep: BWD_KV_SM90; the dq role
   BWD_DQ_SM90) and the portable pre and post; --bwd-kernel portable has the portable kinds
   everywhere. */
static const struct bwd_kernel *bwd_kernels(int major, int minor)
{
#define SM90_KERNELS(KV)                                                                    \
  {BWD_KERNEL(SM_90A, "pre", BWD_PRE, bwd_pre), KV,                                         \
   BWD_KERNEL(SM_90A, "dq", BWD_DQ_SM90, bwd_dq_sm90),                                      \
   BWD_KERNEL(SM_90A, "post", BWD_POST, bwd_post)}
#if defined(CMC_CAUSAL_SM_90A_BWD_KV_SM90WS_BF16_D128_CUBIN)
  if (major == 9 && minor == 0) {
    static const struct bwd_kernel k[N_ROLES] =
        SM90_KERNELS(BWD_KERNEL_MAPS(SM_90A, "kv", BWD_KV_SM90WS, bwd_kv_sm90ws));
    return k;
  }
#elif defined(CMC_CAUSAL_SM_90A_BWD_KV_SM90_BF16_D128_CUBIN)
  if (major == 9 && minor == 0) {
    static const struct bwd_kernel k[N_ROLES] =
        SM90_KERNELS(BWD_KERNEL(SM_90A, "kv", BWD_KV_SM90, bwd_kv_sm90));
    return k;
  }
#elif defined(CMC_CAUSAL_SM_90A_BWD_KV_BF16_D128_CUBIN)
  if (major == 9 && minor == 0) {
    static const struct bwd_kernel k[N_ROLES] = PORTABLE_KERNELS(SM_90A);
    return k;
  }
#endif
#ifdef CMC_CAUSAL_SM_100A_BWD_KV_BF16_D128_CUBIN
  if (major == 10 && minor == 0) {
    static const struct bwd_kernel k[N_ROLES] = PORTABLE_KERNELS(SM_100A);
    return k;
  }
#endif
#ifdef CMC_CAUSAL_SM_80_BWD_KV_BF16_D128_CUBIN
  if (major == 8) {
    static const struct bwd_kernel k[N_ROLES] = PORTABLE_KERNELS(SM_80);
    return k;
  }
#endif
  (void)major;
  (void)minor;
  return NULL;
}

/* Launch one sequence in order on the default stream and wait for it. */
static int run_sequence(const char *mode, const enum role *seq, int n,
                        const struct bwd_kernel *bk, const CUfunction *fns,
                        const cmc_causal_desc *desc, const cmc_bwd_args *args)
{
  for (int i = 0; i < n; i++) {
    const enum role r = seq[i];
    unsigned grid[3];
    bk[r].grid(desc, grid);
    printf("backward %s: %s (%s) grid (%u, %u, %u)\n", mode, bk[r].name, bk[r].symbol, grid[0],
           grid[1], grid[2]);
    if (bk[r].launch_maps) {
      CUtensorMap maps[MAX_BWD_MAPS];
      if (check(bk[r].maps(desc, args, (uint64_t)args->total_tokens, maps), "tensor maps"))
        return -1;
      if (check(bk[r].launch_maps(fns[r], desc, maps, args, NULL), bk[r].symbol)) return -1;
    } else if (check(bk[r].launch(fns[r], desc, args, NULL), bk[r].symbol)) {
      return -1;
    }
  }
  return check(p_cuCtxSynchronize(), "cuCtxSynchronize (backward)");
}
#else
#define HAVE_BACKWARD 0
#endif

/* ------------------------------------------------------------------ main */

int main(int argc, char **argv)
{
  /* Line-buffered even into a pipe (a test's capture): a crash still shows how far it got. */
  setvbuf(stdout, NULL, _IOLBF, 0);
  const char *dir = argc > 1 ? argv[1] : ".";
  const char *cubin_name = NULL;
  const char *symbol = NULL;
  unsigned threads = 0, smem = 0, block_m = 0, box_rows = 0;
  int persistent = 0, num_sms = 0, n_maps = 0;
  char path[4096];
  int major = 0, minor = 0, status = 1, fwd_ok = 0, bwd_ok = !HAVE_BACKWARD;
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
  cmc_causal_desc desc;
#if HAVE_BACKWARD
  /* the backward: dO and dQ/dK/dV on the device (grad_*), the two fp32 workspaces, and on
     the host dO, the results of each run and the reference */
  CUmodule bmod[N_ROLES] = {0};
  CUfunction bfn[N_ROLES];
  const struct bwd_kernel *bk = NULL;
  CUdeviceptr grad_o = 0, grad_q = 0, grad_k = 0, grad_v = 0, dq_accum = 0, dsum = 0;
  uint64_t dq_accum_bytes = 0, dsum_bytes = 0;
  uint16_t *hdo = malloc(n_in * 2), *hgrad[2][3] = {{0}};
  float *fdo = malloc(n_in * 4), *rgrad[3] = {malloc(n_in * 4), malloc(n_in * 4),
                                              malloc(n_in * 4)};
  cmc_bwd_args bargs;
  for (int r = 0; r < 2; r++)
    for (int g = 0; g < 3; g++) hgrad[r][g] = malloc(n_in * 2);
  if (!hdo || !fdo || !rgrad[0] || !rgrad[1] || !rgrad[2] || !hgrad[0][0] || !hgrad[0][1] ||
      !hgrad[0][2] || !hgrad[1][0] || !hgrad[1][1] || !hgrad[1][2])
    return 1;
#endif

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
#if HAVE_BACKWARD
  bk = bwd_kernels(major, minor);
  if (!bk) {
    fprintf(stderr, "attn_demo: the artifact has no backward cubin for sm_%d%d\n", major, minor);
    goto fail;
  }
  for (int r = 0; r < N_ROLES; r++) { /* one module per backward role */
    void *image;
    size_t size = 0;
    CUresult res;
    snprintf(path, sizeof path, "%s/%s", dir, bk[r].cubin);
    image = read_file(path, &size);
    if (!image) {
      fprintf(stderr, "attn_demo: cannot read %s\n", path);
      goto fail;
    }
    res = p_cuModuleLoadData(&bmod[r], image);
    free(image);
    if (check(res, "cuModuleLoadData (backward)")) goto fail;
    CK(p_cuModuleGetFunction(&bfn[r], bmod[r], bk[r].symbol));
  }
#endif

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
  {
    unsigned grid[3];
    CUtensorMap maps[3];
    void *args[2] = {&desc, maps};
    int i;
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
    double max_err = 0.0, max_lse = 0.0, rel;
    int nan = 0;
    for (size_t i = 0; i < n_in; i++) {
      double e = fabs(bf16_to_f32(hout[i]) - fo[i]);
      if (e > max_err) max_err = e;
    }
    rel = rel_err(hout, fo, n_in, &nan);
    for (size_t i = 0; i < (size_t)H * T; i++) {
      double e = fabs((double)hlse[i] - flse[i]);
      if (isnan(hlse[i])) nan++;
      if (e > max_lse) max_lse = e;
    }
    fwd_ok = nan == 0 && rel < 1e-2 && max_lse < 1e-2;
    printf("max |o - ref| = %.3g, ||o - ref|| / ||ref|| = %.3g, max |lse - ref| = %.3g, "
           "NaN %d\n", max_err, rel, max_lse, nan);
  }

#if HAVE_BACKWARD
  /* The backward takes the forward's descriptor as it is: q, k, v, and o and lse as the
     forward wrote them (d->sched is unused). Its own arguments: dO, the gradients (same
     packed [T, H, D] layout as q, k, v), the fp32 workspaces, total tokens and flags. */
  for (size_t i = 0; i < n_in; i++) {
    hdo[i] = f32_to_bf16(uniform());
    fdo[i] = bf16_to_f32(hdo[i]);
  }
  cmc_causal_bwd_workspace(T, B, H, D, &dq_accum_bytes, &dsum_bytes);
  printf("backward workspaces: dq_accum %llu bytes, dsum %llu bytes\n",
         (unsigned long long)dq_accum_bytes, (unsigned long long)dsum_bytes);
  CK(p_cuMemAlloc(&grad_o, n_in * 2));
  CK(p_cuMemAlloc(&grad_q, n_in * 2));
  CK(p_cuMemAlloc(&grad_k, n_in * 2));
  CK(p_cuMemAlloc(&grad_v, n_in * 2));
  CK(p_cuMemAlloc(&dq_accum, (size_t)dq_accum_bytes));
  CK(p_cuMemAlloc(&dsum, (size_t)dsum_bytes));
  CK(p_cuMemcpyHtoD(grad_o, hdo, n_in * 2));
  memset(&bargs, 0, sizeof bargs);
  bargs.dout = grad_o;
  bargs.dq = grad_q;
  bargs.dk = grad_k;
  bargs.dv = grad_v;
  bargs.dq_accum = dq_accum;
  bargs.dsum = dsum;
  bargs.dout_stride_tok = bargs.dq_stride_tok = bargs.dk_stride_tok = bargs.dv_stride_tok = H * D;
  bargs.dout_stride_head = bargs.dq_stride_head = bargs.dk_stride_head = bargs.dv_stride_head = D;
  bargs.total_tokens = T; /* cu_seqlens[batch] */

  /* Reference gradients from the reference o and lse (the kernels use the device's). */
  reference_bwd(fq, fk, fv, fo, flse, fdo, scale, rgrad[0], rgrad[1], rgrad[2]);
  bwd_ok = 1;
  /* run 0: atomic dQ; runs 1 and 2: deterministic (compared bitwise with each other) */
  for (int run = 0; run < 3; run++) {
    const int det = run > 0;
    const char *mode = det ? "deterministic" : "atomic";
    uint16_t *const *got = hgrad[run == 2];
    double rel[3];
    int nan = 0;
    /* NaN in the outputs and the workspaces: what the kernels leave unwritten shows up */
    CK(p_cuMemsetD8(grad_q, 0xff, n_in * 2));
    CK(p_cuMemsetD8(grad_k, 0xff, n_in * 2));
    CK(p_cuMemsetD8(grad_v, 0xff, n_in * 2));
    CK(p_cuMemsetD8(dq_accum, 0xff, (size_t)dq_accum_bytes));
    CK(p_cuMemsetD8(dsum, 0xff, (size_t)dsum_bytes));
    bargs.flags = det ? CMC_CAUSAL_BWD_FLAG_DETERMINISTIC : 0;
    if (CMC_CAUSAL_BWD_KV_HEAVY_FROM_LEN >= 0 && L >= CMC_CAUSAL_BWD_KV_HEAVY_FROM_LEN)
      bargs.flags |= CMC_CAUSAL_BWD_FLAG_KV_HEAVY; /* the manifest's backward.kv_order */
    if (run_sequence(mode, det ? seq_deterministic : seq_atomic, 3, bk, bfn, &desc, &bargs))
      goto fail;
    CK(p_cuMemcpyDtoH(got[0], grad_q, n_in * 2));
    CK(p_cuMemcpyDtoH(got[1], grad_k, n_in * 2));
    CK(p_cuMemcpyDtoH(got[2], grad_v, n_in * 2));
    if (run == 2) {
      int same = memcmp(hgrad[0][0], hgrad[1][0], n_in * 2) == 0 &&
                 memcmp(hgrad[0][1], hgrad[1][1], n_in * 2) == 0 &&
                 memcmp(hgrad[0][2], hgrad[1][2], n_in * 2) == 0;
      printf("backward deterministic: the second run is %s\n",
             same ? "bitwise equal" : "DIFFERENT");
      bwd_ok = bwd_ok && same;
      continue;
    }
    for (int g = 0; g < 3; g++) rel[g] = rel_err(got[g], rgrad[g], n_in, &nan);
    printf("backward %s: ||d - ref|| / ||ref|| dq %.3g, dk %.3g, dv %.3g, NaN %d\n", mode,
           rel[0], rel[1], rel[2], nan);
    bwd_ok = bwd_ok && nan == 0 && rel[0] < 1e-2 && rel[1] < 1e-2 && rel[2] < 1e-2;
  }
#else
  printf("backward: not in this artifact (compiled with --no-backward)\n");
#endif
  printf("%s\n", fwd_ok && bwd_ok ? "PASS" : "FAIL");
  status = fwd_ok && bwd_ok ? 0 : 1;

fail:
  if (dq) p_cuMemFree(dq);
  if (dk) p_cuMemFree(dk);
  if (dv) p_cuMemFree(dv);
  if (dout) p_cuMemFree(dout);
  if (dlse) p_cuMemFree(dlse);
  if (dseq) p_cuMemFree(dseq);
  if (mod) p_cuModuleUnload(mod);
#if HAVE_BACKWARD
  if (grad_o) p_cuMemFree(grad_o);
  if (grad_q) p_cuMemFree(grad_q);
  if (grad_k) p_cuMemFree(grad_k);
  if (grad_v) p_cuMemFree(grad_v);
  if (dq_accum) p_cuMemFree(dq_accum);
  if (dsum) p_cuMemFree(dsum);
  for (int r = 0; r < N_ROLES; r++)
    if (bmod[r]) p_cuModuleUnload(bmod[r]);
  free(hdo); free(fdo);
  for (int g = 0; g < 3; g++) {
    free(rgrad[g]); free(hgrad[0][g]); free(hgrad[1][g]);
  }
#endif
  if (ctx) p_cuDevicePrimaryCtxRelease(dev);
  free(cubin);
  free(hq); free(hk); free(hv); free(hout);
  free(fq); free(fk); free(fv); free(fo); free(flse); free(hlse);
  return status;
}
