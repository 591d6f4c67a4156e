/* fake_libcuda.c: a stand-in libcuda.so.1 for tests/test_c_sample.py, so the C sample can run
 * on a machine without a GPU and the test can see what it launches.
 *
 * It exports only cuGetProcAddress_v2 (all the sample fetches with dlsym) and hands out the
 * entry points the sample asks for. "Device" memory is host memory (malloc), so copies and
 * memsets work and nothing is computed: the sample then reports FAIL, which the test
 * expects. The device is an sm_90 with 132 SMs. A module keeps a copy of its ELF image and
 * cuModuleGetFunction finds only names that occur in it (the right cubin per kernel).
 *
 * Log (to $FAKE_CUDA_LOG, else stderr), one line per event:
 *   alloc PTR BYTES
 *   attr SYMBOL ATTRIBUTE VALUE                 (cuFuncSetAttribute)
 *   launch SYMBOL GX GY GZ BX BY BZ SMEM [HEX]  (HEX: the first $FAKE_CUDA_ARGS_BYTES bytes
 *                                                of the second kernel parameter, for
 *                                                symbols with "_bwd_" in their name)
 *   missing NAME                                (an entry point this fake does not have)
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
  if (strstr(name, "_bwd_") && nbytes && params && params[1]) {
    const unsigned char *a = params[1];
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
  (void)t; (void)rank; (void)addr; (void)dims; (void)strides; (void)box; (void)elem;
  (void)il; (void)sw; (void)l2; (void)oob;
  memset(map, 0, sizeof *map);
  return CUDA_SUCCESS;
}

static const struct {
  const char *name;
  void *fn;
} table[] = {
#define E(n) {#n, (void *)f_##n}
    E(cuInit), E(cuGetErrorName), E(cuDeviceGet), E(cuDeviceGetAttribute),
    E(cuDevicePrimaryCtxRetain), E(cuDevicePrimaryCtxRelease), E(cuCtxSetCurrent),
    E(cuCtxGetDevice), E(cuCtxSynchronize), E(cuModuleLoadData), E(cuModuleUnload),
    E(cuModuleGetFunction), E(cuFuncSetAttribute), E(cuMemAlloc), E(cuMemFree),
    E(cuMemcpyHtoD), E(cuMemcpyDtoH), E(cuMemsetD8), E(cuLaunchKernel),
    E(cuTensorMapEncodeTiled),
#undef E
};

CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
                             CUdriverProcAddressQueryResult *status)
{
  (void)version;
  (void)flags;
  for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
    if (strcmp(symbol, table[i].name) == 0) {
      *pfn = table[i].fn;
      if (status) *status = CU_GET_PROC_ADDRESS_SUCCESS;
      return CUDA_SUCCESS;
    }
  fprintf(log_file(), "missing %s\n", symbol);
  *pfn = NULL;
  if (status) *status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  return CUDA_ERROR_NOT_FOUND;
}
