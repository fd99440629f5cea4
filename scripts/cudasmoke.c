/* A CUDA smoke test that needs no CUDA toolkit: the driver API through
 * dlopen("libcuda.so.1"), a PTX kernel JIT-compiled by the driver (libnvidia-ptxjitcompiler),
 * one line per check. Exit 0 only if every check passed. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext, *CUmodule, *CUfunction;
typedef unsigned long long CUdeviceptr;

static const char PTX[] =
    ".version 6.0\n.target sm_50\n.address_size 64\n"
    ".visible .entry add1(.param .u64 p, .param .u32 n) {\n"
    "  .reg .pred %p; .reg .b32 %r<5>; .reg .b64 %rd<4>;\n"
    "  ld.param.u64 %rd1, [p]; ld.param.u32 %r1, [n];\n"
    "  mov.u32 %r2, %ctaid.x; mov.u32 %r3, %ntid.x; mov.u32 %r4, %tid.x;\n"
    "  mad.lo.s32 %r2, %r2, %r3, %r4;\n"
    "  setp.ge.u32 %p, %r2, %r1; @%p bra DONE;\n"
    "  cvta.to.global.u64 %rd2, %rd1; mul.wide.u32 %rd3, %r2, 4; add.s64 %rd2, %rd2, %rd3;\n"
    "  ld.global.u32 %r3, [%rd2]; add.u32 %r3, %r3, 1; st.global.u32 [%rd2], %r3;\n"
    "DONE:\n  ret;\n}\n";

static void *cuda;
static CUresult (*getErrorString)(CUresult, const char **);

static void *sym(const char *name) {
    void *f = dlsym(cuda, name);
    if (!f) { printf("FAIL dlsym %s: %s\n", name, dlerror()); exit(1); }
    return f;
}

static void check(const char *what, CUresult rc, const char *detail) {
    if (rc == 0) { printf("ok   %s%s%s\n", what, detail ? ": " : "", detail ? detail : ""); return; }
    const char *msg = "unknown error";
    if (getErrorString) getErrorString(rc, &msg);
    printf("FAIL %s: error %d (%s)\n", what, rc, msg);
    exit(1);
}

int main(void) {
    cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!cuda) { printf("FAIL dlopen libcuda.so.1: %s\n", dlerror()); return 1; }
    printf("ok   dlopen libcuda.so.1\n");
    getErrorString = sym("cuGetErrorString");
    CUresult (*cuInit)(unsigned) = sym("cuInit");
    CUresult (*driverVersion)(int *) = sym("cuDriverGetVersion");
    CUresult (*deviceCount)(int *) = sym("cuDeviceGetCount");
    CUresult (*deviceGet)(CUdevice *, int) = sym("cuDeviceGet");
    CUresult (*deviceName)(char *, int, CUdevice) = sym("cuDeviceGetName");
    CUresult (*ctxCreate)(CUcontext *, unsigned, CUdevice) = sym("cuCtxCreate_v2");
    CUresult (*memAlloc)(CUdeviceptr *, size_t) = sym("cuMemAlloc_v2");
    CUresult (*htod)(CUdeviceptr, const void *, size_t) = sym("cuMemcpyHtoD_v2");
    CUresult (*dtoh)(void *, CUdeviceptr, size_t) = sym("cuMemcpyDtoH_v2");
    CUresult (*moduleLoad)(CUmodule *, const void *) = sym("cuModuleLoadData");
    CUresult (*getFunction)(CUfunction *, CUmodule, const char *) = sym("cuModuleGetFunction");
    CUresult (*launch)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                       unsigned, void *, void **, void **) = sym("cuLaunchKernel");
    CUresult (*synchronize)(void) = sym("cuCtxSynchronize");

    char line[256];
    int version = 0, count = 0;
    check("cuInit", cuInit(0), NULL);
    check("cuDriverGetVersion", driverVersion(&version), NULL);
    check("cuDeviceGetCount", deviceCount(&count), NULL);
    printf("     CUDA %d.%d, %d devices\n", version / 1000, version % 1000 / 10, count);
    if (count < 1) { printf("FAIL no CUDA device\n"); return 1; }
    for (int i = 0; i < count; i++) {
        CUdevice d;
        char name[128];
        check("cuDeviceGet", deviceGet(&d, i), NULL);
        check("cuDeviceGetName", deviceName(name, sizeof name, d), name);
    }
    CUdevice dev;
    CUcontext ctx;
    deviceGet(&dev, 0);
    check("cuCtxCreate", ctxCreate(&ctx, 0, dev), NULL);
    enum { N = 1 << 20 };
    unsigned *host = malloc(N * sizeof *host);
    for (unsigned i = 0; i < N; i++) host[i] = i;
    CUdeviceptr buf;
    snprintf(line, sizeof line, "%zu bytes", (size_t)N * sizeof *host);
    check("cuMemAlloc", memAlloc(&buf, N * sizeof *host), line);
    check("cuMemcpyHtoD", htod(buf, host, N * sizeof *host), NULL);
    CUmodule mod;
    CUfunction fn;
    check("cuModuleLoadData (PTX JIT)", moduleLoad(&mod, PTX), NULL);
    check("cuModuleGetFunction", getFunction(&fn, mod, "add1"), NULL);
    unsigned n = N;
    void *params[] = {&buf, &n};
    check("cuLaunchKernel", launch(fn, N / 256, 1, 1, 256, 1, 1, 0, NULL, params, NULL), NULL);
    check("cuCtxSynchronize", synchronize(), NULL);
    check("cuMemcpyDtoH", dtoh(host, buf, N * sizeof *host), NULL);
    for (unsigned i = 0; i < N; i++) {
        if (host[i] != i + 1) { printf("FAIL result: element %u is %u, expected %u\n", i, host[i], i + 1); return 1; }
    }
    printf("ok   result: %d elements incremented on the GPU\n", N);
    return 0;
}
