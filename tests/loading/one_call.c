/* A stand-in that defines one libnccl call, ncclGetErrorString, preloaded (LD_PRELOAD) into a child of
 * tests/loading: it interposes that call over the library the loader checked, and the others come from
 * that library. It defines no ncclGetVersion, so it is not an NCCL of its own. */
const char *ncclGetErrorString(int code) {
    (void)code;
    return "the stand-in's error string";
}
