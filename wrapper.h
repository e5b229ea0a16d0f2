/* What bindgen translates: the CUDA driver API (types, and the functions the helpers load at run time)
 * and NCCL. cuda.h first so that CUstream and cudaStream_t resolve to the one struct CUstream_st. */
#include <cuda.h>
#include <nccl.h>
