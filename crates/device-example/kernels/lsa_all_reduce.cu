// An all-reduce (sum of floats) written with NCCL's device API, after NVIDIA's
// docs/examples/06_device_api/01_allreduce_lsa: every rank's threads read every rank's send window
// through LSA (load/store accessible) pointers, add, and write the sum into every rank's receive window.
// One LSA barrier per block orders the ranks before the reads and after the writes, so the communicator
// needs at least gridDim.x LSA barriers (ncclDevCommRequirements::lsaBarrierCount).
#include <nccl_device.h>

extern "C" __global__ void lsa_all_reduce_sum_f32(ncclWindow_t send, size_t send_offset, ncclWindow_t recv,
                                                  size_t recv_offset, size_t count, ncclDevComm comm) {
  ncclLsaBarrierSession<ncclCoopCta> barrier{ncclCoopCta(), comm, ncclTeamLsa(comm), comm.lsaBarrier,
                                             blockIdx.x};
  // Every rank has written its send buffer before any rank reads it.
  barrier.sync(ncclCoopCta(), cuda::memory_order_relaxed);
  const int rank = comm.lsaRank, ranks = comm.lsaSize;
  // The elements are spread over every thread of every rank: each sums its own and writes them everywhere.
  const size_t first = threadIdx.x + (size_t)blockDim.x * (rank + (size_t)blockIdx.x * ranks);
  const size_t stride = (size_t)blockDim.x * gridDim.x * ranks;
  for (size_t i = first; i < count; i += stride) {
    float sum = 0;
    for (int peer = 0; peer < ranks; peer++) {
      sum += ((const float*)ncclGetLsaPointer(send, send_offset, peer))[i];
    }
    for (int peer = 0; peer < ranks; peer++) {
      ((float*)ncclGetLsaPointer(recv, recv_offset, peer))[i] = sum;
    }
  }
  // Every rank's writes are visible before any rank's stream goes on.
  barrier.sync(ncclCoopCta(), cuda::memory_order_release);
}

// What the device communicator says of itself, as a kernel sees it: rank, ranks, LSA rank, LSA team size
// and LSA barrier count (the host cannot read an ncclDevComm: its layout is NCCL's).
extern "C" __global__ void dev_comm_info(ncclDevComm comm, int* out) {
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    out[0] = comm.rank;
    out[1] = comm.nRanks;
    out[2] = comm.lsaRank;
    out[3] = comm.lsaSize;
    out[4] = comm.lsaBarrier.nBarriers;
  }
}
