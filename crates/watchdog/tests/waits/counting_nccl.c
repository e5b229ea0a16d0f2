/* A stand-in for the three libnccl calls a Communicator and its CommWork make, preloaded (LD_PRELOAD)
 * into a child of the watchdog's tests: every communicator stays ncclInProgress, none is ever
 * dereferenced, and each call made with a handle after that handle's abort is counted. The codes come
 * from nccl.h through the bindings (-DNCCL_SUCCESS=... on the command line), not from here. */
#include <stddef.h>

typedef int result_t;

#define MAX_ABORTED 16
static void *aborted[MAX_ABORTED];
static int naborted, calls, calls_after_abort;

int metrale_counting_calls(void) { return calls; }
int metrale_counting_calls_after_abort(void) { return calls_after_abort; }

static void count(void *comm) {
    calls++;
    for (int i = 0; i < naborted; i++)
        if (aborted[i] == comm) calls_after_abort++;
}

result_t ncclCommGetAsyncError(void *comm, result_t *state) {
    if (comm == NULL || state == NULL) return NCCL_INVALID_ARGUMENT;
    count(comm);
    *state = NCCL_IN_PROGRESS;
    return NCCL_SUCCESS;
}

result_t ncclCommAbort(void *comm) {
    if (comm == NULL) return NCCL_SUCCESS;
    count(comm);
    if (naborted < MAX_ABORTED) aborted[naborted++] = comm;
    return NCCL_SUCCESS;
}

result_t ncclCommRevoke(void *comm, int flags) {
    (void)flags;
    if (comm == NULL) return NCCL_SUCCESS;
    count(comm);
    return NCCL_IN_PROGRESS;
}
