/* fake_libcuda.c: a stand-in libcuda.so.1 for tests/test_c_sample.py, so the C sample can run
 * on a machine without a GPU and the test can see what it launches.
 *
 * It exports only cuGetProcAddress_v2 (all the sample fetches with dlsym) and hands out the
 * entry points the sample asks for. "Device" memory is host memory (malloc), so copies and
 * memsets work and nothing is computed: the sample then reports FAIL, which the test
 * expects. The device is an sm_90 with 132 SMs. A module keeps a copy of its ELF image and
 * cuModuleGetFunction finds only names that occur in it (the right cubin per kernel).
 *
 * Like a CUDA 13 driver (580), cuGetProcAddress_v2 hands out the newest ABI of a name at or
 * below the version asked for: from 13000 on, "cuCtxSynchronize" and "cuCtxGetDevice" are
 * cuCtxSynchronize_v2(CUcontext) and cuCtxGetDevice_v2(CUdevice *, CUcontext), whose
 * context must be NULL (the current one) or a context; a caller that declares the old
 * prototype passes whatever its register holds (the real driver may crash on it). Below a
 * name's oldest ABI here (cuMemAlloc and friends: 3020, the 64-bit sizes) it is missing.
 *
 * Log (to $FAKE_CUDA_LOG, else stderr), one line per event:
 *   alloc PTR BYTES
 *   attr SYMBOL ATTRIBUTE VALUE                 (cuFuncSetAttribute)
 *   launch SYMBOL GX GY GZ BX BY BZ SMEM [HEX]  (HEX: the first $FAKE_CUDA_ARGS_BYTES bytes
 *                                                of the second kernel parameter, for
 *                                                symbols with "_bwd_" in their name)
 *   missing NAME                                (an entry point this fake does not have)
 *   getproc NAME VERSION                        (each cuGetProcAddress_v2 call)
 *   badctx NAME PTR                             (a _v2 entry point got a context that is
 *                                                none: the caller's prototype is the old one)
 *
 *   cc -shared -fPIC -I<cuda include> -o DIR/libcuda.so.1 fake_libcuda.c
 *   LD_LIBRARY_PATH=DIR FAKE_CUDA_LOG=log ./attn_demo ARTIFACT
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static FILE *log_file(void)
{
  static FILE *f;
  if (!f) {
    const char *path = getenv("FAKE_CUDA_LOG");
    f = path ? fopen(path, "a") : NULL;
    if (!f) f = stderr;
  }
  return f;
}

struct fake_module {
  unsigned char *image;
  size_t size;
};

/* An ELF64 image's extent: the ends of its section and program header tables. */
static size_t elf_size(const unsigned char *p)
{
  uint64_t shoff, phoff, a, b;
  uint16_t phentsize, phnum, shentsize, shnum;
  memcpy(&phoff, p + 0x20, 8);
  memcpy(&shoff, p + 0x28, 8);
  memcpy(&phentsize, p + 0x36, 2);
  memcpy(&phnum, p + 0x38, 2);
  memcpy(&shentsize, p + 0x3A, 2);
  memcpy(&shnum, p + 0x3C, 2);
  a = shoff + (uint64_t)shentsize * shnum;
  b = phoff + (uint64_t)phentsize * phnum;
  return (size_t)(a > b ? a : b);
}

static CUresult f_cuInit(unsigned int flags) { (void)flags; return CUDA_SUCCESS; }

static CUresult f_cuGetErrorName(CUresult r, const char **s)
{
  static char buf[32];
  snprintf(buf, sizeof buf, "FAKE_ERROR_%d", (int)r);
  *s = buf;
  return CUDA_SUCCESS;
}

static CUresult f_cuDeviceGet(CUdevice *d, int ordinal)
{
  if (ordinal != 0) return CUDA_ERROR_INVALID_DEVICE;
  *d = 0;
  return CUDA_SUCCESS;
}

static CUresult f_cuDeviceGetAttribute(int *v, CUdevice_attribute attr, CUdevice d)
{
  (void)d;
  switch (attr) {
  case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: *v = 9; return CUDA_SUCCESS;
  case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: *v = 0; return CUDA_SUCCESS;
  case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: *v = 132; return CUDA_SUCCESS;
  default: return CUDA_ERROR_INVALID_VALUE;
  }
}

static int the_context;

