/* A stand-in for the CUDA driver, libcuda.so.1, for tests/driver_contract.rs: the functions the crate's
 * helpers require and a few optional ones, answering like a driver without GPUs would. It lacks every
 * function newer than the oldest driver of a CUDA major version (cuEventElapsedTime_v2, graphs, ...).
 *   -DDRIVER_VERSION=N  what cuDriverGetVersion reports (e.g. 13000)
 *   -DLACK_REQUIRED     leaves out cuStreamQuery, a required function
 *   -DINIT_FAILS        cuInit returns CUDA_ERROR_NO_DEVICE (100)
 * Types are reduced to what the ABI sees: handles are pointers, CUresult and CUdevice are ints. */
#include <stddef.h>

typedef int CUresult;

CUresult cuInit(unsigned int flags) {
    (void)flags;
#ifdef INIT_FAILS
    return 100;
#else
    return 0;
#endif
}

CUresult cuDriverGetVersion(int *version) {
    *version = DRIVER_VERSION;
    return 0;
}

/* Names prefixed STANDIN_, so a test sees they came from this library. */
static const char *name_of(CUresult code) {
    switch (code) {
    case 0: return "STANDIN_CUDA_SUCCESS";
    case 1: return "STANDIN_CUDA_ERROR_INVALID_VALUE";
    case 100: return "STANDIN_CUDA_ERROR_NO_DEVICE";
    default: return NULL;
    }
}

CUresult cuGetErrorName(CUresult code, const char **name) {
    *name = name_of(code);
    return *name ? 0 : 1;
}

CUresult cuGetErrorString(CUresult code, const char **text) {
    *text = name_of(code) ? "described by the stand-in" : NULL;
    return *text ? 0 : 1;
}

CUresult cuDeviceGet(int *device, int ordinal) { *device = ordinal; return 0; }
CUresult cuDevicePrimaryCtxRetain(void **context, int device) { (void)device; *context = (void *)0x10; return 0; }
CUresult cuCtxSetCurrent(void *context) { (void)context; return 0; }
CUresult cuStreamCreate(void **stream, unsigned int flags) { (void)flags; *stream = (void *)0x20; return 0; }
CUresult cuStreamDestroy_v2(void *stream) { (void)stream; return 0; }
#ifndef LACK_REQUIRED
CUresult cuStreamQuery(void *stream) { (void)stream; return 0; }
#endif
CUresult cuStreamSynchronize(void *stream) { (void)stream; return 0; }
CUresult cuStreamWaitEvent(void *stream, void *event, unsigned int flags) { (void)stream; (void)event; (void)flags; return 0; }
CUresult cuEventCreate(void **event, unsigned int flags) { (void)flags; *event = (void *)0x30; return 0; }
CUresult cuEventDestroy_v2(void *event) { (void)event; return 0; }
CUresult cuEventRecord(void *event, void *stream) { (void)event; (void)stream; return 0; }

/* Optional functions this old driver has. */
CUresult cuDeviceGetCount(int *count) { *count = 2; return 0; }
CUresult cuEventElapsedTime(float *ms, void *start, void *end) { (void)start; (void)end; *ms = 1.5f; return 0; }
