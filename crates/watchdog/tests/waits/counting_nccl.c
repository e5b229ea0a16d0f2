/* A stand-in for the three libnccl calls a Communicator and its CommWork make, preloaded (LD_PRELOAD)
 * into a child of the watchdog's tests: every communicator stays ncclInProgress, none is ever
 * dereferenced, each abort is counted, and so is each call made with a handle after that handle's abort.
 * Once metrale_counting_block() was called, every abort and revoke blocks for good, as NCCL's do while
 * they join a group job held in the driver. The codes come from nccl.h through the bindings
 * (-DNCCL_SUCCESS=... on the command line), not from here. */
#include <stddef.h>
#include <unistd.h>

typedef int result_t;

#define MAX_ABORTED 16
static void *aborted[MAX_ABORTED];
static int naborted, calls, calls_after_abort, aborts;
static volatile int blocking;

int metrale_counting_calls(void) { return calls; }
int metrale_counting_calls_after_abort(void) { return calls_after_abort; }
int metrale_counting_aborts(void) { return aborts; }
int metrale_counting_block(void) { return blocking = 1; }

static void block_if_asked(void) {
    while (blocking) pause();
}

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
    aborts++;
    if (naborted < MAX_ABORTED) aborted[naborted++] = comm;
    block_if_asked();
    return NCCL_SUCCESS;
}

result_t ncclCommRevoke(void *comm, int flags) {
    (void)flags;
    if (comm == NULL) return NCCL_SUCCESS;
    count(comm);
    block_if_asked();
    return NCCL_IN_PROGRESS;
}