static CUresult f_cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d)
{
  (void)d;
  *c = (CUcontext)&the_context;
  return CUDA_SUCCESS;
}

static CUresult f_cuDevicePrimaryCtxRelease(CUdevice d) { (void)d; return CUDA_SUCCESS; }
static CUresult f_cuCtxSetCurrent(CUcontext c) { (void)c; return CUDA_SUCCESS; }
static CUresult f_cuCtxSynchronize(void) { return CUDA_SUCCESS; }

static CUresult f_cuCtxGetDevice(CUdevice *d)
{
  *d = 0;
  return CUDA_SUCCESS;
}

/* The CUDA 13 ABIs (PFN_cuCtxSynchronize_v13000, PFN_cuCtxGetDevice_v13000). */
static int bad_context(const char *name, CUcontext c)
{
  if (c == NULL || c == (CUcontext)&the_context) return 0;
  fprintf(log_file(), "badctx %s %p\n", name, (void *)c);
  return 1;
}

static CUresult f_cuCtxSynchronize_v2(CUcontext c)
{
  return bad_context("cuCtxSynchronize_v2", c) ? CUDA_ERROR_INVALID_CONTEXT : CUDA_SUCCESS;
}

static CUresult f_cuCtxGetDevice_v2(CUdevice *d, CUcontext c)
{
  if (bad_context("cuCtxGetDevice_v2", c)) return CUDA_ERROR_INVALID_CONTEXT;
  *d = 0;
  return CUDA_SUCCESS;
}

static CUresult f_cuModuleLoadData(CUmodule *m, const void *image)
{
  const unsigned char *p = image;
  struct fake_module *fm;
  if (!p || memcmp(p, "\177ELF", 4) != 0 || p[4] != 2) return CUDA_ERROR_INVALID_IMAGE;
  fm = malloc(sizeof *fm);
  if (!fm) return CUDA_ERROR_OUT_OF_MEMORY;
  fm->size = elf_size(p);
  fm->image = malloc(fm->size);
  if (!fm->image) return CUDA_ERROR_OUT_OF_MEMORY;
  memcpy(fm->image, p, fm->size);
  *m = (CUmodule)fm;
  return CUDA_SUCCESS;
}

static CUresult f_cuModuleUnload(CUmodule m)
{
  struct fake_module *fm = (struct fake_module *)m;
  free(fm->image);
  free(fm);
  return CUDA_SUCCESS;
}

static CUresult f_cuModuleGetFunction(CUfunction *f, CUmodule m, const char *name)
{
  struct fake_module *fm = (struct fake_module *)m;
  if (!memmem(fm->image, fm->size, name, strlen(name) + 1)) return CUDA_ERROR_NOT_FOUND;
  *f = (CUfunction)strdup(name); /* the handle is the symbol's name */
  return CUDA_SUCCESS;
}

static CUresult f_cuFuncSetAttribute(CUfunction f, CUfunction_attribute attr, int value)
{
  fprintf(log_file(), "attr %s %d %d\n", (const char *)f, (int)attr, value);
  return CUDA_SUCCESS;
}

static CUresult f_cuMemAlloc(CUdeviceptr *p, size_t bytes)
{
  void *m = NULL;
  if (bytes == 0 || posix_memalign(&m, 256, bytes)) return CUDA_ERROR_OUT_OF_MEMORY;
  *p = (CUdeviceptr)(uintptr_t)m;
  fprintf(log_file(), "alloc %#llx %zu\n", (unsigned long long)*p, bytes);
  return CUDA_SUCCESS;
}

static CUresult f_cuMemFree(CUdeviceptr p)
{
  free((void *)(uintptr_t)p);
  return CUDA_SUCCESS;
}

static CUresult f_cuMemcpyHtoD(CUdeviceptr dst, const void *src, size_t n)
{
  memcpy((void *)(uintptr_t)dst, src, n);
  return CUDA_SUCCESS;
}

static CUresult f_cuMemcpyDtoH(void *dst, CUdeviceptr src, size_t n)
{
  memcpy(dst, (const void *)(uintptr_t)src, n);
  return CUDA_SUCCESS;
}

static CUresult f_cuMemsetD8(CUdeviceptr p, unsigned char v, size_t n)
{
  memset((void *)(uintptr_t)p, v, n);
  return CUDA_SUCCESS;
}

