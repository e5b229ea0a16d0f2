/* A stand-in for libnccl's ncclGetLastError, preloaded (LD_PRELOAD) into a child of tests/last_error:
 * it counts its calls and answers a message of its own, so that the test sees which checks read NCCL's
 * process-wide last-error buffer. */
#include <stddef.h>

static int calls;

int metrale_counting_last_error_calls(void) { return calls; }

const char *ncclGetLastError(void *comm) {
    (void)comm;
    calls++;
    return "the stand-in's last error";
}