static CUresult f_cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                                 unsigned bx, unsigned by, unsigned bz, unsigned smem,
                                 CUstream s, void **params, void **extra)
{
  const char *name = (const char *)f;
  FILE *log = log_file();
  const char *nbytes = getenv("FAKE_CUDA_ARGS_BYTES");
  (void)s;
  if (extra) return CUDA_ERROR_INVALID_VALUE;
  fprintf(log, "launch %s %u %u %u %u %u %u %u", name, gx, gy, gz, bx, by, bz, smem);
  /* cmc_bwd_args: the second parameter, the third after the tensor maps of the kinds that
     take them (bwd_kv_sm90ws: desc, maps, args) */
  const int at = strstr(name, "_bwd_kv_sm90ws_") ? 2 : 1;
  if (strstr(name, "_bwd_") && nbytes && params && params[at]) {
    const unsigned char *a = params[at];
    long n = strtol(nbytes, NULL, 10);
    fputc(' ', log);
    for (long i = 0; i < n; i++) fprintf(log, "%02x", a[i]);
  }
  fputc('\n', log);
  return CUDA_SUCCESS;
}

static CUresult f_cuTensorMapEncodeTiled(CUtensorMap *map, CUtensorMapDataType t, cuuint32_t rank,
                                         void *addr, const cuuint64_t *dims,
                                         const cuuint64_t *strides, const cuuint32_t *box,
                                         const cuuint32_t *elem, CUtensorMapInterleave il,
                                         CUtensorMapSwizzle sw, CUtensorMapL2promotion l2,
                                         CUtensorMapFloatOOBfill oob)
{
  (void)elem; (void)il; (void)sw; (void)l2; (void)oob;
  if (rank == 3)
    fprintf(log_file(), "tmap %p %llu %llu %llu %llu %llu %u %u %u %d\n", addr,
            (unsigned long long)dims[0], (unsigned long long)dims[1],
            (unsigned long long)dims[2], (unsigned long long)strides[0],
            (unsigned long long)strides[1], box[0], box[1], box[2], (int)t);
  /* through a pointer, so that the write is libc's memset (AddressSanitizer's, in a demo built
     with it: test_c_sample), not inlined stores: a map array too small for the kernel's maps
     then fails the run */
  void *(*volatile set)(void *, int, size_t) = memset;
  set(map, 0, sizeof *map);
  return CUDA_SUCCESS;
}

static const struct {
  const char *name;
  int version; /* the ABI's version (cudaTypedefs.h: PFN_<name>_v<version>) */
  void *fn;
} table[] = {
#define E(n, v) {#n, v, (void *)f_##n}
    E(cuInit, 2000), E(cuGetErrorName, 6000), E(cuDeviceGet, 2000),
    E(cuDeviceGetAttribute, 2000), E(cuDevicePrimaryCtxRetain, 7000),
    E(cuDevicePrimaryCtxRelease, 11000), E(cuCtxSetCurrent, 4000), E(cuCtxGetDevice, 2000),
    {"cuCtxGetDevice", 13000, (void *)f_cuCtxGetDevice_v2}, E(cuCtxSynchronize, 2000),
    {"cuCtxSynchronize", 13000, (void *)f_cuCtxSynchronize_v2}, E(cuModuleLoadData, 2000),
    E(cuModuleUnload, 2000), E(cuModuleGetFunction, 2000), E(cuFuncSetAttribute, 9000),
    E(cuMemAlloc, 3020), E(cuMemFree, 3020), E(cuMemcpyHtoD, 3020), E(cuMemcpyDtoH, 3020),
    E(cuMemsetD8, 3020), E(cuLaunchKernel, 4000), E(cuTensorMapEncodeTiled, 12000),
#undef E
};

/* The newest ABI of symbol at or below version, as the driver picks it. */
CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
                             CUdriverProcAddressQueryResult *status)
{
  int best = -1;
  (void)flags;
  fprintf(log_file(), "getproc %s %d\n", symbol, version);
  for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
    if (strcmp(symbol, table[i].name) == 0 && table[i].version <= version &&
        (best < 0 || table[i].version > table[best].version))
      best = (int)i;
  if (best >= 0) {
    *pfn = table[best].fn;
    if (status) *status = CU_GET_PROC_ADDRESS_SUCCESS;
    return CUDA_SUCCESS;
  }
  fprintf(log_file(), "missing %s\n", symbol);
  *pfn = NULL;
  if (status) *status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  return CUDA_ERROR_NOT_FOUND;
}
